//! The admin API, behind `Authorization: Bearer <admin_token>`.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /admin/workers` | every worker not removed: name, model, state, ejected, drained, weight, provenance, in_flight, cap, last probe throughput and age, counters, and `signals` (what the policy reads of it and whether it is live: tokens, KV event stream, metrics poll, recent history; [`crate::signals`]); beside the list, the gateway's own `signals` (engine poll settings, task restarts) |
//! | `POST /admin/workers` | add a worker (body: a worker as in the config file) → 201 |
//! | `DELETE /admin/workers/{name}` | deregister |
//! | `POST /admin/workers/{name}/drain` | stop sending new requests |
//! | `POST /admin/workers/{name}/undrain` | re-admit a drained worker (409 if not drained) |
//! | `POST /admin/workers/{name}/pin` | pin the weight, body `{"weight": 1.5}`, within the policy's weight clamp (persisted; 500 and not applied if the state file cannot be written) |
//! | `POST /admin/workers/{name}/unpin` | clear the pin (persisted, as pins are) |
//! | `POST /admin/workers/{name}/reprobe` | measure again now → 202 |
//! | `GET /admin/replicas` | with a `replicas:` block ([`crate::replicas`]): this replica's name and instance, the bus (address, subject, up, for how long), the age of the freshest peer event, each peer (live, age of its last event, its requests this router counts, events, missed), the bus counters, and per worker the peers' requests in flight this router counts (`peer_in_flight`); 404 without the block. `GET /admin/workers` carries the same object as `replicas` |
//! | `GET /admin/capacity[?model=NAME]` | the passive capacity curve of each worker of the model ([`crate::capacity`]); the model may be left out when every worker serves the same one |

mod actions;
mod auth;

pub(crate) use actions::{add, drain, pin, remove, reprobe, undrain, unpin};
pub(crate) use auth::{AdminToken, require_token};

use crate::app::shared::Shared;
use crate::error::ApiError;
use crate::routing::{Core, cached_measurement, state_name};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use routelab_policies::weights::PersistedProbeState;
use routelab_policies::{Time, WorkerId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// One worker as JSON. `probe_state`: the strategy's exported state, once for all the workers
/// listed (it is a copy of the whole probe cache).
pub(crate) fn worker_json(
    core: &Core,
    id: WorkerId,
    probe_state: Option<&PersistedProbeState>,
    now: Time,
) -> Value {
    let (Some(w), Some(info)) = (core.workers.get(id), core.router.fleet().get(id)) else {
        return json!({ "removed": true });
    };
    // Seconds since the measurement the worker's cached probe result comes from (it may predate
    // a restart); null if it was never measured.
    let last_probe_age_s = probe_state
        .and_then(|st| cached_measurement(st, &info.spec))
        .map(|e| now.saturating_since(e.measured_at).as_secs_f64());
    let weight = core.router.weight(id).unwrap_or_default();
    let cap = core.router.cap(id).filter(|&c| c != u32::MAX);
    json!({
        "name": w.cfg.name,
        "model": w.cfg.model,
        "node": info.spec.node,
        "base_url": w.base.as_str(),
        "gpu_names": w.cfg.gpu_names,
        "context_window": w.cfg.context_window,
        "launch_args": w.cfg.launch_args,
        "state": state_name(info.state),
        "ejected": w.ejected,
        "drained": w.drained,
        "weight": weight.value,
        "provenance": weight.provenance.as_str(),
        "in_flight": info.in_flight,
        "cap": cap,
        "last_probe_tok_s": w.probe_tok_s,
        "last_probe_basis": w.probe_tok_s.map(|_| if w.probe_cut_at_budget {
            "tokens streamed within probe.budget_s (the burst was cut at the budget)"
        } else {
            "a complete burst"
        }),
        "last_probe_age_s": last_probe_age_s,
        // The prefill-bound burst's prompt tokens/s (probes configured with `prefill_requests`):
        // the prefill speed `predictive` uses until the worker's traffic has measured its own.
        "probe_prefill_tok_s": core.router.strategy().probed_prefill_tok_s(id),
        "requests_total": w.metrics.requests.load(Relaxed),
        "errors_total": w.metrics.errors.load(Relaxed),
    })
}

/// `GET /admin/workers`
pub(crate) async fn list(State(s): State<Arc<Shared>>) -> Response {
    let (policy, mut workers, signal_keys) = {
        let core = s.routing.core();
        let probe_state = core.router.strategy().export_state();
        let now = s.routing.clock.now();
        let workers: Vec<Value> = core
            .workers
            .live()
            .map(|(id, _)| worker_json(&core, id, probe_state.as_ref(), now))
            .collect();
        let keys: Vec<(WorkerId, String, bool)> = core
            .workers
            .live()
            .map(|(id, w)| (id, w.cfg.model.clone(), w.cfg.kv_events.is_some()))
            .collect();
        let policy = (
            core.router.config().name.clone(),
            crate::signals::policy_parts(core.router.config()),
        );
        (policy, workers, keys)
    };
    // Outside the router's lock: the signal views take their own locks.
    for (w, (id, model, kv)) in workers.iter_mut().zip(signal_keys) {
        w["signals"] = crate::signals::admin_view(&s, id, &model, kv);
    }
    let mut body = json!({
        "policy": policy.0,
        "policy_parts": policy.1,
        "workers": workers,
        "signals": crate::signals::gateway_view(&s),
    });
    if let Some(replicas) = replicas_view(&s) {
        body["replicas"] = replicas;
    }
    axum::Json(body).into_response()
}

/// `GET /admin/replicas`
pub(crate) async fn replicas(State(s): State<Arc<Shared>>) -> Result<Response, ApiError> {
    match replicas_view(&s) {
        Some(v) => Ok(axum::Json(v).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no_replicas",
            "this gateway has no `replicas:` block: it shares nothing with other replicas",
        )),
    }
}

