//! The gateway's shared state: one [`Router`] behind a `std::sync::Mutex`.
//!
//! **Why one `std::sync::Mutex`**: a routing decision, a completion or a queue dispatch takes
//! well under a microsecond and never awaits, so the lock is held for about as long as an
//! uncontended atomic round trip costs on a busy gateway; an async mutex would add a future
//! and a wake-up per request for nothing, and sharding would split the fleet's view of load.
//! The lock is never held across an `.await`, never held while doing I/O, and every critical
//! section is bounded (the longest is a queue pump, bounded by the queue length).

mod flight;

pub(crate) use flight::{Flight, QueueTicket};

use crate::clock::Clock;
use crate::config::{GatewayConfig, HealthConfig, WorkerConfig, secs};
use crate::error::WorkerError;
use crate::metrics::{GlobalMetrics, WorkerMetrics};
use crate::reqlog::RequestLog;
use crate::upstream::{BaseUrl, HttpClient};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::weights::{PersistedProbeState, ProbeCacheEntry};
use routelab_policies::{
    AdminError, Completion, Decision, InputError, ModelId, RouteError, Router, Time, WorkerId,
    WorkerSpec, WorkerState,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// Settings resolved from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub max_body: usize,
    pub queue_timeout: Duration,
    pub retries: u32,
    pub response_timeout: Duration,
    /// `upstream.stream_idle_timeout_s`, defaulted to the response timeout.
    pub stream_idle_timeout: Duration,
    pub health: HealthConfig,
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub probe_poll: Duration,
    pub probe_timeout: Duration,
    /// `probe.budget_s`, policy time.
    pub probe_budget: Duration,
    pub state_file: Option<PathBuf>,
    pub admin_token: Option<crate::config::Secret>,
    /// The client-facing server's limits (`server.*`).
    pub server: crate::server::Limits,
    /// `capacity.min_observed_s`, policy time.
    pub min_observed: Duration,
    /// The engines' metrics poll (`engine_metrics`).
    pub engine_poll: crate::signals::PollSettings,
    /// `upstream.max_response_bytes`.
    pub max_response_bytes: usize,
    /// The `replicas:` block, resolved (its credentials file read).
    pub replicas: Option<crate::config::ReplicaSettings>,
}

impl Settings {
    pub fn from_config(c: &GatewayConfig) -> Result<Settings, InputError> {
        let secs = |field, v| secs(c.origin(), field, v);
        Ok(Settings {
            max_body: c.max_body_bytes,
            queue_timeout: secs("queue_timeout_s", c.queue_timeout_s)?,
            retries: c.retries,
            response_timeout: secs("upstream.response_timeout_s", c.upstream.response_timeout_s)?,
            stream_idle_timeout: secs(
                "upstream.stream_idle_timeout_s",
                c.upstream
                    .stream_idle_timeout_s
                    .unwrap_or(c.upstream.response_timeout_s),
            )?,
            health: c.health.clone(),
            health_interval: secs("health.interval_s", c.health.interval_s)?,
            health_timeout: secs("health.timeout_s", c.health.timeout_s)?,
            probe_poll: secs("probe.poll_interval_s", c.probe.poll_interval_s)?,
            probe_timeout: secs("probe.request_timeout_s", c.probe.request_timeout_s)?,
            probe_budget: secs("probe.budget_s", c.probe.budget_s)?,
            state_file: c.state_file.clone(),
            admin_token: c.admin_token.clone().filter(|t| !t.expose().is_empty()),
            server: crate::server::Limits {
                header_read_timeout: secs(
                    "server.header_read_timeout_s",
                    c.server.header_read_timeout_s,
                )?,
                body_read_timeout: secs(
                    "server.body_read_timeout_s",
                    c.server.body_read_timeout_s,
                )?,
                max_connections: c
                    .server
                    .max_connections
                    .unwrap_or_else(crate::server::default_max_connections),
                drain_timeout: secs("server.drain_timeout_s", c.server.drain_timeout_s)?,
            },
            min_observed: secs("capacity.min_observed_s", c.capacity.min_observed_s)?,
            engine_poll: c.engine_metrics.settings(
                c.policy
                    .build_in(c.origin(), "policy")?
                    .chooser
                    .engine_poll_interval(),
            ),
            max_response_bytes: c.upstream.max_response_bytes,
            replicas: c
                .replicas
                .as_ref()
                .map(|r| r.settings(c.origin(), &crate::tokens::config_base(c.origin())))
                .transpose()?,
        })
    }
}

