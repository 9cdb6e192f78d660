//! The server edge: valkey-server's internal ABI per version (`abi`), the internal
//! functions resolved at load (`symbols`), and the public module API (`api`).
//! The `extern "C"` callbacks that the server calls live in `crate::transport::conntype`.

pub mod abi;
pub mod api;
pub mod symbols;
