//! What the gate measures: the cases, and the workload each runs in the child process that
//! valgrind counts.
//!
//! A child runs its case's **setup** (load the scenario and build its traffic, or build the
//! decision bench's router in its steady state) and then, unless told to stop there, the
//! **measured part** (the whole simulation, or the decisions). The gate counts a child that
//! stops after the setup and one that goes on, and takes the difference: the measured part's
//! instructions, free of process start-up, scenario parsing and the bench's warm-up.

use crate::decision::Decisions;
use routelab_policies::{Chooser, PolicyConfig, PredictiveParams};
use routelab_sim::traffic::{Arrival, TrafficError, TrafficSource};
use routelab_sim::{Scenario, TrafficSpec, run};
use std::hint::black_box;
use std::path::Path;

/// One measurement of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// Its key in the references file.
    pub name: &'static str,
    /// The unit its count is divided by (`request`, `decision`).
    pub unit: &'static str,
    /// How many units one measurement runs.
    pub units: u64,
    /// What runs.
    pub kind: Kind,
}

/// What a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bundled scenario (path relative to the repository) run whole under its first policy,
    /// its Poisson traffic cut to the case's units.
    Sim {
        /// The scenario file.
        scenario: &'static str,
    },
    /// The decision bench (`benches/support/decision.rs`): `policy`'s route + complete over
    /// `workers` measured workers, with the 64-block prompts or without a prefix.
    Decision {
        /// Fleet size.
        workers: usize,
        /// Whether requests carry the 64-block prompts.
        prefix: bool,
        /// The policy deciding.
        policy: DecidingPolicy,
    },
}

/// The policies the decision cases count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidingPolicy {
    /// `seed-v3`: the path every policy's decision shares (filters, affinity, p2c).
    SeedV3,
    /// Ours, `predictive`, as shipped (its future terms off).
    Predictive,
    /// `predictive` with both future terms on (`reserve: 1, evict: 1`, as the decision bench's
    /// `predictive + future terms` group): what pricing the requests to come adds.
    PredictiveTerms,
}

impl DecidingPolicy {
    fn config(self) -> anyhow::Result<PolicyConfig> {
        Ok(match self {
            DecidingPolicy::SeedV3 => PolicyConfig::preset("seed-v3")?,
            DecidingPolicy::Predictive => PolicyConfig::preset("predictive")?,
            DecidingPolicy::PredictiveTerms => {
                let mut config = PolicyConfig::preset("predictive")?;
                config.chooser = Chooser::Predictive(PredictiveParams {
                    reserve: 1.0,
                    evict: 1.0,
                    ..PredictiveParams::DEFAULT
                });
                config
            }
        })
    }
}

/// Every case, longest first (the gate starts them in this order).
///
/// - `fleet-64` at 100,000 requests: the simulator's per-request path (the probing of 64
///   workers is a small part of it).
/// - `fleet-10k` cut to 10,000 requests: mostly the probing phase of 10,240 workers — the
///   weight error's re-reads at each weight change, the probe results' weight derivations —
///   and the start-up; the 10,000 requests themselves are about 1 % of it. A cut that showed
///   the per-request path at this size would cost minutes under valgrind; `fleet-64` gates
///   that path.
/// - the decision bench's `seed-v3` route + complete, 100,000 decisions in its steady state.
/// - the same bench's `predictive`, as shipped and with its future terms on, with the 64-block
///   prompts at 64 and 10,240 workers, 20,000 decisions each (its decision costs several times
///   `seed-v3`'s; issue 38 asks the gate to say what the terms cost).
pub const CASES: [Case; 10] = [
    Case {
        name: "fleet-10k",
        unit: "request",
        units: 10_000,
        kind: Kind::Sim {
            scenario: "scenarios/bench/fleet-10k.yaml",
        },
    },
    Case {
        name: "fleet-64",
        unit: "request",
        units: 100_000,
        kind: Kind::Sim {
            scenario: "scenarios/bench/fleet-64.yaml",
        },
    },
    Case {
        name: "decision-10240-prefix",
        unit: "decision",
        units: 100_000,
        kind: Kind::Decision {
            workers: 10_240,
            prefix: true,
            policy: DecidingPolicy::SeedV3,
        },
    },
    Case {
        name: "decision-64-prefix",
        unit: "decision",
        units: 100_000,
        kind: Kind::Decision {
            workers: 64,
            prefix: true,
            policy: DecidingPolicy::SeedV3,
        },
    },
    Case {
        name: "decision-10240",
        unit: "decision",
        units: 100_000,
        kind: Kind::Decision {
            workers: 10_240,
            prefix: false,
            policy: DecidingPolicy::SeedV3,
        },
    },
    Case {
        name: "decision-64",
        unit: "decision",
        units: 100_000,
        kind: Kind::Decision {
            workers: 64,
            prefix: false,
            policy: DecidingPolicy::SeedV3,
        },
    },
    Case {
        name: "predictive-10240-prefix",
        unit: "decision",
        units: 20_000,
        kind: Kind::Decision {
            workers: 10_240,
            prefix: true,
            policy: DecidingPolicy::Predictive,
        },
    },
    Case {
        name: "predictive-terms-10240-prefix",
        unit: "decision",
        units: 20_000,
        kind: Kind::Decision {
            workers: 10_240,
            prefix: true,
            policy: DecidingPolicy::PredictiveTerms,
        },
    },
    Case {
        name: "predictive-64-prefix",
        unit: "decision",
        units: 20_000,
        kind: Kind::Decision {
            workers: 64,
            prefix: true,
            policy: DecidingPolicy::Predictive,
        },
    },
    Case {
        name: "predictive-terms-64-prefix",
        unit: "decision",
        units: 20_000,
        kind: Kind::Decision {
            workers: 64,
            prefix: true,
            policy: DecidingPolicy::PredictiveTerms,
        },
    },
];

