//! The steps around the core, written once. A [`Driver`] is the protocol core ([`Conn`])
//! and the NIC side of one connection ([`Nic`]); it feeds the core what the NIC
//! completed, copies received bytes out, swaps a prepared RX buffer in, posts the
//! control messages the core queued and writes with the grant the core gave, in the
//! order the protocol requires. [`run`] calls the server's handlers as the core
//! schedules them, through a [`Host`].
//!
//! The server's transport (`transport/connection.rs`, the NIC a verbs endpoint), the
//! client (`client/mod.rs`, the same endpoint) and the simulator (`protocol/sim.rs`, a
//! fake NIC and a fake event loop) all run this code, so the simulator checks the
//! ordering that ships.

use std::ops::Range;

use super::conn::{
    AfterHandler, Conn, Failure, Handler, ReadError, Received, RxBuffer, Step, TickFacts, WriteError, WriteGrant,
};
use super::{ControlMessage, Violation, CONTROL_MESSAGE_LEN};

/// What one completion meant, after the NIC's own bookkeeping (send-queue entries
/// freed, the receive slot re-posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A SEND arrived: `len` bytes (anything but 32 is the peer's violation).
    Control { bytes: [u8; CONTROL_MESSAGE_LEN], len: u32 },
    /// An RDMA_WRITE_WITH_IMM landed in our RX buffer; `imm` is its byte count.
    Data { imm: u32 },
    /// A work request failed (flush after a disconnect, remote access error, …).
    Failed { status: u32, vendor_err: u32 },
}

/// A local call of the NIC side failed: which one, and its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalError {
    pub call: &'static str,
    pub errno: i32,
}

/// The NIC side cannot follow the peer's new RX buffer with its TX buffer: this many old
/// TX buffers still wait for writes the peer keeps from completing (docs/protocol.md §6),
/// the peer's violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxBuffersHeld(pub u32);

/// The NIC side of one connection: what the driver asks of the verbs endpoint (or of
/// the simulator's fake NIC).
pub trait Nic {
    /// Whether the endpoint still exists. A torn-down one takes nothing: control
    /// messages stay queued in the core, and reads and writes find nothing.
    fn is_up(&self) -> bool {
        true
    }
    /// Posts one control message (a SEND, docs/protocol.md §3.3).
    fn post_control(&mut self, msg: &ControlMessage) -> Result<(), LocalError>;
    /// Whether the send queue can take a data write now (docs/protocol.md §4.5).
    fn sq_room(&self) -> bool;
    /// Copies the RX buffer's bytes at `range` into the start of `out`.
    fn copy_rx(&mut self, range: Range<usize>, out: &mut [u8]);
    /// The peer's RegisterXferMemory arrived: the TX buffer follows its length
    /// (docs/protocol.md §2). `resized`: the length changed.
    fn peer_rx_registered(&mut self, len: u32, resized: bool) -> Result<(), TxBuffersHeld>;
    /// The most bytes one write starting at `tx_offset` of the peer's window may carry
    /// now (work requests the send queue has room for).
    fn write_limit(&self, tx_offset: u32) -> usize;
    /// Bytes that [`write_limit`](Self::write_limit) never cuts, wherever the write
    /// starts: a write of at most this many need not ask it (0: always ask).
    fn write_never_cut(&self) -> usize {
        0
    }
    /// Copies the first `grant.len` bytes of `parts` into the TX buffer at
    /// `grant.offset` and posts them as one write for the peer (docs/protocol.md §4.1).
    fn post_write(&mut self, grant: &WriteGrant, parts: &[&[u8]]) -> Result<(), LocalError>;

    // The adaptive RX window (docs/protocol.md §4.3). A NIC that cannot grow its RX
    // buffer keeps these defaults.

    /// A larger RX buffer whose preparation finished since the last call: `Some(Some)`
    /// ready (it becomes the RX buffer at the next hand-back), `Some(None)` failed.
    fn rx_prepared(&mut self) -> Option<Option<RxBuffer>> {
        None
    }
    /// Starts preparing an RX buffer of `len` bytes off the event loop; false: cannot.
    fn prepare_rx(&mut self, _len: u32) -> bool {
        false
    }
    /// Makes the prepared RX buffer the RX buffer (the bytes of the old one are read).
    fn install_prepared_rx(&mut self) {}
}

/// One connection's core and NIC side.
pub struct Driver<N> {
    pub core: Conn,
    pub nic: N,
    /// A deliberate mistake, for the simulator's test that it catches one (test builds
    /// only).
    #[cfg(test)]
    pub(crate) mutant: Mutant,
}

