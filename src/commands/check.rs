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

use crate::lab::{Job, run_all};
use clap::builder::TypedValueParser as _;
use routelab_policies::InputError;
use routelab_reports::Format as ExportFormat;
use routelab_reports::export::Detail;
use routelab_reports::gate::{Gate, measure, write_baselines};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `routelab check`.
#[derive(Debug, clap::Args)]
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
    // Bad suite or baselines are exit 2 before any simulation runs.
    let gate = Gate::load(&args.suite, &args.baselines)?;
    let jobs: Vec<Job<'_>> = gate
        .jobs()
        .into_iter()
        .map(|(scenario, policy, seed)| Job {
            scenario,
            policy,
            seed,
            rows: false,
        })
        .collect();
    let outcomes = run_all(&jobs, &|| {})?;
    let measured = measure(
        &gate.suite.seeds,
        jobs.iter()
            .zip(&outcomes)
            .map(|(j, o)| (j.scenario.name.as_str(), j.policy.name.as_str(), &o.metrics)),
    );
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
