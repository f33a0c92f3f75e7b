//! Active health checks: `GET {base_url}{health.path}` every `health.interval_s`. A worker
//! failing `unhealthy_after` checks (or requests, before their first byte) in a row is ejected
//! (`Router::disconnect`); an ejected worker passing `healthy_after` checks in a row is
//! re-admitted (`Router::reconnect`). Drained and removed workers are left alone.
//!
//! A check or a request whose connection cannot be made at all ([`ejects_at_once`]: refused,
//! or the connect timed out) ejects the worker at once: nothing listens there, so waiting for
//! `unhealthy_after` more failures would only keep routing to a dead worker.

use crate::app::shared::Shared;
use crate::routing::Failure;
use crate::supervise::{BackgroundTask, report_panic};
use crate::upstream::{BaseUrlError, Target};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use routelab_policies::WorkerId;
use std::sync::Arc;
use tokio::task::JoinSet;

/// The health loop; runs until aborted (supervised: [`crate::supervise`]).
pub(crate) async fn run(s: Arc<Shared>) {
    // The first round runs one interval after start, not at once: a worker is presumed up when
    // registered, and a request that finds it unreachable ejects it at once anyway (and is
    // retried on another worker).
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + s.settings.health_interval,
        s.settings.health_interval,
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let targets: Vec<(WorkerId, Result<Target, BaseUrlError>)> = {
            let core = s.routing.core();
            core.workers
                .live()
                .filter(|(_, w)| !w.drained)
                .map(|(id, w)| (id, w.base.join(&s.settings.health.path)))
                .collect()
        };
        let mut set = JoinSet::new();
        for (id, uri) in targets {
            let s = s.clone();
            set.spawn(async move {
                let outcome = match uri {
                    Ok(uri) => check(&s, uri).await,
                    Err(e) => {
                        // Not expected (the path and the URL are checked when they are read);
                        // a check that cannot be sent fails rather than ending the loop.
                        crate::logging::log("health_check_failed", &[("error", &e.to_string())]);
                        Check::Unhealthy
                    }
                };
                let mut core = s.routing.core();
                let now = s.routing.clock.now();
                match outcome {
                    Check::Healthy => core.note_success(now, id, true),
                    Check::Unhealthy => {
                        core.note_failure(now, id, Failure::Check { hard: false });
                    }
                    Check::Unreachable => {
                        core.note_failure(now, id, Failure::Check { hard: true });
                    }
                }
            });
        }
        while let Some(done) = set.join_next().await {
            if let Err(e) = done {
                report_panic(&s.global.task_restarts, BackgroundTask::Health, e);
            }
        }
    }
}

/// The outcome of one health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// A 2xx answer, read to the end within the timeout.
    Healthy,
    /// Anything else that reached the worker: a non-2xx answer, a timeout, a broken body.
    Unhealthy,
    /// The connection could not be made ([`ejects_at_once`]).
    Unreachable,
}

/// The one rule for failures that eject a worker at once, for requests and health checks
/// alike: the connection to the worker could not be made (refused, or the connect timed out),
/// as opposed to a worker that answered badly or slowly.
pub(crate) fn ejects_at_once(e: &hyper_util::client::legacy::Error) -> bool {
    e.is_connect()
}

async fn check(s: &Shared, uri: Target) -> Check {
    let req = uri
        .request(hyper::Method::GET)
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let work = async {
        let resp = match s.client.request(req).await {
            Ok(r) => r,
            Err(e) if ejects_at_once(&e) => return Check::Unreachable,
            Err(_) => return Check::Unhealthy,
        };
        let ok = resp.status().is_success();
        // Bounded: a health answer is a few bytes; an endless one must not fill the memory.
        match Limited::new(resp.into_body(), s.settings.max_response_bytes)
            .collect()
            .await
        {
            Ok(_) if ok => Check::Healthy,
            _ => Check::Unhealthy,
        }
    };
    tokio::time::timeout(s.settings.health_timeout, work)
        .await
        .unwrap_or(Check::Unhealthy)
}
