//! Typed routing and admin errors, and the HTTP statuses a gateway maps them to.

use crate::common::*;
use routelab_policies::{AdminError, ModelId, RouteError, Router, Time, WorkerId};

fn two_windows() -> (Router, WorkerId, WorkerId) {
    let mut router = Router::new(policy("seed-v3"));
    let small = router.register(
        Time::ZERO,
        spec_full("small", "n1", MODEL, &["RTX 4090"], 8_192, ""),
    );
    let big = router.register(
        Time::ZERO,
        spec_full("big", "n2", MODEL, &["H100"], 32_768, ""),
    );
    (router, small, big)
}

#[test]
fn unknown_model_is_no_worker_for_model() {
    let (mut router, _, _) = two_windows();
    assert_eq!(router.model_id("llama-405b"), None);
    let err = router
        .route(Time::ZERO, &req(ModelId(99), 500, &[]), &mut rng(1))
        .unwrap_err();
    assert_eq!(err, RouteError::NoWorkerForModel);
    assert_eq!(err.http_status(), 404);
}

#[test]
fn prompt_beyond_every_window_names_the_largest() {
    let (mut router, _, _) = two_windows();
    let m = model(&router);
    let err = router
        .route(Time::ZERO, &req(m, 40_000, &[]), &mut rng(1))
        .unwrap_err();
    assert_eq!(
        err,
        RouteError::PromptTooLong {
            tokens: 40_000,
            largest_window: 32_768
        }
    );
    assert_eq!(err.http_status(), 400);
    let msg = err.to_string();
    assert!(msg.contains("40000") && msg.contains("32768"), "{msg}");
    // Exactly the window fits.
    assert!(
        router
            .route(Time::ZERO, &req(m, 32_768, &[]), &mut rng(1))
            .is_ok()
    );
}

#[test]
fn all_disconnected_is_no_healthy_worker() {
    let (mut router, small, big) = two_windows();
    router.disconnect(Time::ZERO, small).unwrap();
    router.disconnect(Time::ZERO, big).unwrap();
    let m = model(&router);
    let err = router
        .route(Time::ZERO, &req(m, 500, &[]), &mut rng(1))
        .unwrap_err();
    assert_eq!(err, RouteError::NoHealthyWorker { model: m });
    assert_eq!(err.http_status(), 503);
    // The error carries the interned id; the host renders the name it knows.
    assert_eq!(router.model_name(m), Some(MODEL));
    assert_eq!(
        err.with_model(MODEL).to_string(),
        format!("no healthy worker for model `{MODEL}`")
    );
    assert_eq!(
        err.to_string(),
        format!("no healthy worker for model m{}", m.0)
    );
    // Draining and removed workers do not count as healthy either.
    router.reconnect(Time::ZERO, small).unwrap();
    router.drain(Time::ZERO, small).unwrap();
    router.remove(Time::ZERO, big).unwrap();
    assert!(matches!(
        router.route(Time::ZERO, &req(m, 500, &[]), &mut rng(1)),
        Err(RouteError::NoHealthyWorker { .. })
    ));
    assert_eq!(router.models(), Vec::<&str>::new());
}

#[test]
fn all_at_cap_is_429() {
    let err = RouteError::AllAtCap { model: ModelId(0) };
    assert_eq!(err.http_status(), 429);
    // Copy data only: refusing a request never allocates (see tests/alloc.rs).
    let copy = err;
    assert_eq!(copy, err);
}

#[test]
fn admin_errors_are_typed() {
    let (mut router, small, big) = two_windows();
    for bad in [f64::NAN, -1.0, 0.0, f64::INFINITY, f64::NEG_INFINITY] {
        match router.pin(Time::ZERO, small, bad) {
            Err(AdminError::InvalidWeight(v)) => assert!(v.is_nan() || v == bad),
            other => panic!("pin {bad}: {other:?}"),
        }
    }
    let ghost = WorkerId(1_000);
    assert_eq!(
        router.pin(Time::ZERO, ghost, 1.0),
        Err(AdminError::UnknownWorker(ghost))
    );
    assert_eq!(
        router.reprobe(Time::ZERO, ghost),
        Err(AdminError::UnknownWorker(ghost))
    );
    router.remove(Time::ZERO, big).unwrap();
    assert_eq!(
        router.remove(Time::ZERO, big),
        Err(AdminError::UnknownWorker(big))
    );
    assert_eq!(
        router.reconnect(Time::ZERO, big),
        Err(AdminError::UnknownWorker(big))
    );
    assert_eq!(
        router.restart(Time::ZERO, big, ""),
        Err(AdminError::UnknownWorker(big))
    );
    // Host calls about unknown ids on the request path are ignored, not panics.
    router.complete(
        Time::ZERO,
        ghost,
        routelab_policies::Charge::NONE,
        &completion(secs(3.0)),
    );
    router.fail(Time::ZERO, ghost, routelab_policies::Charge::NONE);
    router.first_token(Time::ZERO, ghost, &mut routelab_policies::Charge::default());
    router.set_true_capacity(Time::ZERO, ghost, 1.0);
}
