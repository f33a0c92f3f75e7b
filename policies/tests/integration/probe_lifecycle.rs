//! The probe strategy's lifecycle: cache, restarts, pins, re-probes, warm-up, provenance.

use crate::common::*;
use routelab_policies::{ProbeOrder, ProbePhase, Provenance, Router, Time, WorkerId};

const HOUR: f64 = 3600.0;

/// The source fleet under `preset`, measured at t = 1 s: PRO 6000 980, pair 479 tok/s.
fn measured(preset: &str) -> (Router, WorkerId, WorkerId) {
    let (mut router, pair, pro) = source_fleet(policy(preset));
    run_probes(&mut router, secs(1.0), |id, phase| match phase {
        ProbePhase::Warmup => 275.0,
        ProbePhase::Measure if id == pro => 980.0,
        ProbePhase::Measure => 479.0,
        ProbePhase::Prefill => unreachable!("these presets order no prefill-bound burst"),
    });
    assert!(poll(&mut router, secs(1.0)).is_empty());
    (router, pair, pro)
}

fn for_worker(orders: &[ProbeOrder], id: WorkerId) -> Vec<ProbeOrder> {
    orders.iter().filter(|o| o.worker == id).copied().collect()
}

#[test]
fn a_reconnect_costs_no_probe() {
    let (mut router, pair, pro) = measured("seed-v3");
    let before = router.weight(pro).unwrap();
    router.disconnect(secs(100.0), pro).unwrap();
    router.reconnect(secs(130.0), pro).unwrap();
    assert!(poll(&mut router, secs(130.0)).is_empty());
    assert_eq!(router.weight(pro).unwrap(), before);
    assert_near(before.value, 1.34, 0.01);
    assert_near(w(&router, pair), 0.66, 0.01);
}

#[test]
fn restart_with_other_arguments_is_a_new_machine() {
    let (mut router, _pair, pro) = measured("seed-v3");
    router
        .restart(secs(100.0), pro, "--max-model-len 65536")
        .unwrap();
    assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Default);
    let orders = poll(&mut router, secs(100.0));
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(
        (orders[0].worker, orders[0].phase),
        (pro, ProbePhase::Warmup)
    );
}

#[test]
fn restart_with_the_same_arguments_within_the_ttl_reuses_the_cache() {
    let (mut router, _pair, pro) = measured("seed-v3");
    let before = router.weight(pro).unwrap();
    router.restart(secs(2.0 * HOUR), pro, "").unwrap();
    assert!(poll(&mut router, secs(2.0 * HOUR)).is_empty());
    assert_eq!(router.weight(pro).unwrap(), before);
    // Beyond the 6 h TTL the cache no longer answers.
    router.restart(secs(6.0 * HOUR + 10.0), pro, "").unwrap();
    assert_eq!(
        for_worker(&poll(&mut router, secs(6.0 * HOUR + 10.0)), pro).len(),
        1
    );
}

#[test]
fn a_pin_survives_restarts_until_unpinned() {
    let (mut router, pair, pro) = measured("seed-v3");
    router.pin(secs(10.0), pro, 2.5).unwrap();
    let pinned = router.weight(pro).unwrap();
    assert_eq!((pinned.value, pinned.provenance), (2.5, Provenance::Pinned));
    assert_eq!(
        router.weight(pair).unwrap().provenance,
        Provenance::Measured
    );

    router.restart(secs(20.0), pro, "--other").unwrap();
    assert_eq!(router.weight(pro).unwrap(), pinned);
    router.node_manager_restart(secs(30.0), "pro6000", false);
    assert_eq!(router.weight(pro).unwrap(), pinned);
    router.disconnect(secs(40.0), pro).unwrap();
    router.reconnect(secs(50.0), pro).unwrap();
    assert_eq!(router.weight(pro).unwrap(), pinned);

    // The restart with other arguments asked for a measurement; it lands under the pin.
    run_probes(&mut router, secs(60.0), |_, _| 1_000.0);
    assert_eq!(router.weight(pro).unwrap(), pinned);
    router.unpin(secs(70.0), pro).unwrap();
    let after = router.weight(pro).unwrap();
    assert_eq!(after.provenance, Provenance::Measured);
    assert_near(after.value, 1_000.0 / ((1_000.0 + 479.0) / 2.0), 0.001);
}

#[test]
fn unpinning_a_never_measured_worker_falls_back_to_default() {
    let (mut router, _pair, pro) = source_fleet(policy("seed-v3"));
    router.pin(Time::ZERO, pro, 0.5).unwrap();
    assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Pinned);
    router.unpin(Time::ZERO, pro).unwrap();
    assert_eq!(
        router.weight(pro).unwrap(),
        routelab_policies::Weight::UNMEASURED
    );
}

