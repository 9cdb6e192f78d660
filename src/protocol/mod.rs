//! The Valkey Over RDMA protocol, pure: no syscalls, no `unsafe`, no verbs.
//!
//! Everything here is driven by the transport (`crate::transport`) or the client
//! (`crate::client`) with plain values — a received 32-byte message, an immediate, a
//! count of bytes the application consumed — and answers with plain values: a message to
//! send, a window to write into, or a [`Violation`] that ends the connection. Two peers
//! can therefore be driven against each other in memory (see the tests in `session.rs`).
//!
//! Specification: Valkey's `docs/rdma.md`/"Valkey Over RDMA" as implemented by
//! `src/rdma.c` and `deps/libvalkey/src/rdma.c` (9.1.2), written down for this project
//! in `docs/protocol.md`, whose sections are cited next to the code ("docs/protocol.md §3").

#![forbid(unsafe_code)]

pub mod conn;
pub mod control;
pub(crate) mod driver;
pub mod keepalive;
pub mod session;
pub mod window;

pub use control::{ControlMessage, Opcode, CONTROL_MESSAGE_LEN};
pub use session::{Session, SessionEvent};
pub use window::{RxWindow, TxWindow};

/// Keepalive period of the server (`VALKEY_RDMA_KEEPALIVE_MS`).
pub const KEEPALIVE_MS: u64 = 3000;
/// A peer that acknowledged none of our work requests in flight for this many keepalive
/// periods in a row is gone (host down, cable pulled) and its connection is closed
/// (docs/protocol.md §5): 9 to 12 s after it fell silent. A live peer's NIC acknowledges
/// every period's Keepalive within microseconds, whatever its process is doing.
///
/// Three, not two: a link that comes back must get one of the NIC's retransmissions
/// through before the count runs out. A Keepalive sent as the link drops is retried
/// every ACK timeout (2.1 s with rdma_cm's RoCE default), so `n` periods keep every link
/// that is back within `3n - 2.1` s: 3.9 s with two, too short for a cable pulled and
/// plugged back, and 6.9 s with three (docs/protocol.md §5, `tests/e2e/linkdown.sh`).
pub const DEAD_PEER_TICKS: u32 = 3;
/// The ACK timeout of a RoCE queue pair that rdma_cm set up (timeout 19: 4.096 µs × 2¹⁹).
const ROCE_ACK_TIMEOUT_MS: u64 = 2147;
// A cable pulled for 5 s is away about 6 s in the test bed (`tests/e2e/linkdown.sh`).
const _: () = assert!(DEAD_PEER_TICKS as u64 * KEEPALIVE_MS - ROCE_ACK_TIMEOUT_MS >= 6800);
/// A server connection whose handshake the client has not completed (no ESTABLISHED) by
/// this keepalive tick after the connect request is given up (docs/protocol.md §5): 9 to
/// 12 s. The last step of a live client's handshake follows its first within
/// milliseconds; without a deadline the CM holds a half-done one for minutes.
pub const HANDSHAKE_TICKS: u32 = 4;
/// Default, smallest and largest RX buffer a server offers (`rdma-rx-size`).
pub const DEFAULT_RX_SIZE: u32 = 1024 * 1024;
pub const MIN_RX_SIZE: u32 = 64 * 1024;
/// How much larger each step of the adaptive RX window is (docs/protocol.md §4.3): 64 KiB
/// goes to the default cap of 1 MiB in one step. Every step costs the client one
/// hand-back it must wait for; with ×4 (two steps to 1 MiB) the second one fell inside
/// short pipelined runs, and ×16 took p99 to 0.89-0.96 of the ×4 build's at P16 (docs/measurements/history.md,
/// Measurements). A connection that never writes half of 64 KiB still pins only that.
pub const RX_GROWTH_FACTOR: u32 = 16;
/// A server RX buffer grows only for a client that fills it in at most this many writes
/// (docs/protocol.md §4.3): every hand-back holds one of the client's writes up for a
/// round trip, so a client that needs more writes per buffer is held up on fewer than
/// 1 in 128 of its requests, below the p99, and keeps its small buffer. Growing it
/// anyway cost a 1 MiB registration per connection for nothing: at `-c 32 -P 1` all 32
/// of them fell together, mid-run, and the requests around them were the slowest of
/// the run (docs/measurements/keepalive-busy-2026-12-01).
pub const RX_GROWTH_MAX_WRITES: u32 = 128;
pub const MAX_RX_SIZE: u32 = 16 * 1024 * 1024;
/// The largest RX buffer we accept from a peer: a peer announcing more would make us
/// pin that much memory for its TX buffer. Upstream clients announce 1 MiB.
pub const MAX_PEER_RX_SIZE: u32 = MAX_RX_SIZE;

/// A peer broke the protocol. The connection is closed with one log line naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A SEND whose length is not 32 bytes (docs/protocol.md §3, §6).
    BadControlLength(u32),
    /// An opcode outside 0..=3.
    UnknownOpcode(u16),
    /// GetServerFeature sent to a client, or another server-only message.
    UnexpectedOpcode(Opcode),
    /// RegisterXferMemory with a length of zero or above [`MAX_PEER_RX_SIZE`].
    BadRegisterLength(u32),
    /// RDMA_WRITE_WITH_IMM whose byte count overruns the RX buffer we offered.
    RxOverrun { offset: u32, imm: u32, len: u32 },
    /// RegisterXferMemory whose region would wrap past the end of the address space:
    /// no real buffer is there, and `addr + offset` would overflow (docs/protocol.md §6).
    BadRegisterAddress { addr: u64, length: u32 },
    /// RegisterXferMemory enlarging the window while `held` earlier TX buffers still
    /// wait for writes the peer keeps from completing (docs/protocol.md §6).
    WindowsInFlight { held: u32 },
}

impl Violation {
    /// Every kind, in the order of [`Violation::index`].
    pub const KINDS: [&'static str; 7] = [
        "bad_control_length",
        "unknown_opcode",
        "unexpected_opcode",
        "bad_register_length",
        "rx_overrun",
        "bad_register_address",
        "windows_in_flight",
    ];

    /// The kind's position in [`Violation::KINDS`] (for counters).
    pub fn index(&self) -> usize {
        match self {
            Violation::BadControlLength(_) => 0,
            Violation::UnknownOpcode(_) => 1,
            Violation::UnexpectedOpcode(_) => 2,
            Violation::BadRegisterLength(_) => 3,
            Violation::RxOverrun { .. } => 4,
            Violation::BadRegisterAddress { .. } => 5,
            Violation::WindowsInFlight { .. } => 6,
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::BadControlLength(n) => write!(f, "control message of {n} bytes (expected 32)"),
            Violation::UnknownOpcode(op) => write!(f, "unknown control opcode {op}"),
            Violation::UnexpectedOpcode(op) => write!(f, "unexpected control message {op:?}"),
            Violation::BadRegisterLength(n) => {
                write!(f, "RegisterXferMemory with length {n} (allowed 1..={MAX_PEER_RX_SIZE})")
            }
            Violation::BadRegisterAddress { addr, length } => {
                write!(f, "RegisterXferMemory of {length} bytes at {addr:#x} wraps past the end of the address space")
            }
            Violation::WindowsInFlight { held } => write!(
                f,
                "RegisterXferMemory enlarged the window while {held} earlier TX buffers still wait for writes that do not complete"
            ),
            Violation::RxOverrun { offset, imm, len } => {
                write!(f, "RDMA write of {imm} bytes at offset {offset} overruns the {len}-byte RX buffer")
            }
        }
    }
}
