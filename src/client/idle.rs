//! Many idle connections held by one client process (`valkey-rdma-bench --idle N`): a
//! capacity test of a server, not a load test. Each connection is set up, sends one
//! PING and checks the PONG, then stays open doing nothing while the server keeps it
//! (Keepalives); later every one is PINGed again.
//!
//! What makes 10,000 connections fit into one process: all of them share one rdma_cm
//! event channel and a few completion queues ([`SharedCq`], 1023 connections each with
//! [`QueueDepths::IDLE`]), so the process needs a handful of fds and CQs instead of two
//! fds and one CQ per connection; the queues are short (16/16) and the RX buffer small
//! (4 KiB by default). Set-up is pipelined: up to `in_flight` connections are between
//! "resolve the address" and "PONG received" at a time, driven by their CM events and
//! completions, so that the server's accept path, not our round trips, sets the pace.
//!
//! Every connection runs the same protocol core (`protocol::conn::Conn`, client role)
//! as [`RdmaStream`](super::RdmaStream).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ClientError, Result, CONNECT_PARAMS};
use crate::protocol::conn::{Conn, WriteError};
use crate::protocol::driver::Driver;
use crate::protocol::session::Role;
use crate::verbs::{
    self, CmEvent, CmId, Completion, Endpoint, EndpointConfig, EventChannel, QueueDepths, SharedCq, WorkCompletion,
    MAX_SHARED_CQES,
};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

#[derive(Debug, Clone)]
pub struct IdleOptions {
    /// Our RX buffer per connection.
    pub rx_size: u32,
    /// Connections being set up at a time.
    pub in_flight: usize,
    /// How long one connection may take from its start to its PONG, and how long the
    /// second round of PINGs may take.
    pub timeout: Duration,
    /// Stop opening connections after this many failed in a row (the server refuses:
    /// a limit was hit, and the rest would only be refused too).
    pub give_up_after: usize,
    pub depths: QueueDepths,
}

impl Default for IdleOptions {
    fn default() -> Self {
        IdleOptions {
            rx_size: 4096,
            in_flight: 32,
            timeout: Duration::from_secs(60),
            give_up_after: 50,
            depths: QueueDepths::IDLE,
        }
    }
}

/// Where one connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Resolving,
    Routing,
    Connecting,
    /// Established; waiting for the server's RegisterXferMemory.
    Registering,
    /// PING sent, waiting for PONG.
    Pinging,
    /// PONG received; held.
    Idle,
    Failed,
}

/// One connection's core and endpoint (`protocol::driver`).
type Live = Driver<Endpoint>;

struct Slot {
    /// The id until the endpoint takes it (at ROUTE_RESOLVED).
    id: Option<CmId>,
    live: Option<Live>,
    phase: Phase,
    started: Instant,
    reply: Vec<u8>,
    pongs: u32,
}

/// What the server's reply bytes are so far.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplyCheck {
    Incomplete,
    Pong,
    /// Anything else (an error such as `-ERR max number of clients reached`), as text.
    Other(String),
}

/// Checks the reply to one PING.
pub fn check_reply(bytes: &[u8]) -> ReplyCheck {
    match bytes.iter().position(|&b| b == b'\n') {
        None => ReplyCheck::Incomplete,
        Some(_) if bytes == b"+PONG\r\n" => ReplyCheck::Pong,
        Some(end) => ReplyCheck::Other(String::from_utf8_lossy(&bytes[..end]).trim_end().to_string()),
    }
}

/// Failures by reason, with the first one's connection number.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Failures {
    pub by_reason: BTreeMap<String, usize>,
    pub first: Option<(usize, String)>,
}

impl Failures {
    pub fn add(&mut self, conn: usize, reason: &str) {
        *self.by_reason.entry(reason.to_string()).or_default() += 1;
        if self.first.is_none() {
            self.first = Some((conn, reason.to_string()));
        }
    }
    pub fn total(&self) -> usize {
        self.by_reason.values().sum()
    }
    /// "N × reason; M × reason", most frequent first.
    pub fn summary(&self) -> String {
        let mut v: Vec<(&String, &usize)> = self.by_reason.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter().map(|(r, n)| format!("{n} x {r}")).collect::<Vec<_>>().join("; ")
    }
}

/// Connections held by one process on shared CQs and one CM channel.
pub struct IdlePool {
    // Field order is drop order: every id (in the slots) before the channel.
    slots: Vec<Slot>,
    by_qp: HashMap<u32, usize>,
    cqs: Vec<Arc<SharedCq>>,
    channel: EventChannel,
    addr: SocketAddr,
    opts: IdleOptions,
    /// Slots between their start and PONG (or failure).
    pending: BTreeSet<usize>,
    /// Slots with completions since their phase was last advanced.
    touched: Vec<usize>,
    failed_in_a_row: usize,
    pub failures: Failures,
    /// Connections that went away while held (after their PONG).
    pub lost: usize,
}

