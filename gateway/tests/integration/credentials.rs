//! Issue 42, item 10: worker credentials. A worker's `api_key_file` gives the key every call
//! to it carries (`Authorization: Bearer <key>`): requests, probe bursts, health checks and
//! `/metrics` polls; a bad file is a located error at `--check`; the key is never shown.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

const SECS_10: Duration = Duration::from_secs(10);

/// A worker entry with `api_key_file: key_file`.
fn keyed_worker(name: &str, url: &str, key_file: &str) -> String {
    format!(
        "{}    api_key_file: \"{key_file}\"\n",
        worker(name, url, "m", &[], 32768)
    )
}

/// Each worker needs its own key, as vLLM or SGLang started with `--api-key` does (a 401
/// without it): with `api_key_file` every kind of call reaches both, and nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_to_a_worker_carries_its_own_key() {
    let [a, b, late] = fakes(1000.0).await;
    let dir = temp_dir("keys");
    let keys = [
        ("a", "key-of-worker-a-0123456789"),
        ("b", "key-of-worker-b-9876543210"),
        ("late", "key-of-worker-late-55555"),
    ];
    for ((name, key), w) in keys.iter().zip([&a, &b, &late]) {
        *w.state.api_key.lock().unwrap() = Some(key.to_string());
        w.state
            .metrics
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // A final line break, as `echo key > file` writes it, is not part of the key.
        std::fs::write(dir.join(name), format!("{key}\n")).unwrap();
    }
    let file = |n: &str| dir.join(n).display().to_string();
    let gateway = serve(
        "{preset: seed-v3, weights: {kind: probe, concurrency: 2, output_tokens: 8, warmup: false}}",
        "probe: {poll_interval_s: 0.05}\nhealth: {interval_s: 0.05}\nengine_metrics: {poll: on, interval_s: 0.1}",
        &[
            keyed_worker("a", &a.url, &file("a")),
            keyed_worker("b", &b.url, &file("b")),
        ],
    )
    .await;
    let Gateway { base, chat, c, .. } = gateway;
    wait_for("both workers measured", SECS_10, async || {
        admin_worker(&c, &base, "a").await["provenance"] == "measured"
            && admin_worker(&c, &base, "b").await["provenance"] == "measured"
    })
    .await;
    for i in 0..6 {
        let r = post_chat(&c, &chat, &format!("hello {i}"), 4, i % 2 == 0).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    // A worker added through the admin API reads its file too.
    let add = format!(
        r#"{{"name":"late","base_url":"{}","model":"late-m","context_window":4096,"api_key_file":"{}"}}"#,
        late.url,
        file("late")
    );
    let r = send(
        &c,
        Method::POST,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        add,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = send(
        &c,
        Method::POST,
        &chat,
        None,
        chat_body("late-m", "hi", 3, false),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    wait_for(
        "health checks and metrics polls on both",
        SECS_10,
        async || {
            [&a, &b].iter().all(|w| {
                let seen = w.state.authorized.lock().unwrap();
                seen.contains("/health") && seen.contains("/metrics")
            })
        },
    )
    .await;
    for (w, name) in [(&a, "a"), (&b, "b")] {
        let seen = w.state.authorized.lock().unwrap().clone();
        assert!(seen.contains("/v1/chat/completions"), "{name}: {seen:?}");
        assert!(w.probe_requests() > 0, "{name}");
        assert_eq!(
            w.state.refused.load(SeqCst),
            0,
            "{name}: a call without its key"
        );
    }
    assert_eq!(a.requests() + b.requests(), 6);
    assert_eq!(late.state.refused.load(SeqCst), 0);
    assert_eq!(late.requests(), 1);
    // Never shown: not in the admin API's answers, nor in the metrics.
    let admin = send(
        &c,
        Method::GET,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        "",
    )
    .await
    .text();
    let metrics = send(&c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text();
    for (_, key) in keys {
        assert!(
            !admin.contains(key) && !metrics.contains(key),
            "{key} shown"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without the key, the same worker refuses: the fake holds the gateway to what an engine
/// with `--api-key` does, so the test above could fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_key_a_keyed_worker_answers_401() {
    let w = FakeWorker::start(0.0).await;
    *w.state.api_key.lock().unwrap() = Some("the-engines-key-123".into());
    let gateway = serve(
        "seed-v3",
        "health: {interval_s: 0}",
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    let Gateway { chat, c, .. } = gateway;
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(w.state.refused.load(SeqCst) >= 1);
}

/// `--check` on `g.yaml` in `dir` (whose worker names `api_key_file: key`, relative to the
/// file): exit code, stdout and stderr.
fn check_in(dir: &std::path::Path) -> (Option<i32>, String, String) {
    let yaml = format!(
        "listen: 127.0.0.1:0\npolicy: seed-v3\nworkers:\n{}",
        keyed_worker("w", "http://127.0.0.1:9", "key")
    );
    std::fs::write(dir.join("g.yaml"), yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_routelab-gateway"))
        .arg("--config")
        .arg(dir.join("g.yaml"))
        .arg("--check")
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A missing, empty, over-long, multi-line or unreadable key file is an error at
/// `workers[0].api_key_file` naming the file and what is wrong, never quoting what it holds;
/// a good one, found relative to the configuration file, passes without being printed.
#[test]
fn check_locates_a_bad_api_key_file_and_never_prints_a_key() {
    let dir = temp_dir("keycheck");
    let key = dir.join("key");
    let (code, _, stderr) = check_in(&dir);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("workers[0].api_key_file") && stderr.contains("cannot read"),
        "{stderr}"
    );
    let secretish = "sk-first-line-of-a-secret";
    for (content, why) in [
        (String::new(), "is empty"),
        ("\n".into(), "is empty"),
        ("x".repeat(5000), "bytes long"),
        (format!("{secretish}\nsecond-line"), "more than one line"),
        (format!("{secretish} with spaces"), "a space"),
    ] {
        std::fs::write(&key, &content).unwrap();
        let (code, stdout, stderr) = check_in(&dir);
        assert_eq!(code, Some(2), "{why}: {stderr}");
        assert!(
            stderr.contains("workers[0].api_key_file") && stderr.contains(why),
            "{why}: {stderr}"
        );
        assert!(stderr.contains("key`"), "names the file: {stderr}");
        assert!(
            !stderr.contains(secretish) && !stdout.contains(secretish),
            "{stderr}"
        );
    }
    // A directory where the file should be.
    std::fs::remove_file(&key).unwrap();
    std::fs::create_dir(&key).unwrap();
    let (code, _, stderr) = check_in(&dir);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is not a file"), "{stderr}");
    std::fs::remove_dir(&key).unwrap();
    // A good one, relative to the configuration's directory.
    std::fs::write(&key, format!("{secretish}\n")).unwrap();
    let (code, stdout, stderr) = check_in(&dir);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !stdout.contains(secretish) && !stderr.contains(secretish),
        "{stdout}{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
