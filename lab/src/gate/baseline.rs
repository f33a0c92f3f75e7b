//! Committed baselines (`baselines/<scenario>.json`): per policy and gate metric, the mean and
//! spread over the suite's seeds. Read with located errors; written only by `check --update`.

use super::GateError;
use routelab_policies::InputError;
use routelab_reports::metric::{CATALOG, WORKER_METRICS, direction_of_key};
use routelab_sim::{RunMetrics, Scenario};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Mean and spread of one metric over the seeds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation across seeds.
    pub spread: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Stat {
    /// Of the values of one metric over the seeds (at least one), rounded to 1e-9 so that
    /// the files do not churn in the last bits.
    pub fn of(values: &[f64]) -> Stat {
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
}

/// One scenario's baseline (also the shape of a fresh measurement). A metric a policy has no
/// value for is absent from its map.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Scenario name.
    pub scenario: String,
    /// Seeds it was measured on.
    pub seeds: Vec<u64>,
    /// Policy → metric key → statistics.
    pub policies: BTreeMap<String, BTreeMap<String, Stat>>,
}

/// Baselines (or a measurement) of every scenario, by scenario name.
pub type Baselines = BTreeMap<String, Baseline>;

/// The file of a scenario's baseline in `dir`.
pub fn baseline_file(dir: &Path, scenario: &str) -> PathBuf {
    dir.join(format!("{}.json", scenario.replace('/', "__")))
}

/// Every gate key of a run with its value (`None`: the run has no value).
pub fn gate_values(m: &RunMetrics) -> Vec<(String, Option<f64>)> {
    let mut v: Vec<(String, Option<f64>)> = CATALOG
        .iter()
        .filter(|c| c.gate)
        .map(|c| (c.name.to_string(), c.read(m)))
        .collect();
    for (i, w) in m.workers.iter().enumerate() {
        for wm in WORKER_METRICS {
            v.push((wm.key(&w.name), wm.read(m, i)));
        }
    }
    v
}

/// Aggregate runs — (scenario, policy, metrics of one seed) — into one [`Baseline`] per
/// scenario. A metric missing on any seed is missing for the policy: a mean over the seeds
/// that have it would hide the seed that failed.
pub fn measure<'a>(
    seeds: &[u64],
    runs: impl IntoIterator<Item = (&'a str, &'a str, &'a RunMetrics)>,
) -> Baselines {
    measure_values(
        seeds,
        runs.into_iter()
            .map(|(scenario, policy, m)| (scenario, policy, gate_values(m))),
    )
}

/// [`measure`] over each run's [`gate_values`] (what a partial result of `check` records), in
/// the same order.
pub fn measure_values<'a>(
    seeds: &[u64],
    runs: impl IntoIterator<Item = (&'a str, &'a str, Vec<(String, Option<f64>)>)>,
) -> Baselines {
    let mut per_seed: BTreeMap<(String, String, String), Vec<Option<f64>>> = BTreeMap::new();
    for (scenario, policy, values) in runs {
        for (key, v) in values {
            per_seed
                .entry((scenario.to_string(), policy.to_string(), key))
                .or_default()
                .push(v);
        }
    }
    let mut out = Baselines::new();
    for ((scenario, policy, key), values) in per_seed {
        let metrics = out
            .entry(scenario.clone())
            .or_insert_with(|| Baseline {
                scenario,
                seeds: seeds.to_vec(),
                policies: BTreeMap::new(),
            })
            .policies
            .entry(policy)
            .or_default();
        if let Some(values) = values.into_iter().collect::<Option<Vec<f64>>>() {
            metrics.insert(key, Stat::of(&values));
        }
    }
    out
}

/// A JSON error as an [`InputError`]: file, line, column and field path.
pub(crate) fn json_error(
    file: &str,
    e: &serde_path_to_error::Error<serde_json::Error>,
) -> InputError {
    let inner = e.inner();
    // serde_json appends the position to its message; it is in the location already.
    let message = inner.to_string();
    let suffix = format!(" at line {} column {}", inner.line(), inner.column());
    let message = message.strip_suffix(&suffix).unwrap_or(&message);
    let path = e.path().to_string();
    let field = if path == "." { String::new() } else { path };
    InputError::new(file, field, message).at(
        u32::try_from(inner.line()).ok(),
        u32::try_from(inner.column()).ok(),
    )
}

