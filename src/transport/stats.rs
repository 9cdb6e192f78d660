//! The module's counters, shown by `INFO rdma` (docs/operator-guide.md). What moves
//! with every request is counted without atomics, under the lock its path holds
//! already: a connection's [`Traffic`] under the connection's, the shared CQs'
//! [`Polls`] under their table's; a connection's traffic joins the module's totals when
//! it closes. The rest are relaxed atomics, bumped once per event, never per byte.
//! Everything that describes the current state (connections, windows, pinned memory) is
//! computed when INFO asks, from the live set.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::protocol::Violation;

/// Why a connect request was refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rejected {
    /// Building its verbs resources failed (locked memory, QP or CQ limits).
    Resources,
    /// `rdma_accept`, or watching its completion channel, failed.
    Accept,
    /// `rdma_migrate_id` failed.
    Migrate,
    /// Too many connections in the handshake ([`super::handshakes`]).
    Handshakes,
}

/// A CM event that ended a connection (docs/protocol.md §1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum CmEnd {
    Disconnected,
    Other,
}

/// One connection's data traffic, counted under its lock.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// RDMA_WRITE_WITH_IMM received and posted.
    pub(crate) writes_in: u64,
    pub(crate) writes_out: u64,
}

impl Traffic {
    pub(crate) fn add(&mut self, t: &Traffic) {
        let mut sum = self.counts();
        for (s, n) in sum.iter_mut().zip(t.counts()) {
            *s += n;
        }
        *self = Traffic::from_counts(sum);
    }

    /// The four counts, in the one order [`Stats::closed`] keeps them in too.
    fn counts(self) -> [u64; 4] {
        [self.bytes_in, self.bytes_out, self.writes_in, self.writes_out]
    }

    fn from_counts([bytes_in, bytes_out, writes_in, writes_out]: [u64; 4]) -> Traffic {
        Traffic { bytes_in, bytes_out, writes_in, writes_out }
    }
}

/// The shared CQs' wake-ups and polls, counted under their table's lock.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Polls {
    pub(crate) wakeups: u64,
    pub(crate) completions: u64,
    pub(crate) budget_hits: u64,
}

pub(crate) struct Stats {
    pub(crate) accepted: AtomicU64,
    rejected: [AtomicU64; 4],
    /// The traffic of the connections closed so far ([`retire`]), as [`Traffic::counts`].
    closed: [AtomicU64; 4],
    pub(crate) rx_registrations_sent: AtomicU64,
    pub(crate) rx_registrations_received: AtomicU64,
    pub(crate) keepalives_sent: AtomicU64,
    pub(crate) keepalives_received: AtomicU64,
    /// Of the connections with a CQ of their own (the shared CQs count their [`Polls`]).
    pub(crate) wakeups: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) budget_hits: AtomicU64,
    pub(crate) rx_grown: AtomicU64,
    pub(crate) tx_buffers_released: AtomicU64,
    /// Closed connections whose teardown waits on the `rdma-release` thread (a gauge).
    pub(crate) releasing: AtomicU64,
    violations: [AtomicU64; Violation::KINDS.len()],
    pub(crate) work_request_errors: AtomicU64,
    pub(crate) local_errors: AtomicU64,
    pub(crate) peers_silent: AtomicU64,
    pub(crate) handshake_timeouts: AtomicU64,
    cm_ends: [AtomicU64; 2],
    /// Listeners that listened again after their device or address came back.
    pub(crate) relistens: AtomicU64,
    /// Devices the kernel removed while the module had something on them.
    pub(crate) devices_removed: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

