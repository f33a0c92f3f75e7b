//! The metrics registry: the counters and fixed-bucket histograms the request path, the probe
//! and the background tasks count into (per worker and gateway-wide). Lock-free atomics but for
//! the capacity curve and the open-ended rejection codes; rendering is [`super::render`]'s.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// TTFT buckets, seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// End-to-end latency buckets, seconds.
pub const E2E_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A lock-free histogram with fixed upper bounds, for the Prometheus exposition: it renders
/// cumulative `le` counts and reads no quantile (the scraper does), so it shares neither the
/// simulator's buckets nor `routelab_policies::histogram`'s quantile rule.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts; the last slot is `+Inf`.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// An empty histogram.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < s);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Sum of the observations, seconds.
    pub fn sum_s(&self) -> f64 {
        self.sum_ns.load(Relaxed) as f64 / 1e9
    }

    pub(super) fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cum}");
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cum}");
    }
}

/// Per-worker request metrics (customer traffic only; probes and health checks excluded).
#[derive(Debug)]
pub struct WorkerMetrics {
    /// Requests sent to the worker (each retry attempt counts on its worker).
    pub requests: AtomicU64,
    /// Requests that failed on the worker (connect error, 5xx, broken stream, timeout).
    pub errors: AtomicU64,
    /// Gateway arrival to first response byte.
    pub ttft: Histogram,
    /// Gateway arrival to last response byte.
    pub e2e: Histogram,
    /// Probe bursts run, ok and failed.
    pub probes_ok: AtomicU64,
    /// Failed probe bursts.
    pub probes_failed: AtomicU64,
    /// The passive capacity curve (customer traffic), behind a lock of its own: touched at a
    /// request's first byte, its end and each streamed chunk, never with the router's lock held.
    pub capacity: Mutex<crate::capacity::Curve>,
}

impl WorkerMetrics {
    /// The capacity curve (a poisoned lock is recovered: the curve is plain numbers).
    pub fn curve(&self) -> std::sync::MutexGuard<'_, crate::capacity::Curve> {
        self.capacity.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        WorkerMetrics {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            probes_ok: AtomicU64::new(0),
            probes_failed: AtomicU64::new(0),
            capacity: Mutex::default(),
        }
    }
}

/// Gateway-wide counters.
#[derive(Debug, Default)]
pub struct GlobalMetrics {
    /// Requests answered 429 after waiting in the queue.
    pub queue_timeouts: AtomicU64,
    /// Requests that had to wait in the queue.
    pub queued_total: AtomicU64,
    /// Retries on another worker.
    pub retries: AtomicU64,
    /// Routing decisions by their reason, indexed as [`Reason::ALL`](routelab_policies::Reason).
    pub decisions: [AtomicU64; routelab_policies::Reason::ALL.len()],
    /// Panics of the background tasks ([`crate::supervise`]).
    pub task_restarts: crate::supervise::TaskRestarts,
    /// Whether the bus task runs (a `replicas:` block): its restarts are listed then only.
    pub bus_task: std::sync::atomic::AtomicBool,
    /// Answers the gateway gave itself (an `ApiError`), by status and code. A map behind a
    /// lock because the codes are open-ended; it is touched only on a rejection, briefly.
    pub rejections: Mutex<BTreeMap<(u16, &'static str), u64>>,
}

impl GlobalMetrics {
    /// Count one routing decision of `reason`.
    pub fn count_decision(&self, reason: routelab_policies::Reason) {
        let i = routelab_policies::Reason::ALL
            .iter()
            .position(|&r| r == reason)
            .unwrap_or(0);
        self.decisions[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Count one rejection.
    pub fn count_rejection(&self, status: u16, code: &'static str) {
        let mut m = self.rejections.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((status, code)).or_default() += 1;
    }
}
