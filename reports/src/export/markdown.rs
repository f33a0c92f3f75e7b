//! Markdown: GitHub-flavoured tables.

use super::Exporter;
use crate::gate::{GateReport, fmt_delta, fmt6};
use std::io::{self, Write};

/// The Markdown exporter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Markdown;

/// Escape a table cell.
pub(crate) fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

impl Exporter<GateReport> for Markdown {
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(
            b"| scenario | policy | metric | baseline | current | delta | tolerance | status |\n\
              |---|---|---|---:|---:|---:|---:|---|\n",
        )?;
        for r in &report.comparisons {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.2}% | {} |",
                cell(&r.scenario),
                cell(&r.policy),
                cell(&r.metric),
                fmt6(r.baseline),
                fmt6(r.current),
                fmt_delta(r.delta_pct),
                r.tolerance_pct,
                r.status.as_str()
            )?;
        }
        out.write_all(
            b"\n| scenario | invariant | left | right | holds |\n|---|---|---|---|---|\n",
        )?;
        for i in &report.invariants {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                cell(&i.scenario),
                cell(&i.statement),
                cell(&i.left),
                cell(&i.right),
                i.holds
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::export::{Format, tests::export};

    #[test]
    fn gate_markdown_lists_comparisons_then_invariants() {
        let s = export(Format::Markdown);
        assert!(s.starts_with("| scenario | policy | metric | baseline |"));
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
        assert!(
            s.ends_with("| s/a | p is fast | p e2e_max_s = 1.000000 | 2 | false |\n"),
            "{s}"
        );
    }
}
