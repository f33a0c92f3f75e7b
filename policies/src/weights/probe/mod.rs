//! v3: the burst probe. Capacity is what a worker delivers when it has work queued, so measure
//! exactly that, the same way for every worker.

use super::{ProbeOrder, ProbePhase, WeightChange, WeightEvent, WeightStrategy, ensure_slot};
use crate::time::Time;
use crate::worker::{Fleet, ModelId, Weight, WorkerId};
use std::collections::{BTreeSet, HashMap};

mod config;
mod measured;
mod schedule;

pub use config::{
    MAX_PROBE_CONCURRENCY, MAX_PROBE_PROMPT_TOKENS, PersistedProbeState, PrefillProbe,
    ProbeCacheEntry, ProbeConfig, ProbePin,
};

type CacheKey = (String, String, String);

/// A cached measurement: throughput, prefill speed if measured, when.
#[derive(Debug, Clone, Copy)]
struct Cached {
    throughput: f64,
    prefill_tok_s: Option<f64>,
    at: Time,
}
type PinKey = (String, String);

#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Pending {
    #[default]
    Nothing,
    /// A probe should start; `warmed` when its warm-up burst already ran.
    Due { warmed: bool },
    /// A burst is out.
    Out { order: u64, phase: ProbePhase },
    /// The throughput is measured; the prefill-bound burst should start.
    PrefillDue,
}

#[derive(Debug, Clone, Default)]
struct WorkerProbe {
    throughput: Option<f64>,
    /// Prefill speed from the prefill-bound burst, prompt tokens/s.
    prefill_tok_s: Option<f64>,
    measured_at: Time,
    pending: Pending,
    not_before: Time,
    /// Prompt tokens of this worker's prefill-bound requests (the configured length, fitted
    /// to its context window).
    prefill_prompt: u32,
}

/// v3: weight = burst throughput ÷ median throughput of the same model's workers, clamped.
#[derive(Debug, Clone)]
pub struct ProbeWeights {
    config: ProbeConfig,
    workers: Vec<WorkerProbe>,
    cache: HashMap<CacheKey, Cached>,
    pins: HashMap<PinKey, f64>,
    weights: Vec<Weight>,
    next_order: u64,
    /// By model index: the throughputs of its active measured workers, sorted (what
    /// `sorted_by_model` would build), kept in step per event instead of rebuilt.
    measured: Vec<Vec<f64>>,
    /// By worker: the (model, throughput) it contributes to `measured`, if any.
    member: Vec<Option<(ModelId, f64)>>,
    /// Workers that may have a probe due (a superset): `poll_probes` visits these in id order
    /// instead of the whole fleet.
    due: BTreeSet<u32>,
    /// No measurement is older than this (a lower bound): until it is a re-probe period old,
    /// no periodic re-measurement can fall due and `poll_probes` skips the fleet scan.
    oldest_measured: Option<Time>,
    /// The fleet's model by worker id (a worker's model never changes), copied so a
    /// re-derivation of every weight reads a flat array instead of each worker's `WorkerInfo`.
    model_of: Vec<ModelId>,
    /// Each model's median throughput, by model index: `recompute`'s buffer.
    medians: Vec<Option<f64>>,
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
            measured: Vec::new(),
            member: Vec::new(),
            due: BTreeSet::new(),
            oldest_measured: None,
            model_of: Vec::new(),
            medians: Vec::new(),
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

    /// Last measured prefill speed of a worker, prompt tokens/s.
    pub fn prefill_tok_s(&self, worker: WorkerId) -> Option<f64> {
        self.workers
            .get(worker.index())
            .and_then(|w| w.prefill_tok_s)
    }

