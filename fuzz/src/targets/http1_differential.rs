//! keyroute's HTTP/1 request parser against hyper's HTTP/1 server on the same bytes (issue 20):
//! the same messages (method, target, body: the same boundaries), or a stricter refusal by
//! keyroute. Any other difference panics. The comparison is the one the bounded CI test runs
//! (`crates/keyroute-http1/tests/differential.rs`), included from its file.

use std::sync::OnceLock;

#[path = "../../../crates/keyroute-http1/tests/support/compare.rs"]
mod compare;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime"))
}

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(input: &[u8]) {
    let ours = compare::engine(input, &keyroute_http1::Limits::default());
    let theirs = runtime().block_on(compare::hyper_server(input));
    if let Some(why) = compare::disagreement(&ours, &theirs) {
        panic!("{why}\ninput: {:?}", String::from_utf8_lossy(input));
    }
}
