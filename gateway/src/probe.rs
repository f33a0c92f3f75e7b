//! The burst probe over HTTP.
//!
//! Every `probe.poll_interval_s` the router is ticked and asked for probe orders; each order is a
//! burst of `concurrency` concurrent streaming chat requests with `max_tokens` = `min_tokens` =
//! T and `ignore_eos: true`, sent straight to the worker: not routed, not counted in the
//! router's load counters nor in the request metrics. Throughput = total output tokens (from
//! the final `usage`, else the content events) ÷ the time from the first request sent to the
//! last stream's end, in policy time (wall time × `clock_scale`).
//!
//! **A slow engine is measured, not timed out.** A burst still running after `probe.budget_s`
//! (policy time) is cut: its requests are dropped (the engine aborts them as the connections
//! close) and its throughput is the output tokens streamed within the budget over the budget —
//! what the engine delivered with the burst queued, the same quantity a complete burst
//! measures. The admin view (`last_probe_basis`) and the log line (`basis`) say which it was.
//! (A 1-thread llama.cpp server with 4 slots took 98.7 s for the default 16 × 128-token burst
//! and timed out the next one at 120 s, keeping the unmeasured weight 1.0.) Any error or non-2xx
//! answer before the cut makes the burst `ok: false`. Warm-up orders are ordinary orders: the
//! policy crate sequences them.

use crate::app::shared::Shared;
use crate::supervise::{BackgroundTask, report_panic};
use crate::upstream::Target;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use routelab_policies::{ProbeOrder, ProbePhase, ProbeResult};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

struct Job {
    order: ProbeOrder,
    uri: Result<Target, crate::upstream::BaseUrlError>,
    model: String,
    name: String,
}

/// The shortest wall-time poll period: `probe.poll_interval_s` is policy time, shortened by
/// `clock_scale`, and a timer cannot usefully fire more often than this.
const MIN_WALL_POLL: Duration = Duration::from_millis(1);

