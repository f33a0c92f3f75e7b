//! Markdown: GitHub-flavoured tables.
//!
//! The gate's Markdown is meant for a pull-request comment, which GitHub cuts at 65,536
//! characters, so it is written to a budget ([`COMMENT_BUDGET`]) in order of importance: the
//! verdict, every failure (as many as fit), a per-scenario count of verdicts, the invariants,
//! and the full per-metric rows while they fit. Whatever does not fit is counted in an explicit
//! "omitted" line that points at `--format json`, which always holds everything.

use super::Exporter;
use crate::gate::{Comparison, GateReport, InvariantResult, fmt_delta, fmt6};
use std::io::{self, Write};

/// The Markdown exporter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Markdown;

/// Most characters of the gate's Markdown: under GitHub's 65,536-character limit on a comment,
/// with room for a heading or a note a CI script may wrap around it.
pub const COMMENT_BUDGET: usize = 60_000;

/// Escape a table cell.
pub(crate) fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Room kept back for the "omitted" notes of the sections (one each, each far shorter).
const NOTE_RESERVE: usize = 4 * 200;

/// A document that refuses text beyond its budget (in characters, as GitHub counts them).
struct Budgeted {
    text: String,
    chars: usize,
    budget: usize,
}

impl Budgeted {
    fn new(budget: usize) -> Budgeted {
        Budgeted {
            text: String::new(),
            chars: 0,
            budget,
        }
    }

    /// Append `s` whatever its length (short, bounded text: headings, notes).
    fn push(&mut self, s: &str) {
        self.chars += s.chars().count();
        self.text.push_str(s);
    }

    /// Whether `n` more characters fit with the notes' reserve kept back.
    fn fits(&self, n: usize) -> bool {
        self.chars + n + NOTE_RESERVE <= self.budget
    }

    /// A section: `head` (heading and table header) then `rows` while they fit; the rest are
    /// counted in a closing note. Returns how many rows were left out.
    fn section(&mut self, head: &str, rows: &[String], omitted: impl Fn(usize) -> String) -> usize {
        let first = rows.first().map_or(0, |r| r.chars().count());
        if !self.fits(head.chars().count() + first) {
            if !rows.is_empty() {
                self.push(&format!("\n{}\n", omitted(rows.len())));
            }
            return rows.len();
        }
        self.push(head);
        let mut shown = 0;
        for r in rows {
            let n = r.chars().count();
            if !self.fits(n) {
                break;
            }
            self.push(r);
            shown += 1;
        }
        let left = rows.len() - shown;
        if left > 0 {
            self.push(&format!("\n{}\n", omitted(left)));
        }
        left
    }
}

const COMPARISON_HEAD: &str = "| scenario | policy | metric | baseline | current | delta | tolerance | status |\n\
                               |---|---|---|---:|---:|---:|---:|---|\n";

fn comparison_row(r: &Comparison) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {:.2}% | {} |\n",
        cell(&r.scenario),
        cell(&r.policy),
        cell(&r.metric),
        fmt6(r.baseline),
        fmt6(r.current),
        fmt_delta(r.delta_pct),
        r.tolerance_pct,
        r.status.as_str()
    )
}

fn invariant_row(i: &InvariantResult) -> String {
    format!(
        "| {} | {} | {} | {} | {} |\n",
        cell(&i.scenario),
        cell(&i.statement),
        cell(&i.left),
        cell(&i.right),
        i.holds
    )
}

const INVARIANT_HEAD: &str =
    "| scenario | invariant | left | right | holds |\n|---|---|---|---|---|\n";

const FOR_ALL: &str = "run `routelab check --format json` for all";

/// The gate report as Markdown of at most `budget` characters.
pub(crate) fn gate_markdown(report: &GateReport, budget: usize) -> String {
    let mut doc = Budgeted::new(budget);
    doc.push(&format!(
        "## routelab check: {}\n\n{}\n",
        if report.passed() { "passed" } else { "FAILED" },
        report.counts_line()
    ));

    let failing: Vec<String> = report.failing().map(comparison_row).collect();
    let failed_invariants: Vec<String> = report
        .invariants
        .iter()
        .filter(|i| !i.holds)
        .map(invariant_row)
        .collect();
    if failing.is_empty() && failed_invariants.is_empty() {
        doc.push("\nNo failures.\n");
    }
    if !failing.is_empty() {
        doc.section(
            &format!("\n### Failures\n\n{COMPARISON_HEAD}"),
            &failing,
            |n| format!("{n} failing row(s) omitted; {FOR_ALL}"),
        );
    }
    if !failed_invariants.is_empty() {
        doc.section(
            &format!("\n### Failed invariants\n\n{INVARIANT_HEAD}"),
            &failed_invariants,
            |n| format!("{n} failed invariant(s) omitted; {FOR_ALL}"),
        );
    }

    let per_scenario: Vec<String> = report
        .scenario_counts()
        .iter()
        .map(|(s, c)| {
            format!(
                "| {} | {} | {} | {} | {} | {} | {} | {}/{} |\n",
                cell(s),
                if c.passed() { "passed" } else { "FAILED" },
                c.ok,
                c.improved,
                c.regressed,
                c.changed,
                c.no_baseline,
                c.failed_invariants,
                c.invariants
            )
        })
        .collect();
    doc.section(
        "\n### Per scenario\n\n| scenario | verdict | ok | improved | regressed | changed | no baseline | invariants failed |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
        &per_scenario,
        |n| format!("{n} scenario(s) omitted; {FOR_ALL}"),
    );

    let invariants: Vec<String> = report.invariants.iter().map(invariant_row).collect();
    doc.section(
        &format!("\n### Invariants\n\n{INVARIANT_HEAD}"),
        &invariants,
        |n| format!("{n} invariant(s) omitted; {FOR_ALL}"),
    );

    let rows: Vec<String> = report.comparisons.iter().map(comparison_row).collect();
    doc.section(
        &format!("\n### Every comparison\n\n{COMPARISON_HEAD}"),
        &rows,
        |n| format!("{n} rows omitted; {FOR_ALL}"),
    );
    doc.text
}

