//! Valkey Cluster over RDMA: which node serves a key, and a client that follows the
//! cluster as it changes.
//!
//! The logic (hash slots, the `CLUSTER SLOTS` map, `MOVED`/`ASK` parsing, which
//! argument is the key) is pure and tested here without RDMA; [`ClusterClient`] is a
//! thin driver over any [`NodeConn`], the RDMA [`Client`] by default and an in-memory
//! three-node cluster in the tests.
//!
//! ```no_run
//! use rdma::client::cluster::ClusterClient;
//! let mut c: ClusterClient = ClusterClient::connect(&["10.0.0.1:6379".into()], Default::default())?;
//! c.command(&[b"SET", b"{user1000}.following", b"42"])?;
//! # Ok::<(), rdma::client::cluster::ClusterError>(())
//! ```
//!
//! Ports: `CLUSTER SLOTS` and `MOVED` name each node's TCP (or TLS) port; Valkey does not
//! tell clients a node's `rdma-port`. We connect over RDMA to the port number the
//! cluster names, so every node must listen for RDMA on its TCP port number
//! (`rdma-port` = `port`; RDMA CM and TCP ports do not collide).

// Also inherited from `client/mod.rs`; repeated so that this file says it on its own.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::{Client, ClientError, Options, Reply};

mod keys;
mod redirect;
mod slots;

use keys::command_slot;
use redirect::redirect_of;
pub use redirect::Redirect;
pub(crate) use slots::SlotMap;
pub use slots::{key_slot, NodeAddr, RangeProblem, SlotsError, SLOTS};

/// How many redirections one command may follow before we give up: enough for a MOVED
/// followed by an ASK during a resharding, and a bound against two nodes that each
/// believe the other owns a slot (a cluster in transition).
const MAX_REDIRECTS: u32 = 5;

// ---------------------------------------------------------------------------------
// The client

/// Errors of the cluster client.
#[derive(Debug)]
pub enum ClusterError {
    /// A seed is not `host:port`.
    BadAddress(String),
    /// Connecting to a node, or a command on it, failed; the connection was dropped.
    Node { addr: String, error: ClientError },
    /// A node's `CLUSTER SLOTS` reply could not be used.
    Slots { addr: String, error: SlotsError },
    /// No node answered `CLUSTER SLOTS` usably: what each one tried gave.
    NoNodeAnswered(Vec<ClusterError>),
    /// The keys of a multi-key command are in different slots; nothing was sent.
    CrossSlot { command: String, slots: (u16, u16) },
    /// A command was redirected more than `MAX_REDIRECTS` times: the last redirection.
    TooManyRedirections(Redirect),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::BadAddress(a) => write!(f, "{a:?} is not host:port"),
            ClusterError::Node { addr, error } => write!(f, "node {addr}: {error}"),
            ClusterError::Slots { addr, error } => write!(f, "node {addr}: {error}"),
            ClusterError::NoNodeAnswered(tried) if tried.is_empty() => write!(f, "no cluster node to ask"),
            ClusterError::NoNodeAnswered(tried) => {
                write!(f, "no cluster node answered CLUSTER SLOTS (")?;
                for (i, e) in tried.iter().enumerate() {
                    write!(f, "{}{e}", if i > 0 { "; " } else { "" })?;
                }
                write!(f, ")")
            }
            ClusterError::CrossSlot { command, slots: (a, b) } => {
                write!(f, "{command}: keys in different slots ({a} and {b}); use a hash tag {{...}}")
            }
            ClusterError::TooManyRedirections(r) => {
                write!(f, "gave up after {MAX_REDIRECTS} redirections; the last: {r}")
            }
        }
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClusterError::Node { error, .. } => Some(error),
            ClusterError::Slots { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A connection to one node: what the cluster client needs of it. Implemented by the
/// RDMA [`Client`]; the tests implement it with an in-memory cluster.
pub trait NodeConn {
    fn connect(addr: &str, opts: &Options) -> super::Result<Self>
    where
        Self: Sized;
    fn command(&mut self, args: &[&[u8]]) -> super::Result<Reply>;
    /// Appends one reply per command to `replies` as they arrive; after an error, those
    /// already there are the commands known to have run.
    fn pipeline(&mut self, cmds: &[Vec<&[u8]>], replies: &mut Vec<Reply>) -> super::Result<()>;
}

impl NodeConn for Client {
    fn connect(addr: &str, opts: &Options) -> super::Result<Client> {
        Client::connect(addr, opts.clone())
    }
    fn command(&mut self, args: &[&[u8]]) -> super::Result<Reply> {
        Client::command(self, args)
    }
    fn pipeline(&mut self, cmds: &[Vec<&[u8]>], replies: &mut Vec<Reply>) -> super::Result<()> {
        Client::pipeline_into(self, cmds, replies)
    }
}

/// What the client did to follow the cluster, for tests and reports.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// `MOVED` replies followed.
    pub moved: u64,
    /// `ASK` replies followed.
    pub ask: u64,
    /// New tries after a node failed (its connection dropped, opened again when next
    /// needed), including a pipeline's group sent again command by command.
    pub reconnects: u64,
    /// Slot map reloads after the first (after a `MOVED`, or a node failure).
    pub refreshes: u64,
}

/// How often a command is tried when its node fails, and the wait before a new try
/// (doubled each time). The default waits 0.1 + 0.2 + 0.4 + 0.8 s over 5 tries, for a
/// node that restarts or a connection that broke; a failover takes about
/// `cluster-node-timeout` (15 s by default) before another node takes the slots, so a
/// caller that must ride one out raises `tries`.
#[derive(Debug, Clone)]
pub struct Retry {
    pub tries: u32,
    pub backoff: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry { tries: 5, backoff: Duration::from_millis(100) }
    }
}

