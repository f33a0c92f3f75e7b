//! Slow and silent clients, the connection cap, the admin listener, the clock scale and
//! configuration numbers (issue 13, defects 2, 3, 7 and 11). Raw sockets on 127.0.0.1; every
//! wait is bounded.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use proptest::prelude::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECS_10: Duration = Duration::from_secs(10);

/// One worker the tests below never reach (they are about the gateway's own listener).
fn idle_worker() -> Vec<String> {
    vec![worker("idle", "http://127.0.0.1:9", "m", &[], 4096)]
}

/// Connect to the gateway (bounded).
async fn connect(addr: std::net::SocketAddr) -> TcpStream {
    tokio::time::timeout(SECS_10, TcpStream::connect(addr))
        .await
        .expect("connect within 10 s")
        .expect("connected")
}

/// Everything the peer sends until it closes (or resets) the connection, if it does so
/// within `limit`; `None` if it is still open then.
async fn read_until_closed(tcp: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Regression (defect 3): a client sending one header line every 300 ms kept its connection
/// forever, and so did a client that sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_silent_connections_are_closed_after_the_header_timeout() {
    let gw = start(&config(
        "seed-v1",
        "server: {header_read_timeout_s: 1}",
        &idle_worker(),
    ))
    .await;
    let addr = gw.local_addr();
    let started = Instant::now();
    let mut silent = connect(addr).await;
    let mut slow = connect(addr).await;
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // One more header line every 300 ms, for at most 6 s: the gateway must cut it first.
    let mut cut = false;
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let line = format!("x-slow-{i}: {i}\r\n");
        if slow.write_all(line.as_bytes()).await.is_err() {
            cut = true;
            break;
        }
        // A closed connection shows as a read of 0 (or a reset) before a write fails.
        let mut probe = [0u8; 64];
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await
            && !matches!(r, Ok(n) if n > 0)
        {
            cut = true;
            break;
        }
    }
    let elapsed = started.elapsed();
    assert!(cut, "the slowloris connection was still open after 6 s");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(4000),
        "cut after {elapsed:?}; the header timeout is 1 s"
    );
    // The silent one went the same way.
    let closed = read_until_closed(&mut silent, Duration::from_secs(2)).await;
    assert!(closed.is_some(), "the silent connection is still open");
    // Honest clients are served as before.
    let a = send(
        &client(),
        Method::GET,
        &format!("http://{addr}/health"),
        None,
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
}

/// Regression (defect 3): a request body trickling in was waited for without limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_answered_408_and_the_connection_closed() {
    let gw = start(&config(
        "seed-v1",
        "server: {body_read_timeout_s: 1}",
        &idle_worker(),
    ))
    .await;
    let mut tcp = connect(gw.local_addr()).await;
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    let started = Instant::now();
    // Trickle a byte every 300 ms in the background; the answer must come first.
    let (mut reader, mut writer) = tcp.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(Duration::from_secs(4), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    })
    .await
    .expect("answered and closed within the body timeout + 3 s");
    trickle.abort();
    let elapsed = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
}

/// Regression (defect 3): there was no connection cap; 600 silent connections exhausted the
/// descriptors. Beyond `max_connections` a connection gets a clear 503 and is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_connections_a_connection_gets_503_and_then_service_resumes() {
    let gw = start(&config(
        "seed-v1",
        "server: {max_connections: 4, header_read_timeout_s: 30}",
        &idle_worker(),
    ))
    .await;
    let addr = gw.local_addr();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(addr).await);
    }
    wait_for("four open connections", SECS_10, async || {
        gw.connections()
            .open
            .load(std::sync::atomic::Ordering::Relaxed)
            == 4
    })
    .await;
    let mut fifth = connect(addr).await;
    let _ = fifth
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = read_until_closed(&mut fifth, Duration::from_secs(5))
        .await
        .expect("the fifth connection is answered and closed");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
    assert_eq!(v["error"]["type"], "service_unavailable_error", "{v}");
    assert_eq!(
        gw.connections()
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    drop(held);
    wait_for("the held connections to close", SECS_10, async || {
        gw.connections()
            .open
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    })
    .await;
    let c = client();
    let a = send(&c, Method::GET, &format!("http://{addr}/health"), None, "").await;
    assert_eq!(a.status, StatusCode::OK);
    let m = send(&c, Method::GET, &format!("http://{addr}/metrics"), None, "").await;
    assert!(
        m.text()
            .contains("routelab_gateway_client_connections_rejected_total 1"),
        "{}",
        m.text()
    );
}

