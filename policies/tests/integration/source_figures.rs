//! The source's calibration figures (DESIGN.md §6): the 16-request split and the probe weights.

use crate::common::*;
use routelab_policies::{ProbePhase, Provenance, Router, Time, WorkerId};

/// Route 16 requests at once (nothing completes); returns (to the pair, to the PRO 6000).
fn sixteen_at_once(router: &mut Router, pair: WorkerId, pro: WorkerId, seed: u64) -> (u32, u32) {
    let m = model(router);
    let mut rng = rng(seed);
    let (mut to_pair, mut to_pro) = (0, 0);
    for _ in 0..16 {
        let d = router
            .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
            .unwrap();
        if d.worker == pair {
            to_pair += 1;
        } else {
            assert_eq!(d.worker, pro);
            to_pro += 1;
        }
    }
    (to_pair, to_pro)
}

#[test]
fn table_weights_send_twelve_of_sixteen_to_the_slower_pair() {
    for seed in 0..200 {
        let (mut router, pair, pro) = source_fleet(policy("seed-v1"));
        assert_eq!(w(&router, pair), 3.5);
        assert_eq!(router.weight(pair).unwrap().provenance, Provenance::Table);
        assert_eq!(w(&router, pro), 1.0);
        // Unknown card: the table's 1.0 is a placeholder, not knowledge.
        assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Default);
        assert_eq!(
            sixteen_at_once(&mut router, pair, pro, seed),
            (12, 4),
            "seed {seed}"
        );
    }
}

#[test]
fn pinned_probe_weights_send_eleven_of_sixteen_to_the_pro_6000() {
    for seed in 0..200 {
        let (mut router, pair, pro) = pinned_source_fleet(policy("seed-v3"));
        assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Pinned);
        assert_eq!(
            sixteen_at_once(&mut router, pair, pro, seed),
            (5, 11),
            "seed {seed}"
        );
    }
}

#[test]
fn oracle_capacities_980_479_send_eleven_of_sixteen_to_the_pro_6000() {
    // `first` ties as in seed-v1: the split must not depend on the tie rule.
    for ties in ["first", "random", "higher-weight"] {
        for seed in 0..200 {
            let (mut router, pair, pro) =
                source_fleet(policy(&format!("oracle/p2c:{ties}/capacity/flat:24")));
            router.set_true_capacity(Time::ZERO, pair, 479.0);
            router.set_true_capacity(Time::ZERO, pro, 980.0);
            assert_near(w(&router, pro), 1.34, 0.01);
            assert_near(w(&router, pair), 0.66, 0.01);
            assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Oracle);
            assert_eq!(
                sixteen_at_once(&mut router, pair, pro, seed),
                (5, 11),
                "ties {ties}, seed {seed}"
            );
        }
    }
}

/// Measure the source fleet with the given warm throughputs; warm-up bursts report 275 tok/s
/// (a cold engine) and must be discarded.
fn probed(preset: &str, pair_tok_s: f64, pro_tok_s: f64) -> (Router, WorkerId, WorkerId) {
    let (mut router, pair, pro) = source_fleet(policy(preset));
    let orders = run_probes(&mut router, secs(1.0), |id, phase| match phase {
        ProbePhase::Warmup => 275.0,
        ProbePhase::Measure if id == pair => pair_tok_s,
        ProbePhase::Measure => pro_tok_s,
        ProbePhase::Prefill => unreachable!("these presets order no prefill-bound burst"),
    });
    let warmups = orders
        .iter()
        .filter(|o| o.phase == ProbePhase::Warmup)
        .count();
    let measures = orders
        .iter()
        .filter(|o| o.phase == ProbePhase::Measure)
        .count();
    assert_eq!(measures, 2, "{orders:?}");
    assert_eq!(
        warmups,
        if preset == "seed-v3-cold" { 0 } else { 2 },
        "{orders:?}"
    );
    for o in &orders {
        assert_eq!((o.concurrency, o.output_tokens), (16, 128));
    }
    (router, pair, pro)
}

#[test]
fn probe_weights_reproduce_the_source() {
    let cases = [
        (992.0, 453.0, 1.37, 0.63), // first measurement
        (275.0, 453.0, 0.76, 1.24), // the cold PRO 6000
        (980.0, 479.0, 1.34, 0.66), // with the warm-up
    ];
    for (pro_tp, pair_tp, pro_w, pair_w) in cases {
        for preset in ["seed-v3", "seed-v3-cold"] {
            let (router, pair, pro) = probed(preset, pair_tp, pro_tp);
            assert_near(w(&router, pro), pro_w, 0.01);
            assert_near(w(&router, pair), pair_w, 0.01);
            for id in [pair, pro] {
                assert_eq!(router.weight(id).unwrap().provenance, Provenance::Measured);
            }
        }
    }
}

#[test]
fn probe_weights_are_clamped_to_a_quarter_and_eight() {
    let mut router = Router::new(policy("seed-v3"));
    let slow = router.register(Time::ZERO, spec("slow", &["GTX 1060"]));
    let mid = router.register(Time::ZERO, spec("mid", &["RTX 4090"]));
    let fast = router.register(Time::ZERO, spec("fast", &["B200"]));
    run_probes(&mut router, secs(1.0), |id, _| {
        if id == slow {
            10.0
        } else if id == mid {
            1_000.0
        } else {
            100_000.0
        }
    });
    assert_eq!(w(&router, slow), 0.25);
    assert_near(w(&router, mid), 1.0, 1e-9);
    assert_eq!(w(&router, fast), 8.0);
}

#[test]
fn joining_and_leaving_renormalise_without_new_probes() {
    let (mut router, pair, pro) = probed("seed-v3", 453.0, 992.0);
    assert_near(w(&router, pro), 1.37, 0.01);
    // A second PRO 6000 joins: only it is probed, and the median moves to 992.
    let pro2 = router.register(secs(10.0), spec("pro6000-b", &["RTX PRO 6000"]));
    assert_eq!(router.weight(pro2).unwrap().provenance, Provenance::Default);
    let orders = run_probes(&mut router, secs(10.0), |_, phase| match phase {
        ProbePhase::Warmup => 275.0,
        ProbePhase::Measure => 992.0,
        ProbePhase::Prefill => unreachable!("these presets order no prefill-bound burst"),
    });
    assert!(!orders.is_empty());
    assert!(orders.iter().all(|o| o.worker == pro2), "{orders:?}");
    assert_near(w(&router, pro), 1.0, 0.001);
    assert_near(w(&router, pro2), 1.0, 0.001);
    assert_near(w(&router, pair), 453.0 / 992.0, 0.001);
    // It leaves: the others go back to 1.37 / 0.63 and nobody is re-probed.
    router.remove(secs(20.0), pro2).unwrap();
    assert!(poll(&mut router, secs(20.0)).is_empty());
    assert_near(w(&router, pro), 1.37, 0.01);
    assert_near(w(&router, pair), 0.63, 0.01);
    // The pair leaves too: the PRO 6000 is its own median.
    router.remove(secs(30.0), pair).unwrap();
    assert!(poll(&mut router, secs(30.0)).is_empty());
    assert_near(w(&router, pro), 1.0, 1e-9);
}
