//! A least-recently-used cache of key ids, by entry count: one worker's local thumbnail cache in
//! the fleet model. Keys are dense ids (`0..keys`), so the recency list is intrusive arrays indexed
//! by key, with no hashing: `O(1)` touch, insert and evict.

const NIL: u32 = u32::MAX;

/// An LRU set of key ids with a fixed capacity.
#[derive(Clone, Debug)]
pub struct Lru {
    capacity: usize,
    len: usize,
    prev: Vec<u32>,
    next: Vec<u32>,
    present: Vec<bool>,
    head: u32, // most recent
    tail: u32, // least recent
}

impl Lru {
    /// An empty cache for key ids in `0..keys`, holding at most `capacity` of them.
    pub fn new(keys: usize, capacity: usize) -> Self {
        Lru {
            capacity,
            len: 0,
            prev: vec![NIL; keys],
            next: vec![NIL; keys],
            present: vec![false; keys],
            head: NIL,
            tail: NIL,
        }
    }

    /// The number of cached keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `key` is cached; marks it most recently used if so.
    pub fn touch(&mut self, key: u32) -> bool {
        if !self.present.get(key as usize).copied().unwrap_or(false) {
            return false;
        }
        self.unlink(key);
        self.push_front(key);
        true
    }

    /// Caches `key` (most recently used), evicting the least recently used key if full.
    pub fn insert(&mut self, key: u32) {
        if self.capacity == 0 || key as usize >= self.present.len() {
            return;
        }
        if self.present[key as usize] {
            self.unlink(key);
            self.push_front(key);
            return;
        }
        if self.len == self.capacity {
            let victim = self.tail;
            self.unlink(victim);
            self.present[victim as usize] = false;
            self.len -= 1;
        }
        self.present[key as usize] = true;
        self.len += 1;
        self.push_front(key);
    }

    /// Empties the cache (a restarted worker).
    pub fn clear(&mut self) {
        while self.tail != NIL {
            let k = self.tail;
            self.unlink(k);
            self.present[k as usize] = false;
        }
        self.len = 0;
    }

    fn unlink(&mut self, k: u32) {
        let (p, n) = (self.prev[k as usize], self.next[k as usize]);
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
        self.prev[k as usize] = NIL;
        self.next[k as usize] = NIL;
    }

    fn push_front(&mut self, k: u32) {
        self.next[k as usize] = self.head;
        self.prev[k as usize] = NIL;
        if self.head != NIL {
            self.prev[self.head as usize] = k;
        }
        self.head = k;
        if self.tail == NIL {
            self.tail = k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(10, 3);
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
        let mut z = Lru::new(10, 0);
        z.insert(1);
        assert!(!z.touch(1));
    }
}
