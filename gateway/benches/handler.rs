//! One request through the gateway's handler ([`routelab_gateway::Handler`]: every per-request
//! layer the listener applies, the body, the parse, the prompt count, the routing decision, the
//! forward to a worker and the answer), against the same request sent straight to the worker
//! with the gateway's kind of client. The difference is what the gateway adds; the client-side
//! socket of the listener is not in it (the request body is in memory).
//!
//! - `one request/*`: direct and through the handler, buffered and streamed, with the prompt
//!   counted by the estimate (bytes / 4); and through the handler with `exact` tokens (the
//!   vendored SmolLM2 tokenizer and chat template, counted on the blocking pool).
//! - `count/*`: the prompt count alone (`Tokenizers::count`) for the same body: what exact tokens
//!   add to a request.
//!
//! The worker is a tiny in-process axum server on loopback (a fixed completion, no delay), so
//! every `one request` figure carries one loopback round trip, on one thread; four workers,
//! `seed-v3` (prefix affinity, p2c, cap), health checks and probes off.
//!
//! ```text
//! cargo bench -p routelab-gateway --bench handler -- --warm-up-time 2 --measurement-time 10
//! ```
//!
//! On a noisy machine count instructions instead: with `ROUTELAB_BENCH_REQUESTS=N` (and
//! `ROUTELAB_BENCH_MODE=direct|handler|exact`, `ROUTELAB_BENCH_STREAM=1` for the streamed kind)
//! the binary sends N requests of one kind and exits, to run under `valgrind --tool=cachegrind`;
//! two counts (N and 2N) difference out the set-up:
//!
//! ```text
//! ROUTELAB_BENCH_REQUESTS=2000 ROUTELAB_BENCH_MODE=handler valgrind --tool=cachegrind \
//!     --cache-sim=no target/release/deps/handler-<hash>
//! ```

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_gateway::prompt::{self, Endpoint};
use routelab_gateway::tokens::{ModelConfig, Tokenizers};
use std::path::PathBuf;
use std::time::Duration;

const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;

/// The vendored SmolLM2 tokenizer and chat template.
fn smollm2() -> (PathBuf, PathBuf) {
    let d =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/smollm2-135m-instruct");
    (d.join("tokenizer.json"), d.join("chat_template.jinja"))
}

/// Eight content events, a usage event and `[DONE]`, as one chunk.
fn stream_answer() -> String {
    let mut s = String::new();
    for i in 0..8 {
        s.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
        ));
    }
    s.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":8}}\n\ndata: [DONE]\n\n");
    s
}

async fn fake_worker() -> String {
    let stream = stream_answer();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |body: Bytes| {
                let stream = stream.clone();
                async move {
                    if body.windows(13).any(|w| w == b"\"stream\":true") {
                        ([("content-type", "text/event-stream")], stream)
                    } else {
                        ([("content-type", "application/json")], ANSWER.to_string())
                    }
                }
            }),
        )
        .route("/health", axum::routing::get(|| async { "ok" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let l = axum::serve::ListenerExt::tap_io(l, |t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    url
}

/// A short two-message chat.
fn body(stream: bool) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"You are brief and precise; answer in one sentence."}},{{"role":"user","content":"What is the capital of France, and how many people live there?"}}],"max_tokens":16,"stream":{stream}}}"#
    ))
}

fn request(uri: &str, body: Bytes) -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(uri)
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap()
}

/// The runtime, the fake workers, the handlers (prompts estimated; counted exactly) and a
/// client sending straight to one worker.
struct Setup {
    rt: tokio::runtime::Runtime,
    estimate: routelab_gateway::Handler,
    exact: routelab_gateway::Handler,
    client: Client<HttpConnector, Full<Bytes>>,
    direct: String,
}

