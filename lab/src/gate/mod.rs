//! The routing-quality regression gate as a library.
//!
//! A [`Suite`] (`scenarios/ci/suite.yaml`: scenarios, seeds, per-metric tolerances and quality
//! invariants) is run by the host — every policy of every scenario on every seed — and the
//! runs are [`measure`]d into the same shape as the committed [`Baseline`]s. [`Gate::report`]
//! compares every (scenario, policy, gate metric), averaged over the seeds, with the baseline
//! and checks the invariants. A metric that got worse by more than its tolerance is a
//! regression; so is a metric the run has no value for where the baseline had one (a latency
//! of a run that completed nothing is missing, never 0 s). Shares and weights are reported when
//! they move but never fail. The simulator is deterministic, so an unchanged tree reproduces
//! its baselines exactly.

mod baseline;
mod suite;

pub(crate) use baseline::json_error;
pub use baseline::{
    Baseline, Baselines, Stat, baseline_file, gate_values, load_baselines, measure, measure_values,
    parse_baseline, write_baselines,
};
pub use suite::{Invariant, Op, Rhs, Suite};

pub use routelab_reports::gate::{
    Comparison, GateReport, InvariantResult, Verdict, VerdictCounts, fmt6,
};

use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::metric::{Direction, direction_of_key};
use routelab_sim::Scenario;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The gate could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The suite or a baseline is not valid (boxed: the located error is large and rare).
    #[error(transparent)]
    Input(Box<InputError>),
    /// A baseline could not be written (the same failures as any other output).
    #[error(transparent)]
    Output(#[from] routelab_reports::ReportError),
}

impl From<InputError> for GateError {
    fn from(e: InputError) -> GateError {
        GateError::Input(Box::new(e))
    }
}

impl GateError {
    /// The located input error, when that is what this is.
    pub fn input(&self) -> Option<&InputError> {
        match self {
            GateError::Input(e) => Some(e),
            _ => None,
        }
    }
}

/// The verdict on one metric: `now` against `was` with relative tolerance `tol`.
fn verdict(direction: Direction, was: f64, now: Option<f64>, tol: f64) -> (Option<f64>, Verdict) {
    let Some(now) = now else {
        // No value where the baseline had one: the run lost the ability to produce it.
        let v = match direction {
            Direction::Neutral => Verdict::Changed,
            _ => Verdict::Regression,
        };
        return (None, v);
    };
    let scale = was.abs().max(1e-12);
    let delta = (now - was) / scale;
    let worse = match direction {
        Direction::Lower => delta > tol,
        Direction::Higher => delta < -tol,
        Direction::Neutral => false,
    };
    let better = match direction {
        Direction::Lower => delta < -tol,
        Direction::Higher => delta > tol,
        Direction::Neutral => false,
    };
    let v = if worse {
        Verdict::Regression
    } else if better {
        Verdict::Improved
    } else if delta.abs() > tol {
        Verdict::Changed
    } else {
        Verdict::Ok
    };
    (Some(delta * 100.0), v)
}

/// A validated suite with its committed baselines.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The suite.
    pub suite: Suite,
    /// The baselines directory.
    pub baselines_dir: PathBuf,
    /// The committed baselines, by scenario.
    pub baselines: Baselines,
}

impl Gate {
    /// Read and validate the suite in `suite_dir` and the baselines in `baselines_dir`, before
    /// any simulation runs.
    pub fn load(suite_dir: &Path, baselines_dir: &Path) -> Result<Gate, GateError> {
        let suite = Suite::load(suite_dir)?;
        let baselines = load_baselines(baselines_dir, &suite.scenarios, &suite.file)?;
        Ok(Gate {
            suite,
            baselines_dir: baselines_dir.to_path_buf(),
            baselines,
        })
    }

    /// Every run the gate needs: each policy of each scenario on each seed.
    pub fn jobs(&self) -> Vec<(&Scenario, &PolicyConfig, u64)> {
        let mut jobs = Vec::new();
        for sc in &self.suite.scenarios {
            for p in &sc.policies {
                for &seed in &self.suite.seeds {
                    jobs.push((sc, p, seed));
                }
            }
        }
        jobs
    }

    /// Compare a measurement (see [`measure`]) with the baselines and check the invariants.
    pub fn report(&self, current: &Baselines) -> GateReport {
        GateReport {
            comparisons: self.compare(current),
            invariants: self.check_invariants(current),
        }
    }

