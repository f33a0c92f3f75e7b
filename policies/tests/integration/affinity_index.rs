//! The prefix affinity's freest candidate comes from a per-model index (a min segment tree
//! over the members, kept up to date on every change) instead of a scan of the fleet. It must
//! be exact: bit for bit the minimum the scan of the eligible candidates finds, after any
//! sequence of dispatches, completions, failures, weight and cap changes, disconnections,
//! drains, registrations and removals; and the affinity's decisions at 10,240 workers must be
//! the ones that minimum implies.

use crate::common::{blocks, completion, policy, rng, secs, spec_full};
use proptest::prelude::*;
use routelab_policies::{
    AffinityUnits, Charge, ModelId, RouteRequest, Router, Time, WorkerId, WorkerState,
};

const MODELS: [&str; 2] = ["m0", "m1"];
const WINDOWS: [u32; 3] = [4_096, 8_192, 32_768];
const GPUS: [&[&str]; 4] = [
    &["RTX 4090"],
    &["RTX 4090", "RTX 4090"],
    &["H100"],
    &["RTX PRO 6000"],
];
/// Policies with a prefix affinity in both units, under each kind of cap and with weight
/// strategies whose weights move (oracle on true capacities, at-load on completions).
const POLICIES: [&str; 5] = [
    "table/p2c:higher-weight/capacity/weighted:3",
    "oracle/p2c:first/raw/flat:2",
    "oracle/jsq:random/capacity/weighted:2",
    "at-load/p2c:higher-weight/capacity/flat:3",
    "equal/round-robin/raw/none",
];

#[derive(Debug, Clone)]
enum Op {
    Register { model: u8, window: u8, gpus: u8 },
    Route { model: u8, tokens: u32, conv: u8 },
    RouteExcluding { model: u8, tokens: u32, skip: u8 },
    Complete { pick: u16, ttft_ms: u32 },
    Fail { pick: u16 },
    TrueCapacity { worker: u8, tok_s: f64 },
    Disconnect(u8),
    Reconnect(u8),
    Drain(u8),
    Remove(u8),
    Tick(u64),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..2, 0u8..3, 0u8..4).prop_map(|(model, window, gpus)| Op::Register { model, window, gpus }),
        8 => (0u8..2, 1u32..40_000, 0u8..6).prop_map(|(model, tokens, conv)| Op::Route { model, tokens, conv }),
        1 => (0u8..2, 1u32..40_000, any::<u8>()).prop_map(|(model, tokens, skip)| Op::RouteExcluding { model, tokens, skip }),
        5 => (any::<u16>(), 1u32..5_000).prop_map(|(pick, ttft_ms)| Op::Complete { pick, ttft_ms }),
        1 => any::<u16>().prop_map(|pick| Op::Fail { pick }),
        2 => (any::<u8>(), 50.0f64..5_000.0).prop_map(|(worker, tok_s)| Op::TrueCapacity { worker, tok_s }),
        1 => any::<u8>().prop_map(Op::Disconnect),
        1 => any::<u8>().prop_map(Op::Reconnect),
        1 => any::<u8>().prop_map(Op::Drain),
        1 => any::<u8>().prop_map(Op::Remove),
        1 => (1u64..30).prop_map(Op::Tick),
    ]
}

/// The affinity rule's freest load as the router used to find it: a scan of every eligible
/// candidate (Up, the model's, a window that holds the request, below its cap), from the
/// router's public state.
fn scanned_freest(router: &Router, model: ModelId, context_tokens: u32) -> f64 {
    let units = match router.config().affinity {
        routelab_policies::Affinity::Prefix { units, .. } => units,
        routelab_policies::Affinity::None => unreachable!("the policies have an affinity"),
    };
    router
        .fleet()
        .iter()
        .filter(|(id, w)| {
            w.model == model
                && w.state == WorkerState::Up
                && w.spec.context_window >= context_tokens
                && w.in_flight < router.cap(*id).unwrap()
        })
        .map(|(id, w)| {
            // The router's own guard: a weight is finite and positive.
            let weight = router.weight(id).unwrap().value;
            let weight = if weight.is_finite() && weight > 0.0 {
                weight
            } else {
                1e-6
            };
            match units {
                AffinityUnits::Raw => f64::from(w.in_flight),
                AffinityUnits::Capacity => f64::from(w.in_flight) / weight,
            }
        })
        .fold(f64::INFINITY, f64::min)
}

