//! What a strategy's weight becomes for a worker that is new or not yet measured, for every
//! strategy at once: [`Shaped`] wraps any [`WeightStrategy`].
//!
//! - **Unmeasured weight** ([`Unmeasured`]): a worker whose strategy has no measurement yet
//!   (`Provenance::Default`) gets the neutral 1.0 (the source's behaviour), the clamp's lower
//!   bound, or the median weight of its model's measured peers. The provenance stays `Default`:
//!   a placeholder is still not a measurement of a slow worker.
//! - **Slow start** ([`SlowStart`]), after Envoy's slow-start mode (its documentation gives the
//!   factor `max(min_weight_percent, (time since start / window)^(1 / aggression))`): for
//!   `window` after a worker registers or its engine restarts, its weight is scaled by
//!   `max(floor, (t / window)^(1 / aggression))`, so a newcomer takes a growing share of traffic
//!   instead of its full share at once.
//!
//! Routers cache weights and re-read them only when a strategy reports a [`WeightChange`], and
//! [`WeightStrategy::weight`] takes no time. So the wrapper re-derives every effective weight at
//! each event its inner strategy reports a change for, at each registration or restart, and at
//! each [`WeightEvent::Tick`] while a ramp is running (the ramp then moves in tick-sized steps:
//! one second in the simulator).

use super::{
    Clamp, PersistedProbeState, ProbeOrder, WeightChange, WeightEvent, WeightStrategy, ensure_slot,
    sorted_by_model, sorted_median,
};
use crate::time::Time;
use crate::worker::{Fleet, Weight, WorkerId};
use std::time::Duration;

/// The weight of a worker its strategy has not measured yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unmeasured {
    /// The strategy's own placeholder (1.0): today's behaviour.
    #[default]
    Neutral,
    /// The clamp's lower bound: a newcomer is assumed slow until measured.
    Floor,
    /// The median weight of the model's measured active peers (the placeholder when none is
    /// measured).
    Median,
}

impl Unmeasured {
    /// Valid names, in the order messages list them; the first is the default.
    pub const NAMES: [&'static str; 3] = ["neutral", "floor", "median"];

    /// The YAML name.
    pub fn name(self) -> &'static str {
        match self {
            Unmeasured::Neutral => Self::NAMES[0],
            Unmeasured::Floor => Self::NAMES[1],
            Unmeasured::Median => Self::NAMES[2],
        }
    }

    /// The choice of a YAML name.
    pub fn from_name(name: &str) -> Option<Unmeasured> {
        [Unmeasured::Neutral, Unmeasured::Floor, Unmeasured::Median]
            .into_iter()
            .find(|u| u.name() == name)
    }
}

/// Envoy-style slow start of a new or restarted worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowStart {
    /// How long the ramp lasts (> 0).
    pub window: Duration,
    /// Shape of the ramp (> 0): 1.0 is linear, larger rises faster at first.
    pub aggression: f64,
    /// The smallest factor, in (0, 1] (Envoy's `min_weight_percent` / 100).
    pub floor: f64,
}

impl Default for SlowStart {
    /// Window 60 s (ours; Envoy has no default), aggression 1.0 and floor 0.1 (Envoy's
    /// defaults).
    fn default() -> Self {
        SlowStart {
            window: Duration::from_secs(60),
            aggression: 1.0,
            floor: 0.1,
        }
    }
}

impl SlowStart {
    /// The factor `elapsed` after the start; 1.0 once the window has passed.
    pub fn factor(&self, elapsed: Duration) -> f64 {
        let window = self.window.as_secs_f64();
        let t = elapsed.as_secs_f64();
        if window <= 0.0 || t >= window {
            return 1.0;
        }
        let ramp = (t / window).powf(1.0 / self.aggression);
        if ramp.is_finite() {
            ramp.clamp(self.floor, 1.0)
        } else {
            self.floor
        }
    }
}

/// How a strategy's weights are shaped for new and unmeasured workers. The default changes
/// nothing (and [`Shaping::wrap`] then returns the strategy itself).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Shaping {
    /// The weight of an unmeasured worker.
    pub unmeasured: Unmeasured,
    /// Slow start of new and restarted workers, if any.
    pub slow_start: Option<SlowStart>,
}

impl Shaping {
    /// True when the shaping changes nothing.
    pub fn is_identity(&self) -> bool {
        self.unmeasured == Unmeasured::Neutral && self.slow_start.is_none()
    }

    /// `inner` with this shaping; `clamp` is the strategy's bounds (`floor` reads its minimum).
    pub fn wrap(self, inner: Box<dyn WeightStrategy>, clamp: Clamp) -> Box<dyn WeightStrategy> {
        if self.is_identity() {
            inner
        } else {
            Box::new(Shaped::new(inner, self, clamp))
        }
    }
}

