//! valkey-rdma-cli: send one command to a Valkey server over RDMA and print the reply
//! as valkey-cli does.
//!
//!   valkey-rdma-cli [-h HOST] [-p PORT] [-a PASS] [--user U] [-n DB] [-r N] [-i SECS] [-c] [-t SECS]
//!                   [-x] [--raw|--no-raw] COMMAND [ARG...]
//!   valkey-rdma-cli [connection options] --pipeline < COMMANDS
//!   valkey-rdma-cli [connection options] metrics [--listen ADDR:PORT]
//!
//! The options valkey-cli also has mean what they mean there; `--rdma` is accepted and
//! implied (every connection is RDMA). Options of valkey-cli this tool does not have are
//! refused by name (`UNSUPPORTED`).
//!   valkey-rdma-cli doctor [--bind ADDR]... [--clients N] [--rx-size BYTES] [--server PATH]

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use rdma::client::cluster::ClusterClient;
use rdma::client::{resp, Client, Options, Reply};

/// valkey-cli options this tool does not offer, and what to do instead.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("-s", "no Unix sockets over RDMA"),
    ("-u", "no URIs; use -h, -p, -a, --user, -n"),
    ("--tls", "no TLS over RDMA"),
    ("--eval", "send EVAL as a command"),
    ("--ldb", "script debugging needs TCP (a fork child cannot use RDMA)"),
    ("--scan", "send SCAN as a command"),
    ("--bigkeys", "not available"),
    ("--memkeys", "not available"),
    ("--latency", "use valkey-rdma-bench"),
    ("--stat", "use INFO"),
    ("--pipe", "use --pipeline"),
    ("--replica", "replication needs TCP"),
    ("--rdb", "replication needs TCP"),
    ("--cluster", "use valkey-cli over TCP for cluster management; -c follows redirections"),
];

fn usage() -> ! {
    eprintln!(
        "usage: valkey-rdma-cli [-h HOST] [-p PORT] [-a PASS] [--user U] [-n DB] [-r N] [-i SECS] [-c] [-t SECS]"
    );
    eprintln!("                       [-x] [--raw|--no-raw] COMMAND [ARG...]");
    eprintln!("       valkey-rdma-cli [connection options] --pipeline < COMMANDS");
    eprintln!("       valkey-rdma-cli [connection options] metrics [--listen ADDR:PORT]");
    eprintln!("       valkey-rdma-cli doctor [--bind ADDR]... [--clients N] [--rx-size BYTES] [--server PATH]");
    eprintln!("  doctor  check this host for RDMA (devices, ports, rdma_cm, locked memory and memory mappings");
    eprintln!("          for N clients, bind addresses, a valkey-server binary); one line each; exit 1 if any FAIL");
    eprintln!("  -c      cluster mode: HOST:PORT is a seed; each command goes to the node serving its key,");
    eprintln!("          following MOVED/ASK redirections (every node must listen for RDMA on its own port)");
    eprintln!("  metrics  INFO rdma in the Prometheus text format; with --listen, served over HTTP at");
    eprintln!("           http://ADDR:PORT/metrics, read from the server at each scrape");
    eprintln!("  -a PASS, --pass PASS  password (AUTH on every connection); --user U: ACL user name");
    eprintln!("  -n DB   database number (SELECT on every connection)");
    eprintln!("  -r N    run the command N times; -i SECS: wait SECS between runs");
    eprintln!("  --rdma  accepted and implied: every connection is RDMA");
    eprintln!("  -t SECS connect and reply timeout (default 10)");
    eprintln!("  -x      read the last argument from standard input");
    eprintln!("  --then-idle SECS  keep the connection open, idle, for SECS after the reply (a pooled client)");
    eprintln!("  --pipeline  read commands from standard input, one per line (words split on spaces),");
    eprintln!("              send them all at once, print each reply as valkey-cli does");
    eprint!("not supported (valkey-cli has them):");
    for (opt, _) in UNSUPPORTED {
        eprint!(" {opt}");
    }
    eprintln!();
    std::process::exit(2)
}

