//! `perf.json`: the wall-clock figures of `run` and `compare`, kept apart from the
//! deterministic outputs (the one output that differs between identical runs).

use crate::error::ReportError;
use crate::export::create_dir;
use crate::export::json::write_json;
use crate::num::r6;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Wall-clock figures of a command, kept apart from the deterministic outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerfInfo {
    /// Whole command, wall seconds.
    pub total_wall_s: f64,
    /// Worker threads used.
    pub threads: usize,
    /// Per simulation.
    pub runs: Vec<PerfRun>,
}

/// Wall-clock figures of one simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerfRun {
    /// Scenario name.
    pub scenario: String,
    /// Policy.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Wall seconds.
    pub wall_s: f64,
    /// Events the simulator processed.
    pub sim_events: u64,
    /// Simulated seconds.
    pub simulated_s: f64,
}

#[derive(Serialize)]
struct PerfOut<'a> {
    total_wall_s: Option<f64>,
    threads: usize,
    runs: Vec<PerfRunOut<'a>>,
}

#[derive(Serialize)]
struct PerfRunOut<'a> {
    scenario: &'a str,
    policy: &'a str,
    seed: u64,
    wall_s: Option<f64>,
    sim_events: u64,
    events_per_s: Option<f64>,
    simulated_s: Option<f64>,
    speedup: Option<f64>,
}

/// Write `perf.json` (wall-clock figures, not reproducible) into `dir`; returns its path.
pub fn write_perf(dir: &Path, perf: &PerfInfo) -> Result<PathBuf, ReportError> {
    create_dir(dir)?;
    let p = dir.join("perf.json");
    let ratio = |a: f64, b: f64| if b > 0.0 { r6(a / b) } else { None };
    let out = PerfOut {
        total_wall_s: r6(perf.total_wall_s),
        threads: perf.threads,
        runs: perf
            .runs
            .iter()
            .map(|r| PerfRunOut {
                scenario: &r.scenario,
                policy: &r.policy,
                seed: r.seed,
                wall_s: r6(r.wall_s),
                sim_events: r.sim_events,
                events_per_s: ratio(r.sim_events as f64, r.wall_s),
                simulated_s: r6(r.simulated_s),
                speedup: ratio(r.simulated_s, r.wall_s),
            })
            .collect(),
    };
    write_json(&p, &out)?;
    Ok(p)
}
