//! A deterministic simulator for [`Conn`]: a server core and a client core wired through
//! a fake NIC, each driven by a fake event loop with a fake application, under random
//! interleavings chosen by a seeded PRNG.
//!
//! - **NIC.** One FIFO per direction (RC delivers in order per direction, nothing else
//!   is promised). A data write carries the bytes copied from the sender's TX buffer at
//!   post time; when the NIC delivers it they land in the receiver's RX buffer (checked
//!   against the receiver's window) and a data completion with the immediate goes to the
//!   receiver's CQ. Control messages land as receive completions. The completion
//!   channel fires only for completions that arrive after the last poll, and the driver
//!   polls at most a per-seed budget per wake-up (`COMPLETIONS_PER_OWN_POLL` and
//!   `COMPLETIONS_PER_SHARED_POLL` in the transport). Signalled sends (every
//!   Nth write, control messages, and the write that leaves the send queue at its
//!   reserve) complete on the sender, which frees its send queue (docs/protocol.md §4.5).
//!   A side that leaves: a random prefix of what it had in flight lands, the rest is
//!   lost; the peer gets DISCONNECTED, and errors for its own lost work requests
//!   (usually after the CM event, sometimes before, as retries exhausted would).
//! - **Event loop** (one per side, docs/server-abi.md §4): fd events (CM channel and
//!   completion channel, in random order), then `process_pending_data` (each queued
//!   connection once), then beforeSleep work of the application (direct writes as
//!   `handleClientsWithPendingWrites`, asynchronous frees).
//! - **Application.** Its read handler reads once per call, a random amount, checks
//!   every byte, sometimes queues a reply; its write handler writes pieces of random size
//!   up to a per-call cap (64 KiB, as `writeToClient`, or smaller to match small
//!   buffers) and clears itself when done. On EOF or an error it closes the connection,
//!   from inside the handler or asynchronously. IO threads postpone handlers, read and
//!   write meanwhile, then `update_state`. Handlers are removed and restored
//!   (`protectClient`), barriers toggled, keepalives ticked, features asked.
//! - **Fates.** Per seed: nothing, or one side closing, the link going down, a hostile
//!   completion (bad control messages, an immediate past the window, a too-long SEND),
//!   a failed post.
//!
//! Checked: every byte written is read once and in order, both ways; nothing lands
//! outside the receiver's window; a handler that is installed and whose condition holds
//! at the start of a loop iteration runs in that iteration; no handler runs after close;
//! close unregisters once and frees once; bytes received before a disconnect are read
//! before EOF; hostile inputs fail the connection with exactly the expected reason;
//! every unexpected failure or panic is an error. Without a fate, all bytes arrive.
//!
//! `cargo test --lib protocol::conn::sim` runs the default seeds; `SIM_SEEDS=100000`
//! runs more; `SIM_SEED=N` replays one (add `SIM_TRACE=1` to print its events).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::*;
use crate::protocol::control::CONTROL_MESSAGE_LEN;
use crate::protocol::driver::{self, Completion, Driver, LocalError, Mutant, Nic, RunEnd, TxBuffersHeld};
use crate::protocol::{Opcode, MAX_PEER_RX_SIZE};

const SERVER: usize = 0;
const CLIENT: usize = 1;
const NAME: [&str; 2] = ["server", "client"];
/// `ibv_wc_status`: IBV_WC_LOC_LEN_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_RETRY_EXC_ERR.
const LOC_LEN_ERR: u32 = 1;
const WR_FLUSH_ERR: u32 = 5;
const RETRY_EXC_ERR: u32 = 12;

/// What the seeds exercised, printed with `SIM_STATS=1` (to see that the interesting
/// paths are taken, not only that nothing failed).
#[derive(Default)]
struct Stats {
    seeds: AtomicU64,
    bytes: AtomicU64,
    write_reruns: AtomicU64,
    backlog_turns: AtomicU64,
    window_waits: AtomicU64,
    send_queue_waits: AtomicU64,
    reregistrations: AtomicU64,
    rx_grown: AtomicU64,
    disconnects_with_unread: AtomicU64,
    eofs: AtomicU64,
    violations: AtomicU64,
    work_request_failures: AtomicU64,
    post_failures: AtomicU64,
    scheduled_frees: AtomicU64,
    async_closes: AtomicU64,
    liveness_checks: AtomicU64,
}

static STATS: OnceLock<Stats> = OnceLock::new();

fn stat(f: impl FnOnce(&Stats) -> &AtomicU64) {
    f(STATS.get_or_init(Stats::default)).fetch_add(1, Ordering::Relaxed);
}

/// SplitMix64: small, seedable, good enough to pick interleavings.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// The byte streams: byte `i` of side `s`'s stream is `PATTERN[(i + 7919 s) % P]`.
const PATTERN_LEN: usize = 65_521;

fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let mut r = Rng(0x5eed);
        (0..PATTERN_LEN).map(|_| r.next() as u8).collect()
    })
}

/// Visits the stream bytes `start..start + len` of `side` in pattern-sized chunks.
fn stream_chunks(side: usize, start: u64, len: usize, mut f: impl FnMut(usize, &[u8])) {
    let p = pattern();
    let mut at = ((start + 7919 * side as u64) % PATTERN_LEN as u64) as usize;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(PATTERN_LEN - at);
        f(done, &p[at..at + n]);
        done += n;
        at = 0;
    }
}

/// A hostile completion, forged as if the peer had sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forged {
    ShortSend(usize),
    UnknownOpcode(u16),
    BadRegisterLength(u32),
    SetClientFeatureToClient,
    Overrun(u32),
    TooLongSend,
}

#[derive(Debug)]
enum Wire {
    Write { wr: u64, signaled: bool, offset: u32, addr: u64, rkey: u32, bytes: Vec<u8> },
    Send { wr: u64, bytes: [u8; CONTROL_MESSAGE_LEN] },
    Forged(Forged),
}

