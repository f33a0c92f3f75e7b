//! Issue 30, hardening round three: each test is the regression test of one item a hostile
//! probe of the gateway found, and failed before its fix. Raw sockets and the real binary
//! where the item is about them; every wait is bounded.

use crate::fake::{FakeWorker, POISON, RawWorker, raw_response};
use crate::harness::*;
use hyper::{Method, StatusCode};
use routelab_gateway::GatewayConfig;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECS_10: Duration = Duration::from_secs(10);

/// The gateway binary, its stderr in a file and the address it listens on.
struct Binary {
    child: std::process::Child,
    log_path: PathBuf,
    base: String,
}

impl Binary {
    /// Start the binary on `yaml` (which listens on `127.0.0.1:0`), in `dir`.
    async fn start(yaml: &str, dir: &Path) -> Binary {
        let file = dir.join("gateway.yaml");
        std::fs::write(&file, yaml).unwrap();
        let log_path = dir.join("stderr.log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_routelab-gateway"))
            .arg("--config")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("the gateway binary starts");
        let mut b = Binary {
            child,
            log_path,
            base: String::new(),
        };
        wait_for("the gateway to start", SECS_10, async || {
            b.log().contains("event=started")
        })
        .await;
        let log = b.log();
        let listen = log
            .split_whitespace()
            .find_map(|w| w.strip_prefix("listen="))
            .expect("the started line names the address");
        b.base = format!("http://{listen}");
        b
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{name}");
    }

    /// The exit status, if it exits within `limit`.
    async fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn metrics(c: &HttpClient, base: &str) -> String {
    send(c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text()
}

/// The value of the series that starts with `series` (name and labels) in `/metrics`.
async fn metric(c: &HttpClient, base: &str, series: &str) -> Option<f64> {
    metrics(c, base).await.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// A streamed chat request on a client of its own: its status and whole body.
fn spawn_stream(chat: &str, tokens: u32) -> tokio::task::JoinHandle<Answer> {
    let chat = chat.to_string();
    tokio::spawn(async move {
        let body = chat_body("m", "stream", tokens, true);
        send(&client(), Method::POST, &chat, None, body).await
    })
}

/// A binary's configuration with one worker, listening on a free port.
fn binary_config(url: &str, extra: &str) -> String {
    config("seed-v1", extra, &[worker("w", url, "m", &[], 4096)])
}

// ---- 1. `BaseUrl::join` panics -------------------------------------------------------------

/// Regression (1): `health.path: "/a b"` was accepted, and the health loop panicked at its
/// first round, silently, leaving ejected workers out for ever. Now a located error.
#[test]
fn a_health_path_that_is_not_a_request_path_is_refused_at_load() {
    for path in ["\"/a b\"", "\"/a#b\"", "health"] {
        let e =
            GatewayConfig::from_yaml(&format!("health: {{path: {path}}}\n"), "g.yaml").unwrap_err();
        assert_eq!(e.field, "health.path", "{path}: {e}");
        assert!(e.valid.is_some(), "{e}");
    }
    let (code, _, stderr) = check_config("health: {path: \"/a b\"}\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("health.path"), "{stderr}");
}

/// Regression (1, 10): the admin API answered 201 to a ~65 KB base URL (the health, probe and
/// request paths then did not fit a URL, and `join` panicked in every loop), and accepted a
/// port 0 or 99999, user information, a fragment, and names with control or bidirectional
/// characters. Each is a 400 now, and nothing is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_workers_that_would_break_or_fool_the_gateway() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0.05}",
        &[worker("a", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    let long = format!("http://127.0.0.1:9/{}", "a".repeat(65_510));
    let cases = [
        ("long", long.as_str(), "bytes is too long"),
        ("zero", "http://127.0.0.1:0", "port"),
        ("huge", "http://127.0.0.1:99999", "port"),
        ("user", "http://user:pw@127.0.0.1:9", "user information"),
        ("frag", "http://127.0.0.1:9/#x", "fragment"),
        (
            "a\nworker_ejected",
            "http://127.0.0.1:9",
            "control character",
        ),
        ("evil\u{202e}gnp", "http://127.0.0.1:9", "bidirectional"),
    ];
    for (name, url, why) in cases {
        let body = json!({"name": name, "base_url": url, "model": "m", "context_window": 4096});
        let a = send(
            &c,
            Method::POST,
            &format!("{base}/admin/workers"),
            Some(TOKEN),
            body.to_string(),
        )
        .await;
        let e = assert_openai_error(&a, 400);
        assert!(
            e["message"].as_str().unwrap().contains(why),
            "{name:?}: {e}"
        );
    }
    let list = send(
        &c,
        Method::GET,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        "",
    )
    .await
    .json();
    assert_eq!(list["workers"].as_array().unwrap().len(), 1, "{list}");
    // Health rounds went on, no task panicked, and requests are served.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = metrics(&c, &base).await;
    assert!(
        m.contains("routelab_gateway_task_restarts_total{task=\"health\"} 0\n"),
        "{m}"
    );
    assert_eq!(
        post_chat(&c, &chat, "hi", 4, false).await.status,
        StatusCode::OK
    );
}

// ---- 2. one bad request ejects the fleet ---------------------------------------------------

/// Regression (2): three requests every worker answered 500 (retried across the fleet) ejected
/// all four workers, and the next good request got 503. A 5xx that every worker tried gives
/// is the request's, not the workers'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_requests_retried_across_the_fleet_eject_nobody() {
    let ws = fakes::<4>(0.0).await;
    let entries: Vec<String> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| worker(&format!("w{i}"), &w.url, "m", &[], 4096))
        .collect();
    let gateway = serve(
        "equal/round-robin/no-affinity/none",
        "retries: 3\nhealth: {interval_s: 30, unhealthy_after: 3}",
        &entries,
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    for i in 0..3 {
        let a = post_chat(&c, &chat, &format!("{POISON} {i}"), 4, false).await;
        assert!(a.status.is_server_error(), "{}", a.status);
    }
    assert_eq!(
        ws.iter().map(FakeWorker::requests).sum::<u64>(),
        12,
        "each tried all four"
    );
    for i in 0..4 {
        let w = admin_worker(&c, &base, &format!("w{i}")).await;
        assert_eq!(
            (w["ejected"].as_bool(), w["state"].as_str()),
            (Some(false), Some("up")),
            "{w}"
        );
    }
    let a = post_chat(&c, &chat, "a good request", 4, false).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
}

/// Hardening 2: failing requests eject at most `health.max_ejection_percent` of a model's
/// workers (10 %: one of four). Before, every dead worker a request met was ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_requests_eject_no_more_than_the_cap() {
    let good = FakeWorker::start(0.0).await;
    let mut entries = vec![worker("good", &good.url, "m", &[], 4096)];
    for i in 0..3 {
        entries.push(worker(
            &format!("dead{i}"),
            &refused_url().await,
            "m",
            &[],
            4096,
        ));
    }
    let gateway = serve(
        "equal/round-robin/no-affinity/none",
        "retries: 3\nhealth: {interval_s: 30}",
        &entries,
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    for i in 0..8 {
        let a = post_chat(&c, &chat, &format!("r{i}"), 4, false).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    }
    let mut ejected = 0;
    for i in 0..3 {
        let w = admin_worker(&c, &base, &format!("dead{i}")).await;
        assert!(
            w["errors_total"].as_u64().unwrap() >= 1,
            "every dead worker was met: {w}"
        );
        ejected += usize::from(w["ejected"] == true);
    }
    assert_eq!(ejected, 1, "one of four may be ejected by requests");
}

/// Hardening 2: when fewer than `health.panic_threshold_percent` of a model's workers are
/// healthy (here none: their health checks fail, as with a wrong health path), the model is in
/// panic mode and requests still reach the workers. Before, every request got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_too_few_healthy_workers_requests_go_to_all_in_panic_mode() {
    let ws = fakes::<2>(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0.05, unhealthy_after: 1}",
        &favoured_pair(("a", &ws[0].url), ("b", &ws[1].url)),
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    for w in &ws {
        w.state.healthy.store(false, SeqCst);
    }
    wait_for("both ejected", SECS_10, async || {
        admin_worker(&c, &base, "a").await["ejected"] == true
            && admin_worker(&c, &base, "b").await["ejected"] == true
    })
    .await;
    let a = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(
        metrics(&c, &base)
            .await
            .contains("routelab_model_panic_mode{model=\"m\"} 1\n")
    );
    for w in &ws {
        w.state.healthy.store(true, SeqCst);
    }
    wait_for("both re-admitted, out of panic mode", SECS_10, async || {
        metrics(&c, &base)
            .await
            .contains("routelab_model_panic_mode{model=\"m\"} 0\n")
            && admin_worker(&c, &base, "a").await["ejected"] == false
            && admin_worker(&c, &base, "b").await["ejected"] == false
    })
    .await;
}

// ---- 3. unbounded buffering ----------------------------------------------------------------

/// Regression (3): a worker's non-streamed body and a probe's reply were read whole whatever
/// their size (a 1.5 GiB body took the gateway to 1.58 GB). Past `upstream.max_response_bytes`
/// (32 MiB by default) the answer is a 502 and the probe fails; nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_body_past_the_bound_is_a_502_and_a_failed_probe() {
    let pad = "x".repeat(40 << 20);
    let huge = RawWorker::start(raw_response(
        "200 OK",
        "connection: close\r\n",
        &format!("{{\"id\":\"c\",\"pad\":\"{pad}\"}}"),
    ))
    .await;
    drop(pad);
    let gateway = serve(
        "{preset: seed-v3, weights: {kind: probe, concurrency: 1, output_tokens: 4, warmup: false}}",
        "probe: {poll_interval_s: 0.05}\nhealth: {interval_s: 0}",
        &[worker("huge", &huge.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    let failed = "routelab_worker_probes_total{worker=\"huge\",model=\"m\",result=\"failed\"}";
    wait_for("the probe to fail", SECS_10, async || {
        metric(&c, &base, failed).await >= Some(1.0)
    })
    .await;
    let a = post_chat(&c, &chat, "hi", 4, false).await;
    let e = assert_openai_error(&a, 502);
    assert_eq!(e["code"], "response_too_large", "{e}");
    let w = admin_worker(&c, &base, "huge").await;
    assert_eq!(w["in_flight"], 0, "{w}");
}

// ---- 4. a symlinked state file -------------------------------------------------------------

/// Regression (4): the atomic rename replaced a symlinked `state_file` by a regular file, so
/// the file the link pointed to kept the old pins (lost at the next start from it). Now the
/// write goes through the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_state_file_is_written_through_the_link() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("state-link");
    std::fs::create_dir(dir.join("real")).unwrap();
    let link = dir.join("state.json");
    std::os::unix::fs::symlink("real/state.json", &link).unwrap();
    let gateway = serve(
        "seed-v3",
        &format!("state_file: {}\nhealth: {{interval_s: 0}}", link.display()),
        &[worker("a", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { base, c, .. } = gateway;
    let a = send(
        &c,
        Method::POST,
        &format!("{base}/admin/workers/a/pin"),
        Some(TOKEN),
        r#"{"weight": 1.5}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_symlink(), "the link was replaced");
    let target: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("real/state.json")).unwrap())
            .unwrap();
    assert_eq!(target["pins"][0]["weight"], 1.5, "{target}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 6. SIGHUP, 7. drain -------------------------------------------------------------------

/// Regression (6): SIGHUP's default action killed the gateway mid-stream, without a log line.
/// It is logged and ignored: the stream completes and the gateway serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_is_logged_and_ignored_mid_stream() {
    let w = FakeWorker::start(20.0).await;
    w.state.natural_len.store(20, SeqCst);
    let dir = temp_dir("sighup");
    let b = Binary::start(&binary_config(&w.url, "health: {interval_s: 0}"), &dir).await;
    let stream = spawn_stream(&format!("{}/v1/chat/completions", b.base), 20);
    wait_for("the stream at the worker", SECS_10, async || {
        w.requests() == 1
    })
    .await;
    b.signal("HUP");
    let a = tokio::time::timeout(SECS_10, stream)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text().ends_with("data: [DONE]\n\n"), "{}", a.text());
    let mut b = b;
    assert!(b.exited_within(Duration::from_millis(100)).await.is_none());
    assert!(b.log().contains("event=sighup_ignored"), "{}", b.log());
    let a = post_chat(
        &client(),
        &format!("{}/v1/chat/completions", b.base),
        "hi",
        4,
        false,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    b.signal("TERM");
    assert_eq!(
        b.exited_within(SECS_10).await.and_then(|s| s.code()),
        Some(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The binary with `server.drain_timeout_s: drain` in front of a worker that holds customer
/// requests, and a stream held there: the worker, the binary, the stream, the directory.
async fn binary_holding_a_stream(
    tag: &str,
    drain: u32,
) -> (FakeWorker, Binary, tokio::task::JoinHandle<Answer>, PathBuf) {
    let w = FakeWorker::start(0.0).await;
    w.state.hold.store(true, SeqCst);
    let dir = temp_dir(tag);
    let extra = format!("health: {{interval_s: 0}}\nserver: {{drain_timeout_s: {drain}}}");
    let b = Binary::start(&binary_config(&w.url, &extra), &dir).await;
    let held = spawn_stream(&format!("{}/v1/chat/completions", b.base), 4);
    wait_for("the held stream at the worker", SECS_10, async || {
        w.requests() == 1
    })
    .await;
    (w, b, held, dir)
}

/// Regression (7): a stream trickling in held the graceful shutdown as long as it lasted (88 s
/// in the probe). After `server.drain_timeout_s` the connections still open are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_ends_at_its_deadline() {
    let (_w, mut b, held, dir) = binary_holding_a_stream("drain", 1).await;
    let asked = Instant::now();
    b.signal("TERM");
    let status = b.exited_within(Duration::from_secs(6)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", b.log());
    assert!(asked.elapsed() >= Duration::from_millis(900));
    assert!(b.log().contains("event=drain_timeout"), "{}", b.log());
    held.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression (7): a second SIGTERM during the drain was ignored. It ends the gateway at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let (_w, mut b, held, dir) = binary_holding_a_stream("second-signal", 60).await;
    b.signal("TERM");
    wait_for("the drain to start", SECS_10, async || {
        b.log().contains("event=shutting_down")
    })
    .await;
    assert!(b.exited_within(Duration::from_millis(300)).await.is_none());
    b.signal("INT");
    let status = b.exited_within(Duration::from_secs(3)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", b.log());
    assert!(b.log().contains("event=shutdown_forced"), "{}", b.log());
    held.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 8. the output limit -------------------------------------------------------------------

/// Regression (8): `max_tokens` won over `max_completion_tokens`, so a small `max_tokens` let a
/// request through the context filter that the engine then read as asking for 5,000 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_filter_reads_the_limit_the_engine_reads() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0}",
        &[worker("w", &w.url, "m", &[], 1000)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let body = r#"{"model":"m","messages":[{"content":"hi"}],"max_tokens":4,"max_completion_tokens":5000}"#;
    let a = send(&c, Method::POST, &chat, None, body).await;
    assert_eq!(
        assert_openai_error(&a, 400)["code"],
        "context_length_exceeded"
    );
    let body = r#"{"model":"m","messages":[{"content":"hi"}],"max_tokens":4.0}"#;
    let a = send(&c, Method::POST, &chat, None, body).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(w.requests(), 1);
}

// ---- 9. statuses, headers, the log's failures ----------------------------------------------

/// Regression (9): a body that timed out was answered 408 but counted as the 400 the handler
/// saw when its body was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_408_is_counted_as_a_408() {
    let gateway = serve(
        "seed-v1",
        "server: {body_read_timeout_s: 0.5}",
        &[worker("idle", "http://127.0.0.1:9", "m", &[], 4096)],
    )
    .await;
    let Gateway { gw, base, c, .. } = gateway;
    let mut tcp = tokio::net::TcpStream::connect(gw.local_addr())
        .await
        .unwrap();
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(SECS_10, tcp.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let m = metrics(&c, &base).await;
    assert!(
        m.contains(
            "routelab_gateway_rejections_total{status=\"408\",code=\"request_timeout\"} 1\n"
        ),
        "{m}"
    );
    assert!(!m.contains("status=\"400\""), "{m}");
}

/// Regression (9): when every retry ended in a worker's 5xx, the client got a 502 of the
/// gateway's own, losing the worker's status and `Retry-After`. The last worker's answer is
/// passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_workers_5xx_and_retry_after_reach_the_client() {
    let body = r#"{"error":{"message":"overloaded","type":"server_error","code":503}}"#;
    let answer = raw_response(
        "503 Service Unavailable",
        "connection: close\r\nretry-after: 7\r\n",
        body,
    );
    let (a, b) = (
        RawWorker::start(answer.clone()).await,
        RawWorker::start(answer).await,
    );
    let gateway = serve(
        "seed-v1",
        "retries: 1\nhealth: {interval_s: 0}",
        &favoured_pair(("a", &a.url), ("b", &b.url)),
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "7");
    assert_eq!(r.text(), body);
    assert_eq!(a.requests() + b.requests(), 2, "retried once");
    assert!(
        r.headers
            .contains_key(routelab_gateway::proxy::WORKER_HEADER)
    );
}

/// Regression (9): headers a worker named in its `Connection` header (hop-by-hop for its own
/// connection) were passed to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_in_connection_are_not_forwarded() {
    let w = RawWorker::start(raw_response(
        "200 OK",
        "connection: close, x-trace\r\nx-trace: worker-internal\r\nx-kept: 1\r\n",
        r#"{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}"#,
    ))
    .await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0}",
        &[worker("w", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.headers["x-kept"], "1");
    assert!(!r.headers.contains_key("x-trace"), "{:?}", r.headers);
}

/// Regression (9): requests without `Host`, or with two, were answered; RFC 9112 §3.2 asks for
/// a 400. An HTTP/1.0 request may leave it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_one_host_are_refused() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0}",
        &[worker("w", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { gw, base, c, .. } = gateway;
    let body = chat_body("m", "hi", 4, false);
    for (version, hosts, status) in [
        ("1.1", "", "400"),
        ("1.1", "host: a\r\nhost: b\r\n", "400"),
        ("1.0", "", "200"),
        ("1.1", "host: gw\r\n", "200"),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(gw.local_addr())
            .await
            .unwrap();
        let request = format!(
            "POST /v1/chat/completions HTTP/{version}\r\n{hosts}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        let _ = tokio::time::timeout(SECS_10, tcp.read_to_string(&mut answer)).await;
        let got = answer.split_whitespace().nth(1);
        assert_eq!(got, Some(status), "{version} {hosts:?}: {answer}");
        if status == "400" {
            assert!(answer.contains("\"code\":\"invalid_host\""), "{answer}");
        }
    }
    assert_eq!(w.requests(), 2);
    assert!(
        metrics(&c, &base).await.contains(
            "routelab_gateway_rejections_total{status=\"400\",code=\"invalid_host\"} 2\n"
        )
    );
}

/// Regression (9): with the request log's disk full, 3,000 requests printed 5,946 log lines
/// and lines lost in a failed flush were not counted. Now every lost line is counted and the
/// failure is logged at most once a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_request_log_is_counted_not_flooded() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("log-full");
    let b = Binary::start(
        &binary_config(
            &w.url,
            "health: {interval_s: 0}\nrequest_log: {path: /dev/full}",
        ),
        &dir,
    )
    .await;
    let c = client();
    let chat = format!("{}/v1/chat/completions", b.base);
    let started = Instant::now();
    for i in 0..300 {
        let a = post_chat(&c, &chat, &format!("r{i}"), 4, false).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    wait_for("every lost line counted", SECS_10, async || {
        metrics(&c, &b.base)
            .await
            .contains("routelab_gateway_request_log_write_errors_total 300\n")
    })
    .await;
    let logged = b
        .log()
        .lines()
        .filter(|l| l.contains("event=request_log_write_failed"))
        .count();
    // At most one line a second (and one at the start).
    let most = started.elapsed().as_secs() as usize + 2;
    assert!((1..=most).contains(&logged), "{logged} lines:\n{}", b.log());
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 10. the worker table, bodies, the state file --------------------------------------------

/// Regression (10): every add of a worker took a new slot in the router and the gateway, so
/// 20,000 add/remove cycles took the gateway from 7 to 33 MB. A worker removed and added again
/// takes its slot back (and is served), and a removed worker's record is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_and_removing_a_worker_does_not_grow_the_table() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0}",
        &[worker("base", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    let body = json!({"name": "churn", "base_url": w.url, "model": "m", "context_window": 4096, "gpu_names": ["RTX 4090"]})
        .to_string();
    for _ in 0..200 {
        let a = send(
            &c,
            Method::POST,
            &format!("{base}/admin/workers"),
            Some(TOKEN),
            body.clone(),
        )
        .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
        let a = send(
            &c,
            Method::DELETE,
            &format!("{base}/admin/workers/churn"),
            Some(TOKEN),
            "",
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    }
    assert!(
        metrics(&c, &base)
            .await
            .contains("routelab_gateway_worker_slots 2\n"),
        "one slot for `base`, one for `churn`"
    );
    // Back once more, it is an ordinary worker: listed, up, and it takes requests.
    let a = send(
        &c,
        Method::POST,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        body,
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let churn = admin_worker(&c, &base, "churn").await;
    assert_eq!(
        (churn["state"].as_str(), churn["in_flight"].as_u64()),
        (Some("up"), Some(0))
    );
    for i in 0..6 {
        assert_eq!(
            post_chat(&c, &chat, &format!("r{i}"), 4, false)
                .await
                .status,
            StatusCode::OK
        );
    }
    assert!(admin_worker(&c, &base, "churn").await["requests_total"].as_u64() > Some(0));
}

/// Regression (10): a 100,000-deep array in a field the gateway does not read was forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_nested_too_deep_never_reaches_a_worker() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "health: {interval_s: 0}\nmax_body_bytes: 1048576",
        &[worker("w", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let deep = format!(
        r#"{{"model":"m","messages":[{{"content":"hi"}}],"max_tokens":4,"x":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let a = send(&c, Method::POST, &chat, None, deep).await;
    let e = assert_openai_error(&a, 400);
    assert!(
        e["message"].as_str().unwrap().contains("levels deep"),
        "{e}"
    );
    assert_eq!(w.requests(), 0);
}

/// Regression (10): a corrupt state file passed `--check` (exit 0) and then failed the start
/// (exit 1); a `state_file` in a missing directory started silently, and every pin then failed.
/// `--check` now reads the state file as the start does, and a missing directory is a located
/// error at both, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_the_state_file_as_start_does() {
    let dir = temp_dir("check-state");
    let state = dir.join("state.json");
    std::fs::write(&state, "{not a state file").unwrap();
    let yaml = format!("state_file: {}\n", state.display());
    let (code, _, stderr) = check_config(&yaml);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("invalid state file"), "{stderr}");
    let cfg = GatewayConfig::from_yaml(&format!("listen: 127.0.0.1:0\n{yaml}"), "g.yaml").unwrap();
    let started = routelab_gateway::start(cfg).await;
    assert!(started.is_err(), "the start refuses it as --check does");

    let missing = dir.join("no-such-dir").join("state.json");
    let yaml = format!("listen: 127.0.0.1:0\nstate_file: {}\n", missing.display());
    let (code, _, stderr) = check_config(&yaml);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("state_file") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
    let cfg = GatewayConfig::from_yaml(&yaml, "g.yaml").unwrap();
    let e = routelab_gateway::start(cfg).await.err().expect("refused");
    assert!(e.to_string().contains("no-such-dir"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 42, item 10: `kv_events_down` was written at every failed reconnection. With the
/// window a setting (`kv_events.down_log_every_s`, 1 s here; 60 s by default), an endpoint
/// that refuses every connection for over two windows gets one line per window, each at least
/// a window after the one before, and the attempts between are counted in `suppressed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_down_is_logged_once_per_window_with_what_it_held_back() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("kv-down");
    let port = refused_url().await.rsplit(':').next().unwrap().to_string();
    let yaml = config(
        "equal/p2c/raw/none/kv-events",
        "health: {interval_s: 0}",
        &[format!(
            "{}    kv_events: {{endpoint: \"tcp://127.0.0.1:{port}\", down_log_every_s: 1}}\n",
            worker("w", &w.url, "m", &[], 4096)
        )],
    );
    let b = Binary::start(&yaml, &dir).await;
    let down = |log: &str| -> Vec<(f64, u64)> {
        log.lines()
            .filter(|l| l.contains("event=kv_events_down"))
            .map(|l| {
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .unwrap_or_else(|| panic!("no {k} in {l}"))
                        .to_string()
                };
                (
                    field("ts=").parse().unwrap(),
                    field("suppressed=").parse().unwrap(),
                )
            })
            .collect()
    };
    wait_for("three down lines", Duration::from_secs(15), async || {
        down(&b.log()).len() >= 3
    })
    .await;
    let lines = down(&b.log());
    for pair in lines.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= 0.99, "{lines:?}\n{}", b.log());
    }
    // Reconnections at 0, 0.1, 0.3, 0.7, 1.5 s, ...: the first window held some back.
    assert_eq!(lines[0].1, 0, "{lines:?}");
    assert!(lines[1].1 >= 2, "{lines:?}\n{}", b.log());
    let _ = std::fs::remove_dir_all(&dir);
}
