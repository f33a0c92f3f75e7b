//! Outputs of `routelab sweep`: `sweep.csv` and a chart of key metrics against the first
//! parameter.

use crate::chart::{self, Figure, Legend, LinePanel, Panel, Series};
use crate::error::ReportError;
use crate::export::create_dir;
use crate::export::csv::write_csv;
use crate::export::table::TextTable;
use crate::metric::{view, views};
use crate::run::Written;
use crate::summary::{RunSummary, summary_csv_header};
use std::path::Path;

/// One point of a sweep: the parameter values (in the order of the parameter names), the
/// policy, and its summary.
pub type SweepRow = (Vec<String>, String, RunSummary);

fn check(dir: &Path, params: &[String], rows: &[SweepRow]) -> Result<(), ReportError> {
    if let Some((i, r)) = rows
        .iter()
        .enumerate()
        .find(|(_, r)| r.0.len() != params.len())
    {
        return Err(ReportError::Input {
            file: dir.join("sweep.csv"),
            message: format!(
                "row {i} has {} parameter values, expected {} ({})",
                r.0.len(),
                params.len(),
                params.join(", ")
            ),
        });
    }
    Ok(())
}

/// Write `sweep.csv` (parameters, policy, then every scalar metric; one row per input row, in
/// input order) and `sweep.svg` / `sweep.png`: mean end-to-end latency, p99 TTFT and output
/// throughput against the first parameter, one line per policy and combination of the other
/// parameters (repeated points, e.g. seeds, are averaged).
pub fn write_sweep(
    dir: &Path,
    params: &[String],
    rows: &[SweepRow],
) -> Result<Written, ReportError> {
    check(dir, params, rows)?;
    create_dir(dir)?;
    let mut out = Written::default();
    let p = dir.join("sweep.csv");
    let mut header: Vec<&str> = params.iter().map(String::as_str).collect();
    header.push("policy");
    header.extend(summary_csv_header());
    write_csv(
        &p,
        &header,
        rows.iter().map(|(vals, policy, s)| {
            let mut row = vals.clone();
            row.push(policy.clone());
            row.extend(s.csv_fields());
            row
        }),
    )?;
    out.files.push(p);
    let r = chart::render(&sweep_figure(params, rows), dir, "sweep")?;
    out.files.push(r.svg_path);
    out.files.push(r.png_path);
    Ok(out)
}

fn sweep_figure(params: &[String], rows: &[SweepRow]) -> Figure {
    let x_name = params.first().cloned().unwrap_or_else(|| "run".into());
    let xs: Vec<&str> = rows
        .iter()
        .map(|r| r.0.first().map_or("", String::as_str))
        .collect();
    let numeric: Option<Vec<f64>> = xs
        .iter()
        .map(|x| x.trim().parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect();
    // Categorical x: positions in order of first appearance.
    let mut cats: Vec<&str> = Vec::new();
    for x in &xs {
        if !cats.contains(x) {
            cats.push(x);
        }
    }
    let xpos: Vec<f64> = match &numeric {
        Some(v) => v.clone(),
        None => xs
            .iter()
            .map(|x| cats.iter().position(|c| c == x).unwrap_or(0) as f64)
            .collect(),
    };
    let log = numeric.as_ref().is_some_and(|v| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0f64, f64::max);
        lo > 0.0 && hi / lo >= 50.0
    });
    // Lines: policy + the other parameters, in order of first appearance.
    let key = |r: &SweepRow| {
        let others: Vec<String> = params
            .iter()
            .zip(&r.0)
            .skip(1)
            .map(|(p, v)| format!("{p}={v}"))
            .collect();
        if others.is_empty() {
            r.1.clone()
        } else {
            format!("{} ({})", r.1, others.join(", "))
        }
    };
    let mut lines: Vec<String> = Vec::new();
    for r in rows {
        let k = key(r);
        if !lines.contains(&k) {
            lines.push(k);
        }
    }
    let panels = views::SWEEP_CHART
        .iter()
        .map(|(k, title, unit)| {
            let m = view(k);
            let mut p = LinePanel::new(*title, &x_name, unit);
            p.markers = true;
            p.x_log = log;
            p.legend = Legend::None;
            if numeric.is_none() {
                p.x_ticks = Some(
                    cats.iter()
                        .enumerate()
                        .map(|(i, c)| (i as f64, c.to_string()))
                        .collect(),
                );
                p.x_range = Some((-0.5, cats.len() as f64 - 0.5));
            }
            p.series = lines
                .iter()
                .enumerate()
                .map(|(li, line)| {
                    // Average repeated x values, then sort by x.
                    let mut pts: Vec<(f64, f64, u32)> = Vec::new();
                    for (r, x) in rows.iter().zip(&xpos) {
                        if &key(r) != line {
                            continue;
                        }
                        let Some(v) = r.2.get(m) else { continue };
                        match pts.iter_mut().find(|p| p.0 == *x) {
                            Some(p) => {
                                p.1 += v;
                                p.2 += 1;
                            }
                            None => pts.push((*x, v, 1)),
                        }
                    }
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: line.clone(),
                        color: chart::color(li),
                        points: pts.iter().map(|p| (p.0, p.1 / f64::from(p.2))).collect(),
                    }
                })
                .collect();
            Panel::Lines(p)
        })
        .collect();
    let mut fig = Figure::new(format!("Sweep over {x_name}"), panels);
    fig.panel_height = 300;
    fig.legend = lines
        .iter()
        .enumerate()
        .take(24)
        .map(|(i, l)| (l.clone(), chart::color(i)))
        .collect();
    fig
}

/// An aligned plain-text table of a sweep: parameters, policy, key metrics.
pub fn sweep_table(params: &[String], rows: &[SweepRow]) -> String {
    let mut cols: Vec<(&str, bool)> = params.iter().map(|p| (p.as_str(), false)).collect();
    cols.push(("policy", false));
    cols.extend(views::SWEEP_TERMINAL.iter().map(|c| (c.1, true)));
    let mut t = TextTable::new(&cols);
    for (vals, policy, s) in rows {
        let mut row = vals.clone();
        row.resize(params.len(), String::new());
        row.push(policy.clone());
        row.extend(views::SWEEP_TERMINAL.iter().map(|(n, _)| {
            let m = view(n);
            m.fmt_value(s.get(m))
        }));
        t.row(row);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatched_rows_are_rejected_with_the_file() {
        let s = crate::compare::tests::summary("p", 1.0, 10.0);
        let rows = vec![(vec!["1".into()], "p".into(), s)];
        let err = check(Path::new("/x"), &["a".into(), "b".into()], &rows).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/x/sweep.csv") && msg.contains("expected 2"),
            "{msg}"
        );
    }
}
