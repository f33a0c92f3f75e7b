//! The admin page (`GET /admin`) driven in a real headless Chromium through chromedriver's W3C
//! WebDriver HTTP API (the client is `routelab-testkit`'s, shared with the lab's report test).
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them). Every
//! wait is bounded; chromedriver listens on 127.0.0.1 only and is killed, with the browser it
//! started, when the test ends or fails.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use routelab_testkit::{Browser, ChromeDriver};
use std::time::Duration;

const SECS_20: Duration = Duration::from_secs(20);

/// Open `/admin#token=…` with two workers behind a probe policy, pin worker a to 1.5 from the
/// page, and see the pinned weight and provenance both on the page and in `/admin/workers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_pins_a_weight_in_a_real_browser() {
    let a = FakeWorker::start(1000.0).await;
    let b = FakeWorker::start(500.0).await;
    // a publishes KV events (b does not, though the policy reads them); the gateway polls the
    // workers' /metrics, which the fakes do not serve.
    let publ = routelab_gateway::kv::publisher::start("127.0.0.1", "", 16)
        .await
        .unwrap();
    let mut wa = worker("a", &a.url, "m", &[], 32768);
    wa.push_str(&format!(
        "    kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\"}}\n",
        publ.endpoint(),
        publ.replay_endpoint()
    ));
    let gateway = serve(
        "{preset: seed-v3, weights: {kind: probe, concurrency: 4, output_tokens: 32, warmup: true}, prefix_knowledge: kv-events}",
        "probe: {poll_interval_s: 0.05}\nengine_metrics: {poll: on, interval_s: 0.5}",
        &[wa, worker("b", &b.url, "m", &[], 32768)],
    )
    .await;
    let Gateway { base, c, .. } = gateway;

    // The shell is public and carries no data; the data is behind the token.
    let shell = send(&c, Method::GET, &format!("{base}/admin"), None, "").await;
    assert_eq!(shell.status, StatusCode::OK);
    assert!(
        !shell.text().contains(&a.url),
        "the shell holds no worker data"
    );
    let api = send(&c, Method::GET, &format!("{base}/admin/workers"), None, "").await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);

    let driver = ChromeDriver::start().await;
    // The page must fit a 1,280 px window.
    let browser = Browser::open(&driver, (1280, 800)).await;
    browser.go(&format!("{base}/admin#token={TOKEN}")).await;
    wait_for("both workers measured, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="a"] .provenance"#)
            .await
            .as_deref()
            == Some("measured")
            && browser
                .text(r#"tr[data-worker="b"] .provenance"#)
                .await
                .as_deref()
                == Some("measured")
    })
    .await;
    assert_eq!(
        browser
            .text(r#"tr[data-worker="a"] .model"#)
            .await
            .as_deref(),
        Some("m")
    );
    // The signals column: a's stream live, b's missing (the policy reads KV events, b has no
    // stream), the metrics poll waiting (the fakes serve no /metrics), tokens estimated.
    wait_for("a's KV stream live, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="a"] .kv-state .badge"#)
            .await
            .as_deref()
            == Some("live")
    })
    .await;
    for (sel, want) in [
        (r#"tr[data-worker="b"] .kv-state .badge"#, "missing"),
        (r#"tr[data-worker="a"] .metrics-state .badge"#, "waiting"),
        (r#"tr[data-worker="a"] .tokens .badge"#, "estimate"),
    ] {
        assert_eq!(browser.text(sel).await.as_deref(), Some(want), "{sel}");
    }
    // The history: three sparklines per worker, drawn once samples came (every 2 s).
    wait_for("two history samples of a", SECS_20, async || {
        browser
            .execute(
                r#"return Number(document.querySelector('tr[data-worker="a"] .spark-weight').dataset.samples);"#,
                vec![],
            )
            .await
            .ok()
            .and_then(|v| v.as_f64())
            .is_some_and(|n| n >= 2.0)
    })
    .await;
    let sparks = browser
        .execute(
            r#"return Array.from(document.querySelectorAll('tr[data-worker="a"] td.history polyline')).map(p => p.getAttribute('points').split(' ').length);"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(sparks.as_array().map(Vec::len), Some(3), "{sparks}");
    assert!(
        sparks[2].as_u64().unwrap() >= 2,
        "the weight line has points: {sparks}"
    );
    // Nothing is cut off or scrolls sideways: the page, the table's panel and the actions
    // column all end within the window.
    let fit = browser
        .execute(
            r#"const p = document.querySelector('.panel');
               const right = Math.max(...Array.from(document.querySelectorAll('td.actions-cell, th')).map(e => e.getBoundingClientRect().right));
               return {inner: window.innerWidth, page: document.documentElement.scrollWidth,
                       panel: p.scrollWidth, panel_client: p.clientWidth, right: right};"#,
            vec![],
        )
        .await
        .unwrap();
    let n = |k: &str| fit[k].as_f64().unwrap();
    assert!(n("inner") <= 1280.0, "{fit}");
    assert!(n("page") <= n("inner"), "the page scrolls sideways: {fit}");
    assert!(
        n("panel") <= n("panel_client"),
        "the table scrolls in its panel: {fit}"
    );
    assert!(
        n("right") <= n("inner"),
        "the actions column is cut off: {fit}"
    );

    // The token left the address bar as soon as the page had it.
    let url = browser.url().await;
    assert!(!url.contains(TOKEN), "{url}");

    browser
        .type_into(r#"tr[data-worker="a"] input.pin-weight"#, "1.5")
        .await;
    browser
        .click(r#"tr[data-worker="a"] button[data-action="pin"]"#)
        .await;
    wait_for("the page shows a pinned at 1.5", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="a"] .weight"#)
            .await
            .as_deref()
            == Some("1.5")
            && browser
                .text(r#"tr[data-worker="a"] .provenance"#)
                .await
                .as_deref()
                == Some("pinned")
    })
    .await;
    assert_eq!(
        browser
            .text(r#"tr[data-worker="a"] .row-error"#)
            .await
            .as_deref(),
        Some(""),
        "no error shown"
    );
    let w = admin_worker(&c, &base, "a").await;
    assert_eq!(
        (w["weight"].as_f64(), w["provenance"].as_str()),
        (Some(1.5), Some("pinned"))
    );
    assert_eq!(
        admin_worker(&c, &base, "b").await["provenance"],
        "measured",
        "b untouched"
    );

    // An action the API refuses shows the API's own message in the row.
    browser
        .type_into(r#"tr[data-worker="b"] input.pin-weight"#, "-1")
        .await;
    browser
        .click(r#"tr[data-worker="b"] button[data-action="pin"]"#)
        .await;
    let mut shown = String::new();
    wait_for("the refused pin's error in b's row", SECS_20, async || {
        shown = browser
            .text(r#"tr[data-worker="b"] .row-error"#)
            .await
            .unwrap_or_default();
        !shown.is_empty()
    })
    .await;
    assert!(shown.starts_with("pin: 400: "), "{shown}");
    assert!(
        shown.len() > "pin: 400: ".len(),
        "the API's message: {shown}"
    );
    assert_eq!(
        admin_worker(&c, &base, "b").await["provenance"],
        "measured",
        "the refused pin changed nothing"
    );

    // Drain from the page: the state follows, and the row offers undrain instead of drain.
    browser
        .click(r#"tr[data-worker="b"] button[data-action="drain"]"#)
        .await;
    wait_for("b draining, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="b"] .state"#)
            .await
            .as_deref()
            == Some("draining")
    })
    .await;
    assert_eq!(admin_worker(&c, &base, "b").await["state"], "draining");
    assert!(
        browser
            .displayed(r#"tr[data-worker="b"] button[data-action="undrain"]"#)
            .await
    );
    assert!(
        !browser
            .displayed(r#"tr[data-worker="b"] button[data-action="drain"]"#)
            .await
    );

    // ... and undrain puts it back in service.
    browser
        .click(r#"tr[data-worker="b"] button[data-action="undrain"]"#)
        .await;
    wait_for("b up again, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="b"] .state"#)
            .await
            .as_deref()
            == Some("up")
    })
    .await;
    let b = admin_worker(&c, &base, "b").await;
    assert_eq!(
        (b["state"].as_str(), b["drained"].as_bool()),
        (Some("up"), Some(false))
    );
    assert!(
        browser
            .displayed(r#"tr[data-worker="b"] button[data-action="drain"]"#)
            .await
    );

    // A token typed into the password field replaces the session's; a wrong one gets the API's
    // 401 message on the page.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#token-save").await;
    wait_for("the 401 message on the page", SECS_20, async || {
        browser
            .text("#error")
            .await
            .is_some_and(|t| t.starts_with("401: ") && t.contains("Bearer"))
    })
    .await;
    // ... and stops polling with it instead of failing once a second
    assert_eq!(
        browser.text("#status").await.as_deref(),
        Some("token rejected: enter the admin token")
    );

    if let Some(path) = std::env::var_os("ROUTELAB_ADMIN_SCREENSHOT") {
        browser.screenshot(std::path::Path::new(&path)).await;
    }
    browser.close().await;
    drop(publ);
}
