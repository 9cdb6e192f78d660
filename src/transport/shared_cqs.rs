//! The completion queues the server's connections share (docs/protocol.md §4.6).
//!
//! With a CQ and a completion channel per connection, every connection that has a
//! completion costs the event loop its own fd event, its own `read` of the channel and
//! its own re-arm (`ioctl`): at 32 busy clients, 32 of each per turn of the loop. Here
//! the connections of the event loop share CQs, and the CQs of a device share one
//! completion channel: one fd per device is watched, its events name the CQs that have
//! completions, and one read and one re-arm per CQ serve every completion that arrived
//! meanwhile, polled in batches and handed to each connection's core by QP number (a
//! [`Delivery`]: the connections'). At 10,000 connections that is one fd, not 160.
//!
//! A shared CQ reserves the entries of each QP's queues ([`SharedCq`]), so it never
//! overflows; when the CQs are full (or on another device) a new one is made. Where a
//! shared CQ cannot be made or watched, the connection gets a CQ of its own, as before.
//! The per-wake-up budget bounds the main thread's time in one CQ; what it leaves is
//! polled again from `process_pending_data`, after the other events had their turn.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use super::knobs::{self, Knob};
use super::stats;
use super::MODULE;
use super::{log_limited, AddressHash, HostedConn, RdmaConnection};
use crate::server::api::FdWatch;
use crate::verbs::{
    CmId, CompletionChannel, DeviceKey, Endpoint, EndpointConfig, QueueDepths, SharedCq, VerbsError, WorkCompletion,
    MAX_SHARED_CQES,
};

/// Completions taken from one CQ per wake-up.
pub(crate) const COMPLETIONS_PER_SHARED_POLL: usize = 1024;
/// The key the first device's channel fd is watched with; channel `i` has
/// `FIRST_KEY + i`. Connection keys are addresses and the CM channel's is 0, so keys
/// below a page never collide.
const FIRST_KEY: usize = 1;
/// Devices with shared CQs at most (a channel each).
const MAX_CHANNELS: usize = 4095;
/// CQs at most (at rxe's 32767 entries and the server's queue depths: 63 connections a
/// CQ, so about 250,000 connections; fewer on a device with a smaller `max_cqe`);
/// beyond, connections get their own CQ.
const MAX_CQS: usize = 4095;
// Above the CM channel's key, and within the first page, where no address points.
const _: () = assert!(FIRST_KEY > super::CONN_EVENTS_KEY && FIRST_KEY + MAX_CHANNELS <= 4096);

/// What to do with a connection that got completions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Run its handlers now (the CQ's fd fired, or the pending turn came).
    RunHandlers,
    /// Queue it on the pending list (we are inside a CM event or an accept).
    Queue,
}

pub(crate) struct Shared {
    /// One completion channel per device, watched by the event loop; its CQs signal it.
    /// `None` once its device was removed (an index is a key: it is never reused).
    channels: Vec<Option<(Arc<CompletionChannel>, FdWatch)>>,
    /// `None` once its device was removed (the index is kept by its connections).
    cqs: Vec<Option<Arc<SharedCq>>>,
    /// Per CQ: the key of the live connection that owns each QP number (QP numbers are
    /// unique per device, and a CQ is on one device).
    owners: Vec<OwnerMap>,
    /// Per CQ: the last poll stopped at the budget with completions left.
    left: Vec<bool>,
}

impl Shared {
    pub(crate) const fn new() -> Shared {
        Shared { channels: Vec::new(), cqs: Vec::new(), owners: Vec::new(), left: Vec::new() }
    }
}

/// The channel (by index) whose fd is watched with `key`, if `key` is one of ours.
pub(crate) fn channel_of_key(key: usize) -> Option<usize> {
    let i = key.checked_sub(FIRST_KEY)?;
    (i < MODULE.shared_cqs.lock().channels.len()).then_some(i)
}

