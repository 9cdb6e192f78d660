//! The verbs edge: librdmacm and libibverbs, loaded at run time, and an RAII owner for
//! every object they hand out. All `unsafe` that touches RDMA lives here.
//!
//! Why run-time loading: valkey-server loads modules with `RTLD_DEEPBIND`. On distro
//! builds, where a system jemalloc interposes `malloc`, a module with libibverbs in its
//! `DT_NEEDED` drags libnl into the module's private scope and the server aborts in a
//! mixed-allocator `free` (docs/server-abi.md §6). `dlopen(RTLD_GLOBAL)` from
//! inside the module keeps those libraries in the global scope. rdma-sys supplies the
//! types and the inline verbs (`ibv_post_send`, `ibv_poll_cq`, … dispatch through the
//! context's ops table); the exported functions come from [`lib()`].

mod buffer;
mod cq;
mod device;
mod dynlib;
mod endpoint;
mod map_budget;
mod mr;
mod nic;
pub mod pinned;
mod resources;
mod shared_cq;
mod slots;
mod system;
mod tx_buffers;
mod tx_plan;

pub(crate) use buffer::chunks as buffer_chunks;
pub(crate) use cq::CompletionChannel;
pub(crate) use device::{
    holds as device_held, let_go_of_removed_devices, name_of as device_name, unlisted as unlisted_devices, DeviceKey,
};
pub use dynlib::{lib, Lib};
pub use endpoint::{pinned_bytes, Completion, Endpoint, EndpointConfig, PreparedRx, QueueDepths, TX_CHUNK};
pub use map_budget::{clients_for_maps, map_count_now, maps_for_clients, max_map_count, MAPS_PER_ENDPOINT};
pub use resources::{CmEvent, CmId, ConnParams, EventChannel};
pub(crate) use shared_cq::{FirstPoll, FirstPolled, FIRST_POLL};
pub use shared_cq::{SharedCq, WorkCompletion, MAX_SHARED_CQES};
pub use system::{device_count, fork_init, memlock_limit, physical_memory, wait_readable};

/// The verbs or rdma_cm operation that failed, so that callers can tell failures apart
/// (and give operators the right hint) without comparing strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbsOp {
    CreateEventChannel,
    GetCmEvent,
    CreateId,
    MigrateId,
    SetOption,
    BindAddr,
    Listen,
    ResolveAddr,
    ResolveRoute,
    Accept,
    Connect,
    /// The rdma_cm id has no device yet (an id of a request that is not routed).
    NoDevice,
    AllocPd,
    CreateCompChannel,
    CreateCq,
    ReqNotifyCq,
    /// Attaching a QP to a shared CQ: no room (`ENOSPC`), another device (`EXDEV`), or
    /// completions of a destroyed QP of the same number still queued (`EBUSY`).
    AttachCq,
    /// A new endpoint would leave too few memory mappings (`vm.max_map_count`) for the
    /// live ones (`ENOMEM`; `map_budget`).
    MapCount,
    CreateQp,
    ModifyQp,
    RegMr,
    /// A registration that would pass the module's pinned-memory ceiling (`EDQUOT`;
    /// [`pinned`]).
    PinnedCeiling,
    /// Mapping a pinned buffer.
    Mmap,
    /// Making a pinned buffer's guard page.
    Mprotect,
    SetNonblocking,
    PostSend,
    PostRecv,
    PollCq,
    GetCqEvent,
    /// A control message with the send queue (or its slots) full.
    ControlQueueFull,
    /// A write or send before the peer registered its RX buffer.
    NotRegistered,
    /// A write that does not fit the TX buffer.
    TxOverrun,
}

impl VerbsOp {
    /// The library call (or the condition) by its usual name, for log lines.
    pub fn name(self) -> &'static str {
        match self {
            VerbsOp::CreateEventChannel => "rdma_create_event_channel",
            VerbsOp::GetCmEvent => "rdma_get_cm_event",
            VerbsOp::CreateId => "rdma_create_id",
            VerbsOp::MigrateId => "rdma_migrate_id",
            VerbsOp::SetOption => "rdma_set_option",
            VerbsOp::BindAddr => "rdma_bind_addr",
            VerbsOp::Listen => "rdma_listen",
            VerbsOp::ResolveAddr => "rdma_resolve_addr",
            VerbsOp::ResolveRoute => "rdma_resolve_route",
            VerbsOp::Accept => "rdma_accept",
            VerbsOp::Connect => "rdma_connect",
            VerbsOp::NoDevice => "rdma_cm id without a device",
            VerbsOp::AllocPd => "ibv_alloc_pd",
            VerbsOp::CreateCompChannel => "ibv_create_comp_channel",
            VerbsOp::CreateCq => "ibv_create_cq",
            VerbsOp::ReqNotifyCq => "ibv_req_notify_cq",
            VerbsOp::AttachCq => "attach to a shared completion queue",
            VerbsOp::MapCount => "admission by memory mappings (vm.max_map_count)",
            VerbsOp::CreateQp => "rdma_create_qp",
            VerbsOp::ModifyQp => "ibv_modify_qp",
            VerbsOp::RegMr => "ibv_reg_mr",
            VerbsOp::PinnedCeiling => "admission by the pinned-memory ceiling (max-pinned)",
            VerbsOp::Mmap => "mmap",
            VerbsOp::Mprotect => "mprotect (guard page)",
            VerbsOp::SetNonblocking => "fcntl(O_NONBLOCK)",
            VerbsOp::PostSend => "ibv_post_send",
            VerbsOp::PostRecv => "ibv_post_recv",
            VerbsOp::PollCq => "ibv_poll_cq",
            VerbsOp::GetCqEvent => "ibv_get_cq_event",
            VerbsOp::ControlQueueFull => "control send (send queue full)",
            VerbsOp::NotRegistered => "write before RegisterXferMemory",
            VerbsOp::TxOverrun => "write past the TX buffer",
        }
    }
}

/// An error from a verbs or rdma_cm call: which operation failed and the errno it left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsError {
    pub op: VerbsOp,
    pub errno: i32,
}

impl VerbsError {
    /// Captures `errno` right after a failed call.
    pub fn last(op: VerbsOp) -> Self {
        VerbsError { op, errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0) }
    }
    pub fn with(op: VerbsOp, errno: i32) -> Self {
        VerbsError { op, errno }
    }
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.op.name(), std::io::Error::from_raw_os_error(self.errno))
    }
}

impl std::error::Error for VerbsError {}

pub type Result<T> = std::result::Result<T, VerbsError>;
