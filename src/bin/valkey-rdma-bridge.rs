//! valkey-rdma-bridge: a TCP-to-RDMA relay, so that TCP-only clients (Valkey's Tcl test
//! suite, redis-py, valkey-cli/valkey-benchmark without --rdma) can use a server's RDMA
//! listener.
//!
//!   valkey-rdma-bridge --listen ADDR:PORT --to HOST:PORT [-t SECS] [--rx-size BYTES] [-v]
//!
//! Each accepted TCP connection gets its own RDMA connection ([`RdmaStream`]) and its own
//! thread, which polls the TCP socket, the completion channel and the rdma_cm event
//! channel. Nothing is buffered beyond the RDMA windows: the bridge reads from TCP only
//! what the server's RX window has room for now, and consumes from our RX buffer only
//! what the TCP socket accepted, so backpressure goes both ways. Closes propagate: TCP
//! EOF or error disconnects the RDMA side; when the server leaves, every byte it sent
//! before is forwarded, then the TCP connection is closed.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma::client::{ClientError, Options, RdmaStream};
use rdma::protocol::{DEFAULT_RX_SIZE, MAX_RX_SIZE};

/// Largest single TCP read (the RDMA window usually limits it first).
const CHUNK: usize = 256 * 1024;
const MIN_RX: u32 = 4096;

#[derive(Debug, Clone, PartialEq)]
struct Config {
    listen: String,
    to: String,
    /// RDMA connect timeout; also how long the last bytes of a departed server may wait
    /// for a TCP client that does not read.
    timeout: Duration,
    rx_size: u32,
    verbose: bool,
}

const USAGE: &str = "usage: valkey-rdma-bridge --listen ADDR:PORT --to HOST:PORT [-t SECS] [--rx-size BYTES] [-v]
  --listen ADDR:PORT  TCP address to accept clients on
  --to HOST:PORT      the server's RDMA listener; one RDMA connection per TCP client
  -t SECS             RDMA connect timeout (default 10)
  --rx-size BYTES     RX buffer per RDMA connection (default 1048576)
  -v                  log every connection, not only failures";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
    let (mut listen, mut to) = (None, None);
    let mut cfg = Config {
        listen: String::new(),
        to: String::new(),
        timeout: Duration::from_secs(10),
        rx_size: DEFAULT_RX_SIZE,
        verbose: false,
    };
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(value("--listen")?),
            "--to" => to = Some(value("--to")?),
            "-t" => {
                let v = value("-t")?;
                let secs: f64 = v.parse().map_err(|_| format!("-t {v}: not a number of seconds"))?;
                if !(secs > 0.0 && secs < 1e6) {
                    return Err(format!("-t {v}: must be a positive number of seconds"));
                }
                cfg.timeout = Duration::from_secs_f64(secs);
            }
            "--rx-size" => {
                let v = value("--rx-size")?;
                cfg.rx_size = v
                    .parse()
                    .ok()
                    .filter(|n| (MIN_RX..=MAX_RX_SIZE).contains(n))
                    .ok_or_else(|| format!("--rx-size {v}: must be {MIN_RX}..={MAX_RX_SIZE} bytes"))?;
            }
            "-v" | "--verbose" => cfg.verbose = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    cfg.listen = listen.ok_or("--listen is required")?;
    cfg.to = to.ok_or("--to is required")?;
    Ok(cfg)
}