impl Setup {
    fn new() -> Setup {
        // One thread runs the worker, the client and the handler: no cross-thread wake-ups, so
        // the spread is the code's, not the scheduler's (a multi-threaded runtime gave ±25 %).
        // Exact counts still run on the blocking pool, as in the gateway.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let workers: Vec<String> = rt.block_on(async {
            let mut w = Vec::new();
            for _ in 0..4 {
                w.push(fake_worker().await);
            }
            w
        });
        let (tokenizer, template) = smollm2();
        let handler = |exact: bool| {
            let mut yaml =
                String::from("listen: 127.0.0.1:0\npolicy: seed-v3\nhealth: {interval_s: 0}\n");
            if exact {
                yaml += &format!(
                    "models:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}\n",
                    tokenizer.display(),
                    template.display()
                );
            }
            yaml += "workers:\n";
            for (i, w) in workers.iter().enumerate() {
                yaml += &format!(
                    "  - {{name: w{i}, base_url: \"{w}\", model: m, context_window: 32768}}\n"
                );
            }
            let config = routelab_gateway::GatewayConfig::from_yaml(&yaml, "bench.yaml").unwrap();
            let _entered = rt.enter();
            routelab_gateway::Handler::new(config).unwrap()
        };
        let (estimate, exact) = (handler(false), handler(true));
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let direct = format!("{}/v1/chat/completions", workers[0]);
        Setup {
            rt,
            estimate,
            exact,
            client,
            direct,
        }
    }

    /// One request straight to the worker.
    fn direct(&self, payload: &Bytes) -> Bytes {
        self.rt.block_on(async {
            let r = self
                .client
                .request(request(&self.direct, payload.clone()))
                .await
                .unwrap();
            assert!(r.status().is_success());
            r.into_body().collect().await.unwrap().to_bytes()
        })
    }

    /// One request through a handler.
    fn through(&self, handler: &routelab_gateway::Handler, payload: &Bytes) -> Bytes {
        self.rt.block_on(async {
            let r = handler
                .call(request("/v1/chat/completions", payload.clone()))
                .await;
            assert!(r.status().is_success(), "{}", r.status());
            r.into_body().collect().await.unwrap().to_bytes()
        })
    }
}

fn bench(c: &mut Criterion) {
    let setup = Setup::new();
    let mut group = c.benchmark_group("one request");
    for stream in [false, true] {
        let kind = if stream { "streamed" } else { "buffered" };
        let payload = body(stream);
        group.bench_function(format!("direct to the worker, {kind}"), |b| {
            b.iter(|| setup.direct(&payload))
        });
        group.bench_function(format!("through the handler, {kind}"), |b| {
            b.iter(|| setup.through(&setup.estimate, &payload))
        });
    }
    let payload = body(false);
    group.bench_function("through the handler, buffered, exact tokens", |b| {
        b.iter(|| setup.through(&setup.exact, &payload))
    });
    group.finish();

    let (tokenizer, template) = smollm2();
    let exact = Tokenizers::load(
        &[ModelConfig {
            name: "m".into(),
            tokenizer,
            chat_template: Some(template),
        }],
        std::path::Path::new("."),
        "bench",
    )
    .unwrap();
    let estimate = Tokenizers::default();
    let payload = body(false);
    let parsed = prompt::parse(&payload, Endpoint::Chat).unwrap();
    let mut group = c.benchmark_group("count");
    group.bench_function("estimate", |b| {
        b.iter(|| estimate.count(&payload, Endpoint::Chat, &parsed).unwrap())
    });
    group.bench_function("exact", |b| {
        b.iter(|| exact.count(&payload, Endpoint::Chat, &parsed).unwrap())
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(10));
    targets = bench
}

fn main() {
    let Some(n) = std::env::var("ROUTELAB_BENCH_REQUESTS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    else {
        benches();
        Criterion::default().configure_from_args().final_summary();
        return;
    };
    // The instruction-count mode: N requests of one kind, nothing printed.
    let setup = Setup::new();
    let payload = body(std::env::var("ROUTELAB_BENCH_STREAM").is_ok_and(|v| v == "1"));
    let mode = std::env::var("ROUTELAB_BENCH_MODE").unwrap_or_default();
    for _ in 0..n {
        match mode.as_str() {
            "handler" => setup.through(&setup.estimate, &payload),
            "exact" => setup.through(&setup.exact, &payload),
            _ => setup.direct(&payload),
        };
    }
}
