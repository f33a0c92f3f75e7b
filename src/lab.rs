//! Orchestration shared by the commands: run scenarios × policies × seeds in parallel (rayon)
//! and hand results back in a fixed order, so outputs never depend on the thread count.

use anyhow::Context;
use rayon::prelude::*;
use routelab_policies::PolicyConfig;
use routelab_sim::{RequestRecord, RunMetrics, Scenario, run};
use std::time::Instant;

/// One simulation to run.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    /// Scenario.
    pub scenario: &'a Scenario,
    /// Policy.
    pub policy: &'a PolicyConfig,
    /// Seed.
    pub seed: u64,
    /// Keep per-request rows.
    pub rows: bool,
}

/// What one job produced.
#[derive(Debug)]
pub struct Outcome {
    /// Metrics.
    pub metrics: RunMetrics,
    /// Per-request rows, when asked for.
    pub rows: Option<Vec<RequestRecord>>,
    /// Wall-clock seconds the simulation took (for `perf.json` only).
    pub wall_s: f64,
}

/// Run one job.
pub fn run_job(job: Job<'_>) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let setup = job.scenario.setup_for_seed(job.seed);
    let mut traffic = job
        .scenario
        .traffic_source(job.seed)
        .with_context(|| format!("{}: traffic", job.scenario.path.display()))?;
    let mut rows = job.rows.then(Vec::new);
    let metrics = run(
        &setup,
        job.policy,
        &mut *traffic,
        rows.as_mut()
            .map(|r| r as &mut dyn routelab_sim::RequestSink),
    )
    .with_context(|| {
        format!(
            "{} (policy {}, seed {})",
            job.scenario.path.display(),
            job.policy.name,
            job.seed
        )
    })?;
    Ok(Outcome {
        metrics,
        rows,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Run every job in parallel; results come back in the order of `jobs`. `progress` is called
/// once per finished job (from worker threads).
pub fn run_all(jobs: &[Job<'_>], progress: &(dyn Fn() + Sync)) -> anyhow::Result<Vec<Outcome>> {
    jobs.par_iter()
        .map(|j| {
            let r = run_job(*j);
            progress();
            r
        })
        .collect()
}

/// Apply `f` to every item in parallel; results come back in the order of `items` (so what a
/// command builds from them never depends on the thread count). The first error wins.
pub fn map_parallel<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> anyhow::Result<R> + Sync + Send,
) -> anyhow::Result<Vec<R>> {
    items.par_iter().map(f).collect()
}
