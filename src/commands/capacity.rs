//! `routelab capacity SCENARIO... --slo ...`: each policy's largest load scale at which the SLO
//! holds, per seed (common random numbers), its interval across seeds and its paired ratio to a
//! baseline policy; with `--findings`, the capacity section of the findings document.

use crate::lab::{
    Job, ShardArgs, ShardRun, Timing, canonical_options, map_parallel, run_job, same_inputs,
    write_partial,
};
use anyhow::Context;
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::capacity::{
    SearchOptions, SeedCapacity, SeedPlan, SloSpec, StudyPlan, capacity_table, find_capacity,
    run_study, update_findings, write_capacity,
};
use routelab_reports::partial::{CapacityRun, InputsHash, Records};
use routelab_reports::shard::Shard;
use routelab_reports::stats::{AutoSeeds, seed_of};
use routelab_sim::Scenario;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Plain round robin over every eligible worker: equal weights, the round-robin chooser, no
/// prefix affinity, no cap (the Kubernetes-service default the field compares against).
pub const ROUND_ROBIN: &str = "equal/round-robin/none/none";

/// Options of `routelab capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Scenario YAML file(s); each is studied on its own.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Policy (preset or composition); repeat for several. Default: the scenario's list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// The SLO: comma-separated METRIC_STAT<=VALUE bounds, METRIC one of ttft, tpot, itl, e2el,
    /// STAT pNN or mean, VALUE with s or ms, e.g. "ttft_p99<=2s,tpot_p99<=100ms".
    #[arg(long)]
    pub slo: String,
    /// Instead of distribution bounds: this fraction of requests (0 < f <= 1) must meet every
    /// bound per request.
    #[arg(long)]
    pub target: Option<f64>,
    /// Seeds per policy: a count, or `auto` (add seeds until every paired ratio to the baseline
    /// is within ±0.05, at most 20).
    #[arg(long, default_value = "5")]
    pub seeds: String,
    /// The policy every capacity is compared with (added to the runs if not listed).
    #[arg(long, default_value = ROUND_ROBIN)]
    pub baseline: String,
    /// Relative precision of the search: bisect until the bracket is within this fraction.
    #[arg(long, default_value_t = 0.02)]
    pub precision: f64,
    /// Output directory (default: out/capacity/<scenario name>/; with several scenarios, one
    /// numbered subdirectory each under it, `1_<name>`, `2_<name>`…).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the capacity section of this findings document (e.g. docs/findings.md): the
    /// part of each studied scenario at this SLO is written (replacing the same scenario and
    /// SLO's part if there is one); other parts and the rest of the file are kept.
    #[arg(long)]
    pub findings: Option<PathBuf>,
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

fn seed_plan(s: &str) -> Result<SeedPlan, InputError> {
    if s == "auto" {
        return Ok(SeedPlan::Auto(AutoSeeds::default()));
    }
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(SeedPlan::Fixed(n)),
        _ => Err(
            InputError::new("--seeds", "", format!("`{s}` is not valid"))
                .valid("a whole number >= 1, or auto"),
        ),
    }
}

fn precision(p: f64) -> Result<f64, InputError> {
    if p.is_finite() && p > 0.0 && p < 1.0 {
        Ok(p)
    } else {
        Err(InputError::new(
            "--precision",
            "",
            format!("{p} is not valid; expected a fraction in (0, 1), e.g. 0.02 for 2 %"),
        ))
    }
}

/// One scenario's study, before any run.
struct Study {
    scenario: Scenario,
    policies: Vec<PolicyConfig>,
    plan: StudyPlan,
    dir: PathBuf,
}

/// What `capacity` runs, worked out from its arguments and inputs before anything runs.
struct Plan {
    studies: Vec<Study>,
    slo: SloSpec,
    seeds: SeedPlan,
    options: SearchOptions,
    /// The options that decide the results (hashed with the inputs).
    canonical: String,
}

