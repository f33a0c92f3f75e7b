//! Registration and the scenario's lifecycle events: restarts, crashes, disconnections, node
//! manager restarts, pins, re-probes, degradation and removal.
//!
//! A lifecycle event the router refuses (an unknown or removed worker, an invalid weight), one
//! that names a worker not registered yet, or a pin the policy's weight strategy ignores is
//! recorded as a [`RunWarning`] in the run's metrics: never silently dropped.

use super::setup::Action;
use super::{Ev, Sim, Sink};
use crate::record::{RunWarning, WarningReason};
use crate::traffic::TrafficSource;
use routelab_policies::{AdminError, Provenance, Router, WorkerId};

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
        let id = self.workers[worker as usize].id;
        if id.is_none() {
            self.warn(worker, action, WarningReason::NotRegistered);
        }
        id
    }

    /// Apply an administrative call to every replica (a lifecycle event reaches them all);
    /// the first refusal, if any, is the answer (replicas that saw the same events answer
    /// alike).
    fn on_all(
        &mut self,
        mut call: impl FnMut(&mut Router) -> Result<(), AdminError>,
    ) -> Result<(), AdminError> {
        let mut answer = Ok(());
        for r in &mut self.replicas {
            let result = call(&mut r.router);
            if answer.is_ok() {
                answer = result;
            }
        }
        answer
    }

    pub(super) fn register(&mut self, worker: u32) {
        let now = self.now;
        let setup = &self.setup.workers[worker as usize];
        let w = &mut self.workers[worker as usize];
        match w.id {
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
                w.id = Some(id);
                if self.by_id.len() <= id.index() {
                    self.by_id.resize(id.index() + 1, 0);
                }
                self.by_id[id.index()] = worker;
                if self.model.is_none() {
                    self.model = self.replicas[0].router.model_id(&self.setup.model);
                }
            }
            Some(id) => {
                let args = w
                    .pending_args
                    .take()
                    .unwrap_or_else(|| setup.spec.launch_args.clone());
                let current = self.replicas[0]
                    .router
                    .fleet()
                    .get(id)
                    .map(|i| i.spec.launch_args.clone())
                    .unwrap_or_default();
                let args = if args.is_empty() { current } else { args };
                let result = self.on_all(|r| r.restart(now, id, &args));
                self.check(worker, "restart", result);
            }
        }
        self.tell_oracle(worker);
        self.poll_probes();
    }

    /// Tell the router (its `oracle` strategy) the worker's true capacity now.
    fn tell_oracle(&mut self, worker: u32) {
        let w = &self.workers[worker as usize];
        let Some(id) = w.id else { return };
        let setup = &self.setup.workers[worker as usize];
        let speed = w.engine.speed_factor();
        let cap = setup.profile.aggregate_tok_s(self.setup.oracle_concurrency) * speed;
        let now = self.now;
        for r in &mut self.replicas {
            r.router.set_true_capacity(now, id, cap);
        }
        self.werr.set_capacity(id, cap, speed);
    }

    pub(super) fn lifecycle(
        &mut self,
        index: usize,
        traffic: &mut dyn TrafficSource,
        sink: Sink<'_, '_>,
    ) {
        let e = &self.setup.events[index];
        let worker = e.worker as u32;
        let action = e.action.clone();
        let name = action.name();
        let now = self.now;
        let id = self.workers[worker as usize].id;
        match action {
            Action::Restart {
                launch_args,
                ready_after_ns,
                register_after_ns,
                cold,
            } => {
                let ready = self.after(ready_after_ns);
                let failed = self.workers[worker as usize].engine.restart(
                    now.as_nanos(),
                    ready.as_nanos(),
                    cold,
                );
                self.workers[worker as usize].up = true;
                self.workers[worker as usize].pending_args = launch_args;
                // Not registered yet: nothing to tell the router, it registers when due.
                if let Some(id) = id {
                    let result = self.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
                self.fail_all(failed, traffic, sink);
                self.reschedule(worker);
                self.pending_lifecycle += 1;
                self.push(ready.plus_nanos(register_after_ns), Ev::Register { worker });
            }
            Action::Crash => {
                let failed = self.workers[worker as usize].engine.crash(now.as_nanos());
                // A crashed engine has no wake-up to reschedule; its cleared cache is news.
                self.publish_kv_events(worker);
                self.workers[worker as usize].up = false;
                if let Some(id) = id {
                    let result = self.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
                self.fail_all(failed, traffic, sink);
            }
            Action::Disconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.disconnect(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::Reconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.reconnect(now, id));
                    self.check(worker, name, result);
                    self.drain_queue(traffic, sink);
                }
            }
            Action::NodeManagerRestart { keep_cache } => {
                let node = self.setup.workers[worker as usize].spec.node.clone();
                for r in &mut self.replicas {
                    r.router.node_manager_restart(now, &node, keep_cache);
                }
            }
            Action::Pin(w) => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.pin(now, id, w));
                    let ignored = result.is_ok()
                        && self.replicas[0].router.weight(id).map(|w| w.provenance)
                            != Some(Provenance::Pinned);
                    self.check(worker, name, result);
                    if ignored {
                        let weights = self.weights;
                        self.warn(worker, name, WarningReason::PinIgnored { weights });
                    }
                }
            }
            Action::Unpin => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.unpin(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::Reprobe => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.reprobe(now, id));
                    self.check(worker, name, result);
                }
            }
            Action::SetSpeed(f) => {
                self.workers[worker as usize]
                    .engine
                    .set_speed_factor(now.as_nanos(), f);
                self.reschedule(worker);
                self.tell_oracle(worker);
            }
            Action::Remove => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.on_all(|r| r.remove(now, id));
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
            if self.reqs[req as usize].live {
                self.fail(req, traffic, sink);
            }
        }
    }
}
