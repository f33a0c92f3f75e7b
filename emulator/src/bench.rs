//! `routelab bench`: a closed-loop benchmark of any OpenAI-compatible endpoint (an engine such
//! as `llama-server` or vLLM, an emulator, or the gateway), the way `vllm bench serve
//! --max-concurrency C --request-rate inf` runs one: `C` clients each send their next request as
//! soon as their last one completes, every request with the same prompt and output length.
//!
//! It is the real-time player ([`crate::play_with`]) on a `closed_loop` scenario built for the
//! run, so requests, streams and latencies are measured exactly as `routelab realtime` measures
//! them; the result is written as the JSON file `vllm bench serve --save-result` writes (the
//! fields `routelab profile fit --from vllm-bench` reads, and a few more), so a sweep over `C`
//! is a profile fit's input as it is.

use crate::player::{PlayError, PlayOptions, play_with};
use routelab_sim::Scenario;
use std::path::Path;
use std::time::Duration;

/// One closed-loop run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Clients, each with one request in flight.
    pub concurrency: u32,
    /// Prompt tokens asked for per request (the player renders `4 x` this many bytes; the
    /// engine's own count is read from each stream's usage).
    pub prompt_tokens: u32,
    /// Output tokens per request (`max_tokens` = `min_tokens`, `ignore_eos`).
    pub output_tokens: u32,
    /// Requests in the run, over all clients.
    pub requests: u32,
    /// The model name sent.
    pub model: String,
    /// One request's wall-time limit.
    pub request_timeout: Duration,
    /// The endpoint's time runs this many times faster than the wall clock (an emulator at
    /// `--speedup K`); figures are in its time. 1 for a real engine.
    pub speedup: f64,
}

/// What a run measured, in the units `vllm bench serve` reports.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// The run's configuration.
    pub config: BenchConfig,
    /// Requests that completed.
    pub completed: u32,
    /// Requests that failed or were rejected.
    pub failed: u32,
    /// Seconds from the first request sent to the last completion.
    pub duration_s: f64,
    /// Prompt tokens of the completed requests: the engine's count when every stream reported
    /// one, else the lengths asked for ([`BenchResult::input_counted_by_engine`]).
    pub total_input_tokens: u64,
    /// Whether `total_input_tokens` is the engine's count.
    pub input_counted_by_engine: bool,
    /// Output tokens of the completed requests.
    pub total_output_tokens: u64,
    /// Mean and 90th percentile time to first token, seconds.
    pub mean_ttft_s: f64,
    /// 90th percentile TTFT, seconds.
    pub p90_ttft_s: f64,
    /// Mean time per output token after the first, seconds.
    pub mean_tpot_s: f64,
    /// Mean end-to-end latency, seconds.
    pub mean_e2e_s: f64,
    /// The decode aggregate the requests saw while decoding: concurrency × their output tokens
    /// after the first ÷ their time after the first token, tokens/s. With prompts short
    /// against the outputs nothing much prefills beside the decodes, and this is the engine's
    /// pure-decode aggregate at the concurrency (`decode.csv`).
    pub decode_tok_s: f64,
}

impl BenchResult {
    /// Output tokens per second over the run.
    pub fn output_tok_s(&self) -> f64 {
        self.total_output_tokens as f64 / self.duration_s
    }

    /// The result file as `vllm bench serve --save-result` writes it.
    pub fn to_vllm_json(&self) -> serde_json::Value {
        let c = &self.config;
        serde_json::json!({
            "backend": "routelab-bench",
            "model_id": c.model,
            "num_prompts": c.requests,
            "request_rate": "inf",
            "max_concurrency": c.concurrency,
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": f64::from(self.completed) / self.duration_s,
            "output_throughput": self.output_tok_s(),
            "mean_ttft_ms": self.mean_ttft_s * 1e3,
            "p90_ttft_ms": self.p90_ttft_s * 1e3,
            "mean_tpot_ms": self.mean_tpot_s * 1e3,
            "mean_e2el_ms": self.mean_e2e_s * 1e3,
            "routelab_decode_tok_s": self.decode_tok_s,
            "routelab_prompt_tokens_asked": c.prompt_tokens,
            "routelab_input_tokens_from": if self.input_counted_by_engine {
                "engine usage"
            } else {
                "requested lengths (the engine reported no usage.prompt_tokens)"
            },
        })
    }
}

/// Why a run could not be measured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// An option is unusable.
    #[error("{0}")]
    Invalid(String),
    /// Playing the run failed.
    #[error(transparent)]
    Play(#[from] PlayError),
    /// Requests failed: a benchmark of a failing engine measures nothing.
    #[error("{failed} of {requests} requests failed at concurrency {concurrency} (first: {first})")]
    Failed {
        /// Failed or rejected requests.
        failed: u32,
        /// Requests sent.
        requests: u32,
        /// The run's concurrency.
        concurrency: u32,
        /// The first failure's reason.
        first: String,
    },
}

