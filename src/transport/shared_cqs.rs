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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::knobs::{self, Knob};
use super::qp_table::QpTable;
use super::stats;
use super::MODULE;
use super::{log_limited, HostedConn, RdmaConnection};
use crate::server::api::FdWatch;
use crate::verbs::{
    CmId, CompletionChannel, DeviceKey, Endpoint, EndpointConfig, FirstPoll, FirstPolled, QueueDepths, SharedCq,
    VerbsError, WorkCompletion, FIRST_POLL, MAX_SHARED_CQES,
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
    channels: Vec<Option<Channel>>,
    /// `None` once its device was removed (the index is kept by its connections).
    cqs: Vec<Option<Arc<SharedCq>>>,
    /// Per CQ: the key of the live connection that owns each QP number (QP numbers are
    /// unique per device, and a CQ is on one device).
    owners: Vec<OwnerMap>,
    /// Per CQ: the last poll stopped at the budget with completions left.
    left: Vec<bool>,
    /// The number of the latest poll routed (never 0: an owner not yet routed has 0).
    routed: u32,
    /// The scratches of polls that ended, emptied, for the next (one per poll in
    /// progress: a handler may run a nested poll).
    #[allow(clippy::vec_box)]
    scratches: Vec<Box<Scratch>>,
    /// For INFO, counted under this lock.
    polls: stats::Polls,
}

/// A device's completion channel, and the CQs that signal it: known at the wake-up
/// without a search of the CQs.
struct Channel {
    ch: Arc<CompletionChannel>,
    watch: FdWatch,
    /// The first CQ made on it (the only one, until a device serves more than 63
    /// connections), and how many there are.
    first_cq: usize,
    cqs: usize,
}

impl Shared {
    pub(crate) const fn new() -> Shared {
        Shared {
            channels: Vec::new(),
            cqs: Vec::new(),
            owners: Vec::new(),
            left: Vec::new(),
            routed: 0,
            scratches: Vec::new(),
            polls: stats::Polls { wakeups: 0, completions: 0, budget_hits: 0 },
        }
    }
}

/// The channel (by index) whose fd would be watched with `key`, if `key` is in the
/// channels' range: no connection key is (asked at every wake-up, without the lock; a
/// channel that is not there is found so by [`on_fd`]).
pub(crate) fn channel_of_key(key: usize) -> Option<usize> {
    let i = key.checked_sub(FIRST_KEY)?;
    (i < MAX_CHANNELS).then_some(i)
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
    let channel = match s.channels.iter().position(|c| c.as_ref().is_some_and(|c| c.ch.is_for(id))) {
        Some(k) => k,
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
            s.channels.push(Some(Channel { ch, watch, first_cq: i, cqs: 0 }));
            n
        }
    };
    let on = s.channels[channel].as_mut()?;
    // With no vector configured, the CQs take the device's vectors in turn.
    let vector = cfg.comp_vector.unwrap_or(i as u32);
    let cq = match SharedCq::on_channel(id, MAX_SHARED_CQES, vector, &on.ch) {
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
    if on.cqs == 0 {
        on.first_cq = i;
    }
    on.cqs += 1;
    s.cqs.push(Some(cq));
    s.owners.push(OwnerMap::default());
    s.left.push(false);
    Some(i)
}

/// The connection `c` owns QP `qp_num` on CQ `cq`: its completions go to it.
pub(crate) fn register(cq: usize, qp_num: u32, c: &Arc<HostedConn>) {
    if let Some(o) = MODULE.shared_cqs.lock().owners.get_mut(cq) {
        o.insert(qp_num, Owner::new(Arc::clone(c)));
    }
}

/// The connection is closed: its completions are dropped from now on.
pub(crate) fn unregister(cq: usize, qp_num: u32) {
    if let Some(o) = MODULE.shared_cqs.lock().owners.get_mut(cq) {
        o.remove(qp_num);
    }
}

