//! The client-facing HTTP server: our own accept loop over hyper's HTTP/1 connection, so that
//! slow and silent clients cannot hold the gateway (`server.*` in the configuration).
//!
//! - **Header read timeout** (`server.header_read_timeout_s`): hyper closes a connection that
//!   has not completed a request head within it, counted from when the connection opened or
//!   its previous response went out; it stops slowloris clients and frees idle keep-alive
//!   connections.
//! - **Body read timeout** (`server.body_read_timeout_s`): every request body is wrapped in a
//!   [`DeadlineBody`] that fails once the deadline passes with the body unfinished; whatever a
//!   handler answered is then replaced by a 408 with `Connection: close`.
//! - **Connection cap** (`server.max_connections`, per listener): one connection beyond it is
//!   answered a minimal `503` in OpenAI's error shape with `Connection: close`, logged (at
//!   most once a second, with the count) and counted in [`ConnectionStats`].
//! - **Admin split** (`admin_listen`): with a separate admin listener, the public one answers
//!   404 to every `/admin` path and the admin one answers 404 to everything else.
//! - **Graceful shutdown**: on the signal the accept loop stops, every connection finishes its
//!   in-flight request and closes, and [`serve`] returns once all have.

use crate::drain::{CUT_GRACE, Drain};
use crate::error::ApiError;
use crate::metrics::registry::GlobalMetrics;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

pub(crate) mod limits;

pub use limits::ConnectionStats;
pub(crate) use limits::Limits;

/// Which paths a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Everything (no separate admin listener).
    All,
    /// Everything but `/admin` (the public listener when `admin_listen` is set).
    Public,
    /// Only `/admin` (the admin listener).
    Admin,
}

/// The admin surface: `/admin` and everything under it.
pub(crate) fn is_admin_path(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/")
}

/// The HTTP routes as this listener serves them: around `routes`, the scope's filter, the `Host`
/// rule and the body deadline, and outermost the count of every rejection (into the metrics
/// registry's `global`), so that the answers those layers give are counted as what they are (a 408 used to
/// be counted as the 400 the handler saw when its body was cut).
pub(crate) fn scoped(
    routes: axum::Router,
    scope: Scope,
    limits: Limits,
    global: Arc<GlobalMetrics>,
) -> axum::Router {
    let routes = match scope {
        Scope::All => routes,
        Scope::Public | Scope::Admin => {
            routes.layer(axum::middleware::from_fn_with_state(scope, scope_filter))
        }
    };
    routes
        .layer(axum::middleware::from_fn_with_state(
            limits.body_read_timeout,
            body_deadline,
        ))
        .layer(axum::middleware::map_response_with_state(
            global,
            count_rejections,
        ))
}

/// Middleware (outermost, `server::scoped`): count every answer built from an `ApiError`, whichever
/// handler, extractor or layer made it, from the [`RejectionCode`](crate::error::RejectionCode) it carries.
pub(crate) async fn count_rejections(
    State(global): State<Arc<GlobalMetrics>>,
    r: Response,
) -> Response {
    if let Some(crate::error::RejectionCode(code)) =
        r.extensions().get::<crate::error::RejectionCode>().copied()
    {
        global.count_rejection(r.status().as_u16(), code);
    }
    r
}

/// RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any HTTP/1.1
/// request message that lacks a Host header field and to any request message that contains
/// more than one Host header field line or a Host header field with an invalid field value."
/// An HTTP/1.0 request may leave it out. The refusal, if any.
fn host_rule(req: &Request) -> Option<Response> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let problem = match (hosts.next(), hosts.next()) {
        (None, _) if req.version() >= axum::http::Version::HTTP_11 => {
            Some("an HTTP/1.1 request must have a `Host` header")
        }
        (Some(_), Some(_)) => Some("a request must have one `Host` header, not several"),
        (Some(h), None) if !valid_host(h) => Some("the `Host` header is not a valid host"),
        _ => None,
    };
    if let Some(message) = problem {
        return Some(
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_host",
                message,
            )
            .into_response(),
        );
    }
    // Two credentials: which one the admin door or a worker would read is anyone's guess.
    let mut auth = req.headers().get_all(header::AUTHORIZATION).iter();
    (auth.next().is_some() && auth.next().is_some()).then(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_authorization",
            "a request must have one `Authorization` header, not several",
        )
        .into_response()
    })
}

