//! The event engine: a fleet of [`EngineModel`]s behind one [`Router`], fed by a traffic
//! source, with probes, lifecycle events and metrics.
//!
//! Time is integer nanoseconds. Events are ordered by `(time, sequence number)`; the sequence
//! number is assigned when an event is scheduled, so equal-time events run in the order they
//! were caused — never in hash-map or thread order. Each worker has at most one live wake-up
//! event; a wake-up whose generation no longer matches the engine's is stale and skipped.

use crate::histogram::Histogram;
use crate::traffic::{Arrival, TrafficError, TrafficSource};
use crate::worker::EngineOverrides;
use crate::worker::{EngineModel, EngineOutput};
use crate::{HardwareProfile, derive_seed};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::{
    Completion, PolicyConfig, ProbeOrder, ProbeResult, Provenance, RouteError, RouteRequest,
    Router, Time, WorkerId, WorkerSpec,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

/// One worker of the simulated fleet.
#[derive(Debug, Clone)]
pub struct WorkerSetup {
    /// What it announces to the router.
    pub spec: WorkerSpec,
    /// Its hardware.
    pub profile: Arc<HardwareProfile>,
    /// Per-worker changes to the hardware model.
    pub overrides: EngineOverrides,
    /// Network round trip between gateway and worker, ns.
    pub rtt_ns: u64,
    /// When it registers, ns.
    pub register_at: u64,
}

/// Something that happens to a worker at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The engine restarts (in-flight requests fail). It is ready `ready_after_ns` later, and
    /// re-registers with the router `register_after_ns` after that, with `launch_args` if given.
    Restart {
        /// New launch arguments (`None`: unchanged).
        launch_args: Option<String>,
        /// Start-up time of the engine.
        ready_after_ns: u64,
        /// Delay between ready and registration (the source's probe ran 5 s after ready).
        register_after_ns: u64,
        /// Whether the fresh engine is cold.
        cold: bool,
    },
    /// The engine crashes: in-flight requests fail, it stays down until a `Restart`.
    Crash,
    /// The connection to the gateway drops (the engine keeps working).
    Disconnect,
    /// The connection comes back.
    Reconnect,
    /// The node manager restarts, keeping or losing its probe cache.
    NodeManagerRestart {
        /// Whether the cache survives.
        keep_cache: bool,
    },
    /// An administrator pins the weight.
    Pin(f64),
    /// An administrator clears the pin.
    Unpin,
    /// An administrator asks for a fresh probe.
    Reprobe,
    /// The node degrades or recovers: every rate is multiplied by this factor from now on.
    SetSpeed(f64),
    /// The worker is deregistered for good.
    Remove,
}

/// A lifecycle event of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleEvent {
    /// When, ns.
    pub at: u64,
    /// Which worker (index into the fleet).
    pub worker: usize,
    /// What happens.
    pub action: Action,
}

/// Service-level objective per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token, seconds.
    pub tpot_s: f64,
}

impl Default for Slo {
    fn default() -> Self {
        Slo {
            ttft_s: 2.0,
            tpot_s: 0.1,
        }
    }
}

/// Everything about a run except the policy and the traffic.
#[derive(Debug, Clone)]
pub struct SimSetup {
    /// Model name all traffic asks for.
    pub model: String,
    /// The fleet.
    pub workers: Vec<WorkerSetup>,
    /// Lifecycle events.
    pub events: Vec<LifecycleEvent>,
    /// Root seed; every component derives its own stream from it.
    pub seed: u64,
    /// Router tick period, ns.
    pub tick_ns: u64,
    /// Timeline sampling period, ns (0: no timeline).
    pub timeline_ns: u64,
    /// Hard stop, ns: nothing happens after it.
    pub max_time_ns: u64,
    /// SLO for attainment.
    pub slo: Slo,
    /// Concurrency at which the oracle reads each profile's true capacity.
    pub oracle_concurrency: f64,
    /// Re-route a request whose worker failed before its first token, at most this often.
    pub max_retries: u32,
}

impl SimSetup {
    /// A setup with default periods: tick 1 s, timeline 10 s, no lifecycle events.
    pub fn new(model: impl Into<String>, workers: Vec<WorkerSetup>, seed: u64) -> SimSetup {
        SimSetup {
            model: model.into(),
            workers,
            events: Vec::new(),
            seed,
            tick_ns: 1_000_000_000,
            timeline_ns: 10_000_000_000,
            max_time_ns: u64::MAX / 4,
            slo: Slo::default(),
            oracle_concurrency: 16.0,
            max_retries: 2,
        }
    }
}

