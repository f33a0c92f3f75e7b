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

use crate::app::shared::Shared;
use crate::config::WorkerConfig;
use crate::error::{ApiError, WorkerError};
use crate::routing::{Core, cached_measurement, state_name};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use routelab_policies::weights::PersistedProbeState;
use routelab_policies::{Provenance, Time, WorkerId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Reject requests without the admin bearer token (401, OpenAI error shape), logging each
/// refusal (`admin_auth_failed`: path, remote address when the listener records it, reason;
/// never the token nor what was sent).
pub(crate) async fn require_token(
    State(s): State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    let verdict = authenticate(
        s.settings
            .admin_token
            .as_ref()
            .map(crate::config::Secret::expose),
        req.headers().get(header::AUTHORIZATION),
    );
    match verdict {
        Ok(()) => next.run(req).await,
        Err(reason) => {
            let remote = req
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.to_string())
                .unwrap_or_default();
            crate::logging::log(
                "admin_auth_failed",
                &[
                    ("path", req.uri().path()),
                    ("remote", &remote),
                    ("reason", reason.as_str()),
                ],
            );
            ApiError::unauthorized().into_response()
        }
    }
}

/// Why an admin request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// The gateway has no `admin_token`: the admin API refuses everyone.
    NotConfigured,
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not visible ASCII.
    Malformed,
    /// Another scheme than `Bearer` (e.g. `Basic`).
    WrongScheme,
    /// `Bearer` with another token.
    WrongToken,
}

impl AuthFailure {
    /// The name logged.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::NotConfigured => "admin_token_not_configured",
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::WrongScheme => "wrong_scheme",
            AuthFailure::WrongToken => "wrong_token",
        }
    }
}

/// Check an `Authorization` header against the admin token. The scheme is matched
/// case-insensitively (RFC 7235 §2.1: "It uses a case-insensitive token as a means to identify
/// the authentication scheme"); the token is compared in constant time.
pub(crate) fn authenticate(
    want: Option<&str>,
    authorization: Option<&HeaderValue>,
) -> Result<(), AuthFailure> {
    let want = want.ok_or(AuthFailure::NotConfigured)?;
    let value = authorization.ok_or(AuthFailure::Missing)?;
    let value = value.to_str().map_err(|_| AuthFailure::Malformed)?.trim();
    // `credentials = auth-scheme [ 1*SP token68 ]` (RFC 7235 §2.1).
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthFailure::WrongScheme);
    }
    if constant_time_eq(want.as_bytes(), token.trim().as_bytes()) {
        Ok(())
    } else {
        Err(AuthFailure::WrongToken)
    }
}

/// Compare a secret (`want`, never empty) with what a client sent in time that depends only on
/// the length of what was sent: no early exit at the first differing byte, and no early exit
/// on a length mismatch either, which would tell an attacker the token's length.
fn constant_time_eq(want: &[u8], given: &[u8]) -> bool {
    if want.is_empty() {
        return false;
    }
    let mut diff = u8::from(want.len() != given.len());
    for (i, g) in given.iter().enumerate() {
        // Wrapping around `want` keeps the loop free of a branch on the secret's length.
        diff |= g ^ want[i % want.len()];
    }
    std::hint::black_box(diff) == 0
}

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

/// `POST /admin/workers`
pub(crate) async fn add(State(s): State<Arc<Shared>>, body: Bytes) -> Result<Response, ApiError> {
    // Its fields are checked as they are read, as in the file: the error names the field.
    let cfg: WorkerConfig =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
            .map_err(|e| {
                ApiError::bad_request(format!("invalid worker: {}: {}", e.path(), e.inner()), None)
            })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(want: Option<&str>, sent: Option<&str>) -> Result<(), AuthFailure> {
        let header = sent.map(|v| HeaderValue::from_str(v).unwrap());
        authenticate(want, header.as_ref())
    }

    /// Regression: `bearer` and `BEARER` were refused (RFC 7235 §2.1: the scheme is
    /// case-insensitive), and a refusal did not say why.
    #[test]
    fn the_scheme_is_case_insensitive_and_each_refusal_has_its_reason() {
        let want = Some("s3cret");
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "  bEaReR   s3cret ",
        ] {
            assert_eq!(check(want, Some(ok)), Ok(()), "{ok}");
        }
        for (sent, reason) in [
            (None, AuthFailure::Missing),
            (Some("Basic czNjcmV0"), AuthFailure::WrongScheme),
            (Some("s3cret"), AuthFailure::WrongScheme),
            (Some("Bearers3cret"), AuthFailure::WrongScheme),
            (Some("Bearer s3cre"), AuthFailure::WrongToken),
            (Some("Bearer s3cret!"), AuthFailure::WrongToken),
            (Some("Bearer"), AuthFailure::WrongToken),
        ] {
            assert_eq!(check(want, sent), Err(reason), "{sent:?}");
        }
        let opaque = HeaderValue::from_bytes(b"Bearer \xff").unwrap();
        assert_eq!(
            authenticate(want, Some(&opaque)),
            Err(AuthFailure::Malformed)
        );
        assert_eq!(
            check(None, Some("Bearer s3cret")),
            Err(AuthFailure::NotConfigured)
        );
    }

    #[test]
    fn constant_time_eq_compares_whole_tokens() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        // A prefix that repeats the secret is still a different token.
        assert!(!constant_time_eq(b"abc", b"abcabc"));
        assert!(!constant_time_eq(b"", b""));
    }
}
