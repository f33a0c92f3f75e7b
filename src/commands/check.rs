//! `routelab check`: the routing-quality regression gate.
//!
//! Runs the suite (`scenarios/ci/suite.yaml`: scenarios, seeds, per-metric tolerances and quality
//! invariants) and compares every (scenario, policy, metric) — averaged over the seeds — against
//! the committed `baselines/`. A metric that got worse by more than its tolerance is a
//! regression (exit 1); one that got better is reported as an improvement; shares and weights
//! are reported when they move but do not fail. `--update` rewrites the baselines and prints what
//! moved. The simulator is deterministic, so an unchanged tree gives identical output.

use crate::lab::{Job, run_all};
use anyhow::{Context, bail};
use routelab_sim::{RunMetrics, Scenario};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Output format of the comparison table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned plain text.
    Table,
    /// JSON.
    Json,
    /// A Markdown table.
    Markdown,
}

/// Whether a bigger value is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Lower,
    Higher,
    /// Reported when it moves, never a regression (shares, weights).
    Neutral,
}

/// The metrics the gate tracks for one run.
fn metrics_of(m: &RunMetrics) -> Vec<(String, f64, Direction)> {
    use Direction::*;
    let q = |h: &routelab_sim::histogram::Histogram, p: f64| h.quantile_secs(p).unwrap_or(0.0);
    let mean = |h: &routelab_sim::histogram::Histogram| h.mean_secs().unwrap_or(0.0);
    let mut v = vec![
        ("completed".to_string(), m.completed as f64, Higher),
        ("failed".to_string(), m.failed as f64, Lower),
        ("rejected".to_string(), m.rejected as f64, Lower),
        // Requests neither completed, failed loudly nor rejected: must always be 0.
        (
            "lost".to_string(),
            (m.requests - m.completed - m.failed - m.rejected) as f64,
            Lower,
        ),
        ("ttft_mean_s".to_string(), mean(&m.ttft), Lower),
        ("ttft_p50_s".to_string(), q(&m.ttft, 0.5), Lower),
        ("ttft_p99_s".to_string(), q(&m.ttft, 0.99), Lower),
        ("e2e_mean_s".to_string(), mean(&m.e2e), Lower),
        ("e2e_p50_s".to_string(), q(&m.e2e, 0.5), Lower),
        ("e2e_p90_s".to_string(), q(&m.e2e, 0.9), Lower),
        ("e2e_p99_s".to_string(), q(&m.e2e, 0.99), Lower),
        ("e2e_max_s".to_string(), q(&m.e2e, 1.0), Lower),
        ("tpot_p50_s".to_string(), q(&m.tpot, 0.5), Lower),
        ("tpot_p99_s".to_string(), q(&m.tpot, 0.99), Lower),
        ("queue_mean_s".to_string(), mean(&m.queue), Lower),
        ("output_tok_s".to_string(), m.output_tok_s(), Higher),
        ("slo_attainment".to_string(), m.slo_attainment(), Higher),
        (
            "prefix_hit_fraction".to_string(),
            m.prefix_hit_fraction(),
            Higher,
        ),
        ("probe_gpu_s".to_string(), m.probe_gpu_s, Lower),
    ];
    let total: u64 = m.workers.iter().map(|w| w.requests).sum();
    for w in &m.workers {
        let share = if total == 0 {
            0.0
        } else {
            w.requests as f64 / total as f64
        };
        v.push((format!("share:{}", w.name), share, Neutral));
        v.push((format!("weight:{}", w.name), w.final_weight, Neutral));
    }
    v
}

fn direction_of(metric: &str) -> Direction {
    // The baseline stores no direction: derive it from the name, as `metrics_of` does.
    if metric.starts_with("share:") || metric.starts_with("weight:") {
        Direction::Neutral
    } else if matches!(
        metric,
        "completed" | "output_tok_s" | "slo_attainment" | "prefix_hit_fraction"
    ) {
        Direction::Higher
    } else {
        Direction::Lower
    }
}

