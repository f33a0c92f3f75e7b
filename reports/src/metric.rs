//! The one metric catalog: every scalar routelab reports about a run, defined once.
//!
//! Each [`Metric`] is a name, a label, a unit, a [`Direction`], a description, how to read it
//! from a [`RunMetrics`], and where it appears (its key in `summary.json`, whether it is a CSV
//! column, whether the regression gate tracks it). `summary.json`, every CSV, the console and
//! HTML tables, `compare`, `sweep` and `check` all take their metrics from [`CATALOG`]; the few
//! outputs that show a hand-picked subset (a terminal table, the comparison ranking) name their
//! columns in [`views`].
//!
//! **Missing is not zero**: a metric a run has no value for (no latency when nothing completed,
//! no throughput over an empty span) reads as `None` — `null` in JSON, an empty CSV cell, `-`
//! in a table — and the gate treats a missing value where its baseline had one as a
//! regression.

use crate::num::{fmt_pct, fmt_sig, r6};
use routelab_sim::histogram::Histogram;
use routelab_sim::{ReplicaTotals, RunMetrics};

/// Which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Smaller is better (latency, failures, probe cost).
    Lower,
    /// Larger is better (throughput, SLO attainment, cache hits).
    Higher,
    /// Neither: reported when it moves, never ranked, never a regression (request counts,
    /// traffic shares, weights).
    Neutral,
}

impl Direction {
    /// `lower`, `higher` or `neutral` (the `better` column of `compare.csv`).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Lower => "lower",
            Direction::Higher => "higher",
            Direction::Neutral => "neutral",
        }
    }

    /// Whether `a` is strictly better than `b` (never for a neutral metric).
    pub fn is_better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Lower => a < b,
            Direction::Higher => a > b,
            Direction::Neutral => false,
        }
    }
}

/// Unit of a metric; counts are whole numbers and print without decimals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// Tokens per second.
    TokensPerSecond,
    /// Requests per second.
    RequestsPerSecond,
    /// A fraction in [0, 1], printed as a percentage.
    Fraction,
    /// GPU-seconds.
    GpuSeconds,
    /// A count of requests.
    Requests,
    /// A count of tokens.
    Tokens,
    /// A count of probe bursts.
    Bursts,
    /// A router weight (dimensionless).
    Weight,
    /// The absolute natural log of a ratio (0: equal; 0.69: a factor of 2 either way).
    LogRatio,
    /// Tokens per request, averaged or a quantile (not a count: a mean keeps its decimals).
    TokensPerRequest,
}

impl Unit {
    /// The unit as printed (`s`, `tok/s`, `req/s`, `fraction`, `GPU-s`, `requests`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Seconds => "s",
            Unit::TokensPerSecond => "tok/s",
            Unit::RequestsPerSecond => "req/s",
            Unit::Fraction => "fraction",
            Unit::GpuSeconds => "GPU-s",
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::Bursts => "bursts",
            Unit::Weight => "weight",
            Unit::LogRatio => "|ln ratio|",
            Unit::TokensPerRequest => "tokens/request",
        }
    }

    /// A whole-number count (never rounded, written as an integer).
    pub fn is_count(self) -> bool {
        matches!(self, Unit::Requests | Unit::Tokens | Unit::Bursts)
    }
}

/// Where a metric sits in `summary.json` (and in every file that flattens a run summary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonKey {
    /// A top-level key of the run entry.
    Top(&'static str),
    /// A key inside an object of the run entry (`ttft_s.p50`); consecutive entries of the same
    /// object are written together.
    Nested(&'static str, &'static str),
    /// Not in `summary.json` (the gate's `lost`).
    Absent,
}

/// One metric of a run.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Stable name (`e2e_mean_s`): CSV column, gate and baseline key, `compare.json` key.
    pub name: &'static str,
    /// Human label (`e2e mean`).
    pub label: &'static str,
    /// Unit.
    pub unit: Unit,
    /// Which way is better.
    pub direction: Direction,
    /// One sentence for people.
    pub description: &'static str,
    /// Its place in `summary.json`.
    pub json: JsonKey,
    /// A column of the per-run CSVs (`compare_seeds.csv`, `sweep.csv`).
    pub csv: bool,
    /// Tracked by the regression gate (and so a key of `baselines/*.json`).
    pub gate: bool,
    read: fn(&RunMetrics) -> Option<f64>,
}

impl Metric {
    /// The exact value in a run (`None`: the run has no value for it; never NaN).
    pub fn read(&self, m: &RunMetrics) -> Option<f64> {
        (self.read)(m).filter(|v| v.is_finite())
    }

    /// The value as reported in summaries: counts exact, everything else to 6 significant
    /// digits.
    pub fn reported(&self, m: &RunMetrics) -> Option<f64> {
        let v = self.read(m)?;
        if self.unit.is_count() { Some(v) } else { r6(v) }
    }

