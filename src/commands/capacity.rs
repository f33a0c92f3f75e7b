//! `routelab capacity SCENARIO... --slo ...`: each policy's largest load scale at which the SLO
//! holds, per seed (common random numbers), its interval across seeds and its paired ratio to a
//! baseline policy; with `--findings`, the capacity section of the findings document.

use super::compare::{SeedsFlag, fraction_flag, seeds_flag};
use crate::lab::{
    self, Found, RecordKey, ResampleArgs, ShardArgs, Sharded, ShardedArgs, Timing,
    canonical_options, capacity_of, holdout_fraction, map_parallel, read_scenario, seed_meaning,
};
use anyhow::Context;
use routelab_lab::capacity::{SearchOptions, SeedPlan, StudyPlan, run_study};
use routelab_lab::holdout::capacity_out_of_sample;
use routelab_lab::partial::{CapacityRun, InputsHash, MergeSet};
use routelab_lab::seed_of;
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::capacity::{SloSpec, capacity_table, update_findings, write_capacity};
use routelab_reports::holdout::held_out_text;
use routelab_reports::stats::AutoSeeds;
use routelab_sim::Scenario;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
    /// The policy every capacity is compared with: one of the studied policies by its name (a
    /// scenario's own named policy included), else a preset or composition (added to the runs).
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
    /// What a seed means for a trace (see `--resample` below).
    #[command(flatten)]
    pub resample: ResampleArgs,
    /// Hold out this fraction of each trace's span (its end, by time): capacities are found on
    /// the rest, and the policy to ship is checked on the held-out part (same seeds, paired).
    /// The held-out study's own outputs go to `held-out/` in the output directory.
    #[arg(long, value_name = "F")]
    pub holdout: Option<f64>,
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

impl ShardedArgs for CapacityArgs {
    fn clear_outputs(&mut self) {
        self.out = None;
        self.findings = None;
        self.shard = ShardArgs::default();
    }
}

fn seed_plan(s: &str) -> Result<SeedPlan, InputError> {
    Ok(match seeds_flag(s)? {
        SeedsFlag::Fixed(n) => SeedPlan::Fixed(n),
        SeedsFlag::Auto => SeedPlan::Auto(AutoSeeds::default()),
    })
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
    args: CapacityArgs,
    studies: Vec<Study>,
    slo: SloSpec,
    seeds: SeedPlan,
    options: SearchOptions,
    /// The scenario files' text, hashed as it was parsed.
    read: InputsHash,
    /// With `--holdout F`: F and the number of scenarios asked for; `studies` then holds each
    /// one's first part, then each one's held-out part, in that order.
    holdout: Option<(f64, usize)>,
}

impl Plan {
    fn new(args: &CapacityArgs) -> anyhow::Result<Plan> {
        let slo = SloSpec::parse(&args.slo, args.target)?;
        for w in slo.warnings() {
            eprintln!("warning: {w}");
        }
        let seeds = seed_plan(&args.seeds)?;
        let options = SearchOptions {
            precision: fraction_flag("--precision", args.precision, "0.02 for 2 %")?,
            ..SearchOptions::default()
        };
        let resample = args.resample.default_resample()?;
        let holdout = holdout_fraction(args.holdout)?;
        let mut read = InputsHash::new();
        // Load and check every scenario before running any, so a bad one fails fast.
        let scenarios = args
            .scenarios
            .iter()
            .map(|path| {
                let loaded = read_scenario(path, &mut read)?;
                // Refuse an unscalable scenario (naming its source) before running anything.
                let mut scenario = loaded.with_load_scale(1.0)?.with_resample_default(resample);
                // Every run records the SLO's per-request bounds (its attainment, and `--target`).
                scenario.setup.slo = slo.per_request();
                Ok(scenario)
            })
            .collect::<anyhow::Result<Vec<Scenario>>>()?;
        let count = scenarios.len();
        let scenarios = crate::lab::with_held_out_parts(scenarios, holdout)?;
        let studies = scenarios
            .into_iter()
            .enumerate()
            .map(|(k, scenario)| {
                let (k, held_out) = (k % count, k >= count);
                let dir = match (args.out.clone(), count) {
                    (Some(d), 1) => d,
                    (None, 1) => Path::new("out").join("capacity").join(&scenario.name),
                    // Several: numbered, so two scenarios with one name never share a directory.
                    (root, _) => root
                        .unwrap_or_else(|| Path::new("out").join("capacity"))
                        .join(format!("{}_{}", k + 1, scenario.name.replace('/', "-"))),
                };
                let dir = if held_out { dir.join("held-out") } else { dir };
                let (policies, plan) = study_plan(args, &scenario, &slo, seeds, options)?;
                Ok(Study {
                    scenario,
                    policies,
                    plan,
                    dir,
                })
            })
            .collect::<anyhow::Result<Vec<Study>>>()?;
        Ok(Plan {
            args: args.clone(),
            studies,
            slo,
            seeds,
            options,
            read,
            holdout: holdout.map(|f| (f, count)),
        })
    }

    /// The units shards are dealt: with a fixed seed count, one search (scenario, policy,
    /// seed ordinal); with `--seeds auto`, a scenario, whose seeds grow until its own paired
    /// ratios are precise.
    fn unit_list(&self) -> Vec<(usize, Option<(usize, usize)>)> {
        match self.seeds {
            SeedPlan::Fixed(n) => {
                let mut units = Vec::new();
                for (i, st) in self.studies.iter().enumerate() {
                    for p in 0..st.policies.len() {
                        units.extend((0..n).map(|k| (i, Some((p, k)))));
                    }
                }
                units
            }
            SeedPlan::Auto(_) => (0..self.studies.len()).map(|i| (i, None)).collect(),
        }
    }

