//! How far a profile's fields may be off: the `uncertainty:` a profile declares for the fields
//! it could not measure, and the default an `extrapolated` field gets without one. `routelab
//! plan` runs the fleet with each uncertain field at the low and the high end
//! ([`HardwareProfile::with_field_scaled`], [`crate::Scenario::uncertain_fleets`]).
//!
//! ```yaml
//! uncertainty: { prefill_tok_s: 0.3, decode: 0.15 }   # ±30 %, ±15 %
//! extrapolated: [prefill_tok_s, all of decode (…)]
//! ```
//!
//! **Which fields.** The two that set a worker's speed: `prefill_tok_s` and `decode` (every
//! aggregate rate of the curve scaled alike, so its shape stays). A field is uncertain when
//! the profile declares an uncertainty for it (whether or not `extrapolated` lists it: the
//! declaration is the marking), or when an `extrapolated` entry names it (its first word, after
//! an optional `all of`: `decode.points[2] (…)` names `decode`) and then it gets
//! [`DEFAULT_EXTRAPOLATED_UNCERTAINTY`]. A declared 0 marks an extrapolated field as certain.

use super::{DecodeCurve, DecodePoint, HardwareProfile, StepTimes};
use routelab_policies::InputError;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

/// The relative uncertainty of a field an `extrapolated` entry names and `uncertainty` does not:
/// ±30 %, the spread by which issue 41's user found a bundled extrapolated profile's
/// `prefill_tok_s` moved a fleet's capacity by -41 % and +30 % and flipped the ranking.
pub const DEFAULT_EXTRAPOLATED_UNCERTAINTY: f64 = 0.3;

/// A profile field whose uncertainty the plan varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UncertainField {
    /// `prefill_tok_s`.
    PrefillTokS,
    /// Every aggregate rate of `decode`.
    Decode,
}

impl UncertainField {
    /// Every such field, in the order conditions are listed.
    pub const ALL: [UncertainField; 2] = [UncertainField::PrefillTokS, UncertainField::Decode];

    /// Its name in a profile.
    pub const fn name(self) -> &'static str {
        match self {
            UncertainField::PrefillTokS => "prefill_tok_s",
            UncertainField::Decode => "decode",
        }
    }

    fn from_name(s: &str) -> Option<UncertainField> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// What would be valid in `uncertainty:`, said in its errors.
const VALID: &str = "a mapping of prefill_tok_s and/or decode to a fraction in [0, 1), e.g. \
                     `uncertainty: { prefill_tok_s: 0.3 }` for ±30 %";

/// The declared uncertainties, validated.
pub(super) fn validate(
    origin: &str,
    raw: Option<&BTreeMap<String, Spanned<f64>>>,
) -> Result<Vec<(UncertainField, f64)>, InputError> {
    let mut out = Vec::new();
    for (key, v) in raw.into_iter().flatten() {
        let field = format!("uncertainty.{key}");
        let at = |message: String| {
            InputError::new(origin, &field, message)
                .valid(VALID)
                .at_location(v.referenced)
        };
        let Some(f) = UncertainField::from_name(key) else {
            return Err(at(format!(
                "`{key}` is not a field whose uncertainty is varied (only the speeds are)"
            )));
        };
        let u = v.value;
        if !(u.is_finite() && (0.0..1.0).contains(&u)) {
            return Err(at(format!(
                "{u} is not a relative uncertainty (a field cannot be off by {}100 % or more)",
                if u < 0.0 { "a negative amount or " } else { "" }
            )));
        }
        out.push((f, u));
    }
    Ok(out)
}

/// Whether an `extrapolated` entry names `field`: its first word, after an optional `all of`.
fn names(entry: &str, field: UncertainField) -> bool {
    let e = entry.trim();
    let e = e.strip_prefix("all of ").unwrap_or(e).trim_start();
    let word: String = e
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    word == field.name()
}

impl HardwareProfile {
    /// How far `field` may be off, as a fraction (`None`: not uncertain). See the module
    /// documentation for the rule.
    pub fn uncertainty(&self, field: UncertainField) -> Option<f64> {
        let declared = self
            .uncertainty
            .iter()
            .find(|(f, _)| *f == field)
            .map(|&(_, u)| u);
        let u = declared.or_else(|| {
            self.extrapolated
                .iter()
                .any(|e| names(e, field))
                .then_some(DEFAULT_EXTRAPOLATED_UNCERTAINTY)
        })?;
        (u > 0.0).then_some(u)
    }

