//! Listening: one rdma_cm id (and event channel, whose fd is the listener fd the server
//! watches) per bind address, like upstream (docs/protocol.md §1). Accepted ids are moved
//! to one module-wide channel for their own CM events (ESTABLISHED, DISCONNECTED), so
//! closing or re-opening a listener (`CONFIG SET rdma-port`) leaves live clients alone.
//!
//! A listener whose device is removed, or whose address moves, loses its id but keeps
//! its channel (the fd the server watches): the module's tick listens again on the same
//! channel once the address is on a device again (docs/operator-guide.md, "When a
//! device goes away").

use std::collections::HashMap;
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::connection::{self, RdmaConnection};
use super::knobs::{self, Knob};
use super::stats::{self, CmEnd, Rejected};
use super::MODULE;
use super::{global, live, pinned_ceiling_hint, HostedConn, CONN_EVENTS_KEY};
use crate::config::BindAddr;
use crate::server::{symbols, Hosted};
use crate::verbs::{self, CmEvent, CmId, ConnParams, EndpointConfig, EventChannel, VerbsError, VerbsOp};

/// One listening address.
struct ListenEndpoint {
    // Field order is drop order: the id before its channel.
    /// `None` while down: its device was removed or its address moved.
    id: Mutex<Option<CmId>>,
    channel: EventChannel,
    addr: SocketAddr,
}

impl ListenEndpoint {
    fn is_down(&self) -> bool {
        self.id.lock().is_none()
    }
}

/// The listeners and the accepted connections' CM channel.
pub(crate) struct Listeners {
    /// Listening endpoints by their channel fd (the fds in `connListener.fd[]`).
    listening: Mutex<Option<HashMap<c_int, Arc<ListenEndpoint>>>>,
    /// Listening endpoints closed while the server's event loop was still unknown: their
    /// fds stay open (and watched by the server) until their next event hands us the
    /// loop, so that a new listener can never reuse a number the server still watches
    /// (the server panics on EPOLL_CTL_MOD of an fd it believes is another).
    retired: Mutex<Option<HashMap<c_int, Arc<ListenEndpoint>>>>,
    /// The channel of every accepted connection's id.
    conn_events: OnceLock<EventChannel>,
}

impl Listeners {
    pub(crate) const fn new() -> Listeners {
        Listeners { listening: Mutex::new(None), retired: Mutex::new(None), conn_events: OnceLock::new() }
    }
}

fn conn_events() -> Result<&'static EventChannel, VerbsError> {
    if let Some(ch) = MODULE.listeners.conn_events.get() {
        return Ok(ch);
    }
    let ch = EventChannel::new()?;
    // (watched for the life of the process: the token is not kept)
    if crate::server::watch_fd::<RdmaConnection>(ch.fd(), CONN_EVENTS_KEY).is_none() {
        return Err(VerbsError::with(VerbsOp::CreateEventChannel, libc::EINVAL));
    }
    Ok(MODULE.listeners.conn_events.get_or_init(|| ch))
}

/// Explains a failure to set up RDMA in terms an operator can act on.
fn explain(e: &VerbsError, addr: Option<&SocketAddr>) -> String {
    let what = match addr {
        Some(a) => format!("RDMA listener on {a}: {e}"),
        None => format!("RDMA: {e}"),
    };
    let hint = match (e.op, e.errno) {
        (VerbsOp::CreateEventChannel, libc::ENODEV | libc::ENOENT) => {
            "/dev/infiniband/rdma_cm is missing: load the rdma_ucm kernel module (modprobe rdma_ucm) and check that the server may open the device"
        }
        (VerbsOp::BindAddr, libc::EADDRNOTAVAIL | libc::ENODEV | libc::EINVAL) => {
            "the address is not on an RDMA device: bind to the IP of a netdev that `rdma link` lists (RoCE/IPoIB), or use rdma-bind *"
        }
        (VerbsOp::BindAddr, libc::EADDRINUSE) => "another process listens for RDMA on this port: choose another rdma-port",
        (_, libc::EACCES | libc::EPERM) => "permission denied: run the server as a user that may use /dev/infiniband",
        _ => "",
    };
    if hint.is_empty() {
        what
    } else {
        format!("{what} ({hint})")
    }
}

