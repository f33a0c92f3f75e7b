//! `predictive` (ours): for each eligible worker, predict this request's time to first token
//! and its time per output token there from the worker's measured capacity
//! ([`Capacities`](crate::capacity::Capacities)), and choose by an objective tied to the SLO.
//!
//! - **TTFT** = round trip + the decode step that emits the first token + (uncached prompt
//!   tokens already waiting there + this prompt's uncached tokens, given what the prefix index
//!   believes the worker holds) ÷ the worker's prefill speed.
//! - **TPOT** = the worker's decode step with one more sequence: `a + b·(n + 1)`.
//! - **Damage** to the requests already there: each of the `n` running sequences decodes
//!   `b` slower for the rest of its output (about half the mean output) and stalls for the
//!   unhidden share of this prompt's prefill.
//!
//! Score (lower wins) = predicted SLO misses (this request's, plus `victims` × the running
//! requests pushed over the TPOT bound) + [`COMPLETION_WEIGHT`] × (predicted completion time +
//! `victims` × the damage in seconds). With no bounds it is the least completion plus damage.
//!
//! **Write-off.** When the request is predicted to miss its bounds on every candidate scored,
//! its own completion no longer counts: it goes where it harms the others least (the running
//! requests' misses and damage, plus the prefill queue it would hold up for later arrivals,
//! in seconds). Near the knee this sends hopeless requests to idle slow workers instead of
//! into the fast workers' queues. Measured on the bundled traces (5 seeds, capacity at the
//! SLO): azure-code 90 % 1.16× → 1.18×, 80 % 1.10× → 1.14×, azure-conv 1.09× (same),
//! mooncake 1.02× → 1.03×.
//!
//! Exact over every open candidate when there are at most `scan` of them; otherwise `scan`
//! uniformly drawn candidates plus the prefix holder (the result is then the best of a sample).

use crate::capacity::{CHUNK_TOKENS, Estimate, prefill_time_s};
use crate::chooser::{Hot, below};
use crate::explain::Observe;
use crate::rules::RuleCtx;
use rand::Rng;

/// Seconds of predicted completion worth one predicted SLO miss, inverted (ours: 20 s of
/// completion time count as much as one miss, so a feasible worker always beats an infeasible
/// one unless it is 20 s slower).
pub const COMPLETION_WEIGHT: f64 = 0.05;

/// `predictive`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictiveParams {
    /// TTFT bound, seconds; `None`: the host's SLO (the simulator's scenario SLO), else none.
    pub ttft_s: Option<f64>,
    /// TPOT bound, seconds; as `ttft_s`.
    pub tpot_s: Option<f64>,
    /// How much the running requests' misses and damage count against this request's (ours:
    /// 3, chosen from 1, 2 and 3 on the bundled traces — see the findings' ablations; 1 would
    /// count each request the same, more protects the requests already running).
    pub victims: f64,
    /// Candidates scanned: all of them up to this many, else this many drawn at random plus
    /// the prefix holder (ours: 16).
    pub scan: u32,
    /// One pool-wide prefill speed (tok/s) for every worker instead of measured ones, with the
    /// priors' decode step (an ablation: what the field's routers assume).
    pub pool_prefill_tok_s: Option<f64>,
    /// Credit the prefix the router believes a worker holds (false: every prompt is uncached
    /// everywhere; an ablation).
    pub prefix_aware: bool,
    /// Scarce capacity: weight of the cost to the long arrivals to come of a request placed
    /// above the smallest window that holds it (its prefill seconds there x the pressure on
    /// that window level, see [`Foresight`](crate::foresight::Foresight)); 0 is off.
    pub reserve: f64,
    /// Cache value: weight of the other prefixes a prompt evicts from a full cache (the
    /// evicted tokens' re-prefill seconds there x the measured reuse share); 0 is off.
    pub evict: f64,
}

impl PredictiveParams {
    /// The defaults.
    pub const DEFAULT: PredictiveParams = PredictiveParams {
        ttft_s: None,
        tpot_s: None,
        victims: 3.0,
        scan: 16,
        pool_prefill_tok_s: None,
        prefix_aware: true,
        reserve: 0.0,
        evict: 0.0,
    };
}

/// The predicted figures for one candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Prediction {
    pub ttft_s: f64,
    pub tpot_s: f64,
    pub score: f64,
    /// What the choice costs the other requests, in the score's units: the running ones'
    /// misses and damage, and the prefill queue it holds up for later arrivals.
    pub harm: f64,
    /// This request is predicted to miss a bound here.
    pub own_miss: bool,
}

