//! Outputs of `routelab compare`: several policies × several seeds × several scenarios, with the
//! mean and 95 % interval of each metric across seeds and the winner per metric.

use crate::chart::{self, BarGroup, BarPanel, Figure, Panel, Series};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, best_indices, table};
use crate::export::json::write_json;
use crate::export::markdown::cell as md;
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::metric::{Direction, Metric, Unit, view, views};
use crate::num::{fmt_sig, r6, slug};
use crate::run::{Written, latency_cdf_figure};
use crate::stats::Interval;
use crate::summary::{RunSummary, summary_csv_header};
use routelab_sim::RunMetrics;
use routelab_sim::histogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// One seed of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedRun {
    /// Root seed.
    pub seed: u64,
    /// Its scalar metrics.
    #[serde(flatten)]
    pub summary: RunSummary,
}

/// One policy over several seeds.
#[derive(Debug, Clone)]
pub struct PolicySeeds {
    /// Policy name.
    pub policy: String,
    /// One summary per seed, in seed order as run.
    pub runs: Vec<SeedRun>,
    /// End-to-end latency histogram of the first seed, for the CDF chart.
    pub first_seed_e2e: Option<Histogram>,
}

impl PolicySeeds {
    /// No runs yet.
    pub fn new(policy: impl Into<String>) -> PolicySeeds {
        PolicySeeds {
            policy: policy.into(),
            runs: Vec::new(),
            first_seed_e2e: None,
        }
    }

    /// Add one seed's metrics (the first one added also provides the CDF).
    pub fn push(&mut self, seed: u64, metrics: &RunMetrics) {
        if self.runs.is_empty() {
            self.first_seed_e2e = Some(metrics.e2e.clone());
        }
        self.runs.push(SeedRun {
            seed,
            summary: RunSummary::from_metrics(metrics).with_policy(self.policy.clone()),
        });
    }
}

/// All policies of one scenario.
#[derive(Debug, Clone)]
pub struct ScenarioComparison {
    /// Scenario name.
    pub scenario: String,
    /// Description.
    pub description: String,
    /// Policies, in report order.
    pub policies: Vec<PolicySeeds>,
}

/// `compare.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareFile {
    /// Per scenario.
    pub scenarios: Vec<ScenarioStats>,
}

/// Statistics of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioStats {
    /// Scenario name.
    pub scenario: String,
    /// Description.
    pub description: String,
    /// Per policy.
    pub policies: Vec<PolicyStats>,
    /// Winner per metric (metrics no policy has a value for are left out).
    pub winners: Vec<Winner>,
}

/// Statistics of one policy across seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyStats {
    /// Policy name.
    pub policy: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Per metric, in [`views::RANKED`] order.
    pub metrics: Vec<MetricStats>,
    /// The per-seed summaries.
    pub runs: Vec<SeedRun>,
}

/// Mean and 95 % interval (Student's t) of one metric across seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricStats {
    /// Metric name (see [`views::RANKED`]).
    pub metric: String,
    /// Seeds with a value.
    pub n: usize,
    /// Mean.
    pub mean: Option<f64>,
    /// Sample standard deviation.
    pub sd: Option<f64>,
    /// Lower end of the 95 % interval.
    pub ci95_low: Option<f64>,
    /// Upper end of the 95 % interval.
    pub ci95_high: Option<f64>,
}

/// The best policy on one metric (by mean across seeds) and its margin over the runner-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Winner {
    /// Metric key.
    pub metric: String,
    /// Best policy (the first listed on a tie).
    pub winner: String,
    /// Its mean.
    pub winner_mean: Option<f64>,
    /// Second best.
    pub runner_up: Option<String>,
    /// Its mean.
    pub runner_up_mean: Option<f64>,
    /// How much better the winner is, in % of the runner-up's mean.
    pub margin_pct: Option<f64>,
    /// The two means are equal.
    pub tie: bool,
    /// The two 95 % intervals overlap (the ranking may not hold on other seeds).
    pub intervals_overlap: Option<bool>,
}

fn interval(p: &PolicySeeds, m: &Metric) -> Option<Interval> {
    Interval::of(p.runs.iter().filter_map(|r| r.summary.get(m)))
}

