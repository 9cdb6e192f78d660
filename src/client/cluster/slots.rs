//! Hash slots (CRC16 of the key or its hash tag), node addresses as the cluster names
//! them, and the slot map `CLUSTER SLOTS` describes.

use std::fmt;

use crate::client::Reply;

/// Valkey Cluster's number of hash slots.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0, no reflection), the table of
/// Valkey's `crc16.c`, computed at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

pub(crate) fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize])
}

/// The hash slot of a key, as Valkey's `keyHashSlot`: when the key has a `{` and a later
/// `}` with at least one byte between the first `{` and the first `}` after it, only
/// those bytes are hashed (a "hash tag", which lets keys share a slot); otherwise the
/// whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

// ---------------------------------------------------------------------------------
// Node addresses

/// A node's address as the cluster names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    /// An IP address or host name, without brackets; empty means "the node we asked"
    /// until [`NodeAddr::or_host`] fills it in.
    pub host: String,
    pub port: u16,
}

impl NodeAddr {
    /// Parses `host:port`, `[v6]:port` or `v6:port`: the port follows the *last* colon,
    /// so an IPv6 address needs no brackets (Valkey writes `MOVED` that way). The host
    /// may be empty (`:6379`, Valkey's "unknown endpoint").
    pub fn parse(s: &str) -> Option<NodeAddr> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        Some(NodeAddr { host: host.to_string(), port: port.parse().ok()? })
    }

    /// This address, or `asked`'s host with our port when our host is empty.
    pub(super) fn or_host(self, asked: &NodeAddr) -> NodeAddr {
        if self.host.is_empty() {
            NodeAddr { host: asked.host.clone(), port: self.port }
        } else {
            self
        }
    }
}

/// `host:port`, with brackets around an IPv6 host: the form `Client::connect` resolves,
/// and the key of a node's connection.
impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

// ---------------------------------------------------------------------------------
// The slot map

/// Why a `CLUSTER SLOTS` reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotsError {
    /// The node answered an error (cluster support disabled, a loading node).
    Server(String),
    /// The reply is not an array of slot ranges.
    NotAnArray,
    /// Slot range `index` (0-based) of the reply is wrong.
    Range { index: usize, problem: RangeProblem },
}

/// What is wrong with one slot range of a `CLUSTER SLOTS` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeProblem {
    /// Not an array of at least `[start, end, primary]`.
    Shape,
    /// Start or end is not an integer, not a slot, or start > end.
    Slots,
    /// The range overlaps one listed before it: one node's view never does that.
    Overlap,
    /// The primary is not `[host, port, ...]` with a string (or null) host and a port.
    Node,
}

impl fmt::Display for SlotsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotsError::Server(e) => write!(f, "CLUSTER SLOTS answered an error: {e}"),
            SlotsError::NotAnArray => write!(f, "CLUSTER SLOTS did not answer an array"),
            SlotsError::Range { index, problem } => {
                let what = match problem {
                    RangeProblem::Shape => "is not [start, end, primary, ...]",
                    RangeProblem::Slots => "has no valid start..=end slots",
                    RangeProblem::Overlap => "overlaps an earlier range",
                    RangeProblem::Node => "has no valid [host, port] primary",
                };
                write!(f, "CLUSTER SLOTS range {index} {what}")
            }
        }
    }
}

impl std::error::Error for SlotsError {}

/// Which primary serves each slot. Replicas are read and checked but not kept: every
/// command goes to the primary (no reads from replicas).
#[derive(Debug, Clone)]
pub(crate) struct SlotMap {
    /// The primaries, each once.
    nodes: Vec<NodeAddr>,
    /// For each slot, an index into `nodes`, or [`SlotMap::UNSERVED`].
    owner: Vec<u16>,
}

impl SlotMap {
    const UNSERVED: u16 = u16::MAX;

    pub(crate) fn empty() -> SlotMap {
        SlotMap { nodes: Vec::new(), owner: vec![Self::UNSERVED; SLOTS as usize] }
    }

