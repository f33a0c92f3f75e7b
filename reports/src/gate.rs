//! The gate's report: the verdict on every (scenario, policy, metric) against its baseline and
//! on every invariant, as plain data the exporters (`crate::export`) write in each format. The
//! gate that produces it (suite, baselines, measuring) is `routelab-lab`'s.

use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// The verdict on one (scenario, policy, metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Within tolerance.
    #[serde(rename = "ok")]
    Ok,
    /// Moved beyond tolerance, but the metric has no better direction.
    #[serde(rename = "changed")]
    Changed,
    /// Better by more than the tolerance.
    #[serde(rename = "improved")]
    Improved,
    /// Worse by more than the tolerance, or missing where the baseline had a value.
    #[serde(rename = "REGRESSION")]
    Regression,
    /// The baseline has no value for it (a new metric, policy or scenario).
    #[serde(rename = "no-baseline")]
    NoBaseline,
}

impl Verdict {
    /// As printed (`ok`, `changed`, `improved`, `REGRESSION`, `no-baseline`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Changed => "changed",
            Verdict::Improved => "improved",
            Verdict::Regression => "REGRESSION",
            Verdict::NoBaseline => "no-baseline",
        }
    }

    /// Every verdict.
    pub const ALL: [Verdict; 5] = [
        Verdict::Ok,
        Verdict::Changed,
        Verdict::Improved,
        Verdict::Regression,
        Verdict::NoBaseline,
    ];

    /// Whether this verdict fails the gate: a regression, or nothing to compare with.
    pub fn fails(self) -> bool {
        matches!(self, Verdict::Regression | Verdict::NoBaseline)
    }
}

/// How many comparisons got each verdict, and how many invariants were checked and failed
/// (for the whole report or one scenario).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerdictCounts {
    /// Comparisons.
    pub comparisons: usize,
    /// Within tolerance.
    pub ok: usize,
    /// Moved beyond tolerance on a metric without a better direction.
    pub changed: usize,
    /// Better beyond tolerance.
    pub improved: usize,
    /// Regressions.
    pub regressed: usize,
    /// Without baseline.
    pub no_baseline: usize,
    /// Invariants checked.
    pub invariants: usize,
    /// Invariants that do not hold.
    pub failed_invariants: usize,
}

impl VerdictCounts {
    fn add(&mut self, v: Verdict) {
        self.comparisons += 1;
        match v {
            Verdict::Ok => self.ok += 1,
            Verdict::Changed => self.changed += 1,
            Verdict::Improved => self.improved += 1,
            Verdict::Regression => self.regressed += 1,
            Verdict::NoBaseline => self.no_baseline += 1,
        }
    }

    fn add_invariant(&mut self, holds: bool) {
        self.invariants += 1;
        if !holds {
            self.failed_invariants += 1;
        }
    }

    /// Whether these counts pass the gate: no comparison whose verdict fails
    /// ([`Verdict::fails`]: a regression, or no baseline) and no failed invariant.
    pub fn passed(&self) -> bool {
        let failing = Verdict::ALL
            .into_iter()
            .filter(|v| v.fails())
            .map(|v| self.of(v))
            .sum::<usize>();
        failing + self.failed_invariants == 0
    }

    /// The comparisons that got `verdict`.
    pub fn of(&self, verdict: Verdict) -> usize {
        match verdict {
            Verdict::Ok => self.ok,
            Verdict::Changed => self.changed,
            Verdict::Improved => self.improved,
            Verdict::Regression => self.regressed,
            Verdict::NoBaseline => self.no_baseline,
        }
    }
}

/// One (scenario, policy, metric) against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Gate metric key.
    pub metric: String,
    /// Baseline mean over the seeds.
    pub baseline: Option<f64>,
    /// Current mean over the seeds (`None`: the run has no value).
    pub current: Option<f64>,
    /// Relative change, %.
    pub delta_pct: Option<f64>,
    /// Relative tolerance, %.
    pub tolerance_pct: f64,
    /// Verdict.
    pub status: Verdict,
}

/// One invariant on one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvariantResult {
    /// Scenario name.
    pub scenario: String,
    /// What it says.
    pub statement: String,
    /// Left side with its value.
    pub left: String,
    /// Right side with its value.
    pub right: String,
    /// Whether it holds (never when a side has no value).
    pub holds: bool,
}

/// What the gate found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GateReport {
    /// Every comparison, by scenario, policy and metric name.
    pub comparisons: Vec<Comparison>,
    /// Every invariant check, in suite order.
    pub invariants: Vec<InvariantResult>,
}

/// A value as the gate prints it.
pub fn fmt6(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.6}"))
}

/// A relative change as the gate prints it.
pub(crate) fn fmt_delta(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:+.2}%"))
}

/// `REGRESSION: scenario … policy … metric …: was -> now (delta, tolerance …)`.
pub(crate) fn regression_line(r: &Comparison) -> String {
    format!(
        "REGRESSION: scenario {} policy {} metric {}: {} -> {} ({}, tolerance {:.2}%)",
        r.scenario,
        r.policy,
        r.metric,
        fmt6(r.baseline),
        fmt6(r.current),
        fmt_delta(r.delta_pct),
        r.tolerance_pct
    )
}

/// `INVARIANT FAILED: scenario …: statement (left vs right)`.
pub(crate) fn invariant_line(i: &InvariantResult) -> String {
    format!(
        "INVARIANT FAILED: scenario {}: {} ({} vs {})",
        i.scenario, i.statement, i.left, i.right
    )
}

impl GateReport {
    fn count(&self, v: Verdict) -> usize {
        self.comparisons.iter().filter(|r| r.status == v).count()
    }

