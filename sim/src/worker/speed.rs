//! The engines' seeded speed noise, shared by both engine modes so that a fluid and a step-level
//! engine with the same seed see the same epoch factors and draw per-request factors from the
//! same distribution.

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Distribution, LogNormal};

use crate::seed::splitmix64;

/// A lognormal multiplier with mean 1 and coefficient of variation `cv`; `None` for `cv = 0`
/// (no noise, and no draw from the engine's stream).
///
/// # Panics
/// If `cv` is negative or not finite (`EngineOverrides::validate` refuses those first).
pub(crate) fn lognormal(cv: f64) -> Option<LogNormal<f64>> {
    (cv > 0.0).then(|| LogNormal::from_mean_cv(1.0, cv).expect("validated cv"))
}

/// The engine speed factor of noise epoch `idx`: a pure function of the engine's seed and the
/// epoch index, so it does not depend on when or how often an engine asks.
pub(crate) fn epoch_factor(seed: u64, idx: u64, noise: Option<&LogNormal<f64>>) -> f64 {
    match noise {
        None => 1.0,
        Some(d) => {
            let mut rng =
                Xoshiro256PlusPlus::seed_from_u64(splitmix64(seed ^ splitmix64(idx ^ 0xE90C)));
            d.sample(&mut rng)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_factors_are_pure_and_noise_free_without_cv() {
        assert!(lognormal(0.0).is_none());
        assert_eq!(epoch_factor(7, 3, None), 1.0);
        let d = lognormal(0.3).unwrap();
        let a = epoch_factor(7, 3, Some(&d));
        assert_eq!(a, epoch_factor(7, 3, Some(&d)));
        assert_ne!(a, epoch_factor(7, 4, Some(&d)));
        assert_ne!(a, epoch_factor(8, 3, Some(&d)));
        assert!(a > 0.0 && a.is_finite());
    }
}
