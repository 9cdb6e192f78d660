//! The connection core's public types: failures, states, handlers, what reads and
//! writes answer, what a run asks of the driver.

use std::fmt;

use crate::protocol::Violation;

/// Why a connection failed (the server sees state ERROR and `last_errno`,
/// docs/protocol.md §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The peer broke the protocol: `EPROTO` (docs/protocol.md §6).
    Protocol(Violation),
    /// A work request completed with an error status while the peer was still there:
    /// a remote access error, RNR retries exhausted, a too-long SEND. `EIO`.
    WorkRequest { status: u32, vendor_err: u32 },
    /// A local verbs call failed (posting a work request, allocating the TX buffer);
    /// `errno` is what the call reported.
    Local { call: &'static str, errno: i32 },
    /// The peer acknowledged nothing we sent for `ticks` keepalive periods: it is gone
    /// without a disconnect (docs/protocol.md §5). `ETIMEDOUT`.
    PeerSilent { ticks: u32 },
    /// The server accepted a connect request and the client never completed the
    /// handshake (no ESTABLISHED) within `ticks` keepalive periods (docs/protocol.md §5).
    /// `ETIMEDOUT`.
    HandshakeTimeout { ticks: u32 },
}

impl Failure {
    /// The errno the server shows for it (`get_last_error`).
    pub fn errno(&self) -> i32 {
        match self {
            Failure::Protocol(_) => libc::EPROTO,
            Failure::WorkRequest { .. } => libc::EIO,
            Failure::Local { errno, .. } => *errno,
            Failure::PeerSilent { .. } | Failure::HandshakeTimeout { .. } => libc::ETIMEDOUT,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Protocol(v) => write!(f, "protocol violation: {v}"),
            Failure::WorkRequest { status, vendor_err } => {
                write!(f, "work request failed (ibv_wc_status {status}, vendor error {vendor_err:#x})")
            }
            Failure::Local { call, errno } => write!(f, "{call} failed (errno {errno})"),
            Failure::PeerSilent { ticks } => write!(
                f,
                "the peer acknowledged nothing for {ticks} keepalive periods ({} s): it is gone",
                keepalive_secs(*ticks)
            ),
            Failure::HandshakeTimeout { ticks } => write!(
                f,
                "the client did not complete the connection handshake within {ticks} keepalive periods ({} s)",
                keepalive_secs(*ticks)
            ),
        }
    }
}

impl std::error::Error for Failure {}

/// `ticks` keepalive periods in seconds, for the log lines.
fn keepalive_secs(ticks: u32) -> u64 {
    u64::from(ticks) * crate::protocol::KEEPALIVE_MS / 1000
}

/// The connection's life. Only forward moves exist: `Accepting → Established →
/// PeerClosed | Failed → Closed`, with shortcuts (a peer may leave or fail before
/// ESTABLISHED; `Closed` is reachable from anywhere).
///
/// An explicit tag: without it the state would be encoded in the failure's spare values, and each of
/// the several questions the data path asks of it per request would decode them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// The CM's ESTABLISHED has not been seen. The QP is already usable (rdma_accept
    /// moves it to RTS), so data may arrive and be read; nothing can be written, since
    /// our RegisterXferMemory must go first (docs/protocol.md §1).
    Accepting,
    /// ESTABLISHED seen and our RegisterXferMemory queued.
    Established,
    /// The peer left (DISCONNECTED and friends, docs/protocol.md §1). Bytes it wrote
    /// before leaving are still read; then `read` reports EOF (docs/server-abi.md §4.2).
    PeerClosed,
    /// A failure ended the connection; `read`/`write` report it (state ERROR).
    Failed(Failure),
    /// Closed locally (`ct->close`, or the client dropped its stream). Terminal: no
    /// handler runs any more and every input is ignored.
    Closed,
}

/// The value of the server's `conn->state` for the connection (docs/server-abi.md §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Accepting,
    Connected,
    Closed,
    Error,
}

/// A server handler the core asks the driver to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Read,
    Write,
}

/// `postpone_update_state`'s mask (docs/server-abi.md §4.5): while an IO thread owns
/// the client, the handlers it names must not run from the main thread. Kept as the
/// server's mask: the transport hands it to the core at every lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Postpone(u8);

impl Postpone {
    pub const NONE: Postpone = Postpone(0);
    pub const READ: Postpone = Postpone(1);
    pub const WRITE: Postpone = Postpone(2);
    pub const BOTH: Postpone = Postpone(3);

    /// 9.1.2's mask: `CONN_POSTPONE_READ` 1, `CONN_POSTPONE_WRITE` 2 (other bits ignored).
    pub fn from_mask(mask: i32) -> Postpone {
        Postpone((mask & 3) as u8)
    }

    /// The mask [`from_mask`](Self::from_mask) reads.
    pub fn mask(self) -> i32 {
        i32::from(self.0)
    }

    /// The read handler must not run from the main thread.
    pub fn read(self) -> bool {
        self.0 & 1 != 0
    }

    /// The write handler must not run from the main thread.
    pub fn write(self) -> bool {
        self.0 & 2 != 0
    }
}

