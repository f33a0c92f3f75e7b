//! Shared helpers: fleets, requests, completions and probe answering.

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use routelab_policies::{
    Chooser, Completion, ModelId, PolicyConfig, ProbeOrder, ProbePhase, ProbeResult, RouteRequest,
    Router, Time, WorkerId, WorkerSpec,
};
use std::time::Duration;

/// The model of the source's example.
pub const MODEL: &str = "gemma-27b";

/// The RNG every test uses.
pub fn rng(seed: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

/// A time `s` seconds after the epoch.
pub fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// A worker of [`MODEL`] with a 32k window, its own node and empty launch arguments.
pub fn spec(name: &str, gpus: &[&str]) -> WorkerSpec {
    spec_full(name, name, MODEL, gpus, 32_768, "")
}

/// A worker spec with every field given.
pub fn spec_full(
    name: &str,
    node: &str,
    model: &str,
    gpus: &[&str],
    context_window: u32,
    launch_args: &str,
) -> WorkerSpec {
    WorkerSpec {
        name: name.into(),
        node: node.into(),
        model: model.into(),
        gpu_names: gpus.iter().map(|g| g.to_string()).collect(),
        context_window,
        launch_args: launch_args.into(),
        cache_blocks: None,
    }
}

/// A preset, or a composition like `probe/p2c:first`.
pub fn policy(name: &str) -> PolicyConfig {
    PolicyConfig::from_name(name).unwrap_or_else(|e| panic!("policy {name}: {e}"))
}

/// `base` with another chooser.
pub fn with_chooser(mut base: PolicyConfig, chooser: Chooser) -> PolicyConfig {
    base.chooser = chooser;
    base
}

/// The source's fleet: the pair of 4090s registered first, then the RTX PRO 6000.
pub fn source_fleet(config: PolicyConfig) -> (Router, WorkerId, WorkerId) {
    let mut router = Router::new(config);
    let pair = router.register(Time::ZERO, spec("pair", &["RTX 4090", "RTX 4090"]));
    let pro = router.register(Time::ZERO, spec("pro6000", &["RTX PRO 6000"]));
    (router, pair, pro)
}

/// The source fleet with pinned weights pair 0.66 / PRO 6000 1.34 (probe-like policy).
pub fn pinned_source_fleet(config: PolicyConfig) -> (Router, WorkerId, WorkerId) {
    let (mut router, pair, pro) = source_fleet(config);
    router.pin(Time::ZERO, pair, 0.66).unwrap();
    router.pin(Time::ZERO, pro, 1.34).unwrap();
    (router, pair, pro)
}

/// The interned id of [`MODEL`].
pub fn model(router: &Router) -> ModelId {
    router.model_id(MODEL).expect("model registered")
}

/// A request of `tokens` context tokens with the given prefix blocks.
pub fn req(model: ModelId, tokens: u32, prefix: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model,
        context_tokens: tokens,
        prefix,
        prompt_tokens: tokens,
        session: None,
    }
}

/// A 128-token completion that ran from `at - 2 s` to `at`.
pub fn completion(at: Time) -> Completion {
    let start = Time::from_nanos(at.as_nanos().saturating_sub(2_000_000_000));
    Completion {
        prompt_tokens: 500,
        output_tokens: 128,
        dispatched_at: start,
        first_token_at: start + Duration::from_millis(100),
        completed_at: at,
    }
}

/// The result of `order` at a throughput of `tok_s` (total tokens of the burst over wall time).
pub fn burst(order: &ProbeOrder, tok_s: f64) -> ProbeResult {
    let tokens = u64::from(order.concurrency) * u64::from(order.output_tokens);
    ProbeResult {
        order: order.id,
        worker: order.worker,
        output_tokens: tokens,
        prompt_tokens: u64::from(order.concurrency) * u64::from(order.prompt_tokens),
        wall: Duration::from_secs_f64(tokens as f64 / tok_s),
        ok: true,
    }
}

/// Poll probe orders and answer each with `tok_s(worker, phase)` until the router asks for
/// nothing more; returns every order seen, in order.
pub fn run_probes(
    router: &mut Router,
    now: Time,
    mut tok_s: impl FnMut(WorkerId, ProbePhase) -> f64,
) -> Vec<ProbeOrder> {
    let mut seen = Vec::new();
    for _ in 0..16 {
        let mut orders = Vec::new();
        router.poll_probes(now, &mut orders);
        if orders.is_empty() {
            return seen;
        }
        for o in &orders {
            router.probe_result(now, &burst(o, tok_s(o.worker, o.phase)));
        }
        seen.extend(orders);
    }
    panic!("the router keeps asking for probes: {seen:?}");
}

/// Orders the router asks for now, without answering them.
pub fn poll(router: &mut Router, now: Time) -> Vec<ProbeOrder> {
    let mut orders = Vec::new();
    router.poll_probes(now, &mut orders);
    orders
}

/// The worker's current weight value.
pub fn w(router: &Router, id: WorkerId) -> f64 {
    router.weight(id).expect("known worker").value
}

/// `|a - b| <= tol`, with a readable failure.
#[track_caller]
pub fn assert_near(got: f64, want: f64, tol: f64) {
    assert!((got - want).abs() <= tol, "got {got}, want {want} ± {tol}");
}

/// Chain-hash prefix blocks: `len` blocks of conversation `conv`.
pub fn blocks(conv: u64, len: usize) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ conv.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|i| {
            h = (h ^ i as u64).wrapping_mul(0x100_0000_01b3).rotate_left(17) ^ conv;
            h
        })
        .collect()
}
