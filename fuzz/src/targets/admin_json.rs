//! The admin API's JSON bodies: `POST /workers` (`add_worker`, validated against the gateway's
//! own addresses, host names not resolved) and `PATCH /workers/NAME` (`patch_worker`), on
//! arbitrary bytes, through `keyroute_admin::fuzzing`.
//!
//! Checks: never a panic; what is accepted is cross-checked against a plain `serde_json::Value`
//! parse of the same bytes: an accepted worker has a valid name (1..=256 bytes, no spaces or
//! control characters), a literal `ip:port` address that is unicast, has a port, and is none of
//! the gateway's own; an accepted patch's weight is the body's `weight`.

use std::net::SocketAddr;

use keyroute_admin::fuzzing::{add_worker, patch_worker};
use serde_json::Value;

fn own() -> [SocketAddr; 4] {
    [
        "127.0.0.1:8080".parse().expect("addr"),
        "0.0.0.0:9000".parse().expect("addr"),
        "[::1]:8443".parse().expect("addr"),
        "[::]:7000".parse().expect("addr"),
    ]
}

/// A field of the body: by name in an object, or by position in an array (serde's derived
/// `Deserialize` takes a struct as a sequence of its fields too).
fn field<'v>(v: &'v Value, name: &str, position: usize) -> Option<&'v Value> {
    match v {
        Value::Object(m) => m.get(name),
        Value::Array(a) => a.get(position),
        _ => None,
    }
}

/// `KEYROUTE_FUZZ_PRINT=1` prints each input's result (to look at seeds or artifacts).
fn print() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KEYROUTE_FUZZ_PRINT").is_some())
}

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    let own = own();
    if print() {
        eprintln!(
            "{:?}: add_worker {}, patch_worker {:?}",
            String::from_utf8_lossy(data),
            add_worker(data, &own),
            patch_worker(data)
        );
    }
    if add_worker(data, &own) {
        let v: Value = serde_json::from_slice(data).expect("accepted a body that is not JSON");
        let name = field(&v, "name", 0).and_then(Value::as_str).expect("accepted without a string name");
        assert!(!name.is_empty() && name.len() <= 256, "accepted name of {} bytes", name.len());
        assert!(!name.chars().any(|c| c.is_control() || c.is_whitespace()), "accepted name {name:?}");
        let address = field(&v, "address", 1).and_then(Value::as_str).expect("accepted without a string address");
        let a: SocketAddr = address.parse().expect("accepted an address that is not ip:port (nothing resolves here)");
        assert!(a.port() != 0 && !a.ip().is_unspecified() && !a.ip().is_multicast(), "accepted {a}");
        assert!(!own.contains(&a), "accepted the gateway's own address {a}");
        let wildcard_hit = own.iter().any(|o| o.ip().is_unspecified() && o.port() == a.port() && a.ip().is_loopback());
        assert!(!wildcard_hit, "accepted {a}, a loopback address on a port the gateway listens at on a wildcard");
        if let Some(z) = field(&v, "zone", 3).and_then(Value::as_str).filter(|z| !z.is_empty()) {
            assert!(z.len() <= 256 && !z.chars().any(|c| c.is_control() || c.is_whitespace()), "accepted zone {z:?}");
        }
    }
    if let Some(w) = patch_worker(data) {
        let v: Value = serde_json::from_slice(data).expect("accepted a patch that is not JSON");
        assert_eq!(field(&v, "weight", 0).and_then(Value::as_u64), Some(u64::from(w)), "weight differs");
    }
}
