//! v2: the source's live correction, reproduced faithfully, flaws included.
//!
//! Every `interval` (3 minutes) each worker's weight is re-derived from its own traffic: the
//! median per-request decode speed since it registered, times the fraction of that time it was
//! busy, divided by the median of the other workers of the same model; blended with the table's
//! figure for its *first* card until `min_requests` requests were seen. Until the first
//! re-derivation the worker keeps its registration weight (the table's sum over cards) — the
//! disagreement the source describes.

use super::{Clamp, Shaping, TableConfig, WeightChange, WeightEvent, WeightStrategy, ensure_slot};
use crate::histogram::{bucket_at_rank, nearest_rank};
use crate::time::Time;
use crate::worker::{Fleet, Provenance, Weight, WorkerId};
use std::time::Duration;

/// Parameters of the live correction.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveConfig {
    /// The v1 table it blends with and registers from.
    pub table: TableConfig,
    /// Re-derivation cadence (source: 3 minutes).
    pub interval: Duration,
    /// Requests after which the measured figure fully replaces the table's.
    pub min_requests: u32,
    /// Bounds of the weight.
    pub clamp: Clamp,
    /// New and unmeasured workers' weights.
    pub shaping: Shaping,
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            table: TableConfig::default(),
            interval: Duration::from_secs(180),
            min_requests: 20,
            clamp: Clamp::SOURCE,
            shaping: Shaping::default(),
        }
    }
}

/// Log-bucketed counts of per-request speeds (2 % buckets): a median over every request since
/// registration in bounded memory.
#[derive(Debug, Clone)]
struct SpeedHistogram {
    counts: Vec<u32>,
    total: u32,
}

const SPEED_MIN: f64 = 0.1;
const SPEED_RATIO_LN: f64 = 0.019_802_627_296_179_712; // ln(1.02)
const SPEED_BUCKETS: usize = 700; // 0.1 · 1.02^700 ≈ 1e5 tok/s

impl Default for SpeedHistogram {
    fn default() -> Self {
        SpeedHistogram {
            counts: vec![0; SPEED_BUCKETS],
            total: 0,
        }
    }
}

impl SpeedHistogram {
    fn record(&mut self, speed: f64) {
        if !(speed.is_finite() && speed > 0.0) {
            return;
        }
        let idx = ((speed.max(SPEED_MIN) / SPEED_MIN).ln() / SPEED_RATIO_LN) as usize;
        self.counts[idx.min(SPEED_BUCKETS - 1)] += 1;
        self.total += 1;
    }

    fn median(&self) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = nearest_rank(0.5, u64::from(self.total));
        let i = bucket_at_rank(&self.counts, rank)?;
        // Geometric middle of the bucket.
        Some(SPEED_MIN * ((i as f64 + 0.5) * SPEED_RATIO_LN).exp())
    }
}

#[derive(Debug, Clone, Default)]
struct WorkerLive {
    registered_at: Time,
    busy_since: Option<Time>,
    busy: Duration,
    speeds: SpeedHistogram,
    requests: u32,
    first_card: f64,
    weight: Option<Weight>,
}

impl WorkerLive {
    fn busy_fraction(&self, now: Time) -> f64 {
        let total = now.saturating_since(self.registered_at).as_secs_f64();
        if total <= 0.0 {
            return 0.0;
        }
        let open = self
            .busy_since
            .map_or(Duration::ZERO, |s| now.saturating_since(s));
        ((self.busy + open).as_secs_f64() / total).clamp(0.0, 1.0)
    }
}

/// v2: the live correction.
#[derive(Debug, Clone)]
pub struct LiveWeights {
    config: LiveConfig,
    workers: Vec<WorkerLive>,
    last_update: Option<Time>,
}

impl LiveWeights {
    /// A live-correction strategy.
    pub fn new(config: LiveConfig) -> Self {
        LiveWeights {
            config,
            workers: Vec::new(),
            last_update: None,
        }
    }

