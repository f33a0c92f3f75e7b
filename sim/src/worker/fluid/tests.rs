use super::clock::{floor_nn, from_total_order, tolerance_at, total_order};
use super::*;
use crate::hardware::mixed_step_s;
use crate::worker::{Completion, InferenceEngine};
use proptest::prelude::*;
use routelab_policies::KvEvent;

const S: u64 = 1_000_000_000;

fn profile_with(extra: &str, prefill: f64, max_running: u32, kv: u64) -> Arc<HardwareProfile> {
    let src = format!(
        "name: t\ndecode:\n  points:\n    - {{ concurrency: 1, aggregate_tok_s: 100 }}\n    \
         - {{ concurrency: 8, aggregate_tok_s: 400 }}\n    - {{ concurrency: 32, aggregate_tok_s: 800 }}\n\
         prefill_tok_s: {prefill}\nkv_capacity_tokens: {kv}\nmax_running: {max_running}\n\
         context_window: 1024\n{extra}"
    );
    Arc::new(HardwareProfile::from_yaml_str(&src, "test.yaml").unwrap())
}

fn profile() -> Arc<HardwareProfile> {
    profile_with("", 1000.0, 64, 100_000)
}

fn engine(p: &Arc<HardwareProfile>) -> FluidEngine {
    FluidEngine::new(p.clone(), EngineOverrides::default(), 1)
}

fn drain(e: &mut FluidEngine) -> Vec<EngineOutput> {
    let mut out = Vec::new();
    let mut guard = 0;
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut out);
        guard += 1;
        assert!(guard < 100_000, "does not settle");
    }
    out
}

fn completions(out: &[EngineOutput]) -> Vec<Completion> {
    out.iter()
        .filter_map(|o| match o {
            EngineOutput::Completed(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn close_ns(got: u64, want_s: f64) -> bool {
    (got as f64 / S as f64 - want_s).abs() < 2e-6
}

#[test]
fn single_sequence_alone() {
    let p = profile();
    let mut e = engine(&p);
    let info = e.admit(0, Admission::new(7, 500, 200, &[]));
    assert_eq!(info.cached_tokens, Some(0));
    assert_eq!((e.running(), e.waiting(), e.in_flight()), (1, 0, 1));
    let out = drain(&mut e);
    assert_eq!(out.len(), 2);
    let prefill = 500.0 / 1000.0;
    match out[0] {
        EngineOutput::FirstToken { seq, at, .. } => {
            assert_eq!(seq, 7);
            assert!(close_ns(at, prefill), "{at}");
        }
        _ => panic!("first token first"),
    }
    // the prefill produced token 1: 199 decode steps at 100 tok/s follow
    let c = completions(&out)[0];
    assert!(close_ns(c.at, prefill + 199.0 / 100.0), "{}", c.at);
    assert_eq!(e.in_flight(), 0);
    assert!(e.next_event_time().is_none());
    assert!(close_ns(e.busy_ns(), 2.49));
}

#[test]
fn equal_sequences_finish_together_at_the_shared_rate() {
    // prefill negligible: all start decoding together
    let p = profile_with("", 1e12, 64, 100_000);
    for n in [2u64, 8, 20] {
        let mut e = engine(&p);
        for s in 0..n {
            e.admit(0, Admission::new(s, 10, 300, &[]));
        }
        let cs = completions(&drain(&mut e));
        assert_eq!(cs.len() as u64, n);
        let per = p.per_request_tok_s(n as f64);
        for c in &cs {
            assert!(
                close_ns(c.at, 299.0 / per),
                "n={n}: {} vs {}",
                c.at,
                299.0 / per
            );
        }
        // ties by sequence id
        let seqs: Vec<u64> = cs.iter().map(|c| c.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
}

#[test]
fn shorter_sequence_leaves_and_the_other_speeds_up() {
    let p = profile_with("", 1e12, 64, 100_000);
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 100, &[]));
    e.admit(0, Admission::new(2, 10, 300, &[]));
    let cs = completions(&drain(&mut e));
    let per2 = p.per_request_tok_s(2.0);
    let per1 = p.per_request_tok_s(1.0);
    // 99 and 299 decode steps after the first tokens
    let t1 = 99.0 / per2;
    assert!(close_ns(cs[0].at, t1));
    assert!(close_ns(cs[1].at, t1 + 200.0 / per1));
}

#[test]
fn prefill_competes_with_decode() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 1000, &[]));
    let mut out = Vec::new();
    e.advance_to(S, &mut out);
    // seq 1 decodes alone at 100 tok/s; a 2048-token prompt arrives
    e.admit(S, Admission::new(2, 2048, 10, &[]));
    out.clear();
    let mut first2 = None;
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut out);
        for o in out.drain(..) {
            if let EngineOutput::FirstToken { seq: 2, at, .. } = o {
                first2 = Some(at);
            }
        }
        if first2.is_some() {
            break;
        }
    }
    // 1 s is a step boundary (100 decode steps of 10 ms after the 10 ms prefill step), so the
    // prompt starts at once; each of its 4 chunks of 512 tokens shares a step with the decode:
    // the chunk's 512 ms plus the part of the 10 ms decode that does not hide under it
    let step = 0.512 + (1.0 - crate::hardware::DEFAULT_PREFILL_OVERLAP) * 0.01;
    let want = 1.0 + 4.0 * step;
    assert!(close_ns(first2.unwrap(), want), "{first2:?} vs {want}");
}

/// Runs until sequence `want`'s first token; returns its time.
fn run_to_first_token(e: &mut FluidEngine, want: u64) -> u64 {
    let mut out = Vec::new();
    let mut guard = 0;
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut out);
        if let Some(at) = first_token_of(&out, want) {
            return at;
        }
        guard += 1;
        assert!(guard < 100_000, "does not settle");
    }
    panic!("no first token for {want}")
}

