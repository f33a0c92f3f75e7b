//! New and unmeasured workers (issue 10 section 5) and at-load's brakes (section 6): the
//! unmeasured-weight choice, slow start, and the validation of their fields.

use crate::common::{assert_near, model, poll, req, rng, run_probes, secs, spec, w};
use routelab_policies::weights::{Shaping, SlowStart, Unmeasured};
use routelab_policies::{
    Completion, ConfigError, PolicyConfig, PolicyEntry, Provenance, RawPolicy, Router, Time,
    WeightsConfig, WorkerId,
};

/// A probe policy (seed-v3's parts) with the given extra `weights` fields.
fn probe_policy(extra: &str) -> PolicyConfig {
    let yaml = format!("preset: seed-v3\nweights: {{ kind: probe{extra} }}\n");
    let raw: RawPolicy = routelab_policies::located::parse_yaml(&yaml, "p.yaml").unwrap();
    PolicyConfig::from_raw(&raw).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

/// Validate a policy whose error must be about `field`; the located message.
fn located_error(yaml: &str) -> routelab_policies::InputError {
    let entry: PolicyEntry = routelab_policies::located::parse_yaml(yaml, "s.yaml")
        .unwrap_or_else(|e| panic!("{yaml}: {e}"));
    match entry.build_in("s.yaml", "policies[0]") {
        Ok(p) => panic!("accepted:\n{yaml}\nas {p:?}"),
        Err(e) => e,
    }
}

/// Register `names` at `at`; measure the first `measured` of them with probe throughputs
/// `tok_s` (one per worker, by registration order).
fn fleet(router: &mut Router, at: Time, names: &[&str], tok_s: &[f64]) -> Vec<WorkerId> {
    let ids: Vec<WorkerId> = names
        .iter()
        .map(|n| router.register(at, spec(n, &["RTX 4090"])))
        .collect();
    run_probes(router, at, |id, _| tok_s[id.index()]);
    ids
}

#[test]
fn unmeasured_choices_give_neutral_floor_or_the_median_of_measured_peers() {
    // Three measured workers at 100, 900 and 500 tok/s: weights 0.25 (clamped from 0.2), 1.8
    // and 1.0 relative to the median 500. A fourth registers later and is not measured yet (its
    // probe is ordered, not answered).
    let mut weights = Vec::new();
    for extra in [
        "",
        ", unmeasured: neutral",
        ", unmeasured: floor",
        ", unmeasured: median",
    ] {
        let mut router = Router::new(probe_policy(extra));
        let ids = fleet(
            &mut router,
            secs(0.0),
            &["a", "b", "c"],
            &[100.0, 900.0, 500.0],
        );
        assert_near(w(&router, ids[0]), 0.25, 1e-6);
        assert_near(w(&router, ids[1]), 1.8, 1e-6);
        let new = router.register(secs(10.0), spec("new", &["RTX 4090"]));
        assert!(!poll(&mut router, secs(10.0)).is_empty(), "a probe is due");
        let weight = router.weight(new).unwrap();
        // Whatever the choice, a placeholder is not a measurement.
        assert_eq!(weight.provenance, Provenance::Default, "{extra}");
        weights.push(weight.value);
    }
    // Omitted and `neutral`: today's 1.0. `floor`: the clamp's lower bound. `median`: the
    // median of the measured peers' weights (0.25, 1.0, 1.8), not of their throughputs.
    assert_eq!(weights[..3], [1.0, 1.0, 0.25]);
    assert_near(weights[3], 1.0, 1e-6);

    // With an even number of measured peers the median of weights is not 1.0.
    let mut router = Router::new(probe_policy(", unmeasured: median"));
    let ids = fleet(&mut router, secs(0.0), &["a", "b"], &[100.0, 900.0]);
    // Throughput median 500: weights 0.25 (clamped) and 1.8; their median 1.025.
    assert_near(w(&router, ids[0]), 0.25, 1e-6);
    assert_near(w(&router, ids[1]), 1.8, 1e-6);
    let new = router.register(secs(10.0), spec("new", &["RTX 4090"]));
    assert_near(w(&router, new), 1.025, 1e-6);
    // Once measured it is its own figure; and with nobody measured the median is neutral.
    run_probes(&mut router, secs(20.0), |_, _| 500.0);
    assert_eq!(router.weight(new).unwrap().provenance, Provenance::Measured);
    let mut alone = Router::new(probe_policy(", unmeasured: median"));
    let first = alone.register(secs(0.0), spec("first", &["RTX 4090"]));
    assert_eq!(w(&alone, first), 1.0);
}

#[test]
fn floor_keeps_a_restarted_worker_off_customer_traffic_until_measured() {
    // The case: a worker restarts with new launch arguments (its cached measurement no
    // longer applies) and its own probe is due; meanwhile `neutral` gives it a full share,
    // `floor` the clamp's minimum. Weighted round-robin shows the shares exactly.
    for (extra, expected) in [("", 50), (", unmeasured: floor", 20)] {
        let yaml = format!(
            "preset: seed-v3\nweights: {{ kind: probe{extra} }}\nchooser: {{ kind: wrr }}\n"
        );
        let raw: RawPolicy = routelab_policies::located::parse_yaml(&yaml, "p.yaml").unwrap();
        let mut router = Router::new(PolicyConfig::from_raw(&raw).unwrap());
        let ids = fleet(&mut router, secs(0.0), &["fast", "slow"], &[1000.0, 1000.0]);
        router.disconnect(secs(100.0), ids[1]).unwrap();
        router
            .restart(secs(160.0), ids[1], "--max-model-len 65536")
            .unwrap();
        assert!(!poll(&mut router, secs(160.0)).is_empty(), "a probe is due");
        let m = model(&router);
        let mut to_restarted = 0;
        for i in 0..100 {
            let d = router
                .route(secs(161.0), &req(m, 100, &[]), &mut rng(i))
                .unwrap();
            if d.worker == ids[1] {
                to_restarted += 1;
            }
            router.fail(secs(161.0), d.worker, d.charge);
        }
        // neutral: 1.0 against 1.0; floor: 0.25 against 1.0, a fifth.
        assert_eq!(to_restarted, expected, "{extra}");
    }
}

/// The weights of a `probe` router with slow start, where a second worker registers at 100 s
/// and is measured at once; sampled after ticks at the given times.
fn ramp(slow_start: &str, at: &[f64]) -> Vec<f64> {
    let mut router = Router::new(probe_policy(&format!(", slow_start: {slow_start}")));
    let ids = fleet(&mut router, secs(0.0), &["old"], &[1000.0]);
    router.tick(secs(1.0));
    let new = router.register(secs(100.0), spec("new", &["RTX 4090"]));
    run_probes(&mut router, secs(100.0), |_, _| 1000.0);
    assert_eq!(w(&router, ids[0]), 1.0, "an old worker does not ramp");
    at.iter()
        .map(|t| {
            router.tick(secs(*t));
            w(&router, new)
        })
        .collect()
}

#[test]
fn slow_start_ramps_a_new_worker_from_the_floor_over_the_window() {
    // Linear ramp over 60 s from 0.1: at registration the floor, half-way 0.5, then whole.
    let got = ramp(
        "{ window_s: 60, aggression: 1.0, floor: 0.1 }",
        &[100.0, 103.0, 130.0, 145.0, 160.0, 200.0],
    );
    assert_eq!(got[0], 0.1);
    assert_eq!(got[1], 0.1, "below the floor the floor holds");
    assert_near(got[2], 0.5, 1e-12);
    assert_near(got[3], 0.75, 1e-12);
    assert_eq!(got[4], 1.0);
    assert_eq!(got[5], 1.0);
    // Aggression 2: the square root of the elapsed fraction, faster at first.
    let fast = ramp("{ window_s: 60, aggression: 2, floor: 0.1 }", &[115.0]);
    assert_near(fast[0], 0.5, 1e-12);
    // Omitted fields take Envoy's defaults (aggression 1, floor 0.1) and our 60 s window.
    assert_eq!(
        ramp("{}", &[100.0, 130.0, 160.0]),
        ramp(
            "{ window_s: 60, aggression: 1.0, floor: 0.1 }",
            &[100.0, 130.0, 160.0]
        )
    );
}

#[test]
fn slow_start_restarts_with_the_engine_and_keeps_the_provenance() {
    let mut router = Router::new(probe_policy(", slow_start: { window_s: 10 }"));
    let ids = fleet(&mut router, secs(0.0), &["a", "b"], &[1000.0, 1000.0]);
    router.tick(secs(20.0));
    assert_eq!(w(&router, ids[1]), 1.0, "ramp over");
    router.disconnect(secs(30.0), ids[1]).unwrap();
    router.restart(secs(40.0), ids[1], "").unwrap();
    run_probes(&mut router, secs(40.0), |_, _| 1000.0);
    let weight = router.weight(ids[1]).unwrap();
    assert_eq!(weight.value, 0.1);
    assert_eq!(weight.provenance, Provenance::Measured);
    router.tick(secs(45.0));
    assert_near(w(&router, ids[1]), 0.5, 1e-12);
    // The weighted cap follows the ramp (the router re-reads weights at each tick).
    assert_eq!(router.cap(ids[1]), Some(24), "seed-v3's flat cap");
}

#[test]
fn the_default_shaping_is_the_unwrapped_strategy() {
    assert!(Shaping::default().is_identity());
    assert_eq!(Shaping::default().unmeasured, Unmeasured::Neutral);
    let explicit = probe_policy(", unmeasured: neutral");
    assert_eq!(
        explicit.weights,
        PolicyConfig::preset("seed-v3").unwrap().weights
    );
    let WeightsConfig::Probe(p) = probe_policy(", slow_start: {}").weights else {
        panic!("probe")
    };
    assert_eq!(p.shaping.slow_start, Some(SlowStart::default()));
}

#[test]
fn live_and_at_load_take_the_same_shaping() {
    for kind in ["live", "at-load"] {
        let yaml = format!(
            "weights: {{ kind: {kind}, unmeasured: floor, clamp: [0.5, 4], slow_start: {{ window_s: 30 }} }}"
        );
        let raw: RawPolicy = routelab_policies::located::parse_yaml(&yaml, "p.yaml").unwrap();
        let cfg = PolicyConfig::from_raw(&raw).unwrap();
        let mut router = Router::new(cfg);
        let a = router.register(secs(0.0), spec("a", &["RTX PRO 6000"]));
        router.tick(secs(0.0));
        let weight = router.weight(a).unwrap();
        // live registers from the table (unknown card: a Default 1.0); at-load has nothing.
        assert_eq!(weight.provenance, Provenance::Default, "{kind}");
        // floor 0.5 (the clamp's minimum) times the ramp's floor 0.1.
        assert_near(weight.value, 0.05, 1e-12);
        router.tick(secs(30.0));
        assert_near(w(&router, a), 0.5, 1e-12);
    }
}

#[test]
fn bad_slow_start_and_unmeasured_fields_are_located_errors_with_what_is_valid() {
    let cases = [
        (
            "slow_start: { window_s: 0 }",
            "weights.slow_start.window_s",
            "a number of seconds from",
        ),
        (
            "slow_start: { window_s: -5 }",
            "weights.slow_start.window_s",
            "a number of seconds from",
        ),
        (
            "slow_start: { aggression: 0 }",
            "weights.slow_start.aggression",
            "a finite number > 0",
        ),
        (
            "slow_start: { aggression: -1 }",
            "weights.slow_start.aggression",
            "a finite number > 0",
        ),
        (
            "slow_start: { floor: 0 }",
            "weights.slow_start.floor",
            "a number > 0 and at most 1",
        ),
        (
            "slow_start: { floor: 1.5 }",
            "weights.slow_start.floor",
            "a number > 0 and at most 1",
        ),
        (
            "unmeasured: zero",
            "weights.unmeasured",
            "neutral, floor, median",
        ),
    ];
    for kind in ["probe", "live", "at-load"] {
        for (field, path, valid) in cases {
            let yaml = format!("weights: {{ kind: {kind}, {field} }}\n");
            let e = located_error(&yaml);
            assert_eq!(e.field, format!("policies[0].{path}"), "{yaml}");
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("s.yaml: policies[0].{path}")) && msg.contains(valid),
                "{yaml}: {msg}"
            );
        }
    }
    // NaN: the scenario parser refuses non-finite numbers at their position; validation
    // refuses them too when a host parses otherwise.
    for (field, path, valid) in [
        (
            "aggression: .nan",
            "weights.slow_start.aggression",
            "NaN is not valid; expected a finite number > 0",
        ),
        (
            "floor: .nan",
            "weights.slow_start.floor",
            "NaN is not valid; expected a number > 0 and at most 1",
        ),
        (
            "window_s: .nan",
            "weights.slow_start.window_s",
            "NaN is not valid",
        ),
    ] {
        let yaml = format!("weights: {{ kind: probe, slow_start: {{ {field} }} }}\n");
        let e = routelab_policies::located::parse_yaml::<PolicyEntry>(&yaml, "s.yaml").unwrap_err();
        assert_eq!(e.field, path, "{yaml}");
        assert_eq!(e.line, Some(1), "{yaml}");
        let raw: RawPolicy = serde_saphyr::from_str(&yaml).unwrap();
        let e = PolicyConfig::from_raw(&raw).unwrap_err();
        assert_eq!(e.field(), path, "{yaml}");
        assert!(e.to_string().contains(valid), "{yaml}: {e}");
    }
    // An unknown field inside slow_start is serde's error, with its position.
    let e = routelab_policies::located::parse_yaml::<RawPolicy>(
        "weights: { kind: probe, slow_start: { ramp_s: 3 } }\n",
        "s.yaml",
    )
    .unwrap_err();
    assert!(e.to_string().contains("ramp_s"), "{e}");
    assert_eq!(e.line, Some(1));
    // Not a field of the strategies that measure nothing.
    for kind in ["table", "equal", "oracle"] {
        let e = located_error(&format!("weights: {{ kind: {kind}, unmeasured: floor }}\n"));
        assert_eq!(e.field, "policies[0].weights.unmeasured");
    }
}

