//! A tiny fake OpenAI worker: streams N tokens at a configurable per-request speed, honours
//! max_tokens / min_tokens / ignore_eos / stream, reports usage, can fail (500, die
//! mid-stream, stall mid-body, unhealthy), can hold customer requests until released, and
//! counts requests.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub const MODE_OK: u32 = 0;
pub const MODE_500: u32 = 1;
pub const MODE_DIE: u32 = 2;
/// Send the headers and one body chunk (an SSE event, or the start of the JSON), then nothing
/// for [`STALL`]: a worker that went silent mid-response.
pub const MODE_STALL: u32 = 3;
pub const STALL: Duration = Duration::from_secs(40);
/// A prompt containing this makes every fake worker answer 500.
pub const POISON: &str = "poison-pill";

pub struct FakeState {
    /// Per-request tokens/s (f64 bits); 0 = as fast as possible.
    speed_bits: AtomicU64,
    /// Tokens generated when the request allows an early stop.
    pub natural_len: AtomicU32,
    pub mode: AtomicU32,
    /// MODE_DIE: data chunks sent before the connection is dropped.
    pub die_after: AtomicU32,
    pub healthy: AtomicBool,
    /// Customer requests wait here until released (probe requests never do).
    pub hold: AtomicBool,
    release: Notify,
    /// Customer requests received (probe requests excluded).
    pub requests: AtomicU64,
    /// Probe requests received (ignore_eos: true).
    pub probe_requests: AtomicU64,
    /// Responses fully sent.
    pub finished: AtomicU64,
    /// The API key every call must carry (`Authorization: Bearer <key>`), as an engine
    /// started with `--api-key` wants; without it or with another the answer is 401.
    pub api_key: std::sync::Mutex<Option<String>>,
    /// Calls answered 401.
    pub refused: AtomicU64,
    /// Whether `/metrics` answers (a vLLM-named page of zeros); off, it is a 404 as a fake
    /// with no engine metrics (what the admin page's tests expect: a poll still waiting).
    pub metrics: AtomicBool,
    /// The paths called with the right key.
    pub authorized: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl FakeState {
    fn speed(&self) -> f64 {
        f64::from_bits(self.speed_bits.load(SeqCst))
    }
    pub fn release(&self) {
        self.hold.store(false, SeqCst);
        self.release.notify_waiters();
    }
}

pub struct FakeWorker {
    pub url: String,
    pub state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.state.release();
        self.task.abort();
    }
}

