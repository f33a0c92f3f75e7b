//! `routelab sweep SCENARIO --set path.to.field=v1,v2`: a parameter grid, run in parallel.
//!
//! A `--set` path addresses the scenario's YAML: `traffic[0].poisson.rate_per_s`,
//! `fleet[1].speed_factor`, `slo.ttft_s`. Several `--set` make a grid (their cartesian product).
//! `--seeds N` runs every point and policy on N seeds, `first + k` for k = 0, 1, … from the
//! scenario's seed (or `--seed`), by the rule `compare` uses too (`routelab_lab::seed_of`), and reports
//! the mean and 95 % interval across them.

use crate::lab::{
    self, Found, Job, RecordKey, ShardArgs, Sharded, ShardedArgs, Timing, canonical_options,
    run_all,
};
use anyhow::Context;
use routelab_lab::partial::{InputsHash, MergeSet, SweepRun};
use routelab_policies::PolicyConfig;
use routelab_reports::{PolicySeeds, RunSummary, SweepRow, sweep_table, write_sweep};
use routelab_sim::Scenario;
use routelab_sim::sweep::{Axis, GridPoint, grid};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
    /// What a seed means for a trace (see `--resample` below).
    #[command(flatten)]
    pub resample: crate::lab::ResampleArgs,
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

impl ShardedArgs for SweepArgs {
    fn clear_outputs(&mut self) {
        self.out = None;
        self.shard = ShardArgs::default();
    }
}

/// What `sweep` runs, worked out from its arguments and inputs before anything runs.
struct Plan {
    args: SweepArgs,
    base: Scenario,
    /// What a seed is (of the base scenario; the grid's points differ only as `--set` says).
    seed_meaning: String,
    params: Vec<String>,
    points: Vec<GridPoint>,
    policies: Vec<PolicyConfig>,
    seeds: usize,
    first_seed: u64,
    /// The scenario file's text, hashed as it was parsed.
    read: InputsHash,
}

impl Plan {
    fn new(args: &SweepArgs) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            !args.set.is_empty(),
            "give at least one --set path=v1,v2,..."
        );
        let text = std::fs::read_to_string(&args.scenario)
            .with_context(|| format!("{}: cannot read", args.scenario.display()))?;
        let mut read = InputsHash::new();
        read.text(&args.scenario, text.as_bytes());
        // Validate the base scenario first, for located errors.
        let base = Scenario::from_yaml(&text, &args.scenario)?;
        let axes = args
            .set
            .iter()
            .map(|s| Axis::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        let params: Vec<String> = axes.iter().map(|a| a.path.clone()).collect();
        let resample = args.resample.default_resample()?;
        let mut points = grid(&text, &args.scenario, &axes)?;
        for p in &mut points {
            p.scenario = p.scenario.with_resample_default(resample);
        }
        let seed_meaning = crate::lab::seed_meaning(&base.with_resample_default(resample))?.0;
        let policies = super::run::policies_for(&base, &args.policies)?;
        let seeds = super::compare::seed_count(args.seeds)?;
        let first_seed = args.seed.unwrap_or(base.setup.seed);
        Ok(Plan {
            args: args.clone(),
            base,
            seed_meaning,
            params,
            points,
            policies,
            seeds,
            first_seed,
            read,
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
                        seed: routelab_lab::seed_of(self.first_seed, k),
                        rows: false,
                    });
                }
            }
        }
        jobs
    }
}

impl Sharded for Plan {
    type Record = SweepRun;
    type Error = anyhow::Error;
    const COMMAND: &'static str = "sweep";

    fn units(&self) -> usize {
        self.points.len() * self.policies.len() * self.seeds
    }

    fn unit_of(&self, &job: &RecordKey<Self>) -> Option<usize> {
        (job < self.units()).then_some(job)
    }

    fn describe(&self, &job: &RecordKey<Self>) -> String {
        let per_point = self.policies.len() * self.seeds;
        let point = &self.points[job / per_point];
        format!(
            "grid point {}, policy `{}`, seed {} (run {job})",
            point.labels.join(", "),
            self.policies[job % per_point / self.seeds].name,
            routelab_lab::seed_of(self.first_seed, job % self.seeds)
        )
    }

    /// The scenario file as parsed, what each grid point reads (each file once), and the
    /// options.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = self.read.clone();
        for point in &self.points {
            hash.scenario_reads(&point.scenario)?;
        }
        let options = canonical_options(&self.args);
        Ok(hash.item("options", options.as_bytes()).finish())
    }

    /// Run the jobs in parallel; one record each.
    fn run_units(&self, units: &[usize]) -> anyhow::Result<Vec<SweepRun>> {
        let all = self.jobs();
        let jobs: Vec<Job<'_>> = units.iter().map(|&u| all[u]).collect();
        let bar = super::compare::progress(jobs.len() as u64, "sweep");
        let outcomes = run_all(&jobs, &|| {
            if let Some(b) = &bar {
                b.inc(1);
            }
        })?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(units
            .iter()
            .zip(&jobs)
            .zip(outcomes)
            .map(|((&job, j), o)| SweepRun {
                job,
                seed: j.seed,
                summary: RunSummary::from_metrics(&o.metrics),
            })
            .collect())
    }

    /// Build the rows from the records, in job order (so the outputs do not depend on the
    /// thread count or the shards), and write every output.
    fn finish(
        &self,
        mut found: Found<'_, Plan>,
        _timing: Timing,
        out: &mut dyn Write,
        _note: &mut dyn Write,
    ) -> anyhow::Result<ExitCode> {
        let mut rows: Vec<SweepRow> = Vec::new();
        let mut job = 0;
        for point in &self.points {
            for p in &self.policies {
                let mut row = SweepRow::new(point.labels.clone(), PolicySeeds::of(p));
                for _ in 0..self.seeds {
                    let r = found.take(&job)?;
                    row.runs.push_summary(r.seed, r.summary, None);
                    job += 1;
                }
                rows.push(row);
            }
        }
        let dir = self
            .args
            .out
            .clone()
            .unwrap_or_else(|| Path::new("out").join(&self.base.name).join("sweep"));
        write_sweep(
            &dir,
            &self.base.name,
            &self.seed_meaning,
            &self.params,
            &rows,
        )?;
        write!(out, "{}", sweep_table(&self.params, &rows))?;
        writeln!(out, "{}", self.seed_meaning)?;
        writeln!(out, "sweep: {}", dir.join("sweep.csv").display())?;
        writeln!(out, "report: {}", dir.join("report.html").display())?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Run it: the whole grid, or with `--shard` one shard's runs into a partial result.
pub fn run(args: &SweepArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    lab::run_sharded(&args.shard, || Plan::new(args), out, &mut std::io::sink())
}

/// `routelab merge` of sweep partials: the outputs of the whole grid from the shards' records.
pub fn merged(args: &SweepArgs, set: MergeSet, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    routelab_lab::sharded::merge(&Plan::new(args)?, set, out, &mut std::io::sink())
}