#[test]
fn not_yet_measured_is_distinct_from_measured_low() {
    let mut router = Router::new(policy("seed-v3"));
    let slow = router.register(Time::ZERO, spec("slow", &["GTX 1060"]));
    let fast = router.register(Time::ZERO, spec("fast", &["RTX PRO 6000"]));
    for id in [slow, fast] {
        let wt = router.weight(id).unwrap();
        assert!(wt.is_unmeasured());
        assert_eq!(wt.provenance, Provenance::Default);
    }
    run_probes(&mut router, secs(1.0), |id, _| {
        if id == slow { 10.0 } else { 1_000.0 }
    });
    let low = router.weight(slow).unwrap();
    assert!(!low.is_unmeasured());
    assert_eq!((low.value, low.provenance), (0.25, Provenance::Measured));
    // A newcomer is "not yet measured", not "measured at 1.0".
    let newcomer = router.register(secs(2.0), spec("new", &["RTX 4090"]));
    assert!(router.weight(newcomer).unwrap().is_unmeasured());
}

#[test]
fn no_periodic_reprobe_while_a_request_is_in_flight() {
    let (mut router, pair, pro) = measured("seed-v3");
    let m = model(&router);
    let mut rng = rng(7);
    // seed-v3 sends an idle-fleet request to the higher weight: the PRO 6000.
    let d = router
        .route(secs(10.0), &req(m, 500, &[]), &mut rng)
        .unwrap();
    assert_eq!(d.worker, pro);
    let late = secs(6.0 * HOUR + 60.0);
    let orders = poll(&mut router, late);
    assert!(for_worker(&orders, pro).is_empty(), "{orders:?}");
    // The idle pair is re-measured on schedule: time did pass.
    assert_eq!(for_worker(&orders, pair).len(), 1, "{orders:?}");
    router.tick(late);
    assert!(for_worker(&poll(&mut router, late), pro).is_empty());

    router.complete(
        late,
        pro,
        routelab_policies::Charge::NONE,
        &completion(late),
    );
    let orders = poll(&mut router, late);
    assert_eq!(for_worker(&orders, pro).len(), 1, "{orders:?}");
    assert_eq!(for_worker(&orders, pro)[0].phase, ProbePhase::Warmup);
}

#[test]
fn on_demand_reprobe_runs_even_when_busy() {
    let (mut router, _pair, pro) = measured("seed-v3");
    let m = model(&router);
    let mut rng = rng(3);
    for _ in 0..4 {
        router
            .route(secs(10.0), &req(m, 500, &[]), &mut rng)
            .unwrap();
    }
    assert!(router.fleet().get(pro).unwrap().in_flight > 0);
    assert!(poll(&mut router, secs(11.0)).is_empty());
    router.reprobe(secs(11.0), pro).unwrap();
    let orders = poll(&mut router, secs(11.0));
    assert_eq!(for_worker(&orders, pro).len(), 1, "{orders:?}");
    // The old measurement stays in force until the new one lands.
    assert_near(w(&router, pro), 1.34, 0.01);
}

#[test]
fn node_manager_restart_keeps_a_bad_cached_value_unless_the_cache_is_dropped() {
    // seed-v3-cold measures the freshly started engine: 275 tok/s.
    let (mut router, pair, pro) = source_fleet(policy("seed-v3-cold"));
    run_probes(&mut router, secs(5.0), |id, phase| {
        assert_eq!(phase, ProbePhase::Measure);
        if id == pro { 275.0 } else { 453.0 }
    });
    assert_near(w(&router, pro), 0.76, 0.01);
    assert_near(w(&router, pair), 1.24, 0.01);

    router.node_manager_restart(secs(600.0), "pro6000", true);
    assert!(
        poll(&mut router, secs(600.0)).is_empty(),
        "the cache answers"
    );
    assert_near(w(&router, pro), 0.76, 0.01);

    router.node_manager_restart(secs(700.0), "pro6000", false);
    let orders = run_probes(&mut router, secs(700.0), |_, _| 980.0);
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(orders[0].worker, pro);
    assert!(w(&router, pro) > w(&router, pair));
    assert_near(w(&router, pro), 980.0 / ((980.0 + 453.0) / 2.0), 0.001);
}

#[test]
fn the_warmup_burst_is_discarded() {
    let (mut router, _pair, pro) = source_fleet(policy("seed-v3"));
    let first = for_worker(&poll(&mut router, secs(1.0)), pro);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].phase, ProbePhase::Warmup);
    router.probe_result(secs(3.0), &burst(&first[0], 275.0));
    assert_eq!(
        router.weight(pro).unwrap(),
        routelab_policies::Weight::UNMEASURED
    );
    let second = for_worker(&poll(&mut router, secs(3.0)), pro);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].phase, ProbePhase::Measure);
    assert_ne!(second[0].id, first[0].id);
    // A late duplicate of the warm-up answer is ignored.
    router.probe_result(secs(4.0), &burst(&first[0], 5.0));
    router.probe_result(secs(5.0), &burst(&second[0], 980.0));
    assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Measured);
    assert!(poll(&mut router, secs(5.0)).iter().all(|o| o.worker != pro));
}

#[test]
fn a_failed_burst_is_retried_later_and_learns_nothing() {
    let (mut router, _pair, pro) = source_fleet(policy("seed-v3-cold"));
    let order = for_worker(&poll(&mut router, secs(1.0)), pro)[0];
    let mut failed = burst(&order, 980.0);
    failed.ok = false;
    router.probe_result(secs(2.0), &failed);
    assert!(router.weight(pro).unwrap().is_unmeasured());
    assert!(for_worker(&poll(&mut router, secs(3.0)), pro).is_empty());
    assert_eq!(for_worker(&poll(&mut router, secs(62.0)), pro).len(), 1);
}

