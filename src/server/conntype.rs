//! The `ConnectionType` table handed to `connTypeRegister` and the `extern "C"`
//! functions in it: the only place where the server's raw pointers become references.
//! Each function runs inside [`guard`] and forwards to a [`Transport`], which is
//! safe code (`crate::transport`); the table is generic over it, so this edge does not
//! depend on the transport and the transport holds no `unsafe`.
//!
//! Panics: the release profile unwinds (Cargo.toml), so [`guard`] can catch one: it is
//! logged and the call fails; with `panic = "abort"` the first bug would take the
//! server down.

use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::abi::*;
use super::api;
use super::host::{Hosted, ServerHandler};
use crate::protocol::conn::Postpone;

/// What a connection type implements, in safe code. The edge calls it from the
/// server's callbacks with references it has made valid (docs/server-abi.md §4).
pub(crate) trait Transport: Sized + Send + Sync + 'static {
    /// `ct->listen`: true when it listens on every required address.
    fn listen(l: &mut ConnListener) -> bool;
    /// `ct->closeListener`.
    fn close_listener(l: &mut ConnListener);
    /// A listener fd is readable (`ct->accept_handler`).
    fn on_listener_fd(fd: c_int);
    /// A fd watched with [`watch_fd`] is readable; `key` is what was passed there.
    fn on_watched_fd(key: usize);
    /// The module's periodic timer, ten firings per keepalive period
    /// ([`crate::protocol::keepalive`]); true when this firing began a period.
    fn on_timer() -> bool;
    /// (peer, local) addresses.
    fn addrs(c: &Hosted<Self>) -> (Option<SocketAddr>, Option<SocketAddr>);
    /// `ct->shutdown`.
    fn shutdown(c: &Hosted<Self>);
    /// `ct->close`; the server's reference is dropped right after.
    fn close(c: &Arc<Hosted<Self>>);
    /// `ct->accept`: ACCEPTING → CONNECTED, then the accept handler
    /// ([`ServerHandler::Accept`]). False: C_ERR (the handler closed it, or it is gone).
    fn accept(c: &Arc<Hosted<Self>>) -> bool;
    /// `read`: `None` is -1 (the state tells EAGAIN, EOF or error).
    fn read(c: &Hosted<Self>, buf: &mut [u8]) -> Option<usize>;
    /// `write`/`writev`: `None` is -1; `Some(0)`: nothing taken now.
    fn write(c: &Hosted<Self>, parts: &[&[u8]]) -> Option<usize>;
    /// After `set_read_handler`/`set_write_handler`: which are installed now.
    fn handlers_changed(c: &Arc<Hosted<Self>>, read: bool, write: bool, barrier: bool);
    fn has_pending() -> bool;
    /// Runs the pending list once; how many connections ran.
    fn process_pending() -> usize;
    /// `postpone_update_state` (any thread).
    fn postpone(c: &Hosted<Self>, mask: Postpone);
    /// `update_state`.
    fn update_state(c: &Arc<Hosted<Self>>);
    /// The fields of the module's INFO section (`INFO rdma`).
    fn info() -> Vec<api::InfoField>;
}

/// Runs `f`; a panic is logged and turned into `default`.
#[inline(always)]
pub(crate) fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            report_panic(p);
            default
        }
    }
}

/// Out of line: the log line's formatting would otherwise give every callback that the
/// server calls per request the stack frame and register saves it needs.
#[cold]
#[inline(never)]
fn report_panic(p: Box<dyn std::any::Any + Send>) {
    let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
    log::error!("RDMA: internal error: {}", msg.unwrap_or_else(|| "panic".into()));
}

// ----- fork children ---------------------------------------------------------------

/// Set in a fork child (BGSAVE, AOF rewrite, the forked script debugger): verbs objects
/// are not usable there (their memory is not inherited with `ibv_fork_init`), and the
/// kernel objects behind them are the parent's (the child shares its rdma_cm and
/// uverbs files, so destroying a QP or an id there destroys the parent's). Every call
/// refuses or does nothing; nothing is freed (docs/server-abi.md §4.6).
static IN_FORK_CHILD: AtomicBool = AtomicBool::new(false);

fn in_fork_child() -> bool {
    IN_FORK_CHILD.load(Ordering::Relaxed)
}

extern "C" fn after_fork_in_child() {
    IN_FORK_CHILD.store(true, Ordering::Relaxed);
}

// ----- the table -------------------------------------------------------------------

