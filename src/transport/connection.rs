//! One accepted RDMA client: the verbs endpoint and the protocol core ([`Conn`]) behind
//! one mutex, driven from the server's callbacks. This file only moves bytes and posts
//! work requests; every decision (state, windows, which handler runs when, what goes on
//! the pending list, when the connection is freed) is the core's (`protocol/conn.rs`).
//!
//! Threads: `read`, `write` and `postpone` may come from IO threads (9.x); everything
//! else runs on the main thread. Server handlers are never called with the lock held.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::knobs::{self, Knob};
use super::stats::{self, Traffic};
use super::worker::Slot;
use super::MODULE;
use super::{live, log_limited, pending, HostedConn};
use crate::protocol::conn::{
    AfterHandler, Conn, Failure, Handler, Postpone, Received, RxBuffer, ServerState, TickFacts, WriteGrant,
};
use crate::protocol::driver::{self, Driver, LocalError, Nic, RunEnd, TxBuffersHeld};
use crate::protocol::session::Role;
use crate::protocol::ControlMessage;
use crate::server::api::FdWatch;
use crate::server::{ConnState, ServerHandler};
use crate::verbs::{Completion, DeviceKey, Endpoint, PreparedRx, VerbsError, VerbsOp, WorkCompletion};

/// Completions handled per wake-up of a connection with a CQ of its own, so that a peer
/// sending Keepalives or empty writes as fast as it can cannot keep the main thread in
/// its drain (a shared CQ has its own budget, `shared_cqs::COMPLETIONS_PER_SHARED_POLL`).
pub(crate) const COMPLETIONS_PER_OWN_POLL: usize = 256;

/// The connection type's half of one client (the server's half is `Hosted`'s).
pub(crate) struct RdmaConnection {
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    /// (index, QP number) on the shared CQ its completions arrive on
    /// ([`super::shared_cqs`]); `None`: a CQ and channel fd of its own.
    pub(crate) shared_cq: Option<(usize, u32)>,
    /// The completion channel fd of a connection with a CQ of its own (watched with the
    /// connection's key); never the fd the server sees.
    pub(crate) own_channel_fd: Option<std::ffi::c_int>,
    /// The RDMA device it is on (what a device removal closes, `super::removal`).
    pub(crate) device: Option<DeviceKey>,
    /// The postpone mask the server set last (`postpone_update_state`, twice per
    /// request, from whichever thread has the client): stored here without the lock,
    /// and handed to the core by [`RdmaConnection::lock`], before the core decides
    /// anything about handlers or the pending list.
    postponed: AtomicI32,
    state: Mutex<Inner>,
}

struct Inner {
    /// The protocol core and the endpoint, driven by `protocol::driver`.
    d: Driver<ServerNic>,
    /// Reused for each poll of the completion queue (no allocation per event).
    completions: Vec<Completion>,
    /// Its place among the connections in the handshake, until ESTABLISHED or teardown.
    handshake: Option<super::handshakes::Slot>,
    /// The server's watch on the completion channel of a connection with a CQ of its own.
    watch: Option<FdWatch>,
}

/// The server's NIC side: the endpoint (until torn down), and larger RX buffers
/// registered on the `rdma-prepare` thread (docs/protocol.md §4.3).
struct ServerNic {
    /// `None` once torn down (the core said the connection is freed).
    ep: Option<Endpoint>,
    /// A larger RX buffer being registered off the event loop, and the one registered
    /// and waiting for the next hand-back.
    rx_preparing: Option<Slot<Result<PreparedRx, VerbsError>>>,
    rx_prepared: Option<PreparedRx>,
    peer: Option<SocketAddr>,
    /// Counted here, under the connection's lock; the module's totals take it at close.
    traffic: Traffic,
}

/// What a call on a torn-down endpoint reports (never reached: the transport does not
/// drive a connection after teardown).
const TORN_DOWN: LocalError = LocalError { call: "ibv_post_send", errno: libc::ENOTCONN };

