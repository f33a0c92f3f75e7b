//! The router: filters, prefix affinity, chooser and caps over the live fleet.

use crate::capacity::Capacities;
use crate::chooser::Chooser;
use crate::chooser::Hot;
use crate::config::{Affinity, AffinityUnits, Cap, PolicyConfig, PrefixKnowledge};
use crate::error::{AdminError, RouteError};
use crate::explain::{Explanation, Observe, Predicted, Scored};
use crate::load_index::{LoadIndex, affinity_load};
use crate::prefix::PrefixIndex;
use crate::rules::RuleCtx;
use crate::signals::{Charge, PREFIX_BLOCK_TOKENS, Signals};
use crate::time::Time;
use crate::weights::{
    Completion, PersistedProbeState, ProbeOrder, ProbeResult, WeightChange, WeightEvent,
    WeightStrategy,
};
use crate::worker::{Fleet, ModelId, Weight, WorkerId, WorkerInfo, WorkerSpec, WorkerState};
use rand::Rng;
use std::collections::{HashMap, VecDeque};

mod capacity;
mod engines;
mod lifecycle;
mod weights;

pub use lifecycle::DEFAULT_REPLICA_SPREAD_S;

/// What the host knows about a request when routing it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Model, interned with [`Router::model_id`].
    pub model: ModelId,
    /// Tokens the context window must hold (prompt, plus reserved output if the host wants).
    pub context_tokens: u32,
    /// Prefix-block chain hashes of the prompt (may be empty).
    pub prefix: &'a [u64],
    /// Prompt tokens (0 when the host does not know them: the field's rules then see no
    /// prefix match and charge nothing to the worker's token counters).
    pub prompt_tokens: u32,
    /// The request's session (a hash of its key), when the host knows it.
    pub session: Option<u64>,
}

/// The router's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Where the request goes.
    pub worker: WorkerId,
    /// Leading prefix blocks the router believes the chosen worker holds.
    pub believed_cached_blocks: u32,
    /// True when the prefix holder was kept over the chooser's pick.
    pub affinity_kept: bool,
    /// What the request added to the worker's local signals: keep it with the request and hand
    /// it back to [`Router::first_token`], [`Router::complete`] or [`Router::fail`].
    pub charge: Charge,
}

#[derive(Debug, Clone, Default)]
struct ModelEntry {
    name: String,
    /// Routable workers, sorted by context window, largest first (ties by id).
    members: Vec<u32>,
    /// `members`' context windows, same order.
    windows: Vec<u32>,
    /// Members below their cap, kept in step with every change of a member's in-flight count,
    /// cap or membership (never recounted on the request path).
    free: u32,
    /// The members' affinity loads, for the freest candidate (only with a prefix affinity).
    loads: LoadIndex,
    /// Largest window among the model's registered (not removed) workers, connected or not.
    largest_registered_window: u32,
    /// Round-robin cursor.
    cursor: usize,
    /// `Router::position` no longer matches `members` (a member joined or left) for a chooser
    /// that reads it without a load index (`predictive`'s prefix holder).
    positions_stale: bool,
}

#[derive(Debug, Clone)]
struct Queued {
    ticket: u64,
    model: ModelId,
    context_tokens: u32,
    prefix: Vec<u64>,
    prompt_tokens: u32,
    session: Option<u64>,
}

/// The routing policy in action: one per gateway (or per simulated gateway).
///
/// `Router` is `Send` but not `Sync`-shared mutably: a multi-threaded host wraps it in a
/// `Mutex` (a decision takes well under a microsecond, so one lock is not a bottleneck at the
/// request rates of an inference gateway) and keeps an RNG per router, or shards by model.
#[derive(Debug)]
pub struct Router {
    config: PolicyConfig,
    fleet: Fleet,
    hot: Vec<Hot>,
    models: Vec<ModelEntry>,
    model_ids: HashMap<String, ModelId>,
    strategy: Box<dyn WeightStrategy>,
    /// The strategy's [`WeightStrategy::observes_requests`], read once: the request path feeds
    /// it nothing when false.
    feeds_requests: bool,
    prefix: PrefixIndex,
    wrr_current: Vec<f64>,
    queue: VecDeque<Queued>,
    /// Router-local signals the field's rules read, apart from `hot` so the other choosers'
    /// scans are unchanged.
    signals: Vec<Signals>,
    /// The prefix affinity's units when the policy has one: the models' load indexes are kept
    /// only then.
    affinity_units: Option<AffinityUnits>,
    /// Each worker's position in its model's `members` (meaningful while it is routable and its
    /// model's load index is not stale).
    position: Vec<u32>,
    /// Each worker's measured prefill speed and decode curve: fed from completions only when
    /// the chooser reads them (`predictive`), so every other policy pays nothing.
    capacity: Capacities,
    /// [`Chooser::measures_capacity`], read once.
    measures_capacity: bool,
}