    /// A single run's value for a table: counts as integers, fractions as percentages, the
    /// rest to 3 significant digits; `-` when missing.
    pub fn fmt_value(&self, v: Option<f64>) -> String {
        match v {
            Some(v) if self.unit.is_count() => format!("{v:.0}"),
            _ => self.fmt_stat(v),
        }
    }

    /// An aggregate (e.g. a mean across seeds) for a table: fractions as percentages, the
    /// rest to 3 significant digits; `-` when missing.
    pub fn fmt_stat(&self, v: Option<f64>) -> String {
        match self.unit {
            Unit::Fraction => fmt_pct(v),
            _ => fmt_sig(v, 3),
        }
    }

    /// Position of this metric in [`CATALOG`].
    pub fn index(&self) -> usize {
        CATALOG
            .iter()
            .position(|m| m.name == self.name)
            .expect("every Metric is a CATALOG entry")
    }
}

/// Look a metric up by name.
pub fn by_name(name: &str) -> Option<&'static Metric> {
    CATALOG.iter().find(|m| m.name == name)
}

/// Look a metric of a view up; views name only catalog entries (a unit test checks it).
pub(crate) fn view(name: &str) -> &'static Metric {
    by_name(name).unwrap_or_else(|| panic!("view names unknown metric `{name}`"))
}

fn count(v: u64) -> Option<f64> {
    Some(v as f64)
}

fn mean(h: &Histogram) -> Option<f64> {
    h.mean_secs()
}

fn quantile(h: &Histogram, q: f64) -> Option<f64> {
    h.quantile_secs(q)
}

/// First arrival to last completion, ns; 0 when nothing completed.
fn span_ns(m: &RunMetrics) -> u64 {
    m.last_completion_ns.saturating_sub(m.first_arrival_ns)
}

/// `n` per second of the run's span (first arrival to last completion, the duration every
/// rate of the catalog is over); `None` over an empty span.
fn per_span_second(m: &RunMetrics, n: u64) -> Option<f64> {
    let span = span_ns(m);
    (span > 0).then(|| n as f64 / (span as f64 / 1e9))
}

macro_rules! metric {
    ($name:literal, $label:literal, $unit:ident, $dir:ident, $json:expr, csv: $csv:literal,
     gate: $gate:literal, $desc:literal, |$m:ident| $e:expr) => {
        Metric {
            name: $name,
            label: $label,
            unit: Unit::$unit,
            direction: Direction::$dir,
            description: $desc,
            json: $json,
            csv: $csv,
            gate: $gate,
            read: |$m: &RunMetrics| $e,
        }
    };
}

use JsonKey::{Absent, Nested, Top};