#[test]
fn a_prefill_under_the_decode_bound_adds_no_time() {
    // overlap 1: a step carrying 8 decodes (8 / 400 tok/s = 20 ms) and a 10-token prefill
    // (10 ms alone) lasts the 20 ms of the decode
    let p = profile_with("prefill_overlap: 1\n", 1000.0, 64, 100_000);
    let mut with = engine(&p);
    let mut without = engine(&p);
    for e in [&mut with, &mut without] {
        for seq in 0..8 {
            e.admit(0, Admission::new(seq, 1, 1000, &[]));
        }
        let mut out = Vec::new();
        e.advance_to(S, &mut out);
    }
    // 1 s: the prefill step of the eight 1-token prompts (8 ms), then 49.6 decode steps of
    // 20 ms; the prompt joins at the next boundary, 8 ms later
    with.admit(S, Admission::new(100, 10, 5, &[]));
    let first = run_to_first_token(&mut with, 100);
    let boundary = 0.008 + 50.0 * 0.02;
    assert!(close_ns(first, boundary + 0.02), "first token at {first}");
    // the decodes beside it went exactly as fast as without it
    let mut out = Vec::new();
    without.advance_to(first, &mut out);
    let a = with.decoded_tokens(first, 0).unwrap();
    let b = without.decoded_tokens(first, 0).unwrap();
    assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    assert!((a - 51.0).abs() < 1e-6, "{a}");
}

#[test]
fn an_arrival_mid_step_starts_its_prefill_at_the_step_boundary() {
    // one sequence decodes alone: 10 ms steps, boundaries at 10 ms (its 10-token prefill) + k
    // x 10 ms
    for (overlap, mixed_step) in [(0.0, 0.02), (0.4, 0.016), (1.0, 0.01)] {
        let p = profile_with(
            &format!("prefill_overlap: {overlap}\n"),
            1000.0,
            64,
            100_000,
        );
        let mut e = engine(&p);
        e.admit(0, Admission::new(1, 10, 1000, &[]));
        let mut out = Vec::new();
        let arrival = S + 3_000_000; // 3 ms into the step that ends at 1.01 s
        e.advance_to(arrival, &mut out);
        e.admit(arrival, Admission::new(2, 10, 5, &[]));
        let first = run_to_first_token(&mut e, 2);
        // 7 ms to the boundary, then one mixed step that prefills all 10 tokens
        let want = 1.01 + mixed_step;
        assert!(
            close_ns(first, want),
            "overlap {overlap}: {first} vs {want}"
        );
    }
}

#[test]
fn the_first_token_comes_at_the_end_of_the_step_that_finishes_the_prefill() {
    let p = profile();
    // alone: a 600-token prompt is a 512-token step and an 88-token step
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 600, 5, &[]));
    let first = run_to_first_token(&mut e, 1);
    assert!(close_ns(first, 0.6), "{first}");
    // beside a decoding sequence (10 ms steps): the second step carries 88 prompt tokens
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 1000, &[]));
    let mut out = Vec::new();
    e.advance_to(S, &mut out);
    e.admit(S, Admission::new(2, 600, 5, &[]));
    let first = run_to_first_token(&mut e, 2);
    let o = crate::hardware::DEFAULT_PREFILL_OVERLAP;
    let want = 1.0 + (0.512 + (1.0 - o) * 0.01) + (0.088 + (1.0 - o) * 0.01);
    assert!(close_ns(first, want), "{first} vs {want}");
}

#[test]
fn fifo_waiting_when_max_running_reached() {
    let p = profile_with("", 1e12, 2, 100_000);
    let mut e = engine(&p);
    assert!(!e.admit(0, Admission::new(1, 10, 100, &[])).waits());
    assert!(!e.admit(0, Admission::new(2, 10, 200, &[])).waits());
    assert!(e.admit(0, Admission::new(3, 10, 50, &[])).waits());
    assert!(e.admit(0, Admission::new(4, 10, 10, &[])).waits());
    assert_eq!((e.running(), e.waiting(), e.in_flight()), (2, 2, 4));
    let out = drain(&mut e);
    let cs = completions(&out);
    let order: Vec<u64> = cs.iter().map(|c| c.seq).collect();
    // 1 finishes first; 3 starts then; 4 starts when the next one finishes
    assert_eq!(cs[0].seq, 1);
    let c3 = cs.iter().find(|c| c.seq == 3).unwrap();
    let c4 = cs.iter().find(|c| c.seq == 4).unwrap();
    assert_eq!(c3.started_at, cs[0].at, "{order:?}");
    assert!(c4.started_at > c3.started_at);
    assert_eq!(c4.admitted_at, 0);
    // outputs in time order
    assert!(out.windows(2).all(|w| w[0].at() <= w[1].at()));
}

#[test]
fn kv_capacity_limits_the_running_set() {
    let p = profile_with("", 1e12, 64, 100_000);
    let o = EngineOverrides {
        kv_capacity_tokens: Some(1000),
        ..EngineOverrides::default()
    };
    let mut e = FluidEngine::new(p, o, 1);
    // each reserves its prompt and four fifths of its output: 300 + 200
    assert!(!e.admit(0, Admission::new(1, 300, 250, &[])).waits());
    assert!(!e.admit(0, Admission::new(2, 300, 250, &[])).waits());
    assert!(e.admit(0, Admission::new(3, 1, 1, &[])).waits()); // 1002 > 1000
    assert_eq!(e.kv_used_tokens(), 1000);
    // larger than the whole cache: runs alone once the engine is empty
    assert!(e.admit(0, Admission::new(4, 3000, 10, &[])).waits());
    let cs = completions(&drain(&mut e));
    assert_eq!(cs.len(), 4);
    let c4 = cs.iter().find(|c| c.seq == 4).unwrap();
    assert!(
        cs.iter()
            .filter(|c| c.seq != 4)
            .all(|c| c.at <= c4.started_at)
    );
}

