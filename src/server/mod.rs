//! The server edge: valkey-server's internal ABI per version (`abi`), the internal
//! functions resolved at load (`symbols`), the public module API (`api`), the module's
//! entry points (`module`), the server's half of a connection (`host`) and the
//! `ConnectionType` table whose callbacks forward to a safe [`conntype::Transport`].
//! Every raw pointer the server hands over is turned into a reference here.

pub mod abi;
pub(crate) mod api;
pub(crate) mod conntype;
pub(crate) mod host;
mod module;
pub(crate) mod symbols;

pub(crate) use conntype::{register, register_info, start_timer, watch_fd, Transport};
pub(crate) use host::{ConnState, Hosted, ServerHandler};
