//! The server-side transport, in safe code: one [`RdmaConnection`] per client (a verbs
//! endpoint driven by the protocol core), the listeners, the live set and the pending
//! list. The server edge (`crate::server::conntype`) calls it through
//! [`Transport`]; nothing here touches a raw pointer.
//!
//! Following one request: the client's RDMA_WRITE_WITH_IMM lands in our RX buffer →
//! the completion channel fd of the CQ the connection shares becomes readable →
//! [`shared_cqs::on_fd`] polls it and hands each connection its completions
//! ([`connection::on_shared_completions`], `verbs::Endpoint::on_completion`), which feed
//! the core (`protocol::conn::Conn::on_data`)
//! → the core schedules the server's read handler (`Conn::next_step`), which calls
//! `read`, which copies from the RX buffer → when the buffer is full and consumed the
//! core queues a RegisterXferMemory back to the client. A reply goes the other way
//! through `write` into the TX buffer and out as RDMA_WRITE_WITH_IMM into the
//! client's RX buffer.

#![forbid(unsafe_code)]

pub(crate) mod connection;
pub(crate) mod handshakes;
pub(crate) mod knobs;
pub(crate) mod listener;
mod qp_table;
pub(crate) mod removal;
pub(crate) mod shared_cqs;
pub(crate) mod stats;
pub(crate) mod worker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_int;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::Instant;

use crate::config::Settings;
use crate::protocol::conn::Postpone;
use crate::protocol::keepalive;
use crate::server::abi::ConnListener;
use crate::server::api::InfoField;
use crate::server::{Hosted, Transport};
pub(crate) use connection::RdmaConnection;

/// A connection as the server and we share it.
pub(crate) type HostedConn = Hosted<RdmaConnection>;

/// Module-wide settings, fixed at load.
pub(crate) struct Global {
    pub(crate) settings: Settings,
    /// `max-new-connections-per-cycle`: CM events handled per listener wake-up.
    pub(crate) accepts_per_cycle: usize,
}

/// Everything the module keeps between the server's calls, in one owner. The server's
/// callbacks carry no context pointer (a connection's key at most), so this is the one
/// global they reach it by.
pub(crate) struct Module {
    /// Fixed at load (OnLoad), before the connection type is registered.
    global: OnceLock<Global>,
    /// Connections not yet closed ([`live`]).
    live: Mutex<Option<HashMap<usize, Arc<HostedConn>, AddressHash>>>,
    /// Connections whose handlers must run from `process_pending_data` ([`pending`]).
    pending: Mutex<Option<KeyedQueue<Arc<HostedConn>>>>,
    /// The per-connection log lines' rate ([`log_limited`]).
    log_limit: Mutex<LogLimit>,
    pub(crate) listeners: listener::Listeners,
    pub(crate) shared_cqs: Mutex<shared_cqs::Shared>,
    /// Connections in the handshake, per source and in all.
    pub(crate) handshakes: Mutex<Option<handshakes::Counts>>,
    /// What `INFO rdma` counts.
    pub(crate) stats: stats::Stats,
    pub(crate) workers: worker::Workers,
    /// Removed devices whose resources are being released.
    pub(crate) removals: removal::Removals,
    /// Firings of the module's timer so far ([`keepalive::Firing`]).
    timer_firings: AtomicU64,
}

pub(crate) static MODULE: Module = Module {
    global: OnceLock::new(),
    live: Mutex::new(None),
    pending: Mutex::new(None),
    log_limit: Mutex::new(LogLimit::new()),
    listeners: listener::Listeners::new(),
    shared_cqs: Mutex::new(shared_cqs::Shared::new()),
    handshakes: Mutex::new(None),
    stats: stats::Stats::new(),
    workers: worker::Workers::new(),
    removals: removal::Removals::new(),
    timer_firings: AtomicU64::new(0),
};

pub(crate) fn init_global(g: Global) {
    let _ = MODULE.global.set(g);
}

pub(crate) fn global() -> &'static Global {
    MODULE.global.get().expect("set in OnLoad before the connection type is registered")
}

/// The key the connections' CM channel is watched with (connection keys are
/// addresses, never 0; shared CQs have 1 and up, `shared_cqs`).
pub(crate) const CONN_EVENTS_KEY: usize = 0;
/// The context of a closed connection's id while it waits to be destroyed: no live
/// connection has this key (keys are addresses), so its CM events are dropped.
pub(crate) const NO_CONNECTION_KEY: usize = 0;