/// Every metric of a run, in `summary.json` order (CSV columns follow the same order).
/// Adding a metric is adding one entry here.
pub const CATALOG: &[Metric] = &[
    metric!("requests", "requests", Requests, Neutral, Top("requests"), csv: true, gate: false,
        "Customer requests that arrived.", |m| count(m.requests)),
    metric!("completed", "completed", Requests, Higher, Top("completed"), csv: true, gate: true,
        "Customer requests completed.", |m| count(m.completed)),
    metric!("failed", "failed", Requests, Lower, Top("failed"), csv: true, gate: true,
        "Failed: the worker crashed after the first token, or retries were exhausted.",
        |m| count(m.failed)),
    metric!("rejected", "rejected", Requests, Lower, Top("rejected"), csv: true, gate: true,
        "Rejected by the router (no worker for the model, prompt too long).",
        |m| count(m.rejected)),
    metric!("rejected_context_window", "rejected: too long", Requests, Lower,
        Nested("rejected_by", "context_window"), csv: false, gate: false,
        "Rejected because prompt + output exceed every worker's context window.",
        |m| count(m.rejections.context_window)),
    metric!("rejected_no_worker", "rejected: no worker", Requests, Lower,
        Nested("rejected_by", "no_worker"), csv: false, gate: false,
        "Rejected because no worker serves the model.", |m| count(m.rejections.no_worker)),
    metric!("lost", "lost", Requests, Lower, Absent, csv: false, gate: true,
        "Requests neither completed, failed loudly nor rejected: must always be 0.",
        |m| count(m.requests.saturating_sub(m.completed + m.failed + m.rejected))),
    metric!("retried", "retried", Requests, Neutral, Top("retried"), csv: true, gate: false,
        "Re-routed after their worker failed before the first token.", |m| count(m.retried)),
    metric!("ttft_mean_s", "TTFT mean", Seconds, Lower, Nested("ttft_s", "mean"), csv: true,
        gate: true, "Mean time to first token (vLLM: TTFT).", |m| mean(&m.ttft)),
    metric!("ttft_p50_s", "TTFT p50", Seconds, Lower, Nested("ttft_s", "p50"), csv: true,
        gate: true, "Median time to first token.", |m| quantile(&m.ttft, 0.5)),
    metric!("ttft_p90_s", "TTFT p90", Seconds, Lower, Nested("ttft_s", "p90"), csv: true,
        gate: false, "90th percentile of the time to first token.", |m| quantile(&m.ttft, 0.9)),
    metric!("ttft_p99_s", "TTFT p99", Seconds, Lower, Nested("ttft_s", "p99"), csv: true,
        gate: true, "99th percentile of the time to first token.",
        |m| quantile(&m.ttft, 0.99)),
    metric!("ttft_max_s", "TTFT max", Seconds, Lower, Nested("ttft_s", "max"), csv: false,
        gate: false, "Largest time to first token.", |m| quantile(&m.ttft, 1.0)),
    metric!("e2e_mean_s", "e2e mean", Seconds, Lower, Nested("e2e_s", "mean"), csv: true,
        gate: true, "Mean end-to-end latency, arrival to last token (vLLM: E2EL).", |m| mean(&m.e2e)),
    metric!("e2e_p50_s", "e2e p50", Seconds, Lower, Nested("e2e_s", "p50"), csv: true,
        gate: true, "Median end-to-end latency.", |m| quantile(&m.e2e, 0.5)),
    metric!("e2e_p90_s", "e2e p90", Seconds, Lower, Nested("e2e_s", "p90"), csv: true,
        gate: true, "90th percentile of the end-to-end latency.", |m| quantile(&m.e2e, 0.9)),
    metric!("e2e_p99_s", "e2e p99", Seconds, Lower, Nested("e2e_s", "p99"), csv: true,
        gate: true, "99th percentile of the end-to-end latency.", |m| quantile(&m.e2e, 0.99)),
    metric!("e2e_max_s", "e2e max", Seconds, Lower, Nested("e2e_s", "max"), csv: false,
        gate: true, "Largest end-to-end latency (when the last request finished).",
        |m| quantile(&m.e2e, 1.0)),
    metric!("tpot_mean_s", "TPOT mean", Seconds, Lower, Nested("tpot_s", "mean"), csv: true,
        gate: false, "Mean time per output token after the first, per request (vLLM: TPOT).", |m| mean(&m.tpot)),
    metric!("tpot_p50_s", "TPOT p50", Seconds, Lower, Nested("tpot_s", "p50"), csv: true,
        gate: true, "Median time per output token.", |m| quantile(&m.tpot, 0.5)),
    metric!("tpot_p90_s", "TPOT p90", Seconds, Lower, Nested("tpot_s", "p90"), csv: true,
        gate: false, "90th percentile of the time per output token.",
        |m| quantile(&m.tpot, 0.9)),
    metric!("tpot_p99_s", "TPOT p99", Seconds, Lower, Nested("tpot_s", "p99"), csv: true,
        gate: true, "99th percentile of the time per output token.",
        |m| quantile(&m.tpot, 0.99)),
    metric!("tpot_max_s", "TPOT max", Seconds, Lower, Nested("tpot_s", "max"), csv: false,
        gate: false, "Largest time per output token.", |m| quantile(&m.tpot, 1.0)),
    metric!("queue_mean_s", "queue mean", Seconds, Lower, Nested("queue_s", "mean"),
        csv: true, gate: true, "Mean time queued at the gateway.", |m| mean(&m.queue)),
    metric!("queue_p50_s", "queue p50", Seconds, Lower, Nested("queue_s", "p50"), csv: false,
        gate: false, "Median time queued at the gateway.", |m| quantile(&m.queue, 0.5)),
    metric!("queue_p90_s", "queue p90", Seconds, Lower, Nested("queue_s", "p90"), csv: false,
        gate: false, "90th percentile of the gateway queue time.",
        |m| quantile(&m.queue, 0.9)),
    metric!("queue_p99_s", "queue p99", Seconds, Lower, Nested("queue_s", "p99"), csv: true,
        gate: false, "99th percentile of the gateway queue time.",
        |m| quantile(&m.queue, 0.99)),
    metric!("queue_max_s", "queue max", Seconds, Lower, Nested("queue_s", "max"), csv: false,
        gate: false, "Longest gateway queue time.", |m| quantile(&m.queue, 1.0)),
    metric!("output_tokens", "output tokens", Tokens, Higher, Top("output_tokens"), csv: true,
        gate: false, "Customer output tokens completed.", |m| count(m.output_tokens)),
    metric!("output_tok_s", "output tok/s", TokensPerSecond, Higher, Top("output_tok_s"),
        csv: true, gate: true,
        "Output tokens per second from the first arrival to the last completion (vLLM: output token throughput).",
        |m| (span_ns(m) > 0).then(|| m.output_tok_s())),
    metric!("span_s", "span", Seconds, Neutral, Top("span_s"), csv: true, gate: false,
        "First arrival to last completion.",
        |m| (span_ns(m) > 0).then(|| span_ns(m) as f64 / 1e9)),
    metric!("probe_gpu_s", "probe GPU-s", GpuSeconds, Lower, Top("probe_gpu_s"), csv: true,
        gate: true, "GPU-seconds spent in probe bursts.", |m| Some(m.probe_gpu_s)),
    metric!("probe_bursts", "probe bursts", Bursts, Lower, Top("probe_bursts"), csv: true,
        gate: false, "Probe bursts sent (warm-up and measurement).", |m| count(m.probe_bursts)),
    metric!("probe_measurements", "probe measurements", Bursts, Neutral,
        Top("probe_measurements"), csv: true, gate: false,
        "Probe bursts that became a measurement.", |m| count(m.probe_measurements)),
    metric!("prefix_hit_fraction", "prefix hit", Fraction, Higher, Top("prefix_hit_fraction"),
        csv: true, gate: true,
        "Fraction of completed prompt tokens served from engine prefix caches (engine truth).",
        |m| (m.prompt_tokens > 0).then(|| m.prefix_hit_fraction())),
    metric!("believed_prefix_hit_fraction", "believed prefix hit", Fraction, Neutral,
        Top("believed_prefix_hit_fraction"), csv: true, gate: false,
        "Fraction of completed prompt tokens the router believed cached.",
        |m| (m.prompt_tokens > 0).then(|| m.believed_hit_fraction())),
    metric!("slo_attainment", "SLO attainment", Fraction, Higher, Top("slo_attainment"),
        csv: true, gate: true, "Fraction of requests whose TTFT and TPOT met the SLO.",
        |m| m.slo_attainment()),
    // Added after the gate's metrics so that every existing key and CSV column keeps its place;
    // none is gate-tracked (the baselines do not carry them).
    metric!("request_throughput", "request throughput", RequestsPerSecond, Higher,
        Top("request_throughput"), csv: true, gate: false,
        "Completed requests per second from the first arrival to the last completion \
         (vLLM: request throughput).",
        |m| per_span_second(m, m.completed)),
    metric!("total_token_throughput", "total token throughput", TokensPerSecond, Higher,
        Top("total_token_throughput"), csv: true, gate: false,
        "Prompt plus output tokens of completed requests per second from the first arrival to \
         the last completion (vLLM: total token throughput).",
        |m| per_span_second(m, m.prompt_tokens + m.output_tokens)),
    metric!("goodput", "goodput", RequestsPerSecond, Higher, Top("goodput"), csv: true,
        gate: false,
        "Completed requests that met every per-request SLO bound (TTFT, TPOT and, when set, \
         E2EL), per second \
         from the first arrival to the last completion (DistServe's goodput; vLLM: request \
         goodput).",
        |m| per_span_second(m, m.slo_met)),
    metric!("itl_mean_s", "ITL mean", Seconds, Lower, Nested("itl_s", "mean"), csv: true,
        gate: false,
        "Mean inter-token latency over every gap between output tokens (vLLM: ITL). The \
         simulator has no per-token events: a request's gaps are its mean, (E2EL - TTFT) / \
         (output - 1), counted once per gap, which is what vLLM's pooled ITL estimates.",
        |m| mean(&m.itl)),
    metric!("itl_p50_s", "ITL p50", Seconds, Lower, Nested("itl_s", "p50"), csv: true,
        gate: false, "Median inter-token latency, each request's mean gap weighted by its gaps.",
        |m| quantile(&m.itl, 0.5)),
    metric!("itl_p90_s", "ITL p90", Seconds, Lower, Nested("itl_s", "p90"), csv: false,
        gate: false,
        "90th percentile of the inter-token latency, each request's mean gap weighted by its \
         gaps.",
        |m| quantile(&m.itl, 0.9)),
    metric!("itl_p99_s", "ITL p99", Seconds, Lower, Nested("itl_s", "p99"), csv: true,
        gate: false,
        "99th percentile of the inter-token latency, each request's mean gap weighted by its \
         gaps.",
        |m| quantile(&m.itl, 0.99)),
    // The weight error (issue 10): how far the router's weights were from the oracle's. The
    // headline rates each engine where the traffic runs it (issue 27); the reference before
    // that, every engine at the scenario's oracle_concurrency, is kept beside it.
    metric!("weight_error", "weight error", LogRatio, Lower, Top("weight_error"), csv: true,
        gate: false,
        "Time-averaged |ln(weight / oracle weight)| over every worker's active time (a \
         time-weighted mean over workers); the oracle weight is the worker's capacity at its \
         operating concurrency (the sequences it decoded, time-averaged over its active time so \
         far, re-estimated at 1, 2, 4, … 32 s, then every minute of simulated time, and at \
         every fleet change) relative to the median of the model's active workers, clamped as \
         the oracle strategy clamps it. \
         Weights are compared as the router holds them (table and live weights are not \
         normalised to their median).",
        |m| m.weight_error().mean()),
    metric!("weight_error_after_10m", "weight error after 10 min", LogRatio, Lower,
        Top("weight_error_after_10m"), csv: true, gate: false,
        "The weight error from the 10th minute of simulated time on: the steady state, \
         without registration and first measurements, against operating concurrencies \
         averaged over at least 10 minutes.",
        |m| m.weight_error().after_warmup()),
    metric!("weight_error_at_oracle_concurrency", "weight error at oracle concurrency",
        LogRatio, Lower, Top("weight_error_at_oracle_concurrency"), csv: true, gate: false,
        "The weight error against the oracle that rates every engine at the scenario's \
         oracle_concurrency (16 unless set) instead of its operating concurrency: what the \
         probe measures, and what weight_error meant before issue 27.",
        |m| m.weight_error_at_oracle_concurrency().mean()),
    metric!("weight_error_at_oracle_concurrency_after_10m",
        "weight error at oracle concurrency after 10 min", LogRatio, Lower,
        Top("weight_error_at_oracle_concurrency_after_10m"), csv: true, gate: false,
        "The weight error at the oracle concurrency from the 10th minute of simulated time on.",
        |m| m.weight_error_at_oracle_concurrency().after_warmup()),
    // ---- overlap regret (issue 10 §4): a neutral diagnostic of what the router knows, not a
    // gate metric — a policy without prefix affinity has a large regret by design and can
    // still be the better policy; its cost shows in the latency metrics the gate tracks.
    metric!("overlap_regret_mean_tokens", "overlap regret mean", TokensPerRequest, Neutral,
        Nested("overlap_regret_tokens", "mean"), csv: true, gate: false,
        "Mean over routed requests with a prefix of the best cached prompt overlap (tokens) \
         among the eligible workers' engines minus the chosen worker's, at routing time \
         (engine truth, whatever the router believed).",
        |m| m.overlap_regret.mean()),
    metric!("overlap_regret_p99_tokens", "overlap regret p99", TokensPerRequest, Neutral,
        Nested("overlap_regret_tokens", "p99"), csv: true, gate: false,
        "99th percentile over routed requests with a prefix of the best cached prompt overlap \
         (tokens) among the eligible workers' engines minus the chosen worker's.",
        |m| m.overlap_regret.quantile(0.99).map(|t| t as f64)),
    // ---- end overlap regret
];

