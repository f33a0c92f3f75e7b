//! `routelab plan SCENARIO`: the capacity search at the SLO for the candidate policies under
//! every condition of `routelab_lab::plan::conditions` on the same seeds; the robust choice,
//! the capacity range, `plan.md` / `plan.json` and a gateway configuration that runs the
//! choice at the SLO (`gateway.yaml`, checked by the gateway's own loader before it is written).

use super::compare::fraction_flag;
use crate::lab::{
    ResampleArgs, capacity_of, holdout_fraction, map_parallel, read_fleet_and_trace, read_scenario,
    seed_meaning,
};
use anyhow::Context;
use routelab_gateway::{SloConfig, WorkerConfig, config::fleet_config};
use routelab_lab::capacity::{SearchOptions, SeedPlan, StudyPlan};
use routelab_lab::partial::InputsHash;
use routelab_lab::plan::{PlannedCondition, conditions, run_plan};
use routelab_policies::{InputError, PolicyConfig, PolicyRole};
use routelab_reports::capacity::SloSpec;
use routelab_reports::plan::{plan_paragraph, write_plan};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The policy a plan always considers: ours, which aims at the SLO the gateway is given.
const OURS: &str = "predictive";

/// Options of `routelab plan`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Scenario YAML file (a fleet, a trace source, and the `slo` to plan for); or, instead,
    /// `--fleet`, `--trace` and `--slo`.
    #[arg(required_unless_present = "fleet", conflicts_with = "fleet")]
    pub scenario: Option<PathBuf>,
    /// A fleet file: a scenario without `traffic:` (its fleet, model, hardware_dir, seed and
    /// settings), planned for the traffic of `--trace` at `--slo`.
    #[arg(long, requires_all = ["trace", "slo"])]
    pub fleet: Option<PathBuf>,
    /// With `--fleet`, the traffic: a trace file (azure `.csv`, mooncake `.jsonl`), or a
    /// scenario's trace source in YAML's flow style, e.g. "{path: log.csv, format: csv,
    /// mapping: {arrival: ts, prompt_tokens: in, output_tokens: out}}" (docs/traces.md).
    #[arg(long, requires = "fleet", value_name = "TRACE")]
    pub trace: Option<String>,
    /// Candidate policy (preset or composition); repeat for several. Default: `predictive` and
    /// the scenario's own policies of the field's routers (round robin among them).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// The SLO, as `capacity --slo` (it must bound both ttft and tpot: the gateway's `slo`
    /// holds both). Default: the scenario's `slo` bounds per request, met by `--target`.
    #[arg(long)]
    pub slo: Option<String>,
    /// The fraction of requests that must meet every per-request bound (default 0.9 with the
    /// scenario's `slo`; with `--slo`, as `capacity --target`).
    #[arg(long)]
    pub target: Option<f64>,
    /// Seeds per policy and condition (the same seeds under every condition).
    #[arg(long, default_value_t = 3)]
    pub seeds: usize,
    /// Relative precision of each capacity search (ratios closer than this are a tie).
    #[arg(long, default_value_t = 0.05)]
    pub precision: f64,
    /// The held-out tail: this last fraction of the trace by time is one condition.
    #[arg(long, default_value_t = 0.3, value_name = "F")]
    pub tail: f64,
    /// What a seed means for the trace under the reference condition.
    #[command(flatten)]
    pub resample: ResampleArgs,
    /// Output directory (default: out/plan/<scenario name>/): plan.md, plan.json, gateway.yaml.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The candidate policies: those asked for, or `predictive` and the scenario's field routers.