/// Builds the table for `abi` with `T` behind it and registers it (`connTypeRegister`,
/// which calls `init` at once).
pub(crate) fn register<T: Transport>(abi: Abi) -> Result<(), String> {
    macro_rules! table {
        ($get_type:expr, $connect:expr, $postpone:expr, $tail:expr) => {
            ConnectionType {
                get_type: Some($get_type),
                init: Some(init),
                cleanup: None,
                configure: Some(configure),
                ae_handler: Some(ae_handler::<T>),
                accept_handler: Some(accept_handler::<T>),
                addr: Some(addr::<T>),
                is_local: Some(is_local::<T>),
                listen: Some(listen::<T>),
                close_listener: Some(close_listener::<T>),
                conn_create: Some(conn_create),
                conn_create_accepted: Some(conn_create_accepted),
                shutdown: Some(shutdown::<T>),
                close: Some(close::<T>),
                connect: Some($connect),
                blocking_connect: Some(blocking_connect),
                accept: Some(accept::<T>),
                write: Some(write::<T>),
                writev: Some(writev::<T>),
                read: Some(read::<T>),
                set_write_handler: Some(set_write_handler::<T>),
                set_read_handler: Some(set_read_handler::<T>),
                get_last_error: Some(get_last_error::<T>),
                sync_write: Some(sync_io),
                sync_read: Some(sync_io),
                sync_readline: Some(sync_io),
                has_pending_data: Some(has_pending_data::<T>),
                process_pending_data: Some(process_pending_data::<T>),
                postpone_update_state: Some($postpone),
                update_state: Some(update_state::<T>),
                tail: $tail,
            }
        };
    }
    // One table for the life of the process (the server keeps the pointer).
    fn leak<C>(table: C) -> *const c_void {
        (Box::leak(Box::new(table)) as *const C).cast()
    }
    let table: *const c_void = match abi {
        Abi::V8_1 => leak::<ConnectionType81>(table!(
            get_type_81,
            connect_81,
            postpone_update_state::<T, false>,
            Tail81 { get_peer_cert: None, conn_integrity_checked: None }
        )),
        Abi::V9_1_0 => leak::<ConnectionType910>(table!(
            get_type_9,
            connect_9,
            postpone_update_state::<T, false>,
            Tail910 { get_peer_cert: None, get_peer_user: None, conn_integrity_checked: None }
        )),
        // `sync_handlers_in_update_state = 0`: our `update_state` only queues work for
        // `process_pending_data`, it never runs handlers itself.
        Abi::V9_1_2 => leak::<ConnectionType912>(table!(
            get_type_9,
            connect_9,
            postpone_update_state::<T, true>,
            Tail912 {
                sync_handlers_in_update_state: 0,
                get_peer_cert: None,
                get_peer_user: None,
                conn_integrity_checked: None
            }
        )),
    };
    super::host::set_registered(table as usize)?;
    // SAFETY: the table has the layout of this server version (`abi`) and lives forever.
    if unsafe { (super::symbols::get().conn_type_register)(table) } != 0 {
        return Err("connTypeRegister refused the rdma connection type (is valkey-rdma.so loaded too?)".into());
    }
    Ok(())
}

/// Watches `fd` in the server's event loop; [`Transport::on_watched_fd`] gets `key`.
pub(crate) fn watch_fd<T: Transport>(fd: c_int, key: usize) -> Option<api::FdWatch> {
    // SAFETY: `key` is passed back as an integer, never dereferenced.
    unsafe { api::watch_fd(fd, watched_fd::<T>, key as *mut c_void) }
}

unsafe extern "C" fn watched_fd<T: Transport>(_fd: c_int, data: *mut c_void, _mask: c_int) {
    guard((), || T::on_watched_fd(data as usize))
}

/// Registers the module's INFO section (`INFO rdma`, also in `INFO modules` and
/// `INFO everything`); its fields come from [`Transport::info`].
pub(crate) fn register_info<T: Transport>(ctx: &api::LoadCtx) -> Result<(), String> {
    ctx.register_info(info::<T>)
}

unsafe extern "C" fn info<T: Transport>(ictx: *mut api::InfoCtx, _for_crash_report: c_int) {
    guard((), || {
        // SAFETY: the server's info context, live for this callback.
        let w = unsafe { api::InfoWriter::new(ictx) };
        if w.section() {
            for f in T::info() {
                w.field(&f);
            }
        }
    })
}