/// A per-worker metric: one value per worker of a run.
#[derive(Debug, Clone, Copy)]
pub struct WorkerMetric {
    /// Name; the gate keys a worker's value as `name:worker` (`share:pair`).
    pub name: &'static str,
    /// Unit.
    pub unit: Unit,
    /// Which way is better.
    pub direction: Direction,
    /// One sentence for people.
    pub description: &'static str,
    read: fn(&RunMetrics, usize) -> Option<f64>,
}

impl WorkerMetric {
    /// Its value for worker `i` of the run (`None` when it has none or there is no such
    /// worker).
    pub fn read(&self, m: &RunMetrics, i: usize) -> Option<f64> {
        (self.read)(m, i).filter(|v| v.is_finite())
    }

    /// The gate's key of this metric for a worker.
    pub fn key(&self, worker: &str) -> String {
        format!("{}:{worker}", self.name)
    }
}

/// Fraction of all dispatches of the run that went to worker `i`.
pub fn share(m: &RunMetrics, i: usize) -> Option<f64> {
    let total: u64 = m.workers.iter().map(|w| w.requests).sum();
    let w = m.workers.get(i)?;
    // No dispatches at all: every worker received none of them.
    Some(if total == 0 {
        0.0
    } else {
        w.requests as f64 / total as f64
    })
}