impl Router {
    /// A router for a validated policy.
    pub fn new(config: PolicyConfig) -> Router {
        let strategy = config.weights.build();
        let blocks = match config.affinity {
            // The field's rules carry their own prefix preference and need the index.
            Affinity::None if config.chooser.reads_prefixes() => Affinity::DEFAULT_INDEX_BLOCKS,
            Affinity::None => 0,
            Affinity::Prefix { index_blocks, .. } => index_blocks,
        };
        // The field's rules compare a match with the prompt (cache-aware's 50 %, llm-d's 80 %):
        // they get exact match lengths; the other policies keep the sparse index.
        let dense = config.chooser.is_peer_rule();
        let prefix = match config.knowledge {
            // Nothing reads it: a disabled index.
            _ if blocks == 0 => PrefixIndex::new(0),
            PrefixKnowledge::Unbounded if dense => PrefixIndex::dense(blocks),
            PrefixKnowledge::Unbounded => PrefixIndex::new(blocks),
            PrefixKnowledge::KvEvents { .. } => PrefixIndex::mirrored(),
            _ => PrefixIndex::approximate(blocks, dense),
        };
        let affinity_units = match config.affinity {
            Affinity::Prefix { units, .. } => Some(units),
            Affinity::None => None,
        };
        let config_measures = config.chooser.measures_capacity();
        Router {
            config,
            fleet: Fleet::default(),
            hot: Vec::new(),
            models: Vec::new(),
            model_ids: HashMap::new(),
            feeds_requests: strategy.observes_requests(),
            strategy,
            prefix,
            wrr_current: Vec::new(),
            queue: VecDeque::new(),
            signals: Vec::new(),
            affinity_units,
            position: Vec::new(),
            capacity: Capacities::default(),
            measures_capacity: config_measures,
        }
    }

    /// The policy.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Every worker the router has seen.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The weight strategy (for reports: curves, throughputs).
    pub fn strategy(&self) -> &dyn WeightStrategy {
        self.strategy.as_ref()
    }

    /// Restore the weight strategy's durable state (probe cache and pins), as saved from
    /// [`WeightStrategy::export_state`] by a host that restarted. Call it before registering
    /// workers: a worker registered afterwards adopts a fresh cached measurement (no new probe)
    /// and its pin. Strategies without durable state ignore it.
    pub fn import_state(&mut self, state: PersistedProbeState) {
        self.strategy.import_state(state);
    }

    /// Interned id of a model name, if any worker ever served it.
    pub fn model_id(&self, model: &str) -> Option<ModelId> {
        self.model_ids.get(model).copied()
    }

    /// The name of an interned model (for messages: [`RouteError::with_model`]).
    pub fn model_name(&self, model: ModelId) -> Option<&str> {
        self.models.get(model.0 as usize).map(|m| m.name.as_str())
    }

    /// Names of models with at least one routable worker, sorted.
    pub fn models(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .models
            .iter()
            .filter(|m| !m.members.is_empty())
            .map(|m| m.name.as_str())
            .collect();
        v.sort_unstable();
        v
    }

    /// Current weight of a worker.
    pub fn weight(&self, id: WorkerId) -> Option<Weight> {
        self.fleet
            .get(id)
            .map(|_| self.strategy.weight(id, &self.fleet))
    }

