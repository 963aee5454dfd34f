//! `KeyTemplate::parse` then `render` over an arbitrary request head. Input:
//!
//! ```text
//! {path}?w={query.w}&h={query.h}        the template (line 1)
//! decode,lowercase                      normalisations, comma-separated (line 2)
//! @peer=10.0.0.1                        then a request as in keyroute_fuzz (the @ line optional)
//! GET /thumb/cat.jpg?h=200&w=100 HTTP/1.1
//! Host: img.example
//! ```
//!
//! Checks: never a panic; `as_str` is the template as written; rendering is deterministic and
//! clears the output first; a template without braces renders as its (lowercased) literal.

use crate::{decode, line};
use keyroute_gateway::key::{HttpRequest, KeyTemplate};

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    let (template, rest) = line(data);
    let (normalize, rest) = line(rest);
    let template = String::from_utf8_lossy(template);
    let normalize: Vec<String> = String::from_utf8_lossy(normalize)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let Ok(t) = KeyTemplate::parse(&template, &normalize) else { return };
    assert_eq!(t.as_str(), template);
    let Some(d) = decode(rest) else { return };
    let (parts, ()) = d.head.into_parts();
    let ip = d.options.peer.ip();
    let mut out = String::new();
    let first = t.render(&HttpRequest::new(&parts, ip), &mut out);
    let mut again = String::from("stale text that render must clear");
    let second = t.render(&HttpRequest::new(&parts, ip), &mut again);
    assert_eq!(first, second, "render is not deterministic");
    if first.is_ok() {
        assert_eq!(out, again, "render did not clear its output, or is not deterministic");
    }
    if !template.contains(['{', '}']) {
        assert!(first.is_ok(), "a literal template reported a missing part: {first:?}");
        let lowercase = normalize.iter().any(|n| n == "lowercase");
        let want = if lowercase { template.to_lowercase() } else { template.clone().into_owned() };
        assert_eq!(out, want);
    }
}