/// What to do when the module's pinned-memory ceiling refused a registration.
pub(crate) fn pinned_ceiling_hint() -> String {
    format!(
        "the module's pinned-memory ceiling of {} MiB is reached: raise it with the module argument max-pinned=, or lower rdma-rx-size or maxclients",
        crate::verbs::pinned::ceiling() >> 20
    )
}

/// Connection keys (addresses) and QP numbers come from this process and its device,
/// never from a peer: a hash that does not resist chosen keys is safe for them, and
/// costs a multiply where SipHash costs rounds. (The multiply-rotate of rustc's FxHash,
/// then the high half folded into the low: a table takes its bucket from the low bits,
/// and those of a product of aligned addresses are zeros.)
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
}

/// The hash of the maps keyed by connection key or QP number.
pub(crate) type AddressHash = BuildHasherDefault<AddressHasher>;

/// Connections not yet closed, by [`Hosted::key`] (what their fd callback and CM
/// events carry).
pub(crate) mod live {
    use super::*;

    pub(crate) fn insert(c: &Arc<HostedConn>) {
        MODULE.live.lock().get_or_insert_with(HashMap::default).insert(c.key(), c.clone());
    }
    pub(crate) fn remove(c: &HostedConn) {
        if let Some(m) = MODULE.live.lock().as_mut() {
            m.remove(&c.key());
        }
    }
    pub(crate) fn get(key: usize) -> Option<Arc<HostedConn>> {
        MODULE.live.lock().as_ref()?.get(&key).cloned()
    }
    /// Every live connection, under one lock.
    pub(crate) fn snapshot() -> Vec<Arc<HostedConn>> {
        MODULE.live.lock().as_ref().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
    /// The live connections the timer's `firing` ticks (docs/protocol.md §5), and how
    /// many are live in all, under one lock.
    pub(crate) fn ticked_at(firing: keepalive::Firing) -> (Vec<Arc<HostedConn>>, usize) {
        let g = MODULE.live.lock();
        let Some(m) = g.as_ref() else { return (Vec::new(), 0) };
        let ticked = m.iter().filter(|(&key, _)| keepalive::ticks_at(keepalive::place(key), firing));
        (ticked.map(|(_, c)| c.clone()).collect(), m.len())
    }
}

/// Connections whose handlers must run from `process_pending_data` (there is no fd
/// event to drive them: a closed peer, data left unread while postponed, a write
/// handler installed while the TX window is open, completions left by the budget).
pub(crate) mod pending {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How many are queued, as of the last change: `has_pending_data` asks at every
    /// turn of the event loop, without the lock.
    static QUEUED: AtomicUsize = AtomicUsize::new(0);

    fn with<T>(f: impl FnOnce(&mut KeyedQueue<Arc<HostedConn>>) -> T) -> T {
        let mut p = MODULE.pending.lock();
        let q = p.get_or_insert_with(KeyedQueue::default);
        let r = f(q);
        QUEUED.store(q.len(), Ordering::Relaxed);
        r
    }

    pub(crate) fn push(c: &Arc<HostedConn>) {
        with(|p| p.push(c.key(), c))
    }
    pub(crate) fn remove(c: &HostedConn) {
        with(|p| p.remove(c.key()))
    }
    pub(crate) fn pop() -> Option<Arc<HostedConn>> {
        with(KeyedQueue::pop)
    }
    pub(crate) fn len() -> usize {
        QUEUED.load(Ordering::Relaxed)
    }
}

/// A queue in order of arrival that holds each key at most once, with push, remove and
/// pop in O(1): thousands of clients leaving at once are each queued (their EOF) and
/// then closed. A removed key's entry stays in `order` until popped, then is skipped;
/// the item it holds (an `Arc` of the connection, whose address is the key) keeps the
/// key from naming anything else meanwhile.
pub(crate) struct KeyedQueue<T> {
    order: VecDeque<(usize, T)>,
    queued: HashSet<usize>,
}

impl<T> Default for KeyedQueue<T> {
    fn default() -> Self {
        KeyedQueue { order: VecDeque::new(), queued: HashSet::new() }
    }
}

impl<T: Clone> KeyedQueue<T> {
    fn push(&mut self, key: usize, item: &T) {
        if self.queued.insert(key) {
            self.order.push_back((key, item.clone()));
        }
    }
    fn remove(&mut self, key: usize) {
        if self.queued.remove(&key) && self.queued.is_empty() {
            self.order.clear();
        }
    }
    /// The first item still queued. An entry whose key is not queued was removed, or
    /// is the second entry of a key removed and queued again, which the first served.
    fn pop(&mut self) -> Option<T> {
        while let Some((key, item)) = self.order.pop_front() {
            if self.queued.remove(&key) {
                if self.queued.is_empty() {
                    self.order.clear();
                }
                return Some(item);
            }
        }
        None
    }
    fn len(&self) -> usize {
        self.queued.len()
    }
}

/// Per-connection errors are logged at most this many times per second; a hostile
/// client (or ten thousand failing at once) must not flood the server's log.
const CONN_LOG_LINES_PER_SEC: u32 = 10;

/// At most [`CONN_LOG_LINES_PER_SEC`] lines in each second (module-wide), so that a
/// hostile client cannot flood the server's log; the lines left out are counted and
/// reported by the next line written. Pure (the time is passed in).
pub(crate) struct LogLimit {
    second: Option<Instant>,
    lines: u32,
    suppressed: u64,
}

impl LogLimit {
    const fn new() -> Self {
        LogLimit { second: None, lines: 0, suppressed: 0 }
    }

