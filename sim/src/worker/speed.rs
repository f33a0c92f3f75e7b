//! The engines' seeded speed noise, shared by both engine modes so that a fluid and a step-level
//! engine with the same seed see the same epoch factors and draw per-request factors from the
//! same distribution.

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Distribution, LogNormal};

use super::EngineOverrides;
use crate::hardware::ColdStart;
use routelab_policies::streams::{ENGINE_EPOCH_SALT, secs_to_nanos_truncating, splitmix64};

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
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(splitmix64(
                seed ^ splitmix64(idx ^ ENGINE_EPOCH_SALT),
            ));
            d.sample(&mut rng)
        }
    }
}

/// An engine's speed multiplier, the one rule of both engine modes: the node's speed factor
/// (degraded < 1) × the cold factor (until `warmup_tokens` of decode + prefill work since the
/// engine became ready) × the noise epoch's factor. Readiness (`ready_at`) stays with the engine.
#[derive(Debug, Clone)]
pub(crate) struct Speed {
    /// The node's factor (1.0 healthy).
    pub(crate) node: f64,
    cold_factor: f64,
    warmup_tokens: f64,
    warm: bool,
    epoch_noise: Option<LogNormal<f64>>,
    epoch_ns: u64,
    epoch_idx: u64,
    epoch_factor: f64,
    seed: u64,
}

impl Speed {
    /// A warm engine's speed (cold if `start_cold` and the profile has a penalty).
    pub(crate) fn new(overrides: &EngineOverrides, cold: ColdStart, seed: u64) -> Speed {
        Speed {
            node: overrides.speed_factor,
            cold_factor: cold.speed_factor,
            warmup_tokens: cold.warmup_tokens,
            warm: !overrides.start_cold || cold.warmup_tokens <= 0.0,
            epoch_noise: lognormal(overrides.epoch_noise_cv),
            epoch_ns: secs_to_nanos_truncating(overrides.epoch_s).max(1),
            epoch_idx: u64::MAX,
            epoch_factor: 1.0,
            seed,
        }
    }

    /// Whether the cold penalty is over.
    pub(crate) fn is_warm(&self) -> bool {
        self.warm
    }

    /// The engine restarted: cold again if `cold` (and the profile has a penalty).
    pub(crate) fn restart(&mut self, cold: bool) {
        self.warm = !cold || self.warmup_tokens <= 0.0;
    }

    /// `work` tokens of decode + prefill have been done since ready: the penalty ends once it
    /// reaches the warm-up (within `eps`).
    pub(crate) fn note_work(&mut self, work: f64, eps: f64) {
        if !self.warm && work >= self.warmup_tokens - eps {
            self.warm = true;
        }
    }

    /// Work left before the engine is warm.
    pub(crate) fn warmup_left(&self, work: f64) -> f64 {
        self.warmup_tokens - work
    }

    /// Moves the epoch factor to the noise epoch of `t` (drawn as a pure function of the seed
    /// and the epoch index).
    pub(crate) fn enter_epoch(&mut self, t: u64) {
        if self.epoch_noise.is_some() {
            let idx = t / self.epoch_ns;
            if idx != self.epoch_idx {
                self.epoch_idx = idx;
                self.epoch_factor = epoch_factor(self.seed, idx, self.epoch_noise.as_ref());
            }
        }
    }

    /// The multiplier of the epoch last entered.
    pub(crate) fn current(&self) -> f64 {
        let cold = if self.warm { 1.0 } else { self.cold_factor };
        self.node * cold * self.epoch_factor
    }

    /// The multiplier at `t`, read without entering its epoch.
    pub(crate) fn at(&self, t: u64) -> f64 {
        let cold = if self.warm { 1.0 } else { self.cold_factor };
        let epoch = epoch_factor(self.seed, t / self.epoch_ns, self.epoch_noise.as_ref());
        self.node * cold * epoch
    }

    /// When the next noise epoch after `t` starts, if the speed is noisy.
    pub(crate) fn next_epoch_after(&self, t: u64) -> Option<u64> {
        self.epoch_noise.is_some().then(|| {
            (t / self.epoch_ns)
                .saturating_add(1)
                .saturating_mul(self.epoch_ns)
        })
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
