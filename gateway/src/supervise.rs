//! Every background task is supervised: the probe runner, the health checks and the signal
//! tasks (the KV stream keeper and the subscribers it keeps, the engine metrics poll, the admin
//! page's history sampler). A task that panics is logged (`task_panicked`, with the panic's
//! message), counted (`routelab_gateway_task_restarts_total{task}`) and started again after a
//! pause. Before, a panic ended the task silently: a health loop that died left every ejected
//! worker ejected for ever, a probe loop that died left every worker on its last weight.
//!
//! The short-lived tasks they spawn (a probe burst, one health check, a worker's KV event
//! subscriber) report their own panics through [`report_panic`] when they are joined.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::task::{JoinError, JoinHandle};

/// A supervised background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundTask {
    /// The probe runner ([`crate::probe`]).
    Probe,
    /// The health checks ([`crate::health`]).
    Health,
    /// The KV stream keeper: one subscriber per worker with `kv_events` ([`crate::signals`]).
    KvStreams,
    /// One worker's KV event subscriber ([`crate::kv::subscriber`]), restarted by the keeper.
    KvSubscriber,
    /// The engines' `/metrics` poll ([`crate::engine_metrics`]).
    EngineMetrics,
    /// The admin page's history sampler ([`crate::signals`]).
    History,
    /// The replicas' bus ([`crate::replicas`]); listed only with a `replicas:` block.
    Bus,
}

impl BackgroundTask {
    /// How many tasks there are ([`TaskRestarts`] has a counter each).
    pub const COUNT: usize = 7;

    /// Every task every gateway runs, in the order of [`TaskRestarts`]'s counters (the bus
    /// task, only with a `replicas:` block, comes after them).
    pub const ALL: [BackgroundTask; 6] = [
        BackgroundTask::Probe,
        BackgroundTask::Health,
        BackgroundTask::KvStreams,
        BackgroundTask::KvSubscriber,
        BackgroundTask::EngineMetrics,
        BackgroundTask::History,
    ];

    /// Its name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundTask::Probe => "probe",
            BackgroundTask::Health => "health",
            BackgroundTask::KvStreams => "kv_streams",
            BackgroundTask::KvSubscriber => "kv_subscriber",
            BackgroundTask::EngineMetrics => "engine_metrics",
            BackgroundTask::History => "history",
            BackgroundTask::Bus => "bus",
        }
    }
}

/// Panics of each background task (or of a task it spawned) since start.
#[derive(Debug, Default)]
pub struct TaskRestarts([AtomicU64; BackgroundTask::COUNT]);

impl TaskRestarts {
    /// One more panic of `task`.
    pub fn count(&self, task: BackgroundTask) {
        self.0[task as usize].fetch_add(1, Relaxed);
    }

    /// Panics of `task` so far.
    pub fn of(&self, task: BackgroundTask) -> u64 {
        self.0[task as usize].load(Relaxed)
    }
}

/// How long a supervisor waits before starting a task that panicked again: a task that panics
/// at once must not spin.
pub const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The message a panic carried (`panic!("...")` or a formatted one), if any.
fn panic_message(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string()),
        Err(e) => e.to_string(),
    }
}

/// Log and count a task of `task`'s that ended in a panic; a cancelled one (shutdown) is not
/// reported. True if it panicked.
pub(crate) fn report_panic(restarts: &TaskRestarts, task: BackgroundTask, e: JoinError) -> bool {
    if !e.is_panic() {
        return false;
    }
    restarts.count(task);
    crate::logging::log(
        "task_panicked",
        &[("task", task.as_str()), ("panic", &panic_message(e))],
    );
    true
}

/// Aborts the task it holds when dropped, so that aborting a supervisor aborts its task.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a supervised task is started with: the state it runs on, which knows where its
/// panics are counted. The supervisor knows nothing else of it, so it stands below every
/// task it runs.
pub(crate) trait Supervised: Clone + Send + Sync + 'static {
    /// The counters a panic of this task is counted in.
    fn restarts(&self) -> &TaskRestarts;
}

/// Run the task `start` makes until it ends or is aborted; when it panics, report it and
/// start a new one after `pause`.
pub(crate) fn supervise<S, F, Fut>(
    s: S,
    task: BackgroundTask,
    pause: Duration,
    start: F,
) -> JoinHandle<()>
where
    S: Supervised,
    F: Fn(S) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let mut running = AbortOnDrop(tokio::spawn(start(s.clone())));
            let ended = (&mut running.0).await;
            // Ended (the loops never do) or cancelled: nothing to restart.
            if !ended.is_err_and(|e| report_panic(s.restarts(), task, e)) {
                return;
            }
            crate::logging::log(
                "task_restarting",
                &[
                    ("task", task.as_str()),
                    ("after_s", &pause.as_secs_f64().to_string()),
                ],
            );
            tokio::time::sleep(pause).await;
        }
    })
}
