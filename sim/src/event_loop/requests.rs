//! A request's life in the engine: arrival at the gateway, routing (or waiting in the
//! gateway's FIFO queue at the cap), the network to the worker, the engine's first token and
//! completion, and failure with retry before the first token.
//!
//! Customer requests and the requests of probe bursts share the same slots and events; only
//! their bookkeeping at the end differs ([`Kind`]). A finished customer request is counted by
//! the shared [`Recorder`](crate::record::Recorder) from an [`Outcome`].

use super::fleet::Fleet;
use super::peers::PeerOp;
use super::replicas::Replica;
use super::{Ev, Sim, SimError, Sink};
use crate::record::{Outcome, Recorder, RequestSink, Status};
use crate::traffic::{Arrival, TrafficSource};
use crate::worker::{Admission, BLOCK_TOKENS, EngineOutput};
use routelab_policies::{
    Charge, Completion, Decision, Explanation, ModelId, RouteError, RouteRequest, ShownDecision,
    Time, WorkerId,
};

/// What a request slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A customer request of the open-loop stream: its arrival reads the next one ahead.
    Open,
    /// A customer request that follows another's completion (closed loop, next turn).
    FollowUp,
    /// One request of probe burst `n` (index into the run's probe bursts).
    Probe(u32),
}

impl Kind {
    pub(super) fn is_customer(self) -> bool {
        !matches!(self, Kind::Probe(_))
    }
}

/// One request slot.
#[derive(Debug, Clone)]
pub(super) struct Req {
    /// Bumped at each reuse and retry: events of an older epoch are stale.
    pub(super) epoch: u32,
    pub(super) live: bool,
    /// Order of arrival (customers; set when it reaches the gateway).
    pub(super) id: u64,
    pub(super) kind: Kind,
    pub(super) arrival: Time,
    pub(super) prompt: u32,
    pub(super) output: u32,
    pub(super) tag: u64,
    pub(super) prefix: Vec<u64>,
    /// Fleet index of its worker, once dispatched.
    pub(super) worker: u32,
    /// The gateway replica that routes it (0 with one gateway; a probe's: the replica whose
    /// burst it belongs to is kept in the burst).
    pub(super) replica: u32,
    pub(super) dispatched: Time,
    pub(super) first_token: Option<Time>,
    pub(super) cached: u32,
    pub(super) believed: u32,
    pub(super) affinity_kept: bool,
    pub(super) retries: u32,
    /// What the router charged to its worker's signals; handed back at first token and end.
    pub(super) charge: Charge,
}

/// The request slots of a run (customers' and probe bursts'), reused through a free list, and
/// what is left of the customers.
#[derive(Debug, Default)]
pub(super) struct Requests {
    slots: Vec<Req>,
    free: Vec<u32>,
    /// Customer requests allocated and not yet finished.
    alive: u64,
    /// An open-loop arrival is read ahead and scheduled.
    open_pending: bool,
    /// The order of arrival of the next customer request to reach the gateway.
    next_id: u64,
    /// What an engine produced at its last wake-up (a reused buffer).
    outputs: Vec<EngineOutput>,
}

impl Requests {
    /// Whether an event of `req` at `epoch` is still current (the slot was neither released,
    /// reused nor retried since).
    #[inline]
    pub(super) fn valid(&self, req: u32, epoch: u32) -> bool {
        let r = &self.slots[req as usize];
        r.live && r.epoch == epoch
    }

    #[inline]
    pub(super) fn get(&self, req: u32) -> &Req {
        &self.slots[req as usize]
    }

    #[inline]
    pub(super) fn get_mut(&mut self, req: u32) -> &mut Req {
        &mut self.slots[req as usize]
    }

    /// No customer request is alive or announced: nothing customers wait for.
    #[inline]
    pub(super) fn none_waiting(&self) -> bool {
        self.alive == 0 && !self.open_pending
    }

