//! What each worker tells the router besides its answers, and what the policy will see of it:
//! the engines' KV event streams ([`crate::kv`]), their `/metrics` ([`crate::engine_metrics`]),
//! a short history per worker for the admin page. Its background tasks are supervised as every
//! other ([`crate::supervise`]: a task that panics is logged, counted in
//! `routelab_gateway_task_restarts_total{task}` and started again).
//!
//! ```yaml
//! engine_metrics:
//!   poll: auto          # auto: when the policy reads engine reports (least-load); on; off
//!   interval_s: 10      # policy time; default: the policy's engine poll interval, else 10
//!   timeout_s: 2
//!   stale_after_s: 30   # a report older than this is dropped (the rule falls back to the gateway's counts)
//!   path: /metrics
//! ```

use crate::engine_metrics::{self, Engine, Scrape};
use crate::kv::{Fallback, KvEventsConfig, StreamState, StreamStatus, WorkerStream};
use crate::state::Shared;
use crate::supervise::{BackgroundTask, RESTART_PAUSE, report_panic, supervise};
use routelab_policies::{EngineReport, KvEvent, PrefixKnowledge, Time, WorkerId, WorkerState};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The `engine_metrics` block.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetricsConfig {
    /// When to poll: `auto` (when the policy reads engine reports), `on`, `off`.
    pub poll: PollMode,
    /// Seconds of policy time between polls; none: the policy's own interval (the simulator's
    /// 10 s for `least-load`), else 10.
    pub interval_s: Option<f64>,
    /// Timeout of one poll, wall seconds.
    pub timeout_s: f64,
    /// A report older than this (policy seconds) ages out; none: three intervals.
    pub stale_after_s: Option<f64>,
    /// The path appended to a worker's base URL.
    pub path: String,
}

/// When to poll the engines' metrics.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// When the policy reads engine reports.
    Auto,
    /// Always (the admin page shows the figures).
    On,
    /// Never (a policy that reads reports falls back to the gateway's own counts).
    Off,
}

impl Default for EngineMetricsConfig {
    fn default() -> Self {
        EngineMetricsConfig {
            poll: PollMode::Auto,
            interval_s: None,
            timeout_s: 2.0,
            stale_after_s: None,
            path: "/metrics".into(),
        }
    }
}

/// The default engine poll interval when the policy names none (the simulator's).
pub const DEFAULT_POLL_S: f64 = 10.0;

/// Validated polling settings.
#[derive(Debug, Clone)]
pub(crate) struct PollSettings {
    pub enabled: bool,
    pub interval_s: f64,
    pub timeout: Duration,
    pub stale_after_s: f64,
    pub path: String,
}

impl EngineMetricsConfig {
    /// Check the numbers and path; the message names the field and what is valid.
    pub fn validate(&self) -> Result<(), (String, String, &'static str)> {
        let secs = |f: &str, v: f64| {
            if v.is_finite() && (0.001..=86_400.0).contains(&v) {
                Ok(())
            } else {
                Err((
                    format!("engine_metrics.{f}"),
                    format!("{v} is out of range"),
                    "a number of seconds from 0.001 to 86400",
                ))
            }
        };
        if let Some(v) = self.interval_s {
            secs("interval_s", v)?;
        }
        secs("timeout_s", self.timeout_s)?;
        if let Some(v) = self.stale_after_s {
            secs("stale_after_s", v)?;
        }
        // The rule every path the gateway requests from a worker follows (`health.path` too).
        if let Err(reason) = crate::upstream::check_path(&self.path) {
            return Err((
                "engine_metrics.path".into(),
                format!("`{}` {reason}", self.path),
                "a path such as /metrics",
            ));
        }
        Ok(())
    }

    pub(crate) fn settings(&self, policy_interval: Option<Duration>) -> PollSettings {
        let interval_s = self
            .interval_s
            .or(policy_interval.map(|d| d.as_secs_f64()))
            .unwrap_or(DEFAULT_POLL_S);
        PollSettings {
            enabled: match self.poll {
                PollMode::Auto => policy_interval.is_some(),
                PollMode::On => true,
                PollMode::Off => false,
            },
            interval_s,
            timeout: Duration::from_secs_f64(self.timeout_s),
            stale_after_s: self.stale_after_s.unwrap_or(3.0 * interval_s),
            path: self.path.clone(),
        }
    }
}

