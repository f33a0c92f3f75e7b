//! One request through the gateway: `cargo bench -p routelab-gateway --bench handler`.
//!
//! - `request/*`: a non-streaming chat completion sent to a running gateway on loopback (kept-
//!   alive connection) and answered at once by an in-process fake worker, end to end: the
//!   gateway's whole per-request path (accept, body, parse, count, route, forward, answer,
//!   release) plus two loopback hops. `estimate` counts bytes / 4; `exact` counts with the
//!   vendored SmolLM2 tokenizer and chat template.
//! - `count/*`: the prompt count alone (`Tokenizers::count`) for the same body: what exact tokens
//!   add to a request.
//!
//! Criterion's intervals on an idle machine resolve a change of a few microseconds in
//! `request/*` (the last load note asked for a bench that sees 20 µs).

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_gateway::prompt::{self, Endpoint};
use routelab_gateway::tokens::{ModelConfig, Tokenizers};
use std::path::PathBuf;

const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;
const BODY: &str = r#"{"model":"m","messages":[{"role":"system","content":"You are brief and precise; answer in one sentence."},{"role":"user","content":"What is the capital of France, and how many people live there?"}],"max_tokens":16}"#;

fn smollm2() -> (PathBuf, PathBuf) {
    let d =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/smollm2-135m-instruct");
    (d.join("tokenizer.json"), d.join("chat_template.jinja"))
}

async fn fake_worker() -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async { ([("content-type", "application/json")], ANSWER) }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    url
}

async fn gateway(worker: &str, exact: bool) -> routelab_gateway::RunningGateway {
    let (tk, tmpl) = smollm2();
    let models = if exact {
        format!(
            "models:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}\n",
            tk.display(),
            tmpl.display()
        )
    } else {
        String::new()
    };
    let yaml = format!(
        "listen: 127.0.0.1:0\npolicy: equal/p2c\nhealth: {{interval_s: 0}}\n{models}workers:\n  - {{name: w, base_url: \"{worker}\", model: m, context_window: 32768}}\n"
    );
    let cfg = routelab_gateway::GatewayConfig::from_yaml(&yaml, "bench.yaml").unwrap();
    routelab_gateway::start_on(
        cfg,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (plain, exact) = rt.block_on(async {
        let w = fake_worker().await;
        (gateway(&w, false).await, gateway(&w, true).await)
    });
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let body = Bytes::from_static(BODY.as_bytes());
    let mut g = c.benchmark_group("request");
    for (name, gw) in [("estimate", &plain), ("exact", &exact)] {
        let uri: hyper::Uri = format!("http://{}/v1/chat/completions", gw.local_addr())
            .parse()
            .unwrap();
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let req = hyper::Request::post(uri.clone())
                        .header("content-type", "application/json")
                        .body(Full::new(body.clone()))
                        .unwrap();
                    let r = client.request(req).await.unwrap();
                    assert!(r.status().is_success());
                    r.into_body().collect().await.unwrap().to_bytes()
                })
            })
        });
    }
    g.finish();
    let (tk, tmpl) = smollm2();
    let exact_tk = Tokenizers::load(
        &[ModelConfig {
            name: "m".into(),
            tokenizer: tk,
            chat_template: Some(tmpl),
        }],
        std::path::Path::new("."),
        "bench",
    )
    .unwrap();
    let none = Tokenizers::default();
    let parsed = prompt::parse(BODY.as_bytes(), Endpoint::Chat).unwrap();
    let mut g = c.benchmark_group("count");
    g.bench_function("estimate", |b| {
        b.iter(|| {
            none.count(BODY.as_bytes(), Endpoint::Chat, &parsed)
                .unwrap()
        })
    });
    g.bench_function("exact", |b| {
        b.iter(|| {
            exact_tk
                .count(BODY.as_bytes(), Endpoint::Chat, &parsed)
                .unwrap()
        })
    });
    g.finish();
    drop((plain, exact));
}

criterion_group!(benches, bench);
criterion_main!(benches);
