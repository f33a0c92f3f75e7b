//! `routelab replicas SCENARIO... --slo ... --replicas 1,2,4,8,16`: how many gateway replicas a
//! fleet takes before routing quality degrades. For each scenario, the capacity study of
//! `routelab capacity` (its library, not another search) behind each number of replicas, and the
//! weight error and overlap regret at load scale 1, for the scenario's own policy and the best
//! of the field's routers; with `--findings`, the replicas section of the findings document.

use crate::lab::{Job, capacity_of, map_parallel, run_job};
use anyhow::Context;
use routelab_lab::capacity::{SearchOptions, SeedPlan, StudyPlan, run_study};
use routelab_lab::replicas::{Followed, run_replica_study};
use routelab_policies::located::rule;
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::capacity::{CapacityStudy, SloSpec};
use routelab_reports::replicas::{
    DEFAULT_SPLIT, Quality, ReplicaStudy, scenario_part, update_findings,
};
use routelab_sim::{Gateways, MAX_REPLICAS, Scenario, Share, Split};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `routelab replicas`.
#[derive(Debug, clap::Args)]
pub struct ReplicasArgs {
    /// Scenario YAML file(s); each is studied on its own.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// The SLO, as for `routelab capacity` (e.g. "ttft_p99<=2s,tpot_p99<=100ms").
    #[arg(long)]
    pub slo: String,
    /// Instead of distribution bounds: this fraction of requests (0 < f <= 1) must meet every
    /// bound per request.
    #[arg(long)]
    pub target: Option<f64>,
    /// Numbers of gateway replicas, comma-separated; the first is the reference every ratio is
    /// taken to.
    #[arg(long, default_value = "1,2,4,8,16", value_delimiter = ',')]
    pub replicas: Vec<String>,
    /// Policy (preset or composition); repeat for several. Default: the scenario's first policy
    /// and the field's router with the largest capacity behind one gateway (a capacity study of
    /// every field preset).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Without `--policy`: the seed's policy to study beside the best field router (preset or
    /// composition; default: the scenario's first policy).
    #[arg(long, conflicts_with = "policies")]
    pub seed_policy: Option<String>,
    /// How the L4 balancer splits requests: random, hash-by-session or round-robin.
    #[arg(long, default_value = DEFAULT_SPLIT.name())]
    pub split: String,
    /// What the replicas share, comma-separated (each mode is a row per replica count):
    /// none, probes, probes-and-load, engine-truth, dispatch-stream, route-and-reserve.
    #[arg(long, default_value = "none", value_delimiter = ',')]
    pub share: Vec<String>,
    /// `probes-and-load`: seconds between in-flight exchanges; `engine-truth`: between the
    /// engines' polls.
    #[arg(long, default_value_t = 1.0)]
    pub sync_interval_s: f64,
    /// `dispatch-stream`, `route-and-reserve`: one hop of the bus between the replicas, s.
    #[arg(long, default_value_t = routelab_sim::DEFAULT_BUS_LATENCY_S)]
    pub bus_latency_s: f64,
    /// `dispatch-stream`: each replica holds an arriving request a uniform random time up to
    /// this many seconds before routing it, comma-separated (each value a row; 0: no hold;
    /// default `routelab_policies::DEFAULT_REPLICA_SPREAD_S`, 0.01).
    #[arg(long, default_value = "0.01", value_delimiter = ',')]
    pub spread_s: Vec<f64>,
    /// Seeds per policy and deployment (the same seeds everywhere, so ratios are paired).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub seeds: u32,
    /// Also write the replicas section of this findings document (e.g. docs/findings.md): each
    /// studied scenario's part is written in place; other parts and sections are kept.
    #[arg(long)]
    pub findings: Option<PathBuf>,
    /// What a seed means for a trace (see `--resample` below).
    #[command(flatten)]
    pub resample: crate::lab::ResampleArgs,
}

/// The replica counts asked for.
fn replica_counts(values: &[String]) -> Result<Vec<u32>, InputError> {
    values
        .iter()
        .map(|v| {
            let n: f64 = v.trim().parse().unwrap_or(f64::NAN);
            rule::whole(n, 1, u64::from(MAX_REPLICAS))
                .map(|n| n as u32)
                .map_err(|e| InputError::new("--replicas", "", format!("`{v}`: {e}")))
        })
        .collect()
}

