//! Issue 42, item 10 and defect 9: what the gateway refuses from a configuration and from a
//! client, each the probe's repro, and what `--check` says of a composition's cap.

use crate::harness::*;
use hyper::{Method, StatusCode};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A configuration with one worker named `name` (as YAML text) and `extra` top-level lines.
fn one_worker(extra: &str, name: &str) -> String {
    format!(
        "{extra}\nworkers:\n  - {{name: {name}, base_url: \"http://127.0.0.1:9\", model: m, context_window: 4096}}\n"
    )
}

/// A gateway without workers (`extra`: top-level lines).
async fn no_workers(extra: &str) -> Gateway {
    Gateway::start(&format!(
        "listen: 127.0.0.1:0\npolicy: least-load\nadmin_token: {TOKEN}\nhealth: {{interval_s: 0}}\n{extra}\nworkers: []\n"
    ))
    .await
}

/// An `admin_token` of three characters was accepted, and redaction then rewrote every log
/// line containing them (`tok_s` logged as `<redacted>_s`): `--check` refuses it (exit 2),
/// naming the field and the shortest length, without printing the token.
#[test]
fn check_refuses_an_admin_token_too_short_to_be_a_secret() {
    let (code, _, stderr) = check_config(&one_worker("admin_token: zq9", "a"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("admin_token"), "{stderr}");
    assert!(stderr.contains("at least 12 characters"), "{stderr}");
    // Twelve characters pass.
    let (code, _, stderr) = check_config(&one_worker("admin_token: abcdefghijkl", "a"));
    assert_eq!(code, Some(0), "{stderr}");
}

/// Workers named `.` and `..` were accepted and then unreachable from the admin page (their
/// URL path segments resolve away): refused at `--check` and by the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_names_dot_and_dot_dot_are_refused() {
    for name in ["\".\"", "\"..\""] {
        let (code, _, stderr) = check_config(&one_worker(&format!("admin_token: {TOKEN}"), name));
        assert_eq!(code, Some(2), "{name}: {stderr}");
        assert!(stderr.contains("workers[0].name"), "{name}: {stderr}");
    }
    let gateway = no_workers("").await;
    let Gateway { base, c, .. } = &gateway;
    for name in [".", ".."] {
        let body = serde_json::json!({"name": name, "base_url": "http://127.0.0.1:9", "model": "m", "context_window": 4096});
        let a = send(
            c,
            Method::POST,
            &format!("{base}/admin/workers"),
            Some(TOKEN),
            body.to_string(),
        )
        .await;
        let e = assert_openai_error(&a, 400);
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("cannot be a path segment"), "{name}: {e}");
    }
}

/// A U+202E (right-to-left override) in `health.path` passed `--check`; every path the gateway
/// requests from a worker now follows one rule, which refuses control and bidirectional
/// characters.
#[test]
fn check_refuses_a_bidirectional_control_in_the_health_path() {
    let (code, _, stderr) = check_config(&one_worker(
        &format!("admin_token: {TOKEN}\nhealth: {{path: \"/hea\u{202e}lth\"}}"),
        "a",
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("health.path"), "{stderr}");
    assert!(stderr.contains("bidirectional"), "{stderr}");
}

/// Defect 9: `policy: equal/p2c` carries a per-worker cap of 24 that neither `--check`,
/// `/admin` nor the README stated. `--check` names the composition with its cap.
#[test]
fn check_names_the_composition_and_its_cap() {
    let (code, stdout, stderr) = check_config(&one_worker(
        &format!("admin_token: {TOKEN}\npolicy: equal/p2c"),
        "a",
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("flat:24"), "stdout: {stdout}");
}

/// Send `head` (a whole request head, CRLFs included) on a fresh connection and return the
/// status line's code.
async fn raw_status(addr: std::net::SocketAddr, head: &str) -> u16 {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"))
}

/// `Host: a b` was accepted (RFC 9112 §3.2: an invalid Host is a 400), and so were two
/// `Authorization` headers (which one a worker or the admin door reads is anyone's guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_host_and_a_duplicate_authorization_are_400() {
    let gateway = no_workers("").await;
    let addr = gateway.gw.local_addr();
    let ok = "GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_status(addr, ok).await, 200);
    for head in [
        "GET /health HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: user@gw\r\nConnection: close\r\n\r\n",
        "GET /admin/workers HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer secret-token\r\nAuthorization: Bearer other\r\nConnection: close\r\n\r\n",
        "POST /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: a\r\nAuthorization: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ] {
        assert_eq!(raw_status(addr, head).await, 400, "{head:?}");
    }
    // One Authorization still opens the admin API.
    let one = "GET /admin/workers HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer secret-token\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_status(addr, one).await, 200);
}

/// `/v1` accepted `text/plain` and form-encoded POSTs, which a browser sends cross-origin
/// without a preflight: they are 415 now, before any routing; JSON (with or without a
/// charset) and a body without a content type still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_posts_that_are_not_json_are_415() {
    let gateway = no_workers("").await;
    let Gateway { chat, c, .. } = &gateway;
    let body = chat_body("m", "hi", 4, false);
    for ct in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let req = hyper::Request::builder()
            .method(Method::POST)
            .uri(chat.as_str())
            .header("content-type", ct)
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let r = c.request(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
    }
    for ct in [
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        None,
    ] {
        let mut req = hyper::Request::builder()
            .method(Method::POST)
            .uri(chat.as_str());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let r = c.request(req).await.unwrap();
        // No worker serves `m`: past the content type, the request is routed and refused there.
        assert_ne!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
    }
}

