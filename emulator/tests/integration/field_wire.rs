//! What the field's routers read from a worker, answered by the emulator in their formats.
//!
//! The shapes checked here are the published ones:
//! - SGLang's `GET /get_load`: a JSON array, one object per data-parallel rank, `{dp_rank,
//!   num_reqs, num_waiting_reqs, num_tokens}`; SGLang's model gateway sums `num_tokens` over
//!   the array (sgl-project/sglang, `sgl-router/src/core/worker_manager.rs`,
//!   `WorkerManager::get_worker_load`).
//! - vLLM's `POST /tokenize`: a body with `prompt` or `messages` (`model` optional), answered
//!   `{count, max_model_len, tokens, token_strs}` (vLLM's `TokenizeResponse`).
//! - vLLM's `POST /v1/chat/completions/render` (one object with `token_ids`) and
//!   `POST /v1/completions/render` (a list of them), which vllm-router 0.1.17 calls on every
//!   worker per request under `cache_aware` (observed against the wheel).
//! - `x-routelab-worker` on every answer, so shares are visible through any router.

use super::{client, profile};
use http_body_util::{BodyExt, Full};
use routelab_emulator::{EmulatorOptions, serve};
use routelab_gateway::tokens::byte_tokens;
use serde_json::{Value, json};
use std::time::Duration;

type Client = super::HttpClient;

/// Status, the `x-routelab-worker` header and the body of one request.
async fn call(c: &Client, method: &str, url: &str, body: Option<&Value>) -> (u16, String, String) {
    let req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), c.request(req))
        .await
        .expect("answered within 20 s")
        .unwrap();
    let status = r.status().as_u16();
    let worker = r
        .headers()
        .get("x-routelab-worker")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let b = tokio::time::timeout(Duration::from_secs(20), r.into_body().collect())
        .await
        .expect("body within 20 s")
        .unwrap()
        .to_bytes();
    (status, worker, String::from_utf8_lossy(&b).into_owned())
}

async fn emulator(name: Option<&str>) -> routelab_emulator::Emulator {
    let mut opts = EmulatorOptions::new(profile("rtx-pro-6000-27b"));
    opts.model = "m".into();
    opts.context_window = Some(32_768);
    opts.worker_name = name.map(str::to_string);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve(listener, opts).await.unwrap()
}

