//! The OpenAI-compatible request path: parse, route (or queue), forward, stream back.
//!
//! [`handle`] reads one request top to bottom; its steps live here (the body, the prompt
//! count, the attempts and retries) and beside it: [`mod@admit`] (route, or wait in the gateway's
//! queue), [`relay`] (the worker's answer back to the client: headers, buffered bodies, the
//! stall timer) and [`sse`] (streamed answers: the scan of their events, the body passed
//! through).

mod admit;
pub(crate) mod budget;
mod explain;
pub(crate) mod flight;
mod intake;
mod relay;
mod sse;

pub use relay::{BELIEVED_CACHED_HEADER, WORKER_HEADER};
pub(crate) use sse::SseScan;
pub use sse::is_content_event;

use crate::app::shared::Shared;
use crate::error::ApiError;
use crate::prompt::{Endpoint, Parsed};
use crate::reqlog::{LogStatus, Trace};
use crate::routing::{Failure, RouterCore};
use admit::{Refusal, admit, queue_timeout};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flight::Flight;
use http_body_util::Full;
use intake::{json_content, read_request_body};
use relay::{respond, server_error};
use routelab_policies::{Decision, Explanation, RouteRequest, Time, WorkerId};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// `POST /v1/chat/completions`
pub(crate) async fn chat(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, req, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`
pub(crate) async fn completions(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, req, Endpoint::Completions)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/models`: the union of the (not removed) workers' models.
pub(crate) async fn models(State(RouterCore(routing)): State<RouterCore>) -> Response {
    let mut names: Vec<String> = {
        let core = routing.core();
        core.workers
            .live()
            .map(|(_, w)| w.cfg.model.clone())
            .collect()
    };
    names.sort_unstable();
    names.dedup();
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "routelab"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// Any path no route serves: 404 in OpenAI's error shape.
pub(crate) async fn unknown_path(method: Method, uri: Uri) -> Response {
    ApiError::unknown_path(method.as_str(), uri.path()).into_response()
}

/// A served path asked with a method it does not take: 405 in OpenAI's error shape (axum adds
/// the `Allow` header).
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}

/// One request: its body, its prompt counted, the route, then the attempts (a retry on
/// another worker after a failure, up to `upstream.retries`).
async fn handle(s: Arc<Shared>, req: Request, ep: Endpoint) -> Result<Response, ApiError> {
    let arrival = Arrival::now(&s);
    let (parts, body) = req.into_parts();
    json_content(&parts.headers)?;
    let (bytes, hold) = read_request_body(&s, &parts.headers, body).await?;
    let (parsed, prefix) = parse_and_count(&s, &bytes, ep).await?;
    let route_req = route_request(&s, &parts.headers, &parsed, &prefix)?;
    // From here on the request is logged, however it ends (dropped: the client went away).
    let mut trace = arrival.trace(&s, &parsed, &prefix);
    let forward = Forward {
        ep,
        body: bytes,
        _hold: hold,
        accept: parts.headers.get(header::ACCEPT).cloned(),
        arrived: arrival.at,
        prompt_tokens: parsed.prompt_tokens,
        explain: explain::asked(&parts.headers),
    };
    forward
        .with_retries(&s, &route_req, &parsed.model, &prefix, &mut trace)
        .await
}

/// When a request arrived, on each of the clocks that time it.
struct Arrival {
    /// Wall time, for the latencies.
    at: Instant,
    /// Policy time.
    policy: Time,
    /// The request log's arrival: the real wall clock, whatever `clock_scale` says.
    unix_ms: i64,
}

impl Arrival {
    fn now(s: &Shared) -> Arrival {
        Arrival {
            at: Instant::now(),
            policy: s.routing.clock.now(),
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// The request's log line, if the gateway keeps a request log.
    fn trace(&self, s: &Shared, parsed: &Parsed, prefix: &[u64]) -> Option<Trace> {
        s.request_log.as_ref().map(|log| {
            Trace::new(
                log.clone(),
                s.routing.clock,
                self.policy,
                self.unix_ms,
                &parsed.model,
                parsed.prompt_tokens,
                prefix,
            )
        })
    }
}

/// The request parsed, with its prompt tokens and prefix block keys: exact with the model's
/// tokenizer, else the estimate ([`crate::tokens`]).
async fn parse_and_count(
    s: &Shared,
    bytes: &Bytes,
    ep: Endpoint,
) -> Result<(Parsed, Vec<u64>), ApiError> {
    let mut parsed = s
        .tokenizers
        .parse(bytes, ep)
        .await
        .map_err(|b| ApiError::bad_request(b.message, b.param))?;
    // The largest window a worker of the model has: a prompt that cannot fit it is refused
    // from its bytes before it is counted (only a model with a tokenizer counts).
    let window = s.tokenizers.get(&parsed.model).and_then(|_| {
        s.routing
            .core()
            .workers
            .live()
            .filter(|(_, w)| w.cfg.model == parsed.model)
            .map(|(_, w)| w.cfg.context_window)
            .max()
    });
    let counted = s
        .tokenizers
        .count_async(bytes.clone(), ep, &parsed, window)
        .await
        .map_err(crate::tokens::CountError::into_api)?;
    parsed.prompt_tokens = counted.prompt_tokens;
    Ok((parsed, counted.prefix))
}

/// What the router decides on: the model (404 when no worker serves it), the context the
/// request needs, its prompt and prefix.
fn route_request<'p>(
    s: &Shared,
    headers: &HeaderMap,
    parsed: &Parsed,
    prefix: &'p [u64],
) -> Result<RouteRequest<'p>, ApiError> {
    let Some(model) = s.routing.core().router.model_id(&parsed.model) else {
        return Err(ApiError::model_not_found(format!(
            "The model `{}` does not exist or no worker serves it",
            parsed.model
        )));
    };
    Ok(RouteRequest {
        model,
        context_tokens: parsed
            .prompt_tokens
            .saturating_add(parsed.max_tokens.unwrap_or(0)),
        prefix,
        prompt_tokens: parsed.prompt_tokens,
        session: (s.settings.sessions)
            .of(headers, parsed.user.as_deref(), prefix)
            .map_err(|e| ApiError::bad_request(e.to_string(), e.param))?,
    })
}

/// What the request sends to a worker, on each attempt.
pub(crate) struct Forward {
    ep: Endpoint,
    body: Bytes,
    /// The body's bytes in the aggregate budget, given back when the request is done.
    _hold: budget::BodyHold,
    accept: Option<HeaderValue>,
    /// When the request arrived.
    pub arrived: Instant,
    /// Its prompt tokens, as the router counts them.
    pub prompt_tokens: u32,
    /// The client asked to see the routing decision (`x-routelab-explain`).
    explain: bool,
}

/// How one attempt ended.
enum Attempt {
    /// The worker's answer (a success, or its refusal: 4xx) is the request's answer.
    Answered(Response),
    /// It failed there; another worker may be tried.
    Failed(Fault),
}

/// A failed attempt.
struct Fault {
    worker: WorkerId,
    /// What went wrong, for the log and a 502.
    message: String,
    /// The request log's status if this stays the last failure.
    log: LogStatus,
    /// The worker's 5xx answer, passed to the client if no retry does better.
    answer: Option<Response>,
}

impl Forward {
    /// Route and send the request, retrying on another worker after a failure, up to
    /// `upstream.retries`; the answer is the first worker's that answered, else the last
    /// failure's.
    async fn with_retries(
        &self,
        s: &Arc<Shared>,
        route_req: &RouteRequest<'_>,
        model: &str,
        prefix: &[u64],
        trace: &mut Option<Trace>,
    ) -> Result<Response, ApiError> {
        let mut tries = Tries::default();
        for attempt in 0..=s.settings.retries {
            let (decision, why) = match admit(s, route_req, &tries.tried).await {
                Ok(d) => d,
                Err(refusal) => match tries.refused(refusal, attempt, s, (model, self.ep)) {
                    // No worker left to retry on: the last worker's failure is the answer.
                    None => break,
                    Some(e) => {
                        tries.log_end(trace, LogStatus::Rejected);
                        return Err(e);
                    }
                },
            };
            if attempt > 0 {
                s.global.retries.fetch_add(1, Relaxed);
            }
            tries.tried.push(decision.worker);
            match self.attempt(s, (decision, &why), prefix, trace).await {
                Attempt::Answered(response) => {
                    tries.judge(s, true);
                    return Ok(response);
                }
                Attempt::Failed(fault) => tries.failed(fault, attempt),
            }
        }
        tries.judge(s, false);
        let status = tries
            .last
            .as_ref()
            .map_or(LogStatus::UpstreamError, |f| f.log);
        tries.log_end(trace, status);
        tries.into_answer()
    }

    /// Send the request to the worker the router chose; its slot is freed however it ends.
    async fn attempt(
        &self,
        s: &Arc<Shared>,
        (decision, why): (Decision, &Explanation),
        prefix: &[u64],
        trace: &mut Option<Trace>,
    ) -> Attempt {
        let (found, shown) = {
            let core = s.routing.core();
            let found = core
                .workers
                .get(decision.worker)
                .map(|w| (w.endpoint(self.ep), w.metrics.clone(), w.cfg.name.clone()));
            // Shown only to a log or a client that asked: otherwise not even named.
            let wanted = trace.is_some() || self.explain;
            (found, wanted.then(|| explain::record(&core, why)).flatten())
        };
        let Some((uri, metrics, name)) = found else {
            // Removed between the decision and here: give the slot back.
            let now = s.routing.clock.now();
            s.routing
                .core()
                .release(now, decision.worker, decision.charge, None);
            return Attempt::Failed(Fault {
                worker: decision.worker,
                message: "the worker chosen was removed".into(),
                log: LogStatus::UpstreamError,
                answer: None,
            });
        };
        metrics.requests.fetch_add(1, Relaxed);
        // A worker whose KV event stream is down: record the prompt as `approximate` would.
        s.signals.dispatched(&s.routing, decision.worker, prefix);
        if let Some(t) = trace.as_mut() {
            t.worker(&name);
            if let Some(d) = &shown {
                t.decision(d.clone());
            }
        }
        let mut flight = Flight::new(
            s,
            &decision,
            metrics,
            name,
            (self.arrived, self.prompt_tokens),
        );
        flight.tell_peers(prefix);
        let fault = |message: String, log| {
            Attempt::Failed(Fault {
                worker: decision.worker,
                message,
                log,
                answer: None,
            })
        };
        let uri = match uri {
            Ok(uri) => uri,
            Err(e) => {
                flight.fail_unjudged();
                return fault(e.to_string(), LogStatus::UpstreamError);
            }
        };
        // The response timeout runs until the worker's first body byte (headers may come
        // before a slow prefill is done), so it is counted from here, not from the headers.
        let first_chunk_by = tokio::time::Instant::now() + s.settings.response_timeout;
        match tokio::time::timeout_at(first_chunk_by, self.send(s, &uri)).await {
            Err(_) => {
                flight.fail(false);
                let name = &flight.name;
                fault(
                    format!("worker `{name}` did not answer within the response timeout"),
                    LogStatus::Timeout,
                )
            }
            Ok(Err(e)) => {
                flight.fail(crate::health::ejects_at_once(&e));
                let name = &flight.name;
                fault(
                    format!("worker `{name}`: {}", crate::upstream::error_chain(&e)),
                    LogStatus::UpstreamError,
                )
            }
            Ok(Ok(r)) if r.status().is_server_error() => {
                // Whether the worker or the request is at fault is judged when the request
                // ends ([`Tries::judge`]): here the slot is freed and the answer kept.
                let message = format!("worker `{}` answered {}", flight.name, r.status());
                let answer = server_error(s, r, &flight.name, first_chunk_by).await;
                flight.fail_unjudged();
                Attempt::Failed(Fault {
                    worker: decision.worker,
                    message,
                    log: LogStatus::UpstreamError,
                    answer: Some(answer),
                })
            }
            Ok(Ok(r)) => {
                // This response is the request's answer: its flight writes the log line.
                flight.trace = trace.take();
                let mut answer = respond(s, flight, r, first_chunk_by).await;
                if let Some(v) = shown
                    .as_ref()
                    .filter(|_| self.explain)
                    .and_then(explain::header)
                {
                    answer.headers_mut().insert(explain::ANSWER, v);
                }
                Attempt::Answered(answer)
            }
        }
    }

    /// Send the request to `uri` through the pool, and once more on a fresh connection when
    /// it failed with neither a connect error nor a response head (so no byte of an answer
    /// was read): a kept-alive connection the worker closed just as the request went out.
    /// hyper-util retries by itself only a request canceled before it was written; this one
    /// came back as an incomplete message, and with one worker for the model there was no
    /// other worker to retry on: a rare 502 (issue 42, item 10). A connect error is not
    /// retried here: the worker is not there, and the next worker is the retry.
    async fn send(
        &self,
        s: &Shared,
        uri: &crate::upstream::Target,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match s.client.request(self.request(uri)).await {
            Err(e) if !e.is_connect() => s.fresh.request(self.request(uri)).await,
            answer => answer,
        }
    }

    /// The request to `uri`: the client's body unchanged, its `Accept`.
    fn request(&self, uri: &crate::upstream::Target) -> hyper::Request<Full<Bytes>> {
        let mut up = uri.request(Method::POST);
        if let Some(h) = up.headers_mut() {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(a) = &self.accept {
                h.insert(header::ACCEPT, a.clone());
            }
        }
        up.body(Full::new(self.body.clone()))
            .expect("method, URI and headers are valid")
    }
}

/// The attempts of one request: the workers tried, the failures, and the health verdict they
/// add up to.
#[derive(Default)]
struct Tries {
    tried: Vec<WorkerId>,
    /// Workers that answered this request with a 5xx. Judged when the request ends: a worker
    /// failed where another then answered is at fault; a request that every worker tried
    /// failed with a 5xx is (one bad request retried across the fleet must not eject it).
    server_errors: Vec<WorkerId>,
    last: Option<Fault>,
}

impl Tries {
    /// The answer to a refusal by the router or the queue on attempt `attempt`; `None` when it
    /// only means no other worker is left for a retry.
    fn refused(
        &self,
        refusal: Refusal,
        attempt: u32,
        s: &Shared,
        (model, ep): (&str, Endpoint),
    ) -> Option<ApiError> {
        match refusal {
            Refusal::Route(e) if attempt == 0 => Some(ApiError::route(e, model, ep.prompt_param())),
            Refusal::Route(_) => None,
            Refusal::QueueTimeout => Some(queue_timeout(
                s.settings.queue_timeout,
                self.last.as_ref().map(|f| f.message.as_str()),
            )),
        }
    }

    fn failed(&mut self, fault: Fault, attempt: u32) {
        crate::logging::log(
            "upstream_error",
            &[("attempt", &attempt.to_string()), ("error", &fault.message)],
        );
        if fault.answer.is_some() {
            self.server_errors.push(fault.worker);
        }
        self.last = Some(fault);
    }

    /// Tell the health logic what the 5xx answers meant, now that the request ended
    /// (`answered`: a worker answered it).
    fn judge(&self, s: &Shared, answered: bool) {
        let guilty: &[WorkerId] = match (answered, self.server_errors.as_slice()) {
            (true, all) | (false, all @ [_]) => all,
            (false, several) => {
                if !several.is_empty() {
                    crate::logging::log(
                        "request_specific_error",
                        &[(
                            "note",
                            "every worker tried answered this request with a 5xx; no worker is blamed",
                        )],
                    );
                }
                &[]
            }
        };
        if guilty.is_empty() {
            return;
        }
        let now = s.routing.clock.now();
        let mut core = s.routing.core();
        for &w in guilty {
            core.note_failure(now, w, Failure::Request { hard: false });
        }
    }

    fn log_end(&self, trace: &mut Option<Trace>, status: LogStatus) {
        if let Some(t) = trace.as_mut() {
            t.finish(status, None, None);
        }
    }

    /// The answer when no attempt succeeded: the last worker's own 5xx answer (its status,
    /// `Retry-After` and body) if it gave one, else a 502 naming the last failure.
    fn into_answer(self) -> Result<Response, ApiError> {
        match self.last {
            Some(Fault {
                answer: Some(answer),
                ..
            }) => Ok(answer),
            Some(f) => Err(ApiError::upstream(f.message)),
            None => Err(ApiError::upstream("no worker answered")),
        }
    }
}