/// Defect 7: with `admin_listen`, `/admin` (the API and the page) is served there only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_admin_and_the_public_one_does_not() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "admin_listen: 127.0.0.1:0",
        &[worker("a", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway {
        gw,
        base: public,
        c,
        ..
    } = gateway;
    let admin = format!("http://{}", gw.admin_addr().expect("an admin listener"));
    assert_ne!(public, admin);
    for path in [
        "/admin/workers",
        "/admin",
        "/admin/",
        "/admin/workers/a/drain",
    ] {
        for method in [Method::GET, Method::POST] {
            let a = send(&c, method, &format!("{public}{path}"), Some(TOKEN), "").await;
            let e = assert_openai_error(&a, 404);
            assert_eq!(e["code"], "unknown_url", "{path}: {e}");
        }
    }
    // The admin API works on its listener, with the token as before.
    assert_eq!(admin_worker(&c, &admin, "a").await["name"], "a");
    let a = send(&c, Method::GET, &format!("{admin}/admin/workers"), None, "").await;
    assert_openai_error(&a, 401);
    // The admin listener serves nothing else; the public one serves the rest.
    let a = send(&c, Method::GET, &format!("{admin}/v1/models"), None, "").await;
    assert_openai_error(&a, 404);
    let a = send(&c, Method::GET, &format!("{public}/v1/models"), None, "").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    gw.shutdown().await;
}

fn scaled_probe_config(url: &str, scale: f64, poll_s: f64) -> String {
    config(
        "{preset: seed-v3, weights: {kind: probe, concurrency: 2, output_tokens: 32, warmup: false, cache_ttl_s: 60, reprobe_period_s: 60}}",
        &format!("clock_scale: {scale}\nprobe: {{poll_interval_s: {poll_s}}}"),
        &[worker("w", url, "m", &[], 32768)],
    )
}

/// Defect 11: at `clock_scale: 100` a 60 s re-probe period of policy time passes in 0.6 s of
/// wall time, and the probe's throughput is in policy time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_scale_runs_policy_timers_faster_and_measures_in_policy_time() {
    let fast = FakeWorker::start(1000.0).await;
    // The poll period is policy time too: 1 s of it is 10 ms of wall time.
    let gw = start(&scaled_probe_config(&fast.url, 100.0, 1.0)).await;
    wait_for("a re-probe at clock_scale 100", SECS_10, async || {
        fast.probe_requests() >= 4
    })
    .await;
    let c = client();
    let base = format!("http://{}", gw.local_addr());
    let w = admin_worker(&c, &base, "w").await;
    // 2 × 32 tokens in at least 32 ms of wall time: at most 2,000 tok/s of wall time, at most
    // 20 of policy time.
    let tok_s = w["last_probe_tok_s"].as_f64().expect("measured");
    assert!(
        tok_s > 0.5 && tok_s <= 20.5,
        "tok/s in policy time: {tok_s}"
    );
    gw.shutdown().await;

    // At scale 1 the same policy probes once, and measures wall-time throughput.
    let plain = FakeWorker::start(1000.0).await;
    let Gateway { gw, base, .. } =
        Gateway::start(&scaled_probe_config(&plain.url, 1.0, 0.01)).await;
    wait_for("the first probe at clock_scale 1", SECS_10, async || {
        admin_worker(&c, &base, "w").await["provenance"] == "measured"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        plain.probe_requests(),
        2,
        "no re-probe within 1.5 s at scale 1"
    );
    let tok_s = admin_worker(&c, &base, "w").await["last_probe_tok_s"]
        .as_f64()
        .unwrap();
    assert!(tok_s > 100.0, "tok/s in wall time: {tok_s}");
    gw.shutdown().await;
}

/// Defect 2: `--check` refuses numbers that would break the gateway, with exit 2 and the field.
#[test]
fn check_exits_2_on_numbers_that_would_break_the_gateway() {
    for (yaml, field) in [
        ("queue_timeout_s: 1e20\n", "queue_timeout_s"),
        ("probe: {poll_interval_s: 1e-12}\n", "probe.poll_interval_s"),
        (
            "upstream: {response_timeout_s: .nan}\n",
            "upstream.response_timeout_s",
        ),
        ("clock_scale: -1\n", "clock_scale"),
        ("server: {max_connections: 0}\n", "server.max_connections"),
        ("retries: 1e300\n", "retries"),
        ("max_body_bytes: -4\n", "max_body_bytes"),
        // These passed `--check` before, then spun a timer, failed every request, or made
        // the probe runner spawn 4e9 tasks.
        ("health: {interval_s: 1e-9}\n", "health.interval_s"),
        (
            "upstream: {connect_timeout_s: 0}\n",
            "upstream.connect_timeout_s",
        ),
        (
            "policy: {preset: seed-v3, weights: {kind: probe, concurrency: 4000000000}}\n",
            "policy.weights.concurrency",
        ),
    ] {
        let (code, _, stderr) = check_config(&format!("admin_token: {TOKEN}\n{yaml}"));
        assert_eq!(code, Some(2), "{yaml}: {stderr}");
        assert!(stderr.contains(field), "{yaml}: {stderr}");
        assert!(!stderr.contains("panicked"), "{yaml}: {stderr}");
        assert!(!stderr.contains(TOKEN), "the token was printed: {stderr}");
    }
}

/// A YAML number: special floats, arbitrary floats and integers, and the bounds of the rules.
fn yaml_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".nan".to_string()),
        Just(".inf".to_string()),
        Just("-.inf".to_string()),
        Just("1e300".to_string()),
        Just("1e-300".to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("1e-6".to_string()),
        Just("1e9".to_string()),
        Just("1000".to_string()),
        Just("0.001".to_string()),
        Just("4294967295".to_string()),
        Just("18446744073709551615".to_string()),
        Just("99999999999999999999999".to_string()),
        any::<f64>().prop_map(|x| {
            if x.is_nan() {
                ".nan".into()
            } else if x.is_infinite() {
                if x > 0.0 {
                    ".inf".into()
                } else {
                    "-.inf".into()
                }
            } else {
                format!("{x:e}")
            }
        }),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u32..2000).prop_map(|n| n.to_string()),
        (0.0f64..100.0).prop_map(|x| format!("{x}")),
    ]
}

