//! The event engine on the source's case studies, on queueing theory, and on determinism.

use routelab_policies::{AdminError, PolicyConfig};
use routelab_sim::{
    Action, LifecycleEvent, RequestRecord, RunMetrics, Scenario, Status, WarningReason, run,
};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load(rel: &str) -> Scenario {
    Scenario::load(root().join(rel)).unwrap_or_else(|e| panic!("{e}"))
}

fn run_policy(sc: &Scenario, policy: &PolicyConfig) -> RunMetrics {
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, policy, &mut *t, None).unwrap()
}

fn run_named(sc: &Scenario, name: &str) -> RunMetrics {
    let p = sc
        .policies
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("policy {name} not in scenario"));
    run_policy(sc, p)
}

fn worker<'a>(m: &'a RunMetrics, name: &str) -> &'a routelab_sim::WorkerTotals {
    m.workers.iter().find(|w| w.name == name).unwrap()
}

#[test]
fn sixteen_at_once_splits_12_4_under_v1_and_favours_the_pro_6000_under_v3() {
    let sc = load("../scenarios/seed/sixteen-at-once.yaml");
    let v1 = run_named(&sc, "seed-v1");
    assert_eq!(worker(&v1, "pair").requests, 12);
    assert_eq!(worker(&v1, "pro6000").requests, 4);
    let v3 = run_named(&sc, "seed-v3");
    assert!(worker(&v3, "pro6000").requests > 8, "{:?}", v3.workers);
    assert_eq!(v3.completed, 16);
    let (e1, e3) = (
        v1.e2e.quantile_secs(1.0).unwrap(),
        v3.e2e.quantile_secs(1.0).unwrap(),
    );
    assert!(
        e3 < e1,
        "v3 batch {e3:.2} s should finish before v1 {e1:.2} s"
    );
    // Probes: warm-up + measurement per worker, ~2 s of GPU each on the PRO 6000.
    assert_eq!(v3.probe_bursts, 4);
    assert_eq!(v3.probe_measurements, 2);
    assert!((worker(&v3, "pro6000").final_weight - 1.37).abs() < 0.02);
}

#[test]
fn cold_probe_flips_the_weights_and_warm_up_fixes_it() {
    let sc = load("../scenarios/seed/cold-restart.yaml");
    let cold = run_named(&sc, "seed-v3-cold");
    // 275 / median(275, 453) = 0.755; ±15 % on the 275 tok/s reading.
    let w = worker(&cold, "pro6000").final_weight;
    assert!((0.68..=0.83).contains(&w), "cold PRO 6000 weight {w}");
    assert!(worker(&cold, "pair").final_weight > 1.0);
    assert!(worker(&cold, "pair").requests > worker(&cold, "pro6000").requests);
    let warm = run_named(&sc, "seed-v3");
    // Within 10 % of the warm 992 tok/s: weight 1.31 ..= 1.41.
    let w = worker(&warm, "pro6000").final_weight;
    assert!((1.30..=1.42).contains(&w), "warm PRO 6000 weight {w}");
    assert!(worker(&warm, "pro6000").requests > worker(&warm, "pair").requests);
}

#[test]
fn live_correction_fails_on_sparse_bursts() {
    let sc = load("../scenarios/seed/live-sparse.yaml");
    let v2 = run_named(&sc, "seed-v2");
    let (a, b) = (
        worker(&v2, "pair").final_weight,
        worker(&v2, "pro6000").final_weight,
    );
    assert!(
        (a - b).abs() < 0.1,
        "live weights {a} vs {b} should end (wrongly) equal"
    );
    // The probe, on the same traffic, does tell the machines apart.
    let v3 = run_named(&sc, "seed-v3");
    assert!(worker(&v3, "pro6000").final_weight > 2.0 * worker(&v3, "pair").final_weight);
}

