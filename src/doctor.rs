//! Pre-flight checks of a host for Valkey over RDMA, one line each with what to do when
//! it fails: `valkey-rdma-cli doctor` runs them all, and the module runs the same
//! functions at start-up (`transport::listener`), so the doctor and the server's log
//! say the same thing.

#![forbid(unsafe_code)]

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use crate::server::abi::{version_string, Abi, SUPPORTED_VERSIONS};
use crate::verbs::{self, CmId, EventChannel};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One check: what was looked at, what was found, and (unless OK) what to do.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn bad(status: Status, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.into(), status, detail: detail.into(), fix: Some(fix.into()) }
    }
    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok
    }
    /// The line for a log: what was found and what to do.
    pub fn log_line(&self) -> String {
        match &self.fix {
            Some(fix) => format!("RDMA: {}: {}: {fix}", self.name, self.detail),
            None => format!("RDMA: {}: {}", self.name, self.detail),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Ok => "OK  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        write!(f, "{tag} {}: {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, " -> {fix}")?;
        }
        Ok(())
    }
}

/// librdmacm.so.1 and libibverbs.so.1 (rdma-core) can be loaded.
pub fn libraries() -> Check {
    match verbs::lib() {
        Ok(_) => Check::ok("libraries", "librdmacm.so.1 and libibverbs.so.1 loaded"),
        Err(e) => Check::bad(
            Status::Fail,
            "libraries",
            e.to_string(),
            "install rdma-core's libraries (Debian: apt install librdmacm1 libibverbs1 ibverbs-providers)",
        ),
    }
}

