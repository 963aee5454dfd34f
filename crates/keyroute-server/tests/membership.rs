//! Membership changes: the admin API, reloads, and what a change may never do (stall requests,
//! build an unbounded table, accept a worker the configuration would refuse).

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use http::StatusCode;
use keyroute_server::Config;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_under_load_lose_no_request() {
    let bs = backends(5).await;
    for b in &bs {
        b.delay_ms.store(1, SeqCst);
    }
    let refs: Vec<&Backend> = bs[..4].iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"ring\"", "")).await;
    let mut set = load(&gw, 6, 150).await;
    eventually(Duration::from_secs(10), "load is flowing", || async {
        bs[..4].iter().map(|b| b.served.load(SeqCst)).sum::<u64>() > 50
    })
    .await;
    let (s, v) =
        admin(&gw, "POST", "/workers", &format!("{{\"name\":\"w5\",\"address\":\"{}\"}}", bs[4].addr), None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = admin(&gw, "DELETE", "/workers/w2?drain=true", "", None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = admin(&gw, "PATCH", "/workers/w3", "{\"weight\": 3}", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    while let Some(r) = set.join_next().await {
        assert!(r.expect("task").iter().all(|s| *s == StatusCode::OK));
    }
    assert!(bs[4].served.load(SeqCst) > 0, "the new worker took traffic");
    // The drained worker is gone once its requests finished.
    eventually(Duration::from_secs(5), "the drained worker is removed", || async {
        worker_info(&gw, "w2").await.is_null()
    })
    .await;
    let (_, v) = admin(&gw, "GET", "/workers", "", None).await;
    let names: Vec<&str> =
        v["pools"][0]["workers"].as_array().expect("workers").iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(names, ["w1", "w3", "w4", "w5"]);
    assert_eq!(worker_info(&gw, "w3").await["weight"], 3);
    let (_, metrics) = admin(&gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or("");
    assert!(text.contains("keyroute_pool_membership_changes_total{pool=\"p\"} 3"), "{text}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reload_keeps_serving_the_old_config_and_a_good_one_applies() {
    let bs = backends(2).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let dir = std::env::temp_dir().join(format!("keyroute-gw-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("gw.toml");
    let text = config_text(&refs, "strategy = \"rendezvous\"", "");
    std::fs::write(&path, &text).expect("write");
    let gw = start_gateway(&std::fs::read_to_string(&path).expect("read")).await;
    let c = client();
    let ks = keys(20);
    let before = owners(&c, &gw, &ks).await;
    std::fs::write(&path, text.replace("strategy = \"rendezvous\"", "strategy = \"nonsense\"")).expect("write");
    let err = gw.handle.reload_file(&path).expect_err("invalid");
    let msg = err.to_string();
    assert!(msg.contains("gw.toml:") && msg.contains("strategy") && msg.contains("unknown strategy"), "{msg}");
    assert_eq!(owners(&c, &gw, &ks).await, before, "the old configuration serves on");
    // A good reload applies: one worker only.
    let one = config_text(&refs[..1], "strategy = \"rendezvous\"", "");
    std::fs::write(&path, one).expect("write");
    gw.handle.reload_file_off_thread(&path).await.expect("valid reload");
    assert!(owners(&c, &gw, &ks).await.values().all(|w| w == "w1"));
    std::fs::remove_dir_all(&dir).ok();
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_admin_token_is_refused() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let text = config_text(&refs, "", "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"a-brand-new-token-1\"",
    );
    let err = gw.handle.reload(Config::parse(&text, "t.toml").expect("valid")).expect_err("refused");
    assert!(matches!(err, keyroute_server::GatewayError::Reload(keyroute_server::ReloadError::Admin)), "{err}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_auth_is_enforced_and_failed_attempts_are_throttled() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "", "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret-s3cret-s3cret\"",
    );
    let gw = start_gateway(&text).await;
    let good = Some("s3cret-s3cret-s3cret");
    assert_eq!(admin(&gw, "GET", "/workers", "", good).await.0, StatusCode::OK);
    assert_eq!(admin(&gw, "GET", "/workers", "", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "GET", "/workers", "", Some("s3cret-s3cret-s3creT")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "DELETE", "/workers/w1", "", Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "GET", "/healthz", "", None).await.0, StatusCode::OK);
    // Ten wrong tokens from this address in a minute (a request without one guesses nothing and
    // is not counted): then 429 for wrong tokens; the right one still works (issue 19, defect
    // 14: an attacker's guesses must not lock the operator out), and one without credentials
    // still gets its 401 challenge (issue 31, defect 15: else no browser login can start).
    for _ in 0..8 {
        assert_eq!(admin(&gw, "GET", "/workers", "", Some("guess")).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(admin(&gw, "GET", "/workers", "", Some("guess")).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(admin(&gw, "GET", "/workers", "", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "GET", "/workers", "", good).await.0, StatusCode::OK);
    assert_eq!(admin(&gw, "GET", "/healthz", "", None).await.0, StatusCode::OK, "probes are not throttled");
    gw.task.abort();
}

/// Issue 8, defect 9: the admin API accepted what a configuration file refuses, and the reverse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_validates_workers_as_a_config_file_does() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let long = "n".repeat(60_000);
    for (body, why) in [
        (r#"{"name":"a\nb","address":"127.0.0.1:9"}"#.to_owned(), "a newline in a name"),
        (format!(r#"{{"name":"{long}","address":"127.0.0.1:9"}}"#), "a 60,000-byte name"),
        (r#"{"name":"x","address":"0.0.0.0:9"}"#.to_owned(), "a wildcard address"),
        (r#"{"name":"x","address":"127.0.0.1:0"}"#.to_owned(), "port 0"),
        (r#"{"name":"x","address":"127.0.0.1:9","wieght":2}"#.to_owned(), "an unknown field"),
        (r#"{"name":"x","address":"127.0.0.1:9","weight":-1}"#.to_owned(), "a negative weight"),
        (format!(r#"{{"name":"x","address":"{}"}}"#, gw.addr), "the gateway's own listener"),
        (format!(r#"{{"name":"x","address":"{}"}}"#, gw.admin), "the gateway's admin listener"),
    ] {
        let (s, v) = admin(&gw, "POST", "/workers", &body, None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{why}: {v}");
    }
    // A host name, as a config file accepts it.
    let port = bs[0].addr.port();
    let (s, v) =
        admin(&gw, "POST", "/workers", &format!(r#"{{"name":"byname","address":"localhost:{port}"}}"#), None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = admin(&gw, "PATCH", "/workers/w1", r#"{"weight":2,"colour":"red"}"#, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // Wrong methods get 405 with Allow.
    let (s, _) = admin(&gw, "PUT", "/workers", "", None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = admin(&gw, "GET", "/workers/w1", "", None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = admin(&gw, "POST", "/metrics", "", None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(admin(&gw, "GET", "/nowhere", "", None).await.0, StatusCode::NOT_FOUND);
    gw.task.abort();
}

/// Issue 8, defect 6: `PATCH weight=200000` on a ring pool built 32M points on the request
/// runtime (1.66 GB, GETs stalled for seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_that_would_build_a_huge_table_is_refused_and_nothing_changes() {
    let bs = backends(2).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"ring\"", "")).await;
    let (s, v) = admin(&gw, "PATCH", "/workers/w1", r#"{"weight": 200000}"#, None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("32000160 points") && e.contains("lower vnodes")), "{v}");
    assert_eq!(worker_info(&gw, "w1").await["weight"], 1, "a refused change leaves the weight as it was");
    let (_, v) = admin(&gw, "GET", "/workers", "", None).await;
    assert_eq!(v["pools"][0]["generation"], 1);
    gw.task.abort();
}

/// A big table (3.2M points) builds on the blocking pool: on a one-thread runtime, a GET sent
/// after the PATCH still completes before the PATCH does.
#[tokio::test(flavor = "current_thread")]
async fn a_big_rebuild_never_stalls_requests() {
    let bs = backends(2).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"ring\"", "")).await;
    let patch = {
        let (admin_addr, addr) = (gw.admin, gw.addr);
        let _ = addr;
        tokio::spawn(async move {
            let c: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
            let req = http::Request::builder()
                .method("PATCH")
                .uri(format!("http://{admin_addr}/workers/w1"))
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(br#"{"weight": 20000}"#)))
                .expect("request");
            let resp = c.request(req).await.expect("admin");
            (resp.status(), tokio::time::Instant::now())
        })
    };
    // Until the PATCH is being built (its generation not yet visible), GETs keep completing.
    let c = client();
    let started = tokio::time::Instant::now();
    let mut served_during = 0;
    let mut slowest = Duration::ZERO;
    while !patch.is_finished() {
        let sent = tokio::time::Instant::now();
        let (s, _, _) = get(&c, &format!("http://{}/thumb?k={served_during}", gw.addr)).await;
        slowest = slowest.max(sent.elapsed());
        assert_eq!(s, StatusCode::OK);
        served_during += 1;
        tokio::task::yield_now().await;
    }
    let (status, done) = patch.await.expect("patch");
    assert_eq!(status, StatusCode::OK);
    let build = done - started;
    eprintln!("GETs served while a 3.2M-point ring was built ({build:?}): {served_during}, the slowest {slowest:?}");
    // Built inline, the one runtime thread would serve one GET (or none) before the PATCH's answer,
    // however long the build. Measured: 7,000 to 9,700 GETs over a 0.4 s build, the slowest well
    // under 1 ms (printed above; speed is the benchmarks' to measure, not a test's).
    assert!(served_during >= 10, "only {served_during} GETs were served during a {build:?} build");
    assert_eq!(worker_info(&gw, "w1").await["weight"], 20000);
    gw.task.abort();
}