#[test]
fn live_correction_separates_a_degraded_4090() {
    let sc = load("../scenarios/seed/identical-4090s.yaml");
    let v1 = run_named(&sc, "seed-v1");
    assert_eq!(
        worker(&v1, "healthy").final_weight,
        worker(&v1, "degraded").final_weight
    );
    let v2 = run_named(&sc, "seed-v2");
    let (h, d) = (
        worker(&v2, "healthy").final_weight,
        worker(&v2, "degraded").final_weight,
    );
    assert!(h > 1.5 * d, "live weights healthy {h} vs degraded {d}");
    let at_load = run_named(&sc, "at-load/p2c:higher-weight/capacity/flat");
    let (h, d) = (
        worker(&at_load, "healthy").final_weight,
        worker(&at_load, "degraded").final_weight,
    );
    assert!(h > 1.5 * d, "at-load weights healthy {h} vs degraded {d}");
    assert_eq!(at_load.probe_bursts, 0, "at-load costs no probe");
}

#[test]
fn quiet_hours_ties_to_the_higher_weight_lower_latency() {
    let sc = load("../scenarios/seed/quiet-hours-gpu-mac.yaml");
    let coin = run_named(&sc, "probe/p2c:first/capacity/flat");
    let higher = run_named(&sc, "probe/p2c:higher-weight/capacity/flat");
    let (c, h) = (
        coin.e2e.mean_secs().unwrap(),
        higher.e2e.mean_secs().unwrap(),
    );
    assert!(
        h < 0.8 * c,
        "higher-weight mean {h:.2} s vs coin toss {c:.2} s"
    );
    assert!(worker(&higher, "pro6000").requests > 4 * worker(&higher, "mac").requests);
}

/// M/G/1 processor sharing: mean response = E[S] / (1 - rho), whatever the service distribution.
/// The decode server's work is the `N - 1` tokens after the first (the prefill produced it).
/// The prefill of a one-token prompt costs the server nothing but the request one engine step,
/// which with `n` decoding lasts `n / 1000` s; an arrival sees on average `rho / (1 - rho)`
/// decoding, so that step adds `rho / (1 - rho) / 1000` s (~0.7 % of the response time here).
#[test]
fn single_worker_matches_processor_sharing_theory() {
    let sc = load("tests/data/mm1-ps.yaml");
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    let m = run(&sc.setup, &sc.policies[0], &mut *t, Some(&mut rows)).unwrap();
    assert_eq!(m.completed, 300_000);
    // Exact E[S] of the lengths drawn (rounded exponential), less the prefill's token, at
    // 1000 tok/s.
    let mean_s = rows
        .iter()
        .map(|r| f64::from(r.output_tokens - 1))
        .sum::<f64>()
        / rows.len() as f64
        / 1000.0;
    let span = m.last_completion_ns as f64 / 1e9;
    let rate = rows.len() as f64 / span;
    let rho = rate * mean_s;
    let prefill_step = rho / (1.0 - rho) / 1000.0;
    let expected = mean_s / (1.0 - rho) + prefill_step;
    let got = rows
        .iter()
        .map(|r| r.e2e_s.expect("completed"))
        .sum::<f64>()
        / rows.len() as f64;
    let err = (got - expected).abs() / expected;
    eprintln!(
        "M/G/1-PS: simulated {got:.4} s, theory {expected:.4} s, rho {rho:.3}, error {:.2} %",
        err * 100.0
    );
    assert!(
        err < 0.02,
        "mean response {got:.4} s vs E[S]/(1-rho) = {expected:.4} s (rho {rho:.3}): {:.2} %",
        err * 100.0
    );
}

fn rows_of(sc: &Scenario, policy: &PolicyConfig) -> String {
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, policy, &mut *t, Some(&mut rows)).unwrap();
    rows.iter().map(|r| format!("{r:?}\n")).collect()
}

