//! `routelab compare SCENARIO...`: policies × seeds on each scenario, mean and 95 % interval
//! across seeds, every policy's paired difference from a baseline, one comparison report (and,
//! with `--findings`, the Markdown findings document). `--seeds auto` adds seeds until the
//! paired differences are precise enough (`routelab_reports::grow_seeds`).

use crate::lab::{Job, run_all};
use anyhow::Context;
use routelab_policies::located::rule::{self, Violation};
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::findings;
use routelab_reports::stats::{AutoSeeds, seed_of};
use routelab_reports::{
    PerfInfo, PerfRun, PolicySeeds, ScenarioComparison, compare_table, findings_document,
    grow_seeds, write_compare, write_perf,
};
use routelab_sim::{RunMetrics, Scenario};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Where command-line errors are located.
pub(crate) const COMMAND_LINE: &str = "command line";

/// Options of `routelab compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Scenario YAML files.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Policy; repeat for several. Default: each scenario's own list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seeds per policy: a count, or `auto` to add seeds until every paired difference from
    /// the baseline on the key metrics has a 95 % half-width within `--precision` of the
    /// baseline's mean (3 seeds first, then 2 at a time, at most `--max-seeds`).
    #[arg(long, default_value = "5", value_name = "N|auto")]
    pub seeds: String,
    /// The policy every paired difference is taken against (default: the first listed).
    #[arg(long)]
    pub baseline: Option<String>,
    /// With `--seeds auto`: the most seeds to run (default 20).
    #[arg(long)]
    pub max_seeds: Option<f64>,
    /// With `--seeds auto`: the half-width to reach, as a fraction of the baseline's mean
    /// (default 0.05).
    #[arg(long)]
    pub precision: Option<f64>,
    /// Output directory.
    #[arg(long, default_value = "out/compare")]
    pub out: PathBuf,
    /// Also write the Markdown findings document to this file (e.g. docs/findings.md).
    #[arg(long)]
    pub findings: Option<PathBuf>,
}

/// How many seeds to run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seeds {
    /// `--seeds N`.
    Fixed(u64),
    /// `--seeds auto`.
    Auto(AutoSeeds),
}

/// The most seeds `--max-seeds` (and `sweep --seeds`) may ask for (each is a run of every
/// policy).
pub(crate) const MAX_SEEDS_LIMIT: u64 = 1000;

fn flag_error(flag: &str, v: &Violation) -> InputError {
    v.at_field(COMMAND_LINE, flag)
}

/// `--seeds`, `--max-seeds` and `--precision`, validated together.
fn seeds_of(args: &CompareArgs) -> Result<Seeds, InputError> {
    if args.seeds.trim() == "auto" {
        let mut auto = AutoSeeds::default();
        if let Some(m) = args.max_seeds {
            // An interval needs two seeds.
            auto.max = rule::whole(m, 2, MAX_SEEDS_LIMIT)
                .map_err(|v| flag_error("--max-seeds", &v))? as usize;
        }
        if let Some(p) = args.precision {
            auto.rel_half_width = rule::positive(p)
                .and_then(|p| {
                    if p < 1.0 {
                        Ok(p)
                    } else {
                        Err(Violation::new(p, "a fraction > 0 and < 1, e.g. 0.05"))
                    }
                })
                .map_err(|v| flag_error("--precision", &v))?;
        }
        return Ok(Seeds::Auto(auto));
    }
    for (flag, given) in [
        ("--max-seeds", args.max_seeds.is_some()),
        ("--precision", args.precision.is_some()),
    ] {
        if given {
            return Err(InputError::new(
                COMMAND_LINE,
                flag,
                "applies only with `--seeds auto`",
            ));
        }
    }
    let n: f64 = args.seeds.trim().parse().map_err(|_| {
        InputError::new(
            COMMAND_LINE,
            "--seeds",
            format!("`{}` is not a number of seeds", args.seeds),
        )
        .valid("a whole number >= 1, or `auto`")
    })?;
    rule::whole(n, 1, u64::MAX)
        .map(Seeds::Fixed)
        .map_err(|v| flag_error("--seeds", &v).valid("a whole number >= 1, or `auto`"))
}