impl Plan {
    fn new(args: &CapacityArgs) -> anyhow::Result<Plan> {
        let slo = SloSpec::parse(&args.slo, args.target)?;
        let seeds = seed_plan(&args.seeds)?;
        let options = SearchOptions {
            precision: precision(args.precision)?,
            ..SearchOptions::default()
        };
        // Load and check every scenario before running any, so a bad one fails fast.
        let scenarios = args
            .scenarios
            .iter()
            .map(|path| {
                let loaded = Scenario::load(path)?;
                // Refuse an unscalable scenario (naming its source) before running anything.
                let mut scenario = loaded.with_load_scale(1.0)?;
                // Every run records the SLO's per-request bounds (its attainment, and `--target`).
                scenario.setup.slo = slo.per_request();
                Ok(scenario)
            })
            .collect::<anyhow::Result<Vec<Scenario>>>()?;
        let count = scenarios.len();
        let studies = scenarios
            .into_iter()
            .enumerate()
            .map(|(k, scenario)| {
                let dir = match (args.out.clone(), count) {
                    (Some(d), 1) => d,
                    (None, 1) => Path::new("out").join("capacity").join(&scenario.name),
                    // Several: numbered, so two scenarios with one name never share a directory.
                    (root, _) => root
                        .unwrap_or_else(|| Path::new("out").join("capacity"))
                        .join(format!("{}_{}", k + 1, scenario.name.replace('/', "-"))),
                };
                let (policies, plan) = study_plan(args, &scenario, &slo, seeds, options)?;
                Ok(Study {
                    scenario,
                    policies,
                    plan,
                    dir,
                })
            })
            .collect::<anyhow::Result<Vec<Study>>>()?;
        let canonical = canonical_options(&CapacityArgs {
            out: None,
            findings: None,
            shard: ShardArgs::default(),
            ..args.clone()
        });
        Ok(Plan {
            studies,
            slo,
            seeds,
            options,
            canonical,
        })
    }

    /// The units shards are dealt: with a fixed seed count, one search (scenario, policy,
    /// seed ordinal); with `--seeds auto`, a scenario, whose seeds grow until its own paired
    /// ratios are precise.
    fn units(&self) -> Vec<(usize, Option<(usize, usize)>)> {
        match self.seeds {
            SeedPlan::Fixed(n) => {
                let mut units = Vec::new();
                for (i, st) in self.studies.iter().enumerate() {
                    for p in 0..st.policies.len() {
                        units.extend((0..n.max(1)).map(|k| (i, Some((p, k)))));
                    }
                }
                units
            }
            SeedPlan::Auto(_) => (0..self.studies.len()).map(|i| (i, None)).collect(),
        }
    }

