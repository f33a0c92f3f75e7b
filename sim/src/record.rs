//! The one results recorder: how a finished customer request is counted and written.
//!
//! Two hosts run scenarios — the simulator's event loop ([`crate::run`]) and the emulator's
//! real-time player — and both must produce the same [`RunMetrics`] and the same
//! `requests.csv` rows for the same observations. Each host describes a finished request as an
//! [`Outcome`] (what it observed, in scenario time) and hands it to the same [`Recorder`]: the
//! status, the latencies (and which of them are *absent*), the SLO test, the run and
//! per-worker totals and the [`RequestRecord`] row are all derived here, once.
//!
//! A latency that does not exist is `None`, never NaN or 0: a request without a first token
//! has no TTFT, one that did not complete has no end-to-end latency, and a one-token output
//! has no time per output token (there is no second token to time). Absent values are written
//! as empty CSV cells. One exception, kept so that committed baselines stay comparable: the
//! TPOT *distribution* counts a completed one-token output as 0 s (see [`Recorder::finished`]).

use crate::results::{RunMetrics, WorkerTotals};
use routelab_policies::ShownDecision;
use routelab_policies::streams::{nanos_to_secs, secs_to_nanos};
use routelab_policies::{AdminError, RouteError, Time};
use std::fmt;

/// How a customer request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Completed: the last token was seen.
    Ok,
    /// Its worker failed (after the first token, or with retries exhausted), or the stream
    /// broke.
    Failed,
    /// The router (or the gateway) refused it: no worker for its model, prompt too long.
    Rejected,
}

impl Status {
    /// The name written in `requests.csv` (`ok`, `failed`, `rejected`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Rejected => "rejected",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Service-level objective per request: a completed request meets it when its TTFT, its TPOT
/// (when it has one) and, if bounded, its end-to-end latency are within the bounds.
///
/// **The one SLO type**: the scenario's `slo`, what `capacity`'s `--slo` reduces to per request
/// (`SloSpec::per_request`), and what `summary.json`, the console and the report show a run was
/// judged against (its `Display`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Slo {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token, seconds.
    pub tpot_s: f64,
    /// End-to-end latency, seconds (`None`: not bounded; scenario files do not set it,
    /// `routelab capacity` does when its `--slo` names an `e2el` bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_s: Option<f64>,
}

impl fmt::Display for Slo {
    /// `TTFT ≤ 2 s and TPOT ≤ 0.1 s per request` (the end-to-end bound, when there is one,
    /// after them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.e2e_s {
            None => write!(
                f,
                "TTFT ≤ {} s and TPOT ≤ {} s per request",
                self.ttft_s, self.tpot_s
            ),
            Some(e2e) => write!(
                f,
                "TTFT ≤ {} s, TPOT ≤ {} s and end-to-end latency ≤ {e2e} s per request",
                self.ttft_s, self.tpot_s
            ),
        }
    }
}

impl Default for Slo {
    fn default() -> Self {
        Slo {
            ttft_s: 2.0,
            tpot_s: 0.1,
            e2e_s: None,
        }
    }
}

impl Slo {
    /// Whether a completed request with these latencies meets every bound (a request without a
    /// TPOT, a one-token output, is not held to the TPOT bound).
    pub fn met_by(&self, ttft_s: f64, tpot_s: Option<f64>, e2e_s: f64) -> bool {
        ttft_s <= self.ttft_s
            && tpot_s.is_none_or(|t| t <= self.tpot_s)
            && self.e2e_s.is_none_or(|b| e2e_s <= b)
    }
}

