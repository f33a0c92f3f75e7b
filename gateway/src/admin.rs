//! The admin API, behind `Authorization: Bearer <admin_token>`.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /admin/workers` | every worker not removed: name, model, state, weight, provenance, in_flight, cap, last probe throughput, counters |
//! | `POST /admin/workers` | add a worker (body: a worker as in the config file) → 201 |
//! | `DELETE /admin/workers/{name}` | deregister |
//! | `POST /admin/workers/{name}/drain` | stop sending new requests |
//! | `POST /admin/workers/{name}/pin` | pin the weight, body `{"weight": 1.5}` (persisted) |
//! | `POST /admin/workers/{name}/unpin` | clear the pin (persisted) |
//! | `POST /admin/workers/{name}/reprobe` | measure again now → 202 |

use crate::config::WorkerConfig;
use crate::error::{ApiError, WorkerError};
use crate::state::{Core, Shared, state_name};
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use routelab_policies::{Provenance, WorkerId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Reject requests without the admin bearer token (401, OpenAI error shape).
pub(crate) async fn require_token(
    State(s): State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match (&s.settings.admin_token, given) {
        (Some(want), Some(got)) if constant_time_eq(want.as_bytes(), got.trim().as_bytes()) => {
            next.run(req).await
        }
        _ => ApiError::unauthorized().into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One worker as JSON.
pub(crate) fn worker_json(core: &Core, id: WorkerId) -> Value {
    let w = &core.workers[id.index()];
    let info = core.router.fleet().get(id).expect("registered");
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
        "weight": weight.value,
        "provenance": weight.provenance.as_str(),
        "in_flight": info.in_flight,
        "cap": cap,
        "last_probe_tok_s": w.probe_tok_s,
        "requests_total": w.metrics.requests.load(Relaxed),
        "errors_total": w.metrics.errors.load(Relaxed),
    })
}

/// `GET /admin/workers`
pub(crate) async fn list(State(s): State<Arc<Shared>>) -> Response {
    let core = s.core();
    let workers: Vec<Value> = (0..core.workers.len())
        .filter(|&i| !core.workers[i].removed)
        .map(|i| worker_json(&core, WorkerId(i as u32)))
        .collect();
    axum::Json(json!({ "policy": core.router.config().name, "workers": workers })).into_response()
}

/// `POST /admin/workers`
pub(crate) async fn add(State(s): State<Arc<Shared>>, body: Bytes) -> Result<Response, ApiError> {
    let cfg: WorkerConfig = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid worker: {e}"), None))?;
    let name = cfg.name.clone();
    let row = {
        let mut core = s.core();
        let now = s.clock.now();
        let id = core.add_worker(now, cfg).map_err(|e| {
            let status = match e {
                WorkerError::Duplicate(_) => StatusCode::CONFLICT,
                _ => StatusCode::BAD_REQUEST,
            };
            ApiError::new(
                status,
                "invalid_request_error",
                "invalid_worker",
                e.to_string(),
            )
        })?;
        worker_json(&core, id)
    };
    crate::log("admin_add", &[("worker", &name)]);
    Ok((StatusCode::CREATED, axum::Json(row)).into_response())
}

fn find(core: &Core, name: &str) -> Result<WorkerId, ApiError> {
    core.lookup(name)
        .ok_or_else(|| ApiError::unknown_worker(name))
}

/// `DELETE /admin/workers/{name}`
pub(crate) async fn remove(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    {
        let mut core = s.core();
        let id = find(&core, &name)?;
        let now = s.clock.now();
        core.remove_worker(now, id);
    }
    crate::log("admin_remove", &[("worker", &name)]);
    Ok(axum::Json(json!({ "removed": name })).into_response())
}

/// `POST /admin/workers/{name}/drain`
pub(crate) async fn drain(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.core();
        let id = find(&core, &name)?;
        let now = s.clock.now();
        core.router
            .drain(now, id)
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        core.workers[id.index()].drained = true;
        worker_json(&core, id)
    };
    crate::log("admin_drain", &[("worker", &name)]);
    Ok(axum::Json(row).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PinBody {
    weight: f64,
}

/// `POST /admin/workers/{name}/pin`
pub(crate) async fn pin(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let PinBody { weight } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            format!("expected {{\"weight\": number}}: {e}"),
            Some("weight"),
        )
    })?;
    let row = {
        let mut core = s.core();
        let id = find(&core, &name)?;
        let now = s.clock.now();
        core.router
            .pin(now, id, weight)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some("weight")))?;
        if core.router.weight(id).map(|w| w.provenance) != Some(Provenance::Pinned) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "pins_unsupported",
                format!(
                    "the policy's weight strategy `{}` does not support pins (use a probe policy)",
                    core.router.strategy().name()
                ),
            ));
        }
        core.pump(now);
        worker_json(&core, id)
    };
    crate::persist_state(&s).await;
    crate::log(
        "admin_pin",
        &[("worker", &name), ("weight", &weight.to_string())],
    );
    Ok(axum::Json(row).into_response())
}

/// `POST /admin/workers/{name}/unpin`
pub(crate) async fn unpin(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.core();
        let id = find(&core, &name)?;
        let now = s.clock.now();
        core.router
            .unpin(now, id)
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        core.pump(now);
        worker_json(&core, id)
    };
    crate::persist_state(&s).await;
    crate::log("admin_unpin", &[("worker", &name)]);
    Ok(axum::Json(row).into_response())
}

/// `POST /admin/workers/{name}/reprobe`
pub(crate) async fn reprobe(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.core();
        let id = find(&core, &name)?;
        let now = s.clock.now();
        core.router
            .reprobe(now, id)
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        worker_json(&core, id)
    };
    crate::log("admin_reprobe", &[("worker", &name)]);
    Ok((StatusCode::ACCEPTED, axum::Json(row)).into_response())
}
