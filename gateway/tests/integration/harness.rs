//! Gateway start-up, an HTTP client and small helpers; every wait is bounded.

use crate::fake::FakeWorker;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_gateway::{GatewayConfig, RunningGateway};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub const TOKEN: &str = "secret-token";

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn start(yaml: &str) -> RunningGateway {
    let cfg = GatewayConfig::from_yaml(yaml, "test.yaml").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    routelab_gateway::start_on(cfg, listener).await.unwrap()
}

/// A worker entry for the YAML config.
pub fn worker(name: &str, url: &str, model: &str, gpus: &[&str], ctx: u32) -> String {
    format!(
        "  - name: {name}\n    base_url: {url}\n    model: {model}\n    gpu_names: [{}]\n    context_window: {ctx}\n    launch_args: \"--x\"\n",
        gpus.iter()
            .map(|g| format!("\"{g}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A YAML config: top-level `extra` lines, then the workers.
pub fn config(policy: &str, extra: &str, workers: &[String]) -> String {
    format!(
        "listen: 127.0.0.1:0\npolicy: {policy}\nseed: 7\nadmin_token: {TOKEN}\n{extra}\nworkers:\n{}",
        workers.concat()
    )
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn send(
    c: &HttpClient,
    method: Method,
    url: &str,
    token: Option<&str>,
    body: impl Into<Bytes>,
) -> Answer {
    let r = raw(c, method, url, token, body).await;
    let (parts, body) = r.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("body within 20 s")
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn raw(
    c: &HttpClient,
    method: Method,
    url: &str,
    token: Option<&str>,
    body: impl Into<Bytes>,
) -> Response<Incoming> {
    let mut b = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = b.body(Full::new(body.into())).unwrap();
    tokio::time::timeout(Duration::from_secs(20), c.request(req))
        .await
        .expect("response within 20 s")
        .expect("request sent")
}

pub fn chat_body(model: &str, content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// Poll `cond` every 10 ms for at most `limit`; panic with `what` if it never holds.
pub async fn wait_for(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The admin view of one worker.
pub async fn admin_worker(c: &HttpClient, base: &str, name: &str) -> Value {
    let a = send(
        c,
        Method::GET,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    a.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no worker {name}"))
}

/// Check OpenAI's error shape and return the error object.
pub fn assert_openai_error(a: &Answer, status: u16) -> Value {
    assert_eq!(a.status.as_u16(), status, "body: {}", a.text());
    let v = a.json();
    let e = v
        .get("error")
        .unwrap_or_else(|| panic!("no `error`: {v}"))
        .clone();
    assert!(e["message"].is_string(), "{e}");
    assert!(e["type"].is_string(), "{e}");
    assert!(e.get("param").is_some(), "{e}");
    assert!(e.get("code").is_some(), "{e}");
    e
}

/// A fresh temporary directory (removed by the caller).
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("routelab-gw-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A URL whose port refuses connections.
pub async fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

/// A started gateway with the URLs and the client most tests need. The gateway stops when
/// `gw` is dropped, so a test that takes only the other fields out keeps the `Gateway` bound
/// (`let gateway = serve(..).await; let Gateway { base, c, .. } = gateway;`).
pub struct Gateway {
    pub gw: RunningGateway,
    pub base: String,
    pub chat: String,
    pub c: HttpClient,
}

impl Gateway {
    pub async fn start(yaml: &str) -> Gateway {
        let gw = start(yaml).await;
        let base = format!("http://{}", gw.local_addr());
        let chat = format!("{base}/v1/chat/completions");
        Gateway {
            gw,
            base,
            chat,
            c: client(),
        }
    }
}

/// A gateway on `config(policy, extra, workers)`.
pub async fn serve(policy: &str, extra: &str, workers: &[String]) -> Gateway {
    Gateway::start(&config(policy, extra, workers)).await
}

/// `N` fake workers, each at `tok_s` tokens/s.
pub async fn fakes<const N: usize>(tok_s: f64) -> [FakeWorker; N] {
    let mut workers = Vec::with_capacity(N);
    for _ in 0..N {
        workers.push(FakeWorker::start(tok_s).await);
    }
    workers
        .try_into()
        .unwrap_or_else(|_| unreachable!("started exactly N workers"))
}

/// Two workers of model `m`: `first` on two RTX 4090s has the higher table weight, so that
/// idle ties go to it; `second` names no GPU. Each is a name and a base URL.
pub fn favoured_pair(first: (&str, &str), second: (&str, &str)) -> [String; 2] {
    [
        worker(first.0, first.1, "m", &["RTX 4090", "RTX 4090"], 8192),
        worker(second.0, second.1, "m", &[], 8192),
    ]
}

/// A non-streaming chat request for 4 tokens of `m`, on a client and in a task of its own, so
/// that the test can go on while it waits.
pub fn spawn_chat(chat: &str, content: &str) -> tokio::task::JoinHandle<Answer> {
    let chat = chat.to_string();
    let body = chat_body("m", content, 4, false);
    tokio::spawn(async move { send(&client(), Method::POST, &chat, None, body).await })
}

/// A chat request to model `m`, without a token.
pub async fn post_chat(
    c: &HttpClient,
    chat: &str,
    content: &str,
    max_tokens: u32,
    stream: bool,
) -> Answer {
    send(
        c,
        Method::POST,
        chat,
        None,
        chat_body("m", content, max_tokens, stream),
    )
    .await
}

/// Run the gateway binary with `--check` on `yaml`: exit code, stdout, stderr.
pub fn check_config(yaml: &str) -> (Option<i32>, String, String) {
    let dir = temp_dir("check");
    let file = dir.join("g.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_routelab-gateway"))
        .arg("--config")
        .arg(&file)
        .arg("--check")
        .output()
        .expect("the binary runs");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