    /// Take the measurement from the cache if fresh, else ask for a probe. A cached
    /// measurement without the prefill speed a configured prefill probe wants asks for the
    /// prefill-bound burst alone.
    fn adopt_cached_or_probe(&mut self, now: Time, fleet: &Fleet, id: WorkerId) {
        let cached = Self::cache_key(fleet, id)
            .and_then(|k| self.cache.get(&k).copied())
            .filter(|c| now.saturating_since(c.at) < self.config.cache_ttl);
        let prefill = self.config.prefill;
        let window = fleet.get(id).map_or(u32::MAX, |w| w.spec.context_window);
        let slot = ensure_slot(&mut self.workers, id);
        slot.prefill_prompt = prefill.map_or(0, |p| p.prompt_on(window));
        match cached {
            Some(c) => {
                slot.throughput = Some(c.throughput);
                slot.prefill_tok_s = c.prefill_tok_s;
                slot.measured_at = c.at;
                slot.pending = Pending::Nothing;
                if prefill.is_some() && c.prefill_tok_s.is_none() {
                    slot.pending = Pending::PrefillDue;
                    slot.not_before = now;
                    self.due.insert(id.0);
                }
                self.note_measured(c.at);
            }
            None => {
                slot.throughput = None;
                slot.prefill_tok_s = None;
                slot.pending = Pending::Due { warmed: false };
                slot.not_before = now;
                self.due.insert(id.0);
            }
        }
    }

    fn note_measured(&mut self, at: Time) {
        self.oldest_measured = Some(self.oldest_measured.map_or(at, |m| m.min(at)));
    }
}