    fn rederive(&mut self, now: Time, fleet: &Fleet) {
        let scores: Vec<Option<f64>> = fleet
            .iter()
            .map(|(id, info)| {
                let w = self.workers.get(id.index())?;
                if !info.is_active() {
                    return None;
                }
                Some(w.speeds.median()? * w.busy_fraction(now))
            })
            .collect();
        let sorted = super::sorted_by_model(fleet, |id| scores[id.index()]);
        for (id, info) in fleet.iter() {
            let Some(score) = scores[id.index()] else {
                continue;
            };
            // Median of the *other* workers of the same model: leave this one's score out.
            let rel = sorted.get(&info.model).and_then(|v| {
                let me = v.partition_point(|x| *x < score);
                super::sorted_median(v, Some(me))
            });
            let rel = match rel {
                Some(m) if m > 0.0 => score / m,
                _ => 1.0,
            };
            let w = &mut self.workers[id.index()];
            let alpha =
                (f64::from(w.requests) / f64::from(self.config.min_requests.max(1))).min(1.0);
            let blended = alpha * rel + (1.0 - alpha) * w.first_card;
            w.weight = Some(Weight {
                value: self.config.clamp.apply(blended),
                provenance: Provenance::Measured,
            });
        }
    }

    fn reset(&mut self, now: Time, fleet: &Fleet, id: WorkerId) {
        let first_card = fleet
            .get(id)
            .map_or(1.0, |w| self.config.table.first_card(&w.spec.gpu_names));
        *ensure_slot(&mut self.workers, id) = WorkerLive {
            registered_at: now,
            first_card,
            ..WorkerLive::default()
        };
    }
}

impl WeightStrategy for LiveWeights {
    fn name(&self) -> &'static str {
        "live"
    }

    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                self.reset(now, fleet, id);
                WeightChange::One(id)
            }
            WeightEvent::Dispatched(id) => {
                let busy = fleet.get(id).is_some_and(|w| w.in_flight > 0);
                if let Some(w) = self.workers.get_mut(id.index())
                    && busy
                    && w.busy_since.is_none()
                {
                    w.busy_since = Some(now);
                }
                WeightChange::None
            }
            WeightEvent::Completed(id, _) | WeightEvent::Failed(id) => {
                let idle = fleet.get(id).is_none_or(|w| w.in_flight == 0);
                if let Some(w) = self.workers.get_mut(id.index()) {
                    if let WeightEvent::Completed(_, c) = event
                        && let Some(speed) = c.decode_tok_s()
                    {
                        w.speeds.record(speed);
                        w.requests += 1;
                    }
                    if idle && let Some(since) = w.busy_since.take() {
                        w.busy += now.saturating_since(since);
                    }
                }
                WeightChange::None
            }
            WeightEvent::Tick => {
                let due = self
                    .last_update
                    .is_none_or(|t| now.saturating_since(t) >= self.config.interval);
                if due {
                    self.last_update = Some(now);
                    self.rederive(now, fleet);
                    WeightChange::All
                } else {
                    WeightChange::None
                }
            }
            _ => WeightChange::None,
        }
    }

    fn weight(&self, worker: WorkerId, fleet: &Fleet) -> Weight {
        match self.workers.get(worker.index()).and_then(|w| w.weight) {
            Some(w) => w,
            None => fleet.get(worker).map_or(Weight::UNMEASURED, |w| {
                self.config.table.worker(&w.spec.gpu_names)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_median_within_two_percent() {
        let mut h = SpeedHistogram::default();
        for s in [10.0, 20.0, 30.0, 40.0, 50.0] {
            h.record(s);
        }
        let m = h.median().unwrap();
        assert!((m - 30.0).abs() / 30.0 < 0.02, "{m}");
        h.record(f64::NAN);
        h.record(-1.0);
        assert_eq!(h.total, 5);
    }
}
