//! The outputs of `routelab capacity`: `capacity.json`, `capacity.csv` (one row per policy),
//! `capacity_evaluations.csv` (every evaluated load scale), the chart `capacity.svg`/`.png`
//! (SLO attainment and TTFT p99 against load, each policy's knee marked), `report.html` and the
//! console table.

use super::CapacityStudy;
use crate::chart::{self, Figure, Legend, LinePanel, Panel, Series};
use crate::error::ReportError;
use crate::export::csv::write_csv;
use crate::export::html::{Cell, Page, best_indices, table};
use crate::export::json::write_json;
use crate::export::table::TextTable;
use crate::export::{create_dir, write_file};
use crate::num::{fmt_fixed, fmt_half_width, fmt_sig, r6};
use crate::run::Written;
use crate::stats::{Interval, SeedStop};
use serde_json::{Value, json};
use std::path::Path;

fn interval_json(iv: Option<Interval>) -> Value {
    match iv {
        Some(i) => json!({
            "n": i.n,
            "mean": r6(i.mean),
            "low": r6(i.low()),
            "high": r6(i.high()),
            "half_width": i.half_width.and_then(r6),
        }),
        None => Value::Null,
    }
}

fn stop_text(st: &CapacityStudy) -> String {
    let (hw, max) = st.auto_rule.unwrap_or_default();
    match st.seed_stop {
        SeedStop::Fixed => "fixed count (--seeds N)".into(),
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
            json!({
                "policy": p.policy,
                "baseline": i == st.baseline,
                "capacity_scale": interval_json(p.interval()),
                "capacity_rate_per_s": interval_json(st.rate(i)),
                "ratio_to_baseline": interval_json(st.ratio(i)),
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
            })
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

/// Every evaluation of a policy (all seeds), sorted by scale: `(scale, value)`.
fn points(
    st: &CapacityStudy,
    i: usize,
    value: impl Fn(&super::Evaluation) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = st.policies[i]
        .seeds
        .iter()
        .flat_map(|s| s.evaluations.iter())
        .filter_map(|e| value(e).map(|v| (e.scale, v)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    pts
}

fn capacity_figure(st: &CapacityStudy) -> Figure {
    let x_label = "load scale (x the scenario's arrival rate)";
    let mut attain = LinePanel::new(
        "SLO attainment vs load (vertical line: each policy's capacity)",
        x_label,
        "requests meeting every bound",
    );
    attain.y_percent = true;
    attain.y_range = Some((0.0, 1.05));
    attain.markers = true;
    attain.x_log = true;
    attain.legend = Legend::None;
    let mut ttft = LinePanel::new("TTFT p99 vs load (log scale)", x_label, "s");
    ttft.markers = true;
    ttft.x_log = true;
    // Past its knee a policy's TTFT grows by orders of magnitude: only a log axis keeps the
    // others' curves readable.
    ttft.y_log = true;
    ttft.legend = Legend::None;
    let ttft_max = (0..st.policies.len())
        .flat_map(|i| points(st, i, |e| e.ttft_p99_s))
        .map(|p| p.1)
        .fold(0.0f64, f64::max);
    let ttft_min = (0..st.policies.len())
        .flat_map(|i| points(st, i, |e| e.ttft_p99_s))
        .map(|p| p.1)
        .filter(|&v| v > 0.0)
        .fold(f64::INFINITY, f64::min);
    for (i, p) in st.policies.iter().enumerate() {
        let color = chart::color(i);
        attain.series.push(Series {
            name: p.policy.clone(),
            color,
            points: points(st, i, |e| e.attainment),
        });
        ttft.series.push(Series {
            name: p.policy.clone(),
            color,
            points: points(st, i, |e| e.ttft_p99_s),
        });
        if let Some(iv) = p.interval() {
            let knee = format!("{} capacity", p.policy);
            attain
                .series
                .push(Series::vertical_mark(&knee, color, iv.mean, (0.0, 1.0)));
            ttft.series.push(Series::vertical_mark(
                &knee,
                color,
                iv.mean,
                (ttft_min, ttft_max),
            ));
        }
    }
    let mut fig = Figure::new(
        format!("Capacity at the SLO: {}", st.scenario),
        vec![Panel::Lines(attain), Panel::Lines(ttft)],
    );
    fig.legend = st
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| (p.policy.clone(), chart::color(i)))
        .collect();
    fig
}

fn fmt_interval(iv: Option<Interval>, sig: i32) -> (String, String) {
    match iv {
        Some(i) => (
            fmt_sig(Some(i.mean), sig),
            i.half_width
                .map(|h| fmt_half_width(i.mean, h))
                .unwrap_or_else(|| "-".into()),
        ),
        None => ("-".into(), "-".into()),
    }
}

fn ratio_text(st: &CapacityStudy, i: usize) -> (String, String, String) {
    if i == st.baseline {
        return ("1 (baseline)".into(), String::new(), String::new());
    }
    match st.ratio(i) {
        Some(r) => (
            format!("{}x", fmt_sig(Some(r.mean), 3)),
            match r.half_width {
                Some(_) => format!(
                    "[{}, {}]",
                    fmt_sig(Some(r.low()), 3),
                    fmt_sig(Some(r.high()), 3)
                ),
                None => "-".into(),
            },
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
        let (mean, hw) = fmt_interval(p.interval(), 3);
        let rate = fmt_sig(st.rate(i).map(|r| r.mean), 3);
        let (ratio, ci, verdict) = ratio_text(st, i);
        t.row(vec![p.policy.clone(), mean, hw, rate, ratio, ci, verdict]);
    }
    let mut s = format!("{} — capacity at the SLO {}\n", st.scenario, st.slo);
    s.push_str(&t.render());
    for p in &st.policies {
        let note = p.censored_note();
        if !note.is_empty() {
            s.push_str(&format!("note: {}: {note}\n", p.policy));
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
    s
}

fn capacity_html(st: &CapacityStudy, svg: &str) -> String {
    let mut page = Page::new("routelab capacity");
    page.el("h1", None, "routelab capacity");
    page.el("h2", None, &format!("Capacity at the SLO: {}", st.scenario));
    if !st.description.is_empty() {
        page.el("p", Some("desc"), &st.description);
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
            let (mean, hw) = fmt_interval(p.interval(), 3);
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
        let note = p.censored_note();
        if !note.is_empty() {
            page.el("p", Some("meta"), &format!("{}: {note}", p.policy));
        }
    }
    page.figure(
        svg,
        "SLO attainment and TTFT p99 at every evaluated load scale (all seeds); vertical lines: \
         each policy's mean capacity.",
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
    use super::super::search::tests::ps_run;
    use super::super::*;
    use super::*;

    fn study() -> CapacityStudy {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        let plan = StudyPlan {
            scenario: "s".into(),
            description: "d".into(),
            policies: vec!["base".into(), "fast".into()],
            baseline: 0,
            first_seed: 1,
            seeds: SeedPlan::Fixed(2),
            slo: spec.clone(),
            options: SearchOptions::default(),
            base_rate_per_s: Some(0.5),
        };
        run_study(plan, |b| {
            b.iter()
                .map(|&(p, seed)| {
                    let speed = if p == 1 { 2.0 } else { 1.0 } * (1.0 + seed as f64 / 10.0);
                    find_capacity(&spec, &SearchOptions::default(), seed, |s| {
                        ps_run(s / speed)
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap()
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
