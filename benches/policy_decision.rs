//! One routing decision of `seed-v3` (filters + capacity-unit prefix affinity + p2c with ties to
//! the higher weight, flat cap 24) over 8, 64, 1,024 and 10,240 measured workers, without a prefix and
//! with a 64-block prefix.
//!
//! Each iteration is **route + complete** of one request, so the fleet stays in a steady state
//! (every worker keeps 2 background requests in flight; the prefix index stays full, with a mix of
//! recurring conversations that hit and new ones that miss and evict). The workload is
//! `support/decision.rs`, which the speed gate (`examples/speed_gate`) also counts.
//!
//! A second group, `peer rules route+complete`, times the field's routers (`cache-aware`,
//! `least-load`, …, as presets) the same way over 64 workers with the 64-block prefix.
//!
//! `predictive route+complete` times our `predictive` over 64, 1,024 and 10,240 workers with
//! the 64-block prefix (a full scan up to 16 candidates, then 16 drawn plus the prefix holder),
//! and `predictive + future terms` the same with both terms that price the requests to come on
//! (`reserve: 1, evict: 1`: the foresight noted at each dispatch, its shares refreshed).
//!
//! A third, `prefix knowledge route+complete`, times `seed-v3` and `cache-aware` with the 64-block
//! prefix under each prefix knowledge over 8, 64 and 1,024 workers that announce a 1,024-block
//! cache each: `approximate` (every worker's own ring evicting), `unbounded`, and `kv-events`
//! over a mirror into which each prompt's blocks were announced stored by a worker before the
//! measurement (applying events is the host's work, not the decision's).
//!
//! New conversations are half the prompts, or the share in `ROUTELAB_BENCH_NEW_SHARE` (0 to 1).
//!
//! ```text
//! cargo bench --bench policy_decision -- --warm-up-time 1 --measurement-time 3
//! ```

#[path = "support/decision.rs"]
mod decision;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use decision::{CACHE_BLOCKS, Decisions};
use routelab_policies::{Chooser, PolicyConfig, PredictiveParams, PrefixKnowledge};
use std::time::Duration;

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
    let mut group = c.benchmark_group("predictive route+complete");
    for n in [64usize, 1_024, 10_240] {
        bench_one(&mut group, preset("predictive"), n, None, true, None);
    }
    group.finish();
    let mut group = c.benchmark_group("predictive + future terms route+complete");
    for n in [64usize, 1_024, 10_240] {
        let mut config = preset("predictive");
        config.chooser = Chooser::Predictive(PredictiveParams {
            reserve: 1.0,
            evict: 1.0,
            ..PredictiveParams::DEFAULT
        });
        bench_one(&mut group, config, n, None, true, None);
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

/// The share of new conversations among the prompts: `ROUTELAB_BENCH_NEW_SHARE`, else half.
fn new_share() -> f64 {
    std::env::var("ROUTELAB_BENCH_NEW_SHARE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| (0.0..=1.0).contains(v))
        .unwrap_or(0.5)
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
    let mut decisions = Decisions::new(config, n, cache_blocks, with_prefix, new_share());
    let id = BenchmarkId::new(
        label.unwrap_or(if with_prefix {
            "64-block prefix"
        } else {
            "no prefix"
        }),
        n,
    );
    group.bench_function(id, |b| b.iter(|| decisions.step()));
}

criterion_group!(benches, decision);
criterion_main!(benches);