// ----- suite ------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    seeds: Vec<u64>,
    scenarios: Vec<String>,
    #[serde(default)]
    tolerances: BTreeMap<String, f64>,
    #[serde(default)]
    invariants: Vec<RawInvariant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInvariant {
    scenario: String,
    metric: String,
    op: String,
    /// Left side: a policy, or `*` for every policy of the scenario.
    policy: String,
    /// Right side: another policy's value of the same metric…
    than: Option<String>,
    /// …or a constant.
    value: Option<f64>,
    /// What the invariant says, for the report.
    why: Option<String>,
}

struct Suite {
    seeds: Vec<u64>,
    scenarios: Vec<Scenario>,
    tolerances: BTreeMap<String, f64>,
    invariants: Vec<RawInvariant>,
}

fn load_suite(dir: &Path) -> anyhow::Result<Suite> {
    let file = dir.join("suite.yaml");
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("{}: cannot read", file.display()))?;
    let raw: RawSuite = serde_saphyr::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: {}",
            file.display(),
            e.to_string()
                .replace("<input>", &file.display().to_string())
        )
    })?;
    if raw.seeds.is_empty() {
        bail!(
            "{}: seeds: is empty; give at least one seed",
            file.display()
        );
    }
    let mut scenarios = Vec::new();
    for (i, s) in raw.scenarios.iter().enumerate() {
        let sc = Scenario::load(dir.join(s))
            .map_err(|e| anyhow::anyhow!("{}: scenarios[{i}]: {e}", file.display()))?;
        scenarios.push(sc);
    }
    for (metric, tol) in &raw.tolerances {
        if !(tol.is_finite() && *tol >= 0.0) {
            bail!(
                "{}: tolerances.{metric}: {tol} is not valid; expected a relative tolerance >= 0 (0.05 = 5 %)",
                file.display()
            );
        }
    }
    for (i, inv) in raw.invariants.iter().enumerate() {
        let at = format!("{}: invariants[{i}]", file.display());
        let Some(sc) = scenarios.iter().find(|s| s.name == inv.scenario) else {
            bail!(
                "{at}.scenario: unknown scenario `{}`; suite scenarios: {}",
                inv.scenario,
                scenarios
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let known = |p: &str| sc.policies.iter().any(|q| q.name == p);
        if inv.policy != "*" && !known(&inv.policy) {
            bail!(
                "{at}.policy: `{}` is not a policy of {}",
                inv.policy,
                sc.name
            );
        }
        if let Some(t) = &inv.than
            && !known(t)
        {
            bail!("{at}.than: `{t}` is not a policy of {}", sc.name);
        }
        if inv.than.is_some() == inv.value.is_some() {
            bail!("{at}: give exactly one of `than` (a policy) or `value` (a number)");
        }
        if !["<", "<=", "==", ">=", ">"].contains(&inv.op.as_str()) {
            bail!(
                "{at}.op: `{}` is not valid; expected one of <, <=, ==, >=, >",
                inv.op
            );
        }
    }
    Ok(Suite {
        seeds: raw.seeds,
        scenarios,
        tolerances: raw.tolerances,
        invariants: raw.invariants,
    })
}

// ----- baselines ------------------------------------------------------------------------------------

/// Mean and spread of one metric over the seeds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Stat {
    mean: f64,
    /// Sample standard deviation across seeds.
    spread: f64,
    min: f64,
    max: f64,
}

