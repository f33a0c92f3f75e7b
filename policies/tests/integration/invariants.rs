//! Property-based invariants over random fleets, policies and event sequences:
//! - only eligible workers are returned (right model, window ≥ context, Up, below cap), and an
//!   error is returned only when no worker is eligible, with the matching variant;
//! - every weight is finite and positive; measured, oracle, at-load and pinned weights lie
//!   within their clamp; "not yet measured" is exactly 1.0;
//! - the cap the router applies is the one its policy and current weight imply;
//! - same seed, same events ⇒ same decisions and probe orders.

use crate::common::{blocks, spec_full};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::weights::{AtLoadConfig, LiveConfig, ProbeConfig, TableConfig};
use routelab_policies::{
    Affinity, AffinityUnits, Allowance, Cap, Charge, Chooser, Clamp, Completion, Decision, ModelId,
    PolicyConfig, PrefixKnowledge, ProbeOrder, ProbeResult, Provenance, RouteError, RouteRequest,
    Router, TieRule, Time, WeightsConfig, WorkerId, WorkerState,
};
use std::time::Duration;

const MODELS: [&str; 3] = ["m0", "m1", "m2"];
const WINDOWS: [u32; 4] = [4_096, 8_192, 32_768, 131_072];
const GPUS: [&[&str]; 6] = [
    &["RTX 4090"],
    &["RTX 4090", "RTX 4090"],
    &["H100", "H100", "H100", "H100"],
    &["RTX PRO 6000"],
    &[],
    &["Apple M2 Ultra"],
];
const MAX_WORKERS: usize = 20;

#[derive(Debug, Clone)]
struct Reg {
    model: u8,
    window: u8,
    gpus: u8,
    node: u8,
    args: u8,
}

#[derive(Debug, Clone)]
enum Op {
    Register(Reg),
    Route {
        model: u8,
        tokens: u32,
        conv: u8,
        len: u8,
    },
    Complete {
        pick: u16,
        ttft_ms: u32,
    },
    Fail {
        pick: u16,
    },
    Disconnect(u8),
    Reconnect(u8),
    Drain(u8),
    Restart(u8, u8),
    Remove(u8),
    Pin(u8, f64),
    Unpin(u8),
    Reprobe(u8),
    Poll,
    Answer {
        pick: u16,
        kind: u8,
        tok_s: f64,
    },
    TrueCapacity(u8, f64),
    NodeManagerRestart(u8, bool),
    Tick(u64),
    Queue {
        model: u8,
        tokens: u32,
    },
}

fn any_clamp() -> impl Strategy<Value = Clamp> {
    (0.05f64..=1.0, 1.0f64..=20.0).prop_map(|(min, max)| Clamp { min, max })
}

fn any_weights() -> impl Strategy<Value = WeightsConfig> {
    prop_oneof![
        Just(WeightsConfig::Table(TableConfig::default())),
        (any_clamp(), 1u64..600, 1u32..30).prop_map(|(clamp, interval, min_requests)| {
            WeightsConfig::Live(LiveConfig {
                interval: Duration::from_secs(interval),
                min_requests,
                clamp,
                ..LiveConfig::default()
            })
        }),
        (
            any_clamp(),
            any::<bool>(),
            1u64..30_000,
            1u64..30_000,
            1u64..600
        )
            .prop_map(|(clamp, warmup, ttl, period, retry)| WeightsConfig::Probe(
                ProbeConfig {
                    warmup,
                    cache_ttl: Duration::from_secs(ttl),
                    reprobe_period: Duration::from_secs(period),
                    retry_after: Duration::from_secs(retry),
                    clamp,
                    ..ProbeConfig::default()
                }
            )),
        any_clamp().prop_map(WeightsConfig::Oracle),
        Just(WeightsConfig::Equal),
        (any_clamp(), any::<bool>(), 0.0f64..8.0, 1u64..120).prop_map(
            |(clamp, prior, min_samples, tc)| WeightsConfig::AtLoad(AtLoadConfig {
                clamp,
                prior: prior.then(TableConfig::default),
                min_samples,
                time_constant: Duration::from_secs(tc),
                update_interval: Duration::from_secs(1),
                ..AtLoadConfig::default()
            })
        ),
    ]
}

