//! What the step model's subtraction cannot pin, fitted by simulating the calibration runs, and
//! the fit's own error carried into the profile's `uncertainty`.
//!
//! **The overlap by simulation.** [`super::overlap`] infers `prefill_overlap` analytically: it
//! takes each closed loop's prefill out under an assumed schedule (the loop's prompts packed
//! into full chunks beside every other client's decode) and asks which overlap makes what is
//! left agree with the pure-decode sweep. A real scheduler's loops do not stay bunched, so that
//! overlap can be far from the one that reproduces the loops. [`refine`] plays every closed
//! loop back on the simulator's engine (as `profile fit`'s check does) for overlaps over
//! `[0, 1]` (a grid of [`GRID`] steps, then golden sections around the best) and keeps the
//! value whose loops' output tok/s are closest to the measured ones (least squares of the log
//! ratios, weighted as the rows are), when it is closer than the analytic value; its
//! uncertainty is the jackknife over the rows.
//!
//! **The fit's own error.** [`widen`]: the calibration loops' misfit (the largest relative
//! error of a simulated loop against its measurement), and how far the loops move when the
//! overlap moves by twice its standard error (or by [`EDGE_SPAN`] when it is pinned at an edge
//! of `[0, 1]`, where the data say only that the truth may lie beyond), become the declared
//! uncertainty of the profile's speeds (`prefill_tok_s` and `decode`), never below what the
//! profile's `extrapolated` entries give them already. `routelab plan` varies them.

use routelab_policies::located::InputError;

use super::super::fit_check::{OverlapFit, PointError};
use super::super::schema::{RawProfile, unlocated};
use super::super::{HardwareProfile, UncertainField};
use super::build::Curve;
use super::overlap::Overlap;
use super::report::play;
use super::{ClosedLoop, Obs, write};

/// Grid steps over `[0, 1]` before the golden sections.
const GRID: u32 = 20;
/// Golden-section rounds around the grid's best (the bracket shrinks to 0.618^N of a step).
const GOLDEN_ROUNDS: u32 = 16;
/// How far an overlap pinned at an edge of `[0, 1]` is taken to be uncertain.
pub const EDGE_SPAN: f64 = 0.5;
/// An overlap within this of 0 or 1 is pinned at the edge.
const EDGE: f64 = 0.005;

/// The figures of the engine that the overlap does not change, for the profiles the search
/// plays the loops on.
pub(super) struct Engine<'a> {
    pub(super) name: &'a str,
    pub(super) prefill_tok_s: f64,
    pub(super) chunk_tokens: u32,
    pub(super) kv_capacity_tokens: u64,
    pub(super) max_running: u32,
    pub(super) context_window: u32,
    /// The fitted context term, when there is one (`context.rs`).
    pub(super) kv_read_s_per_ktok: Option<f64>,
}

impl Engine<'_> {
    /// The profile the fit would write at `overlap` (its curve from `curve` at that overlap).
    fn profile(&self, curve: &Curve<'_>, overlap: f64) -> Result<HardwareProfile, InputError> {
        let moves = curve.moves(overlap)?;
        let file = RawProfile {
            name: unlocated(self.name.to_string()),
            description: None,
            gpu_names: Vec::new(),
            sources: Vec::new(),
            fitted: Vec::new(),
            decode: unlocated(write::decode_points(&moves)),
            prefill_tok_s: unlocated(self.prefill_tok_s),
            prefill_chunk_tokens: Some(unlocated(f64::from(self.chunk_tokens))),
            prefill_overlap: Some(unlocated(overlap)),
            kv_read_s_per_ktok: self.kv_read_s_per_ktok.map(unlocated),
            kv_capacity_tokens: unlocated(self.kv_capacity_tokens as f64),
            max_running: unlocated(f64::from(self.max_running)),
            context_window: unlocated(f64::from(self.context_window)),
            cold_start: None,
            extrapolated: Vec::new(),
            uncertainty: None,
        };
        HardwareProfile::from_yaml_str(&file.to_yaml(), &format!("fitted:{}", self.name))
    }
}