#[test]
fn same_seed_same_rows_on_any_number_of_threads() {
    let sc = load("../scenarios/seed/quiet-hours-gpu-mac.yaml");
    let sequential: Vec<String> = sc.policies.iter().map(|p| rows_of(&sc, p)).collect();
    let parallel: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = sc
            .policies
            .iter()
            .map(|p| s.spawn(|| rows_of(&sc, p)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sequential, parallel);
    assert!(sequential[0].lines().count() > 100);
    // A different seed gives different traffic and different rows.
    let reseeded = Scenario {
        setup: sc.setup_for_seed(99),
        ..sc.clone()
    };
    assert_ne!(sequential[0], rows_of(&reseeded, &sc.policies[0]));
}

fn inline(name: &str, src: &str) -> Scenario {
    // The path only places `hardware_dir` (tests/data/hardware).
    Scenario::from_yaml(src, &root().join("tests/data").join(name))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Regression: a one-token output has no inter-token time. The simulator's row had NaN where
/// the player's had 0.0; both rows now have none.
#[test]
fn a_one_token_output_has_no_tpot_in_the_simulators_rows() {
    let src = |output: u32| {
        format!(
            "name: test/one-token\nseed: 3\nhardware_dir: hardware\n\
             fleet:\n  - {{ name: only, profile: constant-rate }}\n\
             traffic:\n  - poisson: {{ rate_per_s: 1, count: 20, prompt: {{ fixed: 8 }}, output: {{ fixed: {output} }} }}\n\
             policies: [\"equal/p2c/no-affinity/none\"]\ntimeline_s: 0\n"
        )
    };
    let one = inline("one-token.yaml", &src(1));
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = one.traffic_source(one.setup.seed).unwrap();
    let m = run(&one.setup, &one.policies[0], &mut *t, Some(&mut rows)).unwrap();
    assert_eq!((m.completed, rows.len()), (20, 20));
    assert!(
        rows.iter()
            .all(|r| r.status == Status::Ok && r.output_tokens == 1)
    );
    assert!(rows.iter().all(|r| r.tpot_s.is_none()), "{rows:?}");
    assert!(rows.iter().all(|r| r.ttft_s.is_some() && r.e2e_s.is_some()));
    // The distribution keeps counting them as 0 s (baselines stay comparable).
    assert_eq!(m.tpot.quantile_secs(1.0), Some(0.0));
    assert_eq!(m.ttft.count(), 20);
    // Two tokens do have one.
    let two = inline("two-tokens.yaml", &src(2));
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = two.traffic_source(two.setup.seed).unwrap();
    let m = run(&two.setup, &two.policies[0], &mut *t, Some(&mut rows)).unwrap();
    assert!(rows.iter().all(|r| r.tpot_s.is_some_and(|x| x > 0.0)));
    assert_eq!(m.tpot.count(), 20);
}

/// Regression: lifecycle events the router refused (or a pin the weights ignore) were dropped
/// without a trace (`let _ = self.router.…`).
#[test]
fn refused_scenario_events_become_run_warnings() {
    let sc = inline(
        "pins.yaml",
        "name: test/pins\nseed: 3\nhardware_dir: hardware\n\
         fleet:\n  - { name: a, profile: constant-rate }\n  - { name: b, profile: constant-rate }\n\
         traffic:\n  - poisson: { rate_per_s: 2, count: 40, prompt: { fixed: 8 }, output: { fixed: 4 } }\n\
         policies: [\"equal/p2c/no-affinity/none\", \"probe/p2c/no-affinity/none\"]\ntimeline_s: 0\n",
    );
    // Events added after loading, so that a stricter scenario validator cannot refuse them.
    let mut setup = sc.setup.clone();
    let s = 1_000_000_000;
    let event = |at: u64, worker: usize, action: Action| LifecycleEvent {
        at: at * s,
        worker,
        action,
    };
    setup.events = vec![
        event(5, 0, Action::Pin(2.0)),
        event(6, 1, Action::Remove),
        event(7, 1, Action::Pin(2.0)),
        event(8, 0, Action::Pin(3.0)),
    ];
    let run_with = |p: &PolicyConfig| {
        let mut t = sc.traffic_source(sc.setup.seed).unwrap();
        run(&setup, p, &mut *t, None).unwrap()
    };
    let equal = run_with(&sc.policies[0]);
    let reasons: Vec<(u64, &str, &str, &WarningReason)> = equal
        .warnings
        .iter()
        .map(|w| (w.at.as_nanos() / s, w.worker.as_str(), w.action, &w.reason))
        .collect();
    let ignored = WarningReason::PinIgnored { weights: "equal" };
    assert_eq!(reasons.len(), 3, "{:?}", equal.warnings);
    assert_eq!(reasons[0], (5, "a", "pin", &ignored));
    assert!(
        matches!(
            reasons[1],
            (
                7,
                "b",
                "pin",
                WarningReason::Refused(AdminError::UnknownWorker(_))
            )
        ),
        "{reasons:?}"
    );
    assert_eq!(reasons[2], (8, "a", "pin", &ignored));
    assert!(equal.warnings[0].to_string().contains("do not take pins"));
    // Under probe weights the pins of `a` take effect; the removed worker's is still refused.
    let probe = run_with(&sc.policies[1]);
    assert_eq!(probe.warnings.len(), 1, "{:?}", probe.warnings);
    assert_eq!(probe.warnings[0].worker, "b");
    assert_eq!(
        probe.workers[0].final_provenance,
        routelab_policies::Provenance::Pinned
    );
}

/// Regression (issue 10 §1): the first output token, produced by the prefill, was counted
/// again by decode. N output tokens took the prefill plus N decode steps, so a 1-token output
/// ended a decode step after its first token and the TPOT of a 2-token output was two steps.
/// As in vLLM, the prefill step emits the first token and N − 1 decode steps follow.
#[test]
fn n_output_tokens_are_n_emissions_the_first_at_the_prefill() {
    // Seven long requests keep the engine decoding; at 1 s one short request of `output`
    // tokens arrives: its prefill rides in a step beside the seven, then it decodes with them.
    let src = |output: u32| {
        format!(
            "name: test/first-token\nseed: 3\n\
             fleet:\n  - {{ name: pro, profile: rtx-pro-6000-27b }}\n\
             traffic:\n  - burst: {{ at_s: 0, size: 7, prompt: {{ fixed: 8 }}, output: {{ fixed: 4000 }} }}\n\
             \x20 - burst: {{ at_s: 1, size: 1, prompt: {{ fixed: 8 }}, output: {{ fixed: {output} }} }}\n\
             policies: [\"equal/p2c/no-affinity/none\"]\ntimeline_s: 0\n"
        )
    };
    let short_row = |output: u32| {
        let sc = inline("first-token.yaml", &src(output));
        let mut rows: Vec<RequestRecord> = Vec::new();
        let mut t = sc.traffic_source(sc.setup.seed).unwrap();
        let m = run(&sc.setup, &sc.policies[0], &mut *t, Some(&mut rows)).unwrap();
        assert_eq!((m.completed, rows.len()), (8, 8));
        let short = rows
            .into_iter()
            .find(|r| r.output_tokens == output)
            .expect("the short request");
        (sc, short)
    };
    // One token: the request ends with its first token.
    let (_, one) = short_row(1);
    assert!(one.ttft_s.is_some_and(|t| t > 0.0), "{one:?}");
    assert_eq!(one.e2e_s, one.ttft_s, "{one:?}");
    // Two tokens: one decode step at concurrency 8 after the first token.
    let (sc, two) = short_row(2);
    let step = 1.0 / sc.setup.workers[0].profile.per_request_tok_s(8.0);
    let (ttft, e2e) = (two.ttft_s.unwrap(), two.e2e_s.unwrap());
    assert!(
        ((e2e - ttft) - step).abs() < 1e-6,
        "e2e - TTFT {} s, one step at 8 is {step} s",
        e2e - ttft
    );
    assert!(
        two.tpot_s.is_some_and(|t| (t - step).abs() < 1e-6),
        "{two:?}"
    );
}
