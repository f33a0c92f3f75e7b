//! `routelab sweep SCENARIO --set path.to.field=v1,v2`: a parameter grid, run in parallel.
//!
//! A `--set` path addresses the scenario's YAML: `traffic[0].poisson.rate_per_s`,
//! `fleet[1].speed_factor`, `slo.ttft_s`. Several `--set` make a grid (their cartesian product).

use crate::lab::{Job, run_all};
use anyhow::{Context, bail};
use routelab_reports::{RunSummary, SweepRow, sweep_table, write_sweep};
use routelab_sim::Scenario;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `routelab sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Scenario YAML file.
    pub scenario: PathBuf,
    /// `path=v1,v2,...`, e.g. traffic[0].poisson.rate_per_s=1,2,4.
    #[arg(long, required = true)]
    pub set: Vec<String>,
    /// Policy; repeat for several. Default: the scenario's list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory (default: out/<scenario name>/sweep/).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One step of a field path.
#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

fn parse_path(path: &str) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if key.is_empty() && rest.is_empty() {
            bail!("`{path}`: empty segment; expected e.g. traffic[0].poisson.rate_per_s");
        }
        if !key.is_empty() {
            steps.push(Step::Key(key.to_string()));
        }
        while let Some(r) = rest.strip_prefix('[') {
            let end = r
                .find(']')
                .with_context(|| format!("`{path}`: missing `]`"))?;
            let idx = r[..end]
                .parse()
                .with_context(|| format!("`{path}`: `{}` is not an index", &r[..end]))?;
            steps.push(Step::Index(idx));
            rest = &r[end + 1..];
        }
    }
    Ok(steps)
}

fn set_path(doc: &mut Value, steps: &[Step], value: Value, path: &str) -> anyhow::Result<()> {
    let mut cur = doc;
    for (i, s) in steps.iter().enumerate() {
        let last = i + 1 == steps.len();
        cur = match s {
            Step::Key(k) => {
                let map = cur
                    .as_object_mut()
                    .with_context(|| format!("`{path}`: `{k}` is not inside a mapping"))?;
                if last {
                    map.insert(k.clone(), value);
                    return Ok(());
                }
                map.get_mut(k)
                    .with_context(|| format!("`{path}`: the scenario has no `{k}` there"))?
            }
            Step::Index(n) => {
                let list = cur
                    .as_array_mut()
                    .with_context(|| format!("`{path}`: [{n}] is not inside a list"))?;
                let len = list.len();
                let item = list.get_mut(*n).with_context(|| {
                    format!("`{path}`: index {n} is out of range (the list has {len})")
                })?;
                if last {
                    *item = value;
                    return Ok(());
                }
                item
            }
        };
    }
    bail!("`{path}`: empty path")
}

fn scalar(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

/// Run it.
pub fn run(args: &SweepArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !args.set.is_empty(),
        "give at least one --set path=v1,v2,..."
    );
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("{}: cannot read", args.scenario.display()))?;
    // Validate the base scenario first, for located errors.
    let base = Scenario::from_yaml(&text, &args.scenario)?;
    let doc: Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.scenario.display()))?;
    let mut params = Vec::new();
    let mut axes: Vec<(Vec<Step>, Vec<String>)> = Vec::new();
    for s in &args.set {
        let (path, values) = s
            .split_once('=')
            .with_context(|| format!("--set {s}: expected path=v1,v2,..."))?;
        let values: Vec<String> = values.split(',').map(str::trim).map(String::from).collect();
        anyhow::ensure!(
            values.iter().all(|v| !v.is_empty()),
            "--set {s}: an empty value"
        );
        params.push(path.to_string());
        axes.push((parse_path(path)?, values));
    }
    // The grid, in a fixed order: the last --set varies fastest.
    let mut grid: Vec<Vec<usize>> = vec![Vec::new()];
    for (_, values) in &axes {
        grid = grid
            .into_iter()
            .flat_map(|g| {
                (0..values.len()).map(move |i| {
                    let mut g = g.clone();
                    g.push(i);
                    g
                })
            })
            .collect();
    }
    let mut points: Vec<(Vec<String>, Scenario)> = Vec::new();
    for g in &grid {
        let mut d = doc.clone();
        let mut labels = Vec::new();
        for ((steps, values), &i) in axes.iter().zip(g) {
            set_path(&mut d, steps, scalar(&values[i]), &params[labels.len()])?;
            labels.push(values[i].clone());
        }
        let yaml = serde_saphyr::to_string(&d).context("re-serialising the scenario")?;
        let sc = Scenario::from_yaml(&yaml, &args.scenario).with_context(|| {
            format!(
                "with {}",
                params
                    .iter()
                    .zip(&labels)
                    .map(|(p, v)| format!("{p}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })?;
        points.push((labels, sc));
    }
    let policies = super::run::policies_for(&base, &args.policies)?;
    let seed = args.seed.unwrap_or(base.setup.seed);
    let mut jobs = Vec::new();
    for (_, sc) in &points {
        for p in &policies {
            jobs.push(Job {
                scenario: sc,
                policy: p,
                seed,
                rows: false,
            });
        }
    }
    let bar = super::compare::progress(jobs.len() as u64, "sweep");
    let outcomes = run_all(&jobs, &|| {
        if let Some(b) = &bar {
            b.inc(1);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut rows: Vec<SweepRow> = Vec::new();
    let mut it = outcomes.iter();
    for (labels, _) in &points {
        for p in &policies {
            let o = it.next().context("one outcome per job")?;
            rows.push((
                labels.clone(),
                p.name.clone(),
                RunSummary::from_metrics(&o.metrics),
            ));
        }
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(&base.name).join("sweep"));
    write_sweep(&dir, &params, &rows)?;
    write!(out, "{}", sweep_table(&params, &rows))?;
    writeln!(out, "sweep: {}", dir.join("sweep.csv").display())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_and_set() {
        assert_eq!(
            parse_path("traffic[0].poisson.rate_per_s").unwrap(),
            vec![
                Step::Key("traffic".into()),
                Step::Index(0),
                Step::Key("poisson".into()),
                Step::Key("rate_per_s".into())
            ]
        );
        let mut doc: Value =
            serde_json::from_str(r#"{"traffic":[{"poisson":{"rate_per_s":1}}]}"#).unwrap();
        set_path(
            &mut doc,
            &parse_path("traffic[0].poisson.rate_per_s").unwrap(),
            scalar("2.5"),
            "p",
        )
        .unwrap();
        assert_eq!(doc["traffic"][0]["poisson"]["rate_per_s"], 2.5);
        let err = set_path(
            &mut doc,
            &parse_path("traffic[3].x").unwrap(),
            scalar("1"),
            "p",
        );
        assert!(err.unwrap_err().to_string().contains("out of range"));
        assert!(parse_path("a[x]").is_err());
    }
}
