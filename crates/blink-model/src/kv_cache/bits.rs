//! A fixed-size set of block ids: a bit per block, its size counted, the lowest member
//! found from a hint. Never allocates after construction.

pub(crate) struct Bits {
    words: Vec<u64>,
    count: usize,
    /// No word below this one has a bit set.
    low: usize,
}

impl Bits {
    /// An empty set of ids below `n`.
    pub(crate) fn new(n: usize) -> Bits {
        Bits { words: vec![0; n.div_ceil(64)], count: 0, low: 0 }
    }

    /// The set of every id below `n`.
    pub(crate) fn full(n: usize) -> Bits {
        let mut b = Bits::new(n);
        for (i, w) in b.words.iter_mut().enumerate() {
            let bits = (n - i * 64).min(64);
            *w = if bits == 64 { u64::MAX } else { (1 << bits) - 1 };
        }
        b.count = n;
        b
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    #[inline]
    pub(crate) fn contains(&self, i: u32) -> bool {
        self.words[i as usize / 64] >> (i % 64) & 1 != 0
    }

    /// Add `i`; whether it was absent.
    pub(crate) fn insert(&mut self, i: u32) -> bool {
        let (w, bit) = (i as usize / 64, 1u64 << (i % 64));
        let absent = self.words[w] & bit == 0;
        if absent {
            self.words[w] |= bit;
            self.count += 1;
            self.low = self.low.min(w);
        }
        absent
    }

    /// Take `i` out; whether it was present.
    pub(crate) fn remove(&mut self, i: u32) -> bool {
        let (w, bit) = (i as usize / 64, 1u64 << (i % 64));
        let present = self.words[w] & bit != 0;
        if present {
            self.words[w] &= !bit;
            self.count -= 1;
        }
        present
    }

    /// The lowest member at or above `from`.
    pub(crate) fn next(&self, from: u32) -> Option<u32> {
        let mut w = (from as usize / 64).max(self.low);
        if w >= self.words.len() {
            return None;
        }
        let mut word = if w == from as usize / 64 { self.words[w] & (u64::MAX << (from % 64)) } else { self.words[w] };
        loop {
            if word != 0 {
                return Some((w * 64) as u32 + word.trailing_zeros());
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }

    /// Take out the lowest member.
    pub(crate) fn pop_lowest(&mut self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        while self.words[self.low] == 0 {
            self.low += 1;
        }
        let i = (self.low * 64) as u32 + self.words[self.low].trailing_zeros();
        self.remove(i);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_found_lowest_first() {
        let mut b = Bits::new(200);
        assert_eq!((b.len(), b.next(0), b.pop_lowest()), (0, None, None));
        for i in [130, 3, 64, 199] {
            assert!(b.insert(i));
        }
        assert!(!b.insert(64));
        assert_eq!(b.len(), 4);
        assert_eq!((b.next(0), b.next(4), b.next(65), b.next(131), b.next(199)), (Some(3), Some(64), Some(130), Some(199), Some(199)));
        assert_eq!(b.pop_lowest(), Some(3));
        assert!(b.remove(130) && !b.remove(130));
        assert_eq!((b.pop_lowest(), b.pop_lowest(), b.pop_lowest()), (Some(64), Some(199), None));
        b.insert(5);
        assert_eq!(b.pop_lowest(), Some(5));
        let f = Bits::full(130);
        assert_eq!((f.len(), f.contains(129), f.next(129), f.next(130)), (130, true, Some(129), None));
    }
}
