//! `routelab check`: the routing-quality regression gate (see `routelab_reports::gate`).
//!
//! Parses the arguments, runs the suite's simulations in parallel and hands them to the gate
//! library; prints the report in the chosen format. Exit 1 on a regression, a failed
//! invariant or a metric without baseline; `--update` rewrites the baselines and prints what
//! moved. With `--format json` stdout holds the JSON document only; the verdict goes to stderr.

use crate::lab::{Job, run_all};
use clap::builder::TypedValueParser as _;
use routelab_reports::Format as ExportFormat;
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
}

/// Run the gate: the report to `out`, the verdict to `out` too, or to `note` when the format
/// is a machine-readable document (so that `out` parses).
pub fn run(
    args: &CheckArgs,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
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
    args.format.gate().export(&report, out)?;
    let note: &mut dyn Write = if args.format.is_document() { note } else { out };
    if args.update {
        write_baselines(&args.baselines, &measured)?;
        note.write_all(
            report
                .update_note(&args.baselines, measured.len())
                .as_bytes(),
        )?;
        return Ok(if report.failed_invariants() > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    note.write_all(report.summary().as_bytes())?;
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