/// Everything the handlers and background tasks share.
pub(crate) struct Shared {
    pub settings: Settings,
    pub clock: Clock,
    core: Mutex<Core>,
    pub client: HttpClient,
    pub global: GlobalMetrics,
    /// Client connection counters, kept by the accept loop ([`crate::server`]).
    pub connections: Arc<crate::server::ConnectionStats>,
    /// Serialises state-file writes (snapshot and write happen under it, so the newest
    /// snapshot is always the last one written); holds the durable state this gateway last
    /// wrote (or loaded at start), from which the next write's changes are computed.
    pub persist_lock: tokio::sync::Mutex<PersistedProbeState>,
    /// The request log, when configured.
    pub request_log: Option<Arc<RequestLog>>,
    /// The engines' KV streams, metrics polls and recent history ([`crate::signals`]).
    pub signals: crate::signals::SignalHub,
    /// The configured models' tokenizers ([`crate::tokens`]).
    pub tokenizers: crate::tokens::Tokenizers,
    /// The replicas' bus, with a `replicas:` block ([`crate::replicas`]).
    pub bus: Option<crate::replicas::Bus>,
}

impl Shared {
    pub fn new(
        settings: Settings,
        clock: Clock,
        router: Router,
        seed: u64,
        client: HttpClient,
        request_log: Option<Arc<RequestLog>>,
        written: PersistedProbeState,
    ) -> Shared {
        Shared {
            settings,
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
            }),
            client,
            global: GlobalMetrics::default(),
            connections: Arc::default(),
            persist_lock: tokio::sync::Mutex::new(written),
            request_log,
            signals: Default::default(),
            tokenizers: Default::default(),
            bus: None,
        }
    }

    /// The router and its companions. A panic while holding the lock cannot leave the router
    /// half-updated in a way that matters more than refusing all traffic would, so a poisoned
    /// lock is recovered.
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Passive ejection and active health checks are on only when health checks run (someone
    /// must re-admit an ejected worker).
    pub fn ejection_enabled(&self) -> bool {
        !self.settings.health_interval.is_zero()
    }
}

/// The gateway's own record of a worker, indexed by [`WorkerId`] like the router's fleet.
#[derive(Debug)]
pub(crate) struct WorkerRt {
    pub cfg: WorkerConfig,
    pub base: BaseUrl,
    pub metrics: Arc<WorkerMetrics>,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    /// Disconnected by the gateway's health logic (re-admitted by a successful check).
    pub ejected: bool,
    /// Drained by an administrator (health logic leaves it alone).
    pub drained: bool,
    /// Last measured burst throughput, tok/s.
    pub probe_tok_s: Option<f64>,
    /// Whether that burst was cut at `probe.budget_s` (its throughput counts the tokens
    /// streamed within the budget) rather than completed.
    pub probe_cut_at_budget: bool,
}

/// The gateway's records of the workers, indexed by [`WorkerId`] like the router's fleet. A
/// removed worker's record is dropped (its slot keeps 8 bytes), and a worker removed and added
/// again takes its old slot back ([`Core::add_worker`]), so that adding and removing workers
/// through the admin API does not grow the gateway without bound.
#[derive(Debug, Default)]
pub(crate) struct WorkerTable {
    slots: Vec<Option<Box<WorkerRt>>>,
}

impl WorkerTable {
    /// A worker that is not removed.
    pub fn get(&self, id: WorkerId) -> Option<&WorkerRt> {
        self.slots.get(id.index())?.as_deref()
    }

    /// A worker that is not removed.
    pub fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerRt> {
        self.slots.get_mut(id.index())?.as_deref_mut()
    }