/// Where a worker's metrics poll stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PollState {
    /// The gateway does not poll.
    Off,
    /// No answer yet.
    Waiting,
    /// The last report is fresh.
    Live,
    /// The last report aged out (polls fail or carry no engine's names).
    Stale,
}

/// A worker's metrics poll.
#[derive(Debug, Clone, Serialize)]
pub struct PollStatus {
    /// Now.
    pub state: PollState,
    /// Whose names the worker's page uses.
    pub engine: Option<Engine>,
    /// Polls answered with an engine's figures.
    pub ok: u64,
    /// Polls that failed (no answer, not 200, no engine's names).
    pub failed: u64,
    /// Why the last poll failed.
    pub last_error: Option<String>,
    /// The last report handed to the router.
    #[serde(skip)]
    pub report: Option<EngineReport>,
    /// Policy time of the last report.
    #[serde(skip)]
    pub at: Option<Time>,
    #[serde(skip)]
    last_scrape: Option<(Scrape, Time)>,
}

/// One sample of a worker's recent history.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Requests in flight.
    pub in_flight: u32,
    /// Mean TTFT of the requests that got their first byte since the last sample, seconds
    /// (none: no request did).
    pub ttft_s: Option<f64>,
    /// The router's weight.
    pub weight: f64,
}

/// Samples kept per worker (two minutes at one sample every 2 s).
pub const HISTORY: usize = 60;
/// Wall time between samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct History {
    samples: VecDeque<Sample>,
    ttft_count: u64,
    ttft_sum_s: f64,
}

