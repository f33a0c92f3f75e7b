//! `routelab`: the command-line front of the routing-policy lab. Argument parsing and commands
//! only; the simulation lives in `routelab-sim`, the policies in `routelab-policies`.
#![forbid(unsafe_code)]

mod commands;
mod lab;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Discrete-event simulator and routing-policy lab for LLM inference gateways.
#[derive(Debug, Parser)]
#[command(name = "routelab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every policy part, variant and preset with a one-line description.
    Policies,
    /// Run every policy of a scenario once; write summary.json, CSVs, charts and report.html.
    Run(commands::run::RunArgs),
    /// Every policy on every scenario over several seeds: mean and 95 % interval, one report.
    Compare(commands::compare::CompareArgs),
    /// Each policy's capacity at an SLO: the largest load scale at which it holds, per seed,
    /// with a paired ratio to a baseline (default: round robin).
    Capacity(commands::capacity::CapacityArgs),
    /// From a scenario to a gateway configuration: each candidate policy's capacity at the SLO
    /// under several conditions (the trace resampled, as recorded, its held-out tail, the
    /// fleet's uncertain profile fields), the robust choice, the capacity range to plan for.
    Plan(commands::plan::PlanArgs),
    /// How many gateway replicas a fleet takes: capacity, weight error and overlap regret
    /// against the number of replicas behind an L4 balancer.
    Replicas(commands::replicas::ReplicasArgs),
    /// Run a parameter grid in parallel: --set path.to.field=v1,v2 (several make a grid).
    Sweep(commands::sweep::SweepArgs),
    /// Combine the partial results of `compare | sweep | capacity | check --shard K/N` into
    /// exactly what the command run whole writes, prints and returns.
    Merge(commands::merge::MergeArgs),
    /// Serve an OpenAI-compatible engine that streams in real time following a hardware profile.
    Emulate(commands::emulate::EmulateArgs),
    /// Play a scenario's traffic in real time against a running gateway; write summary.json.
    Realtime(commands::realtime::RealtimeArgs),
    /// Head to head: ours and the field's real routers (SGLang's, vLLM's) one at a time in
    /// front of the same emulated workers, the scenario's traffic at each load and seed.
    H2h(commands::h2h::H2hArgs),
    /// A closed-loop benchmark sweep of an OpenAI-compatible endpoint (an engine, an emulator
    /// or the gateway): one `vllm bench serve`-style result file per concurrency, what
    /// `profile fit --from vllm-bench` reads.
    Bench(commands::bench::BenchArgs),
    /// Check scenario files without running them (exit 2 if any is invalid).
    Validate {
        /// Scenario YAML files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also check these policies (presets or compositions) against each file's fleet,
        /// as `run`, `compare` and `capacity` would (e.g. sita's cut-offs against its windows).
        #[arg(long = "policy")]
        policies: Vec<String>,
    },
    /// The routing-quality regression gate: run the CI suite, compare with the baselines.
    Check(commands::check::CheckArgs),
    /// Hardware profiles: fit one from measurements, or show one's curve and chart.
    Profile {
        #[command(subcommand)]
        command: commands::profile::ProfileCommand,
    },
    /// Inspect a trace file.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Rate, prompt/output lengths and prefix reuse, in one streaming pass.
    Stats {
        /// A trace (Azure CSV, Mooncake JSONL, gateway log, OpenTelemetry GenAI spans) or a
        /// scenario (`.yaml`) whose trace sources to summarise as it replays them (custom
        /// `jsonl` / `csv` mappings; see docs/traces.md).
        file: PathBuf,
        /// `azure`, `mooncake`, `gateway-log` or `otel-genai` (default: from the extension,
        /// azure / mooncake). Not with a scenario.
        #[arg(long)]
        format: Option<String>,
        /// Read at most this many rows.
        #[arg(long)]
        limit: Option<u64>,
        /// Skip malformed rows (they are counted) instead of stopping at the first.
        #[arg(long)]
        skip_bad_rows: bool,
        /// The rate series' window, in seconds (default: 1, 10, 60, 600, 3600, 21600 or 86400,
        /// the shortest giving at most 60 windows).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
        window: Option<u64>,
        /// Write every window of the rate series (requests and tokens per second) to this CSV.
        #[arg(long, value_name = "FILE.csv")]
        series: Option<PathBuf>,
    },
}

/// Exit code for bad input (the scenario, the policy name, a trace).
pub const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policies => commands::policies::run(&mut std::io::stdout().lock()),
        Command::Run(args) => commands::run::run(&args, &mut std::io::stdout().lock()),
        Command::Compare(args) => commands::compare::run(&args, &mut std::io::stdout().lock()),
        Command::Capacity(args) => commands::capacity::run(&args, &mut std::io::stdout().lock()),
        Command::Plan(args) => commands::plan::run(&args, &mut std::io::stdout().lock()),
        Command::Replicas(args) => commands::replicas::run(&args, &mut std::io::stdout().lock()),
        Command::Sweep(args) => commands::sweep::run(&args, &mut std::io::stdout().lock()),
        Command::Merge(args) => commands::merge::run(
            &args,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Emulate(args) => commands::emulate::run(&args, &mut std::io::stdout().lock()),
        Command::Realtime(args) => commands::realtime::run(&args, &mut std::io::stdout().lock()),
        Command::H2h(args) => commands::h2h::run(&args, &mut std::io::stdout().lock()),
        Command::Bench(args) => commands::bench::run(&args, &mut std::io::stdout().lock()),
        Command::Check(args) => commands::check::run(
            &args,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Validate { files, policies } => commands::validate::run(
            &files,
            &policies,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Profile { command } => {
            commands::profile::run(&command, &mut std::io::stdout().lock())
        }
        Command::Trace {
            command:
                TraceCommand::Stats {
                    file,
                    format,
                    limit,
                    skip_bad_rows,
                    window,
                    series,
                },
        } => commands::trace::stats(
            &file,
            &commands::trace::StatsOptions {
                format: format.as_deref(),
                limit,
                skip_bad_rows,
                window_s: window,
                series: series.as_deref(),
            },
            &mut std::io::stdout().lock(),
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
