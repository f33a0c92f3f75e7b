//! The OpenAI-compatible request path: parse, route (or queue), forward, stream back.

use crate::error::ApiError;
use crate::prompt::{self, Endpoint};
use crate::reqlog::{LogStatus, Trace};
use crate::state::{Core, Failure, Flight, QueueTicket, Shared};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http_body::Frame;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use routelab_policies::{Decision, RouteError, RouteRequest, WorkerId, WorkerState};
use serde::Deserialize;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
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
pub(crate) async fn models(State(s): State<Arc<Shared>>) -> Response {
    let mut names: Vec<String> = {
        let core = s.core();
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

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "request_too_large",
        format!("the request body is larger than the gateway's limit of {max} bytes"),
    )
}

async fn handle(s: Arc<Shared>, req: Request, ep: Endpoint) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let arrived_at = s.clock.now();
    // The request log's arrival is the real wall clock, whatever `clock_scale` says.
    let arrival_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let (parts, body) = req.into_parts();
    let bytes = read_request_body(&s, &parts.headers, body).await?;
    let mut parsed =
        prompt::parse(&bytes, ep).map_err(|b| ApiError::bad_request(b.message, b.param))?;
    // Exact with the model's tokenizer, else the estimate (crate::tokens).
    let counted = s
        .tokenizers
        .count_async(bytes.clone(), ep, &parsed)
        .await
        .map_err(|b| ApiError::bad_request(b.message, b.param))?;
    parsed.prompt_tokens = counted.prompt_tokens;
    let prefix = counted.prefix;
    let Some(model) = s.core().router.model_id(&parsed.model) else {
        return Err(ApiError::model_not_found(format!(
            "The model `{}` does not exist or no worker serves it",
            parsed.model
        )));
    };
    let route_req = RouteRequest {
        model,
        context_tokens: parsed
            .prompt_tokens
            .saturating_add(parsed.max_tokens.unwrap_or(0)),
        prefix: &prefix,
        prompt_tokens: parsed.prompt_tokens,
    };
    // From here on the request is logged, however it ends (dropped: the client went away).
    let mut trace = s.request_log.as_ref().map(|log| {
        Trace::new(
            log.clone(),
            s.clock,
            arrived_at,
            arrival_unix_ms,
            &parsed.model,
            parsed.prompt_tokens,
            &prefix,
        )
    });
    let forward = Forward {
        ep,
        body: bytes,
        accept: parts.headers.get(header::ACCEPT).cloned(),
        arrived,
        prompt_tokens: parsed.prompt_tokens,
    };
    let mut tries = Tries::default();
    for attempt in 0..=s.settings.retries {
        let decision = match admit(&s, &route_req, &tries.tried).await {
            Ok(d) => d,
            Err(refusal) => match tries.refused(refusal, attempt, &s, &parsed.model) {
                // No worker left to retry on: the last worker's failure is the answer.
                None => break,
                Some(e) => {
                    tries.log_end(&mut trace, LogStatus::Rejected);
                    return Err(e);
                }
            },
        };
        if attempt > 0 {
            s.global.retries.fetch_add(1, Relaxed);
        }
        tries.tried.push(decision.worker);
        match forward.attempt(&s, decision, &prefix, &mut trace).await {
            Attempt::Answered(response) => {
                tries.judge(&s, true);
                return Ok(response);
            }
            Attempt::Failed(fault) => tries.failed(fault, attempt),
        }
    }
    tries.judge(&s, false);
    let status = tries
        .last
        .as_ref()
        .map_or(LogStatus::UpstreamError, |f| f.log);
    tries.log_end(&mut trace, status);
    tries.into_answer()
}

/// The request body, whole, at most `max_body_bytes` (413 above).
async fn read_request_body(
    s: &Shared,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Bytes, ApiError> {
    let max = s.settings.max_body;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(max)),
        Err(e) => Err(ApiError::bad_request(
            format!("could not read the request body: {e}"),
            None,
        )),
    }
}

