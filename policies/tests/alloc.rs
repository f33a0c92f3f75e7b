//! No heap allocation on the decision path.
//!
//! A counting global allocator (its own test binary, since a `#[global_allocator]` replaces the
//! allocator of the whole binary) counts allocations per thread; a `seed-v3` router with 64
//! measured workers, background load and a warm prefix index must then route and complete
//! 10,000 requests, with and without a 64-block prefix, without a single allocation; and a
//! saturated or disconnected fleet must refuse 10,000 requests each (`AllAtCap`,
//! `NoHealthyWorker`, `PromptTooLong`) without one either. The field's routers (the peer
//! presets) are held to the same steady-state test, and so is every prefix knowledge
//! (`approximate` with per-worker bounds, `unbounded`, `kv-events` over a full mirror).

use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::{
    Affinity, Completion, KvEvent, PolicyConfig, PrefixKnowledge, ProbeResult, RouteError,
    RouteRequest, Router, Time, WorkerSpec,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

thread_local! {
    // `const` initialisation with a `Drop`-free type: touching it never allocates (no lazy
    // init, no destructor registration), so the allocator can use it without recursion.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    // Size of the largest allocation seen, to tell what allocated when the count is not zero.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn count(size: usize) {
    // `try_with`: allocations during thread teardown must not panic.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

/// Forwards to the system allocator and counts allocations on the current thread.
struct Counting;

// `unsafe impl`: `GlobalAlloc` is an unsafe trait (the implementation promises to return valid
// memory for the layout); we uphold it by forwarding every call unchanged to `System`. The
// methods are `unsafe fn`s whose callers uphold the layout/pointer contracts we pass through.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: `ptr` was allocated by `System` through us with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through us with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const MODEL: &str = "gemma-27b";
const WORKERS: usize = 64;
const BLOCKS: usize = 64;

/// `seed-v3` (or a variant), 64 measured workers (each announcing a cache of `cache_blocks`),
/// 2 requests in flight each.
fn warm_router(
    config: PolicyConfig,
    rng: &mut Xoshiro256PlusPlus,
    cache_blocks: Option<u32>,
) -> Router {
    let mut router = Router::new(config);
    let gpus: [&[&str]; 4] = [
        &["RTX 4090", "RTX 4090"],
        &["RTX PRO 6000"],
        &["H100"],
        &["Apple M2 Ultra"],
    ];
    for i in 0..WORKERS {
        router.register(
            Time::ZERO,
            WorkerSpec {
                name: format!("w{i}"),
                node: format!("node{i}"),
                model: MODEL.into(),
                gpu_names: gpus[i % 4].iter().map(|g| g.to_string()).collect(),
                context_window: [32_768, 131_072][i % 2],
                launch_args: String::new(),
                cache_blocks,
            },
        );
    }
    // Measure everyone (warm-up then measurement bursts).
    let mut orders = Vec::new();
    for _ in 0..4 {
        orders.clear();
        router.poll_probes(Time::from_secs_f64(1.0), &mut orders);
        for o in &orders {
            let tok_s = 200.0 + 100.0 * f64::from(o.worker.0 % 10);
            let tokens = u64::from(o.concurrency * o.output_tokens);
            router.probe_result(
                Time::from_secs_f64(1.0),
                &ProbeResult {
                    order: o.id,
                    worker: o.worker,
                    output_tokens: tokens,
                    prompt_tokens: 0,
                    wall: Duration::from_secs_f64(tokens as f64 / tok_s),
                    ok: true,
                },
            );
        }
    }
    // A probing policy has measured everyone (the field's routers do not probe).
    assert!(
        !matches!(
            router.config().weights,
            routelab_policies::WeightsConfig::Probe(_)
        ) || router
            .fleet()
            .iter()
            .all(|(id, _)| !router.weight(id).unwrap().is_unmeasured())
    );
    let model = router.model_id(MODEL).unwrap();
    for _ in 0..2 * WORKERS {
        let req = RouteRequest {
            model,
            context_tokens: 1_000,
            prefix: &[],
            prompt_tokens: 1_000,
            session: None,
        };
        router.route(Time::from_secs_f64(2.0), &req, rng).unwrap();
    }
    router
}

/// 64-block chain-hash prefixes: half from 300 recurring conversations (cache hits), half new.
fn prefixes(n: usize, rng: &mut Xoshiro256PlusPlus, fresh_from: u64) -> Vec<Vec<u64>> {
    (0..n)
        .map(|i| {
            let conv = if rng.random_bool(0.5) {
                rng.random_range(0..300u64)
            } else {
                fresh_from + i as u64
            };
            let mut h = conv.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..BLOCKS)
                .map(|b| {
                    h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3).rotate_left(23);
                    h
                })
                .collect()
        })
        .collect()
}

