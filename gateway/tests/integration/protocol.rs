//! The request path at its edges (issue 13): workers that go silent mid-response, requests an
//! engine would refuse, paths and methods the gateway does not serve, retries when the other
//! workers are full, and a queue whose workers are all ejected.

use crate::fake::{self, FakeWorker, MODE_500, MODE_STALL};
use crate::harness::*;
use hyper::{Method, StatusCode};
use routelab_gateway::GatewayConfig;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

const SECS_10: Duration = Duration::from_secs(10);

/// The SSE events of a body, without the `data: ` prefix.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or(e))
        .collect()
}

async fn queue_length(c: &HttpClient, base: &str) -> String {
    let m = send(c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text();
    m.lines()
        .find(|l| l.starts_with("routelab_queue_length "))
        .unwrap_or("")
        .to_string()
}

/// A stalling worker under a gateway whose health logic ejects after one failure (so that
/// "the worker's health was told" is visible as `disconnected`) and whose checks come too
/// rarely to re-admit it during the test.
async fn stalling_gateway(upstream: &str) -> (FakeWorker, Gateway) {
    let w = FakeWorker::start(0.0).await;
    w.state.mode.store(MODE_STALL, SeqCst);
    let gateway = serve(
        "seed-v1",
        // Panic mode off: with one worker, an ejection would otherwise route to it anyway.
        &format!(
            "upstream: {upstream}\nhealth: {{interval_s: 30, unhealthy_after: 1, panic_threshold_percent: 0}}"
        ),
        &[worker("w", &w.url, "m", &["RTX 4090"], 8192)],
    )
    .await;
    (w, gateway)
}

/// Regression (defect 1): the client waited the worker's whole 40 s silence and the slot
/// stayed taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stalls_after_its_first_chunk_ends_with_an_error_event() {
    let (w, gateway) = stalling_gateway("{stream_idle_timeout_s: 1}").await;
    let Gateway { base, chat, c, .. } = gateway;
    let started = Instant::now();
    let a = post_chat(&c, &chat, "hi", 8, true).await;
    let took = started.elapsed();
    assert_eq!(a.status, StatusCode::OK);
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    let text = a.text();
    let ev = events(&text);
    assert_eq!(ev.len(), 2, "{text}");
    assert!(ev[0].contains("chat.completion.chunk"), "{text}");
    let last: serde_json::Value = serde_json::from_str(ev[1]).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error", "{text}");
    assert_eq!(last["error"]["code"], "stream_idle_timeout", "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(w.state.finished.load(SeqCst) == 0);
    let s = admin_worker(&c, &base, "w").await;
    assert_eq!(
        (s["in_flight"].as_u64(), s["errors_total"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    assert_eq!(
        s["state"], "disconnected",
        "the failure reached the health logic"
    );
}

/// Regression (defect 1): the option defaults to `upstream.response_timeout_s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_idle_timeout_defaults_to_the_response_timeout() {
    let (_w, gateway) = stalling_gateway("{response_timeout_s: 1}").await;
    let Gateway { base, chat, c, .. } = gateway;
    let started = Instant::now();
    let a = post_chat(&c, &chat, "hi", 8, true).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        a.text().contains("\"code\":\"stream_idle_timeout\""),
        "{}",
        a.text()
    );
    assert_eq!(admin_worker(&c, &base, "w").await["in_flight"], 0);
}

/// Regression (defect 1): a buffered (non-streaming) body that stalls was bounded only by the
/// whole response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_body_that_stalls_ends_with_a_502() {
    let (_w, gateway) = stalling_gateway("{stream_idle_timeout_s: 1}").await;
    let Gateway { base, chat, c, .. } = gateway;
    let started = Instant::now();
    let a = post_chat(&c, &chat, "hi", 8, false).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let e = assert_openai_error(&a, 502);
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("upstream_error"), Some("stream_idle_timeout"))
    );
    let s = admin_worker(&c, &base, "w").await;
    assert_eq!(
        (s["in_flight"].as_u64(), s["errors_total"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
}

#[test]
fn the_stream_idle_timeout_is_a_period() {
    for bad in ["0", "-1", "1e20", ".nan"] {
        let yaml = format!("upstream: {{stream_idle_timeout_s: {bad}}}\n");
        let e = GatewayConfig::from_yaml(&yaml, "g.yaml").unwrap_err();
        assert_eq!(e.field, "upstream.stream_idle_timeout_s", "{bad}: {e}");
        assert!(e.message.contains("seconds from"), "{e}");
    }
    GatewayConfig::from_yaml("upstream: {stream_idle_timeout_s: 0.5}\n", "g.yaml").unwrap();
}

/// One worker and a gateway in front of it, for the requests that must never reach it.
async fn plain_gateway() -> (FakeWorker, Gateway) {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v1",
        "",
        &[worker("w", &w.url, "m", &["RTX 4090"], 8192)],
    )
    .await;
    (w, gateway)
}

/// Regression (defect 8): an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_path_answers_404_in_the_openai_shape() {
    let (_w, gateway) = plain_gateway().await;
    let Gateway { base, c, .. } = gateway;
    let a = send(&c, Method::POST, &format!("{base}/v1/nope"), None, "{}").await;
    let e = assert_openai_error(&a, 404);
    assert_eq!(e["code"], "unknown_url");
    assert!(
        e["message"].as_str().unwrap().contains("POST /v1/nope"),
        "{e}"
    );
}

