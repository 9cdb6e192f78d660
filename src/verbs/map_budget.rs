//! Admission by memory mappings: a process may hold at most `vm.max_map_count`
//! mappings (65530 by default). A connection's buffers are slots of shared chunks
//! ([`buffer`](super::buffer)), so what each connection adds is the provider's queues
//! mapped into the process (rxe: send and receive queue, and a CQ where it has its own);
//! a chunk adds three mappings for hundreds of buffers.
//!
//! Without a check, the connection that crosses the limit is refused (a chunk cannot be
//! mapped) — but so is, later, every *established* connection whose next reply needs a
//! TX buffer from a chunk not yet made. So a new endpoint is admitted only while the
//! process keeps room for it ([`MAPS_PER_NEW_ENDPOINT`]) *and* for the chunks of a TX
//! buffer of every live endpoint ([`reserved_for`]), plus [`MAPS_HEADROOM`] for the rest
//! of the process; beyond that it is refused ([`VerbsOp::MapCount`](super::VerbsOp::MapCount))
//! before anything is made.
//!
//! Counting the mappings means reading `/proc/self/maps` (tens of thousands of lines
//! near the limit), so it is done only when an estimate (the last count plus
//! [`MAPS_PER_NEW_ENDPOINT`] per endpoint made since) comes near the limit, and not
//! again within [`REMEASURE_AFTER_REFUSAL`] of a refusal unless endpoints went away.

use std::io::Read;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Result, VerbsError, VerbsOp};

/// Mappings an endpoint holds of its own: the provider's queues (rxe: send queue,
/// receive queue, and the CQ where it cannot share one).
pub const MAPS_PER_ENDPOINT: u64 = 3;
/// Mappings of a chunk of buffers: the chunk and its two guard pages.
pub const MAPS_PER_CHUNK: u64 = 3;
/// Mappings a new endpoint may add at most: its own, and a new chunk each for its
/// control slots and its RX buffer.
pub const MAPS_PER_NEW_ENDPOINT: u64 = MAPS_PER_ENDPOINT + 2 * MAPS_PER_CHUNK;
/// Buffers of one chunk, at the least, for a TX buffer of up to 2 MiB (a client's RX
/// buffer: libvalkey's 1 MiB, ours up to 16 MiB by option).
const TX_BUFFERS_PER_CHUNK: u64 = 16;
/// Mappings kept free for everything else in the process (allocator, libraries, fork).
pub const MAPS_HEADROOM: u64 = 256;
/// After a refusal, later requests are refused without counting again for this long,
/// unless an endpoint was freed meanwhile.
pub const REMEASURE_AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// What [`MapBudget::check`] says about one more endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Room by the estimate: admit.
    Admit,
    /// The estimate comes near the limit: count the mappings, then ask [`MapBudget::admits`].
    Count,
    /// Refused a moment ago and nothing was freed since: refuse without counting.
    Refuse,
}

/// The bookkeeping, apart from reading `/proc` (pure, tested below).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapBudget {
    /// `vm.max_map_count` at the last count.
    pub limit: u64,
    /// Mappings at the last count.
    pub counted: u64,
    /// Endpoints made since the last count.
    made_since: u64,
    /// When the last refusal was, and how many endpoints were live then.
    refused: Option<(Instant, u64)>,
}

impl MapBudget {
    pub fn new(limit: u64, counted: u64) -> Self {
        MapBudget { limit, counted, made_since: 0, refused: None }
    }
    /// Mappings needed free for one more endpoint with `live` endpoints already there.
    pub fn needed(live: u64) -> u64 {
        MAPS_PER_NEW_ENDPOINT + reserved_for(live) + MAPS_HEADROOM
    }
    pub fn check(&self, live: u64, now: Instant) -> Check {
        let estimate = self.counted + self.made_since * MAPS_PER_NEW_ENDPOINT;
        if estimate + Self::needed(live) <= self.limit {
            return Check::Admit;
        }
        match self.refused {
            Some((at, live_then)) if now.duration_since(at) < REMEASURE_AFTER_REFUSAL && live >= live_then => {
                Check::Refuse
            }
            _ => Check::Count,
        }
    }
    /// A fresh count: `maps` mappings, the limit now `limit`.
    pub fn counted(&mut self, maps: u64, limit: u64) {
        self.counted = maps;
        self.limit = limit;
        self.made_since = 0;
    }
    /// By the last count, whether one more endpoint fits.
    pub fn admits(&self, live: u64) -> bool {
        self.counted + Self::needed(live) <= self.limit
    }
    pub fn made(&mut self) {
        self.made_since += 1;
        self.refused = None;
    }
    pub fn refuse(&mut self, live: u64, now: Instant) {
        self.refused = Some((now, live));
    }
}

/// Mappings kept free for the chunks that TX buffers of `live` endpoints may need (each
/// makes its TX buffer at its first write, and gives it back when idle).
pub fn reserved_for(live: u64) -> u64 {
    (live * MAPS_PER_CHUNK).div_ceil(TX_BUFFERS_PER_CHUNK)
}

static BUDGET: Mutex<Option<MapBudget>> = Mutex::new(None);

/// `vm.max_map_count`, where it can be read.
pub fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()
}