/// Starts the module's periodic tick ([`Transport::on_timer`] every `ms`): a timerfd in
/// the event loop rather than a module timer, because the server refuses MODULE UNLOAD
/// of a module that holds a timer with a reason of its own ("stop the timer"), before it
/// asks the module, which refuses with the real one (docs/server-abi.md §4.6).
pub(crate) fn start_timer<T: Transport>(ms: u64) -> Result<(), String> {
    // SAFETY: no pointers; the fd is owned by the tick for the life of the process.
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("timerfd_create: {}", std::io::Error::last_os_error()));
    }
    let period = libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) * 1_000_000) as _ };
    let spec = libc::itimerspec { it_interval: period, it_value: period };
    // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
    if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } != 0 {
        return Err(format!("timerfd_settime: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the callback takes no data pointer.
    // (watched for the life of the process: the token is not kept)
    if unsafe { api::watch_fd(fd, tick::<T>, std::ptr::null_mut()) }.is_some() {
        Ok(())
    } else {
        Err("the server's event loop refused the module's timer fd".into())
    }
}

unsafe extern "C" fn tick<T: Transport>(fd: c_int, _data: *mut c_void, _mask: c_int) {
    let mut expirations = 0u64;
    // SAFETY: reads the 8-byte expiration count of our non-blocking timerfd.
    unsafe { libc::read(fd, (&raw mut expirations).cast(), 8) };
    guard((), || {
        // The server's loglevel is asked once per period: asking it (a CONFIG GET
        // through the module API) costs more than the rest of a firing.
        if !in_fork_child() && T::on_timer() {
            api::follow_server_loglevel();
        }
    });
}

// ----- the callbacks ---------------------------------------------------------------
//
// SAFETY (for every `Hosted::from_server`/`arc_from_server` below): the server calls
// these with the pointer it got from `Hosted::hand_to_server` (we create every
// connection of this type) and does not use it after `close`, which releases it.

unsafe extern "C" fn get_type_81(_: *mut Connection) -> *const c_char {
    CONN_TYPE_RDMA_NAME.as_ptr()
}
unsafe extern "C" fn get_type_9() -> c_int {
    CONN_TYPE_RDMA_ID
}

unsafe extern "C" fn init() {
    if let Err(errno) = crate::verbs::fork_init() {
        log::warn!(
            "RDMA: ibv_fork_init failed ({}): fork children (BGSAVE, AOF rewrite) share the pages RDMA writes into; check the rdma-core installation",
            std::io::Error::from_raw_os_error(errno)
        );
    }
    // SAFETY: registers a handler that only stores an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
}

unsafe extern "C" fn configure(_priv: *mut c_void, _reconfigure: c_int) -> c_int {
    C_OK
}

unsafe extern "C" fn accept_handler<T: Transport>(el: *mut c_void, fd: c_int, _data: *mut c_void, _mask: c_int) {
    guard((), || {
        super::symbols::remember_event_loop(el);
        T::on_listener_fd(fd)
    })
}

unsafe extern "C" fn ae_handler<T: Transport>(_el: *mut c_void, _fd: c_int, data: *mut c_void, _mask: c_int) {
    guard((), || T::on_watched_fd(data as usize))
}

unsafe extern "C" fn addr<T: Transport>(
    c: *mut Connection,
    ip: *mut c_char,
    ip_len: usize,
    port: *mut c_int,
    remote: c_int,
) -> c_int {
    guard(C_ERR, || {
        // SAFETY: see above.
        let (peer, local) = T::addrs(unsafe { Hosted::<T>::from_server(c) });
        let Some(a) = (if remote != 0 { peer } else { local }) else { return C_ERR };
        if !ip.is_null() && ip_len > 0 {
            let s = a.ip().to_string();
            let n = s.len().min(ip_len - 1);
            // SAFETY: the server passes `ip_len` writable bytes at `ip`; n + 1 <= ip_len.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), ip.cast(), n);
                *ip.add(n) = 0;
            }
        }
        if !port.is_null() {
            // SAFETY: a live int of the server's.
            unsafe { *port = a.port() as c_int };
        }
        C_OK
    })
}

/// Protected mode: like upstream, a client is local when it comes from the server's own
/// address (RDMA cannot use loopback), or from a loopback address.
unsafe extern "C" fn is_local<T: Transport>(c: *mut Connection) -> c_int {
    // SAFETY: see above.
    guard(0, || match T::addrs(unsafe { Hosted::<T>::from_server(c) }) {
        (Some(p), Some(l)) => (p.ip() == l.ip() || p.ip().is_loopback()) as c_int,
        _ => 0,
    })
}

unsafe extern "C" fn listen<T: Transport>(l: *mut ConnListener) -> c_int {
    // SAFETY: the server passes its live listener, used only during the call.
    guard(C_ERR, || if !in_fork_child() && T::listen(unsafe { &mut *l }) { C_OK } else { C_ERR })
}

unsafe extern "C" fn close_listener<T: Transport>(l: *mut ConnListener) {
    guard((), || {
        if !in_fork_child() {
            // SAFETY: as for listen: the server's live listener, used only during the call.
            T::close_listener(unsafe { &mut *l })
        }
    })
}

unsafe extern "C" fn conn_create() -> *mut Connection {
    std::ptr::null_mut() // outgoing RDMA connections are never made by the server
}

unsafe extern "C" fn conn_create_accepted(_fd: c_int, _priv: *mut c_void) -> *mut Connection {
    std::ptr::null_mut() // we create accepted connections ourselves, in the accept handler
}

unsafe extern "C" fn shutdown<T: Transport>(c: *mut Connection) {
    guard((), || {
        if !in_fork_child() {
            // SAFETY: `c` is a connection this type handed to the server, not yet closed.
            T::shutdown(unsafe { Hosted::<T>::from_server(c) })
        }
    })
}

unsafe extern "C" fn close<T: Transport>(c: *mut Connection) {
    guard((), || {
        if in_fork_child() {
            return; // the parent's connection: nothing of it is released here
        }
        // SAFETY: see above; our own reference keeps it alive through T::close.
        let conn = unsafe { Hosted::<T>::arc_from_server(c) };
        T::close(&conn);
        // SAFETY: the server's reference, released once: it does not use `c` after close.
        unsafe { Hosted::<T>::release(c) };
    })
}

unsafe extern "C" fn connect_81(
    _: *mut Connection,
    _: *const c_char,
    _: c_int,
    _: *const c_char,
    _: ConnHandler,
) -> c_int {
    C_ERR
}
unsafe extern "C" fn connect_9(
    _: *mut Connection,
    _: *const c_char,
    _: c_int,
    _: *const c_char,
    _: c_int,
    _: ConnHandler,
) -> c_int {
    C_ERR
}
unsafe extern "C" fn blocking_connect(_: *mut Connection, _: *const c_char, _: c_int, _: c_longlong) -> c_int {
    C_ERR
}

/// `connAccept`: ACCEPTING → CONNECTED, then the server's accept handler; C_ERR if it
/// closed the connection (the caller then frees the client).
unsafe extern "C" fn accept<T: Transport>(c: *mut Connection, handler: ConnHandler) -> c_int {
    guard(C_ERR, || {
        if in_fork_child() {
            return C_ERR;
        }
        // SAFETY: see above.
        let conn = unsafe { Hosted::<T>::arc_from_server(c) };
        conn.install(ServerHandler::Accept, handler, None);
        if T::accept(&conn) {
            C_OK
        } else {
            C_ERR
        }
    })
}

unsafe extern "C" fn write<T: Transport>(c: *mut Connection, data: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        if len == 0 {
            return 0;
        }
        if in_fork_child() {
            return -1;
        }
        // SAFETY: the server passes `len` readable bytes at `data`.
        let buf = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        // SAFETY: see above.
        T::write(unsafe { Hosted::<T>::from_server(c) }, &[buf]).map_or(-1, |n| n as c_int)
    })
}

