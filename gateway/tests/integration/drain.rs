//! Issue 42, item 10: a stream still running at the drain deadline of a shutdown ends with an
//! SSE error event (it was cut with its connection, and logged as `client_gone`), and the
//! request log says the gateway cut it.

use crate::fake::FakeWorker;
use crate::harness::*;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

const SECS_10: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_the_drain_deadline_gets_an_error_event_and_its_own_status() {
    // 10 tokens a second for 100 tokens: ten seconds, far past the 0.4 s deadline.
    let w = FakeWorker::start(10.0).await;
    w.state.natural_len.store(100, SeqCst);
    let dir = temp_dir("drain-cut");
    let path = dir.join("requests.jsonl");
    let gateway = serve(
        "seed-v3",
        &format!(
            "health: {{interval_s: 0}}\nserver: {{drain_timeout_s: 0.4}}\nrequest_log: {{path: {}}}",
            path.display()
        ),
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    let Gateway { gw, chat, c, .. } = gateway;
    let r = raw(
        &c,
        Method::POST,
        &chat,
        None,
        chat_body("m", "a long story", 100, true),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.into_body();
    let mut text = Vec::new();
    // Two tokens in, the shutdown begins.
    while text.windows(6).filter(|w| w == b"data: ").count() < 2 {
        let f = tokio::time::timeout(SECS_10, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.extend_from_slice(f.data_ref().unwrap());
    }
    let asked = Instant::now();
    let stopping = tokio::spawn(gw.shutdown());
    while let Some(f) = tokio::time::timeout(SECS_10, body.frame()).await.unwrap() {
        match f {
            Ok(f) => text.extend_from_slice(f.data_ref().map_or(&[][..], |d| d)),
            Err(e) => panic!("the stream broke instead of ending: {e}"),
        }
    }
    let ended = asked.elapsed();
    let text = String::from_utf8(text).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let last: serde_json::Value =
        serde_json::from_str(events.last().unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error", "{text}");
    assert_eq!(last["error"]["code"], "shutting_down", "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("drain deadline"),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e.contains("chat.completion.chunk")),
        "{text}"
    );
    assert!(
        ended >= Duration::from_millis(350) && ended < Duration::from_secs(3),
        "ended {ended:?} after the shutdown began"
    );
    tokio::time::timeout(SECS_10, stopping)
        .await
        .expect("the shutdown ends")
        .unwrap();
    let log = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert_eq!(lines[0]["status"], "drain_cut", "{log}");
    assert_eq!(lines[0]["worker"], "w", "{log}");
    // As for every request that did not complete: no output length (a replay would read a
    // partial count as a request that wanted that few tokens), a first token and the end.
    assert!(lines[0]["output_tokens"].is_null(), "{log}");
    assert!(lines[0]["ttft_ms"].as_f64().is_some(), "{log}");
    let e2e = lines[0]["e2e_ms"].as_f64().unwrap();
    assert!(e2e >= 400.0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
