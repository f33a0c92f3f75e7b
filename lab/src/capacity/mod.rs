//! `routelab capacity`'s lab side: each policy's largest load at which an SLO holds, across
//! seeds. The study's data and outputs (the SLO spec, [`CapacityStudy`], the report) are
//! `routelab-reports`' `capacity`.
//!
//! - [`search`]: the search on one seed ([`find_capacity`]): bracket from load scale 1 by
//!   doubling or halving, then bisect to the precision.
//! - [`run_study`] (this module): policies × seeds, with `--seeds auto` ([`AutoSeeds`] on the
//!   paired ratios), into a [`CapacityStudy`].

pub mod search;

pub use search::{SearchOptions, find_capacity};

use crate::seeds::seed_of;
use routelab_policies::PolicyConfig;
use routelab_reports::capacity::{CapacityStudy, PolicyCapacity, SeedCapacity, SloSpec};
use routelab_reports::stats::{AutoSeeds, Interval, SeedStop};

/// How many seeds: a fixed count or the `--seeds auto` rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SeedPlan {
    /// Exactly this many (≥ 1).
    Fixed(usize),
    /// Add seeds until every paired ratio is precise enough, or the maximum.
    Auto(AutoSeeds),
}

/// What a study needs besides the searches.
#[derive(Debug, Clone)]
pub struct StudyPlan {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// The policies, validated, in order.
    pub policies: Vec<PolicyConfig>,
    /// Index of the baseline in `policies`.
    pub baseline: usize,
    /// The first seed (seeds are `first_seed`, `first_seed + 1`, …).
    pub first_seed: u64,
    /// How many seeds.
    pub seeds: SeedPlan,
    /// The SLO.
    pub slo: SloSpec,
    /// The search.
    pub options: SearchOptions,
    /// Mean arrival rate at scale 1.
    pub base_rate_per_s: Option<f64>,
    /// What a seed is: the sentence and its short form.
    pub seed_meaning: (String, String),
}

/// Run a study: `search_batch` finds the capacity of each `(policy index, seed)` it is given
/// and returns them in the same order (the host may run them in parallel). With a fixed seed
/// count, one batch; with `--seeds auto`, batches of [`AutoSeeds::step`] more seeds until
/// [`stop`](crate::seeds::stop) says the paired ratios are precise (their half-width at most
/// `rel_half_width`, in ratio units) or the maximum is reached.
///
/// # Errors
/// The first error of `search_batch`.
pub fn run_study<E>(
    plan: StudyPlan,
    mut search_batch: impl FnMut(&[(usize, u64)]) -> Result<Vec<SeedCapacity>, E>,
) -> Result<CapacityStudy, E> {
    let mut study = CapacityStudy {
        scenario: plan.scenario,
        description: plan.description,
        slo: plan.slo,
        precision: plan.options.precision,
        base_rate_per_s: plan.base_rate_per_s,
        baseline: plan.baseline,
        seed_stop: SeedStop::Fixed,
        auto_rule: match plan.seeds {
            SeedPlan::Fixed(_) => None,
            SeedPlan::Auto(a) => Some((a.rel_half_width, a.max)),
        },
        seeds: Vec::new(),
        policies: plan
            .policies
            .iter()
            .map(|p| PolicyCapacity::of(p.name.clone(), p.role()))
            .collect(),
        seed_meaning: plan.seed_meaning,
        out_of_sample: None,
        held_out_of: None,
    };
    let mut want = match plan.seeds {
        SeedPlan::Fixed(n) => n.max(1),
        SeedPlan::Auto(a) => a.start.max(2).min(a.max),
    };
    loop {
        let new: Vec<u64> = (study.seeds.len()..want)
            .map(|k| seed_of(plan.first_seed, k))
            .collect();
        let batch: Vec<(usize, u64)> = (0..study.policies.len())
            .flat_map(|p| new.iter().map(move |s| (p, *s)))
            .collect();
        let found = search_batch(&batch)?;
        for (&(p, _), c) in batch.iter().zip(found) {
            study.policies[p].seeds.push(c);
        }
        study.seeds.extend(new);
        let SeedPlan::Auto(auto) = plan.seeds else {
            study.seed_stop = SeedStop::Fixed;
            return Ok(study);
        };
        let ratios = precision_ratios(&study);
        if let Some(stop) = crate::seeds::stop(&auto, study.seeds.len(), &ratios) {
            study.seed_stop = stop;
            return Ok(study);
        }
        want = (study.seeds.len() + auto.step.max(1)).min(auto.max);
    }
}

