//! How `compare`'s figures are written as text: labels, `mean ± half-width`, paired
//! differences and the notes on seeds, shared by its page, its console table and its findings.

use super::{PairedDiff, ScenarioComparison, interval};
use crate::export::html::best_indices;
use crate::interval_text;
use crate::metric::{CATALOG, Direction, Metric, Unit, view, views};
use crate::num::fmt_sig;
use crate::stats::{Interval, SeedStop};

/// Each metric's interval for each policy of `sc` (`[metric][policy]`) and, per metric, the
/// policies whose mean is best (ties included): what the page and the console table mark.
pub(super) fn intervals_and_best(
    sc: &ScenarioComparison,
    metrics: &[&Metric],
) -> (Vec<Vec<Option<Interval>>>, Vec<Vec<usize>>) {
    let ivs: Vec<Vec<Option<Interval>>> = metrics
        .iter()
        .map(|m| sc.policies.iter().map(|p| interval(p, m)).collect())
        .collect();
    let best = metrics
        .iter()
        .zip(&ivs)
        .map(|(m, col)| {
            let means: Vec<Option<f64>> = col.iter().map(|iv| iv.map(|i| i.mean)).collect();
            best_indices(&means, m.direction == Direction::Lower)
        })
        .collect();
    (ivs, best)
}

/// Metrics shown in the HTML table, its winners and the findings.
pub(super) fn key_metrics() -> impl Iterator<Item = &'static Metric> {
    views::COMPARE_KEY.iter().map(|n| view(n))
}

/// A metric's label with its unit where the label does not already say it.
pub(super) fn column_label(m: &Metric) -> String {
    match m.unit {
        Unit::Seconds => format!("{} (s)", m.label),
        _ => m.label.to_string(),
    }
}

pub(super) fn fmt_metric(m: &Metric, v: Option<f64>) -> String {
    m.fmt_stat(v)
}

/// Whether no run of the scenario depended on its seed: at least two seeds, and every policy
/// got the very same value of every catalog metric on each.
pub(super) fn seed_independent(sc: &ScenarioComparison) -> bool {
    sc.seeds_run() >= 2
        && sc.policies.iter().all(|p| {
            p.runs.windows(2).all(|w| {
                CATALOG
                    .iter()
                    .all(|m| w[0].summary.get(m) == w[1].summary.get(m))
            })
        })
}

/// Why a terminal cell reads `± 0`, decided from the runs: the whole scenario ignored its seed,
/// or only some figures did (named). Empty when no shown interval is `± 0`. `ivs` is by metric
/// (in `metrics` order), then policy.
pub(super) fn no_spread_note(
    sc: &ScenarioComparison,
    metrics: &[&Metric],
    ivs: &[Vec<Option<Interval>>],
) -> String {
    let zero: Vec<&str> = metrics
        .iter()
        .zip(ivs)
        .filter(|(_, col)| col.iter().flatten().any(interval_text::no_spread))
        .map(|(m, _)| m.label)
        .collect();
    if zero.is_empty() {
        String::new()
    } else if seed_independent(sc) {
        format!(
            "± 0: every seed gave identical results for every policy and metric ({} seeds): \
             nothing in this scenario depends on the seed (no random component: fixed arrivals \
             and sizes, no engine noise, no random routing choice that matters), so more seeds \
             add nothing\n",
            sc.seeds_run()
        )
    } else {
        format!(
            "± 0 ({}): every seed gave that policy the same value (it does not vary with the seed \
             here)\n",
            zero.join(", ")
        )
    }
}

/// A paired difference for a table: in % of the reference's mean with its 95 % interval
/// (`-4.9% [-6.1, -3.7]`), in the metric's unit when the reference is 0; `(1 seed)` when
/// there is no interval; `-` when no seed pairs.
pub(crate) fn fmt_diff(m: &Metric, d: &PairedDiff) -> String {
    let (Some(mean), true) = (d.mean, d.n > 0) else {
        return "-".into();
    };
    let rel = d.reference_mean.filter(|r| *r != 0.0);
    let show = |v: f64| match rel {
        Some(r) => format!("{:+.1}", v / r.abs() * 100.0),
        None if m.unit == Unit::Fraction => format!("{:+.1}", v * 100.0),
        None => {
            let s = fmt_sig(Some(v), 2);
            if s.starts_with('-') || s == "0" {
                s
            } else {
                format!("+{s}")
            }
        }
    };
    let unit = match (rel, m.unit) {
        (Some(_), _) => "%",
        (None, Unit::Fraction) => " pp",
        (None, _) => "",
    };
    match (d.ci95_low, d.ci95_high) {
        (Some(lo), Some(hi)) => format!("{}{unit} [{}, {}]", show(mean), show(lo), show(hi)),
        _ => format!("{}{unit} (1 seed)", show(mean)),
    }
}

/// How many seeds ran and what decided it, for the console and the report.
pub(crate) fn seed_rule_note(sc: &ScenarioComparison) -> String {
    let n = sc.seeds_run();
    let seeds = format!("{n} seed{}", if n == 1 { "" } else { "s" });
    match (sc.seed_stop, sc.auto_seeds) {
        (SeedStop::Fixed, _) | (_, None) => format!("{seeds} (fixed count)"),
        (SeedStop::Precise, Some(a)) => format!(
            "{seeds} (--seeds auto: stopped when every paired difference from the baseline on the \
             key metrics had a 95 % half-width within {:.1} % of the baseline's mean; at most {})",
            a.rel_half_width * 100.0,
            a.max
        ),
        (SeedStop::MaxSeeds, Some(a)) => format!(
            "{seeds} (--seeds auto: stopped at the maximum of {} seeds before every paired \
             difference was within {:.1} % of the baseline's mean)",
            a.max,
            a.rel_half_width * 100.0
        ),
    }
}
