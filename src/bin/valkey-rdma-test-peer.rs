//! valkey-rdma-test-peer: the peers of the robustness tests, kept out of the packaged
//! tools (the test bed runs it from the build tree).
//!
//!   valkey-rdma-test-peer [-h HOST] [-p PORT] --hostile CASE [--hold SECS]
//!   valkey-rdma-test-peer [-h HOST] [-p PORT] --probe SECS   (features, keepalives)

use std::time::Duration;

use rdma::client::{hostile, Client, Options};

fn usage() -> ! {
    eprintln!("usage: valkey-rdma-test-peer [-h HOST] [-p PORT] --hostile CASE [--hold SECS]");
    eprintln!("       valkey-rdma-test-peer [-h HOST] [-p PORT] --probe SECS");
    eprintln!("  --probe SECS  ask GetServerFeature, send SetClientFeature 0, count Keepalives for SECS, PING");
    eprintln!("hostile cases (each prints its outcome: ClosedByServer, StillOpen, ...):");
    for (name, what) in hostile::CASES {
        eprintln!("  {name:22} {what}");
    }
    std::process::exit(2)
}

fn main() {
    let (mut host, mut port) = ("127.0.0.1".to_string(), 6379u16);
    let (mut hostile_case, mut hold, mut probe) = (None, 5u64, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "-h" => host = value(),
            "-p" => port = value().parse().unwrap_or_else(|_| usage()),
            "--hostile" => hostile_case = Some(value()),
            "--hold" => hold = value().parse().unwrap_or_else(|_| usage()),
            "--probe" => probe = Some(value().parse::<f64>().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    let addr = format!("{host}:{port}");
    match (hostile_case, probe) {
        (Some(case), None) => match hostile::run(&case, &addr, Duration::from_secs(hold)) {
            Ok(outcome) => println!("{outcome:?}"),
            Err(e) => {
                eprintln!("hostile {case}: {e}");
                std::process::exit(1)
            }
        },
        (None, Some(secs)) => run_probe(&addr, Duration::from_secs_f64(secs)),
        _ => usage(),
    }
}

/// The control-message side of a server: what it answers to GetServerFeature, whether
/// it accepts SetClientFeature 0, how many Keepalives arrive in `wait`, and the address
/// its RegisterXferMemory named.
fn run_probe(addr: &str, wait: Duration) {
    let fail = |e: rdma::client::ClientError| -> ! {
        eprintln!("probe {addr}: {e}");
        std::process::exit(1)
    };
    let mut c = Client::connect(addr, Options::default()).unwrap_or_else(|e| fail(e));
    let features = c.stream().server_features().unwrap_or_else(|e| fail(e));
    c.stream().set_client_features(0).unwrap_or_else(|e| fail(e));
    c.stream().settle(wait).unwrap_or_else(|e| fail(e));
    let keepalives = c.stream().keepalives;
    let window = c.stream().peer_window_addr();
    let ping = c.command(&[b"PING"]).unwrap_or_else(|e| fail(e));
    println!("features={features} keepalives={keepalives} window={window:#x} ping={ping:?}");
}
