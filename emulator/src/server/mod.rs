//! The emulator's HTTP server: an OpenAI-compatible engine whose timing is the simulator's.

use crate::driver::{Driver, EngineSnapshot, ModelClock, Progress};
use crate::openai::{self, Renderer, Usage};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use routelab_gateway::prompt::Endpoint;
use routelab_gateway::proxy::WORKER_HEADER;
use routelab_sim::hardware::HardwareError;
use routelab_sim::{EngineOverrides, FluidEngine, HardwareProfile};
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

mod field;

/// Errors of the emulator and the player.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmulatorError {
    /// The hardware profile could not be loaded.
    #[error(transparent)]
    Profile(#[from] HardwareError),
    /// An option is out of range.
    #[error("invalid emulator option: {0}")]
    Invalid(String),
    /// A socket or thread could not be set up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The model's tokenizer (or chat template) could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] routelab_gateway::tokens::TokenizerError),
}

/// How one emulated engine behaves. Command-line flags map onto it as `--model NAME` →
/// [`model`](Self::model), `--rtt-ms MS` → [`rtt_ms`](Self::rtt_ms), `--speedup K` →
/// [`speedup`](Self::speedup), `--cold` → `overrides.start_cold`, `--speed-factor F` →
/// `overrides.speed_factor`.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// The hardware model.
    pub profile: Arc<HardwareProfile>,
    /// Per-worker changes (speed factor, `start_cold`, noise — cv 0 by default, limits).
    pub overrides: EngineOverrides,
    /// The one model name it serves (`--model`); other names get 404 `model_not_found`.
    pub model: String,
    /// Round trip between the gateway and this worker, in **model** milliseconds (`--rtt-ms`):
    /// half is added before admission, half on the way back (to the first token, every token
    /// and the completion).
    pub rtt_ms: f64,
    /// The model runs this many times faster than wall time (`--speedup`): model ns = wall ns
    /// × speedup since the server started.
    pub speedup: f64,
    /// Seed of the engine's noise streams (irrelevant with the default cv 0).
    pub seed: u64,
    /// Wall time between two token-pacing updates while anything decodes. First tokens and
    /// completions are not paced: they are sent at the model's event times.
    pub tick: Duration,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: u32,
    /// Largest prompt + `max_tokens` accepted (400 `context_length_exceeded` above); `None`:
    /// the profile's context window.
    pub context_window: Option<u32>,
    /// The model's tokenizer (and chat template): prompts are counted and keyed by its token
    /// ids, as the gateway does with the same files; `None`: the bytes / 4 estimate.
    pub tokenizer: Option<Arc<routelab_gateway::tokens::ModelTokenizer>>,
    /// Publish the simulated cache's KV events in vLLM's wire format
    /// ([`Emulator::kv_endpoints`]).
    pub kv_events: bool,
    /// Whose names `GET /metrics` uses.
    pub metrics: MetricsNames,
    /// The name every answer carries in its `x-routelab-worker` header (`--name`), so the
    /// worker that served a request is visible through any router in front; `None`: the
    /// profile's name.
    pub worker_name: Option<String>,
}

/// Whose metric names the emulator's `/metrics` serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetricsNames {
    /// vLLM's (V1 engine): requests running and waiting, KV use, token counters, per-request
    /// histograms.
    #[default]
    Vllm,
    /// SGLang's: requests running and queued, token usage, tokens in the KV cache and
    /// `sglang:gen_throughput` — here the engine model's generation rate at the moment of the
    /// scrape, the very figure the simulator's engine poll hands `least-load`.
    Sglang,
}

impl EmulatorOptions {
    /// Defaults: warm engine, no noise, model `gemma-27b`, no round trip, speed-up 1, 10 ms tick,
    /// 256 tokens when `max_tokens` is absent.
    pub fn new(profile: impl Into<Arc<HardwareProfile>>) -> EmulatorOptions {
        EmulatorOptions {
            profile: profile.into(),
            overrides: EngineOverrides::default(),
            model: "gemma-27b".into(),
            rtt_ms: 0.0,
            speedup: 1.0,
            seed: 1,
            tick: Duration::from_millis(10),
            default_max_tokens: 256,
            context_window: None,
            tokenizer: None,
            kv_events: false,
            metrics: MetricsNames::Vllm,
            worker_name: None,
        }
    }

