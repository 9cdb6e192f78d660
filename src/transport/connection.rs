//! One accepted RDMA client: the server's `connection` (first, so a pointer to us is a
//! pointer to it), the protocol session and the verbs endpoint behind a mutex.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{is_live, live_remove, pending_push, pending_remove, ConnPtr};
use crate::protocol::session::Role;
use crate::protocol::{ControlMessage, Session, SessionEvent, Violation};
use crate::server::abi::*;
use crate::server::api;
use crate::verbs::{Completion, Endpoint, VerbsError};

#[repr(C)]
pub struct RdmaConnection {
    /// What the server sees. Must stay the first field.
    pub conn: Connection,
    /// `postpone_update_state` mask (written by IO threads in 9.1.2).
    postpone: AtomicI32,
    pub peer: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    inner: Mutex<Inner>,
}

struct Inner {
    /// `None` once torn down.
    ep: Option<Endpoint>,
    session: Session,
    /// ESTABLISHED seen and our RX buffer advertised.
    established: bool,
    /// Bytes handed to the server by `read`, to tell whether a handler made progress.
    bytes_read: u64,
    /// Bytes taken by `write`/`writev`, likewise for the write handler.
    bytes_written: u64,
    /// Reused for each drain of the completion queue (no allocation per event; at most
    /// [`COMPLETIONS_PER_WAKEUP`] long).
    completions: Vec<Completion>,
    /// The last poll stopped at its budget: completions may be waiting, and the channel
    /// will not signal them again.
    completions_left: bool,
}

