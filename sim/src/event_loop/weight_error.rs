//! The weight error: how far the router's weight of each worker is from the oracle's, as
//! `|ln(weight / oracle weight)|` integrated over the time the worker is active, against two
//! oracles that differ only in the concurrency at which they rate each engine.
//!
//! The oracle weight is what the `oracle` strategy (with its default clamp) would give: a true
//! capacity relative to the median of the model's active workers, by the oracle's own rule
//! (`weights::oracle_weights`). The two references (issue 27):
//! - **at the operating concurrency** (the headline, `weight_error`): each engine's decode
//!   capacity at the concurrency the traffic runs it at, `aggregate_tok_s(c̄) × speed factor`,
//!   where c̄ is the number of sequences **decoding** on it (not those still prefilling: the
//!   decode curve's own variable, so c̄ and the oracle's 16 are on the same axis), averaged
//!   over the time it has been active (idle time counts as 0; replica 0's view of activity);
//! - **at the oracle concurrency** (`weight_error_at_oracle_concurrency`): every engine rated
//!   at the scenario's `oracle_concurrency` (16 by default), the capacity the simulator tells
//!   the router ([`Sim::tell_oracle`]) — the reference before issue 27.
//!
//! **c̄ is an online estimate.** The whole run's average is known only at its end, while the
//! weights it judges change throughout; an exact figure against it would have to keep every
//! weight each worker held (`bench/fleet-10k`'s first 180 s hold 5.8 million weight changes
//! as 10,240 workers are first probed and each measurement moves the median), so the
//! reference is instead re-derived from the average **so far**: at every registration or
//! lifecycle event, and at the first event at or after 1, 2, 4, … 32 s and then each
//! [`OPERATING_REFRESH_NS`] (a minute) of simulated time ([`next_refresh`]), whether or not a
//! weight moved there (a run whose weights never move still gets a reference) — and every
//! second while an active worker has decoded nothing yet. Between re-derivations it is
//! fixed, so the integral against it is exact for the reference it defines. The estimate
//! converges to the run's average as the run goes on; `weight_error_after_10m` judges the
//! weights against averages over at least 10 minutes. A worker that has decoded nothing yet
//! has no operating capacity (0 is "unknown" to the oracle's rule) and is not counted until
//! it has.
//!
//! Both weights only change where the router's weights, the fleet or the reference change —
//! registration, lifecycle events, ticks, probe measurements and the refreshes — so the event
//! loop re-reads every weight after those events ([`WeightErrorTracker::track`]) and the
//! integral is exact. Debug builds check at each timeline sample that nothing moved in between. With
//! several gateway replicas each replica's weights are read against the same oracles (every
//! replica sees the same registrations and lifecycle events, so the same active fleet).
//!
//! What keeps it cheap on a large fleet: the re-read is due at such an event but done once,
//! before time moves on ([`WeightErrorTracker::weights_changed`]; a burst of registrations at
//! one instant is one re-read instead of one per worker); the oracle weights are kept between re-reads unless
//! a registration, a lifecycle event or a refresh came in between; and a re-read of 10,240
//! workers at each of 10,240 probe measurements (10^8 worker re-reads) streams through flat
//! arrays in router id order ([`HeldErrors`]) comparing each weight with the one held, and
//! does work only for a worker whose weight moved: it adds the errors held since that worker's
//! last change to the integrals (each worker's piece is closed when it ends, not at every
//! re-read: the same integral, summed over fewer, longer intervals) and takes the two
//! logarithms of the new weight.

use super::Sim;
use super::fleet::Fleet;
use super::replicas::Replicas;
use super::setup::SimSetup;
use crate::hardware::HardwareProfile;
use crate::results::{ReplicaTotals, RunMetrics, WeightError};
use routelab_policies::weights::oracle_weights;
use routelab_policies::{Clamp, Router, Time, Weight, WorkerId};

/// The clamp of the reference: the `oracle` strategy's default.
const ORACLE_CLAMP: Clamp = Clamp::SOURCE;

/// How often the operating-concurrency reference is re-derived from the averages so far once
/// the run is a minute old, ns of simulated time (at the first event at or after each
/// multiple). Each re-derivation is a few passes over the fleet, an oracle derivation and two
/// logarithms per active worker; once a minute keeps that within the speed gate's tolerance on
/// `bench/fleet-64` (every 10 s cost +1 % per request), and an average over the whole run so
/// far moves little in a minute.
pub const OPERATING_REFRESH_NS: u64 = 60_000_000_000;

