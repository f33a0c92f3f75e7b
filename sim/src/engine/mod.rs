//! The event engine: a fleet of [`Engine`]s (fluid or step-level) behind one [`Router`], fed by a traffic
//! source, with probes, lifecycle events and metrics.
//!
//! The engine is split by concern:
//! - [`queue`]: the event queue — integer [`Time`], then a sequence number, so equal-time
//!   events run in the order they were caused, never in hash-map or thread order;
//! - this module: the run's state ([`Sim`]) and the loop that pops events and hands them out;
//! - `requests`: a customer request's life — arrival, routing, the gateway queue, network
//!   round trips, first token, completion, failure and retry;
//! - `probes`: probe orders of the router served as real traffic on the engines;
//! - `kv`: the engines' KV events delivered to a router that mirrors them, and the overlap
//!   regret of each routing decision;
//! - [`replicas`]: several gateway replicas behind an L4 balancer (the scenario's
//!   `gateways:`), what they share and how requests are split among them;
//! - `lifecycle`: registration and the scenario's lifecycle events (restarts, crashes, pins…),
//!   where a call the router refuses becomes a [`RunWarning`](crate::record::RunWarning);
//! - [`setup`]: what a run is given ([`SimSetup`], [`WorkerSetup`], [`LifecycleEvent`]).
//!
//! What a run measured is counted by the shared [`Recorder`] (see [`crate::record`]), the same
//! code the emulator's real-time player uses. Each worker has at most one wake-up event queued:
//! one that moves earlier replaces the queued one in place (the queue's slots), and the
//! replaced ones are only counted (`Superseded`), as the stale events they used to be.

mod kv;
mod lifecycle;
mod probes;
pub(crate) mod queue;
pub mod replicas;
mod requests;
pub mod setup;
mod weight_error;

pub use replicas::{Gateways, MAX_REPLICAS, Share, Split};
pub use setup::{Action, LifecycleEvent, NO_TIME_LIMIT_NS, SimError, SimSetup, WorkerSetup};
// The result types moved out of the engine (they are shared with the real-time player); their
// former paths under `engine` stay valid.
pub use crate::record::{RequestRecord, RequestSink, Slo};
pub use crate::results::{ReplicaTotals, RunMetrics, TimelineRow, WorkerTotals};

use crate::record::Recorder;
use crate::traffic::TrafficSource;
use crate::worker::{Engine, EngineOutput};
use probes::ProbeRun;
use queue::EventQueue;
use replicas::{Balancer, Replica};
use requests::Req;
use routelab_policies::streams::{ENGINE_STREAM, derive_seed};
use routelab_policies::{
    EngineReport, PolicyConfig, ProbeOrder, Provenance, Router, Time, WorkerId,
};
use weight_error::WeightErrorTracker;

/// Run one policy over one traffic source on one fleet.
///
/// Deterministic: the same setup, policy, traffic and seed give the same metrics and the same
/// request rows, on any machine and thread count.
pub fn run(
    setup: &SimSetup,
    policy: &PolicyConfig,
    traffic: &mut dyn TrafficSource,
    mut sink: Option<&mut dyn RequestSink>,
) -> Result<RunMetrics, SimError> {
    let mut sim = Sim::new(setup, policy)?;
    sim.run(traffic, &mut sink)?;
    let mut metrics = sim.finish();
    metrics.skipped_rows = traffic.skipped();
    metrics.traffic_warnings = traffic.warnings();
    Ok(metrics)
}