/// The process's mappings now: the lines of `/proc/self/maps`.
fn count_maps() -> Option<u64> {
    let mut f = std::fs::File::open("/proc/self/maps").ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(lines),
            Ok(n) => lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Admits one more endpoint with `live` endpoints already there, or refuses it
/// (`MapCount`, `ENOMEM`). Where the counts cannot be read, everything is admitted.
pub(super) fn admit(live: u64) -> Result<()> {
    let mut g = BUDGET.lock();
    let now = Instant::now();
    if g.is_none() {
        let (Some(limit), Some(maps)) = (max_map_count(), count_maps()) else { return Ok(()) };
        *g = Some(MapBudget::new(limit, maps));
    }
    let b = g.as_mut().expect("set above");
    match b.check(live, now) {
        Check::Admit => {}
        Check::Refuse => return Err(VerbsError::with(VerbsOp::MapCount, libc::ENOMEM)),
        Check::Count => {
            let (Some(limit), Some(maps)) = (max_map_count(), count_maps()) else { return Ok(()) };
            b.counted(maps, limit);
            if !b.admits(live) {
                b.refuse(live, now);
                return Err(VerbsError::with(VerbsOp::MapCount, libc::ENOMEM));
            }
        }
    }
    b.made();
    Ok(())
}

/// Mappings a server needs for `clients` connections that each have written (their own,
/// and chunks for their control slots, RX and TX buffers; at most two chunks per
/// [`TX_BUFFERS_PER_CHUNK`] clients): what the doctor checks the limit against. The
/// server itself and its libraries take about [`MAPS_HEADROOM`] more.
pub fn maps_for_clients(clients: u64) -> u64 {
    clients * MAPS_PER_ENDPOINT + 2 * reserved_for(clients) + MAPS_HEADROOM
}

/// How many clients `limit` mappings hold, by [`maps_for_clients`].
pub fn clients_for_maps(limit: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, limit);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if maps_for_clients(mid) <= limit {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The last count: (mappings, `vm.max_map_count`), for log lines.
pub fn map_count_now() -> Option<(u64, u64)> {
    BUDGET.lock().as_ref().map(|b| (b.counted, b.limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_by_estimate_far_from_the_limit_and_counts_near_it() {
        let t = Instant::now();
        let mut b = MapBudget::new(65530, 200);
        assert_eq!(b.check(0, t), Check::Admit);
        // needed with 4000 live: 9 + 750 + 256 = 1015
        assert_eq!(MapBudget::needed(4000), 1015);
        assert_eq!(b.check(4000, t), Check::Admit);
        for _ in 0..7200 {
            b.made();
        }
        // estimate 200 + 9 × 7200 = 65000, + 1015: over, so count
        assert_eq!(b.check(4000, t), Check::Count);
        b.counted(14600, 65530); // 2 per endpoint in fact
        assert!(b.admits(4000));
        assert_eq!(b.check(4000, t), Check::Admit);
    }

    #[test]
    fn the_default_limit_holds_ten_thousand_idle_server_connections_that_can_all_reply() {
        // what an idle connection holds (rxe: send and receive queue; 3 where it has its
        // own CQ), a chunk per 1024 control slots and per 512 RX buffers, 200 for the rest
        let held =
            |live: u64| 200 + MAPS_PER_ENDPOINT * live + MAPS_PER_CHUNK * (live.div_ceil(1024) + live.div_ceil(512));
        let mut live = 0u64;
        while MapBudget::new(65530, held(live)).admits(live) {
            live += 1;
        }
        assert!(live > 10_000, "{live}");
        // with the TX buffers' chunks reserved, every one of them can still reply
        assert!(held(live) + live.div_ceil(TX_BUFFERS_PER_CHUNK) * MAPS_PER_CHUNK <= 65530);
        // and the doctor's estimate is on the safe side of it
        assert!(clients_for_maps(65530) <= live, "{} > {live}", clients_for_maps(65530));
        assert!(clients_for_maps(65530) > 10_000);
        assert!(maps_for_clients(clients_for_maps(65530)) <= 65530);
        assert!(maps_for_clients(clients_for_maps(65530) + 1) > 65530);
    }

    #[test]
    fn a_refusal_is_not_recounted_for_a_moment_unless_endpoints_went_away() {
        let t = Instant::now();
        let mut b = MapBudget::new(1000, 990);
        assert_eq!(b.check(10, t), Check::Count);
        assert!(!b.admits(10));
        b.refuse(10, t);
        assert_eq!(b.check(10, t + Duration::from_millis(10)), Check::Refuse);
        assert_eq!(b.check(11, t + Duration::from_millis(10)), Check::Refuse);
        assert_eq!(b.check(9, t + Duration::from_millis(10)), Check::Count, "one went away");
        assert_eq!(b.check(10, t + REMEASURE_AFTER_REFUSAL), Check::Count, "later: count again");
        b.counted(300, 1000);
        assert!(b.admits(10));
        b.made();
        assert_eq!(b.check(10, t + Duration::from_millis(20)), Check::Admit, "made() clears the refusal");
    }

    #[test]
    fn a_raised_limit_is_seen_at_the_next_count() {
        let mut b = MapBudget::new(65530, 65400);
        assert!(!b.admits(0));
        b.counted(65400, 262144);
        assert!(b.admits(10000));
        assert_eq!(b.limit, 262144);
    }
}
