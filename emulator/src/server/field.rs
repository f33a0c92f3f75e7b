//! What the field's engines expose beside the OpenAI API, so the field's routers and pollers
//! read the emulator as they read vLLM or SGLang: `/metrics` under either's names, SGLang's
//! `GET /get_load`, vLLM's `POST /tokenize` and its `render` endpoints.

use super::{App, MetricsNames, error};
use crate::driver::EngineSnapshot;
use crate::openai;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// `GET /metrics`: the engine's figures under vLLM's names (V1 engine), so a gateway polls it
/// as it polls vLLM: requests running and waiting, KV cache use (0 to 1, as allocated), token
/// counters, and the finished requests' prompt and output lengths and decode times (histograms
/// with their `+Inf` bucket only: the sums and counts are what a poller reads). A request admitted
/// while a step runs is still waiting until the next step takes it, as in the simulator's engine
/// report: the waiting count is the requests whose prompts the report counts queued.
pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let s = app.driver.snapshot();
    let page = match app.metrics_names {
        MetricsNames::Sglang => sglang_metrics(&s, &app.model),
        MetricsNames::Vllm => vllm_metrics(&s, &app.model),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
        .into_response()
}

/// `GET /get_load`: the engine's load in the shape SGLang's `/get_load` answers and its model
/// gateway reads — a JSON array of one object per data-parallel rank, `{dp_rank, num_reqs,
/// num_waiting_reqs, num_tokens}`, of which the gateway's power-of-two load monitor sums
/// `num_tokens` (sgl-project/sglang, `sgl-router/src/core/worker_manager.rs`,
/// `WorkerManager::get_worker_load`). One rank here: `num_reqs` the requests in the engine
/// (running and waiting), `num_waiting_reqs` those waiting, `num_tokens` the KV tokens the
/// running sequences hold as the engine model allocates them (a prompt as far as prefilled, then
/// the tokens generated, in whole KV blocks) plus the prompt tokens waiting. SGLang allocates a
/// prefill chunk at once, so during a long prefill its figure runs ahead of this one.
pub(super) async fn get_load(State(app): State<Arc<App>>) -> Response {
    axum::Json(load_body(&app.driver.snapshot())).into_response()
}

fn load_body(s: &EngineSnapshot) -> serde_json::Value {
    json!([{
        "dp_rank": 0,
        "num_reqs": s.in_flight,
        "num_waiting_reqs": s.queued,
        "num_tokens": s.kv_allocated_tokens + s.waiting_prompt_tokens,
    }])
}

fn bad_request(e: openai::Invalid) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        &e.message,
        e.param,
    )
}

/// `POST /tokenize`: vLLM's tokenize endpoint — a body with `prompt` (completion) or
/// `messages` (chat), `model` optional — answered as vLLM answers it, `{count, max_model_len,
/// tokens, token_strs}` (`token_strs` null: this emulator keeps no token texts), with the
/// emulator's own token ids ([`openai::prompt_ids`]).
pub(super) async fn tokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match openai::prompt_ids(&body, &app.model, app.tokenizer.as_deref()) {
        Ok(ids) => axum::Json(json!({
            "count": ids.len(),
            "max_model_len": app.context_window,
            "tokens": ids,
            "token_strs": null,
        }))
        .into_response(),
        Err(e) => bad_request(e),
    }
}

/// The render answer for one prompt: its token ids and the model, under the names vLLM's
/// render endpoints use (`token_ids`, `model`, `request_id`).
fn rendered(app: &App, body: &[u8]) -> Result<serde_json::Value, openai::Invalid> {
    let ids = openai::prompt_ids(body, &app.model, app.tokenizer.as_deref())?;
    let n = app.ids.fetch_add(1, Relaxed);
    Ok(json!({"request_id": format!("render-emu{n}"), "model": app.model, "token_ids": ids}))
}

/// `POST /v1/chat/completions/render`: vLLM's chat render — the chat request's prompt as
/// token ids, one object (what vLLM's router calls on every worker per request under
/// `cache_aware`, observed against vllm-router 0.1.17).
pub(super) async fn render_chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match rendered(&app, &body) {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => bad_request(e),
    }
}