#[test]
fn bad_at_load_brakes_are_located_errors() {
    for (field, path, valid) in [
        (
            "half_life_s: 0",
            "weights.half_life_s",
            "a number of seconds from",
        ),
        ("min_busy_s: -1", "weights.min_busy_s", "from 0 to"),
        ("max_step: 1", "weights.max_step", "a finite number > 1"),
        ("max_step: 0.5", "weights.max_step", "a finite number > 1"),
    ] {
        let yaml = format!("weights: {{ kind: at-load, {field} }}\n");
        let e = located_error(&yaml);
        assert_eq!(e.field, format!("policies[0].{path}"), "{yaml}");
        assert!(e.to_string().contains(valid), "{yaml}: {e}");
    }
    match PolicyConfig::from_raw(
        &routelab_policies::located::parse_yaml::<RawPolicy>(
            "weights: { kind: probe, max_step: 2 }",
            "p.yaml",
        )
        .unwrap(),
    ) {
        Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "weights.max_step"),
        other => panic!("{other:?}"),
    }
}

/// Feed an at-load router `n` completions on `id` spread over `[from, to)` seconds, each a
/// 2-second decode at `tok_s` with nothing else in flight on it, ticking after each.
fn traffic(router: &mut Router, id: WorkerId, from: f64, to: f64, n: u32, tok_s: f64) {
    let m = model(router);
    let others: Vec<WorkerId> = router
        .fleet()
        .iter()
        .map(|(o, _)| o)
        .filter(|o| *o != id)
        .collect();
    for i in 0..n {
        let t = from + (to - from) * f64::from(i) / f64::from(n);
        let d = router
            .route_excluding(secs(t), &req(m, 100, &[]), &others, &mut rng(u64::from(i)))
            .unwrap();
        assert_eq!(d.worker, id);
        let done = secs(t + 2.0);
        let c = Completion {
            prompt_tokens: 100,
            output_tokens: (tok_s * 2.0) as u32 + 1,
            dispatched_at: secs(t),
            first_token_at: secs(t),
            completed_at: done,
        };
        router.complete(done, id, d.charge, &c);
        router.tick(done);
    }
}

