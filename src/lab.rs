//! Orchestration shared by the commands: run scenarios × policies × seeds in parallel (rayon)
//! and hand results back in a fixed order, so outputs never depend on the thread count.

use anyhow::Context;
use rayon::prelude::*;
use routelab_lab::capacity::{SearchOptions, find_capacity};
use routelab_lab::partial::{InputsHash, default_partial_path};
use routelab_lab::shard::Shard;
use routelab_lab::sharded::{self, ShardRun};
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::capacity::{SeedCapacity, SloSpec};
use routelab_sim::traffic::Resample;
use routelab_sim::{RequestRecord, RequestSink, RunMetrics, Scenario, run};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

pub use routelab_lab::sharded::{Found, RecordKey, Sharded, Timing};

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
    .map_err(|e| match e {
        // A trace fails on the rows it reads, whatever the policy: naming the policy sent the
        // reader looking for a policy bug (issue 41).
        routelab_sim::SimError::Traffic(t) => anyhow::Error::new(t).context(format!(
            "{}: traffic (seed {})",
            job.scenario.path.display(),
            job.seed
        )),
        other => anyhow::Error::new(other).context(format!(
            "{} (policy {}, seed {})",
            job.scenario.path.display(),
            job.policy.name,
            job.seed
        )),
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

/// `--resample`, taken by `compare`, `capacity`, `sweep` and `replicas`: what a seed means for
/// a trace whose scenario does not say (`resample:`).
#[derive(Debug, Clone, clap::Args)]
pub struct ResampleArgs {
    /// What a seed means for a trace source whose scenario sets no `resample:`: `block` (each
    /// seed a local block-bootstrap resample of the trace, each block drawn near its own time
    /// and whole sessions kept together, the block length chosen from the trace), a block length in seconds, or `none` (every seed
    /// replays the trace as recorded, as `run` and `check` do).
    #[arg(long, default_value = "block", value_name = "block|none|SECONDS")]
    pub resample: String,
}

impl ResampleArgs {
    /// The resample a trace without its own `resample:` gets.
    pub fn default_resample(&self) -> Result<Resample, InputError> {
        let flag = |message: String| {
            InputError::new(
                crate::commands::compare::COMMAND_LINE,
                "--resample",
                message,
            )
            .valid("block, none, or a block length in seconds > 0 (e.g. 120)")
        };
        match self.resample.trim() {
            "block" => Ok(Resample::BLOCK_AUTO),
            "none" => Ok(Resample::Exact),
            other => {
                let s: f64 = other
                    .parse()
                    .map_err(|_| flag(format!("`{other}` is not a resample")))?;
                let ns = routelab_policies::located::rule::seconds(s)
                    .map_err(|v| flag(v.to_string()))?
                    .as_nanos();
                if ns == 0 {
                    return Err(flag("0 s is not a block length".into()));
                }
                Ok(Resample::Block {
                    block_ns: Some(u64::try_from(ns).unwrap_or(u64::MAX)),
                })
            }
        }
    }
}

/// What a seed of `scenario` is, for the outputs: `(sentence, short form)`.
pub fn seed_meaning(scenario: &Scenario) -> anyhow::Result<(String, String)> {
    let m = scenario
        .seed_meaning()
        .with_context(|| format!("{}: traffic", scenario.path.display()))?;
    Ok((m.sentence, m.short))
}

/// `--holdout F`, taken by `compare` and `capacity`: a fraction in (0, 1).
pub fn holdout_fraction(f: Option<f64>) -> Result<Option<f64>, InputError> {
    f.map(|f| {
        crate::commands::compare::fraction_flag("--holdout", f, "0.3 to hold out the last 30 %")
    })
    .transpose()
}

/// With `--holdout F`: every scenario's first part, then every scenario's held-out part (the
/// order `compare` and `capacity` keep their studies in); without, the scenarios as they are.
pub fn with_held_out_parts(
    scenarios: Vec<Scenario>,
    holdout: Option<f64>,
) -> Result<Vec<Scenario>, InputError> {
    let Some(f) = holdout else {
        return Ok(scenarios);
    };
    let parts = scenarios
        .iter()
        .map(|s| s.holdout(f))
        .collect::<Result<Vec<_>, _>>()?;
    let (first, held): (Vec<Scenario>, Vec<Scenario>) = parts.into_iter().unzip();
    Ok(first.into_iter().chain(held).collect())
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

/// The options of a command that runs whole or as shards.
pub trait ShardedArgs: Clone + std::fmt::Debug {
    /// Clear what cannot change a result: where the outputs go (`--out`, `--findings`) and how
    /// the job list is cut (`--shard`, `--partial`).
    fn clear_outputs(&mut self);
}

/// The options that decide a command's results, in one canonical text (hashed into its
/// partials): the parsed arguments, with those that cannot change a result cleared.
pub fn canonical_options<A: ShardedArgs>(args: &A) -> String {
    let mut decisive = args.clone();
    decisive.clear_outputs();
    format!("{decisive:?}")
}

/// Read and parse a scenario file, hashing the very text it is parsed from.
pub fn read_scenario(path: &Path, hash: &mut InputsHash) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError::unreadable(path.display().to_string(), &e))?;
    hash.text(path, text.as_bytes());
    let sc = Scenario::from_yaml(&text, path)?;
    for w in crate::commands::scenario_warnings(&sc) {
        eprintln!("warning: {}: {w}", path.display());
    }
    Ok(sc)
}

/// Read a fleet file and a trace source given apart (`plan --fleet F --trace T`) into their
/// scenario, hashing the fleet file's text as it is parsed.
pub fn read_fleet_and_trace(
    fleet: &Path,
    trace: &str,
    hash: &mut InputsHash,
) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(fleet)
        .map_err(|e| InputError::unreadable(fleet.display().to_string(), &e))?;
    hash.text(fleet, text.as_bytes());
    let sc = Scenario::from_fleet_and_trace(&text, fleet, trace)?;
    for w in crate::commands::scenario_warnings(&sc) {
        eprintln!("warning: {}: {w}", fleet.display());
    }
    Ok(sc)
}