#[test]
fn cached_prefix_skips_prefill() {
    let p = profile();
    let mut e = engine(&p);
    let blocks = [11, 12, 13];
    assert_eq!(
        e.admit(0, Admission::new(1, 1536, 1, &blocks))
            .cached_tokens,
        Some(0)
    );
    drain(&mut e);
    assert_eq!(e.cached_blocks(), 3);
    assert_eq!(e.peek_cached_tokens(1600, &[11, 12, 99]), 1024);
    // same prefix, longer prompt: only 64 tokens to prefill
    let t0 = 100 * S;
    let mut out = Vec::new();
    e.advance_to(t0, &mut out);
    let info = e.admit(t0, Admission::new(2, 1600, 1, &[11, 12, 13, 14]));
    assert_eq!(info.cached_tokens, Some(1536));
    let out = drain(&mut e);
    match out[0] {
        EngineOutput::FirstToken {
            seq: 2,
            at,
            cached_tokens: 1536,
        } => assert!(close_ns(at - t0, 64.0 / 1000.0)),
        o => panic!("{o:?}"),
    }
    // the identical prompt: capped at prompt - 1
    let t1 = 200 * S;
    e.advance_to(t1, &mut Vec::new());
    assert_eq!(
        e.admit(t1, Admission::new(3, 1536, 1, &blocks))
            .cached_tokens,
        Some(1535)
    );
    // a different first block: nothing cached even if later blocks match
    assert_eq!(
        e.admit(t1, Admission::new(4, 1536, 1, &[99, 12, 13]))
            .cached_tokens,
        Some(0)
    );
    drain(&mut e);
}

#[test]
fn prefix_cache_is_lru_bounded() {
    // 2 blocks of KV; a running 101-token sequence leaves room for one cached block
    let p = profile_with("", 1e12, 64, 1024);
    let mut e = engine(&p);
    for (i, b) in [1u64, 2, 3].iter().enumerate() {
        e.admit(i as u64 * S, Admission::new(i as u64, 100, 1, &[*b]));
        drain(&mut e);
    }
    assert_eq!(e.cached_blocks(), 2);
    assert_eq!(e.peek_cached_tokens(600, &[1]), 0);
    assert_eq!(e.peek_cached_tokens(600, &[2]), 512);
    assert_eq!(e.peek_cached_tokens(600, &[3]), 512);
}

#[test]
fn restart_fails_in_flight_and_comes_back_cold() {
    let p = profile_with(
        "cold_start: { speed_factor: 0.5, warmup_tokens: 100 }\n",
        1e12,
        2,
        100_000,
    );
    let mut e = engine(&p);
    assert!(e.is_warm());
    e.admit(0, Admission::new(1, 10, 100, &[5]));
    e.admit(0, Admission::new(2, 10, 100, &[]));
    e.admit(0, Admission::new(3, 10, 100, &[]));
    let mut out = Vec::new();
    e.advance_to(S / 10, &mut out);
    let failed = e.restart(S / 10, 2 * S, true);
    assert_eq!(failed, vec![1, 2, 3]);
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.cached_blocks(), 0);
    assert!(!e.is_warm() && !e.is_up(S));
    // admitted before ready: waits for ready, then runs at half speed for 100 tokens
    e.admit(S, Admission::new(4, 10, 200, &[]));
    let cs = completions(&drain(&mut e));
    assert_eq!(cs.len(), 1);
    // from t = 2 s: 10 prefill tokens + 90 decode tokens at 50 tok/s, then the remaining 109
    // of its 199 decode steps at 100 tok/s
    assert!(close_ns(cs[0].at, 2.0 + 1.8 + 1.09), "{}", cs[0].at);
    assert!(e.is_warm());
    let failed = e.crash(10 * S);
    assert!(failed.is_empty());
    assert!(!e.is_up(11 * S));
}

#[test]
fn zero_output_completes_at_prefill_end() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 100, 0, &[]));
    let out = drain(&mut e);
    assert_eq!(out.len(), 1);
    assert!(close_ns(out[0].at(), 0.1));
}

#[test]
fn stale_generation_and_deferred_outputs() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 100, 10, &[]));
    let g = e.generation();
    let t = e.next_event_time().unwrap();
    // a late admission after that event, without advancing first: outputs are kept
    e.admit(t + S, Admission::new(2, 100, 10, &[]));
    assert_ne!(e.generation(), g);
    let mut out = Vec::new();
    e.advance_to(t + S, &mut out);
    assert!(matches!(out[0], EngineOutput::FirstToken { seq: 1, .. }));
    assert_eq!(out[0].at(), t);
    let rest = drain(&mut e);
    assert_eq!(completions(&out).len() + completions(&rest).len(), 2);
}

#[test]
fn degraded_node_is_slower() {
    let p = profile_with("", 1e12, 64, 100_000);
    let o = EngineOverrides {
        speed_factor: 0.5,
        ..EngineOverrides::default()
    };
    let mut e = FluidEngine::new(p.clone(), o, 1);
    e.admit(0, Admission::new(1, 10, 100, &[]));
    let cs = completions(&drain(&mut e));
    assert!(close_ns(cs[0].at, 99.0 / 50.0));
}

fn burst_tok_s(e: &mut FluidEngine, start: u64) -> f64 {
    e.advance_to(start, &mut Vec::new());
    for s in 0..16 {
        e.admit(start, Admission::new(start + s, 64, 128, &[]));
    }
    let end = drain(e).iter().map(|o| o.at()).max().unwrap();
    2048.0 / ((end - start) as f64 / S as f64)
}

#[test]
fn noise_is_seeded() {
    let p = profile();
    let o = EngineOverrides {
        request_noise_cv: 0.2,
        epoch_noise_cv: 0.06,
        epoch_s: 60.0,
        ..EngineOverrides::default()
    };
    let run = |seed| {
        let mut e = FluidEngine::new(p.clone(), o.clone(), seed);
        (0..5u64)
            .map(|i| burst_tok_s(&mut e, i * 120 * S))
            .collect::<Vec<f64>>()
    };
    let a = run(1);
    assert_eq!(a, run(1));
    assert_ne!(a, run(2));
    // repeated probes differ (epoch noise) but stay near the noiseless figure
    let mut clean = engine(&p);
    let base = burst_tok_s(&mut clean, 0);
    assert!(a.windows(2).any(|w| w[0] != w[1]), "{a:?}");
    for x in &a {
        assert!((x / base - 1.0).abs() < 0.4, "{x} vs {base}");
    }
}

