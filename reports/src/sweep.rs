//! Outputs of `routelab sweep`: `sweep.csv`, a chart of key metrics against the first
//! parameter, and `report.html`.
//!
//! Each (grid point, policy) may run on several seeds: the CSV and the tables then give the
//! mean and 95 % interval across them ([`crate::stats::Interval`], as `compare` does), the chart
//! the means, and `sweep_seeds.csv` every run. With one seed everywhere `sweep.csv` is one row
//! of plain values per point and policy.

use crate::chart::{self, Figure, Legend, LinePanel, Panel, Series};
use crate::compare::{MetricStats, PolicySeeds, interval};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, table};
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::interval_text;
use crate::metric::{CATALOG, Metric, view, views};
use crate::run::Written;
use crate::summary::summary_csv_header;
use std::path::Path;

/// One (grid point, policy) of a sweep: the parameter values (in the order of the parameter
/// names) and the policy's runs, one per seed.
#[derive(Debug, Clone)]
pub struct SweepRow {
    /// Parameter values, one per parameter name.
    pub values: Vec<String>,
    /// The policy and its runs.
    pub runs: PolicySeeds,
}

impl SweepRow {
    /// A point of `policy` without runs yet ([`PolicySeeds::push`] adds them).
    pub fn new(values: Vec<String>, policy: PolicySeeds) -> SweepRow {
        SweepRow {
            values,
            runs: policy,
        }
    }

    fn policy(&self) -> &str {
        &self.runs.policy
    }

    /// The metric's mean and 95 % interval across this point's seeds.
    fn interval(&self, m: &Metric) -> Option<crate::stats::Interval> {
        interval(&self.runs, m)
    }
}

/// Values whose largest is at least this many times their smallest (all positive: two decades
/// or more) are drawn on a logarithmic axis: a linear one would crush all but the top decade
/// into its bottom.
pub(crate) const LOG_AXIS_RATIO: f64 = 100.0;

/// Whether an axis over `values` should be logarithmic: every value finite and positive, and
/// the largest at least [`LOG_AXIS_RATIO`] times the smallest.
pub(crate) fn spans_decades(values: impl IntoIterator<Item = f64>) -> bool {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in values {
        if !(v.is_finite() && v > 0.0) {
            return false;
        }
        lo = lo.min(v);
        hi = hi.max(v);
    }
    lo.is_finite() && hi / lo >= LOG_AXIS_RATIO
}

fn check(dir: &Path, params: &[String], rows: &[SweepRow]) -> Result<(), ReportError> {
    let bad = |i: usize, message: String| ReportError::Input {
        file: dir.join("sweep.csv"),
        message: format!("row {i}: {message}"),
    };
    for (i, r) in rows.iter().enumerate() {
        if r.values.len() != params.len() {
            return Err(bad(
                i,
                format!(
                    "has {} parameter values, expected {} ({})",
                    r.values.len(),
                    params.len(),
                    params.join(", ")
                ),
            ));
        }
        if r.runs.runs.is_empty() {
            return Err(bad(i, format!("policy {} has no run", r.policy())));
        }
    }
    Ok(())
}

/// Whether any point ran on more than one seed (then the outputs carry intervals).
fn several_seeds(rows: &[SweepRow]) -> bool {
    rows.iter().any(|r| r.runs.runs.len() > 1)
}

/// The seeds of a sweep, as its outputs say it (`1 seed`, `3 seeds`).
fn seeds_label(rows: &[SweepRow]) -> String {
    let n = rows.iter().map(|r| r.runs.runs.len()).max().unwrap_or(0);
    if n == 1 {
        "1 seed".into()
    } else {
        format!("{n} seeds")
    }
}

fn csv_metrics() -> impl Iterator<Item = &'static Metric> {
    CATALOG.iter().filter(|m| m.csv)
}

