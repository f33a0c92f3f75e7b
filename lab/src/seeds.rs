//! Seed growth: `--seeds auto` adds seeds to every comparison until each reported difference
//! from the baseline is known to the precision asked (the stopping rule is
//! [`stop`], the differences [`reported_differences`]); and which seed is the k-th of a study
//! ([`seed_of`]).

use routelab_reports::stats::{AutoSeeds, Interval, SeedStop};
use routelab_reports::{ScenarioComparison, SeedResult, reported_differences};

/// The `k`-th seed (from 0) of a study whose first seed is `first`: `first + k`. Every
/// command that runs several seeds (`compare`, `sweep`, `capacity`) takes them from here, so
/// seed k of one is the same run as seed k of another.
#[must_use]
pub fn seed_of(first: u64, k: usize) -> u64 {
    first.wrapping_add(k as u64)
}

/// The `--seeds auto` rule after `n` seeds, with each reported difference as `(paired interval,
/// baseline mean)`: `Some(why)` to stop, `None` to add [`AutoSeeds::step`] more. Precise when
/// every difference's half-width is at most [`AutoSeeds::rel_half_width`] of its baseline's mean
/// (one seed has no interval, so it never is); else stop at [`AutoSeeds::max`].
pub fn stop(auto: &AutoSeeds, n: usize, diffs: &[(Interval, f64)]) -> Option<SeedStop> {
    let precise = n >= 2
        && diffs.iter().all(|(d, base)| {
            d.half_width
                .is_some_and(|h| h <= auto.rel_half_width * base.abs())
        });
    if precise {
        Some(SeedStop::Precise)
    } else if n >= auto.max {
        Some(SeedStop::MaxSeeds)
    } else {
        None
    }
}

