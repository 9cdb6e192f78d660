//! QP number → value, for a shared CQ's owner table (docs/protocol.md §4.6): the poll
//! looks a QP up once per run of its completions, so the look-up is the hot part.
//!
//! Open addressing with linear probing, at most half full, over a power-of-two array;
//! the home slot is the QP number's Fibonacci hash (one multiply and a shift). A hit on
//! its home slot is a multiply, a shift, a load and a compare. Removal shifts the
//! entries after it back (no tombstones), so a table that has seen any number of
//! connections come and go probes as one that was filled once.
//!
//! QP numbers are the local device's choice, never the peer's: no peer can aim
//! entries at one slot.

/// The multiplier of Fibonacci hashing: 2^32 / φ, odd.
const FIBONACCI: u32 = 0x9E37_79B9;
/// Slots of a table's first array.
const FIRST_SLOTS: usize = 8;

pub(crate) struct QpTable<T> {
    /// `None`: empty. The length is 0 or a power of two at least twice `len`.
    slots: Vec<Option<(u32, T)>>,
    /// 32 − log2(slots): the shift that takes a hash to its slot.
    shift: u32,
    len: usize,
}

impl<T> Default for QpTable<T> {
    fn default() -> Self {
        QpTable { slots: Vec::new(), shift: 32, len: 0 }
    }
}

