//! Regression tests for bugs fixed in `policies/src` while writing this suite.

use crate::common::*;
use routelab_policies::weights::{
    AtLoadConfig, PersistedProbeState, ProbeCacheEntry, ProbeConfig, ProbeWeights, TableConfig,
};
use routelab_policies::{
    Cap, Chooser, PolicyConfig, ProbePhase, Provenance, RouteError, Router, TieRule, Time,
    WeightEvent, WeightStrategy, WeightsConfig,
};
use std::time::Duration;

/// `equal` weights report no change on registration, so the router never applied the cap:
/// every worker stayed uncapped under `equal/…/flat:N`.
#[test]
fn equal_weights_still_get_their_cap() {
    let mut router = Router::new(policy("equal/p2c/capacity/flat:3"));
    let a = router.register(Time::ZERO, spec("a", &["RTX 4090"]));
    let b = router.register(Time::ZERO, spec("b", &["RTX 4090"]));
    assert_eq!((router.cap(a), router.cap(b)), (Some(3), Some(3)));
    let m = model(&router);
    let mut rng = rng(1);
    for _ in 0..6 {
        router
            .route(Time::ZERO, &req(m, 500, &[]), &mut rng)
            .unwrap();
    }
    assert!(matches!(
        router.route(Time::ZERO, &req(m, 500, &[]), &mut rng),
        Err(RouteError::AllAtCap { .. })
    ));
}

/// `at-load` with a table prior: an unmeasured worker's weight is its prior relative to its
/// peers' priors, so a newcomer changes everyone's weight; the strategy reported only the
/// newcomer, leaving the router routing (and capping) with stale weights.
#[test]
fn at_load_prior_weights_follow_newcomers() {
    let config = PolicyConfig {
        name: "at-load-prior".into(),
        weights: WeightsConfig::AtLoad(AtLoadConfig {
            prior: Some(TableConfig::default()),
            ..AtLoadConfig::default()
        }),
        chooser: Chooser::P2c {
            ties: TieRule::HigherWeight,
        },
        affinity: routelab_policies::Affinity::None,
        cap: Cap::Weighted(24),
        knowledge: routelab_policies::PrefixKnowledge::DEFAULT,
    };
    let mut router = Router::new(config);
    let pair = router.register(Time::ZERO, spec("pair", &["RTX 4090", "RTX 4090"]));
    assert_eq!(w(&router, pair), 1.0);
    assert_eq!(router.cap(pair), Some(24));
    let h100 = router.register(Time::ZERO, spec("h100", &["H100", "H100"]));
    // Priors 3.5 and 7.0, median 5.25.
    assert_near(w(&router, pair), 3.5 / 5.25, 1e-9);
    assert_near(w(&router, h100), 7.0 / 5.25, 1e-9);
    assert_eq!(
        router.cap(pair),
        Some(16),
        "the router must use the weight it reports"
    );
    assert_eq!(router.cap(h100), Some(32));
    // Restarting a worker that had disconnected brings it back among the peers.
    router.disconnect(secs(1.0), h100).unwrap();
    assert_eq!(router.cap(pair), Some(24));
    router.restart(secs(2.0), h100, "").unwrap();
    assert_eq!(router.cap(pair), Some(16));
}

/// A probe result with zero wall time or zero tokens has no throughput (reported as 0): it was
/// cached as "measured at 0 tok/s" — the clamp's minimum for 6 h, marked Measured.
#[test]
fn an_empty_or_instant_probe_result_is_not_a_measurement() {
    for (tokens, wall) in [(2048u64, Duration::ZERO), (0, Duration::from_secs(2))] {
        let (mut router, pair, pro) = source_fleet(policy("seed-v3-cold"));
        run_probes(&mut router, secs(1.0), |id, _| {
            if id == pair { 453.0 } else { 980.0 }
        });
        router.reprobe(secs(10.0), pro).unwrap();
        let order = poll(&mut router, secs(10.0))[0];
        assert_eq!((order.worker, order.phase), (pro, ProbePhase::Measure));
        router.probe_result(
            secs(10.0),
            &routelab_policies::ProbeResult {
                order: order.id,
                worker: pro,
                output_tokens: tokens,
                prompt_tokens: 0,
                wall,
                ok: true,
            },
        );
        // The previous measurement stands, and the burst is retried after `retry_after`.
        assert_near(w(&router, pro), 1.37, 0.01);
        assert_eq!(router.weight(pro).unwrap().provenance, Provenance::Measured);
        assert!(poll(&mut router, secs(20.0)).is_empty());
        assert_eq!(poll(&mut router, secs(71.0)).len(), 1);
    }
}