/// Regression (defect 8): an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_answers_405_in_the_openai_shape() {
    let (_w, gateway) = plain_gateway().await;
    let Gateway { base, chat, c, .. } = gateway;
    let a = send(&c, Method::GET, &chat, None, "").await;
    let e = assert_openai_error(&a, 405);
    assert_eq!(e["code"], "method_not_allowed");
    assert_eq!(a.headers["allow"], "POST");
    // The admin routes (behind their token layer) too.
    let a = send(
        &c,
        Method::PUT,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(assert_openai_error(&a, 405)["code"], "method_not_allowed");
}

/// Sends `body` to the chat endpoint and checks the 400 names `param`; the worker sees
/// nothing.
async fn refused(body: &str, param: Option<&str>) -> String {
    let (w, gateway) = plain_gateway().await;
    let Gateway { chat, c, .. } = gateway;
    let a = send(&c, Method::POST, &chat, None, body.to_string()).await;
    let e = assert_openai_error(&a, 400);
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"].as_str(), param, "{e}");
    assert_eq!(w.requests(), 0, "refused before any worker");
    e["message"].as_str().unwrap().to_string()
}

/// Regression (defect 8): serde read the six elements into the request's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_array_is_not_a_request() {
    let m = refused(
        r#"["m",[{"role":"user","content":"hi"}],null,4,null,false]"#,
        None,
    )
    .await;
    assert!(m.contains("JSON object"), "{m}");
}

/// Regression (defect 8): passed the gateway, failed at the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_0_is_refused_with_the_valid_range() {
    let m = refused(&chat_body("m", "hi", 0, false), Some("max_tokens")).await;
    assert!(m.contains("from 1 to 4294967295"), "{m}");
    let body = r#"{"model":"m","messages":[{"content":"hi"}],"max_completion_tokens":0}"#;
    refused(body, Some("max_completion_tokens")).await;
}

/// Regression (defect 8): generated 256 tokens from nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_messages_are_refused() {
    let m = refused(r#"{"model":"m","messages":[]}"#, Some("messages")).await;
    assert!(m.contains("at least one message"), "{m}");
}

/// Regression (defect 8): `n: 3` returned one choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_other_than_1_is_refused() {
    let body = r#"{"model":"m","messages":[{"content":"hi"}],"n":3}"#;
    let m = refused(body, Some("n")).await;
    assert!(m.contains("must be 1"), "{m}");
}

/// A request sent in a task of its own.
type Task = tokio::task::JoinHandle<Answer>;

/// `busy` (the higher table weight) holds a request, at its cap of 1, and `bad` answers 500
/// to the next request, whose retry then finds `busy` full. Returns `busy`, `bad`, the
/// gateway, the held request and the retried one.
async fn retry_past_a_full_worker(retries: u32) -> (FakeWorker, FakeWorker, Gateway, Task, Task) {
    let [busy, bad] = fakes(0.0).await;
    busy.state.hold.store(true, SeqCst);
    // `busy` has the higher table weight: the idle tie sends the held request to it.
    let gateway = serve(
        "table/p2c:higher-weight/no-affinity/flat:1",
        &format!("queue_timeout_s: 10\nretries: {retries}\nhealth: {{interval_s: 0}}"),
        &favoured_pair(("busy", &busy.url), ("bad", &bad.url)),
    )
    .await;
    let held = spawn_chat(&gateway.chat, "held");
    wait_for("the held request at busy", SECS_10, async || {
        busy.requests() == 1
    })
    .await;
    bad.state.mode.store(MODE_500, SeqCst);
    let retried = spawn_chat(&gateway.chat, "retried");
    (busy, bad, gateway, held, retried)
}

