//! The one step-time model: how long an engine step lasts that decodes a batch and prefills
//! some prompt tokens beside it. Both engine modes (the fluid `FluidEngine` and the step-level
//! one) and `routelab profile fit` time a step with [`mixed_step_s`], and nothing else.
//!
//! A profile holds two *measured* quantities: the decode curve (aggregate tokens/s with `n`
//! sequences decoding and nothing prefilling, so a decode-only step lasts
//! `d = n / aggregate(n)`) and `prefill_tok_s` (prompt tokens/s with nothing decoding, so `c`
//! prompt tokens alone take `p = c / prefill_tok_s`). A step that carries both is not `d + p`:
//! decoding a batch is bound by memory bandwidth (every step reads the weights and the batch's
//! KV), prefill by compute, so on a GPU the prefill largely runs while the decode waits on
//! memory. The step lasts the longer of the two plus the part of the shorter that does not
//! hide under it:
//!
//! ```text
//! step = max(d, p) + (1 - overlap) * min(d, p)
//! ```
//!
//! `overlap = 1` is the roofline bound (a prefill that fits under the decode adds nothing),
//! `overlap = 0` the additive model of earlier versions. The default,
//! [`DEFAULT_PREFILL_OVERLAP`], is fitted to the one published mixed-batch measurement we have
//! (issue 15's step-level model of vLLM's scheduler: a 256-wide decode step of 11.0 ms beside
//! 539 prompt tokens at 16.4 µs each, 8.84 ms alone, took 16.3 ms together, so
//! `overlap = (11.0 + 8.84 - 16.3) / 8.84 = 0.40`). A user with their own mixed-batch
//! measurement fits their card's value with [`overlap_from_mixed_step`]
//! (`routelab profile fit --mixed-step`).

// The formula and its default live in the policy crate, below both the simulator and the
// gateway's router, whose `predictive` chooser predicts TTFT with the same step model.
pub use routelab_policies::capacity::{DEFAULT_PREFILL_OVERLAP, mixed_step_s};

/// Why a measured mixed step implies no overlap ([`overlap_from_mixed_step`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OverlapError {
    /// A length is not a finite number of seconds > 0.
    #[error("{name} = {seconds} s: must be a finite number of seconds > 0")]
    NotPositive {
        /// Which length.
        name: &'static str,
        /// Its value, seconds.
        seconds: f64,
    },
    /// The step is shorter than its longer part alone or longer than the two added: an overlap
    /// outside `[0, 1]`.
    #[error(
        "a step of {:.3} ms cannot carry a decode of {:.3} ms and a prefill of {:.3} ms (it \
         would be an overlap of {overlap:.3}); a mixed step lasts between the longer part alone \
         ({:.3} ms, overlap 1) and the two added ({:.3} ms, overlap 0)",
        step_s * 1e3,
        decode_s * 1e3,
        prefill_s * 1e3,
        decode_s.max(*prefill_s) * 1e3,
        (decode_s + prefill_s) * 1e3
    )]
    OutsideTheModel {
        /// The decode-only step, seconds.
        decode_s: f64,
        /// The prefill alone, seconds.
        prefill_s: f64,
        /// The measured step, seconds.
        step_s: f64,
        /// The overlap it would be.
        overlap: f64,
    },
}

/// The overlap a measured mixed step implies: a step that decoded a batch whose decode-only
/// step lasts `decode_s`, beside prompt tokens that alone take `prefill_s`, measured at
/// `step_s`. The inverse of [`mixed_step_s`].
///
/// # Errors
/// [`OverlapError`], saying what is valid, when a number is not finite and positive, or when
/// the measured step is shorter than its longer part alone or longer than the two added (the
/// model cannot express either: an overlap outside `[0, 1]`).
pub fn overlap_from_mixed_step(
    decode_s: f64,
    prefill_s: f64,
    step_s: f64,
) -> Result<f64, OverlapError> {
    for (name, seconds) in [
        ("the decode-only step", decode_s),
        ("the prefill alone", prefill_s),
        ("the measured step", step_s),
    ] {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(OverlapError::NotPositive { name, seconds });
        }
    }
    let long = decode_s.max(prefill_s);
    let short = decode_s.min(prefill_s);
    let overlap = (long + short - step_s) / short;
    if !(0.0..=1.0).contains(&overlap) {
        return Err(OverlapError::OutsideTheModel {
            decode_s,
            prefill_s,
            step_s,
            overlap,
        });
    }
    Ok(overlap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_steps_keep_their_measured_length() {
        for o in [0.0, 0.4, 1.0] {
            assert_eq!(mixed_step_s(0.011, 0.0, o), 0.011);
            assert_eq!(mixed_step_s(0.0, 0.009, o), 0.009);
        }
    }

    #[test]
    fn overlap_spans_roofline_to_additive() {
        let (d, p) = (0.011, 539.0 * 16.4e-6);
        assert!((mixed_step_s(d, p, 0.0) - (d + p)).abs() < 1e-15);
        assert_eq!(
            mixed_step_s(d, p, 1.0),
            d,
            "a prefill under the decode adds nothing"
        );
        // the default reproduces the published mixed step within 1 %
        let s = mixed_step_s(d, p, DEFAULT_PREFILL_OVERLAP);
        assert!((s / 0.0163 - 1.0).abs() < 0.01, "{s}");
        // and the prefill-bound side is symmetric
        assert_eq!(mixed_step_s(0.002, 0.03, 1.0), 0.03);
    }

    #[test]
    fn the_measurement_inverts() {
        let (d, p) = (0.011, 539.0 * 16.4e-6);
        let o = overlap_from_mixed_step(d, p, 0.0163).unwrap();
        assert!((o - 0.40).abs() < 0.005, "{o}");
        assert!((mixed_step_s(d, p, o) - 0.0163).abs() < 1e-12);
        let e = overlap_from_mixed_step(d, p, 0.010)
            .unwrap_err()
            .to_string();
        assert!(e.contains("between the longer part alone"), "{e}");
        let e = overlap_from_mixed_step(d, p, 0.025)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlap 0"), "{e}");
        let e = overlap_from_mixed_step(f64::NAN, p, 0.016)
            .unwrap_err()
            .to_string();
        assert!(e.contains("decode-only step"), "{e}");
    }
}