fn main() {
    // A client that vanishes must not kill the bridge: writes use MSG_NOSIGNAL, and
    // SIGPIPE is ignored besides.
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let cfg = parse_args(std::env::args().skip(1)).unwrap_or_else(|e| {
        if !e.is_empty() {
            eprintln!("valkey-rdma-bridge: {e}");
        }
        eprintln!("{USAGE}");
        std::process::exit(2)
    });
    let to = match cfg.to.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) | Err(_) => {
            eprintln!("valkey-rdma-bridge: --to {}: does not resolve to an address", cfg.to);
            std::process::exit(2)
        }
    };
    let listener = TcpListener::bind(&cfg.listen).unwrap_or_else(|e| {
        eprintln!("valkey-rdma-bridge: cannot listen on {}: {e}", cfg.listen);
        std::process::exit(1)
    });
    let local = listener.local_addr().map_or(cfg.listen.clone(), |a| a.to_string());
    println!("valkey-rdma-bridge: listening on {local}, relaying to {to} over RDMA");
    let _ = io::stdout().flush();
    let cfg = Arc::new(cfg);
    loop {
        match listener.accept() {
            Ok((tcp, peer)) => {
                let cfg = Arc::clone(&cfg);
                let spawned = std::thread::Builder::new()
                    .name(format!("bridge {peer}"))
                    .spawn(move || serve(tcp, peer, to, &cfg));
                if let Err(e) = spawned {
                    eprintln!("valkey-rdma-bridge: {peer}: cannot start a thread ({e}); connection closed");
                }
            }
            Err(e) => {
                // EMFILE and friends: say so and give the system a moment.
                eprintln!("valkey-rdma-bridge: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// How a relayed connection ended.
#[derive(Debug)]
enum End {
    /// The TCP client closed (EOF) or went away (reset, broken pipe).
    TcpClosed(Option<io::Error>),
    /// Another TCP error.
    TcpError(io::Error),
    /// The server closed the RDMA connection; everything it sent was forwarded.
    PeerGone,
    /// The server left, but the TCP client did not take its last bytes in time.
    PeerGoneUndelivered(usize),
    Rdma(ClientError),
}

fn serve(tcp: TcpStream, peer: SocketAddr, to: SocketAddr, cfg: &Config) {
    let opts = Options { rx_size: cfg.rx_size, timeout: cfg.timeout, ..Options::default() };
    let mut rdma = match RdmaStream::connect(to, &opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("valkey-rdma-bridge: {peer}: cannot connect to {to} over RDMA: {e}; TCP connection closed");
            return; // dropping `tcp` closes it
        }
    };
    if cfg.verbose {
        eprintln!("valkey-rdma-bridge: {peer}: connected to {to} over RDMA");
    }
    let _ = tcp.set_nodelay(true);
    let end = match tcp.set_nonblocking(true) {
        Ok(()) => relay(&tcp, &mut rdma, cfg.timeout),
        Err(e) => End::TcpError(e),
    };
    match &end {
        End::TcpClosed(e) if cfg.verbose => match e {
            None => eprintln!("valkey-rdma-bridge: {peer}: TCP client closed; RDMA connection closed"),
            Some(e) => eprintln!("valkey-rdma-bridge: {peer}: TCP client gone ({e}); RDMA connection closed"),
        },
        End::TcpClosed(_) => {}
        End::TcpError(e) => eprintln!("valkey-rdma-bridge: {peer}: TCP error: {e}; RDMA connection closed"),
        End::PeerGone => eprintln!("valkey-rdma-bridge: {peer}: the server closed the RDMA connection; TCP connection closed"),
        End::PeerGoneUndelivered(n) => eprintln!(
            "valkey-rdma-bridge: {peer}: the server closed the RDMA connection; the TCP client did not take its last {n} bytes in time; TCP connection closed"
        ),
        End::Rdma(e) => eprintln!("valkey-rdma-bridge: {peer}: RDMA error: {e}; both connections closed"),
    }
    if matches!(end, End::PeerGone | End::PeerGoneUndelivered(_)) {
        let _ = tcp.shutdown(Shutdown::Write);
    }
    drop(rdma); // rdma_disconnect: the server sees the client leave
}

/// Result of one non-blocking socket call.
enum Io {
    Done(usize),
    WouldBlock,
    Failed(io::Error),
}

fn tcp_send(fd: i32, bytes: &[u8]) -> Io {
    // SAFETY: `bytes` is a live slice; MSG_NOSIGNAL: EPIPE instead of SIGPIPE.
    let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    io_result(n)
}

fn tcp_recv(fd: i32, buf: &mut [u8]) -> Io {
    // SAFETY: `buf` is a live, writable slice of the length passed.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    io_result(n)
}

fn io_result(n: isize) -> Io {
    if n >= 0 {
        return Io::Done(n as usize);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Io::WouldBlock,
        _ => Io::Failed(e),
    }
}

/// A TCP error that only means the client went away.
fn client_left(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted)
}

fn tcp_failed(e: io::Error) -> End {
    if client_left(&e) {
        End::TcpClosed(Some(e))
    } else {
        End::TcpError(e)
    }
}

/// What to wait for on the TCP socket: readable when the RDMA window has room (and the
/// server is still there), writable when received bytes wait for the client. `None`
/// leaves the socket out of the poll, so a hang-up cannot wake us while we could not
/// act on it anyway (the RDMA side wakes us first).
fn tcp_interest(write_room: usize, rx_pending: bool) -> Option<i16> {
    let mut ev = 0;
    if write_room > 0 {
        ev |= libc::POLLIN;
    }
    if rx_pending {
        ev |= libc::POLLOUT;
    }
    (ev != 0).then_some(ev)
}

fn relay(tcp: &TcpStream, rdma: &mut RdmaStream, drain_timeout: Duration) -> End {
    let fd = tcp.as_raw_fd();
    let mut buf = vec![0u8; CHUNK];
    let mut gone_at: Option<Instant> = None;
    loop {
        // RDMA -> TCP: hand the client what arrived, consume only what it accepted.
        let mut rx_pending = 0;
        loop {
            let bytes = match rdma.peek() {
                Ok([]) => break,
                Ok(b) => b,
                Err(ClientError::PeerGone) => return End::PeerGone,
                Err(e) => return End::Rdma(e),
            };
            let len = bytes.len();
            match tcp_send(fd, bytes) {
                Io::Done(n) => {
                    if let Err(e) = rdma.consume(n) {
                        return End::Rdma(e);
                    }
                    if n < len {
                        rx_pending = len - n;
                        break;
                    }
                }
                Io::WouldBlock => {
                    rx_pending = len;
                    break;
                }
                Io::Failed(e) => return tcp_failed(e),
            }
        }
        // TCP -> RDMA: read only as much as the server's window takes now.
        loop {
            let room = rdma.write_room();
            if room == 0 {
                break;
            }
            let want = room.min(buf.len());
            match tcp_recv(fd, &mut buf[..want]) {
                Io::Done(0) => return End::TcpClosed(None),
                Io::Done(n) => {
                    // write_room promised room for all of it; should the window say
                    // otherwise, finish with a (bounded) blocking write.
                    let written = match rdma.try_write(&buf[..n]) {
                        Ok(w) if w < n => rdma.write_all(&buf[w..n]),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    };
                    match written {
                        Ok(()) => {}
                        // The server left: what it sent before is still forwarded by
                        // the next peeks, which then report it gone.
                        Err(ClientError::PeerGone) => break,
                        Err(e) => return End::Rdma(e),
                    }
                }
                Io::WouldBlock => break,
                Io::Failed(e) => return tcp_failed(e),
            }
        }
        if rdma.is_gone() {
            // Only the last received bytes are left to deliver; give the client a while.
            let since = *gone_at.get_or_insert_with(Instant::now);
            if since.elapsed() > drain_timeout {
                return End::PeerGoneUndelivered(rx_pending);
            }
        }
        let [comp_fd, cm_fd] = rdma.poll_fds();
        let tcp_events = tcp_interest(rdma.write_room(), rx_pending > 0);
        let mut p = [
            libc::pollfd {
                fd: if tcp_events.is_some() { fd } else { -1 },
                events: tcp_events.unwrap_or(0),
                revents: 0,
            },
            libc::pollfd { fd: comp_fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: cm_fd, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `p` is a live array of three pollfd. A timeout only re-runs the loop.
        unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 1000) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Config, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_the_documented_options() {
        let c = args("--listen 127.0.0.1:7000 --to 10.0.0.1:6379 -t 2.5 --rx-size 65536 -v").unwrap();
        assert_eq!(c.listen, "127.0.0.1:7000");
        assert_eq!(c.to, "10.0.0.1:6379");
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.rx_size, 65536);
        assert!(c.verbose);
        let d = args("--to h:1 --listen :::7000").unwrap();
        assert_eq!((d.timeout, d.rx_size, d.verbose), (Duration::from_secs(10), DEFAULT_RX_SIZE, false));
    }

    #[test]
    fn refuses_missing_and_bad_options() {
        assert!(args("--to h:1").unwrap_err().contains("--listen"));
        assert!(args("--listen h:1").unwrap_err().contains("--to"));
        assert!(args("--listen h:1 --to").unwrap_err().contains("needs a value"));
        assert!(args("--listen h:1 --to h:2 -t 0").is_err());
        assert!(args("--listen h:1 --to h:2 -t x").is_err());
        assert!(args("--listen h:1 --to h:2 --rx-size 100").is_err());
        assert!(args("--listen h:1 --to h:2 --rx-size 999999999").is_err());
        assert!(args("--listen h:1 --to h:2 --bogus").unwrap_err().contains("--bogus"));
        assert_eq!(args("--help").unwrap_err(), "");
    }

    #[test]
    fn polls_tcp_only_for_what_can_be_acted_on() {
        assert_eq!(tcp_interest(0, false), None);
        assert_eq!(tcp_interest(10, false), Some(libc::POLLIN));
        assert_eq!(tcp_interest(0, true), Some(libc::POLLOUT));
        assert_eq!(tcp_interest(10, true), Some(libc::POLLIN | libc::POLLOUT));
    }

    #[test]
    fn a_client_leaving_is_not_an_error() {
        assert!(matches!(tcp_failed(io::Error::from(io::ErrorKind::BrokenPipe)), End::TcpClosed(Some(_))));
        assert!(matches!(tcp_failed(io::Error::from(io::ErrorKind::ConnectionReset)), End::TcpClosed(Some(_))));
        assert!(matches!(tcp_failed(io::Error::from(io::ErrorKind::InvalidData)), End::TcpError(_)));
    }

    #[test]
    fn socket_calls_report_would_block_and_eof() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut buf = [0u8; 8];
        assert!(matches!(tcp_recv(b.as_raw_fd(), &mut buf), Io::WouldBlock));
        assert!(matches!(tcp_send(a.as_raw_fd(), b"hi"), Io::Done(2)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(tcp_recv(b.as_raw_fd(), &mut buf), Io::Done(2)));
        drop(a);
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(tcp_recv(b.as_raw_fd(), &mut buf), Io::Done(0)));
        // the peer is gone: a send fails with EPIPE/ECONNRESET, not SIGPIPE
        let mut r = tcp_send(b.as_raw_fd(), b"x");
        for _ in 0..10 {
            if let Io::Failed(_) = r {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            r = tcp_send(b.as_raw_fd(), b"x");
        }
        assert!(matches!(r, Io::Failed(ref e) if client_left(e)));
    }
}
