//! Decisions that explain themselves, end to end: the request log's `decision`, the
//! `x-routelab-decision` header a client asks for with `x-routelab-explain`, and
//! `routelab_decisions_total`. The scores shown are the router's own: a router of the same
//! policy crate, given the same fleet, computes the same ones again.

use crate::fake::FakeWorker;
use crate::harness::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use routelab_gateway::prompt::{self, Endpoint};
use routelab_policies::{PolicyConfig, RouteRequest, Router, Time, WorkerId, WorkerSpec};
use serde_json::Value;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

const POLICY: &str = "table/predictive/no-affinity/flat:64";
const GPUS: [&[&str]; 3] = [&["RTX 4090", "RTX 4090"], &["RTX 4090"], &[]];

/// A chat request asking (or not) for the decision; the answer's status, header and body.
async fn chat(c: &HttpClient, url: &str, body: String, ask: bool) -> (StatusCode, Option<Value>) {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    if ask {
        b = b.header("x-routelab-explain", "1");
    }
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        c.request(b.body(Full::new(Bytes::from(body))).unwrap()),
    )
    .await
    .expect("an answer within 20 s")
    .expect("sent");
    let status = r.status();
    let shown = r
        .headers()
        .get("x-routelab-decision")
        .map(|v| serde_json::from_str(v.to_str().unwrap()).expect("JSON"));
    let _ = r.into_body().collect().await;
    (status, shown)
}

/// The scores a fresh router of [`POLICY`] gives each of the three workers for `body`, as the
/// gateway's router saw them before its first decision.
fn recomputed(body: &str) -> Vec<(String, f64, f64, f64)> {
    let mut r = Router::new(PolicyConfig::from_name(POLICY).unwrap());
    r.aim_at(2.0, 0.1);
    for (i, gpus) in GPUS.iter().enumerate() {
        r.register(
            Time::ZERO,
            WorkerSpec {
                name: format!("w{i}"),
                node: format!("w{i}"),
                model: "m".into(),
                gpu_names: gpus.iter().map(|g| g.to_string()).collect(),
                context_window: 8192,
                launch_args: "--x".into(),
                cache_blocks: None,
            },
        );
    }
    let parsed = prompt::parse(body.as_bytes(), Endpoint::Chat).unwrap();
    let prefix = prompt::prefix_hashes(parsed.prompt.as_bytes());
    let req = RouteRequest {
        model: r.model_id("m").unwrap(),
        context_tokens: parsed.prompt_tokens + parsed.max_tokens.unwrap_or(0),
        prefix: &prefix,
        prompt_tokens: parsed.prompt_tokens,
        session: None,
    };
    (0..3)
        .map(|i| {
            let s = r.score_of(&req, WorkerId(i)).expect("predictive scores");
            let p = s.predicted.unwrap();
            (format!("w{i}"), s.score, p.ttft_s * 1e3, p.tpot_s * 1e3)
        })
        .collect()
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{line_start}` in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logged_and_shown_scores_are_the_ones_the_router_decided_on() {
    let fakes = [
        FakeWorker::start(500.0).await,
        FakeWorker::start(500.0).await,
        FakeWorker::start(500.0).await,
    ];
    for f in &fakes {
        f.state.natural_len.store(4, SeqCst);
    }
    let dir = temp_dir("explain");
    let path = dir.join("requests.jsonl");
    let workers: Vec<String> = (0..3)
        .map(|i| worker(&format!("w{i}"), &fakes[i].url, "m", GPUS[i], 8192))
        .collect();
    let extra = format!(
        "slo: {{ttft_s: 2, tpot_s: 0.1}}\nrequest_log: {{path: {}}}",
        path.display()
    );
    let gateway = serve(POLICY, &extra, &workers).await;
    let Gateway {
        gw,
        chat: url,
        c,
        base,
    } = gateway;

    let body = chat_body("m", "explain yourself, please", 4, false);
    let expected = recomputed(&body);
    let (status, shown) = chat(&c, &url, body, true).await;
    assert_eq!(status, StatusCode::OK);
    let shown = shown.expect("the decision header, asked for");
    assert_eq!(shown["reason"], "score", "{shown}");
    // The chosen worker has the lowest recomputed score, the runner-up the next.
    let mut order = expected.clone();
    order.sort_by(|a, b| a.1.total_cmp(&b.1));
    for (key, want) in [("chosen", &order[0]), ("runner_up", &order[1])] {
        let got = &shown[key];
        assert_eq!(
            got["worker"],
            want.0.as_str(),
            "{key}: {shown} vs {expected:?}"
        );
        for (field, want) in [
            ("score", want.1),
            ("predicted_ttft_ms", want.2),
            ("predicted_tpot_ms", want.3),
        ] {
            // Equal to the last bit but for the JSON reader's rounding (serde_json parses
            // decimals without its `float_roundtrip` feature: up to an ulp or two off).
            let v = got[field].as_f64().unwrap_or(f64::NAN);
            assert!(
                (v - want).abs() <= want.abs() * 1e-14,
                "{key}.{field}: {v} vs {want}"
            );
        }
    }
    assert!(
        order[0].1 < order[1].1,
        "the weights part the scores: {order:?}"
    );

    // Not asked: no header; the log has the decision of every routed request either way.
    let (status, none) = chat(&c, &url, chat_body("m", "and again", 4, false), false).await;
    assert_eq!((status, none), (StatusCode::OK, None));
    let read = || -> Vec<Value> {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    wait_for("both lines", Duration::from_secs(10), async || {
        gw.flush_request_log().await;
        read().len() == 2
    })
    .await;
    let lines = read();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[0]["decision"], shown,
        "the log shows what the header showed"
    );
    assert_eq!(lines[0]["worker"], shown["chosen"]["worker"]);
    assert!(
        lines[1]["decision"]["chosen"]["score"].is_f64(),
        "{}",
        lines[1]
    );

    let text = send(&c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text();
    assert_eq!(
        metric(&text, "routelab_decisions_total{reason=\"score\"}"),
        2
    );
    assert_eq!(
        metric(&text, "routelab_decisions_total{reason=\"queued\"}"),
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}
