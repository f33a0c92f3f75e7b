//! Exact queueing results for one worker whose aggregate decode rate depends on concurrency.
//!
//! The worker's aggregate decode rate `R(n)` is piecewise-linear through the RTX PRO 6000's
//! decode points (`scenarios/hardware/rtx-pro-6000-27b.yaml`, flat beyond the last one). With
//! Poisson arrivals, exponential outputs and negligible prefill, one engine is a
//! processor-sharing server whose total service rate depends on the number of requests it
//! holds: a birth–death chain with birth rate `λ` and death rate
//! `μ(n) = R(min(n, c)) / E[decode work]`, where `c` is the cap (the engine's running set when
//! nothing caps it; the router's flat cap, whose FIFO queue then holds the rest, otherwise).
//! The chain's stationary law gives the mean number in the system `L`, Little's law the mean
//! response time `T = L / λ`.

use std::path::PathBuf;
use std::sync::Arc;

use routelab_sim::hardware::{DecodeCurve, HardwareProfile};
use routelab_sim::{RequestRecord, RequestSink, Scenario, run};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The PRO 6000's decode points (concurrency, aggregate tok/s), read from the bundled profile.
fn pro6000_points() -> Vec<(f64, f64)> {
    let path = root().join("../scenarios/hardware/rtx-pro-6000-27b.yaml");
    let p = HardwareProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    match p.decode() {
        DecodeCurve::Points(points) => points
            .iter()
            .map(|q| (q.concurrency, q.aggregate_tok_s))
            .collect(),
        other => panic!("the PRO 6000 profile has measured points, not {other:?}"),
    }
}

/// `R(n)` at a whole concurrency: linear from the origin to the first point, linear between
/// points, flat beyond the last (written here from the points, not with the simulator's
/// curve code, so that a slip in either shows).
fn aggregate(points: &[(f64, f64)], n: u32) -> f64 {
    let x = f64::from(n);
    let (c0, r0) = points[0];
    if x <= c0 {
        return r0 * x / c0;
    }
    for w in points.windows(2) {
        let ((a, ra), (b, rb)) = (w[0], w[1]);
        if x <= b {
            return ra + (rb - ra) * (x - a) / (b - a);
        }
    }
    points[points.len() - 1].1
}

/// Mean response time of the birth–death chain: births `lambda`, deaths
/// `R(min(n, cap)) / work` in state `n`. The state space is cut where a state's mass falls
/// below 1e-12 of the total and keeps falling (past the cap and the last decode point, the
/// ratio of successive states is `lambda / mu` < 1 from then on).
fn exact_mean_response(points: &[(f64, f64)], cap: u32, lambda: f64, work: f64) -> f64 {
    let flat_from = cap.min(points[points.len() - 1].0.ceil() as u32);
    let mu_max = aggregate(points, flat_from) / work;
    assert!(lambda < mu_max, "unstable: lambda {lambda} >= {mu_max}");
    // p(n) relative to p(0), summed on the fly
    let (mut p, mut total, mut weighted) = (1.0f64, 1.0f64, 0.0f64);
    let mut n = 0u32;
    loop {
        n += 1;
        p *= lambda / (aggregate(points, n.min(cap)) / work);
        total += p;
        weighted += f64::from(n) * p;
        if n > flat_from && p < 1e-12 * total {
            break;
        }
        assert!(n < 10_000_000, "the chain does not converge");
    }
    (weighted / total) / lambda
}

/// The inline worker: the PRO 6000's decode curve, prefill so fast that a 1-token prompt
/// costs nothing next to a decode step, running set and KV cache that never bind.
fn profile_yaml(points: &[(f64, f64)]) -> String {
    let mut y = String::from(
        "name: pro6000-queueing\ngpu_names: [\"TEST\"]\nsources: [\"test fixture\"]\n\
         decode:\n  points:\n",
    );
    for (c, r) in points {
        y.push_str(&format!(
            "    - {{ concurrency: {c}, aggregate_tok_s: {r} }}\n"
        ));
    }
    y.push_str(
        "prefill_tok_s: 1000000000000\nprefill_chunk_tokens: 512\n\
         kv_capacity_tokens: 1000000000000\nmax_running: 1000000\ncontext_window: 32768\n",
    );
    y
}

