//! The public module API (ValkeyModule_*), through valkey-module's raw bindings. The
//! function pointers are filled by `ValkeyModule_Init` in OnLoad; nothing here may run
//! before that (OnLoad is the only entry point, so nothing can).

use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};

use valkey_module::raw;

pub type Ctx = raw::ValkeyModuleCtx;

/// A detached context for logging from anywhere (lines are prefixed `<rdma>`).
static LOG_CTX: AtomicPtr<Ctx> = AtomicPtr::new(std::ptr::null_mut());

/// # Safety
/// `ctx` must be the OnLoad context, after `ValkeyModule_Init` succeeded.
pub(super) unsafe fn init(ctx: *mut Ctx) -> Result<(), &'static str> {
    // SAFETY: per the contract.
    if unsafe { raw::Export_ValkeyModule_Init(ctx, c"rdma".as_ptr(), 1, raw::VALKEYMODULE_APIVER_1 as c_int) }
        != raw::VALKEYMODULE_OK as c_int
    {
        return Err("ValkeyModule_Init failed (is another module named rdma loaded?)");
    }
    // SAFETY: the API was just filled in (read once, on the main thread); `ctx` is live.
    if let Some(detach) = unsafe { raw::ValkeyModule_GetDetachedThreadSafeContext } {
        // SAFETY: `ctx` is the live context of OnLoad; the detached context outlives it.
        LOG_CTX.store(unsafe { detach(ctx) }, Ordering::Release);
    }
    let _ = log::set_logger(&LOGGER);
    follow_server_loglevel();
    Ok(())
}

/// Sets the level below which the module's log lines are not even formatted to the
/// server's `loglevel` (main thread; called at load and at the start of every keepalive
/// period, so that a `CONFIG SET loglevel` is followed within one period, 3 s).
pub(crate) fn follow_server_loglevel() {
    let ctx = LOG_CTX.load(Ordering::Acquire);
    // SAFETY: the detached context made in `init`, live for the process; main thread.
    let level = if ctx.is_null() { None } else { unsafe { config_get(ctx, "loglevel") } };
    log::set_max_level(match level.as_deref() {
        Some("debug") => log::LevelFilter::Trace,
        Some("verbose") => log::LevelFilter::Debug,
        Some("notice") => log::LevelFilter::Info,
        Some("warning") => log::LevelFilter::Warn,
        Some("nothing") => log::LevelFilter::Off,
        _ => log::LevelFilter::Trace, // unknown: the server decides, as before
    });
}

/// Writes one line to the server log at the server's own levels.
pub fn log_line(level: &CStr, msg: &str) {
    let msg = CString::new(msg.replace('\0', "?")).unwrap_or_default();
    // SAFETY: Log takes a printf format; we pass "%s" and one NUL-terminated string.
    // The server checks the level against its verbosity itself.
    unsafe {
        if let Some(f) = raw::ValkeyModule_Log {
            f(LOG_CTX.load(Ordering::Acquire), level.as_ptr(), c"%s".as_ptr(), msg.as_ptr());
        }
    }
}

struct ServerLogger;
static LOGGER: ServerLogger = ServerLogger;

impl log::Log for ServerLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Error | log::Level::Warn => c"warning",
            log::Level::Info => c"notice",
            log::Level::Debug => c"verbose",
            log::Level::Trace => c"debug",
        };
        log_line(level, &record.args().to_string());
    }
    fn flush(&self) {}
}

pub fn server_version() -> i32 {
    // SAFETY: filled by init; takes no arguments.
    unsafe { raw::ValkeyModule_GetServerVersion.map_or(0, |f| f()) }
}

/// The module context of `ValkeyModule_OnLoad` and the module's arguments: what
/// loading may use, as safe calls. Made only by the OnLoad entry (`module.rs`).
pub(crate) struct LoadCtx {
    pub(super) ctx: *mut Ctx,
    pub(crate) args: Vec<String>,
}

