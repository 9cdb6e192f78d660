//! The module's entry points: `ValkeyModule_OnLoad` and `ValkeyModule_OnUnload`.
//! They turn the server's arguments into a [`LoadCtx`] and hand over to the glue
//! (`crate::on_load`), which is safe code.

use std::ffi::c_int;

use valkey_module::raw;

use super::api::{self, Ctx, LoadCtx};
use super::conntype::guard;

const OK: c_int = raw::VALKEYMODULE_OK as c_int;
const ERR: c_int = raw::VALKEYMODULE_ERR as c_int;

/// # Safety
/// `argv` must hold `argc` live module strings, once `ValkeyModule_Init` succeeded.
unsafe fn module_args(argv: *mut *mut raw::ValkeyModuleString, argc: c_int) -> Vec<String> {
    (0..argc.max(0) as usize)
        .map(|i| {
            let mut len = 0;
            // SAFETY: per the contract; each string is `len` bytes owned by the server.
            unsafe {
                let p = raw::ValkeyModule_StringPtrLen.map_or(std::ptr::null(), |f| f(*argv.add(i), &mut len));
                if p.is_null() {
                    String::new()
                } else {
                    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
                }
            }
        })
        .collect()
}

/// # Safety
/// Called by valkey-server with a live module context and `argc` module arguments.
#[no_mangle]
pub unsafe extern "C" fn ValkeyModule_OnLoad(
    ctx: *mut Ctx,
    argv: *mut *mut raw::ValkeyModuleString,
    argc: c_int,
) -> c_int {
    guard(ERR, || {
        // SAFETY: per the contract, the OnLoad context.
        if let Err(e) = unsafe { api::init(ctx) } {
            api::log_line(c"warning", &format!("RDMA: cannot load: {e}"));
            return ERR;
        }
        // SAFETY: per the contract; the API is initialised.
        let args = unsafe { module_args(argv, argc) };
        match crate::on_load(&LoadCtx { ctx, args }) {
            Ok(()) => OK,
            Err(e) => {
                api::log_line(c"warning", &format!("RDMA: cannot load: {e}"));
                ERR
            }
        }
    })
}

/// The connection type cannot be unregistered and live clients point into this
/// library: refuse, as upstream does (9.x asks at shutdown; the log then says
/// "Unload canceled", which is expected).
///
/// # Safety
/// Called by valkey-server.
#[no_mangle]
pub unsafe extern "C" fn ValkeyModule_OnUnload(_ctx: *mut Ctx) -> c_int {
    api::log_line(
        c"notice",
        "RDMA: the module cannot be unloaded: the rdma connection type stays registered while the server runs and its connections call into this library (remove the loadmodule line and restart the server to drop it)",
    );
    ERR
}
