//! A completion queue (with its completion channel) shared by many endpoints.
//!
//! A process that holds thousands of connections cannot afford one CQ and one channel
//! fd per connection: each CQ is memory mapped into the process, each channel is an
//! fd, and a device has a limit of CQs (`max_cq`; older rxe builds: 16384, the server's
//! own connections on the same device count too). A [`SharedCq`] is made once per
//! device and held in an `Arc`; each endpoint built on it
//! ([`Endpoint::with_shared_cq`](super::Endpoint::with_shared_cq)) keeps a
//! [`CqAttachment`], which holds the `Arc`. The types enforce the teardown order: an
//! endpoint destroys its QP in its `Drop` body and drops the attachment afterwards (a
//! field), so the CQ is destroyed only after the last QP that used it.
//!
//! Capacity: each attached QP reserves `send + recv` entries ([`QueueDepths::cqes`]),
//! so the CQ never overflows however its QPs complete; a QP that does not fit is
//! refused ([`VerbsOp::AttachCq`], `ENOSPC`) and the caller makes another CQ.
//!
//! Dispatch: [`SharedCq::poll`] hands out [`WorkCompletion`]s; the caller routes each
//! by [`WorkCompletion::qp_num`] to the endpoint with that [`qp_num`]
//! (super::Endpoint::qp_num). A QP destroyed while completions of it may still be
//! queued leaves its number *retired*: those completions are dropped by `poll` until
//! the CQ has been seen empty, and a new QP that got the same number before then is
//! refused (`EBUSY`), so a stale completion can never reach the wrong endpoint. A QP
//! whose connection is closed but which is destroyed later, on another thread, is
//! marked *closing* first, so that no gap is left between the two.
//!
//! [`QueueDepths::cqes`]: super::QueueDepths::cqes
//! [`VerbsOp::AttachCq`]: super::VerbsOp::AttachCq

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use rdma_sys::*;

use super::cq::{CompletionChannel, CompletionQueue};
use super::resources::{loaded, CmId};
use super::{Result, VerbsError, VerbsOp};

/// The most entries one CQ may have on any device we know (rxe: `max_cqe` 32767).
pub const MAX_SHARED_CQES: u32 = 32767;

/// The entries of a shared CQ: how many are reserved by attached QPs, and which QP
/// numbers are retired. Pure bookkeeping, kept apart from the verbs calls.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CqBudget {
    capacity: u32,
    reserved: u32,
    attached: u32,
    /// QPs destroyed since the CQ was last seen empty: their completions may be queued.
    retired: Vec<u32>,
    /// QPs of closed connections that are still to be destroyed (on another thread):
    /// not retired yet, but their numbers must not be taken meanwhile either.
    closing: Vec<u32>,
}

