//! valkey-rdma: Valkey over RDMA as a loadable connection type (`librdma.so`), plus the
//! client side of the same protocol.
//!
//! Layout, from the wire up:
//! - [`verbs`]: librdmacm/libibverbs loaded at run time; RAII owners (unsafe edge).
//! - [`protocol`]: the Valkey Over RDMA protocol, pure and deterministic.
//! - [`transport`]: one server-side connection = protocol session + verbs endpoint;
//!   listeners, pending list, keepalive; the `ConnectionType` callbacks.
//! - [`server`]: valkey-server's internal ABI per version and the module API (unsafe edge).
//! - [`client`]: the client side of the protocol (library, test peer), on the same layers.
//! - [`config`]: module arguments and core `rdma-*` configs.
//! - this file: `ValkeyModule_OnLoad`/`OnUnload`, wiring only.

pub mod client;
pub mod config;
pub mod protocol;
pub mod server;
pub mod transport;
pub mod verbs;

use std::ffi::c_int;

use server::abi::{version_string, Abi, SUPPORTED_VERSIONS};
use server::api::{self, Ctx};
use valkey_module::raw;

const OK: c_int = raw::VALKEYMODULE_OK as c_int;
const ERR: c_int = raw::VALKEYMODULE_ERR as c_int;

/// Reads the core `rdma-*` configs (already parsed from valkey.conf and the command
/// line when modules load).
unsafe fn core_config(ctx: *mut Ctx) -> config::CoreConfig {
    let get = |name: &str| api::config_get(ctx, name);
    let mut core = config::CoreConfig::default();
    if let Some(v) = get("rdma-port").and_then(|v| v.parse().ok()) {
        core.port = v;
    }
    if let Some(v) = get("rdma-bind") {
        core.bind = v.split_whitespace().map(String::from).collect();
    }
    if let Some(v) = get("rdma-rx-size").and_then(|v| v.parse().ok()) {
        core.rx_size = v;
    }
    if let Some(v) = get("rdma-completion-vector").and_then(|v| v.parse().ok()) {
        core.comp_vector = v;
    }
    core
}

unsafe fn module_args(argv: *mut *mut raw::ValkeyModuleString, argc: c_int) -> Vec<String> {
    (0..argc.max(0) as usize)
        .map(|i| {
            let mut len = 0;
            let p = raw::ValkeyModule_StringPtrLen.map_or(std::ptr::null(), |f| f(*argv.add(i), &mut len));
            if p.is_null() {
                String::new()
            } else {
                String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
            }
        })
        .collect()
}

unsafe fn load(ctx: *mut Ctx, argv: *mut *mut raw::ValkeyModuleString, argc: c_int) -> Result<(), String> {
    api::init(ctx)?;
    let version = api::server_version();
    let abi = Abi::for_version(version).ok_or_else(|| {
        format!(
            "valkey-server {} is not supported (supported: {SUPPORTED_VERSIONS}); its connection ABI has not been verified",
            version_string(version)
        )
    })?;
    if !api::at_startup(ctx) {
        return Err("load this module at start-up (loadmodule in valkey.conf or --loadmodule): a connection type cannot be added or removed while the server runs".into());
    }
    let symbols = server::symbols::resolve()?;
    verbs::lib().map_err(|e| e.to_string())?;
    let args = config::parse_module_args(&module_args(argv, argc))?;
    let settings = config::merge(&args, &core_config(ctx))?;
    let accepts_per_cycle =
        api::config_get(ctx, "max-new-connections-per-cycle").and_then(|v| v.parse().ok()).unwrap_or(10);
    let maxclients: i64 = api::config_get(ctx, "maxclients").and_then(|v| v.parse().ok()).unwrap_or(10000);
    let (set_bind, set_port) = (settings.set_bind.clone(), settings.set_port);
    transport::init_global(transport::Global { abi, settings, accepts_per_cycle });

    let mut options = raw::VALKEYMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD;
    if abi != Abi::V8_1 {
        options |= raw::VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    api::set_module_options(ctx, options);
    if !server::symbols::find_event_loop(abi, maxclients) {
        log::debug!("RDMA: server.el not found yet; it is taken from the first accept");
    }
    if (symbols.conn_type_register)(transport::conntype::connection_type_ptr()) != 0 {
        return Err("connTypeRegister refused the rdma connection type (is valkey-rdma.so loaded too?)".into());
    }
    api::start_timer(ctx, protocol::KEEPALIVE_MS as i64, transport::listener::keepalive_tick);
    // Module arguments become the core configs, so that CONFIG GET shows what is used
    // and initListeners picks them up. rdma-rx-size and rdma-completion-vector are
    // immutable at run time: those are applied by the module itself.
    if let Some(bind) = set_bind {
        api::config_set(ctx, "rdma-bind", &bind).map_err(|e| format!("bind={bind}: {e}"))?;
    }
    if let Some(port) = set_port {
        api::config_set(ctx, "rdma-port", &port.to_string()).map_err(|e| format!("port={port}: {e}"))?;
    }
    log::info!("RDMA: connection type registered for valkey {}", version_string(version));
    Ok(())
}

/// # Safety
/// Called by valkey-server with a live module context and `argc` module arguments.
#[no_mangle]
pub unsafe extern "C" fn ValkeyModule_OnLoad(
    ctx: *mut Ctx,
    argv: *mut *mut raw::ValkeyModuleString,
    argc: c_int,
) -> c_int {
    transport::conntype::guard(ERR, || match load(ctx, argv, argc) {
        Ok(()) => OK,
        Err(e) => {
            api::log_line(c"warning", &format!("RDMA: cannot load: {e}"));
            ERR
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
    ERR
}