    /// `Some(lines left out since the last one written)` when this line is to be
    /// written, `None` when it is left out.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self.second.is_none_or(|s| now.duration_since(s).as_secs() >= 1) {
            self.second = Some(now);
            self.lines = 0;
        }
        if self.lines >= CONN_LOG_LINES_PER_SEC {
            self.suppressed += 1;
            return None;
        }
        self.lines += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Logs a per-connection warning, rate-limited ([`LogLimit`]).
pub(crate) fn log_limited(msg: std::fmt::Arguments) {
    log_limited_at(log::Level::Warn, msg)
}

/// Logs a per-connection line at `level`, rate-limited ([`LogLimit`]) with the warnings;
/// a level the server's `loglevel` drops takes nothing from the limit.
pub(crate) fn log_limited_at(level: log::Level, msg: std::fmt::Arguments) {
    if level > log::max_level() {
        return;
    }
    let admitted = MODULE.log_limit.lock().admit(Instant::now());
    match admitted {
        None => {}
        Some(0) => log::log!(level, "{msg}"),
        Some(n) => log::log!(level, "{msg} ({n} similar lines suppressed)"),
    }
}

impl Transport for RdmaConnection {
    fn listen(l: &mut ConnListener) -> bool {
        listener::listen(l)
    }
    fn close_listener(l: &mut ConnListener) {
        listener::close_listener(l)
    }
    fn on_listener_fd(fd: c_int) {
        listener::on_listener_events(fd)
    }
    fn on_watched_fd(key: usize) {
        if key == CONN_EVENTS_KEY {
            listener::on_conn_events();
        } else if let Some(channel) = shared_cqs::channel_of_key(key) {
            shared_cqs::on_fd(channel, &mut connection::ToConnections);
        } else if let Some(c) = live::get(key) {
            connection::on_completion_fd(&c);
        }
    }
    fn on_timer() -> bool {
        let firing = keepalive::Firing(MODULE.timer_firings.fetch_add(1, Ordering::Relaxed));
        let (ticked, live) = live::ticked_at(firing);
        let stride = keepalive::quiet_stride(live);
        for c in ticked {
            let quiet_turn = keepalive::quiet_turn(keepalive::place(c.key()), firing.period(), stride);
            connection::keepalive(&c, quiet_turn);
            connection::queue_if_due(&c);
        }
        if firing.starts_period() {
            for (device, name) in removal::unannounced() {
                listener::device_unlisted(device);
                removal::device_removed(device, &name);
            }
            removal::release_finished();
            listener::listen_again();
        }
        firing.starts_period()
    }
    fn addrs(c: &HostedConn) -> (Option<SocketAddr>, Option<SocketAddr>) {
        (c.inner.peer, c.inner.local)
    }
    fn shutdown(c: &HostedConn) {
        c.inner.disconnect()
    }
    fn close(c: &Arc<HostedConn>) {
        connection::close(c);
        removal::release_finished();
    }
    fn accept(c: &Arc<HostedConn>) -> bool {
        connection::accept(c)
    }
    #[inline]
    fn read(c: &HostedConn, buf: &mut [u8]) -> Option<usize> {
        connection::read(c, buf)
    }
    #[inline(always)]
    fn write(c: &HostedConn, parts: &[&[u8]]) -> Option<usize> {
        connection::write(c, parts)
    }
    fn handlers_changed(c: &Arc<HostedConn>, read: bool, write: bool, barrier: bool) {
        connection::set_handlers(c, read, write, barrier)
    }
    fn has_pending() -> bool {
        pending::len() > 0 || shared_cqs::any_left()
    }
    /// Shared CQs the budget left completions on are polled again; then each queued
    /// connection runs at most once per call (one queued again by its own handler waits
    /// for the next call).
    #[inline(always)]
    fn process_pending() -> usize {
        // (called at every turn of the event loop, which usually has nothing pending: the
        // loop's stack frame only when it runs)
        if Self::has_pending() {
            process_pending_now()
        } else {
            0
        }
    }
    fn postpone(c: &HostedConn, mask: Postpone) {
        connection::postpone(c, mask)
    }
    fn update_state(c: &Arc<HostedConn>) {
        connection::queue_if_due(c)
    }
    fn info() -> Vec<InfoField> {
        let live = live::snapshot();
        let mut pinned = 0;
        let mut traffic = stats::Traffic::default();
        let mut windows: Option<(u64, u64)> = None;
        let mut rx_windows: Option<(u64, u64)> = None;
        let span = |acc: Option<(u64, u64)>, w: u64| Some(acc.map_or((w, w), |(lo, hi)| (lo.min(w), hi.max(w))));
        for c in &live {
            let f = connection::footprint(c);
            pinned += f.pinned_bytes;
            traffic.add(&f.traffic);
            if f.peer_window > 0 {
                windows = span(windows, f.peer_window);
            }
            rx_windows = span(rx_windows, f.rx_window);
        }
        stats::fields(&stats::Now {
            listeners: listener::listening_count(),
            connected: live.len() as u64,
            pending: pending::len() as u64,
            pinned_bytes: pinned,
            rx_size: MODULE.global.get().map_or(0, |g| g.settings.rx_size.into()),
            peer_windows: windows,
            rx_windows,
            shared_cqs: shared_cqs::count() as u64,
            vectors: shared_cqs::vectors(),
            traffic,
            polls: shared_cqs::polls(),
        })
    }
}

/// [`Transport::process_pending`] when something is pending.
#[inline(never)]
fn process_pending_now() -> usize {
    let mut processed = shared_cqs::poll_left(&mut connection::ToConnections);
    for _ in 0..pending::len() {
        let Some(c) = pending::pop() else { break };
        connection::run_pending(&c);
        processed += 1;
    }
    processed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits_where_a_table_takes_its_bucket() {
        // 4096 connection keys 64 bytes apart: without the final fold the low 6 bits of
        // every hash would be zero, and a table would use one bucket in 64.
        use std::hash::BuildHasher;
        let buckets: HashSet<u64> = (0..4096u64)
            .map(|i| AddressHash::default().hash_one(0x7f00_0000_0000usize + i as usize * 64) & 0xfff)
            .collect();
        assert!(buckets.len() > 2000, "addresses: {} of 4096 buckets", buckets.len());
        let qps: HashSet<u64> = (0..4096u32).map(|qp| AddressHash::default().hash_one(qp) & 0xfff).collect();
        assert!(qps.len() > 2000, "qps: {} of 4096 buckets", qps.len());
    }

    #[test]
    fn the_pending_queue_serves_each_queued_key_once_in_order_of_arrival() {
        let mut q = KeyedQueue::<&str>::default();
        q.push(1, &"a");
        q.push(2, &"b");
        q.push(1, &"a"); // queued already: keeps its place
        q.push(3, &"c");
        q.remove(2);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some("a"));
        // removed, then queued again (two entries): served once
        q.push(1, &"a");
        q.remove(1);
        q.push(1, &"a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some("c"));
        assert_eq!(q.pop(), Some("a"));
        assert_eq!(q.len(), 0);
        assert_eq!(q.pop(), None, "the second entry of a key already served is skipped");
        assert_eq!(q.len(), 0);
        // the last key removed: the entries left behind are dropped with it
        q.push(4, &"d");
        q.remove(4);
        assert!(q.order.is_empty());
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn the_log_limit_writes_ten_lines_a_second_and_counts_the_rest() {
        let mut l = LogLimit::new();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let written: Vec<_> = (0..15).map(|i| l.admit(ms(i * 10))).collect();
        assert_eq!(written.iter().filter(|w| w.is_some()).count(), 10);
        assert!(written[..10].iter().all(|w| *w == Some(0)));
        assert!(written[10..].iter().all(|w| w.is_none()));
        assert_eq!(l.admit(ms(999)), None, "still the same second");
        assert_eq!(l.admit(ms(1000)), Some(6), "the next second's first line says how many were left out");
        assert_eq!(l.admit(ms(1001)), Some(0));
    }
}