#[test]
fn steady_state_does_not_grow() {
    let p = profile();
    let mut e = engine(&p);
    let mut out = Vec::new();
    let mut t = 0;
    for i in 0..20_000u64 {
        t += S / 2;
        e.advance_to(t, &mut out);
        out.clear();
        let prefix = [i % 300, 1_000 + i % 7];
        e.admit(t, Admission::new(i, 200, 20, &prefix));
    }
    assert!(e.slots.len() < 20, "slab grew to {}", e.slots.len());
    // the cache holds at most what the running sequences hold plus the free KV's blocks
    let held: usize = e.slots.iter().map(|s| s.held as usize).sum();
    let free_blocks = (e.kv_capacity_tokens() - e.kv_used_tokens()) / u64::from(BLOCK_TOKENS);
    assert!(e.core.cache.evictable() as u64 <= free_blocks);
    assert!(e.core.cache.len() <= held + e.core.cache.evictable());
}

/// The free slots as the free list links them, from its head.
fn free_list(e: &FluidEngine) -> Vec<u32> {
    e.slots.free_list()
}

#[test]
fn free_slots_are_reused_last_freed_first_and_lowest_first_after_a_restart() {
    let p = profile();
    let mut e = engine(&p);
    for seq in 0..4 {
        e.admit(0, Admission::new(seq, 100, 50, &[]));
    }
    assert_eq!(e.slots.len(), 4);
    assert!(free_list(&e).is_empty());
    assert!(e.abort(0, 1));
    assert!(e.abort(0, 2));
    assert_eq!(free_list(&e), vec![2, 1]);
    e.admit(0, Admission::new(10, 100, 50, &[]));
    assert_eq!(e.slots[2].seq, 10);
    assert_eq!(free_list(&e), vec![1]);
    e.restart(S, S, false);
    assert_eq!(free_list(&e), vec![0, 1, 2, 3]);
    e.admit(S, Admission::new(20, 100, 50, &[]));
    e.admit(S, Admission::new(21, 100, 50, &[]));
    assert_eq!((e.slots[0].seq, e.slots[1].seq), (20, 21));
    assert_eq!(e.slots.len(), 4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Against the slots themselves: the free list holds each free slot once and nothing
    /// else, and an admission takes its head (a new slot only when it is empty).
    #[test]
    fn the_free_list_holds_exactly_the_free_slots(
        ops in proptest::collection::vec((any::<bool>(), 0u64..12, 1u64..400), 1..120),
    ) {
        let p = profile_with("", 2000.0, 4, 100_000);
        let mut e = engine(&p);
        let mut out = Vec::new();
        let mut t = 0;
        let mut next_seq = 100;
        for (admit, pick, gap_ms) in ops {
            t += gap_ms * 1_000_000;
            e.advance_to(t, &mut out);
            out.clear();
            if admit {
                let expect = free_list(&e).first().copied().unwrap_or(e.slots.len() as u32);
                e.admit(t, Admission::new(next_seq, 200, 30, &[]));
                prop_assert_eq!(e.slots[expect as usize].seq, next_seq);
                next_seq += 1;
            } else if let Some(h) = e
                .slots
                .iter()
                .position(|s| s.phase != Phase::Free && s.seq % 12 == pick)
            {
                let seq = e.slots[h].seq;
                prop_assert!(e.abort(t, seq));
            }
            let mut listed = free_list(&e);
            listed.sort_unstable();
            let free: Vec<u32> = (0..e.slots.len() as u32)
                .filter(|&h| e.slots[h as usize].phase == Phase::Free)
                .collect();
            prop_assert_eq!(listed, free);
        }
    }
}

#[derive(Debug, Clone)]
struct Arrival {
    gap_ms: u64,
    prompt: u32,
    output: u32,
    prefix: Vec<u64>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0u64..2_000,
        0u32..3_000,
        0u32..300,
        proptest::collection::vec(0u64..6, 0..4),
    )
        .prop_map(|(gap_ms, prompt, output, prefix)| Arrival {
            gap_ms,
            prompt,
            output,
            prefix,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_admissions_complete_once_in_order(
        arrivals in proptest::collection::vec(arrival(), 1..60),
        max_running in 1u32..10,
        kv in 2_000u64..20_000,
        noise in prop_oneof![Just(0.0), 0.0f64..0.5],
        seed in any::<u64>(),
        cold in any::<bool>(),
    ) {
        let p = profile_with(
            "cold_start: { speed_factor: 0.3, warmup_tokens: 500 }\n",
            2000.0,
            max_running,
            kv.max(1024),
        );
        let o = EngineOverrides {
            request_noise_cv: noise,
            epoch_noise_cv: noise / 4.0,
            epoch_s: 1.0,
            start_cold: cold,
            ..EngineOverrides::default()
        };
        let mut e = FluidEngine::new(p, o, seed);
        let mut out = Vec::new();
        let mut t = 0u64;
        for (i, a) in arrivals.iter().enumerate() {
            t += a.gap_ms * 1_000_000;
            // deliver the events before the next arrival, as the event engine would
            while let Some(te) = e.next_event_time() {
                if te > t { break; }
                e.advance_to(te, &mut out);
            }
            e.advance_to(t, &mut out);
            let info = e.admit(t, Admission::new(i as u64, a.prompt, a.output, &a.prefix));
            if let Some(c) = info.cached_tokens {
                prop_assert!(c < a.prompt.max(1));
            }
            prop_assert!(e.speed_multiplier().is_finite());
        }
        let mut guard = 0;
        while let Some(te) = e.next_event_time() {
            e.advance_to(te, &mut out);
            guard += 1;
            prop_assert!(guard < 1_000_000);
        }
        prop_assert_eq!(e.in_flight(), 0);
        prop_assert!(out.windows(2).all(|w| w[0].at() <= w[1].at()));
        let mut done = vec![0u32; arrivals.len()];
        let mut first = vec![None; arrivals.len()];
        for o in &out {
            match o {
                EngineOutput::FirstToken { seq, at, .. } => {
                    prop_assert!(first[*seq as usize].is_none());
                    first[*seq as usize] = Some(*at);
                }
                EngineOutput::Completed(c) => {
                    done[c.seq as usize] += 1;
                    prop_assert!(c.admitted_at <= c.started_at);
                    prop_assert!(c.started_at <= c.first_token_at);
                    prop_assert!(c.first_token_at <= c.at);
                    if c.output_tokens > 0 {
                        prop_assert_eq!(first[c.seq as usize], Some(c.first_token_at));
                    }
                }
            }
        }
        prop_assert!(done.iter().all(|&d| d == 1), "{:?}", done);
    }
}

/// `cargo test -p routelab-sim --release -- --ignored engine_throughput --nocapture`
#[test]
#[ignore = "timing, run in release"]
fn engine_throughput() {
    let p = profile_with("", 8000.0, 64, 200_000);
    let mut e = engine(&p);
    let mut out = Vec::with_capacity(1024);
    let n = 2_000_000u64;
    let start = std::time::Instant::now();
    let mut t = 0;
    let mut completed = 0u64;
    for i in 0..n {
        t += S / 8; // ~8 req/s on one engine, well below saturation
        while let Some(te) = e.next_event_time() {
            if te > t {
                break;
            }
            e.advance_to(te, &mut out);
        }
        completed += out
            .iter()
            .filter(|o| matches!(o, EngineOutput::Completed(_)))
            .count() as u64;
        out.clear();
        let prefix = [i % 1000];
        e.admit(
            t,
            Admission::new(i, 300, 60, if i % 2 == 0 { &prefix } else { &[] }),
        );
    }
    let el = start.elapsed();
    println!(
        "{n} admissions, {completed} completions, in flight {} : {:.0} ns per request",
        e.in_flight(),
        el.as_nanos() as f64 / n as f64
    );
}

#[test]
fn decoded_tokens_tracks_decode_progress() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(7, 500, 200, &[]));
    // prefilling: not decoding yet
    assert_eq!(e.decoded_tokens(S / 4, 7), None);
    assert_eq!(e.decoded_tokens(0, 99), None);
    let mut out = Vec::new();
    let first = e.next_event_time().unwrap();
    e.advance_to(first, &mut out);
    assert!(matches!(out[0], EngineOutput::FirstToken { seq: 7, .. }));
    assert_eq!(e.decoded_tokens(first, 7), Some(0.0));
    // alone at 100 tok/s: 1 s later, 100 decode steps
    let d = e.decoded_tokens(first + S, 7).unwrap();
    assert!((d - 100.0).abs() < 1e-3, "{d}");
    // a second sequence joins at 1 s: progress so far is unchanged by the admission
    let t1 = first + S;
    e.admit(t1, Admission::new(8, 1, 50, &[]));
    let d1 = e.decoded_tokens(t1, 7).unwrap();
    assert!((d1 - 100.0).abs() < 1e-3, "{d1}");
    // clamped at its decode steps (the output length less the prefill's token) far ahead
    assert_eq!(e.decoded_tokens(first + 1000 * S, 7), Some(199.0));
    let out = drain(&mut e);
    assert_eq!(completions(&out).len(), 2);
    assert_eq!(e.decoded_tokens(first + 1000 * S, 7), None);
}