/// Every per-worker metric the gate tracks.
pub const WORKER_METRICS: &[WorkerMetric] = &[
    WorkerMetric {
        name: "share",
        unit: Unit::Fraction,
        direction: Direction::Neutral,
        description: "The worker's fraction of all dispatches of the run.",
        read: share,
    },
    WorkerMetric {
        name: "weight",
        unit: Unit::Weight,
        direction: Direction::Neutral,
        description: "The router's weight of the worker at the end of the run.",
        read: |m, i| m.workers.get(i).map(|w| w.final_weight),
    },
];

/// A metric of one gateway replica in a run with several (`summary.json`'s `replicas` list):
/// a [`CATALOG`] metric — its name, label, unit, direction and description — read from the
/// requests that replica routed and the weights it held.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaMetric {
    /// The catalog metric it is (`ttft_mean_s`); its key in each replica's entry.
    pub name: &'static str,
    read: fn(&ReplicaTotals) -> Option<f64>,
}

impl ReplicaMetric {
    /// The catalog entry it shares its label, unit, direction and description with.
    pub fn metric(&self) -> &'static Metric {
        view(self.name)
    }

    /// Its exact value for a replica (`None`: no value, never NaN).
    pub fn read(&self, r: &ReplicaTotals) -> Option<f64> {
        (self.read)(r).filter(|v| v.is_finite())
    }

    /// The value as reported in summaries (the catalog's rounding).
    pub fn reported(&self, r: &ReplicaTotals) -> Option<f64> {
        let v = self.read(r)?;
        if self.metric().unit.is_count() {
            Some(v)
        } else {
            r6(v)
        }
    }
}

