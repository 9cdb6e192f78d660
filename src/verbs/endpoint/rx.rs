//! The RX side of an endpoint: the buffer the peer writes into, copied out by range,
//! and larger ones prepared off the event loop and swapped in at a hand-back
//! (docs/protocol.md §4.3).

use std::sync::Arc;

use super::{Endpoint, Result};
use crate::protocol::conn::RxBuffer;
use crate::verbs::buffer::PinnedBuffer;
use crate::verbs::mr::{MemoryRegion, ProtectionDomain};

impl Endpoint {
    /// The RX buffer's address as the peer names it: an offset space of its own, not
    /// where the buffer is in this process (docs/protocol.md §6).
    pub fn rx_addr(&self) -> u64 {
        self.rx_iova
    }

    pub fn rx_key(&self) -> u32 {
        self.rx_mr.as_ref().map_or(0, MemoryRegion::rkey)
    }

    pub fn rx_len(&self) -> u32 {
        self.rx_mr.as_ref().map_or(0, |m| m.len() as u32)
    }

    /// Where the RX buffer is, as RegisterXferMemory names it.
    pub fn rx_region(&self) -> RxBuffer {
        RxBuffer { addr: self.rx_addr(), len: self.rx_len(), key: self.rx_key() }
    }

    /// Copies the RX buffer's bytes at `range` (one the protocol reports as written)
    /// into the start of `out`; appends with [`copy_rx_into_vec`](Self::copy_rx_into_vec).
    ///
    /// Panics if the range is outside the RX buffer or longer than `out` (the buffer's
    /// own check: the registered region is the buffer, or a prefix of it).
    pub fn copy_rx(&self, range: std::ops::Range<usize>, out: &mut [u8]) {
        self.rx_buf.copy_out(range.start, &mut out[..range.len()]);
    }

    /// Appends the RX buffer's bytes at `range` to `out`.
    pub fn copy_rx_into_vec(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + range.len(), 0);
        self.copy_rx(range, &mut out[at..]);
    }

    /// What it takes to make a larger RX buffer of `len` bytes on this endpoint's
    /// protection domain, to be run off the event loop (the adaptive RX window,
    /// docs/protocol.md §4.3): registering 1 MiB blocked the loop long enough to show in
    /// every connection's p99 latency.
    pub fn rx_preparation(&self, len: u32) -> Option<RxPreparation> {
        self.pd.as_ref().map(|pd| RxPreparation { pd: Arc::clone(pd), len })
    }

    /// Makes a prepared buffer the RX buffer. Only at a hand-back that names it: the
    /// peer filled the old buffer completely and waits for that RegisterXferMemory, so
    /// no write of its can still target the old one, which is freed here.
    pub fn install_rx(&mut self, mut new: PreparedRx) {
        let (Some(mr), Some(buf)) = (new.mr.take(), new.buf.take()) else { return };
        // (per the doc comment, nothing reads or writes the old region any more: it is
        // deregistered, then unmapped)
        drop(self.rx_mr.replace(mr));
        drop(std::mem::replace(&mut self.rx_buf, buf));
        self.rx_iova = new.iova;
    }
}

/// The job of making a larger RX buffer ([`Endpoint::rx_preparation`]); `Send`, so it
/// can run on another thread.
pub struct RxPreparation {
    pd: Arc<ProtectionDomain>,
    len: u32,
}

impl RxPreparation {
    /// Maps and registers the buffer (the slow part: the kernel pins every page).
    pub fn run(self) -> Result<PreparedRx> {
        let buf = PinnedBuffer::new(self.len as usize)?;
        // SAFETY: the buffer is moved into the result with its region, which is dropped
        // before the buffer (PreparedRx's field order).
        let (mr, iova) = unsafe { self.pd.register_for_peer(buf.as_ptr(), self.len as usize)? };
        Ok(PreparedRx { mr: Some(mr), buf: Some(buf), iova })
    }
}

/// A registered RX buffer not yet in use ([`Endpoint::install_rx`]); dropped unused, it
/// deregisters (letting go of the domain), then unmaps (field order).
pub struct PreparedRx {
    mr: Option<MemoryRegion>,
    buf: Option<PinnedBuffer>,
    iova: u64,
}

impl PreparedRx {
    /// Where it is, as RegisterXferMemory will name it.
    pub fn region(&self) -> RxBuffer {
        let (len, key) = self.mr.as_ref().map_or((0, 0), |m| (m.len() as u32, m.rkey()));
        RxBuffer { addr: self.iova, len, key }
    }
    /// Memory it pins, in bytes.
    pub fn pinned_bytes(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.len() as u64)
    }
}
