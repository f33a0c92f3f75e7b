//! [`EngineCore`]: what both engine modes hold the same way — the profile and the limits drawn
//! from it, the driver's clock and wake-ups, readiness and pacing, the per-request noise, the
//! busy accounting and the prefix cache. Each engine owns one and keeps only its own model of
//! the running set beside it.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Distribution, LogNormal};

use super::cache::PrefixCache;
use super::speed::{Speed, lognormal};
use super::{BLOCK_TOKENS, EngineOutput, EngineOverrides, cached_tokens};
use crate::hardware::HardwareProfile;

/// The state both engine modes share. `repr(C)` keeps what every event touches (the clock and
/// the wake-up) first and what only some calls touch (the cache, the noise) last: a fleet of
/// thousands of engines finds each one cold in memory.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct EngineCore {
    // --- every event
    /// The time the engine has been moved to (ns).
    pub(crate) t0: u64,
    pub(crate) next_event: Option<u64>,
    /// Bumped on every change of pending events: a wake-up scheduled under an older one is
    /// stale.
    pub(crate) generation: u64,
    /// Work starts at this time; `u64::MAX` = down (crashed).
    pub(crate) ready_at: u64,
    /// Nanoseconds the engine worked (the mode says what counts), up to `t0`.
    pub(crate) busy_ns: u64,
    /// ∫ sequences decoding dt while working, sequence-nanoseconds: the operating
    /// concurrency's numerator (the weight error's second reference).
    pub(crate) decoding_ns: u64,
    /// The speed multiplier's rule (node, cold, epoch).
    pub(crate) pace: Speed,
    /// Outputs that happened during a mutating call, for the next `advance_to`.
    pub(crate) deferred: Vec<EngineOutput>,
    // --- some calls only
    pub(crate) max_running: u32,
    pub(crate) prefill_chunk_tokens: u32,
    pub(crate) kv_capacity: u64,
    pub(crate) cache: PrefixCache,
    request_noise: Option<LogNormal<f64>>,
    rng: Xoshiro256PlusPlus,
    pub(crate) profile: Arc<HardwareProfile>,
}

impl EngineCore {
    /// A warm engine's core (cold if `overrides.start_cold`), ready at time 0.
    ///
    /// # Panics
    /// If `overrides` fail [`EngineOverrides::validate`].
    pub(crate) fn new(
        profile: Arc<HardwareProfile>,
        overrides: &EngineOverrides,
        seed: u64,
    ) -> Self {
        if let Err(e) = overrides.validate() {
            panic!("invalid engine overrides for {}: {e}", profile.name());
        }
        let kv_capacity = overrides
            .kv_capacity_tokens
            .unwrap_or(profile.kv_capacity_tokens());
        EngineCore {
            t0: 0,
            next_event: None,
            generation: 0,
            ready_at: 0,
            busy_ns: 0,
            decoding_ns: 0,
            pace: Speed::new(overrides, profile.cold_start(), seed),
            deferred: Vec::new(),
            max_running: overrides.max_running.unwrap_or(profile.max_running()),
            prefill_chunk_tokens: overrides
                .prefill_chunk_tokens
                .unwrap_or(profile.prefill_chunk_tokens()),
            kv_capacity,
            cache: PrefixCache::new(
                usize::try_from(kv_capacity / u64::from(BLOCK_TOKENS)).unwrap_or(0),
            ),
            request_noise: lognormal(overrides.request_noise_cv),
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            profile,
        }
    }

    /// The work multiplier of the next sequence handed in (one draw from the engine's stream,
    /// in admission order; 1 without noise, and no draw).
    #[inline]
    pub(crate) fn request_noise(&mut self) -> f64 {
        match &self.request_noise {
            Some(d) => d.sample(&mut self.rng),
            None => 1.0,
        }
    }

    /// Whether the engine serves at `now` (ready and not crashed).
    #[inline]
    pub(crate) fn is_up(&self, now: u64) -> bool {
        now >= self.ready_at
    }

    /// The engine worked `dt_ns` more nanoseconds with `decoding` sequences decoding.
    #[inline]
    pub(crate) fn note_busy(&mut self, dt_ns: u64, decoding: u32) {
        self.busy_ns += dt_ns;
        self.decoding_ns += u64::from(decoding) * dt_ns;
    }

    /// The field `decoding_ns` read at `now`, extended from `t0` at `decoding`
    /// sequences if the engine works now (nothing changes the count between events).
    #[inline]
    pub(crate) fn decoding_ns_at(&self, now: u64, decoding: u32, working: bool) -> u64 {
        let ahead = if working {
            u64::from(decoding) * now.saturating_sub(self.t0)
        } else {
            0
        };
        self.decoding_ns + ahead
    }

    /// The prompt tokens the prefix cache would serve a prompt of `prompt` tokens with these
    /// prefix blocks now (without touching the cache).
    pub(crate) fn cached_for(&self, prompt: u32, prefix: &[u64]) -> u32 {
        if prefix.is_empty() || prompt == 0 {
            return 0;
        }
        cached_tokens(prompt, self.cache.leading_hits(prefix))
    }

    /// Evicts cached blocks (LRU) until the evictable ones fit in `free_tokens` of KV memory
    /// (what the running set does not hold).
    #[inline]
    pub(crate) fn fit_cache(&mut self, free_tokens: u64) {
        if self.cache.evictable() == 0 {
            return;
        }
        let free_blocks = free_tokens / u64::from(BLOCK_TOKENS);
        self.cache
            .evict_to(usize::try_from(free_blocks).unwrap_or(usize::MAX));
    }

    /// The engine restarts at `now`: the cache is lost, it serves from `ready_at` (never before
    /// `now`), cold if `cold` and the profile has a penalty.
    pub(crate) fn restart(&mut self, now: u64, ready_at: u64, cold: bool) {
        self.cache.clear();
        self.ready_at = ready_at.max(now);
        self.pace.restart(cold);
    }
}
