//! Orchestration shared by the commands: run scenarios × policies × seeds in parallel (rayon)
//! and hand results back in a fixed order, so outputs never depend on the thread count.

use anyhow::Context;
use rayon::prelude::*;
use routelab_policies::PolicyConfig;
use routelab_sim::{RequestRecord, RequestSink, RunMetrics, Scenario, run};
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
    run_job_into(job, None)
}

/// Run one job; its rows go to `stream` when given (and are then not kept), else are kept when
/// the job asks for them.
fn run_job_into(job: Job<'_>, stream: Option<&mut dyn RequestSink>) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let setup = job.scenario.setup_for_seed(job.seed);
    let mut traffic = job
        .scenario
        .traffic_source(job.seed)
        .with_context(|| format!("{}: traffic", job.scenario.path.display()))?;
    let mut rows = (job.rows && stream.is_none()).then(Vec::new);
    let metrics = match stream {
        Some(s) => run(&setup, job.policy, &mut *traffic, Some(s)),
        None => run(
            &setup,
            job.policy,
            &mut *traffic,
            rows.as_mut().map(|r| r as &mut dyn RequestSink),
        ),
    }
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

/// [`run_all`], with job `i`'s rows written to `sink(i)` as the simulation finishes them (for
/// `routelab run`, a `requests.csv` stream) instead of being kept in memory.
pub fn run_all_streaming<S: RequestSink + Send>(
    jobs: &[Job<'_>],
    sink: impl Fn(usize) -> S + Sync,
) -> anyhow::Result<Vec<Outcome>> {
    jobs.par_iter()
        .enumerate()
        .map(|(i, j)| {
            let mut rows = sink(i);
            run_job_into(*j, Some(&mut rows))
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
