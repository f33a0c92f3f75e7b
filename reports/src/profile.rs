//! `routelab profile show`: a hardware profile as a terminal table and a chart; and
//! `routelab profile fit`'s check of the fitted profile against its inputs.

use std::path::Path;

use routelab_sim::HardwareProfile;
use routelab_sim::hardware::DecodeCurve;
use routelab_sim::hardware::fit::FittedProfile;

use crate::chart::{self, Figure, Legend, LinePanel, Panel, Series};
use crate::error::ReportError;
use crate::export::create_dir;
use crate::export::table::TextTable;
use crate::num::fmt_sig;
use crate::run::Written;

/// The concurrencies the table shows: powers of two up to `max_running`, `max_running` itself
/// and every measured point, sorted without repeats.
pub fn profile_concurrencies(p: &HardwareProfile) -> Vec<f64> {
    let top = f64::from(p.max_running());
    let mut cs: Vec<f64> = std::iter::successors(Some(1.0f64), |c| Some(c * 2.0))
        .take_while(|c| *c <= top)
        .collect();
    cs.push(top);
    if let DecodeCurve::Points(points) = p.decode() {
        cs.extend(points.iter().map(|pt| pt.concurrency));
    }
    cs.sort_by(f64::total_cmp);
    cs.dedup();
    cs
}

