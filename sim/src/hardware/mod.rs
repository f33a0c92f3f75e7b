//! Hardware profiles: what one worker (card(s) + host + engine + launch arguments + model)
//! can do, as read from `scenarios/hardware/*.yaml`.
//!
//! - [`lookup`]: where a scenario's `profile:` is found ([`ProfileLookup`]: a path, or a name
//!   in the scenario's directories, the profiles bundled into the binary, `ROUTELAB_HARDWARE`).
//! - [`fit`]: a profile fitted from measurements (a CSV, `vllm bench serve` results, the
//!   gateway's `/admin/capacity`).
//!
//! Files are parsed into raw serde structs (`schema`: `deny_unknown_fields`, every number
//! wrapped in [`serde_saphyr::Spanned`] so that validation errors can point at a line and
//! column), then validated into the plain domain type [`HardwareProfile`]. `profile fit` writes
//! its profile through the same structs, so the file has one schema.
//!
//! The decode curve gives the *aggregate* output throughput (tokens/s summed over all running
//! sequences) as a function of concurrency, either from measured points (interpolated
//! piecewise-linearly, which is monotone because the points must be non-decreasing; linear from
//! the origin below the first point; flat beyond the last point) or from a parametric saturating
//! curve. Per-request speed is `aggregate(n) / n` and one engine step with `n` decoding
//! sequences takes `n / aggregate(n)` seconds.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use routelab_policies::located::{InputError, parse_yaml, rule};
use serde_saphyr::Spanned;

pub mod fit;
pub mod fit_check;
pub mod lookup;
mod schema;
pub mod step;
pub mod uncertainty;
mod unit_search;

pub use lookup::{BUNDLED, LookupError, ProfileLookup};
use schema::{RawDecode, RawPoint, RawProfile};
pub use step::{DEFAULT_PREFILL_OVERLAP, OverlapError, mixed_step_s, overlap_from_mixed_step};
pub use uncertainty::{DEFAULT_EXTRAPOLATED_UNCERTAINTY, UncertainField};

/// Default prefill chunk (vLLM's chunked-prefill token budget per step is of this order).
pub const DEFAULT_PREFILL_CHUNK_TOKENS: u32 = 512;
/// The smallest context window a profile may declare: the probe prompt must fit.
pub const MIN_CONTEXT_WINDOW: u32 = 1024;
/// The largest `kv_capacity_tokens` a profile may declare (2⁴⁰ tokens).
pub const MAX_KV_CAPACITY_TOKENS: u64 = 1 << 40;
/// The largest `max_running` a profile may declare (2²⁰ sequences).
pub const MAX_RUNNING_LIMIT: u32 = 1 << 20;

/// An error loading or validating a hardware profile: the one located error of routelab
/// ([`InputError`]), naming the file, the field path and, when known, the line and column, and
/// saying what would be valid.
pub type HardwareError = InputError;

// ---------------------------------------------------------------------------------------------
// Domain types
// ---------------------------------------------------------------------------------------------

/// One measured point of the decode curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodePoint {
    /// Number of concurrently decoding sequences (> 0).
    pub concurrency: f64,
    /// Aggregate output tokens/s over all of them.
    pub aggregate_tok_s: f64,
}

/// Aggregate decode throughput as a function of concurrency.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DecodeCurve {
    /// Measured points, strictly increasing concurrency, non-decreasing aggregate.
    /// Linear from the origin below the first point, piecewise-linear between points,
    /// flat beyond the last one.
    Points(Vec<DecodePoint>),
    /// `agg(n) = single + (saturation - single) * (n - 1) / (n - 1 + half - 1)` for `n >= 1`
    /// (`n * single` below 1): `agg(1) = single`, `agg(half)` is half-way to `saturation`,
    /// `agg(inf) = saturation`.
    Parametric {
        /// Aggregate (= per-request) tokens/s at one sequence.
        single_tok_s: f64,
        /// Asymptotic aggregate tokens/s.
        saturation_tok_s: f64,
        /// Concurrency at which the aggregate is half-way from single to saturation (> 1).
        half_concurrency: f64,
    },
}

impl DecodeCurve {
    /// Aggregate tokens/s at `concurrency` (0 for non-positive or NaN concurrency).
    pub fn aggregate_tok_s(&self, concurrency: f64) -> f64 {
        if concurrency.is_nan() || concurrency <= 0.0 {
            return 0.0;
        }
        match self {
            DecodeCurve::Points(points) => {
                let first = points[0];
                if concurrency <= first.concurrency {
                    return first.aggregate_tok_s * concurrency / first.concurrency;
                }
                // index of the first point with concurrency >= c
                let i = points.partition_point(|p| p.concurrency < concurrency);
                if i >= points.len() {
                    return points[points.len() - 1].aggregate_tok_s;
                }
                let (a, b) = (points[i - 1], points[i]);
                let t = (concurrency - a.concurrency) / (b.concurrency - a.concurrency);
                a.aggregate_tok_s + t * (b.aggregate_tok_s - a.aggregate_tok_s)
            }
            DecodeCurve::Parametric {
                single_tok_s,
                saturation_tok_s,
                half_concurrency,
            } => {
                if concurrency < 1.0 {
                    return single_tok_s * concurrency;
                }
                let x = concurrency - 1.0;
                single_tok_s + (saturation_tok_s - single_tok_s) * x / (x + half_concurrency - 1.0)
            }
        }
    }
}

