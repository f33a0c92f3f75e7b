//! The weight error: `|ln(weight / oracle weight)|`, integrated exactly over each worker's
//! active time, against the oracle at each engine's operating concurrency (`weight_error`) and
//! at the scenario's `oracle_concurrency` (`weight_error_at_oracle_concurrency`).

use routelab_policies::PolicyConfig;
use routelab_sim::results::WEIGHT_ERROR_WARMUP_S;
use routelab_sim::{RunMetrics, Scenario, run};
use std::path::PathBuf;

fn load(rel: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    Scenario::load(path).unwrap_or_else(|e| panic!("{e}"))
}

fn run_policy(sc: &Scenario, policy: &PolicyConfig) -> RunMetrics {
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, policy, &mut *t, None).unwrap()
}

fn policy(sc: &Scenario, name: &str) -> PolicyConfig {
    sc.policies
        .iter()
        .find(|p| p.name == name)
        .cloned()
        .unwrap_or_else(|| PolicyConfig::from_name(name).unwrap())
}

#[test]
fn table_weights_are_off_by_the_log_of_their_ratio_to_the_true_capacities() {
    // seed-v1 on the source's pair: the table says 3.5 (two 4090s) and 1.0 (a PRO 6000 it does
    // not know); the truth is each engine's aggregate at the oracle's concurrency relative to
    // the median of the two. Both weights are constant, so each worker's error is one log.
    let sc = load("../scenarios/seed/sixteen-at-once.yaml");
    let m = run_policy(&sc, &policy(&sc, "seed-v1"));
    let caps: Vec<f64> = sc
        .setup
        .workers
        .iter()
        .map(|w| w.profile.aggregate_tok_s(sc.setup.oracle_concurrency))
        .collect();
    let median = (caps[0] + caps[1]) / 2.0;
    let clamp = routelab_policies::Clamp::SOURCE;
    let table = [3.5, 1.0];
    let end_s = m.end_ns as f64 / 1e9;
    for (i, w) in m.workers.iter().enumerate() {
        let oracle = clamp.apply(caps[i] / median);
        let want = (table[i] / oracle).ln().abs();
        let e = &w.weight_error_at_oracle_concurrency;
        let got = e.mean().unwrap();
        assert!((got - want).abs() < 1e-12, "{}: {got} vs {want}", w.name);
        // Active from registration (at 0 s) to the end of the run.
        assert!((e.active_s - end_s).abs() < 1e-9, "{}", w.name);
        // The run ends before the 10th minute: no steady-state figure.
        assert!(end_s < WEIGHT_ERROR_WARMUP_S);
        assert_eq!(e.after_warmup(), None);
    }
    // The run's figure is the time-weighted mean over workers: here both were active alike.
    let run_mean = m.weight_error_at_oracle_concurrency().mean().unwrap();
    let per_worker: Vec<f64> = m
        .workers
        .iter()
        .map(|w| w.weight_error_at_oracle_concurrency.mean().unwrap())
        .collect();
    assert!((run_mean - (per_worker[0] + per_worker[1]) / 2.0).abs() < 1e-12);
}

#[test]
fn a_restart_counts_the_unmeasured_gap_and_not_the_disconnected_time() {
    // cold-restart: the PRO 6000 restarts at 600 s, is away until it registers again at 665 s
    // (not counted), then is unmeasured (1.0) until its probe answers. The pair is always up.
    let sc = load("../scenarios/seed/cold-restart.yaml");
    let m = run_policy(&sc, &policy(&sc, "seed-v3"));
    let end_s = m.end_ns as f64 / 1e9;
    let pair = &m.workers[0].weight_error_at_oracle_concurrency;
    let pro = &m.workers[1].weight_error_at_oracle_concurrency;
    assert!((pair.active_s - end_s).abs() < 1e-9);
    assert!(
        (pro.active_s - (end_s - 65.0)).abs() < 1e-6,
        "{}",
        pro.active_s
    );
    assert!((pro.active_after_s - (end_s - 665.0)).abs() < 1e-6);
    // The warm probe lands within a few per cent of the truth; the unmeasured seconds after the
    // restart and the cold first measurement dominate what is left.
    assert!(pro.mean().unwrap() < 0.1, "{pro:?}");
}

/// The bundled Mooncake scenario cut to its first 20 minutes: 10 of warm-up, 10 measured.
/// Under a second for the four policies, even in a debug build.
#[test]
fn on_a_shortened_trace_the_oracle_has_no_error_and_the_probe_little() {
    let mut sc = load("../scenarios/traces/mooncake-conv.yaml");
    sc.setup.max_time_ns = 1_200_000_000_000;
    let errors_after = |name: &str| {
        let m = run_policy(&sc, &policy(&sc, name));
        let (e, at16) = (m.weight_error(), m.weight_error_at_oracle_concurrency());
        assert!(
            e.active_after_s > 0.0 && at16.active_after_s > 0.0,
            "{name}"
        );
        (e.after_warmup().unwrap(), at16.after_warmup().unwrap(), m)
    };
    let (oracle_op, oracle, m) = errors_after("oracle/sed/capacity/weighted:24");
    let (_, probe, _) = errors_after("seed-v3");
    let (at_load_op, at_load, _) = errors_after("at-load/sed/capacity/weighted:24");
    let (_, table, table_run) = errors_after("seed-v1");
    assert_eq!(oracle, 0.0);
    // A run says what its policy is, from the config it ran (the reports' notes read it).
    assert_eq!(m.role, routelab_policies::PolicyRole::Oracle);
    assert_eq!(table_run.role, routelab_policies::PolicyRole::Ours);
    // The probe measures what the oracle assumes (16 concurrent requests, warm engines).
    assert!(probe < 0.05, "{probe}");
    // at-load measures each engine at the concurrency the traffic gives it, below the oracle's
    // 16 at this load, where the fast engines' advantage is smaller: today it is further from
    // the oracle than the probe (issue 10 asks for no further; see at_load's module docs), but
    // closer than the GPU-name table, and far from the clamp limits' ln(32).
    assert!(at_load < table, "{at_load} {table}");
    assert!(at_load < 0.5, "{at_load}");

    // Issue 27: the engines run well below 16 here, so the two references differ — the
    // oracle strategy, exact at 16, is off where the traffic runs the engines; and so is
    // at-load (its smoothed, bounded steps from its own busy observations do not land on the
    // time-average).
    for w in &m.workers {
        let c = w.operating_concurrency.unwrap();
        assert!(c > 0.0 && c < 8.0, "{}: {c}", w.name);
    }
    assert!(oracle_op > 0.01, "{oracle_op}");
    assert!(
        (at_load_op - at_load).abs() > 0.01,
        "{at_load_op} {at_load}"
    );
}
