//! The gate's suite (`suite.yaml`): scenarios, seeds, tolerances and quality invariants, parsed
//! raw and then validated into a [`Suite`]; every failure is a located [`InputError`].

use super::GateError;
use routelab_policies::InputError;
use routelab_policies::located::parse_yaml;
use routelab_reports::metric::{CATALOG, WORKER_METRICS, direction_of_key};
use routelab_sim::Scenario;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    seeds: Spanned<Vec<u64>>,
    scenarios: Vec<Spanned<String>>,
    #[serde(default)]
    tolerances: BTreeMap<String, Spanned<f64>>,
    #[serde(default)]
    invariants: Vec<Spanned<RawInvariant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInvariant {
    scenario: Spanned<String>,
    metric: Spanned<String>,
    op: Spanned<String>,
    /// Left side: a policy, or `*` for every policy of the scenario.
    policy: Spanned<String>,
    /// Right side: another policy's value of the same metric…
    than: Option<Spanned<String>>,
    /// …or a constant.
    value: Option<f64>,
    /// What the invariant says, for the report.
    why: Option<String>,
}

/// A comparison operator of an invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `==`
    Eq,
    /// `>=`
    Ge,
    /// `>`
    Gt,
}

impl Op {
    const ALL: [Op; 5] = [Op::Lt, Op::Le, Op::Eq, Op::Ge, Op::Gt];

    /// As written in the suite.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ge => ">=",
            Op::Gt => ">",
        }
    }

    /// Whether `l op r` holds.
    pub fn holds(self, l: f64, r: f64) -> bool {
        match self {
            Op::Lt => l < r,
            Op::Le => l <= r,
            Op::Eq => l == r,
            Op::Ge => l >= r,
            Op::Gt => l > r,
        }
    }
}

/// The right side of an invariant.
#[derive(Debug, Clone, PartialEq)]
pub enum Rhs {
    /// Another policy's value of the same metric.
    Policy(String),
    /// A constant.
    Value(f64),
}

/// A quality statement about the current run: `policy metric op rhs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Invariant {
    /// Scenario name.
    pub scenario: String,
    /// Gate metric key (`e2e_max_s`, `share:pair`).
    pub metric: String,
    /// Operator.
    pub op: Op,
    /// Left side: a policy, or `*` for every policy of the scenario.
    pub policy: String,
    /// Right side.
    pub rhs: Rhs,
    /// What the invariant says, for the report.
    pub why: Option<String>,
}

/// A validated suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The suite file.
    pub file: String,
    /// Seeds every scenario runs on.
    pub seeds: Vec<u64>,
    /// Scenarios, loaded.
    pub scenarios: Vec<Scenario>,
    /// Relative tolerance per metric name (a per-worker metric's prefix covers every worker).
    pub tolerances: BTreeMap<String, f64>,
    /// Invariants.
    pub invariants: Vec<Invariant>,
}

fn at<T>(e: InputError, s: &Spanned<T>) -> InputError {
    let loc = s.referenced;
    e.at(
        u32::try_from(loc.line()).ok(),
        u32::try_from(loc.column()).ok(),
    )
}

fn list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items.into_iter().collect::<Vec<_>>().join(", ")
}

/// Every key the gate can track, for "valid:" lists.
fn gate_keys() -> String {
    let mut keys: Vec<String> = CATALOG
        .iter()
        .filter(|m| m.gate)
        .map(|m| m.name.to_string())
        .collect();
    keys.extend(
        WORKER_METRICS
            .iter()
            .map(|w| format!("{}:<worker>", w.name)),
    );
    keys.join(", ")
}