    /// Defaults with the hardware profile read from a YAML file (`scenarios/hardware/*.yaml`).
    pub fn load(profile_yaml: impl AsRef<Path>) -> Result<EmulatorOptions, EmulatorError> {
        Ok(EmulatorOptions::new(HardwareProfile::load(profile_yaml)?))
    }

    /// Check the values.
    pub fn validate(&self) -> Result<(), EmulatorError> {
        self.overrides
            .validate()
            .map_err(|e| EmulatorError::Invalid(format!("overrides: {e}")))?;
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return Err(EmulatorError::Invalid(format!(
                "speedup = {}: must be a finite number > 0",
                self.speedup
            )));
        }
        if !(self.rtt_ms.is_finite() && self.rtt_ms >= 0.0) {
            return Err(EmulatorError::Invalid(format!(
                "rtt_ms = {}: must be a finite number >= 0",
                self.rtt_ms
            )));
        }
        if self.model.trim().is_empty() {
            return Err(EmulatorError::Invalid("model must not be empty".into()));
        }
        if self.tick.is_zero() {
            return Err(EmulatorError::Invalid("tick must be > 0".into()));
        }
        if let Some(name) = &self.worker_name
            && (name.trim().is_empty() || HeaderValue::from_str(name).is_err())
        {
            return Err(EmulatorError::Invalid(format!(
                "worker name {name:?}: must be non-empty visible ASCII (it is sent as the `{WORKER_HEADER}` header)"
            )));
        }
        if self.default_max_tokens == 0 {
            return Err(EmulatorError::Invalid(
                "default_max_tokens must be > 0".into(),
            ));
        }
        Ok(())
    }
}

struct App {
    driver: Arc<Driver>,
    model: String,
    model_json: String,
    context_window: u32,
    default_max_tokens: u32,
    profile: String,
    speedup: f64,
    ids: AtomicU64,
    tokenizer: Option<Arc<routelab_gateway::tokens::ModelTokenizer>>,
    kv: Option<crate::kv::KvStream>,
    metrics_names: MetricsNames,
}

/// A running emulator. Dropping it is [`Emulator::kill`].
pub struct Emulator {
    addr: SocketAddr,
    driver: Arc<Driver>,
    thread: Option<std::thread::JoinHandle<()>>,
    server: Option<JoinHandle<()>>,
    stop_accepting: Option<oneshot::Sender<()>>,
    kv_endpoints: Option<(String, String)>,
}

/// Start an emulator on an already bound listener (bind `127.0.0.1:0` in tests). The model's
/// clock starts now. Returns at once; the server runs on the current tokio runtime, the engine on
/// its own thread.
pub async fn serve(
    listener: TcpListener,
    opts: EmulatorOptions,
) -> Result<Emulator, EmulatorError> {
    opts.validate()?;
    let addr = listener.local_addr()?;
    let engine = FluidEngine::new(opts.profile.clone(), opts.overrides.clone(), opts.seed);
    let clock = ModelClock::new(opts.speedup);
    let half_rtt_ns = (opts.rtt_ms * 1e6 / 2.0).round() as u64;
    let driver = Arc::new(Driver::new(engine, clock, half_rtt_ns, opts.tick));
    let kv = if opts.kv_events {
        let (stream, tx) = crate::kv::KvStream::start(opts.seed ^ 0x6b76_5f65_7665_6e74)
            .await
            .map_err(|e| EmulatorError::Io(std::io::Error::other(e.to_string())))?;
        driver.publish_kv(tx);
        Some(stream)
    } else {
        None
    };
    let kv_endpoints = kv.as_ref().map(crate::kv::KvStream::endpoints);
    let worker = HeaderValue::from_str(
        opts.worker_name
            .as_deref()
            .unwrap_or_else(|| opts.profile.name()),
    )
    .map_err(|_| {
        EmulatorError::Invalid(format!(
            "profile name {:?} cannot be sent as the `{WORKER_HEADER}` header; give a worker name",
            opts.profile.name()
        ))
    })?;
    let thread = driver.spawn(opts.profile.name())?;
    let app = Arc::new(App {
        driver: driver.clone(),
        model_json: serde_json::Value::String(opts.model.clone()).to_string(),
        model: opts.model.clone(),
        context_window: opts
            .context_window
            .unwrap_or_else(|| opts.profile.context_window()),
        default_max_tokens: opts.default_max_tokens,
        profile: opts.profile.name().to_string(),
        speedup: opts.speedup,
        ids: AtomicU64::new(1),
        tokenizer: opts.tokenizer.clone(),
        kv,
        metrics_names: opts.metrics,
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "" }))
        .route("/emulator/stats", get(stats))
        .route("/metrics", get(field::metrics))
        .route("/get_load", get(field::get_load))
        .route("/tokenize", post(field::tokenize))
        .route("/v1/chat/completions/render", post(field::render_chat))
        .route("/v1/completions/render", post(field::render_completion))
        .with_state(app)
        // Every answer, errors and streams included, names the worker that gave it.
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let worker = worker.clone();
            async move {
                r.headers_mut().insert(WORKER_HEADER, worker);
                r
            }
        }));
    let (tx, mut rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        // Connections live in this set: aborting the server task aborts every connection
        // (a crash), dropping the listener refuses new ones.
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((tcp, _)) = accepted else {
                        // out of file descriptors and the like: do not spin
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let svc = TowerToHyperService::new(router.clone());
                    conns.spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), svc)
                            .await;
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = &mut rx => break,
            }
        }
        drop(listener);
        // Graceful: let open connections finish (the handle bounds the wait).
        while conns.join_next().await.is_some() {}
    });
    Ok(Emulator {
        addr,
        driver,
        thread: Some(thread),
        server: Some(server),
        stop_accepting: Some(tx),
        kv_endpoints,
    })
}