/// What a poll does with the connections that got completions: in the module,
/// `connection::ToConnections` (their cores, then their handlers); in the tests, a record.
pub(crate) trait Delivery {
    /// Consecutive completions of connection `c` in this poll, in arrival order (a
    /// connection whose completions came between others' gets more than one call).
    fn completions(&mut self, c: &Arc<HostedConn>, wcs: &[WorkCompletion]);
    /// Run its handlers now (the CQ's fd fired, or the pending turn came).
    fn run(&mut self, c: &Arc<HostedConn>);
    /// Queue it on the pending list (inside a CM event or an accept).
    fn queue(&mut self, c: &Arc<HostedConn>);
}

/// The fd of channel `channel` fired: each CQ its events name is polled once.
///
/// A channel that one CQ signals holds at most one event when it is read (a CQ signals
/// once per arming, and is armed again by the poll), so its wake-up takes that one and
/// makes no second `read` only to learn that none is left, as upstream reads its own
/// channel; an event that comes after keeps the level-triggered fd readable, and the
/// event loop calls again. A channel that several CQs signal is read until it is empty,
/// so that one wake-up serves every CQ with completions (docs/protocol.md §4.6).
///
/// One hold of the table per event: the channel, its event, the CQ it names, the poll,
/// and each completion routed to its connection's core ([`poll_routed`]).
pub(crate) fn on_fd(channel: usize, d: &mut impl Delivery) {
    let mut wakeup = 1;
    loop {
        let (routed, one_cq) = {
            let mut s = MODULE.shared_cqs.lock();
            s.polls.wakeups += std::mem::take(&mut wakeup);
            let Some(c) = s.channels.get(channel).and_then(Option::as_ref) else { return };
            let (one_cq, first) = (c.cqs == 1, c.first_cq);
            // (an event names a CQ of this channel: the one it has, or one to find)
            let mut named = None;
            let cqs = &s.cqs;
            let is = |i: usize, cq| cqs[i].as_ref().is_some_and(|q| q.is(cq));
            if !c.ch.take_event(|cq| {
                named = if one_cq && is(first, cq) { Some(first) } else { (0..cqs.len()).find(|&i| is(i, cq)) }
            }) {
                return;
            }
            (named.and_then(|i| poll_routed(&mut s, i, d)), one_cq)
        };
        if let Some((visited, _)) = routed {
            finish(visited, Then::RunHandlers, d);
        }
        if one_cq {
            return;
        }
    }
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

fn set_left(lefts: &mut [bool], cq: usize, left: bool) {
    let was = std::mem::replace(&mut lefts[cq], left);
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

/// The wake-ups and polls counted so far (INFO).
pub(crate) fn polls() -> stats::Polls {
    MODULE.shared_cqs.lock().polls
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
            set_left(&mut s.left, i, false);
            forgotten += 1;
        }
    }
    for slot in s.channels.iter_mut() {
        if slot.as_ref().is_some_and(|c| c.ch.device() == device) {
            if let Some(c) = slot.take() {
                crate::server::api::unwatch_fd(c.watch);
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

/// One budgeted poll of CQ `cq`: the completions go to their connections' cores in
/// arrival order, one lock per run of a connection's completions; then each of those
/// connections runs (or is queued). Returns whether completions were left.
fn poll(cq: usize, then: Then, d: &mut impl Delivery) -> bool {
    let Some((visited, left)) = poll_routed(&mut MODULE.shared_cqs.lock(), cq, d) else { return false };
    finish(visited, then, d);
    left
}

/// The connections a poll delivered completions to, whose handlers run once the
/// table's hold is released ([`finish`]).
enum Visited {
    /// None: the poll found nothing, or only completions of closed connections.
    Nobody,
    /// One, which every completion of the poll was for: the usual wake-up at one busy
    /// connection, routed without a scratch.
    One(Arc<HostedConn>),
    /// Several, in the order their handlers run ([`Routes::in_handler_order`]).
    Many(Box<Scratch>),
}

/// Under the table's hold: polls CQ `cq` (within the budget), and hands each run of
/// one QP's completions to its owner's core as it is routed
/// ([`Delivery::completions`]). `None`: no such CQ (its device was removed). Returns
/// the connections visited, whose handlers [`finish`] runs once the hold is released,
/// and whether completions were left.
///
/// The first completions are taken onto the stack ([`SharedCq::poll_first`]); when
/// that empties the CQ and they are all one QP's, they go to its owner without the
/// scratch, the poll's serial or the visits (docs/protocol.md §4.6).
///
/// Every completion reaches its core before any handler runs: a handler may process
/// events while it blocks (a long script), and a poll nested there must find nothing
/// of this one still undelivered, or a connection would see later bytes first. Runs go
/// in arrival order, so each connection's do too.
///
/// Locks: the table, then a connection's (its core takes the completions); nothing
/// holds a connection's lock while it takes the table's.
#[inline(always)]
fn poll_routed(s: &mut Shared, cq: usize, d: &mut impl Delivery) -> Option<(Visited, bool)> {
    let Shared { cqs, owners, left: lefts, routed, scratches, polls, .. } = s;
    let q = cqs.get(cq)?.as_ref()?;
    // (the test knob makes the budget small, so that the suite reaches this path)
    let budget = knobs::value(Knob::CompletionBudget).map_or(COMPLETIONS_PER_SHARED_POLL, |n| n as usize);
    let mut first = FirstPoll::new();
    // (a budget below the first poll's room is the test knob's: the poll is the budget's)
    let polled = (budget >= FIRST_POLL).then(|| q.poll_first(&mut first));
    if let Some(Ok(FirstPolled::All)) = polled {
        let wcs = first.as_slice();
        let qps = qps_of(wcs);
        if qps != Qps::Several {
            polls.completions += wcs.len() as u64;
            set_left(lefts, cq, false);
            // (no completion, or a QP without an owner: a closed connection's)
            let Some(o) = qps.one().and_then(|qp| owners[cq].get_mut(qp)) else {
                return Some((Visited::Nobody, false));
            };
            d.completions(&o.conn, wcs);
            return Some((Visited::One(Arc::clone(&o.conn)), false));
        }
    }
    // Several QPs' completions that the first poll took all of are routed from the stack;
    // the rest of a poll goes on into the scratch.
    let all_first = matches!(polled, Some(Ok(FirstPolled::All)));
    let mut scratch = Scratch::take(scratches);
    let Scratch { polled: list, routes } = &mut *scratch;
    let left = match polled {
        Some(Ok(FirstPolled::All)) => Ok(false),
        Some(first_polled) => first_polled.and_then(|_| q.poll_rest(&first, budget, list)),
        None => q.poll(budget, list),
    };
    let left = match left {
        Ok(left) => left,
        Err(e) => {
            // Not one connection's fault: the CQ is retried at the next event.
            log_limited(format_args!("RDMA: polling a shared completion queue failed: {e}"));
            false
        }
    };
    let wcs = if all_first { first.as_slice() } else { &list[..] };
    polls.completions += wcs.len() as u64;
    polls.budget_hits += u64::from(left);
    set_left(lefts, cq, left);
    *routed = routed.checked_add(1).unwrap_or(1);
    routes.route(&mut owners[cq], *routed, wcs, Arc::clone, |c, wcs| d.completions(c, wcs));
    Some((Visited::Many(scratch), left))
}

/// Whose completions a poll took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qps {
    None,
    One(u32),
    Several,
}

impl Qps {
    fn one(self) -> Option<u32> {
        match self {
            Qps::One(qp) => Some(qp),
            Qps::None | Qps::Several => None,
        }
    }
}

#[inline(always)]
fn qps_of(wcs: &[WorkCompletion]) -> Qps {
    let Some(first) = wcs.first() else { return Qps::None };
    let qp = first.qp_num();
    if wcs[1..].iter().all(|wc| wc.qp_num() == qp) {
        Qps::One(qp)
    } else {
        Qps::Several
    }
}

/// After the table's hold: the handlers of the connections that got completions (or
/// the pending list); a scratch is emptied (its connections let go here, outside the
/// hold: the last one may be freed) and kept for the next poll.
#[inline(always)]
fn finish(visited: Visited, then: Then, d: &mut impl Delivery) {
    let scratch = match visited {
        Visited::Nobody => return,
        Visited::One(c) => {
            return match then {
                Then::RunHandlers => d.run(&c),
                Then::Queue => d.queue(&c),
            };
        }
        Visited::Many(scratch) => scratch,
    };
    scratch.run_handlers(then, d);
    let scratch = scratch.emptied();
    MODULE.shared_cqs.lock().scratches.push(scratch);
}

/// What one poll works in. Kept between polls ([`Shared::scratches`], one for each
/// poll in progress: a handler may run a nested poll), so that once its vectors have
/// grown to the largest poll seen, a wake-up allocates nothing
/// (docs/measurements/poll-scratch-2026-12-02).
#[derive(Default)]
struct Scratch {
    /// The completions of the poll, in arrival order.
    polled: Vec<WorkCompletion>,
    /// Each visit holds its connection until the poll's handlers ran; emptied when the
    /// scratch is put back, so that a kept scratch holds no connection.
    routes: Routes<Arc<HostedConn>>,
}

impl Scratch {
    /// One of the `kept` scratches, or a new one. Boxed: taking one and putting it back
    /// moves a pointer, not the scratch (docs/measurements/instructions-2026-12-05).
    #[allow(clippy::vec_box)]
    fn take(kept: &mut Vec<Box<Scratch>>) -> Box<Scratch> {
        kept.pop().unwrap_or_default()
    }

    /// The handlers of the connections routed (or the pending list), in
    /// [`Routes::in_handler_order`].
    fn run_handlers(&self, then: Then, d: &mut impl Delivery) {
        self.routes.in_handler_order(|c| match then {
            Then::RunHandlers => d.run(c),
            Then::Queue => d.queue(c),
        });
    }

    /// Ready to be kept: `routes` is cleared where it is filled, and its visits here
    /// (they must not keep a connection alive); `polled` is pushed to.
    fn emptied(mut self: Box<Self>) -> Box<Self> {
        self.polled.clear();
        self.routes.visits.clear();
        self
    }
}

/// A completion whose QP has no owner (a closed connection) has no visit.
const NO_VISIT: u32 = u32::MAX;

/// One poll's completions by the connection that owns their QP, made in one pass and
/// with one look-up of the owner table per run of consecutive completions of one QP:
/// each run handed to its owner as it ends, the connections in the order each first
/// appears (`visits`), and which connections received something, in the order of
/// their first receive (`receivers`). `T` is the owner (the connection; a plain key in
/// the tests), resolved once per poll.
struct Routes<T> {
    visits: Vec<Visit<T>>,
    receivers: Vec<u32>,
}

impl<T> Default for Routes<T> {
    fn default() -> Self {
        Routes { visits: Vec::new(), receivers: Vec::new() }
    }
}

/// One connection's place in one poll.
struct Visit<T> {
    owner: T,
    received: bool,
}

impl<T> Routes<T> {
    fn clear(&mut self) {
        self.visits.clear();
        self.receivers.clear();
    }

    /// Routes `wcs`, the completions of poll number `serial` ([`Shared::routed`]):
    /// each run of consecutive completions of one QP goes to `deliver` with the
    /// connection that owns it, in arrival order, as the run ends (a run ends where
    /// another begins, so the completions inside one cost the routing nothing); those
    /// of QPs with no owner (a closed connection) are dropped. `resolve` turns an owner
    /// into the visit's hold on it. The owner table notes each owner's visit in this
    /// poll, so no search of the visits is made.
    #[inline(always)]
    fn route<O>(
        &mut self,
        owners: &mut OwnerMap<O>,
        serial: u32,
        wcs: &[WorkCompletion],
        resolve: impl Fn(&O) -> T,
        mut deliver: impl FnMut(&T, &[WorkCompletion]),
    ) {
        self.clear();
        let (mut last_qp, mut visit, mut start) = (None, NO_VISIT, 0);
        for (i, wc) in wcs.iter().enumerate() {
            let qp = wc.qp_num();
            if last_qp != Some(qp) {
                if visit != NO_VISIT {
                    deliver(&self.visits[visit as usize].owner, &wcs[start..i]);
                }
                last_qp = Some(qp);
                visit = self.visit_of(owners, serial, qp, &resolve);
                start = i;
            }
            if visit != NO_VISIT && wc.is_receive() {
                let v = &mut self.visits[visit as usize];
                if !v.received {
                    v.received = true;
                    self.receivers.push(visit);
                }
            }
        }
        if visit != NO_VISIT {
            deliver(&self.visits[visit as usize].owner, &wcs[start..]);
        }
    }

    /// The visit of QP `qp` in poll `serial`, made at its first completion of the poll;
    /// [`NO_VISIT`] when no live connection owns it.
    #[inline(always)]
    fn visit_of<O>(&mut self, owners: &mut OwnerMap<O>, serial: u32, qp: u32, resolve: impl Fn(&O) -> T) -> u32 {
        let Some(o) = owners.get_mut(qp) else { return NO_VISIT };
        if o.routed_in != serial {
            o.routed_in = serial;
            self.visits.push(Visit { owner: resolve(&o.conn), received: false });
            o.visit = self.visits.len() as u32 - 1;
        }
        o.visit
    }

    /// Hands each visit's owner to `f` once, in the order the handlers run: the
    /// connections that received something, latest first receive first, then the rest
    /// (send completions only: a reopened window) as they came.
    ///
    /// Why latest first: the server queues a client with a new reply at the head of its
    /// pending-write list and writes that list from the head before it sleeps
    /// (`putClientInPendingWriteQueue` and `handleClientsWithPendingWrites` in Valkey's
    /// networking.c). Handlers run in arrival order would have the request that arrived
    /// first answered last; one poll can hold a request from every busy client, and
    /// rxe's send doorbell is a system call, so that spread latencies from one write to
    /// the whole batch (docs/protocol.md §4.6). Run in reverse, the replies go out in the
    /// order the requests arrived, as they do when each connection has a wake-up of its
    /// own.
    fn in_handler_order(&self, mut f: impl FnMut(&T)) {
        for &v in self.receivers.iter().rev() {
            f(&self.visits[v as usize].owner);
        }
        for visit in self.visits.iter().filter(|v| !v.received) {
            f(&visit.owner);
        }
    }
}

/// Per CQ: QP number → the connection that owns it, with its visit in the latest poll.
/// Held as the live set holds it, from accept to `close` or teardown (or its device's
/// removal), which take it out: a poll then clones the hold (one increment), with no
/// weak reference to upgrade.
type OwnerMap<T = Arc<HostedConn>> = QpTable<Owner<T>>;

/// A QP's owner, and where the poll numbered `routed_in` put it.
struct Owner<T> {
    conn: T,
    routed_in: u32,
    visit: u32,
}

impl<T> Owner<T> {
    fn new(conn: T) -> Self {
        Owner { conn, routed_in: 0, visit: NO_VISIT }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_poll_is_one_qps_only_when_every_completion_is_that_qps() {
        let wc = |qp| WorkCompletion::received(qp, 0);
        assert_eq!(qps_of(&[]), Qps::None);
        assert_eq!(qps_of(&[wc(7)]), Qps::One(7));
        assert_eq!(qps_of(&[wc(7), wc(7), wc(7)]), Qps::One(7));
        // another QP's completion anywhere, first, between or last
        for at in 0..3 {
            let mut wcs = [wc(7), wc(7), wc(7)];
            wcs[at] = wc(8);
            assert_eq!(qps_of(&wcs), Qps::Several, "the other QP at {at}");
        }
        assert_eq!((Qps::One(7).one(), Qps::None.one(), Qps::Several.one()), (Some(7), None, None));
    }

    fn owners(pairs: &[(u32, usize)]) -> OwnerMap<usize> {
        pairs.iter().map(|&(qp, key)| (qp, Owner::new(key))).collect()
    }

    /// A routing of `wcs` (poll number `serial`): (owner, wr_ids) per run in delivery
    /// order, and the owners in the order their handlers run.
    fn routed(
        routes: &mut Routes<usize>,
        owners: &mut OwnerMap<usize>,
        serial: u32,
        wcs: &[WorkCompletion],
    ) -> (Vec<(usize, Vec<u64>)>, Vec<usize>) {
        let mut runs = Vec::new();
        routes.route(owners, serial, wcs, |k| *k, |k, run| runs.push((*k, run.iter().map(|wc| wc.wr_id()).collect())));
        let mut order = Vec::new();
        routes.in_handler_order(|k| order.push(*k));
        let (mut once, mut visited): (Vec<usize>, Vec<usize>) =
            (order.clone(), routes.visits.iter().map(|v| v.owner).collect());
        once.sort_unstable();
        visited.sort_unstable();
        assert_eq!(once, visited, "every owner's handlers once");
        (runs, order)
    }

    /// What a poll delivered: (connection key, wr_ids) per call, then the keys whose
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
        let mut owners: OwnerMap =
            [(1, &a), (2, &b), (3, &c), (4, &c)].iter().map(|(qp, c)| (*qp, Owner::new(Arc::clone(c)))).collect();
        // QP 4's connection closed (unregistered) after the poll took its completions:
        // they are dropped
        owners.remove(4);
        // b's request first, then a's; c only had a send complete (its window reopened)
        let wcs = vec![
            WorkCompletion::received(2, 1),
            WorkCompletion::sent(3, 2),
            WorkCompletion::received(4, 3),
            WorkCompletion::received(1, 4),
            WorkCompletion::received(2, 5),
            WorkCompletion::received(9, 6),
        ];
        let held = [&a, &b, &c].map(Arc::strong_count);
        for (serial, then) in [(1, Then::RunHandlers), (2, Then::Queue)] {
            let mut s = Scratch { polled: wcs.clone(), ..Default::default() };
            let mut d = Record::default();
            let Scratch { polled, routes } = &mut s;
            routes.route(&mut owners, serial, polled, Arc::clone, |c, wcs| d.completions(c, wcs));
            assert!(d.then.is_empty(), "every completion reaches its core before any handler runs");
            s.run_handlers(then, &mut d);
            assert_eq!(
                d.completions,
                vec![(b.key(), vec![1]), (c.key(), vec![2]), (a.key(), vec![4]), (b.key(), vec![5])],
                "in arrival order, each run to its connection, the dead and unknown QPs' dropped"
            );
            let how = if then == Then::RunHandlers { "run" } else { "queue" };
            assert_eq!(
                d.then,
                vec![(a.key(), how), (b.key(), how), (c.key(), how)],
                "latest first receive first, then the connections without a receive"
            );
            let kept = Box::new(s).emptied();
            assert_eq!([&a, &b, &c].map(Arc::strong_count), held, "the scratch kept holds no connection");
            drop(kept);
        }
        for x in [&a, &b, &c] {
            crate::transport::connection::close(x);
        }
    }

    #[test]
    fn completions_go_to_their_owners_in_order_and_those_of_closed_connections_are_dropped() {
        let mut owners = owners(&[(10, 0xa000), (11, 0xb000), (12, 0xa040)]);
        let wcs: Vec<WorkCompletion> = [(11, 1), (11, 4), (10, 2), (99, 3), (12, 5), (10, 6)]
            .into_iter()
            .map(|(qp, id)| WorkCompletion::received(qp, id))
            .collect();
        let mut routes = Routes::default();
        let (runs, _) = routed(&mut routes, &mut owners, 1, &wcs);
        assert_eq!(runs, vec![(0xb000, vec![1, 4]), (0xa000, vec![2]), (0xa040, vec![5]), (0xa000, vec![6])]);
        // A kept scratch routes the next poll afresh.
        let (runs, _) = routed(&mut routes, &mut owners, 2, &wcs[4..]);
        assert_eq!(runs, vec![(0xa040, vec![5]), (0xa000, vec![6])]);
        let gone = [WorkCompletion::received(99, 7)];
        let (runs, order) = routed(&mut routes, &mut owners, 3, &gone);
        assert_eq!((runs, order), (vec![], vec![]));
    }

    /// What routing must give for `wcs` (each (qp, is a receive)): the owned
    /// completions in arrival order, each with its owner; and the handler order: the
    /// receivers by their first receive, latest first, then the others as they first
    /// appeared.
    fn plain(owners: &OwnerMap<usize>, wcs: &[WorkCompletion]) -> (Vec<(usize, u64)>, Vec<usize>) {
        let mut delivered = Vec::new();
        let (mut receivers, mut others): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        for wc in wcs {
            let Some(o) = owners.get(wc.qp_num()) else { continue };
            delivered.push((o.conn, wc.wr_id()));
            if wc.is_receive() && !receivers.contains(&o.conn) {
                receivers.push(o.conn);
            }
            if !others.contains(&o.conn) {
                others.push(o.conn);
            }
        }
        let mut order: Vec<usize> = receivers.iter().rev().copied().collect();
        order.extend(others.into_iter().filter(|k| !receivers.contains(k)));
        (delivered, order)
    }

    /// Checks one routing against [`plain`]: every owned completion delivered once, in
    /// arrival order, to its owner, in runs of one owner that are as long as they can be;
    /// each owner's handlers run once, in the plain order.
    fn check(routes: &mut Routes<usize>, owners: &mut OwnerMap<usize>, serial: u32, wcs: &[WorkCompletion]) {
        let (want, want_order) = plain(owners, wcs);
        let (runs, order) = routed(routes, owners, serial, wcs);
        let got: Vec<(usize, u64)> = runs.iter().flat_map(|(k, ids)| ids.iter().map(|&id| (*k, id))).collect();
        let qps: Vec<(u32, bool)> = wcs.iter().map(|w| (w.qp_num(), w.is_receive())).collect();
        assert_eq!(got, want, "completions {qps:?}");
        assert!(runs.iter().all(|(_, ids)| !ids.is_empty()), "an empty run: {qps:?}");
        // a run ends where the next completion is of another QP
        let mut qp_of: HashMap<u64, u32> = HashMap::new();
        for wc in wcs {
            qp_of.insert(wc.wr_id(), wc.qp_num());
        }
        for (i, (_, ids)) in runs.iter().enumerate() {
            let last = *ids.last().unwrap();
            if let Some(next) = wcs.iter().skip_while(|w| w.wr_id() != last).nth(1) {
                if i + 1 < runs.len() && runs[i + 1].1[0] == next.wr_id() {
                    assert_ne!(qp_of[&last], next.qp_num(), "a run was cut short: {qps:?}");
                }
            }
        }
        assert_eq!(order, want_order, "completions {qps:?}");
    }

    #[test]
    fn routing_matches_a_plain_walk_for_any_arrival_order_of_sends_and_receives() {
        // Every sequence of up to 6 completions, each a send or a receive of one of 3
        // owned QPs or of a closed one (4); each its own poll, as a kept scratch and the
        // owner table see them.
        let mut owners = owners(&[(1, 0x1000), (2, 0x2000), (3, 0x3000)]);
        let mut routes = Routes::default();
        let mut serial = 0;
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
                serial += 1;
                check(&mut routes, &mut owners, serial, &wcs);
            }
        }
    }

    #[test]
    fn routing_many_connections_matches_a_plain_walk() {
        // 40 QPs (odd ones closed); sequences of up to 300 completions from a fixed
        // pseudo-random walk, a third of them sends.
        let mut owners: OwnerMap<usize> =
            (0..40u32).filter(|q| q % 2 == 0).map(|q| (q, Owner::new(0x1000 + q as usize))).collect();
        let mut routes = Routes::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut serial = 0;
        for len in [9usize, 17, 64, 300] {
            for _ in 0..20 {
                let wcs: Vec<WorkCompletion> = (0..len)
                    .map(|i| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let qp = (x % 40) as u32;
                        if x.is_multiple_of(3) {
                            WorkCompletion::sent(qp, i as u64)
                        } else {
                            WorkCompletion::received(qp, i as u64)
                        }
                    })
                    .collect();
                serial += 1;
                check(&mut routes, &mut owners, serial, &wcs);
            }
        }
    }

    #[test]
    fn handlers_run_latest_request_first_so_that_replies_leave_in_arrival_order() {
        // qp 10 sent a reply earlier and then a request; 11 and 12 sent requests; 13
        // only had a write complete (its handler may write more).
        let mut owners = owners(&[(10, 0xa000), (11, 0xb000), (12, 0xc000), (13, 0xd000)]);
        let wcs = [
            WorkCompletion::sent(10, 1),
            WorkCompletion::sent(13, 2),
            WorkCompletion::received(11, 3),
            WorkCompletion::received(10, 4),
            WorkCompletion::received(12, 5),
            WorkCompletion::received(11, 6),
        ];
        let mut routes = Routes::default();
        let (_, order) = routed(&mut routes, &mut owners, 1, &wcs);
        // requests arrived 11, 10, 12: handlers run 12, 10, 11, then 13
        assert_eq!(order, vec![0xc000, 0xa000, 0xb000, 0xd000]);
        let (runs, order) = routed(&mut routes, &mut owners, 2, &[]);
        assert_eq!((runs, order), (vec![], vec![]));
    }

    #[test]
    fn an_owner_routed_in_an_earlier_poll_gets_a_visit_of_this_one() {
        // The owner table remembers the visit of the poll that last routed to it: a
        // later poll (another number) must make a new visit, not reuse that index.
        let mut owners = owners(&[(1, 0x1000), (2, 0x2000)]);
        let mut routes = Routes::default();
        routed(&mut routes, &mut owners, 1, &[WorkCompletion::received(1, 1), WorkCompletion::received(2, 2)]);
        let (runs, order) = routed(&mut routes, &mut owners, 2, &[WorkCompletion::received(2, 3)]);
        assert_eq!((runs, order), (vec![(0x2000, vec![3])], vec![0x2000]));
    }

    #[test]
    fn a_nested_poll_takes_a_scratch_of_its_own_and_both_are_kept() {
        let mut kept = Vec::new();
        let mut outer = Scratch::take(&mut kept);
        outer.polled.push(WorkCompletion::received(1, 1));
        let inner = Scratch::take(&mut kept);
        assert!(inner.polled.is_empty(), "the nested poll must not see the outer one's completions");
        kept.push(inner.emptied());
        kept.push(outer.emptied());
        assert_eq!(kept.len(), 2);
        let again = Scratch::take(&mut kept);
        assert!(again.polled.is_empty() && again.polled.capacity() > 0, "kept, emptied, its room reused");
    }

    #[test]
    fn keys_of_channels_stay_below_every_connection_key() {
        assert_eq!(channel_of_key(0), None);
        assert_eq!(channel_of_key(FIRST_KEY), Some(0));
        assert_eq!(channel_of_key(FIRST_KEY + MAX_CHANNELS - 1), Some(MAX_CHANNELS - 1));
        // (the first page ends there: a connection's key, an address, is above it)
        assert_eq!(channel_of_key(FIRST_KEY + MAX_CHANNELS), None);
        assert_eq!(channel_of_key(4096), None);
        assert_eq!(channel_of_key(0x7f00_0000_1000), None);
    }
}