/// The first re-derivation after registration, ns: the averages over the first second.
const FIRST_REFRESH_NS: u64 = 1_000_000_000;

/// When the re-derivation after one at `now_ns` is due: each time the run's age doubles (1, 2,
/// 4, … 32 s: an average over a short past moves fast, and a short run still gets a reference),
/// then every [`OPERATING_REFRESH_NS`].
fn next_refresh(now_ns: u64) -> u64 {
    let period = OPERATING_REFRESH_NS;
    let doubled = now_ns.saturating_mul(2).max(FIRST_REFRESH_NS);
    doubled.min((now_ns / period + 1) * period)
}

/// "None" in the flat arrays of [`HeldErrors`]: every value they hold when there is one is
/// finite (an error that is not is not held; weights and oracle weights are finite), so a NaN
/// marks its absence at half the size of an `Option<f64>`.
const NONE: f64 = f64::NAN;

/// The running state of the integral.
#[derive(Debug)]
pub(super) struct WeightErrorTracker {
    /// True capacity by router id at the oracle concurrency, tokens/s, as told to the router.
    capacity: Vec<f64>,
    /// The speed factor each of those was told with, by router id.
    speed: Vec<f64>,
    /// Capacity at the operating concurrency so far, by router id (0: unknown), as of the last
    /// re-derivation.
    operating: Vec<f64>,
    /// The operating concurrency's running sums, by router id.
    concurrency: Vec<Concurrency>,
    /// When the running sums were last brought up to date.
    counted_to: Time,
    /// The next refresh of the operating-concurrency reference is due at the first event at
    /// or after this (the event loop marks a re-read due there).
    next_refresh: Time,
    /// By replica: what each router id's errors are now.
    held: Vec<HeldErrors>,
    /// By router id: the integrals so far, over every replica. Ids and fleet indices are one to
    /// one, so they go to [`RunMetrics::workers`](crate::results::RunMetrics) at the end
    /// ([`WeightErrorTracker::hand_over`]).
    integral: Vec<Integrals>,
    /// A re-read is due before time moves on.
    due: bool,
    /// The oracle weights at the oracle concurrency by router id, while neither the true
    /// capacities nor the fleet changed (every replica's [`HeldErrors::reference`] with them).
    oracle: Option<Vec<Weight>>,
    /// The oracle weights at the operating concurrency by router id, as of the last
    /// re-derivation.
    oracle_operating: Vec<Weight>,
}

/// One worker's integrals against the two references.
#[derive(Debug, Clone, Copy, Default)]
struct Integrals {
    operating: WeightError,
    oracle: WeightError,
}

/// The running sums of one worker's operating concurrency.
#[derive(Debug, Clone, Copy, Default)]
struct Concurrency {
    /// Sequence-nanoseconds decoding while active.
    decoding_ns: u64,
    /// Nanoseconds active.
    active_ns: u64,
    /// The engine's own running sum (all time) when last read.
    seen_ns: u64,
    /// Active (at replica 0, with a known capacity) since the sums were last brought up to date.
    active: bool,
}

impl Concurrency {
    /// Sequences decoding, time-averaged over the active time so far (`None`: never active).
    fn mean(&self) -> Option<f64> {
        (self.active_ns > 0).then(|| self.decoding_ns as f64 / self.active_ns as f64)
    }
}

/// One replica's held errors, flat arrays in router id order ([`NONE`] for "none").
#[derive(Debug, Default)]
struct HeldErrors {
    /// The error against the oracle concurrency's reference held since `since`; none while
    /// the worker is not active (or its oracle weight is unknown).
    error: Vec<f64>,
    /// The same against the operating concurrency's reference; none also while that is
    /// unknown.
    error_operating: Vec<f64>,
    /// When the held errors started (s of simulated time): they are added to the integrals
    /// when they end.
    since: Vec<f64>,
    /// The weight the errors were taken from, against the current references (none: they were
    /// not taken from one). A re-read that finds the same weight, to the bit, keeps them.
    weight: Vec<f64>,
    /// The oracle weight at the oracle concurrency of each worker active at this replica and
    /// with a known one, as of the last oracle derivation (activity and the oracle change only
    /// at registrations and lifecycle events, which derive it anew).
    reference: Vec<f64>,
    /// The oracle weight at the operating concurrency of each worker that has `reference` and
    /// a known operating capacity, as of the last derivation.
    reference_operating: Vec<f64>,
}

