//! What a run measured: [`RunMetrics`] with its per-worker [`WorkerTotals`] and
//! [`TimelineRow`]s.
//!
//! These are plain data shared by every host that runs a scenario — the simulator's event loop
//! and the emulator's real-time player — and read by the reports. They are filled through the
//! one [`crate::record::Recorder`], so two hosts count a request the same way by construction.

use crate::histogram::Histogram;
use crate::record::RunWarning;
#[cfg(doc)]
use routelab_policies::PolicyConfig;
use routelab_policies::{PolicyRole, Provenance};

/// One timeline sample of one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    /// Sample time, s.
    pub t_s: f64,
    /// Worker index.
    pub worker: usize,
    /// Customer requests in flight (router's count).
    pub in_flight: u32,
    /// Sequences running inside the engine (customers and probes).
    pub running: u32,
    /// Sequences waiting inside the engine.
    pub waiting: u32,
    /// Weight at the sample.
    pub weight: f64,
    /// Where the weight comes from.
    pub provenance: Provenance,
    /// Customer requests dispatched since the previous sample.
    pub dispatched: u64,
    /// Customer output tokens completed since the previous sample.
    pub output_tokens: u64,
}

/// Per-worker totals.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTotals {
    /// Worker name.
    pub name: String,
    /// Customer requests dispatched to it.
    pub requests: u64,
    /// Customer requests completed on it.
    pub completed: u64,
    /// Customer output tokens completed on it.
    pub output_tokens: u64,
    /// Requests that failed on it.
    pub failed: u64,
    /// Weight at the end.
    pub final_weight: f64,
    /// Provenance at the end.
    pub final_provenance: Provenance,
    /// Probe bursts it served.
    pub probe_bursts: u64,
    /// Sum of its completed requests' TTFT, s.
    pub ttft_sum_s: f64,
    /// Sum of its completed requests' end-to-end latency, s.
    pub e2e_sum_s: f64,
    /// How far its weight was from the oracle's while it was active, the oracle rating each
    /// engine at its operating concurrency (see [`RunMetrics::weight_error`]).
    pub weight_error: WeightError,
    /// The same against the oracle rating every engine at the scenario's
    /// `oracle_concurrency`.
    pub weight_error_at_oracle_concurrency: WeightError,
    /// Its operating concurrency: sequences decoding, time-averaged over its active time
    /// (`None`: never active).
    pub operating_concurrency: Option<f64>,
    /// When a probe first measured it, ns (`None`: never): what a trace's warm-up waits for.
    pub first_measured_ns: Option<u64>,
}

/// Why the router refused requests, counted by reason (a host that cannot tell leaves them
/// uncounted: the run's `rejected` minus these is "reason not known").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rejections {
    /// Prompt plus output longer than every worker's context window.
    pub context_window: u64,
    /// No worker serves the model.
    pub no_worker: u64,
    /// The largest context window among the model's workers, tokens (of the last such refusal).
    pub largest_window: u32,
    /// The longest request refused for its length, tokens (prompt plus output).
    pub longest_request: u32,
}

impl Rejections {
    /// The line a run prints when `rejected` requests were refused: how many for each reason.
    #[must_use]
    pub fn describe(&self, rejected: u64) -> Option<String> {
        if rejected == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if self.context_window > 0 {
            parts.push(format!(
                "{} because prompt + output exceed every worker's context window (the largest \
                 is {} tokens; the longest refused request {} tokens)",
                self.context_window, self.largest_window, self.longest_request
            ));
        }
        if self.no_worker > 0 {
            parts.push(format!(
                "{} because no worker serves the model",
                self.no_worker
            ));
        }
        let other = rejected.saturating_sub(self.context_window + self.no_worker);
        if other > 0 {
            parts.push(format!("{other} for a reason the host did not report"));
        }
        Some(format!(
            "{rejected} request(s) rejected: {}",
            parts.join("; ")
        ))
    }
}

/// The time after which [`WeightError::after_warmup`] counts: the first 10 minutes of a run
/// (registration, first measurements) are left out of the steady-state figure.
pub const WEIGHT_ERROR_WARMUP_S: f64 = 600.0;

