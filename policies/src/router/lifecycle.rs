//! The router's fleet lifecycle (register, disconnect, restart, remove), the administrator's
//! actions (pins, re-probes), the periodic work and probes, and what gateway replicas exchange:
//! everything but the request path, which is in [`super`].

use super::*;

/// How long at most each gateway replica of a dispatch stream holds an arriving request, at
/// random, before routing it, s (the simulator's `gateways.spread_s` and the gateway's
/// `replicas.spread_s` default). Replicas that receive requests at the same instant decide on
/// the same view and, a bus hop apart, pick the same worker; a uniform random hold orders their
/// decisions so that most see the others' dispatches. 10 ms was chosen in the simulator on the
/// bundled azure-code trace at 4, 8 and 16 replicas (among 0, 2, 5, 10 and 20 ms, the largest
/// worst lower bound of the capacity ratio to one gateway), and held on mooncake-conv and
/// azure-conv, which it was not chosen on (docs/replicas.md). A request pays half of it on
/// average in its time to first token.
pub const DEFAULT_REPLICA_SPREAD_S: f64 = 0.01;

impl Router {
    // ----- lifecycle ---------------------------------------------------------------------

    /// Register a worker; it is routable at once.
    pub fn register(&mut self, now: Time, spec: WorkerSpec) -> WorkerId {
        let model = self.intern(&spec.model);
        let id = WorkerId(self.fleet.workers.len() as u32);
        self.hot.push(Hot {
            weight: 1.0,
            in_flight: 0,
            cap: u32::MAX,
            context_window: spec.context_window,
            model: model.0,
            routable: true,
        });
        self.wrr_current.push(0.0);
        self.signals.push(Signals::default());
        self.position.push(u32::MAX);
        self.prefix.register_worker(id, spec.cache_blocks);
        if self.measures_capacity {
            self.capacity
                .set_cache_blocks(id.index(), spec.cache_blocks);
        }
        let window = spec.context_window;
        self.fleet.workers.push(WorkerInfo {
            spec,
            model,
            state: WorkerState::Up,
            in_flight: 0,
            since: now,
        });
        self.join_model(model, id, window);
        self.feed(now, WeightEvent::Registered(id));
        self.sync_probed_prefill(id);
        // A strategy may report no change on registration (`equal`): the cap and weight must
        // still be applied, or the worker stays uncapped.
        self.refresh_weight(id);
        id
    }

    /// The least affinity load (in the policy's units: in-flight requests, or in-flight per
    /// unit of weight) among `model`'s routable workers below their cap whose context window
    /// holds `context_tokens`: what the prefix affinity compares a prefix holder with. +∞ when
    /// none is free; `None` when the policy has no prefix affinity or the model is unknown.
    /// O(log n) (after a change of the model's members, the first call rebuilds in O(n)).
    pub fn freest_load(&mut self, model: ModelId, context_tokens: u32) -> Option<f64> {
        self.affinity_units?;
        let entry = self.models.get(model.0 as usize)?;
        let k = eligible(&entry.windows, context_tokens);
        self.fresh_loads(model.0);
        Some(self.models[model.0 as usize].loads.prefix_min(k))
    }

    /// The worker's connection dropped; not routable until it reconnects.
    pub fn disconnect(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.set_state(id, WorkerState::Disconnected)?;
        self.feed(now, WeightEvent::Disconnected(id));
        Ok(())
    }

    /// The worker reconnected with the same engine.
    pub fn reconnect(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.set_state(id, WorkerState::Up)?;
        self.fleet.workers[id.index()].since = now;
        self.feed(now, WeightEvent::Reconnected(id));
        self.sync_probed_prefill(id);
        Ok(())
    }

    /// Stop sending new requests; in-flight ones finish.
    ///
    /// Only a connected worker can drain: draining a disconnected one changes nothing (it takes
    /// no requests already, and must not become an active peer again by being drained).
    pub fn drain(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.check(id)?;
        if self.fleet.workers[id.index()].state != WorkerState::Up {
            return Ok(());
        }
        self.set_state(id, WorkerState::Draining)?;
        self.feed(now, WeightEvent::Tick);
        Ok(())
    }