    /// Builds the map from a `CLUSTER SLOTS` reply sent by `asked`.
    ///
    /// Endpoints: Valkey documents a null or empty host as "the endpoint you sent this
    /// command to" (a node behind a load balancer, a node that does not know its own
    /// IP), so both become `asked`'s host with the port given. `?` means a node that
    /// should publish a host name and has none: an unknown node, *not* `asked`, so its
    /// slots stay unserved here; a command for them goes to any node, and its `MOVED`
    /// says where to go.
    pub(crate) fn from_reply(reply: &Reply, asked: &NodeAddr) -> Result<SlotMap, SlotsError> {
        let ranges = match reply {
            Reply::Array(ranges) => ranges,
            Reply::Error(e) => return Err(SlotsError::Server(e.clone())),
            _ => return Err(SlotsError::NotAnArray),
        };
        let mut map = SlotMap::empty();
        let mut seen = vec![false; SLOTS as usize];
        for (index, range) in ranges.iter().enumerate() {
            let bad = |problem| SlotsError::Range { index, problem };
            let Reply::Array(fields) = range else { return Err(bad(RangeProblem::Shape)) };
            if fields.len() < 3 {
                return Err(bad(RangeProblem::Shape));
            }
            let slot = |r: &Reply| match r {
                Reply::Integer(i) => u16::try_from(*i).ok().filter(|s| *s < SLOTS),
                _ => None,
            };
            let (Some(start), Some(end)) = (slot(&fields[0]), slot(&fields[1])) else {
                return Err(bad(RangeProblem::Slots));
            };
            if start > end {
                return Err(bad(RangeProblem::Slots));
            }
            // primary first, then replicas: all must be well formed, only the primary is kept
            let mut nodes = fields[2..].iter().map(|n| endpoint(n, asked));
            let primary = nodes.next().flatten().ok_or(bad(RangeProblem::Node))?;
            if nodes.any(|n| n.is_none()) {
                return Err(bad(RangeProblem::Node));
            }
            let slots = start as usize..=end as usize;
            if seen[slots.clone()].iter().any(|s| *s) {
                return Err(bad(RangeProblem::Overlap));
            }
            seen[slots.clone()].iter_mut().for_each(|s| *s = true);
            if let Endpoint::Known(addr) = primary {
                let i = map.index_of(addr);
                map.owner[slots].iter_mut().for_each(|o| *o = i);
            }
        }
        Ok(map)
    }

    /// The primary serving `slot`, when known.
    pub(crate) fn node_for_slot(&self, slot: u16) -> Option<&NodeAddr> {
        let i = *self.owner.get(slot as usize)?;
        self.nodes.get(i as usize)
    }

    /// Records that `addr` now serves `slot` (what a `MOVED` says).
    pub(crate) fn set_owner(&mut self, slot: u16, addr: NodeAddr) {
        if (slot as usize) < self.owner.len() {
            self.owner[slot as usize] = self.index_of(addr);
        }
    }

    /// The primaries, in the order the reply named them.
    pub(crate) fn nodes(&self) -> &[NodeAddr] {
        &self.nodes
    }

    fn index_of(&mut self, addr: NodeAddr) -> u16 {
        match self.nodes.iter().position(|n| *n == addr) {
            Some(i) => i as u16,
            None => {
                // at most one node per slot range, and ranges are disjoint: never near u16::MAX
                self.nodes.push(addr);
                (self.nodes.len() - 1) as u16
            }
        }
    }
}

/// A node entry of `CLUSTER SLOTS`, read.
enum Endpoint {
    Known(NodeAddr),
    /// `?`: the node has no usable address (see [`SlotMap::from_reply`]).
    Unknown,
}

/// Reads `[host, port, id?, metadata?]`; `None` when malformed.
fn endpoint(node: &Reply, asked: &NodeAddr) -> Option<Endpoint> {
    let Reply::Array(fields) = node else { return None };
    let port = match fields.get(1)? {
        Reply::Integer(p) => u16::try_from(*p).ok()?,
        _ => return None,
    };
    let host = match fields.first()? {
        Reply::Bulk(h) => String::from_utf8(h.clone()).ok()?,
        Reply::Status(h) => h.clone(),
        Reply::Nil => String::new(),
        _ => return None,
    };
    if host == "?" {
        return Some(Endpoint::Unknown);
    }
    Some(Endpoint::Known(NodeAddr { host, port }.or_host(asked)))
}
