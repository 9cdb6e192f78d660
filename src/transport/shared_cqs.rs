//! The completion queues the server's connections share (docs/protocol.md §4.6).
//!
//! With a CQ and a completion channel per connection, every connection that has a
//! completion costs the event loop its own fd event, its own `read` of the channel and
//! its own re-arm (`ioctl`): at 32 busy clients, 32 of each per turn of the loop. Here
//! the connections of the event loop share CQs: one fd per CQ is watched, and one read
//! and one re-arm serve every completion that arrived meanwhile, polled in batches and
//! handed to each connection's core by QP number ([`connection::on_shared_completions`]).
//!
//! A shared CQ reserves the entries of each QP's queues ([`SharedCq`]), so it never
//! overflows; when the CQs are full (or on another device) a new one is made. Where a
//! shared CQ cannot be made or watched, the connection gets a CQ of its own, as before.
//! The per-wake-up budget bounds the main thread's time in one CQ; what it leaves is
//! polled again from `process_pending_data`, after the other events had their turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::connection;
use super::knobs::{self, Knob};
use super::stats::{self, STATS};
use super::{live, lock, log_limited, RdmaConnection};
use crate::verbs::{
    CmId, Endpoint, EndpointConfig, QueueDepths, SharedCq, VerbsError, WorkCompletion, MAX_SHARED_CQES,
};

/// Completions taken from one CQ per wake-up.
pub(crate) const COMPLETIONS_PER_WAKEUP: usize = 1024;
/// The key the first CQ's fd is watched with; CQ `i` has `FIRST_KEY + i`. Connection
/// keys are addresses and the CM channel's is 0, so keys below a page never collide.
const FIRST_KEY: usize = 1;
/// CQs at most (at rxe's 32767 entries and the server's queue depths: 63 connections a
/// CQ, so about 250,000 connections; fewer on a device with a smaller `max_cqe`);
/// beyond, connections get their own CQ.
const MAX_CQS: usize = 4095;
// Above the CM channel's key, and within the first page, where no address points.
const _: () = assert!(FIRST_KEY > super::listener::CONN_EVENTS_KEY && FIRST_KEY + MAX_CQS <= 4096);

/// What to do with a connection that got completions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Run its handlers now (the CQ's fd fired, or the pending turn came).
    RunHandlers,
    /// Queue it on the pending list (we are inside a CM event or an accept).
    Queue,
}

struct Shared {
    cqs: Vec<Arc<SharedCq>>,
    /// Per CQ: the key of the live connection that owns each QP number (QP numbers are
    /// unique per device, and a CQ is on one device).
    owners: Vec<HashMap<u32, usize>>,
    /// Per CQ: the last poll stopped at the budget with completions left.
    left: Vec<bool>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared { cqs: Vec::new(), owners: Vec::new(), left: Vec::new() });

/// The CQ (by index) whose fd is watched with `key`, if `key` is one of ours.
pub(crate) fn cq_of_key(key: usize) -> Option<usize> {
    let i = key.checked_sub(FIRST_KEY)?;
    (i < lock(&SHARED).cqs.len()).then_some(i)
}

/// Builds the endpoint of a new connection on a shared CQ with room for it (made and
/// watched here when none has), or on a CQ of its own when that fails. Returns the
/// endpoint and the index of its shared CQ.
pub(crate) fn endpoint(id: CmId, cfg: &EndpointConfig) -> (Result<Endpoint, VerbsError>, Option<usize>) {
    let cqes = QueueDepths::DEFAULT.cqes();
    let found = lock(&SHARED).cqs.iter().position(|cq| cq.fits(&id, cqes));
    let index = match found {
        Some(i) => Some(i),
        None => add_cq(&id, cfg),
    };
    let Some(i) = index else { return (Endpoint::new(id, cfg), None) };
    let cq = lock(&SHARED).cqs[i].clone();
    if cq.has_retired() {
        // A closed connection's completions may still be queued: look once, so that its
        // QP number is free again (a new QP that drew it would be refused).
        poll(i, Then::Queue);
    }
    match Endpoint::with_shared_cq(id, cfg, QueueDepths::DEFAULT, &cq) {
        Ok(ep) => (Ok(ep), Some(i)),
        Err(e) => (Err(e), None),
    }
}

