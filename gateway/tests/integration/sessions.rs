//! Issue 38: a request's session (the `sessions:` block, `crate::session`): what `--check`
//! refuses of the block and of a `sita` policy the workers cannot serve, and the 400 a client
//! gets for an empty or over-long session key.

use crate::harness::*;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use std::time::Duration;

/// A configuration with one 4,096-token worker and `extra` top-level lines.
fn one_worker(extra: &str) -> String {
    format!(
        "{extra}\nworkers:\n  - {{name: a, base_url: \"http://127.0.0.1:9\", model: m, context_window: 4096}}\n"
    )
}

#[test]
fn check_refuses_a_bad_sessions_block_by_field() {
    for (extra, field, words) in [
        (
            "sessions: {sources: [header]}",
            "sessions.sources[0]",
            "no `sessions.header`",
        ),
        (
            "sessions: {header: 'x session'}",
            "sessions.header",
            "not an HTTP header name",
        ),
        (
            "sessions: {max_key_bytes: 0}",
            "sessions.max_key_bytes",
            "a whole number from 1 to 4096",
        ),
        (
            "sessions: {prefix_blocks: -2}",
            "sessions.prefix_blocks",
            "a whole number",
        ),
        (
            "sessions: {sources: [user, user]}",
            "sessions.sources[1]",
            "at most once",
        ),
        (
            "sessions: {sources: [cookie]}",
            "sessions",
            "unknown variant",
        ),
    ] {
        let (code, _, stderr) = check_config(&one_worker(extra));
        assert_eq!(code, Some(2), "{extra}: {stderr}");
        assert!(
            stderr.contains(field) && stderr.contains(words),
            "{extra}: {stderr}"
        );
    }
    let (code, _, stderr) = check_config(&one_worker(
        "sessions: {header: x-session-id, max_key_bytes: 64}",
    ));
    assert_eq!(code, Some(0), "{stderr}");
}

/// A `sita` band above every worker's window is a located error at `--check`, not a panic
/// when the first long request comes.
#[test]
fn check_refuses_sita_cut_offs_the_workers_cannot_serve() {
    let two = "workers:\n  - {name: a, base_url: \"http://127.0.0.1:9\", model: m, context_window: 4096}\n  - {name: b, base_url: \"http://127.0.0.1:8\", model: m, context_window: 32768}\n";
    let (code, _, stderr) = check_config(&format!("policy: \"sita:40000\"\n{two}"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("policy.chooser.cutoffs") && stderr.contains("32768-token workers"),
        "{stderr}"
    );
    // Two cut-offs for two windows: three bands, two classes.
    let (code, _, stderr) = check_config(&format!("policy: \"sita:1000,2000\"\n{two}"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("at most 1 cut-off"), "{stderr}");
    let (code, _, stderr) = check_config(&format!("policy: \"sita:2000\"\n{two}"));
    assert_eq!(code, Some(0), "{stderr}");
}

/// A chat request with `session` in the header `x-session-id` (none: no header).
async fn chat_with_session(
    c: &HttpClient,
    chat: &str,
    session: Option<&str>,
    body: String,
) -> Answer {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(chat)
        .header("content-type", "application/json");
    if let Some(s) = session {
        b = b.header("x-session-id", s);
    }
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        c.request(b.body(Full::new(body.into())).unwrap()),
    )
    .await
    .expect("response within 20 s")
    .expect("request sent");
    let (parts, body) = r.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_huge_session_key_is_a_400_naming_it() {
    let [w] = fakes(0.0).await;
    let gateway = serve(
        "seed-v3",
        "sessions: {header: x-session-id, max_key_bytes: 64}",
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let ok = chat_with_session(&c, &chat, Some("conv-1"), chat_body("m", "hi", 4, false)).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    // No header, no user: the prefix chain or no session; served either way.
    let ok = chat_with_session(&c, &chat, None, chat_body("m", "hi", 4, false)).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());

    let e = assert_openai_error(
        &chat_with_session(&c, &chat, Some(""), chat_body("m", "hi", 4, false)).await,
        400,
    );
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("header x-session-id") && m.contains("got 0 bytes"),
        "{e}"
    );
    let huge = "s".repeat(65);
    let e = assert_openai_error(
        &chat_with_session(&c, &chat, Some(&huge), chat_body("m", "hi", 4, false)).await,
        400,
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("at most 64 bytes (got 65"),
        "{e}"
    );

    // The body's `user` field, when no header is sent.
    let with_user = |u: serde_json::Value| {
        let mut b: serde_json::Value =
            serde_json::from_str(&chat_body("m", "hi", 4, false)).unwrap();
        b["user"] = u;
        b.to_string()
    };
    let ok = chat_with_session(&c, &chat, None, with_user("alice".into())).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let e = assert_openai_error(
        &chat_with_session(&c, &chat, None, with_user("u".repeat(100).into())).await,
        400,
    );
    assert_eq!(e["param"], "user", "{e}");
    let e = assert_openai_error(
        &chat_with_session(&c, &chat, None, with_user(serde_json::json!(42))).await,
        400,
    );
    assert_eq!(
        (e["param"].as_str(), e["message"].as_str()),
        (Some("user"), Some("`user` must be a string"))
    );
    // Every refusal came before a worker was asked.
    assert_eq!(w.requests(), 3);
}
