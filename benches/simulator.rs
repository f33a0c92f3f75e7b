//! Simulator throughput: requests simulated per second on the bundled bench fleets.
//!
//! Each iteration runs 100,000 requests of `scenarios/bench/fleet-64.yaml` (and of
//! `fleet-1024.yaml`) under `seed-v3` with per-request output off; criterion reports the
//! throughput in requests (elements) per second. The full one-million-request runs and the
//! 10-million-request memory check are `cargo run --release --example sim_throughput`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use routelab_sim::{Scenario, TrafficSpec, run};
use std::hint::black_box;
use std::path::PathBuf;

const REQUESTS: u64 = 100_000;

fn bench_fleet(c: &mut Criterion, file: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut sc = Scenario::load(&path).expect("bench scenario is valid");
    for t in &mut sc.traffic {
        if let TrafficSpec::Poisson(p) = t {
            p.until.count = Some(REQUESTS);
        }
    }
    let policy = sc.policies[0].clone();
    let mut group = c.benchmark_group("simulator");
    group.sample_size(10);
    group.throughput(Throughput::Elements(REQUESTS));
    group.bench_function(format!("{} {}", sc.name, policy.name), |b| {
        b.iter(|| {
            let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
            let m = run(&sc.setup, &policy, &mut *traffic, None).unwrap();
            black_box(m.completed)
        })
    });
    group.finish();
}

fn simulator(c: &mut Criterion) {
    bench_fleet(c, "scenarios/bench/fleet-64.yaml");
    bench_fleet(c, "scenarios/bench/fleet-1024.yaml");
}

criterion_group!(benches, simulator);
criterion_main!(benches);