impl Suite {
    /// Read and validate `dir/suite.yaml` (scenario paths are relative to `dir`).
    pub fn load(dir: &Path) -> Result<Suite, GateError> {
        let path = dir.join("suite.yaml");
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| InputError::unreadable(&file, &e))?;
        Suite::from_yaml(&text, &file, dir)
    }

    /// Validate suite text; `file` names it in errors, `dir` anchors the scenario paths.
    pub fn from_yaml(text: &str, file: &str, dir: &Path) -> Result<Suite, GateError> {
        let raw: RawSuite = parse_yaml(text, file)?;
        if raw.seeds.value.is_empty() {
            return Err(at(
                InputError::new(file, "seeds", "is empty; give at least one seed"),
                &raw.seeds,
            )
            .into());
        }
        let mut scenarios = Vec::new();
        for (i, s) in raw.scenarios.iter().enumerate() {
            let sc = Scenario::load(dir.join(&s.value)).map_err(|e| {
                at(
                    InputError::new(file, format!("scenarios[{i}]"), e.to_string()),
                    s,
                )
            })?;
            scenarios.push(sc);
        }
        let mut tolerances = BTreeMap::new();
        for (metric, tol) in &raw.tolerances {
            let field = format!("tolerances.{metric}");
            let known = CATALOG.iter().any(|m| m.gate && m.name == metric)
                || WORKER_METRICS.iter().any(|w| w.name == metric);
            if !known {
                return Err(at(
                    InputError::new(file, field, format!("unknown metric `{metric}`")).valid(list(
                        CATALOG
                            .iter()
                            .filter(|m| m.gate)
                            .map(|m| m.name)
                            .chain(WORKER_METRICS.iter().map(|w| w.name)),
                    )),
                    tol,
                )
                .into());
            }
            if !(tol.value.is_finite() && tol.value >= 0.0) {
                return Err(at(
                    InputError::new(
                        file,
                        field,
                        format!(
                            "{} is not valid; expected a relative tolerance >= 0 (0.05 = 5 %)",
                            tol.value
                        ),
                    ),
                    tol,
                )
                .into());
            }
            tolerances.insert(metric.clone(), tol.value);
        }
        let mut invariants = Vec::new();
        for (i, inv) in raw.invariants.iter().enumerate() {
            invariants.push(invariant(file, i, inv, &scenarios)?);
        }
        Ok(Suite {
            file: file.to_string(),
            seeds: raw.seeds.value,
            scenarios,
            tolerances,
            invariants,
        })
    }
}