/// The start-up checks, the same functions as `valkey-rdma-cli doctor` (so the log and
/// the doctor say the same): devices must be usable; a locked-memory limit too low for a
/// handful of clients is worth a warning (the server's maxclients is usually far more
/// than RDMA clients).
fn preflight() -> bool {
    let devices = crate::doctor::devices();
    if !devices.is_ok() {
        log::warn!("{}", devices.log_line());
        return false;
    }
    let memlock = crate::doctor::memlock(16, global().settings.rx_size);
    if !memlock.is_ok() {
        log::warn!("{}", memlock.log_line());
    }
    true
}

/// `ct->listen`. Idempotent: called again for a listener that already listens on the
/// same addresses (the server's `initListeners` after a module-argument CONFIG SET, or
/// a config rollback), it keeps the existing endpoints.
pub(crate) fn listen(listener: &mut crate::server::abi::ConnListener) -> bool {
    if listener.bindaddr_count == 0 {
        listener.use_default_binds();
    }
    let binds = match BindAddr::parse_list(&listener.bind_names()) {
        Ok(b) => b,
        Err(e) => {
            log::warn!("RDMA: {e}");
            return false;
        }
    };
    let port = listener.port as u16;
    let wanted: Vec<SocketAddr> = binds.iter().map(|b| SocketAddr::new(b.ip, port)).collect();
    if listener.count > 0 {
        let current = current_addrs(listener);
        if wanted.iter().filter(|a| !binds_optional(&binds, a)).all(|a| current.contains(a)) && !current.is_empty() {
            return true;
        }
        close_listener(listener);
    }
    if verbs::lib().is_err() || !preflight() {
        return false;
    }
    if let Err(e) = conn_events() {
        log::warn!("{}", explain(&e, None));
        return false;
    }
    let mut made: Vec<Arc<ListenEndpoint>> = Vec::new();
    for b in &binds {
        let addr = SocketAddr::new(b.ip, port);
        match open_endpoint(&addr) {
            Ok(ep) => made.push(Arc::new(ep)),
            Err(e)
                if b.optional
                    && matches!(e.errno, libc::EADDRNOTAVAIL | libc::ENODEV | libc::EAFNOSUPPORT | libc::EINVAL) =>
            {
                log::debug!("RDMA: optional address {addr} skipped: {e}");
            }
            Err(e) => {
                log::warn!("{}", explain(&e, Some(&addr)));
                return false; // `made` drops here: nothing half-open is left behind
            }
        }
    }
    if made.is_empty() {
        log::warn!("RDMA: none of the bind addresses could be used; set rdma-bind to an address of an RDMA device");
        return false;
    }
    let mut reg = MODULE.listeners.listening.lock();
    let reg = reg.get_or_insert_with(HashMap::new);
    listener.count = made.len() as c_int;
    for (i, ep) in made.into_iter().enumerate() {
        listener.fd[i] = ep.channel.fd();
        log::info!("RDMA: listening on {}", ep.addr);
        reg.insert(ep.channel.fd(), ep);
    }
    true
}

/// (listening endpoints, those of them down) now (for INFO).
pub(crate) fn listening_count() -> (usize, usize) {
    let reg = MODULE.listeners.listening.lock();
    let Some(r) = reg.as_ref() else { return (0, 0) };
    (r.len(), r.values().filter(|ep| ep.is_down()).count())
}

/// Listens again on each listening address that is down (from the module's tick): the
/// device or the address may be back. Quiet while it is not.
pub(crate) fn listen_again() {
    let down: Vec<Arc<ListenEndpoint>> = MODULE
        .listeners
        .listening
        .lock()
        .as_ref()
        .map(|r| r.values().filter(|ep| ep.is_down()).cloned().collect())
        .unwrap_or_default();
    for ep in down {
        match listen_on(&ep.channel, &ep.addr) {
            Ok(id) => {
                *ep.id.lock() = Some(id);
                stats::add(&MODULE.stats.relistens, 1);
                log::info!("RDMA: listening on {} again", ep.addr);
            }
            Err(e) => log::debug!("RDMA: listener on {} still down: {e}", ep.addr),
        }
    }
}

