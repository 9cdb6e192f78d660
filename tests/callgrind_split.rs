//! `tests/e2e/callgrind_split.py` splits a callgrind dump of the server by object: the
//! instruction table of `./runtest-rdma --bench` and every measurement that compares two
//! builds of the module (copied under names such as `librdma-base.so`) rest on it.

use std::path::Path;
use std::process::Command;

/// A dump in callgrind's format: two commands run (`processCommand` called twice), our
/// module under a build's own name, the C module, rdma-core, libc and the server.
const DUMP: &str = "\
version: 1
events: Ir
ob=(1) /usr/local/bin/valkey-server
fn=(1) call
cob=(1)
cfn=(2) processCommand
calls=2 0x10
0x10 5000
fn=(2)
0x20 1000
ob=(2) /tmp/run/librdma-base.so
fn=(3) rdma::transport::connection::run
0x30 300
fn=(4) rdma::transport::shared_cqs::poll
0x40 100
ob=(3) /build/valkey/src/valkey-rdma.so
fn=(5) rdmaRead
0x50 70
ob=(4) /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.56.0
fn=(6) ibv_poll_cq
0x60 40
ob=(5) /usr/lib/x86_64-linux-gnu/librxe-rdmav34.so
fn=(7) rxe_poll_cq
0x70 20
ob=(6) /usr/lib/x86_64-linux-gnu/libc.so.6
fn=(8) __memcpy_avx_unaligned_erms
0x80 8
fn=(9) __memmove_avx_unaligned_erms
0x90 4
fn=(10) __strcasecmp_avx2
0xa0 3
";

/// `callgrind_split.py` over `dump`: its JSON.
fn split(name: &str, dump: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("callgrind-split-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cg.out");
    std::fs::write(&path, dump).unwrap();
    let out = Command::new("python3")
        .arg(root.join("tests/e2e/callgrind_split.py"))
        .arg(&path)
        .output()
        .expect("python3 runs tests/e2e/callgrind_split.py");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "callgrind_split.py: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_dump_is_split_by_object_whatever_the_module_build_is_named() {
    let json = split("plain", DUMP);
    // (a fixed layout: json.dumps of {"requests", "ir": {group: Ir}, "copies": Ir, "module_top": [[fn, Ir]]})
    assert!(json.contains("\"requests\": 2"), "{json}");
    // the server's two functions (its call record is not a cost of its own)
    assert!(json.contains("\"valkey-server\": 1000"), "{json}");
    // librdma-base.so (300 + 100) and valkey-rdma.so (70) are both "the module"
    assert!(json.contains("\"module\": 470"), "{json}");
    assert!(json.contains("\"rdma-core\": 60"), "{json}");
    assert!(json.contains("\"libc\": 15"), "{json}");
    // libc's block copies apart (callgrind counts `rep movsb` per byte), and nothing else
    assert!(json.contains("\"copies\": 12"), "{json}");
    assert!(!json.contains("\"other\""), "nothing is left unclassified: {json}");
    assert!(json.contains("[\"rdma::transport::connection::run\", 300]"), "{json}");
}

/// A dump with costs per instruction (`--dump-instr=yes`: two position columns) and the
/// system-call events (`--collect-systime=yes`: sysCount and sysTime after Ir, left out
/// where zero), one command run and two completion events taken.
const DUMP_WITH_SYSCALLS: &str = "\
version: 1
positions: instr line
events: Ir sysCount sysTime
ob=(1) /usr/local/bin/valkey-server
fn=(1) call
cob=(1)
cfn=(2) processCommand
calls=1 0x10 7
0x10 7 5000 1 3
fn=(2)
0x20 8 1000
+4 * 200
ob=(2) /tmp/run/librdma.so
fn=(3) rdma::transport::shared_cqs::on_fd
0x30 9 300
cob=(3) /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.56.0
cfn=(4) ibv_get_cq_event
calls=2 0x40 10
0x30 9 60 2 9
ob=(3)
fn=(4)
0x40 10 40
cob=(4) /usr/lib/x86_64-linux-gnu/libc.so.6
cfn=(5) read
calls=2 0x50 11
0x40 10 20 2 9
ob=(4)
fn=(5)
0x50 11 20 2 9
";

#[test]
fn instructions_are_the_ir_column_whatever_else_the_dump_counts_and_completion_events_are_counted() {
    let json = split("syscalls", DUMP_WITH_SYSCALLS);
    assert!(json.contains("\"requests\": 1"), "{json}");
    // Ir only: neither a position nor sysCount or sysTime counted as instructions
    assert!(json.contains("\"valkey-server\": 1200"), "{json}");
    assert!(json.contains("\"module\": 300"), "{json}");
    assert!(json.contains("\"rdma-core\": 40"), "{json}");
    assert!(json.contains("\"libc\": 20"), "{json}");
    // each call of ibv_get_cq_event is one completion event taken
    assert!(json.contains("\"cq_events\": 2"), "{json}");
}
