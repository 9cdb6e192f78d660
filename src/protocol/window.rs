//! Byte windows (docs/protocol.md §4). Data moves by RDMA_WRITE_WITH_IMM into the
//! receiver's RX buffer, laid down sequentially from offset 0; the immediate carries
//! the byte count. There is no wrap-around: once the buffer is full *and* consumed the
//! receiver re-advertises it with RegisterXferMemory and both sides restart at 0.

use super::Violation;

/// Our RX buffer, as the receiver sees it: `pos <= offset <= len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxWindow {
    len: u32,
    /// Bytes the peer has written (sum of immediates since the last registration).
    offset: u32,
    /// Bytes the application has consumed.
    pos: u32,
    /// Writes (immediates) since the last registration: how finely the peer fills the
    /// buffer (the adaptive RX window's measure, docs/protocol.md §4.3).
    writes: u32,
}

impl RxWindow {
    pub fn new(len: u32) -> Self {
        RxWindow { len, offset: 0, pos: 0, writes: 0 }
    }
    pub fn len(&self) -> u32 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A completion of RDMA_WRITE_WITH_IMM arrived with `imm` bytes. Upstream asserts
    /// here (`rdma.c:578-584`); we refuse the peer instead.
    pub fn on_write(&mut self, imm: u32) -> Result<(), Violation> {
        match self.offset.checked_add(imm) {
            Some(end) if end <= self.len => {
                self.offset = end;
                self.writes = self.writes.saturating_add(1);
                Ok(())
            }
            _ => Err(Violation::RxOverrun { offset: self.offset, imm, len: self.len }),
        }
    }
    /// The unread bytes, as a range of the RX buffer.
    pub fn readable(&self) -> std::ops::Range<usize> {
        self.pos as usize..self.offset as usize
    }
    pub fn has_unread(&self) -> bool {
        self.pos < self.offset
    }
    /// The application consumed `n` bytes of [`readable`](Self::readable).
    /// Returns true when the buffer is now full and consumed: the caller must
    /// re-advertise it (RegisterXferMemory); the window is reset to 0 here.
    pub fn consume(&mut self, n: usize) -> bool {
        let n = n.min((self.offset - self.pos) as usize) as u32;
        self.pos += n;
        if self.pos == self.len {
            self.pos = 0;
            self.offset = 0;
            self.writes = 0;
            return true;
        }
        false
    }
    pub fn consumed(&self) -> u32 {
        self.pos
    }
    /// Bytes the peer has written since the last registration.
    pub fn written(&self) -> u32 {
        self.offset
    }
    /// Writes the peer has made since the last registration (saturating: empty writes
    /// fill nothing but still count).
    pub fn writes(&self) -> u32 {
        self.writes
    }
}

/// The peer's RX buffer, as the sender sees it. Empty until the peer's first
/// RegisterXferMemory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxWindow {
    pub remote_addr: u64,
    pub rkey: u32,
    len: u32,
    offset: u32,
}

impl TxWindow {
    /// The peer (re-)registered its RX buffer: write from offset 0 again.
    pub fn register(&mut self, addr: u64, len: u32, rkey: u32) {
        *self = TxWindow { remote_addr: addr, rkey, len, offset: 0 };
    }
    pub fn len(&self) -> u32 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn available(&self) -> u32 {
        self.len - self.offset
    }
    /// Where the next write lands in the peer's buffer (and, mirrored, in ours).
    pub fn offset(&self) -> u32 {
        self.offset
    }
    /// Claims up to `want` bytes. Returns the offset in the peer's (and, mirrored, our
    /// TX) buffer and the byte count; `None` when the window is exhausted.
    pub fn reserve(&mut self, want: usize) -> Option<(u32, u32)> {
        let n = (want.min(u32::MAX as usize) as u32).min(self.available());
        if n == 0 {
            return None;
        }
        let at = self.offset;
        self.offset += n;
        Some((at, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rx_accepts_writes_up_to_the_end_and_refuses_overruns() {
        let mut rx = RxWindow::new(100);
        rx.on_write(60).unwrap();
        rx.on_write(40).unwrap();
        assert_eq!(rx.readable(), 0..100);
        assert_eq!(rx.on_write(1), Err(Violation::RxOverrun { offset: 100, imm: 1, len: 100 }));
        let mut rx = RxWindow::new(100);
        assert!(rx.on_write(u32::MAX).is_err(), "u32 overflow must not wrap");
        rx.on_write(10).unwrap();
        assert!(rx.on_write(u32::MAX - 5).is_err());
    }

    #[test]
    fn rx_asks_for_reregistration_only_when_full_and_consumed() {
        let mut rx = RxWindow::new(10);
        rx.on_write(10).unwrap();
        assert!(!rx.consume(4));
        assert_eq!(rx.readable(), 4..10);
        assert_eq!((rx.written(), rx.writes()), (10, 1));
        assert!(rx.consume(6));
        assert_eq!(rx.readable(), 0..0);
        assert_eq!((rx.written(), rx.writes()), (0, 0), "counted again from the hand-back");
        rx.on_write(3).unwrap();
        assert!(!rx.consume(3), "consumed but not full: no re-registration");
        assert!(!rx.consume(5), "consuming more than is readable is clamped");
        assert_eq!(rx.consumed(), 3);
    }

    #[test]
    fn tx_reserves_until_exhausted_then_restarts_on_registration() {
        let mut tx = TxWindow::default();
        assert_eq!(tx.reserve(5), None, "nothing before the first RegisterXferMemory");
        tx.register(0x1000, 10, 7);
        assert_eq!(tx.reserve(4), Some((0, 4)));
        assert_eq!(tx.reserve(100), Some((4, 6)));
        assert_eq!(tx.reserve(1), None);
        tx.register(0x2000, 10, 8);
        assert_eq!(tx.reserve(10), Some((0, 10)));
        assert_eq!((tx.remote_addr, tx.rkey), (0x2000, 8));
    }
}