/// The deployments asked for: the first replica count with the first sharing mode (the
/// reference), then every other count with every mode (one replica shares nothing with
/// itself, so it appears once).
fn deployments(args: &ReplicasArgs) -> Result<Vec<Gateways>, InputError> {
    let counts = replica_counts(&args.replicas)?;
    let split = Split::from_name(&args.split).ok_or_else(|| {
        let valid: Vec<&str> = Split::ALL.iter().map(|(n, _)| *n).collect();
        InputError::new("--split", "", format!("unknown split `{}`", args.split))
            .valid(valid.join(", "))
    })?;
    let sync =
        rule::period(args.sync_interval_s).map_err(|e| e.at_field("--sync-interval-s", ""))?;
    let sync_ns = u64::try_from(sync.as_nanos()).unwrap_or(u64::MAX);
    let bus_ns = rule::non_negative(args.bus_latency_s)
        .map(routelab_policies::streams::secs_to_nanos)
        .map_err(|e| e.at_field("--bus-latency-s", ""))?;
    let shares = args
        .share
        .iter()
        .map(|s| {
            Share::from_name(s.trim(), sync_ns, bus_ns).ok_or_else(|| {
                InputError::new("--share", "", format!("unknown share `{s}`"))
                    .valid(Share::NAMES.join(", "))
            })
        })
        .collect::<Result<Vec<Share>, InputError>>()?;
    let spreads = args
        .spread_s
        .iter()
        .map(|&s| {
            rule::non_negative(s)
                .map(routelab_policies::streams::secs_to_nanos)
                .map_err(|e| e.at_field("--spread-s", ""))
        })
        .collect::<Result<Vec<u64>, InputError>>()?;
    // Each dispatch stream once per spread; the other modes have none.
    let shares: Vec<Share> = shares
        .iter()
        .flat_map(|&share| {
            let spread: Vec<Share> = spreads
                .iter()
                .filter_map(|&ns| share.with_spread(ns))
                .collect();
            if spread.is_empty() {
                vec![share]
            } else {
                spread
            }
        })
        .collect();
    let mut out: Vec<Gateways> = Vec::new();
    for &replicas in &counts {
        for &share in &shares {
            let share = if replicas == 1 { Share::None } else { share };
            let g = Gateways {
                replicas,
                split,
                share,
            };
            if !out.contains(&g) {
                out.push(g);
            }
        }
    }
    Ok(out)
}

