//! Page-aligned memory for memory regions, carved from a few large mappings.
//!
//! A process may hold only `vm.max_map_count` mappings (65530 by default), and a buffer
//! mapped on its own costs three (itself and a guard page on each side). So buffers of
//! up to [`CLASSES`] size classes (one page, two, four, … pages) are slots of shared
//! *chunks*: one mapping of many slots of one size, with a guard page at each end. A
//! connection's buffers then add no mapping unless a chunk is made; the slots of a chunk
//! are still registered one by one, each in its own connection's protection domain, so
//! a peer's key reaches its own slot and nothing else (docs/protocol.md §2). A buffer
//! too large for a class gets a mapping of its own. Which slots are free is
//! [`slots`](super::slots)' bookkeeping.
//!
//! A slot given back is emptied (`MADV_DONTNEED`): its pages leave the process's
//! resident memory as an unmapped buffer's would, and the next owner finds zeros, never
//! a former connection's bytes. Chunks are kept out of core dumps, off transparent huge
//! pages (a huge page would make one idle connection's first touch cost 2 MiB) and out
//! of fork children (`MADV_DONTFORK`: a BGSAVE child needs no connection's buffers, and
//! does not copy them). The last matters for the mapping count too: after
//! `ibv_fork_init`, rdma-core marks each registered range DONTFORK and clears the mark
//! when it is deregistered, and a range whose flags differ from its neighbours' is a
//! mapping of its own; with the whole chunk marked from the start (and a given-back
//! slot marked again), no registration changes a flag, and a chunk stays one mapping.

use std::ptr::NonNull;

use parking_lot::Mutex;

use super::slots::{ClassSlots, GivenBack, Slot};
use super::{Result, VerbsError, VerbsOp};

/// Slot sizes: `1 << class` pages for class 0..CLASSES (4 KiB to 8 MiB at 4 KiB pages).
const CLASSES: usize = 12;
/// What a chunk spans, about: as many slots as fit, but at least [`MIN_SLOTS`] and at
/// most [`MAX_SLOTS`].
const CHUNK_BYTES: usize = 32 << 20;
const MIN_SLOTS: usize = 4;
const MAX_SLOTS: usize = 1024;

/// Memory for a memory region: `len` bytes (a whole number of pages), page-aligned,
/// readable and writable by this process, never lent as a Rust reference (the NIC
/// writes it: [`copy_out`](Self::copy_out)).
pub struct PinnedBuffer {
    base: NonNull<u8>,
    len: usize,
    origin: Origin,
}

enum Origin {
    /// A slot of a chunk of class `class`.
    Slot { class: usize, slot: Slot },
    /// A mapping of its own with a guard page on each side.
    Own,
}

// SAFETY: plain memory; synchronisation of its contents is the user's business.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&self` hands out only its address and length, and copies out of it by raw
// pointer; writing the bytes is unsafe and the caller's contract.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    pub fn new(len: usize) -> Result<Self> {
        let page = page_size();
        let len = len.max(1).div_ceil(page) * page;
        let Some(class) = class_of(len / page) else {
            let base = map_guarded(len)?;
            return Ok(PinnedBuffer { base, len, origin: Origin::Own });
        };
        let (base, slot) = lock_arena().take(class, page)?;
        Ok(PinnedBuffer { base, len, origin: Origin::Slot { class, slot } })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
    /// Copies `out.len()` bytes from `offset` into `out`. Never a `&[u8]` over the
    /// buffer: the NIC, and a hostile peer by a plain RDMA WRITE, may write any byte of a
    /// registered buffer at any time, which no Rust reference may see happen; a copy by
    /// raw pointer takes whatever is there.
    ///
    /// Panics if the range is not inside the buffer.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|end| end <= self.len), "copy out of range");
        // SAFETY: the range is inside the `len` bytes at base (checked), alive while self
        // is; `out` is a distinct allocation (a reference the caller holds).
        unsafe { std::ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), out.as_mut_ptr(), out.len()) }
    }
    /// Copies `src` into the buffer at `offset`, by raw pointer (as [`copy_out`](Self::copy_out)).
    ///
    /// Panics if the range is not inside the buffer.
    ///
    /// # Safety
    /// No other thread reads or writes these bytes meanwhile (the NIC may: a work request
    /// that still reads them is the protocol's mistake, not a memory-safety one).
    pub unsafe fn copy_in(&self, offset: usize, src: &[u8]) {
        assert!(offset.checked_add(src.len()).is_some_and(|end| end <= self.len), "copy in out of range");
        // SAFETY: inside the buffer (checked); no other thread touches the range (the
        // caller's contract); `src` is a distinct allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        match self.origin {
            // SAFETY: exactly the mapping made in new().
            Origin::Own => unsafe { unmap_guarded(self.base, self.len) },
            Origin::Slot { class, slot } => {
                // SAFETY: the buffer's own pages, inside its slot; no region registers
                // them any longer (every owner drops its regions before its buffers).
                // Deregistering gave the pages back to fork children (rdma-core's
                // MADV_DOFORK after `ibv_fork_init`): they are taken out again, so that
                // the chunk stays one mapping (a flag that differs splits it).
                unsafe {
                    libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_DONTNEED);
                    libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_DONTFORK);
                }
                lock_arena().give_back(class, slot, page_size());
            }
        }
    }
}

