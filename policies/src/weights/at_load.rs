//! `at-load`: capacity estimated passively from live traffic, only while the worker is working.
//!
//! Under processor sharing a request's decode speed times the mean number of requests that
//! shared the engine during its decode is the engine's aggregate throughput at that concurrency.
//! Each completed request therefore yields one sample `(concurrency, aggregate tok/s)` measured
//! *at load*: idle gaps never enter (unlike the source's v2), no synthetic burst is sent (unlike
//! v3), and a degraded worker shows up within the estimator's time constant.
//!
//! The weight is each worker's recent aggregate throughput at its operating point, relative to
//! the median of its peers. Routing by these weights converges where every worker gives its
//! requests the same per-request speed: a worker whose requests run faster than its peers' has
//! a throughput-to-load ratio above its weight ratio, so it is given more until the speeds meet.
//! The per-concurrency curve is kept as well (reported, and usable for derived caps).
//!
//! ## Stability
//!
//! The raw estimate is noisy (one sample per completed request, taken at whatever concurrency
//! the router happened to give the worker) and it is fed back: a worker whose weight drops gets
//! less traffic, runs at a lower concurrency and measures a lower aggregate throughput. Left to
//! itself, on the Mooncake trace the weights swung between the clamp limits. Three brakes, each
//! a parameter of [`AtLoadConfig`]:
//! - **smoothing** (`half_life`, 60 s): the weight moves towards the estimate exponentially in
//!   log space, half the remaining distance per half-life, so one burst of slow or fast samples
//!   cannot flip it;
//! - **evidence** (`min_busy`, 20 s): a measured weight changes only after the worker was busy
//!   (something in flight) for that long since its last change; an idle worker keeps its weight
//!   (no traffic is no evidence), and a measured weight never falls back to the placeholder
//!   when its samples age out;
//! - **bounded steps** (`max_step`, 1.5): one update moves a weight by at most that factor up
//!   or down, so a wrong estimate costs at most a few updates' worth of misrouting.
//!
//! The first measurement of a worker is taken as it is (its samples already passed
//! `min_samples`): a slow newcomer must not keep a neutral weight for minutes.
//!
//! ## What it estimates, against the oracle
//!
//! The oracle (and the burst probe) rate an engine at 16 concurrent requests; at-load rates it
//! where the traffic runs it. On the bundled traces the engines run at a few requests each,
//! where a PRO 6000, a 5090 and a 4090 pair decode at nearly the same speed (106, 80 and
//! 94 tok/s alone; 1,102, 990 and 485 at 16), so at-load's weights sit near 1 where the
//! oracle's reach 2.3: its weight error against the oracle at 16 is larger than the probe's,
//! though it routes those traces with a shorter tail. Against an oracle at 2 concurrent
//! requests (the scenario's `oracle_concurrency`) the order reverses.

use super::{
    Clamp, Shaping, TableConfig, WeightChange, WeightEvent, WeightStrategy, ensure_slot,
    relative_to, sorted_by_model, sorted_median,
};
use crate::time::Time;
use crate::worker::{Fleet, Provenance, Weight, WorkerId};
use std::time::Duration;

/// Parameters of the at-load estimator.
#[derive(Debug, Clone, PartialEq)]
pub struct AtLoadConfig {
    /// Time constant of the exponential forgetting of samples.
    pub time_constant: Duration,
    /// Effective number of recent samples needed before the estimate replaces the prior.
    pub min_samples: f64,
    /// How often weights are re-derived.
    pub update_interval: Duration,
    /// Where weights start before any evidence (`None`: equal weights).
    pub prior: Option<TableConfig>,
    /// Bounds of the weight.
    pub clamp: Clamp,
    /// Half-life of the weight's approach to the estimate (log space).
    pub half_life: Duration,
    /// Busy time (something in flight) a worker needs since its last change before its
    /// measured weight moves again.
    pub min_busy: Duration,
    /// Largest factor (> 1) by which one update may raise or lower a measured weight.
    pub max_step: f64,
    /// New and unmeasured workers' weights.
    pub shaping: Shaping,
}

impl Default for AtLoadConfig {
    fn default() -> Self {
        AtLoadConfig {
            time_constant: Duration::from_secs(60),
            min_samples: 4.0,
            update_interval: Duration::from_secs(10),
            prior: None,
            clamp: Clamp::SOURCE,
            half_life: Duration::from_secs(60),
            min_busy: Duration::from_secs(20),
            max_step: 1.5,
            shaping: Shaping::default(),
        }
    }
}

/// Concurrency buckets of the reported curve: [1,2), [2,4), … [256, ∞).
pub const CURVE_BUCKETS: usize = 9;
const CHECKPOINTS: usize = 256;