impl LoadCtx {
    /// True while the server loads modules from its configuration (`loadmodule`).
    pub(crate) fn at_startup(&self) -> bool {
        // SAFETY: the OnLoad context is live for the whole load.
        unsafe {
            raw::ValkeyModule_GetContextFlags
                .is_some_and(|f| f(self.ctx) as u32 & raw::VALKEYMODULE_CTX_FLAGS_SERVER_STARTUP != 0)
        }
    }

    pub(crate) fn set_module_options(&self, options: u32) {
        // SAFETY: as above.
        unsafe {
            if let Some(f) = raw::ValkeyModule_SetModuleOptions {
                f(self.ctx, options as c_int);
            }
        }
    }

    /// `CONFIG GET name` → its value.
    pub(crate) fn config_get(&self, name: &str) -> Option<String> {
        // SAFETY: as above; on the main thread (OnLoad).
        unsafe { config_get(self.ctx, name) }
    }

    /// `CONFIG SET name value`; the server's error text on failure.
    pub(crate) fn config_set(&self, name: &str, value: &str) -> Result<(), String> {
        // SAFETY: as above.
        unsafe { config_set(self.ctx, name, value) }
    }
}

/// # Safety
/// `ctx` must be a live module context on the main thread.
unsafe fn config_get(ctx: *mut Ctx, name: &str) -> Option<String> {
    // SAFETY: per the contract; every reply is freed once.
    unsafe {
        let call = raw::ValkeyModule_Call?;
        let name = CString::new(name).ok()?;
        let reply = call(ctx, c"CONFIG".as_ptr(), c"cc".as_ptr(), c"GET".as_ptr(), name.as_ptr());
        if reply.is_null() {
            return None;
        }
        let mut out = None;
        if raw::ValkeyModule_CallReplyType?(reply) == raw::VALKEYMODULE_REPLY_ARRAY as c_int
            && raw::ValkeyModule_CallReplyLength?(reply) >= 2
        {
            out = reply_string(raw::ValkeyModule_CallReplyArrayElement?(reply, 1));
        }
        raw::ValkeyModule_FreeCallReply?(reply);
        out
    }
}

/// # Safety
/// `ctx` must be a live module context on the main thread.
unsafe fn config_set(ctx: *mut Ctx, name: &str, value: &str) -> Result<(), String> {
    // SAFETY: the API table is filled once in OnLoad, before any call here.
    let call = unsafe { raw::ValkeyModule_Call }.ok_or("no module API")?;
    let (name, value) =
        (CString::new(name).map_err(|e| e.to_string())?, CString::new(value).map_err(|e| e.to_string())?);
    // SAFETY: per the contract; the reply is freed once.
    unsafe {
        // "E": return errors as a reply instead of only logging them.
        let reply = call(ctx, c"CONFIG".as_ptr(), c"cccE".as_ptr(), c"SET".as_ptr(), name.as_ptr(), value.as_ptr());
        if reply.is_null() {
            return Err("CONFIG SET was refused".into());
        }
        let kind = raw::ValkeyModule_CallReplyType.map_or(-1, |f| f(reply));
        let text = reply_string(reply).unwrap_or_default();
        if let Some(free) = raw::ValkeyModule_FreeCallReply {
            free(reply);
        }
        if kind == raw::VALKEYMODULE_REPLY_ERROR as c_int {
            Err(text)
        } else {
            Ok(())
        }
    }
}

/// # Safety
/// `reply` must be null or a live call reply.
unsafe fn reply_string(reply: *mut raw::ValkeyModuleCallReply) -> Option<String> {
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: per the contract; the string is `len` bytes owned by the reply.
    unsafe {
        let p = raw::ValkeyModule_CallReplyStringPtr?(reply, &mut len);
        if p.is_null() {
            return None;
        }
        Some(String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned())
    }
}

pub type FdCallback = unsafe extern "C" fn(c_int, *mut c_void, c_int);

/// Watches `fd` for readability in the server's event loop (main thread).
///
/// # Safety
/// An fd this module added to the server's event loop. Only its holder can remove it
/// ([`unwatch_fd`]): so no other fd can be removed, in particular no listener fd, which
/// the server registered itself and whose client data EventLoopDel would free. Dropping
/// it leaves the fd watched (the module's own long-lived fds).
#[must_use = "unwatching the fd needs this token"]
#[derive(Debug)]
pub(crate) struct FdWatch(c_int);

