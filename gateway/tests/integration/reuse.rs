//! A pooled upstream connection lost under a request.

use crate::fake::{RawWorker, raw_response};
use crate::harness::*;
use hyper::StatusCode;
use std::sync::atomic::Ordering::SeqCst;

/// Issue 42, item 10: a rare 502 with one worker for the model. The worker closed a kept-alive
/// connection just as the next request went out on it; hyper-util retries only requests
/// canceled before they were written, and the gateway retried only on another worker (there
/// was none). The request is now sent once more to the same worker on a fresh connection:
/// every request is answered, and each lost connection cost one retry, not a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_lost_under_a_request_is_retried_on_a_fresh_one() {
    let (w, dropped) = RawWorker::closing_reused(raw_response(
        "200 OK",
        "",
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
    for i in 0..6 {
        let r = post_chat(&c, &chat, &format!("hi {i}"), 4, false).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.text());
    }
    assert_eq!(w.requests(), 6, "each request answered once");
    assert!(
        dropped.load(SeqCst) >= 1,
        "no kept-alive connection was reused and lost: the test did not test"
    );
}
