//! One connection of Valkey Over RDMA as a pure, deterministic state machine, in the
//! manner of quinn-proto's `Connection`: no syscalls, no verbs, no threads, no clocks.
//!
//! The transport (server: `src/transport/connection.rs`; client: `src/client/mod.rs`)
//! owns the verbs objects and the server's `connection` struct; this core owns every
//! *decision*: the connection's state, both byte windows ([`Session`]), the control
//! messages to send, which server handlers are installed, the IO-thread postpone mask,
//! and which handler must run when. Those decisions are where a connection type goes
//! wrong (closing twice, a connection live before its fd is watched, multi-block replies
//! that stall, bytes received before a disconnect dropped), and all of them are
//! exercised in memory: see the simulator (`sim.rs`, `cargo test --lib protocol::conn`),
//! which drives this core through the production driver (`protocol::driver`).
//!
//! **Inputs** are method calls: CM events ([`Conn::on_established`],
//! [`Conn::on_disconnected`]), completions ([`Conn::on_control`], [`Conn::on_data`],
//! [`Conn::on_work_request_failed`]), local verbs errors ([`Conn::on_local_error`]),
//! the application's [`Conn::read`] / [`Conn::write`], handler registrations
//! ([`Conn::set_read_handler`], [`Conn::set_write_handler`]), the IO threads'
//! [`Conn::postpone`], the keepalive tick, and `ct->accept` / `ct->close`.
//!
//! **Outputs** are polled: [`Conn::poll_control`] (a control message to post), and the
//! handler schedule: one *run* (what the completion-fd callback or
//! `process_pending_data` does) is [`Conn::begin_run`], then [`Conn::next_step`] until it
//! says [`Step::Done`], calling the handler it names and reporting its return with
//! [`Conn::handler_returned`]. [`Step::Done`] says whether the connection goes on the
//! pending list; outside a run, [`Conn::wants_pending`] answers the same question for
//! `set_*_handler`, `update_state`, CM events and the keepalive tick (`queue_if_due`).
//!
//! Errors are typed ([`Failure`], [`ReadError`], [`WriteError`]); a failure is returned
//! as `Err` exactly once, by the input that caused it, so the driver logs one line.
//!
//! Sections cited: `docs/protocol.md §N` and `docs/server-abi.md §N`.

use std::collections::VecDeque;
use std::ops::Range;

use super::session::{Role, Session, SessionEvent};
use super::window::{RxWindow, TxWindow};
use super::{ControlMessage, Violation};

mod rx_growth;
mod scheduler;
mod types;

use rx_growth::RxGrowth;
use scheduler::Run;
pub use types::*;

/// One connection's protocol and scheduling state. See the module documentation.
#[derive(Debug, Clone)]
pub struct Conn {
    state: State,
    session: Session,
    /// Server: `ct->accept` was called (conn->state left ACCEPTING). Clients start
    /// accepted: they have no server to hand the connection to.
    accepted: bool,
    /// What [`server_state`](Conn::server_state) and [`failure`](Conn::failure) say may
    /// have changed since [`take_state_change`](Conn::take_state_change) last asked:
    /// set by [`set_state`](Conn::set_state) and by the accept, so that the transport writes
    /// `conn->state` only when it has something new to say.
    state_changed: bool,
    control: VecDeque<ControlMessage>,
    read_handler: bool,
    write_handler: bool,
    barrier: bool,
    postponed: Postpone,
    /// Bytes handed to the application by `read`, and taken by `write`: a handler
    /// "made progress" when its counter moved (docs/server-abi.md §4.5, read loop guard).
    bytes_read: u64,
    bytes_written: u64,
    /// The driver stopped polling at its per-wake-up budget with completions left; the
    /// completion channel will not signal them again.
    completions_left: bool,
    /// Server: the largest RX buffer it may grow to at a hand-back (`rdma-rx-size`); the
    /// buffer starts smaller (docs/protocol.md §4.3, adaptive RX window).
    rx_cap: u32,
    /// Where growing the RX buffer stands (docs/protocol.md §4.3).
    rx_growth: RxGrowth,
    /// A hand-back just named the prepared buffer: the driver installs it
    /// ([`take_rx_swap`](Conn::take_rx_swap)).
    rx_swap_due: bool,
    /// Keepalive ticks seen while still `Accepting` (the handshake deadline,
    /// docs/protocol.md §5).
    accepting_ticks: u32,
    /// Handlers on the stack (connhelpers.h `refs`).
    depth: u32,
    freed: bool,
    run: Option<Run>,
    /// Runs begun (wrapping): a plain read call learns from it whether a run nested in
    /// its handler replaced its own ([`plain_read_returned`](Conn::plain_read_returned)).
    runs: u32,
}

impl Conn {
    /// A connection whose QP exists and whose receives are posted: the server's at
    /// CONNECT_REQUEST (docs/protocol.md §1), the client's before `rdma_connect`.
    pub fn new(role: Role, rx: RxBuffer) -> Conn {
        Conn {
            state: State::Accepting,
            session: Session::new(role, rx.addr, rx.len, rx.key),
            accepted: role == Role::Client,
            state_changed: true,
            control: VecDeque::new(),
            read_handler: false,
            write_handler: false,
            barrier: false,
            postponed: Postpone::NONE,
            bytes_read: 0,
            bytes_written: 0,
            completions_left: false,
            rx_cap: rx.len,
            rx_growth: RxGrowth::None,
            rx_swap_due: false,
            accepting_ticks: 0,
            depth: 0,
            freed: false,
            run: None,
            runs: 0,
        }
    }

    // ----- what the driver and the server read -------------------------------------

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Whether the server accepted the connection (`ct->accept`).
    pub fn was_accepted(&self) -> bool {
        self.accepted
    }

    pub fn role(&self) -> Role {
        self.session.role()
    }

    /// `conn->state` as the server must see it.
    pub fn server_state(&self) -> ServerState {
        match self.state {
            State::Accepting | State::Established if !self.accepted => ServerState::Accepting,
            State::Accepting | State::Established => ServerState::Connected,
            State::PeerClosed | State::Closed => ServerState::Closed,
            State::Failed(_) => ServerState::Error,
        }
    }

    /// Whether the server state or the failure may have changed since the last call
    /// (the first call: true). A caller that publishes the state publishes it then.
    #[inline]
    pub fn take_state_change(&mut self) -> bool {
        std::mem::take(&mut self.state_changed)
    }

    pub fn failure(&self) -> Option<&Failure> {
        match &self.state {
            State::Failed(f) => Some(f),
            _ => None,
        }
    }

    pub fn rx(&self) -> &RxWindow {
        &self.session.rx
    }

    pub fn tx(&self) -> &TxWindow {
        &self.session.tx
    }

    pub fn postponed(&self) -> Postpone {
        self.postponed
    }