/// The metrics policies are ranked by, in report order.
fn ranked() -> impl Iterator<Item = &'static Metric> {
    views::RANKED.iter().map(|n| view(n))
}

fn winner(sc: &ScenarioComparison, m: &Metric) -> Option<Winner> {
    let mut ranked: Vec<(usize, Interval)> = sc
        .policies
        .iter()
        .enumerate()
        .filter_map(|(i, p)| interval(p, m).map(|iv| (i, iv)))
        .collect();
    // Stable: equal means keep input order.
    ranked.sort_by(|a, b| {
        let ord = a.1.mean.total_cmp(&b.1.mean);
        match m.direction {
            Direction::Higher => ord.reverse(),
            _ => ord,
        }
    });
    let (wi, w) = *ranked.first()?;
    let second = ranked.get(1);
    let margin = second.and_then(|(_, r)| {
        if r.mean == 0.0 {
            return None;
        }
        let d = match m.direction {
            Direction::Higher => w.mean - r.mean,
            _ => r.mean - w.mean,
        };
        r6(d / r.mean.abs() * 100.0)
    });
    Some(Winner {
        metric: m.name.to_string(),
        winner: sc.policies[wi].policy.clone(),
        winner_mean: r6(w.mean),
        runner_up: second.map(|(i, _)| sc.policies[*i].policy.clone()),
        runner_up_mean: second.and_then(|(_, r)| r6(r.mean)),
        margin_pct: margin,
        tie: second.is_some_and(|(_, r)| r.mean == w.mean),
        intervals_overlap: second.map(|(_, r)| r.overlaps(&w)),
    })
}

/// Build the content of `compare.json`.
pub fn compare_file(scenarios: &[ScenarioComparison]) -> CompareFile {
    CompareFile {
        scenarios: scenarios
            .iter()
            .map(|sc| ScenarioStats {
                scenario: sc.scenario.clone(),
                description: sc.description.clone(),
                policies: sc
                    .policies
                    .iter()
                    .map(|p| PolicyStats {
                        policy: p.policy.clone(),
                        seeds: p.runs.iter().map(|r| r.seed).collect(),
                        metrics: ranked()
                            .map(|m| {
                                let iv = interval(p, m);
                                MetricStats {
                                    metric: m.name.to_string(),
                                    n: iv.map_or(0, |i| i.n),
                                    mean: iv.and_then(|i| r6(i.mean)),
                                    sd: iv.and_then(|i| i.sd).and_then(r6),
                                    ci95_low: iv
                                        .and_then(|i| i.half_width.and_then(|_| r6(i.low()))),
                                    ci95_high: iv
                                        .and_then(|i| i.half_width.and_then(|_| r6(i.high()))),
                                }
                            })
                            .collect(),
                        runs: p.runs.clone(),
                    })
                    .collect(),
                winners: ranked().filter_map(|m| winner(sc, m)).collect(),
            })
            .collect(),
    }
}

/// Metrics shown in the HTML table, its winners and the findings.
fn key_metrics() -> impl Iterator<Item = &'static Metric> {
    views::COMPARE_KEY.iter().map(|n| view(n))
}

/// A metric's label with its unit where the label does not already say it.
fn column_label(m: &Metric) -> String {
    match m.unit {
        Unit::Seconds => format!("{} (s)", m.label),
        _ => m.label.to_string(),
    }
}

fn fmt_metric(m: &Metric, v: Option<f64>) -> String {
    m.fmt_stat(v)
}

/// `mean ± half-width` (percent points for fractions).
fn fmt_interval(m: &Metric, iv: Option<Interval>) -> String {
    let Some(iv) = iv else { return "-".into() };
    let mean = fmt_metric(m, Some(iv.mean));
    match iv.half_width {
        // Rounding noise of identical seeds is no spread.
        Some(h) if h <= iv.mean.abs() * 1e-9 => format!("{mean} ± 0"),
        Some(h) if m.unit == Unit::Fraction => format!("{mean} ± {:.1}", h * 100.0),
        Some(h) => format!("{mean} ± {}", fmt_sig(Some(h), 2)),
        None => mean,
    }
}