/// Where per-request rows go (if anywhere) during a run.
type Sink<'s, 'r> = &'s mut Option<&'r mut dyn RequestSink>;

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A request reaches the gateway.
    Arrive { req: u32, epoch: u32 },
    /// A request reaches its worker.
    Admit { req: u32, epoch: u32 },
    /// The host sees a request's first token.
    FirstToken { req: u32, epoch: u32 },
    /// The host sees a request's last token.
    Done { req: u32, epoch: u32 },
    /// A worker's engine has something to report.
    Wake { worker: u32, token: u64 },
    /// A worker registers (or re-registers after a restart).
    Register { worker: u32 },
    /// A scenario lifecycle event.
    Lifecycle { index: u32 },
    /// Router tick.
    Tick,
    /// The router polls its engines (only for policies that read engine reports).
    EnginePoll,
    /// Timeline sample.
    Sample,
    /// A batch of a worker's KV events reaches the router (index into the run's batches).
    KvEvents { worker: u32, batch: u32 },
    /// The gateway replicas exchange their in-flight counts (`share: probes-and-load`).
    SyncLoad,
}

/// The wake-ups [`Sim::reschedule`] replaced in the queue. The event loop used to leave them
/// queued, to pop when due as stale events (counted, moving the clock, doing nothing else);
/// the queue then held about one stale wake-up per admission. Keeping their count and the
/// latest of their times gives the same event count and end of run.
#[derive(Debug, Default)]
struct Superseded {
    /// Replaced wake-ups due within the run's time limit.
    count: u64,
    /// The latest of their times.
    last: Time,
}

impl Superseded {
    /// A wake-up due at `at` was replaced; it counts if due by `stop_ns` (the loop pops every
    /// event due by then).
    fn note(&mut self, at: Time, stop_ns: u64) {
        if at.as_nanos() <= stop_ns {
            self.count += 1;
            self.last = self.last.max(at);
        }
    }
}

/// One worker at run time.
struct WorkerRt {
    engine: Engine,
    /// Its id at the router, once registered.
    id: Option<WorkerId>,
    /// Half the network round trip, ns.
    rtt_half: u64,
    up: bool,
    pending_args: Option<String>,
    /// Identifies the live wake-up event; older ones in the queue are stale.
    wake_token: u64,
    /// Time of the live wake-up event, if one is queued.
    wake_at: Option<Time>,
    interval_dispatched: u64,
    interval_tokens: u64,
}

/// The state of one run.
struct Sim<'a> {
    setup: &'a SimSetup,
    /// The gateway replicas (one without a `gateways:` block), each a router with its RNG.
    replicas: Vec<Replica>,
    /// The L4 balancer in front of them.
    balancer: Balancer,
    /// Name of the policy's weight strategy (for warnings).
    weights: &'static str,
    model: Option<routelab_policies::ModelId>,
    workers: Vec<WorkerRt>,
    /// Fleet index by router worker index.
    by_id: Vec<u32>,
    queue: EventQueue<Ev>,
    now: Time,
    /// Request slots (customers and probe requests), reused through `free`.
    reqs: Vec<Req>,
    free: Vec<u32>,
    /// Customer requests allocated and not yet finished.
    alive: u64,
    /// An open-loop arrival is read ahead and scheduled.
    open_pending: bool,
    /// Registrations and lifecycle events still to come.
    pending_lifecycle: u64,
    probes: Vec<ProbeRun>,
    /// Bursts in flight that another replica's order may join (shared probe results only).
    running: Vec<u32>,
    orders: Vec<ProbeOrder>,
    outputs: Vec<EngineOutput>,
    next_id: u64,
    events: u64,
    /// Wake-ups replaced in the queue before they were due (see [`Sim::reschedule`]).
    superseded: Superseded,
    rec: Recorder,
    /// The weight error's running integral.
    werr: WeightErrorTracker,
    /// The engines' KV events on their way to the router (only when the policy reads them).
    kv: kv::KvDelivery,
}

