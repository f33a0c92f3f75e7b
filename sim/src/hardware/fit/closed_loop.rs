//! The closed loops a benchmark measures and the step model that takes their prompts' prefill
//! out of them ([`ClosedLoop::decode_aggregate`]); one measured mixed step ([`MixedStep`]).

use routelab_policies::located::{InputError, rule};

use super::super::{OverlapError, mixed_step_s, overlap_from_mixed_step};
use super::{flag_error, not_valid};

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
    /// [`ClosedLoopError`]: a figure is not finite and positive, a request has no decode step
    /// (`N <= 1`), or the prompts' prefill alone would fill the run (`q >= 1`).
    pub fn decode_aggregate(&self, model: &StepModel) -> Result<f64, ClosedLoopError> {
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
                return Err(ClosedLoopError::NotPositive { name, value: v });
            }
        }
        if n <= 1.0 {
            return Err(ClosedLoopError::NoDecodeStep { output_tokens: n });
        }
        let requests_per_s = x / n;
        let decode_tok_s = x * (n - 1.0) / n;
        let step_tokens = (c * prompt).min(f64::from(model.prefill_chunk_tokens.max(1)));
        let prefill_steps_per_s = requests_per_s * prompt / step_tokens;
        let chunk_s = step_tokens / model.prefill_tok_s;
        let prefilling = (step_tokens / prompt).max(1.0);
        let prefill_alone = requests_per_s * prompt / model.prefill_tok_s;
        if prefill_alone >= 1.0 {
            return Err(ClosedLoopError::PrefillFillsTheRun {
                output_tok_s: x,
                prompt_tokens: prompt,
                prompt_tok_s: requests_per_s * prompt,
                prefill_tok_s: model.prefill_tok_s,
            });
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

/// Why a closed loop cannot be separated from its prefill ([`ClosedLoop::decode_aggregate`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ClosedLoopError {
    /// A figure of the loop or the model is not a finite number > 0.
    #[error("{name} = {value}: must be a finite number > 0")]
    NotPositive {
        /// Which figure.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// The mean output is one token or less: the run has no decode step.
    #[error(
        "{output_tokens} output tokens per request: the first comes with the prefill, so the \
         run has no decode step to measure (the mean output must be above 1 token)"
    )]
    NoDecodeStep {
        /// Output tokens per request.
        output_tokens: f64,
    },
    /// The prompts' prefill alone would take the whole run.
    #[error(
        "{output_tok_s} output tok/s of requests with {prompt_tokens} prompt tokens need \
         {prompt_tok_s:.0} prompt tok/s, at least the prefill speed {prefill_tok_s} tok/s: the \
         prompts alone would fill the run and leave no time to decode"
    )]
    PrefillFillsTheRun {
        /// The run's output tokens/s.
        output_tok_s: f64,
        /// Prompt tokens per request.
        prompt_tokens: f64,
        /// Prompt tokens/s the run's requests need.
        prompt_tok_s: f64,
        /// The model's prefill speed.
        prefill_tok_s: f64,
    },
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
    /// [`OverlapError`] when the step is outside what the model can express.
    pub fn overlap(&self, aggregate_tok_s: f64, prefill_tok_s: f64) -> Result<f64, OverlapError> {
        overlap_from_mixed_step(
            f64::from(self.decoding) / aggregate_tok_s,
            f64::from(self.prompt_tokens) / prefill_tok_s,
            self.step_s,
        )
    }
}
