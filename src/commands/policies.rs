//! `routelab policies`: what the policy crate offers, as a readable table.

use routelab_policies::{Affinity, Cap, Chooser, PRESETS, WeightsConfig};
use std::io::Write;
use std::process::ExitCode;

const WEIGHTS: &[(&str, &str)] = &[
    (
        "table",
        "v1: weight from a GPU-name table (RTX 4090 1.75, RTX 5090 2.5, H100 3.5; sum over cards; unknown 1.0)",
    ),
    (
        "live",
        "v2: every 3 min, median per-request speed x busy fraction / median of peers, blended with the table",
    ),
    (
        "probe",
        "v3: 16 x 128-token burst; throughput / median of the model's workers, clamped [0.25, 8]; warm-up, 6 h cache, pins",
    ),
    (
        "oracle",
        "lab only: the simulator's true capacity, relative to the median (the best any estimator could do)",
    ),
    ("equal", "every worker 1.0: plain least-loaded balancing"),
    (
        "at-load",
        "ours: capacity measured passively from live traffic while the worker is busy; no GPU cost, reacts in minutes",
    ),
];

const CHOOSERS: &[(&str, &str)] = &[
    (
        "p2c",
        "power of two choices on in_flight / weight; ties: first | random | higher-weight",
    ),
    (
        "sed",
        "shortest expected delay: p2c on (in_flight + 1) / weight, the load after adding the request",
    ),
    (
        "jsq",
        "join the shortest queue: full scan on in_flight / weight",
    ),
    (
        "least-request",
        "Envoy's least-request: p2c on weight / (active + 1)^bias",
    ),
    ("wrr", "smooth weighted round-robin (ignores load)"),
    ("random", "uniform random among eligible workers"),
    ("round-robin", "plain round-robin among eligible workers"),
];

const AFFINITIES: &[(&str, &str)] = &[
    ("none", "ignore prompt prefixes"),
    (
        "raw",
        "keep the prefix holder unless its raw in-flight count exceeds the freest's by an allowance growing with prompt length",
    ),
    (
        "capacity",
        "the same rule in in_flight / weight units, the unit of the main choice",
    ),
];

const CAPS: &[(&str, &str)] = &[
    ("none", "no per-worker concurrency cap"),
    (
        "flat",
        "the same cap for every worker (default 24); requests queue FIFO at the gateway when all are full",
    ),
    (
        "weighted",
        "the cap scaled by weight (24 x weight, at least 1)",
    ),
];

/// Print the catalogue.
pub fn run(out: &mut impl Write) -> anyhow::Result<ExitCode> {
    // The lists above must stay in step with the crate's own names.
    debug_assert_eq!(WEIGHTS.len(), WeightsConfig::NAMES.len());
    debug_assert_eq!(CHOOSERS.len(), Chooser::NAMES.len());
    debug_assert_eq!(AFFINITIES.len(), Affinity::NAMES.len());
    debug_assert_eq!(CAPS.len(), Cap::NAMES.len());
    section(out, "weights", WEIGHTS)?;
    section(out, "chooser", CHOOSERS)?;
    section(out, "affinity", AFFINITIES)?;
    section(out, "cap", CAPS)?;
    let presets: Vec<(&str, &str)> = PRESETS.iter().map(|p| (p.name, p.description)).collect();
    section(out, "presets", &presets)?;
    writeln!(
        out,
        "\nA policy is a preset or a composition WEIGHTS[/CHOOSER[:TIES]][/AFFINITY][/CAP[:N]],\n\
         e.g. `at-load/sed/capacity/weighted:24`; omitted parts default to p2c:higher-weight,\n\
         capacity, flat:24."
    )?;
    Ok(ExitCode::SUCCESS)
}

fn section(out: &mut impl Write, title: &str, rows: &[(&str, &str)]) -> anyhow::Result<()> {
    writeln!(out, "{title}:")?;
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, text) in rows {
        writeln!(out, "  {name:<width$}  {text}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crate_name_is_described() {
        fn names(rows: &[(&'static str, &'static str)]) -> Vec<&'static str> {
            rows.iter().map(|r| r.0).collect()
        }
        assert_eq!(names(WEIGHTS), WeightsConfig::NAMES);
        assert_eq!(names(CHOOSERS), Chooser::NAMES);
        assert_eq!(names(AFFINITIES), Affinity::NAMES);
        assert_eq!(names(CAPS), Cap::NAMES);
        let mut buf = Vec::new();
        run(&mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for p in PRESETS {
            assert!(text.contains(p.name), "{} missing", p.name);
        }
    }
}
