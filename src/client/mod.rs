//! The client side of Valkey Over RDMA, on the same protocol core and verbs layer as
//! the module: connect over rdma_cm, a raw byte stream ([`RdmaStream`]) and a blocking
//! RESP API ([`Client`]). It interoperates with the upstream C module and with ours.
//!
//! ```no_run
//! let mut c = rdma::client::Client::connect("10.0.0.1:6379", Default::default())?;
//! let reply = c.command(&[b"SET", b"key", b"value"])?;
//! # Ok::<(), rdma::client::ClientError>(())
//! ```

#![forbid(unsafe_code)]

pub mod bench;
pub mod cluster;
pub mod cluster_check;
#[cfg(feature = "test-hooks")]
pub mod hostile;
pub mod idle;
pub mod metrics;
pub mod resp;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::protocol::conn::{Conn, Failure, ReadError, Received, State, WriteError};
use crate::protocol::driver::Driver;
use crate::protocol::session::Role;
use crate::protocol::{ControlMessage, Violation, DEFAULT_RX_SIZE};
use crate::verbs::{self, CmId, Completion, ConnParams, Endpoint, EndpointConfig, EventChannel, VerbsError};
pub use resp::Reply;

/// Errors a user can act on.
#[derive(Debug)]
pub enum ClientError {
    /// No RDMA device, or rdma-core is missing: nothing can connect.
    NoDevice(String),
    /// The address does not resolve over RDMA, or the server refused the connection.
    Refused(String),
    /// The server went away.
    PeerGone,
    /// No answer in time.
    Timeout(&'static str),
    /// The server broke the Valkey Over RDMA protocol (docs/protocol.md §6).
    Protocol(Violation),
    /// The server's bytes are not RESP (what the parser could not read).
    Resp(String),
    Verbs(VerbsError),
    /// An earlier local verbs call failed and ended the connection (which call, errno).
    Local {
        call: &'static str,
        errno: i32,
    },
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoDevice(s) => write!(f, "no RDMA device: {s}"),
            ClientError::Refused(s) => write!(f, "connection refused: {s}"),
            ClientError::PeerGone => write!(f, "the server closed the connection"),
            ClientError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            ClientError::Protocol(v) => write!(f, "protocol error: {v}"),
            ClientError::Resp(s) => write!(f, "not a RESP reply: {s}"),
            ClientError::Verbs(e) => write!(f, "{e}"),
            ClientError::Local { call, errno } => {
                write!(f, "{call} failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl std::error::Error for ClientError {}

impl From<VerbsError> for ClientError {
    fn from(e: VerbsError) -> Self {
        ClientError::Verbs(e)
    }
}

impl From<Failure> for ClientError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Protocol(v) => ClientError::Protocol(v),
            // a work request failing with the server there: it dropped the connection
            Failure::WorkRequest { .. } | Failure::PeerSilent { .. } | Failure::HandshakeTimeout { .. } => {
                ClientError::PeerGone
            }
            Failure::Local { call, errno } => ClientError::Local { call, errno },
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[derive(Debug, Clone)]
pub struct Options {
    /// Our RX buffer (upstream clients use 1 MiB).
    pub rx_size: u32,
    /// Connect and per-operation timeout.
    pub timeout: Duration,
    /// `AUTH [user] password`, sent on every new connection before anything else.
    pub auth: Option<(Option<String>, String)>,
    /// `SELECT db` on every new connection (`None`: the server's default, 0).
    pub db: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options { rx_size: DEFAULT_RX_SIZE, timeout: Duration::from_secs(10), auth: None, db: None }
    }
}

/// The parameters we connect with (as libvalkey: 7 retries, RNR "retry forever").
pub(crate) const CONNECT_PARAMS: ConnParams = ConnParams { retry_count: 7, rnr_retry_count: 7 };

/// A connected RDMA byte stream to a Valkey server: a verbs endpoint driven by the
/// same protocol core as the server's connections (`protocol::conn::Conn`, client
/// role), so both sides share one implementation of windows, hand-backs and the order
/// of bytes before a disconnect.
pub struct RdmaStream {
    // Field order is drop order: the endpoint (with its id) before the channel.
    /// The protocol core and the endpoint as its NIC (`protocol::driver`).
    pub(crate) d: Driver<Endpoint>,
    channel: EventChannel,
    timeout: Duration,
    /// Reused for each poll of the completion queue.
    completions: Vec<Completion>,
    /// What [`peek`](Self::peek) copied out of the RX buffer (reused).
    peeked: Vec<u8>,
    /// Features the server reported, once asked.
    pub server_features: Option<u64>,
    /// Keepalive messages received from the server.
    pub keepalives: u64,
}

impl RdmaStream {
    pub fn connect(addr: impl ToSocketAddrs, opts: &Options) -> Result<RdmaStream> {
        let (addr, channel, ep, deadline) = Self::send_connect_request(addr, opts)?;
        expect_event(&channel, Expect::Established, deadline, &addr)?;
        let core = Conn::new(Role::Client, ep.rx_region());
        let mut s = RdmaStream {
            d: Driver::new(core, ep),
            channel,
            timeout: opts.timeout,
            completions: Vec::new(),
            peeked: Vec::new(),
            server_features: None,
            keepalives: 0,
        };
        s.d.core.on_established(); // queues our RegisterXferMemory (docs/protocol.md §1)
        s.flush_control()?;
        // Wait for the server's RegisterXferMemory: until then nothing can be written.
        while s.d.core.tx().is_empty() {
            s.wait(deadline, "the server's RegisterXferMemory")?;
        }
        Ok(s)
    }

    /// The first half of [`connect`](Self::connect): the address and route resolved,
    /// the endpoint built, the connect request sent. What the server answers is still
    /// in `channel`, unread: until it is read, the connection is not established (the
    /// test peer `hostile` case `no-rtu` stops here).
    fn send_connect_request(
        addr: impl ToSocketAddrs,
        opts: &Options,
    ) -> Result<(SocketAddr, EventChannel, Endpoint, Instant)> {
        let (addr, channel) = resolve_and_open(addr)?;
        let id = CmId::new(&channel)?;
        let deadline = Instant::now() + opts.timeout;
        id.resolve_addr(&addr, 2000).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        expect_event(&channel, Expect::AddrResolved, deadline, &addr)?;
        id.resolve_route(2000).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        expect_event(&channel, Expect::RouteResolved, deadline, &addr)?;
        let ep = Endpoint::new(
            id,
            &EndpointConfig {
                rx_size: opts.rx_size,
                comp_vector: Some(0),
                reject_on_failure: false,
                tx_chunk: u32::MAX,
            },
        )?;
        ep.id().connect(CONNECT_PARAMS).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        Ok((addr, channel, ep, deadline))
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.d.nic.id().peer_addr()
    }

    /// The address the peer's RegisterXferMemory named for its RX buffer (0 before one
    /// arrived).
    pub fn peer_window_addr(&self) -> u64 {
        self.d.core.tx().remote_addr
    }

    /// Posts the control messages the core queued.
    fn flush_control(&mut self) -> Result<()> {
        self.d.flush_control().map_err(ClientError::from)
    }

    /// The peer left, the connection failed, or we closed it.
    pub fn is_gone(&self) -> bool {
        !matches!(self.d.core.state(), State::Accepting | State::Established)
    }

    /// Processes completions and CM events that are already there (no waiting).
    /// Returns whether anything was processed. Public so that a non-blocking driver
    /// (the TCP bridge) can run it when one of [`poll_fds`](Self::poll_fds) wakes.
    ///
    /// Data that arrived before a disconnect stays readable: completions are handled
    /// before CM events, and once a CM event says the peer is gone the CQ is drained
    /// once more, for writes that completed between the two looks; the flush errors
    /// that follow a disconnect are no failure (the core's rule). Returns the failure
    /// when the connection failed (a protocol violation, a failed work request).
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = self.drain_completions()?;
        while let Some(e) = self.channel.next_event()? {
            progressed = true;
            if e.is_disconnect() && self.d.core.on_disconnected() {
                self.drain_completions()?;
            }
        }
        Ok(progressed)
    }

    /// Polls the CQ empty and feeds the core. Returns whether anything was processed.
    fn drain_completions(&mut self) -> Result<bool> {
        let mut any = false;
        loop {
            self.completions.clear();
            let completions = &mut self.completions;
            let left = self.d.nic.poll(1024, |c| completions.push(c))?;
            any |= !self.completions.is_empty();
            let (features, keepalives) = (&mut self.server_features, &mut self.keepalives);
            let failed = self.d.feed(&self.completions, |r| match r {
                Received::ServerFeatures(f) => *features = Some(f),
                Received::Keepalive => *keepalives += 1,
                _ => {}
            });
            if let Some(f) = failed {
                return Err(f.into());
            }
            if !left {
                return Ok(any);
            }
        }
    }

    /// The fds a non-blocking driver polls for POLLIN: the completion channel and the
    /// rdma_cm event channel. When either is readable, call [`pump`](Self::pump)
    /// (or [`peek`](Self::peek) / [`try_read`](Self::try_read), which pump first).
    pub fn poll_fds(&self) -> [i32; 2] {
        [self.d.nic.comp_fd(), self.channel.fd()]
    }

    /// Bytes [`try_write`](Self::try_write) accepts now, in one write: the room left in
    /// the server's RX window, or 0 when that window is used up, the send queue is
    /// full or the peer is gone. A relay reads only this much from its source, so
    /// nothing is buffered beyond the window and backpressure reaches the source.
    pub fn write_room(&self) -> usize {
        self.d.core.write_room(self.d.nic.can_write())
    }

    /// A copy of the unread received bytes, after processing what is there (never waits). Empty
    /// when nothing is there yet; `PeerGone` only once the peer is gone *and* every byte
    /// it sent before leaving was consumed. Give back what was used with
    /// [`consume`](Self::consume): a relay consumes only what its sink accepted, so the
    /// server's window stays closed while the sink is blocked.
    pub fn peek(&mut self) -> Result<&[u8]> {
        self.pump()?;
        match self.d.core.readable() {
            Ok(range) => {
                self.peeked.clear();
                self.d.nic.copy_rx_into_vec(range, &mut self.peeked);
                Ok(&self.peeked)
            }
            Err(ReadError::WouldBlock) => Ok(&[]),
            Err(ReadError::Eof | ReadError::Closed) => Err(ClientError::PeerGone),
            Err(ReadError::Failed(f)) => Err(f.into()),
        }
    }

    /// Marks `n` bytes of what [`peek`](Self::peek) returned as used; when that empties
    /// a full RX buffer it is handed back to the server (RegisterXferMemory), unless
    /// the server is gone.
    pub fn consume(&mut self, n: usize) -> Result<()> {
        self.d.core.consume(n);
        self.flush_control()
    }

    /// Copies what was received into `buf` without waiting: `Ok(0)` means nothing now
    /// (the blocking [`read`](Self::read) waits instead). Bytes that arrived before the
    /// peer left are returned first; `PeerGone` comes once none is left.
    pub fn try_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.pump()?;
        self.read_now(buf).map(|n| n.unwrap_or(0))
    }

    /// What [`read`](Self::read) returns without waiting: `None` when nothing is there.
    fn read_now(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        match self.d.read(buf) {
            (Ok(n), None) => Ok(Some(n)),
            (Ok(_), Some(f)) => Err(f.into()),
            (Err(ReadError::WouldBlock), _) => Ok(None),
            (Err(ReadError::Eof | ReadError::Closed), _) => Err(ClientError::PeerGone),
            (Err(ReadError::Failed(f)), _) => Err(f.into()),
        }
    }

    /// Waits until something happens (a completion or a CM event), then processes it.
    /// Returns at once if something was already there: the caller re-checks its
    /// condition (blocking now would sleep through what just arrived).
    fn wait(&mut self, deadline: Instant, what: &'static str) -> Result<()> {
        if self.pump()? {
            return Ok(());
        }
        if self.is_gone() {
            return Err(match self.d.core.failure() {
                Some(f) => f.clone().into(),
                None => ClientError::PeerGone,
            });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::Timeout(what));
        }
        verbs::wait_readable(&self.poll_fds(), deadline - now);
        self.pump().map(|_| ())
    }

