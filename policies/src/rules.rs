//! The field's routers as choosers: each rule as its project publishes it (facts in
//! `../shared/PEERS.md`; no code copied), reading the router's [`Hot`] array, its local
//! [`Signals`] and the prefix index's answer for this request.
//!
//! The router's prefix index remembers, per prefix block, the last worker that served it, so a
//! rule sees one worker's overlap (the holder of the longest remembered prefix) and 0 for the
//! others.
//! Every function answers a position in `cands` among the candidates below their cap, or `None`
//! when all are full. Nothing allocates.

use crate::capacity::Capacities;
use crate::chooser::Hot;
use crate::prefix::PrefixIndex;
use crate::signals::{PREFIX_BLOCK_TOKENS, Signals};
use crate::streams::splitmix64;
use crate::worker::WorkerId;
use rand::{Rng, RngExt};

/// Input throughput (tokens/s) of a worker nothing has been observed on yet, times its weight:
/// llm-d's published pool-wide `peakPrefillThroughput`, the one published figure of its kind.
pub const DEFAULT_INPUT_TOK_S: f64 = 15_928.0;

/// Generation throughput (tokens/s) assumed per unit of weight before a worker's first engine
/// report (ours: least-load then ranks by local tokens in flight ÷ weight).
pub const DEFAULT_GENERATION_TOK_S: f64 = 1_000.0;

/// What a rule knows about the request being routed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RuleCtx<'a> {
    /// Prompt tokens (0 when the host does not know them).
    pub prompt_tokens: u32,
    /// Prefix-block hashes of the prompt.
    pub prefix: &'a [u64],
    /// The holder of the longest remembered prefix and its length in blocks.
    pub holder: Option<(WorkerId, usize)>,
    /// Per-worker local signals, indexed by worker id.
    pub signals: &'a [Signals],
    /// The router's prefix index (per-worker tree sizes).
    pub index: &'a PrefixIndex,
    /// The workers' measured capacities (fed only for `predictive`).
    pub capacity: &'a Capacities,
    /// The prefix holder's position among the candidates, when it is one (computed only for
    /// `predictive`; `None` otherwise).
    pub holder_pos: Option<usize>,
}

impl RuleCtx<'_> {
    /// Prompt tokens the router believes worker `i` holds.
    #[inline]
    pub(crate) fn overlap(&self, i: u32) -> u32 {
        match self.holder {
            Some((w, blocks)) if w.0 == i => {
                let t = (blocks as u64 * u64::from(PREFIX_BLOCK_TOKENS)).min(u64::MAX >> 1);
                t.min(u64::from(self.prompt_tokens)) as u32
            }
            _ => 0,
        }
    }

    /// Fraction of the prompt worker `i` holds (0 for an empty prompt).
    #[inline]
    fn match_fraction(&self, i: u32) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            f64::from(self.overlap(i)) / f64::from(self.prompt_tokens)
        }
    }

    /// Worker `i`'s input throughput: its peak observed figure, else the default × weight.
    #[inline]
    fn input_tok_s(&self, i: u32, hot: &[Hot]) -> f64 {
        let p = self.signals[i as usize].peak_input_tok_s;
        if p > 0.0 {
            p
        } else {
            DEFAULT_INPUT_TOK_S * hot[i as usize].weight
        }
    }
}

/// Lowest score among open candidates; ties to the first.
#[inline]
fn lowest(cands: &[u32], hot: &[Hot], mut score: impl FnMut(u32) -> f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (pos, &i) in cands.iter().enumerate() {
        if !hot[i as usize].open() {
            continue;
        }
        let s = score(i);
        if best.is_none_or(|b| s < b.1) {
            best = Some((pos, s));
        }
    }
    best.map(|b| b.0)
}

/// Position of the prefix holder among the open candidates.
#[inline]
fn holder_pos(ctx: &RuleCtx<'_>, cands: &[u32], hot: &[Hot]) -> Option<usize> {
    let (w, _) = ctx.holder?;
    cands
        .iter()
        .position(|&i| i == w.0)
        .filter(|&p| hot[cands[p] as usize].open())
}

