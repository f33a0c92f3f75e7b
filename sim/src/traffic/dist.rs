//! Length and duration distributions, stop conditions and the generators' RNG.

use rand::RngExt;
use rand_distr::{Distribution, Exp1, StandardNormal};
use serde::{Deserialize, Serialize};

use super::TrafficError;

/// The random generator every synthetic source owns (seeded with `seed_from_u64`).
pub type SourceRng = rand::rngs::Xoshiro256PlusPlus;

pub(crate) fn rng_from_seed(seed: u64) -> SourceRng {
    <SourceRng as rand::SeedableRng>::seed_from_u64(seed)
}

/// A standard exponential sample (mean 1).
#[inline]
pub(crate) fn exp1(rng: &mut SourceRng) -> f64 {
    Exp1.sample(rng)
}

/// Distribution of a token count. Every sample is at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthDist {
    /// Always this many tokens (≥ 1).
    Fixed(u32),
    /// Uniform on `min..=max` (1 ≤ min ≤ max).
    Uniform {
        /// Smallest value.
        min: u32,
        /// Largest value (inclusive).
        max: u32,
    },
    /// `round(median · exp(sigma · N(0,1)))`, clamped to `[1, max]`.
    LogNormal {
        /// Median (≥ 1).
        median: f64,
        /// Log-space standard deviation (≥ 0).
        sigma: f64,
        /// Upper clamp (≥ 1).
        max: u32,
    },
    /// `round(Exp(mean))`, clamped to `[1, u32::MAX]`.
    Exponential {
        /// Mean before rounding and clamping (> 0).
        mean: f64,
    },
}

impl LengthDist {
    /// Check the parameters; `generator`/`field` name the configuration in the error.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] when a parameter is out of range.
    pub fn validate(
        &self,
        generator: &'static str,
        field: &'static str,
    ) -> Result<(), TrafficError> {
        let bad = |p: String| Err(TrafficError::config(generator, field, p));
        match *self {
            Self::Fixed(0) => bad("is fixed(0); expected a token count >= 1".into()),
            Self::Uniform { min, max } if min == 0 || min > max => bad(format!(
                "is uniform{{min: {min}, max: {max}}}; expected 1 <= min <= max"
            )),
            Self::LogNormal { median, sigma, max }
                if !(median.is_finite() && median >= 1.0 && sigma.is_finite() && sigma >= 0.0)
                    || max == 0 =>
            {
                bad(format!(
                    "is log_normal{{median: {median}, sigma: {sigma}, max: {max}}}; expected \
                     finite median >= 1, finite sigma >= 0, max >= 1"
                ))
            }
            Self::Exponential { mean } if !(mean.is_finite() && mean > 0.0) => bad(format!(
                "is exponential{{mean: {mean}}}; expected a finite mean > 0"
            )),
            _ => Ok(()),
        }
    }

    /// The distribution's mean, tokens (a log-normal's before its clamp: an upper estimate).
    #[must_use]
    pub fn mean(&self) -> f64 {
        match *self {
            Self::Fixed(n) => f64::from(n),
            Self::Uniform { min, max } => (f64::from(min) + f64::from(max)) / 2.0,
            Self::LogNormal { median, sigma, max } => {
                (median * (sigma * sigma / 2.0).exp()).min(f64::from(max))
            }
            Self::Exponential { mean } => mean.max(1.0),
        }
    }

    /// Draw one value (≥ 1).
    #[inline]
    pub fn sample(&self, rng: &mut SourceRng) -> u32 {
        match *self {
            Self::Fixed(n) => n,
            Self::Uniform { min, max } => {
                if min == max {
                    min
                } else {
                    rng.random_range(min..=max)
                }
            }
            Self::LogNormal { median, sigma, max } => {
                let z: f64 = StandardNormal.sample(rng);
                let v = (median * (sigma * z).exp()).round();
                // `as` saturates (NaN -> 0), the clamp restores the range.
                (v.min(f64::from(u32::MAX)) as u32).clamp(1, max)
            }
            Self::Exponential { mean } => {
                let v = (mean * exp1(rng)).round();
                (v.min(f64::from(u32::MAX)) as u32).max(1)
            }
        }
    }
}