// ----- abort (a client that went away) -------------------------------------------------------

fn first_token_of(out: &[EngineOutput], want: u64) -> Option<u64> {
    out.iter().find_map(|o| match o {
        EngineOutput::FirstToken { seq, at, .. } if *seq == want => Some(*at),
        _ => None,
    })
}

#[test]
fn aborting_a_decoding_sequence_frees_its_slot_and_the_other_speeds_up() {
    let p = profile_with("", 1e12, 64, 100_000);
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 300, &[]));
    e.admit(0, Admission::new(2, 10, 300, &[]));
    let per2 = p.per_request_tok_s(2.0);
    let per1 = p.per_request_tok_s(1.0);
    let half = ((100.0 / per2) * S as f64) as u64;
    let mut out = Vec::new();
    e.advance_to(half, &mut out);
    assert!(e.abort(half, 2));
    assert_eq!((e.in_flight(), e.running(), e.decoding()), (1, 1, 1));
    assert_eq!(e.kv_used_tokens(), 10 + 240);
    assert_eq!(e.decoded_tokens(half, 2), None);
    out.extend(drain(&mut e));
    let cs = completions(&out);
    assert_eq!(cs.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![1]);
    // 100 of its 299 decode steps done at 2, the other 199 alone
    let want = half as f64 / S as f64 + 199.0 / per1;
    assert!(close_ns(cs[0].at, want), "{} vs {want}", cs[0].at);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn aborting_a_waiting_sequence_removes_it_and_a_running_one_lets_the_next_start() {
    let p = profile_with("", 1e12, 2, 100_000);
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 100, &[]));
    e.admit(0, Admission::new(2, 10, 200, &[]));
    e.admit(0, Admission::new(3, 10, 50, &[]));
    e.admit(0, Admission::new(4, 10, 10, &[]));
    assert!(e.abort(0, 3));
    assert_eq!((e.running(), e.waiting()), (2, 1));
    let mut out = Vec::new();
    e.advance_to(S / 100, &mut out);
    // a running one goes: 4 starts at once
    assert!(e.abort(S / 100, 2));
    assert_eq!((e.running(), e.waiting()), (2, 0));
    out.extend(drain(&mut e));
    let cs = completions(&out);
    let mut seqs: Vec<u64> = cs.iter().map(|c| c.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![1, 4]);
    assert_eq!(cs.iter().find(|c| c.seq == 4).unwrap().started_at, S / 100);
}