/// The gateway's signal state, beside the router (own locks, never held with the router's).
#[derive(Debug, Default)]
pub(crate) struct SignalHub {
    kv: Mutex<HashMap<u32, WorkerStream>>,
    polls: Mutex<HashMap<u32, PollStatus>>,
    history: Mutex<HashMap<u32, History>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SignalHub {
    /// Change a worker's stream status (no-op for a worker without one).
    pub fn kv_update(&self, id: WorkerId, f: impl FnOnce(&mut WorkerStream)) {
        if let Some(w) = lock(&self.kv).get_mut(&id.0) {
            f(w);
        }
    }

    /// The stream connected: forget what the router believed of the worker (the fallback's
    /// guesses) before the replay tells what the engine holds.
    pub fn kv_live(&self, s: &Shared, id: WorkerId) {
        self.kv_update(id, |w| {
            w.status.state = StreamState::Live;
            w.fallback.clear();
            w.status.fallback_blocks = 0;
        });
        let now = s.clock.now();
        s.core()
            .router
            .apply_kv_events(now, id, &[KvEvent::AllCleared]);
        crate::log("kv_events_live", &[("worker", &worker_name(s, id))]);
    }

    /// The stream was lost: the mirror of this worker can no longer be trusted, so it goes, and
    /// the fallback records dispatches until the stream is back.
    pub fn kv_down(&self, s: &Shared, id: WorkerId, reason: &str) {
        let mut was_live = false;
        self.kv_update(id, |w| {
            was_live = w.status.state == StreamState::Live;
            w.status.state = StreamState::Down;
            w.status.last_error = Some(reason.to_string());
        });
        if was_live {
            let now = s.clock.now();
            s.core()
                .router
                .apply_kv_events(now, id, &[KvEvent::AllCleared]);
        }
        crate::log(
            "kv_events_down",
            &[("worker", &worker_name(s, id)), ("error", reason)],
        );
    }

    /// The gateway dispatched a prompt to a worker: while the worker's stream is not live,
    /// record it as `approximate` would (bounded by the worker's cache size).
    pub fn dispatched(&self, s: &Shared, id: WorkerId, prefix: &[u64]) {
        if prefix.is_empty() {
            return;
        }
        let recording = lock(&self.kv)
            .get(&id.0)
            .is_some_and(|w| w.status.state != StreamState::Live);
        if !recording {
            return;
        }
        let cache_blocks = s
            .core()
            .workers
            .get(id)
            .and_then(|w| w.cfg.cache_tokens.map(crate::config::CacheTokens::blocks));
        let mut out = Vec::new();
        {
            let mut kv = lock(&self.kv);
            let Some(w) = kv.get_mut(&id.0) else { return };
            if w.status.state == StreamState::Live {
                return;
            }
            let bound = cache_blocks.map_or(crate::kv::FALLBACK_BLOCKS, |b| b as usize);
            w.fallback.record(prefix, bound, &mut out);
            w.status.fallback_blocks = w.fallback.len();
        }
        if !out.is_empty() {
            let now = s.clock.now();
            s.core().router.apply_kv_events(now, id, &out);
        }
    }

    /// A worker was removed: what the hub knew of it goes with it, so a worker added again in
    /// its slot (`Router::revive`) starts with a new stream (the stream keeper starts a new
    /// subscriber), poll and history rather than the removed engine's.
    pub fn forget_worker(&self, id: WorkerId) {
        lock(&self.kv).remove(&id.0);
        lock(&self.polls).remove(&id.0);
        lock(&self.history).remove(&id.0);
    }

    /// A worker's stream status, if it has a stream.
    pub fn stream(&self, id: WorkerId) -> Option<StreamStatus> {
        lock(&self.kv).get(&id.0).map(|w| w.status.clone())
    }

    /// A worker's poll status, if polled.
    pub fn poll(&self, id: WorkerId) -> Option<PollStatus> {
        lock(&self.polls).get(&id.0).cloned()
    }

    /// A worker's recent samples, oldest first.
    pub fn history(&self, id: WorkerId) -> Vec<Sample> {
        lock(&self.history)
            .get(&id.0)
            .map(|h| h.samples.iter().copied().collect())
            .unwrap_or_default()
    }
}

fn worker_name(s: &Shared, id: WorkerId) -> String {
    s.core()
        .workers
        .get(id)
        .map(|w| w.cfg.name.clone())
        .unwrap_or_default()
}

/// Start the signal tasks: the KV stream keeper (one subscriber per worker with `kv_events`,
/// started and stopped as workers come and go), the metrics poller and the history sampler.
pub(crate) fn start(s: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![supervise(
        s.clone(),
        BackgroundTask::KvStreams,
        RESTART_PAUSE,
        keep_streams,
    )];
    if s.settings.engine_poll.enabled {
        tasks.push(supervise(
            s.clone(),
            BackgroundTask::EngineMetrics,
            RESTART_PAUSE,
            poll_engines,
        ));
    }
    tasks.push(supervise(
        s.clone(),
        BackgroundTask::History,
        RESTART_PAUSE,
        sample_history,
    ));
    tasks
}

/// Keep one subscriber running per live worker with `kv_events`; one that ended (panicked) is
/// logged, counted ([`report_panic`]) and started again.
async fn keep_streams(s: Arc<Shared>) {
    let mut running: HashMap<u32, JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let wanted: Vec<(WorkerId, KvEventsConfig)> = {
            let core = s.core();
            // Only a policy that mirrors the engines' caches reads the streams.
            let reads = core.router.kv_event_delay().is_some();
            core.workers
                .live()
                .filter(|_| reads)
                .filter_map(|(id, w)| w.cfg.kv_events.clone().map(|c| (id, c)))
                .collect()
        };
        let keep: std::collections::HashSet<u32> = wanted.iter().map(|(id, _)| id.0).collect();
        running.retain(|id, h| {
            if keep.contains(id) {
                true
            } else {
                h.abort();
                lock(&s.signals.kv).remove(id);
                false
            }
        });
        for (id, cfg) in wanted {
            let restart = match running.get(&id.0) {
                // Removed and added again since (`SignalHub::forget_worker`): a new engine.
                Some(h) if !lock(&s.signals.kv).contains_key(&id.0) => {
                    h.abort();
                    true
                }
                Some(h) => h.is_finished(),
                None => true,
            };
            if restart {
                // A subscriber runs until it is aborted: one that ended by itself panicked.
                if let Some(ended) = running.remove(&id.0)
                    && ended.is_finished()
                    && let Err(e) = ended.await
                    && report_panic(&s, BackgroundTask::KvSubscriber, e)
                {
                    crate::log(
                        "task_restarting",
                        &[
                            ("task", BackgroundTask::KvSubscriber.as_str()),
                            ("worker", &worker_name(&s, id)),
                        ],
                    );
                }
                lock(&s.signals.kv)
                    .entry(id.0)
                    .or_insert_with(|| WorkerStream {
                        status: StreamStatus::new(StreamState::Connecting),
                        fallback: Fallback::default(),
                    });
                running.insert(
                    id.0,
                    tokio::spawn(crate::kv::subscriber::run(s.clone(), id, cfg)),
                );
            }
        }
    }
}

