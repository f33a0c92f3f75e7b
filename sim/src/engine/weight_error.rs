//! The weight error: how far the router's weight of each worker is from the oracle's, as
//! `|ln(weight / oracle weight)|` integrated over the time the worker is active.
//!
//! The oracle weight is what the `oracle` strategy (with its default clamp) would give: the
//! true capacity the simulator tells the router ([`Sim::tell_oracle`]) relative to the median of
//! the model's active workers, by the oracle's own rule (`weights::oracle_weights`). Both
//! weights only change where the router's weights or the fleet change — registration,
//! lifecycle events, ticks and probe measurements — so the engine closes the running interval
//! and re-reads every weight after those events ([`Sim::track_weights`]) and the integral
//! is exact. Debug builds check at each timeline sample that nothing moved in between. With
//! several gateway replicas each replica's weights are read against the same oracle (every
//! replica sees the same registrations and lifecycle events, so the same active fleet).
//!
//! Two things keep it cheap on a large fleet without changing a figure: the re-read is due at
//! such an event but done once, before time moves on ([`Sim::weights_changed`]; intervals of
//! zero length add nothing, so a burst of registrations at one instant is one re-read instead
//! of one per worker), and the oracle weights are kept between re-reads unless a registration
//! or a lifecycle event (the only events that change the true capacities or the active fleet)
//! came in between. A re-read of 10,240 workers at each of 10,240 probe measurements is still
//! 10^8 worker re-reads, so each is kept small: it streams through flat arrays in router id
//! order ([`HeldErrors`], the integral), closing the interval in the same pass, and takes the
//! logarithm only for a worker whose weight or oracle weight moved (the same figures, with the
//! same float operations per worker, in the same order).

use super::Sim;
use crate::results::{Span, WeightError};
use routelab_policies::weights::oracle_weights;
use routelab_policies::{Clamp, Time, Weight, WorkerId};

/// The clamp of the reference: the `oracle` strategy's default.
const ORACLE_CLAMP: Clamp = Clamp::SOURCE;

/// "None" in the flat arrays of [`HeldErrors`]: every value they hold when there is one is
/// finite (an error that is not is not held; weights and oracle weights are finite), so a NaN
/// marks its absence at half the size of an `Option<f64>`.
const NONE: f64 = f64::NAN;

/// The running state of the integral.
#[derive(Debug)]
pub(super) struct WeightErrorTracker {
    /// True capacity by router id, tokens/s, as told to the router.
    capacity: Vec<f64>,
    /// By replica: what each router id's error is now.
    held: Vec<HeldErrors>,
    /// By router id: the integral so far, over every replica. Ids and fleet indices are one to
    /// one, so it goes to [`RunMetrics::workers`](crate::results::RunMetrics) at the end
    /// ([`Sim::hand_over_weight_errors`]); kept here, in id order, a re-read streams through
    /// it.
    integral: Vec<WeightError>,
    since: Time,
    /// A re-read is due before time moves on.
    due: bool,
    /// The oracle weights by router id, while neither the true capacities nor the fleet
    /// changed (every replica's [`HeldErrors::reference`] with them).
    oracle: Option<Vec<Weight>>,
}

/// One replica's held errors, flat arrays in router id order ([`NONE`] for "none").
#[derive(Debug, Default)]
struct HeldErrors {
    /// The error held since `since`; none while the worker is not active (or its oracle
    /// weight is unknown).
    error: Vec<f64>,
    /// The weight `error` was taken from, against the current `reference` (none: it was not
    /// taken from one). A re-read that finds the same weight, to the bit, keeps the error
    /// without taking its logarithm again.
    weight: Vec<f64>,
    /// The oracle weight of each worker active at this replica and with a known one, as of
    /// the last oracle derivation (activity and the oracle change only at registrations and
    /// lifecycle events, which derive it anew).
    reference: Vec<f64>,
}

impl HeldErrors {
    /// The held errors as `Option`s.
    fn errors(&self) -> Vec<Option<f64>> {
        self.error
            .iter()
            .map(|&e| (!e.is_nan()).then_some(e))
            .collect()
    }
}