/// A new shared CQ on the device of `id`, watched by the event loop; `None` when it
/// cannot be made (the connection then gets a CQ of its own).
fn add_cq(id: &CmId, cfg: &EndpointConfig) -> Option<usize> {
    let mut s = lock(&SHARED);
    let i = s.cqs.len();
    if i >= MAX_CQS {
        return None;
    }
    // With no vector configured, the CQs take the device's vectors in turn.
    let vector = cfg.comp_vector.unwrap_or(i as u32);
    let cq = match SharedCq::new(id, MAX_SHARED_CQES, vector) {
        // A device whose CQs cannot hold one connection's queues: no sharing there.
        Ok(cq) if cq.budget_now().capacity() < QueueDepths::DEFAULT.cqes() => return None,
        Ok(cq) => cq,
        Err(e) => {
            log_limited(format_args!(
                "RDMA: a shared completion queue cannot be made ({e}); connections get their own"
            ));
            return None;
        }
    };
    if !crate::server::watch_fd::<RdmaConnection>(cq.fd(), FIRST_KEY + i) {
        log_limited(format_args!("RDMA: a shared completion queue cannot be watched; connections get their own"));
        return None;
    }
    s.cqs.push(cq);
    s.owners.push(HashMap::new());
    s.left.push(false);
    Some(i)
}

/// The connection `key` owns QP `qp_num` on CQ `cq`: its completions go to it.
pub(crate) fn register(cq: usize, qp_num: u32, key: usize) {
    if let Some(o) = lock(&SHARED).owners.get_mut(cq) {
        o.insert(qp_num, key);
    }
}

/// The connection is closed: its completions are dropped from now on.
pub(crate) fn unregister(cq: usize, qp_num: u32) {
    if let Some(o) = lock(&SHARED).owners.get_mut(cq) {
        o.remove(&qp_num);
    }
}

/// The fd of CQ `cq` fired.
pub(crate) fn on_fd(cq: usize) {
    stats::add(&STATS.wakeups, 1);
    poll(cq, Then::RunHandlers);
}

/// Polls CQ `cq` until it is empty, the connections that got completions queued: a
/// peer left, and what it wrote before is to be read before EOF (docs/server-abi.md
/// §4.2). Bounded: a CQ that never empties (other peers keep writing) is left after
/// as many rounds as it has entries' worth of budgets.
pub(crate) fn drain(cq: usize) {
    for _ in 0..(MAX_SHARED_CQES as usize).div_ceil(COMPLETIONS_PER_WAKEUP) + 1 {
        if !poll(cq, Then::Queue) {
            return;
        }
    }
}

/// Whether a CQ has completions the budget left.
pub(crate) fn any_left() -> bool {
    lock(&SHARED).left.iter().any(|&l| l)
}

/// Polls again each CQ whose last poll the budget stopped; returns how many.
pub(crate) fn poll_left() -> usize {
    let left: Vec<usize> = lock(&SHARED).left.iter().enumerate().filter(|(_, &l)| l).map(|(i, _)| i).collect();
    for &i in &left {
        poll(i, Then::RunHandlers);
    }
    left.len()
}

/// Shared CQs made so far (INFO).
pub(crate) fn count() -> usize {
    lock(&SHARED).cqs.len()
}

/// One budgeted poll of CQ `cq`: the completions go to their connections' cores, one
/// lock per connection, in arrival order within each; then each of those connections
/// runs (or is queued). Returns whether completions were left.
fn poll(cq: usize, then: Then) -> bool {
    let Some(q) = lock(&SHARED).cqs.get(cq).cloned() else { return false };
    // (the test knob makes the budget small, so that the suite reaches this path)
    let budget = knobs::value(Knob::CompletionBudget).map_or(COMPLETIONS_PER_WAKEUP, |n| n as usize);
    let mut wcs = Vec::new();
    let left = match q.poll(budget, |wc| wcs.push(wc)) {
        Ok(left) => left,
        Err(e) => {
            // Not one connection's fault: the CQ is retried at the next event.
            log_limited(format_args!("RDMA: polling a shared completion queue failed: {e}"));
            false
        }
    };
    stats::add(&STATS.completions, wcs.len() as u64);
    stats::add(&STATS.budget_hits, left.into());
    let groups = {
        let mut s = lock(&SHARED);
        s.left[cq] = left;
        group_by_owner(&s.owners[cq], &wcs)
    };
    // Every completion reaches its core before any handler runs: a handler may process
    // events while it blocks (a long script), and a poll nested there must find nothing
    // of this one still undelivered, or a connection would see later bytes first.
    let order = handler_order(&groups);
    let mut got = Vec::with_capacity(groups.len());
    for g in &groups {
        got.push(live::get(g.key).inspect(|c| connection::on_shared_completions(c, &g.wcs)));
    }
    for c in order.into_iter().filter_map(|i| got[i].take()) {
        match then {
            Then::RunHandlers => connection::run(&c),
            Then::Queue => connection::queue_if_due(&c),
        }
    }
    left
}

