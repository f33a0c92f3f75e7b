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
    Run {
        /// Scenario YAML file.
        scenario: PathBuf,
        /// Policy (preset or composition); repeat for several. Default: the scenario's list.
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Output directory (default: out/<scenario name>/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Do not write requests.csv (for very large runs).
        #[arg(long)]
        no_requests: bool,
    },
    /// Every policy on every scenario over several seeds: mean and 95 % interval, one report.
    Compare {
        /// Scenario YAML files.
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// Policy; repeat for several. Default: each scenario's own list.
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Seeds per policy.
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// Output directory.
        #[arg(long, default_value = "out/compare")]
        out: PathBuf,
        /// Also write the Markdown findings table to this file (e.g. docs/findings.md).
        #[arg(long)]
        findings: Option<PathBuf>,
    },
    /// Run a parameter grid in parallel: --set path.to.field=v1,v2 (several make a grid).
    Sweep {
        /// Scenario YAML file.
        scenario: PathBuf,
        /// `path=v1,v2,...`, e.g. traffic[0].poisson.rate_per_s=1,2,4.
        #[arg(long, required = true)]
        set: Vec<String>,
        /// Policy; repeat for several. Default: the scenario's list.
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Output directory (default: out/<scenario name>/sweep/).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve an OpenAI-compatible engine that streams in real time following a hardware profile.
    Emulate {
        /// Hardware profile YAML (scenarios/hardware/<name>.yaml).
        #[arg(long)]
        profile: PathBuf,
        /// Port (0: any free port).
        #[arg(long, default_value_t = 8001)]
        port: u16,
        /// Address to bind.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Model name it serves (default: the profile's).
        #[arg(long)]
        model: Option<String>,
        /// Round trip to the gateway, ms.
        #[arg(long, default_value_t = 0.0)]
        rtt_ms: f64,
        /// Model time runs this many times faster than wall time.
        #[arg(long, default_value_t = 1.0)]
        speedup: f64,
        /// Start with a cold engine.
        #[arg(long)]
        cold: bool,
        /// Degraded node: every rate x this.
        #[arg(long, default_value_t = 1.0)]
        speed_factor: f64,
    },
    /// Play a scenario's traffic in real time against a running gateway; write summary.json.
    Realtime {
        /// Scenario YAML file.
        scenario: PathBuf,
        /// Gateway base URL, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        gateway: String,
        /// Scenario time runs this many times faster than wall time.
        #[arg(long, default_value_t = 1.0)]
        speedup: f64,
        /// Seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Output directory (default: out/<scenario name>/realtime/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Gateway admin token, to read final weights.
        #[arg(long)]
        admin_token: Option<String>,
    },
    /// Check scenario files without running them (exit 2 if any is invalid).
    Validate {
        /// Scenario YAML files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// The routing-quality regression gate: run the CI suite, compare with the baselines.
    Check {
        /// Suite directory (holds suite.yaml).
        #[arg(long, default_value = "scenarios/ci")]
        suite: PathBuf,
        /// Baselines directory.
        #[arg(long, default_value = "baselines")]
        baselines: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: commands::check::Format,
        /// Rewrite the baselines after an intended change and print what moved.
        #[arg(long)]
        update: bool,
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
        /// Azure 2023 CSV or Mooncake JSONL trace.
        file: PathBuf,
        /// `azure` or `mooncake` (default: from the extension).
        #[arg(long)]
        format: Option<String>,
        /// Read at most this many rows.
        #[arg(long)]
        limit: Option<u64>,
        /// Skip malformed rows (they are counted) instead of stopping at the first.
        #[arg(long)]
        skip_bad_rows: bool,
    },
}

/// Exit code for bad input (the scenario, the policy name, a trace).
pub const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policies => commands::policies::run(&mut std::io::stdout().lock()),
        Command::Run {
            scenario,
            policies,
            seed,
            out,
            no_requests,
        } => commands::run::run(
            &commands::run::RunArgs {
                scenario,
                policies,
                seed,
                out,
                no_requests,
            },
            &mut std::io::stdout().lock(),
        ),
        Command::Compare {
            scenarios,
            policies,
            seeds,
            out,
            findings,
        } => commands::compare::run(
            &commands::compare::CompareArgs {
                scenarios,
                policies,
                seeds,
                out,
                findings,
            },
            &mut std::io::stdout().lock(),
        ),
        Command::Sweep {
            scenario,
            set,
            policies,
            seed,
            out,
        } => commands::sweep::run(
            &commands::sweep::SweepArgs {
                scenario,
                set,
                policies,
                seed,
                out,
            },
            &mut std::io::stdout().lock(),
        ),
        Command::Emulate {
            profile,
            port,
            host,
            model,
            rtt_ms,
            speedup,
            cold,
            speed_factor,
        } => commands::emulate::run(
            &commands::emulate::EmulateArgs {
                profile,
                port,
                host,
                model,
                rtt_ms,
                speedup,
                cold,
                speed_factor,
            },
            &mut std::io::stdout().lock(),
        ),
        Command::Realtime {
            scenario,
            gateway,
            speedup,
            seed,
            out,
            admin_token,
        } => commands::realtime::run(
            &commands::realtime::RealtimeArgs {
                scenario,
                gateway,
                speedup,
                seed,
                out,
                admin_token,
            },
            &mut std::io::stdout().lock(),
        ),
        Command::Check {
            suite,
            baselines,
            format,
            update,
        } => commands::check::run(
            &suite,
            &baselines,
            format,
            update,
            &mut std::io::stdout().lock(),
        ),
        Command::Validate { files } => commands::validate::run(
            &files,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        ),
        Command::Trace {
            command:
                TraceCommand::Stats {
                    file,
                    format,
                    limit,
                    skip_bad_rows,
                },
        } => commands::trace::stats(
            &file,
            format.as_deref(),
            limit,
            skip_bad_rows,
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