/// Every numeric field of the configuration, as a path into the YAML below.
const NUMERIC_FIELDS: [&str; 24] = [
    "seed",
    "max_body_bytes",
    "queue_timeout_s",
    "retries",
    "clock_scale",
    "upstream.connect_timeout_s",
    "upstream.response_timeout_s",
    "upstream.max_idle_per_worker",
    "health.interval_s",
    "health.timeout_s",
    "health.unhealthy_after",
    "health.healthy_after",
    "probe.poll_interval_s",
    "probe.request_timeout_s",
    "server.header_read_timeout_s",
    "server.body_read_timeout_s",
    "server.max_connections",
    "workers.context_window",
    "policy.weights.concurrency",
    "policy.weights.output_tokens",
    "policy.weights.prompt_tokens",
    "policy.weights.cache_ttl_s",
    "policy.weights.reprobe_period_s",
    "policy.cap.limit",
];

/// A configuration with `values` (field index → number) and defaults elsewhere.
fn config_with(values: &[(usize, String)]) -> String {
    let get = |name: &str, default: &str| {
        let i = NUMERIC_FIELDS.iter().position(|f| *f == name).unwrap();
        values
            .iter()
            .rev()
            .find(|(j, _)| *j == i)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| default.to_string())
    };
    let mut yaml = String::from("listen: 127.0.0.1:0\nadmin_token: prop-admin-token\n");
    for top in [
        "seed",
        "max_body_bytes",
        "queue_timeout_s",
        "retries",
        "clock_scale",
    ] {
        let default = match top {
            "clock_scale" => "1",
            "max_body_bytes" => "4096",
            _ => "1",
        };
        yaml.push_str(&format!("{top}: {}\n", get(top, default)));
    }
    for (section, fields) in [
        (
            "upstream",
            &[
                "connect_timeout_s",
                "response_timeout_s",
                "max_idle_per_worker",
            ][..],
        ),
        (
            "health",
            &[
                "interval_s",
                "timeout_s",
                "unhealthy_after",
                "healthy_after",
            ][..],
        ),
        ("probe", &["poll_interval_s", "request_timeout_s"][..]),
        (
            "server",
            &[
                "header_read_timeout_s",
                "body_read_timeout_s",
                "max_connections",
            ][..],
        ),
    ] {
        yaml.push_str(&format!("{section}:\n"));
        for f in fields {
            yaml.push_str(&format!("  {f}: {}\n", get(&format!("{section}.{f}"), "1")));
        }
    }
    yaml.push_str(&format!(
        "policy:\n  preset: seed-v3\n  weights: {{kind: probe, concurrency: {}, output_tokens: {}, prompt_tokens: {}, cache_ttl_s: {}, reprobe_period_s: {}}}\n  cap: {{kind: weighted, limit: {}}}\n",
        get("policy.weights.concurrency", "2"),
        get("policy.weights.output_tokens", "8"),
        get("policy.weights.prompt_tokens", "16"),
        get("policy.weights.cache_ttl_s", "60"),
        get("policy.weights.reprobe_period_s", "60"),
        get("policy.cap.limit", "8"),
    ));
    // A worker that refuses connections: the gateway starts, probes fail, nothing hangs.
    yaml.push_str(&format!(
        "workers:\n  - {{name: w, base_url: 'http://127.0.0.1:9', model: m, context_window: {}}}\n",
        get("workers.context_window", "4096")
    ));
    yaml
}

