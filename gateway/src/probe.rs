//! The burst probe over HTTP.
//!
//! Every `probe.poll_interval_s` the router is ticked and asked for probe orders; each order is a
//! burst of `concurrency` concurrent non-streaming chat requests with `max_tokens` =
//! `min_tokens` = T and `ignore_eos: true`, sent straight to the worker: not routed, not counted
//! in the router's load counters nor in the request metrics. Throughput = total output tokens
//! (from `usage`, else T per request) ÷ the time from the first request sent to the last
//! response received, in policy time (wall time × `clock_scale`). Any error or non-2xx answer
//! makes the burst `ok: false`. Warm-up orders are ordinary orders: the policy crate sequences
//! them.

use crate::state::Shared;
use crate::supervise::{BackgroundTask, report_panic};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use routelab_policies::{ProbeOrder, ProbePhase, ProbeResult};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

struct Job {
    order: ProbeOrder,
    uri: Result<Uri, crate::upstream::BaseUrlError>,
    model: String,
    name: String,
}

/// The shortest wall-time poll period: `probe.poll_interval_s` is policy time, shortened by
/// `clock_scale`, and a timer cannot usefully fire more often than this.
const MIN_WALL_POLL: Duration = Duration::from_millis(1);

/// The probe loop; runs until aborted (its bursts are aborted with it; supervised:
/// [`crate::supervise`]).
pub(crate) async fn run(s: Arc<Shared>) {
    let poll = s.clock.to_wall(s.settings.probe_poll).max(MIN_WALL_POLL);
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut orders = Vec::new();
    let mut bursts = JoinSet::new();
    loop {
        ticker.tick().await;
        while let Some(done) = bursts.try_join_next() {
            if let Err(e) = done {
                report_panic(&s, BackgroundTask::Probe, e);
            }
        }
        let jobs: Vec<Job> = {
            let mut core = s.core();
            let now = s.clock.now();
            core.router.tick(now);
            orders.clear();
            core.router.poll_probes(now, &mut orders);
            orders
                .iter()
                .filter_map(|o| {
                    let w = core.workers.get(o.worker)?;
                    Some(Job {
                        order: *o,
                        uri: w.base.join("/v1/chat/completions"),
                        model: w.cfg.model.clone(),
                        name: w.cfg.name.clone(),
                    })
                })
                .collect()
        };
        for job in jobs {
            bursts.spawn(burst(s.clone(), job));
        }
    }
}

fn probe_body(model: &str, prompt_tokens: u32, tokens: u32) -> Bytes {
    const PHRASE: &str = "Describe the sea at dawn. ";
    let want = (prompt_tokens as usize * 4).max(PHRASE.len());
    let content: String = PHRASE.chars().cycle().take(want).collect();
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": true,
        "stream": false,
        "temperature": 0,
    });
    Bytes::from(serde_json::to_vec(&body).expect("json"))
}

/// Why one probe request failed (logged with the burst; any failure fails the burst).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The request could not be sent or its answer not received (with the error's sources).
    #[error("{0}")]
    Request(String),
    /// The body broke off.
    #[error("{0}")]
    Body(hyper::Error),
    /// A non-2xx answer.
    #[error("status {0}")]
    Status(hyper::StatusCode),
    /// The answer is not JSON.
    #[error("bad JSON: {0}")]
    BadJson(serde_json::Error),
    /// No answer within `probe.request_timeout_s`.
    #[error("timed out")]
    TimedOut,
    /// The request's task was cancelled.
    #[error("{0}")]
    Task(tokio::task::JoinError),
    /// The request's task panicked (logged as `task_panicked` and counted).
    #[error("the probe request panicked")]
    Panicked,
    /// The answer was longer than `upstream.max_response_bytes`.
    #[error("the answer is larger than upstream.max_response_bytes ({0} bytes)")]
    TooLarge(usize),
}

async fn one(s: Arc<Shared>, uri: Uri, body: Bytes, tokens: u32) -> Result<u64, ProbeError> {
    let req = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("valid request");
    let work = async {
        let resp = s
            .client
            .request(req)
            .await
            .map_err(|e| ProbeError::Request(crate::proxy::error_chain(&e)))?;
        let status = resp.status();
        let limit = s.settings.max_response_bytes;
        let bytes = Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => ProbeError::Body(*e),
                Err(_) => ProbeError::TooLarge(limit),
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(ProbeError::Status(status));
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(ProbeError::BadJson)?;
        Ok(v.pointer("/usage/completion_tokens")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(u64::from(tokens)))
    };
    tokio::time::timeout(s.settings.probe_timeout, work)
        .await
        .map_err(|_| ProbeError::TimedOut)?
}

async fn burst(s: Arc<Shared>, job: Job) {
    let o = job.order;
    let body = probe_body(&job.model, o.prompt_tokens, o.output_tokens);
    let start = Instant::now();
    let mut set = JoinSet::new();
    let mut tokens = 0u64;
    let mut error = None;
    match &job.uri {
        Ok(uri) => {
            for _ in 0..o.concurrency.max(1) {
                set.spawn(one(s.clone(), uri.clone(), body.clone(), o.output_tokens));
            }
        }
        // Not expected (base URLs are checked when they are read): the burst fails, and the
        // router hears so, rather than waiting for a result that never comes.
        Err(e) => error = Some(ProbeError::Request(e.to_string())),
    }
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(n)) => tokens += n,
            Ok(Err(e)) => error = Some(e),
            Err(e) if e.is_panic() => {
                report_panic(&s, BackgroundTask::Probe, e);
                error = Some(ProbeError::Panicked);
            }
            Err(e) => error = Some(ProbeError::Task(e)),
        }
    }
    let wall = start.elapsed();
    let result = ProbeResult {
        order: o.id,
        worker: o.worker,
        output_tokens: tokens,
        // In policy time, so that the throughput is too: an emulator at `--speedup K` behind
        // a gateway at `clock_scale: K` is measured at its emulated tok/s.
        wall: s.clock.to_policy(wall),
        ok: error.is_none(),
    };
    let tp = result.throughput_tok_s();
    {
        let mut core = s.core();
        let now = s.clock.now();
        core.router.probe_result(now, &result);
        if let Some(w) = core.workers.get_mut(o.worker) {
            if result.ok {
                w.metrics.probes_ok.fetch_add(1, Relaxed);
                if o.phase == ProbePhase::Measure {
                    w.probe_tok_s = Some(tp);
                }
            } else {
                w.metrics.probes_failed.fetch_add(1, Relaxed);
            }
        }
        core.pump(now);
    }
    let phase = match o.phase {
        ProbePhase::Warmup => "warmup",
        ProbePhase::Measure => "measure",
    };
    crate::log(
        "probe",
        &[
            ("worker", &job.name),
            ("phase", phase),
            ("ok", &result.ok.to_string()),
            ("tok_s", &format!("{tp:.1}")),
            ("wall_ms", &wall.as_millis().to_string()),
            (
                "error",
                &error.as_ref().map(ToString::to_string).unwrap_or_default(),
            ),
        ],
    );
    crate::persist_state(&s).await;
}
