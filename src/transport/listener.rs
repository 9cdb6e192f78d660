//! Listening: one rdma_cm id (and event channel, whose fd is the listener fd the server
//! watches) per bind address, like upstream (docs/protocol.md §1). Accepted ids are moved
//! to one module-wide channel for their own CM events (ESTABLISHED, DISCONNECTED), so
//! closing or re-opening a listener (`CONFIG SET rdma-port`) leaves live clients alone.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use rdma_sys::{rdma_cm_event_type as ev, rdma_conn_param};

use super::connection::{close, queue_if_due, RdmaConnection};
use super::{global, is_live, live_insert, live_snapshot, lock, ConnPtr};
use crate::config::BindAddr;
use crate::server::abi::*;
use crate::server::{api, symbols};
use crate::verbs::{self, CmId, Endpoint, EndpointConfig, EventChannel, VerbsError};

/// One listening address.
struct ListenEndpoint {
    // Field order is drop order: the id before its channel. Held only to be dropped.
    _id: CmId,
    channel: EventChannel,
    addr: SocketAddr,
}

/// Listening endpoints by their channel fd (the fds in `connListener.fd[]`).
static LISTENING: Mutex<Option<HashMap<c_int, Arc<ListenEndpoint>>>> = Mutex::new(None);
/// The channel of every accepted connection's id.
static CONN_EVENTS: OnceLock<EventChannel> = OnceLock::new();
/// Listening endpoints closed while the server's event loop was still unknown: their fds
/// stay open (and watched by the server) until their next event hands us the loop, so
/// that a new listener can never reuse a number the server still watches (the server
/// panics on EPOLL_CTL_MOD of an fd it believes is another).
static RETIRED: Mutex<Option<HashMap<c_int, Arc<ListenEndpoint>>>> = Mutex::new(None);

fn conn_events() -> Result<&'static EventChannel, VerbsError> {
    if let Some(ch) = CONN_EVENTS.get() {
        return Ok(ch);
    }
    let ch = EventChannel::new()?;
    // SAFETY: no data pointer; the channel lives for the rest of the process (static).
    if !unsafe { api::watch_fd(ch.fd(), on_conn_events, std::ptr::null_mut()) } {
        return Err(VerbsError::with("EventLoopAdd(connection CM channel)", libc::EINVAL));
    }
    Ok(CONN_EVENTS.get_or_init(|| ch))
}

/// Explains a failure to set up RDMA in terms an operator can act on.
fn explain(e: &VerbsError, addr: Option<&SocketAddr>) -> String {
    let what = match addr {
        Some(a) => format!("RDMA listener on {a}: {e}"),
        None => format!("RDMA: {e}"),
    };
    let hint = match (e.what, e.errno) {
        ("rdma_create_event_channel", libc::ENODEV | libc::ENOENT) => {
            "/dev/infiniband/rdma_cm is missing: load the rdma_ucm kernel module (modprobe rdma_ucm) and check that the server may open the device".to_string()
        }
        ("rdma_bind_addr", libc::EADDRNOTAVAIL | libc::ENODEV | libc::EINVAL) => {
            "the address is not on an RDMA device: bind to the IP of a netdev that `rdma link` lists (RoCE/IPoIB), or use rdma-bind *".to_string()
        }
        ("rdma_bind_addr", libc::EADDRINUSE) => "another process listens for RDMA on this port: choose another rdma-port".to_string(),
        (_, libc::EACCES | libc::EPERM) => "permission denied: run the server as a user that may use /dev/infiniband".to_string(),
        _ => String::new(),
    };
    if hint.is_empty() {
        what
    } else {
        format!("{what} ({hint})")
    }
}

/// Whether the host has any RDMA device; logs why not.
fn check_devices() -> bool {
    let Ok(l) = verbs::lib() else { return false };
    let mut n = 0;
    // SAFETY: the list is freed right away; only the count is used.
    unsafe {
        let list = (l.ibv_get_device_list)(&mut n);
        if !list.is_null() {
            (l.ibv_free_device_list)(list);
        }
    }
    if n == 0 {
        let in_sysfs: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if in_sysfs.is_empty() {
            log::warn!(
                "RDMA: no RDMA device found: load the driver of your NIC, or create a Soft-RoCE device (rdma link add rxe0 type rxe netdev IFACE), then restart"
            );
        } else {
            log::warn!(
                "RDMA: the kernel has RDMA devices ({}) but this process cannot open them: /dev/infiniband is missing or not accessible; load the user-space access modules (modprobe ib_uverbs; modprobe rdma_ucm) and check the permissions of /dev/infiniband/*",
                in_sysfs.join(", ")
            );
        }
    }
    n > 0
}

