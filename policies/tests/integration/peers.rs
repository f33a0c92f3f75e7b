//! The field's routers through the public `Router` API, as a host (the simulator, the gateway)
//! drives them: presets by name, engine reports, charges handed back, observed input speed.

use crate::common::{model, policy, rng, secs, spec};
use routelab_policies::{
    Charge, Completion, EngineReport, ModelId, PolicyConfig, PolicyEntry, RouteRequest, Router,
    Time, WorkerId,
};
use std::time::Duration;

fn two_workers(name: &str) -> (Router, WorkerId, WorkerId) {
    let mut r = Router::new(policy(name));
    let a = r.register(Time::ZERO, spec("a", &["H100"]));
    let b = r.register(Time::ZERO, spec("b", &["H100"]));
    (r, a, b)
}

fn req(m: ModelId, prompt: u32, prefix: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model: m,
        context_tokens: prompt + 256,
        prefix,
        prompt_tokens: prompt,
        session: None,
    }
}

#[test]
fn every_peer_preset_loads_as_the_gateway_and_scenarios_write_it() {
    let presets: Vec<&str> = PolicyConfig::field_presets().collect();
    assert_eq!(presets.len(), 8, "{presets:?}");
    for name in presets {
        let cfg = PolicyEntry::Name(name.into()).build().unwrap();
        assert_eq!(cfg.name, name);
        let poll = Router::new(cfg).engine_poll_interval();
        assert_eq!(poll.is_some(), name == "least-load", "{name}");
    }
    assert_eq!(
        Router::new(policy("least-load")).engine_poll_interval(),
        Some(Duration::from_secs(10))
    );
    assert_eq!(Router::new(policy("seed-v3")).engine_poll_interval(), None);
}

#[test]
fn least_load_follows_the_engine_reports_then_the_local_count_between_polls() {
    let (mut r, a, b) = two_workers("least-load");
    let m = model(&r);
    let mut g = rng(1);
    let busy = EngineReport {
        kv_used_fraction: 0.5,
        queued_prompt_tokens: 20_000,
        running_tokens: 10_000,
        generation_tok_s: 1_000.0,
    };
    let idle = EngineReport {
        generation_tok_s: 1_000.0,
        ..EngineReport::default()
    };
    r.engine_report(secs(0.0), a, busy);
    r.engine_report(secs(0.0), b, idle);
    // a: 30 s of work + 0.15 s × 0.5 / 0.5 of KV penalty = 30.15 s; b: none. b takes every
    // request until its local count (1 s per 1,000 tokens) passes that, then they alternate.
    let picks: Vec<WorkerId> = (0..36)
        .map(|_| {
            r.route(secs(1.0), &req(m, 1_000, &[]), &mut g)
                .unwrap()
                .worker
        })
        .collect();
    assert!(picks[..31].iter().all(|&w| w == b), "{picks:?}");
    assert_eq!(picks[31..], [a, b, a, b, a], "{picks:?}");
    // The next poll says b finished everything: b is the choice again.
    r.engine_report(secs(10.0), b, idle);
    assert_eq!(
        r.route(secs(10.0), &req(m, 1_000, &[]), &mut g)
            .unwrap()
            .worker,
        b
    );
}

#[test]
fn a_charge_handed_back_releases_exactly_what_was_charged() {
    let (mut r, a, _) = two_workers("kv-cost");
    let m = model(&r);
    let mut g = rng(2);
    let prefix = [11u64, 12, 13];
    let first = r.route(secs(0.0), &req(m, 1_400, &prefix), &mut g).unwrap();
    assert_eq!(
        first.charge,
        Charge {
            tokens: 1_400,
            uncached: 1_400,
            ..Charge::NONE
        }
    );
    // The same prompt again: the router believes its 3 blocks (1,400 tokens) cached there.
    let mut second = r.route(secs(0.1), &req(m, 1_400, &prefix), &mut g).unwrap();
    assert_eq!(second.worker, first.worker);
    assert_eq!(second.charge.uncached, 0);
    let w = first.worker;
    let s = *r.signals(w).unwrap();
    assert_eq!((s.tokens_in_flight, s.uncached_in_flight), (2_800, 1_400));
    r.first_token(secs(0.2), w, &mut second.charge);
    r.fail(secs(0.3), w, second.charge);
    let c = Completion {
        prompt_tokens: 1_400,
        output_tokens: 10,
        dispatched_at: secs(0.0),
        first_token_at: secs(0.5),
        completed_at: secs(1.0),
    };
    r.complete(secs(1.0), w, first.charge, &c);
    let s = *r.signals(w).unwrap();
    assert_eq!((s.tokens_in_flight, s.uncached_in_flight), (0, 0));
    // Pulsar's ring weight: 1,400 prompt tokens to the first token in 0.5 s.
    assert_eq!(s.peak_input_tok_s, 2_800.0);
    assert_eq!(
        r.signals(if w == a { WorkerId(1) } else { a })
            .unwrap()
            .peak_input_tok_s,
        0.0
    );
}
