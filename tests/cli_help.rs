//! The packaged client's help shows what an operator uses: no test peers (those live in
//! valkey-rdma-test-peer, which the package does not install).

use std::process::Command;

fn help(bin: &str) -> String {
    let out = Command::new(bin).arg("--help").output().expect("the binary runs");
    String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout)
}

#[test]
fn valkey_rdma_cli_help_lists_no_test_mode() {
    let text = help(env!("CARGO_BIN_EXE_valkey-rdma-cli"));
    assert!(text.contains("doctor"), "{text}");
    for test_mode in ["--hostile", "--probe", "short-control", "imm-overrun", "flood"] {
        assert!(!text.contains(test_mode), "valkey-rdma-cli --help mentions {test_mode}:\n{text}");
    }
}

#[test]
fn the_test_peer_lists_every_hostile_case() {
    let text = help(env!("CARGO_BIN_EXE_valkey-rdma-test-peer"));
    for (case, _) in rdma::client::hostile::CASES {
        assert!(text.contains(case), "{case} missing from:\n{text}");
    }
}

#[test]
fn the_package_installs_no_test_peer() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    assert!(manifest.contains("target/release/valkey-rdma-cli"));
    assert!(!manifest.contains("valkey-rdma-test-peer"), "Cargo.toml's deb assets name the test peer");
}

#[test]
fn valkey_cli_options_it_lacks_are_refused_by_name() {
    for opt in ["-s", "--tls", "--ldb", "--pipe"] {
        let out = Command::new(env!("CARGO_BIN_EXE_valkey-rdma-cli")).args([opt, "x", "PING"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opt}: {err}");
        assert!(err.contains(&format!("{opt} is not supported: ")), "{opt}: {err}");
    }
    let text = help(env!("CARGO_BIN_EXE_valkey-rdma-cli"));
    for opt in ["-a PASS", "--user U", "-n DB", "-r N", "-i SECS", "--rdma", "not supported"] {
        assert!(text.contains(opt), "{opt} missing from:\n{text}");
    }
}