/// SGLang gateway `cache_aware` (and vLLM router's, a fork of it): least-loaded when the fleet
/// is imbalanced (load = the router's own requests in flight), else the prefix holder when it
/// holds more than `threshold` of the prompt, else least-loaded again.
///
/// Both originals as installed (sglang-router 0.3.2, vllm-router 0.1.17) pick the fewest
/// requests in flight below the threshold, ties to the first worker in their list: neither
/// binary carries the radix tree's "smallest tenant" any more, only `select_worker_min_load`
/// (their own in-flight counts). The copy followed the rule as SGLang first published it (the
/// smallest tree), which spreads prompts evenly whatever each worker's speed; the originals
/// give a slow worker what its queue lets it take (issue 39, docs/findings.md "Against the
/// originals").
pub(crate) fn cache_aware(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    abs: u32,
    rel: f64,
    threshold: f64,
) -> Option<usize> {
    let (mut min, mut max) = (u32::MAX, 0u32);
    for &i in cands {
        let h = &hot[i as usize];
        if h.open() {
            min = min.min(h.in_flight);
            max = max.max(h.in_flight);
        }
    }
    if min == u32::MAX {
        return None;
    }
    let imbalanced = max - min > abs && f64::from(max) > rel * f64::from(min);
    if !imbalanced
        && let Some(p) = holder_pos(ctx, cands, hot)
        && ctx.match_fraction(cands[p]) > threshold
    {
        return Some(p);
    }
    // Imbalanced, or no match above the threshold: the fewest in flight, ties to the first
    // (the originals' `min_by_key` over their worker list).
    lowest(cands, hot, |i| f64::from(hot[i as usize].in_flight))
}

/// SGLang gateway `least_load`: (engine tokens) ÷ generation throughput + a KV-pressure penalty.
pub(crate) fn least_load(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    penalty_s: f64,
) -> Option<usize> {
    lowest(cands, hot, |i| {
        let s = &ctx.signals[i as usize];
        let gen_tok_s = if s.generation_tok_s > 0.0 {
            s.generation_tok_s
        } else {
            DEFAULT_GENERATION_TOK_S * hot[i as usize].weight
        };
        // Grows without bound as the cache fills (ours: the published rule gives only the
        // weight); 0.99 keeps it finite.
        let kv = s
            .report
            .map_or(0.0, |r| r.kv_used_fraction.clamp(0.0, 0.99));
        s.engine_tokens() / gen_tok_s + penalty_s * kv / (1.0 - kv)
    })
}

