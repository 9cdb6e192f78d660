//! Redirections: `-MOVED` and `-ASK` replies, parsed.

use std::fmt;

use super::{NodeAddr, SLOTS};
use crate::client::Reply;

/// A node's answer that another node serves the slot: `-MOVED slot host:port` (for
/// good: update the map) or `-ASK slot host:port` (a slot being migrated: ask that node
/// for this one command, after `ASKING`, and keep the map).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    Moved { slot: u16, to: NodeAddr },
    Ask { slot: u16, to: NodeAddr },
}

impl Redirect {
    /// Reads an error reply's text (without the leading `-`); `None` when it is not a
    /// redirection. The address may be `host:port`, `[v6]:port`, `v6:port` or `:port`
    /// (an unknown endpoint: the node that answered, filled in by the client).
    pub fn parse(error: &str) -> Option<Redirect> {
        let mut words = error.split(' ');
        let (kind, slot, addr) = (words.next()?, words.next()?, words.next()?);
        if words.next().is_some() {
            return None;
        }
        let slot = slot.parse::<u16>().ok().filter(|s| *s < SLOTS)?;
        let to = NodeAddr::parse(addr)?;
        match kind {
            "MOVED" => Some(Redirect::Moved { slot, to }),
            "ASK" => Some(Redirect::Ask { slot, to }),
            _ => None,
        }
    }

    pub fn slot(&self) -> u16 {
        match self {
            Redirect::Moved { slot, .. } | Redirect::Ask { slot, .. } => *slot,
        }
    }

    pub fn to(&self) -> &NodeAddr {
        match self {
            Redirect::Moved { to, .. } | Redirect::Ask { to, .. } => to,
        }
    }

    /// With an empty host replaced by the host of the node that answered.
    pub(super) fn with_host_of(self, asked: &NodeAddr) -> Redirect {
        match self {
            Redirect::Moved { slot, to } => Redirect::Moved { slot, to: to.or_host(asked) },
            Redirect::Ask { slot, to } => Redirect::Ask { slot, to: to.or_host(asked) },
        }
    }
}

/// As the server writes it: `MOVED 3999 127.0.0.1:6381`.
impl fmt::Display for Redirect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if matches!(self, Redirect::Moved { .. }) { "MOVED" } else { "ASK" };
        write!(f, "{kind} {} {}", self.slot(), self.to())
    }
}

/// The redirection a reply carries, if any.
pub(super) fn redirect_of(reply: &Reply, asked: &NodeAddr) -> Option<Redirect> {
    match reply {
        Reply::Error(e) => Redirect::parse(e).map(|r| r.with_host_of(asked)),
        _ => None,
    }
}