/// Cold engine after (re)start: all rates are multiplied by `speed_factor` until
/// `warmup_tokens` tokens of work (decode + prefill) have been done since ready.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColdStart {
    /// Rate multiplier while cold, in (0, 1].
    pub speed_factor: f64,
    /// Work (tokens) after which the engine is warm; 0 = no cold penalty.
    pub warmup_tokens: f64,
}

impl Default for ColdStart {
    fn default() -> Self {
        ColdStart {
            speed_factor: 1.0,
            warmup_tokens: 0.0,
        }
    }
}

/// A validated hardware profile. Construct with [`HardwareProfile::from_yaml_str`] or
/// [`HardwareProfile::load`].
#[derive(Debug, Clone, PartialEq)]
pub struct HardwareProfile {
    origin: String,
    name: String,
    description: String,
    gpu_names: Vec<String>,
    sources: Vec<String>,
    decode: DecodeCurve,
    prefill_tok_s: f64,
    prefill_chunk_tokens: u32,
    prefill_overlap: f64,
    /// Seconds a decode step spends per token its sequences attend to (the profile's
    /// `kv_read_s_per_ktok` / 1000; 0 when absent).
    kv_read_s_per_tok: f64,
    kv_capacity_tokens: u64,
    max_running: u32,
    context_window: u32,
    cold_start: ColdStart,
    fitted: Vec<String>,
    extrapolated: Vec<String>,
    /// The declared `uncertainty:` ([`uncertainty`]).
    uncertainty: Vec<(UncertainField, f64)>,
    /// [`HardwareProfile::step_times`]' shared table.
    step_times: StepTimes,
}

/// The profile's [`HardwareProfile::step_time_s`] of every decode batch up to its
/// `max_running`, built when the first engine asks and then shared by every engine on the
/// profile: a fleet of thousands of workers on a few profiles reads a few tables that stay in
/// cache, where one copy per engine cost a cache miss on most events.
#[derive(Clone, Default)]
struct StepTimes(OnceLock<Arc<[f64]>>);

impl PartialEq for StepTimes {
    /// A cache of figures the rest of the profile determines: it never tells two profiles
    /// apart.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for StepTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // the table can hold a million entries: its length says enough
        match self.0.get() {
            Some(t) => write!(f, "StepTimes({} entries)", t.len()),
            None => f.write_str("StepTimes(not built)"),
        }
    }
}

