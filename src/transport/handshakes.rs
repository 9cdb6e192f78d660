//! How many connections may be in the RDMA handshake at once: from one source address,
//! and overall. A connection in the handshake holds its verbs resources and a place
//! among the server's clients until its client finishes the handshake or the
//! handshake deadline gives up on it (docs/protocol.md §5, about 12 s); a peer that
//! opens connect requests and never finishes them could otherwise hold thousands.
//! A request over either bound is rejected at once, with one rate-limited log line
//! (docs/protocol.md §1).

use std::collections::HashMap;
use std::net::IpAddr;

/// Connections in the handshake from one source address. valkey-benchmark and
/// libvalkey connect one connection at a time, and a burst of a pool's connections
/// completes its handshakes in milliseconds: this bounds what a peer that never
/// completes one can hold, not what a client pool opens.
pub(crate) const MAX_PER_SOURCE: u32 = 256;
/// Connections in the handshake from all sources together.
pub(crate) const MAX_TOTAL: u32 = 1024;

/// The counts, as pure bookkeeping (unit-tested without a NIC).
#[derive(Default)]
pub(crate) struct Counts {
    by_source: HashMap<IpAddr, u32>,
    total: u32,
}

/// Why a connect request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    Source(u32),
    Total(u32),
}

impl std::fmt::Display for Over {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Over::Source(n) => write!(f, "{n} connections from this address are still in the RDMA handshake"),
            Over::Total(n) => write!(f, "{n} connections are still in the RDMA handshake"),
        }
    }
}

impl Counts {
    pub(crate) fn admit(&mut self, ip: IpAddr, per_source: u32, total: u32) -> Result<(), Over> {
        let from = self.by_source.get(&ip).copied().unwrap_or(0);
        if from >= per_source {
            return Err(Over::Source(from));
        }
        if self.total >= total {
            return Err(Over::Total(self.total));
        }
        *self.by_source.entry(ip).or_insert(0) += 1;
        self.total += 1;
        Ok(())
    }

    pub(crate) fn done(&mut self, ip: IpAddr) {
        if let Some(n) = self.by_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&ip);
            }
            self.total -= 1;
        }
    }

    pub(crate) fn total(&self) -> u32 {
        self.total
    }
}

fn with<R>(f: impl FnOnce(&mut Counts) -> R) -> R {
    f(super::MODULE.handshakes.lock().get_or_insert_with(Counts::default))
}

/// A connection's place among those in the handshake, given back when it is dropped
/// (the handshake completed, or the connection ended first).
pub(crate) struct Slot(IpAddr);

impl Slot {
    pub(crate) fn admit(ip: IpAddr) -> Result<Slot, Over> {
        with(|c| c.admit(ip, MAX_PER_SOURCE, MAX_TOTAL)).map(|()| Slot(ip))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        with(|c| c.done(self.0));
    }
}

/// Connections in the handshake now (INFO).
pub(crate) fn in_progress() -> u32 {
    with(|c| c.total())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_holds_and_a_finished_handshake_frees_its_place() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut c = Counts::default();
        for _ in 0..3 {
            c.admit(a, 3, 5).unwrap();
        }
        assert_eq!(c.admit(a, 3, 5), Err(Over::Source(3)), "per source");
        c.admit(b, 3, 5).unwrap();
        c.admit(b, 3, 5).unwrap();
        assert_eq!(c.admit(b, 3, 5), Err(Over::Total(5)), "overall");
        c.done(a);
        c.admit(b, 3, 5).unwrap();
        assert_eq!(c.total(), 5);
        for _ in 0..2 {
            c.done(a);
        }
        for _ in 0..3 {
            c.done(b);
        }
        assert_eq!(c.total(), 0);
        assert!(c.by_source.is_empty(), "no entry kept for an address with none left");
        c.done(a); // one too many (never admitted): ignored
        assert_eq!(c.total(), 0);
    }
}
