//! The 32-byte control messages (docs/protocol.md §3; upstream `ValkeyRdmaCmd`,
//! `src/rdma.c:34-67`, `deps/libvalkey/src/rdma.c:209-249`). All multi-byte fields are
//! big-endian. They travel as IBV_WR_SEND into one of the peer's posted 32-byte slots.
//!
//! ```text
//!  bytes  Feature (0, 1)      Keepalive (2)   RegisterXferMemory (3)
//!  0-1    opcode              opcode          opcode
//!  2-3    select              reserved        reserved
//!  4-15   reserved            reserved        reserved
//!  16-23  reserved            reserved        addr   (u64, peer RX buffer)
//!  24-27  features (u64,      reserved        length (u32)
//!  28-31   bytes 24-31)       reserved        key    (u32, rkey)
//! ```

use super::Violation;

pub const CONTROL_MESSAGE_LEN: usize = 32;

/// The opcode that marks a free slot in the send pool of the upstream implementations
/// (`VALKEY_RDMA_INVALID_OPCODE`); never valid on the wire.
pub const INVALID_OPCODE: u16 = 0xffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Opcode {
    GetServerFeature = 0,
    SetClientFeature = 1,
    Keepalive = 2,
    RegisterXferMemory = 3,
}

/// A decoded control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMessage {
    /// Client → server: "which features do you have?". `select` is echoed back
    /// byte for byte (upstream answers without swapping it, `rdma.c:487-495`).
    GetServerFeature { select_raw: [u8; 2], features: u64 },
    /// Client → server: "enable these features". No feature is defined yet.
    SetClientFeature { select_raw: [u8; 2], features: u64 },
    /// Server → client every [`super::KEEPALIVE_MS`]; carries nothing.
    Keepalive,
    /// "Write into my RX buffer at `addr` (rkey `key`), `length` bytes, from offset 0."
    RegisterXferMemory { addr: u64, length: u32, key: u32 },
}

impl ControlMessage {
    pub fn opcode(&self) -> Opcode {
        match self {
            ControlMessage::GetServerFeature { .. } => Opcode::GetServerFeature,
            ControlMessage::SetClientFeature { .. } => Opcode::SetClientFeature,
            ControlMessage::Keepalive => Opcode::Keepalive,
            ControlMessage::RegisterXferMemory { .. } => Opcode::RegisterXferMemory,
        }
    }

    pub fn encode(&self) -> [u8; CONTROL_MESSAGE_LEN] {
        let mut b = [0u8; CONTROL_MESSAGE_LEN];
        b[0..2].copy_from_slice(&(self.opcode() as u16).to_be_bytes());
        match *self {
            ControlMessage::GetServerFeature { select_raw, features }
            | ControlMessage::SetClientFeature { select_raw, features } => {
                b[2..4].copy_from_slice(&select_raw);
                b[24..32].copy_from_slice(&features.to_be_bytes());
            }
            ControlMessage::Keepalive => {}
            ControlMessage::RegisterXferMemory { addr, length, key } => {
                b[16..24].copy_from_slice(&addr.to_be_bytes());
                b[24..28].copy_from_slice(&length.to_be_bytes());
                b[28..32].copy_from_slice(&key.to_be_bytes());
            }
        }
        b
    }

    /// Decodes a received SEND. `bytes` is what the completion says arrived
    /// (`wc.byte_len` bytes of the slot): anything but 32 bytes is a violation.
    pub fn decode(bytes: &[u8]) -> Result<Self, Violation> {
        if bytes.len() != CONTROL_MESSAGE_LEN {
            return Err(Violation::BadControlLength(bytes.len() as u32));
        }
        let be16 = |i: usize| u16::from_be_bytes([bytes[i], bytes[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
        let be64 = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().unwrap());
        let select_raw = [bytes[2], bytes[3]];
        Ok(match be16(0) {
            0 => ControlMessage::GetServerFeature { select_raw, features: be64(24) },
            1 => ControlMessage::SetClientFeature { select_raw, features: be64(24) },
            2 => ControlMessage::Keepalive,
            3 => ControlMessage::RegisterXferMemory { addr: be64(16), length: be32(24), key: be32(28) },
            op => return Err(Violation::UnknownOpcode(op)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_xfer_memory_is_big_endian_at_upstream_offsets() {
        let m = ControlMessage::RegisterXferMemory { addr: 0x0102030405060708, length: 0x00100000, key: 0xaabbccdd };
        let b = m.encode();
        assert_eq!(&b[0..2], &[0, 3]);
        assert_eq!(&b[16..24], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[24..28], &[0x00, 0x10, 0x00, 0x00]);
        assert_eq!(&b[28..32], &[0xaa, 0xbb, 0xcc, 0xdd]);
        assert!(b[2..16].iter().all(|&x| x == 0));
        assert_eq!(ControlMessage::decode(&b), Ok(m));
    }

    #[test]
    fn feature_messages_round_trip_and_keep_select_bytes() {
        for m in [
            ControlMessage::GetServerFeature { select_raw: [0x12, 0x34], features: 0 },
            ControlMessage::SetClientFeature { select_raw: [0, 1], features: 0x8000_0000_0000_0001 },
            ControlMessage::Keepalive,
        ] {
            assert_eq!(ControlMessage::decode(&m.encode()), Ok(m));
        }
        let b = ControlMessage::GetServerFeature { select_raw: [0x12, 0x34], features: 0 }.encode();
        assert_eq!(&b[2..4], &[0x12, 0x34]);
    }

    #[test]
    fn wrong_length_and_unknown_opcodes_are_violations() {
        assert_eq!(ControlMessage::decode(&[0u8; 31]), Err(Violation::BadControlLength(31)));
        assert_eq!(ControlMessage::decode(&[0u8; 33]), Err(Violation::BadControlLength(33)));
        assert_eq!(ControlMessage::decode(&[]), Err(Violation::BadControlLength(0)));
        let mut b = [0u8; 32];
        b[1] = 4;
        assert_eq!(ControlMessage::decode(&b), Err(Violation::UnknownOpcode(4)));
        b[0] = 0xff;
        b[1] = 0xff;
        assert_eq!(ControlMessage::decode(&b), Err(Violation::UnknownOpcode(INVALID_OPCODE)));
    }
}