    /// The worker's engine restarted, possibly with other launch arguments. Its in-flight
    /// requests are lost: the host reports each with [`Router::fail`].
    pub fn restart(
        &mut self,
        now: Time,
        id: WorkerId,
        launch_args: &str,
    ) -> Result<(), AdminError> {
        self.set_state(id, WorkerState::Up)?;
        let info = &mut self.fleet.workers[id.index()];
        let args_changed = info.spec.launch_args != launch_args;
        if args_changed {
            info.spec.launch_args = launch_args.to_string();
        }
        info.since = now;
        self.prefix.forget_worker(id);
        if args_changed {
            // Other launch arguments, another engine: its measured capacity starts over.
            self.capacity.forget(id.index());
        }
        self.feed(
            now,
            WeightEvent::Restarted {
                worker: id,
                args_changed,
            },
        );
        self.sync_probed_prefill(id);
        Ok(())
    }

    /// Bring a removed worker back, its engine started anew (possibly with other launch
    /// arguments), as [`Router::restart`] does for a worker that was never removed. For a host
    /// that removes and re-adds the same worker: the worker's slot is reused instead of a new
    /// one being registered, since the router's per-worker arrays never shrink (a gateway whose
    /// admin API adds and removes a worker 20,000 times would otherwise keep 20,000 slots). An
    /// id that is not a removed worker is an error.
    pub fn revive(&mut self, now: Time, id: WorkerId, launch_args: &str) -> Result<(), AdminError> {
        match self.fleet.workers.get_mut(id.index()) {
            // `restart` takes a worker that is not removed; its in-flight count (requests still
            // finishing from before the removal) is kept and released as they end.
            Some(w) if w.state == WorkerState::Removed => w.state = WorkerState::Disconnected,
            _ => return Err(AdminError::UnknownWorker(id)),
        }
        // The slot may now hold another machine: nothing measured before carries over.
        self.capacity.forget(id.index());
        self.restart(now, id, launch_args)
    }

    /// Deregister a worker for good; its peers' weights are re-normalised.
    pub fn remove(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.set_state(id, WorkerState::Removed)?;
        self.prefix.forget_worker(id);
        self.feed(now, WeightEvent::Removed(id));
        Ok(())
    }

    /// A node manager restarted; its workers re-register, with or without the probe cache.
    pub fn node_manager_restart(&mut self, now: Time, node: &str, keep_cache: bool) {
        self.feed(now, WeightEvent::NodeManagerRestart { node, keep_cache });
        for i in 0..self.fleet.len() {
            self.sync_probed_prefill(WorkerId(i as u32));
        }
    }

    // ----- admin -------------------------------------------------------------------------

    /// Pin a worker's weight (survives restarts until [`Router::unpin`]).
    pub fn pin(&mut self, now: Time, id: WorkerId, weight: f64) -> Result<(), AdminError> {
        self.check(id)?;
        if !(weight.is_finite() && weight > 0.0) {
            return Err(AdminError::InvalidWeight(weight));
        }
        self.feed(now, WeightEvent::Pin(id, weight));
        Ok(())
    }

    /// Clear a pin.
    pub fn unpin(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.check(id)?;
        self.feed(now, WeightEvent::Unpin(id));
        Ok(())
    }

    /// Ask for a fresh measurement now, busy or not.
    pub fn reprobe(&mut self, now: Time, id: WorkerId) -> Result<(), AdminError> {
        self.check(id)?;
        self.feed(now, WeightEvent::Reprobe(id));
        Ok(())
    }

    /// Tell the `oracle` strategy a worker's true capacity (lab only; others ignore it).
    pub fn set_true_capacity(&mut self, now: Time, id: WorkerId, tok_s: f64) {
        if self.check(id).is_ok() {
            self.feed(now, WeightEvent::TrueCapacity(id, tok_s));
        }
    }

    // ----- periodic work and probes -------------------------------------------------------

    /// Periodic housekeeping; call every few seconds.
    pub fn tick(&mut self, now: Time) {
        self.feed(now, WeightEvent::Tick);
    }

    /// Probe bursts the host should send now (appended to `out`).
    pub fn poll_probes(&mut self, now: Time, out: &mut Vec<ProbeOrder>) {
        self.strategy.poll_probes(now, &self.fleet, out);
    }