    /// Every worker's current weight, by id: what [`Router::weight`] answers for each worker of
    /// the fleet, in one pass (one call into the strategy when it keeps its weights in one
    /// slice, instead of one per worker).
    pub fn weights(&self) -> impl ExactSizeIterator<Item = Weight> + '_ {
        strategy_weights(self.strategy.as_ref(), &self.fleet)
    }

    /// Current concurrency cap of a worker (`u32::MAX` when uncapped).
    pub fn cap(&self, id: WorkerId) -> Option<u32> {
        self.hot.get(id.index()).map(|h| h.cap)
    }

    /// Requests waiting at the gateway.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    // ----- the request path ----------------------------------------------------------------

    /// Choose a worker for a request and count it in flight. Never allocates.
    pub fn route<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        req: &RouteRequest<'_>,
        rng: &mut R,
    ) -> Result<Decision, RouteError> {
        let mut decision = self.choose(req, rng, &mut ())?;
        self.dispatch(now, &mut decision, req.prefix);
        Ok(decision)
    }

    /// [`Router::route_excluding`], explained: `why` is filled with the chosen worker, the
    /// runner-up and the scores the chooser compared them by, as the decision computed them
    /// ([`Explanation`]). The decision is the one [`Router::route_excluding`] makes from the
    /// same state and draws.
    pub fn route_explained<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        req: &RouteRequest<'_>,
        exclude: &[WorkerId],
        rng: &mut R,
        why: &mut Explanation,
    ) -> Result<Decision, RouteError> {
        *why = Explanation::new();
        let decision = self.route_with(now, req, exclude, rng, why)?;
        why.finish(decision.worker, decision.affinity_kept);
        Ok(decision)
    }

    /// [`Router::route`] among the eligible workers other than `exclude`: for a host that
    /// retries a request on another worker after one failed before the first byte. The
    /// excluded workers count as full for this one decision, so every chooser, the prefix
    /// affinity and the cap logic skip them; when no other worker can take the request the
    /// answer is [`RouteError::AllAtCap`]. Allocates only when `exclude` is not empty.
    pub fn route_excluding<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        req: &RouteRequest<'_>,
        exclude: &[WorkerId],
        rng: &mut R,
    ) -> Result<Decision, RouteError> {
        self.route_with(now, req, exclude, rng, &mut ())
    }

    /// [`Router::route_excluding`] reporting the chooser's scores to `why`.
    fn route_with<R: Rng + ?Sized, O: Observe>(
        &mut self,
        now: Time,
        req: &RouteRequest<'_>,
        exclude: &[WorkerId],
        rng: &mut R,
        why: &mut O,
    ) -> Result<Decision, RouteError> {
        if exclude.is_empty() || self.models.get(req.model.0 as usize).is_none() {
            let mut decision = self.choose(req, rng, why)?;
            self.dispatch(now, &mut decision, req.prefix);
            return Ok(decision);
        }
        let saved: Vec<(usize, u32)> = exclude
            .iter()
            .filter(|id| id.index() < self.hot.len())
            .map(|id| (id.index(), self.hot[id.index()].in_flight))
            .collect();
        for &(i, _) in &saved {
            let cap = self.hot[i].cap;
            self.set_in_flight(i, cap);
        }
        let outcome = self.choose(req, rng, why);
        // Reverse order restores the true count even when an id is listed twice.
        for &(i, in_flight) in saved.iter().rev() {
            self.set_in_flight(i, in_flight);
        }
        let mut decision = outcome?;
        self.dispatch(now, &mut decision, req.prefix);
        Ok(decision)
    }

    /// What the chooser would score `worker` for `req` in the router's current state: its
    /// load score, or `predictive`'s prediction; `None` for a chooser that reports no scores
    /// or a worker that is not routable for the request's model. A recomputation, for tests
    /// and diagnostics: no decision calls it ([`Router::route_explained`] reports the scores
    /// the decision itself compared).
    pub fn score_of(&self, req: &RouteRequest<'_>, worker: WorkerId) -> Option<Scored> {
        let h = self.hot.get(worker.index())?;
        if !h.routable || h.model != req.model.0 {
            return None;
        }
        let (score, predicted) = match self.config.chooser {
            Chooser::Predictive(ref p) => {
                let ctx = RuleCtx {
                    prompt_tokens: req.prompt_tokens,
                    prefix: req.prefix,
                    holder: self.prefix.longest(req.prefix),
                    signals: &self.signals,
                    index: &self.prefix,
                    capacity: &self.capacity,
                    holder_pos: None,
                };
                let pr = crate::predictive::predict(&ctx, worker.0, h, p);
                let predicted = Predicted {
                    ttft_s: pr.ttft_s,
                    tpot_s: pr.tpot_s,
                    objective: pr.score,
                    harm: pr.harm,
                };
                (pr.score, Some(predicted))
            }
            c if c.ties().is_some() => (c.score(h.in_flight, h.weight), None),
            _ => return None,
        };
        Some(Scored {
            worker,
            score,
            predicted,
        })
    }

    /// A request's first token reached the host: its uncached prompt tokens are released
    /// (`charge.uncached` becomes 0, so a later completion or failure does not release them
    /// twice).
    pub fn first_token(&mut self, now: Time, id: WorkerId, charge: &mut Charge) {
        if id.index() < self.hot.len() {
            self.signals[id.index()].release_uncached(charge);
            self.feed_request(now, WeightEvent::FirstToken(id));
        }
    }

    /// A request completed; its slot and its charge are free again.
    pub fn complete(&mut self, now: Time, id: WorkerId, charge: Charge, completion: &Completion) {
        if self.measures_capacity {
            self.learn_capacity(id, charge, completion);
        }
        if self.release_slot(id, charge) {
            // Pulsar's ring weight: the peak input tokens/s observed on the worker.
            let ttft = (completion.first_token_at - completion.dispatched_at).as_secs_f64();
            if ttft > 0.0 && completion.prompt_tokens > 0 {
                let s = &mut self.signals[id.index()];
                s.peak_input_tok_s = s
                    .peak_input_tok_s
                    .max(f64::from(completion.prompt_tokens) / ttft);
            }
            self.feed_request(now, WeightEvent::Completed(id, completion));
        }
    }

    /// A request failed; its slot and its charge are free again.
    pub fn fail(&mut self, now: Time, id: WorkerId, charge: Charge) {
        if self.release_slot(id, charge) {
            self.feed_request(now, WeightEvent::Failed(id));
        }
    }

    /// Queue a request that got [`RouteError::AllAtCap`] (FIFO).
    pub fn enqueue(&mut self, ticket: u64, req: &RouteRequest<'_>) {
        self.queue.push_back(Queued {
            ticket,
            model: req.model,
            context_tokens: req.context_tokens,
            prefix: req.prefix.to_vec(),
            prompt_tokens: req.prompt_tokens,
            session: req.session,
        });
    }

    /// Remove a queued request (timed out, client gone). True if it was queued.
    pub fn cancel(&mut self, ticket: u64) -> bool {
        match self.queue.iter().position(|q| q.ticket == ticket) {
            Some(i) => {
                self.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// Dispatch the oldest queued request that can go now, if any: call after every completion
    /// (and again while it returns `Some`). A request whose model has vanished comes back with
    /// its error so the host can answer it.
    pub fn dispatch_queued<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        rng: &mut R,
    ) -> Option<(u64, Result<Decision, RouteError>)> {
        for i in 0..self.queue.len() {
            let (model, context_tokens, prompt_tokens, session) = (
                self.queue[i].model,
                self.queue[i].context_tokens,
                self.queue[i].prompt_tokens,
                self.queue[i].session,
            );
            if self
                .models
                .get(model.0 as usize)
                .is_some_and(|m| m.free == 0 && !m.members.is_empty())
            {
                continue;
            }
            // Borrow the prefix out of the queue while routing (no copy).
            let prefix = std::mem::take(&mut self.queue[i].prefix);
            let req = RouteRequest {
                model,
                context_tokens,
                prefix: &prefix,
                prompt_tokens,
                session,
            };
            let outcome = self.choose(&req, rng, &mut ());
            self.queue[i].prefix = prefix;
            match outcome {
                Err(RouteError::AllAtCap { .. }) | Err(RouteError::NoHealthyWorker { .. }) => {
                    continue;
                }
                other => {
                    let q = self.queue.remove(i).expect("index in range");
                    let mut other = other;
                    if let Ok(d) = &mut other {
                        self.dispatch(now, d, &q.prefix);
                    }
                    return Some((q.ticket, other));
                }
            }
        }
        None
    }

    // ----- internals -------------------------------------------------------------------------

    fn choose<R: Rng + ?Sized, O: Observe>(
        &mut self,
        req: &RouteRequest<'_>,
        rng: &mut R,
        why: &mut O,
    ) -> Result<Decision, RouteError> {
        let Some(entry) = self.models.get(req.model.0 as usize) else {
            return Err(RouteError::NoWorkerForModel);
        };
        if entry.members.is_empty() {
            return Err(RouteError::NoHealthyWorker { model: req.model });
        }
        let k = eligible(&entry.windows, req.context_tokens);
        if k == 0 {
            // A worker that could hold it exists but is not connected now: that is a transient
            // 503, not a 400 the client would never retry.
            if entry.largest_registered_window >= req.context_tokens {
                return Err(RouteError::NoHealthyWorker { model: req.model });
            }
            return Err(RouteError::PromptTooLong {
                tokens: req.context_tokens,
                largest_window: entry.largest_registered_window,
            });
        }
        if entry.free == 0 {
            return Err(RouteError::AllAtCap { model: req.model });
        }
        // One lookup serves both the affinity rule and the believed-cached figure.
        let remembered = self.prefix.longest(req.prefix);
        // Prefix affinity: keep the holder unless it is much busier than the freest candidate.
        if let Affinity::Prefix {
            units, allowance, ..
        } = self.config.affinity
            && let Some((holder, blocks)) = remembered
        {
            let h = self.hot[holder.index()];
            if h.routable
                && h.model == req.model.0
                && h.context_window >= req.context_tokens
                && h.in_flight < h.cap
            {
                // The freest candidate among `members[..k]`, from the model's load index
                // (exactly the minimum a scan of the candidates finds: see `load_index`).
                self.fresh_loads(req.model.0);
                let freest = self.models[req.model.0 as usize].loads.prefix_min(k);
                if affinity_load(&h, units) - freest <= allowance.at(req.context_tokens) {
                    return Ok(Decision {
                        worker: holder,
                        believed_cached_blocks: blocks as u32,
                        affinity_kept: true,
                        charge: charge_of(req.prompt_tokens, blocks),
                    });
                }
            }
        }

        // `predictive` scores the prefix holder beside its sampled candidates: its position
        // among them, from the positions kept per member (refreshed after a membership change).
        let holder_pos = match remembered {
            Some((w, _)) if self.measures_capacity => self.holder_position(req.model.0, w, k),
            _ => None,
        };
        let hot = &self.hot;
        let (signals, index, capacity) = (&self.signals, &self.prefix, &self.capacity);
        let ctx = || RuleCtx {
            prompt_tokens: req.prompt_tokens,
            prefix: req.prefix,
            holder: remembered,
            signals,
            index,
            capacity,
            holder_pos,
        };
        let entry = &mut self.models[req.model.0 as usize];
        let pick = self.config.chooser.pick(
            &entry.members[..k],
            hot,
            &mut entry.cursor,
            &mut self.wrr_current,
            ctx,
            rng,
            why,
        );
        let Some(pos) = pick else {
            return Err(RouteError::AllAtCap { model: req.model });
        };
        let worker = WorkerId(entry.members[pos]);
        let believed = match remembered {
            Some((w, b)) if w == worker => b,
            None => 0,
            // Another worker may hold the prefix too (only `kv-events` knows several holders).
            Some(_) => self.prefix.match_besides_holder(req.prefix, worker),
        };
        Ok(Decision {
            worker,
            believed_cached_blocks: believed as u32,
            affinity_kept: false,
            charge: charge_of(req.prompt_tokens, believed),
        })
    }

    /// The prefix holder's position among the first `k` members of `model`, if it is one of
    /// them (positions refreshed after a membership change). Out of line, for `predictive`.
    #[inline(never)]
    fn holder_position(&mut self, model: u32, holder: WorkerId, k: usize) -> Option<usize> {
        let entry = &mut self.models[model as usize];
        if entry.positions_stale {
            for (pos, &i) in entry.members.iter().enumerate() {
                self.position[i as usize] = pos as u32;
            }
            entry.positions_stale = false;
        }
        let h = &self.hot[holder.index()];
        let pos = self.position[holder.index()] as usize;
        (h.routable && h.model == model && pos < k).then_some(pos)
    }

    fn dispatch(&mut self, now: Time, d: &mut Decision, prefix: &[u64]) {
        let id = d.worker;
        if self.measures_capacity {
            self.note_dispatch(d);
        }
        self.signals[id.index()].charge(d.charge);
        let in_flight = self.hot[id.index()].in_flight + 1;
        self.set_in_flight(id.index(), in_flight);
        self.fleet.workers[id.index()].in_flight += 1;
        if !prefix.is_empty() {
            self.prefix.record(prefix, id);
        }
        self.feed_request(now, WeightEvent::Dispatched(id));
    }

    /// Decrement in-flight and release the charge; false if the id is unknown or nothing was
    /// in flight.
    fn release_slot(&mut self, id: WorkerId, charge: Charge) -> bool {
        let Some(h) = self.hot.get(id.index()) else {
            return false;
        };
        // This router's own count (the hot count may include other replicas' requests, see
        // `set_remote_in_flight`).
        if self.fleet.workers[id.index()].in_flight == 0 {
            return false;
        }
        self.signals[id.index()].release(charge);
        self.set_in_flight(id.index(), h.in_flight - 1);
        self.fleet.workers[id.index()].in_flight -= 1;
        true
    }

    /// Set a worker's in-flight count in `hot`, keeping its model's free count and load index
    /// in step.
    /// Always inlined: it runs twice per request (dispatch and release), and as a call its
    /// register saves cost as much as its work.
    #[inline(always)]
    fn set_in_flight(&mut self, i: usize, in_flight: u32) {
        let was_open = self.hot[i].open();
        self.hot[i].in_flight = in_flight;
        self.member_changed(i, was_open);
    }

    /// Worker `i`'s in-flight count, cap or weight changed (it was below its cap before when
    /// `was_open`): update its model's free count and its load in the index, if it is a member.
    /// Always inlined: it runs twice per request, and a call cost a third of its work.
    #[inline(always)]
    fn member_changed(&mut self, i: usize, was_open: bool) {
        let h = self.hot[i];
        // Members are exactly the routable workers.
        if !h.routable {
            return;
        }
        let entry = &mut self.models[h.model as usize];
        match (was_open, h.open()) {
            (true, false) => entry.free -= 1,
            (false, true) => entry.free += 1,
            _ => {}
        }
        if let Some(units) = self.affinity_units
            && !entry.loads.is_stale()
        {
            entry
                .loads
                .set(self.position[i] as usize, affinity_load(&h, units));
        }
    }

    /// Rebuild `model`'s load index if its members or many loads changed since the last query.
    fn fresh_loads(&mut self, model: u32) {
        let Some(units) = self.affinity_units else {
            return;
        };
        let entry = &mut self.models[model as usize];
        if !entry.loads.is_stale() {
            return;
        }
        for (pos, &i) in entry.members.iter().enumerate() {
            self.position[i as usize] = pos as u32;
        }
        let hot = &self.hot;
        entry.loads.rebuild(
            entry
                .members
                .iter()
                .map(|&i| affinity_load(&hot[i as usize], units)),
        );
    }

    /// [`Router::feed`] for the request path's events, which most strategies ignore.
    #[inline]
    fn feed_request(&mut self, now: Time, event: WeightEvent<'_>) {
        if self.feeds_requests {
            self.feed(now, event);
        }
    }

    fn feed(&mut self, now: Time, event: WeightEvent<'_>) {
        match self.strategy.observe(now, event, &self.fleet) {
            WeightChange::None => {}
            WeightChange::One(id) => self.refresh_weight(id),
            WeightChange::All => self.refresh_all_weights(),
        }
    }

    /// Apply the strategy's current weight of `id` and the cap it implies, keeping its model's
    /// free count and load index in step.
    fn refresh_weight(&mut self, id: WorkerId) {
        let was_open = self.hot[id.index()].open();
        let w = usable_weight(self.strategy.weight(id, &self.fleet).value);
        let h = &mut self.hot[id.index()];
        h.weight = w;
        h.cap = cap_of(self.config.cap, w);
        self.member_changed(id.index(), was_open);
    }
}

/// Every worker's weight from `strategy`, by id: its slice where it keeps one, else one call
/// per worker (what [`Router::weights`] answers and a whole-fleet refresh applies).
fn strategy_weights<'a>(
    strategy: &'a dyn WeightStrategy,
    fleet: &'a Fleet,
) -> impl ExactSizeIterator<Item = Weight> + 'a {
    let kept = strategy.weights().unwrap_or(&[]);
    (0..fleet.len()).map(move |i| match kept.get(i) {
        Some(w) => *w,
        None => strategy.weight(WorkerId(i as u32), fleet),
    })
}