#[test]
fn aborting_a_prefilling_sequence_takes_its_remaining_work_out_of_the_queue() {
    // two 1,000-token prompts queue for prefill; the first is aborted half way through its
    // own: the second then starts its prefill as if it had arrived alone at that moment
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 1000, 10, &[]));
    e.admit(0, Admission::new(2, 1000, 10, &[]));
    let mid = S / 2;
    let mut out = Vec::new();
    e.advance_to(mid, &mut out);
    assert!(e.abort(mid, 1));
    assert_eq!((e.running(), e.kv_used_tokens()), (1, 1000 + 8));
    out.extend(drain(&mut e));
    assert_eq!(first_token_of(&out, 1), None);
    let got = first_token_of(&out, 2).expect("2 prefills");

    let mut alone = engine(&p);
    let mut ignore = Vec::new();
    alone.advance_to(mid, &mut ignore);
    alone.admit(mid, Admission::new(2, 1000, 10, &[]));
    let want = first_token_of(&drain(&mut alone), 2).unwrap();
    assert!(got.abs_diff(want) <= 2, "{got} vs {want}");
}

#[test]
fn aborting_an_unknown_or_finished_sequence_changes_nothing() {
    let p = profile_with("", 1e12, 64, 100_000);
    let mut e = engine(&p);
    assert!(!e.abort(0, 9));
    e.admit(0, Admission::new(1, 10, 10, &[]));
    let out = drain(&mut e);
    assert_eq!(completions(&out).len(), 1);
    let t = out.last().unwrap().at();
    assert!(!e.abort(t, 1));
    assert_eq!(e.in_flight(), 0);
}

// ---- first-token accounting (issue 10 §1) ---------------------------------------------------
// The prefill step produces the first output token (as in vLLM): `T` output tokens are `T`
// emissions, the first at the prefill's end and `T - 1` decode steps after it.

#[test]
fn one_token_output_completes_at_its_first_token() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(3, 250, 1, &[]));
    let out = drain(&mut e);
    assert_eq!(out.len(), 2, "{out:?}");
    let first = first_token_of(&out, 3).expect("a first token");
    assert!(close_ns(first, 250.0 / 1000.0), "{first}");
    let c = completions(&out)[0];
    // e2e == TTFT exactly: no decode step follows the prefill's token
    assert_eq!(c.at, first);
    assert_eq!(c.first_token_at, first);
    // the first token is reported before the completion at the same instant
    assert!(matches!(out[0], EngineOutput::FirstToken { seq: 3, .. }));
    assert_eq!((e.in_flight(), e.decoding(), e.kv_used_tokens()), (0, 0, 0));
}

#[test]
fn two_token_output_completes_one_decode_step_after_its_first_token() {
    // prefill negligible: seven long sequences and the 2-token one decode together, so the
    // 2-token one needs exactly one step at concurrency 8
    let p = profile_with("", 1e12, 64, 100_000);
    let mut e = engine(&p);
    for s in 0..7 {
        e.admit(0, Admission::new(s, 10, 1_000, &[]));
    }
    e.admit(0, Admission::new(7, 10, 2, &[]));
    let out = drain(&mut e);
    let first = first_token_of(&out, 7).expect("a first token");
    let c = completions(&out)
        .into_iter()
        .find(|c| c.seq == 7)
        .expect("completes");
    let step = 1.0 / p.per_request_tok_s(8.0);
    assert!(
        close_ns(c.at - first, step),
        "e2e - TTFT {} ns, one step at 8 is {step} s",
        c.at - first
    );
    // the long ones: 999 steps, the first at concurrency 8, the rest at 7
    let long = completions(&out).into_iter().find(|c| c.seq == 0).unwrap();
    let want = step + 998.0 / p.per_request_tok_s(7.0);
    assert!(
        close_ns(long.at - long.first_token_at, want),
        "{} vs {want}",
        long.at - long.first_token_at
    );
}

#[test]
fn decoded_tokens_of_a_two_token_output_ends_at_one_step() {
    let p = profile_with("", 1e12, 64, 100_000);
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 10, 2, &[]));
    let first = e.next_event_time().unwrap();
    let mut out = Vec::new();
    e.advance_to(first, &mut out);
    assert_eq!(e.decoded_tokens(first, 1), Some(0.0));
    // half a step in: half of its one decode step; far ahead: clamped at that one step
    let half = first + (0.5 / p.per_request_tok_s(1.0) * S as f64) as u64;
    let d = e.decoded_tokens(half, 1).unwrap();
    assert!((d - 0.5).abs() < 1e-6, "{d}");
    assert_eq!(e.decoded_tokens(first + 10 * S, 1), Some(1.0));
}
// ---- engine prefix cache (issue 10 §3)

fn first_token_cached(out: &[EngineOutput], want: u64) -> Option<(u64, u32)> {
    out.iter().find_map(|o| match *o {
        EngineOutput::FirstToken {
            seq,
            at,
            cached_tokens,
        } if seq == want => Some((at, cached_tokens)),
        _ => None,
    })
}

#[test]
fn a_shared_prefix_arriving_mid_prefill_hits_the_blocks_computed_so_far() {
    // 1,000 prefill tokens/s with nothing decoding: block k of a 4,096-token prompt is
    // computed at (k + 1) × 0.512 s
    let p = profile();
    let mut e = engine(&p);
    let chain: Vec<u64> = (1..=8).collect();
    assert_eq!(
        e.admit(0, Admission::new(1, 4096, 1, &chain)).cached_tokens,
        Some(0)
    );
    // before its first block is complete: nothing to share yet
    let early = 300 * S / 1000;
    e.advance_to(early, &mut Vec::new());
    assert_eq!(
        e.admit(early, Admission::new(2, 4096, 1, &chain))
            .cached_tokens,
        Some(0)
    );
    // 2,600 tokens prefilled (its own and none of seq 2's yet): 5 full blocks, not the rest
    let mid = 2_600 * S / 1000;
    e.advance_to(mid, &mut Vec::new());
    assert_eq!(
        e.admit(mid, Admission::new(3, 4096, 1, &chain))
            .cached_tokens,
        Some(2560)
    );
    assert_eq!(e.cached_blocks(), 5);
    // a prompt that shares 3 of them and then differs hits those 3 only
    let fork = [1, 2, 3, 40, 41, 42, 43, 44];
    assert_eq!(
        e.admit(mid, Admission::new(4, 4096, 1, &fork))
            .cached_tokens,
        Some(1536)
    );
    let out = drain(&mut e);
    // seq 3 prefills only its last 1,536 tokens, after seqs 1 and 2 (FIFO)
    let (t2, c2) = first_token_cached(&out, 2).unwrap();
    let (t3, c3) = first_token_cached(&out, 3).unwrap();
    assert_eq!((c2, c3), (0, 2560));
    // a second after seq 2's, not a whole prefill's 4 s
    assert!(t3 > t2 && t3 - t2 < 2 * S, "{t2} {t3}");
    // once everything has finished the chain and the fork's own blocks stay cached
    assert_eq!(e.cached_blocks(), 8 + 5);
    assert_eq!(e.peek_cached_tokens(5000, &chain), 4096);
}

