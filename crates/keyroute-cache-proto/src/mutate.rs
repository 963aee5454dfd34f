//! Seeded mutations of sample inputs, for the codecs' invariant tests (the bounded, in-CI half
//! of their fuzz targets).

/// Calls `check` on `rounds` mutations of `seeds` (each seed in turn, with up to five byte
/// changes, insertions from `alphabet`, removals or truncations), from a fixed xorshift seed.
pub fn each_mutation(seeds: &[&[u8]], alphabet: &[u8], rounds: usize, mut check: impl FnMut(&[u8])) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..rounds {
        let mut b = seeds[i % seeds.len()].to_vec();
        for _ in 0..(next() % 6) {
            let r = next();
            let at = (r as usize >> 8) % (b.len() + 1);
            match r % 4 {
                0 if at < b.len() => b[at] = (r >> 32) as u8,
                1 => b.insert(at, alphabet[(r >> 40) as usize % alphabet.len()]),
                2 if at < b.len() => {
                    b.remove(at);
                }
                _ => b.truncate(at),
            }
        }
        check(&b);
    }
}