#[derive(Debug)]
enum Cqe {
    Control(Vec<u8>, Option<Forged>),
    Data(u32, Option<Forged>),
    SendDone(u64),
    Failed { wr: Option<u64>, status: u32, forged: Option<Forged> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cm {
    Established,
    Disconnected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    None,
    Close(usize),
    LinkDown,
    Hostile(usize, Forged),
    PostFails(usize),
}

/// The fake NIC, one side's half: what `protocol::driver` drives here instead of a
/// verbs endpoint.
struct SimNic {
    side: usize,
    rx: RxBuffer,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    /// In flight from this side to the other.
    out: VecDeque<Wire>,
    /// Decides when a larger RX buffer is ready (seeded from the simulation's PRNG).
    rng: Rng,
    /// A post failed since the simulator last looked (injected or a full send queue).
    post_failed: bool,
    cq: VecDeque<Cqe>,
    /// A completion arrived since the last poll: the completion channel fd is readable.
    cq_notified: bool,
    /// Completions the driver takes per poll (the transport's poll budgets).
    cq_budget: usize,
    /// Outstanding send work requests (id, signalled), in posting order.
    sq: VecDeque<(u64, bool)>,
    sq_depth: usize,
    sq_reserve: usize,
    signal_every: u32,
    unsignaled_run: u32,
    next_wr: u64,
    /// The peer is gone: our work requests fail (retries exhausted, flushes).
    link_down: bool,
    /// Errors of lost work requests, delivered with the DISCONNECTED event.
    deferred: Vec<Cqe>,
    errors_early: bool,
    fail_next_post: bool,
    /// Bytes landed in our RX buffer, and where the current window round ends.
    landed: u64,
    landed_end: u32,
    registered_once: bool,
    /// Adaptive RX window: the size being prepared off the event loop, and the
    /// prepared buffer the next hand-back names.
    preparing: Option<u32>,
    prepared: Option<RxBuffer>,
}

struct Side {
    /// The core and the fake NIC, driven by the production driver.
    d: Driver<SimNic>,
    cm: VecDeque<Cm>,
    // the event loop's bookkeeping
    pending: bool,
    in_run: bool,
    unregisters: u32,
    frees: u32,
    freed: bool,
    called: [bool; 2],
    // the application
    produced: u64,
    sent: u64,
    received: u64,
    budget: u64,
    write_cap: usize,
    max_read: usize,
    app_closed: bool,
    close_asap: bool,
    pending_writes: bool,
    protected: bool,
    io_owned: Option<Postpone>,
    /// An IO thread read or wrote: what that made due is the business of `update_state`,
    /// which the server calls when the IO thread hands the client back.
    io_touched: bool,
    got_eof: bool,
    keepalives: u64,
    features_asked: u64,
    features_answered: u64,
    /// What the server saw last of the core's state and failure, as the transport
    /// publishes it: updated only when the core reports a change.
    published: Option<(ServerState, Option<i32>)>,
}

impl Side {
    fn new(role: Role, rng: &mut Rng, rx_len: u32, peer_rx_len: u32, big: bool) -> Side {
        let side = if role == Role::Server { SERVER } else { CLIENT };
        let rx = RxBuffer { addr: 0x1000_0000 * (side as u64 + 1), len: rx_len, key: 7 + side as u32 };
        let sq_depth = rng.range(12, 64) as usize;
        let peer = u64::from(peer_rx_len);
        let nic = SimNic {
            side,
            rx,
            rx_buf: vec![0; rx_len as usize],
            tx_buf: Vec::new(),
            out: VecDeque::new(),
            rng: Rng(rng.next()),
            post_failed: false,
            cq: VecDeque::new(),
            cq_notified: false,
            cq_budget: if rng.one_in(2) { usize::MAX } else { rng.range(1, 8) as usize },
            sq: VecDeque::new(),
            sq_depth,
            sq_reserve: rng.range(8, sq_depth as u64 - 2) as usize,
            signal_every: rng.range(1, 32) as u32,
            unsignaled_run: 0,
            next_wr: 1,
            link_down: false,
            deferred: Vec::new(),
            errors_early: false,
            fail_next_post: false,
            landed: 0,
            landed_end: 0,
            preparing: None,
            prepared: None,
            registered_once: false,
        };
        Side {
            d: Driver::new(Conn::new(role, rx), nic),
            cm: VecDeque::new(),
            pending: false,
            in_run: false,
            unregisters: 0,
            frees: 0,
            freed: false,
            called: [false; 2],
            produced: 0,
            sent: 0,
            received: 0,
            budget: if big { rng.range(0, 1 << 20) } else { rng.range(0, (40 * peer).min(64 << 10)) },
            write_cap: if big || rng.one_in(2) { 64 << 10 } else { rng.range(1, 2 * peer) as usize },
            max_read: rng.range(1, 2 * u64::from(rx_len)) as usize,
            app_closed: false,
            close_asap: false,
            pending_writes: false,
            protected: false,
            io_owned: None,
            io_touched: false,
            got_eof: false,
            keepalives: 0,
            features_asked: 0,
            features_answered: 0,
            published: None,
        }
    }

    /// The independent oracle of "the handler is installed and its condition holds",
    /// for handlers that make progress when called (the application has output to
    /// write, and is not about to free the client): a handler that makes none is, by
    /// design, not called again until something changes.
    fn due(&self) -> [bool; 2] {
        let core = &self.d.core;
        if self.freed || *core.state() == State::Closed || self.close_asap || self.io_touched {
            return [false, false];
        }
        let p = core.postponed();
        let terminal =
            matches!(core.state(), State::Failed(_)) || (*core.state() == State::PeerClosed && !core.rx().has_unread());
        let read = core.has_read_handler() && !p.read() && (core.rx().has_unread() || terminal);
        // while the peer's last bytes are unread, only the read handler runs (a write
        // would fail and the server would free the client before reading them)
        let write = core.has_write_handler()
            && !p.write()
            && (terminal
                || (*core.state() == State::Established
                    && core.tx().available() > 0
                    && self.d.nic.sq_room()
                    && self.sent < self.produced));
        [read, write]
    }
}

/// What a failed post reports.
const POST_FAILED: LocalError = LocalError { call: "ibv_post_send", errno: libc::ENOMEM };

impl SimNic {
    fn complete(&mut self, c: Cqe) {
        self.cq.push_back(c);
        self.cq_notified = true;
    }

    /// Takes a send-queue entry for a work request: `(id, signalled)`. Fails when a
    /// failure was injected, or for a control message finding the send queue full,
    /// which fails the connection (docs/protocol.md §3.3): reachable only when the NIC
    /// sits on the entries kept for control messages for many keepalive periods, which
    /// this NIC may do.
    fn post(&mut self, control: bool) -> Result<(u64, bool), LocalError> {
        let full = self.sq.len() == self.sq_depth;
        if full && !control {
            panic!("{}: a data write was granted with a full send queue", NAME[self.side]);
        }
        if self.fail_next_post || full {
            self.fail_next_post = false;
            self.post_failed = true;
            stat(|x| &x.post_failures);
            return Err(POST_FAILED);
        }
        let wr = self.next_wr;
        self.next_wr += 1;
        self.unsignaled_run += 1;
        let signaled = control
            || self.unsignaled_run >= self.signal_every
            || self.sq_depth - (self.sq.len() + 1) <= self.sq_reserve;
        if signaled {
            self.unsignaled_run = 0;
        }
        if self.link_down {
            // the QP is going down: this request fails (retries exhausted or flushed)
            let e = Cqe::Failed { wr: None, status: RETRY_EXC_ERR, forged: None };
            if self.errors_early {
                self.complete(e);
            } else {
                self.deferred.push(e);
            }
            return Ok((wr, signaled));
        }
        self.sq.push_back((wr, signaled));
        Ok((wr, signaled))
    }

    /// A signalled completion frees its entry and every one before it (RC completes in
    /// order).
    fn free_sq(&mut self, wr: u64) {
        if self.sq.iter().any(|&(w, _)| w == wr) {
            while let Some((w, _)) = self.sq.pop_front() {
                if w == wr {
                    break;
                }
            }
        }
    }
}

impl Nic for SimNic {
    fn post_control(&mut self, msg: &ControlMessage) -> Result<(), LocalError> {
        if let ControlMessage::RegisterXferMemory { addr, length, key } = *msg {
            if (addr, length, key) != (self.rx.addr, self.rx.len, self.rx.key) {
                panic!("{}: RegisterXferMemory names the wrong buffer: {msg:?}", NAME[self.side]);
            }
            // A window is handed back only when full and consumed, or at ESTABLISHED.
            let fresh = !self.registered_once && self.landed_end == 0;
            if !(fresh || self.landed_end == self.rx.len) {
                panic!(
                    "{}: RegisterXferMemory with landed bytes up to {} of {}",
                    NAME[self.side], self.landed_end, self.rx.len
                );
            }
            if self.registered_once {
                stat(|x| &x.reregistrations);
            }
            self.registered_once = true;
            self.landed_end = 0;
            // From now on the peer may write over the whole buffer, and this NIC lets it
            // do so at once: a byte the driver had not copied out before is lost, and
            // the stream check sees it.
            self.rx_buf.fill(0xa5);
        }
        let (wr, _) = self.post(true)?;
        if !self.link_down {
            self.out.push_back(Wire::Send { wr, bytes: msg.encode() });
        }
        Ok(())
    }
    fn sq_room(&self) -> bool {
        self.sq_depth - self.sq.len() > self.sq_reserve
    }
    fn copy_rx(&mut self, range: std::ops::Range<usize>, out: &mut [u8]) {
        out[..range.len()].copy_from_slice(&self.rx_buf[range]);
    }
    fn peer_rx_registered(&mut self, len: u32, resized: bool) -> Result<(), TxBuffersHeld> {
        if resized {
            self.tx_buf.resize(len as usize, 0);
        }
        if self.tx_buf.len() != len as usize {
            panic!("{}: TX buffer {} bytes for a {len}-byte window", NAME[self.side], self.tx_buf.len());
        }
        Ok(())
    }
    fn write_limit(&self, _tx_offset: u32) -> usize {
        usize::MAX
    }
    fn post_write(&mut self, g: &WriteGrant, parts: &[&[u8]]) -> Result<(), LocalError> {
        let (at, n) = (g.offset as usize, g.len as usize);
        if self.tx_buf.len() < at + n {
            panic!("{}: write grant {g:?} beyond the {}-byte TX buffer", NAME[self.side], self.tx_buf.len());
        }
        let mut done = 0;
        for p in parts {
            let k = p.len().min(n - done);
            self.tx_buf[at + done..at + done + k].copy_from_slice(&p[..k]);
            done += k;
        }
        let (wr, signaled) = self.post(false)?;
        if !self.link_down {
            let bytes = self.tx_buf[at..at + n].to_vec();
            self.out.push_back(Wire::Write {
                wr,
                signaled,
                offset: g.offset,
                addr: g.remote_addr,
                rkey: g.rkey,
                bytes,
            });
        }
        Ok(())
    }
    /// A larger buffer is prepared off the event loop: it becomes ready at some later
    /// read, or cannot be made (the old one is kept).
    fn rx_prepared(&mut self) -> Option<Option<RxBuffer>> {
        if self.preparing.is_none() || !self.rng.one_in(3) {
            return None;
        }
        let len = self.preparing.take().unwrap_or_default();
        if self.rng.one_in(8) {
            return Some(None);
        }
        let b = RxBuffer { addr: self.rx.addr + 0x100_0000, len, key: self.rx.key + 100 };
        self.prepared = Some(b);
        Some(Some(b))
    }
    fn prepare_rx(&mut self, len: u32) -> bool {
        self.preparing = Some(len);
        true
    }
    fn install_prepared_rx(&mut self) {
        let Some(new) = self.prepared.take() else {
            panic!("{}: RX buffer swapped without a prepared one", NAME[self.side]);
        };
        if self.landed_end != self.rx.len {
            panic!(
                "{}: RX buffer replaced with only {} of {} bytes landed",
                NAME[self.side], self.landed_end, self.rx.len
            );
        }
        self.rx = new;
        self.rx_buf = vec![0; new.len as usize];
        self.landed_end = new.len; // the old buffer was full: the hand-back check
        stat(|x| &x.rx_grown);
    }
}

struct Sim {
    seed: u64,
    rng: Rng,
    step: u64,
    sides: [Side; 2],
    fate: Fate,
    fate_step: u64,
    fate_done: bool,
    link_gone: bool,
    trace: bool,
}

macro_rules! fail {
    ($sim:expr, $($arg:tt)*) => {
        panic!("step {}: {}", $sim.step, format!($($arg)*))
    };
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let big = rng.one_in(12);
        let mut rx_len = || if big { rng.range(64 << 10, 256 << 10) as u32 } else { rng.range(1, 4096) as u32 };
        let (srv_rx, cli_rx) = (rx_len(), rx_len());
        let mut server = Side::new(Role::Server, &mut rng, srv_rx, cli_rx, big);
        if rng.one_in(2) {
            // adaptive RX window: the server's buffer may grow at hand-backs up to 64×
            server.d.core.set_rx_cap(srv_rx.saturating_mul(rng.range(2, 64) as u32));
        }
        let client = Side::new(Role::Client, &mut rng, cli_rx, srv_rx, big);
        let fate = match rng.below(10) {
            0..=4 => Fate::None,
            5 => Fate::Close(rng.below(2) as usize),
            6 => Fate::LinkDown,
            7 | 8 => {
                let side = rng.below(2) as usize;
                let len = if big { srv_rx.max(cli_rx) } else { 4096 };
                let f = match rng.below(if side == CLIENT { 6 } else { 5 }) {
                    0 => Forged::ShortSend(rng.below(CONTROL_MESSAGE_LEN as u64) as usize),
                    1 => Forged::UnknownOpcode(rng.range(4, 0xffff) as u16),
                    2 => Forged::BadRegisterLength(if rng.one_in(2) {
                        0
                    } else {
                        rng.range(u64::from(MAX_PEER_RX_SIZE) + 1, u64::from(u32::MAX)) as u32
                    }),
                    3 => Forged::Overrun(if rng.one_in(4) {
                        u32::MAX - rng.below(16) as u32
                    } else {
                        // past any RX buffer, also one grown to its cap (64× at most)
                        len.saturating_mul(64).saturating_add(1 + rng.below(1000) as u32)
                    }),
                    4 => Forged::TooLongSend,
                    _ => Forged::SetClientFeatureToClient,
                };
                Fate::Hostile(side, f)
            }
            _ => Fate::PostFails(rng.below(2) as usize),
        };
        let fate_step = rng.range(1, 300);
        Sim {
            seed,
            rng,
            step: 0,
            sides: [server, client],
            fate,
            fate_step,
            fate_done: false,
            link_gone: false,
            trace: std::env::var_os("SIM_TRACE").is_some(),
        }
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.trace {
            println!("[{}] {}", self.step, what());
        }
    }

    fn run(mut self) {
        self.log(|| {
            format!(
                "seed {}: rx {}/{}, caps {}/{}, budgets {}/{}, sq {}/{} {}/{}, fate {:?} at {}",
                self.seed,
                self.sides[0].d.nic.rx.len,
                self.sides[1].d.nic.rx.len,
                self.sides[0].write_cap,
                self.sides[1].write_cap,
                self.sides[0].budget,
                self.sides[1].budget,
                self.sides[0].d.nic.sq_depth,
                self.sides[0].d.nic.sq_reserve,
                self.sides[1].d.nic.sq_depth,
                self.sides[1].d.nic.sq_reserve,
                self.fate,
                self.fate_step
            )
        });
        // CONNECT_REQUEST: createClient installs the read handler, then ct->accept runs
        // the accept handler (docs/protocol.md §1 step 5, docs/server-abi.md §4.1).
        let s = &mut self.sides[SERVER].d.core;
        s.set_read_handler(true);
        s.on_accepted().expect("a new connection is accepted");
        s.enter_handler();
        assert_eq!(s.handler_returned(), AfterHandler::Continue);
        self.sides[CLIENT].d.core.set_read_handler(true);
        self.sides[SERVER].cm.push_back(Cm::Established);
        self.sides[CLIENT].cm.push_back(Cm::Established);

        let steps = self.rng.range(20, 400);
        while self.step < steps {
            self.step += 1;
            self.random_action();
            self.check_published_state();
            self.iterate_both();
            self.check_published_state();
        }
        self.quiesce();
        self.check_published_state();
        self.final_checks();
    }

    /// The transport writes `conn->state` only when the core reports a change
    /// (`Conn::take_state_change`): a change it did not report would leave the server
    /// with a stale state, so each side's state is published here as the transport
    /// would, and must then be what the core says.
    fn check_published_state(&mut self) {
        for (side, name) in self.sides.iter_mut().zip(NAME) {
            let core = &mut side.d.core;
            let now = (core.server_state(), core.failure().map(Failure::errno));
            if core.take_state_change() {
                side.published = Some(now);
            }
            if side.published != Some(now) {
                panic!(
                    "seed {}: {name} is {now:?} but the server saw {:?}: a change not reported",
                    self.seed, side.published
                );
            }
        }
    }

    // ----- random actions ----------------------------------------------------------

    fn random_action(&mut self) {
        if !self.fate_done && self.step >= self.fate_step {
            self.fate_done = true;
            self.apply_fate();
        }
        let s = self.rng.below(2) as usize;
        match self.rng.below(100) {
            0..=39 => {
                let k = if self.rng.one_in(4) { usize::MAX } else { self.rng.range(1, 4) as usize };
                self.deliver(s, k);
            }
            40..=54 => self.produce(s),
            55..=59 => self.io_begin(s),
            60..=66 => self.io_work(s),
            67..=72 => self.io_end(s),
            73..=76 => self.toggle_protect(s),
            77..=79 => self.toggle_barrier(s),
            80 if self.rng.one_in(4) => self.keepalive_tick(),
            81 => self.ask_features(),
            _ => {}
        }
    }

    fn apply_fate(&mut self) {
        self.log(|| format!("fate {:?}", self.fate));
        match self.fate {
            Fate::None => {}
            Fate::Close(s) => {
                if !self.sides[s].app_closed && !self.sides[s].freed {
                    // CLIENT KILL from another client's command, or the client process
                    // exiting: not inside one of this connection's handlers.
                    self.close(s);
                }
            }
            Fate::LinkDown => self.link_down(),
            Fate::Hostile(s, f) => {
                if !self.link_gone {
                    self.sides[1 - s].d.nic.out.push_back(Wire::Forged(f));
                }
            }
            Fate::PostFails(s) => self.sides[s].d.nic.fail_next_post = true,
        }
    }

    fn produce(&mut self, s: usize) {
        let side = &mut self.sides[s];
        if side.freed || side.app_closed || side.produced >= side.budget {
            return;
        }
        let left = side.budget - side.produced;
        let piece = self.rng.range(1, 3 * u64::from(self.sides[1 - s].d.nic.rx.len));
        let n = self.rng.range(1, left.min(piece));
        self.add_output(s, n);
    }

    /// New output (a reply, a pipeline of commands): written in beforeSleep, or by the
    /// write handler.
    fn add_output(&mut self, s: usize, n: u64) {
        let side = &mut self.sides[s];
        side.produced += n;
        if side.io_owned.is_some() || side.d.core.has_write_handler() {
            return;
        }
        if self.rng.one_in(2) {
            side.pending_writes = true;
        } else {
            let barrier = self.rng.one_in(4);
            self.set_write_handler(s, true, barrier);
        }
    }

    fn io_begin(&mut self, s: usize) {
        let side = &mut self.sides[s];
        if side.freed || side.app_closed || side.io_owned.is_some() {
            return;
        }
        let mask = [Postpone::READ, Postpone::WRITE, Postpone::BOTH][self.rng.below(3) as usize];
        side.io_owned = Some(mask);
        side.d.core.postpone(mask);
        self.log(|| format!("{} io thread takes the client, {mask:?}", NAME[s]));
    }

    fn io_work(&mut self, s: usize) {
        let Some(mask) = self.sides[s].io_owned else { return };
        if self.sides[s].freed || self.sides[s].close_asap {
            return;
        }
        self.sides[s].io_touched = true;
        if mask.read() {
            self.app_read(s, false);
        }
        if mask.write() && !self.sides[s].close_asap {
            self.app_write(s, false);
        }
    }

    fn io_end(&mut self, s: usize) {
        let Some(_) = self.sides[s].io_owned.take() else { return };
        self.sides[s].io_touched = false;
        if self.sides[s].freed {
            return;
        }
        // processClientIOReadsDone / processClientIOWriteDone: mask, then update_state.
        let d = &mut self.sides[s].d;
        d.core.postpone(Postpone::NONE);
        if d.core.update_state(d.nic.sq_room()) {
            self.sides[s].pending = true;
        }
        let side = &self.sides[s];
        if side.sent < side.produced && !side.d.core.has_write_handler() && !side.app_closed {
            self.sides[s].pending_writes = true;
        } else if side.sent == side.produced && side.d.core.has_write_handler() && !side.app_closed {
            self.set_write_handler(s, false, false); // the IO thread wrote it all
        }
        self.log(|| format!("{} io thread done", NAME[s]));
    }

    fn toggle_protect(&mut self, s: usize) {
        let side = &mut self.sides[s];
        if side.freed || side.app_closed {
            return;
        }
        if side.protected {
            side.protected = false;
            self.set_read_handler(s, true);
        } else if side.d.core.has_read_handler() {
            side.protected = true;
            self.set_read_handler(s, false);
        }
    }

    fn toggle_barrier(&mut self, s: usize) {
        let side = &self.sides[s];
        if side.freed || side.app_closed || !side.d.core.has_write_handler() {
            return;
        }
        let barrier = !side.d.core.write_barrier();
        self.set_write_handler(s, true, barrier);
    }

    fn keepalive_tick(&mut self) {
        for s in [SERVER, CLIENT] {
            if self.sides[s].freed {
                continue;
            }
            // (the fake NIC acknowledges everything: no silent peer here; a side may
            // or may not have written since the last tick)
            let at = TickFacts {
                unacknowledged_ticks: 0,
                busy_and_acknowledged: self.rng.one_in(2),
                nothing_in_flight: self.rng.one_in(2),
                quiet_turn: self.rng.one_in(2),
            };
            let live = self.is_live(s);
            let failed = self.sides[s].d.keepalive(at);
            self.after_post(s, live, failed.as_ref());
            self.queue_if_due(s);
        }
    }

    fn ask_features(&mut self) {
        let c = &mut self.sides[CLIENT];
        if c.freed || c.app_closed || *c.d.core.state() != State::Established {
            return;
        }
        let msg = if self.rng.one_in(2) {
            c.features_asked += 1;
            ControlMessage::GetServerFeature { select_raw: [1, 2], features: 0 }
        } else {
            ControlMessage::SetClientFeature { select_raw: [0, 0], features: self.rng.below(3) }
        };
        c.d.core.send_control(msg);
        self.flush_control(CLIENT);
        self.queue_if_due(CLIENT);
    }

    // ----- the driver --------------------------------------------------------------

    fn set_read_handler(&mut self, s: usize, installed: bool) {
        self.log(|| format!("{} read handler {}", NAME[s], if installed { "installed" } else { "removed" }));
        self.sides[s].d.core.set_read_handler(installed);
        self.queue_if_due(s);
    }

    fn set_write_handler(&mut self, s: usize, installed: bool, barrier: bool) {
        self.log(|| {
            let what = if installed { "installed" } else { "removed" };
            format!("{} write handler {what}{}", NAME[s], if barrier { " with a barrier" } else { "" })
        });
        self.sides[s].d.core.set_write_handler(installed, barrier);
        self.queue_if_due(s);
    }

    /// `queue_if_due`, after an input made outside a run.
    fn queue_if_due(&mut self, s: usize) {
        let side = &mut self.sides[s];
        if !side.freed && !side.in_run && side.d.wants_pending() {
            side.pending = true;
        }
    }

    /// Whether a failure now would be news (the connection is not over yet).
    fn is_live(&self, s: usize) -> bool {
        matches!(self.sides[s].d.core.state(), State::Accepting | State::Established)
    }

    /// Posts what the core queued (`Driver::flush_control`).
    fn flush_control(&mut self, s: usize) {
        let live = self.is_live(s);
        let r = self.sides[s].d.flush_control();
        self.after_post(s, live, r.err().as_ref());
    }

    /// After the driver posted: a post the fake NIC failed fails the connection exactly
    /// when it was live.
    fn after_post(&mut self, s: usize, live_before: bool, failed: Option<&Failure>) {
        if !std::mem::take(&mut self.sides[s].d.nic.post_failed) {
            return;
        }
        if failed.is_some() != live_before {
            fail!(self, "{}: post failure: got {failed:?}, expected a failure: {live_before}", NAME[s]);
        }
        self.log(|| format!("{}: post failed", NAME[s]));
    }

    /// What the core must answer to a completion: `Some(failure)` or `None` (accepted,
    /// or ignored because the connection already ended).
    fn expected(&self, s: usize, forged: Option<Forged>, flush: bool) -> Option<Failure> {
        let side = &self.sides[s];
        let state = side.d.core.state();
        if matches!(state, State::Failed(_) | State::Closed) {
            return None;
        }
        let live = matches!(state, State::Accepting | State::Established);
        let p = |v| Some(Failure::Protocol(v));
        match forged {
            None if flush => live.then_some(Failure::WorkRequest { status: 0, vendor_err: 0 }),
            None => None,
            Some(Forged::ShortSend(n)) => p(Violation::BadControlLength(n as u32)),
            Some(Forged::UnknownOpcode(op)) => p(Violation::UnknownOpcode(op)),
            Some(Forged::BadRegisterLength(n)) => p(Violation::BadRegisterLength(n)),
            Some(Forged::SetClientFeatureToClient) => p(Violation::UnexpectedOpcode(Opcode::SetClientFeature)),
            Some(Forged::Overrun(imm)) => {
                p(Violation::RxOverrun { offset: side.d.core.rx().readable().end as u32, imm, len: side.d.nic.rx.len })
            }
            Some(Forged::TooLongSend) => live.then_some(Failure::WorkRequest { status: LOC_LEN_ERR, vendor_err: 0x6b }),
        }
    }

    fn check_failure(&self, s: usize, what: &str, got: Result<(), Failure>, want: Option<Failure>) {
        let ok = match (&got, &want) {
            (Ok(()), None) => true,
            // a flush's status is whatever the NIC said: only the kind is predicted
            (Err(Failure::WorkRequest { .. }), Some(Failure::WorkRequest { status: 0, .. })) => true,
            (Err(g), Some(w)) => g == w,
            _ => false,
        };
        if !ok {
            fail!(self, "{}: {what}: the core answered {got:?}, expected {want:?}", NAME[s]);
        }
        if let Err(f) = got {
            match f {
                Failure::Protocol(_) => stat(|x| &x.violations),
                Failure::WorkRequest { .. } => stat(|x| &x.work_request_failures),
                Failure::Local { .. } | Failure::PeerSilent { .. } | Failure::HandshakeTimeout { .. } => {}
            }
            self.log(|| format!("{} failed: {f}", NAME[s]));
        }
    }

    /// Polls up to `budget` completions of the fake CQ and hands each to the driver,
    /// checking what the core answered; then the driver posts what they queued
    /// (`process_completions`).
    fn drain_cq(&mut self, s: usize, budget: usize) {
        self.sides[s].d.nic.cq_notified = false;
        for _ in 0..budget {
            let Some(c) = self.sides[s].d.nic.cq.pop_front() else { break };
            match c {
                Cqe::SendDone(wr) => self.sides[s].d.nic.free_sq(wr),
                Cqe::Control(bytes, forged) => {
                    let want = self.expected(s, forged, false);
                    let mut slot = [0u8; CONTROL_MESSAGE_LEN];
                    let n = bytes.len().min(CONTROL_MESSAGE_LEN);
                    slot[..n].copy_from_slice(&bytes[..n]);
                    let r = self.sides[s].d.on_completion(Completion::Control { bytes: slot, len: bytes.len() as u32 });
                    match r {
                        Ok(Received::Keepalive) => self.sides[s].keepalives += 1,
                        Ok(Received::ServerFeatures(f)) => {
                            if f != 0 || s != CLIENT {
                                fail!(self, "{}: features {f} received", NAME[s]);
                            }
                            self.sides[s].features_answered += 1;
                        }
                        _ => {}
                    }
                    self.check_failure(s, &format!("control {forged:?}"), r.map(|_| ()), want);
                }
                Cqe::Data(imm, forged) => {
                    let want = self.expected(s, forged, false);
                    let r = self.sides[s].d.on_completion(Completion::Data { imm }).map(|_| ());
                    self.check_failure(s, &format!("data imm {imm} {forged:?}"), r, want);
                }
                Cqe::Failed { wr, status, forged } => {
                    if let Some(wr) = wr {
                        self.sides[s].d.nic.free_sq(wr);
                    }
                    if forged.is_none() && !self.sides[s].d.nic.link_down {
                        fail!(self, "{}: a work request failed on a healthy link", NAME[s]);
                    }
                    let want = self.expected(s, forged, forged.is_none());
                    let vendor_err = if forged.is_some() { 0x6b } else { 0 };
                    let r = self.sides[s].d.on_completion(Completion::Failed { status, vendor_err }).map(|_| ());
                    self.check_failure(s, &format!("failed work request {status} {forged:?}"), r, want);
                }
            }
        }
        let left = !self.sides[s].d.nic.cq.is_empty();
        self.sides[s].d.core.set_completions_left(left);
        self.flush_control(s);
    }

    /// One run of the handlers: the production `driver::run`, with the simulated
    /// application as the server's handlers.
    fn run_handlers(&mut self, s: usize) {
        if self.sides[s].freed {
            return;
        }
        self.sides[s].in_run = true;
        let end = driver::run(&mut SimHost { sim: self, s });
        self.sides[s].in_run = false;
        match end {
            RunEnd::Done { pending } => {
                self.log(|| format!("{} run done, pending {pending}", NAME[s]));
                if pending {
                    self.sides[s].pending = true;
                    if self.sides[s].d.core.completions_left() {
                        stat(|x| &x.backlog_turns);
                    } else if *self.sides[s].d.core.state() == State::Established {
                        stat(|x| &x.write_reruns);
                    }
                }
            }
            RunEnd::FreeNow => {
                stat(|x| &x.scheduled_frees);
                self.free(s);
            }
            RunEnd::ClosedInside => fail!(self, "{}: nested handler reported", NAME[s]),
        }
    }

    /// `ct->close` from the application.
    fn close(&mut self, s: usize) {
        let out = self.sides[s].d.core.close();
        let side = &mut self.sides[s];
        side.app_closed = true;
        if out.unregister {
            side.unregisters += 1;
            side.pending = false;
        }
        if side.unregisters != 1 {
            fail!(self, "{}: close unregistered {} times", NAME[s], side.unregisters);
        }
        self.log(|| format!("{} closes ({out:?})", NAME[s]));
        if out.free_now {
            self.free(s);
        }
    }

    /// Teardown: the verbs resources go, the peer is disconnected.
    fn free(&mut self, s: usize) {
        let side = &mut self.sides[s];
        side.frees += 1;
        if side.frees != 1 || !side.app_closed {
            fail!(self, "{}: freed {} times (closed: {})", NAME[s], side.frees, side.app_closed);
        }
        side.freed = true;
        side.pending = false;
        self.log(|| format!("{} freed", NAME[s]));
        self.leave(s);
    }

    fn lose_in_flight(&mut self, from: usize) {
        let keep = self.rng.below(self.sides[from].d.nic.out.len() as u64 + 1) as usize;
        for _ in 0..keep {
            let op = self.sides[from].d.nic.out.pop_front().unwrap();
            self.land(from, op);
        }
        let lost: Vec<Wire> = self.sides[from].d.nic.out.drain(..).collect();
        let errors_early = self.rng.one_in(8);
        let statuses: Vec<u32> =
            lost.iter().map(|_| if self.rng.one_in(2) { RETRY_EXC_ERR } else { WR_FLUSH_ERR }).collect();
        let side = &mut self.sides[from];
        if side.freed {
            return;
        }
        let nic = &mut side.d.nic;
        nic.link_down = true;
        nic.errors_early = errors_early;
        for (op, status) in lost.into_iter().zip(statuses) {
            let wr = match op {
                Wire::Write { wr, .. } | Wire::Send { wr, .. } => Some(wr),
                Wire::Forged(_) => continue,
            };
            let e = Cqe::Failed { wr, status, forged: None };
            if nic.errors_early {
                nic.complete(e);
            } else {
                nic.deferred.push(e);
            }
        }
    }

    /// Side `s` disconnected (its connection was freed): what it had in flight lands
    /// or is lost; the peer gets DISCONNECTED.
    fn leave(&mut self, s: usize) {
        if self.link_gone {
            self.sides.iter_mut().for_each(|x| x.d.nic.out.clear());
            return;
        }
        self.link_gone = true;
        self.lose_in_flight(s);
        self.lose_in_flight(1 - s);
        self.sides[1 - s].cm.push_back(Cm::Disconnected);
    }

    /// Both sides see DISCONNECTED (ct->shutdown, a cable, DEVICE_REMOVAL).
    fn link_down(&mut self) {
        if self.link_gone {
            return;
        }
        self.link_gone = true;
        for s in [SERVER, CLIENT] {
            self.lose_in_flight(s);
        }
        for s in [SERVER, CLIENT] {
            if !self.sides[s].freed {
                self.sides[s].cm.push_back(Cm::Disconnected);
            }
        }
    }

    // ----- the NIC -----------------------------------------------------------------

    fn deliver(&mut self, from: usize, k: usize) {
        for _ in 0..k {
            let Some(op) = self.sides[from].d.nic.out.pop_front() else { return };
            self.land(from, op);
        }
    }

    fn land(&mut self, from: usize, op: Wire) {
        let to = 1 - from;
        match op {
            Wire::Write { wr, signaled, offset, addr, rkey, bytes } => {
                let freed = self.sides[to].freed;
                let r = &mut self.sides[to].d.nic;
                if !freed {
                    let n = bytes.len() as u32;
                    if addr != r.rx.addr || rkey != r.rx.key {
                        fail!(self, "{} wrote to addr {addr:#x} rkey {rkey}", NAME[from]);
                    }
                    if offset != r.landed_end || u64::from(offset) + u64::from(n) > u64::from(r.rx.len) {
                        fail!(
                            self,
                            "{} wrote {n} bytes at offset {offset}, outside {}'s window (next byte {}, buffer {})",
                            NAME[from],
                            NAME[to],
                            r.landed_end,
                            r.rx.len
                        );
                    }
                    r.rx_buf[offset as usize..(offset + n) as usize].copy_from_slice(&bytes);
                    r.landed_end += n;
                    r.landed += u64::from(n);
                    r.complete(Cqe::Data(n, None));
                }
                if signaled && !self.sides[from].freed {
                    self.sides[from].d.nic.complete(Cqe::SendDone(wr));
                }
            }
            Wire::Send { wr, bytes } => {
                if !self.sides[to].freed {
                    self.sides[to].d.nic.complete(Cqe::Control(bytes.to_vec(), None));
                }
                if !self.sides[from].freed {
                    self.sides[from].d.nic.complete(Cqe::SendDone(wr));
                }
            }
            Wire::Forged(f) => {
                let f_ = Some(f);
                let c = match f {
                    Forged::ShortSend(n) => Cqe::Control(vec![0; n], f_),
                    Forged::UnknownOpcode(op) => {
                        let mut b = vec![0; CONTROL_MESSAGE_LEN];
                        b[0..2].copy_from_slice(&op.to_be_bytes());
                        Cqe::Control(b, f_)
                    }
                    Forged::BadRegisterLength(length) => Cqe::Control(
                        ControlMessage::RegisterXferMemory { addr: 1, length, key: 1 }.encode().to_vec(),
                        f_,
                    ),
                    Forged::SetClientFeatureToClient => Cqe::Control(
                        ControlMessage::SetClientFeature { select_raw: [0, 0], features: 0 }.encode().to_vec(),
                        f_,
                    ),
                    Forged::Overrun(imm) => Cqe::Data(imm, f_),
                    Forged::TooLongSend => Cqe::Failed { wr: None, status: LOC_LEN_ERR, forged: f_ },
                };
                if !self.sides[to].freed {
                    self.log(|| format!("{} receives forged {f:?}", NAME[to]));
                    self.sides[to].d.nic.complete(c);
                }
            }
        }
    }

    // ----- the application ---------------------------------------------------------

    /// `readQueryFromClient` (main thread, `in_handler`) or an IO thread's read, through
    /// the driver's read (copy out, RX swap, hand-back).
    fn app_read(&mut self, s: usize, in_handler: bool) {
        if self.sides[s].close_asap {
            return; // a client about to be freed is not read any more
        }
        let max = self.rng.range(1, self.sides[s].max_read as u64) as usize;
        let mut buf = vec![0u8; max];
        let live = self.is_live(s);
        let (r, failed) = self.sides[s].d.read(&mut buf);
        self.after_post(s, live, failed.as_ref());
        match r {
            Ok(n) => {
                let side = &self.sides[s];
                let got = &buf[..n];
                let mut same = true;
                stream_chunks(1 - s, side.received, n, |at, want| {
                    same &= got[at..at + want.len()] == *want;
                });
                if !same {
                    fail!(
                        self,
                        "{}: bytes {}..{} of the stream are wrong",
                        NAME[s],
                        side.received,
                        side.received + n as u64
                    );
                }
                self.sides[s].received += n as u64;
                if in_handler && self.rng.one_in(3) {
                    // a command, answered with a reply
                    let side = &self.sides[s];
                    let left = side.budget.saturating_sub(side.produced);
                    if left > 0 && !side.app_closed {
                        let piece = self.rng.range(1, 2 * side.write_cap as u64);
                        let n = self.rng.range(1, left.min(piece));
                        self.add_output(s, n);
                    }
                }
            }
            Err(ReadError::WouldBlock) => {}
            Err(ReadError::Eof) => {
                let side = &mut self.sides[s];
                if side.received != side.d.nic.landed {
                    fail!(
                        self,
                        "{}: EOF after reading {} of the {} bytes that arrived before the disconnect",
                        NAME[s],
                        side.received,
                        side.d.nic.landed
                    );
                }
                side.got_eof = true;
                stat(|x| &x.eofs);
                self.log(|| format!("{} reads EOF", NAME[s]));
                self.app_error(s, in_handler);
            }
            Err(ReadError::Failed(f)) => {
                self.log(|| format!("{} read fails: {f}", NAME[s]));
                self.app_error(s, in_handler);
            }
            Err(ReadError::Closed) => fail!(self, "{}: read after close", NAME[s]),
        }
    }

    /// `freeClient` inside the handler, or `freeClientAsync`.
    fn app_error(&mut self, s: usize, in_handler: bool) {
        if in_handler && self.rng.one_in(2) {
            self.close(s);
        } else {
            stat(|x| &x.async_closes);
            self.sides[s].close_asap = true;
        }
    }

    /// `writeToClient`: pieces of random size, at most `write_cap` bytes per call, each
    /// through the driver's write (in up to three parts, as `writev`); the handler is
    /// removed when everything is written.
    fn app_write(&mut self, s: usize, in_handler: bool) {
        let mut this_call = 0usize;
        loop {
            let side = &self.sides[s];
            if side.close_asap || side.app_closed {
                return;
            }
            let left = side.produced - side.sent;
            if left == 0 {
                self.sides[s].pending_writes = false;
                if self.sides[s].d.core.has_write_handler() && (in_handler || self.sides[s].io_owned.is_none()) {
                    self.set_write_handler(s, false, false);
                }
                return;
            }
            if this_call >= side.write_cap {
                break;
            }
            let want = (left as usize).min(side.write_cap - this_call);
            let want = self.rng.range(1, want as u64) as usize;
            let mut bytes = vec![0u8; want];
            stream_chunks(s, side.sent, want, |o, src| bytes[o..o + src.len()].copy_from_slice(src));
            let a = self.rng.range(0, want as u64) as usize;
            let b = self.rng.range(a as u64, want as u64) as usize;
            let live = self.is_live(s);
            let (r, failed) = self.sides[s].d.write(&[&bytes[..a], &bytes[a..b], &bytes[b..]]);
            self.after_post(s, live, failed.as_ref());
            match r {
                Ok(g) => {
                    self.sides[s].sent += u64::from(g.len);
                    this_call += g.len as usize;
                }
                Err(WriteError::WouldBlock(why)) => {
                    match why {
                        Blocked::WindowExhausted => stat(|x| &x.window_waits),
                        Blocked::SendQueueFull => stat(|x| &x.send_queue_waits),
                        _ => {}
                    }
                    break;
                }
                Err(e) => {
                    self.log(|| format!("{} write fails: {e:?}", NAME[s]));
                    self.app_error(s, in_handler);
                    return;
                }
            }
        }
        // not everything written: the write handler finishes it (installClientWriteHandler)
        let side = &self.sides[s];
        if !in_handler && side.io_owned.is_none() && !side.d.core.has_write_handler() {
            let barrier = self.rng.one_in(4);
            self.set_write_handler(s, true, barrier);
        }
        self.sides[s].pending_writes = false;
    }

    // ----- the event loop ----------------------------------------------------------

    fn iterate_both(&mut self) {
        let first = self.rng.below(2) as usize;
        self.iterate(first);
        self.iterate(1 - first);
    }

    /// One event-loop iteration of side `s`, with the liveness check.
    fn iterate(&mut self, s: usize) {
        if self.sides[s].freed {
            return;
        }
        let due_at_start = self.sides[s].due();
        self.log(|| {
            let x = &self.sides[s];
            format!(
                "{} iteration: {:?}, unread {:?}, due {due_at_start:?}, pending {}, postponed {:?}, close_asap {}",
                NAME[s],
                x.d.core.state(),
                x.d.core.rx().readable(),
                x.pending,
                x.d.core.postponed(),
                x.close_asap
            )
        });
        self.sides[s].called = [false; 2];
        let cm_first = self.rng.one_in(2);
        for phase in 0..2 {
            if (phase == 0) == cm_first {
                self.cm_events(s);
            } else if self.sides[s].d.nic.cq_notified && !self.sides[s].freed {
                // the completion channel fd: a budget of completions, then the handlers
                let budget = self.sides[s].d.nic.cq_budget;
                self.drain_cq(s, budget);
                self.run_handlers(s);
            }
        }
        // A handler may stop being due meanwhile (the peer left: the write handler waits
        // until the unread bytes are read): the check below asks for "due throughout".
        let due_after_events = self.sides[s].due();
        // beforeSleep: process_pending_data, then the application's own work
        if self.sides[s].pending && !self.sides[s].freed {
            // `run_pending`: the completions the last poll left, then the handlers
            self.sides[s].pending = false;
            if self.sides[s].d.core.completions_left() {
                let budget = self.sides[s].d.nic.cq_budget;
                self.drain_cq(s, budget);
            }
            self.run_handlers(s);
        }
        let side = &self.sides[s];
        if side.pending_writes && !side.freed && !side.app_closed && side.io_owned.is_none() {
            self.app_write(s, false);
        }
        let side = &self.sides[s];
        if side.close_asap && !side.app_closed && side.io_owned.is_none() {
            self.close(s);
        }
        let due_now = self.sides[s].due();
        for h in [Handler::Read, Handler::Write] {
            let i = h as usize;
            if due_at_start[i] {
                stat(|x| &x.liveness_checks);
            }
            if due_at_start[i] && due_after_events[i] && due_now[i] && !self.sides[s].called[i] {
                let side = &self.sides[s];
                fail!(
                    self,
                    "{}: {h:?} handler installed and due for a whole loop iteration but not run \
                     (state {:?}, unread {:?}, window left {}, send queue room {}, pending {})",
                    NAME[s],
                    side.d.core.state(),
                    side.d.core.rx().readable(),
                    side.d.core.tx().available(),
                    side.d.nic.sq_room(),
                    side.pending
                );
            }
        }
    }

    /// The CM event channel (`on_cm_events`): the event, then `queue_if_due`.
    fn cm_events(&mut self, s: usize) {
        while let Some(e) = self.sides[s].cm.pop_front() {
            if self.sides[s].freed {
                return;
            }
            self.log(|| format!("{} CM {e:?}", NAME[s]));
            match e {
                Cm::Established => {
                    let live = self.is_live(s);
                    let failed = self.sides[s].d.on_established();
                    self.after_post(s, live, failed.as_ref());
                }
                Cm::Disconnected => {
                    let side = &mut self.sides[s];
                    side.d.core.on_disconnected();
                    let deferred: Vec<Cqe> = side.d.nic.deferred.drain(..).collect();
                    side.d.nic.cq.extend(deferred);
                    // the last look: everything the peer sent before leaving
                    self.drain_cq(s, usize::MAX);
                    let side = &self.sides[s];
                    if *side.d.core.state() == State::PeerClosed && side.d.core.rx().has_unread() {
                        stat(|x| &x.disconnects_with_unread);
                    }
                }
            }
            self.flush_control(s);
            self.queue_if_due(s);
        }
    }

    // ----- the end -----------------------------------------------------------------

    fn quiet(&self) -> bool {
        if self.sides.iter().any(|x| !x.d.nic.out.is_empty()) {
            return false;
        }
        (0..2).all(|s| {
            let side = &self.sides[s];
            side.freed
                || (side.d.nic.cq.is_empty()
                    && side.cm.is_empty()
                    && !side.pending
                    && side.sent == side.produced
                    && self.sides[1 - s].received == side.produced)
        })
    }

    fn quiesce(&mut self) {
        self.log(|| "quiesce".into());
        for s in [SERVER, CLIENT] {
            self.io_end(s);
            if self.sides[s].protected && !self.sides[s].freed {
                self.sides[s].protected = false;
                self.set_read_handler(s, true);
            }
        }
        if !self.fate_done {
            self.fate_done = true;
            self.apply_fate();
        }
        for _ in 0..50_000 {
            if self.quiet() {
                return;
            }
            self.step += 1;
            self.deliver(SERVER, usize::MAX);
            self.deliver(CLIENT, usize::MAX);
            self.iterate_both();
        }
        let d = |s: usize| {
            let x = &self.sides[s];
            format!(
                "{}: state {:?}, freed {}, produced {}, sent {}, received {}, unread {:?}, window left {}, \
                 handlers r{} w{}, pending {}, cq {}",
                NAME[s],
                x.d.core.state(),
                x.freed,
                x.produced,
                x.sent,
                x.received,
                x.d.core.rx().readable(),
                x.d.core.tx().available(),
                x.d.core.has_read_handler(),
                x.d.core.has_write_handler(),
                x.pending,
                x.d.nic.cq.len()
            )
        };
        fail!(self, "no progress: {}; {}", d(SERVER), d(CLIENT));
    }

    fn final_checks(&self) {
        let [srv, cli] = &self.sides;
        stat(|x| &x.seeds);
        STATS.get_or_init(Stats::default).bytes.fetch_add(srv.received + cli.received, Ordering::Relaxed);
        if srv.freed != cli.freed {
            let alive = if srv.freed { CLIENT } else { SERVER };
            fail!(self, "{} never learnt that its peer left", NAME[alive]);
        }
        for (s, side) in self.sides.iter().enumerate() {
            if side.freed && (side.unregisters != 1 || side.frees != 1) {
                fail!(self, "{}: unregistered {} and freed {} times", NAME[s], side.unregisters, side.frees);
            }
        }
        if !srv.freed {
            // no disconnect, no failure: everything arrived, once, in order
            for s in [SERVER, CLIENT] {
                let (me, peer) = (&self.sides[s], &self.sides[1 - s]);
                if peer.received != me.produced || !matches!(me.d.core.state(), State::Established) {
                    fail!(self, "{}: {} bytes produced, {} read by the peer", NAME[s], me.produced, peer.received);
                }
            }
            if !matches!(self.fate, Fate::None | Fate::Close(_) | Fate::PostFails(_)) && !self.link_gone {
                // a hostile completion still in flight at the end is delivered: never here
                fail!(self, "fate {:?} left the connection alive", self.fate);
            }
            if cli.features_answered > cli.features_asked {
                fail!(self, "more feature answers than questions");
            }
        }
    }
}

/// The simulator's side of [`driver::run`]: the side's driver, and the simulated
/// application as the server's handlers.
struct SimHost<'a> {
    sim: &'a mut Sim,
    s: usize,
}