/// The per-replica metrics, in `summary.json` order: what each replica routed, the routing
/// quality of its decisions (weight error, overlap regret) and the latency of its requests.
pub const REPLICA_METRICS: &[ReplicaMetric] = &[
    ReplicaMetric {
        name: "requests",
        read: |r| count(r.routed),
    },
    ReplicaMetric {
        name: "completed",
        read: |r| count(r.completed),
    },
    ReplicaMetric {
        name: "weight_error",
        read: |r| r.weight_error.mean(),
    },
    ReplicaMetric {
        name: "weight_error_at_oracle_concurrency",
        read: |r| r.weight_error_at_oracle_concurrency.mean(),
    },
    ReplicaMetric {
        name: "overlap_regret_mean_tokens",
        read: |r| r.overlap_regret.mean(),
    },
    ReplicaMetric {
        name: "overlap_regret_p99_tokens",
        read: |r| r.overlap_regret.quantile(0.99).map(|v| v as f64),
    },
    ReplicaMetric {
        name: "ttft_mean_s",
        read: |r| mean(&r.ttft),
    },
    ReplicaMetric {
        name: "ttft_p99_s",
        read: |r| quantile(&r.ttft, 0.99),
    },
    ReplicaMetric {
        name: "e2e_mean_s",
        read: |r| mean(&r.e2e),
    },
    ReplicaMetric {
        name: "e2e_p99_s",
        read: |r| quantile(&r.e2e, 0.99),
    },
];

/// The direction of a gate key: a catalog metric's, or a per-worker metric's (`share:pair`).
/// `None` for a key that names no metric.
pub fn direction_of_key(key: &str) -> Option<Direction> {
    match key.split_once(':') {
        Some((prefix, worker)) if !worker.is_empty() => WORKER_METRICS
            .iter()
            .find(|w| w.name == prefix)
            .map(|w| w.direction),
        Some(_) => None,
        None => by_name(key).filter(|m| m.gate).map(|m| m.direction),
    }
}

/// The hand-picked columns of outputs that show a subset of the catalog, each by metric name
/// (with the column header where the table abbreviates the label).
pub mod views {
    /// Metrics `compare` ranks policies by, in report order (`compare.json`, `compare.csv`).
    pub const RANKED: &[&str] = &[
        "ttft_mean_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "e2e_mean_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "tpot_mean_s",
        "tpot_p99_s",
        "queue_mean_s",
        "output_tok_s",
        "slo_attainment",
        "prefix_hit_fraction",
        "probe_gpu_s",
        "failed",
        "weight_error",
        "weight_error_after_10m",
        "weight_error_at_oracle_concurrency",
        "weight_error_at_oracle_concurrency_after_10m",
    ];

    /// The comparison's key metrics: the HTML table, its winners and the findings.
    pub const COMPARE_KEY: &[&str] = &[
        "ttft_mean_s",
        "ttft_p99_s",
        "e2e_mean_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "tpot_mean_s",
        "output_tok_s",
        "slo_attainment",
        "prefix_hit_fraction",
        "probe_gpu_s",
        "failed",
    ];

    /// Columns of the comparison's terminal table.
    pub const COMPARE_TERMINAL: &[&str] = &[
        "ttft_mean_s",
        "ttft_p99_s",
        "e2e_mean_s",
        "e2e_p99_s",
        "output_tok_s",
        "slo_attainment",
        "probe_gpu_s",
        "failed",
        "rejected",
    ];

    /// Columns (metric, header) of the run's terminal table.
    pub const RUN_TERMINAL: &[(&str, &str)] = &[
        ("requests", "req"),
        ("completed", "done"),
        ("failed", "fail"),
        ("rejected", "rej"),
        ("ttft_mean_s", "TTFT mean"),
        ("ttft_p50_s", "p50"),
        ("ttft_p99_s", "p99"),
        ("e2e_mean_s", "e2e mean"),
        ("e2e_p50_s", "p50"),
        ("e2e_p99_s", "p99"),
        ("output_tok_s", "tok/s"),
        ("probe_gpu_s", "probe GPU-s"),
        ("prefix_hit_fraction", "prefix"),
        ("slo_attainment", "SLO"),
    ];

    /// Columns (metric, header) of the run report's summary table.
    pub const RUN_HTML: &[(&str, &str)] = &[
        ("requests", "requests"),
        ("completed", "completed"),
        ("failed", "failed"),
        ("rejected", "rejected"),
        ("ttft_mean_s", "TTFT mean"),
        ("ttft_p50_s", "TTFT p50"),
        ("ttft_p90_s", "TTFT p90"),
        ("ttft_p99_s", "TTFT p99"),
        ("e2e_mean_s", "e2e mean"),
        ("e2e_p50_s", "e2e p50"),
        ("e2e_p90_s", "e2e p90"),
        ("e2e_p99_s", "e2e p99"),
        ("output_tok_s", "output tok/s"),
        ("probe_gpu_s", "probe GPU-s"),
        ("prefix_hit_fraction", "prefix hit"),
        ("slo_attainment", "SLO"),
        ("request_throughput", "request throughput"),
        ("total_token_throughput", "total tok/s"),
        ("goodput", "goodput"),
        ("itl_p99_s", "ITL p99"),
    ];

