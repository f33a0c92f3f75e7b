//! The event engine on the source's case studies and on queueing theory.

use routelab_sim::{Scenario, run};
use std::path::PathBuf;

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

#[test]
fn sixteen_at_once_smoke() {
    let sc = Scenario::load(scenarios().join("seed/sixteen-at-once.yaml")).unwrap();
    for p in &sc.policies {
        let mut t = sc.traffic_source(sc.setup.seed).unwrap();
        let m = run(&sc.setup, p, &mut *t, None).unwrap();
        eprintln!(
            "{}: completed {} e2e max {:?} workers {:?} probes {} gpu_s {:.2}",
            p.name,
            m.completed,
            m.e2e.quantile_secs(1.0),
            m.workers.iter().map(|w| (w.name.clone(), w.requests, w.final_weight)).collect::<Vec<_>>(),
            m.probe_bursts,
            m.probe_gpu_s
        );
    }
}