impl CqBudget {
    pub fn new(capacity: u32) -> Self {
        CqBudget { capacity, ..Default::default() }
    }
    /// Reserves `cqes` entries for one QP; false (nothing changed) when they do not fit.
    pub fn reserve(&mut self, cqes: u32) -> bool {
        match self.reserved.checked_add(cqes) {
            Some(r) if r <= self.capacity && cqes > 0 => {
                self.reserved = r;
                self.attached += 1;
                true
            }
            _ => false,
        }
    }
    /// Gives back one QP's entries; `qp_num`: the QP existed and may have completions
    /// queued.
    pub fn release(&mut self, cqes: u32, qp_num: Option<u32>) {
        self.reserved = self.reserved.saturating_sub(cqes);
        self.attached = self.attached.saturating_sub(1);
        if let Some(n) = qp_num {
            self.closing.retain(|&c| c != n);
            self.retired.push(n);
        }
    }
    /// The QP numbered `qp_num` is to be destroyed later, elsewhere: until it is retired
    /// (at [`release`](Self::release)), a new QP of that number is refused as well.
    pub fn mark_closing(&mut self, qp_num: u32) {
        self.closing.push(qp_num);
    }
    /// Whether a new QP may take the number `qp_num`: no completion of an earlier QP of
    /// that number can be queued, and none is still to be destroyed.
    pub fn may_take(&self, qp_num: u32) -> bool {
        !self.is_retired(qp_num) && !self.closing.contains(&qp_num)
    }
    /// Whether a completion of `qp_num` may be stale (its QP is gone).
    pub fn is_retired(&self, qp_num: u32) -> bool {
        self.retired.contains(&qp_num)
    }
    /// QP numbers retired so far (pass to [`drained`](Self::drained)).
    pub fn retired_count(&self) -> usize {
        self.retired.len()
    }
    /// The CQ was polled empty: no completion is left of the first `retired_before`
    /// retired QPs, the ones retired before the poll began (a QP retired during the
    /// poll may have left completions behind the point the poll saw).
    pub fn drained(&mut self, retired_before: usize) {
        self.retired.drain(..retired_before.min(self.retired.len()));
    }
    /// Entries still free for further QPs.
    pub fn free(&self) -> u32 {
        self.capacity - self.reserved
    }
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// One completion as the device wrote it (an `ibv_wc`, polled straight into the
/// caller's list: nothing is converted or copied per completion); from a shared CQ,
/// for the endpoint whose QP number it carries.
#[repr(transparent)]
pub struct WorkCompletion(ibv_wc);

impl Clone for WorkCompletion {
    fn clone(&self) -> Self {
        Self::from_raw(&self.0)
    }
}

impl WorkCompletion {
    pub(super) fn from_raw(wc: &ibv_wc) -> Self {
        // SAFETY: an ibv_wc is plain data (integers and a union of integers), which a
        // bitwise copy duplicates (rdma-sys does not derive Clone for it).
        WorkCompletion(unsafe { std::ptr::read(wc) })
    }
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// A receive (a control message or a peer's write with an immediate), not the
    /// completion of something this side posted: the receive opcodes have bit 7 set
    /// (`IBV_WC_RECV` = 128).
    pub fn is_receive(&self) -> bool {
        self.0.opcode & ibv_wc_opcode::IBV_WC_RECV != 0
    }
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    pub(super) fn status(&self) -> u32 {
        self.0.status
    }
    pub(super) fn opcode(&self) -> u32 {
        self.0.opcode
    }
    pub(super) fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
    pub(super) fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// The immediate, in host order, for the opcode that carries one (or when the flags
    /// say so); 0 otherwise.
    pub(super) fn imm(&self) -> u32 {
        let wc = &self.0;
        let with_imm =
            wc.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM || wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        if !with_imm {
            return 0;
        }
        // SAFETY: the union is a plain u32 either way; read as the immediate only when
        // the completion carries one.
        u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
    }
    /// A successful receive of QP `qp_num` (`wr_id` tells it apart), for tests of code
    /// that routes completions.
    #[cfg(test)]
    pub fn received(qp_num: u32, wr_id: u64) -> Self {
        // SAFETY: all-zero is a valid ibv_wc (plain integers, a union of integers).
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num) =
            (wr_id, ibv_wc_status::IBV_WC_SUCCESS, ibv_wc_opcode::IBV_WC_RECV, 32, qp_num);
        WorkCompletion(wc)
    }
    /// A successful send (a write this side posted) of QP `qp_num`, for tests.
    #[cfg(test)]
    pub fn sent(qp_num: u32, wr_id: u64) -> Self {
        let mut wc = Self::received(qp_num, wr_id);
        wc.0.opcode = ibv_wc_opcode::IBV_WC_RDMA_WRITE;
        wc
    }
}

/// A CQ and its completion channel (a non-blocking fd), destroyed together when the
/// last `Arc` goes: after every QP attached to it (see the module comment).
pub struct SharedCq {
    verbs: *mut ibv_context,
    queue: CompletionQueue,
    /// Whether the channel is this CQ's alone: then a poll takes its event. A channel
    /// other CQs share is read by its owner ([`CompletionChannel::take_event`]).
    own_channel: bool,
    budget: Mutex<CqBudget>,
    /// The budget's retired count, readable without its lock: a poll of a CQ with no
    /// retired QP (nearly every poll) takes no lock.
    retired: AtomicUsize,
}

// SAFETY: the queue is a verbs object owned by this struct; the device context is
// librdmacm's, alive while any id of it is, and ids keep their SharedCq alive; it is
// only compared. The providers lock a CQ inside poll and arm; the bookkeeping is
// behind a Mutex.
unsafe impl Send for SharedCq {}
// SAFETY: as for Send: poll and arm are locked by the provider, the rest by the Mutex.
unsafe impl Sync for SharedCq {}