/// Route then complete each request; returns the allocations counted meanwhile.
fn steady_state(
    router: &mut Router,
    prompts: &[Vec<u64>],
    with_prefix: bool,
    rng: &mut Xoshiro256PlusPlus,
    t0: f64,
) -> u64 {
    let model = router.model_id(MODEL).unwrap();
    let before = allocations();
    for (i, p) in prompts.iter().enumerate() {
        let now = Time::from_secs_f64(t0 + i as f64 * 0.01);
        let req = RouteRequest {
            model,
            context_tokens: 8_000,
            prefix: if with_prefix { p } else { &[] },
            prompt_tokens: 8_000,
            session: None,
        };
        let d = router.route(now, &req, rng).unwrap();
        let c = Completion {
            prompt_tokens: 8_000,
            output_tokens: 128,
            dispatched_at: now,
            first_token_at: now,
            completed_at: now,
        };
        router.complete(now, d.worker, d.charge, &c);
    }
    allocations() - before
}

fn check(config: PolicyConfig) {
    check_with_caches(config, None);
}

/// [`check`] over workers announcing `cache_blocks` each. Under `kv-events` the warm-up
/// prompts are announced stored by the workers they went to (applying events is the host's
/// work, outside the decision), so the measured decisions look up a full mirror.
fn check_with_caches(config: PolicyConfig, cache_blocks: Option<u32>) {
    let name = config.name.clone();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
    let mut router = warm_router(config, &mut rng, cache_blocks);
    // Warm-up: fill the prefix index past its capacity so evictions are in steady state too.
    let warm = prefixes(20_000, &mut rng, 1 << 32);
    let measured = prefixes(10_000, &mut rng, 1 << 40);
    steady_state(&mut router, &warm, true, &mut rng, 10.0);
    if router.kv_event_delay().is_some() {
        let workers: Vec<_> = router.fleet().iter().map(|(id, _)| id).collect();
        for (i, p) in warm.iter().enumerate() {
            let events: Vec<KvEvent> = KvEvent::stored_chain(p).collect();
            router.apply_kv_events(Time::ZERO, workers[i % workers.len()], &events);
        }
    }
    assert!(!router.prefix_index().is_empty());

    // Sanity check of the counter itself.
    let before = allocations();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(allocations() - before, 1);

    LARGEST.with(|c| c.set(0));
    let without = steady_state(&mut router, &measured, false, &mut rng, 1_000.0);
    let with = steady_state(&mut router, &measured, true, &mut rng, 2_000.0);
    assert_eq!(
        (without, with),
        (0, 0),
        "{name}: allocations without / with a 64-block prefix (largest: {} bytes)",
        LARGEST.with(Cell::get)
    );
    assert!(router.prefix_index().len() <= router.prefix_index().capacity());
}

#[test]
fn seed_v3_decisions_do_not_allocate() {
    check(PolicyConfig::preset("seed-v3").unwrap());
}

#[test]
fn the_field_routers_decisions_do_not_allocate() {
    // Every peer preset (the randomised ones too: wait-and-widen widens, kv-cost samples).
    for name in PolicyConfig::field_presets() {
        check(PolicyConfig::preset(name).unwrap());
    }
    let mut softmax = PolicyConfig::from_name("equal/kv-cost").unwrap();
    if let routelab_policies::Chooser::KvCost { temperature, .. } = &mut softmax.chooser {
        *temperature = 2.0;
    }
    softmax.name = "kv-cost at temperature 2".into();
    check(softmax);
}