/// A client of a Valkey Cluster: one connection per primary, opened when first needed;
/// each command goes to the node serving its key's slot.
///
/// A command whose node fails is sent again (after a reload of the slot map): a
/// command whose reply was lost may thus run twice (at least once, as other cluster
/// clients that retry on connection errors). A command whose reply arrived is never
/// sent again, also when a later command of the same pipeline fails.
pub struct ClusterClient<C: NodeConn = Client> {
    opts: Options,
    seeds: Vec<NodeAddr>,
    map: SlotMap,
    conns: HashMap<String, C>,
    pub stats: Stats,
    pub retry: Retry,
}

impl<C: NodeConn> ClusterClient<C> {
    /// Loads the slot map from the first seed (`host:port`) that answers `CLUSTER SLOTS`.
    pub fn connect(seeds: &[String], opts: Options) -> Result<Self, ClusterError> {
        let seeds = seeds
            .iter()
            .map(|s| NodeAddr::parse(s).ok_or_else(|| ClusterError::BadAddress(s.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut client = ClusterClient {
            opts,
            seeds,
            map: SlotMap::empty(),
            conns: HashMap::new(),
            stats: Stats::default(),
            retry: Retry::default(),
        };
        let mut tried = Vec::new();
        for seed in client.seeds.clone() {
            match client.fetch_slots(&seed) {
                Ok(map) => {
                    client.map = map;
                    return Ok(client);
                }
                Err(e) => tried.push(e),
            }
        }
        Err(ClusterError::NoNodeAnswered(tried))
    }

    /// The primary serving `slot`, as the client knows it now.
    pub fn node_for_slot(&self, slot: u16) -> Option<String> {
        self.map.node_for_slot(slot).map(|n| n.to_string())
    }

    /// Sends one command to the node serving its key and returns its reply, following
    /// redirections and riding out a node failure (see [`Retry`]).
    pub fn command(&mut self, args: &[&[u8]]) -> Result<Reply, ClusterError> {
        let slot = command_slot(args)?;
        self.run(args, slot, None, 0)
    }

    /// Sends a keyless command to the node serving `key`: `WAIT` after a write to
    /// that key, which must reach the connection that made the write.
    pub fn command_routed(&mut self, key: &[u8], args: &[&[u8]]) -> Result<Reply, ClusterError> {
        self.run(args, Some(key_slot(key)), None, 0)
    }

    /// Sends the commands as one pipeline per node and returns the replies in the
    /// order of `cmds`. Commands redirected, and those of a failed node that got no
    /// reply, are sent again one by one, in their order, once the map is reloaded (a
    /// command that got its reply before the failure is not: it ran). Refuses the whole
    /// pipeline, sending nothing, when one command is cross-slot.
    pub fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>, ClusterError> {
        let slots = cmds.iter().map(|c| command_slot(c)).collect::<Result<Vec<_>, _>>()?;
        // one group per node, in order of first use; each keeps its commands' order
        let mut groups: Vec<(NodeAddr, Vec<usize>)> = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let node = self.pick(*slot, 0);
            match groups.iter_mut().find(|(n, _)| *n == node) {
                Some((_, group)) => group.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        let mut replies: Vec<Option<Reply>> = vec![None; cmds.len()];
        let mut again: Vec<(usize, Option<Redirect>)> = Vec::new();
        let (mut moved, mut failed) = (None, None);
        for (node, group) in groups {
            let batch: Vec<Vec<&[u8]>> = group.iter().map(|&i| cmds[i].clone()).collect();
            let mut got = Vec::with_capacity(batch.len());
            if self.call(&node, &batch, &mut got).is_err() {
                self.stats.reconnects += 1;
                failed = Some(node.clone());
                // the commands without a reply; those with one ran and are kept below
                again.extend(group[got.len().min(group.len())..].iter().map(|&i| (i, None)));
            }
            for (&i, reply) in group.iter().zip(got) {
                match redirect_of(&reply, &node) {
                    Some(r) => {
                        if let Redirect::Moved { slot, to } = &r {
                            self.stats.moved += 1;
                            self.map.set_owner(*slot, to.clone());
                            moved = Some(to.clone());
                        }
                        again.push((i, Some(r)));
                    }
                    None => replies[i] = Some(reply),
                }
            }
        }
        // one reload for the whole pipeline, not one per redirected command; a failed
        // reload is no failure (the patched map, or the retries of `run`, still route)
        if moved.is_some() || failed.is_some() {
            let _ = self.refresh(moved.as_ref(), failed.as_ref());
        }
        again.sort_by_key(|(i, _)| *i);
        for (i, redirect) in again {
            // MOVED: the map now says where; ASK: this command goes to the importing node
            let (target, followed) = match redirect {
                Some(ask @ Redirect::Ask { .. }) => (Some(ask), 1),
                Some(Redirect::Moved { .. }) => (None, 1),
                None => (None, 0),
            };
            if let Some(Redirect::Ask { .. }) = target {
                self.stats.ask += 1;
            }
            replies[i] = Some(self.run(&cmds[i], slots[i], target, followed)?);
        }
        Ok(replies.into_iter().map(|r| r.expect("every command has a reply")).collect())
    }

    /// Sends `args` until it gets a reply that is not a redirection: to `target` first
    /// if given, else where the map says. `redirects` were followed already.
    fn run(
        &mut self,
        args: &[&[u8]],
        slot: Option<u16>,
        mut target: Option<Redirect>,
        mut redirects: u32,
    ) -> Result<Reply, ClusterError> {
        let mut failures = 0;
        loop {
            let (node, asking) = match &target {
                Some(Redirect::Moved { to, .. }) => (to.clone(), false),
                Some(Redirect::Ask { to, .. }) => (to.clone(), true),
                None => (self.pick(slot, failures), false),
            };
            let mut replies = Vec::with_capacity(2);
            let sent = if asking {
                // ASKING lets the importing node serve the next command, once
                self.call(&node, &[vec![b"ASKING"], args.to_vec()], &mut replies)
            } else {
                self.call(&node, &[args.to_vec()], &mut replies)
            };
            match sent {
                Ok(()) => {
                    let reply = replies.pop().expect("call returns one reply per command");
                    let Some(redirect) = redirect_of(&reply, &node) else { return Ok(reply) };
                    if redirects == MAX_REDIRECTS {
                        return Err(ClusterError::TooManyRedirections(redirect));
                    }
                    redirects += 1;
                    match &redirect {
                        Redirect::Moved { slot, to } => {
                            self.stats.moved += 1;
                            self.map.set_owner(*slot, to.clone());
                            // the slot moved: others likely did too (a resharding, a failover)
                            let _ = self.refresh(Some(to), None);
                        }
                        Redirect::Ask { .. } => self.stats.ask += 1,
                    }
                    target = Some(redirect);
                }
                Err(e) => {
                    failures += 1;
                    let fatal = matches!(e, ClusterError::Node { error: ClientError::NoDevice(_), .. });
                    if fatal || failures >= self.retry.tries {
                        return Err(e);
                    }
                    self.stats.reconnects += 1;
                    std::thread::sleep(self.retry.backoff.saturating_mul(1 << (failures - 1).min(16)));
                    // ask the others who serves the slot now; the failed node last
                    let _ = self.refresh(None, Some(&node));
                    target = None;
                }
            }
        }
    }

    /// The node for `slot`, or for a keyless command (or a slot no node serves) any
    /// node: one we are connected to, else the `nth` known one (so that retries move on).
    fn pick(&self, slot: Option<u16>, nth: u32) -> NodeAddr {
        if let Some(node) = slot.and_then(|s| self.map.node_for_slot(s)) {
            return node.clone();
        }
        let known = if self.map.nodes().is_empty() { &self.seeds } else { self.map.nodes() };
        if let Some(node) = known.iter().find(|n| self.conns.contains_key(&n.to_string())) {
            return node.clone();
        }
        // `connect` succeeded with at least one seed, so `known` is never empty
        known[nth as usize % known.len()].clone()
    }

    /// Sends `cmds` to `node` as one pipeline (connecting first if needed), appending
    /// the replies to `replies` as they arrive. On any failure the connection is
    /// dropped (its stream may be out of step with its replies); the replies read
    /// before it stay in `replies`.
    fn call(&mut self, node: &NodeAddr, cmds: &[Vec<&[u8]>], replies: &mut Vec<Reply>) -> Result<(), ClusterError> {
        let addr = node.to_string();
        let conn = match self.conns.entry(addr.clone()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => match C::connect(&addr, &self.opts) {
                Ok(c) => e.insert(c),
                Err(error) => return Err(ClusterError::Node { addr, error }),
            },
        };
        let before = replies.len();
        let sent = match cmds {
            [one] => conn.command(one).map(|r| replies.push(r)),
            _ => conn.pipeline(cmds, replies),
        };
        match sent {
            Ok(()) if replies.len() - before == cmds.len() => Ok(()),
            Ok(()) => {
                self.conns.remove(&addr);
                Err(ClusterError::Node { addr, error: ClientError::Resp("wrong number of replies".into()) })
            }
            Err(error) => {
                self.conns.remove(&addr);
                Err(ClusterError::Node { addr, error })
            }
        }
    }

    /// `CLUSTER SLOTS` from `node`, read.
    fn fetch_slots(&mut self, node: &NodeAddr) -> Result<SlotMap, ClusterError> {
        let mut replies = Vec::with_capacity(1);
        self.call(node, &[vec![b"CLUSTER", b"SLOTS"]], &mut replies)?;
        let reply = replies.pop().expect("one reply");
        SlotMap::from_reply(&reply, node).map_err(|error| ClusterError::Slots { addr: node.to_string(), error })
    }

    /// Reloads the map from the first node that answers: `first`, then the nodes we are
    /// connected to (alive a moment ago), the other known primaries, the seeds, and
    /// `last` (a node that just failed) at the end.
    fn refresh(&mut self, first: Option<&NodeAddr>, last: Option<&NodeAddr>) -> Result<(), ClusterError> {
        let mut order: Vec<NodeAddr> = first.into_iter().cloned().collect();
        order.extend(self.map.nodes().iter().filter(|n| self.conns.contains_key(&n.to_string())).cloned());
        order.extend(self.map.nodes().iter().cloned());
        order.extend(self.seeds.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        order.retain(|n| Some(n) != last && seen.insert(n.clone()));
        order.extend(last.cloned());
        let mut tried = Vec::new();
        for node in order {
            match self.fetch_slots(&node) {
                Ok(map) => {
                    self.map = map;
                    self.stats.refreshes += 1;
                    return Ok(());
                }
                Err(e) => tried.push(e),
            }
        }
        Err(ClusterError::NoNodeAnswered(tried))
    }
}

#[cfg(test)]
mod tests {
    use super::keys::command_key;
    use super::slots::crc16;
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashSet;
    use std::rc::Rc;

    // ---- pure logic

    #[test]
    fn crc16_and_key_slots_match_valkey() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 0x31C3); // below 16384: the slot is the CRC itself
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b""), 0);
        // hash tags
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS); // empty first tag: whole key
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar")); // from the first { to the first }
        assert_eq!(key_slot(b"{}"), crc16(b"{}") % SLOTS);
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") % SLOTS); // no closing brace
        assert_eq!(key_slot(b"a{b}c{d}"), key_slot(b"b"));
    }

