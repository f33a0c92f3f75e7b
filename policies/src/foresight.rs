//! What `predictive` learns about the requests to come, so a choice can be priced by what it
//! costs them (issue 38), from nothing but what the router sees: each request's context size
//! and believed-cached prefix as it is routed, the workers' context windows and measured
//! prefill speeds, and the prefix index's view of each cache.
//!
//! - **Scarce capacity.** A model's workers fall into window levels. Of the prompt tokens
//!   routed (decayed per arrival), the share whose context exceeds a level can only go to the
//!   workers above it; those workers hold a share of the level's measured prefill capacity.
//!   Their ratio is the level's *pressure*: above 1, the long requests alone want more than the
//!   big workers' share, and a request that fits below takes capacity only they have.
//! - **Cache value.** The decayed share of routed prompt tokens that were already cached
//!   somewhere (the *reuse*): what a cached token is worth on a later request, so the tokens a
//!   new prompt evicts from a full cache are priced at that share of their re-prefill.

/// Per-arrival decay of the sums (a half-life of about 710 arrivals: long enough to see a
/// rare long request, short enough to follow a day's changing mix).
const DECAY: f64 = 1.0 / 1024.0;

/// Fewest arrivals between two refreshes of the levels' capacity shares. A refresh reads every
/// member's measured speed, so it waits at least as many arrivals as there are members: its
/// cost per decision stays a few operations on 10,240 workers.
pub const REFRESH_EVERY: u32 = 64;

/// One model's view of its arrivals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Foresight {
    /// The members' distinct context windows, ascending.
    levels: Vec<u32>,
    /// Decayed prompt tokens whose context exceeded `levels[l]`.
    above: Vec<f64>,
    /// Decayed prompt tokens routed.
    total: f64,
    /// Decayed prompt tokens believed cached where they were routed from (the holder's match).
    cached: f64,
    /// Share of the measured prefill capacity of the members with a window above `levels[l]`.
    share: Vec<f64>,
    /// Arrivals since the shares were refreshed.
    since_refresh: u32,
}

impl Foresight {
    /// Note an arrival: its context size, prompt tokens and tokens believed cached.
    pub fn observe(&mut self, context_tokens: u32, prompt_tokens: u32, cached_tokens: u32) {
        let keep = 1.0 - DECAY;
        let p = f64::from(prompt_tokens);
        self.total = self.total * keep + p;
        self.cached = self.cached * keep + f64::from(cached_tokens.min(prompt_tokens));
        for (a, &level) in self.above.iter_mut().zip(&self.levels) {
            *a = *a * keep + if context_tokens > level { p } else { 0.0 };
        }
        self.since_refresh = self.since_refresh.saturating_add(1);
    }

    /// Whether the shares of a model of `members` workers are due for a refresh.
    pub fn due(&self, members: usize) -> bool {
        self.levels.is_empty() || self.since_refresh as usize >= members.max(REFRESH_EVERY as usize)
    }

    /// Refresh the levels and their capacity shares from the members' `(window, prefill tok/s)`.
    /// A level that is new starts with no tokens above it. Allocates only when the levels
    /// change (a member of a new window joined, the last of one left).
    pub fn refresh(&mut self, members: impl Iterator<Item = (u32, f64)> + Clone) {
        let known = |levels: &[u32]| {
            members
                .clone()
                .all(|(w, _)| levels.binary_search(&w).is_ok())
                && levels.iter().all(|l| members.clone().any(|(w, _)| w == *l))
        };
        if !known(&self.levels) {
            let mut levels: Vec<u32> = members.clone().map(|(w, _)| w).collect();
            levels.sort_unstable();
            levels.dedup();
            let above = levels
                .iter()
                .map(|l| self.levels.binary_search(l).map_or(0.0, |i| self.above[i]))
                .collect();
            self.levels = levels;
            self.above = above;
        }
        let speed = |s: f64| if s.is_finite() && s > 0.0 { s } else { 0.0 };
        let all: f64 = members.clone().map(|(_, s)| speed(s)).sum();
        self.share.clear();
        for &l in &self.levels {
            let big: f64 = members
                .clone()
                .filter(|&(w, _)| w > l)
                .map(|(_, s)| speed(s))
                .sum();
            self.share.push(if all > 0.0 { big / all } else { 0.0 });
        }
        self.since_refresh = 0;
    }

    /// The pressure on the workers above window `level`: the share of routed prompt tokens only
    /// they can hold over their share of the capacity (0 when nothing is known or no worker is
    /// above it).
    #[inline]
    pub fn pressure(&self, level: u32) -> f64 {
        let Ok(l) = self.levels.binary_search(&level) else {
            return 0.0;
        };
        let share = self.share.get(l).copied().unwrap_or(0.0);
        if self.total <= 0.0 || share <= 0.0 {
            return 0.0;
        }
        self.above[l] / self.total / share
    }

    /// The share of routed prompt tokens that were already cached (0 before any arrival).
    #[inline]
    pub fn reuse(&self) -> f64 {
        if self.total > 0.0 {
            self.cached / self.total
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_is_the_long_tokens_share_over_the_big_workers_capacity_share() {
        let mut f = Foresight::default();
        // One big worker (131k) of a quarter of the capacity, three small ones (32k).
        let members = [
            (131_072, 10_000.0),
            (32_768, 10_000.0),
            (32_768, 10_000.0),
            (32_768, 10_000.0),
        ];
        f.refresh(members.iter().copied());
        // Half the tokens come in 40k contexts, half in 1k ones.
        for _ in 0..100 {
            f.observe(40_000, 40_000, 0);
            f.observe(40_000 / 40, 1_000, 0);
        }
        let long_share = 40_000.0 / 41_000.0;
        let p = f.pressure(32_768);
        assert!((p - long_share / 0.25).abs() < 0.05, "{p}");
        // Nothing is above the largest window; an unknown level has no pressure.
        assert_eq!(f.pressure(131_072), 0.0);
        assert_eq!(f.pressure(65_536), 0.0);
    }

    #[test]
    fn reuse_is_the_cached_share_and_shares_follow_measured_speeds() {
        let mut f = Foresight::default();
        assert_eq!(f.reuse(), 0.0);
        assert!(f.due(2));
        f.refresh([(65_536, 30_000.0), (16_384, 10_000.0)].into_iter());
        assert!(!f.due(2));
        for _ in 0..10 {
            f.observe(20_000, 20_000, 15_000);
        }
        assert!((f.reuse() - 0.75).abs() < 1e-9);
        // All tokens exceed 16k; the big worker has 3/4 of the capacity.
        assert!((f.pressure(16_384) - 1.0 / 0.75).abs() < 1e-9);
        for _ in 0..REFRESH_EVERY {
            f.observe(1, 1, 0);
        }
        assert!(f.due(2));
        // A model of more members than that waits as many arrivals as it has members.
        assert!(!f.due(1_000));
        // A speed that is not a positive figure counts as none.
        f.refresh([(65_536, f64::NAN), (16_384, 10_000.0)].into_iter());
        assert_eq!(f.pressure(16_384), 0.0);
    }
}
