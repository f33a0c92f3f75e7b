//! Each worker's capacity in two dimensions, measured from the traffic the router sees: its
//! **prefill speed** (uncached prompt tokens per second before a first token) and its **decode
//! curve** (the time of one decode step against the sequences sharing it, `a + b·n`). The
//! `predictive` chooser (`predictive.rs`) reads them; nothing else does, and the router feeds
//! them only for that chooser, so every other policy's decisions and costs are unchanged.
//!
//! Everything here is measurable inside a gateway: a completion's dispatch, first-token and
//! last-token times, its prompt and output token counts, and what the router itself charged at
//! dispatch (the uncached prompt tokens ahead of the request and its own, the requests sharing
//! the worker). No engine report and no true capacity is read.
//!
//! The figures are decayed (each new sample keeps [`KEEP`] of the old weight: about the last 64
//! samples count), so a worker that slows down or speeds up is followed. Before a worker has
//! [`MIN_SAMPLES`] of its own, it borrows the fleet's figure per unit of its weight (the
//! measured weights say how it compares with its peers); before the fleet has any, the priors
//! below scaled by its weight.

use crate::foresight::Foresight;
use crate::signals::PREFIX_BLOCK_TOKENS;
use crate::weights::Completion;

/// Share of the old weight a new sample keeps (ours): about the last 64 samples count.
pub const KEEP: f64 = 1.0 - 1.0 / 64.0;

/// Decayed samples a worker needs before its own figure replaces the fleet's (ours).
pub const MIN_SAMPLES: f64 = 4.0;

/// Decode step time of a single sequence on a worker of weight 1 before anything is measured,
/// seconds (ours: 50 tokens/s, a mid-size model on one data-centre GPU).
pub const PRIOR_STEP_S: f64 = 0.02;

/// Growth of the step per extra sequence as a share of [`PRIOR_STEP_S`] (ours; also the
/// shape assumed while a worker's samples all sit at one concurrency and the slope cannot be
/// fitted).
pub const PRIOR_SLOPE: f64 = 0.05;

/// The share of the shorter part of a mixed step (usually the prefill) that hides under the
/// longer one when nothing else is known (fitted to one published mixed-batch measurement; the
/// simulator's `prefill_overlap` default, see `routelab-sim`'s `hardware/step.rs`).
pub const DEFAULT_PREFILL_OVERLAP: f64 = 0.4;

/// Prompt tokens an engine prefills per step beside its decodes (chunked prefill). vLLM's
/// chunk is a launch setting; 512, the bundled profiles' `prefill_chunk_tokens`, is ours.
pub const CHUNK_TOKENS: u32 = 512;

/// Seconds one engine step lasts when its decode alone would take `decode_s` and its prefill
/// alone `prefill_s`, with `overlap` in `[0, 1]` of the shorter part hidden under the longer.
/// Pure decode (`prefill_s = 0`) is `decode_s`, pure prefill is `prefill_s`. **The one step
/// model**: the simulator's engines time their steps with it and `predictive` predicts with it.
#[inline]
pub fn mixed_step_s(decode_s: f64, prefill_s: f64, overlap: f64) -> f64 {
    let (long, short) = if decode_s >= prefill_s {
        (decode_s, prefill_s)
    } else {
        (prefill_s, decode_s)
    };
    long + (1.0 - overlap) * short
}

/// The chunk time `c` (seconds to prefill one chunk alone) that makes a mixed step beside a
/// decode of `decode_s` last `step_s`: the inverse of [`mixed_step_s`] in its prefill part.
/// `None` when the step is no longer than the decode alone (it says nothing about prefill).
fn chunk_from_step(decode_s: f64, step_s: f64, overlap: f64) -> Option<f64> {
    let unhidden = 1.0 - overlap;
    let c = if step_s >= decode_s * (1.0 + unhidden) {
        // The prefill is the longer part.
        step_s - unhidden * decode_s
    } else if unhidden > 0.0 {
        (step_s - decode_s) / unhidden
    } else {
        return None;
    };
    (c > 0.0 && c.is_finite()).then_some(c)
}

/// Chunked-prefill time to first token on a worker: `tokens` uncached prompt tokens (those
/// waiting ahead and the request's own) in chunks of [`CHUNK_TOKENS`], each a mixed step beside
/// a decode of `decode_s`.
#[inline]
pub fn prefill_time_s(tokens: f64, decode_s: f64, prefill_tok_s: f64) -> f64 {
    let chunks = (tokens / f64::from(CHUNK_TOKENS)).ceil().max(1.0);
    let chunk = (tokens / chunks) / prefill_tok_s;
    chunks * mixed_step_s(decode_s, chunk, DEFAULT_PREFILL_OVERLAP)
}