/// Write every output of `routelab compare` into `dir`: `compare.json`, `compare.csv` (one row
/// per scenario, policy and metric: n, mean, sd, 95 % interval, winner), `compare_seeds.csv`
/// (one row per scenario, policy and seed), per scenario a bar chart with error bars
/// (`compare_<k>_<scenario>_bars`) and an end-to-end CDF of the first seed
/// (`compare_<k>_<scenario>_e2e_cdf`), each as `.svg` and `.png`, and `report.html`.
pub fn write_compare(dir: &Path, scenarios: &[ScenarioComparison]) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let mut out = Written::default();
    let file = compare_file(scenarios);

    let p = dir.join("compare.json");
    write_json(&p, &file)?;
    out.files.push(p);

    let p = dir.join("compare.csv");
    let mut rows = Vec::new();
    for (sc, st) in scenarios.iter().zip(&file.scenarios) {
        for ps in &st.policies {
            for (m, ms) in ranked().zip(&ps.metrics) {
                let is_winner = st
                    .winners
                    .iter()
                    .any(|w| w.metric == m.name && w.winner == ps.policy && !w.tie);
                let o = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
                rows.push(vec![
                    sc.scenario.clone(),
                    ps.policy.clone(),
                    m.name.to_string(),
                    m.unit.as_str().to_string(),
                    m.direction.as_str().to_string(),
                    ms.n.to_string(),
                    o(ms.mean),
                    o(ms.sd),
                    o(ms.ci95_low),
                    o(ms.ci95_high),
                    is_winner.to_string(),
                ]);
            }
        }
    }
    write_csv(
        &p,
        &[
            "scenario",
            "policy",
            "metric",
            "unit",
            "better",
            "n",
            "mean",
            "sd",
            "ci95_low",
            "ci95_high",
            "winner",
        ],
        rows,
    )?;
    out.files.push(p);

    let p = dir.join("compare_seeds.csv");
    let mut header = vec!["scenario", "policy", "seed"];
    header.extend(summary_csv_header());
    let rows = scenarios.iter().flat_map(|sc| {
        sc.policies.iter().flat_map(move |p| {
            p.runs.iter().map(move |r| {
                let mut row = vec![sc.scenario.clone(), p.policy.clone(), r.seed.to_string()];
                row.extend(r.summary.csv_fields());
                row
            })
        })
    });
    write_csv(&p, &header, rows)?;
    out.files.push(p);

    let mut charts = Vec::new();
    for (k, sc) in scenarios.iter().enumerate() {
        let base = format!("compare_{}_{}", k + 1, slug(&sc.scenario));
        let bars = chart::render(&bars_figure(sc), dir, &format!("{base}_bars"))?;
        let cdf = chart::render(&cdf_figure(sc), dir, &format!("{base}_e2e_cdf"))?;
        for r in [&bars, &cdf] {
            out.files.push(r.svg_path.clone());
            out.files.push(r.png_path.clone());
        }
        charts.push((bars, cdf));
    }

    let p = dir.join("report.html");
    write_file(&p, compare_html(scenarios, &file, &charts))?;
    out.files.push(p);
    Ok(out)
}

fn bars_panel(sc: &ScenarioComparison, m: &Metric, title: &str) -> BarPanel {
    let ivs: Vec<Option<Interval>> = sc.policies.iter().map(|p| interval(p, m)).collect();
    BarPanel {
        title: title.to_string(),
        x_label: "policy".into(),
        y_label: format!("{} ({})", m.label, m.unit.as_str()),
        categories: sc.policies.iter().map(|p| p.policy.clone()).collect(),
        groups: vec![BarGroup {
            name: m.label.to_string(),
            color: chart::color(0),
            values: ivs.iter().map(|iv| iv.map(|i| i.mean)).collect(),
            errors: ivs
                .iter()
                .map(|iv| iv.and_then(|i| i.half_width.map(|_| (i.low().max(0.0), i.high()))))
                .collect(),
        }],
        y_percent: false,
        color_by_category: true,
    }
}

fn seeds_note(sc: &ScenarioComparison) -> String {
    let n = sc.policies.iter().map(|p| p.runs.len()).max().unwrap_or(0);
    format!("{n} seed{}", if n == 1 { "" } else { "s" })
}