fn any_ties() -> impl Strategy<Value = TieRule> {
    prop_oneof![
        Just(TieRule::First),
        Just(TieRule::Random),
        Just(TieRule::HigherWeight)
    ]
}

fn any_chooser() -> impl Strategy<Value = Chooser> {
    prop_oneof![
        any_ties().prop_map(|ties| Chooser::P2c { ties }),
        any_ties().prop_map(|ties| Chooser::Sed { ties }),
        any_ties().prop_map(|ties| Chooser::Jsq { ties }),
        (any_ties(), 0.0f64..3.0).prop_map(|(ties, bias)| Chooser::LeastRequest { bias, ties }),
        Just(Chooser::Wrr),
        Just(Chooser::Random),
        Just(Chooser::RoundRobin),
        Just(Chooser::CACHE_AWARE),
        Just(Chooser::LEAST_LOAD),
        any::<bool>().prop_map(|measured| if measured {
            Chooser::STICKY_MEASURED
        } else {
            Chooser::STICKY
        }),
        (1u32..6).prop_map(|key_blocks| Chooser::Pulsar { key_blocks }),
        (1u32..6, 0.001f64..1.0, 1u32..80).prop_map(|(key_blocks, window_s, max_candidates)| {
            Chooser::WaitAndWiden {
                key_blocks,
                window_s,
                max_candidates,
                rtt_s: 0.0,
            }
        }),
        (0.0f64..2.0, prop_oneof![Just(0.0), 0.01f64..5.0]).prop_map(
            |(prefill_weight, temperature)| Chooser::KvCost {
                prefill_weight,
                temperature,
            }
        ),
        (0.0f64..3.0).prop_map(|beta| Chooser::HitMinusLoad { beta }),
    ]
}

fn any_affinity() -> impl Strategy<Value = Affinity> {
    prop_oneof![
        Just(Affinity::None),
        (
            any::<bool>(),
            0.0f64..4.0,
            0.0f64..1.0,
            0.0f64..10.0,
            1usize..256
        )
            .prop_map(
                |(raw, base, per_1k_tokens, extra, index_blocks)| Affinity::Prefix {
                    units: if raw {
                        AffinityUnits::Raw
                    } else {
                        AffinityUnits::Capacity
                    },
                    allowance: Allowance {
                        base,
                        per_1k_tokens,
                        max: base + extra,
                    },
                    index_blocks,
                }
            ),
    ]
}

fn any_cap() -> impl Strategy<Value = Cap> {
    prop_oneof![
        Just(Cap::None),
        (1u32..30).prop_map(Cap::Flat),
        (1u32..30).prop_map(Cap::Weighted),
    ]
}

fn any_knowledge() -> impl Strategy<Value = PrefixKnowledge> {
    prop_oneof![
        Just(PrefixKnowledge::Approximate),
        Just(PrefixKnowledge::Unbounded),
        (0u64..3).prop_map(|s| PrefixKnowledge::KvEvents {
            delay: Duration::from_secs(s)
        }),
    ]
}

fn any_policy() -> impl Strategy<Value = PolicyConfig> {
    (
        any_weights(),
        any_chooser(),
        any_affinity(),
        any_cap(),
        any_knowledge(),
    )
        .prop_map(
            |(weights, chooser, affinity, cap, knowledge)| PolicyConfig {
                name: "prop".into(),
                weights,
                chooser,
                affinity,
                cap,
                knowledge,
            },
        )
}

fn any_reg() -> impl Strategy<Value = Reg> {
    (0u8..3, 0u8..4, 0u8..6, 0u8..6, 0u8..3).prop_map(|(model, window, gpus, node, args)| Reg {
        model,
        window,
        gpus,
        node,
        args,
    })
}

