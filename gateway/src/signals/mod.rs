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

mod poll;
mod view;

pub use view::{SignalUse, check_report};
pub(crate) use view::{admin_view, gateway_view, policy_parts, render_metrics};

use crate::engine_metrics::{Engine, Scrape};
use crate::kv::{Fallback, KvEventsConfig, StreamState, StreamStatus, WorkerStream};
use crate::state::Shared;
use crate::supervise::{BackgroundTask, RESTART_PAUSE, report_panic, supervise};
use routelab_policies::{EngineReport, InputError, KvEvent, Time, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
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
    /// Check the numbers and path; the error, about `file`, names the field and what is valid.
    pub fn validate(&self, file: &str) -> Result<(), InputError> {
        let secs = |f: &str, v: f64| {
            if v.is_finite() && (0.001..=86_400.0).contains(&v) {
                Ok(())
            } else {
                Err(InputError::new(
                    file,
                    format!("engine_metrics.{f}"),
                    format!("{v} is out of range"),
                )
                .valid("a number of seconds from 0.001 to 86400"))
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
            return Err(InputError::new(
                file,
                "engine_metrics.path",
                format!("`{}` {reason}", self.path),
            )
            .valid("a path such as /metrics"));
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
        let mut log = None;
        self.kv_update(id, |w| {
            was_live = w.status.state == StreamState::Live;
            w.status.state = StreamState::Down;
            w.status.last_error = Some(reason.to_string());
            log = w.down_log.admit(std::time::Instant::now());
        });
        if was_live {
            let now = s.clock.now();
            s.core()
                .router
                .apply_kv_events(now, id, &[KvEvent::AllCleared]);
        }
        // A peer that fails every reconnection (a hostile one, or an engine that is gone) would
        // write a line per attempt: at most one a minute per worker, saying how many were not.
        if let Some(suppressed) = log {
            crate::log(
                "kv_events_down",
                &[
                    ("worker", &worker_name(s, id)),
                    ("error", reason),
                    ("suppressed", &suppressed.to_string()),
                ],
            );
        }
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
            poll::poll_engines,
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
                        down_log: Default::default(),
                    });
                running.insert(
                    id.0,
                    tokio::spawn(crate::kv::subscriber::run(s.clone(), id, cfg)),
                );
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            bad.validate("g.yaml").unwrap_err().field,
            "engine_metrics.path"
        );
        let bad = EngineMetricsConfig {
            timeout_s: 0.0,
            ..Default::default()
        };
        assert_eq!(
            bad.validate("g.yaml").unwrap_err().field,
            "engine_metrics.timeout_s"
        );
    }
}