impl<T> QpTable<T> {
    #[inline(always)]
    fn home(&self, qp: u32) -> usize {
        (qp.wrapping_mul(FIBONACCI) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot that holds `qp`.
    #[inline(always)]
    fn find(&self, qp: u32) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut i = self.home(qp);
        // Ends: the table is at most half full, so an empty slot comes.
        loop {
            match &self.slots[i] {
                Some((k, _)) if *k == qp => return Some(i),
                Some(_) => i = (i + 1) & self.mask(),
                None => return None,
            }
        }
    }

    #[inline(always)]
    pub(crate) fn get_mut(&mut self, qp: u32) -> Option<&mut T> {
        let i = self.find(qp)?;
        self.slots[i].as_mut().map(|(_, v)| v)
    }

    #[cfg(test)]
    pub(crate) fn get(&self, qp: u32) -> Option<&T> {
        self.slots[self.find(qp)?].as_ref().map(|(_, v)| v)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Sets `qp`'s value; returns the one it replaces.
    pub(crate) fn insert(&mut self, qp: u32, value: T) -> Option<T> {
        if let Some(i) = self.find(qp) {
            return self.slots[i].replace((qp, value)).map(|(_, v)| v);
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(qp);
        while self.slots[i].is_some() {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = Some((qp, value));
        self.len += 1;
        None
    }

    /// Takes `qp` out; the entries probed past its slot move back, so that each stays
    /// reachable from its home slot without a gap.
    pub(crate) fn remove(&mut self, qp: u32) -> Option<T> {
        let mut hole = self.find(qp)?;
        let (_, taken) = self.slots[hole].take()?;
        self.len -= 1;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some((k, _)) = &self.slots[j] else { break };
            // The entry at j may fill the hole when the hole lies on its probe path:
            // nearer its home than j is.
            let home = self.home(*k);
            if hole.wrapping_sub(home) & mask < j.wrapping_sub(home) & mask {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
        }
        Some(taken)
    }

    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.len = 0;
    }

    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(FIRST_SLOTS);
        let old = std::mem::replace(&mut self.slots, std::iter::repeat_with(|| None).take(n).collect());
        self.shift = 32 - n.trailing_zeros();
        self.len = 0;
        for (qp, v) in old.into_iter().flatten() {
            self.insert(qp, v);
        }
    }
}

impl<T> FromIterator<(u32, T)> for QpTable<T> {
    fn from_iter<I: IntoIterator<Item = (u32, T)>>(iter: I) -> Self {
        let mut t = QpTable::default();
        for (qp, v) in iter {
            t.insert(qp, v);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// xorshift64: a replayable sequence from a seed (made odd: never the stuck zero).
    struct Rng(u64);
    impl Rng {
        fn seeded(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Every key of the model is found with its value, no other key of `keys` is, and
    /// the table's invariants hold: at most half full, each entry reachable from its
    /// home slot without crossing an empty one.
    fn agrees(t: &QpTable<u64>, model: &HashMap<u32, u64>, keys: &[u32], seed: u64) {
        assert_eq!(t.len(), model.len(), "seed {seed}");
        assert!(t.slots.is_empty() || t.len * 2 <= t.slots.len(), "seed {seed}: more than half full");
        assert_eq!(t.slots.iter().flatten().count(), t.len, "seed {seed}");
        for &k in keys {
            assert_eq!(t.get(k), model.get(&k), "seed {seed}: key {k}");
        }
        for (i, (k, _)) in t.slots.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|e| (i, e))) {
            let mut p = t.home(*k);
            while p != i {
                assert!(t.slots[p].is_some(), "seed {seed}: QP {k} at {i} behind an empty slot {p}");
                p = (p + 1) & t.mask();
            }
        }
    }

    #[test]
    fn random_inserts_and_removes_agree_with_a_map() {
        for seed in 0..300u64 {
            let mut rng = Rng::seeded(seed);
            // Few distinct keys, so that inserts replace and removes hit; some seeds
            // draw them from a narrow range (rxe's sequential numbers), some from the
            // whole 24-bit space (a NIC's).
            let keys: Vec<u32> = (0..1 + rng.next() % 80)
                .map(|i| if seed % 2 == 0 { 17 + i as u32 } else { (rng.next() & 0xFF_FFFF) as u32 })
                .collect();
            let (mut t, mut model) = (QpTable::default(), HashMap::new());
            for step in 0..400 {
                let k = keys[(rng.next() % keys.len() as u64) as usize];
                match rng.next() % 5 {
                    0..=2 => assert_eq!(t.insert(k, step), model.insert(k, step), "seed {seed}"),
                    3 => assert_eq!(t.remove(k), model.remove(&k), "seed {seed}"),
                    _ => {
                        if let Some(v) = t.get_mut(k) {
                            *v += 1_000;
                        }
                        if let Some(v) = model.get_mut(&k) {
                            *v += 1_000;
                        }
                    }
                }
                agrees(&t, &model, &keys, seed);
            }
            t.clear();
            model.clear();
            agrees(&t, &model, &keys, seed);
        }
    }

    /// Every order of removing the entries of a run of QPs that share one home slot and
    /// wrap around the end of the array leaves the others reachable.
    #[test]
    fn removal_from_a_wrapped_cluster_in_every_order() {
        let probe: QpTable<u64> = (0..1).map(|qp| (qp, 0)).collect();
        let last = probe.slots.len() - 1;
        let colliding: Vec<u32> = (0..u32::MAX).filter(|&qp| probe.home(qp) == last).take(4).collect();
        // The 24 orders, each from its number in the factorial number system.
        let orders = (0..24).map(|mut n| {
            let mut left: Vec<usize> = (0..colliding.len()).collect();
            let mut order = Vec::new();
            while !left.is_empty() {
                order.push(left.remove(n % left.len()));
                n /= left.len() + 1;
            }
            order
        });
        let orders: Vec<Vec<usize>> = orders.collect();
        assert_eq!(orders.iter().collect::<std::collections::HashSet<_>>().len(), 24, "every order once");
        for order in orders {
            let mut t: QpTable<u64> = colliding.iter().map(|&qp| (qp, u64::from(qp))).collect();
            assert_eq!(t.slots.len(), probe.slots.len(), "the cluster wraps the array it was found in");
            let mut model: HashMap<u32, u64> = colliding.iter().map(|&qp| (qp, u64::from(qp))).collect();
            for &i in &order {
                assert_eq!(t.remove(colliding[i]), model.remove(&colliding[i]));
                agrees(&t, &model, &colliding, i as u64);
            }
        }
    }
}
