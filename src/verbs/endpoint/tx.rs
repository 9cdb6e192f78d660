//! The TX side of an endpoint: the buffer that mirrors the peer's RX buffer,
//! registered chunk by chunk, one write as a chain of work requests, and the buffers
//! retired until the writes that read them completed (docs/protocol.md §2, §4.3).

use std::mem::MaybeUninit;

use rdma_sys::*;

use super::{Endpoint, Result, VerbsError, VerbsOp, INLINE_WRITE_MAX};
use crate::protocol::driver::parts_len;
use crate::verbs::buffer::PinnedBuffer;
use crate::verbs::mr::MemoryRegion;
use crate::verbs::tx_plan;

impl Endpoint {
    /// Makes sure the TX buffer has `len` bytes (the peer's RX buffer size): mapped now,
    /// registered chunk by chunk as writes reach them ([`EndpointConfig::tx_chunk`]).
    ///
    /// The old buffer may still be read by the NIC: a peer may re-register before our
    /// last writes into its old buffer completed on our side (a retransmission reads
    /// them again), and a hostile one may do it at any time. So it is not freed here but
    /// retired until the send queue has completed every work request posted so far
    /// ([`TxBuffers`], docs/protocol.md §4.3).
    pub fn ensure_tx(&mut self, len: u32) -> Result<()> {
        if self.tx.current().is_some_and(|r| r.buf.len() >= len as usize) {
            return Ok(());
        }
        let buf = PinnedBuffer::new(len as usize)?;
        let chunk = (self.tx_chunk as usize).min(buf.len());
        let chunks = (0..buf.len().div_ceil(chunk)).map(|_| None).collect();
        self.tx
            .replace(Some(TxRegion { chunks, buf, chunk }))
            .map_err(|_| VerbsError::with(VerbsOp::TxOverrun, libc::ENOBUFS))
    }

    /// How many bytes a write landing at `offset` of the peer's window (mirrored in the
    /// TX buffer) may carry at most: as many chunks as the send queue's free entries
    /// can take, two per work request, up to [`tx_plan::MAX_WRS_PER_WRITE`] requests
    /// (docs/protocol.md §4.3).
    pub fn tx_write_limit(&self, offset: u32) -> u32 {
        let wrs = self.data_wr_room().min(tx_plan::MAX_WRS_PER_WRITE as u64) as usize;
        tx_plan::write_limit(offset, self.tx_chunk, wrs)
    }

    /// What [`tx_write_limit`](Self::tx_write_limit) never cuts: a write gets at least
    /// one work request of [`tx_plan::SGES_PER_WR`] pieces, so at least the rest of the
    /// chunk it starts in and the whole next one, more than one chunk.
    pub fn tx_write_never_cut(&self) -> u32 {
        const _: () = assert!(tx_plan::SGES_PER_WR >= 2);
        self.tx_chunk
    }

    /// Send-queue entries a data write may use now.
    pub(super) fn data_wr_room(&self) -> u64 {
        self.sq_room().saturating_sub(self.sq_reserved)
    }

