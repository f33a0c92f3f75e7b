//! Common random numbers: every policy of a run sees the same customer traffic for a given seed,
//! so per-seed differences between policies cancel the traffic's noise (the paired statistics
//! of `compare` and `capacity` rest on this).
//!
//! The traffic stream is derived from the root seed alone (`Scenario::traffic_source`) and the
//! routing and engine noise draw from their own streams, so for open-loop traffic (Poisson,
//! bursts, on/off, long-prompt mixes, trace replay) the arrivals and lengths do not depend on
//! the policy. Probe traffic is the router's own and is not a customer request. Closed-loop
//! users and conversation turns are different by design: a follow-up is sent a think time after
//! its predecessor *completes*, so its arrival depends on the policy (and the generator draws
//! its lengths in completion order); only their first requests are common.

use routelab_policies::PolicyConfig;
use routelab_sim::{RequestRecord, Scenario, run};
use std::path::PathBuf;

fn load(rel: &str) -> Scenario {
    Scenario::load(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The customer requests of one run, in arrival order.
fn rows(sc: &Scenario, policy: &PolicyConfig, seed: u64) -> Vec<RequestRecord> {
    let setup = sc.setup_for_seed(seed);
    let mut traffic = sc.traffic_source(seed).expect("traffic");
    let mut rows: Vec<RequestRecord> = Vec::new();
    run(&setup, policy, &mut *traffic, Some(&mut rows)).expect("run");
    rows.sort_by_key(|r| r.id);
    rows
}

/// The traffic columns of the rows: id, arrival, prompt and output lengths.
fn traffic_columns(rows: &[RequestRecord]) -> Vec<(u64, u64, u32, u32)> {
    rows.iter()
        .map(|r| {
            (
                r.id,
                r.arrival_s.to_bits(),
                r.prompt_tokens,
                r.output_tokens,
            )
        })
        .collect()
}

fn assert_common(rel: &str, other: &str) {
    let sc = load(rel);
    let seed = sc.setup.seed;
    let a = &sc.policies[0];
    let b = PolicyConfig::from_name(other).expect("policy");
    let ra = rows(&sc, a, seed);
    let rb = rows(&sc, &b, seed);
    assert!(ra.len() > 100, "{rel}: enough traffic to mean something");
    assert_eq!(
        traffic_columns(&ra),
        traffic_columns(&rb),
        "{rel}: {} and {other} saw different traffic on seed {seed}",
        a.name
    );
    // The two policies really did route differently (else the check says nothing).
    let workers = |r: &[RequestRecord]| r.iter().map(|x| x.worker.clone()).collect::<Vec<_>>();
    assert_ne!(
        workers(&ra),
        workers(&rb),
        "{rel}: the policies route alike"
    );
    assert_ne!(
        ra.iter().map(|r| r.e2e_s).collect::<Vec<_>>(),
        rb.iter().map(|r| r.e2e_s).collect::<Vec<_>>(),
        "{rel}: the policies' latencies differ"
    );
    // Another seed is other traffic: the columns follow the seed, not the policy.
    assert_ne!(
        traffic_columns(&rows(&sc, a, seed + 1)),
        traffic_columns(&ra),
        "{rel}: seed {} repeats seed {seed}",
        seed + 1
    );
}

#[test]
fn two_policies_on_one_seed_see_the_same_poisson_arrivals_and_lengths() {
    assert_common(
        "../scenarios/seed/distant-node.yaml",
        "table/random/none/flat:24",
    );
}

#[test]
fn two_policies_on_one_seed_see_the_same_long_prompt_mix() {
    assert_common(
        "../scenarios/seed/long-prompts.yaml",
        "equal/round-robin/none/flat:24",
    );
}