/// Output tokens assumed before any request has completed (ours).
pub const PRIOR_OUTPUT_TOKENS: f64 = 256.0;

/// Decayed sums for a ratio (tokens over seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ratio {
    weight: f64,
    num: f64,
    den: f64,
}

impl Ratio {
    fn push(&mut self, num: f64, den: f64) {
        self.weight = self.weight * KEEP + 1.0;
        self.num = self.num * KEEP + num;
        self.den = self.den * KEEP + den;
    }

    fn value(&self) -> Option<f64> {
        (self.weight >= MIN_SAMPLES && self.den > 0.0 && self.num > 0.0)
            .then(|| self.num / self.den)
    }
}

/// Decayed least squares of `y = a + b·x`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Line {
    weight: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl Line {
    fn push(&mut self, x: f64, y: f64) {
        self.weight = self.weight * KEEP + 1.0;
        self.sx = self.sx * KEEP + x;
        self.sy = self.sy * KEEP + y;
        self.sxx = self.sxx * KEEP + x * x;
        self.sxy = self.sxy * KEEP + x * y;
    }

    /// `(a, b)`, both positive; `None` before [`MIN_SAMPLES`]. Samples spread over less than
    /// one sequence of concurrency cannot fix a slope: the line then goes through their mean
    /// with the prior's shape.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.weight < MIN_SAMPLES || self.sy <= 0.0 {
            return None;
        }
        let (mx, my) = (self.sx / self.weight, self.sy / self.weight);
        let var = self.sxx / self.weight - mx * mx;
        let through_mean = || {
            let a = my / (1.0 + PRIOR_SLOPE * mx);
            (a, a * PRIOR_SLOPE)
        };
        if var < 1.0 {
            return Some(through_mean());
        }
        let b = (self.sxy / self.weight - mx * my) / var;
        let a = my - b * mx;
        // A falling or intercept-less line is noise (more sequences never make a step shorter);
        // keep the mean with the prior's shape instead.
        if b < 0.0 || a <= 0.0 || !b.is_finite() {
            return Some(through_mean());
        }
        Some((a, b))
    }
}

/// One worker's measured figures and what they imply, kept up to date at each sample so a
/// decision only reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Meter {
    prefill: Ratio,
    decode: Line,
    /// Measured prefill tok/s, once there are enough samples.
    prefill_tok_s: Option<f64>,
    /// Prefill tok/s a prefill-bound probe burst measured (the figure until traffic has
    /// measured its own).
    probed_prefill_tok_s: Option<f64>,
    /// Measured step line `(a, b)`, once there are enough samples.
    step: Option<(f64, f64)>,
    /// The worker's KV cache in tokens, when the host knows it (its `cache_blocks`).
    kv_tokens: Option<f64>,
}

/// What a completion tells about its worker, with what the router charged at its dispatch.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// The worker's weight now (to share the figure with the fleet per unit of weight).
    pub weight: f64,
    /// Round trip to the worker, seconds.
    pub round_trip_s: f64,
    /// Uncached prompt tokens ahead of the request at dispatch plus its own.
    pub prefill_tokens: u32,
    /// Requests on the worker while it decoded (its dispatch and completion counts averaged,
    /// itself included).
    pub sharing: f64,
}

/// Every worker's meter, the fleet's figures per unit of weight, and the output length.
#[derive(Debug, Clone, Default)]
pub struct Capacities {
    workers: Vec<Meter>,
    fleet_prefill: Ratio,
    fleet_decode: Line,
    fleet_prefill_per_weight: Option<f64>,
    fleet_step_per_weight: Option<(f64, f64)>,
    outputs: Ratio,
    /// Per model (its id's index): what the arrivals tell about the requests to come.
    foresight: Vec<Foresight>,
}

/// What the chooser uses for one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Prefill speed, uncached prompt tokens per second.
    pub prefill_tok_s: f64,
    /// Decode step at `n` sequences: `a + b·n` seconds.
    pub step_a: f64,
    /// See `step_a`.
    pub step_b: f64,
    /// KV cache, tokens (`None`: unknown, never a wait for memory).
    pub kv_tokens: Option<f64>,
}

impl Capacities {
    /// Make room for worker `index`.
    pub fn ensure(&mut self, index: usize) {
        if self.workers.len() <= index {
            self.workers.resize(index + 1, Meter::default());
        }
    }

    /// Forget a worker's own figures (its engine was restarted with other arguments, or a
    /// removed worker came back): it borrows the fleet's again until it has its own. Its KV
    /// size is configuration, not a measurement, and stays.
    pub fn forget(&mut self, index: usize) {
        if let Some(m) = self.workers.get_mut(index) {
            *m = Meter {
                kv_tokens: m.kv_tokens,
                ..Meter::default()
            };
        }
    }

