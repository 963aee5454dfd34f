//! Standard base64 (RFC 4648 §4, with its padding), decoded: Basic credentials and memcached's
//! base64 keys are sent this way.

/// The bytes of `text`, or `None` when it is not padded base64.
pub(crate) fn decode(text: &[u8]) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let quads = text.len() / 4;
    for (q, quad) in text.chunks_exact(4).enumerate() {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && q + 1 != quads) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = n << 6 | value(c)?;
        }
        n <<= 6 * pad as u32;
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4648_vectors() {
        assert_eq!(decode(b"").as_deref(), Some(&b""[..]));
        assert_eq!(decode(b"TWFu").as_deref(), Some(&b"Man"[..]));
        assert_eq!(decode(b"TWE=").as_deref(), Some(&b"Ma"[..]));
        assert_eq!(decode(b"TQ==").as_deref(), Some(&b"M"[..]));
        assert_eq!(decode(b"Zm9vYmFy").as_deref(), Some(&b"foobar"[..]));
        for bad in [&b"TQ="[..], b"T===", b"YQ==YQ==", b"%%%%", b"TW\nu"] {
            assert_eq!(decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