/// Distribution of a duration in nanoseconds (think times, idle gaps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DurationDist {
    /// Always this many ns.
    Fixed(u64),
    /// Uniform on `min..=max` ns.
    Uniform {
        /// Shortest duration, ns.
        min: u64,
        /// Longest duration (inclusive), ns.
        max: u64,
    },
    /// Exponential with this mean, ns (`mean: 0` means always 0).
    Exponential {
        /// Mean, ns.
        mean: u64,
    },
}

impl DurationDist {
    /// Every duration divided by `factor` (> 0): what a source whose gaps shrink when its
    /// arrival rate is multiplied by `factor` draws. A factor of 1 leaves it unchanged.
    #[must_use]
    pub fn divided_by(&self, factor: f64) -> Self {
        match *self {
            Self::Fixed(d) => Self::Fixed(divide_ns(d, factor)),
            Self::Uniform { min, max } => Self::Uniform {
                min: divide_ns(min, factor),
                max: divide_ns(max, factor),
            },
            Self::Exponential { mean } => Self::Exponential {
                mean: divide_ns(mean, factor),
            },
        }
    }

    /// Check the parameters.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] when `min > max`.
    pub fn validate(
        &self,
        generator: &'static str,
        field: &'static str,
    ) -> Result<(), TrafficError> {
        match *self {
            Self::Uniform { min, max } if min > max => Err(TrafficError::config(
                generator,
                field,
                format!("is uniform{{min: {min}, max: {max}}}; expected min <= max"),
            )),
            _ => Ok(()),
        }
    }

    /// The distribution's mean, ns.
    #[must_use]
    pub fn mean_ns(&self) -> f64 {
        match *self {
            Self::Fixed(d) => d as f64,
            Self::Uniform { min, max } => (min as f64 + max as f64) / 2.0,
            Self::Exponential { mean } => mean as f64,
        }
    }

    /// Draw one duration, ns.
    #[inline]
    pub fn sample(&self, rng: &mut SourceRng) -> u64 {
        match *self {
            Self::Fixed(d) => d,
            Self::Uniform { min, max } => {
                if min == max {
                    min
                } else {
                    rng.random_range(min..=max)
                }
            }
            Self::Exponential { mean: 0 } => 0,
            Self::Exponential { mean } => {
                let v = (mean as f64 * exp1(rng)).round();
                if v >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    v as u64
                }
            }
        }
    }
}

/// `ns / factor`, rounded to the nearest nanosecond. A factor of 1 returns `ns` itself (through
/// `f64` a duration above 2^53 ns would round), so an unscaled scenario runs byte-identically.
/// `as` saturates, which every `Until` reads as "never".
pub(crate) fn divide_ns(ns: u64, factor: f64) -> u64 {
    if factor == 1.0 {
        ns
    } else {
        (ns as f64 / factor).round() as u64
    }
}

/// When an open-loop generator stops: after `duration` ns from its start, or after `count`
/// arrivals, whichever comes first. At least one must be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Until {
    /// No arrival at or after `start + duration` (ns).
    pub duration: Option<u64>,
    /// At most this many arrivals.
    pub count: Option<u64>,
}

impl Until {
    /// Stop after `ns` nanoseconds.
    #[must_use]
    pub const fn duration(ns: u64) -> Self {
        Self {
            duration: Some(ns),
            count: None,
        }
    }

    /// Stop after `n` arrivals.
    #[must_use]
    pub const fn count(n: u64) -> Self {
        Self {
            duration: None,
            count: Some(n),
        }
    }

    pub(crate) fn validate(&self, generator: &'static str) -> Result<(), TrafficError> {
        if self.duration.is_none() && self.count.is_none() {
            return Err(TrafficError::config(
                generator,
                "until",
                "sets neither `duration` nor `count`; expected at least one (the source would never end)",
            ));
        }
        Ok(())
    }

