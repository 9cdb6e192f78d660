//! Which RDMA device an id is on, and letting go of a device the kernel removed
//! (docs/operator-guide.md, "When a device goes away").
//!
//! librdmacm opens a device's context (its `/dev/infiniband/uverbsN` file) at the first
//! id on it and keeps it open while the process runs. A driver without
//! `disassociate_ucontext` (rxe, and others) cannot finish removing a device until every
//! process has closed that file; so once the server has destroyed every object of its
//! own on a removed device, it asks librdmacm to look at the device list again, which
//! closes the context of a device that is gone and no id of which is left.

use std::sync::Mutex;

use super::resources::CmId;

/// A device context, by address: compared, never dereferenced through this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DeviceKey(usize);

impl DeviceKey {
    /// The device of `id` (none before its address is bound or resolved to one).
    pub(crate) fn of(id: &CmId) -> Option<DeviceKey> {
        let verbs = id.raw().verbs;
        (!verbs.is_null()).then_some(DeviceKey(verbs as usize))
    }
    pub(crate) fn from_context(verbs: *mut rdma_sys::ibv_context) -> DeviceKey {
        DeviceKey(verbs as usize)
    }
}

/// The module's objects on each device that hold its context (protection domains and
/// completion channels: every region holds its domain, every CQ its channel).
static HELD: Mutex<Vec<(DeviceKey, usize)>> = Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<(DeviceKey, usize)>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts one object on a device from its making to its Drop (a field of the object's
/// owner, dropped after the object is freed).
pub(crate) struct DeviceHold(DeviceKey);

impl DeviceHold {
    pub(crate) fn new(verbs: *mut rdma_sys::ibv_context) -> DeviceHold {
        let key = DeviceKey::from_context(verbs);
        let mut h = held();
        match h.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => h.push((key, 1)),
        }
        DeviceHold(key)
    }
}

impl Drop for DeviceHold {
    fn drop(&mut self) {
        let mut h = held();
        if let Some(i) = h.iter().position(|(k, _)| *k == self.0) {
            h[i].1 -= 1;
            if h[i].1 == 0 {
                h.swap_remove(i);
            }
        }
    }
}

/// Whether an object of the module's is still on `device`.
pub(crate) fn holds(device: DeviceKey) -> bool {
    held().iter().any(|(k, _)| *k == device)
}

/// The kernel's name of the device of `id` ("rxe0", "mlx5_1"), for the log.
pub(crate) fn name_of(id: &CmId) -> String {
    let verbs = id.raw().verbs;
    if verbs.is_null() {
        return "?".into();
    }
    // SAFETY: the context of a live id is open, and so is its `device`, whose `name` is
    // a NUL-terminated array filled when the device list was read.
    unsafe {
        let dev = (*verbs).device;
        if dev.is_null() {
            return "?".into();
        }
        std::ffi::CStr::from_ptr((*dev).name.as_ptr()).to_string_lossy().into_owned()
    }
}

/// Has librdmacm read the device list again: the context of a device that the kernel
/// removed, and of which no id is left, is closed. Call it only when no object of the
/// module's is left on a removed device ([`holds`]), because those would outlive the
/// context they were made on. Returns false when librdmacm could not read the list:
/// it reads none while no RDMA device is left at all, and then keeps a removed
/// device's context until one is back (or another appears).
pub(crate) fn let_go_of_removed_devices() -> bool {
    let Ok(l) = super::lib() else { return false };
    let mut n = 0;
    // SAFETY: returns a NULL-terminated list of contexts (or NULL), which is handed back
    // to rdma_free_devices unchanged, at once.
    unsafe {
        let list = (l.rdma_get_devices)(&mut n);
        if list.is_null() {
            return false;
        }
        (l.rdma_free_devices)(list);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_held_while_any_object_on_it_is() {
        // (addresses no context has: the tests share the count with other tests)
        let (a, b) = (0x51_0000 as *mut rdma_sys::ibv_context, 0x52_0000 as *mut rdma_sys::ibv_context);
        let (ka, kb) = (DeviceKey::from_context(a), DeviceKey::from_context(b));
        assert!(!holds(ka) && !holds(kb));
        let pd = DeviceHold::new(a);
        let channel = DeviceHold::new(a);
        let other = DeviceHold::new(b);
        assert!(holds(ka) && holds(kb));
        drop(pd);
        assert!(holds(ka), "the channel still holds it");
        drop(channel);
        assert!(!holds(ka));
        assert!(holds(kb), "another device is counted apart");
        drop(other);
        assert!(!holds(kb));
    }
}
