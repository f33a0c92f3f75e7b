//! Outputs of `routelab run`: `summary.json`, `requests.csv`, `timeline.csv`, charts (SVG and
//! PNG) and `report.html`, all byte-identical for identical inputs; `perf.json` for wall-clock
//! figures.

use crate::chart::{self, BarGroup, BarPanel, Figure, Legend, LinePanel, Panel, Series};
use crate::compare::{PolicySeeds, ScenarioComparison, headline, headline_metric, winner};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, best_indices, esc, split_table};
use crate::export::json::write_json;
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::metric::{Direction, share, view, views};
use crate::num::{fmt_fixed, fmt_pct, fmt_sig};
use crate::requests_csv::write_requests_csv;
use crate::summary::{ReplicaSummary, RunSummary, WorkerSummary};
use routelab_sim::{RequestRecord, RunMetrics, Scenario, Slo};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What was run: shown in the report and `summary.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMeta {
    /// Scenario name (`seed/sixteen-at-once`).
    pub scenario: String,
    /// Root seed of the run.
    pub seed: u64,
    /// One-line description of the scenario.
    pub description: String,
    /// The scenario file, as the user named it.
    pub scenario_path: String,
    /// The SLO bounds applied.
    pub slo: Slo,
    /// What the seed is (`Scenario::seed_meaning`; empty when the host does not say).
    pub seed_meaning: String,
}

impl RunMeta {
    /// From a loaded scenario and the seed actually used.
    pub fn from_scenario(scenario: &Scenario, seed: u64) -> RunMeta {
        RunMeta {
            scenario: scenario.name.clone(),
            seed,
            description: scenario.description.clone(),
            scenario_path: scenario.path.display().to_string(),
            slo: scenario.setup.slo,
            seed_meaning: String::new(),
        }
    }
}

/// One policy's run.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// Display name (usually `metrics.policy`).
    pub policy: String,
    /// What the simulator measured.
    pub metrics: RunMetrics,
    /// Per-request rows, when they were recorded.
    pub requests: Option<Vec<RequestRecord>>,
}

impl PolicyRun {
    /// Named after `metrics.policy`.
    pub fn new(metrics: RunMetrics, requests: Option<Vec<RequestRecord>>) -> PolicyRun {
        PolicyRun {
            policy: metrics.policy.clone(),
            metrics,
            requests,
        }
    }

    /// The scalar summary, under this run's display name.
    pub fn summary(&self) -> RunSummary {
        RunSummary::from_metrics(&self.metrics).with_policy(self.policy.clone())
    }
}

/// The files a writer produced, in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Paths (inside the output directory).
    pub files: Vec<PathBuf>,
}

impl Written {
    fn push(&mut self, p: PathBuf) {
        self.files.push(p);
    }
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryFile {
    /// Scenario name.
    pub scenario: String,
    /// Root seed.
    pub seed: u64,
    /// Scenario description.
    pub description: String,
    /// Scenario file.
    pub scenario_path: String,
    /// The per-request SLO bounds applied (SLO attainment and goodput are judged by them).
    pub slo: Slo,
    /// What the seed is: a trace replayed as recorded or resampled, and the warm-up a trace
    /// waits for (absent when the host does not say).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub seed_meaning: String,
    /// One entry per policy, in run order.
    pub runs: Vec<RunEntry>,
}

/// One policy in `summary.json`: the scalar summary and the per-worker rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEntry {
    /// Scalar metrics (flattened into the entry).
    #[serde(flatten)]
    pub summary: RunSummary,
    /// Per-worker totals, in fleet order.
    pub workers: Vec<WorkerSummary>,
    /// Scenario events that did not take effect (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Per gateway replica (absent with one gateway).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaSummary>,
}

/// Build the content of `summary.json`.
pub fn summary_file(meta: &RunMeta, runs: &[PolicyRun]) -> SummaryFile {
    SummaryFile {
        scenario: meta.scenario.clone(),
        seed: meta.seed,
        description: meta.description.clone(),
        scenario_path: meta.scenario_path.clone(),
        slo: meta.slo,
        seed_meaning: meta.seed_meaning.clone(),
        runs: runs
            .iter()
            .map(|r| RunEntry {
                summary: r.summary(),
                workers: WorkerSummary::from_metrics(&r.metrics),
                warnings: r.metrics.warning_lines(),
                replicas: ReplicaSummary::from_metrics(&r.metrics),
            })
            .collect(),
    }
}

/// Write every output of `routelab run` into `dir` (created if missing): `summary.json`,
/// `requests.csv`, `timeline.csv`, `ttft_cdf`, `e2e_cdf`, `share`, `weights` and `in_flight`
/// charts as `.svg` and `.png`, and `report.html`. Identical inputs give identical bytes.
///
/// `requests.csv` is written when some run carries its rows (`requests: Some`, possibly
/// empty); when none does, it is left alone: the rows were streamed to it while the
/// simulations ran ([`crate::RequestsCsvStream`]), or they were not asked for.
pub fn write_run(dir: &Path, meta: &RunMeta, runs: &[PolicyRun]) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let mut out = Written::default();

    let summary = summary_file(meta, runs);
    let p = dir.join("summary.json");
    write_json(&p, &summary)?;
    out.push(p);

    if runs.iter().any(|r| r.requests.is_some()) {
        let p = dir.join("requests.csv");
        write_requests_csv(&p, runs)?;
        out.push(p);
    }

    let p = dir.join("timeline.csv");
    write_csv(&p, TIMELINE_HEADER, timeline_rows(runs))?;
    out.push(p);

    let mut charts = Vec::new();
    for (stem, fig, caption) in run_figures(runs) {
        let r = chart::render(&fig, dir, stem)?;
        out.push(r.svg_path.clone());
        out.push(r.png_path.clone());
        charts.push((r, caption));
    }

    let p = dir.join("report.html");
    // Linked only when present: with `--no-requests` there is none.
    let has_requests = dir.join("requests.csv").is_file();
    write_file(&p, run_html(meta, runs, &summary, &charts, has_requests))?;
    out.push(p);
    Ok(out)
}

const TIMELINE_HEADER: &[&str] = &[
    "policy",
    "t_s",
    "worker",
    "in_flight",
    "running",
    "waiting",
    "weight",
    "provenance",
    "dispatched",
    "output_tokens",
];

fn timeline_rows(runs: &[PolicyRun]) -> impl Iterator<Item = Vec<String>> + '_ {
    runs.iter().flat_map(|r| {
        r.metrics.timeline.iter().map(move |t| {
            let name = r
                .metrics
                .workers
                .get(t.worker)
                .map_or_else(|| t.worker.to_string(), |w| w.name.clone());
            vec![
                r.policy.clone(),
                fmt_fixed(t.t_s, 3),
                name,
                t.in_flight.to_string(),
                t.running.to_string(),
                t.waiting.to_string(),
                fmt_fixed(t.weight, 4),
                t.provenance.as_str().to_string(),
                t.dispatched.to_string(),
                t.output_tokens.to_string(),
            ]
        })
    })
}

/// Most workers drawn in a share chart / a timeline chart (one small panel per worker: only
/// the busiest few, or the panels get too small to read).
const MAX_SHARE_WORKERS: usize = 32;
const MAX_LINE_WORKERS: usize = 8;
/// Most points per timeline series (longer series are bucketed).
const MAX_POINTS: usize = 600;

/// Indices of the `limit` workers with the most dispatches over all runs, in fleet order.
fn busiest_workers(runs: &[PolicyRun], limit: usize) -> Vec<usize> {
    let n = runs
        .iter()
        .map(|r| r.metrics.workers.len())
        .max()
        .unwrap_or(0);
    let mut idx: Vec<(u64, usize)> = (0..n)
        .map(|i| {
            let total = runs
                .iter()
                .filter_map(|r| r.metrics.workers.get(i))
                .map(|w| w.requests)
                .sum();
            (total, i)
        })
        .collect();
    idx.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut keep: Vec<usize> = idx.into_iter().take(limit).map(|p| p.1).collect();
    keep.sort_unstable();
    keep
}

fn worker_name(runs: &[PolicyRun], i: usize) -> String {
    runs.iter()
        .find_map(|r| r.metrics.workers.get(i).map(|w| w.name.clone()))
        .unwrap_or_else(|| format!("worker {i}"))
}

fn subset_note(shown: usize, total: usize) -> String {
    if shown < total {
        format!(" ({shown} of {total} workers, most requests)")
    } else {
        String::new()
    }
}

fn cdf_figure(
    title: &str,
    axis: &str,
    runs: &[PolicyRun],
    hist: fn(&RunMetrics) -> &routelab_sim::histogram::Histogram,
) -> Figure {
    let series: Vec<Series> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: r.policy.clone(),
            color: chart::color(i),
            points: chart::cdf_points(hist(&r.metrics)),
        })
        .collect();
    latency_cdf_figure(title, axis, series)
}

/// A CDF figure of latency series, with a log x axis when the values span ≥ 20×.
pub(crate) fn latency_cdf_figure(title: &str, axis: &str, series: Vec<Series>) -> Figure {
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite() && *x > 0.0);
    let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let log = hi > 0.0 && lo.is_finite() && hi / lo >= 20.0;
    let mut p = LinePanel::new(
        "",
        &if log {
            format!("{axis} (s, log scale)")
        } else {
            format!("{axis} (s)")
        },
        "requests at or below (CDF)",
    );
    p.x_log = log;
    p.y_range = Some((0.0, 1.0));
    p.y_percent = true;
    // The policies' full names, wrapped under the title rather than over the curves.
    p.legend = Legend::None;
    if !log && hi > 0.0 {
        p.x_range = Some((0.0, chart::nice_max(hi)));
    }
    let legend = series.iter().map(|s| (s.name.clone(), s.color)).collect();
    p.series = series;
    let mut fig = Figure::new(title, vec![Panel::Lines(p)]);
    fig.legend = legend;
    fig
}

fn share_figure(runs: &[PolicyRun]) -> Figure {
    let n = runs
        .iter()
        .map(|r| r.metrics.workers.len())
        .max()
        .unwrap_or(0);
    let keep = busiest_workers(runs, MAX_SHARE_WORKERS);
    let groups = runs
        .iter()
        .enumerate()
        .map(|(j, r)| BarGroup {
            name: r.policy.clone(),
            color: chart::color(j),
            values: keep.iter().map(|&i| share(&r.metrics, i)).collect(),
            errors: vec![None; keep.len()],
        })
        .collect();
    let panel = BarPanel {
        title: String::new(),
        x_label: "worker".into(),
        y_label: "share of requests".into(),
        categories: keep.iter().map(|&i| worker_name(runs, i)).collect(),
        groups,
        y_percent: true,
        color_by_category: false,
    };
    let mut fig = Figure::new(
        format!("Traffic share per worker{}", subset_note(keep.len(), n)),
        vec![Panel::Bars(panel)],
    );
    fig.legend = policy_legend(runs);
    fig
}

/// The policies' full names and colours, for a legend shared by a figure's panels.
fn policy_legend(runs: &[PolicyRun]) -> Vec<(String, plotters::style::RGBColor)> {
    runs.iter()
        .enumerate()
        .map(|(j, r)| (r.policy.clone(), chart::color(j)))
        .collect()
}

/// Per worker, the (t, value) series of a run's timeline, bucketed to ≤ MAX_POINTS points
/// (`peak`: the bucket's maximum, else its last value).
fn timeline_series(
    m: &RunMetrics,
    worker: usize,
    value: fn(&routelab_sim::TimelineRow) -> f64,
    peak: bool,
) -> Vec<(f64, f64)> {
    let rows: Vec<&routelab_sim::TimelineRow> =
        m.timeline.iter().filter(|t| t.worker == worker).collect();
    let k = rows.len().div_ceil(MAX_POINTS).max(1);
    rows.chunks(k)
        .map(|c| {
            let last = c[c.len() - 1];
            let v = if peak {
                c.iter().map(|t| value(t)).fold(f64::NEG_INFINITY, f64::max)
            } else {
                value(last)
            };
            (last.t_s, v)
        })
        .collect()
}

/// A timeline value as small multiples: one panel per worker (the busiest
/// [`MAX_LINE_WORKERS`] by requests dispatched, [`busiest_workers`]), a line per policy in the
/// policy's colour and dash pattern, every panel on the same axes. Per worker rather than per
/// policy, so each panel holds as many lines as there are policies (a few) instead of one per
/// worker, and the policies compare where they differ: on the same worker.
fn timeline_figure(
    title: &str,
    y_label: &str,
    runs: &[PolicyRun],
    value: fn(&routelab_sim::TimelineRow) -> f64,
    peak: bool,
) -> Figure {
    let n = runs
        .iter()
        .map(|r| r.metrics.workers.len())
        .max()
        .unwrap_or(0);
    let keep = busiest_workers(runs, MAX_LINE_WORKERS);
    let mut panels: Vec<LinePanel> = keep
        .iter()
        .map(|&i| {
            let mut p = LinePanel::new(worker_name(runs, i), "simulated time (s)", y_label);
            p.step = true;
            p.legend = Legend::None;
            p.series = runs
                .iter()
                .enumerate()
                .map(|(j, r)| Series {
                    name: r.policy.clone(),
                    color: chart::color(j),
                    points: timeline_series(&r.metrics, i, value, peak),
                })
                .collect();
            p
        })
        .collect();
    // Same axes on every panel so they compare at a glance.
    let pts = || {
        panels
            .iter()
            .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().copied()))
    };
    let (x0, x1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (x, _)| {
        (a.min(x), b.max(x))
    });
    let y1 = pts().map(|p| p.1).fold(0.0f64, f64::max);
    if x0.is_finite() {
        let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
        for p in &mut panels {
            p.x_range = Some((x0, x1));
            p.y_range = Some((0.0, chart::nice_max(y1)));
        }
    }
    // Two panels side by side once there are more than two (two stacked stay full width).
    let grid = panels.len() > 2;
    let mut fig = Figure::new(
        format!("{title}{}", subset_note(keep.len(), n)),
        panels.into_iter().map(Panel::Lines).collect(),
    );
    if grid {
        fig.columns = 2;
        fig.panel_height = 280;
    }
    fig.legend = policy_legend(runs);
    fig
}

fn run_figures(runs: &[PolicyRun]) -> Vec<(&'static str, Figure, String)> {
    vec![
        (
            "ttft_cdf",
            cdf_figure("Time to first token: CDF per policy", "time to first token", runs, |m| {
                &m.ttft
            }),
            "Time to first token, cumulative distribution per policy (from the latency histograms, ≤ 0.8 % error).".into(),
        ),
        (
            "e2e_cdf",
            cdf_figure("End-to-end latency: CDF per policy", "end-to-end latency", runs, |m| {
                &m.e2e
            }),
            "End-to-end latency, cumulative distribution per policy.".into(),
        ),
        (
            "share",
            share_figure(runs),
            "Fraction of all dispatches each worker received, per policy.".into(),
        ),
        (
            "weights",
            timeline_figure("Weight over time per worker", "weight", runs, |t| t.weight, false),
            "The router's weight of each worker at each timeline sample: a panel per worker, a line per policy.".into(),
        ),
        (
            "in_flight",
            timeline_figure(
                "Requests in flight over time per worker",
                "requests in flight",
                runs,
                |t| f64::from(t.in_flight),
                true,
            ),
            "Customer requests in flight on each worker (router's count; peak per plotted interval): a panel per worker, a line per policy.".into(),
        ),
    ]
}

fn run_html(
    meta: &RunMeta,
    runs: &[PolicyRun],
    summary: &SummaryFile,
    charts: &[(chart::Rendered, String)],
    has_requests: bool,
) -> String {
    let mut page = Page::new(&format!("routelab run: {}", meta.scenario));
    page.el("h1", None, &format!("routelab run: {}", meta.scenario));
    if !meta.description.is_empty() {
        page.el("p", Some("desc"), &meta.description);
    }
    page.raw(&format!(
        "<p class=\"meta\">seed {} · scenario file <code>{}</code> · {} {}</p>",
        meta.seed,
        esc(&meta.scenario_path),
        runs.len(),
        if runs.len() == 1 {
            "policy"
        } else {
            "policies"
        }
    ));
    page.el("p", Some("lead"), &run_headline(meta, runs));
    if !meta.seed_meaning.is_empty() {
        page.el("p", Some("meta"), &meta.seed_meaning);
    }
    page.raw(&format!(
        "<p class=\"meta\">SLO applied: {}</p>",
        esc(&meta.slo.to_string())
    ));
    // What a reader of the run must be told, as the console and summary.json say it (issue 41:
    // context-window rejections were in neither this page nor its tables).
    for r in runs {
        for w in r.metrics.warning_lines() {
            page.el("p", Some("meta"), &format!("{}: {w}", r.policy));
        }
    }
    page.el("h2", None, "Summary");
    let entries: Vec<&RunSummary> = summary.runs.iter().map(|e| &e.summary).collect();
    page.raw(&summary_html(&entries));
    page.el(
        "p",
        Some("note"),
        "Latencies in seconds (TTFT: time to first token; e2e: end to end; quantiles from \
         histograms with ≤ 0.8 % error). Output tok/s from the first arrival to the last \
         completion. SLO: share of requests meeting both the TTFT and the TPOT bound. \
         Best value per column highlighted.",
    );
    page.el("h2", None, "Workers");
    page.raw(&workers_html(summary));
    page.el("h2", None, "Charts");
    for (r, caption) in charts {
        page.figure(&r.svg, caption);
    }
    page.el("h2", None, "Data");
    page.raw(&format!(
        "<p class=\"meta\"><a href=\"summary.json\">summary.json</a> · {}\
         <a href=\"timeline.csv\">timeline.csv</a> · every chart also as <code>.svg</code> and \
         <code>.png</code> beside this file.</p>",
        if has_requests {
            "<a href=\"requests.csv\">requests.csv</a> · "
        } else {
            ""
        }
    ));
    page.finish()
}

/// The sentence the run report opens with: the best policy on the headline metric, judged by
/// the comparison's own rule ([`winner`], [`headline`]) on this run's one seed.
fn run_headline(meta: &RunMeta, runs: &[PolicyRun]) -> String {
    let policies = runs
        .iter()
        .map(|r| {
            let mut p = PolicySeeds::new(r.policy.clone(), r.metrics.role);
            p.push(meta.seed, &r.metrics);
            p
        })
        .collect();
    let sc = ScenarioComparison::new(meta.scenario.clone(), meta.description.clone(), policies);
    let m = headline_metric();
    headline(winner(&sc, m).as_ref(), m)
}

fn summary_html(runs: &[&RunSummary]) -> String {
    let cols: Vec<_> = views::RUN_HTML.iter().map(|(n, h)| (view(n), *h)).collect();
    let mut header = vec![("policy", true)];
    header.extend(cols.iter().map(|c| (c.1, false)));
    let best: Vec<Vec<usize>> = cols
        .iter()
        .map(|(m, _)| match m.direction {
            Direction::Neutral => Vec::new(),
            d => {
                let vals: Vec<Option<f64>> = runs.iter().map(|r| r.get(m)).collect();
                best_indices(&vals, d == Direction::Lower)
            }
        })
        .collect();
    let rows: Vec<(bool, Vec<Cell>)> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut cells = vec![Cell::text(&r.policy)];
            for (k, (m, _)) in cols.iter().enumerate() {
                cells.push(Cell::num(m.fmt_value(r.get(m))).best(best[k].contains(&i)));
            }
            (false, cells)
        })
        .collect();
    split_table(&header, &rows, 1)
}

fn workers_html(summary: &SummaryFile) -> String {
    let header = [
        ("policy", true),
        ("worker", true),
        ("requests", false),
        ("share", false),
        ("completed", false),
        ("failed", false),
        ("output tokens", false),
        ("final weight", false),
        ("provenance", true),
        ("probe bursts", false),
    ];
    let mut rows = Vec::new();
    for e in &summary.runs {
        for (k, w) in e.workers.iter().enumerate() {
            rows.push((
                k == 0,
                vec![
                    Cell::text(if k == 0 {
                        e.summary.policy.as_str()
                    } else {
                        ""
                    }),
                    Cell::text(&w.id),
                    Cell::num(w.requests.to_string()),
                    Cell::num(fmt_pct(w.share)),
                    Cell::num(w.completed.to_string()),
                    Cell::num(w.failed.to_string()),
                    Cell::num(w.output_tokens.to_string()),
                    Cell::num(fmt_sig(w.weight, 3)),
                    Cell::text(&w.provenance),
                    Cell::num(w.probe_bursts.to_string()),
                ],
            ));
        }
    }
    split_table(&header, &rows, 2)
}

/// An aligned plain-text table of scalar summaries, one row per policy.
pub fn summary_table(runs: &[RunSummary]) -> String {
    let mut cols: Vec<(&str, bool)> = vec![("policy", false)];
    cols.extend(views::RUN_TERMINAL.iter().map(|c| (c.1, true)));
    let mut t = TextTable::new(&cols);
    for s in runs {
        let mut row = vec![s.policy.clone()];
        row.extend(views::RUN_TERMINAL.iter().map(|(n, _)| {
            let m = view(n);
            m.fmt_value(s.get(m))
        }));
        t.row(row);
    }
    t.render()
}

/// Most worker rows in the terminal table.
const MAX_TERMINAL_WORKERS: usize = 20;

/// The terminal view of a run: the policy table (latencies in seconds), then per policy each
/// worker's share of requests and final weight (the 20 busiest workers at most).
pub fn run_table(runs: &[PolicyRun]) -> String {
    let summaries: Vec<RunSummary> = runs.iter().map(PolicyRun::summary).collect();
    let mut out = summary_table(&summaries);
    out.push_str("latencies in seconds; tok/s: output tokens per second\n");
    let n = runs
        .iter()
        .map(|r| r.metrics.workers.len())
        .max()
        .unwrap_or(0);
    if n == 0 {
        return out;
    }
    let keep = busiest_workers(runs, MAX_TERMINAL_WORKERS);
    let mut t = TextTable::new(&[
        ("policy", false),
        ("worker", false),
        ("requests", true),
        ("share", true),
        ("failed", true),
        ("weight", true),
        ("provenance", false),
    ]);
    for r in runs {
        let rows = WorkerSummary::from_metrics(&r.metrics);
        for (k, &i) in keep.iter().enumerate() {
            let Some(w) = rows.get(i) else { continue };
            t.row(vec![
                if k == 0 {
                    r.policy.clone()
                } else {
                    String::new()
                },
                w.id.clone(),
                w.requests.to_string(),
                fmt_pct(w.share),
                w.failed.to_string(),
                fmt_sig(w.weight, 3),
                w.provenance.clone(),
            ]);
        }
    }
    out.push('\n');
    out.push_str(&t.render());
    if keep.len() < n {
        out.push_str(&format!(
            "({} of {n} workers shown: those with the most requests)\n",
            keep.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::WorkerTotals;

    /// A run of `policy` over workers named `w0…` with the given dispatch counts.
    fn run_of(policy: &str, requests: &[u64]) -> PolicyRun {
        let workers = requests
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut w = WorkerTotals::new(format!("w{i}"));
                w.requests = n;
                w
            })
            .collect();
        let mut m = RunMetrics::new(policy, workers);
        m.requests = requests.iter().sum();
        PolicyRun::new(m, None)
    }

    #[test]
    fn timelines_are_small_multiples_of_the_busiest_workers_a_line_per_policy() {
        // Ten workers; w9 and w0 busiest overall, w5 idle under both policies.
        let counts_a = [50, 1, 2, 3, 4, 0, 6, 7, 8, 90];
        let counts_b = [40, 2, 3, 4, 5, 0, 7, 8, 9, 10];
        let runs = [run_of("p2c", &counts_a), run_of("least-load", &counts_b)];
        let fig = timeline_figure("In flight", "requests", &runs, |t| t.weight, false);
        assert_eq!(fig.panels.len(), MAX_LINE_WORKERS);
        let titles: Vec<&str> = fig
            .panels
            .iter()
            .map(|p| match p {
                Panel::Lines(l) => l.title.as_str(),
                Panel::Bars(_) => panic!("a line panel"),
            })
            .collect();
        // The eight busiest in fleet order: all but w1 (3 requests) and w5 (none).
        assert_eq!(titles, ["w0", "w2", "w3", "w4", "w6", "w7", "w8", "w9"]);
        for p in &fig.panels {
            let Panel::Lines(l) = p else { unreachable!() };
            let names: Vec<&str> = l.series.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, ["p2c", "least-load"], "a line per policy");
        }
        let legend: Vec<&str> = fig.legend.iter().map(|l| l.0.as_str()).collect();
        assert_eq!(legend, ["p2c", "least-load"], "the policies' full names");
        assert_eq!(fig.columns, 2);
        assert!(
            fig.title.ends_with("(8 of 10 workers, most requests)"),
            "{}",
            fig.title
        );
    }

    #[test]
    fn the_run_headline_names_the_best_policy_on_one_seed() {
        use routelab_sim::histogram::Histogram;
        let with_e2e = |policy: &str, secs: f64| {
            let mut r = run_of(policy, &[10]);
            let mut h = Histogram::new();
            for _ in 0..10 {
                h.record_secs(secs);
            }
            r.metrics.e2e = h;
            r
        };
        let meta = RunMeta {
            scenario: "t".into(),
            seed: 7,
            description: String::new(),
            scenario_path: "t.yaml".into(),
            slo: Slo::default(),
            seed_meaning: String::new(),
        };
        let runs = [with_e2e("slow", 2.0), with_e2e("fast", 1.0)];
        let s = run_headline(&meta, &runs);
        assert!(s.starts_with("fast has the lowest e2e mean ("), "{s}");
        assert!(s.contains("for the runner-up slow"), "{s}");
        assert!(s.contains("one seed gives no interval"), "{s}");
    }
}