    /// The scatter entry for `len` bytes of the TX buffer at `offset`, all in one chunk,
    /// registering that chunk if no write reached it before.
    #[inline]
    pub(super) fn tx_sge(&mut self, offset: u32, len: u32) -> Result<ibv_sge> {
        let region = self.tx.current().ok_or(VerbsError::with(VerbsOp::NotRegistered, libc::ENOTCONN))?;
        let (i, start, chunk_len) =
            region.chunk_of(offset, len).ok_or(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL))?;
        let addr = region.addr(offset);
        let lkey = match &region.chunks[i] {
            Some(mr) => mr.lkey(),
            None => self.register_tx_chunk(i, start, chunk_len)?,
        };
        Ok(ibv_sge { addr, length: len, lkey })
    }

    /// Registers chunk `i` of the TX buffer (`chunk_len` bytes at `start`), the first
    /// time a write reaches it; returns its key.
    #[cold]
    #[inline(never)]
    fn register_tx_chunk(&mut self, i: usize, start: usize, chunk_len: usize) -> Result<u32> {
        let region = self.tx.current().ok_or(VerbsError::with(VerbsOp::NotRegistered, libc::ENOTCONN))?;
        // SAFETY: the chunk lies inside the TX buffer (the caller checked), which the
        // region keeps mapped until its chunks' regions are dropped (TxRegion's field
        // order).
        let mr = unsafe { self.pd()?.register_local(region.buf.as_ptr().add(start), chunk_len)? };
        let lkey = mr.lkey();
        if let Some(r) = self.tx.current_mut() {
            r.chunks[i] = Some(mr);
        }
        Ok(lkey)
    }

    /// The peer's RX buffer is `len` bytes: the TX buffer is made that large on the next
    /// write (on demand: a connection that only reads pins none). One that is too small
    /// is retired now, as in [`ensure_tx`](Self::ensure_tx). Err (how many are held)
    /// when `MAX_RETIRED` (4) retired buffers still wait for their writes: a peer that
    /// keeps our writes from completing and enlarges its window again and again would
    /// otherwise make us pin a buffer per step (docs/protocol.md §6).
    pub fn set_tx_len(&mut self, len: u32) -> std::result::Result<(), usize> {
        self.tx_len_wanted = len;
        if self.tx.current().is_some_and(|r| r.buf.len() < len as usize) {
            self.tx.replace(None)?;
        }
        Ok(())
    }

    /// Once per keepalive tick, before the Keepalive (if any) is posted
    /// (docs/protocol.md §5). In this order, since each step reads what the one before
    /// left:
    /// - `unacknowledged_ticks`: the ticks in a row at which sends were in flight and
    ///   none completed ([`TxBuffers::tick`]); the core decides what that means;
    /// - `busy_and_acknowledged`: data writes were posted since the last tick and some
    ///   send completed in it, so the peer is alive and needs no Keepalive now;
    /// - `released_tx`: the TX buffer [`release_idle_tx`](Self::release_idle_tx) gave
    ///   up (it starts the next period's write count);
    /// - `nothing_in_flight`: no send work request waits for the peer's NIC, so a
    ///   Keepalive can wait for the connection's turn.
    pub fn keepalive_tick(&mut self) -> KeepaliveTick {
        let unacknowledged_ticks = self.tx.tick();
        let busy_and_acknowledged = self.writes_since_idle_check > 0 && self.tx.progressed_at_last_tick();
        let released_tx = self.release_idle_tx();
        let nothing_in_flight = self.tx.in_flight() == 0;
        KeepaliveTick { unacknowledged_ticks, busy_and_acknowledged, nothing_in_flight, released_tx }
    }

    /// Frees the TX buffer of a connection that posted no data write since the last
    /// call and whose send queue has completed everything (so the NIC reads none of
    /// it); the next write makes a new one. Called on every keepalive tick *before*
    /// the Keepalive is posted, so the previous tick's signalled Keepalive has told us
    /// that the writes before it completed: an idle connection's TX buffer goes after
    /// two ticks. Returns the buffer, for the caller to free off the event loop.
    pub(super) fn release_idle_tx(&mut self) -> Option<ReleasedTx> {
        let idle = self.writes_since_idle_check == 0;
        self.writes_since_idle_check = 0;
        if !idle || self.tx_len_wanted == 0 {
            return None;
        }
        self.tx.release_if_quiet().map(ReleasedTx)
    }

    /// Whether the send queue can take a data write now.
    pub fn can_write(&self) -> bool {
        self.data_wr_room() > 0
    }

    /// Copies the first `len` bytes of `parts` (in order) into the TX buffer at
    /// `offset` and writes them to `remote_addr + offset` as one write for the peer:
    /// one RDMA_WRITE_WITH_IMM of `len` bytes, after plain RDMA_WRITEs for the chunks
    /// beyond the first two ([`tx_plan`]).
    #[inline(always)]
    pub fn post_write(&mut self, offset: u32, parts: &[&[u8]], len: u32, remote_addr: u64, rkey: u32) -> Result<()> {
        self.post_write_imm(offset, parts, len, remote_addr, rkey, len)
    }

    /// As [`post_write`](Self::post_write) with an explicit immediate. Only the test
    /// peer (`client::hostile`) sends one that differs from the length.
    #[inline(always)]
    pub fn post_write_imm(
        &mut self,
        offset: u32,
        parts: &[&[u8]],
        len: u32,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> Result<()> {
        let total = len as usize;
        if total > 0 && len <= self.max_inline {
            return self.post_inline_write(InlineWrite { offset, len, remote_addr, rkey, imm }, parts);
        }
        if self.tx.current().is_none() && self.tx_len_wanted > 0 {
            self.ensure_tx(self.tx_len_wanted)?;
        }
        self.writes_since_idle_check += 1;
        let region = self.tx.current().ok_or(VerbsError::with(VerbsOp::NotRegistered, libc::ENOTCONN))?;
        let buf = &region.buf;
        let mut at = offset as usize;
        let end = at + total;
        if end > buf.len() || parts_len(parts) < total {
            return Err(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL));
        }
        for p in parts {
            let k = p.len().min(end - at);
            // SAFETY: [offset, offset+total) was reserved by the TX window and no posted
            // work request still reads it (the window only reopens after the peer
            // consumed); the buffer is written only by the holder of `&mut self`.
            unsafe { buf.copy_in(at, &p[..k]) };
            at += k;
            if at == end {
                break;
            }
        }
        // The usual write: in one chunk, registered by an earlier write; one request of
        // one piece, with the region at hand (no second look at the TX buffer).
        if let Some(mut sge) = region.registered_sge(offset, len) {
            let mut wr = rdma_write(&mut sge, 1, remote_addr + u64::from(offset), rkey, Some(imm));
            return self.post_send_chain(std::slice::from_mut(&mut wr), 0, false);
        }
        let chunk = region.chunk.min(u32::MAX as usize) as u32;
        self.post_planned_write(offset, len, remote_addr, rkey, imm, chunk)
    }

    /// A write the device takes inline (at most [`INLINE_WRITE_MAX`] bytes) as one
    /// RDMA_WRITE_WITH_IMM posted inline (docs/protocol.md §4.1): the bytes are gathered on the stack and the
    /// device copies them into the work request as it is posted, so no TX buffer is
    /// made, written or registered for them, and the device reads no memory of ours
    /// for them afterwards. The peer sees the same write as from the TX buffer.
    #[inline(always)]
    fn post_inline_write(&mut self, w: InlineWrite, parts: &[&[u8]]) -> Result<()> {
        let InlineWrite { offset, len, remote_addr, rkey, imm } = w;
        let total = len as usize;
        let inside_window = (offset as usize).checked_add(total).is_some_and(|end| end <= self.tx_len_wanted as usize);
        if !inside_window || parts_len(parts) < total {
            return Err(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL));
        }
        if self.data_wr_room() == 0 {
            return Err(VerbsError::with(VerbsOp::TxOverrun, libc::ENOBUFS));
        }
        // One part (the usual reply) is posted from where it is; several are gathered
        // on the stack first. Either way the device copies the bytes as it is posted.
        let mut gathered: [u8; INLINE_WRITE_MAX as usize];
        let from = match parts {
            [one, ..] if one.len() >= total => one.as_ptr(),
            _ => {
                gathered = [0; INLINE_WRITE_MAX as usize];
                let mut at = 0;
                for p in parts {
                    let k = p.len().min(total - at);
                    gathered[at..at + k].copy_from_slice(&p[..k]);
                    at += k;
                    if at == total {
                        break;
                    }
                }
                gathered.as_ptr()
            }
        };
        self.writes_since_idle_check += 1;
        // (an inline request's scatter entry needs no key: the device reads it at post)
        let mut sge = ibv_sge { addr: from as u64, length: len, lkey: 0 };
        let mut wr = rdma_write(&mut sge, 1, remote_addr + u64::from(offset), rkey, Some(imm));
        wr.send_flags = ibv_send_flags::IBV_SEND_INLINE.0;
        self.post_send_chain(std::slice::from_mut(&mut wr), 0, false)
    }

    /// Posts the work requests of one write ([`tx_plan::plan`]) as one chain: plain
    /// RDMA_WRITEs, the last an RDMA_WRITE_WITH_IMM carrying `imm`. The peer is told
    /// only by the last one's immediate; on a reliable connection its completion means
    /// that the bytes of the earlier ones are placed (docs/protocol.md §4.3).
    ///
    /// Every write but the usual one (one chunk, registered): across chunks, the first
    /// into a chunk (registered here), or of no bytes. Out of line, so that the usual
    /// write's path stays one function.
    #[inline(never)]
    fn post_planned_write(
        &mut self,
        offset: u32,
        len: u32,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        chunk: u32,
    ) -> Result<()> {
        let plan = tx_plan::plan(offset, len, chunk).ok_or(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL))?;
        let n = plan.len();
        if n as u64 > self.data_wr_room().max(1) {
            return Err(VerbsError::with(VerbsOp::TxOverrun, libc::ENOBUFS));
        }
        // Only the requests this write uses are built: most writes are one request, and
        // zeroing all MAX_WRS_PER_WRITE of them (2.5 KiB with their scatter lists) for
        // every reply was work no request needed (docs/measurements/write-path-2026-12-02).
        const MAX: usize = tx_plan::MAX_WRS_PER_WRITE;
        let mut sges = [const { MaybeUninit::<[ibv_sge; tx_plan::SGES_PER_WR]>::uninit() }; MAX];
        let mut wrs = [const { MaybeUninit::<ibv_send_wr>::uninit() }; MAX];
        let mut built = 0;
        for planned in plan {
            let mut list = [ibv_sge { addr: 0, length: 0, lkey: 0 }; tx_plan::SGES_PER_WR];
            for (sge, p) in list.iter_mut().zip(&planned.pieces[..planned.sges]) {
                *sge = self.tx_sge(p.offset, p.len)?;
            }
            // (indexing panics past MAX, so `built` never exceeds it)
            let sg_list = sges[built].write(list).as_mut_ptr();
            wrs[built].write(rdma_write(sg_list, planned.sges, remote_addr + u64::from(planned.offset()), rkey, None));
            built += 1;
        }
        // SAFETY: the first `built` (<= MAX) requests were written in the loop above.
        let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast::<ibv_send_wr>(), built) };
        // The last request carries the immediate that tells the peer (plan() yields >= 1).
        let last = wrs.last_mut().ok_or(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL))?;
        last.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        last.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        self.post_send_chain(wrs, 0, false)
    }
}