impl Nic for ServerNic {
    fn is_up(&self) -> bool {
        self.ep.is_some()
    }
    fn post_control(&mut self, msg: &ControlMessage) -> Result<(), LocalError> {
        self.ep.as_mut().ok_or(TORN_DOWN)?.post_control(msg)?;
        match msg {
            ControlMessage::RegisterXferMemory { .. } => stats::add(&MODULE.stats.rx_registrations_sent, 1),
            ControlMessage::Keepalive => stats::add(&MODULE.stats.keepalives_sent, 1),
            _ => {}
        }
        Ok(())
    }
    fn sq_room(&self) -> bool {
        self.ep.as_ref().is_some_and(|e| e.can_write())
    }
    fn copy_rx(&mut self, range: Range<usize>, out: &mut [u8]) {
        if let Some(ep) = self.ep.as_mut() {
            ep.copy_rx(range, out)
        }
    }
    fn peer_rx_registered(&mut self, len: u32, resized: bool) -> Result<(), TxBuffersHeld> {
        stats::add(&MODULE.stats.rx_registrations_received, 1);
        match self.ep.as_mut() {
            Some(ep) => Nic::peer_rx_registered(ep, len, resized),
            None => Ok(()),
        }
    }
    fn write_limit(&self, tx_offset: u32) -> usize {
        self.ep.as_ref().map_or(0, |ep| Nic::write_limit(ep, tx_offset))
    }
    fn write_never_cut(&self) -> usize {
        self.ep.as_ref().map_or(0, Nic::write_never_cut)
    }
    #[inline(always)]
    fn post_write(&mut self, grant: &WriteGrant, parts: &[&[u8]]) -> Result<(), LocalError> {
        Nic::post_write(self.ep.as_mut().ok_or(TORN_DOWN)?, grant, parts)?;
        self.traffic.bytes_out += u64::from(grant.len);
        self.traffic.writes_out += 1;
        Ok(())
    }
    #[inline]
    fn rx_prepared(&mut self) -> Option<Option<RxBuffer>> {
        // (asked at every read; a preparation is rare)
        self.rx_preparing.as_ref()?;
        self.take_prepared_rx()
    }
    fn prepare_rx(&mut self, len: u32) -> bool {
        let Some(job) = self.ep.as_ref().and_then(|ep| ep.rx_preparation(len)) else { return false };
        self.rx_preparing = Some(Slot::spawn(&MODULE.workers.prepare, move || job.run()));
        true
    }
    fn install_prepared_rx(&mut self) {
        if let (Some(ep), Some(new)) = (self.ep.as_mut(), self.rx_prepared.take()) {
            ep.install_rx(new);
            stats::add(&MODULE.stats.rx_grown, 1);
        }
    }
}

impl ServerNic {
    /// [`Nic::rx_prepared`] once a preparation was started.
    #[inline(never)]
    fn take_prepared_rx(&mut self) -> Option<Option<RxBuffer>> {
        let done = self.rx_preparing.as_ref()?.take()?;
        self.rx_preparing = None;
        Some(match done {
            Ok(prepared) => {
                let region = prepared.region();
                self.rx_prepared = Some(prepared);
                Some(region)
            }
            Err(e) => {
                let peer = self.peer.map_or_else(|| "?".into(), |a| a.to_string());
                log::debug!("RDMA client {peer}: RX buffer not grown: {e}");
                None
            }
        })
    }
}

impl RdmaConnection {
    /// `rx_cap`: the largest RX buffer the connection may grow to (`rdma-rx-size`); the
    /// endpoint's buffer is where it starts. `shared_cq`: the index of the shared CQ the
    /// endpoint was built on, if any.
    pub(crate) fn new(
        ep: Endpoint,
        rx_cap: u32,
        shared_cq: Option<usize>,
        handshake: Option<super::handshakes::Slot>,
    ) -> RdmaConnection {
        let mut core = Conn::new(Role::Server, ep.rx_region());
        core.set_rx_cap(rx_cap);
        let (peer, local) = (ep.id().peer_addr(), ep.id().local_addr());
        RdmaConnection {
            peer,
            local,
            shared_cq: shared_cq.map(|i| (i, ep.qp_num())),
            own_channel_fd: shared_cq.is_none().then(|| ep.comp_fd()),
            device: DeviceKey::of(ep.id()),
            postponed: AtomicI32::new(Postpone::NONE.mask()),
            state: Mutex::new(Inner {
                d: Driver::new(
                    core,
                    ServerNic {
                        ep: Some(ep),
                        rx_preparing: None,
                        rx_prepared: None,
                        peer,
                        traffic: Traffic::default(),
                    },
                ),
                completions: Vec::with_capacity(COMPLETIONS_PER_OWN_POLL),
                handshake,
                watch: None,
            }),
        }
    }

    /// As if its endpoint were on `device` (unit tests).
    #[cfg(test)]
    pub(crate) fn on_device(mut self, device: DeviceKey) -> RdmaConnection {
        self.device = Some(device);
        self
    }

