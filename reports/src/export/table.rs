//! Aligned plain-text tables for the terminal.

use super::Exporter;
use crate::gate::{GateReport, fmt_delta, fmt6};
use std::io::{self, Write};

/// A plain-text table: left-aligned text columns, right-aligned numbers.
pub(crate) struct TextTable {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl TextTable {
    /// Columns as (name, right-aligned).
    pub fn new(cols: &[(&str, bool)]) -> TextTable {
        TextTable {
            header: cols.iter().map(|c| c.0.to_string()).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, (w, right)) in width.iter().zip(&self.right).enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if *right {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < n {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        let total: usize = width.iter().sum::<usize>() + 2 * n.saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns() {
        let mut t = TextTable::new(&[("policy", false), ("n", true)]);
        t.row(vec!["a".into(), "100".into()]);
        t.row(vec!["long-name".into(), "2".into()]);
        assert_eq!(
            t.render(),
            "policy       n\n--------------\na          100\nlong-name    2\n"
        );
    }
}

/// The plain-text exporter: every comparison and invariant (`check --verbose`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Table;

/// The short plain-text exporter (`check` by default): only what fails the gate, then the
/// one-line verdict.
#[derive(Debug, Clone, Copy, Default)]
pub struct Failures;

impl Exporter<GateReport> for Failures {
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(report.failures().as_bytes())
    }
}

impl Exporter<GateReport> for Table {
    /// One aligned line per comparison (numbers right-aligned), then the invariants.
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        let header = [
            "scenario", "policy", "metric", "baseline", "current", "delta", "tol", "status",
        ];
        let cells: Vec<[String; 8]> = report
            .comparisons
            .iter()
            .map(|r| {
                [
                    r.scenario.clone(),
                    r.policy.clone(),
                    r.metric.clone(),
                    fmt6(r.baseline),
                    fmt6(r.current),
                    fmt_delta(r.delta_pct),
                    format!("{:.2}%", r.tolerance_pct),
                    r.status.as_str().to_string(),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for c in &cells {
            for (w, v) in width.iter_mut().zip(c) {
                *w = (*w).max(v.len());
            }
        }
        let line = |out: &mut dyn Write, c: &[String]| {
            let mut s = String::new();
            for (i, (v, w)) in c.iter().zip(width).enumerate() {
                if (3..=6).contains(&i) {
                    s.push_str(&format!("{v:>w$}  "));
                } else {
                    s.push_str(&format!("{v:<w$}  "));
                }
            }
            writeln!(out, "{}", s.trim_end())
        };
        line(out, &header.map(String::from))?;
        for c in &cells {
            line(out, c)?;
        }
        out.write_all(b"\ninvariants:\n")?;
        for i in &report.invariants {
            writeln!(
                out,
                "  [{}] {}: {} ({} vs {})",
                if i.holds { "ok" } else { "FAILED" },
                i.scenario,
                i.statement,
                i.left,
                i.right
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod gate_tests {
    use crate::export::{Format, tests::export};

    #[test]
    fn gate_table_aligns_numbers_right_and_lists_invariants() {
        let s = export(Format::Table);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "scenario  policy  metric      baseline    current    delta    tol  status"
        );
        assert_eq!(
            lines[2],
            "s/a       p|q     ttft_p99_s  0.500000          -        -  2.00%  REGRESSION"
        );
        assert!(
            s.ends_with("\ninvariants:\n  [FAILED] s/a: p is fast (p e2e_max_s = 1.000000 vs 2)\n")
        );
    }

    #[test]
    fn gate_failures_list_only_what_fails_then_the_verdict() {
        let mut out = Vec::new();
        Format::Table
            .gate_with(crate::export::Detail::Failures)
            .export(&crate::export::tests::report(), &mut out)
            .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s,
            "REGRESSION: scenario s/a policy p|q metric e2e_mean_s: 1.000000 -> 1.500000 (+50.00%, tolerance 2.00%)\n\
             REGRESSION: scenario s/a policy p|q metric ttft_p99_s: 0.500000 -> - (-, tolerance 2.00%)\n\
             INVARIANT FAILED: scenario s/a: p is fast (p e2e_max_s = 1.000000 vs 2)\n\
             NO BASELINE: scenario s/a policy p|q: 1 metric(s): completed\n\
             1 metric(s) have no baseline: run `routelab check --update` and commit baselines/\n\
             check FAILED: 3 comparison(s): 2 regression(s), 0 improvement(s), 1 without baseline; 1 invariant(s), 1 failed; `--verbose` prints every row\n"
        );
    }

    #[test]
    fn gate_failures_of_a_passing_report_is_one_line() {
        let mut report = crate::export::tests::report();
        for r in &mut report.comparisons {
            r.status = crate::gate::Verdict::Ok;
        }
        report.invariants[0].holds = true;
        let mut out = Vec::new();
        Format::Table
            .gate_with(crate::export::Detail::Failures)
            .export(&report, &mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "check passed: 3 comparison(s): 0 regression(s), 0 improvement(s), 0 without baseline; 1 invariant(s), 0 failed; `--verbose` prints every row\n"
        );
    }
}
