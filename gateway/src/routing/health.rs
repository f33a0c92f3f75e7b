//! The health rule: when failing requests and checks eject a worker, when successful checks
//! re-admit it, and when a model with too few healthy workers routes to all of them (panic
//! mode). It changes only the router core; the active checks that feed it are
//! [`crate::health`]'s, the failing requests the proxy's.

use super::{Core, WorkerRt};
use crate::config::HealthConfig;
use routelab_policies::{ModelId, Time, WorkerId, WorkerState};

/// The health settings the rule applies (`health.*`).
#[derive(Debug, Clone)]
pub(crate) struct HealthRule {
    pub config: HealthConfig,
    /// Passive ejection and active health checks are on only when health checks run (someone
    /// must re-admit an ejected worker).
    pub ejection_enabled: bool,
}

/// What a failure says about a worker, for the health logic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A request failed on it; `hard`: its connection could not be made. Ejections by
    /// requests are capped (`health.max_ejection_percent`): one bad request retried across the
    /// fleet must not take the fleet out.
    Request { hard: bool },
    /// An active health check failed; `hard`: its connection could not be made.
    Check { hard: bool },
}

impl Failure {
    fn hard(self) -> bool {
        match self {
            Failure::Request { hard } | Failure::Check { hard } => hard,
        }
    }
}

impl Core {
    /// The workers of `model` the health logic judges: not removed, not drained.
    fn pool(&self, model: ModelId) -> impl Iterator<Item = (WorkerId, &WorkerRt)> {
        self.workers.live().filter(move |(i, w)| {
            !w.drained
                && self
                    .router
                    .fleet()
                    .get(*i)
                    .is_some_and(|f| f.model == model)
        })
    }

    /// How many workers `model`'s pool has ([`Core::pool`]), and how many of them are ejected.
    fn pool_of(&self, model: ModelId) -> (usize, usize) {
        self.pool(model).fold((0, 0), |(n, out), (_, w)| {
            (n + 1, out + usize::from(w.ejected))
        })
    }

    /// Whether failing requests may eject one more of `model`'s workers: at most
    /// `health.max_ejection_percent` of them are ejected at once, and always at least one may
    /// be (Envoy's `max_ejection_percent`).
    fn may_eject_another(&self, model: ModelId) -> bool {
        let (n, out) = self.pool_of(model);
        out == 0 || (out + 1) as f64 * 100.0 <= self.health.config.max_ejection_percent * n as f64
    }

    /// Make `id`'s model routable as its workers' health says: an ejected worker is not
    /// routed to, unless fewer than `health.panic_threshold_percent` of the model's workers
    /// (not drained) are healthy; then the model is in panic mode and every worker gets
    /// requests again, ejected or not (Envoy's panic mode: better to try a worker that may be
    /// sick than to refuse everything, e.g. when the health checks themselves are wrong).
    /// Health checks go on meanwhile, and re-admissions bring the model out of it.
    pub fn apply_health(&mut self, now: Time, id: WorkerId) {
        let Some(model) = self.router.fleet().get(id).map(|w| w.model) else {
            return;
        };
        let (n, out) = self.pool_of(model);
        let threshold = self.health.config.panic_threshold_percent;
        let panic = n > 0 && ((n - out) as f64) * 100.0 < threshold * n as f64;
        let was = self.panicking.contains(&model);
        if panic != was {
            if panic {
                self.panicking.insert(model);
            } else {
                self.panicking.remove(&model);
            }
            let name = self
                .router
                .model_name(model)
                .unwrap_or_default()
                .to_string();
            crate::logging::log(
                if panic {
                    "panic_mode_entered"
                } else {
                    "panic_mode_left"
                },
                &[
                    ("model", &name),
                    ("healthy", &(n - out).to_string()),
                    ("workers", &n.to_string()),
                ],
            );
        }
        let ids: Vec<(WorkerId, bool)> = self
            .pool(model)
            .map(|(i, w)| (i, !w.ejected || panic))
            .collect();
        let mut reopened = false;
        for (i, routable) in ids {
            let state = self.router.fleet().get(i).map(|f| f.state);
            if routable && state == Some(WorkerState::Disconnected) {
                reopened |= self.router.reconnect(now, i).is_ok();
            } else if !routable && state == Some(WorkerState::Up) {
                let _ = self.router.disconnect(now, i);
            }
        }
        if reopened {
            self.pump(now);
        }
    }

    /// The models in panic mode.
    pub fn panicking(&self, model: ModelId) -> bool {
        self.panicking.contains(&model)
    }

    /// Re-admit a worker an administrator drained; false if it was not drained. A draining
    /// worker is routable again at once (the router treats it as reconnected with the same
    /// engine, keeping a fresh measurement); one the health logic ejected meanwhile is left to
    /// the health checks, which look at it again from now on.
    pub fn undrain(&mut self, now: Time, id: WorkerId) -> bool {
        let Some(w) = self.workers.get_mut(id) else {
            return false;
        };
        if !w.drained {
            return false;
        }
        w.drained = false;
        let draining = self
            .router
            .fleet()
            .get(id)
            .is_some_and(|i| i.state == WorkerState::Draining);
        if draining && self.router.reconnect(now, id).is_ok() {
            self.pump(now);
        }
        self.apply_health(now, id);
        true
    }

    /// A request or check against the worker failed; eject it after enough in a row (at once
    /// for a hard failure such as a refused connection), within the ejection cap for failing
    /// requests. True if it was ejected now.
    pub fn note_failure(&mut self, now: Time, id: WorkerId, failure: Failure) -> bool {
        let unhealthy_after = self.health.config.unhealthy_after.max(1);
        let Some(model) = self.router.fleet().get(id).map(|f| f.model) else {
            return false;
        };
        let capped = matches!(failure, Failure::Request { .. }) && !self.may_eject_another(model);
        let Some(w) = self.workers.get_mut(id) else {
            return false;
        };
        w.consecutive_successes = 0;
        w.consecutive_failures = w.consecutive_failures.saturating_add(1);
        if !self.health.ejection_enabled
            || w.ejected
            || w.drained
            || !(failure.hard() || w.consecutive_failures >= unhealthy_after)
        {
            return false;
        }
        if capped {
            crate::logging::log(
                "ejection_capped",
                &[
                    ("worker", &w.cfg.name),
                    ("failures", &w.consecutive_failures.to_string()),
                    (
                        "max_ejection_percent",
                        &self.health.config.max_ejection_percent.to_string(),
                    ),
                ],
            );
            return false;
        }
        w.ejected = true;
        crate::logging::log(
            "worker_ejected",
            &[
                ("worker", &w.cfg.name),
                ("failures", &w.consecutive_failures.to_string()),
            ],
        );
        self.apply_health(now, id);
        true
    }

    /// A request or check against the worker succeeded; re-admit an ejected worker after
    /// enough successful checks in a row (`check`: an active health check).
    pub fn note_success(&mut self, now: Time, id: WorkerId, check: bool) {
        let healthy_after = self.health.config.healthy_after.max(1);
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        w.consecutive_failures = 0;
        if !(check && w.ejected) {
            return;
        }
        w.consecutive_successes = w.consecutive_successes.saturating_add(1);
        if w.consecutive_successes >= healthy_after {
            w.ejected = false;
            w.consecutive_successes = 0;
            crate::logging::log("worker_readmitted", &[("worker", &w.cfg.name)]);
            self.apply_health(now, id);
        }
    }
}
