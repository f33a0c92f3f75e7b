//! One routing decision of `seed-v3` (filters + capacity-unit prefix affinity + p2c with ties to
//! the higher weight, flat cap 24) over 8, 64, 1,024 and 10,240 measured workers, without a prefix and
//! with a 64-block prefix.
//!
//! Each iteration is **route + complete** of one request, so the fleet stays in a steady state
//! (every worker keeps 2 background requests in flight; the prefix index stays full, with a mix of
//! recurring conversations that hit and new ones that miss and evict).
//!
//! A second group, `peer rules route+complete`, times the field's routers (`cache-aware`,
//! `least-load`, …, as presets) the same way over 64 workers with the 64-block prefix.
//!
//! A third, `prefix knowledge route+complete`, times `seed-v3` and `cache-aware` with the 64-block
//! prefix under each prefix knowledge over 8, 64 and 1,024 workers that announce a 1,024-block
//! cache each: `approximate` (every worker's own ring evicting), `unbounded`, and `kv-events`
//! over a mirror into which each prompt's blocks were announced stored by a worker before the
//! measurement (applying events is the host's work, not the decision's).
//!
//! ```text
//! cargo bench --bench policy_decision -- --warm-up-time 1 --measurement-time 3
//! ```

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use routelab_policies::{
    Completion, KvEvent, PolicyConfig, PrefixKnowledge, ProbeResult, RouteRequest, Router, Time,
    WorkerSpec,
};
use std::hint::black_box;
use std::time::Duration;

const MODEL: &str = "gemma-27b";
const BLOCKS: usize = 64;
const PROMPTS: usize = 4_096;

/// Blocks of KV cache each worker announces in the knowledge group.
const CACHE_BLOCKS: u32 = 1_024;

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
        };
        router.route(now, &req, rng).expect("room");
    }
    router
}

/// 64-block chain-hash prompts: from 300 recurring conversations (whose blocks the index holds)
/// or new ones (which miss and evict 64 blocks each); new ones are half the prompts, or the
/// share in `ROUTELAB_BENCH_NEW_SHARE` (0 to 1).
fn prompts(rng: &mut Xoshiro256PlusPlus) -> Vec<Vec<u64>> {
    let new_share = std::env::var("ROUTELAB_BENCH_NEW_SHARE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| (0.0..=1.0).contains(v))
        .unwrap_or(0.5);
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

fn decision(c: &mut Criterion) {
    let preset = |name: &str| PolicyConfig::preset(name).expect("preset");
    let mut group = c.benchmark_group("seed-v3 route+complete");
    for n in [8usize, 64, 1_024, 10_240] {
        for with_prefix in [false, true] {
            bench_one(&mut group, preset("seed-v3"), n, None, with_prefix, None);
        }
    }
    group.finish();
    let mut group = c.benchmark_group("peer rules route+complete");
    for name in PolicyConfig::field_presets() {
        bench_one(&mut group, preset(name), 64, None, true, Some(name));
    }
    group.finish();
    let mut group = c.benchmark_group("prefix knowledge route+complete");
    for name in ["seed-v3", "cache-aware"] {
        for knowledge in [
            PrefixKnowledge::Approximate,
            PrefixKnowledge::Unbounded,
            PrefixKnowledge::KvEvents {
                delay: Duration::ZERO,
            },
        ] {
            for n in [8usize, 64, 1_024] {
                let mut config = preset(name);
                config.knowledge = knowledge;
                let label = format!("{name} {}", knowledge.name());
                bench_one(
                    &mut group,
                    config,
                    n,
                    Some(CACHE_BLOCKS),
                    true,
                    Some(&label),
                );
            }
        }
    }
    group.finish();
}

/// Time route + complete of `config` over `n` workers; the bench id is `label` or the prompt
/// kind, with `n`.
fn bench_one(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    config: PolicyConfig,
    n: usize,
    cache_blocks: Option<u32>,
    with_prefix: bool,
    label: Option<&str>,
) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let mut router = fleet(config, n, cache_blocks, &mut rng);
    let prompts = prompts(&mut rng);
    let model = router.model_id(MODEL).expect("model");
    let now = Time::from_secs_f64(10.0);
    let done = Completion {
        prompt_tokens: 8_000,
        output_tokens: 128,
        dispatched_at: now,
        first_token_at: now,
        completed_at: now,
    };
    let step = |router: &mut Router, i: usize, rng: &mut Xoshiro256PlusPlus| {
        let req = RouteRequest {
            model,
            context_tokens: 8_000,
            prefix: if with_prefix {
                &prompts[i % PROMPTS]
            } else {
                &[]
            },
            prompt_tokens: 8_000,
        };
        let d = router.route(now, black_box(&req), rng).expect("room");
        router.complete(now, black_box(d.worker), d.charge, &done);
    };
    // Fill the prefix index and reach steady state before measuring.
    for i in 0..4 * PROMPTS {
        step(&mut router, i, &mut rng);
    }
    // Under kv-events the engines announce what they hold: each prompt on one worker.
    if router.kv_event_delay().is_some() {
        let workers: Vec<_> = router.fleet().iter().map(|(id, _)| id).collect();
        for (i, p) in prompts.iter().enumerate() {
            let events: Vec<KvEvent> = KvEvent::stored_chain(p).collect();
            router.apply_kv_events(now, workers[i % workers.len()], &events);
        }
    }
    let id = BenchmarkId::new(
        label.unwrap_or(if with_prefix {
            "64-block prefix"
        } else {
            "no prefix"
        }),
        n,
    );
    let mut i = 0usize;
    group.bench_function(id, |b| {
        b.iter(|| {
            step(&mut router, i, &mut rng);
            i = i.wrapping_add(1);
        })
    });
}

criterion_group!(benches, decision);
criterion_main!(benches);