impl HeldErrors {
    /// The held errors as `Option`s: against the oracle concurrency and the operating one.
    fn errors(&self) -> Vec<(Option<f64>, Option<f64>)> {
        let some = |e: f64| (!e.is_nan()).then_some(e);
        self.error
            .iter()
            .zip(&self.error_operating)
            .map(|(&e, &o)| (some(e), some(o)))
            .collect()
    }
}

impl WeightErrorTracker {
    /// Nothing held yet, for `replicas` gateway replicas.
    pub(super) fn new(replicas: usize) -> Self {
        WeightErrorTracker {
            capacity: Vec::new(),
            speed: Vec::new(),
            operating: Vec::new(),
            concurrency: Vec::new(),
            counted_to: Time::ZERO,
            next_refresh: Time::ZERO,
            held: (0..replicas).map(|_| HeldErrors::default()).collect(),
            integral: Vec::new(),
            due: false,
            oracle: None,
            oracle_operating: Vec::new(),
        }
    }

    /// Remember the true capacity the router was told for `id` (at the oracle concurrency)
    /// and the speed factor it includes.
    pub(super) fn set_capacity(&mut self, id: WorkerId, tok_s: f64, speed: f64) {
        if self.capacity.len() <= id.index() {
            self.capacity.resize(id.index() + 1, 0.0);
            self.speed.resize(id.index() + 1, 0.0);
        }
        self.capacity[id.index()] = tok_s;
        self.speed[id.index()] = speed;
        self.oracle = None;
    }
}

/// `|ln(weight / oracle)|`, or `None` when it is not finite.
#[inline]
fn log_ratio(weight: f64, oracle: f64) -> Option<f64> {
    Some((weight / oracle).ln().abs()).filter(|e| e.is_finite())
}

/// A worker's capacity at its operating concurrency `mean` (sequences decoding, time-averaged):
/// its decode aggregate there × its speed factor, as the oracle concurrency's capacity is
/// made. 0 — "unknown" to the oracle's rule — when it was never active or decoded nothing.
fn operating_capacity(profile: &HardwareProfile, mean: Option<f64>, speed: f64) -> f64 {
    mean.filter(|&c| c > 0.0)
        .map_or(0.0, |c| profile.aggregate_tok_s(c) * speed)
}

/// Add the errors held from `since` to `now_s` (each absent one adds nothing) to a worker's
/// integrals and, with several replicas, to its replica's totals.
#[inline]
fn add_held(
    (error, operating): (f64, f64),
    since: f64,
    now_s: f64,
    integral: &mut Integrals,
    totals: Option<&mut ReplicaTotals>,
) {
    let span = WeightError::span(since, now_s);
    if !error.is_nan() {
        integral.oracle.add_span(error, span);
    }
    if !operating.is_nan() {
        integral.operating.add_span(operating, span);
    }
    if let Some(t) = totals {
        if !error.is_nan() {
            t.weight_error_at_oracle_concurrency.add_span(error, span);
        }
        if !operating.is_nan() {
            t.weight_error.add_span(operating, span);
        }
    }
}

/// What the tracker reads of the run at an instant: the time, the replicas' weights and
/// fleets, the engines' decoding sums and the workers' profiles.
pub(super) struct RunView<'s> {
    pub(super) now: Time,
    pub(super) replicas: &'s Replicas,
    pub(super) fleet: &'s Fleet,
    pub(super) setup: &'s SimSetup,
}

impl WeightErrorTracker {
    /// The event loop is at an event at `at`: the operating-concurrency reference is
    /// re-derived at the first event at or after each refresh time, whether or not a weight
    /// moved there.
    #[inline(always)]
    pub(super) fn note_event(&mut self, at: Time) {
        if at >= self.next_refresh {
            self.due = true;
        }
    }