    /// A slot for a request of `kind` arriving as `a`, at a new epoch.
    pub(super) fn alloc(&mut self, kind: Kind, a: &Arrival) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Req {
                    epoch: 0,
                    live: false,
                    id: 0,
                    kind,
                    arrival: Time::ZERO,
                    prompt: 0,
                    output: 0,
                    tag: 0,
                    prefix: Vec::new(),
                    worker: 0,
                    replica: 0,
                    dispatched: Time::ZERO,
                    first_token: None,
                    cached: 0,
                    believed: 0,
                    affinity_kept: false,
                    retries: 0,
                    charge: Charge::NONE,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let r = &mut self.slots[idx as usize];
        r.epoch = r.epoch.wrapping_add(1);
        r.live = true;
        r.id = 0;
        r.kind = kind;
        r.arrival = Time::from_nanos(a.at);
        r.prompt = a.prompt_tokens;
        r.output = a.output_tokens.max(1);
        r.tag = a.tag;
        r.prefix.clear();
        r.prefix.extend_from_slice(&a.prefix_blocks);
        r.replica = 0;
        r.first_token = None;
        r.cached = 0;
        r.believed = 0;
        r.affinity_kept = false;
        r.retries = 0;
        r.charge = Charge::NONE;
        if kind.is_customer() {
            self.alive += 1;
        }
        idx
    }

    /// The slot is free again.
    pub(super) fn release(&mut self, req: u32) {
        let r = &mut self.slots[req as usize];
        r.live = false;
        if r.kind.is_customer() {
            self.alive -= 1;
        }
        self.free.push(req);
    }

    /// The next customer's order of arrival.
    #[inline]
    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The request `req` of a route request (what the router reads of it).
    #[inline]
    fn route_request(&self, req: u32, model: ModelId) -> RouteRequest<'_> {
        let r = &self.slots[req as usize];
        RouteRequest {
            model,
            context_tokens: r.prompt.saturating_add(r.output),
            prefix: &r.prefix,
            prompt_tokens: r.prompt,
            session: None,
        }
    }
}

