//! Test knobs: faults the end-to-end suite cannot cause from outside, injected where
//! the real fault would surface, so that the real handling (the counter, the log line,
//! the clean-up) is what runs and is checked. Read once at load from the environment
//! variable `VALKEY_RDMA_TEST`: a comma-separated list of `name` or `name=N`, e.g.
//! `VALKEY_RDMA_TEST=fail-migrate=1,completion-budget=2`. Unset in production; an
//! unknown name is refused at load, so a typo in a test cannot pass silently.
//!
//! Only the `test-hooks` build (the test bed's) has them: without it every knob is off
//! at compile time, and a module loaded with `VALKEY_RDMA_TEST` set refuses to load.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The knobs, each with what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Knob {
    /// Do not look for server.el at load, as on a server layout we cannot read
    /// (listeners closed before the first accept).
    UnknownEventLoop,
    /// The next N `rdma_migrate_id` of accepted connections fail (EIO).
    FailMigrate,
    /// The next N `rdma_accept` fail (EIO).
    FailAccept,
    /// The next N accepts panic inside the accept handler (the panic
    /// policy).
    PanicInAccept,
    /// Completions taken per connection per wake-up, instead of 256.
    CompletionBudget,
    /// Every DEVICE_REMOVAL is dropped unread, as when the kernel removes a device
    /// without telling rdma_cm's users (seen with rxe under a wildcard listener).
    IgnoreDeviceRemoval,
}

const NAMES: [(&str, Knob); 6] = [
    ("unknown-event-loop", Knob::UnknownEventLoop),
    ("fail-migrate", Knob::FailMigrate),
    ("fail-accept", Knob::FailAccept),
    ("panic-accept", Knob::PanicInAccept),
    ("completion-budget", Knob::CompletionBudget),
    ("ignore-device-removal", Knob::IgnoreDeviceRemoval),
];

#[allow(clippy::declare_interior_mutable_const)]
const OFF: AtomicU64 = AtomicU64::new(0);
static VALUES: [AtomicU64; NAMES.len()] = [OFF; NAMES.len()];

/// A `VALKEY_RDMA_TEST` entry that is not a knob.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UnknownKnob(pub(crate) String);

impl std::fmt::Display for UnknownKnob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        write!(f, "VALKEY_RDMA_TEST: unknown knob {:?} (known: {})", self.0, names.join(", "))
    }
}

/// Parses a `VALKEY_RDMA_TEST` value (pure).
pub(crate) fn parse(spec: &str) -> Result<Vec<(Knob, u64)>, UnknownKnob> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (name, n) = item.split_once('=').unwrap_or((item, "1"));
            let knob = NAMES.iter().find(|(k, _)| *k == name).map(|(_, k)| *k);
            match (knob, n.parse::<u64>()) {
                (Some(k), Ok(n)) if n > 0 => Ok((k, n)),
                _ => Err(UnknownKnob(item.to_string())),
            }
        })
        .collect()
}

/// Sets the knobs from the environment (at load).
pub(crate) fn init_from_env() -> Result<(), String> {
    let Some(spec) = std::env::var_os("VALKEY_RDMA_TEST") else { return Ok(()) };
    let knobs = parse(&spec.to_string_lossy()).map_err(|e| e.to_string())?;
    if !cfg!(feature = "test-hooks") {
        return Err(
            "VALKEY_RDMA_TEST is set, but this build has no test knobs (cargo build --features test-hooks)".into()
        );
    }
    for (knob, n) in knobs {
        VALUES[knob as usize].store(n, Relaxed);
        log::warn!("RDMA: test knob {knob:?}={n} is set (VALKEY_RDMA_TEST); never in production");
    }
    Ok(())
}

/// The knob's value, if set.
#[cfg(feature = "test-hooks")]
pub(crate) fn value(knob: Knob) -> Option<u64> {
    Some(VALUES[knob as usize].load(Relaxed)).filter(|v| *v > 0)
}

/// For a knob that fires N times: whether it fires now (and counts it).
#[cfg(feature = "test-hooks")]
pub(crate) fn fire(knob: Knob) -> bool {
    VALUES[knob as usize].fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1)).is_ok()
}

/// No knob is ever set in a build without test hooks.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn value(_: Knob) -> Option<u64> {
    None
}

/// No knob ever fires in a build without test hooks.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn fire(_: Knob) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_counts_parse_and_typos_are_refused() {
        assert_eq!(
            parse("fail-migrate, completion-budget=2,").unwrap(),
            [(Knob::FailMigrate, 1), (Knob::CompletionBudget, 2)]
        );
        assert_eq!(parse("").unwrap(), []);
        assert_eq!(parse("fail-migrat").unwrap_err(), UnknownKnob("fail-migrat".into()));
        assert!(parse("fail-accept=0").is_err());
        assert!(parse("fail-accept=x").is_err());
        assert!(UnknownKnob("x".into()).to_string().contains("known: unknown-event-loop, fail-migrate"));
    }

    #[test]
    #[cfg(feature = "test-hooks")]
    fn a_knob_fires_as_many_times_as_set() {
        VALUES[Knob::FailAccept as usize].store(2, Relaxed);
        assert!(fire(Knob::FailAccept));
        assert!(fire(Knob::FailAccept));
        assert!(!fire(Knob::FailAccept));
        assert_eq!(value(Knob::FailAccept), None);
    }
}
