//! What the router knows about the engines' prefix caches (issue 10 §4), on the bundled Mooncake
//! conversation trace: the believed and the actual cached fraction under each knowledge mode,
//! and the overlap regret.
//!
//! The trace is shortened to its first `ROWS` rows (a quarter of it, about 50 simulated minutes
//! at the scenario's rate): the three tests take 0.2 s in release, about 15 s in a debug build.
//! `cargo test -p routelab-sim --release --test integration knowledge -- --nocapture` prints
//! the figures.

use routelab_policies::{PolicyConfig, PrefixKnowledge};
use routelab_sim::{RunMetrics, Scenario, TrafficSpec, run};
use std::path::PathBuf;
use std::time::Duration;

const ROWS: u64 = 3_000;

fn mooncake(rows: u64) -> Scenario {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/traces/mooncake-conv.yaml");
    let mut sc = Scenario::load(path).unwrap_or_else(|e| panic!("{e}"));
    for t in &mut sc.traffic {
        if let TrafficSpec::Trace { options, .. } = t {
            options.limit = Some(rows);
        }
    }
    sc
}

fn run_with(sc: &Scenario, mut policy: PolicyConfig, knowledge: PrefixKnowledge) -> RunMetrics {
    policy.knowledge = knowledge;
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, &policy, &mut *t, None).unwrap()
}

fn seed_v3() -> PolicyConfig {
    PolicyConfig::preset("seed-v3").unwrap()
}

const KV_EVENTS_NOW: PrefixKnowledge = PrefixKnowledge::KvEvents {
    delay: Duration::ZERO,
};

#[test]
fn believed_cached_fraction_meets_the_engines_within_10_points_approximate_and_1_point_kv_events() {
    let sc = mooncake(ROWS);
    let mut gaps = Vec::new();
    for (name, knowledge) in [
        ("unbounded", PrefixKnowledge::Unbounded),
        ("approximate", PrefixKnowledge::Approximate),
        ("kv-events:0", KV_EVENTS_NOW),
    ] {
        let m = run_with(&sc, seed_v3(), knowledge);
        assert!(m.completed > ROWS / 2, "{name}: {} completed", m.completed);
        let (believed, actual) = (m.believed_hit_fraction(), m.prefix_hit_fraction());
        println!(
            "{name}: believed {:.1} %, actual {:.1} %, overlap regret mean {:.0} p99 {} tokens, \
             TTFT mean {:.2} s, e2e mean {:.2} s",
            100.0 * believed,
            100.0 * actual,
            m.overlap_regret.mean().unwrap_or(0.0),
            m.overlap_regret.quantile(0.99).unwrap_or(0),
            m.ttft.mean_secs().unwrap(),
            m.e2e.mean_secs().unwrap(),
        );
        assert!(actual > 0.0, "{name}: the engines hit nothing");
        gaps.push((name, (believed - actual).abs()));
    }
    let gap = |n: &str| gaps.iter().find(|(name, _)| *name == n).unwrap().1;
    assert!(gap("approximate") < 0.10, "{gaps:?}");
    assert!(gap("kv-events:0") < 0.01, "{gaps:?}");
}

#[test]
fn overlap_regret_is_zero_with_one_worker_and_positive_for_a_prefix_blind_router() {
    let mut sc = mooncake(400);
    let rr = PolicyConfig::from_name("equal/round-robin/none/none").unwrap();
    let spread = run_with(&sc, rr.clone(), PrefixKnowledge::Approximate);
    let routed_with_prefix = spread.overlap_regret.count();
    assert!(routed_with_prefix > 300, "{routed_with_prefix}");
    assert!(spread.overlap_regret.mean().unwrap() > 0.0);
    // Alone, the chosen worker is always the best one.
    sc.setup.workers.truncate(1);
    let alone = run_with(&sc, rr, PrefixKnowledge::Approximate);
    assert_eq!(alone.overlap_regret.count(), routed_with_prefix);
    assert_eq!(alone.overlap_regret.max(), Some(0));
}

#[test]
fn delayed_kv_events_leave_the_router_behind_the_engines() {
    let sc = mooncake(ROWS);
    let gap = |delay_s: u64| {
        let m = run_with(
            &sc,
            seed_v3(),
            PrefixKnowledge::KvEvents {
                delay: Duration::from_secs(delay_s),
            },
        );
        println!(
            "kv-events:{delay_s}: believed {:.2} %, actual {:.2} %, {} events",
            100.0 * m.believed_hit_fraction(),
            100.0 * m.prefix_hit_fraction(),
            m.events
        );
        (m.believed_hit_fraction() - m.prefix_hit_fraction()).abs()
    };
    let (now, late) = (gap(0), gap(60));
    assert!(late > now, "a minute late {late:.4} vs at once {now:.4}");
}