fn sysfs(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn dir_names(path: impl AsRef<Path>) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// RDMA devices the kernel has and this process can open (through /dev/infiniband).
pub fn devices() -> Check {
    let in_sysfs = dir_names("/sys/class/infiniband");
    let opened = verbs::device_count();
    if opened > 0 {
        return Check::ok("devices", format!("{opened} RDMA device(s) usable: {}", in_sysfs.join(", ")));
    }
    if in_sysfs.is_empty() {
        Check::bad(
            Status::Fail,
            "devices",
            "no RDMA device found",
            "load the driver of your NIC, or create a Soft-RoCE device (rdma link add rxe0 type rxe netdev IFACE), then restart",
        )
    } else {
        Check::bad(
            Status::Fail,
            "devices",
            format!("the kernel has RDMA devices ({}) but this process cannot open them", in_sysfs.join(", ")),
            "load the user-space access modules (modprobe ib_uverbs; modprobe rdma_ucm) and check the permissions of /dev/infiniband/*",
        )
    }
}

/// What to do about a port that is not ACTIVE.
const PORT_DOWN_FIX: &str =
    "the port is not ACTIVE: bring its netdev up (ip link set IFACE up) and check the cable or switch";

/// The state ("4: ACTIVE") and link layer ("Ethernet") of the port at sysfs path `p`.
fn port_state(p: &str) -> (String, String) {
    let read = |f: &str| sysfs(format!("{p}/{f}")).unwrap_or_else(|| "unknown".into());
    (read("state"), read("link_layer"))
}

/// Each port of each device: its state, link layer, netdevs and GIDs (sysfs).
pub fn ports() -> Vec<Check> {
    let mut out = Vec::new();
    for dev in dir_names("/sys/class/infiniband") {
        let base = format!("/sys/class/infiniband/{dev}/ports");
        for port in dir_names(&base) {
            let p = format!("{base}/{port}");
            let name = format!("port {dev}/{port}");
            let (state, link) = port_state(&p);
            let gids: Vec<String> = dir_names(format!("{p}/gids"))
                .into_iter()
                .filter_map(|i| sysfs(format!("{p}/gids/{i}")))
                .filter(|g| g.chars().any(|c| c != '0' && c != ':'))
                .collect();
            let mut ndevs: Vec<String> = dir_names(format!("{p}/gid_attrs/ndevs"))
                .into_iter()
                .filter_map(|i| sysfs(format!("{p}/gid_attrs/ndevs/{i}")))
                .filter(|n| !n.is_empty())
                .collect();
            ndevs.sort();
            ndevs.dedup();
            let detail = format!(
                "{state}, {link}, netdev {}, {} GID(s)",
                if ndevs.is_empty() { "none".to_string() } else { ndevs.join(",") },
                gids.len()
            );
            if !state.contains("ACTIVE") {
                out.push(Check::bad(Status::Warn, name, detail, PORT_DOWN_FIX));
            } else if gids.is_empty() {
                out.push(Check::bad(
                    Status::Warn,
                    name,
                    detail,
                    "no GID: give the port's netdev an IP address (RoCE derives its GIDs from them)",
                ));
            } else {
                out.push(Check::ok(name, detail));
            }
        }
    }
    out
}

/// `/dev/infiniband/rdma_cm` (the rdma_ucm module) works: an event channel opens.
pub fn rdma_cm() -> Check {
    if !Path::new("/dev/infiniband/rdma_cm").exists() {
        return Check::bad(
            Status::Fail,
            "rdma_cm",
            "/dev/infiniband/rdma_cm is missing",
            "load the rdma_ucm kernel module (modprobe rdma_ucm) and check that the server may open the device",
        );
    }
    match EventChannel::new() {
        Ok(_) => Check::ok("rdma_cm", "/dev/infiniband/rdma_cm opens"),
        Err(e) => Check::bad(
            Status::Fail,
            "rdma_cm",
            format!("/dev/infiniband/rdma_cm: {e}"),
            "check the permissions of /dev/infiniband/rdma_cm for the server's user",
        ),
    }
}

/// The locked-memory limit against what `clients` connections pin with our RX buffer of
/// `rx_size` bytes and clients whose RX buffer is libvalkey's 1 MiB.
pub fn memlock(clients: u64, rx_size: u32) -> Check {
    let per = verbs::pinned_bytes(rx_size, crate::protocol::DEFAULT_RX_SIZE);
    let need = per * clients.max(1);
    match verbs::memlock_limit() {
        None => Check::ok("memlock", "unlimited (ulimit -l)"),
        Some(limit) if limit >= need => Check::ok(
            "memlock",
            format!("{} KiB, {} clients at {} KiB each need {} KiB", limit / 1024, clients, per / 1024, need / 1024),
        ),
        Some(limit) => Check::bad(
            if limit >= per { Status::Warn } else { Status::Fail },
            "memlock",
            format!(
                "the locked-memory limit (ulimit -l) is {} KiB and each RDMA client pins about {} KiB: without CAP_IPC_LOCK only {} of {} clients fit",
                limit / 1024,
                per / 1024,
                limit / per,
                clients
            ),
            format!(
                "raise `ulimit -l` to at least {} KiB (LimitMEMLOCK= for systemd), or lower rdma-rx-size",
                need.div_ceil(1024)
            ),
        ),
    }
}

/// What a refused client's log line says to raise `ulimit -l` to: the memory one client
/// pins at `rx_size` ([`verbs::pinned_bytes`], the layout the module registers), in KiB.
pub fn memlock_hint(rx_size: u32) -> String {
    let per = verbs::pinned_bytes(rx_size, crate::protocol::DEFAULT_RX_SIZE);
    format!(
        "the locked-memory limit is too low: raise `ulimit -l`, or LimitMEMLOCK= for systemd, by at least {} KiB per client (rdma-rx-size {} KiB), or lower rdma-rx-size",
        per.div_ceil(1024),
        rx_size / 1024
    )
}

/// `vm.max_map_count` against the memory mappings of `clients` connections: each RDMA
/// connection maps the device's queues, and its buffers are slots of shared chunks, so
/// at the default 65530 a server holds about 20,000 connections; beyond that the module
/// refuses new ones (one log line naming this setting) rather than fail held ones.
pub fn map_count(clients: u64) -> Check {
    let need = verbs::maps_for_clients(clients);
    match verbs::max_map_count() {
        None => Check::ok("max_map_count", "not readable here (/proc/sys/vm/max_map_count): not checked"),
        Some(limit) if limit >= need => {
            Check::ok("max_map_count", format!("{limit}, {clients} clients need about {need} memory mappings"))
        }
        Some(limit) => Check::bad(
            Status::Warn,
            "max_map_count",
            format!(
                "vm.max_map_count is {limit} and each RDMA client takes about {} memory mappings: about {} of {clients} clients fit",
                verbs::MAPS_PER_ENDPOINT,
                verbs::clients_for_maps(limit),
            ),
            format!("raise it: sysctl -w vm.max_map_count={} (and in /etc/sysctl.d/ to keep it)", need.next_multiple_of(1024)),
        ),
    }
}

/// Whether `ip` belongs to an RDMA device (an rdma_cm id binds to it), and if so which
/// device and port carry it, the port's state, the address's GID and whether it is
/// routable (RoCE v2) or reaches only its own L2 segment (RoCE v1).
pub fn bind(ip: IpAddr) -> Check {
    let name = format!("bind {ip}");
    let channel = match EventChannel::new() {
        Ok(c) => c,
        Err(e) => return Check::bad(Status::Fail, name, e.to_string(), "fix the rdma_cm check first"),
    };
    let id = match CmId::new(&channel) {
        Ok(id) => id,
        Err(e) => return Check::bad(Status::Fail, name, e.to_string(), "fix the rdma_cm check first"),
    };
    if let Err(e) = id.bind(&SocketAddr::new(ip, 0)) {
        return Check::bad(
            Status::Fail,
            name,
            e.to_string(),
            "the address is not on an RDMA device: bind to the IP of a netdev that `rdma link` lists (RoCE/IPoIB), or use rdma-bind *",
        );
    }
    if ip.is_unspecified() {
        return Check::ok(name, "the wildcard address: every RDMA device");
    }
    let (dev, port) = (verbs::device_name(&id), id.port_num());
    let p = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let (state, link) = port_state(&p);
    let want = gid_of(ip);
    let types: Vec<String> = dir_names(format!("{p}/gids"))
        .into_iter()
        .filter(|i| sysfs(format!("{p}/gids/{i}")).as_deref() == Some(want.as_str()))
        .map(|i| sysfs(format!("{p}/gid_attrs/types/{i}")).unwrap_or_default())
        .collect();
    let carrier = format!("on {dev} port {port} ({state}, {link})");
    if !state.contains("ACTIVE") {
        return Check::bad(Status::Warn, name, carrier, PORT_DOWN_FIX);
    }
    match route_kind(&link, &types) {
        Route::Routable => Check::ok(name, format!("{carrier}, GID {want} RoCE v2: routable")),
        Route::Infiniband => Check::ok(name, format!("{carrier}: IPoIB on an InfiniBand fabric")),
        Route::SegmentOnly => Check::bad(
            Status::Warn,
            name,
            format!("{carrier}, GID {want} RoCE v1 only"),
            "RoCE v1 reaches only hosts on the same L2 segment: enable RoCE v2 on the NIC (its GID table lists a RoCE v2 GID for each address)",
        ),
        Route::NoGid => Check::bad(
            Status::Warn,
            name,
            format!("{carrier}, no GID {want} in its table"),
            "the port has no GID for this address yet: check that the address is on the port's netdev (ip addr) and not tentative",
        ),
    }
}

/// How the clients of other hosts reach an address (`route_kind`).
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// A RoCE v2 GID: UDP/IP, across routers.
    Routable,
    /// Only RoCE v1 GIDs: Ethernet frames, within the L2 segment.
    SegmentOnly,
    /// An InfiniBand port (IPoIB): the fabric routes by LID, not by IP.
    Infiniband,
    /// No GID of the address on the port.
    NoGid,
}

