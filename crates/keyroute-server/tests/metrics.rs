//! `/metrics` as a real Prometheus parser reads it: `promtool check metrics` (Debian's
//! `prometheus` package, which `scripts/test.sh` installs), and each family in one block.

mod support;

use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};

use http::StatusCode;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_with_each_family_once() {
    let bs = backends(3).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"rendezvous\"", "")).await;
    let c = client();
    for i in 0..30 {
        let (s, _, _) = get(&c, &format!("http://{}/thumb?k={i}", gw.addr)).await;
        assert_eq!(s, StatusCode::OK);
    }
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let text = m.as_str().expect("text").to_owned();

    // Each family's lines are contiguous: once a family ends, its name never comes back.
    let mut done: HashSet<String> = HashSet::new();
    let mut current = String::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let name = match line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
            Some(rest) => rest.split(' ').next().unwrap_or("").to_owned(),
            None => {
                let sample = line.split(['{', ' ']).next().unwrap_or("");
                // Histogram and counter samples carry suffixes of their family's name.
                if sample.starts_with(current.as_str()) { current.clone() } else { sample.to_owned() }
            }
        };
        if name != current {
            assert!(done.insert(current.clone()) || current.is_empty(), "family {current} appears twice");
            assert!(!done.contains(&name), "family {name} is split: its samples come back after another family");
            current = name;
        }
    }
    for family in [
        "keyroute_worker_responses_total",
        "keyroute_worker_latency_seconds",
        "keyroute_pool_requests_total",
        "keyroute_listener_connections",
        "keyroute_worker_truncated_responses_total",
    ] {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing:\n{text}");
    }
    // Every worker's samples under one family.
    for w in ["w1", "w2", "w3"] {
        assert!(text.contains(&format!("keyroute_worker_in_flight{{pool=\"p\",worker=\"{w}\"}}")), "{text}");
    }

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) is installed by scripts/test.sh");
    promtool.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = promtool.wait_with_output().expect("promtool runs");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check metrics failed:\n{said}\n{text}");
    assert!(said.trim().is_empty(), "promtool has remarks:\n{said}");
    gw.task.abort();
}
