//! `routelab sweep SCENARIO --set path.to.field=v1,v2`: a parameter grid, run in parallel.
//!
//! A `--set` path addresses the scenario's YAML: `traffic[0].poisson.rate_per_s`,
//! `fleet[1].speed_factor`, `slo.ttft_s`. Several `--set` make a grid (their cartesian product).
//! `--seeds N` runs every point and policy on N seeds, `first + k` for k = 0, 1, … from the
//! scenario's seed (or `--seed`), by the rule `compare` uses too (`stats::seed_of`), and reports
//! the mean and 95 % interval across them.

use crate::lab::{Job, run_all};
use anyhow::Context;
use routelab_policies::located::rule;
use routelab_reports::{SweepRow, sweep_table, write_sweep};
use routelab_sim::Scenario;
use routelab_sim::sweep::{Axis, grid};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `routelab sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Scenario YAML file.
    pub scenario: PathBuf,
    /// `path=v1,v2,...`, e.g. traffic[0].poisson.rate_per_s=1,2,4.
    #[arg(long, required = true)]
    pub set: Vec<String>,
    /// Policy; repeat for several. Default: the scenario's list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seed (default: the scenario's); with `--seeds N` the first of N.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seeds per grid point and policy: the mean and 95 % interval across them go to
    /// sweep.csv, the table and report.html; every run to sweep_seeds.csv.
    #[arg(long, default_value_t = 1.0, value_name = "N")]
    pub seeds: f64,
    /// Output directory (default: out/<scenario name>/sweep/).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Run it.
pub fn run(args: &SweepArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !args.set.is_empty(),
        "give at least one --set path=v1,v2,..."
    );
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("{}: cannot read", args.scenario.display()))?;
    // Validate the base scenario first, for located errors.
    let base = Scenario::from_yaml(&text, &args.scenario)?;
    let axes = args
        .set
        .iter()
        .map(|s| Axis::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let params: Vec<String> = axes.iter().map(|a| a.path.clone()).collect();
    let points = grid(&text, &args.scenario, &axes)?;
    let policies = super::run::policies_for(&base, &args.policies)?;
    let seeds = rule::whole(args.seeds, 1, super::compare::MAX_SEEDS_LIMIT)
        .map_err(|v| v.at_field(super::compare::COMMAND_LINE, "--seeds"))? as usize;
    let first_seed = args.seed.unwrap_or(base.setup.seed);
    let mut jobs = Vec::new();
    for point in &points {
        for p in &policies {
            for k in 0..seeds {
                jobs.push(Job {
                    scenario: &point.scenario,
                    policy: p,
                    seed: routelab_reports::stats::seed_of(first_seed, k),
                    rows: false,
                });
            }
        }
    }
    let bar = super::compare::progress(jobs.len() as u64, "sweep");
    let outcomes = run_all(&jobs, &|| {
        if let Some(b) = &bar {
            b.inc(1);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // Results come back in job order, so the outputs do not depend on the thread count.
    let mut rows: Vec<SweepRow> = Vec::new();
    let mut it = jobs.iter().zip(&outcomes);
    for point in &points {
        for p in &policies {
            let mut row = SweepRow::new(point.labels.clone(), p.name.clone());
            for _ in 0..seeds {
                let (job, o) = it.next().context("one outcome per job")?;
                row.runs.push(job.seed, &o.metrics);
            }
            rows.push(row);
        }
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(&base.name).join("sweep"));
    write_sweep(&dir, &base.name, &params, &rows)?;
    write!(out, "{}", sweep_table(&params, &rows))?;
    writeln!(out, "sweep: {}", dir.join("sweep.csv").display())?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}
