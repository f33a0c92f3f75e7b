//! A hardware profile fitted from measurements (`routelab profile fit`).
//!
//! Three sources give decode points (aggregate output tokens/s at a concurrency):
//!
//! - [`FitSource::Csv`]: `concurrency,aggregate_tok_s` rows (header required), optionally
//!   `prefill_tok_s` and `cold_burst_tok_s` columns;
//! - [`FitSource::VllmBench`]: the result JSON files of `vllm bench serve --save-result`, one
//!   per `--max-concurrency` run: `output_throughput` at `max_concurrency`, weighted by
//!   `duration`; prefill from the `max_concurrency = 1` run (mean input tokens / mean TTFT);
//! - [`FitSource::Gateway`]: the JSON of the gateway's `GET /admin/capacity`
//!   (`routelab-gateway-capacity/1`), one worker's passive points weighted by `observed_s`.
//!
//! Measured points are noisy, while a profile's aggregate must not fall with concurrency: the
//! points are made non-decreasing by weighted pool-adjacent-violators ([`isotonic`]), the
//! least-squares non-decreasing fit, and the profile's `fitted` notes say how far each point
//! moved. Fields the source does not measure come from [`FitOptions`] or a stated default
//! (listed under `extrapolated`). The result is the profile's YAML text and the validated
//! [`HardwareProfile`] parsed back from it, so what is written is what was checked.

use std::fmt::Write as _;
use std::path::Path;

use routelab_policies::located::{InputError, rule};
use routelab_policies::weights::ProbeConfig;
use serde_json::Value;

use super::{DEFAULT_PREFILL_CHUNK_TOKENS, HardwareProfile, MIN_CONTEXT_WINDOW};

/// `max_running` when `--max-running` is not given: vLLM's default `max_num_seqs`.
pub const DEFAULT_MAX_RUNNING: u32 = 256;
/// `context_window` when neither the source nor `--context-window` gives one.
pub const DEFAULT_CONTEXT_WINDOW: u32 = 32_768;
/// `kv_capacity_tokens` when `--kv-capacity-tokens` is not given (raised to the context window
/// if that is larger, so a full-window request can run).
pub const DEFAULT_KV_CAPACITY_TOKENS: u64 = 131_072;
/// `prefill_tok_s` when nothing measured it: this many times the single-sequence decode speed
/// (the bundled profiles sit at 10-11x for the Macs and 40-90x for the GPUs; the low end keeps
/// long prompts pessimistic rather than flattering).
pub const DEFAULT_PREFILL_PER_DECODE: f64 = 10.0;
/// The schema a gateway capacity file must declare.
pub const GATEWAY_SCHEMA: &str = "routelab-gateway-capacity/1";
/// The columns a profile CSV may have (the first two are required).
pub const CSV_COLUMNS: [&str; 4] = [
    "concurrency",
    "aggregate_tok_s",
    "prefill_tok_s",
    "cold_burst_tok_s",
];

/// Where the measurements come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FitSource {
    /// A CSV of `concurrency,aggregate_tok_s[,prefill_tok_s][,cold_burst_tok_s]`.
    Csv,
    /// `vllm bench serve --save-result` JSON files, one per `--max-concurrency`.
    VllmBench,
    /// A saved `GET /admin/capacity` of the routelab gateway.
    Gateway,
}

impl FitSource {
    /// Every source name, as `--from` takes them.
    pub const NAMES: [&'static str; 3] = ["csv", "vllm-bench", "gateway"];

    /// The source called `name` (one of [`FitSource::NAMES`]).
    pub fn from_name(name: &str) -> Option<FitSource> {
        match name {
            "csv" => Some(FitSource::Csv),
            "vllm-bench" => Some(FitSource::VllmBench),
            "gateway" => Some(FitSource::Gateway),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            FitSource::Csv => "csv",
            FitSource::VllmBench => "vllm-bench",
            FitSource::Gateway => "gateway",
        }
    }
}

/// One input file: its name (for errors and `sources`) and its text.
#[derive(Debug, Clone)]
pub struct FitInput {
    /// The file as the user named it.
    pub origin: String,
    /// Its contents.
    pub text: String,
}

impl FitInput {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<FitInput, InputError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| InputError::unreadable(&origin, &e))?;
        Ok(FitInput { origin, text })
    }
}

/// What the measurements do not say, and the profile's name.
#[derive(Debug, Clone, Default)]
pub struct FitOptions {
    /// The profile's name.
    pub name: String,
    /// KV-cache capacity, tokens.
    pub kv_capacity_tokens: Option<u64>,
    /// The engine's running-sequence limit.
    pub max_running: Option<u32>,
    /// Context window, tokens (overrides the gateway's figure).
    pub context_window: Option<u32>,
    /// Prefill tokens/s (overrides a measured figure).
    pub prefill_tok_s: Option<f64>,
    /// The gateway worker to fit (required when the file has several).
    pub worker: Option<String>,
}

/// How the fit moved one measured point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointMove {
    /// Its concurrency.
    pub concurrency: f64,
    /// The measured aggregate tokens/s.
    pub measured_tok_s: f64,
    /// The fitted (non-decreasing) aggregate tokens/s.
    pub fitted_tok_s: f64,
}