/// Persisted cache entries with a corrupt throughput were imported as "measured at 0".
#[test]
fn corrupt_persisted_throughputs_are_not_imported() {
    let (router, pair, pro) = source_fleet(policy("seed-v3"));
    let entry = |node: &str, tp: f64| ProbeCacheEntry {
        node: node.into(),
        model: MODEL.into(),
        launch_args: String::new(),
        throughput_tok_s: tp,
        prefill_tok_s: None,
        measured_at: Time::ZERO,
    };
    let mut probe = ProbeWeights::new(ProbeConfig::default());
    probe.import_state(PersistedProbeState {
        cache: vec![entry("pair", f64::NAN), entry("pro6000", 980.0)],
        pins: Vec::new(),
    });
    let fleet = router.fleet();
    probe.observe(secs(1.0), WeightEvent::Registered(pair), fleet);
    probe.observe(secs(1.0), WeightEvent::Registered(pro), fleet);
    assert!(probe.weight(pair, fleet).is_unmeasured());
    assert_eq!(probe.weight(pro, fleet).provenance, Provenance::Measured);
    let mut orders = Vec::new();
    probe.poll_probes(secs(1.0), fleet, &mut orders);
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].worker, pair);
    assert_eq!(probe.export_state().unwrap().cache.len(), 1);
}

/// A YAML chooser without `ties` on top of `seed-v3` silently dropped the preset's
/// higher-weight tie rule (it defaulted to `first`), unlike command-line compositions.
#[test]
fn a_yaml_chooser_keeps_the_presets_tie_rule() {
    let raw: routelab_policies::RawPolicy =
        serde_saphyr::from_str("preset: seed-v3\nchooser: { kind: sed }\n").unwrap();
    let p = PolicyConfig::from_raw(&raw).unwrap();
    assert_eq!(
        p.chooser,
        Chooser::Sed {
            ties: TieRule::HigherWeight
        }
    );
    let raw: routelab_policies::RawPolicy =
        serde_saphyr::from_str("preset: seed-v1\nchooser: { kind: sed }\n").unwrap();
    let p = PolicyConfig::from_raw(&raw).unwrap();
    assert_eq!(
        p.chooser,
        Chooser::Sed {
            ties: TieRule::First
        }
    );
    let raw: routelab_policies::RawPolicy =
        serde_saphyr::from_str("weights: { kind: equal }\nchooser: { kind: jsq }\n").unwrap();
    let p = PolicyConfig::from_raw(&raw).unwrap();
    assert_eq!(
        p.chooser,
        Chooser::Jsq {
            ties: TieRule::HigherWeight
        }
    );
}

/// The only worker whose window could hold a long prompt is disconnected: that is a transient
/// 503, not a 400 "prompt too long" that a client would never retry.
#[test]
fn a_disconnected_large_window_is_not_prompt_too_long() {
    let mut router = Router::new(policy("seed-v1"));
    let small = router.register(
        Time::ZERO,
        spec_full("small", "small", MODEL, &["RTX 4090"], 8_192, ""),
    );
    let large = router.register(
        Time::ZERO,
        spec_full("large", "large", MODEL, &["H100"], 131_072, ""),
    );
    let m = model(&router);
    let mut rng = rng(1);
    router.disconnect(Time::ZERO, large).unwrap();
    let e = router
        .route(Time::ZERO, &req(m, 50_000, &[]), &mut rng)
        .unwrap_err();
    assert!(matches!(e, RouteError::NoHealthyWorker { .. }), "{e:?}");
    assert_eq!(e.http_status(), 503);
    // Beyond every registered window it is a 400 naming the largest one.
    let e = router
        .route(Time::ZERO, &req(m, 200_000, &[]), &mut rng)
        .unwrap_err();
    assert_eq!(
        e,
        RouteError::PromptTooLong {
            tokens: 200_000,
            largest_window: 131_072
        }
    );
    let _ = small;
}

