//! One worker, validated the same way for a configuration file, the admin API and a membership
//! record: a name and zone of visible characters that look like no other, and an address that a
//! worker can listen at and that is not the gateway's own.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use super::WorkerConfig;

/// Whether `ip` is one of this machine's own addresses (loopback, a wildcard, or an address a
/// socket can bind to here).
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Whether a worker at `worker` would be the gateway itself, listening at `own`: the fleet's one
/// rule ([`keyroute_etcd::gateways::reaches`], which `keyroute members add` applies to the
/// gateways' records), with this machine's own addresses.
pub fn points_at(worker: SocketAddr, own: SocketAddr) -> bool {
    keyroute_etcd::gateways::reaches(worker, own, is_local)
}

/// One field of a worker that failed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerFieldError {
    /// `name`, `address`, `weight` or `zone`.
    pub field: &'static str,
    /// Why.
    pub message: String,
}

/// The longest worker name or zone, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

fn check_label(what: &'static str, text: &str) -> Result<(), WorkerFieldError> {
    let bad = |message: String| Err(WorkerFieldError { field: what, message });
    if text.is_empty() {
        return bad("must not be empty".into());
    }
    if text.len() > MAX_NAME_BYTES {
        return bad(format!("must be at most {MAX_NAME_BYTES} bytes (got {})", text.len()));
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("must not contain spaces or control characters".into());
    }
    if let Some(c) = text.chars().find(|&c| invisible(c)) {
        return bad(format!(
            "must not contain invisible or direction-changing characters (U+{:04X}): a name that looks like another is not another",
            c as u32
        ));
    }
    Ok(())
}

/// Characters that show nothing, or change how the text around them shows, so that two names
/// that look alike differ (`w1` and `w1` + U+200B): Unicode's Default_Ignorable_Code_Point set
/// (format characters of category Cf: zero-width spaces and joiners, bidirectional controls, the
/// BOM, tags; the Hangul and Khitan fillers; variation selectors; the reserved U+FFF0..U+FFF8),
/// the interlinear annotation marks, and symbols drawn as a blank: U+2800 BRAILLE PATTERN BLANK
/// (`w1⠀` looks like `w1`, issue 31 defect 20). Whitespace and controls are refused before this.
fn invisible(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x2800 | 0x3164 | 0xFE00..=0xFE0F
        | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFFB | 0x16FE4 | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF)
}

/// Validates one worker, the same way for a configuration file and the admin API: a name and
/// zone of visible characters, an address (`ip:port`, or `host:port` resolved now) that is a
/// real unicast address and not one of the gateway's own listeners (`own`).
///
/// # Errors
///
/// The first field that is wrong.
pub fn validate_worker(
    name: &str,
    address: &str,
    weight: u32,
    zone: Option<&str>,
    own: &[SocketAddr],
) -> Result<WorkerConfig, WorkerFieldError> {
    validate_worker_with(name, address, weight, zone, own, resolve)
}

/// [`validate_worker`] with the name resolution passed in (the fuzz targets resolve nothing).
pub fn validate_worker_with(
    name: &str,
    address: &str,
    weight: u32,
    zone: Option<&str>,
    own: &[SocketAddr],
    resolve: impl Fn(&str) -> Option<SocketAddr>,
) -> Result<WorkerConfig, WorkerFieldError> {
    check_label("name", name)?;
    if let Some(z) = zone
        && !z.is_empty()
    {
        check_label("zone", z)?;
    }
    let bad_address = |message: String| WorkerFieldError { field: "address", message };
    let Some(addr) = socket_addr(address, resolve) else {
        return Err(bad_address(format!("'{}' is not an address (host:port)", address.escape_debug())));
    };
    if addr.ip().is_unspecified() || addr.ip().is_multicast() || addr.port() == 0 {
        return Err(bad_address(format!("{addr} is not an address a worker can listen at")));
    }
    if let Some(o) = own.iter().find(|o| points_at(addr, **o)) {
        return Err(bad_address(format!("{addr} is the gateway's own listener {o}: requests would loop")));
    }
    let _ = weight;
    Ok(WorkerConfig {
        id: None,
        name: name.to_owned(),
        address: addr,
        weight,
        zone: zone.filter(|z| !z.is_empty()).map(str::to_owned),
    })
}

/// The first address a `host:port` (or `ip:port`) resolves to now.
pub fn resolve(text: &str) -> Option<SocketAddr> {
    text.to_socket_addrs().ok().and_then(|mut it| it.next())
}

/// An `ip:port`, else a `host:port` resolved by `resolve`.
pub fn socket_addr(text: &str, resolve: impl Fn(&str) -> Option<SocketAddr>) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| resolve(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_at_the_gateways_own_address_is_found_in_any_spelling() {
        let own: SocketAddr = "127.0.0.1:9901".parse().expect("addr");
        for w in ["127.0.0.1:9901", "[::ffff:127.0.0.1]:9901"] {
            assert!(points_at(w.parse().expect("addr"), own), "{w}");
        }
        assert!(!points_at("127.0.0.1:9902".parse().expect("addr"), own));
        let any: SocketAddr = "0.0.0.0:8080".parse().expect("addr");
        for w in ["127.0.0.1:8080", "[::1]:8080", "[::ffff:127.0.0.1]:8080"] {
            assert!(points_at(w.parse().expect("addr"), any), "{w}");
        }
    }

    #[test]
    fn look_alike_names_are_refused() {
        for name in ["w1\u{200B}", "\u{202E}1w", "w\u{2060}1", "\u{FEFF}w1", "w1\u{FE0F}", "w\u{00AD}1", "w1\u{E0041}"]
        {
            let err = check_label("name", name).expect_err("refused");
            assert!(err.message.contains("invisible"), "{name:?}: {}", err.message);
        }
        // Issue 31, defect 20: blanks that are neither whitespace nor format characters.
        for c in [
            '\u{2800}',
            '\u{115F}',
            '\u{1160}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{180E}',
            '\u{200B}',
            '\u{200F}',
            '\u{2064}',
            '\u{FEFF}',
            '\u{FE00}',
            '\u{E0100}',
            '\u{FFF0}',
            '\u{16FE4}',
            '\u{1D173}',
        ] {
            let name = format!("w1{c}");
            let err = check_label("name", &name).expect_err("refused");
            assert!(err.message.contains("invisible"), "{name:?}: {}", err.message);
        }
        for c in ['\u{3000}', '\u{00A0}', '\u{2007}', '\u{205F}'] {
            assert!(check_label("name", &format!("w1{c}")).is_err(), "{c:?} is whitespace");
        }
        for name in ["w1", "thumb-ü", "東京-1", "cache.a_b"] {
            assert!(check_label("name", name).is_ok(), "{name}");
        }
    }
}
