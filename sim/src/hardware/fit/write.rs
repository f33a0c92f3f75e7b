//! The fitted profile's YAML text: the profile file's own schema ([`RawProfile`], the structs
//! `HardwareProfile::load` reads) filled from the fit and serialised, after a comment saying how
//! it was made. What is written is read back by `HardwareProfile::from_yaml_str` and checked.

use super::super::schema::{RawColdStart, RawDecode, RawPoint, RawProfile, unlocated};
use super::{FitSource, PointMove};

/// The file's text: the comment, then the profile.
pub(super) fn profile_yaml(source: FitSource, file: &RawProfile) -> String {
    let source = source.name();
    format!(
        "# Fitted by `routelab profile fit --from {source}`; see docs/profiles.md.\n{}",
        file.to_yaml()
    )
}

/// The decode curve: a point per measured concurrency at its fitted aggregate.
pub(super) fn decode_points(moves: &[PointMove]) -> RawDecode {
    let points = moves
        .iter()
        .map(|mv| RawPoint {
            concurrency: unlocated(mv.concurrency),
            aggregate_tok_s: unlocated(mv.fitted_tok_s),
        })
        .collect();
    RawDecode {
        points: Some(points),
        single_tok_s: None,
        saturation_tok_s: None,
        half_concurrency: None,
    }
}

/// The cold start from its `(speed_factor, warmup_tokens)`.
pub(super) fn cold_start((speed_factor, warmup_tokens): (f64, f64)) -> RawColdStart {
    RawColdStart {
        speed_factor: unlocated(speed_factor),
        warmup_tokens: unlocated(warmup_tokens),
    }
}