fn stat(values: &[f64]) -> Stat {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let round = |x: f64| (x * 1e9).round() / 1e9;
    Stat {
        mean: round(mean),
        spread: round(var.sqrt()),
        min: round(values.iter().copied().fold(f64::INFINITY, f64::min)),
        max: round(values.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Baseline {
    scenario: String,
    seeds: Vec<u64>,
    policies: BTreeMap<String, BTreeMap<String, Stat>>,
}

fn baseline_file(dir: &Path, scenario: &str) -> PathBuf {
    dir.join(format!("{}.json", scenario.replace('/', "__")))
}

// ----- comparison -----------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    policy: String,
    metric: String,
    baseline: Option<f64>,
    current: f64,
    delta_pct: Option<f64>,
    tolerance_pct: f64,
    status: &'static str,
}

#[derive(Debug, Clone, Serialize)]
struct InvariantRow {
    scenario: String,
    statement: String,
    left: String,
    right: String,
    holds: bool,
}

fn compare(
    suite: &Suite,
    current: &BTreeMap<String, Baseline>,
    baselines: &BTreeMap<String, Baseline>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (scenario, cur) in current {
        let base = baselines.get(scenario);
        for (policy, metrics) in &cur.policies {
            let bp = base.and_then(|b| b.policies.get(policy));
            for (metric, now) in metrics {
                let was = bp.and_then(|m| m.get(metric));
                let dir = direction_of(metric);
                let (delta_pct, tolerance_pct, status) = match was {
                    None => (None, 0.0, "no-baseline"),
                    Some(was) => {
                        let scale = was.mean.abs().max(1e-12);
                        let delta = (now.mean - was.mean) / scale;
                        // Declared tolerance, else the baseline's seed-to-seed spread.
                        let tol = suite
                            .tolerances
                            .get(metric.split(':').next().unwrap_or(metric))
                            .copied()
                            .unwrap_or(was.spread / scale)
                            .max(1e-9);
                        let worse = match dir {
                            Direction::Lower => delta > tol,
                            Direction::Higher => delta < -tol,
                            Direction::Neutral => false,
                        };
                        let better = match dir {
                            Direction::Lower => delta < -tol,
                            Direction::Higher => delta > tol,
                            Direction::Neutral => false,
                        };
                        let status = if worse {
                            "REGRESSION"
                        } else if better {
                            "improved"
                        } else if delta.abs() > tol {
                            "changed"
                        } else {
                            "ok"
                        };
                        (Some(delta * 100.0), tol * 100.0, status)
                    }
                };
                rows.push(Row {
                    scenario: scenario.clone(),
                    policy: policy.clone(),
                    metric: metric.clone(),
                    baseline: was.map(|s| s.mean),
                    current: now.mean,
                    delta_pct,
                    tolerance_pct,
                    status,
                });
            }
        }
    }
    rows
}

fn check_invariants(suite: &Suite, current: &BTreeMap<String, Baseline>) -> Vec<InvariantRow> {
    let mut out = Vec::new();
    for inv in &suite.invariants {
        let Some(cur) = current.get(&inv.scenario) else {
            continue;
        };
        let policies: Vec<&String> = if inv.policy == "*" {
            cur.policies.keys().collect()
        } else {
            vec![&inv.policy]
        };
        for p in policies {
            let value = |policy: &str| {
                cur.policies
                    .get(policy)
                    .and_then(|m| m.get(&inv.metric))
                    .map(|s| s.mean)
            };
            let Some(l) = value(p) else { continue };
            let (r, right) = match (&inv.than, inv.value) {
                (Some(t), _) => match value(t) {
                    Some(v) => (v, format!("{t} {} = {v:.6}", inv.metric)),
                    None => continue,
                },
                (None, Some(v)) => (v, format!("{v}")),
                (None, None) => continue,
            };
            let holds = match inv.op.as_str() {
                "<" => l < r,
                "<=" => l <= r,
                "==" => l == r,
                ">=" => l >= r,
                _ => l > r,
            };
            out.push(InvariantRow {
                scenario: inv.scenario.clone(),
                statement: inv.why.clone().unwrap_or_else(|| {
                    format!(
                        "{} {} {} {}",
                        p,
                        inv.metric,
                        inv.op,
                        inv.than.clone().unwrap_or_else(|| right.clone())
                    )
                }),
                left: format!("{p} {} = {l:.6}", inv.metric),
                right,
                holds,
            });
        }
    }
    out
}

fn render(rows: &[Row], invariants: &[InvariantRow], format: Format) -> String {
    let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.2}%"));
    let mut s = String::new();
    match format {
        Format::Json => {
            let doc = serde_json::json!({ "comparisons": rows, "invariants": invariants });
            s = serde_json::to_string_pretty(&doc).expect("plain data serializes");
            s.push('\n');
        }
        Format::Markdown => {
            s.push_str("| scenario | policy | metric | baseline | current | delta | tolerance | status |\n");
            s.push_str("|---|---|---|---:|---:|---:|---:|---|\n");
            for r in rows {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.6} | {} | {:.2}% | {} |",
                    r.scenario,
                    r.policy,
                    r.metric,
                    num(r.baseline),
                    r.current,
                    pct(r.delta_pct),
                    r.tolerance_pct,
                    r.status
                );
            }
            s.push_str(
                "\n| scenario | invariant | left | right | holds |\n|---|---|---|---|---|\n",
            );
            for i in invariants {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    i.scenario, i.statement, i.left, i.right, i.holds
                );
            }
        }
        Format::Table => {
            let header = [
                "scenario", "policy", "metric", "baseline", "current", "delta", "tol", "status",
            ];
            let cells: Vec<[String; 8]> = rows
                .iter()
                .map(|r| {
                    [
                        r.scenario.clone(),
                        r.policy.clone(),
                        r.metric.clone(),
                        num(r.baseline),
                        format!("{:.6}", r.current),
                        pct(r.delta_pct),
                        format!("{:.2}%", r.tolerance_pct),
                        r.status.to_string(),
                    ]
                })
                .collect();
            let mut width = header.map(str::len);
            for c in &cells {
                for (w, v) in width.iter_mut().zip(c) {
                    *w = (*w).max(v.len());
                }
            }
            let line = |s: &mut String, c: &[String]| {
                for (i, (v, w)) in c.iter().zip(width).enumerate() {
                    if (3..=6).contains(&i) {
                        let _ = write!(s, "{v:>w$}  ");
                    } else {
                        let _ = write!(s, "{v:<w$}  ");
                    }
                }
                s.truncate(s.trim_end().len());
                s.push('\n');
            };
            line(&mut s, &header.map(String::from));
            for c in &cells {
                line(&mut s, c);
            }
            s.push_str("\ninvariants:\n");
            for i in invariants {
                let _ = writeln!(
                    s,
                    "  [{}] {}: {} ({} vs {})",
                    if i.holds { "ok" } else { "FAILED" },
                    i.scenario,
                    i.statement,
                    i.left,
                    i.right
                );
            }
        }
    }
    s
}

