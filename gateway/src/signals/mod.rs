//! What each worker tells the router besides its answers, and what the policy will see of it:
//! the engines' KV event streams ([`crate::kv`]), their `/metrics` ([`crate::engine_metrics`]),
//! a short history per worker for the admin page. Its background tasks are supervised as every
//! other ([`crate::supervise`]: a task that panics is logged, counted in
//! `routelab_gateway_task_restarts_total{task}` and started again).
//!
//! ```yaml
//! engine_metrics:
//!   poll: auto          # auto: when the policy reads engine reports (least-load); on; off
//!   interval_s: 10      # policy time; default: the policy's engine poll interval, else 10
//!   timeout_s: 2
//!   stale_after_s: 30   # a report older than this is dropped (the rule falls back to the gateway's counts)
//!   path: /metrics
//! ```

pub(crate) mod hub;
mod poll;
pub(crate) mod settings;
pub(crate) mod view;

pub use hub::{PollState, PollStatus, Sample};
pub use settings::{DEFAULT_POLL_S, EngineMetricsConfig, PollMode};

pub use view::{SignalUse, check_report};
pub(crate) use view::{admin_view, gateway_view, policy_parts};

use crate::app::shared::Shared;
use crate::kv::{Fallback, KvEventsConfig, StreamState, StreamStatus, WorkerStream};
use crate::supervise::{BackgroundTask, RESTART_PAUSE, report_panic, supervise};
use hub::{HISTORY, SAMPLE_EVERY, lock, worker_name};
use routelab_policies::WorkerId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Start the signal tasks: the KV stream keeper (one subscriber per worker with `kv_events`,
/// started and stopped as workers come and go), the metrics poller and the history sampler.
pub(crate) fn start(s: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![supervise(
        s.clone(),
        BackgroundTask::KvStreams,
        RESTART_PAUSE,
        keep_streams,
    )];
    if s.settings.engine_poll.enabled {
        tasks.push(supervise(
            s.clone(),
            BackgroundTask::EngineMetrics,
            RESTART_PAUSE,
            poll::poll_engines,
        ));
    }
    tasks.push(supervise(
        s.clone(),
        BackgroundTask::History,
        RESTART_PAUSE,
        sample_history,
    ));
    tasks
}

/// Keep one subscriber running per live worker with `kv_events`; one that ended (panicked) is
/// logged, counted ([`report_panic`]) and started again.
async fn keep_streams(s: Arc<Shared>) {
    let mut running: HashMap<u32, JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let wanted: Vec<(WorkerId, KvEventsConfig)> = {
            let core = s.routing.core();
            // Only a policy that mirrors the engines' caches reads the streams.
            let reads = core.router.kv_event_delay().is_some();
            core.workers
                .live()
                .filter(|_| reads)
                .filter_map(|(id, w)| w.cfg.kv_events.clone().map(|c| (id, c)))
                .collect()
        };
        let keep: std::collections::HashSet<u32> = wanted.iter().map(|(id, _)| id.0).collect();
        running.retain(|id, h| {
            if keep.contains(id) {
                true
            } else {
                h.abort();
                lock(&s.signals.kv).remove(id);
                false
            }
        });
        for (id, cfg) in wanted {
            let restart = match running.get(&id.0) {
                // Removed and added again since (`SignalHub::forget_worker`): a new engine.
                Some(h) if !lock(&s.signals.kv).contains_key(&id.0) => {
                    h.abort();
                    true
                }
                Some(h) => h.is_finished(),
                None => true,
            };
            if restart {
                // A subscriber runs until it is aborted: one that ended by itself panicked.
                if let Some(ended) = running.remove(&id.0)
                    && ended.is_finished()
                    && let Err(e) = ended.await
                    && report_panic(&s.global.task_restarts, BackgroundTask::KvSubscriber, e)
                {
                    crate::logging::log(
                        "task_restarting",
                        &[
                            ("task", BackgroundTask::KvSubscriber.as_str()),
                            ("worker", &worker_name(&s.routing, id)),
                        ],
                    );
                }
                lock(&s.signals.kv)
                    .entry(id.0)
                    .or_insert_with(|| WorkerStream {
                        status: StreamStatus::new(StreamState::Connecting),
                        fallback: Fallback::default(),
                        down_log: crate::kv::Throttle::new(std::time::Duration::from_secs_f64(
                            cfg.down_log_every_s,
                        )),
                    });
                running.insert(
                    id.0,
                    tokio::spawn(crate::kv::subscriber::run(s.clone(), id, cfg)),
                );
            }
        }
    }
}

/// Sample every worker's in-flight count, weight and recent TTFT for the admin page.
async fn sample_history(s: Arc<Shared>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let rows: Vec<(u32, u32, f64, u64, f64)> = {
            let core = s.routing.core();
            core.workers
                .live()
                .map(|(id, w)| {
                    let info = core.router.fleet().get(id);
                    (
                        id.0,
                        info.map_or(0, |f| f.in_flight),
                        core.router.weight(id).map_or(0.0, |w| w.value),
                        w.metrics.ttft.count(),
                        w.metrics.ttft.sum_s(),
                    )
                })
                .collect()
        };
        let mut h = lock(&s.signals.history);
        h.retain(|id, _| rows.iter().any(|r| r.0 == *id));
        for (id, in_flight, weight, n, sum) in rows {
            let e = h.entry(id).or_default();
            let ttft_s =
                (n > e.ttft_count).then(|| (sum - e.ttft_sum_s) / (n - e.ttft_count) as f64);
            e.ttft_count = n;
            e.ttft_sum_s = sum;
            e.samples.push_back(Sample {
                in_flight,
                ttft_s,
                weight,
            });
            while e.samples.len() > HISTORY {
                e.samples.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_defaults_to_the_policys_interval_and_only_when_it_reads_reports() {
        let c = EngineMetricsConfig::default();
        assert!(!c.settings(None).enabled);
        assert_eq!(c.settings(None).interval_s, DEFAULT_POLL_S);
        let c = EngineMetricsConfig {
            poll: PollMode::On,
            interval_s: Some(2.0),
            ..Default::default()
        };
        let p = c.settings(None);
        assert!(p.enabled && p.interval_s == 2.0 && p.stale_after_s == 6.0);
        let bad = EngineMetricsConfig {
            path: "metrics".into(),
            ..Default::default()
        };
        assert_eq!(
            bad.validate("g.yaml").unwrap_err().field,
            "engine_metrics.path"
        );
        let bad = EngineMetricsConfig {
            timeout_s: 0.0,
            ..Default::default()
        };
        assert_eq!(
            bad.validate("g.yaml").unwrap_err().field,
            "engine_metrics.timeout_s"
        );
    }
}
