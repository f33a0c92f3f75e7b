//! The outputs of `routelab capacity`: `capacity.json`, `capacity.csv` (one row per policy),
//! `capacity_evaluations.csv` (every evaluated load scale), the chart `capacity.svg`/`.png`
//! (SLO attainment and TTFT p99 against load, each policy's knee marked), `report.html` and the
//! console table.

use super::CapacityStudy;
use crate::chart::{
    self, Band, BarGroup, BarPanel, Figure, Knee, Legend, LinePanel, Panel, Series,
};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, best_indices, table};
use crate::export::json::write_json;
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::interval_text;
use crate::num::{fmt_fixed, fmt_sig, r6};
use crate::run::Written;
use crate::stats::{Interval, SeedStop};
use serde_json::{Value, json};
use std::path::Path;

/// Whether no policy's ratio to the baseline could form (the baseline infeasible on every
/// seed), so `--seeds auto` judged the ratios to the best feasible policy instead.
fn no_ratio_to_the_baseline(st: &CapacityStudy) -> bool {
    st.policies.len() > 1 && (0..st.policies.len()).all(|i| st.ratio(i).is_none())
}

fn stop_text(st: &CapacityStudy) -> String {
    let (hw, max) = st.auto_rule.unwrap_or_default();
    match st.seed_stop {
        SeedStop::Fixed => "fixed count (--seeds N)".into(),
        SeedStop::Precise if no_ratio_to_the_baseline(st) => format!(
            "--seeds auto: the baseline is infeasible on every seed, so every paired ratio to the \
             best feasible policy (or its own capacity, when it is the only one) had its 95 % \
             half-width fall within ±{hw} (at most {max} seeds)"
        ),
        SeedStop::Precise => format!(
            "--seeds auto: every paired ratio's 95 % half-width fell within ±{hw} (at most {max} seeds)"
        ),
        SeedStop::MaxSeeds => format!(
            "--seeds auto: the maximum of {max} seeds was reached before every paired ratio's 95 % \
             half-width fell within ±{hw}"
        ),
    }
}

const ACROSS_SEEDS: &str = "capacity searched per seed (common random numbers); mean of the \
                            per-seed capacities with a 95 % interval; ratio to the baseline: \
                            paired interval of the per-seed ratios, established when it excludes 1";