    /// Worker `index`'s prefill speed as a prefill-bound probe measured it (`None`: none, or
    /// not a positive finite figure).
    pub fn set_probed_prefill(&mut self, index: usize, tok_s: Option<f64>) {
        let tok_s = tok_s.filter(|v| v.is_finite() && *v > 0.0);
        if tok_s.is_none() && self.workers.len() <= index {
            return;
        }
        self.ensure(index);
        self.workers[index].probed_prefill_tok_s = tok_s;
    }

    /// Worker `index`'s KV cache in blocks of [`PREFIX_BLOCK_TOKENS`], as the host states it.
    pub fn set_cache_blocks(&mut self, index: usize, blocks: Option<u32>) {
        self.ensure(index);
        self.workers[index].kv_tokens =
            blocks.map(|b| f64::from(b) * f64::from(PREFIX_BLOCK_TOKENS));
    }

    /// Model `model`'s foresight (`None` before its first arrival).
    #[inline]
    pub fn foresight(&self, model: usize) -> Option<&Foresight> {
        self.foresight.get(model)
    }

    /// Model `model`'s foresight, made on first use.
    pub fn foresight_mut(&mut self, model: usize) -> &mut Foresight {
        if self.foresight.len() <= model {
            self.foresight.resize_with(model + 1, Foresight::default);
        }
        &mut self.foresight[model]
    }

    /// The mean output length of the completed requests (decayed), tokens.
    pub fn mean_output_tokens(&self) -> f64 {
        if self.outputs.weight > 0.0 {
            self.outputs.num / self.outputs.weight
        } else {
            PRIOR_OUTPUT_TOKENS
        }
    }

    /// Worker `index`'s figures: its own once measured (the prefill speed: from its traffic,
    /// else from a prefill-bound probe), else the fleet's per unit of weight times `weight`,
    /// else the priors times `weight`.
    #[inline]
    pub fn estimate(&self, index: usize, weight: f64) -> Estimate {
        let m = self.workers.get(index);
        let own_prefill = m.and_then(|m| m.prefill_tok_s.or(m.probed_prefill_tok_s));
        let prefill_tok_s = own_prefill.unwrap_or_else(|| {
            self.fleet_prefill_per_weight
                .unwrap_or(crate::rules::DEFAULT_INPUT_TOK_S)
                * weight
        });
        let (step_a, step_b) = m.and_then(|m| m.step).unwrap_or_else(|| {
            let (a, b) = self
                .fleet_step_per_weight
                .unwrap_or((PRIOR_STEP_S, PRIOR_STEP_S * PRIOR_SLOPE));
            (a / weight, b / weight)
        });
        Estimate {
            prefill_tok_s,
            step_a,
            step_b,
            kv_tokens: m.and_then(|m| m.kv_tokens),
        }
    }

