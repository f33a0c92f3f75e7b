//! Counters and fixed-bucket histograms, rendered in the Prometheus text format.

use std::fmt::Write as _;
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

/// A lock-free histogram with fixed upper bounds.
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

    fn render(&self, out: &mut String, name: &str, labels: &str) {
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
}

/// One worker's row, snapshotted under the router lock.
#[derive(Debug)]
pub struct WorkerRow<'a> {
    /// Name.
    pub name: &'a str,
    /// Model.
    pub model: &'a str,
    /// Router state name.
    pub state: &'a str,
    /// In flight (router count).
    pub in_flight: u32,
    /// Weight.
    pub weight: f64,
    /// Provenance of the weight.
    pub provenance: &'a str,
    /// Cap (None: uncapped).
    pub cap: Option<u32>,
    /// Last probe throughput.
    pub probe_tok_s: Option<f64>,
    /// Counters.
    pub metrics: &'a WorkerMetrics,
}

/// Escape a label value.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Render everything.
pub fn render(rows: &[WorkerRow<'_>], queue_len: usize, global: &GlobalMetrics) -> String {
    let mut out = String::with_capacity(4096 + rows.len() * 4096);
    let labels: Vec<String> = rows
        .iter()
        .map(|r| format!("worker=\"{}\",model=\"{}\"", esc(r.name), esc(r.model)))
        .collect();
    let gauge = |out: &mut String,
                 name: &str,
                 help: &str,
                 kind: &str,
                 f: &dyn Fn(&WorkerRow<'_>, &str) -> Option<String>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (r, l) in rows.iter().zip(&labels) {
            if let Some(line) = f(r, l) {
                let _ = writeln!(out, "{name}{line}");
            }
        }
    };
    gauge(
        &mut out,
        "routelab_worker_in_flight",
        "Requests in flight on the worker (router count).",
        "gauge",
        &|r, l| Some(format!("{{{l}}} {}", r.in_flight)),
    );
    gauge(
        &mut out,
        "routelab_worker_weight",
        "The router's weight of the worker.",
        "gauge",
        &|r, l| {
            Some(format!(
                "{{{l},provenance=\"{}\"}} {}",
                r.provenance, r.weight
            ))
        },
    );
    gauge(
        &mut out,
        "routelab_worker_cap",
        "Concurrency cap of the worker (absent when uncapped).",
        "gauge",
        &|r, l| r.cap.map(|c| format!("{{{l}}} {c}")),
    );
    gauge(
        &mut out,
        "routelab_worker_up",
        "1 when the worker is routable.",
        "gauge",
        &|r, l| {
            Some(format!(
                "{{{l},state=\"{}\"}} {}",
                r.state,
                u8::from(r.state == "up")
            ))
        },
    );
    gauge(
        &mut out,
        "routelab_worker_probe_throughput_tok_s",
        "Last burst-probe throughput.",
        "gauge",
        &|r, l| r.probe_tok_s.map(|t| format!("{{{l}}} {t}")),
    );
    gauge(
        &mut out,
        "routelab_worker_requests_total",
        "Requests sent to the worker (probes excluded).",
        "counter",
        &|r, l| Some(format!("{{{l}}} {}", r.metrics.requests.load(Relaxed))),
    );
    gauge(
        &mut out,
        "routelab_worker_errors_total",
        "Requests that failed on the worker.",
        "counter",
        &|r, l| Some(format!("{{{l}}} {}", r.metrics.errors.load(Relaxed))),
    );
    gauge(
        &mut out,
        "routelab_worker_probes_total",
        "Probe bursts run.",
        "counter",
        &|r, l| {
            Some(format!(
                "{{{l},result=\"ok\"}} {}\nroutelab_worker_probes_total{{{l},result=\"failed\"}} {}",
                r.metrics.probes_ok.load(Relaxed),
                r.metrics.probes_failed.load(Relaxed)
            ))
        },
    );
    for (name, help, pick) in [
        (
            "routelab_worker_ttft_seconds",
            "Gateway arrival to first response byte.",
            0,
        ),
        (
            "routelab_worker_e2e_seconds",
            "Gateway arrival to last response byte.",
            1,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (r, l) in rows.iter().zip(&labels) {
            let h = if pick == 0 {
                &r.metrics.ttft
            } else {
                &r.metrics.e2e
            };
            h.render(&mut out, name, l);
        }
    }
    let _ = writeln!(
        out,
        "# HELP routelab_queue_length Requests waiting at the gateway.\n# TYPE routelab_queue_length gauge\nroutelab_queue_length {queue_len}"
    );
    let _ = writeln!(
        out,
        "# HELP routelab_queued_total Requests that waited in the queue.\n# TYPE routelab_queued_total counter\nroutelab_queued_total {}",
        global.queued_total.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP routelab_queue_timeouts_total Requests answered 429 after the queue timeout.\n# TYPE routelab_queue_timeouts_total counter\nroutelab_queue_timeouts_total {}",
        global.queue_timeouts.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP routelab_retries_total Requests retried on another worker.\n# TYPE routelab_retries_total counter\nroutelab_retries_total {}",
        global.retries.load(Relaxed)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut s = String::new();
        h.render(&mut s, "x", "a=\"b\"");
        assert!(s.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"));
        assert!(s.contains("x_bucket{a=\"b\",le=\"1\"} 2\n"));
        assert!(s.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"));
        assert!(s.contains("x_count{a=\"b\"} 3\n"));
        assert_eq!(h.count(), 3);
    }
}
