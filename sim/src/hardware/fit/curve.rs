//! The decode curve through the measured points: rows of one concurrency pooled, the closest
//! curve that keeps a profile's two rules ([`decode_shape`], over [`isotonic`]), each point's
//! move, and the decode aggregate of each point ([`decode_values`]).

use routelab_policies::located::InputError;

use super::super::{DecodeCurve, DecodePoint};
use super::{Obs, PointMove, StepModel, round_to};

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

/// The points of `points` with one concurrency pooled into one (weights added; the first
/// row's place kept for errors). `points` are in non-decreasing concurrency.
pub(super) fn pooled_points(points: &[Obs]) -> Vec<Obs> {
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
pub(super) fn pooled_values(points: &[Obs], values: &[f64]) -> Vec<f64> {
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
pub(super) fn monotone_points(points: &[Obs], values: &[f64]) -> Vec<PointMove> {
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
pub(super) fn curve_of(moves: &[PointMove], concurrency: f64) -> f64 {
    DecodeCurve::Points(
        moves
            .iter()
            .map(|mv| DecodePoint {
                concurrency: mv.concurrency,
                aggregate_tok_s: mv.fitted_tok_s,
            })
            .collect(),
    )
    .aggregate_tok_s(concurrency)
}

/// Each point's decode aggregate: the measured figure of a pure-decode point, the closed-loop
/// figure with its prompts' prefill subtracted ([`ClosedLoop::decode_aggregate`]) otherwise.
pub(super) fn decode_values(
    points: &[Obs],
    subtract: Option<&StepModel>,
) -> Result<Vec<f64>, InputError> {
    points
        .iter()
        .map(|p| match (&p.closed_loop, subtract) {
            // a derived figure is written to 0.001 tok/s, like a pooled mean
            (Some(row), Some(model)) => row
                .decode_aggregate(model)
                .map(|a| round_to(a, 1e3))
                .map_err(|msg| {
                    InputError::new(&p.at.file, &p.at.field, msg.to_string())
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
