//! Operations: pins that fail closed and stay in range, the state file's validation, admin
//! authentication, undrain, ejection on a refused health check, the admin list's fields and the
//! rejection counter (issue 13, defects 5, 6, 7, 9 and 10).

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use std::time::Duration;

const SECS_10: Duration = Duration::from_secs(10);

/// A probe policy whose weight clamp is [0.5, 4] (not the default [0.25, 8]), so a test can see
/// that the pin range is read from the policy.
const PROBE_CLAMPED: &str = "{preset: seed-v3, weights: {kind: probe, clamp: [0.5, 4]}}";

async fn pin(c: &HttpClient, base: &str, name: &str, weight: &str) -> Answer {
    send(
        c,
        Method::POST,
        &format!("{base}/admin/workers/{name}/pin"),
        Some(TOKEN),
        format!(r#"{{"weight": {weight}}}"#),
    )
    .await
}

async fn admin_post(c: &HttpClient, base: &str, path: &str) -> Answer {
    send(
        c,
        Method::POST,
        &format!("{base}/admin/workers/{path}"),
        Some(TOKEN),
        "",
    )
    .await
}

/// The status of a GET of `url` with this `authorization` header (none if `None`), sent as it
/// is, without the `Bearer` that [`send`] adds.
async fn status_with_authorization(
    c: &HttpClient,
    url: &str,
    authorization: Option<String>,
) -> StatusCode {
    let mut b = hyper::Request::get(url);
    if let Some(v) = authorization {
        b = b.header("authorization", v);
    }
    let r = tokio::time::timeout(
        SECS_10,
        c.request(b.body(http_body_util::Full::default()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .unwrap();
    r.status()
}

/// Regression (defect 5): a pin answered 200 when the state file could not be written, and the
/// router kept the pin although it would be lost at the next restart. Now the admin call is a
/// 500 naming the path and the OS error, and the router is back at its previous pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_that_cannot_be_persisted_is_refused_and_rolled_back() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("pin-closed");
    let parent = dir.join("sub");
    std::fs::create_dir(&parent).unwrap();
    let state = parent.join("state.json");
    let Gateway { gw, base, c, .. } = serve(
        PROBE_CLAMPED,
        &format!("state_file: {}", state.display()),
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    let a = pin(&c, &base, "w", "2.0").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert!(
        std::fs::read_to_string(&state)
            .unwrap()
            .contains("\"weight\": 2.0")
    );

    // The state file's directory becomes a regular file: no write can succeed (even as root).
    // Renamed away, not deleted: the probe runner may be writing into it right now.
    std::fs::rename(&parent, dir.join("sub.old")).unwrap();
    std::fs::write(&parent, b"not a directory").unwrap();
    let a = pin(&c, &base, "w", "3.0").await;
    let e = assert_openai_error(&a, 500);
    assert_eq!(e["code"], "state_write_failed");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains(&state.display().to_string()) && message.contains("ot a directory"),
        "the message names the path and the OS error: {message}"
    );
    let row = admin_worker(&c, &base, "w").await;
    assert_eq!(
        (row["weight"].as_f64(), row["provenance"].as_str()),
        (Some(2.0), Some("pinned")),
        "rolled back to the previous pin"
    );
    // Unpinning fails closed the same way: the pin stays.
    let a = admin_post(&c, &base, "w/unpin").await;
    assert_eq!(assert_openai_error(&a, 500)["code"], "state_write_failed");
    let row = admin_worker(&c, &base, "w").await;
    assert_eq!(row["provenance"], "pinned");

    // Writable again: the next change goes through.
    std::fs::remove_file(&parent).unwrap();
    std::fs::create_dir(&parent).unwrap();
    let a = pin(&c, &base, "w", "3.0").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.json()["weight"].as_f64(), Some(3.0));
    drop(gw);
    // Best effort: a state write the gateway started may still be finishing.
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression (defect 6): out-of-range pins were clamped silently (1e9 → 8.0, 5e-324 → 0.25)
/// and the raw value was written to the state file. Now they are refused with the range read
/// from the policy's clamp, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_pins_are_refused_with_the_policys_range() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("pin-range");
    let state = dir.join("state.json");
    let Gateway { gw, base, c, .. } = serve(
        PROBE_CLAMPED,
        &format!("state_file: {}", state.display()),
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .await;
    for weight in ["1e9", "5e-324", "4.01", "0.49", "0", "-1"] {
        let a = pin(&c, &base, "w", weight).await;
        let e = assert_openai_error(&a, 400);
        assert_eq!(e["param"], "weight");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("from 0.5 to 4"),
            "{weight}: the message gives the valid range: {message}"
        );
        assert_ne!(admin_worker(&c, &base, "w").await["provenance"], "pinned");
    }
    // The probe runner may have written its measurements meanwhile, but no pin.
    if let Ok(text) = std::fs::read_to_string(&state) {
        let saved: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            saved["pins"],
            serde_json::json!([]),
            "a refused pin is not written"
        );
    }
    for weight in ["0.5", "4"] {
        let a = pin(&c, &base, "w", weight).await;
        assert_eq!(a.status, StatusCode::OK, "{weight}: {}", a.text());
        assert_eq!(a.json()["weight"].as_f64(), weight.parse().ok());
    }
    drop(gw);
    // Best effort: a state write the gateway started may still be finishing.
    let _ = std::fs::remove_dir_all(&dir);
}

/// A policy whose weights cannot be pinned answers 409 whatever the weight, rather than a range
/// that no pin could satisfy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_without_pins_refuses_every_pin_with_409() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve("seed-v1", "", &[worker("w", &w.url, "m", &[], 8192)]).await;
    let Gateway { base, c, .. } = gateway;
    for weight in ["1.5", "1e9"] {
        let a = pin(&c, &base, "w", weight).await;
        assert_eq!(assert_openai_error(&a, 409)["code"], "pins_unsupported");
    }
    assert_ne!(admin_worker(&c, &base, "w").await["provenance"], "pinned");
}