/// One finished customer request, as streamed to a [`RequestSink`] (a `requests.csv` row).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Order of arrival (0-based).
    pub id: u64,
    /// Arrival time, s.
    pub arrival_s: f64,
    /// Worker name (empty if never dispatched, or not known to the host).
    pub worker: String,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Time queued at the gateway, s (0 if not dispatched or not observable).
    pub queue_s: f64,
    /// Time to first token, s (`None`: no first token).
    pub ttft_s: Option<f64>,
    /// End-to-end latency, s (`None`: not completed).
    pub e2e_s: Option<f64>,
    /// Time per output token after the first, s (`None`: not completed, or one output token).
    pub tpot_s: Option<f64>,
    /// Prompt tokens the engine found in its prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens the router believed cached on the chosen worker.
    pub believed_cached_tokens: u32,
    /// The prefix holder was kept over the chooser's pick.
    pub affinity_kept: bool,
    /// How it ended.
    pub status: Status,
}

/// Where per-request rows go, when asked for.
pub trait RequestSink {
    /// One finished request.
    fn record(&mut self, row: RequestRecord);

    /// Whether the sink wants every routing decision explained ([`RequestSink::decision`]).
    /// The simulator then routes through `Router::route_explained`, which decides exactly as
    /// the plain path does (the policy crate's tests hold the two to the same choices and
    /// draws), so a run's results do not depend on the answer.
    fn wants_decisions(&self) -> bool {
        false
    }

    /// Request `id`'s routing decision (one per attempt; a request retried after a failure has
    /// two), in the shape the gateway's request log shows it: the router's own explanation,
    /// with the scores it compared.
    fn decision(&mut self, id: u64, decision: ShownDecision) {
        let _ = (id, decision);
    }
}

impl RequestSink for Vec<RequestRecord> {
    fn record(&mut self, row: RequestRecord) {
        self.push(row);
    }
}

/// What a host observed of one finished customer request, in scenario time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Order of arrival (0-based).
    pub id: u64,
    /// How it ended.
    pub status: Status,
    /// Index of the worker that served it in [`RunMetrics::workers`] (`None`: never dispatched,
    /// or the host does not know).
    pub worker: Option<usize>,
    /// When it reached the gateway (the player: when it was sent).
    pub arrival: Time,
    /// When the gateway dispatched it (`None`: not dispatched, or not observable).
    pub dispatched: Option<Time>,
    /// When the host saw its first token.
    pub first_token: Option<Time>,
    /// When it ended (last token, failure or rejection).
    pub end: Time,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens generated (the player: as reported in the stream's usage).
    pub output_tokens: u32,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens the router believed cached (0 where not observable).
    pub believed_cached_tokens: u32,
    /// The prefix holder was kept over the chooser's pick.
    pub affinity_kept: bool,
}

impl Outcome {
    /// Time to first token, ns.
    pub fn ttft_ns(&self) -> Option<u64> {
        self.first_token.map(|f| f.nanos_since(self.arrival))
    }

    /// Time to first token, s.
    pub fn ttft_s(&self) -> Option<f64> {
        self.ttft_ns().map(nanos_to_secs)
    }

    /// End-to-end latency of a completed request, s.
    pub fn e2e_s(&self) -> Option<f64> {
        (self.status == Status::Ok).then(|| nanos_to_secs(self.end.nanos_since(self.arrival)))
    }

    /// Time per output token after the first, s: only a completed request with a first token
    /// and at least two output tokens has one.
    pub fn tpot_s(&self) -> Option<f64> {
        match self.first_token {
            Some(f) if self.status == Status::Ok && self.output_tokens > 1 => {
                Some(nanos_to_secs(self.end.nanos_since(f)) / f64::from(self.output_tokens - 1))
            }
            _ => None,
        }
    }

    /// Time queued at the gateway, ns.
    pub fn queue_ns(&self) -> Option<u64> {
        self.dispatched.map(|d| d.nanos_since(self.arrival))
    }

    /// Time queued at the gateway, s.
    pub fn queue_s(&self) -> Option<f64> {
        self.queue_ns().map(nanos_to_secs)
    }
}

/// A scenario event that did not take effect: the router refused it (or, for a pin, the
/// policy's weight strategy has no pins). Reported, never silently dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct RunWarning {
    /// When the event was due.
    pub at: Time,
    /// The worker it named.
    pub worker: String,
    /// The scenario action (`pin`, `restart`, …).
    pub action: &'static str,
    /// Why it did not take effect.
    pub reason: WarningReason,
}

