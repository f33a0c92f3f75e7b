//! A hardware profile fitted from measurements (`routelab profile fit`).
//!
//! Three sources give decode points (aggregate output tokens/s at a concurrency):
//!
//! - [`FitSource::Csv`]: `concurrency,aggregate_tok_s` rows (header required), optionally
//!   `prefill_tok_s` and `cold_burst_tok_s` columns, and `mean_prompt_tokens` +
//!   `mean_output_tokens` on a row that is a closed-loop result;
//! - [`FitSource::VllmBench`]: the result JSON files of `vllm bench serve --save-result`, one
//!   per `--max-concurrency` run (each a closed loop): `output_throughput` at
//!   `max_concurrency`, weighted by `duration`, with the run's mean prompt and output lengths;
//!   prefill from the `max_concurrency = 1` run (mean input tokens / mean TTFT);
//! - [`FitSource::Gateway`]: the JSON of the gateway's `GET /admin/capacity`
//!   (`routelab-gateway-capacity/1`), one worker's passive points weighted by `observed_s`.
//!
//! **Decode separated from prefill.** A profile's decode curve is a pure-decode quantity, but
//! a closed loop's output tok/s holds the time its prompts were prefilled; taken as it is, the
//! simulator would count that prefill twice. Closed-loop points have it subtracted under the
//! step model ([`ClosedLoop::decode_aggregate`], timed by `hardware::step`'s
//! `mixed_step_s`) unless [`FitOptions::pure_decode`] says the rows are pure decode; the
//! profile's first `fitted` note says which was done. The overlap the step model needs is
//! given, fitted to one measured mixed step ([`MixedStep`], `--mixed-step`), or routelab's
//! default, and is written into the profile.
//!
//! Measured points are noisy, while a profile's aggregate must not fall with concurrency nor
//! its per-request speed rise: the decode aggregates are replaced by the closest curve in
//! weighted least squares that keeps both rules ([`decode_shape`]: Dykstra's alternating
//! projections between two weighted pool-adjacent-violators, [`isotonic`]), and the profile's
//! `fitted` notes say how far each point moved. Fields the source does not measure come from
//! [`FitOptions`] or a stated default (listed under `extrapolated`). The result is the
//! profile's YAML text and the validated [`HardwareProfile`] parsed back from it, so what is
//! written is what was checked.

use std::fmt::Write as _;
use std::path::Path;

use routelab_policies::located::{InputError, rule};
use routelab_policies::weights::ProbeConfig;
use serde_json::Value;

use super::fit_check::{
    CORRECTION_WARN, OverlapFit, OverlapRow, PREFILL_PER_DECODE_MAX, PREFILL_PER_DECODE_MIN,
    PointError, SIMULATED_ERROR_WARN, SIMULATED_ROUNDS_MAX, infer_overlap, informative,
    simulate_closed_loop,
};
use super::{
    DEFAULT_PREFILL_CHUNK_TOKENS, DEFAULT_PREFILL_OVERLAP, HardwareProfile, MIN_CONTEXT_WINDOW,
    mixed_step_s, overlap_from_mixed_step,
};

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
/// The columns a profile CSV may have (the first two are required). A row with
/// `mean_prompt_tokens` and `mean_output_tokens` is a closed-loop result whose prompts' prefill
/// is subtracted ([`ClosedLoop::decode_aggregate`]).
pub const CSV_COLUMNS: [&str; 6] = [
    "concurrency",
    "aggregate_tok_s",
    "prefill_tok_s",
    "cold_burst_tok_s",
    "mean_prompt_tokens",
    "mean_output_tokens",
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
    /// The rows are pure-decode measurements: nothing is subtracted from closed-loop rows.
    pub pure_decode: bool,
    /// One measured mixed step, from which `prefill_overlap` is fitted.
    pub mixed_step: Option<MixedStep>,
    /// `prefill_overlap` as given (checked to be in `[0, 1]`).
    pub prefill_overlap: Option<f64>,
    /// A pure-decode sweep of the same engine (a CSV of `concurrency,aggregate_tok_s`, nothing
    /// prefilling beside the decodes): the profile's curve comes from it, and the closed-loop
    /// rows fit `prefill_overlap` against it ([`super::fit_check::infer_overlap`]).
    pub decode_sweep: Option<FitInput>,
    /// What the worker announces to the router (overrides the source's `gpu_names`).
    pub gpu_names: Option<Vec<String>>,
}

/// The step-model figures that say how long a closed loop's prefill steps last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepModel {
    /// Prompt tokens/s with nothing decoding.
    pub prefill_tok_s: f64,
    /// Prompt tokens prefilled per step at most.
    pub prefill_chunk_tokens: u32,
    /// The share of a mixed step's shorter part hidden under the longer, in `[0, 1]`.
    pub prefill_overlap: f64,
}

/// One closed-loop benchmark result (`vllm bench serve --max-concurrency C`): `concurrency`
/// clients, each sending its next request as soon as its last one completes, every request
/// with `prompt_tokens` prompt and `output_tokens` output tokens (the run's means), measured at
/// `output_tok_s` output tokens/s over the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClosedLoop {
    /// Concurrent clients, C.
    pub concurrency: f64,
    /// Output tokens/s over the run, X.
    pub output_tok_s: f64,
    /// Prompt tokens per request, P.
    pub prompt_tokens: f64,
    /// Output tokens per request, N.
    pub output_tokens: f64,
}