impl Emulator {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for a gateway's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where its KV events are published (`tcp://` PUB endpoint, replay endpoint), when
    /// [`EmulatorOptions::kv_events`] is on.
    pub fn kv_endpoints(&self) -> Option<(String, String)> {
        self.kv_endpoints.clone()
    }

    /// The engine right now.
    pub fn snapshot(&self) -> EngineSnapshot {
        self.driver.snapshot()
    }

    /// Crash: the port closes, every open connection is cut (streams break mid-way, requests
    /// not yet answered get no response), the engine stops.
    pub fn kill(mut self) {
        self.stop_now();
    }

    /// Stop accepting, wait up to `grace` for the requests in flight to finish, then stop.
    pub async fn shutdown(mut self, grace: Duration) {
        if let Some(tx) = self.stop_accepting.take() {
            let _ = tx.send(());
        }
        let deadline = Instant::now() + grace;
        while self.driver.snapshot().streams > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(server) = self.server.as_mut() {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(left, server).await;
        }
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.stop_accepting.take();
        self.driver.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop_now();
    }
}

// ----- handlers -------------------------------------------------------------------------------

fn error(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> Response {
    (
        status,
        axum::Json(
            json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
        ),
    )
        .into_response()
}

async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let arrived = app.driver.clock.now_ns();
    generate(app, arrived, body, Endpoint::Chat).await
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let arrived = app.driver.clock.now_ns();
    generate(app, arrived, body, Endpoint::Completions).await
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [{
        "id": app.model, "object": "model", "created": 0, "owned_by": "routelab-emulator",
        "root": app.model, "max_model_len": app.context_window,
    }]}))
    .into_response()
}

async fn stats(State(app): State<Arc<App>>) -> Response {
    let s = app.driver.snapshot();
    axum::Json(json!({
        "profile": app.profile,
        "model": app.model,
        "speedup": app.speedup,
        "model_time_s": s.model_time_s,
        "in_flight": s.in_flight,
        "running": s.running,
        "decoding": s.decoding,
        "waiting": s.waiting,
        "streams": s.streams,
        "warm": s.warm,
        "admitted": s.counters.admitted,
        "completed": s.counters.completed,
        "aborted": s.counters.aborted,
    }))
    .into_response()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn engine_gone() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "engine_stopped",
        "the engine has stopped",
        None,
    )
}

