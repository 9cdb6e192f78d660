//! The server-side transport: one [`RdmaConnection`] per client, the listeners, and
//! the bookkeeping the server's event loop needs (pending list, keepalive timer).
//!
//! Threads: everything runs on the server's main thread except `read`, `write`,
//! `writev` and `postpone_update_state`, which 9.x also calls from IO threads. The
//! protocol state and verbs resources of a connection sit behind one mutex; server
//! callbacks are never invoked while it is held.
//!
//! Following one request: the client's RDMA_WRITE_WITH_IMM lands in our RX buffer →
//! the completion channel fd becomes readable → [`connection::on_completion_fd`] polls
//! the CQ (`verbs::Endpoint::poll`) and advances the RX window (`protocol::Session`) →
//! the server's read handler runs and calls `read` (`conntype::read`), which copies
//! from the RX buffer → when the buffer is full and consumed a RegisterXferMemory goes
//! back to the client. A reply goes the other way through `write` into the TX buffer
//! and out as RDMA_WRITE_WITH_IMM into the client's RX buffer.

pub mod connection;
pub mod conntype;
pub mod listener;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::config::Settings;
use crate::server::abi::Abi;
pub use connection::RdmaConnection;

/// Module-wide settings, fixed at load.
pub struct Global {
    pub abi: Abi,
    pub settings: Settings,
    /// `max-new-connections-per-cycle`: CM events handled per listener wake-up.
    pub accepts_per_cycle: usize,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

pub fn init_global(g: Global) {
    let _ = GLOBAL.set(g);
}

pub fn global() -> &'static Global {
    GLOBAL.get().expect("set in OnLoad before the connection type is registered")
}

/// A connection pointer as a set/list key. Only the main thread dereferences it, and
/// only while the connection is in [`LIVE`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ConnPtr(pub *mut RdmaConnection);
// SAFETY: the pointer is only a key here; see the type's doc for dereferencing.
unsafe impl Send for ConnPtr {}

/// Connections not yet closed.
static LIVE: Mutex<Option<HashSet<ConnPtr>>> = Mutex::new(None);
/// Connections whose handlers must run from `process_pending_data` (there is no fd
/// event to drive them: a closed peer, data left unread while postponed, a write
/// handler installed while the TX window is open). Entries are removed by `close`.
static PENDING: Mutex<VecDeque<ConnPtr>> = Mutex::new(VecDeque::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}

pub fn live_insert(c: ConnPtr) {
    lock(&LIVE).get_or_insert_with(HashSet::new).insert(c);
}
/// Returns whether it was live (false on the second `close` of a scheduled close).
pub fn live_remove(c: ConnPtr) -> bool {
    lock(&LIVE).as_mut().is_some_and(|s| s.remove(&c))
}
pub fn is_live(c: ConnPtr) -> bool {
    lock(&LIVE).as_ref().is_some_and(|s| s.contains(&c))
}
pub fn live_snapshot() -> Vec<ConnPtr> {
    lock(&LIVE).as_ref().map(|s| s.iter().copied().collect()).unwrap_or_default()
}

pub fn pending_push(c: ConnPtr) {
    let mut p = lock(&PENDING);
    if !p.contains(&c) {
        p.push_back(c);
    }
}
pub fn pending_remove(c: ConnPtr) {
    lock(&PENDING).retain(|&x| x != c);
}
pub fn pending_pop() -> Option<ConnPtr> {
    lock(&PENDING).pop_front()
}
pub fn pending_len() -> usize {
    lock(&PENDING).len()
}

/// Set in a fork child (BGSAVE, AOF rewrite): verbs objects are not usable there
/// (their memory is not inherited with `ibv_fork_init`), so every call refuses.
static IN_FORK_CHILD: AtomicBool = AtomicBool::new(false);

pub fn in_fork_child() -> bool {
    IN_FORK_CHILD.load(Ordering::Relaxed)
}

extern "C" fn after_fork_in_child() {
    IN_FORK_CHILD.store(true, Ordering::Relaxed);
}

pub fn install_fork_guard() {
    // SAFETY: registers a handler that only stores an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
}
