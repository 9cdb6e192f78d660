//! Server-internal functions a connection type cannot do without, resolved by name at
//! load time. The server's binary exports them (`-rdynamic`); a static or stripped
//! server does not, and then OnLoad fails with a message instead of the dynamic
//! loader aborting the whole server (docs/server-abi.md §2.1, §6).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use super::abi::{Abi, Connection};

pub struct ServerSymbols {
    /// `int connTypeRegister(ConnectionType *ct)`; calls `ct->init` synchronously.
    pub conn_type_register: unsafe extern "C" fn(*const c_void) -> c_int,
    /// `void acceptCommonHandler(connection *, struct ClientFlags, char *ip)`. ClientFlags
    /// is 8 bytes in 8.1 and 16 in 9.1 (by value, in registers); passing two zero words
    /// and `ip` is right for both, and `ip` is unused by both (docs/server-abi.md §2.2).
    pub accept_common_handler: unsafe extern "C" fn(*mut Connection, u64, u64, *mut c_char),
    /// `void aeDeleteFileEvent(aeEventLoop *, int fd, int mask)`: the only way to
    /// unregister the listener fds, which the server registered itself.
    pub ae_delete_file_event: unsafe extern "C" fn(*mut c_void, c_int, c_int),
    /// The `server` global, for the one field with no accessor (`el`).
    server: *mut u8,
}

// SAFETY: function pointers and the address of a global: immutable after resolution.
unsafe impl Send for ServerSymbols {}
// SAFETY: as for Send: nothing in it changes after resolution.
unsafe impl Sync for ServerSymbols {}

static SYMBOLS: OnceLock<ServerSymbols> = OnceLock::new();

fn lookup(name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: RTLD_DEFAULT searches the global scope, where the executable is.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        Err(format!(
            "valkey-server does not export {} (a static or stripped build?); a connection type needs a dynamically linked server built with -rdynamic, as upstream's Makefile does on Linux",
            name.to_string_lossy()
        ))
    } else {
        Ok(p)
    }
}

pub fn resolve() -> Result<&'static ServerSymbols, String> {
    if let Some(s) = SYMBOLS.get() {
        return Ok(s);
    }
    // SAFETY: each symbol is given the prototype of the server version family we
    // support (docs/server-abi.md §2.1; they agree across versions).
    let s = unsafe {
        ServerSymbols {
            conn_type_register: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_void) -> c_int>(
                lookup(c"connTypeRegister")?,
            ),
            accept_common_handler: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut Connection, u64, u64, *mut c_char),
            >(lookup(c"acceptCommonHandler")?),
            ae_delete_file_event: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, c_int, c_int)>(
                lookup(c"aeDeleteFileEvent")?,
            ),
            server: lookup(c"server")?.cast(),
        }
    };
    Ok(SYMBOLS.get_or_init(|| s))
}

pub fn get() -> &'static ServerSymbols {
    SYMBOLS.get().expect("server symbols are resolved in OnLoad before any callback")
}

/// `server.el`, once found.
static EVENT_LOOP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

pub fn event_loop() -> *mut c_void {
    EVENT_LOOP.load(Ordering::Acquire)
}

/// Stops the server's event loop from watching a listener fd (the server registered
/// it itself, so the module API's EventLoopDel must not be used). False while the
/// event loop is not known yet.
pub(crate) fn unwatch_listener_fd(fd: c_int) -> bool {
    let el = event_loop();
    if el.is_null() {
        return false;
    }
    // SAFETY: `el` is server.el (validated in find_event_loop, or handed to the accept
    // handler by the server); deleting an fd it does not watch is a no-op.
    unsafe { (get().ae_delete_file_event)(el, fd, super::abi::AE_READABLE) };
    true
}

/// Every accept handler call receives `server.el` as its first argument.
pub fn remember_event_loop(el: *mut c_void) {
    if !el.is_null() {
        EVENT_LOOP.store(el, Ordering::Release);
    }
}

/// Finds `server.el` before any accept happened (a `CONFIG SET rdma-port` may close a
/// listener first). The offset comes from the version's layout and is trusted only if
/// (1) the word at offset 0 of `server` is our pid (field `pid`, first in every version)
/// and (2) the candidate points at an `aeEventLoop` whose `setsize` (offset 4) is
/// `maxclients + CONFIG_FDSET_INCR` (128). Candidate memory is read with
/// `process_vm_readv`, so a wrong guess cannot fault.
pub fn find_event_loop(abi: Abi, maxclients: i64) -> bool {
    let s = get();
    let offset = match abi {
        Abi::V8_1 => 80,
        Abi::V9_1_0 | Abi::V9_1_2 => 96,
    };
    let Some(pid) = read_word::<i32>(s.server) else { return false };
    // SAFETY: getpid has no preconditions.
    if pid != unsafe { libc::getpid() } {
        return false;
    }
    // SAFETY: `server` is a global at least `offset + 8` bytes long in every version.
    let Some(el) = read_word::<usize>(unsafe { s.server.add(offset) }) else { return false };
    let el = el as *mut u8;
    // Only the address is computed here; the read itself is checked.
    match read_word::<i32>(el.wrapping_add(4)) {
        Some(setsize) if setsize as i64 == maxclients + 128 => {
            remember_event_loop(el.cast());
            true
        }
        _ => false,
    }
}

fn read_word<T: Copy + Default>(addr: *const u8) -> Option<T> {
    let mut out = T::default();
    let local = libc::iovec { iov_base: (&mut out as *mut T).cast(), iov_len: std::mem::size_of::<T>() };
    let remote = libc::iovec { iov_base: addr as *mut c_void, iov_len: std::mem::size_of::<T>() };
    // SAFETY: reads our own address space through the kernel, which fails with EFAULT
    // instead of faulting on an unmapped address; `local` is a live T.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == std::mem::size_of::<T>() as isize).then_some(out)
}
