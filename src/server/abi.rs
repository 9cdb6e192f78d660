//! valkey-server's internal connection ABI, mirrored per version
//! (docs/server-abi.md §1). Only these structs are shared with the server: `connection`
//! (64 bytes, the same in every supported version), `connListener` (104 bytes) and the
//! `ConnectionType` table, whose tail changed in 9.1.0 and again in the 9.1.2 patch
//! release. Nothing here reads the server's global `struct valkeyServer` except the one
//! validated pointer in `symbols.rs`.

use std::ffi::{c_char, c_int, c_long, c_longlong, c_void};
use std::sync::atomic::AtomicI32;

/// `ConnectionCallbackFunc`: `void (*)(connection *)`.
pub type ConnHandler = Option<unsafe extern "C" fn(*mut Connection)>;
/// `aeFileProc`: `void (*)(aeEventLoop *, int fd, void *clientData, int mask)`.
pub type AeFileProc = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, c_int);

// connection.h (all supported versions)
pub const CONN_STATE_NONE: i32 = 0;
pub const CONN_STATE_ACCEPTING: i32 = 2;
pub const CONN_STATE_CONNECTED: i32 = 3;
pub const CONN_STATE_CLOSED: i32 = 4;
pub const CONN_STATE_ERROR: i32 = 5;
pub const CONN_FLAG_CLOSE_SCHEDULED: i16 = 1 << 0;
pub const CONN_FLAG_WRITE_BARRIER: i16 = 1 << 1;
/// 9.1.2 `CONN_POSTPONE_READ` / `CONN_POSTPONE_WRITE` (earlier versions pass 1/0).
pub const CONN_POSTPONE_READ: i32 = 1;
pub const CONN_POSTPONE_WRITE: i32 = 2;
pub const C_OK: c_int = 0;
pub const C_ERR: c_int = -1;
pub const AE_READABLE: c_int = 1;
/// `CONN_TYPE_RDMA` in 9.x (an enum index); 8.1 names types by string.
pub const CONN_TYPE_RDMA_ID: c_int = 3;
pub const CONN_TYPE_RDMA_NAME: &std::ffi::CStr = c"rdma";
pub const CONFIG_BINDADDR_MAX: usize = 16;
pub const IOV_MAX: u16 = 1024;

/// `struct connection` (connection.h:166-178 in 9.1.2; identical in 8.1.1).
/// `state` is read by IO threads while the main thread may change it: it is atomic here
/// (same size and alignment as the C `int`).
#[repr(C)]
pub struct Connection {
    pub ty: *const c_void,
    pub state: AtomicI32,
    pub last_errno: AtomicI32,
    pub fd: c_int,
    pub flags: i16,
    pub refs: i16,
    pub iovcnt: u16,
    pub private_data: *mut c_void,
    pub conn_handler: ConnHandler,
    pub write_handler: ConnHandler,
    pub read_handler: ConnHandler,
}

/// `struct connListener`.
#[repr(C)]
pub struct ConnListener {
    pub fd: [c_int; CONFIG_BINDADDR_MAX],
    pub count: c_int,
    pub bindaddr: *mut *mut c_char,
    pub bindaddr_count: c_int,
    pub port: c_int,
    pub ct: *const c_void,
    pub priv_: *mut c_void,
}

impl ConnListener {
    /// The bind addresses, as the server configured them (`rdma-bind`).
    pub(crate) fn bind_names(&self) -> Vec<String> {
        (0..self.bindaddr_count.max(0) as usize)
            .map(|i| {
                // SAFETY: the server keeps `bindaddr_count` valid C strings in `bindaddr`
                // (or ours, from `use_default_binds`).
                unsafe { std::ffi::CStr::from_ptr(*self.bindaddr.add(i)) }.to_string_lossy().into_owned()
            })
            .collect()
    }

    /// With an empty `rdma-bind`: the server prints `bindaddr[i]` for every listening
    /// fd (INFO, logs), so it must name the defaults we listen on, `*` and `-::*`
    /// (upstream does the same).
    pub(crate) fn use_default_binds(&mut self) {
        self.bindaddr = DEFAULT_BINDS.0.as_ptr().cast_mut().cast();
        self.bindaddr_count = DEFAULT_BINDS.0.len() as c_int;
    }
}

struct DefaultBinds([*const c_char; 2]);
// SAFETY: pointers to immutable static C strings.
unsafe impl Sync for DefaultBinds {}
static DEFAULT_BINDS: DefaultBinds = DefaultBinds([c"*".as_ptr(), c"-::*".as_ptr()]);