    fn node(host: &str, port: i64) -> Reply {
        Reply::Array(vec![Reply::Bulk(host.as_bytes().to_vec()), Reply::Integer(port), Reply::Bulk(b"id".to_vec())])
    }

    fn range(start: i64, end: i64, nodes: Vec<Reply>) -> Reply {
        let mut fields = vec![Reply::Integer(start), Reply::Integer(end)];
        fields.extend(nodes);
        Reply::Array(fields)
    }

    fn addr(s: &str) -> NodeAddr {
        NodeAddr::parse(s).unwrap()
    }

    #[test]
    fn the_slot_map_reads_cluster_slots() {
        let asked = addr("10.0.0.9:7000");
        let reply = Reply::Array(vec![
            range(0, 5460, vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)]),
            range(5461, 10922, vec![node("", 7001)]), // empty host: the node we asked
            range(10923, 16000, vec![Reply::Array(vec![Reply::Nil, Reply::Integer(7002)])]), // null host: same
            range(16001, 16383, vec![node("?", 7005)]), // unknown endpoint: unserved
        ]);
        let map = SlotMap::from_reply(&reply, &asked).unwrap();
        assert_eq!(map.node_for_slot(0), Some(&addr("10.0.0.1:7000")));
        assert_eq!(map.node_for_slot(5460), Some(&addr("10.0.0.1:7000")));
        assert_eq!(map.node_for_slot(5461), Some(&addr("10.0.0.9:7001")));
        assert_eq!(map.node_for_slot(12000), Some(&addr("10.0.0.9:7002")));
        assert_eq!(map.node_for_slot(16001), None);
        assert_eq!(map.node_for_slot(SLOTS), None);
        assert_eq!(map.nodes().len(), 3, "replicas are not primaries");
        // an IPv6 host, and a single-slot range
        let v6 = Reply::Array(vec![range(7, 7, vec![node("::1", 6381)])]);
        let map = SlotMap::from_reply(&v6, &asked).unwrap();
        assert_eq!(map.node_for_slot(7).unwrap().to_string(), "[::1]:6381");
        assert_eq!(map.node_for_slot(8), None);
        // a cluster with no slots assigned yet
        assert_eq!(SlotMap::from_reply(&Reply::Array(vec![]), &asked).unwrap().node_for_slot(0), None);
    }

    #[test]
    fn a_malformed_cluster_slots_reply_is_a_typed_error() {
        let asked = addr("10.0.0.9:7000");
        let bad = |index, problem| Err(SlotsError::Range { index, problem });
        let read = |ranges: Vec<Reply>| SlotMap::from_reply(&Reply::Array(ranges), &asked).map(|_| ());
        let ok = range(0, 10, vec![node("h", 1)]);
        assert_eq!(
            SlotMap::from_reply(&Reply::Error("ERR This instance has cluster support disabled".into()), &asked)
                .map(|_| ()),
            Err(SlotsError::Server("ERR This instance has cluster support disabled".into()))
        );
        assert_eq!(SlotMap::from_reply(&Reply::Integer(1), &asked).map(|_| ()), Err(SlotsError::NotAnArray));
        assert_eq!(read(vec![ok.clone(), Reply::Integer(3)]), bad(1, RangeProblem::Shape));
        assert_eq!(read(vec![range(0, 10, vec![])]), bad(0, RangeProblem::Shape));
        assert_eq!(read(vec![range(10, 0, vec![node("h", 1)])]), bad(0, RangeProblem::Slots));
        assert_eq!(read(vec![range(0, 16384, vec![node("h", 1)])]), bad(0, RangeProblem::Slots));
        assert_eq!(read(vec![range(-1, 3, vec![node("h", 1)])]), bad(0, RangeProblem::Slots));
        assert_eq!(read(vec![ok.clone(), range(10, 20, vec![node("h", 2)])]), bad(1, RangeProblem::Overlap));
        assert_eq!(read(vec![range(0, 1, vec![Reply::Integer(1)])]), bad(0, RangeProblem::Node));
        assert_eq!(read(vec![range(0, 1, vec![node("h", 70000)])]), bad(0, RangeProblem::Node));
        assert_eq!(
            read(vec![range(0, 1, vec![Reply::Array(vec![Reply::Bulk(b"h".to_vec())])])]),
            bad(0, RangeProblem::Node)
        );
        assert_eq!(read(vec![range(0, 1, vec![node("h", 1), Reply::Nil])]), bad(0, RangeProblem::Node), "bad replica");
    }

    #[test]
    fn redirections_parse_with_every_host_form() {
        let moved = |slot, to: &str| Some(Redirect::Moved { slot, to: addr(to) });
        assert_eq!(Redirect::parse("MOVED 3999 127.0.0.1:6381"), moved(3999, "127.0.0.1:6381"));
        assert_eq!(
            Redirect::parse("ASK 3999 127.0.0.1:6381"),
            Some(Redirect::Ask { slot: 3999, to: addr("127.0.0.1:6381") })
        );
        let v6 = NodeAddr { host: "::1".into(), port: 6381 };
        assert_eq!(Redirect::parse("MOVED 1 [::1]:6381"), Some(Redirect::Moved { slot: 1, to: v6.clone() }));
        assert_eq!(Redirect::parse("MOVED 1 ::1:6381"), Some(Redirect::Moved { slot: 1, to: v6.clone() }));
        assert_eq!(v6.to_string(), "[::1]:6381");
        assert_eq!(Redirect::parse("ASK 1 ::1:6381").unwrap().to_string(), "ASK 1 [::1]:6381");
        assert_eq!(Redirect::parse("MOVED 1 node-7.example:6381"), moved(1, "node-7.example:6381"));
        // unknown endpoint: the node that answered
        let r = Redirect::parse("MOVED 5 :6390").unwrap();
        assert_eq!(r.to().host, "");
        assert_eq!(r.with_host_of(&addr("10.0.0.2:6379")), Redirect::Moved { slot: 5, to: addr("10.0.0.2:6390") });
        for not in [
            "ERR unknown command",
            "MOVED",
            "MOVED 3999",
            "MOVED 16384 h:1",
            "MOVED x h:1",
            "MOVED 1 h",
            "MOVED 1 h:port",
            "MOVED 1 h:1 extra",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "TRYAGAIN Multiple keys request during rehashing of slot",
        ] {
            assert_eq!(Redirect::parse(not), None, "{not}");
        }
    }

    #[test]
    fn commands_route_by_their_key() {
        fn key<'a>(args: &[&'a [u8]]) -> Option<&'a [u8]> {
            command_key(args).unwrap()
        }
        assert_eq!(key(&[b"GET", b"k"]), Some(&b"k"[..]));
        assert_eq!(key(&[b"set", b"k", b"v"]), Some(&b"k"[..]), "case-insensitive");
        assert_eq!(key(&[b"LRANGE", b"list", b"0", b"-1"]), Some(&b"list"[..]));
        assert_eq!(key(&[b"HSET", b"h", b"f", b"v"]), Some(&b"h"[..]));
        assert_eq!(key(&[b"EXPIRE", b"k", b"10"]), Some(&b"k"[..]));
        assert_eq!(key(&[b"DEL", b"k"]), Some(&b"k"[..]));
        assert_eq!(key(&[b"MGET", b"{u}a", b"{u}b", b"{u}c"]), Some(&b"{u}a"[..]));
        assert_eq!(key(&[b"MSET", b"{u}a", b"1", b"{u}b", b"2"]), Some(&b"{u}a"[..]));
        // MSET's values may hash anywhere
        assert_eq!(key(&[b"MSET", b"{u}a", b"foo", b"{u}b", b"bar"]), Some(&b"{u}a"[..]));
        // keyless, unknown and incomplete commands: any node
        for args in [&[&b"PING"[..]][..], &[b"INFO", b"memory"], &[b"DBSIZE"], &[b"CLUSTER", b"SLOTS"], &[b"GET"], &[]]
        {
            assert_eq!(key(args), None);
        }
        assert_eq!(key(&[b"SUNION", b"a", b"b"]), None, "not in the table: the server redirects");
        match command_key(&[b"mget", b"a", b"b"]) {
            Err(ClusterError::CrossSlot { command, slots }) => {
                assert_eq!(command, "MGET");
                assert_eq!(slots, (key_slot(b"a"), key_slot(b"b")));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(command_key(&[b"DEL", b"a", b"b"]), Err(ClusterError::CrossSlot { .. })));
        assert!(matches!(command_key(&[b"MSET", b"a", b"1", b"b", b"2"]), Err(ClusterError::CrossSlot { .. })));
    }

    // ---- an in-memory cluster, as a NodeConn

    struct FakeNode {
        addr: NodeAddr,
        up: bool,
        data: HashMap<Vec<u8>, Vec<u8>>,
    }

    #[derive(Default)]
    struct FakeCluster {
        nodes: Vec<FakeNode>,
        /// Slot -> index into `nodes`.
        owner: Vec<usize>,
        /// Slot being migrated -> the importing node.
        migrating: HashMap<u16, usize>,
        /// (node, command name) of every command a node executed.
        log: Vec<(usize, Vec<u8>)>,
        /// Connection attempts, refused ones included.
        connects: usize,
        /// Commands left before the connection that runs them breaks (the node lives
        /// on and takes new connections): a connection lost mid-pipeline.
        break_after: Option<usize>,
    }

    type Shared = Rc<RefCell<FakeCluster>>;

    thread_local! {
        // NodeConn::connect has no context argument; each test runs on its own thread
        static CLUSTER: RefCell<Option<Shared>> = const { RefCell::new(None) };
    }

    impl FakeCluster {
        /// Three primaries at 127.0.0.1:7000..7002 with a third of the slots each.
        fn start() -> Shared {
            let nodes = (0..3)
                .map(|i| FakeNode { addr: addr(&format!("127.0.0.1:{}", 7000 + i)), up: true, data: HashMap::new() })
                .collect();
            let owner = (0..SLOTS as usize).map(|s| s * 3 / SLOTS as usize).collect();
            let c = Rc::new(RefCell::new(FakeCluster { nodes, owner, ..Default::default() }));
            CLUSTER.with(|slot| *slot.borrow_mut() = Some(c.clone()));
            c
        }

        fn node_of(&self, key: &[u8]) -> usize {
            self.owner[key_slot(key) as usize]
        }

        /// Moves `slot`, and its keys, to node `to` (the end of a migration).
        fn move_slot(&mut self, slot: u16, to: usize) {
            let from = self.owner[slot as usize];
            let keys: Vec<_> = self.nodes[from].data.keys().filter(|k| key_slot(k) == slot).cloned().collect();
            for k in keys {
                let v = self.nodes[from].data.remove(&k).unwrap();
                self.nodes[to].data.insert(k, v);
            }
            self.owner[slot as usize] = to;
            self.migrating.remove(&slot);
        }

        /// A failover: node `dead` goes away, a new node (its replica, with its data)
        /// at `replica` takes over its slots.
        fn fail_over(&mut self, dead: usize, replica: &str) -> usize {
            let data = std::mem::take(&mut self.nodes[dead].data);
            self.nodes[dead].up = false;
            self.nodes.push(FakeNode { addr: addr(replica), up: true, data });
            let new = self.nodes.len() - 1;
            self.owner.iter_mut().filter(|o| **o == dead).for_each(|o| *o = new);
            new
        }

        fn slots_reply(&self) -> Reply {
            let mut ranges = Vec::new();
            let mut start = 0;
            for slot in 1..=SLOTS as usize {
                if slot == SLOTS as usize || self.owner[slot] != self.owner[start] {
                    let n = &self.nodes[self.owner[start]];
                    let replica = node(&n.addr.host, n.addr.port as i64 + 100);
                    ranges.push(range(
                        start as i64,
                        slot as i64 - 1,
                        vec![node(&n.addr.host, n.addr.port as i64), replica],
                    ));
                    start = slot;
                }
            }
            Reply::Array(ranges)
        }
    }

    struct FakeConn {
        cluster: Shared,
        node: usize,
        asking: bool,
        /// Lost mid-pipeline (`break_after`): every later command fails.
        broken: bool,
    }

    impl NodeConn for FakeConn {
        fn connect(addr: &str, _: &Options) -> super::super::Result<FakeConn> {
            let cluster = CLUSTER.with(|c| c.borrow().clone()).expect("FakeCluster::start first");
            let mut c = cluster.borrow_mut();
            c.connects += 1;
            let node = c.nodes.iter().position(|n| n.up && n.addr.to_string() == addr);
            drop(c);
            match node {
                Some(node) => Ok(FakeConn { cluster, node, asking: false, broken: false }),
                None => Err(ClientError::Refused(format!("{addr}: no node there"))),
            }
        }

        fn command(&mut self, args: &[&[u8]]) -> super::super::Result<Reply> {
            self.execute(args)
        }

        fn pipeline(&mut self, cmds: &[Vec<&[u8]>], replies: &mut Vec<Reply>) -> super::super::Result<()> {
            for c in cmds {
                replies.push(self.execute(c)?);
            }
            Ok(())
        }
    }

    impl FakeConn {
        /// One command as a cluster node runs it: MOVED for a slot it does not serve,
        /// ASK for a key it lacks in a slot it is migrating away, ASKING for one command
        /// in a slot it imports.
        fn execute(&mut self, args: &[&[u8]]) -> super::super::Result<Reply> {
            let mut c = self.cluster.borrow_mut();
            let me = self.node;
            if !c.nodes[me].up || self.broken {
                return Err(ClientError::PeerGone);
            }
            if let Some(left) = c.break_after.as_mut() {
                if *left == 0 {
                    c.break_after = None;
                    self.broken = true;
                    return Err(ClientError::PeerGone);
                }
                *left -= 1;
            }
            let name = args[0].to_ascii_uppercase();
            c.log.push((me, name.clone()));
            let asking = std::mem::take(&mut self.asking);
            let ok = || Reply::Status("OK".into());
            match name.as_slice() {
                b"ASKING" => {
                    self.asking = true;
                    return Ok(ok());
                }
                b"PING" => return Ok(Reply::Status("PONG".into())),
                b"CLUSTER" if args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(b"SLOTS")) => {
                    return Ok(c.slots_reply())
                }
                b"GET" | b"SET" | b"MGET" | b"INCR" => {}
                _ => return Ok(Reply::Error("ERR unknown command".into())),
            }
            let keys: Vec<&[u8]> = if name == b"MGET" { args[1..].to_vec() } else { vec![args[1]] };
            let slot = key_slot(keys[0]);
            if keys.iter().any(|k| key_slot(k) != slot) {
                return Ok(Reply::Error("CROSSSLOT Keys in request don't hash to the same slot".into()));
            }
            let owner = c.owner[slot as usize];
            let importing = c.migrating.get(&slot) == Some(&me);
            if owner != me && !(asking && importing) {
                return Ok(Reply::Error(format!("MOVED {slot} {}", c.nodes[owner].addr)));
            }
            if owner == me {
                if let Some(&to) = c.migrating.get(&slot) {
                    if keys.iter().any(|k| !c.nodes[me].data.contains_key(*k)) {
                        return Ok(Reply::Error(format!("ASK {slot} {}", c.nodes[to].addr)));
                    }
                }
            }
            let data = &mut c.nodes[me].data;
            let get = |k: &[u8]| data.get(k).map_or(Reply::Nil, |v| Reply::Bulk(v.clone()));
            Ok(match name.as_slice() {
                b"GET" => get(args[1]),
                b"MGET" => Reply::Array(keys.iter().map(|k| get(k)).collect()),
                b"INCR" => {
                    let n = data.get(args[1]).map_or(0, |v| String::from_utf8_lossy(v).parse::<i64>().unwrap_or(0)) + 1;
                    data.insert(args[1].to_vec(), n.to_string().into_bytes());
                    Reply::Integer(n)
                }
                _ => {
                    data.insert(args[1].to_vec(), args[2].to_vec());
                    ok()
                }
            })
        }
    }

    fn connect() -> ClusterClient<FakeConn> {
        let mut c = ClusterClient::<FakeConn>::connect(&["127.0.0.1:7001".into()], Options::default()).unwrap();
        c.retry.backoff = Duration::ZERO;
        c
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    /// The node that executed the last data command.
    fn last_node(cluster: &Shared) -> usize {
        cluster.borrow().log.iter().rev().find(|(_, n)| n != b"CLUSTER").unwrap().0
    }

    #[test]
    fn commands_go_to_the_node_serving_their_slot() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        assert_eq!(c.node_for_slot(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(c.node_for_slot(16383).as_deref(), Some("127.0.0.1:7002"));
        let mut nodes_used = HashSet::new();
        for i in 0..30 {
            let key = format!("key:{i}");
            assert_eq!(c.command(&[b"SET", key.as_bytes(), b"v"]).unwrap(), Reply::Status("OK".into()));
            let owner = cluster.borrow().node_of(key.as_bytes());
            assert_eq!(last_node(&cluster), owner, "{key}");
            assert!(cluster.borrow().nodes[owner].data.contains_key(key.as_bytes()));
            nodes_used.insert(owner);
        }
        assert_eq!(nodes_used.len(), 3);
        assert_eq!(c.command(&[b"PING"]).unwrap(), Reply::Status("PONG".into()));
        assert_eq!(c.command(&[b"MGET", b"{t}a", b"{t}b"]).unwrap(), Reply::Array(vec![Reply::Nil, Reply::Nil]));
        assert_eq!(c.stats, Stats::default(), "no redirection, no reconnect, no reload");
        assert_eq!(c.conns.len(), 3, "one connection per node");
    }

    #[test]
    fn moved_updates_the_map_and_reads_from_the_new_owner() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        c.command(&[b"SET", b"foo", b"bar"]).unwrap();
        let slot = key_slot(b"foo");
        let (old, new) = (cluster.borrow().node_of(b"foo"), 0);
        assert_ne!(old, new);
        cluster.borrow_mut().move_slot(slot, new);

        assert_eq!(c.command(&[b"GET", b"foo"]).unwrap(), bulk("bar"));
        assert_eq!(last_node(&cluster), new);
        assert_eq!(c.stats.moved, 1);
        assert_eq!(c.stats.refreshes, 1);
        assert_eq!(c.node_for_slot(slot).as_deref(), Some("127.0.0.1:7000"));
        // the next command goes straight to the new owner
        assert_eq!(c.command(&[b"GET", b"foo"]).unwrap(), bulk("bar"));
        assert_eq!(c.stats.moved, 1);
    }

    #[test]
    fn ask_during_a_migration_asks_the_importing_node_once_and_keeps_the_map() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let slot = key_slot(b"foo");
        let (owner, importer) = (cluster.borrow().node_of(b"foo"), 0);
        {
            // "foo" was already migrated; "{foo}stay" was not
            let mut cl = cluster.borrow_mut();
            cl.migrating.insert(slot, importer);
            cl.nodes[importer].data.insert(b"foo".to_vec(), b"moved-already".to_vec());
            cl.nodes[owner].data.insert(b"{foo}stay".to_vec(), b"still-here".to_vec());
        }
        assert_eq!(c.command(&[b"GET", b"foo"]).unwrap(), bulk("moved-already"));
        assert_eq!(c.stats.ask, 1);
        let log: Vec<_> = cluster.borrow().log.iter().rev().take(2).cloned().collect();
        assert_eq!(log, vec![(importer, b"GET".to_vec()), (importer, b"ASKING".to_vec())]);
        assert_eq!(c.command(&[b"GET", b"{foo}stay"]).unwrap(), bulk("still-here"));
        assert_eq!(last_node(&cluster), owner, "the map still names the migrating owner");
        assert_eq!(c.stats.ask, 1);
        assert_eq!((c.stats.moved, c.stats.refreshes), (0, 0));
        assert_eq!(c.node_for_slot(slot), Some(cluster.borrow().nodes[owner].addr.to_string()));
    }

    #[test]
    fn a_pipeline_over_all_nodes_returns_replies_in_order() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let keys: Vec<String> = (0..500).map(|i| format!("key:{i}")).collect();
        let vals: Vec<String> = (0..500).map(|i| format!("value-{i}")).collect();
        // SET k, GET k alternating: 1,000 commands
        let cmds: Vec<Vec<&[u8]>> = keys
            .iter()
            .zip(&vals)
            .flat_map(|(k, v)| [vec![&b"SET"[..], k.as_bytes(), v.as_bytes()], vec![&b"GET"[..], k.as_bytes()]])
            .collect();
        assert_eq!(cmds.len(), 1000);
        let replies = c.pipeline(&cmds).unwrap();
        assert_eq!(replies.len(), 1000);
        for (i, v) in vals.iter().enumerate() {
            assert_eq!(replies[2 * i], Reply::Status("OK".into()));
            assert_eq!(replies[2 * i + 1], bulk(v), "reply {}", 2 * i + 1);
        }
        assert_eq!(c.stats, Stats::default());
        let per_node: Vec<usize> = (0..3).map(|n| cluster.borrow().nodes[n].data.len()).collect();
        assert!(per_node.iter().all(|&n| n > 100), "{per_node:?}");

        // reshard behind the client's back: a pipeline of GETs follows the MOVEDs
        let moved_slots: Vec<u16> = keys.iter().take(20).map(|k| key_slot(k.as_bytes())).collect();
        for &s in &moved_slots {
            let mut cl = cluster.borrow_mut();
            let to = (cl.owner[s as usize] + 1) % 3;
            cl.move_slot(s, to);
        }
        let gets: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k.as_bytes()]).collect();
        let replies = c.pipeline(&gets).unwrap();
        assert_eq!(replies, vals.iter().map(|v| bulk(v)).collect::<Vec<_>>());
        assert!(c.stats.moved >= 20, "{:?}", c.stats);
        assert_eq!(c.stats.refreshes, 1, "one reload for the whole pipeline");
        let before = c.stats.clone();
        assert_eq!(c.pipeline(&gets).unwrap().len(), 500);
        assert_eq!(c.stats, before, "the reloaded map routes everything directly");
    }

    #[test]
    fn a_pipeline_follows_ask_for_the_commands_that_get_it() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let slot = key_slot(b"foo");
        cluster.borrow_mut().migrating.insert(slot, 0);
        let cmds: Vec<Vec<&[u8]>> =
            vec![vec![b"SET", b"foo", b"1"], vec![b"SET", b"other", b"2"], vec![b"GET", b"other"]];
        let replies = c.pipeline(&cmds).unwrap();
        assert_eq!(replies, vec![Reply::Status("OK".into()), Reply::Status("OK".into()), bulk("2")]);
        assert_eq!(c.stats.ask, 1);
        assert!(cluster.borrow().nodes[0].data.contains_key(&b"foo"[..]), "written on the importing node");
    }

    #[test]
    fn a_failed_node_is_dropped_and_its_slots_found_on_the_new_primary() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let keys: Vec<String> = (0..60).map(|i| format!("key:{i}")).collect();
        for k in &keys {
            c.command(&[b"SET", k.as_bytes(), k.as_bytes()]).unwrap();
        }
        assert_eq!(c.conns.len(), 3);
        let new = cluster.borrow_mut().fail_over(2, "127.0.0.1:7012");
        let gone_key = keys.iter().find(|k| cluster.borrow().node_of(k.as_bytes()) == new).unwrap();
        assert_eq!(c.command(&[b"GET", gone_key.as_bytes()]).unwrap(), bulk(gone_key));
        assert_eq!(last_node(&cluster), new);
        assert_eq!(c.stats.reconnects, 1);
        assert_eq!(c.stats.refreshes, 1);
        assert!(!c.conns.contains_key("127.0.0.1:7002"));
        // and everything else still works, single commands and pipelines
        for k in &keys {
            assert_eq!(c.command(&[b"GET", k.as_bytes()]).unwrap(), bulk(k));
        }
        let gets: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k.as_bytes()]).collect();
        assert_eq!(c.pipeline(&gets).unwrap(), keys.iter().map(|k| bulk(k)).collect::<Vec<_>>());
        assert_eq!(c.stats.reconnects, 1);
    }

    #[test]
    fn a_pipeline_to_a_failed_node_is_sent_again_after_a_reload() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let keys: Vec<String> = (0..60).map(|i| format!("key:{i}")).collect();
        let sets: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"SET"[..], k.as_bytes(), k.as_bytes()]).collect();
        c.pipeline(&sets).unwrap();
        cluster.borrow_mut().fail_over(1, "127.0.0.1:7011");
        let gets: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k.as_bytes()]).collect();
        assert_eq!(c.pipeline(&gets).unwrap(), keys.iter().map(|k| bulk(k)).collect::<Vec<_>>());
        assert_eq!((c.stats.reconnects, c.stats.refreshes), (1, 1));
    }

    #[test]
    fn a_node_that_stays_down_fails_after_the_bounded_tries() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        c.retry.tries = 3;
        let key = (0..).map(|i| format!("key:{i}")).find(|k| cluster.borrow().node_of(k.as_bytes()) == 1).unwrap();
        cluster.borrow_mut().nodes[1].up = false; // no failover: the map keeps naming it
        let before = cluster.borrow().connects;
        match c.command(&[b"GET", key.as_bytes()]) {
            Err(ClusterError::Node { addr, error: ClientError::Refused(_) }) => assert_eq!(addr, "127.0.0.1:7001"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.stats.reconnects, 2, "tries - 1 retries");
        assert!(cluster.borrow().connects - before <= 3 * 3, "bounded");
        // the rest of the cluster is unaffected
        let other = (0..).map(|i| format!("key:{i}")).find(|k| cluster.borrow().node_of(k.as_bytes()) == 2).unwrap();
        assert_eq!(c.command(&[b"GET", other.as_bytes()]).unwrap(), Reply::Nil);
    }

    #[test]
    fn connect_uses_the_first_seed_that_answers() {
        let cluster = FakeCluster::start();
        cluster.borrow_mut().nodes[0].up = false;
        let seeds = ["127.0.0.1:7000".to_string(), "127.0.0.1:7002".to_string()];
        let c = ClusterClient::<FakeConn>::connect(&seeds, Options::default()).unwrap();
        assert_eq!(c.node_for_slot(16383).as_deref(), Some("127.0.0.1:7002"));
        match ClusterClient::<FakeConn>::connect(&["127.0.0.1:7000".into(), "10.9.9.9:1".into()], Options::default()) {
            Err(ClusterError::NoNodeAnswered(tried)) => assert_eq!(tried.len(), 2),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected to nothing"),
        }
        assert!(matches!(
            ClusterClient::<FakeConn>::connect(&["no-port".into()], Options::default()),
            Err(ClusterError::BadAddress(_))
        ));
    }

    #[test]
    fn too_many_redirections_return_the_last_one() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        // a broken migration: the owner "migrates" the slot to itself, so it answers
        // every GET of a key it lacks with an ASK to itself, forever
        let slot = key_slot(b"foo");
        let owner = cluster.borrow().owner[slot as usize];
        cluster.borrow_mut().migrating.insert(slot, owner);
        match c.command(&[b"GET", b"foo"]) {
            Err(ClusterError::TooManyRedirections(Redirect::Ask { slot: s, .. })) => assert_eq!(s, slot),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.stats.ask, MAX_REDIRECTS as u64);
        let sent = cluster.borrow().log.iter().filter(|(_, n)| n == b"GET").count();
        assert_eq!(sent as u32, 1 + MAX_REDIRECTS, "the first try and one per redirection followed");
    }

    #[test]
    fn cross_slot_commands_are_refused_before_sending() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        let sent = cluster.borrow().log.len();
        match c.command(&[b"MGET", b"a", b"b"]) {
            Err(ClusterError::CrossSlot { command, .. }) => assert_eq!(command, "MGET"),
            other => panic!("{other:?}"),
        }
        let cmds: Vec<Vec<&[u8]>> = vec![vec![b"GET", b"a"], vec![b"MGET", b"a", b"b"]];
        assert!(matches!(c.pipeline(&cmds), Err(ClusterError::CrossSlot { .. })));
        assert_eq!(cluster.borrow().log.len(), sent, "nothing was sent");
        c.command(&[b"SET", b"{a}1", b"x"]).unwrap();
        assert_eq!(
            c.command(&[b"MGET", b"{a}1", b"{a}2"]).unwrap(),
            Reply::Array(vec![bulk("x"), Reply::Nil]),
            "one hash tag, one slot"
        );
    }

    #[test]
    fn a_pipeline_cut_mid_way_resends_only_the_commands_without_a_reply() {
        let cluster = FakeCluster::start();
        let mut c = connect();
        // five INCRs of one key, one node; the connection breaks after three ran
        let cmds: Vec<Vec<&[u8]>> = (0..5).map(|_| vec![&b"INCR"[..], b"counter"]).collect();
        cluster.borrow_mut().break_after = Some(3);
        let replies = c.pipeline(&cmds).unwrap();
        assert_eq!(replies, (1..=5).map(Reply::Integer).collect::<Vec<_>>());
        assert_eq!(c.command(&[b"GET", b"counter"]).unwrap(), bulk("5"), "each INCR ran once");
        assert_eq!(c.stats.reconnects, 1);
    }
}
