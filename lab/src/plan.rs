//! `routelab plan`'s lab side: which conditions a plan studies ([`conditions`]) and the
//! capacity study under each on common random numbers ([`run_plan`]). What the studies mean
//! together (the robust choice, the range) is `routelab-reports`' [`PlanStudy`].
//!
//! The conditions: the trace resampled (the reference, what `capacity` studies), the trace as
//! recorded, the held-out tail of the trace (its last part by time, resampled alike), and, for
//! each uncertain profile field of the fleet, the fleet with that field at the low and at the
//! high end of its uncertainty (one field at a time, so a condition that flips the ranking
//! names the field that does). Every condition runs the same seeds.

use crate::capacity::{SeedPlan, StudyPlan, run_study};
use crate::seeds::seed_of;
use routelab_reports::capacity::SeedCapacity;
use routelab_reports::plan::{Condition, PlanStudy};
use routelab_sim::traffic::Resample;
use routelab_sim::{Scenario, ScenarioError};
use std::collections::HashMap;

/// A condition before it runs: its name, what it changes, and the scenario under it.
#[derive(Debug, Clone)]
pub struct ConditionScenario {
    /// Short name.
    pub name: String,
    /// What it changes.
    pub what: String,
    /// The scenario under it.
    pub scenario: Scenario,
}

/// The conditions of a plan of `scenario`: its trace resampled by `resample` (unless its own
/// `resample:` says otherwise), as recorded, and its last `tail` (a fraction of the span)
/// resampled alike; then the fleet's uncertain profile fields, low and high.
///
/// # Errors
/// A `tail` that is not a fraction in (0, 1), or a scenario without a trace source (a plan's
/// traffic conditions are a trace's).
pub fn conditions(
    scenario: &Scenario,
    resample: Resample,
    tail: f64,
) -> Result<Vec<ConditionScenario>, ScenarioError> {
    let resampled = scenario.with_resample_default(resample);
    let (_, held_out) = resampled.holdout(tail)?;
    let pct = |f: f64| format!("{} %", (f * 100.0).round());
    let mut out = vec![
        ConditionScenario {
            name: "resampled".into(),
            what: "each seed a resample of the trace (the reference; what `capacity` studies)"
                .into(),
            scenario: resampled.clone(),
        },
        ConditionScenario {
            name: "as recorded".into(),
            what: "the trace replayed as recorded on every seed".into(),
            scenario: scenario.as_recorded(),
        },
        ConditionScenario {
            name: "held-out tail".into(),
            what: format!("the last {} of the trace by time, resampled", pct(tail)),
            scenario: held_out,
        },
    ];
    for f in resampled.uncertain_fleets() {
        out.push(ConditionScenario {
            name: format!("{} {}", f.field.name(), if f.high { "high" } else { "low" }),
            what: f.what,
            scenario: f.scenario,
        });
    }
    Ok(out)
}

/// A condition's name, what it changes and its study plan (a fixed seed count).
#[derive(Debug, Clone)]
pub struct PlannedCondition {
    /// Short name.
    pub name: String,
    /// What it changes.
    pub what: String,
    /// Its capacity study (every condition: the same policies, first seed and seed count).
    pub plan: StudyPlan,
}

