//! valkey-rdma-bench: load generator for Valkey over RDMA (and TCP), and the
//! side-by-side comparison of our module with the upstream C module.
//!
//!   valkey-rdma-bench [-h HOST] [-p PORT] [--tcp] [-c CONNS] [-P PIPELINE] [-t set,get]
//!                     [-d BYTES] [-n REQUESTS] [--duration SECS] [-r KEYSPACE] [--warmup PIPELINES]
//!                     [--server-pid PID] [--json FILE] [--latency-trace PREFIX] [--rx-size BYTES] [-q]
//!   valkey-rdma-bench --compare --server BIN --c-module SO --our-module SO [--rounds N]
//!                     [-h HOST] [-p PORT] [workload options] [--json FILE] [--svg FILE]
//!   valkey-rdma-bench --cluster [-h SEED_HOST] [-p SEED_PORT] [--duration SECS] [-r KEYS]
//!                     [--wait MS] [--tries N] [--stop-file F]   (a checked writer/reader on a cluster)
//!   valkey-rdma-bench --idle N [-h HOST] [-p PORT] [--rx-size BYTES] [--in-flight K]
//!                     [--hold SECS] [--stop-file F] [--timeout SECS]  (N idle connections, PINGed twice)
//!
//! `--warmup N`: each connection sends N pipelines before the clock and the server CPU
//! count start. A connection's first use (connect + first pipeline) is reported apart
//! ("first use"), so that the cost the C module pays at connect and ours at first use
//! are both shown.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdma::client::bench::{self, Stats, Transport, Workload};

struct Args {
    w: Workload,
    server_pid: Option<u32>,
    json: Option<String>,
    svg: Option<String>,
    /// `--latency-trace PREFIX`: every timed pipeline to PREFIX.tsv (with `--compare`,
    /// PREFIX-ROUND-ours.tsv and PREFIX-ROUND-c.tsv), one line each (`bench::Sample`).
    latency_trace: Option<String>,
    quiet: bool,
    compare: bool,
    server: String,
    c_module: String,
    our_module: String,
    rounds: usize,
    cluster: bool,
    wait_ms: Option<u64>,
    tries: u32,
    /// `--cluster` stops when this file appears (a test stops it after a change);
    /// `--idle` holds its connections until it appears.
    stop_file: Option<String>,
    /// `--idle N`: open N idle connections (`rdma::client::idle`).
    idle: Option<usize>,
    idle_opts: rdma::client::idle::IdleOptions,
    hold: Duration,
}

