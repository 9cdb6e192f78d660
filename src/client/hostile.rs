//! A misbehaving peer for the robustness tests: each case breaks the protocol (or just
//! good manners) in one way. The test suite runs them against a server and checks that
//! it survives and keeps serving a well-behaved client.

use std::time::Duration;

use super::{resp, ClientError, Options, RdmaStream, Result};
use crate::protocol::{ControlMessage, CONTROL_MESSAGE_LEN};

pub const CASES: &[(&str, &str)] = &[
    ("short-control", "a control message of 16 bytes"),
    ("long-control", "a control message of 64 bytes (longer than the receive slot)"),
    ("unknown-opcode", "a control message with opcode 9"),
    ("register-zero", "RegisterXferMemory with length 0"),
    ("register-huge", "RegisterXferMemory with length 4 GiB - 1"),
    ("imm-overrun", "an RDMA write whose immediate overruns the server's RX buffer"),
    ("flood", "5000 commands, one RDMA write each, beyond the 256 posted receives"),
    ("no-read", "a 4 KiB RX buffer never re-registered while asking for 10 MB of replies"),
    ("register-mid-reply", "RegisterXferMemory of changing lengths while the server writes a 1 MB reply"),
    ("keepalive-flood", "legal Keepalive messages as fast as the send queue allows, for --hold seconds"),
    ("empty-write-flood", "RDMA writes with immediate 0 (legal, empty) as fast as possible, for --hold seconds"),
    ("disconnect-mid-write", "half a command, then an orderly disconnect"),
    ("no-rtu", "a connect request whose accept is never answered (the CM handshake left half done)"),
    ("vanish", "PING, then the queue pair falls silent (error state, no disconnect) for --hold seconds"),
    ("bad-rkey", "RegisterXferMemory with a wrong key, then PING: the server's reply write fails"),
    ("violation-burst", "30 connections at once, each sending a 16-byte control message"),
    ("die", "half a command, then the process exits without disconnecting"),
    ("feature-flood", "2000 SetClientFeature messages asking for unsupported features, then PING"),
    ("register-wrap", "RegisterXferMemory whose region wraps past the end of the address space"),
    ("rdma-read", "an RDMA READ of the server's RX buffer (the server must refuse it)"),
    ("half-open-flood", "3000 connect requests (at most 90 s of them), none ever completed, held for --hold seconds"),
    ("stop-receiving", "infinite RNR retry, no receives re-posted once the replies stop, then waits --hold seconds"),
    (
        "grow-in-flight",
        "infinite RNR retry, no receives re-posted, then 200 larger RX windows each with a reply in flight",
    ),
];

/// What happened, for the test to check.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server closed the connection (expected for protocol violations).
    ClosedByServer,
    /// The connection was still open when the case ended.
    StillOpen,
    /// The peer's device refused an RDMA READ of its memory (`rdma-read`).
    ReadRefused,
    /// An RDMA READ of the peer's memory completed (`rdma-read`): a leak.
    ReadAllowed,
}

fn control(opcode: u16) -> [u8; CONTROL_MESSAGE_LEN] {
    let mut b = [0u8; CONTROL_MESSAGE_LEN];
    b[..2].copy_from_slice(&opcode.to_be_bytes());
    b
}

/// Reads exactly `buf.len()` bytes (a reply of known length).
fn read_exact(s: &mut RdmaStream, buf: &mut [u8]) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        got += s.read(&mut buf[got..])?;
    }
    Ok(())
}

/// PINGs until no reply comes: with receives no longer re-posted, every reply takes one
/// of ours, and once they are used up the server's next write waits for one (RNR) and
/// stays in flight, since this client asked for infinite RNR retry (as every client of
/// this project does). Returns the number of replies that arrived.
fn ping_until_the_writes_wait(s: &mut RdmaStream) -> Result<u32> {
    let mut buf = [0u8; 64];
    let mut answered = 0;
    loop {
        s.write_all(b"PING\r\n")?;
        let mut got = 0;
        for wait in [20, 300] {
            s.settle(Duration::from_millis(wait))?;
            got = s.try_read(&mut buf)?;
            if got > 0 {
                break;
            }
        }
        if got == 0 {
            return Ok(answered);
        }
        answered += 1;
        if answered > 2000 {
            return Err(ClientError::Refused("the server's replies never stopped".into()));
        }
    }
}

