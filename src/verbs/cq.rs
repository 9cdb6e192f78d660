//! A completion queue and the completion channel it signals, each with an owner: a
//! [`CompletionChannel`] (an fd) may signal many CQs, and every [`CompletionQueue`]
//! holds its channel alive. A queue is made armed on a non-blocking channel and
//! destroyed in Drop (the CQ, then its hold on the channel). A connection with a CQ of
//! its own has a channel of its own; the server's shared CQs of one device share one
//! channel (`shared_cq.rs`), so that many CQs cost the event loop one fd.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::*;

use super::resources::{loaded, set_nonblocking, CmId};
use super::{Result, VerbsError, VerbsOp};

/// A completion channel: a non-blocking fd, readable when a CQ made on it has an event.
pub(crate) struct CompletionChannel {
    channel: NonNull<ibv_comp_channel>,
    /// Its device (compared, never used).
    verbs: *mut ibv_context,
    /// Counts it (and the CQs on it, which hold it) on its device until it is destroyed.
    _hold: super::device::DeviceHold,
}

// SAFETY: a kernel fd and plain data; libibverbs allows its use from any thread, and
// events are read by one thread at a time (the event loop, or the client that owns it).
unsafe impl Send for CompletionChannel {}
// SAFETY: as for Send: `&self` offers the fd and the reading of events, which the
// kernel serialises.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// A channel of the device `verbs`, non-blocking.
    ///
    /// # Safety
    /// `verbs` must be a live device context that outlives the channel (rdma_cm keeps
    /// its devices open while any id of them is).
    pub(crate) unsafe fn new(verbs: *mut ibv_context) -> Result<Arc<CompletionChannel>> {
        // SAFETY: `verbs` is live (the contract); the result is checked.
        let channel = NonNull::new(unsafe { (loaded().ibv_create_comp_channel)(verbs) })
            .ok_or_else(|| VerbsError::last(VerbsOp::CreateCompChannel))?;
        let c = CompletionChannel { channel, verbs, _hold: super::device::DeviceHold::new(verbs) };
        set_nonblocking(c.fd()).map_err(|e| VerbsError::with(VerbsOp::SetNonblocking, e))?;
        Ok(Arc::new(c))
    }
    /// A channel of the device of `id`. librdmacm keeps the device open from its first
    /// use until the module lets go of it after a removal (`verbs::device`), which it
    /// does only once this channel is gone.
    pub(crate) fn of_device(id: &CmId) -> Result<Arc<CompletionChannel>> {
        let verbs = id.raw().verbs;
        if verbs.is_null() {
            return Err(VerbsError::with(VerbsOp::NoDevice, libc::ENODEV));
        }
        // SAFETY: the live device context of `id`, open until its objects are gone.
        unsafe { Self::new(verbs) }
    }
    /// The device it is on.
    pub(crate) fn device(&self) -> super::DeviceKey {
        super::DeviceKey::from_context(self.verbs)
    }
    /// Whether `id` is on this channel's device.
    pub(crate) fn is_for(&self, id: &CmId) -> bool {
        id.raw().verbs == self.verbs
    }
    /// The fd: readable when a CQ of this channel has an event.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: the channel is live while self is.
        unsafe { self.channel.as_ref().fd }
    }
    pub(crate) fn as_ptr(&self) -> *mut ibv_comp_channel {
        self.channel.as_ptr()
    }
    /// Takes one pending event, if any, acknowledges it and hands `f` the CQ it is for;
    /// false when none was pending (the channel is non-blocking).
    pub(crate) fn take_event(&self, f: impl FnOnce(*mut ibv_cq)) -> bool {
        let l = loaded();
        let mut ev_cq = std::ptr::null_mut();
        let mut ev_ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the channel is live; an event, if returned, is acked once, at once.
        unsafe {
            if (l.ibv_get_cq_event)(self.as_ptr(), &mut ev_cq, &mut ev_ctx) != 0 {
                return false;
            }
            (l.ibv_ack_cq_events)(ev_cq, 1);
        }
        f(ev_cq);
        true
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ made on the channel holds an Arc of it, so none is left.
        unsafe { (loaded().ibv_destroy_comp_channel)(self.channel.as_ptr()) };
    }
}

pub(crate) struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    /// Dropped after Drop destroyed the CQ.
    channel: Arc<CompletionChannel>,
    comp_vector: i32,
}

// SAFETY: verbs objects owned by this struct; libibverbs allows their use from any
// thread, and the providers lock a CQ inside poll and arm.
unsafe impl Send for CompletionQueue {}
// SAFETY: as for Send: what `&self` offers (the pointers for poll and arm, the fd) is
// locked by the provider or read-only.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// `cqes` entries on vector `comp_vector` modulo the device's vectors; armed, so
    /// that the channel's fd signals the next completion.
    ///
    /// # Safety
    /// `verbs` must be a live device context that outlives the queue (librdmacm keeps
    /// a device open while an object of it is counted, `verbs::device`).
    pub(crate) unsafe fn new(verbs: *mut ibv_context, cqes: u32, comp_vector: u32) -> Result<CompletionQueue> {
        // SAFETY: the contract, passed on.
        unsafe { Self::on_channel(verbs, cqes, comp_vector, CompletionChannel::new(verbs)?) }
    }

    /// As [`new`](Self::new), signalling `channel` (which other CQs may share).
    ///
    /// # Safety
    /// As `new`; `channel` is of the same device.
    pub(crate) unsafe fn on_channel(
        verbs: *mut ibv_context,
        cqes: u32,
        comp_vector: u32,
        channel: Arc<CompletionChannel>,
    ) -> Result<CompletionQueue> {
        let l = loaded();
        // SAFETY: `verbs` is live (the contract); `num_comp_vectors` is plain data.
        let comp_vector = (comp_vector % unsafe { (*verbs).num_comp_vectors }.max(1) as u32) as i32;
        // SAFETY: as above; the channel is live while its Arc is; the result is checked.
        let cq = unsafe { (l.ibv_create_cq)(verbs, cqes as i32, std::ptr::null_mut(), channel.as_ptr(), comp_vector) };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::last(VerbsOp::CreateCq))?;
        // From here on Drop releases it.
        let q = CompletionQueue { cq, channel, comp_vector };
        // SAFETY: the CQ is live.
        if unsafe { ibv_req_notify_cq(q.cq_ptr(), 0) } != 0 {
            return Err(VerbsError::last(VerbsOp::ReqNotifyCq));
        }
        Ok(q)
    }

    /// The channel's fd: readable when a completion is due.
    pub(crate) fn fd(&self) -> i32 {
        self.channel.fd()
    }
    pub(crate) fn cq_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }
    pub(crate) fn channel_ptr(&self) -> *mut ibv_comp_channel {
        self.channel.as_ptr()
    }
    pub(crate) fn comp_vector(&self) -> i32 {
        self.comp_vector
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP that used the CQ was destroyed before (its owner's field
        // order, or the last `Arc` of a shared CQ); every event of it was acked when
        // taken. The channel goes after, with the last CQ that holds it.
        unsafe { (loaded().ibv_destroy_cq)(self.cq.as_ptr()) };
    }
}