/// The closed-loop rows of `points`.
fn loops(points: &[Obs]) -> Vec<(&Obs, ClosedLoop)> {
    points
        .iter()
        .filter_map(|p| p.closed_loop.map(|r| (p, r)))
        .collect()
}

/// Each row's simulated output tok/s and mean TTFT at `overlap` (`None` where no profile can
/// be made).
fn simulated(
    curve: &Curve<'_>,
    engine: &Engine<'_>,
    rows: &[(&Obs, ClosedLoop)],
    overlap: f64,
) -> Option<Vec<(f64, f64)>> {
    let profile = engine.profile(curve, overlap).ok()?;
    Some(
        rows.iter()
            .map(|(p, r)| {
                let s = play(&profile, p, r);
                (s.output_tok_s, s.mean_ttft_s)
            })
            .collect(),
    )
}

/// The weighted mean squared log error of `rows`' output tok/s simulated at `overlap`. (Their
/// mean TTFT is left out: a closed loop's TTFT is mostly its queue for the step budget, where
/// the fluid engine and a step-level one differ more than the overlap moves it; with it, the
/// overlaps `calibration_fit` recovers from a step-level engine's loops moved off the truth.)
fn misfit(
    curve: &Curve<'_>,
    engine: &Engine<'_>,
    rows: &[(&Obs, ClosedLoop)],
    overlap: f64,
) -> f64 {
    let Some(sim) = simulated(curve, engine, rows, overlap) else {
        return f64::INFINITY;
    };
    let (mut sum, mut weight) = (0.0, 0.0);
    for ((p, r), (tok_s, _)) in rows.iter().zip(&sim) {
        sum += p.weight * (tok_s / r.output_tok_s).ln().powi(2);
        weight += p.weight;
    }
    if weight > 0.0 {
        sum / weight
    } else {
        f64::INFINITY
    }
}

/// The overlap in `[0, 1]` (to 4 decimals) that minimises [`misfit`] over `rows`.
fn minimise(curve: &Curve<'_>, engine: &Engine<'_>, rows: &[(&Obs, ClosedLoop)]) -> Option<f64> {
    let f = |o: f64| misfit(curve, engine, rows, o);
    let (best, best_f, mid) =
        crate::hardware::unit_search::minimise_on_unit(f, GRID, GOLDEN_ROUNDS)?;
    let mid = (mid * 1e4).round() / 1e4;
    Some(if f(mid) < best_f { mid } else { best })
}

/// The overlap that best reproduces the closed loops when simulated, in place of the analytic
/// one when it reproduces them better (see the module documentation).
///
/// # Errors
/// None of its own: a profile the search cannot make is a candidate it skips.
pub(super) fn refine(
    analytic: Overlap,
    curve: &Curve<'_>,
    engine: &Engine<'_>,
) -> Result<Overlap, InputError> {
    let rows = loops(curve.points);
    let Some(value) = minimise(curve, engine, &rows) else {
        return Ok(analytic);
    };
    let (before, after) = (
        misfit(curve, engine, &rows, analytic.value),
        misfit(curve, engine, &rows, value),
    );
    if after >= before {
        return Ok(analytic);
    }
    let std_error = (rows.len() >= 2)
        .then(|| {
            let leave_out: Vec<f64> = (0..rows.len())
                .filter_map(|i| {
                    let rest: Vec<(&Obs, ClosedLoop)> = rows
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, r)| *r)
                        .collect();
                    minimise(curve, engine, &rest)
                })
                .collect();
            let n = leave_out.len() as f64;
            let mean = leave_out.iter().sum::<f64>() / n;
            ((n - 1.0) / n * leave_out.iter().map(|o| (o - mean).powi(2)).sum::<f64>()).sqrt()
        })
        .filter(|s| s.is_finite());
    let note = format!(
        "prefill_overlap {value}{} fitted by simulating the {} closed-loop rows on the \
         simulator's engine with the profile each overlap gives (a grid of {GRID} steps over [0, \
         1], then golden sections): their output tok/s within {:.2} % of the measured (root mean \
         square of the log ratios), where the step model's subtraction's overlap {} gave {:.2} \
         %. The subtraction: {}",
        std_error
            .map(|e| format!(" ± {e:.3} (jackknife standard error over the rows)"))
            .unwrap_or_default(),
        rows.len(),
        after.sqrt() * 100.0,
        analytic.value,
        before.sqrt() * 100.0,
        analytic.note
    );
    let fit = analytic.fit.map(|f| OverlapFit {
        value,
        std_error,
        against: "the closed loops, simulated",
        ..f
    });
    Ok(Overlap { value, note, fit })
}