/// Threads of the property test's runtime are named this, so that their panics are counted.
const PROP_THREADS: &str = "prop-gateway";

/// Panics on [`PROP_THREADS`]: a background task (the probe loop, the health loop, a
/// connection) that panics does not fail the test by itself.
static PROP_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(PROP_THREADS) {
                PROP_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            previous(info);
        }));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(PROP_THREADS)
            .enable_all()
            .build()
            .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Defect 2: no number in the configuration panics, at load or at start; when the loader
    /// accepts a configuration, the gateway starts on it and shuts down.
    #[test]
    fn config_numbers_never_panic(
        values in proptest::collection::vec((0..NUMERIC_FIELDS.len(), yaml_number()), 1..4)
    ) {
        let yaml = config_with(&values);
        let loaded = std::panic::catch_unwind(|| {
            routelab_gateway::GatewayConfig::from_yaml(&yaml, "prop.yaml")
        });
        let Ok(loaded) = loaded else {
            panic!("from_yaml panicked on\n{yaml}");
        };
        match loaded {
            Err(e) => {
                prop_assert_eq!(e.file.as_str(), "prop.yaml");
                prop_assert!(!e.field.is_empty(), "unlocated: {e}");
                prop_assert!(!format!("{e:?}").contains("prop-admin-token"), "{e}");
            }
            Ok(cfg) => {
                let started = runtime().block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let gw = routelab_gateway::start_on(cfg, listener).await;
                    match gw {
                        Ok(gw) => {
                            // Let the background tasks run a little.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            tokio::time::timeout(SECS_10, gw.shutdown())
                                .await
                                .expect("shut down within 10 s");
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                });
                prop_assert!(started.is_ok(), "{yaml}\nvalid, yet did not start: {started:?}");
                prop_assert_eq!(
                    PROP_PANICS.load(std::sync::atomic::Ordering::SeqCst),
                    0,
                    "a gateway task panicked on\n{}",
                    yaml
                );
            }
        }
    }
}