/// Predict request `ctx` on worker `i`, knowing nothing of the requests to come (what
/// [`crate::Router::score_of`] recomputes: the decision's own figures when the future terms
/// are off, as they are by default).
pub(crate) fn predict(ctx: &RuleCtx<'_>, i: u32, hot: &Hot, p: &PredictiveParams) -> Prediction {
    predict_with(ctx, i, hot, p, &Ahead::NONE)
}

/// What a decision knows about the requests to come, read once per decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ahead {
    /// The smallest window among the candidates (the request fits every one).
    pub smallest_window: u32,
    /// The pressure on the workers above it ([`Foresight::pressure`](crate::foresight::Foresight::pressure)).
    pub pressure: f64,
    /// The measured reuse share of routed prompt tokens.
    pub reuse: f64,
}

impl Ahead {
    /// Nothing known: the future terms cost nothing.
    pub const NONE: Ahead = Ahead {
        smallest_window: u32::MAX,
        pressure: 0.0,
        reuse: 0.0,
    };

    /// What the router's foresight says for a request whose candidates are `cands`
    /// (`Ahead::NONE` when both terms are off or nothing is known).
    #[inline]
    pub(crate) fn of(ctx: &RuleCtx<'_>, cands: &[u32], hot: &[Hot], p: &PredictiveParams) -> Ahead {
        if p.reserve <= 0.0 && p.evict <= 0.0 {
            return Ahead::NONE;
        }
        // Candidates are the model's members largest window first: the last has the smallest.
        let (Some(&first), Some(&last)) = (cands.first(), cands.last()) else {
            return Ahead::NONE;
        };
        let Some(f) = ctx.capacity.foresight(hot[first as usize].model as usize) else {
            return Ahead::NONE;
        };
        let smallest_window = hot[last as usize].context_window;
        Ahead {
            smallest_window,
            pressure: if p.reserve > 0.0 {
                f.pressure(smallest_window)
            } else {
                0.0
            },
            reuse: if p.evict > 0.0 { f.reuse() } else { 0.0 },
        }
    }
}

/// [`predict`] with what is known of the requests to come.
#[inline]
pub(crate) fn predict_with(
    ctx: &RuleCtx<'_>,
    i: u32,
    hot: &Hot,
    p: &PredictiveParams,
    ahead: &Ahead,
) -> Prediction {
    let est = match p.pool_prefill_tok_s {
        Some(pool) => Estimate {
            prefill_tok_s: pool,
            step_a: crate::capacity::PRIOR_STEP_S,
            step_b: crate::capacity::PRIOR_STEP_S * crate::capacity::PRIOR_SLOPE,
            kv_tokens: ctx.capacity.estimate(i as usize, hot.weight).kv_tokens,
        },
        None => ctx.capacity.estimate(i as usize, hot.weight),
    };
    let s = &ctx.signals[i as usize];
    let n = f64::from(hot.in_flight);
    let own = if p.prefix_aware {
        ctx.prompt_tokens - ctx.overlap(i)
    } else {
        ctx.prompt_tokens
    };
    let step_now = est.step_a + est.step_b * n;
    let tpot_s = step_now + est.step_b;
    let out = ctx.capacity.mean_output_tokens();
    let waiting = s.uncached_in_flight as f64 + f64::from(own);
    let ttft_s = s.round_trip_s.unwrap_or(0.0)
        + prefill_time_s(waiting, step_now, est.prefill_tok_s)
        + kv_wait_s(
            est.kv_tokens,
            s.tokens_in_flight as f64,
            n,
            own,
            out,
            tpot_s,
        );
    let completion = ttft_s + (out - 1.0).max(0.0) * tpot_s;
    // The running requests' loss: each decodes `b` slower for about half the mean output,
    // and waits out what this prompt's prefill adds to their steps.
    let own_prefill_s = if own > 0 {
        prefill_time_s(f64::from(own), step_now, est.prefill_tok_s)
            - (f64::from(own) / f64::from(CHUNK_TOKENS)).ceil() * step_now
    } else {
        0.0
    };
    let damage = n * (est.step_b * out * 0.5 + own_prefill_s);
    let mut misses = 0.0;
    let own_miss = p.ttft_s.is_some_and(|t| ttft_s > t) || p.tpot_s.is_some_and(|t| tpot_s > t);
    if own_miss {
        misses += 1.0;
    }
    // And what it costs the requests that will come after it: a worker with a long queue
    // keeps its later arrivals waiting behind this prompt for about as long again.
    let later = s.uncached_in_flight as f64 / est.prefill_tok_s;
    // The requests to come: a prompt that fits below this worker's window takes prefill
    // capacity only the larger windows have (priced at the pressure on them), and one that
    // overflows a full cache evicts prefixes that would have been reused.
    let own_s = f64::from(own) / est.prefill_tok_s;
    let reserved = if hot.context_window > ahead.smallest_window {
        p.reserve * ahead.pressure * own_s
    } else {
        0.0
    };
    let evicted = if ahead.reuse > 0.0 {
        p.evict * ahead.reuse * evicted_tokens(ctx, i, est.kv_tokens, own) / est.prefill_tok_s
    } else {
        0.0
    };
    let future = reserved + evicted;
    let mut harm = COMPLETION_WEIGHT * (p.victims * (damage + later) + future);
    if let Some(t) = p.tpot_s
        && step_now <= t
        && tpot_s > t
    {
        misses += p.victims * n;
        harm += p.victims * n;
    }
    Prediction {
        ttft_s,
        tpot_s,
        score: misses + COMPLETION_WEIGHT * (completion + p.victims * damage + future),
        harm,
        own_miss,
    }
}

