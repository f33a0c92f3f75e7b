//! `routelab run SCENARIO`: every policy once on one seed; summary, CSVs, charts, report.

use crate::lab::{Job, run_all, run_all_streaming};
use anyhow::Context;
use routelab_policies::PolicyConfig;
use routelab_reports::{
    PerfInfo, PerfRun, PolicyRun, RequestsCsvStream, RunMeta, run_table, write_perf, write_run,
};
use routelab_sim::Scenario;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Options of `routelab run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Scenario YAML file.
    pub scenario: PathBuf,
    /// Policy (preset or composition); repeat for several. Default: the scenario's list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory (default: out/<scenario name>/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Do not write requests.csv (one row per request, about 92 MB per million requests;
    /// it is written while the simulations run, so it costs little time).
    #[arg(long)]
    pub no_requests: bool,
}

/// The policies to run: the command line's, else the scenario's.
pub fn policies_for(scenario: &Scenario, names: &[String]) -> anyhow::Result<Vec<PolicyConfig>> {
    if names.is_empty() {
        return Ok(scenario.policies.clone());
    }
    // sita's cut-offs are checked against the fleet, as the scenario's own policies are.
    let windows: Vec<u32> = (scenario.setup.workers.iter())
        .map(|w| w.spec.context_window)
        .collect();
    names
        .iter()
        .map(|n| {
            let p = PolicyConfig::from_name(n).with_context(|| format!("--policy {n}"))?;
            p.sita_fits(&windows)
                .with_context(|| format!("--policy {n} on {}", scenario.name))?;
            Ok(p)
        })
        .collect()
}

/// Default output directory of a scenario.
pub fn default_out(scenario: &Scenario) -> PathBuf {
    Path::new("out").join(&scenario.name)
}

/// Run it.
pub fn run(args: &RunArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let scenario = Scenario::load(&args.scenario)?;
    for w in super::scenario_warnings(&scenario) {
        eprintln!("warning: {}: {w}", args.scenario.display());
    }
    let policies = policies_for(&scenario, &args.policies)?;
    let seed = args.seed.unwrap_or(scenario.setup.seed);
    let dir = args.out.clone().unwrap_or_else(|| default_out(&scenario));
    let jobs: Vec<Job<'_>> = policies
        .iter()
        .map(|p| Job {
            scenario: &scenario,
            policy: p,
            seed,
            rows: false,
        })
        .collect();
    let started = Instant::now();
    // requests.csv is written as the simulations produce rows, by a thread of its own, rather
    // than in a second pass over every row at the end (a policy's bytes wait in memory only
    // while a policy before it in the file is still running).
    let outcomes = if args.no_requests {
        // A requests.csv of an earlier run in the same directory would not belong to this one.
        let stale = dir.join("requests.csv");
        if stale.is_file() {
            std::fs::remove_file(&stale)
                .with_context(|| format!("{}: cannot remove", stale.display()))?;
        }
        run_all(&jobs, &|| {})?
    } else {
        let names: Vec<String> = policies.iter().map(|p| p.name.clone()).collect();
        let stream = RequestsCsvStream::create(&dir.join("requests.csv"), &names)?;
        match run_all_streaming(&jobs, |i| stream.sink(i)) {
            Ok(outcomes) => {
                stream.finish()?;
                outcomes
            }
            Err(e) => {
                stream.abandon();
                return Err(e);
            }
        }
    };
    let total_wall_s = started.elapsed().as_secs_f64();
    let perf = PerfInfo {
        total_wall_s,
        threads: rayon::current_num_threads(),
        runs: outcomes
            .iter()
            .zip(&policies)
            .map(|(o, p)| PerfRun {
                scenario: scenario.name.clone(),
                policy: p.name.clone(),
                seed,
                wall_s: o.wall_s,
                sim_events: o.metrics.events,
                simulated_s: o.metrics.end_ns as f64 / 1e9,
            })
            .collect(),
    };
    for (o, p) in outcomes.iter().zip(&policies) {
        for w in o.metrics.warning_lines() {
            eprintln!("warning: {}: {w}", p.name);
        }
    }
    let requests: u64 = outcomes.iter().map(|o| o.metrics.requests).sum();
    let runs: Vec<PolicyRun> = outcomes
        .into_iter()
        .map(|o| PolicyRun::new(o.metrics, o.rows))
        .collect();
    let mut meta = RunMeta::from_scenario(&scenario, seed);
    meta.seed_meaning = crate::lab::seed_meaning(&scenario)?.0;
    write_run(&dir, &meta, &runs)?;
    write_perf(&dir, &perf)?;
    writeln!(out, "{} (seed {seed})", scenario.name)?;
    writeln!(out, "{}", meta.seed_meaning)?;
    writeln!(out, "SLO: {}", meta.slo)?;
    write!(out, "{}", run_table(&runs))?;
    // Several gateway replicas: each policy's figures per replica (nothing with one gateway).
    for r in &runs {
        let table = routelab_reports::replicas::replica_table(&r.metrics);
        if !table.is_empty() {
            write!(out, "\n{} per gateway replica:\n{table}", r.policy)?;
        }
    }
    writeln!(
        out,
        "\nsimulated {requests} requests in {total_wall_s:.2} s wall ({:.0} requests/s on {} threads)",
        requests as f64 / total_wall_s.max(1e-9),
        perf.threads
    )?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}