/// One RDMA write for all the iovecs (upstream posts one per iovec).
unsafe extern "C" fn writev<T: Transport>(c: *mut Connection, iov: *const libc::iovec, iovcnt: c_int) -> c_int {
    guard(-1, || {
        if in_fork_child() {
            return -1;
        }
        // SAFETY: the server passes `iovcnt` iovecs, each `iov_len` readable bytes.
        let iov = unsafe { std::slice::from_raw_parts(iov, iovcnt.max(0) as usize) };
        // SAFETY: as above.
        let as_slice = |v: &libc::iovec| unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
        // The server passes up to IOV_MAX iovecs; the common small case stays on the stack.
        let mut small: [&[u8]; 32] = [&[]; 32];
        let heap: Vec<&[u8]>;
        let parts: &[&[u8]] = if iov.len() <= small.len() {
            for (dst, v) in small.iter_mut().zip(iov) {
                *dst = as_slice(v);
            }
            &small[..iov.len()]
        } else {
            heap = iov.iter().map(as_slice).collect();
            &heap
        };
        if parts.iter().all(|p| p.is_empty()) {
            return 0;
        }
        // SAFETY: see above.
        T::write(unsafe { Hosted::<T>::from_server(c) }, parts).map_or(-1, |n| n as c_int)
    })
}