/// An RDMA_WRITE of the `num_sge` pieces at `sg_list` to `remote_addr`; with `imm`, an
/// RDMA_WRITE_WITH_IMM that tells the peer (docs/protocol.md §4.1).
fn rdma_write(sg_list: *mut ibv_sge, num_sge: usize, remote_addr: u64, rkey: u32, imm: Option<u32>) -> ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr (plain integers, null pointers).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.sg_list = sg_list;
    wr.num_sge = num_sge as i32;
    wr.wr.rdma = rdma_t { remote_addr, rkey };
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    if let Some(imm) = imm {
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    }
    wr
}

/// Where an inline write goes in the peer's window, and the immediate that tells it.
struct InlineWrite {
    offset: u32,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
}

/// What [`Endpoint::keepalive_tick`] found.
pub struct KeepaliveTick {
    pub unacknowledged_ticks: u32,
    pub busy_and_acknowledged: bool,
    pub nothing_in_flight: bool,
    pub released_tx: Option<ReleasedTx>,
}

/// An idle connection's TX buffer, given up at a keepalive tick when no work request
/// can read it. Dropping it deregisters its chunks and unmaps it: milliseconds under
/// Soft-RoCE (the unmap's TLB shootdown, the regions), which ten thousand connections
/// going idle together would take from the event loop in one tick. So the owner drops
/// it elsewhere (docs/protocol.md §2, TX buffer).
pub struct ReleasedTx(TxRegion);