    /// Relative tolerance of a metric key: the suite's (a per-worker key uses its prefix's),
    /// else the baseline's seed-to-seed spread.
    fn tolerance(&self, key: &str, was: &Stat) -> f64 {
        let scale = was.mean.abs().max(1e-12);
        self.suite
            .tolerances
            .get(key.split(':').next().unwrap_or(key))
            .copied()
            .unwrap_or(was.spread / scale)
            .max(1e-9)
    }

    fn compare(&self, current: &Baselines) -> Vec<Comparison> {
        let mut rows = Vec::new();
        for (scenario, cur) in current {
            let base = self.baselines.get(scenario);
            for (policy, metrics) in &cur.policies {
                let bp = base.and_then(|b| b.policies.get(policy));
                // A metric the baseline has and the run lacks must show up too.
                let keys: BTreeSet<&String> = metrics
                    .keys()
                    .chain(bp.into_iter().flat_map(|m| m.keys()))
                    .collect();
                for key in keys {
                    let now = metrics.get(key).map(|s| s.mean);
                    let was = bp.and_then(|m| m.get(key));
                    // Baseline keys are validated on load, so every key has a direction.
                    let direction = direction_of_key(key).unwrap_or(Direction::Neutral);
                    let (delta_pct, tolerance_pct, status) = match was {
                        None => (None, 0.0, Verdict::NoBaseline),
                        Some(was) => {
                            let tol = self.tolerance(key, was);
                            let (delta, v) = verdict(direction, was.mean, now, tol);
                            (delta, tol * 100.0, v)
                        }
                    };
                    rows.push(Comparison {
                        scenario: scenario.clone(),
                        policy: policy.clone(),
                        metric: key.clone(),
                        baseline: was.map(|s| s.mean),
                        current: now,
                        delta_pct,
                        tolerance_pct,
                        status,
                    });
                }
            }
        }
        rows
    }