/// `valkey-rdma-cli doctor ...`: every check of `rdma::doctor`, one line each.
fn doctor(mut args: impl Iterator<Item = String>) -> ! {
    let mut opts =
        rdma::doctor::Options { binds: vec![], clients: 1000, rx_size: rdma::protocol::DEFAULT_RX_SIZE, server: None };
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--bind" => opts.binds.push(value().parse().unwrap_or_else(|_| usage())),
            "--clients" => opts.clients = value().parse().unwrap_or_else(|_| usage()),
            "--rx-size" => opts.rx_size = value().parse().unwrap_or_else(|_| usage()),
            "--server" => opts.server = Some(value().into()),
            _ => usage(),
        }
    }
    let checks = rdma::doctor::run(&opts);
    for c in &checks {
        println!("{c}");
    }
    let failed = checks.iter().filter(|c| c.status == rdma::doctor::Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == rdma::doctor::Status::Warn).count();
    println!("doctor: {} checks, {failed} failed, {warned} warnings", checks.len());
    std::process::exit(if failed > 0 { 1 } else { 0 })
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("doctor") {
        doctor(std::env::args().skip(2));
    }
    let mut host = "127.0.0.1".to_string();
    let mut port = 6379u16;
    let mut stdin_arg = false;
    let mut opts = Options::default();
    let mut pipeline = false;
    let mut cluster = false;
    let mut then_idle = 0f64;
    let mut raw = !std::io::stdout().is_terminal();
    let (mut user, mut pass, mut repeat, mut interval) = (None, None, 1u64, 0f64);
    let mut words: Vec<Vec<u8>> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" if words.is_empty() => host = args.next().unwrap_or_else(|| usage()),
            "-p" if words.is_empty() => port = args.next().and_then(|p| p.parse().ok()).unwrap_or_else(|| usage()),
            "-x" if words.is_empty() => stdin_arg = true,
            "-c" if words.is_empty() => cluster = true,
            "-t" if words.is_empty() => {
                opts.timeout =
                    Duration::from_secs_f64(args.next().and_then(|t| t.parse().ok()).unwrap_or_else(|| usage()))
            }
            "-a" | "--pass" if words.is_empty() => pass = Some(args.next().unwrap_or_else(|| usage())),
            "--user" if words.is_empty() => user = Some(args.next().unwrap_or_else(|| usage())),
            "-n" if words.is_empty() => {
                opts.db = Some(args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| usage()))
            }
            "-r" if words.is_empty() => repeat = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| usage()),
            "-i" if words.is_empty() => interval = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| usage()),
            "--rdma" if words.is_empty() => {}
            o if words.is_empty() && UNSUPPORTED.iter().any(|(u, _)| *u == o) => {
                let why = UNSUPPORTED.iter().find(|(u, _)| *u == o).map_or("", |(_, w)| w);
                eprintln!("valkey-rdma-cli: {o} is not supported: {why}");
                std::process::exit(2)
            }
            "--raw" if words.is_empty() => raw = true,
            "--no-raw" if words.is_empty() => raw = false,
            "--pipeline" if words.is_empty() => pipeline = true,
            "--then-idle" if words.is_empty() => {
                then_idle = args.next().and_then(|p| p.parse().ok()).unwrap_or_else(|| usage())
            }
            "--help" => usage(),
            _ => words.push(a.into_bytes()),
        }
    }
    if cluster && then_idle > 0.0 {
        usage(); // --then-idle keeps one connection open: a single-node measurement
    }
    if let Some(pass) = pass {
        opts.auth = Some((user, pass));
    }
    let addr = format!("{host}:{port}");
    if pipeline {
        return run_pipeline(&addr, opts, cluster, raw);
    }
    if words.first().map(Vec::as_slice) == Some(b"metrics") {
        let listen = match words.get(1..).unwrap_or_default() {
            [] => None,
            [flag, a] if flag.as_slice() == b"--listen" => Some(String::from_utf8_lossy(a).into_owned()),
            _ => usage(),
        };
        return run_metrics(&addr, opts, listen);
    }
    if stdin_arg {
        let mut v = Vec::new();
        std::io::stdin().read_to_end(&mut v).expect("reading standard input");
        words.push(v);
    }
    if words.is_empty() {
        usage();
    }
    let mut client = Target::connect(&addr, opts, cluster);
    let argv: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
    for run in 0..repeat.max(1) {
        if run > 0 && interval > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(interval));
        }
        let reply = client.command(&argv).unwrap_or_else(|e| {
            eprintln!("Error: {e}");
            std::process::exit(1)
        });
        print_reply(&reply, raw, &mut std::io::stdout().lock());
    }
    if let (Target::Node(client), true) = (&mut client, then_idle > 0.0) {
        // a pooled client: the connection stays open, idle, after its command
        let _ = std::io::stdout().flush();
        if let Err(e) = client.stream().settle(Duration::from_secs_f64(then_idle)) {
            eprintln!("Error while idle: {e}");
            std::process::exit(1)
        }
    }
}

