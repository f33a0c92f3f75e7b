//! The admin API's changes: add, remove, drain and undrain workers, pin and unpin their
//! weights (persisted, failing closed), and ask for a new probe.

use super::worker_json;
use crate::app::shared::Shared;
use crate::config::WorkerConfig;
use crate::error::{ApiError, WorkerError};
use crate::routing::Core;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use routelab_policies::{Provenance, WorkerId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// `POST /admin/workers`
pub(crate) async fn add(State(s): State<Arc<Shared>>, body: Bytes) -> Result<Response, ApiError> {
    // Its fields are checked as they are read, as in the file: the error names the field.
    let mut cfg: WorkerConfig =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
            .map_err(|e| {
                ApiError::bad_request(format!("invalid worker: {}: {}", e.path(), e.inner()), None)
            })?;
    cfg.read_api_key(&s.settings.config_dir)
        .map_err(|e| ApiError::bad_request(format!("invalid worker: {e}"), None))?;
    let name = cfg.name.clone();
    let row = {
        let mut core = s.routing.core();
        let now = s.routing.clock.now();
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
        one_row(&s, &core, id)
    };
    crate::logging::log("admin_add", &[("worker", &name)]);
    Ok((StatusCode::CREATED, axum::Json(row)).into_response())
}

/// One worker as JSON, for the answer to a change.
fn one_row(s: &Shared, core: &Core, id: WorkerId) -> Value {
    let probe_state = core.router.strategy().export_state();
    worker_json(core, id, probe_state.as_ref(), s.routing.clock.now())
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
    let id = {
        let mut core = s.routing.core();
        let id = find(&core, &name)?;
        let now = s.routing.clock.now();
        core.remove_worker(now, id);
        id
    };
    // Outside the router's lock, as every signal lock is taken.
    s.signals.forget_worker(id);
    crate::logging::log("admin_remove", &[("worker", &name)]);
    Ok(axum::Json(json!({ "removed": name })).into_response())
}

/// `POST /admin/workers/{name}/drain`
pub(crate) async fn drain(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.routing.core();
        let id = find(&core, &name)?;
        let now = s.routing.clock.now();
        core.router
            .drain(now, id)
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        if let Some(w) = core.workers.get_mut(id) {
            w.drained = true;
        }
        // A drained worker leaves the model's pool: the panic mode may change.
        core.apply_health(now, id);
        one_row(&s, &core, id)
    };
    crate::logging::log("admin_drain", &[("worker", &name)]);
    Ok(axum::Json(row).into_response())
}

/// `POST /admin/workers/{name}/undrain`: re-admit a drained worker; 409 if it is not drained.
pub(crate) async fn undrain(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.routing.core();
        let id = find(&core, &name)?;
        let now = s.routing.clock.now();
        if !core.undrain(now, id) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "not_drained",
                format!(
                    "worker `{name}` is not drained (drain it with POST /admin/workers/{name}/drain)"
                ),
            ));
        }
        one_row(&s, &core, id)
    };
    crate::logging::log("admin_undrain", &[("worker", &name)]);
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
    let row = change_pin(&s, &name, Some(weight)).await?;
    crate::logging::log(
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
    let row = change_pin(&s, &name, None).await?;
    crate::logging::log("admin_unpin", &[("worker", &name)]);
    Ok(axum::Json(row).into_response())
}

/// Pin (`Some`) or unpin (`None`) a worker and persist it, failing closed: if the state file
/// cannot be written, the router goes back to the worker's previous pin and the caller gets a
/// 500 (`state_write_failed`). The change itself is written even when this gateway's view
/// already held it: another replica may have changed the file since. The persist lock is held
/// from the change to the write (and the roll-back), so no other writer can save a pin the
/// administrator is then told failed. The core lock is not held across the write.
async fn change_pin(s: &Arc<Shared>, name: &str, to: Option<f64>) -> Result<Value, ApiError> {
    let mut held = s.state_file.lock().await;
    let (id, before, explicit) = {
        let mut core = s.routing.core();
        let id = find(&core, name)?;
        // Pins are kept per (node, model), as in the state file.
        let spec = &core
            .router
            .fleet()
            .get(id)
            .ok_or_else(|| ApiError::unknown_worker(name))?
            .spec;
        let explicit = crate::persist::PinChange {
            node: spec.node.clone(),
            model: spec.model.clone(),
            weight: to,
        };
        if let Some(weight) = to {
            crate::persist::check_pin(weight, crate::persist::pin_range(core.router.config()))
                .map_err(|m| ApiError::bad_request(m.to_string(), Some("weight")))?;
        }
        let before = core.pin_of(id);
        let now = s.routing.clock.now();
        core.set_pin(now, id, to)
            .map_err(|e| ApiError::bad_request(e.to_string(), to.map(|_| "weight")))?;
        if to.is_some() && core.router.weight(id).map(|w| w.provenance) != Some(Provenance::Pinned)
        {
            // The strategy ignored the pin: nothing changed, nothing to persist.
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
        (id, before, explicit)
    };
    if let Err(e) = s
        .state_file
        .write(&s.routing, &mut held, Some(explicit))
        .await
    {
        {
            let mut core = s.routing.core();
            let now = s.routing.clock.now();
            // Restoring what the router held a moment ago cannot be refused: the worker and
            // the pin value were valid then.
            let _ = core.set_pin(now, id, before);
        }
        crate::logging::log(
            "admin_pin_rolled_back",
            &[("worker", name), ("error", &e.to_string())],
        );
        return Err(ApiError::state_write_failed(&e));
    }
    drop(held);
    let core = s.routing.core();
    Ok(one_row(s, &core, id))
}

/// `POST /admin/workers/{name}/reprobe`
pub(crate) async fn reprobe(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let row = {
        let mut core = s.routing.core();
        let id = find(&core, &name)?;
        let now = s.routing.clock.now();
        core.router
            .reprobe(now, id)
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        one_row(&s, &core, id)
    };
    crate::logging::log("admin_reprobe", &[("worker", &name)]);
    Ok((StatusCode::ACCEPTED, axum::Json(row)).into_response())
}