/// `|ln(weight / oracle weight)|` integrated over the time a worker was active (connected, up
/// or draining), exactly: weights are piecewise constant between the router's weight changes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WeightError {
    /// ∫ |ln(weight / oracle)| dt over the whole run, s.
    pub area_s: f64,
    /// Active time over the whole run, s.
    pub active_s: f64,
    /// The same integral from [`WEIGHT_ERROR_WARMUP_S`] on, s.
    pub area_after_s: f64,
    /// Active time from [`WEIGHT_ERROR_WARMUP_S`] on, s.
    pub active_after_s: f64,
}

/// The durations an interval of simulated time adds to a [`WeightError`]: the same for every
/// worker, so a host that closes one interval for many workers derives them once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// The interval's length, s.
    all_s: f64,
    /// Its part from [`WEIGHT_ERROR_WARMUP_S`] on, s.
    after_s: f64,
}

impl WeightError {
    /// The durations the interval from `from_s` to `to_s` (seconds of simulated time) adds.
    #[inline]
    pub fn span(from_s: f64, to_s: f64) -> Span {
        Span {
            all_s: (to_s - from_s).max(0.0),
            after_s: (to_s - from_s.max(WEIGHT_ERROR_WARMUP_S)).max(0.0),
        }
    }

    /// Add `error` held from `from_s` to `to_s` (seconds of simulated time).
    pub fn add(&mut self, error: f64, from_s: f64, to_s: f64) {
        self.add_span(error, WeightError::span(from_s, to_s));
    }

    /// Add `error` held over `span`.
    #[inline]
    pub fn add_span(&mut self, error: f64, span: Span) {
        self.area_s += error * span.all_s;
        self.active_s += span.all_s;
        self.area_after_s += error * span.after_s;
        self.active_after_s += span.after_s;
    }

    /// Sum of two (a run's total over its workers).
    #[must_use]
    pub fn plus(self, o: WeightError) -> WeightError {
        WeightError {
            area_s: self.area_s + o.area_s,
            active_s: self.active_s + o.active_s,
            area_after_s: self.area_after_s + o.area_after_s,
            active_after_s: self.active_after_s + o.active_after_s,
        }
    }

    /// The time-averaged error; `None` when never active.
    pub fn mean(&self) -> Option<f64> {
        (self.active_s > 0.0).then(|| self.area_s / self.active_s)
    }

    /// The time-averaged error after [`WEIGHT_ERROR_WARMUP_S`]; `None` when never active then.
    pub fn after_warmup(&self) -> Option<f64> {
        (self.active_after_s > 0.0).then(|| self.area_after_s / self.active_after_s)
    }
}

impl WorkerTotals {
    /// Nothing counted yet; weight 1.0, not yet measured.
    pub fn new(name: impl Into<String>) -> WorkerTotals {
        WorkerTotals {
            name: name.into(),
            requests: 0,
            completed: 0,
            output_tokens: 0,
            failed: 0,
            final_weight: 1.0,
            final_provenance: Provenance::Default,
            probe_bursts: 0,
            ttft_sum_s: 0.0,
            e2e_sum_s: 0.0,
            weight_error: WeightError::default(),
            weight_error_at_oracle_concurrency: WeightError::default(),
            operating_concurrency: None,
            first_measured_ns: None,
        }
    }

    /// Mean TTFT of its completed requests, s.
    pub fn mean_ttft_s(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.ttft_sum_s / self.completed as f64)
    }

    /// Mean end-to-end latency of its completed requests, s.
    pub fn mean_e2e_s(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.e2e_sum_s / self.completed as f64)
    }
}

