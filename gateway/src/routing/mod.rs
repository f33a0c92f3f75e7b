//! The router core, at the bottom of the gateway's floor plan: the policy crate's [`Router`],
//! the randomness it draws from, the gateway's table of workers and the queue's waiters, behind
//! one `std::sync::Mutex`, with the clock the router reads ([`Routing`]). Every feature above
//! reads and changes the router through it; it knows none of them.
//!
//! **Why one `std::sync::Mutex`**: a routing decision, a completion or a queue dispatch takes
//! well under a microsecond and never awaits, so the lock is held for about as long as an
//! uncontended atomic round trip costs on a busy gateway; an async mutex would add a future
//! and a wake-up per request for nothing, and sharding would split the fleet's view of load.
//! The lock is never held across an `.await`, never held while doing I/O, and every critical
//! section is bounded (the longest is a queue pump, bounded by the queue length).
//!
//! `health.rs` is the health rule that makes workers routable or not; `table.rs` the
//! gateway's own record of each worker.

mod health;
mod table;

pub(crate) use health::{Failure, HealthRule};
pub(crate) use table::{WorkerRt, WorkerTable};

use crate::clock::Clock;
use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::metrics::registry::WorkerMetrics;
use crate::upstream::BaseUrl;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::weights::{PersistedProbeState, ProbeCacheEntry};
use routelab_policies::{
    AdminError, Completion, Decision, ModelId, RouteError, Router, Time, WorkerId, WorkerSpec,
    WorkerState,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The router core as a handler's whole state (axum's `State<RouterCore>`): a handler that
/// reads nothing else is handed nothing else.
#[derive(Clone)]
pub(crate) struct RouterCore(pub Arc<Routing>);

/// The router core: the [`Core`] behind its lock, and the clock the router reads.
pub(crate) struct Routing {
    pub clock: Clock,
    core: Mutex<Core>,
}

impl Routing {
    /// `router` with its randomness seeded from `seed`, no workers yet, and the health rule.
    pub fn new(clock: Clock, router: Router, seed: u64, health: HealthRule) -> Routing {
        Routing {
            clock,
            core: Mutex::new(Core {
                router,
                rng: Xoshiro256PlusPlus::seed_from_u64(seed),
                workers: WorkerTable::default(),
                by_name: HashMap::new(),
                removed: HashMap::new(),
                panicking: HashSet::new(),
                waiters: HashMap::new(),
                next_ticket: 1,
                health,
            }),
        }
    }

    /// The router and its companions. A panic while holding the lock cannot leave the router
    /// half-updated in a way that matters more than refusing all traffic would, so a poisoned
    /// lock is recovered.
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The router and what must change with it atomically.
pub(crate) struct Core {
    pub router: Router,
    pub rng: Xoshiro256PlusPlus,
    pub workers: WorkerTable,
    pub by_name: HashMap<String, WorkerId>,
    /// Removed workers by name: re-added with the same engine, a worker takes its slot back.
    removed: HashMap<String, WorkerId>,
    /// Models in panic mode ([`Core::apply_health`]).
    panicking: HashSet<ModelId>,
    waiters: HashMap<u64, oneshot::Sender<Result<Decision, RouteError>>>,
    next_ticket: u64,
    /// When a worker is ejected and re-admitted ([`HealthRule`]).
    health: HealthRule,
}

/// Every name [`state_name`] gives a worker the gateway still lists (removed ones are not
/// listed), so a metric can have one series per state whatever the current one is.
pub(crate) const STATE_NAMES: &[&str] = &["up", "draining", "disconnected"];

/// Router state as a name.
pub(crate) fn state_name(s: WorkerState) -> &'static str {
    match s {
        WorkerState::Up => "up",
        WorkerState::Draining => "draining",
        WorkerState::Disconnected => "disconnected",
        WorkerState::Removed => "removed",
        _ => "unknown",
    }
}