impl SharedCq {
    /// A CQ of `capacity` entries (at most [`MAX_SHARED_CQES`] and the device's
    /// `max_cqe`) on the device of `id`, whose address (client: route) is resolved;
    /// armed, its channel non-blocking.
    pub fn new(id: &CmId, capacity: u32, comp_vector: u32) -> Result<Arc<SharedCq>> {
        Self::make(id, capacity, comp_vector, None)
    }

    /// As [`new`](Self::new), signalling `channel`, which the other CQs of the device
    /// share (the server's: one fd for all of them).
    pub(crate) fn on_channel(
        id: &CmId,
        capacity: u32,
        comp_vector: u32,
        channel: &Arc<CompletionChannel>,
    ) -> Result<Arc<SharedCq>> {
        Self::make(id, capacity, comp_vector, Some(channel))
    }

    fn make(
        id: &CmId,
        capacity: u32,
        comp_vector: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> Result<Arc<SharedCq>> {
        let verbs = id.raw().verbs;
        if verbs.is_null() {
            return Err(VerbsError::with(VerbsOp::NoDevice, libc::ENODEV));
        }
        let l = loaded();
        // SAFETY: `verbs` is the live device context of `id`; the attributes are plain
        // integers, written by the call.
        let max_cqe = unsafe {
            let mut attr: ibv_device_attr = std::mem::zeroed();
            match (l.ibv_query_device)(verbs, &mut attr) {
                0 if attr.max_cqe > 0 => attr.max_cqe as u32,
                _ => MAX_SHARED_CQES,
            }
        };
        let capacity = capacity.clamp(1, MAX_SHARED_CQES.min(max_cqe));
        if channel.is_some_and(|ch| !ch.is_for(id)) {
            return Err(VerbsError::with(VerbsOp::CreateCq, libc::EXDEV));
        }
        // SAFETY: `verbs` is the live device context of `id`; a channel given is of the
        // same device (checked).
        let queue = unsafe {
            match channel {
                Some(ch) => CompletionQueue::on_channel(verbs, capacity, comp_vector, Arc::clone(ch))?,
                None => CompletionQueue::new(verbs, capacity, comp_vector)?,
            }
        };
        let s = SharedCq {
            verbs,
            queue,
            own_channel: channel.is_none(),
            budget: Mutex::new(CqBudget::new(capacity)),
            retired: AtomicUsize::new(0),
        };
        Ok(Arc::new(s))
    }

    /// The completion vector its interrupts are on, and how many its device has.
    pub(crate) fn vectors(&self) -> (i32, i32) {
        // SAFETY: `num_comp_vectors` is plain data of the device context, which stays
        // open while an object of it (this CQ) is (see `CompletionChannel::of_device`).
        let available = unsafe { (*self.verbs).num_comp_vectors };
        (self.queue.comp_vector(), available)
    }
    /// The device it is on.
    pub(crate) fn device(&self) -> super::DeviceKey {
        super::DeviceKey::from_context(self.verbs)
    }
    /// Whether `cq` is this CQ (an event of a shared channel names its CQ).
    pub(crate) fn is(&self, cq: *mut ibv_cq) -> bool {
        self.queue.cq_ptr() == cq
    }

    /// Whether a QP of `id`'s device whose queues fill `cqes` entries fits on this CQ.
    pub fn fits(&self, id: &CmId, cqes: u32) -> bool {
        id.raw().verbs == self.verbs && self.budget().free() >= cqes
    }
    /// Whether completions of destroyed QPs may still be queued (their numbers are
    /// retired until a poll finds the CQ empty, and a new QP cannot take one of them).
    pub fn has_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire) > 0
    }

    fn budget(&self) -> MutexGuard<'_, CqBudget> {
        self.budget.lock()
    }
    /// Changes the budget under its lock and keeps the retired count's mirror.
    fn change_budget<R>(&self, f: impl FnOnce(&mut CqBudget) -> R) -> R {
        let mut b = self.budget();
        let r = f(&mut b);
        self.retired.store(b.retired_count(), Ordering::Release);
        r
    }
    /// The bookkeeping now (capacity, reserved entries, QPs attached).
    pub fn budget_now(&self) -> CqBudget {
        self.budget().clone()
    }
    /// The completion channel's fd: readable when a completion is due.
    pub fn fd(&self) -> i32 {
        self.queue.fd()
    }
    /// The completion queue and channel.
    pub(super) fn queue(&self) -> &CompletionQueue {
        &self.queue
    }

    /// Consumes a pending notification of its own channel (if any; a shared channel's
    /// events are taken by its owner), re-arms the CQ and polls up to `budget`
    /// completions onto the end of `out`; those of destroyed QPs are dropped. Returns
    /// whether completions may be left, as [`Endpoint::poll`](super::Endpoint::poll):
    /// the caller comes back for them.
    pub fn poll(&self, budget: usize, out: &mut Vec<WorkCompletion>) -> Result<bool> {
        let retired_before = self.retired.load(Ordering::Acquire);
        let start = out.len();
        // SAFETY: the channel and CQ are live while self is.
        let left = unsafe { poll_channel_cq(self.own_channel_ptr(), self.queue.cq_ptr(), budget, out)? };
        self.after_poll(out, start, left, retired_before);
        Ok(left)
    }

    /// A wake-up's first poll: as [`poll`](Self::poll), up to [`FIRST_POLL`] completions
    /// onto the stack (for a budget of at least that many). [`FirstPolled::All`] (the
    /// usual case): the CQ was emptied and no QP of it is retired, so every completion in
    /// `first` is a live QP's and none is left. Otherwise the poll goes on in
    /// [`poll_rest`](Self::poll_rest), which also drops those of retired QPs.
    #[inline]
    pub(crate) fn poll_first(&self, first: &mut FirstPoll) -> Result<FirstPolled> {
        first.retired_before = self.retired.load(Ordering::Acquire);
        // SAFETY: the channel and CQ are live while self is.
        unsafe { poll_channel_cq(self.own_channel_ptr(), self.queue.cq_ptr(), FIRST_POLL, first)? };
        Ok(if first.n < FIRST_POLL && first.retired_before == 0 && !self.has_retired() {
            FirstPolled::All
        } else {
            FirstPolled::Partly
        })
    }

    /// The channel whose pending notification a poll consumes: this CQ's own, or null
    /// for a shared channel (its owner takes the events).
    #[inline(always)]
    fn own_channel_ptr(&self) -> *mut ibv_comp_channel {
        if self.own_channel {
            self.queue.channel_ptr()
        } else {
            std::ptr::null_mut()
        }
    }

    /// After [`poll_first`](Self::poll_first) came back [`FirstPolled::Partly`]: its
    /// completions onto the end of `out`, then (if it was full) the rest of the same
    /// `budget`, as [`poll`](Self::poll) does, without arming again. Returns whether
    /// completions may be left.
    pub(crate) fn poll_rest(&self, first: &FirstPoll, budget: usize, out: &mut Vec<WorkCompletion>) -> Result<bool> {
        let start = out.len();
        out.extend_from_slice(first.as_slice());
        let left = if first.n < FIRST_POLL {
            false
        } else {
            // SAFETY: the CQ is live while self is.
            unsafe { poll_batches(self.queue.cq_ptr(), budget.saturating_sub(FIRST_POLL), out)? }
        };
        self.after_poll(out, start, left, first.retired_before);
        Ok(left)
    }

    /// The completions of retired QPs dropped from `out[start..]` (usually none is
    /// retired: then nothing is filtered), and the QPs retired before a poll that
    /// emptied the CQ forgotten.
    #[inline]
    fn after_poll(&self, out: &mut Vec<WorkCompletion>, start: usize, left: bool, retired_before: usize) {
        if self.has_retired() {
            let b = self.budget();
            drop_retired(out, start, |qp| b.is_retired(qp));
        }
        if !left && retired_before > 0 {
            self.change_budget(|b| b.drained(retired_before));
        }
    }
}