    /// Comparisons that regressed.
    pub fn regressions(&self) -> usize {
        self.count(Verdict::Regression)
    }

    /// Comparisons without a baseline.
    pub fn without_baseline(&self) -> usize {
        self.count(Verdict::NoBaseline)
    }

    /// Invariants that do not hold.
    pub fn failed_invariants(&self) -> usize {
        self.invariants.iter().filter(|i| !i.holds).count()
    }

    /// The gate passes: no regression, no failed invariant, every metric has a baseline
    /// ([`VerdictCounts::passed`], the one rule).
    pub fn passed(&self) -> bool {
        self.counts().passed()
    }

    /// Every count, over the whole report.
    pub fn counts(&self) -> VerdictCounts {
        let mut c = VerdictCounts::default();
        for r in &self.comparisons {
            c.add(r.status);
        }
        for i in &self.invariants {
            c.add_invariant(i.holds);
        }
        c
    }

    /// The counts of each scenario, in order of first appearance (comparisons, then the
    /// scenarios only invariants name).
    pub fn scenario_counts(&self) -> Vec<(&str, VerdictCounts)> {
        let mut out: Vec<(&str, VerdictCounts)> = Vec::new();
        fn entry<'a, 'b>(
            out: &'b mut Vec<(&'a str, VerdictCounts)>,
            scenario: &'a str,
        ) -> &'b mut VerdictCounts {
            // Rows come grouped by scenario, so the last entry is almost always the one.
            let i = match out.iter().rposition(|(s, _)| *s == scenario) {
                Some(i) => i,
                None => {
                    out.push((scenario, VerdictCounts::default()));
                    out.len() - 1
                }
            };
            &mut out[i].1
        }
        for r in &self.comparisons {
            entry(&mut out, &r.scenario).add(r.status);
        }
        for i in &self.invariants {
            entry(&mut out, &i.scenario).add_invariant(i.holds);
        }
        out
    }

    /// The comparisons that fail the gate (regressions and metrics without baseline), in
    /// report order.
    pub fn failing(&self) -> impl Iterator<Item = &Comparison> {
        self.comparisons.iter().filter(|r| r.status.fails())
    }

    /// `N comparison(s): … regression(s), … improvement(s), … without baseline; … invariant(s),
    /// … failed`.
    pub fn counts_line(&self) -> String {
        format!(
            "{} comparison(s): {} regression(s), {} improvement(s), {} without baseline; {} invariant(s), {} failed",
            self.comparisons.len(),
            self.regressions(),
            self.count(Verdict::Improved),
            self.without_baseline(),
            self.invariants.len(),
            self.failed_invariants()
        )
    }

    /// The one-line verdict of the short console output.
    pub fn verdict_line(&self) -> String {
        format!(
            "check {}: {}",
            if self.passed() { "passed" } else { "FAILED" },
            self.counts_line()
        )
    }

    /// The verdict for people: counts, then one line per regression and failed invariant.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "\n{}", self.counts_line());
        out.push_str(&self.regression_lines());
        out.push_str(&self.invariant_failures());
        out.push_str(&self.missing_note());
        out
    }

    /// One line per regression.
    fn regression_lines(&self) -> String {
        self.comparisons
            .iter()
            .filter(|r| r.status == Verdict::Regression)
            .map(|r| regression_line(r) + "\n")
            .collect()
    }

    /// One line per invariant that does not hold (`INVARIANT FAILED: scenario …`).
    pub fn invariant_failures(&self) -> String {
        self.invariants
            .iter()
            .filter(|i| !i.holds)
            .map(|i| invariant_line(i) + "\n")
            .collect()
    }

    /// What to do about metrics without baseline (empty when there are none).
    fn missing_note(&self) -> String {
        let missing = self.without_baseline();
        if missing == 0 {
            return String::new();
        }
        format!(
            "{missing} metric(s) have no baseline: run `routelab check --update` and commit baselines/\n"
        )
    }

    /// The short console output: one line per regression and failed invariant, one line per
    /// (scenario, policy) with metrics without baseline, then the one-line verdict.
    pub fn failures(&self) -> String {
        let mut out = self.regression_lines();
        out.push_str(&self.invariant_failures());
        // Metrics without baseline come by the dozen (a new scenario has every metric of every
        // policy missing): one line per scenario and policy, naming them.
        let mut missing: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for r in self
            .comparisons
            .iter()
            .filter(|r| r.status == Verdict::NoBaseline)
        {
            match missing.last_mut() {
                Some((s, p, m)) if *s == r.scenario && *p == r.policy => m.push(&r.metric),
                _ => missing.push((&r.scenario, &r.policy, vec![&r.metric])),
            }
        }
        for (s, p, m) in &missing {
            let _ = writeln!(
                out,
                "NO BASELINE: scenario {s} policy {p}: {} metric(s): {}",
                m.len(),
                m.join(", ")
            );
        }
        out.push_str(&self.missing_note());
        let _ = writeln!(out, "{}; `--verbose` prints every row", self.verdict_line());
        out
    }

    /// After `--update`: where the baselines went and every comparison that moved.
    pub fn update_note(&self, dir: &Path, scenarios: usize) -> String {
        let moved: Vec<&Comparison> = self
            .comparisons
            .iter()
            .filter(|r| r.status != Verdict::Ok)
            .collect();
        let mut out = format!(
            "\nbaselines updated in {} ({scenarios} scenario(s)); {} comparison(s) moved:\n",
            dir.display(),
            moved.len()
        );
        for r in moved {
            let _ = writeln!(
                out,
                "  {} / {} / {}: {} -> {} ({})",
                r.scenario,
                r.policy,
                r.metric,
                fmt6(r.baseline),
                fmt6(r.current),
                r.status.as_str()
            );
        }
        out
    }
}