fn usage() -> ! {
    eprintln!(
        "{}",
        include_str!("valkey-rdma-bench.rs")
            .lines()
            .skip(3)
            .take(14)
            .map(|l| l.trim_start_matches("//!"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        w: Workload {
            addr: String::new(),
            transport: Transport::Rdma,
            connections: 8,
            pipeline: 1,
            commands: vec!["set".into(), "get".into()],
            value_size: 64,
            requests: 100_000,
            duration: Duration::from_secs(3600),
            keyspace: 10_000,
            rx_size: rdma::client::Options::default().rx_size,
            warmup: 0,
        },
        server_pid: None,
        json: None,
        svg: None,
        latency_trace: None,
        quiet: false,
        compare: false,
        server: String::new(),
        c_module: String::new(),
        our_module: String::new(),
        rounds: 3,
        cluster: false,
        wait_ms: None,
        tries: 5,
        stop_file: None,
        idle: None,
        idle_opts: Default::default(),
        hold: Duration::from_secs(5),
    };
    let (mut host, mut port) = ("127.0.0.1".to_string(), 6379u16);
    let mut it = std::env::args().skip(1);
    let val = |it: &mut dyn Iterator<Item = String>| it.next().unwrap_or_else(|| usage());
    while let Some(o) = it.next() {
        let num = |s: String| s.parse::<u64>().unwrap_or_else(|_| usage());
        match o.as_str() {
            "-h" => host = val(&mut it),
            "-p" => port = num(val(&mut it)) as u16,
            "--tcp" => a.w.transport = Transport::Tcp,
            "-c" => a.w.connections = num(val(&mut it)).max(1) as usize,
            "-P" => a.w.pipeline = num(val(&mut it)).max(1) as usize,
            "-t" => a.w.commands = val(&mut it).split(',').map(|s| s.trim().to_lowercase()).collect(),
            "-d" => a.w.value_size = num(val(&mut it)) as usize,
            "-n" => a.w.requests = num(val(&mut it)),
            "-r" => a.w.keyspace = num(val(&mut it)),
            "--warmup" => a.w.warmup = num(val(&mut it)),
            "--duration" => a.w.duration = Duration::from_secs(num(val(&mut it))),
            "--server-pid" => a.server_pid = Some(num(val(&mut it)) as u32),
            "--json" => a.json = Some(val(&mut it)),
            "--svg" => a.svg = Some(val(&mut it)),
            "--latency-trace" => a.latency_trace = Some(val(&mut it)),
            "-q" => a.quiet = true,
            "--compare" => a.compare = true,
            "--server" => a.server = val(&mut it),
            "--c-module" => a.c_module = val(&mut it),
            "--our-module" => a.our_module = val(&mut it),
            "--rounds" => a.rounds = num(val(&mut it)).max(1) as usize,
            "--cluster" => a.cluster = true,
            "--wait" => a.wait_ms = Some(num(val(&mut it))),
            "--tries" => a.tries = num(val(&mut it)).max(1) as u32,
            "--stop-file" => a.stop_file = Some(val(&mut it)),
            "--idle" => a.idle = Some(num(val(&mut it)) as usize),
            "--rx-size" => {
                a.w.rx_size = num(val(&mut it)).clamp(4096, u32::MAX as u64) as u32;
                a.idle_opts.rx_size = a.w.rx_size;
            }
            "--in-flight" => a.idle_opts.in_flight = num(val(&mut it)).max(1) as usize,
            "--hold" => a.hold = Duration::from_secs(num(val(&mut it))),
            "--timeout" => a.idle_opts.timeout = Duration::from_secs(num(val(&mut it)).max(1)),
            _ => usage(),
        }
    }
    a.w.addr = format!("{host}:{port}");
    a
}

fn progress(quiet: bool) -> impl FnMut(u64, f64) {
    move |done, secs| {
        if !quiet {
            eprint!("\r{done} requests, {:.0} req/s   ", done as f64 / secs.max(1e-9));
        }
    }
}

fn print_stats(label: &str, s: &Stats) {
    println!(
        "{label:>22}: {:>10.1} req/s  p50 {:>7.0} us  p99 {:>7.0} us  p99.9 {:>7.0} us  server CPU {} s/Mreq{}",
        s.rps,
        s.p50_us,
        s.p99_us,
        s.p999_us,
        s.server_cpu_s_per_mreq.map_or("?".into(), |v| format!("{v:.2}")),
        if s.errors > 0 { format!("  ERRORS {}", s.errors) } else { String::new() }
    );
}

/// A server started for the comparison; killed on drop.
struct Server(Child, u32);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.1 as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn start_server(a: &Args, module: &str, host: &str, port: u16, dir: &str) -> Server {
    std::fs::create_dir_all(dir).unwrap();
    let child = Command::new(&a.server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            host,
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--dir",
            dir,
        ])
        .args([
            "--logfile",
            &format!("{dir}/server.log"),
            "--loadmodule",
            module,
            "--rdma-bind",
            host,
            "--rdma-port",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", a.server));
    let pid = child.id();
    let s = Server(child, pid);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let mut b = [0u8; 16];
            if c.write_all(b"PING\r\n").is_ok() && c.read(&mut b).is_ok_and(|n| b[..n].starts_with(b"+PONG")) {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("server with {module} did not come up; see {dir}/server.log");
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Server memory per idle RDMA connection: RSS with 50 connections open minus before.
fn kib_per_connection(w: &Workload, pid: u32) -> f64 {
    let before = rss_kib(pid);
    let conns: Vec<_> = (0..50).filter_map(|_| bench::connect(w).ok()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_kib(pid);
    let n = conns.len().max(1);
    drop(conns);
    after.saturating_sub(before) as f64 / n as f64
}

/// `--latency-trace`: the run's pipelines, one per line, to PREFIX{suffix}.tsv.
fn write_trace(a: &Args, suffix: &str, s: &Stats) {
    let Some(prefix) = &a.latency_trace else { return };
    let mut text = String::from(bench::Sample::TSV_HEADER);
    text.push('\n');
    for sample in &s.samples {
        text.push_str(&sample.tsv());
        text.push('\n');
    }
    let path = format!("{prefix}{suffix}.tsv");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("--latency-trace: cannot write {path}: {e}"));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn compare(a: &Args) {
    let (host, port) = a.w.addr.rsplit_once(':').map(|(h, p)| (h.to_string(), p.parse::<u16>().unwrap())).unwrap();
    let impls = [("C module", a.c_module.as_str()), ("ours", a.our_module.as_str())];
    // (label, round, stats, KiB per connection)
    let mut results: Vec<(String, usize, Stats, f64)> = Vec::new();
    let mut json = Vec::new();
    for round in 1..=a.rounds {
        // ABBA: the module that runs second in one round runs first in the next, so a
        // drift of the machine over the run (warming, throttling) favours neither
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for i in order {
            let (label, module) = impls[i];
            let p = port + (round * 2 + i) as u16;
            let dir = std::env::temp_dir().join(format!("rdma-bench-{}-{round}-{i}", std::process::id()));
            let srv = start_server(a, module, &host, p, &dir.display().to_string());
            let w = Workload { addr: format!("{host}:{p}"), ..a.w.clone() };
            let stats = bench::run(&w, Some(srv.1), progress(a.quiet)).unwrap_or_else(|e| panic!("{label}: {e}"));
            let mem = kib_per_connection(&w, srv.1);
            write_trace(a, &format!("-{round}-{}", if i == 0 { "c" } else { "ours" }), &stats);
            eprint!("\r");
            print_stats(&format!("round {round} {label}"), &stats);
            json.push(format!(
                "{{\"round\":{round},\"kib_per_connection\":{mem:.1},\"stats\":{}}}",
                stats.to_json(label)
            ));
            results.push((label.to_string(), round, stats, mem));
            if round == 1 && i == 1 {
                let w = Workload { transport: Transport::Tcp, ..w };
                let tcp = bench::run(&w, Some(srv.1), progress(a.quiet)).unwrap_or_else(|e| panic!("TCP: {e}"));
                eprint!("\r");
                print_stats("TCP (same server)", &tcp);
                json.push(format!("{{\"round\":{round},\"stats\":{}}}", tcp.to_json("TCP")));
                results.push(("TCP".into(), round, tcp, 0.0));
            }
        }
    }
    let pick = |label: &str, f: &dyn Fn(&Stats, f64) -> f64| {
        median(results.iter().filter(|r| r.0 == label).map(|r| f(&r.2, r.3)).collect())
    };
    // the ratio of each round on its own: their spread is the noise beside the median
    let round_ratios = |f: &dyn Fn(&Stats, f64) -> f64| -> Vec<f64> {
        (1..=a.rounds)
            .filter_map(|round| {
                let of = |label: &str| results.iter().find(|r| r.0 == label && r.1 == round).map(|r| f(&r.2, r.3));
                match (of("C module"), of("ours")) {
                    (Some(c), Some(o)) if c > 0.0 => Some(o / c),
                    _ => None,
                }
            })
            .collect()
    };
    type Metric<'a> = (&'a str, &'a dyn Fn(&Stats, f64) -> f64, &'a str);
    let metrics: [Metric; 6] = [
        ("requests/s", &|s, _| s.rps, "higher is better"),
        ("p50 latency us", &|s, _| s.p50_us, "lower is better"),
        ("p99 latency us", &|s, _| s.p99_us, "lower is better"),
        ("server CPU s per Mreq", &|s, _| s.server_cpu_s_per_mreq.unwrap_or(0.0), "lower is better"),
        ("server KiB per connection", &|_, m| m, "lower is better"),
        ("first use us (connect+1st)", &|s, _| s.first_use_us, "lower is better"),
    ];
    println!(
        "\nmedians over {} rounds, {} connections, pipeline {}, {:?}, {} B values",
        a.rounds, a.w.connections, a.w.pipeline, a.w.commands, a.w.value_size
    );
    println!(
        "{:>26} {:>12} {:>12} {:>10} {:>15} {:>12}",
        "metric", "C module", "ours", "ours/C", "rounds min-max", "TCP"
    );
    let mut ratios = Vec::new();
    for (name, f, better) in metrics {
        let (c, o) = (pick("C module", f), pick("ours", f));
        let ratio = if c > 0.0 { o / c } else { 0.0 };
        let tcp = if name.contains("KiB") { "-".to_string() } else { format!("{:.1}", pick("TCP", f)) };
        let per_round = round_ratios(f);
        let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = per_round.iter().copied().fold(0.0, f64::max);
        let spread = if per_round.is_empty() { "-".to_string() } else { format!("{lo:.3}-{hi:.3}") };
        println!("{name:>26} {c:>12.1} {o:>12.1} {ratio:>10.3} {spread:>15} {tcp:>12}   ({better})");
        ratios.push(format!("\"{name}\":{ratio:.4}"));
        ratios.push(format!(
            "\"{name} per round\":[{}]",
            per_round.iter().map(|r| format!("{r:.4}")).collect::<Vec<_>>().join(",")
        ));
    }
    if let Some(path) = &a.json {
        std::fs::write(
            path,
            format!("{{\"runs\":[{}],\"ratios_ours_over_c\":{{{}}}}}\n", json.join(","), ratios.join(",")),
        )
        .unwrap();
    }
    if let Some(path) = &a.svg {
        let bars: Vec<(String, f64)> =
            ["C module", "ours", "TCP"].iter().map(|l| (format!("{l} (median)"), pick(l, &|s, _| s.rps))).collect();
        std::fs::write(
            path,
            bench::svg_bars(
                &format!("{:?} requests/s, {} conns, -P {}", a.w.commands, a.w.connections, a.w.pipeline),
                "req/s",
                &bars,
            ),
        )
        .unwrap();
    }
}

fn main() {
    let a = parse_args();
    if a.compare {
        if a.server.is_empty() || a.c_module.is_empty() || a.our_module.is_empty() {
            usage();
        }
        return compare(&a);
    }
    if a.cluster {
        return cluster_check(&a);
    }
    if let Some(n) = a.idle {
        return idle(&a, n);
    }
    let stats = bench::run(&a.w, a.server_pid, progress(a.quiet)).unwrap_or_else(|e| {
        eprintln!("valkey-rdma-bench: {e}");
        std::process::exit(1)
    });
    if !a.quiet {
        eprintln!();
    }
    print_stats(if a.w.transport == Transport::Rdma { "RDMA" } else { "TCP" }, &stats);
    write_trace(&a, "", &stats);
    if let Some(path) = &a.json {
        std::fs::write(path, stats.to_json("run") + "\n").unwrap();
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, bench::svg_bars("requests/s", "req/s", &[("run".into(), stats.rps)])).unwrap();
    }
    if stats.errors > 0 {
        std::process::exit(1);
    }
}

/// `--cluster`: the checked writer/reader of `rdma::client::cluster_check` against the
/// cluster seeded by `-h`/`-p`, for `--duration` seconds or `-n` writes, whichever ends
/// first. Prints the report and what the client did to follow the cluster.
fn cluster_check(a: &Args) {
    use rdma::client::cluster::ClusterClient;
    use rdma::client::cluster_check::{self, Check};
    let mut client: ClusterClient = ClusterClient::connect(std::slice::from_ref(&a.w.addr), Default::default())
        .unwrap_or_else(|e| {
            eprintln!("valkey-rdma-bench: {e}");
            std::process::exit(1)
        });
    client.retry.tries = a.tries;
    let check = Check { keys: a.w.keyspace.max(1), wait_ms: a.wait_ms, read_every: 10 };
    let until = Instant::now() + a.w.duration;
    let mut writes = 0u64;
    let report = cluster_check::run(&mut client, &check, || {
        writes += 1;
        writes > a.w.requests
            || Instant::now() >= until
            || a.stop_file.as_ref().is_some_and(|f| std::path::Path::new(f).exists())
    });
    println!("cluster: {report}");
    let s = &client.stats;
    println!("cluster client: moved {} ask {} reconnects {} refreshes {}", s.moved, s.ask, s.reconnects, s.refreshes);
}

/// `--idle N`: N connections, each PINGed once, held (at least `--hold`, then until
/// `--stop-file` exists), then all PINGed again. One `idle:` line per step, for
/// scripts; exit status 0 only when all N answered both PINGs.
fn idle(a: &Args, n: usize) {
    use rdma::client::idle::IdlePool;
    use std::io::Write;
    let quiet = a.quiet;
    let die = |e: rdma::client::ClientError| -> ! {
        eprintln!("valkey-rdma-bench: {e}");
        std::process::exit(1)
    };
    let mut pool = IdlePool::new(&a.w.addr, a.idle_opts.clone()).unwrap_or_else(|e| die(e));
    println!(
        "idle: opening {n} connections to {} (RX buffer {} bytes, queues {}/{}, {} in flight)",
        a.w.addr, a.idle_opts.rx_size, a.idle_opts.depths.send, a.idle_opts.depths.recv, a.idle_opts.in_flight
    );
    let t0 = Instant::now();
    let held = pool
        .open(n, |held, failed| {
            if !quiet {
                eprintln!("idle: {held} held, {failed} failed, {:.0} s", t0.elapsed().as_secs_f64());
            }
        })
        .unwrap_or_else(|e| die(e));
    let open_s = t0.elapsed().as_secs_f64();
    println!(
        "idle: connected and answered PING: {held} of {n} in {open_s:.1} s ({:.0} connections/s), {} shared CQs",
        held as f64 / open_s.max(1e-9),
        pool.cq_count()
    );
    if let Some((conn, reason)) = &pool.failures.first {
        println!("idle: first failure at connection {conn}: {reason}");
        println!("idle: failures: {}", pool.failures.summary());
    }
    println!("idle: holding {held} connections");
    let _ = std::io::stdout().flush();
    pool.hold(a.hold, a.stop_file.as_deref().map(std::path::Path::new)).unwrap_or_else(|e| die(e));
    let before = pool.idle();
    let t1 = Instant::now();
    let answered = pool.ping_all().unwrap_or_else(|e| die(e));
    println!(
        "idle: second PING answered by {answered} of {before} held ({} lost while held) in {:.1} s",
        pool.lost,
        t1.elapsed().as_secs_f64()
    );
    if pool.failures.total() > 0 {
        println!("idle: failures: {}", pool.failures.summary());
    }
    let ok = answered == n;
    println!("idle: {} {answered} of {n}", if ok { "OK" } else { "FAILED" });
    let _ = std::io::stdout().flush();
    let t2 = Instant::now();
    drop(pool);
    println!("idle: closed in {:.1} s", t2.elapsed().as_secs_f64());
    std::process::exit(if ok { 0 } else { 1 });
}
