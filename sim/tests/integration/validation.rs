//! Scenario validation: every error is the one located error, naming file, line, field and
//! what would be valid.

use routelab_sim::Scenario;
use std::path::Path;

/// A scenario beside the bundled hardware profiles (so `profile:` names resolve).
fn validate(body: &str) -> Result<Scenario, routelab_policies::InputError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/seed/test-inline.yaml");
    Scenario::from_yaml(body, &path)
}

const HEAD: &str = "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: rtx4090-27b }\n";

#[test]
fn a_valid_scenario_passes() {
    let s = validate(&format!(
        "{HEAD}traffic:\n  - poisson: {{ rate_per_s: 1, duration_s: 10, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies: [seed-v1]\n"
    ));
    assert!(s.is_ok(), "{}", s.unwrap_err());
}

#[test]
fn huge_durations_are_refused_with_the_valid_range() {
    // Regression: 1e20 seconds saturated the nanosecond conversion silently.
    let e = validate(&format!(
        "{HEAD}traffic:\n  - poisson: {{ rate_per_s: 1, duration_s: 1e20, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies: [seed-v1]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "traffic[0].poisson.duration_s", "{e}");
    assert_eq!(e.line, Some(6), "{e}");
    assert!(
        e.to_string()
            .contains("expected a finite number of seconds from 0 to"),
        "{e}"
    );
}

#[test]
fn an_unknown_preset_lists_the_valid_ones_at_its_line() {
    let e = validate(&format!(
        "{HEAD}traffic:\n  - burst: {{ at_s: 0, size: 2, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies: [seed-v1, nope]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "policies[1].preset");
    assert_eq!(e.line, Some(7));
    assert!(e.valid.as_deref().unwrap_or("").contains("seed-v3"), "{e}");
    // The catalog's list: the source's presets, then the field's routers.
    let valid = routelab_policies::catalog::joined(&routelab_policies::PRESETS, ", ");
    assert!(
        valid.starts_with("seed-v1, seed-v2, seed-v3-cold, seed-v3, seed-next, cache-aware"),
        "{valid}"
    );
    assert!(e.to_string().ends_with(&format!("; valid: {valid}")), "{e}");
}

#[test]
fn a_full_policy_error_names_the_field_inside_it() {
    let e = validate(&format!(
        "{HEAD}traffic:\n  - burst: {{ at_s: 0, size: 2, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies:\n  - {{ name: x, preset: seed-v3, weights: {{ kind: probe, clamp: [3, 1] }} }}\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "policies[0].weights.clamp", "{e}");
    assert_eq!(e.line, Some(8), "{e}");
    assert!(e.message.contains("inverted"), "{e}");
}

#[test]
fn a_missing_profile_lists_the_available_ones() {
    let e = validate(
        "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: no-such-profile }\ntraffic:\n  - burst: { at_s: 0, size: 2, prompt: { fixed: 100 }, output: { fixed: 10 } }\npolicies: [seed-v1]\n",
    )
    .unwrap_err();
    assert_eq!(e.field, "fleet[0].profile");
    assert!(e.message.contains("available: "), "{e}");
    assert!(e.message.contains("rtx4090-27b"), "{e}");
}

#[test]
fn trap5_a_source_the_machine_cannot_hold_is_refused_with_the_figure() {
    // Regression (issue 29): `poisson: { rate_per_s: 1e6 }` passed validation and the run took
    // all the memory it could. A million requests a second for a day on one 4090: 8.64e10
    // requests, nearly all waiting, ~15 TB at 176 B each.
    let e = validate(&format!(
        "{HEAD}traffic:\n  - poisson: {{ rate_per_s: 1e6, duration_s: 86400, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies: [seed-v1]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "traffic[0]", "{e}");
    assert_eq!(e.line, Some(6), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("would keep about 8.640e10 requests waiting at the gateway")
            && m.contains("the fleet serves at most")
            && m.contains("at 176 B a waiting request is 15.2 TB of memory")
            && m.contains("this machine allows")
            && m.contains("a run holds every waiting request in memory"),
        "{m}"
    );
    // The same rate for a second's worth of requests fits (they wait, a million of them).
    assert!(
        validate(&format!(
            "{HEAD}traffic:\n  - poisson: {{ rate_per_s: 1e6, count: 1000000, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\npolicies: [seed-v1]\n"
        ))
        .is_ok()
    );
    // A fleet that keeps up is never refused, however many requests: the bundled benchmark,
    // 1,000,000 requests at 133 req/s on 64 workers.
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/bench/fleet-64.yaml");
    assert!(Scenario::load(&bench).is_ok());
}

#[test]
fn a_prefill_probe_longer_than_a_context_window_is_located_at_its_policy() {
    let head = "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: rtx4090-27b, context_window: 4096 }\n  - { name: b, profile: rtx4090-27b, context_window: 2048 }\n";
    let traffic = "traffic:\n  - poisson: { rate_per_s: 1, duration_s: 10, prompt: { fixed: 100 }, output: { fixed: 10 } }\n";
    let policy = |tokens: u32| {
        format!(
            "policies:\n  - predictive\n  - {{ name: long, preset: predictive, weights: {{ kind: probe, prefill_requests: 2, prefill_prompt_tokens: {tokens} }} }}\n"
        )
    };
    let e = validate(&format!("{head}{traffic}{}", policy(2048))).unwrap_err();
    assert_eq!((e.field.as_str(), e.line), ("policies[1]", Some(10)), "{e}");
    assert!(
        e.message.contains("policy `long` on worker `b`")
            && e.message.contains("prefill_prompt_tokens to at most 2047"),
        "{e}"
    );
    // One that fits, and predictive's default (fitted to each window), pass.
    let ok = validate(&format!("{head}{traffic}{}", policy(2047)));
    assert!(ok.is_ok(), "{}", ok.unwrap_err());
}
