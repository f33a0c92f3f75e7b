//! The out-of-sample check of `compare --holdout` and `capacity --holdout`: the verdict picked
//! on the first part of each trace (by time) is checked on the held-out rest, paired like every
//! verdict: on the held-out part, the in-sample winner against the best policy there, on the
//! same seeds. What the check found is reports' [`OutOfSample`], with its figures in words from
//! `routelab_reports::holdout`.

use routelab_reports::capacity::{CapacityStudy, PolicyKind, best};
use routelab_reports::holdout::{
    Holds, OutOfSample, capacity_detail_beaten, capacity_detail_kept, compare_detail_beaten,
    compare_detail_kept,
};
use routelab_reports::stats::excludes;
use routelab_reports::{
    Direction, ScenarioComparison, headline_metric, interval, paired_diff, winner,
};

/// The verdict on an in-sample `winner` that met `best_held_out` as the best policy of the
/// held-out part: it holds when they are one policy, else it fails when the held-out best beats
/// it `established` (its paired interval excludes no difference), else neither.
fn judge(winner: &str, best_held_out: &str, established: bool) -> Holds {
    if winner == best_held_out {
        Holds::Yes
    } else if established {
        Holds::No
    } else {
        Holds::Tied
    }
}

/// The out-of-sample check of a comparison: the winner of `in_sample` on the headline metric
/// (the report's first sentence), checked on `held` (the same scenario's held-out part, same
/// policies and seeds): still the best there, or beaten (paired difference established), or
/// neither. `None` when either part has no winner.
pub fn compare_out_of_sample(
    in_sample: &ScenarioComparison,
    held: &ScenarioComparison,
    held_out: &str,
) -> Option<OutOfSample> {
    let m = headline_metric();
    let w = winner(in_sample, m)?;
    let hw = winner(held, m)?;
    let wi = held.policies.iter().position(|p| p.policy == w.winner)?;
    let best = match m.direction {
        Direction::Higher => "highest",
        _ => "lowest",
    };
    let (established, detail) = if hw.winner == w.winner {
        (false, compare_detail_kept(m, &hw))
    } else {
        let bi = held.policies.iter().position(|p| p.policy == hw.winner)?;
        let d = paired_diff(&held.policies[bi], &held.policies[wi], m);
        let winner_mean = interval(&held.policies[wi], m).map(|i| i.mean);
        let detail = compare_detail_beaten(m, &hw, &w.winner, winner_mean, &d);
        (d.established, detail)
    };
    Some(OutOfSample {
        held_out: held_out.to_string(),
        criterion: format!("{best} {}", m.label),
        holds: judge(&w.winner, &hw.winner, established),
        winner: w.winner,
        best_held_out: hw.winner,
        detail,
    })
}

