//! Byte buffers lent by the runtime thread, so that a client holds none while it is idle and a
//! command allocates none while it is served.
//!
//! A client's read buffer, its answers, the batch's answer arena and the requests gathered for
//! each server are needed only while a batch runs. Freed when the client goes idle and allocated
//! again when it sends, they cost four allocations a command for a client that does not pipeline
//! (most memcached clients); kept, they cost every idle client their capacity. Lent by the
//! thread instead (a free list, as nginx reuses freed buffer chains): a buffer goes back to
//! the thread's free list when its client goes idle (or its batch ends) and is lent to the next
//! batch that needs one, so in steady state nothing is allocated, and an idle client holds
//! nothing. The list keeps at most [`KEPT`] buffers of at most [`LARGEST`] bytes each: a buffer a
//! long pipeline grew is freed, not kept.

use std::cell::RefCell;
use std::thread::LocalKey;

use bytes::BytesMut;

/// The most buffers (or lists) of each kind a thread keeps.
const KEPT: usize = 256;

/// The largest buffer kept; a larger one is freed when given back. With [`KEPT`], a thread
/// keeps at most 4 MiB of each kind, and as much as its busiest moment needed.
const LARGEST: usize = 16 * 1024;

thread_local! {
    static BYTES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static READS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// The thread's free list of `T`: its last one, or a new one.
pub(crate) fn lend<T: Default + 'static>(list: &'static LocalKey<RefCell<Vec<T>>>) -> T {
    list.try_with(|f| f.borrow_mut().pop()).ok().flatten().unwrap_or_default()
}

/// Keeps `item` on the thread's free list, unless it holds [`KEPT`] already.
pub(crate) fn keep<T: 'static>(list: &'static LocalKey<RefCell<Vec<T>>>, item: T) {
    let _ = list.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < KEPT {
            f.push(item);
        }
    });
}

/// An empty buffer: one the thread kept, or a new one.
pub(crate) fn take() -> Vec<u8> {
    lend(&BYTES)
}

/// Gives `buf` back to the thread (emptied), unless it is too large to keep or the thread keeps
/// enough already; leaves `buf` empty, with no capacity.
pub(crate) fn give(buf: &mut Vec<u8>) {
    let mut buf = std::mem::take(buf);
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    keep(&BYTES, buf);
}

/// A read buffer of at least `room` bytes free: one the thread kept, or a new one.
pub(crate) fn take_read(room: usize) -> BytesMut {
    let mut buf = lend(&READS);
    buf.reserve(room);
    buf
}

/// Gives an empty read buffer back to the thread, as [`give`] does; a buffer holding unread bytes
/// stays where it is.
pub(crate) fn give_read(buf: &mut BytesMut) {
    if !buf.is_empty() {
        // Unread bytes are the client's: never dropped here.
        return;
    }
    let buf = std::mem::take(buf);
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    keep(&READS, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again_empty_and_a_large_one_is_not_kept() {
        let mut a = take();
        a.extend_from_slice(b"some answers");
        let at = a.as_ptr();
        give(&mut a);
        assert_eq!(a.capacity(), 0, "the giver holds nothing");
        let b = take();
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), at, "the same allocation, lent again");
        let mut big = Vec::with_capacity(LARGEST + 1);
        big.push(1);
        give(&mut big);
        assert_eq!(take().capacity(), 0, "a buffer over the limit is freed, not kept");

        let mut r = take_read(4096);
        assert!(r.capacity() >= 4096);
        r.extend_from_slice(b"get k\r\n");
        bytes::Buf::advance(&mut r, 7);
        give_read(&mut r);
        assert_eq!(r.capacity(), 0, "the giver holds nothing");
        let r = take_read(16);
        assert!(r.is_empty() && r.capacity() >= 16);
        let mut unread = take_read(16);
        unread.extend_from_slice(b"get");
        give_read(&mut unread);
        assert_eq!(&unread[..], b"get", "unread bytes are never dropped");
    }
}