fn bars_figure(sc: &ScenarioComparison) -> Figure {
    let panels = views::COMPARE_BARS
        .iter()
        .map(|(n, title)| Panel::Bars(bars_panel(sc, view(n), title)))
        .collect();
    Figure::new(format!("{}: {}", sc.scenario, seeds_note(sc)), panels)
}

fn cdf_figure(sc: &ScenarioComparison) -> Figure {
    let series = sc
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| Series {
            name: match p.runs.first() {
                Some(r) => format!("{} (seed {})", p.policy, r.seed),
                None => p.policy.clone(),
            },
            color: chart::color(i),
            points: p
                .first_seed_e2e
                .as_ref()
                .map(chart::cdf_points)
                .unwrap_or_default(),
        })
        .collect();
    latency_cdf_figure(
        &format!("{}: end-to-end latency CDF, first seed", sc.scenario),
        "end-to-end latency",
        series,
    )
}

fn compare_html(
    scenarios: &[ScenarioComparison],
    file: &CompareFile,
    charts: &[(chart::Rendered, chart::Rendered)],
) -> String {
    let mut page = Page::new("routelab compare");
    page.el("h1", None, "routelab compare");
    page.el(
        "p",
        Some("meta"),
        &format!(
            "{} scenario{} · mean across seeds ± half-width of the 95 % interval (Student's t) · \
             best mean per column highlighted",
            scenarios.len(),
            if scenarios.len() == 1 { "" } else { "s" }
        ),
    );
    for ((sc, st), (bars, cdf)) in scenarios.iter().zip(&file.scenarios).zip(charts) {
        page.el("h2", None, &sc.scenario);
        if !sc.description.is_empty() {
            page.el("p", Some("desc"), &sc.description);
        }
        page.el("p", Some("meta"), &seeds_note(sc));
        page.raw(&scenario_table_html(sc));
        page.raw(&winners_html(st));
        page.figure(
            &bars.svg,
            "Mean end-to-end latency and p99 TTFT per policy; error bars: 95 % interval across seeds.",
        );
        page.figure(
            &cdf.svg,
            "End-to-end latency CDF of the first seed, per policy.",
        );
    }
    page.raw(
        "<p class=\"meta\"><a href=\"compare.json\">compare.json</a> · \
         <a href=\"compare.csv\">compare.csv</a> · <a href=\"compare_seeds.csv\">compare_seeds.csv</a></p>",
    );
    page.finish()
}

fn scenario_table_html(sc: &ScenarioComparison) -> String {
    let metrics: Vec<&Metric> = key_metrics().collect();
    let headers: Vec<String> = metrics.iter().map(|m| column_label(m)).collect();
    let mut header: Vec<(&str, bool)> = vec![("policy", true), ("seeds", false)];
    header.extend(headers.iter().map(|h| (h.as_str(), false)));
    let ivs: Vec<Vec<Option<Interval>>> = metrics
        .iter()
        .map(|m| sc.policies.iter().map(|p| interval(p, m)).collect())
        .collect();
    let best: Vec<Vec<usize>> = metrics
        .iter()
        .zip(&ivs)
        .map(|(m, col)| {
            let means: Vec<Option<f64>> = col.iter().map(|iv| iv.map(|i| i.mean)).collect();
            best_indices(&means, m.direction == Direction::Lower)
        })
        .collect();
    let rows: Vec<(bool, Vec<Cell>)> = sc
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut cells = vec![Cell::text(&p.policy), Cell::num(p.runs.len().to_string())];
            for (k, m) in metrics.iter().enumerate() {
                let iv = ivs[k][i];
                let mut c = Cell::num(fmt_interval(m, iv)).best(best[k].contains(&i));
                if let Some(iv) = iv {
                    c = c.titled(format!(
                        "n = {}, 95 % interval [{}, {}]",
                        iv.n,
                        fmt_metric(m, Some(iv.low())),
                        fmt_metric(m, Some(iv.high()))
                    ));
                }
                cells.push(c);
            }
            (false, cells)
        })
        .collect();
    table(&header, &rows)
}