/// Why a scenario event did not take effect.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WarningReason {
    /// The router refused the call.
    #[error("the router refused it: {0}")]
    Refused(#[from] AdminError),
    /// The worker has not registered with the router yet.
    #[error("the worker has not registered yet")]
    NotRegistered,
    /// The policy's weight strategy does not take pins.
    #[error("weights `{weights}` do not take pins (only `probe` weights keep pins)")]
    PinIgnored {
        /// The weight strategy's name.
        weights: &'static str,
    },
}

impl fmt::Display for RunWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={}: `{}` of worker `{}` did not take effect: {}",
            self.at, self.action, self.worker, self.reason
        )
    }
}

/// Fills a [`RunMetrics`] from what a host observes. The host calls [`Recorder::arrived`] when
/// a customer request reaches the gateway, [`Recorder::dispatched`] each time it is sent to a
/// worker, [`Recorder::failed_on`] each time a worker loses it, and [`Recorder::finished`]
/// once with its final [`Outcome`]; [`Recorder::row`] gives its `requests.csv` row.
/// Host-specific figures (probes, timeline, retries, events) are set through
/// [`Recorder::metrics_mut`].
#[derive(Debug, Clone)]
pub struct Recorder {
    m: RunMetrics,
    slo: Slo,
}

/// A completed request's TTFT and end-to-end latency as a run counts them, ns.
fn completed_latencies_ns(o: &Outcome) -> (u64, u64) {
    let e2e = o.end.nanos_since(o.arrival);
    // A completion without a seen first token had it at the end.
    (o.ttft_ns().unwrap_or(e2e), e2e)
}

impl Recorder {
    /// Record into `metrics` (usually fresh) against `slo`.
    pub fn new(metrics: RunMetrics, slo: Slo) -> Recorder {
        Recorder { m: metrics, slo }
    }

    /// The metrics so far.
    pub fn metrics(&self) -> &RunMetrics {
        &self.m
    }

    /// The name of worker `w` (its index in [`RunMetrics::workers`]).
    pub fn worker_name(&self, w: usize) -> &str {
        &self.m.workers[w].name
    }

    /// The metrics, for host-specific figures.
    pub fn metrics_mut(&mut self) -> &mut RunMetrics {
        &mut self.m
    }

    /// The metrics, finished: a run that saw no arrival starts at 0.
    pub fn into_metrics(mut self) -> RunMetrics {
        if self.m.first_arrival_ns == u64::MAX {
            self.m.first_arrival_ns = 0;
        }
        self.m
    }

    /// Index of the worker named `name`, added to the totals if new.
    pub fn worker_index(&mut self, name: &str) -> usize {
        if let Some(i) = self.m.workers.iter().position(|w| w.name == name) {
            return i;
        }
        self.m.workers.push(WorkerTotals::new(name));
        self.m.workers.len() - 1
    }

    /// A customer request reached the gateway.
    #[inline]
    pub fn arrived(&mut self, at: Time) {
        self.m.requests += 1;
        self.m.first_arrival_ns = self.m.first_arrival_ns.min(at.as_nanos());
    }

    /// A customer request was sent to `worker` (a retry counts again).
    #[inline]
    pub fn dispatched(&mut self, worker: usize) {
        self.m.workers[worker].requests += 1;
    }

    /// `worker` lost a customer request (it may still be retried elsewhere).
    #[inline]
    pub fn failed_on(&mut self, worker: usize) {
        self.m.workers[worker].failed += 1;
    }

    // ---- overlap regret (issue 10 §4)
    /// A customer request with a prefix was routed: the best cached overlap among the
    /// eligible workers minus the chosen worker's, in tokens.
    #[inline]
    pub fn overlap_regret(&mut self, tokens: u32) {
        self.m.overlap_regret.record(u64::from(tokens));
    }
    // ---- end overlap regret