/// -1 with the state still CONNECTED means "nothing to read now"; RDMA never returns 0.
unsafe extern "C" fn read<T: Transport>(c: *mut Connection, buf: *mut c_void, len: usize) -> c_int {
    guard(-1, || {
        if len == 0 {
            return 0;
        }
        // SAFETY: the server passes `len` writable bytes at `buf`.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        // SAFETY: see above.
        let got = if in_fork_child() { None } else { T::read(unsafe { Hosted::<T>::from_server(c) }, buf) };
        match got {
            Some(n) => n as c_int,
            None => {
                // SAFETY: errno of this thread.
                unsafe { *libc::__errno_location() = libc::EAGAIN };
                -1
            }
        }
    })
}

unsafe extern "C" fn set_write_handler<T: Transport>(c: *mut Connection, h: ConnHandler, barrier: c_int) -> c_int {
    guard(C_ERR, || {
        if in_fork_child() {
            return C_ERR;
        }
        // SAFETY: see above.
        let conn = unsafe { Hosted::<T>::arc_from_server(c) };
        conn.install(ServerHandler::Write, h, Some(barrier != 0));
        // SAFETY: see above (a shared read of the handler field, main thread).
        let read = unsafe { (*c).read_handler.is_some() };
        T::handlers_changed(&conn, read, h.is_some(), barrier != 0);
        C_OK
    })
}

unsafe extern "C" fn set_read_handler<T: Transport>(c: *mut Connection, h: ConnHandler) -> c_int {
    guard(C_ERR, || {
        if in_fork_child() {
            return C_ERR;
        }
        // SAFETY: see above.
        let conn = unsafe { Hosted::<T>::arc_from_server(c) };
        conn.install(ServerHandler::Read, h, None);
        // SAFETY: see above.
        let (write, barrier) = unsafe { ((*c).write_handler.is_some(), (*c).flags & CONN_FLAG_WRITE_BARRIER != 0) };
        T::handlers_changed(&conn, h.is_some(), write, barrier);
        C_OK
    })
}

unsafe extern "C" fn get_last_error<T: Transport>(c: *mut Connection) -> *const c_char {
    guard(c"internal error".as_ptr(), || {
        // SAFETY: see above.
        let errno = unsafe { Hosted::<T>::from_server(c) }.last_errno();
        // SAFETY: strerror returns a string valid until the next call on this thread,
        // which is how the server uses it.
        unsafe { libc::strerror(errno) }
    })
}

unsafe extern "C" fn sync_io(_: *mut Connection, _: *mut c_char, _: isize, _: c_longlong) -> isize {
    -1 // only used on outgoing connections (replication, cluster bus), never RDMA
}

unsafe extern "C" fn has_pending_data<T: Transport>() -> c_int {
    guard(0, || (!in_fork_child() && T::has_pending()) as c_int)
}

unsafe extern "C" fn process_pending_data<T: Transport>() -> c_int {
    guard(0, || if in_fork_child() { 0 } else { T::process_pending() as c_int })
}

/// `MASK`: the table is 9.1.2's, whose second argument is a mask (a boolean before):
/// chosen when the table is built, so that the call, twice per request, does not ask.
unsafe extern "C" fn postpone_update_state<T: Transport, const MASK: bool>(c: *mut Connection, arg: c_int) {
    guard((), || {
        if in_fork_child() {
            return;
        }
        let abi = if MASK { Abi::V9_1_2 } else { Abi::V8_1 };
        let mask = Postpone::from_mask(abi.postpone_mask(arg));
        // SAFETY: see above.
        T::postpone(unsafe { Hosted::<T>::from_server(c) }, mask)
    })
}

/// After an IO thread finished with the client: queue whatever became due meanwhile.
unsafe extern "C" fn update_state<T: Transport>(c: *mut Connection) {
    guard((), || {
        if !in_fork_child() {
            // SAFETY: `c` is a connection this type handed to the server, not yet closed.
            T::update_state(&unsafe { Hosted::<T>::arc_from_server(c) })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::guard;

    #[test]
    fn a_panic_inside_the_guard_becomes_the_default_value() {
        assert_eq!(guard(7, || -> i32 { panic!("a bug") }), 7);
        assert_eq!(guard(7, || 8), 8);
    }
}