/// Regression (defect 6): a state file with a pin outside the clamp or a measurement time far in
/// the future was restored (the pin clamped, the measurement never expiring). Now each bad entry
/// is ignored (and logged) and the good ones are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_state_file_entries_are_ignored_and_valid_ones_kept() {
    let dir = temp_dir("state-validate");
    let state = dir.join("state.json");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let day_ms = 24 * 3_600_000;
    let cache = |node: &str, tp: f64, at: i64| {
        serde_json::json!({"node": node, "model": "m", "launch_args": "--x",
            "throughput_tok_s": tp, "measured_at_unix_ms": at})
    };
    let file = serde_json::json!({
        "version": 1,
        "saved_at_unix_ms": now_ms,
        "cache": [
            cache("measured", 900.0, now_ms - 2_000),
            cache("future", 900.0, now_ms + day_ms),
            cache("zero", 0.0, now_ms - 2_000),
        ],
        "pins": [
            {"node": "pinned", "model": "m", "weight": 2.0},
            {"node": "huge", "model": "m", "weight": 1e9},
            {"node": "negative", "model": "m", "weight": -1.0},
        ],
    });
    std::fs::write(&state, serde_json::to_vec(&file).unwrap()).unwrap();
    // Unreachable workers and no health checks: nothing is measured or ejected during the test,
    // so what the admin API shows comes from the state file alone.
    let dead = refused_url().await;
    let names = ["measured", "future", "zero", "pinned", "huge", "negative"];
    let workers: Vec<String> = names
        .iter()
        .map(|n| worker(n, &dead, "m", &[], 8192))
        .collect();
    let Gateway { gw, base, c, .. } = serve(
        PROBE_CLAMPED,
        &format!("state_file: {}\nhealth: {{interval_s: 0}}", state.display()),
        &workers,
    )
    .await;
    for name in ["future", "zero", "huge", "negative"] {
        let w = admin_worker(&c, &base, name).await;
        assert_eq!(w["provenance"], "default", "{name}: {w}");
        assert!(w["last_probe_tok_s"].is_null(), "{name}: {w}");
        assert!(w["last_probe_age_s"].is_null(), "{name}: {w}");
    }
    let p = admin_worker(&c, &base, "pinned").await;
    assert_eq!(
        (p["weight"].as_f64(), p["provenance"].as_str()),
        (Some(2.0), Some("pinned"))
    );
    let m = admin_worker(&c, &base, "measured").await;
    assert_eq!(m["provenance"], "measured");
    assert_eq!(m["last_probe_tok_s"].as_f64(), Some(900.0));
    let age = m["last_probe_age_s"].as_f64().unwrap();
    assert!(
        (1.5..60.0).contains(&age),
        "age of a 2 s old measurement: {age}"
    );
    drop(gw);
    // Best effort: a state write the gateway started may still be finishing.
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression (defect 7): `bearer`/`BEARER` were refused although RFC 7235 §2.1 makes the scheme
/// case-insensitive. Wrong schemes and tokens stay refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_bearer_scheme_is_case_insensitive() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve("seed-v1", "", &[worker("w", &w.url, "m", &[], 8192)]).await;
    let Gateway { base, c, .. } = gateway;
    let url = format!("{base}/admin/workers");
    let with = async |authorization| status_with_authorization(&c, &url, authorization).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        assert_eq!(
            with(Some(format!("{scheme} {TOKEN}"))).await,
            StatusCode::OK,
            "{scheme}"
        );
    }
    for refused in [
        None,
        Some(format!("Basic {TOKEN}")),
        Some("Bearer not-the-token".to_string()),
        Some(TOKEN.to_string()),
    ] {
        assert_eq!(
            with(refused.clone()).await,
            StatusCode::UNAUTHORIZED,
            "{refused:?}"
        );
    }
}