impl Sim<'_> {
    /// Read the next open-loop arrival ahead and schedule it.
    pub(super) fn pull_open(&mut self, traffic: &mut dyn TrafficSource) -> Result<(), SimError> {
        if let Some(a) = traffic.next_arrival()? {
            let at = Time::from_nanos(a.at).max(self.now);
            let idx = self.requests.alloc(Kind::Open, &a);
            let epoch = self.requests.get(idx).epoch;
            self.requests.open_pending = true;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
        Ok(())
    }

    fn schedule_follow_up(&mut self, a: Option<Arrival>) {
        if let Some(a) = a {
            let at = Time::from_nanos(a.at).max(self.now);
            let idx = self.requests.alloc(Kind::FollowUp, &a);
            let epoch = self.requests.get(idx).epoch;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
    }

    /// A customer request is over: release its slot and let the traffic follow up.
    fn retire(&mut self, req: u32, traffic: &mut dyn TrafficSource) {
        let tag = self.requests.get(req).tag;
        self.requests.release(req);
        let follow = traffic.on_complete(self.now.as_nanos(), tag);
        self.schedule_follow_up(follow);
    }

    /// Request `req` reaches the gateway (an open-loop one first reads the next ahead).
    pub(super) fn on_arrive(
        &mut self,
        req: u32,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) -> Result<(), SimError> {
        if self.requests.get(req).kind == Kind::Open {
            self.requests.open_pending = false;
            self.pull_open(traffic)?;
        }
        self.arrive(req, traffic, sink);
        Ok(())
    }

    fn arrive(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let id = self.requests.next_id();
        self.rec.arrived(self.now);
        // The L4 balancer: a follow-up goes where the rule sends it, like any arrival.
        let replica = self.replicas.pick(self.requests.get(req).tag);
        if self.replicas.several() {
            self.rec.metrics_mut().replicas[replica as usize].routed += 1;
        }
        let r = self.requests.get_mut(req);
        r.id = id;
        r.arrival = self.now;
        r.replica = replica;
        match self.peers.hold_ns() {
            Some(hold) if hold > 0 => {
                let epoch = self.requests.get(req).epoch;
                self.push(self.after(hold), Ev::Route { req, epoch });
            }
            _ => self.route(req, traffic, sink),
        }
    }

    /// Route `req` at its replica: dispatched, waiting in the gateway's queue, or rejected.
    pub(super) fn route(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let Some(model) = self.fleet.model else {
            self.rec.rejected_because(&RouteError::NoWorkerForModel);
            self.reject(req, traffic, sink);
            return;
        };
        let request = self.requests.route_request(req, model);
        // A retry stays with the replica that routed it first (the gateway retries).
        let replica = self
            .replicas
            .get_mut(self.requests.get(req).replica as usize);
        let routed = match sink.as_deref_mut().filter(|s| s.wants_decisions()) {
            Some(sink) => {
                let shown = Shown {
                    rec: &self.rec,
                    fleet: &self.fleet,
                    id: self.requests.get(req).id,
                };
                shown.route(replica, self.now, &request, sink)
            }
            None => replica.router.route(self.now, &request, &mut replica.rng),
        };
        match routed {
            Ok(d) => self.dispatched(req, d),
            Err(RouteError::AllAtCap { .. }) | Err(RouteError::NoHealthyWorker { .. }) => {
                // Wait at the gateway (FIFO) until a slot frees or a worker comes back. The
                // ticket is the slot alone: a waiting request is on no worker, so nothing
                // retries or retires it (its epoch cannot move) before the queue hands it back.
                replica.router.enqueue(u64::from(req), &request);
            }
            Err(e) => {
                self.rec.rejected_because(&e);
                self.reject(req, traffic, sink);
            }
        }
    }

    fn dispatched(&mut self, req: u32, d: Decision) {
        let worker = self.fleet.index_of(d.worker);
        let r = self.requests.get(req);
        // Only requests with a prefix have an overlap to regret (and cost the look-ups).
        if r.kind.is_customer() && !r.prefix.is_empty() {
            self.record_overlap_regret(req, worker);
        }
        self.rec.dispatched(worker as usize);
        let w = self.fleet.get_mut(worker);
        w.interval_dispatched += 1;
        let half = w.rtt_half;
        let now = self.now;
        let r = self.requests.get_mut(req);
        r.worker = worker;
        r.dispatched = now;
        r.believed = (d.believed_cached_blocks * BLOCK_TOKENS).min(r.prompt);
        r.affinity_kept = d.affinity_kept;
        r.charge = d.charge;
        let (epoch, from, charge) = (r.epoch, r.replica, r.charge);
        let half = half + self.peers.dispatch_delay_ns();
        if self.peers.enabled() {
            let prefix = self.peers.prefix_vec(&self.requests.get(req).prefix);
            self.publish(from, d.worker, charge, PeerOp::Dispatch { prefix });
        }
        if half == 0 {
            // No network in between: the engine sees it now (one event fewer per request).
            self.admit_now(req);
        } else {
            self.push(self.after(half), Ev::Admit { req, epoch });
        }
    }

    /// Request `req` reaches its worker.
    pub(super) fn admit(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        if !self.fleet.get(self.requests.get(req).worker).up {
            // The engine died while the request was on its way.
            self.fail(req, traffic, sink);
            return;
        }
        self.admit_now(req);
    }

    /// Hand a request to its (running) engine at the current time.
    fn admit_now(&mut self, req: u32) {
        let r = self.requests.get(req);
        let worker = r.worker;
        let (prompt, output) = (r.prompt, r.output);
        let s = Admission::new(u64::from(req), prompt, output, &r.prefix);
        self.fleet
            .get_mut(worker)
            .engine
            .admit(self.now.as_nanos(), s);
        self.reschedule(worker);
    }

    /// Worker `worker`'s engine has something to report: its first tokens and completions
    /// reach the host half a round trip after the engine produced them.
    pub(super) fn wake(
        &mut self,
        worker: u32,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) {
        let mut outputs = std::mem::take(&mut self.requests.outputs);
        self.fleet
            .get_mut(worker)
            .engine
            .advance_to(self.now.as_nanos(), &mut outputs);
        self.reschedule(worker);
        let half = self.fleet.get(worker).rtt_half;
        for out in outputs.drain(..) {
            let req = out.seq() as u32;
            let epoch = self.requests.get(req).epoch;
            let at = Time::from_nanos(out.at()).plus_nanos(half).max(self.now);
            match out {
                EngineOutput::FirstToken { cached_tokens, .. } => {
                    self.requests.get_mut(req).cached = cached_tokens;
                    if at == self.now {
                        self.first_token(req);
                    } else {
                        self.push(at, Ev::FirstToken { req, epoch });
                    }
                }
                EngineOutput::Completed(c) => {
                    self.requests.get_mut(req).cached = c.cached_tokens;
                    if at == self.now {
                        self.done(req, traffic, sink);
                    } else {
                        self.push(at, Ev::Done { req, epoch });
                    }
                }
            }
        }
        self.requests.outputs = outputs;
    }

    /// The host sees request `req`'s first token.
    pub(super) fn first_token(&mut self, req: u32) {
        let now = self.now;
        let r = self.requests.get_mut(req);
        r.first_token = Some(now);
        if r.kind.is_customer()
            && let Some(id) = self.fleet.get(r.worker).id
        {
            let (from, before) = (r.replica, r.charge);
            self.replicas
                .get_mut(r.replica as usize)
                .router
                .first_token(now, id, &mut r.charge);
            self.publish(from, id, before, PeerOp::FirstToken);
        }
    }

    /// The host sees request `req`'s last token.
    pub(super) fn done(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let r = self.requests.get(req);
        let worker = r.worker;
        if let Kind::Probe(p) = r.kind {
            let output = r.output;
            self.probe_request_ended(req, p, Some(output));
            return;
        }
        let c = Completion {
            prompt_tokens: r.prompt,
            output_tokens: r.output,
            dispatched_at: r.dispatched,
            first_token_at: r.first_token.unwrap_or(self.now),
            completed_at: self.now,
        };
        let replica = r.replica as usize;
        let charge = std::mem::take(&mut self.requests.get_mut(req).charge);
        let o = self.outcome(req, Status::Ok);
        let w = self.fleet.get_mut(worker);
        w.interval_tokens += u64::from(o.output_tokens);
        if let Some(id) = w.id {
            self.replicas
                .get_mut(replica)
                .router
                .complete(self.now, id, charge, &c);
            let op = PeerOp::Ended {
                completion: Some(c),
            };
            self.publish(replica as u32, id, charge, op);
        }
        self.record(req, &o, sink);
        self.retire(req, traffic);
        self.drain_queue(traffic, sink);
    }

    /// A request lost its worker: a customer's is retried before the first token and fails
    /// after; a probe's marks its burst failed.
    pub(super) fn fail(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let r = self.requests.get(req);
        let worker = r.worker;
        if let Kind::Probe(p) = r.kind {
            self.probe_request_ended(req, p, None);
            return;
        }
        self.rec.failed_on(worker as usize);
        let replica = r.replica as usize;
        let charge = std::mem::take(&mut self.requests.get_mut(req).charge);
        if let Some(id) = self.fleet.get(worker).id {
            self.replicas
                .get_mut(replica)
                .router
                .fail(self.now, id, charge);
            let op = PeerOp::Ended { completion: None };
            self.publish(replica as u32, id, charge, op);
        }
        let r = self.requests.get_mut(req);
        if r.first_token.is_none() && r.retries < self.setup.max_retries {
            r.retries += 1;
            r.epoch = r.epoch.wrapping_add(1); // invalidate its in-transit events
            self.rec.metrics_mut().retried += 1;
            self.route(req, traffic, sink);
        } else {
            let o = self.outcome(req, Status::Failed);
            self.record(req, &o, sink);
            self.retire(req, traffic);
        }
        self.drain_queue(traffic, sink);
    }

    /// Dispatch what waits at the gateway while the router finds room for it.
    /// Each replica has its own queue, drained in replica order.
    pub(super) fn drain_queue(&mut self, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        for r in 0..self.replicas.len() {
            while self.replicas.get(r).router.queued() > 0 {
                let replica = self.replicas.get_mut(r);
                let Some((ticket, outcome)) =
                    replica.router.dispatch_queued(self.now, &mut replica.rng)
                else {
                    break;
                };
                // The ticket is the request's slot (see `route`).
                let req = ticket as u32;
                match outcome {
                    Ok(d) => {
                        if let Some(sink) = sink.as_deref_mut().filter(|s| s.wants_decisions()) {
                            let shown = Shown {
                                rec: &self.rec,
                                fleet: &self.fleet,
                                id: self.requests.get(req).id,
                            };
                            shown.show(&Explanation::queued(d.worker), sink);
                        }
                        self.dispatched(req, d);
                    }
                    Err(e) => {
                        self.rec.rejected_because(&e);
                        self.reject(req, traffic, sink);
                    }
                }
            }
        }
    }

    fn reject(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let o = self.outcome(req, Status::Rejected);
        self.record(req, &o, sink);
        self.retire(req, traffic);
    }

    /// What the host observed of customer request `req`, ending now with `status`.
    fn outcome(&self, req: u32, status: Status) -> Outcome {
        let r = self.requests.get(req);
        let dispatched = status != Status::Rejected;
        Outcome {
            id: r.id,
            status,
            worker: dispatched.then_some(r.worker as usize),
            arrival: r.arrival,
            dispatched: dispatched.then_some(r.dispatched),
            first_token: r.first_token,
            end: self.now,
            prompt_tokens: r.prompt,
            output_tokens: r.output,
            cached_tokens: r.cached,
            believed_cached_tokens: r.believed,
            affinity_kept: r.affinity_kept,
        }
    }

    /// Count customer request `req`'s end, and write its row if rows are asked for.
    fn record(&mut self, req: u32, o: &Outcome, sink: Sink<'_, '_>) {
        self.rec.finished(o);
        if self.replicas.several() {
            let replica = self.requests.get(req).replica as usize;
            self.rec.replica_finished(replica, o);
        }
        if let Some(sink) = sink.as_deref_mut() {
            sink.record(self.rec.row(o));
        }
    }
}

/// Where a decision shown to a sink that asked for decisions names its workers: request `id`
/// of a run recorded by `rec` on `fleet`. Apart from [`Sim::route`] and never inlined into it,
/// so that the plain path a run without such a sink takes stays as small as it was.
struct Shown<'a> {
    rec: &'a Recorder,
    fleet: &'a Fleet,
    id: u64,
}

impl Shown<'_> {
    /// Route `request` at `replica` through `Router::route_explained` and hand the decision to
    /// `sink`.
    #[cold]
    #[inline(never)]
    fn route(
        &self,
        replica: &mut Replica,
        now: Time,
        request: &RouteRequest<'_>,
        sink: &mut dyn RequestSink,
    ) -> Result<Decision, RouteError> {
        let mut why = Explanation::new();
        let routed = replica
            .router
            .route_explained(now, request, &[], &mut replica.rng, &mut why);
        if routed.is_ok() {
            self.show(&why, sink);
        }
        routed
    }

    /// Hand `why`, the decision that placed the request, to `sink`, with the workers by name.
    #[cold]
    #[inline(never)]
    fn show(&self, why: &Explanation, sink: &mut dyn RequestSink) {
        let name = |w: WorkerId| {
            self.rec
                .worker_name(self.fleet.index_of(w) as usize)
                .to_string()
        };
        if let Some(shown) = ShownDecision::of(why, name) {
            sink.decision(self.id, shown);
        }
    }
}