    /// The router refused a customer request for `why` (counted by reason; the request itself
    /// is counted by [`Recorder::finished`] with [`Status::Rejected`]).
    pub fn rejected_because(&mut self, why: &RouteError) {
        let r = &mut self.m.rejections;
        match *why {
            RouteError::PromptTooLong {
                tokens,
                largest_window,
            } => {
                r.context_window += 1;
                r.largest_window = largest_window;
                r.longest_request = r.longest_request.max(tokens);
            }
            RouteError::NoWorkerForModel => r.no_worker += 1,
            // Every worker at its cap or unhealthy: the host queues those, never rejects them
            // (and a reason added later is left to `rejected` minus the counted ones).
            _ => {}
        }
    }

    /// A scenario event did not take effect.
    pub fn warn(&mut self, warning: RunWarning) {
        self.m.warnings.push(warning);
    }

    /// A customer request ended: count it.
    pub fn finished(&mut self, o: &Outcome) {
        match o.status {
            Status::Ok => {
                let (ttft_ns, e2e_ns) = completed_latencies_ns(o);
                let (ttft, e2e) = (nanos_to_secs(ttft_ns), nanos_to_secs(e2e_ns));
                let tpot = o.tpot_s();
                let m = &mut self.m;
                m.completed += 1;
                m.ttft.record_secs_of_ns(ttft_ns);
                m.e2e.record_secs_of_ns(e2e_ns);
                // The distribution has always counted a one-token output as 0 s; dropping
                // those samples moves the TPOT quantiles of traces with one-token outputs
                // (mooncake: p50 +1.3 %, p99 +3.6 %) and so every baseline of them.
                // ITL: the request's mean gap, weighted by its number of gaps (see
                // `RunMetrics::itl`); a one-token output has no gap. Both count the same
                // nanoseconds, converted once.
                match tpot {
                    Some(t) => {
                        let ns = secs_to_nanos(t);
                        m.tpot.record(ns);
                        m.itl.record_n(ns, u64::from(o.output_tokens - 1));
                    }
                    None => m.tpot.record_secs(0.0),
                }
                if let Some(q) = o.queue_ns() {
                    m.queue.record_secs_of_ns(q);
                }
                if self.slo.met_by(ttft, tpot, e2e) {
                    m.slo_met += 1;
                }
                m.output_tokens += u64::from(o.output_tokens);
                m.prompt_tokens += u64::from(o.prompt_tokens);
                m.cached_tokens += u64::from(o.cached_tokens);
                m.believed_cached_tokens += u64::from(o.believed_cached_tokens);
                m.last_completion_ns = m.last_completion_ns.max(o.end.as_nanos());
                if let Some(w) = o.worker {
                    let t = &mut m.workers[w];
                    t.completed += 1;
                    t.output_tokens += u64::from(o.output_tokens);
                    t.ttft_sum_s += ttft;
                    t.e2e_sum_s += e2e;
                }
            }
            Status::Failed => self.m.failed += 1,
            Status::Rejected => self.m.rejected += 1,
        }
    }

    /// Count a finished customer request for the gateway replica that routed it (runs with
    /// several replicas; [`Recorder::finished`] counts it for the whole run).
    pub fn replica_finished(&mut self, replica: usize, o: &Outcome) {
        if o.status != Status::Ok {
            return;
        }
        let (ttft, e2e) = completed_latencies_ns(o);
        let r = &mut self.m.replicas[replica];
        r.completed += 1;
        r.ttft.record_secs_of_ns(ttft);
        r.e2e.record_secs_of_ns(e2e);
    }