/// The order in which the connections of one poll run their handlers (indices into
/// `groups`, which are in order of each one's first completion): those that received
/// something in reverse order of their first receive, then the rest (send completions
/// only: a reopened window) as they came.
///
/// Why reverse: the server queues a client with a new reply at the head of its
/// pending-write list and writes that list from the head before it sleeps
/// (`putClientInPendingWriteQueue` and `handleClientsWithPendingWrites` in Valkey's
/// networking.c). Handlers run in arrival order would have the request that arrived
/// first answered last; one poll can hold a request from every busy client, and rxe's
/// send doorbell is a system call, so that spread latencies from one write to the whole
/// batch (docs/protocol.md §4.6). Run in reverse, the replies go out in the order the
/// requests arrived, as they do when each connection has a wake-up of its own.
fn handler_order(groups: &[Group]) -> Vec<usize> {
    let mut receivers: Vec<(usize, usize)> =
        groups.iter().enumerate().filter_map(|(g, group)| Some((group.first_receive?, g))).collect();
    receivers.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
    let others = groups.iter().enumerate().filter(|(_, group)| group.first_receive.is_none()).map(|(g, _)| g);
    receivers.into_iter().map(|(_, g)| g).chain(others).collect()
}

/// One connection's completions of one poll, in arrival order.
struct Group {
    key: usize,
    wcs: Vec<WorkCompletion>,
    /// Where its first receive came in the poll, if it had one.
    first_receive: Option<usize>,
}

/// The completions by the connection that owns their QP, in the order each connection
/// first appears and in arrival order within each; those of QPs with no owner (a closed
/// connection) are dropped.
fn group_by_owner(owners: &HashMap<u32, usize>, wcs: &[WorkCompletion]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut at: HashMap<usize, usize> = HashMap::new();
    for (i, wc) in wcs.iter().enumerate() {
        let Some(&key) = owners.get(&wc.qp_num()) else { continue };
        let g = *at.entry(key).or_insert_with(|| {
            groups.push(Group { key, wcs: Vec::new(), first_receive: None });
            groups.len() - 1
        });
        groups[g].wcs.push(*wc);
        if wc.is_receive() {
            groups[g].first_receive.get_or_insert(i);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_go_to_their_owners_in_order_and_those_of_closed_connections_are_dropped() {
        let owners: HashMap<u32, usize> = [(10, 0xa000), (11, 0xb000), (12, 0xa000 + 0x40)].into_iter().collect();
        let wcs: Vec<WorkCompletion> = [(11, 1), (10, 2), (99, 3), (11, 4), (12, 5), (10, 6)]
            .into_iter()
            .map(|(qp, id)| WorkCompletion::received(qp, id))
            .collect();
        let groups = group_by_owner(&owners, &wcs);
        let seen: Vec<(usize, Vec<u64>)> =
            groups.iter().map(|g| (g.key, g.wcs.iter().map(|wc| wc.wr_id()).collect())).collect();
        assert_eq!(seen, vec![(0xb000, vec![1, 4]), (0xa000, vec![2, 6]), (0xa040, vec![5])]);
    }

    #[test]
    fn handlers_run_latest_request_first_so_that_replies_leave_in_arrival_order() {
        // qp 10 sent a reply earlier and then a request; 11 and 12 sent requests; 13
        // only had a write complete (its handler may write more).
        let owners: HashMap<u32, usize> =
            [(10, 0xa000), (11, 0xb000), (12, 0xc000), (13, 0xd000)].into_iter().collect();
        let wcs = [
            WorkCompletion::sent(10, 1),
            WorkCompletion::sent(13, 2),
            WorkCompletion::received(11, 3),
            WorkCompletion::received(10, 4),
            WorkCompletion::received(12, 5),
            WorkCompletion::received(11, 6),
        ];
        let groups = group_by_owner(&owners, &wcs);
        let keys: Vec<usize> = handler_order(&groups).into_iter().map(|g| groups[g].key).collect();
        // requests arrived 11, 10, 12: handlers run 12, 10, 11, then 13
        assert_eq!(keys, vec![0xc000, 0xa000, 0xb000, 0xd000]);
        assert_eq!(handler_order(&[]), Vec::<usize>::new());
    }

    #[test]
    fn keys_of_cqs_stay_below_every_connection_key() {
        assert_eq!(cq_of_key(0), None);
        assert_eq!(cq_of_key(0x7f00_0000_1000), None);
    }
}
