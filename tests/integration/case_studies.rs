//! Each bundled case study's finding, as its header comment states it. (The source's first five
//! findings — sixteen-at-once, cold-restart, live-sparse, identical-4090s, quiet-hours — are
//! asserted where the simulator is tested, in `sim/tests/integration/engine.rs`.)

use routelab_sim::{RunMetrics, Scenario, WorkerTotals, run};
use std::path::PathBuf;

fn load(rel: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(rel);
    Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn run_named(sc: &Scenario, name: &str) -> RunMetrics {
    let p = sc
        .policies
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("policy {name} not in {}", sc.name));
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, p, &mut *t, None).unwrap()
}

fn worker<'a>(m: &'a RunMetrics, name: &str) -> &'a WorkerTotals {
    m.workers.iter().find(|w| w.name == name).unwrap()
}

fn mean_e2e(m: &RunMetrics) -> f64 {
    m.e2e.mean_secs().unwrap()
}

#[test]
fn burst_probe_weights_and_cost() {
    let sc = load("seed/burst-probe.yaml");
    let v3 = run_named(&sc, "seed-v3");
    let (pro, pair) = (worker(&v3, "pro6000"), worker(&v3, "pair"));
    // 1.37 / 0.63 from 992 / 453, moved a little by the seeded per-epoch engine noise.
    assert!(
        (1.25..=1.45).contains(&pro.final_weight),
        "{}",
        pro.final_weight
    );
    assert!(
        (0.55..=0.75).contains(&pair.final_weight),
        "{}",
        pair.final_weight
    );
    // Three measurements per worker (registration + two on demand), each warm-up + measure.
    assert_eq!(v3.probe_measurements, 6);
    assert_eq!(v3.probe_bursts, 12);
    assert!(pro.requests > pair.requests);
    let v1 = run_named(&sc, "seed-v1");
    assert!(mean_e2e(&v3) < mean_e2e(&v1));
}

#[test]
fn capacity_affinity_beats_raw_counts_on_long_conversations() {
    let sc = load("seed/long-conversation.yaml");
    let raw = run_named(&sc, "probe/p2c:higher-weight/raw/flat");
    let cap = run_named(&sc, "probe/p2c:higher-weight/capacity/flat");
    assert!(cap.prefix_hit_fraction() > raw.prefix_hit_fraction());
    assert!(cap.ttft.mean_secs().unwrap() < raw.ttft.mean_secs().unwrap());
    // Capacity units keep more of the conversations on the faster holder.
    assert!(worker(&cap, "pro6000").requests > worker(&raw, "pro6000").requests);
}

#[test]
fn weighted_cap_beats_flat_24_when_traffic_reaches_it() {
    let sc = load("seed/flat-cap.yaml");
    let flat = run_named(&sc, "seed-v3");
    let weighted = run_named(&sc, "seed-next");
    assert!(weighted.output_tok_s() > flat.output_tok_s());
    assert!(mean_e2e(&weighted) < mean_e2e(&flat));
    assert!(worker(&weighted, "pro6000").requests > worker(&flat, "pro6000").requests);
}

#[test]
fn distant_node_carries_its_round_trip_in_the_probe() {
    let sc = load("seed/distant-node.yaml");
    let v3 = run_named(&sc, "seed-v3");
    let (near, far) = (worker(&v3, "near"), worker(&v3, "far"));
    let ratio = far.final_weight / near.final_weight;
    // A ~2.1 s burst plus 0.25 s of round trip: ~0.89.
    assert!(
        (0.85..0.95).contains(&ratio),
        "far/near weight ratio {ratio}"
    );
    let oracle = run_named(&sc, "oracle/p2c:higher-weight/capacity/flat");
    assert_eq!(
        worker(&oracle, "near").final_weight,
        worker(&oracle, "far").final_weight
    );
}

#[test]
fn decode_heavy_probe_misjudges_long_prompts() {
    let sc = load("seed/long-prompts.yaml");
    let v3 = run_named(&sc, "seed-v3");
    let (h100, r5090) = (worker(&v3, "h100"), worker(&v3, "r5090"));
    let weight_ratio = h100.final_weight / r5090.final_weight;
    assert!(weight_ratio < 1.3, "probe weights H100/5090 {weight_ratio}");
    let ttft_ratio = r5090.mean_ttft_s().unwrap() / h100.mean_ttft_s().unwrap();
    assert!(ttft_ratio > 1.8, "5090/H100 mean TTFT ratio {ttft_ratio}");
}

#[test]
fn trace_scenarios_replay_whole_and_rank_the_estimators() {
    // On the code trace the tail difference between v3 and v1 is not established (6 seeds
    // since issue 10's first-token accounting: e2e p99 +2.2 % [-10.3, +14.6]; before it, also
    // undetermined in docs/findings.md), so one seed's tail may fall either way: there v3 is
    // held to its established lead on the mean (-8.0 % [-9.8, -6.1]).
    for (file, rows, tail_established) in [
        ("traces/azure-conv.yaml", 19_366, true),
        ("traces/azure-code.yaml", 8_819, false),
        ("traces/mooncake-conv.yaml", 12_031, true),
    ] {
        let sc = load(file);
        let v1 = run_named(&sc, "seed-v1");
        let v3 = run_named(&sc, "seed-v3");
        let oracle = run_named(&sc, "oracle/sed/capacity/weighted:24");
        for m in [&v1, &v3, &oracle] {
            assert_eq!(
                m.requests, rows,
                "{file}: every trace row becomes a request"
            );
            assert_eq!(m.completed + m.failed + m.rejected, rows);
        }
        // Measured weights do not lose to the GPU-name table on the tail (on the mean where the
        // tail is undetermined), and the oracle bounds both.
        let p99 = |m: &RunMetrics| m.e2e.quantile_secs(0.99).unwrap();
        if tail_established {
            assert!(
                p99(&v3) <= p99(&v1) * 1.02,
                "{file}: v3 p99 {} vs v1 {}",
                p99(&v3),
                p99(&v1)
            );
        } else {
            assert!(
                mean_e2e(&v3) <= mean_e2e(&v1),
                "{file}: v3 mean {} vs v1 {}",
                mean_e2e(&v3),
                mean_e2e(&v1)
            );
        }
        assert!(mean_e2e(&oracle) <= mean_e2e(&v3) * 1.02, "{file}");
    }
}
