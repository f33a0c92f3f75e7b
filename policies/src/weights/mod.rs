//! Weight strategies: each worker's capacity as the router models it.
//!
//! A strategy is a state machine fed by [`WeightEvent`]s that any host can produce (the
//! simulator, a production gateway). It answers two questions: the current [`Weight`] of each
//! worker, and which probe bursts the host should run now ([`ProbeOrder`]).

mod at_load;
mod live;
mod probe;
mod shaping;
mod simple;

pub use at_load::{AtLoadConfig, AtLoadWeights};
pub use live::{LiveConfig, LiveWeights};
pub use probe::{
    MAX_PROBE_CONCURRENCY, MAX_PROBE_PROMPT_TOKENS, PersistedProbeState, PrefillProbe,
    ProbeCacheEntry, ProbeConfig, ProbePin, ProbeWeights,
};
pub use shaping::{Shaped, Shaping, SlowStart, Unmeasured};
pub use simple::{EqualWeights, OracleWeights, TableConfig, TableWeights, oracle_weights};

use crate::time::Time;
use crate::worker::{Fleet, ModelId, Weight, WorkerId};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// How much of the fleet's weights an event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightChange {
    /// Nothing changed.
    None,
    /// Only this worker's weight changed.
    One(WorkerId),
    /// Any weight may have changed.
    All,
}

/// A completed request, as reported by the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens generated.
    pub output_tokens: u32,
    /// When the router dispatched it.
    pub dispatched_at: Time,
    /// When its first output token reached the host.
    pub first_token_at: Time,
    /// When its last token reached the host.
    pub completed_at: Time,
}

impl Completion {
    /// Per-request decode speed in tokens/s (first token to last), if measurable.
    pub fn decode_tok_s(&self) -> Option<f64> {
        let secs = (self.completed_at - self.first_token_at).as_secs_f64();
        if self.output_tokens >= 2 && secs > 0.0 {
            Some(f64::from(self.output_tokens - 1) / secs)
        } else {
            None
        }
    }
}

/// Which half of a probe a burst is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbePhase {
    /// Warm-up burst: its result is discarded.
    Warmup,
    /// The burst whose throughput becomes the measurement.
    Measure,
    /// The prefill-bound burst that follows a measurement when the probe is configured with
    /// one (long prompts, one output token each): its prompt tokens over its wall time are the
    /// worker's prefill speed, which `predictive` reads before traffic has measured it.
    Prefill,
}

impl ProbePhase {
    /// The phase's name in logs and the admin view.
    pub fn name(self) -> &'static str {
        match self {
            ProbePhase::Warmup => "warmup",
            ProbePhase::Measure => "measure",
            ProbePhase::Prefill => "prefill",
        }
    }
}

/// A burst the host should send to a worker, outside billing and the router's load counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOrder {
    /// Identifies this order in the [`ProbeResult`].
    pub id: u64,
    /// Target worker.
    pub worker: WorkerId,
    /// Warm-up or measurement.
    pub phase: ProbePhase,
    /// Concurrent requests in the burst.
    pub concurrency: u32,
    /// Exact output tokens of each request (`min_tokens` = `max_tokens`, `ignore_eos`).
    pub output_tokens: u32,
    /// Prompt tokens of each request.
    pub prompt_tokens: u32,
}

/// What a burst measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeResult {
    /// The order it answers.
    pub order: u64,
    /// The worker probed.
    pub worker: WorkerId,
    /// Output tokens received in total.
    pub output_tokens: u64,
    /// Prompt tokens of the burst's requests (as the engine counted them where it says, else
    /// as ordered): what a [`ProbePhase::Prefill`] burst's speed is measured in.
    pub prompt_tokens: u64,
    /// Wall time from the first request sent to the last token received.
    pub wall: Duration,
    /// False if the burst failed (worker crashed, errors): nothing is learned.
    pub ok: bool,
}

impl ProbeResult {
    /// Total output tokens over wall time; zero for an unusable result.
    pub fn throughput_tok_s(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if self.ok && secs > 0.0 {
            sanitize(self.output_tokens as f64 / secs)
        } else {
            0.0
        }
    }

    /// Total prompt tokens over wall time (a prefill-bound burst's prefill speed); zero for an
    /// unusable result.
    pub fn prefill_tok_s(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if self.ok && secs > 0.0 {
            sanitize(self.prompt_tokens as f64 / secs)
        } else {
            0.0
        }
    }
}

