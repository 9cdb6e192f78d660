//! Shared by the host tests: where the test bed's reference builds are.

use std::path::PathBuf;

/// `$VALKEY_RDMA_TESTBED/<name>` if `marker` exists in it. Under `./runtest-rdma`
/// (RUNTEST_RDMA set) a missing tree is a failure; a bare `cargo test` skips, saying so.
pub fn reference(name: &str, marker: &str) -> Option<PathBuf> {
    let bed = std::env::var_os("VALKEY_RDMA_TESTBED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/valkey-rdma-testbed"));
    let t = bed.join(name);
    if t.join(marker).exists() {
        Some(t)
    } else if std::env::var_os("RUNTEST_RDMA").is_some() {
        panic!("the test bed has no {} (testbed/build-reference.sh makes it)", t.join(marker).display());
    } else {
        eprintln!("skipped: no {} (./runtest-rdma builds the test bed)", t.join(marker).display());
        None
    }
}