/// The replica's status, with a `replicas:` block.
fn replicas_view(s: &Shared) -> Option<Value> {
    let bus = s.bus.as_ref()?;
    // The peers' lock, then the router's, never both at once.
    let (peers, freshest, counted) = {
        let p = bus.peers.lock().unwrap_or_else(|p| p.into_inner());
        (p.view(), p.freshest_age_s(), p.counted())
    };
    let workers: Vec<Value> = {
        let core = s.routing.core();
        core.workers
            .live()
            .map(|(id, w)| {
                json!({
                    "name": w.cfg.name,
                    "peer_in_flight": core.router.remote_in_flight(id),
                })
            })
            .collect()
    };
    let since_s = bus
        .since
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .elapsed()
        .as_secs_f64();
    let c = &bus.counters;
    let ignored: serde_json::Map<String, Value> = crate::replicas::Ignored::ALL
        .iter()
        .map(|&why| (why.as_str().to_string(), json!(c.ignored_of(why))))
        .collect();
    Some(json!({
        "name": bus.name(),
        "instance": format!("{:016x}", bus.instance),
        "bus": {
            "address": format!("nats://{}", bus.settings.server),
            "subject": bus.settings.subject,
            "up": bus.is_up(),
            "since_s": since_s,
        },
        "freshest_peer_event_age_s": freshest,
        "peers": peers,
        "peer_requests_counted": counted,
        "counters": {
            "published": c.published.load(Relaxed),
            "received": c.received.load(Relaxed),
            "dropped_full": c.dropped_full.load(Relaxed),
            "dropped_bus_down": c.dropped_down.load(Relaxed),
            "ignored": ignored,
            "missed": c.missed.load(Relaxed),
            "expired": c.expired.load(Relaxed),
            "disconnects": c.disconnects.load(Relaxed),
            "task_restarts": s.global.task_restarts.of(crate::supervise::BackgroundTask::Bus),
        },
        "workers": workers,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapacityQuery {
    model: Option<String>,
}

/// `GET /admin/capacity[?model=NAME]`: for each worker of the model (not removed), the points of
/// its passive capacity curve observed at least `capacity.min_observed_s`, by concurrency.
pub(crate) async fn capacity(
    State(s): State<Arc<Shared>>,
    query: Result<axum::extract::Query<CapacityQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let asked = query
        .map_err(|e| {
            ApiError::bad_request(format!("{e}; the one parameter is `model`"), Some("model"))
        })?
        .0
        .model;
    let (model, workers) = {
        let core = s.routing.core();
        let live: Vec<&crate::routing::WorkerRt> = core.workers.live().map(|(_, w)| w).collect();
        let mut models: Vec<&str> = live.iter().map(|w| w.cfg.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        let model = match (asked, models.as_slice()) {
            (Some(m), _) if models.contains(&m.as_str()) => m,
            (Some(m), _) => {
                return Err(ApiError::model_not_found(format!(
                    "no worker serves the model `{m}`; served: {}",
                    models.join(", ")
                )));
            }
            (None, [one]) => (*one).to_string(),
            (None, []) => {
                return Err(ApiError::model_not_found(
                    "the gateway has no worker, so no capacity curve",
                ));
            }
            (None, several) => {
                return Err(ApiError::bad_request(
                    format!(
                        "the workers serve several models: ask for one with ?model= (one of {})",
                        several.join(", ")
                    ),
                    Some("model"),
                ));
            }
        };
        let workers: Vec<(
            String,
            Vec<String>,
            u32,
            Arc<crate::metrics::registry::WorkerMetrics>,
        )> = live
            .iter()
            .filter(|w| w.cfg.model == model)
            .map(|w| {
                (
                    w.cfg.name.clone(),
                    w.cfg.gpu_names.clone(),
                    w.cfg.context_window,
                    w.metrics.clone(),
                )
            })
            .collect();
        (model, workers)
    };
    let now = s.routing.clock.now();
    let workers: Vec<Value> = workers
        .into_iter()
        .map(|(name, gpu_names, context_window, metrics)| {
            let points: Vec<Value> = metrics
                .curve()
                .points(now, s.settings.min_observed)
                .into_iter()
                .map(|p| {
                    json!({
                        "concurrency": p.concurrency,
                        "aggregate_tok_s": p.aggregate_tok_s,
                        "observed_s": p.observed_s,
                        "tokens": p.tokens.round() as u64,
                    })
                })
                .collect();
            json!({
                "name": name,
                "gpu_names": gpu_names,
                "context_window": context_window,
                "points": points,
            })
        })
        .collect();
    let generated_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(axum::Json(json!({
        "schema": crate::capacity::SCHEMA,
        "model": model,
        "generated_unix_s": generated_unix_s,
        "workers": workers,
    }))
    .into_response())
}
