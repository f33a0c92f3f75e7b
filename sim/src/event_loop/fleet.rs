//! The fleet at run time: each worker's engine, its router id once registered, its network
//! and its wake-up, and what the router and the timeline read of the engines (the engine
//! poll, the samples).

use super::replicas::{Replicas, local_in_flight};
use super::setup::SimSetup;
use crate::results::{RunMetrics, TimelineRow};
use crate::worker::Engine;
use routelab_policies::streams::{ENGINE_STREAM, derive_seed};
use routelab_policies::{EngineReport, ModelId, Provenance, Time, WorkerId};

/// One worker at run time.
pub(super) struct WorkerRt {
    pub(super) engine: Engine,
    /// Its id at the router, once registered.
    pub(super) id: Option<WorkerId>,
    /// Half the network round trip, ns.
    pub(super) rtt_half: u64,
    pub(super) up: bool,
    /// Launch arguments of a restart, for its re-registration.
    pub(super) pending_args: Option<String>,
    /// Identifies the live wake-up event; older ones in the queue are stale.
    pub(super) wake_token: u64,
    /// Time of the live wake-up event, if one is queued.
    pub(super) wake_at: Option<Time>,
    /// Requests dispatched to it since the last timeline sample.
    pub(super) interval_dispatched: u64,
    /// Output tokens it completed since the last timeline sample.
    pub(super) interval_tokens: u64,
}

/// The workers, by fleet index, and how the router's ids map to them.
pub(super) struct Fleet {
    pub(super) workers: Vec<WorkerRt>,
    /// Fleet index by router worker index.
    by_id: Vec<u32>,
    /// The model every request asks for, known once the first worker registered.
    pub(super) model: Option<ModelId>,
}

impl Fleet {
    /// The setup's workers, each engine on its own RNG stream.
    pub(super) fn new(setup: &SimSetup) -> Fleet {
        let workers = setup
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| WorkerRt {
                engine: Engine::new(
                    w.engine,
                    w.profile.clone(),
                    w.overrides.clone(),
                    derive_seed(setup.seed, ENGINE_STREAM + i as u64),
                ),
                id: None,
                rtt_half: w.rtt_ns / 2,
                up: true,
                pending_args: None,
                wake_token: 0,
                wake_at: None,
                interval_dispatched: 0,
                interval_tokens: 0,
            })
            .collect();
        Fleet {
            workers,
            by_id: Vec::new(),
            model: None,
        }
    }

    /// Worker `worker` by fleet index.
    #[inline]
    pub(super) fn get(&self, worker: u32) -> &WorkerRt {
        &self.workers[worker as usize]
    }

    /// Worker `worker` by fleet index, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, worker: u32) -> &mut WorkerRt {
        &mut self.workers[worker as usize]
    }

    /// The fleet index of the worker the router knows as `id`.
    #[inline]
    pub(super) fn index_of(&self, id: WorkerId) -> u32 {
        self.by_id[id.index()]
    }

    /// The fleet index of the worker at router index `i` (a router id's [`WorkerId::index`]).
    #[inline]
    pub(super) fn at_router_index(&self, i: usize) -> u32 {
        self.by_id[i]
    }

    /// Worker `worker` registered as `id`.
    pub(super) fn bind(&mut self, worker: u32, id: WorkerId) {
        self.workers[worker as usize].id = Some(id);
        if self.by_id.len() <= id.index() {
            self.by_id.resize(id.index() + 1, 0);
        }
        self.by_id[id.index()] = worker;
    }

    /// Hand every replica's router each connected engine's figures, as a real router's poller
    /// would read them from the engine's metrics endpoint.
    pub(super) fn poll_engines(&self, now: Time, replicas: &mut Replicas) {
        let now_ns = now.as_nanos();
        for w in &self.workers {
            let Some(id) = w.id else { continue };
            if !w.up || !w.engine.is_up(now_ns) {
                continue;
            }
            let e = &w.engine;
            let kv_capacity = e.kv_capacity_tokens().max(1) as f64;
            // what the engine's metrics endpoint shows: KV as allocated, not the fluid model's
            // admission reservation
            let kv_tokens = e.kv_allocated_tokens(now_ns);
            let report = EngineReport {
                kv_used_fraction: (kv_tokens as f64 / kv_capacity).min(1.0),
                queued_prompt_tokens: e.waiting_prompt_tokens(),
                running_tokens: kv_tokens,
                generation_tok_s: e.generation_tok_s(),
            };
            for r in replicas.iter_mut() {
                r.router.engine_report(now, id, report);
            }
        }
    }

    /// One timeline row per worker at `now`, and the interval counters started anew.
    pub(super) fn sample(
        &mut self,
        now: Time,
        replicas: &Replicas,
        timeline: &mut Vec<TimelineRow>,
    ) {
        let t_s = now.as_secs_f64();
        let router = replicas.first();
        for (i, w) in self.workers.iter_mut().enumerate() {
            let (in_flight, weight, provenance) = match w.id {
                Some(id) => {
                    // Every replica's requests; the first replica's weight.
                    let in_flight = replicas
                        .iter()
                        .map(|r| local_in_flight(&r.router, id))
                        .sum();
                    let wt = router.weight(id).unwrap_or_default();
                    (in_flight, wt.value, wt.provenance)
                }
                None => (0, 0.0, Provenance::Default),
            };
            timeline.push(TimelineRow {
                t_s,
                worker: i,
                in_flight,
                running: w.engine.running(),
                waiting: w.engine.waiting(),
                weight,
                provenance,
                dispatched: w.interval_dispatched,
                output_tokens: w.interval_tokens,
            });
            w.interval_dispatched = 0;
            w.interval_tokens = 0;
        }
    }

    /// Each replica's final weights, and each worker's by the first replica, to the run's
    /// metrics (a worker never registered keeps weight 1).
    pub(super) fn final_weights(&self, replicas: &Replicas, m: &mut RunMetrics) {
        for (r, totals) in m.replicas.iter_mut().enumerate() {
            let router = &replicas.get(r).router;
            totals.final_weights = self
                .workers
                .iter()
                .map(|w| {
                    w.id.and_then(|id| router.weight(id))
                        .map_or(1.0, |wt| wt.value)
                })
                .collect();
        }
        for (w, totals) in self.workers.iter().zip(&mut m.workers) {
            if let Some(id) = w.id
                && let Some(wt) = replicas.first().weight(id)
            {
                totals.final_weight = wt.value;
                totals.final_provenance = wt.provenance;
            }
        }
    }
}