/// What the request sends to a worker, on each attempt.
pub(crate) struct Forward {
    ep: Endpoint,
    body: Bytes,
    accept: Option<HeaderValue>,
    /// When the request arrived.
    pub arrived: Instant,
    /// Its prompt tokens, as the router counts them.
    pub prompt_tokens: u32,
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
    /// Send the request to the worker the router chose; its slot is freed however it ends.
    async fn attempt(
        &self,
        s: &Arc<Shared>,
        decision: Decision,
        prefix: &[u64],
        trace: &mut Option<Trace>,
    ) -> Attempt {
        let found = {
            let core = s.core();
            core.workers.get(decision.worker).map(|w| {
                (
                    w.base.join(self.ep.path()),
                    w.metrics.clone(),
                    w.cfg.name.clone(),
                )
            })
        };
        let Some((uri, metrics, name)) = found else {
            // Removed between the decision and here: give the slot back.
            let now = s.clock.now();
            s.core()
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
        s.signals.dispatched(s, decision.worker, prefix);
        if let Some(t) = trace.as_mut() {
            t.worker(&name);
        }
        let mut flight = Flight::new(s, &decision, metrics, name, self);
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
        let up = self.request(uri);
        // The response timeout runs until the worker's first body byte (headers may come
        // before a slow prefill is done), so it is counted from here, not from the headers.
        let first_chunk_by = tokio::time::Instant::now() + s.settings.response_timeout;
        match tokio::time::timeout_at(first_chunk_by, s.client.request(up)).await {
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
                    format!("worker `{name}`: {}", error_chain(&e)),
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
                Attempt::Answered(respond(s, flight, r, first_chunk_by).await)
            }
        }
    }

