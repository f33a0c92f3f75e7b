//! `prefill_overlap`: given (`--prefill-overlap`), fitted to one measured mixed step
//! (`--mixed-step`), inferred from the closed-loop rows (against a `--decode-sweep` or against
//! each other), or routelab's default.

use routelab_policies::located::{InputError, rule};

use super::super::DEFAULT_PREFILL_OVERLAP;
use super::super::fit_check::{OverlapFit, OverlapRow, infer_overlap, informative};
use super::build::Curve;
use super::context;
use super::curve::{curve_of, monotone_points};
use super::{FitOptions, MixedStep, StepModel, flag_error, not_valid};

/// Rounds that bring `--mixed-step`'s overlap and the closed-loop rows' subtraction to agree at
/// most (each round moves the overlap by a small fraction of the last move: the rows' prefill
/// is a small share of their time).
const OVERLAP_ROUNDS: usize = 200;

/// The overlap the profile gets.
pub(super) struct Overlap {
    /// Its value.
    pub(super) value: f64,
    /// The note on where it comes from (empty for the default, whose note is already among
    /// the `extrapolated` ones).
    pub(super) note: String,
    /// The fit to the closed-loop rows, when it was inferred from them.
    pub(super) fit: Option<OverlapFit>,
}

/// The overlap of `opts` (given or fitted to a mixed step), else inferred from the rows, else
/// the default (said in `extrapolated`).
pub(super) fn choose(
    curve: &Curve<'_>,
    opts: &FitOptions,
    extrapolated: &mut Vec<String>,
) -> Result<Overlap, InputError> {
    let (value, note) = match (opts.prefill_overlap, opts.mixed_step) {
        (Some(_), Some(_)) => {
            return Err(flag_error(
                "--prefill-overlap",
                "given with --mixed-step, which fits the overlap",
                "one of --prefill-overlap F and --mixed-step N:PROMPT_TOKENS:STEP_MS",
            ));
        }
        (Some(o), None) => given(o)?,
        (None, Some(step)) => from_mixed_step(curve, &step)?,
        (None, None) => return inferred(curve, extrapolated),
    };
    Ok(Overlap {
        value,
        note,
        fit: None,
    })
}

/// `--prefill-overlap`, checked to be a share.
fn given(o: f64) -> Result<(f64, String), InputError> {
    rule::fraction(o).map_err(|v| {
        flag_error(
            "--prefill-overlap",
            not_valid(&v),
            format!(
                "{}: the share of a mixed step's shorter part hidden under the longer (0 = \
                 additive, 1 = a prefill under the decode adds nothing)",
                v.expected
            ),
        )
    })?;
    Ok((o, "prefill_overlap (from --prefill-overlap)".to_string()))
}

/// The overlap that makes the fitted curve reproduce `step`. The mixed step's decode part is
/// read from the curve the closed-loop rows' subtraction gives, which depends on the overlap:
/// the two are alternated until they agree.
fn from_mixed_step(curve: &Curve<'_>, step: &MixedStep) -> Result<(f64, String), InputError> {
    let prefill_tok_s = curve.prefill_tok_s;
    let mut overlap = DEFAULT_PREFILL_OVERLAP;
    let mut settled = false;
    for _ in 0..OVERLAP_ROUNDS {
        let moves = curve.moves(overlap)?;
        let next = step
            .overlap(curve_of(&moves, f64::from(step.decoding)), prefill_tok_s)
            .map_err(|e| {
                flag_error(
                    MixedStep::FLAG,
                    e.to_string(),
                    "a step measured with N sequences decoding beside PROMPT_TOKENS prompt \
                     tokens, between the longer part alone and the two added (the decode part \
                     from the fitted curve at N, the prefill part from prefill_tok_s)",
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
                "the mixed step and the closed-loop rows do not settle on one overlap in \
                 {OVERLAP_ROUNDS} rounds (last {overlap:.6})"
            ),
            "a mixed step measured where the rows' prefill is a small share of their time, or \
             --prefill-overlap F",
        ));
    }
    // written to 4 decimals, and the subtraction uses what is written
    let overlap = (overlap * 1e4).round() / 1e4;
    let d_s = f64::from(step.decoding) / curve_of(&curve.moves(overlap)?, f64::from(step.decoding));
    let note = format!(
        "prefill_overlap {overlap} from one mixed step (--mixed-step): {} sequences decoding \
         ({:.3} ms alone, from the fitted curve) beside {} prompt tokens ({:.3} ms alone at \
         prefill_tok_s) took {:.3} ms",
        step.decoding,
        d_s * 1e3,
        step.prompt_tokens,
        f64::from(step.prompt_tokens) / prefill_tok_s * 1e3,
        step.step_s * 1e3
    );
    Ok((overlap, note))
}