impl Core {
    /// Register a worker (names are unique among workers not removed). A worker removed
    /// earlier and added again with the same engine (its spec equal but for the launch
    /// arguments) takes its old slot back, as a restarted engine ([`Router::revive`]).
    pub fn add_worker(&mut self, now: Time, cfg: WorkerConfig) -> Result<WorkerId, WorkerError> {
        cfg.validate()?;
        if self.by_name.contains_key(&cfg.name) {
            return Err(WorkerError::Duplicate(cfg.name));
        }
        let base = BaseUrl::parse(&cfg.base_url)
            .map_err(|error| WorkerError::BaseUrl {
                name: cfg.name.clone(),
                error,
            })?
            .with_key(cfg.api_key.clone());
        let spec = cfg.spec();
        let revived = self.removed.get(&cfg.name).copied().filter(|&id| {
            self.router.fleet().get(id).is_some_and(|w| {
                WorkerSpec {
                    launch_args: spec.launch_args.clone(),
                    ..w.spec.clone()
                } == spec
            }) && self.router.revive(now, id, &spec.launch_args).is_ok()
        });
        let id = match revived {
            Some(id) => {
                self.removed.remove(&cfg.name);
                id
            }
            None => {
                let id = self.router.register(now, spec.clone());
                debug_assert_eq!(id.index(), self.workers.slots());
                id
            }
        };
        self.by_name.insert(cfg.name.clone(), id);
        // A cached measurement adopted at registration counts as the last probe.
        let probe_tok_s = self
            .router
            .strategy()
            .export_state()
            .and_then(|st| cached_measurement(&st, &spec).map(|e| e.throughput_tok_s));
        self.workers.put(
            id,
            WorkerRt {
                cfg,
                endpoints: WorkerRt::endpoints_of(&base),
                base,
                metrics: Arc::new(WorkerMetrics::default()),
                consecutive_failures: 0,
                consecutive_successes: 0,
                ejected: false,
                drained: false,
                probe_tok_s,
                probe_cut_at_budget: false,
            },
        );
        self.apply_health(now, id);
        self.pump(now);
        Ok(id)
    }

    /// Deregister a worker.
    pub fn remove_worker(&mut self, now: Time, id: WorkerId) {
        if self.router.remove(now, id).is_ok()
            && let Some(w) = self.workers.take(id)
        {
            self.by_name.remove(&w.cfg.name);
            self.removed.insert(w.cfg.name.clone(), id);
            // Its polled report described the removed engine, not one added again in its slot.
            self.router.forget_engine_report(now, id);
            self.apply_health(now, id);
        }
    }

    /// A live worker by name.
    pub fn lookup(&self, name: &str) -> Option<WorkerId> {
        self.by_name.get(name).copied()
    }

    /// Free a request's slot and hand it to the queue.
    pub fn release(
        &mut self,
        now: Time,
        id: WorkerId,
        charge: routelab_policies::Charge,
        completion: Option<&Completion>,
    ) {
        match completion {
            Some(c) => self.router.complete(now, id, charge, c),
            None => self.router.fail(now, id, charge),
        }
        self.pump(now);
    }

    /// Dispatch queued requests while workers have room.
    pub fn pump(&mut self, now: Time) {
        // Bounded: each iteration removes one queued request.
        while let Some((ticket, outcome)) = self.router.dispatch_queued(now, &mut self.rng) {
            let undelivered = match self.waiters.remove(&ticket) {
                Some(tx) => tx.send(outcome).err(),
                None => Some(outcome),
            };
            // Nobody is waiting any more: give the slot back.
            if let Some(Ok(d)) = undelivered {
                self.router.fail(now, d.worker, d.charge);
            }
        }
    }

    /// Queue a request that found every worker at its cap.
    pub fn enqueue(
        &mut self,
        req: &routelab_policies::RouteRequest<'_>,
    ) -> (u64, oneshot::Receiver<Result<Decision, RouteError>>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.router.enqueue(ticket, req);
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(ticket, tx);
        (ticket, rx)
    }

    /// Take a request out of the queue; false if it was already dispatched.
    pub fn cancel(&mut self, ticket: u64) -> bool {
        self.waiters.remove(&ticket);
        self.router.cancel(ticket)
    }

    /// The worker's pin, if it has one (pins are keyed by node and model, so workers sharing
    /// both share a pin).
    pub fn pin_of(&self, id: WorkerId) -> Option<f64> {
        let spec = &self.router.fleet().get(id)?.spec;
        self.router
            .strategy()
            .export_state()?
            .pins
            .into_iter()
            .find(|p| p.node == spec.node && p.model == spec.model)
            .map(|p| p.weight)
    }

    /// Pin the worker's weight (`Some`) or clear its pin (`None`), then serve the queue (the
    /// weight may change the worker's cap).
    pub fn set_pin(&mut self, now: Time, id: WorkerId, pin: Option<f64>) -> Result<(), AdminError> {
        match pin {
            Some(weight) => self.router.pin(now, id, weight)?,
            None => self.router.unpin(now, id)?,
        }
        self.pump(now);
        Ok(())
    }
}

/// The probe cache's entry for a worker: its node, model and launch arguments (a change of
/// launch arguments is a new machine for the cache).
pub(crate) fn cached_measurement<'a>(
    state: &'a PersistedProbeState,
    spec: &WorkerSpec,
) -> Option<&'a ProbeCacheEntry> {
    state
        .cache
        .iter()
        .find(|e| e.node == spec.node && e.model == spec.model && e.launch_args == spec.launch_args)
}

#[cfg(test)]
mod state_name_tests {
    use super::*;

    #[test]
    fn every_listed_state_has_its_one_hot_series() {
        for st in [
            WorkerState::Up,
            WorkerState::Draining,
            WorkerState::Disconnected,
        ] {
            assert!(STATE_NAMES.contains(&state_name(st)), "{st:?}");
        }
    }
}