    /// A connection with no endpoint, as one torn down would be: the core, the server's
    /// half and the module's lists work; the NIC takes nothing (unit tests).
    #[cfg(test)]
    pub(crate) fn without_endpoint(rx: RxBuffer) -> RdmaConnection {
        RdmaConnection {
            peer: None,
            local: None,
            shared_cq: None,
            own_channel_fd: None,
            device: None,
            postponed: AtomicI32::new(Postpone::NONE.mask()),
            state: Mutex::new(Inner {
                d: Driver::new(
                    Conn::new(Role::Server, rx),
                    ServerNic {
                        ep: None,
                        rx_preparing: None,
                        rx_prepared: None,
                        peer: None,
                        traffic: Traffic::default(),
                    },
                ),
                completions: Vec::new(),
                handshake: None,
                watch: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut g = self.lock_for_data();
        g.d.core.postpone(Postpone::from_mask(self.postponed.load(Ordering::Acquire)));
        g
    }

    /// The lock for the data path (`read`, `write`, completions), whose core calls
    /// consult no postpone mask: the mask is handed over by [`lock`](Self::lock),
    /// before each decision about handlers or the pending list.
    fn lock_for_data(&self) -> MutexGuard<'_, Inner> {
        self.state.lock()
    }

    pub(crate) fn peer_name(&self) -> String {
        self.peer.map_or_else(|| "?".into(), |a| a.to_string())
    }

    pub(crate) fn comp_vector(&self) -> i32 {
        self.lock().d.nic.ep.as_ref().map_or(-1, |e| e.comp_vector())
    }

    /// `shutdown`: disconnects the peer; the DISCONNECTED event ends the connection.
    pub(crate) fn disconnect(&self) {
        if let Some(ep) = self.lock().d.nic.ep.as_ref() {
            ep.disconnect();
        }
    }
}

/// Publishes the core's state to the server's `conn->state` (and `last_errno`) if it
/// may have changed since it was last published (the core says so: a read or a
/// completion that fails nothing changes nothing the server sees; docs/server-abi.md
/// §4.4), and logs a failure the input just caused (once per connection, rate-limited).
#[inline]
fn publish(c: &HostedConn, inner: &mut Inner, failed: Option<Failure>) {
    let core = &mut inner.d.core;
    if core.take_state_change() {
        let state = match core.server_state() {
            ServerState::Accepting => ConnState::Accepting,
            ServerState::Connected => ConnState::Connected,
            ServerState::Closed => ConnState::Closed,
            ServerState::Error => ConnState::Error,
        };
        c.publish(state, core.failure().map_or(0, Failure::errno));
    }
    if let Some(f) = failed {
        report_failure(c, f);
    }
}

/// The failure's counter and its log line.
#[cold]
#[inline(never)]
fn report_failure(c: &HostedConn, f: Failure) {
    match &f {
        Failure::Protocol(v) => stats::violation(v),
        Failure::WorkRequest { .. } => stats::add(&MODULE.stats.work_request_errors, 1),
        Failure::Local { .. } => stats::add(&MODULE.stats.local_errors, 1),
        Failure::PeerSilent { .. } => stats::add(&MODULE.stats.peers_silent, 1),
        Failure::HandshakeTimeout { .. } => stats::add(&MODULE.stats.handshake_timeouts, 1),
    }
    // ENOMEM from ibv_reg_mr is the locked-memory limit (a TX buffer or a grown RX
    // buffer made after the connection was accepted): say what to do.
    let hint = match &f {
        Failure::Local { call, errno: libc::ENOMEM } if *call == VerbsOp::RegMr.name() => {
            " (the locked-memory limit is too low: raise `ulimit -l`, or LimitMEMLOCK= for systemd)".to_string()
        }
        Failure::Local { call, .. } if *call == VerbsOp::PinnedCeiling.name() => {
            format!(" ({})", super::pinned_ceiling_hint())
        }
        _ => String::new(),
    };
    log_limited(format_args!("RDMA client {}: {f}; closing the connection{hint}", c.inner.peer_name()));
}

/// `read`: copies unread bytes out of the RX buffer; `None` is "nothing now", EOF or
/// an error, which the state published tells apart (docs/server-abi.md §4.2).
#[inline]
pub(crate) fn read(c: &HostedConn, buf: &mut [u8]) -> Option<usize> {
    let mut g = c.inner.lock_for_data();
    let inner = &mut *g;
    if !inner.d.nic.is_up() {
        return None;
    }
    let (n, failed) = inner.d.read(buf);
    let n = n.ok()?;
    publish(c, inner, failed);
    inner.d.nic.traffic.bytes_in += n as u64;
    Some(n)
}

/// `write`/`writev`: as much of `parts` as the peer's window takes, as one write for
/// the peer (a chain of work requests over the TX chunks, docs/protocol.md §4.3).
/// `Some(0)`: nothing now (a completion reopens the window); `None`: the connection is
/// over.
#[inline(always)]
pub(crate) fn write(c: &HostedConn, parts: &[&[u8]]) -> Option<usize> {
    use crate::protocol::conn::WriteError;
    let mut g = c.inner.lock_for_data();
    let inner = &mut *g;
    // As many TX chunks as the free send-queue entries take (two per work request); the
    // server writes the rest in its next call, as after a short write on a socket.
    match inner.d.write(parts) {
        (Ok(grant), _) => Some(grant.len as usize),
        (Err(WriteError::WouldBlock(_)), _) => Some(0),
        (Err(_), Some(failed)) => {
            publish(c, inner, Some(failed));
            None
        }
        (Err(_), None) => None,
    }
}

/// Takes up to [`COMPLETIONS_PER_OWN_POLL`] completions from the connection's own CQ and
/// feeds them to the core.
pub(crate) fn process_completions(c: &HostedConn) {
    with_completions(c, |ep, completions, core| {
        // (the test knob makes the budget small, so that the suite reaches this path)
        let budget = knobs::value(Knob::CompletionBudget).map_or(COMPLETIONS_PER_OWN_POLL, |n| n as usize);
        match ep.poll(budget, |c| completions.push(c)) {
            Ok(left) => {
                core.set_completions_left(left);
                stats::add(&MODULE.stats.completions, completions.len() as u64);
                stats::add(&MODULE.stats.budget_hits, left.into());
                None
            }
            Err(e) => {
                core.set_completions_left(false);
                core.on_local_error(e.op.name(), e.errno).err()
            }
        }
    });
}

/// Where a shared CQ's poll delivers: each connection's completions to its core, then
/// its handlers (or the pending list).
pub(crate) struct ToConnections;

impl super::shared_cqs::Delivery for ToConnections {
    #[inline]
    fn completions(&mut self, c: &Arc<HostedConn>, wcs: &[WorkCompletion]) {
        on_shared_completions(c, wcs)
    }
    fn run(&mut self, c: &Arc<HostedConn>) {
        run(c)
    }
    fn queue(&mut self, c: &Arc<HostedConn>) {
        queue_if_due(c)
    }
}

/// Completions of this connection's QP taken from a shared CQ
/// ([`super::shared_cqs`]), in arrival order: each one's endpoint bookkeeping, then at
/// once the core (no list between), then the control messages they queued; the state is
/// published with the first failure. Nothing is done once the endpoint is torn down.
pub(crate) fn on_shared_completions(c: &HostedConn, wcs: &[WorkCompletion]) {
    let mut g = c.inner.lock_for_data();
    let inner = &mut *g;
    let (mut failed, mut writes_in) = (None, 0);
    for wc in wcs {
        let Some(ep) = inner.d.nic.ep.as_mut() else { return };
        let completion = match ep.take_completion(wc) {
            Ok(Some(completion)) => completion,
            Ok(None) => continue,
            Err(e) => {
                if let Err(f) = inner.d.core.on_local_error(e.op.name(), e.errno) {
                    failed.get_or_insert(f);
                }
                break;
            }
        };
        match inner.d.on_completion(completion) {
            Ok(r) => seen(c, r, &mut writes_in),
            Err(f) => {
                failed.get_or_insert(f);
            }
        }
    }
    if let Err(f) = inner.d.flush_control() {
        failed.get_or_insert(f);
    }
    inner.d.nic.traffic.writes_in += writes_in;
    publish(c, inner, failed);
}

/// What a completion meant, counted: data writes in `writes_in`, Keepalives, and
/// features the peer asked for that are not supported (logged, rate-limited: a peer may
/// send them as fast as it likes).
#[inline(always)]
fn seen(c: &HostedConn, r: Received, writes_in: &mut u64) {
    match r {
        Received::Data => *writes_in += 1,
        Received::Keepalive => stats::add(&MODULE.stats.keepalives_received, 1),
        Received::UnsupportedFeatures(f) => super::log_limited_at(
            log::Level::Debug,
            format_args!("RDMA client {}: SetClientFeature {f:#x} is not supported; ignored", c.inner.peer_name()),
        ),
        _ => {}
    }
}

/// Under the lock: `take` fills the (cleared) completion list from the endpoint, then
/// the driver feeds them to the core and posts what they queued; the state is
/// published with the first failure. Nothing is done once the endpoint is torn down.
fn with_completions(
    c: &HostedConn,
    take: impl FnOnce(&mut Endpoint, &mut Vec<Completion>, &mut Conn) -> Option<Failure>,
) {
    let mut g = c.inner.lock_for_data();
    let inner = &mut *g;
    let Some(ep) = inner.d.nic.ep.as_mut() else { return };
    inner.completions.clear();
    let mut failed = take(ep, &mut inner.completions, &mut inner.d.core);
    let mut writes_in = 0;
    let fed = inner.d.feed(&inner.completions, |r| seen(c, r, &mut writes_in));
    inner.d.nic.traffic.writes_in += writes_in;
    if let Some(f) = fed {
        failed.get_or_insert(f);
    }
    publish(c, inner, failed);
}

/// RDMA_CM_EVENT_ESTABLISHED: advertise our RX buffer (docs/protocol.md §1, §4.3).
pub(crate) fn on_established(c: &HostedConn) {
    let mut g = c.inner.lock();
    g.handshake = None;
    let failed = g.d.on_established();
    publish(c, &mut g, failed);
}

/// The peer left (DISCONNECTED and friends). The completion queue is then drained to
/// the end: writes the peer made before it left complete before the flush errors, so
/// their bytes are read before EOF (docs/server-abi.md §4.2), and the flush errors on
/// a peer-closed connection are no failure (docs/protocol.md §6).
pub(crate) fn on_disconnected(c: &HostedConn) {
    {
        let mut g = c.inner.lock();
        g.d.core.on_disconnected();
        publish(c, &mut g, None);
    }
    if let Some((cq, _)) = c.inner.shared_cq {
        return super::shared_cqs::drain(cq, &mut ToConnections);
    }
    loop {
        process_completions(c);
        if !c.inner.lock().d.core.completions_left() {
            break;
        }
    }
}

/// The connection's keepalive tick, once per period; `quiet_turn`: the schedule's turn for a
/// quiet connection (docs/protocol.md §5).
pub(crate) fn keepalive(c: &HostedConn, quiet_turn: bool) {
    let mut g = c.inner.lock();
    // First the endpoint's side: sends unanswered, the peer shown alive, and the TX buffer
    // of a connection that wrote nothing since given back.
    let mut at =
        TickFacts { unacknowledged_ticks: 0, busy_and_acknowledged: false, nothing_in_flight: true, quiet_turn };
    if let Some(ep) = g.d.nic.ep.as_mut() {
        let t = ep.keepalive_tick();
        if let Some(idle) = t.released_tx {
            stats::add(&MODULE.stats.tx_buffers_released, u64::from(idle.registered_bytes() > 0));
            // (freeing it costs milliseconds under Soft-RoCE, for each connection that
            // went idle at this tick: docs/protocol.md §2)
            MODULE.workers.release.submit(move || drop(idle));
        }
        at.unacknowledged_ticks = t.unacknowledged_ticks;
        at.busy_and_acknowledged = t.busy_and_acknowledged;
        at.nothing_in_flight = t.nothing_in_flight;
    }
    let failed = g.d.keepalive(at);
    publish(c, &mut g, failed);
}

/// Queues the connection for `process_pending_data` if something is due without an fd
/// event (the core's `wants_pending`).
pub(crate) fn queue_if_due(c: &Arc<HostedConn>) {
    let due = c.inner.lock().d.wants_pending();
    if due {
        pending::push(c);
    }
}

pub(crate) fn set_handlers(c: &Arc<HostedConn>, read: bool, write: bool, barrier: bool) {
    {
        let mut g = c.inner.lock();
        g.d.core.set_read_handler(read);
        g.d.core.set_write_handler(write, barrier);
    }
    // RDMA has no POLLOUT: if the window is open the handler runs from
    // process_pending_data; if not, the completion that reopens it runs it.
    queue_if_due(c);
}

pub(crate) fn postpone(c: &HostedConn, mask: Postpone) {
    // (the core takes it at the next lock: every decision of the core is made under it)
    c.inner.postponed.store(mask.mask(), Ordering::Release);
}

/// The server's side of [`driver::run`]: the driver under the connection's lock, the
/// handlers called without it.
struct ServerHost<'a>(&'a HostedConn);

impl driver::Host for ServerHost<'_> {
    type Nic = ServerNic;
    fn with_driver<R>(&mut self, f: impl FnOnce(&mut Driver<ServerNic>) -> R) -> R {
        f(&mut self.0.inner.lock().d)
    }
    fn call(&mut self, h: Handler) {
        self.0.call(match h {
            Handler::Read => ServerHandler::Read,
            Handler::Write => ServerHandler::Write,
        })
    }
}