    /// The request to `uri`: the client's body unchanged, its `Accept`.
    fn request(&self, uri: hyper::Uri) -> hyper::Request<Full<Bytes>> {
        let mut up = hyper::Request::post(uri);
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
    fn refused(&self, refusal: Refusal, attempt: u32, s: &Shared, model: &str) -> Option<ApiError> {
        match refusal {
            Refusal::Route(e) if attempt == 0 => Some(ApiError::route(e, model)),
            Refusal::Route(_) => None,
            Refusal::QueueTimeout => Some(queue_timeout(
                s.settings.queue_timeout,
                self.last.as_ref().map(|f| f.message.as_str()),
            )),
        }
    }

    fn failed(&mut self, fault: Fault, attempt: u32) {
        crate::log(
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
                    crate::log(
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
        let now = s.clock.now();
        let mut core = s.core();
        for &w in guilty {
            core.note_failure(now, w, Failure::Request { hard: false }, s);
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

/// An error with its sources (hyper's own message is terse: "client error (Connect)").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Why a request got no worker.
enum Refusal {
    /// The router refused it (for a queued request: when its wait ended, e.g. every worker
    /// was ejected meanwhile: 503, not 429).
    Route(RouteError),
    /// It waited `queue_timeout_s` in the queue and every eligible worker stayed at its cap.
    QueueTimeout,
}

/// 429: the request waited `waited` in the queue; `earlier` is the failure that made it a
/// retry, if it was one.
fn queue_timeout(waited: std::time::Duration, earlier: Option<&str>) -> ApiError {
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

/// Route to a worker not in `tried` (empty for a first attempt; a retry's failed workers
/// otherwise), or wait in the gateway's FIFO queue, for at most `queue_timeout_s`, when every
/// such worker is at its cap. A retry waits only if an untried worker that could take it
/// exists (up, same model, large enough window); otherwise it is refused at once.
async fn admit(
    s: &Arc<Shared>,
    req: &RouteRequest<'_>,
    tried: &[WorkerId],
) -> Result<Decision, Refusal> {
    let mut ticket = {
        let now = s.clock.now();
        let mut guard = s.core();
        let core = &mut *guard;
        match core.router.route_excluding(now, req, tried, &mut core.rng) {
            Ok(d) => return Ok(d),
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
            let mut core = s.core();
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
        Some(Ok(d)) if !tried.contains(&d.worker) => Ok(d),
        Some(Ok(handed)) => {
            // The router's queue knows nothing of `tried`: it handed this retry a worker
            // that already failed it. Prefer an untried one with room, giving the handed
            // slot back (to the next in the queue). With none, go with the handed one:
            // giving it back and queueing again would have the queue hand it straight
            // back (a spin); the retry budget bounds this, and a worker that keeps
            // failing is ejected, after which the queue no longer hands it out.
            let now = s.clock.now();
            let mut guard = s.core();
            let core = &mut *guard;
            match core.router.route_excluding(now, req, tried, &mut core.rng) {
                Ok(d) => {
                    core.release(now, handed.worker, handed.charge, None);
                    Ok(d)
                }
                Err(_) => Ok(handed),
            }
        }
        Some(Err(e)) => Err(Refusal::Route(e)),
        None => {
            // The wait is over. One last look tells a fleet that stayed full (429) from
            // one whose workers were all ejected meanwhile (503, `no_healthy_worker`).
            let now = s.clock.now();
            let mut guard = s.core();
            let core = &mut *guard;
            match core.router.route_excluding(now, req, tried, &mut core.rng) {
                Ok(d) => Ok(d),
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

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Copy a worker's end-to-end headers: not the hop-by-hop ones (RFC 9110 §7.6.1), and not
/// those the worker's `Connection` header names, which are hop-by-hop for that one connection.
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    for (k, v) in from {
        let k_str = k.as_str();
        if !HOP_BY_HOP.contains(&k_str) && !named.iter().any(|n| n == k_str) {
            to.append(k.clone(), v.clone());
        }
    }
}

/// Response header naming the worker that served the request (set on every answer that came
/// from a worker, streaming or not), so a client or a load generator can attribute it.
pub const WORKER_HEADER: &str = "x-routelab-worker";
/// The response header with the prompt tokens the router believed the chosen worker had
/// cached when it chose it (what the simulator records as `believed_cached_tokens`).
pub const BELIEVED_CACHED_HEADER: &str = "x-routelab-believed-cached-tokens";

/// Pass the worker's answer to the client: SSE frame by frame, anything else buffered (a
/// non-streaming completion is small, and buffering lets a broken body become a clean 502).
/// The first body chunk must come by `first_chunk_by`; after that, no gap between two chunks
/// may exceed the stream idle timeout.
async fn respond(
    s: &Arc<Shared>,
    mut flight: Flight,
    r: hyper::Response<Incoming>,
    first_chunk_by: tokio::time::Instant,
) -> Response {
    let (parts, mut body) = r.into_parts();
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut out = answer_head(&parts, &flight.name);
    out.headers_mut().insert(
        BELIEVED_CACHED_HEADER,
        HeaderValue::from(flight.charge.tokens.saturating_sub(flight.charge.uncached)),
    );
    let idle = s.settings.stream_idle_timeout;
    // Only a generation counts in the capacity curve, not an error body.
    flight.curve = parts.status.is_success().then_some(!is_sse);
    if is_sse && parts.status.is_success() {
        *out.body_mut() = Body::new(SseBody {
            inner: body,
            flight,
            scan: SseScan::default(),
            done: false,
            stall: StallTimer::new(first_chunk_by, idle),
        });
        return out;
    }
    let mut stall = StallTimer::new(first_chunk_by, idle);
    let read = read_body(s, &parts.headers, &mut body, &mut stall, || {
        flight.first_byte()
    })
    .await;
    let buf = match read {
        Ok(buf) => buf,
        Err(failure) => {
            let (status, err) =
                failure.answer(&flight.name, idle, flight.first_token_at.is_some(), s);
            flight.log_end(status, None);
            if matches!(failure, BodyFailure::TooLarge) {
                // The worker answered; the answer is too large to relay, not a sick worker.
                flight.abandon();
            } else {
                flight.fail(false);
            }
            return err.into_response();
        }
    };
    if parts.status.is_success() {
        let output = output_tokens_of_json(&buf);
        flight.complete(output, Some(output));
    } else {
        // The worker refused the request (4xx): the client's fault, not the worker's.
        flight.log_end(LogStatus::Rejected, None);
        flight.abandon();
    }
    *out.body_mut() = Body::from(buf);
    out
}

/// The head of the answer relayed from a worker: its status and end-to-end headers, and the
/// worker's name.
fn answer_head(parts: &hyper::http::response::Parts, worker: &str) -> Response {
    let mut out = Response::new(Body::empty());
    *out.status_mut() = parts.status;
    copy_headers(&parts.headers, out.headers_mut());
    if let Ok(v) = HeaderValue::from_str(worker) {
        out.headers_mut().insert(WORKER_HEADER, v);
    }
    out
}

/// A worker's 5xx answer, read whole (bounded as any buffered body), to pass on to the client
/// if it stays the request's last answer: the worker's status, its `Retry-After` and its
/// body. A body that cannot be read whole is replaced by the gateway's own error saying why.
async fn server_error(
    s: &Shared,
    r: hyper::Response<Incoming>,
    worker: &str,
    first_chunk_by: tokio::time::Instant,
) -> Response {
    let (parts, mut body) = r.into_parts();
    let mut out = answer_head(&parts, worker);
    let idle = s.settings.stream_idle_timeout;
    let mut stall = StallTimer::new(first_chunk_by, idle);
    match read_body(s, &parts.headers, &mut body, &mut stall, || {}).await {
        Ok(buf) => *out.body_mut() = Body::from(buf),
        Err(failure) => {
            let (_, err) = failure.answer(worker, idle, false, s);
            out.headers_mut().remove(header::CONTENT_TYPE);
            out.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            *out.body_mut() = Body::from(err.body().to_string());
        }
    }
    out
}

/// Read a worker's body whole: at most `upstream.max_response_bytes` (refused at once when its
/// `Content-Length` says more), its first chunk by the stall timer's deadline and no longer
/// gap than the stream idle timeout, the whole within the response timeout. `first_chunk` is
/// called at each non-empty chunk.
async fn read_body(
    s: &Shared,
    headers: &HeaderMap,
    body: &mut Incoming,
    stall: &mut StallTimer,
    mut first_chunk: impl FnMut(),
) -> Result<Bytes, BodyFailure> {
    let limit = s.settings.max_response_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyFailure::TooLarge);
    }
    let mut buf = BytesMut::new();
    let read = tokio::time::timeout(s.settings.response_timeout, async {
        loop {
            let frame = tokio::select! {
                // The body first: the stall timer is asked only when there is nothing to read.
                biased;
                frame = body.frame() => frame,
                () = std::future::poll_fn(|cx| stall.poll_stalled(cx)) => return Err(BodyFailure::Stalled),
            };
            let Some(frame) = frame else {
                return Ok(());
            };
            let frame = frame.map_err(BodyFailure::Broken)?;
            if let Ok(d) = frame.into_data() {
                if !d.is_empty() {
                    first_chunk();
                    stall.chunk();
                }
                if buf.len() + d.len() > limit {
                    return Err(BodyFailure::TooLarge);
                }
                buf.extend_from_slice(&d);
            }
        }
    })
    .await;
    match read {
        Ok(Ok(())) => Ok(buf.freeze()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(BodyFailure::TimedOut),
    }
}

/// Why a buffered body did not arrive whole.
enum BodyFailure {
    Broken(hyper::Error),
    Stalled,
    TimedOut,
    /// Longer than `upstream.max_response_bytes`.
    TooLarge,
}

impl BodyFailure {
    /// The request log's status and the client's answer (`started`: a first chunk came).
    fn answer(
        &self,
        worker: &str,
        idle: std::time::Duration,
        started: bool,
        s: &Shared,
    ) -> (LogStatus, ApiError) {
        match self {
            BodyFailure::Broken(e) => (
                LogStatus::UpstreamError,
                ApiError::upstream(format!("the worker's response broke: {}", error_chain(e))),
            ),
            BodyFailure::Stalled => (LogStatus::Timeout, stalled(worker, idle, started)),
            BodyFailure::TimedOut => (
                LogStatus::Timeout,
                ApiError::upstream(
                    "the worker's response did not finish within the response timeout",
                ),
            ),
            BodyFailure::TooLarge => {
                let limit = s.settings.max_response_bytes;
                crate::log(
                    "response_too_large",
                    &[("worker", worker), ("limit_bytes", &limit.to_string())],
                );
                (
                    LogStatus::UpstreamError,
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        "response_too_large",
                        format!(
                            "worker `{worker}` sent a response larger than the gateway relays whole ({limit} bytes, upstream.max_response_bytes); ask for `stream: true`"
                        ),
                    ),
                )
            }
        }
    }
}

/// The answer (a 502, or the SSE error event of a stream) when a worker's body stalled:
/// `started` (a first chunk came) it went silent longer than `idle`, else its first chunk did
/// not come within the response timeout. Logged, since the worker is at fault.
fn stalled(worker: &str, idle: std::time::Duration, started: bool) -> ApiError {
    if !started {
        crate::log(
            "stream_stalled",
            &[("worker", worker), ("before", "first_chunk")],
        );
        return ApiError::upstream(format!(
            "worker `{worker}` sent no response body within the response timeout (upstream.response_timeout_s)"
        ));
    }
    let secs = format!("{:.3}", idle.as_secs_f64());
    crate::log("stream_stalled", &[("worker", worker), ("idle_s", &secs)]);
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        "stream_idle_timeout",
        format!(
            "worker `{worker}` sent nothing for {secs} s in the middle of its response (upstream.stream_idle_timeout_s)"
        ),
    )
}

/// When a worker's body counts as stalled: no chunk by the first-chunk deadline, then a wait
/// for the next chunk longer than `idle`. The wait starts when the gateway next asks for data
/// after a chunk, not at the chunk: a client that reads slowly holds the gateway back, and
/// that time must not count against the worker. The timer is only moved earlier at once; a
/// later deadline is taken up when the timer fires early, so a fast stream does not re-arm a
/// timer for every token.
struct StallTimer {
    sleep: Pin<Box<tokio::time::Sleep>>,
    deadline: tokio::time::Instant,
    idle: std::time::Duration,
    /// A chunk came since the deadline was last set.
    fresh: bool,
}

impl StallTimer {
    fn new(first_chunk_by: tokio::time::Instant, idle: std::time::Duration) -> StallTimer {
        StallTimer {
            sleep: Box::pin(tokio::time::sleep_until(first_chunk_by)),
            deadline: first_chunk_by,
            idle,
            fresh: false,
        }
    }

    /// A body chunk arrived.
    fn chunk(&mut self) {
        self.fresh = true;
    }

    /// Ready once the deadline passed without a chunk. Call it when the body has nothing.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.fresh {
            self.fresh = false;
            self.deadline = tokio::time::Instant::now() + self.idle;
            // Earlier than the armed timer (the first chunk's deadline, when the idle timeout
            // is the shorter): move it now.
            if self.deadline < self.sleep.deadline() {
                let next = self.deadline;
                self.sleep.as_mut().reset(next);
            }
        }
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.sleep.deadline() >= self.deadline {
                return Poll::Ready(());
            }
            let next = self.deadline;
            self.sleep.as_mut().reset(next);
        }
    }
}

#[derive(Deserialize)]
struct UsageOnly {
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    completion_tokens: Option<u32>,
    #[serde(default)]
    prompt_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct ChoicesOnly {
    #[serde(default)]
    choices: Vec<serde_json::Value>,
}

/// A non-streaming response's `usage.completion_tokens`.
fn usage_tokens(body: &[u8]) -> Option<u32> {
    match serde_json::from_slice(body) {
        Ok(UsageOnly {
            usage:
                Some(Usage {
                    completion_tokens: Some(n),
                    ..
                }),
        }) => Some(n),
        _ => None,
    }
}

/// Output tokens of a non-streaming response: `usage.completion_tokens`, else the text's
/// bytes / 4.
fn output_tokens_of_json(body: &[u8]) -> u32 {
    if let Some(n) = usage_tokens(body) {
        return n;
    }
    let Ok(c) = serde_json::from_slice::<ChoicesOnly>(body) else {
        return 0;
    };
    let bytes: usize = c
        .choices
        .iter()
        .map(|ch| {
            ch.get("text")
                .or_else(|| ch.get("message").and_then(|m| m.get("content")))
                .and_then(serde_json::Value::as_str)
                .map_or(0, str::len)
        })
        .sum();
    prompt::estimate_tokens(bytes)
}

/// Counts SSE `data:` events and content events, and picks up a final `usage`.
#[derive(Debug, Default)]
pub(crate) struct SseScan {
    carry: Vec<u8>,
    data_events: u32,
    /// Events that carry output text (one token each, as engines stream).
    content_events: u32,
    usage: Option<u32>,
    /// The final usage's `prompt_tokens`, if it had one.
    usage_prompt: Option<u32>,
    /// The stream's `data: [DONE]` passed.
    done: bool,
}

/// True if an SSE `data:` payload carries output text: a non-empty `"content"` (chat) or
/// `"text"` (completions) string, compact or with spaces after the colon (as Python's `json`
/// writes it). Recognised without a JSON parse: content events are the bulk of a stream.
pub fn is_content_event(payload: &[u8]) -> bool {
    [&b"\"content\":"[..], &b"\"text\":"[..]].iter().any(|key| {
        payload
            .windows(key.len())
            .position(|w| w == *key)
            .is_some_and(|i| {
                let mut rest = payload[i + key.len()..]
                    .iter()
                    .skip_while(|b| b.is_ascii_whitespace());
                rest.next() == Some(&b'"') && rest.next().is_some_and(|&b| b != b'"')
            })
    })
}

/// Longest partial line kept between chunks.
const MAX_CARRY: usize = 1 << 20;

impl SseScan {
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
            if self.carry.is_empty() {
                self.line(&chunk[..pos]);
            } else {
                let mut line = std::mem::take(&mut self.carry);
                line.extend_from_slice(&chunk[..pos]);
                self.line(&line);
                line.clear();
                self.carry = line;
            }
            chunk = &chunk[pos + 1..];
        }
        if self.carry.len() + chunk.len() <= MAX_CARRY {
            self.carry.extend_from_slice(chunk);
        } else {
            self.carry.clear();
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            self.done = true;
            return;
        }
        self.data_events += 1;
        if is_content_event(payload) {
            self.content_events += 1;
        }
        if payload
            .windows(b"\"completion_tokens\"".len())
            .any(|w| w == b"\"completion_tokens\"")
            && let Ok(UsageOnly {
                usage:
                    Some(Usage {
                        completion_tokens: Some(n),
                        prompt_tokens,
                    }),
            }) = serde_json::from_slice(payload)
        {
            self.usage = Some(n);
            self.usage_prompt = prompt_tokens;
        }
    }

    /// Events that carried output text so far (one token each, as engines stream).
    pub(crate) fn content_events(&self) -> u32 {
        self.content_events
    }

    /// Whether the stream's `data: [DONE]` passed.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// The final `usage.completion_tokens` if the stream had one, else the data events.
    pub fn output_tokens(&self) -> u32 {
        self.usage.unwrap_or(self.data_events)
    }

    /// The final `usage.prompt_tokens` if the stream had one (the engine's own count).
    pub(crate) fn prompt_tokens(&self) -> Option<u32> {
        self.usage_prompt
    }

    /// The request log's output tokens: the final usage, else the content events, else (no
    /// event came) none.
    pub fn logged_output(&self) -> Option<u32> {
        self.usage
            .or((self.data_events > 0).then_some(self.content_events))
    }
}

/// A worker's SSE stream, passed through frame by frame as it arrives. The first frame is the
/// request's first token for the router; the end completes it; a broken or stalled upstream
/// stream ends with an SSE error event (`data: {"error": {...}}`), never a silent truncation
/// nor a client left waiting. Dropped early (client gone), it frees the worker's slot and the
/// upstream connection closes.
struct SseBody {
    inner: Incoming,
    flight: Flight,
    scan: SseScan,
    done: bool,
    stall: StallTimer,
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.stall.poll_stalled(cx).is_pending() {
                    return Poll::Pending;
                }
                // The worker went silent: the request failed (slot freed, health told), and
                // the client hears so now rather than waiting for a worker that may never
                // send again. Ending the body drops the upstream connection.
                this.done = true;
                this.flight
                    .log_end(LogStatus::Timeout, this.scan.logged_output());
                this.flight.fail(false);
                let err = stalled(
                    &this.flight.name,
                    this.stall.idle,
                    this.flight.first_token_at.is_some(),
                );
                Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && !d.is_empty()
                {
                    this.flight.first_byte();
                    let before = this.scan.content_events;
                    this.scan.feed(d);
                    this.flight.tokens(this.scan.content_events - before);
                    this.stall.chunk();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                this.flight
                    .log_end(LogStatus::UpstreamError, this.scan.logged_output());
                this.flight.fail(false);
                let chain = error_chain(&e);
                crate::log(
                    "stream_broken",
                    &[("worker", &this.flight.name), ("error", &chain)],
                );
                let err = ApiError::upstream(format!(
                    "the worker's stream broke after the first byte: {chain}"
                ));
                Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
            }
            Poll::Ready(None) => {
                this.done = true;
                this.flight
                    .complete(this.scan.output_tokens(), this.scan.logged_output());
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl Drop for SseBody {
    /// Dropped before the worker's body ended. After `data: [DONE]` passed, the response was
    /// whole (a client may close as soon as it reads `[DONE]`, before the body's end is
    /// polled): it completed. Before, the client went away mid-stream; the log keeps what it
    /// got.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.scan.done {
            self.flight
                .complete(self.scan.output_tokens(), self.scan.logged_output());
        } else {
            self.flight
                .log_end(LogStatus::ClientGone, self.scan.logged_output());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_scan_counts_events_across_chunk_boundaries() {
        let mut s = SseScan::default();
        s.feed(b"data: {\"a\":1}\n\ndata: {\"b\"");
        s.feed(b":2}\n\nda");
        s.feed(b"ta: [DONE]\n\n");
        assert_eq!(s.output_tokens(), 2);
        s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":17}}\r\n\r\n");
        assert_eq!(s.output_tokens(), 17);
    }

    /// Content events are the ones with output text: not a chat stream's role event (empty
    /// content), its finish event, nor the usage event.
    #[test]
    fn sse_scan_counts_content_events_for_the_log_and_the_curve() {
        let mut s = SseScan::default();
        assert_eq!(s.logged_output(), None);
        s.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        assert_eq!(s.logged_output(), Some(0));
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\" sea\"}}]}\n\ndata: {\"choices\":[{\"text\":\" sky\"}]}\n\n");
        s.feed(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n");
        assert_eq!((s.content_events, s.data_events), (2, 4));
        assert_eq!(s.logged_output(), Some(2));
        s.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":9}}\n\n");
        assert_eq!(s.logged_output(), Some(9));
        assert!(!s.done);
        s.feed(b"data: [DONE]\n\n");
        assert!(s.done);
        assert!(!is_content_event(br#"{"choices":[{"text":""}]}"#));
        // Spaces after the colon (Python's json) count the same; an empty string still not.
        assert!(is_content_event(
            br#"{"choices": [{"delta": {"content": " sea"}}]}"#
        ));
        assert!(!is_content_event(
            br#"{"choices": [{"delta": {"content": ""}}]}"#
        ));
        assert!(!is_content_event(
            br#"{"choices": [{"delta": {"content": null}}]}"#
        ));
    }

    /// The idle wait starts when the gateway asks for more, so a client that reads slowly
    /// (and so holds the gateway back) does not make a worker look stalled; the first chunk
    /// is due by its own deadline.
    #[tokio::test]
    async fn the_stall_timer_counts_only_the_workers_silence() {
        use std::time::Duration;
        use tokio::time::Instant;
        let idle = Duration::from_millis(100);
        let mut t = StallTimer::new(Instant::now() + Duration::from_secs(60), idle);
        t.chunk();
        tokio::time::sleep(idle * 3).await;
        let first = std::future::poll_fn(|cx| Poll::Ready(t.poll_stalled(cx))).await;
        assert!(first.is_pending());
        let asked = Instant::now();
        std::future::poll_fn(|cx| t.poll_stalled(cx)).await;
        let waited = asked.elapsed();
        assert!(waited >= idle * 9 / 10, "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");

        let started = Instant::now();
        let mut t = StallTimer::new(started + idle, Duration::from_secs(60));
        std::future::poll_fn(|cx| t.poll_stalled(cx)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn json_output_tokens() {
        assert_eq!(
            output_tokens_of_json(br#"{"usage":{"completion_tokens":9}}"#),
            9
        );
        assert_eq!(
            output_tokens_of_json(br#"{"choices":[{"message":{"content":"12345678"}}]}"#),
            2
        );
        assert_eq!(output_tokens_of_json(b"nope"), 0);
    }
}