/// Completions a wake-up takes onto the stack first: at one busy connection a wake-up
/// finds one or two, and needs no list to hold them (docs/protocol.md §4.6).
pub(crate) const FIRST_POLL: usize = 16;

/// Whether a first poll took everything ([`SharedCq::poll_first`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstPolled {
    All,
    Partly,
}

/// The stack room of a wake-up's first poll.
pub(crate) struct FirstPoll {
    // (not zeroed: the device writes the entries it returns)
    wcs: [std::mem::MaybeUninit<ibv_wc>; FIRST_POLL],
    n: usize,
    retired_before: usize,
}

impl FirstPoll {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        FirstPoll { wcs: [const { std::mem::MaybeUninit::uninit() }; FIRST_POLL], n: 0, retired_before: 0 }
    }

    /// The completions taken, in arrival order.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[WorkCompletion] {
        // SAFETY: the device wrote the first `n` entries (`filled`); a WorkCompletion is
        // an ibv_wc.
        unsafe { std::slice::from_raw_parts(self.wcs.as_ptr().cast::<WorkCompletion>(), self.n) }
    }
}

/// Only for polls of at most [`FIRST_POLL`] in all ([`SharedCq::poll_first`]'s): the
/// room is that many entries, not [`POLL_BATCH`].
impl PollSink for FirstPoll {
    fn room(&mut self, want: usize) -> *mut ibv_wc {
        debug_assert!(self.n + want <= FIRST_POLL);
        self.wcs[self.n..].as_mut_ptr().cast::<ibv_wc>()
    }
    unsafe fn filled(&mut self, n: usize) -> Result<()> {
        self.n += n;
        Ok(())
    }
}

