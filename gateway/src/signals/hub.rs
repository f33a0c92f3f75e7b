//! The signal hub: each worker's KV stream status and its fallback's guesses, its metrics
//! poll status and its recent history, behind locks of their own (never held with the router
//! core's). The tasks that fill it are [`super`]'s; the router core is handed in.

use crate::engine_metrics::{Engine, Scrape};
use crate::kv::{StreamState, StreamStatus, WorkerStream};
use crate::routing::Routing;
use routelab_policies::{EngineReport, KvEvent, Time, WorkerId};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

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
    pub(super) last_scrape: Option<(Scrape, Time)>,
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
pub(super) struct History {
    pub samples: VecDeque<Sample>,
    pub ttft_count: u64,
    pub ttft_sum_s: f64,
}

/// The gateway's signal state, beside the router (own locks, never held with the router's).
#[derive(Debug, Default)]
pub(crate) struct SignalHub {
    pub(super) kv: Mutex<HashMap<u32, WorkerStream>>,
    pub(super) polls: Mutex<HashMap<u32, PollStatus>>,
    pub(super) history: Mutex<HashMap<u32, History>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    pub fn kv_live(&self, s: &Routing, id: WorkerId) {
        self.kv_update(id, |w| {
            w.status.state = StreamState::Live;
            w.fallback.clear();
            w.status.fallback_blocks = 0;
        });
        let now = s.clock.now();
        s.core()
            .router
            .apply_kv_events(now, id, &[KvEvent::AllCleared]);
        crate::logging::log("kv_events_live", &[("worker", &worker_name(s, id))]);
    }

    /// The stream was lost: the mirror of this worker can no longer be trusted, so it goes, and
    /// the fallback records dispatches until the stream is back.
    pub fn kv_down(&self, s: &Routing, id: WorkerId, reason: &str) {
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
            crate::logging::log(
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
    pub fn dispatched(&self, s: &Routing, id: WorkerId, prefix: &[u64]) {
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

pub(super) fn worker_name(s: &Routing, id: WorkerId) -> String {
    s.core()
        .workers
        .get(id)
        .map(|w| w.cfg.name.clone())
        .unwrap_or_default()
}