    /// Columns (metric, header) of the sweep's terminal table.
    pub const SWEEP_TERMINAL: &[(&str, &str)] = &[
        ("requests", "req"),
        ("failed", "fail"),
        ("rejected", "rej"),
        ("ttft_mean_s", "TTFT mean"),
        ("ttft_p99_s", "TTFT p99"),
        ("e2e_mean_s", "e2e mean"),
        ("e2e_p99_s", "e2e p99"),
        ("output_tok_s", "tok/s"),
        ("slo_attainment", "SLO"),
    ];

    /// Panels (metric, title, axis) of the sweep chart.
    pub const SWEEP_CHART: &[(&str, &str, &str)] = &[
        ("e2e_mean_s", "Mean end-to-end latency", "seconds"),
        ("ttft_p99_s", "p99 time to first token", "seconds"),
        ("output_tok_s", "Output throughput", "tokens/s"),
    ];

    /// Panels (metric, title) of the comparison's bar chart.
    pub const COMPARE_BARS: &[(&str, &str)] = &[
        (
            "e2e_mean_s",
            "Mean end-to-end latency (mean across seeds, 95 % interval)",
        ),
        (
            "ttft_p99_s",
            "p99 time to first token (mean across seeds, 95 % interval)",
        ),
    ];

    /// Every metric name a view uses.
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        RANKED
            .iter()
            .chain(COMPARE_KEY)
            .chain(COMPARE_TERMINAL)
            .copied()
            .chain(RUN_TERMINAL.iter().map(|c| c.0))
            .chain(RUN_HTML.iter().map(|c| c.0))
            .chain(SWEEP_TERMINAL.iter().map(|c| c.0))
            .chain(SWEEP_CHART.iter().map(|c| c.0))
            .chain(COMPARE_BARS.iter().map(|c| c.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::WorkerTotals;

    fn run_that_completed(n: u64) -> RunMetrics {
        let mut m = RunMetrics::new("p", vec![WorkerTotals::new("a"), WorkerTotals::new("b")]);
        m.requests = 4;
        m.first_arrival_ns = 1_000_000_000;
        for _ in 0..n {
            m.completed += 1;
            m.ttft.record_secs(0.5);
            m.e2e.record_secs(2.0);
            m.tpot.record_secs(0.02);
            m.queue.record_secs(0.0);
            m.output_tokens += 10;
            m.prompt_tokens += 100;
            m.cached_tokens += 25;
            m.slo_met += 1;
            m.itl.record_secs_n(0.02, 9);
            m.last_completion_ns = 3_000_000_000;
            m.workers[0].requests += 1;
        }
        m
    }

    #[test]
    fn names_are_unique_and_keys_stable() {
        for (i, a) in CATALOG.iter().enumerate() {
            assert!(
                CATALOG[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
            assert!(!a.name.contains(':'), "`:` separates per-worker keys");
            assert!(!a.description.is_empty(), "{}", a.name);
            assert_eq!(by_name(a.name).map(Metric::index), Some(i));
            if let JsonKey::Top(k) = a.json {
                assert_eq!(k, a.name, "top-level JSON keys are the names");
            }
        }
        for (i, a) in CATALOG.iter().enumerate() {
            for b in &CATALOG[i + 1..] {
                assert!(a.json == JsonKey::Absent || a.json != b.json, "{}", b.name);
            }
        }
        for w in WORKER_METRICS {
            assert!(
                by_name(w.name).is_none(),
                "{} clashes with a run metric",
                w.name
            );
        }
    }

    #[test]
    fn replica_metrics_are_catalog_metrics_listed_once() {
        for (i, r) in REPLICA_METRICS.iter().enumerate() {
            assert!(by_name(r.name).is_some(), "{} is not in CATALOG", r.name);
            assert!(
                REPLICA_METRICS[..i].iter().all(|o| o.name != r.name),
                "{} twice",
                r.name
            );
        }
    }

    #[test]
    fn nested_json_entries_are_contiguous() {
        // The summary writer opens an object once per group.
        let groups: Vec<&str> = CATALOG
            .iter()
            .filter_map(|m| match m.json {
                JsonKey::Nested(g, _) => Some(g),
                _ => None,
            })
            .collect();
        for (i, g) in groups.iter().enumerate() {
            if i > 0 && groups[i - 1] != *g {
                assert!(!groups[..i].contains(g), "{g} split");
            }
        }
    }

    #[test]
    fn views_name_catalog_metrics_and_ranked_ones_have_a_direction() {
        for n in views::all_names() {
            assert!(by_name(n).is_some(), "{n}");
        }
        for n in views::RANKED {
            assert_ne!(
                view(n).direction,
                Direction::Neutral,
                "{n} cannot be ranked"
            );
        }
        assert!(views::COMPARE_KEY.iter().all(|k| views::RANKED.contains(k)));
    }

    #[test]
    fn new_metrics_are_not_gate_tracked_and_come_after_the_old_ones() {
        // The baselines and every existing key and CSV column stay as they were.
        let first_new = by_name("request_throughput").unwrap().index();
        for m in &CATALOG[first_new..] {
            assert!(!m.gate, "{} must not be gate-tracked", m.name);
        }
        assert_eq!(CATALOG[first_new - 1].name, "slo_attainment");
        assert_eq!(direction_of_key("goodput"), None);
    }

    #[test]
    fn directions() {
        assert_eq!(view("e2e_p99_s").direction, Direction::Lower);
        assert_eq!(view("failed").direction, Direction::Lower);
        assert_eq!(view("output_tok_s").direction, Direction::Higher);
        assert_eq!(view("slo_attainment").direction, Direction::Higher);
        assert_eq!(view("requests").direction, Direction::Neutral);
        assert!(Direction::Lower.is_better(1.0, 2.0));
        assert!(Direction::Higher.is_better(2.0, 1.0));
        assert!(!Direction::Neutral.is_better(2.0, 1.0));
        assert_eq!(direction_of_key("share:pair"), Some(Direction::Neutral));
        assert_eq!(direction_of_key("weight:x"), Some(Direction::Neutral));
        assert_eq!(direction_of_key("lost"), Some(Direction::Lower));
        assert_eq!(direction_of_key("completed"), Some(Direction::Higher));
        // Not gate metrics, or not metrics at all.
        assert_eq!(direction_of_key("requests"), None);
        assert_eq!(direction_of_key("share:"), None);
        assert_eq!(direction_of_key("e2e_mean"), None);
    }

    #[test]
    fn a_run_that_completed_nothing_has_no_latency_throughput_or_hit_rate() {
        let m = run_that_completed(0);
        for name in [
            "ttft_mean_s",
            "ttft_p99_s",
            "e2e_mean_s",
            "e2e_max_s",
            "tpot_p50_s",
            "queue_mean_s",
            "output_tok_s",
            "span_s",
            "prefix_hit_fraction",
            "request_throughput",
            "total_token_throughput",
            "goodput",
            "itl_mean_s",
            "itl_p99_s",
        ] {
            assert_eq!(view(name).read(&m), None, "{name} is missing, not 0");
        }
        // Counts are always there; nothing met the SLO out of 4 arrivals.
        assert_eq!(view("completed").read(&m), Some(0.0));
        assert_eq!(view("lost").read(&m), Some(4.0));
        assert_eq!(view("slo_attainment").read(&m), Some(0.0));
        assert_eq!(share(&m, 0), Some(0.0));
        assert_eq!(share(&m, 9), None);
    }

    #[test]
    fn values_and_formatting() {
        let m = run_that_completed(2);
        assert_eq!(view("e2e_mean_s").read(&m), Some(2.0));
        assert_eq!(view("output_tok_s").read(&m), Some(10.0));
        assert_eq!(view("prefix_hit_fraction").read(&m), Some(0.25));
        assert_eq!(view("lost").read(&m), Some(2.0));
        assert_eq!(share(&m, 0), Some(1.0));
        // Rates over the 2 s span: 2 completed (both within the SLO), 2 × 110 tokens.
        assert_eq!(view("request_throughput").read(&m), Some(1.0));
        assert_eq!(view("goodput").read(&m), Some(1.0));
        assert_eq!(view("total_token_throughput").read(&m), Some(110.0));
        assert_eq!(view("itl_mean_s").read(&m), Some(0.02));
        assert_eq!(view("goodput").unit.as_str(), "req/s");
        let mut missed = run_that_completed(4);
        missed.slo_met = 1;
        assert_eq!(
            view("goodput").read(&missed),
            Some(0.5),
            "only requests meeting the SLO"
        );
        assert_eq!(view("request_throughput").read(&missed), Some(2.0));
        let done = view("completed");
        assert_eq!(done.fmt_value(Some(16.0)), "16");
        assert_eq!(done.fmt_stat(Some(2.5)), "2.50");
        assert_eq!(view("slo_attainment").fmt_value(Some(0.75)), "75.0%");
        assert_eq!(view("e2e_mean_s").fmt_value(None), "-");
        assert_eq!(view("e2e_mean_s").reported(&m), Some(2.0));
        let mut big = run_that_completed(1);
        big.requests = 123_456_789;
        assert_eq!(
            view("requests").reported(&big),
            Some(123_456_789.0),
            "counts exact"
        );
    }
}