fn winners_html(st: &ScenarioStats) -> String {
    let header = [
        ("metric", true),
        ("winner", true),
        ("runner-up", true),
        ("margin", false),
        ("intervals overlap", true),
    ];
    let rows: Vec<(bool, Vec<Cell>)> = key_metrics()
        .filter_map(|m| {
            st.winners
                .iter()
                .find(|w| w.metric == m.name)
                .map(|w| (m, w))
        })
        .filter(|(_, w)| w.runner_up.is_some() && !w.tie)
        .map(|(m, w)| {
            (
                false,
                vec![
                    Cell::text(m.label),
                    Cell::text(&w.winner),
                    Cell::text(w.runner_up.as_deref().unwrap_or("-")),
                    Cell::num(fmt_margin(w)),
                    Cell::text(match w.intervals_overlap {
                        Some(true) => "yes: not separated",
                        Some(false) => "no",
                        None => "-",
                    }),
                ],
            )
        })
        .collect();
    if rows.is_empty() {
        return "<p class=\"note\">No metric separates the policies.</p>".into();
    }
    let mut s = table(&header, &rows);
    s.push_str(
        "\n<p class=\"note\">Winner by mean across seeds; margin in % of the runner-up's \
         mean; metrics on which the best two tie are left out.</p>",
    );
    s
}

fn fmt_margin(w: &Winner) -> String {
    match w.margin_pct {
        Some(m) => format!("{m:.1}%"),
        None => "-".into(),
    }
}

/// An aligned plain-text table per scenario: key metrics as `mean ± half-width` across seeds,
/// the best mean per column marked with `*`.
pub fn compare_table(scenarios: &[ScenarioComparison]) -> String {
    let metrics: Vec<&Metric> = views::COMPARE_TERMINAL.iter().map(|n| view(n)).collect();
    let mut out = String::new();
    for (k, sc) in scenarios.iter().enumerate() {
        if k > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "{} ({})", sc.scenario, seeds_note(sc));
        let mut cols: Vec<(&str, bool)> = vec![("policy", false)];
        cols.extend(metrics.iter().map(|m| (m.label, true)));
        let mut t = TextTable::new(&cols);
        let ivs: Vec<Vec<Option<Interval>>> = metrics
            .iter()
            .map(|m| sc.policies.iter().map(|p| interval(p, m)).collect())
            .collect();
        let best: Vec<Vec<usize>> = metrics
            .iter()
            .zip(&ivs)
            .map(|(m, col)| {
                let means: Vec<Option<f64>> = col.iter().map(|iv| iv.map(|i| i.mean)).collect();
                best_indices(&means, m.direction == Direction::Lower)
            })
            .collect();
        for (i, p) in sc.policies.iter().enumerate() {
            let mut row = vec![p.policy.clone()];
            for (j, m) in metrics.iter().enumerate() {
                let mut s = fmt_interval(m, ivs[j][i]);
                if best[j].contains(&i) {
                    s.push('*');
                } else {
                    s.push(' ');
                }
                row.push(s);
            }
            t.row(row);
        }
        out.push_str(&t.render());
    }
    if !scenarios.is_empty() {
        out.push_str("mean ± 95 % half-width across seeds; * best mean (s, tok/s, %)\n");
    }
    out
}

/// A Markdown findings table (scenario | metric | winner | runner-up | margin % | intervals
/// overlap) for `docs/findings.md`, over the key metrics; exact ties are left out. The margin
/// is how much better the winner's mean is, in % of the runner-up's mean.
pub fn findings_markdown(scenarios: &[ScenarioComparison]) -> String {
    let file = compare_file(scenarios);
    let mut out = String::from(
        "| scenario | metric | winner | runner-up | margin % | intervals overlap |\n\
         |---|---|---|---|---:|---|\n",
    );
    for st in &file.scenarios {
        for m in key_metrics() {
            let Some(w) = st.winners.iter().find(|w| w.metric == m.name) else {
                continue;
            };
            let Some(runner) = &w.runner_up else { continue };
            if w.tie {
                continue;
            }
            let label = column_label(m);
            let _ = writeln!(
                out,
                "| {} | {} | {} ({}) | {} ({}) | {} | {} |",
                md(&st.scenario),
                md(&label),
                md(&w.winner),
                fmt_metric(m, w.winner_mean),
                md(runner),
                fmt_metric(m, w.runner_up_mean),
                w.margin_pct
                    .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
                match w.intervals_overlap {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                }
            );
        }
    }
    out
}