    /// The event just handled may have changed weights (`fleet` when it may have changed the
    /// active fleet or true capacities too): re-read before time moves on.
    #[inline]
    pub(super) fn weights_changed(&mut self, fleet: bool) {
        self.due = true;
        if fleet {
            self.oracle = None;
        }
    }

    /// Whether a re-read is due before time moves on.
    #[inline(always)]
    pub(super) fn due(&self) -> bool {
        self.due
    }

    /// Re-read every replica's weights and, when they may have changed, the oracle weights
    /// (re-deriving the operating-concurrency reference too when a refresh is due).
    pub(super) fn track(&mut self, run: &RunView<'_>, m: &mut RunMetrics) {
        self.due = false;
        let refresh = run.now >= self.next_refresh;
        if self.oracle.is_none() || refresh {
            // Every held error ends here, against the references it was held with.
            self.close_interval(run, m);
            if self.oracle.is_none() {
                let fleet = run.replicas.first().fleet();
                self.oracle = Some(oracle_weights(fleet, &self.capacity, ORACLE_CLAMP));
            }
            self.derive_operating(run);
            for r in 0..run.replicas.len() {
                self.derive_references(&run.replicas.get(r).router, r);
            }
            // Who is active from now on, for the operating concurrency's sums; one that has
            // decoded nothing yet has no reference, so the next refresh comes within a second.
            let mut waiting = false;
            let rows = self.concurrency.iter_mut().zip(&self.operating);
            for ((c, &op), r) in rows.zip(&self.held[0].reference) {
                c.active = !r.is_nan();
                waiting |= c.active && op == 0.0;
            }
            let now = run.now.as_nanos();
            let regular = next_refresh(now);
            let next = if waiting {
                regular.min(now + FIRST_REFRESH_NS)
            } else {
                regular
            };
            self.next_refresh = Time::from_nanos(next);
        }
        let several = m.replicas.len() > 1;
        for r in 0..run.replicas.len() {
            let totals = several.then(|| &mut m.replicas[r]);
            self.reread(run.now, &run.replicas.get(r).router, r, totals);
        }
    }

    /// The operating capacities from the averages so far, and their oracle weights.
    fn derive_operating(&mut self, run: &RunView<'_>) {
        self.operating.clear();
        for (id, c) in self.concurrency.iter().enumerate() {
            let worker = run.fleet.at_router_index(id) as usize;
            let profile = &run.setup.workers[worker].profile;
            self.operating
                .push(operating_capacity(profile, c.mean(), self.speed[id]));
        }
        let fleet = run.replicas.first().fleet();
        self.oracle_operating = oracle_weights(fleet, &self.operating, ORACLE_CLAMP);
    }

    /// Replica `replica`'s [`HeldErrors::reference`] and [`HeldErrors::reference_operating`]
    /// from the oracle weights just derived; a worker whose references moved has its errors
    /// taken anew.
    fn derive_references(&mut self, router: &Router, replica: usize) {
        let fleet = router.fleet();
        let oracle = self.oracle.as_deref().unwrap_or_default();
        let operating = &self.oracle_operating;
        let held = &mut self.held[replica];
        let n = fleet.len();
        for v in [
            &mut held.reference,
            &mut held.reference_operating,
            &mut held.error,
            &mut held.error_operating,
            &mut held.weight,
        ] {
            v.resize(n, NONE);
        }
        held.since.resize(n, 0.0);
        let rows = held
            .reference
            .iter_mut()
            .zip(&mut held.reference_operating)
            .zip(&mut held.weight);
        for ((id, info), ((reference, reference_operating), weight)) in fleet.iter().zip(rows) {
            let o = oracle[id.index()];
            let new = if info.is_active() && !o.is_unmeasured() {
                o.value
            } else {
                NONE
            };
            let op = operating.get(id.index()).copied();
            let new_operating = match op {
                Some(op) if !new.is_nan() && !op.is_unmeasured() => op.value,
                _ => NONE,
            };
            if new.to_bits() != reference.to_bits()
                || new_operating.to_bits() != reference_operating.to_bits()
            {
                *reference = new;
                *reference_operating = new_operating;
                *weight = NONE;
            }
        }
        if self.integral.len() < n {
            self.integral.resize(n, Integrals::default());
        }
    }