impl PointMove {
    /// Relative move, fitted / measured - 1.
    pub fn relative(&self) -> f64 {
        self.fitted_tok_s / self.measured_tok_s - 1.0
    }
}

/// A fitted profile: the validated profile, the YAML it was read from, and every point's move.
#[derive(Debug, Clone)]
pub struct FittedProfile {
    /// The profile (its origin is `fitted:<name>`).
    pub profile: HardwareProfile,
    /// The profile file's text.
    pub yaml: String,
    /// One entry per measured point, in concurrency order.
    pub moves: Vec<PointMove>,
}

/// `x` to the nearest `1 / per_unit`, never below it (a profile's figures are > 0). Dividing
/// by the whole `per_unit` gives the shortest decimal, so the YAML stays readable.
fn round_to(x: f64, per_unit: f64) -> f64 {
    ((x * per_unit).round() / per_unit).max(1.0 / per_unit)
}

/// Weighted pool-adjacent-violators: the non-decreasing sequence closest to `values` in
/// weighted least squares. Weights must be > 0.
pub fn isotonic(values: &[f64], weights: &[f64]) -> Vec<f64> {
    debug_assert_eq!(values.len(), weights.len());
    // blocks of (mean, total weight, number of points)
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(values.len());
    for (&v, &w) in values.iter().zip(weights) {
        blocks.push((v, w, 1));
        while blocks.len() > 1 {
            let (m2, w2, n2) = blocks[blocks.len() - 1];
            let (m1, w1, n1) = blocks[blocks.len() - 2];
            if m1 <= m2 {
                break;
            }
            blocks.pop();
            let w = w1 + w2;
            *blocks.last_mut().expect("two blocks") = ((m1 * w1 + m2 * w2) / w, w, n1 + n2);
        }
    }
    blocks
        .iter()
        .flat_map(|&(m, _, n)| std::iter::repeat_n(m, n))
        .collect()
}

/// One measured decode point.
#[derive(Debug, Clone, Copy)]
struct Obs {
    concurrency: f64,
    aggregate_tok_s: f64,
    weight: f64,
}

/// A cold burst: aggregate tokens/s at `concurrency` on a freshly started engine.
#[derive(Debug, Clone, Copy)]
struct ColdBurst {
    concurrency: f64,
    tok_s: f64,
}

/// What one source measured.
#[derive(Debug, Default)]
struct Measured {
    points: Vec<Obs>,
    weight_name: &'static str,
    prefill: Option<(f64, String)>,
    cold: Option<ColdBurst>,
    gpu_names: Vec<String>,
    context_window: Option<(u32, String)>,
    sources: Vec<String>,
    notes: Vec<String>,
}

/// Fits a profile from `inputs` (one CSV, one gateway file, or several vLLM results).
pub fn fit(
    source: FitSource,
    inputs: &[FitInput],
    opts: &FitOptions,
) -> Result<FittedProfile, InputError> {
    let cli = "<command line>";
    if opts.name.trim().is_empty() {
        return Err(InputError::new(cli, "--name", "empty profile name").valid("a non-empty name"));
    }
    let Some(first) = inputs.first() else {
        return Err(InputError::new(cli, "FILE", "no input file").valid("at least one file"));
    };
    let measured = match source {
        FitSource::Csv => {
            if inputs.len() > 1 {
                return Err(
                    InputError::new(&inputs[1].origin, "", "--from csv reads one file")
                        .valid("one CSV with a row per concurrency"),
                );
            }
            read_csv(first)?
        }
        FitSource::VllmBench => read_vllm(inputs)?,
        FitSource::Gateway => {
            if inputs.len() > 1 {
                return Err(InputError::new(
                    &inputs[1].origin,
                    "",
                    "--from gateway reads one file",
                )
                .valid("one saved GET /admin/capacity response"));
            }
            read_gateway(first, opts.worker.as_deref())?
        }
    };
    build(source, measured, opts)
}

/// The message of a broken value rule; its `expected` goes to the error's `valid`.
fn not_valid(v: &rule::Violation) -> String {
    format!("{} is not valid", v.got)
}

fn flag_error(flag: &str, message: impl Into<String>, valid: impl Into<String>) -> InputError {
    InputError::new("<command line>", flag, message).valid(valid)
}

