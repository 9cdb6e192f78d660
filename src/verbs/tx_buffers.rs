//! Which TX buffers the NIC may still read (docs/protocol.md §4.3), as pure bookkeeping
//! so that the rule is unit-tested without a NIC.
//!
//! A TX buffer is replaced when the peer registers a larger RX buffer
//! (RegisterXferMemory) or released when the connection idles. Work requests posted
//! before that may still read the old buffer: the peer may re-register before our last
//! writes into its old buffer completed on our side (a retransmission reads them
//! again), and a hostile peer may do it at any time. So a replaced
//! buffer is *retired*, not freed, until the send queue has completed every work request
//! posted before it was replaced. An RC send queue completes in order, so "the work
//! request numbered `seq` completed" means every one before it did too.
//!
//! `B` frees itself when dropped (the endpoint's `TxRegion` deregisters its memory
//! region), so "free" here is "drop".
#![forbid(unsafe_code)]

/// Replaced buffers a connection may have waiting for their writes at once. A peer
/// that enlarges its window only after reading what was written (every client that
/// follows the protocol) leaves at most one; more means writes that never complete,
/// kept so by the peer, and each pins what was written into it.
pub(crate) const MAX_RETIRED: usize = 4;

pub(crate) struct TxBuffers<B> {
    current: Option<B>,
    /// Replaced buffers, each with the number of send work requests posted before it
    /// was replaced: it is freed once that many have completed.
    retired: Vec<(B, u64)>,
    posted: u64,
    completed: u64,
    /// For [`tick`](Self::tick): `completed` at the last tick, and the ticks in a row
    /// that saw work requests in flight and no completion.
    completed_at_tick: u64,
    stalled_ticks: u32,
    /// Whether a work request completed between the last two ticks.
    progressed_at_last_tick: bool,
}

impl<B> TxBuffers<B> {
    pub(crate) const fn new() -> Self {
        TxBuffers {
            current: None,
            retired: Vec::new(),
            posted: 0,
            completed: 0,
            completed_at_tick: 0,
            progressed_at_last_tick: false,
            stalled_ticks: 0,
        }
    }

    pub(crate) fn current(&self) -> Option<&B> {
        self.current.as_ref()
    }

    pub(crate) fn current_mut(&mut self) -> Option<&mut B> {
        self.current.as_mut()
    }

    /// Send work requests posted and not yet known to be completed.
    pub(crate) fn in_flight(&self) -> u64 {
        self.posted - self.completed
    }

    /// The number the next send work request carries (in its wr_id).
    pub(crate) fn next_seq(&self) -> u64 {
        self.posted
    }

    /// The work request numbered [`next_seq`](Self::next_seq) was posted.
    pub(crate) fn on_posted(&mut self) {
        self.posted += 1;
    }

    /// A signalled completion for the work request numbered `seq`: it and every one
    /// before it completed. Frees the retired buffers none of the rest can read.
    pub(crate) fn on_completed(&mut self, seq: u64) {
        self.completed = self.completed.max(seq + 1).min(self.posted);
        self.free_done();
    }

    fn free_done(&mut self) {
        let done = self.completed;
        self.retired.retain(|(_, posted_before)| *posted_before > done);
    }

    /// A keepalive tick: returns the ticks in a row (this one included) at which work
    /// requests were in flight and none had completed since the tick before. A live
    /// peer's NIC acknowledges the previous tick's signalled Keepalive well within a
    /// period, so this stays 0; it grows only while the peer answers nothing.
    pub(crate) fn tick(&mut self) -> u32 {
        let progressed = self.completed != self.completed_at_tick;
        self.progressed_at_last_tick = progressed;
        self.completed_at_tick = self.completed;
        self.stalled_ticks = if self.in_flight() == 0 || progressed { 0 } else { self.stalled_ticks + 1 };
        self.stalled_ticks
    }

    /// Whether the last [`tick`](Self::tick) saw a work request complete since the one
    /// before: the peer's NIC acknowledged something in that period.
    pub(crate) fn progressed_at_last_tick(&self) -> bool {
        self.progressed_at_last_tick
    }

    /// Makes `new` the current buffer. The old one is retired: work requests posted so
    /// far may read it. Refused, changing nothing, when that would hold more than
    /// [`MAX_RETIRED`] retired buffers: Err is how many are held.
    pub(crate) fn replace(&mut self, new: Option<B>) -> Result<(), usize> {
        self.free_done();
        if self.current.is_some() && self.retired.len() >= MAX_RETIRED {
            return Err(self.retired.len());
        }
        if let Some(old) = std::mem::replace(&mut self.current, new) {
            self.retired.push((old, self.posted));
        }
        self.free_done();
        Ok(())
    }

    /// Gives up the current buffer if no work request is in flight, so none can read
    /// it (an idle connection's): the caller frees it, where that costs the event loop
    /// nothing.
    pub(crate) fn release_if_quiet(&mut self) -> Option<B> {
        if self.in_flight() > 0 {
            return None;
        }
        self.current.take()
    }