    /// The workers that are not removed, in id order.
    pub fn live(&self) -> impl Iterator<Item = (WorkerId, &WorkerRt)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, w)| Some((WorkerId(i as u32), w.as_deref()?)))
    }

    /// Slots, removed workers' included: the router's fleet size.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    fn put(&mut self, id: WorkerId, w: WorkerRt) {
        if id.index() == self.slots.len() {
            self.slots.push(Some(Box::new(w)));
        } else {
            self.slots[id.index()] = Some(Box::new(w));
        }
    }

    fn take(&mut self, id: WorkerId) -> Option<Box<WorkerRt>> {
        self.slots.get_mut(id.index())?.take()
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
}

/// What a failure says about a worker, for the health logic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A request failed on it; `hard`: its connection could not be made. Ejections by
    /// requests are capped (`health.max_ejection_percent`): one bad request retried across the
    /// fleet must not take the fleet out.
    Request { hard: bool },
    /// An active health check failed; `hard`: its connection could not be made.
    Check { hard: bool },
}

impl Failure {
    fn hard(self) -> bool {
        match self {
            Failure::Request { hard } | Failure::Check { hard } => hard,
        }
    }
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
    pub fn add_worker(
        &mut self,
        now: Time,
        cfg: WorkerConfig,
        s: &Shared,
    ) -> Result<WorkerId, WorkerError> {
        cfg.validate()?;
        if self.by_name.contains_key(&cfg.name) {
            return Err(WorkerError::Duplicate(cfg.name));
        }
        let base = BaseUrl::parse(&cfg.base_url).map_err(|error| WorkerError::BaseUrl {
            name: cfg.name.clone(),
            error,
        })?;
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
        self.apply_health(now, id, s);
        self.pump(now);
        Ok(id)
    }

    /// Deregister a worker.
    pub fn remove_worker(&mut self, now: Time, id: WorkerId, s: &Shared) {
        if self.router.remove(now, id).is_ok()
            && let Some(w) = self.workers.take(id)
        {
            self.by_name.remove(&w.cfg.name);
            self.removed.insert(w.cfg.name.clone(), id);
            // Its polled report described the removed engine, not one added again in its slot.
            self.router.forget_engine_report(now, id);
            self.apply_health(now, id, s);
        }
    }

    /// The workers of `model` the health logic judges: not removed, not drained.
    fn pool(&self, model: ModelId) -> impl Iterator<Item = (WorkerId, &WorkerRt)> {
        self.workers.live().filter(move |(i, w)| {
            !w.drained
                && self
                    .router
                    .fleet()
                    .get(*i)
                    .is_some_and(|f| f.model == model)
        })
    }

    /// How many workers `model`'s pool has ([`Core::pool`]), and how many of them are ejected.
    fn pool_of(&self, model: ModelId) -> (usize, usize) {
        self.pool(model).fold((0, 0), |(n, out), (_, w)| {
            (n + 1, out + usize::from(w.ejected))
        })
    }

    /// Whether failing requests may eject one more of `model`'s workers: at most
    /// `health.max_ejection_percent` of them are ejected at once, and always at least one may
    /// be (Envoy's `max_ejection_percent`).
    fn may_eject_another(&self, model: ModelId, s: &Shared) -> bool {
        let (n, out) = self.pool_of(model);
        out == 0 || (out + 1) as f64 * 100.0 <= s.settings.health.max_ejection_percent * n as f64
    }

