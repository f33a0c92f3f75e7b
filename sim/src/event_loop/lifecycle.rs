//! Registration and the scenario's lifecycle events: restarts, crashes, disconnections, node
//! manager restarts, pins, re-probes, degradation and removal.
//!
//! A lifecycle event the router refuses (an unknown or removed worker, an invalid weight), one
//! that names a worker not registered yet, or a pin the policy's weight strategy ignores is
//! recorded as a [`RunWarning`] in the run's metrics: never silently dropped.

use super::setup::Action;
use super::{Ev, Sim, SimError, Sink};
use crate::record::{RunWarning, WarningReason};
use crate::traffic::TrafficSource;
use routelab_policies::{AdminError, Provenance, Time, WorkerId};

/// What the scenario still has in store: registrations and lifecycle events scheduled and not
/// yet handled (a run is not over while any is).
#[derive(Debug)]
pub(super) struct Lifecycle {
    pending: u64,
    /// Name of the policy's weight strategy (for a pin it ignores).
    weights: &'static str,
}

impl Lifecycle {
    pub(super) fn new(weights: &'static str) -> Lifecycle {
        Lifecycle {
            pending: 0,
            weights,
        }
    }

    /// One more registration or lifecycle event is scheduled.
    #[inline]
    fn scheduled(&mut self) {
        self.pending += 1;
    }

    /// A scheduled one is handled now.
    #[inline]
    fn handled(&mut self) {
        self.pending -= 1;
    }

    /// Nothing left to come.
    #[inline]
    pub(super) fn none_pending(&self) -> bool {
        self.pending == 0
    }
}