impl HardwareProfile {
    /// Reads and validates a profile file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, HardwareError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|e| InputError::unreadable(&origin, &e))?;
        Self::from_yaml_str(&src, &origin)
    }

    /// Parses and validates a profile from YAML text; `origin` names the file in errors.
    pub fn from_yaml_str(src: &str, origin: &str) -> Result<Self, HardwareError> {
        let raw: RawProfile = parse_yaml(src, origin).map_err(|mut e| {
            if let Some(missing) = e
                .message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
            {
                // the parser points at the mapping that lacks the field
                e.field = if e.field.is_empty() {
                    missing.to_string()
                } else {
                    format!("{}.{missing}", e.field)
                };
            }
            if let Some(hint) = expected_for(&e.field).filter(|_| !e.message.contains("expected")) {
                e = e.valid(hint);
            }
            e
        })?;
        validate(raw, origin)
    }

    /// Where the profile came from: the file path, `bundled:<name>` for a profile built into
    /// the binary, or the origin given to `from_yaml_str`.
    pub fn origin(&self) -> &str {
        &self.origin
    }
    /// Profile name, e.g. `rtx-pro-6000-27b`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Free-text description.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// GPU names as a worker would report them at registration (one entry per card).
    pub fn gpu_names(&self) -> &[String] {
        &self.gpu_names
    }
    /// Where the numbers came from.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }
    /// The decode curve.
    pub fn decode(&self) -> &DecodeCurve {
        &self.decode
    }
    /// Prefill (prompt processing) tokens/s when nothing decodes.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prefill_tok_s
    }
    /// Prefill tokens processed per engine step alongside the decoders.
    pub fn prefill_chunk_tokens(&self) -> u32 {
        self.prefill_chunk_tokens
    }
    /// KV-cache capacity in tokens.
    /// The share of a mixed step's shorter part (usually the prefill) that hides under the
    /// longer one, in `[0, 1]` ([`step`]; default [`DEFAULT_PREFILL_OVERLAP`]).
    pub fn prefill_overlap(&self) -> f64 {
        self.prefill_overlap
    }

    /// Seconds of one engine step that decodes `n` sequences and prefills `prefill_tokens`
    /// beside them ([`mixed_step_s`], the one step-time model; speed multipliers not applied),
    /// the decoding sequences attending to no context (see [`Self::mixed_step_time_at_s`]).
    pub fn mixed_step_time_s(&self, n: f64, prefill_tokens: f64) -> f64 {
        self.mixed_step_time_at_s(n, 0.0, prefill_tokens)
    }

    /// [`Self::mixed_step_time_s`] when the `n` decoding sequences attend to `attended_tokens`
    /// in all (their prompts and the tokens they have output): the decode part is
    /// [`Self::decode_step_time_s`].
    pub fn mixed_step_time_at_s(&self, n: f64, attended_tokens: f64, prefill_tokens: f64) -> f64 {
        mixed_step_s(
            self.decode_step_time_s(n, attended_tokens),
            prefill_tokens.max(0.0) / self.prefill_tok_s,
            self.prefill_overlap,
        )
    }

    /// Seconds of a decode step of `n` sequences attending to `attended_tokens` in all: the
    /// curve's [`Self::step_time_s`] plus the time the step reads their KV
    /// ([`Self::kv_read_s_per_tok`] per token; exactly the curve's when that is 0).
    pub fn decode_step_time_s(&self, n: f64, attended_tokens: f64) -> f64 {
        let curve = self.step_time_s(n);
        if self.kv_read_s_per_tok > 0.0 && curve > 0.0 {
            curve + self.kv_read_s_per_tok * attended_tokens.max(0.0)
        } else {
            curve
        }
    }

    /// Seconds a decode step spends per token its sequences attend to: the KV it reads
    /// (`kv_read_s_per_ktok` / 1000; 0 when the profile has none, the decode step then the
    /// curve's alone).
    pub fn kv_read_s_per_tok(&self) -> f64 {
        self.kv_read_s_per_tok
    }

    pub fn kv_capacity_tokens(&self) -> u64 {
        self.kv_capacity_tokens
    }
    /// The engine's limit on running sequences (vLLM `max_num_seqs`).
    pub fn max_running(&self) -> u32 {
        self.max_running
    }
    /// Context window (max prompt + output tokens of one request).
    pub fn context_window(&self) -> u32 {
        self.context_window
    }
    /// Cold-start penalty.
    pub fn cold_start(&self) -> ColdStart {
        self.cold_start
    }
    /// How numbers were fitted to measurements (documentation only, like `extrapolated`).
    pub fn fitted(&self) -> &[String] {
        &self.fitted
    }
    /// Which numbers are extrapolated rather than read from a source.
    pub fn extrapolated(&self) -> &[String] {
        &self.extrapolated
    }

    /// Aggregate decode tokens/s at `concurrency` decoding sequences.
    pub fn aggregate_tok_s(&self, concurrency: f64) -> f64 {
        self.decode.aggregate_tok_s(concurrency)
    }

    /// Tokens/s seen by each of `n` concurrently decoding sequences (`aggregate(n) / n`;
    /// the single-sequence figure for `n <= 0`).
    pub fn per_request_tok_s(&self, n: f64) -> f64 {
        if n.is_nan() || n <= 0.0 {
            return self.decode.aggregate_tok_s(1.0);
        }
        self.decode.aggregate_tok_s(n) / n
    }

    /// Duration in seconds of one decode step with `n` decoding sequences (`n / aggregate(n)`;
    /// 0 for `n <= 0`).
    pub fn step_time_s(&self, n: f64) -> f64 {
        if n.is_nan() || n <= 0.0 {
            return 0.0;
        }
        n / self.decode.aggregate_tok_s(n)
    }

    /// [`Self::step_time_s`]`(n)` at index `n`, for at least `n = 0..=max_running` (an
    /// engine's running-set limit). Up to the profile's own `max_running` this is one table,
    /// built at the first call and shared by every later one; a larger limit (an override) gets
    /// a table of its own.
    pub fn step_times(&self, max_running: u32) -> Arc<[f64]> {
        if max_running <= self.max_running {
            Arc::clone(
                self.step_times
                    .0
                    .get_or_init(|| self.step_time_table(self.max_running)),
            )
        } else {
            self.step_time_table(max_running)
        }
    }

    /// [`Self::step_time_s`] of `n = 0..=max_running`, computed.
    fn step_time_table(&self, max_running: u32) -> Arc<[f64]> {
        (0..=max_running)
            .map(|n| self.step_time_s(f64::from(n)))
            .collect()
    }
}

impl fmt::Display for HardwareProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}; {:.0} tok/s at 1, {:.0} tok/s aggregate at 16)",
            self.name,
            if self.gpu_names.is_empty() {
                "unknown GPU".to_string()
            } else {
                self.gpu_names.join(" + ")
            },
            self.aggregate_tok_s(1.0),
            self.aggregate_tok_s(16.0)
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

struct Ctx<'a> {
    origin: &'a str,
}

