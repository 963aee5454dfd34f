//! `Config::parse` on arbitrary text (bytes converted lossily to UTF-8): never panics, and an
//! error names this file and a line that exists.
//!
//! Name resolution: validation resolves `host:port` addresses (`admin.listen`, `listener.listen`,
//! `pool.worker.address`) with `to_socket_addrs`, i.e. getaddrinfo, which here asks the machine's
//! DNS server. Inputs whose TOML has such a value that is not a literal `ip:port` are skipped, so
//! the fuzzer sends no DNS traffic and stays fast and deterministic. Text that is not TOML is
//! always run: `Config::parse` fails on it before any address is looked at.

/// Whether the TOML holds an address value that `Config::parse` would resolve as a host name.
fn would_resolve(text: &str) -> bool {
    fn walk(key: Option<&str>, v: &toml::Value) -> bool {
        match v {
            toml::Value::String(s) => {
                matches!(key, Some("listen" | "address")) && s.parse::<std::net::SocketAddr>().is_err()
            }
            toml::Value::Array(a) => a.iter().any(|v| walk(key, v)),
            toml::Value::Table(t) => t.iter().any(|(k, v)| walk(Some(k), v)),
            _ => false,
        }
    }
    match text.parse::<toml::Table>() {
        Ok(t) => t.iter().any(|(k, v)| walk(Some(k), v)),
        Err(_) => false,
    }
}

/// `KEYROUTE_FUZZ_CHECK_KNOWN=1` also asserts the opt-in invariants of earlier findings.
fn check_known() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KEYROUTE_FUZZ_CHECK_KNOWN").is_some())
}

/// `KEYROUTE_FUZZ_PRINT=1` prints each input's result (to look at seeds or artifacts).
fn print() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KEYROUTE_FUZZ_PRINT").is_some())
}

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if would_resolve(&text) {
        return;
    }
    let parsed = keyroute_server::Config::parse(&text, "fuzz.toml");
    if print() {
        match &parsed {
            Ok(c) => eprintln!("ok: {} pool(s), {} warning(s)", c.pools.len(), c.warnings.len()),
            Err(e) => eprintln!("error: {e}\n  (line {:?}, field {:?})", e.line, e.field),
        }
    }
    match parsed {
        Ok(config) => {
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(shown.starts_with("fuzz.toml"), "error does not name the file: {shown}");
            assert_eq!(e.file, "fuzz.toml");
            if let Some(line) = e.line {
                // Lines are 1-based; a position at the very end (after a final newline) is the
                // line after the last one.
                let lines = text.split('\n').count();
                assert!((1..=lines).contains(&line), "line {line} of a {lines}-line text: {shown}");
            }
            // (Found by this target and fixed: the text `[` had an empty field.)
            assert!(!e.field.is_empty(), "error without a field: {shown}");
            // (Found and fixed: a table header with a comment after it made the field of every
            // error in that table `admin] # comment.key`.) Opt-in, as a name may contain `]`.
            if check_known() {
                assert!(!e.field.contains(']'), "a field with a header's bracket: {shown}");
            }
        }
    }
}
