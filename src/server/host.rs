//! The server's half of a connection: the C `struct connection` the server holds a
//! pointer to, kept at offset 0 of [`Hosted`], beside the connection type's own state.
//!
//! Ownership (docs/server-abi.md §4.4): a `Hosted` lives in an `Arc`. The server's
//! pointer is one strong reference, created by [`Hosted::hand_to_server`] and released
//! by `ct->close` (`conntype.rs`); the connection type's live set, pending list and every
//! running handler hold their own. A handler that closes its connection therefore
//! never frees memory under the caller's feet, and nothing outside this file and
//! `conntype.rs` ever turns the server's pointer back into a reference.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::abi::{ConnHandler, Connection, IOV_MAX};

/// The connection type table registered with the server (`conntype.rs`): the `type`
/// of every connection made here (its layout is the server's, and its functions know
/// it).
static REGISTERED: OnceLock<usize> = OnceLock::new();

/// Records the table `conntype::register` built (once).
pub(super) fn set_registered(table: usize) -> Result<(), String> {
    REGISTERED.set(table).map_err(|_| "the rdma connection type is registered already".to_string())
}

/// The registered table, null before registration.
fn table_ptr() -> *const c_void {
    REGISTERED.get().map_or(std::ptr::null(), |&t| t as *const c_void)
}

/// The server's handlers a connection type calls (connection.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerHandler {
    /// The handler passed to `ct->accept` (`conn_handler` while it runs).
    Accept,
    Read,
    Write,
}

/// `conn->state` values (connection.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnState {
    Accepting,
    Connected,
    Closed,
    Error,
}

impl ConnState {
    fn raw(self) -> i32 {
        use super::abi::*;
        match self {
            ConnState::Accepting => CONN_STATE_ACCEPTING,
            ConnState::Connected => CONN_STATE_CONNECTED,
            ConnState::Closed => CONN_STATE_CLOSED,
            ConnState::Error => CONN_STATE_ERROR,
        }
    }
}

/// The server's `struct connection` (first, so that the server's pointer is a pointer
/// to it) and the connection type's state `T`.
#[repr(C)]
pub(crate) struct Hosted<T> {
    raw: UnsafeCell<Connection>,
    /// The server's reference was given back (`ct->close`): a second close of the same
    /// connection, from inside a handler that holds its own reference, must not give
    /// it back again (docs/server-abi.md §4.6).
    released: AtomicBool,
    pub(crate) inner: T,
}

// SAFETY: the C struct is shared with the server. `state` and `last_errno` are atomics,
// read and written from any thread. The other fields (handlers, flags, refs,
// private_data) are written only on the main thread (by the server, e.g.
// connSetPrivateData, and by the `ct` callbacks the server makes there:
// set_*_handler, accept, close) and read there; IO threads only call read, write,
// writev and postpone_update_state, which do not touch them. `T` brings its own
// synchronisation (hence the bounds).
unsafe impl<T: Send + Sync> Sync for Hosted<T> {}
// SAFETY: as above; the struct holds no thread-bound data.
unsafe impl<T: Send + Sync> Send for Hosted<T> {}