/// From the port's link layer and the types of the GIDs that equal the address.
fn route_kind(link_layer: &str, gid_types: &[String]) -> Route {
    if link_layer.eq_ignore_ascii_case("InfiniBand") {
        Route::Infiniband
    } else if gid_types.iter().any(|t| t.contains("v2")) {
        Route::Routable
    } else if gid_types.is_empty() {
        Route::NoGid
    } else {
        Route::SegmentOnly
    }
}

/// The GID of an IP address as sysfs writes it: IPv4 mapped into IPv6
/// (`0000:0000:0000:0000:0000:ffff:0a4d:0001`), IPv6 as it is, 8 groups of 4 digits.
fn gid_of(ip: IpAddr) -> String {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    v6.segments().iter().map(|s| format!("{s:04x}")).collect::<Vec<_>>().join(":")
}

/// The valkey-server at `path`: its version, and whether this module supports it.
pub fn server(path: &Path) -> Check {
    let name = format!("server {}", path.display());
    let out = match std::process::Command::new(path).arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return Check::bad(Status::Fail, name, e.to_string(), "give the path of a valkey-server binary"),
    };
    // "Valkey server v=9.1.2 sha=... malloc=jemalloc-5.3.0 bits=64 build=..."
    let Some(v) = out.split_whitespace().find_map(|w| w.strip_prefix("v=")) else {
        return Check::bad(Status::Fail, name, format!("no version in `{}`", out.trim()), "is this valkey-server?");
    };
    let parts: Vec<i32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
    let [major, minor, patch] = parts[..] else {
        return Check::bad(Status::Fail, name, format!("version {v} not understood"), "is this valkey-server?");
    };
    let code = (major << 16) | (minor << 8) | patch;
    match Abi::for_version(code) {
        Some(abi) => Check::ok(name, format!("valkey {} ({abi:?} connection ABI): supported", version_string(code))),
        None => Check::bad(
            Status::Fail,
            name,
            format!("valkey {v} is not supported (supported: {SUPPORTED_VERSIONS})"),
            "use a supported valkey-server; its connection ABI must be verified before librdma.so can load into it",
        ),
    }
}

