//! The `Date` field of responses (RFC 9110 section 6.6.1), formatted once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Appends the current date in IMF-fixdate form (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn append(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}