/// Regression (defect 9): there was no undrain, only remove and re-add (which loses the
/// worker's counters). Now a drained worker can be re-admitted; undraining one that is not
/// drained is a 409. The admin list says whether a worker is drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_can_be_undrained() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve("seed-v1", "", &[worker("w", &w.url, "m", &[], 8192)]).await;
    let Gateway { base, chat, c, .. } = gateway;
    assert_eq!(admin_worker(&c, &base, "w").await["drained"], false);
    let a = admin_post(&c, &base, "w/undrain").await;
    assert_eq!(assert_openai_error(&a, 409)["code"], "not_drained");

    let a = admin_post(&c, &base, "w/drain").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let row = admin_worker(&c, &base, "w").await;
    assert_eq!(
        (row["drained"].as_bool(), row["state"].as_str()),
        (Some(true), Some("draining"))
    );
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_openai_error(&r, 503);

    let a = admin_post(&c, &base, "w/undrain").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(
        (a.json()["drained"].as_bool(), a.json()["state"].as_str()),
        (Some(false), Some("up"))
    );
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.requests(), 1);
    let a = admin_post(&c, &base, "nobody/undrain").await;
    assert_eq!(assert_openai_error(&a, 404)["code"], "worker_not_found");
}

/// Regression (defect 9): a health check that got "connection refused" counted as one soft
/// failure, so a dead worker stayed up for `unhealthy_after` intervals (~15 s by default). Now
/// it is ejected at the first such check, as a refused request already was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_health_check_ejects_at_once() {
    let dead = refused_url().await;
    // 1000 soft failures at 50 ms would take 50 s: only the hard-failure rule ejects in time.
    let gateway = serve(
        "seed-v1",
        // Panic mode off: with one worker, an ejection would otherwise route to it anyway.
        "health: {interval_s: 0.05, unhealthy_after: 1000, panic_threshold_percent: 0}",
        &[worker("dead", &dead, "m", &[], 8192)],
    )
    .await;
    let Gateway { base, c, .. } = gateway;
    wait_for(
        "the refused worker's ejection",
        Duration::from_secs(3),
        async || admin_worker(&c, &base, "dead").await["state"] == "disconnected",
    )
    .await;
    assert_eq!(admin_worker(&c, &base, "dead").await["ejected"], true);
}

