//! Outputs of `routelab compare`: several policies × several seeds × several scenarios, with the
//! mean and 95 % interval of each metric across seeds, the winner per metric, and every
//! policy's **paired** difference from a baseline policy.
//!
//! Every policy of a scenario runs on the same seeds, and for a given seed sees the same
//! traffic (common random numbers; open-loop traffic exactly, closed-loop follow-ups only in
//! their first requests). So a comparison is made on the per-seed differences
//! ([`crate::stats::paired_difference`]): the seed-to-seed noise both policies share cancels, and a
//! difference is *established* only when the 95 % interval of those differences excludes zero
//! ([`crate::stats::excludes`]). The per-policy intervals are still reported, but two overlapping
//! per-policy intervals do not mean "no difference". Under `--seeds auto`
//! (`routelab_lab::grow_seeds`) seeds are added until every reported difference is known to a stated
//! precision ([`reported_differences`]).

use crate::chart::{self, BarGroup, BarPanel, Figure, Panel, Series};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, split_table, table};
use crate::export::json::write_json;
use crate::export::markdown::cell as md;
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::holdout::OutOfSample;
use crate::interval_text;
use crate::metric::{Direction, Metric, Unit, view, views};
use crate::num::{r6, slug};
use crate::run::{Written, latency_cdf_figure};
use crate::stats::{AutoSeeds, Interval, SeedStop, excludes, paired_difference};
use crate::summary::{RunSummary, summary_csv_header};
use routelab_policies::{PolicyConfig, PolicyRole};
use routelab_sim::RunMetrics;
use routelab_sim::histogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

mod format;
mod page;
mod text;

pub(crate) use format::fmt_diff;
pub(crate) use format::seed_rule_note;
use format::{column_label, fmt_metric, intervals_and_best, key_metrics, no_spread_note};

pub(crate) use page::headline;
pub use page::headline_metric;
pub(crate) use page::with_unit;
use page::{bars_figure, cdf_figure, compare_html, established, seeds_note};
pub use text::{compare_table, findings_baseline_markdown, findings_document, findings_markdown};

/// One seed of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedRun {
    /// Root seed.
    pub seed: u64,
    /// Its scalar metrics.
    #[serde(flatten)]
    pub summary: RunSummary,
}

/// One policy over several seeds.
#[derive(Debug, Clone)]
pub struct PolicySeeds {
    /// Policy name.
    pub policy: String,
    /// What the policy is, from its validated config (the notes on an oracle winner read it).
    pub role: PolicyRole,
    /// One summary per seed, in seed order as run.
    pub runs: Vec<SeedRun>,
    /// End-to-end latency histogram of the first seed, for the CDF chart.
    pub first_seed_e2e: Option<Histogram>,
}

impl PolicySeeds {
    /// No runs yet of `policy`.
    pub fn of(policy: &PolicyConfig) -> PolicySeeds {
        PolicySeeds::new(policy.name.clone(), policy.role())
    }

    /// No runs yet of a policy named `policy` whose role is `role`.
    pub fn new(policy: impl Into<String>, role: PolicyRole) -> PolicySeeds {
        PolicySeeds {
            policy: policy.into(),
            role,
            runs: Vec::new(),
            first_seed_e2e: None,
        }
    }

    /// Add one seed's metrics (the first one added also provides the CDF).
    pub fn push(&mut self, seed: u64, metrics: &RunMetrics) {
        self.push_summary(seed, RunSummary::from_metrics(metrics), Some(&metrics.e2e));
    }

    /// Add one seed's summary and, for the first seed, its end-to-end latency histogram (what
    /// [`PolicySeeds::push`] keeps of a run; a partial result holds exactly this).
    pub fn push_summary(&mut self, seed: u64, summary: RunSummary, e2e: Option<&Histogram>) {
        if self.runs.is_empty() {
            self.first_seed_e2e = e2e.cloned();
        }
        self.runs.push(SeedRun {
            seed,
            summary: summary.with_policy(self.policy.clone()),
        });
    }
}

/// What `routelab_lab::grow_seeds` adds to a policy for one seed: a run's metrics, or what a partial result
/// kept of them.
pub trait SeedResult {
    /// Add this seed's result to `policy`.
    fn push_to(&self, policy: &mut PolicySeeds, seed: u64);
}

impl SeedResult for RunMetrics {
    fn push_to(&self, policy: &mut PolicySeeds, seed: u64) {
        policy.push(seed, self);
    }
}

/// All policies of one scenario.
#[derive(Debug, Clone)]
pub struct ScenarioComparison {
    /// Scenario name.
    pub scenario: String,
    /// Description.
    pub description: String,
    /// Policies, in report order.
    pub policies: Vec<PolicySeeds>,
    /// Index in `policies` of the baseline the paired differences are taken against (the
    /// first listed unless `--baseline` says otherwise).
    pub baseline: usize,
    /// How the number of seeds was decided: a fixed count, or `--seeds auto` and why it
    /// stopped.
    pub seed_stop: SeedStop,
    /// The `--seeds auto` rule, when it decided the count.
    pub auto_seeds: Option<AutoSeeds>,
    /// What a seed of the scenario is (`Scenario::seed_meaning`): its sentence, and the short
    /// form for a table cell (empty when the host does not say).
    pub seed_meaning: (String, String),
    /// The out-of-sample check (`--holdout`), when one ran.
    pub out_of_sample: Option<OutOfSample>,
    /// The SLO the runs' attainment column counts against (the scenario's `slo`), when the
    /// host says (issue 41: the console never said which).
    pub slo: Option<routelab_sim::Slo>,
}