/// A strategy with its weights shaped for new and unmeasured workers.
#[derive(Debug)]
pub struct Shaped {
    inner: Box<dyn WeightStrategy>,
    shaping: Shaping,
    clamp: Clamp,
    /// When each worker's ramp started; `None` when it is not ramping.
    ramp_since: Vec<Option<Time>>,
    /// The effective weights, re-derived at every change.
    weights: Vec<Weight>,
}

impl Shaped {
    /// `inner` shaped by `shaping`; `clamp` is the strategy's bounds.
    pub fn new(inner: Box<dyn WeightStrategy>, shaping: Shaping, clamp: Clamp) -> Self {
        Shaped {
            inner,
            shaping,
            clamp,
            ramp_since: Vec::new(),
            weights: Vec::new(),
        }
    }

    fn ramping(&self) -> bool {
        self.ramp_since.iter().any(Option::is_some)
    }

    fn rederive(&mut self, now: Time, fleet: &Fleet) {
        let inner: Vec<Weight> = fleet
            .iter()
            .map(|(id, _)| self.inner.weight(id, fleet))
            .collect();
        let medians = (self.shaping.unmeasured == Unmeasured::Median).then(|| {
            sorted_by_model(fleet, |id| {
                let w = inner[id.index()];
                (!w.is_unmeasured()).then_some(w.value)
            })
        });
        self.weights.clear();
        for (id, info) in fleet.iter() {
            let mut w = inner[id.index()];
            if w.is_unmeasured() {
                w.value = match self.shaping.unmeasured {
                    Unmeasured::Neutral => w.value,
                    Unmeasured::Floor => self.clamp.min,
                    Unmeasured::Median => medians
                        .as_ref()
                        .and_then(|m| m.get(&info.model))
                        .and_then(|v| sorted_median(v, None))
                        .filter(|m| *m > 0.0)
                        .unwrap_or(w.value),
                };
            }
            if let (Some(ramp), Some(slot)) =
                (self.shaping.slow_start, self.ramp_since.get_mut(id.index()))
                && let Some(since) = *slot
            {
                let f = ramp.factor(now.saturating_since(since));
                if f >= 1.0 {
                    *slot = None;
                } else {
                    w.value *= f;
                }
            }
            self.weights.push(w);
        }
    }
}

impl WeightStrategy for Shaped {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn observe(&mut self, now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        let inner = self.inner.observe(now, event, fleet);
        let shaped = match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                if self.shaping.slow_start.is_some() {
                    *ensure_slot(&mut self.ramp_since, id) = Some(now);
                }
                true
            }
            WeightEvent::Tick => self.ramping(),
            _ => false,
        };
        if inner == WeightChange::None && !shaped {
            return WeightChange::None;
        }
        // A median placeholder follows its peers, so any change may move every weight.
        self.rederive(now, fleet);
        WeightChange::All
    }

    fn weight(&self, worker: WorkerId, fleet: &Fleet) -> Weight {
        self.weights
            .get(worker.index())
            .copied()
            .unwrap_or_else(|| self.inner.weight(worker, fleet))
    }

    fn weights(&self) -> Option<&[Weight]> {
        Some(&self.weights)
    }

    /// The shaping itself reads registrations, restarts and ticks only.
    fn observes_requests(&self) -> bool {
        self.inner.observes_requests()
    }

    fn poll_probes(&mut self, now: Time, fleet: &Fleet, out: &mut Vec<ProbeOrder>) {
        self.inner.poll_probes(now, fleet, out);
    }

    fn export_state(&self) -> Option<PersistedProbeState> {
        self.inner.export_state()
    }

    fn import_state(&mut self, state: PersistedProbeState) {
        self.inner.import_state(state);
    }

    fn probed_prefill_tok_s(&self, worker: WorkerId) -> Option<f64> {
        self.inner.probed_prefill_tok_s(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_rises_from_the_floor_to_one_over_the_window() {
        let s = SlowStart {
            window: Duration::from_secs(100),
            aggression: 1.0,
            floor: 0.1,
        };
        assert_eq!(s.factor(Duration::ZERO), 0.1);
        assert_eq!(s.factor(Duration::from_secs(5)), 0.1);
        assert!((s.factor(Duration::from_secs(50)) - 0.5).abs() < 1e-12);
        assert_eq!(s.factor(Duration::from_secs(100)), 1.0);
        assert_eq!(s.factor(Duration::from_secs(1000)), 1.0);
        // Aggression 2 rises as the square root: faster at first.
        let fast = SlowStart {
            aggression: 2.0,
            ..s
        };
        assert!((fast.factor(Duration::from_secs(25)) - 0.5).abs() < 1e-12);
        let slow = SlowStart {
            aggression: 0.5,
            ..s
        };
        assert!((slow.factor(Duration::from_secs(50)) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn names_round_trip() {
        for n in Unmeasured::NAMES {
            assert_eq!(Unmeasured::from_name(n).unwrap().name(), n);
        }
        assert_eq!(Unmeasured::from_name("zero"), None);
        assert_eq!(Unmeasured::default().name(), Unmeasured::NAMES[0]);
    }
}