    /// One capacity search.
    fn search(&self, i: usize, p: usize, seed: u64) -> anyhow::Result<CapacityRun> {
        let st = &self.studies[i];
        let policy = &st.policies[p];
        let found = capacity_of(&st.scenario, policy, seed, &self.slo, &self.options, "")?;
        Ok(CapacityRun {
            scenario: i,
            policy: p,
            found,
        })
    }
}

impl Sharded for Plan {
    type Record = CapacityRun;
    type Error = anyhow::Error;
    const COMMAND: &'static str = "capacity";

    fn units(&self) -> usize {
        self.unit_list().len()
    }

    fn unit_of(&self, &(i, p, seed): &RecordKey<Self>) -> Option<usize> {
        let st = self.studies.get(i)?;
        if p >= st.policies.len() {
            return None;
        }
        let k = usize::try_from(seed.wrapping_sub(st.plan.first_seed)).ok()?;
        match self.seeds {
            SeedPlan::Fixed(n) => {
                let before: usize = self.studies[..i].iter().map(|s| s.policies.len() * n).sum();
                (k < n).then_some(before + p * n + k)
            }
            SeedPlan::Auto(auto) => (k < auto.max).then_some(i),
        }
    }

    fn describe(&self, &(i, p, seed): &RecordKey<Self>) -> String {
        let st = &self.studies[i];
        format!(
            "the capacity of policy {} on seed {seed} of `{}`",
            st.policies[p].name, st.scenario.name
        )
    }

    /// The scenarios as parsed, what they read, and the options.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = self.read.clone();
        for st in &self.studies {
            hash.scenario_reads(&st.scenario)?;
        }
        let options = canonical_options(&self.args);
        Ok(hash.item("options", options.as_bytes()).finish())
    }

    /// One record per search. Each search runs on its own and results come back in order, so
    /// nothing depends on the thread count.
    fn run_units(&self, units: &[usize]) -> anyhow::Result<Vec<CapacityRun>> {
        let all = self.unit_list();
        let owned: Vec<(usize, Option<(usize, usize)>)> = units.iter().map(|&u| all[u]).collect();
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

    /// Build each study from the records (the same seed plan, so `--seeds auto` stops where it
    /// stopped) and write every output.
    fn finish(
        &self,
        mut found: Found<'_, Plan>,
        _timing: Timing,
        out: &mut dyn Write,
        _note: &mut dyn Write,
    ) -> anyhow::Result<ExitCode> {
        let mut studies = Vec::new();
        for (i, st) in self.studies.iter().enumerate() {
            let study = run_study(st.plan.clone(), |batch| {
                batch
                    .iter()
                    .map(|&(p, seed)| found.take(&(i, p, seed)).map(|r| r.found))
                    .collect::<Result<Vec<_>, _>>()
            })?;
            studies.push(study);
        }
        // With --holdout: the outputs are the first parts' studies, each with the check of the
        // policy it ships on its held-out part (whose own outputs go to `held-out/`).
        let held = match self.holdout {
            Some((f, asked)) => {
                let mut held = studies.split_off(asked);
                for (st, h) in studies.iter_mut().zip(&mut held) {
                    st.out_of_sample = capacity_out_of_sample(st, h, &held_out_text(f));
                    h.held_out_of = st.out_of_sample.clone();
                }
                held
            }
            None => Vec::new(),
        };
        for (study, st) in studies.iter().zip(&self.studies) {
            write_capacity(&st.dir, study)?;
            write!(out, "{}", capacity_table(study))?;
            writeln!(out, "report: {}\n", st.dir.join("report.html").display())?;
        }
        for (study, st) in held.iter().zip(&self.studies[studies.len()..]) {
            write_capacity(&st.dir, study)?;
        }
        if let Some(f) = &self.args.findings {
            crate::lab::rewrite_findings(f, |old| update_findings(old, &studies))?;
            writeln!(out, "findings: {}", f.display())?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Run it: every study, or with `--shard` one shard's searches into a partial result.
pub fn run(args: &CapacityArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    lab::run_sharded(&args.shard, || Plan::new(args), out, &mut std::io::sink())
}

/// `routelab merge` of capacity partials: every study's outputs from the shards' records.
pub fn merged(
    args: &CapacityArgs,
    set: MergeSet,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    routelab_lab::sharded::merge(&Plan::new(args)?, set, out, &mut std::io::sink())
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
    // The baseline is one of the studied policies by its name (a scenario's own named policy
    // included), else the preset or composition it names, added to the runs.
    let baseline = match policies.iter().position(|p| p.name == args.baseline) {
        Some(i) => i,
        None => {
            let baseline_policy = PolicyConfig::from_name(&args.baseline).with_context(|| {
                format!(
                    "--baseline {}: not one of {}'s policies, nor a preset or composition",
                    args.baseline,
                    scenario.path.display()
                )
            })?;
            match policies.iter().position(|p| p.name == baseline_policy.name) {
                Some(i) => i,
                None => {
                    policies.insert(0, baseline_policy);
                    0
                }
            }
        }
    };
    let first_seed = scenario.setup.seed;
    // Load scale 1 is the traffic as recorded (a resample's rate moves by seed around it).
    let base_rate_per_s = scenario
        .as_recorded()
        .mean_arrival_rate_per_s(first_seed)
        .with_context(|| format!("{}: traffic", scenario.path.display()))?;
    let plan = StudyPlan {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        policies: policies.clone(),
        baseline,
        first_seed,
        seeds,
        slo: slo.clone(),
        options,
        base_rate_per_s,
        seed_meaning: seed_meaning(scenario)?,
    };
    Ok((policies, plan))
}