/// `--seeds auto`: grow every comparison (its policies listed, no runs yet) seed by seed until
/// [`stop`] says stop on its [`reported_differences`], and record why. `run` is
/// handed a batch of `(comparison index, seed ordinal)` (ordinals count from 0 per
/// comparison) and returns, for each, the seed it ran and one [`routelab_sim::RunMetrics`] per policy in the
/// comparison's order; a batch holds every seed the open comparisons need next, so a caller can
/// run it in parallel.
pub fn grow_seeds<E, R: SeedResult>(
    comparisons: &mut [ScenarioComparison],
    auto: &AutoSeeds,
    mut run: impl FnMut(&[(usize, usize)]) -> Result<Vec<(u64, Vec<R>)>, E>,
) -> Result<(), E> {
    let first = auto.start.clamp(1, auto.max.max(1));
    let mut target: Vec<Option<usize>> = vec![Some(first); comparisons.len()];
    loop {
        let batch: Vec<(usize, usize)> = target
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (i, t)))
            .flat_map(|(i, t)| (comparisons[i].seeds_run()..t).map(move |k| (i, k)))
            .collect();
        if batch.is_empty() {
            return Ok(());
        }
        let results = run(&batch)?;
        for ((i, _), (seed, metrics)) in batch.iter().zip(results) {
            for (p, m) in comparisons[*i].policies.iter_mut().zip(&metrics) {
                m.push_to(p, seed);
            }
        }
        for (i, t) in target.iter_mut().enumerate() {
            let Some(n) = *t else { continue };
            let sc = &mut comparisons[i];
            sc.auto_seeds = Some(*auto);
            match stop(auto, n, &reported_differences(sc)) {
                Some(why) => {
                    sc.seed_stop = why;
                    *t = None;
                }
                None => *t = Some((n + auto.step.max(1)).min(auto.max.max(n + 1))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policies::PolicyRole;
    use routelab_reports::stats::paired_difference;
    use routelab_reports::{PolicySeeds, compare_file, compare_table};
    use routelab_sim::RunMetrics;

    /// A run whose only measured latency is an end-to-end of `e2e` s.
    fn fake_run(e2e: f64) -> RunMetrics {
        let mut m = RunMetrics::new("fake", vec![]);
        m.requests = 1;
        m.completed = 1;
        m.e2e.record_secs(e2e);
        m
    }

    #[test]
    fn seeds_auto_stops_when_precise_or_at_the_maximum() {
        let auto = AutoSeeds {
            start: 3,
            step: 2,
            max: 7,
            rel_half_width: 0.05,
        };
        let mut cs = vec![
            ScenarioComparison::new(
                "precise",
                "",
                vec![
                    PolicySeeds::new("a", PolicyRole::Ours),
                    PolicySeeds::new("b", PolicyRole::Ours),
                ],
            ),
            ScenarioComparison::new(
                "noisy",
                "",
                vec![
                    PolicySeeds::new("a", PolicyRole::Ours),
                    PolicySeeds::new("b", PolicyRole::Ours),
                ],
            ),
        ];
        let mut batches = Vec::new();
        grow_seeds(&mut cs, &auto, |batch| {
            batches.push(batch.to_vec());
            Ok::<_, ()>(
                batch
                    .iter()
                    .map(|&(i, k)| {
                        // Shared seed noise; "b" is 1 s faster on every seed in the first
                        // scenario, and ±5 s off in the second.
                        let base = 10.0 + k as f64;
                        let b = if i == 0 {
                            base - 1.0
                        } else if k % 2 == 0 {
                            base + 5.0
                        } else {
                            base - 5.0
                        };
                        (100 + k as u64, vec![fake_run(base), fake_run(b)])
                    })
                    .collect(),
            )
        })
        .unwrap();
        assert_eq!(
            batches,
            vec![
                vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)],
                vec![(1, 3), (1, 4)],
                vec![(1, 5), (1, 6)],
            ]
        );
        assert_eq!((cs[0].seeds_run(), cs[0].seed_stop), (3, SeedStop::Precise));
        assert_eq!(
            (cs[1].seeds_run(), cs[1].seed_stop),
            (7, SeedStop::MaxSeeds)
        );
        let seeds: Vec<u64> = cs[1].policies[1].runs.iter().map(|r| r.seed).collect();
        assert_eq!(seeds, [100, 101, 102, 103, 104, 105, 106]);
        let f = compare_file(&cs);
        assert_eq!(f.scenarios[1].seed_stop, SeedStop::MaxSeeds);
        assert_eq!(f.scenarios[1].auto_seeds.unwrap().max, 7);
        let json = serde_json::to_string(&f.scenarios[0]).unwrap();
        assert!(
            json.contains(r#""seeds_run":3,"seed_stop":"precise""#),
            "{json}"
        );
        assert!(compare_table(&cs[1..]).contains("stopped at the maximum of 7 seeds"));
        assert!(compare_table(&cs[..1]).contains("within 5.0 % of the baseline's mean"));
        // The reported differences are the key metrics the baseline has a non-zero mean on.
        assert_eq!(
            reported_differences(&cs[0]).len(),
            3,
            "e2e mean, p50 and p99"
        );
        // A runner error stops the growth and is handed back.
        let mut fresh = vec![ScenarioComparison::new(
            "x",
            "",
            vec![PolicySeeds::new("a", PolicyRole::Ours)],
        )];
        assert_eq!(
            grow_seeds(&mut fresh, &auto, |_| {
                Err::<Vec<(u64, Vec<RunMetrics>)>, _>("boom")
            }),
            Err("boom")
        );
    }

    #[test]
    fn auto_seeds_stop_when_precise_or_at_the_maximum() {
        let auto = AutoSeeds::default();
        let tight = paired_difference(&[11.0, 21.0, 31.0], &[10.0, 20.0, 30.0]).unwrap();
        let loose = paired_difference(&[15.0, 21.0, 40.0], &[10.0, 20.0, 30.0]).unwrap();
        assert_eq!(stop(&auto, 3, &[(tight, 20.0)]), Some(SeedStop::Precise));
        assert_eq!(stop(&auto, 3, &[(tight, 20.0), (loose, 20.0)]), None);
        assert_eq!(stop(&auto, 20, &[(loose, 20.0)]), Some(SeedStop::MaxSeeds));
        // One seed has no interval: never precise.
        let one = paired_difference(&[1.0], &[1.0]).unwrap();
        assert_eq!(stop(&auto, 1, &[(one, 1.0)]), None);
    }
}