fn worker(router: &Router, pick: u8) -> Option<WorkerId> {
    let n = router.fleet().len();
    (n > 0).then(|| WorkerId(u32::from(pick) % n as u32))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn indexed_freest_load_equals_the_scan_after_any_events(
        which in 0usize..POLICIES.len(),
        ops in prop::collection::vec(any_op(), 1..160),
        seed in any::<u64>(),
    ) {
        let mut router = Router::new(policy(POLICIES[which]));
        let mut rng = rng(seed);
        let mut in_flight: Vec<(WorkerId, Charge)> = Vec::new();
        let mut now = 0.0f64;
        for (step, op) in ops.iter().enumerate() {
            now += 0.01;
            let t = secs(now);
            match *op {
                Op::Register { model, window, gpus } => {
                    let name = format!("w{step}");
                    router.register(
                        t,
                        spec_full(&name, &name, MODELS[model as usize], GPUS[gpus as usize],
                            WINDOWS[window as usize], ""),
                    );
                }
                Op::Route { model, tokens, conv } => {
                    if let Some(model) = router.model_id(MODELS[model as usize]) {
                        let prefix = blocks(u64::from(conv), 4);
                        let req = RouteRequest { model, context_tokens: tokens, prefix: &prefix, prompt_tokens: tokens, session: None };
                        if let Ok(d) = router.route(t, &req, &mut rng) {
                            in_flight.push((d.worker, d.charge));
                        }
                    }
                }
                Op::RouteExcluding { model, tokens, skip } => {
                    if let (Some(model), Some(skip)) = (router.model_id(MODELS[model as usize]), worker(&router, skip)) {
                        let req = RouteRequest { model, context_tokens: tokens, prefix: &[], prompt_tokens: tokens, session: None };
                        if let Ok(d) = router.route_excluding(t, &req, &[skip, skip], &mut rng) {
                            prop_assert_ne!(d.worker, skip);
                            in_flight.push((d.worker, d.charge));
                        }
                    }
                }
                Op::Complete { pick, ttft_ms } => {
                    if !in_flight.is_empty() {
                        let (w, charge) = in_flight.swap_remove(pick as usize % in_flight.len());
                        let mut c = completion(t);
                        c.first_token_at = c.dispatched_at + std::time::Duration::from_millis(u64::from(ttft_ms));
                        router.complete(t, w, charge, &c);
                    }
                }
                Op::Fail { pick } => {
                    if !in_flight.is_empty() {
                        let (w, charge) = in_flight.swap_remove(pick as usize % in_flight.len());
                        router.fail(t, w, charge);
                    }
                }
                Op::TrueCapacity { worker: pick, tok_s } => {
                    if let Some(w) = worker(&router, pick) {
                        router.set_true_capacity(t, w, tok_s);
                    }
                }
                Op::Disconnect(pick) => {
                    if let Some(w) = worker(&router, pick) {
                        let _ = router.disconnect(t, w);
                    }
                }
                Op::Reconnect(pick) => {
                    if let Some(w) = worker(&router, pick) {
                        let _ = router.reconnect(t, w);
                    }
                }
                Op::Drain(pick) => {
                    if let Some(w) = worker(&router, pick) {
                        let _ = router.drain(t, w);
                    }
                }
                Op::Remove(pick) => {
                    if let Some(w) = worker(&router, pick) {
                        // A removed worker's requests are lost to the router.
                        if router.remove(t, w).is_ok() {
                            in_flight.retain(|(x, _)| *x != w);
                        }
                    }
                }
                Op::Tick(s) => {
                    now += s as f64;
                    router.tick(secs(now));
                }
            }
            for name in MODELS {
                let Some(model) = router.model_id(name) else { continue };
                for tokens in [0, 1, 4_096, 4_097, 8_192, 8_193, 32_768, 32_769] {
                    let indexed = router.freest_load(model, tokens).unwrap();
                    let scanned = scanned_freest(&router, model, tokens);
                    prop_assert_eq!(indexed.to_bits(), scanned.to_bits(),
                        "step {} ({:?}), model {}, {} tokens: index {} vs scan {}",
                        step, op, name, tokens, indexed, scanned);
                }
            }
        }
    }
}

/// The affinity rule at 10,240 workers (round-robin, raw units, no cap, the default allowance
/// of 2 + 0.25 per 1,000 prompt tokens up to 8): the first 5,120 workers hold 131,072 tokens, the
/// others 32,768; every worker has 2 requests in flight but the last one, which is idle. A long
/// prompt's freest candidate is the least loaded of the large-window group (2), not the idle
/// small-window worker it cannot use (0), so its holder is kept up to 8 above 2 and no further.
#[test]
fn affinity_at_10240_workers_compares_with_the_freest_eligible_candidate() {
    const N: usize = 10_240;
    let mut router = Router::new(policy("equal/round-robin/raw/none"));
    for i in 0..N {
        let name = format!("w{i}");
        let window = if i < N / 2 { 131_072 } else { 32_768 };
        router.register(
            Time::ZERO,
            spec_full(&name, &name, "m", &["H100"], window, ""),
        );
    }
    let model = router.model_id("m").unwrap();
    let mut rng = rng(7);
    let req = |tokens: u32, prefix: &'static [u64]| RouteRequest {
        model,
        context_tokens: tokens,
        prefix,
        prompt_tokens: tokens,
        session: None,
    };
    let mut charges: Vec<Vec<Charge>> = vec![Vec::new(); N];
    for _ in 0..2 * N {
        let d = router
            .route(Time::ZERO, &req(1_000, &[]), &mut rng)
            .unwrap();
        charges[d.worker.index()].push(d.charge);
    }
    assert!(router.fleet().iter().all(|(_, w)| w.in_flight == 2));
    let last = WorkerId(N as u32 - 1);
    for charge in std::mem::take(&mut charges[last.index()]) {
        router.complete(Time::ZERO, last, charge, &completion(Time::ZERO));
    }
    assert_eq!(router.freest_load(model, 1_000), Some(0.0));
    assert_eq!(router.freest_load(model, 100_000), Some(2.0));

    let prefix: &'static [u64] = Box::leak(blocks(1, 8).into_boxed_slice());
    let first = router
        .route(Time::ZERO, &req(100_000, prefix), &mut rng)
        .unwrap();
    assert!(!first.affinity_kept);
    let holder = first.worker;
    assert!(
        holder.index() < N / 2,
        "a long prompt goes to the large-window group"
    );
    let mut kept = 0;
    loop {
        let d = router
            .route(Time::ZERO, &req(100_000, prefix), &mut rng)
            .unwrap();
        if !d.affinity_kept {
            assert_ne!(d.worker, holder);
            break;
        }
        assert_eq!(d.worker, holder);
        kept += 1;
    }
    // Kept at the holder's loads 3 to 10 (10 − 2 ≤ 8), refused at 11.
    assert_eq!(kept, 8);
    assert_eq!(router.fleet().get(holder).unwrap().in_flight, 11);
}
