//! Prefix affinity: the source's example, in raw and in capacity units.
//!
//! The prompt is 8,000 tokens (allowance 2 + 0.25 × 8 = 4.0), carried as 500 prefix blocks of
//! 16 tokens. The in-flight state is built by routing: while one worker is disconnected every
//! request must go to the other, so fillers (no prefix) land exactly where needed, and the
//! conversation's first request records the holder in the router's prefix index.

use crate::common::*;
use routelab_policies::{Decision, PolicyConfig, Router, Time, WorkerId};

const PROMPT_TOKENS: u32 = 8_000;
const BLOCKS: usize = 500;

struct Scene {
    router: Router,
    holder: WorkerId,
    other: WorkerId,
    prefix: Vec<u64>,
}

/// PRO 6000 pinned at 1.34 and pair at 0.66; `holder` holds the conversation's prefix.
fn scene(config: PolicyConfig, holder_is_pro: bool, holder_n: u32, other_n: u32) -> Scene {
    let (mut router, pair, pro) = pinned_source_fleet(config);
    let (holder, other) = if holder_is_pro {
        (pro, pair)
    } else {
        (pair, pro)
    };
    let m = model(&router);
    let mut rng = rng(9);
    let prefix = blocks(42, BLOCKS);
    let t = Time::ZERO;

    router.disconnect(t, holder).unwrap();
    for _ in 0..other_n {
        assert_eq!(
            router.route(t, &req(m, 500, &[]), &mut rng).unwrap().worker,
            other
        );
    }
    router.reconnect(t, holder).unwrap();
    router.disconnect(t, other).unwrap();
    let first = router
        .route(t, &req(m, PROMPT_TOKENS, &prefix), &mut rng)
        .unwrap();
    assert_eq!(first.worker, holder);
    for _ in 1..holder_n {
        assert_eq!(
            router.route(t, &req(m, 500, &[]), &mut rng).unwrap().worker,
            holder
        );
    }
    router.reconnect(t, other).unwrap();

    assert_eq!(router.fleet().get(holder).unwrap().in_flight, holder_n);
    assert_eq!(router.fleet().get(other).unwrap().in_flight, other_n);
    assert_eq!(
        router.prefix_index().longest(&prefix),
        Some((holder, BLOCKS))
    );
    Scene {
        router,
        holder,
        other,
        prefix,
    }
}

fn next_turn(s: &mut Scene, tokens: u32, seed: u64) -> Decision {
    let m = model(&s.router);
    s.router
        .route(Time::ZERO, &req(m, tokens, &s.prefix), &mut rng(seed))
        .unwrap()
}

fn raw() -> PolicyConfig {
    policy("probe/p2c:higher-weight/raw/flat:24")
}

fn capacity() -> PolicyConfig {
    policy("seed-v3")
}

#[test]
fn fast_holder_with_ten_in_flight_is_kept_in_capacity_units() {
    // 10 / 1.34 = 7.5 vs 3 / 0.66 = 4.5: 3.0 busier, within the 4.0 allowance.
    for seed in 0..20 {
        let mut s = scene(capacity(), true, 10, 3);
        let d = next_turn(&mut s, PROMPT_TOKENS, seed);
        assert_eq!(d.worker, s.holder);
        assert!(d.affinity_kept);
        assert_eq!(d.believed_cached_blocks, BLOCKS as u32);
    }
}

#[test]
fn fast_holder_with_ten_in_flight_is_abandoned_in_raw_counts() {
    // 10 vs 3: 7 busier, beyond the allowance; the chooser then picks the pair (4.5 < 7.5).
    for seed in 0..20 {
        let mut s = scene(raw(), true, 10, 3);
        let d = next_turn(&mut s, PROMPT_TOKENS, seed);
        assert_eq!(d.worker, s.other);
        assert!(!d.affinity_kept);
        assert_eq!(d.believed_cached_blocks, 0);
    }
}

#[test]
fn slow_full_holder_is_abandoned_in_capacity_units() {
    // 5 / 0.66 = 7.6 vs 3 / 1.34 = 2.2: 5.3 busier, beyond 4.0.
    for seed in 0..20 {
        let mut s = scene(capacity(), false, 5, 3);
        let d = next_turn(&mut s, PROMPT_TOKENS, seed);
        assert_eq!(d.worker, s.other);
        assert!(!d.affinity_kept);
    }
}

#[test]
fn slow_full_holder_is_kept_in_raw_counts() {
    // 5 vs 3: 2 busier, within 4.0 — the conversation stays on the slow machine.
    for seed in 0..20 {
        let mut s = scene(raw(), false, 5, 3);
        let d = next_turn(&mut s, PROMPT_TOKENS, seed);
        assert_eq!(d.worker, s.holder);
        assert!(d.affinity_kept);
        assert_eq!(d.believed_cached_blocks, BLOCKS as u32);
    }
}

#[test]
fn the_allowance_grows_with_prompt_length() {
    // Same state, a 500-token turn: allowance 2.125 < 3.0, so the holder is left.
    let mut s = scene(capacity(), true, 10, 3);
    let d = next_turn(&mut s, 500, 1);
    assert!(!d.affinity_kept);
    assert_eq!(d.worker, s.other);
    // Holder 10 / 1.34 = 7.5 vs an idle pair: beyond 4.0 for 8,000 tokens, but a 24,000-token
    // turn has the largest allowance, min(2 + 6, 8) = 8, and stays.
    let mut s = scene(capacity(), true, 10, 0);
    assert!(!next_turn(&mut s, PROMPT_TOKENS, 1).affinity_kept);
    let mut s = scene(capacity(), true, 10, 0);
    let d = next_turn(&mut s, 24_000, 1);
    assert!(d.affinity_kept);
    assert_eq!(d.worker, s.holder);
    // 11 / 1.34 = 8.2 exceeds even the largest allowance.
    let mut s = scene(capacity(), true, 11, 0);
    assert!(!next_turn(&mut s, 24_000, 1).affinity_kept);
}

#[test]
fn a_holder_that_cannot_take_the_request_is_not_kept() {
    // Holder disconnected: the request goes elsewhere, and the prefix is not claimed.
    let mut s = scene(capacity(), true, 1, 0);
    s.router.disconnect(Time::ZERO, s.holder).unwrap();
    let d = next_turn(&mut s, PROMPT_TOKENS, 1);
    assert_eq!(d.worker, s.other);
    assert!(!d.affinity_kept);
    assert_eq!(d.believed_cached_blocks, 0);
    // The other worker now holds it.
    assert_eq!(
        s.router.prefix_index().longest(&s.prefix),
        Some((s.other, BLOCKS))
    );
}