/// The chunks of every class, by chunk number.
struct Arena {
    classes: Vec<Class>,
}

struct Class {
    slots: ClassSlots,
    /// Where chunk `n`'s slots begin (`None`: no chunk `n` now).
    bases: Vec<Option<NonNull<u8>>>,
}

// SAFETY: the arena holds addresses of mappings it owns; it is used under its mutex.
unsafe impl Send for Arena {}

static ARENA: Mutex<Arena> = Mutex::new(Arena { classes: Vec::new() });

fn lock_arena() -> parking_lot::MutexGuard<'static, Arena> {
    // (the arena's state is consistent between statements: a panic cannot leave it torn)
    ARENA.lock()
}

/// The class whose slots hold `pages` pages, if one does.
fn class_of(pages: usize) -> Option<usize> {
    let class = pages.max(1).next_power_of_two().trailing_zeros() as usize;
    (class < CLASSES).then_some(class)
}

fn slots_per_chunk(class: usize, page: usize) -> usize {
    (CHUNK_BYTES / (page << class)).clamp(MIN_SLOTS, MAX_SLOTS)
}

impl Arena {
    fn class(&mut self, class: usize, page: usize) -> &mut Class {
        while self.classes.len() <= class {
            let c = self.classes.len();
            self.classes.push(Class { slots: ClassSlots::new(slots_per_chunk(c, page) as u32), bases: Vec::new() });
        }
        &mut self.classes[class]
    }

    /// A free slot of `class`, mapping a chunk when every chunk is full.
    fn take(&mut self, class: usize, page: usize) -> Result<(NonNull<u8>, Slot)> {
        let slot_len = page << class;
        let c = self.class(class, page);
        let slot = match c.slots.take() {
            Some(s) => s,
            None => {
                let n = c.slots.next_chunk() as usize;
                let base = map_guarded(slot_len * slots_per_chunk(class, page))?;
                if c.bases.len() <= n {
                    c.bases.resize(n + 1, None);
                }
                c.bases[n] = Some(base);
                c.slots.add_chunk();
                c.slots.take().expect("a new chunk has free slots")
            }
        };
        let base = c.bases[slot.chunk as usize].expect("a slot's chunk is mapped");
        // SAFETY: slot.index < slots_per_chunk, so the slot lies inside its chunk.
        let at = unsafe { base.add(slot.index as usize * slot_len) };
        Ok((at, slot))
    }

    fn give_back(&mut self, class: usize, slot: Slot, page: usize) {
        let c = self.class(class, page);
        if let GivenBack::ReleaseChunk(n) = c.slots.give_back(slot) {
            let base = c.bases[n as usize].take().expect("a chunk in the book is mapped");
            // SAFETY: the chunk's mapping, made in take(); no slot of it is in use.
            unsafe { unmap_guarded(base, (page << class) * slots_per_chunk(class, page)) };
        }
    }
}

