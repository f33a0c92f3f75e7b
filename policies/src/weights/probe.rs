//! v3: the burst probe. Capacity is what a worker delivers when it has work queued, so measure
//! exactly that, the same way for every worker.

use super::{
    Clamp, ProbeOrder, ProbePhase, Shaping, WeightChange, WeightEvent, WeightStrategy, ensure_slot,
    relative_to, sorted_by_model, sorted_median,
};
use crate::time::Time;
use crate::worker::{Fleet, Provenance, Weight, WorkerId};
use std::collections::HashMap;
use std::time::Duration;

/// Largest burst: in a gateway every probe request is a real request, one task and one
/// connection each (a burst of 4e9 froze the gateway's runtime).
pub const MAX_PROBE_CONCURRENCY: u32 = 1024;
/// Largest probe prompt, in tokens: a gateway builds the body in memory (≈ 4 bytes a token), and
/// 2^20 tokens is beyond any engine's context window.
pub const MAX_PROBE_PROMPT_TOKENS: u32 = 1 << 20;

/// Parameters of the burst probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Concurrent requests per burst (source: 16).
    pub concurrency: u32,
    /// Exact output tokens per request (source: 128).
    pub output_tokens: u32,
    /// Prompt tokens per request (a short chat prompt).
    pub prompt_tokens: u32,
    /// Send the burst twice and keep the second (the fix for cold engines).
    pub warmup: bool,
    /// How long a result stays valid per (node, model, launch arguments) (source: 6 h).
    pub cache_ttl: Duration,
    /// Re-measure this often, but only when the worker has nothing in flight (source: 6 h).
    pub reprobe_period: Duration,
    /// Bounds of the weight (source: [0.25, 8]).
    pub clamp: Clamp,
    /// Wait before retrying after a failed burst.
    pub retry_after: Duration,
    /// New and unmeasured workers' weights.
    pub shaping: Shaping,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            concurrency: 16,
            output_tokens: 128,
            prompt_tokens: 64,
            warmup: true,
            cache_ttl: Duration::from_secs(6 * 3600),
            reprobe_period: Duration::from_secs(6 * 3600),
            clamp: Clamp::SOURCE,
            retry_after: Duration::from_secs(60),
            shaping: Shaping::default(),
        }
    }
}

/// One cached measurement, as persisted by a host.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeCacheEntry {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// Launch arguments.
    pub launch_args: String,
    /// Measured throughput, tokens/s.
    pub throughput_tok_s: f64,
    /// When it was measured.
    pub measured_at: Time,
}

/// One administrator pin, as persisted by a host.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbePin {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// Pinned weight.
    pub weight: f64,
}

/// The probe strategy's durable state: what a gateway writes to disk.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PersistedProbeState {
    /// Cached measurements.
    pub cache: Vec<ProbeCacheEntry>,
    /// Pins.
    pub pins: Vec<ProbePin>,
}

type CacheKey = (String, String, String);
type PinKey = (String, String);

#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Pending {
    #[default]
    Nothing,
    /// A probe should start; `warmed` when its warm-up burst already ran.
    Due { warmed: bool },
    /// A burst is out.
    Out { order: u64, phase: ProbePhase },
}

#[derive(Debug, Clone, Default)]
struct WorkerProbe {
    throughput: Option<f64>,
    measured_at: Time,
    pending: Pending,
    not_before: Time,
}

/// v3: weight = burst throughput ÷ median throughput of the same model's workers, clamped.
#[derive(Debug, Clone)]
pub struct ProbeWeights {
    config: ProbeConfig,
    workers: Vec<WorkerProbe>,
    cache: HashMap<CacheKey, (f64, Time)>,
    pins: HashMap<PinKey, f64>,
    weights: Vec<Weight>,
    next_order: u64,
}

