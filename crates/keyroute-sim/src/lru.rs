//! A least-recently-used cache of key ids, by entry count: one worker's local thumbnail cache in
//! the fleet model.
//!
//! Its memory is proportional to what it holds, not to the key space: a slab of at most
//! `capacity` entries (the key and its two recency links, 12 bytes) and an open-addressing index
//! of slab slots (linear probing, at most half full, deletion by backward shift, 4 bytes a slot),
//! grown as the cache fills. So 10,000 workers caching 1,000 thumbnails each take about 200 MB
//! whatever the number of distinct keys. Touch, insert and evict are `O(1)` expected, with no
//! allocation once full, and no randomness: the same sequence gives the same cache.

const NIL: u32 = u32::MAX;

/// An LRU set of key ids with a fixed capacity.
#[derive(Clone, Debug)]
pub struct Lru {
    capacity: usize,
    /// Slab: the key in each slot, and the slots before and after it in recency order.
    keys: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Open-addressing index: `slot + 1`, or 0 for an empty cell; its length is a power of two.
    index: Vec<u32>,
    head: u32, // most recent slot
    tail: u32, // least recent slot
}

#[inline]
fn home(key: u32, mask: usize) -> usize {
    // Fibonacci hashing: the top bits of a multiplication, well spread for dense ids.
    ((u64::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize) & mask
}

impl Lru {
    /// An empty cache holding at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Lru { capacity, keys: Vec::new(), prev: Vec::new(), next: Vec::new(), index: Vec::new(), head: NIL, tail: NIL }
    }

    /// The number of cached keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Bytes held (slab and index): what the simulator's memory bound counts.
    pub fn heap_bytes(&self) -> usize {
        (self.keys.capacity() + self.prev.capacity() + self.next.capacity() + self.index.capacity()) * 4
    }

    /// The index cell holding `key`, or the empty cell where it would go.
    fn probe(&self, key: u32) -> (usize, Option<u32>) {
        let mask = self.index.len() - 1;
        let mut i = home(key, mask);
        loop {
            match self.index[i] {
                0 => return (i, None),
                s if self.keys[(s - 1) as usize] == key => return (i, Some(s - 1)),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Whether `key` is cached; marks it most recently used if so.
    pub fn touch(&mut self, key: u32) -> bool {
        if self.index.is_empty() {
            return false;
        }
        match self.probe(key).1 {
            Some(slot) => {
                self.unlink(slot);
                self.push_front(slot);
                true
            }
            None => false,
        }
    }

    /// Caches `key` (most recently used), evicting the least recently used key if full.
    pub fn insert(&mut self, key: u32) {
        if self.capacity == 0 {
            return;
        }
        if self.touch(key) {
            return;
        }
        let slot = if self.keys.len() == self.capacity {
            // Evict the least recent and reuse its slot.
            let victim = self.tail;
            self.unlink(victim);
            let (cell, _) = self.probe_slot(victim);
            self.remove_cell(cell);
            self.keys[victim as usize] = key;
            victim
        } else {
            if (self.keys.len() + 1) * 2 > self.index.len() {
                self.grow();
            }
            self.keys.push(key);
            self.prev.push(NIL);
            self.next.push(NIL);
            (self.keys.len() - 1) as u32
        };
        let (cell, _) = self.probe(key);
        self.index[cell] = slot + 1;
        self.push_front(slot);
    }

    /// Empties the cache (a restarted worker), keeping its memory.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.prev.clear();
        self.next.clear();
        self.index.iter_mut().for_each(|c| *c = 0);
        self.head = NIL;
        self.tail = NIL;
    }

    /// The index cell of a slab slot.
    fn probe_slot(&self, slot: u32) -> (usize, u32) {
        let mask = self.index.len() - 1;
        let mut i = home(self.keys[slot as usize], mask);
        while self.index[i] != slot + 1 {
            i = (i + 1) & mask;
        }
        (i, slot)
    }

    /// Empties cell `i`, shifting later cells of its probe run back (linear probing's deletion).
    fn remove_cell(&mut self, mut i: usize) {
        let mask = self.index.len() - 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.index[j];
            if s == 0 {
                self.index[i] = 0;
                return;
            }
            let h = home(self.keys[(s - 1) as usize], mask);
            // The entry at j may move to i unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < h && h <= j } else { i < h || h <= j };
            if !stays {
                self.index[i] = s;
                i = j;
            }
        }
    }

    fn grow(&mut self) {
        let want = ((self.keys.len() + 1) * 2).next_power_of_two().max(16).min((self.capacity * 2).next_power_of_two());
        let len = want.max(self.index.len() * 2);
        self.index = vec![0; len];
        // The slab grows with the index, exactly: never past the capacity.
        let room = (len / 2).min(self.capacity).max(self.keys.len());
        for v in [&mut self.keys, &mut self.prev, &mut self.next] {
            v.reserve_exact(room - v.len());
        }
        let mask = len - 1;
        for (slot, &key) in self.keys.iter().enumerate() {
            let mut i = home(key, mask);
            while self.index[i] != 0 {
                i = (i + 1) & mask;
            }
            self.index[i] = slot as u32 + 1;
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[s as usize] = NIL;
        self.next[s as usize] = NIL;
    }

    fn push_front(&mut self, s: u32) {
        self.next[s as usize] = self.head;
        self.prev[s as usize] = NIL;
        if self.head != NIL {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NIL {
            self.tail = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyroute::hash::{RandomSource, SplitMix64};

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(3);
        for k in [1, 2, 3] {
            c.insert(k);
        }
        assert!(c.touch(1)); // order now 1, 3, 2
        c.insert(4); // evicts 2
        assert!(!c.touch(2));
        assert!(c.touch(3) && c.touch(1) && c.touch(4));
        assert_eq!(c.len(), 3);
        c.clear();
        assert!(c.is_empty() && !c.touch(1));
        let mut z = Lru::new(0);
        z.insert(1);
        assert!(!z.touch(1));
    }

    /// Against a plain model (a list in recency order), over a random workload with many
    /// evictions and index collisions.
    #[test]
    fn equals_a_model_lru() {
        let mut rng = SplitMix64::new(5);
        for capacity in [1usize, 2, 7, 64, 300] {
            let mut lru = Lru::new(capacity);
            let mut model: Vec<u32> = Vec::new(); // most recent first
            for _ in 0..20_000 {
                let key = rng.below(3 * capacity as u64 + 5) as u32 * 7919;
                let hit = lru.touch(key);
                let pos = model.iter().position(|&k| k == key);
                assert_eq!(hit, pos.is_some());
                if let Some(p) = pos {
                    model.remove(p);
                } else {
                    lru.insert(key);
                    if model.len() == capacity {
                        model.pop();
                    }
                }
                model.insert(0, key);
                assert_eq!(lru.len(), model.len());
            }
            for &k in &model {
                assert!(lru.touch(k), "{k} of {capacity}");
            }
            assert!(lru.heap_bytes() <= capacity * 12 + capacity.next_power_of_two() * 8 + 256, "{capacity}");
        }
    }
}