/// Drops the completions of `out` from `from` on whose QP `is_retired`; those before
/// `from` (not of this poll) and the order stay.
fn drop_retired(out: &mut Vec<WorkCompletion>, from: usize, is_retired: impl Fn(u32) -> bool) {
    let mut at = 0;
    out.retain(|wc| {
        at += 1;
        at <= from || !is_retired(wc.qp_num())
    });
}

/// Where a poll puts the completions the device writes.
pub(super) trait PollSink {
    /// Room for `want` entries (at most [`POLL_BATCH`]), written by the device.
    fn room(&mut self, want: usize) -> *mut ibv_wc;
    /// The device wrote the first `n` entries of the room.
    ///
    /// # Safety
    /// `n` entries at the start of the last [`room`](Self::room) are written.
    unsafe fn filled(&mut self, n: usize) -> Result<()>;
}

/// Entries taken from the device per call.
pub(super) const POLL_BATCH: usize = 32;

/// A list that grows: the device writes at its end (a shared CQ's poll, whose
/// completions are routed once the poll is over).
impl PollSink for Vec<WorkCompletion> {
    fn room(&mut self, want: usize) -> *mut ibv_wc {
        self.reserve(want);
        self.spare_capacity_mut().as_mut_ptr().cast::<ibv_wc>()
    }
    unsafe fn filled(&mut self, n: usize) -> Result<()> {
        // SAFETY: the device wrote `n` entries past the end, inside the room reserved;
        // a WorkCompletion is an ibv_wc.
        unsafe { self.set_len(self.len() + n) };
        Ok(())
    }
}

/// Batches on the stack, each handed to `f` as it is written (an endpoint's own CQ,
/// whose completions are taken one by one).
pub(super) struct Batches<F> {
    // (not zeroed: 1.5 KiB a poll; the device writes the entries it returns)
    wcs: [std::mem::MaybeUninit<ibv_wc>; POLL_BATCH],
    f: F,
}

impl<F: FnMut(&[ibv_wc]) -> Result<()>> Batches<F> {
    pub(super) fn new(f: F) -> Self {
        Batches { wcs: [const { std::mem::MaybeUninit::uninit() }; POLL_BATCH], f }
    }
}

impl<F: FnMut(&[ibv_wc]) -> Result<()>> PollSink for Batches<F> {
    fn room(&mut self, _want: usize) -> *mut ibv_wc {
        self.wcs.as_mut_ptr().cast::<ibv_wc>()
    }
    unsafe fn filled(&mut self, n: usize) -> Result<()> {
        // SAFETY: per the contract, the first `n` entries are written.
        (self.f)(unsafe { std::slice::from_raw_parts(self.wcs.as_ptr().cast::<ibv_wc>(), n) })
    }
}