/// No aggregate cap on buffered bodies: 40 × 32 MiB held 800 MB. With
/// `max_buffered_body_bytes`, a body that would take the bodies held at once past it is 503
/// (`too_many_buffered_bodies`, `Retry-After`) while another holds the budget, and passes once
/// that one lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_aggregate_cap_are_503_until_the_budget_is_free() {
    let gateway = no_workers("max_body_bytes: 1048576\nmax_buffered_body_bytes: 1048576").await;
    let addr = gateway.gw.local_addr();
    // 600 KB of a 700 KB body, the rest never sent: held while it is read.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 700000\r\n\r\n{}",
        " ".repeat(600_000)
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let big = format!(
        "{}{}",
        " ".repeat(600_000),
        chat_body("m", "hello", 4, false)
    );
    let mut refused = String::new();
    wait_for(
        "a body past the cap refused",
        Duration::from_secs(10),
        async || {
            refused = raw_post(addr, &big).await;
            refused.starts_with("HTTP/1.1 503")
        },
    )
    .await;
    assert!(refused.contains("too_many_buffered_bodies"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1\r\n"),
        "{refused}"
    );
    drop(slow);
    // The held body is given back: the same request is routed (and refused there, as no worker
    // serves `m`).
    wait_for(
        "the budget given back",
        Duration::from_secs(10),
        async || !raw_post(addr, &big).await.starts_with("HTTP/1.1 503"),
    )
    .await;
    // One body past max_body_bytes is still a 413, not a 503. Sent raw: the gateway answers
    // from the Content-Length and closes while a client is still writing the megabyte, which
    // an HTTP client reports as a broken pipe instead of the answer (a regression seen in CI).
    let huge = " ".repeat(1_048_577);
    let mut answer = String::new();
    wait_for(
        "a body past max_body_bytes refused with 413",
        Duration::from_secs(10),
        async || {
            answer = raw_post(addr, &huge).await;
            !answer.is_empty()
        },
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("request_too_large"), "{answer}");
}