impl Ctx<'_> {
    fn err<T>(
        &self,
        field: impl Into<String>,
        value: &Spanned<T>,
        problem: impl Into<String>,
        expected: impl Into<String>,
    ) -> HardwareError {
        InputError::new(self.origin, field, problem)
            .valid(expected)
            .at_location(value.referenced)
    }

    fn violation<T>(&self, field: &str, value: &Spanned<T>, v: rule::Violation) -> HardwareError {
        v.at_field(self.origin, field).at_location(value.referenced)
    }

    /// A finite number > 0.
    fn positive(&self, field: &str, v: &Spanned<f64>) -> Result<f64, HardwareError> {
        rule::positive(v.value).map_err(|e| self.violation(field, v, e))
    }

    /// A whole number in `min..=max`.
    fn integer(
        &self,
        field: &str,
        v: &Spanned<f64>,
        min: u64,
        max: u64,
    ) -> Result<u64, HardwareError> {
        rule::whole(v.value, min, max).map_err(|e| self.violation(field, v, e))
    }
}

fn validate(raw: RawProfile, origin: &str) -> Result<HardwareProfile, HardwareError> {
    let cx = Ctx { origin };
    let name = raw.name.value.trim().to_string();
    if name.is_empty() {
        return Err(cx.err("name", &raw.name, "empty name", "a non-empty profile name"));
    }

    let decode = validate_decode(&cx, &raw.decode)?;
    let prefill_tok_s = cx.positive("prefill_tok_s", &raw.prefill_tok_s)?;
    let prefill_chunk_tokens = match &raw.prefill_chunk_tokens {
        Some(v) => cx.integer("prefill_chunk_tokens", v, 1, u32::MAX as u64)? as u32,
        None => DEFAULT_PREFILL_CHUNK_TOKENS,
    };
    let prefill_overlap = match &raw.prefill_overlap {
        Some(v) => {
            if !(v.value.is_finite() && (0.0..=1.0).contains(&v.value)) {
                return Err(cx.err(
                    "prefill_overlap",
                    v,
                    format!("{} is not a share", v.value),
                    "a number in [0, 1]: 0 = a step's prefill adds its whole time to the \
                     decode (additive), 1 = a prefill shorter than the decode adds nothing",
                ));
            }
            v.value
        }
        None => DEFAULT_PREFILL_OVERLAP,
    };
    let kv_read_s_per_tok = match &raw.kv_read_s_per_ktok {
        Some(v) => {
            rule::non_negative(v.value).map_err(|e| cx.violation("kv_read_s_per_ktok", v, e))?;
            if v.value >= 1.0 {
                return Err(cx.err(
                    "kv_read_s_per_ktok",
                    v,
                    format!("{} s per 1,000 attended tokens is not a KV read", v.value),
                    "seconds per step per 1,000 tokens attended, >= 0 and below 1 (a roofline: \
                     KV bytes per token x 1,000 / memory bandwidth, ~4e-5 for Llama 3.1 8B on \
                     an H100)",
                ));
            }
            v.value / 1000.0
        }
        None => 0.0,
    };
    let kv_capacity_tokens = cx.integer(
        "kv_capacity_tokens",
        &raw.kv_capacity_tokens,
        1,
        MAX_KV_CAPACITY_TOKENS,
    )?;
    let max_running = cx.integer(
        "max_running",
        &raw.max_running,
        1,
        u64::from(MAX_RUNNING_LIMIT),
    )? as u32;
    let context_window = cx.integer(
        "context_window",
        &raw.context_window,
        MIN_CONTEXT_WINDOW as u64,
        u32::MAX as u64,
    )? as u32;
    if (context_window as u64) > kv_capacity_tokens {
        return Err(cx.err(
            "context_window",
            &raw.context_window,
            format!(
                "{context_window} tokens do not fit in kv_capacity_tokens = {kv_capacity_tokens} \
                 (a request of the full window could never be admitted)"
            ),
            format!("at most kv_capacity_tokens ({kv_capacity_tokens})"),
        ));
    }
    let cold_start = match &raw.cold_start {
        None => ColdStart::default(),
        Some(c) => {
            let speed_factor = cx.positive("cold_start.speed_factor", &c.speed_factor)?;
            if speed_factor > 1.0 {
                return Err(cx.err(
                    "cold_start.speed_factor",
                    &c.speed_factor,
                    format!("{speed_factor} would make a cold engine faster than a warm one"),
                    "a number in (0, 1]",
                ));
            }
            let w = &c.warmup_tokens;
            rule::non_negative(w.value)
                .map_err(|e| cx.violation("cold_start.warmup_tokens", w, e))?;
            ColdStart {
                speed_factor,
                warmup_tokens: w.value,
            }
        }
    };

    Ok(HardwareProfile {
        origin: origin.to_string(),
        name,
        description: raw.description.unwrap_or_default(),
        gpu_names: raw.gpu_names,
        sources: raw.sources,
        decode,
        prefill_tok_s,
        prefill_chunk_tokens,
        prefill_overlap,
        kv_read_s_per_tok,
        kv_capacity_tokens,
        max_running,
        context_window,
        cold_start,
        fitted: raw.fitted,
        extrapolated: raw.extrapolated,
        uncertainty: uncertainty::validate(origin, raw.uncertainty.as_ref())?,
        step_times: StepTimes::default(),
    })
}

