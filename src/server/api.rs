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
pub unsafe fn init(ctx: *mut Ctx) -> Result<(), &'static str> {
    if raw::Export_ValkeyModule_Init(ctx, c"rdma".as_ptr(), 1, raw::VALKEYMODULE_APIVER_1 as c_int)
        != raw::VALKEYMODULE_OK as c_int
    {
        return Err("ValkeyModule_Init failed (is another module named rdma loaded?)");
    }
    if let Some(detach) = raw::ValkeyModule_GetDetachedThreadSafeContext {
        LOG_CTX.store(detach(ctx), Ordering::Release);
    }
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Trace);
    Ok(())
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

/// True while the server loads modules from its configuration (`loadmodule`).
///
/// # Safety
/// `ctx` must be a live module context.
pub unsafe fn at_startup(ctx: *mut Ctx) -> bool {
    raw::ValkeyModule_GetContextFlags.is_some_and(|f| f(ctx) as u32 & raw::VALKEYMODULE_CTX_FLAGS_SERVER_STARTUP != 0)
}

/// # Safety
/// `ctx` must be a live module context.
pub unsafe fn set_module_options(ctx: *mut Ctx, options: u32) {
    if let Some(f) = raw::ValkeyModule_SetModuleOptions {
        f(ctx, options as c_int);
    }
}

/// `CONFIG GET name` → its value.
///
/// # Safety
/// `ctx` must be a live module context on the main thread.
pub unsafe fn config_get(ctx: *mut Ctx, name: &str) -> Option<String> {
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

/// `CONFIG SET name value`; the server's error text on failure.
///
/// # Safety
/// `ctx` must be a live module context on the main thread.
pub unsafe fn config_set(ctx: *mut Ctx, name: &str, value: &str) -> Result<(), String> {
    let call = raw::ValkeyModule_Call.ok_or("no module API")?;
    let (name, value) =
        (CString::new(name).map_err(|e| e.to_string())?, CString::new(value).map_err(|e| e.to_string())?);
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

unsafe fn reply_string(reply: *mut raw::ValkeyModuleCallReply) -> Option<String> {
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    let p = raw::ValkeyModule_CallReplyStringPtr?(reply, &mut len);
    if p.is_null() {
        return None;
    }
    Some(String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned())
}

pub type FdCallback = unsafe extern "C" fn(c_int, *mut c_void, c_int);

/// Watches `fd` for readability in the server's event loop (main thread).
///
/// # Safety
/// `cb` will be called with `data` until [`unwatch_fd`]: `data` must stay valid so long.
pub unsafe fn watch_fd(fd: c_int, cb: FdCallback, data: *mut c_void) -> bool {
    raw::ValkeyModule_EventLoopAdd.is_some_and(|f| {
        f(fd, raw::VALKEYMODULE_EVENTLOOP_READABLE as c_int, Some(cb), data) == raw::VALKEYMODULE_OK as c_int
    })
}

/// Stops watching an fd added with [`watch_fd`] (never a listener fd: the server
/// registered those itself, and EventLoopDel would free their client data).
pub fn unwatch_fd(fd: c_int) {
    // SAFETY: fd was added with EventLoopAdd.
    unsafe {
        if let Some(f) = raw::ValkeyModule_EventLoopDel {
            f(fd, raw::VALKEYMODULE_EVENTLOOP_READABLE as c_int);
        }
    }
}

pub type TimerCallback = unsafe extern "C" fn(*mut Ctx, *mut c_void);

/// A one-shot timer in `ms` milliseconds (re-armed by its callback).
///
/// # Safety
/// `ctx` must be a live module context on the main thread.
pub unsafe fn start_timer(ctx: *mut Ctx, ms: i64, cb: TimerCallback) {
    if let Some(f) = raw::ValkeyModule_CreateTimer {
        f(ctx, ms, Some(cb), std::ptr::null_mut());
    }
}