#[test]
fn at_load_weights_move_by_bounded_smoothed_steps_after_enough_busy_time() {
    let mut router = Router::new(PolicyConfig::from_name("at-load/p2c/no-affinity/none").unwrap());
    let ids: Vec<WorkerId> = ["a", "b", "c"]
        .iter()
        .map(|n| router.register(Time::ZERO, spec(n, &["RTX 4090"])))
        .collect();
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    // All measured at 50 tok/s per request: equal weights.
    let mut t = 0.0;
    while t < 120.0 {
        traffic(&mut router, a, t, t + 10.0, 4, 50.0);
        traffic(&mut router, b, t + 10.0, t + 20.0, 4, 50.0);
        traffic(&mut router, c, t + 20.0, t + 30.0, 4, 50.0);
        t += 30.0;
    }
    assert_eq!(router.weight(a).unwrap().provenance, Provenance::Measured);
    assert_near(w(&router, a), 1.0, 1e-6);
    // a's requests now run 8x faster than its peers' (the median): the target is the clamp's 8.
    // Its weight rises by at most x1.5 per update, only after 20 s of busy time since the last
    // change, and converges.
    let mut last = w(&router, a);
    let mut steps = Vec::new();
    for _ in 0..20 {
        traffic(&mut router, a, t, t + 10.0, 5, 400.0);
        traffic(&mut router, b, t + 10.0, t + 20.0, 4, 50.0);
        traffic(&mut router, c, t + 20.0, t + 30.0, 4, 50.0);
        t += 30.0;
        let now = w(&router, a);
        assert!(now <= last * 1.5 * (1.0 + 1e-9), "{last} -> {now}");
        assert!(now >= last, "{last} -> {now}");
        steps.push(now / last);
        last = now;
    }
    // Every other window adds 20 s of busy time: the weight moves then and holds between.
    assert!(
        steps.iter().skip(1).step_by(2).all(|s| *s == 1.0),
        "{steps:?}"
    );
    assert!(last > 6.0, "converges towards 8: {steps:?} -> {last}");
    // Idle for ten minutes: the samples age out but the measured weight stays.
    router.tick(secs(t + 600.0));
    assert_eq!(w(&router, a), last);
    assert_eq!(router.weight(a).unwrap().provenance, Provenance::Measured);
}