impl ClosedLoop {
    /// The decode-only aggregate tokens/s the run implies: its output tok/s with the time its
    /// prompts' prefill added taken out, under the step model (`hardware::step`).
    ///
    /// Per second of the run, `R = X / N` requests complete:
    ///
    /// - `X` output tokens come out, `R` of them first tokens, each sampled by the step that
    ///   finishes its prompt's prefill (as in vLLM), so decode steps emit `D = X (N - 1) / N`;
    /// - `R P` prompt tokens are prefilled, `q = R P / prefill_tok_s` seconds of prefill alone.
    ///   A closed loop of fixed lengths keeps its prompts bunched as the benchmark started them
    ///   (all C at once): they fill the chunk budget, so a prefill step carries
    ///   `s = min(chunk, C P)` prompt tokens, `p = s / prefill_tok_s` seconds alone, and
    ///   `m = R P / s` steps a second carry prefill;
    /// - a prefill step also decodes the sequences not prefilling, `b = C - max(1, s / P)` of
    ///   them (none with one client; capped at `D / m`, never more decode tokens beside
    ///   prefills than the run emitted), whose decode alone lasts `d = b δ / D`, where `δ` is
    ///   the decode-only time a second; the step lasts `mixed_step_s(d, p, overlap)`, so it
    ///   adds `mixed_step_s(d, p, overlap) - d` to the decode;
    /// - so `1 = δ + m (mixed_step_s(d, p, overlap) - d)`, solved for `δ` (the right side grows
    ///   with `δ`), and the decode aggregate is `D / δ`.
    ///
    /// While the batch's decode is the longer part of a prefill step (`d >= p`) this is
    /// `δ = 1 - (1 - overlap) q`; with one client nothing hides the prefill, `δ = 1 - q`.
    ///
    /// # Errors
    /// A message when a figure is not finite and positive, when a request has no decode step
    /// (`N <= 1`), or when the prompts' prefill alone would fill the run (`q >= 1`).
    pub fn decode_aggregate(&self, model: &StepModel) -> Result<f64, String> {
        let ClosedLoop {
            concurrency: c,
            output_tok_s: x,
            prompt_tokens: prompt,
            output_tokens: n,
        } = *self;
        for (name, v) in [
            ("concurrency", c),
            ("output tok/s", x),
            ("prompt tokens", prompt),
            ("output tokens", n),
            ("prefill_tok_s", model.prefill_tok_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} = {v}: must be a finite number > 0"));
            }
        }
        if n <= 1.0 {
            return Err(format!(
                "{n} output tokens per request: the first comes with the prefill, so the run \
                 has no decode step to measure (the mean output must be above 1 token)"
            ));
        }
        let requests_per_s = x / n;
        let decode_tok_s = x * (n - 1.0) / n;
        let step_tokens = (c * prompt).min(f64::from(model.prefill_chunk_tokens.max(1)));
        let prefill_steps_per_s = requests_per_s * prompt / step_tokens;
        let chunk_s = step_tokens / model.prefill_tok_s;
        let prefilling = (step_tokens / prompt).max(1.0);
        let prefill_alone = requests_per_s * prompt / model.prefill_tok_s;
        if prefill_alone >= 1.0 {
            return Err(format!(
                "{x} output tok/s of requests with {prompt} prompt tokens need {:.0} prompt \
                 tok/s, at least the prefill speed {} tok/s: the prompts alone would fill the \
                 run and leave no time to decode",
                requests_per_s * prompt,
                model.prefill_tok_s
            ));
        }
        let beside = (c - prefilling)
            .max(0.0)
            .min(decode_tok_s / prefill_steps_per_s);
        let excess = |decode_s: f64| {
            let d = beside * decode_s / decode_tok_s;
            decode_s + prefill_steps_per_s * (mixed_step_s(d, chunk_s, model.prefill_overlap) - d)
                - 1.0
        };
        // `excess` is -(1 - q) < 0 at 0 and >= 0 at 1 (a step never lasts less than its
        // decode) and does not fall in between: bisect to the last bit.
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        loop {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            if excess(mid) < 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(decode_tok_s / hi)
    }
}

/// One measured mixed step (`--mixed-step N:PROMPT_TOKENS:STEP_MS`): a step that decoded
/// `decoding` sequences beside `prompt_tokens` prompt tokens lasted `step_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixedStep {
    /// Sequences decoding in the step.
    pub decoding: u32,
    /// Prompt tokens prefilled in it.
    pub prompt_tokens: u32,
    /// Its measured length, seconds.
    pub step_s: f64,
}

impl MixedStep {
    /// The flag that gives it.
    pub const FLAG: &'static str = "--mixed-step";
    /// What the flag takes.
    pub const FORMAT: &'static str = "N:PROMPT_TOKENS:STEP_MS";

    /// Reads `N:PROMPT_TOKENS:STEP_MS` (e.g. `256:539:16.3`).
    ///
    /// # Errors
    /// A located error at the flag saying what is valid.
    pub fn parse(text: &str) -> Result<MixedStep, InputError> {
        let valid = format!(
            "{}: sequences decoding (a whole number >= 1), prompt tokens prefilled beside them \
             (a whole number >= 1) and the step's measured length in ms (> 0), e.g. 256:539:16.3",
            Self::FORMAT
        );
        let parts: Vec<&str> = text.split(':').map(str::trim).collect();
        let [n, tokens, ms] = parts[..] else {
            return Err(flag_error(
                Self::FLAG,
                format!("`{text}` is not three numbers separated by `:`"),
                valid,
            ));
        };
        let number = |what: &str, s: &str| -> Result<f64, InputError> {
            s.parse::<f64>().map_err(|_| {
                flag_error(
                    Self::FLAG,
                    format!("{what} `{s}` is not a number"),
                    valid.clone(),
                )
            })
        };
        let whole = |what: &str, s: &str| -> Result<u32, InputError> {
            rule::whole(number(what, s)?, 1, u64::from(u32::MAX))
                .map(|v| v as u32)
                .map_err(|v| {
                    flag_error(
                        Self::FLAG,
                        format!("{what}: {}", not_valid(&v)),
                        valid.clone(),
                    )
                })
        };
        let decoding = whole("N", n)?;
        let prompt_tokens = whole("PROMPT_TOKENS", tokens)?;
        let step_ms = rule::positive(number("STEP_MS", ms)?).map_err(|v| {
            flag_error(
                Self::FLAG,
                format!("STEP_MS: {}", not_valid(&v)),
                valid.clone(),
            )
        })?;
        Ok(MixedStep {
            decoding,
            prompt_tokens,
            step_s: step_ms / 1e3,
        })
    }

    /// The overlap this step implies on a card whose decode aggregate at `decoding` sequences
    /// is `aggregate_tok_s` and whose prefill runs at `prefill_tok_s`
    /// ([`overlap_from_mixed_step`]).
    ///
    /// # Errors
    /// Its message when the step is outside what the model can express.
    pub fn overlap(&self, aggregate_tok_s: f64, prefill_tok_s: f64) -> Result<f64, String> {
        overlap_from_mixed_step(
            f64::from(self.decoding) / aggregate_tok_s,
            f64::from(self.prompt_tokens) / prefill_tok_s,
            self.step_s,
        )
    }
}

/// How the fit moved one measured point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointMove {
    /// Its concurrency.
    pub concurrency: f64,
    /// The point's decode aggregate tokens/s: the measured figure, or a closed-loop figure with
    /// its prompts' prefill subtracted.
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