    /// Re-read replica `replica`'s weights (`router`'s): what
    /// [`WeightErrorTracker::errors_now`] gives, in one pass. A worker whose weight moved has
    /// the errors it held so far added to the integrals (and, with several replicas, to the
    /// replica's `totals`).
    #[inline]
    fn reread(
        &mut self,
        now: Time,
        router: &Router,
        replica: usize,
        mut totals: Option<&mut ReplicaTotals>,
    ) {
        let now_s = now.as_secs_f64();
        let held = &mut self.held[replica];
        // every weight in one pass over the strategy's slice, not a call through it per worker
        let mut current = router.weights();
        let rows = held
            .error
            .iter_mut()
            .zip(&mut held.error_operating)
            .zip(&mut held.since)
            .zip(held.reference.iter().zip(&held.reference_operating))
            .zip(&mut held.weight);
        for (((((error, operating), since), (&reference, &reference_op)), weight), integral) in
            rows.zip(&mut self.integral)
        {
            let w = current.next().map_or(NONE, |w| w.value);
            if reference.is_nan() {
                // not active: it holds nothing (what it held ended at the re-derivation)
                *error = NONE;
                *operating = NONE;
                continue;
            }
            if w.to_bits() != weight.to_bits() {
                add_held(
                    (*error, *operating),
                    *since,
                    now_s,
                    integral,
                    totals.as_deref_mut(),
                );
                *since = now_s;
                *error = log_ratio(w, reference).unwrap_or(NONE);
                *operating = if reference_op.is_nan() {
                    NONE
                } else {
                    log_ratio(w, reference_op).unwrap_or(NONE)
                };
                *weight = w;
            }
        }
    }

    /// End every held error now (adding it to the integrals; the next piece starts now) and
    /// bring the operating concurrency's sums up to now: at every re-derivation and at the
    /// end of the run.
    pub(super) fn close_interval(&mut self, run: &RunView<'_>, m: &mut RunMetrics) {
        let now_s = run.now.as_secs_f64();
        let several = m.replicas.len() > 1;
        for (r, held) in self.held.iter_mut().enumerate() {
            let mut totals = several.then(|| &mut m.replicas[r]);
            let rows = held
                .error
                .iter()
                .zip(&held.error_operating)
                .zip(&mut held.since);
            for (((&error, &operating), since), integral) in rows.zip(&mut self.integral) {
                add_held(
                    (error, operating),
                    *since,
                    now_s,
                    integral,
                    totals.as_deref_mut(),
                );
                *since = now_s;
            }
        }
        self.count_concurrency(run);
    }

    /// Bring each worker's operating-concurrency sums up to now, with the activity it has
    /// held since they were last brought up to date (activity changes only at the
    /// re-derivations, which bring them up to date first).
    fn count_concurrency(&mut self, run: &RunView<'_>) {
        let now = run.now.as_nanos();
        let elapsed = now - self.counted_to.as_nanos();
        let n = run.replicas.first().fleet().len();
        if self.concurrency.len() < n {
            self.concurrency.resize(n, Concurrency::default());
        }
        for (id, c) in self.concurrency.iter_mut().enumerate() {
            let worker = run.fleet.at_router_index(id);
            let seen = run.fleet.get(worker).engine.decoding_ns(now);
            if c.active {
                c.decoding_ns += seen - c.seen_ns;
                c.active_ns += elapsed;
            }
            c.seen_ns = seen;
        }
        self.counted_to = run.now;
    }

    /// The integrals of each worker and its operating concurrency to the run's metrics (at
    /// the end, after the last interval was closed).
    pub(super) fn hand_over(&self, fleet: &Fleet, m: &mut RunMetrics) {
        for (id, integral) in self.integral.iter().enumerate() {
            let w = &mut m.workers[fleet.at_router_index(id) as usize];
            w.weight_error = integral.operating;
            w.weight_error_at_oracle_concurrency = integral.oracle;
            w.operating_concurrency = self.concurrency.get(id).and_then(Concurrency::mean);
        }
    }