/// Run the gate.
pub fn run(
    suite_dir: &Path,
    baselines_dir: &Path,
    format: Format,
    update: bool,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let suite = load_suite(suite_dir)?;
    // Read (and validate) the committed baselines first: bad input is exit 2 before any work.
    let mut baselines = BTreeMap::new();
    for sc in &suite.scenarios {
        let file = baseline_file(baselines_dir, &sc.name);
        if !file.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("{}: cannot read", file.display()))?;
        let mut de = serde_json::Deserializer::from_str(&text);
        let b: Baseline = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| anyhow::anyhow!("{}: {}: {}", file.display(), e.path(), e.inner()))?;
        if b.scenario != sc.name {
            bail!(
                "{}: scenario: `{}` does not match the suite's scenario `{}` for this file",
                file.display(),
                b.scenario,
                sc.name
            );
        }
        if let Some(p) = b
            .policies
            .keys()
            .find(|p| !sc.policies.iter().any(|q| &&q.name == p))
        {
            bail!(
                "{}: policies.{p}: unknown policy for scenario {}; its policies: {}",
                file.display(),
                sc.name,
                sc.policies
                    .iter()
                    .map(|q| q.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        baselines.insert(sc.name.clone(), b);
    }
    for entry in std::fs::read_dir(baselines_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json")
            && !suite
                .scenarios
                .iter()
                .any(|s| baseline_file(baselines_dir, &s.name) == path)
        {
            bail!(
                "{}: names a scenario that is not in the suite ({}); remove it or add the scenario",
                path.display(),
                suite_dir.join("suite.yaml").display()
            );
        }
    }

    let mut jobs: Vec<Job<'_>> = Vec::new();
    for sc in &suite.scenarios {
        for p in &sc.policies {
            for &seed in &suite.seeds {
                jobs.push(Job {
                    scenario: sc,
                    policy: p,
                    seed,
                    rows: false,
                });
            }
        }
    }
    let outcomes = run_all(&jobs, &|| {})?;
    let mut current: BTreeMap<String, Baseline> = BTreeMap::new();
    let mut per_seed: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for (job, o) in jobs.iter().zip(&outcomes) {
        for (metric, v, _) in metrics_of(&o.metrics) {
            per_seed
                .entry((job.scenario.name.clone(), job.policy.name.clone(), metric))
                .or_default()
                .push(v);
        }
    }
    for ((scenario, policy, metric), values) in per_seed {
        current
            .entry(scenario.clone())
            .or_insert_with(|| Baseline {
                scenario,
                seeds: suite.seeds.clone(),
                policies: BTreeMap::new(),
            })
            .policies
            .entry(policy)
            .or_default()
            .insert(metric, stat(&values));
    }

    let rows = compare(&suite, &current, &baselines);
    let invariants = check_invariants(&suite, &current);
    out.write_all(render(&rows, &invariants, format).as_bytes())?;
    let regressions = rows.iter().filter(|r| r.status == "REGRESSION").count();
    let missing = rows.iter().filter(|r| r.status == "no-baseline").count();
    let failed_invariants = invariants.iter().filter(|i| !i.holds).count();
    let improved = rows.iter().filter(|r| r.status == "improved").count();
    if update {
        std::fs::create_dir_all(baselines_dir)
            .with_context(|| format!("{}: cannot create", baselines_dir.display()))?;
        for (name, b) in &current {
            let file = baseline_file(baselines_dir, name);
            let mut text = serde_json::to_string_pretty(b)?;
            text.push('\n');
            std::fs::write(&file, text)
                .with_context(|| format!("{}: cannot write", file.display()))?;
        }
        let moved: Vec<&Row> = rows.iter().filter(|r| r.status != "ok").collect();
        writeln!(
            out,
            "\nbaselines updated in {} ({} scenario(s)); {} comparison(s) moved:",
            baselines_dir.display(),
            current.len(),
            moved.len()
        )?;
        for r in moved {
            writeln!(
                out,
                "  {} / {} / {}: {} -> {:.6} ({})",
                r.scenario,
                r.policy,
                r.metric,
                r.baseline.map_or("-".into(), |b| format!("{b:.6}")),
                r.current,
                r.status
            )?;
        }
        return Ok(if failed_invariants > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    writeln!(
        out,
        "\n{} comparison(s): {regressions} regression(s), {improved} improvement(s), {missing} without baseline; {} invariant(s), {failed_invariants} failed",
        rows.len(),
        invariants.len()
    )?;
    for r in rows.iter().filter(|r| r.status == "REGRESSION") {
        writeln!(
            out,
            "REGRESSION: scenario {} policy {} metric {}: {} -> {:.6} ({}, tolerance {:.2}%)",
            r.scenario,
            r.policy,
            r.metric,
            r.baseline.map_or("-".into(), |b| format!("{b:.6}")),
            r.current,
            r.delta_pct.map_or("-".into(), |d| format!("{d:+.2}%")),
            r.tolerance_pct
        )?;
    }
    for i in invariants.iter().filter(|i| !i.holds) {
        writeln!(
            out,
            "INVARIANT FAILED: scenario {}: {} ({} vs {})",
            i.scenario, i.statement, i.left, i.right
        )?;
    }
    if missing > 0 {
        writeln!(
            out,
            "{missing} metric(s) have no baseline: run `routelab check --update` and commit baselines/"
        )?;
    }
    Ok(if regressions + failed_invariants + missing > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
