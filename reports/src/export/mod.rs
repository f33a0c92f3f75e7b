//! Output formats, one module per format, behind one small interface: an [`Exporter`] writes a
//! report to a byte sink. `routelab check --format …` picks one with [`Format::gate`]; the run,
//! comparison and sweep writers use the same modules' helpers for their files.

pub mod csv;
pub(crate) mod html;
pub mod json;
pub mod markdown;
pub(crate) mod table;

use crate::error::ReportError;
use crate::gate::GateReport;
use std::io::{self, Write};
use std::path::Path;

/// Writes a report of type `R` in one format.
pub trait Exporter<R: ?Sized> {
    /// Write `report` to `out`.
    fn export(&self, report: &R, out: &mut dyn Write) -> io::Result<()>;
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// Aligned plain text for the terminal.
    Table,
    /// JSON.
    Json,
    /// Markdown tables.
    Markdown,
    /// CSV.
    Csv,
    /// A self-contained HTML page.
    Html,
}

impl Format {
    /// Every format with its name (as `--format` takes it), in the order help lists them.
    pub const ALL: [(&'static str, Format); 5] = [
        ("table", Format::Table),
        ("json", Format::Json),
        ("markdown", Format::Markdown),
        ("csv", Format::Csv),
        ("html", Format::Html),
    ];

    /// The names of [`Format::ALL`].
    pub const NAMES: [&'static str; 5] = {
        let mut names = [""; 5];
        let mut i = 0;
        while i < names.len() {
            names[i] = Format::ALL[i].0;
            i += 1;
        }
        names
    };

    /// Whether the output is a document a program parses (the verdict then goes elsewhere).
    pub fn is_document(self) -> bool {
        !matches!(self, Format::Table | Format::Markdown)
    }

    /// The exporter of a gate report in this format showing `detail`: only the table has a
    /// short form (failures and the verdict); Markdown is always written to its comment budget and
    /// the documents always hold everything.
    pub fn gate_with(self, detail: Detail) -> &'static dyn Exporter<GateReport> {
        match (self, detail) {
            (Format::Table, Detail::Failures) => &table::Failures,
            _ => self.gate(),
        }
    }

    /// The exporter of a gate report in this format, every row ([`Detail::Every`]).
    pub fn gate(self) -> &'static dyn Exporter<GateReport> {
        match self {
            Format::Table => &table::Table,
            Format::Json => &json::Json,
            Format::Markdown => &markdown::Markdown,
            Format::Csv => &csv::Csv,
            Format::Html => &html::Html,
        }
    }
}

/// How much of a gate report a console format shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Detail {
    /// What fails the gate and the one-line verdict.
    Failures,
    /// Every comparison and invariant.
    Every,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        Format::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, f)| *f)
            .ok_or_else(|| format!("unknown format `{s}`; valid: {}", Format::NAMES.join(", ")))
    }
}

/// Create `dir` and its parents, as a [`ReportError`] naming it when that fails.
pub fn create_dir(dir: &Path) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        dir: dir.to_path_buf(),
        source,
    })
}

/// Write `bytes` to `path`, as a [`ReportError`] naming it when that fails.
pub fn write_file(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), ReportError> {
    std::fs::write(path, bytes).map_err(|source| ReportError::Write {
        file: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gate::{Comparison, GateReport, InvariantResult, Verdict};

    /// A small report with a regression, a missing value and a failed invariant.
    pub(crate) fn report() -> GateReport {
        let row = |metric: &str, baseline, current, delta, status| Comparison {
            scenario: "s/a".into(),
            policy: "p|q".into(),
            metric: metric.into(),
            baseline,
            current,
            delta_pct: delta,
            tolerance_pct: 2.0,
            status,
        };
        GateReport {
            comparisons: vec![
                row(
                    "e2e_mean_s",
                    Some(1.0),
                    Some(1.5),
                    Some(50.0),
                    Verdict::Regression,
                ),
                row("ttft_p99_s", Some(0.5), None, None, Verdict::Regression),
                row("completed", None, Some(16.0), None, Verdict::NoBaseline),
            ],
            invariants: vec![InvariantResult {
                scenario: "s/a".into(),
                statement: "p is fast".into(),
                left: "p e2e_max_s = 1.000000".into(),
                right: "2".into(),
                holds: false,
            }],
        }
    }

    pub(crate) fn export(f: Format) -> String {
        let mut out = Vec::new();
        f.gate().export(&report(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }
}
