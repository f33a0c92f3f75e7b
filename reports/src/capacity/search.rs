//! The capacity search of one policy on one seed: bracket the knee by doubling or halving the
//! load scale from 1, then bisect (geometrically) until the bracket is within the precision.
//!
//! Generic over the run: a closure "run at load scale `s` → [`RunMetrics`]", so the search is
//! tested without the simulator and the host decides how to run (the CLI: the simulator, with
//! the SLO's per-request bounds recorded).

use super::slo::SloSpec;
use routelab_sim::RunMetrics;
use serde::Serialize;

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

/// One evaluated load scale: whether the SLO held, and the figures the charts draw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Load scale.
    pub scale: f64,
    /// The SLO held.
    pub holds: bool,
    /// Fraction of requests meeting every per-request bound.
    pub attainment: Option<f64>,
    /// TTFT p99, s.
    pub ttft_p99_s: Option<f64>,
    /// Each bound's statistic in this run, in the SLO's order.
    pub values: Vec<Option<f64>>,
}

impl Evaluation {
    /// The evaluation of run `m` at `scale`.
    pub fn of(spec: &SloSpec, scale: f64, m: &RunMetrics) -> Evaluation {
        Evaluation {
            scale,
            holds: spec.holds(m),
            attainment: SloSpec::attainment(m),
            ttft_p99_s: m.ttft.quantile_secs(0.99),
            values: spec.bounds.iter().map(|b| b.value(m)).collect(),
        }
    }
}

impl Evaluation {
    /// What kept the SLO from holding here (`ttft_p99 = 3.00 s > 2.00 s`), for error messages.
    pub fn why_not(&self, spec: &SloSpec) -> String {
        let g = |v: f64| format!("{} s", crate::num::fmt_sig(Some(v), 3));
        if let Some(t) = spec.target {
            return format!(
                "{} of requests met every bound, below the target {}",
                crate::num::fmt_pct(self.attainment),
                crate::num::fmt_pct(Some(t))
            );
        }
        spec.bounds
            .iter()
            .zip(&self.values)
            .filter(|(b, v)| !v.is_some_and(|v| v <= b.bound_s))
            .map(|(b, v)| match v {
                Some(v) => format!("{} = {} > {}", b.name(), g(*v), g(b.bound_s)),
                None => format!("{} has no value (nothing completed)", b.name()),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A search that found no knee inside the scales it may try: the capacity is then a bound,
/// not a measurement, and the outputs say so.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Censored {
    /// The SLO fails even at the smallest scale tried: the policy carries none of this traffic
    /// at the SLO (its capacity is recorded as 0, so it counts against the policy's mean).
    NeverHolds {
        /// The smallest scale tried.
        min_scale: f64,
        /// What failed there (`ttft_p99 = 3.00 s > 2.00 s`).
        why: String,
    },
    /// The SLO still holds at the largest scale tried: the capacity is at least that scale.
    AlwaysHolds {
        /// The largest scale tried (also the recorded capacity).
        max_scale: f64,
    },
}

impl Censored {
    /// `infeasible even at 1/64 load (why)` / `at least 64x (no knee found)`.
    pub fn describe(&self) -> String {
        match self {
            Censored::NeverHolds { min_scale, why } => format!(
                "the SLO does not hold even at load scale {min_scale} (1/{}): {why}",
                1.0 / min_scale
            ),
            Censored::AlwaysHolds { max_scale } => {
                format!("the SLO still holds at load scale {max_scale}: capacity at least that")
            }
        }
    }
}

/// The capacity of one policy on one seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedCapacity {
    /// Seed.
    pub seed: u64,
    /// The largest load scale found to hold (the bracket's low end); 0 when the SLO never
    /// held, the largest scale tried when it always did (see `censored`).
    pub scale: f64,
    /// The smallest load scale found to fail (the bracket's high end); for a censored search,
    /// the scale tried last.
    pub failing_scale: f64,
    /// Set when no knee lies inside the scales tried.
    pub censored: Option<Censored>,
    /// Every evaluated scale, in the order run.
    pub evaluations: Vec<Evaluation>,
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
    Ok(SeedCapacity {
        seed,
        scale: low,
        failing_scale: high,
        censored: None,
        evaluations,
    })
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