fn build(source: FitSource, m: Measured, opts: &FitOptions) -> Result<FittedProfile, InputError> {
    let values: Vec<f64> = m.points.iter().map(|p| p.aggregate_tok_s).collect();
    let weights: Vec<f64> = m.points.iter().map(|p| p.weight).collect();
    let fitted = isotonic(&values, &weights);
    // A pooled mean is written to the nearest 0.001 tok/s; a point the fit left alone keeps
    // the measured figure exactly. Rounding a pooled mean down could put it under an exact
    // neighbour within 0.0005 before it, so each value is at least the one before.
    let mut floor = f64::NEG_INFINITY;
    let moves: Vec<PointMove> = m
        .points
        .iter()
        .zip(&fitted)
        .map(|(p, &f)| {
            let written = if f == p.aggregate_tok_s {
                f
            } else {
                round_to(f, 1e3)
            };
            floor = floor.max(written);
            PointMove {
                concurrency: p.concurrency,
                measured_tok_s: p.aggregate_tok_s,
                fitted_tok_s: floor,
            }
        })
        .collect();
    let curve_at = |c: f64| {
        super::DecodeCurve::Points(
            moves
                .iter()
                .map(|mv| super::DecodePoint {
                    concurrency: mv.concurrency,
                    aggregate_tok_s: mv.fitted_tok_s,
                })
                .collect(),
        )
        .aggregate_tok_s(c)
    };

    let mut fitted_notes: Vec<String> = Vec::new();
    let mut extrapolated: Vec<String> = Vec::new();
    let moved: Vec<(usize, &PointMove)> = moves
        .iter()
        .enumerate()
        .filter(|(_, mv)| mv.fitted_tok_s != mv.measured_tok_s)
        .collect();
    let largest = moves
        .iter()
        .map(|mv| mv.relative().abs())
        .fold(0.0f64, f64::max);
    fitted_notes.push(format!(
        "decode.points: the measured aggregate tok/s made non-decreasing in concurrency by \
         pool-adjacent-violators weighted by {}; {} of {} points moved, the largest by {:.2} %",
        m.weight_name,
        moved.len(),
        moves.len(),
        largest * 100.0
    ));
    for (i, mv) in &moved {
        fitted_notes.push(format!(
            "decode.points[{i}] (concurrency {}): measured {} tok/s, fitted {} tok/s ({:+.2} %)",
            mv.concurrency,
            mv.measured_tok_s,
            mv.fitted_tok_s,
            mv.relative() * 100.0
        ));
    }
    fitted_notes.extend(m.notes);

    let prefill_tok_s = match (opts.prefill_tok_s, m.prefill) {
        (Some(p), _) => {
            rule::positive(p)
                .map_err(|v| flag_error("--prefill-tok-s", not_valid(&v), v.expected))?;
            extrapolated.push("prefill_tok_s (from --prefill-tok-s)".to_string());
            p
        }
        (None, Some((p, how))) => {
            fitted_notes.push(how);
            round_to(p, 10.0)
        }
        (None, None) => {
            extrapolated.push(format!(
                "prefill_tok_s (not measured: {DEFAULT_PREFILL_PER_DECODE} x the single-sequence \
                 decode speed; pass --prefill-tok-s)"
            ));
            round_to(DEFAULT_PREFILL_PER_DECODE * curve_at(1.0), 10.0)
        }
    };
    extrapolated.push(format!(
        "prefill_chunk_tokens (routelab's default {DEFAULT_PREFILL_CHUNK_TOKENS})"
    ));

    let context_window = match (opts.context_window, &m.context_window) {
        (Some(c), _) => {
            extrapolated.push("context_window (from --context-window)".to_string());
            c
        }
        (None, Some((c, _))) => *c,
        (None, None) => {
            extrapolated.push(format!(
                "context_window (not measured: default {DEFAULT_CONTEXT_WINDOW}; pass \
                 --context-window)"
            ));
            DEFAULT_CONTEXT_WINDOW
        }
    };
    if context_window < MIN_CONTEXT_WINDOW {
        return Err(flag_error(
            "--context-window",
            format!("{context_window} tokens is below the smallest window"),
            format!("at least {MIN_CONTEXT_WINDOW} tokens (the probe prompt must fit)"),
        ));
    }
    let kv_capacity_tokens = match opts.kv_capacity_tokens {
        Some(k) => {
            if k > super::MAX_KV_CAPACITY_TOKENS {
                return Err(flag_error(
                    "--kv-capacity-tokens",
                    format!("{k} tokens is above the largest KV cache a profile may declare"),
                    format!("at most {}", super::MAX_KV_CAPACITY_TOKENS),
                ));
            }
            if k < u64::from(context_window) {
                return Err(flag_error(
                    "--kv-capacity-tokens",
                    format!(
                        "{k} tokens cannot hold one request of the context window \
                         ({context_window})"
                    ),
                    format!("at least the context window, {context_window}"),
                ));
            }
            extrapolated.push("kv_capacity_tokens (from --kv-capacity-tokens)".to_string());
            k
        }
        None => {
            let k = DEFAULT_KV_CAPACITY_TOKENS.max(u64::from(context_window));
            extrapolated.push(format!(
                "kv_capacity_tokens (not measured: default {k}; pass --kv-capacity-tokens)"
            ));
            k
        }
    };
    let max_running = match opts.max_running {
        Some(0) => {
            return Err(flag_error(
                "--max-running",
                "0 sequences",
                "a whole number >= 1",
            ));
        }
        Some(n) if n > super::MAX_RUNNING_LIMIT => {
            return Err(flag_error(
                "--max-running",
                format!("{n} sequences is above the largest limit a profile may declare"),
                format!("a whole number from 1 to {}", super::MAX_RUNNING_LIMIT),
            ));
        }
        Some(n) => {
            extrapolated.push("max_running (from --max-running)".to_string());
            n
        }
        None => {
            extrapolated.push(format!(
                "max_running (not measured: vLLM's default max_num_seqs {DEFAULT_MAX_RUNNING}; \
                 pass --max-running)"
            ));
            DEFAULT_MAX_RUNNING
        }
    };

    let cold_start = match m.cold {
        None => {
            extrapolated.push("cold_start (not measured: no cold penalty)".to_string());
            None
        }
        Some(cold) => {
            let probe = ProbeConfig::default();
            let warm = curve_at(cold.concurrency);
            let factor = round_to((cold.tok_s / warm).min(1.0), 1e4);
            // The engine's work for one burst: each sequence prefills its prompt, and its
            // first output token comes with the prefill's step, so `output - 1` decode tokens
            // follow. Counting all `output` would leave the next burst a little cold.
            let decode_tokens = probe.output_tokens.saturating_sub(1);
            let warmup = cold.concurrency * f64::from(probe.prompt_tokens + decode_tokens);
            fitted_notes.push(format!(
                "cold_start.speed_factor = cold burst {} tok/s / fitted warm {} tok/s at \
                 concurrency {} (capped at 1)",
                cold.tok_s, warm, cold.concurrency
            ));
            extrapolated.push(format!(
                "cold_start.warmup_tokens (assumed: the cold penalty lasts one burst of the \
                 probe's shape, the engine's work for it: {} x ({} prompt + {} decode) tokens, \
                 the first of the {} output tokens coming with the prefill)",
                cold.concurrency, probe.prompt_tokens, decode_tokens, probe.output_tokens
            ));
            Some((factor, warmup))
        }
    };

    let mut y = String::new();
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    let _ = writeln!(
        y,
        "# Fitted by `routelab profile fit --from {}`; see docs/profiles.md.",
        source.name()
    );
    let _ = writeln!(y, "name: {}", q(opts.name.trim()));
    let _ = writeln!(
        y,
        "description: {}",
        q(&format!("fitted from {} measurements", source.name()))
    );
    let gpus: Vec<String> = m.gpu_names.iter().map(|g| q(g)).collect();
    let _ = writeln!(y, "gpu_names: [{}]", gpus.join(", "));
    let list = |y: &mut String, key: &str, items: &[String]| {
        let _ = writeln!(y, "{key}:");
        for it in items {
            let _ = writeln!(y, "  - {}", q(it));
        }
    };
    list(&mut y, "sources", &m.sources);
    list(&mut y, "fitted", &fitted_notes);
    let _ = writeln!(y, "decode:\n  points:");
    for mv in &moves {
        let _ = writeln!(
            y,
            "    - {{ concurrency: {}, aggregate_tok_s: {} }}",
            mv.concurrency, mv.fitted_tok_s
        );
    }
    let _ = writeln!(y, "prefill_tok_s: {prefill_tok_s}");
    let _ = writeln!(y, "prefill_chunk_tokens: {DEFAULT_PREFILL_CHUNK_TOKENS}");
    let _ = writeln!(y, "kv_capacity_tokens: {kv_capacity_tokens}");
    let _ = writeln!(y, "max_running: {max_running}");
    let _ = writeln!(y, "context_window: {context_window}");
    if let Some((factor, warmup)) = cold_start {
        let _ = writeln!(
            y,
            "cold_start: {{ speed_factor: {factor}, warmup_tokens: {warmup} }}"
        );
    }
    list(&mut y, "extrapolated", &extrapolated);

    let origin = format!("fitted:{}", opts.name.trim());
    let profile = HardwareProfile::from_yaml_str(&y, &origin)?;
    Ok(FittedProfile {
        profile,
        yaml: y,
        moves,
    })
}

