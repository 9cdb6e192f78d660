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
#[cfg(feature = "test-hooks")]
fn the_test_peer_lists_every_hostile_case() {
    let text = help(env!("CARGO_BIN_EXE_valkey-rdma-test-peer"));
    for (case, _) in rdma::client::hostile::CASES {
        assert!(text.contains(case), "{case} missing from:\n{text}");
    }
}

#[test]
fn the_package_installs_no_test_peer() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    // the packages' sections: [package.metadata.deb] and [package.metadata.generate-rpm…]
    let packaging: String =
        manifest.split("\n[").filter(|section| section.starts_with("package.metadata")).collect::<Vec<_>>().join("\n[");
    assert!(packaging.contains("target/release/valkey-rdma-cli"), "{packaging}");
    assert!(!packaging.contains("valkey-rdma-test-peer"), "the packages' assets name the test peer");
    // and the test peer is built only with the test bed's feature
    assert!(manifest.contains("name = \"valkey-rdma-test-peer\"\nrequired-features = [\"test-hooks\"]"));
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
