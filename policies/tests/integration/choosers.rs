//! Choosers: ties on a quiet network, SED vs P2C, eligibility of every chooser, WRR ratios.

use crate::common::*;
use routelab_policies::{Chooser, Router, TieRule, Time, WorkerId, WorkerState};

/// Route `n` requests one at a time, completing each before the next; returns (pair, pro).
fn quiet_network(router: &mut Router, pair: WorkerId, pro: WorkerId, n: u32) -> (u32, u32) {
    let m = model(router);
    let mut rng = rng(11);
    let (mut to_pair, mut to_pro) = (0, 0);
    for i in 0..n {
        let now = secs(f64::from(i));
        let d = router.route(now, &req(m, 500, &[]), &mut rng).unwrap();
        assert!(!d.affinity_kept);
        if d.worker == pair {
            to_pair += 1;
        } else {
            assert_eq!(d.worker, pro);
            to_pro += 1;
        }
        router.complete(now, d.worker, d.charge, &completion(now));
        assert_eq!(router.fleet().get(d.worker).unwrap().in_flight, 0);
    }
    (to_pair, to_pro)
}

#[test]
fn quiet_network_ties_go_to_the_higher_weight() {
    let (mut router, pair, pro) = pinned_source_fleet(policy("seed-v3"));
    assert_eq!(quiet_network(&mut router, pair, pro, 1_000), (0, 1_000));
}

#[test]
fn quiet_network_ties_first_or_random_split_the_traffic() {
    for ties in [TieRule::First, TieRule::Random] {
        for chooser in [
            Chooser::P2c { ties },
            Chooser::Jsq {
                ties: TieRule::Random,
            },
        ] {
            if matches!(chooser, Chooser::Jsq { .. }) && ties == TieRule::First {
                continue; // jsq:first is a deterministic scan: always the first candidate
            }
            let (mut router, pair, pro) =
                pinned_source_fleet(with_chooser(policy("seed-v3"), chooser));
            let (to_pair, to_pro) = quiet_network(&mut router, pair, pro, 1_000);
            assert!(
                to_pair >= 300 && to_pro >= 300,
                "{chooser:?}: {to_pair} / {to_pro}"
            );
        }
    }
}

#[test]
fn sed_counts_the_request_being_placed() {
    for (chooser, want_fast) in [
        (
            Chooser::P2c {
                ties: TieRule::HigherWeight,
            },
            false,
        ),
        (
            Chooser::Sed {
                ties: TieRule::HigherWeight,
            },
            true,
        ),
    ] {
        for seed in 0..50 {
            let mut router = Router::new(with_chooser(policy("seed-v3"), chooser));
            let slow = router.register(Time::ZERO, spec("slow", &["RTX 4090"]));
            let fast = router.register(Time::ZERO, spec("fast", &["H100", "H100"]));
            router.pin(Time::ZERO, slow, 1.0).unwrap();
            router.pin(Time::ZERO, fast, 4.0).unwrap();
            let m = model(&router);
            let mut rng = rng(seed);
            // Idle fleet: both choosers send the first request to the weight-4 worker.
            let first = router
                .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
                .unwrap();
            assert_eq!(first.worker, fast, "{chooser:?}");
            // Idle weight-1 worker vs weight-4 worker holding one request:
            // p2c compares 0/1 = 0 < 1/4; sed compares (0+1)/1 = 1 > (1+1)/4 = 0.5.
            let d = router
                .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
                .unwrap();
            let want = if want_fast { fast } else { slow };
            assert_eq!(d.worker, want, "{chooser:?} seed {seed}");
        }
    }
}

/// Every chooser, with its tie rules.
pub fn all_choosers() -> Vec<Chooser> {
    let mut v = vec![Chooser::Wrr, Chooser::Random, Chooser::RoundRobin];
    for ties in [TieRule::First, TieRule::Random, TieRule::HigherWeight] {
        v.push(Chooser::P2c { ties });
        v.push(Chooser::Sed { ties });
        v.push(Chooser::Jsq { ties });
        v.push(Chooser::LeastRequest { bias: 1.0, ties });
        v.push(Chooser::LeastRequest { bias: 0.5, ties });
    }
    v
}

