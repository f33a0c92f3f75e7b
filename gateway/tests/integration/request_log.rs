//! The request log's lines and the passive capacity curve (`GET /admin/capacity`) against fake
//! workers.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use routelab_gateway::prompt::{self, Endpoint};
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

/// Words that appear in the prompts sent and must never appear in the log.
const SECRET_WORDS: &str = "zebra-quartz-lantern";

/// A prompt long enough for one full prefix block, with [`SECRET_WORDS`] in it.
fn long_prompt(tag: &str) -> String {
    let mut s = format!("{SECRET_WORDS} {tag} ");
    while s.len() < prompt::BLOCK_BYTES + 300 {
        s.push_str("the quick brown fox jumps over the lazy dog ");
    }
    s
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn line_for(lines: &[Value], prompt_tokens: u32, status: &str) -> Value {
    lines
        .iter()
        .find(|l| l["prompt_tokens"] == prompt_tokens && l["status"] == status)
        .cloned()
        .unwrap_or_else(|| panic!("no `{status}` line of {prompt_tokens} prompt tokens: {lines:?}"))
}

/// A streamed and a buffered request, a request the router refuses, one refused before routing
/// and one whose client goes away: each finished request is one line with its fields, and no
/// prompt text is written anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_finished_request_is_one_line_with_its_fields_and_no_prompt_text() {
    let w = FakeWorker::start(200.0).await;
    w.state.natural_len.store(100, SeqCst);
    let dir = temp_dir("reqlog");
    let path = dir.join("requests.jsonl");
    let gateway = serve(
        "seed-v3",
        &format!("request_log: {{path: {}}}", path.display()),
        &[worker("w", &w.url, "m", &["RTX 4090"], 4096)],
    )
    .await;
    let Gateway { gw, chat, c, .. } = gateway;

    let mut expected = Vec::new();
    // Tags of different lengths: the two prompts differ in their token estimates.
    for (tag, stream, max_tokens) in [
        ("streamed", true, 12),
        ("buffered-and-longer-by-far", false, 7),
    ] {
        let body = chat_body("m", &long_prompt(tag), max_tokens, stream);
        let parsed = prompt::parse(body.as_bytes(), Endpoint::Chat).unwrap();
        let a = send(&c, Method::POST, &chat, None, body).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        expected.push((
            parsed.prompt_tokens,
            prompt::prefix_hashes(parsed.prompt.as_bytes()),
            max_tokens,
        ));
    }
    // Prompt + max_tokens beyond the only window: the router refuses it.
    let refused = chat_body("m", &long_prompt("refused"), 4000, false);
    let refused_tokens = prompt::parse(refused.as_bytes(), Endpoint::Chat)
        .unwrap()
        .prompt_tokens;
    let a = send(&c, Method::POST, &chat, None, refused).await;
    assert_openai_error(&a, 400);
    // Refused before routing: not logged.
    let a = send(
        &c,
        Method::POST,
        &chat,
        None,
        chat_body("nope", "x", 4, false),
    )
    .await;
    assert_openai_error(&a, 404);
    // A client that goes away while its request is held at the worker.
    w.state.hold.store(true, SeqCst);
    let gone_body = chat_body("m", &long_prompt("gone"), 5, true);
    let gone_tokens = prompt::parse(gone_body.as_bytes(), Endpoint::Chat)
        .unwrap()
        .prompt_tokens;
    let before = w.requests();
    let chat2 = chat.clone();
    let task = tokio::spawn(async move {
        send(&client(), Method::POST, &chat2, None, gone_body).await;
    });
    wait_for(
        "the held request at the worker",
        Duration::from_secs(10),
        async || w.requests() > before,
    )
    .await;
    task.abort();
    let _ = task.await;
    wait_for(
        "the client_gone line",
        Duration::from_secs(10),
        async || {
            gw.flush_request_log().await;
            lines(&path).len() == 4
        },
    )
    .await;
    w.state.release();

    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains(SECRET_WORDS),
        "prompt text in the log: {text}"
    );
    assert!(!text.contains("quick brown fox"), "prompt text in the log");
    let all = lines(&path);
    assert_eq!(all.len(), 4, "{text}");
    let fields = [
        "arrival_unix_ms",
        "model",
        "prompt_tokens",
        "output_tokens",
        "prefix_hashes",
        "worker",
        "status",
        "ttft_ms",
        "e2e_ms",
    ];
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for l in &all {
        let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
        // A routed request also has its decision; one refused before routing has none.
        let routed = !l["worker"].is_null();
        assert_eq!(keys.contains(&"decision"), routed, "{l}");
        assert_eq!(keys.len(), fields.len() + usize::from(routed), "{l}");
        for f in fields {
            assert!(keys.contains(&f), "{f} missing in {l}");
        }
        let arrival = l["arrival_unix_ms"].as_i64().unwrap();
        assert!(arrival <= now_ms && arrival > now_ms - 60_000, "{l}");
        assert_eq!(l["model"], "m");
    }
    for (prompt_tokens, hashes, max_tokens) in &expected {
        let l = line_for(&all, *prompt_tokens, "ok");
        assert_eq!(l["worker"], "w");
        assert_eq!(l["output_tokens"], *max_tokens, "{l}");
        let got: Vec<u64> = l["prefix_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(&got, hashes);
        assert!(!hashes.is_empty());
        let (ttft, e2e) = (
            l["ttft_ms"].as_f64().unwrap(),
            l["e2e_ms"].as_f64().unwrap(),
        );
        assert!(ttft > 0.0 && ttft <= e2e && e2e < 10_000.0, "{l}");
    }
    // The streamed one cannot end before its 12th token, 60 ms after the worker started it.
    let streamed = line_for(&all, expected[0].0, "ok");
    assert!(streamed["e2e_ms"].as_f64().unwrap() >= 55.0, "{streamed}");

    let l = line_for(&all, refused_tokens, "rejected");
    assert_eq!(
        (&l["worker"], &l["output_tokens"], &l["ttft_ms"]),
        (&Value::Null, &Value::Null, &Value::Null)
    );
    assert!(l["e2e_ms"].as_f64().is_some());

    let l = line_for(&all, gone_tokens, "client_gone");
    assert_eq!(l["worker"], "w", "{l}");
    assert_eq!(l["ttft_ms"], Value::Null, "{l}");

    let m = send(
        &c,
        Method::GET,
        &format!("{}/metrics", base_of(&chat)),
        None,
        "",
    )
    .await
    .text();
    assert!(
        m.contains("routelab_gateway_request_log_dropped_total 0\n"),
        "{m}"
    );
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn base_of(chat: &str) -> &str {
    chat.strip_suffix("/v1/chat/completions").unwrap()
}

/// Through the gateway, a small `max_bytes` rotates the log several times: `keep` rotated
/// files beside the live one, none over `max_bytes`, every line whole JSON, the newest kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_log_rotates_keeping_whole_lines_and_keep_files() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("reqlog-rotate");
    let path = dir.join("r.jsonl");
    let gateway = serve(
        "seed-v3",
        &format!(
            "request_log: {{path: {}, max_bytes: 900, keep: 2}}",
            path.display()
        ),
        &[worker("w", &w.url, "m", &[], 4096)],
    )
    .await;
    let Gateway { gw, chat, c, .. } = gateway;
    // Each line is ~290 bytes (one prefix hash, the decision): 3 to a file; 20 requests
    // rotate 6 times.
    for i in 0..20 {
        let a = post_chat(
            &c,
            &chat,
            &format!("{i:02} {}", long_prompt("rotate")),
            4,
            false,
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
    }
    gw.flush_request_log().await;
    let rotated = |i: u32| dir.join(format!("r.jsonl.{i}"));
    assert!(rotated(1).exists() && rotated(2).exists());
    assert!(!rotated(3).exists(), "keep: 2");
    let mut arrivals = Vec::new();
    for p in [rotated(2), rotated(1), path.clone()] {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.len() <= 900, "{}: {} bytes", p.display(), text.len());
        assert!(text.ends_with('\n'), "{}", p.display());
        for l in lines(&p) {
            assert_eq!(l["status"], "ok");
            arrivals.push(l["arrival_unix_ms"].as_i64().unwrap());
        }
    }
    // Oldest file first: the requests, sent one after another, in order; the oldest dropped.
    assert!(arrivals.windows(2).all(|a| a[0] <= a[1]), "{arrivals:?}");
    assert!(
        arrivals.len() < 20 && arrivals.len() >= 7,
        "{}",
        arrivals.len()
    );
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A log file that cannot be opened stops the start with a located error.
#[tokio::test]
async fn a_log_that_cannot_be_opened_is_a_located_error_at_start() {
    let yaml = config(
        "seed-v3",
        "request_log: {path: /nonexistent-dir/routelab/r.jsonl}",
        &[worker("w", "http://127.0.0.1:9", "m", &[], 4096)],
    );
    let cfg = routelab_gateway::GatewayConfig::from_yaml(&yaml, "test.yaml").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(e) = routelab_gateway::start_on(cfg, listener).await else {
        panic!("started with a log it cannot open");
    };
    let routelab_gateway::GatewayError::Config(e) = e else {
        panic!("not a configuration error: {e}");
    };
    assert_eq!(
        (e.file.as_str(), e.field.as_str()),
        ("test.yaml", "request_log.path")
    );
    assert!(e.message.contains("cannot open"), "{e}");
    assert!(e.valid.is_some());
}

/// `GET /admin/capacity`: behind the admin token; one model's workers with their GPUs, window
/// and points; a streamed request's tokens counted at the concurrency they came at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_capacity_is_behind_the_token_and_has_its_shape() {
    let w = FakeWorker::start(200.0).await;
    w.state.natural_len.store(100, SeqCst);
    let other = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v3",
        "capacity: {min_observed_s: 0}",
        &[
            worker("w", &w.url, "m", &["RTX PRO 6000"], 65536),
            worker("o", &other.url, "other", &[], 8192),
        ],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    let url = format!("{base}/admin/capacity?model=m");
    assert_openai_error(&send(&c, Method::GET, &url, None, "").await, 401);
    assert_openai_error(&send(&c, Method::GET, &url, Some("wrong"), "").await, 401);

    let a = send(&c, Method::GET, &url, Some(TOKEN), "").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let v = a.json();
    assert_eq!(v["schema"], "routelab-gateway-capacity/1");
    assert_eq!(v["model"], "m");
    assert!(v["generated_unix_s"].as_u64().unwrap() > 1_700_000_000);
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{v}");
    assert_eq!(workers[0]["name"], "w");
    assert_eq!(workers[0]["gpu_names"], serde_json::json!(["RTX PRO 6000"]));
    assert_eq!(workers[0]["context_window"], 65536);
    assert_eq!(
        workers[0]["points"],
        serde_json::json!([]),
        "nothing seen yet"
    );

    // 40 tokens streamed at 200 tok/s: 0.2 s decoding alone.
    let a = post_chat(&c, &chat, "hello", 40, true).await;
    assert_eq!(a.status, StatusCode::OK);
    let v = send(&c, Method::GET, &url, Some(TOKEN), "").await.json();
    let points = v["workers"][0]["points"].as_array().unwrap().clone();
    assert_eq!(points.len(), 1, "{v}");
    let p = &points[0];
    assert_eq!(
        (p["concurrency"].as_u64(), p["tokens"].as_u64()),
        (Some(1), Some(40))
    );
    let (tok_s, observed) = (
        p["aggregate_tok_s"].as_f64().unwrap(),
        p["observed_s"].as_f64().unwrap(),
    );
    assert!((tok_s * observed - 40.0).abs() < 1e-6, "{p}");
    // The first token comes 5 ms after the start, the last at 200 ms: ~205 tok/s, give or
    // take the loopback's scheduling.
    assert!((150.0..320.0).contains(&tok_s), "{p}");

    // Several models: the model must be named; an unknown one is 404; an unknown parameter 400.
    let all = format!("{base}/admin/capacity");
    let e = assert_openai_error(&send(&c, Method::GET, &all, Some(TOKEN), "").await, 400);
    assert!(e["message"].as_str().unwrap().contains("m, other"), "{e}");
    let nope = format!("{base}/admin/capacity?model=nope");
    let e = assert_openai_error(&send(&c, Method::GET, &nope, Some(TOKEN), "").await, 404);
    assert_eq!(e["code"], "model_not_found");
    let bogus = format!("{base}/admin/capacity?modle=m");
    assert_openai_error(&send(&c, Method::GET, &bogus, Some(TOKEN), "").await, 400);
    let v = send(
        &c,
        Method::GET,
        &format!("{base}/admin/capacity?model=other"),
        Some(TOKEN),
        "",
    )
    .await
    .json();
    assert_eq!(v["workers"][0]["name"], "o");
}
