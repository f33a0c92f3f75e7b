//! `routelab merge PARTIAL...`: combine the partial results of `compare | sweep | capacity |
//! check --shard K/N` into exactly what the command run whole writes, prints and returns.
//!
//! The partials record the command's arguments; merge parses them again (with `--out` and
//! `--findings` replaced when given), loads the same inputs, checks their hash against the
//! partials' and hands the records to the command's own writers.

use crate::commands;
use anyhow::Context;
use clap::Parser;
use routelab_lab::partial::{Partial, check_set};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `routelab merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The partial results, one per shard (any order).
    #[arg(required = true, value_name = "PARTIAL")]
    pub partials: Vec<PathBuf>,
    /// Output directory (default: the one the sharded command was given, or its default).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Findings document to write (default: the one the sharded command was given, if any).
    #[arg(long)]
    pub findings: Option<PathBuf>,
}

/// The sharded commands, to parse a partial's recorded arguments with their own parsers.
#[derive(Debug, Parser)]
#[command(name = "routelab")]
struct Recorded {
    #[command(subcommand)]
    command: RecordedCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RecordedCommand {
    Compare(commands::compare::CompareArgs),
    Sweep(commands::sweep::SweepArgs),
    Capacity(commands::capacity::CapacityArgs),
    Check(commands::check::CheckArgs),
}

impl RecordedCommand {
    fn name(&self) -> &'static str {
        match self {
            RecordedCommand::Compare(_) => "compare",
            RecordedCommand::Sweep(_) => "sweep",
            RecordedCommand::Capacity(_) => "capacity",
            RecordedCommand::Check(_) => "check",
        }
    }
}

/// Run it: the report to `out`; `check`'s verdict note to `note`, as `check` writes it.
pub fn run(
    args: &MergeArgs,
    out: &mut impl Write,
    note: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let partials = args
        .partials
        .iter()
        .map(|f| Ok((f.display().to_string(), Partial::read(f)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Every partial was run with the same arguments (`check_set` refuses others), so the
    // merge does not depend on the order the partials are given in.
    let set = check_set(partials)?;
    let (command, recorded) = (set.command.clone(), set.args.clone());
    let parsed = Recorded::try_parse_from(
        ["routelab".to_string(), command.clone()]
            .into_iter()
            .chain(recorded.iter().cloned()),
    )
    .with_context(|| {
        format!(
            "the partials' arguments (`routelab {command} {}`) do not parse",
            recorded.join(" ")
        )
    })?;
    anyhow::ensure!(
        parsed.command.name() == command,
        "the partials' records are not those of `{command}`"
    );
    let not_for = |flag: &str| {
        anyhow::anyhow!("`merge {flag}` does not apply to `{command}`, which writes no such file")
    };
    match parsed.command {
        RecordedCommand::Compare(mut a) => {
            if let Some(o) = &args.out {
                a.out = o.clone();
            }
            if let Some(f) = &args.findings {
                a.findings = Some(f.clone());
            }
            commands::compare::merged(&a, set, out)
        }
        RecordedCommand::Sweep(mut a) => {
            if args.findings.is_some() {
                return Err(not_for("--findings"));
            }
            if let Some(o) = &args.out {
                a.out = Some(o.clone());
            }
            commands::sweep::merged(&a, set, out)
        }
        RecordedCommand::Capacity(mut a) => {
            if let Some(o) = &args.out {
                a.out = Some(o.clone());
            }
            if let Some(f) = &args.findings {
                a.findings = Some(f.clone());
            }
            commands::capacity::merged(&a, set, out)
        }
        RecordedCommand::Check(a) => {
            if args.out.is_some() {
                return Err(not_for("--out"));
            }
            if args.findings.is_some() {
                return Err(not_for("--findings"));
            }
            commands::check::merged(&a, set, out, note)
        }
    }
}
