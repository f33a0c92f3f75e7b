//! `routelab capacity`: each policy's largest load at which an SLO holds, across seeds, and its
//! ratio to a baseline policy with a paired interval.
//!
//! - [`slo`]: the `--slo` spec ([`SloSpec`]) and the one test of whether a run meets it.
//! - [`search`]: what the search on one seed finds ([`SeedCapacity`], [`Evaluation`],
//!   [`Censored`]).
//! - this module: the study across policies and seeds ([`CapacityStudy`]) and its paired
//!   ratios. The search and the study runner (`find_capacity`, `run_study`, `--seeds auto`)
//!   are `routelab-lab`'s; what they find is plain data here.
//! - `report`: `capacity.json`, `capacity.csv`, `capacity_evaluations.csv`, the charts,
//!   `report.html` and the console table.
//!
//! **Across seeds.** The capacity is searched on each seed alone (every policy sees the same
//! arrivals for a seed: common random numbers). A policy's capacity is the mean of its per-seed
//! capacities with a 95 % interval; its ratio to the baseline is the paired interval of the
//! per-seed ratios ([`paired_ratio`]), established when it excludes 1 ([`excludes`]).
//!
//! **No knee.** A policy that cannot meet the SLO even at the smallest load scale tried has
//! capacity 0 on that seed (the honest answer: it carries none of this traffic at the SLO), and
//! one that meets it at the largest has that scale as a lower bound; both are marked
//! ([`Censored`]) in every output. Seeds on which the baseline has capacity 0 drop out of the
//! paired ratios.

mod findings;
mod report;
pub mod search;
pub mod slo;

pub use findings::{PolicyKind, best, findings_section, ship_sentence, update_findings};
pub(crate) use findings::{ratio_cell, versus};
pub use report::{capacity_table, write_capacity};
pub use search::{Censored, Evaluation, Rejected, SeedCapacity};
pub use slo::{Bound, SloMetric, SloSpec, Statistic};

use crate::holdout::OutOfSample;
use crate::stats::{Interval, SeedStop, excludes, paired_ratio};
use routelab_policies::PolicyRole;
use serde::Serialize;

/// One policy's capacities, one per seed (in seed order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyCapacity {
    /// Policy name.
    pub policy: String,
    /// What the policy is, from its validated config (the findings' verdicts read it; not
    /// written: `capacity.json` names policies only).
    #[serde(skip)]
    pub role: PolicyRole,
    /// Per-seed searches.
    pub seeds: Vec<SeedCapacity>,
}

impl PolicyCapacity {
    /// A policy named `policy` whose role is `role`, no seed searched yet.
    pub fn of(policy: String, role: PolicyRole) -> PolicyCapacity {
        PolicyCapacity {
            policy,
            role,
            seeds: Vec::new(),
        }
    }

    /// Per-seed capacity scales.
    pub fn scales(&self) -> Vec<f64> {
        self.seeds.iter().map(|s| s.scale).collect()
    }

    /// Mean and 95 % interval of the capacity scale across seeds.
    pub fn interval(&self) -> Option<Interval> {
        Interval::of(self.scales())
    }

    /// What the outputs say about refused requests (empty when none was): on how many seeds
    /// the router refused some, and the run's own sentence for the evaluation that refused the
    /// most (its seed and load scale) — e.g. requests longer than every worker's context window.
    pub fn rejection_note(&self) -> String {
        let with = self
            .seeds
            .iter()
            .filter(|s| s.evaluations.iter().any(|e| !e.rejected.is_none()))
            .count();
        let most = self
            .seeds
            .iter()
            .flat_map(|s| s.evaluations.iter().map(move |e| (s.seed, e)))
            .max_by(|(sa, a), (sb, b)| {
                // The most refused; on a tie the first seed, then the lowest scale.
                a.rejected
                    .total
                    .cmp(&b.rejected.total)
                    .then(sb.cmp(sa))
                    .then(b.scale.total_cmp(&a.scale))
            });
        match most {
            Some((seed, e)) if !e.rejected.is_none() => format!(
                "requests refused on {with}/{} seeds; the most at seed {seed}, load scale {}: {}",
                self.seeds.len(),
                crate::num::fmt_sig(Some(e.scale), 4),
                e.rejected.describe().unwrap_or_default()
            ),
            _ => String::new(),
        }
    }

    /// What the outputs say about seeds whose search found no knee (empty when none):
    /// `infeasible on 3/5 seeds: the SLO does not hold even at …` (the first seed's reason) or
    /// `at least 64x on 2/5 seeds`.
    pub fn censored_note(&self) -> String {
        let n = self.seeds.len();
        let never: Vec<&Censored> = self
            .seeds
            .iter()
            .filter_map(|s| s.censored.as_ref())
            .filter(|c| matches!(c, Censored::NeverHolds { .. }))
            .collect();
        let always = self
            .seeds
            .iter()
            .filter_map(|s| s.censored.as_ref())
            .find(|c| matches!(c, Censored::AlwaysHolds { .. }));
        let always_n = self
            .seeds
            .iter()
            .filter(|s| matches!(s.censored, Some(Censored::AlwaysHolds { .. })))
            .count();
        let mut parts = Vec::new();
        if let Some(first) = never.first() {
            parts.push(format!(
                "infeasible on {}/{n} seeds (counted as 0): {}",
                never.len(),
                first.describe()
            ));
        }
        if let Some(Censored::AlwaysHolds { max_scale }) = always {
            parts.push(format!(
                "at least {max_scale}x on {always_n}/{n} seeds (no knee within the range)"
            ));
        }
        parts.join("; ")
    }
}

