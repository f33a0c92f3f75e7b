//! Scalar summaries of a run ([`RunSummary`]), the per-worker rows ([`WorkerSummary`]) and the
//! metrics a comparison ranks policies by ([`Metric`]).

use crate::num::{r6, r6o};
use routelab_sim::RunMetrics;
use routelab_sim::histogram::Histogram;
use serde::{Deserialize, Serialize};

/// Mean and quantiles of a latency distribution, seconds (`null` when nothing was recorded).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Quantiles {
    /// Exact mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest value (exact).
    pub max: Option<f64>,
}

impl Quantiles {
    /// From a histogram of nanoseconds (6 significant digits).
    pub fn from_histogram(h: &Histogram) -> Quantiles {
        Quantiles {
            mean: r6o(h.mean_secs()),
            p50: r6o(h.quantile_secs(0.5)),
            p90: r6o(h.quantile_secs(0.9)),
            p99: r6o(h.quantile_secs(0.99)),
            max: r6o(h.quantile_secs(1.0)),
        }
    }
}

/// The scalar metrics of one policy's run (one seed): what `summary.json` reports per run, what
/// `compare` aggregates across seeds and what `sweep` tabulates. Every figure is rounded to
/// 6 significant digits; missing or undefined figures are `None` (JSON `null`, never NaN).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Policy name.
    pub policy: String,
    /// Customer requests that arrived.
    pub requests: u64,
    /// Completed.
    pub completed: u64,
    /// Failed (worker crashed after the first token, or retries exhausted).
    pub failed: u64,
    /// Rejected by the router.
    pub rejected: u64,
    /// Re-routed after their worker failed before the first token.
    pub retried: u64,
    /// Time to first token, s.
    pub ttft_s: Quantiles,
    /// End-to-end latency, s.
    pub e2e_s: Quantiles,
    /// Time per output token, s.
    pub tpot_s: Quantiles,
    /// Time queued at the gateway, s.
    pub queue_s: Quantiles,
    /// Customer output tokens completed.
    pub output_tokens: u64,
    /// Output tokens per second from the first arrival to the last completion.
    pub output_tok_s: Option<f64>,
    /// First arrival to last completion, s.
    pub span_s: Option<f64>,
    /// GPU-seconds spent in probe bursts.
    pub probe_gpu_s: Option<f64>,
    /// Probe bursts sent (warm-up and measurement).
    pub probe_bursts: u64,
    /// Probe bursts that became a measurement.
    pub probe_measurements: u64,
    /// Fraction of prompt tokens served from engine prefix caches (engine truth).
    pub prefix_hit_fraction: Option<f64>,
    /// Fraction of prompt tokens the router believed cached.
    pub believed_prefix_hit_fraction: Option<f64>,
    /// Fraction of requests whose TTFT and TPOT met the SLO.
    pub slo_attainment: Option<f64>,
}

impl RunSummary {
    /// Extract the scalar metrics of a run.
    pub fn from_metrics(m: &RunMetrics) -> RunSummary {
        let span_ns = m.last_completion_ns.saturating_sub(m.first_arrival_ns);
        RunSummary {
            policy: m.policy.clone(),
            requests: m.requests,
            completed: m.completed,
            failed: m.failed,
            rejected: m.rejected,
            retried: m.retried,
            ttft_s: Quantiles::from_histogram(&m.ttft),
            e2e_s: Quantiles::from_histogram(&m.e2e),
            tpot_s: Quantiles::from_histogram(&m.tpot),
            queue_s: Quantiles::from_histogram(&m.queue),
            output_tokens: m.output_tokens,
            output_tok_s: r6(m.output_tok_s()),
            span_s: r6(span_ns as f64 / 1e9),
            probe_gpu_s: r6(m.probe_gpu_s),
            probe_bursts: m.probe_bursts,
            probe_measurements: m.probe_measurements,
            prefix_hit_fraction: r6(m.prefix_hit_fraction()),
            believed_prefix_hit_fraction: r6(m.believed_hit_fraction()),
            slo_attainment: r6(m.slo_attainment()),
        }
    }
}

