//! `routelab check`: the routing-quality regression gate (see `routelab_reports::gate`).
//!
//! Parses the arguments, runs the suite's simulations in parallel and hands them to the gate
//! library; prints the report in the chosen format. Exit 1 on a regression, a failed
//! invariant or a metric without baseline; `--update` rewrites the baselines and prints what
//! moved.
//!
//! The default table shows only what fails and a one-line verdict (`--verbose`: every row).
//! Markdown (for a pull-request comment) carries its own verdict and stays within the comment
//! budget; JSON, CSV and HTML are documents. For those three and Markdown stdout holds the
//! document only and the plain-text verdict goes to stderr.

use crate::lab::{
    Job, ShardArgs, ShardRun, Timing, canonical_options, run_all, same_inputs, write_partial,
};
use anyhow::Context;
use clap::builder::TypedValueParser as _;
use routelab_policies::InputError;
use routelab_reports::Format as ExportFormat;
use routelab_reports::export::Detail;
use routelab_reports::gate::{Gate, baseline_file, gate_values, measure_values, write_baselines};
use routelab_reports::partial::{CheckRun, InputsHash, Records};
use routelab_reports::shard::Shard;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Options of `routelab check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Suite directory (holds suite.yaml).
    #[arg(long, default_value = "scenarios/ci")]
    pub suite: PathBuf,
    /// Baselines directory.
    #[arg(long, default_value = "baselines")]
    pub baselines: PathBuf,
    /// Output format (JSON, CSV and HTML: stdout holds the document only).
    #[arg(
        long,
        default_value = "table",
        value_parser = clap::builder::PossibleValuesParser::new(ExportFormat::NAMES)
            .try_map(|s| s.parse::<ExportFormat>())
    )]
    pub format: ExportFormat,
    /// Rewrite the baselines after an intended change and print what moved.
    #[arg(long)]
    pub update: bool,
    /// With `--format table`: print every comparison and invariant, not only the failures.
    #[arg(long)]
    pub verbose: bool,
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

impl CheckArgs {
    /// How much the console table shows; `--verbose` means nothing to the other formats (the
    /// documents always hold every row, Markdown keeps to its budget), so it is refused there.
    fn detail(&self) -> Result<Detail, InputError> {
        match (self.verbose, self.format) {
            (false, _) => Ok(Detail::Failures),
            (true, ExportFormat::Table) => Ok(Detail::Every),
            (true, _) => Err(InputError::new(
                super::compare::COMMAND_LINE,
                "--verbose",
                "applies only to `--format table` (JSON, CSV and HTML always hold every row; \
                 Markdown keeps to a pull-request comment's size)",
            )
            .valid("`--format table --verbose`, or `--format json` for every row")),
        }
    }
}

/// Run the gate: the report to `out`, the verdict to `out` too, or to `note` when the format
/// is a machine-readable document (so that `out` parses).
pub fn run(
    args: &CheckArgs,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let detail = args.detail()?;
    let shard = args.shard.shard()?;
    // Bad suite or baselines are exit 2 before any simulation runs.
    let gate = Gate::load(&args.suite, &args.baselines)?;
    let jobs = jobs(&gate);
    let started = Instant::now();
    let owned: Vec<usize> = (0..jobs.len())
        .filter(|&u| shard.unwrap_or(Shard::WHOLE).owns(u))
        .collect();
    let mine: Vec<Job<'_>> = owned.iter().map(|&u| jobs[u]).collect();
    let outcomes = run_all(&mine, &|| {})?;
    let records: Vec<CheckRun> = owned
        .into_iter()
        .zip(&outcomes)
        .map(|(job, o)| CheckRun {
            job,
            values: gate_values(&o.metrics),
        })
        .collect();
    match shard {
        Some(shard) => write_partial(
            &args.shard,
            ShardRun {
                command: "check",
                shard,
                units: jobs.len(),
                inputs_hash: inputs_hash(args, &gate)?,
                timing: Timing::since(started),
            },
            Records::Check(records),
            out,
        ),
        None => finish(args, detail, &gate, records, out, note),
    }
}

/// Every run of the suite, one unit each: each policy of each scenario on each seed.
fn jobs(gate: &Gate) -> Vec<Job<'_>> {
    gate.jobs()
        .into_iter()
        .map(|(scenario, policy, seed)| Job {
            scenario,
            policy,
            seed,
            rows: false,
        })
        .collect()
}

/// [`InputsHash`] of the suite file, its scenarios and what they read, the baselines the gate
/// compares with, and the options.
fn inputs_hash(args: &CheckArgs, gate: &Gate) -> anyhow::Result<u64> {
    let mut hash = InputsHash::new();
    hash.file(Path::new(&gate.suite.file))?;
    for sc in &gate.suite.scenarios {
        hash.scenario(sc)?;
        let baseline = baseline_file(&args.baselines, &sc.name);
        if baseline.exists() {
            hash.file(&baseline)?;
        } else {
            hash.item("no baseline", baseline.display().to_string().as_bytes());
        }
    }
    let options = canonical_options(&CheckArgs {
        shard: ShardArgs::default(),
        ..args.clone()
    });
    Ok(hash.item("options", options.as_bytes()).finish())
}

/// `routelab merge` of check partials: the gate's report, verdict and exit code from the
/// shards' records (and, with `--update`, the baselines).
pub fn merged(
    args: &CheckArgs,
    recorded_hash: u64,
    records: Vec<CheckRun>,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let detail = args.detail()?;
    let gate = Gate::load(&args.suite, &args.baselines)?;
    same_inputs(recorded_hash, inputs_hash(args, &gate)?)?;
    finish(args, detail, &gate, records, out, note)
}

/// Measure the suite from the records (in job order, as the gate aggregates seeds) and report.
fn finish(
    args: &CheckArgs,
    detail: Detail,
    gate: &Gate,
    records: Vec<CheckRun>,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let jobs = jobs(gate);
    let mut by_job: BTreeMap<usize, CheckRun> = records.into_iter().map(|r| (r.job, r)).collect();
    let runs = jobs
        .iter()
        .enumerate()
        .map(|(u, j)| {
            let r = by_job.remove(&u).with_context(|| {
                format!("the results hold no run {u}; were the partial results edited?")
            })?;
            Ok((j.scenario.name.as_str(), j.policy.name.as_str(), r.values))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let measured = measure_values(&gate.suite.seeds, runs);
    let report = gate.report(&measured);
    // The short table is a verdict in itself; the full one is today's table followed by the
    // summary, byte for byte.
    let short = args.format == ExportFormat::Table && detail == Detail::Failures;
    if args.update {
        if !short {
            args.format.gate_with(detail).export(&report, out)?;
        }
        write_baselines(&args.baselines, &measured)?;
        if short {
            // What moved is the news; the old baselines' failures are what `--update` fixes,
            // except invariants, which a new baseline cannot fix.
            out.write_all(report.invariant_failures().as_bytes())?;
            out.write_all(
                report
                    .update_note(&args.baselines, measured.len())
                    .trim_start()
                    .as_bytes(),
            )?;
        } else {
            let note: &mut dyn Write = if args.format == ExportFormat::Table {
                out
            } else {
                note
            };
            note.write_all(
                report
                    .update_note(&args.baselines, measured.len())
                    .as_bytes(),
            )?;
        }
        return Ok(if report.failed_invariants() > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    args.format.gate_with(detail).export(&report, out)?;
    match args.format {
        _ if short => {}
        ExportFormat::Table => out.write_all(report.summary().as_bytes())?,
        _ => note.write_all(report.summary().as_bytes())?,
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