/// Test builds: DEVICE_REMOVAL dropped unread (knob `ignore-device-removal`), as when the
/// kernel removes a device without telling rdma_cm's users.
fn dropped_by_knob(event: &CmEvent) -> bool {
    event.is_device_removal() && knobs::value(Knob::IgnoreDeviceRemoval).is_some()
}

/// Every listener whose id is on `device` loses it as at DEVICE_REMOVAL (the device left
/// sysfs without one, `removal::unannounced`).
pub(crate) fn device_unlisted(device: verbs::DeviceKey) {
    let on_it: Vec<Arc<ListenEndpoint>> = MODULE
        .listeners
        .listening
        .lock()
        .iter()
        .flat_map(|r| r.values())
        .filter(|ep| ep.id.lock().as_ref().and_then(verbs::DeviceKey::of) == Some(device))
        .cloned()
        .collect();
    for ep in on_it {
        listener_lost(&ep, true);
    }
}

/// The listener's id got DEVICE_REMOVAL or ADDR_CHANGE: its id is destroyed (a removed
/// device's resources must all go), the channel stays watched, and [`listen_again`]
/// brings it back.
fn listener_lost(ep: &ListenEndpoint, removal: bool) {
    let Some(id) = ep.id.lock().take() else { return };
    let (device, name) = (verbs::DeviceKey::of(&id), verbs::device_name(&id));
    drop(id);
    if removal {
        log::warn!(
            "RDMA: listener on {}: its device {name} was removed; listening again once the address is back",
            ep.addr
        );
        if let Some(device) = device {
            super::removal::device_removed(device, &name);
        }
    } else {
        log::warn!("RDMA: listener on {}: the address changed; listening again", ep.addr);
        listen_again();
    }
}

fn binds_optional(binds: &[BindAddr], a: &SocketAddr) -> bool {
    binds.iter().any(|b| b.optional && b.ip == a.ip())
}

fn current_addrs(listener: &crate::server::abi::ConnListener) -> Vec<SocketAddr> {
    let reg = MODULE.listeners.listening.lock();
    (0..listener.count.max(0) as usize).filter_map(|i| reg.as_ref()?.get(&listener.fd[i]).map(|e| e.addr)).collect()
}

fn open_endpoint(addr: &SocketAddr) -> Result<ListenEndpoint, VerbsError> {
    let channel = EventChannel::new()?;
    let id = listen_on(&channel, addr)?;
    Ok(ListenEndpoint { id: Mutex::new(Some(id)), channel, addr: *addr })
}

fn listen_on(channel: &EventChannel, addr: &SocketAddr) -> Result<CmId, VerbsError> {
    let id = CmId::new(channel)?;
    if addr.is_ipv6() {
        id.set_afonly()?;
    }
    id.bind(addr)?;
    id.listen(511)?;
    Ok(id)
}

/// `ct->closeListener`: unregister the fds from the event loop (the server registered
/// them) and release the endpoints. Live connections are not affected.
pub(crate) fn close_listener(listener: &mut crate::server::abi::ConnListener) {
    let mut reg = MODULE.listeners.listening.lock();
    for i in 0..listener.count.max(0) as usize {
        let fd = listener.fd[i];
        let Some(ep) = reg.as_mut().and_then(|r| r.remove(&fd)) else { continue };
        if !symbols::unwatch_listener_fd(fd) {
            log::debug!("RDMA: listener fd {fd} kept open until the server's event loop is known");
            MODULE.listeners.retired.lock().get_or_insert_with(HashMap::new).insert(fd, ep.clone());
        }
        log::info!("RDMA: stopped listening on {}", ep.addr);
        listener.fd[i] = -1;
    }
    listener.count = 0;
}

