//! `routelab plan`: one capacity study per condition (the trace resampled, as recorded, its
//! held-out tail, the fleet's uncertain profile fields at their low and high ends), all on the
//! same seeds, read together into the choice to ship and the capacity to plan for.
//!
//! **The robust choice (max-min).** In each condition every policy's capacity is read as its
//! paired ratio to that condition's best policy (1 for the best). A policy's *worst ratio* is
//! the smallest of these over the conditions; the robust choice is the policy whose worst ratio
//! is highest: whatever condition turns out true, it carries at least that share of what the
//! best policy for that condition would. Max-min rather than the mean, because the conditions
//! are not draws from a known distribution (a held-out tail and a profile 30 % slow are "what
//! if"s, not equally likely worlds), and the one to guard against is the one that hurts.
//!
//! **Ties.** Worst ratios within the search's precision of the highest are a tie (the search
//! cannot tell them apart); among those the higher mean ratio over the conditions wins, then
//! the policy listed first (so the answer never rests on float noise).
//!
//! **The range.** The capacity to plan for is the robust choice's capacity in requests per
//! second over the conditions: the lowest and highest mean, and the lowest and highest end of
//! their 95 % intervals across seeds.

use crate::capacity::{CapacityStudy, SloSpec, best};
use crate::error::ReportError;
use crate::export::{create_dir, json::write_json, write_file};
use crate::interval_text;
use crate::num::{fmt_sig, r6};
use crate::run::Written;
use crate::stats::Interval;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;

/// One condition's study.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// Its short name (`resampled`, `as recorded`, `prefill_tok_s -30 %`).
    pub name: String,
    /// What it changes, in a sentence.
    pub what: String,
    /// The capacity study under it (every condition lists the same policies and seeds).
    pub study: CapacityStudy,
}

/// Every condition's study.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanStudy {
    /// Scenario name.
    pub scenario: String,
    /// The SLO every condition was searched at.
    pub slo: SloSpec,
    /// The search's relative precision (ratios closer than this are a tie).
    pub precision: f64,
    /// The conditions, the reference (the trace resampled) first.
    pub conditions: Vec<Condition>,
}

/// How one policy stands over the conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Its index in the policies.
    pub policy: usize,
    /// Its mean paired ratio to the condition's best, per condition.
    pub ratios: Vec<f64>,
    /// The smallest of `ratios`.
    pub worst: f64,
    /// The condition of `worst` (the first, on a tie).
    pub worst_condition: usize,
    /// The mean of `ratios`.
    pub mean: f64,
}

/// The robust choice's capacity over the conditions, requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityRange {
    /// The lowest mean, and its condition.
    pub low_mean: (f64, usize),
    /// The highest mean, and its condition.
    pub high_mean: (f64, usize),
    /// The lowest low end of a 95 % interval.
    pub low: f64,
    /// The highest high end of a 95 % interval.
    pub high: f64,
}

impl PlanStudy {
    /// The policies' names (the reference condition's).
    pub fn policies(&self) -> Vec<&str> {
        self.conditions.first().map_or_else(Vec::new, |c| {
            c.study.policies.iter().map(|p| p.policy.as_str()).collect()
        })
    }

    /// The best policy under condition `c` (highest mean capacity, the first listed on a tie).
    pub fn best(&self, c: usize) -> Option<usize> {
        best(&self.conditions[c].study, |_| true)
    }

    /// Policy `i`'s mean paired ratio to the best under condition `c`: 1 for the best, and 1
    /// for every policy when the best carries none of the traffic (no policy does).
    pub fn ratio_to_best(&self, c: usize, i: usize) -> f64 {
        let st = &self.conditions[c].study;
        match self.best(c) {
            Some(b) if b != i => st.ratio_to(i, b).map_or(1.0, |r| r.mean),
            _ => 1.0,
        }
    }