fn validate_decode(cx: &Ctx<'_>, d: &Spanned<RawDecode>) -> Result<DecodeCurve, HardwareError> {
    let raw = &d.value;
    let any_param = raw.single_tok_s.is_some()
        || raw.saturation_tok_s.is_some()
        || raw.half_concurrency.is_some();
    match (&raw.points, any_param) {
        (Some(_), true) => Err(cx.err(
            "decode",
            d,
            "both points and a parametric curve given",
            EITHER_CURVE,
        )),
        (None, false) => Err(cx.err("decode", d, "no decode curve given", EITHER_CURVE)),
        (Some(points), false) => validate_points(cx, d, points),
        (None, true) => validate_parametric(cx, d),
    }
}

/// What a decode curve may be, for errors about its form.
const EITHER_CURVE: &str = "either `points: [{concurrency, aggregate_tok_s}, ...]` or all of \
                            `single_tok_s`, `saturation_tok_s`, `half_concurrency`";

/// Measured points: strictly increasing concurrency, an aggregate that does not fall and a
/// step time that does not fall.
fn validate_points(
    cx: &Ctx<'_>,
    d: &Spanned<RawDecode>,
    points: &[RawPoint],
) -> Result<DecodeCurve, HardwareError> {
    if points.is_empty() {
        return Err(cx.err("decode.points", d, "empty list", "at least one point"));
    }
    let mut out: Vec<DecodePoint> = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let cf = format!("decode.points[{i}].concurrency");
        let af = format!("decode.points[{i}].aggregate_tok_s");
        let c = cx.positive(&cf, &p.concurrency)?;
        let a = cx.positive(&af, &p.aggregate_tok_s)?;
        if let Some(prev) = out.last() {
            if c <= prev.concurrency {
                return Err(cx.err(
                    cf,
                    &p.concurrency,
                    format!(
                        "concurrency {c} is not greater than the previous point's {}",
                        prev.concurrency
                    ),
                    "strictly increasing concurrency, no duplicates",
                ));
            }
            if a < prev.aggregate_tok_s {
                return Err(cx.err(
                    af,
                    &p.aggregate_tok_s,
                    format!(
                        "aggregate {a} tok/s is below the previous point's {} \
                             (at concurrency {})",
                        prev.aggregate_tok_s, prev.concurrency
                    ),
                    "aggregate throughput non-decreasing in concurrency \
                         (per-request speed may fall, the total may not)",
                ));
            }
            // The step time c / a must not fall as the batch grows: a step that
            // decodes more sequences cannot be shorter (per-request speed may not
            // rise).
            if c / a < prev.concurrency / prev.aggregate_tok_s * (1.0 - 1e-12) {
                return Err(cx.err(
                    af,
                    &p.aggregate_tok_s,
                    format!(
                        "the decode step time falls from {:.3} ms at concurrency {} \
                             to {:.3} ms at {c} ({:.1} tok/s per request, up from {:.1})",
                        prev.concurrency / prev.aggregate_tok_s * 1e3,
                        prev.concurrency,
                        c / a * 1e3,
                        a / c,
                        prev.aggregate_tok_s / prev.concurrency
                    ),
                    format!(
                        "a step time non-decreasing in concurrency: aggregate_tok_s at \
                             most {:.3} here (per-request speed may not rise with the batch)",
                        prev.aggregate_tok_s / prev.concurrency * c
                    ),
                ));
            }
        }
        out.push(DecodePoint {
            concurrency: c,
            aggregate_tok_s: a,
        });
    }
    Ok(DecodeCurve::Points(out))
}

/// The parametric curve: all three figures > 0, a saturation not below the single-sequence
/// figure, a half-way concurrency above 1 and a step time that does not fall.
fn validate_parametric(cx: &Ctx<'_>, d: &Spanned<RawDecode>) -> Result<DecodeCurve, HardwareError> {
    let raw = &d.value;
    let get = |name: &str, v: &Option<Spanned<f64>>| -> Result<f64, HardwareError> {
        match v {
            Some(v) => cx.positive(&format!("decode.{name}"), v),
            None => Err(cx.err(
                format!("decode.{name}"),
                d,
                "missing",
                format!("{EITHER_CURVE}; `{name}` is required by the parametric form"),
            )),
        }
    };
    let single = get("single_tok_s", &raw.single_tok_s)?;
    let sat = get("saturation_tok_s", &raw.saturation_tok_s)?;
    let half = get("half_concurrency", &raw.half_concurrency)?;
    if sat < single {
        let v = raw.saturation_tok_s.as_ref().expect("checked above");
        return Err(cx.err(
            "decode.saturation_tok_s",
            v,
            format!("{sat} is below single_tok_s = {single}"),
            "saturation_tok_s >= single_tok_s (aggregate never falls with concurrency)",
        ));
    }
    if half <= 1.0 {
        let v = raw.half_concurrency.as_ref().expect("checked above");
        return Err(cx.err(
            "decode.half_concurrency",
            v,
            format!("{half} is not above 1"),
            "a concurrency greater than 1",
        ));
    }
    // The curve is concave from n = 1, so its step time n / agg(n) is non-decreasing
    // exactly when the tangent at n = 1 meets the axis at or above 0:
    // single - (saturation - single) / (half - 1) >= 0.
    if sat > single * half * (1.0 + 1e-12) {
        let v = raw.saturation_tok_s.as_ref().expect("checked above");
        return Err(cx.err(
            "decode.saturation_tok_s",
            v,
            format!(
                "{sat} makes the decode step time fall just above one sequence \
                     (per-request speed would rise with the batch)"
            ),
            format!(
                "at most single_tok_s x half_concurrency = {} (a step time \
                     non-decreasing in concurrency)",
                single * half
            ),
        ));
    }
    Ok(DecodeCurve::Parametric {
        single_tok_s: single,
        saturation_tok_s: sat,
        half_concurrency: half,
    })
}