    /// This profile with `field` multiplied by `factor` (> 0).
    #[must_use]
    pub fn with_field_scaled(&self, field: UncertainField, factor: f64) -> HardwareProfile {
        let mut p = self.clone();
        match field {
            UncertainField::PrefillTokS => p.prefill_tok_s *= factor,
            UncertainField::Decode => {
                // the whole decode step is the speed: its KV reads scale with the curve
                p.kv_read_s_per_tok /= factor;
                p.decode = match &self.decode {
                    DecodeCurve::Points(points) => DecodeCurve::Points(
                        points
                            .iter()
                            .map(|d| DecodePoint {
                                concurrency: d.concurrency,
                                aggregate_tok_s: d.aggregate_tok_s * factor,
                            })
                            .collect(),
                    ),
                    DecodeCurve::Parametric {
                        single_tok_s,
                        saturation_tok_s,
                        half_concurrency,
                    } => DecodeCurve::Parametric {
                        single_tok_s: single_tok_s * factor,
                        saturation_tok_s: saturation_tok_s * factor,
                        half_concurrency: *half_concurrency,
                    },
                };
            }
        }
        // The step-time table is the old speed's.
        p.step_times = StepTimes::default();
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "\
name: t
decode:
  points:
    - { concurrency: 1, aggregate_tok_s: 100 }
    - { concurrency: 8, aggregate_tok_s: 400 }
prefill_tok_s: 4000
kv_capacity_tokens: 100000
max_running: 32
context_window: 8192
";

    fn profile(extra: &str) -> Result<HardwareProfile, InputError> {
        HardwareProfile::from_yaml_str(&format!("{BASE}{extra}"), "p.yaml")
    }

    #[test]
    fn declared_extrapolated_and_default_uncertainties() {
        let p = profile("").unwrap();
        assert_eq!(p.uncertainty(UncertainField::PrefillTokS), None);
        let p = profile("extrapolated: [prefill_tok_s, \"all of decode (from a sibling card)\"]\n")
            .unwrap();
        assert_eq!(
            p.uncertainty(UncertainField::PrefillTokS),
            Some(DEFAULT_EXTRAPOLATED_UNCERTAINTY)
        );
        assert_eq!(
            p.uncertainty(UncertainField::Decode),
            Some(DEFAULT_EXTRAPOLATED_UNCERTAINTY)
        );
        // Declared: wins over the default; declared without being extrapolated still counts;
        // a declared 0 makes an extrapolated field certain.
        let p = profile(
            "extrapolated: [\"decode.points[1] (fitted)\", prefill_tok_s]\n\
             uncertainty: { decode: 0.1, prefill_tok_s: 0 }\n",
        )
        .unwrap();
        assert_eq!(p.uncertainty(UncertainField::Decode), Some(0.1));
        assert_eq!(p.uncertainty(UncertainField::PrefillTokS), None);
        let p = profile("uncertainty: { prefill_tok_s: 0.2 }\n").unwrap();
        assert_eq!(p.uncertainty(UncertainField::PrefillTokS), Some(0.2));
        // `prefill_chunk_tokens` is not `prefill_tok_s`.
        let p = profile("extrapolated: [prefill_chunk_tokens]\n").unwrap();
        assert_eq!(p.uncertainty(UncertainField::PrefillTokS), None);
    }

    #[test]
    fn bad_uncertainties_are_located_errors() {
        for (text, field, says) in [
            (
                "uncertainty: { prefill_tok_s: -0.1 }\n",
                "uncertainty.prefill_tok_s",
                "negative",
            ),
            (
                "uncertainty: { decode: 1 }\n",
                "uncertainty.decode",
                "100 % or more",
            ),
            (
                "uncertainty: { decode: .nan }\n",
                "uncertainty.decode",
                "not a relative",
            ),
            (
                "uncertainty: { max_running: 0.2 }\n",
                "uncertainty.max_running",
                "not a field",
            ),
        ] {
            let e = profile(text).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(says), "{e}");
            assert_eq!(e.line, Some(10), "{e}");
            assert!(e.to_string().contains("prefill_tok_s and/or decode"), "{e}");
        }
    }

    #[test]
    fn scaling_a_field_scales_the_speed_it_sets() {
        let p = profile("").unwrap();
        let slow = p.with_field_scaled(UncertainField::PrefillTokS, 0.7);
        assert!((slow.prefill_tok_s() - 2800.0).abs() < 1e-9);
        assert_eq!(slow.decode(), p.decode());
        let fast = p.with_field_scaled(UncertainField::Decode, 1.3);
        assert!((fast.aggregate_tok_s(8.0) - 520.0).abs() < 1e-9);
        // The step times are the new speed's (the table is not carried over).
        let _ = p.step_time_s(8.0);
        let fast = p.with_field_scaled(UncertainField::Decode, 1.3);
        assert!((fast.step_time_s(8.0) * 1.3 - p.step_time_s(8.0)).abs() < 1e-9);
    }
}