#[test]
fn under_kv_pressure_cached_blocks_are_evicted_lru_and_running_ones_are_not() {
    // 8 blocks of KV, prefill fast enough that prefills end within the tick
    let p = profile_with("", 1e9, 64, 4096);
    let mut e = engine(&p);
    let mut t = 0;
    let mut step = |e: &mut FluidEngine, seq: u64, prompt: u32, output: u32, blocks: &[u64]| {
        // a second apart; the first (10 s) lets the first two finish
        t += if seq == 3 { 10 * S } else { S };
        e.advance_to(t, &mut Vec::new());
        let info = e.admit(t, Admission::new(seq, prompt, output, blocks));
        // its prefill (and a one-token answer) is over half a second later
        e.advance_to(t + S / 2, &mut Vec::new());
        info
    };
    // two finished conversations leave 4 evictable blocks: [1, 2] older than [3, 4]
    step(&mut e, 1, 1024, 1, &[1, 2]);
    step(&mut e, 2, 1024, 1, &[3, 4]);
    // a long answer reserves 1,024 + 4/5 x 2,500 tokens: 1,072 free tokens = room for 2
    // cached blocks, so the least recently used conversation goes
    step(&mut e, 3, 1024, 2500, &[5, 6]);
    assert_eq!(
        e.cached_blocks() - 2,
        2,
        "[5, 6] are held, two others cached"
    );
    assert_eq!(e.peek_cached_tokens(1100, &[1, 2]), 0);
    assert_eq!(e.peek_cached_tokens(1100, &[3, 4]), 1024);
    // its own prompt blocks are cached as soon as prefilled, and held
    assert_eq!(e.peek_cached_tokens(1100, &[5, 6]), 1024);
    assert_eq!(e.evictable_blocks(), 2);
    // one more sequence (101 tokens) leaves room for one block: the tail of [3, 4] goes (a
    // sequence's blocks are released last first), the running sequence's blocks stay
    let info = step(&mut e, 4, 100, 1, &[7]);
    assert_eq!(info.cached_tokens, Some(0));
    assert_eq!(e.peek_cached_tokens(1100, &[3, 4]), 512);
    assert_eq!(e.peek_cached_tokens(1100, &[5, 6]), 1024);
    // it has finished: its block is cached beside [3]
    assert_eq!(e.peek_cached_tokens(1100, &[7]), 512);
    assert_eq!(e.evictable_blocks(), 2);
    // under full pressure every evictable block goes, never a held one
    let info = step(&mut e, 5, 100, 1125, &[3, 8]);
    assert_eq!(
        info.cached_tokens,
        Some(99),
        "its hit is held before eviction"
    );
    assert_eq!(e.peek_cached_tokens(1100, &[5, 6]), 1024);
    assert_eq!(e.peek_cached_tokens(1100, &[7]), 0);
}

#[test]
fn kv_events_replayed_in_order_give_the_engine_cache() {
    use std::collections::HashSet;
    let p = profile_with("", 2000.0, 8, 6000);
    let mut e = engine(&p);
    e.publish_kv_events(true);
    let mut mirror: HashSet<u64> = HashSet::new();
    let mut events = Vec::new();
    let mut apply = |e: &mut FluidEngine, mirror: &mut HashSet<u64>| {
        events.clear();
        e.drain_kv_events(&mut events);
        for ev in &events {
            match *ev {
                KvEvent::Stored { block, parent } => {
                    assert!(parent.is_none_or(|p| mirror.contains(&p)), "{ev:?}");
                    assert!(mirror.insert(block), "stored twice: {ev:?}");
                }
                KvEvent::Removed { block } => assert!(mirror.remove(&block), "{ev:?}"),
                KvEvent::AllCleared => mirror.clear(),
                _ => {}
            }
        }
    };
    let mut t = 0;
    let mut stored_mid_prefill = false;
    for i in 0..400u64 {
        t += S / 3;
        e.advance_to(t, &mut Vec::new());
        // conversations of growing prefixes: chain hashes c*1000 + k
        let conv = i % 13;
        let len = 1 + (i / 13) % 6;
        let chain: Vec<u64> = (0..len).map(|k| conv * 1000 + k).collect();
        let before = e.cached_blocks();
        e.admit(t, Admission::new(i, 512 * len as u32 + 100, 30, &chain));
        stored_mid_prefill |= e.cached_blocks() > before;
        if i == 250 {
            e.restart(t, t + S, false);
        }
        apply(&mut e, &mut mirror);
        assert_eq!(mirror.len(), e.cached_blocks(), "after admission {i}");
        assert!(
            mirror
                .iter()
                .all(|&b| e.peek_cached_tokens(600, &[b]) == 512)
        );
    }
    assert!(
        stored_mid_prefill,
        "the scenario exercised mid-prefill blocks"
    );
}

proptest! {
    /// The libm-free floor, ceiling and rounding of the step clock agree with the library's
    /// wherever the clock can be (non-negative, far below 2^53).
    #[test]
    fn libm_free_rounding_agrees(x in 0.0f64..1e12) {
        prop_assert_eq!(floor_nn(x), x.floor());
        prop_assert_eq!(ceil_nn(x), x.ceil());
        let r = round_nn(x);
        prop_assert!(r == x.round() || (x - x.floor() - 0.5).abs() < 1e-9, "{} {}", x, r);
    }
}