    /// Learn from a completed request on worker `index`.
    pub fn learn(&mut self, index: usize, c: &Completion, s: Sample) {
        self.ensure(index);
        let weight = if s.weight.is_finite() && s.weight > 0.0 {
            s.weight
        } else {
            1.0
        };
        self.outputs.push(f64::from(c.output_tokens), 1.0);
        // Decode: the time per output token after the first, against the sharing count.
        if let Some(tok_s) = c.decode_tok_s()
            && s.sharing.is_finite()
            && s.sharing >= 1.0
        {
            let tpot = 1.0 / tok_s;
            let m = &mut self.workers[index];
            m.decode.push(s.sharing, tpot);
            m.step = m.decode.fit();
            self.fleet_decode.push(s.sharing, tpot * weight);
            self.fleet_step_per_weight = self.fleet_decode.fit();
        }
        // Prefill: the time to first token less the round trip is the uncached tokens it
        // waited for (those ahead and its own) in chunks, each a mixed step beside the decode
        // of the requests sharing the worker; inverting the step model gives the chunk's time
        // alone. Prompts under one chunk say more about step timing than about prefill speed
        // and are left out.
        let est = self.estimate(index, weight);
        let ttft = (c.first_token_at - c.dispatched_at).as_secs_f64();
        let tokens = f64::from(s.prefill_tokens);
        let chunks = (tokens / f64::from(CHUNK_TOKENS)).ceil();
        let step = (ttft - s.round_trip_s) / chunks;
        let decode = est.step_a + est.step_b * s.sharing.max(1.0);
        if s.prefill_tokens >= CHUNK_TOKENS
            && let Some(chunk_s) = chunk_from_step(decode, step, DEFAULT_PREFILL_OVERLAP)
        {
            let per_chunk = tokens / chunks;
            let m = &mut self.workers[index];
            m.prefill.push(per_chunk, chunk_s);
            m.prefill_tok_s = m.prefill.value();
            self.fleet_prefill.push(per_chunk / weight, chunk_s);
            self.fleet_prefill_per_weight = self.fleet_prefill.value();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;
    use std::time::Duration;

    fn completion(ttft_s: f64, output: u32, tpot_s: f64) -> Completion {
        let first = Time::ZERO + Duration::from_secs_f64(ttft_s);
        Completion {
            prompt_tokens: 0,
            output_tokens: output,
            dispatched_at: Time::ZERO,
            first_token_at: first,
            completed_at: first + Duration::from_secs_f64(tpot_s * f64::from(output - 1)),
        }
    }

    fn sample(prefill_tokens: u32, sharing: f64) -> Sample {
        Sample {
            weight: 1.0,
            round_trip_s: 0.0,
            prefill_tokens,
            sharing,
        }
    }

    #[test]
    fn the_chunk_inverse_undoes_the_step_model_on_both_sides_of_the_crossover() {
        for (d, c) in [(0.03, 0.01), (0.03, 0.05), (0.01, 0.2)] {
            let step = mixed_step_s(d, c, DEFAULT_PREFILL_OVERLAP);
            let back = chunk_from_step(d, step, DEFAULT_PREFILL_OVERLAP).unwrap();
            assert!((back - c).abs() < 1e-12, "d {d} c {c}: {back}");
        }
        assert_eq!(chunk_from_step(0.03, 0.03, DEFAULT_PREFILL_OVERLAP), None);
        assert_eq!(chunk_from_step(0.03, 0.02, DEFAULT_PREFILL_OVERLAP), None);
    }

    #[test]
    fn a_worker_borrows_the_fleets_figure_per_weight_until_it_has_its_own() {
        let mut c = Capacities::default();
        c.ensure(1);
        let prior = c.estimate(1, 2.0);
        assert_eq!(prior.prefill_tok_s, crate::rules::DEFAULT_INPUT_TOK_S * 2.0);
        assert!((prior.step_a - PRIOR_STEP_S / 2.0).abs() < 1e-12);
        // Worker 0 (weight 1) prefills 10,000 tok/s and steps 0.02 + 0.002·n.
        for k in 0..40 {
            let n = f64::from(1 + k % 8);
            let tpot = 0.02 + 0.002 * n;
            let tokens = 4_096 + 512 * (k % 5);
            let ttft = prefill_time_s(f64::from(tokens), tpot, 10_000.0);
            c.learn(0, &completion(ttft, 100, tpot), sample(tokens, n));
        }
        let own = c.estimate(0, 1.0);
        assert!((own.prefill_tok_s / 10_000.0 - 1.0).abs() < 0.01, "{own:?}");
        assert!((own.step_a - 0.02).abs() < 1e-6 && (own.step_b - 0.002).abs() < 1e-6);
        // Worker 1, never measured, weight 2: twice the fleet's figure per weight.
        let borrowed = c.estimate(1, 2.0);
        assert!((borrowed.prefill_tok_s / 20_000.0 - 1.0).abs() < 0.01);
        assert!((borrowed.step_a - 0.01).abs() < 1e-6);
        c.set_cache_blocks(0, Some(10));
        c.forget(0);
        assert_eq!(
            c.workers[0],
            Meter {
                kv_tokens: Some(5_120.0),
                ..Meter::default()
            }
        );
        let again = c.estimate(0, 1.0).prefill_tok_s;
        assert!(
            (again / 10_000.0 - 1.0).abs() < 0.01,
            "the fleet's figure: {again}"
        );
        assert!((c.mean_output_tokens() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn samples_at_one_concurrency_keep_the_priors_shape_and_short_prompts_teach_no_prefill() {
        let mut c = Capacities::default();
        for _ in 0..10 {
            c.learn(0, &completion(0.05, 50, 0.03), sample(100, 4.0));
        }
        let e = c.estimate(0, 1.0);
        assert_eq!(
            e.prefill_tok_s,
            crate::rules::DEFAULT_INPUT_TOK_S,
            "one-block prompts say nothing about prefill speed"
        );
        assert!((e.step_a + e.step_b * 4.0 - 0.03).abs() < 1e-9, "{e:?}");
        assert!((e.step_b / e.step_a - PRIOR_SLOPE).abs() < 1e-12);
    }

    #[test]
    fn a_slower_engine_is_followed_within_a_few_dozen_samples() {
        let mut c = Capacities::default();
        for _ in 0..64 {
            c.learn(0, &completion(0.5, 2, 0.02), sample(5_120, 1.0));
        }
        let before = c.estimate(0, 1.0).prefill_tok_s;
        for _ in 0..64 {
            c.learn(0, &completion(1.0, 2, 0.02), sample(5_120, 1.0));
        }
        let after = c.estimate(0, 1.0).prefill_tok_s;
        assert!(after < 0.7 * before, "{before} -> {after}");
    }
}