/// One run of the server's handlers (docs/server-abi.md §4.1, §4.3): the completion fd
/// fired, or the pending list came round.
pub(crate) fn run(c: &Arc<HostedConn>) {
    match driver::run(&mut ServerHost(c)) {
        RunEnd::Done { pending: true } => pending::push(c),
        RunEnd::Done { pending: false } | RunEnd::ClosedInside => {}
        // (nothing may touch it after)
        RunEnd::FreeNow => teardown(c),
    }
}

/// After the accept handler returned: false when the connection was closed inside (it
/// is torn down now if no other handler is running; nothing may touch it after).
fn after_handler(c: &HostedConn) -> bool {
    let after = c.inner.lock().d.core.handler_returned();
    match after {
        AfterHandler::Continue => true,
        AfterHandler::FreeNow => {
            teardown(c);
            false
        }
        AfterHandler::Closed => false,
    }
}

/// A turn on the pending list: completions a budgeted poll left, then the handlers.
pub(crate) fn run_pending(c: &Arc<HostedConn>) {
    let left = c.inner.lock().d.core.completions_left();
    if left {
        process_completions(c);
    }
    run(c);
}

/// The completion channel fired.
pub(crate) fn on_completion_fd(c: &Arc<HostedConn>) {
    stats::add(&MODULE.stats.wakeups, 1);
    process_completions(c);
    run(c);
}

