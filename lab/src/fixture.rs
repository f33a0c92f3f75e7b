//! Capacity studies for the lab's tests, as plain data (what the search would have found).

use routelab_policies::PolicyConfig;
use routelab_reports::capacity::{CapacityStudy, PolicyCapacity, SeedCapacity, SloSpec};
use routelab_reports::stats::SeedStop;

/// A fixed-seed study of `policies` (the first is the baseline) on `seeds`, in which policy `p`
/// holds the SLO up to load scale `knee(p, seed)` and fails 2 % above it.
pub(crate) fn study(
    policies: &[PolicyConfig],
    seeds: &[u64],
    knee: impl Fn(usize, u64) -> f64,
) -> CapacityStudy {
    CapacityStudy {
        scenario: "s".into(),
        description: String::new(),
        slo: SloSpec::parse("e2el_mean<=500ms", None).unwrap(),
        precision: 0.02,
        base_rate_per_s: Some(1.0),
        baseline: 0,
        seed_stop: SeedStop::Fixed,
        auto_rule: None,
        seeds: seeds.to_vec(),
        policies: policies
            .iter()
            .enumerate()
            .map(|(p, config)| PolicyCapacity {
                seeds: seeds
                    .iter()
                    .map(|&seed| {
                        let scale = knee(p, seed);
                        SeedCapacity::knee(seed, scale, scale * 1.02, Vec::new())
                    })
                    .collect(),
                ..PolicyCapacity::of(config.name.clone(), config.role())
            })
            .collect(),
        seed_meaning: Default::default(),
        out_of_sample: None,
        held_out_of: None,
    }
}

/// The policies of these presets or compositions.
pub(crate) fn policies(names: &[&str]) -> Vec<PolicyConfig> {
    names
        .iter()
        .map(|n| PolicyConfig::from_name(n).unwrap())
        .collect()
}