/// Run every condition's study. `search_all` finds the capacity of each `(condition, policy,
/// seed)` it is given and returns them in that order (the host may run them in parallel): one
/// batch, so the host's threads are kept busy across conditions.
///
/// # Errors
/// The first error of `search_all`.
pub fn run_plan<E>(
    scenario: &str,
    conditions: Vec<PlannedCondition>,
    search_all: impl FnOnce(&[(usize, usize, u64)]) -> Result<Vec<SeedCapacity>, E>,
) -> Result<PlanStudy, E> {
    let mut batch = Vec::new();
    for (c, cond) in conditions.iter().enumerate() {
        let n = match cond.plan.seeds {
            SeedPlan::Fixed(n) => n.max(1),
            // A plan's seed count is fixed: its conditions must run the same seeds.
            SeedPlan::Auto(a) => a.start.max(2),
        };
        for p in 0..cond.plan.policies.len() {
            batch.extend((0..n).map(|k| (c, p, seed_of(cond.plan.first_seed, k))));
        }
    }
    let found = search_all(&batch)?;
    let mut by_key: HashMap<(usize, usize, u64), SeedCapacity> =
        batch.iter().copied().zip(found).collect();
    let precision = conditions.first().map_or(0.0, |c| c.plan.options.precision);
    let slo = conditions.first().map(|c| c.plan.slo.clone());
    let mut out = Vec::new();
    for (c, cond) in conditions.into_iter().enumerate() {
        let mut plan = cond.plan;
        if let SeedPlan::Auto(a) = plan.seeds {
            plan.seeds = SeedPlan::Fixed(a.start.max(2));
        }
        let study = run_study(plan, |b| {
            Ok::<_, E>(
                b.iter()
                    .filter_map(|&(p, seed)| by_key.remove(&(c, p, seed)))
                    .collect(),
            )
        })?;
        out.push(Condition {
            name: cond.name,
            what: cond.what,
            study,
        });
    }
    Ok(PlanStudy {
        scenario: scenario.to_string(),
        slo: slo.unwrap_or_else(|| {
            routelab_reports::capacity::SloSpec::parse("ttft_p99<=2s", None)
                .expect("a valid literal")
        }),
        precision,
        conditions: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::SearchOptions;
    use crate::capacity::find_capacity;
    use crate::capacity::search::tests::ps_run;
    use routelab_policies::PolicyConfig;
    use routelab_reports::capacity::SloSpec;

    fn plan(name: &str) -> PlannedCondition {
        PlannedCondition {
            name: name.into(),
            what: String::new(),
            plan: StudyPlan {
                scenario: "s".into(),
                description: String::new(),
                policies: ["a", "b"]
                    .map(|n| PolicyConfig {
                        name: n.into(),
                        ..PolicyConfig::from_name("equal/round-robin/none/none").unwrap()
                    })
                    .into(),
                baseline: 0,
                first_seed: 7,
                seeds: SeedPlan::Fixed(3),
                slo: SloSpec::parse("e2el_mean<=500ms", None).unwrap(),
                options: SearchOptions::default(),
                base_rate_per_s: Some(1.0),
                seed_meaning: Default::default(),
            },
        }
    }

    /// Every condition runs the same seeds, and each study gets its own searches back: `b` is
    /// 1.5× `a` under the first condition and 0.5× under the second.
    #[test]
    fn each_condition_gets_its_own_searches_on_the_same_seeds() {
        let st = run_plan("s", vec![plan("one"), plan("two")], |batch| {
            batch
                .iter()
                .map(|&(c, p, seed)| {
                    let speed = match (c, p) {
                        (_, 0) => 1.0,
                        (0, _) => 1.5,
                        _ => 0.5,
                    };
                    let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
                    find_capacity(&spec, &SearchOptions::default(), seed, |s| {
                        ps_run(s / speed)
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .unwrap();
        assert_eq!(st.conditions.len(), 2);
        for c in &st.conditions {
            assert_eq!(c.study.seeds, [7, 8, 9]);
        }
        assert_eq!(st.best(0), Some(1));
        assert_eq!(st.best(1), Some(0));
        assert!((st.ratio_to_best(1, 1) - 0.5).abs() < 0.03);
        // a: 1/1.5 then 1; b: 1 then 0.5. a's worst (0.67) beats b's (0.5).
        assert_eq!(st.robust(), Some(0));
    }

    /// A fleet of two workers, `b`'s profile declaring `uncertainty` on `prefill_tok_s`, and
    /// its conditions (the bundled diurnal trace as the traffic; nothing is simulated here).
    fn fleet_conditions(uncertainty: f64) -> Vec<ConditionScenario> {
        let dir = std::env::temp_dir().join(format!(
            "routelab-lab-plan-{}-{}",
            std::process::id(),
            uncertainty
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let profile = |name: &str, extra: &str| {
            format!(
                "name: {name}\ndecode:\n  points:\n    - {{ concurrency: 1, aggregate_tok_s: 50 }}\n    \
                 - {{ concurrency: 8, aggregate_tok_s: 200 }}\nprefill_tok_s: 2000\n\
                 kv_capacity_tokens: 100000\nmax_running: 16\ncontext_window: 8192\n{extra}"
            )
        };
        std::fs::write(dir.join("a.yaml"), profile("a", "")).unwrap();
        let declared = format!("uncertainty: {{ prefill_tok_s: {uncertainty} }}\n");
        std::fs::write(dir.join("b.yaml"), profile("b", &declared)).unwrap();
        let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../data/traces/diurnal_synthetic/diurnal_2h.csv");
        let yaml = format!(
            "name: two\nseed: 1\nmodel: m\nfleet:\n  - {{ name: a, profile: a.yaml }}\n  \
             - {{ name: b, profile: b.yaml }}\ntraffic:\n  - trace: {{ path: {}, format: csv, \
             mapping: {{ arrival: arrival_s, arrival_unit: offset_s, prompt_tokens: \
             prompt_tokens, output_tokens: output_tokens }} }}\n",
            trace.display()
        );
        let path = dir.join("two.yaml");
        std::fs::write(&path, &yaml).unwrap();
        let sc = Scenario::from_yaml(&yaml, &path).unwrap();
        conditions(&sc, Resample::BLOCK_AUTO, 0.3).unwrap()
    }

    /// Issue 41, profile uncertainty: widening one field's uncertainty widens the plan's
    /// capacity range and flips its robust choice. The capacities are a model, not a
    /// simulation, so the test is exact: each worker's speed is its profile's prefill_tok_s
    /// over the declared 2,000; `equal` (round robin's kind) carries twice the slowest
    /// worker's speed, `weighted` 0.9 × the sum of the speeds (it pays 10 % for measuring).
    /// With both workers alike `equal` wins; the slower `b` gets, the more `weighted` gains.
    #[test]
    fn a_wider_uncertainty_widens_the_range_and_can_flip_the_robust_choice() {
        let run = |uncertainty: f64| {
            let conds = fleet_conditions(uncertainty);
            let names: Vec<&str> = conds.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(
                names[3..],
                ["prefill_tok_s low", "prefill_tok_s high"],
                "only b's prefill is uncertain (no profile marks anything extrapolated)"
            );
            let speeds: Vec<Vec<f64>> = conds
                .iter()
                .map(|c| {
                    c.scenario
                        .setup
                        .workers
                        .iter()
                        .map(|w| w.profile.prefill_tok_s() / 2000.0)
                        .collect()
                })
                .collect();
            let planned = conds
                .iter()
                .map(|c| {
                    let mut p = plan(&c.name);
                    p.plan.policies[0].name = "equal".into();
                    p.plan.policies[1].name = "weighted".into();
                    p
                })
                .collect();
            run_plan("two", planned, |batch| {
                batch
                    .iter()
                    .map(|&(c, p, seed)| {
                        let w = &speeds[c];
                        let speed = if p == 0 {
                            2.0 * w.iter().copied().fold(f64::INFINITY, f64::min)
                        } else {
                            0.9 * w.iter().sum::<f64>()
                        };
                        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
                        let opts = SearchOptions {
                            precision: 0.005,
                            ..SearchOptions::default()
                        };
                        find_capacity(&spec, &opts, seed, |s| ps_run(s / speed))
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .unwrap()
        };
        let narrow = run(0.05);
        let wide = run(0.4);
        let width = |st: &PlanStudy, i: usize| {
            let r = st.range(i).unwrap();
            r.high_mean.0 - r.low_mean.0
        };
        for i in 0..2 {
            assert!(
                width(&wide, i) > 2.0 * width(&narrow, i),
                "policy {i}: {} then {}",
                width(&narrow, i),
                width(&wide, i)
            );
        }
        // ±5 %: equal is best everywhere (worst 1); weighted's worst is 0.9, with both alike.
        assert_eq!(narrow.robust(), Some(0));
        // ±40 %: under `b` slow, equal carries 2 × 0.6 = 1.2 against weighted's 1.44.
        assert_eq!(wide.robust(), Some(1));
        let slow = &fleet_conditions(0.4)[3].what;
        assert!(slow.contains("prefill_tok_s × 0.6 on b (±40 %)"), "{slow}");
    }
}