/// Index of the `--baseline` policy among a scenario's policies (by name as given, or by the
/// name the composition resolves to).
fn baseline_index(
    baseline: Option<&str>,
    scenario: &Scenario,
    policies: &[PolicyConfig],
) -> Result<usize, InputError> {
    let Some(b) = baseline else { return Ok(0) };
    let canonical = PolicyConfig::from_name(b).ok().map(|p| p.name);
    policies
        .iter()
        .position(|p| p.name == b || canonical.as_deref() == Some(p.name.as_str()))
        .ok_or_else(|| {
            InputError::new(
                COMMAND_LINE,
                "--baseline",
                format!(
                    "`{b}` is not one of the policies compared on `{}`",
                    scenario.name
                ),
            )
            .valid(
                policies
                    .iter()
                    .map(|p| format!("`{}`", p.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
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
    let seeds = seeds_of(args)?;
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .map(Scenario::load)
        .collect::<Result<_, _>>()?;
    let policies: Vec<Vec<PolicyConfig>> = scenarios
        .iter()
        .map(|s| super::run::policies_for(s, &args.policies))
        .collect::<anyhow::Result<_>>()?;
    let mut comparisons: Vec<ScenarioComparison> = Vec::new();
    for (sc, ps) in scenarios.iter().zip(&policies) {
        let mut c = ScenarioComparison::new(
            sc.name.clone(),
            sc.description.clone(),
            ps.iter()
                .map(|p| PolicySeeds::new(p.name.clone()))
                .collect(),
        );
        c.baseline = baseline_index(args.baseline.as_deref(), sc, ps)?;
        comparisons.push(c);
    }

    let bar = progress(0, "compare");
    let started = Instant::now();
    let mut perf_runs = Vec::new();
    let mut requests: u64 = 0;
    let mut runs: usize = 0;
    // One batch of (scenario, seed ordinal): every policy on each, in parallel; the results
    // come back in job order, so the outputs do not depend on the thread count.
    let mut run_batch = |batch: &[(usize, usize)]| -> anyhow::Result<Vec<(u64, Vec<RunMetrics>)>> {
        let mut jobs = Vec::new();
        for &(i, k) in batch {
            let sc = &scenarios[i];
            for p in &policies[i] {
                jobs.push(Job {
                    scenario: sc,
                    policy: p,
                    seed: seed_of(sc.setup.seed, k),
                    rows: false,
                });
            }
        }
        if let Some(b) = &bar {
            b.inc_length(jobs.len() as u64);
        }
        let outcomes = run_all(&jobs, &|| {
            if let Some(b) = &bar {
                b.inc(1);
            }
        })?;
        runs += jobs.len();
        let mut next = jobs.iter().zip(outcomes);
        let mut results = Vec::with_capacity(batch.len());
        for &(i, k) in batch {
            let sc = &scenarios[i];
            let mut metrics = Vec::with_capacity(policies[i].len());
            for p in &policies[i] {
                let (job, o) = next.next().context("one outcome per job")?;
                requests += o.metrics.requests;
                perf_runs.push(PerfRun {
                    scenario: sc.name.clone(),
                    policy: p.name.clone(),
                    seed: job.seed,
                    wall_s: o.wall_s,
                    sim_events: o.metrics.events,
                    simulated_s: o.metrics.end_ns as f64 / 1e9,
                });
                metrics.push(o.metrics);
            }
            results.push((seed_of(sc.setup.seed, k), metrics));
        }
        Ok(results)
    };
    let seeds_note = match seeds {
        Seeds::Fixed(n) => {
            let batch: Vec<(usize, usize)> = (0..comparisons.len())
                .flat_map(|i| (0..n as usize).map(move |k| (i, k)))
                .collect();
            for ((i, _), (seed, metrics)) in batch.iter().zip(run_batch(&batch)?) {
                for (p, m) in comparisons[*i].policies.iter_mut().zip(&metrics) {
                    p.push(seed, m);
                }
            }
            format!("{n} seeds each")
        }
        Seeds::Auto(auto) => {
            grow_seeds(&mut comparisons, &auto, &mut run_batch)?;
            format!(
                "`--seeds auto` (from {} to at most {} seeds per scenario, until every paired \
                 difference from the baseline on the key metrics had a 95 % half-width within {} % \
                 of the baseline's mean)",
                auto.start,
                auto.max,
                auto.rel_half_width * 100.0
            )
        }
    };
    let total_wall_s = started.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
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
        // Keep the capacity section `capacity --findings` wrote (it is generated separately).
        let kept: Vec<String> = std::fs::read_to_string(f)
            .ok()
            .and_then(|old| findings::section(&old, findings::CAPACITY).map(str::to_string))
            .into_iter()
            .collect();
        let md = findings_document(&names, &seeds_note, &comparisons, &kept);
        if let Some(parent) = f.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("{}: cannot create", parent.display()))?;
        }
        std::fs::write(f, md).with_context(|| format!("{}: cannot write", f.display()))?;
        writeln!(out, "findings: {}", f.display())?;
    }
    writeln!(
        out,
        "\n{runs} runs, {requests} requests simulated in {total_wall_s:.2} s wall on {} threads",
        rayon::current_num_threads()
    )?;
    writeln!(out, "report: {}", args.out.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: CompareArgs,
    }

    fn seeds(argv: &[&str]) -> Result<Seeds, InputError> {
        let mut full = vec!["compare", "s.yaml"];
        full.extend_from_slice(argv);
        seeds_of(&Cli::parse_from(full).args)
    }

    #[test]
    fn seeds_are_a_count_or_auto_with_its_bounds() {
        assert_eq!(seeds(&[]).unwrap(), Seeds::Fixed(5));
        assert_eq!(seeds(&["--seeds", "3"]).unwrap(), Seeds::Fixed(3));
        assert_eq!(
            seeds(&["--seeds", "auto"]).unwrap(),
            Seeds::Auto(AutoSeeds::default())
        );
        let Seeds::Auto(a) =
            seeds(&["--seeds", "auto", "--max-seeds", "9", "--precision", "0.02"]).unwrap()
        else {
            panic!("auto")
        };
        assert_eq!((a.max, a.rel_half_width), (9, 0.02));
        for (argv, field, says) in [
            (&["--seeds", "0"][..], "--seeds", "whole number"),
            (&["--seeds", "many"][..], "--seeds", "not a number of seeds"),
            (&["--seeds", "2.5"][..], "--seeds", "whole number"),
            (
                &["--seeds", "auto", "--max-seeds", "1"][..],
                "--max-seeds",
                "from 2 to 1000",
            ),
            (
                &["--seeds", "auto", "--precision", "1.5"][..],
                "--precision",
                "< 1",
            ),
            (
                &["--seeds", "auto", "--precision", "0"][..],
                "--precision",
                "> 0",
            ),
            (
                &["--seeds", "4", "--precision", "0.1"][..],
                "--precision",
                "auto",
            ),
        ] {
            let e = seeds(argv).unwrap_err();
            assert_eq!(e.file, COMMAND_LINE, "{argv:?}");
            assert_eq!(e.field, field, "{argv:?}");
            assert!(e.to_string().contains(says), "{argv:?}: {e}");
        }
    }
}
