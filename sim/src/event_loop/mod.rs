//! The event loop: a fleet of [`Engine`](crate::worker::Engine)s (fluid or step-level) behind
//! one or more gateway replicas, each a [`Router`], fed by a traffic source, with probes,
//! lifecycle events and metrics.
//!
//! The run is made of parts, each owning its state, and this module only pops events and
//! hands each to the part it concerns:
//! - [`queue`]: the event queue — integer [`Time`], then a sequence number, so equal-time
//!   events run in the order they were caused, never in hash-map or thread order;
//! - `requests` (`Requests`): a request's life top to bottom — arrival, the balancer,
//!   routing or the gateway's FIFO queue, network round trips, first token, completion,
//!   failure and retry — over request slots reused by epoch;
//! - `fleet` (`Fleet`): the workers' engines, router ids, network and wake-ups, the engine
//!   poll and the timeline samples;
//! - [`replicas`] (`Replicas`): several gateway replicas behind an L4 balancer (the scenario's
//!   `gateways:`), each a router with its RNG stream, and what they share;
//! - `probes` (`Probes`): probe orders of the routers served as bursts of real traffic, and
//!   the bursts another replica's order may join;
//! - `kv` (`KvDelivery`): the engines' KV events on their way to routers that mirror them, and
//!   the overlap regret of each routing decision;
//! - `lifecycle` (`Lifecycle`): registration and the scenario's lifecycle events (restarts,
//!   crashes, pins…), where a call the router refuses becomes a
//!   [`RunWarning`](crate::record::RunWarning);
//! - `weight_error` (`WeightErrorTracker`): the integral of the routers' weight error;
//! - [`setup`]: what a run is given ([`SimSetup`], [`WorkerSetup`], [`LifecycleEvent`]).
//!
//! What a run measured is counted by the shared [`Recorder`] (see [`crate::record`]), the same
//! code the emulator's real-time player uses. Each worker has at most one wake-up event queued:
//! one that moves earlier replaces the queued one in place (the queue's slots), and the
//! replaced ones are only counted (`Superseded`), as the stale events they used to be.

mod fleet;
mod kv;
mod lifecycle;
mod peers;
mod probes;
pub(crate) mod queue;
pub mod replicas;
mod requests;
pub mod setup;
mod weight_error;

pub use replicas::{DEFAULT_BUS_LATENCY_S, Gateways, MAX_REPLICAS, Share, Split};
pub use setup::{Action, LifecycleEvent, NO_TIME_LIMIT_NS, SimError, SimSetup, WorkerSetup};
// The result types live in `record` and `results` (they are shared with the real-time
// player); their paths under the event loop stay valid.
pub use crate::record::{RequestRecord, RequestSink, Slo};
pub use crate::results::{ReplicaTotals, RunMetrics, TimelineRow, WorkerTotals};

use crate::record::Recorder;
use crate::traffic::TrafficSource;
use fleet::Fleet;
use kv::KvDelivery;
use lifecycle::Lifecycle;
use peers::PeerBus;
use probes::Probes;
use queue::EventQueue;
use replicas::Replicas;
use requests::Requests;
use routelab_policies::{PolicyConfig, Router, Time};
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
    /// A replica reads the engines' own counts of sequences (`share: engine-truth`).
    EngineTruth { replica: u32 },
    /// A message of the replicas' dispatch stream reaches the other replicas (index into the
    /// bus's messages).
    Peer { msg: u32 },
    /// A replica routes a request it held (a spread dispatch stream).
    Route { req: u32, epoch: u32 },
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

/// The state of one run: the loop's own (the clock, the queue, the counts) and its parts.
struct Sim<'a> {
    setup: &'a SimSetup,
    queue: EventQueue<Ev>,
    now: Time,
    /// Events handled.
    events: u64,
    /// Wake-ups replaced in the queue before they were due (see [`Sim::reschedule`]).
    superseded: Superseded,
    rec: Recorder,
    /// The gateway replicas (one without a `gateways:` block) and their balancer.
    replicas: Replicas,
    fleet: Fleet,
    requests: Requests,
    probes: Probes,
    lifecycle: Lifecycle,
    /// The engines' KV events on their way to the routers (only when the policy reads them).
    kv: KvDelivery,
    /// The weight error's running integral.
    werr: WeightErrorTracker,
    /// The replicas' dispatch stream (`share: dispatch-stream`, `route-and-reserve`).
    peers: PeerBus,
}