/// What one gateway replica of a run with several saw (see the scenario's `gateways:`).
#[derive(Debug, Clone, Default)]
pub struct ReplicaTotals {
    /// Customer requests it routed (retries on it not counted again).
    pub routed: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Time to first token of its completed requests, s.
    pub ttft: Histogram,
    /// End to end of its completed requests, s.
    pub e2e: Histogram,
    /// Overlap regret of its routing decisions, tokens (see [`RunMetrics::overlap_regret`]).
    pub overlap_regret: Histogram,
    /// Its weights' distance from the oracle's, over every worker (see
    /// [`RunMetrics::weight_error`]).
    pub weight_error: WeightError,
    /// The same against the oracle at the scenario's `oracle_concurrency` (see
    /// [`RunMetrics::weight_error_at_oracle_concurrency`]).
    pub weight_error_at_oracle_concurrency: WeightError,
    /// Its weight of each worker at the end, by fleet index (1.0 for one never registered).
    pub final_weights: Vec<f64>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    /// Policy name.
    pub policy: String,
    /// What the policy is ([`PolicyConfig::role`]); [`PolicyRole::Ours`] until the host that
    /// ran the policy's config says otherwise.
    pub role: PolicyRole,
    /// Customer requests that arrived.
    pub requests: u64,
    /// Completed.
    pub completed: u64,
    /// Failed (worker crashed after the first token, or retries exhausted).
    pub failed: u64,
    /// Rejected by the router (no worker for the model, prompt too long).
    pub rejected: u64,
    /// Re-routed after their worker failed before the first token.
    pub retried: u64,
    /// Time to first token, s.
    pub ttft: Histogram,
    /// End to end, s.
    pub e2e: Histogram,
    /// Time per output token, s (a completed one-token output counts as 0 s here, though its
    /// request row has no TPOT).
    pub tpot: Histogram,
    /// Gateway queue time, s.
    pub queue: Histogram,
    /// Inter-token latency, s: each completed request's mean gap between output tokens,
    /// `(e2e - ttft) / (output - 1)`, recorded once per gap (`output - 1` times), so its
    /// quantiles estimate those of every gap pooled, as `vllm bench serve` reports ITL. The
    /// simulator has no per-token events, so a request's gaps are taken as equal. One-token
    /// outputs have no gap and add nothing.
    pub itl: Histogram,
    /// Requests whose TTFT and TPOT met the SLO.
    pub slo_met: u64,
    /// Customer output tokens completed.
    pub output_tokens: u64,
    /// Customer prompt tokens of completed requests.
    pub prompt_tokens: u64,
    /// Of those, served from engine prefix caches.
    pub cached_tokens: u64,
    /// Of those, believed cached by the router.
    pub believed_cached_tokens: u64,
    // ---- overlap regret (issue 10 §4)
    /// Overlap regret, **in tokens** (not ns): for each routing decision of a customer request
    /// with a prefix, the most prompt tokens any eligible worker's engine had cached minus what
    /// the chosen worker's had, at routing time. Empty where not observable (the real-time
    /// player sees no engine caches).
    pub overlap_regret: Histogram,
    // ---- end overlap regret
    /// First arrival, ns.
    pub first_arrival_ns: u64,
    /// Last completion, ns.
    pub last_completion_ns: u64,
    /// Probe bursts sent (warm-up and measurement).
    pub probe_bursts: u64,
    /// Probe bursts whose result became a measurement.
    pub probe_measurements: u64,
    /// GPU-seconds spent in probe bursts (burst wall time).
    pub probe_gpu_s: f64,
    /// Per-worker totals.
    pub workers: Vec<WorkerTotals>,
    /// Timeline samples.
    pub timeline: Vec<TimelineRow>,
    /// Simulated time at the end, ns.
    pub end_ns: u64,
    /// Events processed (a measure of simulation work).
    pub events: u64,
    /// Scenario events that did not take effect (the router refused them), in time order.
    pub warnings: Vec<RunWarning>,
    /// Bad trace rows the traffic skipped (`on_bad_row: skip`).
    pub skipped_rows: crate::traffic::Skipped,
    /// Why the router refused the rejected requests.
    pub rejections: Rejections,
    /// What the traffic noticed about its data (`TrafficSource::warnings`): a declared unit
    /// that makes a trace implausible, sessions whose prompts do not grow.
    pub traffic_warnings: Vec<String>,
    /// Per gateway replica, in replica order; empty with one gateway (the whole run is then
    /// that gateway's).
    pub replicas: Vec<ReplicaTotals>,
}

