//! One side of a connection: the two byte windows plus the rules for control messages.
//! The transport feeds it what the completion queue reports and what the application
//! reads; it answers with messages to send and with [`SessionEvent`]s.

use super::control::ControlMessage;
use super::window::{RxWindow, TxWindow};
use super::{Opcode, Violation, MAX_PEER_RX_SIZE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// What a received control message asks of the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// Nothing to do.
    None,
    /// A Keepalive arrived (nothing to do; clients may count them).
    Keepalive,
    /// Send this message back (the answer to GetServerFeature).
    Reply(ControlMessage),
    /// The peer (re-)registered its RX buffer: the TX window is open again. `resized`
    /// tells the transport that its TX buffer must be re-allocated to `len` bytes.
    PeerRxRegistered { len: u32, resized: bool },
    /// The server answered GetServerFeature (client side).
    ServerFeatures(u64),
    /// The client asked for features we do not have; upstream ignores this too.
    UnsupportedFeatures(u64),
}

#[derive(Debug, Clone)]
pub struct Session {
    role: Role,
    pub rx: RxWindow,
    pub tx: TxWindow,
    /// The RX buffer's address and rkey, for RegisterXferMemory.
    rx_addr: u64,
    rx_key: u32,
}

impl Session {
    pub fn new(role: Role, rx_addr: u64, rx_len: u32, rx_key: u32) -> Self {
        Session { role, rx: RxWindow::new(rx_len), tx: TxWindow::default(), rx_addr, rx_key }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The message that advertises our RX buffer: sent once the connection is
    /// established, and again whenever the buffer was filled and consumed
    /// (docs/protocol.md §4.3).
    pub fn register_rx(&self) -> ControlMessage {
        ControlMessage::RegisterXferMemory { addr: self.rx_addr, length: self.rx.len(), key: self.rx_key }
    }

    /// A SEND arrived in one of our receive slots: `bytes` is what the completion
    /// reports (its `byte_len`).
    pub fn on_control(&mut self, bytes: &[u8]) -> Result<SessionEvent, Violation> {
        let msg = ControlMessage::decode(bytes)?;
        match (self.role, msg) {
            (_, ControlMessage::Keepalive) => Ok(SessionEvent::Keepalive),
            (_, ControlMessage::RegisterXferMemory { addr, length, key }) => {
                if length == 0 || length > MAX_PEER_RX_SIZE {
                    return Err(Violation::BadRegisterLength(length));
                }
                if addr.checked_add(u64::from(length)).is_none() {
                    return Err(Violation::BadRegisterAddress { addr, length });
                }
                let resized = length != self.tx.len();
                self.tx.register(addr, length, key);
                Ok(SessionEvent::PeerRxRegistered { len: length, resized })
            }
            // Upstream answers with the same opcode, `select` echoed, features 0.
            (Role::Server, ControlMessage::GetServerFeature { select_raw, .. }) => {
                Ok(SessionEvent::Reply(ControlMessage::GetServerFeature { select_raw, features: 0 }))
            }
            (Role::Server, ControlMessage::SetClientFeature { features, .. }) => {
                Ok(if features == 0 { SessionEvent::None } else { SessionEvent::UnsupportedFeatures(features) })
            }
            (Role::Client, ControlMessage::GetServerFeature { features, .. }) => {
                Ok(SessionEvent::ServerFeatures(features))
            }
            (Role::Client, ControlMessage::SetClientFeature { .. }) => {
                Err(Violation::UnexpectedOpcode(Opcode::SetClientFeature))
            }
        }
    }

    /// An RDMA_WRITE_WITH_IMM completed in our RX buffer.
    pub fn on_data(&mut self, imm: u32) -> Result<(), Violation> {
        self.rx.on_write(imm)
    }

    /// A new RX buffer replaces ours at a hand-back (docs/protocol.md §4.3): only valid
    /// when the window is back at 0 (full, consumed, not yet handed back).
    pub fn replace_rx(&mut self, addr: u64, len: u32, key: u32) {
        debug_assert!(self.rx.consumed() == 0 && !self.rx.has_unread());
        self.rx_addr = addr;
        self.rx_key = key;
        self.rx = RxWindow::new(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sessions and their RX buffers, wired to each other in memory, as the
    /// NICs would: a write copies into the peer's buffer and completes with an
    /// immediate there; a control message is decoded by the peer.
    struct Peer {
        s: Session,
        rx_buf: Vec<u8>,
        app_in: Vec<u8>,
    }

    fn pair(server_rx: u32, client_rx: u32) -> (Peer, Peer) {
        let mut server = Peer {
            s: Session::new(Role::Server, 0x5000, server_rx, 1),
            rx_buf: vec![0; server_rx as usize],
            app_in: vec![],
        };
        let mut client = Peer {
            s: Session::new(Role::Client, 0x9000, client_rx, 2),
            rx_buf: vec![0; client_rx as usize],
            app_in: vec![],
        };
        // ESTABLISHED: both advertise their RX buffers.
        let to_client = server.s.register_rx().encode();
        let to_server = client.s.register_rx().encode();
        assert!(
            matches!(client.s.on_control(&to_client), Ok(SessionEvent::PeerRxRegistered { len, resized: true }) if len == server_rx)
        );
        assert!(
            matches!(server.s.on_control(&to_server), Ok(SessionEvent::PeerRxRegistered { len, resized: true }) if len == client_rx)
        );
        (server, client)
    }

    /// Sends as much of `data` as the window allows, in writes of at most `chunk`.
    fn send(from: &mut Peer, to: &mut Peer, data: &[u8], chunk: usize) -> usize {
        let mut sent = 0;
        while sent < data.len() {
            let Some((at, n)) = from.s.tx.reserve(chunk.min(data.len() - sent)) else { break };
            to.rx_buf[at as usize..(at + n) as usize].copy_from_slice(&data[sent..sent + n as usize]);
            to.s.on_data(n).unwrap();
            sent += n as usize;
        }
        sent
    }

    /// The receiving application reads everything it can, re-registering when due.
    fn drain(to: &mut Peer, from: &mut Peer, max_read: usize) {
        while to.s.rx.has_unread() {
            let r = to.s.rx.readable();
            let n = max_read.min(r.len());
            to.app_in.extend_from_slice(&to.rx_buf[r.start..r.start + n]);
            // (as `Conn::consume`: a full buffer consumed is handed back)
            if let Some(msg) = to.s.rx.consume(n).then(|| to.s.register_rx()) {
                assert!(matches!(
                    from.s.on_control(&msg.encode()),
                    Ok(SessionEvent::PeerRxRegistered { resized: false, .. })
                ));
            }
        }
    }

    #[test]
    fn a_stream_larger_than_the_rx_buffer_arrives_whole_and_in_order() {
        let (mut server, mut client) = pair(4096, 1000);
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut off, mut rounds) = (0, 0);
        while off < data.len() {
            off += send(&mut client, &mut server, &data[off..], 333);
            drain(&mut server, &mut client, 777);
            rounds += 1;
            assert!(rounds < 1000, "no progress");
        }
        assert_eq!(server.app_in, data);
        assert!(rounds >= 50_000 / 4096, "the RX buffer was re-registered many times");
        // and the other way round, with a smaller buffer
        let mut off = 0;
        while off < data.len() {
            off += send(&mut server, &mut client, &data[off..], 10_000);
            drain(&mut client, &mut server, 64);
        }
        assert_eq!(client.app_in, data);
    }

    #[test]
    fn writer_stops_when_the_peer_stops_reading() {
        let (_server, mut client) = pair(1000, 1000);
        let mut server = _server;
        assert_eq!(send(&mut client, &mut server, &[1; 5000], 100), 1000);
        assert_eq!(send(&mut client, &mut server, &[1; 10], 100), 0, "window exhausted until re-registration");
        // a partial read does not re-open the window
        server.s.rx.consume(999);
        assert_eq!(send(&mut client, &mut server, &[1; 10], 100), 0);
    }

    #[test]
    fn server_answers_features_and_refuses_bad_messages() {
        let (mut server, mut client) = pair(1000, 1000);
        let ask = ControlMessage::GetServerFeature { select_raw: [0xab, 0xcd], features: 99 }.encode();
        let Ok(SessionEvent::Reply(reply)) = server.s.on_control(&ask) else { panic!() };
        assert_eq!(reply, ControlMessage::GetServerFeature { select_raw: [0xab, 0xcd], features: 0 });
        assert_eq!(client.s.on_control(&reply.encode()), Ok(SessionEvent::ServerFeatures(0)));
        let set = ControlMessage::SetClientFeature { select_raw: [0, 0], features: 0 }.encode();
        assert_eq!(server.s.on_control(&set), Ok(SessionEvent::None));
        assert_eq!(client.s.on_control(&ControlMessage::Keepalive.encode()), Ok(SessionEvent::Keepalive));
        let set = ControlMessage::SetClientFeature { select_raw: [0, 0], features: 4 }.encode();
        assert_eq!(server.s.on_control(&set), Ok(SessionEvent::UnsupportedFeatures(4)));
        assert!(client.s.on_control(&set).is_err(), "a server never sends SetClientFeature");
        for len in [0, MAX_PEER_RX_SIZE + 1, u32::MAX] {
            let m = ControlMessage::RegisterXferMemory { addr: 1, length: len, key: 1 }.encode();
            assert_eq!(server.s.on_control(&m), Err(Violation::BadRegisterLength(len)));
        }
        // a region whose end (addr + length) does not fit in 64 bits
        for (addr, ok) in [(u64::MAX - 99, false), (u64::MAX, false), (u64::MAX - 100, true), (0, true)] {
            let m = ControlMessage::RegisterXferMemory { addr, length: 100, key: 1 }.encode();
            let got = server.s.on_control(&m);
            if ok {
                assert!(got.is_ok(), "{addr:#x}: {got:?}");
            } else {
                assert_eq!(got, Err(Violation::BadRegisterAddress { addr, length: 100 }));
            }
        }
        assert!(server.s.on_data(1001).is_err());
        assert_eq!(server.s.on_control(&[0; 16]), Err(Violation::BadControlLength(16)));
    }
}