/// One finished customer request, as streamed to a [`RequestSink`].
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Order of arrival (0-based).
    pub id: u64,
    /// Arrival time, s.
    pub arrival_s: f64,
    /// Worker name (empty if never dispatched).
    pub worker: String,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Time queued at the gateway, s.
    pub queue_s: f64,
    /// Time to first token, s (NaN if none).
    pub ttft_s: f64,
    /// End-to-end latency, s (NaN if not completed).
    pub e2e_s: f64,
    /// Time per output token after the first, s.
    pub tpot_s: f64,
    /// Prompt tokens the engine found in its prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens the router believed cached on the chosen worker.
    pub believed_cached_tokens: u32,
    /// The prefix holder was kept over the chooser's pick.
    pub affinity_kept: bool,
    /// `ok`, `failed` or `rejected`.
    pub status: &'static str,
}

/// Where per-request rows go, when asked for.
pub trait RequestSink {
    /// One finished request.
    fn record(&mut self, row: &RequestRecord);
}

impl RequestSink for Vec<RequestRecord> {
    fn record(&mut self, row: &RequestRecord) {
        self.push(row.clone());
    }
}

/// One timeline sample of one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    /// Sample time, s.
    pub t_s: f64,
    /// Worker index.
    pub worker: usize,
    /// Customer requests in flight (router's count).
    pub in_flight: u32,
    /// Sequences running inside the engine (customers and probes).
    pub running: u32,
    /// Sequences waiting inside the engine.
    pub waiting: u32,
    /// Weight at the sample.
    pub weight: f64,
    /// Where the weight comes from.
    pub provenance: Provenance,
    /// Customer requests dispatched since the previous sample.
    pub dispatched: u64,
    /// Customer output tokens completed since the previous sample.
    pub output_tokens: u64,
}

/// Per-worker totals.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTotals {
    /// Worker name.
    pub name: String,
    /// Customer requests dispatched to it.
    pub requests: u64,
    /// Customer requests completed on it.
    pub completed: u64,
    /// Customer output tokens completed on it.
    pub output_tokens: u64,
    /// Requests that failed on it.
    pub failed: u64,
    /// Weight at the end.
    pub final_weight: f64,
    /// Provenance at the end.
    pub final_provenance: Provenance,
    /// Probe bursts it served.
    pub probe_bursts: u64,
    /// Sum of its completed requests' TTFT, s.
    pub ttft_sum_s: f64,
    /// Sum of its completed requests' end-to-end latency, s.
    pub e2e_sum_s: f64,
}

impl WorkerTotals {
    /// Nothing counted yet; weight 1.0, not yet measured.
    pub fn new(name: impl Into<String>) -> WorkerTotals {
        WorkerTotals {
            name: name.into(),
            requests: 0,
            completed: 0,
            output_tokens: 0,
            failed: 0,
            final_weight: 1.0,
            final_provenance: Provenance::Default,
            probe_bursts: 0,
            ttft_sum_s: 0.0,
            e2e_sum_s: 0.0,
        }
    }

    /// Mean TTFT of its completed requests, s.
    pub fn mean_ttft_s(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.ttft_sum_s / self.completed as f64)
    }

    /// Mean end-to-end latency of its completed requests, s.
    pub fn mean_e2e_s(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.e2e_sum_s / self.completed as f64)
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    /// Policy name.
    pub policy: String,
    /// Customer requests that arrived.
    pub requests: u64,
    /// Completed.
    pub completed: u64,
    /// Failed (worker crashed after the first token, or retries exhausted).
    pub failed: u64,
    /// Rejected by the router (no worker for the model, prompt too long).
    pub rejected: u64,
    /// Re-routed after their worker failed before the first token.
    pub retried: u64,
    /// Time to first token, s.
    pub ttft: Histogram,
    /// End to end, s.
    pub e2e: Histogram,
    /// Time per output token, s.
    pub tpot: Histogram,
    /// Gateway queue time, s.
    pub queue: Histogram,
    /// Requests whose TTFT and TPOT met the SLO.
    pub slo_met: u64,
    /// Customer output tokens completed.
    pub output_tokens: u64,
    /// Customer prompt tokens of completed requests.
    pub prompt_tokens: u64,
    /// Of those, served from engine prefix caches.
    pub cached_tokens: u64,
    /// Of those, believed cached by the router.
    pub believed_cached_tokens: u64,
    /// First arrival, ns.
    pub first_arrival_ns: u64,
    /// Last completion, ns.
    pub last_completion_ns: u64,
    /// Probe bursts sent (warm-up and measurement).
    pub probe_bursts: u64,
    /// Probe bursts whose result became a measurement.
    pub probe_measurements: u64,
    /// GPU-seconds spent in probe bursts (burst wall time).
    pub probe_gpu_s: f64,
    /// Per-worker totals.
    pub workers: Vec<WorkerTotals>,
    /// Timeline samples.
    pub timeline: Vec<TimelineRow>,
    /// Simulated time at the end, ns.
    pub end_ns: u64,
    /// Events processed (a measure of simulation work).
    pub events: u64,
}