/// Runs one case against `addr`. `hold` is how long `no-read` keeps its connection.
pub fn run(case: &str, addr: &str, hold: Duration) -> Result<Outcome> {
    if case == "half-open-flood" {
        let small = Options { rx_size: 4096, ..Options::default() };
        let until = std::time::Instant::now() + Duration::from_secs(90);
        let (mut held, mut failed) = (Vec::new(), 0);
        while held.len() + failed < 3000 && std::time::Instant::now() < until {
            match RdmaStream::send_connect_request(addr, &small) {
                Ok(h) => held.push(h),
                Err(_) => failed += 1,
            }
        }
        eprintln!(
            "half-open-flood: {} connect requests sent and left unanswered, {failed} could not be sent",
            held.len()
        );
        std::thread::sleep(hold);
        return Ok(Outcome::StillOpen);
    }
    if case == "no-rtu" {
        // The server's accept (REP) arrives in our event channel, which nobody reads, so
        // the handshake's last step (RTU) is never sent: the server must give up on
        // the connection by itself (its CM reports CONNECT_ERROR) and keep nothing.
        let (_addr, _channel, _ep, _) = RdmaStream::send_connect_request(addr, &Options::default())?;
        eprintln!("no-rtu: connect request sent, the answer left unread");
        std::thread::sleep(hold);
        return Ok(Outcome::StillOpen);
    }
    let opts = Options {
        rx_size: match case {
            "no-read" => 4096,
            "register-mid-reply" => 65536, // the reply spans many windows
            _ => Options::default().rx_size,
        },
        ..Options::default()
    };
    let mut s = RdmaStream::connect(addr, &opts)?;
    match case {
        "short-control" => s.endpoint().post_send_raw(&control(2)[..16])?,
        "long-control" => s.endpoint().post_send_raw(&[0u8; 64])?,
        "unknown-opcode" => s.endpoint().post_send_raw(&control(9))?,
        "register-zero" | "register-huge" => {
            let length = if case == "register-zero" { 0 } else { u32::MAX };
            let (addr, key) = (s.d.nic.rx_addr(), s.d.nic.rx_key());
            s.endpoint().post_send_raw(&ControlMessage::RegisterXferMemory { addr, length, key }.encode())?
        }
        "imm-overrun" => {
            let (remote, rkey, len) = (s.d.core.tx().remote_addr, s.d.core.tx().rkey, s.d.core.tx().len());
            s.endpoint().post_write_imm(0, &[b"*"], 1, remote, rkey, len + 1)?
        }
        "flood" => {
            for _ in 0..5000 {
                while s.try_write(b"PING\r\n")? == 0 {
                    s.settle(Duration::from_millis(1))?;
                }
            }
            // read the 5000 replies back: the server served all of it
            let mut got = 0;
            let mut buf = vec![0u8; 65536];
            while got < 5000 * 7 {
                got += s.read(&mut buf)?;
            }
            return Ok(Outcome::StillOpen);
        }
        "no-read" => {
            let mut cmd = Vec::new();
            resp::encode(&[b"SET", b"hostile:big", &vec![b'x'; 100_000]], &mut cmd);
            for _ in 0..100 {
                resp::encode(&[b"GET", b"hostile:big"], &mut cmd);
            }
            s.write_all(&cmd)?;
            // never read: our 4 KiB RX buffer fills and is never handed back
            std::thread::sleep(hold);
            let _ = s.pump()?;
            return Ok(if s.is_gone() { Outcome::ClosedByServer } else { Outcome::StillOpen });
        }
        // A RegisterXferMemory that arrives while the server's
        // writes from its current TX buffer are in flight must not free or reuse that
        // buffer under the NIC. The server may close us or go on; it must not crash.
        "register-mid-reply" => {
            let mut cmd = Vec::new();
            resp::encode(&[b"SET", b"hostile:mid", &vec![b'y'; 1_000_000]], &mut cmd);
            s.write_all(&cmd)?;
            read_exact(&mut s, &mut [0u8; 5])?; // +OK\r\n
            let mut get = Vec::new();
            resp::encode(&[b"GET", b"hostile:mid"], &mut get);
            let (addr, key) = (s.d.nic.rx_addr(), s.d.nic.rx_key());
            for i in 0..50 {
                s.write_all(&get)?;
                let length = if i % 2 == 0 { 32 * 1024 } else { s.d.nic.rx_len() };
                s.endpoint().post_send_raw(&ControlMessage::RegisterXferMemory { addr, length, key }.encode())?;
                s.settle(Duration::from_millis(20))?;
            }
            return Ok(if s.is_gone() { Outcome::ClosedByServer } else { Outcome::StillOpen });
        }
        // The main thread must not stay in one connection's
        // completion drain while this peer keeps the CQ full; the test checks that
        // another client is served meanwhile.
        "keepalive-flood" | "empty-write-flood" => {
            let until = std::time::Instant::now() + hold;
            let mut sent = 0u64;
            while std::time::Instant::now() < until {
                let posted = if case == "keepalive-flood" {
                    s.endpoint().post_control(&ControlMessage::Keepalive).is_ok()
                } else {
                    let (remote, rkey) = (s.d.core.tx().remote_addr, s.d.core.tx().rkey);
                    s.d.nic.can_write() && s.endpoint().post_write_imm(0, &[], 0, remote, rkey, 0).is_ok()
                };
                if posted {
                    sent += 1;
                } else {
                    s.pump()?; // send completions free the queue
                }
            }
            // Counted as sent only once the server's device acknowledged them: a peer
            // that outran the posted receives waits out RNR back-offs (0.66 s each) first.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while s.d.nic.control_in_flight() > 0 && std::time::Instant::now() < deadline && !s.is_gone() {
                s.pump()?;
            }
            let unacknowledged = s.d.nic.control_in_flight() as u64;
            eprintln!("{case}: {} messages in {} s", sent - unacknowledged, hold.as_secs());
            s.settle(Duration::from_millis(200))?;
            return Ok(if s.is_gone() { Outcome::ClosedByServer } else { Outcome::StillOpen });
        }
        // A peer that stops answering without closing (host gone, cable pulled):
        // only the server's keepalive, unanswered, can notice (docs/protocol.md §5).
        "vanish" => {
            s.write_all(b"PING\r\n")?;
            read_exact(&mut s, &mut [0u8; 7])?; // +PONG\r\n
            s.endpoint().fall_silent()?;
            eprintln!("vanish: silent from now on");
            std::thread::sleep(hold);
            return Ok(Outcome::StillOpen);
        }
        "feature-flood" => {
            let ask = ControlMessage::SetClientFeature { select_raw: [0, 0], features: 1 };
            let mut sent = 0;
            while sent < 2000 {
                if s.endpoint().post_control(&ask).is_ok() {
                    sent += 1;
                } else {
                    s.pump()?; // send completions free the queue
                }
            }
            s.write_all(b"PING\r\n")?;
            read_exact(&mut s, &mut [0u8; 7])?; // +PONG\r\n
            eprintln!("feature-flood: {sent} SetClientFeature sent, PING answered");
            return Ok(if s.is_gone() { Outcome::ClosedByServer } else { Outcome::StillOpen });
        }
        "rdma-read" => {
            let (remote, rkey, len) = (s.d.core.tx().remote_addr, s.d.core.tx().rkey, s.d.core.tx().len());
            s.endpoint().post_read_raw(remote, rkey, len.min(4096))?;
            // A refused read fails this QP (remote access error): the connection ends.
            let _ = s.settle(Duration::from_millis(500));
            return Ok(if s.is_gone() { Outcome::ReadRefused } else { Outcome::ReadAllowed });
        }
        "stop-receiving" => {
            s.endpoint().stop_reposting_receives();
            let answered = ping_until_the_writes_wait(&mut s)?;
            let since = std::time::Instant::now();
            while since.elapsed() < hold && !s.is_gone() {
                let _ = s.settle(Duration::from_millis(200));
            }
            let waited = since.elapsed().as_secs_f64();
            return Ok(if s.is_gone() {
                eprintln!("stop-receiving: {answered} replies, then closed by the server {waited:.1} s later");
                Outcome::ClosedByServer
            } else {
                eprintln!("stop-receiving: {answered} replies, still connected after {waited:.1} s");
                Outcome::StillOpen
            });
        }
        "grow-in-flight" => {
            s.endpoint().stop_reposting_receives();
            let answered = ping_until_the_writes_wait(&mut s)?;
            eprintln!("grow-in-flight: {answered} replies, then the server's writes wait");
            let (addr, key, base) = (s.d.nic.rx_addr(), s.d.nic.rx_key(), s.d.nic.rx_len());
            let echo_200 = [b"ECHO ".as_slice(), &[b'x'; 200], b"\r\n"].concat();
            for i in 1..=200u32 {
                let length = (base + i * 65536).min(crate::protocol::MAX_PEER_RX_SIZE);
                s.endpoint().post_send_raw(&ControlMessage::RegisterXferMemory { addr, length, key }.encode())?;
                // a reply into the new window, which waits as well: one too long to go inline
                // (docs/protocol.md §4.1), so that it is written from a TX buffer
                if s.write_all(&echo_200).is_err() || s.settle(Duration::from_millis(20)).is_err() || s.is_gone() {
                    eprintln!("grow-in-flight: closed by the server after {i} larger windows");
                    return Ok(Outcome::ClosedByServer);
                }
            }
            eprintln!("grow-in-flight: 200 larger windows sent, still connected");
            return Ok(Outcome::StillOpen);
        }
        "register-wrap" => {
            let msg = ControlMessage::RegisterXferMemory {
                addr: u64::MAX - 4095,
                length: s.d.nic.rx_len(),
                key: s.d.nic.rx_key(),
            };
            s.endpoint().post_send_raw(&msg.encode())?;
        }
        "bad-rkey" => {
            let (addr, len, key) = (s.d.nic.rx_addr(), s.d.nic.rx_len(), s.d.nic.rx_key());
            let msg = ControlMessage::RegisterXferMemory { addr, length: len, key: key ^ 0x5a5a };
            s.endpoint().post_send_raw(&msg.encode())?;
            s.settle(Duration::from_millis(100))?;
            s.write_all(b"PING\r\n")?;
        }
        "violation-burst" => {
            let threads: Vec<_> = (0..30)
                .map(|_| {
                    let addr = addr.to_string();
                    std::thread::spawn(move || run("short-control", &addr, hold))
                })
                .collect();
            let closed = threads
                .into_iter()
                .filter_map(|t| t.join().ok())
                .filter(|r| matches!(r, Ok(Outcome::ClosedByServer)))
                .count();
            eprintln!("violation-burst: {closed} of 30 closed by the server");
            return Ok(if closed == 30 { Outcome::ClosedByServer } else { Outcome::StillOpen });
        }
        "disconnect-mid-write" => {
            s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nabc")?;
            s.endpoint().disconnect();
            return Ok(Outcome::StillOpen);
        }
        "die" => {
            s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nabc")?;
            std::process::exit(0);
        }
        other => return Err(ClientError::Refused(format!("unknown hostile case {other}"))),
    }
    // a violation: the server should close us promptly
    for _ in 0..50 {
        match s.settle(Duration::from_millis(100)) {
            Err(ClientError::PeerGone) => return Ok(Outcome::ClosedByServer),
            Err(e) => return Err(e),
            Ok(()) if s.is_gone() => return Ok(Outcome::ClosedByServer),
            Ok(()) => {}
        }
    }
    Ok(Outcome::StillOpen)
}
