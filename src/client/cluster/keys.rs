//! Which argument of a command is its key, for the commands the client routes itself.

use super::{key_slot, ClusterError};

/// Where a command's keys are, for the commands we route ourselves. Everything else
/// (keyless commands such as PING, INFO, DBSIZE, CLUSTER ..., and commands missing from
/// these lists) goes to any node: a node that does not serve the command's keys answers
/// `MOVED` (or `CROSSSLOT`) itself, so a missing entry costs a hop, never a wrong answer.
/// The lists are the common data commands only, to keep them checkable by eye.
enum Keys {
    /// `args[1]` is the only key.
    First,
    /// Every argument after the name is a key: MGET k1 k2 ..., DEL k1 k2 ...
    All,
    /// Key, value, key, value ...: MSET k1 v1 k2 v2 ...
    Pairs,
}

const KEYS: &[(&str, Keys)] = &[
    ("GET", Keys::First),
    ("SET", Keys::First),
    ("SETNX", Keys::First),
    ("SETEX", Keys::First),
    ("GETSET", Keys::First),
    ("GETDEL", Keys::First),
    ("APPEND", Keys::First),
    ("STRLEN", Keys::First),
    ("INCR", Keys::First),
    ("INCRBY", Keys::First),
    ("DECR", Keys::First),
    ("DECRBY", Keys::First),
    ("EXPIRE", Keys::First),
    ("PEXPIRE", Keys::First),
    ("TTL", Keys::First),
    ("PTTL", Keys::First),
    ("PERSIST", Keys::First),
    ("TYPE", Keys::First),
    ("LPUSH", Keys::First),
    ("RPUSH", Keys::First),
    ("LPOP", Keys::First),
    ("RPOP", Keys::First),
    ("LLEN", Keys::First),
    ("LRANGE", Keys::First),
    ("LINDEX", Keys::First),
    ("HSET", Keys::First),
    ("HGET", Keys::First),
    ("HDEL", Keys::First),
    ("HGETALL", Keys::First),
    ("HINCRBY", Keys::First),
    ("SADD", Keys::First),
    ("SREM", Keys::First),
    ("SMEMBERS", Keys::First),
    ("SISMEMBER", Keys::First),
    ("ZADD", Keys::First),
    ("ZRANGE", Keys::First),
    ("ZSCORE", Keys::First),
    ("MGET", Keys::All),
    ("DEL", Keys::All),
    ("UNLINK", Keys::All),
    ("EXISTS", Keys::All),
    ("TOUCH", Keys::All),
    ("MSET", Keys::Pairs),
    ("MSETNX", Keys::Pairs),
];

/// The key `args` routes by: `Ok(None)` for a command that goes to any node (see
/// [`Keys`]), `CrossSlot` when a multi-key command's keys are in different slots (the
/// server would refuse it: no node serves them all).
pub(crate) fn command_key<'a>(args: &[&'a [u8]]) -> Result<Option<&'a [u8]>, ClusterError> {
    let Some((name, rest)) = args.split_first() else { return Ok(None) };
    let Some((_, keys)) = KEYS.iter().find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name)) else {
        return Ok(None);
    };
    let Some(&first) = rest.first() else { return Ok(None) }; // the server answers the arity error
    let others: Box<dyn Iterator<Item = &&[u8]>> = match keys {
        Keys::First => return Ok(Some(first)),
        Keys::All => Box::new(rest.iter().skip(1)),
        Keys::Pairs => Box::new(rest.iter().step_by(2).skip(1)),
    };
    let slot = key_slot(first);
    for key in others {
        let other = key_slot(key);
        if other != slot {
            let command = String::from_utf8_lossy(name).to_ascii_uppercase();
            return Err(ClusterError::CrossSlot { command, slots: (slot, other) });
        }
    }
    Ok(Some(first))
}

/// The slot `args` routes by, `None` for any node.
pub(super) fn command_slot(args: &[&[u8]]) -> Result<Option<u16>, ClusterError> {
    Ok(command_key(args)?.map(key_slot))
}