/// `ct->accept`: ACCEPTING → CONNECTED, then the server's accept handler. False: the
/// connection is gone (the peer left first, or the handler closed it).
pub(crate) fn accept(c: &Arc<HostedConn>) -> bool {
    {
        let mut g = c.inner.lock();
        if g.d.core.on_accepted().is_err() {
            return false;
        }
        g.d.core.enter_handler();
        publish(c, &mut g, None);
    }
    c.call(ServerHandler::Accept);
    if !after_handler(c) {
        return false;
    }
    queue_if_due(c);
    true
}

/// `ct->close`: forget the connection; release its verbs resources now, or when the
/// handler running on it returns (docs/server-abi.md §4.4).
pub(crate) fn close(c: &Arc<HostedConn>) {
    let out = {
        let mut g = c.inner.lock();
        // (what a handler still running on it moves after is retired at teardown)
        stats::retire(std::mem::take(&mut g.d.nic.traffic));
        g.d.core.close()
    };
    if out.unregister {
        live::remove(c);
        pending::remove(c);
        match c.inner.shared_cq {
            // The CQ's fd serves the other connections on it: only this QP is forgotten.
            Some((cq, qp_num)) => super::shared_cqs::unregister(cq, qp_num),
            None => {
                let watch = c.inner.lock().watch.take();
                if let Some(w) = watch {
                    crate::server::api::unwatch_fd(w)
                }
            }
        }
    }
    if out.free_now {
        teardown(c);
    }
}

