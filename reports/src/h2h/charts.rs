//! The head-to-head's charts (`h2h.svg` / `h2h.png`): per router, SLO attainment and the TTFT
//! and e2e means against load (the mean over seeds, attainment with its 95 % band), and each
//! router's per-worker shares at the highest load. Drawn by the same chart code as every other
//! report, with the bundled font.

use super::Runs;
use crate::chart::{self, Band, BarGroup, BarPanel, Figure, Legend, LinePanel, Panel, Series};
use crate::error::ReportError;
use crate::stats::Interval;
use std::path::{Path, PathBuf};

/// Draw the head-to-head's charts of `runs` into `dir`; the files written.
pub fn write_h2h_charts(
    dir: &Path,
    scenario: &str,
    target: Option<f64>,
    runs: &Runs,
) -> Result<Vec<PathBuf>, ReportError> {
    let r = chart::render(&figure(scenario, target, runs), dir, "h2h")?;
    Ok(vec![r.svg_path, r.png_path])
}

fn figure(scenario: &str, target: Option<f64>, runs: &Runs) -> Figure {
    let routers = runs.routers();
    let mut loads = runs.loads();
    loads.sort_by(f64::total_cmp);
    let per_load = |router: &str, f: &dyn Fn(&super::RunRow) -> Option<f64>| {
        loads
            .iter()
            .filter_map(|&l| {
                let iv = Interval::of(runs.of(l, router).iter().filter_map(|r| f(r)))?;
                Some((l, iv))
            })
            .collect::<Vec<_>>()
    };
    let line_panel = |title: &str, unit: &str, f: &dyn Fn(&super::RunRow) -> Option<f64>| {
        let mut p = LinePanel::new(title, "load scale", unit);
        p.markers = true;
        p.legend = Legend::None;
        for (i, r) in routers.iter().enumerate() {
            let pts = per_load(r, f);
            p.series.push(Series {
                name: r.clone(),
                color: chart::color(i),
                points: pts.iter().map(|(l, iv)| (*l, iv.mean)).collect(),
            });
        }
        p
    };
    let mut att = line_panel("SLO attainment", "share of requests", &|r| r.slo_attainment);
    att.y_percent = true;
    att.y_range = Some((0.0, 1.0));
    for (i, r) in routers.iter().enumerate() {
        let pts = per_load(r, &|x| x.slo_attainment);
        att.bands.push(Band {
            color: chart::color(i),
            points: pts
                .iter()
                .map(|(l, iv)| (*l, iv.low().max(0.0), iv.high().min(1.0)))
                .collect(),
        });
    }
    if let Some(t) = target {
        att.reference_lines
            .push((t, format!("target {:.0} %", t * 100.0)));
    }
    let ttft = line_panel("TTFT mean", "s (scenario time)", &|r| r.ttft_s[0]);
    let e2e = line_panel("e2e mean", "s (scenario time)", &|r| r.e2e_s[0]);
    let top = loads.last().copied().unwrap_or(1.0);
    let shares = BarPanel {
        title: format!("share of requests per worker at load {top}"),
        x_label: "router".into(),
        y_label: "share".into(),
        categories: routers.clone(),
        groups: runs
            .workers
            .iter()
            .enumerate()
            .map(|(k, w)| BarGroup {
                name: w.clone(),
                color: chart::color(routers.len() + k),
                values: routers
                    .iter()
                    .map(|r| {
                        Interval::of(
                            runs.of(top, r)
                                .iter()
                                .filter_map(|x| x.shares.get(k).copied().flatten()),
                        )
                        .map(|iv| iv.mean)
                    })
                    .collect(),
                errors: vec![None; routers.len()],
            })
            .collect(),
        y_percent: true,
        color_by_category: false,
    };
    let mut fig = Figure::new(
        format!("{scenario}: head to head in real time"),
        vec![
            Panel::Lines(att),
            Panel::Lines(ttft),
            Panel::Lines(e2e),
            Panel::Bars(shares),
        ],
    );
    fig.panel_height = 300;
    fig.legend = routers
        .iter()
        .enumerate()
        .map(|(i, r)| (r.clone(), chart::color(i)))
        .chain(
            runs.workers
                .iter()
                .enumerate()
                .map(|(k, w)| (format!("worker {w}"), chart::color(routers.len() + k))),
        )
        .collect();
    fig
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h2h::RunRow;

    #[test]
    fn the_chart_is_drawn_for_every_router_and_worker() {
        let row = |load: f64, router: &str, seed: u64, att: f64| RunRow {
            load,
            router: router.into(),
            seed,
            requests: 10,
            completed: 10,
            failed: 0,
            rejected: 0,
            slo_attainment: Some(att),
            ttft_s: [Some(att), None, None],
            tpot_s: [None, None],
            e2e_s: [Some(2.0 * att), None, None],
            shares: vec![Some(0.7), Some(0.3)],
        };
        let runs = Runs {
            workers: vec!["fast".into(), "slow".into()],
            rows: vec![
                row(0.5, "ours", 1, 1.0),
                row(1.0, "ours", 1, 0.95),
                row(0.5, "vllm:round_robin", 1, 0.9),
                row(1.0, "vllm:round_robin", 1, 0.5),
            ],
        };
        let dir = std::env::temp_dir().join(format!("routelab-h2h-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = write_h2h_charts(&dir, "h2h/test", Some(0.9), &runs).unwrap();
        assert_eq!(files.len(), 2);
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        for text in [
            "SLO attainment",
            "vllm:round_robin",
            "worker slow",
            "at load 1",
        ] {
            assert!(svg.contains(text), "{text} missing from the chart");
        }
        assert!(std::fs::metadata(&files[1]).unwrap().len() > 1000);
        std::fs::remove_dir_all(&dir).ok();
    }
}
