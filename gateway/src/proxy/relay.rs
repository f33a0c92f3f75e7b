//! A worker's answer passed back to the client: its status and end-to-end headers, its body
//! buffered (bounded, timed) or streamed ([`super::sse`]), and the stall timer that tells a
//! silent worker from a slow client.

use super::flight::Flight;
use super::sse::{SseBody, output_tokens_of_json};
use crate::app::shared::Shared;
use crate::error::ApiError;
use crate::reqlog::LogStatus;
use crate::upstream::{declared_length, error_chain};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

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
pub(super) async fn respond(
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
        *out.body_mut() = Body::new(SseBody::new(
            body,
            flight,
            StallTimer::new(first_chunk_by, idle),
        ));
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
pub(super) async fn server_error(
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
    if declared_length(headers).is_some_and(|n| n > limit as u64) {
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
                crate::logging::log(
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
pub(super) fn stalled(worker: &str, idle: std::time::Duration, started: bool) -> ApiError {
    if !started {
        crate::logging::log(
            "stream_stalled",
            &[("worker", worker), ("before", "first_chunk")],
        );
        return ApiError::upstream(format!(
            "worker `{worker}` sent no response body within the response timeout (upstream.response_timeout_s)"
        ));
    }
    let secs = format!("{:.3}", idle.as_secs_f64());
    crate::logging::log("stream_stalled", &[("worker", worker), ("idle_s", &secs)]);
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
pub(super) struct StallTimer {
    sleep: Pin<Box<tokio::time::Sleep>>,
    deadline: tokio::time::Instant,
    pub(super) idle: std::time::Duration,
    /// A chunk came since the deadline was last set.
    fresh: bool,
}

impl StallTimer {
    pub(super) fn new(
        first_chunk_by: tokio::time::Instant,
        idle: std::time::Duration,
    ) -> StallTimer {
        StallTimer {
            sleep: Box::pin(tokio::time::sleep_until(first_chunk_by)),
            deadline: first_chunk_by,
            idle,
            fresh: false,
        }
    }

    /// A body chunk arrived.
    pub(super) fn chunk(&mut self) {
        self.fresh = true;
    }

    /// Ready once the deadline passed without a chunk. Call it when the body has nothing.
    pub(super) fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
