//! CSV: a header row, then one row per record; missing values are empty cells.

use super::Exporter;
use super::write_file;
use crate::error::ReportError;
use crate::gate::{GateReport, fmt_delta, fmt6};
use std::io::{self, Write};
use std::path::Path;

/// The CSV exporter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Csv;

fn rows_to_bytes(
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> Result<Vec<u8>, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(header)?;
    for r in rows {
        w.write_record(&r)?;
    }
    w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// Write CSV rows (all strings) to `path`.
pub(crate) fn write_csv(
    path: &Path,
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> Result<(), ReportError> {
    let bytes = rows_to_bytes(header, rows).map_err(|source| ReportError::Csv {
        file: path.to_path_buf(),
        source,
    })?;
    write_file(path, bytes)
}

impl Exporter<GateReport> for Csv {
    /// One row per comparison (the invariants are in the other formats).
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        let blank = |s: String| if s == "-" { String::new() } else { s };
        let rows = report.comparisons.iter().map(|r| {
            vec![
                r.scenario.clone(),
                r.policy.clone(),
                r.metric.clone(),
                blank(fmt6(r.baseline)),
                blank(fmt6(r.current)),
                blank(fmt_delta(r.delta_pct)),
                format!("{:.2}%", r.tolerance_pct),
                r.status.as_str().to_string(),
            ]
        });
        let header = [
            "scenario",
            "policy",
            "metric",
            "baseline",
            "current",
            "delta",
            "tolerance",
            "status",
        ];
        let bytes = rows_to_bytes(&header, rows).map_err(io::Error::other)?;
        out.write_all(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use crate::export::{Format, tests::export};

    #[test]
    fn gate_csv_has_one_row_per_comparison() {
        let s = export(Format::Csv);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            "scenario,policy,metric,baseline,current,delta,tolerance,status"
        );
        assert_eq!(lines[2], "s/a,p|q,ttft_p99_s,0.500000,,,2.00%,REGRESSION");
    }
}