/// Run a command through the lab's one path ([`sharded::run`]): the whole job list, or with
/// `--shard` the units the shard owns into a partial result (its arguments recorded after the
/// plan is made, before anything runs).
pub fn run_sharded<C: Sharded<Error = anyhow::Error>>(
    sharding: &ShardArgs,
    plan: impl FnOnce() -> anyhow::Result<C>,
    out: &mut dyn Write,
    note: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let shard = sharding.shard()?;
    let plan = plan()?;
    let shard = match shard {
        Some(shard) => Some(ShardRun {
            shard,
            file: sharding
                .partial
                .clone()
                .unwrap_or_else(|| default_partial_path(shard)),
            args: recorded_args()?,
        }),
        None => None,
    };
    sharded::run(&plan, shard, out, note)
}

/// The capacity of `policy` on `scenario` at `seed`: the load-scale search of
/// `routelab_reports::capacity`, each probe of it one simulation of the scaled scenario. The one
/// search host of `capacity` and `replicas`; `what` names the run in an error.
pub fn capacity_of(
    scenario: &Scenario,
    policy: &PolicyConfig,
    seed: u64,
    slo: &SloSpec,
    options: &SearchOptions,
    what: &str,
) -> anyhow::Result<SeedCapacity> {
    find_capacity(slo, options, seed, |scale| {
        let scaled = scenario.with_load_scale(scale)?;
        let o = run_job(Job {
            scenario: &scaled,
            policy,
            seed,
            rows: false,
        })?;
        Ok::<_, anyhow::Error>(o.metrics)
    })
    .with_context(|| {
        format!(
            "{}: capacity of policy {} on seed {seed}{what}",
            scenario.path.display(),
            policy.name
        )
    })
}

/// Rewrite the findings document `f` as `update` makes it from its current text (empty when the
/// file does not exist yet): how `capacity --findings` and `replicas --findings` each update
/// their own section and keep the rest.
pub fn rewrite_findings(f: &Path, update: impl FnOnce(&str) -> String) -> anyhow::Result<()> {
    let old = match std::fs::read_to_string(f) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", f.display())),
    };
    std::fs::write(f, update(&old)).with_context(|| format!("{}: cannot write", f.display()))
}