/// A worker's `base_url`: well-formed ones with every port (0, 99,999 and beyond included),
/// user information, fragments, queries, odd paths, IPv6 literals, URLs near and past the
/// URL parser's 64 KiB, and arbitrary text.
fn yaml_url() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        Just("127.0.0.1".to_string()),
        Just("[::1]".to_string()),
        Just("user:pw@h".to_string()),
        Just("".to_string()),
        "[a-z0-9.-]{1,12}",
    ];
    let port = prop_oneof![
        Just(String::new()),
        Just(":".to_string()),
        (0u32..200_000).prop_map(|p| format!(":{p}")),
        "[:a-z0-9]{0,6}",
    ];
    let tail = prop_oneof![
        Just(String::new()),
        Just("/".to_string()),
        Just("/engine".to_string()),
        Just("/#frag".to_string()),
        Just("?q=1".to_string()),
        Just("/a b".to_string()),
        (60_000usize..65_600).prop_map(|n| format!("/{}", "a".repeat(n))),
        "\\PC{0,12}",
    ];
    prop_oneof![
        4 => (host, port, tail).prop_map(|(h, p, t)| format!("http://{h}{p}{t}")),
        1 => "\\PC{0,30}",
        1 => Just("https://h".to_string()),
    ]
}

/// A `health.path`: usual ones, ones with spaces, fragments, control characters, no leading
/// slash, very long, arbitrary text.
fn yaml_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/health".to_string()),
        Just("/a b".to_string()),
        Just("/a#b".to_string()),
        Just("/a%20b?x=1".to_string()),
        Just("health".to_string()),
        Just("/\u{7f}".to_string()),
        (1000usize..70_000).prop_map(|n| format!("/{}", "p".repeat(n))),
        "/\\PC{0,20}",
        ".{0,20}",
    ]
}

/// A worker name: plain, with control or bidirectional-formatting characters, very long,
/// arbitrary text.
fn yaml_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("w".to_string()),
        Just("a\nevent=forged".to_string()),
        Just("evil\u{202e}gnp".to_string()),
        Just("x\u{2066}y".to_string()),
        Just("tab\tname".to_string()),
        (200usize..400).prop_map(|n| "n".repeat(n)),
        ".{1,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Hardening round three, 1 and 10: no URL, health path or worker name in the file panics
    /// at load or at start, each is accepted or a located error, the admin API (JSON) takes a
    /// worker exactly when the file does, and every accepted worker's URL joins every path the
    /// gateway appends to it (a join that failed panicked the health and probe loops).
    #[test]
    fn config_urls_paths_and_names_never_panic(
        url in yaml_url(),
        path in yaml_path(),
        name in yaml_name(),
    ) {
        let quoted = |s: &str| serde_json::to_string(s).unwrap();
        let yaml = format!(
            "listen: 127.0.0.1:0\nadmin_token: prop-admin-token\nhealth: {{interval_s: 0.001, path: {}}}\nprobe: {{poll_interval_s: 0.001}}\nworkers:\n  - {{name: {}, base_url: {}, model: m, context_window: 4096}}\n",
            quoted(&path),
            quoted(&name),
            quoted(&url),
        );
        let Ok(loaded) = std::panic::catch_unwind(|| {
            routelab_gateway::GatewayConfig::from_yaml(&yaml, "prop.yaml")
        }) else {
            panic!("from_yaml panicked on\n{yaml}");
        };
        let api = serde_json::from_value::<routelab_gateway::WorkerConfig>(serde_json::json!({
            "name": name, "base_url": url, "model": "m", "context_window": 4096,
        }))
        .and_then(|w| w.validate().map_err(serde::de::Error::custom));
        match loaded {
            Err(e) => {
                prop_assert_eq!(e.file.as_str(), "prop.yaml");
                prop_assert!(!e.field.is_empty(), "unlocated: {e}");
                if e.field.starts_with("workers[0]") {
                    prop_assert!(api.is_err(), "the API took what the file refused: {e}");
                }
            }
            Ok(cfg) => {
                prop_assert!(api.is_ok(), "the API refused what the file took: {api:?}");
                let base = routelab_gateway::upstream::BaseUrl::parse(&cfg.workers[0].base_url)
                    .expect("accepted");
                for p in [cfg.health.path.as_str(), "/v1/chat/completions", "/v1/completions"] {
                    prop_assert!(base.join(p).is_ok(), "{url} + {p}");
                }
                let started = runtime().block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let gw = routelab_gateway::start_on(cfg, listener)
                        .await
                        .map_err(|e| e.to_string())?;
                    // A few health and probe rounds.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    tokio::time::timeout(SECS_10, gw.shutdown())
                        .await
                        .map_err(|_| "shutdown took over 10 s".to_string())
                });
                prop_assert!(started.is_ok(), "{yaml}\nvalid, yet: {started:?}");
                prop_assert_eq!(
                    PROP_PANICS.load(std::sync::atomic::Ordering::SeqCst),
                    0,
                    "a gateway task panicked on\n{}",
                    yaml
                );
            }
        }
    }
}