/// Serve one generation request received at model time `arrived` (the request's time inside
/// the engine model starts there: parsing it costs no model time, as in the simulator).
async fn generate(app: Arc<App>, arrived: u64, body: Bytes, endpoint: Endpoint) -> Response {
    let req = match openai::parse(
        &body,
        endpoint,
        app.default_max_tokens,
        app.tokenizer.as_deref(),
        app.kv.is_some(),
    ) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
                &e.message,
                e.param,
            );
        }
    };
    if req.model != app.model {
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            &format!("The model `{}` does not exist.", req.model),
            Some("model"),
        );
    }
    let context = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
    if context > u64::from(app.context_window) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "context_length_exceeded",
            &format!(
                "This model's maximum context length is {} tokens. However, you requested {context} tokens ({} in the messages, {} in the completion).",
                app.context_window, req.prompt_tokens, req.output_tokens
            ),
            Some("max_tokens"),
        );
    }
    if let (Some(kv), Some(ids)) = (&app.kv, &req.ids) {
        kv.remember(&req.blocks, ids);
    }
    let Some((seq, mut rx)) = app.driver.submit(
        arrived,
        req.prompt_tokens,
        req.output_tokens,
        req.blocks.clone(),
    ) else {
        return engine_gone();
    };
    // From here on, this future (and then the response body) owns the request: when the client
    // goes away, hyper drops them and the guard takes the request out of the engine.
    let mut guard = AbortOnDrop {
        driver: app.driver.clone(),
        seq,
        armed: true,
    };
    let n = app.ids.fetch_add(1, Relaxed);
    let renderer = Renderer {
        endpoint,
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-emu{n}"),
            Endpoint::Completions => format!("cmpl-emu{n}"),
        },
        model_json: app.model_json.clone(),
        created: unix_now(),
    };
    let usage_of = |p: &Progress| Usage {
        prompt_tokens: req.prompt_tokens,
        completion_tokens: req.output_tokens,
        cached_tokens: p.cached_tokens,
    };
    if !req.stream {
        let done = rx.wait_for(|p| p.done || p.failed).await.map(|p| *p);
        guard.armed = false;
        return match done {
            Ok(p) if p.done => (
                [(header::CONTENT_TYPE, "application/json")],
                renderer.full(&usage_of(&p)),
            )
                .into_response(),
            _ => engine_gone(),
        };
    }
    // Headers go out with the first token (as an engine answers once its first output is
    // ready): a request cut before it gets no response at all and can be retried elsewhere.
    let first = rx
        .wait_for(|p| p.tokens > 0 || p.done || p.failed)
        .await
        .map(|p| *p);
    let first = match first {
        Ok(p) if !p.failed => p,
        _ => return engine_gone(),
    };
    let state = StreamState {
        guard,
        rx,
        renderer,
        sent: 0,
        started: false,
        finished: false,
        include_usage: req.include_usage,
        prompt_tokens: req.prompt_tokens,
        output_tokens: req.output_tokens,
        latest: first,
    };
    let stream = futures_util::stream::unfold(state, next_frame);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("valid response")
}

/// Aborts the request in the engine when dropped while armed: the client went away before the
/// end (hyper drops the handler's future, or the response body, when the connection closes).
struct AbortOnDrop {
    driver: Arc<Driver>,
    seq: u64,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.driver.abort(self.seq);
        }
    }
}

struct StreamState {
    guard: AbortOnDrop,
    rx: watch::Receiver<Progress>,
    renderer: Renderer,
    sent: u32,
    started: bool,
    finished: bool,
    include_usage: bool,
    prompt_tokens: u32,
    output_tokens: u32,
    /// Progress not yet rendered.
    latest: Progress,
}

/// The next SSE frame: every event that became due since the last one, in one frame.
async fn next_frame(mut s: StreamState) -> Option<(Result<Bytes, std::io::Error>, StreamState)> {
    if s.finished {
        return None;
    }
    loop {
        let p = s.latest;
        if p.failed {
            s.finished = true;
            s.guard.armed = false;
            return Some((Err(std::io::Error::other("engine stopped")), s));
        }
        let target = if p.done { s.output_tokens } else { p.tokens };
        if !s.started || target > s.sent || p.done {
            let mut out = String::new();
            if !s.started {
                s.renderer.push_role(&mut out);
                s.started = true;
            }
            while s.sent < target {
                s.renderer.push_token(&mut out, s.sent);
                s.sent += 1;
            }
            if p.done {
                let usage = Usage {
                    prompt_tokens: s.prompt_tokens,
                    completion_tokens: s.output_tokens,
                    cached_tokens: p.cached_tokens,
                };
                s.renderer
                    .push_end(&mut out, s.include_usage.then_some(&usage));
                s.finished = true;
                s.guard.armed = false;
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), s));
            }
        }
        if s.rx.changed().await.is_err() {
            // the driver dropped the stream without finishing it: the engine stopped
            s.latest.failed = true;
            continue;
        }
        s.latest = *s.rx.borrow_and_update();
    }
}
