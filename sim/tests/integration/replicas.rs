//! Several gateway replicas (`gateways:`): one replica is exactly one gateway, each split rule
//! spreads requests as it says, each sharing mode shares what it says, and bad blocks are
//! located errors.

use routelab_policies::PolicyConfig;
use routelab_sim::{Gateways, RequestRecord, RunMetrics, Scenario, Share, Split, run};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A bundled scenario's file and text.
fn bundled(rel: &str) -> (PathBuf, String) {
    let path = root().join("../scenarios").join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

/// The scenario text with a `gateways:` block appended.
fn with_block(path: &Path, text: &str, block: &str) -> Result<Scenario, String> {
    Scenario::from_yaml(&format!("{text}\ngateways: {block}\n"), path).map_err(|e| e.to_string())
}

fn run_rows(sc: &Scenario, policy: &PolicyConfig) -> (RunMetrics, Vec<RequestRecord>) {
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    let mut rows: Vec<RequestRecord> = Vec::new();
    let m = run(&sc.setup, policy, &mut *t, Some(&mut rows)).unwrap();
    (m, rows)
}

fn run_policy(sc: &Scenario, policy: &PolicyConfig) -> RunMetrics {
    run_rows(sc, policy).0
}

fn policy(sc: &Scenario, name: &str) -> PolicyConfig {
    sc.policies.iter().find(|p| p.name == name).unwrap().clone()
}

/// A small scenario of our own: two unequal workers, the given traffic and policy.
fn small(traffic: &str, policies: &str) -> Scenario {
    let yaml = format!(
        "seed: 3\nmodel: gemma-27b\nfleet:\n  - {{ name: pair, profile: rtx4090x2-27b }}\n  \
         - {{ name: pro6000, profile: rtx-pro-6000-27b }}\ntraffic:\n  - {traffic}\n\
         policies: {policies}\n"
    );
    Scenario::from_yaml(&yaml, &root().join("../scenarios/seed/inline.yaml"))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn gateways(replicas: u32, split: Split, share: Share) -> Gateways {
    Gateways {
        replicas,
        split,
        share,
    }
}

fn with(sc: &Scenario, g: Gateways) -> Scenario {
    let mut sc = sc.clone();
    sc.setup.gateways = g;
    sc
}

#[test]
fn one_replica_is_byte_identical_to_no_gateways() {
    // Probes (burst-probe), prefixes and affinity (long-conversation), restarts (cold-restart).
    let cases = [
        ("seed/burst-probe.yaml", "seed-v3"),
        ("seed/cold-restart.yaml", "seed-v3"),
        ("seed/long-conversation.yaml", "raw-units"),
    ];
    for (file, name) in cases {
        let (path, text) = bundled(file);
        let plain = Scenario::from_yaml(&text, &path).unwrap();
        let p = plain
            .policies
            .iter()
            .find(|p| p.name == name)
            .unwrap_or(&plain.policies[0])
            .clone();
        let (m0, rows0) = run_rows(&plain, &p);
        assert!(m0.completed > 0, "{file}");
        for block in [
            "{ replicas: 1 }",
            "{ replicas: 1, split: random, share: probes }",
            "{ replicas: 1, split: hash-by-session, share: probes-and-load, sync_interval_s: 1 }",
        ] {
            let one = with_block(&path, &text, block).unwrap();
            let (m1, rows1) = run_rows(&one, &p);
            assert!(m1.replicas.is_empty(), "{file} {block}");
            assert_eq!(format!("{m0:?}"), format!("{m1:?}"), "{file} {block}");
            assert_eq!(rows0, rows1, "{file} {block}");
        }
    }
}

#[test]
fn per_replica_totals_add_up_to_the_whole_run() {
    let (path, text) = bundled("seed/burst-probe.yaml");
    let sc = with_block(
        &path,
        &text,
        "{ replicas: 4, split: random, share: probes }",
    )
    .unwrap();
    let m = run_policy(&sc, &policy(&sc, "seed-v3"));
    assert_eq!(m.replicas.len(), 4);
    assert_eq!(m.replicas.iter().map(|r| r.routed).sum::<u64>(), m.requests);
    assert_eq!(
        m.replicas.iter().map(|r| r.completed).sum::<u64>(),
        m.completed
    );
    assert_eq!(
        m.replicas.iter().map(|r| r.e2e.count()).sum::<u64>(),
        m.e2e.count()
    );
    // The whole run's weight error is every replica's over every worker.
    let whole = m.weight_error();
    let parts = m
        .replicas
        .iter()
        .fold(routelab_sim::results::WeightError::default(), |a, r| {
            a.plus(r.weight_error)
        });
    assert!((whole.area_s - parts.area_s).abs() <= 1e-9 * whole.area_s.max(1.0));
    assert!((whole.active_s - parts.active_s).abs() <= 1e-9 * whole.active_s.max(1.0));
}

#[test]
fn round_robin_alternates_exactly_and_random_spreads_about_evenly() {
    let sc = small(
        "poisson: { rate_per_s: 2, duration_s: 600, prompt: { fixed: 200 }, output: { fixed: 64 } }",
        "[seed-v1]",
    );
    let p = sc.policies[0].clone();
    let rr = run_policy(&with(&sc, gateways(3, Split::RoundRobin, Share::None)), &p);
    let n = rr.requests;
    assert!(n > 1000);
    let routed: Vec<u64> = rr.replicas.iter().map(|r| r.routed).collect();
    // Request k (in arrival order) goes to replica k mod 3.
    let expect: Vec<u64> = (0..3).map(|r| (n + 2 - r) / 3).collect();
    assert_eq!(routed, expect);

    let random = run_policy(&with(&sc, gateways(4, Split::Random, Share::None)), &p);
    let quarter = random.requests as f64 / 4.0;
    for r in &random.replicas {
        let dev = (r.routed as f64 - quarter).abs() / quarter;
        assert!(
            dev < 0.12,
            "{:?}",
            random.replicas.iter().map(|r| r.routed).collect::<Vec<_>>()
        );
    }
}

#[test]
fn hash_by_session_keeps_a_session_on_one_replica() {
    // One closed-loop user: one session, all its requests to one replica.
    let sc = small(
        "closed_loop: { users: 1, think_s: { fixed: 1 }, duration_s: 300, prompt: { fixed: 200 }, output: { fixed: 32 } }",
        "[seed-v1]",
    );
    let p = sc.policies[0].clone();
    let hashed = run_policy(
        &with(&sc, gateways(8, Split::HashBySession, Share::None)),
        &p,
    );
    assert!(hashed.requests > 20);
    let busy: Vec<u64> = hashed
        .replicas
        .iter()
        .map(|r| r.routed)
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(busy, [hashed.requests]);
    // The same user under round robin reaches every replica.
    let rr = run_policy(&with(&sc, gateways(8, Split::RoundRobin, Share::None)), &p);
    assert!(rr.replicas.iter().all(|r| r.routed > 0));
    // Five users reach at most five replicas, each user's requests on one.
    let five = small(
        "closed_loop: { users: 5, think_s: { fixed: 1 }, duration_s: 300, prompt: { fixed: 200 }, output: { fixed: 32 } }",
        "[seed-v1]",
    );
    let m = run_policy(
        &with(&five, gateways(16, Split::HashBySession, Share::None)),
        &p,
    );
    assert!(m.replicas.iter().filter(|r| r.routed > 0).count() <= 5);
}

#[test]
fn share_none_probes_on_every_replica_and_share_probes_once_per_worker() {
    let (path, text) = bundled("seed/sixteen-at-once.yaml");
    let plain = Scenario::from_yaml(&text, &path).unwrap();
    let p = policy(&plain, "seed-v3");
    let one = run_policy(&plain, &p);
    // Warm-up and measurement per worker.
    assert_eq!(one.probe_bursts, 4);

    let none = run_policy(
        &with(&plain, gateways(3, Split::RoundRobin, Share::None)),
        &p,
    );
    assert_eq!(none.probe_bursts, 3 * one.probe_bursts);
    assert_eq!(none.probe_measurements, 3 * one.probe_measurements);

    for share in [
        Share::Probes,
        Share::ProbesAndLoad {
            sync_interval_ns: 500_000_000,
        },
    ] {
        let shared = run_policy(&with(&plain, gateways(3, Split::RoundRobin, share)), &p);
        assert_eq!(shared.probe_bursts, one.probe_bursts, "{share:?}");
        assert_eq!(
            shared.probe_measurements, one.probe_measurements,
            "{share:?}"
        );
        let first = &shared.replicas[0].final_weights;
        assert_eq!(first.len(), 2);
        assert!(
            first.iter().all(|w| (w - 1.0).abs() > 0.05),
            "measured: {first:?}"
        );
        for r in &shared.replicas {
            assert_eq!(&r.final_weights, first, "{share:?}");
            // Equal weights all along: equal weight error.
            assert_eq!(r.weight_error, shared.replicas[0].weight_error, "{share:?}");
        }
        // One shared burst measures an engine the others leave alone: the single gateway's
        // weights.
        for (w, totals) in shared.replicas[0].final_weights.iter().zip(&one.workers) {
            assert!(
                (w - totals.final_weight).abs() < 1e-9,
                "{w} vs {}",
                totals.final_weight
            );
        }
    }
}

#[test]
fn exchanging_load_makes_herding_no_worse() {
    // Eight replicas, each seeing an eighth of a busy stream, least-in-flight routing on two
    // unequal workers: without the exchange each balances only its own requests.
    let sc = small(
        "poisson: { rate_per_s: 3, duration_s: 900, prompt: { uniform: { min: 200, max: 1500 } }, output: { uniform: { min: 64, max: 384 } } }",
        "[\"oracle/jsq\"]",
    );
    let p = sc.policies[0].clone();
    let one = run_policy(&sc, &p);
    let none = run_policy(&with(&sc, gateways(8, Split::Random, Share::None)), &p);
    let load = run_policy(
        &with(
            &sc,
            gateways(
                8,
                Split::Random,
                Share::ProbesAndLoad {
                    sync_interval_ns: 200_000_000,
                },
            ),
        ),
        &p,
    );
    let mean = |m: &RunMetrics| m.e2e.mean_secs().unwrap();
    assert!(
        mean(&load) <= mean(&none) * 1.01,
        "exchange {:.3} s vs none {:.3} s (one gateway {:.3} s)",
        mean(&load),
        mean(&none),
        mean(&one)
    );
}

#[test]
fn bad_gateways_blocks_are_located_errors() {
    let (path, text) = bundled("seed/sixteen-at-once.yaml");
    let cases = [
        (
            "{ replicas: 0 }",
            "gateways.replicas",
            "a whole number from 1 to 64",
        ),
        (
            "{ replicas: 65 }",
            "gateways.replicas",
            "a whole number from 1 to 64",
        ),
        (
            "{ replicas: 2.5 }",
            "gateways.replicas",
            "a whole number from 1 to 64",
        ),
        (
            "{ replicas: 2, split: sticky }",
            "gateways.split",
            "valid: random, hash-by-session, round-robin",
        ),
        (
            "{ replicas: 2, share: everything }",
            "gateways.share",
            "valid: none, probes, probes-and-load",
        ),
        (
            "{ replicas: 2, share: probes, sync_interval_s: 1 }",
            "gateways.sync_interval_s",
            "only `share: probes-and-load`",
        ),
        (
            "{ replicas: 2, sync_interval_s: 1 }",
            "gateways.sync_interval_s",
            "only `share: probes-and-load`",
        ),
        (
            "{ replicas: 2, share: probes-and-load }",
            "gateways.sync_interval_s",
            "is missing",
        ),
        (
            "{ replicas: 2, share: probes-and-load, sync_interval_s: 0 }",
            "gateways.sync_interval_s",
            "0 is not valid",
        ),
        (
            "{ replicas: 2, share: engine-truth }",
            "gateways.sync_interval_s",
            "polls the engines",
        ),
        (
            "{ replicas: 2, share: probes-and-load, sync_interval_s: 1, bus_latency_s: 0.001 }",
            "gateways.bus_latency_s",
            "only `share: dispatch-stream` and `route-and-reserve`",
        ),
        (
            "{ replicas: 2, share: dispatch-stream, bus_latency_s: -1 }",
            "gateways.bus_latency_s",
            "-1",
        ),
        (
            "{ replicas: 2, share: dispatch-stream, sync_interval_s: 1 }",
            "gateways.sync_interval_s",
            "is given with `share: dispatch-stream`",
        ),
        (
            "{ replicas: 2, share: route-and-reserve, spread_s: 0.01 }",
            "gateways.spread_s",
            "only `share: dispatch-stream` spreads",
        ),
        (
            "{ replicas: 2, share: dispatch-stream, spread_s: -0.01 }",
            "gateways.spread_s",
            "-0.01",
        ),
        ("{ replicas: 2, shared: probes }", "gateways", "shared"),
    ];
    let line = text.lines().count() + 2;
    for (block, field, says) in cases {
        let e = with_block(&path, &text, block).expect_err(block);
        assert!(e.contains(field), "{block}: {e}");
        assert!(e.contains(says), "{block}: {e}");
        assert!(e.contains("sixteen-at-once.yaml"), "{block}: {e}");
        assert!(
            e.contains(&format!(":{line}:")),
            "{block}: line {line}: {e}"
        );
    }
}

#[test]
fn exchanged_counts_hold_the_cap_fleet_wide() {
    // A flat cap of 4 per worker and a stream that would keep more in flight: without the
    // exchange each of 8 replicas caps only its own requests; with it, a replica counts the
    // others' requests too, so far fewer than 8 × 4 run on a worker at once.
    let sc = small(
        "poisson: { rate_per_s: 12, duration_s: 300, prompt: { fixed: 500 }, output: { fixed: 256 } }",
        "[\"equal/p2c:higher-weight/no-affinity/flat:4\"]",
    );
    let mut sc = sc;
    sc.setup.timeline_ns = 500_000_000;
    let p = sc.policies[0].clone();
    let peak = |m: &RunMetrics| m.timeline.iter().map(|r| r.in_flight).max().unwrap();
    let one = run_policy(&sc, &p);
    let none = run_policy(&with(&sc, gateways(8, Split::Random, Share::None)), &p);
    let load = run_policy(
        &with(
            &sc,
            gateways(
                8,
                Split::Random,
                Share::ProbesAndLoad {
                    sync_interval_ns: 50_000_000,
                },
            ),
        ),
        &p,
    );
    assert_eq!(peak(&one), 4);
    assert!(peak(&none) > 8, "{}", peak(&none));
    assert!(
        peak(&load) < peak(&none),
        "{} vs {}",
        peak(&load),
        peak(&none)
    );
}

/// The most requests any worker held at a timeline sample, over every replica.
fn peak_in_flight(m: &RunMetrics) -> u32 {
    m.timeline.iter().map(|r| r.in_flight).max().unwrap_or(0)
}

/// The same after the first minute: once every replica has heard from the others (or polled
/// the engines) at least once.
fn settled_peak_in_flight(m: &RunMetrics) -> u32 {
    m.timeline
        .iter()
        .filter(|r| r.t_s >= 60.0)
        .map(|r| r.in_flight)
        .max()
        .unwrap_or(0)
}

#[test]
fn a_reserved_dispatch_keeps_the_fleet_wide_cap_that_unshared_replicas_overrun() {
    // Two workers under a flat cap of 4, far more load than 8 slots serve: four replicas that
    // share nothing each fill the cap on their own; replicas that reserve before they dispatch
    // see each other's requests and never hold more than 4 on a worker between them.
    let sc = small(
        "poisson: { rate_per_s: 30, duration_s: 120, prompt: { fixed: 2000 }, output: { fixed: 256 } }",
        "[\"equal/jsq:higher-weight/no-affinity/flat:4\"]",
    );
    let p = sc.policies[0].clone();
    let none = run_policy(&with(&sc, gateways(4, Split::RoundRobin, Share::None)), &p);
    assert!(!none.timeline.is_empty());
    assert!(peak_in_flight(&none) > 4, "{}", peak_in_flight(&none));
    let reserve = Share::RouteAndReserve {
        bus_latency_ns: 1_000_000,
    };
    let reserved = run_policy(&with(&sc, gateways(4, Split::RoundRobin, reserve)), &p);
    assert_eq!(peak_in_flight(&reserved), 4);
    assert_eq!(reserved.requests, none.requests);
}

#[test]
fn the_dispatch_stream_and_engine_truth_share_load_and_stay_deterministic() {
    // The same overload: with each replica learning the others' dispatches one bus hop later
    // (or the engines' counts every 0.5 s), the workers are never loaded like four independent
    // gateways load them, and a run is the same run twice.
    let sc = small(
        "poisson: { rate_per_s: 30, duration_s: 120, prompt: { fixed: 2000 }, output: { fixed: 256 } }",
        "[\"equal/jsq:higher-weight/no-affinity/flat:4\"]",
    );
    let p = sc.policies[0].clone();
    let none = settled_peak_in_flight(&run_policy(
        &with(&sc, gateways(4, Split::RoundRobin, Share::None)),
        &p,
    ));
    assert_eq!(none, 16, "four replicas, each at its cap of 4");
    for share in [
        Share::DispatchStream {
            bus_latency_ns: 1_000_000,
            spread_ns: 0,
        },
        Share::EngineTruth {
            poll_interval_ns: 500_000_000,
        },
    ] {
        let sc = with(&sc, gateways(4, Split::RoundRobin, share));
        let (m, rows) = run_rows(&sc, &p);
        let peak = settled_peak_in_flight(&m);
        assert!(peak <= 8, "{share:?}: {peak} vs {none} unshared");
        let (again, rows_again) = run_rows(&sc, &p);
        assert_eq!(format!("{m:?}"), format!("{again:?}"), "{share:?}");
        assert_eq!(rows, rows_again, "{share:?}");
    }
}

#[test]
fn a_spread_dispatch_stream_orders_simultaneous_decisions_that_the_stream_alone_herds() {
    // Bursts of 8 requests at one instant, one to each of 8 replicas (round robin), on two
    // workers under join-the-shortest-queue. Deciding at the same instant on the same view,
    // the replicas of a plain stream all send their request to the same worker; holding each
    // request a random time up to 10 ms (50 bus hops) orders the decisions, so most replicas
    // see the earlier ones and the burst is shared.
    let sc = small(
        "burst: { size: 8, repeats: 6, period_s: 30, prompt: { fixed: 500 }, output: { fixed: 32 } }",
        "[\"equal/jsq:higher-weight/no-affinity/none\"]",
    );
    let p = sc.policies[0].clone();
    let stream = Share::DispatchStream {
        bus_latency_ns: 200_000,
        spread_ns: 0,
    };
    let worst_share = |share: Share| {
        let (_, mut rows) = run_rows(&with(&sc, gateways(8, Split::RoundRobin, share)), &p);
        assert_eq!(rows.len(), 48);
        rows.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        let mut worst = 0;
        for burst in rows.chunks(8) {
            assert_eq!(
                burst[0].arrival_s, burst[7].arrival_s,
                "one burst, one instant"
            );
            let pair = burst.iter().filter(|r| r.worker == "pair").count();
            worst = worst.max(pair.max(8 - pair));
        }
        worst
    };
    let herded = worst_share(stream);
    assert_eq!(
        herded, 8,
        "a plain stream sends a whole burst to one worker"
    );
    let spread = stream.with_spread(10_000_000).unwrap();
    let spread_worst = worst_share(spread);
    assert!(
        spread_worst <= 6,
        "a spread stream shares every burst ({spread_worst} of 8 on one worker at worst)"
    );
    // Deterministic, and a spread is not drawn by one replica.
    let sc8 = with(&sc, gateways(8, Split::RoundRobin, spread));
    assert_eq!(run_rows(&sc8, &p).1, run_rows(&sc8, &p).1);
    let one = run_rows(&with(&sc, gateways(1, Split::RoundRobin, spread)), &p).1;
    assert_eq!(one, run_rows(&sc, &p).1, "one replica holds nothing");
}