/// `ct->accept_handler`: a listener channel has CM events (connect requests). The
/// server's event loop is known from here on (the edge remembered it).
pub(crate) fn on_listener_events(fd: c_int) {
    // Now the loop is known: unwatch every retired listener, then close it (rejecting
    // what is queued on it).
    let retired: Vec<(c_int, Arc<ListenEndpoint>)> =
        MODULE.listeners.retired.lock().as_mut().map(|r| r.drain().collect()).unwrap_or_default();
    if !retired.is_empty() {
        for (rfd, _) in &retired {
            symbols::unwatch_listener_fd(*rfd);
        }
        log::info!("RDMA: {} listener(s) closed before the event loop was known are released now", retired.len());
        let was_retired = retired.iter().any(|(rfd, _)| *rfd == fd);
        drop(retired);
        if was_retired {
            return;
        }
    }
    let Some(ep) = MODULE.listeners.listening.lock().as_ref().and_then(|r| r.get(&fd).cloned()) else { return };
    for _ in 0..global().accepts_per_cycle {
        let event = match ep.channel.next_event() {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                log::warn!("RDMA: {}", explain(&e, Some(&ep.addr)));
                return;
            }
        };
        if dropped_by_knob(&event) {
            continue;
        }
        match event.new_id {
            Some(id) => accept_one(id),
            None if event.is_device_removal() || event.is_addr_change() => {
                listener_lost(&ep, event.is_device_removal())
            }
            None => log::debug!("RDMA: unexpected event {} on the listener for {}", event.name(), ep.addr),
        }
    }
}

/// The connection parameters we accept with (docs/protocol.md §1).
const ACCEPT_PARAMS: ConnParams = ConnParams {
    retry_count: 7,
    // Upstream leaves 0 here; 7 ("retry forever") makes a client that briefly outruns
    // our posted receives wait instead of failing its QP.
    rnr_retry_count: 7,
};