    /// [`InputsHash`] of the scenarios, what they read, and the options.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = InputsHash::new();
        for st in &self.studies {
            hash.scenario(&st.scenario)?;
        }
        Ok(hash.item("options", self.canonical.as_bytes()).finish())
    }

    /// One capacity search.
    fn search(&self, i: usize, p: usize, seed: u64) -> anyhow::Result<CapacityRun> {
        let st = &self.studies[i];
        let policy = &st.policies[p];
        let found = find_capacity(&self.slo, &self.options, seed, |scale| {
            let scaled = st.scenario.with_load_scale(scale)?;
            let o = run_job(Job {
                scenario: &scaled,
                policy,
                seed,
                rows: false,
            })?;
            Ok::<_, anyhow::Error>(o.metrics)
        })
        .with_context(|| {
            format!(
                "{}: capacity of policy {} on seed {seed}",
                st.scenario.path.display(),
                policy.name
            )
        })?;
        Ok(CapacityRun {
            scenario: i,
            policy: p,
            found,
        })
    }

    /// Run the units `shard` owns; one record per search. Each search runs on its own and
    /// results come back in order, so nothing depends on the thread count.
    fn run_units(&self, shard: Shard) -> anyhow::Result<Vec<CapacityRun>> {
        let owned: Vec<(usize, Option<(usize, usize)>)> = self
            .units()
            .into_iter()
            .enumerate()
            .filter(|(u, _)| shard.owns(*u))
            .map(|(_, unit)| unit)
            .collect();
        let bar = super::compare::progress(0, "capacity");
        let tick = || {
            if let Some(b) = &bar {
                b.inc(1);
            }
        };
        let mut records = Vec::new();
        match self.seeds {
            SeedPlan::Fixed(_) => {
                let searches: Vec<(usize, usize, u64)> = owned
                    .iter()
                    .filter_map(|&(i, pk)| {
                        pk.map(|(p, k)| (i, p, seed_of(self.studies[i].plan.first_seed, k)))
                    })
                    .collect();
                if let Some(b) = &bar {
                    b.inc_length(searches.len() as u64);
                }
                records = map_parallel(&searches, |&(i, p, seed)| {
                    let r = self.search(i, p, seed);
                    tick();
                    r
                })?;
            }
            SeedPlan::Auto(_) => {
                for &(i, _) in &owned {
                    run_study(self.studies[i].plan.clone(), |batch| {
                        if let Some(b) = &bar {
                            b.inc_length(batch.len() as u64);
                        }
                        let found = map_parallel(batch, |&(p, seed)| {
                            let r = self.search(i, p, seed);
                            tick();
                            r
                        })?;
                        let out = found.iter().map(|r| r.found.clone()).collect();
                        records.extend(found);
                        Ok::<_, anyhow::Error>(out)
                    })?;
                }
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(records)
    }
}

/// Run it: every study, or with `--shard` one shard's searches into a partial result.
pub fn run(args: &CapacityArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let shard = args.shard.shard()?;
    let plan = Plan::new(args)?;
    let started = Instant::now();
    let records = plan.run_units(shard.unwrap_or(Shard::WHOLE))?;
    match shard {
        Some(shard) => write_partial(
            &args.shard,
            ShardRun {
                command: "capacity",
                shard,
                units: plan.units().len(),
                inputs_hash: plan.inputs_hash()?,
                timing: Timing::since(started),
            },
            Records::Capacity(records),
            out,
        ),
        None => finish(args, &plan, records, out),
    }
}

/// `routelab merge` of capacity partials: every study's outputs from the shards' records.
pub fn merged(
    args: &CapacityArgs,
    inputs_hash: u64,
    records: Vec<CapacityRun>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let plan = Plan::new(args)?;
    same_inputs(inputs_hash, plan.inputs_hash()?)?;
    finish(args, &plan, records, out)
}

/// Build each study from the records (the same seed plan, so `--seeds auto` stops where it
/// stopped) and write every output.
fn finish(
    args: &CapacityArgs,
    plan: &Plan,
    records: Vec<CapacityRun>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let by_key: BTreeMap<(usize, usize, u64), SeedCapacity> = records
        .into_iter()
        .map(|r| ((r.scenario, r.policy, r.found.seed), r.found))
        .collect();
    let mut studies = Vec::new();
    for (i, st) in plan.studies.iter().enumerate() {
        let study = run_study(st.plan.clone(), |batch| {
            batch
                .iter()
                .map(|&(p, seed)| {
                    by_key.get(&(i, p, seed)).cloned().with_context(|| {
                        format!(
                            "the results hold no capacity of policy {} on seed {seed} of `{}`; \
                             were the partial results edited?",
                            st.policies[p].name, st.scenario.name
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        write_capacity(&st.dir, &study)?;
        write!(out, "{}", capacity_table(&study))?;
        writeln!(out, "report: {}\n", st.dir.join("report.html").display())?;
        studies.push(study);
    }
    if let Some(f) = &args.findings {
        let old = match std::fs::read_to_string(f) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read", f.display())),
        };
        let doc = update_findings(&old, &studies);
        std::fs::write(f, doc).with_context(|| format!("{}: cannot write", f.display()))?;
        writeln!(out, "findings: {}", f.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The policies and study plan of one scenario.
fn study_plan(
    args: &CapacityArgs,
    scenario: &Scenario,
    slo: &SloSpec,
    seeds: SeedPlan,
    options: SearchOptions,
) -> anyhow::Result<(Vec<PolicyConfig>, StudyPlan)> {
    let mut policies = super::run::policies_for(scenario, &args.policies)?;
    let baseline_policy = PolicyConfig::from_name(&args.baseline)
        .with_context(|| format!("--baseline {}", args.baseline))?;
    let baseline = match policies.iter().position(|p| p.name == baseline_policy.name) {
        Some(i) => i,
        None => {
            policies.insert(0, baseline_policy);
            0
        }
    };
    let first_seed = scenario.setup.seed;
    let base_rate_per_s = scenario
        .mean_arrival_rate_per_s(first_seed)
        .with_context(|| format!("{}: traffic", scenario.path.display()))?;
    let plan = StudyPlan {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        policies: policies.iter().map(|p| p.name.clone()).collect(),
        baseline,
        first_seed,
        seeds,
        slo: slo.clone(),
        options,
        base_rate_per_s,
    };
    Ok((policies, plan))
}
