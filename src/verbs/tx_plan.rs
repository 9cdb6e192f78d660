//! How one data write of the TX buffer becomes work requests (docs/protocol.md §4.3).
//!
//! The TX buffer is registered in chunks, and a work request has at most
//! [`SGES_PER_WR`] scatter entries, one per chunk it touches. A write that spans more
//! chunks is posted as a chain of work requests in one `ibv_post_send` (one doorbell):
//! plain RDMA_WRITEs, then one RDMA_WRITE_WITH_IMM whose immediate is the length of the
//! whole write. The peer sees one write, as from the C module: on a reliable
//! connection the completion of the last request tells it that the bytes of the
//! earlier ones are in place.
//!
//! Pure arithmetic, tested here; the verbs calls are in `endpoint.rs`.
#![forbid(unsafe_code)]

/// Scatter entries per send work request (the QP's `max_send_sge`).
pub const SGES_PER_WR: usize = 2;

/// The most work requests one write posts. With 64 KiB chunks a write carries up to
/// 2 MiB, more than a libvalkey client's whole window (1 MiB), so the server hands a
/// large reply over in one call, as a socket would take it.
pub const MAX_WRS_PER_WRITE: usize = 16;

/// One piece of the TX buffer: `len` bytes at `offset`, all inside one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub offset: u32,
    pub len: u32,
}

/// One work request of a write: its pieces, in order and contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedWr {
    pub pieces: [Piece; SGES_PER_WR],
    pub sges: usize,
}

impl PlannedWr {
    /// Where its bytes start in the TX buffer (and in the peer's RX buffer).
    pub fn offset(&self) -> u32 {
        self.pieces[0].offset
    }
}

/// How many bytes a write starting at `offset` may carry with `wrs` work requests:
/// up to the end of the `wrs * SGES_PER_WR`-th chunk it touches.
pub fn write_limit(offset: u32, chunk: u32, wrs: usize) -> u32 {
    let chunk = u64::from(chunk.max(1));
    let chunks = (wrs.max(1) * SGES_PER_WR) as u64;
    (chunks * chunk - u64::from(offset) % chunk).min(u64::from(u32::MAX)) as u32
}

/// Whether `len` bytes (at least one) at `offset` lie in one `chunk`-byte chunk: the
/// plan's one request of one piece. The endpoint decides this with the buffer at hand
/// (`TxRegion::chunk_of`); this is what its tests check it against.
#[cfg(test)]
pub fn within_one_chunk(offset: u32, len: u32, chunk: u32) -> bool {
    let chunk = chunk.max(1);
    len > 0 && u64::from(offset % chunk) + u64::from(len) <= u64::from(chunk)
}

