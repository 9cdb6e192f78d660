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

#[test]
fn a_dump_is_split_by_object_whatever_the_module_build_is_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("callgrind-split-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("cg.out");
    std::fs::write(&dump, DUMP).unwrap();
    let out = Command::new("python3")
        .arg(root.join("tests/e2e/callgrind_split.py"))
        .arg(&dump)
        .output()
        .expect("python3 runs tests/e2e/callgrind_split.py");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "callgrind_split.py: {}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
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
