//! Orchestration shared by the commands: run scenarios × policies × seeds in parallel (rayon)
//! and hand results back in a fixed order, so outputs never depend on the thread count.

use anyhow::Context;
use rayon::prelude::*;
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::partial::{Partial, Records, default_partial_path};
use routelab_reports::shard::Shard;
use routelab_sim::{RequestRecord, RequestSink, RunMetrics, Scenario, run};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// One simulation to run.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    /// Scenario.
    pub scenario: &'a Scenario,
    /// Policy.
    pub policy: &'a PolicyConfig,
    /// Seed.
    pub seed: u64,
    /// Keep per-request rows.
    pub rows: bool,
}

/// What one job produced.
#[derive(Debug)]
pub struct Outcome {
    /// Metrics.
    pub metrics: RunMetrics,
    /// Per-request rows, when asked for.
    pub rows: Option<Vec<RequestRecord>>,
    /// Wall-clock seconds the simulation took (for `perf.json` only).
    pub wall_s: f64,
}

/// Run one job.
pub fn run_job(job: Job<'_>) -> anyhow::Result<Outcome> {
    run_job_into(job, None)
}

/// Run one job; its rows go to `stream` when given (and are then not kept), else are kept when
/// the job asks for them.
fn run_job_into(job: Job<'_>, stream: Option<&mut dyn RequestSink>) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let setup = job.scenario.setup_for_seed(job.seed);
    let mut traffic = job
        .scenario
        .traffic_source(job.seed)
        .with_context(|| format!("{}: traffic", job.scenario.path.display()))?;
    let mut rows = (job.rows && stream.is_none()).then(Vec::new);
    let metrics = match stream {
        Some(s) => run(&setup, job.policy, &mut *traffic, Some(s)),
        None => run(
            &setup,
            job.policy,
            &mut *traffic,
            rows.as_mut().map(|r| r as &mut dyn RequestSink),
        ),
    }
    .with_context(|| {
        format!(
            "{} (policy {}, seed {})",
            job.scenario.path.display(),
            job.policy.name,
            job.seed
        )
    })?;
    Ok(Outcome {
        metrics,
        rows,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Run every job in parallel; results come back in the order of `jobs`. `progress` is called
/// once per finished job (from worker threads).
pub fn run_all(jobs: &[Job<'_>], progress: &(dyn Fn() + Sync)) -> anyhow::Result<Vec<Outcome>> {
    jobs.par_iter()
        .map(|j| {
            let r = run_job(*j);
            progress();
            r
        })
        .collect()
}

/// [`run_all`], with job `i`'s rows written to `sink(i)` as the simulation finishes them (for
/// `routelab run`, a `requests.csv` stream) instead of being kept in memory.
pub fn run_all_streaming<S: RequestSink + Send>(
    jobs: &[Job<'_>],
    sink: impl Fn(usize) -> S + Sync,
) -> anyhow::Result<Vec<Outcome>> {
    jobs.par_iter()
        .enumerate()
        .map(|(i, j)| {
            let mut rows = sink(i);
            run_job_into(*j, Some(&mut rows))
        })
        .collect()
}

/// Apply `f` to every item in parallel; results come back in the order of `items` (so what a
/// command builds from them never depends on the thread count). The first error wins.
pub fn map_parallel<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> anyhow::Result<R> + Sync + Send,
) -> anyhow::Result<Vec<R>> {
    items.par_iter().map(f).collect()
}

/// `--shard K/N` and `--partial FILE`, taken by `compare`, `sweep`, `capacity` and `check`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ShardArgs {
    /// Run only shard K of N (K counts from 1) of the command's job list and write a partial
    /// result instead of the outputs; `routelab merge` combines the N partials into exactly
    /// what the whole command writes.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// With `--shard`: where to write the partial result (default
    /// out/partials/shard-K-of-N.json).
    #[arg(long, value_name = "FILE", requires = "shard")]
    pub partial: Option<PathBuf>,
}

impl ShardArgs {
    /// The shard asked for, if any (a located error, exit 2, when it is not K/N).
    pub fn shard(&self) -> Result<Option<Shard>, InputError> {
        self.shard
            .as_deref()
            .map(|s| Shard::parse(s, crate::commands::compare::COMMAND_LINE, "--shard"))
            .transpose()
    }
}

/// How long the runs took and on how many threads (the console's last line and `perf.json`;
/// for a merge, the shards' figures summed).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Wall seconds.
    pub wall_s: f64,
    /// Worker threads.
    pub threads: usize,
}

impl Timing {
    /// This process since `started`, on rayon's threads.
    pub fn since(started: Instant) -> Timing {
        Timing {
            wall_s: started.elapsed().as_secs_f64(),
            threads: rayon::current_num_threads(),
        }
    }
}

/// The command line's arguments after the subcommand, without `--shard` and `--partial` (what
/// a partial records, so `merge` can take the same options).
fn recorded_args() -> anyhow::Result<Vec<String>> {
    let mut kept = Vec::new();
    let mut args = std::env::args_os().skip(2);
    while let Some(a) = args.next() {
        let a = a.into_string().map_err(|a| {
            anyhow::anyhow!("argument {a:?} is not UTF-8; a partial records its arguments as text")
        })?;
        match a.as_str() {
            "--shard" | "--partial" => {
                args.next();
            }
            _ if a.starts_with("--shard=") || a.starts_with("--partial=") => {}
            _ => kept.push(a),
        }
    }
    Ok(kept)
}

/// What a sharded run did, for its partial result.
#[derive(Debug, Clone, Copy)]
pub struct ShardRun {
    /// The command.
    pub command: &'static str,
    /// Which shard.
    pub shard: Shard,
    /// Units in the whole job list.
    pub units: usize,
    /// The inputs and options hash.
    pub inputs_hash: u64,
    /// How long it took.
    pub timing: Timing,
}

/// A sharded run's end: write its records as a partial result and name it on one line.
pub fn write_partial(
    sharding: &ShardArgs,
    run: ShardRun,
    records: Records,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let ShardRun {
        command,
        shard,
        units,
        inputs_hash,
        timing,
    } = run;
    let file = sharding
        .partial
        .clone()
        .unwrap_or_else(|| default_partial_path(shard));
    let owned = (0..units).filter(|&u| shard.owns(u)).count();
    Partial {
        command: command.to_string(),
        args: recorded_args()?,
        shard,
        units,
        inputs_hash,
        wall_s: timing.wall_s,
        threads: timing.threads,
        records,
    }
    .write(&file)?;
    writeln!(
        out,
        "partial: {} (shard {shard}: {owned} of {units} units; `routelab merge` combines the {} \
         shards)",
        file.display(),
        shard.count()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The options that decide a command's results, as hashed into its partials: the parsed
/// arguments with those that do not (where outputs go, the shard itself) cleared.
pub fn canonical_options(args: &impl std::fmt::Debug) -> String {
    format!("{args:?}")
}

/// A merge's check that the inputs read now are those the shards read.
pub fn same_inputs(recorded: u64, now: u64) -> anyhow::Result<()> {
    anyhow::ensure!(
        recorded == now,
        "the inputs or options changed since the shards ran (the partials' inputs hash is \
         {recorded:016x}, the files here hash to {now:016x}); merge where the shards' input \
         files are, or run the shards again"
    );
    Ok(())
}