/// The case named `name`.
pub fn case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

/// Every case's name, for "valid:" lists.
pub fn case_names() -> String {
    CASES.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
}

/// Deliberate extra work: `iterations` rounds of a loop whose every round the optimiser must
/// keep. The gate counts what one round costs, and what calling it once per unit costs, rather
/// than assume either (`injection` in `main.rs`).
#[inline(never)]
pub fn spin(iterations: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iterations {
        x = black_box(x ^ i).rotate_left(7);
    }
    x
}

/// A traffic source that spins `per_arrival` rounds for each arrival it hands out: a slowdown
/// inside the simulation's measured path, at a known cost per request.
struct Slowed {
    inner: Box<dyn TrafficSource>,
    per_arrival: u64,
}

impl TrafficSource for Slowed {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        let next = self.inner.next_arrival()?;
        if next.is_some() {
            black_box(spin(self.per_arrival));
        }
        Ok(next)
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        self.inner.on_complete(now, tag)
    }
}

/// Run `case` over `units` requests or decisions in this process: its setup and, unless
/// `setup_only`, its measured part with `spin_per_unit` rounds of [`spin`] added per request or
/// decision (0: none, and no wrapper either, so the plain count is the code's own). Returns
/// what the measured part computed (a simulation's event count; the sum of the decisions'
/// worker ids), 0 after a setup only.
///
/// `root` is the repository, against which scenario paths resolve.
pub fn run_case(
    case: &Case,
    units: u64,
    root: &Path,
    setup_only: bool,
    spin_per_unit: u64,
) -> anyhow::Result<u64> {
    match case.kind {
        Kind::Sim { scenario } => {
            let mut sc = Scenario::load(root.join(scenario))?;
            for t in &mut sc.traffic {
                if let TrafficSpec::Poisson(c) = t {
                    c.until.count = Some(units);
                }
            }
            let policy = sc.policies.first().ok_or_else(|| {
                anyhow::anyhow!(
                    "{scenario}: the speed gate runs a scenario's first policy, and it has none"
                )
            })?;
            let traffic = sc.traffic_source(sc.setup.seed)?;
            if setup_only {
                return Ok(0);
            }
            let mut traffic = if spin_per_unit == 0 {
                traffic
            } else {
                Box::new(Slowed {
                    inner: traffic,
                    per_arrival: spin_per_unit,
                })
            };
            let m = run(&sc.setup, policy, &mut *traffic, None)?;
            anyhow::ensure!(
                m.requests == units,
                "{scenario}: {} requests arrived, the case asks for {units} (is its traffic \
                 Poisson?)",
                m.requests,
            );
            Ok(m.events)
        }
        Kind::Decision {
            workers,
            prefix,
            policy,
        } => {
            let config = policy.config()?;
            let mut d = Decisions::new(config, workers, None, prefix, 0.5);
            if setup_only {
                return Ok(0);
            }
            Ok(decide(&mut d, units, spin_per_unit))
        }
    }
}

/// The measured decisions: `units` steps, each followed by `spin_per_unit` rounds of [`spin`];
/// the sum of the chosen workers' ids. A function of its own, so that how the rest of this
/// program compiles does not reach into the loop.
#[inline(never)]
fn decide(d: &mut Decisions, units: u64, spin_per_unit: u64) -> u64 {
    let mut outcome = 0u64;
    // Two loops, so that the plain count has no test for the spin.
    if spin_per_unit == 0 {
        for _ in 0..units {
            outcome = outcome.wrapping_add(u64::from(d.step().0));
        }
    } else {
        for _ in 0..units {
            outcome = outcome.wrapping_add(u64::from(d.step().0));
            black_box(spin(spin_per_unit));
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_found() {
        for c in &CASES {
            assert_eq!(case(c.name), Some(c));
            assert!(c.units > 0, "{}", c.name);
        }
        let mut names: Vec<_> = CASES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CASES.len());
        assert_eq!(case("fleet-1k"), None);
    }

    #[test]
    fn spin_depends_on_every_round() {
        assert_ne!(spin(1_000), spin(1_001));
        assert_eq!(spin(0), 0x9E37_79B9_7F4A_7C15);
    }

    #[test]
    fn the_slowdown_leaves_the_simulation_unchanged() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let short = Case {
            name: "short",
            unit: "request",
            units: 300,
            kind: Kind::Sim {
                scenario: "scenarios/bench/fleet-64.yaml",
            },
        };
        let plain = run_case(&short, 300, root, false, 0).unwrap();
        assert!(plain > 300, "{plain} events");
        assert_eq!(run_case(&short, 300, root, false, 50).unwrap(), plain);
        assert_eq!(run_case(&short, 300, root, true, 0).unwrap(), 0);
        assert_ne!(run_case(&short, 200, root, false, 0).unwrap(), plain);
    }
}
