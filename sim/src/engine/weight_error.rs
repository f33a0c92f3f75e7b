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
//! came in between.

use super::Sim;
use routelab_policies::weights::oracle_weights;
use routelab_policies::{Clamp, Time, Weight, WorkerId};

/// The clamp of the reference: the `oracle` strategy's default.
const ORACLE_CLAMP: Clamp = Clamp::SOURCE;

/// The running state of the integral.
#[derive(Debug)]
pub(super) struct WeightErrorTracker {
    /// True capacity by router id, tokens/s, as told to the router.
    capacity: Vec<f64>,
    /// By replica, then router id: the error held since `since`, or `None` while the worker
    /// is not active (or its oracle weight is unknown).
    held: Vec<Vec<Option<f64>>>,
    since: Time,
    /// A re-read is due before time moves on.
    due: bool,
    /// The oracle weights by router id, while neither the true capacities nor the fleet
    /// changed.
    oracle: Option<Vec<Weight>>,
}

impl WeightErrorTracker {
    /// Nothing held yet, for `replicas` gateway replicas.
    pub(super) fn new(replicas: usize) -> Self {
        WeightErrorTracker {
            capacity: Vec::new(),
            held: vec![Vec::new(); replicas],
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
        self.close_weight_interval();
        if self.werr.oracle.is_none() {
            let fleet = self.replicas[0].router.fleet();
            self.werr.oracle = Some(oracle_weights(fleet, &self.werr.capacity, ORACLE_CLAMP));
        }
        for r in 0..self.replicas.len() {
            let held = self.weight_errors_now(r);
            self.werr.held[r] = held;
        }
    }

    /// Add the held errors from the last re-read to `now`.
    pub(super) fn close_weight_interval(&mut self) {
        let from = self.werr.since.as_secs_f64();
        let to = self.now.as_secs_f64();
        if to > from {
            let m = self.rec.metrics_mut();
            let several = m.replicas.len() > 1;
            for (r, held) in self.werr.held.iter().enumerate() {
                for (id, e) in held.iter().enumerate() {
                    if let Some(e) = e {
                        m.workers[self.by_id[id] as usize]
                            .weight_error
                            .add(*e, from, to);
                        if several {
                            m.replicas[r].weight_error.add(*e, from, to);
                        }
                    }
                }
            }
        }
        self.werr.since = self.now;
    }

    /// Each router id's `|ln(weight / oracle weight)|` at replica `replica` now (`None`: not
    /// active, or no oracle weight).
    fn weight_errors_now(&self, replica: usize) -> Vec<Option<f64>> {
        let router = &self.replicas[replica].router;
        let fleet = router.fleet();
        let computed;
        let oracle = match &self.werr.oracle {
            Some(o) => o,
            None => {
                computed = oracle_weights(fleet, &self.werr.capacity, ORACLE_CLAMP);
                &computed
            }
        };
        fleet
            .iter()
            .map(|(id, info)| {
                let o = oracle[id.index()];
                if !info.is_active() || o.is_unmeasured() {
                    return None;
                }
                let w = router.weight(id)?.value;
                Some((w / o.value).ln().abs()).filter(|e| e.is_finite())
            })
            .collect()
    }

    /// Debug builds: the held errors are still the current ones (no weight moved at an event
    /// the engine does not re-read at).
    pub(super) fn check_weights_tracked(&self) {
        for r in 0..self.replicas.len() {
            debug_assert_eq!(
                self.werr.held[r],
                self.weight_errors_now(r),
                "a weight of replica {r} changed at {} without the weight error being re-read",
                self.now
            );
        }
    }
}
