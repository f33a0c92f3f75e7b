//! JSON: pretty-printed, one trailing newline.

use super::Exporter;
use super::write_file;
use crate::error::ReportError;
use crate::gate::GateReport;
use serde::Serialize;
use std::io::{self, Write};
use std::path::Path;

/// The JSON exporter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

/// Write `value` to `path` as pretty JSON with a final newline.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ReportError> {
    let mut s = serde_json::to_string_pretty(value).map_err(|source| ReportError::Json {
        file: path.to_path_buf(),
        source,
    })?;
    s.push('\n');
    write_file(path, s)
}

impl Exporter<GateReport> for Json {
    /// `{"comparisons": [...], "counts": {...}, "invariants": [...], "verdict": "passed" |
    /// "failed"}`: every row, whatever the console or Markdown left out. Built through
    /// `serde_json::Value`, whose objects keep keys sorted: the published key order of this
    /// document.
    fn export(&self, report: &GateReport, out: &mut dyn Write) -> io::Result<()> {
        let c = report.counts();
        let doc = serde_json::json!({
            "verdict": if report.passed() { "passed" } else { "failed" },
            "counts": {
                "comparisons": c.comparisons,
                "ok": c.ok,
                "changed": c.changed,
                "improved": c.improved,
                "regressions": c.regressed,
                "no_baseline": c.no_baseline,
                "invariants": c.invariants,
                "failed_invariants": c.failed_invariants,
            },
            "comparisons": report.comparisons,
            "invariants": report.invariants,
        });
        serde_json::to_writer_pretty(&mut *out, &doc)?;
        out.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use crate::export::{Format, tests::export};

    #[test]
    fn gate_json_parses_and_writes_missing_as_null() {
        let s = export(Format::Json);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let rows = v["comparisons"].as_array().unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["status"], "REGRESSION");
        assert!(rows[1]["current"].is_null());
        assert_eq!(rows[2]["status"], "no-baseline");
        assert_eq!(v["invariants"][0]["holds"], false);
        assert_eq!(v["verdict"], "failed");
        assert_eq!(v["counts"]["comparisons"], 3);
        assert_eq!(v["counts"]["regressions"], 2);
        assert_eq!(v["counts"]["no_baseline"], 1);
        assert_eq!(v["counts"]["failed_invariants"], 1);
        // Sorted keys: the order of the published document.
        assert!(s.contains("\"baseline\": 1.0,\n      \"current\": 1.5,\n      \"delta_pct\""));
    }
}