/// The weight the router routes with for the strategy's `w`.
#[inline]
fn usable_weight(w: f64) -> f64 {
    // The strategy promises finite and positive; the router never divides by zero anyway.
    if w.is_finite() && w > 0.0 { w } else { 1e-6 }
}

/// The concurrency cap of a worker of (usable) weight `w`: it depends on nothing else.
#[inline]
fn cap_of(cap: Cap, w: f64) -> u32 {
    match cap {
        Cap::None => u32::MAX,
        Cap::Flat(n) => n,
        Cap::Weighted(n) => ((f64::from(n) * w).round() as u32).max(1),
    }
}

/// How many of a model's members (sorted by context window, largest first) hold
/// `context_tokens`: the eligible ones are `members[..k]`. All of them when the smallest window
/// does (the usual case, a fleet of one window), without a binary search.
#[inline]
fn eligible(windows: &[u32], context_tokens: u32) -> usize {
    match windows.last() {
        Some(&smallest) if smallest >= context_tokens => windows.len(),
        _ => windows.partition_point(|&w| w >= context_tokens),
    }
}

/// What a request adds to its worker's signals: its prompt, and the part of it the router does
/// not believe cached.
#[inline]
fn charge_of(prompt_tokens: u32, believed_blocks: usize) -> Charge {
    let cached = (believed_blocks as u64).saturating_mul(u64::from(PREFIX_BLOCK_TOKENS));
    Charge {
        tokens: prompt_tokens,
        uncached: prompt_tokens - cached.min(u64::from(prompt_tokens)) as u32,
        ..Charge::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Provenance;
    use rand::SeedableRng;
    use std::time::Duration;

    fn spec(name: &str) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            node: name.into(),
            model: "m".into(),
            gpu_names: vec![],
            context_window: 8192,
            launch_args: "--a".into(),
            cache_blocks: None,
        }
    }

    /// A 10-token request without prefix for model "m" of `r`.
    fn plain_request(r: &Router) -> RouteRequest<'static> {
        RouteRequest {
            model: r.model_id("m").unwrap(),
            context_tokens: 10,
            prefix: &[],
            prompt_tokens: 10,
            session: None,
        }
    }

    /// A removed worker that comes back takes its old slot: routable again, nothing new
    /// registered, its in-flight request still released; only a removed worker can be revived.
    #[test]
    fn a_revived_worker_reuses_its_slot() {
        let mut r = Router::new(PolicyConfig::from_name("equal/p2c/no-affinity/flat:4").unwrap());
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(1);
        let a = r.register(Time::ZERO, spec("a"));
        assert!(r.revive(Time::ZERO, a, "--a").is_err(), "a live worker");
        let held = r.route(Time::ZERO, &plain_request(&r), &mut rng).unwrap();
        r.remove(Time::ZERO, a).unwrap();
        assert!(r.route(Time::ZERO, &plain_request(&r), &mut rng).is_err());
        r.revive(Time::ZERO, a, "--b").unwrap();
        assert_eq!(r.fleet().iter().count(), 1, "no new slot");
        let info = r.fleet().get(a).unwrap();
        assert_eq!((info.state, info.in_flight), (WorkerState::Up, 1));
        assert_eq!(info.spec.launch_args, "--b");
        let d = r.route(Time::ZERO, &plain_request(&r), &mut rng).unwrap();
        assert_eq!(d.worker, a);
        r.fail(Time::ZERO, a, held.charge);
        r.fail(Time::ZERO, a, d.charge);
        assert_eq!(r.fleet().get(a).unwrap().in_flight, 0);
        assert!(
            r.revive(Time::ZERO, WorkerId(7), "").is_err(),
            "an unknown id"
        );
    }

    #[test]
    fn imported_state_restores_pins_and_cached_measurements() {
        let mut first = Router::new(PolicyConfig::preset("seed-v3").unwrap());
        let a = first.register(Time::ZERO, spec("a"));
        let b = first.register(Time::ZERO, spec("b"));
        let mut orders = Vec::new();
        // Warm-up then measurement for both workers.
        for _ in 0..2 {
            orders.clear();
            first.poll_probes(Time::ZERO, &mut orders);
            for o in &orders {
                let tokens = if o.worker == a { 1_000 } else { 500 };
                let r = ProbeResult {
                    order: o.id,
                    worker: o.worker,
                    output_tokens: tokens,
                    prompt_tokens: 0,
                    wall: Duration::from_secs(1),
                    ok: true,
                };
                first.probe_result(Time::ZERO, &r);
            }
        }
        first.pin(Time::ZERO, b, 2.5).unwrap();
        let saved = first.strategy().export_state().unwrap();

        let mut second = Router::new(PolicyConfig::preset("seed-v3").unwrap());
        second.import_state(saved);
        let a2 = second.register(Time::from_nanos(1), spec("a"));
        let b2 = second.register(Time::from_nanos(1), spec("b"));
        assert_eq!(second.weight(a2).unwrap().provenance, Provenance::Measured);
        let pinned = second.weight(b2).unwrap();
        assert_eq!((pinned.value, pinned.provenance), (2.5, Provenance::Pinned));
        // The cached measurement means no new probe is ordered.
        orders.clear();
        second.poll_probes(Time::from_nanos(2), &mut orders);
        assert!(orders.iter().all(|o| o.worker != a2), "{orders:?}");
    }

    /// Answer every probe order polled now, `tok_s(worker)` tokens in one second.
    fn answer_probes(r: &mut Router, now: Time, tok_s: impl Fn(WorkerId) -> u64) {
        let mut orders = Vec::new();
        r.poll_probes(now, &mut orders);
        for o in orders {
            let result = ProbeResult {
                order: o.id,
                worker: o.worker,
                output_tokens: tok_s(o.worker),
                prompt_tokens: 0,
                wall: Duration::from_secs(1),
                ok: true,
            };
            r.probe_result(now, &result);
        }
    }

    /// A whole-fleet re-derivation applies only the weights that moved, yet leaves every cap
    /// and free count as applying them all would: the weighted caps fill exactly.
    #[test]
    fn whole_fleet_weight_changes_keep_caps_and_free_counts_exact() {
        let mut r = Router::new(
            PolicyConfig::from_name("probe/p2c:higher-weight/no-affinity/weighted:4").unwrap(),
        );
        let ids = ["a", "b", "c"].map(|n| r.register(Time::ZERO, spec(n)));
        let speed = |id: WorkerId| [400, 800, 1_600][id.index()];
        answer_probes(&mut r, Time::ZERO, speed); // warm-up bursts: nothing measured
        answer_probes(&mut r, Time::ZERO, speed);
        // a alone: 400 / 400 = 1.0, no move; with b: median 600, two moves; with c: median
        // 800, weights 0.5, 1, 2, three moves.
        let weights = ids.map(|id| r.weight(id).unwrap().value);
        assert_eq!(weights, [0.5, 1.0, 2.0]);
        assert_eq!(ids.map(|id| r.cap(id).unwrap()), [2, 4, 8]);
        // The one-pass read answers what the per-worker one does.
        let all: Vec<Weight> = r.weights().collect();
        assert_eq!(all, ids.map(|id| r.weight(id).unwrap()));
        // Nothing moves at a tick.
        r.tick(Time::ZERO);
        assert_eq!(ids.map(|id| r.weight(id).unwrap().value), weights);
        // The free counts follow the caps: exactly 2 + 4 + 8 requests fit.
        let req = plain_request(&r);
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(5);
        for _ in 0..14 {
            r.route(Time::ZERO, &req, &mut rng).unwrap();
        }
        assert!(matches!(
            r.route(Time::ZERO, &req, &mut rng),
            Err(RouteError::AllAtCap { .. })
        ));
    }

    #[test]
    fn eligible_agrees_with_the_binary_search() {
        let windows = [32_768, 8_192, 8_192, 4_096];
        for tokens in [0, 1, 4_096, 4_097, 8_192, 8_193, 32_768, 32_769] {
            assert_eq!(
                eligible(&windows, tokens),
                windows.partition_point(|&w| w >= tokens),
                "{tokens} tokens"
            );
        }
        assert_eq!(eligible(&windows, 4_096), 4);
        assert_eq!(eligible(&windows, 4_097), 3);
        assert_eq!(eligible(&[], 1), 0);
    }

    /// The router skips the request path's events for a strategy that says it ignores them:
    /// each such strategy answers `None` to every one and keeps its weights.
    #[test]
    fn strategies_not_fed_request_events_ignore_them() {
        let mut fed = Vec::new();
        for part in crate::catalog::WEIGHTS {
            let name = format!("{}/p2c:higher-weight/no-affinity/flat:4", part.name);
            let mut r = Router::new(PolicyConfig::from_name(&name).unwrap());
            let a = r.register(Time::ZERO, spec("a"));
            let b = r.register(Time::ZERO, spec("b"));
            // The one-pass read of every weight agrees with the per-worker one.
            let all: Vec<Weight> = r.weights().collect();
            assert_eq!(all, [a, b].map(|id| r.weight(id).unwrap()), "{}", part.name);
            if r.feeds_requests {
                fed.push(part.name);
                continue;
            }
            let weights = |r: &Router| [a, b].map(|id| format!("{:?}", r.weight(id)));
            let before = weights(&r);
            let c = Completion {
                prompt_tokens: 100,
                output_tokens: 50,
                dispatched_at: Time::from_nanos(1_000_000_000),
                first_token_at: Time::from_nanos(1_500_000_000),
                completed_at: Time::from_nanos(3_000_000_000),
            };
            for event in [
                WeightEvent::Dispatched(a),
                WeightEvent::FirstToken(a),
                WeightEvent::Completed(a, &c),
                WeightEvent::Failed(b),
            ] {
                let change = r
                    .strategy
                    .observe(Time::from_nanos(3_000_000_000), event, &r.fleet);
                assert_eq!(change, WeightChange::None, "{} on {event:?}", part.name);
            }
            assert_eq!(weights(&r), before, "{}", part.name);
        }
        // The strategies that learn from requests are still fed.
        fed.sort_unstable();
        assert_eq!(fed, ["at-load", "live"]);
    }

    #[test]
    fn route_excluding_skips_the_excluded_and_restores_counts() {
        let mut r = Router::new(
            PolicyConfig::from_name("equal/p2c:higher-weight/no-affinity/flat:2").unwrap(),
        );
        let a = r.register(Time::ZERO, spec("a"));
        let b = r.register(Time::ZERO, spec("b"));
        let req = plain_request(&r);
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(3);
        for _ in 0..2 {
            let d = r
                .route_excluding(Time::ZERO, &req, &[a, a], &mut rng)
                .unwrap();
            assert_eq!(d.worker, b);
        }
        assert_eq!(
            (
                r.fleet().get(a).unwrap().in_flight,
                r.fleet().get(b).unwrap().in_flight
            ),
            (0, 2)
        );
        // b is full and a excluded: nothing can take it.
        assert!(matches!(
            r.route_excluding(Time::ZERO, &req, &[a], &mut rng),
            Err(RouteError::AllAtCap { .. })
        ));
        // Without the exclusion a still takes requests: the counts were restored.
        assert_eq!(r.route(Time::ZERO, &req, &mut rng).unwrap().worker, a);
        assert_eq!(r.fleet().get(a).unwrap().in_flight, 1);
    }

    #[test]
    fn remote_in_flight_counts_for_the_choosers_and_the_cap_but_not_the_local_view() {
        let mut r = Router::new(
            PolicyConfig::from_name("equal/jsq:higher-weight/no-affinity/flat:4").unwrap(),
        );
        let a = r.register(Time::ZERO, spec("a"));
        let b = r.register(Time::ZERO, spec("b"));
        let req = plain_request(&r);
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(3);
        // Other replicas hold 3 requests on `a`: the least-in-flight rule sends to `b` until
        // `b` holds as many.
        r.set_remote_in_flight(a, 3);
        assert_eq!(r.remote_in_flight(a), 3);
        for _ in 0..3 {
            assert_eq!(r.route(Time::ZERO, &req, &mut rng).unwrap().worker, b);
        }
        // The local view is this router's own requests only.
        assert_eq!(r.fleet().get(a).unwrap().in_flight, 0);
        assert_eq!(r.fleet().get(b).unwrap().in_flight, 3);
        // The cap counts the remote requests: `a` takes one more (3 + 1 = 4) and `b` one,
        // then nothing fits anywhere.
        let mut next_two = [0, 1].map(|_| r.route(Time::ZERO, &req, &mut rng).unwrap().worker);
        next_two.sort();
        assert_eq!(next_two, [a, b]);
        assert!(matches!(
            r.route(Time::ZERO, &req, &mut rng),
            Err(RouteError::AllAtCap { .. })
        ));
        // A newer count replaces the old one (not added to it) and frees `a` again.
        r.set_remote_in_flight(a, 0);
        assert_eq!(r.remote_in_flight(a), 0);
        assert_eq!(r.route(Time::ZERO, &req, &mut rng).unwrap().worker, a);
        // Releasing this router's own requests leaves the remote count alone.
        r.set_remote_in_flight(b, 2);
        r.fail(Time::ZERO, b, Charge::NONE);
        assert_eq!(r.remote_in_flight(b), 2);
        assert_eq!(r.fleet().get(b).unwrap().in_flight, 3);
        // An unknown id is ignored.
        r.set_remote_in_flight(WorkerId(99), 5);
        assert_eq!(r.remote_in_flight(WorkerId(99)), 0);
    }
    #[test]
    fn a_peers_dispatch_counts_until_its_release_and_only_then() {
        let mut r = Router::new(
            PolicyConfig::from_name("equal/jsq:higher-weight/no-affinity/flat:4").unwrap(),
        );
        let a = r.register(Time::ZERO, spec("a"));
        let b = r.register(Time::ZERO, spec("b"));
        let req = plain_request(&r);
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(3);
        let charge = Charge {
            tokens: 100,
            uncached: 60,
            ..Charge::NONE
        };
        // Two of another replica's requests on `a`: counted by the chooser, the token signals
        // and the cap, not in this router's own view.
        r.remote_dispatch(a, charge, &[]);
        r.remote_dispatch(a, charge, &[]);
        assert_eq!(r.remote_in_flight(a), 2);
        assert_eq!(r.fleet().get(a).unwrap().in_flight, 0);
        assert_eq!(r.signals(a).unwrap().tokens_in_flight, 200);
        assert_eq!(r.signals(a).unwrap().uncached_in_flight, 120);
        assert_eq!(r.route(Time::ZERO, &req, &mut rng).unwrap().worker, b);
        // Its first token releases its uncached tokens; its end, the rest and the slot.
        let mut first = charge;
        r.remote_first_token(a, &mut first);
        assert_eq!(first.uncached, 0);
        assert_eq!(r.signals(a).unwrap().uncached_in_flight, 60);
        r.remote_release(a, first);
        assert_eq!(r.remote_in_flight(a), 1);
        assert_eq!(r.signals(a).unwrap().tokens_in_flight, 100);
        // A doubled release takes back only what was announced, never this router's own.
        r.remote_release(a, charge);
        r.remote_release(a, charge);
        assert_eq!(r.remote_in_flight(a), 0);
        let own_b = r.fleet().get(b).unwrap().in_flight;
        assert_eq!(own_b, 1);
        r.remote_release(b, charge);
        assert_eq!(r.fleet().get(b).unwrap().in_flight, own_b);
        assert_eq!(r.remote_in_flight(b), 0);
        // An unknown id is ignored.
        r.remote_dispatch(WorkerId(99), charge, &[1]);
        r.remote_release(WorkerId(99), charge);
        assert_eq!(r.remote_in_flight(WorkerId(99)), 0);
    }
}