/// Builds the endpoint of a new connection on a shared CQ with room for it (made and
/// watched here when none has), or on a CQ of its own when that fails. Returns the
/// endpoint and the index of its shared CQ; `d` takes what a look at the CQ finds.
pub(crate) fn endpoint(
    id: CmId,
    cfg: &EndpointConfig,
    d: &mut impl Delivery,
) -> (Result<Endpoint, VerbsError>, Option<usize>) {
    let cqes = QueueDepths::DEFAULT.cqes();
    let found = MODULE.shared_cqs.lock().cqs.iter().position(|cq| cq.as_ref().is_some_and(|q| q.fits(&id, cqes)));
    let index = match found {
        Some(i) => Some(i),
        None => add_cq(&id, cfg),
    };
    let cq = index.and_then(|i| MODULE.shared_cqs.lock().cqs[i].clone());
    let (Some(i), Some(cq)) = (index, cq) else { return (Endpoint::new(id, cfg), None) };
    if cq.has_retired() {
        // A closed connection's completions may still be queued: look once, so that its
        // QP number is free again (a new QP that drew it would be refused).
        poll(i, Then::Queue, d);
    }
    match Endpoint::with_shared_cq(id, cfg, QueueDepths::DEFAULT, &cq) {
        Ok(ep) => (Ok(ep), Some(i)),
        Err(e) => (Err(e), None),
    }
}