    /// Writes all of `data`, waiting for the server to re-open its RX buffer when full.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while !data.is_empty() {
            let n = self.try_write(data)?;
            data = &data[n..];
            if n == 0 {
                self.wait(deadline, "the server to consume its RX buffer")?;
            }
        }
        Ok(())
    }

    /// Writes as much as the window takes now (one RDMA_WRITE_WITH_IMM).
    pub fn try_write(&mut self, data: &[u8]) -> Result<usize> {
        // (a client's TX buffer is one chunk: the limit is the send queue's room)
        match self.d.write(&[data]).0 {
            Ok(g) => Ok(g.len as usize),
            Err(WriteError::WouldBlock(_)) => Ok(0),
            Err(WriteError::PeerClosed | WriteError::Closed) => Err(ClientError::PeerGone),
            Err(WriteError::Failed(f)) => Err(f.into()),
        }
    }

    /// Reads what is there, waiting up to the timeout for at least one byte.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(n) = self.read_now(buf)? {
                return Ok(n);
            }
            self.wait(deadline, "a reply")?;
        }
    }

    /// Asks the server for its features (GetServerFeature) and waits for the answer.
    pub fn server_features(&mut self) -> Result<u64> {
        self.d.core.send_control(ControlMessage::GetServerFeature { select_raw: [0, 0], features: 0 });
        self.flush_control()?;
        let deadline = Instant::now() + self.timeout;
        self.server_features = None;
        loop {
            if let Some(f) = self.server_features {
                return Ok(f);
            }
            self.wait(deadline, "GetServerFeature's answer")?;
        }
    }

    /// Tells the server which features we want (SetClientFeature); none is defined,
    /// so only 0 is meaningful today.
    pub fn set_client_features(&mut self, features: u64) -> Result<()> {
        self.d.core.send_control(ControlMessage::SetClientFeature { select_raw: [0, 0], features });
        self.flush_control()
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.d.nic
    }

    /// Processes whatever arrives for `d` (lets the server's messages arrive).
    pub fn settle(&mut self, d: Duration) -> Result<()> {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            match self.wait(deadline, "nothing") {
                Ok(()) | Err(ClientError::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for RdmaStream {
    fn drop(&mut self) {
        self.d.core.close();
        self.d.nic.disconnect();
    }
}

/// The CM events of connection set-up, in order.
#[derive(Clone, Copy)]
enum Expect {
    AddrResolved,
    RouteResolved,
    Established,
}

/// The server's address, resolved, and a new rdma_cm event channel (the verbs libraries
/// loaded first, so that their absence is told apart from a missing `rdma_ucm`).
pub(crate) fn resolve_and_open(addr: impl ToSocketAddrs) -> Result<(SocketAddr, EventChannel)> {
    let addr: SocketAddr = addr
        .to_socket_addrs()
        .map_err(|e| ClientError::Refused(e.to_string()))?
        .next()
        .ok_or_else(|| ClientError::Refused("the address resolves to nothing".into()))?;
    verbs::lib().map_err(|e| ClientError::NoDevice(e.to_string()))?;
    let channel = EventChannel::new().map_err(|e| ClientError::NoDevice(format!("{e} (is rdma_ucm loaded?)")))?;
    Ok((addr, channel))
}

fn expect_event(ch: &EventChannel, want: Expect, deadline: Instant, addr: &SocketAddr) -> Result<()> {
    loop {
        if let Some(e) = ch.next_event()? {
            let ok = match want {
                Expect::AddrResolved => e.is_addr_resolved(),
                Expect::RouteResolved => e.is_route_resolved(),
                Expect::Established => e.is_established(),
            };
            if ok {
                return Ok(());
            }
            return Err(ClientError::Refused(format!(
                "{addr}: {} (status {}){}",
                e.name(),
                e.status,
                if e.is_resolve_error() { " - is the address on an RDMA device?" } else { "" }
            )));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::Timeout("the connection to be set up"));
        }
        verbs::wait_readable(&[ch.fd()], deadline - now);
    }
}

/// A blocking RESP client over an [`RdmaStream`].
pub struct Client {
    stream: RdmaStream,
    inbuf: Vec<u8>,
    /// Where each read lands before it joins `inbuf` (allocated once, not per read).
    chunk: Vec<u8>,
    scanner: resp::FrameScanner,
}

impl Client {
    /// Connects, then authenticates and selects the database the options name; an
    /// error reply to either is [`ClientError::Refused`] with the server's text.
    pub fn connect(addr: impl ToSocketAddrs, opts: Options) -> Result<Client> {
        let mut c = Client {
            stream: RdmaStream::connect(addr, &opts)?,
            inbuf: Vec::new(),
            chunk: vec![0; 256 * 1024],
            scanner: Default::default(),
        };
        let db = opts.db.map(|n| n.to_string());
        let mut setup: Vec<Vec<&[u8]>> = Vec::new();
        match &opts.auth {
            Some((Some(user), pass)) => setup.push(vec![b"AUTH", user.as_bytes(), pass.as_bytes()]),
            Some((None, pass)) => setup.push(vec![b"AUTH", pass.as_bytes()]),
            None => {}
        }
        if let Some(db) = &db {
            setup.push(vec![b"SELECT", db.as_bytes()]);
        }
        if !setup.is_empty() {
            for reply in c.pipeline(&setup)? {
                if let Reply::Error(e) = reply {
                    return Err(ClientError::Refused(e));
                }
            }
        }
        Ok(c)
    }

    pub fn stream(&mut self) -> &mut RdmaStream {
        &mut self.stream
    }

    /// Sends one command and waits for its reply.
    pub fn command(&mut self, args: &[&[u8]]) -> Result<Reply> {
        Ok(self.pipeline(&[args.to_vec()])?.pop().expect("one reply per command"))
    }

    /// Sends all commands at once, then reads one reply per command.
    pub fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>> {
        let mut replies = Vec::with_capacity(cmds.len());
        self.pipeline_into(cmds, &mut replies)?;
        Ok(replies)
    }

    /// As [`pipeline`](Self::pipeline), appending the replies to `replies` as they are
    /// read: after an error, the commands that have a reply there are known to have run
    /// (a caller that retries must not send those again).
    pub fn pipeline_into(&mut self, cmds: &[Vec<&[u8]>], replies: &mut Vec<Reply>) -> Result<()> {
        let mut out = Vec::new();
        for c in cmds {
            resp::encode(c, &mut out);
        }
        self.stream.write_all(&out)?;
        for _ in cmds {
            replies.push(self.read_reply()?);
        }
        Ok(())
    }

    /// Reads the next reply. The scanner finds its end as bytes arrive; it is parsed
    /// once, when complete (linear in the reply's size, however many windows it spans).
    pub fn read_reply(&mut self) -> Result<Reply> {
        loop {
            if let Some(end) = self.scanner.scan(&self.inbuf).map_err(ClientError::Resp)? {
                let (r, used) = resp::parse(&self.inbuf[..end])
                    .map_err(ClientError::Resp)?
                    .ok_or_else(|| ClientError::Resp("reply ends where the scanner said it would not".into()))?;
                self.inbuf.drain(..used);
                return Ok(r);
            }
            let n = self.stream.read(&mut self.chunk)?;
            self.inbuf.extend_from_slice(&self.chunk[..n]);
        }
    }
}
