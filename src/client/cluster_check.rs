//! A cluster workload that checks what it reads (`valkey-rdma-bench --cluster`): one
//! writer goes round a key space writing increasing sequence numbers, optionally asks
//! `WAIT 1` after each write (a replica confirmed it), reads keys back as it goes, and
//! at the end reads every key once more. Run while the cluster changes (a resharding, a
//! failover), it tells what the change cost: the errors the client saw by kind, reads of
//! a value older than the last acknowledged write, acknowledged writes lost, and of
//! those the ones a replica had confirmed (which must be none).
//!
//! The bookkeeping ([`Ledger`]) is pure and unit-tested; [`run`] drives a
//! [`ClusterClient`].

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::cluster::{ClusterClient, ClusterError, NodeConn};
use super::Reply;

/// What one key went through.
#[derive(Debug, Default, Clone)]
struct KeyState {
    /// The last write answered OK.
    acked: Option<u64>,
    /// The last write a replica confirmed (`WAIT 1` answered 1 or more).
    confirmed: Option<u64>,
    /// Writes after `acked` whose reply was an error or never came: they may or may
    /// not have been applied, so reading them back is no error.
    unknown: Vec<u64>,
}

/// How a value read back compares with what was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    /// The last acknowledged write, or a later one whose reply was lost.
    Current,
    /// Nothing, or an older value: an acknowledged write is gone.
    Lost {
        /// The lost write had been confirmed by a replica.
        confirmed: bool,
    },
    /// A key never written successfully: nothing to check.
    Unchecked,
}

/// The writes made and what they became (pure).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    keys: HashMap<u64, KeyState>,
}

impl Ledger {
    pub(crate) fn written(&mut self, key: u64, seq: u64, acked: bool) {
        let k = self.keys.entry(key).or_default();
        if acked {
            k.acked = Some(seq);
            k.unknown.clear();
        } else {
            k.unknown.push(seq);
        }
    }

    pub(crate) fn confirmed(&mut self, key: u64, seq: u64) {
        let k = self.keys.entry(key).or_default();
        if k.acked == Some(seq) {
            k.confirmed = Some(seq);
        }
    }