/// What a field accepts, for parser errors (by the last component of the path).
fn expected_for(field: &str) -> Option<&'static str> {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    Some(match leaf {
        "name" | "description" => "a string",
        "gpu_names" | "sources" | "fitted" | "extrapolated" => "a list of strings",
        "decode" => {
            "a mapping with either `points: [{concurrency, aggregate_tok_s}, ...]` or \
             `single_tok_s`, `saturation_tok_s`, `half_concurrency`"
        }
        "points" => "a list of `{ concurrency: N, aggregate_tok_s: X }`",
        "concurrency" | "half_concurrency" => "a number of concurrent sequences > 0",
        "aggregate_tok_s" | "single_tok_s" | "saturation_tok_s" | "prefill_tok_s" => {
            "tokens per second, a number > 0"
        }
        "prefill_chunk_tokens" | "kv_capacity_tokens" | "max_running" => "a whole number >= 1",
        "prefill_overlap" => "a number in [0, 1]",
        "kv_read_s_per_ktok" => "seconds per decode step per 1,000 attended tokens, >= 0",
        "context_window" => "a whole number of tokens >= 1024",
        "cold_start" => "`{ speed_factor: (0, 1], warmup_tokens: >= 0 }`",
        "speed_factor" => "a number in (0, 1]",
        "uncertainty" => "a mapping of prefill_tok_s and/or decode to a fraction in [0, 1)",
        "warmup_tokens" => "a number of tokens >= 0",
        _ => {
            "the fields name, description, gpu_names, sources, decode, prefill_tok_s, \
             prefill_chunk_tokens, prefill_overlap, kv_read_s_per_ktok, kv_capacity_tokens, max_running, context_window, \
             cold_start, fitted, extrapolated, uncertainty"
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: test
gpu_names: [\"RTX 4090\", \"RTX 4090\"]
decode:
  points:
    - { concurrency: 1, aggregate_tok_s: 100 }
    - { concurrency: 8, aggregate_tok_s: 400 }
    - { concurrency: 32, aggregate_tok_s: 800 }
prefill_tok_s: 4000
kv_capacity_tokens: 100000
max_running: 64
context_window: 32768
cold_start: { speed_factor: 0.3, warmup_tokens: 2000 }
";

    #[test]
    fn parses_good_profile() {
        let p = HardwareProfile::from_yaml_str(GOOD, "good.yaml").unwrap();
        assert_eq!(p.name(), "test");
        assert_eq!(p.prefill_chunk_tokens(), 512);
        assert_eq!(p.max_running(), 64);
        assert_eq!(p.gpu_names().len(), 2);
        assert!((p.aggregate_tok_s(1.0) - 100.0).abs() < 1e-9);
        assert!((p.aggregate_tok_s(8.0) - 400.0).abs() < 1e-9);
        assert!((p.aggregate_tok_s(100.0) - 800.0).abs() < 1e-9);
        assert!((p.aggregate_tok_s(0.5) - 50.0).abs() < 1e-9);
        assert!((p.per_request_tok_s(8.0) - 50.0).abs() < 1e-9);
        assert!((p.step_time_s(8.0) - 0.02).abs() < 1e-12);
        assert_eq!(p.step_time_s(0.0), 0.0);
    }

    #[test]
    fn step_times_are_the_step_time_and_shared_up_to_max_running() {
        let p = HardwareProfile::from_yaml_str(GOOD, "good.yaml").unwrap();
        let t = p.step_times(64);
        assert_eq!(t.len(), 65);
        for (n, &s) in t.iter().enumerate() {
            assert_eq!(s.to_bits(), p.step_time_s(n as f64).to_bits(), "n = {n}");
        }
        // a smaller limit reads the same table; a larger one gets its own, as long as it needs
        assert!(Arc::ptr_eq(&t, &p.step_times(8)));
        let big = p.step_times(100);
        assert_eq!(big.len(), 101);
        assert!(!Arc::ptr_eq(&t, &big));
        assert_eq!(big[100].to_bits(), p.step_time_s(100.0).to_bits());
        assert_eq!(big[..65], t[..]);
        // the table never makes two profiles unequal
        let fresh = HardwareProfile::from_yaml_str(GOOD, "good.yaml").unwrap();
        assert_eq!(p, fresh);
        assert!(format!("{p:?}").contains("StepTimes(65 entries)"));
    }

    #[test]
    fn interpolation_is_monotone() {
        let p = HardwareProfile::from_yaml_str(GOOD, "good.yaml").unwrap();
        let mut prev = 0.0;
        for i in 0..4000 {
            let c = i as f64 * 0.01;
            let a = p.aggregate_tok_s(c);
            assert!(a >= prev - 1e-12, "not monotone at {c}: {a} < {prev}");
            assert!(a.is_finite());
            prev = a;
        }
        let par = DecodeCurve::Parametric {
            single_tok_s: 30.0,
            saturation_tok_s: 40.0,
            half_concurrency: 4.0,
        };
        assert!((par.aggregate_tok_s(1.0) - 30.0).abs() < 1e-12);
        assert!((par.aggregate_tok_s(4.0) - 35.0).abs() < 1e-12);
        let mut prev = 0.0;
        for i in 0..4000 {
            let a = par.aggregate_tok_s(i as f64 * 0.05);
            assert!(a >= prev - 1e-12 && a <= 40.0);
            prev = a;
        }
    }

    fn err_of(src: &str) -> HardwareError {
        HardwareProfile::from_yaml_str(src, "bad.yaml").unwrap_err()
    }

    #[test]
    fn rejects_decreasing_aggregate_with_field_and_line() {
        let e = err_of(&GOOD.replace("aggregate_tok_s: 800", "aggregate_tok_s: 300"));
        let msg = e.to_string();
        assert_eq!(e.field, "decode.points[2].aggregate_tok_s");
        assert_eq!(e.line, Some(7), "{msg}");
        assert!(msg.starts_with("bad.yaml:7:"), "{msg}");
        assert!(msg.contains("non-decreasing"), "{msg}");
    }

    #[test]
    fn rejects_duplicate_concurrency() {
        let e = err_of(&GOOD.replace("concurrency: 32", "concurrency: 8"));
        assert_eq!(e.field, "decode.points[2].concurrency");
        assert!(e.to_string().contains("strictly increasing"), "{e}");
    }

    #[test]
    fn a_decode_step_that_shortens_as_the_batch_grows_is_refused() {
        // 400 tok/s at 8 is 50 per request; 1,800 at 32 would be 56.25: a step of 17.8 ms at
        // 32 sequences after 20 ms at 8
        let e = err_of(&GOOD.replace("aggregate_tok_s: 800", "aggregate_tok_s: 1800"));
        assert_eq!(e.field, "decode.points[2].aggregate_tok_s", "{e}");
        assert_eq!(e.line, Some(7), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("step time falls"), "{msg}");
        assert!(msg.contains("at most 1600"), "{msg}");
        // equal per-request speed (a flat step time) is fine
        let ok = GOOD.replace("aggregate_tok_s: 800", "aggregate_tok_s: 1600");
        assert!(HardwareProfile::from_yaml_str(&ok, "ok.yaml").is_ok());
        // the parametric form: saturation above single x half_concurrency
        let param = |sat: &str| {
            GOOD.replace(
                "  points:\n    - { concurrency: 1, aggregate_tok_s: 100 }\n    - { concurrency: 8, \
                 aggregate_tok_s: 400 }\n    - { concurrency: 32, aggregate_tok_s: 800 }\n",
                &format!("  single_tok_s: 100\n  saturation_tok_s: {sat}\n  half_concurrency: 4\n"),
            )
        };
        assert!(HardwareProfile::from_yaml_str(&param("400"), "p.yaml").is_ok());
        let e = err_of(&param("401"));
        assert_eq!(e.field, "decode.saturation_tok_s", "{e}");
        assert!(
            e.to_string()
                .contains("at most single_tok_s x half_concurrency = 400"),
            "{e}"
        );
    }

    #[test]
    fn an_overlap_outside_its_range_is_refused() {
        for bad in ["-0.1", "1.5", ".nan"] {
            let src = format!("{GOOD}prefill_overlap: {bad}\n");
            let e = err_of(&src);
            assert_eq!(e.field, "prefill_overlap", "{bad}: {e}");
            assert_eq!(e.line, Some(13), "{bad}: {e}");
            assert!(e.to_string().contains("[0, 1]"), "{bad}: {e}");
        }
        let src = format!("{GOOD}prefill_overlap: 0.7\n");
        let p = HardwareProfile::from_yaml_str(&src, "ok.yaml").unwrap();
        assert_eq!(p.prefill_overlap(), 0.7);
        let p = HardwareProfile::from_yaml_str(GOOD, "ok.yaml").unwrap();
        assert_eq!(p.prefill_overlap(), DEFAULT_PREFILL_OVERLAP);
        // a step of 8 decodes (20 ms) beside 40 prompt tokens (10 ms) at the default 0.4
        assert!((p.mixed_step_time_s(8.0, 40.0) - 0.026).abs() < 1e-12);
    }

    #[test]
    fn the_kv_read_lengthens_the_decode_step_by_the_context_and_absent_is_zero() {
        let p = HardwareProfile::from_yaml_str(GOOD, "ok.yaml").unwrap();
        assert_eq!(p.kv_read_s_per_tok(), 0.0);
        assert_eq!(
            p.decode_step_time_s(8.0, 1e6).to_bits(),
            p.step_time_s(8.0).to_bits()
        );
        let src = format!("{GOOD}kv_read_s_per_ktok: 0.00004\n");
        let k = HardwareProfile::from_yaml_str(&src, "ok.yaml").unwrap();
        assert!((k.kv_read_s_per_tok() - 4e-8).abs() < 1e-20);
        // 8 sequences at 1,000 tokens each: 20 ms of curve + 0.32 ms of KV reads
        assert!((k.decode_step_time_s(8.0, 8000.0) - 0.02032).abs() < 1e-12);
        assert_eq!(k.decode_step_time_s(0.0, 8000.0), 0.0);
        assert!(
            (k.mixed_step_time_at_s(8.0, 8000.0, 40.0)
                - mixed_step_s(0.02032, 0.01, DEFAULT_PREFILL_OVERLAP))
            .abs()
                < 1e-12
        );
        assert_eq!(
            k.mixed_step_time_s(8.0, 40.0).to_bits(),
            p.mixed_step_time_s(8.0, 40.0).to_bits()
        );
        for bad in ["-0.1", "1", ".nan"] {
            let e = err_of(&format!("{GOOD}kv_read_s_per_ktok: {bad}\n"));
            assert_eq!(e.field, "kv_read_s_per_ktok", "{bad}: {e}");
            assert_eq!(e.line, Some(13), "{bad}: {e}");
        }
    }

    #[test]
    fn rejects_bad_numbers() {
        for (from, to, field) in [
            ("prefill_tok_s: 4000", "prefill_tok_s: -1", "prefill_tok_s"),
            (
                "prefill_tok_s: 4000",
                "prefill_tok_s: .nan",
                "prefill_tok_s",
            ),
            (
                "kv_capacity_tokens: 100000",
                "kv_capacity_tokens: 0",
                "kv_capacity_tokens",
            ),
            ("max_running: 64", "max_running: 0", "max_running"),
            (
                "context_window: 32768",
                "context_window: 512",
                "context_window",
            ),
            (
                "context_window: 32768",
                "context_window: 200000",
                "context_window",
            ),
            (
                "aggregate_tok_s: 100",
                "aggregate_tok_s: 0",
                "decode.points[0].aggregate_tok_s",
            ),
            (
                "speed_factor: 0.3",
                "speed_factor: 1.5",
                "cold_start.speed_factor",
            ),
        ] {
            let e = err_of(&GOOD.replace(from, to));
            assert_eq!(e.field, field, "{to}: {e}");
            assert!(e.line.is_some(), "{to}: {e}");
            assert!(
                e.to_string().contains("expected") || e.valid.is_some(),
                "{e}"
            );
        }
    }

    #[test]
    fn rejects_unknown_field_with_line() {
        let e = err_of(&GOOD.replace("max_running: 64", "max_running: 64\nmax_runing: 3"));
        let msg = e.to_string();
        assert!(e.message.contains("unknown field"), "{msg}");
        assert!(msg.contains("max_runing"), "{msg}");
        assert!(msg.starts_with("bad.yaml:11:"), "{msg}");
        let e = err_of(&GOOD.replace("concurrency: 8,", "concurency: 8,"));
        let msg = e.to_string();
        assert!(msg.contains("concurency"), "{msg}");
        assert!(msg.starts_with("bad.yaml:6:"), "{msg}");
        assert_eq!(e.field, "decode.points[1].concurency", "{msg}");
    }

    #[test]
    fn parametric_profile() {
        let src = "name: mac\ndecode:\n  single_tok_s: 30\n  saturation_tok_s: 40\n  half_concurrency: 4\n\
                   prefill_tok_s: 300\nkv_capacity_tokens: 100000\nmax_running: 8\ncontext_window: 32768\n";
        let p = HardwareProfile::from_yaml_str(src, "mac.yaml").unwrap();
        assert!((p.per_request_tok_s(1.0) - 30.0).abs() < 1e-9);
        let e = err_of(&src.replace("half_concurrency: 4", "half_concurrency: 1"));
        assert_eq!(e.field, "decode.half_concurrency");
        let e = err_of(&src.replace("  half_concurrency: 4\n", ""));
        assert_eq!(e.field, "decode.half_concurrency", "{e}");
    }

    #[test]
    fn missing_and_mistyped_fields_name_the_field() {
        let e = err_of(&GOOD.replace("prefill_tok_s: 4000\n", ""));
        assert_eq!(e.field, "prefill_tok_s", "{e}");
        assert!(e.to_string().contains("missing field"), "{e}");
        let e = err_of(&GOOD.replace("prefill_tok_s: 4000", "prefill_tok_s: fast"));
        assert_eq!(e.field, "prefill_tok_s", "{e}");
        assert!(e.to_string().starts_with("bad.yaml:8:"), "{e}");
        assert!(e.to_string().contains("valid: tokens per second"), "{e}");
        let e = err_of(&GOOD.replace("speed_factor: 0.3, ", ""));
        assert_eq!(e.field, "cold_start.speed_factor", "{e}");
    }
}