impl Sim<'_> {
    /// Record that `action` on `worker` did not take effect.
    fn warn(&mut self, worker: u32, action: &'static str, reason: WarningReason) {
        let name = self.setup.workers[worker as usize].spec.name.clone();
        self.rec.warn(RunWarning {
            at: self.now,
            worker: name,
            action,
            reason,
        });
    }

    /// Keep the router's refusal of `action` as a warning.
    fn check(&mut self, worker: u32, action: &'static str, result: Result<(), AdminError>) {
        if let Err(e) = result {
            self.warn(worker, action, WarningReason::Refused(e));
        }
    }

    /// The worker's router id, or a warning that `action` found it unregistered.
    fn registered(&mut self, worker: u32, action: &'static str) -> Option<WorkerId> {
        let id = self.fleet.get(worker).id;
        if id.is_none() {
            self.warn(worker, action, WarningReason::NotRegistered);
        }
        id
    }

    /// Schedule every worker's registration and the scenario's lifecycle events.
    pub(super) fn schedule_lifecycle(&mut self) -> Result<(), SimError> {
        let n = self.fleet.workers.len();
        for i in 0..n {
            let at = Time::from_nanos(self.setup.workers[i].register_at);
            self.lifecycle.scheduled();
            self.push(at, Ev::Register { worker: i as u32 });
        }
        for (i, e) in self.setup.events.iter().enumerate() {
            if e.worker >= n {
                return Err(SimError::Setup(format!(
                    "lifecycle event {i} names worker index {} but the fleet has {n}",
                    e.worker
                )));
            }
            self.lifecycle.scheduled();
            self.push(Time::from_nanos(e.at), Ev::Lifecycle { index: i as u32 });
        }
        Ok(())
    }

    /// Worker `worker` registers (or re-registers after a restart).
    pub(super) fn on_register(&mut self, worker: u32) {
        self.lifecycle.handled();
        self.register(worker);
    }

    /// The scenario's lifecycle event `index` happens.
    pub(super) fn on_lifecycle(
        &mut self,
        index: u32,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) {
        self.lifecycle.handled();
        self.lifecycle(index as usize, traffic, sink);
    }

    fn register(&mut self, worker: u32) {
        let now = self.now;
        let setup = &self.setup.workers[worker as usize];
        match self.fleet.get(worker).id {
            None => {
                let rtt = std::time::Duration::from_nanos(setup.rtt_ns);
                let mut ids = self.replicas.iter_mut().map(|r| {
                    let id = r.router.register(now, setup.spec.clone());
                    // The router knows the configured round trip (rules that estimate TTFT
                    // add it).
                    r.router.set_round_trip(id, rtt);
                    id
                });
                let id = ids.next().expect("at least one replica");
                // Every replica registers the same workers in the same order: one id each.
                assert!(
                    ids.all(|other| other == id),
                    "replicas number workers alike"
                );
                self.fleet.bind(worker, id);
                if self.fleet.model.is_none() {
                    self.fleet.model = self.replicas.first().model_id(&self.setup.model);
                }
            }
            Some(id) => {
                let args = self
                    .fleet
                    .get_mut(worker)
                    .pending_args
                    .take()
                    .unwrap_or_else(|| setup.spec.launch_args.clone());
                let current = self
                    .replicas
                    .first()
                    .fleet()
                    .get(id)
                    .map(|i| i.spec.launch_args.clone())
                    .unwrap_or_default();
                let args = if args.is_empty() { current } else { args };
                let result = self.replicas.on_all(|r| r.restart(now, id, &args));
                self.check(worker, "restart", result);
            }
        }
        self.tell_oracle(worker);
        self.poll_probes();
    }

    /// Tell the router (its `oracle` strategy) the worker's true capacity now.
    fn tell_oracle(&mut self, worker: u32) {
        let w = self.fleet.get(worker);
        let Some(id) = w.id else { return };
        let setup = &self.setup.workers[worker as usize];
        let speed = w.engine.speed_factor();
        let cap = setup.profile.aggregate_tok_s(self.setup.oracle_concurrency) * speed;
        let now = self.now;
        for r in self.replicas.iter_mut() {
            r.router.set_true_capacity(now, id, cap);
        }
        self.werr.set_capacity(id, cap, speed);
    }

    fn lifecycle(&mut self, index: usize, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let e = &self.setup.events[index];
        let worker = e.worker as u32;
        let action = e.action.clone();
        let name = action.name();
        let now = self.now;
        let id = self.fleet.get(worker).id;
        match action {
            Action::Restart {
                launch_args,
                ready_after_ns,
                register_after_ns,
                cold,
            } => {
                let ready = self.after(ready_after_ns);
                let failed = self.fleet.get_mut(worker).engine.restart(
                    now.as_nanos(),
                    ready.as_nanos(),
                    cold,
                );
                let w = self.fleet.get_mut(worker);
                w.up = true;
                w.pending_args = launch_args;
                // Not registered yet: nothing to tell the router, it registers when due.
                if let Some(id) = id {
                    let result = self.replicas.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
                self.fail_all(failed, traffic, sink);
                self.reschedule(worker);
                self.lifecycle.scheduled();
                self.push(ready.plus_nanos(register_after_ns), Ev::Register { worker });
            }
            Action::Crash => {
                let failed = self.fleet.get_mut(worker).engine.crash(now.as_nanos());
                // A crashed engine has no wake-up to reschedule; its cleared cache is news.
                self.publish_kv_events(worker);
                self.fleet.get_mut(worker).up = false;
                if let Some(id) = id {
                    let result = self.replicas.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
                self.fail_all(failed, traffic, sink);
            }
            Action::Disconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::Reconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.reconnect(now, id));
                    self.check(worker, name, result);
                    self.drain_queue(traffic, sink);
                }
            }
            Action::NodeManagerRestart { keep_cache } => {
                let node = self.setup.workers[worker as usize].spec.node.clone();
                for r in self.replicas.iter_mut() {
                    r.router.node_manager_restart(now, &node, keep_cache);
                }
            }
            Action::Pin(w) => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.pin(now, id, w));
                    let ignored = result.is_ok()
                        && self.replicas.first().weight(id).map(|w| w.provenance)
                            != Some(Provenance::Pinned);
                    self.check(worker, name, result);
                    if ignored {
                        let weights = self.lifecycle.weights;
                        self.warn(worker, name, WarningReason::PinIgnored { weights });
                    }
                }
            }
            Action::Unpin => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.unpin(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::Reprobe => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.reprobe(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::SetSpeed(f) => {
                self.fleet
                    .get_mut(worker)
                    .engine
                    .set_speed_factor(now.as_nanos(), f);
                self.reschedule(worker);
                self.tell_oracle(worker);
            }
            Action::Remove => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.replicas.on_all(|r| r.remove(now, id));
                    self.check(worker, name, result);
                }
            }
        }
        self.poll_probes();
        self.drain_queue(traffic, sink);
    }

    /// The engine lost these sequences (a crash or a restart).
    fn fail_all(&mut self, failed: Vec<u64>, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        for seq in failed {
            let req = seq as u32;
            if self.requests.get(req).live {
                self.fail(req, traffic, sink);
            }
        }
    }
}