/// What `valkey-rdma-cli doctor` checks.
pub struct Options {
    pub binds: Vec<IpAddr>,
    pub clients: u64,
    pub rx_size: u32,
    pub server: Option<std::path::PathBuf>,
}

/// Every check, in the order a failure should be fixed.
pub fn run(opts: &Options) -> Vec<Check> {
    let mut out = vec![libraries()];
    if !out[0].is_ok() {
        return out;
    }
    out.push(devices());
    out.extend(ports());
    out.push(rdma_cm());
    out.push(memlock(opts.clients, opts.rx_size));
    out.push(map_count(opts.clients));
    for ip in &opts.binds {
        out.push(bind(*ip));
    }
    if let Some(p) = &opts.server {
        out.push(server(p));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_address_is_found_in_the_gid_table_as_sysfs_writes_it() {
        assert_eq!(gid_of("10.77.0.1".parse().unwrap()), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
        assert_eq!(gid_of("fd00:78::1".parse().unwrap()), "fd00:0078:0000:0000:0000:0000:0000:0001");
        let v = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(route_kind("Ethernet", &v(&["IB/RoCE v1", "RoCE v2"])), Route::Routable);
        assert_eq!(route_kind("Ethernet", &v(&["IB/RoCE v1"])), Route::SegmentOnly);
        assert_eq!(route_kind("Ethernet", &[]), Route::NoGid);
        assert_eq!(route_kind("InfiniBand", &[]), Route::Infiniband);
    }

    #[test]
    fn a_check_line_says_what_was_found_and_what_to_do() {
        let c = Check::bad(Status::Fail, "memlock", "64 KiB", "raise it");
        assert_eq!(c.to_string(), "FAIL memlock: 64 KiB -> raise it");
        assert_eq!(c.log_line(), "RDMA: memlock: 64 KiB: raise it");
        assert_eq!(Check::ok("rdma_cm", "opens").to_string(), "OK   rdma_cm: opens");
    }

    #[test]
    fn the_memlock_hint_follows_rdma_rx_size() {
        // 16 MiB of RX, a 1 MiB TX buffer for the peer, the control slots: over 17 MiB
        let big = memlock_hint(16 << 20);
        let kib: u64 = big.split("at least ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
        assert!(kib > 17 * 1024 && kib < 18 * 1024, "{big}");
        let small = memlock_hint(64 << 10);
        let kib: u64 = small.split("at least ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
        assert!(kib > 1024 + 64 && kib < 1024 + 96, "{small}");
    }

    #[test]
    fn map_count_counts_the_mappings_of_the_clients() {
        let Some(limit) = verbs::max_map_count() else { return assert!(map_count(10_000).is_ok()) };
        // A number of clients that fits and one that does not, for whatever the limit is.
        assert!(map_count(1).is_ok() || limit < verbs::maps_for_clients(1));
        let c = map_count(limit);
        assert_eq!(c.status, Status::Warn, "{c}");
        assert!(c.fix.as_deref().unwrap().contains("vm.max_map_count="), "{c}");
    }

    #[test]
    fn memlock_counts_what_the_clients_pin() {
        let per = verbs::pinned_bytes(1 << 20, 1 << 20);
        let c = memlock(1000, 1 << 20);
        match verbs::memlock_limit() {
            None => assert!(c.is_ok()),
            Some(l) if l >= per * 1000 => assert!(c.is_ok()),
            Some(_) => assert!(c.detail.contains("only") && c.fix.as_deref().unwrap().contains("ulimit -l")),
        }
    }
}