/// POST `body` to the chat endpoint on a fresh connection, whatever the gateway does with the
/// rest of it (a refusal may come before the body is sent), and return the whole answer.
async fn raw_post(addr: std::net::SocketAddr, body: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = tcp.write_all(head.as_bytes()).await;
    let _ = tcp.write_all(body.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// `max_buffered_body_bytes` below `max_body_bytes` would refuse every large body: `--check`
/// says so, naming the field.
#[test]
fn check_refuses_a_body_budget_smaller_than_one_body() {
    let (code, _, stderr) = check_config(&one_worker(
        &format!("admin_token: {TOKEN}\nmax_body_bytes: 2048\nmax_buffered_body_bytes: 1024"),
        "a",
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("max_buffered_body_bytes"), "{stderr}");
}

/// One hanging `/metrics` delayed every worker's poll (each report waited for the slowest page,
/// up to the timeout), and `stale_after_s` was not enforced between rounds. Each page is now
/// recorded as it arrives, and a report older than `stale_after_s` ages out while its worker's
/// poll still hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_metrics_page_delays_only_its_own_worker() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let hang = std::sync::Arc::new(AtomicBool::new(false));
    let h = hang.clone();
    let good_app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let h = h.clone();
            async move {
                if h.load(SeqCst) {
                    std::future::pending::<()>().await;
                }
                "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"0\"} 0\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"
            }
        }),
    );
    // A peer that accepts and never answers.
    let hanging_app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async { std::future::pending::<&str>().await }),
    );
    let mut urls = Vec::new();
    let mut servers = Vec::new();
    for app in [good_app, hanging_app] {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", l.local_addr().unwrap()));
        servers.push(tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        }));
    }
    let gateway = serve(
        "least-load",
        "engine_metrics: {interval_s: 0.2, timeout_s: 60, stale_after_s: 1}\nhealth: {interval_s: 0}",
        &[
            worker("good", &urls[0], "m", &[], 32768),
            worker("hanging", &urls[1], "m", &[], 32768),
        ],
    )
    .await;
    let Gateway { base, c, .. } = &gateway;
    let state = async |name: &str| {
        admin_worker(c, base, name).await["signals"]["engine_metrics"]["state"].clone()
    };
    // Well within the hanging page's 60 s timeout.
    wait_for(
        "the good worker's report",
        Duration::from_secs(10),
        async || state("good").await == "live",
    )
    .await;
    assert_eq!(state("hanging").await, "waiting");
    // Now the good worker's page hangs too: its report ages out after 1 s, while both polls
    // are still out.
    hang.store(true, SeqCst);
    let hung_at = std::time::Instant::now();
    wait_for(
        "the report to age out",
        Duration::from_secs(10),
        async || state("good").await == "stale",
    )
    .await;
    assert!(hung_at.elapsed() < Duration::from_secs(10));
    for s in servers {
        s.abort();
    }
}

/// Item 10: a prompt too long for `/v1/completions` was refused with `param: "messages"`, a
/// field that endpoint does not have: it names `prompt` there (and `messages` on chat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_names_the_field_that_held_it() {
    let w = crate::fake::FakeWorker::start(0.0).await;
    let gateway = serve(
        "seed-v3",
        "health: {interval_s: 0}",
        &[worker("w", &w.url, "m", &[], 1000)],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    // 6,000 bytes ≈ 1,500 tokens > the 1,000-token window.
    let long = "x".repeat(6000);
    let body = serde_json::json!({"model": "m", "prompt": long, "max_tokens": 4}).to_string();
    let a = send(
        &c,
        Method::POST,
        &format!("{base}/v1/completions"),
        None,
        body,
    )
    .await;
    let e = assert_openai_error(&a, 400);
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("context_length_exceeded"), Some("prompt")),
        "{e}"
    );
    let a = post_chat(&c, &chat, &long, 4, false).await;
    let e = assert_openai_error(&a, 400);
    assert_eq!(e["param"], "messages", "{e}");
    assert_eq!(w.requests(), 0);
}

/// Item 10: a chat template that is not a Jinja template was an error at
/// `models[0].tokenizer`; it is the template's (`models[0].chat_template`), and a tokenizer
/// that cannot load stays the tokenizer's.
#[test]
fn a_broken_chat_template_is_located_at_the_chat_template() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data/tokenizers/smollm2-135m-instruct");
    let dir = temp_dir("template");
    let template = dir.join("broken.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m.content }}").unwrap();
    let models = |tokenizer: &std::path::Path| {
        format!(
            "models:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}",
            tokenizer.display(),
            template.display()
        )
    };
    let (code, _, stderr) = check_config(&one_worker(&models(&data.join("tokenizer.json")), "a"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("models[0].chat_template") && stderr.contains("not a Jinja template"),
        "{stderr}"
    );
    let junk = dir.join("tokenizer.json");
    std::fs::write(&junk, "{not a tokenizer").unwrap();
    let (code, _, stderr) = check_config(&one_worker(&models(&junk), "a"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("models[0].tokenizer"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