/// Where commands go: one server, or with `-c` a cluster seeded by HOST:PORT. The
/// printing does not care which.
// One value for the whole run: the size difference of its variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Target {
    Node(Client),
    Cluster(ClusterClient),
}

impl Target {
    /// Connects, or exits with valkey-cli's message.
    fn connect(addr: &str, opts: Options, cluster: bool) -> Target {
        let connected: Result<Target, Box<dyn std::error::Error>> = if cluster {
            ClusterClient::connect(&[addr.to_string()], opts).map(Target::Cluster).map_err(Into::into)
        } else {
            Client::connect(addr, opts).map(Target::Node).map_err(Into::into)
        };
        connected.unwrap_or_else(|e| {
            eprintln!("Could not connect to Valkey at {addr} over RDMA: {e}");
            std::process::exit(1)
        })
    }

    fn command(&mut self, argv: &[&[u8]]) -> Result<Reply, Box<dyn std::error::Error>> {
        Ok(match self {
            Target::Node(c) => c.command(argv)?,
            Target::Cluster(c) => c.command(argv)?,
        })
    }

    fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>, Box<dyn std::error::Error>> {
        Ok(match self {
            Target::Node(c) => c.pipeline(cmds)?,
            Target::Cluster(c) => c.pipeline(cmds)?,
        })
    }
}

fn print_reply(reply: &Reply, raw: bool, out: &mut impl Write) {
    if raw {
        write_raw(reply, out);
    } else {
        let mut s = String::new();
        resp::format_cli(reply, &mut s, 0);
        let _ = writeln!(out, "{s}");
    }
}

/// `--pipeline`: every line of standard input is a command; all go out in one write and
/// the replies are read back in order (the shape of a pipelining client). With `-c`, one
/// pipeline per node, the replies still in input order.
fn run_pipeline(addr: &str, opts: Options, cluster: bool, raw: bool) {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("reading standard input");
    let lines: Vec<Vec<&[u8]>> = input
        .lines()
        .map(|l| l.split_whitespace().map(str::as_bytes).collect::<Vec<_>>())
        .filter(|w| !w.is_empty())
        .collect();
    let mut client = Target::connect(addr, opts, cluster);
    let replies = client.pipeline(&lines).unwrap_or_else(|e| {
        eprintln!("Error: {e}");
        std::process::exit(1)
    });
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for r in &replies {
        print_reply(r, raw, &mut out);
    }
}

/// `metrics`: `INFO rdma` as Prometheus metrics, once to standard output, or at every
/// scrape of `http://LISTEN/metrics` (one RDMA connection per scrape).
fn run_metrics(addr: &str, opts: Options, listen: Option<String>) {
    let scrape = || -> Result<String, String> {
        let mut c = Client::connect(addr, opts.clone()).map_err(|e| format!("{addr}: {e}"))?;
        match c.command(&[b"INFO", b"rdma"]).map_err(|e| e.to_string())? {
            Reply::Bulk(b) => Ok(rdma::client::metrics::from_info(&String::from_utf8_lossy(&b))),
            other => Err(format!("INFO rdma answered {other:?}")),
        }
    };
    let Some(listen) = listen else {
        match scrape() {
            Ok(m) => print!("{m}"),
            Err(e) => {
                eprintln!("Error: {e}");
                std::process::exit(1)
            }
        }
        return;
    };
    let server = std::net::TcpListener::bind(&listen).unwrap_or_else(|e| {
        eprintln!("valkey-rdma-cli metrics: cannot listen on {listen}: {e}");
        std::process::exit(1)
    });
    eprintln!("valkey-rdma-cli metrics: serving http://{listen}/metrics for {addr}");
    for conn in server.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let (status, body) = if request.starts_with(b"GET /metrics ") || request.starts_with(b"GET /metrics?") {
            match scrape() {
                Ok(m) => ("200 OK", m),
                Err(e) => ("503 Service Unavailable", format!("{e}\n")),
            }
        } else {
            ("404 Not Found", "only /metrics is served\n".to_string())
        };
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

/// valkey-cli's output when not on a terminal: bare values, one per line.
fn write_raw(r: &Reply, out: &mut impl Write) {
    let _ = match r {
        Reply::Status(s) => writeln!(out, "{s}"),
        Reply::Error(e) => writeln!(out, "{e}"),
        Reply::Integer(i) => writeln!(out, "{i}"),
        Reply::Bulk(b) => out.write_all(b).and_then(|_| out.write_all(b"\n")),
        Reply::Nil => writeln!(out),
        Reply::Array(items) => {
            items.iter().for_each(|i| write_raw(i, out));
            Ok(())
        }
    };
}