fn candidates(
    scenario: &routelab_sim::Scenario,
    names: &[String],
) -> anyhow::Result<Vec<PolicyConfig>> {
    if !names.is_empty() {
        return super::run::policies_for(scenario, names);
    }
    let mut out = vec![PolicyConfig::from_name(OURS).context("the predictive preset")?];
    for p in &scenario.policies {
        if p.role() == PolicyRole::Field && out.iter().all(|q| q.name != p.name) {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The SLO searched at, and the gateway's `slo` (per-request TTFT and TPOT bounds) it implies.
fn slo_of(
    args: &PlanArgs,
    scenario: &routelab_sim::Scenario,
) -> anyhow::Result<(SloSpec, SloConfig)> {
    let spec = match &args.slo {
        Some(s) => SloSpec::parse(s, args.target)?,
        None => {
            let s = scenario.setup.slo;
            SloSpec::parse(
                &format!("ttft<={}s,tpot<={}s", s.ttft_s, s.tpot_s),
                Some(args.target.unwrap_or(0.9)),
            )
            .with_context(|| format!("{}: slo", scenario.path.display()))?
        }
    };
    for w in spec.warnings() {
        eprintln!("warning: {w}");
    }
    let per = spec.per_request();
    if !(per.ttft_s.is_finite() && per.tpot_s.is_finite()) {
        return Err(InputError::new(
            super::compare::COMMAND_LINE,
            "--slo",
            format!("`{spec}` does not bound both ttft and tpot"),
        )
        .valid(
            "bounds on both, e.g. ttft_p90<=30s,tpot_p90<=100ms (the gateway's `slo` holds a \
             TTFT and a TPOT bound for the policy to aim at)",
        )
        .into());
    }
    Ok((
        spec,
        SloConfig {
            ttft_s: per.ttft_s,
            tpot_s: per.tpot_s,
        },
    ))
}

/// Run it.
pub fn run(args: &PlanArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let mut read = InputsHash::new();
    let (loaded, source) = match (&args.scenario, &args.fleet, &args.trace) {
        (Some(path), ..) => (read_scenario(path, &mut read)?, path.display().to_string()),
        (None, Some(fleet), Some(trace)) => (
            read_fleet_and_trace(fleet, trace, &mut read)?,
            format!("--fleet {} --trace {trace}", fleet.display()),
        ),
        // clap requires a scenario or --fleet with --trace.
        _ => anyhow::bail!("give a scenario, or --fleet, --trace and --slo"),
    };
    let (slo, gateway_slo) = slo_of(args, &loaded)?;
    let mut scenario = loaded.with_load_scale(1.0)?;
    // Every run records the SLO's per-request bounds, and `predictive` aims at them, as the
    // gateway's `slo` makes it aim there.
    scenario.setup.slo = slo.per_request();
    let policies = candidates(&scenario, &args.policies)?;
    if args.seeds == 0 {
        return Err(
            InputError::new(super::compare::COMMAND_LINE, "--seeds", "0 seeds")
                .valid("a whole number >= 1 (default 3)")
                .into(),
        );
    }
    let options = SearchOptions {
        precision: fraction_flag("--precision", args.precision, "0.05 for 5 %")?,
        ..SearchOptions::default()
    };
    let tail = holdout_fraction(Some(args.tail))?.unwrap_or(0.3);
    let conds = conditions(&scenario, args.resample.default_resample()?, tail)?;
    let first_seed = scenario.setup.seed;
    let planned = conds
        .iter()
        .map(|c| {
            let base_rate_per_s = c
                .scenario
                .as_recorded()
                .mean_arrival_rate_per_s(first_seed)
                .with_context(|| format!("{source}: traffic ({})", c.name))?;
            Ok(PlannedCondition {
                name: c.name.clone(),
                what: c.what.clone(),
                plan: StudyPlan {
                    scenario: scenario.name.clone(),
                    description: scenario.description.clone(),
                    policies: policies.clone(),
                    baseline: 0,
                    first_seed,
                    seeds: SeedPlan::Fixed(args.seeds),
                    slo: slo.clone(),
                    options,
                    base_rate_per_s,
                    seed_meaning: seed_meaning(&c.scenario)?,
                },
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bar = super::compare::progress(0, "plan");
    let study = run_plan(&scenario.name, planned, |batch| {
        if let Some(b) = &bar {
            b.inc_length(batch.len() as u64);
        }
        map_parallel(batch, |&(c, p, seed)| {
            let what = format!(" ({})", conds[c].name);
            let r = capacity_of(
                &conds[c].scenario,
                &policies[p],
                seed,
                &slo,
                &options,
                &what,
            );
            if let Some(b) = &bar {
                b.inc(1);
            }
            r
        })
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join("plan").join(&scenario.name));
    let deploy = dir.join("gateway.yaml");
    let robust = study
        .robust()
        .map(|r| study.policies()[r].to_string())
        .context("no policy to plan for")?;
    write_gateway(&deploy, &scenario, &robust, gateway_slo, &source)?;
    write_plan(&dir, &study, &deploy)?;
    write!(out, "{}", plan_paragraph(&study, &deploy))?;
    writeln!(out, "report: {}", dir.join("plan.md").display())?;
    eprintln!(
        "plan: {} searches in {:.1} s",
        study.conditions.len() * policies.len() * args.seeds,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The gateway configuration: the fleet's workers (at placeholder addresses, one loopback port
/// each, where `routelab emulate` would serve them), the robust policy and the SLO.
fn write_gateway(
    path: &Path,
    scenario: &routelab_sim::Scenario,
    policy: &str,
    slo: SloConfig,
    source: &str,
) -> anyhow::Result<()> {
    let workers: Vec<WorkerConfig> = scenario
        .setup
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| WorkerConfig::from_spec(&w.spec, format!("http://127.0.0.1:{}", 8001 + i)))
        .collect();
    let header = format!(
        "# Written by `routelab plan {}`: the policy it found robust, aiming at the SLO it was\n\
         # measured against. Replace each base_url with the worker's address, then check it:\n\
         #   routelab-gateway --config {} --check\n",
        source,
        path.display()
    );
    let origin = path.display().to_string();
    let (text, _) = fleet_config(&header, policy, slo, &workers, &origin)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("{}: cannot write", path.display()))
}