/// The declared uncertainty the fit's own error gives the profile's speeds, and its note.
pub(super) struct Widened {
    /// `prefill_tok_s` and `decode`, each at least what the profile gave it already.
    pub(super) fields: Vec<(UncertainField, f64)>,
    /// The `fitted` note that says where it comes from.
    pub(super) note: String,
}

/// The uncertainty the calibration loops' misfit and the overlap's own uncertainty give the
/// speeds (module documentation); `None` when it is below 1 %.
///
/// # Errors
/// None of its own: an overlap whose profile cannot be made adds nothing.
pub(super) fn widen(
    profile: &HardwareProfile,
    errors: &[PointError],
    points: &[Obs],
    fit: Option<&OverlapFit>,
    engine: &Engine<'_>,
    curve: &Curve<'_>,
) -> Result<Option<Widened>, InputError> {
    let misfit = errors
        .iter()
        .filter(|e| e.what == "closed-loop output tok/s")
        .map(|e| e.relative().abs())
        .fold(0.0f64, f64::max);
    let mut overlap_part = None;
    if let Some(f) = fit.filter(|_| curve.subtract) {
        let edge = f.value <= EDGE || f.value >= 1.0 - EDGE;
        let span = if edge {
            EDGE_SPAN
        } else {
            f.std_error.map_or(0.0, |s| (2.0 * s).min(EDGE_SPAN))
        };
        if span > 0.0 {
            let rows = loops(points);
            let at = simulated(curve, engine, &rows, f.value);
            let mut moved = 0.0f64;
            for o in [f.value - span, f.value + span] {
                let o = o.clamp(0.0, 1.0);
                if o == f.value {
                    continue;
                }
                if let (Some(at), Some(there)) = (&at, simulated(curve, engine, &rows, o)) {
                    for (a, b) in at.iter().zip(&there) {
                        moved = moved.max((b.0 / a.0 - 1.0).abs());
                    }
                }
            }
            overlap_part = Some((edge, span, moved));
        }
    }
    let u = misfit.max(overlap_part.map_or(0.0, |(_, _, m)| m));
    let u = (u * 100.0).ceil() / 100.0;
    if u < 0.01 {
        return Ok(None);
    }
    let fields: Vec<(UncertainField, f64)> = [UncertainField::PrefillTokS, UncertainField::Decode]
        .into_iter()
        .map(|field| {
            (
                field,
                u.max(profile.uncertainty(field).unwrap_or(0.0)).min(0.99),
            )
        })
        .collect();
    let overlap_text = match (overlap_part, fit) {
        (Some((edge, span, moved)), Some(f)) => format!(
            "; prefill_overlap {}{} moves them by up to {:.1} % over {:.3} to {:.3}",
            f.value,
            if edge {
                format!(" is pinned at an edge of [0, 1] (taken as uncertain by ±{span})")
            } else {
                format!(" ± {:.3}", span / 2.0)
            },
            moved * 100.0,
            (f.value - span).max(0.0),
            (f.value + span).min(1.0)
        ),
        _ => String::new(),
    };
    let note = format!(
        "uncertainty of prefill_tok_s and decode (±{:.0} % at least): the fit's own error. The \
         closed-loop rows simulated on the fitted profile miss by up to {:.1} %{overlap_text}; \
         routelab plan varies the speeds by it",
        u * 100.0,
        misfit * 100.0
    );
    Ok(Some(Widened { fields, note }))
}