/// llm-d "sticky until saturated": stay on a worker holding at least `match_fraction` of the
/// prompt unless its estimated TTFT exceeds the best other's by more than `gap_s`; otherwise the
/// fewest uncached prompt tokens in flight (in seconds of prefill).
pub(crate) fn sticky(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    match_fraction: f64,
    gap_s: f64,
    peak_prefill_tok_s: f64,
    measured: bool,
) -> Option<usize> {
    // The measured variant scales the pool figure by the worker's weight relative to the mean
    // of the open candidates' weights.
    let mean_weight = if measured {
        let (mut sum, mut n) = (0.0, 0u32);
        for &i in cands {
            if hot[i as usize].open() {
                sum += hot[i as usize].weight;
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        sum / f64::from(n)
    } else {
        1.0
    };
    let prefill = |i: u32| {
        if measured {
            peak_prefill_tok_s * hot[i as usize].weight / mean_weight
        } else {
            peak_prefill_tok_s
        }
    };
    let ttft = |i: u32| {
        let queued = ctx.signals[i as usize].uncached_in_flight as f64;
        let own = f64::from(ctx.prompt_tokens - ctx.overlap(i));
        (queued + own) / prefill(i)
    };
    let sticky = holder_pos(ctx, cands, hot)
        .filter(|&p| ctx.prompt_tokens > 0 && ctx.match_fraction(cands[p]) >= match_fraction);
    let best_other = lowest(cands, hot, |i| {
        if sticky.is_some_and(|p| cands[p] == i) {
            f64::INFINITY
        } else {
            ttft(i)
        }
    });
    match (sticky, best_other) {
        (Some(s), Some(o)) if cands[o] != cands[s] => {
            if ttft(cands[s]) - ttft(cands[o]) > gap_s {
                Some(o)
            } else {
                Some(s)
            }
        }
        (Some(s), _) => Some(s),
        (None, o) => o,
    }
}

/// NVIDIA Stargate `pulsar`: weighted rendezvous hashing of the prompt's first `key_blocks`
/// prefix blocks, weight = the worker's peak observed input tokens/s. A prompt without a prefix
/// goes to the lowest in-flight count ÷ that throughput (nothing to be affine to).
pub(crate) fn pulsar(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    key_blocks: u32,
) -> Option<usize> {
    // Block hashes are chained (block k's covers blocks 0..=k), so the hash of the last block
    // of the key is the key: no combining needed. A prompt shorter than the key uses all of
    // its blocks; 0 (refused by validation) reads as 1 rather than as "no prefix".
    let n = (key_blocks.max(1) as usize).min(ctx.prefix.len());
    let Some(&key) = ctx.prefix[..n].last() else {
        return lowest(cands, hot, |i| {
            f64::from(hot[i as usize].in_flight) / ctx.input_tok_s(i, hot)
        });
    };
    // Rendezvous: the highest weight ÷ −ln(u) wins, u uniform in (0, 1) from (key, worker);
    // each worker's share of keys is proportional to its weight.
    lowest(cands, hot, |i| {
        let h = splitmix64(key ^ splitmix64(u64::from(i)));
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        ln_neg(u) / ctx.input_tok_s(i, hot)
    })
}

/// −ln(u) for u in (0, 1): positive and finite.
#[inline]
fn ln_neg(u: f64) -> f64 {
    -u.ln()
}

/// NVIDIA Stargate `wait-and-widen`: the affinity choice (pulsar's, keyed on `key_blocks`)
/// alone while its estimated TTFT is within `window_s`; past it, one more random candidate per
/// window of excess wait, up to `max_candidates`; the lowest estimate wins.
#[allow(clippy::too_many_arguments)]
pub(crate) fn wait_and_widen<R: Rng + ?Sized>(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    key_blocks: u32,
    window_s: f64,
    max_candidates: u32,
    rtt_s: f64,
    rng: &mut R,
) -> Option<usize> {
    let est = |i: u32| {
        let s = &ctx.signals[i as usize];
        let queued = s.uncached_in_flight as f64;
        let own = f64::from(ctx.prompt_tokens - ctx.overlap(i));
        // The worker's own round trip when the host knows it, else the parameter.
        s.round_trip_s.unwrap_or(rtt_s) + (queued + own) / ctx.input_tok_s(i, hot)
    };
    let first = pulsar(ctx, cands, hot, key_blocks)?;
    let wait = est(cands[first]);
    if wait <= window_s {
        return Some(first);
    }
    let extra = ((wait - window_s) / window_s)
        .ceil()
        .min(f64::from(u32::MAX)) as u32;
    let n = extra.saturating_add(1).min(max_candidates) as usize;
    if n >= cands.len() {
        return lowest(cands, hot, est);
    }
    let (mut best, mut best_est) = (first, wait);
    // Power of n: n − 1 draws with replacement (a repeat only wastes a look).
    for _ in 1..n {
        let p = rng.random_range(0..cands.len());
        if !hot[cands[p] as usize].open() {
            continue;
        }
        let e = est(cands[p]);
        if e < best_est {
            (best, best_est) = (p, e);
        }
    }
    Some(best)
}

/// NVIDIA Dynamo KV router: cost = w × new prefill blocks + prompt blocks already active on the
/// worker; the lowest wins, or softmax-sampled at `temperature` > 0.
pub(crate) fn kv_cost<R: Rng + ?Sized>(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    prefill_weight: f64,
    temperature: f64,
    rng: &mut R,
) -> Option<usize> {
    let b = u64::from(PREFIX_BLOCK_TOKENS);
    let prompt_blocks = u64::from(ctx.prompt_tokens).div_ceil(b);
    let cost = |i: u32| {
        let cached = u64::from(ctx.overlap(i)).div_ceil(b);
        let active = ctx.signals[i as usize].tokens_in_flight.div_ceil(b);
        prefill_weight * prompt_blocks.saturating_sub(cached) as f64 + active as f64
    };
    let best = lowest(cands, hot, cost)?;
    if temperature <= 0.0 {
        return Some(best);
    }
    // Softmax over −cost / T, relative to the best so no exponent overflows.
    let min = cost(cands[best]);
    let weight = |i: u32| (-(cost(i) - min) / temperature).exp();
    let total: f64 = cands
        .iter()
        .filter(|&&i| hot[i as usize].open())
        .map(|&i| weight(i))
        .sum();
    let mut r = rng.random::<f64>() * total;
    let mut last = best;
    for (pos, &i) in cands.iter().enumerate() {
        if !hot[i as usize].open() {
            continue;
        }
        last = pos;
        r -= weight(i);
        if r < 0.0 {
            return Some(pos);
        }
    }
    Some(last)
}

/// vLLM production-stack load-aware routing: prefix hit fraction − β × relative load (requests
/// in flight ÷ the busiest open candidate's); the highest wins.
pub(crate) fn hit_minus_load(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    beta: f64,
) -> Option<usize> {
    let busiest = cands
        .iter()
        .map(|&i| &hot[i as usize])
        .filter(|h| h.open())
        .map(|h| h.in_flight)
        .max()?;
    let scale = f64::from(busiest.max(1));
    lowest(cands, hot, |i| {
        beta * f64::from(hot[i as usize].in_flight) / scale - ctx.match_fraction(i)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::signals::{Charge, EngineReport};
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    fn hot(in_flight: &[u32]) -> Vec<Hot> {
        in_flight
            .iter()
            .map(|&n| Hot {
                weight: 1.0,
                in_flight: n,
                cap: u32::MAX,
                context_window: 1 << 20,
                model: 0,
                routable: true,
            })
            .collect()
    }

    /// A fleet of workers of weight 1 (candidates in id order) and what a rule reads about
    /// them; `predictive`'s tests use it too.
    pub(crate) struct Case {
        pub hot: Vec<Hot>,
        pub signals: Vec<Signals>,
        pub index: PrefixIndex,
        pub cands: Vec<u32>,
        pub capacity: Capacities,
    }

    impl Case {
        pub(crate) fn new(in_flight: &[u32]) -> Case {
            let n = in_flight.len();
            let mut index = PrefixIndex::new(1024);
            index.reserve_workers(n);
            Case {
                hot: hot(in_flight),
                signals: vec![Signals::default(); n],
                index,
                cands: (0..n as u32).collect(),
                capacity: Capacities::default(),
            }
        }

        /// The request as a rule sees it (the holder's position is its id: the candidates
        /// are every worker in id order).
        pub(crate) fn ctx<'a>(&'a self, prompt: u32, prefix: &'a [u64]) -> RuleCtx<'a> {
            let holder = self.index.longest(prefix);
            RuleCtx {
                prompt_tokens: prompt,
                prefix,
                holder,
                signals: &self.signals,
                index: &self.index,
                capacity: &self.capacity,
                holder_pos: holder
                    .map(|(w, _)| w.index())
                    .filter(|&i| i < self.cands.len()),
            }
        }
    }

    /// Blocks `0..n` of a prompt whose chain is keyed by `seed`.
    fn chain(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|b| splitmix64(seed * 1000 + b)).collect()
    }

    #[test]
    fn cache_aware_balanced_prefers_a_match_above_threshold_else_the_fewest_in_flight() {
        let mut c = Case::new(&[4, 3, 5]);
        let shared = chain(1, 4);
        c.index.record(&shared, WorkerId(2));
        // Worker 0's record is the largest (16 blocks), worker 1's the smallest (none): the
        // size of a record no longer decides anything.
        c.index.record(&chain(2, 16), WorkerId(0));
        // Balanced (5 − 3 ≤ 32): worker 2 holds all 4 blocks of a 2,048-token prompt: 100 % > 50 %.
        let ctx = c.ctx(2048, &shared);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 32, 1.1, 0.5), Some(2));
        // The same 4 blocks are 25 % of an 8,192-token prompt: below the threshold, so the
        // fewest in flight wins — worker 1 (3).
        let mut long = shared.clone();
        long.extend(chain(3, 12));
        let ctx = c.ctx(8192, &long);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 32, 1.1, 0.5), Some(1));
        // 50 % exactly is not above a 0.5 threshold (the originals compare with `>`).
        let mut half = shared.clone();
        half.extend(chain(4, 4));
        let ctx = c.ctx(4096, &half);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 32, 1.1, 0.5), Some(1));
    }

    #[test]
    fn cache_aware_below_threshold_ties_go_to_the_first_candidate() {
        // An idle fleet and a prompt nobody holds: every load is 0, and the originals'
        // `min_by_key` answers the first worker in their list (not a random or a rotating one).
        let c = Case::new(&[0, 0, 0]);
        let fresh = chain(9, 3);
        let ctx = c.ctx(1500, &fresh);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 64, 1.5, 0.3), Some(0));
        // A prompt without prefix hashes reads the same.
        let ctx = c.ctx(1500, &[]);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 64, 1.5, 0.3), Some(0));
        // A closed first worker is skipped.
        let mut c = Case::new(&[0, 0, 0]);
        c.hot[0].cap = 0;
        let ctx = c.ctx(1500, &[]);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 64, 1.5, 0.3), Some(1));
    }

    #[test]
    fn cache_aware_imbalanced_fleet_goes_to_the_least_loaded_whatever_the_cache() {
        let mut c = Case::new(&[40, 2, 60]);
        let shared = chain(1, 4);
        c.index.record(&shared, WorkerId(2));
        // 60 − 2 > 32 and 60 > 1.1 × 2: imbalanced.
        let ctx = c.ctx(2048, &shared);
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 32, 1.1, 0.5), Some(1));
        // The vLLM fork's thresholds (64 / 1.5) call the same fleet balanced: the match wins.
        assert_eq!(cache_aware(&ctx, &c.cands, &c.hot, 64, 1.5, 0.3), Some(2));
    }

    #[test]
    fn least_load_divides_engine_tokens_by_reported_throughput_and_penalises_a_full_cache() {
        let mut c = Case::new(&[0, 0]);
        let report = |queued, gen_tok_s, kv| EngineReport {
            kv_used_fraction: kv,
            queued_prompt_tokens: queued,
            running_tokens: 0,
            generation_tok_s: gen_tok_s,
        };
        // 4,000 tokens at 2,000 tok/s (2 s) beats 3,000 at 1,000 tok/s (3 s).
        c.signals[0].report(report(4000, 2000.0, 0.0));
        c.signals[1].report(report(3000, 1000.0, 0.0));
        let ctx = c.ctx(100, &[]);
        assert_eq!(least_load(&ctx, &c.cands, &c.hot, 0.15), Some(0));
        // Worker 0's cache at 99 %: + 0.15 × 99 = 14.85 s of penalty.
        c.signals[0].report(report(4000, 2000.0, 0.99));
        let ctx = c.ctx(100, &[]);
        assert_eq!(least_load(&ctx, &c.cands, &c.hot, 0.15), Some(1));
        // Between polls the local count moves the score: 4,000 more tokens on worker 0 (4 s).
        c.signals[0].report(report(4000, 2000.0, 0.0));
        c.signals[0].charge(Charge {
            tokens: 4000,
            uncached: 4000,
            ..Charge::NONE
        });
        let ctx = c.ctx(100, &[]);
        assert_eq!(least_load(&ctx, &c.cands, &c.hot, 0.15), Some(1));
    }

    #[test]
    fn sticky_stays_on_an_80_percent_holder_until_the_ttft_gap_exceeds_the_bound() {
        let mut c = Case::new(&[0, 0, 0]);
        let p = chain(7, 8);
        c.index.record(&p, WorkerId(1));
        // Worker 1 holds all 4,096 tokens; worker 2 has the fewest uncached tokens in flight.
        c.signals[0].uncached_in_flight = 50_000;
        c.signals[1].uncached_in_flight = 100_000;
        c.signals[2].uncached_in_flight = 10_000;
        let ctx = c.ctx(4096, &p);
        // Gap: 100,000 / 15,928 − 14,096 / 15,928 = 5.4 s < 18 s: stay.
        assert_eq!(
            sticky(&ctx, &c.cands, &c.hot, 0.8, 18.0, 15_928.0, false),
            Some(1)
        );
        // 400,000 tokens queued on the holder: 24.5 s more than worker 2: break away.
        c.signals[1].uncached_in_flight = 400_000;
        let ctx = c.ctx(4096, &p);
        assert_eq!(
            sticky(&ctx, &c.cands, &c.hot, 0.8, 18.0, 15_928.0, false),
            Some(2)
        );
        // A prompt nobody holds 80 % of: the fewest uncached tokens in flight.
        let other = chain(8, 8);
        let ctx = c.ctx(4096, &other);
        assert_eq!(
            sticky(&ctx, &c.cands, &c.hot, 0.8, 18.0, 15_928.0, false),
            Some(2)
        );
    }

    #[test]
    fn sticky_measured_scales_the_pool_figure_by_each_workers_weight() {
        let mut c = Case::new(&[0, 0]);
        c.hot[0].weight = 3.0;
        c.hot[1].weight = 1.0;
        c.signals[0].uncached_in_flight = 20_000;
        c.signals[1].uncached_in_flight = 10_000;
        let ctx = c.ctx(1000, &[]);
        // Pool constant: fewer tokens wins (worker 1).
        assert_eq!(
            sticky(&ctx, &c.cands, &c.hot, 0.8, 18.0, 15_928.0, false),
            Some(1)
        );
        // Measured: worker 0 prefills 1.5 × 15,928, worker 1 0.5 ×: 21,000 / 1.5 < 11,000 / 0.5.
        assert_eq!(
            sticky(&ctx, &c.cands, &c.hot, 0.8, 18.0, 15_928.0, true),
            Some(0)
        );
    }

    #[test]
    fn pulsar_is_a_consistent_hash_whose_shares_follow_peak_input_throughput() {
        let mut c = Case::new(&[0, 0, 0]);
        c.signals[0].peak_input_tok_s = 30_000.0;
        c.signals[1].peak_input_tok_s = 10_000.0;
        // Worker 2 unobserved: 15,928 × weight 1.
        let mut counts = [0u32; 3];
        for k in 0..30_000u64 {
            let key = [splitmix64(k)];
            let ctx = c.ctx(512, &key);
            let first = pulsar(&ctx, &c.cands, &c.hot, 1).unwrap();
            // Same key, same answer (no randomness).
            assert_eq!(pulsar(&ctx, &c.cands, &c.hot, 1), Some(first));
            counts[first] += 1;
        }
        let total = 30_000.0 + 10_000.0 + 15_928.0;
        for (i, w) in [30_000.0, 10_000.0, 15_928.0].into_iter().enumerate() {
            let share = f64::from(counts[i]) / 30_000.0;
            assert!((share - w / total).abs() < 0.015, "{counts:?}");
        }
        // A full worker's keys move to the others; the rest stay where they were.
        c.hot[0].cap = 0;
        for k in 0..2_000u64 {
            let key = [splitmix64(k)];
            let before = {
                c.hot[0].cap = u32::MAX;
                pulsar(&c.ctx(512, &key), &c.cands, &c.hot, 1).unwrap()
            };
            c.hot[0].cap = 0;
            let after = pulsar(&c.ctx(512, &key), &c.cands, &c.hot, 1).unwrap();
            assert!(after != 0 && (before == 0 || before == after));
        }
    }

    /// A chained prefix as hosts build it: block k's hash covers the keys of blocks 0..=k.
    fn chained(keys: &[u64]) -> Vec<u64> {
        let mut h = 0u64;
        keys.iter()
            .map(|&k| {
                h = splitmix64(h ^ splitmix64(k));
                h
            })
            .collect()
    }

    #[test]
    fn pulsar_key_blocks_separates_conversations_that_share_only_a_first_block() {
        let c = Case::new(&[0; 8]);
        // 64 conversations behind one system prompt: block 0 shared, block 1 their own.
        let prompts: Vec<Vec<u64>> = (0..64u64).map(|k| chained(&[7, 100 + k, 5])).collect();
        let worker = |p: &[u64], key_blocks| {
            pulsar(&c.ctx(3 * 512, p), &c.cands, &c.hot, key_blocks).unwrap()
        };
        // One block of key: the shared system prompt is all pulsar sees, one worker takes all.
        let home = worker(&prompts[0], 1);
        assert!(prompts.iter().all(|p| worker(p, 1) == home));
        // Two blocks: the key includes each conversation's own block, so they spread; and each
        // conversation still goes to one place every time.
        let mut used = [false; 8];
        for p in &prompts {
            let w = worker(p, 2);
            assert_eq!(worker(p, 2), w);
            used[w] = true;
        }
        let spread = used.iter().filter(|&&u| u).count();
        assert!(spread >= 6, "{used:?}");
        // The key is block 1's chain hash, whatever follows it.
        let p = &prompts[3];
        assert_eq!(worker(p, 2), worker(&p[1..2], 1));
    }

    #[test]
    fn pulsar_uses_the_last_block_of_a_prompt_shorter_than_its_key() {
        let c = Case::new(&[0; 8]);
        for k in 0..200u64 {
            let p = chained(&[1, k, k + 1]);
            let ctx = c.ctx(3 * 512, &p);
            let short = pulsar(&ctx, &c.cands, &c.hot, 8);
            // Eight blocks asked, three there: the key is block 2, as with key_blocks = 3 and
            // as for a prompt whose only block is that hash.
            assert_eq!(short, pulsar(&ctx, &c.cands, &c.hot, 3));
            assert_eq!(short, pulsar(&c.ctx(512, &p[2..]), &c.cands, &c.hot, 1));
        }
        // wait-and-widen starts from the same choice (idle fleet: within the window).
        let p = chained(&[1, 2, 3]);
        let ctx = c.ctx(3 * 512, &p);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        for key_blocks in [1, 2, 3, 8] {
            assert_eq!(
                wait_and_widen(&ctx, &c.cands, &c.hot, key_blocks, 0.2, 64, 0.0, &mut rng),
                pulsar(&ctx, &c.cands, &c.hot, key_blocks)
            );
        }
    }

    #[test]
    fn wait_and_widen_keeps_the_affinity_choice_within_the_window_and_widens_past_it() {
        let mut c = Case::new(&[0; 8]);
        let key = [splitmix64(42)];
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let home = pulsar(&c.ctx(1000, &key), &c.cands, &c.hot, 1).unwrap();
        // 1,000 tokens at 15,928 tok/s: 63 ms ≤ 200 ms: affinity only.
        let ctx = c.ctx(1000, &key);
        assert_eq!(
            wait_and_widen(&ctx, &c.cands, &c.hot, 1, 0.2, 64, 0.0, &mut rng),
            Some(home)
        );
        // 1.6 M uncached tokens ahead on it (~100 s): 64 candidates ≥ 8, a full scan, and
        // every other worker is idle: the first other wins.
        c.signals[home].uncached_in_flight = 1_600_000;
        let ctx = c.ctx(1000, &key);
        let got = wait_and_widen(&ctx, &c.cands, &c.hot, 1, 0.2, 64, 0.0, &mut rng).unwrap();
        assert_ne!(got, home);
        assert_eq!(got, if home == 0 { 1 } else { 0 });
        // An RTT that alone exceeds the window widens too, but to no better place: all equal,
        // and a tie keeps the affinity choice.
        c.signals[home].uncached_in_flight = 0;
        let ctx = c.ctx(1000, &key);
        assert_eq!(
            wait_and_widen(&ctx, &c.cands, &c.hot, 1, 0.2, 64, 0.5, &mut rng),
            Some(home)
        );
        // A known round trip replaces the parameter: 1 s to the home worker (wait 1.06 s)
        // opens 1 + 5 candidates; every other is idle at 0.06 s: the home loses.
        c.signals[home].round_trip_s = Some(1.0);
        let ctx = c.ctx(1000, &key);
        let mut away = 0;
        for _ in 0..50 {
            if wait_and_widen(&ctx, &c.cands, &c.hot, 1, 0.2, 64, 0.0, &mut rng) != Some(home) {
                away += 1;
            }
        }
        assert_eq!(away, 50);
    }

    #[test]
    fn kv_cost_counts_new_prefill_blocks_plus_active_blocks() {
        let mut c = Case::new(&[0, 0]);
        let p = chain(3, 8);
        c.index.record(&p, WorkerId(0));
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        // Worker 0 caches all 8 blocks (cost 0 + active), worker 1 none (cost 8 + active).
        c.signals[0].tokens_in_flight = 7 * 512;
        let ctx = c.ctx(4096, &p);
        assert_eq!(kv_cost(&ctx, &c.cands, &c.hot, 1.0, 0.0, &mut rng), Some(0));
        c.signals[0].tokens_in_flight = 9 * 512;
        let ctx = c.ctx(4096, &p);
        assert_eq!(kv_cost(&ctx, &c.cands, &c.hot, 1.0, 0.0, &mut rng), Some(1));
        // w = 2 doubles the prefill term: 16 > 9, back to the holder.
        assert_eq!(kv_cost(&ctx, &c.cands, &c.hot, 2.0, 0.0, &mut rng), Some(0));
        // A temperature samples: costs 9 and 8 at T = 1 give 27 % / 73 %.
        let ones = (0..4000)
            .filter(|_| kv_cost(&ctx, &c.cands, &c.hot, 1.0, 1.0, &mut rng) == Some(1))
            .count();
        assert!((2700..3150).contains(&ones), "{ones}");
    }

    #[test]
    fn hit_minus_load_trades_hit_fraction_against_relative_load() {
        let mut c = Case::new(&[4, 1]);
        let p = chain(5, 4);
        c.index.record(&p, WorkerId(0));
        let ctx = c.ctx(2048, &p);
        // Worker 0: 1 − 0.5 × 4/4 = 0.5; worker 1: 0 − 0.5 × 1/4 = −0.125.
        assert_eq!(hit_minus_load(&ctx, &c.cands, &c.hot, 0.5), Some(0));
        // β = 2: −1 against −0.5.
        assert_eq!(hit_minus_load(&ctx, &c.cands, &c.hot, 2.0), Some(1));
    }

    #[test]
    fn every_rule_answers_none_when_every_candidate_is_full() {
        let mut c = Case::new(&[1, 1]);
        for h in &mut c.hot {
            h.cap = 1;
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let p = chain(1, 2);
        let ctx = c.ctx(1000, &p);
        let (k, h) = (&c.cands[..], &c.hot[..]);
        assert_eq!(cache_aware(&ctx, k, h, 32, 1.1, 0.5), None);
        assert_eq!(least_load(&ctx, k, h, 0.15), None);
        assert_eq!(sticky(&ctx, k, h, 0.8, 18.0, 15_928.0, true), None);
        assert_eq!(pulsar(&ctx, k, h, 1), None);
        assert_eq!(pulsar(&ctx, k, h, 4), None);
        assert_eq!(wait_and_widen(&ctx, k, h, 1, 0.2, 64, 0.0, &mut rng), None);
        assert_eq!(kv_cost(&ctx, k, h, 1.0, 1.0, &mut rng), None);
        assert_eq!(hit_minus_load(&ctx, k, h, 0.5), None);
    }
}
