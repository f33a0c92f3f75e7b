//! "How many gateway replicas": routing quality against the number of replicas behind an L4
//! balancer, for a scenario's own policy and the best of the field's routers — the `replicas`
//! section of `docs/findings.md` (`routelab replicas --findings`) and its console table.
//!
//! For each deployment (a number of replicas and what they share) the study holds a
//! [`CapacityStudy`] of the same policies on the same seeds (the capacity search of
//! [`crate::capacity`], not another one) and, at load scale 1, each run's weight error and
//! overlap regret. A policy's capacity with N replicas is compared with its own capacity behind
//! the reference deployment (the first listed, one gateway by default) seed by seed: the paired
//! ratio, established when its 95 % interval excludes 1. A policy **degrades** at the smallest
//! N whose ratio is established below 1.

use crate::capacity::{CapacityStudy, PolicyKind, best, ratio_cell};
use crate::findings;
use crate::interval_text;
use crate::metric::{REPLICA_METRICS, view};
use crate::num::fmt_sig;
use crate::stats::{Interval, excludes, paired_ratio};
use routelab_sim::{Gateways, RunMetrics, Share, Split};
use std::fmt::Write as _;

/// Routing quality of one policy's runs at load scale 1, one value per seed (`None` where a run
/// has no value: no prefix to regret, nothing measured).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quality {
    /// Weight error (mean |ln(weight / oracle weight)|, over replicas and workers).
    pub weight_error: Vec<Option<f64>>,
    /// Mean overlap regret, tokens.
    pub overlap_regret: Vec<Option<f64>>,
}

impl Quality {
    /// Add one seed's run.
    pub fn push(&mut self, m: &RunMetrics) {
        self.weight_error.push(view("weight_error").read(m));
        self.overlap_regret
            .push(view("overlap_regret_mean_tokens").read(m));
    }

    fn interval(values: &[Option<f64>]) -> Option<Interval> {
        Interval::of(values.iter().flatten().copied())
    }
}

/// One deployment of the study: the replicas, the capacity study of every policy behind them,
/// and the routing quality of each policy (same order as the study's policies).
#[derive(Debug, Clone)]
pub struct Deployment {
    /// The replicas.
    pub gateways: Gateways,
    /// Capacity of each policy behind them.
    pub capacity: CapacityStudy,
    /// Quality of each policy at load scale 1.
    pub quality: Vec<Quality>,
}

/// A scenario's replicas study.
#[derive(Debug, Clone)]
pub struct ReplicaStudy {
    /// Scenario name.
    pub scenario: String,
    /// The deployments, the reference first.
    pub deployments: Vec<Deployment>,
}

impl ReplicaStudy {
    /// The paired ratio of policy `p`'s capacity in deployment `d` to its capacity in the
    /// reference deployment (`None` for the reference itself or without capacities).
    pub fn ratio(&self, d: usize, p: usize) -> Option<Interval> {
        if d == 0 {
            return None;
        }
        paired_ratio(
            &self.deployments[d].capacity.policies[p].scales(),
            &self.deployments[0].capacity.policies[p].scales(),
        )
    }

    /// The smallest replica count at which policy `p` with sharing `share` is established to
    /// carry less than behind the reference, if any.
    pub fn degrades_at(&self, p: usize, share: Share) -> Option<u32> {
        (1..self.deployments.len())
            .filter(|&d| self.deployments[d].gateways.share == share)
            .filter(|&d| {
                self.ratio(d, p)
                    .is_some_and(|r| excludes(&r, 1.0) && r.mean < 1.0)
            })
            .map(|d| self.deployments[d].gateways.replicas)
            .min()
    }

    fn reference(&self) -> &CapacityStudy {
        &self.deployments[0].capacity
    }
}

/// The index of the field router with the largest capacity in `st`, if it has one.
pub fn best_field_router(st: &CapacityStudy) -> Option<usize> {
    best(st, |i| PolicyKind::of(st, i) == PolicyKind::Field)
}

/// A dispatch stream's spread of its replicas' decisions, in words.
fn spread_words(spread_ns: u64) -> String {
    match spread_ns {
        0 => "no spread".to_string(),
        ns => format!("spread {} ms", fmt_sig(Some(ns as f64 / 1e6), 3)),
    }
}

