//! Every fuzz target on its committed seeds (`corpus/<target>/`) and on the reproducers of earlier
//! findings (`regressions/<target>/`), without libFuzzer: on every `cargo test --workspace` the
//! targets' code builds and its invariants hold on these inputs (a target that no longer compiles,
//! or a seed that now panics, fails here). Long runs that search for new inputs are `fuzz/run.sh`.

use std::path::Path;

use keyroute_fuzz::targets;

/// Runs `run` on every file of `corpus/<target>` (at least one) and `regressions/<target>`, in
/// name order; returns how many.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            assert_ne!(dir, "corpus", "{target} has no seed corpus");
            continue;
        };
        let mut files: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            let bytes = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            eprintln!("{target}: {}", f.display());
            run(&bytes);
            n += 1;
        }
    }
    assert!(n > 0, "{target}: no inputs");
    n
}

#[test]
fn admin_json() {
    replay("admin_json", targets::admin_json::run);
}

#[test]
fn config() {
    replay("config", targets::config::run);
}

#[test]
fn http1_differential() {
    replay("http1_differential", targets::http1_differential::run);
}

#[test]
fn key_template() {
    replay("key_template", targets::key_template::run);
}

#[test]
fn memcache_codec() {
    replay("memcache_codec", targets::memcache_codec::run);
}

#[test]
fn request() {
    replay("request", targets::request::run);
}

#[test]
fn resp_codec() {
    replay("resp_codec", targets::resp_codec::run);
}
