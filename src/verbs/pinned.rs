//! The memory this process has registered with RDMA devices (pinned: it counts against
//! `ulimit -l` and cannot be swapped), and the ceiling the module keeps it under. Every
//! registration goes through [`admit`] and every deregistration through [`released`],
//! so the count is exact; a registration that would pass the ceiling is refused before
//! the device is asked (docs/protocol.md §2).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

static PINNED: AtomicU64 = AtomicU64::new(0);
/// No ceiling until the module sets one (the client side never does).
static CEILING: AtomicU64 = AtomicU64::new(u64::MAX);

/// Bytes registered now.
pub fn pinned_now() -> u64 {
    PINNED.load(Ordering::Relaxed)
}

/// The ceiling in force (`u64::MAX`: none).
pub fn ceiling() -> u64 {
    CEILING.load(Ordering::Relaxed)
}

pub fn set_ceiling(bytes: u64) {
    CEILING.store(bytes, Ordering::Relaxed);
}

/// Takes `len` bytes under the ceiling for a registration about to be made; false
/// (nothing taken) when they do not fit. [`released`] gives them back.
pub(super) fn admit(len: u64) -> bool {
    let ceiling = ceiling();
    PINNED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| now.checked_add(len).filter(|&n| n <= ceiling))
        .is_ok()
}

/// Whether `len` more bytes fit under the ceiling now (nothing is taken).
pub fn has_room(len: u64) -> bool {
    pinned_now().saturating_add(len) <= ceiling()
}

/// A registration of `len` bytes was given up (or failed after [`admit`]).
pub(super) fn released(len: u64) {
    PINNED.fetch_sub(len, Ordering::AcqRel);
}

/// The default ceiling: what `maxclients` clients pin at `rdma-rx-size` (each at the
/// most a connection holds for long: its RX buffer grown to `rdma-rx-size`, a TX buffer
/// the size of a default peer window, its control slots), but never more than half of
/// the machine's memory. Where `ulimit -l` applies the kernel enforces it too (the
/// refusal then names it); the ceiling is what bounds a server that may lock without
/// limit (`LimitMEMLOCK=infinity`, `CAP_IPC_LOCK`).
pub fn default_ceiling(per_client: u64, maxclients: u64, ram: u64) -> u64 {
    per_client.saturating_mul(maxclients.max(1)).min(ram / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ceiling_is_what_maxclients_pin_at_most_half_the_memory() {
        const MIB: u64 = 1 << 20;
        assert_eq!(default_ceiling(2 * MIB, 100, 64 * 1024 * MIB), 200 * MIB, "clients");
        assert_eq!(default_ceiling(2 * MIB, 10_000, 8 * 1024 * MIB), 4 * 1024 * MIB, "half the memory");
        assert_eq!(default_ceiling(u64::MAX, u64::MAX, 16 * MIB), 8 * MIB, "no overflow");
    }

    // The ceiling is process-wide: one test walks through it (tests run in parallel).
    #[test]
    fn registrations_past_the_ceiling_are_refused_and_released_ones_make_room() {
        let before = pinned_now();
        set_ceiling(before + 100);
        assert!(admit(60));
        assert!(has_room(40) && !has_room(41));
        assert!(!admit(41), "60 + 41 > 100");
        assert!(admit(40));
        assert!(!admit(1));
        released(60);
        assert!(admit(50));
        released(90);
        assert_eq!(pinned_now(), before);
        set_ceiling(u64::MAX);
    }
}