/// Any f64, with the nasty ones over-represented.
fn nasty_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(-1.0),
        Just(0.0),
        Just(1e300),
        Just(f64::INFINITY),
        Just(f64::MIN_POSITIVE),
        any::<f64>(),
        0.01f64..100.0,
        1.0f64..100_000.0,
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    let w = any::<u8>;
    prop_oneof![
        2 => any_reg().prop_map(Op::Register),
        12 => (0u8..4, prop_oneof![1u32..5_000, 1u32..140_000], 0u8..8, 1u8..24)
            .prop_map(|(model, tokens, conv, len)| Op::Route { model, tokens, conv, len }),
        6 => (any::<u16>(), 0u32..5_000).prop_map(|(pick, ttft_ms)| Op::Complete { pick, ttft_ms }),
        2 => any::<u16>().prop_map(|pick| Op::Fail { pick }),
        1 => w().prop_map(Op::Disconnect),
        1 => w().prop_map(Op::Reconnect),
        1 => w().prop_map(Op::Drain),
        1 => (w(), 0u8..3).prop_map(|(i, a)| Op::Restart(i, a)),
        1 => w().prop_map(Op::Remove),
        2 => (w(), nasty_f64()).prop_map(|(i, v)| Op::Pin(i, v)),
        1 => w().prop_map(Op::Unpin),
        1 => w().prop_map(Op::Reprobe),
        3 => Just(Op::Poll),
        4 => (any::<u16>(), 0u8..8, nasty_f64()).prop_map(|(pick, kind, tok_s)| Op::Answer { pick, kind, tok_s }),
        2 => (w(), nasty_f64()).prop_map(|(i, v)| Op::TrueCapacity(i, v)),
        1 => (0u8..6, any::<bool>()).prop_map(|(n, k)| Op::NodeManagerRestart(n, k)),
        4 => prop_oneof![
            0u64..2_000_000_000,
            0u64..20_000_000_000_000,
            Just(7 * 3_600 * 1_000_000_000),
        ].prop_map(Op::Tick),
        1 => (0u8..3, 1u32..140_000).prop_map(|(model, tokens)| Op::Queue { model, tokens }),
    ]
}

/// Everything observable that must be the same on a re-run.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Route(Result<Decision, RouteError>),
    Orders(Vec<ProbeOrder>),
    Queued(Option<(u64, Result<Decision, RouteError>)>),
}

struct Sim {
    router: Router,
    rng: Xoshiro256PlusPlus,
    now: Time,
    /// What the host holds for each request in flight: worker, dispatch time, charge.
    in_flight: Vec<(WorkerId, Time, Charge)>,
    orders: Vec<ProbeOrder>,
    seen: Vec<Seen>,
    next_ticket: u64,
}

impl Sim {
    fn worker(&self, i: u8) -> Option<WorkerId> {
        let n = self.router.fleet().len();
        (n > 0).then(|| WorkerId(u32::from(i) % n as u32))
    }

    fn register(&mut self, r: &Reg) {
        let name = format!("w{}", self.router.fleet().len());
        let mut spec = spec_full(
            &name,
            &format!("node{}", r.node),
            MODELS[usize::from(r.model) % 3],
            GPUS[usize::from(r.gpus) % GPUS.len()],
            WINDOWS[usize::from(r.window) % WINDOWS.len()],
            ["", "--tp 2", "--max-model-len 65536"][usize::from(r.args) % 3],
        );
        // Known and unknown cache sizes, tiny ones included (approximate bounds each).
        spec.cache_blocks = [None, Some(0), Some(3), Some(64)][usize::from(r.node) % 4];
        self.router.register(self.now, spec);
    }

    fn model(&self, m: u8) -> ModelId {
        MODELS
            .get(usize::from(m))
            .and_then(|name| self.router.model_id(name))
            .unwrap_or(ModelId(77))
    }