/// The accept loop keeps `axum::serve`'s graceful shutdown: a request in flight finishes, new
/// connections are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_request_in_flight_finish_and_stops_accepting() {
    let w = FakeWorker::start(0.0).await;
    w.state
        .hold
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let gw = start(&config(
        "seed-v1",
        "",
        &[worker("a", &w.url, "m", &[], 4096)],
    ))
    .await;
    let addr = gw.local_addr();
    let url = format!("http://{addr}/v1/chat/completions");
    let in_flight = tokio::spawn(async move {
        send(
            &client(),
            Method::POST,
            &url,
            None,
            chat_body("m", "hi", 4, true),
        )
        .await
    });
    wait_for("the request at the worker", SECS_10, async || {
        w.requests() == 1
    })
    .await;
    let stopping = tokio::spawn(gw.shutdown());
    // The listener closes; the request is still held at the worker.
    wait_for("the listener to close", SECS_10, async || {
        // Bounded: a connection left in a backlog would wait for the kernel's retries.
        matches!(
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await,
            Ok(Err(_))
        )
    })
    .await;
    assert!(
        !stopping.is_finished(),
        "shut down with a request in flight"
    );
    w.state.release();
    let a = in_flight.await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text().contains("[DONE]"), "{}", a.text());
    tokio::time::timeout(SECS_10, stopping)
        .await
        .expect("shut down within 10 s once the request finished")
        .unwrap();
}

/// Regression (defect 3): with `ulimit -n 512` the default cap (4,096) was never reached, so
/// 600 silent connections exhausted the descriptors instead of being answered 503. The default
/// now comes from the process's open-file limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_connection_cap_fits_the_open_file_limit() {
    let dir = temp_dir("ulimit");
    let file = dir.join("gateway.yaml");
    std::fs::write(&file, "listen: 127.0.0.1:0\nhealth: {interval_s: 0}\n").unwrap();
    let log_path = dir.join("stderr.log");
    let script = format!(
        "ulimit -n 512 && exec '{}' --config '{}'",
        env!("CARGO_BIN_EXE_routelab-gateway"),
        file.display()
    );
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("sh starts the gateway");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_for("the gateway to start", SECS_10, async || {
        log().contains("event=started")
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let started = log();
    assert!(
        started.contains("max_connections=224"),
        "(512 - 64) / 2 = 224 expected: {started}"
    );
}
