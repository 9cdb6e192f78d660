//! When each connection's keepalive tick comes, and at which ticks a quiet connection is
//! probed (docs/protocol.md §5, schedule). Pure: the transport asks it at every firing of
//! the module's timer.
//!
//! The timer fires [`SLICES`] times per keepalive period, and each firing ticks the
//! connections of one slice, so that a period's Keepalives do not all leave in the same
//! moment (each is an rxe doorbell: ten thousand of them held the event loop for seconds
//! under Soft-RoCE). Every connection is still ticked once per period.
//!
//! A quiet connection (nothing in flight) is probed only at its turn, once every
//! [`quiet_stride`] periods, so that at most about [`QUIET_PROBES_PER_PERIOD`] Keepalives
//! per period go to quiet connections however many there are.

/// Firings of the timer per keepalive period.
pub const SLICES: u64 = 10;
/// Keepalives per period the schedule gives quiet connections, in all: up to this many
/// idle connections each get one every period, as before; beyond, each gets one every
/// [`quiet_stride`] periods.
pub const QUIET_PROBES_PER_PERIOD: u64 = 1000;

/// The timer's `n`th firing, counted from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing(pub u64);

impl Firing {
    /// The slice of the period this firing ticks.
    pub fn slice(self) -> u64 {
        self.0 % SLICES
    }
    /// The keepalive periods begun before this firing.
    pub fn period(self) -> u64 {
        self.0 / SLICES
    }
    /// The first firing of a period: where the once-a-period work of the module goes.
    pub fn starts_period(self) -> bool {
        self.slice() == 0
    }
}

/// A connection's place in the schedule, spread over its key (an address, so aligned
/// and close to its neighbours: the bits are mixed before any remainder is taken).
pub fn place(key: usize) -> u64 {
    // (splitmix64's finalizer)
    let mut z = key as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether the connection at `place` is ticked at `firing`.
pub fn ticks_at(place: u64, firing: Firing) -> bool {
    place % SLICES == firing.slice()
}

/// Periods between two probes of a quiet connection with `live` connections: 1 up to
/// [`QUIET_PROBES_PER_PERIOD`] connections.
pub fn quiet_stride(live: usize) -> u64 {
    (live as u64).div_ceil(QUIET_PROBES_PER_PERIOD).max(1)
}

/// Whether `period` is the turn of the quiet connection at `place`, every `stride` periods.
pub fn quiet_turn(place: u64, period: u64, stride: u64) -> bool {
    (place / SLICES + period).is_multiple_of(stride.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys as an allocator hands them out: a base and a fixed spacing.
    fn keys(n: usize, spacing: usize) -> Vec<usize> {
        (0..n).map(|i| 0x5555_0000_0000 + i * spacing).collect()
    }

    #[test]
    fn every_connection_is_ticked_once_per_period_and_the_slices_share_them_evenly() {
        for spacing in [16, 64, 1024, 4096] {
            for n in [1, 37, 1000, 10_000] {
                let places: Vec<u64> = keys(n, spacing).into_iter().map(place).collect();
                let mut per_slice = [0usize; SLICES as usize];
                for &p in &places {
                    let ticks: Vec<u64> = (0..SLICES).filter(|&f| ticks_at(p, Firing(SLICES * 7 + f))).collect();
                    assert_eq!(ticks.len(), 1, "place {p}: ticked {ticks:?} in one period");
                    per_slice[ticks[0] as usize] += 1;
                }
                if n >= 1000 {
                    let even = n / SLICES as usize;
                    for (s, &k) in per_slice.iter().enumerate() {
                        assert!(
                            k.abs_diff(even) * 5 <= even,
                            "spacing {spacing}, {n} connections: slice {s} has {k}, even is {even}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn each_quiet_connection_gets_one_turn_per_stride_and_no_period_far_more_than_the_bound() {
        for spacing in [16, 64, 1024, 4096] {
            for n in [1, 999, 1000, 1001, 4000, 10_000, 25_000] {
                let stride = quiet_stride(n);
                assert_eq!(stride, if n <= 1000 { 1 } else { (n as u64).div_ceil(1000) });
                let places: Vec<u64> = keys(n, spacing).into_iter().map(place).collect();
                for &p in &places {
                    let turns = (100..100 + stride).filter(|&period| quiet_turn(p, period, stride)).count();
                    assert_eq!(turns, 1, "place {p}, stride {stride}");
                }
                for period in 100..100 + stride {
                    let probed = places.iter().filter(|&&p| quiet_turn(p, period, stride)).count() as u64;
                    // the places spread like random numbers: within a fifth of the mean
                    assert!(
                        probed * 5 <= QUIET_PROBES_PER_PERIOD * 6,
                        "spacing {spacing}, {n} connections, period {period}: {probed} probes"
                    );
                }
            }
        }
    }

    #[test]
    fn the_first_firing_of_each_period_starts_it() {
        let starts: Vec<u64> = (0..35).filter(|&n| Firing(n).starts_period()).collect();
        assert_eq!(starts, [0, 10, 20, 30]);
        assert_eq!((Firing(29).period(), Firing(30).period()), (2, 3));
    }
}
