//! `routelab h2h SCENARIO --routers ours,sglang:cache_aware,... --loads 0.5,1.0`: the field's
//! real routers and ours, one at a time in front of the same emulated workers, the scenario's
//! traffic played through each in real time at each load and seed (`routelab_emulator::h2h`).
//! Writes the comparison `routelab compare` writes, one scenario per load (paired over seeds
//! against the first router listed), `runs.csv`, one row per run with its per-worker shares,
//! and the head-to-head's charts; with `--findings`, this scenario's part of the "Against the
//! originals" section of the findings, the lab's copies of the field routers run in the
//! simulator on the same scenario, loads and seeds beside what the originals measured.
//! `--reuse` re-writes those from an earlier run's `runs.csv` without running anything.
//! The fairness rules are in docs/head-to-head.md.

use anyhow::Context;
use routelab_emulator::h2h::{H2hOptions, RouterSpec, run_one};
use routelab_policies::PolicyConfig;
use routelab_policies::PolicyRole;
use routelab_reports::h2h::findings::{H2hStudy, update_findings};
use routelab_reports::h2h::{RunRow, Runs, write_h2h_charts};
use routelab_reports::{PolicySeeds, ScenarioComparison, compare_table, write_compare};
use routelab_sim::Scenario;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Options of `routelab h2h`.
#[derive(Debug, clap::Args)]
pub struct H2hArgs {
    /// Scenario YAML file (its fleet is emulated, its traffic played).
    pub scenario: PathBuf,
    /// Routers, comma-separated, the first the baseline of the paired differences: `ours`
    /// (the gateway's default policy), `ours:POLICY`, `sglang:POLICY` (cache_aware,
    /// power_of_two, round_robin, random), `vllm:POLICY` (cache_aware, power_of_two, kv_aware,
    /// consistent_hash, sticky_least_loaded, round_robin, random).
    #[arg(long, value_delimiter = ',', required_unless_present = "reuse")]
    pub routers: Vec<String>,
    /// Load scales of the scenario's traffic, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1.0")]
    pub loads: Vec<f64>,
    /// Seeds per load (seed k is the scenario's seed + k, as in `compare`).
    #[arg(long, default_value_t = 1)]
    pub seeds: usize,
    /// Scenario time runs this many times faster than wall time.
    #[arg(long, default_value_t = 10.0)]
    pub speedup: f64,
    /// Output directory (default: out/<scenario name>/h2h/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The venv of the field's routers (default: what deploy/field-routers/install.sh fills,
    /// ${ROUTELAB_FIELD_ROUTERS:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab/field-routers}/venv).
    #[arg(long)]
    pub field_routers: Option<PathBuf>,
    /// The port each router listens on in turn (default: a free one per run).
    #[arg(long)]
    pub router_port: Option<u16>,
    /// Seconds a field router may take to be ready.
    #[arg(long, default_value_t = 60.0)]
    pub start_timeout_s: f64,
    /// Seconds (wall) one request may take.
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout_s: f64,
    /// Also write this scenario's part of the "Against the originals" section of this findings
    /// document (e.g. docs/findings.md): the table per load, the verdict, and the lab's copies
    /// of the field routers run in the simulator on the same scenario, loads and seeds.
    #[arg(long)]
    pub findings: Option<PathBuf>,
    /// Run nothing: read the runs of an earlier `h2h` from `--out`'s runs.csv and write the
    /// charts (and with `--findings` the findings) from them. Give the same `--speedup`.
    #[arg(long)]
    pub reuse: bool,
    /// A router meets the SLO at a load when its mean attainment over the seeds is at least
    /// this (the findings' verdict).
    #[arg(long, default_value_t = 0.9)]
    pub target: f64,
    /// Fault injection for tests: `WORKER:SECONDS` crashes that worker's emulator that long
    /// into the first run's traffic.
    #[arg(long, hide = true)]
    pub kill_worker_after: Option<String>,
}

/// The default venv of the field's routers, as `deploy/field-routers/install.sh` chooses it.
pub fn default_field_routers() -> PathBuf {
    let base = match std::env::var_os("ROUTELAB_FIELD_ROUTERS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"));
            cache.join("routelab").join("field-routers")
        }
    };
    base.join("venv")
}