impl ScenarioComparison {
    /// A comparison with a fixed seed count and the first policy as the baseline.
    pub fn new(
        scenario: impl Into<String>,
        description: impl Into<String>,
        policies: Vec<PolicySeeds>,
    ) -> ScenarioComparison {
        ScenarioComparison {
            scenario: scenario.into(),
            description: description.into(),
            policies,
            baseline: 0,
            seed_stop: SeedStop::Fixed,
            auto_seeds: None,
            seed_meaning: (String::new(), String::new()),
            out_of_sample: None,
            slo: None,
        }
    }

    /// The baseline policy (`None` only when there are no policies).
    pub fn baseline_policy(&self) -> Option<&PolicySeeds> {
        self.policies.get(self.baseline)
    }

    /// Seeds run (the most any policy ran).
    pub fn seeds_run(&self) -> usize {
        self.policies
            .iter()
            .map(|p| p.runs.len())
            .max()
            .unwrap_or(0)
    }
}

/// `compare.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareFile {
    /// Per scenario.
    pub scenarios: Vec<ScenarioStats>,
}

/// Statistics of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioStats {
    /// Scenario name.
    pub scenario: String,
    /// Description.
    pub description: String,
    /// Per policy.
    pub policies: Vec<PolicyStats>,
    /// Winner per metric (metrics no policy has a value for are left out).
    pub winners: Vec<Winner>,
    /// The policy every `vs_baseline` difference is taken against.
    pub baseline: Option<String>,
    /// Seeds run per policy.
    pub seeds_run: usize,
    /// What decided that count: `fixed` (`--seeds N`), `precise` (`--seeds auto`: every
    /// reported difference was precise enough) or `max_seeds` (`--seeds auto` reached its
    /// maximum first).
    pub seed_stop: SeedStop,
    /// The `--seeds auto` rule (absent for a fixed count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_seeds: Option<AutoSeedsRule>,
    /// What a seed is: whether a trace is replayed as recorded or resampled, and the warm-up.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub seed_meaning: String,
    /// The out-of-sample check (`--holdout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_sample: Option<OutOfSample>,
}

/// The `--seeds auto` rule as written in `compare.json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AutoSeedsRule {
    /// Seeds before the first look.
    pub start: usize,
    /// Seeds added between looks.
    pub step: usize,
    /// The most seeds it may run.
    pub max: usize,
    /// It stops when every reported difference's half-width is at most this fraction of the
    /// baseline's mean.
    pub rel_half_width: f64,
    /// The metrics whose differences count (the comparison's key metrics).
    pub metrics: &'static [&'static str],
}

impl From<AutoSeeds> for AutoSeedsRule {
    fn from(a: AutoSeeds) -> AutoSeedsRule {
        AutoSeedsRule {
            start: a.start,
            step: a.step,
            max: a.max,
            rel_half_width: a.rel_half_width,
            metrics: views::COMPARE_KEY,
        }
    }
}

/// The paired difference of one policy from another on one metric, over the seeds both ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedDiff {
    /// Metric name (see [`views::RANKED`]).
    pub metric: String,
    /// Seeds both have a value on.
    pub n: usize,
    /// Mean of the per-seed differences (this policy minus the other).
    pub mean: Option<f64>,
    /// Lower end of the 95 % interval of the differences.
    pub ci95_low: Option<f64>,
    /// Upper end of the 95 % interval of the differences.
    pub ci95_high: Option<f64>,
    /// The other policy's mean on the same seeds.
    pub reference_mean: Option<f64>,
    /// `mean` in % of `reference_mean`.
    pub relative_pct: Option<f64>,
    /// The 95 % interval excludes zero: the difference holds beyond seed noise.
    pub established: bool,
    /// `better` or `worse` (established, by the metric's direction), else `not_established`.
    pub verdict: Verdict,
}

/// The paired verdict on a difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Established, and better by the metric's direction.
    Better,
    /// Established, and worse.
    Worse,
    /// The interval includes zero (or one seed only).
    NotEstablished,
}

impl Verdict {
    /// As written in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NotEstablished => "not established",
        }
    }
}

/// Statistics of one policy across seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyStats {
    /// Policy name.
    pub policy: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Per metric, in [`views::RANKED`] order.
    pub metrics: Vec<MetricStats>,
    /// The per-seed summaries.
    pub runs: Vec<SeedRun>,
    /// Per metric, in [`views::RANKED`] order: the paired difference from the baseline policy
    /// (absent for the baseline itself).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vs_baseline: Vec<PairedDiff>,
}