/// `cb` will be called with `data` until [`unwatch_fd`]: `data` must stay valid so long.
pub(super) unsafe fn watch_fd(fd: c_int, cb: FdCallback, data: *mut c_void) -> Option<FdWatch> {
    // SAFETY: per the contract; the API table is filled once in OnLoad.
    let added = unsafe {
        raw::ValkeyModule_EventLoopAdd.is_some_and(|f| {
            f(fd, raw::VALKEYMODULE_EVENTLOOP_READABLE as c_int, Some(cb), data) == raw::VALKEYMODULE_OK as c_int
        })
    };
    added.then_some(FdWatch(fd))
}

/// Stops watching an fd this module added.
pub(crate) fn unwatch_fd(watch: FdWatch) {
    // SAFETY: the token proves the fd was added with EventLoopAdd by this module.
    unsafe {
        if let Some(f) = raw::ValkeyModule_EventLoopDel {
            f(watch.0, raw::VALKEYMODULE_EVENTLOOP_READABLE as c_int);
        }
    }
}

/// One field of the module's INFO section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InfoField {
    Num(&'static str, u64),
    /// `name:key=value,key=value` (Valkey's style for counters by kind).
    Dict(&'static str, Vec<(&'static str, u64)>),
}

pub(crate) type InfoCtx = raw::ValkeyModuleInfoCtx;

impl LoadCtx {
    /// `ValkeyModule_RegisterInfoFunc`.
    pub(super) fn register_info(&self, cb: unsafe extern "C" fn(*mut InfoCtx, c_int)) -> Result<(), String> {
        // SAFETY: the OnLoad context; the callback lives for the process.
        let rc = unsafe { raw::ValkeyModule_RegisterInfoFunc.map_or(-1, |f| f(self.ctx, Some(cb))) };
        if rc == raw::VALKEYMODULE_OK as c_int {
            Ok(())
        } else {
            Err("ValkeyModule_RegisterInfoFunc failed".into())
        }
    }
}

/// Writes the module's INFO section during an info callback.
pub(crate) struct InfoWriter(*mut InfoCtx);

impl InfoWriter {
    /// # Safety
    /// `ctx` must be the context of the running info callback.
    pub(super) unsafe fn new(ctx: *mut InfoCtx) -> InfoWriter {
        InfoWriter(ctx)
    }

    /// Starts the section named after the module (`# rdma`); false when INFO did not
    /// ask for it.
    pub(super) fn section(&self) -> bool {
        // SAFETY: the live info context; a NULL name means the module's own section.
        unsafe {
            raw::ValkeyModule_InfoAddSection
                .is_some_and(|f| f(self.0, std::ptr::null_mut()) == raw::VALKEYMODULE_OK as c_int)
        }
    }

    /// One field; the server prefixes its name with `rdma_`.
    pub(super) fn field(&self, f: &InfoField) {
        let cstr = |s: &str| CString::new(s).unwrap_or_default();
        // SAFETY: the live info context; every string is NUL-terminated and outlives the call.
        unsafe {
            match f {
                InfoField::Num(name, v) => {
                    if let Some(add) = raw::ValkeyModule_InfoAddFieldULongLong {
                        add(self.0, cstr(name).as_ptr(), *v);
                    }
                }
                InfoField::Dict(name, entries) => {
                    let (Some(begin), Some(add), Some(end)) = (
                        raw::ValkeyModule_InfoBeginDictField,
                        raw::ValkeyModule_InfoAddFieldULongLong,
                        raw::ValkeyModule_InfoEndDictField,
                    ) else {
                        return;
                    };
                    begin(self.0, cstr(name).as_ptr());
                    for (k, v) in entries {
                        add(self.0, cstr(k).as_ptr(), *v);
                    }
                    end(self.0);
                }
            }
        }
    }
}