/// The probe loop; runs until aborted (its bursts are aborted with it; supervised:
/// [`crate::supervise`]).
pub(crate) async fn run(s: Arc<Shared>) {
    let poll = s
        .routing
        .clock
        .to_wall(s.settings.probe_poll)
        .max(MIN_WALL_POLL);
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut orders = Vec::new();
    let mut bursts = JoinSet::new();
    loop {
        ticker.tick().await;
        while let Some(done) = bursts.try_join_next() {
            if let Err(e) = done {
                report_panic(&s.global.task_restarts, BackgroundTask::Probe, e);
            }
        }
        let jobs: Vec<Job> = {
            let mut core = s.routing.core();
            let now = s.routing.clock.now();
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

/// A probe request's body: `prompt_tokens` of text (≈ 4 bytes a token) and exactly `tokens`
/// output tokens. `unique`, when given, opens the prompt so that no two requests share a
/// cached prefix (a prefill-bound burst must prefill every prompt token it counts).
fn probe_body(model: &str, prompt_tokens: u32, tokens: u32, unique: Option<(u64, u32)>) -> Bytes {
    const PHRASE: &str = "Describe the sea at dawn. ";
    let want = (prompt_tokens as usize * 4).max(PHRASE.len());
    let opening = unique.map_or_else(String::new, |(order, i)| format!("Probe {order}-{i}. "));
    let content: String = opening
        .chars()
        .chain(PHRASE.chars().cycle())
        .take(want.max(opening.len()))
        .collect();
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
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

/// What one probe request delivered.
struct Delivered {
    /// Output tokens: the final usage, else the content events.
    output: u64,
    /// Prompt tokens as the engine counted them in its final usage, if it did.
    prompt: Option<u32>,
}

/// One probe request, streamed: every content event adds one to `streamed` as it arrives (what
/// a cut burst counts); the result is the stream's output tokens (final usage, else content
/// events) and the engine's prompt-token count.
async fn one(
    s: Arc<Shared>,
    uri: Target,
    body: Bytes,
    streamed: Arc<AtomicU64>,
) -> Result<Delivered, ProbeError> {
    let req = uri
        .request(hyper::Method::POST)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "text/event-stream")
        .body(Full::new(body))
        .expect("valid request");
    let work = async {
        let resp = s
            .client
            .request(req)
            .await
            .map_err(|e| ProbeError::Request(crate::upstream::error_chain(&e)))?;
        let status = resp.status();
        // At most `upstream.max_response_bytes` of a reply is read, streamed or not.
        let limit = s.settings.max_response_bytes;
        let body_error =
            |e: Box<dyn std::error::Error + Send + Sync>| match e.downcast::<hyper::Error>() {
                Ok(e) => ProbeError::Body(*e),
                Err(_) => ProbeError::TooLarge(limit),
            };
        let mut body = Limited::new(resp.into_body(), limit);
        if !status.is_success() {
            let _ = body.collect().await;
            return Err(ProbeError::Status(status));
        }
        let mut scan = crate::proxy::SseScan::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(body_error)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let before = scan.content_events();
            scan.feed(&data);
            streamed.fetch_add(u64::from(scan.content_events() - before), Relaxed);
            if scan.done() {
                break;
            }
        }
        if !scan.done() {
            return Err(ProbeError::Request(
                "the stream ended without [DONE]".to_string(),
            ));
        }
        Ok(Delivered {
            output: u64::from(scan.output_tokens()),
            prompt: scan.prompt_tokens(),
        })
    };
    tokio::time::timeout(s.settings.probe_timeout, work)
        .await
        .map_err(|_| ProbeError::TimedOut)?
}

/// Start the burst's requests into `set`: one shared body, or for a prefill-bound burst one
/// prompt each that no other shares.
fn spawn_requests(
    s: &Arc<Shared>,
    job: &Job,
    uri: &Target,
    streamed: &Arc<AtomicU64>,
    set: &mut JoinSet<Result<Delivered, ProbeError>>,
) {
    let o = job.order;
    let shared = (o.phase != ProbePhase::Prefill)
        .then(|| probe_body(&job.model, o.prompt_tokens, o.output_tokens, None));
    for i in 0..o.concurrency.max(1) {
        let body = match &shared {
            Some(b) => b.clone(),
            None => probe_body(
                &job.model,
                o.prompt_tokens,
                o.output_tokens,
                Some((o.id, i)),
            ),
        };
        set.spawn(one(s.clone(), uri.clone(), body, streamed.clone()));
    }
}

async fn burst(s: Arc<Shared>, job: Job) {
    let o = job.order;
    let prefill = o.phase == ProbePhase::Prefill;
    let start = Instant::now();
    let streamed = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    let mut tokens = 0u64;
    // Prompt tokens: the engine's count where its usage gives one, else as ordered.
    let mut prompt_tokens = 0u64;
    let mut error = None;
    match &job.uri {
        Ok(uri) => spawn_requests(&s, &job, uri, &streamed, &mut set),
        // Not expected (base URLs are checked when they are read): the burst fails, and the
        // router hears so, rather than waiting for a result that never comes.
        Err(e) => error = Some(ProbeError::Request(e.to_string())),
    }
    let budget_at = start + s.routing.clock.to_wall(s.settings.probe_budget);
    let mut cut = false;
    loop {
        tokio::select! {
            r = set.join_next() => match r {
                None => break,
                Some(Ok(Ok(d))) => {
                    tokens += d.output;
                    prompt_tokens += u64::from(d.prompt.unwrap_or(o.prompt_tokens));
                }
                Some(Ok(Err(e))) => error = Some(e),
                Some(Err(e)) if e.is_panic() => {
                    report_panic(&s.global.task_restarts, BackgroundTask::Probe, e);
                    error = Some(ProbeError::Panicked);
                }
                Some(Err(e)) => error = Some(ProbeError::Task(e)),
            },
            () = tokio::time::sleep_until(budget_at.into()) => {
                // Out of budget: what streamed so far is the measurement; dropping the rest
                // closes their connections, and the engine aborts them.
                cut = true;
                tokens = streamed.load(Relaxed);
                // A prefill-bound burst cut short measured no prefill speed: prompts not yet
                // answered were not (all) prefilled.
                if prefill {
                    error = Some(ProbeError::TimedOut);
                }
                set.abort_all();
                break;
            }
        }
    }
    let wall = if cut {
        budget_at.saturating_duration_since(start)
    } else {
        start.elapsed()
    };
    let result = ProbeResult {
        order: o.id,
        worker: o.worker,
        output_tokens: tokens,
        prompt_tokens,
        // In policy time, so that the throughput is too: an emulator at `--speedup K` behind
        // a gateway at `clock_scale: K` is measured at its emulated tok/s.
        wall: s.routing.clock.to_policy(wall),
        ok: error.is_none(),
    };
    let tp = if prefill {
        result.prefill_tok_s()
    } else {
        result.throughput_tok_s()
    };
    {
        let mut core = s.routing.core();
        let now = s.routing.clock.now();
        core.router.probe_result(now, &result);
        if let Some(w) = core.workers.get_mut(o.worker) {
            if result.ok {
                w.metrics.probes_ok.fetch_add(1, Relaxed);
                if o.phase == ProbePhase::Measure {
                    w.probe_tok_s = Some(tp);
                    w.probe_cut_at_budget = cut;
                }
            } else {
                w.metrics.probes_failed.fetch_add(1, Relaxed);
            }
        }
        core.pump(now);
    }
    crate::logging::log(
        "probe",
        &[
            ("worker", &job.name),
            ("phase", o.phase.name()),
            ("ok", &result.ok.to_string()),
            ("tok_s", &format!("{tp:.1}")),
            ("wall_ms", &wall.as_millis().to_string()),
            (
                "basis",
                if cut {
                    "cut at probe.budget_s: tokens streamed within it"
                } else {
                    "complete burst"
                },
            ),
            (
                "error",
                &error.as_ref().map(ToString::to_string).unwrap_or_default(),
            ),
        ],
    );
    s.state_file.persist(&s.routing).await;
}