/// Tokens of other prefixes a prompt of `own` uncached tokens evicts from worker `i`'s cache:
/// what overflows the cache of `kv_tokens` (else the index's bound) given the blocks the
/// router's prefix index credits it with. 0 when the cache size is unknown.
#[inline]
fn evicted_tokens(ctx: &RuleCtx<'_>, i: u32, kv_tokens: Option<f64>, own: u32) -> f64 {
    let id = crate::worker::WorkerId(i);
    let block = f64::from(crate::signals::PREFIX_BLOCK_TOKENS);
    let Some(size) = kv_tokens.or_else(|| ctx.index.bound_of(id).map(|b| b as f64 * block)) else {
        return 0.0;
    };
    let held = ctx.index.blocks_of(id) as f64 * block;
    (held + f64::from(own) - size).clamp(0.0, f64::from(own))
}

/// How long a request whose uncached prompt needs `own` tokens of KV waits for memory on a
/// worker of `kv_tokens`: the resident set (prompts in flight plus about half of each running
/// request's output) drains in about one request lifetime (`out` tokens at `tpot_s`), so the
/// excess waits its share of that lifetime. 0 when it fits or the KV size is unknown.
#[inline]
fn kv_wait_s(kv_tokens: Option<f64>, prompts: f64, n: f64, own: u32, out: f64, tpot_s: f64) -> f64 {
    let Some(kv) = kv_tokens else {
        return 0.0;
    };
    let resident = prompts + n * out * 0.5;
    let excess = resident + f64::from(own) - kv;
    if excess > 0.0 && resident > 0.0 {
        excess.min(resident) / resident * out * tpot_s
    } else {
        0.0
    }
}