/// The kernel's name of the connection's device, for the log.
pub(crate) fn device_name(c: &HostedConn) -> String {
    c.inner.lock().d.nic.ep.as_ref().map_or_else(|| "?".into(), |ep| crate::verbs::device_name(ep.id()))
}

/// The server closed the connection without accepting it (it refused the client).
pub(crate) fn closed_unaccepted(c: &HostedConn) -> bool {
    let g = c.inner.lock();
    *g.d.core.state() == crate::protocol::conn::State::Closed && !g.d.core.was_accepted()
}

/// Releases the verbs resources and disconnects the peer, on the background thread
/// `rdma-release` (docs/server-abi.md §4.4, teardown): under Soft-RoCE that costs
/// milliseconds a connection, which thousands of clients leaving at once would take from
/// the event loop in one turn.
pub(crate) fn teardown(c: &HostedConn) {
    if let Some((cq, qp_num)) = c.inner.shared_cq {
        // From here on its completions are dropped, also those still queued when its
        // QP is destroyed on the other thread.
        super::shared_cqs::unregister(cq, qp_num);
    }
    let (ep, prepared, preparing) = {
        let mut g = c.inner.lock();
        g.handshake = None;
        stats::retire(std::mem::take(&mut g.d.nic.traffic));
        (g.d.nic.ep.take(), g.d.nic.rx_prepared.take(), g.d.nic.rx_preparing.take())
    };
    let Some(mut ep) = ep else { return };
    // The id lives on until the release runs, and a CM event for it (a late
    // DISCONNECTED) carries its context: a key that a new connection may own by then.
    ep.set_cm_context(super::NO_CONNECTION_KEY);
    // Here, on the thread that reads the CM events: the QP out of the id, its number
    // kept from new QPs until it is retired.
    ep.begin_close();
    /// Counts the release as done however the job ends.
    struct Released;
    impl Drop for Released {
        fn drop(&mut self) {
            MODULE.stats.releasing.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    stats::add(&MODULE.stats.releasing, 1);
    MODULE.workers.release.submit(move || {
        let _done = Released;
        ep.close();
        // (a buffer prepared for it holds its own reference to the protection domain)
        drop((prepared, preparing));
    });
}

/// For INFO, of a live connection.
pub(crate) struct Footprint {
    pub(crate) pinned_bytes: u64,
    /// The peer's RX window (0: none registered yet), and ours.
    pub(crate) peer_window: u64,
    pub(crate) rx_window: u64,
    /// Its traffic since it was accepted.
    pub(crate) traffic: stats::Traffic,
}

pub(crate) fn footprint(c: &HostedConn) -> Footprint {
    let g = c.inner.lock();
    let prepared = g.d.nic.rx_prepared.as_ref().map_or(0, |p| p.pinned_bytes());
    Footprint {
        pinned_bytes: g.d.nic.ep.as_ref().map_or(0, |e| e.pinned_bytes() + prepared),
        peer_window: g.d.core.tx().len().into(),
        rx_window: g.d.core.rx().len().into(),
        traffic: g.d.nic.traffic,
    }
}

/// Keeps the server's watch on the connection's own completion channel, for `close`.
pub(crate) fn set_watch(c: &HostedConn, watch: FdWatch) {
    c.inner.lock().watch = Some(watch);
}

/// Points the rdma_cm id's context at the connection, so that its CM events find it.
pub(crate) fn set_cm_context(c: &HostedConn) {
    if let Some(ep) = c.inner.lock().d.nic.ep.as_mut() {
        ep.set_cm_context(c.key());
    }
}

/// `rdma_accept` on the connection's id.
pub(crate) fn accept_cm(c: &HostedConn, params: crate::verbs::ConnParams) -> Result<(), crate::verbs::VerbsError> {
    if knobs::fire(Knob::FailAccept) {
        return Err(crate::verbs::VerbsError::with(crate::verbs::VerbsOp::Accept, libc::EIO));
    }
    match c.inner.lock().d.nic.ep.as_ref() {
        Some(ep) => ep.id().accept(params),
        None => Err(crate::verbs::VerbsError::with(crate::verbs::VerbsOp::Accept, libc::ENOTCONN)),
    }
}

/// The transport's glue around the core, driven through the server's half of a
/// connection with test handlers in place of the server's (no server, no RDMA): accept,
/// a close inside a handler, the pending list.
#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;
    use crate::server::host::test_handlers;
    use crate::server::{Hosted, Transport};

    /// The live set and the pending list are the module's: one test at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    thread_local! {
        static CONNS: RefCell<HashMap<usize, Arc<HostedConn>>> = RefCell::new(HashMap::new());
        static CALLS: RefCell<Vec<(usize, &'static str)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock()
    }

    /// A live connection (as `listener.rs` makes it live), ESTABLISHED, with `unread`
    /// bytes received; accepted by the server (with no accept handler) if `accepted`.
    pub(crate) fn connection(unread: u32, accepted: bool) -> Arc<HostedConn> {
        connection_on(unread, accepted, None)
    }

    /// As [`connection`], its endpoint taken to be on `device`.
    pub(crate) fn connection_on(unread: u32, accepted: bool, device: Option<DeviceKey>) -> Arc<HostedConn> {
        let mut inner = RdmaConnection::without_endpoint(RxBuffer { addr: 0x1000, len: 4096, key: 7 });
        if let Some(d) = device {
            inner = inner.on_device(d);
        }
        let c = Hosted::new(inner).expect("an eventfd");
        CONNS.with(|m| m.borrow_mut().insert(c.key(), c.clone()));
        live::insert(&c);
        let mut g = c.inner.lock();
        g.d.core.on_established();
        if unread > 0 {
            g.d.core.on_data(unread).expect("inside the RX window");
        }
        drop(g);
        if accepted {
            assert!(accept(&c));
        }
        c
    }

    fn by_key(key: usize) -> Arc<HostedConn> {
        CONNS.with(|m| m.borrow()[&key].clone())
    }
    fn record(key: usize, what: &'static str) {
        CALLS.with(|c| c.borrow_mut().push((key, what)));
    }
    fn calls() -> Vec<(usize, &'static str)> {
        CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }
    fn is_live(c: &HostedConn) -> bool {
        live::get(c.key()).is_some()
    }

    fn accept_and_return(key: usize) {
        record(key, "accept");
    }
    fn accept_and_close(key: usize) {
        record(key, "accept");
        close(&by_key(key));
    }
    fn read_and_close(key: usize) {
        record(key, "read");
        close(&by_key(key));
    }
    /// A read handler that reads nothing (the server's, with its query buffer full).
    fn read_nothing(key: usize) {
        record(key, "read");
    }
    /// A read handler whose connection is queued again from inside it.
    fn read_and_requeue(key: usize) {
        record(key, "read");
        pending::push(&by_key(key));
    }

    #[test]
    fn a_device_removal_closes_the_connections_on_that_device_and_no_other() {
        use crate::protocol::conn::State;
        use crate::transport::removal;
        let _s = serial();
        let (a, b) = (DeviceKey::from_context(0x61_0000 as *mut _), DeviceKey::from_context(0x62_0000 as *mut _));
        let on_a = connection_on(0, true, Some(a));
        let on_b = connection_on(0, true, Some(b));
        removal::device_removed(a, "rxeA");
        assert_eq!(*on_a.inner.lock().d.core.state(), State::PeerClosed);
        assert_ne!(*on_b.inner.lock().d.core.state(), State::PeerClosed, "another device's connection stays");
        removal::device_removed(a, "rxeA"); // every id of the device reports it: counted once
        assert_eq!(removal::in_progress(), [(a, false)]);
        removal::release_finished();
        assert_eq!(removal::in_progress(), [(a, false)], "its connection is still open");
        close(&on_a);
        removal::release_finished();
        // No device here for librdmacm to list: the removal waits, its CQs forgotten.
        assert_eq!(removal::in_progress(), [(a, true)]);
        close(&on_b);
    }

    #[test]
    fn accept_calls_the_accept_handler_once_with_the_connection_connected() {
        let _s = serial();
        let c = connection(0, false);
        test_handlers::install(&*c, ServerHandler::Accept, accept_and_return);
        assert!(accept(&c));
        assert_eq!(calls(), [(c.key(), "accept")]);
        assert_eq!(c.inner.lock().d.core.server_state(), ServerState::Connected);
        assert!(is_live(&c));
        close(&c);
        assert!(!is_live(&c));
        assert_eq!(c.inner.lock().d.core.server_state(), ServerState::Closed);
    }

    #[test]
    fn a_close_inside_the_accept_handler_frees_the_connection_once_it_returns() {
        let _s = serial();
        let c = connection(0, false);
        test_handlers::install(&*c, ServerHandler::Accept, accept_and_close);
        assert!(!accept(&c), "the server must not use a connection its accept handler closed");
        assert_eq!(calls(), [(c.key(), "accept")]);
        assert!(!is_live(&c));
        // a second close (the server's, say) changes nothing
        close(&c);
        assert_eq!(c.inner.lock().d.core.server_state(), ServerState::Closed);
    }

    #[test]
    fn a_close_inside_the_read_handler_ends_the_run_and_no_handler_runs_again() {
        let _s = serial();
        let c = connection(10, true);
        test_handlers::install(&*c, ServerHandler::Read, read_and_close);
        set_handlers(&c, true, false, false);
        run(&c);
        assert_eq!(calls(), [(c.key(), "read")], "called once, though 10 bytes stay unread");
        assert!(!is_live(&c));
        run(&c);
        assert_eq!(calls(), [], "no handler after close");
    }

    #[test]
    fn a_postponed_read_handler_waits_until_the_server_lifts_the_postponement() {
        let _s = serial();
        let c = connection(10, true);
        test_handlers::install(&*c, ServerHandler::Read, read_and_close);
        // (as an IO thread that has the client does, before the handlers are set)
        postpone(&c, Postpone::READ);
        set_handlers(&c, true, false, false);
        run(&c);
        assert_eq!(calls(), [], "postponed: the read handler does not run");
        postpone(&c, Postpone::NONE);
        run(&c);
        assert_eq!(calls(), [(c.key(), "read")], "lifted: it runs at the next run");
    }

    #[test]
    fn the_pending_list_runs_each_queued_connection_once_per_turn() {
        let _s = serial();
        let (a, b) = (connection(5, true), connection(5, true));
        test_handlers::install(&*a, ServerHandler::Read, read_nothing);
        test_handlers::install(&*b, ServerHandler::Read, read_and_requeue);
        // installing a read handler with unread bytes queues the connection: no fd
        // event will come for bytes that already arrived
        set_handlers(&a, true, false, false);
        set_handlers(&b, true, false, false);
        assert!(RdmaConnection::has_pending());
        RdmaConnection::process_pending();
        assert_eq!(calls(), [(a.key(), "read"), (b.key(), "read")]);
        // `b` queued itself again from its handler: the next turn, not this one
        assert!(RdmaConnection::has_pending());
        RdmaConnection::process_pending();
        assert_eq!(calls(), [(b.key(), "read")]);
        for c in [&a, &b] {
            close(c);
        }
        assert!(!RdmaConnection::has_pending(), "a closed connection leaves the pending list");
    }
}