impl<T> Hosted<T> {
    /// A connection of the registered type in state ACCEPTING, with an fd of its own.
    ///
    /// `conn->fd` is an eventfd that only this connection has and nothing reads: the
    /// server treats it as a socket (`connBlock` clears O_NONBLOCK on it, a fork child
    /// inherits it, `shutdown` and socket options are tried on it), and none of that
    /// may reach the completion channels the module polls (docs/server-abi.md §4.6).
    /// Fails when the process is out of file descriptors, as `accept` would for TCP.
    pub(crate) fn new(inner: T) -> std::io::Result<Arc<Self>> {
        // SAFETY: eventfd takes no pointers; the fd returned is owned by the new
        // connection and closed in Drop.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Hosted {
            raw: UnsafeCell::new(Connection {
                ty: table_ptr(),
                state: ConnState::Accepting.raw().into(),
                last_errno: 0.into(),
                fd,
                flags: 0,
                refs: 0,
                iovcnt: IOV_MAX,
                private_data: std::ptr::null_mut(),
                conn_handler: None,
                write_handler: None,
                read_handler: None,
            }),
            released: AtomicBool::new(false),
            inner,
        }))
    }

    /// The address the server knows the connection by: a key for lookups (fd
    /// callbacks, CM events), never dereferenced outside this module.
    pub(crate) fn key(&self) -> usize {
        self.raw.get() as usize
    }

    fn conn(&self) -> &Connection {
        // SAFETY: see the Sync impl: shared reads of the C struct; its atomics are
        // read through atomic operations, and the plain fields only on the main thread.
        unsafe { &*self.raw.get() }
    }

    /// Publishes the state the server sees, the errno first: a thread that sees ERROR
    /// also sees why (never "Success").
    pub(crate) fn publish(&self, state: ConnState, errno: i32) {
        let c = self.conn();
        if errno != 0 {
            c.last_errno.store(errno, Ordering::Release);
        }
        c.state.store(state.raw(), Ordering::Release);
    }

    pub(crate) fn last_errno(&self) -> i32 {
        self.conn().last_errno.load(Ordering::Acquire)
    }

    /// Calls the server's handler `which` with this connection, if one is installed
    /// (main thread). `refs` is raised around it, as connhelpers.h `callHandler` does.
    /// The handler may call back into the connection type and close the connection:
    /// the caller holds an `Arc`, so the memory outlives the call.
    pub(crate) fn call(&self, which: ServerHandler) {
        let raw = self.raw.get();
        // SAFETY: main thread (see the Sync impl). The handler pointer was installed by
        // the server for this connection and is called with the pointer the server
        // knows it by, which stays valid for the whole call (the caller's Arc).
        unsafe {
            let h: ConnHandler = match which {
                ServerHandler::Accept => (*raw).conn_handler,
                ServerHandler::Read => (*raw).read_handler,
                ServerHandler::Write => (*raw).write_handler,
            };
            if let Some(h) = h {
                (*raw).refs += 1;
                h(raw);
                (*raw).refs -= 1;
            }
        }
    }

    /// Hands the accepted connection to the server (`acceptCommonHandler`), which
    /// keeps the pointer, and with it one strong reference, until `ct->close`. The
    /// server may close it inside; the caller must not assume it is still open.
    pub(crate) fn hand_to_server(self: Arc<Self>) {
        let c: *mut Connection = Arc::into_raw(self).cast_mut().cast();
        let mut ip = [0 as std::ffi::c_char; 64];
        // SAFETY: `c` is a connection of the registered type, valid until the server's
        // close releases the reference made here. ClientFlags are zero; `ip` is unused
        // by the server (docs/server-abi.md §2.2).
        unsafe { (super::symbols::get().accept_common_handler)(c, 0, 0, ip.as_mut_ptr()) };
    }

    // ----- for `conntype.rs`: the server's calls ---------------------------------

    /// # Safety
    /// `c` must be a pointer made by [`hand_to_server`](Self::hand_to_server) whose strong
    /// reference was not yet released by [`release`](Self::release), for this `T`.
    pub(super) unsafe fn from_server<'a>(c: *mut Connection) -> &'a Self {
        // SAFETY: per the contract, `c` points at a live `Hosted<T>` (offset 0).
        unsafe { &*c.cast::<Self>() }
    }

    /// A new strong reference, for calls that may run handlers (which may close).
    ///
    /// # Safety
    /// As [`from_server`](Self::from_server).
    pub(super) unsafe fn arc_from_server(c: *mut Connection) -> Arc<Self> {
        let p = c.cast::<Self>().cast_const();
        // SAFETY: `p` came from Arc::into_raw and its reference is still held.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    /// `ct->close`: drops the server's reference.
    ///
    /// # Safety
    /// As [`from_server`](Self::from_server); the server does not use `c` afterwards.
    pub(super) unsafe fn release(c: *mut Connection) {
        let p = c.cast::<Self>().cast_const();
        // SAFETY: per the contract, `p` points at a live `Hosted<T>`.
        if unsafe { &*p }.released.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: gives back the reference made by hand_to_server, once (the flag).
        drop(unsafe { Arc::from_raw(p) });
    }

    /// `set_read_handler` / `set_write_handler` / the handler of `accept` (main thread).
    pub(super) fn install(&self, which: ServerHandler, h: ConnHandler, barrier: Option<bool>) {
        let raw = self.raw.get();
        // SAFETY: main thread, plain fields (see the Sync impl).
        unsafe {
            match which {
                ServerHandler::Accept => (*raw).conn_handler = h,
                ServerHandler::Read => (*raw).read_handler = h,
                ServerHandler::Write => (*raw).write_handler = h,
            }
            if let Some(b) = barrier {
                if b {
                    (*raw).flags |= super::abi::CONN_FLAG_WRITE_BARRIER;
                } else {
                    (*raw).flags &= !super::abi::CONN_FLAG_WRITE_BARRIER;
                }
            }
        }
    }
}