/// Run it.
pub fn run(args: &ReplicasArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let slo = SloSpec::parse(&args.slo, args.target)?;
    for w in slo.warnings() {
        eprintln!("warning: {w}");
    }
    let deployments = deployments(args)?;
    let resample = args.resample.default_resample()?;
    let scenarios = args
        .scenarios
        .iter()
        .map(|path| {
            let mut scenario = Scenario::load(path)?
                .with_load_scale(1.0)?
                .with_resample_default(resample);
            scenario.setup.slo = slo.per_request();
            Ok(scenario)
        })
        .collect::<anyhow::Result<Vec<Scenario>>>()?;
    let mut studies = Vec::new();
    for scenario in &scenarios {
        let study = study(args, scenario, &slo, &deployments)?;
        writeln!(out, "{}", scenario_part(&study))?;
        writeln!(out, "{}\n", crate::lab::seed_meaning(scenario)?.0)?;
        studies.push(study);
    }
    if let Some(f) = &args.findings {
        crate::lab::rewrite_findings(f, |old| update_findings(old, &studies))?;
        writeln!(out, "findings: {}", f.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The replicas study of one scenario: the lab's, with this process's runs.
fn study(
    args: &ReplicasArgs,
    scenario: &Scenario,
    slo: &SloSpec,
    deployments: &[Gateways],
) -> anyhow::Result<ReplicaStudy> {
    let followed = if args.policies.is_empty() {
        // The scenario's own policy and the best field router behind the reference.
        Followed::OwnAndBestField(Box::new(match &args.seed_policy {
            Some(name) => {
                PolicyConfig::from_name(name).with_context(|| format!("--seed-policy {name}"))?
            }
            None => scenario.policies[0].clone(),
        }))
    } else {
        Followed::Given(super::run::policies_for(scenario, &args.policies)?)
    };
    run_replica_study(
        scenario,
        deployments,
        followed,
        |behind, policies| capacity(behind, slo, policies, args.seeds),
        quality,
    )
}

/// The capacity of each policy (the first is the study's baseline) on `seeds` seeds.
fn capacity(
    scenario: &Scenario,
    slo: &SloSpec,
    policies: &[PolicyConfig],
    seeds: u32,
) -> anyhow::Result<CapacityStudy> {
    let first_seed = scenario.setup.seed;
    let options = SearchOptions::default();
    let plan = StudyPlan {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        policies: policies.to_vec(),
        baseline: 0,
        first_seed,
        seeds: SeedPlan::Fixed(seeds as usize),
        slo: slo.clone(),
        options,
        base_rate_per_s: scenario
            .as_recorded()
            .mean_arrival_rate_per_s(first_seed)
            .with_context(|| format!("{}: traffic", scenario.path.display()))?,
        seed_meaning: crate::lab::seed_meaning(scenario)?,
    };
    let what = format!("{} replicas", scenario.setup.gateways.replicas);
    let bar = super::compare::progress(0, &what);
    let study = run_study(plan, |batch| {
        if let Some(b) = &bar {
            b.inc_length(batch.len() as u64);
        }
        // Results come back in batch order, whatever the thread count.
        map_parallel(batch, |&(p, seed)| {
            let policy = &policies[p];
            let found = capacity_of(
                scenario,
                policy,
                seed,
                slo,
                &options,
                &format!(" behind {what}"),
            );
            if let Some(b) = &bar {
                b.inc(1);
            }
            found
        })
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(study)
}

/// Each policy's weight error and overlap regret at load scale 1 on each seed.
fn quality(
    scenario: &Scenario,
    policies: &[PolicyConfig],
    seeds: &[u64],
) -> anyhow::Result<Vec<Quality>> {
    let jobs: Vec<(usize, u64)> = (0..policies.len())
        .flat_map(|p| seeds.iter().map(move |&s| (p, s)))
        .collect();
    let runs = map_parallel(&jobs, |&(p, seed)| {
        run_job(Job {
            scenario,
            policy: &policies[p],
            seed,
            rows: false,
        })
    })?;
    let mut out = vec![Quality::default(); policies.len()];
    for (&(p, _), o) in jobs.iter().zip(&runs) {
        out[p].push(&o.metrics);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplicasArgs,
    }

    fn parse(extra: &[&str]) -> ReplicasArgs {
        let mut argv = vec!["routelab", "s.yaml", "--slo", "ttft_p99<=2s"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    #[test]
    fn deployments_start_with_the_reference_and_list_one_replica_once() {
        let d = deployments(&parse(&[
            "--replicas",
            "1,4",
            "--share",
            "none,probes-and-load",
        ]))
        .unwrap();
        let got: Vec<(u32, &str)> = d.iter().map(|g| (g.replicas, g.share.name())).collect();
        assert_eq!(got, [(1, "none"), (4, "none"), (4, "probes-and-load")]);
        assert!(d.iter().all(|g| g.split == Split::Random));
        assert_eq!(
            d[2].share,
            Share::ProbesAndLoad {
                sync_interval_ns: 1_000_000_000
            }
        );
        let default = deployments(&parse(&[])).unwrap();
        let counts: Vec<u32> = default.iter().map(|g| g.replicas).collect();
        assert_eq!(counts, [1, 2, 4, 8, 16]);
    }

    #[test]
    fn bad_options_are_located_errors() {
        for (extra, field, says) in [
            (
                &["--replicas", "0"][..],
                "--replicas",
                "a whole number from 1 to 64",
            ),
            (&["--replicas", "2,x"][..], "--replicas", "`x`"),
            (
                &["--split", "sticky"][..],
                "--split",
                "valid: random, hash-by-session, round-robin",
            ),
            (
                &["--share", "all"][..],
                "--share",
                "valid: none, probes, probes-and-load",
            ),
            (
                &["--sync-interval-s", "0"][..],
                "--sync-interval-s",
                "0 is not valid",
            ),
        ] {
            let e = deployments(&parse(extra)).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(says), "{extra:?}: {e}");
        }
    }
}