/// Locked memory one client pins: RX + TX buffers, control slots, guard pages.
fn pinned_per_client() -> u64 {
    // upstream clients offer the default RX size, which our TX buffer mirrors
    crate::verbs::pinned_bytes(global().settings.rx_size, crate::protocol::DEFAULT_RX_SIZE)
}

fn warn_if_memlock_low() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return;
    }
    let need = pinned_per_client();
    if lim.rlim_cur < need * 16 {
        log::warn!(
            "RDMA: the locked-memory limit (ulimit -l) is {} KiB and each RDMA client pins about {} KiB: without CAP_IPC_LOCK only {} clients fit; raise `ulimit -l` (LimitMEMLOCK= for systemd)",
            lim.rlim_cur / 1024,
            need / 1024,
            lim.rlim_cur / need
        );
    }
}

fn bind_list(listener: &ConnListener) -> Result<Vec<BindAddr>, String> {
    let mut names = Vec::new();
    for i in 0..listener.bindaddr_count.max(0) as usize {
        // SAFETY: the server keeps `bindaddr_count` valid C strings in `bindaddr`.
        let s = unsafe { CStr::from_ptr(*listener.bindaddr.add(i)) };
        names.push(s.to_string_lossy().into_owned());
    }
    BindAddr::parse_list(&names)
}

/// The addresses used when `rdma-bind` is empty, as C strings for `connListener.bindaddr`.
struct DefaultBinds([*const std::ffi::c_char; 2]);
// SAFETY: pointers to immutable static C strings.
unsafe impl Sync for DefaultBinds {}
static DEFAULT_BINDS: DefaultBinds = DefaultBinds([c"*".as_ptr(), c"-::*".as_ptr()]);

/// `ct->listen`. Idempotent: called again for a listener that already listens on the
/// same addresses (the server's `initListeners` after a module-argument CONFIG SET, or
/// a config rollback), it keeps the existing endpoints.
pub fn listen(listener: &mut ConnListener) -> c_int {
    if listener.bindaddr_count == 0 {
        // The server prints `bindaddr[i]` for every listening fd (INFO, logs): with an
        // empty rdma-bind it must name the defaults we listen on (upstream does the same).
        listener.bindaddr = DEFAULT_BINDS.0.as_ptr().cast_mut().cast();
        listener.bindaddr_count = DEFAULT_BINDS.0.len() as c_int;
    }
    let binds = match bind_list(listener) {
        Ok(b) => b,
        Err(e) => {
            log::warn!("RDMA: {e}");
            return C_ERR;
        }
    };
    let port = listener.port as u16;
    let wanted: Vec<SocketAddr> = binds.iter().map(|b| SocketAddr::new(b.ip, port)).collect();
    if listener.count > 0 {
        let current = current_addrs(listener);
        if wanted.iter().filter(|a| !binds_optional(&binds, a)).all(|a| current.contains(a)) && !current.is_empty() {
            return C_OK;
        }
        close_listener(listener);
    }
    if verbs::lib().is_err() || !check_devices() {
        return C_ERR;
    }
    warn_if_memlock_low();
    if let Err(e) = conn_events() {
        log::warn!("{}", explain(&e, None));
        return C_ERR;
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
                return C_ERR; // `made` drops here: nothing half-open is left behind
            }
        }
    }
    if made.is_empty() {
        log::warn!("RDMA: none of the bind addresses could be used; set rdma-bind to an address of an RDMA device");
        return C_ERR;
    }
    let mut reg = lock(&LISTENING);
    let reg = reg.get_or_insert_with(HashMap::new);
    listener.count = made.len() as c_int;
    for (i, ep) in made.into_iter().enumerate() {
        listener.fd[i] = ep.channel.fd();
        log::info!("RDMA: listening on {}", ep.addr);
        reg.insert(ep.channel.fd(), ep);
    }
    C_OK
}