    /// The current buffer and the retired ones still held.
    pub(crate) fn held(&self) -> impl Iterator<Item = &B> {
        self.current.iter().chain(self.retired.iter().map(|(b, _)| b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A buffer that records when it is freed.
    struct Buf(&'static str, Rc<RefCell<Vec<&'static str>>>);
    impl Drop for Buf {
        fn drop(&mut self) {
            self.1.borrow_mut().push(self.0);
        }
    }

    fn setup() -> (TxBuffers<Buf>, Rc<RefCell<Vec<&'static str>>>) {
        (TxBuffers::new(), Rc::new(RefCell::new(Vec::new())))
    }

    #[test]
    fn a_buffer_replaced_while_a_write_from_it_is_in_flight_lives_until_that_write_completes() {
        let (mut tx, freed) = setup();
        tx.replace(Some(Buf("old", freed.clone()))).unwrap();
        let write = tx.next_seq();
        tx.on_posted(); // a write from "old", not completed yet
        tx.replace(Some(Buf("new", freed.clone()))).unwrap(); // RegisterXferMemory arrives now
        assert!(freed.borrow().is_empty(), "the NIC may still read the old buffer");
        assert_eq!(tx.held().count(), 2);
        let later = tx.next_seq();
        tx.on_posted(); // a write from "new"
        tx.on_completed(write);
        assert_eq!(*freed.borrow(), ["old"]);
        tx.on_completed(later);
        assert_eq!(*freed.borrow(), ["old"], "the current buffer stays");
        assert_eq!(tx.current().map(|b| b.0), Some("new"));
    }

    #[test]
    fn a_buffer_replaced_with_nothing_in_flight_is_freed_at_once() {
        let (mut tx, freed) = setup();
        tx.replace(Some(Buf("a", freed.clone()))).unwrap();
        let s = tx.next_seq();
        tx.on_posted();
        tx.on_completed(s);
        tx.replace(Some(Buf("b", freed.clone()))).unwrap();
        assert_eq!(*freed.borrow(), ["a"]);
    }

    #[test]
    fn a_completion_frees_every_retired_buffer_posted_before_it_and_no_later_one() {
        let (mut tx, freed) = setup();
        let mut seqs = vec![];
        for name in ["a", "b", "c"] {
            tx.replace(Some(Buf(name, freed.clone()))).unwrap();
            seqs.push(tx.next_seq());
            tx.on_posted();
        }
        tx.replace(None).unwrap(); // "c" retired too
        tx.on_completed(seqs[1]); // in order: a's and b's writes completed
        assert_eq!(*freed.borrow(), ["a", "b"]);
        tx.on_completed(seqs[0]); // an older completion changes nothing
        assert_eq!(*freed.borrow(), ["a", "b"]);
        tx.on_completed(seqs[2]);
        assert_eq!(*freed.borrow(), ["a", "b", "c"]);
        assert_eq!(tx.in_flight(), 0);
    }

    #[test]
    fn an_idle_buffer_is_released_only_when_nothing_is_in_flight() {
        let (mut tx, freed) = setup();
        tx.replace(Some(Buf("a", freed.clone()))).unwrap();
        let s = tx.next_seq();
        tx.on_posted();
        assert!(tx.release_if_quiet().is_none());
        assert!(freed.borrow().is_empty());
        tx.on_completed(s);
        let released = tx.release_if_quiet().expect("idle: released");
        assert!(tx.current().is_none());
        assert!(freed.borrow().is_empty(), "freed by whoever holds it, not here");
        drop(released);
        assert_eq!(*freed.borrow(), ["a"]);
        assert!(tx.release_if_quiet().is_none(), "nothing left to release");
    }

    #[test]
    fn ticks_count_only_periods_with_work_in_flight_and_no_completion() {
        let mut tx: TxBuffers<()> = TxBuffers::new();
        assert_eq!(tx.tick(), 0, "idle: nothing in flight");
        let k1 = tx.next_seq();
        tx.on_posted(); // the Keepalive of this tick
        assert_eq!(tx.tick(), 1, "in flight since the last tick, unanswered");
        tx.on_completed(k1);
        assert_eq!(tx.tick(), 0, "answered: the count starts over");
        assert!(tx.progressed_at_last_tick());
        tx.on_posted();
        assert_eq!(tx.tick(), 1);
        tx.on_posted();
        assert_eq!(tx.tick(), 2, "still nothing completed");
        assert!(!tx.progressed_at_last_tick());
        assert_eq!(tx.tick(), 3);
    }

    #[test]
    fn dropping_frees_current_and_retired() {
        // (the endpoint drops its TX buffers after its QP: nothing can read them then)
        let (mut tx, freed) = setup();
        tx.replace(Some(Buf("a", freed.clone()))).unwrap();
        tx.on_posted();
        tx.replace(Some(Buf("b", freed.clone()))).unwrap();
        assert_eq!(tx.held().count(), 2);
        drop(tx);
        assert_eq!(freed.borrow().len(), 2);
    }

    #[test]
    fn at_most_max_retired_buffers_wait_for_their_writes() {
        let (mut tx, freed) = setup();
        let first = tx.next_seq();
        for name in ["a", "b", "c", "d", "e"] {
            tx.replace(Some(Buf(name, freed.clone()))).unwrap();
            tx.on_posted(); // a write from it that does not complete (the peer keeps it so)
        }
        assert_eq!(tx.held().count(), 1 + MAX_RETIRED);
        assert_eq!(tx.replace(Some(Buf("f", freed.clone()))), Err(MAX_RETIRED), "a fifth is refused");
        assert_eq!(tx.current().map(|b| b.0), Some("e"), "nothing changed");
        assert_eq!(*freed.borrow(), ["f"], "the refused buffer is dropped by the caller's side");
        tx.on_completed(first); // "a"'s write completed: one retired buffer freed
        tx.replace(Some(Buf("g", freed.clone()))).unwrap();
        assert_eq!(tx.current().map(|b| b.0), Some("g"));
    }
}