/// The whole findings document (`docs/findings.md`): a header saying how it was generated,
/// then [`findings_markdown`].
pub fn findings_document(
    scenarios: &[&str],
    seeds: u64,
    comparisons: &[ScenarioComparison],
) -> String {
    format!(
        "# Findings\n\nGenerated by `routelab compare` over {} with {seeds} seeds each; do not edit by hand.\n\
         Each row: which policy wins the metric on the scenario (mean over the seeds), the runner-up,\n\
         the margin, and whether their 95 % intervals overlap (if they do, the win is not established).\n\n{}",
        scenarios
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", "),
        findings_markdown(comparisons)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn summary(policy: &str, e2e: f64, tok: f64) -> RunSummary {
        let mut s = RunSummary::from_metrics(&RunMetrics::new(policy, vec![]));
        for m in crate::metric::CATALOG {
            let v = match m.name {
                "requests" | "completed" => Some(10.0),
                "output_tokens" => Some(100.0),
                "output_tok_s" => Some(tok),
                "span_s" => Some(10.0),
                "slo_attainment" => Some(1.0),
                n if n.starts_with("queue_") => None,
                n if n.ends_with("_p99_s") || n.ends_with("_max_s") => Some(e2e * 2.0),
                n if n.ends_with("_s") && !n.starts_with("probe") => Some(e2e),
                _ => Some(0.0),
            };
            s.set(m, v);
        }
        s
    }

    pub(crate) fn comparison() -> ScenarioComparison {
        let mk = |name: &str, e2e: [f64; 3], tok: f64| PolicySeeds {
            policy: name.into(),
            runs: e2e
                .iter()
                .enumerate()
                .map(|(i, e)| SeedRun {
                    seed: i as u64 + 1,
                    summary: summary(name, *e, tok),
                })
                .collect(),
            first_seed_e2e: None,
        };
        ScenarioComparison {
            scenario: "test/two".into(),
            description: "two policies".into(),
            policies: vec![
                mk("slow", [2.0, 2.2, 2.4], 100.0),
                mk("fast", [1.0, 1.1, 1.2], 150.0),
            ],
        }
    }

    #[test]
    fn winners_and_margins() {
        let f = compare_file(&[comparison()]);
        let st = &f.scenarios[0];
        let w = st
            .winners
            .iter()
            .find(|w| w.metric == "e2e_mean_s")
            .unwrap();
        assert_eq!(w.winner, "fast");
        assert_eq!(w.runner_up.as_deref(), Some("slow"));
        // (2.2 - 1.1) / 2.2 = 50 %.
        assert_eq!(w.margin_pct, Some(50.0));
        assert_eq!(w.intervals_overlap, Some(false));
        let t = st
            .winners
            .iter()
            .find(|w| w.metric == "output_tok_s")
            .unwrap();
        assert_eq!(t.winner, "fast");
        assert_eq!(t.margin_pct, Some(50.0));
        let tie = st.winners.iter().find(|w| w.metric == "failed").unwrap();
        assert!(tie.tie);
        assert_eq!(tie.winner, "slow", "ties keep input order");
        let ms = &st.policies[1].metrics[3];
        assert_eq!(ms.metric, "e2e_mean_s");
        assert_eq!((ms.n, ms.mean), (3, Some(1.1)));
        assert!(ms.ci95_low.unwrap() < 1.1 && ms.ci95_high.unwrap() > 1.1);
    }

    #[test]
    fn findings_table_lists_untied_winners() {
        let doc = findings_document(&["test/two"], 3, &[comparison()]);
        assert!(doc.starts_with(
            "# Findings\n\nGenerated by `routelab compare` over `test/two` with 3 seeds each;"
        ));
        let md = findings_markdown(&[comparison()]);
        assert!(md.starts_with("| scenario | metric | winner | runner-up | margin % |"));
        assert!(md.contains("| test/two | e2e mean (s) | fast (1.10) | slow (2.20) | 50.0 | no |"));
        assert!(!md.contains("| failed"), "ties are left out:\n{md}");
        let table = compare_table(&[comparison()]);
        assert!(table.contains("fast"));
        assert!(table.contains("1.10 ± 0.25*"), "{table}");
    }
}