fn accept_one(id: CmId) {
    if knobs::fire(Knob::PanicInAccept) {
        panic!("test knob panic-accept");
    }
    // named once, for the refusal lines below (the id is consumed by then)
    let peer = id.peer_addr().map_or("?".into(), |p| p.to_string());
    let handshake = match id.peer_addr().map(|p| super::handshakes::Slot::admit(p.ip())) {
        Some(Err(over)) => {
            stats::rejected(Rejected::Handshakes);
            id.reject();
            return super::log_limited(format_args!("RDMA: client {peer} refused: {over}"));
        }
        Some(Ok(slot)) => Some(slot),
        None => None,
    };
    let conn_channel = match conn_events() {
        Ok(ch) => ch,
        Err(e) => return log::warn!("{}", explain(&e, None)),
    };
    let migrated = match knobs::fire(Knob::FailMigrate) {
        true => Err(VerbsError::with(VerbsOp::MigrateId, libc::EIO)),
        false => id.migrate(conn_channel),
    };
    if let Err(e) = migrated {
        stats::rejected(Rejected::Migrate);
        return super::log_limited(format_args!("RDMA: client {peer} refused: {e}"));
    }
    let g = global();
    // Every connection starts with a small RX buffer and grows it, up to rdma-rx-size,
    // when the client fills it (docs/protocol.md §4.3): an idle connection pins little.
    let initial_rx = g.settings.rx_size.min(crate::protocol::MIN_RX_SIZE);
    let cfg = EndpointConfig {
        rx_size: initial_rx,
        comp_vector: g.settings.comp_vector,
        reject_on_failure: true,
        tx_chunk: crate::verbs::TX_CHUNK,
    };
    // Room under the pinned-memory ceiling for the connection and its first reply (one
    // TX chunk): one admitted only to fail at its first reply would serve nobody.
    let needs = verbs::pinned_bytes(initial_rx, 0) + u64::from(crate::verbs::TX_CHUNK);
    if !crate::verbs::pinned::has_room(needs) {
        stats::rejected(Rejected::Resources);
        id.reject();
        return super::log_limited(format_args!("RDMA: client {peer} refused: {}", pinned_ceiling_hint()));
    }
    let (built, shared_cq) = super::shared_cqs::endpoint(id, &cfg, &mut connection::ToConnections);
    let ep = match built {
        Ok(ep) => ep,
        Err(e) => {
            stats::rejected(Rejected::Resources);
            let hint = if e.op == VerbsOp::RegMr && e.errno == libc::ENOMEM {
                format!(" ({})", crate::doctor::memlock_hint(g.settings.rx_size))
            } else if e.op == VerbsOp::PinnedCeiling {
                format!(" ({})", pinned_ceiling_hint())
            } else if e.op == VerbsOp::MapCount {
                let (maps, limit) = verbs::map_count_now().unwrap_or_default();
                format!(
                    " ({maps} of vm.max_map_count {limit} memory mappings in use, and each RDMA connection needs about 3: raise vm.max_map_count)"
                )
            } else {
                String::new()
            };
            return super::log_limited(format_args!("RDMA: client {peer} refused: {e}{hint}"));
        }
    };
    let c: Arc<HostedConn> = match Hosted::new(RdmaConnection::new(ep, g.settings.rx_size, shared_cq, handshake)) {
        Ok(c) => c,
        Err(e) => {
            stats::rejected(Rejected::Resources);
            // (the endpoint drops here: the connect request is rejected)
            return super::log_limited(format_args!(
                "RDMA: client {peer} refused: no file descriptor for it ({e}): raise the server's open-files limit (ulimit -n, LimitNOFILE=)"
            ));
        }
    };
    connection::set_cm_context(&c);
    if let Err(e) = connection::accept_cm(&c, ACCEPT_PARAMS) {
        stats::rejected(Rejected::Accept);
        super::log_limited(format_args!("RDMA: client {} refused: {e}", c.inner.peer_name()));
        connection::teardown(&c);
        return;
    }
    // On a shared CQ, its fd is watched already; else the connection's own channel.
    let watched = match c.inner.own_channel_fd {
        None => true,
        Some(fd) => {
            crate::server::watch_fd::<RdmaConnection>(fd, c.key()).map(|w| connection::set_watch(&c, w)).is_some()
        }
    };
    if !watched {
        stats::rejected(Rejected::Accept);
        super::log_limited(format_args!(
            "RDMA: client {} refused: cannot watch its completion channel",
            c.inner.peer_name()
        ));
        connection::teardown(&c);
        return;
    }
    // Live from here: close() unwatches the fd. (The callback can only run from the
    // event loop, on this thread, after we return.)
    live::insert(&c);
    if let Some((cq, qp_num)) = c.inner.shared_cq {
        super::shared_cqs::register(cq, qp_num, &c);
    }
    stats::add(&MODULE.stats.accepted, 1);
    log::debug!("RDMA: accepted {} (completion vector {})", c.inner.peer_name(), c.inner.comp_vector());
    // The server takes over (it may close the connection inside).
    let probe = c.clone();
    c.hand_to_server();
    // Closed inside acceptCommonHandler before it accepted: the server refused the
    // client. For maxclients it logs nothing (only INFO's rejected_connections moves),
    // so the operator would not learn why clients fail: one (rate-limited) line here.
    if connection::closed_unaccepted(&probe) {
        super::log_limited(format_args!(
            "RDMA: client {} refused by the server as it was handed over (maxclients reached: see rejected_connections in INFO stats)",
            probe.inner.peer_name()
        ));
    }
}

/// The connections' CM channel is readable: ESTABLISHED, DISCONNECTED, …
pub(crate) fn on_conn_events() {
    let Some(ch) = MODULE.listeners.conn_events.get() else { return };
    for _ in 0..256 {
        let event = match ch.next_event() {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => return log::warn!("RDMA: {e}"),
        };
        let Some(c) = live::get(event.context) else { continue };
        if dropped_by_knob(&event) {
            continue;
        }
        if event.is_device_removal() {
            if let Some(device) = c.inner.device {
                super::removal::device_removed(device, &connection::device_name(&c));
            }
        }
        if event.is_established() {
            connection::on_established(&c);
        } else if event.is_disconnect() {
            stats::cm_end(if event.is_disconnected() { CmEnd::Disconnected } else { CmEnd::Other });
            connection::on_disconnected(&c);
        }
        connection::queue_if_due(&c);
    }
}
