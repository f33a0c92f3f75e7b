//! `routelab bench URL --concurrency 1,2,4 ...`: a closed-loop sweep of an OpenAI-compatible
//! endpoint, one `vllm bench serve`-style result file per concurrency (what `routelab profile
//! fit --from vllm-bench` reads).

use anyhow::Context;
use routelab_emulator::{BenchConfig, BenchResult, bench, unsaturated_rise};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The largest rise of the aggregate over a sweep's last step that still counts as saturated.
pub const SATURATION_TOLERANCE: f64 = 0.10;

/// Options of `routelab bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The endpoint's base URL, e.g. http://127.0.0.1:18101 (an engine, an emulator or the
    /// gateway; `/v1/chat/completions` is appended).
    pub url: String,
    /// Concurrencies to run, in increasing order, comma-separated (one closed loop each).
    #[arg(long, value_delimiter = ',', required = true)]
    pub concurrency: Vec<u32>,
    /// Prompt tokens per request (the prompt is rendered at 4 bytes a token; the engine's own
    /// count is read from each response's usage and written as total_input_tokens).
    #[arg(long)]
    pub prompt_tokens: u32,
    /// Output tokens per request (max_tokens = min_tokens, ignore_eos).
    #[arg(long)]
    pub output_tokens: u32,
    /// Requests per client in each run (the run sends concurrency x this many).
    #[arg(long, default_value_t = 4)]
    pub rounds: u32,
    /// The model name sent.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// One request's time limit, seconds.
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout_s: f64,
    /// Directory for the result files (c<C>.json each, and decode.csv).
    #[arg(long)]
    pub out: PathBuf,
    /// Accept a sweep whose last step still raised the aggregate by more than 10 % (its top
    /// did not reach the engine's capacity: a profile fitted from it is flat beyond the top
    /// and underestimates the engine).
    #[arg(long)]
    pub allow_unsaturated: bool,
}

/// Run the sweep.
pub fn run(args: &BenchArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.concurrency.windows(2).all(|w| w[0] < w[1]) && args.concurrency[0] >= 1,
        "--concurrency {:?} is not valid; expected whole numbers >= 1 in increasing order, e.g. \
         1,2,4",
        args.concurrency
    );
    anyhow::ensure!(
        args.request_timeout_s.is_finite() && args.request_timeout_s > 0.0,
        "--request-timeout-s {} is not valid; expected seconds > 0",
        args.request_timeout_s
    );
    anyhow::ensure!(args.rounds >= 1, "--rounds 0 is not valid; expected >= 1");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot create", args.out.display()))?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    writeln!(
        out,
        "closed loop against {}: prompt {} tokens asked, output {} tokens, {} requests per client",
        args.url, args.prompt_tokens, args.output_tokens, args.rounds
    )?;
    writeln!(
        out,
        "{:>11} {:>10} {:>12} {:>13} {:>12} {:>12}  file",
        "concurrency", "requests", "output tok/s", "prompt tokens", "mean TTFT s", "mean TPOT s"
    )?;
    let mut results: Vec<BenchResult> = Vec::new();
    for &c in &args.concurrency {
        let cfg = BenchConfig {
            concurrency: c,
            prompt_tokens: args.prompt_tokens,
            output_tokens: args.output_tokens,
            requests: c * args.rounds,
            model: args.model.clone(),
            request_timeout: Duration::from_secs_f64(args.request_timeout_s),
            speedup: 1.0,
        };
        let r = runtime
            .block_on(bench(&args.url, &cfg))
            .with_context(|| format!("benchmarking {} at concurrency {c}", args.url))?;
        let file = args.out.join(format!("c{c}.json"));
        let text = serde_json::to_string_pretty(&r.to_vllm_json()).expect("json");
        std::fs::write(&file, text + "\n")
            .with_context(|| format!("{}: cannot write", file.display()))?;
        writeln!(
            out,
            "{:>11} {:>10} {:>12.2} {:>13.1} {:>12.3} {:>12.4}  {}",
            c,
            r.completed,
            r.output_tok_s(),
            r.total_input_tokens as f64 / f64::from(r.completed),
            r.mean_ttft_s,
            r.mean_tpot_s,
            file.display()
        )?;
        results.push(r);
    }
    let mut csv = String::from("concurrency,aggregate_tok_s\n");
    for r in &results {
        csv.push_str(&format!("{},{:.3}\n", r.config.concurrency, r.decode_tok_s));
    }
    let decode = args.out.join("decode.csv");
    std::fs::write(&decode, csv).with_context(|| format!("{}: cannot write", decode.display()))?;
    writeln!(
        out,
        "decode aggregate while decoding (concurrency x tokens after the first / time after the \
         first token): {} (pure decode when the prompts are short against the outputs; \
         profile fit --decode-sweep)",
        decode.display()
    )?;
    if let Some(rise) = unsaturated_rise(&results, SATURATION_TOLERANCE) {
        let top = args.concurrency[args.concurrency.len() - 1];
        let msg = format!(
            "the sweep does not saturate: the aggregate rose {:.0} % from concurrency {} to {top} \
             (more than {:.0} %), so the engine's capacity lies beyond the sweep and a profile \
             fitted from it would be flat from {top} on; add higher concurrencies (up to the \
             engine's slots, e.g. llama.cpp --parallel, vLLM --max-num-seqs) or pass \
             --allow-unsaturated",
            rise * 100.0,
            args.concurrency[args.concurrency.len() - 2],
            SATURATION_TOLERANCE * 100.0
        );
        if !args.allow_unsaturated {
            anyhow::bail!("{msg}");
        }
        writeln!(out, "warning: {msg}")?;
    }
    Ok(ExitCode::SUCCESS)
}