impl RunMetrics {
    /// Empty metrics of a run of `policy` on the given workers.
    pub fn new(policy: impl Into<String>, workers: Vec<WorkerTotals>) -> RunMetrics {
        RunMetrics {
            policy: policy.into(),
            requests: 0,
            completed: 0,
            failed: 0,
            rejected: 0,
            retried: 0,
            ttft: Histogram::new(),
            e2e: Histogram::new(),
            tpot: Histogram::new(),
            queue: Histogram::new(),
            slo_met: 0,
            output_tokens: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            believed_cached_tokens: 0,
            first_arrival_ns: u64::MAX,
            last_completion_ns: 0,
            probe_bursts: 0,
            probe_measurements: 0,
            probe_gpu_s: 0.0,
            workers,
            timeline: Vec::new(),
            end_ns: 0,
            events: 0,
        }
    }

    /// Output tokens per second from first arrival to last completion.
    pub fn output_tok_s(&self) -> f64 {
        let span = self
            .last_completion_ns
            .saturating_sub(self.first_arrival_ns) as f64
            / 1e9;
        if span > 0.0 {
            self.output_tokens as f64 / span
        } else {
            0.0
        }
    }

    /// Fraction of prompt tokens served from engine prefix caches.
    pub fn prefix_hit_fraction(&self) -> f64 {
        ratio(self.cached_tokens, self.prompt_tokens)
    }

    /// Fraction of prompt tokens the router believed cached.
    pub fn believed_hit_fraction(&self) -> f64 {
        ratio(self.believed_cached_tokens, self.prompt_tokens)
    }

    /// Fraction of completed requests within the SLO.
    pub fn slo_attainment(&self) -> f64 {
        ratio(self.slo_met, self.requests)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The traffic source failed (bad trace row, unreadable file).
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// The setup is impossible.
    #[error("{0}")]
    Setup(String),
}

// ----- events ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
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
    Wake { worker: u32, epoch: u64 },
    /// A worker registers (or re-registers after a restart).
    Register { worker: u32 },
    /// A scenario lifecycle event.
    Lifecycle { index: u32 },
    /// Router tick.
    Tick,
    /// Timeline sample.
    Sample,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Scheduled {
    at: u64,
    seq: u64,
    ev: Ev,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Customer,
    Probe(u32),
}

#[derive(Debug, Clone)]
struct Req {
    epoch: u32,
    live: bool,
    id: u64,
    kind: Kind,
    arrival: u64,
    prompt: u32,
    output: u32,
    tag: u64,
    prefix: Vec<u64>,
    worker: u32,
    dispatched: u64,
    first_token: Option<u64>,
    cached: u32,
    believed: u32,
    affinity_kept: bool,
    retries: u32,
}

#[derive(Debug, Clone)]
struct ProbeRun {
    order: ProbeOrder,
    started: u64,
    outstanding: u32,
    tokens: u64,
    last_done: u64,
    ok: bool,
}

struct WorkerRt {
    engine: EngineModel,
    id: Option<WorkerId>,
    rtt_half: u64,
    up: bool,
    pending_args: Option<String>,
    /// Identifies the live wake-up event; older ones in the queue are stale.
    wake_token: u64,
    /// Time of the live wake-up event, if one is queued.
    wake_at: Option<u64>,
    totals: WorkerTotals,
    interval_dispatched: u64,
    interval_tokens: u64,
}

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
    Ok(sim.finish())
}

struct Sim<'a> {
    setup: &'a SimSetup,
    router: Router,
    rng: Xoshiro256PlusPlus,
    model: Option<routelab_policies::ModelId>,
    workers: Vec<WorkerRt>,
    by_id: Vec<u32>,
    heap: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    now: u64,
    reqs: Vec<Req>,
    free: Vec<u32>,
    alive: u64,
    open_pending: bool,
    pending_lifecycle: u64,
    probes: Vec<ProbeRun>,
    orders: Vec<ProbeOrder>,
    outputs: Vec<EngineOutput>,
    next_id: u64,
    m: RunMetrics,
}