/// Regression (defect 10): rejections the gateway answers itself were not counted. Now every
/// `ApiError` answer is counted by status and code in one place, whichever handler made it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_counted_by_status_and_code() {
    let w = FakeWorker::start(0.0).await;
    let gateway = serve("seed-v1", "", &[worker("w", &w.url, "m", &[], 8192)]).await;
    let Gateway { base, chat, c, .. } = gateway;
    let metrics = async || {
        send(&c, Method::GET, &format!("{base}/metrics"), None, "")
            .await
            .text()
    };
    let m = metrics().await;
    assert!(
        m.contains("# TYPE routelab_gateway_rejections_total counter\n"),
        "{m}"
    );
    assert!(!m.contains("code=\"model_not_found\""), "{m}");
    for _ in 0..2 {
        let r = send(
            &c,
            Method::POST,
            &chat,
            None,
            chat_body("nope", "hi", 4, false),
        )
        .await;
        assert_eq!(assert_openai_error(&r, 404)["code"], "model_not_found");
    }
    let r = send(&c, Method::GET, &format!("{base}/admin/workers"), None, "").await;
    assert_openai_error(&r, 401);
    let r = post_chat(&c, &chat, "hi", 4, false).await;
    assert_eq!(r.status, StatusCode::OK);
    let m = metrics().await;
    for line in [
        "routelab_gateway_rejections_total{status=\"404\",code=\"model_not_found\"} 2\n",
        "routelab_gateway_rejections_total{status=\"401\",code=\"invalid_api_key\"} 1\n",
    ] {
        assert!(m.contains(line), "missing {line:?} in\n{m}");
    }
    assert_eq!(
        m.matches("routelab_gateway_rejections_total{").count(),
        2,
        "a success is not a rejection:\n{m}"
    );
}

/// The real binary's log (stderr): a refused admin call is logged with its path and reason and
/// never with the token, the configured one or the one sent; each ignored state-file entry is
/// logged with its key and reason. Regression (defects 6, 7): neither was logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_reports_refused_admin_calls_and_ignored_state_entries_without_secrets() {
    let w = FakeWorker::start(0.0).await;
    let dir = temp_dir("oplog");
    let state = dir.join("state.json");
    std::fs::write(
        &state,
        r#"{"version": 1, "saved_at_unix_ms": 0, "cache": [],
            "pins": [{"node": "w", "model": "m", "weight": -3.0}]}"#,
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let yaml = config(
        "seed-v3",
        &format!("state_file: {}", state.display()),
        &[worker("w", &w.url, "m", &[], 8192)],
    )
    .replace("listen: 127.0.0.1:0", &format!("listen: 127.0.0.1:{port}"));
    let file = dir.join("gateway.yaml");
    std::fs::write(&file, yaml).unwrap();
    let log_path = dir.join("stderr.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_routelab-gateway"))
        .arg("--config")
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("the gateway binary starts");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_for("the gateway to start", SECS_10, async || {
        log().contains("event=started")
    })
    .await;
    let c = client();
    let url = format!("http://127.0.0.1:{port}/admin/workers");
    const SENT: &str = "guessed-token-4711";
    for (authorization, reason) in [
        (None, "reason=missing"),
        (Some(format!("Basic {SENT}")), "reason=wrong_scheme"),
        (Some(format!("Bearer {SENT}")), "reason=wrong_token"),
    ] {
        assert_eq!(
            status_with_authorization(&c, &url, authorization).await,
            StatusCode::UNAUTHORIZED
        );
        wait_for(reason, SECS_10, async || {
            log()
                .lines()
                .any(|l| l.contains("event=admin_auth_failed") && l.contains(reason))
        })
        .await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let text = log();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("event=admin_auth_failed"))
        .collect();
    assert_eq!(refused.len(), 3, "{text}");
    assert!(
        refused.iter().all(|l| l.contains("path=/admin/workers")),
        "{text}"
    );
    assert!(
        !text.contains(SENT) && !text.contains(TOKEN),
        "a secret in the log:\n{text}"
    );
    let ignored = text
        .lines()
        .find(|l| l.contains("event=state_entry_ignored"))
        .unwrap_or_else(|| panic!("no state_entry_ignored in\n{text}"));
    assert!(
        ignored.contains("key=w/m") && ignored.contains("reason=\"weight -3 is out of range"),
        "{ignored}"
    );
    // Best effort: a state write the gateway started may still be finishing.
    let _ = std::fs::remove_dir_all(&dir);
}