/// One wake-up of a completion channel and its CQ: consumes a pending notification (if
/// any, and if `channel` is not null: a channel other CQs share is read by its owner),
/// re-arms the CQ, then polls up to `budget` completions into `sink`, [`POLL_BATCH`] at
/// a time. Returns whether completions may be left (the budget ran out): the channel
/// signals only new ones, so the caller must come back for them. The one poll loop of
/// both kinds of CQ: an endpoint's own and a shared one.
///
/// # Safety
/// `channel` (unless null) and `cq` must be live, `cq` created on `channel`.
pub(super) unsafe fn poll_channel_cq(
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    budget: usize,
    sink: &mut impl PollSink,
) -> Result<bool> {
    let l = loaded();
    let mut ev_cq = std::ptr::null_mut();
    let mut ev_ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: per the contract; the channel is non-blocking; an event, if returned, is
    // acked once.
    if !channel.is_null() && unsafe { (l.ibv_get_cq_event)(channel, &mut ev_cq, &mut ev_ctx) } == 0 {
        // SAFETY: one ack for the one event just taken, before re-arming.
        unsafe { (l.ibv_ack_cq_events)(ev_cq, 1) };
    }
    // SAFETY: per the contract.
    unsafe {
        arm(cq)?;
        poll_batches(cq, budget, sink)
    }
}

/// Arms `cq`: its channel signals the next completion. Before polling, so that nothing
/// slips in between.
///
/// # Safety
/// `cq` must be live.
#[inline(always)]
unsafe fn arm(cq: *mut ibv_cq) -> Result<()> {
    // SAFETY: per the contract.
    if unsafe { ibv_req_notify_cq(cq, 0) } != 0 {
        return Err(VerbsError::last(VerbsOp::ReqNotifyCq));
    }
    Ok(())
}

/// Polls up to `budget` completions of `cq` into `sink`, [`POLL_BATCH`] at a time;
/// returns whether completions may be left (the budget ran out).
///
/// # Safety
/// `cq` must be live.
#[inline(always)]
unsafe fn poll_batches(cq: *mut ibv_cq, budget: usize, sink: &mut impl PollSink) -> Result<bool> {
    let mut left = budget;
    while left > 0 {
        let want = left.min(POLL_BATCH);
        // SAFETY: the CQ is live (the contract); the sink's room holds `want` entries.
        let n = unsafe { ibv_poll_cq(cq, want as i32, sink.room(want)) };
        if n < 0 {
            return Err(VerbsError::with(VerbsOp::PollCq, libc::EIO));
        }
        let n = (n as usize).min(want);
        // SAFETY: ibv_poll_cq wrote the first `n` entries of the room.
        unsafe { sink.filled(n)? };
        if n < want {
            return Ok(false);
        }
        left -= n;
    }
    Ok(true)
}

/// One endpoint's place on a shared CQ: its reserved entries and a reference that keeps
/// the CQ alive. Dropped after the endpoint's QP (it is a field of the endpoint): gives
/// the entries back and retires the QP's number.
pub struct CqAttachment {
    cq: Arc<SharedCq>,
    cqes: u32,
    qp_num: Option<u32>,
}

impl CqAttachment {
    /// Reserves `cqes` entries on `cq` for a QP of the device `verbs`.
    pub(super) fn reserve(cq: &Arc<SharedCq>, verbs: *mut ibv_context, cqes: u32) -> Result<CqAttachment> {
        if verbs != cq.verbs {
            return Err(VerbsError::with(VerbsOp::AttachCq, libc::EXDEV));
        }
        if !cq.change_budget(|b| b.reserve(cqes)) {
            return Err(VerbsError::with(VerbsOp::AttachCq, libc::ENOSPC));
        }
        Ok(CqAttachment { cq: cq.clone(), cqes, qp_num: None })
    }
    pub(super) fn cq(&self) -> &SharedCq {
        &self.cq
    }
    /// The QP was created with number `n`. Refused while completions of an earlier QP
    /// of the same number may still be queued (they would reach this one).
    pub(super) fn set_qp_num(&mut self, n: u32) -> Result<()> {
        if !self.cq.budget().may_take(n) {
            return Err(VerbsError::with(VerbsOp::AttachCq, libc::EBUSY));
        }
        self.qp_num = Some(n);
        Ok(())
    }
    /// The QP is to be destroyed later, on another thread ([`CqBudget::mark_closing`]).
    pub(super) fn mark_closing(&self) {
        if let Some(n) = self.qp_num {
            self.cq.change_budget(|b| b.mark_closing(n));
        }
    }
}