    pub fn has_read_handler(&self) -> bool {
        self.read_handler
    }

    pub fn has_write_handler(&self) -> bool {
        self.write_handler
    }

    pub fn write_barrier(&self) -> bool {
        self.barrier
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn is_live(&self) -> bool {
        matches!(self.state, State::Accepting | State::Established)
    }

    /// The peer left and everything it sent was read: what is left is EOF
    /// (docs/server-abi.md §4.2: bytes before the disconnect come first, as with TCP).
    fn at_eof(&self) -> bool {
        matches!(self.state, State::PeerClosed) && !self.session.rx.has_unread()
    }

    /// The server must be told the connection is over: its next `read` fails.
    fn terminal_due(&self) -> bool {
        matches!(self.state, State::Failed(_)) || self.at_eof()
    }

    fn read_runnable(&self) -> bool {
        self.read_handler && !self.postponed.read()
    }

    fn terminal_runnable(&self) -> bool {
        self.read_runnable() || (self.write_handler && !self.postponed.write())
    }

    /// The write handler would move bytes now: installed, not postponed, established,
    /// window left and send-queue room (docs/server-abi.md §4.3).
    fn write_due(&self, sq_room: bool) -> bool {
        self.write_handler
            && !self.postponed.write()
            && matches!(self.state, State::Established)
            && self.session.tx.available() > 0
            && sq_room
    }

    // ----- CM events ---------------------------------------------------------------

    /// `ct->accept`: the server takes the connection (ACCEPTING → CONNECTED,
    /// docs/protocol.md §1 step 5). The driver then calls the accept handler between
    /// [`enter_handler`](Self::enter_handler) and [`handler_returned`](Self::handler_returned).
    pub fn on_accepted(&mut self) -> Result<(), AcceptError> {
        if self.accepted {
            return Err(AcceptError::AlreadyAccepted);
        }
        if !self.is_live() {
            return Err(AcceptError::Gone);
        }
        self.accepted = true;
        self.state_changed = true;
        Ok(())
    }

    /// RDMA_CM_EVENT_ESTABLISHED: advertise our RX buffer (docs/protocol.md §1, §4.3).
    /// A repeated event, or one after the connection ended, is ignored.
    pub fn on_established(&mut self) {
        if matches!(self.state, State::Accepting) {
            self.set_state(State::Established);
            self.control.push_back(self.session.register_rx());
        }
    }

    /// The peer left: DISCONNECTED, TIMEWAIT_EXIT, DEVICE_REMOVAL, CONNECT_ERROR,
    /// UNREACHABLE, REJECTED, ADDR_CHANGE (docs/protocol.md §1). The driver then drains
    /// the completion queue into the core: the peer's last writes complete before the
    /// flush errors, so their bytes are read before EOF, and the flush errors are no
    /// failure. Unsent control messages are dropped. Returns whether the state changed.
    pub fn on_disconnected(&mut self) -> bool {
        if self.is_live() {
            self.set_state(State::PeerClosed);
            self.control.clear();
            return true;
        }
        false
    }

    // ----- completions -------------------------------------------------------------

    /// A violation found outside the messages themselves (the endpoint's bounds, e.g.
    /// TX buffers held for the peer): fails the connection like one in a message.
    pub fn on_violation(&mut self, v: Violation) -> Failure {
        self.fail(Failure::Protocol(v))
    }

    /// Every change of the state goes through here, so that each is reported to
    /// [`take_state_change`](Self::take_state_change).
    fn set_state(&mut self, state: State) {
        self.state = state;
        self.state_changed = true;
    }

    fn fail(&mut self, f: Failure) -> Failure {
        self.set_state(State::Failed(f.clone()));
        self.control.clear();
        f
    }

    /// A SEND arrived in a receive slot; `bytes` is what its completion reports
    /// (`byte_len` bytes of the slot). A violation fails the connection, also after the
    /// peer left: its stream is corrupt, EOF would claim it was whole (docs/protocol.md
    /// §6). On a failed or closed connection the message is ignored ("the remaining
    /// completions of that batch are dropped").
    pub fn on_control(&mut self, bytes: &[u8]) -> Result<Received, Failure> {
        if matches!(self.state, State::Failed(_) | State::Closed) {
            return Ok(Received::Nothing);
        }
        match self.session.on_control(bytes) {
            Err(v) => Err(self.fail(Failure::Protocol(v))),
            Ok(SessionEvent::None) => Ok(Received::Nothing),
            Ok(SessionEvent::Keepalive) => Ok(Received::Keepalive),
            Ok(SessionEvent::Reply(m)) => {
                // GetServerFeature's answer (docs/protocol.md §3.2); pointless once the
                // peer is gone.
                if self.is_live() {
                    self.control.push_back(m);
                }
                Ok(Received::Nothing)
            }
            Ok(SessionEvent::PeerRxRegistered { len, resized }) => Ok(Received::PeerRxRegistered { len, resized }),
            Ok(SessionEvent::ServerFeatures(f)) => Ok(Received::ServerFeatures(f)),
            Ok(SessionEvent::UnsupportedFeatures(f)) => Ok(Received::UnsupportedFeatures(f)),
        }
    }

    /// An RDMA_WRITE_WITH_IMM completed in our RX buffer with immediate `imm`
    /// (docs/protocol.md §4.2). Past the window: `RxOverrun` (upstream asserts, §7).
    /// Accepted after the peer left: those are the bytes it wrote before leaving.
    pub fn on_data(&mut self, imm: u32) -> Result<(), Failure> {
        if matches!(self.state, State::Failed(_) | State::Closed) {
            return Ok(());
        }
        self.session.on_data(imm).map_err(|v| self.fail(Failure::Protocol(v)))?;
        // A peer that has written half of a buffer below the cap, in few enough writes,
        // gets the next size prepared now, so that it is ready at this buffer's
        // hand-back (docs/protocol.md §4.3). Asked at every write from half on: a run
        // of small commands may be followed by a large value that fills the rest.
        self.want_larger_rx_if_outgrown();
        Ok(())
    }

    /// Adaptive RX window (docs/protocol.md §4.3): once the peer has written half of the
    /// current buffer, every hand-back holds one of its writes up for a round trip; when
    /// that is more than 1 in [`RX_GROWTH_MAX_WRITES`](super::RX_GROWTH_MAX_WRITES) of
    /// them (writes averaging at least 1/128 of the buffer), the next size is wanted,
    /// unless one is already on its way or the buffer is at the cap.
    fn want_larger_rx_if_outgrown(&mut self) {
        let rx = &self.session.rx;
        let (len, written, writes) = (rx.len(), rx.written(), rx.writes());
        let outgrown = written >= len / 2
            && u64::from(writes) * u64::from(len) <= u64::from(super::RX_GROWTH_MAX_WRITES) * u64::from(written);
        if outgrown && self.rx_growth == RxGrowth::None && len < self.rx_cap {
            self.rx_growth = RxGrowth::Wanted(self.next_rx_size());
        }
    }

    /// After each poll of the completion queue: `left` when the poll stopped at the
    /// driver's per-wake-up budget (a peer flooding Keepalives must not keep the main
    /// thread in one connection's drain). The channel will not signal the rest, so the
    /// connection stays due (pending) until a poll comes back short.
    pub fn set_completions_left(&mut self, left: bool) {
        self.completions_left = left;
    }

    pub fn completions_left(&self) -> bool {
        self.completions_left
    }

    /// A work request completed with an error status. Only a live connection fails:
    /// after the peer left these are flushes, no news (docs/protocol.md §6), and a
    /// failed connection keeps its first reason.
    pub fn on_work_request_failed(&mut self, status: u32, vendor_err: u32) -> Result<(), Failure> {
        if !self.is_live() {
            return Ok(());
        }
        Err(self.fail(Failure::WorkRequest { status, vendor_err }))
    }

    /// A local verbs call failed: posting a write or a control message, allocating the
    /// TX buffer. Same rule as [`on_work_request_failed`](Self::on_work_request_failed).
    pub fn on_local_error(&mut self, call: &'static str, errno: i32) -> Result<(), Failure> {
        if !self.is_live() {
            return Ok(());
        }
        Err(self.fail(Failure::Local { call, errno }))
    }

    // ----- the data path -----------------------------------------------------------

    /// The unread bytes as a range of the RX buffer, without consuming them (for a
    /// relay that consumes only what its sink took). Errors as [`read`](Self::read).
    pub fn readable(&self) -> Result<Range<usize>, ReadError> {
        match &self.state {
            State::Closed => Err(ReadError::Closed),
            State::Failed(f) => Err(ReadError::Failed(f.clone())),
            _ if self.at_eof() => Err(ReadError::Eof),
            _ => {
                let r = self.session.rx.readable();
                if r.is_empty() {
                    Err(ReadError::WouldBlock)
                } else {
                    Ok(r)
                }
            }
        }
    }

    /// Marks `n` bytes of [`readable`](Self::readable) as read. When that empties a full
    /// RX buffer, RegisterXferMemory is queued to hand it back (docs/protocol.md §4.3),
    /// unless the peer is gone. The driver must copy the bytes out *before* posting the
    /// queued message: the peer writes over them once it has it.
    ///
    /// A server whose RX buffer is below its cap ([`set_rx_cap`](Self::set_rx_cap)),
    /// and whose client fills it in few writes (at most
    /// [`RX_GROWTH_MAX_WRITES`](super::RX_GROWTH_MAX_WRITES)), grows it, without making
    /// the peer wait and without blocking the event loop for
    /// the registration (a 1 MiB one took the p99 latency of every connection with it):
    /// the first full buffer is handed back as it is, and the driver is asked
    /// ([`take_rx_growth_wanted`](Self::take_rx_growth_wanted)) to prepare one
    /// [`RX_GROWTH_FACTOR`](super::RX_GROWTH_FACTOR) times larger off the event loop. Once it is ready
    /// ([`rx_growth_ready`](Self::rx_growth_ready)), the next hand-back names it instead
    /// of the old one, and the driver swaps it in ([`take_rx_swap`](Self::take_rx_swap)).
    #[inline]
    pub fn consume(&mut self, n: usize) {
        if matches!(self.state, State::Failed(_) | State::Closed) {
            return;
        }
        let n = n.min(self.session.rx.readable().len());
        self.bytes_read += n as u64;
        if self.session.rx.consume(n) {
            self.hand_back_rx();
        }
    }

    /// [`consume`](Self::consume) emptied the full RX buffer: RegisterXferMemory for it,
    /// or for the grown buffer ready to replace it (once per buffer's worth of bytes).
    #[cold]
    #[inline(never)]
    fn hand_back_rx(&mut self) {
        if !self.is_live() {
            return;
        }
        if let RxGrowth::Ready(b) = self.rx_growth {
            // The peer filled the old buffer completely and waits for this
            // message: none of its writes can still target the old one.
            self.rx_growth = RxGrowth::None;
            self.session.replace_rx(b.addr, b.len, b.key);
            self.rx_swap_due = true;
        }
        self.control.push_back(self.session.register_rx());
    }

    /// [`read`](Self::read)'s usual case, decided in one test: an established
    /// connection whose unread bytes do not finish the RX buffer, with no RX growth under
    /// way and no control message queued. Then a read only moves the window, and the
    /// driver need not ask about hand-backs, swaps or growth after the copy. `None`:
    /// anything else (the driver then calls [`read`](Self::read), which handles every
    /// case, this one included).
    #[inline(always)]
    pub fn read_plain(&mut self, max: usize) -> Option<Range<usize>> {
        if !matches!(self.state, State::Established)
            || !matches!(self.rx_growth, RxGrowth::None)
            || self.rx_swap_due
            || !self.control.is_empty()
        {
            return None;
        }
        let r = self.session.rx.readable();
        let n = r.len().min(max);
        // (the read that finishes the buffer hands it back: `read`'s case)
        if n == 0 || r.start + n == self.session.rx.len() as usize {
            return None;
        }
        self.session.rx.consume(n);
        self.bytes_read += n as u64;
        Some(r.start..r.start + n)
    }

    /// `read` (main thread or IO thread): up to `max` unread bytes, as the range of the
    /// RX buffer to copy; they count as consumed at once. See
    /// [`consume`](Self::consume) for the ordering with [`poll_control`](Self::poll_control).
    pub fn read(&mut self, max: usize) -> Result<Range<usize>, ReadError> {
        let r = self.readable()?;
        let r = r.start..r.start + r.len().min(max);
        self.consume(r.len());
        Ok(r)
    }

    /// The bytes a write would take now (the client's `write_room`).
    pub fn write_room(&self, sq_room: bool) -> usize {
        if matches!(self.state, State::Established) && sq_room {
            self.session.tx.available() as usize
        } else {
            0
        }
    }

    /// Where the next write would land in the peer's RX buffer: the sender's TX buffer
    /// mirrors it (docs/protocol.md §4.3), and the driver may take less than a write
    /// offers so that one work request spans at most two registered chunks of it.
    pub fn tx_offset(&self) -> u32 {
        self.session.tx.offset()
    }

    /// `write`/`writev` (main thread or IO thread): reserves up to `len` bytes of the
    /// peer's window. `sq_room`: the send queue has more than the entries kept for
    /// control messages (docs/protocol.md §4.5). The bytes count as written once
    /// granted; if posting then fails, report it with [`on_local_error`](Self::on_local_error).
    pub fn write(&mut self, len: usize, sq_room: bool) -> Result<WriteGrant, WriteError> {
        if matches!(self.state, State::Established) && len > 0 && sq_room {
            if let Some((offset, n)) = self.session.tx.reserve(len) {
                self.bytes_written += u64::from(n);
                return Ok(WriteGrant {
                    offset,
                    len: n,
                    remote_addr: self.session.tx.remote_addr,
                    rkey: self.session.tx.rkey,
                });
            }
        }
        Err(self.why_not_written(len, sq_room))
    }

    /// Why [`write`](Self::write) granted nothing (out of line: the usual write is
    /// granted, and its caller need not carry this match).
    #[cold]
    #[inline(never)]
    fn why_not_written(&self, len: usize, sq_room: bool) -> WriteError {
        match &self.state {
            State::Closed => WriteError::Closed,
            State::Failed(f) => WriteError::Failed(f.clone()),
            State::PeerClosed => WriteError::PeerClosed,
            State::Accepting => WriteError::WouldBlock(Blocked::NotEstablished),
            State::Established if len == 0 => WriteError::WouldBlock(Blocked::Empty),
            State::Established if !sq_room => WriteError::WouldBlock(Blocked::SendQueueFull),
            State::Established => WriteError::WouldBlock(Blocked::WindowExhausted),
        }
    }

    // ----- control messages --------------------------------------------------------

    /// The next control message to post (always signalled, docs/protocol.md §3.3). Drain
    /// it after every input that may queue one: `on_established`, `on_control`, `read`
    /// / `consume`, `keepalive_tick`, `send_control`. A failed post goes to
    /// [`on_local_error`](Self::on_local_error).
    pub fn poll_control(&mut self) -> Option<ControlMessage> {
        if self.is_live() {
            self.control.pop_front()
        } else {
            None
        }
    }

    /// Whether control messages are queued ([`poll_control`](Self::poll_control) may
    /// still hold them back, from a connection that is not live).
    pub fn has_control(&self) -> bool {
        !self.control.is_empty()
    }

    /// Queues a message of the client's own (GetServerFeature, SetClientFeature).
    pub fn send_control(&mut self, msg: ControlMessage) {
        if self.is_live() {
            self.control.push_back(msg);
        }
    }

    /// The connection's keepalive tick (docs/protocol.md §5), once per period: a server
    /// connection that is CONNECTED and has sent its RegisterXferMemory gets a Keepalive
    /// unless one of the rules below spares it. The driver then drains
    /// [`poll_control`](Self::poll_control) and asks [`wants_pending`](Self::wants_pending)
    /// (the tick is the pending list's safety net).
    ///
    /// `unacknowledged_ticks`: the periods in a row in which the send queue had work
    /// requests in flight and none completed (the driver's count, `verbs::TxBuffers`).
    /// At [`DEAD_PEER_TICKS`](super::DEAD_PEER_TICKS) the peer is gone: the connection
    /// fails (docs/protocol.md §5). Only an unanswered work request counts, so an idle
    /// peer, or one whose process stopped, is never closed by it: its NIC answers.
    ///
    /// `busy_and_acknowledged`: this connection wrote to the peer since the last tick
    /// and the peer's NIC acknowledged some of it. Such a peer is alive, and a Keepalive
    /// would only cost a doorbell per busy connection per period. So it gets none.
    ///
    /// `nothing_in_flight` and `quiet_turn`: a quiet connection (nothing in flight) is
    /// probed only at its turn, which the transport's schedule gives each connection
    /// once every so many periods, so that the Keepalives of thousands of idle
    /// connections stay within a bounded number per period. One with work in flight is
    /// probed at every tick: its signalled Keepalive is what completes the unsignalled
    /// writes before it, and without it those would count as unanswered.
    ///
    /// A server connection still `Accepting` at its [`HANDSHAKE_TICKS`](super::HANDSHAKE_TICKS)th
    /// tick fails too: the client never completed the handshake, and the CM would hold
    /// the connection for minutes before giving up by itself (docs/protocol.md §5).
    pub fn keepalive_tick(&mut self, at: TickFacts) -> Result<(), Failure> {
        if self.is_live() && at.unacknowledged_ticks >= super::DEAD_PEER_TICKS {
            return Err(self.fail(Failure::PeerSilent { ticks: at.unacknowledged_ticks }));
        }
        if self.session.role() != Role::Server {
            return Ok(());
        }
        match self.state {
            State::Accepting => {
                self.accepting_ticks += 1;
                if self.accepting_ticks >= super::HANDSHAKE_TICKS {
                    return Err(self.fail(Failure::HandshakeTimeout { ticks: self.accepting_ticks }));
                }
            }
            State::Established
                if self.accepted && !at.busy_and_acknowledged && (at.quiet_turn || !at.nothing_in_flight) =>
            {
                self.control.push_back(ControlMessage::Keepalive)
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "sim.rs"]
mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    fn rx() -> RxBuffer {
        RxBuffer { addr: 0x1000, len: 100, key: 7 }
    }

    fn established_server() -> Conn {
        established_server_with(rx())
    }

    fn established_server_with(rx: RxBuffer) -> Conn {
        let mut c = Conn::new(Role::Server, rx);
        c.set_read_handler(true);
        c.on_accepted().unwrap();
        c.on_established();
        assert_eq!(
            c.poll_control(),
            Some(ControlMessage::RegisterXferMemory { addr: rx.addr, length: rx.len, key: rx.key })
        );
        let reg = ControlMessage::RegisterXferMemory { addr: 0x9000, length: 50, key: 3 }.encode();
        assert_eq!(c.on_control(&reg), Ok(Received::PeerRxRegistered { len: 50, resized: true }));
        c
    }

    /// Runs once; `f` plays the handler. Returns the handlers called and `pending`.
    fn run(c: &mut Conn, sq_room: bool, mut f: impl FnMut(&mut Conn, Handler)) -> (Vec<Handler>, bool) {
        c.begin_run();
        let mut called = vec![];
        loop {
            match c.next_step(|| sq_room) {
                Step::Call(h) => {
                    called.push(h);
                    f(c, h);
                    assert_eq!(c.handler_returned(), AfterHandler::Continue);
                }
                Step::Done { pending } => return (called, pending),
            }
        }
    }

    /// The transport writes `conn->state` only when the core reports a change
    /// (`take_state_change`): every input that changes what the server sees reports it,
    /// and the data path, which changes nothing, does not.
    #[test]
    fn every_change_of_what_the_server_sees_is_reported_once_and_data_is_not() {
        let mut c = Conn::new(Role::Server, rx());
        assert!(c.take_state_change(), "the first state is yet to be published");
        assert!(!c.take_state_change(), "reported once");
        c.set_read_handler(true);
        c.on_accepted().unwrap();
        assert!(c.take_state_change(), "accepted: CONNECTED");
        c.on_established();
        assert!(c.take_state_change(), "established");
        c.on_established();
        assert!(!c.take_state_change(), "a repeated ESTABLISHED changes nothing");
        c.poll_control();
        let reg = ControlMessage::RegisterXferMemory { addr: 0x9000, length: 50, key: 3 }.encode();
        c.on_control(&reg).unwrap();
        c.on_data(10).unwrap();
        c.read(4).unwrap();
        c.write(5, true).unwrap();
        assert!(!c.take_state_change(), "data in and out changes nothing the server sees");
        assert!(c.on_disconnected());
        assert!(c.take_state_change(), "the peer left");
        c.close();
        assert!(c.take_state_change(), "closed");

        let mut c = established_server();
        c.take_state_change();
        assert!(c.on_data(1000).is_err());
        assert!(c.take_state_change(), "a violation fails the connection");
        let mut c = established_server();
        c.take_state_change();
        assert!(c.on_local_error("ibv_post_send", libc::EIO).is_err());
        assert!(c.take_state_change(), "a local error fails it");
        let mut c = established_server();
        c.take_state_change();
        assert!(c.on_work_request_failed(5, 0).is_err());
        assert!(c.take_state_change(), "a failed work request fails it");
    }

    /// The usual run decided in one test (`plain_read_call`) ends as the run begun would,
    /// whatever the read handler does; `plain_read_returned` also checks itself against
    /// that run in the tests. The nested run is the one case the simulator does not make.
    #[test]
    fn a_plain_read_run_ends_as_the_run_it_stands_for() {
        type Change = fn(&mut Conn);
        let done = Ok(Step::Done { pending: false });
        let cases: [(&str, Change, Result<Step, AfterHandler>); 6] = [
            ("reads everything", |c| assert_eq!(c.read(100), Ok(0..10)), done),
            ("reads part", |c| assert_eq!(c.read(4), Ok(0..4)), Ok(Step::Call(Handler::Read))),
            ("reads nothing", |_| {}, done),
            (
                "installs a write handler",
                |c| {
                    c.read(100).unwrap();
                    c.set_write_handler(true, false);
                },
                Ok(Step::Call(Handler::Write)),
            ),
            (
                "closes",
                |c| {
                    c.close();
                },
                Err(AfterHandler::FreeNow),
            ),
            (
                "runs a nested run that leaves bytes unread",
                |c| {
                    c.read(100).unwrap();
                    c.on_data(5).unwrap();
                    assert_eq!(run(c, true, |_, _| {}), (vec![Handler::Read], false));
                },
                done,
            ),
        ];
        for (what, handler, want) in cases {
            let mut c = established_server();
            c.on_data(10).unwrap();
            let call = c.plain_read_call().expect("a plain read call");
            handler(&mut c);
            let got = c.plain_read_returned(call).map(|step| step.unwrap_or_else(|| c.next_step(|| true)));
            assert_eq!(got, want, "the handler {what}");
        }
        let not_plain: [(&str, Change); 4] = [
            ("nothing unread", |c| assert_eq!(c.read(100), Ok(0..10))),
            ("a write barrier", |c| c.set_write_handler(true, true)),
            ("the read handler postponed", |c| c.postpone(Postpone::from_mask(1))),
            ("the peer gone", |c| assert!(c.on_disconnected())),
        ];
        for (what, change) in not_plain {
            let mut c = established_server();
            c.on_data(10).unwrap();
            change(&mut c);
            assert_eq!(c.plain_read_call(), None, "{what}");
        }
    }

    #[test]
    fn multi_block_reply_stays_pending_while_it_writes_and_not_when_it_cannot() {
        let mut c = established_server();
        c.set_write_handler(true, false);
        assert!(c.wants_pending(true));
        let (called, pending) = run(&mut c, true, |c, _| {
            c.write(20, true).unwrap();
        });
        assert_eq!(called, vec![Handler::Write]);
        assert!(pending, "wrote, window open: run again without an fd event");
        let (_, pending) = run(&mut c, true, |c, _| {
            c.write(30, true).unwrap();
        });
        assert!(!pending, "window used up: the peer's RegisterXferMemory runs it");
        assert!(!c.wants_pending(true));
        // window reopened, send queue full: nothing due, no spinning
        let reg = ControlMessage::RegisterXferMemory { addr: 0x9000, length: 50, key: 3 }.encode();
        c.on_control(&reg).unwrap();
        assert!(!c.wants_pending(false));
        assert_eq!(run(&mut c, false, |_, _| unreachable!()), (vec![], false));
        // a handler that writes nothing is not re-queued
        let (called, pending) = run(&mut c, true, |_, _| {});
        assert_eq!((called, pending), (vec![Handler::Write], false));
    }

    #[test]
    fn barrier_runs_write_first_and_read_loop_stops_without_progress() {
        let mut c = established_server();
        c.on_data(10).unwrap();
        c.set_write_handler(true, true);
        let mut reads = 0;
        let (called, _) = run(&mut c, true, |c, h| {
            if h == Handler::Read {
                reads += 1;
                if reads == 1 {
                    c.read(4).unwrap();
                }
            } else {
                c.write(1, true).unwrap();
            }
        });
        assert_eq!(called, vec![Handler::Write, Handler::Read, Handler::Read]);
        c.postpone(Postpone::READ);
        assert!(!c.wants_pending(false));
        assert_eq!(run(&mut c, false, |_, _| unreachable!()).0, vec![]);
        c.postpone(Postpone::NONE);
        assert!(c.update_state(false));
    }

    #[test]
    fn bytes_before_a_disconnect_are_read_before_eof_then_eof_once() {
        let mut c = established_server();
        c.on_data(10).unwrap();
        assert!(c.on_disconnected());
        assert_eq!(c.server_state(), ServerState::Closed);
        assert!(c.wants_pending(true));
        // flush errors after the peer left are no failure
        assert_eq!(c.on_work_request_failed(5, 0), Ok(()));
        c.set_write_handler(true, false);
        let mut got = vec![];
        let (called, pending) = run(&mut c, true, |c, h| match h {
            Handler::Read => got.push(c.read(6)),
            Handler::Write => assert_eq!(c.write(1, true), Err(WriteError::PeerClosed)),
        });
        assert_eq!(got, vec![Ok(0..6), Ok(6..10), Err(ReadError::Eof)], "bytes first, then EOF");
        assert_eq!(called, vec![Handler::Read, Handler::Read, Handler::Read, Handler::Write]);
        assert!(!pending, "the run told both handlers");
        let (called, pending) = run(&mut c, true, |_, _| {});
        assert_eq!((called, pending), (vec![Handler::Read, Handler::Write], false));
    }

    #[test]
    fn violations_fail_once_with_their_reason_and_close_frees_once() {
        let mut c = established_server();
        let f = c.on_data(101).unwrap_err();
        assert_eq!(f, Failure::Protocol(Violation::RxOverrun { offset: 0, imm: 101, len: 100 }));
        assert_eq!(f.errno(), libc::EPROTO);
        assert_eq!(c.on_control(&[0; 3]), Ok(Received::Nothing), "reported once");
        assert_eq!(c.read(1), Err(ReadError::Failed(f.clone())));
        assert!(c.wants_pending(true));
        c.begin_run();
        assert_eq!(c.next_step(|| true), Step::Call(Handler::Read));
        assert_eq!(c.close(), CloseOutcome { unregister: true, free_now: false });
        assert_eq!(c.close(), CloseOutcome { unregister: false, free_now: false });
        assert_eq!(c.handler_returned(), AfterHandler::FreeNow);
        assert_eq!(c.next_step(|| true), Step::Done { pending: false });
        assert_eq!(c.close(), CloseOutcome { unregister: false, free_now: false });
        assert!(!c.wants_pending(true));
    }

    #[test]
    fn accept_is_refused_after_the_peer_left_and_nothing_runs_before_it() {
        let mut c = Conn::new(Role::Server, rx());
        c.set_read_handler(true);
        c.on_data(5).unwrap();
        assert!(!c.wants_pending(true), "not accepted yet");
        assert_eq!(c.server_state(), ServerState::Accepting);
        c.on_disconnected();
        assert_eq!(c.on_accepted(), Err(AcceptError::Gone));
        let mut c = Conn::new(Role::Server, rx());
        c.on_accepted().unwrap();
        assert_eq!(c.on_accepted(), Err(AcceptError::AlreadyAccepted));
        assert_eq!(c.write(1, true), Err(WriteError::WouldBlock(Blocked::NotEstablished)));
        c.enter_handler();
        assert!(!c.close().free_now);
        assert_eq!(c.handler_returned(), AfterHandler::FreeNow);
    }

    #[test]
    fn full_and_consumed_buffer_is_handed_back_unless_the_peer_left() {
        let mut c = established_server();
        c.on_data(100).unwrap();
        assert_eq!(c.read(60), Ok(0..60));
        assert_eq!(c.poll_control(), None);
        assert_eq!(c.read(60), Ok(60..100));
        assert!(matches!(c.poll_control(), Some(ControlMessage::RegisterXferMemory { .. })));
        c.on_data(100).unwrap();
        c.on_disconnected();
        assert_eq!(c.read(100), Ok(0..100));
        assert_eq!(c.poll_control(), None);
        c.keepalive_tick(TickFacts::every_period(false)).unwrap();
        assert_eq!(c.poll_control(), None);
    }

    #[test]
    fn a_keepalive_goes_only_to_a_server_connection_not_shown_alive_since_the_last_tick() {
        let mut c = established_server();
        c.keepalive_tick(TickFacts::every_period(false)).unwrap();
        assert_eq!(c.poll_control(), Some(ControlMessage::Keepalive), "idle or unanswered: probed");
        c.keepalive_tick(TickFacts::every_period(true)).unwrap();
        assert_eq!(c.poll_control(), None, "busy and acknowledged: alive, no probe");
        c.keepalive_tick(TickFacts::every_period(false)).unwrap();
        assert_eq!(c.poll_control(), Some(ControlMessage::Keepalive), "probed again once it is not");
        // the dead-peer count still fails it, busy or not
        let f = c
            .keepalive_tick(TickFacts {
                unacknowledged_ticks: super::super::DEAD_PEER_TICKS,
                ..TickFacts::every_period(true)
            })
            .unwrap_err();
        assert!(matches!(f, Failure::PeerSilent { .. }));
    }

    /// Every combination of the tick's facts for an established server connection: a
    /// Keepalive exactly when it is not busy and either has work in flight or it is a
    /// quiet connection's turn.
    #[test]
    fn a_quiet_connection_is_probed_only_at_its_turn_and_one_with_work_in_flight_always() {
        for bits in 0..8u8 {
            let (busy, quiet, turn) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            let mut c = established_server();
            let at = TickFacts {
                unacknowledged_ticks: 0,
                busy_and_acknowledged: busy,
                nothing_in_flight: quiet,
                quiet_turn: turn,
            };
            c.keepalive_tick(at).unwrap();
            let probed = c.poll_control() == Some(ControlMessage::Keepalive);
            assert_eq!(probed, !busy && (!quiet || turn), "{at:?}");
            assert_eq!(c.poll_control(), None);
        }
        // off its turn, the dead-peer count still fails it
        let mut c = established_server();
        let silent = TickFacts {
            unacknowledged_ticks: super::super::DEAD_PEER_TICKS,
            busy_and_acknowledged: false,
            nothing_in_flight: false,
            quiet_turn: false,
        };
        assert!(matches!(c.keepalive_tick(silent), Err(Failure::PeerSilent { .. })));
    }

    /// The adaptive window's steps from the 100-byte test buffer: one growth step, then
    /// the cap, which is less than a second full step.
    const STEP1: u32 = 100 * super::super::RX_GROWTH_FACTOR;
    const CAP: u32 = 2 * STEP1 + 100;

    /// One input of the read side, for [`read_side_states`].
    #[derive(Clone, Copy)]
    enum ReadSide {
        Data(u32),
        Read(usize),
        QueueControl,
        PostControl,
        AskGrowth,
        GrowthReady,
        GrowthFailed,
        Swap,
        PeerLeft,
        Close,
    }

    impl ReadSide {
        fn apply(self, c: &mut Conn) {
            match self {
                ReadSide::Data(n) => _ = c.on_data(n),
                ReadSide::Read(n) => _ = c.read(n),
                ReadSide::QueueControl => c.send_control(ControlMessage::Keepalive),
                ReadSide::PostControl => _ = c.poll_control(),
                ReadSide::AskGrowth => _ = c.take_rx_growth_wanted(),
                ReadSide::GrowthReady => c.rx_growth_ready(Some(RxBuffer { addr: 0x5000, len: STEP1, key: 8 })),
                ReadSide::GrowthFailed => c.rx_growth_ready(None),
                ReadSide::Swap => _ = c.take_rx_swap(),
                ReadSide::PeerLeft => _ = c.on_disconnected(),
                ReadSide::Close => _ = c.close(),
            }
        }
    }

    /// Every state reached from an established server (an RX cap that lets it grow, or
    /// none) by up to `depth` inputs of the read side: data in, reads, control messages
    /// queued and posted, RX growth asked, prepared, failed and swapped, the peer leaving,
    /// a close.
    fn read_side_states(depth: usize) -> Vec<Conn> {
        use ReadSide::*;
        let data_and_reads = [Data(1), Data(30), Data(49), Read(1), Read(40), Read(100)];
        let others = [QueueControl, PostControl, AskGrowth, GrowthReady, GrowthFailed, Swap, PeerLeft, Close];
        let ops: Vec<ReadSide> = data_and_reads.into_iter().chain(others).collect();
        let mut capped = established_server();
        capped.set_rx_cap(CAP);
        let mut level = vec![established_server(), capped];
        let mut all = level.clone();
        for _ in 0..depth {
            level = level
                .iter()
                .flat_map(|c| {
                    ops.iter().map(move |op| {
                        let mut c = c.clone();
                        op.apply(&mut c);
                        c
                    })
                })
                .collect();
            all.extend(level.iter().cloned());
        }
        all
    }

    #[test]
    fn a_plain_read_does_what_read_does_and_is_declined_wherever_read_has_more_to_do() {
        let (mut plain, mut declined) = (0, 0);
        for c in read_side_states(4) {
            for max in [0, 1, 3, 30, 100] {
                let (mut fast, mut full) = (c.clone(), c.clone());
                match fast.read_plain(max) {
                    Some(range) => {
                        plain += 1;
                        assert_eq!(full.read(max), Ok(range), "{c:?}");
                        assert!(
                            !full.has_control() && !full.take_rx_swap() && full.take_rx_growth_wanted().is_none(),
                            "read had more to do than the copy: {c:?}"
                        );
                        assert_eq!(format!("{fast:?}"), format!("{full:?}"), "the same state after");
                    }
                    None => {
                        declined += 1;
                        assert_eq!(format!("{fast:?}"), format!("{c:?}"), "a declined read changes nothing");
                    }
                }
            }
        }
        // (both outcomes are reached often, so the comparison above is not vacuous)
        assert!(plain > 10_000 && declined > 10_000, "plain {plain}, declined {declined}");
    }

    #[test]
    fn a_refused_write_says_why_in_the_order_of_the_checks() {
        use WriteError::*;
        let accepting = Conn::new(Role::Server, rx());
        let open = established_server();
        let mut exhausted = established_server();
        exhausted.write(50, true).unwrap();
        let mut peer_closed = established_server();
        peer_closed.on_disconnected();
        let mut failed = established_server();
        let failure = failed.on_data(1000).unwrap_err();
        let mut closed = established_server();
        closed.close();
        // (state, len, send queue has room) → granted bytes or the refusal: the state is
        // asked first, then the length, then the send queue, then the window
        let cases = [
            (&accepting, 0, false, Err(WouldBlock(Blocked::NotEstablished))),
            (&accepting, 1, true, Err(WouldBlock(Blocked::NotEstablished))),
            (&closed, 0, false, Err(Closed)),
            (&failed, 0, false, Err(Failed(failure))),
            (&peer_closed, 0, false, Err(PeerClosed)),
            (&peer_closed, 1, true, Err(PeerClosed)),
            (&open, 0, false, Err(WouldBlock(Blocked::Empty))),
            (&open, 1, false, Err(WouldBlock(Blocked::SendQueueFull))),
            (&exhausted, 0, true, Err(WouldBlock(Blocked::Empty))),
            (&exhausted, 1, false, Err(WouldBlock(Blocked::SendQueueFull))),
            (&exhausted, 1, true, Err(WouldBlock(Blocked::WindowExhausted))),
            (&open, 1, true, Ok(1)),
            (&open, 60, true, Ok(50)),
        ];
        for (c, len, sq_room, want) in cases {
            let got = c.clone().write(len, sq_room).map(|g| g.len);
            assert_eq!(got, want, "{:?}, len {len}, send queue room {sq_room}", c.state);
        }
    }

    #[test]
    fn the_rx_buffer_grows_at_the_hand_back_after_the_prepared_one_is_ready() {
        let mut c = established_server();
        c.set_rx_cap(CAP);
        let handed_back = |c: &mut Conn| match c.poll_control() {
            Some(ControlMessage::RegisterXferMemory { addr, length, key }) => (addr, length, key),
            other => panic!("want a hand-back, got {other:?}"),
        };
        // The first full buffer goes back as it is (nobody waits for a registration);
        // a buffer RX_GROWTH_FACTOR times larger is wanted, once.
        c.on_data(100).unwrap();
        assert_eq!(c.read(100), Ok(0..100));
        assert_eq!(handed_back(&mut c), (0x1000, 100, 7));
        assert!(!c.take_rx_swap());
        assert_eq!(c.take_rx_growth_wanted(), Some(STEP1));
        assert_eq!(c.take_rx_growth_wanted(), None, "asked once while it is prepared");
        // Still preparing at the next hand-back: the old buffer again.
        c.on_data(100).unwrap();
        assert_eq!(c.read(100), Ok(0..100));
        assert_eq!(handed_back(&mut c), (0x1000, 100, 7));
        assert_eq!(c.take_rx_growth_wanted(), None);
        // Ready: nothing changes until the window is full and read...
        c.rx_growth_ready(Some(RxBuffer { addr: 0x5000, len: STEP1, key: 8 }));
        c.on_data(60).unwrap();
        assert_eq!(c.read(100), Ok(0..60));
        assert_eq!((c.poll_control(), c.take_rx_swap()), (None, false));
        // ...then the hand-back names the new buffer and the driver swaps it in.
        c.on_data(40).unwrap();
        assert_eq!(c.read(100), Ok(60..100));
        assert_eq!(handed_back(&mut c), (0x5000, STEP1, 8));
        assert!(c.take_rx_swap());
        assert!(!c.take_rx_swap(), "once");
        assert_eq!(c.rx().len(), STEP1);
        // Next step up to the cap; a buffer that cannot be made ends the growth there.
        c.on_data(STEP1).unwrap();
        assert_eq!(c.read(STEP1 as usize), Ok(0..STEP1 as usize));
        assert_eq!(handed_back(&mut c), (0x5000, STEP1, 8));
        assert_eq!(c.take_rx_growth_wanted(), Some(CAP));
        c.rx_growth_ready(None);
        c.on_data(STEP1).unwrap();
        assert_eq!(c.read(STEP1 as usize), Ok(0..STEP1 as usize));
        assert_eq!(handed_back(&mut c), (0x5000, STEP1, 8));
        assert_eq!(c.take_rx_growth_wanted(), None, "no retry after a failure");
    }

    #[test]
    fn the_next_rx_buffer_is_wanted_once_half_the_current_one_is_written() {
        let mut c = established_server();
        c.set_rx_cap(CAP);
        c.on_data(49).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), None, "less than half");
        c.on_data(1).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), Some(STEP1));
        // ready before the buffer is full: its hand-back names the new one
        c.rx_growth_ready(Some(RxBuffer { addr: 0x5000, len: STEP1, key: 8 }));
        c.on_data(50).unwrap();
        assert_eq!(c.read(100), Ok(0..100));
        assert_eq!(c.poll_control(), Some(ControlMessage::RegisterXferMemory { addr: 0x5000, length: STEP1, key: 8 }));
        assert!(c.take_rx_swap());
        // at the cap nothing more is wanted
        c.on_data(STEP1 / 2).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), Some(CAP));
        c.rx_growth_ready(Some(RxBuffer { addr: 0x9000, len: CAP, key: 9 }));
        c.on_data(STEP1 / 2).unwrap();
        assert_eq!(c.read(STEP1 as usize), Ok(0..STEP1 as usize));
        assert!(c.take_rx_swap());
        c.on_data(CAP).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), None);
    }

    #[test]
    fn the_rx_buffer_grows_only_for_a_client_that_fills_it_in_few_writes() {
        use super::super::{DEFAULT_RX_SIZE, MIN_RX_SIZE, RX_GROWTH_MAX_WRITES};
        let fill = |c: &mut Conn, write: u32| {
            for _ in 0..MIN_RX_SIZE / write {
                c.on_data(write).unwrap();
            }
            let len = MIN_RX_SIZE as usize;
            assert_eq!(c.read(len), Ok(0..len));
            assert!(matches!(c.poll_control(), Some(ControlMessage::RegisterXferMemory { length: MIN_RX_SIZE, .. })));
        };
        let server = || {
            let mut c = established_server_with(RxBuffer { addr: 0x10000, len: MIN_RX_SIZE, key: 7 });
            c.set_rx_cap(DEFAULT_RX_SIZE);
            c
        };
        // Small requests, one write each (-P 1): a hand-back holds up 1 write in 256, so
        // the 64 KiB buffer stays, window after window.
        let mut c = server();
        for _ in 0..4 {
            fill(&mut c, MIN_RX_SIZE / (2 * RX_GROWTH_MAX_WRITES));
            assert_eq!(c.take_rx_growth_wanted(), None);
        }
        // Exactly 1 in 128: wanted once half the buffer is written (64 writes), before
        // the hand-back.
        let mut c = server();
        let write = MIN_RX_SIZE / RX_GROWTH_MAX_WRITES;
        for _ in 0..RX_GROWTH_MAX_WRITES / 2 - 1 {
            c.on_data(write).unwrap();
        }
        assert_eq!(c.take_rx_growth_wanted(), None, "below half");
        c.on_data(write).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), Some(DEFAULT_RX_SIZE));
        // Just under half in small writes, then one write of the rest (a large value
        // after small commands): the whole buffer took 128 writes, wanted at that write.
        let mut c = server();
        let small = MIN_RX_SIZE / (2 * RX_GROWTH_MAX_WRITES);
        for _ in 0..RX_GROWTH_MAX_WRITES - 1 {
            c.on_data(small).unwrap();
        }
        assert_eq!(c.take_rx_growth_wanted(), None, "just under half, in 127 writes");
        c.on_data(MIN_RX_SIZE - (RX_GROWTH_MAX_WRITES - 1) * small).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), Some(DEFAULT_RX_SIZE), "128 writes for the whole buffer");
        // One write more for the same bytes (129): not wanted.
        let mut c = server();
        for _ in 0..RX_GROWTH_MAX_WRITES {
            c.on_data(small).unwrap();
        }
        c.on_data(MIN_RX_SIZE - RX_GROWTH_MAX_WRITES * small).unwrap();
        assert_eq!(c.take_rx_growth_wanted(), None, "129 writes for the whole buffer");
    }

    #[test]
    fn a_prepared_rx_buffer_is_not_offered_to_a_peer_that_left() {
        let mut c = established_server();
        c.set_rx_cap(CAP);
        c.on_data(100).unwrap();
        assert_eq!(c.read(100), Ok(0..100));
        let _ = c.poll_control();
        assert_eq!(c.take_rx_growth_wanted(), Some(STEP1));
        c.rx_growth_ready(Some(RxBuffer { addr: 0x5000, len: STEP1, key: 8 }));
        c.on_data(100).unwrap();
        c.on_disconnected();
        assert_eq!(c.read(100), Ok(0..100));
        assert_eq!((c.poll_control(), c.take_rx_swap()), (None, false));
    }

    #[test]
    fn a_peer_that_acknowledges_nothing_for_dead_peer_ticks_fails_the_connection_once() {
        let dead = super::super::DEAD_PEER_TICKS;
        let mut c = established_server();
        for silent in 0..dead {
            c.keepalive_tick(TickFacts { unacknowledged_ticks: silent, ..TickFacts::every_period(false) }).unwrap();
            assert_eq!(c.poll_control(), Some(ControlMessage::Keepalive), "{silent} silent periods are not enough");
        }
        let f =
            c.keepalive_tick(TickFacts { unacknowledged_ticks: dead, ..TickFacts::every_period(false) }).unwrap_err();
        assert_eq!(f, Failure::PeerSilent { ticks: dead });
        assert_eq!(f.errno(), libc::ETIMEDOUT);
        assert_eq!(c.failure(), Some(&f));
        assert_eq!(
            c.keepalive_tick(TickFacts { unacknowledged_ticks: dead + 1, ..TickFacts::every_period(false) }),
            Ok(()),
            "failed once; a failed connection sends nothing more"
        );
        assert_eq!(c.poll_control(), None);
    }

    #[test]
    fn a_handshake_left_half_done_fails_at_the_deadline_and_only_then() {
        let deadline = super::super::HANDSHAKE_TICKS;
        // Server, accepted, ESTABLISHED never seen: fails at exactly the deadline, once.
        let mut c = Conn::new(Role::Server, rx());
        c.on_accepted().unwrap();
        for _ in 1..deadline {
            assert_eq!(c.keepalive_tick(TickFacts::every_period(false)), Ok(()));
            assert_eq!(c.state(), &State::Accepting);
        }
        let f = c.keepalive_tick(TickFacts::every_period(false)).unwrap_err();
        assert_eq!(f, Failure::HandshakeTimeout { ticks: deadline });
        assert_eq!((f.errno(), c.server_state()), (libc::ETIMEDOUT, ServerState::Error));
        assert_eq!(c.keepalive_tick(TickFacts::every_period(false)), Ok(()), "failed once");
        // ESTABLISHED one tick before the deadline: never fails, however long it lives.
        let mut c = Conn::new(Role::Server, rx());
        c.on_accepted().unwrap();
        for _ in 1..deadline {
            c.keepalive_tick(TickFacts::every_period(false)).unwrap();
        }
        c.on_established();
        for _ in 0..10 * deadline {
            assert_eq!(c.keepalive_tick(TickFacts::every_period(false)), Ok(()));
        }
        assert_eq!(c.state(), &State::Established);
        // A client connection is not the server's to time out (its connect has its own).
        let mut c = Conn::new(Role::Client, rx());
        for _ in 0..10 * deadline {
            assert_eq!(c.keepalive_tick(TickFacts::every_period(false)), Ok(()));
        }
        assert_eq!(c.state(), &State::Accepting);
    }
}