/// How a deployment is written: `4 × probes-and-load (sync 1 s)`.
fn share_label(share: Share) -> String {
    match share {
        Share::ProbesAndLoad { sync_interval_ns } => format!(
            "{} (sync {} s)",
            share.name(),
            fmt_sig(Some(sync_interval_ns as f64 / 1e9), 3)
        ),
        Share::EngineTruth { poll_interval_ns } => format!(
            "{} (poll {} s)",
            share.name(),
            fmt_sig(Some(poll_interval_ns as f64 / 1e9), 3)
        ),
        Share::DispatchStream {
            bus_latency_ns,
            spread_ns,
        } => format!(
            "{} (bus {} ms, {})",
            share.name(),
            fmt_sig(Some(bus_latency_ns as f64 / 1e6), 3),
            spread_words(spread_ns)
        ),
        Share::RouteAndReserve { bus_latency_ns } => {
            format!(
                "{} (bus {} ms)",
                share.name(),
                fmt_sig(Some(bus_latency_ns as f64 / 1e6), 3)
            )
        }
        other => other.name().to_string(),
    }
}

fn interval_cell(iv: Option<Interval>) -> String {
    interval_text::cell(iv, 3)
}

const SECTION_HEADER: &str = "## How many gateway replicas\n\n\
         Generated by `routelab replicas --findings`; do not edit by hand. Each fleet behind N\n\
         gateway replicas (an L4 balancer splits the requests; each replica routes with its own\n\
         in-flight view). **capacity**: the largest load scale at which the SLO holds, searched\n\
         on each seed (as in the capacity section); **vs one gateway**: its paired ratio, seed by\n\
         seed, to the same policy behind the first deployment listed, established only when the\n\
         95 % interval excludes 1; **weight error** (mean |ln(weight / oracle weight)| over\n\
         replicas and workers, the oracle rating each engine at its operating concurrency) and\n\
         **overlap regret** (mean tokens a better-cached eligible\n\
         worker held) at load scale 1. A policy **degrades** at the smallest N whose ratio is\n\
         established below 1. Replica semantics: `docs/replicas.md`.\n";

/// The marker name of one study's part: the scenario, the SLO and the split.
fn part_name(st: &ReplicaStudy) -> String {
    let c = st.reference();
    let target = c
        .slo
        .target
        .map(|t| format!(" target {t}"))
        .unwrap_or_default();
    format!(
        "{}/{} at {}{target} {}",
        findings::REPLICAS,
        st.scenario,
        c.slo,
        st.deployments[0].gateways.split.name()
    )
}

/// One scenario's table and verdicts.
pub fn scenario_part(st: &ReplicaStudy) -> String {
    let c = st.reference();
    let split = st.deployments[0].gateways.split;
    let mut out = String::new();
    let _ = write!(
        out,
        "### {} at `{}`{}, {} split\n\nSLO: {}; load scale 1 = {} req/s; {} seeds; precision {} %.\n\n\
         | policy | kind | replicas | share | capacity (load scale) | vs one gateway | weight error | overlap regret (tokens) |\n\
         |---|---|---:|---|---:|---|---:|---:|\n",
        st.scenario,
        c.slo,
        c.slo
            .target
            .map(|t| format!(" for {}% of requests", t * 100.0))
            .unwrap_or_default(),
        split.name(),
        c.slo.rule(),
        fmt_sig(c.base_rate_per_s, 3),
        c.seeds.len(),
        c.precision * 100.0,
    );
    for p in 0..c.policies.len() {
        let kind = kind_label(PolicyKind::of(c, p), &c.policies[p].policy);
        for (d, dep) in st.deployments.iter().enumerate() {
            let q = &dep.quality[p];
            let ratio = if d == 0 {
                "reference".to_string()
            } else {
                ratio_cell(st.ratio(d, p))
            };
            let _ = writeln!(
                out,
                "| `{}` | {kind} | {} | {} | {} | {ratio} | {} | {} |",
                c.policies[p].policy,
                dep.gateways.replicas,
                share_label(dep.gateways.share),
                interval_cell(dep.capacity.policies[p].interval()),
                interval_cell(Quality::interval(&q.weight_error)),
                interval_cell(Quality::interval(&q.overlap_regret)),
            );
        }
    }
    out.push('\n');
    let mut shares: Vec<Share> = Vec::new();
    for dep in &st.deployments[1..] {
        if !shares.contains(&dep.gateways.share) {
            shares.push(dep.gateways.share);
        }
    }
    for p in 0..c.policies.len() {
        for &share in &shares {
            let most = st
                .deployments
                .iter()
                .filter(|d| d.gateways.share == share)
                .map(|d| d.gateways.replicas)
                .max()
                .unwrap_or(1);
            let ratio_at = |n: u32| {
                let d = st
                    .deployments
                    .iter()
                    .position(|d| d.gateways.share == share && d.gateways.replicas == n);
                ratio_cell(d.and_then(|d| st.ratio(d, p)))
            };
            let reference_has_none = st.deployments[0].capacity.policies[p]
                .scales()
                .iter()
                .all(|&x| x == 0.0);
            let verdict = match st.degrades_at(p, share) {
                // Nothing to lose: say what the replicas carry instead.
                None if reference_has_none => format!(
                    "meets the SLO at no load tried behind one gateway; {} load scale at {most} \
                     replicas",
                    interval_cell(
                        st.deployments
                            .iter()
                            .find(|d| d.gateways.share == share && d.gateways.replicas == most)
                            .and_then(|d| d.capacity.policies[p].interval())
                    )
                ),
                Some(n) if n == most => {
                    format!(
                        "degrades from {n} replicas ({} one gateway's load)",
                        ratio_at(n)
                    )
                }
                Some(n) => format!(
                    "degrades from {n} replicas ({} one gateway's load; {} at {most})",
                    ratio_at(n),
                    ratio_at(most)
                ),
                None => format!("no established loss up to {most} replicas"),
            };
            let spread = match share {
                Share::DispatchStream { spread_ns, .. } => {
                    format!(" ({})", spread_words(spread_ns))
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "- `{}`, share `{}`{spread}: {verdict}.",
                c.policies[p].policy,
                share.name()
            );
        }
    }
    out
}

/// The kind column: the field's routers, the oracle, the source's presets (`seed-…`, "seed's")
/// and ours (`predictive` and the measured-weight compositions).
fn kind_label(k: PolicyKind, policy: &str) -> &'static str {
    match k {
        PolicyKind::Field => "field",
        PolicyKind::Oracle => "oracle (lab only)",
        PolicyKind::Baseline | PolicyKind::Ours if policy.starts_with("seed-") => "seed's",
        PolicyKind::Baseline | PolicyKind::Ours => "ours",
    }
}

