//! The `ConnectionType` table handed to `connTypeRegister`, one static per layout, and
//! the `extern "C"` functions in it. Each forwards to `connection`/`listener` inside
//! [`guard`], so that a bug can never unwind into C: it is logged and the call fails.
//! The release profile unwinds (Cargo.toml) so that the guard can catch; with
//! `panic = "abort"` it could not, and the first bug would take the server down.

use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::connection::{self, call_handler, queue_if_due, RdmaConnection};
use super::{global, in_fork_child, listener, pending_len, pending_pop, ConnPtr};
use crate::server::abi::*;

/// Runs `f`; a panic is logged and turned into `default`.
pub fn guard<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        log::error!("RDMA: internal error: {}", msg.unwrap_or_else(|| "panic".into()));
        default
    })
}

fn rc(c: *mut Connection) -> *mut RdmaConnection {
    c.cast()
}

unsafe extern "C" fn get_type_81(_: *mut Connection) -> *const c_char {
    CONN_TYPE_RDMA_NAME.as_ptr()
}
unsafe extern "C" fn get_type_9() -> c_int {
    CONN_TYPE_RDMA_ID
}

unsafe extern "C" fn init() {
    // Keep registered memory out of fork children (BGSAVE): they must not share pages
    // the NIC writes into.
    if let Ok(l) = crate::verbs::lib() {
        (l.ibv_fork_init)();
    }
    super::install_fork_guard();
}

unsafe extern "C" fn configure(_priv: *mut c_void, _reconfigure: c_int) -> c_int {
    C_OK
}

unsafe extern "C" fn accept_handler(el: *mut c_void, fd: c_int, _data: *mut c_void, _mask: c_int) {
    guard((), || listener::on_listener_events(el, fd))
}

unsafe extern "C" fn ae_handler(_el: *mut c_void, fd: c_int, data: *mut c_void, mask: c_int) {
    connection::on_completion_fd(fd, data, mask)
}

unsafe extern "C" fn addr(
    c: *mut Connection,
    ip: *mut c_char,
    ip_len: usize,
    port: *mut c_int,
    remote: c_int,
) -> c_int {
    guard(C_ERR, || {
        let a = if remote != 0 { (*rc(c)).peer } else { (*rc(c)).local };
        let Some(a) = a else { return C_ERR };
        if !ip.is_null() && ip_len > 0 {
            let s = a.ip().to_string();
            let n = s.len().min(ip_len - 1);
            std::ptr::copy_nonoverlapping(s.as_ptr(), ip.cast(), n);
            *ip.add(n) = 0;
        }
        if !port.is_null() {
            *port = a.port() as c_int;
        }
        C_OK
    })
}

/// Protected mode: like upstream, a client is local when it comes from the server's own
/// address (RDMA cannot use loopback), or from a loopback address.
unsafe extern "C" fn is_local(c: *mut Connection) -> c_int {
    guard(0, || match ((*rc(c)).peer, (*rc(c)).local) {
        (Some(p), Some(l)) => (p.ip() == l.ip() || p.ip().is_loopback()) as c_int,
        _ => 0,
    })
}

unsafe extern "C" fn listen(l: *mut ConnListener) -> c_int {
    guard(C_ERR, || listener::listen(&mut *l))
}

unsafe extern "C" fn close_listener(l: *mut ConnListener) {
    guard((), || listener::close_listener(&mut *l))
}

unsafe extern "C" fn conn_create() -> *mut Connection {
    std::ptr::null_mut() // outgoing RDMA connections are never made by the server
}

unsafe extern "C" fn conn_create_accepted(_fd: c_int, _priv: *mut c_void) -> *mut Connection {
    std::ptr::null_mut() // we create accepted connections ourselves, in the accept handler
}

unsafe extern "C" fn shutdown(c: *mut Connection) {
    guard((), || (*rc(c)).disconnect())
}

unsafe extern "C" fn close(c: *mut Connection) {
    guard((), || connection::close(rc(c)))
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

/// `connAccept`: ACCEPTING → CONNECTED, then the server's accept handler under a
/// reference; C_ERR if it closed the connection (the caller then frees the client).
unsafe extern "C" fn accept(c: *mut Connection, handler: ConnHandler) -> c_int {
    guard(C_ERR, || {
        let r = rc(c);
        if (*r).state() != CONN_STATE_ACCEPTING {
            return C_ERR;
        }
        (*r).conn.state.store(CONN_STATE_CONNECTED, std::sync::atomic::Ordering::Release);
        if !call_handler(r, handler) {
            return C_ERR;
        }
        C_OK
    })
}

unsafe extern "C" fn write(c: *mut Connection, data: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        if len == 0 {
            return 0;
        }
        let buf = std::slice::from_raw_parts(data.cast::<u8>(), len);
        (*rc(c)).write(&[buf]).map_or(-1, |n| n as c_int)
    })
}

/// One RDMA write for all the iovecs (upstream posts one per iovec).
unsafe extern "C" fn writev(c: *mut Connection, iov: *const libc::iovec, iovcnt: c_int) -> c_int {
    guard(-1, || {
        let iov = std::slice::from_raw_parts(iov, iovcnt.max(0) as usize);
        let as_slice = |v: &libc::iovec| std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len);
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
        (*rc(c)).write(parts).map_or(-1, |n| n as c_int)
    })
}