impl<'a> Sim<'a> {
    fn new(setup: &'a SimSetup, policy: &PolicyConfig) -> Result<Self, SimError> {
        if setup.workers.is_empty() {
            return Err(SimError::Setup("the fleet has no workers".into()));
        }
        let mut fleet = Fleet::new(setup);
        let totals = setup
            .workers
            .iter()
            .map(|w| WorkerTotals::new(w.spec.name.clone()))
            .collect();
        let replicas = Replicas::new(setup.gateways, setup.seed, || {
            let mut router = Router::new(policy.clone());
            // A chooser that predicts latency aims at the scenario's SLO unless its own
            // bounds are set (others ignore it).
            router.aim_at(setup.slo.ttft_s, setup.slo.tpot_s);
            router
        });
        let kv = KvDelivery::new(replicas.first().kv_event_delay());
        if kv.enabled() {
            for w in &mut fleet.workers {
                w.engine.publish_kv_events(true);
            }
        }
        let n = replicas.len();
        let mut metrics = RunMetrics::new(policy.name.clone(), totals);
        metrics.role = policy.role();
        if n > 1 {
            metrics.replicas = vec![ReplicaTotals::default(); n];
        }
        Ok(Sim {
            setup,
            queue: EventQueue::new(),
            now: Time::ZERO,
            events: 0,
            superseded: Superseded::default(),
            rec: Recorder::new(metrics, setup.slo),
            replicas,
            fleet,
            requests: Requests::default(),
            probes: Probes::new(setup.gateways.share.probes()),
            lifecycle: Lifecycle::new(policy.weights.name()),
            kv,
            werr: WeightErrorTracker::new(n),
            peers: PeerBus::new(
                setup.gateways.share,
                setup.gateways.replicas as usize,
                setup.seed,
            ),
        })
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

    /// Schedule the scenario and the periodic events, then pop events and hand each to the
    /// part it concerns until none is left or the time limit is passed.
    fn run(&mut self, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) -> Result<(), SimError> {
        self.schedule_lifecycle()?;
        self.pull_open(traffic)?;
        self.push(Time::ZERO, Ev::Tick);
        // Scheduled only for a policy that reads engine reports, so every other policy's event
        // sequence (and output) is unchanged.
        if self.replicas.first().engine_poll_interval().is_some() {
            self.push(Time::ZERO, Ev::EnginePoll);
        }
        // Scheduled only with several replicas exchanging load, so every other run's event
        // sequence is unchanged.
        let sync_ns = self.sync_interval_ns();
        if let Some(ns) = sync_ns {
            self.push(Time::from_nanos(ns), Ev::SyncLoad);
        }
        // Each replica polls the engines on its own timer, the timers spread over the period
        // (independent gateways' timers are not aligned; aligned ones would all see the same
        // room at the same instant and fill it together).
        if let Share::EngineTruth { poll_interval_ns } = self.setup.gateways.share
            && self.replicas.several()
        {
            let n = self.replicas.len() as u64;
            let every = poll_interval_ns.max(1);
            for r in 0..n {
                let first = (every.saturating_mul(r + 1) / n).max(1);
                self.push(
                    Time::from_nanos(first),
                    Ev::EngineTruth { replica: r as u32 },
                );
            }
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
            self.werr.note_event(at);
            self.events += 1;
            let measurements = self.rec.metrics().probe_measurements;
            match ev {
                Ev::Arrive { req, epoch } => {
                    if self.requests.valid(req, epoch) {
                        self.on_arrive(req, traffic, sink)?;
                    }
                }
                Ev::Admit { req, epoch } => {
                    if self.requests.valid(req, epoch) {
                        self.admit(req, traffic, sink);
                    }
                }
                Ev::FirstToken { req, epoch } => {
                    if self.requests.valid(req, epoch) {
                        self.first_token(req);
                    }
                }
                Ev::Done { req, epoch } => {
                    if self.requests.valid(req, epoch) {
                        self.done(req, traffic, sink);
                    }
                }
                Ev::Wake { worker, token } => {
                    let w = self.fleet.get_mut(worker);
                    if w.wake_token == token {
                        w.wake_at = None;
                        self.wake(worker, traffic, sink);
                    }
                }
                Ev::Register { worker } => self.on_register(worker),
                Ev::Lifecycle { index } => self.on_lifecycle(index, traffic, sink),
                Ev::Tick => self.on_tick(),
                Ev::EnginePoll => self.on_engine_poll(),
                Ev::Sample => self.on_sample(),
                Ev::KvEvents { worker, batch } => self.deliver_kv_events(worker, batch),
                Ev::SyncLoad => self.on_sync_load(sync_ns, traffic, sink),
                Ev::EngineTruth { replica } => self.on_engine_truth(replica, traffic, sink),
                Ev::Peer { msg } => self.on_peer(msg, traffic, sink),
                Ev::Route { req, epoch } => {
                    if self.requests.valid(req, epoch) {
                        self.route(req, traffic, sink);
                    }
                }
            }
            // The routers' weights and the fleet change only at these events (and at probe
            // measurements): the weight error is re-read after them, before time moves on.
            let fleet = matches!(ev, Ev::Register { .. } | Ev::Lifecycle { .. });
            if fleet
                || matches!(ev, Ev::Tick)
                || self.rec.metrics().probe_measurements != measurements
            {
                self.werr.weights_changed(fleet);
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

    /// Router tick: every replica's router ticks, and the probes they order start.
    fn on_tick(&mut self) {
        let now = self.now;
        for r in self.replicas.iter_mut() {
            r.router.tick(now);
        }
        self.poll_probes();
        if !self.finished() {
            self.push(self.after(self.setup.tick_ns), Ev::Tick);
        }
    }

    /// The routers poll their engines' metrics.
    fn on_engine_poll(&mut self) {
        self.fleet.poll_engines(self.now, &mut self.replicas);
        if !self.finished()
            && let Some(every) = self.replicas.first().engine_poll_interval()
        {
            let ns = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX).max(1);
            self.push(self.after(ns), Ev::EnginePoll);
        }
    }

    /// A timeline sample (the weight error re-read and, in debug builds, checked first).
    fn on_sample(&mut self) {
        self.flush_weights();
        self.check_weights_tracked();
        let timeline = &mut self.rec.metrics_mut().timeline;
        self.fleet.sample(self.now, &self.replicas, timeline);
        if !self.finished() {
            self.push(self.after(self.setup.timeline_ns), Ev::Sample);
        }
    }

    /// The replicas exchange their in-flight counts (every `sync_ns`).
    fn on_sync_load(
        &mut self,
        sync_ns: Option<u64>,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) {
        self.replicas.sync_load(&self.fleet);
        // Fewer requests elsewhere may leave room under a cap now.
        self.drain_queue(traffic, sink);
        if !self.finished()
            && let Some(ns) = sync_ns
        {
            self.push(self.after(ns), Ev::SyncLoad);
        }
    }

    /// `engine-truth`: replica `r` reads the engines' counts, and polls again a period later.
    fn on_engine_truth(&mut self, r: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        self.replicas.sync_engine_truth(r as usize, &self.fleet);
        // Fewer requests on the engines may leave room under its cap now.
        self.drain_queue(traffic, sink);
        if !self.finished()
            && let Share::EngineTruth { poll_interval_ns } = self.setup.gateways.share
        {
            self.push(
                self.after(poll_interval_ns.max(1)),
                Ev::EngineTruth { replica: r },
            );
        }
    }

    /// The period of the replicas' load exchange, when there is one.
    fn sync_interval_ns(&self) -> Option<u64> {
        match self.setup.gateways.share {
            Share::ProbesAndLoad { sync_interval_ns } if self.replicas.several() => {
                Some(sync_interval_ns.max(1))
            }
            _ => None,
        }
    }

    /// Nothing left that customers or the scenario are waiting for.
    #[inline]
    fn finished(&self) -> bool {
        self.requests.none_waiting() && self.lifecycle.none_pending()
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
        let w = self.fleet.get_mut(worker);
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

    fn finish(mut self) -> RunMetrics {
        self.close_weight_error();
        let m = self.rec.metrics_mut();
        m.end_ns = self.now.as_nanos();
        m.events = self.events;
        self.fleet.final_weights(&self.replicas, m);
        self.rec.into_metrics()
    }
}