impl WeightStrategy for ProbeWeights {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        // Events about one worker re-derive only what they can move (its weight, or its
        // model's when the median moved); the rest rebuild everything.
        match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                self.adopt_cached_or_probe(now, fleet, id);
                self.update_one(fleet, id)
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
                self.update_one(fleet, id)
            }
            WeightEvent::Disconnected(id) | WeightEvent::Removed(id) => {
                if let Some(w) = self.workers.get_mut(id.index()) {
                    // A burst that was out is lost with the connection; start over later (a
                    // prefill-bound one alone: the throughput it follows stands).
                    match w.pending {
                        Pending::Out {
                            phase: ProbePhase::Prefill,
                            ..
                        } => {
                            w.pending = Pending::PrefillDue;
                            self.due.insert(id.0);
                        }
                        Pending::Out { .. } => {
                            w.pending = Pending::Due { warmed: false };
                            self.due.insert(id.0);
                        }
                        _ => {}
                    }
                }
                self.update_one(fleet, id)
            }
            WeightEvent::Probe(r) => {
                if self.on_result(now, fleet, r) {
                    self.update_one(fleet, r.worker)
                } else {
                    WeightChange::None
                }
            }
            WeightEvent::Pin(id, value) => {
                if let Some(k) = Self::pin_key(fleet, id) {
                    self.pins.insert(k, value);
                }
                self.rebuild(fleet)
            }
            WeightEvent::Unpin(id) => {
                if let Some(k) = Self::pin_key(fleet, id) {
                    self.pins.remove(&k);
                }
                self.rebuild(fleet)
            }
            WeightEvent::Reprobe(id) => {
                let slot = ensure_slot(&mut self.workers, id);
                if !matches!(slot.pending, Pending::Out { .. }) {
                    slot.pending = Pending::Due { warmed: false };
                    slot.not_before = now;
                    self.due.insert(id.0);
                }
                WeightChange::None
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
                self.rebuild(fleet)
            }
            _ => WeightChange::None,
        }
    }

    fn weight(&self, worker: WorkerId, _fleet: &Fleet) -> Weight {
        self.weights
            .get(worker.index())
            .copied()
            .unwrap_or(Weight::UNMEASURED)
    }

    fn weights(&self) -> Option<&[Weight]> {
        Some(&self.weights)
    }

    fn probed_prefill_tok_s(&self, worker: WorkerId) -> Option<f64> {
        self.prefill_tok_s(worker)
    }

    /// Measurements come from probe bursts only (the `_` arm of `observe`).
    fn observes_requests(&self) -> bool {
        false
    }

    fn poll_probes(&mut self, now: Time, fleet: &Fleet, out: &mut Vec<ProbeOrder>) {
        let reprobe_possible = self
            .oldest_measured
            .is_some_and(|m| now.saturating_since(m) >= self.config.reprobe_period);
        if reprobe_possible {
            self.poll_scan(now, fleet, out);
        } else {
            // Same visits in the same (id) order as the scan, restricted to the workers that
            // can have a probe due.
            let candidates: Vec<u32> = self.due.iter().copied().collect();
            for i in candidates {
                let id = WorkerId(i);
                if fleet.get(id).is_some_and(|w| w.is_active()) {
                    self.issue_if_due(now, id, out);
                }
            }
        }
        let workers = &self.workers;
        self.due.retain(|&i| {
            workers
                .get(i as usize)
                .is_some_and(|w| matches!(w.pending, Pending::Due { .. } | Pending::PrefillDue))
        });
    }

    fn export_state(&self) -> Option<PersistedProbeState> {
        let mut cache: Vec<ProbeCacheEntry> = self
            .cache
            .iter()
            .map(|((node, model, args), c)| ProbeCacheEntry {
                node: node.clone(),
                model: model.clone(),
                launch_args: args.clone(),
                throughput_tok_s: c.throughput,
                prefill_tok_s: c.prefill_tok_s,
                measured_at: c.at,
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
            // The same for the prefill speed: a corrupt one is dropped, the throughput kept.
            let prefill_tok_s = e.prefill_tok_s.map(super::sanitize).filter(|&v| v > 0.0);
            if tp > 0.0 {
                self.cache.insert(
                    (e.node, e.model, e.launch_args),
                    Cached {
                        throughput: tp,
                        prefill_tok_s,
                        at: e.measured_at,
                    },
                );
            }
        }
        for p in state.pins {
            if p.weight.is_finite() && p.weight > 0.0 {
                self.pins.insert((p.node, p.model), p.weight);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::ProbeResult;
    use crate::worker::{Provenance, WorkerInfo, WorkerSpec, WorkerState};
    use proptest::prelude::*;
    use std::time::Duration;

    #[derive(Debug, Clone)]
    enum Op {
        Register {
            model: u32,
            node: u8,
        },
        /// Answer every order polled now with this many tokens in one second.
        Answer(u64),
        Fail,
        Disconnect(usize),
        Reconnect(usize),
        Remove(usize),
        Pin(usize, f64),
        Unpin(usize),
        NodeRestart(u8, bool),
        Reprobe(usize),
        Wait(u64),
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..3, 0u8..4).prop_map(|(model, node)| Op::Register { model, node }),
            // Few distinct values: ties in the sorted throughputs.
            4 => prop::sample::select(vec![0u64, 100, 200, 300, 400]).prop_map(Op::Answer),
            1 => Just(Op::Fail),
            1 => any::<usize>().prop_map(Op::Disconnect),
            1 => any::<usize>().prop_map(Op::Reconnect),
            1 => any::<usize>().prop_map(Op::Remove),
            1 => (any::<usize>(), 0.1f64..4.0).prop_map(|(w, v)| Op::Pin(w, v)),
            1 => any::<usize>().prop_map(Op::Unpin),
            1 => (0u8..4, any::<bool>()).prop_map(|(n, k)| Op::NodeRestart(n, k)),
            1 => any::<usize>().prop_map(Op::Reprobe),
            1 => prop::sample::select(vec![1u64, 30, 7 * 3600]).prop_map(Op::Wait),
        ]
    }

    fn info(model: u32, node: u8, now: Time) -> WorkerInfo {
        WorkerInfo {
            spec: WorkerSpec {
                name: String::new(),
                node: format!("n{node}"),
                model: format!("m{model}"),
                gpu_names: Vec::new(),
                context_window: 1024,
                launch_args: String::new(),
                cache_blocks: None,
            },
            model: ModelId(model),
            state: WorkerState::Up,
            in_flight: 0,
            since: now,
        }
    }

    fn bits(w: &[Weight]) -> Vec<(u64, Provenance)> {
        w.iter()
            .map(|w| (w.value.to_bits(), w.provenance))
            .collect()
    }

    /// Every weight by `weight_of`, one worker at a time (the rule `recompute`'s flat pass
    /// must agree with).
    fn per_worker(p: &ProbeWeights, fleet: &Fleet) -> Vec<Weight> {
        fleet
            .iter()
            .map(|(id, info)| {
                let median = p.median_of(info.model);
                ProbeWeights::weight_of(&p.config, &p.pins, &p.workers, median, fleet, id)
            })
            .collect()
    }

    /// Poll both ways (the due list, the fleet scan) and check they agree.
    fn poll(p: &mut ProbeWeights, now: Time, fleet: &Fleet) -> Vec<ProbeOrder> {
        let mut scanned = p.clone();
        let mut by_scan = Vec::new();
        scanned.poll_scan(now, fleet, &mut by_scan);
        let mut out = Vec::new();
        p.poll_probes(now, fleet, &mut out);
        assert_eq!(
            out, by_scan,
            "the due list and the fleet scan send different probes"
        );
        out
    }

    /// Start-up cost: a worker registering without a cached measurement moves no median, so
    /// the strategy reports only its own weight (the router then refreshes one worker, not the
    /// fleet), and once every probe is out the due list is empty (no fleet scan per poll).
    #[test]
    fn unmeasured_registration_changes_one_weight_and_empties_the_due_list() {
        let mut p = ProbeWeights::new(ProbeConfig::default());
        let mut fleet = Fleet::default();
        let mut out = Vec::new();
        for i in 0..100u32 {
            fleet.workers.push(info(i % 2, (i % 4) as u8, Time::ZERO));
            let id = WorkerId(i);
            let change = p.observe(Time::ZERO, WeightEvent::Registered(id), &fleet);
            assert_eq!(change, WeightChange::One(id));
            p.poll_probes(Time::ZERO, &fleet, &mut out);
            assert!(
                p.due.is_empty(),
                "a probe was left due after registration {i}"
            );
        }
        assert_eq!(out.len(), 100);
        assert!(out.windows(2).all(|w| w[0].worker < w[1].worker));
        // The first measurement of a model moves its median: every weight is re-derived.
        let r = ProbeResult {
            order: out[0].id,
            worker: out[0].worker,
            output_tokens: 100,
            prompt_tokens: 0,
            wall: Duration::from_secs(1),
            ok: true,
        };
        let warm = p.observe(Time::ZERO, WeightEvent::Probe(&r), &fleet);
        assert_eq!(warm, WeightChange::None, "a warm-up burst measures nothing");
        assert_eq!(p.due.len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// The weights kept per event equal a full re-derivation after every event, a `One`
        /// change leaves every other weight as it was, and the due list sends exactly the
        /// probes a fleet scan would.
        #[test]
        fn incremental_weights_and_due_list_equal_a_rebuild(
            ops in proptest::collection::vec(any_op(), 1..120),
            prefill in any::<bool>(),
        ) {
            // With a prefill-bound burst after each measurement, or without (the source's).
            let mut p = ProbeWeights::new(ProbeConfig {
                prefill: prefill.then_some(PrefillProbe::DEFAULT),
                ..ProbeConfig::default()
            });
            let mut fleet = Fleet::default();
            let mut now = Time::ZERO;
            let mut pending_orders: Vec<ProbeOrder> = Vec::new();
            for op in ops {
                let n = fleet.len().max(1);
                let before = p.weights.clone();
                let mut events: Vec<(WorkerId, WeightChange)> = Vec::new();
                match op {
                    Op::Register { model, node } => {
                        let id = WorkerId(fleet.len() as u32);
                        fleet.workers.push(info(model, node, now));
                        events.push((id, p.observe(now, WeightEvent::Registered(id), &fleet)));
                    }
                    Op::Answer(tokens) => {
                        pending_orders.extend(poll(&mut p, now, &fleet));
                        for o in std::mem::take(&mut pending_orders) {
                            let r = ProbeResult {
                                order: o.id,
                                worker: o.worker,
                                output_tokens: tokens + u64::from(o.worker.0 % 3),
                                prompt_tokens: u64::from(o.concurrency) * u64::from(o.prompt_tokens),
                                wall: Duration::from_secs(1),
                                ok: true,
                            };
                            let b = p.weights.clone();
                            let c = p.observe(now, WeightEvent::Probe(&r), &fleet);
                            if let WeightChange::One(id) = c {
                                for (i, (x, y)) in b.iter().zip(&p.weights).enumerate() {
                                    prop_assert!(i == id.index() || x == y);
                                }
                            }
                        }
                    }
                    Op::Fail => {
                        pending_orders.extend(poll(&mut p, now, &fleet));
                        for o in std::mem::take(&mut pending_orders) {
                            let r = ProbeResult {
                                order: o.id,
                                worker: o.worker,
                                output_tokens: 0,
                                prompt_tokens: 0,
                                wall: Duration::ZERO,
                                ok: false,
                            };
                            p.observe(now, WeightEvent::Probe(&r), &fleet);
                        }
                    }
                    Op::Disconnect(i) | Op::Reconnect(i) | Op::Remove(i) if !fleet.is_empty() => {
                        let id = WorkerId((i % n) as u32);
                        let w = &mut fleet.workers[id.index()];
                        if w.state == WorkerState::Removed {
                            continue;
                        }
                        let (state, ev) = match op {
                            Op::Disconnect(_) => (WorkerState::Disconnected, WeightEvent::Disconnected(id)),
                            Op::Reconnect(_) => (WorkerState::Up, WeightEvent::Reconnected(id)),
                            _ => (WorkerState::Removed, WeightEvent::Removed(id)),
                        };
                        w.state = state;
                        events.push((id, p.observe(now, ev, &fleet)));
                    }
                    Op::Pin(i, v) if !fleet.is_empty() => {
                        p.observe(now, WeightEvent::Pin(WorkerId((i % n) as u32), v), &fleet);
                    }
                    Op::Unpin(i) if !fleet.is_empty() => {
                        p.observe(now, WeightEvent::Unpin(WorkerId((i % n) as u32)), &fleet);
                    }
                    Op::Reprobe(i) if !fleet.is_empty() => {
                        p.observe(now, WeightEvent::Reprobe(WorkerId((i % n) as u32)), &fleet);
                    }
                    Op::NodeRestart(node, keep_cache) => {
                        let node = format!("n{node}");
                        p.observe(now, WeightEvent::NodeManagerRestart { node: &node, keep_cache }, &fleet);
                    }
                    Op::Wait(s) => now = now + Duration::from_secs(s),
                    _ => {}
                }
                for (id, change) in events {
                    if change == WeightChange::One(id) {
                        for (i, (x, y)) in before.iter().zip(&p.weights).enumerate() {
                            prop_assert!(i == id.index() || x == y, "worker {i} moved on a One({id:?})");
                        }
                    }
                }
                let mut fresh = p.clone();
                fresh.rebuild(&fleet);
                // Empty lists of models with no measured worker are the same state.
                let trim = |m: &[Vec<f64>]| {
                    let mut m = m.to_vec();
                    while m.last().is_some_and(Vec::is_empty) {
                        m.pop();
                    }
                    m
                };
                prop_assert_eq!(trim(&fresh.measured), trim(&p.measured));
                prop_assert_eq!(bits(&fresh.weights), bits(&p.weights));
                // The flat pass without pins agrees with the general rule worker by worker.
                prop_assert_eq!(bits(&per_worker(&fresh, &fleet)), bits(&p.weights));
                pending_orders.extend(poll(&mut p, now, &fleet));
            }
        }
    }
}