    /// Every policy's standing, in the policies' order.
    pub fn standings(&self) -> Vec<Standing> {
        (0..self.policies().len())
            .map(|i| {
                let ratios: Vec<f64> = (0..self.conditions.len())
                    .map(|c| self.ratio_to_best(c, i))
                    .collect();
                let (worst_condition, worst) = ratios.iter().copied().enumerate().fold(
                    (0, f64::INFINITY),
                    |(bc, bw), (c, r)| if r < bw { (c, r) } else { (bc, bw) },
                );
                let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
                Standing {
                    policy: i,
                    ratios,
                    worst,
                    worst_condition,
                    mean,
                }
            })
            .collect()
    }

    /// The robust choice (see the module documentation for the rule and its ties).
    pub fn robust(&self) -> Option<usize> {
        let standings = self.standings();
        let top = standings
            .iter()
            .map(|s| s.worst)
            .fold(f64::NEG_INFINITY, f64::max);
        standings
            .iter()
            .filter(|s| s.worst >= top - self.precision)
            .fold(None, |acc: Option<&Standing>, s| match acc {
                Some(a) if a.mean >= s.mean => acc,
                _ => Some(s),
            })
            .map(|s| s.policy)
    }

    /// Policy `i`'s capacity under condition `c`, requests per second across seeds.
    pub fn rate(&self, c: usize, i: usize) -> Option<Interval> {
        self.conditions[c].study.rate(i)
    }

    /// Policy `i`'s capacity over the conditions.
    pub fn range(&self, i: usize) -> Option<CapacityRange> {
        let rates: Vec<(usize, Interval)> = (0..self.conditions.len())
            .filter_map(|c| self.rate(c, i).map(|r| (c, r)))
            .collect();
        let (first_c, first) = *rates.first()?;
        let mut out = CapacityRange {
            low_mean: (first.mean, first_c),
            high_mean: (first.mean, first_c),
            low: first.low(),
            high: first.high(),
        };
        for &(c, r) in &rates[1..] {
            if r.mean < out.low_mean.0 {
                out.low_mean = (r.mean, c);
            }
            if r.mean > out.high_mean.0 {
                out.high_mean = (r.mean, c);
            }
            out.low = out.low.min(r.low());
            out.high = out.high.max(r.high());
        }
        Some(out)
    }

    /// The conditions whose best policy is not the reference condition's.
    pub fn flips(&self) -> Vec<usize> {
        let reference = self.best(0);
        (1..self.conditions.len())
            .filter(|&c| self.best(c) != reference)
            .collect()
    }
}

/// The console paragraph: the choice, the range, what flips the ranking, and the gateway
/// configuration written (`deploy`: its path).
pub fn plan_paragraph(plan: &PlanStudy, deploy: &Path) -> String {
    let names = plan.policies();
    let Some(r) = plan.robust() else {
        return format!("Plan for `{}`: no policy was studied.\n", plan.scenario);
    };
    let standing = &plan.standings()[r];
    let cond = |c: usize| plan.conditions[c].name.as_str();
    let mut s = format!(
        "Plan for `{}` at the SLO ({}), over {} conditions on {} seeds each: ship `{}`, the \
         robust choice (max-min: its worst capacity ratio to the best policy of any condition \
         is {}, under {}).",
        plan.scenario,
        plan.slo.rule(),
        plan.conditions.len(),
        plan.conditions[0].study.seeds.len(),
        names[r],
        fmt_sig(Some(standing.worst), 3),
        cond(standing.worst_condition),
    );
    if let Some(range) = plan.range(r) {
        let _ = write!(
            s,
            " Plan for {}–{} req/s (its mean capacity under {} and under {}; 95 % intervals \
             {}–{}).",
            fmt_sig(Some(range.low_mean.0), 3),
            fmt_sig(Some(range.high_mean.0), 3),
            cond(range.low_mean.1),
            cond(range.high_mean.1),
            fmt_sig(Some(range.low), 3),
            fmt_sig(Some(range.high), 3),
        );
    }
    let flips = plan.flips();
    let best_name = |c: usize| plan.best(c).map_or("-", |b| names[b]);
    if flips.is_empty() {
        let _ = write!(s, " `{}` is best under every condition.", best_name(0));
    } else {
        let list: Vec<String> = flips
            .iter()
            .map(|&c| format!("{} (`{}`)", cond(c), best_name(c)))
            .collect();
        let _ = write!(
            s,
            " The ranking flips from `{}` under {}.",
            best_name(0),
            list.join(", ")
        );
    }
    let _ = write!(
        s,
        " Gateway configuration (policy `{}`, this SLO): {}.",
        names[r],
        deploy.display()
    );
    s.push('\n');
    s
}