/// The part of `ConnectionType` that every supported version shares (offsets 0..240),
/// generic over the two members whose C signature differs: `get_type` (8.1:
/// `const char *(*)(connection *)`, 9.x: `int (*)(void)`) and `connect` (9.x added
/// `multipath`), and over the version-specific tail.
#[repr(C)]
pub struct ConnectionType<GetType, Connect, Tail> {
    pub get_type: GetType,
    pub init: Option<unsafe extern "C" fn()>,
    pub cleanup: Option<unsafe extern "C" fn()>,
    pub configure: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    pub ae_handler: Option<AeFileProc>,
    pub accept_handler: Option<AeFileProc>,
    pub addr: Option<unsafe extern "C" fn(*mut Connection, *mut c_char, usize, *mut c_int, c_int) -> c_int>,
    pub is_local: Option<unsafe extern "C" fn(*mut Connection) -> c_int>,
    pub listen: Option<unsafe extern "C" fn(*mut ConnListener) -> c_int>,
    pub close_listener: Option<unsafe extern "C" fn(*mut ConnListener)>,
    pub conn_create: Option<unsafe extern "C" fn() -> *mut Connection>,
    pub conn_create_accepted: Option<unsafe extern "C" fn(c_int, *mut c_void) -> *mut Connection>,
    pub shutdown: Option<unsafe extern "C" fn(*mut Connection)>,
    pub close: Option<unsafe extern "C" fn(*mut Connection)>,
    pub connect: Connect,
    pub blocking_connect: Option<unsafe extern "C" fn(*mut Connection, *const c_char, c_int, c_longlong) -> c_int>,
    pub accept: Option<unsafe extern "C" fn(*mut Connection, ConnHandler) -> c_int>,
    pub write: Option<unsafe extern "C" fn(*mut Connection, *const c_void, usize) -> c_int>,
    pub writev: Option<unsafe extern "C" fn(*mut Connection, *const libc::iovec, c_int) -> c_int>,
    pub read: Option<unsafe extern "C" fn(*mut Connection, *mut c_void, usize) -> c_int>,
    pub set_write_handler: Option<unsafe extern "C" fn(*mut Connection, ConnHandler, c_int) -> c_int>,
    pub set_read_handler: Option<unsafe extern "C" fn(*mut Connection, ConnHandler) -> c_int>,
    pub get_last_error: Option<unsafe extern "C" fn(*mut Connection) -> *const c_char>,
    pub sync_write: Option<SyncIo>,
    pub sync_read: Option<SyncIo>,
    pub sync_readline: Option<SyncIo>,
    pub has_pending_data: Option<unsafe extern "C" fn() -> c_int>,
    pub process_pending_data: Option<unsafe extern "C" fn() -> c_int>,
    pub postpone_update_state: Option<unsafe extern "C" fn(*mut Connection, c_int)>,
    pub update_state: Option<unsafe extern "C" fn(*mut Connection)>,
    pub tail: Tail,
}

pub type SyncIo = unsafe extern "C" fn(*mut Connection, *mut c_char, isize, c_longlong) -> isize;
pub type GetType81 = Option<unsafe extern "C" fn(*mut Connection) -> *const c_char>;
pub type GetType9 = Option<unsafe extern "C" fn() -> c_int>;
pub type Connect81 =
    Option<unsafe extern "C" fn(*mut Connection, *const c_char, c_int, *const c_char, ConnHandler) -> c_int>;
pub type Connect9 =
    Option<unsafe extern "C" fn(*mut Connection, *const c_char, c_int, *const c_char, c_int, ConnHandler) -> c_int>;
type Unused = Option<unsafe extern "C" fn()>;

/// 8.1: `get_peer_cert`, `connIntegrityChecked`.
#[repr(C)]
pub struct Tail81 {
    pub get_peer_cert: Unused,
    pub conn_integrity_checked: Unused,
}
/// 9.0.0, 9.1.0, 9.1.1: `get_peer_cert`, the peer-user function, `connIntegrityChecked`.
#[repr(C)]
pub struct Tail910 {
    pub get_peer_cert: Unused,
    pub get_peer_user: Unused,
    pub conn_integrity_checked: Unused,
}
/// 9.1.2 inserted `int sync_handlers_in_update_state` before them (connection.h:150-153).
#[repr(C)]
pub struct Tail912 {
    pub sync_handlers_in_update_state: c_int,
    pub get_peer_cert: Unused,
    pub get_peer_user: Unused,
    pub conn_integrity_checked: Unused,
}

