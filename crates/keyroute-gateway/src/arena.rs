//! Per-request buffers that the runtime thread keeps between requests, so that a request in
//! steady state allocates none of them.
//!
//! Small per-request values (a new request id, `Forwarded`) are written into a block the runtime
//! thread shares among them, as [`Bytes`] slices of it: one allocation per block of
//! [`BLOCK`] bytes instead of one per value. A block is freed when the last value that points
//! into it is dropped; values are short-lived (they end with their request), so a block outlives
//! its last request by little.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use keyroute_http1::buf::{Pool, Spare};

/// The size of a new block.
const BLOCK: usize = 8 * 1024;

thread_local! {
    static BLOCKS: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// A value of at most `max` bytes, written by `write` into the thread's block (a new block when
/// this one has less than `max` left; a value larger than a block gets its own allocation).
pub(crate) fn bytes(max: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut write = Some(write);
    if max <= BLOCK / 4 {
        let shared = BLOCKS.try_with(|cell| {
            let mut block = cell.try_borrow_mut().ok()?;
            if block.capacity() - block.len() < max {
                *block = BytesMut::with_capacity(BLOCK);
            }
            write.take()?(&mut block);
            Some(block.split().freeze())
        });
        if let Ok(Some(b)) = shared {
            return b;
        }
    }
    // A large value, or a thread being torn down: an allocation of its own.
    let mut own = BytesMut::with_capacity(max);
    if let Some(w) = write.take() {
        w(&mut own);
    }
    own.freeze()
}

thread_local! {
    static KEY_SPARES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Requests' key texts: the key is rendered into one for every keyed request, and a new
/// `String` would be an allocation each (64 kept per thread, none over 4 KiB).
static KEYS: Pool<String> = Pool::new(&KEY_SPARES, 64, 4096);

/// A request's key text, in a buffer from the thread's spares (given back when dropped).
pub(crate) fn key_text() -> Spare<String> {
    Spare::take(&KEYS, String::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_their_bytes_and_share_a_block() {
        let a = bytes(16, |b| b.extend_from_slice(b"0123456789abcdef"));
        let b = bytes(40, |b| b.extend_from_slice(b"for=127.0.0.1;proto=http"));
        assert_eq!(&a[..], b"0123456789abcdef");
        assert_eq!(&b[..], b"for=127.0.0.1;proto=http");
        // One block: the second value starts where the first ended.
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
        let big = bytes(BLOCK, |b| b.extend_from_slice(&[b'x'; 3000]));
        assert_eq!(big.len(), 3000);
        // Many values, across blocks, each intact.
        let many: Vec<Bytes> =
            (0..5000).map(|i| bytes(24, |b| b.extend_from_slice(format!("{i:024}").as_bytes()))).collect();
        for (i, v) in many.iter().enumerate() {
            assert_eq!(&v[..], format!("{i:024}").as_bytes());
        }
    }
}