/// `plan.md`: the paragraph, each condition's capacities, and the standings.
pub fn plan_markdown(plan: &PlanStudy, deploy: &Path) -> String {
    let names = plan.policies();
    let mut s = format!(
        "# Plan: {}\n\n{}\n",
        plan.scenario,
        plan_paragraph(plan, deploy)
    );
    s.push_str(
        "\n## Capacity per condition (req/s, mean ± 95 % half-width across seeds)\n\n\
         | condition | what | best |",
    );
    for n in &names {
        let _ = write!(s, " `{n}` |");
    }
    s.push_str("\n|---|---|---|");
    s.push_str(&"---|".repeat(names.len()));
    s.push('\n');
    for (c, cond) in plan.conditions.iter().enumerate() {
        let best = plan.best(c).map_or("-", |b| names[b]);
        let _ = write!(s, "| {} | {} | `{best}` |", cond.name, cond.what);
        for i in 0..names.len() {
            let _ = write!(s, " {} |", interval_text::cell(plan.rate(c, i), 3));
        }
        s.push('\n');
    }
    s.push_str(
        "\n## Standings (paired capacity ratio to each condition's best)\n\n\
         | policy | worst ratio | under | mean ratio |\n|---|---|---|---|\n",
    );
    for st in plan.standings() {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            names[st.policy],
            fmt_sig(Some(st.worst), 3),
            plan.conditions[st.worst_condition].name,
            fmt_sig(Some(st.mean), 3)
        );
    }
    let _ = write!(
        s,
        "\nThe robust choice is the policy of the highest worst ratio (max-min); worst ratios \
         within the search's precision ({} %) of the highest are a tie, broken by the higher \
         mean ratio, then by the order listed. See docs/plan.md.\n",
        fmt_sig(Some(plan.precision * 100.0), 2)
    );
    s
}