    fn eligible(&self, model: ModelId, tokens: u32) -> Vec<WorkerId> {
        self.router
            .fleet()
            .iter()
            .filter(|(id, w)| {
                w.model == model
                    && w.state == WorkerState::Up
                    && w.spec.context_window >= tokens
                    && w.in_flight < self.router.cap(*id).unwrap()
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// The error the router must give when nothing is eligible.
    fn check_error(&self, model: ModelId, tokens: u32, err: &RouteError) {
        let up: Vec<u32> = self
            .router
            .fleet()
            .iter()
            .filter(|(_, w)| w.model == model && w.state == WorkerState::Up)
            .map(|(_, w)| w.spec.context_window)
            .collect();
        let known = self.router.fleet().iter().any(|(_, w)| w.model == model);
        // Every registered, not removed, worker of the model, connected or not.
        let registered: Vec<u32> = self
            .router
            .fleet()
            .iter()
            .filter(|(_, w)| w.model == model && w.state != WorkerState::Removed)
            .map(|(_, w)| w.spec.context_window)
            .collect();
        match err {
            RouteError::NoWorkerForModel => assert!(!known),
            RouteError::NoHealthyWorker { .. } => assert!(
                known
                    && (up.is_empty()
                        || (up.iter().all(|w| *w < tokens)
                            && registered.iter().any(|w| *w >= tokens)))
            ),
            RouteError::PromptTooLong {
                tokens: t,
                largest_window,
            } => {
                assert_eq!(*t, tokens);
                assert_eq!(Some(*largest_window), registered.iter().copied().max());
                assert!(*largest_window < tokens);
            }
            RouteError::AllAtCap { .. } => {
                assert!(up.iter().any(|w| *w >= tokens), "AllAtCap but nothing fits");
            }
            other => panic!("unexpected error {other:?}"),
        }
    }

    fn route(&mut self, model: ModelId, tokens: u32, prefix: &[u64]) {
        let eligible = self.eligible(model, tokens);
        let req = RouteRequest {
            model,
            context_tokens: tokens,
            prefix,
            // Some prompts unknown to the host (0), others up to the context.
            prompt_tokens: tokens / 2,
            session: None,
        };
        let out = self.router.route(self.now, &req, &mut self.rng);
        match &out {
            Ok(d) => {
                assert!(
                    eligible.contains(&d.worker),
                    "{} is not eligible (eligible: {eligible:?})",
                    d.worker
                );
                // The filter hosts ask (`WorkerInfo::accepts`) is the one the router applied.
                assert!(
                    self.router
                        .fleet()
                        .get(d.worker)
                        .unwrap()
                        .accepts(model, tokens)
                );
                assert!(d.believed_cached_blocks as usize <= prefix.len());
                self.in_flight.push((d.worker, self.now, d.charge));
            }
            Err(e) => {
                assert!(eligible.is_empty(), "{e} while {eligible:?} were eligible");
                self.check_error(model, tokens, e);
            }
        }
        self.seen.push(Seen::Route(out));
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Register(ref r) => {
                if self.router.fleet().len() < MAX_WORKERS {
                    self.register(r);
                }
            }
            Op::Route {
                model,
                tokens,
                conv,
                len,
            } => {
                let prefix = if conv == 0 {
                    Vec::new()
                } else {
                    blocks(u64::from(conv), usize::from(len))
                };
                self.route(self.model(model), tokens, &prefix);
            }
            Op::Complete { pick, ttft_ms } => {
                if !self.in_flight.is_empty() {
                    let (id, at, mut charge) = self
                        .in_flight
                        .swap_remove(usize::from(pick) % self.in_flight.len());
                    let first = (at + Duration::from_millis(u64::from(ttft_ms))).min(self.now);
                    let c = Completion {
                        prompt_tokens: 100,
                        output_tokens: 1 + u32::from(pick) % 700,
                        dispatched_at: at,
                        first_token_at: first,
                        completed_at: self.now,
                    };
                    // Sometimes the first token is never reported (a non-streamed answer).
                    if pick % 3 != 0 {
                        self.router.first_token(first, id, &mut charge);
                    }
                    self.router.complete(self.now, id, charge, &c);
                }
            }
            Op::Fail { pick } => {
                if !self.in_flight.is_empty() {
                    let (id, _, mut charge) = self
                        .in_flight
                        .swap_remove(usize::from(pick) % self.in_flight.len());
                    if pick % 2 == 0 {
                        self.router.first_token(self.now, id, &mut charge);
                    }
                    self.router.fail(self.now, id, charge);
                }
            }
            Op::Disconnect(i) => {
                if let Some(id) = self.worker(i) {
                    let _ = self.router.disconnect(self.now, id);
                }
            }
            Op::Reconnect(i) => {
                if let Some(id) = self.worker(i) {
                    let _ = self.router.reconnect(self.now, id);
                }
            }
            Op::Drain(i) => {
                // Draining a disconnected worker is a no-op (regressions.rs).
                if let Some(id) = self.worker(i) {
                    let _ = self.router.drain(self.now, id);
                }
            }
            Op::Restart(i, a) => {
                if let Some(id) = self.worker(i) {
                    let args = ["", "--tp 2", "--max-model-len 65536"][usize::from(a)];
                    let _ = self.router.restart(self.now, id, args);
                }
            }
            Op::Remove(i) => {
                if let Some(id) = self.worker(i) {
                    let _ = self.router.remove(self.now, id);
                }
            }
            Op::Pin(i, v) => {
                if let Some(id) = self.worker(i) {
                    let r = self.router.pin(self.now, id, v);
                    if v.is_finite()
                        && v > 0.0
                        && self.router.fleet().get(id).unwrap().state != WorkerState::Removed
                    {
                        assert!(r.is_ok(), "pin {v}: {r:?}");
                    } else {
                        assert!(r.is_err(), "pin {v} accepted");
                    }
                }
            }
            Op::Unpin(i) => {
                if let Some(id) = self.worker(i) {
                    let _ = self.router.unpin(self.now, id);
                }
            }
            Op::Reprobe(i) => {
                if let Some(id) = self.worker(i) {
                    let _ = self.router.reprobe(self.now, id);
                }
            }
            Op::Poll => {
                let mut out = Vec::new();
                self.router.poll_probes(self.now, &mut out);
                for o in &out {
                    assert!(o.concurrency > 0 && o.output_tokens > 0);
                    assert!(
                        self.router
                            .fleet()
                            .get(o.worker)
                            .is_some_and(|w| w.is_active())
                    );
                }
                self.orders.extend_from_slice(&out);
                self.seen.push(Seen::Orders(out));
            }
            Op::Answer { pick, kind, tok_s } => {
                if !self.orders.is_empty() {
                    let i = usize::from(pick) % self.orders.len();
                    // Usually consume the order; sometimes answer it twice (a late duplicate).
                    let o = if kind == 7 {
                        self.orders[i]
                    } else {
                        self.orders.swap_remove(i)
                    };
                    let (output_tokens, wall, ok) = match kind {
                        0 => (0, Duration::from_secs(2), true),
                        1 => (2048, Duration::ZERO, true),
                        2 => (u64::MAX, Duration::from_nanos(1), true),
                        3 => (u64::MAX, Duration::from_secs(2), true),
                        4 => (2048, Duration::from_secs(2), false),
                        _ => {
                            let secs = if tok_s.is_finite() && tok_s > 0.0 {
                                (2048.0 / tok_s).min(1e9)
                            } else {
                                1.0
                            };
                            (2048, Duration::from_secs_f64(secs), true)
                        }
                    };
                    let r = ProbeResult {
                        order: o.id,
                        worker: o.worker,
                        output_tokens,
                        prompt_tokens: 0,
                        wall,
                        ok,
                    };
                    self.router.probe_result(self.now, &r);
                }
            }
            Op::TrueCapacity(i, v) => {
                if let Some(id) = self.worker(i) {
                    self.router.set_true_capacity(self.now, id, v);
                }
            }
            Op::NodeManagerRestart(n, keep) => {
                self.router
                    .node_manager_restart(self.now, &format!("node{n}"), keep);
            }
            Op::Tick(dt) => {
                self.now = self.now + Duration::from_nanos(dt);
                self.router.tick(self.now);
            }
            Op::Queue { model, tokens } => {
                let m = self.model(model);
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                self.router.enqueue(
                    ticket,
                    &RouteRequest {
                        model: m,
                        context_tokens: tokens,
                        prefix: &[],
                        prompt_tokens: tokens,
                        session: None,
                    },
                );
                let eligible: Vec<(u64, ModelId, u32)> = Vec::new();
                let _ = eligible;
                let out = self.router.dispatch_queued(self.now, &mut self.rng);
                if let Some((_, Ok(d))) = &out {
                    assert_eq!(
                        self.router.fleet().get(d.worker).unwrap().state,
                        WorkerState::Up
                    );
                    self.in_flight.push((d.worker, self.now, d.charge));
                }
                self.seen.push(Seen::Queued(out));
            }
        }
    }

    /// The router's token counters equal the charges the host holds, worker by worker.
    fn check_signals(&self) {
        for (id, _) in self.router.fleet().iter() {
            let held = self.in_flight.iter().filter(|(w, ..)| *w == id);
            let tokens: u64 = held.clone().map(|(.., c)| u64::from(c.tokens)).sum();
            let uncached: u64 = held.map(|(.., c)| u64::from(c.uncached)).sum();
            let s = self.router.signals(id).unwrap();
            assert_eq!(
                (s.tokens_in_flight, s.uncached_in_flight),
                (tokens, uncached),
                "{id}"
            );
        }
    }

    /// Under `approximate` no worker is believed to hold more blocks than its cache.
    fn check_knowledge(&self) {
        let index = self.router.prefix_index();
        for (id, info) in self.router.fleet().iter() {
            if let Some(bound) = index.bound_of(id) {
                assert_eq!(Some(bound), info.spec.cache_blocks.map(u64::from), "{id}");
                assert!(
                    index.blocks_of(id) as u64 <= bound,
                    "{id}: {}",
                    index.blocks_of(id)
                );
            }
        }
    }

    fn check_weights(&self) {
        let cfg = self.router.config();
        for (id, info) in self.router.fleet().iter() {
            let w = self.router.weight(id).unwrap();
            assert!(w.value.is_finite() && w.value > 0.0, "{id}: {w:?}");
            let clamp = match &cfg.weights {
                WeightsConfig::Probe(p) => Some(p.clamp),
                WeightsConfig::Oracle(c) => Some(*c),
                WeightsConfig::AtLoad(a) => Some(a.clamp),
                WeightsConfig::Live(l) => Some(l.clamp),
                _ => None,
            };
            if let Some(c) = clamp {
                match w.provenance {
                    Provenance::Default => assert_eq!(w.value, 1.0, "{id}: {w:?}"),
                    // live keeps the table's registration figure until its first re-derivation
                    Provenance::Table if matches!(cfg.weights, WeightsConfig::Live(_)) => {}
                    _ => assert!(
                        w.value >= c.min && w.value <= c.max,
                        "{id}: {w:?} outside {c:?} ({})",
                        cfg.weights.name()
                    ),
                }
            }
            if matches!(cfg.weights, WeightsConfig::Equal) {
                assert_eq!(w, routelab_policies::Weight::UNMEASURED);
            }
            if info.state == WorkerState::Removed {
                continue; // never routed again; its weight is of no consequence
            }
            let cap = self.router.cap(id).unwrap();
            let want = match cfg.cap {
                Cap::None => u32::MAX,
                Cap::Flat(n) => n,
                Cap::Weighted(n) => ((f64::from(n) * w.value).round() as u32).max(1),
            };
            assert_eq!(
                cap, want,
                "{id} ({:?}): cap {cap} with weight {w:?}",
                info.state
            );
        }
    }
}

fn run(policy: &PolicyConfig, fleet: &[Reg], ops: &[Op], seed: u64) -> Vec<Seen> {
    let mut sim = Sim {
        router: Router::new(policy.clone()),
        rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        now: Time::from_nanos(1),
        in_flight: Vec::new(),
        orders: Vec::new(),
        seen: Vec::new(),
        next_ticket: 0,
    };
    for r in fleet {
        sim.register(r);
    }
    sim.check_weights();
    for op in ops {
        sim.apply(op);
        sim.check_weights();
        // In-flight as the router counts it never diverges from the host's.
        for (id, info) in sim.router.fleet().iter() {
            let host = sim.in_flight.iter().filter(|(w, ..)| *w == id).count() as u32;
            assert_eq!(info.in_flight, host, "{id}");
        }
        sim.check_signals();
        sim.check_knowledge();
    }
    // Every request completes or fails, in any order: the counters return to exactly 0.
    while let Some((id, _, charge)) = sim.in_flight.pop() {
        if sim.in_flight.len().is_multiple_of(2) {
            sim.router.fail(sim.now, id, charge);
        } else {
            let c = Completion {
                prompt_tokens: 100,
                output_tokens: 1,
                dispatched_at: sim.now,
                first_token_at: sim.now,
                completed_at: sim.now,
            };
            sim.router.complete(sim.now, id, charge, &c);
        }
        sim.check_signals();
        sim.check_knowledge();
    }
    for (id, _) in sim.router.fleet().iter() {
        let s = sim.router.signals(id).unwrap();
        assert_eq!((s.tokens_in_flight, s.uncached_in_flight), (0, 0), "{id}");
    }
    sim.seen
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Shrunk failures are printed; no regression files outside this directory.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn routing_and_weight_invariants(
        policy in any_policy(),
        fleet in proptest::collection::vec(any_reg(), 1..=MAX_WORKERS),
        ops in proptest::collection::vec(any_op(), 1..150),
        seed in any::<u64>(),
    ) {
        let first = run(&policy, &fleet, &ops, seed);
        let second = run(&policy, &fleet, &ops, seed);
        prop_assert_eq!(first, second);
    }
}