impl ReleasedTx {
    /// The bytes it had registered.
    pub fn registered_bytes(&self) -> u64 {
        self.0.registered_bytes() as u64
    }
}

/// The TX buffer: one mapping as long as the peer's RX buffer (offsets mirror it), and
/// one memory region per `chunk` bytes of it, `None` until a write first reaches that
/// chunk ([`EndpointConfig::tx_chunk`]). Dropping it deregisters the regions, then
/// unmaps the buffer (field order); each region keeps the domain until then, also
/// when a released buffer is freed after its endpoint.
pub(super) struct TxRegion {
    pub(super) chunks: Vec<Option<MemoryRegion>>,
    pub(super) buf: PinnedBuffer,
    pub(super) chunk: usize,
}

impl TxRegion {
    pub(super) fn registered_bytes(&self) -> usize {
        self.chunks.iter().flatten().map(MemoryRegion::len).sum()
    }

    /// The chunk that holds all `len` bytes at `offset`: its index, start and length;
    /// `None` when they cross a chunk's end or leave the buffer (one division; checked
    /// against [`tx_plan::within_one_chunk`] below).
    #[inline(always)]
    fn chunk_of(&self, offset: u32, len: u32) -> Option<(usize, usize, usize)> {
        let (i, at) = (offset as usize / self.chunk, offset as usize % self.chunk);
        let start = i * self.chunk;
        let chunk_len = self.chunk.min(self.buf.len().saturating_sub(start));
        (i < self.chunks.len() && at + len as usize <= chunk_len).then_some((i, start, chunk_len))
    }

