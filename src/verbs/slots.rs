//! Which slots of the buffer arena's chunks are in use (the bookkeeping of
//! [`buffer`](super::buffer), apart from the mappings; pure and tested exhaustively below).
//!
//! A chunk is one mapping cut into equal slots; a size class is every chunk of one slot
//! size. A slot is taken from the lowest chunk that has one free (the classes stay
//! packed, so chunks empty out and can be given back), and a chunk that empties is
//! released unless it is the class's only empty one: a connection that comes and goes
//! at the edge of a chunk does not map and unmap it each time.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

/// One slot of a class: its chunk and its place in the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Slot {
    pub(crate) chunk: u32,
    pub(crate) index: u32,
}

/// What giving a slot back leaves the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GivenBack {
    /// Nothing: the chunk stays.
    Kept,
    /// The chunk is empty and no longer in the book: unmap it.
    ReleaseChunk(u32),
}

#[derive(Debug)]
struct Chunk {
    /// Free slots, the lowest on top.
    free: Vec<u32>,
    in_use: Vec<bool>,
}

impl Chunk {
    fn new(slots: u32) -> Chunk {
        Chunk { free: (0..slots).rev().collect(), in_use: vec![false; slots as usize] }
    }
    fn is_empty(&self) -> bool {
        self.free.len() == self.in_use.len()
    }
}

/// The slots of one size class.
#[derive(Debug)]
pub(crate) struct ClassSlots {
    slots_per_chunk: u32,
    /// By chunk number; `None`: released, the number free for the next chunk.
    chunks: Vec<Option<Chunk>>,
    /// Chunks with a free slot.
    with_room: BTreeSet<u32>,
    /// Chunks with no slot in use.
    empty: u32,
}

impl ClassSlots {
    pub(crate) fn new(slots_per_chunk: u32) -> ClassSlots {
        assert!(slots_per_chunk > 0, "a chunk has a slot");
        ClassSlots { slots_per_chunk, chunks: Vec::new(), with_room: BTreeSet::new(), empty: 0 }
    }

    /// A free slot of the lowest chunk that has one; `None` when every chunk is full
    /// (the caller maps a chunk, [`add_chunk`](Self::add_chunk), and takes again).
    pub(crate) fn take(&mut self) -> Option<Slot> {
        let chunk = *self.with_room.first()?;
        let c = self.chunks[chunk as usize].as_mut().expect("a chunk with room is in the book");
        if c.is_empty() {
            self.empty -= 1;
        }
        let index = c.free.pop().expect("a chunk with room has a free slot");
        c.in_use[index as usize] = true;
        if c.free.is_empty() {
            self.with_room.remove(&chunk);
        }
        Some(Slot { chunk, index })
    }

    /// The number the next chunk gets (the caller maps it under this number first).
    pub(crate) fn next_chunk(&self) -> u32 {
        self.chunks.iter().position(Option::is_none).unwrap_or(self.chunks.len()) as u32
    }

    /// A chunk was mapped under [`next_chunk`](Self::next_chunk): its slots are free.
    pub(crate) fn add_chunk(&mut self) -> u32 {
        let n = self.next_chunk();
        let chunk = Some(Chunk::new(self.slots_per_chunk));
        match self.chunks.get_mut(n as usize) {
            Some(place) => *place = chunk,
            None => self.chunks.push(chunk),
        }
        self.with_room.insert(n);
        self.empty += 1;
        n
    }

    /// Slot `s` is free again.
    ///
    /// Panics if it is not in use (a slot is owned by one buffer: a second give-back is
    /// a bug in the arena, and handing the slot out twice would be worse).
    pub(crate) fn give_back(&mut self, s: Slot) -> GivenBack {
        let c = self.chunks.get_mut(s.chunk as usize).and_then(Option::as_mut).expect("a slot of a chunk in the book");
        assert!(std::mem::replace(&mut c.in_use[s.index as usize], false), "slot given back twice");
        // (descending: the lowest on top, so that a chunk's low slots are used first)
        let at = c.free.partition_point(|&f| f > s.index);
        c.free.insert(at, s.index);
        self.with_room.insert(s.chunk);
        if !c.is_empty() {
            return GivenBack::Kept;
        }
        if self.empty == 0 {
            self.empty = 1;
            return GivenBack::Kept;
        }
        self.chunks[s.chunk as usize] = None;
        self.with_room.remove(&s.chunk);
        while matches!(self.chunks.last(), Some(None)) {
            self.chunks.pop();
        }
        GivenBack::ReleaseChunk(s.chunk)
    }

    /// Chunks in the book (each a mapping).
    pub(crate) fn chunks(&self) -> usize {
        self.chunks.iter().flatten().count()
    }

    /// Slots in use.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.chunks.iter().flatten().map(|c| c.in_use.len() - c.free.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Takes a slot, adding a chunk when the class is full, as the arena does.
    fn take(c: &mut ClassSlots) -> Slot {
        c.take().unwrap_or_else(|| {
            c.add_chunk();
            c.take().expect("a new chunk has room")
        })
    }