impl Stats {
    pub(crate) const fn new() -> Stats {
        Stats {
            accepted: ZERO,
            rejected: [ZERO; 4],
            closed: [ZERO; 4],
            rx_registrations_sent: ZERO,
            rx_registrations_received: ZERO,
            keepalives_sent: ZERO,
            keepalives_received: ZERO,
            wakeups: ZERO,
            completions: ZERO,
            budget_hits: ZERO,
            rx_grown: ZERO,
            tx_buffers_released: ZERO,
            releasing: ZERO,
            violations: [ZERO; Violation::KINDS.len()],
            work_request_errors: ZERO,
            local_errors: ZERO,
            peers_silent: ZERO,
            handshake_timeouts: ZERO,
            cm_ends: [ZERO; 2],
            relistens: ZERO,
            devices_removed: ZERO,
        }
    }
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// A closing connection's traffic joins the totals. Called on the main thread, as INFO
/// is: a connection's traffic is counted either among the live or among the closed.
pub(crate) fn retire(t: Traffic) {
    for (c, n) in super::MODULE.stats.closed.iter().zip(t.counts()) {
        if n > 0 {
            add(c, n);
        }
    }
}

/// The traffic of the connections closed so far.
fn closed() -> Traffic {
    Traffic::from_counts(super::MODULE.stats.closed.each_ref().map(|c| c.load(Relaxed)))
}

pub(crate) fn rejected(why: Rejected) {
    add(&super::MODULE.stats.rejected[why as usize], 1);
}

pub(crate) fn violation(v: &Violation) {
    add(&super::MODULE.stats.violations[v.index()], 1);
}

pub(crate) fn cm_end(kind: CmEnd) {
    add(&super::MODULE.stats.cm_ends[kind as usize], 1);
}

use crate::server::api::InfoField as Field;

/// What describes the current state, from the live set (see `super::info`).
pub(crate) struct Now {
    /// (listening addresses, those of them down: device removed, address gone).
    pub(crate) listeners: (usize, usize),
    pub(crate) connected: u64,
    pub(crate) pending: u64,
    pub(crate) pinned_bytes: u64,
    pub(crate) rx_size: u64,
    /// (min, max) of the RX windows the clients registered (our TX windows).
    pub(crate) peer_windows: Option<(u64, u64)>,
    /// (min, max) of our RX windows now (they grow from 64 KiB up to `rx_size`).
    pub(crate) rx_windows: Option<(u64, u64)>,
    /// Completion queues shared by the connections (`transport::shared_cqs`).
    pub(crate) shared_cqs: u64,
    /// (distinct completion vectors they use, the vectors their device offers).
    pub(crate) vectors: (u64, u64),
    /// The live connections' traffic, summed.
    pub(crate) traffic: Traffic,
    /// The shared CQs' counts.
    pub(crate) polls: Polls,
}

/// The fields of `INFO rdma`, in order (names documented in docs/operator-guide.md).
pub(crate) fn fields(now: &Now) -> Vec<Field> {
    let s = &super::MODULE.stats;
    let get = |c: &AtomicU64| c.load(Relaxed);
    let (wmin, wmax) = now.peer_windows.unwrap_or((0, 0));
    let (rmin, rmax) = now.rx_windows.unwrap_or((0, 0));
    let wakeups = get(&s.wakeups) + now.polls.wakeups;
    let completions = get(&s.completions) + now.polls.completions;
    let mut traffic = closed();
    traffic.add(&now.traffic);
    vec![
        Field::Num("listeners", now.listeners.0 as u64),
        Field::Num("listeners_down", now.listeners.1 as u64),
        Field::Num("relistens", get(&s.relistens)),
        Field::Num("devices_removed", get(&s.devices_removed)),
        Field::Num("connected_clients", now.connected),
        Field::Num("total_connections_received", get(&s.accepted)),
        Field::Dict(
            "rejected_connections",
            vec![
                ("resources", get(&s.rejected[Rejected::Resources as usize])),
                ("accept", get(&s.rejected[Rejected::Accept as usize])),
                ("migrate", get(&s.rejected[Rejected::Migrate as usize])),
                ("handshakes", get(&s.rejected[Rejected::Handshakes as usize])),
            ],
        ),
        Field::Num("handshakes_in_progress", super::handshakes::in_progress().into()),
        Field::Num("pending_connections", now.pending),
        Field::Num("releasing_connections", get(&s.releasing)),
        Field::Num("total_net_input_bytes", traffic.bytes_in),
        Field::Num("total_net_output_bytes", traffic.bytes_out),
        Field::Num("total_rdma_writes_in", traffic.writes_in),
        Field::Num("total_rdma_writes_out", traffic.writes_out),
        Field::Num("rx_registrations_sent", get(&s.rx_registrations_sent)),
        Field::Num("rx_registrations_received", get(&s.rx_registrations_received)),
        Field::Num("rx_window_bytes", now.rx_size),
        Field::Num("rx_window_min_bytes", rmin),
        Field::Num("rx_window_max_bytes", rmax),
        Field::Num("rx_windows_grown", get(&s.rx_grown)),
        Field::Num("peer_rx_window_min_bytes", wmin),
        Field::Num("peer_rx_window_max_bytes", wmax),
        Field::Num("keepalives_sent", get(&s.keepalives_sent)),
        Field::Num("keepalives_received", get(&s.keepalives_received)),
        Field::Num("completion_wakeups", wakeups),
        Field::Num("completions", completions),
        Field::Num("completions_per_wakeup_x100", (completions * 100).checked_div(wakeups).unwrap_or(0)),
        Field::Num("completion_budget_hits", get(&s.budget_hits) + now.polls.budget_hits),
        Field::Num("shared_completion_queues", now.shared_cqs),
        Field::Num("completion_vectors_used", now.vectors.0),
        Field::Num("completion_vectors_available", now.vectors.1),
        Field::Num("buffer_chunks", crate::verbs::buffer_chunks() as u64),
        Field::Dict(
            "protocol_violations",
            Violation::KINDS.iter().zip(&s.violations).map(|(k, c)| (*k, get(c))).collect(),
        ),
        Field::Dict(
            "errors",
            vec![
                ("work_request", get(&s.work_request_errors)),
                ("local_verbs", get(&s.local_errors)),
                ("peer_silent", get(&s.peers_silent)),
                ("handshake_timeout", get(&s.handshake_timeouts)),
            ],
        ),
        Field::Dict(
            "cm_disconnects",
            vec![
                ("disconnected", get(&s.cm_ends[CmEnd::Disconnected as usize])),
                ("other", get(&s.cm_ends[CmEnd::Other as usize])),
            ],
        ),
        Field::Num("tx_buffers_released", get(&s.tx_buffers_released)),
        Field::Num("pinned_bytes", now.pinned_bytes),
        Field::Num("pinned_registered_bytes", crate::verbs::pinned::pinned_now()),
        Field::Num("pinned_ceiling_bytes", crate::verbs::pinned::ceiling()),
    ]
}