impl<'a> Sim<'a> {
    fn new(setup: &'a SimSetup, policy: &PolicyConfig) -> Result<Self, SimError> {
        if setup.workers.is_empty() {
            return Err(SimError::Setup("the fleet has no workers".into()));
        }
        let workers = setup
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let engine = EngineModel::new(
                    w.profile.clone(),
                    w.overrides.clone(),
                    derive_seed(setup.seed, 1000 + i as u64),
                );
                WorkerRt {
                    engine,
                    id: None,
                    rtt_half: w.rtt_ns / 2,
                    up: true,
                    pending_args: None,
                    wake_token: 0,
                    wake_at: None,
                    totals: WorkerTotals::new(w.spec.name.clone()),
                    interval_dispatched: 0,
                    interval_tokens: 0,
                }
            })
            .collect();
        Ok(Sim {
            setup,
            router: Router::new(policy.clone()),
            rng: Xoshiro256PlusPlus::seed_from_u64(derive_seed(setup.seed, 1)),
            model: None,
            workers,
            by_id: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            reqs: Vec::new(),
            free: Vec::new(),
            alive: 0,
            open_pending: false,
            pending_lifecycle: 0,
            probes: Vec::new(),
            orders: Vec::new(),
            outputs: Vec::new(),
            next_id: 0,
            m: RunMetrics::new(policy.name.clone(), Vec::new()),
        })
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn run(
        &mut self,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) -> Result<(), SimError> {
        for i in 0..self.workers.len() {
            let at = self.setup.workers[i].register_at;
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
            self.push(e.at, Ev::Lifecycle { index: i as u32 });
        }
        self.pull_open(traffic)?;
        self.push(0, Ev::Tick);
        if self.setup.timeline_ns > 0 {
            self.push(self.setup.timeline_ns, Ev::Sample);
        }
        while let Some(Reverse(s)) = self.heap.pop() {
            if s.at > self.setup.max_time_ns {
                break;
            }
            self.now = s.at;
            self.m.events += 1;
            match s.ev {
                Ev::Arrive { req, epoch } => {
                    if self.valid(req, epoch) {
                        if self.reqs[req as usize].id == u64::MAX {
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
                Ev::Wake { worker, epoch } => {
                    let w = &mut self.workers[worker as usize];
                    if w.wake_token == epoch {
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
                    self.router.tick(Time::from_nanos(self.now));
                    self.poll_probes();
                    if !self.finished() {
                        self.push(self.now + self.setup.tick_ns, Ev::Tick);
                    }
                }
                Ev::Sample => {
                    self.sample();
                    if !self.finished() {
                        self.push(self.now + self.setup.timeline_ns, Ev::Sample);
                    }
                }
            }
        }
        Ok(())
    }

    /// Nothing left that customers or the scenario are waiting for.
    fn finished(&self) -> bool {
        self.alive == 0 && !self.open_pending && self.pending_lifecycle == 0
    }

    fn valid(&self, req: u32, epoch: u32) -> bool {
        let r = &self.reqs[req as usize];
        r.live && r.epoch == epoch
    }

    fn alloc(&mut self, kind: Kind, a: &Arrival) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.reqs.push(Req {
                    epoch: 0,
                    live: false,
                    id: 0,
                    kind,
                    arrival: 0,
                    prompt: 0,
                    output: 0,
                    tag: 0,
                    prefix: Vec::new(),
                    worker: 0,
                    dispatched: 0,
                    first_token: None,
                    cached: 0,
                    believed: 0,
                    affinity_kept: false,
                    retries: 0,
                });
                (self.reqs.len() - 1) as u32
            }
        };
        let r = &mut self.reqs[idx as usize];
        r.epoch = r.epoch.wrapping_add(1);
        r.live = true;
        r.id = u64::MAX;
        r.kind = kind;
        r.arrival = a.at;
        r.prompt = a.prompt_tokens;
        r.output = a.output_tokens.max(1);
        r.tag = a.tag;
        r.prefix.clear();
        r.prefix.extend_from_slice(&a.prefix_blocks);
        r.first_token = None;
        r.cached = 0;
        r.believed = 0;
        r.affinity_kept = false;
        r.retries = 0;
        if kind == Kind::Customer {
            self.alive += 1;
        }
        idx
    }

    fn release(&mut self, req: u32) {
        let r = &mut self.reqs[req as usize];
        r.live = false;
        if r.kind == Kind::Customer {
            self.alive -= 1;
        }
        self.free.push(req);
    }

    fn pull_open(&mut self, traffic: &mut dyn TrafficSource) -> Result<(), SimError> {
        if let Some(a) = traffic.next_arrival()? {
            let at = a.at.max(self.now);
            let idx = self.alloc(Kind::Customer, &a);
            // `id == u64::MAX` marks an open-loop arrival until it is numbered on arrival.
            let epoch = self.reqs[idx as usize].epoch;
            self.open_pending = true;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
        Ok(())
    }

    fn schedule_follow_up(&mut self, a: Option<Arrival>) {
        if let Some(a) = a {
            let at = a.at.max(self.now);
            let idx = self.alloc(Kind::Customer, &a);
            let r = &mut self.reqs[idx as usize];
            r.id = u64::MAX - 1; // follow-ups do not read ahead
            let epoch = r.epoch;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
    }

    fn arrive(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        self.m.requests += 1;
        self.m.first_arrival_ns = self.m.first_arrival_ns.min(self.now);
        let r = &mut self.reqs[req as usize];
        r.id = id;
        r.arrival = self.now;
        self.route(req, traffic, sink);
    }

    fn route(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let Some(model) = self.model else {
            self.reject(req, traffic, sink);
            return;
        };
        let r = &self.reqs[req as usize];
        let request = RouteRequest {
            model,
            context_tokens: r.prompt.saturating_add(r.output),
            prefix: &r.prefix,
        };
        match self
            .router
            .route(Time::from_nanos(self.now), &request, &mut self.rng)
        {
            Ok(d) => self.dispatched(req, d),
            Err(RouteError::AllAtCap { .. }) | Err(RouteError::NoHealthyWorker { .. }) => {
                // Wait at the gateway (FIFO) until a slot frees or a worker comes back.
                let ticket = (u64::from(self.reqs[req as usize].epoch) << 32) | u64::from(req);
                let r = &self.reqs[req as usize];
                let request = RouteRequest {
                    model,
                    context_tokens: r.prompt.saturating_add(r.output),
                    prefix: &r.prefix,
                };
                self.router.enqueue(ticket, &request);
            }
            Err(_) => self.reject(req, traffic, sink),
        }
    }

    fn dispatched(&mut self, req: u32, d: routelab_policies::Decision) {
        let worker = self.by_id[d.worker.index()];
        let w = &mut self.workers[worker as usize];
        w.totals.requests += 1;
        w.interval_dispatched += 1;
        let half = w.rtt_half;
        let r = &mut self.reqs[req as usize];
        r.worker = worker;
        r.dispatched = self.now;
        r.believed = (d.believed_cached_blocks * crate::worker::BLOCK_TOKENS).min(r.prompt);
        r.affinity_kept = d.affinity_kept;
        let epoch = r.epoch;
        if half == 0 {
            // No network in between: the engine sees it now (one event fewer per request).
            self.admit_now(req);
        } else {
            self.push(self.now + half, Ev::Admit { req, epoch });
        }
    }

    fn reject(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        self.m.rejected += 1;
        self.emit(req, "rejected", sink);
        let tag = self.reqs[req as usize].tag;
        self.release(req);
        let follow = traffic.on_complete(self.now, tag);
        self.schedule_follow_up(follow);
    }

    fn admit(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        if !self.workers[self.reqs[req as usize].worker as usize].up {
            // The engine died while the request was on its way.
            self.fail(req, traffic, sink);
            return;
        }
        self.admit_now(req);
    }

    /// Hand a request to its (running) engine at the current time.
    fn admit_now(&mut self, req: u32) {
        let r = &self.reqs[req as usize];
        let worker = r.worker;
        let (prompt, output) = (r.prompt, r.output);
        let w = &mut self.workers[worker as usize];
        w.engine
            .admit(self.now, u64::from(req), prompt, output, &r.prefix);
        self.reschedule(worker);
    }

    /// Make sure a wake-up is queued no later than the engine's next event. A queued wake-up
    /// that is earlier than needed is kept (it fires, finds nothing due, and re-schedules):
    /// pushing only when the next event moves *earlier* keeps stale entries out of the queue.
    fn reschedule(&mut self, worker: u32) {
        let w = &mut self.workers[worker as usize];
        if let Some(t) = w.engine.next_event_time() {
            let t = t.max(self.now);
            if w.wake_at.is_none_or(|at| t < at) {
                w.wake_token += 1;
                w.wake_at = Some(t);
                let epoch = w.wake_token;
                self.push(t, Ev::Wake { worker, epoch });
            }
        }
    }

    fn wake(
        &mut self,
        worker: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let mut outputs = std::mem::take(&mut self.outputs);
        self.workers[worker as usize]
            .engine
            .advance_to(self.now, &mut outputs);
        self.reschedule(worker);
        let half = self.workers[worker as usize].rtt_half;
        for out in outputs.drain(..) {
            let req = out.seq() as u32;
            let epoch = self.reqs[req as usize].epoch;
            let at = (out.at() + half).max(self.now);
            match out {
                EngineOutput::FirstToken { cached_tokens, .. } => {
                    self.reqs[req as usize].cached = cached_tokens;
                    if at == self.now {
                        self.first_token(req);
                    } else {
                        self.push(at, Ev::FirstToken { req, epoch });
                    }
                }
                EngineOutput::Completed(c) => {
                    self.reqs[req as usize].cached = c.cached_tokens;
                    if at == self.now {
                        self.done(req, traffic, sink);
                    } else {
                        self.push(at, Ev::Done { req, epoch });
                    }
                }
            }
        }
        self.outputs = outputs;
    }

    fn first_token(&mut self, req: u32) {
        let r = &mut self.reqs[req as usize];
        r.first_token = Some(self.now);
        if r.kind == Kind::Customer {
            let worker = r.worker;
            if let Some(id) = self.workers[worker as usize].id {
                self.router.first_token(Time::from_nanos(self.now), id);
            }
        }
    }

    fn done(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let r = &self.reqs[req as usize];
        let worker = r.worker;
        match r.kind {
            Kind::Probe(p) => {
                let run = &mut self.probes[p as usize];
                run.outstanding -= 1;
                run.tokens += u64::from(r.output);
                run.last_done = run.last_done.max(self.now);
                self.release(req);
                self.probe_progress(p);
            }
            Kind::Customer => {
                let first = r.first_token.unwrap_or(self.now);
                let c = Completion {
                    prompt_tokens: r.prompt,
                    output_tokens: r.output,
                    dispatched_at: Time::from_nanos(r.dispatched),
                    first_token_at: Time::from_nanos(first),
                    completed_at: Time::from_nanos(self.now),
                };
                let ttft = (first - r.arrival) as f64 / 1e9;
                let e2e = (self.now - r.arrival) as f64 / 1e9;
                let tpot = if r.output > 1 {
                    (self.now - first) as f64 / 1e9 / f64::from(r.output - 1)
                } else {
                    0.0
                };
                let queue = (r.dispatched - r.arrival) as f64 / 1e9;
                self.m.ttft.record_secs(ttft);
                self.m.e2e.record_secs(e2e);
                self.m.tpot.record_secs(tpot);
                self.m.queue.record_secs(queue);
                if ttft <= self.setup.slo.ttft_s && tpot <= self.setup.slo.tpot_s {
                    self.m.slo_met += 1;
                }
                self.m.completed += 1;
                self.m.output_tokens += u64::from(r.output);
                self.m.prompt_tokens += u64::from(r.prompt);
                self.m.cached_tokens += u64::from(r.cached);
                self.m.believed_cached_tokens += u64::from(r.believed);
                self.m.last_completion_ns = self.m.last_completion_ns.max(self.now);
                let w = &mut self.workers[worker as usize];
                w.totals.completed += 1;
                w.totals.output_tokens += u64::from(r.output);
                w.totals.ttft_sum_s += ttft;
                w.totals.e2e_sum_s += e2e;
                w.interval_tokens += u64::from(r.output);
                if let Some(id) = w.id {
                    self.router.complete(Time::from_nanos(self.now), id, &c);
                }
                self.emit(req, "ok", sink);
                let tag = self.reqs[req as usize].tag;
                self.release(req);
                let follow = traffic.on_complete(self.now, tag);
                self.schedule_follow_up(follow);
                self.drain_queue(traffic, sink);
            }
        }
    }

    fn emit(&self, req: u32, status: &'static str, sink: &mut Option<&mut dyn RequestSink>) {
        let Some(sink) = sink.as_deref_mut() else {
            return;
        };
        let r = &self.reqs[req as usize];
        let dispatched = status != "rejected";
        let first = r.first_token;
        let secs = |ns: u64| ns as f64 / 1e9;
        let row = RequestRecord {
            id: r.id,
            arrival_s: secs(r.arrival),
            worker: if dispatched {
                self.workers[r.worker as usize].totals.name.clone()
            } else {
                String::new()
            },
            prompt_tokens: r.prompt,
            output_tokens: r.output,
            queue_s: if dispatched {
                secs(r.dispatched - r.arrival)
            } else {
                0.0
            },
            ttft_s: first.map_or(f64::NAN, |f| secs(f - r.arrival)),
            e2e_s: if status == "ok" {
                secs(self.now - r.arrival)
            } else {
                f64::NAN
            },
            tpot_s: match (status, first) {
                ("ok", Some(f)) if r.output > 1 => secs(self.now - f) / f64::from(r.output - 1),
                _ => f64::NAN,
            },
            cached_tokens: r.cached,
            believed_cached_tokens: r.believed,
            affinity_kept: r.affinity_kept,
            status,
        };
        sink.record(&row);
    }

    fn drain_queue(
        &mut self,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        while self.router.queued() > 0 {
            let Some((ticket, outcome)) = self
                .router
                .dispatch_queued(Time::from_nanos(self.now), &mut self.rng)
            else {
                break;
            };
            let req = (ticket & 0xFFFF_FFFF) as u32;
            match outcome {
                Ok(d) => self.dispatched(req, d),
                Err(_) => self.reject(req, traffic, sink),
            }
        }
    }

    /// A customer request lost its worker: retry before the first token, fail after.
    fn fail(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let r = &mut self.reqs[req as usize];
        let worker = r.worker;
        match r.kind {
            Kind::Probe(p) => {
                let run = &mut self.probes[p as usize];
                run.outstanding -= 1;
                run.ok = false;
                run.last_done = run.last_done.max(self.now);
                self.release(req);
                self.probe_progress(p);
            }
            Kind::Customer => {
                self.workers[worker as usize].totals.failed += 1;
                if let Some(id) = self.workers[worker as usize].id {
                    self.router.fail(Time::from_nanos(self.now), id);
                }
                let r = &mut self.reqs[req as usize];
                if r.first_token.is_none() && r.retries < self.setup.max_retries {
                    r.retries += 1;
                    r.epoch = r.epoch.wrapping_add(1); // invalidate its in-transit events
                    self.m.retried += 1;
                    self.route(req, traffic, sink);
                } else {
                    self.m.failed += 1;
                    self.emit(req, "failed", sink);
                    let tag = self.reqs[req as usize].tag;
                    self.release(req);
                    let follow = traffic.on_complete(self.now, tag);
                    self.schedule_follow_up(follow);
                }
                self.drain_queue(traffic, sink);
            }
        }
    }

    fn register(&mut self, worker: u32) {
        let now = Time::from_nanos(self.now);
        let setup = &self.setup.workers[worker as usize];
        let w = &mut self.workers[worker as usize];
        match w.id {
            None => {
                let id = self.router.register(now, setup.spec.clone());
                w.id = Some(id);
                if self.by_id.len() <= id.index() {
                    self.by_id.resize(id.index() + 1, 0);
                }
                self.by_id[id.index()] = worker;
                if self.model.is_none() {
                    self.model = self.router.model_id(&self.setup.model);
                }
            }
            Some(id) => {
                let args = w
                    .pending_args
                    .take()
                    .unwrap_or_else(|| setup.spec.launch_args.clone());
                let current = self
                    .router
                    .fleet()
                    .get(id)
                    .map(|i| i.spec.launch_args.clone())
                    .unwrap_or_default();
                let args = if args.is_empty() { current } else { args };
                let _ = self.router.restart(now, id, &args);
            }
        }
        self.tell_oracle(worker);
        self.poll_probes();
    }

    fn tell_oracle(&mut self, worker: u32) {
        let w = &self.workers[worker as usize];
        let Some(id) = w.id else { return };
        let setup = &self.setup.workers[worker as usize];
        let cap =
            setup.profile.aggregate_tok_s(self.setup.oracle_concurrency) * w.engine.speed_factor();
        self.router
            .set_true_capacity(Time::from_nanos(self.now), id, cap);
    }

    fn lifecycle(
        &mut self,
        index: usize,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        let e = &self.setup.events[index];
        let worker = e.worker as u32;
        let now = Time::from_nanos(self.now);
        let id = self.workers[worker as usize].id;
        match e.action.clone() {
            Action::Restart {
                launch_args,
                ready_after_ns,
                register_after_ns,
                cold,
            } => {
                let failed = self.workers[worker as usize].engine.restart(
                    self.now,
                    self.now + ready_after_ns,
                    cold,
                );
                self.workers[worker as usize].up = true;
                self.workers[worker as usize].pending_args = launch_args;
                if let Some(id) = id {
                    let _ = self.router.disconnect(now, id);
                }
                self.fail_all(failed, traffic, sink);
                self.reschedule(worker);
                self.pending_lifecycle += 1;
                self.push(
                    self.now + ready_after_ns + register_after_ns,
                    Ev::Register { worker },
                );
            }
            Action::Crash => {
                let failed = self.workers[worker as usize].engine.crash(self.now);
                self.workers[worker as usize].up = false;
                if let Some(id) = id {
                    let _ = self.router.disconnect(now, id);
                }
                self.fail_all(failed, traffic, sink);
            }
            Action::Disconnect => {
                if let Some(id) = id {
                    let _ = self.router.disconnect(now, id);
                }
            }
            Action::Reconnect => {
                if let Some(id) = id {
                    let _ = self.router.reconnect(now, id);
                    self.drain_queue(traffic, sink);
                }
            }
            Action::NodeManagerRestart { keep_cache } => {
                let node = self.setup.workers[worker as usize].spec.node.clone();
                self.router.node_manager_restart(now, &node, keep_cache);
            }
            Action::Pin(w) => {
                if let Some(id) = id {
                    let _ = self.router.pin(now, id, w);
                }
            }
            Action::Unpin => {
                if let Some(id) = id {
                    let _ = self.router.unpin(now, id);
                }
            }
            Action::Reprobe => {
                if let Some(id) = id {
                    let _ = self.router.reprobe(now, id);
                }
            }
            Action::SetSpeed(f) => {
                self.workers[worker as usize]
                    .engine
                    .set_speed_factor(self.now, f);
                self.reschedule(worker);
                self.tell_oracle(worker);
            }
            Action::Remove => {
                if let Some(id) = id {
                    let _ = self.router.remove(now, id);
                }
            }
        }
        self.poll_probes();
        self.drain_queue(traffic, sink);
    }

    fn fail_all(
        &mut self,
        failed: Vec<u64>,
        traffic: &mut dyn TrafficSource,
        sink: &mut Option<&mut dyn RequestSink>,
    ) {
        for seq in failed {
            let req = seq as u32;
            if self.reqs[req as usize].live {
                self.fail(req, traffic, sink);
            }
        }
    }

    fn poll_probes(&mut self) {
        let mut orders = std::mem::take(&mut self.orders);
        self.router
            .poll_probes(Time::from_nanos(self.now), &mut orders);
        for order in orders.drain(..) {
            let worker = self.by_id[order.worker.index()];
            let p = self.probes.len() as u32;
            self.probes.push(ProbeRun {
                order,
                started: self.now,
                outstanding: order.concurrency,
                tokens: 0,
                last_done: self.now,
                ok: true,
            });
            self.m.probe_bursts += 1;
            self.workers[worker as usize].totals.probe_bursts += 1;
            let half = self.workers[worker as usize].rtt_half;
            for _ in 0..order.concurrency {
                let a = Arrival::new(self.now, order.prompt_tokens, order.output_tokens, 0);
                let req = self.alloc(Kind::Probe(p), &a);
                let r = &mut self.reqs[req as usize];
                r.worker = worker;
                r.dispatched = self.now;
                r.id = u64::MAX - 2;
                let epoch = r.epoch;
                self.push(self.now + half, Ev::Admit { req, epoch });
            }
        }
        self.orders = orders;
    }

    fn probe_progress(&mut self, p: u32) {
        let run = &self.probes[p as usize];
        if run.outstanding > 0 {
            return;
        }
        let wall = run.last_done.saturating_sub(run.started);
        self.m.probe_gpu_s += wall as f64 / 1e9;
        let result = ProbeResult {
            order: run.order.id,
            worker: run.order.worker,
            output_tokens: run.tokens,
            wall: Duration::from_nanos(wall),
            ok: run.ok,
        };
        if run.ok && run.order.phase == routelab_policies::ProbePhase::Measure {
            self.m.probe_measurements += 1;
        }
        self.router
            .probe_result(Time::from_nanos(self.now), &result);
        self.poll_probes();
    }

    fn sample(&mut self) {
        let t_s = self.now as f64 / 1e9;
        for (i, w) in self.workers.iter_mut().enumerate() {
            let (in_flight, weight, provenance) = match w.id {
                Some(id) => {
                    let info = self.router.fleet().get(id);
                    let wt = self.router.weight(id).unwrap_or_default();
                    (info.map_or(0, |i| i.in_flight), wt.value, wt.provenance)
                }
                None => (0, 0.0, Provenance::Default),
            };
            self.m.timeline.push(TimelineRow {
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
        self.m.end_ns = self.now;
        if self.m.first_arrival_ns == u64::MAX {
            self.m.first_arrival_ns = 0;
        }
        for w in &mut self.workers {
            if let Some(id) = w.id
                && let Some(wt) = self.router.weight(id)
            {
                w.totals.final_weight = wt.value;
                w.totals.final_provenance = wt.provenance;
            }
            self.m.workers.push(w.totals.clone());
        }
        self.m
    }
}