fn binds_optional(binds: &[BindAddr], a: &SocketAddr) -> bool {
    binds.iter().any(|b| b.optional && b.ip == a.ip())
}

fn current_addrs(listener: &ConnListener) -> Vec<SocketAddr> {
    let reg = lock(&LISTENING);
    (0..listener.count.max(0) as usize).filter_map(|i| reg.as_ref()?.get(&listener.fd[i]).map(|e| e.addr)).collect()
}

fn open_endpoint(addr: &SocketAddr) -> Result<ListenEndpoint, VerbsError> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    if addr.is_ipv6() {
        id.set_afonly()?;
    }
    id.bind(addr)?;
    id.listen(511)?;
    Ok(ListenEndpoint { _id: id, channel, addr: *addr })
}

/// `ct->closeListener`: unregister the fds from the event loop (the server registered
/// them) and release the endpoints. Live connections are not affected.
pub fn close_listener(listener: &mut ConnListener) {
    let el = symbols::event_loop();
    let mut reg = lock(&LISTENING);
    for i in 0..listener.count.max(0) as usize {
        let fd = listener.fd[i];
        let Some(ep) = reg.as_mut().and_then(|r| r.remove(&fd)) else { continue };
        if el.is_null() {
            log::debug!("RDMA: listener fd {fd} kept open until the server's event loop is known");
            lock(&RETIRED).get_or_insert_with(HashMap::new).insert(fd, ep.clone());
        } else {
            // SAFETY: `el` is server.el (validated); the fd was registered by the server.
            unsafe { (symbols::get().ae_delete_file_event)(el, fd, AE_READABLE) };
        }
        log::info!("RDMA: stopped listening on {}", ep.addr);
        listener.fd[i] = -1;
    }
    listener.count = 0;
}

/// `ct->accept_handler`: a listener channel has CM events (connect requests).
///
/// # Safety
/// `el` must be the server's event loop, as the accept handler receives it.
pub unsafe fn on_listener_events(el: *mut c_void, fd: c_int) {
    symbols::remember_event_loop(el);
    if let Some(retired) = lock(&RETIRED).as_mut().and_then(|r| r.remove(&fd)) {
        // Now the loop is known: unwatch, then close (rejecting what is queued on it).
        // SAFETY: `el` is the server's loop, which watches this fd.
        unsafe { (symbols::get().ae_delete_file_event)(el, fd, AE_READABLE) };
        drop(retired);
        return;
    }
    let Some(ep) = lock(&LISTENING).as_ref().and_then(|r| r.get(&fd).cloned()) else { return };
    for _ in 0..global().accepts_per_cycle {
        let event = match ep.channel.next_event() {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                log::warn!("RDMA: {}", explain(&e, Some(&ep.addr)));
                return;
            }
        };
        let (kind, id) = (event.kind(), event.id());
        // Ack before acting: migrating or destroying an id waits for its acks.
        drop(event);
        if kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST {
            accept_one(id);
        } else {
            log::debug!("RDMA: unexpected event {} on the listener for {}", verbs::event_name(kind), ep.addr);
        }
    }
}

