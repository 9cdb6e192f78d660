//! A device the kernel removes (a driver reload, a VF reset, `rdma link delete`):
//! rdma_cm sends DEVICE_REMOVAL to every id on it, and a driver that cannot revoke a
//! process's access (rxe, and others) finishes the removal only once every process has
//! freed all it holds there. The module closes the connections on the device (the
//! server reads EOF from each), its listeners lose their ids (`listener`), its shared
//! CQs are forgotten, and once the last of its connections is released, librdmacm is
//! asked to close the device (`verbs::let_go_of_removed_devices`). TCP and the other
//! devices serve on throughout (docs/operator-guide.md, "When a device goes away").

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{connection, live, shared_cqs, stats, MODULE};
use crate::verbs::{self, DeviceKey};

/// Removed devices whose resources are still being released.
pub(crate) struct Removals {
    devices: Mutex<Vec<Removed>>,
    /// Whether `devices` has any (read at every close).
    any: AtomicBool,
}

struct Removed {
    device: DeviceKey,
    name: String,
    /// Its shared CQs are forgotten (once its last connection closed).
    cqs_forgotten: bool,
}

impl Removals {
    pub(crate) const fn new() -> Removals {
        Removals { devices: Mutex::new(Vec::new()), any: AtomicBool::new(false) }
    }
}

/// DEVICE_REMOVAL for an id on `device` (the first of many: every id on it gets one):
/// closes every live connection on it, with one log line for all.
pub(crate) fn device_removed(device: DeviceKey, name: &str) {
    {
        let mut removed = MODULE.removals.devices.lock();
        if removed.iter().any(|r| r.device == device) {
            return;
        }
        removed.push(Removed { device, name: name.to_owned(), cqs_forgotten: false });
        MODULE.removals.any.store(true, Ordering::Relaxed);
    }
    stats::add(&MODULE.stats.devices_removed, 1);
    let on_it: Vec<_> = live::snapshot().into_iter().filter(|c| c.inner.device == Some(device)).collect();
    log::warn!(
        "RDMA: device {name} removed: closing the {} connection(s) on it and releasing what the module holds there; TCP and other devices serve on",
        on_it.len()
    );
    for c in &on_it {
        connection::on_disconnected(c);
        connection::queue_if_due(c);
    }
}

/// At each tick: a device the module holds objects on whose `/sys/class/infiniband_verbs`
/// entry is gone is being removed, and the kernel waits for this process to let go of
/// it. rdma_cm sends DEVICE_REMOVAL to each id on it first, but a removal it never
/// announced (seen with rxe under a wildcard listener, the kernel then waiting in
/// `ib_uverbs_remove_one` until the server exited) must be handled as if it had: these
/// are the devices (key and name) newly found so, each with its log line. The tick then
/// takes the ids of their listeners (`listener::device_unlisted`) and connections
/// ([`device_removed`]), and [`release_finished`] lets go of the rest.
pub(crate) fn unannounced() -> Vec<(DeviceKey, String)> {
    let mut found = verbs::unlisted_devices();
    found.retain(|(device, _)| !MODULE.removals.devices.lock().iter().any(|r| r.device == *device));
    for (_, name) in &found {
        log::warn!("RDMA: device {name} is no longer listed, yet no removal event came for it: handling it as removed");
    }
    found
}

/// For each removed device with no live connection left: its shared CQs are forgotten;
/// once the last object of the module's on it is freed (on the `rdma-release` thread),
/// librdmacm is asked to close it. Called at each close and from the module's tick
/// (every keepalive period), until librdmacm could read the device list.
pub(crate) fn release_finished() {
    if !MODULE.removals.any.load(Ordering::Relaxed) {
        return;
    }
    let live = live::snapshot();
    let mut removed = MODULE.removals.devices.lock();
    for r in removed.iter_mut() {
        if r.cqs_forgotten || live.iter().any(|c| c.inner.device == Some(r.device)) {
            continue;
        }
        r.cqs_forgotten = true;
        let cqs = shared_cqs::forget_device(r.device);
        log::info!(
            "RDMA: device {}: its last connection is closed; releasing its {cqs} shared completion queue(s)",
            r.name
        );
    }
    drop(live);
    removed.retain(|r| {
        let let_go = r.cqs_forgotten && !verbs::device_held(r.device) && verbs::let_go_of_removed_devices();
        if let_go {
            log::info!("RDMA: device {}: the module holds nothing on it any more", r.name);
        }
        !let_go
    });
    MODULE.removals.any.store(!removed.is_empty(), Ordering::Relaxed);
}

/// (device, whether its CQs are forgotten) of each removal still in progress.
#[cfg(test)]
pub(crate) fn in_progress() -> Vec<(DeviceKey, bool)> {
    MODULE.removals.devices.lock().iter().map(|r| (r.device, r.cqs_forgotten)).collect()
}