/// Events that drive weight strategies.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum WeightEvent<'a> {
    /// A worker registered (its spec is in the [`Fleet`]).
    Registered(WorkerId),
    /// A worker's connection dropped.
    Disconnected(WorkerId),
    /// A worker reconnected with the same engine (no restart).
    Reconnected(WorkerId),
    /// A worker's engine restarted; `args_changed` when the launch arguments differ.
    Restarted {
        /// The worker.
        worker: WorkerId,
        /// Launch arguments differ from before the restart.
        args_changed: bool,
    },
    /// A worker was deregistered for good.
    Removed(WorkerId),
    /// A request was sent to a worker.
    Dispatched(WorkerId),
    /// A request's first token arrived.
    FirstToken(WorkerId),
    /// A request completed.
    Completed(WorkerId, &'a Completion),
    /// A request failed (no token accounting).
    Failed(WorkerId),
    /// A probe burst finished.
    Probe(&'a ProbeResult),
    /// An administrator pinned a worker's weight.
    Pin(WorkerId, f64),
    /// An administrator cleared a pin.
    Unpin(WorkerId),
    /// An administrator asked for a fresh measurement.
    Reprobe(WorkerId),
    /// A node manager restarted; `keep_cache` false forgets that node's cached measurements.
    NodeManagerRestart {
        /// The node.
        node: &'a str,
        /// Whether cached probe results survived.
        keep_cache: bool,
    },
    /// Ground-truth capacity of a worker, in tokens/s at load (only the lab can know it).
    TrueCapacity(WorkerId, f64),
    /// Periodic tick (hosts call it every few seconds).
    Tick,
}

/// A weight strategy. Implementations never read a clock and never do I/O.
pub trait WeightStrategy: Send + fmt::Debug {
    /// The strategy's YAML name (`table`, `probe`, …).
    fn name(&self) -> &'static str;

    /// Feed one event; report which weights may have changed.
    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange;

    /// The current weight of a worker; finite and positive.
    fn weight(&self, worker: WorkerId, fleet: &Fleet) -> Weight;

    /// Every worker's current weight by id, when the strategy keeps them in one slice (what
    /// [`WeightStrategy::weight`] answers for each id it covers), so a host re-reading the
    /// whole fleet after a [`WeightChange::All`] makes one call instead of one per worker.
    /// Default: `None` (ask each worker's weight).
    fn weights(&self) -> Option<&[Weight]> {
        None
    }

    /// False when [`WeightStrategy::observe`] ignores the request path's events
    /// (`Dispatched`, `FirstToken`, `Completed`, `Failed`: it answers `WeightChange::None` and
    /// changes nothing), so the router need not make three virtual calls per request to feed
    /// them. Default: true (they are fed).
    fn observes_requests(&self) -> bool {
        true
    }

    /// Probe bursts the host should run now; default: none.
    fn poll_probes(&mut self, _now: Time, _fleet: &Fleet, _out: &mut Vec<ProbeOrder>) {}

    /// Probe cache and pins to persist across host restarts (probe strategy only).
    fn export_state(&self) -> Option<PersistedProbeState> {
        None
    }

    /// Restore what [`WeightStrategy::export_state`] returned.
    fn import_state(&mut self, _state: PersistedProbeState) {}

    /// The worker's prefill speed (prompt tokens/s) measured by a prefill-bound probe burst
    /// (or adopted from the probe cache); default: none.
    fn probed_prefill_tok_s(&self, _worker: WorkerId) -> Option<f64> {
        None
    }
}

/// Lower and upper bound of a measured weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    /// Lower bound (> 0).
    pub min: f64,
    /// Upper bound (≥ min).
    pub max: f64,
}

impl Clamp {
    /// The source's clamp, [0.25, 8].
    pub const SOURCE: Clamp = Clamp {
        min: 0.25,
        max: 8.0,
    };

    /// Clamp a value; NaN maps to the lower bound.
    pub fn apply(&self, v: f64) -> f64 {
        if v.is_nan() {
            self.min
        } else {
            v.clamp(self.min, self.max)
        }
    }
}

/// Replace NaN, infinities and negatives by zero.
pub(crate) fn sanitize(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

/// Per model, the values of its active workers that have one, sorted. Computing this once per
/// re-derivation keeps a fleet-wide update O(n log n) instead of O(n² log n).
pub(crate) fn sorted_by_model(
    fleet: &Fleet,
    value: impl Fn(WorkerId) -> Option<f64>,
) -> HashMap<ModelId, Vec<f64>> {
    let mut by_model: HashMap<ModelId, Vec<f64>> = HashMap::new();
    for (id, info) in fleet.iter() {
        if info.is_active()
            && let Some(v) = value(id)
        {
            by_model.entry(info.model).or_default().push(sanitize(v));
        }
    }
    for v in by_model.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    by_model
}

/// Median of a sorted slice, optionally with the element at index `skip` left out.
pub(crate) fn sorted_median(sorted: &[f64], skip: Option<usize>) -> Option<f64> {
    let n = sorted.len() - usize::from(skip.is_some() && !sorted.is_empty());
    if n == 0 {
        return None;
    }
    let at = |k: usize| match skip {
        Some(r) if k >= r => sorted[k + 1],
        _ => sorted[k],
    };
    Some(if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    })
}

/// `value / median` clamped: the relative capacity used by probe, oracle and at-load. A missing
/// or zero median falls back to 1.0.
pub(crate) fn relative_to(value: f64, median: Option<f64>, clamp: Clamp) -> f64 {
    match median {
        Some(m) if m > 0.0 => clamp.apply(sanitize(value) / m),
        _ => clamp.apply(1.0),
    }
}

/// Grow a per-worker vector so `id` is a valid index.
pub(crate) fn ensure_slot<T: Default>(v: &mut Vec<T>, id: WorkerId) -> &mut T {
    if v.len() <= id.index() {
        v.resize_with(id.index() + 1, T::default);
    }
    &mut v[id.index()]
}