impl WeightErrorTracker {
    /// Nothing held yet, for `replicas` gateway replicas.
    pub(super) fn new(replicas: usize) -> Self {
        WeightErrorTracker {
            capacity: Vec::new(),
            held: (0..replicas).map(|_| HeldErrors::default()).collect(),
            integral: Vec::new(),
            since: Time::ZERO,
            due: false,
            oracle: None,
        }
    }

    /// Remember the true capacity the router was told for `id`.
    pub(super) fn set_capacity(&mut self, id: WorkerId, tok_s: f64) {
        if self.capacity.len() <= id.index() {
            self.capacity.resize(id.index() + 1, 0.0);
        }
        self.capacity[id.index()] = tok_s;
        self.oracle = None;
    }
}

/// `|ln(weight / oracle)|`, or `None` when it is not finite.
#[inline]
fn log_ratio(weight: f64, oracle: f64) -> Option<f64> {
    Some((weight / oracle).ln().abs()).filter(|e| e.is_finite())
}

impl Sim<'_> {
    /// The event just handled may have changed weights (`fleet` when it may have changed the
    /// active fleet or true capacities too): re-read before time moves on.
    pub(super) fn weights_changed(&mut self, fleet: bool) {
        self.werr.due = true;
        if fleet {
            self.werr.oracle = None;
        }
    }

    /// Re-read now if a re-read is due (call before time moves on, before a timeline sample's
    /// check and at the end of the run). Inlined: the loop asks at almost every event, and a
    /// re-read is rarely due. (Always inlined, with the re-read kept out of line: as one
    /// function the check paid the re-read's register saves at every event.)
    #[inline(always)]
    pub(super) fn flush_weights(&mut self) {
        if self.werr.due {
            self.track_weights();
        }
    }

    /// Close the running interval at `now` and re-read every replica's weights and, when they
    /// may have changed, the oracle weights.
    #[inline(never)]
    fn track_weights(&mut self) {
        self.werr.due = false;
        if self.werr.oracle.is_none() {
            // The interval is closed against the references it was held with.
            self.close_weight_interval();
            let fleet = self.replicas[0].router.fleet();
            self.werr.oracle = Some(oracle_weights(fleet, &self.werr.capacity, ORACLE_CLAMP));
            for r in 0..self.replicas.len() {
                self.derive_references(r);
                self.close_and_reread(r, None, true);
            }
        } else {
            let span = self.open_span();
            for r in 0..self.replicas.len() {
                self.close_and_reread(r, span, true);
            }
        }
    }

    /// The running interval, ended now (`None`: it is empty); the next one starts now.
    fn open_span(&mut self) -> Option<Span> {
        let from = self.werr.since.as_secs_f64();
        let to = self.now.as_secs_f64();
        self.werr.since = self.now;
        (to > from).then(|| WeightError::span(from, to))
    }

    /// Replica `replica`'s [`HeldErrors::reference`] from the oracle weights just derived; a
    /// worker whose reference moved has its error taken anew.
    fn derive_references(&mut self, replica: usize) {
        let fleet = self.replicas[replica].router.fleet();
        let oracle = self.werr.oracle.as_deref().unwrap_or_default();
        let held = &mut self.werr.held[replica];
        let n = fleet.len();
        held.reference.resize(n, NONE);
        held.error.resize(n, NONE);
        held.weight.resize(n, NONE);
        for ((id, info), (reference, weight)) in fleet
            .iter()
            .zip(held.reference.iter_mut().zip(&mut held.weight))
        {
            let o = oracle[id.index()];
            let new = if info.is_active() && !o.is_unmeasured() {
                o.value
            } else {
                NONE
            };
            if new.to_bits() != reference.to_bits() {
                *reference = new;
                *weight = NONE;
            }
        }
        if self.werr.integral.len() < n {
            self.werr.integral.resize(n, WeightError::default());
        }
    }

    /// Add replica `replica`'s held errors over `span` (`None`: nothing to add) and, if
    /// `reread`, re-read them: what [`Sim::weight_errors_now`] gives, in one pass.
    #[inline]
    fn close_and_reread(&mut self, replica: usize, span: Option<Span>, reread: bool) {
        let router = &self.replicas[replica].router;
        let held = &mut self.werr.held[replica];
        let m = self.rec.metrics_mut();
        let mut totals = (m.replicas.len() > 1).then(|| &mut m.replicas[replica].weight_error);
        // every weight in one pass over the strategy's slice, not a call through it per worker
        let mut current = router.weights();
        let rows = held
            .error
            .iter_mut()
            .zip(&held.reference)
            .zip(&mut held.weight);
        for (((error, &reference), weight), integral) in rows.zip(&mut self.werr.integral) {
            if let Some(span) = span
                && !error.is_nan()
            {
                integral.add_span(*error, span);
                if let Some(totals) = totals.as_deref_mut() {
                    totals.add_span(*error, span);
                }
            }
            if !reread {
                continue;
            }
            let w = current.next().map_or(NONE, |w| w.value);
            if reference.is_nan() {
                *error = NONE;
                continue;
            }
            if w.to_bits() != weight.to_bits() {
                *error = log_ratio(w, reference).unwrap_or(NONE);
                *weight = w;
            }
        }
    }

    /// Add the held errors from the last re-read to `now`.
    pub(super) fn close_weight_interval(&mut self) {
        if let Some(span) = self.open_span() {
            for r in 0..self.replicas.len() {
                self.close_and_reread(r, Some(span), false);
            }
        }
    }

    /// The integral of each worker to the run's metrics (at the end, after the last interval
    /// was closed).
    pub(super) fn hand_over_weight_errors(&mut self) {
        let m = self.rec.metrics_mut();
        for (id, integral) in self.werr.integral.iter().enumerate() {
            m.workers[self.by_id[id] as usize].weight_error = *integral;
        }
    }

    /// Each router id's `|ln(weight / oracle weight)|` at replica `replica` now (`None`: not
    /// active, or no oracle weight), derived from scratch: the reference the held errors are
    /// checked against.
    fn weight_errors_now(&self, replica: usize) -> Vec<Option<f64>> {
        let oracle = oracle_weights(self.router().fleet(), &self.werr.capacity, ORACLE_CLAMP);
        let router = &self.replicas[replica].router;
        router
            .fleet()
            .iter()
            .map(|(id, info)| {
                let o = oracle[id.index()];
                if !info.is_active() || o.is_unmeasured() {
                    return None;
                }
                log_ratio(router.weight(id)?.value, o.value)
            })
            .collect()
    }

    /// Debug builds: the held errors are still the current ones (no weight moved at an event
    /// the engine does not re-read at, and the kept oracle weights and logarithms are those a
    /// derivation from scratch gives).
    pub(super) fn check_weights_tracked(&self) {
        for r in 0..self.replicas.len() {
            debug_assert_eq!(
                self.werr.held[r].errors(),
                self.weight_errors_now(r),
                "a weight of replica {r} changed at {} without the weight error being re-read",
                self.now
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flat arrays' "none" reads back as `None`, and every held value as itself, to the
    /// bit (zero, the smallest and largest errors included).
    #[test]
    fn held_errors_read_back_as_options() {
        let held = HeldErrors {
            error: vec![NONE, 0.0, 1.5, f64::MIN_POSITIVE, f64::MAX, NONE],
            weight: vec![NONE; 6],
            reference: vec![NONE; 6],
        };
        let expected = [
            None,
            Some(0.0),
            Some(1.5),
            Some(f64::MIN_POSITIVE),
            Some(f64::MAX),
            None,
        ];
        let got = held.errors();
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            assert_eq!(g.map(f64::to_bits), e.map(f64::to_bits));
        }
    }

    /// `log_ratio` is the error's one formula: `|ln(w / o)|`, absent when not finite.
    #[test]
    fn log_ratio_is_the_absolute_log_or_none() {
        assert_eq!(log_ratio(2.0, 1.0), Some(2f64.ln()));
        assert_eq!(log_ratio(1.0, 2.0), Some(2f64.ln()));
        assert_eq!(log_ratio(0.0, 1.0), None);
        assert_eq!(log_ratio(1.0, 0.0), None);
        assert_eq!(log_ratio(f64::NAN, 1.0), None);
    }
}