/// Exponentially forgotten mean.
#[derive(Debug, Clone, Copy, Default)]
struct Decayed {
    weight: f64,
    sum: f64,
    at: Time,
}

impl Decayed {
    fn decay_to(&mut self, now: Time, tau: f64) {
        let dt = now.saturating_since(self.at).as_secs_f64();
        if dt > 0.0 {
            let k = (-dt / tau).exp();
            self.weight *= k;
            self.sum *= k;
            self.at = now;
        }
    }

    fn add(&mut self, now: Time, tau: f64, value: f64) {
        self.decay_to(now, tau);
        self.weight += 1.0;
        self.sum += value;
    }

    fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Checkpoint {
    at: u64,
    area: f64,
    in_flight: u32,
}

#[derive(Debug, Clone, Default)]
struct WorkerAtLoad {
    /// ∫ in_flight dt in request·seconds, as of `checkpoints[head]`.
    checkpoints: Vec<Checkpoint>,
    head: usize,
    overall: Decayed,
    curve: [Decayed; CURVE_BUCKETS],
    weight: Option<Weight>,
    /// Busy time (something in flight) since the worker (re)started, ns, as of the last
    /// checkpoint.
    busy_ns: u64,
    /// `busy_ns` (with the open interval) when the measured weight last changed.
    busy_at_change: u64,
}

impl WorkerAtLoad {
    fn fresh(now: Time) -> Self {
        let mut w = WorkerAtLoad {
            checkpoints: Vec::with_capacity(CHECKPOINTS),
            ..Self::default()
        };
        w.checkpoints.push(Checkpoint {
            at: now.as_nanos(),
            area: 0.0,
            in_flight: 0,
        });
        w
    }

    /// Busy time since the worker (re)started, up to `now`, ns.
    fn busy_total(&self, now: Time) -> u64 {
        let last = self.last();
        let open = if last.in_flight > 0 {
            now.as_nanos().saturating_sub(last.at)
        } else {
            0
        };
        self.busy_ns + open
    }

    fn last(&self) -> Checkpoint {
        self.checkpoints[self.head]
    }

    /// Record that in-flight changed to `in_flight` at `now`.
    fn change(&mut self, now: Time, in_flight: u32) {
        let last = self.last();
        let t = now.as_nanos().max(last.at);
        let area = last.area + f64::from(last.in_flight) * (t - last.at) as f64 / 1e9;
        if last.in_flight > 0 {
            self.busy_ns += t - last.at;
        }
        let cp = Checkpoint {
            at: t,
            area,
            in_flight,
        };
        if self.checkpoints.len() < CHECKPOINTS {
            self.checkpoints.push(cp);
            self.head = self.checkpoints.len() - 1;
        } else {
            self.head = (self.head + 1) % CHECKPOINTS;
            self.checkpoints[self.head] = cp;
        }
    }

    /// ∫ in_flight dt up to `t` (clamped to the oldest checkpoint kept).
    fn area_at(&self, t: u64) -> f64 {
        let n = self.checkpoints.len();
        // Oldest entry sits right after head once the ring wrapped.
        let oldest = if n < CHECKPOINTS {
            0
        } else {
            (self.head + 1) % n
        };
        let at = |i: usize| self.checkpoints[(oldest + i) % n];
        // Last checkpoint with at <= t.
        let (mut lo, mut hi) = (0usize, n);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if at(mid).at <= t {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let cp = at(lo);
        cp.area + f64::from(cp.in_flight) * t.saturating_sub(cp.at) as f64 / 1e9
    }
}

fn bucket(concurrency: f64) -> usize {
    (concurrency.max(1.0).log2().floor() as usize).min(CURVE_BUCKETS - 1)
}

/// Passive capacity estimation from traffic at load.
#[derive(Debug, Clone)]
pub struct AtLoadWeights {
    config: AtLoadConfig,
    workers: Vec<WorkerAtLoad>,
    last_update: Option<Time>,
}

impl AtLoadWeights {
    /// An at-load strategy.
    pub fn new(config: AtLoadConfig) -> Self {
        AtLoadWeights {
            config,
            workers: Vec::new(),
            last_update: None,
        }
    }

    fn tau(&self) -> f64 {
        self.config.time_constant.as_secs_f64().max(1e-3)
    }

    /// Current estimate of a worker's aggregate throughput at its operating point, tokens/s.
    pub fn throughput(&self, worker: WorkerId, now: Time) -> Option<f64> {
        let w = self.workers.get(worker.index())?;
        let mut d = w.overall;
        d.decay_to(now, self.tau());
        (d.weight >= self.config.min_samples)
            .then(|| d.mean())
            .flatten()
    }