impl driver::Host for SimHost<'_> {
    type Nic = SimNic;
    fn with_driver<R>(&mut self, f: impl FnOnce(&mut Driver<SimNic>) -> R) -> R {
        f(&mut self.sim.sides[self.s].d)
    }
    fn call(&mut self, h: Handler) {
        let (sim, s) = (&mut *self.sim, self.s);
        if sim.sides[s].app_closed {
            fail!(sim, "{}: {h:?} handler called after close", NAME[s]);
        }
        let installed = match h {
            Handler::Read => sim.sides[s].d.core.has_read_handler(),
            Handler::Write => sim.sides[s].d.core.has_write_handler(),
        };
        if !installed {
            fail!(sim, "{}: {h:?} handler called while not installed", NAME[s]);
        }
        sim.sides[s].called[h as usize] = true;
        sim.log(|| format!("{} calls its {h:?} handler", NAME[s]));
        match h {
            Handler::Read => sim.app_read(s, true),
            Handler::Write => sim.app_write(s, true),
        }
    }
}

/// Runs one seed; `Err(message)` with the failure.
fn run_seed(seed: u64) -> Result<(), String> {
    run_seed_with(seed, Mutant::None)
}

/// Runs one seed with both sides' drivers making the mistake `mutant`.
fn run_seed_with(seed: u64, mutant: Mutant) -> Result<(), String> {
    std::panic::catch_unwind(|| {
        let mut sim = Sim::new(seed);
        sim.sides.iter_mut().for_each(|x| x.d.mutant = mutant);
        sim.run()
    })
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

/// Default seeds per `cargo test`: enough to hit every fate many times, within a few
/// seconds in a debug build.
const DEFAULT_SEEDS: u64 = if cfg!(debug_assertions) { 10_000 } else { 50_000 };

#[test]
fn simulated_server_and_client_keep_every_rule() {
    let seeds: Vec<u64> = match (env_u64("SIM_SEED"), env_u64("SIM_SEEDS")) {
        (Some(one), _) => vec![one],
        (None, n) => (0..n.unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let stop = AtomicBool::new(false);
    let failures = Mutex::new(Vec::<(u64, String)>::new());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (seeds, stop, failures) = (&seeds, &stop, &failures);
            scope.spawn(move || {
                for &seed in seeds.iter().skip(t).step_by(threads) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Err(msg) = run_seed(seed) {
                        stop.store(true, Ordering::Relaxed);
                        failures.lock().unwrap().push((seed, msg));
                    }
                }
            });
        }
    });
    if std::env::var_os("SIM_STATS").is_some() {
        let x = STATS.get_or_init(Stats::default);
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        println!(
            "seeds passed {}, bytes read {}, write-handler re-runs {}, completion-backlog turns {}, writes blocked: window {} / send queue {}, \
             re-registrations {}, RX buffers grown {}, disconnects with unread bytes {}, EOFs {}, violations {}, work request failures {}, \
             post failures {}, frees after a handler returned {}, asynchronous closes {}, liveness checks {}",
            g(&x.seeds),
            g(&x.bytes),
            g(&x.write_reruns),
            g(&x.backlog_turns),
            g(&x.window_waits),
            g(&x.send_queue_waits),
            g(&x.reregistrations),
            g(&x.rx_grown),
            g(&x.disconnects_with_unread),
            g(&x.eofs),
            g(&x.violations),
            g(&x.work_request_failures),
            g(&x.post_failures),
            g(&x.scheduled_frees),
            g(&x.async_closes),
            g(&x.liveness_checks)
        );
    }
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    if let Some((seed, msg)) = failures.first() {
        panic!(
            "simulator: seed {seed} failed: {msg}\nreplay: SIM_SEED={seed} SIM_TRACE=1 cargo test --lib \
             protocol::conn::sim -- --nocapture"
        );
    }
}