/// RFC 9110 §7.2: `Host = uri-host [ ":" port ]`, an authority without user information (`a b`
/// and `user@host` were accepted).
fn valid_host(h: &HeaderValue) -> bool {
    h.to_str().is_ok_and(|s| {
        !s.is_empty() && !s.contains('@') && s.parse::<axum::http::uri::Authority>().is_ok()
    })
}

async fn scope_filter(State(scope): State<Scope>, req: Request, next: Next) -> Response {
    let admin = is_admin_path(req.uri().path());
    let served = match scope {
        Scope::All => true,
        Scope::Public => !admin,
        Scope::Admin => admin,
    };
    if served {
        next.run(req).await
    } else {
        // The same answer as a path no listener serves: the split does not advertise itself.
        ApiError::unknown_path(req.method().as_str(), req.uri().path()).into_response()
    }
}

/// Why a request body was cut.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub struct BodyReadTimeout(Duration);

/// The request's own checks, in one layer (each layer costs a boxed future per request): the
/// `Host` rule, and the body deadline (a body not received by then is answered 408).
async fn body_deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    if let Some(refused) = host_rule(&req) {
        return refused;
    }
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + limit;
    let req = req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            limit,
            deadline,
            sleep: None,
            timed_out: timed_out.clone(),
        })
    });
    let response = next.run(req).await;
    if !timed_out.load(Relaxed) {
        return response;
    }
    let mut r = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        "request_timeout",
        format!(
            "the request body was not received within server.body_read_timeout_s ({} s)",
            limit.as_secs_f64()
        ),
    )
    .into_response();
    // The rest of the body is still on the wire: the connection cannot carry another request.
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A request body that fails if it has not ended by `deadline`.
struct DeadlineBody {
    inner: Body,
    limit: Duration,
    deadline: Instant,
    /// Armed the first time the body is not ready (most bodies are, so most requests never
    /// register a timer).
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.timed_out.load(Relaxed) {
            // Never an end of stream: that would pass a truncated body off as whole.
            return Poll::Ready(Some(Err(axum::Error::new(BodyReadTimeout(this.limit)))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    this.timed_out.store(true, Relaxed);
                    Poll::Ready(Some(Err(axum::Error::new(BodyReadTimeout(this.limit)))))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Accept connections on `listener` and serve `routes` on them until `shutdown` turns true;
/// then let every connection finish its request and return when all are closed. At the drain
/// deadline the streams still running are cut (`drain`), and their connections closed
/// [`CUT_GRACE`] later.
pub(crate) async fn serve(
    listener: TcpListener,
    routes: axum::Router,
    limits: Limits,
    stats: Arc<ConnectionStats>,
    (mut shutdown, drain): (watch::Receiver<bool>, Drain),
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    // Connections closed at the drain deadline with a request still running.
    let cut = Arc::new(AtomicU64::new(0));
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors, mostly: retrying at once would spin. Connections
                // that close meanwhile free descriptors.
                crate::logging::log(
                    "accept_failed",
                    &[("listen", &local), ("error", &e.to_string())],
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            reject(tcp, peer, &local, limits.max_connections, &stats);
            continue;
        };
        let routes = routes.clone();
        let stats = stats.clone();
        let shutdown = shutdown.clone();
        let cut = cut.clone();
        tokio::spawn(async move {
            stats.open.fetch_add(1, Relaxed);
            connection(tcp, peer, routes, limits, shutdown, &cut).await;
            stats.open.fetch_sub(1, Relaxed);
            drop(slot);
        });
    }
    // New clients are refused from now on, rather than left waiting in the backlog.
    drop(listener);
    // Every connection holds a slot until it closes: all slots back means all closed (each
    // closes by the drain deadline at the latest).
    let all_closed = slots.acquire_many(limits.max_connections);
    tokio::pin!(all_closed);
    let reached = tokio::select! {
        _ = all_closed.as_mut() => false,
        () = tokio::time::sleep(limits.drain_timeout) => {
            drain.cut();
            let _ = all_closed.await;
            true
        }
    };
    let cut = cut.load(Relaxed);
    // Streams cut at the deadline end themselves (and their connections close in time); the
    // line is written whenever the deadline came with a connection still open.
    if cut > 0 || reached {
        crate::logging::log(
            "drain_timeout",
            &[
                ("listen", &local),
                ("connections_cut", &cut.to_string()),
                (
                    "drain_timeout_s",
                    &limits.drain_timeout.as_secs_f64().to_string(),
                ),
            ],
        );
    }
}

/// Serve one connection until it closes (gracefully, once `shutdown` turns true).
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    routes: axum::Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    cut: &AtomicU64,
) {
    let service = TowerToHyperService::new(routes);
    // Handlers may ask who the client is (`ConnectInfo<SocketAddr>`), as with `axum::serve`.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        hyper::service::Service::call(&service, req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    // Errors (a client that went away, a header timeout) end the connection; nothing to add.
    // A request still running at the drain deadline is cut with its connection: a stream
    // trickling for minutes must not hold the shutdown.
    if tokio::time::timeout(limits.drain_timeout + CUT_GRACE, conn)
        .await
        .is_err()
    {
        cut.fetch_add(1, Relaxed);
    }
}

/// How many over-the-cap connections are answered at once; beyond it they are closed without
/// an answer, so that a flood cannot make the answers themselves hold descriptors.
const MAX_PENDING_REJECTIONS: usize = 64;

/// Answer a connection beyond the cap with a 503 and close it.
fn reject(tcp: TcpStream, peer: SocketAddr, local: &str, cap: u32, stats: &ConnectionStats) {
    static PENDING: Semaphore = Semaphore::const_new(MAX_PENDING_REJECTIONS);
    let rejected = stats.rejected.fetch_add(1, Relaxed) + 1;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if stats.last_rejection_log_s.swap(now_s, Relaxed) != now_s {
        crate::logging::log(
            "connection_rejected",
            &[
                ("listen", local),
                ("peer", &peer.to_string()),
                ("max_connections", &cap.to_string()),
                ("rejected_total", &rejected.to_string()),
            ],
        );
    }
    let Ok(pending) = PENDING.try_acquire() else {
        return;
    };
    pending.forget();
    tokio::spawn(async move {
        let answer = rejection_bytes(cap);
        // Bounded: a client that does not read cannot hold the descriptor.
        let _ = tokio::time::timeout(Duration::from_secs(1), async move {
            let mut tcp = tcp;
            tcp.write_all(&answer).await?;
            tcp.shutdown().await?;
            // Read what the client sent until it closes too: closing a socket with unread
            // data resets it, and a reset can destroy the answer before the client reads it.
            let mut sink = [0u8; 1024];
            while tcp.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
        PENDING.add_permits(1);
    });
}

/// The whole HTTP/1.1 answer to a connection beyond the cap.
fn rejection_bytes(cap: u32) -> Vec<u8> {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable_error",
        "too_many_connections",
        format!(
            "the gateway has {cap} open connections on this listener, its limit \
             (server.max_connections); retry later"
        ),
    )
    .body()
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_paths_are_the_prefix_and_nothing_else() {
        for p in [
            "/admin",
            "/admin/",
            "/admin/workers",
            "/admin/workers/a/pin",
        ] {
            assert!(is_admin_path(p), "{p}");
        }
        for p in [
            "/",
            "/administrator",
            "/v1/admin",
            "/metrics",
            "/adminx/workers",
        ] {
            assert!(!is_admin_path(p), "{p}");
        }
    }

    #[test]
    fn the_rejection_is_a_complete_http_answer() {
        let bytes = rejection_bytes(4);
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("connection: close"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