/// `predictive`'s probe adds a prefill-bound burst after each measurement (one output token,
/// prompts fitted to the worker's context window); its prompt tokens over its wall time are
/// the prefill speed the chooser predicts with before traffic has measured the worker, and it
/// survives a gateway restart through the probe cache. The weight never depends on it, and a
/// failed prefill burst is retried alone.
#[test]
fn predictive_measures_prefill_speed_with_a_prefill_bound_burst() {
    let mut router = Router::new(policy("predictive"));
    let pair = router.register(Time::ZERO, spec("pair", &["RTX 4090", "RTX 4090"]));
    let small = router.register(
        Time::ZERO,
        spec_full("small", "small", MODEL, &["RTX 4090"], 1000, ""),
    );
    let t = secs(1.0);
    let mut prefill_orders = Vec::new();
    let mut failed_once = false;
    for _ in 0..8 {
        let orders = poll(&mut router, t);
        if orders.is_empty() {
            break;
        }
        for o in &orders {
            let result = match o.phase {
                ProbePhase::Prefill => {
                    prefill_orders.push(*o);
                    let prompt = u64::from(o.concurrency) * u64::from(o.prompt_tokens);
                    // The pair prefills 8,000 tok/s, the small worker 2,000; the small one's
                    // first prefill burst fails.
                    let speed = if o.worker == pair { 8000.0 } else { 2000.0 };
                    let ok = o.worker == pair || failed_once;
                    failed_once |= o.worker == small;
                    routelab_policies::ProbeResult {
                        order: o.id,
                        worker: o.worker,
                        output_tokens: u64::from(o.concurrency),
                        prompt_tokens: prompt,
                        wall: std::time::Duration::from_secs_f64(prompt as f64 / speed),
                        ok,
                    }
                }
                _ => burst(o, 500.0),
            };
            router.probe_result(t, &result);
        }
    }
    let weight_before = w(&router, small);
    let est = |r: &Router, id: WorkerId| r.capacity().estimate(id.index(), w(r, id)).prefill_tok_s;
    assert_near(est(&router, pair), 8000.0, 1e-6);
    // Failed once: not measured yet, and not asked again before `retry_after` (60 s).
    assert_ne!(est(&router, small), 2000.0);
    assert!(poll(&mut router, secs(30.0)).is_empty());
    let retry = poll(&mut router, secs(61.5));
    assert_eq!(retry.len(), 1, "{retry:?}");
    assert_eq!(
        (retry[0].worker, retry[0].phase),
        (small, ProbePhase::Prefill)
    );
    let prompt = u64::from(retry[0].concurrency) * u64::from(retry[0].prompt_tokens);
    router.probe_result(
        secs(61.5),
        &routelab_policies::ProbeResult {
            order: retry[0].id,
            worker: small,
            output_tokens: u64::from(retry[0].concurrency),
            prompt_tokens: prompt,
            wall: std::time::Duration::from_secs_f64(prompt as f64 / 2000.0),
            ok: true,
        },
    );
    assert_near(est(&router, small), 2000.0, 1e-6);
    assert_eq!(
        w(&router, small),
        weight_before,
        "the weight does not move with prefill"
    );
    // The prefill-bound orders: 4 prompts of 2,048 tokens and one output token each; the
    // small worker's window of 1,000 tokens fits 999.
    let pair_order = prefill_orders.iter().find(|o| o.worker == pair).unwrap();
    assert_eq!(
        (
            pair_order.concurrency,
            pair_order.output_tokens,
            pair_order.prompt_tokens
        ),
        (4, 1, 2048)
    );
    assert_eq!(retry[0].prompt_tokens, 999);
    // A restarted gateway adopts the cached prefill speed with the throughput: no burst.
    let state = router.strategy().export_state().unwrap();
    assert!(
        state.cache.iter().all(|e| e.prefill_tok_s.is_some()),
        "{state:?}"
    );
    let mut again = Router::new(policy("predictive"));
    again.import_state(state.clone());
    let pair2 = again.register(secs(70.0), spec("pair", &["RTX 4090", "RTX 4090"]));
    assert!(poll(&mut again, secs(70.0)).is_empty());
    assert_near(est(&again, pair2), 8000.0, 1e-6);
    // A corrupt cached prefill speed is dropped alone: the throughput is adopted and only the
    // prefill-bound burst goes out.
    let mut corrupt = state;
    for e in &mut corrupt.cache {
        e.prefill_tok_s = Some(f64::NAN);
    }
    let mut third = Router::new(policy("predictive"));
    third.import_state(corrupt);
    let pair3 = third.register(secs(70.0), spec("pair", &["RTX 4090", "RTX 4090"]));
    let orders = poll(&mut third, secs(70.0));
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(orders[0].phase, ProbePhase::Prefill);
    assert_eq!(
        third.weight(pair3).unwrap().provenance,
        Provenance::Measured
    );
}