/// One worker's totals in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSummary {
    /// Worker name.
    pub id: String,
    /// Customer requests dispatched to it (retries count again).
    pub requests: u64,
    /// Its fraction of all dispatches of the run.
    pub share: Option<f64>,
    /// Completed on it.
    pub completed: u64,
    /// Failed on it.
    pub failed: u64,
    /// Customer output tokens completed on it.
    pub output_tokens: u64,
    /// Weight at the end of the run.
    pub weight: Option<f64>,
    /// Where that weight came from (`default`, `table`, `measured`, `pinned`, `oracle`).
    pub provenance: String,
    /// Probe bursts it served.
    pub probe_bursts: u64,
}

impl WorkerSummary {
    /// The per-worker rows of a run, in fleet order.
    pub fn from_metrics(m: &RunMetrics) -> Vec<WorkerSummary> {
        let total: u64 = m.workers.iter().map(|w| w.requests).sum();
        m.workers
            .iter()
            .map(|w| WorkerSummary {
                id: w.name.clone(),
                requests: w.requests,
                share: if total == 0 {
                    Some(0.0)
                } else {
                    r6(w.requests as f64 / total as f64)
                },
                completed: w.completed,
                failed: w.failed,
                output_tokens: w.output_tokens,
                weight: r6(w.final_weight),
                provenance: w.final_provenance.as_str().to_string(),
                probe_bursts: w.probe_bursts,
            })
            .collect()
    }
}

/// Which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Smaller is better (latency, failures, probe cost).
    Lower,
    /// Larger is better (throughput, SLO attainment, cache hits).
    Higher,
}

/// A scalar metric of a [`RunSummary`] that policies are ranked by.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Stable key (`e2e_mean_s`), used in JSON and CSV.
    pub key: &'static str,
    /// Human label (`e2e mean`).
    pub label: &'static str,
    /// Unit (`s`, `tok/s`, `fraction`, `GPU-s`, `requests`).
    pub unit: &'static str,
    /// Which way is better.
    pub better: Better,
    get: fn(&RunSummary) -> Option<f64>,
}

impl Metric {
    /// The value of this metric in a summary.
    pub fn value(&self, s: &RunSummary) -> Option<f64> {
        (self.get)(s).filter(|v| v.is_finite())
    }

    /// Whether `a` is strictly better than `b`.
    pub fn is_better(&self, a: f64, b: f64) -> bool {
        match self.better {
            Better::Lower => a < b,
            Better::Higher => a > b,
        }
    }

    /// Look a metric up by key.
    pub fn by_key(key: &str) -> Option<&'static Metric> {
        METRICS.iter().find(|m| m.key == key)
    }
}

macro_rules! metric {
    ($key:literal, $label:literal, $unit:literal, $better:ident, |$s:ident| $e:expr) => {
        Metric {
            key: $key,
            label: $label,
            unit: $unit,
            better: Better::$better,
            get: |$s: &RunSummary| $e,
        }
    };
}