impl ProbeWeights {
    /// A probe strategy.
    pub fn new(config: ProbeConfig) -> Self {
        ProbeWeights {
            config,
            workers: Vec::new(),
            cache: HashMap::new(),
            pins: HashMap::new(),
            weights: Vec::new(),
            next_order: 1,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    /// Last measured throughput of a worker, tokens/s.
    pub fn throughput(&self, worker: WorkerId) -> Option<f64> {
        self.workers.get(worker.index()).and_then(|w| w.throughput)
    }

    fn cache_key(fleet: &Fleet, id: WorkerId) -> Option<CacheKey> {
        fleet.get(id).map(|w| {
            (
                w.spec.node.clone(),
                w.spec.model.clone(),
                w.spec.launch_args.clone(),
            )
        })
    }

    fn pin_key(fleet: &Fleet, id: WorkerId) -> Option<PinKey> {
        fleet
            .get(id)
            .map(|w| (w.spec.node.clone(), w.spec.model.clone()))
    }

    /// Take the measurement from the cache if fresh, else ask for a probe.
    fn adopt_cached_or_probe(&mut self, now: Time, fleet: &Fleet, id: WorkerId) {
        let cached = Self::cache_key(fleet, id)
            .and_then(|k| self.cache.get(&k).copied())
            .filter(|(_, at)| now.saturating_since(*at) < self.config.cache_ttl);
        let slot = ensure_slot(&mut self.workers, id);
        match cached {
            Some((tp, at)) => {
                slot.throughput = Some(tp);
                slot.measured_at = at;
                slot.pending = Pending::Nothing;
            }
            None => {
                slot.throughput = None;
                slot.pending = Pending::Due { warmed: false };
                slot.not_before = now;
            }
        }
    }

    fn recompute(&mut self, fleet: &Fleet) {
        let measured = sorted_by_model(fleet, |id| {
            self.workers.get(id.index()).and_then(|w| w.throughput)
        });
        self.weights.clear();
        for (id, info) in fleet.iter() {
            // Pins are rare: skip building a key (two String clones) when there are none.
            let pinned = if self.pins.is_empty() {
                None
            } else {
                Self::pin_key(fleet, id).and_then(|k| self.pins.get(&k).copied())
            };
            let w = if let Some(p) = pinned {
                Weight {
                    value: self.config.clamp.apply(p),
                    provenance: Provenance::Pinned,
                }
            } else if let Some(tp) = self.workers.get(id.index()).and_then(|w| w.throughput) {
                // An inactive worker's own figure is not among its model's; then it is the median.
                let median = measured
                    .get(&info.model)
                    .and_then(|v| sorted_median(v, None))
                    .or(Some(tp));
                Weight {
                    value: relative_to(tp, median, self.config.clamp),
                    provenance: Provenance::Measured,
                }
            } else {
                Weight::UNMEASURED
            };
            self.weights.push(w);
        }
    }

    fn on_result(&mut self, now: Time, fleet: &Fleet, r: &super::ProbeResult) -> bool {
        let Some(slot) = self.workers.get_mut(r.worker.index()) else {
            return false;
        };
        let Pending::Out { order, phase } = slot.pending else {
            return false;
        };
        if order != r.order {
            return false;
        }
        // A burst with no tokens or no wall time measured nothing (its throughput is reported
        // as zero): retry it like a failure rather than caching "measured at 0 tok/s".
        if !r.ok || r.throughput_tok_s() <= 0.0 {
            slot.pending = Pending::Due { warmed: false };
            slot.not_before = now + self.config.retry_after;
            return false;
        }
        match phase {
            ProbePhase::Warmup => {
                slot.pending = Pending::Due { warmed: true };
                false
            }
            ProbePhase::Measure => {
                let tp = r.throughput_tok_s();
                slot.throughput = Some(tp);
                slot.measured_at = now;
                slot.pending = Pending::Nothing;
                if let Some(k) = Self::cache_key(fleet, r.worker) {
                    self.cache.insert(k, (tp, now));
                }
                true
            }
        }
    }
}

impl WeightStrategy for ProbeWeights {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        let changed = match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                self.adopt_cached_or_probe(now, fleet, id);
                true
            }
            WeightEvent::Reconnected(id) => {
                // Same engine, same arguments: keep what we know if it is still fresh.
                let fresh = self.workers.get(id.index()).is_some_and(|w| {
                    w.throughput.is_some()
                        && now.saturating_since(w.measured_at) < self.config.cache_ttl
                });
                if !fresh {
                    self.adopt_cached_or_probe(now, fleet, id);
                }
                true
            }
            WeightEvent::Disconnected(id) | WeightEvent::Removed(id) => {
                if let Some(w) = self.workers.get_mut(id.index()) {
                    // A burst that was out is lost with the connection; start over later.
                    if matches!(w.pending, Pending::Out { .. }) {
                        w.pending = Pending::Due { warmed: false };
                    }
                }
                true
            }
            WeightEvent::Probe(r) => self.on_result(now, fleet, r),
            WeightEvent::Pin(id, value) => {
                if let Some(k) = Self::pin_key(fleet, id) {
                    self.pins.insert(k, value);
                }
                true
            }
            WeightEvent::Unpin(id) => {
                if let Some(k) = Self::pin_key(fleet, id) {
                    self.pins.remove(&k);
                }
                true
            }
            WeightEvent::Reprobe(id) => {
                let slot = ensure_slot(&mut self.workers, id);
                if !matches!(slot.pending, Pending::Out { .. }) {
                    slot.pending = Pending::Due { warmed: false };
                    slot.not_before = now;
                }
                false
            }
            WeightEvent::NodeManagerRestart { node, keep_cache } => {
                if !keep_cache {
                    self.cache.retain(|(n, _, _), _| n != node);
                }
                let on_node: Vec<WorkerId> = fleet
                    .iter()
                    .filter(|(_, w)| w.spec.node == node && w.is_active())
                    .map(|(id, _)| id)
                    .collect();
                for id in on_node {
                    self.adopt_cached_or_probe(now, fleet, id);
                }
                true
            }
            _ => false,
        };
        if changed {
            self.recompute(fleet);
            WeightChange::All
        } else {
            WeightChange::None
        }
    }

    fn weight(&self, worker: WorkerId, _fleet: &Fleet) -> Weight {
        self.weights
            .get(worker.index())
            .copied()
            .unwrap_or(Weight::UNMEASURED)
    }

    fn poll_probes(&mut self, now: Time, fleet: &Fleet, out: &mut Vec<ProbeOrder>) {
        for (id, info) in fleet.iter() {
            if !info.is_active() {
                continue;
            }
            let Some(slot) = self.workers.get_mut(id.index()) else {
                continue;
            };
            // The periodic re-measurement never competes with a customer.
            if slot.pending == Pending::Nothing
                && slot.throughput.is_some()
                && info.in_flight == 0
                && now.saturating_since(slot.measured_at) >= self.config.reprobe_period
            {
                slot.pending = Pending::Due { warmed: false };
                slot.not_before = now;
            }
            if let Pending::Due { warmed } = slot.pending {
                if now < slot.not_before {
                    continue;
                }
                let phase = if self.config.warmup && !warmed {
                    ProbePhase::Warmup
                } else {
                    ProbePhase::Measure
                };
                let order = self.next_order;
                self.next_order += 1;
                slot.pending = Pending::Out { order, phase };
                out.push(ProbeOrder {
                    id: order,
                    worker: id,
                    phase,
                    concurrency: self.config.concurrency,
                    output_tokens: self.config.output_tokens,
                    prompt_tokens: self.config.prompt_tokens,
                });
            }
        }
    }

    fn export_state(&self) -> Option<PersistedProbeState> {
        let mut cache: Vec<ProbeCacheEntry> = self
            .cache
            .iter()
            .map(|((node, model, args), (tp, at))| ProbeCacheEntry {
                node: node.clone(),
                model: model.clone(),
                launch_args: args.clone(),
                throughput_tok_s: *tp,
                measured_at: *at,
            })
            .collect();
        cache.sort_by(|a, b| {
            (&a.node, &a.model, &a.launch_args).cmp(&(&b.node, &b.model, &b.launch_args))
        });
        let mut pins: Vec<ProbePin> = self
            .pins
            .iter()
            .map(|((node, model), w)| ProbePin {
                node: node.clone(),
                model: model.clone(),
                weight: *w,
            })
            .collect();
        pins.sort_by(|a, b| (&a.node, &a.model).cmp(&(&b.node, &b.model)));
        Some(PersistedProbeState { cache, pins })
    }

    fn import_state(&mut self, state: PersistedProbeState) {
        for e in state.cache {
            // A corrupt (NaN, negative, zero) throughput is no measurement: skip it rather than
            // cache "measured at 0 tok/s", which would pin the worker at the clamp's minimum.
            let tp = super::sanitize(e.throughput_tok_s);
            if tp > 0.0 {
                self.cache
                    .insert((e.node, e.model, e.launch_args), (tp, e.measured_at));
            }
        }
        for p in state.pins {
            if p.weight.is_finite() && p.weight > 0.0 {
                self.pins.insert((p.node, p.model), p.weight);
            }
        }
    }
}