impl RunMetrics {
    /// What a reader of the run must be told: scenario events that did not take effect, bad
    /// trace rows that were skipped, and what the traffic noticed about its data.
    #[must_use]
    pub fn warning_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.warnings.iter().map(ToString::to_string).collect();
        if self.skipped_rows.rows > 0 {
            lines.push(self.skipped_rows.to_string());
        }
        lines.extend(self.traffic_warnings.iter().cloned());
        lines.extend(self.rejections.describe(self.rejected));
        lines
    }

    /// Empty metrics of a run of `policy` on the given workers.
    pub fn new(policy: impl Into<String>, workers: Vec<WorkerTotals>) -> RunMetrics {
        RunMetrics {
            policy: policy.into(),
            role: PolicyRole::Ours,
            requests: 0,
            completed: 0,
            failed: 0,
            rejected: 0,
            retried: 0,
            ttft: Histogram::new(),
            e2e: Histogram::new(),
            tpot: Histogram::new(),
            queue: Histogram::new(),
            itl: Histogram::new(),
            slo_met: 0,
            output_tokens: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            believed_cached_tokens: 0,
            overlap_regret: Histogram::new(),
            first_arrival_ns: u64::MAX,
            last_completion_ns: 0,
            probe_bursts: 0,
            probe_measurements: 0,
            probe_gpu_s: 0.0,
            workers,
            timeline: Vec::new(),
            end_ns: 0,
            events: 0,
            warnings: Vec::new(),
            skipped_rows: crate::traffic::Skipped::default(),
            traffic_warnings: Vec::new(),
            rejections: Rejections::default(),
            replicas: Vec::new(),
        }
    }

    /// Output tokens per second from first arrival to last completion.
    pub fn output_tok_s(&self) -> f64 {
        let span = self
            .last_completion_ns
            .saturating_sub(self.first_arrival_ns) as f64
            / 1e9;
        if span > 0.0 {
            self.output_tokens as f64 / span
        } else {
            0.0
        }
    }

    /// Fraction of prompt tokens served from engine prefix caches.
    pub fn prefix_hit_fraction(&self) -> f64 {
        ratio(self.cached_tokens, self.prompt_tokens)
    }

    /// Fraction of prompt tokens the router believed cached.
    pub fn believed_hit_fraction(&self) -> f64 {
        ratio(self.believed_cached_tokens, self.prompt_tokens)
    }

    /// SLO attainment, **the one rule**: the fraction of the run's arrived requests that
    /// completed within every bound of the SLO the run was recorded against (`None`: no request
    /// arrived). `run`'s metric and `capacity`'s per-request target both read it.
    pub fn slo_attainment(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.slo_met as f64 / self.requests as f64)
    }

    /// The weight error of the whole fleet: every worker's integral over every worker's
    /// active time (a time-weighted mean over workers; with several gateway replicas, over
    /// workers and replicas), against the oracle that rates each engine at its **operating
    /// concurrency** — the sequences it decoded, time-averaged over its active time, as far
    /// as the run had gone when the reference was last refreshed (see the simulator's
    /// `event_loop::weight_error`). A host that has no oracle (the real-time player) leaves it
    /// empty: `mean()` is then `None`.
    pub fn weight_error(&self) -> WeightError {
        self.workers
            .iter()
            .fold(WeightError::default(), |a, w| a.plus(w.weight_error))
    }

    /// [`Self::weight_error`] against the oracle that rates every engine at the scenario's
    /// `oracle_concurrency` (16 unless set): the reference before issue 27.
    pub fn weight_error_at_oracle_concurrency(&self) -> WeightError {
        self.workers.iter().fold(WeightError::default(), |a, w| {
            a.plus(w.weight_error_at_oracle_concurrency)
        })
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interval added through its span adds exactly what the integral's formula gives
    /// (as `add` computed it before spans), bit for bit, before, across and after the warm-up.
    #[test]
    fn span_adds_the_formula() {
        let intervals: [(f64, f64); 5] = [
            (0.0, 0.3),
            (0.3, 599.9),
            (599.9, 600.4),
            (600.4, 1234.5678),
            (7.0, 7.0),
        ];
        let errors = [0.0, 0.1, 1.0 / 3.0, 2.5e-7, 4.75];
        let mut reference = [0.0f64; 4];
        let (mut by_add, mut by_span) = (WeightError::default(), WeightError::default());
        for (i, &(from, to)) in intervals.iter().enumerate() {
            let e = errors[i % errors.len()];
            let dt = (to - from).max(0.0);
            let after = (to - f64::max(from, WEIGHT_ERROR_WARMUP_S)).max(0.0);
            reference[0] += e * dt;
            reference[1] += dt;
            reference[2] += e * after;
            reference[3] += after;
            by_add.add(e, from, to);
            by_span.add_span(e, WeightError::span(from, to));
            for w in [by_add, by_span] {
                let got = [w.area_s, w.active_s, w.area_after_s, w.active_after_s];
                assert_eq!(got.map(f64::to_bits), reference.map(f64::to_bits));
            }
        }
        assert!(by_span.active_after_s > 0.0 && by_span.active_s > by_span.active_after_s);
    }
}