/// Draining a disconnected worker made it an active peer again (its state became Draining)
/// while the weight strategy was not told; now it is a no-op.
#[test]
fn draining_a_disconnected_worker_changes_nothing() {
    let (mut router, pair, pro) = source_fleet(policy("seed-v1"));
    router.disconnect(Time::ZERO, pro).unwrap();
    router.drain(Time::ZERO, pro).unwrap();
    assert_eq!(
        router.fleet().get(pro).unwrap().state,
        routelab_policies::WorkerState::Disconnected
    );
    router.drain(Time::ZERO, pair).unwrap();
    assert_eq!(
        router.fleet().get(pair).unwrap().state,
        routelab_policies::WorkerState::Draining
    );
}

/// A policy duration of 1e20 s (`cache_ttl_s`, `interval_s`, …) reached
/// `Duration::from_secs_f64` and panicked; now it is a configuration error naming the field and
/// the valid range, as is a period too short for a timer.
#[test]
fn huge_or_tiny_policy_durations_are_errors_not_panics() {
    for (yaml, field) in [
        (
            "{ preset: seed-v3, weights: { kind: probe, cache_ttl_s: 1e20 } }",
            "weights.cache_ttl_s",
        ),
        (
            "{ preset: seed-v2, weights: { kind: live, interval_s: 1e300 } }",
            "weights.interval_s",
        ),
        (
            "{ preset: seed-v2, weights: { kind: live, interval_s: 1e-12 } }",
            "weights.interval_s",
        ),
    ] {
        let raw: routelab_policies::RawPolicy = serde_saphyr::from_str(yaml).unwrap();
        let e = routelab_policies::PolicyConfig::from_raw(&raw).unwrap_err();
        assert_eq!(e.field(), field, "{yaml}: {e}");
        assert!(
            e.to_string().contains("expected a number of seconds from"),
            "{e}"
        );
    }
}

/// Bug: a probe `concurrency` or `prompt_tokens` of 4e9 passed validation; the gateway's probe
/// runner then spawned billions of tasks or built a 16 GB prompt and froze its runtime (found by
/// the gateway's proptest over config numbers). The bound lives here, with the probe, so every
/// host gets it.
#[test]
fn a_probe_burst_or_prompt_too_large_to_send_is_an_error() {
    for (yaml, field, valid) in [
        (
            "{ preset: seed-v3, weights: { kind: probe, concurrency: 4000000000 } }",
            "weights.concurrency",
            "from 1 to 1024",
        ),
        (
            "{ preset: seed-v3, weights: { kind: probe, prompt_tokens: 4000000000 } }",
            "weights.prompt_tokens",
            "from 1 to 1048576",
        ),
    ] {
        let raw: routelab_policies::RawPolicy = serde_saphyr::from_str(yaml).unwrap();
        let e = routelab_policies::PolicyConfig::from_raw(&raw).unwrap_err();
        assert_eq!(e.field(), field, "{yaml}: {e}");
        assert!(e.to_string().contains(valid), "{e}");
    }
    // The largest allowed values are accepted.
    let raw: routelab_policies::RawPolicy = serde_saphyr::from_str(
        "{ preset: seed-v3, weights: { kind: probe, concurrency: 1024, prompt_tokens: 1048576 } }",
    )
    .unwrap();
    assert!(routelab_policies::PolicyConfig::from_raw(&raw).is_ok());
}

/// `cache-aware` below its match threshold (every prompt of a trace without prefix hashes, such
/// as Azure's) took "the smallest tree", which spread prompts evenly whatever each worker's
/// speed, and drew three times the originals' share to the slowest worker of the head-to-head
/// fleet (issue 39). Both originals as installed take the fewest requests in flight there, ties
/// to the first worker: a worker that finishes slowly is sent less.
#[test]
fn cache_aware_without_a_match_follows_the_requests_in_flight() {
    let mut router = Router::new(policy("cache-aware"));
    let ids: Vec<_> = (0..4)
        .map(|i| router.register(Time::ZERO, spec(&format!("w{i}"), &["RTX 4090"])))
        .collect();
    let m = model(&router);
    let mut rng = rng(1);
    // Each finishes before the next: every load is 0 at each decision, so every one goes to
    // the first worker (what SGLang's and vLLM's `min_by_key` answer), not round the fleet.
    for k in 0..8u64 {
        let now = secs(k as f64);
        let d = router.route(now, &req(m, 1_000, &[]), &mut rng).unwrap();
        assert_eq!(d.worker, ids[0], "request {k}");
        router.complete(now, d.worker, d.charge, &completion(now));
    }
    // Four at once fill the fleet one each, in order; then only worker 2 finishes, and the
    // next two go to it and then back to the first of the tied (worker 0).
    let t = secs(10.0);
    let open: Vec<_> = (0..4)
        .map(|_| router.route(t, &req(m, 1_000, &[]), &mut rng).unwrap())
        .collect();
    assert_eq!(open.iter().map(|d| d.worker).collect::<Vec<_>>(), ids);
    router.complete(t, open[2].worker, open[2].charge, &completion(t));
    let next = router.route(t, &req(m, 1_000, &[]), &mut rng).unwrap();
    assert_eq!(next.worker, ids[2]);
    let after = router.route(t, &req(m, 1_000, &[]), &mut rng).unwrap();
    assert_eq!(after.worker, ids[0]);
}

