//! Route a request to a worker, or have it wait in the gateway's queue while every eligible
//! worker is at its cap.

use super::flight::QueueTicket;
use crate::app::shared::Shared;
use crate::error::ApiError;
use crate::routing::Core;
use axum::http::StatusCode;
use routelab_policies::{Decision, Explanation, RouteError, RouteRequest, WorkerId, WorkerState};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Why a request got no worker.
pub(super) enum Refusal {
    /// The router refused it (for a queued request: when its wait ended, e.g. every worker
    /// was ejected meanwhile: 503, not 429).
    Route(RouteError),
    /// It waited `queue_timeout_s` in the queue and every eligible worker stayed at its cap.
    QueueTimeout,
}

/// 429: the request waited `waited` in the queue; `earlier` is the failure that made it a
/// retry, if it was one.
pub(super) fn queue_timeout(waited: std::time::Duration, earlier: Option<&str>) -> ApiError {
    let secs = waited.as_secs_f64();
    let mut message = format!(
        "every worker for this model is at its concurrency cap; the request waited {secs:.1}s in the gateway's queue"
    );
    if let Some(e) = earlier {
        message.push_str(&format!(" for a retry after {e}"));
    }
    ApiError {
        retry_after_s: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_timeout",
            message,
        )
    }
}

/// Route to a worker not in `tried`, with the router's explanation of the decision (counted
/// by its reason in `/metrics`) (empty for a first attempt; a retry's failed workers
/// otherwise), or wait in the gateway's FIFO queue, for at most `queue_timeout_s`, when every
/// such worker is at its cap. A retry waits only if an untried worker that could take it
/// exists (up, same model, large enough window); otherwise it is refused at once.
pub(super) async fn admit(
    s: &Arc<Shared>,
    req: &RouteRequest<'_>,
    tried: &[WorkerId],
) -> Result<(Decision, Explanation), Refusal> {
    // A first attempt behind a dispatch stream waits its random hold (`replicas.spread_s`):
    // the replicas' decisions at one instant are then made in turn, each seeing the others'.
    if tried.is_empty()
        && let Some(hold) = s.bus.as_ref().and_then(crate::replicas::Bus::hold)
    {
        tokio::time::sleep(hold).await;
    }
    let admitted = admit_explained(s, req, tried).await;
    if let Ok((_, why)) = &admitted {
        s.global.count_decision(why.reason);
    }
    admitted
}

async fn admit_explained(
    s: &Arc<Shared>,
    req: &RouteRequest<'_>,
    tried: &[WorkerId],
) -> Result<(Decision, Explanation), Refusal> {
    let mut why = Explanation::new();
    let mut ticket = {
        let now = s.routing.clock.now();
        let mut guard = s.routing.core();
        let core = &mut *guard;
        match core
            .router
            .route_explained(now, req, tried, &mut core.rng, &mut why)
        {
            Ok(d) => return Ok((d, why)),
            Err(RouteError::AllAtCap { .. })
                if tried.is_empty() || untried_worker_exists(core, req, tried) =>
            {
                let (ticket, rx) = core.enqueue(req);
                QueueTicket {
                    shared: s.clone(),
                    ticket,
                    rx,
                    armed: true,
                }
            }
            Err(e) => return Err(Refusal::Route(e)),
        }
    };
    s.global.queued_total.fetch_add(1, Relaxed);
    let outcome = match tokio::time::timeout(s.settings.queue_timeout, &mut ticket.rx).await {
        Ok(Ok(outcome)) => Some(outcome),
        Ok(Err(_)) => None,
        Err(_) => {
            let mut core = s.routing.core();
            if core.cancel(ticket.ticket) {
                None
            } else {
                // Dispatched just as the timeout fired.
                ticket.rx.try_recv().ok()
            }
        }
    };
    ticket.armed = false;
    match outcome {
        Some(Ok(d)) if !tried.contains(&d.worker) => Ok((d, Explanation::queued(d.worker))),
        Some(Ok(handed)) => {
            // The router's queue knows nothing of `tried`: it handed this retry a worker
            // that already failed it. Prefer an untried one with room, giving the handed
            // slot back (to the next in the queue). With none, go with the handed one:
            // giving it back and queueing again would have the queue hand it straight
            // back (a spin); the retry budget bounds this, and a worker that keeps
            // failing is ejected, after which the queue no longer hands it out.
            let now = s.routing.clock.now();
            let mut guard = s.routing.core();
            let core = &mut *guard;
            match core
                .router
                .route_explained(now, req, tried, &mut core.rng, &mut why)
            {
                Ok(d) => {
                    core.release(now, handed.worker, handed.charge, None);
                    Ok((d, why))
                }
                Err(_) => Ok((handed, Explanation::queued(handed.worker))),
            }
        }
        Some(Err(e)) => Err(Refusal::Route(e)),
        None => {
            // The wait is over. One last look tells a fleet that stayed full (429) from
            // one whose workers were all ejected meanwhile (503, `no_healthy_worker`).
            let now = s.routing.clock.now();
            let mut guard = s.routing.core();
            let core = &mut *guard;
            match core
                .router
                .route_explained(now, req, tried, &mut core.rng, &mut why)
            {
                Ok(d) => Ok((d, why)),
                Err(RouteError::AllAtCap { .. }) => {
                    s.global.queue_timeouts.fetch_add(1, Relaxed);
                    Err(Refusal::QueueTimeout)
                }
                Err(e) => Err(Refusal::Route(e)),
            }
        }
    }
}

/// True if a worker not in `tried` could take `req` once it has room: up (not ejected,
/// drained or removed), serving the model, with a large enough context window.
fn untried_worker_exists(core: &Core, req: &RouteRequest<'_>, tried: &[WorkerId]) -> bool {
    core.router.fleet().iter().any(|(id, w)| {
        w.model == req.model
            && w.state == WorkerState::Up
            && w.spec.context_window >= req.context_tokens
            && !tried.contains(&id)
    })
}
