//! The profile built from what a source measured, step by step: the prefill speed, the overlap
//! ([`super::overlap`]), the decode curve and its notes, the figures the source does not
//! measure, the cold start; then written ([`super::write`]), read back and checked
//! ([`super::report`]).

use routelab_policies::located::{InputError, rule};
use routelab_policies::weights::ProbeConfig;

use super::super::schema::{RawProfile, unlocated};
use super::super::{DEFAULT_PREFILL_CHUNK_TOKENS, HardwareProfile, MIN_CONTEXT_WINDOW};
use super::context::{self, ContextFit};
use super::curve::{curve_of, decode_values, monotone_points, pooled_points, pooled_values};
use super::overlap::{self, Overlap};
use super::report::{point_errors, warnings};
use super::simulated;
use super::write;
use super::{
    ColdBurst, DEFAULT_CONTEXT_WINDOW, DEFAULT_KV_CAPACITY_TOKENS, DEFAULT_MAX_RUNNING,
    DEFAULT_PREFILL_PER_DECODE, FitOptions, FitSource, FittedProfile, Measured, Obs, PointMove,
    StepModel, flag_error, not_valid, round_to,
};

/// The profile's notes on where its figures come from, in the order they are written.
#[derive(Debug, Default)]
struct Notes {
    /// How figures were fitted to the measurements (`fitted`).
    fitted: Vec<String>,
    /// Which figures were not measured (`extrapolated`).
    extrapolated: Vec<String>,
}

/// What the decode curve is fitted from, once the prefill speed is known: the measured points,
/// the pure-decode sweep when one is given, and whether closed loops have their prompts'
/// prefill subtracted.
pub(super) struct Curve<'a> {
    /// The measured points, in concurrency order.
    pub(super) points: &'a [Obs],
    /// The pure-decode sweep (`--decode-sweep`).
    pub(super) sweep: Option<&'a Measured>,
    /// How many measured points are closed loops.
    pub(super) closed_rows: usize,
    /// The closed loops have their prompts' prefill subtracted.
    pub(super) subtract: bool,
    /// The profile's prefill speed.
    pub(super) prefill_tok_s: f64,
    /// The curve's points: the pure-decode sweep's when one is given (the closed-loop rows then
    /// fit the overlap only), else the measured points with rows of one concurrency pooled.
    pub(super) curve_points: Vec<Obs>,
    /// The sweep's aggregates, when there is a sweep.
    pub(super) sweep_values: Option<Vec<f64>>,
    /// The engine's prompt-token budget per step (`--chunk-tokens`, else routelab's default).
    pub(super) chunk_tokens: u32,
    /// The decode step's KV read per token attended, when the sweep fitted one (the curve is
    /// then the step at no context).
    pub(super) context: Option<ContextFit>,
}

impl Curve<'_> {
    /// The step model with `overlap`.
    pub(super) fn model(&self, overlap: f64) -> StepModel {
        StepModel {
            prefill_tok_s: self.prefill_tok_s,
            prefill_chunk_tokens: self.chunk_tokens,
            prefill_overlap: overlap,
        }
    }

    /// The decode aggregate of each of [`Self::curve_points`] under `overlap`.
    pub(super) fn values(&self, overlap: f64) -> Result<Vec<f64>, InputError> {
        match &self.sweep_values {
            Some(v) => Ok(v.clone()),
            None => {
                let model = self.subtract.then(|| self.model(overlap));
                let v = decode_values(self.points, model.as_ref())?;
                Ok(pooled_values(self.points, &v))
            }
        }
    }

    /// The fitted curve's points under `overlap`.
    pub(super) fn moves(&self, overlap: f64) -> Result<Vec<PointMove>, InputError> {
        Ok(monotone_points(&self.curve_points, &self.values(overlap)?))
    }

    /// Seconds per decode step per token attended, as the profile writes it (0 without one).
    pub(super) fn kv_read_s_per_tok(&self) -> f64 {
        self.context.as_ref().map_or(0.0, |c| c.per_ktok() / 1e3)
    }

    /// The decode aggregate of `n` sequences attending to `context` tokens each, on a curve
    /// whose aggregate at `n` is `curve_tok_s` (the step at no context).
    pub(super) fn at_context(&self, n: f64, curve_tok_s: f64, context: f64) -> f64 {
        let k = self.kv_read_s_per_tok();
        if k > 0.0 {
            n / (n / curve_tok_s + k * n * context)
        } else {
            curve_tok_s
        }
    }
}

