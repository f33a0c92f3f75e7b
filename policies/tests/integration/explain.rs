//! Decisions that explain themselves: an explained decision is the decision the plain path
//! makes from the same state and draws, and the scores it reports are the ones a
//! recomputation from the router's state before the decision finds (`Router::score_of`).

use crate::common::{policy, rng, secs, spec_full, with_chooser};
use rand::{Rng, RngExt};
use routelab_policies::{
    Chooser, Completion, Explanation, PredictiveParams, Reason, RouteRequest, Router, Scored, Time,
    WorkerId,
};
use std::collections::HashMap;
use std::time::Duration;

const MODEL: &str = "m";

/// Eight workers of one model, windows 32k and 8k, added to a router of `name` (or `name`'s
/// router with `chooser`).
fn fleet(mut config: routelab_policies::PolicyConfig, chooser: Option<Chooser>) -> Router {
    if let Some(c) = chooser {
        config = with_chooser(config, c);
    }
    let mut r = Router::new(config);
    for i in 0..8 {
        let window = if i % 3 == 0 { 8_192 } else { 32_768 };
        r.register(
            Time::ZERO,
            spec_full(&format!("w{i}"), &format!("n{i}"), MODEL, &[], window, ""),
        );
    }
    r
}

/// A scored candidate as the explanation reports it under `reason` (a write-off compares
/// harms).
fn as_compared(s: Scored, reason: Reason) -> f64 {
    match reason {
        Reason::WriteOff => s.predicted.expect("predictive").harm,
        _ => s.score,
    }
}

/// Drive `plain` and `explained` (same policy, same fleet) through `n` decisions and
/// completions; returns the reasons seen. Panics on the first disagreement.
fn compare(mut plain: Router, mut explained: Router, n: usize, seed: u64) -> HashMap<Reason, u32> {
    let model = plain.model_id(MODEL).unwrap();
    let (mut rng_a, mut rng_b, mut load) = (rng(seed), rng(seed), rng(seed ^ 0x5eed));
    let mut in_flight: Vec<(WorkerId, routelab_policies::Charge, Time, u32)> = Vec::new();
    let mut reasons = HashMap::new();
    let mut why = Explanation::new();
    for step in 0..n {
        let now = secs(step as f64 * 0.05);
        // Finish some requests, as the same completions on both routers.
        while !in_flight.is_empty() && load.random_bool(0.45) {
            let k = load.random_range(0..in_flight.len());
            let (w, charge, at, prompt) = in_flight.swap_remove(k);
            let first = at + Duration::from_millis(load.random_range(20..400));
            let c = Completion {
                prompt_tokens: prompt,
                output_tokens: 64,
                dispatched_at: at,
                first_token_at: first,
                completed_at: first + Duration::from_millis(load.random_range(300..3_000)),
            };
            plain.complete(c.completed_at, w, charge, &c);
            explained.complete(c.completed_at, w, charge, &c);
        }
        let chain: Vec<u64> = (0..load.random_range(0..12u64))
            .map(|b| load.random_range(0..3u64) * 1_000 + b)
            .collect();
        let prompt = 16 * chain.len() as u32 + load.random_range(1..400);
        let req = RouteRequest {
            model,
            context_tokens: prompt + if load.random_bool(0.2) { 9_000 } else { 100 },
            prefix: &chain,
            prompt_tokens: prompt,
            session: None,
        };
        let before: Vec<Option<Scored>> = (0..8)
            .map(|i| explained.score_of(&req, WorkerId(i)))
            .collect();
        let a = plain.route_excluding(now, &req, &[], &mut rng_a);
        let b = explained.route_explained(now, &req, &[], &mut rng_b, &mut why);
        assert_eq!(a, b, "step {step}: the explained decision differs");
        assert_eq!(
            rng_a.next_u64(),
            rng_b.next_u64(),
            "step {step}: other draws"
        );
        let Ok(d) = b else { continue };
        in_flight.push((d.worker, d.charge, now, prompt));
        *reasons.entry(why.reason).or_default() += 1;
        assert_eq!(why.worker, Some(d.worker), "step {step}");
        assert_eq!(
            why.reason == Reason::Affinity,
            d.affinity_kept,
            "step {step}"
        );
        let Some(chosen) = why.chosen else {
            assert!(
                why.runner_up.is_none(),
                "step {step}: a runner-up without a score"
            );
            continue;
        };
        assert_eq!(chosen.worker, d.worker, "step {step}");
        // Each reported score is the recomputation's, exactly.
        for s in std::iter::once(chosen).chain(why.runner_up) {
            let again = before[s.worker.index()].expect("a scored candidate");
            assert_eq!(s.predicted, again.predicted, "step {step}: {s:?}");
            assert_eq!(
                s.score,
                as_compared(again, why.reason),
                "step {step}: {s:?}"
            );
        }
        if let Some(r) = why.runner_up {
            assert_ne!(r.worker, chosen.worker, "step {step}");
            assert!(chosen.score <= r.score, "step {step}: the lower score wins");
        }
    }
    reasons
}

#[test]
fn explained_decisions_are_the_plain_ones_and_report_the_scores_they_compared() {
    for name in [
        "equal/p2c:first/no-affinity/flat:3",
        "equal/sed:higher-weight/no-affinity/flat:3",
        "equal/jsq:random/no-affinity/flat:4",
        "equal/p2c:higher-weight/capacity/flat:3",
        "equal/least-request:first/no-affinity/flat:3",
    ] {
        let reasons = compare(
            fleet(policy(name), None),
            fleet(policy(name), None),
            600,
            11,
        );
        assert!(
            reasons.get(&Reason::Score).copied().unwrap_or(0) > 50,
            "{name}: {reasons:?}"
        );
    }
}

#[test]
fn predictive_reports_its_predicted_ttft_and_tpot_and_its_write_offs() {
    let base = policy("equal/p2c/no-affinity/flat:1000");
    let chooser = Chooser::Predictive(PredictiveParams {
        scan: 5,
        ..PredictiveParams::DEFAULT
    });
    // Bounds it can meet, then bounds nothing meets (every request written off).
    for (ttft, tpot, expect) in [(2.0, 0.5, Reason::Score), (1e-6, 1e-6, Reason::WriteOff)] {
        let (mut a, mut b) = (
            fleet(base.clone(), Some(chooser)),
            fleet(base.clone(), Some(chooser)),
        );
        a.aim_at(ttft, tpot);
        b.aim_at(ttft, tpot);
        let reasons = compare(a, b, 800, 5);
        assert!(
            reasons.get(&expect).copied().unwrap_or(0) > 100,
            "{expect:?}: {reasons:?}"
        );
    }
}

#[test]
fn choosers_that_compare_no_scores_say_so() {
    for name in [
        "equal/random/no-affinity/flat:3",
        "equal/wrr/no-affinity/flat:3",
        "cache-aware",
    ] {
        let reasons = compare(fleet(policy(name), None), fleet(policy(name), None), 300, 3);
        assert!(
            reasons.contains_key(&Reason::Unscored),
            "{name}: {reasons:?}"
        );
        assert!(!reasons.contains_key(&Reason::Score), "{name}: {reasons:?}");
    }
}