    /// The `requests.csv` row of a finished request.
    pub fn row(&self, o: &Outcome) -> RequestRecord {
        RequestRecord {
            id: o.id,
            arrival_s: nanos_to_secs(o.arrival.as_nanos()),
            worker: o
                .worker
                .map(|w| self.m.workers[w].name.clone())
                .unwrap_or_default(),
            prompt_tokens: o.prompt_tokens,
            output_tokens: o.output_tokens,
            queue_s: o.queue_s().unwrap_or(0.0),
            ttft_s: o.ttft_s(),
            e2e_s: o.e2e_s(),
            tpot_s: o.tpot_s(),
            cached_tokens: o.cached_tokens,
            believed_cached_tokens: o.believed_cached_tokens,
            affinity_kept: o.affinity_kept,
            status: o.status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slo_says_its_bounds_the_same_way_everywhere() {
        let scenario = Slo::default();
        assert_eq!(
            scenario.to_string(),
            "TTFT ≤ 2 s and TPOT ≤ 0.1 s per request"
        );
        assert_eq!(
            serde_json::to_string(&scenario).unwrap(),
            r#"{"ttft_s":2.0,"tpot_s":0.1}"#
        );
        let capacity = Slo {
            ttft_s: 0.5,
            tpot_s: f64::INFINITY,
            e2e_s: Some(30.0),
        };
        assert_eq!(
            capacity.to_string(),
            "TTFT ≤ 0.5 s, TPOT ≤ inf s and end-to-end latency ≤ 30 s per request"
        );
        assert!(capacity.met_by(0.4, Some(9.0), 29.0));
        assert!(!capacity.met_by(0.4, None, 31.0));
    }

    fn outcome(status: Status, output_tokens: u32) -> Outcome {
        Outcome {
            id: 7,
            status,
            worker: Some(0),
            arrival: Time::from_nanos(1_000_000_000),
            dispatched: Some(Time::from_nanos(1_100_000_000)),
            first_token: Some(Time::from_nanos(1_500_000_000)),
            end: Time::from_nanos(3_500_000_000),
            prompt_tokens: 100,
            output_tokens,
            cached_tokens: 10,
            believed_cached_tokens: 20,
            affinity_kept: true,
        }
    }

    fn recorder() -> Recorder {
        Recorder::new(
            RunMetrics::new("p", vec![WorkerTotals::new("w0")]),
            Slo::default(),
        )
    }

    #[test]
    fn statuses_keep_their_csv_names() {
        assert_eq!(Status::Ok.as_str(), "ok");
        assert_eq!(Status::Failed.as_str(), "failed");
        assert_eq!(Status::Rejected.to_string(), "rejected");
    }

    #[test]
    fn a_one_token_output_has_no_tpot() {
        let mut rec = recorder();
        let o = outcome(Status::Ok, 1);
        assert_eq!(o.tpot_s(), None);
        rec.finished(&o);
        let row = rec.row(&o);
        assert_eq!(row.tpot_s, None);
        assert_eq!(row.ttft_s, Some(0.5));
        assert_eq!(row.e2e_s, Some(2.5));
        let m = rec.metrics();
        assert_eq!((m.completed, m.tpot.count(), m.ttft.count()), (1, 1, 1));
        assert_eq!(
            m.tpot.quantile_secs(1.0),
            Some(0.0),
            "counted as 0 s in the distribution"
        );
        assert!(
            m.itl.is_empty(),
            "a one-token output has no inter-token gap"
        );
        // Without an inter-token time, the TPOT criterion of the SLO does not apply.
        assert_eq!(m.slo_met, 1);
    }

    #[test]
    fn a_completed_request_is_counted_and_written_once() {
        let mut rec = recorder();
        let o = outcome(Status::Ok, 5);
        rec.arrived(o.arrival);
        rec.dispatched(0);
        rec.finished(&o);
        let row = rec.row(&o);
        // (3.5 - 1.5) s over 4 tokens after the first
        assert_eq!(row.tpot_s, Some(0.5));
        assert_eq!(row.queue_s, 0.1);
        assert_eq!((row.worker.as_str(), row.status), ("w0", Status::Ok));
        let m = rec.metrics();
        assert_eq!((m.requests, m.completed, m.output_tokens), (1, 1, 5));
        assert_eq!((m.tpot.count(), m.queue.count()), (1, 1));
        // ITL: the mean gap 0.5 s, once per gap (5 tokens, 4 gaps).
        assert_eq!(m.itl.count(), 4);
        assert_eq!(m.itl.mean_secs(), Some(0.5));
        // TPOT 0.5 s is over the default 0.1 s SLO
        assert_eq!(m.slo_met, 0);
        assert_eq!(m.workers[0].requests, 1);
        assert_eq!(m.workers[0].completed, 1);
        assert_eq!(m.first_arrival_ns, 1_000_000_000);
        assert_eq!(m.last_completion_ns, 3_500_000_000);
    }

    #[test]
    fn itl_weights_each_request_by_its_gaps() {
        let mut rec = recorder();
        // 11 tokens over 0.1 s after the first: ten gaps of 10 ms.
        let many = Outcome {
            first_token: Some(Time::from_nanos(1_500_000_000)),
            end: Time::from_nanos(1_600_000_000),
            ..outcome(Status::Ok, 11)
        };
        // 2 tokens, 1 s apart: one gap of 1 s.
        let two = Outcome {
            end: Time::from_nanos(2_500_000_000),
            ..outcome(Status::Ok, 2)
        };
        rec.finished(&many);
        rec.finished(&two);
        let m = rec.metrics();
        assert_eq!(m.itl.count(), 11);
        // Per request (TPOT) the median is either request; per gap it is 10 ms.
        assert_eq!(m.tpot.count(), 2);
        let p50 = m.itl.quantile_secs(0.5).unwrap();
        assert!((p50 - 0.01).abs() < 0.01 / 64.0, "{p50}");
        assert_eq!(m.itl.quantile_secs(1.0), Some(1.0));
        assert!((m.itl.mean_secs().unwrap() - 1.1 / 11.0).abs() < 1e-12);
    }

    #[test]
    fn an_e2e_bound_counts_only_when_set() {
        // ttft 0.5 s, tpot 0.5 s, e2e 2.5 s against generous ttft/tpot bounds.
        let loose = Slo {
            ttft_s: 1.0,
            tpot_s: 1.0,
            e2e_s: None,
        };
        let o = outcome(Status::Ok, 5);
        for (e2e_s, met) in [(None, 1), (Some(3.0), 1), (Some(2.5), 1), (Some(2.4), 0)] {
            let mut rec = Recorder::new(
                RunMetrics::new("p", vec![WorkerTotals::new("w0")]),
                Slo { e2e_s, ..loose },
            );
            rec.finished(&o);
            assert_eq!(rec.metrics().slo_met, met, "e2e bound {e2e_s:?}");
        }
        assert!(!loose.met_by(1.5, None, 2.0), "ttft over its bound");
        assert!(loose.met_by(1.0, None, 99.0), "no tpot, no e2e bound");
    }

    #[test]
    fn a_failed_or_rejected_request_has_no_completion_latencies() {
        let mut rec = recorder();
        let failed = outcome(Status::Failed, 5);
        rec.failed_on(0);
        rec.finished(&failed);
        let row = rec.row(&failed);
        assert_eq!((row.e2e_s, row.tpot_s), (None, None));
        assert_eq!(row.ttft_s, Some(0.5), "its first token was seen");
        let rejected = Outcome {
            worker: None,
            dispatched: None,
            first_token: None,
            ..outcome(Status::Rejected, 5)
        };
        rec.finished(&rejected);
        let row = rec.row(&rejected);
        assert_eq!(
            (row.ttft_s, row.worker.as_str(), row.queue_s),
            (None, "", 0.0)
        );
        let m = rec.metrics();
        assert_eq!((m.completed, m.failed, m.rejected), (0, 1, 1));
        assert_eq!(m.workers[0].failed, 1);
        assert!(m.ttft.is_empty() && m.e2e.is_empty() && m.itl.is_empty());
    }
}
