//! The replicas study of `routelab replicas`: which policies to follow, and the capacity study
//! and routing quality of each behind every deployment of gateway replicas, into reports'
//! [`ReplicaStudy`]. The runs themselves are the host's (two closures: a capacity study of some
//! policies on a scenario, and their routing quality on given seeds), as for
//! [`run_study`](crate::run_study).

use routelab_policies::{PRESETS, PolicyConfig, PolicyRole};
use routelab_reports::capacity::CapacityStudy;
use routelab_reports::replicas::{Deployment, Quality, ReplicaStudy, best_field_router};
use routelab_sim::{Gateways, Scenario};

/// Which policies a replicas study follows.
#[derive(Debug, Clone)]
pub enum Followed {
    /// These, the first the capacity studies' baseline.
    Given(Vec<PolicyConfig>),
    /// This one (the seed's) and the field router with the largest capacity behind the
    /// reference deployment, found by a capacity study there of it and every field preset.
    OwnAndBestField(Box<PolicyConfig>),
}

/// The field's presets other than `own`, in catalog order.
pub fn field_presets(own: &PolicyConfig) -> Vec<PolicyConfig> {
    PRESETS
        .iter()
        .filter_map(|p| PolicyConfig::preset(p.name).ok())
        .filter(|p| p.role() == PolicyRole::Field && p.name != own.name)
        .collect()
}

/// `scenario` behind `gateways`.
pub fn behind(scenario: &Scenario, gateways: Gateways) -> Scenario {
    let mut s = scenario.clone();
    s.setup.gateways = gateways;
    s
}