/// The whole study: what was asked and what was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityStudy {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// The SLO.
    pub slo: SloSpec,
    /// Search precision (relative).
    pub precision: f64,
    /// The scenario's mean arrival rate at load scale 1, requests/s (its open-loop arrivals
    /// over their span); a capacity's request rate is this × its scale.
    pub base_rate_per_s: Option<f64>,
    /// Index of the baseline in `policies`.
    pub baseline: usize,
    /// Why seeds stopped being added.
    pub seed_stop: SeedStop,
    /// With `--seeds auto`: the half-width every paired ratio had to reach, and the maximum
    /// seed count.
    pub auto_rule: Option<(f64, usize)>,
    /// Seeds run, in order.
    pub seeds: Vec<u64>,
    /// Per policy, in the order asked.
    pub policies: Vec<PolicyCapacity>,
    /// What a seed is (`Scenario::seed_meaning`): its sentence and its short form (empty when
    /// the host does not say).
    pub seed_meaning: (String, String),
    /// The out-of-sample check (`--holdout`), when one ran.
    pub out_of_sample: Option<OutOfSample>,
    /// When this study is a `--holdout` held-out part: the check it serves (the rest's
    /// out-of-sample verdict). Its outputs then lead with that verdict, not with a policy to
    /// ship of their own (issue 41: the held-out part said "Ship `predictive`" inside a report
    /// that shipped another policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_out_of: Option<OutOfSample>,
}

impl CapacityStudy {
    /// The paired ratio of policy `i`'s per-seed capacities to the baseline's (`None` for the
    /// baseline itself).
    pub fn ratio(&self, i: usize) -> Option<Interval> {
        (i != self.baseline).then(|| self.ratio_to(i, self.baseline))?
    }

    /// The paired interval of policy `i`'s per-seed capacities over policy `j`'s (seeds where
    /// `j` has capacity 0 drop out; `None` when none is left).
    pub fn ratio_to(&self, i: usize, j: usize) -> Option<Interval> {
        paired_ratio(&self.policies[i].scales(), &self.policies[j].scales())
    }

    /// Whether policy `i`'s ratio to the baseline is established (its interval excludes 1).
    pub fn established(&self, i: usize) -> bool {
        self.ratio(i).is_some_and(|r| excludes(&r, 1.0))
    }

    /// The capacity interval of policy `i` in requests per second.
    pub fn rate(&self, i: usize) -> Option<Interval> {
        let base = self.base_rate_per_s?;
        let iv = self.policies[i].interval()?;
        Some(Interval {
            mean: iv.mean * base,
            sd: iv.sd.map(|s| s * base),
            half_width: iv.half_width.map(|h| h * base),
            ..iv
        })
    }
}

/// Studies for the outputs' tests, built as plain data (the search and the study runner that
/// make real ones are `routelab-lab`'s).
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;
    use routelab_policies::PolicyConfig;

    /// The role of a policy named by a preset or a composition (a test's own name: ours).
    pub(crate) fn role_of(name: &str) -> PolicyRole {
        PolicyConfig::from_name(name).map_or(PolicyRole::Ours, |c| c.role())
    }

    /// A fixed-seed study of `policies` (the first is the baseline) on seeds 1..=`seeds`, in
    /// which policy `p` holds the SLO up to load scale `knee(p, seed)` exactly (the bracket's
    /// high end 2 % above it). A knee below 1/64 is a search that never held (capacity 0).
    pub(crate) fn study(
        spec: &SloSpec,
        policies: &[&str],
        seeds: u64,
        base_rate_per_s: f64,
        knee: impl Fn(usize, u64) -> f64,
    ) -> CapacityStudy {
        CapacityStudy {
            scenario: "s".into(),
            description: String::new(),
            slo: spec.clone(),
            precision: 0.02,
            base_rate_per_s: Some(base_rate_per_s),
            baseline: 0,
            seed_stop: SeedStop::Fixed,
            auto_rule: None,
            seeds: (1..=seeds).collect(),
            policies: policies
                .iter()
                .enumerate()
                .map(|(p, name)| PolicyCapacity {
                    policy: (*name).into(),
                    role: role_of(name),
                    seeds: (1..=seeds).map(|s| seed(spec, s, knee(p, s))).collect(),
                })
                .collect(),
            seed_meaning: Default::default(),
            out_of_sample: None,
            held_out_of: None,
        }
    }

    /// One seed's search around `knee`: its last holding and first failing evaluation.
    fn seed(spec: &SloSpec, seed: u64, knee: f64) -> SeedCapacity {
        // Every bound's statistic at its bound where the SLO holds, twice it where it fails.
        let at = |scale: f64, holds: bool| Evaluation {
            scale,
            holds,
            attainment: None,
            ttft_p99_s: Some(0.0),
            values: spec
                .bounds
                .iter()
                .map(|b| Some(b.bound_s * if holds { 1.0 } else { 2.0 }))
                .collect(),
            rejected: Rejected::default(),
        };
        let min_scale = 1.0 / 64.0;
        if knee < min_scale {
            let fails = at(min_scale, false);
            let why = fails.why_not(spec);
            return SeedCapacity {
                seed,
                scale: 0.0,
                failing_scale: min_scale,
                censored: Some(Censored::NeverHolds { min_scale, why }),
                evaluations: vec![fails],
            };
        }
        SeedCapacity::knee(
            seed,
            knee,
            knee * 1.02,
            vec![at(knee, true), at(knee * 1.02, false)],
        )
    }
}