/// `capacity.json` as a value (keys sorted; figures to 6 significant digits).
fn capacity_json(st: &CapacityStudy) -> Value {
    let policies: Vec<Value> = st
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut v = json!({
                "policy": p.policy,
                "baseline": i == st.baseline,
                "capacity_scale": interval_text::json(p.interval()),
                "capacity_rate_per_s": interval_text::json(st.rate(i)),
                "ratio_to_baseline": interval_text::json(st.ratio(i)),
                "established": st.established(i),
                "censored": p.censored_note(),
                "seeds": p.seeds.iter().map(|s| json!({
                    "seed": s.seed,
                    "scale": r6(s.scale),
                    "failing_scale": r6(s.failing_scale),
                    "censored": s.censored.as_ref().map(|c| c.describe()),
                    "evaluations": s.evaluations.iter().map(|e| json!({
                        "scale": r6(e.scale),
                        "holds": e.holds,
                        "attainment": e.attainment.and_then(r6),
                        "ttft_p99_s": e.ttft_p99_s.and_then(r6),
                        "values": e.values.iter().map(|v| v.and_then(r6)).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            // Only when requests were refused: a study without rejections writes the file it
            // always did.
            let rejected = p.rejection_note();
            if !rejected.is_empty() {
                v["rejected"] = json!(rejected);
            }
            v
        })
        .collect();
    json!({
        "scenario": st.scenario,
        "description": st.description,
        "slo": {
            "spec": st.slo.to_string(),
            "target": st.slo.target,
            "rule": st.slo.rule(),
            "bounds": st.slo.bounds.iter().map(|b| json!({
                "name": b.name(),
                "bound_s": r6(b.bound_s),
            })).collect::<Vec<_>>(),
        },
        "precision": st.precision,
        "across_seeds": ACROSS_SEEDS,
        "seed_meaning": st.seed_meaning.0,
        "ship": super::ship_sentence(st),
        "out_of_sample": st.out_of_sample,
        "base_rate_per_s": st.base_rate_per_s.and_then(r6),
        "baseline": st.policies[st.baseline].policy,
        "seeds": st.seeds,
        "seed_stop": st.seed_stop,
        "seed_stop_reason": stop_text(st),
        "policies": policies,
    })
}

fn opt_fixed(v: Option<f64>, decimals: usize) -> String {
    v.map(|x| fmt_fixed(x, decimals)).unwrap_or_default()
}

/// Write every output of a capacity study into `dir`.
///
/// # Errors
/// The file that could not be written (or the chart that could not be drawn).
pub fn write_capacity(dir: &Path, st: &CapacityStudy) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let mut out = Written::default();
    let p = dir.join("capacity.json");
    write_json(&p, &capacity_json(st))?;
    out.files.push(p);

    let p = dir.join("capacity.csv");
    write_csv(
        &p,
        &[
            "policy",
            "baseline",
            "seeds",
            "capacity_scale",
            "capacity_scale_low",
            "capacity_scale_high",
            "capacity_rate_per_s",
            "ratio_to_baseline",
            "ratio_low",
            "ratio_high",
            "established",
            "censored",
        ],
        st.policies.iter().enumerate().map(|(i, p)| {
            let iv = p.interval();
            let rate = st.rate(i);
            let r = st.ratio(i);
            vec![
                p.policy.clone(),
                (i == st.baseline).to_string(),
                p.seeds.len().to_string(),
                opt_fixed(iv.map(|i| i.mean), 4),
                opt_fixed(iv.map(|i| i.low()), 4),
                opt_fixed(iv.map(|i| i.high()), 4),
                opt_fixed(rate.map(|i| i.mean), 4),
                opt_fixed(r.map(|i| i.mean), 4),
                opt_fixed(r.map(|i| i.low()), 4),
                opt_fixed(r.map(|i| i.high()), 4),
                st.established(i).to_string(),
                p.censored_note(),
            ]
        }),
    )?;
    out.files.push(p);

    let p = dir.join("capacity_evaluations.csv");
    let mut header = vec![
        "policy".to_string(),
        "seed".into(),
        "step".into(),
        "scale".into(),
        "holds".into(),
        "attainment".into(),
        "ttft_p99_s".into(),
    ];
    header.extend(st.slo.bounds.iter().map(|b| format!("{}_s", b.name())));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    for p in &st.policies {
        for s in &p.seeds {
            for (k, e) in s.evaluations.iter().enumerate() {
                let mut row = vec![
                    p.policy.clone(),
                    s.seed.to_string(),
                    k.to_string(),
                    fmt_fixed(e.scale, 6),
                    e.holds.to_string(),
                    opt_fixed(e.attainment, 6),
                    opt_fixed(e.ttft_p99_s, 6),
                ];
                row.extend(e.values.iter().map(|v| opt_fixed(*v, 6)));
                rows.push(row);
            }
        }
    }
    write_csv(&p, &header, rows)?;
    out.files.push(p);

    let r = chart::render(&capacity_figure(st), dir, "capacity")?;
    out.files.push(r.svg_path.clone());
    out.files.push(r.png_path.clone());

    let p = dir.join("report.html");
    write_file(&p, capacity_html(st, &r.svg))?;
    out.files.push(p);
    Ok(out)
}

/// What the curve panel draws at each evaluation: the attainment with a target, else the worst
/// bound's statistic over its limit (the SLO holds at 1 or below).
fn slo_value(st: &CapacityStudy, e: &super::Evaluation) -> Option<f64> {
    if st.slo.target.is_some() {
        return e.attainment;
    }
    st.slo
        .bounds
        .iter()
        .zip(&e.values)
        .map(|(b, v)| v.map(|v| v / b.bound_s))
        .try_fold(0.0f64, |worst, r| r.map(|r| worst.max(r)))
}

/// `v` of one seed's evaluations at `scale`: linear in log(scale) between the evaluated scales
/// around it, the nearest evaluated value outside them (`pts` sorted by scale).
fn at_scale(pts: &[(f64, f64)], scale: f64) -> Option<f64> {
    let (first, last) = (pts.first()?, pts.last()?);
    if scale <= first.0 {
        return Some(first.1);
    }
    if scale >= last.0 {
        return Some(last.1);
    }
    let k = pts.partition_point(|p| p.0 <= scale);
    let ((xa, ya), (xb, yb)) = (pts[k - 1], pts[k]);
    if xb <= xa {
        return Some(ya);
    }
    let f = (scale.ln() - xa.ln()) / (xb.ln() - xa.ln());
    Some(ya + (yb - ya) * f)
}

/// Points of the curve grid: 48 load scales spread evenly in log scale over every evaluated
/// scale of the study.
fn grid(st: &CapacityStudy) -> Vec<f64> {
    let scales = st
        .policies
        .iter()
        .flat_map(|p| p.seeds.iter())
        .flat_map(|s| s.evaluations.iter())
        .map(|e| e.scale)
        .filter(|s| *s > 0.0);
    let (lo, hi) = scales.fold((f64::INFINITY, 0.0f64), |(a, b), s| (a.min(s), b.max(s)));
    if !(lo.is_finite() && hi > lo) {
        return Vec::new();
    }
    const N: usize = 48;
    (0..N)
        .map(|i| (lo.ln() + (hi.ln() - lo.ln()) * i as f64 / (N - 1) as f64).exp())
        .collect()
}

/// One policy's curve across seeds on `grid`: `(scale, mean, 95 % low, high)`; each seed's
/// evaluations are read at the grid's scales ([`at_scale`]), over the scales every seed
/// evaluated around (none is extrapolated past its last evaluation; when the seeds' ranges do
/// not overlap, each is held at its nearest value instead).
fn mean_curve(st: &CapacityStudy, i: usize, grid: &[f64]) -> Vec<(f64, f64, f64, f64)> {
    let per_seed: Vec<Vec<(f64, f64)>> = st.policies[i]
        .seeds
        .iter()
        .map(|s| {
            let mut pts: Vec<(f64, f64)> = s
                .evaluations
                .iter()
                .filter_map(|e| slo_value(st, e).map(|v| (e.scale, v)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            pts
        })
        .filter(|p| !p.is_empty())
        .collect();
    let lo = per_seed.iter().map(|p| p[0].0).fold(0.0, f64::max);
    let hi = per_seed
        .iter()
        .map(|p| p[p.len() - 1].0)
        .fold(f64::INFINITY, f64::min);
    let covered = |x: f64| hi <= lo || (x >= lo * (1.0 - 1e-9) && x <= hi * (1.0 + 1e-9));
    // The grid, plus the scales the seeds evaluated (where the curve bends), within the range.
    let mut xs: Vec<f64> = grid
        .iter()
        .copied()
        .chain(per_seed.iter().flat_map(|p| p.iter().map(|q| q.0)))
        .filter(|&x| x > 0.0 && covered(x))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs.iter()
        .filter_map(|&x| {
            let iv = Interval::of(per_seed.iter().filter_map(|p| at_scale(p, x)))?;
            Some((x, iv.mean, iv.low(), iv.high()))
        })
        .collect()
}

/// The chart a person reads at a glance: each policy's SLO curve against load (its mean across
/// seeds, the 95 % band around it), the target as a dashed line, and each policy's capacity
/// marked as a diamond on that line with its interval as a whisker; beside it, the capacities
/// as bars with their intervals.
fn capacity_figure(st: &CapacityStudy) -> Figure {
    let x_label = "load scale (x the scenario's arrival rate)";
    let grid = grid(st);
    let (title, y_label, limit, limit_label) = match st.slo.target {
        Some(t) => (
            "SLO attainment vs load: mean across seeds, 95 % band; diamonds: capacity",
            "requests meeting every bound",
            t,
            format!("target {}", crate::num::fmt_pct(Some(t))),
        ),
        None => (
            "worst SLO bound vs load: mean across seeds, 95 % band; diamonds: capacity",
            "worst bound's value / its limit",
            1.0,
            "SLO limit".to_string(),
        ),
    };
    let mut curve = LinePanel::new(title, x_label, y_label);
    curve.x_log = true;
    curve.legend = Legend::None;
    if st.slo.target.is_some() {
        curve.y_percent = true;
        curve.y_range = Some((0.0, 1.05));
    } else {
        // Past its knee a policy's latency grows by orders of magnitude: only a log axis keeps
        // the curves near the limit readable.
        curve.y_log = true;
    }
    curve.reference_lines.push((limit, limit_label));
    for (i, p) in st.policies.iter().enumerate() {
        let color = chart::color(i);
        let pts = mean_curve(st, i, &grid);
        curve.series.push(Series {
            name: p.policy.clone(),
            color,
            points: pts.iter().map(|&(x, m, _, _)| (x, m)).collect(),
        });
        if pts.iter().any(|&(_, _, l, h)| h > l) {
            let clamp = |v: f64| {
                if st.slo.target.is_some() {
                    v.clamp(0.0, 1.0)
                } else {
                    v
                }
            };
            curve.bands.push(Band {
                color,
                points: pts
                    .iter()
                    .map(|&(x, _, l, h)| (x, clamp(l), clamp(h)))
                    .collect(),
            });
        }
        if let Some(iv) = p.interval().filter(|iv| iv.mean > 0.0) {
            curve.knees.push(Knee {
                color,
                x: iv.mean,
                y: limit,
                x_low: iv.low().max(iv.mean / 1e3),
                x_high: iv.high(),
            });
        }
    }
    let bars = BarPanel {
        title: "capacity per policy (mean across seeds, 95 % interval)".into(),
        x_label: String::new(),
        y_label: "load scale".into(),
        categories: st.policies.iter().map(|p| p.policy.clone()).collect(),
        groups: vec![BarGroup {
            name: "capacity".into(),
            color: chart::color(0),
            values: st
                .policies
                .iter()
                .map(|p| p.interval().map(|i| i.mean))
                .collect(),
            errors: st
                .policies
                .iter()
                .map(|p| {
                    p.interval()
                        .and_then(|i| i.half_width.map(|_| (i.low().max(0.0), i.high())))
                })
                .collect(),
        }],
        y_percent: false,
        color_by_category: true,
    };
    let mut fig = Figure::new(
        format!("Capacity at the SLO: {}", st.scenario),
        vec![Panel::Lines(curve), Panel::Bars(bars)],
    );
    fig.panel_height = 420;
    fig.legend = st
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| (p.policy.clone(), chart::color(i)))
        .collect();
    fig
}

fn ratio_text(st: &CapacityStudy, i: usize) -> (String, String, String) {
    if i == st.baseline {
        return ("1 (baseline)".into(), String::new(), String::new());
    }
    match st.ratio(i) {
        Some(r) => (
            format!("{}x", fmt_sig(Some(r.mean), 3)),
            interval_text::bounds(&r, 3).unwrap_or_else(|| "-".into()),
            if st.established(i) {
                if r.mean > 1.0 { "more" } else { "less" }.to_string()
            } else {
                "not established".into()
            },
        ),
        None => ("-".into(), "-".into(), "-".into()),
    }
}

/// The console table: one row per policy, then the rule and why seeds stopped.
pub fn capacity_table(st: &CapacityStudy) -> String {
    let mut t = TextTable::new(&[
        ("policy", false),
        ("capacity (scale)", true),
        ("95%", true),
        ("req/s", true),
        ("vs baseline", true),
        ("paired 95%", true),
        ("verdict", false),
    ]);
    for (i, p) in st.policies.iter().enumerate() {
        let (mean, hw) = interval_text::columns(p.interval(), 3);
        let rate = fmt_sig(st.rate(i).map(|r| r.mean), 3);
        let (ratio, ci, verdict) = ratio_text(st, i);
        t.row(vec![p.policy.clone(), mean, hw, rate, ratio, ci, verdict]);
    }
    let mut s = format!("{} — capacity at the SLO {}\n", st.scenario, st.slo);
    s.push_str(&t.render());
    s.push_str(&format!("{}\n", super::ship_sentence(st)));
    if let Some(o) = &st.out_of_sample {
        s.push_str(&format!("{}\n", o.sentence()));
    }
    s.push_str(&format!("{}\n", crate::question::CAPACITY));
    for p in &st.policies {
        for note in [p.censored_note(), p.rejection_note()] {
            if !note.is_empty() {
                s.push_str(&format!("note: {}: {note}\n", p.policy));
            }
        }
    }
    s.push_str(&format!(
        "\nSLO holds when {}.\nLoad scale 1 = {} req/s; precision {}%; seeds {} ({}).\n",
        st.slo.rule(),
        fmt_sig(st.base_rate_per_s, 3),
        st.precision * 100.0,
        st.seeds.len(),
        stop_text(st),
    ));
    if !st.seed_meaning.0.is_empty() {
        s.push_str(&format!("{}\n", st.seed_meaning.0));
    }
    s
}

fn capacity_html(st: &CapacityStudy, svg: &str) -> String {
    let mut page = Page::new("routelab capacity");
    page.el("h1", None, "routelab capacity");
    page.el("h2", None, &format!("Capacity at the SLO: {}", st.scenario));
    if !st.description.is_empty() {
        page.el("p", Some("desc"), &st.description);
    }
    // The report opens with what to do: the policy to ship, and whether it held out of sample.
    page.el("p", Some("lead"), &super::ship_sentence(st));
    if let Some(o) = &st.out_of_sample {
        page.el("p", Some("lead"), &o.sentence());
    }
    page.el("p", Some("meta"), crate::question::CAPACITY);
    if !st.seed_meaning.0.is_empty() {
        page.el("p", Some("meta"), &st.seed_meaning.0);
    }
    page.el(
        "p",
        Some("meta"),
        &format!(
            "SLO {} — holds when {}. Load scale 1 = {} req/s (the scenario's mean arrival rate); \
             search precision {}%; {} seed{} ({}). {}.",
            st.slo,
            st.slo.rule(),
            fmt_sig(st.base_rate_per_s, 3),
            st.precision * 100.0,
            st.seeds.len(),
            if st.seeds.len() == 1 { "" } else { "s" },
            stop_text(st),
            ACROSS_SEEDS,
        ),
    );
    let means: Vec<Option<f64>> = st
        .policies
        .iter()
        .map(|p| p.interval().map(|i| i.mean))
        .collect();
    let best = best_indices(&means, false);
    let rows: Vec<(bool, Vec<Cell>)> = st
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (mean, hw) = interval_text::columns(p.interval(), 3);
            let (ratio, ci, verdict) = ratio_text(st, i);
            (
                false,
                vec![
                    Cell::text(p.policy.clone()),
                    Cell::num(mean).best(best.contains(&i)),
                    Cell::num(hw),
                    Cell::num(fmt_sig(st.rate(i).map(|r| r.mean), 3)),
                    Cell::num(ratio),
                    Cell::num(ci),
                    Cell::text(verdict),
                ],
            )
        })
        .collect();
    page.raw(&table(
        &[
            ("policy", true),
            ("capacity (load scale)", false),
            ("95 %", false),
            ("req/s", false),
            ("vs baseline", false),
            ("paired 95 %", false),
            ("verdict", true),
        ],
        &rows,
    ));
    for p in &st.policies {
        for note in [p.censored_note(), p.rejection_note()] {
            if !note.is_empty() {
                page.el("p", Some("meta"), &format!("{}: {note}", p.policy));
            }
        }
    }
    page.figure(
        svg,
        &format!(
            "Left: {} against load, each policy's mean across seeds (line) and 95 % band; the \
             dashed line is the {}; a diamond marks each policy's capacity (its mean across \
             seeds, where it crosses that line) with its 95 % interval as a whisker. Right: the \
             capacities with their intervals. Every evaluated scale is in \
             capacity_evaluations.csv.",
            if st.slo.target.is_some() {
                "SLO attainment (the share of requests within every bound)"
            } else {
                "the worst bound's value over its limit"
            },
            if st.slo.target.is_some() {
                "target"
            } else {
                "limit (the SLO holds below it)"
            }
        ),
    );
    page.raw(
        "<p class=\"meta\"><a href=\"capacity.json\">capacity.json</a> · \
         <a href=\"capacity.csv\">capacity.csv</a> · \
         <a href=\"capacity_evaluations.csv\">capacity_evaluations.csv</a></p>",
    );
    page.finish()
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::super::*;
    use super::*;

    fn study() -> CapacityStudy {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        let mut st = fixture::study(&spec, &["base", "fast"], 2, 0.5, |p, seed| {
            8.0 * if p == 1 { 2.0 } else { 1.0 } * (1.0 + seed as f64 / 10.0)
        });
        st.description = "d".into();
        st
    }

    /// Issue 41: requests refused for the context window are named in the console, the
    /// report and capacity.json (they were in none); a study without any writes no such key.
    #[test]
    fn rejections_are_named_in_every_output_and_only_when_there_are_some() {
        let mut st = study();
        let dir =
            std::env::temp_dir().join(format!("routelab-capacity-rej-{}", std::process::id()));
        write_capacity(&dir, &st).unwrap();
        let json = std::fs::read_to_string(dir.join("capacity.json")).unwrap();
        assert!(!json.contains("rejected") && !capacity_table(&st).contains("refused"));

        st.policies[1].seeds[1].evaluations[0].rejected = Rejected {
            total: 3,
            context_window: 2,
            no_worker: 0,
            largest_window: 32_768,
            longest_request: 59_000,
        };
        let table = capacity_table(&st);
        assert!(
            table.contains("note: fast: requests refused on 1/2 seeds; the most at seed 2")
                && table.contains(
                    "3 request(s) rejected: 2 because prompt + output exceed every worker's \
                     context window (the largest is 32768 tokens; the longest refused request \
                     59000 tokens); 1 for a reason the host did not report"
                ),
            "{table}"
        );
        assert!(!table.contains("note: base: requests refused"), "{table}");
        write_capacity(&dir, &st).unwrap();
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("capacity.json")).unwrap())
                .unwrap();
        assert!(
            json["policies"][1]["rejected"]
                .as_str()
                .is_some_and(|r| r.contains("context window"))
        );
        assert!(json["policies"][0].get("rejected").is_none());
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(
            html.contains("fast: requests refused on 1/2 seeds"),
            "report.html"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_output_is_written_and_names_the_rule() {
        let st = study();
        let dir = std::env::temp_dir().join(format!("routelab-capacity-{}", std::process::id()));
        let w = write_capacity(&dir, &st).unwrap();
        let names: Vec<String> = w
            .files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "capacity.json",
                "capacity.csv",
                "capacity_evaluations.csv",
                "capacity.svg",
                "capacity.png",
                "report.html"
            ]
        );
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("capacity.json")).unwrap())
                .unwrap();
        assert_eq!(json["baseline"], "base");
        assert_eq!(json["seed_stop"], "fixed");
        assert_eq!(json["policies"][1]["established"], true);
        let ratio = json["policies"][1]["ratio_to_baseline"]["mean"]
            .as_f64()
            .unwrap();
        assert!((ratio - 2.0).abs() < 0.05, "{ratio}");
        let csv = std::fs::read_to_string(dir.join("capacity.csv")).unwrap();
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.lines().nth(1).unwrap().starts_with("base,true,2,"));
        let evals = std::fs::read_to_string(dir.join("capacity_evaluations.csv")).unwrap();
        assert!(
            evals.starts_with("policy,seed,step,scale,holds,attainment,ttft_p99_s,e2el_mean_s\n")
        );
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(html.contains("Capacity at the SLO: s") && html.contains("<svg"));
        let table = capacity_table(&st);
        assert!(table.contains("1 (baseline)"), "{table}");
        assert!(table.contains("more"), "{table}");
        assert!(
            table.contains("SLO holds when every bound holds"),
            "{table}"
        );
        // Issue 41: which question the ranking answers, and where the other is answered.
        assert!(table.contains(crate::question::CAPACITY), "{table}");
        assert!(
            html.contains("`routelab compare` ranks them at the scenario&#39;s own load")
                || html.contains("`routelab compare` ranks them at the scenario's own load")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