/// The `predictive` choice: a position in `cands` among the open candidates, `None` when all
/// are full. Never inlined into `Chooser::pick`, whose other arms are the hot path of every
/// other policy.
#[inline(never)]
pub(crate) fn predictive<R: Rng + ?Sized, O: Observe>(
    ctx: &RuleCtx<'_>,
    cands: &[u32],
    hot: &[Hot],
    p: &PredictiveParams,
    rng: &mut R,
    why: &mut O,
) -> Option<usize> {
    let k = cands.len();
    let ahead = Ahead::of(ctx, cands, hot, p);
    let mut best: Option<(usize, f64)> = None;
    // The least harm to others among the candidates, and whether any could meet the bounds:
    // a request that misses wherever it goes is written off where it hurts the rest least.
    let mut least_harm: Option<(usize, f64)> = None;
    let mut feasible = false;
    let mut consider = |pos: usize, best: &mut Option<(usize, f64)>| {
        let i = cands[pos];
        let h = &hot[i as usize];
        if !h.open() {
            return;
        }
        let pr = predict_with(ctx, i, h, p, &ahead);
        why.scored(i, pr.score, Some(&pr));
        let s = pr.score;
        feasible |= !pr.own_miss;
        if least_harm.is_none_or(|b| pr.harm < b.1) {
            least_harm = Some((pos, pr.harm));
        }
        if best.is_none_or(|b| s < b.1) {
            *best = Some((pos, s));
        }
    };
    if k <= p.scan as usize {
        for pos in 0..k {
            consider(pos, &mut best);
        }
        return if feasible { best } else { least_harm }.map(|b| b.0);
    }
    for _ in 0..p.scan.max(1) {
        consider(below(rng, k), &mut best);
    }
    // The prefix holder competes too when it is a candidate (its position comes from the
    // router, which keeps each member's; no search of `cands`).
    if p.prefix_aware
        && let Some(pos) = ctx.holder_pos
    {
        consider(pos, &mut best);
    }
    if best.is_none() {
        // Every draw was full: scan them all.
        for pos in 0..k {
            consider(pos, &mut best);
        }
    }
    if feasible { best } else { least_harm }.map(|b| b.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::Sample;
    use crate::rules::tests::Case;
    use crate::signals::Charge;
    use crate::time::Time;
    use crate::weights::Completion;
    use crate::worker::WorkerId;
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;
    use std::time::Duration;

    impl Case {
        /// Teach worker `i` a prefill speed and a decode step `a + b·n` through completions,
        /// as the router would learn them.
        fn teach(&mut self, i: usize, prefill_tok_s: f64, a: f64, b: f64) {
            for k in 0..64u32 {
                let n = f64::from(1 + k % 8);
                let tpot = a + b * n;
                let tokens = 2_048 + 512 * (k % 4);
                let ttft = prefill_time_s(f64::from(tokens), tpot, prefill_tok_s);
                let first = Time::ZERO + Duration::from_secs_f64(ttft);
                let c = Completion {
                    prompt_tokens: tokens,
                    output_tokens: 200,
                    dispatched_at: Time::ZERO,
                    first_token_at: first,
                    completed_at: first + Duration::from_secs_f64(tpot * 199.0),
                };
                let s = Sample {
                    weight: 1.0,
                    round_trip_s: 0.0,
                    prefill_tokens: tokens,
                    sharing: n,
                };
                self.capacity.learn(i, &c, s);
            }
        }

        fn choose(&self, prompt: u32, prefix: &[u64], p: &PredictiveParams) -> Option<usize> {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
            predictive(
                &self.ctx(prompt, prefix),
                &self.cands,
                &self.hot,
                p,
                &mut rng,
                &mut (),
            )
        }
    }

    fn waiting(tokens: u32) -> Charge {
        Charge {
            tokens,
            uncached: tokens,
            ..Charge::NONE
        }
    }

    #[test]
    fn a_long_prompt_goes_where_the_prefill_backlog_clears_first_not_to_the_fewest_requests() {
        // Worker 0: 4x the prefill speed, more requests in flight, the same backlog in tokens.
        let mut c = Case::new(&[6, 2]);
        c.teach(0, 40_000.0, 0.02, 0.001);
        c.teach(1, 10_000.0, 0.02, 0.001);
        c.signals[0].charge(waiting(20_000));
        c.signals[1].charge(waiting(20_000));
        let p = PredictiveParams::DEFAULT;
        assert_eq!(c.choose(8_000, &[], &p), Some(0));
        let (fast, slow) = (
            predict(&c.ctx(8_000, &[]), 0, &c.hot[0], &p),
            predict(&c.ctx(8_000, &[]), 1, &c.hot[1], &p),
        );
        // 28,000 tokens in 55 chunks of 509, each a mixed step beside the decode at 6 and 2
        // running: the decode is the longer part at 40,000 tok/s (55 x (0.026 + 0.6 x 0.0127)), the prefill at 10,000.
        let want_fast = prefill_time_s(28_000.0, 0.026, 40_000.0);
        let want_slow = prefill_time_s(28_000.0, 0.022, 10_000.0);
        assert!((want_fast - 1.85).abs() < 0.01, "{want_fast}");
        assert!((want_slow - 3.526).abs() < 0.01, "{want_slow}");
        assert!((fast.ttft_s / want_fast - 1.0).abs() < 0.02, "{fast:?}");
        assert!((slow.ttft_s / want_slow - 1.0).abs() < 0.02, "{slow:?}");
        // The pool-constant ablation cannot tell them apart and takes the shorter queue.
        let pool = PredictiveParams {
            pool_prefill_tok_s: Some(15_000.0),
            ..p
        };
        assert_eq!(c.choose(8_000, &[], &pool), Some(1));
    }

    #[test]
    fn a_request_that_misses_everywhere_is_written_off_where_it_hurts_the_rest_least() {
        // A 2 s TTFT bound no worker can meet for a 40,000-token prompt. Worker 0 is the
        // fastest but has 2 requests running and a 30,000-token queue; worker 1 is slow and
        // idle. The least completion would be worker 0; written off, the prompt goes to 1.
        let mut c = Case::new(&[2, 0]);
        c.teach(0, 40_000.0, 0.02, 0.001);
        c.teach(1, 4_000.0, 0.04, 0.002);
        c.signals[0].charge(waiting(30_000));
        let bounded = PredictiveParams {
            ttft_s: Some(2.0),
            tpot_s: Some(0.1),
            ..PredictiveParams::DEFAULT
        };
        let ctx = c.ctx(40_000, &[]);
        let (fast, slow) = (
            predict(&ctx, 0, &c.hot[0], &bounded),
            predict(&ctx, 1, &c.hot[1], &bounded),
        );
        assert!(fast.own_miss && slow.own_miss, "{fast:?} {slow:?}");
        assert!(fast.score < slow.score, "worker 0 completes first");
        assert!(slow.harm < fast.harm, "{fast:?} {slow:?}");
        assert_eq!(c.choose(40_000, &[], &bounded), Some(1));
        // A prompt worker 0 can serve in time goes there, harm or not.
        assert_eq!(c.choose(2_000, &[], &bounded), Some(0));
        // Without bounds nothing is ever written off: the least completion plus damage.
        assert_eq!(c.choose(40_000, &[], &PredictiveParams::DEFAULT), Some(0));
    }

    #[test]
    fn a_cached_prefix_counts_only_when_the_policy_is_prefix_aware() {
        let mut c = Case::new(&[3, 2]);
        c.teach(0, 10_000.0, 0.02, 0.001);
        c.teach(1, 10_000.0, 0.02, 0.001);
        let prefix: Vec<u64> = (1..=16).collect();
        c.index.record(&prefix, WorkerId(0));
        let p = PredictiveParams::DEFAULT;
        // 16 blocks (8,192 tokens) cached on worker 0: its prefill is 0.
        assert_eq!(c.choose(8_192, &prefix, &p), Some(0));
        let blind = PredictiveParams {
            prefix_aware: false,
            ..p
        };
        assert_eq!(c.choose(8_192, &prefix, &blind), Some(1));
    }

    #[test]
    fn a_worker_whose_decode_would_break_the_tpot_bound_is_avoided() {
        // Worker 0 steps 0.02 + 0.004·n: at 20 running plus this one, 0.104 s > 0.1 s, and it
        // would push its 20 running requests over the bound too. Worker 1 prefills slower but
        // stays feasible.
        let mut c = Case::new(&[20, 4]);
        c.teach(0, 40_000.0, 0.02, 0.004);
        c.teach(1, 8_000.0, 0.03, 0.002);
        let bounded = PredictiveParams {
            ttft_s: Some(2.0),
            tpot_s: Some(0.1),
            ..PredictiveParams::DEFAULT
        };
        let pr = predict(&c.ctx(1_000, &[]), 0, &c.hot[0], &bounded);
        assert!(pr.tpot_s > 0.1 && pr.score > 20.0, "{pr:?}");
        assert_eq!(c.choose(1_000, &[], &bounded), Some(1));
    }

    #[test]
    fn a_short_request_keeps_off_the_only_long_window_when_long_prompts_press_on_it() {
        // Worker 0: the one 131k window, twice as fast; worker 1: a 16k window. Both idle.
        let mut c = Case::new(&[0, 0]);
        c.hot[0].context_window = 131_072;
        c.hot[1].context_window = 16_384;
        c.teach(0, 20_000.0, 0.02, 0.001);
        c.teach(1, 10_000.0, 0.02, 0.001);
        let f = c.capacity.foresight_mut(0);
        f.refresh([(131_072, 20_000.0), (16_384, 10_000.0)].into_iter());
        // 80 % of the routed tokens come in 60k prompts only worker 0 holds: pressure
        // 0.8 / (2/3) = 1.2.
        for _ in 0..50 {
            f.observe(60_000, 60_000, 0);
            f.observe(15_000, 15_000, 0);
        }
        assert!((f.pressure(16_384) - 1.2).abs() < 0.01);
        let off = PredictiveParams::DEFAULT;
        // Myopic: the faster worker finishes the 8,000-token prompt first.
        assert_eq!(c.choose(8_000, &[], &off), Some(0));
        let on = PredictiveParams {
            reserve: 2.0,
            ..off
        };
        assert_eq!(c.choose(8_000, &[], &on), Some(1));
        // A request that only worker 0 can hold is not charged: it has no other place.
        let ctx = c.ctx(60_000, &[]);
        let only = [0u32];
        let ahead = Ahead::of(&ctx, &only, &c.hot, &on);
        assert_eq!(ahead.smallest_window, 131_072);
        let (with, without) = (
            predict_with(&ctx, 0, &c.hot[0], &on, &ahead),
            predict_with(&ctx, 0, &c.hot[0], &off, &Ahead::NONE),
        );
        assert_eq!(with.score, without.score);
        // With no pressure (no long prompts seen), the term costs nothing.
        let mut calm = Case::new(&[0, 0]);
        calm.hot[0].context_window = 131_072;
        calm.hot[1].context_window = 16_384;
        calm.teach(0, 20_000.0, 0.02, 0.001);
        calm.teach(1, 10_000.0, 0.02, 0.001);
        assert_eq!(calm.choose(8_000, &[], &on), Some(0));
    }

    #[test]
    fn a_prompt_that_overflows_a_full_cache_pays_for_the_reused_prefixes_it_evicts() {
        // Two idle workers with 64-block caches; worker 0's is full, worker 1's nearly empty;
        // worker 0 prefills 10 % faster, so the myopic choice is worker 0.
        let mut c = Case::new(&[0, 0]);
        c.teach(0, 11_000.0, 0.02, 0.001);
        c.teach(1, 10_000.0, 0.02, 0.001);
        c.capacity.set_cache_blocks(0, Some(64));
        c.capacity.set_cache_blocks(1, Some(64));
        let full: Vec<u64> = (1000..1064).collect();
        c.index.record(&full, WorkerId(0));
        c.index.record(&[7, 8], WorkerId(1));
        let f = c.capacity.foresight_mut(0);
        f.refresh([(1 << 20, 10_000.0), (1 << 20, 10_000.0)].into_iter());
        for _ in 0..10 {
            f.observe(10_000, 10_000, 9_000);
        }
        assert!((f.reuse() - 0.9).abs() < 1e-9);
        let off = PredictiveParams::DEFAULT;
        assert_eq!(c.choose(16_384, &[], &off), Some(0));
        let on = PredictiveParams { evict: 1.0, ..off };
        let ctx = c.ctx(16_384, &[]);
        let ahead = Ahead::of(&ctx, &c.cands, &c.hot, &on);
        assert!((ahead.reuse - 0.9).abs() < 1e-9);
        // Worker 0 evicts all 16,384 tokens' worth (its cache is full); worker 1 none.
        assert_eq!(evicted_tokens(&ctx, 0, Some(32_768.0), 16_384), 16_384.0);
        assert_eq!(evicted_tokens(&ctx, 1, Some(32_768.0), 16_384), 0.0);
        assert_eq!(c.choose(16_384, &[], &on), Some(1));
    }

    #[test]
    fn full_candidates_are_skipped_and_all_full_is_none() {
        let mut c = Case::new(&[0, 5]);
        c.hot[0].cap = 0;
        assert_eq!(c.choose(100, &[], &PredictiveParams::DEFAULT), Some(1));
        c.hot[1].cap = 5;
        assert_eq!(c.choose(100, &[], &PredictiveParams::DEFAULT), None);
    }

    #[test]
    fn sampled_scans_find_the_holder_and_agree_with_the_full_scan_when_it_covers_all() {
        let n = 100;
        let mut c = Case::new(&vec![4; n]);
        for i in 0..n {
            c.teach(i, 10_000.0, 0.02, 0.001);
        }
        let prefix: Vec<u64> = (1..=16).collect();
        c.index.record(&prefix, WorkerId(77));
        let two = PredictiveParams {
            scan: 2,
            ..PredictiveParams::DEFAULT
        };
        // Whatever two are drawn, the holder (8,192 tokens cached) competes and wins.
        assert_eq!(c.choose(8_192, &prefix, &two), Some(77));
        // A scan as wide as the fleet is the exact argmin: the least loaded worker.
        c.hot[41].in_flight = 0;
        let all = PredictiveParams {
            scan: n as u32,
            ..PredictiveParams::DEFAULT
        };
        assert_eq!(c.choose(100, &[], &all), Some(41));
    }
}
