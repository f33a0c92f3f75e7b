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
use routelab_policies::{AdminError, Provenance, WorkerId};

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

    pub(super) fn register(&mut self, worker: u32) {
        let now = self.now;
        let setup = &self.setup.workers[worker as usize];
        let w = &mut self.workers[worker as usize];
        match w.id {
            None => {
                let id = self.router.register(now, setup.spec.clone());
                // The router knows the configured round trip (rules that estimate TTFT add it).
                self.router
                    .set_round_trip(id, std::time::Duration::from_nanos(setup.rtt_ns));
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
                let result = self.router.restart(now, id, &args);
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
        let cap =
            setup.profile.aggregate_tok_s(self.setup.oracle_concurrency) * w.engine.speed_factor();
        self.router.set_true_capacity(self.now, id, cap);
        self.werr.set_capacity(id, cap);
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
                    let result = self.router.disconnect(now, id);
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
                    let result = self.router.disconnect(now, id);
                    self.check(worker, name, result);
                }
                self.fail_all(failed, traffic, sink);
            }
            Action::Disconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.router.disconnect(now, id);
                    self.check(worker, name, result);
                }
            }
            Action::Reconnect => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.router.reconnect(now, id);
                    self.check(worker, name, result);
                    self.drain_queue(traffic, sink);
                }
            }
            Action::NodeManagerRestart { keep_cache } => {
                let node = self.setup.workers[worker as usize].spec.node.clone();
                self.router.node_manager_restart(now, &node, keep_cache);
            }
            Action::Pin(w) => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.router.pin(now, id, w);
                    let ignored = result.is_ok()
                        && self.router.weight(id).map(|w| w.provenance) != Some(Provenance::Pinned);
                    self.check(worker, name, result);
                    if ignored {
                        let weights = self.weights;
                        self.warn(worker, name, WarningReason::PinIgnored { weights });
                    }
                }
            }
            Action::Unpin => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.router.unpin(now, id);
                    self.check(worker, name, result);
                }
            }
            Action::Reprobe => {
                if let Some(id) = self.registered(worker, name) {
                    let result = self.router.reprobe(now, id);
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
                    let result = self.router.remove(now, id);
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
