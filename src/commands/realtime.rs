//! `routelab realtime SCENARIO --gateway URL`: play a scenario's traffic in real time against a
//! running gateway and write the same `summary.json` (and report) as `routelab run`.

use anyhow::Context;
use routelab_emulator::{PlayOptions, play_with};
use routelab_reports::{PolicyRun, RunMeta, run_table, write_run};
use routelab_sim::Scenario;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `routelab realtime`.
#[derive(Debug, clap::Args)]
pub struct RealtimeArgs {
    /// Scenario YAML file.
    pub scenario: PathBuf,
    /// Gateway base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub gateway: String,
    /// Scenario time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory (default: out/<scenario name>/realtime/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Gateway admin token, to read final weights.
    #[arg(long)]
    pub admin_token: Option<String>,
}

/// Play it.
pub fn run(args: &RealtimeArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.speedup.is_finite() && args.speedup > 0.0,
        "--speedup: {} is not valid; expected a number > 0",
        args.speedup
    );
    let scenario = Scenario::load(&args.scenario)?;
    let seed = args.seed.unwrap_or(scenario.setup.seed);
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| super::run::default_out(&scenario).join("realtime"));
    let mut opts = PlayOptions::new(args.speedup);
    opts.admin_token = args.admin_token.clone();
    if opts.admin_token.is_none() {
        opts.policy = "gateway".to_string();
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime
        .block_on(play_with(&scenario, seed, &args.gateway, &opts))
        .with_context(|| format!("playing {} against {}", scenario.name, args.gateway))?;
    let rows = report.requests.iter().map(|r| r.record.clone()).collect();
    let runs = vec![PolicyRun::new(report.metrics, Some(rows))];
    write_run(&dir, &RunMeta::from_scenario(&scenario, seed), &runs)?;
    writeln!(
        out,
        "{} (seed {seed}) against {}",
        scenario.name, args.gateway
    )?;
    write!(out, "{}", run_table(&runs))?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}