#[test]
fn every_chooser_routes_only_to_eligible_workers() {
    for chooser in all_choosers() {
        let mut config = with_chooser(policy("seed-v3"), chooser);
        config.cap = routelab_policies::Cap::Flat(4);
        let mut router = Router::new(config);
        let t = Time::ZERO;
        let g = &["RTX 4090"];
        let ok_a = router.register(t, spec_full("a", "n1", MODEL, g, 32_768, ""));
        let ok_b = router.register(t, spec_full("b", "n2", MODEL, g, 32_768, ""));
        let ok_c = router.register(t, spec_full("c", "n3", MODEL, g, 131_072, ""));
        let small = router.register(t, spec_full("small", "n4", MODEL, g, 8_192, ""));
        let gone = router.register(t, spec_full("gone", "n5", MODEL, g, 131_072, ""));
        let draining = router.register(t, spec_full("drain", "n6", MODEL, g, 131_072, ""));
        let removed = router.register(t, spec_full("removed", "n7", MODEL, g, 131_072, ""));
        let other = router.register(t, spec_full("other", "n8", "llama-8b", g, 131_072, ""));
        router.disconnect(t, gone).unwrap();
        router.drain(t, draining).unwrap();
        router.remove(t, removed).unwrap();
        for (i, id) in [ok_a, ok_b, ok_c, small, other].into_iter().enumerate() {
            router.pin(t, id, [1.0, 2.0, 0.5, 8.0, 8.0][i]).unwrap();
        }
        let m = model(&router);
        let mut rng = rng(21);
        let eligible = [ok_a, ok_b, ok_c];
        // 3 eligible workers × cap 4 = 12 requests of 16k tokens fit, the 13th does not
        // (the small-window worker has room but cannot hold the prompt).
        for i in 0..12 {
            let d = router
                .route(t, &req(m, 16_000, &[]), &mut rng)
                .unwrap_or_else(|e| panic!("{chooser:?} request {i}: {e}"));
            assert!(
                eligible.contains(&d.worker),
                "{chooser:?} picked {}",
                d.worker
            );
        }
        for id in eligible {
            assert_eq!(router.fleet().get(id).unwrap().in_flight, 4, "{chooser:?}");
        }
        assert!(
            matches!(
                router.route(t, &req(m, 16_000, &[]), &mut rng),
                Err(routelab_policies::RouteError::AllAtCap { .. })
            ),
            "{chooser:?}"
        );
        // A short prompt still fits the small worker, and only it.
        let d = router.route(t, &req(m, 4_000, &[]), &mut rng).unwrap();
        assert_eq!(d.worker, small, "{chooser:?}");
        for id in [gone, draining, removed, other] {
            assert_eq!(router.fleet().get(id).unwrap().in_flight, 0, "{chooser:?}");
        }
        assert_eq!(
            router.fleet().get(gone).unwrap().state,
            WorkerState::Disconnected
        );
    }
}

#[test]
fn wrr_three_to_one_is_exact() {
    let mut router = Router::new(with_chooser(policy("seed-v3"), Chooser::Wrr));
    let big = router.register(Time::ZERO, spec("big", &["H100"]));
    let small = router.register(Time::ZERO, spec("small", &["RTX 4090"]));
    router.pin(Time::ZERO, big, 3.0).unwrap();
    router.pin(Time::ZERO, small, 1.0).unwrap();
    let m = model(&router);
    let mut rng = rng(1);
    let mut to_big = 0;
    for i in 0..400 {
        let now = secs(f64::from(i));
        let d = router.route(now, &req(m, 500, &[]), &mut rng).unwrap();
        if d.worker == big {
            to_big += 1;
        }
        router.complete(now, d.worker, d.charge, &completion(now));
        // Smooth WRR: every window of 4 picks is exactly 3:1.
        if i % 4 == 3 {
            assert_eq!(to_big, (i + 1) / 4 * 3);
        }
    }
    assert_eq!(to_big, 300);
}