impl Drop for CqAttachment {
    fn drop(&mut self) {
        self.cq.change_budget(|b| b.release(self.cqes, self.qp_num));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(wcs: &[WorkCompletion]) -> Vec<(u32, u64)> {
        wcs.iter().map(|wc| (wc.qp_num(), wc.wr_id())).collect()
    }

    #[test]
    fn a_poll_writes_at_the_end_of_the_list_and_keeps_what_was_there() {
        let mut out = vec![WorkCompletion::received(1, 10)];
        for round in 0..3u64 {
            let room = out.room(POLL_BATCH);
            // as the device does: entries written through the pointer, then counted
            for i in 0..2 {
                let wc = WorkCompletion::sent(2, round * 2 + i);
                // SAFETY: the room holds POLL_BATCH entries.
                unsafe { room.add(i as usize).write(wc.0) };
            }
            // SAFETY: two entries were written.
            unsafe { out.filled(2).unwrap() };
        }
        let mut want = vec![(1, 10)];
        want.extend((0..6).map(|i| (2, i)));
        assert_eq!(ids(&out), want);
        assert!(out[1..].iter().all(|wc| !wc.is_receive() && wc.imm() == 0));
    }

    #[test]
    fn completions_of_retired_qps_are_dropped_from_this_poll_only() {
        let mut out: Vec<WorkCompletion> =
            [(7, 1), (8, 2), (7, 3), (9, 4), (7, 5)].iter().map(|&(qp, id)| WorkCompletion::received(qp, id)).collect();
        drop_retired(&mut out, 2, |qp| qp == 7);
        assert_eq!(ids(&out), vec![(7, 1), (8, 2), (9, 4)], "before `from`: kept; after: QP 7's dropped, order kept");
        drop_retired(&mut out, 0, |_| false);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn reservations_never_exceed_the_capacity() {
        let mut b = CqBudget::new(100);
        assert!(b.reserve(32));
        assert!(b.reserve(32));
        assert!(b.reserve(32));
        assert!(!b.reserve(32), "96 + 32 > 100");
        assert_eq!((b.free(), b.attached), (4, 3));
        assert!(b.reserve(4), "exactly full fits");
        assert_eq!(b.free(), 0);
        assert!(!b.reserve(0), "a QP with no entries is no QP");
        b.release(32, Some(7));
        assert_eq!((b.free(), b.attached), (32, 3));
        assert!(b.reserve(32));
        assert!(!b.reserve(u32::MAX), "no overflow");
    }

    #[test]
    fn a_retired_qp_number_stays_retired_until_the_cq_is_drained() {
        let mut b = CqBudget::new(64);
        assert!(b.reserve(32));
        b.release(32, Some(17));
        assert!(b.is_retired(17));
        assert!(!b.is_retired(18));
        let before = b.retired_count();
        b.release(0, Some(19)); // retired while the poll ran
        b.drained(before);
        assert!(!b.is_retired(17));
        assert!(b.is_retired(19), "retired during the poll: not known to be drained");
        b.drained(b.retired_count());
        assert!(!b.is_retired(19));
        // a QP never created (a failed build) retires nothing
        assert!(b.reserve(32));
        b.release(32, None);
        assert!(!b.is_retired(0));
        assert_eq!(b.free(), 64);
    }

    #[test]
    fn a_closing_qp_number_cannot_be_taken_until_retired_and_drained() {
        let mut b = CqBudget::new(1024);
        assert!(b.reserve(512));
        assert!(b.may_take(7));
        b.mark_closing(7); // the connection closed; its QP is destroyed later
        assert!(!b.may_take(7));
        assert!(!b.is_retired(7), "its completions are dropped by owner, not filtered");
        b.drained(b.retired_count()); // a poll that finds the CQ empty changes nothing
        assert!(!b.may_take(7), "not destroyed yet: the number is still the old QP's");
        let before = b.retired_count();
        b.release(512, Some(7)); // destroyed now
        assert!(b.is_retired(7) && !b.may_take(7));
        b.drained(before);
        assert!(!b.may_take(7), "retired after the poll began");
        b.drained(b.retired_count());
        assert!(b.may_take(7));
        assert_eq!(b.free(), 1024);
    }

    #[test]
    fn idle_connections_per_shared_cq() {
        // what the idle client gets per CQ of the largest size
        let per_cq = MAX_SHARED_CQES / super::super::QueueDepths::IDLE.cqes();
        assert_eq!(per_cq, 1023);
        let mut b = CqBudget::new(MAX_SHARED_CQES);
        for _ in 0..per_cq {
            assert!(b.reserve(super::super::QueueDepths::IDLE.cqes()));
        }
        assert!(!b.reserve(super::super::QueueDepths::IDLE.cqes()));
    }
}
