//! `routelab h2h SCENARIO --routers ours,sglang:cache_aware,... --loads 0.5,1.0`: the field's
//! real routers and ours, one at a time in front of the same emulated workers, the scenario's
//! traffic played through each in real time at each load and seed (`routelab_emulator::h2h`).
//! Writes the comparison `routelab compare` writes, one scenario per load (paired over seeds
//! against the first router listed), and `runs.csv`, one row per run with its per-worker
//! shares. The fairness rules are in docs/head-to-head.md.

use anyhow::Context;
use routelab_emulator::h2h::{H2hOptions, RouterSpec, run_one};
use routelab_policies::PolicyRole;
use routelab_reports::{PolicySeeds, ScenarioComparison, compare_table, write_compare};
use routelab_sim::{RunMetrics, Scenario};
use std::io::Write;
use std::path::{Path, PathBuf};
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
    #[arg(long, value_delimiter = ',', required = true)]
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
        args.seeds >= 1,
        "--seeds: 0 is not valid; expected 1 or more"
    );
    for &l in &args.loads {
        anyhow::ensure!(
            l.is_finite() && l > 0.0,
            "--loads: {l} is not valid; expected load scales > 0, e.g. 0.5,0.8,1.0"
        );
    }
    let routers: Vec<RouterSpec> = args
        .routers
        .iter()
        .map(|r| RouterSpec::parse(r).map_err(anyhow::Error::from))
        .collect::<Result<_, _>>()
        .context("--routers")?;
    let mut seen = std::collections::HashSet::new();
    for r in &routers {
        anyhow::ensure!(seen.insert(r.to_string()), "--routers: {r} is listed twice");
    }
    let scenario = Scenario::load(&args.scenario)?;
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| super::run::default_out(&scenario).join("h2h"));
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
    let mut rows = Vec::new();
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
                rows.push(Row {
                    load,
                    router: r.to_string(),
                    seed,
                    metrics: m,
                });
            }
        }
        let mut sc = ScenarioComparison::new(
            format!("{} @ load {load}", scenario.name),
            scenario.description.clone(),
            policies,
        );
        sc.seed_meaning = crate::lab::seed_meaning(&scenario)?;
        comparisons.push(sc);
    }
    write_compare(&dir, &comparisons)?;
    let runs = dir.join("runs.csv");
    write_runs(&runs, &rows)?;
    write!(out, "{}", compare_table(&comparisons))?;
    writeln!(out, "report: {}", dir.join("report.html").display())?;
    writeln!(out, "per run (shares per worker): {}", runs.display())?;
    Ok(ExitCode::SUCCESS)
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

struct Row {
    load: f64,
    router: String,
    seed: u64,
    metrics: RunMetrics,
}

/// `runs.csv`: one row per run — load, router, seed, requests and their outcomes, attainment
/// of the scenario's SLO, TTFT / TPOT / e2e p50 and p99 (scenario seconds), and each worker's
/// share of the requests (as `x-routelab-worker` named it).
fn write_runs(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let workers: Vec<String> = rows
        .first()
        .map(|r| r.metrics.workers.iter().map(|w| w.name.clone()).collect())
        .unwrap_or_default();
    let mut s = String::from(
        "load,router,seed,requests,completed,failed,rejected,slo_attainment,ttft_p50_s,ttft_p99_s,tpot_p50_s,tpot_p99_s,e2e_p50_s,e2e_p99_s",
    );
    for w in &workers {
        let _ = write!(s, ",share:{}", file_safe(w));
    }
    s.push('\n');
    let o = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    for r in rows {
        let m = &r.metrics;
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.load,
            r.router,
            r.seed,
            m.requests,
            m.completed,
            m.failed,
            m.rejected,
            o(m.slo_attainment()),
            o(m.ttft.quantile_secs(0.5)),
            o(m.ttft.quantile_secs(0.99)),
            o(m.tpot.quantile_secs(0.5)),
            o(m.tpot.quantile_secs(0.99)),
            o(m.e2e.quantile_secs(0.5)),
            o(m.e2e.quantile_secs(0.99)),
        );
        let total: u64 = m.workers.iter().map(|w| w.requests).sum();
        for w in &workers {
            let n = m
                .workers
                .iter()
                .find(|x| &x.name == w)
                .map_or(0, |x| x.requests);
            let share = (total > 0).then(|| n as f64 / total as f64);
            let _ = write!(s, ",{}", o(share));
        }
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}
