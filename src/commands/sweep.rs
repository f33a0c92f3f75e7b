//! `routelab sweep SCENARIO --set path.to.field=v1,v2`: a parameter grid, run in parallel.
//!
//! A `--set` path addresses the scenario's YAML: `traffic[0].poisson.rate_per_s`,
//! `fleet[1].speed_factor`, `slo.ttft_s`. Several `--set` make a grid (their cartesian product).
//! `--seeds N` runs every point and policy on N seeds, `first + k` for k = 0, 1, … from the
//! scenario's seed (or `--seed`), by the rule `compare` uses too (`stats::seed_of`), and reports
//! the mean and 95 % interval across them.

use crate::lab::{
    Job, ShardArgs, ShardRun, Timing, canonical_options, run_all, same_inputs, write_partial,
};
use anyhow::Context;
use routelab_policies::PolicyConfig;
use routelab_policies::located::rule;
use routelab_reports::partial::{InputsHash, Records, SweepRun};
use routelab_reports::shard::Shard;
use routelab_reports::{RunSummary, SweepRow, sweep_table, write_sweep};
use routelab_sim::Scenario;
use routelab_sim::sweep::{Axis, GridPoint, grid};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Options of `routelab sweep`.
#[derive(Debug, Clone, clap::Args)]
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
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

/// What `sweep` runs, worked out from its arguments and inputs before anything runs.
struct Plan {
    base: Scenario,
    params: Vec<String>,
    points: Vec<GridPoint>,
    policies: Vec<PolicyConfig>,
    seeds: usize,
    first_seed: u64,
    /// The options that decide the results (hashed with the inputs).
    options: String,
}

impl Plan {
    fn new(args: &SweepArgs) -> anyhow::Result<Plan> {
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
            .map_err(|v| v.at_field(super::compare::COMMAND_LINE, "--seeds"))?
            as usize;
        let first_seed = args.seed.unwrap_or(base.setup.seed);
        let options = canonical_options(&SweepArgs {
            out: None,
            shard: ShardArgs::default(),
            ..args.clone()
        });
        Ok(Plan {
            base,
            params,
            points,
            policies,
            seeds,
            first_seed,
            options,
        })
    }

    /// Every run, in report order (grid point, policy, seed); each is one unit.
    fn jobs(&self) -> Vec<Job<'_>> {
        let mut jobs = Vec::new();
        for point in &self.points {
            for p in &self.policies {
                for k in 0..self.seeds {
                    jobs.push(Job {
                        scenario: &point.scenario,
                        policy: p,
                        seed: routelab_reports::stats::seed_of(self.first_seed, k),
                        rows: false,
                    });
                }
            }
        }
        jobs
    }

    /// [`InputsHash`] of the scenario file, what each grid point reads, and the options.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = InputsHash::new();
        hash.file(&self.base.path)?;
        for point in &self.points {
            hash.scenario_reads(&point.scenario)?;
        }
        Ok(hash.item("options", self.options.as_bytes()).finish())
    }

    /// Run the jobs `shard` owns, in parallel; one record each.
    fn run_units(&self, shard: Shard) -> anyhow::Result<Vec<SweepRun>> {
        let (index, jobs): (Vec<usize>, Vec<Job<'_>>) = self
            .jobs()
            .into_iter()
            .enumerate()
            .filter(|(u, _)| shard.owns(*u))
            .unzip();
        let bar = super::compare::progress(jobs.len() as u64, "sweep");
        let outcomes = run_all(&jobs, &|| {
            if let Some(b) = &bar {
                b.inc(1);
            }
        })?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(index
            .into_iter()
            .zip(&jobs)
            .zip(outcomes)
            .map(|((job, j), o)| SweepRun {
                job,
                seed: j.seed,
                summary: RunSummary::from_metrics(&o.metrics),
            })
            .collect())
    }
}

/// Run it: the whole grid, or with `--shard` one shard's runs into a partial result.
pub fn run(args: &SweepArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let shard = args.shard.shard()?;
    let plan = Plan::new(args)?;
    let started = Instant::now();
    let records = plan.run_units(shard.unwrap_or(Shard::WHOLE))?;
    match shard {
        Some(shard) => write_partial(
            &args.shard,
            ShardRun {
                command: "sweep",
                shard,
                units: plan.jobs().len(),
                inputs_hash: plan.inputs_hash()?,
                timing: Timing::since(started),
            },
            Records::Sweep(records),
            out,
        ),
        None => finish(args, &plan, records, out),
    }
}

/// `routelab merge` of sweep partials: the outputs of the whole grid from the shards' records.
pub fn merged(
    args: &SweepArgs,
    inputs_hash: u64,
    records: Vec<SweepRun>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let plan = Plan::new(args)?;
    same_inputs(inputs_hash, plan.inputs_hash()?)?;
    finish(args, &plan, records, out)
}

/// Build the rows from the records, in job order (so the outputs do not depend on the thread
/// count or the shards), and write every output.
fn finish(
    args: &SweepArgs,
    plan: &Plan,
    records: Vec<SweepRun>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut by_job: BTreeMap<usize, SweepRun> = records.into_iter().map(|r| (r.job, r)).collect();
    let mut rows: Vec<SweepRow> = Vec::new();
    let mut job = 0;
    for point in &plan.points {
        for p in &plan.policies {
            let mut row = SweepRow::new(point.labels.clone(), p.name.clone());
            for _ in 0..plan.seeds {
                let r = by_job.remove(&job).with_context(|| {
                    format!("the results hold no run {job}; were the partial results edited?")
                })?;
                row.runs.push_summary(r.seed, r.summary, None);
                job += 1;
            }
            rows.push(row);
        }
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(&plan.base.name).join("sweep"));
    write_sweep(&dir, &plan.base.name, &plan.params, &rows)?;
    write!(out, "{}", sweep_table(&plan.params, &rows))?;
    writeln!(out, "sweep: {}", dir.join("sweep.csv").display())?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}