/// Every metric a comparison ranks, in report order.
pub const METRICS: &[Metric] = &[
    metric!("ttft_mean_s", "TTFT mean", "s", Lower, |s| s.ttft_s.mean),
    metric!("ttft_p50_s", "TTFT p50", "s", Lower, |s| s.ttft_s.p50),
    metric!("ttft_p99_s", "TTFT p99", "s", Lower, |s| s.ttft_s.p99),
    metric!("e2e_mean_s", "e2e mean", "s", Lower, |s| s.e2e_s.mean),
    metric!("e2e_p50_s", "e2e p50", "s", Lower, |s| s.e2e_s.p50),
    metric!("e2e_p99_s", "e2e p99", "s", Lower, |s| s.e2e_s.p99),
    metric!("tpot_mean_s", "TPOT mean", "s", Lower, |s| s.tpot_s.mean),
    metric!("tpot_p99_s", "TPOT p99", "s", Lower, |s| s.tpot_s.p99),
    metric!("queue_mean_s", "queue mean", "s", Lower, |s| s.queue_s.mean),
    metric!("output_tok_s", "output tok/s", "tok/s", Higher, |s| s
        .output_tok_s),
    metric!(
        "slo_attainment",
        "SLO attainment",
        "fraction",
        Higher,
        |s| s.slo_attainment
    ),
    metric!(
        "prefix_hit_fraction",
        "prefix hit",
        "fraction",
        Higher,
        |s| s.prefix_hit_fraction
    ),
    metric!("probe_gpu_s", "probe GPU-s", "GPU-s", Lower, |s| s
        .probe_gpu_s),
    metric!("failed", "failed", "requests", Lower, |s| Some(
        s.failed as f64
    )),
];

/// Column names of [`summary_csv_fields`].
pub(crate) fn summary_csv_header() -> Vec<&'static str> {
    vec![
        "requests",
        "completed",
        "failed",
        "rejected",
        "retried",
        "ttft_mean_s",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "e2e_mean_s",
        "e2e_p50_s",
        "e2e_p90_s",
        "e2e_p99_s",
        "tpot_mean_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "tpot_p99_s",
        "queue_mean_s",
        "queue_p99_s",
        "output_tokens",
        "output_tok_s",
        "span_s",
        "probe_gpu_s",
        "probe_bursts",
        "probe_measurements",
        "prefix_hit_fraction",
        "believed_prefix_hit_fraction",
        "slo_attainment",
    ]
}

/// The scalar fields of a summary as CSV cells (empty for missing values).
pub(crate) fn summary_csv_fields(s: &RunSummary) -> Vec<String> {
    let o = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    vec![
        s.requests.to_string(),
        s.completed.to_string(),
        s.failed.to_string(),
        s.rejected.to_string(),
        s.retried.to_string(),
        o(s.ttft_s.mean),
        o(s.ttft_s.p50),
        o(s.ttft_s.p90),
        o(s.ttft_s.p99),
        o(s.e2e_s.mean),
        o(s.e2e_s.p50),
        o(s.e2e_s.p90),
        o(s.e2e_s.p99),
        o(s.tpot_s.mean),
        o(s.tpot_s.p50),
        o(s.tpot_s.p90),
        o(s.tpot_s.p99),
        o(s.queue_s.mean),
        o(s.queue_s.p99),
        s.output_tokens.to_string(),
        o(s.output_tok_s),
        o(s.span_s),
        o(s.probe_gpu_s),
        s.probe_bursts.to_string(),
        s.probe_measurements.to_string(),
        o(s.prefix_hit_fraction),
        o(s.believed_prefix_hit_fraction),
        o(s.slo_attainment),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_histogram_gives_nulls() {
        let q = Quantiles::from_histogram(&Histogram::new());
        assert_eq!(q, Quantiles::default());
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(
            json,
            r#"{"mean":null,"p50":null,"p90":null,"p99":null,"max":null}"#
        );
    }

    #[test]
    fn metric_keys_are_unique_and_csv_is_aligned() {
        for (i, a) in METRICS.iter().enumerate() {
            assert!(METRICS[i + 1..].iter().all(|b| b.key != a.key), "{}", a.key);
            assert!(Metric::by_key(a.key).is_some());
        }
        let mut h = Histogram::new();
        h.record_secs(1.5);
        let q = Quantiles::from_histogram(&h);
        assert_eq!(q.p50, Some(1.5));
        assert_eq!(q.mean, Some(1.5));
        let lower = Metric::by_key("e2e_mean_s").unwrap();
        assert!(lower.is_better(1.0, 2.0));
        let higher = Metric::by_key("output_tok_s").unwrap();
        assert!(higher.is_better(2.0, 1.0));
    }
}