/// A worker to poll, as it stood when its poll was sent.
struct PollTarget {
    id: WorkerId,
    /// Its page's URL, or why it cannot be made.
    uri: Result<hyper::Uri, crate::upstream::BaseUrlError>,
    /// Its cache size in tokens.
    cache: Option<u64>,
    /// Requests sent to it so far.
    sent: u64,
    /// Prompt tokens the router dispatched to it so far ([`routelab_policies::Signals`]'s
    /// `tokens_dispatched`): the report applies as of this mark, so the requests dispatched
    /// while the poll is out stay counted on top of it.
    mark: u64,
}

/// Poll every live worker's `/metrics` each interval and hand the router its report; drop a
/// report once it is older than `stale_after_s`.
///
/// As the simulator polls its engines: on a fixed grid of policy time from the gateway's start
/// (a tick delayed by a busy runtime does not shift the ones after it), and each report taken
/// as of the moment its poll was sent, not the (later) moment every worker had answered.
async fn poll_engines(s: Arc<Shared>) {
    let p = s.settings.engine_poll.clone();
    let wall = s.clock.to_wall(Duration::from_secs_f64(p.interval_s));
    let mut tick = tokio::time::interval(wall);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let targets: Vec<PollTarget> = {
            let core = s.core();
            core.workers
                .live()
                .filter(|(id, _)| {
                    core.router
                        .fleet()
                        .get(*id)
                        .is_some_and(|f| f.state != WorkerState::Removed)
                })
                .map(|(id, w)| PollTarget {
                    id,
                    uri: w.base.join(&p.path),
                    cache: w.cfg.cache_tokens.map(crate::config::CacheTokens::tokens),
                    sent: w.metrics.requests.load(Relaxed),
                    mark: core
                        .router
                        .signals(id)
                        .map_or(0, |sig| sig.tokens_dispatched),
                })
                .collect()
        };
        let polls = targets.into_iter().map(|t| {
            let s = s.clone();
            let timeout = p.timeout;
            async move {
                // A URL that cannot be made is a failed poll, said in its status, never a panic.
                let page = match t.uri {
                    Ok(ref uri) => fetch(&s, uri.clone(), timeout).await,
                    Err(ref e) => Err(e.to_string()),
                };
                (t, page)
            }
        });
        let results = futures_util::future::join_all(polls).await;
        let now = s.clock.now();
        let mut reports = Vec::new();
        {
            let mut polls = lock(&s.signals.polls);
            polls.retain(|id, _| results.iter().any(|(t, _)| t.id.0 == *id));
            for (t, r) in results {
                let PollTarget {
                    id,
                    cache,
                    sent,
                    mark,
                    ..
                } = t;
                let st = polls.entry(id.0).or_insert_with(|| PollStatus {
                    state: PollState::Waiting,
                    engine: None,
                    ok: 0,
                    failed: 0,
                    last_error: None,
                    report: None,
                    at: None,
                    last_scrape: None,
                });
                match r.and_then(|text| {
                    engine_metrics::parse(&text).ok_or_else(|| {
                        "the page carries none of vLLM's, SGLang's or llama.cpp's metric names"
                            .to_string()
                    })
                }) {
                    Ok(scrape) => {
                        let prev = st
                            .last_scrape
                            .as_ref()
                            .map(|(sc, at)| (sc, now.saturating_since(*at).as_secs_f64()));
                        let report = engine_metrics::report(
                            &scrape,
                            prev,
                            cache,
                            engine_metrics::Sent {
                                requests: sent,
                                prompt_tokens: mark,
                            },
                        );
                        st.ok += 1;
                        st.engine = Some(scrape.engine);
                        st.report = Some(report);
                        st.at = Some(now);
                        st.state = PollState::Live;
                        st.last_scrape = Some((scrape, now));
                        reports.push((id, Some((report, mark))));
                    }
                    Err(e) => {
                        st.failed += 1;
                        st.last_error = Some(e);
                        let stale = st.at.is_none_or(|at| {
                            now.saturating_since(at).as_secs_f64() > p.stale_after_s
                        });
                        if stale && st.state != PollState::Stale && st.state != PollState::Waiting {
                            st.state = PollState::Stale;
                            st.report = None;
                            reports.push((id, None));
                        }
                    }
                }
            }
        }
        if !reports.is_empty() {
            let mut core = s.core();
            for (id, r) in reports {
                // Removed while its page was being read: nothing to tell the router.
                if core.workers.get(id).is_none() {
                    continue;
                }
                match r {
                    Some((r, mark)) => core.router.engine_report_as_of(now, id, r, mark),
                    None => core.router.forget_engine_report(now, id),
                }
            }
        }
    }
}