impl<T> Drop for Hosted<T> {
    fn drop(&mut self) {
        let fd = self.raw.get_mut().fd;
        if fd >= 0 {
            // SAFETY: the eventfd made in `new`, owned by this connection alone; the
            // server is done with the connection (its reference is gone).
            unsafe { libc::close(fd) };
        }
    }
}

/// Server handlers for the transport's unit tests: plain functions of the connection's
/// key, installed as the C handlers the server would install (no server needed).
#[cfg(test)]
pub(crate) mod test_handlers {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;

    /// (connection key, handler) → the test's function.
    type Handlers = HashMap<(usize, usize), fn(usize)>;

    thread_local! {
        static HANDLERS: RefCell<Handlers> = RefCell::new(HashMap::new());
    }

    fn slot(which: ServerHandler) -> usize {
        which as usize
    }

    fn call(c: *mut Connection, which: ServerHandler) {
        let key = c as usize;
        let f = HANDLERS.with(|h| h.borrow().get(&(key, slot(which))).copied());
        if let Some(f) = f {
            f(key)
        }
    }
    unsafe extern "C" fn accept(c: *mut Connection) {
        call(c, ServerHandler::Accept)
    }
    unsafe extern "C" fn read(c: *mut Connection) {
        call(c, ServerHandler::Read)
    }
    unsafe extern "C" fn write(c: *mut Connection) {
        call(c, ServerHandler::Write)
    }

    /// Installs `f` as the connection's handler `which` (on this thread).
    pub(crate) fn install<T>(c: &Hosted<T>, which: ServerHandler, f: fn(usize)) {
        HANDLERS.with(|h| h.borrow_mut().insert((c.key(), slot(which)), f));
        let trampoline: unsafe extern "C" fn(*mut Connection) = match which {
            ServerHandler::Accept => accept,
            ServerHandler::Read => read,
            ServerHandler::Write => write,
        };
        c.install(which, Some(trampoline), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counted<'a>(&'a AtomicUsize);
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_second_close_does_not_give_the_servers_reference_back_again() {
        let drops = AtomicUsize::new(0);
        let handler = Hosted::new(Counted(&drops)).expect("an eventfd");
        // what hand_to_server gives the server, without a server
        let server: *mut Connection = Arc::into_raw(handler.clone()).cast_mut().cast();
        // SAFETY: `server` holds the reference made above; `handler` keeps it alive.
        unsafe {
            Hosted::<Counted>::release(server);
            Hosted::<Counted>::release(server);
        }
        assert_eq!(Arc::strong_count(&handler), 1, "only the handler's reference is left");
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(handler);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn each_connection_has_an_fd_of_its_own() {
        let a = Hosted::new(()).expect("an eventfd");
        let b = Hosted::new(()).expect("an eventfd");
        let (fa, fb) = (a.conn().fd, b.conn().fd);
        assert!(fa >= 0 && fb >= 0 && fa != fb);
        // SAFETY: fcntl on an fd this test owns through `a`.
        let flags = unsafe { libc::fcntl(fa, libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0, "not inherited by exec'd children");
        // (that Drop closes it is not checked here: another test may reuse the number)
    }
}