    /// A probe burst finished.
    pub fn probe_result(&mut self, now: Time, result: &ProbeResult) {
        self.feed(now, WeightEvent::Probe(result));
        self.sync_probed_prefill(result.worker);
    }

    /// Hand the capacity meters the prefill speed the weight strategy's probe measured (or
    /// adopted from its cache) for `id`, if any: the figure a worker's prefill is predicted
    /// with until its own traffic has measured it.
    pub(super) fn sync_probed_prefill(&mut self, id: WorkerId) {
        if self.fleet.get(id).is_some() {
            let probed = self.strategy.probed_prefill_tok_s(id);
            self.capacity.set_probed_prefill(id.index(), probed);
        }
    }

    // ----- several replicas ------------------------------------------------------------------

    /// Another gateway replica's requests in flight on `id`, as the replicas exchange them
    /// (`remote` replaces what an earlier call said). From now on the choosers, the prefix
    /// affinity and the cap compare the worker's own in-flight count plus `remote`: a worker
    /// at its cap counting the other replicas' requests takes no more from this one. What this
    /// router counts and releases itself (`WorkerInfo::in_flight`, the weight strategies'
    /// view, the field's token signals) stays its own. An unknown id is ignored.
    pub fn set_remote_in_flight(&mut self, id: WorkerId, remote: u32) {
        let Some(local) = self.fleet.get(id).map(|i| i.in_flight) else {
            return;
        };
        self.set_in_flight(id.index(), local.saturating_add(remote));
    }

    /// Another replica dispatched a request to `id`, as its dispatch stream announced it
    /// (`charge` as that replica charged it, `prefix` the request's prompt blocks). This router
    /// counts it like its own for the choosers, the prefix affinity, the cap and the token
    /// signals, and records its prefix where the knowledge mode records dispatches (what a
    /// shared prefix index gives), but it is not this router's to release: only
    /// [`Router::remote_release`] takes it back. An unknown id is ignored.
    pub fn remote_dispatch(&mut self, id: WorkerId, charge: Charge, prefix: &[u64]) {
        let i = id.index();
        if self.fleet.get(id).is_none() {
            return;
        }
        self.signals[i].charge(charge);
        if !prefix.is_empty() {
            self.prefix.record(prefix, id);
        }
        let in_flight = self.hot[i].in_flight.saturating_add(1);
        self.set_in_flight(i, in_flight);
    }

    /// Another replica's request on `id` produced its first token: its uncached prompt no
    /// longer waits there (`charge` is set as [`Router::first_token`] sets its own).
    pub fn remote_first_token(&mut self, id: WorkerId, charge: &mut Charge) {
        if self.fleet.get(id).is_some() {
            self.signals[id.index()].release_uncached(charge);
        }
    }

    /// Another replica's request on `id` ended (completed or failed): what
    /// [`Router::remote_dispatch`] counted is released. A release this router never counted
    /// (more releases than dispatches announced) changes nothing, so a lost or doubled message
    /// cannot take the worker below its own count.
    pub fn remote_release(&mut self, id: WorkerId, charge: Charge) {
        let Some(local) = self.fleet.get(id).map(|w| w.in_flight) else {
            return;
        };
        let i = id.index();
        if self.hot[i].in_flight <= local {
            return;
        }
        self.signals[i].release(charge);
        let in_flight = self.hot[i].in_flight - 1;
        self.set_in_flight(i, in_flight);
    }

    /// Another replica's request on `id` completed: a router that measures capacity learns
    /// from it as from its own (each replica otherwise sees only 1/N of the completions).
    /// `charge` is the one the dispatching replica noted, so the sample is measured against
    /// what that replica saw at dispatch.
    pub fn remote_completion(&mut self, id: WorkerId, charge: Charge, completion: &Completion) {
        if !self.measures_capacity || self.fleet.get(id).is_none() {
            return;
        }
        let sample = self.capacity_sample(id, charge);
        self.capacity.learn(id.index(), completion, sample);
    }

    /// What [`Router::set_remote_in_flight`] last said about `id` (0 for an unknown id).
    pub fn remote_in_flight(&self, id: WorkerId) -> u32 {
        match (self.hot.get(id.index()), self.fleet.get(id)) {
            (Some(h), Some(i)) => h.in_flight - i.in_flight,
            _ => 0,
        }
    }
}
