//! The `keyroute` binary, run as a user runs it: the invocations the README and scripts rely on.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn keyroute(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyroute")).args(args).output().expect("runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn balance_reproduces_the_java_sketch_counts() {
    let o = keyroute(&[
        "sim",
        "balance",
        "--strategy",
        "ring",
        "--scheme",
        "java-md5",
        "--vnodes",
        "100",
        "--nodes",
        "A,B,C",
        "--keys",
        "10000",
        "--key-format",
        "user:{}",
    ]);
    assert!(o.status.success());
    let text = stdout(&o);
    for (node, keys) in [("A", "3232"), ("B", "3370"), ("C", "3398")] {
        assert!(text.lines().any(|l| l.split_whitespace().take(3).eq([node, "1", keys])), "{text}");
    }
}

#[test]
fn remap_reproduces_2448_keys_all_to_d() {
    let o = keyroute(&[
        "sim",
        "remap",
        "--strategy",
        "ring",
        "--scheme",
        "java-md5",
        "--vnodes",
        "100",
        "--before",
        "A,B,C",
        "--after",
        "A,B,C,D",
        "--keys",
        "10000",
        "--key-format",
        "user:{}",
        "--json",
    ]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["moved"], 2448);
    assert!(v["matrix"].as_array().expect("array").iter().all(|m| m["to"] == "D"));
    let o = keyroute(&[
        "sim",
        "remap",
        "--strategy",
        "modulo",
        "--before",
        "A,B,C",
        "--after",
        "A,B,C,D",
        "--keys",
        "10000",
        "--key-format",
        "user:{}",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let share = v["moved_share"].as_f64().expect("number");
    assert!((0.72..=0.78).contains(&share), "{share}");
}

#[test]
fn remap_with_traffic_reports_the_requests_lost() {
    let dir = std::env::temp_dir().join(format!("keyroute-cli-traffic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("traffic.log");
    // One hot key requested 1000 times and 200 cold ones once.
    let mut text = "hot\n".repeat(1000);
    for i in 0..200 {
        text.push_str(&format!("cold-{i}\n"));
    }
    std::fs::write(&log, text).expect("write");
    let o = keyroute(&[
        "sim",
        "remap",
        "-s",
        "rendezvous",
        "--before",
        "a,b,c",
        "--after",
        "a,b,c,d",
        "--traffic",
        log.to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["keys"], 201);
    assert_eq!(v["traffic"]["requests"], 1200);
    // Each moved cold key loses one request; the hot key, if it moved, a thousand.
    let (requests, keys) = (v["traffic"]["moved"].as_u64().expect("n"), v["moved"].as_u64().expect("n"));
    assert!(requests == keys || requests == keys - 1 + 1000, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn choices_reproduces_mitzenmacher_at_a_million() {
    let o = keyroute(&["sim", "choices", "--bins", "1000000", "--balls", "1000000", "--choices", "1,2", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let one = v["results"][0]["max_load"][0].as_u64().expect("n");
    let two = v["results"][1]["max_load"][0].as_u64().expect("n");
    assert!((8..=10).contains(&one), "{one}");
    assert!((3..=4).contains(&two), "{two}");
}

#[test]
fn place_prints_key_tab_node_lines_with_replicas() {
    let o = keyroute(&["place", "--strategy", "rendezvous", "--nodes", "a,b,c", "--replicas", "2", "k1", "k2"]);
    assert!(o.status.success());
    let text = stdout(&o);
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0][0], lines[1][0]), ("k1", "k2"));
    for l in &lines {
        assert_eq!(l.len(), 3);
        assert_ne!(l[1], l[2]);
        assert!(["a", "b", "c"].contains(&l[1]) && ["a", "b", "c"].contains(&l[2]));
    }
}

#[test]
fn place_streams_stdin_in_order_and_agrees_with_arguments() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyroute"))
        .args(["place", "-s", "ring", "-n", "x,y:weight=2,z", "-r", "3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = String::new();
    for i in 0..20_000 {
        input.push_str(&format!("key-{i}\r\n"));
    }
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("output");
    writer.join().expect("join").expect("write");
    let text = String::from_utf8(out.stdout).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20_000);
    assert!(lines[7].starts_with("key-7\t"));
    let single = stdout(&keyroute(&["place", "-s", "ring", "-n", "x,y:weight=2,z", "-r", "3", "key-7"]));
    assert_eq!(single.trim_end(), lines[7]);
}

#[test]
fn place_json_and_zone_awareness() {
    let o = keyroute(&[
        "place",
        "-s",
        "rendezvous",
        "-n",
        "a:zone=1,b:zone=1,c:zone=2",
        "-r",
        "2",
        "--zone-aware",
        "--json",
        "k",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let nodes: Vec<&str> = v["nodes"].as_array().expect("array").iter().filter_map(|n| n.as_str()).collect();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.contains(&"c"), "zone 2 must be used: {nodes:?}");
}

#[test]
fn usage_errors_exit_64_and_say_what_is_wrong() {
    for (args, needle) in [
        (vec!["place", "--strategy", "fastest", "-n", "a", "k"], "valid: modulo, ring"),
        (vec!["place", "-n", "a,b:weight=two", "k"], "token 2 ('b:weight=two')"),
        (vec!["place", "-s", "p2c", "-n", "a", "k"], "does not place by key"),
        (vec!["sim", "balance", "-s", "jump", "-n", "a:weight=3", "--keys", "10"], "jump hash cannot weight"),
        (vec!["sim", "fleet", "--scenario", "nope"], "unknown scenario 'nope'"),
        (vec!["sim", "fleet", "--rate", "0"], "rate must be > 0"),
        (vec!["sim", "choices", "--choices", "0"], "choices must be"),
        (vec!["place", "--replicas", "0", "-n", "a", "k"], "--replicas"),
        (vec!["sim", "fleet", "--change", "0.5:explode"], "expected AT:add"),
        (vec!["sim", "fleet", "--change", "0.5:slow:0:2"], "WORKER counts from 1"),
        (vec!["sim", "fleet", "--change", "1.5:add"], "a change's time must be in [0, 1]"),
        (vec!["nonsense"], "unrecognized subcommand"),
    ] {
        let o = keyroute(&args);
        assert_eq!(o.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let o = keyroute(&["sim", "remap", "--before", "a", "--after", "a,b", "--keys-file", "/nonexistent/keys"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/keys"));
}

#[test]
fn every_command_has_help() {
    for args in [
        vec!["--help"],
        vec!["place", "--help"],
        vec!["sim", "--help"],
        vec!["sim", "fleet", "--help"],
        vec!["sim", "remap", "--help"],
    ] {
        let o = keyroute(&args);
        assert!(o.status.success(), "{args:?}");
        assert!(stdout(&o).contains("Usage"), "{args:?}");
    }
}

#[test]
fn fleet_takes_extra_timed_changes() {
    let o = keyroute(&[
        "sim",
        "fleet",
        "--strategies",
        "rendezvous",
        "--requests",
        "20000",
        "--change",
        "0.3:add",
        "--change",
        "0.6:remove",
        "--change",
        "0.1:slow:2:3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let remaps = v[0][1][0]["remaps"].as_array().expect("remaps").clone();
    assert_eq!(remaps.len(), 2, "{remaps:?}");
    assert_eq!(remaps[0]["change"], "add w9");
    assert_eq!(remaps[1]["change"], "remove w9");
}

#[test]
fn fleet_runs_a_small_scenario_and_writes_a_report() {
    let dir = std::env::temp_dir().join(format!("keyroute-cli-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let report = dir.join("r.html");
    let o = keyroute(&[
        "sim",
        "fleet",
        "--scenario",
        "scale-out",
        "--strategies",
        "modulo,rendezvous",
        "--requests",
        "20000",
        "--report",
        report.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(text.contains("rendezvous") && text.contains("modulo"), "{text}");
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(html.contains("<svg") && html.contains("latency CDF"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn slot_prints_redis_keyslots_and_the_created_clusters_master() {
    let out = keyroute(&["slot", "123456789", "{user1}.following", "a{b}c{d}", "b"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "123456789\t12739");
    assert_eq!(lines[1], "{user1}.following\t8106");
    // A hash tag: the same slot as its content.
    assert_eq!(lines[2].split('\t').nth(1), lines[3].split('\t').nth(1));
    // 3 masters: 0-5460, 5461-10922, 10923-16383 (as redis-cli --cluster create gives them).
    let out = keyroute(&["slot", "--masters", "10.0.0.1:7000,10.0.0.1:7001,10.0.0.1:7002", "somekey", "{user1}.x"]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text, "somekey\t11058\t10.0.0.1:7002\n{user1}.x\t8106\t10.0.0.1:7001\n");
    let out = keyroute(&["slot", "--masters", "a:1,b:2", "k"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 to 16384 masters"));
}

/// `place --compat`: the answers of the real programs (from the golden files of
/// `crates/keyroute/testdata/compat/`).
#[test]
fn place_compat_answers_as_the_real_programs() {
    let buckets: Vec<String> = (0..100).map(|i| format!("b{i}")).collect();
    let buckets = buckets.join(",");
    let one = |args: &[&str]| {
        let out = keyroute(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    // Guava 31.1: consistentHash(42, 100) = 43; murmur3_128("hello") -> 65; md5("hello") -> 89.
    assert_eq!(one(&["place", "--compat", "guava", "--guava-input", "long", "-n", &buckets, "42"]), "42\tb43\n");
    assert_eq!(one(&["place", "--compat", "guava", "-n", &buckets, "hello"]), "hello\tb65\n");
    assert_eq!(one(&["place", "--compat", "guava", "--guava-input", "md5", "-n", &buckets, "hello"]), "hello\tb89\n");
    // golang/groupcache, 50 replicas over cache-a..cache-h: "a" -> cache-d.
    let names8 = "cache-a,cache-b,cache-c,cache-d,cache-e,cache-f,cache-g,cache-h";
    assert_eq!(one(&["place", "--compat", "groupcache", "-n", names8, "a"]), "a\tcache-d\n");
    // Redis Cluster created over 3 masters: somekey (slot 11058) -> the third.
    assert_eq!(
        one(&["place", "--compat", "redis-cluster", "-n", "10.0.0.1:7000,10.0.0.1:7001,10.0.0.1:7002", "somekey"]),
        "somekey\t10.0.0.1:7002\n"
    );
    for bad in [
        vec!["place", "--compat", "guava", "--guava-input", "long", "-n", "a,b", "x"],
        vec!["place", "--compat", "ngnix", "-n", "a,b", "x"],
        vec!["place", "--compat", "guava", "--guava-input", "long", "-r", "2", "-n", "a,b", "1"],
        vec!["place", "--compat", "haproxy", "-n", "a:id=2,b:id=2", "x"],
        vec!["place", "--compat", "haproxy", "--haproxy-hash", "md5", "-n", "a,b", "x"],
        vec!["place", "--compat", "twemproxy", "--hash-tag", "{", "-n", "a,b", "x"],
        vec!["place", "--compat", "envoy-maglev", "--envoy-table-size", "65536", "-n", "a,b", "x"],
        vec!["place", "--compat", "nginx", "--zone-aware", "-n", "a,b", "x"],
    ] {
        assert_eq!(keyroute(&bad).status.code(), Some(64), "{bad:?}");
    }
}

/// `sim remap --from MODE --to STRATEGY`: the keys (and requests) that a switch of strategy moves,
/// per node, equal to the keys on which `place` answers differently under the two.
#[test]
fn remap_between_strategies_counts_what_place_moves() {
    let dir = std::env::temp_dir().join(format!("keyroute-cli-switch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("traffic.log");
    let mut text = String::new();
    for i in 0..1500 {
        // Key i is requested 1 + i % 3 times.
        for _ in 0..=(i % 3) {
            text.push_str(&format!("/thumb/img-{i}.jpg\n"));
        }
    }
    std::fs::write(&log, &text).expect("write");
    let nodes = "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80:weight=2,cache-d";
    let o = keyroute(&[
        "sim",
        "remap",
        "--from",
        "nginx",
        "--to",
        "rendezvous",
        "--before",
        nodes,
        "--traffic",
        log.to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["strategy"], "nginx -> rendezvous");
    assert_eq!(v["keys"], 1500);
    let place = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["place", "-n", nodes];
        all.extend_from_slice(args);
        let keys: Vec<String> = (0..1500).map(|i| format!("/thumb/img-{i}.jpg")).collect();
        all.extend(keys.iter().map(String::as_str));
        stdout(&keyroute(&all)).lines().map(str::to_owned).collect()
    };
    let (a, b) = (place(&["--compat", "nginx"]), place(&["-s", "rendezvous"]));
    let differ: Vec<usize> = (0..1500).filter(|&i| a[i] != b[i]).collect();
    assert_eq!(v["moved"].as_u64(), Some(differ.len() as u64));
    let requests: u64 = differ.iter().map(|&i| 1 + (i as u64 % 3)).sum();
    assert_eq!(v["traffic"]["moved"].as_u64(), Some(requests));
    let sum = |side: &str, field: &str| -> u64 {
        v[side].as_array().expect("nodes").iter().map(|c| c[field].as_u64().expect("count")).sum()
    };
    assert_eq!(sum("before", "moved"), differ.len() as u64);
    assert_eq!(sum("after", "moved"), differ.len() as u64);
    assert_eq!(sum("before", "moved_requests"), requests);
    // The same mode on both sides moves nothing.
    let o = keyroute(&["sim", "remap", "--from", "haproxy", "--to", "haproxy", "--before", "a,b,c", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["moved"], 0);
    std::fs::remove_dir_all(&dir).ok();
}

/// A request log the tests write: `n` requests over `seconds`, keys skewed towards the first
/// (a key's rank is the smaller of two uniform draws), optionally with a service time.
fn write_trace(path: &std::path::Path, n: u64, seconds: f64, service: bool) -> Vec<String> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut lines = Vec::new();
    for i in 0..n {
        let rank = (next() % 3000).min(next() % 3000);
        let t = 1_733_000_000.0 + seconds * i as f64 / n as f64;
        let key = format!("/thumb/img-{rank}.jpg?w=160");
        lines.push(if service { format!("{t:.3} {key} {}", 20 + next() % 200) } else { format!("{t:.3} {key}") });
    }
    std::fs::write(path, lines.join("\n") + "\n").expect("write trace");
    lines
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("keyroute-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[test]
fn fleet_replays_a_trace_plain_or_gzip_with_changes_at_trace_times() {
    use std::io::Write as _;
    let dir = temp("trace");
    let plain = dir.join("requests.log");
    let lines = write_trace(&plain, 20_000, 40.0, false);
    let gz = dir.join("requests.log.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&std::fs::read(&plain).expect("read")).expect("gzip");
    std::fs::write(&gz, enc.finish().expect("gzip")).expect("write");
    let run = |trace: &std::path::Path, extra: &[&str]| -> serde_json::Value {
        let mut args =
            vec!["sim", "fleet", "--trace", trace.to_str().expect("utf8"), "--strategies", "rendezvous,ring", "--json"];
        args.extend_from_slice(extra);
        let o = keyroute(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let a = run(&plain, &["--change", "20s:add"]);
    assert_eq!(a, run(&gz, &["--change", "20s:add"]), "gzip or not, the same log");
    let r = &a[0][1][0];
    let distinct: std::collections::HashSet<&str> = lines.iter().map(|l| l.split(' ').nth(1).expect("key")).collect();
    assert_eq!(r["config"]["keys"].as_u64(), Some(distinct.len() as u64));
    assert_eq!(r["completed"].as_u64(), Some(20_000));
    // The change at 20 s of the trace.
    let at = r["remaps"][0]["at_s"].as_f64().expect("a remap");
    assert!((19.9..20.1).contains(&at), "{at}");
    // Service times from the log: a miss takes 20..220 ms instead of the model's 100 ms.
    let timed = dir.join("timed.log");
    write_trace(&timed, 5_000, 20.0, true);
    let t = run(&timed, &[]);
    let p999 = t[0][1][0]["latency"]["p999_ms"].as_f64().expect("p99.9");
    assert!(p999 > 150.0, "{p999}");
    // Bad lines are named, and the keys/requests come from the log only.
    std::fs::write(dir.join("bad.log"), "1 a\nsoon b\n").expect("write");
    let o = keyroute(&["sim", "fleet", "--trace", dir.join("bad.log").to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.log:2:"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = keyroute(&["sim", "fleet", "--trace", plain.to_str().expect("utf8"), "--requests", "5"]);
    assert_eq!(o.status.code(), Some(64));
    let o = keyroute(&["sim", "fleet", "--change", "5s:add"]);
    assert_eq!(o.status.code(), Some(64), "seconds need a trace");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fleet_reads_combined_logs_and_member_files() {
    let dir = temp("combined");
    let log = dir.join("access.log");
    let mut text = String::new();
    for i in 0..3000 {
        let (m, s) = (i / 60, i % 60);
        text.push_str(&format!(
            "10.0.0.{} - - [01/Dec/2026:10:{m:02}:{s:02} +0000] \"GET /thumb/img-{}.jpg?w=160&x={i} HTTP/1.1\" 200 512 \"-\" \"curl/8\"\n",
            i % 7,
            i % 50
        ));
    }
    std::fs::write(&log, text).expect("write");
    let members = dir.join("members.txt");
    std::fs::write(&members, "# the fleet\ncache-a:weight=3\ncache-b\ncache-c\n").expect("write");
    let o = keyroute(&[
        "sim",
        "fleet",
        "--trace",
        log.to_str().expect("utf8"),
        "--trace-format",
        "combined",
        "--key-template",
        "{path}?w={query.w}",
        "--workers-from",
        members.to_str().expect("utf8"),
        "--strategies",
        "rendezvous",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let r = &v[0][1][0];
    assert_eq!(r["config"]["keys"], 50, "the template drops the x parameter");
    assert_eq!(r["completed"], 3000);
    let names: Vec<&str> =
        r["workers"].as_array().expect("workers").iter().map(|w| w["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["cache-a", "cache-b", "cache-c"]);
    let o = keyroute(&[
        "sim",
        "fleet",
        "--trace",
        log.to_str().expect("utf8"),
        "--trace-format",
        "combined",
        "--key-template",
        "{host}",
    ]);
    assert_eq!(o.status.code(), Some(64));
    std::fs::remove_dir_all(&dir).ok();
}

/// `sim whatif`: the keys and requests a change moves over the trace are what `sim remap` counts
/// on the same keys and traffic; the fleet runs differ only by the change.
#[test]
fn whatif_answers_before_a_change() {
    let dir = temp("whatif");
    let trace = dir.join("requests.log");
    let lines = write_trace(&trace, 20_000, 60.0, false);
    let members = dir.join("members.txt");
    std::fs::write(&members, "w1\nw2\nw3\nw4:weight=2\n").expect("write");
    let whatif = |change: &[&str]| {
        let mut args = vec!["sim", "whatif", "--trace", trace.to_str().expect("utf8")];
        args.extend(["--members", members.to_str().expect("utf8")]);
        args.extend_from_slice(change);
        keyroute(&args)
    };
    let o = whatif(&["--add", "w5", "--reweight", "w4=1", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    // The same question to sim remap, with the trace's keys as its traffic log.
    let traffic = dir.join("traffic.log");
    let keys: Vec<&str> = lines.iter().map(|l| l.split(' ').nth(1).expect("key")).collect();
    std::fs::write(&traffic, keys.join("\n") + "\n").expect("write");
    let o = keyroute(&[
        "sim",
        "remap",
        "-s",
        "rendezvous",
        "--before",
        "w1,w2,w3,w4:weight=2",
        "--after",
        "w1,w2,w3,w4,w5",
        "--traffic",
        traffic.to_str().expect("utf8"),
        "--json",
    ]);
    let remap: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["placement"]["moved"], remap["moved"]);
    assert_eq!(v["placement"]["traffic"]["moved"], remap["traffic"]["moved"]);
    assert!(remap["moved"].as_u64().expect("n") > 0);
    let (without, with) = (&v["without"], &v["with"]);
    assert_eq!(without["remaps"][0]["change"], "no change");
    assert_eq!(with["remaps"][0]["change"], "+w5 w4=1");
    assert_eq!(without["remaps"][0]["keys_moved"], 0);
    for r in [without, with] {
        assert_eq!(r["completed"], 20_000);
    }
    assert_eq!(with["workers"].as_array().expect("workers").len(), 5);
    // Text output names the rows.
    let o = whatif(&["--remove", "w2", "--strategy", "ring"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    for needle in ["what if: -w2 strategy=ring (rendezvous -> ring)", "hit rate, 60 s after the change", "peak load"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // A switch to a strategy that hashes keys its own way (slots: CRC16 keyslots): the fleet's
    // count of moved keys is the placement's.
    let o = whatif(&["--strategy", "slots", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["with"]["remaps"][0]["keys_moved"], v["placement"]["moved"]);
    assert!(v["placement"]["moved"].as_u64().expect("n") > 1000, "a switch of strategy moves most keys");
    for bad in [
        &["--remove", "w9"][..],
        &["--reweight", "w1"],
        &[],
        &["--add", "w5", "--at", "1"],
        &["--add", "w5", "--at", "600s"],
    ] {
        assert_eq!(whatif(bad).status.code(), Some(64), "{bad:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `from-nutcracker`: a nutcracker YAML becomes a configuration `serve --check` accepts; what
/// cannot be converted exits 64 naming the file, line and field.
#[test]
fn from_nutcracker_converts_or_says_why_not() {
    let dir = temp("nutcracker");
    let yml = dir.join("nutcracker.yml");
    std::fs::write(
        &yml,
        "alpha:\n  listen: 127.0.0.1:22121\n  hash: md5\n  distribution: ketama\n  hash_tag: \"{}\"\n  auto_eject_hosts: true\n  servers:\n   - 127.0.0.1:11211:1\n   - 127.0.0.1:11212:2 cache-b\n",
    )
    .expect("write");
    let o = keyroute(&["from-nutcracker", yml.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let toml = dir.join("keyroute.toml");
    std::fs::write(&toml, &o.stdout).expect("write");
    let check = keyroute(&["serve", "--check", "--config", toml.to_str().expect("utf8")]);
    assert!(
        check.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&check.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    std::fs::write(&yml, "alpha:\n  listen: 127.0.0.1:22121\n  hash: murmur\n  servers:\n   - 127.0.0.1:11211:1\n")
        .expect("write");
    let o = keyroute(&["from-nutcracker", yml.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(64));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nutcracker.yml:3: alpha.hash:"), "{err}");
}