/// `len` bytes (whole pages) of fresh memory between two inaccessible guard pages (an
/// overrun faults instead of corrupting the heap), out of core dumps, huge pages and
/// fork children.
fn map_guarded(len: usize) -> Result<NonNull<u8>> {
    let page = page_size();
    let map_len = len + 2 * page;
    // SAFETY: an anonymous private mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(VerbsError::last(VerbsOp::Mmap));
    }
    // SAFETY: both guard pages lie inside the mapping just made; madvise on it is
    // advisory. A guard page that cannot be made is an error (ENOMEM when the process
    // hits vm.max_map_count): the mapping is undone and nothing is kept.
    unsafe {
        if libc::mprotect(p, page, libc::PROT_NONE) != 0
            || libc::mprotect(p.cast::<u8>().add(page + len).cast(), page, libc::PROT_NONE) != 0
        {
            let e = VerbsError::last(VerbsOp::Mprotect);
            libc::munmap(p, map_len);
            return Err(e);
        }
        libc::madvise(p.cast::<u8>().add(page).cast(), len, libc::MADV_DONTDUMP);
        libc::madvise(p.cast::<u8>().add(page).cast(), len, libc::MADV_NOHUGEPAGE);
        libc::madvise(p.cast::<u8>().add(page).cast(), len, libc::MADV_DONTFORK);
    }
    // SAFETY: p is non-null (not MAP_FAILED) and one page in is inside the mapping.
    Ok(unsafe { NonNull::new_unchecked(p.cast::<u8>().add(page)) })
}

/// Undoes [`map_guarded`].
///
/// # Safety
/// `body` and `len` are what `map_guarded` made and returned, and nothing uses it after.
unsafe fn unmap_guarded(body: NonNull<u8>, len: usize) {
    let page = page_size();
    // SAFETY: the whole mapping, from its lower guard page (the caller's contract).
    unsafe { libc::munmap(body.as_ptr().sub(page).cast(), len + 2 * page) };
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Chunks mapped now, over every class (each three mappings).
pub(crate) fn chunks() -> usize {
    lock_arena().classes.iter().map(|c| c.slots.chunks()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_one_page_to_the_largest_and_chunks_hold_several_slots() {
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(2), Some(1));
        assert_eq!(class_of(3), Some(2));
        assert_eq!(class_of(1 << (CLASSES - 1)), Some(CLASSES - 1));
        assert_eq!(class_of((1 << (CLASSES - 1)) + 1), None);
        for c in 0..CLASSES {
            let n = slots_per_chunk(c, 4096);
            assert!((MIN_SLOTS..=MAX_SLOTS).contains(&n), "class {c}: {n}");
        }
        // a default RX buffer (128 KiB) and an upstream client's (1 MiB): 256 and 32 per chunk
        assert_eq!(slots_per_chunk(class_of(32).unwrap(), 4096), 256);
        assert_eq!(slots_per_chunk(class_of(256).unwrap(), 4096), 32);
    }

    #[test]
    fn buffers_are_disjoint_zeroed_slots_and_a_given_back_slot_comes_back_empty() {
        // (other tests make buffers meanwhile: only this test's own buffers are looked at)
        let page = page_size();
        let bufs: Vec<PinnedBuffer> = (0..40).map(|i| PinnedBuffer::new(page * (1 + i % 3)).unwrap()).collect();
        let mut ranges: Vec<(usize, usize)> = bufs.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "buffers overlap: {w:?}");
        }
        for b in &bufs {
            assert_eq!(b.as_ptr() as usize % page, 0, "page-aligned");
            let mut out = vec![1u8; b.len()];
            b.copy_out(0, &mut out);
            assert!(out.iter().all(|&x| x == 0), "a fresh buffer reads zeros");
            // SAFETY: the test's own buffer; no NIC and no other thread.
            unsafe { b.copy_in(0, &vec![0xAB; b.len()]) };
        }
        let big = PinnedBuffer::new(page << CLASSES).unwrap();
        assert!(matches!(big.origin, Origin::Own), "larger than every class: a mapping of its own");
        drop(bufs);
        // slots written and given back come back zeroed
        for _ in 0..40 {
            let b = PinnedBuffer::new(page).unwrap();
            let mut out = vec![1u8; page];
            b.copy_out(0, &mut out);
            assert!(out.iter().all(|&x| x == 0), "a reused slot reads zeros");
        }
    }
}
