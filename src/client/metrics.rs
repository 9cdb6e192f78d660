//! `INFO rdma` in the Prometheus text format (`valkey-rdma-cli metrics`): monitoring stacks
//! built on redis_exporter drop INFO fields they do not know, so the module's own
//! fields reach a dashboard through this. Pure: INFO text in, exposition text out.

use std::fmt::Write;

/// Fields that are a level now (a gauge); every other numeric field only grows (a
/// counter, named with `_total`).
const GAUGES: &[&str] = &[
    "listeners",
    "listeners_down",
    "connected_clients",
    "handshakes_in_progress",
    "pending_connections",
    "releasing_connections",
    "rx_window_bytes",
    "rx_window_min_bytes",
    "rx_window_max_bytes",
    "peer_rx_window_min_bytes",
    "peer_rx_window_max_bytes",
    "completions_per_wakeup_x100",
    "shared_completion_queues",
    "completion_vectors_used",
    "completion_vectors_available",
    "buffer_chunks",
    "pinned_bytes",
    "pinned_registered_bytes",
    "pinned_ceiling_bytes",
];

/// The label each dictionary field's keys go under (`name:key=value,...` in INFO).
fn label_of(field: &str) -> &'static str {
    match field {
        "rejected_connections" => "reason",
        "protocol_violations" => "kind",
        "errors" => "kind",
        "cm_disconnects" => "kind",
        _ => "key",
    }
}

/// The metric name of an INFO rdma field (`rdma_connected_clients` →
/// `valkey_rdma_connected_clients`; counters end in `_total`).
fn metric_name(field: &str) -> (String, bool) {
    let gauge = GAUGES.contains(&field);
    let base = field.strip_prefix("total_").unwrap_or(field);
    let name = if gauge { format!("valkey_rdma_{base}") } else { format!("valkey_rdma_{base}_total") };
    (name, gauge)
}

/// Turns the text of `INFO rdma` into Prometheus metrics, one family per field, in
/// INFO's order. Lines that are not `rdma_NAME:VALUE` are skipped.
pub fn from_info(info: &str) -> String {
    let mut out = String::new();
    for line in info.lines().map(str::trim_end) {
        let Some((name, value)) = line.strip_prefix("rdma_").and_then(|l| l.split_once(':')) else { continue };
        let (metric, gauge) = metric_name(name);
        let kind = if gauge { "gauge" } else { "counter" };
        if let Ok(n) = value.parse::<u64>() {
            let _ = writeln!(out, "# TYPE {metric} {kind}\n{metric} {n}");
        } else if value.contains('=') {
            let label = label_of(name);
            let pairs: Vec<(&str, u64)> = value
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# TYPE {metric} {kind}");
            for (k, v) in pairs {
                let _ = writeln!(out, "{metric}{{{label}=\"{k}\"}} {v}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_become_gauges_counters_and_labelled_families() {
        let info = "# rdma\r\nrdma_listeners:1\r\nrdma_connected_clients:3\r\nrdma_total_connections_received:17\r\n\
                    rdma_rejected_connections:resources=1,accept=0,migrate=0,handshakes=2\r\n\
                    rdma_keepalives_sent:9\r\nrdma_pinned_ceiling_bytes:1048576\r\nnot a field\r\n";
        let m = from_info(info);
        let want = "# TYPE valkey_rdma_listeners gauge\nvalkey_rdma_listeners 1\n\
                    # TYPE valkey_rdma_connected_clients gauge\nvalkey_rdma_connected_clients 3\n\
                    # TYPE valkey_rdma_connections_received_total counter\nvalkey_rdma_connections_received_total 17\n\
                    # TYPE valkey_rdma_rejected_connections_total counter\n\
                    valkey_rdma_rejected_connections_total{reason=\"resources\"} 1\n\
                    valkey_rdma_rejected_connections_total{reason=\"accept\"} 0\n\
                    valkey_rdma_rejected_connections_total{reason=\"migrate\"} 0\n\
                    valkey_rdma_rejected_connections_total{reason=\"handshakes\"} 2\n\
                    # TYPE valkey_rdma_keepalives_sent_total counter\nvalkey_rdma_keepalives_sent_total 9\n\
                    # TYPE valkey_rdma_pinned_ceiling_bytes gauge\nvalkey_rdma_pinned_ceiling_bytes 1048576\n";
        assert_eq!(m, want);
    }

    #[test]
    fn every_gauge_is_a_field_of_info_rdma() {
        use crate::server::api::InfoField;
        let now = crate::transport::stats::Now {
            listeners: (0, 0),
            connected: 0,
            pending: 0,
            pinned_bytes: 0,
            rx_size: 0,
            peer_windows: None,
            rx_windows: None,
            shared_cqs: 0,
            vectors: (0, 0),
            traffic: Default::default(),
            polls: Default::default(),
        };
        let fields: Vec<&str> = crate::transport::stats::fields(&now)
            .iter()
            .map(|f| match f {
                InfoField::Num(n, _) | InfoField::Dict(n, _) => *n,
            })
            .collect();
        for g in GAUGES {
            assert!(fields.contains(g), "{g} is not an INFO rdma field");
        }
    }
}
