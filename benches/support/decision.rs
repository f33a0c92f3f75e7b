//! The decision bench's workload, in one place for its two users: `benches/policy_decision.rs`
//! times it with criterion, and the speed gate (`examples/speed_gate`) counts its instructions
//! under valgrind.
//!
//! A [`Decisions`] is a router over `n` measured workers of one model, already in a steady state
//! (every worker keeps 2 background requests in flight; the prefix index is full, with a mix of
//! recurring conversations that hit and new ones that miss and evict). Each [`Decisions::step`]
//! is **route + complete** of one request, so the state stays steady however many steps run.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use routelab_policies::{
    Completion, KvEvent, ModelId, PolicyConfig, ProbeResult, RouteRequest, Router, Time, WorkerId,
    WorkerSpec,
};
use std::hint::black_box;
use std::time::Duration;

const MODEL: &str = "gemma-27b";
const BLOCKS: usize = 64;
const PROMPTS: usize = 4_096;

/// Blocks of KV cache each worker announces in the bench's knowledge group.
pub const CACHE_BLOCKS: u32 = 1_024;

/// `config` over `n` workers (announcing `cache_blocks`), every one measured by the probe (if
/// it probes), 2 requests in flight each.
fn fleet(
    config: PolicyConfig,
    n: usize,
    cache_blocks: Option<u32>,
    rng: &mut Xoshiro256PlusPlus,
) -> Router {
    let mut router = Router::new(config);
    let gpus: [&[&str]; 4] = [
        &["RTX 4090", "RTX 4090"],
        &["RTX PRO 6000"],
        &["H100"],
        &["Apple M2 Ultra"],
    ];
    for i in 0..n {
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
    let now = Time::from_secs_f64(1.0);
    let mut orders = Vec::new();
    loop {
        orders.clear();
        router.poll_probes(now, &mut orders);
        if orders.is_empty() {
            break;
        }
        for o in &orders {
            let tok_s = 250.0 + 90.0 * f64::from(o.worker.0 % 11);
            let tokens = u64::from(o.concurrency) * u64::from(o.output_tokens);
            router.probe_result(
                now,
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
    let model = router.model_id(MODEL).expect("model");
    for _ in 0..2 * n {
        let req = RouteRequest {
            model,
            context_tokens: 1_000,
            prefix: &[],
            prompt_tokens: 1_000,
            session: None,
        };
        router.route(now, &req, rng).expect("room");
    }
    router
}

/// 64-block chain-hash prompts: from 300 recurring conversations (whose blocks the index holds)
/// or new ones (which miss and evict 64 blocks each); new ones are `new_share` of the prompts.
fn prompts(rng: &mut Xoshiro256PlusPlus, new_share: f64) -> Vec<Vec<u64>> {
    (0..PROMPTS)
        .map(|i| {
            let conv = if !rng.random_bool(new_share) {
                rng.random_range(0..300u64)
            } else {
                1_000 + i as u64
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

/// A router in the bench's steady state, ready to take decisions.
pub struct Decisions {
    router: Router,
    prompts: Vec<Vec<u64>>,
    model: ModelId,
    with_prefix: bool,
    rng: Xoshiro256PlusPlus,
    /// Decisions taken so far (warm-up included): picks the next prompt.
    taken: usize,
}

impl Decisions {
    /// `config` over `n` measured workers (announcing `cache_blocks`), with the 64-block prompts
    /// (`new_share` of them new conversations) or without a prefix, warmed up: the prefix index
    /// filled by four rounds of the prompts and, under kv-events, each prompt announced stored by
    /// one worker (applying events is the host's work, not the decision's).
    pub fn new(
        config: PolicyConfig,
        n: usize,
        cache_blocks: Option<u32>,
        with_prefix: bool,
        new_share: f64,
    ) -> Decisions {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
        let router = fleet(config, n, cache_blocks, &mut rng);
        let prompts = prompts(&mut rng, new_share);
        let model = router.model_id(MODEL).expect("model");
        let mut d = Decisions {
            router,
            prompts,
            model,
            with_prefix,
            rng,
            taken: 0,
        };
        for _ in 0..4 * PROMPTS {
            d.step();
        }
        if d.router.kv_event_delay().is_some() {
            let workers: Vec<_> = d.router.fleet().iter().map(|(id, _)| id).collect();
            for (i, p) in d.prompts.iter().enumerate() {
                let events: Vec<KvEvent> = KvEvent::stored_chain(p).collect();
                d.router
                    .apply_kv_events(Self::NOW, workers[i % workers.len()], &events);
            }
        }
        d
    }

    /// The time every decision is taken at.
    const NOW: Time = Time::from_nanos(10_000_000_000);

    /// One decision: route the next request, then complete it. Returns the worker chosen.
    #[inline]
    pub fn step(&mut self) -> WorkerId {
        let now = Self::NOW;
        let req = RouteRequest {
            model: self.model,
            context_tokens: 8_000,
            prefix: if self.with_prefix {
                &self.prompts[self.taken % PROMPTS]
            } else {
                &[]
            },
            prompt_tokens: 8_000,
            session: None,
        };
        let d = self
            .router
            .route(now, black_box(&req), &mut self.rng)
            .expect("room");
        let done = Completion {
            prompt_tokens: 8_000,
            output_tokens: 128,
            dispatched_at: now,
            first_token_at: now,
            completed_at: now,
        };
        self.router
            .complete(now, black_box(d.worker), d.charge, &done);
        self.taken = self.taken.wrapping_add(1);
        d.worker
    }
}