/// The profile as text: its curve (concurrency, aggregate and per-request tokens/s, step time)
/// and every other field with its unit.
pub fn profile_text(p: &HardwareProfile) -> String {
    let mut out = format!("{}  ({})\n", p.name(), p.origin());
    if !p.description().is_empty() {
        out.push_str(p.description());
        out.push('\n');
    }
    let gpus = if p.gpu_names().is_empty() {
        "unknown".to_string()
    } else {
        p.gpu_names().join(" + ")
    };
    out.push_str(&format!("GPUs: {gpus}\n\n"));
    let shape = match p.decode() {
        DecodeCurve::Points(points) => format!(
            "{} measured points; linear from 0 below the first, flat beyond the last",
            points.len()
        ),
        DecodeCurve::Parametric {
            single_tok_s,
            saturation_tok_s,
            half_concurrency,
        } => format!(
            "parametric: {} tok/s at 1, half-way to {} tok/s at {}",
            fmt_sig(Some(*single_tok_s), 4),
            fmt_sig(Some(*saturation_tok_s), 4),
            fmt_sig(Some(*half_concurrency), 3)
        ),
        _ => "another curve form".to_string(),
    };
    out.push_str(&format!("decode curve ({shape})\n"));
    let mut t = TextTable::new(&[
        ("concurrency", true),
        ("aggregate (tok/s)", true),
        ("per request (tok/s)", true),
        ("step time (ms)", true),
    ]);
    for c in profile_concurrencies(p) {
        t.row(vec![
            fmt_sig(Some(c), 1),
            fmt_sig(Some(p.aggregate_tok_s(c)), 4),
            fmt_sig(Some(p.per_request_tok_s(c)), 4),
            fmt_sig(Some(p.step_time_s(c) * 1000.0), 4),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let cold = p.cold_start();
    let cold = if cold.warmup_tokens == 0.0 || cold.speed_factor == 1.0 {
        "none".to_string()
    } else {
        format!(
            "rates x {} until {} tokens of work since ready",
            fmt_sig(Some(cold.speed_factor), 2),
            fmt_sig(Some(cold.warmup_tokens), 1)
        )
    };
    let mut f = TextTable::new(&[("field", false), ("value", false)]);
    for (k, v) in [
        (
            "prefill_tok_s",
            format!("{} tok/s", fmt_sig(Some(p.prefill_tok_s()), 4)),
        ),
        (
            "prefill_chunk_tokens",
            format!("{} tokens per step", p.prefill_chunk_tokens()),
        ),
        (
            "prefill_overlap",
            format!(
                "{}: a full chunk beside {} decodes takes {} ms (decode alone {} ms)",
                fmt_sig(Some(p.prefill_overlap()), 2),
                p.max_running().min(16),
                fmt_sig(
                    Some(
                        p.mixed_step_time_s(
                            f64::from(p.max_running().min(16)),
                            f64::from(p.prefill_chunk_tokens())
                        ) * 1000.0
                    ),
                    3
                ),
                fmt_sig(
                    Some(p.step_time_s(f64::from(p.max_running().min(16))) * 1000.0),
                    3
                )
            ),
        ),
        (
            "kv_capacity_tokens",
            format!("{} tokens", p.kv_capacity_tokens()),
        ),
        ("max_running", format!("{} sequences", p.max_running())),
        ("context_window", format!("{} tokens", p.context_window())),
        ("cold_start", cold),
    ] {
        f.row(vec![k.to_string(), v]);
    }
    out.push_str(&f.render());
    for (title, items) in [
        ("sources", p.sources()),
        ("fitted", p.fitted()),
        ("extrapolated", p.extrapolated()),
    ] {
        if items.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{title}:\n"));
        for it in items {
            out.push_str(&format!("  - {it}\n"));
        }
    }
    out
}

/// The chart of a profile: aggregate, per-request tokens/s and step time over concurrency
/// (log scale, 1 to the larger of `max_running` and the last measured point).
pub(crate) fn profile_figure(p: &HardwareProfile) -> Figure {
    let cs = profile_concurrencies(p);
    let top = cs.last().copied().unwrap_or(1.0);
    // eight samples per doubling, plus the table's concurrencies (the curve's corners)
    let mut xs: Vec<f64> = (0..)
        .map(|k| 2f64.powf(f64::from(k) / 8.0))
        .take_while(|c| *c < top)
        .collect();
    xs.extend(&cs);
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let panel = |title: &str, unit: &str, f: &dyn Fn(f64) -> f64| {
        let mut lp = LinePanel::new(title, "concurrent sequences (log scale)", unit);
        lp.x_log = true;
        lp.legend = Legend::None;
        lp.series = vec![Series {
            name: p.name().to_string(),
            color: chart::color(0),
            points: xs.iter().map(|&c| (c, f(c))).collect(),
        }];
        Panel::Lines(lp)
    };
    let mut fig = Figure::new(
        format!("Hardware profile {}", p.name()),
        vec![
            panel("Aggregate decode throughput", "tok/s", &|c| {
                p.aggregate_tok_s(c)
            }),
            panel("Per-request decode speed", "tok/s", &|c| {
                p.per_request_tok_s(c)
            }),
            panel("Decode step time", "ms", &|c| p.step_time_s(c) * 1000.0),
        ],
    );
    fig.panel_height = 280;
    fig
}

/// Writes `dir/profile-<name>.svg` and `.png`.
pub fn write_profile_chart(p: &HardwareProfile, dir: &Path) -> Result<Written, ReportError> {
    create_dir(dir)?;
    let stem = format!("profile-{}", crate::num::slug(p.name()));
    let r = chart::render(&profile_figure(p), dir, &stem)?;
    Ok(Written {
        files: vec![r.svg_path, r.png_path],
    })
}

/// How well the fitted profile reproduces its inputs: each point's error, then the warnings.
pub fn fit_report(fitted: &FittedProfile) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fit check: each input point against the fitted profile (a closed loop simulated on \
         the simulator's engine, a pure-decode point read off the curve)"
    );
    let _ = writeln!(
        s,
        "{:<36} {:>11} {:<25} {:>10} {:>10} {:>8}",
        "source", "concurrency", "figure", "measured", "fitted", "error"
    );
    for e in &fitted.errors {
        let _ = writeln!(
            s,
            "{:<36} {:>11} {:<25} {:>10.2} {:>10.2} {:>+7.1}%",
            e.source,
            e.concurrency,
            e.what,
            e.measured,
            e.fitted,
            e.relative() * 100.0
        );
    }
    if let Some(o) = &fitted.overlap_fit {
        let _ = writeln!(
            s,
            "prefill_overlap {:.3}{} fitted against {}",
            o.value,
            o.std_error
                .map(|e| format!(" ± {e:.3}"))
                .unwrap_or_default(),
            o.against
        );
    }
    for w in &fitted.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundled(name: &str) -> HardwareProfile {
        let src = routelab_sim::hardware::BUNDLED
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap()
            .1;
        HardwareProfile::from_yaml_str(src, &format!("bundled:{name}")).unwrap()
    }

    #[test]
    fn concurrencies_cover_powers_points_and_the_limit() {
        let p = bundled("rtx-pro-6000-27b");
        assert_eq!(
            profile_concurrencies(&p),
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
        );
        let mac = bundled("mac-m2-ultra-27b");
        assert_eq!(profile_concurrencies(&mac), vec![1.0, 2.0, 4.0, 8.0]);
    }

    #[test]
    fn text_has_curve_and_fields() {
        let t = profile_text(&bundled("rtx-pro-6000-27b"));
        // 688 tok/s at 8 is 86 per request and an 11.63 ms step
        assert!(
            t.contains("688.0") && t.contains("86.00") && t.contains("11.63"),
            "{t}"
        );
        assert!(t.contains("230000 tokens"), "{t}");
        assert!(t.contains("rates x 0.25 until 2770 tokens"), "{t}");
        // the step model: a full 512-token chunk (85.3 ms alone) beside 16 decodes (14.9 ms)
        // lasts 85.3 + 0.6 x 14.9 = 94.3 ms at the default overlap 0.4
        assert!(
            t.contains("prefill_overlap       0.40: a full chunk beside 16 decodes takes 94.3 ms"),
            "{t}"
        );
        assert!(t.contains("extrapolated:\n  - decode.points[2]"), "{t}");
    }

    #[test]
    fn chart_is_written() {
        let dir =
            std::env::temp_dir().join(format!("routelab-profile-chart-{}", std::process::id()));
        let w = write_profile_chart(&bundled("mac-m2-ultra-27b"), &dir).unwrap();
        assert_eq!(w.files.len(), 2);
        let svg = std::fs::read_to_string(&w.files[0]).unwrap();
        assert!(
            svg.contains("Per-request decode speed"),
            "svg lacks a panel title"
        );
        assert!(std::fs::metadata(&w.files[1]).unwrap().len() > 1000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
