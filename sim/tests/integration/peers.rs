//! The field's routers (the peer presets) run in the simulator: every one completes a small
//! mixed-fleet scenario with sane totals, and a rule visibly uses its signal.

use routelab_policies::PolicyConfig;
use routelab_sim::{RunMetrics, Scenario, run};
use std::path::Path;

/// The peer presets (the field's routers).
fn peer_presets() -> Vec<&'static str> {
    PolicyConfig::field_presets().collect()
}

fn scenario(yaml: &str) -> Scenario {
    // The directory matters only for profile and trace paths, resolved from the sim crate.
    let at = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers.yaml");
    Scenario::from_yaml(yaml, &at).unwrap_or_else(|e| panic!("{e}"))
}

fn run_policy(sc: &Scenario, policy: &PolicyConfig) -> RunMetrics {
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, policy, &mut *t, None).unwrap()
}

#[test]
fn every_peer_preset_completes_a_mixed_fleet_scenario_with_sane_totals() {
    let presets = peer_presets();
    assert_eq!(presets.len(), 8, "{presets:?}");
    // The presets are usable by name in a scenario's policy list.
    let sc = scenario(&format!(
        "name: peers\nseed: 3\nmodel: gemma-27b\n\
         fleet:\n  - {{ name: pair, profile: rtx4090x2-27b }}\n  - {{ name: pro6000, profile: rtx-pro-6000-27b }}\n  - {{ name: mac, profile: mac-m3-ultra-27b }}\n\
         traffic:\n  - conversations: {{ start_s: 1, rate_per_s: 0.5, conversations: 30, turns: {{ uniform: {{ min: 2, max: 6 }} }}, user_tokens: {{ uniform: {{ min: 200, max: 1500 }} }}, output: {{ uniform: {{ min: 50, max: 300 }} }}, think_s: {{ exponential: {{ mean: 5 }} }}, system_prompt_tokens: 1024, max_prompt_tokens: 16000 }}\n\
         policies: [{}]\n",
        presets.join(", ")
    ));
    assert_eq!(sc.policies.len(), presets.len());
    for p in &sc.policies {
        let m = run_policy(&sc, p);
        assert!(m.requests > 60, "{}: {} requests", p.name, m.requests);
        assert_eq!(
            (m.completed, m.failed, m.rejected),
            (m.requests, 0, 0),
            "{}",
            p.name
        );
        let dispatched: u64 = m.workers.iter().map(|w| w.requests).sum();
        assert_eq!(dispatched, m.requests, "{}: shares sum to 1", p.name);
        let share_sum: f64 = m
            .workers
            .iter()
            .map(|w| w.requests as f64 / m.requests as f64)
            .sum();
        assert!((share_sum - 1.0).abs() < 1e-9, "{}", p.name);
        assert!(m.ttft.quantile_secs(0.5).unwrap() > 0.0, "{}", p.name);
        // Same seed, same outcome.
        let again = run_policy(&sc, p);
        assert_eq!(
            (again.events, again.end_ns, again.cached_tokens),
            (m.events, m.end_ns, m.cached_tokens),
            "{}",
            p.name
        );
    }
}

/// One conversation whose turns share a long system prompt and each other's history.
const ONE_CONVERSATION: &str = "name: one-conversation\nseed: 5\nmodel: gemma-27b\n\
fleet:\n  - { name: a, profile: rtx-pro-6000-27b }\n  - { name: b, profile: rtx-pro-6000-27b }\n  - { name: c, profile: rtx-pro-6000-27b }\n\
traffic:\n  - conversations: { start_s: 1, rate_per_s: 1, conversations: 1, turns: { uniform: { min: 10, max: 10 } }, user_tokens: { uniform: { min: 100, max: 200 } }, output: { uniform: { min: 50, max: 100 } }, think_s: { exponential: { mean: 2 } }, system_prompt_tokens: 2048, max_prompt_tokens: 16000 }\n\
policies: [cache-aware, equal/round-robin/no-affinity/none]\n";

#[test]
fn cache_aware_keeps_a_prefix_sharing_conversation_on_one_worker_while_the_fleet_is_balanced() {
    let sc = scenario(ONE_CONVERSATION);
    let aware = run_policy(&sc, &sc.policies[0]);
    let rr = run_policy(&sc, &sc.policies[1]);
    assert_eq!((aware.requests, rr.requests), (10, 10));
    // At most one request in flight: balanced. Turn 1 matches nothing and goes to the fewest
    // in flight (all 0: the first worker), every later turn matches > 30 % of its prompt there.
    let on: Vec<u64> = aware.workers.iter().map(|w| w.requests).collect();
    assert!(
        on.contains(&10),
        "cache-aware split the conversation: {on:?}"
    );
    // Round-robin moves it every turn (each engine still holds the system prompt after its
    // first turn), and the engines' cache hits show the difference.
    let rr_on: Vec<u64> = rr.workers.iter().map(|w| w.requests).collect();
    assert!(rr_on.iter().all(|&n| n < 10), "{rr_on:?}");
    assert!(
        aware.cached_tokens > rr.cached_tokens + 4 * 512,
        "cached tokens: cache-aware {} vs round-robin {}",
        aware.cached_tokens,
        rr.cached_tokens
    );
}

#[test]
fn least_load_reads_polled_engine_reports_and_other_policies_schedule_no_polls() {
    let sc = scenario(&ONE_CONVERSATION.replace(
        "policies: [cache-aware, equal/round-robin/no-affinity/none]",
        "policies: [least-load, \"equal/least-load/no-affinity/none\"]",
    ));
    // The preset and the same composition route alike.
    let a = run_policy(&sc, &sc.policies[0]);
    let b = run_policy(&sc, &sc.policies[1]);
    assert_eq!((a.events, a.end_ns), (b.events, b.end_ns));
    // A 1 ms poll adds one event per poll: the polls are real events of the run…
    let mut fast = sc.policies[0].clone();
    if let routelab_policies::Chooser::LeastLoad { poll, .. } = &mut fast.chooser {
        *poll = std::time::Duration::from_millis(1);
    }
    let f = run_policy(&sc, &fast);
    assert!(f.events > a.events + 1_000, "{} vs {}", f.events, a.events);
    assert_eq!(f.completed, 10);
    // …and a policy that reads no report gets none: on a one-worker fleet every policy routes
    // alike, so the event counts differ by the polls only.
    let one = scenario(
        &ONE_CONVERSATION
            .replace(
                "  - { name: b, profile: rtx-pro-6000-27b }\n  - { name: c, profile: rtx-pro-6000-27b }\n",
                "",
            )
            .replace(
                "policies: [cache-aware, equal/round-robin/no-affinity/none]",
                "policies: [equal/round-robin/no-affinity/none, kv-cost, cache-aware, least-load]",
            ),
    );
    assert_eq!(one.setup.workers.len(), 1);
    let events: Vec<u64> = one
        .policies
        .iter()
        .map(|p| run_policy(&one, p).events)
        .collect();
    assert_eq!(events[0], events[1], "{events:?}");
    assert_eq!(events[0], events[2], "{events:?}");
    assert!(events[3] > events[0], "least-load polls: {events:?}");
}
