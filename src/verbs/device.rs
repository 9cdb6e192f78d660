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
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

struct Held {
    key: DeviceKey,
    objects: usize,
    /// The context's `ibv_device`, by address: libibverbs lists the same one for as long
    /// as the kernel has the device, and never again once it is removed (a device added
    /// back under the same name is a new one).
    device: usize,
    name: String,
}

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts one object on a device from its making to its Drop (a field of the object's
/// owner, dropped after the object is freed).
pub(crate) struct DeviceHold(DeviceKey);

impl DeviceHold {
    /// `verbs`: the open context the object was just made on.
    pub(crate) fn new(verbs: *mut rdma_sys::ibv_context) -> DeviceHold {
        DeviceHold::counted(DeviceKey::from_context(verbs), || device_of(verbs))
    }

    /// `device`: the `ibv_device` (by address) and name, asked for the device's first object.
    fn counted(key: DeviceKey, device: impl FnOnce() -> (usize, String)) -> DeviceHold {
        let mut h = held();
        match h.iter_mut().find(|d| d.key == key) {
            Some(d) => d.objects += 1,
            None => {
                let (device, name) = device();
                h.push(Held { key, objects: 1, device, name });
            }
        }
        DeviceHold(key)
    }
}

/// The `ibv_device` of an open context (by address) and its name.
fn device_of(verbs: *mut rdma_sys::ibv_context) -> (usize, String) {
    if verbs.is_null() {
        return (0, "?".into());
    }
    // SAFETY: `verbs` is an open context (an object was just made on it); its `device`
    // stays allocated while the context is open, and its `name` is a NUL-terminated array.
    unsafe {
        let dev = (*verbs).device;
        if dev.is_null() {
            return (0, "?".into());
        }
        (dev as usize, std::ffi::CStr::from_ptr((*dev).name.as_ptr()).to_string_lossy().into_owned())
    }
}

impl Drop for DeviceHold {
    fn drop(&mut self) {
        let mut h = held();
        if let Some(i) = h.iter().position(|d| d.key == self.0) {
            h[i].objects -= 1;
            if h[i].objects == 0 {
                h.swap_remove(i);
            }
        }
    }
}

/// The devices the module holds objects on that libibverbs no longer lists: the kernel
/// is removing them (it unlists a device before it waits for the processes that hold
/// it), whether or not rdma_cm told the module (docs/operator-guide.md, "When a device
/// goes away"). Each by key and name. Reads the device list only while the module
/// holds a device, and concludes nothing when the list cannot be read.
pub(crate) fn unlisted() -> Vec<(DeviceKey, String)> {
    let devices: Vec<usize> = held().iter().map(|d| d.device).collect();
    if devices.is_empty() {
        return Vec::new();
    }
    let Some(listed) = listed_devices() else { return Vec::new() };
    held().iter().filter(|d| d.device != 0 && !listed.contains(&d.device)).map(|d| (d.key, d.name.clone())).collect()
}

/// The `ibv_device`s libibverbs lists now, by address; `None` when it cannot say.
fn listed_devices() -> Option<Vec<usize>> {
    let l = super::lib().ok()?;
    let mut n = 0;
    // SAFETY: a NULL-terminated list of `n` devices (or NULL), read and freed at once.
    unsafe {
        let list = (l.ibv_get_device_list)(&mut n);
        if list.is_null() {
            return None;
        }
        let listed = (0..n.max(0) as usize).map(|i| *list.add(i) as usize).collect();
        (l.ibv_free_device_list)(list);
        Some(listed)
    }
}

/// Whether an object of the module's is still on `device`.
pub(crate) fn holds(device: DeviceKey) -> bool {
    held().iter().any(|d| d.key == device)
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
        let (ka, kb) = (DeviceKey(0x51_0000), DeviceKey(0x52_0000));
        let hold = |k| DeviceHold::counted(k, || (0, "test".into()));
        assert!(!holds(ka) && !holds(kb));
        let pd = hold(ka);
        let channel = hold(ka);
        let other = hold(kb);
        assert!(holds(ka) && holds(kb));
        drop(pd);
        assert!(holds(ka), "the channel still holds it");
        drop(channel);
        assert!(!holds(ka));
        assert!(holds(kb), "another device is counted apart");
        drop(other);
        assert!(!holds(kb));
    }

    #[test]
    fn a_held_device_that_is_not_listed_is_reported_once_per_device() {
        // (no device has these addresses: whatever libibverbs lists, they are not on it)
        let (ka, kb) = (DeviceKey(0x61_0000), DeviceKey(0x62_0000));
        let a1 = DeviceHold::counted(ka, || (0x71_0000, "rxeA".into()));
        let a2 = DeviceHold::counted(ka, || unreachable!("asked for the first object only"));
        let b = DeviceHold::counted(kb, || (0, "unknown".into()));
        let gone = |k| unlisted().into_iter().filter(|(key, _)| *key == k).collect::<Vec<_>>();
        if listed_devices().is_some() {
            assert_eq!(gone(ka), [(ka, "rxeA".to_string())]);
        }
        assert_eq!(gone(kb), [], "a device whose ibv_device is unknown is never taken for removed");
        drop((a1, a2, b));
        assert_eq!(gone(ka), [], "nothing held there any more");
    }
}
