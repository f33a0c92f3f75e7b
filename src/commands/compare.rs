//! `routelab compare SCENARIO...`: policies × seeds on each scenario, mean and 95 % interval
//! across seeds, one comparison report (and, with `--findings`, the Markdown findings table).

use crate::lab::{Job, run_all};
use anyhow::Context;
use routelab_policies::PolicyConfig;
use routelab_reports::{
    PerfInfo, PerfRun, PolicySeeds, ScenarioComparison, compare_table, findings_document,
    write_compare, write_perf,
};
use routelab_sim::Scenario;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Options of `routelab compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Scenario YAML files.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Policy; repeat for several. Default: each scenario's own list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seeds per policy.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Output directory.
    #[arg(long, default_value = "out/compare")]
    pub out: PathBuf,
    /// Also write the Markdown findings table to this file (e.g. docs/findings.md).
    #[arg(long)]
    pub findings: Option<PathBuf>,
}

/// A progress bar on a terminal, nothing otherwise (CI logs stay clean and deterministic).
pub fn progress(len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        bar.set_message(what.to_string());
        bar
    })
}

/// Run it.
pub fn run(args: &CompareArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.seeds >= 1,
        "--seeds: 0 is not valid; expected 1 or more"
    );
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .map(Scenario::load)
        .collect::<Result<_, _>>()?;
    let policies: Vec<Vec<PolicyConfig>> = scenarios
        .iter()
        .map(|s| super::run::policies_for(s, &args.policies))
        .collect::<anyhow::Result<_>>()?;
    let mut jobs = Vec::new();
    for (sc, ps) in scenarios.iter().zip(&policies) {
        for p in ps {
            for k in 0..args.seeds {
                jobs.push(Job {
                    scenario: sc,
                    policy: p,
                    seed: sc.setup.seed + k,
                    rows: false,
                });
            }
        }
    }
    let bar = progress(jobs.len() as u64, "compare");
    let started = Instant::now();
    let outcomes = run_all(&jobs, &|| {
        if let Some(b) = &bar {
            b.inc(1);
        }
    })?;
    let total_wall_s = started.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut comparisons: Vec<ScenarioComparison> = Vec::new();
    let mut perf_runs = Vec::new();
    let mut next = jobs.iter().zip(&outcomes);
    for (sc, ps) in scenarios.iter().zip(&policies) {
        let mut per_policy = Vec::new();
        for p in ps {
            let mut seeds = PolicySeeds::new(p.name.clone());
            for _ in 0..args.seeds {
                let (job, o) = next.next().context("one outcome per job")?;
                seeds.push(job.seed, &o.metrics);
                perf_runs.push(PerfRun {
                    scenario: sc.name.clone(),
                    policy: p.name.clone(),
                    seed: job.seed,
                    wall_s: o.wall_s,
                    sim_events: o.metrics.events,
                    simulated_s: o.metrics.end_ns as f64 / 1e9,
                });
            }
            per_policy.push(seeds);
        }
        comparisons.push(ScenarioComparison {
            scenario: sc.name.clone(),
            description: sc.description.clone(),
            policies: per_policy,
        });
    }
    write_compare(&args.out, &comparisons)?;
    write_perf(
        &args.out,
        &PerfInfo {
            total_wall_s,
            threads: rayon::current_num_threads(),
            runs: perf_runs,
        },
    )?;
    write!(out, "{}", compare_table(&comparisons))?;
    if let Some(f) = &args.findings {
        let names: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
        let md = findings_document(&names, args.seeds, &comparisons);
        if let Some(parent) = f.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("{}: cannot create", parent.display()))?;
        }
        std::fs::write(f, md).with_context(|| format!("{}: cannot write", f.display()))?;
        writeln!(out, "findings: {}", f.display())?;
    }
    let requests: u64 = outcomes.iter().map(|o| o.metrics.requests).sum();
    writeln!(
        out,
        "\n{} runs, {requests} requests simulated in {total_wall_s:.2} s wall on {} threads",
        jobs.len(),
        rayon::current_num_threads()
    )?;
    writeln!(out, "report: {}", args.out.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}