/// The out-of-sample check of a capacity study: the policy `in_sample` ships (the most capacity
/// of any deployable policy), checked on `held` (the same scenario's held-out part, same
/// policies and seed plan): still the most there, or beaten (the paired ratio excludes 1), or
/// neither. `None` when either part ships nothing.
pub fn capacity_out_of_sample(
    in_sample: &CapacityStudy,
    held: &CapacityStudy,
    held_out: &str,
) -> Option<OutOfSample> {
    fn deployable(st: &CapacityStudy) -> impl Fn(usize) -> bool + '_ {
        move |i| PolicyKind::of(st, i) != PolicyKind::Oracle
    }
    let ship = best(in_sample, deployable(in_sample))?;
    let name = &in_sample.policies[ship].policy;
    let hi = held.policies.iter().position(|p| &p.policy == name)?;
    let held_best = best(held, deployable(held))?;
    let (established, detail) = if held_best == hi {
        let next = best(held, |i| i != hi && deployable(held)(i));
        (false, capacity_detail_kept(held, hi, next))
    } else {
        let r = held.ratio_to(held_best, hi);
        let established = r.is_some_and(|r| excludes(&r, 1.0) && r.mean > 1.0);
        (established, capacity_detail_beaten(held, held_best, hi))
    };
    let best_held_out = held.policies[held_best].policy.clone();
    Some(OutOfSample {
        held_out: held_out.to_string(),
        criterion: "the most capacity at the SLO of any deployable policy".into(),
        holds: judge(name, &best_held_out, established),
        winner: name.clone(),
        best_held_out,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policies::PolicyRole;
    use routelab_reports::PolicySeeds;
    use routelab_reports::holdout::held_out_text;
    use routelab_sim::RunMetrics;

    /// Two policies, `slow` and `fast`, each with these end-to-end latencies on seeds 1..=3.
    fn comparison(slow: [f64; 3], fast: [f64; 3]) -> ScenarioComparison {
        let policy = |name: &str, e2e: [f64; 3]| {
            let mut p = PolicySeeds::new(name, PolicyRole::Ours);
            for (seed, e) in (1..).zip(e2e) {
                let mut m = RunMetrics::new(name, vec![]);
                m.requests = 1;
                m.completed = 1;
                m.e2e.record_secs(e);
                p.push(seed, &m);
            }
            p
        };
        ScenarioComparison::new(
            "test/two",
            "",
            vec![policy("slow", slow), policy("fast", fast)],
        )
    }

    #[test]
    fn a_comparisons_winner_holds_fails_or_ties_on_the_held_out_part() {
        // `fast` wins in sample. The check against each held-out part (slow's and fast's
        // latencies on its three seeds):
        let checked = |slow: [f64; 3], fast: [f64; 3]| {
            let in_sample = comparison([2.0, 2.2, 2.4], [1.0, 1.1, 1.2]);
            let held = comparison(slow, fast);
            compare_out_of_sample(&in_sample, &held, &held_out_text(0.3)).unwrap()
        };
        let o = checked([2.0, 2.1, 2.2], [1.0, 1.2, 1.1]);
        assert_eq!((o.winner.as_str(), o.holds), ("fast", Holds::Yes));
        assert_eq!(o.criterion, "lowest e2e mean");
        assert!(
            o.detail
                .starts_with("e2e mean 1.10 s against 2.10 s for `slow`, paired -47.6% ["),
            "{o:?}"
        );
        // `slow` beats it on every held-out seed: it fails, and the detail says by how much.
        let o = checked([1.0, 1.1, 1.2], [2.0, 2.2, 2.4]);
        assert_eq!((o.best_held_out.as_str(), o.holds), ("slow", Holds::No));
        assert!(
            o.detail
                .starts_with("e2e mean 1.10 s against 2.20 s for `fast`, paired -50.0%"),
            "{o:?}"
        );
        // `slow` ahead on the mean only, not on every seed: neither.
        let o = checked([1.0, 3.0, 1.0], [2.0, 1.0, 2.1]);
        assert_eq!(o.holds, Holds::Tied, "{o:?}");
        assert!(
            o.sentence().contains("is not established"),
            "{}",
            o.sentence()
        );
    }

    /// A study of a baseline, a field router, ours and the oracle on seeds 1..=3, each carrying
    /// `speeds[i]` times 8 (a little more on later seeds, the same for all: ratios are exact).
    fn study(speeds: [f64; 4]) -> CapacityStudy {
        let policies = crate::fixture::policies(&[
            "equal/round-robin/none/none",
            "cache-aware",
            "seed-v3",
            "oracle/sed/capacity/weighted:24",
        ]);
        crate::fixture::study(&policies, &[1, 2, 3], |p, seed| {
            8.0 * speeds[p] * (1.0 + seed as f64 / 10.0)
        })
    }

    #[test]
    fn the_shipped_policy_is_checked_against_the_deployable_ones_only() {
        // Ours ships in sample (1.8 against the field's 1.5); the oracle carries more but is
        // never shipped. The check against each held-out part:
        let checked = |held: [f64; 4]| {
            let in_sample = study([1.0, 1.5, 1.8, 2.0]);
            capacity_out_of_sample(&in_sample, &study(held), &held_out_text(0.3)).unwrap()
        };
        let o = checked([1.0, 1.5, 1.8, 2.0]);
        assert_eq!((o.winner.as_str(), o.holds), ("seed-v3", Holds::Yes));
        assert!(
            o.detail
                .starts_with("it carries 1.20x [1.20, 1.20] `cache-aware`'s load"),
            "{o:?}"
        );
        // Held out, the field router carries 1.5 against ours' 1.2, on every seed: it fails.
        let o = checked([1.0, 1.5, 1.2, 2.0]);
        assert_eq!(
            (o.best_held_out.as_str(), o.holds),
            ("cache-aware", Holds::No)
        );
        assert!(
            o.detail
                .starts_with("`cache-aware` carries 1.25x [1.25, 1.25] `seed-v3`'s load"),
            "{o:?}"
        );
        // Ours as fast as the field router held out: the field router ranks first on a tie
        // only by order, and their ratio of exactly 1 establishes nothing.
        assert_eq!(checked([1.0, 1.5, 1.5, 2.0]).holds, Holds::Tied);
    }
}