/// A fitted profile: the validated profile, the YAML it was read from, every point's move, and
/// how well the profile reproduces its inputs.
#[derive(Debug, Clone)]
pub struct FittedProfile {
    /// The profile (its origin is `fitted:<name>`).
    pub profile: HardwareProfile,
    /// The profile file's text.
    pub yaml: String,
    /// One entry per point of the curve, in concurrency order.
    pub moves: Vec<PointMove>,
    /// Every input point against what the fitted profile gives for it (a closed loop simulated
    /// on the simulator's engine, a pure-decode point read off the curve), in input order.
    pub errors: Vec<PointError>,
    /// What a careful reader should look at, each with its threshold
    /// ([`super::fit_check`]'s constants).
    pub warnings: Vec<String>,
    /// The overlap fitted from the data, when it was.
    pub overlap_fit: Option<OverlapFit>,
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

/// Where a measured point was read, for errors about it.
#[derive(Debug, Clone, Default)]
struct RowAt {
    file: String,
    field: String,
    line: Option<u32>,
    column: Option<u32>,
}

/// One measured decode point.
#[derive(Debug, Clone)]
struct Obs {
    concurrency: f64,
    /// The measured aggregate output tokens/s.
    aggregate_tok_s: f64,
    weight: f64,
    /// The closed loop it was measured in, when its output tok/s includes its prompts' prefill.
    closed_loop: Option<ClosedLoop>,
    /// Requests per client in that closed loop (for simulating it back).
    rounds: u32,
    at: RowAt,
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
    let sweep = match &opts.decode_sweep {
        None => None,
        Some(input) => {
            if opts.pure_decode {
                return Err(flag_error(
                    "--decode-sweep",
                    "given with --pure-decode",
                    "--decode-sweep with closed-loop rows (their prefill is what the sweep \
                     measures the overlap of), or --pure-decode alone",
                ));
            }
            let sweep = read_csv(input)?;
            if let Some(p) = sweep.points.iter().find(|p| p.closed_loop.is_some()) {
                return Err(InputError::new(
                    &input.origin,
                    "mean_prompt_tokens",
                    "a closed-loop row in the pure-decode sweep",
                )
                .at(p.at.line, None)
                .valid(
                    "rows of `concurrency,aggregate_tok_s` measured with nothing prefilling \
                     (routelab bench writes decode.csv so)",
                ));
            }
            Some(sweep)
        }
    };
    build(source, measured, sweep, opts)
}

/// The points of `points` with one concurrency pooled into one (weights added; the first
/// row's place kept for errors). `points` are in non-decreasing concurrency.
fn pooled_points(points: &[Obs]) -> Vec<Obs> {
    let mut out: Vec<Obs> = Vec::with_capacity(points.len());
    for p in points {
        match out.last_mut() {
            Some(last) if last.concurrency == p.concurrency => last.weight += p.weight,
            _ => out.push(p.clone()),
        }
    }
    out
}

/// `values` (one per point) pooled as [`pooled_points`] pools the points: the weighted mean.
fn pooled_values(points: &[Obs], values: &[f64]) -> Vec<f64> {
    let mut out: Vec<(f64, f64, f64)> = Vec::with_capacity(points.len());
    for (p, &v) in points.iter().zip(values) {
        match out.last_mut() {
            Some(last) if last.0 == p.concurrency => {
                last.1 += p.weight * v;
                last.2 += p.weight;
            }
            _ => out.push((p.concurrency, p.weight * v, p.weight)),
        }
    }
    out.iter()
        .zip(pooled_points(points).iter())
        .map(|(&(_, s, w), p)| {
            if p.weight == w && values.len() == out.len() {
                s / w
            } else {
                round_to(s / w, 1e3)
            }
        })
        .collect()
}

/// The message of a broken value rule; its `expected` goes to the error's `valid`.
fn not_valid(v: &rule::Violation) -> String {
    format!("{} is not valid", v.got)
}

fn flag_error(flag: &str, message: impl Into<String>, valid: impl Into<String>) -> InputError {
    InputError::new("<command line>", flag, message).valid(valid)
}

/// Rounds of [`decode_shape`]'s alternating projections at most.
const SHAPE_ROUNDS: usize = 10_000;

/// The decode curve's shape: the aggregates closest to `values` in weighted least squares that
/// are non-decreasing in concurrency and whose per-request speed (`aggregate / concurrency`)
/// does not rise (a profile's two rules: more sequences never give fewer tokens, nor a
/// shorter step). Each rule alone is a weighted pool-adjacent-violators ([`isotonic`]; the
/// per-request one on `values / concurrency`, weighted by `weight x concurrency²` so that both
/// measure the same squared error); Dykstra's alternating projections between the two give
/// the closest point of both.
pub fn decode_shape(values: &[f64], concurrencies: &[f64], weights: &[f64]) -> Vec<f64> {
    let speed_weights: Vec<f64> = weights
        .iter()
        .zip(concurrencies)
        .map(|(w, c)| w * c * c)
        .collect();
    let non_rising_speed = |a: &[f64]| -> Vec<f64> {
        let negated: Vec<f64> = a.iter().zip(concurrencies).map(|(a, c)| -a / c).collect();
        isotonic(&negated, &speed_weights)
            .iter()
            .zip(concurrencies)
            .map(|(s, c)| -s * c)
            .collect()
    };
    let scale = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mut x = values.to_vec();
    let mut p = vec![0.0; x.len()];
    let mut q = vec![0.0; x.len()];
    for _ in 0..SHAPE_ROUNDS {
        let shifted: Vec<f64> = x.iter().zip(&p).map(|(x, p)| x + p).collect();
        let y = isotonic(&shifted, weights);
        p = shifted.iter().zip(&y).map(|(s, y)| s - y).collect();
        let shifted: Vec<f64> = y.iter().zip(&q).map(|(y, q)| y + q).collect();
        let next = non_rising_speed(&shifted);
        q = shifted.iter().zip(&next).map(|(s, n)| s - n).collect();
        let moved = next
            .iter()
            .zip(&x)
            .chain(next.iter().zip(&y))
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        x = next;
        if moved <= scale * 1e-13 {
            break;
        }
    }
    x
}

/// The fitted decode points of `values` (one per measured point, in concurrency order): shaped
/// by [`decode_shape`], a moved value written to the nearest 0.001 tok/s, a point the fit left
/// alone kept exactly. Rounding (and the alternating projections' last bits) could break a
/// rule by a hair, so each value is kept between the one before and the one before scaled by
/// the concurrency (the same per-request speed).
fn monotone_points(points: &[Obs], values: &[f64]) -> Vec<PointMove> {
    let weights: Vec<f64> = points.iter().map(|p| p.weight).collect();
    let concurrencies: Vec<f64> = points.iter().map(|p| p.concurrency).collect();
    let fitted = decode_shape(values, &concurrencies, &weights);
    let mut prev: Option<(f64, f64)> = None;
    points
        .iter()
        .zip(values)
        .zip(&fitted)
        .map(|((p, &v), &f)| {
            let mut written = if (f - v).abs() <= v.abs() * 1e-12 {
                v
            } else {
                round_to(f, 1e3)
            };
            if let Some((c0, a0)) = prev {
                let top = a0 * p.concurrency / c0;
                if written > top {
                    // the largest 0.001 step under the same per-request speed, or the one
                    // before when none is left between them
                    written = ((top * 1e3).floor() / 1e3).max(a0);
                }
                written = written.max(a0);
            }
            prev = Some((p.concurrency, written));
            PointMove {
                concurrency: p.concurrency,
                measured_tok_s: v,
                fitted_tok_s: written,
            }
        })
        .collect()
}

/// The aggregate decode tokens/s at `concurrency` of the curve through `moves`.
fn curve_of(moves: &[PointMove], concurrency: f64) -> f64 {
    super::DecodeCurve::Points(
        moves
            .iter()
            .map(|mv| super::DecodePoint {
                concurrency: mv.concurrency,
                aggregate_tok_s: mv.fitted_tok_s,
            })
            .collect(),
    )
    .aggregate_tok_s(concurrency)
}

/// Each point's decode aggregate: the measured figure of a pure-decode point, the closed-loop
/// figure with its prompts' prefill subtracted ([`ClosedLoop::decode_aggregate`]) otherwise.
fn decode_values(points: &[Obs], subtract: Option<&StepModel>) -> Result<Vec<f64>, InputError> {
    points
        .iter()
        .map(|p| match (&p.closed_loop, subtract) {
            // a derived figure is written to 0.001 tok/s, like a pooled mean
            (Some(row), Some(model)) => row
                .decode_aggregate(model)
                .map(|a| round_to(a, 1e3))
                .map_err(|msg| {
                    InputError::new(&p.at.file, &p.at.field, msg)
                        .at(p.at.line, p.at.column)
                        .valid(
                            "a closed-loop row whose prompts' prefill leaves time to decode: \
                         check prefill_tok_s (--prefill-tok-s) and the row's prompt and \
                         output lengths, or pass --pure-decode if the rows are pure-decode \
                         measurements",
                        )
                }),
            _ => Ok(p.aggregate_tok_s),
        })
        .collect()
}

/// Rounds that bring `--mixed-step`'s overlap and the closed-loop rows' subtraction to agree at
/// most (each round moves the overlap by a small fraction of the last move: the rows' prefill
/// is a small share of their time).
const OVERLAP_ROUNDS: usize = 200;

fn build(
    source: FitSource,
    mut m: Measured,
    sweep: Option<Measured>,
    opts: &FitOptions,
) -> Result<FittedProfile, InputError> {
    let mut fitted_notes: Vec<String> = Vec::new();
    let mut extrapolated: Vec<String> = Vec::new();
    let chunk = DEFAULT_PREFILL_CHUNK_TOKENS;
    let closed_rows = m.points.iter().filter(|p| p.closed_loop.is_some()).count();
    let subtract = closed_rows > 0 && !opts.pure_decode;

    // Prefill first: the subtraction needs it. A prefill speed guessed from the decode curve
    // would be guessed from the very figures it corrects, so the subtraction needs a measured
    // or given one.
    let mut prefill_note = None;
    let prefill_given = match (opts.prefill_tok_s, m.prefill) {
        (Some(p), _) => {
            rule::positive(p)
                .map_err(|v| flag_error("--prefill-tok-s", not_valid(&v), v.expected))?;
            extrapolated.push("prefill_tok_s (from --prefill-tok-s)".to_string());
            Some(p)
        }
        (None, Some((p, how))) => {
            prefill_note = Some(how);
            Some(round_to(p, 10.0))
        }
        (None, None) => None,
    };
    if subtract && prefill_given.is_none() {
        return Err(flag_error(
            "--prefill-tok-s",
            format!(
                "{closed_rows} closed-loop row(s) count their prompts' prefill in their output \
                 tok/s, and nothing measured the prefill speed to subtract it with"
            ),
            "--prefill-tok-s F, a max_concurrency 1 run (vllm-bench) or a prefill_tok_s \
             column (csv); or --pure-decode if the rows are pure-decode measurements",
        ));
    }
    let prefill_tok_s = match prefill_given {
        Some(p) => p,
        None => {
            // nothing to subtract: the measured values are the decode curve
            let (points, raw): (Vec<Obs>, Vec<f64>) = match &sweep {
                Some(sw) => (
                    sw.points.clone(),
                    sw.points.iter().map(|p| p.aggregate_tok_s).collect(),
                ),
                None => {
                    let raw: Vec<f64> = m.points.iter().map(|p| p.aggregate_tok_s).collect();
                    (pooled_points(&m.points), pooled_values(&m.points, &raw))
                }
            };
            extrapolated.push(format!(
                "prefill_tok_s (not measured: {DEFAULT_PREFILL_PER_DECODE} x the single-sequence \
                 decode speed; pass --prefill-tok-s)"
            ));
            round_to(
                DEFAULT_PREFILL_PER_DECODE * curve_of(&monotone_points(&points, &raw), 1.0),
                10.0,
            )
        }
    };

    // The overlap: given, fitted to one mixed step, or routelab's default.
    let model_with = |overlap: f64| StepModel {
        prefill_tok_s,
        prefill_chunk_tokens: chunk,
        prefill_overlap: overlap,
    };
    // The curve's points: the pure-decode sweep's when one is given (the closed-loop rows then
    // fit the overlap only), else the measured points with rows of one concurrency pooled.
    let (curve_points, sweep_values): (Vec<Obs>, Option<Vec<f64>>) = match &sweep {
        Some(sw) => (
            sw.points.clone(),
            Some(sw.points.iter().map(|p| p.aggregate_tok_s).collect()),
        ),
        None => (pooled_points(&m.points), None),
    };
    let values_with = |overlap: f64| -> Result<Vec<f64>, InputError> {
        match &sweep_values {
            Some(v) => Ok(v.clone()),
            None => {
                let v = decode_values(&m.points, subtract.then(|| model_with(overlap)).as_ref())?;
                Ok(pooled_values(&m.points, &v))
            }
        }
    };
    let mut overlap_fit: Option<OverlapFit> = None;
    let (overlap, overlap_note) = match (opts.prefill_overlap, opts.mixed_step) {
        (Some(_), Some(_)) => {
            return Err(flag_error(
                "--prefill-overlap",
                "given with --mixed-step, which fits the overlap",
                "one of --prefill-overlap F and --mixed-step N:PROMPT_TOKENS:STEP_MS",
            ));
        }
        (Some(o), None) => {
            rule::fraction(o).map_err(|v| {
                flag_error(
                    "--prefill-overlap",
                    not_valid(&v),
                    format!(
                        "{}: the share of a mixed step's shorter part hidden under the longer \
                         (0 = additive, 1 = a prefill under the decode adds nothing)",
                        v.expected
                    ),
                )
            })?;
            (o, "prefill_overlap (from --prefill-overlap)".to_string())
        }
        (None, Some(step)) => {
            let mut overlap = DEFAULT_PREFILL_OVERLAP;
            let mut settled = false;
            for _ in 0..OVERLAP_ROUNDS {
                let values = values_with(overlap)?;
                let moves = monotone_points(&curve_points, &values);
                let next = step
                    .overlap(curve_of(&moves, f64::from(step.decoding)), prefill_tok_s)
                    .map_err(|msg| {
                        flag_error(
                            MixedStep::FLAG,
                            msg,
                            "a step measured with N sequences decoding beside PROMPT_TOKENS \
                             prompt tokens, between the longer part alone and the two added \
                             (the decode part from the fitted curve at N, the prefill part \
                             from prefill_tok_s)",
                        )
                    })?;
                let moved = (next - overlap).abs();
                overlap = next;
                if moved < 1e-12 {
                    settled = true;
                    break;
                }
            }
            if !settled {
                return Err(flag_error(
                    MixedStep::FLAG,
                    format!(
                        "the mixed step and the closed-loop rows do not settle on one overlap \
                         in {OVERLAP_ROUNDS} rounds (last {overlap:.6})"
                    ),
                    "a mixed step measured where the rows' prefill is a small share of their \
                     time, or --prefill-overlap F",
                ));
            }
            // written to 4 decimals, and the subtraction below uses what is written
            let overlap = (overlap * 1e4).round() / 1e4;
            let d_s = f64::from(step.decoding)
                / curve_of(
                    &monotone_points(&curve_points, &values_with(overlap)?),
                    f64::from(step.decoding),
                );
            (
                overlap,
                format!(
                    "prefill_overlap {overlap} from one mixed step (--mixed-step): {} sequences \
                     decoding ({:.3} ms alone, from the fitted curve) beside {} prompt tokens \
                     ({:.3} ms alone at prefill_tok_s) took {:.3} ms",
                    step.decoding,
                    d_s * 1e3,
                    step.prompt_tokens,
                    f64::from(step.prompt_tokens) / prefill_tok_s * 1e3,
                    step.step_s * 1e3
                ),
            )
        }
        (None, None) => {
            let groups = curve_points.len() < m.points.len();
            let inferred = if subtract && (sweep.is_some() || groups) {
                overlap_from_rows(&m.points, &curve_points, &sweep_values, &model_with(0.0))
            } else {
                None
            };
            match inferred {
                Some(of) => {
                    let value = (of.value * 1e4).round() / 1e4;
                    let per_row: Vec<String> = of
                        .per_row
                        .iter()
                        .map(|(c, o)| format!("{c}: {o:.3}"))
                        .collect();
                    let note = format!(
                        "prefill_overlap {value}{} fitted to {} closed-loop rows against {}: \
                         the overlap whose prefill subtraction brings their decode aggregates \
                         to agree, in least squares of the log ratios (each row alone, by \
                         concurrency: {})",
                        of.std_error
                            .map(|e| format!(" ± {e:.3} (jackknife standard error)"))
                            .unwrap_or_default(),
                        of.per_row.len(),
                        of.against,
                        per_row.join(", ")
                    );
                    overlap_fit = Some(OverlapFit { value, ..of });
                    (value, note)
                }
                None if sweep.is_some() => {
                    return Err(flag_error(
                        "--decode-sweep",
                        "the closed-loop rows cannot pin prefill_overlap: in none of them does \
                         a prefill run beside decodes under the step model (one client, or \
                         every loop's prompts fit one prefill step), so no overlap changes \
                         their decode aggregate",
                        format!(
                            "closed loops at concurrency >= 2 whose clients' prompts together \
                             exceed the prefill chunk ({chunk} tokens), or --prefill-overlap F"
                        ),
                    ));
                }
                None => {
                    extrapolated.push(format!(
                        "prefill_overlap (not measured: routelab's default \
                         {DEFAULT_PREFILL_OVERLAP}, fitted to the one published mixed step; \
                         pass --mixed-step, --prefill-overlap, or --decode-sweep with the \
                         closed-loop rows)"
                    ));
                    (DEFAULT_PREFILL_OVERLAP, String::new())
                }
            }
        }
    };

    let values = values_with(overlap)?;
    let moves = monotone_points(&curve_points, &values);
    let curve_at = |c: f64| curve_of(&moves, c);

    let moved: Vec<(usize, &PointMove)> = moves
        .iter()
        .enumerate()
        .filter(|(_, mv)| mv.fitted_tok_s != mv.measured_tok_s)
        .collect();
    let largest = moves
        .iter()
        .map(|mv| mv.relative().abs())
        .fold(0.0f64, f64::max);
    // Which decode figures these are, first: the one thing a reader must know about the curve.
    if let Some(sw) = &sweep {
        fitted_notes.push(format!(
            "decode aggregate from the pure-decode sweep (--decode-sweep, {} rows): taken as \
             measured; the closed-loop rows fit prefill_overlap and are simulated back (below)",
            sw.points.len()
        ));
    }
    if subtract {
        fitted_notes.push(format!(
            "decode aggregate with the prompts' prefill subtracted: each closed-loop row's \
             output tok/s X at concurrency C, with P prompt and N output tokens per request, \
             holds X (N - 1) / N decode tokens/s (the first token of a request comes with its \
             prefill's step) and X P / N prompt tokens/s, prefilled in steps of min({chunk}, C P) \
             tokens (the loop's prompts bunched as it started them) beside the decodes of the \
             sequences not prefilling; the decode-only time is what is left of each \
             second once every prefill step's added time under the step model (prefill_tok_s \
             {prefill_tok_s}, prefill_overlap {overlap}) is taken out (see docs/profiles.md, \
             \"The step-time model\")"
        ));
        let row_values = decode_values(&m.points, Some(&model_with(overlap)))?;
        for (p, v) in m.points.iter().zip(&row_values) {
            if let Some(row) = &p.closed_loop {
                fitted_notes.push(format!(
                    "decode aggregate at concurrency {}: closed-loop {} tok/s (P = {}, N = {}) \
                     -> {} tok/s decode only ({:+.2} %)",
                    p.concurrency,
                    row.output_tok_s,
                    row.prompt_tokens,
                    row.output_tokens,
                    round_to(*v, 1e3),
                    (v / row.output_tok_s - 1.0) * 100.0
                ));
            }
        }
    } else if closed_rows > 0 || opts.pure_decode {
        fitted_notes.push(
            "decode aggregate from pure-decode rows (--pure-decode): each row's output tok/s \
             is taken as the decode aggregate, nothing subtracted"
                .to_string(),
        );
    } else if source == FitSource::Gateway {
        fitted_notes.push(
            "decode aggregate as the gateway measured it, prefill not subtracted: output tokens \
             / time at each observed concurrency, which holds the time prefill steps added \
             beside the decodes (the capacity file records no prompt lengths to subtract it with)"
                .to_string(),
        );
    } else {
        fitted_notes.push(
            "decode aggregate from pure-decode rows: the rows give no mean_prompt_tokens and \
             mean_output_tokens, so each aggregate_tok_s is taken as measured with nothing \
             prefilling beside it"
                .to_string(),
        );
    }
    fitted_notes.push(format!(
        "decode.points: the decode aggregates made non-decreasing in concurrency, with a \
         per-request speed that does not rise, by weighted least squares (pool-adjacent-violators \
         alternated, Dykstra) weighted by {}; {} of {} points moved, the largest by {:.2} %",
        m.weight_name,
        moved.len(),
        moves.len(),
        largest * 100.0
    ));
    for (i, mv) in &moved {
        fitted_notes.push(format!(
            "decode.points[{i}] (concurrency {}): decode aggregate {} tok/s, fitted {} tok/s \
             ({:+.2} %)",
            mv.concurrency,
            round_to(mv.measured_tok_s, 1e3),
            mv.fitted_tok_s,
            mv.relative() * 100.0
        ));
    }
    fitted_notes.extend(m.notes);
    fitted_notes.extend(prefill_note);
    if !overlap_note.is_empty() {
        if opts.mixed_step.is_some() || overlap_fit.is_some() {
            fitted_notes.push(overlap_note);
        } else {
            extrapolated.push(overlap_note);
        }
    }
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
    if let Some(g) = &opts.gpu_names {
        m.gpu_names.clone_from(g);
        m.sources.push("gpu_names from --gpu-names".to_string());
    }
    if let Some(sw) = &sweep {
        m.sources
            .extend(sw.sources.iter().map(|s| format!("{s} (--decode-sweep)")));
    }
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
    let _ = writeln!(y, "prefill_chunk_tokens: {chunk}");
    let _ = writeln!(y, "prefill_overlap: {overlap}");
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
    let errors = point_errors(&profile, &m.points, sweep.as_ref(), opts.pure_decode);
    let warnings = warnings(&profile, &m.points, &moves, &errors, opts);
    Ok(FittedProfile {
        profile,
        yaml: y,
        moves,
        errors,
        warnings,
        overlap_fit,
    })
}

/// The closed-loop rows of `points` that can say something about the overlap, held against the
/// sweep's curve when there is one (`sweep_values` for `curve_points`), else against the other
/// rows of their concurrency; the fitted overlap ([`infer_overlap`]).
fn overlap_from_rows(
    points: &[Obs],
    curve_points: &[Obs],
    sweep_values: &Option<Vec<f64>>,
    model: &StepModel,
) -> Option<OverlapFit> {
    let sweep_moves = sweep_values
        .as_ref()
        .map(|v| monotone_points(curve_points, v));
    let mut group = 0usize;
    let mut last_c = None;
    let mut rows = Vec::new();
    for p in points {
        if last_c.is_some_and(|c| c != p.concurrency) {
            group += 1;
        }
        last_c = Some(p.concurrency);
        let Some(row) = p.closed_loop else { continue };
        if !informative(&row, model) {
            continue;
        }
        rows.push(OverlapRow {
            row,
            weight: p.weight,
            reference: sweep_moves.as_ref().map(|mv| curve_of(mv, p.concurrency)),
            group,
        });
    }
    infer_overlap(&rows, model)
}

/// Every input point against the fitted profile: a closed loop simulated on the fluid engine
/// (unless the rows were declared pure decode), a pure-decode point read off the curve.
fn point_errors(
    profile: &HardwareProfile,
    points: &[Obs],
    sweep: Option<&Measured>,
    pure_decode: bool,
) -> Vec<PointError> {
    let label = |p: &Obs| match p.at.line {
        Some(l) => format!("{}:{l}", p.at.file),
        None => p.at.file.clone(),
    };
    let decode_point = |p: &Obs| PointError {
        source: label(p),
        concurrency: p.concurrency,
        what: "decode aggregate tok/s",
        measured: p.aggregate_tok_s,
        fitted: profile.aggregate_tok_s(p.concurrency),
    };
    let mut out: Vec<PointError> = points
        .iter()
        .map(|p| match (&p.closed_loop, pure_decode) {
            (Some(row), false) => {
                let sim = simulate_closed_loop(
                    crate::worker::EngineMode::Fluid,
                    profile,
                    (row.concurrency.round() as u32).max(1),
                    p.rounds.clamp(1, SIMULATED_ROUNDS_MAX),
                    (row.prompt_tokens.round() as u32).max(1),
                    (row.output_tokens.round() as u32).max(2),
                );
                PointError {
                    source: label(p),
                    concurrency: p.concurrency,
                    what: "closed-loop output tok/s",
                    measured: row.output_tok_s,
                    fitted: sim.output_tok_s,
                }
            }
            _ => decode_point(p),
        })
        .collect();
    if let Some(sw) = sweep {
        out.extend(sw.points.iter().map(decode_point));
    }
    out
}

/// The warnings a careful reader needs, each with its threshold.
fn warnings(
    profile: &HardwareProfile,
    points: &[Obs],
    moves: &[PointMove],
    errors: &[PointError],
    opts: &FitOptions,
) -> Vec<String> {
    let mut w = Vec::new();
    for (i, mv) in moves.iter().enumerate() {
        if mv.relative().abs() > CORRECTION_WARN {
            w.push(format!(
                "decode.points[{i}] (concurrency {}) was corrected by {:+.0} % ({} -> {} tok/s), \
                 more than {:.0} %: the measurement breaks the curve's rules (the aggregate may \
                 not fall as concurrency grows, nor the per-request speed rise); re-measure \
                 that concurrency or leave it out",
                mv.concurrency,
                mv.relative() * 100.0,
                round_to(mv.measured_tok_s, 1e3),
                mv.fitted_tok_s,
                CORRECTION_WARN * 100.0
            ));
        }
    }
    for e in errors {
        if e.relative().abs() > SIMULATED_ERROR_WARN {
            w.push(format!(
                "{} (concurrency {}): the fitted profile gives {:.2} {} where {:.2} was \
                 measured ({:+.1} %, more than {:.0} %)",
                e.source,
                e.concurrency,
                e.fitted,
                e.what,
                e.measured,
                e.relative() * 100.0,
                SIMULATED_ERROR_WARN * 100.0
            ));
        }
    }
    let held = points
        .iter()
        .filter_map(|p| p.closed_loop)
        .map(|r| {
            (
                r.concurrency,
                r.concurrency * (r.prompt_tokens + r.output_tokens),
            )
        })
        .fold(None::<(f64, f64)>, |m, x| match m {
            Some(m) if m.1 >= x.1 => Some(m),
            _ => Some(x),
        });
    if let Some((c, tokens)) = held
        && tokens > profile.kv_capacity_tokens() as f64
    {
        w.push(format!(
            "kv_capacity_tokens {} cannot hold the measured concurrency: {c} requests of \
             prompt + output tokens need {tokens:.0} tokens of KV at once, which the engine \
             held; pass the engine's KV size with --kv-capacity-tokens",
            profile.kv_capacity_tokens()
        ));
    }
    let top = points.iter().map(|p| p.concurrency).fold(0.0f64, f64::max);
    if top > f64::from(profile.max_running()) {
        w.push(format!(
            "max_running {} is below the measured concurrency {top}: the simulated engine \
             queues what the measured one ran at once; pass the engine's limit with \
             --max-running (llama.cpp --parallel, vLLM --max-num-seqs)",
            profile.max_running()
        ));
    }
    if opts.prefill_tok_s.is_none() {
        let ratio = profile.prefill_tok_s() / profile.aggregate_tok_s(1.0);
        if ratio > PREFILL_PER_DECODE_MAX {
            w.push(format!(
                "prefill_tok_s {} is {ratio:.0} x the single-sequence decode speed (more than \
                 {PREFILL_PER_DECODE_MAX:.0} x; the bundled profiles sit at 10-90 x): is the \
                 TTFT it was derived from (mean_ttft_ms) in seconds rather than milliseconds?",
                profile.prefill_tok_s()
            ));
        } else if ratio < PREFILL_PER_DECODE_MIN {
            w.push(format!(
                "prefill_tok_s {} is {ratio:.2} x the single-sequence decode speed (less than \
                 {PREFILL_PER_DECODE_MIN} x: prefill batches a prompt's tokens, decode runs one \
                 a step): is the TTFT it was derived from in milliseconds declared as seconds, \
                 or does it hold a long queue?",
                profile.prefill_tok_s()
            ));
        }
    }
    w
}

// ---------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------

fn read_csv(input: &FitInput) -> Result<Measured, InputError> {
    let file = input.origin.as_str();
    let valid_header = "a header row `concurrency,aggregate_tok_s` (optional columns \
                        prefill_tok_s, cold_burst_tok_s, mean_prompt_tokens, \
                        mean_output_tokens), then one row per concurrency";
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(input.text.as_bytes());
    let header = rd
        .headers()
        .map_err(|e| InputError::new(file, "", format!("unreadable CSV: {e}")).at(Some(1), None))?
        .clone();
    let mut col = [None; CSV_COLUMNS.len()];
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
        let closed_loop = match (cell(4)?, cell(5)?) {
            (Some(prompt_tokens), Some(output_tokens)) => Some(ClosedLoop {
                concurrency: c,
                output_tok_s: a,
                prompt_tokens,
                output_tokens,
            }),
            (None, None) => None,
            (prompt, _) => {
                let missing = if prompt.is_some() {
                    "mean_output_tokens"
                } else {
                    "mean_prompt_tokens"
                };
                return Err(at(
                    missing,
                    format!(
                        "no {missing}: a closed-loop row needs both its mean prompt and mean output tokens"
                    ),
                    "both mean_prompt_tokens and mean_output_tokens (a closed-loop result), or \
                     neither (a pure-decode measurement)",
                ));
            }
        };
        m.points.push(Obs {
            concurrency: c,
            aggregate_tok_s: a,
            weight: 1.0,
            closed_loop,
            rounds: 20,
            at: RowAt {
                file: file.to_string(),
                field: "aggregate_tok_s".into(),
                line: u32::try_from(line).ok(),
                column: None,
            },
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
    if m.points.iter().any(|p| p.closed_loop.is_some()) {
        read.extend(["mean_prompt_tokens", "mean_output_tokens"]);
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

/// Two runs at one concurrency are the same benchmark unless their mean prompt or output
/// lengths differ by more than this share.
const SAME_LENGTH_SHARE: f64 = 0.05;

/// The fields of a `vllm bench serve --save-result` file that the fit reads.
pub const VLLM_FIELDS: [&str; 7] = [
    "max_concurrency",
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "mean_ttft_ms",
];

struct BenchRun {
    origin: String,
    concurrency: f64,
    completed: f64,
    duration_s: f64,
    total_input_tokens: f64,
    total_output_tokens: f64,
    output_tok_s: f64,
    mean_ttft_ms: f64,
    /// Where `output_throughput` is, for errors about the point.
    at: RowAt,
}

fn read_vllm_one(input: &FitInput) -> Result<BenchRun, InputError> {
    let what = "the JSON object `vllm bench serve --save-result` writes (max_concurrency, \
                completed, duration, total_input_tokens, total_output_tokens, output_throughput, \
                mean_ttft_ms, ...)";
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
        total_output_tokens: positive("total_output_tokens")?,
        output_tok_s: positive("output_throughput")?,
        mean_ttft_ms: positive("mean_ttft_ms")?,
        at: {
            let (line, column) = key_position(&input.text, "output_throughput");
            RowAt {
                file: origin.to_string(),
                field: "output_throughput".into(),
                line,
                column,
            }
        },
    })
}

fn read_vllm(inputs: &[FitInput]) -> Result<Measured, InputError> {
    let mut runs = inputs
        .iter()
        .map(read_vllm_one)
        .collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
    let lengths = |r: &BenchRun| {
        (
            r.total_input_tokens / r.completed,
            r.total_output_tokens / r.completed,
        )
    };
    let differ = |a: f64, b: f64| (a / b - 1.0).abs() > SAME_LENGTH_SHARE;
    for w in runs.windows(2) {
        let ((p0, n0), (p1, n1)) = (lengths(&w[0]), lengths(&w[1]));
        if w[0].concurrency == w[1].concurrency && !differ(p0, p1) && !differ(n0, n1) {
            return Err(InputError::new(
                &w[1].origin,
                "max_concurrency",
                format!(
                    "max_concurrency {} is also the one of {}",
                    w[1].concurrency, w[0].origin
                ),
            )
            .valid(
                "one file per --max-concurrency value, or runs at one concurrency whose mean \
                 prompt or output lengths differ by more than 5 % (they fit prefill_overlap)",
            ));
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
            // a --max-concurrency run is a closed loop: its output throughput holds the time
            // its prompts were prefilled
            closed_loop: Some(ClosedLoop {
                concurrency: r.concurrency,
                output_tok_s: r.output_tok_s,
                prompt_tokens: r.total_input_tokens / r.completed,
                output_tokens: r.total_output_tokens / r.completed,
            }),
            rounds: ((r.completed / r.concurrency).round() as u32).max(1),
            at: r.at.clone(),
        });
        m.sources.push(format!(
            "{} (vllm bench serve --save-result): max_concurrency {}, output_throughput, \
             duration, completed, total_input_tokens, total_output_tokens, mean_ttft_ms",
            r.origin, r.concurrency
        ));
    }
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
        let (line, column) = key_position(&input.text, "points");
        m.points.push(Obs {
            concurrency: num("concurrency")?,
            aggregate_tok_s: num("aggregate_tok_s")?,
            weight: num("observed_s")?,
            closed_loop: None,
            rounds: 1,
            at: RowAt {
                file: origin.to_string(),
                field: format!("{wf}.points[{i}].aggregate_tok_s"),
                line,
                column,
            },
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
        // the first note says what the decode figures are
        assert!(
            p.fitted()[0].starts_with("decode aggregate from pure-decode rows: the rows give no"),
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

    /// Requests of 500 prompt and 101 output tokens at one request a second: 101 output tok/s,
    /// of which 100 from decode steps; their prefill alone, at 5,000 tok/s, takes 0.1 s of
    /// every second (q).
    fn loop_at(concurrency: f64) -> ClosedLoop {
        ClosedLoop {
            concurrency,
            output_tok_s: 101.0,
            prompt_tokens: 500.0,
            output_tokens: 101.0,
        }
    }

    fn model(overlap: f64) -> StepModel {
        StepModel {
            prefill_tok_s: 5000.0,
            prefill_chunk_tokens: 512,
            prefill_overlap: overlap,
        }
    }

    fn close(got: f64, want: f64) -> bool {
        (got / want - 1.0).abs() < 1e-12
    }

    #[test]
    fn one_client_subtracts_its_whole_prefill() {
        // nothing decodes beside the prompt: 0.9 s of decode for 100 tokens, whatever overlap
        for o in [0.0, 0.4, 1.0] {
            let a = loop_at(1.0).decode_aggregate(&model(o)).unwrap();
            assert!(close(a, 100.0 / 0.9), "overlap {o}: {a}");
        }
    }

    #[test]
    fn a_prefill_under_the_decode_hides_its_overlap() {
        // 16 clients: each 512-token prefill step (102.4 ms alone) runs beside ~15 decodes
        // (~140 ms alone), the decode-bound side: delta = 1 - (1 - overlap) q
        for (o, delta) in [(0.0, 0.9), (0.4, 0.94), (1.0, 1.0)] {
            let a = loop_at(16.0).decode_aggregate(&model(o)).unwrap();
            assert!(
                close(a, 100.0 / delta),
                "overlap {o}: {a}, want {}",
                100.0 / delta
            );
        }
    }

    #[test]
    fn a_prefill_longer_than_its_decode_hides_the_decode() {
        // 2 clients: the 102.4 ms prefill step beside one decode of ~9 ms is prefill-bound; it
        // adds p - overlap d: 1 = delta + q - overlap m b delta / D, so
        // delta = (1 - q) / (1 - overlap m b / D)
        let o = 0.4;
        let m = 500.0 / 512.0; // prefill steps a second, 512 tokens each
        let b = 2.0 - 512.0 / 500.0; // sequences decoding beside them
        let delta = 0.9 / (1.0 - o * m * b / 100.0);
        let a = loop_at(2.0).decode_aggregate(&model(o)).unwrap();
        assert!(close(a, 100.0 / delta), "{a} vs {}", 100.0 / delta);
        // and the step the solution implies is the step model's own
        let d = b * delta / 100.0;
        let p = 512.0 / 5000.0;
        assert!(d < p);
        let second = delta + m * (mixed_step_s(d, p, o) - d);
        assert!((second - 1.0).abs() < 1e-12, "{second}");
    }

    #[test]
    fn impossible_closed_loops_are_refused() {
        let one_token = ClosedLoop {
            output_tokens: 1.0,
            ..loop_at(4.0)
        };
        let e = one_token.decode_aggregate(&model(0.4)).unwrap_err();
        assert!(e.contains("no decode step"), "{e}");
        // 101 tok/s of 500-token prompts need 500 prompt tok/s: more than a 400 tok/s prefill
        let slow = StepModel {
            prefill_tok_s: 400.0,
            ..model(0.4)
        };
        let e = loop_at(4.0).decode_aggregate(&slow).unwrap_err();
        assert!(e.contains("leave no time to decode"), "{e}");
        let e = ClosedLoop {
            output_tok_s: f64::NAN,
            ..loop_at(4.0)
        }
        .decode_aggregate(&model(0.4))
        .unwrap_err();
        assert!(e.contains("output tok/s = NaN"), "{e}");
    }

    #[test]
    fn mixed_steps_parse_or_say_what_is_valid() {
        let m = MixedStep::parse(" 256 : 539 : 16.3 ").unwrap();
        assert_eq!((m.decoding, m.prompt_tokens), (256, 539));
        assert!((m.step_s - 0.0163).abs() < 1e-15, "{m:?}");
        for (text, says) in [
            ("256:539", "not three numbers"),
            ("256:539:16.3:1", "not three numbers"),
            ("a:539:16.3", "N `a` is not a number"),
            ("0:539:16.3", "N: 0 is not valid"),
            ("256:5.5:16.3", "PROMPT_TOKENS: 5.5 is not valid"),
            ("256:539:-1", "STEP_MS: -1 is not valid"),
            ("256:539:inf", "STEP_MS: inf is not valid"),
        ] {
            let e = MixedStep::parse(text).unwrap_err();
            assert_eq!(
                (e.file.as_str(), e.field.as_str()),
                ("<command line>", "--mixed-step"),
                "{e}"
            );
            assert!(e.message.contains(says), "{text}: {e}");
            assert!(
                e.valid
                    .as_deref()
                    .is_some_and(|v| v.contains("N:PROMPT_TOKENS:STEP_MS")),
                "{e}"
            );
        }
    }

    /// Pure-decode rows (100 tok/s at 1 -> 10 ms, 800 at 16 -> 20 ms steps) and a 2,000 tok/s
    /// prefill: one mixed step of 16 beside 100 prompt tokens (50 ms alone) fits the overlap.
    const PURE: &str = "concurrency,aggregate_tok_s,prefill_tok_s\n1,100,2000\n16,800,\n";

    #[test]
    fn a_mixed_step_fits_and_writes_the_overlap() {
        let step = MixedStep {
            decoding: 16,
            prompt_tokens: 100,
            step_s: mixed_step_s(0.020, 0.050, 0.25),
        };
        let f = fit(
            FitSource::Csv,
            &[csv(PURE)],
            &FitOptions {
                mixed_step: Some(step),
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(f.profile.prefill_overlap(), 0.25);
        assert!(f.yaml.contains("prefill_overlap: 0.25\n"), "{}", f.yaml);
        assert!(
            f.profile
                .fitted()
                .iter()
                .any(|n| n.starts_with("prefill_overlap 0.25 from one mixed step")),
            "{:?}",
            f.profile.fitted()
        );
        // no closed-loop row: nothing was subtracted, and nothing says it was
        assert!(
            !f.profile
                .fitted()
                .iter()
                .any(|n| n.contains("prefill subtracted"))
        );
    }

    #[test]
    fn bad_overlaps_and_steps_are_located() {
        let input = [csv(PURE)];
        let refused = |o: FitOptions| fit(FitSource::Csv, &input, &o).unwrap_err();
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = refused(FitOptions {
                prefill_overlap: Some(bad),
                ..opts()
            });
            assert_eq!(e.field, "--prefill-overlap", "{e}");
            assert!(
                e.valid
                    .as_deref()
                    .is_some_and(|v| v.contains("from 0 to 1")),
                "{e}"
            );
        }
        // a step shorter than its decode alone (20 ms), and one longer than both added (70 ms)
        for ms in [15.0, 80.0] {
            let e = refused(FitOptions {
                mixed_step: Some(MixedStep {
                    decoding: 16,
                    prompt_tokens: 100,
                    step_s: ms / 1e3,
                }),
                ..opts()
            });
            assert_eq!(e.field, "--mixed-step", "{e}");
            assert!(
                e.message.contains("cannot carry a decode of 20.000 ms"),
                "{e}"
            );
        }
        let e = refused(FitOptions {
            prefill_overlap: Some(0.5),
            mixed_step: MixedStep::parse("16:100:60").ok(),
            ..opts()
        });
        assert!(e.message.contains("given with --mixed-step"), "{e}");
    }

    #[test]
    fn closed_loop_rows_need_a_prefill_speed_and_room_to_decode() {
        let no_prefill = csv(
            "concurrency,aggregate_tok_s,mean_prompt_tokens,mean_output_tokens\n1,100,500,101\n",
        );
        let e = fit(FitSource::Csv, std::slice::from_ref(&no_prefill), &opts()).unwrap_err();
        assert_eq!(e.field, "--prefill-tok-s", "{e}");
        assert!(
            e.valid
                .as_deref()
                .is_some_and(|v| v.contains("--pure-decode")),
            "{e}"
        );
        // taken as pure decode when the user says so
        let f = fit(
            FitSource::Csv,
            &[no_prefill],
            &FitOptions {
                pure_decode: true,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(f.profile.aggregate_tok_s(1.0), 100.0);
        // a row whose prompts alone would take longer than the run: file, line and field
        let e = fit(
            FitSource::Csv,
            &[csv(
                "concurrency,aggregate_tok_s,prefill_tok_s,mean_prompt_tokens,mean_output_tokens\n\
                 1,100,5000,500,101\n4,2000,,500,101\n",
            )],
            &opts(),
        )
        .unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str(), e.line),
            ("m.csv", "aggregate_tok_s", Some(3)),
            "{e}"
        );
        assert!(e.message.contains("leave no time to decode"), "{e}");
    }

    #[test]
    fn the_decode_shape_keeps_both_rules() {
        // already shaped: unchanged
        let c = [1.0, 2.0, 4.0, 8.0];
        let ok = [60.0, 110.0, 200.0, 320.0];
        assert_eq!(decode_shape(&ok, &c, &[1.0; 4]), ok.to_vec());
        // a per-request speed that rises (35 at 2, then 50 at 4): pooled until it does not
        let out = decode_shape(&[60.0, 70.0, 200.0, 320.0], &c, &[1.0; 4]);
        for i in 1..out.len() {
            assert!(out[i] >= out[i - 1] - 1e-9, "{out:?}");
            assert!(out[i] / c[i] <= out[i - 1] / c[i - 1] + 1e-9, "{out:?}");
        }
        // and it is the closest such curve: no shaped neighbour is nearer
        let err = |v: &[f64]| -> f64 {
            v.iter()
                .zip([60.0, 70.0, 200.0, 320.0])
                .map(|(a, b)| (a - b) * (a - b))
                .sum()
        };
        let pooled_speed = [60.0, 2.0 * 45.0, 4.0 * 45.0, 320.0];
        assert!(err(&out) <= err(&pooled_speed) + 1e-9, "{out:?}");
    }

    #[test]
    fn key_positions_are_one_based() {
        assert_eq!(key_position("{\n  \"a\": 1\n}", "a"), (Some(2), Some(3)));
        assert_eq!(key_position("{}", "a"), (None, None));
    }
}