// ---------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------

fn read_csv(input: &FitInput) -> Result<Measured, InputError> {
    let file = input.origin.as_str();
    let valid_header = "a header row `concurrency,aggregate_tok_s` (optional columns \
                        prefill_tok_s, cold_burst_tok_s), then one row per concurrency";
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(input.text.as_bytes());
    let header = rd
        .headers()
        .map_err(|e| InputError::new(file, "", format!("unreadable CSV: {e}")).at(Some(1), None))?
        .clone();
    let mut col = [None; 4];
    for (i, h) in header.iter().enumerate() {
        match CSV_COLUMNS.iter().position(|c| *c == h) {
            Some(k) if col[k].is_none() => col[k] = Some(i),
            Some(_) => {
                return Err(InputError::new(file, h, "column given twice")
                    .at(Some(1), None)
                    .valid(valid_header));
            }
            None => {
                return Err(InputError::new(file, h, format!("unknown column `{h}`"))
                    .at(Some(1), None)
                    .valid(valid_header));
            }
        }
    }
    for (k, name) in CSV_COLUMNS.iter().enumerate().take(2) {
        if col[k].is_none() {
            return Err(
                InputError::new(file, *name, format!("missing column `{name}`"))
                    .at(Some(1), None)
                    .valid(valid_header),
            );
        }
    }
    let mut m = Measured {
        weight_name: "equal weights (one per row)",
        ..Measured::default()
    };
    let mut cold_line: Option<u64> = None;
    let mut prefill_at: Option<(f64, f64)> = None;
    for rec in rd.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line() as u32);
            InputError::new(file, "", format!("unreadable CSV row: {e}")).at(line, None)
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        let at = |name: &str, msg: String, valid: &str| {
            InputError::new(file, name, msg)
                .at(u32::try_from(line).ok(), None)
                .valid(valid)
        };
        let cell = |k: usize| -> Result<Option<f64>, InputError> {
            let Some(i) = col[k] else { return Ok(None) };
            let name = CSV_COLUMNS[k];
            let text = rec.get(i).unwrap_or("");
            if text.is_empty() {
                return if k < 2 {
                    Err(at(name, "empty cell".into(), "a number > 0"))
                } else {
                    Ok(None)
                };
            }
            let v: f64 = text
                .parse()
                .map_err(|_| at(name, format!("`{text}` is not a number"), "a number > 0"))?;
            rule::positive(v)
                .map(Some)
                .map_err(|e| at(name, not_valid(&e), &e.expected))
        };
        let c = cell(0)?.expect("required column");
        let a = cell(1)?.expect("required column");
        if let Some(prev) = m.points.last()
            && c <= prev.concurrency
        {
            return Err(at(
                "concurrency",
                format!(
                    "concurrency {c} is not greater than the previous row's {}",
                    prev.concurrency
                ),
                "rows in strictly increasing concurrency, one row per concurrency",
            ));
        }
        m.points.push(Obs {
            concurrency: c,
            aggregate_tok_s: a,
            weight: 1.0,
        });
        if let Some(p) = cell(2)? {
            prefill_at.get_or_insert((c, p));
        }
        if let Some(t) = cell(3)? {
            if let Some(first) = cold_line {
                return Err(at(
                    "cold_burst_tok_s",
                    format!("a second cold burst (the first is on line {first})"),
                    "cold_burst_tok_s on one row only: the concurrency of the cold burst",
                ));
            }
            cold_line = Some(line);
            m.cold = Some(ColdBurst {
                concurrency: c,
                tok_s: t,
            });
        }
    }
    if m.points.is_empty() {
        return Err(InputError::new(file, "", "no data rows").valid(valid_header));
    }
    let mut read = vec!["concurrency", "aggregate_tok_s"];
    if let Some((c, p)) = prefill_at {
        m.prefill = Some((
            p,
            format!(
                "prefill_tok_s: the CSV's prefill_tok_s at the lowest concurrency giving one ({c})"
            ),
        ));
        read.push("prefill_tok_s");
    }
    if m.cold.is_some() {
        read.push("cold_burst_tok_s");
    }
    m.sources.push(format!(
        "{file} (CSV, {} rows): {}",
        m.points.len(),
        read.join(", ")
    ));
    Ok(m)
}