impl RdmaConnection {
    pub fn new(ep: Endpoint, ty: *const c_void) -> Box<RdmaConnection> {
        let session = Session::new(Role::Server, ep.rx_addr(), ep.rx_len(), ep.rx_key());
        let (peer, local) = (ep.id().peer_addr(), ep.id().local_addr());
        Box::new(RdmaConnection {
            conn: Connection {
                ty,
                state: AtomicI32::new(CONN_STATE_ACCEPTING),
                last_errno: AtomicI32::new(0),
                fd: ep.comp_fd(),
                flags: 0,
                refs: 0,
                iovcnt: IOV_MAX,
                private_data: std::ptr::null_mut(),
                conn_handler: None,
                write_handler: None,
                read_handler: None,
            },
            postpone: AtomicI32::new(0),
            peer,
            local,
            inner: Mutex::new(Inner {
                ep: Some(ep),
                session,
                established: false,
                bytes_read: 0,
                bytes_written: 0,
                completions: Vec::with_capacity(COMPLETIONS_PER_WAKEUP),
                completions_left: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> i32 {
        self.conn.state.load(Ordering::Acquire)
    }

    pub fn set_postpone(&self, mask: i32) {
        self.postpone.store(mask, Ordering::Release);
    }

    fn postponed(&self, what: i32) -> bool {
        self.postpone.load(Ordering::Acquire) & what != 0
    }

    pub fn peer_name(&self) -> String {
        self.peer.map_or_else(|| "?".into(), |a| a.to_string())
    }

    /// Ends the connection from our side: the server learns it on its next `read`.
    /// Only a live connection fails: once the peer left (CLOSED) the flush completions
    /// that follow are no news, and the first reason stays. The errno is stored before
    /// the state, so a thread that sees ERROR also sees why (never "Success").
    fn fail(&self, errno: i32, why: &str) {
        let mut was = self.state();
        while was == CONN_STATE_CONNECTED || was == CONN_STATE_ACCEPTING {
            self.conn.last_errno.store(errno, Ordering::Release);
            match self.conn.state.compare_exchange(was, CONN_STATE_ERROR, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    log::warn!("RDMA client {}: {why}; closing the connection", self.peer_name());
                    return;
                }
                Err(now) => was = now,
            }
        }
    }

    fn violation(&self, v: &Violation) {
        self.fail(libc::EPROTO, &format!("protocol violation: {v}"));
    }

    fn verbs_failed(&self, e: &VerbsError) {
        self.fail(e.errno, &e.to_string());
    }

    /// `read`: copies unread bytes out of the RX buffer. `None` means "nothing now"
    /// (-1 with the state still CONNECTED) or an error (-1 with another state).
    /// After the peer left (CLOSED) the bytes it sent before leaving are still read, as
    /// TCP delivers them before EOF; then `None` with CLOSED is the EOF.
    pub fn read(&self, buf: &mut [u8]) -> Option<usize> {
        let state = self.state();
        if !(state == CONN_STATE_CONNECTED || state == CONN_STATE_CLOSED) || super::in_fork_child() {
            return None;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let ep = inner.ep.as_mut()?;
        let range = inner.session.rx.readable();
        if range.is_empty() {
            return None;
        }
        let n = range.len().min(buf.len());
        buf[..n].copy_from_slice(&ep.rx_bytes()[range.start..range.start + n]);
        inner.bytes_read += n as u64;
        if let Some(msg) = inner.session.consume(n) {
            // The buffer was full and is now consumed: hand it back to the client.
            if let Err(e) = ep.post_control(&msg) {
                drop(guard);
                self.verbs_failed(&e);
            }
        }
        Some(n)
    }

    /// `write`/`writev`: copies as much of `parts` as the TX window takes into the TX
    /// buffer and posts one RDMA_WRITE_WITH_IMM. `None`: the connection failed.
    /// `Some(0)`: no window now (the peer has
    /// not consumed its RX buffer, or the send queue is full); a completion will tell.
    pub fn write(&self, parts: &[&[u8]]) -> Option<usize> {
        if self.state() != CONN_STATE_CONNECTED || super::in_fork_child() {
            return None;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let ep = inner.ep.as_mut()?;
        if !inner.established || !ep.can_write() {
            return Some(0);
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let Some((offset, n)) = inner.session.tx.reserve(total) else { return Some(0) };
        let (addr, rkey) = (inner.session.tx.remote_addr, inner.session.tx.rkey);
        match ep.post_write(offset, parts, n, addr, rkey) {
            Ok(()) => {
                inner.bytes_written += u64::from(n);
                Some(n as usize)
            }
            Err(e) => {
                drop(guard);
                self.verbs_failed(&e);
                None
            }
        }
    }

    fn has_unread(&self) -> bool {
        self.lock().session.rx.has_unread()
    }

    /// Bytes read so far, if unread bytes remain (one lock for the read loop's check).
    fn unread_progress(&self) -> Option<u64> {
        let g = self.lock();
        g.session.rx.has_unread().then_some(g.bytes_read)
    }

    fn bytes_read(&self) -> u64 {
        self.lock().bytes_read
    }

    fn bytes_written(&self) -> u64 {
        self.lock().bytes_written
    }

    /// Whether a write now would move bytes.
    pub fn can_write_now(&self) -> bool {
        let g = self.lock();
        g.established && g.session.tx.available() > 0 && g.ep.as_ref().is_some_and(|e| e.can_write())
    }

    /// Takes up to [`COMPLETIONS_PER_WAKEUP`] completions and applies them to the
    /// session. Returns whether more may be waiting (the caller queues the connection
    /// on the pending list, behind the others).
    pub fn process_completions(&self) -> bool {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(ep) = inner.ep.as_mut() else { return false };
        let completions = &mut inner.completions;
        completions.clear();
        let (left, mut failure) = match ep.poll(COMPLETIONS_PER_WAKEUP, |c| completions.push(c)) {
            Ok(left) => (left, None),
            Err(e) => (false, Some(Failure::Verbs(e))),
        };
        inner.completions_left = left && failure.is_none();
        for &c in completions.iter() {
            if failure.is_some() {
                break;
            }
            failure = match c {
                // A SEND shorter than 32 bytes decodes as BadControlLength; a longer one
                // cannot land in a 32-byte slot (it completes as a length error).
                Completion::Control { bytes, len } => {
                    match inner.session.on_control(&bytes[..(len as usize).min(bytes.len())]) {
                        Ok(SessionEvent::Reply(m)) => ep.post_control(&m).err().map(Failure::Verbs),
                        Ok(SessionEvent::PeerRxRegistered { len, resized: true }) => {
                            ep.ensure_tx(len).err().map(Failure::Verbs)
                        }
                        Ok(SessionEvent::UnsupportedFeatures(f)) => {
                            log::debug!(
                                "RDMA client {}: SetClientFeature {f:#x} is not supported; ignored",
                                self.peer_name()
                            );
                            None
                        }
                        Ok(_) => None,
                        Err(v) => Some(Failure::Protocol(v)),
                    }
                }
                Completion::Data { imm } => inner.session.on_data(imm).err().map(Failure::Protocol),
                Completion::Failed { status, vendor_err } => Some(Failure::WorkRequest { status, vendor_err }),
            };
        }
        let left = inner.completions_left;
        drop(guard);
        match failure {
            None => return left,
            Some(Failure::Verbs(e)) => self.verbs_failed(&e),
            Some(Failure::Protocol(v)) => self.violation(&v),
            Some(Failure::WorkRequest { status, vendor_err }) => self.fail(
                libc::EIO,
                &format!("work request failed (ibv_wc_status {status}, vendor error {vendor_err:#x})"),
            ),
        }
        false
    }

    fn completions_left(&self) -> bool {
        self.lock().completions_left
    }

    /// RDMA_CM_EVENT_ESTABLISHED: advertise our RX buffer (docs/protocol.md §1, §4.3).
    pub fn on_established(&self) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(ep) = inner.ep.as_mut() else { return };
        let msg: ControlMessage = inner.session.register_rx();
        match ep.post_control(&msg) {
            Ok(()) => inner.established = true,
            Err(e) => {
                drop(guard);
                self.verbs_failed(&e);
            }
        }
    }

    /// The peer went away (DISCONNECTED and friends). CLOSED first, then the completion
    /// queue is drained: writes the peer made before it left complete in order before the
    /// flush errors, so their bytes become readable (and the flush errors, arriving on a
    /// CLOSED connection, do not turn it into ERROR).
    pub fn on_disconnected(&self) {
        for from in [CONN_STATE_CONNECTED, CONN_STATE_ACCEPTING] {
            let _ = self.conn.state.compare_exchange(from, CONN_STATE_CLOSED, Ordering::AcqRel, Ordering::Acquire);
        }
        // Everything the peer sent before leaving, however much: this is the last look.
        while self.process_completions() {}
    }

    pub fn send_keepalive(&self) {
        if self.state() != CONN_STATE_CONNECTED || super::in_fork_child() {
            return;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.established {
            return;
        }
        if let Some(ep) = inner.ep.as_mut() {
            if let Err(e) = ep.post_control(&ControlMessage::Keepalive) {
                drop(guard);
                self.verbs_failed(&e);
            }
        }
    }

    /// Points the rdma_cm id's context at this connection, so that its CM events
    /// (ESTABLISHED, DISCONNECTED) find it.
    pub fn set_cm_context(&self) {
        if let Some(ep) = self.lock().ep.as_ref() {
            ep.id().set_context((self as *const Self).cast_mut().cast());
        }
    }

    pub fn accept_cm(&self, param: &mut rdma_sys::rdma_conn_param) -> Result<(), VerbsError> {
        match self.lock().ep.as_ref() {
            Some(ep) => ep.id().accept(param),
            None => Err(VerbsError::with("rdma_accept", libc::ENOTCONN)),
        }
    }

    pub fn comp_vector(&self) -> i32 {
        self.lock().ep.as_ref().map_or(-1, |e| e.comp_vector())
    }

    pub fn disconnect(&self) {
        if let Some(ep) = self.lock().ep.as_ref() {
            ep.disconnect();
        }
    }

    /// Releases the verbs resources (disconnecting the peer first).
    fn teardown(&self) {
        let ep = self.lock().ep.take();
        if let Some(ep) = ep {
            ep.disconnect();
            drop(ep);
        }
    }
}

/// connhelpers.h `callHandler`: runs `h` under a reference; if the handler asked for
/// the connection to be closed, closes it once the last reference is gone. Returns
/// false when the connection must not be touched any more.
///
/// # Safety
/// `c` must be a live connection, on the main thread.
pub unsafe fn call_handler(c: *mut RdmaConnection, h: ConnHandler) -> bool {
    (*c).conn.refs += 1;
    if let Some(h) = h {
        h(c.cast());
    }
    (*c).conn.refs -= 1;
    if (*c).conn.flags & CONN_FLAG_CLOSE_SCHEDULED != 0 {
        if (*c).conn.refs == 0 {
            close(c);
        }
        return false;
    }
    true
}

/// Runs the server's handlers for whatever is due: for a closed or failed connection
/// the read handler (its `read` returns -1 and the server frees the client); otherwise
/// the read handler while unread bytes remain and each call consumed some (a client
/// whose input is being processed by an IO thread consumes nothing: stop, the server
/// calls `update_state` when it is done), then the write handler if the TX window is
/// open. With a write barrier the write handler goes first, as ae's AE_BARRIER does.
///
/// A write handler that wrote and is still installed with the window still open is
/// queued to run again from `process_pending_data` (docs/server-abi.md §4.3): the server
/// writes a reply of many blocks in pieces of about 64 KiB per call and relies on the
/// connection type to call it again, as a socket's POLLOUT would. Waiting for the next
/// completion instead stalled multi-block replies until the keepalive tick (3 s a piece).
/// A handler that wrote nothing is not re-queued, so it can never make the loop spin;
/// the completion that reopens the window (the peer's RegisterXferMemory) runs it.
///
/// # Safety
/// `c` must be a live connection, on the main thread.
pub unsafe fn run_handlers(c: *mut RdmaConnection) {
    let state = (*c).state();
    if state == CONN_STATE_ERROR || (state == CONN_STATE_CLOSED && !(*c).has_unread()) {
        if call_handler(c, (*c).conn.read_handler) {
            call_handler(c, (*c).conn.write_handler);
        }
        return;
    }
    if state == CONN_STATE_CLOSED {
        // The peer left after sending these bytes: the server reads them, then EOF.
        let progressed = run_read_handler(c);
        if progressed == Some(true) && !(*c).postponed(CONN_POSTPONE_READ) {
            pending_push(ConnPtr(c));
        }
        // No progress, or an IO thread has the client: update_state or the keepalive
        // tick queues it again (never a busy loop).
        return;
    }
    if state != CONN_STATE_CONNECTED {
        return;
    }
    let barrier = (*c).conn.flags & CONN_FLAG_WRITE_BARRIER != 0;
    let mut wrote = false;
    if barrier {
        match run_write_handler(c) {
            WriteHandlerRun::ConnectionGone => return,
            WriteHandlerRun::Ran { wrote: w } => wrote = w,
            WriteHandlerRun::NotDue => {}
        }
    }
    if run_read_handler(c).is_none() {
        return;
    }
    if !barrier {
        match run_write_handler(c) {
            WriteHandlerRun::ConnectionGone => return,
            WriteHandlerRun::Ran { wrote: w } => wrote = w,
            WriteHandlerRun::NotDue => {}
        }
    }
    if (*c).state() != CONN_STATE_CONNECTED || (wrote && write_due(c)) {
        // a violation or a failed post while handling: let the server see it now;
        // or more of a multi-block reply to write while the window is open.
        pending_push(ConnPtr(c));
    }
}

/// Calls the read handler while unread bytes remain and each call consumed some.
/// `Some(progressed)`, or `None` when the handler closed the connection.
unsafe fn run_read_handler(c: *mut RdmaConnection) -> Option<bool> {
    let mut progressed = false;
    if (*c).postponed(CONN_POSTPONE_READ) {
        return Some(false);
    }
    let state = (*c).state();
    while (*c).conn.read_handler.is_some() && (*c).state() == state {
        let Some(before) = (*c).unread_progress() else { break };
        if !call_handler(c, (*c).conn.read_handler) {
            return None;
        }
        if (*c).bytes_read() == before {
            break;
        }
        progressed = true;
    }
    Some(progressed)
}

enum WriteHandlerRun {
    /// No handler, postponed by an IO thread, or no TX window now.
    NotDue,
    /// It ran; `wrote` says whether it moved bytes.
    Ran { wrote: bool },
    /// The handler closed the connection: it must not be touched any more.
    ConnectionGone,
}

/// Whether the write handler should run now.
unsafe fn write_due(c: *mut RdmaConnection) -> bool {
    !(*c).postponed(CONN_POSTPONE_WRITE) && (*c).conn.write_handler.is_some() && (*c).can_write_now()
}

unsafe fn run_write_handler(c: *mut RdmaConnection) -> WriteHandlerRun {
    if !write_due(c) {
        return WriteHandlerRun::NotDue;
    }
    let before = (*c).bytes_written();
    if !call_handler(c, (*c).conn.write_handler) {
        return WriteHandlerRun::ConnectionGone;
    }
    WriteHandlerRun::Ran { wrote: (*c).bytes_written() != before }
}

/// Queues the connection for `process_pending_data` if something is due without an
/// fd event.
///
/// # Safety
/// `c` must be a live connection.
pub unsafe fn queue_if_due(c: *mut RdmaConnection) {
    let state = (*c).state();
    let due = (*c).completions_left()
        || state == CONN_STATE_CLOSED
        || state == CONN_STATE_ERROR
        || ((*c).conn.read_handler.is_some() && (*c).has_unread())
        || ((*c).conn.write_handler.is_some() && (*c).can_write_now());
    if due {
        pending_push(ConnPtr(c));
    }
}

/// The completion channel fd is readable (registered with EventLoopAdd).
///
/// # Safety
/// Called by the event loop with the `data` given to `watch_fd`: a connection pointer,
/// checked against the live set before use.
pub unsafe extern "C" fn on_completion_fd(_fd: c_int, data: *mut c_void, _mask: c_int) {
    let c = data.cast::<RdmaConnection>();
    crate::transport::conntype::guard((), || {
        if !is_live(ConnPtr(c)) {
            return;
        }
        if (*c).process_completions() {
            pending_push(ConnPtr(c));
        }
        run_handlers(c);
    })
}

/// Completions handled per connection per wake-up (fault of review: a peer sending
/// Keepalives or empty writes as fast as it can kept the main thread in its drain).
pub const COMPLETIONS_PER_WAKEUP: usize = 256;

/// One turn of a connection on the pending list: the completions its last turn left,
/// then its handlers.
///
/// # Safety
/// `c` must be a live connection, on the main thread.
pub unsafe fn run_pending(c: *mut RdmaConnection) {
    if (*c).completions_left() && (*c).process_completions() {
        pending_push(ConnPtr(c));
    }
    run_handlers(c);
}

enum Failure {
    Verbs(VerbsError),
    Protocol(Violation),
    WorkRequest { status: u32, vendor_err: u32 },
}

/// `ct->close`: forget the connection, and free it unless a handler is running on it
/// (then only mark it; `call_handler` closes it when the handler returns).
///
/// # Safety
/// `c` must be a connection of ours that was not freed yet, on the main thread.
pub unsafe fn close(c: *mut RdmaConnection) {
    let key = ConnPtr(c);
    // Only the first close unregisters: a scheduled close comes back here from
    // call_handler, and a connection refused before it went live was never watched.
    if live_remove(key) {
        pending_remove(key);
        api::unwatch_fd((*c).conn.fd);
    }
    if (*c).conn.refs > 0 {
        (*c).conn.flags |= CONN_FLAG_CLOSE_SCHEDULED;
        return;
    }
    (*c).teardown();
    drop(Box::from_raw(c));
}