fn positive_secs(what: &str, s: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0,
        "{what}: {s} is not valid; expected a number of seconds > 0"
    );
    Ok(Duration::from_secs_f64(s))
}

/// Run it.
pub fn run(args: &H2hArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.speedup.is_finite() && args.speedup > 0.0,
        "--speedup: {} is not valid; expected a number > 0",
        args.speedup
    );
    anyhow::ensure!(
        args.target.is_finite() && args.target > 0.0 && args.target <= 1.0,
        "--target: {} is not valid; expected a share in (0, 1], e.g. 0.9",
        args.target
    );
    let scenario = Scenario::load(&args.scenario)?;
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| super::run::default_out(&scenario).join("h2h"));
    let runs = if args.reuse {
        let path = dir.join("runs.csv");
        let runs = Runs::read(&path)?;
        anyhow::ensure!(
            !runs.rows.is_empty(),
            "{}: no runs to reuse; run `routelab h2h` without --reuse first",
            path.display()
        );
        writeln!(
            out,
            "reusing {} runs of {}",
            runs.rows.len(),
            path.display()
        )?;
        runs
    } else {
        run_all(args, &scenario, &dir, out)?
    };
    for f in write_h2h_charts(&dir, &scenario.name, Some(args.target), &runs)? {
        writeln!(out, "chart: {}", f.display())?;
    }
    if let Some(f) = &args.findings {
        let study = study(args, &scenario, runs)?;
        study.copies.write(&dir.join("copies.csv"))?;
        crate::lab::rewrite_findings(f, |old| update_findings(old, &[study]))?;
        writeln!(out, "findings: {}", f.display())?;
        writeln!(
            out,
            "the copies in the simulator: {}",
            dir.join("copies.csv").display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Every run of `--routers` at every load and seed, in real time; writes what `compare` writes
/// and `runs.csv`.
fn run_all(
    args: &H2hArgs,
    scenario: &Scenario,
    dir: &std::path::Path,
    out: &mut impl Write,
) -> anyhow::Result<Runs> {
    anyhow::ensure!(
        args.seeds >= 1,
        "--seeds: 0 is not valid; expected 1 or more"
    );
    for &l in &args.loads {
        anyhow::ensure!(
            l.is_finite() && l > 0.0,
            "--loads: {l} is not valid; expected load scales > 0, e.g. 0.5,0.8,1.0"
        );
    }
    let routers = parse_routers(&args.routers)?;
    let mut opts = H2hOptions::new(
        args.speedup,
        args.field_routers
            .clone()
            .unwrap_or_else(default_field_routers),
    );
    opts.start_timeout = positive_secs("--start-timeout-s", args.start_timeout_s)?;
    opts.request_timeout = positive_secs("--request-timeout-s", args.request_timeout_s)?;
    opts.router_port = args.router_port;
    if let Some(k) = &args.kill_worker_after {
        let (w, s) = k
            .rsplit_once(':')
            .context("--kill-worker-after: expected WORKER:SECONDS")?;
        let s: f64 = s
            .parse()
            .with_context(|| format!("--kill-worker-after: `{s}` is not a number of seconds"))?;
        opts.kill_worker_after = Some((w.to_string(), positive_secs("--kill-worker-after", s)?));
    }
    // Every field router must be there before anything starts.
    for r in &routers {
        if let Some(p) = opts.program(r) {
            anyhow::ensure!(
                p.is_file(),
                "{r}: {} is missing (the field's routers are not installed there); run deploy/field-routers/install.sh or point --field-routers at its venv",
                p.display()
            );
        }
    }

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let mut comparisons = Vec::new();
    let mut runs = Runs {
        workers: scenario
            .setup
            .workers
            .iter()
            .map(|w| w.spec.name.clone())
            .collect(),
        rows: Vec::new(),
    };
    for &load in &args.loads {
        let scaled = scenario
            .with_load_scale(load)
            .with_context(|| format!("scaling {} to load {load}", scenario.name))?;
        let mut policies: Vec<PolicySeeds> = routers
            .iter()
            .map(|r| PolicySeeds::new(r.to_string(), role_of(r)))
            .collect();
        for k in 0..args.seeds {
            let seed = routelab_lab::seed_of(scenario.setup.seed, k);
            for (r, seeds) in routers.iter().zip(&mut policies) {
                let log = dir.join("logs").join(format!(
                    "{}-load{load}-seed{seed}.log",
                    file_safe(&r.to_string())
                ));
                writeln!(out, "load {load}, seed {seed}: {r} ...")?;
                out.flush()?;
                let report = runtime
                    .block_on(run_one(&scaled, seed, r, &opts, &log))
                    .with_context(|| format!("{} at load {load}, seed {seed}", scenario.name))?;
                // The fault is injected once.
                opts.kill_worker_after = None;
                let mut m = report.metrics;
                m.role = role_of(r);
                seeds.push(seed, &m);
                runs.rows
                    .push(RunRow::of(load, &r.to_string(), seed, &m, &runs.workers));
            }
        }
        let mut sc = ScenarioComparison::new(
            format!("{} @ load {load}", scenario.name),
            scenario.description.clone(),
            policies,
        );
        sc.seed_meaning = crate::lab::seed_meaning(scenario)?;
        comparisons.push(sc);
    }
    write_compare(dir, &comparisons)?;
    let path = dir.join("runs.csv");
    runs.write(&path)?;
    write!(out, "{}", compare_table(&comparisons))?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    writeln!(out, "per run (shares per worker): {}", path.display())?;
    Ok(runs)
}

fn parse_routers(names: &[String]) -> anyhow::Result<Vec<RouterSpec>> {
    let routers: Vec<RouterSpec> = names
        .iter()
        .map(|r| RouterSpec::parse(r).map_err(anyhow::Error::from))
        .collect::<Result<_, _>>()
        .context("--routers")?;
    let mut seen = std::collections::HashSet::new();
    for r in &routers {
        anyhow::ensure!(seen.insert(r.to_string()), "--routers: {r} is listed twice");
    }
    Ok(routers)
}

/// The findings' study: the runs, and each router's copy run in the simulator on the same
/// scenario, loads and seeds (ours: the gateway's policy itself).
fn study(args: &H2hArgs, scenario: &Scenario, runs: Runs) -> anyhow::Result<H2hStudy> {
    let mut copy_names = Vec::new();
    let mut configs: Vec<(String, PolicyConfig)> = Vec::new();
    for name in runs.routers() {
        let r =
            RouterSpec::parse(&name).with_context(|| format!("runs.csv names router `{name}`"))?;
        let config = match (r.is_field(), &r.policy) {
            (false, Some(p)) => Some(PolicyConfig::from_name(p)?),
            (false, None) => Some(
                routelab_gateway::GatewayConfig::from_yaml("workers: []\n", "defaults")
                    .map_err(|e| anyhow::anyhow!("the gateway's defaults: {e}"))?
                    .policy
                    .build()?,
            ),
            (true, _) => r.copy_policy().map(PolicyConfig::from_name).transpose()?,
        };
        if let Some(c) = config {
            copy_names.push((name.clone(), c.name.clone()));
            configs.push((name, c));
        }
    }
    let mut seeds: Vec<u64> = runs.rows.iter().map(|r| r.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let mut copies = Runs {
        workers: runs.workers.clone(),
        rows: Vec::new(),
    };
    for load in runs.loads() {
        let scaled = scenario.with_load_scale(load)?;
        let mut jobs = Vec::new();
        let mut labels = Vec::new();
        for (name, config) in &configs {
            for &seed in &seeds {
                jobs.push(crate::lab::Job {
                    scenario: &scaled,
                    policy: config,
                    seed,
                    rows: false,
                });
                labels.push((name.clone(), seed));
            }
        }
        let outcomes = crate::lab::run_all(&jobs, &|| {})?;
        for ((name, seed), o) in labels.iter().zip(outcomes) {
            copies
                .rows
                .push(RunRow::of(load, name, *seed, &o.metrics, &copies.workers));
        }
    }
    Ok(H2hStudy {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        slo: scenario.setup.slo.to_string(),
        target: args.target,
        speedup: args.speedup,
        seed_meaning: String::new(),
        runs,
        field_routers: RouterSpec::every_field_router(),
        copies,
        copy_names,
    })
}

fn role_of(r: &RouterSpec) -> PolicyRole {
    if r.is_field() {
        PolicyRole::Field
    } else {
        PolicyRole::Ours
    }
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