// ---------------------------------------------------------------------------------------------
// JSON helpers
// ---------------------------------------------------------------------------------------------

/// Line and column of the first `"key"` in `text` (JSON keeps no positions once parsed; keys
/// of the flat files read here are unique enough to point at).
fn key_position(text: &str, key: &str) -> (Option<u32>, Option<u32>) {
    let needle = format!("\"{key}\"");
    let Some(at) = text.find(&needle) else {
        return (None, None);
    };
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (u32::try_from(line).ok(), u32::try_from(col).ok())
}

fn parse_json(input: &FitInput, what: &str) -> Result<Value, InputError> {
    serde_json::from_str(&input.text).map_err(|e| {
        InputError::new(&input.origin, "", format!("not JSON: {e}"))
            .at(u32::try_from(e.line()).ok(), u32::try_from(e.column()).ok())
            .valid(what.to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// vllm bench serve
// ---------------------------------------------------------------------------------------------

/// The fields of a `vllm bench serve --save-result` file that the fit reads.
pub const VLLM_FIELDS: [&str; 6] = [
    "max_concurrency",
    "completed",
    "duration",
    "total_input_tokens",
    "output_throughput",
    "mean_ttft_ms",
];

struct BenchRun {
    origin: String,
    concurrency: f64,
    completed: f64,
    duration_s: f64,
    total_input_tokens: f64,
    output_tok_s: f64,
    mean_ttft_ms: f64,
}

fn read_vllm_one(input: &FitInput) -> Result<BenchRun, InputError> {
    let what = "the JSON object `vllm bench serve --save-result` writes (max_concurrency, \
                completed, duration, total_input_tokens, output_throughput, mean_ttft_ms, ...)";
    let v = parse_json(input, what)?;
    let Some(obj) = v.as_object() else {
        let kind = match v {
            Value::Array(_) => "a JSON array",
            Value::String(_) => "a JSON string",
            Value::Number(_) => "a JSON number",
            Value::Bool(_) => "a JSON boolean",
            _ => "JSON null",
        };
        return Err(
            InputError::new(&input.origin, "", format!("{kind}, not a benchmark result"))
                .at(Some(1), Some(1))
                .valid(what),
        );
    };
    let origin = input.origin.as_str();
    let err = |key: &str, msg: String, valid: &str| {
        let (l, c) = key_position(&input.text, key);
        InputError::new(origin, key, msg).at(l, c).valid(valid)
    };
    let num = |key: &str, valid: &str| -> Result<f64, InputError> {
        match obj.get(key) {
            None => Err(err(
                key,
                format!("missing field `{key}`"),
                "the result JSON of `vllm bench serve --save-result`, which has it",
            )),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| err(key, format!("{n} is out of range"), valid)),
            Some(other) => Err(err(key, format!("{other} is not a number"), valid)),
        }
    };
    let concurrency = match obj.get("max_concurrency") {
        Some(Value::Null) => {
            return Err(err(
                "max_concurrency",
                "null: this run was limited by request rate, not by concurrency".into(),
                "a run with `--max-concurrency N` (one file per N) so that the throughput \
                 belongs to a known concurrency",
            ));
        }
        _ => num("max_concurrency", "a whole number >= 1")?,
    };
    rule::whole(concurrency, 1, 1 << 20)
        .map_err(|e| err("max_concurrency", not_valid(&e), &e.expected))?;
    let positive = |key: &str| -> Result<f64, InputError> {
        let v = num(key, "a number > 0")?;
        rule::positive(v).map_err(|e| err(key, not_valid(&e), &e.expected))
    };
    Ok(BenchRun {
        origin: origin.to_string(),
        concurrency,
        completed: positive("completed")?,
        duration_s: positive("duration")?,
        total_input_tokens: positive("total_input_tokens")?,
        output_tok_s: positive("output_throughput")?,
        mean_ttft_ms: positive("mean_ttft_ms")?,
    })
}

fn read_vllm(inputs: &[FitInput]) -> Result<Measured, InputError> {
    let mut runs = inputs
        .iter()
        .map(read_vllm_one)
        .collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
    for w in runs.windows(2) {
        if w[0].concurrency == w[1].concurrency {
            return Err(InputError::new(
                &w[1].origin,
                "max_concurrency",
                format!(
                    "max_concurrency {} is also the one of {}",
                    w[1].concurrency, w[0].origin
                ),
            )
            .valid("one file per --max-concurrency value"));
        }
    }
    let mut m = Measured {
        weight_name: "each run's duration (s)",
        ..Measured::default()
    };
    for r in &runs {
        m.points.push(Obs {
            concurrency: r.concurrency,
            aggregate_tok_s: r.output_tok_s,
            weight: r.duration_s,
        });
        m.sources.push(format!(
            "{} (vllm bench serve --save-result): max_concurrency {}, output_throughput, \
             duration, completed, total_input_tokens, mean_ttft_ms",
            r.origin, r.concurrency
        ));
    }
    m.notes.push(
        "decode.points: output_throughput of each --max-concurrency run; it counts the time \
         prompts spend in prefill and slots spend refilling, so it underestimates pure decode \
         (most at low concurrency and long prompts)"
            .to_string(),
    );
    if let Some(r) = runs.iter().find(|r| r.concurrency == 1.0) {
        let mean_in = r.total_input_tokens / r.completed;
        let ttft_s = r.mean_ttft_ms / 1000.0;
        m.prefill = Some((
            mean_in / ttft_s,
            format!(
                "prefill_tok_s = mean input tokens / mean TTFT of the max_concurrency 1 run ({}): \
                 {mean_in} / {ttft_s} s; TTFT also holds scheduling and the network, so this is \
                 a lower bound",
                r.origin
            ),
        ));
    }
    Ok(m)
}

// ---------------------------------------------------------------------------------------------
// gateway /admin/capacity
// ---------------------------------------------------------------------------------------------

fn read_gateway(input: &FitInput, worker: Option<&str>) -> Result<Measured, InputError> {
    let what = format!(
        "the JSON of the gateway's GET /admin/capacity: {{\"schema\": \"{GATEWAY_SCHEMA}\", \
         \"model\", \"generated_unix_s\", \"workers\": [{{\"name\", \"gpu_names\", \
         \"context_window\", \"points\": [{{\"concurrency\", \"aggregate_tok_s\", \
         \"observed_s\", \"tokens\"}}]}}]}}"
    );
    let v = parse_json(input, &what)?;
    let origin = input.origin.as_str();
    let at_key = |key: &str, field: &str, msg: String, valid: &str| {
        let (l, c) = key_position(&input.text, key);
        InputError::new(origin, field, msg).at(l, c).valid(valid)
    };
    let Some(obj) = v.as_object() else {
        return Err(InputError::new(origin, "", "not a JSON object").valid(what));
    };
    match obj.get("schema") {
        Some(Value::String(s)) if s == GATEWAY_SCHEMA => {}
        Some(other) => {
            return Err(at_key(
                "schema",
                "schema",
                format!("schema {other} is not the gateway capacity format"),
                &format!("\"{GATEWAY_SCHEMA}\" (a saved GET /admin/capacity)"),
            ));
        }
        None => {
            return Err(
                InputError::new(origin, "schema", "missing field `schema`").valid(format!(
                    "\"{GATEWAY_SCHEMA}\" (a saved GET /admin/capacity)"
                )),
            );
        }
    }
    let model = obj.get("model").and_then(Value::as_str).unwrap_or("?");
    let workers = obj
        .get("workers")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            at_key(
                "workers",
                "workers",
                "missing or not a list".into(),
                "a list of workers",
            )
        })?;
    let name_of = |w: &Value| w.get("name").and_then(Value::as_str).map(str::to_string);
    let names: Vec<String> = workers.iter().filter_map(name_of).collect();
    let listed = || {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let index = match worker {
        Some(want) => workers
            .iter()
            .position(|w| name_of(w).as_deref() == Some(want))
            .ok_or_else(|| {
                InputError::new(origin, "workers", format!("no worker `{want}`"))
                    .valid(format!("--worker one of: {}", listed()))
            })?,
        None if workers.len() == 1 => 0,
        None => {
            return Err(InputError::new(
                origin,
                "workers",
                format!("{} workers; say which one to fit", workers.len()),
            )
            .valid(format!("--worker one of: {}", listed())));
        }
    };
    let w = &workers[index];
    let wf = format!("workers[{index}]");
    let bad =
        |field: String, msg: String, valid: &str| InputError::new(origin, field, msg).valid(valid);
    let wname = name_of(w).ok_or_else(|| {
        bad(
            format!("{wf}.name"),
            "missing or not a string".into(),
            "a name",
        )
    })?;
    let mut m = Measured {
        weight_name: "each point's observed_s",
        ..Measured::default()
    };
    if let Some(g) = w.get("gpu_names").and_then(Value::as_array) {
        m.gpu_names = g
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect();
    }
    if let Some(c) = w.get("context_window") {
        let cw = c
            .as_f64()
            .and_then(|x| rule::whole(x, u64::from(MIN_CONTEXT_WINDOW), u64::from(u32::MAX)).ok())
            .ok_or_else(|| {
                bad(
                    format!("{wf}.context_window"),
                    format!("{c} is not a context window"),
                    "a whole number of tokens >= 1024",
                )
            })?;
        m.context_window = Some((cw as u32, "the gateway's context_window".to_string()));
    }
    let points = w.get("points").and_then(Value::as_array).ok_or_else(|| {
        bad(
            format!("{wf}.points"),
            "missing or not a list".into(),
            "a list of {concurrency, aggregate_tok_s, observed_s, tokens}",
        )
    })?;
    if points.is_empty() {
        return Err(bad(
            format!("{wf}.points"),
            format!("worker `{wname}` has no measured points yet"),
            "at least one point (let the gateway serve traffic first)",
        ));
    }
    // A concurrency observed long enough but with no token counted (only failed or buffered
    // responses were decoding there) says nothing about speed: left out, and said so.
    let mut without_tokens = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let num = |key: &str| -> Result<f64, InputError> {
            let f = format!("{wf}.points[{i}].{key}");
            let v = p
                .get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| bad(f.clone(), "missing or not a number".into(), "a number > 0"))?;
            rule::positive(v).map_err(|e| bad(f, not_valid(&e), &e.expected))
        };
        if p.get("aggregate_tok_s").and_then(Value::as_f64) == Some(0.0) {
            without_tokens.push(num("concurrency")?);
            continue;
        }
        m.points.push(Obs {
            concurrency: num("concurrency")?,
            aggregate_tok_s: num("aggregate_tok_s")?,
            weight: num("observed_s")?,
        });
    }
    if m.points.is_empty() {
        return Err(bad(
            format!("{wf}.points"),
            format!("worker `{wname}` has no point with tokens (every aggregate_tok_s is 0)"),
            "at least one point with aggregate_tok_s > 0 (let the gateway serve streamed traffic)",
        ));
    }
    if !without_tokens.is_empty() {
        m.notes.push(format!(
            "decode.points: left out the gateway's points at concurrency {} (observed, but no \
             output token counted there)",
            without_tokens
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    m.points
        .sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
    for pair in m.points.windows(2) {
        if pair[0].concurrency == pair[1].concurrency {
            return Err(bad(
                format!("{wf}.points"),
                format!("concurrency {} appears twice", pair[0].concurrency),
                "one point per concurrency",
            ));
        }
    }
    let generated = obj
        .get("generated_unix_s")
        .map_or_else(|| "?".to_string(), Value::to_string);
    m.sources.push(format!(
        "{origin} ({GATEWAY_SCHEMA}, model {model}, worker {wname}, generated_unix_s \
         {generated}): points concurrency, aggregate_tok_s, observed_s; gpu_names; \
         context_window"
    ));
    m.notes.push(
        "decode.points: the gateway's passive measurement (output tokens / time at each \
         observed concurrency); like any end-to-end figure it includes prefill time"
            .to_string(),
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isotonic_pools_violators_by_weight() {
        assert_eq!(isotonic(&[1.0, 2.0, 3.0], &[1.0; 3]), vec![1.0, 2.0, 3.0]);
        assert_eq!(isotonic(&[1.0, 3.0, 2.0], &[1.0; 3]), vec![1.0, 2.5, 2.5]);
        // the heavier point moves less
        assert_eq!(
            isotonic(&[1.0, 4.0, 1.0], &[1.0, 3.0, 1.0]),
            vec![1.0, 3.25, 3.25]
        );
        // a violation that spans several blocks pools them all
        let out = isotonic(&[5.0, 6.0, 7.0, 0.0], &[1.0; 4]);
        assert!(out.windows(2).all(|w| w[0] <= w[1]), "{out:?}");
        assert!((out.iter().sum::<f64>() - 18.0).abs() < 1e-12, "{out:?}");
    }

    fn csv(text: &str) -> FitInput {
        FitInput {
            origin: "m.csv".into(),
            text: text.into(),
        }
    }

    fn opts() -> FitOptions {
        FitOptions {
            name: "t".into(),
            ..FitOptions::default()
        }
    }

    #[test]
    fn csv_fit_writes_the_notes_and_defaults() {
        let f = fit(
            FitSource::Csv,
            &[csv(
                "concurrency,aggregate_tok_s,cold_burst_tok_s\n1,100,\n8,420,\n16,410,100\n",
            )],
            &opts(),
        )
        .unwrap();
        let p = &f.profile;
        assert_eq!(p.origin(), "fitted:t");
        assert_eq!(p.max_running(), DEFAULT_MAX_RUNNING);
        assert_eq!(p.context_window(), DEFAULT_CONTEXT_WINDOW);
        assert!((p.aggregate_tok_s(8.0) - 415.0).abs() < 1e-9);
        assert!((p.aggregate_tok_s(16.0) - 415.0).abs() < 1e-9);
        assert!((p.prefill_tok_s() - 1000.0).abs() < 1e-9);
        let cold = p.cold_start();
        assert!((cold.speed_factor - 100.0 / 415.0).abs() < 1e-4);
        // one probe burst of work: 64 prompt + 127 decode tokens per sequence
        assert_eq!(cold.warmup_tokens, 16.0 * 191.0);
        assert!(
            p.extrapolated()
                .iter()
                .any(|e| e.contains("16 x (64 prompt + 127 decode) tokens")),
            "{:?}",
            p.extrapolated()
        );
        assert!(
            p.fitted().iter().any(|n| n.contains("2 of 3 points moved")),
            "{:?}",
            p.fitted()
        );
        for field in [
            "max_running",
            "kv_capacity_tokens",
            "context_window",
            "prefill_tok_s",
        ] {
            assert!(
                p.extrapolated().iter().any(|e| e.starts_with(field)),
                "{field} not listed: {:?}",
                p.extrapolated()
            );
        }
    }

    #[test]
    fn flags_replace_defaults_and_are_checked() {
        let input = [csv(
            "concurrency,aggregate_tok_s,prefill_tok_s\n1,100,5000\n4,300,\n",
        )];
        let o = FitOptions {
            kv_capacity_tokens: Some(50_000),
            max_running: Some(12),
            context_window: Some(16_384),
            ..opts()
        };
        let p = fit(FitSource::Csv, &input, &o).unwrap().profile;
        assert_eq!(
            (p.kv_capacity_tokens(), p.max_running(), p.context_window()),
            (50_000, 12, 16_384)
        );
        assert_eq!(p.prefill_tok_s(), 5000.0);
        let bad = FitOptions {
            kv_capacity_tokens: Some(1000),
            ..opts()
        };
        let e = fit(FitSource::Csv, &input, &bad).unwrap_err();
        assert_eq!(e.field, "--kv-capacity-tokens", "{e}");
        // Above what a profile may declare: refused at the flag, not in the generated YAML.
        let huge = FitOptions {
            kv_capacity_tokens: Some(super::super::MAX_KV_CAPACITY_TOKENS + 1),
            ..opts()
        };
        let e = fit(FitSource::Csv, &input, &huge).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("<command line>", "--kv-capacity-tokens"),
            "{e}"
        );
        let many = FitOptions {
            max_running: Some(super::super::MAX_RUNNING_LIMIT + 1),
            ..opts()
        };
        let e = fit(FitSource::Csv, &input, &many).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("<command line>", "--max-running"),
            "{e}"
        );
    }

    #[test]
    fn csv_errors_are_located() {
        let cases = [
            (
                "concurrency,aggregate_tok_s\n1,100\n1,200\n",
                "concurrency",
                Some(3),
            ),
            (
                "concurrency,aggregate_tok_s\n1,100\n2,-5\n",
                "aggregate_tok_s",
                Some(3),
            ),
            (
                "concurrency,aggregate_tok_s\n1,NaN\n",
                "aggregate_tok_s",
                Some(2),
            ),
            ("concurrency,tok_s\n1,100\n", "tok_s", Some(1)),
            ("concurrency\n1\n", "aggregate_tok_s", Some(1)),
            ("concurrency,aggregate_tok_s\n", "", None),
        ];
        for (text, field, line) in cases {
            let e = fit(FitSource::Csv, &[csv(text)], &opts()).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.valid.is_some(), "{e}");
        }
    }

    #[test]
    fn key_positions_are_one_based() {
        assert_eq!(key_position("{\n  \"a\": 1\n}", "a"), (Some(2), Some(3)));
        assert_eq!(key_position("{}", "a"), (None, None));
    }
}