/// What `--seeds auto` judges precise, as `(interval, reference)` pairs for
/// [`stop`](crate::seeds::stop): each policy's paired ratio to the baseline. While the baseline
/// is infeasible on every seed (round robin often is, on a heterogeneous fleet at a tight SLO),
/// no ratio to it can form, and waiting for one ran every study to the maximum (issue 41). The
/// verdict then reads the policies against the best feasible one, so that is what must be
/// precise: each other policy's paired ratio to the policy of the highest mean capacity, and,
/// when that policy is the only one, its own capacity interval relative to its mean. A pair
/// that cannot be formed yet still counts as an interval without a width (never precise), so an
/// empty list cannot read as "every ratio precise".
fn precision_ratios(study: &CapacityStudy) -> Vec<(Interval, f64)> {
    let unformed = Interval {
        n: 0,
        mean: 1.0,
        sd: None,
        half_width: None,
    };
    let others: Vec<usize> = (0..study.policies.len())
        .filter(|&i| i != study.baseline)
        .collect();
    if others.iter().all(|&i| study.ratio(i).is_some()) {
        return others
            .iter()
            .map(|&i| (study.ratio(i).unwrap_or(unformed), 1.0))
            .collect();
    }
    let mean = |i: usize| study.policies[i].interval().map_or(0.0, |iv| iv.mean);
    let Some(best) = others
        .iter()
        .copied()
        .filter(|&i| mean(i) > 0.0)
        .max_by(|&a, &b| mean(a).total_cmp(&mean(b)))
    else {
        return others.iter().map(|_| (unformed, 1.0)).collect();
    };
    if others.len() == 1 {
        return vec![match study.policies[best].interval() {
            Some(iv) => (iv, iv.mean),
            None => (unformed, 1.0),
        }];
    }
    others
        .iter()
        .filter(|&&i| i != best)
        .map(|&i| (study.ratio_to(i, best).unwrap_or(unformed), 1.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::search::tests::ps_run;
    use super::*;
    use routelab_reports::capacity::capacity_table;

    fn plan(seeds: SeedPlan) -> StudyPlan {
        StudyPlan {
            scenario: "s".into(),
            description: String::new(),
            policies: ["base", "better"]
                .map(|name| PolicyConfig {
                    name: name.into(),
                    ..PolicyConfig::from_name("equal/round-robin/none/none").unwrap()
                })
                .into(),
            baseline: 0,
            first_seed: 10,
            seeds,
            slo: SloSpec::parse("e2el_mean<=500ms", None).unwrap(),
            options: SearchOptions::default(),
            base_rate_per_s: Some(2.0),
            seed_meaning: Default::default(),
        }
    }

    /// "better" carries 1.5× the baseline's load on every seed; seed noise moves both alike.
    fn batch(b: &[(usize, u64)]) -> Result<Vec<SeedCapacity>, String> {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        b.iter()
            .map(|&(p, seed)| {
                let noise = 1.0 + (seed % 3) as f64 * 0.1;
                let speed = if p == 1 { 1.5 } else { 1.0 } * noise;
                find_capacity(&spec, &SearchOptions::default(), seed, |s| {
                    ps_run(s / speed)
                })
                .map_err(|e| e.to_string())
            })
            .collect()
    }

    #[test]
    fn a_fixed_study_pairs_seeds_and_reports_the_ratio() {
        let st = run_study(plan(SeedPlan::Fixed(3)), batch).unwrap();
        assert_eq!(st.seeds, [10, 11, 12]);
        assert_eq!(st.seed_stop, SeedStop::Fixed);
        let base = st.policies[0].interval().unwrap();
        // knee 8 × noise (1.1, 1.2, 1.0 for seeds 10, 11, 12), within 2 %.
        assert!((base.mean / 8.8 - 1.0).abs() < 0.02, "{base:?}");
        let r = st.ratio(1).unwrap();
        assert!((r.mean - 1.5).abs() < 0.03, "{r:?}");
        assert!(st.established(1));
        assert!(st.ratio(0).is_none());
        let rate = st.rate(0).unwrap();
        assert!((rate.mean - 2.0 * base.mean).abs() < 1e-9);
        assert!((rate.half_width.unwrap() - 2.0 * base.half_width.unwrap()).abs() < 1e-9);
    }

    #[test]
    fn auto_seeds_stop_when_the_paired_ratio_is_precise() {
        // Common random numbers: the ratio is 1.5 on every seed up to the search's precision,
        // so 3 seeds already pin it well under 5 %.
        let st = run_study(plan(SeedPlan::Auto(AutoSeeds::default())), batch).unwrap();
        assert_eq!(st.seed_stop, SeedStop::Precise);
        assert_eq!(st.seeds.len(), 3);
        assert_eq!(st.auto_rule, Some((0.05, 20)));
        let text = capacity_table(&st);
        assert!(
            text.contains("--seeds auto: every paired ratio's 95 % half-width fell within ±0.05"),
            "{text}"
        );
        // A ratio that moves by seed never gets precise: the maximum stops it.
        let noisy = |b: &[(usize, u64)]| {
            let mut v = batch(b)?;
            for (c, &(p, seed)) in v.iter_mut().zip(b) {
                if p == 1 {
                    c.scale *= if seed % 2 == 0 { 0.5 } else { 2.0 };
                }
            }
            Ok::<_, String>(v)
        };
        let auto = AutoSeeds {
            max: 7,
            ..AutoSeeds::default()
        };
        let st = run_study(plan(SeedPlan::Auto(auto)), noisy).unwrap();
        assert_eq!(st.seed_stop, SeedStop::MaxSeeds);
        assert!(capacity_table(&st).contains("the maximum of 7 seeds was reached"));
        assert_eq!(st.seeds, [10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(st.policies[1].seeds.len(), 7);
    }

    /// Regression: a baseline that is infeasible on every seed gives no paired ratio at all,
    /// and an empty list of ratios used to read as "every ratio precise" after two seeds.
    #[test]
    fn auto_seeds_do_not_stop_while_no_ratio_to_the_baseline_can_be_formed() {
        let infeasible_baseline = |b: &[(usize, u64)]| {
            let mut v = batch(b)?;
            for (c, &(p, _)) in v.iter_mut().zip(b) {
                if p == 0 {
                    c.scale = 0.0;
                }
            }
            Ok::<_, String>(v)
        };
        let auto = AutoSeeds {
            max: 5,
            ..AutoSeeds::default()
        };
        let st = run_study(plan(SeedPlan::Auto(auto)), infeasible_baseline).unwrap();
        assert!(st.ratio(1).is_none());
        // The one feasible policy's capacity moves by 10 % per seed: never within 5 %.
        assert_eq!(st.seed_stop, SeedStop::MaxSeeds);
        assert_eq!(st.seeds.len(), 5);
    }

    /// Issue 41: with the baseline infeasible on every seed, `--seeds auto` ran to the maximum
    /// however precise the feasible policies' ranking was. It now judges their paired ratios to
    /// the best feasible policy, which common random numbers pin in 3 seeds.
    #[test]
    fn auto_seeds_stop_on_the_ratios_to_the_best_feasible_policy_when_the_baseline_is_infeasible() {
        let three = |b: &[(usize, u64)]| {
            // Policy 2 runs as the baseline would (speed 1 × the seed's noise); the baseline
            // itself is infeasible.
            let as_base: Vec<(usize, u64)> = b
                .iter()
                .map(|&(p, s)| (if p == 2 { 0 } else { p }, s))
                .collect();
            let mut v = batch(&as_base)?;
            for (c, &(p, _)) in v.iter_mut().zip(b) {
                if p == 0 {
                    c.scale = 0.0;
                }
            }
            Ok::<_, String>(v)
        };
        let mut p = plan(SeedPlan::Auto(AutoSeeds::default()));
        let mut third = p.policies[0].clone();
        third.name = "third".into();
        p.policies.push(third);
        let st = run_study(p, three).unwrap();
        assert!(st.ratio(1).is_none() && st.ratio(2).is_none());
        assert_eq!(st.seed_stop, SeedStop::Precise);
        assert_eq!(st.seeds.len(), 3);
        let r = st.ratio_to(2, 1).unwrap();
        assert!((r.mean - 1.0 / 1.5).abs() < 0.03, "{r:?}");
        let text = capacity_table(&st);
        assert!(
            text.contains("the baseline is infeasible on every seed, so every paired ratio to the best feasible policy"),
            "{text}"
        );
    }
}