pub type ConnectionType81 = ConnectionType<GetType81, Connect81, Tail81>;
pub type ConnectionType910 = ConnectionType<GetType9, Connect9, Tail910>;
pub type ConnectionType912 = ConnectionType<GetType9, Connect9, Tail912>;

// The sizes measured against the real headers (docs/server-abi.md §1); also checked at
// run time of the test suite against the reference trees (tests/abi_layout.rs).
const _: () = assert!(std::mem::size_of::<Connection>() == 64);
const _: () = assert!(std::mem::offset_of!(Connection, private_data) == 32);
const _: () = assert!(std::mem::offset_of!(Connection, read_handler) == 56);
const _: () = assert!(std::mem::size_of::<ConnListener>() == 104);
const _: () = assert!(std::mem::offset_of!(ConnListener, priv_) == 96);
const _: () = assert!(std::mem::size_of::<ConnectionType81>() == 256);
const _: () = assert!(std::mem::size_of::<ConnectionType910>() == 264);
const _: () = assert!(std::mem::size_of::<ConnectionType912>() == 272);
const _: () = assert!(std::mem::offset_of!(ConnectionType912, update_state) == 232);
const _: () = assert!(std::mem::offset_of!(ConnectionType912, tail) == 240);

/// Which layout and semantics a server version uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// 8.1.x: string type names, 256-byte table, boolean postpone, 8-byte ClientFlags.
    V8_1,
    /// 9.1.0 and 9.1.1: int type ids, `multipath` in connect, 264-byte table, boolean postpone.
    V9_1_0,
    /// 9.1.2: 272-byte table, postpone mask, calls from IO threads.
    V9_1_2,
}

pub const SUPPORTED_VERSIONS: &str = "8.1.x, 9.1.0, 9.1.1, 9.1.2";

impl Abi {
    /// From `ValkeyModule_GetServerVersion()` (0x00MMmmpp). A patch release has changed
    /// the layout before (9.1.2), so unknown versions are refused, not guessed.
    pub fn for_version(v: i32) -> Option<Abi> {
        match v {
            0x0008_0100..=0x0008_01ff => Some(Abi::V8_1),
            0x0009_0100 | 0x0009_0101 => Some(Abi::V9_1_0),
            0x0009_0102 => Some(Abi::V9_1_2),
            _ => None,
        }
    }
    /// Turns the second argument of `postpone_update_state` into a mask.
    pub fn postpone_mask(self, arg: c_int) -> i32 {
        match self {
            Abi::V9_1_2 => arg & (CONN_POSTPONE_READ | CONN_POSTPONE_WRITE),
            _ if arg != 0 => CONN_POSTPONE_READ | CONN_POSTPONE_WRITE,
            _ => 0,
        }
    }
}

pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff)
}

/// `c_long` is used by the keepalive timer id (`mstime_t` is `long long`).
pub type TimerId = c_long;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_layouts_and_unknown_ones_are_refused() {
        assert_eq!(Abi::for_version(0x080101), Some(Abi::V8_1));
        assert_eq!(Abi::for_version(0x080105), Some(Abi::V8_1));
        assert_eq!(Abi::for_version(0x090100), Some(Abi::V9_1_0));
        assert_eq!(Abi::for_version(0x090101), Some(Abi::V9_1_0));
        assert_eq!(Abi::for_version(0x090102), Some(Abi::V9_1_2));
        for v in [0x080000, 0x080001, 0x090000, 0x090001, 0x090103, 0x090200, 0x0a0000] {
            assert_eq!(Abi::for_version(v), None, "{}", version_string(v));
        }
        assert_eq!(version_string(0x090102), "9.1.2");
    }

    #[test]
    fn postpone_argument_is_a_mask_only_from_9_1_2() {
        assert_eq!(Abi::V9_1_2.postpone_mask(CONN_POSTPONE_WRITE), CONN_POSTPONE_WRITE);
        assert_eq!(Abi::V9_1_2.postpone_mask(0), 0);
        assert_eq!(Abi::V8_1.postpone_mask(1), CONN_POSTPONE_READ | CONN_POSTPONE_WRITE);
        assert_eq!(Abi::V9_1_0.postpone_mask(0), 0);
    }
}
