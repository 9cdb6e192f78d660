//! A completion queue and the completion channel it signals: one owner for both, made
//! armed with a non-blocking channel, destroyed in Drop (the CQ, then its channel). A
//! connection with a CQ of its own holds one; a shared CQ (`shared_cq.rs`) wraps one.

use std::ptr::NonNull;

use rdma_sys::*;

use super::resources::{loaded, set_nonblocking};
use super::{Result, VerbsError, VerbsOp};

pub(crate) struct CompletionQueue {
    // Field order is not drop order here: Drop destroys the CQ before the channel.
    channel: NonNull<ibv_comp_channel>,
    cq: NonNull<ibv_cq>,
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
    /// `verbs` must be a live device context that outlives the queue (rdma_cm keeps its
    /// devices open while any id of them is).
    pub(crate) unsafe fn new(verbs: *mut ibv_context, cqes: u32, comp_vector: u32) -> Result<CompletionQueue> {
        let l = loaded();
        // SAFETY: `verbs` is live (the contract); the result is checked.
        let channel = NonNull::new(unsafe { (l.ibv_create_comp_channel)(verbs) })
            .ok_or_else(|| VerbsError::last(VerbsOp::CreateCompChannel))?;
        // SAFETY: as above; `num_comp_vectors` is plain data of the live context.
        let comp_vector = (comp_vector % unsafe { (*verbs).num_comp_vectors }.max(1) as u32) as i32;
        // SAFETY: the channel was just made; a CQ that cannot be made leaves it to be
        // destroyed here, and nothing else has seen it.
        let cq = unsafe {
            let cq = (l.ibv_create_cq)(verbs, cqes as i32, std::ptr::null_mut(), channel.as_ptr(), comp_vector);
            match NonNull::new(cq) {
                Some(cq) => cq,
                None => {
                    let e = VerbsError::last(VerbsOp::CreateCq);
                    (l.ibv_destroy_comp_channel)(channel.as_ptr());
                    return Err(e);
                }
            }
        };
        // From here on Drop releases both.
        let q = CompletionQueue { channel, cq, comp_vector };
        set_nonblocking(q.fd()).map_err(|e| VerbsError::with(VerbsOp::SetNonblocking, e))?;
        // SAFETY: the CQ is live.
        if unsafe { ibv_req_notify_cq(q.cq_ptr(), 0) } != 0 {
            return Err(VerbsError::last(VerbsOp::ReqNotifyCq));
        }
        Ok(q)
    }

    /// The channel's fd: readable when a completion is due.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: the channel is live while self is.
        unsafe { self.channel.as_ref().fd }
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
        let l = loaded();
        // SAFETY: every QP that used the CQ was destroyed before (its owner's field
        // order, or the last `Arc` of a shared CQ); the CQ goes before its channel.
        unsafe {
            (l.ibv_destroy_cq)(self.cq.as_ptr());
            (l.ibv_destroy_comp_channel)(self.channel.as_ptr());
        }
    }
}