/// Mean and 95 % interval (Student's t) of one metric across seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricStats {
    /// Metric name (see [`views::RANKED`]).
    pub metric: String,
    /// Seeds with a value.
    pub n: usize,
    /// Mean.
    pub mean: Option<f64>,
    /// Sample standard deviation.
    pub sd: Option<f64>,
    /// Lower end of the 95 % interval.
    pub ci95_low: Option<f64>,
    /// Upper end of the 95 % interval.
    pub ci95_high: Option<f64>,
}

impl MetricStats {
    /// The figures of metric `m`'s interval across seeds, as `compare.json` and `sweep.csv`
    /// write them: rounded to 6 significant digits; the interval's ends only when it has a
    /// width (two seeds or more).
    pub(crate) fn of(m: &Metric, iv: Option<Interval>) -> MetricStats {
        MetricStats {
            metric: m.name.to_string(),
            n: iv.map_or(0, |i| i.n),
            mean: iv.and_then(|i| r6(i.mean)),
            sd: iv.and_then(|i| i.sd).and_then(r6),
            ci95_low: iv.and_then(|i| i.half_width.and_then(|_| r6(i.low()))),
            ci95_high: iv.and_then(|i| i.half_width.and_then(|_| r6(i.high()))),
        }
    }
}

/// The best policy on one metric (by mean across seeds) and its margin over the runner-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Winner {
    /// Metric key.
    pub metric: String,
    /// Best policy (the first listed on a tie).
    pub winner: String,
    /// What the winner is (not written: `compare.json` names policies only).
    #[serde(skip)]
    pub winner_role: PolicyRole,
    /// Its mean.
    pub winner_mean: Option<f64>,
    /// Second best.
    pub runner_up: Option<String>,
    /// Its mean.
    pub runner_up_mean: Option<f64>,
    /// How much better the winner is, in % of the runner-up's mean.
    pub margin_pct: Option<f64>,
    /// The two means are equal.
    pub tie: bool,
    /// The two policies' own 95 % intervals overlap. Not the verdict: with common random
    /// numbers the paired interval below is the one that says whether the win holds.
    pub intervals_overlap: Option<bool>,
    /// The winner's paired difference from the runner-up on the seeds both ran: the win is
    /// established when its interval excludes zero.
    pub paired: Option<PairedDiff>,
}

/// Policy `p`'s mean and 95 % interval of metric `m` across its seeds.
pub fn interval(p: &PolicySeeds, m: &Metric) -> Option<Interval> {
    Interval::of(p.runs.iter().filter_map(|r| r.summary.get(m)))
}

/// The values of `a` and `b` on the seeds of `a` that `b` also ran, in `a`'s order; a missing
/// value is NaN, which drops that seed from the pairs.
fn paired_values(a: &PolicySeeds, b: &PolicySeeds, m: &Metric) -> (Vec<f64>, Vec<f64>) {
    a.runs
        .iter()
        .filter_map(|ra| {
            let rb = b.runs.iter().find(|rb| rb.seed == ra.seed)?;
            Some((
                ra.summary.get(m).unwrap_or(f64::NAN),
                rb.summary.get(m).unwrap_or(f64::NAN),
            ))
        })
        .unzip()
}

/// The paired interval of `a − b` on metric `m`, and `b`'s mean on the same seeds.
fn paired(a: &PolicySeeds, b: &PolicySeeds, m: &Metric) -> Option<(Interval, f64)> {
    let (xa, xb) = paired_values(a, b, m);
    let d = paired_difference(&xa, &xb)?;
    let base = Interval::of(
        xa.iter()
            .zip(&xb)
            .filter(|(x, y)| (*x - *y).is_finite())
            .map(|(_, y)| *y),
    )?;
    Some((d, base.mean))
}

/// [`paired`] as reported: rounded, with the verdict by the metric's direction.
pub fn paired_diff(a: &PolicySeeds, b: &PolicySeeds, m: &Metric) -> PairedDiff {
    let Some((d, base)) = paired(a, b, m) else {
        return PairedDiff {
            metric: m.name.to_string(),
            n: 0,
            mean: None,
            ci95_low: None,
            ci95_high: None,
            reference_mean: None,
            relative_pct: None,
            established: false,
            verdict: Verdict::NotEstablished,
        };
    };
    let established = excludes(&d, 0.0);
    let verdict = match (established, m.direction.is_better(d.mean, 0.0)) {
        (false, _) => Verdict::NotEstablished,
        (true, true) => Verdict::Better,
        (true, false) => Verdict::Worse,
    };
    PairedDiff {
        metric: m.name.to_string(),
        n: d.n,
        mean: r6(d.mean),
        ci95_low: d.half_width.and_then(|_| r6(d.low())),
        ci95_high: d.half_width.and_then(|_| r6(d.high())),
        reference_mean: r6(base),
        relative_pct: (base != 0.0)
            .then(|| r6(d.mean / base.abs() * 100.0))
            .flatten(),
        established,
        verdict,
    }
}