/// The findings document `doc` with the replicas section updated for `studies`: each study's
/// part (one per scenario, SLO and split) replaces the same part if the section has it, else is
/// appended; parts not studied this time and every other section are kept.
pub fn update_findings(doc: &str, studies: &[ReplicaStudy]) -> String {
    findings::update_parts(
        doc,
        findings::REPLICAS,
        SECTION_HEADER,
        studies.iter().map(|st| (part_name(st), scenario_part(st))),
    )
}

/// The per-replica lines of a run with several replicas (empty with one): each replica's
/// [`REPLICA_METRICS`], as a console table.
pub fn replica_table(m: &RunMetrics) -> String {
    if m.replicas.is_empty() {
        return String::new();
    }
    let mut out = String::from("replica");
    for x in REPLICA_METRICS {
        let _ = write!(out, " | {}", x.metric().label);
    }
    out.push('\n');
    for (i, r) in m.replicas.iter().enumerate() {
        let _ = write!(out, "{i}");
        for x in REPLICA_METRICS {
            let _ = write!(out, " | {}", x.metric().fmt_value(x.reported(r)));
        }
        out.push('\n');
    }
    out
}

/// The default split of a study when the scenario names none: requests spread at random, as a
/// connection-level L4 balancer without session affinity would.
pub const DEFAULT_SPLIT: Split = Split::Random;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{PolicyCapacity, SeedCapacity, SloSpec};
    use crate::stats::SeedStop;

    /// Regression: `predictive` was labelled the source's ("seed's") in the replicas tables.
    #[test]
    fn ours_and_the_sources_presets_are_told_apart() {
        assert_eq!(kind_label(PolicyKind::Ours, "predictive"), "ours");
        assert_eq!(
            kind_label(PolicyKind::Ours, "at-load/sed/capacity/weighted:24"),
            "ours"
        );
        assert_eq!(kind_label(PolicyKind::Ours, "seed-v3"), "seed's");
        assert_eq!(kind_label(PolicyKind::Field, "pulsar"), "field");
    }

    fn study(policies: &[(&str, [f64; 3])]) -> CapacityStudy {
        CapacityStudy {
            scenario: "s".into(),
            description: String::new(),
            slo: SloSpec::parse("e2el_mean<=2s", None).unwrap(),
            precision: 0.02,
            base_rate_per_s: Some(2.0),
            baseline: 0,
            seed_stop: SeedStop::Fixed,
            auto_rule: None,
            seeds: vec![1, 2, 3],
            policies: policies
                .iter()
                .map(|(name, scales)| PolicyCapacity {
                    policy: (*name).into(),
                    role: crate::capacity::fixture::role_of(name),
                    seeds: scales
                        .iter()
                        .zip(1..)
                        .map(|(&scale, seed)| {
                            SeedCapacity::knee(seed, scale, scale * 1.02, Vec::new())
                        })
                        .collect(),
                })
                .collect(),
            seed_meaning: Default::default(),
            out_of_sample: None,
            held_out_of: None,
        }
    }

    fn deployment(replicas: u32, share: Share, caps: &[(&str, [f64; 3])]) -> Deployment {
        let mut quality = Quality::default();
        let mut m = RunMetrics::new("p", vec![]);
        m.overlap_regret.record(100);
        quality.push(&m);
        Deployment {
            gateways: Gateways {
                replicas,
                split: Split::Random,
                share,
            },
            capacity: study(caps),
            quality: vec![quality; caps.len()],
        }
    }

    fn sample() -> ReplicaStudy {
        let load = Share::ProbesAndLoad {
            sync_interval_ns: 1_000_000_000,
        };
        ReplicaStudy {
            scenario: "seed/x".into(),
            deployments: vec![
                deployment(
                    1,
                    Share::None,
                    &[
                        ("seed-v3", [4.0, 4.2, 3.9]),
                        ("cache-aware", [3.0, 3.1, 2.9]),
                    ],
                ),
                deployment(
                    4,
                    Share::None,
                    &[
                        ("seed-v3", [4.0, 4.2, 3.9]),
                        ("cache-aware", [3.0, 3.1, 2.9]),
                    ],
                ),
                deployment(
                    16,
                    Share::None,
                    &[
                        ("seed-v3", [3.0, 3.1, 2.9]),
                        ("cache-aware", [3.0, 3.1, 2.9]),
                    ],
                ),
                deployment(
                    16,
                    load,
                    &[
                        ("seed-v3", [4.0, 4.2, 3.9]),
                        ("cache-aware", [3.0, 3.1, 2.9]),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn a_policy_degrades_where_its_ratio_to_one_gateway_is_established_below_one() {
        let st = sample();
        assert!(st.ratio(0, 0).is_none());
        let r = st.ratio(2, 0).unwrap();
        assert!(r.mean < 0.76 && r.mean > 0.73, "{r:?}");
        assert_eq!(st.degrades_at(0, Share::None), Some(16));
        assert_eq!(st.degrades_at(1, Share::None), None);
        let load = st.deployments[3].gateways.share;
        assert_eq!(st.degrades_at(0, load), None);
        let md = scenario_part(&st);
        assert!(
            md.contains(
                "- `seed-v3`, share `none`: degrades from 16 replicas (0.744x [0.729, 0.759] one gateway's load)."
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "- `seed-v3`, share `probes-and-load`: no established loss up to 16 replicas."
            ),
            "{md}"
        );
        assert!(md.contains("| `cache-aware` | field | 1 | none |"), "{md}");
        assert!(md.contains("probes-and-load (sync 1.00 s)"), "{md}");
        // The overlap regret of every run was 100 tokens.
        assert!(md.contains("| - | 100 |"), "{md}");
    }

    #[test]
    fn a_policy_without_capacity_behind_one_gateway_is_said_so() {
        let mut st = sample();
        st.deployments[0].capacity.policies[1]
            .seeds
            .iter_mut()
            .for_each(|s| s.scale = 0.0);
        let md = scenario_part(&st);
        assert!(
            md.contains(
                "- `cache-aware`, share `none`: meets the SLO at no load tried behind one gateway; 3.00 ± 0.25 load scale at 16 replicas."
            ),
            "{md}"
        );
    }

    #[test]
    fn the_section_is_spliced_and_keeps_the_other_sections() {
        let doc = findings::splice("# Findings\n", findings::CAPACITY, "## Capacity\n");
        let once = update_findings(&doc, &[sample()]);
        assert_eq!(
            findings::section(&once, findings::CAPACITY),
            findings::section(&doc, findings::CAPACITY)
        );
        assert!(once.contains("## How many gateway replicas"));
        // Again: replaced in place, not appended twice.
        let twice = update_findings(&once, &[sample()]);
        assert_eq!(once, twice);
        assert_eq!(twice.matches("### seed/x at").count(), 1);
        // Another scenario is added beside it.
        let mut other = sample();
        other.scenario = "seed/y".into();
        let both = update_findings(&twice, &[other]);
        assert!(both.contains("### seed/x at") && both.contains("### seed/y at"));
    }

    #[test]
    fn the_best_field_router_is_the_field_router_with_the_largest_capacity() {
        let st = study(&[
            ("seed-v3", [9.0, 9.0, 9.0]),
            ("cache-aware", [3.0, 3.1, 2.9]),
            ("least-load", [3.5, 3.4, 3.6]),
        ]);
        assert_eq!(best_field_router(&st), Some(2));
        assert_eq!(best_field_router(&study(&[("seed-v3", [1.0; 3])])), None);
    }

    #[test]
    fn the_console_table_lists_each_replica() {
        let mut m = RunMetrics::new("p", vec![]);
        assert_eq!(replica_table(&m), "");
        m.replicas = vec![routelab_sim::ReplicaTotals::default(); 2];
        m.replicas[1].routed = 7;
        let t = replica_table(&m);
        assert_eq!(t.lines().count(), 3);
        assert!(t.lines().nth(2).unwrap().starts_with("1 | 7 |"), "{t}");
    }
}