/// The overlap the closed-loop rows pin (against the sweep, or rows of one concurrency against
/// each other), else the default; with a sweep and no row that can pin it, an error.
fn inferred(curve: &Curve<'_>, extrapolated: &mut Vec<String>) -> Result<Overlap, InputError> {
    let groups = curve.curve_points.len() < curve.points.len();
    let fit = if curve.subtract && (curve.sweep.is_some() || groups) {
        overlap_from_rows(curve, &curve.model(0.0))
    } else {
        None
    };
    match fit {
        Some(of) => {
            let value = (of.value * 1e4).round() / 1e4;
            let per_row: Vec<String> = of
                .per_row
                .iter()
                .map(|(c, o)| format!("{c}: {o:.3}"))
                .collect();
            let note = format!(
                "prefill_overlap {value}{} fitted to {} closed-loop rows against {}: the overlap \
                 whose prefill subtraction brings their decode aggregates to agree, in least \
                 squares of the log ratios (each row alone, by concurrency: {})",
                of.std_error
                    .map(|e| format!(" ± {e:.3} (jackknife standard error)"))
                    .unwrap_or_default(),
                of.per_row.len(),
                of.against,
                per_row.join(", ")
            );
            Ok(Overlap {
                value,
                note,
                fit: Some(OverlapFit { value, ..of }),
            })
        }
        None if curve.sweep.is_some() => Err(flag_error(
            "--decode-sweep",
            "the closed-loop rows cannot pin prefill_overlap: in none of them does a prefill run \
             beside decodes under the step model (one client, or every loop's prompts fit one \
             prefill step), so no overlap changes their decode aggregate",
            format!(
                "closed loops at concurrency >= 2 whose clients' prompts together exceed the \
                 prefill chunk ({} tokens), or --prefill-overlap F",
                curve.chunk_tokens
            ),
        )),
        None => {
            extrapolated.push(format!(
                "prefill_overlap (not measured: routelab's default {DEFAULT_PREFILL_OVERLAP}, \
                 fitted to the one published mixed step; pass --mixed-step, --prefill-overlap, \
                 or --decode-sweep with the closed-loop rows)"
            ));
            Ok(Overlap {
                value: DEFAULT_PREFILL_OVERLAP,
                note: String::new(),
                fit: None,
            })
        }
    }
}

/// The closed-loop rows of `points` that can say something about the overlap, held against the
/// sweep's curve when there is one ([`Curve::sweep_values`]), else against the other
/// rows of their concurrency; the fitted overlap ([`infer_overlap`]).
fn overlap_from_rows(curve: &Curve<'_>, model: &StepModel) -> Option<OverlapFit> {
    let sweep_moves = curve
        .sweep_values
        .as_ref()
        .map(|v| monotone_points(&curve.curve_points, v));
    let mut group = 0usize;
    let mut last_c = None;
    let mut rows = Vec::new();
    for p in curve.points {
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
            // the sweep's decode at the loop's own context
            reference: sweep_moves.as_ref().map(|mv| {
                let n = p.concurrency;
                let context = context::decode_context(row.prompt_tokens, row.output_tokens);
                curve.at_context(n, curve_of(mv, n), context)
            }),
            group,
        });
    }
    infer_overlap(&rows, model)
}