#[test]
fn libm_free_rounding_at_whole_and_half_values() {
    for x in [0.0, 1.0, 2.5, 3.5, 1e9, 1e9 + 0.5, 4503599627370495.0] {
        assert_eq!(floor_nn(x), x.floor(), "{x}");
        assert_eq!(ceil_nn(x), x.ceil(), "{x}");
    }
    assert_eq!(round_nn(2.5), 3.0);
    assert_eq!(round_nn(2.4999), 2.0);
    assert_eq!(ceil_nn(-0.25), 0.0);
}

/// Regression (issue 15 review): a call in the middle of a step (here a speed change that
/// changes nothing, or a gated arrival) does not change the running step's prefill: a
/// 400-token prompt alone is one 400 ms step, its first token at its end.
#[test]
fn a_call_mid_step_does_not_change_the_running_step() {
    let p = profile();
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 400, 5, &[]));
    e.set_speed_factor(S / 5, 1.0);
    assert!(close_ns(run_to_first_token(&mut e, 1), 0.4));
    let mut e = engine(&p);
    e.admit(0, Admission::new(1, 400, 5, &[]));
    e.admit(S / 5, Admission::new(2, 10, 5, &[]));
    assert!(close_ns(run_to_first_token(&mut e, 1), 0.4));
    // the arrival joined at that boundary: one 10-token step beside the first's decode
    let o = crate::hardware::DEFAULT_PREFILL_OVERLAP;
    let want = 0.4 + mixed_step_s(p.step_time_s(1.0), 0.01, o);
    assert!(close_ns(run_to_first_token(&mut e, 2), want));
}

/// Regression (issue 15 review): an event in the middle of a step (here a new noise epoch)
/// does not emit a first token early: a prompt whose prefill is done in the fluid sense
/// mid-step gets its first token when the step ends, with the prompt it shares the step with.
#[test]
fn an_event_mid_step_does_not_emit_a_first_token_early() {
    let p = profile();
    let o = EngineOverrides {
        prefill_chunk_tokens: Some(2048),
        epoch_noise_cv: 0.01,
        epoch_s: 0.5,
        ..EngineOverrides::default()
    };
    let mut e = FluidEngine::new(p, o, 3);
    // one step of 1,300 prompt tokens (about 1.3 s); the first prompt is done at about 0.3 s,
    // the epoch changes at 0.5 s
    e.admit(0, Admission::new(1, 300, 5, &[]));
    e.admit(0, Admission::new(2, 1000, 5, &[]));
    let mut out = Vec::new();
    let mut guard = 0;
    while first_token_of(&out, 2).is_none() {
        let t = e.next_event_time().expect("runs");
        e.advance_to(t, &mut out);
        guard += 1;
        assert!(guard < 1000);
    }
    let (a, b) = (
        first_token_of(&out, 1).unwrap(),
        first_token_of(&out, 2).unwrap(),
    );
    assert_eq!(a, b, "both first tokens at the end of the step they shared");
    assert!(a > S, "{a}");
}

#[test]
fn the_kept_tolerance_follows_the_rates() {
    let p = profile();
    let mut e = engine(&p);
    assert_eq!(e.fl.tol, tolerance_at(e.fl.rate_v));
    e.admit(0, Admission::new(1, 900, 40, &[]));
    e.admit(1_000_000, Admission::new(2, 900, 40, &[]));
    assert!(e.fl.rate_v > 0.0);
    assert_eq!(e.fl.tol, tolerance_at(e.fl.rate_v));
    let mut out = Vec::new();
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut out);
        assert_eq!(e.fl.tol.to_bits(), tolerance_at(e.fl.rate_v).to_bits());
    }
    assert_eq!(out.len(), 4, "two first tokens and two completions");
    assert_eq!(e.fl.tol, tolerance_at(0.0));
}

#[test]
fn total_order_round_trips_and_sorts_as_total_cmp() {
    let xs = [
        f64::NEG_INFINITY,
        -1e300,
        -1.0,
        -f64::MIN_POSITIVE,
        -0.0,
        0.0,
        f64::MIN_POSITIVE,
        1e-300,
        0.5,
        1.0,
        3.25e9,
        f64::MAX,
        f64::INFINITY,
        f64::NAN,
    ];
    for a in xs {
        assert_eq!(
            from_total_order(total_order(a)).to_bits(),
            a.to_bits(),
            "{a}"
        );
        for b in xs {
            assert_eq!(
                total_order(a).cmp(&total_order(b)),
                a.total_cmp(&b),
                "{a} {b}"
            );
        }
    }
    assert!(total_order(-0.0) < total_order(0.0));
}

proptest! {
    #[test]
    fn total_order_agrees_with_total_cmp(a in any::<u64>(), b in any::<u64>()) {
        let (x, y) = (f64::from_bits(a), f64::from_bits(b));
        prop_assert_eq!(from_total_order(total_order(x)).to_bits(), a);
        prop_assert_eq!(total_order(x).cmp(&total_order(y)), x.total_cmp(&y));
    }

    /// The decode heap pops in the order of a plain sort by (finish in `total_cmp`'s order,
    /// sequence id), the finish marks coming back bit for bit.
    #[test]
    fn decode_heap_pops_as_a_sort_by_finish_then_seq(
        keys in proptest::collection::vec((0u32..40, 0.0f64..1e6, 0u64..50), 0..60)
    ) {
        let entries: Vec<(f64, u64, u32)> = keys
            .iter()
            .enumerate()
            // a few equal finishes, so that the sequence id has ties to break
            .map(|(i, &(k, x, seq))| (if k < 10 { f64::from(k) } else { x }, seq * 64 + i as u64, i as u32))
            .collect();
        let mut heap: BinaryHeap<DecodeKey> =
            entries.iter().map(|&(f, seq, slot)| DecodeKey::new(f, seq, slot)).collect();
        let mut reference = entries.clone();
        reference.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(f, seq, slot) in &reference {
            let top = heap.pop().expect("as many entries as pushed");
            prop_assert_eq!(top.finish().to_bits(), f.to_bits());
            prop_assert_eq!((top.seq, top.slot), (seq, slot));
        }
        prop_assert!(heap.is_empty());
    }
}
