//! The receives of an endpoint: each control slot is posted as a receive, and one that
//! completed is posted again with the ones before it, [`RECV_REPOST_BATCH`] at a time,
//! as one chain (docs/protocol.md §4.5). The provider's work per call is about as much
//! as a receive's own, and the chain's requests are kept filled in between: a receive
//! that completes writes two fields.

use rdma_sys::*;

use super::{Endpoint, Result, VerbsError, VerbsOp};
use crate::protocol::CONTROL_MESSAGE_LEN;

/// Receives posted again together; at most this many less one are not posted at any
/// time (of [`super::RX_SLOTS`]).
pub(super) const RECV_REPOST_BATCH: usize = 8;

/// The chain of receive requests being filled, and how far.
pub(super) struct RecvChain {
    /// Boxed: each request points at the next and at its entry, so neither may move.
    reqs: Box<Requests>,
    /// Requests filled so far.
    filled: usize,
    /// Requests posted together: [`RECV_REPOST_BATCH`], less on a short receive queue.
    batch: usize,
}

struct Requests {
    wrs: [ibv_recv_wr; RECV_REPOST_BATCH],
    sges: [ibv_sge; RECV_REPOST_BATCH],
}

impl RecvChain {
    /// For a receive queue of `depth` entries: a batch of a quarter of it at most, so
    /// that a short queue keeps most of its receives posted.
    pub(super) fn new(depth: u32) -> RecvChain {
        let batch = (depth as usize / 4).clamp(1, RECV_REPOST_BATCH);
        // SAFETY: all-zero requests and entries are valid (null pointers, zero counts).
        let mut reqs: Box<Requests> = Box::new(unsafe { std::mem::zeroed() });
        let (wr_at, sge_at) = (reqs.wrs.as_mut_ptr(), reqs.sges.as_mut_ptr());
        for i in 0..RECV_REPOST_BATCH {
            // SAFETY: i and i + 1 (only when below the batch) are within the arrays,
            // which the box keeps in place for as long as the chain lives.
            unsafe {
                let wr = &mut *wr_at.add(i);
                wr.next = if i + 1 < batch { wr_at.add(i + 1) } else { std::ptr::null_mut() };
                wr.sg_list = sge_at.add(i);
                wr.num_sge = 1;
                (*sge_at.add(i)).length = CONTROL_MESSAGE_LEN as u32;
            }
        }
        RecvChain { reqs, filled: 0, batch }
    }

    /// The control region's key, once it is registered.
    pub(super) fn set_lkey(&mut self, lkey: u32) {
        for sge in &mut self.reqs.sges {
            sge.lkey = lkey;
        }
    }

    /// Fills the next request with slot `slot` at `addr`; true when the batch is full.
    #[inline]
    fn push(&mut self, slot: usize, addr: u64) -> bool {
        let i = self.filled;
        self.reqs.sges[i].addr = addr;
        self.reqs.wrs[i].wr_id = slot as u64;
        self.filled = i + 1;
        self.filled == self.batch
    }

    /// Hands the requests filled so far, as one chain, to `post` (nothing when none
    /// are); the chain is empty again after. Returns what `post` returned (0 for none).
    fn post_filled(&mut self, post: impl FnOnce(*mut ibv_recv_wr) -> i32) -> i32 {
        let n = std::mem::take(&mut self.filled);
        if n == 0 {
            return 0;
        }
        let wrs = &mut self.reqs.wrs;
        // A short chain ends at its last request for this post.
        let after = std::mem::replace(&mut wrs[n - 1].next, std::ptr::null_mut());
        let rc = post(wrs.as_mut_ptr());
        wrs[n - 1].next = after;
        rc
    }
}