    /// `value`: the sequence number read back, `None` for a missing key.
    pub(crate) fn check(&self, key: u64, value: Option<u64>) -> ReadOutcome {
        let Some(k) = self.keys.get(&key) else { return ReadOutcome::Unchecked };
        let Some(acked) = k.acked else { return ReadOutcome::Unchecked };
        match value {
            Some(v) if v == acked || k.unknown.contains(&v) => ReadOutcome::Current,
            _ => ReadOutcome::Lost { confirmed: k.confirmed.is_some_and(|c| value.is_none_or(|v| v < c)) },
        }
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.keys().copied()
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Check {
    /// Keys `check:{0..keys}`, spread over every slot by their names.
    pub keys: u64,
    /// Ask `WAIT 1 <ms>` after every write.
    pub wait_ms: Option<u64>,
    /// Read a key back after every this many writes.
    pub read_every: u64,
}

/// What happened.
#[derive(Debug, Default)]
pub struct Report {
    pub writes: u64,
    pub acked: u64,
    pub confirmed: u64,
    pub reads: u64,
    /// Reads during the run that returned an older value than the last acknowledged.
    pub stale_reads: u64,
    /// At the end: keys whose last acknowledged write is gone.
    pub lost_acked: u64,
    /// Of those, keys whose lost write a replica had confirmed.
    pub lost_confirmed: u64,
    /// Keys checked at the end.
    pub verified: u64,
    /// Errors the client saw, by kind (a server error's first word, or the client error).
    pub errors: BTreeMap<String, u64>,
    pub secs: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let errors: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(
            f,
            "writes {} acked {} confirmed {} ({:.0} writes/s); reads {} stale {}; verified {} keys: lost {} (confirmed {}); errors {}",
            self.writes,
            self.acked,
            self.confirmed,
            self.writes as f64 / self.secs.max(1e-9),
            self.reads,
            self.stale_reads,
            self.verified,
            self.lost_acked,
            self.lost_confirmed,
            if errors.is_empty() { "none".into() } else { errors.join(",") }
        )
    }
}

fn key_name(k: u64) -> String {
    format!("check:{k}")
}

fn error_kind(e: &ClusterError) -> String {
    match e {
        ClusterError::Node { error, .. } => format!("node:{}", error.to_string().split(':').next().unwrap_or("?")),
        ClusterError::TooManyRedirections(_) => "too_many_redirections".into(),
        ClusterError::NoNodeAnswered(_) => "no_node_answered".into(),
        other => format!("{other}").split_whitespace().next().unwrap_or("?").to_string(),
    }
}

fn seq_of(reply: &Reply) -> Option<u64> {
    match reply {
        Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// Runs the check until `stop` says so, then verifies every key once.
pub fn run<C: NodeConn>(client: &mut ClusterClient<C>, check: &Check, mut stop: impl FnMut() -> bool) -> Report {
    let started = Instant::now();
    let mut ledger = Ledger::default();
    let mut report = Report::default();
    let count_error = |report: &mut Report, kind: String| *report.errors.entry(kind).or_insert(0) += 1;
    let mut seq = 0u64;
    while !stop() {
        seq += 1;
        let key = seq % check.keys;
        let name = key_name(key);
        let value = seq.to_string();
        report.writes += 1;
        let ok = match client.command(&[b"SET", name.as_bytes(), value.as_bytes()]) {
            Ok(Reply::Status(s)) if s == "OK" => true,
            Ok(Reply::Error(e)) => {
                count_error(&mut report, e.split_whitespace().next().unwrap_or("ERR").to_string());
                false
            }
            Ok(_) => false,
            Err(e) => {
                count_error(&mut report, error_kind(&e));
                false
            }
        };
        ledger.written(key, seq, ok);
        if ok {
            report.acked += 1;
            if let Some(ms) = check.wait_ms {
                let ms = ms.to_string();
                // WAIT has no key: routed by the key just written, to the node that took it
                match client.command_routed(name.as_bytes(), &[b"WAIT", b"1", ms.as_bytes()]) {
                    Ok(Reply::Integer(n)) if n >= 1 => {
                        ledger.confirmed(key, seq);
                        report.confirmed += 1;
                    }
                    Ok(_) => {}
                    Err(e) => count_error(&mut report, error_kind(&e)),
                }
            }
        }
        if check.read_every > 0 && seq.is_multiple_of(check.read_every) {
            let back = (seq / check.read_every * 7919) % check.keys;
            report.reads += 1;
            match client.command(&[b"GET", key_name(back).as_bytes()]) {
                Ok(r) => {
                    if let ReadOutcome::Lost { .. } = ledger.check(back, seq_of(&r)) {
                        report.stale_reads += 1;
                    }
                }
                Err(e) => count_error(&mut report, error_kind(&e)),
            }
        }
    }
    report.secs = started.elapsed().as_secs_f64();
    let mut keys: Vec<u64> = ledger.keys().collect();
    keys.sort_unstable();
    for key in keys {
        match client.command(&[b"GET", key_name(key).as_bytes()]) {
            Ok(r) => match ledger.check(key, seq_of(&r)) {
                ReadOutcome::Lost { confirmed } => {
                    report.lost_acked += 1;
                    report.lost_confirmed += u64::from(confirmed);
                    report.verified += 1;
                }
                ReadOutcome::Current => report.verified += 1,
                ReadOutcome::Unchecked => {}
            },
            Err(e) => count_error(&mut report, format!("verify:{}", error_kind(&e))),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_acknowledged_write_or_a_later_unknown_one_is_current() {
        let mut l = Ledger::default();
        l.written(1, 10, true);
        assert_eq!(l.check(1, Some(10)), ReadOutcome::Current);
        l.written(1, 20, false); // its reply was lost: maybe applied
        assert_eq!(l.check(1, Some(20)), ReadOutcome::Current);
        assert_eq!(l.check(1, Some(10)), ReadOutcome::Current);
        l.written(1, 30, true);
        assert_eq!(l.check(1, Some(20)), ReadOutcome::Lost { confirmed: false }, "older than the last acked");
        assert_eq!(l.check(2, None), ReadOutcome::Unchecked, "never written");
    }

    #[test]
    fn a_lost_write_counts_as_confirmed_only_if_a_replica_had_confirmed_it() {
        let mut l = Ledger::default();
        l.written(1, 10, true);
        l.confirmed(1, 10);
        l.written(1, 20, true); // acked, not confirmed
        assert_eq!(l.check(1, Some(10)), ReadOutcome::Lost { confirmed: false }, "only the unconfirmed 20 is gone");
        assert_eq!(l.check(1, Some(5)), ReadOutcome::Lost { confirmed: true }, "the confirmed 10 is gone too");
        assert_eq!(l.check(1, None), ReadOutcome::Lost { confirmed: true });
        l.confirmed(1, 10); // a confirmation of an older write changes nothing
        assert_eq!(l.check(1, Some(20)), ReadOutcome::Current);
    }
}