    /// The book against a plain model: no slot handed out twice, chunks added only when
    /// every chunk is full, at most one empty chunk kept, the lowest free slot first.
    fn check(c: &ClassSlots, held: &HashSet<Slot>) {
        assert_eq!(c.in_use(), held.len());
        let empty = c.chunks.iter().flatten().filter(|ch| ch.is_empty()).count();
        assert!(empty <= 1, "{empty} empty chunks kept");
        assert_eq!(empty as u32, c.empty);
        for (n, ch) in c.chunks.iter().enumerate() {
            let Some(ch) = ch else { continue };
            for (i, &used) in ch.in_use.iter().enumerate() {
                assert_eq!(used, held.contains(&Slot { chunk: n as u32, index: i as u32 }));
            }
            assert_eq!(c.with_room.contains(&(n as u32)), !ch.free.is_empty());
        }
    }

    #[test]
    fn every_sequence_of_takes_and_give_backs_up_to_depth_8_keeps_the_book_right() {
        // Every sequence of 8 steps over 2-slot chunks: take, or give back the i-th held
        // slot (in taking order); 3^8 paths with up to 8 slots in 4 chunks.
        fn walk(c: &ClassSlots, held: &[Slot], depth: u32, paths: &mut u32) {
            check(c, &held.iter().copied().collect());
            if depth == 0 {
                *paths += 1;
                return;
            }
            for step in 0..3 {
                let (mut c2, mut h2) = (clone(c), held.to_vec());
                if step == 0 {
                    let s = take(&mut c2);
                    assert!(!h2.contains(&s), "{s:?} handed out twice");
                    // the lowest free slot of the lowest chunk with room
                    let lowest = (0..c2.chunks.len() as u32 * 2)
                        .map(|k| Slot { chunk: k / 2, index: k % 2 })
                        .find(|s| !h2.contains(s) && c.chunks.get(s.chunk as usize).is_some_and(Option::is_some));
                    if let Some(l) = lowest {
                        assert_eq!(s, l, "not the lowest free slot");
                    }
                    h2.push(s);
                } else if !h2.is_empty() {
                    // the oldest or the second-oldest held slot
                    let s = h2.remove((step as usize - 1) % h2.len());
                    if let GivenBack::ReleaseChunk(n) = c2.give_back(s) {
                        assert_eq!(n, s.chunk);
                        assert!(h2.iter().all(|h| h.chunk != n), "a chunk released with a slot in use");
                    }
                }
                walk(&c2, &h2, depth - 1, paths);
            }
        }
        fn clone(c: &ClassSlots) -> ClassSlots {
            ClassSlots {
                slots_per_chunk: c.slots_per_chunk,
                chunks: c
                    .chunks
                    .iter()
                    .map(|ch| ch.as_ref().map(|ch| Chunk { free: ch.free.clone(), in_use: ch.in_use.clone() }))
                    .collect(),
                with_room: c.with_room.clone(),
                empty: c.empty,
            }
        }
        let mut paths = 0;
        walk(&ClassSlots::new(2), &[], 8, &mut paths);
        assert_eq!(paths, 3u32.pow(8));
    }

    #[test]
    fn a_full_class_grows_by_one_chunk_and_an_emptied_one_is_kept_once() {
        let mut c = ClassSlots::new(4);
        assert_eq!(c.take(), None, "no chunk yet");
        let slots: Vec<Slot> = (0..9).map(|_| take(&mut c)).collect();
        assert_eq!(c.chunks(), 3, "9 slots of 4 per chunk");
        assert_eq!(slots[4], Slot { chunk: 1, index: 0 });
        // chunk 2 (one slot) empties: the only empty chunk, kept
        assert_eq!(c.give_back(slots[8]), GivenBack::Kept);
        // chunk 1 empties too: released, chunk 2 stays as the spare
        for s in &slots[4..7] {
            assert_eq!(c.give_back(*s), GivenBack::Kept);
        }
        assert_eq!(c.give_back(slots[7]), GivenBack::ReleaseChunk(1));
        assert_eq!(c.chunks(), 2);
        // the next chunk mapped takes the released number
        assert_eq!(c.next_chunk(), 1);
        // takes go to chunk 0's free slot first, then the spare (chunk 2)
        assert_eq!(c.give_back(slots[1]), GivenBack::Kept);
        assert_eq!(take(&mut c), Slot { chunk: 0, index: 1 });
        assert_eq!(take(&mut c), Slot { chunk: 2, index: 0 });
    }

    #[test]
    #[should_panic(expected = "given back twice")]
    fn a_slot_given_back_twice_is_refused() {
        let mut c = ClassSlots::new(2);
        let a = take(&mut c);
        let _b = take(&mut c);
        c.give_back(a);
        c.give_back(a);
    }
}