    /// Each router id's errors at replica `replica` now — against the oracle concurrency's
    /// reference and the operating one (`None`: not active, or no oracle weight) — derived
    /// from scratch: the reference the held errors are checked against.
    #[allow(clippy::type_complexity)]
    fn errors_now(&self, replicas: &Replicas, replica: usize) -> Vec<(Option<f64>, Option<f64>)> {
        let fleet = replicas.first().fleet();
        let oracle = oracle_weights(fleet, &self.capacity, ORACLE_CLAMP);
        let operating = oracle_weights(fleet, &self.operating, ORACLE_CLAMP);
        let router = &replicas.get(replica).router;
        router
            .fleet()
            .iter()
            .map(|(id, info)| {
                let o = oracle[id.index()];
                if !info.is_active() || o.is_unmeasured() {
                    return (None, None);
                }
                let Some(w) = router.weight(id) else {
                    return (None, None);
                };
                let op = operating[id.index()];
                let at_operating = if op.is_unmeasured() {
                    None
                } else {
                    log_ratio(w.value, op.value)
                };
                (log_ratio(w.value, o.value), at_operating)
            })
            .collect()
    }

    /// Debug builds: the held errors are still the current ones (no weight moved at an event
    /// the event loop does not re-read at, and the kept oracle weights and logarithms are
    /// those a derivation from scratch gives).
    pub(super) fn check_tracked(&self, now: Time, replicas: &Replicas) {
        for r in 0..replicas.len() {
            debug_assert_eq!(
                self.held[r].errors(),
                self.errors_now(replicas, r),
                "a weight of replica {r} changed at {now} without the weight error being re-read"
            );
        }
    }
}