/// -1 with the state still CONNECTED means "nothing to read now"; RDMA never returns 0.
unsafe extern "C" fn read(c: *mut Connection, buf: *mut c_void, len: usize) -> c_int {
    guard(-1, || {
        if len == 0 {
            return 0;
        }
        let buf = std::slice::from_raw_parts_mut(buf.cast::<u8>(), len);
        match (*rc(c)).read(buf) {
            Some(n) => n as c_int,
            None => {
                *libc::__errno_location() = libc::EAGAIN;
                -1
            }
        }
    })
}

unsafe extern "C" fn set_write_handler(c: *mut Connection, h: ConnHandler, barrier: c_int) -> c_int {
    guard(C_ERR, || {
        let r = rc(c);
        (*r).conn.write_handler = h;
        if barrier != 0 {
            (*r).conn.flags |= CONN_FLAG_WRITE_BARRIER;
        } else {
            (*r).conn.flags &= !CONN_FLAG_WRITE_BARRIER;
        }
        // RDMA has no POLLOUT: if the window is open the handler runs from
        // process_pending_data; if not, the completion that reopens it runs it.
        queue_if_due(r);
        C_OK
    })
}

unsafe extern "C" fn set_read_handler(c: *mut Connection, h: ConnHandler) -> c_int {
    guard(C_ERR, || {
        (*rc(c)).conn.read_handler = h;
        queue_if_due(rc(c));
        C_OK
    })
}

unsafe extern "C" fn get_last_error(c: *mut Connection) -> *const c_char {
    guard(c"internal error".as_ptr(), || libc::strerror((*c).last_errno.load(std::sync::atomic::Ordering::Acquire)))
}

unsafe extern "C" fn sync_io(_: *mut Connection, _: *mut c_char, _: isize, _: c_longlong) -> isize {
    -1 // only used on outgoing connections (replication, cluster bus), never RDMA
}

unsafe extern "C" fn has_pending_data() -> c_int {
    guard(0, || (pending_len() > 0) as c_int)
}

/// Runs the handlers of the queued connections, each at most once per call (a
/// connection queued again by its own handler waits for the next call).
unsafe extern "C" fn process_pending_data() -> c_int {
    guard(0, || {
        if in_fork_child() {
            return 0;
        }
        let mut processed = 0;
        for _ in 0..pending_len() {
            let Some(ConnPtr(c)) = pending_pop() else { break };
            if !super::is_live(ConnPtr(c)) {
                continue;
            }
            connection::run_pending(c);
            processed += 1;
        }
        processed
    })
}

unsafe extern "C" fn postpone_update_state(c: *mut Connection, arg: c_int) {
    guard((), || (*rc(c)).set_postpone(global().abi.postpone_mask(arg)))
}

/// After an IO thread finished with the client: queue whatever became due meanwhile.
unsafe extern "C" fn update_state(c: *mut Connection) {
    guard((), || queue_if_due(rc(c)))
}

macro_rules! connection_type {
    ($get_type:expr, $connect:expr, $tail:expr) => {
        ConnectionType {
            get_type: Some($get_type),
            init: Some(init),
            cleanup: None,
            configure: Some(configure),
            ae_handler: Some(ae_handler),
            accept_handler: Some(accept_handler),
            addr: Some(addr),
            is_local: Some(is_local),
            listen: Some(listen),
            close_listener: Some(close_listener),
            conn_create: Some(conn_create),
            conn_create_accepted: Some(conn_create_accepted),
            shutdown: Some(shutdown),
            close: Some(close),
            connect: Some($connect),
            blocking_connect: Some(blocking_connect),
            accept: Some(accept),
            write: Some(write),
            writev: Some(writev),
            read: Some(read),
            set_write_handler: Some(set_write_handler),
            set_read_handler: Some(set_read_handler),
            get_last_error: Some(get_last_error),
            sync_write: Some(sync_io),
            sync_read: Some(sync_io),
            sync_readline: Some(sync_io),
            has_pending_data: Some(has_pending_data),
            process_pending_data: Some(process_pending_data),
            postpone_update_state: Some(postpone_update_state),
            update_state: Some(update_state),
            tail: $tail,
        }
    };
}

static CT_81: ConnectionType81 =
    connection_type!(get_type_81, connect_81, Tail81 { get_peer_cert: None, conn_integrity_checked: None });
static CT_910: ConnectionType910 = connection_type!(
    get_type_9,
    connect_9,
    Tail910 { get_peer_cert: None, get_peer_user: None, conn_integrity_checked: None }
);
/// `sync_handlers_in_update_state = 0`: our `update_state` only queues work for
/// `process_pending_data`, it never runs handlers itself.
static CT_912: ConnectionType912 = connection_type!(
    get_type_9,
    connect_9,
    Tail912 {
        sync_handlers_in_update_state: 0,
        get_peer_cert: None,
        get_peer_user: None,
        conn_integrity_checked: None
    }
);

/// The table for the running server's layout.
pub fn connection_type_ptr() -> *const c_void {
    match global().abi {
        Abi::V8_1 => (&CT_81 as *const ConnectionType81).cast(),
        Abi::V9_1_0 => (&CT_910 as *const ConnectionType910).cast(),
        Abi::V9_1_2 => (&CT_912 as *const ConnectionType912).cast(),
    }
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