/// Write `sweep.csv`, `sweep.svg` / `sweep.png` and `report.html` for a sweep of `scenario`.
///
/// `sweep.csv` has the parameters, the policy, then every scalar metric: with one seed per
/// point its value (one row per input row, in input order); with several, a `seeds` column and
/// per metric its mean across seeds and the 95 % interval (`<metric>_ci95_low`,
/// `<metric>_ci95_high`, empty with one value), and `sweep_seeds.csv` holds every run (one row
/// per point, policy and seed). The chart shows mean end-to-end latency, p99 TTFT and output
/// throughput against the first parameter, one line per policy and combination of the other
/// parameters, on logarithmic axes where the values are positive and span a factor of 100 or
/// more.
pub fn write_sweep(
    dir: &Path,
    scenario: &str,
    seed_meaning: &str,
    params: &[String],
    rows: &[SweepRow],
) -> Result<Written, ReportError> {
    check(dir, params, rows)?;
    create_dir(dir)?;
    let mut out = Written::default();
    let several = several_seeds(rows);
    let p = dir.join("sweep.csv");
    let mut header: Vec<String> = params.to_vec();
    header.push("policy".into());
    if several {
        header.push("seeds".into());
        for m in csv_metrics() {
            header.push(m.name.to_string());
            header.push(format!("{}_ci95_low", m.name));
            header.push(format!("{}_ci95_high", m.name));
        }
    } else {
        header.extend(summary_csv_header().into_iter().map(String::from));
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    write_csv(
        &p,
        &header,
        rows.iter().map(|r| {
            let mut row = r.values.clone();
            row.push(r.policy().to_string());
            if several {
                row.push(r.runs.runs.len().to_string());
                let o = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
                for m in csv_metrics() {
                    let st = MetricStats::of(m, r.interval(m));
                    row.extend([o(st.mean), o(st.ci95_low), o(st.ci95_high)]);
                }
            } else {
                row.extend(r.runs.runs[0].summary.csv_fields());
            }
            row
        }),
    )?;
    out.files.push(p);
    if several {
        let p = dir.join("sweep_seeds.csv");
        let mut header: Vec<&str> = params.iter().map(String::as_str).collect();
        header.extend(["policy", "seed"]);
        header.extend(summary_csv_header());
        write_csv(
            &p,
            &header,
            rows.iter().flat_map(|r| {
                r.runs.runs.iter().map(move |run| {
                    let mut row = r.values.clone();
                    row.push(r.policy().to_string());
                    row.push(run.seed.to_string());
                    row.extend(run.summary.csv_fields());
                    row
                })
            }),
        )?;
        out.files.push(p);
    }
    let rendered = chart::render(&sweep_figure(params, rows), dir, "sweep")?;
    out.files.push(rendered.svg_path.clone());
    out.files.push(rendered.png_path.clone());
    let p = dir.join("report.html");
    write_file(
        &p,
        sweep_html(scenario, seed_meaning, params, rows, &rendered.svg),
    )?;
    out.files.push(p);
    Ok(out)
}

fn sweep_figure(params: &[String], rows: &[SweepRow]) -> Figure {
    let x_name = params.first().cloned().unwrap_or_else(|| "run".into());
    let xs: Vec<&str> = rows
        .iter()
        .map(|r| r.values.first().map_or("", String::as_str))
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
    let x_log = numeric
        .as_ref()
        .is_some_and(|v| spans_decades(v.iter().copied()));
    // Lines: policy + the other parameters, in order of first appearance.
    let key = |r: &SweepRow| {
        let others: Vec<String> = params
            .iter()
            .zip(&r.values)
            .skip(1)
            .map(|(p, v)| format!("{p}={v}"))
            .collect();
        if others.is_empty() {
            r.policy().to_string()
        } else {
            format!("{} ({})", r.policy(), others.join(", "))
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
            p.x_log = x_log;
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
                    // Each point is its mean across seeds; repeated x values are averaged,
                    // then sorted by x.
                    let mut pts: Vec<(f64, f64, u32)> = Vec::new();
                    for (r, x) in rows.iter().zip(&xpos) {
                        if &key(r) != line {
                            continue;
                        }
                        let Some(v) = r.interval(m).map(|iv| iv.mean) else {
                            continue;
                        };
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
            p.y_log = spans_decades(p.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
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

/// The cells of one row of a sweep table: plain values with one seed, `mean ± half-width`
/// across seeds otherwise.
fn metric_cells(r: &SweepRow, several: bool) -> impl Iterator<Item = String> + '_ {
    views::SWEEP_TERMINAL.iter().map(move |(n, _)| {
        let m = view(n);
        if several {
            interval_text::metric_cell(m, r.interval(m))
        } else {
            m.fmt_value(r.runs.runs.first().and_then(|run| run.summary.get(m)))
        }
    })
}

/// An aligned plain-text table of a sweep: parameters, policy, key metrics (with several seeds,
/// `mean ± 95 % half-width` and a line saying so).
pub fn sweep_table(params: &[String], rows: &[SweepRow]) -> String {
    let several = several_seeds(rows);
    let mut cols: Vec<(&str, bool)> = params.iter().map(|p| (p.as_str(), false)).collect();
    cols.push(("policy", false));
    cols.extend(views::SWEEP_TERMINAL.iter().map(|c| (c.1, true)));
    let mut t = TextTable::new(&cols);
    for r in rows {
        let mut row = r.values.clone();
        row.resize(params.len(), String::new());
        row.push(r.policy().to_string());
        row.extend(metric_cells(r, several));
        t.row(row);
    }
    let mut out = t.render();
    if several {
        out.push_str(&format!(
            "mean ± 95 % half-width across {} (s, tok/s, %)\n",
            seeds_label(rows)
        ));
    }
    out
}

/// `report.html`: what was swept, the table, the chart.
fn sweep_html(
    scenario: &str,
    seed_meaning: &str,
    params: &[String],
    rows: &[SweepRow],
    svg: &str,
) -> String {
    let several = several_seeds(rows);
    let title = format!("routelab sweep: {scenario}");
    let mut page = Page::new(&title);
    page.el("h1", None, &title);
    let policies: Vec<&str> = rows.iter().fold(Vec::new(), |mut v, r| {
        if !v.contains(&r.policy()) {
            v.push(r.policy());
        }
        v
    });
    page.el(
        "p",
        Some("meta"),
        &format!(
            "parameters: {} · {} row(s) of grid point × policy · policies: {} · {} each",
            params.join(", "),
            rows.len(),
            policies.join(", "),
            seeds_label(rows)
        ),
    );
    if !seed_meaning.is_empty() {
        page.el("p", Some("meta"), seed_meaning);
    }
    page.el("h2", None, "Results");
    let mut header: Vec<(&str, bool)> = params.iter().map(|p| (p.as_str(), true)).collect();
    header.push(("policy", true));
    header.extend(
        views::SWEEP_TERMINAL
            .iter()
            .map(|(n, _)| (view(n).label, false)),
    );
    let body: Vec<(bool, Vec<Cell>)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            // A new group of rows starts where the first parameter changes.
            let group = i > 0 && rows[i - 1].values.first() != r.values.first();
            let mut cells: Vec<Cell> = r.values.iter().map(Cell::text).collect();
            cells.push(Cell::text(r.policy()));
            cells.extend(metric_cells(r, several).map(Cell::num));
            (group, cells)
        })
        .collect();
    page.raw(&table(&header, &body));
    page.el(
        "p",
        Some("note"),
        &format!(
            "Latencies in seconds; output tok/s from the first arrival to the last completion; \
             SLO: share of requests meeting both bounds.{} Every metric is in sweep.csv{}.",
            if several {
                " Each cell is the mean ± 95 % half-width across seeds."
            } else {
                ""
            },
            if several {
                " (means and 95 % intervals) and every run in sweep_seeds.csv"
            } else {
                ""
            }
        ),
    );
    page.el("h2", None, "Chart");
    page.figure(
        svg,
        &format!(
            "Key metrics against {}{}; an axis is logarithmic where its values span a factor of \
             {LOG_AXIS_RATIO} or more.",
            params.first().map_or("the run", String::as_str),
            if several { " (mean across seeds)" } else { "" }
        ),
    );
    page.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::SeedRun;
    use routelab_policies::PolicyRole;

    fn row(values: &[&str], policy: &str, e2e: &[f64]) -> SweepRow {
        let mut r = SweepRow::new(
            values.iter().map(|v| v.to_string()).collect(),
            PolicySeeds::new(policy, PolicyRole::Ours),
        );
        for (k, e) in e2e.iter().enumerate() {
            r.runs.runs.push(SeedRun {
                seed: 1 + k as u64,
                summary: crate::compare::tests::summary(policy, *e, 10.0),
            });
        }
        r
    }

    #[test]
    fn mismatched_rows_are_rejected_with_the_file() {
        let rows = vec![row(&["1"], "p", &[1.0])];
        let err = check(Path::new("/x"), &["a".into(), "b".into()], &rows).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/x/sweep.csv") && msg.contains("expected 2"),
            "{msg}"
        );
        let empty = vec![row(&["1"], "p", &[])];
        let msg = check(Path::new("/x"), &["a".into()], &empty)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("policy p has no run"), "{msg}");
    }

    #[test]
    fn an_axis_is_logarithmic_only_over_positive_values_spanning_two_decades() {
        assert!(spans_decades([0.5, 2.0, 51.0]));
        assert!(spans_decades([1e-3, 1.0]));
        assert!(
            spans_decades([4.0, 16.0, 64.0, 400.0]),
            "exactly 100 is two decades"
        );
        assert!(!spans_decades([1.0, 50.0, 99.0]));
        assert!(
            !spans_decades([0.0, 1.0, 1000.0]),
            "a zero has no logarithm"
        );
        assert!(!spans_decades([-1.0, 1000.0]));
        assert!(!spans_decades([1.0, f64::NAN, 1000.0]));
        assert!(!spans_decades([]), "no data");
        assert!(!spans_decades([5.0]));
    }

    #[test]
    fn the_chart_goes_logarithmic_where_the_data_spans_decades() {
        let params = vec!["rate".to_string()];
        // x from 1 to 1000; latency from 0.1 s to 100 s, throughput within a factor of 3.
        let rows: Vec<SweepRow> = [("1", 0.1), ("10", 1.0), ("1000", 100.0)]
            .iter()
            .map(|(x, e)| row(&[x], "p", &[*e, *e]))
            .collect();
        let fig = sweep_figure(&params, &rows);
        let logs: Vec<(String, bool, bool)> = fig
            .panels
            .iter()
            .map(|p| match p {
                Panel::Lines(l) => (l.title.clone(), l.x_log, l.y_log),
                Panel::Bars(_) => unreachable!("the sweep draws lines"),
            })
            .collect();
        assert_eq!(
            logs,
            vec![
                ("Mean end-to-end latency".to_string(), true, true),
                ("p99 time to first token".to_string(), true, true),
                ("Output throughput".to_string(), true, false),
            ]
        );
    }

    #[test]
    fn several_seeds_give_intervals_in_the_table() {
        let params = vec!["rate".to_string()];
        let one = vec![row(&["1"], "p", &[2.0])];
        let t = sweep_table(&params, &one);
        assert!(!t.contains('±'), "{t}");
        let three = vec![row(&["1"], "p", &[1.0, 2.0, 3.0])];
        let t = sweep_table(&params, &three);
        assert!(t.contains("2.00 ± 2.5"), "{t}");
        assert!(
            t.ends_with("mean ± 95 % half-width across 3 seeds (s, tok/s, %)\n"),
            "{t}"
        );
    }
}