impl Sim<'_> {
    /// Re-read now if a re-read is due (call before time moves on, before a timeline sample's
    /// check and at the end of the run). Inlined: the loop asks at almost every event, and a
    /// re-read is rarely due. (Always inlined, with the re-read kept out of line: as one
    /// function the check paid the re-read's register saves at every event.)
    #[inline(always)]
    pub(super) fn flush_weights(&mut self) {
        if self.werr.due() {
            self.track_weights();
        }
    }

    #[inline(never)]
    fn track_weights(&mut self) {
        let view = RunView {
            now: self.now,
            replicas: &self.replicas,
            fleet: &self.fleet,
            setup: self.setup,
        };
        self.werr.track(&view, self.rec.metrics_mut());
    }

    /// End the weight error's last interval and hand its integrals to the run's metrics.
    pub(super) fn close_weight_error(&mut self) {
        let view = RunView {
            now: self.now,
            replicas: &self.replicas,
            fleet: &self.fleet,
            setup: self.setup,
        };
        let m = self.rec.metrics_mut();
        self.werr.close_interval(&view, m);
        self.werr.hand_over(&self.fleet, m);
    }

    /// Debug builds: nothing moved since the last re-read ([`WeightErrorTracker::check_tracked`]).
    pub(super) fn check_weights_tracked(&self) {
        self.werr.check_tracked(self.now, &self.replicas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flat arrays' "none" reads back as `None`, and every held value as itself, to the
    /// bit (zero, the smallest and largest errors included).
    #[test]
    fn held_errors_read_back_as_options() {
        let values = vec![NONE, 0.0, 1.5, f64::MIN_POSITIVE, f64::MAX, NONE];
        let mut operating = values.clone();
        operating.reverse();
        let held = HeldErrors {
            error: values,
            error_operating: operating,
            since: vec![0.0; 6],
            weight: vec![NONE; 6],
            reference: vec![NONE; 6],
            reference_operating: vec![NONE; 6],
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
        let bits = |v: Option<f64>| v.map(f64::to_bits);
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert_eq!(bits(g.0), bits(e));
            assert_eq!(bits(g.1), bits(expected[expected.len() - 1 - i]));
        }
    }

    /// The operating-concurrency reference by hand, through the tracker's own parts: two
    /// workers on a profile whose decode aggregate is 100 tok/s at 1, 400 at 8 and 800 at 32
    /// sequences, both with weight 1, held 10 s. A decoded on average 4 sequences over 20 s of
    /// active time (80 sequence-seconds), B 16 over 20 s (320) at speed factor 0.5.
    /// A: aggregate(4) = 100 + 3/7 × 300 = 1600/7, × 1; B: aggregate(16) = 400 + 8/24 × 400
    /// = 1600/3, × 0.5 = 800/3. The median of two is their mean; A's oracle weight is
    /// (1600/7) / median, B's (800/3) / median (both within the clamp), and each error is
    /// |ln(1 / oracle weight)|. At the oracle's 16 the speed factor alone sets them apart.
    #[test]
    fn the_operating_reference_by_hand() {
        use routelab_policies::{PolicyConfig, Router, WorkerSpec};
        let profile = HardwareProfile::from_yaml_str(
            "name: t\ndecode:\n  points:\n    - { concurrency: 1, aggregate_tok_s: 100 }\n    \
             - { concurrency: 8, aggregate_tok_s: 400 }\n    \
             - { concurrency: 32, aggregate_tok_s: 800 }\n\
             prefill_tok_s: 1000\nkv_capacity_tokens: 100000\nmax_running: 64\n\
             context_window: 1024\n",
            "test.yaml",
        )
        .unwrap();
        let sums = [(80, 20), (320, 20)].map(|(seq_s, active_s)| Concurrency {
            decoding_ns: seq_s * 1_000_000_000,
            active_ns: active_s * 1_000_000_000,
            ..Concurrency::default()
        });
        assert_eq!(sums.map(|c| c.mean()), [Some(4.0), Some(16.0)]);
        let speed = [1.0, 0.5];
        let operating = [0, 1].map(|i| operating_capacity(&profile, sums[i].mean(), speed[i]));
        let (a, b) = (1600.0 / 7.0, 800.0 / 3.0);
        assert!((operating[0] - a).abs() < 1e-9 && (operating[1] - b).abs() < 1e-9);
        // nothing decoded, or never active: unknown to the oracle's rule
        assert_eq!(operating_capacity(&profile, Some(0.0), 1.0), 0.0);
        assert_eq!(operating_capacity(&profile, None, 1.0), 0.0);

        let mut router = Router::new(PolicyConfig::from_name("oracle").unwrap());
        for name in ["a", "b"] {
            let spec = WorkerSpec {
                name: name.into(),
                node: name.into(),
                model: "m".into(),
                gpu_names: vec![],
                context_window: 1024,
                launch_args: String::new(),
                cache_blocks: None,
            };
            router.register(Time::ZERO, spec);
        }
        let oracle = oracle_weights(router.fleet(), &operating, ORACLE_CLAMP);
        let median = (a + b) / 2.0;
        let want = [a / median, b / median];
        let mut integral = [Integrals::default(), Integrals::default()];
        for i in 0..2 {
            assert!((oracle[i].value - want[i]).abs() < 1e-12);
            let error = log_ratio(1.0, oracle[i].value).unwrap();
            // held from 5 s to 15 s, against the oracle concurrency's reference too (equal
            // profiles: the speed factor alone, 1 and 0.5 relative to their mean 0.75)
            let at_oracle = log_ratio(1.0, speed[i] / 0.75).unwrap();
            add_held((at_oracle, error), 5.0, 15.0, &mut integral[i], None);
        }
        let by_hand = [(median / a).ln().abs(), (median / b).ln().abs()];
        let at_16 = [0.75f64.ln().abs(), 1.5f64.ln().abs()];
        for i in 0..2 {
            let got = integral[i].operating;
            assert!((got.mean().unwrap() - by_hand[i]).abs() < 1e-12);
            assert_eq!(got.active_s, 10.0);
            assert!((integral[i].oracle.mean().unwrap() - at_16[i]).abs() < 1e-12);
        }
        // the run's figure: the time-weighted mean over the two workers
        let run = integral[0].operating.plus(integral[1].operating);
        let want = (by_hand[0] + by_hand[1]) / 2.0;
        assert!((run.mean().unwrap() - want).abs() < 1e-12);
        assert!((want - 0.0771).abs() < 1e-3, "{want}");
    }

    /// The refreshes: each doubling of the run's age from 1 s, then every minute.
    #[test]
    fn refreshes_double_then_come_every_minute() {
        let s = 1_000_000_000;
        let mut at = vec![0];
        while *at.last().unwrap() < 200 * s {
            at.push(next_refresh(*at.last().unwrap()));
        }
        let want = [0, 1, 2, 4, 8, 16, 32, 60, 120, 180, 240];
        assert_eq!(at, want.map(|t| t * s));
        // a late re-read (a long tick) keeps to the grid
        assert_eq!(next_refresh(61 * s), 120 * s);
        assert_eq!(next_refresh(s / 2), s);
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
