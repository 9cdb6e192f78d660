//! Which RDMA device an id is on, and letting go of a device the kernel removed
//! (docs/operator-guide.md, "When a device goes away").
//!
//! librdmacm opens a device's context (its `/dev/infiniband/uverbsN` file) at the first
//! id on it and keeps it open while the process runs. A driver without
//! `disassociate_ucontext` (rxe, and others) cannot finish removing a device until every
//! process has closed that file; so once the server has destroyed every object of its
//! own on a removed device, it asks librdmacm to look at the device list again, which
//! closes the context of a device that is gone and no id of which is left.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use parking_lot::Mutex;

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
    /// The device's entry in `/sys/class/infiniband_verbs` and its inode: the kernel
    /// deletes the entry first when it removes the device, and a device added back under
    /// the same name is a new entry. `None`: unknown (never taken for removed).
    entry: Option<(PathBuf, u64)>,
    name: String,
}

fn held() -> parking_lot::MutexGuard<'static, Vec<Held>> {
    HELD.lock()
}

/// Counts one object on a device from its making to its Drop (a field of the object's
/// owner, dropped after the object is freed).
pub(crate) struct DeviceHold(DeviceKey);

impl DeviceHold {
    /// `verbs`: the open context the object was just made on.
    pub(crate) fn new(verbs: *mut rdma_sys::ibv_context) -> DeviceHold {
        DeviceHold::counted(DeviceKey::from_context(verbs), || device_of(verbs))
    }

    /// `device`: the device's entry and name, asked for the device's first object.
    fn counted(key: DeviceKey, device: impl FnOnce() -> (Option<(PathBuf, u64)>, String)) -> DeviceHold {
        let mut h = held();
        match h.iter_mut().find(|d| d.key == key) {
            Some(d) => d.objects += 1,
            None => {
                let (entry, name) = device();
                h.push(Held { key, objects: 1, entry, name });
            }
        }
        DeviceHold(key)
    }
}

/// The sysfs entry (path and inode) and the name of an open context's device.
fn device_of(verbs: *mut rdma_sys::ibv_context) -> (Option<(PathBuf, u64)>, String) {
    let Some((name, path)) = name_and_path(verbs) else { return (None, "?".into()) };
    let path = PathBuf::from(path);
    let entry = std::fs::metadata(&path).ok().map(|m| (path, m.ino()));
    (entry, name)
}

/// The kernel's name of an open context's device and its `/sys/class/infiniband_verbs`
/// path (`None`: no context, or no device).
fn name_and_path(verbs: *mut rdma_sys::ibv_context) -> Option<(String, String)> {
    if verbs.is_null() {
        return None;
    }
    // SAFETY: callers pass an open context (of a live id, or one an object was just made
    // on); its `device` stays allocated while the context is open, and `name` and
    // `dev_path` are NUL-terminated arrays libibverbs filled when it read the device list.
    unsafe {
        let dev = (*verbs).device;
        if dev.is_null() {
            return None;
        }
        let text = |a: &[std::ffi::c_char]| std::ffi::CStr::from_ptr(a.as_ptr()).to_string_lossy().into_owned();
        Some((text(&(*dev).name), text(&(*dev).dev_path)))
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

/// The devices the module holds objects on whose entry in `/sys/class/infiniband_verbs`
/// is gone (or is another device's now): the kernel is removing them (it deletes that
/// entry before it waits for the processes that hold the device), whether or not
/// rdma_cm told the module (docs/operator-guide.md, "When a device goes away"). Each by
/// key and name. One `stat` per device, which needs no file descriptor: a server out of
/// them still sees its devices; any answer but "not there" concludes nothing.
pub(crate) fn unlisted() -> Vec<(DeviceKey, String)> {
    let entries: Vec<(DeviceKey, String, PathBuf, u64)> = held()
        .iter()
        .filter_map(|d| d.entry.as_ref().map(|(path, ino)| (d.key, d.name.clone(), path.clone(), *ino)))
        .collect();
    entries
        .into_iter()
        .filter(|(_, _, path, ino)| match std::fs::metadata(path) {
            Ok(m) => m.ino() != *ino,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        })
        .map(|(key, name, _, _)| (key, name))
        .collect()
}

/// Whether an object of the module's is still on `device`.
pub(crate) fn holds(device: DeviceKey) -> bool {
    held().iter().any(|d| d.key == device)
}

/// The kernel's name of the device of `id` ("rxe0", "mlx5_1"), for the log.
pub(crate) fn name_of(id: &CmId) -> String {
    name_and_path(id.raw().verbs).map_or_else(|| "?".into(), |(name, _)| name)
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
        let hold = |k| DeviceHold::counted(k, || (None, "test".into()));
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
    fn a_held_device_whose_entry_is_gone_or_replaced_is_unlisted() {
        // (directories stand for the sysfs entries; addresses no context has)
        let dir = std::env::temp_dir().join(format!("valkey-rdma-unlisted-{}", std::process::id()));
        let (a, b, c) = (dir.join("uverbsA"), dir.join("uverbsB"), dir.join("uverbsC"));
        for p in [&a, &b, &c] {
            std::fs::create_dir_all(p).unwrap();
        }
        let ino = |p: &PathBuf| std::fs::metadata(p).unwrap().ino();
        let (ka, kb, kc, kd) = (DeviceKey(0x61_0000), DeviceKey(0x62_0000), DeviceKey(0x63_0000), DeviceKey(0x64_0000));
        let entry = |p: &PathBuf| Some((p.clone(), ino(p)));
        let ha = DeviceHold::counted(ka, || (entry(&a), "rxeA".into()));
        let ha2 = DeviceHold::counted(ka, || unreachable!("asked for the first object only"));
        let hb = DeviceHold::counted(kb, || (entry(&b), "rxeB".into()));
        let hc = DeviceHold::counted(kc, || (entry(&c), "rxeC".into()));
        let hd = DeviceHold::counted(kd, || (None, "unknown".into()));
        let ours = |k: &[DeviceKey]| unlisted().into_iter().filter(|(key, _)| k.contains(key)).collect::<Vec<_>>();
        let keys = [ka, kb, kc, kd];
        assert_eq!(ours(&keys), [], "every entry is there");
        // (a new entry is made before the old one goes, so that it cannot reuse its inode)
        let replace = |p: &PathBuf| {
            let new = p.with_extension("new");
            std::fs::create_dir(&new).unwrap();
            std::fs::remove_dir(p).unwrap();
            std::fs::rename(&new, p).unwrap();
        };
        std::fs::remove_dir(&a).unwrap();
        replace(&b);
        replace(&c);
        let held_c = DeviceHold::counted(DeviceKey(0x65_0000), || (entry(&c), "rxeC2".into()));
        let mut gone = ours(&keys);
        gone.sort_by_key(|(k, _)| k.0);
        assert_eq!(
            gone,
            [(ka, "rxeA".to_string()), (kb, "rxeB".to_string()), (kc, "rxeC".to_string())],
            "a removed entry, and one another device made anew under the same name"
        );
        assert_eq!(ours(&[DeviceKey(0x65_0000)]), [], "the new device is not taken for removed");
        drop((ha, ha2, hb, hc, hd, held_c));
        assert_eq!(ours(&keys), [], "nothing held there any more");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