    /// The measured curve: (bucket's lower concurrency, aggregate tok/s, effective samples).
    pub fn curve(&self, worker: WorkerId, now: Time) -> Vec<(u32, f64, f64)> {
        let Some(w) = self.workers.get(worker.index()) else {
            return Vec::new();
        };
        w.curve
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                let mut d = *d;
                d.decay_to(now, self.tau());
                d.mean().map(|m| (1u32 << i, m, d.weight))
            })
            .collect()
    }

    fn prior(&self, fleet: &Fleet, id: WorkerId) -> f64 {
        match (&self.config.prior, fleet.get(id)) {
            (Some(t), Some(info)) => t.worker(&info.spec.gpu_names).value,
            _ => 1.0,
        }
    }

    /// Re-derive every weight: measured where the evidence suffices (moved towards the
    /// estimate through the brakes of the module docs), else the prior relative to the model's
    /// priors (when a prior is configured), else unmeasured. A measured weight whose samples
    /// aged out is kept.
    fn rederive(&mut self, now: Time, fleet: &Fleet) {
        let estimates: Vec<Option<f64>> = fleet
            .iter()
            .map(|(id, info)| {
                if info.is_active() {
                    self.throughput(id, now)
                } else {
                    None
                }
            })
            .collect();
        let measured = sorted_by_model(fleet, |id| estimates[id.index()]);
        let priors = self
            .config
            .prior
            .as_ref()
            .map(|_| sorted_by_model(fleet, |id| Some(self.prior(fleet, id))));
        for (id, info) in fleet.iter() {
            let Some(slot) = self.workers.get(id.index()) else {
                continue;
            };
            let current = slot.weight.filter(|w| w.provenance == Provenance::Measured);
            let weight = match (estimates[id.index()], current, &priors) {
                (Some(tp), _, _) => {
                    let target = relative_to(
                        tp,
                        measured
                            .get(&info.model)
                            .and_then(|v| sorted_median(v, None)),
                        self.config.clamp,
                    );
                    Some(Weight {
                        value: self.step(id, now, current.map(|w| w.value), target),
                        provenance: Provenance::Measured,
                    })
                }
                (None, Some(kept), _) => Some(kept),
                (None, None, Some(priors)) => {
                    let own = self.prior(fleet, id);
                    Some(Weight {
                        value: relative_to(
                            own,
                            priors
                                .get(&info.model)
                                .and_then(|v| sorted_median(v, None))
                                .or(Some(own)),
                            self.config.clamp,
                        ),
                        provenance: Provenance::Table,
                    })
                }
                (None, None, None) => None,
            };
            self.workers[id.index()].weight = weight;
        }
    }

    /// The measured weight of `id` after one update towards `target`: the first measurement
    /// as it is; later ones only after `min_busy` of busy time since the last change, then
    /// smoothed over that busy time with `half_life` and bounded by `max_step`.
    fn step(&mut self, id: WorkerId, now: Time, current: Option<f64>, target: f64) -> f64 {
        let c = &self.config;
        let w = &mut self.workers[id.index()];
        let busy_total = w.busy_total(now);
        let busy = Duration::from_nanos(busy_total.saturating_sub(w.busy_at_change));
        let value = match current {
            None => target,
            Some(v) if busy < c.min_busy => return v,
            Some(v) => {
                let half_life = c.half_life.as_secs_f64().max(1e-9);
                let alpha = 1.0 - 0.5f64.powf(busy.as_secs_f64() / half_life);
                let max_ln = c.max_step.ln();
                let ln = ((target / v).ln() * alpha).clamp(-max_ln, max_ln);
                c.clamp.apply(v * ln.exp())
            }
        };
        w.busy_at_change = busy_total;
        value
    }
}