/// Mistakes in the read path's order, made on purpose in test builds, to show that the
/// simulator catches them (`protocol/sim.rs`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    None,
    /// Posts the hand-back before the bytes are copied out.
    FlushBeforeCopy,
    /// Swaps the prepared RX buffer in before the bytes are copied out.
    SwapBeforeCopy,
}

impl<N: Nic> Driver<N> {
    pub fn new(core: Conn, nic: N) -> Self {
        Driver {
            core,
            nic,
            #[cfg(test)]
            mutant: Mutant::None,
        }
    }

    /// Posts the control messages the core queued. A failed post fails the connection.
    #[inline]
    pub fn flush_control(&mut self) -> Result<(), Failure> {
        // (asked after every input, and nearly always with nothing queued: that answer
        // is one load, inlined into the caller)
        if !self.core.has_control() {
            return Ok(());
        }
        self.post_queued_control()
    }

    #[inline(never)]
    fn post_queued_control(&mut self) -> Result<(), Failure> {
        if !self.nic.is_up() {
            return Ok(());
        }
        while let Some(msg) = self.core.poll_control() {
            if let Err(e) = self.nic.post_control(&msg) {
                return self.core.on_local_error(e.call, e.errno);
            }
        }
        Ok(())
    }

    /// One completion into the core. What a received control message meant is returned
    /// for the caller to count; the TX buffer already follows a new peer RX buffer.
    #[inline(always)]
    pub fn on_completion(&mut self, c: Completion) -> Result<Received, Failure> {
        match c {
            // A SEND shorter than 32 bytes decodes as BadControlLength; a longer one
            // cannot land in a 32-byte slot (it completes as a length error).
            Completion::Control { bytes, len } => {
                let r = self.core.on_control(&bytes[..(len as usize).min(bytes.len())])?;
                // docs/protocol.md §2: the TX buffer follows the peer's RX buffer. Writes
                // from an old one may still be in flight: the NIC keeps it until the
                // send queue has passed them.
                if let Received::PeerRxRegistered { len, resized } = r {
                    if let Err(TxBuffersHeld(held)) = self.nic.peer_rx_registered(len, resized) {
                        return Err(self.core.on_violation(Violation::WindowsInFlight { held }));
                    }
                }
                Ok(r)
            }
            Completion::Data { imm } => self.core.on_data(imm).map(|()| Received::Data),
            Completion::Failed { status, vendor_err } => {
                self.core.on_work_request_failed(status, vendor_err).map(|()| Received::Nothing)
            }
        }
    }

    /// Completions in arrival order, then the control messages they queued (answers,
    /// hand-backs). `seen` learns what each control message meant. Returns the first
    /// failure.
    pub fn feed(&mut self, completions: &[Completion], mut seen: impl FnMut(Received)) -> Option<Failure> {
        let mut failed = None;
        for &c in completions {
            match self.on_completion(c) {
                Ok(r) => seen(r),
                Err(f) => {
                    failed.get_or_insert(f);
                }
            }
        }
        if let Err(f) = self.flush_control() {
            failed.get_or_insert(f);
        }
        failed
    }

    /// Copies up to `buf.len()` unread bytes out of the RX buffer. In this order
    /// (docs/protocol.md §4.3): a prepared larger buffer is offered to the core; the
    /// bytes are copied; a hand-back that names the prepared buffer swaps it in (the
    /// old one's bytes are out now); a wanted growth starts; and only then the
    /// RegisterXferMemory goes, since the peer writes over the buffer once it has it.
    /// The second value: a failure the flush caused.
    #[inline]
    pub fn read(&mut self, buf: &mut [u8]) -> (Result<usize, ReadError>, Option<Failure>) {
        // The usual read: the core says nothing is due but the copy (with no RX growth
        // under way, the NIC has no prepared buffer to offer either).
        if let Some(range) = self.core.read_plain(buf.len()) {
            let n = range.len();
            self.nic.copy_rx(range, buf);
            return (Ok(n), None);
        }
        self.read_any(buf)
    }

    /// [`read`](Self::read) in every case.
    #[inline(never)]
    fn read_any(&mut self, buf: &mut [u8]) -> (Result<usize, ReadError>, Option<Failure>) {
        if let Some(prepared) = self.nic.rx_prepared() {
            self.core.rx_growth_ready(prepared);
        }
        let range = match self.core.read(buf.len()) {
            Ok(r) => r,
            Err(e) => return (Err(e), None),
        };
        #[cfg(test)]
        match self.mutant {
            Mutant::None => {}
            Mutant::FlushBeforeCopy => drop(self.flush_control()),
            Mutant::SwapBeforeCopy => {
                if self.core.take_rx_swap() {
                    self.nic.install_prepared_rx();
                }
            }
        }
        self.nic.copy_rx(range.clone(), buf);
        if self.core.take_rx_swap() {
            self.nic.install_prepared_rx();
        }
        if let Some(len) = self.core.take_rx_growth_wanted() {
            if !self.nic.prepare_rx(len) {
                self.core.rx_growth_ready(None);
            }
        }
        (Ok(range.len()), self.flush_control().err())
    }