/// `POST /v1/completions/render`: vLLM's completion render — a list of one rendered prompt.
pub(super) async fn render_completion(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match rendered(&app, &body) {
        Ok(v) => axum::Json(json!([v])).into_response(),
        Err(e) => bad_request(e),
    }
}

/// A Prometheus label value with `\` and `"` escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Running and waiting requests, and the KV cache's used fraction (may exceed 1 before the
/// page's `min`).
fn load_of(s: &EngineSnapshot) -> (u32, u32, f64) {
    let (running, waiting) = (s.in_flight.saturating_sub(s.queued), s.queued);
    let kv = s.kv_allocated_tokens as f64 / s.kv_capacity_tokens.max(1) as f64;
    (running, waiting, kv)
}

/// The page under SGLang's names.
fn sglang_metrics(s: &EngineSnapshot, model: &str) -> String {
    use std::fmt::Write as _;
    let (running, waiting, kv) = load_of(s);
    let l = format!("model_name=\"{}\"", label_value(model));
    let mut out = String::new();
    for (name, kind, value) in [
        ("sglang:num_running_reqs", "gauge", running.to_string()),
        ("sglang:num_queue_reqs", "gauge", waiting.to_string()),
        ("sglang:token_usage", "gauge", format!("{}", kv.min(1.0))),
        (
            "sglang:num_used_tokens",
            "gauge",
            s.kv_allocated_tokens.to_string(),
        ),
        (
            "sglang:gen_throughput",
            "gauge",
            format!("{}", s.generation_tok_s),
        ),
        (
            "sglang:prompt_tokens_total",
            "counter",
            s.counters.completed_prompt_tokens.to_string(),
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            s.counters.generation_tokens.to_string(),
        ),
        (
            "sglang:num_requests_total",
            "counter",
            s.counters.completed.to_string(),
        ),
    ] {
        let _ = writeln!(out, "# TYPE {name} {kind}\n{name}{{{l}}} {value}");
    }
    out
}

/// The page under vLLM's names.
fn vllm_metrics(s: &EngineSnapshot, model: &str) -> String {
    use std::fmt::Write as _;
    let (running, waiting, kv) = load_of(s);
    let l = format!("engine=\"0\",model_name=\"{}\"", label_value(model));
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{l}}} {value}"
        );
    };
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        running.to_string(),
    );
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        waiting.to_string(),
    );
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        format!("{}", kv.min(1.0)),
    );
    family(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        s.counters.prompt_tokens.to_string(),
    );
    family(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        s.counters.generation_tokens.to_string(),
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_prompt_tokens Number of prefill tokens processed.\n# TYPE vllm:request_prompt_tokens histogram\n\
         vllm:request_prompt_tokens_bucket{{{l},le=\"+Inf\"}} {n}\nvllm:request_prompt_tokens_sum{{{l}}} {sum}\nvllm:request_prompt_tokens_count{{{l}}} {n}",
        n = s.counters.completed,
        sum = s.counters.completed_prompt_tokens
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_generation_tokens Number of generation tokens processed.\n# TYPE vllm:request_generation_tokens histogram\n\
         vllm:request_generation_tokens_bucket{{{l},le=\"+Inf\"}} {n}\nvllm:request_generation_tokens_sum{{{l}}} {sum}\nvllm:request_generation_tokens_count{{{l}}} {n}",
        n = s.counters.completed,
        sum = s.counters.completed_generation_tokens
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.\n# TYPE vllm:request_decode_time_seconds histogram\n\
         vllm:request_decode_time_seconds_bucket{{{l},le=\"+Inf\"}} {n}\nvllm:request_decode_time_seconds_sum{{{l}}} {sum}\nvllm:request_decode_time_seconds_count{{{l}}} {n}",
        n = s.counters.completed,
        sum = s.counters.completed_decode_ns as f64 / 1e9
    );
    out
}
