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

mod dynlib;
mod endpoint;
mod resources;

pub use dynlib::{lib, Lib};
pub use endpoint::{pinned_bytes, Completion, Endpoint, EndpointConfig};
pub use resources::{event_name, CmEvent, CmId, EventChannel, PinnedBuffer};

pub use rdma_sys as sys;

/// An error from a verbs or rdma_cm call: what failed and the errno it left.
#[derive(Debug, Clone)]
pub struct VerbsError {
    pub what: &'static str,
    pub errno: i32,
}

impl VerbsError {
    /// Captures `errno` right after a failed call.
    pub fn last(what: &'static str) -> Self {
        VerbsError { what, errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0) }
    }
    pub fn with(what: &'static str, errno: i32) -> Self {
        VerbsError { what, errno }
    }
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.what, std::io::Error::from_raw_os_error(self.errno))
    }
}

impl std::error::Error for VerbsError {}

pub type Result<T> = std::result::Result<T, VerbsError>;
