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
//! - this file: what loading does, wiring only (the entry points are in `server`).

pub mod client;
pub mod config;
pub mod doctor;
pub mod protocol;
pub mod server;
pub(crate) mod transport;
pub(crate) mod verbs;

use server::abi::{version_string, Abi, SUPPORTED_VERSIONS};
use server::api::{self, LoadCtx};
use transport::RdmaConnection;
use valkey_module::raw;

/// Reads the core `rdma-*` configs (already parsed from valkey.conf and the command
/// line when modules load).
fn core_config(ctx: &LoadCtx) -> config::CoreConfig {
    let get = |name: &str| ctx.config_get(name);
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

/// `ValkeyModule_OnLoad` after the module API is initialised (`server/module.rs`):
/// checks the server, reads the configuration, registers the connection type.
fn on_load(ctx: &LoadCtx) -> Result<(), String> {
    let version = api::server_version();
    let abi = Abi::for_version(version).ok_or_else(|| {
        format!(
            "valkey-server {} is not supported (supported: {SUPPORTED_VERSIONS}); its connection ABI has not been verified",
            version_string(version)
        )
    })?;
    if !ctx.at_startup() {
        return Err("load this module at start-up (loadmodule in valkey.conf or --loadmodule): a connection type cannot be added or removed while the server runs".into());
    }
    transport::knobs::init_from_env().map_err(|e| e.to_string())?;
    server::symbols::resolve()?;
    verbs::lib().map_err(|e| e.to_string())?;
    let args = config::parse_module_args(&ctx.args).map_err(|e| e.to_string())?;
    let settings = config::merge(&args, &core_config(ctx)).map_err(|e| e.to_string())?;
    let accepts_per_cycle = ctx.config_get("max-new-connections-per-cycle").and_then(|v| v.parse().ok()).unwrap_or(10);
    let maxclients: i64 = ctx.config_get("maxclients").and_then(|v| v.parse().ok()).unwrap_or(10000);
    let (set_bind, set_port) = (settings.set_bind.clone(), settings.set_port);
    let per_client = verbs::pinned_bytes(settings.rx_size, protocol::DEFAULT_RX_SIZE);
    let ceiling = settings.max_pinned.unwrap_or_else(|| {
        verbs::pinned::default_ceiling(per_client, maxclients.max(1) as u64, verbs::physical_memory())
    });
    verbs::pinned::set_ceiling(ceiling);
    log::info!(
        "RDMA: pinned-memory ceiling {} MiB ({}; a busy client pins up to {} KiB)",
        ceiling >> 20,
        if settings.max_pinned.is_some() {
            "max-pinned"
        } else {
            "maxclients at rdma-rx-size, at most half the memory"
        },
        per_client >> 10
    );
    transport::init_global(transport::Global { settings, accepts_per_cycle });

    let mut options = raw::VALKEYMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD;
    if abi != Abi::V8_1 {
        options |= raw::VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    ctx.set_module_options(options);
    // The knob is the end-to-end suite's way to reach the case where server.el is not
    // found at load (a server layout we cannot read), in which listeners closed before
    // the first accept must stay open.
    let skip_find = transport::knobs::value(transport::knobs::Knob::UnknownEventLoop).is_some();
    if skip_find || !server::symbols::find_event_loop(abi, maxclients) {
        log::debug!("RDMA: server.el not found yet; it is taken from the first accept");
    }
    server::register::<RdmaConnection>(abi)?;
    server::start_timer::<RdmaConnection>(protocol::KEEPALIVE_MS / protocol::keepalive::SLICES)?;
    server::register_info::<RdmaConnection>(ctx)?;
    // Module arguments become the core configs, so that CONFIG GET shows what is used
    // and initListeners picks them up. rdma-rx-size and rdma-completion-vector are
    // immutable at run time: those are applied by the module itself.
    if let Some(bind) = set_bind {
        ctx.config_set("rdma-bind", &bind).map_err(|e| format!("bind={bind}: {e}"))?;
    }
    if let Some(port) = set_port {
        ctx.config_set("rdma-port", &port.to_string()).map_err(|e| format!("port={port}: {e}"))?;
    }
    log::info!("RDMA: connection type registered for valkey {}", version_string(version));
    Ok(())
}