/// The differences `--seeds auto` watches, as `(paired interval, baseline mean)` for
/// `routelab_lab::seeds::stop`: every policy's paired difference from the baseline on each of the
/// comparison's key metrics ([`views::COMPARE_KEY`]). A metric on which the baseline's mean is
/// 0 (no failures, no probes) has no relative precision and is left out, as is one no seed has
/// a value for.
pub fn reported_differences(sc: &ScenarioComparison) -> Vec<(Interval, f64)> {
    let Some(base) = sc.baseline_policy() else {
        return Vec::new();
    };
    sc.policies
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != sc.baseline)
        .flat_map(|(_, p)| key_metrics().filter_map(move |m| paired(p, base, m)))
        .filter(|(_, base_mean)| *base_mean != 0.0)
        .collect()
}

/// The metrics policies are ranked by, in report order.
fn ranked() -> impl Iterator<Item = &'static Metric> {
    views::RANKED.iter().map(|n| view(n))
}

/// The best policy of `sc` on `m` by mean across seeds, the runner-up and the paired
/// difference between them (`None` when no policy has a value).
pub fn winner(sc: &ScenarioComparison, m: &Metric) -> Option<Winner> {
    let mut ranked: Vec<(usize, Interval)> = sc
        .policies
        .iter()
        .enumerate()
        .filter_map(|(i, p)| interval(p, m).map(|iv| (i, iv)))
        .collect();
    // Stable: equal means keep input order.
    ranked.sort_by(|a, b| {
        let ord = a.1.mean.total_cmp(&b.1.mean);
        match m.direction {
            Direction::Higher => ord.reverse(),
            _ => ord,
        }
    });
    let (wi, w) = *ranked.first()?;
    let second = ranked.get(1);
    let margin = second.and_then(|(_, r)| {
        if r.mean == 0.0 {
            return None;
        }
        let d = match m.direction {
            Direction::Higher => w.mean - r.mean,
            _ => r.mean - w.mean,
        };
        r6(d / r.mean.abs() * 100.0)
    });
    Some(Winner {
        metric: m.name.to_string(),
        winner: sc.policies[wi].policy.clone(),
        winner_role: sc.policies[wi].role,
        winner_mean: r6(w.mean),
        runner_up: second.map(|(i, _)| sc.policies[*i].policy.clone()),
        runner_up_mean: second.and_then(|(_, r)| r6(r.mean)),
        margin_pct: margin,
        tie: second.is_some_and(|(_, r)| r.mean == w.mean),
        intervals_overlap: second.map(|(_, r)| r.overlaps(&w)),
        paired: second.map(|(ri, _)| paired_diff(&sc.policies[wi], &sc.policies[*ri], m)),
    })
}

/// Build the content of `compare.json`.
pub fn compare_file(scenarios: &[ScenarioComparison]) -> CompareFile {
    CompareFile {
        scenarios: scenarios
            .iter()
            .map(|sc| ScenarioStats {
                scenario: sc.scenario.clone(),
                description: sc.description.clone(),
                policies: sc
                    .policies
                    .iter()
                    .enumerate()
                    .map(|(i, p)| PolicyStats {
                        policy: p.policy.clone(),
                        seeds: p.runs.iter().map(|r| r.seed).collect(),
                        metrics: ranked()
                            .map(|m| MetricStats::of(m, interval(p, m)))
                            .collect(),
                        runs: p.runs.clone(),
                        vs_baseline: match sc.baseline_policy() {
                            Some(b) if i != sc.baseline => {
                                ranked().map(|m| paired_diff(p, b, m)).collect()
                            }
                            _ => Vec::new(),
                        },
                    })
                    .collect(),
                winners: ranked().filter_map(|m| winner(sc, m)).collect(),
                baseline: sc.baseline_policy().map(|b| b.policy.clone()),
                seeds_run: sc.seeds_run(),
                seed_stop: sc.seed_stop,
                auto_seeds: sc.auto_seeds.map(AutoSeedsRule::from),
                seed_meaning: sc.seed_meaning.0.clone(),
                out_of_sample: sc.out_of_sample.clone(),
            })
            .collect(),
    }
}