impl IdlePool {
    pub fn new(addr: impl ToSocketAddrs, opts: IdleOptions) -> Result<IdlePool> {
        let (addr, channel) = super::resolve_and_open(addr)?;
        Ok(IdlePool {
            slots: Vec::new(),
            by_qp: HashMap::new(),
            cqs: Vec::new(),
            channel,
            addr,
            opts,
            pending: BTreeSet::new(),
            touched: Vec::new(),
            failed_in_a_row: 0,
            failures: Failures::default(),
            lost: 0,
        })
    }

    /// Connections that answered their last PING and are held.
    pub fn idle(&self) -> usize {
        self.slots.iter().filter(|s| s.phase == Phase::Idle).count()
    }
    /// Shared completion queues made so far.
    pub fn cq_count(&self) -> usize {
        self.cqs.len()
    }

    /// Opens up to `n` more connections, each PINGed once; stops early after
    /// `give_up_after` failures in a row. `progress(idle, failed)` is called now and
    /// then. Returns the connections held (idle) at the end.
    pub fn open(&mut self, n: usize, mut progress: impl FnMut(usize, usize)) -> Result<usize> {
        let end = self.slots.len() + n;
        let mut last_progress = Instant::now();
        let mut held = self.idle();
        loop {
            let gave_up = self.failed_in_a_row >= self.opts.give_up_after;
            while !gave_up && self.slots.len() < end && self.pending.len() < self.opts.in_flight {
                self.start();
            }
            let progressed = self.pump()?;
            self.expire();
            if self.pending.is_empty() && (gave_up || self.slots.len() >= end) {
                break;
            }
            if last_progress.elapsed() >= Duration::from_secs(2) {
                held = self.idle();
                progress(held, self.failures.total());
                last_progress = Instant::now();
            }
            if !progressed {
                verbs::wait_readable(&self.fds(), Duration::from_millis(20));
            }
        }
        held = held.max(self.idle());
        progress(held, self.failures.total());
        Ok(self.idle())
    }

    /// Keeps every connection served (the server's Keepalives consumed, receives
    /// re-posted) for at least `min`, and then until `until_file` exists (if given).
    pub fn hold(&mut self, min: Duration, until_file: Option<&Path>) -> Result<()> {
        let start = Instant::now();
        loop {
            if start.elapsed() >= min && until_file.is_none_or(|f| f.exists()) {
                return Ok(());
            }
            if !self.pump()? {
                verbs::wait_readable(&self.fds(), Duration::from_millis(100));
            }
        }
    }