#[test]
fn replaying_a_seed_is_deterministic() {
    // The same seed makes the same choices: the PRNG is the only source of randomness.
    let trace = |seed| {
        let mut sim = Sim::new(seed);
        (0..64).map(|_| sim.rng.next()).chain([sim.sides[0].d.nic.rx.len as u64, sim.fate_step]).collect::<Vec<_>>()
    };
    assert_eq!(trace(42), trace(42));
    assert_ne!(trace(42), trace(43));
}

/// The simulator checks the production driver's order, not an order of its own: each
/// mistake below, made in `Driver::read`, fails a seed (which replays).
#[test]
fn a_misordered_driver_fails_a_seed() {
    for mutant in [Mutant::FlushBeforeCopy, Mutant::SwapBeforeCopy] {
        let failed = (0..DEFAULT_SEEDS).find_map(|seed| run_seed_with(seed, mutant).err().map(|msg| (seed, msg)));
        let Some((seed, msg)) = failed else { panic!("{mutant:?}: no seed of {DEFAULT_SEEDS} caught it") };
        println!("{mutant:?}: seed {seed} fails: {msg}");
        assert!(msg.contains("of the stream are wrong"), "{mutant:?}: seed {seed} failed otherwise: {msg}");
        assert_eq!(run_seed_with(seed, mutant).err(), Some(msg), "the failure replays");
        assert_eq!(run_seed(seed), Ok(()), "seed {seed} passes with the driver as it ships");
    }
}
