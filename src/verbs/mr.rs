//! Protection domains and the memory regions registered on them. A region keeps its
//! domain alive and deregisters in Drop (the one place that calls `ibv_dereg_mr`), so a
//! domain is freed only after every region on it; the memory a region covers must stay
//! mapped until the region is dropped, which its owner arranges by field order (the
//! region before the buffer).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::*;

use super::resources::loaded;
use super::{Result, VerbsError, VerbsOp};

/// A protection domain, shared by an endpoint, its regions and the RX buffers prepared
/// for it off the event loop; freed when the last holder drops it.
pub struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    /// Counts the domain on its device until it is freed.
    _hold: super::device::DeviceHold,
}

// SAFETY: a verbs object; libibverbs is thread-safe for registering memory on a PD
// from several threads, and it is freed exactly once (Drop).
unsafe impl Send for ProtectionDomain {}
// SAFETY: the methods taking `&self` only register memory on it, which libibverbs
// allows from several threads at once.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// # Safety
    /// `verbs` must be a live device context that outlives the domain (librdmacm keeps
    /// a device open while the domain's hold is counted, `verbs::device`).
    pub(super) unsafe fn alloc(verbs: *mut ibv_context) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: per the contract.
        let pd = unsafe { (loaded().ibv_alloc_pd)(verbs) };
        let hold = super::device::DeviceHold::new(verbs);
        NonNull::new(pd)
            .map(|pd| Arc::new(ProtectionDomain { pd, _hold: hold }))
            .ok_or_else(|| VerbsError::last(VerbsOp::AllocPd))
    }
    pub(super) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }

    /// Registers memory only our own device reads and writes (control slots, TX).
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped until the region is dropped.
    pub(super) unsafe fn register_local(self: &Arc<Self>, addr: *mut u8, len: usize) -> Result<MemoryRegion> {
        // SAFETY: per the contract.
        unsafe { self.register_at(addr, len, local_access(), addr as u64) }
    }

    /// Registers a buffer the peer writes into (an RX buffer), at an address of its
    /// own rather than the buffer's: the peer learns nothing of this process's memory
    /// layout from RegisterXferMemory (docs/protocol.md §6). Returns the region and that
    /// address.
    ///
    /// # Safety
    /// As for [`register_local`](Self::register_local).
    pub(super) unsafe fn register_for_peer(self: &Arc<Self>, addr: *mut u8, len: usize) -> Result<(MemoryRegion, u64)> {
        let iova = peer_address(addr as u64);
        // SAFETY: per the contract.
        unsafe { self.register_at(addr, len, remote_access(), iova) }.map(|mr| (mr, iova))
    }

    /// # Safety
    /// As for [`register_local`](Self::register_local).
    unsafe fn register_at(self: &Arc<Self>, addr: *mut u8, len: usize, access: i32, iova: u64) -> Result<MemoryRegion> {
        if !super::pinned::admit(len as u64) {
            return Err(VerbsError::with(VerbsOp::PinnedCeiling, libc::EDQUOT));
        }
        // SAFETY: per the contract; the domain is live while self is.
        let mr = unsafe { (loaded().ibv_reg_mr_iova)(self.as_ptr(), addr.cast(), len, iova, access) };
        match NonNull::new(mr) {
            Some(mr) => Ok(MemoryRegion { mr, _pd: Arc::clone(self) }),
            None => {
                // ENOMEM here is almost always RLIMIT_MEMLOCK; the caller says so.
                let e = VerbsError::last(VerbsOp::RegMr);
                super::pinned::released(len as u64);
                Err(e)
            }
        }
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every region on this domain holds the domain, so all were
        // deregistered; every QP on it was destroyed before (its endpoint's field order).
        unsafe { (loaded().ibv_dealloc_pd)(self.as_ptr()) };
    }
}

/// A registered memory region. Deregisters in Drop, giving its bytes back to the
/// pinned-memory count; then lets go of its domain.
pub(crate) struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: a verbs object owned by this struct; libibverbs may deregister from any
// thread, and its keys and length are plain data.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&self` only reads the keys and the length, which never change.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    fn raw(&self) -> &ibv_mr {
        // SAFETY: live while self is; libibverbs does not change it after registration.
        unsafe { self.mr.as_ref() }
    }
    pub(crate) fn lkey(&self) -> u32 {
        self.raw().lkey
    }
    pub(crate) fn rkey(&self) -> u32 {
        self.raw().rkey
    }
    pub(crate) fn len(&self) -> usize {
        self.raw().length
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let len = self.len() as u64;
        // SAFETY: live, registered by `register_at`, and not used again: its owner drops
        // it only when no posted work request can still use it.
        unsafe { (loaded().ibv_dereg_mr)(self.mr.as_ptr()) };
        super::pinned::released(len);
    }
}

/// The address a peer is given for a buffer at `addr`: a fresh 4 GiB slot per
/// registration (RX buffers are at most 16 MiB), keeping the offset within the page so
/// that devices which map by page see the same layout.
pub(super) fn peer_address(addr: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT_SLOT: AtomicU64 = AtomicU64::new(1);
    let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % (1 << 30) + 1;
    (slot << 32) | (addr & (super::buffer::page_size() as u64 - 1))
}

/// A TX chunk or a control slot is only read and written by our own device (the
/// source of our writes and sends, the target of the peer's sends).
fn local_access() -> i32 {
    ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32
}

/// An RX buffer is written by the peer and by nothing else: the protocol never reads
/// one remotely, so RDMA READ is not granted (docs/protocol.md §6).
fn remote_access() -> i32 {
    (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_address_hides_the_buffer_and_keeps_its_page_offset() {
        let page = crate::verbs::buffer::page_size() as u64;
        let at = 0x7f3a_1234_5000u64 + 0x10;
        let (a, b) = (peer_address(at), peer_address(at));
        assert_ne!(a, at);
        assert_ne!(a, b, "each registration gets a slot of its own");
        assert_eq!(a % page, at % page);
        for x in [a, b] {
            assert!(x >= 1 << 32 && (x >> 32) <= 1 << 30, "{x:#x} outside the slots");
            assert!(x.checked_add(u64::from(crate::protocol::MAX_PEER_RX_SIZE)).is_some());
        }
    }
}