impl Endpoint {
    /// A receive slot that completed: posted again once the batch is full.
    #[inline]
    pub(super) fn repost_recv(&mut self, slot: usize) -> Result<()> {
        // (slot < depths.recv: its address is inside the control buffer)
        let addr = self.ctrl_buf.as_ptr() as u64 + (slot * CONTROL_MESSAGE_LEN) as u64;
        if self.recv.push(slot, addr) {
            return self.post_filled_recvs();
        }
        Ok(())
    }

    /// Posts every receive slot (a new endpoint).
    pub(super) fn post_all_recvs(&mut self) -> Result<()> {
        for slot in 0..self.depths.recv as usize {
            self.repost_recv(slot)?;
        }
        // the last, short batch too
        self.post_filled_recvs()
    }

    /// Posts the requests filled so far as one chain.
    fn post_filled_recvs(&mut self) -> Result<()> {
        let qp = self.qp();
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain's requests and entries are valid and in
        // place (boxed), and the slots stay registered until the QP is destroyed.
        let rc = self.recv.post_filled(|chain| unsafe { ibv_post_recv(qp, chain, &mut bad) });
        if rc != 0 {
            return Err(VerbsError::last(VerbsOp::PostRecv));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The requests of a chain from its first, as the provider walks them: (slot, address).
    fn walk(first: *mut ibv_recv_wr) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut wr = first;
        while !wr.is_null() {
            // SAFETY: the chain's pointers stay within its boxed arrays (what is tested).
            unsafe {
                assert_eq!((*wr).num_sge, 1);
                let sge = &*(*wr).sg_list;
                assert_eq!((sge.length, sge.lkey), (CONTROL_MESSAGE_LEN as u32, 7));
                out.push(((*wr).wr_id, sge.addr));
                wr = (*wr).next;
            }
        }
        out
    }

    /// What one post hands the provider, and the post's own answer back.
    fn posted(c: &mut RecvChain) -> Vec<(u64, u64)> {
        let mut seen = Vec::new();
        let rc = c.post_filled(|first| {
            seen = walk(first);
            5
        });
        assert_eq!(rc, 5, "the post's answer is returned");
        assert_eq!(c.filled, 0, "empty after a post");
        seen
    }

    #[test]
    fn a_batch_is_a_quarter_of_a_short_queue_and_at_most_eight() {
        for (depth, batch) in [(1, 1), (3, 1), (4, 1), (16, 4), (31, 7), (32, 8), (256, 8), (1023, 8)] {
            assert_eq!(RecvChain::new(depth).batch, batch, "depth {depth}");
        }
    }

    #[test]
    fn a_full_batch_is_one_chain_of_its_slots_in_order_and_survives_a_move() {
        for depth in [16, 256] {
            let mut c = RecvChain::new(depth);
            c.set_lkey(7);
            let mut full = Vec::new();
            for i in 0..c.batch {
                full.push(c.push(100 + i, 0x1000 + 32 * i as u64));
            }
            assert!(full.pop().unwrap() && full.iter().all(|f| !f), "full at the last push only");
            // the chain's box, not the chain, holds the requests: moving it changes nothing
            let mut moved = Box::new(c);
            let want: Vec<(u64, u64)> = (0..moved.batch).map(|i| (100 + i as u64, 0x1000 + 32 * i as u64)).collect();
            assert_eq!(posted(&mut moved), want);
            assert_eq!(moved.post_filled(|_| panic!("nothing is filled")), 0);
        }
    }

    #[test]
    fn a_short_chain_ends_at_its_last_slot_and_the_next_batch_is_whole_again() {
        let mut c = RecvChain::new(256);
        c.set_lkey(7);
        for i in 0..3 {
            assert!(!c.push(i, 0x2000 + i as u64));
        }
        assert_eq!(posted(&mut c), vec![(0, 0x2000), (1, 0x2001), (2, 0x2002)]);
        for i in 0..8 {
            c.push(10 + i, 0x3000 + i as u64);
        }
        assert_eq!(posted(&mut c), (0..8).map(|i| (10 + i, 0x3000 + i)).collect::<Vec<_>>());
    }
}
