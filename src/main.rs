//! `routelab`: the command-line front of the routing-policy lab. Argument parsing and commands
//! only; the simulation lives in `routelab-sim`, the policies in `routelab-policies`.
#![forbid(unsafe_code)]

mod commands;

use clap::{Parser, Subcommand};
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
}

/// Exit code for bad input (the scenario, the policy name, a trace).
pub const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policies => commands::policies::run(&mut std::io::stdout().lock()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
