//! What the capacity search of one policy on one seed finds (the search itself is
//! `routelab-lab`'s `find_capacity`): every evaluated load scale ([`Evaluation`]), the capacity
//! ([`SeedCapacity`]) and, when no knee lay inside the scales tried, which way it was
//! [`Censored`]. Plain data that the capacity outputs render.

use super::slo::SloSpec;
use routelab_sim::{Rejections, RunMetrics};
use serde::Serialize;

/// The requests a run's router refused, and how many of them for the context window (issue 41:
/// `capacity` never said so). Serialized only when some were refused, so a study without
/// rejections writes the `capacity.json` it always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Rejected {
    /// Every refused request.
    pub total: u64,
    /// Of those, refused because prompt + output exceed every worker's context window.
    pub context_window: u64,
    /// Of those, refused because no worker serves the model.
    pub no_worker: u64,
    /// The largest context window among the model's workers, tokens.
    pub largest_window: u32,
    /// The longest request refused for its length, tokens.
    pub longest_request: u32,
}

impl Rejected {
    /// What run `m` refused.
    pub fn of(m: &RunMetrics) -> Rejected {
        let r = &m.rejections;
        Rejected {
            total: m.rejected,
            context_window: r.context_window,
            no_worker: r.no_worker,
            largest_window: r.largest_window,
            longest_request: r.longest_request,
        }
    }

    /// Nothing was refused.
    pub fn is_none(&self) -> bool {
        self.total == 0
    }

    /// The run's own sentence for them (`Rejections::describe`: one place for its wording).
    pub fn describe(&self) -> Option<String> {
        Rejections {
            context_window: self.context_window,
            no_worker: self.no_worker,
            largest_window: self.largest_window,
            longest_request: self.longest_request,
        }
        .describe(self.total)
    }
}

/// One evaluated load scale: whether the SLO held, and the figures the charts draw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Load scale.
    pub scale: f64,
    /// The SLO held.
    pub holds: bool,
    /// Fraction of requests meeting every per-request bound.
    pub attainment: Option<f64>,
    /// TTFT p99, s.
    pub ttft_p99_s: Option<f64>,
    /// Each bound's statistic in this run, in the SLO's order.
    pub values: Vec<Option<f64>>,
    /// The requests the router refused in this run.
    #[serde(skip_serializing_if = "Rejected::is_none")]
    pub rejected: Rejected,
}

impl Evaluation {
    /// The evaluation of run `m` at `scale`.
    pub fn of(spec: &SloSpec, scale: f64, m: &RunMetrics) -> Evaluation {
        Evaluation {
            scale,
            holds: spec.holds(m),
            attainment: m.slo_attainment(),
            ttft_p99_s: m.ttft.quantile_secs(0.99),
            values: spec.bounds.iter().map(|b| b.value(m)).collect(),
            rejected: Rejected::of(m),
        }
    }
}

impl Evaluation {
    /// What kept the SLO from holding here (`ttft_p99 = 3.00 s > 2.00 s`), for error messages.
    pub fn why_not(&self, spec: &SloSpec) -> String {
        let g = |v: f64| format!("{} s", crate::num::fmt_sig(Some(v), 3));
        if let Some(t) = spec.target {
            return format!(
                "{} of requests met every bound, below the target {}",
                crate::num::fmt_pct(self.attainment),
                crate::num::fmt_pct(Some(t))
            );
        }
        spec.bounds
            .iter()
            .zip(&self.values)
            .filter(|(b, v)| !v.is_some_and(|v| v <= b.bound_s))
            .map(|(b, v)| match v {
                Some(v) => format!("{} = {} > {}", b.name(), g(*v), g(b.bound_s)),
                None => format!("{} has no value (nothing completed)", b.name()),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A search that found no knee inside the scales it may try: the capacity is then a bound,
/// not a measurement, and the outputs say so.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Censored {
    /// The SLO fails even at the smallest scale tried: the policy carries none of this traffic
    /// at the SLO (its capacity is recorded as 0, so it counts against the policy's mean).
    NeverHolds {
        /// The smallest scale tried.
        min_scale: f64,
        /// What failed there (`ttft_p99 = 3.00 s > 2.00 s`).
        why: String,
    },
    /// The SLO still holds at the largest scale tried: the capacity is at least that scale.
    AlwaysHolds {
        /// The largest scale tried (also the recorded capacity).
        max_scale: f64,
    },
}

impl Censored {
    /// `infeasible even at 1/64 load (why)` / `at least 64x (no knee found)`.
    pub fn describe(&self) -> String {
        match self {
            Censored::NeverHolds { min_scale, why } => format!(
                "the SLO does not hold even at load scale {min_scale} (1/{}): {why}",
                1.0 / min_scale
            ),
            Censored::AlwaysHolds { max_scale } => {
                format!("the SLO still holds at load scale {max_scale}: capacity at least that")
            }
        }
    }
}

/// The capacity of one policy on one seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedCapacity {
    /// Seed.
    pub seed: u64,
    /// The largest load scale found to hold (the bracket's low end); 0 when the SLO never
    /// held, the largest scale tried when it always did (see `censored`).
    pub scale: f64,
    /// The smallest load scale found to fail (the bracket's high end); for a censored search,
    /// the scale tried last.
    pub failing_scale: f64,
    /// Set when no knee lies inside the scales tried.
    pub censored: Option<Censored>,
    /// Every evaluated scale, in the order run.
    pub evaluations: Vec<Evaluation>,
}

impl SeedCapacity {
    /// A search on `seed` whose knee lies inside the scales tried: the SLO held at `scale` and
    /// failed at `failing_scale`, after these `evaluations`.
    pub fn knee(seed: u64, scale: f64, failing_scale: f64, evaluations: Vec<Evaluation>) -> Self {
        SeedCapacity {
            seed,
            scale,
            failing_scale,
            censored: None,
            evaluations,
        }
    }
}
