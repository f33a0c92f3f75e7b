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

use std::path::Path;

use routelab_policies::located::{InputError, rule};

use super::HardwareProfile;
use super::fit_check::{OverlapFit, PointError};

mod build;
mod closed_loop;
mod context;
mod curve;
mod json;
mod overlap;
mod read_csv;
mod read_gateway;
mod read_vllm;
mod report;
mod simulated;
mod write;

pub use closed_loop::{ClosedLoop, ClosedLoopError, MixedStep, StepModel};
pub use curve::{decode_shape, isotonic};
pub use read_vllm::VLLM_FIELDS;

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
/// `mean_context_tokens` belongs to a `--decode-sweep` only: the tokens each decoding sequence
/// attended to on average while the row was measured (its prompt plus half its output), so that
/// rows at two contexts fit the profile's `kv_read_s_per_ktok` (`context.rs`).
pub const CSV_COLUMNS: [&str; 7] = [
    "concurrency",
    "aggregate_tok_s",
    "prefill_tok_s",
    "cold_burst_tok_s",
    "mean_prompt_tokens",
    "mean_output_tokens",
    "mean_context_tokens",
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
    /// The engine's prompt-token budget per step (`--chunk-tokens`: vLLM's
    /// `max_num_batched_tokens`, llama.cpp's `--batch-size`); routelab's default
    /// ([`super::DEFAULT_PREFILL_CHUNK_TOKENS`], listed as extrapolated) when not given.
    pub chunk_tokens: Option<u32>,
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
    /// The overlap the step model's subtraction alone gave, when simulating the calibration
    /// loops replaced it (`simulated.rs`).
    pub analytic_overlap: Option<f64>,
}

/// `x` to the nearest `1 / per_unit`, never below it (a profile's figures are > 0). Dividing
/// by the whole `per_unit` gives the shortest decimal, so the YAML stays readable.
fn round_to(x: f64, per_unit: f64) -> f64 {
    ((x * per_unit).round() / per_unit).max(1.0 / per_unit)
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
    /// The tokens each decoding sequence attended to on average (a sweep's
    /// `mean_context_tokens`), when the row says.
    context_tokens: Option<f64>,
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
            let m = read_csv::read_csv(first)?;
            if let Some(p) = m.points.iter().find(|p| p.context_tokens.is_some()) {
                return Err(InputError::new(
                    &first.origin,
                    "mean_context_tokens",
                    "a context on a measured row",
                )
                .at(p.at.line, None)
                .valid(
                    "mean_context_tokens in the --decode-sweep CSV only (its rows at a second, \
                     longer context fit kv_read_s_per_ktok)",
                ));
            }
            m
        }
        FitSource::VllmBench => read_vllm::read_vllm(inputs)?,
        FitSource::Gateway => {
            if inputs.len() > 1 {
                return Err(InputError::new(
                    &inputs[1].origin,
                    "",
                    "--from gateway reads one file",
                )
                .valid("one saved GET /admin/capacity response"));
            }
            read_gateway::read_gateway(first, opts.worker.as_deref())?
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
            let sweep = read_csv::read_csv(input)?;
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
    build::build(source, measured, sweep, opts)
}

/// The message of a broken value rule; its `expected` goes to the error's `valid`.
fn not_valid(v: &rule::Violation) -> String {
    format!("{} is not valid", v.got)
}

fn flag_error(flag: &str, message: impl Into<String>, valid: impl Into<String>) -> InputError {
    InputError::new("<command line>", flag, message).valid(valid)
}

#[cfg(test)]
mod tests;