async fn fetch(s: &Shared, uri: hyper::Uri, timeout: Duration) -> Result<String, String> {
    use http_body_util::{BodyExt, Full, Limited};
    let req = hyper::Request::get(uri)
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, s.client.request(req))
        .await
        .map_err(|_| "no answer within the timeout".to_string())?
        .map_err(|e| crate::proxy::error_chain(&e))?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    // A metrics page is tens of kilobytes; 4 MiB bounds a worker that sends more.
    let body = tokio::time::timeout(timeout, Limited::new(resp.into_body(), 4 << 20).collect())
        .await
        .map_err(|_| "the page did not arrive within the timeout".to_string())?
        .map_err(|e| format!("the page broke: {e}"))?;
    String::from_utf8(body.to_bytes().to_vec()).map_err(|_| "the page is not UTF-8".into())
}

/// Sample every worker's in-flight count, weight and recent TTFT for the admin page.
async fn sample_history(s: Arc<Shared>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let rows: Vec<(u32, u32, f64, u64, f64)> = {
            let core = s.core();
            core.workers
                .live()
                .map(|(id, w)| {
                    let info = core.router.fleet().get(id);
                    (
                        id.0,
                        info.map_or(0, |f| f.in_flight),
                        core.router.weight(id).map_or(0.0, |w| w.value),
                        w.metrics.ttft.count(),
                        w.metrics.ttft.sum_s(),
                    )
                })
                .collect()
        };
        let mut h = lock(&s.signals.history);
        h.retain(|id, _| rows.iter().any(|r| r.0 == *id));
        for (id, in_flight, weight, n, sum) in rows {
            let e = h.entry(id).or_default();
            let ttft_s =
                (n > e.ttft_count).then(|| (sum - e.ttft_sum_s) / (n - e.ttft_count) as f64);
            e.ttft_count = n;
            e.ttft_sum_s = sum;
            e.samples.push_back(Sample {
                in_flight,
                ttft_s,
                weight,
            });
            while e.samples.len() > HISTORY {
                e.samples.pop_front();
            }
        }
    }
}