/// Parse and validate one baseline file's text against its scenario.
pub fn parse_baseline(text: &str, file: &str, scenario: &Scenario) -> Result<Baseline, GateError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let b: Baseline =
        serde_path_to_error::deserialize(&mut de).map_err(|e| json_error(file, &e))?;
    if b.scenario != scenario.name {
        return Err(InputError::new(
            file,
            "scenario",
            format!(
                "`{}` does not match the suite's scenario `{}` for this file",
                b.scenario, scenario.name
            ),
        )
        .into());
    }
    let policies = || {
        scenario
            .policies
            .iter()
            .map(|q| q.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (p, metrics) in &b.policies {
        if !scenario.policies.iter().any(|q| &q.name == p) {
            return Err(InputError::new(
                file,
                format!("policies.{p}"),
                format!("unknown policy for scenario {}", scenario.name),
            )
            .valid(policies())
            .into());
        }
        if let Some(k) = metrics.keys().find(|k| direction_of_key(k).is_none()) {
            return Err(InputError::new(
                file,
                format!("policies.{p}.{k}"),
                "unknown metric; `routelab check --update` writes only gate metrics",
            )
            .into());
        }
    }
    Ok(b)
}

/// Read the committed baselines of the suite's scenarios from `dir` (a scenario without a file
/// has no baseline yet). A JSON file in `dir` that names no suite scenario is an error.
pub fn load_baselines(
    dir: &Path,
    scenarios: &[Scenario],
    suite_file: &str,
) -> Result<Baselines, GateError> {
    let mut out = Baselines::new();
    for sc in scenarios {
        let path = baseline_file(dir, &sc.name);
        if !path.exists() {
            continue;
        }
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| InputError::unreadable(&file, &e))?;
        out.insert(sc.name.clone(), parse_baseline(&text, &file, sc)?);
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json")
            && !scenarios
                .iter()
                .any(|s| baseline_file(dir, &s.name) == path)
        {
            return Err(InputError::new(
                path.display().to_string(),
                "",
                format!(
                    "names a scenario that is not in the suite ({suite_file}); remove it or add the scenario"
                ),
            )
            .into());
        }
    }
    Ok(out)
}

/// Write one file per measured scenario into `dir` (created if missing).
pub fn write_baselines(dir: &Path, measured: &Baselines) -> Result<(), GateError> {
    routelab_reports::export::create_dir(dir)?;
    for (name, b) in measured {
        routelab_reports::export::json::write_json(&baseline_file(dir, name), b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        Scenario::load(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/seed/sixteen-at-once.yaml"),
        )
        .unwrap()
    }

    #[test]
    fn stat_matches_hand_computation() {
        let s = Stat::of(&[1.0, 2.0, 3.0]);
        assert_eq!((s.mean, s.spread, s.min, s.max), (2.0, 1.0, 1.0, 3.0));
        assert_eq!(Stat::of(&[5.0]).spread, 0.0);
    }

    #[test]
    fn a_metric_missing_on_one_seed_is_missing() {
        let mut done = RunMetrics::new("p", vec![]);
        done.requests = 1;
        done.completed = 1;
        done.e2e.record_secs(1.0);
        let nothing = RunMetrics::new("p", vec![]);
        let m = measure(&[1, 2], [("s", "p", &done), ("s", "p", &nothing)]);
        let p = &m["s"].policies["p"];
        assert!(!p.contains_key("e2e_mean_s"));
        assert_eq!(p["completed"].mean, 0.5);
    }

    #[test]
    fn bad_json_is_located() {
        let sc = scenario();
        let text = "{ \"scenario\": \"seed/sixteen-at-once\", \"seeds\": [1],\n  \"policies\": { \"seed-v1\": 7 } }";
        let e = parse_baseline(text, "b.json", &sc)
            .map_err(|e| e.input().cloned().unwrap())
            .unwrap_err();
        assert_eq!(e.field, "policies.seed-v1");
        assert_eq!(e.line, Some(2));
        assert!(e.column.is_some());
        assert!(e.message.starts_with("invalid type: integer `7`"), "{e}");
        assert!(!e.message.contains("at line"), "{e}");
        let text = "{ \"scenario\": \"seed/sixteen-at-once\", \"seeds\": [1], \"policies\": { \"seed-v1\": { \"e2e_mean\": { \"mean\": 1, \"spread\": 0, \"min\": 1, \"max\": 1 } } } }";
        let e = parse_baseline(text, "b.json", &sc)
            .map_err(|e| e.input().cloned().unwrap())
            .unwrap_err();
        assert_eq!(e.field, "policies.seed-v1.e2e_mean");
        let e = parse_baseline(&text.replace("seed-v1", "seed-v9"), "b.json", &sc)
            .map_err(|e| e.input().cloned().unwrap())
            .unwrap_err();
        assert_eq!(e.field, "policies.seed-v9");
        assert!(e.valid.as_deref().unwrap().contains("seed-v3"));
    }
}