/// SGLang's router's reading of a `/get_load` answer: the sum of `num_tokens` over the array,
/// or nothing when the answer is not an array.
fn sglang_load(v: &Value) -> Option<i64> {
    Some(
        v.as_array()?
            .iter()
            .filter_map(|e| e.get("num_tokens").and_then(Value::as_i64))
            .sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_load_answers_in_sglangs_shape_and_counts_the_tokens_held() {
    let emu = emulator(Some("w")).await;
    let base = emu.base_url();
    let c = client();
    let (s, _, body) = call(&c, "GET", &format!("{base}/get_load"), None).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let ranks = v.as_array().expect("an array, one entry per DP rank");
    assert_eq!(ranks.len(), 1);
    let keys: Vec<&str> = ranks[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["dp_rank", "num_reqs", "num_tokens", "num_waiting_reqs"]
    );
    for k in keys {
        assert!(ranks[0][k].is_u64(), "{k} is a whole number: {body}");
    }
    assert_eq!(sglang_load(&v), Some(0), "an idle engine holds no tokens");

    // A long request in flight: the load the router reads is its tokens.
    let req = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "prompt_tokens": 6000, "max_tokens": 400, "stream": false});
    let c2 = c.clone();
    let url = format!("{base}/v1/chat/completions");
    let job = tokio::spawn(async move { call(&c2, "POST", &url, Some(&req)).await });
    // Bounded: 2,000 polls of at most 20 s each; the request takes a few seconds.
    let mut most = 0;
    let mut seen_running = false;
    for _ in 0..2000 {
        let (_, _, body) = call(&c, "GET", &format!("{base}/get_load"), None).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        seen_running |= v[0]["num_reqs"] == 1;
        most = most.max(sglang_load(&v).unwrap());
        if most >= 6000 || job.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(seen_running, "the request shows in num_reqs while it runs");
    assert!(
        most >= 6000,
        "once prefilled, the 6,000-token prompt's tokens are held: {most}"
    );
    assert_eq!(job.await.unwrap().0, 200);
    let (_, _, body) = call(&c, "GET", &format!("{base}/get_load"), None).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sglang_load(&v), Some(0), "and released at its end: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_answers_in_vllms_shape_with_the_engines_own_ids() {
    let emu = emulator(Some("w")).await;
    let base = emu.base_url();
    let c = client();
    let prompt = "The quick brown fox jumps over the lazy dog, twice.";
    let (s, _, body) = call(
        &c,
        "POST",
        &format!("{base}/tokenize"),
        Some(&json!({"model": "m", "prompt": prompt})),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["count", "max_model_len", "token_strs", "tokens"]);
    let tokens: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(
        tokens,
        byte_tokens(prompt.as_bytes()),
        "the engine's own ids (no tokenizer: the estimate's byte tokens)"
    );
    assert_eq!(v["count"], tokens.len());
    assert_eq!(v["max_model_len"], 32_768);
    assert!(v["token_strs"].is_null());

    // A chat, without `model` (optional in vLLM's tokenize request): two chats sharing their
    // first message share their leading ids.
    let chat = |tail: &str| {
        json!({"messages": [{"role": "system", "content": "a shared system prompt of some length"},
                            {"role": "user", "content": tail}]})
    };
    let ids = |body: &str| -> Vec<u32> {
        let v: Value = serde_json::from_str(body).unwrap();
        serde_json::from_value(v["tokens"].clone()).unwrap()
    };
    let (s1, _, a) = call(&c, "POST", &format!("{base}/tokenize"), Some(&chat("one"))).await;
    let (s2, _, b) = call(&c, "POST", &format!("{base}/tokenize"), Some(&chat("two"))).await;
    assert_eq!((s1, s2), (200, 200));
    let (a, b) = (ids(&a), ids(&b));
    assert!(a.len() > 8 && a[..8] == b[..8], "{a:?} / {b:?}");
    assert_ne!(a, b);

    // Neither `prompt` nor `messages`: a 400 in OpenAI's error shape.
    let (s, _, body) = call(
        &c,
        "POST",
        &format!("{base}/tokenize"),
        Some(&json!({"model": "m"})),
    )
    .await;
    assert_eq!(s, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("prompt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_answers_the_token_ids_tokenize_gives() {
    let emu = emulator(Some("w")).await;
    let base = emu.base_url();
    let c = client();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hello there, render me"}],
        "max_tokens": 4});
    let (s, _, tok) = call(&c, "POST", &format!("{base}/tokenize"), Some(&chat)).await;
    assert_eq!(s, 200);
    let tokens = serde_json::from_str::<Value>(&tok).unwrap()["tokens"].clone();
    let (s, _, body) = call(
        &c,
        "POST",
        &format!("{base}/v1/chat/completions/render"),
        Some(&chat),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["token_ids"], tokens, "one object with the chat's ids");
    assert_eq!(v["model"], "m");

    let completion = json!({"model": "m", "prompt": "hello there, render me"});
    let (s, _, body) = call(
        &c,
        "POST",
        &format!("{base}/v1/completions/render"),
        Some(&completion),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let list = v.as_array().expect("a list of rendered prompts");
    assert_eq!(list.len(), 1);
    assert_eq!(
        list[0]["token_ids"],
        json!(byte_tokens(b"hello there, render me"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_names_its_worker() {
    let emu = emulator(Some("pro6000-a")).await;
    let base = emu.base_url();
    let c = client();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3, "stream": true});
    let wrong_model = json!({"model": "other", "prompt": "hi", "max_tokens": 3});
    for (method, path, body, status) in [
        ("GET", "/health", None, 200),
        ("GET", "/v1/models", None, 200),
        ("GET", "/get_load", None, 200),
        ("GET", "/metrics", None, 200),
        ("POST", "/v1/chat/completions", Some(&chat), 200),
        ("POST", "/v1/completions", Some(&wrong_model), 404),
        ("GET", "/no/such/path", None, 404),
    ] {
        let (s, worker, _) = call(&c, method, &format!("{base}{path}"), body).await;
        assert_eq!(s, status, "{method} {path}");
        assert_eq!(worker, "pro6000-a", "{method} {path}");
    }
    // Without a name: the profile's.
    let unnamed = emulator(None).await;
    let (_, worker, _) = call(&c, "GET", &format!("{}/health", unnamed.base_url()), None).await;
    assert_eq!(worker, profile("rtx-pro-6000-27b").name());
}

#[tokio::test]
async fn a_name_that_cannot_be_a_header_is_refused() {
    let mut opts = EmulatorOptions::new(profile("rtx-pro-6000-27b"));
    opts.worker_name = Some("bad\nname".into());
    let err = opts.validate().unwrap_err().to_string();
    assert!(err.contains("x-routelab-worker"), "{err}");
}