impl<'a> Sim<'a> {
    fn new(setup: &'a SimSetup, policy: &PolicyConfig) -> Result<Self, SimError> {
        if setup.workers.is_empty() {
            return Err(SimError::Setup("the fleet has no workers".into()));
        }
        let mut workers: Vec<WorkerRt> = setup
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let engine = Engine::new(
                    w.engine,
                    w.profile.clone(),
                    w.overrides.clone(),
                    derive_seed(setup.seed, ENGINE_STREAM + i as u64),
                );
                WorkerRt {
                    engine,
                    id: None,
                    rtt_half: w.rtt_ns / 2,
                    up: true,
                    pending_args: None,
                    wake_token: 0,
                    wake_at: None,
                    interval_dispatched: 0,
                    interval_tokens: 0,
                }
            })
            .collect();
        let totals = setup
            .workers
            .iter()
            .map(|w| WorkerTotals::new(w.spec.name.clone()))
            .collect();
        let n = setup.gateways.replicas.max(1);
        let replicas: Vec<Replica> = (0..n)
            .map(|r| {
                let mut router = Router::new(policy.clone());
                // A chooser that predicts latency aims at the scenario's SLO unless its own
                // bounds are set (others ignore it).
                router.aim_at(setup.slo.ttft_s, setup.slo.tpot_s);
                Replica::new(router, setup.seed, r)
            })
            .collect();
        let kv = kv::KvDelivery::new(replicas[0].router.kv_event_delay());
        if kv.enabled() {
            for w in &mut workers {
                w.engine.publish_kv_events(true);
            }
        }
        let mut metrics = RunMetrics::new(policy.name.clone(), totals);
        if n > 1 {
            metrics.replicas = vec![ReplicaTotals::default(); n as usize];
        }
        Ok(Sim {
            setup,
            replicas,
            balancer: Balancer::new(setup.gateways, setup.seed),
            weights: policy.weights.name(),
            model: None,
            workers,
            by_id: Vec::new(),
            queue: EventQueue::new(),
            now: Time::ZERO,
            reqs: Vec::new(),
            free: Vec::new(),
            alive: 0,
            open_pending: false,
            pending_lifecycle: 0,
            probes: Vec::new(),
            running: Vec::new(),
            orders: Vec::new(),
            outputs: Vec::new(),
            next_id: 0,
            events: 0,
            superseded: Superseded::default(),
            kv,
            rec: Recorder::new(metrics, setup.slo),
            werr: WeightErrorTracker::new(n as usize),
        })
    }

    /// The first replica's router: what every replica knows alike (the fleet's workers,
    /// their states and ids, the model) is read from it.
    #[inline]
    fn router(&self) -> &Router {
        &self.replicas[0].router
    }

    /// Whether the run has several gateway replicas (and so per-replica metrics).
    #[inline]
    fn several(&self) -> bool {
        self.replicas.len() > 1
    }

    #[inline]
    fn push(&mut self, at: Time, ev: Ev) {
        self.queue.push(at, ev);
    }

    /// `ns` nanoseconds from now.
    #[inline]
    fn after(&self, ns: u64) -> Time {
        self.now.plus_nanos(ns)
    }

    fn run(&mut self, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) -> Result<(), SimError> {
        for i in 0..self.workers.len() {
            let at = Time::from_nanos(self.setup.workers[i].register_at);
            self.pending_lifecycle += 1;
            self.push(at, Ev::Register { worker: i as u32 });
        }
        for (i, e) in self.setup.events.iter().enumerate() {
            if e.worker >= self.workers.len() {
                return Err(SimError::Setup(format!(
                    "lifecycle event {i} names worker index {} but the fleet has {}",
                    e.worker,
                    self.workers.len()
                )));
            }
            self.pending_lifecycle += 1;
            self.push(Time::from_nanos(e.at), Ev::Lifecycle { index: i as u32 });
        }
        self.pull_open(traffic)?;
        self.push(Time::ZERO, Ev::Tick);
        // Scheduled only for a policy that reads engine reports, so every other policy's event
        // sequence (and output) is unchanged.
        if self.router().engine_poll_interval().is_some() {
            self.push(Time::ZERO, Ev::EnginePoll);
        }
        // Scheduled only with several replicas exchanging load, so every other run's event
        // sequence is unchanged.
        let sync_ns = self.sync_interval_ns();
        if let Some(ns) = sync_ns {
            self.push(Time::from_nanos(ns), Ev::SyncLoad);
        }
        if self.setup.timeline_ns > 0 {
            self.push(Time::from_nanos(self.setup.timeline_ns), Ev::Sample);
        }
        let stop = Time::from_nanos(self.setup.max_time_ns);
        while let Some((at, ev)) = self.queue.pop() {
            if at > stop {
                break;
            }
            if at > self.now {
                self.flush_weights();
            }
            if let Ev::KvEvents { batch, .. } = ev
                && self.finished()
            {
                // Nothing is left to route: the router's knowledge no longer matters, and the
                // run still ends at its last event of substance.
                self.kv.recycle(batch);
                continue;
            }
            self.now = at;
            // The operating-concurrency reference is re-derived at the first event at or
            // after each refresh time, whether or not a weight moved there.
            if at >= self.werr.next_refresh {
                self.werr.due = true;
            }
            self.events += 1;
            let measurements = self.rec.metrics().probe_measurements;
            match ev {
                Ev::Arrive { req, epoch } => {
                    if self.valid(req, epoch) {
                        if self.reqs[req as usize].kind == requests::Kind::Open {
                            // Open-loop arrival: read ahead the next one.
                            self.open_pending = false;
                            self.pull_open(traffic)?;
                        }
                        self.arrive(req, traffic, sink);
                    }
                }
                Ev::Admit { req, epoch } => {
                    if self.valid(req, epoch) {
                        self.admit(req, traffic, sink);
                    }
                }
                Ev::FirstToken { req, epoch } => {
                    if self.valid(req, epoch) {
                        self.first_token(req);
                    }
                }
                Ev::Done { req, epoch } => {
                    if self.valid(req, epoch) {
                        self.done(req, traffic, sink);
                    }
                }
                Ev::Wake { worker, token } => {
                    let w = &mut self.workers[worker as usize];
                    if w.wake_token == token {
                        w.wake_at = None;
                        self.wake(worker, traffic, sink);
                    }
                }
                Ev::Register { worker } => {
                    self.pending_lifecycle -= 1;
                    self.register(worker);
                }
                Ev::Lifecycle { index } => {
                    self.pending_lifecycle -= 1;
                    self.lifecycle(index as usize, traffic, sink);
                }
                Ev::Tick => {
                    let now = self.now;
                    for r in &mut self.replicas {
                        r.router.tick(now);
                    }
                    self.poll_probes();
                    if !self.finished() {
                        self.push(self.after(self.setup.tick_ns), Ev::Tick);
                    }
                }
                Ev::EnginePoll => {
                    self.poll_engines();
                    if !self.finished()
                        && let Some(every) = self.router().engine_poll_interval()
                    {
                        let ns = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX).max(1);
                        self.push(self.after(ns), Ev::EnginePoll);
                    }
                }
                Ev::Sample => {
                    self.flush_weights();
                    self.check_weights_tracked();
                    self.sample();
                    if !self.finished() {
                        self.push(self.after(self.setup.timeline_ns), Ev::Sample);
                    }
                }
                Ev::KvEvents { worker, batch } => self.deliver_kv_events(worker, batch),
                Ev::SyncLoad => {
                    self.sync_load();
                    // Fewer requests elsewhere may leave room under a cap now.
                    self.drain_queue(traffic, sink);
                    if !self.finished()
                        && let Some(ns) = sync_ns
                    {
                        self.push(self.after(ns), Ev::SyncLoad);
                    }
                }
            }
            // The router's weights and the fleet change only at these events (and at probe
            // measurements): the weight error is re-read after them, before time moves on.
            let fleet = matches!(ev, Ev::Register { .. } | Ev::Lifecycle { .. });
            if fleet
                || matches!(ev, Ev::Tick)
                || self.rec.metrics().probe_measurements != measurements
            {
                self.weights_changed(fleet);
            }
        }
        // The replaced wake-ups would have popped as stale events: time moves on to the last.
        if self.superseded.last > self.now {
            self.flush_weights();
            self.now = self.superseded.last;
        }
        self.events += self.superseded.count;
        self.flush_weights();
        Ok(())
    }

    /// Hand the router each connected engine's figures, as a real router's poller would read
    /// them from the engine's metrics endpoint.
    fn poll_engines(&mut self) {
        let now = self.now.as_nanos();
        for w in &self.workers {
            let Some(id) = w.id else { continue };
            if !w.up || !w.engine.is_up(now) {
                continue;
            }
            let e = &w.engine;
            let kv_capacity = e.kv_capacity_tokens().max(1) as f64;
            // what the engine's metrics endpoint shows: KV as allocated, not the fluid model's
            // admission reservation
            let kv_tokens = e.kv_allocated_tokens(now);
            let report = EngineReport {
                kv_used_fraction: (kv_tokens as f64 / kv_capacity).min(1.0),
                queued_prompt_tokens: e.waiting_prompt_tokens(),
                running_tokens: kv_tokens,
                generation_tok_s: e.generation_tok_s(),
            };
            for r in &mut self.replicas {
                r.router.engine_report(self.now, id, report);
            }
        }
    }

    /// The period of the replicas' load exchange, when there is one.
    fn sync_interval_ns(&self) -> Option<u64> {
        match self.setup.gateways.share {
            Share::ProbesAndLoad { sync_interval_ns } if self.several() => {
                Some(sync_interval_ns.max(1))
            }
            _ => None,
        }
    }

    /// Nothing left that customers or the scenario are waiting for.
    fn finished(&self) -> bool {
        self.alive == 0 && !self.open_pending && self.pending_lifecycle == 0
    }

    /// Make sure a wake-up is queued no later than the engine's next event. A queued wake-up
    /// that is earlier than needed is kept (it fires, finds nothing due, and re-schedules);
    /// when the next event moves *earlier*, the worker's queued wake-up is replaced in the
    /// queue and only counted ([`Superseded`]).
    fn reschedule(&mut self, worker: u32) {
        // Every engine mutation ends here: what it did to the prefix cache is published now.
        if self.kv.enabled() {
            self.publish_kv_events(worker);
        }
        let now = self.now;
        let w = &mut self.workers[worker as usize];
        if let Some(t) = w.engine.next_event_time() {
            let t = Time::from_nanos(t).max(now);
            if w.wake_at.is_none_or(|at| t < at) {
                w.wake_token += 1;
                w.wake_at = Some(t);
                let token = w.wake_token;
                if let Some(old) = self
                    .queue
                    .schedule_slot(worker, t, Ev::Wake { worker, token })
                {
                    self.superseded.note(old, self.setup.max_time_ns);
                }
            }
        }
    }

    fn sample(&mut self) {
        let t_s = self.now.as_secs_f64();
        let m = self.rec.metrics_mut();
        let router = &self.replicas[0].router;
        for (i, w) in self.workers.iter_mut().enumerate() {
            let (in_flight, weight, provenance) = match w.id {
                Some(id) => {
                    // Every replica's requests; the first replica's weight.
                    let in_flight = self
                        .replicas
                        .iter()
                        .map(|r| replicas::local_in_flight(&r.router, id))
                        .sum();
                    let wt = router.weight(id).unwrap_or_default();
                    (in_flight, wt.value, wt.provenance)
                }
                None => (0, 0.0, Provenance::Default),
            };
            m.timeline.push(TimelineRow {
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

    fn finish(mut self) -> RunMetrics {
        self.close_weight_interval();
        self.hand_over_weight_errors();
        let m = self.rec.metrics_mut();
        m.end_ns = self.now.as_nanos();
        m.events = self.events;
        for (r, totals) in m.replicas.iter_mut().enumerate() {
            let router = &self.replicas[r].router;
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
                && let Some(wt) = self.replicas[0].router.weight(id)
            {
                totals.final_weight = wt.value;
                totals.final_provenance = wt.provenance;
            }
        }
        self.rec.into_metrics()
    }
}