fn invariant(
    file: &str,
    i: usize,
    spanned: &Spanned<RawInvariant>,
    scenarios: &[Scenario],
) -> Result<Invariant, GateError> {
    let inv = &spanned.value;
    let field = |f: &str| format!("invariants[{i}].{f}");
    let Some(sc) = scenarios.iter().find(|s| s.name == inv.scenario.value) else {
        return Err(at(
            InputError::new(
                file,
                field("scenario"),
                format!("unknown scenario `{}`", inv.scenario.value),
            )
            .valid(list(scenarios.iter().map(|s| s.name.as_str()))),
            &inv.scenario,
        )
        .into());
    };
    let policies = || list(sc.policies.iter().map(|q| q.name.as_str()));
    let known = |p: &str| sc.policies.iter().any(|q| q.name == p);
    if inv.policy.value != "*" && !known(&inv.policy.value) {
        return Err(at(
            InputError::new(
                file,
                field("policy"),
                format!("`{}` is not a policy of {}", inv.policy.value, sc.name),
            )
            .valid(format!("*, {}", policies())),
            &inv.policy,
        )
        .into());
    }
    if let Some(t) = &inv.than
        && !known(&t.value)
    {
        return Err(at(
            InputError::new(
                file,
                field("than"),
                format!("`{}` is not a policy of {}", t.value, sc.name),
            )
            .valid(policies()),
            t,
        )
        .into());
    }
    let rhs = match (&inv.than, inv.value) {
        (Some(t), None) => Rhs::Policy(t.value.clone()),
        (None, Some(v)) => Rhs::Value(v),
        _ => {
            return Err(at(
                InputError::new(
                    file,
                    format!("invariants[{i}]"),
                    "give exactly one of `than` (a policy) or `value` (a number)",
                ),
                spanned,
            )
            .into());
        }
    };
    let Some(op) = Op::ALL.into_iter().find(|o| o.as_str() == inv.op.value) else {
        return Err(at(
            InputError::new(
                file,
                field("op"),
                format!("`{}` is not valid", inv.op.value),
            )
            .valid(list(Op::ALL.iter().map(|o| o.as_str()))),
            &inv.op,
        )
        .into());
    };
    if direction_of_key(&inv.metric.value).is_none() {
        return Err(at(
            InputError::new(
                file,
                field("metric"),
                format!("unknown metric `{}`", inv.metric.value),
            )
            .valid(gate_keys()),
            &inv.metric,
        )
        .into());
    }
    Ok(Invariant {
        scenario: sc.name.clone(),
        metric: inv.metric.value.clone(),
        op,
        policy: inv.policy.value.clone(),
        rhs,
        why: inv.why.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(e: GateError) -> InputError {
        e.input().cloned().expect("an input error")
    }

    fn scenarios_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ci")
    }

    fn suite(invariant: &str) -> Result<Suite, GateError> {
        let text = format!(
            "seeds: [1]\nscenarios: [../seed/sixteen-at-once.yaml]\ninvariants:\n  - {invariant}\n"
        );
        Suite::from_yaml(&text, "suite.yaml", &scenarios_dir())
    }

    #[test]
    fn the_bundled_suite_is_valid() {
        let s = Suite::load(&scenarios_dir()).unwrap();
        assert_eq!(s.seeds, [1, 2, 3]);
        assert!(s.scenarios.len() >= 10);
        assert_eq!(s.tolerances.get("e2e_mean_s"), Some(&0.02));
        assert!(s.invariants.iter().any(|i| i.metric == "share:pair"));
    }

    #[test]
    fn bad_invariants_are_located_and_say_what_is_valid() {
        let ok = "{ scenario: seed/sixteen-at-once, policy: seed-v3, metric: e2e_max_s, op: \"<\", than: seed-v1 }";
        let s = suite(ok).unwrap();
        assert_eq!(s.invariants[0].op, Op::Lt);
        assert_eq!(s.invariants[0].rhs, Rhs::Policy("seed-v1".into()));

        let e = suite(&ok.replace("e2e_max_s", "e2e_maxx"))
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "invariants[0].metric");
        assert_eq!(e.line, Some(4));
        assert!(e.valid.as_deref().unwrap().contains("e2e_max_s"), "{e}");
        assert!(
            e.valid.as_deref().unwrap().contains("share:<worker>"),
            "{e}"
        );

        let e = suite(&ok.replace("seed-v1", "seed-v9"))
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "invariants[0].than");
        assert!(e.valid.as_deref().unwrap().contains("seed-v1"), "{e}");

        let e = suite(&ok.replace("\"<\"", "\"=<\""))
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "invariants[0].op");
        assert_eq!(e.valid.as_deref(), Some("<, <=, ==, >=, >"));

        let e = suite(&ok.replace("than: seed-v1", "than: seed-v1, value: 2"))
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "invariants[0]");

        let e = suite(&ok.replace("seed/sixteen-at-once", "seed/nowhere"))
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "invariants[0].scenario");
        assert!(e.to_string().starts_with("suite.yaml:4:"), "{e}");
    }

    #[test]
    fn bad_tolerances_and_seeds_are_rejected() {
        let dir = scenarios_dir();
        let base = "seeds: [1]\nscenarios: [../seed/sixteen-at-once.yaml]\n";
        let e = Suite::from_yaml(
            &format!("{base}tolerances: {{ e2e_mean: 0.1 }}\n"),
            "s",
            &dir,
        )
        .map_err(input)
        .unwrap_err();
        assert_eq!(e.field, "tolerances.e2e_mean");
        let e = Suite::from_yaml(&format!("{base}tolerances: {{ share: -1 }}\n"), "s", &dir)
            .map_err(input)
            .unwrap_err();
        assert!(
            e.message.contains("expected a relative tolerance >= 0"),
            "{e}"
        );
        let e = Suite::from_yaml("seeds: []\nscenarios: []\n", "s", &dir)
            .map_err(input)
            .unwrap_err();
        assert_eq!(e.field, "seeds");
        let e = Suite::from_yaml("seeds: [1]\nscenarios: [nope.yaml]\n", "s", &dir)
            .map_err(input)
            .unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("scenarios[0]", Some(2)));
        let e = Suite::from_yaml("seeds: [1]\nscenario: []\n", "s", &dir)
            .map_err(input)
            .unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
    }
}