/// Builds, writes, reads back and checks the profile.
pub(super) fn build(
    source: FitSource,
    mut m: Measured,
    sweep: Option<Measured>,
    opts: &FitOptions,
) -> Result<FittedProfile, InputError> {
    let mut notes = Notes::default();
    let closed_rows = m.points.iter().filter(|p| p.closed_loop.is_some()).count();
    let subtract = closed_rows > 0 && !opts.pure_decode;
    let context = match (&sweep, &opts.decode_sweep) {
        (Some(sw), Some(input)) => context::fit(sw, &input.origin)?,
        _ => None,
    };
    let (curve_points, sweep_values) = match (&sweep, &context) {
        (_, Some(cx)) => (cx.points.clone(), Some(cx.values.clone())),
        (Some(sw), None) => (
            sw.points.clone(),
            Some(sw.points.iter().map(|p| p.aggregate_tok_s).collect()),
        ),
        (None, None) => (pooled_points(&m.points), None),
    };
    let sweep_curve = sweep_values
        .as_deref()
        .map(|v| (curve_points.as_slice(), v));
    let (prefill_tok_s, prefill_note) = prefill_speed(&m, sweep_curve, opts, subtract, &mut notes)?;
    let chunk_tokens = chunk_tokens(opts)?;
    let curve = Curve {
        points: &m.points,
        sweep: sweep.as_ref(),
        closed_rows,
        subtract,
        prefill_tok_s,
        curve_points,
        sweep_values,
        chunk_tokens,
        context,
    };
    let overlap = overlap::choose(&curve, opts, &mut notes.extrapolated)?;
    // The figures the overlap does not touch, first: the simulated calibration loops need them
    // (their notes keep their place in the file, after the overlap's and the chunk's).
    let mut later = Notes::default();
    let context_window = context_window(opts, &m, &mut later)?;
    let kv_capacity_tokens = kv_capacity_tokens(opts, context_window, &mut later)?;
    let max_running = max_running(opts, &mut later)?;
    let engine = simulated::Engine {
        name: opts.name.trim(),
        prefill_tok_s,
        chunk_tokens,
        kv_capacity_tokens,
        max_running,
        context_window,
        kv_read_s_per_ktok: curve.context.as_ref().map(ContextFit::per_ktok),
    };
    // What the step model's subtraction cannot pin, fitted by playing the calibration loops
    // back on the simulator's engine (only where the rows were asked to pin the overlap).
    let analytic = overlap.value;
    let overlap = if overlap.fit.is_some() && curve.subtract {
        simulated::refine(overlap, &curve, &engine)?
    } else {
        overlap
    };
    let moves = curve.moves(overlap.value)?;
    notes
        .fitted
        .extend(decode_notes(&curve, source, opts, overlap.value)?);
    notes.fitted.extend(moves_notes(&moves, m.weight_name));
    notes.fitted.append(&mut m.notes);
    notes
        .fitted
        .extend(curve.context.as_ref().map(ContextFit::note));
    notes.fitted.extend(prefill_note);
    let Overlap { value, note, fit } = overlap;
    if !note.is_empty() {
        if opts.mixed_step.is_some() || fit.is_some() {
            notes.fitted.push(note);
        } else {
            notes.extrapolated.push(note);
        }
    }
    match opts.chunk_tokens {
        None => notes.extrapolated.push(format!(
            "prefill_chunk_tokens (routelab's default {DEFAULT_PREFILL_CHUNK_TOKENS})"
        )),
        Some(c) => notes.fitted.push(format!(
            "prefill_chunk_tokens {c}: the engine's prompt-token budget per step, as given \
             (--chunk-tokens); the closed loops' prefill steps are packed to it"
        )),
    }
    notes.extrapolated.append(&mut later.extrapolated);
    let cold_start = cold_start(m.cold, &moves, &mut notes);

    if let Some(g) = &opts.gpu_names {
        m.gpu_names.clone_from(g);
        m.sources.push("gpu_names from --gpu-names".to_string());
    }
    if let Some(sw) = &sweep {
        m.sources
            .extend(sw.sources.iter().map(|s| format!("{s} (--decode-sweep)")));
    }
    let mut file = RawProfile {
        name: unlocated(opts.name.trim().to_string()),
        description: Some(format!("fitted from {} measurements", source.name())),
        gpu_names: m.gpu_names,
        sources: m.sources,
        fitted: notes.fitted,
        decode: unlocated(write::decode_points(&moves)),
        prefill_tok_s: unlocated(prefill_tok_s),
        prefill_chunk_tokens: Some(unlocated(f64::from(chunk_tokens))),
        prefill_overlap: Some(unlocated(value)),
        kv_read_s_per_ktok: engine.kv_read_s_per_ktok.map(unlocated),
        kv_capacity_tokens: unlocated(kv_capacity_tokens as f64),
        max_running: unlocated(f64::from(max_running)),
        context_window: unlocated(f64::from(context_window)),
        cold_start: cold_start.map(write::cold_start),
        extrapolated: notes.extrapolated,
        uncertainty: None,
    };
    let origin = format!("fitted:{}", opts.name.trim());
    let unwidened = HardwareProfile::from_yaml_str(&write::profile_yaml(source, &file), &origin)?;
    let errors = point_errors(&unwidened, &m.points, sweep.as_ref(), opts.pure_decode);
    // The fit's own error is part of what the profile says: misfit and a poorly pinned
    // overlap widen the speeds' uncertainty, which `routelab plan` varies.
    if let Some(w) = simulated::widen(
        &unwidened,
        &errors,
        &m.points,
        fit.as_ref(),
        &engine,
        &curve,
    )? {
        file.fitted.push(w.note);
        file.uncertainty = Some(
            w.fields
                .iter()
                .map(|(f, u)| (f.name().to_string(), unlocated(*u)))
                .collect(),
        );
    }
    let yaml = write::profile_yaml(source, &file);
    let profile = HardwareProfile::from_yaml_str(&yaml, &origin)?;
    let warnings = warnings(&profile, &m.points, &moves, &errors, opts);
    Ok(FittedProfile {
        analytic_overlap: (value != analytic).then_some(analytic),
        profile,
        yaml,
        moves,
        errors,
        warnings,
        overlap_fit: fit,
    })
}

