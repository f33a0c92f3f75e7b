//! `routelab capacity SCENARIO... --slo ...`: each policy's largest load scale at which the SLO
//! holds, per seed (common random numbers), its interval across seeds and its paired ratio to a
//! baseline policy; with `--findings`, the capacity section of the findings document.

use crate::lab::{Job, map_parallel, run_job};
use anyhow::Context;
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::capacity::{
    CapacityStudy, SearchOptions, SeedPlan, SloSpec, StudyPlan, capacity_table, find_capacity,
    run_study, update_findings, write_capacity,
};
use routelab_reports::stats::AutoSeeds;
use routelab_sim::Scenario;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Plain round robin over every eligible worker: equal weights, the round-robin chooser, no
/// prefix affinity, no cap (the Kubernetes-service default the field compares against).
pub const ROUND_ROBIN: &str = "equal/round-robin/none/none";

/// Options of `routelab capacity`.
#[derive(Debug, clap::Args)]
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

/// Run it.
pub fn run(args: &CapacityArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
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
    let mut studies = Vec::new();
    for (k, scenario) in scenarios.iter().enumerate() {
        let root = args.out.clone();
        let dir = match (root, scenarios.len()) {
            (Some(d), 1) => d,
            (None, 1) => Path::new("out").join("capacity").join(&scenario.name),
            // Several: numbered, so two scenarios with one name never share a directory.
            (root, _) => root
                .unwrap_or_else(|| Path::new("out").join("capacity"))
                .join(format!("{}_{}", k + 1, scenario.name.replace('/', "-"))),
        };
        let study = study(args, scenario, &slo, seeds, options)?;
        write_capacity(&dir, &study)?;
        write!(out, "{}", capacity_table(&study))?;
        writeln!(out, "report: {}\n", dir.join("report.html").display())?;
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

/// The capacity study of one scenario.
fn study(
    args: &CapacityArgs,
    scenario: &Scenario,
    slo: &SloSpec,
    seeds: SeedPlan,
    options: SearchOptions,
) -> anyhow::Result<CapacityStudy> {
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
    let bar = super::compare::progress(0, "capacity");
    let study = run_study(plan, |batch| {
        if let Some(b) = &bar {
            b.inc_length(batch.len() as u64);
        }
        // Each (policy, seed) search runs on its own; results come back in batch order, so
        // the study does not depend on the thread count.
        map_parallel(batch, |&(p, seed)| {
            let policy = &policies[p];
            let found = find_capacity(slo, &options, seed, |scale| {
                let scaled = scenario.with_load_scale(scale)?;
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
                    scenario.path.display(),
                    policy.name
                )
            });
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