/// Regression (defect 9): the retry found the other worker at its cap and answered 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_in_the_queue_when_the_other_workers_are_full() {
    let (busy, bad, gateway, held, retried) = retry_past_a_full_worker(2).await;
    let Gateway { base, c, .. } = gateway;
    wait_for("the retry to queue after bad's 500", SECS_10, async || {
        bad.requests() == 1 && queue_length(&c, &base).await == "routelab_queue_length 1"
    })
    .await;
    assert!(!retried.is_finished(), "it waits for busy");
    busy.state.release();
    let a = tokio::time::timeout(SECS_10, retried)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.headers[routelab_gateway::proxy::WORKER_HEADER], "busy");
    assert_eq!((busy.requests(), bad.requests()), (2, 1));
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    let m = send(&c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text();
    assert!(m.contains("routelab_retries_total 1\n"), "{m}");
}

/// Guard for the fix above: a retry with no other worker at all still fails at once (it does
/// not wait in the queue for a worker that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_no_other_worker_fails_at_once() {
    let bad = FakeWorker::start(0.0).await;
    bad.state.mode.store(MODE_500, SeqCst);
    let gateway = serve(
        "equal/p2c/no-affinity/flat:1",
        "queue_timeout_s: 30\nhealth: {interval_s: 0}",
        &[worker("bad", &bad.url, "m", &[], 8192)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let started = Instant::now();
    let a = post_chat(&c, &chat, "hi", 4, false).await;
    // The worker's own 500 (issue 30, hardening 9), at once.
    assert_eq!(
        (a.status.as_u16(), a.text().as_str()),
        (500, "engine exploded")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(bad.requests(), 1);
}

/// Regression (defect 9): requests queued at the cap whose workers were then all ejected
/// answered 429 (as if the fleet were only busy) instead of 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_whose_workers_are_all_ejected_answers_503() {
    let w = FakeWorker::start(0.0).await;
    w.state.hold.store(true, SeqCst);
    let gateway = serve(
        "equal/p2c/no-affinity/flat:1",
        // Panic mode off: the test is about a model whose workers are all out.
        "queue_timeout_s: 1\nhealth: {interval_s: 0.05, unhealthy_after: 1, panic_threshold_percent: 0}",
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    let held = spawn_chat(&chat, "held");
    wait_for("the held request", SECS_10, async || w.requests() == 1).await;
    let queued = spawn_chat(&chat, "queued");
    wait_for("the request to queue", SECS_10, async || {
        queue_length(&c, &base).await == "routelab_queue_length 1"
    })
    .await;
    w.state.healthy.store(false, SeqCst);
    wait_for("ejection", SECS_10, async || {
        admin_worker(&c, &base, "w").await["state"] == "disconnected"
    })
    .await;
    let a = tokio::time::timeout(SECS_10, queued)
        .await
        .unwrap()
        .unwrap();
    let e = assert_openai_error(&a, 503);
    assert_eq!(e["code"], "no_healthy_worker");
    w.state.release();
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
}

/// The queue knows nothing of a retry's failed workers: when it hands the retry the worker
/// that failed it and no other has room, the retry takes it (rather than handing it back to
/// be handed it again), and succeeds if that worker has recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_retry_handed_its_failed_worker_takes_it_when_no_other_has_room() {
    let (busy, bad, gateway, held, retried) = retry_past_a_full_worker(1).await;
    let Gateway { base, chat, c, .. } = gateway;
    wait_for("the retry to queue", SECS_10, async || {
        queue_length(&c, &base).await == "routelab_queue_length 1"
    })
    .await;
    // bad recovers; a request served by it frees its slot, and the queue hands that slot to
    // the waiting retry while busy is still full.
    bad.state.mode.store(fake::MODE_OK, SeqCst);
    let a = post_chat(&c, &chat, "other", 4, false).await;
    assert_eq!(a.headers[routelab_gateway::proxy::WORKER_HEADER], "bad");
    let a = tokio::time::timeout(SECS_10, retried)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.headers[routelab_gateway::proxy::WORKER_HEADER], "bad");
    assert_eq!((busy.requests(), bad.requests()), (1, 3));
    assert!(!held.is_finished());
    busy.state.release();
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
}