/// The prefill speed, and the `fitted` note on how it was measured. First, because the
/// subtraction needs it: a prefill speed guessed from the decode curve would be guessed from the
/// very figures it corrects, so the subtraction needs a measured or given one.
fn prefill_speed(
    m: &Measured,
    sweep: Option<(&[Obs], &[f64])>,
    opts: &FitOptions,
    subtract: bool,
    notes: &mut Notes,
) -> Result<(f64, Option<String>), InputError> {
    let mut prefill_note = None;
    let prefill_given = match (opts.prefill_tok_s, &m.prefill) {
        (Some(p), _) => {
            rule::positive(p)
                .map_err(|v| flag_error("--prefill-tok-s", not_valid(&v), v.expected))?;
            notes
                .extrapolated
                .push("prefill_tok_s (from --prefill-tok-s)".to_string());
            Some(p)
        }
        (None, Some((p, how))) => {
            prefill_note = Some(how.clone());
            Some(round_to(*p, 10.0))
        }
        (None, None) => None,
    };
    if subtract && prefill_given.is_none() {
        let closed_rows = m.points.iter().filter(|p| p.closed_loop.is_some()).count();
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
    if let Some(p) = prefill_given {
        return Ok((p, prefill_note));
    }
    // nothing to subtract: the measured values are the decode curve
    let (points, raw): (Vec<Obs>, Vec<f64>) = match sweep {
        Some((points, values)) => (points.to_vec(), values.to_vec()),
        None => {
            let raw: Vec<f64> = m.points.iter().map(|p| p.aggregate_tok_s).collect();
            (pooled_points(&m.points), pooled_values(&m.points, &raw))
        }
    };
    notes.extrapolated.push(format!(
        "prefill_tok_s (not measured: {DEFAULT_PREFILL_PER_DECODE} x the single-sequence \
         decode speed; pass --prefill-tok-s)"
    ));
    let guessed = round_to(
        DEFAULT_PREFILL_PER_DECODE * curve_of(&monotone_points(&points, &raw), 1.0),
        10.0,
    );
    Ok((guessed, prefill_note))
}

/// The `fitted` notes that say which decode figures the curve is made of, first: the one thing
/// a reader must know about the curve.
fn decode_notes(
    curve: &Curve<'_>,
    source: FitSource,
    opts: &FitOptions,
    overlap: f64,
) -> Result<Vec<String>, InputError> {
    let chunk = curve.chunk_tokens;
    let prefill_tok_s = curve.prefill_tok_s;
    let mut notes = Vec::new();
    if let Some(sw) = curve.sweep {
        let taken = match &curve.context {
            Some(cx) => format!(
                "its {} rows at the shortest context ({} tokens), their KV reads taken out \
                 (kv_read_s_per_ktok, below)",
                cx.points.len(),
                cx.short
            ),
            None => "taken as measured".to_string(),
        };
        notes.push(format!(
            "decode aggregate from the pure-decode sweep (--decode-sweep, {} rows): {taken}; \
             the closed-loop rows fit prefill_overlap and are simulated back (below)",
            sw.points.len()
        ));
    }
    if curve.subtract {
        notes.push(format!(
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
        let row_values = decode_values(curve.points, Some(&curve.model(overlap)))?;
        for (p, v) in curve.points.iter().zip(&row_values) {
            if let Some(row) = &p.closed_loop {
                notes.push(format!(
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
    } else if curve.closed_rows > 0 || opts.pure_decode {
        notes.push(
            "decode aggregate from pure-decode rows (--pure-decode): each row's output tok/s \
             is taken as the decode aggregate, nothing subtracted"
                .to_string(),
        );
    } else if source == FitSource::Gateway {
        notes.push(
            "decode aggregate as the gateway measured it, prefill not subtracted: output tokens \
             / time at each observed concurrency, which holds the time prefill steps added \
             beside the decodes (the capacity file records no prompt lengths to subtract it with)"
                .to_string(),
        );
    } else {
        notes.push(
            "decode aggregate from pure-decode rows: the rows give no mean_prompt_tokens and \
             mean_output_tokens, so each aggregate_tok_s is taken as measured with nothing \
             prefilling beside it"
                .to_string(),
        );
    }
    Ok(notes)
}

/// The `fitted` notes on the monotone fit: how it was weighted and every point it moved.
fn moves_notes(moves: &[PointMove], weight_name: &str) -> Vec<String> {
    let moved: Vec<(usize, &PointMove)> = moves
        .iter()
        .enumerate()
        .filter(|(_, mv)| mv.fitted_tok_s != mv.measured_tok_s)
        .collect();
    let largest = moves
        .iter()
        .map(|mv| mv.relative().abs())
        .fold(0.0f64, f64::max);
    let mut notes = vec![format!(
        "decode.points: the decode aggregates made non-decreasing in concurrency, with a \
         per-request speed that does not rise, by weighted least squares (pool-adjacent-violators \
         alternated, Dykstra) weighted by {}; {} of {} points moved, the largest by {:.2} %",
        weight_name,
        moved.len(),
        moves.len(),
        largest * 100.0
    )];
    for (i, mv) in &moved {
        notes.push(format!(
            "decode.points[{i}] (concurrency {}): decode aggregate {} tok/s, fitted {} tok/s \
             ({:+.2} %)",
            mv.concurrency,
            round_to(mv.measured_tok_s, 1e3),
            mv.fitted_tok_s,
            mv.relative() * 100.0
        ));
    }
    notes
}

/// `--chunk-tokens`, checked, else routelab's default.
fn chunk_tokens(opts: &FitOptions) -> Result<u32, InputError> {
    match opts.chunk_tokens {
        Some(0) => Err(flag_error(
            "--chunk-tokens",
            "0 tokens",
            "a whole number >= 1: the engine's prompt-token budget per step (vLLM's \
             max_num_batched_tokens, llama.cpp's --batch-size)",
        )),
        Some(c) => Ok(c),
        None => Ok(DEFAULT_PREFILL_CHUNK_TOKENS),
    }
}

/// `context_window`: the flag's, the source's, or the default.
fn context_window(opts: &FitOptions, m: &Measured, notes: &mut Notes) -> Result<u32, InputError> {
    let context_window = match (opts.context_window, &m.context_window) {
        (Some(c), _) => {
            notes
                .extrapolated
                .push("context_window (from --context-window)".to_string());
            c
        }
        (None, Some((c, _))) => *c,
        (None, None) => {
            notes.extrapolated.push(format!(
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
    Ok(context_window)
}

/// `kv_capacity_tokens`: the flag's (at most the largest a profile may declare, at least the
/// context window), or the default raised to the context window.
fn kv_capacity_tokens(
    opts: &FitOptions,
    context_window: u32,
    notes: &mut Notes,
) -> Result<u64, InputError> {
    let Some(k) = opts.kv_capacity_tokens else {
        let k = DEFAULT_KV_CAPACITY_TOKENS.max(u64::from(context_window));
        notes.extrapolated.push(format!(
            "kv_capacity_tokens (not measured: default {k}; pass --kv-capacity-tokens)"
        ));
        return Ok(k);
    };
    if k > super::super::MAX_KV_CAPACITY_TOKENS {
        return Err(flag_error(
            "--kv-capacity-tokens",
            format!("{k} tokens is above the largest KV cache a profile may declare"),
            format!("at most {}", super::super::MAX_KV_CAPACITY_TOKENS),
        ));
    }
    if k < u64::from(context_window) {
        return Err(flag_error(
            "--kv-capacity-tokens",
            format!("{k} tokens cannot hold one request of the context window ({context_window})"),
            format!("at least the context window, {context_window}"),
        ));
    }
    notes
        .extrapolated
        .push("kv_capacity_tokens (from --kv-capacity-tokens)".to_string());
    Ok(k)
}

/// `max_running`: the flag's (1 up to the largest limit a profile may declare), or vLLM's
/// default.
fn max_running(opts: &FitOptions, notes: &mut Notes) -> Result<u32, InputError> {
    match opts.max_running {
        Some(0) => Err(flag_error(
            "--max-running",
            "0 sequences",
            "a whole number >= 1",
        )),
        Some(n) if n > super::super::MAX_RUNNING_LIMIT => Err(flag_error(
            "--max-running",
            format!("{n} sequences is above the largest limit a profile may declare"),
            format!(
                "a whole number from 1 to {}",
                super::super::MAX_RUNNING_LIMIT
            ),
        )),
        Some(n) => {
            notes
                .extrapolated
                .push("max_running (from --max-running)".to_string());
            Ok(n)
        }
        None => {
            notes.extrapolated.push(format!(
                "max_running (not measured: vLLM's default max_num_seqs {DEFAULT_MAX_RUNNING}; \
                 pass --max-running)"
            ));
            Ok(DEFAULT_MAX_RUNNING)
        }
    }
}

/// `cold_start` from a measured cold burst: `(speed_factor, warmup_tokens)`; none without one.
fn cold_start(
    cold: Option<ColdBurst>,
    moves: &[PointMove],
    notes: &mut Notes,
) -> Option<(f64, f64)> {
    let Some(cold) = cold else {
        notes
            .extrapolated
            .push("cold_start (not measured: no cold penalty)".to_string());
        return None;
    };
    let probe = ProbeConfig::default();
    let warm = curve_of(moves, cold.concurrency);
    let factor = round_to((cold.tok_s / warm).min(1.0), 1e4);
    // The engine's work for one burst: each sequence prefills its prompt, and its first output
    // token comes with the prefill's step, so `output - 1` decode tokens follow. Counting all
    // `output` would leave the next burst a little cold.
    let decode_tokens = probe.output_tokens.saturating_sub(1);
    let warmup = cold.concurrency * f64::from(probe.prompt_tokens + decode_tokens);
    notes.fitted.push(format!(
        "cold_start.speed_factor = cold burst {} tok/s / fitted warm {} tok/s at concurrency {} \
         (capped at 1)",
        cold.tok_s, warm, cold.concurrency
    ));
    notes.extrapolated.push(format!(
        "cold_start.warmup_tokens (assumed: the cold penalty lasts one burst of the probe's \
         shape, the engine's work for it: {} x ({} prompt + {} decode) tokens, the first of the \
         {} output tokens coming with the prefill)",
        cold.concurrency, probe.prompt_tokens, decode_tokens, probe.output_tokens
    ));
    Some((factor, warmup))
}