    /// The address of byte `offset` (a number for the device: nothing is read through it
    /// here).
    #[inline(always)]
    fn addr(&self, offset: u32) -> u64 {
        self.buf.as_ptr().wrapping_add(offset as usize) as u64
    }

    /// The scatter entry for `len` bytes (at least one) at `offset`, when they lie in one
    /// chunk that is registered already.
    #[inline(always)]
    fn registered_sge(&self, offset: u32, len: u32) -> Option<ibv_sge> {
        if len == 0 {
            return None;
        }
        let (i, ..) = self.chunk_of(offset, len)?;
        let lkey = self.chunks[i].as_ref()?.lkey();
        Some(ibv_sge { addr: self.addr(offset), length: len, lkey })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TX buffer of `pages` pages in `chunk`-byte chunks, none registered (no device).
    fn region(pages: usize, chunk: usize) -> TxRegion {
        let buf = PinnedBuffer::new(pages * crate::verbs::buffer::page_size()).expect("a mapping");
        let chunks = (0..buf.len().div_ceil(chunk)).map(|_| None).collect();
        TxRegion { chunks, buf, chunk }
    }

    /// `chunk_of` places exactly the writes that lie in one chunk and inside the buffer,
    /// the last chunk a partial one included; `registered_sge` gives none before its
    /// chunk is registered.
    #[test]
    fn a_write_is_placed_in_one_chunk_exactly_when_it_lies_in_one_inside_the_buffer() {
        let page = crate::verbs::buffer::page_size();
        for (pages, chunk) in [(5, page), (5, 2 * page), (7, 3 * page), (2, usize::MAX >> 1)] {
            let r = region(pages, chunk);
            let end = r.buf.len();
            let offsets = (0..end + 2).step_by(page / 4).flat_map(|o| [o, o.saturating_sub(1), o + 1]);
            for offset in offsets.filter(|&o| o <= u32::MAX as usize) {
                for len in [1, 2, page / 2, page - 1, page, page + 1, 2 * page, 3 * page] {
                    let (o, l) = (offset as u32, len as u32);
                    let want =
                        tx_plan::within_one_chunk(o, l, chunk.min(u32::MAX as usize) as u32) && offset + len <= end;
                    let got = r.chunk_of(o, l);
                    assert_eq!(got.is_some(), want, "{offset}+{len} in {chunk}-byte chunks of {end}");
                    if let Some((i, start, chunk_len)) = got {
                        assert_eq!((i, start), (offset / chunk, offset / chunk * chunk));
                        assert_eq!(chunk_len, chunk.min(end - start));
                    }
                    assert!(r.registered_sge(o, l).is_none(), "no chunk is registered");
                }
            }
        }
    }
}