/// Sums the response times of completed requests after the first `skip` (the warm-up from an
/// empty system).
#[derive(Default)]
struct MeanE2e {
    skip: u64,
    n: u64,
    sum: f64,
    outputs: u64,
}

impl RequestSink for MeanE2e {
    fn record(&mut self, row: RequestRecord) {
        if row.id < self.skip {
            return;
        }
        self.n += 1;
        self.sum += row.e2e_s.expect("every request completes");
        self.outputs += u64::from(row.output_tokens);
    }
}

fn scenario(policy: &str, lambda: f64, count: u64, mean_output: f64) -> Scenario {
    let src = format!(
        "name: test/queueing\nseed: 1\n\
         fleet:\n  - {{ name: only, profile: rtx-pro-6000-27b }}\n\
         traffic:\n  - poisson: {{ rate_per_s: {lambda}, count: {count}, prompt: {{ fixed: 1 }}, \
         output: {{ exponential: {{ mean: {mean_output} }} }} }}\n\
         policies: [\"{policy}\"]\ntimeline_s: 0\n"
    );
    let mut sc = Scenario::from_yaml(&src, &root().join("tests/data/queueing.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let profile = HardwareProfile::from_yaml_str(&profile_yaml(&pro6000_points()), "inline")
        .unwrap_or_else(|e| panic!("{e}"));
    sc.setup.workers[0].profile = Arc::new(profile);
    sc
}

/// Mean e2e over one seed's run.
fn simulate(sc: &Scenario, seed: u64, skip: u64) -> (f64, f64) {
    let setup = sc.setup_for_seed(seed);
    let mut t = sc.traffic_source(seed).unwrap();
    let mut sink = MeanE2e {
        skip,
        ..MeanE2e::default()
    };
    let m = run(&setup, &sc.policies[0], &mut *t, Some(&mut sink)).unwrap();
    assert_eq!(m.failed, 0);
    (sink.sum / sink.n as f64, sink.outputs as f64 / sink.n as f64)
}

/// Mean decode work of a `round(Exp(m))` output clamped to >= 1, less the prefill's token:
/// `round(X)` is `k` with probability `e^{-(k-1/2)/m} - e^{-(k+1/2)/m}`, so
/// `E[max(round X, 1)] - 1 = e^{-3/(2m)} / (1 - e^{-1/m})` (about `m - 1`).
fn mean_decode_work(m: f64) -> f64 {
    (-1.5 / m).exp() / (1.0 - (-1.0 / m).exp())
}

#[test]
fn explore() {
    let points = pro6000_points();
    let mean_output = 256.0;
    let work = mean_decode_work(mean_output);
    let cap = 8;
    let capacity = aggregate(&points, cap) / work;
    let lambda = 0.85 * capacity;
    let count: u64 = std::env::var("Q_COUNT").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let seeds: u64 = std::env::var("Q_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    for (policy, c) in [
        ("equal/round-robin/no-affinity/none", 1_000_000u32),
        ("equal/round-robin/no-affinity/flat:8", cap),
    ] {
        let sc = scenario(policy, lambda, count, mean_output);
        let exact_w = exact_mean_response(&points, c, lambda, work);
        let exact_n = exact_mean_response(&points, c, lambda, work + 1.0);
        let start = std::time::Instant::now();
        let means: Vec<f64> = (0..seeds).map(|s| simulate(&sc, s + 1, 1000).0).collect();
        let mean = means.iter().sum::<f64>() / means.len() as f64;
        let var = means.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (means.len() - 1) as f64;
        let se = (var / means.len() as f64).sqrt();
        eprintln!(
            "{policy}: lambda {lambda:.4}, sim {mean:.4} s (se {:.3} %), exact(W) {exact_w:.4} ({:+.2} %), exact(N) {exact_n:.4} ({:+.2} %), {:.1} s, means {means:?}",
            100.0 * se / mean,
            100.0 * (mean / exact_w - 1.0),
            100.0 * (mean / exact_n - 1.0),
            start.elapsed().as_secs_f64()
        );
    }
}
