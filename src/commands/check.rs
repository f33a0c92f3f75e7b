//! `routelab check`: the routing-quality regression gate (see `routelab_lab::gate`).
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
    self, Found, Job, RecordKey, ShardArgs, Sharded, ShardedArgs, Timing, canonical_options,
    run_all,
};
use clap::builder::TypedValueParser as _;
use routelab_lab::gate::{Gate, baseline_file, gate_values, measure_values, write_baselines};
use routelab_lab::partial::{CheckRun, InputsHash, MergeSet};
use routelab_policies::InputError;
use routelab_reports::Format as ExportFormat;
use routelab_reports::export::Detail;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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

impl ShardedArgs for CheckArgs {
    /// The gate writes no output files; only the shard is cleared (`--format`, `--verbose`
    /// and `--update` stay, as every shard is run with the same arguments anyway).
    fn clear_outputs(&mut self) {
        self.shard = ShardArgs::default();
    }
}

/// What `check` runs: the gate's suite and baselines, loaded before anything runs.
struct Plan {
    args: CheckArgs,
    detail: Detail,
    gate: Gate,
}

impl Plan {
    fn new(args: &CheckArgs) -> anyhow::Result<Plan> {
        let detail = args.detail()?;
        // Bad suite or baselines are exit 2 before any simulation runs.
        let gate = Gate::load(&args.suite, &args.baselines)?;
        Ok(Plan {
            args: args.clone(),
            detail,
            gate,
        })
    }

    /// Every run of the suite, one unit each: each policy of each scenario on each seed.
    fn jobs(&self) -> Vec<Job<'_>> {
        self.gate
            .jobs()
            .into_iter()
            .map(|(scenario, policy, seed)| Job {
                scenario,
                policy,
                seed,
                rows: false,
            })
            .collect()
    }
}

impl Sharded for Plan {
    type Record = CheckRun;
    type Error = anyhow::Error;
    const COMMAND: &'static str = "check";

    fn units(&self) -> usize {
        self.gate.jobs().len()
    }

    fn unit_of(&self, &job: &RecordKey<Self>) -> Option<usize> {
        (job < self.units()).then_some(job)
    }

    fn describe(&self, &job: &RecordKey<Self>) -> String {
        let (scenario, policy, seed) = self.gate.jobs()[job];
        format!(
            "`{}`, policy `{}`, seed {seed} (run {job})",
            scenario.name, policy.name
        )
    }

    /// The suite file, its scenarios and what they read, the baselines the gate compares
    /// with, and the options. The gate's loader parsed these files; they are read again here,
    /// right after it and before any run.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = InputsHash::new();
        hash.file(Path::new(&self.gate.suite.file))?;
        for sc in &self.gate.suite.scenarios {
            hash.file(&sc.path)?;
            hash.scenario_reads(sc)?;
            let baseline = baseline_file(&self.args.baselines, &sc.name);
            if baseline.exists() {
                hash.file(&baseline)?;
            } else {
                hash.item("no baseline", baseline.display().to_string().as_bytes());
            }
        }
        let options = canonical_options(&self.args);
        Ok(hash.item("options", options.as_bytes()).finish())
    }

    fn run_units(&self, units: &[usize]) -> anyhow::Result<Vec<CheckRun>> {
        let all = self.jobs();
        let mine: Vec<Job<'_>> = units.iter().map(|&u| all[u]).collect();
        let outcomes = run_all(&mine, &|| {})?;
        Ok(units
            .iter()
            .zip(&outcomes)
            .map(|(&job, o)| CheckRun {
                job,
                values: gate_values(&o.metrics),
            })
            .collect())
    }

    fn finish(
        &self,
        found: Found<'_, Plan>,
        _timing: Timing,
        out: &mut dyn Write,
        note: &mut dyn Write,
    ) -> anyhow::Result<ExitCode> {
        finish(self, found, out, note)
    }
}

/// Run the gate: the report to `out`, the verdict to `out` too, or to `note` when the format
/// is a machine-readable document (so that `out` parses).
pub fn run(
    args: &CheckArgs,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    // `--verbose` with another format is refused before the shard is looked at.
    args.detail()?;
    lab::run_sharded(&args.shard, || Plan::new(args), out, note)
}

/// `routelab merge` of check partials: the gate's report, verdict and exit code from the
/// shards' records (and, with `--update`, the baselines).
pub fn merged(
    args: &CheckArgs,
    set: MergeSet,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    routelab_lab::sharded::merge(&Plan::new(args)?, set, out, note)
}

/// Measure the suite from the records (in job order, as the gate aggregates seeds) and report.
fn finish(
    plan: &Plan,
    mut found: Found<'_, Plan>,
    out: &mut dyn Write,
    note: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let (args, detail, gate) = (&plan.args, plan.detail, &plan.gate);
    let runs = plan
        .jobs()
        .iter()
        .enumerate()
        .map(|(u, j)| {
            let r = found.take(&u)?;
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