/// The replicas study of `scenario` behind each of `deployments` (the first is the reference
/// every ratio is taken to): `capacity` studies the followed policies behind each, `quality`
/// runs them at load scale 1 on that study's seeds. With [`Followed::OwnAndBestField`], the
/// reference's study of every candidate is cut to the seed's policy and the best field router
/// (the same runs, not new ones), and the other deployments study those two.
///
/// # Errors
/// The first error of `capacity` or `quality`.
pub fn run_replica_study<E>(
    scenario: &Scenario,
    deployments: &[Gateways],
    followed: Followed,
    mut capacity: impl FnMut(&Scenario, &[PolicyConfig]) -> Result<CapacityStudy, E>,
    mut quality: impl FnMut(&Scenario, &[PolicyConfig], &[u64]) -> Result<Vec<Quality>, E>,
) -> Result<ReplicaStudy, E> {
    let mut study = ReplicaStudy {
        scenario: scenario.name.clone(),
        deployments: Vec::new(),
    };
    let Some((&reference, others)) = deployments.split_first() else {
        return Ok(study);
    };
    let reference_scenario = behind(scenario, reference);
    let (policies, first) = match followed {
        Followed::Given(policies) => {
            let first = capacity(&reference_scenario, &policies)?;
            (policies, first)
        }
        Followed::OwnAndBestField(own) => {
            let candidates: Vec<PolicyConfig> = std::iter::once((*own).clone())
                .chain(field_presets(&own))
                .collect();
            let wide = capacity(&reference_scenario, &candidates)?;
            let keep: Vec<usize> = std::iter::once(0).chain(best_field_router(&wide)).collect();
            let first = CapacityStudy {
                policies: keep.iter().map(|&i| wide.policies[i].clone()).collect(),
                ..wide
            };
            let policies = keep.iter().map(|&i| candidates[i].clone()).collect();
            (policies, first)
        }
    };
    let mut studied = vec![(reference, first)];
    for &g in others {
        studied.push((g, capacity(&behind(scenario, g), &policies)?));
    }
    for (gateways, capacity) in studied {
        let quality = quality(&behind(scenario, gateways), &policies, &capacity.seeds)?;
        study.deployments.push(Deployment {
            gateways,
            capacity,
            quality,
        });
    }
    Ok(study)
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::{Share, Split};
    use std::cell::RefCell;

    /// A study of `policies` on seeds 1 and 2 in which each policy carries `carries(name)`
    /// (1 % more on seed 2).
    fn study_of(policies: &[PolicyConfig], carries: impl Fn(&str) -> f64) -> CapacityStudy {
        crate::fixture::study(policies, &[1, 2], |p, seed| {
            carries(&policies[p].name) * (1.0 + seed as f64 / 100.0)
        })
    }

    fn scenario() -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/seed/burst-probe.yaml");
        Scenario::load(&path).unwrap()
    }

    #[test]
    fn the_seeds_policy_is_followed_with_the_best_field_router_behind_every_deployment() {
        let deployments = [1, 4, 16].map(|replicas| Gateways {
            replicas,
            split: Split::Random,
            share: Share::None,
        });
        let own = PolicyConfig::from_name("seed-v3").unwrap();
        // Capacity studies asked for: (replicas behind, policies).
        let asked = RefCell::new(Vec::<(u32, Vec<String>)>::new());
        let measured = RefCell::new(Vec::<(u32, usize, Vec<u64>)>::new());
        let st = run_replica_study(
            &scenario(),
            &deployments,
            Followed::OwnAndBestField(Box::new(own)),
            |s, policies| {
                let names = policies.iter().map(|p| p.name.clone()).collect();
                asked.borrow_mut().push((s.setup.gateways.replicas, names));
                // least-load carries the most of the field; behind more replicas, less.
                let r = f64::from(s.setup.gateways.replicas);
                Ok::<_, ()>(study_of(policies, |n| match n {
                    "least-load" => 9.0 / r.sqrt(),
                    "seed-v3" => 5.0,
                    _ => 3.0,
                }))
            },
            |s, policies, seeds| {
                let replicas = s.setup.gateways.replicas;
                measured
                    .borrow_mut()
                    .push((replicas, policies.len(), seeds.to_vec()));
                Ok(vec![Quality::default(); policies.len()])
            },
        )
        .unwrap();
        let asked = asked.into_inner();
        // Behind the reference: the seed's policy and every field preset, once.
        assert_eq!(asked[0].0, 1);
        assert_eq!(asked[0].1[0], "seed-v3");
        let field = field_presets(&PolicyConfig::from_name("seed-v3").unwrap());
        assert!(field.len() >= 5, "{field:?}");
        assert_eq!(asked[0].1.len(), 1 + field.len());
        // Behind the others: only the two followed.
        for (i, replicas) in [(1, 4), (2, 16)] {
            assert_eq!(
                asked[i],
                (replicas, vec!["seed-v3".into(), "least-load".into()])
            );
        }
        assert_eq!(asked.len(), 3);
        // The reference's study is cut to the same two (its runs, not new ones).
        let names = |d: &Deployment| -> Vec<String> {
            d.capacity
                .policies
                .iter()
                .map(|p| p.policy.clone())
                .collect()
        };
        assert!(
            st.deployments
                .iter()
                .all(|d| names(d) == ["seed-v3", "least-load"])
        );
        let replicas: Vec<u32> = st.deployments.iter().map(|d| d.gateways.replicas).collect();
        assert_eq!(replicas, [1, 4, 16]);
        // Quality is measured behind each deployment, on its study's seeds.
        assert_eq!(
            measured.into_inner(),
            [1, 4, 16].map(|r| (r, 2, vec![1, 2])).to_vec()
        );
        // least-load degrades from 4 replicas on (9/2 against 9 on both seeds); seed-v3 never.
        assert_eq!(st.degrades_at(1, Share::None), Some(4));
        assert_eq!(st.degrades_at(0, Share::None), None);
    }

    #[test]
    fn given_policies_are_studied_as_given_and_errors_stop_the_study() {
        let one = [Gateways::default()];
        let policies = ["seed-v1", "kv-cost"].map(|n| PolicyConfig::from_name(n).unwrap());
        let asked = RefCell::new(Vec::<Vec<String>>::new());
        let st = run_replica_study(
            &scenario(),
            &one,
            Followed::Given(policies.to_vec()),
            |_, p| {
                asked
                    .borrow_mut()
                    .push(p.iter().map(|p| p.name.clone()).collect());
                Ok::<_, ()>(study_of(p, |_| 1.0))
            },
            |_, p, _| Ok(vec![Quality::default(); p.len()]),
        )
        .unwrap();
        assert_eq!(asked.into_inner(), [vec!["seed-v1", "kv-cost"]]);
        assert_eq!(st.deployments.len(), 1);
        let failed = run_replica_study(
            &scenario(),
            &one,
            Followed::Given(policies.to_vec()),
            |_, _| Err("no capacity"),
            |_, p, _| Ok(vec![Quality::default(); p.len()]),
        );
        assert_eq!(failed.unwrap_err(), "no capacity");
    }
}