    /// Writes as much of `parts` as the peer's window and the send queue take now, as
    /// one write for the peer (docs/protocol.md §4.1). The second value: a failure the
    /// post caused (the write then fails too).
    #[inline(always)]
    pub fn write(&mut self, parts: &[&[u8]]) -> (Result<WriteGrant, WriteError>, Option<Failure>) {
        let total = parts_len(parts);
        let total = if total <= self.nic.write_never_cut() {
            total
        } else {
            total.min(self.nic.write_limit(self.core.tx_offset()))
        };
        let grant = match self.core.write(total, self.nic.sq_room()) {
            Ok(g) => g,
            Err(e) => return (Err(e), None),
        };
        match self.nic.post_write(&grant, parts) {
            Ok(()) => (Ok(grant), None),
            Err(e) => match self.core.on_local_error(e.call, e.errno) {
                Err(f) => (Err(WriteError::Failed(f.clone())), Some(f)),
                Ok(()) => (Err(WriteError::Closed), None),
            },
        }
    }

    /// ESTABLISHED: the core queues the first RegisterXferMemory (docs/protocol.md §1).
    pub fn on_established(&mut self) -> Option<Failure> {
        self.core.on_established();
        self.flush_control().err()
    }

    /// The keepalive tick (docs/protocol.md §5), with what the NIC saw since the last.
    pub fn keepalive(&mut self, at: TickFacts) -> Option<Failure> {
        match self.core.keepalive_tick(at) {
            Err(f) => Some(f),
            Ok(()) => self.flush_control().err(),
        }
    }

    /// Whether the connection should be put on the pending list after an input made
    /// outside a run (the core's `wants_pending`).
    pub fn wants_pending(&self) -> bool {
        self.core.wants_pending(self.nic.sq_room())
    }
}

/// The bytes of a write's parts: the server's usual write is one part, whose length
/// needs no loop.
#[inline]
pub(crate) fn parts_len(parts: &[&[u8]]) -> usize {
    match parts {
        [one] => one.len(),
        _ => parts.iter().map(|p| p.len()).sum(),
    }
}

/// The host side of [`run`]: where the driver lives and how a handler is called.
pub trait Host {
    type Nic: Nic;
    /// Runs `f` on the driver. The server takes the connection's lock here, so that no
    /// handler is ever called with it held.
    fn with_driver<R>(&mut self, f: impl FnOnce(&mut Driver<Self::Nic>) -> R) -> R;
    /// Calls the server's handler.
    fn call(&mut self, h: Handler);
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// `pending`: put the connection on the pending list (docs/server-abi.md §4.3).
    Done { pending: bool },
    /// A handler closed the connection and none is running any more: tear it down now.
    FreeNow,
    /// A handler closed it while an outer handler runs: that one frees it.
    ClosedInside,
}

/// One run of the server's handlers, as the core schedules them (docs/server-abi.md
/// §4.1, §4.3): the completion fd fired, or the pending list came round.
pub fn run<H: Host>(host: &mut H) -> RunEnd {
    // One turn of the driver between handler calls: what a handler changed is taken in
    // and the next step decided under the same hold of the driver.
    let next = |d: &mut Driver<H::Nic>| {
        let nic = &d.nic;
        d.core.next_step(|| nic.sq_room())
    };
    // The usual run, a read call decided in one test, else the run begun.
    let first = host.with_driver(|d| match d.core.plain_read_call() {
        Some(call) => Err(call),
        None => {
            d.core.begin_run();
            Ok(next(d))
        }
    });
    let mut step = match first {
        Ok(step) => step,
        Err(call) => {
            host.call(Handler::Read);
            match host.with_driver(|d| d.core.plain_read_returned(call).map(|step| step.unwrap_or_else(|| next(d)))) {
                Ok(step) => step,
                Err(AfterHandler::FreeNow) => return RunEnd::FreeNow,
                Err(_) => return RunEnd::ClosedInside,
            }
        }
    };
    loop {
        match step {
            Step::Done { pending } => return RunEnd::Done { pending },
            Step::Call(h) => {
                host.call(h);
                step = match host.with_driver(|d| match d.core.handler_returned() {
                    AfterHandler::Continue => Ok(next(d)),
                    after => Err(after),
                }) {
                    Ok(step) => step,
                    Err(AfterHandler::FreeNow) => return RunEnd::FreeNow,
                    Err(_) => return RunEnd::ClosedInside,
                };
            }
        }
    }
}