    fn check_invariants(&self, current: &Baselines) -> Vec<InvariantResult> {
        let mut out = Vec::new();
        for inv in &self.suite.invariants {
            let Some(cur) = current.get(&inv.scenario) else {
                continue;
            };
            let policies: Vec<&String> = if inv.policy == "*" {
                cur.policies.keys().collect()
            } else {
                vec![&inv.policy]
            };
            let value = |policy: &str| {
                cur.policies
                    .get(policy)
                    .and_then(|m| m.get(&inv.metric))
                    .map(|s| s.mean)
            };
            for p in policies {
                let l = value(p);
                let (r, right) = match &inv.rhs {
                    Rhs::Policy(t) => {
                        let v = value(t);
                        (v, format!("{t} {} = {}", inv.metric, fmt6(v)))
                    }
                    Rhs::Value(v) => (Some(*v), format!("{v}")),
                };
                let holds = match (l, r) {
                    (Some(l), Some(r)) => inv.op.holds(l, r),
                    // A side without a value cannot satisfy anything.
                    _ => false,
                };
                let rhs_name = match &inv.rhs {
                    Rhs::Policy(t) => t.clone(),
                    Rhs::Value(_) => right.clone(),
                };
                out.push(InvariantResult {
                    scenario: inv.scenario.clone(),
                    statement: inv.why.clone().unwrap_or_else(|| {
                        format!("{p} {} {} {rhs_name}", inv.metric, inv.op.as_str())
                    }),
                    left: format!("{p} {} = {}", inv.metric, fmt6(l)),
                    right,
                    holds,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::RunMetrics;
    use std::collections::BTreeMap;

    fn gate(invariants: &str) -> Gate {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ci");
        let text = format!(
            "seeds: [1]\nscenarios: [../seed/sixteen-at-once.yaml]\ntolerances: {{ e2e_mean_s: 0.1 }}\ninvariants: {invariants}\n"
        );
        Gate {
            suite: Suite::from_yaml(&text, "suite.yaml", &dir).unwrap(),
            baselines_dir: PathBuf::from("baselines"),
            baselines: BTreeMap::new(),
        }
    }

    fn completed(e2e: f64) -> RunMetrics {
        let mut m = RunMetrics::new("seed-v1", vec![routelab_sim::WorkerTotals::new("pair")]);
        m.requests = 2;
        m.completed = 2;
        m.first_arrival_ns = 0;
        m.last_completion_ns = 4_000_000_000;
        m.output_tokens = 40;
        m.prompt_tokens = 10;
        m.workers[0].requests = 2;
        for _ in 0..2 {
            m.ttft.record_secs(e2e / 4.0);
            m.e2e.record_secs(e2e);
            m.tpot.record_secs(0.01);
            m.queue.record_secs(0.0);
        }
        m
    }

    fn measured(m: &RunMetrics) -> Baselines {
        measure(&[1], [("seed/sixteen-at-once", "seed-v1", m)])
    }

    fn row<'a>(r: &'a GateReport, metric: &str) -> &'a Comparison {
        r.comparisons.iter().find(|c| c.metric == metric).unwrap()
    }

    #[test]
    fn an_unchanged_run_passes_and_a_slower_one_regresses() {
        let mut g = gate("[]");
        g.baselines = measured(&completed(2.0));
        let same = g.report(&measured(&completed(2.0)));
        assert!(same.passed(), "{}", same.summary());
        assert!(same.comparisons.iter().all(|c| c.status == Verdict::Ok));
        let slow = g.report(&measured(&completed(3.0)));
        assert_eq!(row(&slow, "e2e_mean_s").status, Verdict::Regression);
        assert_eq!(row(&slow, "e2e_mean_s").tolerance_pct, 10.0);
        assert!(!slow.passed());
        let fast = g.report(&measured(&completed(1.0)));
        assert_eq!(row(&fast, "e2e_mean_s").status, Verdict::Improved);
    }

    #[test]
    fn a_run_that_completes_nothing_regresses_against_a_baseline_with_latency() {
        let mut g = gate("[]");
        g.baselines = measured(&completed(2.0));
        let mut nothing = RunMetrics::new("seed-v1", vec![routelab_sim::WorkerTotals::new("pair")]);
        nothing.requests = 2;
        nothing.rejected = 2;
        let r = g.report(&measured(&nothing));
        let e2e = row(&r, "e2e_mean_s");
        assert_eq!(e2e.status, Verdict::Regression, "missing is not 0 s");
        assert_eq!(
            (e2e.baseline, e2e.current, e2e.delta_pct),
            (Some(2.0), None, None)
        );
        for m in [
            "ttft_p99_s",
            "e2e_max_s",
            "output_tok_s",
            "prefix_hit_fraction",
        ] {
            assert_eq!(row(&r, m).status, Verdict::Regression, "{m}");
        }
        assert!(!r.passed());
        let s = r.summary();
        assert!(
            s.contains("REGRESSION: scenario seed/sixteen-at-once policy seed-v1 metric e2e_mean_s: 2.000000 -> - (-, tolerance 10.00%)"),
            "{s}"
        );
    }

    #[test]
    fn a_value_without_baseline_is_new_not_a_regression() {
        let mut g = gate("[]");
        let mut nothing = RunMetrics::new("seed-v1", vec![]);
        nothing.requests = 2;
        g.baselines = measured(&nothing);
        let r = g.report(&measured(&completed(2.0)));
        let e2e = row(&r, "e2e_mean_s");
        assert_eq!(e2e.status, Verdict::NoBaseline);
        assert_eq!(r.regressions(), 0, "{}", r.summary());
        assert_eq!(row(&r, "completed").status, Verdict::Improved);
    }

    #[test]
    fn invariants_hold_fail_and_never_hold_on_missing_values() {
        let g = gate(
            "[{ scenario: seed/sixteen-at-once, policy: seed-v1, metric: e2e_max_s, op: \"<\", value: 2.5 }, \
              { scenario: seed/sixteen-at-once, policy: \"*\", metric: \"share:pair\", op: \"==\", value: 1 }]",
        );
        let r = g.report(&measured(&completed(2.0)));
        assert_eq!(r.invariants.len(), 2);
        assert!(r.invariants.iter().all(|i| i.holds), "{:?}", r.invariants);
        assert_eq!(r.invariants[0].statement, "seed-v1 e2e_max_s < 2.5");
        let r = g.report(&measured(&completed(3.0)));
        assert!(!r.invariants[0].holds);
        let nothing = RunMetrics::new("seed-v1", vec![]);
        let r = g.report(&measured(&nothing));
        assert!(!r.invariants[0].holds);
        assert_eq!(r.invariants[0].left, "seed-v1 e2e_max_s = -");
    }
}