/// `plan.json`: the conditions' capacities, the standings, the choice and its range.
pub fn plan_json(plan: &PlanStudy, deploy: &Path) -> Value {
    let names = plan.policies();
    let robust = plan.robust();
    json!({
        "scenario": plan.scenario,
        "slo": plan.slo.to_string(),
        "slo_rule": plan.slo.rule(),
        "precision": r6(plan.precision),
        "seeds": plan.conditions.first().map(|c| c.study.seeds.clone()),
        "policies": names,
        "conditions": plan.conditions.iter().enumerate().map(|(c, cond)| json!({
            "name": cond.name,
            "what": cond.what,
            "base_rate_per_s": cond.study.base_rate_per_s.and_then(r6),
            "best": plan.best(c).map(|b| names[b]),
            "capacity_rate_per_s": (0..names.len())
                .map(|i| interval_text::json(plan.rate(c, i)))
                .collect::<Vec<_>>(),
            "capacity_scale": cond.study.policies.iter()
                .map(|p| interval_text::json(p.interval()))
                .collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "standings": plan.standings().iter().map(|st| json!({
            "policy": names[st.policy],
            "ratios_to_best": st.ratios.iter().map(|&r| r6(r)).collect::<Vec<_>>(),
            "worst": r6(st.worst),
            "worst_condition": plan.conditions[st.worst_condition].name,
            "mean": r6(st.mean),
        })).collect::<Vec<_>>(),
        "robust": robust.map(|r| names[r]),
        "rule": "max-min of the paired capacity ratio to each condition's best; ties within \
                 the search precision broken by the mean ratio, then the order listed",
        "range_rate_per_s": robust.and_then(|r| plan.range(r)).map(|g| json!({
            "low_mean": r6(g.low_mean.0),
            "low_condition": plan.conditions[g.low_mean.1].name,
            "high_mean": r6(g.high_mean.0),
            "high_condition": plan.conditions[g.high_mean.1].name,
            "low": r6(g.low),
            "high": r6(g.high),
        })),
        "flips": plan.flips().iter().map(|&c| plan.conditions[c].name.clone()).collect::<Vec<_>>(),
        "gateway_config": deploy.display().to_string(),
    })
}

/// Write `plan.md` and `plan.json` into `dir`.
///
/// # Errors
/// A directory or file that cannot be written.
pub fn write_plan(dir: &Path, plan: &PlanStudy, deploy: &Path) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let mut out = Written::default();
    let p = dir.join("plan.json");
    write_json(&p, &plan_json(plan, deploy))?;
    out.files.push(p);
    let p = dir.join("plan.md");
    write_file(&p, plan_markdown(plan, deploy))?;
    out.files.push(p);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::fixture::study;

    fn spec() -> SloSpec {
        SloSpec::parse("e2el_mean<=500ms", None).unwrap()
    }

    /// Two conditions: `a` leads the first by 20 %, `b` the second by 10 %; `c` is never
    /// best but never far behind.
    fn plan(c_second: f64) -> PlanStudy {
        let knees = [[1.2, 1.0, 1.15], [0.9, 1.0, c_second]];
        PlanStudy {
            scenario: "s".into(),
            slo: spec(),
            precision: 0.02,
            conditions: knees
                .iter()
                .enumerate()
                .map(|(c, k)| Condition {
                    name: format!("cond{c}"),
                    what: String::new(),
                    study: study(&spec(), &["a", "b", "c"], 3, 2.0, |p, s| {
                        k[p] * (1.0 + s as f64 * 0.01)
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn the_robust_choice_is_the_highest_worst_ratio() {
        let p = plan(0.98);
        assert_eq!(p.best(0), Some(0));
        assert_eq!(p.best(1), Some(1));
        assert_eq!(p.flips(), [1]);
        let st = p.standings();
        // a: 1 then 0.9; b: 1/1.2 then 1; c: 1.15/1.2 then 0.98.
        assert!((st[0].worst - 0.9).abs() < 1e-3, "{st:?}");
        assert_eq!(st[0].worst_condition, 1);
        assert!((st[1].worst - 1.0 / 1.2).abs() < 1e-3);
        assert!((st[2].worst - 1.15 / 1.2).abs() < 1e-3);
        assert_eq!(p.robust(), Some(2));
        let r = p.range(2).unwrap();
        // Rates: base 2 req/s × knee × the seeds' 1.01..1.03.
        assert!((r.low_mean.0 - 2.0 * 0.98 * 1.02).abs() < 0.03, "{r:?}");
        assert_eq!((r.low_mean.1, r.high_mean.1), (1, 0));
        assert!(r.low < r.low_mean.0 && r.high > r.high_mean.0);
        let text = plan_paragraph(&p, Path::new("gw.yaml"));
        assert!(text.contains("ship `c`, the robust choice"), "{text}");
        assert!(
            text.contains("The ranking flips from `a` under cond1 (`b`)"),
            "{text}"
        );
        assert!(text.contains("policy `c`, this SLO): gw.yaml"), "{text}");
        let md = plan_markdown(&p, Path::new("gw.yaml"));
        assert!(md.contains("| cond1 |  | `b` |"), "{md}");
        let j = plan_json(&p, Path::new("gw.yaml"));
        assert_eq!(j["robust"], "c");
        assert_eq!(j["flips"][0], "cond1");
    }

    #[test]
    fn worst_ratios_within_the_precision_tie_and_the_mean_breaks_it() {
        // c's worst (0.905 under cond1) is within 2 % of a's 0.9... and of its own: a and c
        // tie on the worst ratio; c's mean ratio (0.93) is below a's (0.95): a wins.
        let p = plan(0.905);
        let st = p.standings();
        assert!((st[0].worst - st[2].worst).abs() < 0.02, "{st:?}");
        assert!(st[0].mean > st[2].mean);
        assert_eq!(p.robust(), Some(0));
    }
}