impl Exporter<GateReport> for Markdown {
    /// At most [`COMMENT_BUDGET`] characters: the verdict, failures first, then per-scenario
    /// counts, the invariants and every comparison while they fit.
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(gate_markdown(report, COMMENT_BUDGET).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Format, tests::export};
    use crate::gate::Verdict;

    fn count_of(s: &str, what: &str) -> usize {
        s.matches(what).count()
    }

    #[test]
    fn gate_markdown_puts_the_verdict_and_failures_first() {
        let s = export(Format::Markdown);
        assert!(
            s.starts_with("## routelab check: FAILED\n\n3 comparison(s): 2 regression(s), 0 improvement(s), 1 without baseline; 1 invariant(s), 1 failed\n"),
            "{s}"
        );
        let failures = s.find("### Failures").unwrap();
        let every = s.find("### Every comparison").unwrap();
        assert!(failures < every, "{s}");
        assert!(
            s.contains(
                "| s/a | p\\|q | e2e_mean_s | 1.000000 | 1.500000 | +50.00% | 2.00% | REGRESSION |"
            ),
            "{s}"
        );
        assert!(
            s.contains("| ttft_p99_s | 0.500000 | - | - | 2.00% | REGRESSION |"),
            "{s}"
        );
        // Three failing rows (two regressions, one without baseline), each listed twice:
        // among the failures and among every comparison.
        assert_eq!(count_of(&s, "| REGRESSION |"), 4, "{s}");
        assert_eq!(count_of(&s, "| no-baseline |"), 2, "{s}");
        assert!(
            s.contains("| s/a | FAILED | 0 | 0 | 2 | 0 | 1 | 1/1 |\n"),
            "per-scenario counts: {s}"
        );
        assert!(
            s.ends_with("| no-baseline |\n"),
            "nothing omitted, no note: {s}"
        );
        assert!(!s.contains("omitted"), "{s}");
    }

    /// Many failures on many scenarios: the document stays within budget, every section says
    /// how much it left out, and the omitted counts add up.
    #[test]
    fn gate_markdown_stays_within_budget_and_counts_what_it_left_out() {
        let mut report = GateReport::default();
        let failing = 5_000;
        for i in 0..failing {
            report.comparisons.push(Comparison {
                scenario: format!("scenario-{}", i / 50),
                policy: format!("policy-with-a-long-name-{}", i % 7),
                metric: format!("metric_{i}"),
                baseline: Some(1.0),
                current: Some(2.0),
                delta_pct: Some(100.0),
                tolerance_pct: 2.0,
                status: if i % 3 == 0 {
                    Verdict::NoBaseline
                } else {
                    Verdict::Regression
                },
            });
        }
        for i in 0..2_000 {
            report.comparisons.push(Comparison {
                scenario: "ok-scenario".into(),
                policy: "p".into(),
                metric: format!("m{i}"),
                baseline: Some(1.0),
                current: Some(1.0),
                delta_pct: Some(0.0),
                tolerance_pct: 2.0,
                status: Verdict::Ok,
            });
        }
        let s = gate_markdown(&report, COMMENT_BUDGET);
        let chars = s.chars().count();
        assert!(chars < COMMENT_BUDGET, "{chars} characters");
        assert!(
            chars > COMMENT_BUDGET - 2_000,
            "the budget is used: {chars}"
        );
        let shown_failing = count_of(&s, "| REGRESSION |") + count_of(&s, "| no-baseline |");
        let note = s
            .lines()
            .find(|l| {
                l.ends_with("failing row(s) omitted; run `routelab check --format json` for all")
            })
            .unwrap_or_else(|| panic!("a note on omitted failures: {s}"));
        let omitted: usize = note.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(shown_failing + omitted, failing, "{note}");
        // The full rows did not fit at all: said so, with the count and where to look.
        assert!(
            s.contains(&format!(
                "\n{} rows omitted; run `routelab check --format json` for all\n",
                failing + 2_000
            )),
            "{}",
            &s[s.len() - 600..]
        );
    }

    #[test]
    fn gate_markdown_without_failures_says_so_and_shows_rows_while_they_fit() {
        let mut report = crate::export::tests::report();
        for r in &mut report.comparisons {
            r.status = Verdict::Ok;
        }
        report.invariants[0].holds = true;
        let s = gate_markdown(&report, 1_500);
        assert!(s.starts_with("## routelab check: passed\n"), "{s}");
        assert!(s.contains("\nNo failures.\n"), "{s}");
        assert!(!s.contains("### Failures"), "{s}");
        assert!(s.chars().count() <= 1_500, "{}", s.chars().count());
        // A budget this small keeps the per-scenario counts but not every row.
        assert!(s.contains("| s/a | passed | 3 |"), "{s}");
        assert!(
            s.contains(" rows omitted; run `routelab check --format json` for all"),
            "{s}"
        );
    }
}
