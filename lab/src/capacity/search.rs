//! The capacity search of one policy on one seed: bracket the knee by doubling or halving the
//! load scale from 1, then bisect (geometrically) until the bracket is within the precision.
//!
//! Generic over the run: a closure "run at load scale `s` → [`RunMetrics`]", so the search is
//! tested without the simulator and the host decides how to run (the CLI: the simulator, with
//! the SLO's per-request bounds recorded). What it finds is `routelab-reports`' plain data
//! ([`SeedCapacity`], [`Evaluation`], [`Censored`]), which the capacity outputs render.

use routelab_reports::capacity::{Censored, Evaluation, SeedCapacity, SloSpec};
use routelab_sim::RunMetrics;

/// How the search brackets and how precise it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// Stop bisecting when `high / low <= 1 + precision` (default 0.02: within 2 %).
    pub precision: f64,
    /// The smallest load scale tried while halving (default 1/64).
    pub min_scale: f64,
    /// The largest load scale tried while doubling (default 64).
    pub max_scale: f64,
}

impl Default for SearchOptions {
    fn default() -> SearchOptions {
        SearchOptions {
            precision: 0.02,
            min_scale: 1.0 / 64.0,
            max_scale: 64.0,
        }
    }
}

/// Find the capacity on `seed`: `run(s)` runs the scenario at load scale `s`.
///
/// Bracket: from scale 1, double while the SLO holds (up to `max_scale`) or halve while it
/// fails (down to `min_scale`); then bisect the bracket at its geometric mean until
/// `high / low <= 1 + precision`. The capacity is the low end: the largest scale seen to hold.
/// No bracket inside `min_scale..=max_scale` is not an error: the result is [`Censored`] (a
/// policy that cannot meet the SLO at any load is an answer, and the other policies' searches
/// still count).
///
/// # Errors
/// The run's error.
pub fn find_capacity<E>(
    spec: &SloSpec,
    opts: &SearchOptions,
    seed: u64,
    mut run: impl FnMut(f64) -> Result<RunMetrics, E>,
) -> Result<SeedCapacity, E> {
    let mut evaluations: Vec<Evaluation> = Vec::new();
    let mut holds = |s: f64, evaluations: &mut Vec<Evaluation>| {
        let m = run(s)?;
        let e = Evaluation::of(spec, s, &m);
        let h = e.holds;
        evaluations.push(e);
        Ok::<bool, E>(h)
    };
    let censored = |scale: f64, failing_scale: f64, c: Censored, evaluations| SeedCapacity {
        seed,
        scale,
        failing_scale,
        censored: Some(c),
        evaluations,
    };
    let (mut low, mut high);
    if holds(1.0, &mut evaluations)? {
        low = 1.0;
        loop {
            let s = low * 2.0;
            if s > opts.max_scale {
                let c = Censored::AlwaysHolds { max_scale: low };
                return Ok(censored(low, low, c, evaluations));
            }
            if holds(s, &mut evaluations)? {
                low = s;
            } else {
                high = s;
                break;
            }
        }
    } else {
        high = 1.0;
        loop {
            let s = high / 2.0;
            if s < opts.min_scale {
                let why = evaluations
                    .last()
                    .map(|e| e.why_not(spec))
                    .unwrap_or_default();
                let c = Censored::NeverHolds {
                    min_scale: high,
                    why,
                };
                return Ok(censored(0.0, high, c, evaluations));
            }
            if holds(s, &mut evaluations)? {
                low = s;
                break;
            }
            high = s;
        }
    }
    while high / low > 1.0 + opts.precision {
        let mid = (low * high).sqrt();
        if holds(mid, &mut evaluations)? {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(SeedCapacity::knee(seed, low, high, evaluations))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use routelab_sim::WorkerTotals;

    /// A fake run whose mean e2e latency is that of an M/D/1 processor-sharing server of
    /// service time 0.1 s at arrival rate `s` req/s: `0.1 / (1 - s / 10)` (infinite at or past
    /// saturation). Under `e2el_mean<=0.5s` the knee is exactly `s = 8`.
    pub(crate) fn ps_run(s: f64) -> Result<RunMetrics, String> {
        let mut m = RunMetrics::new("p", vec![WorkerTotals::new("w")]);
        let rho = s / 10.0;
        let mean = if rho < 1.0 { 0.1 / (1.0 - rho) } else { 1e6 };
        m.e2e.record_secs(mean);
        m.ttft.record_secs(0.0);
        m.requests = 1;
        m.completed = 1;
        Ok(m)
    }

    #[test]
    fn bisection_finds_a_known_knee_within_the_precision() {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        let opts = SearchOptions::default();
        let c = find_capacity(&spec, &opts, 1, ps_run).unwrap();
        assert!(c.scale <= 8.0 && 8.0 < c.failing_scale, "{c:?}");
        assert!(c.failing_scale / c.scale <= 1.02);
        assert!((c.scale / 8.0 - 1.0).abs() <= 0.02, "{}", c.scale);
        // 1, 2, 4, 8 hold (8 exactly: 0.5 <= 0.5), 16 fails: 5 to bracket, then 6 halvings of
        // log2(16/8) = 1 to reach log2(1.02) = 0.0286.
        assert_eq!(
            c.evaluations[..5]
                .iter()
                .map(|e| e.scale)
                .collect::<Vec<_>>(),
            [1.0, 2.0, 4.0, 8.0, 16.0]
        );
        assert_eq!(c.evaluations.len(), 5 + 6);
        let tight = SearchOptions {
            precision: 0.001,
            ..opts
        };
        let t = find_capacity(&spec, &tight, 1, ps_run).unwrap();
        assert!((t.scale / 8.0 - 1.0).abs() <= 0.001, "{}", t.scale);
    }

    #[test]
    fn a_knee_below_1_is_bracketed_by_halving() {
        // knee at rho with 0.1/(1-rho) = 0.25 → rho 0.6 → s = 6; scale the rate so s = 0.375.
        let spec = SloSpec::parse("e2el_mean<=250ms", None).unwrap();
        let c = find_capacity(&spec, &SearchOptions::default(), 1, |s| ps_run(s * 16.0)).unwrap();
        assert!((c.scale / 0.375 - 1.0).abs() <= 0.02, "{}", c.scale);
        assert_eq!(c.evaluations[1].scale, 0.5);
        assert!(!c.evaluations[0].holds);
    }

    #[test]
    fn no_bracket_is_a_censored_capacity_that_says_which_way() {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        let opts = SearchOptions::default();
        // At 1/64, 600/64 = 9.375 req/s: rho 0.9375, mean 0.1 / 0.0625 = 1.6 s.
        let never = find_capacity(&spec, &opts, 1, |s| ps_run(s * 600.0)).unwrap();
        assert_eq!(never.scale, 0.0);
        let Some(c @ Censored::NeverHolds { .. }) = &never.censored else {
            panic!("{never:?}");
        };
        assert!(
            c.describe().contains(
                "does not hold even at load scale 0.015625 (1/64): e2el_mean = 1.60 s > 0.500 s"
            ),
            "{}",
            c.describe()
        );
        let target = SloSpec::parse("e2el<=500ms", Some(0.5)).unwrap();
        let t = find_capacity(&target, &opts, 1, |s| ps_run(s * 600.0)).unwrap();
        // The fake run records no per-request attainment (slo_met 0 of 1).
        assert!(
            t.censored
                .unwrap()
                .describe()
                .contains("0.0% of requests met every bound, below the target 50.0%"),
        );
        let always = find_capacity(&spec, &opts, 1, |s| ps_run(s / 1e4)).unwrap();
        assert_eq!(always.scale, 64.0);
        assert_eq!(
            always.censored,
            Some(Censored::AlwaysHolds { max_scale: 64.0 })
        );
        // A knee inside the range is not censored.
        assert_eq!(
            find_capacity(&spec, &opts, 1, ps_run).unwrap().censored,
            None
        );
        let failing = find_capacity(&spec, &opts, 1, |_| {
            Err::<RunMetrics, _>("boom".to_string())
        })
        .unwrap_err();
        assert_eq!(failing, "boom");
    }
}