    /// Absolute end time (exclusive) for a source starting at `start`.
    pub(crate) fn end(&self, start: u64) -> u64 {
        self.duration.map_or(u64::MAX, |d| start.saturating_add(d))
    }

    pub(crate) fn max_count(&self) -> u64 {
        self.count.unwrap_or(u64::MAX)
    }
}

pub(crate) fn check_rate(
    generator: &'static str,
    field: &'static str,
    rate: f64,
    allow_zero: bool,
) -> Result<(), TrafficError> {
    let ok = rate.is_finite() && (rate > 0.0 || (allow_zero && rate == 0.0));
    if ok {
        Ok(())
    } else {
        let bound = if allow_zero { ">= 0" } else { "> 0" };
        Err(TrafficError::config(
            generator,
            field,
            format!("is {rate}; expected a finite rate {bound} requests per second"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_at_least_one_and_clamped() {
        let mut rng = rng_from_seed(1);
        let ln = LengthDist::LogNormal {
            median: 2.0,
            sigma: 3.0,
            max: 50,
        };
        let ex = LengthDist::Exponential { mean: 0.3 };
        let un = LengthDist::Uniform { min: 3, max: 5 };
        for _ in 0..10_000 {
            assert!((1..=50).contains(&ln.sample(&mut rng)));
            assert!(ex.sample(&mut rng) >= 1);
            assert!((3..=5).contains(&un.sample(&mut rng)));
        }
    }

    #[test]
    fn lognormal_median_is_close() {
        let mut rng = rng_from_seed(2);
        let d = LengthDist::LogNormal {
            median: 1000.0,
            sigma: 1.0,
            max: u32::MAX,
        };
        let mut v: Vec<u32> = (0..20_001).map(|_| d.sample(&mut rng)).collect();
        v.sort_unstable();
        let med = f64::from(v[10_000]);
        assert!((med / 1000.0 - 1.0).abs() < 0.05, "median {med}");
    }

    #[test]
    fn exponential_mean_is_close() {
        let mut rng = rng_from_seed(3);
        let d = LengthDist::Exponential { mean: 200.0 };
        let n = 100_000;
        let sum: u64 = (0..n).map(|_| u64::from(d.sample(&mut rng))).sum();
        let mean = sum as f64 / f64::from(n);
        assert!((mean / 200.0 - 1.0).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn invalid_configs_are_rejected() {
        assert!(LengthDist::Fixed(0).validate("T", "prompt").is_err());
        assert!(
            LengthDist::Uniform { min: 5, max: 4 }
                .validate("T", "prompt")
                .is_err()
        );
        assert!(
            LengthDist::Uniform { min: 0, max: 4 }
                .validate("T", "prompt")
                .is_err()
        );
        let e = LengthDist::LogNormal {
            median: 0.5,
            sigma: 1.0,
            max: 10,
        }
        .validate("Poisson", "prompt")
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("Poisson") && e.contains("prompt") && e.contains("median >= 1"),
            "{e}"
        );
        assert!(
            LengthDist::Exponential { mean: f64::NAN }
                .validate("T", "o")
                .is_err()
        );
        assert!(
            DurationDist::Uniform { min: 2, max: 1 }
                .validate("T", "gap")
                .is_err()
        );
        assert!(Until::default().validate("T").is_err());
        assert!(check_rate("T", "rate", -1.0, true).is_err());
        assert!(check_rate("T", "rate", 0.0, false).is_err());
        assert!(check_rate("T", "rate", 0.0, true).is_ok());
    }

    #[test]
    fn serde_shapes() {
        let d: LengthDist = serde_json::from_str(r#"{"uniform":{"min":1,"max":9}}"#).unwrap();
        assert_eq!(d, LengthDist::Uniform { min: 1, max: 9 });
        let d: LengthDist = serde_json::from_str(r#"{"fixed":7}"#).unwrap();
        assert_eq!(d, LengthDist::Fixed(7));
    }
}
