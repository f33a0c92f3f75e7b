//! What the router can know about the engines' prefix caches, and what its not knowing costs.
//!
//! **KV events.** When the policy mirrors the engines' KV events (`Router::kv_event_delay` is
//! `Some(d)`), every engine publishes them (`FluidEngine::publish_kv_events`) and the run hands
//! each worker's batch to `Router::apply_kv_events` `d` after the engine published it. A batch
//! is everything one engine mutation did to its cache (a sequence started and evicted blocks,
//! prefills passed block boundaries, a restart cleared it), drained when the mutation ends, so
//! batches of one worker arrive in the order they were published (the event queue runs equal
//! times in scheduling order). With **zero delay** a batch is applied at once, before anything
//! else happens at that instant: the router's belief then equals the engines' caches as they
//! stand at every routing decision (each engine as of its last event, which is what the
//! engine itself would use for a sequence admitted then). Batches still in flight when nothing
//! is left to route are dropped, so they never stretch the run's end.
//!
//! **Overlap regret.** At each routing decision of a customer request with a prefix, the run
//! asks every eligible worker's engine how many of the prompt's tokens it holds
//! (`FluidEngine::peek_cached_tokens`) and records the best minus the chosen worker's. Requests
//! without a prefix cost nothing.

use super::fleet::{Fleet, WorkerRt};
use super::replicas::Replicas;
use super::requests::Req;
use super::{Ev, Sim};
use crate::worker::Engine;
use routelab_policies::{KvEvent, ModelId, Router, Time, WorkerId};

/// The KV-event batches in flight, in recycled buffers (allocation-free in steady state).
pub(super) struct KvDelivery {
    /// Delay in ns; `None` when the policy does not read KV events.
    delay_ns: Option<u64>,
    batches: Vec<Vec<KvEvent>>,
    spare: Vec<u32>,
}

impl KvDelivery {
    pub(super) fn new(delay: Option<std::time::Duration>) -> Self {
        KvDelivery {
            delay_ns: delay.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            batches: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Whether the engines publish KV events in this run.
    #[inline]
    pub(super) fn enabled(&self) -> bool {
        self.delay_ns.is_some()
    }

    /// A free batch buffer (empty).
    fn take(&mut self) -> u32 {
        match self.spare.pop() {
            Some(b) => b,
            None => {
                self.batches.push(Vec::new());
                u32::try_from(self.batches.len() - 1).expect("fewer than 2^32 batches in flight")
            }
        }
    }

    /// Returns a delivered (or dropped) batch's buffer.
    pub(super) fn recycle(&mut self, batch: u32) {
        self.batches[batch as usize].clear();
        self.spare.push(batch);
    }
}

impl KvDelivery {
    /// Drains what `engine` published into a batch on its way to the router: the batch and
    /// its delay, ns (none when the engines do not publish or this one has nothing new).
    #[inline]
    pub(super) fn publish(&mut self, engine: &mut Engine) -> Option<(u32, u64)> {
        let delay = self.delay_ns?;
        if !engine.has_kv_events() {
            return None;
        }
        let batch = self.take();
        engine.drain_kv_events(&mut self.batches[batch as usize]);
        Some((batch, delay))
    }

    /// Hands a batch of the worker the router knows as `id` to every replica's router (a
    /// worker not registered yet has nobody to tell), and recycles it.
    pub(super) fn deliver(
        &mut self,
        now: Time,
        id: Option<WorkerId>,
        batch: u32,
        replicas: &mut Replicas,
    ) {
        if let Some(id) = id {
            for r in replicas.iter_mut() {
                r.router
                    .apply_kv_events(now, id, &self.batches[batch as usize]);
            }
        }
        self.recycle(batch);
    }
}

/// The overlap regret of routing request `r` (a customer's, with a prefix) to fleet worker
/// `chosen`: the most prompt tokens an eligible worker's cache holds minus the chosen one's.
/// `router` is the replica's that routed it.
pub(super) fn overlap_regret(
    r: &Req,
    model: ModelId,
    chosen: u32,
    fleet: &Fleet,
    router: &Router,
) -> u32 {
    let context_tokens = r.prompt.saturating_add(r.output);
    let known = router.fleet();
    // The router's own filter (`WorkerInfo::accepts`). The cap is left out: a worker at its
    // cap still shows what the request could have reused.
    let eligible = |w: &WorkerRt| {
        w.id.and_then(|id| known.get(id))
            .is_some_and(|info| info.accepts(model, context_tokens))
    };
    let best = fleet
        .workers
        .iter()
        .filter(|w| eligible(w))
        .map(|w| w.engine.peek_cached_tokens(r.prompt, &r.prefix))
        .max()
        .unwrap_or(0);
    let got = fleet
        .get(chosen)
        .engine
        .peek_cached_tokens(r.prompt, &r.prefix);
    best.saturating_sub(got)
}

impl Sim<'_> {
    /// Sends what `worker`'s engine published on its way to the router: at once with zero
    /// delay, else as a [`Ev::KvEvents`] event.
    pub(super) fn publish_kv_events(&mut self, worker: u32) {
        let engine = &mut self.fleet.get_mut(worker).engine;
        let Some((batch, delay)) = self.kv.publish(engine) else {
            return;
        };
        if delay == 0 {
            self.deliver_kv_events(worker, batch);
        } else {
            self.push(self.after(delay), Ev::KvEvents { worker, batch });
        }
    }

    /// Hands a batch to every replica's router.
    pub(super) fn deliver_kv_events(&mut self, worker: u32, batch: u32) {
        let id = self.fleet.get(worker).id;
        self.kv.deliver(self.now, id, batch, &mut self.replicas);
    }

    /// Records the overlap regret of routing customer request `req` (with a prefix) to fleet
    /// worker `chosen`.
    pub(super) fn record_overlap_regret(&mut self, req: u32, chosen: u32) {
        let Some(model) = self.fleet.model else {
            return;
        };
        let r = self.requests.get(req);
        let replica = r.replica as usize;
        let router = &self.replicas.get(replica).router;
        let regret = overlap_regret(r, model, chosen, &self.fleet, router);
        self.rec.overlap_regret(regret);
        if self.replicas.several() {
            self.rec.metrics_mut().replicas[replica]
                .overlap_regret
                .record(u64::from(regret));
        }
    }
}