/// The scenario a run plays: one `closed_loop` source of `concurrency` users without think time.
fn scenario(cfg: &BenchConfig) -> Result<Scenario, BenchError> {
    let yaml = format!(
        "name: bench/c{c}\nseed: 1\nmodel: {model}\nfleet:\n  - {{ name: engine, profile: \
         rtx4090-27b }}\ntraffic:\n  - closed_loop: {{ users: {c}, think_s: {{ fixed: 0 }}, \
         count: {n}, prompt: {{ fixed: {p} }}, output: {{ fixed: {o} }} }}\n",
        c = cfg.concurrency,
        model = serde_json::to_string(&cfg.model).expect("a string serialises"),
        n = cfg.requests,
        p = cfg.prompt_tokens,
        o = cfg.output_tokens,
    );
    Scenario::from_yaml(&yaml, Path::new("<bench>"))
        .map_err(|e| BenchError::Invalid(format!("bench options: {e}")))
}

/// Runs one closed loop against `url` (a base URL: `/v1/chat/completions` is appended).
///
/// # Errors
/// [`BenchError::Invalid`] for options that make no run (no client, fewer requests than
/// clients, an output of fewer than 2 tokens: nothing to decode), [`BenchError::Failed`] when
/// any request failed, [`BenchError::Play`] when the URL is unusable.
pub async fn bench(url: &str, cfg: &BenchConfig) -> Result<BenchResult, BenchError> {
    if cfg.concurrency == 0 {
        return Err(BenchError::Invalid(
            "concurrency 0: at least 1 client".into(),
        ));
    }
    if cfg.requests < cfg.concurrency {
        return Err(BenchError::Invalid(format!(
            "{} requests for {} clients: at least one request per client",
            cfg.requests, cfg.concurrency
        )));
    }
    if cfg.output_tokens < 2 || cfg.prompt_tokens == 0 {
        return Err(BenchError::Invalid(format!(
            "prompt {} / output {} tokens: a prompt of at least 1 token and an output of at \
             least 2 (the first token comes with the prefill; the rest are what decode measures)",
            cfg.prompt_tokens, cfg.output_tokens
        )));
    }
    let scenario = scenario(cfg)?;
    let mut opts = PlayOptions::new(cfg.speedup);
    opts.max_in_flight = cfg.concurrency as usize;
    opts.request_timeout = cfg.request_timeout;
    opts.deadline = Some(cfg.request_timeout.saturating_mul(cfg.requests.max(1)));
    opts.policy = "bench".into();
    let report = play_with(&scenario, scenario.setup.seed, url, &opts).await?;
    let ok: Vec<_> = report
        .requests
        .iter()
        .filter(|r| r.error.is_none() && r.record.ttft_s.is_some())
        .collect();
    let failed = report.requests.len() as u32 - ok.len() as u32;
    if failed > 0 || ok.is_empty() {
        let first = report
            .requests
            .iter()
            .find_map(|r| r.error.clone())
            .unwrap_or_else(|| "no request completed".into());
        return Err(BenchError::Failed {
            failed,
            requests: report.requests.len() as u32,
            concurrency: cfg.concurrency,
            first,
        });
    }
    let m = &report.metrics;
    let n = ok.len() as f64;
    let engine_counts: Option<u64> = ok
        .iter()
        .map(|r| r.engine_prompt_tokens.map(u64::from))
        .sum();
    let asked: u64 = ok.iter().map(|r| u64::from(r.record.prompt_tokens)).sum();
    let mut ttfts: Vec<f64> = ok.iter().filter_map(|r| r.record.ttft_s).collect();
    ttfts.sort_by(f64::total_cmp);
    let p90 = ttfts[((ttfts.len() as f64 * 0.9).ceil() as usize).clamp(1, ttfts.len()) - 1];
    let tpots: Vec<f64> = ok.iter().filter_map(|r| r.record.tpot_s).collect();
    Ok(BenchResult {
        config: cfg.clone(),
        completed: ok.len() as u32,
        failed,
        duration_s: (m.last_completion_ns.saturating_sub(m.first_arrival_ns)) as f64 / 1e9,
        total_input_tokens: engine_counts.unwrap_or(asked),
        input_counted_by_engine: engine_counts.is_some(),
        total_output_tokens: ok.iter().map(|r| u64::from(r.record.output_tokens)).sum(),
        mean_ttft_s: ttfts.iter().sum::<f64>() / n,
        p90_ttft_s: p90,
        mean_tpot_s: tpots.iter().sum::<f64>() / (tpots.len().max(1) as f64),
        mean_e2e_s: ok
            .iter()
            .map(|r| r.record.e2e_s.unwrap_or(0.0))
            .sum::<f64>()
            / n,
        decode_tok_s: {
            let (tokens, secs) = ok.iter().fold((0.0, 0.0), |(t, s), r| {
                let after_first = f64::from(r.record.output_tokens.saturating_sub(1));
                let d = r.record.e2e_s.unwrap_or(0.0) - r.record.ttft_s.unwrap_or(0.0);
                (t + after_first, s + d.max(0.0))
            });
            f64::from(cfg.concurrency) * tokens / secs
        },
    })
}

/// Whether a sweep's top reached the engine's capacity: the aggregate of the last run is within
/// `tolerance` (a share, e.g. 0.1) of the one before, or above it by less. Returns the rise of
/// the last step when it is larger (the sweep does not saturate).
pub fn unsaturated_rise(results: &[BenchResult], tolerance: f64) -> Option<f64> {
    let [.., before, last] = results else {
        return None;
    };
    let rise = last.output_tok_s() / before.output_tok_s() - 1.0;
    (rise > tolerance).then_some(rise)
}
