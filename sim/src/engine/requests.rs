//! A request's life in the engine: arrival at the gateway, routing (or waiting in the
//! gateway's FIFO queue at the cap), the network to the worker, the engine's first token and
//! completion, and failure with retry before the first token.
//!
//! Customer requests and the requests of probe bursts share the same slots and events; only
//! their bookkeeping at the end differs ([`Kind`]). A finished customer request is counted by
//! the shared [`Recorder`](crate::record::Recorder) from an [`Outcome`].

use super::{Ev, Sim, Sink};
use crate::record::{Outcome, Status};
use crate::traffic::{Arrival, TrafficSource};
use crate::worker::{BLOCK_TOKENS, EngineOutput};
use routelab_policies::{Charge, Completion, Decision, RouteError, RouteRequest, Time};

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

impl Sim<'_> {
    pub(super) fn valid(&self, req: u32, epoch: u32) -> bool {
        let r = &self.reqs[req as usize];
        r.live && r.epoch == epoch
    }

    pub(super) fn alloc(&mut self, kind: Kind, a: &Arrival) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.reqs.push(Req {
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
                (self.reqs.len() - 1) as u32
            }
        };
        let r = &mut self.reqs[idx as usize];
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

    pub(super) fn release(&mut self, req: u32) {
        let r = &mut self.reqs[req as usize];
        r.live = false;
        if r.kind.is_customer() {
            self.alive -= 1;
        }
        self.free.push(req);
    }

    /// Read the next open-loop arrival ahead and schedule it.
    pub(super) fn pull_open(
        &mut self,
        traffic: &mut dyn TrafficSource,
    ) -> Result<(), super::SimError> {
        if let Some(a) = traffic.next_arrival()? {
            let at = Time::from_nanos(a.at).max(self.now);
            let idx = self.alloc(Kind::Open, &a);
            let epoch = self.reqs[idx as usize].epoch;
            self.open_pending = true;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
        Ok(())
    }

    fn schedule_follow_up(&mut self, a: Option<Arrival>) {
        if let Some(a) = a {
            let at = Time::from_nanos(a.at).max(self.now);
            let idx = self.alloc(Kind::FollowUp, &a);
            let epoch = self.reqs[idx as usize].epoch;
            self.push(at, Ev::Arrive { req: idx, epoch });
        }
    }

    /// A customer request is over: release its slot and let the traffic follow up.
    fn retire(&mut self, req: u32, traffic: &mut dyn TrafficSource) {
        let tag = self.reqs[req as usize].tag;
        self.release(req);
        let follow = traffic.on_complete(self.now.as_nanos(), tag);
        self.schedule_follow_up(follow);
    }

    pub(super) fn arrive(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let id = self.next_id;
        self.next_id += 1;
        self.rec.arrived(self.now);
        // The L4 balancer: a follow-up goes where the rule sends it, like any arrival.
        let replica = self.balancer.pick(self.reqs[req as usize].tag);
        if self.several() {
            self.rec.metrics_mut().replicas[replica as usize].routed += 1;
        }
        let r = &mut self.reqs[req as usize];
        r.id = id;
        r.arrival = self.now;
        r.replica = replica;
        self.route(req, traffic, sink);
    }

    fn route(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let Some(model) = self.model else {
            self.rec.rejected_because(&RouteError::NoWorkerForModel);
            self.reject(req, traffic, sink);
            return;
        };
        let r = &self.reqs[req as usize];
        let request = RouteRequest {
            model,
            context_tokens: r.prompt.saturating_add(r.output),
            prefix: &r.prefix,
            prompt_tokens: r.prompt,
        };
        // A retry stays with the replica that routed it first (the gateway retries).
        let replica = &mut self.replicas[r.replica as usize];
        match replica.router.route(self.now, &request, &mut replica.rng) {
            Ok(d) => self.dispatched(req, d),
            Err(RouteError::AllAtCap { .. }) | Err(RouteError::NoHealthyWorker { .. }) => {
                // Wait at the gateway (FIFO) until a slot frees or a worker comes back.
                let ticket = (u64::from(self.reqs[req as usize].epoch) << 32) | u64::from(req);
                let r = &self.reqs[req as usize];
                let request = RouteRequest {
                    model,
                    context_tokens: r.prompt.saturating_add(r.output),
                    prefix: &r.prefix,
                    prompt_tokens: r.prompt,
                };
                self.replicas[r.replica as usize]
                    .router
                    .enqueue(ticket, &request);
            }
            Err(e) => {
                self.rec.rejected_because(&e);
                self.reject(req, traffic, sink);
            }
        }
    }

    fn dispatched(&mut self, req: u32, d: Decision) {
        let worker = self.by_id[d.worker.index()];
        let r = &self.reqs[req as usize];
        // Only requests with a prefix have an overlap to regret (and cost the look-ups).
        if r.kind.is_customer() && !r.prefix.is_empty() {
            self.record_overlap_regret(req, worker);
        }
        self.rec.dispatched(worker as usize);
        let w = &mut self.workers[worker as usize];
        w.interval_dispatched += 1;
        let half = w.rtt_half;
        let now = self.now;
        let r = &mut self.reqs[req as usize];
        r.worker = worker;
        r.dispatched = now;
        r.believed = (d.believed_cached_blocks * BLOCK_TOKENS).min(r.prompt);
        r.affinity_kept = d.affinity_kept;
        r.charge = d.charge;
        let epoch = r.epoch;
        if half == 0 {
            // No network in between: the engine sees it now (one event fewer per request).
            self.admit_now(req);
        } else {
            self.push(self.after(half), Ev::Admit { req, epoch });
        }
    }

    /// What the host observed of customer request `req`, ending now with `status`.
    fn outcome(&self, req: u32, status: Status) -> Outcome {
        let r = &self.reqs[req as usize];
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
        if self.several() {
            let replica = self.reqs[req as usize].replica as usize;
            self.rec.replica_finished(replica, o);
        }
        if let Some(sink) = sink.as_deref_mut() {
            sink.record(self.rec.row(o));
        }
    }

    fn reject(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let o = self.outcome(req, Status::Rejected);
        self.record(req, &o, sink);
        self.retire(req, traffic);
    }

    pub(super) fn admit(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        if !self.workers[self.reqs[req as usize].worker as usize].up {
            // The engine died while the request was on its way.
            self.fail(req, traffic, sink);
            return;
        }
        self.admit_now(req);
    }

    /// Hand a request to its (running) engine at the current time.
    pub(super) fn admit_now(&mut self, req: u32) {
        let r = &self.reqs[req as usize];
        let worker = r.worker;
        let (prompt, output) = (r.prompt, r.output);
        let w = &mut self.workers[worker as usize];
        w.engine.admit(
            self.now.as_nanos(),
            u64::from(req),
            prompt,
            output,
            &r.prefix,
        );
        self.reschedule(worker);
    }

    pub(super) fn wake(
        &mut self,
        worker: u32,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) {
        let mut outputs = std::mem::take(&mut self.outputs);
        self.workers[worker as usize]
            .engine
            .advance_to(self.now.as_nanos(), &mut outputs);
        self.reschedule(worker);
        let half = self.workers[worker as usize].rtt_half;
        for out in outputs.drain(..) {
            let req = out.seq() as u32;
            let epoch = self.reqs[req as usize].epoch;
            // The host sees it half a round trip after the engine produced it.
            let at = Time::from_nanos(out.at()).plus_nanos(half).max(self.now);
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

    pub(super) fn first_token(&mut self, req: u32) {
        let r = &mut self.reqs[req as usize];
        r.first_token = Some(self.now);
        if r.kind.is_customer() {
            let worker = r.worker;
            if let Some(id) = self.workers[worker as usize].id {
                self.replicas[r.replica as usize]
                    .router
                    .first_token(self.now, id, &mut r.charge);
            }
        }
    }

    pub(super) fn done(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let r = &self.reqs[req as usize];
        let worker = r.worker;
        if let Kind::Probe(p) = r.kind {
            let output = r.output;
            let run = &mut self.probes[p as usize];
            run.outstanding -= 1;
            run.tokens += u64::from(output);
            run.last_done = run.last_done.max(self.now);
            self.release(req);
            self.probe_progress(p);
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
        let charge = std::mem::take(&mut self.reqs[req as usize].charge);
        let o = self.outcome(req, Status::Ok);
        let w = &mut self.workers[worker as usize];
        w.interval_tokens += u64::from(o.output_tokens);
        if let Some(id) = w.id {
            self.replicas[replica]
                .router
                .complete(self.now, id, charge, &c);
        }
        self.record(req, &o, sink);
        self.retire(req, traffic);
        self.drain_queue(traffic, sink);
    }

    /// Dispatch what waits at the gateway while the router finds room for it.
    /// Each replica has its own queue, drained in replica order.
    pub(super) fn drain_queue(&mut self, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        for r in 0..self.replicas.len() {
            while self.replicas[r].router.queued() > 0 {
                let replica = &mut self.replicas[r];
                let Some((ticket, outcome)) =
                    replica.router.dispatch_queued(self.now, &mut replica.rng)
                else {
                    break;
                };
                let req = (ticket & 0xFFFF_FFFF) as u32;
                match outcome {
                    Ok(d) => self.dispatched(req, d),
                    Err(e) => {
                        self.rec.rejected_because(&e);
                        self.reject(req, traffic, sink);
                    }
                }
            }
        }
    }

    /// A request lost its worker: a customer's is retried before the first token and fails
    /// after; a probe's marks its burst failed.
    pub(super) fn fail(&mut self, req: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let r = &self.reqs[req as usize];
        let worker = r.worker;
        if let Kind::Probe(p) = r.kind {
            let run = &mut self.probes[p as usize];
            run.outstanding -= 1;
            run.ok = false;
            run.last_done = run.last_done.max(self.now);
            self.release(req);
            self.probe_progress(p);
            return;
        }
        self.rec.failed_on(worker as usize);
        let charge = std::mem::take(&mut self.reqs[req as usize].charge);
        if let Some(id) = self.workers[worker as usize].id {
            let replica = self.reqs[req as usize].replica as usize;
            self.replicas[replica].router.fail(self.now, id, charge);
        }
        let r = &mut self.reqs[req as usize];
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
}