/// The work requests for `len` bytes at `offset` of a TX buffer cut in `chunk`-byte
/// chunks: each chunk touched is one piece, [`SGES_PER_WR`] pieces per request. A
/// write of no bytes is one request with one empty piece (the test peer's zero-length
/// immediate). `None` when it would take more than [`MAX_WRS_PER_WRITE`] requests.
pub fn plan(offset: u32, len: u32, chunk: u32) -> Option<impl ExactSizeIterator<Item = PlannedWr>> {
    let chunk = u64::from(chunk.max(1));
    let (start, end) = (u64::from(offset), u64::from(offset) + u64::from(len));
    let first_chunk = start / chunk;
    let chunks = if len == 0 { 1 } else { (end - 1) / chunk - first_chunk + 1 };
    let wrs = chunks.div_ceil(SGES_PER_WR as u64) as usize;
    if wrs > MAX_WRS_PER_WRITE {
        return None;
    }
    let piece = move |i: u64| {
        let lo = start.max((first_chunk + i) * chunk);
        let hi = end.min((first_chunk + i + 1) * chunk);
        Piece { offset: lo as u32, len: (hi - lo) as u32 }
    };
    Some((0..wrs).map(move |w| {
        let first = (w * SGES_PER_WR) as u64;
        let sges = (chunks - first).min(SGES_PER_WR as u64) as usize;
        let mut pieces = [Piece { offset: 0, len: 0 }; SGES_PER_WR];
        for (k, p) in pieces.iter_mut().enumerate().take(sges) {
            *p = piece(first + k as u64);
        }
        PlannedWr { pieces, sges }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chunk_is_where_the_first_and_the_last_byte_share_a_chunk() {
        for chunk in [1u32, 2, 3, 7, 8, 64] {
            for offset in 0..200 {
                for len in 0..=150 {
                    let first_and_last = len > 0 && offset / chunk == (offset + len - 1) / chunk;
                    assert_eq!(within_one_chunk(offset, len, chunk), first_and_last, "{offset}+{len} in {chunk}");
                    assert_eq!(
                        within_one_chunk(offset, len, chunk),
                        plan(offset, len, chunk).is_some_and(|mut p| p.len() == 1 && p.next().unwrap().sges == 1)
                            && len > 0
                    );
                }
            }
        }
        // at the top of the offsets: no overflow
        for (offset, len, chunk, one) in
            [(u32::MAX - 1, 1, u32::MAX, true), (u32::MAX - 1, 2, u32::MAX, false), (u32::MAX, u32::MAX, 65536, false)]
        {
            assert_eq!(within_one_chunk(offset, len, chunk), one, "{offset}+{len} in {chunk}");
        }
    }

    #[test]
    fn a_write_of_one_chunk_is_never_cut_wherever_it_starts() {
        // what Endpoint::tx_write_never_cut promises the driver
        for chunk in [1u32, 7, 4096, 65536] {
            for offset in (0..3 * chunk).step_by((chunk as usize / 5).max(1)).chain([chunk - 1, u32::MAX - 1]) {
                for wrs in 0..4 {
                    assert!(write_limit(offset, chunk, wrs) >= chunk, "chunk {chunk} offset {offset} wrs {wrs}");
                }
            }
        }
    }

    /// Every (offset, len) over a small buffer: the pieces cover the bytes exactly, in
    /// order, each inside one chunk, at most two per request, and every request but the
    /// last is full (two pieces), so the chain is as short as it can be.
    #[test]
    fn a_plan_covers_the_write_exactly_with_the_fewest_requests() {
        for chunk in [1u32, 3, 4, 7, 16] {
            for offset in 0..64u32 {
                for len in 0..=(64 - offset) {
                    let wrs: Vec<_> = match plan(offset, len, chunk) {
                        Some(p) => p.collect(),
                        None => {
                            assert!(write_limit(offset, chunk, MAX_WRS_PER_WRITE) < len, "{offset}+{len}/{chunk}");
                            continue;
                        }
                    };
                    let mut at = offset;
                    for (i, wr) in wrs.iter().enumerate() {
                        assert!((1..=SGES_PER_WR).contains(&wr.sges));
                        assert!(i + 1 == wrs.len() || wr.sges == SGES_PER_WR);
                        assert_eq!(wr.offset(), at);
                        for p in &wr.pieces[..wr.sges] {
                            assert_eq!(p.offset, at, "contiguous");
                            assert!(len == 0 || p.len > 0);
                            if p.len > 0 {
                                assert_eq!(p.offset / chunk, (p.offset + p.len - 1) / chunk, "inside one chunk");
                            }
                            at += p.len;
                        }
                    }
                    assert_eq!(at, offset + len, "{offset}+{len}/{chunk}");
                    let touched = if len == 0 { 1 } else { (offset + len - 1) / chunk - offset / chunk + 1 };
                    assert_eq!(wrs.len(), touched.div_ceil(SGES_PER_WR as u32) as usize);
                }
            }
        }
    }

    /// `write_limit` is exactly the longest write the plan accepts with that many requests.
    #[test]
    fn the_write_limit_is_the_longest_write_that_fits_the_requests() {
        for chunk in [1u32, 5, 64 * 1024] {
            for offset in [0, 1, chunk - 1, chunk, 3 * chunk + 2] {
                for wrs in 1..=MAX_WRS_PER_WRITE {
                    let limit = write_limit(offset, chunk, wrs);
                    assert_eq!(plan(offset, limit, chunk).map(|p| p.len()), Some(wrs));
                    let over = plan(offset, limit + 1, chunk).map_or(MAX_WRS_PER_WRITE + 1, |p| p.len());
                    assert_eq!(over, wrs + 1);
                }
            }
        }
    }

    /// A 1 MB reply into a fresh 1 MiB window goes in one write of eight requests.
    #[test]
    fn a_megabyte_reply_is_one_write() {
        let len = 1_048_576 + 14;
        let window = 1 << 20;
        assert!(write_limit(0, 64 * 1024, MAX_WRS_PER_WRITE) >= window);
        assert_eq!(plan(0, window, 64 * 1024).map(|p| p.len()), Some(8));
        assert!(plan(0, len, 64 * 1024).is_some());
        // a client's buffer is one chunk: one request, one piece
        let one: Vec<_> = plan(5, 1000, u32::MAX).unwrap().collect();
        assert_eq!(
            one,
            vec![PlannedWr { pieces: [Piece { offset: 5, len: 1000 }, Piece { offset: 0, len: 0 }], sges: 1 }]
        );
    }
}