    /// PINGs every held connection at once and waits for the answers (up to the
    /// timeout). Returns how many answered PONG.
    pub fn ping_all(&mut self) -> Result<usize> {
        let held: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].phase == Phase::Idle).collect();
        for &i in &held {
            self.slots[i].reply.clear();
            self.slots[i].started = Instant::now();
            self.pending.insert(i);
            self.send_ping(i);
        }
        let deadline = Instant::now() + self.opts.timeout;
        while !self.pending.is_empty() && Instant::now() < deadline {
            if !self.pump()? {
                verbs::wait_readable(&self.fds(), Duration::from_millis(20));
            }
        }
        let answered = held.iter().filter(|&&i| self.slots[i].phase == Phase::Idle).count();
        for i in std::mem::take(&mut self.pending) {
            self.fail(i, "no PONG to the second PING in time");
        }
        Ok(answered)
    }

    fn fds(&self) -> Vec<i32> {
        std::iter::once(self.channel.fd()).chain(self.cqs.iter().map(|c| c.fd())).collect()
    }

    fn start(&mut self) {
        let i = self.slots.len();
        self.slots.push(Slot {
            id: None,
            live: None,
            phase: Phase::Resolving,
            started: Instant::now(),
            reply: Vec::new(),
            pongs: 0,
        });
        self.pending.insert(i);
        let mut id = match CmId::new(&self.channel) {
            Ok(id) => id,
            Err(e) => return self.fail(i, &e.to_string()),
        };
        id.set_context(i + 1);
        if let Err(e) = id.resolve_addr(&self.addr, 2000) {
            return self.fail(i, &e.to_string());
        }
        self.slots[i].id = Some(id);
    }

    /// Marks slot `i` failed for `reason` and releases its resources.
    fn fail(&mut self, i: usize, reason: &str) {
        let s = &mut self.slots[i];
        let was_idle = s.phase == Phase::Idle;
        if s.phase == Phase::Failed {
            return;
        }
        s.phase = Phase::Failed;
        if let Some(l) = s.live.take() {
            self.by_qp.remove(&l.nic.qp_num());
        }
        s.id = None;
        self.pending.remove(&i);
        if was_idle {
            self.lost += 1;
            self.failures.add(i, &format!("lost while held: {reason}"));
        } else {
            self.failed_in_a_row += 1;
            self.failures.add(i, reason);
        }
    }

    /// Handles what is there (CM events, completions); whether anything was.
    fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while let Some(e) = self.channel.next_event()? {
            progressed = true;
            if e.context >= 1 && e.context <= self.slots.len() {
                self.on_cm_event(e.context - 1, e);
            }
        }
        let mut wcs: Vec<WorkCompletion> = Vec::new();
        for k in 0..self.cqs.len() {
            let cq = self.cqs[k].clone();
            loop {
                wcs.clear();
                let left = cq.poll(4096, &mut wcs)?;
                progressed |= !wcs.is_empty();
                for wc in &wcs {
                    if let Some(&i) = self.by_qp.get(&wc.qp_num()) {
                        self.on_completion(i, wc);
                    }
                }
                if !left {
                    break;
                }
            }
        }
        for i in std::mem::take(&mut self.touched) {
            self.advance(i);
        }
        Ok(progressed)
    }

    fn on_cm_event(&mut self, i: usize, e: CmEvent) {
        let phase = self.slots[i].phase;
        let what = || format!("{} (status {})", e.name(), e.status);
        match phase {
            Phase::Resolving if e.is_addr_resolved() => {
                let id = self.slots[i].id.as_ref().expect("an id while resolving");
                match id.resolve_route(2000) {
                    Ok(()) => self.slots[i].phase = Phase::Routing,
                    Err(err) => self.fail(i, &err.to_string()),
                }
            }
            Phase::Routing if e.is_route_resolved() => self.build(i),
            Phase::Connecting if e.is_established() => {
                let s = &mut self.slots[i];
                let l = s.live.as_mut().expect("an endpoint while connecting");
                s.phase = Phase::Registering;
                // (posts our RegisterXferMemory)
                match l.on_established() {
                    None => self.touched.push(i),
                    Some(f) => self.fail(i, &ClientError::from(f).to_string()),
                }
            }
            Phase::Failed => {}
            _ if e.is_disconnect() => {
                if let Some(l) = self.slots[i].live.as_mut() {
                    l.core.on_disconnected();
                }
                // what the server wrote before leaving (an error reply) says why
                self.read_reply(i);
                let reply = check_reply(&self.slots[i].reply);
                match reply {
                    ReplyCheck::Other(r) => self.fail(i, &format!("server replied {r:?}, then {}", what())),
                    _ => self.fail(i, &what()),
                }
            }
            _ => self.fail(i, &format!("unexpected {} in phase {phase:?}", what())),
        }
    }

    /// ROUTE_RESOLVED: the endpoint on a shared CQ with room (a new one when all are
    /// full), then the connect request.
    fn build(&mut self, i: usize) {
        let id = self.slots[i].id.take().expect("an id while routing");
        let need = self.opts.depths.cqes();
        let cq = match self.cqs.last() {
            Some(cq) if cq.budget_now().free() >= need => cq.clone(),
            _ => match SharedCq::new(&id, MAX_SHARED_CQES, self.cqs.len() as u32) {
                Ok(cq) => {
                    self.cqs.push(cq.clone());
                    cq
                }
                Err(e) => return self.fail(i, &e.to_string()),
            },
        };
        let cfg = EndpointConfig {
            rx_size: self.opts.rx_size,
            comp_vector: None,
            reject_on_failure: false,
            tx_chunk: u32::MAX,
        };
        let ep = match Endpoint::with_shared_cq(id, &cfg, self.opts.depths, &cq) {
            Ok(ep) => ep,
            Err(e) => return self.fail(i, &e.to_string()),
        };
        if let Err(e) = ep.id().connect(CONNECT_PARAMS) {
            return self.fail(i, &e.to_string());
        }
        self.by_qp.insert(ep.qp_num(), i);
        let core = Conn::new(Role::Client, ep.rx_region());
        let s = &mut self.slots[i];
        s.live = Some(Driver::new(core, ep));
        s.phase = Phase::Connecting;
    }

    fn on_completion(&mut self, i: usize, wc: &WorkCompletion) {
        let Some(l) = self.slots[i].live.as_mut() else { return };
        let mut got: Vec<Completion> = Vec::new();
        let result = match l.nic.on_completion(wc, |c| got.push(c)) {
            Err(e) => Err(ClientError::from(e)),
            // (the TX buffer is made at the first write)
            Ok(()) => l.feed(&got, |_| {}).map_or(Ok(()), |f| Err(f.into())),
        };
        match result {
            Ok(()) => self.touched.push(i),
            Err(e) => self.fail(i, &e.to_string()),
        }
    }

    /// Moves slot `i` on after completions: PING once the server registered its
    /// buffer, PONG checked once it is complete.
    fn advance(&mut self, i: usize) {
        match self.slots[i].phase {
            Phase::Registering => {
                let ready = self.slots[i].live.as_ref().is_some_and(|l| !l.core.tx().is_empty());
                if ready {
                    self.send_ping(i);
                }
            }
            Phase::Pinging => {
                self.read_reply(i);
                match check_reply(&self.slots[i].reply) {
                    ReplyCheck::Incomplete => {}
                    ReplyCheck::Pong => {
                        let s = &mut self.slots[i];
                        s.phase = Phase::Idle;
                        s.pongs += 1;
                        self.pending.remove(&i);
                        self.failed_in_a_row = 0;
                    }
                    ReplyCheck::Other(r) => self.fail(i, &format!("server replied {r:?}")),
                }
            }
            Phase::Idle => {
                // nothing is expected; read (and drop) whatever comes so the window stays open
                self.read_reply(i);
                self.slots[i].reply.clear();
            }
            _ => {}
        }
    }

    fn send_ping(&mut self, i: usize) {
        let Some(l) = self.slots[i].live.as_mut() else { return };
        let r = match l.write(&[PING]).0 {
            Ok(g) if g.len as usize == PING.len() => Ok(()),
            Ok(g) => Err(format!("the server's window took {} of {} bytes", g.len, PING.len())),
            Err(WriteError::WouldBlock(b)) => Err(format!("PING would block: {b:?}")),
            Err(WriteError::PeerClosed | WriteError::Closed) => Err("the server closed the connection".into()),
            Err(WriteError::Failed(f)) => Err(ClientError::from(f).to_string()),
        };
        match r {
            Ok(()) => self.slots[i].phase = Phase::Pinging,
            Err(e) => self.fail(i, &e),
        }
    }

    /// Appends what was received to the slot's reply (hand-backs posted).
    fn read_reply(&mut self, i: usize) {
        let s = &mut self.slots[i];
        let Some(l) = s.live.as_mut() else { return };
        // WouldBlock, or the end: what came is in `reply`; the caller judges it
        let mut buf = [0u8; 4096];
        let mut failed = None;
        while let (Ok(n @ 1..), f) = l.read(&mut buf) {
            s.reply.extend_from_slice(&buf[..n]);
            failed = failed.or(f);
        }
        if let Some(f) = failed {
            self.fail(i, &ClientError::from(f).to_string());
        }
    }

    /// Fails the connections whose set-up (or PING) took longer than the timeout.
    fn expire(&mut self) {
        let t = self.opts.timeout;
        let late: Vec<usize> = self.pending.iter().copied().filter(|&i| self.slots[i].started.elapsed() > t).collect();
        for i in late {
            let phase = self.slots[i].phase;
            self.fail(i, &format!("timed out in phase {phase:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked_when_complete() {
        assert_eq!(check_reply(b""), ReplyCheck::Incomplete);
        assert_eq!(check_reply(b"+PON"), ReplyCheck::Incomplete);
        assert_eq!(check_reply(b"+PONG\r\n"), ReplyCheck::Pong);
        assert_eq!(
            check_reply(b"-ERR max number of clients reached\r\n"),
            ReplyCheck::Other("-ERR max number of clients reached".into())
        );
        assert_eq!(check_reply(b"+PONG\r\n+PONG\r\n"), ReplyCheck::Other("+PONG".into()), "one PING, one PONG");
    }

    #[test]
    fn failures_are_counted_by_reason_most_frequent_first() {
        let mut f = Failures::default();
        assert_eq!((f.total(), f.summary()), (0, String::new()));
        f.add(9000, "REJECTED (status 28)");
        f.add(9001, "timed out in phase Connecting");
        f.add(9002, "REJECTED (status 28)");
        assert_eq!(f.total(), 3);
        assert_eq!(f.first, Some((9000, "REJECTED (status 28)".into())));
        assert_eq!(f.summary(), "2 x REJECTED (status 28); 1 x timed out in phase Connecting");
    }

    #[test]
    fn the_ping_is_one_resp_command() {
        let mut out = Vec::new();
        super::super::resp::encode(&[b"PING".as_slice()], &mut out);
        assert_eq!(out, PING);
    }
}
