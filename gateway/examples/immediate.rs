//! An immediate worker: every endpoint the gateway and the field's routers read, answered at
//! once, so a router's own cost is what a load generator in front of it measures
//! (docs/performance.md, "Against an immediate worker"). `cargo build --release -p
//! routelab-gateway --example immediate`, then `target/release/examples/immediate --port 8101`.
//!
//! It answers the load example's fixed chat completion (streamed when asked, as the gateway's
//! probes ask), `/health` and `/health_generate`, `/v1/models`, a vLLM-named `/metrics` page,
//! SGLang's `GET /get_load` (`[{dp_rank, num_reqs, num_waiting_reqs, num_tokens}]`, what
//! sglang-router's power-of-two reads), vLLM's `POST /tokenize` (`{count, max_model_len,
//! tokens, token_strs}`) and its chat and completion render endpoints (`{request_id, model,
//! token_ids}`, what vllm-router's `cache_aware` calls on every worker per request), the token
//! ids being one per 4 bytes of the body, as the gateway's estimate counts. Nothing is counted
//! or kept: each answer is a constant or a function of the body alone.
//!
//! Arguments: `--port P` (8101; 0 picks one), `--threads N` (1: the runtime's worker threads,
//! so the worker leaves the other core to the router and the load generator).

mod fake;

use fake::args::num;

use axum::routing::{get, post};
use bytes::Bytes;

/// Token ids of a body: one per whole 4 bytes, as the gateway's estimate makes them.
fn ids(body: &[u8]) -> Vec<u32> {
    routelab_gateway::tokens::byte_tokens(body)
}

async fn chat(body: Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    const STREAM: &[u8] = b"\"stream\":true";
    if body.windows(STREAM.len()).any(|w| w == STREAM) {
        ([("content-type", "text/event-stream")], fake::STREAMED).into_response()
    } else {
        ([("content-type", "application/json")], fake::ANSWER).into_response()
    }
}

fn json(v: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    axum::Json(v).into_response()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        if !["--port", "--threads"].contains(&args[i].as_str()) || i + 1 >= args.len() {
            eprintln!(
                "error: `{}`: immediate takes --port P (8101) and --threads N (1)",
                args[i]
            );
            std::process::exit(2);
        }
        i += 2;
    }
    let port = num("--port", 8101);
    let threads = num("--threads", 1).max(1) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(chat))
            .route("/health", get(|| async { "ok" }))
            .route("/health_generate", get(|| async { "ok" }))
            .route("/metrics", get(|| async { fake::METRICS }))
            .route(
                "/v1/models",
                get(|| async {
                    json(serde_json::json!({"object": "list", "data": [
                        {"id": "m", "object": "model", "owned_by": "routelab", "max_model_len": 32768}
                    ]}))
                }),
            )
            .route(
                "/get_load",
                get(|| async {
                    json(serde_json::json!([
                        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
                    ]))
                }),
            )
            .route(
                "/tokenize",
                post(|body: Bytes| async move {
                    let t = ids(&body);
                    json(serde_json::json!({
                        "count": t.len(), "max_model_len": 32768, "tokens": t, "token_strs": null
                    }))
                }),
            )
            .route(
                "/v1/chat/completions/render",
                post(|body: Bytes| async move {
                    json(serde_json::json!({"request_id": "r", "model": "m", "token_ids": ids(&body)}))
                }),
            )
            .route(
                "/v1/completions/render",
                post(|body: Bytes| async move {
                    json(serde_json::json!([{"request_id": "r", "model": "m", "token_ids": ids(&body)}]))
                }),
            );
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port as u16))
            .await
            .unwrap_or_else(|e| {
                eprintln!("error: --port {port}: cannot listen on 127.0.0.1:{port}: {e}");
                std::process::exit(1)
            });
        println!("listening on http://{}", l.local_addr().unwrap());
        let l = axum::serve::ListenerExt::tap_io(l, |t| {
            let _ = t.set_nodelay(true);
        });
        let _ = axum::serve(l, app).await;
    });
}