    /// Make `id`'s model routable as its workers' health says: an ejected worker is not
    /// routed to, unless fewer than `health.panic_threshold_percent` of the model's workers
    /// (not drained) are healthy; then the model is in panic mode and every worker gets
    /// requests again, ejected or not (Envoy's panic mode: better to try a worker that may be
    /// sick than to refuse everything, e.g. when the health checks themselves are wrong).
    /// Health checks go on meanwhile, and re-admissions bring the model out of it.
    pub fn apply_health(&mut self, now: Time, id: WorkerId, s: &Shared) {
        let Some(model) = self.router.fleet().get(id).map(|w| w.model) else {
            return;
        };
        let (n, out) = self.pool_of(model);
        let threshold = s.settings.health.panic_threshold_percent;
        let panic = n > 0 && ((n - out) as f64) * 100.0 < threshold * n as f64;
        let was = self.panicking.contains(&model);
        if panic != was {
            if panic {
                self.panicking.insert(model);
            } else {
                self.panicking.remove(&model);
            }
            let name = self
                .router
                .model_name(model)
                .unwrap_or_default()
                .to_string();
            crate::log(
                if panic {
                    "panic_mode_entered"
                } else {
                    "panic_mode_left"
                },
                &[
                    ("model", &name),
                    ("healthy", &(n - out).to_string()),
                    ("workers", &n.to_string()),
                ],
            );
        }
        let ids: Vec<(WorkerId, bool)> = self
            .pool(model)
            .map(|(i, w)| (i, !w.ejected || panic))
            .collect();
        let mut reopened = false;
        for (i, routable) in ids {
            let state = self.router.fleet().get(i).map(|f| f.state);
            if routable && state == Some(WorkerState::Disconnected) {
                reopened |= self.router.reconnect(now, i).is_ok();
            } else if !routable && state == Some(WorkerState::Up) {
                let _ = self.router.disconnect(now, i);
            }
        }
        if reopened {
            self.pump(now);
        }
    }

    /// The models in panic mode.
    pub fn panicking(&self, model: ModelId) -> bool {
        self.panicking.contains(&model)
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

    /// Re-admit a worker an administrator drained; false if it was not drained. A draining
    /// worker is routable again at once (the router treats it as reconnected with the same
    /// engine, keeping a fresh measurement); one the health logic ejected meanwhile is left to
    /// the health checks, which look at it again from now on.
    pub fn undrain(&mut self, now: Time, id: WorkerId, s: &Shared) -> bool {
        let Some(w) = self.workers.get_mut(id) else {
            return false;
        };
        if !w.drained {
            return false;
        }
        w.drained = false;
        let draining = self
            .router
            .fleet()
            .get(id)
            .is_some_and(|i| i.state == WorkerState::Draining);
        if draining && self.router.reconnect(now, id).is_ok() {
            self.pump(now);
        }
        self.apply_health(now, id, s);
        true
    }

    /// A request or check against the worker failed; eject it after enough in a row (at once
    /// for a hard failure such as a refused connection), within the ejection cap for failing
    /// requests. True if it was ejected now.
    pub fn note_failure(&mut self, now: Time, id: WorkerId, failure: Failure, s: &Shared) -> bool {
        let unhealthy_after = s.settings.health.unhealthy_after.max(1);
        let Some(model) = self.router.fleet().get(id).map(|f| f.model) else {
            return false;
        };
        let capped =
            matches!(failure, Failure::Request { .. }) && !self.may_eject_another(model, s);
        let Some(w) = self.workers.get_mut(id) else {
            return false;
        };
        w.consecutive_successes = 0;
        w.consecutive_failures = w.consecutive_failures.saturating_add(1);
        if !s.ejection_enabled()
            || w.ejected
            || w.drained
            || !(failure.hard() || w.consecutive_failures >= unhealthy_after)
        {
            return false;
        }
        if capped {
            crate::log(
                "ejection_capped",
                &[
                    ("worker", &w.cfg.name),
                    ("failures", &w.consecutive_failures.to_string()),
                    (
                        "max_ejection_percent",
                        &s.settings.health.max_ejection_percent.to_string(),
                    ),
                ],
            );
            return false;
        }
        w.ejected = true;
        crate::log(
            "worker_ejected",
            &[
                ("worker", &w.cfg.name),
                ("failures", &w.consecutive_failures.to_string()),
            ],
        );
        self.apply_health(now, id, s);
        true
    }

    /// A request or check against the worker succeeded; re-admit an ejected worker after
    /// enough successful checks in a row (`check`: an active health check).
    pub fn note_success(&mut self, now: Time, id: WorkerId, check: bool, s: &Shared) {
        let healthy_after = s.settings.health.healthy_after.max(1);
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        w.consecutive_failures = 0;
        if !(check && w.ejected) {
            return;
        }
        w.consecutive_successes = w.consecutive_successes.saturating_add(1);
        if w.consecutive_successes >= healthy_after {
            w.ejected = false;
            w.consecutive_successes = 0;
            crate::log("worker_readmitted", &[("worker", &w.cfg.name)]);
            self.apply_health(now, id, s);
        }
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