impl FakeWorker {
    pub async fn start(tok_s: f64) -> FakeWorker {
        let state = Arc::new(FakeState {
            speed_bits: AtomicU64::new(tok_s.to_bits()),
            natural_len: AtomicU32::new(8),
            mode: AtomicU32::new(MODE_OK),
            die_after: AtomicU32::new(3),
            healthy: AtomicBool::new(true),
            hold: AtomicBool::new(false),
            release: Notify::new(),
            requests: AtomicU64::new(0),
            probe_requests: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            api_key: std::sync::Mutex::new(None),
            refused: AtomicU64::new(0),
            metrics: AtomicBool::new(false),
            authorized: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(generate))
            .route("/v1/completions", post(generate))
            .route("/health", get(health))
            .route(
                "/v1/models",
                get(|| async { axum::Json(json!({"object": "list", "data": []})) }),
            )
            .route(
                "/metrics",
                get(|State(st): State<Arc<FakeState>>| async move {
                    if st.metrics.load(SeqCst) {
                        Ok("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
                    } else {
                        Err(StatusCode::NOT_FOUND)
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(state.clone(), api_key))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        // Each token leaves at once, as an engine's server sends it: without TCP_NODELAY,
        // Nagle's algorithm held a token until the previous one was acknowledged, and on a
        // kept-alive connection (delayed ACKs) a 1,000 tok/s stream came out at ~500 tok/s,
        // so a streamed probe burst measured the fast worker at half its speed.
        let listener = axum::serve::ListenerExt::tap_io(listener, |t| {
            let _ = t.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeWorker { url, state, task }
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(SeqCst)
    }
    pub fn probe_requests(&self) -> u64 {
        self.state.probe_requests.load(SeqCst)
    }
}

/// An engine's `--api-key` check: 401 unless the call carries the key (when one is set).
async fn api_key(
    State(st): State<Arc<FakeState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let want = st.api_key.lock().unwrap().clone();
    if let Some(key) = want {
        let given = req.headers().get(header::AUTHORIZATION);
        if given.is_none_or(|v| v.as_bytes() != format!("Bearer {key}").as_bytes()) {
            st.refused.fetch_add(1, SeqCst);
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": "Unauthorized"})),
            )
                .into_response();
        }
        st.authorized
            .lock()
            .unwrap()
            .insert(req.uri().path().to_string());
    }
    next.run(req).await
}

async fn health(State(st): State<Arc<FakeState>>) -> StatusCode {
    if st.healthy.load(SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn chunk(i: u32) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
    ))
}

async fn generate(State(st): State<Arc<FakeState>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let ignore_eos = v["ignore_eos"].as_bool().unwrap_or(false);
    let max_tokens = v["max_tokens"].as_u64().unwrap_or(16) as u32;
    let min_tokens = (v["min_tokens"].as_u64().unwrap_or(0) as u32).min(max_tokens);
    let stream = v["stream"].as_bool().unwrap_or(false);
    let n = if ignore_eos {
        max_tokens
    } else {
        max_tokens.min(st.natural_len.load(SeqCst)).max(min_tokens)
    };
    if ignore_eos {
        st.probe_requests.fetch_add(1, SeqCst);
    } else {
        st.requests.fetch_add(1, SeqCst);
    }
    let mode = st.mode.load(SeqCst);
    // A request that breaks every engine (a "poison" request): 500 whatever the mode.
    if mode == MODE_500 || body.windows(POISON.len()).any(|w| w == POISON.as_bytes()) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "engine exploded").into_response();
    }
    if !ignore_eos && st.hold.load(SeqCst) {
        let released = st.release.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if st.hold.load(SeqCst) {
            let _ = tokio::time::timeout(Duration::from_secs(20), released).await;
        }
    }
    if mode == MODE_STALL {
        let (content_type, first) = if stream {
            ("text/event-stream", chunk(0))
        } else {
            ("application/json", Bytes::from_static(b"{\"id\":\"c\","))
        };
        let body = futures_util::stream::unfold(0u32, move |i| {
            let first = first.clone();
            async move {
                match i {
                    0 => Some((Ok::<_, std::io::Error>(first), 1)),
                    1 => {
                        tokio::time::sleep(STALL).await;
                        None
                    }
                    _ => None,
                }
            }
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from_stream(body))
            .unwrap();
    }
    let speed = st.speed();
    let start = Instant::now();
    let at = move |i: u32| {
        if speed > 0.0 {
            start + Duration::from_secs_f64(f64::from(i) / speed)
        } else {
            start
        }
    };
    let prompt_tokens = (body.len() / 4) as u32;
    if !stream {
        tokio::time::sleep_until(at(n)).await;
        st.finished.fetch_add(1, SeqCst);
        let text: String = (0..n).map(|i| format!("t{i} ")).collect();
        return axum::Json(json!({
            "id": "c", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        }))
        .into_response();
    }
    let die_after = (mode == MODE_DIE).then(|| st.die_after.load(SeqCst));
    let st2 = st.clone();
    let events = futures_util::stream::unfold(0u32, move |i| {
        let st = st2.clone();
        async move {
            if die_after == Some(i) {
                // Give the previous chunks time to leave, then die.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Some((Err(std::io::Error::other("worker died")), u32::MAX));
            }
            if i == u32::MAX || i > n + 1 {
                return None;
            }
            if i < n {
                tokio::time::sleep_until(at(i + 1)).await;
                Some((Ok(chunk(i)), i + 1))
            } else if i == n {
                let usage = format!(
                    "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\n",
                    prompt_tokens + n
                );
                Some((Ok(Bytes::from(usage)), i + 1))
            } else {
                st.finished.fetch_add(1, SeqCst);
                Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), i + 1))
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap()
}

/// A worker speaking raw HTTP/1.1: it answers every request with `response` (bytes as given,
/// so a test controls every header) and closes the connection. Counts requests.
pub struct RawWorker {
    pub url: String,
    pub requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawWorker {
    pub async fn start(response: String) -> RawWorker {
        use tokio::io::AsyncWriteExt;
        // Shared, not copied per connection: a test may answer tens of megabytes.
        let response = Arc::new(response);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let response = response.clone();
                let count = count.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    if !read_request(&mut tcp, &mut got).await {
                        return;
                    }
                    count.fetch_add(1, SeqCst);
                    let _ = tcp.write_all(response.as_bytes()).await;
                    let _ = tcp.shutdown().await;
                });
            }
        });
        RawWorker {
            url,
            requests,
            task,
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(SeqCst)
    }

    /// A worker that keeps each connection alive after its first answer (`response` must not
    /// say `connection: close`) and closes it, unanswered, once the second request on it has
    /// arrived whole: a kept-alive connection lost just as a request was written on it.
    /// `requests` counts the answered ones; `dropped` the ones closed on.
    pub async fn closing_reused(response: String) -> (RawWorker, Arc<AtomicU64>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (requests, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (count, lost) = (requests.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let (response, count, lost) = (response.clone(), count.clone(), lost.clone());
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    if !read_request(&mut tcp, &mut got).await {
                        return;
                    }
                    count.fetch_add(1, SeqCst);
                    if tcp.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                    if read_request(&mut tcp, &mut got).await {
                        lost.fetch_add(1, SeqCst);
                    }
                    // Dropped: closed with the second request unanswered.
                });
            }
        });
        (
            RawWorker {
                url,
                requests,
                task,
            },
            dropped,
        )
    }
}

/// Read one whole request (its head, then the body its Content-Length announces) from `tcp`,
/// taking it off the front of `got` (bytes read past it stay); false when the peer closed.
async fn read_request(tcp: &mut tokio::net::TcpStream, got: &mut Vec<u8>) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                got.drain(..end + 4 + len);
                return true;
            }
        }
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A whole HTTP/1.1 response with `status` (e.g. `503 Service Unavailable`), extra header
/// lines (each ending in `\r\n`; one of them should be `connection: close`, since the worker
/// closes) and a JSON body.
pub fn raw_response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
}