/// The signal families of `/metrics`: per worker with a KV stream, whether it is live and its
/// counters; per polled worker, whether its report is live and the polls' outcomes (the
/// background tasks' restarts are rendered with the gateway's own families, [`crate::metrics`]).
pub(crate) fn render_metrics(s: &Shared) -> String {
    use std::fmt::Write as _;
    let labels: HashMap<u32, String> = {
        let core = s.core();
        core.workers
            .live()
            .map(|(id, w)| {
                (
                    id.0,
                    format!(
                        "worker=\"{}\",model=\"{}\"",
                        crate::metrics::esc(&w.cfg.name),
                        crate::metrics::esc(&w.cfg.model)
                    ),
                )
            })
            .collect()
    };
    let mut out = String::new();
    let mut streams: Vec<(u32, StreamStatus)> = lock(&s.signals.kv)
        .iter()
        .map(|(id, w)| (*id, w.status.clone()))
        .collect();
    streams.sort_by_key(|(id, _)| *id);
    let streams: Vec<(&String, StreamStatus)> = streams
        .into_iter()
        .filter_map(|(id, st)| labels.get(&id).map(|l| (l, st)))
        .collect();
    type Pick = fn(&StreamStatus) -> f64;
    let families: [(&str, &str, &str, Pick); 7] = [
        (
            "routelab_worker_kv_events_live",
            "1 while the worker's KV event stream is live; 0 while the gateway falls back to recording what it dispatches (approximate).",
            "gauge",
            |st| f64::from(u8::from(st.state == StreamState::Live)),
        ),
        (
            "routelab_worker_kv_events_batches_total",
            "KV event batches applied (live and replayed).",
            "counter",
            |st| st.batches as f64,
        ),
        (
            "routelab_worker_kv_events_gaps_total",
            "Sequence gaps in the worker's KV event stream.",
            "counter",
            |st| st.gaps as f64,
        ),
        (
            "routelab_worker_kv_events_replayed_total",
            "KV event batches recovered from the engine's replay socket.",
            "counter",
            |st| st.replayed as f64,
        ),
        (
            "routelab_worker_kv_events_unrecovered_total",
            "Gaps no replay could fill (the worker's mirror started again).",
            "counter",
            |st| st.unrecovered as f64,
        ),
        (
            "routelab_worker_kv_events_malformed_total",
            "KV event messages or payloads that could not be read.",
            "counter",
            |st| st.malformed as f64,
        ),
        (
            "routelab_worker_kv_events_fallback_blocks",
            "Prefix blocks the gateway recorded for the worker while its stream was not live.",
            "gauge",
            |st| st.fallback_blocks as f64,
        ),
    ];
    for (name, help, kind, pick) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (l, st) in &streams {
            let _ = writeln!(out, "{name}{{{l}}} {}", pick(st));
        }
    }
    let mut polls: Vec<(u32, PollStatus)> = lock(&s.signals.polls)
        .iter()
        .map(|(id, p)| (*id, p.clone()))
        .collect();
    polls.sort_by_key(|(id, _)| *id);
    let _ = writeln!(
        out,
        "# HELP routelab_worker_engine_metrics_live 1 while the worker's polled engine report is fresh; 0 while the policy falls back to the gateway's own counts.\n# TYPE routelab_worker_engine_metrics_live gauge"
    );
    for (id, p) in &polls {
        if let Some(l) = labels.get(id) {
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_live{{{l}}} {}",
                u8::from(p.state == PollState::Live)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP routelab_worker_engine_metrics_polls_total Polls of the worker's metrics page, by result.\n# TYPE routelab_worker_engine_metrics_polls_total counter"
    );
    for (id, p) in &polls {
        if let Some(l) = labels.get(id) {
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_polls_total{{{l},result=\"ok\"}} {}",
                p.ok
            );
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_polls_total{{{l},result=\"failed\"}} {}",
                p.failed
            );
        }
    }
    out
}

/// A signal a policy reads and whether a worker provides it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SignalUse {
    /// The signal.
    pub signal: &'static str,
    /// Provided for this worker (as configured; `/admin` adds whether it is live now).
    pub provided: bool,
    /// What the policy uses instead when it is not.
    pub fallback: Option<&'static str>,
}

/// What the configured policy reads of a worker, as configured: prompt tokens (exact or
/// estimated), the engine's KV events, the engine's metrics.
pub(crate) fn uses(
    knowledge: PrefixKnowledge,
    reads_reports: bool,
    poll: &PollSettings,
    kv_configured: bool,
    exact_tokens: bool,
) -> Vec<SignalUse> {
    let mut out = vec![SignalUse {
        signal: "prompt tokens",
        provided: exact_tokens,
        fallback: (!exact_tokens).then_some("bytes / 4 estimate and 2,048-byte prefix blocks"),
    }];
    if let PrefixKnowledge::KvEvents { .. } = knowledge {
        out.push(SignalUse {
            signal: "kv events",
            provided: kv_configured,
            fallback: Some("approximate: the gateway records what it dispatches"),
        });
        if kv_configured && !exact_tokens {
            out.push(SignalUse {
                signal: "token ids matching the engine's",
                provided: false,
                fallback: Some("none: a real engine's blocks never match byte blocks (configure the model's tokenizer)"),
            });
        }
    }
    if reads_reports {
        out.push(SignalUse {
            signal: "engine metrics",
            provided: poll.enabled,
            fallback: Some("the gateway's own counts of tokens in flight"),
        });
    }
    out
}

/// What `--check` says of the signals: per worker, what the configured policy reads and
/// whether the worker provides it (as configured: a stream or a poll may still fail at run
/// time, which `/admin` shows), and a warning per missing signal naming the fallback. Loads the
/// tokenizers, so a bad `models[]` entry is a located error here too.
pub fn check_report(
    c: &crate::GatewayConfig,
) -> Result<(Vec<String>, Vec<String>), routelab_policies::InputError> {
    let policy = c.policy.build_in(c.origin(), "policy")?;
    let tokenizers = crate::tokens::Tokenizers::load(
        &c.models,
        &crate::tokens::config_base(c.origin()),
        c.origin(),
    )?;
    let poll_interval = policy.chooser.engine_poll_interval();
    let poll = c.engine_metrics.settings(poll_interval);
    let mut lines = Vec::new();
    let mut warnings = Vec::new();
    let kv = matches!(policy.knowledge, PrefixKnowledge::KvEvents { .. });
    lines.push(format!(
        "policy {}: reads prompt tokens{}{}",
        policy.name,
        if kv {
            ", the engines' KV events (prefix_knowledge: kv-events)"
        } else {
            ""
        },
        if poll_interval.is_some() {
            format!(
                ", engine metrics (every {} s of policy time)",
                poll.interval_s
            )
        } else {
            String::new()
        }
    ));
    if poll.enabled {
        lines.push(format!(
            "engine metrics: polled from each worker's {} every {} s, a report ages out after {} s",
            poll.path, poll.interval_s, poll.stale_after_s
        ));
    }
    for w in &c.workers {
        let used = uses(
            policy.knowledge,
            poll_interval.is_some(),
            &poll,
            w.kv_events.is_some(),
            tokenizers.get(&w.model).is_some(),
        );
        let mut parts = vec![format!("tokens {}", tokenizers.describe(&w.model))];
        if kv {
            parts.push(match &w.kv_events {
                Some(k) => format!(
                    "kv events from {}{}",
                    k.endpoint,
                    k.replay_endpoint.as_ref().map_or(
                        " (no replay socket: gaps cannot be filled)".to_string(),
                        |r| format!(", replay {r}")
                    )
                ),
                None => "no kv_events".into(),
            });
        }
        if poll_interval.is_some() || poll.enabled {
            parts.push(if poll.enabled {
                "metrics polled".into()
            } else {
                "metrics not polled".into()
            });
        }
        lines.push(format!("worker {}: {}", w.name, parts.join("; ")));
        for u in used
            .iter()
            .filter(|u| !u.provided && u.signal != "prompt tokens")
        {
            warnings.push(format!(
                "worker {}: the policy reads {} but {}; it falls back to {}",
                w.name,
                u.signal,
                match u.signal {
                    "kv events" => "the worker has no kv_events",
                    "engine metrics" => "engine_metrics.poll is off",
                    _ => "the model has no tokenizer",
                },
                u.fallback.unwrap_or("nothing")
            ));
        }
    }
    if kv {
        for m in c
            .workers
            .iter()
            .map(|w| w.model.as_str())
            .collect::<std::collections::BTreeSet<_>>()
        {
            if tokenizers.get(m).is_none() {
                warnings.push(format!(
                    "model {m}: prompt tokens are estimated (bytes / 4): only an engine that announces the same byte tokens (the emulator) matches its KV events; configure models[].tokenizer for a real engine"
                ));
            }
        }
    }
    Ok((lines, warnings))
}

/// `/admin`'s gateway-wide signal facts: the engine poll's settings and the background tasks'
/// restarts.
pub(crate) fn gateway_view(s: &Shared) -> Value {
    let p = &s.settings.engine_poll;
    json!({
        "engine_metrics": {
            "poll": p.enabled,
            "interval_s": p.interval_s,
            "stale_after_s": p.stale_after_s,
            "path": p.path,
        },
        "task_restarts": BackgroundTask::ALL
            .iter()
            .map(|&t| (t.as_str(), s.global.task_restarts.of(t)))
            .collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// `/admin`'s view of a worker's signals: what the policy reads, what is live now, the history.
pub(crate) fn admin_view(s: &Shared, id: WorkerId, model: &str, kv_configured: bool) -> Value {
    let (knowledge, reads_reports) = {
        let core = s.core();
        (
            core.router.config().knowledge,
            core.router.engine_poll_interval().is_some(),
        )
    };
    let exact = s.tokenizers.get(model).is_some();
    let mut reads = uses(
        knowledge,
        reads_reports,
        &s.settings.engine_poll,
        kv_configured,
        exact,
    );
    let stream = s.signals.stream(id);
    let poll = s.signals.poll(id);
    // Live state refines "provided as configured".
    for u in &mut reads {
        match u.signal {
            "kv events" => {
                u.provided &= stream
                    .as_ref()
                    .is_some_and(|st| st.state == StreamState::Live)
            }
            "engine metrics" => {
                u.provided &= poll.as_ref().is_some_and(|p| p.state == PollState::Live)
            }
            _ => {}
        }
    }
    let history = s.signals.history(id);
    json!({
        "tokens": s.tokenizers.describe(model),
        "kv_events": match &stream {
            Some(st) => serde_json::to_value(st).unwrap_or(Value::Null),
            None => json!({"state": "off"}),
        },
        "engine_metrics": match &poll {
            Some(p) => {
                let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
                if let (Some(r), Some(at)) = (p.report, p.at) {
                    v["report"] = json!({
                        "kv_used_fraction": r.kv_used_fraction,
                        "queued_prompt_tokens": r.queued_prompt_tokens,
                        "running_tokens": r.running_tokens,
                        "generation_tok_s": r.generation_tok_s,
                        "age_s": s.clock.now().saturating_since(at).as_secs_f64(),
                    });
                }
                v
            }
            None => json!({"state": if s.settings.engine_poll.enabled { "waiting" } else { "off" }}),
        },
        "reads": reads,
        "history": {
            "every_s": SAMPLE_EVERY.as_secs_f64(),
            "in_flight": history.iter().map(|h| h.in_flight).collect::<Vec<_>>(),
            "ttft_s": history.iter().map(|h| h.ttft_s).collect::<Vec<_>>(),
            "weight": history.iter().map(|h| h.weight).collect::<Vec<_>>(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_load_without_a_poll_and_kv_events_without_a_stream_name_their_fallbacks() {
        let off = EngineMetricsConfig {
            poll: PollMode::Off,
            ..Default::default()
        }
        .settings(Some(Duration::from_secs(10)));
        let u = uses(PrefixKnowledge::Approximate, true, &off, false, false);
        let m = u.iter().find(|u| u.signal == "engine metrics").unwrap();
        assert!(!m.provided);
        assert!(m.fallback.unwrap().contains("own counts"));
        let on = EngineMetricsConfig::default().settings(Some(Duration::from_secs(10)));
        assert!(on.enabled && on.interval_s == 10.0 && on.stale_after_s == 30.0);
        let kv = PrefixKnowledge::KvEvents {
            delay: Duration::ZERO,
        };
        let u = uses(kv, false, &on, false, true);
        let k = u.iter().find(|u| u.signal == "kv events").unwrap();
        assert!(!k.provided && k.fallback.unwrap().starts_with("approximate"));
        let u = uses(kv, false, &on, true, false);
        assert!(
            u.iter()
                .any(|u| u.signal.starts_with("token ids") && !u.provided)
        );
    }

    #[test]
    fn the_poll_defaults_to_the_policys_interval_and_only_when_it_reads_reports() {
        let c = EngineMetricsConfig::default();
        assert!(!c.settings(None).enabled);
        assert_eq!(c.settings(None).interval_s, DEFAULT_POLL_S);
        let c = EngineMetricsConfig {
            poll: PollMode::On,
            interval_s: Some(2.0),
            ..Default::default()
        };
        let p = c.settings(None);
        assert!(p.enabled && p.interval_s == 2.0 && p.stale_after_s == 6.0);
        let bad = EngineMetricsConfig {
            path: "metrics".into(),
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "engine_metrics.path");
        let bad = EngineMetricsConfig {
            timeout_s: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "engine_metrics.timeout_s");
    }
}