/// Write every output of `routelab compare` into `dir`: `compare.json`, `compare.csv` (one row
/// per scenario, policy and metric: n, mean, sd, 95 % interval, winner, and the paired
/// difference from the baseline with its interval and verdict), `compare_seeds.csv`
/// (one row per scenario, policy and seed), per scenario a bar chart with error bars
/// (`compare_<k>_<scenario>_bars`) and an end-to-end CDF of the first seed
/// (`compare_<k>_<scenario>_e2e_cdf`), each as `.svg` and `.png`, and `report.html`.
pub fn write_compare(dir: &Path, scenarios: &[ScenarioComparison]) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let mut out = Written::default();
    let file = compare_file(scenarios);

    let p = dir.join("compare.json");
    write_json(&p, &file)?;
    out.files.push(p);

    let p = dir.join("compare.csv");
    let mut rows = Vec::new();
    for (sc, st) in scenarios.iter().zip(&file.scenarios) {
        for ps in &st.policies {
            for (m, ms) in ranked().zip(&ps.metrics) {
                let is_winner = st
                    .winners
                    .iter()
                    .any(|w| w.metric == m.name && w.winner == ps.policy && !w.tie);
                let o = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
                let d = ps.vs_baseline.iter().find(|d| d.metric == m.name);
                rows.push(vec![
                    sc.scenario.clone(),
                    ps.policy.clone(),
                    m.name.to_string(),
                    m.unit.as_str().to_string(),
                    m.direction.as_str().to_string(),
                    ms.n.to_string(),
                    o(ms.mean),
                    o(ms.sd),
                    o(ms.ci95_low),
                    o(ms.ci95_high),
                    is_winner.to_string(),
                    st.baseline.clone().unwrap_or_default(),
                    o(d.and_then(|d| d.mean)),
                    o(d.and_then(|d| d.ci95_low)),
                    o(d.and_then(|d| d.ci95_high)),
                    d.map(|d| d.verdict.as_str().to_string())
                        .unwrap_or_default(),
                ]);
            }
        }
    }
    write_csv(
        &p,
        &[
            "scenario",
            "policy",
            "metric",
            "unit",
            "better",
            "n",
            "mean",
            "sd",
            "ci95_low",
            "ci95_high",
            "winner",
            "baseline",
            "vs_baseline_mean",
            "vs_baseline_ci95_low",
            "vs_baseline_ci95_high",
            "vs_baseline_verdict",
        ],
        rows,
    )?;
    out.files.push(p);

    let p = dir.join("compare_seeds.csv");
    let mut header = vec!["scenario", "policy", "seed"];
    header.extend(summary_csv_header());
    let rows = scenarios.iter().flat_map(|sc| {
        sc.policies.iter().flat_map(move |p| {
            p.runs.iter().map(move |r| {
                let mut row = vec![sc.scenario.clone(), p.policy.clone(), r.seed.to_string()];
                row.extend(r.summary.csv_fields());
                row
            })
        })
    });
    write_csv(&p, &header, rows)?;
    out.files.push(p);

    let mut charts = Vec::new();
    for (k, sc) in scenarios.iter().enumerate() {
        let base = format!("compare_{}_{}", k + 1, slug(&sc.scenario));
        let bars = chart::render(&bars_figure(sc), dir, &format!("{base}_bars"))?;
        let cdf = chart::render(&cdf_figure(sc), dir, &format!("{base}_e2e_cdf"))?;
        for r in [&bars, &cdf] {
            out.files.push(r.svg_path.clone());
            out.files.push(r.png_path.clone());
        }
        charts.push((bars, cdf));
    }

    let p = dir.join("report.html");
    write_file(&p, compare_html(scenarios, &file, &charts))?;
    out.files.push(p);
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::holdout::Holds;

    pub(crate) fn summary(policy: &str, e2e: f64, tok: f64) -> RunSummary {
        let mut s = RunSummary::from_metrics(&RunMetrics::new(policy, vec![]));
        for m in crate::metric::CATALOG {
            let v = match m.name {
                "requests" | "completed" => Some(10.0),
                "output_tokens" => Some(100.0),
                "output_tok_s" => Some(tok),
                "span_s" => Some(10.0),
                "slo_attainment" => Some(1.0),
                n if n.starts_with("queue_") => None,
                n if n.ends_with("_p99_s") || n.ends_with("_max_s") => Some(e2e * 2.0),
                n if n.ends_with("_s") && !n.starts_with("probe") => Some(e2e),
                _ => Some(0.0),
            };
            s.set(m, v);
        }
        s
    }

    pub(crate) fn comparison() -> ScenarioComparison {
        let mk = |name: &str, e2e: [f64; 3], tok: f64| PolicySeeds {
            policy: name.into(),
            role: PolicyRole::Ours,
            runs: e2e
                .iter()
                .enumerate()
                .map(|(i, e)| SeedRun {
                    seed: i as u64 + 1,
                    summary: summary(name, *e, tok),
                })
                .collect(),
            first_seed_e2e: None,
        };
        ScenarioComparison::new(
            "test/two",
            "two policies",
            vec![
                mk("slow", [2.0, 2.2, 2.4], 100.0),
                mk("fast", [1.0, 1.1, 1.2], 150.0),
            ],
        )
    }

    fn policy(name: &str, e2e: &[f64]) -> PolicySeeds {
        PolicySeeds {
            policy: name.into(),
            role: PolicyConfig::from_name(name).map_or(PolicyRole::Ours, |c| c.role()),
            runs: e2e
                .iter()
                .enumerate()
                .map(|(i, e)| SeedRun {
                    seed: i as u64 + 1,
                    summary: summary(name, *e, 100.0),
                })
                .collect(),
            first_seed_e2e: None,
        }
    }

    /// The check itself is the lab's (`routelab_lab::holdout`); its outcome is shown by the
    /// console table and the findings.
    #[test]
    fn an_out_of_sample_check_is_shown_in_the_table_and_the_findings() {
        let in_sample = comparison();
        let o = OutOfSample {
            held_out: crate::holdout::held_out_text(0.3),
            criterion: "lowest e2e mean".into(),
            winner: "fast".into(),
            best_held_out: "slow".into(),
            holds: Holds::Tied,
            detail: "e2e mean 1.67 s against 1.70 s for `fast`, paired -2.0% [-90, +86]".into(),
        };
        let mut with = in_sample.clone();
        with.out_of_sample = Some(o);
        with.seed_meaning = ("A seed: …".into(), "trace resampled (60 s blocks)".into());
        let table = compare_table(std::slice::from_ref(&with));
        assert!(
            table.contains("\nA seed: …\nOut of sample (the last 30 %"),
            "{table}"
        );
        let md = findings_document(&["test/two"], "3 seeds", &[with], &[]);
        assert!(
            md.contains("| test/two | slow | 3 | fixed count | trace resampled (60 s blocks) |"),
            "{md}"
        );
        assert!(
            md.contains("| test/two | fast | slow | not established: "),
            "{md}"
        );
    }

    /// The opening sentence of a comparison, through `compare_file`'s winners as the report
    /// gets it.
    fn headline_of(sc: &ScenarioComparison) -> String {
        let file = compare_file(std::slice::from_ref(sc));
        let m = headline_metric();
        headline(
            file.scenarios[0]
                .winners
                .iter()
                .find(|w| w.metric == m.name),
            m,
        )
    }

    #[test]
    fn the_headline_names_an_established_win_with_its_paired_interval() {
        // steady is 0.1 s faster than base on every seed: the paired interval excludes 0.
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("base", &[1.0, 2.0, 3.0]),
                policy("steady", &[0.9, 1.9, 2.9]),
            ],
        );
        let s = headline_of(&sc);
        assert!(
            s.starts_with("steady wins on e2e mean (lowest is best): "),
            "{s}"
        );
        assert!(
            s.contains("1.90 s against 2.00 s for the runner-up base"),
            "{s}"
        );
        // −0.1 s of base's 2 s mean: −5 %, with no spread across seeds.
        assert!(
            s.contains("a paired difference of -5.0% [-5.0, -5.0]"),
            "{s}"
        );
        assert!(s.ends_with("(95 % interval, 3 seeds)."), "{s}");
    }

    #[test]
    fn an_oracle_winner_is_called_an_upper_bound_not_a_policy_to_ship() {
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("seed-v3", &[1.0, 2.0, 3.0]),
                policy("oracle/sed/capacity/weighted:24", &[0.9, 1.9, 2.9]),
            ],
        );
        let s = headline_of(&sc);
        assert!(s.starts_with("oracle/sed/capacity/weighted:24 wins"), "{s}");
        assert!(s.ends_with("not a policy a gateway can deploy."), "{s}");
        // A deployable winner carries no such note.
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("seed-v1", &[1.0, 2.0, 3.0]),
                policy("seed-v3", &[0.9, 1.9, 2.9]),
            ],
        );
        assert!(!headline_of(&sc).contains("Oracle"));
    }

    /// Regression (issue 28): the note read the winner's *name* back as a preset, so a YAML
    /// policy with a name of its own over oracle weights was presented as deployable.
    #[test]
    fn a_self_named_oracle_winner_still_gets_the_note_its_config_calls_for() {
        let named = |name: &str, role: PolicyRole, e2e: &[f64]| PolicySeeds {
            policy: name.into(),
            role,
            ..policy(name, e2e)
        };
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("seed-v3", &[1.0, 2.0, 3.0]),
                named("our-upper-bound", PolicyRole::Oracle, &[0.9, 1.9, 2.9]),
            ],
        );
        let s = headline_of(&sc);
        assert!(s.starts_with("our-upper-bound wins"), "{s}");
        assert!(s.ends_with("not a policy a gateway can deploy."), "{s}");
        // And a name that looks like the oracle's says nothing when the config is not one.
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("seed-v3", &[1.0, 2.0, 3.0]),
                named("oracle/p2c", PolicyRole::Ours, &[0.9, 1.9, 2.9]),
            ],
        );
        assert!(!headline_of(&sc).contains("Oracle"));
    }

    #[test]
    fn the_headline_says_tied_when_the_interval_includes_zero() {
        // noisy is faster on average but slower on one seed: the interval includes 0.
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![
                policy("base", &[1.0, 2.0, 3.0]),
                policy("noisy", &[0.8, 2.3, 2.75]),
            ],
        );
        let s = headline_of(&sc);
        assert!(
            s.starts_with("noisy and base are tied on e2e mean ("),
            "{s}"
        );
        assert!(s.contains("(95 % interval, 3 seeds) includes 0."), "{s}");
        assert!(!s.contains("wins"), "{s}");
        // Identical means are a tie too.
        let same = ScenarioComparison::new(
            "t",
            "",
            vec![policy("a", &[1.0, 2.0]), policy("b", &[1.0, 2.0])],
        );
        assert!(headline_of(&same).starts_with("a and b are tied on e2e mean"));
    }

    #[test]
    fn the_headline_of_one_seed_names_the_best_and_asks_for_compare() {
        let sc = ScenarioComparison::new(
            "t",
            "",
            vec![policy("slow", &[2.0]), policy("fast", &[1.5])],
        );
        let s = headline_of(&sc);
        assert!(
            s.starts_with("fast has the lowest e2e mean (1.50 s against 2.00 s for the runner-up slow), on one seed only"),
            "{s}"
        );
        assert!(s.contains("one seed gives no interval"), "{s}");
        assert!(s.contains("run routelab compare with several seeds"), "{s}");
        // One policy: nothing to compare; no policy with a value: no winner.
        let alone = ScenarioComparison::new("t", "", vec![policy("only", &[1.0])]);
        assert_eq!(
            headline_of(&alone),
            "only is the only policy (e2e mean 1.00 s): there is nothing to compare it with."
        );
        assert_eq!(
            headline(None, headline_metric()),
            "No policy has a value for e2e mean, so there is no winner on it."
        );
    }

    /// Seed noise (1, 2, 3 s) shared by every policy: `steady` is 0.1 s faster than the
    /// baseline on every seed, `noisy` is faster on average but not on every seed.
    fn paired_case() -> ScenarioComparison {
        ScenarioComparison::new(
            "test/paired",
            "shared seed noise",
            vec![
                policy("base", &[1.0, 2.0, 3.0]),
                policy("steady", &[0.9, 1.9, 2.9]),
                policy("noisy", &[0.8, 2.3, 2.75]),
            ],
        )
    }

    #[test]
    fn a_win_is_established_only_under_the_paired_rule() {
        let f = compare_file(&[paired_case()]);
        let st = &f.scenarios[0];
        assert_eq!(st.baseline.as_deref(), Some("base"));
        assert!(
            st.policies[0].vs_baseline.is_empty(),
            "no row against itself"
        );
        let d = |p: usize, m: &str| {
            st.policies[p]
                .vs_baseline
                .iter()
                .find(|d| d.metric == m)
                .unwrap()
                .clone()
        };
        let steady = d(1, "e2e_mean_s");
        assert_eq!(steady.n, 3);
        assert_eq!(steady.mean, Some(-0.1));
        assert!(steady.established);
        assert_eq!(steady.verdict, Verdict::Better, "lower latency is better");
        assert_eq!(steady.reference_mean, Some(2.0));
        assert_eq!(steady.relative_pct, Some(-5.0));
        // Throughput is identical on every seed: a zero-width interval at 0 establishes nothing.
        assert_eq!(d(1, "output_tok_s").verdict, Verdict::NotEstablished);
        // Faster on average (-0.05 s) but slower on one seed: not established.
        let noisy = d(2, "e2e_mean_s");
        assert!((noisy.mean.unwrap() + 0.05).abs() < 1e-9);
        assert!(!noisy.established);
        assert_eq!(noisy.verdict, Verdict::NotEstablished);
        assert!(noisy.ci95_low.unwrap() < 0.0 && noisy.ci95_high.unwrap() > 0.0);
        // The winner on mean e2e: its own interval overlaps the runner-up's, yet the paired
        // rule establishes the win.
        let w = st
            .winners
            .iter()
            .find(|w| w.metric == "e2e_mean_s")
            .unwrap();
        assert_eq!(w.winner, "steady");
        assert_eq!(w.runner_up.as_deref(), Some("noisy"));
        assert_eq!(w.intervals_overlap, Some(true));
        let p = w.paired.as_ref().unwrap();
        assert!(
            !p.established,
            "steady vs noisy: +0.1, -0.4, +0.15 per seed"
        );
        // Against the baseline, which is only the third best, it is.
        let mut two = paired_case();
        two.policies.remove(2);
        let f = compare_file(&[two]);
        let w = f.scenarios[0]
            .winners
            .iter()
            .find(|w| w.metric == "e2e_mean_s")
            .unwrap();
        assert_eq!(w.intervals_overlap, Some(true));
        assert!(w.paired.as_ref().unwrap().established);
        assert_eq!(w.paired.as_ref().unwrap().verdict, Verdict::Better);
        // An explicit baseline: differences are taken against it.
        let mut other = paired_case();
        other.baseline = 1;
        let f = compare_file(&[other]);
        let st = &f.scenarios[0];
        assert_eq!(st.baseline.as_deref(), Some("steady"));
        let back = st.policies[0]
            .vs_baseline
            .iter()
            .find(|d| d.metric == "e2e_mean_s")
            .unwrap();
        assert_eq!((back.mean, back.verdict), (Some(0.1), Verdict::Worse));
        assert!(st.policies[1].vs_baseline.is_empty());
    }

    #[test]
    fn paired_outputs_say_established_and_how_many_seeds() {
        let sc = paired_case();
        let table = compare_table(std::slice::from_ref(&sc));
        assert!(table.contains("seeds: 3 seeds (fixed count)"), "{table}");
        assert!(table.contains("vs baseline base:"), "{table}");
        // steady: -5.0 % of the baseline's 2 s mean, zero width, established.
        assert!(table.contains("-5.0% [-5.0, -5.0]!"), "{table}");
        let md = findings_markdown(std::slice::from_ref(&sc));
        assert!(
            md.contains("| paired difference [95 %] | established |"),
            "{md}"
        );
        let base = findings_baseline_markdown(std::slice::from_ref(&sc));
        assert!(
            base.contains("| test/paired | steady | base | TTFT mean -5.0%,"),
            "{base}"
        );
        assert!(
            base.contains("| test/paired | noisy | base | - |"),
            "{base}"
        );
        let doc = findings_document(
            &["test/paired"],
            "3 seeds each",
            std::slice::from_ref(&sc),
            &["## Capacity\n\nlater".to_string()],
        );
        assert!(
            doc.contains("| test/paired | base | 3 | fixed count |"),
            "{doc}"
        );
        assert!(doc.contains("**established** only when that paired interval excludes zero"));
        assert!(doc.ends_with("\n## Capacity\n\nlater\n"), "{doc}");
    }

    /// `± 0` is explained from the runs: a scenario whose seeds all gave identical results
    /// says it has no random component; one where only some figures never vary says just that;
    /// one seed (no interval at all) or real spread says nothing.
    #[test]
    fn zero_spread_is_explained_from_the_data() {
        let identical = ScenarioComparison::new(
            "test/fixed",
            "no randomness",
            vec![policy("a", &[2.0, 2.0, 2.0]), policy("b", &[1.0, 1.0, 1.0])],
        );
        let t = compare_table(&[identical]);
        assert!(t.contains("2.00 ± 0 "), "{t}");
        assert!(
            t.contains(
                "± 0: every seed gave identical results for every policy and metric (3 seeds): \
                 nothing in this scenario depends on the seed"
            ),
            "{t}"
        );
        // Latencies vary with the seed, the failure count (0 on every seed) does not.
        let t = compare_table(&[comparison()]);
        assert!(t.contains("0 ± 0"), "{t}");
        assert!(
            t.contains(
                "± 0 (output tok/s, SLO attainment, probe GPU-s, failed, rejected): every seed gave \
                 that policy the same value"
            ),
            "{t}"
        );
        assert!(!t.contains("identical results"), "{t}");
        let one = ScenarioComparison::new("test/one", "one seed", vec![policy("a", &[2.0])]);
        let t = compare_table(&[one]);
        assert!(!t.contains("± 0"), "{t}");
    }

    #[test]
    fn winners_and_margins() {
        let f = compare_file(&[comparison()]);
        let st = &f.scenarios[0];
        let w = st
            .winners
            .iter()
            .find(|w| w.metric == "e2e_mean_s")
            .unwrap();
        assert_eq!(w.winner, "fast");
        assert_eq!(w.runner_up.as_deref(), Some("slow"));
        // (2.2 - 1.1) / 2.2 = 50 %.
        assert_eq!(w.margin_pct, Some(50.0));
        assert_eq!(w.intervals_overlap, Some(false));
        let t = st
            .winners
            .iter()
            .find(|w| w.metric == "output_tok_s")
            .unwrap();
        assert_eq!(t.winner, "fast");
        assert_eq!(t.margin_pct, Some(50.0));
        let tie = st.winners.iter().find(|w| w.metric == "failed").unwrap();
        assert!(tie.tie);
        assert_eq!(tie.winner, "slow", "ties keep input order");
        let ms = &st.policies[1].metrics[3];
        assert_eq!(ms.metric, "e2e_mean_s");
        assert_eq!((ms.n, ms.mean), (3, Some(1.1)));
        assert!(ms.ci95_low.unwrap() < 1.1 && ms.ci95_high.unwrap() > 1.1);
    }

    #[test]
    fn findings_table_lists_untied_winners() {
        let doc = findings_document(&["test/two"], "3 seeds each", &[comparison()], &[]);
        assert!(doc.starts_with(
            "# Findings\n\nGenerated by `routelab compare` over `test/two` with 3 seeds each;"
        ));
        let md = findings_markdown(&[comparison()]);
        assert!(md.starts_with("| scenario | metric | winner | runner-up | margin % |"));
        assert!(
            md.contains(
                "| test/two | e2e mean (s) | fast (1.10) | slow (2.20) | 50.0 | -50.0% [-61.3, -38.7] | yes |"
            ),
            "{md}"
        );
        assert!(!md.contains("| failed"), "ties are left out:\n{md}");
        let table = compare_table(&[comparison()]);
        assert!(table.contains("fast"));
        assert!(table.contains("1.10 ± 0.25*"), "{table}");
        // Issue 41: which question the ranking answers, and where the other is answered.
        assert!(
            table.contains("`compare` ranks the policies at the scenario's own load")
                && table.contains("`routelab capacity` asks how much load"),
            "{table}"
        );
    }

    /// Issue 41: the console says which SLO the attainment column counts against.
    #[test]
    fn the_console_names_the_slo_of_its_attainment_column() {
        let mut c = comparison();
        assert!(!compare_table(std::slice::from_ref(&c)).contains("SLO column"));
        c.slo = Some(routelab_sim::Slo {
            ttft_s: 30.0,
            tpot_s: 0.1,
            e2e_s: None,
        });
        let t = compare_table(&[c]);
        assert!(
            t.contains(
                "SLO column: the share of requests that meet TTFT ≤ 30 s and TPOT ≤ 0.1 s per \
                 request (the scenario's `slo`)."
            ),
            "{t}"
        );
    }
}