/// Why [`Conn::read`] returned no bytes (docs/server-abi.md §4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Nothing unread now (-1, EAGAIN, state CONNECTED): a completion will tell.
    WouldBlock,
    /// The peer left and every byte it sent was read (-1, state CLOSED).
    Eof,
    /// The connection failed (-1, state ERROR).
    Failed(Failure),
    /// Closed locally: the caller holds a connection it closed.
    Closed,
}

/// Why [`Conn::write`] took nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// Nothing can be taken now; `write` returns 0 and the write handler stays
    /// installed (docs/server-abi.md §4.2). The reason tells what reopens it.
    WouldBlock(Blocked),
    /// The peer left (-1, state CLOSED).
    PeerClosed,
    /// The connection failed (-1, state ERROR).
    Failed(Failure),
    /// Closed locally.
    Closed,
}

/// What keeps a write from moving bytes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// ESTABLISHED not seen yet (docs/protocol.md §1).
    NotEstablished,
    /// The peer's window is used up, or it has not registered its RX buffer yet: the
    /// peer's RegisterXferMemory reopens it (docs/protocol.md §4.1, §4.3).
    WindowExhausted,
    /// 64 or fewer send-queue entries left: a signalled send completion frees them
    /// (docs/protocol.md §4.5).
    SendQueueFull,
    /// A zero-length write.
    Empty,
}

/// A reserved piece of the peer's window: copy `len` bytes into the TX buffer at
/// `offset` and post one RDMA_WRITE_WITH_IMM to `remote_addr + offset` with `rkey`
/// and immediate `len` (docs/protocol.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteGrant {
    pub offset: u32,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// What a received control message means for the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Nothing to do (also: ignored because the connection is failed or closed). An
    /// answer, if one is due, is queued for [`Conn::poll_control`].
    Nothing,
    /// An RDMA write of the peer's landed (its bytes are readable now; the server counts them).
    Data,
    /// A Keepalive (clients count them).
    Keepalive,
    /// The server answered GetServerFeature (client side).
    ServerFeatures(u64),
    /// The client asked for features we do not have; ignored, as upstream does.
    UnsupportedFeatures(u64),
    /// The TX window is open again at offset 0. With `resized`, the driver must make its
    /// TX buffer `len` bytes long before its next write (docs/protocol.md §2, §3.2).
    PeerRxRegistered { len: u32, resized: bool },
}

/// `ct->accept` on a connection that cannot be accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptError {
    /// `accept` was already called.
    AlreadyAccepted,
    /// The peer left or the connection failed or was closed before the server accepted
    /// it: `accept` returns C_ERR and the server frees the client.
    Gone,
}

/// One step of a run, from [`Conn::next_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Call this server handler now, then [`Conn::handler_returned`].
    Call(Handler),
    /// The run is over. `pending`: put the connection on the pending list, so that
    /// `process_pending_data` runs it again without an fd event (docs/server-abi.md §4.3).
    Done { pending: bool },
}

/// A read handler called by [`Conn::plain_read_call`], for
/// [`Conn::plain_read_returned`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainRead {
    /// `bytes_read` before the call: whether it made progress.
    pub(super) before: u64,
    /// The runs begun before the call: whether one nested in it.
    pub(super) runs: u32,
}

/// What the driver does after a handler returned (connhelpers.h `callHandler`,
/// docs/server-abi.md §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterHandler {
    /// Go on.
    Continue,
    /// The handler closed the connection and no other handler is on the stack:
    /// tear it down and free it now; touch nothing after.
    FreeNow,
    /// Closed, but an outer handler is still running: it frees when it returns.
    Closed,
}

/// What `ct->close` must do (docs/server-abi.md §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseOutcome {
    /// First close: remove the connection from the live set and the pending list and
    /// unwatch its fd. Exactly once per connection.
    pub unregister: bool,
    /// No handler is running: tear down and free now. Otherwise the close is scheduled
    /// (CONN_FLAG_CLOSE_SCHEDULED) and [`Conn::handler_returned`] says when to free.
    /// Exactly once per connection.
    pub free_now: bool,
}

/// Where the RX buffer is, for RegisterXferMemory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxBuffer {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// What the endpoint saw at a keepalive tick, and whether this period is the turn of a
/// quiet connection (docs/protocol.md §5): the inputs of [`Conn::keepalive_tick`](super::Conn::keepalive_tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickFacts {
    /// The ticks in a row at which sends were in flight and none completed.
    pub unacknowledged_ticks: u32,
    /// Data writes were posted since the last tick and some send completed in it.
    pub busy_and_acknowledged: bool,
    /// No send work request is in flight: nothing of ours waits for the peer's NIC.
    pub nothing_in_flight: bool,
    /// This period is the connection's turn to be probed while quiet (the keepalive
    /// schedule's, `transport::keepalive_schedule`).
    pub quiet_turn: bool,
}

#[cfg(test)]
impl TickFacts {
    /// A tick with nothing unanswered, busy or not, at a quiet connection's turn: every
    /// connection that is not busy gets its Keepalive.
    pub fn every_period(busy_and_acknowledged: bool) -> TickFacts {
        TickFacts { unacknowledged_ticks: 0, busy_and_acknowledged, nothing_in_flight: true, quiet_turn: true }
    }
}