/// A worker announcing an absurd cache size (`cache_tokens: 1e12` in a gateway config) made
/// the approximate index reserve its whole record up front: tens of GiB, and the gateway was
/// killed. Sizes are now capped at `MAX_CACHE_BLOCKS`.
#[test]
fn an_absurd_cache_size_is_capped_not_reserved() {
    use routelab_policies::{MAX_CACHE_BLOCKS, PrefixIndex, WorkerId};
    let mut index = PrefixIndex::approximate(1 << 16, false);
    index.register_worker(WorkerId(0), Some(u32::MAX));
    assert_eq!(
        index.bound_of(WorkerId(0)),
        Some(u64::from(MAX_CACHE_BLOCKS))
    );
}

/// A worker credited in the shared record before it got a bounded record of its own (possible
/// through `PrefixIndex`'s public calls, not through `Router`) made the bound's eviction loop
/// sweep its own ring for ever: that credit was never its ring's to free.
#[test]
fn credit_from_before_a_workers_own_record_does_not_spin_the_eviction_loop() {
    use routelab_policies::{PrefixIndex, WorkerId};
    let mut index = PrefixIndex::approximate(64, false);
    index.register_worker(WorkerId(1), None);
    let early: Vec<u64> = (1..=64).collect();
    index.record(&early, WorkerId(0));
    index.register_worker(WorkerId(0), Some(4));
    let later: Vec<u64> = (1000..1008).collect();
    index.record(&later, WorkerId(0));
    index.record(&later, WorkerId(0));
    // It returned; what it holds of the new chain is within its own ring's reach.
    assert!(index.longest(&later).is_some());
}

/// Found by `knowledge::approximate_never_credits_a_worker_beyond_its_cache` (its proptest
/// seed is in `proptest-regressions/knowledge.txt`): a key taken over from a worker's own ring
/// left a stale entry there; recorded back into that ring at another place, the key had two
/// ring entries, both taken as live, and the hand reaching the older one evicted the worker's
/// newest block — here the last block of the prompt it had just served.
#[test]
fn a_key_recorded_back_into_its_old_ring_is_not_evicted_by_its_stale_entry() {
    use routelab_policies::{PrefixIndex, WorkerId};
    let chain = |conv: u64, n: u64| (1..=n).map(|b| (conv << 20) | b).collect::<Vec<u64>>();
    let mut index = PrefixIndex::approximate(256, true);
    index.register_worker(WorkerId(0), None);
    index.register_worker(WorkerId(1), None);
    index.register_worker(WorkerId(2), Some(22));
    let (w0, w2) = (WorkerId(0), WorkerId(2));
    index.record(&chain(0, 7), w2);
    index.record(&chain(24, 22), w2);
    index.record(&chain(0, 1), w2);
    index.record(&chain(24, 1), w0);
    index.record(&chain(1, 1), w0);
    index.record(&chain(26, 22), w2);
    // w0 takes conversation 26's first 8 blocks out of w2's ring; w2 serves it again.
    index.record(&chain(26, 8), w0);
    let last = chain(26, 22);
    index.record(&last, w2);
    assert!(index.holds(w2, last[21]), "w2 lost its last recorded block");
    assert_eq!(index.longest(&last), Some((w2, 22)));
    assert_eq!(index.blocks_of(w2), 22);
    assert_eq!(index.blocks_of(w0), 2);
}