#[test]
fn every_prefix_knowledge_decides_without_allocating() {
    for preset in ["seed-v3", "cache-aware"] {
        for (knowledge, caches) in [
            // Each worker bounded by a 96-block cache: constant eviction in every ring.
            (PrefixKnowledge::Approximate, Some(96)),
            (PrefixKnowledge::Approximate, None),
            (PrefixKnowledge::Unbounded, Some(96)),
            (
                PrefixKnowledge::KvEvents {
                    delay: Duration::ZERO,
                },
                Some(96),
            ),
        ] {
            let mut config = PolicyConfig::preset(preset).unwrap();
            config.knowledge = knowledge;
            config.name = format!("{preset} {knowledge:?} caches {caches:?}");
            check_with_caches(config, caches);
        }
    }
}

#[test]
fn a_small_prefix_index_under_heavy_eviction_does_not_allocate() {
    // 1,024 blocks: every 64-block prompt evicts, millions of map removals and insertions.
    let mut config = PolicyConfig::preset("seed-v3").unwrap();
    if let Affinity::Prefix { index_blocks, .. } = &mut config.affinity {
        *index_blocks = 1_024;
    }
    config.name = "seed-v3 (1,024-block index)".into();
    check(config);
}

/// Route `n` requests that must all be refused with `expect`; returns the allocations counted.
fn refusals(
    router: &mut Router,
    context_tokens: u32,
    n: usize,
    expect: fn(&RouteError) -> bool,
    rng: &mut Xoshiro256PlusPlus,
) -> u64 {
    let model = router.model_id(MODEL).unwrap();
    let prefix = [7u64, 11, 13];
    let before = allocations();
    for i in 0..n {
        let req = RouteRequest {
            model,
            context_tokens,
            // Half with a prefix, so the affinity lookup runs on the refused path too.
            prefix: if i % 2 == 0 { &prefix } else { &[] },
            prompt_tokens: context_tokens,
            session: None,
        };
        let e = router
            .route(Time::from_secs_f64(3.0), &req, rng)
            .unwrap_err();
        assert!(expect(&e), "unexpected {e:?}");
    }
    allocations() - before
}

#[test]
fn refused_decisions_do_not_allocate() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(23);
    let mut router = warm_router(PolicyConfig::preset("seed-v3").unwrap(), &mut rng, None);
    let model = router.model_id(MODEL).unwrap();
    // Saturate the fleet: every worker at its flat cap of 24.
    let req = RouteRequest {
        model,
        context_tokens: 1_000,
        prefix: &[],
        prompt_tokens: 1_000,
        session: None,
    };
    while router
        .route(Time::from_secs_f64(2.5), &req, &mut rng)
        .is_ok()
    {}
    let all_at_cap = |e: &RouteError| matches!(e, RouteError::AllAtCap { .. });

    // 1. No free worker at all: refused before the chooser runs.
    let fleet_full = refusals(&mut router, 1_000, 10_000, all_at_cap, &mut rng);

    // 2. Free slots only on workers whose window is too small: the chooser finds nobody.
    let small: Vec<_> = router
        .fleet()
        .iter()
        .filter(|(_, w)| w.spec.context_window == 32_768)
        .map(|(id, _)| id)
        .collect();
    let now = Time::from_secs_f64(2.6);
    for &id in &small {
        let c = Completion {
            prompt_tokens: 1_000,
            output_tokens: 128,
            dispatched_at: now,
            first_token_at: now,
            completed_at: now,
        };
        router.complete(now, id, routelab_policies::Charge::NONE, &c);
    }
    let chooser_full = refusals(&mut router, 100_000, 10_000, all_at_cap, &mut rng);

    // 3. A prompt beyond every window.
    let too_long = refusals(
        &mut router,
        1_000_000,
        10_000,
        |e| matches!(e, RouteError::PromptTooLong { .. }),
        &mut rng,
    );

    // 4. Nobody connected: no healthy worker.
    let ids: Vec<_> = router.fleet().iter().map(|(id, _)| id).collect();
    for id in ids {
        router.disconnect(now, id).unwrap();
    }
    let unhealthy = refusals(
        &mut router,
        1_000,
        10_000,
        |e| matches!(e, RouteError::NoHealthyWorker { .. }),
        &mut rng,
    );
    assert_eq!(
        (fleet_full, chooser_full, too_long, unhealthy),
        (0, 0, 0, 0),
        "allocations: fleet at cap / chooser at cap / prompt too long / no healthy worker"
    );
}
