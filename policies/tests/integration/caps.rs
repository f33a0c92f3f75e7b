//! Concurrency caps and the gateway queue.

use crate::common::*;
use routelab_policies::{Cap, RouteError, Router, Time};

#[test]
fn flat_cap_rejects_the_twenty_fifth_request() {
    let mut router = Router::new(policy("seed-v3"));
    let only = router.register(Time::ZERO, spec("pro6000", &["RTX PRO 6000"]));
    assert_eq!(router.cap(only), Some(24));
    let m = model(&router);
    let mut rng = rng(2);
    for _ in 0..24 {
        assert_eq!(
            router
                .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
                .unwrap()
                .worker,
            only
        );
    }
    let err = router
        .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
        .unwrap_err();
    assert_eq!(err, RouteError::AllAtCap { model: m });
    assert_eq!(err.http_status(), 429);
    assert_eq!(
        err.with_model(MODEL).to_string(),
        format!("every eligible worker for model `{MODEL}` is at its concurrency cap")
    );
    assert_eq!(router.fleet().get(only).unwrap().in_flight, 24);
}

#[test]
fn queued_requests_are_released_in_fifo_order() {
    let mut router = Router::new(policy("seed-v3"));
    let only = router.register(Time::ZERO, spec("pro6000", &["RTX PRO 6000"]));
    let m = model(&router);
    let mut rng = rng(2);
    for _ in 0..24 {
        router
            .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
            .unwrap();
    }
    let conv = blocks(7, 8);
    for ticket in 100..104u64 {
        let prefix: &[u64] = if ticket == 101 { &conv } else { &[] };
        let r = req(m, 500, prefix);
        assert!(matches!(
            router.route(Time::ZERO, &r, &mut rng),
            Err(RouteError::AllAtCap { .. })
        ));
        router.enqueue(ticket, &r);
    }
    assert_eq!(router.queued(), 4);
    assert!(
        router.dispatch_queued(Time::ZERO, &mut rng).is_none(),
        "still full"
    );
    assert!(router.cancel(102));
    assert!(!router.cancel(102));

    let mut released = Vec::new();
    for i in 0..3 {
        let now = secs(f64::from(i + 1));
        router.complete(now, only, routelab_policies::Charge::NONE, &completion(now));
        let (ticket, outcome) = router
            .dispatch_queued(now, &mut rng)
            .expect("a slot is free");
        assert_eq!(outcome.unwrap().worker, only);
        released.push(ticket);
        assert!(
            router.dispatch_queued(now, &mut rng).is_none(),
            "one slot, one request"
        );
        assert_eq!(router.fleet().get(only).unwrap().in_flight, 24);
    }
    assert_eq!(released, vec![100, 101, 103]);
    assert_eq!(router.queued(), 0);
    // The queued request's prefix was recorded when it was dispatched.
    assert_eq!(router.prefix_index().longest(&conv), Some((only, 8)));
}

#[test]
fn weighted_cap_scales_with_weight() {
    let (mut router, pair, pro) = pinned_source_fleet(policy("seed-next"));
    assert_eq!(router.config().cap, Cap::Weighted(24));
    assert_eq!(router.cap(pro), Some(32)); // 24 × 1.34 = 32.16
    assert_eq!(router.cap(pair), Some(16)); // 24 × 0.66 = 15.84
    let m = model(&router);
    let mut rng = rng(4);
    for _ in 0..48 {
        router
            .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
            .unwrap();
    }
    assert_eq!(router.fleet().get(pro).unwrap().in_flight, 32);
    assert_eq!(router.fleet().get(pair).unwrap().in_flight, 16);
    assert!(matches!(
        router.route(Time::ZERO, &req(m, 500, &[]), &mut rng),
        Err(RouteError::AllAtCap { .. })
    ));
    // Unpinning to "not yet measured" (1.0) brings the cap back to 24: the PRO 6000 is over it
    // and takes nothing until it drains below.
    router.unpin(secs(1.0), pro).unwrap();
    assert_eq!(router.cap(pro), Some(24));
    for i in 0..8 {
        let now = secs(2.0 + f64::from(i));
        router.complete(now, pro, routelab_policies::Charge::NONE, &completion(now));
        assert!(
            router.route(now, &req(m, 500, &[]), &mut rng).is_err(),
            "{i}"
        );
    }
    router.complete(
        secs(20.0),
        pro,
        routelab_policies::Charge::NONE,
        &completion(secs(20.0)),
    );
    assert_eq!(
        router
            .route(secs(20.0), &req(m, 500, &[]), &mut rng)
            .unwrap()
            .worker,
        pro
    );
}

#[test]
fn flat_cap_applies_to_every_weight_strategy_from_registration() {
    // Regression: with `equal` weights (whose strategy reports no change on registration) the
    // cap was never applied and stayed unlimited.
    for weights in ["equal", "table", "live", "probe", "oracle", "at-load"] {
        let mut router = Router::new(policy(&format!("{weights}/p2c/capacity/flat:2")));
        let only = router.register(Time::ZERO, spec("w", &["RTX 4090"]));
        assert_eq!(router.cap(only), Some(2), "{weights}");
        let m = model(&router);
        let mut rng = rng(1);
        for _ in 0..2 {
            router
                .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
                .unwrap();
        }
        assert!(
            matches!(
                router.route(Time::ZERO, &req(m, 500, &[]), &mut rng),
                Err(RouteError::AllAtCap { .. })
            ),
            "{weights}"
        );
    }
}