impl WeightStrategy for AtLoadWeights {
    fn name(&self) -> &'static str {
        "at-load"
    }

    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        let tau = self.tau();
        match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                // A restarted engine is a new machine as far as speed goes.
                *ensure_slot(&mut self.workers, id) = WorkerAtLoad::fresh(now);
                if self.config.prior.is_some() {
                    // Unmeasured peers' prior weights are relative to the model's active
                    // workers' priors, which a newcomer (or a restarted, once-disconnected
                    // worker) moves.
                    self.rederive(now, fleet);
                    WeightChange::All
                } else {
                    WeightChange::One(id)
                }
            }
            WeightEvent::Dispatched(id) | WeightEvent::Failed(id) => {
                let n = fleet.get(id).map_or(0, |w| w.in_flight);
                if let Some(w) = self.workers.get_mut(id.index()) {
                    w.change(now, n);
                }
                WeightChange::None
            }
            WeightEvent::Completed(id, c) => {
                let n = fleet.get(id).map_or(0, |w| w.in_flight);
                if let Some(w) = self.workers.get_mut(id.index()) {
                    w.change(now, n);
                    let start = c.first_token_at.as_nanos();
                    let end = c.completed_at.as_nanos().min(now.as_nanos());
                    if let Some(speed) = c.decode_tok_s()
                        && end > start
                    {
                        let dt = (end - start) as f64 / 1e9;
                        let conc = ((w.area_at(end) - w.area_at(start)) / dt).max(1.0);
                        let aggregate = speed * conc;
                        if aggregate.is_finite() {
                            w.overall.add(now, tau, aggregate);
                            w.curve[bucket(conc)].add(now, tau, aggregate);
                        }
                    }
                }
                WeightChange::None
            }
            WeightEvent::Tick => {
                let due = self
                    .last_update
                    .is_none_or(|t| now.saturating_since(t) >= self.config.update_interval);
                if due {
                    self.last_update = Some(now);
                    self.rederive(now, fleet);
                    WeightChange::All
                } else {
                    WeightChange::None
                }
            }
            WeightEvent::Removed(_)
            | WeightEvent::Disconnected(_)
            | WeightEvent::Reconnected(_) => {
                self.rederive(now, fleet);
                WeightChange::All
            }
            _ => WeightChange::None,
        }
    }

    fn weight(&self, worker: WorkerId, _fleet: &Fleet) -> Weight {
        self.workers
            .get(worker.index())
            .and_then(|w| w.weight)
            .unwrap_or(Weight::UNMEASURED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_integrates_in_flight() {
        let mut w = WorkerAtLoad::fresh(Time::ZERO);
        w.change(Time::from_secs_f64(1.0), 2); // 0 until 1 s, then 2
        w.change(Time::from_secs_f64(3.0), 1); // 2 until 3 s, then 1
        assert!((w.area_at(Time::from_secs_f64(3.0).as_nanos()) - 4.0).abs() < 1e-9);
        assert!((w.area_at(Time::from_secs_f64(5.0).as_nanos()) - 6.0).abs() < 1e-9);
        assert!((w.area_at(Time::from_secs_f64(2.0).as_nanos()) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn ring_wraps_and_keeps_recent_history() {
        let mut w = WorkerAtLoad::fresh(Time::ZERO);
        for i in 1..=1000u64 {
            w.change(Time::from_nanos(i * 1_000_000_000), (i % 3) as u32);
        }
        // From t=999 s to 1000 s in-flight was 999 % 3 = 0.
        let a = w.area_at(1_000_000_000_000) - w.area_at(999_000_000_000);
        assert!(a.abs() < 1e-9);
        let b = w.area_at(998_500_000_000) - w.area_at(998_000_000_000);
        assert!((b - 0.5 * (998 % 3) as f64).abs() < 1e-9);
    }

    #[test]
    fn a_step_waits_for_busy_time_then_is_smoothed_and_bounded() {
        let mut s = AtLoadWeights::new(AtLoadConfig::default());
        let id = WorkerId(0);
        s.workers.push(WorkerAtLoad::fresh(Time::ZERO));
        // The first measurement is taken as it is.
        assert_eq!(s.step(id, Time::ZERO, None, 3.0), 3.0);
        s.workers[0].change(Time::ZERO, 1); // busy from 0 s on
        // 10 s busy is below the 20 s minimum: no change.
        assert_eq!(s.step(id, Time::from_secs_f64(10.0), Some(1.0), 8.0), 1.0);
        // 30 s busy: half-life 60 s moves 1 - 2^-0.5 = 29 % of the way in log space, i.e.
        // x8^0.29 = x1.84, bounded to x1.5.
        assert_eq!(s.step(id, Time::from_secs_f64(30.0), Some(1.0), 8.0), 1.5);
        // Idle from 30 s to 100 s, then busy to 130 s: 30 s of busy time since the change.
        s.workers[0].change(Time::from_secs_f64(30.0), 0);
        s.workers[0].change(Time::from_secs_f64(100.0), 1);
        let alpha = 1.0 - 0.5f64.powf(0.5);
        let got = s.step(id, Time::from_secs_f64(130.0), Some(1.0), 1.2);
        assert!((got - 1.2f64.powf(alpha)).abs() < 1e-12, "{got}");
        // Downwards the same bound, and the clamp holds.
        assert_eq!(
            s.step(id, Time::from_secs_f64(200.0), Some(0.3), 0.01),
            AtLoadConfig::default().clamp.min
        );
    }

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket(0.5), 0);
        assert_eq!(bucket(1.9), 0);
        assert_eq!(bucket(2.0), 1);
        assert_eq!(bucket(16.0), 4);
        assert_eq!(bucket(10_000.0), CURVE_BUCKETS - 1);
    }
}