/// A new shared CQ on the device of `id`, watched by the event loop; `None` when it
/// cannot be made (the connection then gets a CQ of its own).
fn add_cq(id: &CmId, cfg: &EndpointConfig) -> Option<usize> {
    let mut s = MODULE.shared_cqs.lock();
    let i = s.cqs.len();
    if i >= MAX_CQS {
        return None;
    }
    let channel = match s.channels.iter().flatten().find(|(ch, _)| ch.is_for(id)) {
        Some((ch, _)) => Arc::clone(ch),
        None => {
            let n = s.channels.len();
            let ch = match CompletionChannel::of_device(id) {
                Ok(ch) if n < MAX_CHANNELS => ch,
                Ok(_) => return None,
                Err(e) => {
                    log_limited(format_args!(
                        "RDMA: a completion channel for shared completion queues cannot be made ({e}); connections get their own"
                    ));
                    return None;
                }
            };
            let Some(watch) = crate::server::watch_fd::<RdmaConnection>(ch.fd(), FIRST_KEY + n) else {
                log_limited(format_args!(
                    "RDMA: a completion channel for shared completion queues cannot be watched; connections get their own"
                ));
                return None;
            };
            s.channels.push(Some((Arc::clone(&ch), watch)));
            ch
        }
    };
    // With no vector configured, the CQs take the device's vectors in turn.
    let vector = cfg.comp_vector.unwrap_or(i as u32);
    let cq = match SharedCq::on_channel(id, MAX_SHARED_CQES, vector, &channel) {
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
    s.cqs.push(Some(cq));
    s.owners.push(OwnerMap::default());
    s.left.push(false);
    Some(i)
}

/// The connection `c` owns QP `qp_num` on CQ `cq`: its completions go to it.
pub(crate) fn register(cq: usize, qp_num: u32, c: &Arc<HostedConn>) {
    if let Some(o) = MODULE.shared_cqs.lock().owners.get_mut(cq) {
        o.insert(qp_num, Arc::downgrade(c));
    }
}

/// The connection is closed: its completions are dropped from now on.
pub(crate) fn unregister(cq: usize, qp_num: u32) {
    if let Some(o) = MODULE.shared_cqs.lock().owners.get_mut(cq) {
        o.remove(&qp_num);
    }
}

/// What a poll does with the connections that got completions: in the module,
/// `connection::ToConnections` (their cores, then their handlers); in the tests, a record.
pub(crate) trait Delivery {
    /// Connection `c`'s completions of this poll, in arrival order.
    fn completions(&mut self, c: &Arc<HostedConn>, wcs: &[WorkCompletion]);
    /// Run its handlers now (the CQ's fd fired, or the pending turn came).
    fn run(&mut self, c: &Arc<HostedConn>);
    /// Queue it on the pending list (inside a CM event or an accept).
    fn queue(&mut self, c: &Arc<HostedConn>);
}

/// The fd of channel `channel` fired: each CQ it names is polled once.
pub(crate) fn on_fd(channel: usize, d: &mut impl Delivery) {
    stats::add(&MODULE.stats.wakeups, 1);
    let Some(ch) = MODULE.shared_cqs.lock().channels.get(channel).and_then(|c| c.as_ref().map(|(ch, _)| ch.clone()))
    else {
        return;
    };
    ch.take_events(|cq| {
        let i = MODULE.shared_cqs.lock().cqs.iter().position(|q| q.as_ref().is_some_and(|q| q.is(cq)));
        if let Some(i) = i {
            poll(i, Then::RunHandlers, d);
        }
    });
}

/// Polls CQ `cq` until it is empty, the connections that got completions queued: a
/// peer left, and what it wrote before is to be read before EOF (docs/server-abi.md
/// §4.2). Bounded: a CQ that never empties (other peers keep writing) is left after
/// as many rounds as it has entries' worth of budgets.
pub(crate) fn drain(cq: usize, d: &mut impl Delivery) {
    for _ in 0..(MAX_SHARED_CQES as usize).div_ceil(COMPLETIONS_PER_SHARED_POLL) + 1 {
        if !poll(cq, Then::Queue, d) {
            return;
        }
    }
}

/// CQs whose `left` is set: asked at every turn of the event loop, without the lock.
static LEFT: AtomicUsize = AtomicUsize::new(0);

fn set_left(s: &mut Shared, cq: usize, left: bool) {
    let was = std::mem::replace(&mut s.left[cq], left);
    if was != left {
        if left {
            LEFT.fetch_add(1, Ordering::Relaxed);
        } else {
            LEFT.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Whether a CQ has completions the budget left.
pub(crate) fn any_left() -> bool {
    LEFT.load(Ordering::Relaxed) > 0
}

/// Polls again each CQ whose last poll the budget stopped; returns how many.
pub(crate) fn poll_left(d: &mut impl Delivery) -> usize {
    // (called at every turn of the event loop that has pending work: no list is built)
    if !any_left() {
        return 0;
    }
    let cqs = MODULE.shared_cqs.lock().left.len();
    let mut polled = 0;
    for i in 0..cqs {
        if MODULE.shared_cqs.lock().left[i] {
            poll(i, Then::RunHandlers, d);
            polled += 1;
        }
    }
    polled
}

/// Shared CQs now (INFO).
pub(crate) fn count() -> usize {
    MODULE.shared_cqs.lock().cqs.iter().flatten().count()
}

/// Forgets the shared CQs and the completion channel of a removed device: the channel's
/// fd is no longer watched, and each is destroyed when the last connection on it is
/// released. Returns how many CQs were forgotten.
pub(crate) fn forget_device(device: DeviceKey) -> usize {
    let mut s = MODULE.shared_cqs.lock();
    let mut forgotten = 0;
    for i in 0..s.cqs.len() {
        if s.cqs[i].as_ref().is_some_and(|q| q.device() == device) {
            s.cqs[i] = None;
            s.owners[i].clear();
            set_left(&mut s, i, false);
            forgotten += 1;
        }
    }
    for slot in s.channels.iter_mut() {
        if slot.as_ref().is_some_and(|(ch, _)| ch.device() == device) {
            if let Some((_, watch)) = slot.take() {
                crate::server::api::unwatch_fd(watch);
            }
        }
    }
    forgotten
}

/// (distinct completion vectors the shared CQs use, the most a device of theirs offers)
/// (INFO): with `rdma-completion-vector -1` the CQs take the vectors in turn, so that a
/// NIC's interrupts land on more than one core.
pub(crate) fn vectors() -> (u64, u64) {
    let s = MODULE.shared_cqs.lock();
    let mut used: Vec<i32> = s.cqs.iter().flatten().map(|q| q.vectors().0).collect();
    used.sort_unstable();
    used.dedup();
    let available = s.cqs.iter().flatten().map(|q| q.vectors().1).max().unwrap_or(0);
    (used.len() as u64, available.max(0) as u64)
}

/// One budgeted poll of CQ `cq`: the completions go to their connections' cores, one
/// lock per connection, in arrival order within each; then each of those connections
/// runs (or is queued). Returns whether completions were left.
fn poll(cq: usize, then: Then, d: &mut impl Delivery) -> bool {
    let Some(q) = MODULE.shared_cqs.lock().cqs.get(cq).cloned().flatten() else { return false };
    // (the test knob makes the budget small, so that the suite reaches this path)
    let budget = knobs::value(Knob::CompletionBudget).map_or(COMPLETIONS_PER_SHARED_POLL, |n| n as usize);
    let mut s = Scratch::take();
    let left = match q.poll(budget, &mut s.polled) {
        Ok(left) => left,
        Err(e) => {
            // Not one connection's fault: the CQ is retried at the next event.
            log_limited(format_args!("RDMA: polling a shared completion queue failed: {e}"));
            false
        }
    };
    stats::add(&MODULE.stats.completions, s.polled.len() as u64);
    stats::add(&MODULE.stats.budget_hits, left.into());
    {
        let mut shared = MODULE.shared_cqs.lock();
        set_left(&mut shared, cq, left);
        s.routes.route(&shared.owners[cq], &s.polled, Weak::upgrade);
    }
    s.deliver(then, d);
    s.put_back();
    left
}

/// What one poll works in. Kept between polls (per thread, one for each poll in
/// progress: a handler may run a nested poll), so that once its vectors have grown to
/// the largest poll seen, a wake-up allocates nothing (docs/measurements/poll-scratch-2026-12-02).
#[derive(Default)]
struct Scratch {
    /// The completions of the poll, in arrival order.
    polled: Vec<WorkCompletion>,
    /// Each group holds its connection until its handlers ran; emptied before the
    /// scratch is put back, so that a kept scratch holds no connection.
    routes: Routes<Arc<HostedConn>>,
    /// Indices into `routes.groups`, in the order the handlers run.
    order: Vec<usize>,
}

thread_local! {
    // Boxed: taking one and putting it back moves a pointer, not the scratch
    // (docs/measurements/instructions-2026-12-05).
    #[allow(clippy::vec_box)]
    static SCRATCHES: RefCell<Vec<Box<Scratch>>> = const { RefCell::new(Vec::new()) };
}

impl Scratch {
    fn take() -> Box<Scratch> {
        SCRATCHES.with_borrow_mut(Vec::pop).unwrap_or_default()
    }

    /// The routed completions to their connections, then their handlers (or the
    /// pending list), in [`Routes::handler_order`].
    fn deliver(&mut self, then: Then, d: &mut impl Delivery) {
        // Every completion reaches its core before any handler runs: a handler may
        // process events while it blocks (a long script), and a poll nested there must
        // find nothing of this one still undelivered, or a connection would see later
        // bytes first.
        for (g, group) in self.routes.groups.iter().enumerate() {
            if let Some(c) = &group.owner {
                d.completions(c, self.routes.completions_of(g, &self.polled));
            }
        }
        self.routes.take_in_handler_order(&mut self.order, |c| match then {
            Then::RunHandlers => d.run(&c),
            Then::Queue => d.queue(&c),
        });
    }

    /// `routes` and `order` are cleared where they are filled (and the routes' groups
    /// here: they must not keep a connection alive); `polled` is pushed to.
    fn put_back(mut self: Box<Self>) {
        self.polled.clear();
        self.routes.groups.clear();
        SCRATCHES.with_borrow_mut(|kept| kept.push(self));
    }
}

/// Groups up to this many are found by a scan of the groups; beyond, by a table.
const SCANNED_GROUPS: usize = 8;
/// The group of a completion whose QP has no owner.
const NO_GROUP: u32 = u32::MAX;

/// One poll's completions by the connection that owns their QP: `groups` in the order
/// each connection first appears, and each group's completions in arrival order.
/// `T` is the owner (the connection; a plain key in the tests), resolved once per group.
struct Routes<T> {
    groups: Vec<Group<T>>,
    /// Whether the poll's completions came group after group, none dropped (the usual
    /// case): each group's are then a slice of the poll's, and `by_group` is not filled.
    in_order: bool,
    /// Whether the groups that received got their first receive in group order (the
    /// usual case): [`Routes::handler_order`] is then the receivers backwards, then the
    /// rest.
    receivers_in_group_order: bool,
    /// Unless `in_order`: the completions, group after group (group `g`'s end where
    /// group `g + 1`'s begin).
    by_group: Vec<WorkCompletion>,
    /// QP number → its group, once there are more than [`SCANNED_GROUPS`].
    group_of_qp: HashMap<u32, usize, AddressHash>,
    /// For `handler_order`: (first receive, group) of the groups that received.
    receivers: Vec<(u32, usize)>,
}

impl<T> Default for Routes<T> {
    fn default() -> Self {
        Routes {
            groups: Vec::new(),
            in_order: true,
            receivers_in_group_order: true,
            by_group: Vec::new(),
            group_of_qp: HashMap::default(),
            receivers: Vec::new(),
        }
    }
}

/// One connection's place in one poll.
struct Group<T> {
    /// `None` once its handlers ran.
    owner: Option<T>,
    qp: u32,
    /// Where its first receive came in the poll, if it had one.
    first_receive: Option<u32>,
    /// How many completions it has, then where they end (in the poll's completions when
    /// [`Routes::in_order`], else in `Routes::by_group`).
    end: u32,
}

impl<T> Routes<T> {
    fn clear(&mut self) {
        self.groups.clear();
        self.by_group.clear();
        if !self.group_of_qp.is_empty() {
            self.group_of_qp.clear();
        }
        self.receivers.clear();
    }

    /// Sorts `wcs` by the connection that owns their QP, in the order each connection
    /// first appears and in arrival order within each; those of QPs with no owner (a
    /// closed connection) are dropped. No sorting and, for a few connections, no
    /// hashing: each completion's group is found (the last one's, a scan of a few, or
    /// the table), the groups are counted, and the completions placed by the counts
    /// (left as they are when they came group after group already).
    /// `resolve` turns an owner into a connection (`None`: gone).
    fn route<O>(&mut self, owners: &OwnerMap<O>, wcs: &[WorkCompletion], resolve: impl Fn(&O) -> Option<T>) {
        self.clear();
        // (qp, its group) of the completion before
        let mut last = (NO_GROUP, NO_GROUP);
        // Whether the completions already come group after group (each connection's in
        // one run, none dropped): the usual case, one completion per connection.
        let mut in_order = true;
        // The group that got the latest first receive, and whether each such group came
        // after the one before.
        let (mut last_receiver, mut receivers_in_group_order) = (None, true);
        for (i, wc) in wcs.iter().enumerate() {
            let qp = wc.qp_num();
            let g = if qp == last.0 {
                last.1
            } else {
                let g = self.group_of(owners, qp, &resolve);
                // a new run must be a new group, the one made last
                in_order &= g != NO_GROUP && g as usize + 1 == self.groups.len();
                last = (qp, g);
                g
            };
            let Some(group) = self.groups.get_mut(g as usize) else { continue };
            group.end += 1;
            if wc.is_receive() && group.first_receive.is_none() {
                group.first_receive = Some(i as u32);
                receivers_in_group_order &= last_receiver.is_none_or(|r| g > r);
                last_receiver = Some(g);
            }
        }
        (self.in_order, self.receivers_in_group_order) = (in_order, receivers_in_group_order);
        if in_order {
            // counts → where each group ends; the completions stay as they came
            let mut at = 0;
            for group in &mut self.groups {
                at += group.end;
                group.end = at;
            }
            return;
        }
        // counts → where each group starts, then each completion to its place (each
        // group's `end` moves from its start to its end as they are placed)
        let mut at = 0;
        for group in &mut self.groups {
            (group.end, at) = (at, at + group.end);
        }
        let Some(filler) = wcs.first() else { return };
        self.by_group.resize(at as usize, filler.clone());
        let mut last = (NO_GROUP, None);
        for wc in wcs {
            let qp = wc.qp_num();
            let g = if qp == last.0 { last.1 } else { self.find_group(qp) };
            last = (qp, g);
            if let Some(group) = g.and_then(|g| self.groups.get_mut(g)) {
                self.by_group[group.end as usize] = wc.clone();
                group.end += 1;
            }
        }
    }

    /// The group this poll made for QP `qp`, if any: a scan of a few, or the table.
    #[inline(always)]
    fn find_group(&mut self, qp: u32) -> Option<usize> {
        if self.groups.len() <= SCANNED_GROUPS {
            return self.groups.iter().position(|g| g.qp == qp);
        }
        if self.group_of_qp.is_empty() {
            self.group_of_qp.extend(self.groups.iter().enumerate().map(|(g, group)| (group.qp, g)));
        }
        self.group_of_qp.get(&qp).copied()
    }

    /// The group of QP `qp` in this poll, made when it is the first completion of its
    /// QP; [`NO_GROUP`] when no connection owns it.
    fn group_of<O>(&mut self, owners: &OwnerMap<O>, qp: u32, resolve: impl Fn(&O) -> Option<T>) -> u32 {
        if let Some(g) = self.find_group(qp) {
            return g as u32;
        }
        let Some(owner) = owners.get(&qp).and_then(resolve) else { return NO_GROUP };
        let g = self.groups.len();
        self.groups.push(Group { owner: Some(owner), qp, first_receive: None, end: 0 });
        if !self.group_of_qp.is_empty() {
            self.group_of_qp.insert(qp, g);
        }
        g as u32
    }

    /// Group `g`'s completions; `wcs` are the poll's, as routed.
    fn completions_of<'a>(&'a self, g: usize, wcs: &'a [WorkCompletion]) -> &'a [WorkCompletion] {
        let start = if g == 0 { 0 } else { self.groups[g - 1].end as usize };
        let all = if self.in_order { wcs } else { &self.by_group };
        &all[start..self.groups[g].end as usize]
    }

    /// Takes each group's owner out, in [`handler_order`](Self::handler_order), and
    /// hands it to `f`. In the usual poll (the receivers got their first receive in
    /// group order) that order is the receivers backwards, then the rest as they came:
    /// walked without building it.
    fn take_in_handler_order(&mut self, order: &mut Vec<usize>, mut f: impl FnMut(T)) {
        if self.receivers_in_group_order {
            let groups = &mut self.groups;
            for g in (0..groups.len()).rev() {
                if groups[g].first_receive.is_some() {
                    groups[g].owner.take().map(&mut f);
                }
            }
            for group in groups.iter_mut() {
                group.owner.take().map(&mut f);
            }
            return;
        }
        self.handler_order(order);
        for &g in order.iter() {
            self.groups[g].owner.take().map(&mut f);
        }
    }

    /// The order in which the connections of one poll run their handlers (indices into
    /// `groups`): those that received something in reverse order of their first
    /// receive, then the rest (send completions only: a reopened window) as they came.
    ///
    /// Why reverse: the server queues a client with a new reply at the head of its
    /// pending-write list and writes that list from the head before it sleeps
    /// (`putClientInPendingWriteQueue` and `handleClientsWithPendingWrites` in Valkey's
    /// networking.c). Handlers run in arrival order would have the request that arrived
    /// first answered last; one poll can hold a request from every busy client, and
    /// rxe's send doorbell is a system call, so that spread latencies from one write to
    /// the whole batch (docs/protocol.md §4.6). Run in reverse, the replies go out in the
    /// order the requests arrived, as they do when each connection has a wake-up of its
    /// own.
    fn handler_order(&mut self, order: &mut Vec<usize>) {
        let groups = &self.groups;
        order.clear();
        if self.receivers_in_group_order {
            // Groups are made in the order their connections first appear, so their first
            // receives usually come in group order too (`route` noted whether they did):
            // then the receivers are the groups backwards, with no sort.
            order.extend((0..groups.len()).rev().filter(|&g| groups[g].first_receive.is_some()));
        } else {
            self.receivers.clear();
            self.receivers.extend(groups.iter().enumerate().filter_map(|(g, group)| Some((group.first_receive?, g))));
            self.receivers.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
            order.extend(self.receivers.iter().map(|&(_, g)| g));
        }
        order.extend(groups.iter().enumerate().filter(|(_, group)| group.first_receive.is_none()).map(|(g, _)| g));
    }
}

/// Per CQ: QP number → the connection that owns it (weakly: a connection is taken out
/// when it closes, and never kept alive by its CQ).
type OwnerMap<T = Weak<HostedConn>> = HashMap<u32, T, AddressHash>;

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(pairs: &[(u32, usize)]) -> OwnerMap<usize> {
        pairs.iter().copied().collect()
    }

    fn routed(routes: &Routes<usize>, wcs: &[WorkCompletion]) -> Vec<(usize, Vec<u64>)> {
        (0..routes.groups.len())
            .map(|g| {
                (routes.groups[g].owner.unwrap(), routes.completions_of(g, wcs).iter().map(|wc| wc.wr_id()).collect())
            })
            .collect()
    }

    /// What a poll delivered: (connection key, wr_ids) per connection, then the keys whose
    /// handlers ran or were queued, in order.
    #[derive(Default)]
    struct Record {
        completions: Vec<(usize, Vec<u64>)>,
        then: Vec<(usize, &'static str)>,
    }

    impl Delivery for Record {
        fn completions(&mut self, c: &Arc<HostedConn>, wcs: &[WorkCompletion]) {
            self.completions.push((c.key(), wcs.iter().map(|wc| wc.wr_id()).collect()));
        }
        fn run(&mut self, c: &Arc<HostedConn>) {
            self.then.push((c.key(), "run"));
        }
        fn queue(&mut self, c: &Arc<HostedConn>) {
            self.then.push((c.key(), "queue"));
        }
    }

    #[test]
    fn a_poll_delivers_to_several_live_connections_then_runs_them_latest_request_first() {
        use crate::transport::connection::tests::{connection, serial};
        let _s = serial();
        let (a, b, c) = (connection(0, true), connection(0, true), connection(0, true));
        let mut owners: OwnerMap = [(1, &a), (2, &b), (3, &c)].iter().map(|(qp, c)| (*qp, Arc::downgrade(c))).collect();
        // QP 4's connection is gone (freed) before the poll's completions are delivered:
        // they are dropped
        owners.insert(4, Weak::new());
        // b's request first, then a's; c only had a send complete (its window reopened)
        let wcs = vec![
            WorkCompletion::received(2, 1),
            WorkCompletion::sent(3, 2),
            WorkCompletion::received(4, 3),
            WorkCompletion::received(1, 4),
            WorkCompletion::received(2, 5),
            WorkCompletion::received(9, 6),
        ];
        for then in [Then::RunHandlers, Then::Queue] {
            let mut s = Scratch::default();
            s.routes.route(&owners, &wcs, Weak::upgrade);
            let mut d = Record::default();
            s.deliver(then, &mut d);
            assert_eq!(d.completions, vec![(b.key(), vec![1, 5]), (c.key(), vec![2]), (a.key(), vec![4])]);
            let how = if then == Then::RunHandlers { "run" } else { "queue" };
            assert_eq!(
                d.then,
                vec![(a.key(), how), (b.key(), how), (c.key(), how)],
                "latest first receive first, then the connections without a receive"
            );
            assert!(s.routes.groups.iter().all(|g| g.owner.is_none()), "the scratch keeps no connection alive");
        }
        for x in [&a, &b, &c] {
            crate::transport::connection::close(x);
        }
    }

    #[test]
    fn completions_go_to_their_owners_in_order_and_those_of_closed_connections_are_dropped() {
        let owners = owners(&[(10, 0xa000), (11, 0xb000), (12, 0xa000 + 0x40)]);
        let wcs: Vec<WorkCompletion> = [(11, 1), (10, 2), (99, 3), (11, 4), (12, 5), (10, 6)]
            .into_iter()
            .map(|(qp, id)| WorkCompletion::received(qp, id))
            .collect();
        let mut routes = Routes::default();
        routes.route(&owners, &wcs, |k| Some(*k));
        assert_eq!(routed(&routes, &wcs), vec![(0xb000, vec![1, 4]), (0xa000, vec![2, 6]), (0xa040, vec![5])]);
        // A kept scratch routes the next poll afresh.
        routes.route(&owners, &wcs[4..], |k| Some(*k));
        assert_eq!(routed(&routes, &wcs[4..]), vec![(0xa040, vec![5]), (0xa000, vec![6])]);
        let gone = [WorkCompletion::received(99, 7)];
        routes.route(&owners, &gone, |k| Some(*k));
        assert_eq!(routed(&routes, &gone), vec![]);
    }

    /// What routing must give: (owner, wr_ids) in the order each owner first appears.
    fn plain_grouping(owners: &OwnerMap<usize>, wcs: &[WorkCompletion]) -> Vec<(usize, Vec<u64>)> {
        let mut want: Vec<(usize, Vec<u64>)> = Vec::new();
        for wc in wcs {
            let Some(&key) = owners.get(&wc.qp_num()) else { continue };
            match want.iter_mut().find(|(k, _)| *k == key) {
                Some((_, ids)) => ids.push(wc.wr_id()),
                None => want.push((key, vec![wc.wr_id()])),
            }
        }
        want
    }

    #[test]
    fn routing_matches_a_plain_grouping_for_any_arrival_order() {
        // Every sequence of up to 7 completions over 3 owned QPs and one closed one.
        let owners = owners(&[(1, 0x1000), (2, 0x2000), (3, 0x3000)]);
        let mut routes = Routes::default();
        for len in 0..=7u32 {
            for code in 0..4u32.pow(len) {
                let qps: Vec<u32> = (0..len).map(|i| code / 4u32.pow(i) % 4 + 1).collect();
                let wcs: Vec<WorkCompletion> =
                    qps.iter().enumerate().map(|(i, &qp)| WorkCompletion::received(qp, i as u64)).collect();
                let want = plain_grouping(&owners, &wcs);
                routes.route(&owners, &wcs, |k| Some(*k));
                assert_eq!(routed(&routes, &wcs), want, "qps {qps:?}");
            }
        }
    }

    #[test]
    fn routing_past_the_scanned_groups_matches_a_plain_grouping() {
        // 40 QPs (odd ones closed), so that polls pass SCANNED_GROUPS and use the table;
        // sequences of up to 300 completions from a fixed pseudo-random walk.
        let owners: OwnerMap<usize> = (0..40u32).filter(|q| q % 2 == 0).map(|q| (q, 0x1000 + q as usize)).collect();
        let mut routes = Routes::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in [9usize, 17, 64, 300] {
            for _ in 0..20 {
                let wcs: Vec<WorkCompletion> = (0..len)
                    .map(|i| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        WorkCompletion::received((x % 40) as u32, i as u64)
                    })
                    .collect();
                let want = plain_grouping(&owners, &wcs);
                routes.route(&owners, &wcs, |k| Some(*k));
                assert_eq!(routed(&routes, &wcs), want, "{len} completions");
                if len >= 64 {
                    assert!(routes.groups.len() > SCANNED_GROUPS, "the table was not reached");
                }
            }
        }
    }

    #[test]
    fn handlers_run_latest_request_first_so_that_replies_leave_in_arrival_order() {
        // qp 10 sent a reply earlier and then a request; 11 and 12 sent requests; 13
        // only had a write complete (its handler may write more).
        let owners = owners(&[(10, 0xa000), (11, 0xb000), (12, 0xc000), (13, 0xd000)]);
        let wcs = [
            WorkCompletion::sent(10, 1),
            WorkCompletion::sent(13, 2),
            WorkCompletion::received(11, 3),
            WorkCompletion::received(10, 4),
            WorkCompletion::received(12, 5),
            WorkCompletion::received(11, 6),
        ];
        let mut routes = Routes::default();
        routes.route(&owners, &wcs, |k| Some(*k));
        let mut order = vec![7];
        routes.handler_order(&mut order);
        let keys: Vec<usize> = order.iter().map(|&g| routes.groups[g].owner.unwrap()).collect();
        // requests arrived 11, 10, 12: handlers run 12, 10, 11, then 13
        assert_eq!(keys, vec![0xc000, 0xa000, 0xb000, 0xd000]);
        routes.route(&owners, &[], |k| Some(*k));
        routes.handler_order(&mut order);
        assert_eq!(order, Vec::<usize>::new());
    }

    #[test]
    fn handler_order_matches_a_plain_sort_for_any_mix_of_sends_and_receives() {
        // Every sequence of up to 6 completions, each a send or a receive of one of 3
        // owned QPs or a closed one: the receivers by their first receive, latest first,
        // then the others in the order they first appeared.
        let owners = owners(&[(1, 0x1000), (2, 0x2000), (3, 0x3000)]);
        let mut routes = Routes::default();
        let mut order = Vec::new();
        for len in 0..=6u32 {
            for code in 0..8u32.pow(len) {
                let wcs: Vec<WorkCompletion> = (0..len)
                    .map(|i| {
                        let x = code / 8u32.pow(i) % 8;
                        let qp = x / 2 + 1;
                        if x % 2 == 0 {
                            WorkCompletion::received(qp, i.into())
                        } else {
                            WorkCompletion::sent(qp, i.into())
                        }
                    })
                    .collect();
                routes.route(&owners, &wcs, |k| Some(*k));
                routes.handler_order(&mut order);
                let got: Vec<usize> = order.iter().map(|&g| routes.groups[g].owner.unwrap()).collect();
                // what the poll walks: the same order, each owner once, none left
                let mut taken = Vec::new();
                routes.take_in_handler_order(&mut order, |k| taken.push(k));
                assert_eq!(taken, got, "the walk and the order differ");
                assert!(routes.groups.iter().all(|g| g.owner.is_none()));
                let mut firsts: Vec<(usize, usize)> = Vec::new(); // (owner, first receive)
                let mut others: Vec<usize> = Vec::new();
                for (i, wc) in wcs.iter().enumerate() {
                    let Some(&key) = owners.get(&wc.qp_num()) else { continue };
                    if wc.is_receive() && !firsts.iter().any(|&(k, _)| k == key) {
                        firsts.push((key, i));
                    }
                    if !others.contains(&key) {
                        others.push(key);
                    }
                }
                firsts.sort_by_key(|&(_, i)| std::cmp::Reverse(i));
                let mut want: Vec<usize> = firsts.iter().map(|&(k, _)| k).collect();
                want.extend(others.into_iter().filter(|k| !firsts.iter().any(|&(f, _)| f == *k)));
                assert_eq!(
                    got,
                    want,
                    "completions {:?}",
                    wcs.iter().map(|w| (w.qp_num(), w.is_receive())).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn a_nested_poll_takes_a_scratch_of_its_own_and_both_are_kept() {
        SCRATCHES.with_borrow_mut(Vec::clear);
        let mut outer = Scratch::take();
        outer.polled.push(WorkCompletion::received(1, 1));
        let inner = Scratch::take();
        assert!(inner.polled.is_empty(), "the nested poll must not see the outer one's completions");
        inner.put_back();
        outer.put_back();
        assert_eq!(SCRATCHES.with_borrow(Vec::len), 2);
        let again = Scratch::take();
        assert!(again.polled.is_empty() && again.polled.capacity() > 0, "kept, emptied, its room reused");
    }

    #[test]
    fn keys_of_channels_stay_below_every_connection_key() {
        assert_eq!(channel_of_key(0), None);
        assert_eq!(channel_of_key(0x7f00_0000_1000), None);
    }
}