fn accept_one(raw_id: *mut rdma_sys::rdma_cm_id) {
    // SAFETY: a CONNECT_REQUEST's id is new and ours to destroy; dropping it without
    // accepting rejects the request.
    let Some(id) = (unsafe { CmId::from_raw(raw_id) }) else { return };
    let peer = id.peer_addr();
    let conn_channel = match conn_events() {
        Ok(ch) => ch,
        Err(e) => return log::warn!("{}", explain(&e, None)),
    };
    if let Err(e) = id.migrate(conn_channel) {
        return log::warn!("RDMA: client {peer:?} refused: {e}");
    }
    let g = global();
    let cfg =
        EndpointConfig { rx_size: g.settings.rx_size, comp_vector: g.settings.comp_vector, reject_on_failure: true };
    let ep = match Endpoint::new(id, &cfg) {
        Ok(ep) => ep,
        Err(e) => {
            let hint = if e.what == "ibv_reg_mr" && e.errno == libc::ENOMEM {
                " (the locked-memory limit is too low: raise `ulimit -l`, or LimitMEMLOCK= for systemd, to at least 4 MiB per client, or lower rdma-rx-size)"
            } else {
                ""
            };
            return log::warn!("RDMA: client {} refused: {e}{hint}", peer.map_or("?".into(), |p| p.to_string()));
        }
    };
    let ty = crate::transport::conntype::connection_type_ptr();
    let conn = Box::into_raw(RdmaConnection::new(ep, ty));
    // SAFETY: `conn` was just allocated and is not shared yet.
    let c = unsafe { &*conn };
    c.set_cm_context();
    // SAFETY: all-zero is a valid rdma_conn_param (no private data).
    let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    // Upstream leaves 0 here; 7 ("retry forever") makes a client that briefly outruns
    // our posted receives wait instead of failing its QP.
    param.rnr_retry_count = 7;
    if let Err(e) = c.accept_cm(&mut param) {
        log::warn!("RDMA: client {} refused: {e}", c.peer_name());
        // SAFETY: never registered anywhere; nobody else holds the pointer.
        unsafe { close(conn) };
        return;
    }
    // SAFETY: `conn` stays allocated until close(), which unwatches the fd first.
    if !unsafe { api::watch_fd(c.conn.fd, crate::transport::connection::on_completion_fd, conn.cast()) } {
        log::warn!("RDMA: client {} refused: cannot watch its completion channel", c.peer_name());
        // SAFETY: not live and not watched: nobody else holds the pointer.
        unsafe { close(conn) };
        return;
    }
    // Live from here: close() unwatches the fd. (The callback can only run from the
    // event loop, on this thread, after we return.)
    live_insert(ConnPtr(conn));
    log::debug!("RDMA: accepted {} (completion vector {})", c.peer_name(), c.comp_vector());
    let mut ip = [0 as std::ffi::c_char; 64];
    // SAFETY: the server takes over the connection (it may close it inside); we do not
    // touch `conn` after this call. ClientFlags are zero; `ip` is unused by the server.
    unsafe { (symbols::get().accept_common_handler)(conn.cast(), 0, 0, ip.as_mut_ptr()) };
}

/// The connections' CM channel is readable: ESTABLISHED, DISCONNECTED, …
unsafe extern "C" fn on_conn_events(_fd: c_int, _data: *mut c_void, _mask: c_int) {
    crate::transport::conntype::guard((), || {
        let Some(ch) = CONN_EVENTS.get() else { return };
        for _ in 0..256 {
            let event = match ch.next_event() {
                Ok(Some(e)) => e,
                Ok(None) => return,
                Err(e) => return log::warn!("RDMA: {e}"),
            };
            let (kind, id) = (event.kind(), event.id());
            drop(event); // ack first (see on_listener_events)
            let conn = (*id).context.cast::<RdmaConnection>();
            if conn.is_null() || !is_live(ConnPtr(conn)) {
                continue;
            }
            match kind {
                ev::RDMA_CM_EVENT_ESTABLISHED => (*conn).on_established(),
                ev::RDMA_CM_EVENT_DISCONNECTED
                | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT
                | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
                | ev::RDMA_CM_EVENT_CONNECT_ERROR
                | ev::RDMA_CM_EVENT_UNREACHABLE
                | ev::RDMA_CM_EVENT_REJECTED
                | ev::RDMA_CM_EVENT_ADDR_CHANGE => (*conn).on_disconnected(),
                _ => {}
            }
            queue_if_due(conn);
        }
    })
}

/// Every [`crate::protocol::KEEPALIVE_MS`]: a Keepalive to every established client
/// (upstream sends them; clients only re-post the receive).
///
/// # Safety
/// Called by the server's timer with a live module context, on the main thread.
pub unsafe extern "C" fn keepalive_tick(ctx: *mut api::Ctx, _data: *mut c_void) {
    crate::transport::conntype::guard((), || {
        for c in live_snapshot() {
            (*c.0).send_keepalive();
            queue_if_due(c.0);
        }
        api::start_timer(ctx, crate::protocol::KEEPALIVE_MS as i64, keepalive_tick);
    })
}
