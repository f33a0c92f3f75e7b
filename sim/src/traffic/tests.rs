//! Unit tests of the synthetic generators.

use super::*;

const S: u64 = 1_000_000_000;

fn drain(src: &mut dyn TrafficSource) -> Vec<Arrival> {
    let mut v = Vec::new();
    while let Some(a) = src.next_arrival().unwrap() {
        v.push(a);
    }
    v
}

fn sorted(v: &[Arrival]) -> bool {
    v.windows(2).all(|w| w[0].at <= w[1].at)
}

fn lens() -> (LengthDist, LengthDist) {
    (
        LengthDist::LogNormal {
            median: 1000.0,
            sigma: 1.0,
            max: 32_000,
        },
        LengthDist::Exponential { mean: 200.0 },
    )
}

fn poisson(rate: f64, until: Until, seed: u64) -> Poisson {
    let (prompt, output) = lens();
    Poisson::new(
        PoissonConfig {
            start: 0,
            rate_per_s: rate,
            until,
            prompt,
            output,
        },
        seed,
    )
    .unwrap()
}

#[test]
fn poisson_rate_and_stop_conditions() {
    let v = drain(&mut poisson(50.0, Until::count(100_000), 7));
    assert_eq!(v.len(), 100_000);
    assert!(sorted(&v));
    let rate = v.len() as f64 / (v.last().unwrap().at as f64 / 1e9);
    assert!((rate / 50.0 - 1.0).abs() < 0.02, "rate {rate}");
    let v = drain(&mut poisson(10.0, Until::duration(100 * S), 7));
    assert!(v.iter().all(|a| a.at < 100 * S));
    assert!((900..1100).contains(&v.len()), "{}", v.len());
    assert!(
        v.iter()
            .all(|a| a.prefix_blocks.is_empty() && a.output_tokens >= 1)
    );
    assert!(v.iter().enumerate().all(|(i, a)| a.tag == i as u64));
    let both = Until {
        duration: Some(100 * S),
        count: Some(5),
    };
    assert_eq!(drain(&mut poisson(10.0, both, 7)).len(), 5);
}

#[test]
fn burst_repeats() {
    let mut b = Burst::new(
        BurstConfig {
            at: 5,
            size: 3,
            repeats: 2,
            period: 10,
            prompt: LengthDist::Fixed(8),
            output: LengthDist::Fixed(2),
        },
        1,
    )
    .unwrap();
    let at: Vec<u64> = drain(&mut b).iter().map(|a| a.at).collect();
    assert_eq!(at, [5, 5, 5, 15, 15, 15]);
    let bad = BurstConfig {
        at: 0,
        size: 1,
        repeats: 2,
        period: 0,
        prompt: LengthDist::Fixed(1),
        output: LengthDist::Fixed(1),
    };
    assert!(
        Burst::new(bad, 1)
            .unwrap_err()
            .to_string()
            .contains("period")
    );
}

fn diurnal(seed: u64) -> Diurnal {
    let (prompt, output) = lens();
    Diurnal::new(
        DiurnalConfig {
            start: 0,
            min_rate_per_s: 2.0,
            max_rate_per_s: 20.0,
            period: 1000 * S,
            phase: 0,
            until: Until::duration(1000 * S),
            prompt,
            output,
        },
        seed,
    )
    .unwrap()
}

#[test]
fn diurnal_follows_the_sinusoid() {
    let d = diurnal(3);
    assert!((d.rate_at(0) - 2.0).abs() < 1e-9);
    assert!((d.rate_at(500 * S) - 20.0).abs() < 1e-9);
    let v = drain(&mut diurnal(3));
    assert!(sorted(&v));
    // Expected count = mean rate 11/s × 1000 s.
    assert!(
        (v.len() as f64 / 11_000.0 - 1.0).abs() < 0.05,
        "{}",
        v.len()
    );
    let trough = v
        .iter()
        .filter(|a| a.at < 100 * S || a.at >= 900 * S)
        .count();
    let peak = v
        .iter()
        .filter(|a| (400 * S..600 * S).contains(&a.at))
        .count();
    assert!(peak > 4 * trough, "peak {peak} trough {trough}");
}

fn onoff(seed: u64) -> OnOff {
    let (prompt, output) = lens();
    OnOff::new(
        OnOffConfig {
            start: 10,
            burst_size: LengthDist::Fixed(20),
            window: S,
            gap: DurationDist::Fixed(60 * S),
            until: Until::count(100),
            prompt,
            output,
        },
        seed,
    )
    .unwrap()
}

#[test]
fn onoff_bursts_and_gaps() {
    let v = drain(&mut onoff(4));
    assert_eq!(v.len(), 100);
    assert!(sorted(&v));
    for (b, chunk) in v.chunks(20).enumerate() {
        let lo = 10 + b as u64 * 61 * S;
        assert!(
            chunk.iter().all(|a| (lo..=lo + S).contains(&a.at)),
            "burst {b}"
        );
    }
}

fn closed(users: u32, until: Until, seed: u64) -> ClosedLoop {
    let (prompt, output) = lens();
    ClosedLoop::new(
        ClosedLoopConfig {
            start: 0,
            users,
            ramp: 4 * S,
            think: DurationDist::Exponential { mean: 2 * S },
            until,
            prompt,
            output,
        },
        seed,
    )
    .unwrap()
}

#[test]
fn closed_loop_follow_up_only_after_completion() {
    let mut c = closed(4, Until::count(10), 1);
    let first = drain(&mut c);
    assert_eq!(
        first.iter().map(|a| (a.at, a.tag)).collect::<Vec<_>>(),
        [(0, 0), (S, 1), (2 * S, 2), (3 * S, 3)]
    );
    assert_eq!(c.in_flight(), 4);
    // Nothing more without completions.
    assert!(c.next_arrival().unwrap().is_none());
    // Completion of user 2 at t=10 s: follow-up for user 2, not before now.
    let f = c.on_complete(10 * S, 2).unwrap();
    assert_eq!(f.tag, 2);
    assert!(f.at >= 10 * S);
    // Unknown user and duplicate completion give nothing.
    assert!(c.on_complete(11 * S, 99).is_none());
    assert!(c.on_complete(11 * S, 2).is_some()); // the follow-up completed
    c.on_complete(12 * S, 0).unwrap();
    c.on_complete(12 * S, 1).unwrap();
    assert_eq!(c.sent(), 8);
    // Count 10 stops the loop.
    let mut got = 0;
    for u in 0..4 {
        got += usize::from(c.on_complete(20 * S, u).is_some());
    }
    assert_eq!(got, 2);
    assert_eq!(c.sent(), 10);
}

#[test]
fn closed_loop_duration_stop() {
    let mut c = closed(1, Until::duration(5 * S), 1);
    assert!(c.next_arrival().unwrap().is_some());
    assert!(c.on_complete(5 * S, 0).is_none());
}

fn conversations(seed: u64, system: u32) -> Conversations {
    Conversations::new(
        ConversationsConfig {
            start: 0,
            rate_per_s: 1.0,
            conversations: 50,
            turns: LengthDist::Fixed(4),
            user_tokens: LengthDist::Uniform { min: 100, max: 900 },
            output: LengthDist::Uniform { min: 50, max: 400 },
            think: DurationDist::Exponential { mean: 5 * S },
            system_prompt_tokens: system,
            system_prompt_id: 9,
            max_prompt_tokens: None,
        },
        seed,
    )
    .unwrap()
}

#[test]
fn conversation_prefixes_grow_and_share() {
    let mut c = conversations(5, 1100);
    let firsts = drain(&mut c);
    assert_eq!(firsts.len(), 50);
    assert!(sorted(&firsts));
    // Two full system-prompt blocks shared by every conversation, the third is not.
    for a in &firsts {
        assert_eq!(
            a.prefix_blocks.len() as u64,
            blocks_for_tokens(u64::from(a.prompt_tokens))
        );
        assert_eq!(a.prefix_blocks[..2], firsts[0].prefix_blocks[..2]);
    }
    assert_ne!(firsts[0].prefix_blocks[2], firsts[1].prefix_blocks[2]);
    // Follow the first conversation through its turns.
    let mut prev = firsts[0].clone();
    let mut now = prev.at;
    for _ in 1..4 {
        now += 3 * S;
        let next = c.on_complete(now, prev.tag).expect("next turn");
        assert!(next.at >= now);
        assert!(next.prompt_tokens > prev.prompt_tokens + prev.output_tokens);
        let full = (prev.prompt_tokens / BLOCK_TOKENS) as usize;
        assert_eq!(next.prefix_blocks[..full], prev.prefix_blocks[..full]);
        if !prev.prompt_tokens.is_multiple_of(BLOCK_TOKENS) {
            // The previously partial block got more tokens: different content, new hash.
            assert_ne!(next.prefix_blocks[full], prev.prefix_blocks[full]);
        }
        prev = next;
    }
    assert!(c.on_complete(now, prev.tag).is_none(), "4 turns only");
    assert_eq!(c.active(), 49);
    // Another seed shares only the system prompt blocks.
    let other = drain(&mut conversations(6, 1100));
    assert_eq!(other[0].prefix_blocks[..2], firsts[0].prefix_blocks[..2]);
    assert_ne!(other[0].prefix_blocks[2], firsts[0].prefix_blocks[2]);
}

#[test]
fn conversation_max_prompt_ends_early() {
    let mut cfg_c = conversations(1, 0);
    let a = cfg_c.next_arrival().unwrap().unwrap();
    assert!(a.prompt_tokens <= 900);
    let mut c = Conversations::new(
        ConversationsConfig {
            start: 0,
            rate_per_s: 1.0,
            conversations: 1,
            turns: LengthDist::Fixed(100),
            user_tokens: LengthDist::Fixed(1000),
            output: LengthDist::Fixed(1000),
            think: DurationDist::Fixed(0),
            system_prompt_tokens: 0,
            system_prompt_id: 0,
            max_prompt_tokens: Some(8000),
        },
        1,
    )
    .unwrap();
    let mut a = c.next_arrival().unwrap().unwrap();
    let mut turns = 1;
    while let Some(n) = c.on_complete(a.at, a.tag) {
        a = n;
        turns += 1;
    }
    assert_eq!(turns, 4); // prompts 1000, 3000, 5000, 7000; 9000 > 8000
    assert_eq!(c.active(), 0);
}

#[test]
fn long_prompt_mix_fraction() {
    let mut m = LongPromptMix::new(
        LongPromptMixConfig {
            start: 0,
            rate_per_s: 100.0,
            until: Until::count(20_000),
            long_fraction: 0.1,
            long_prompt: LengthDist::Uniform {
                min: 50_000,
                max: 100_000,
            },
            short_prompt: LengthDist::Uniform { min: 10, max: 2000 },
            output: LengthDist::Fixed(10),
        },
        2,
    )
    .unwrap();
    let v = drain(&mut m);
    let long = v.iter().filter(|a| a.prompt_tokens >= 50_000).count() as f64 / v.len() as f64;
    assert!((long - 0.1).abs() < 0.01, "{long}");
}

#[test]
fn merge_orders_by_time_and_routes_completions() {
    let b = Burst::new(
        BurstConfig {
            at: 0,
            size: 2,
            repeats: 3,
            period: S,
            prompt: LengthDist::Fixed(1),
            output: LengthDist::Fixed(1),
        },
        1,
    )
    .unwrap();
    let p = poisson(3.0, Until::duration(3 * S), 1);
    let c = closed(2, Until::count(100), 1);
    let mut m = Merge::new(vec![Box::new(b), Box::new(p), Box::new(c)]);
    let v = drain(&mut m);
    assert!(sorted(&v));
    // Ties at t=0 go to the first source (the burst), then the closed-loop user 0.
    assert_eq!(v[0].tag % 3, 0);
    assert_eq!(v[1].tag % 3, 0);
    assert_eq!(v[2].tag % 3, 2);
    let closed_tags: Vec<u64> = v.iter().filter(|a| a.tag % 3 == 2).map(|a| a.tag).collect();
    assert_eq!(closed_tags, [2, 5]); // users 0 and 1
    let f = m.on_complete(10 * S, 5).unwrap();
    assert_eq!(f.tag, 5);
    assert!(m.on_complete(10 * S, 3).is_none()); // open-loop burst: no follow-up
}

/// Every generator: same seed ⇒ same stream, different seed ⇒ different stream.
#[test]
fn determinism_of_every_generator() {
    type Make = fn(u64) -> Box<dyn TrafficSource>;
    let makers: [(&str, Make); 8] = [
        ("burst", |s| {
            let (prompt, output) = lens();
            Box::new(
                Burst::new(
                    BurstConfig {
                        at: 0,
                        size: 50,
                        repeats: 2,
                        period: S,
                        prompt,
                        output,
                    },
                    s,
                )
                .unwrap(),
            )
        }),
        ("poisson", |s| Box::new(poisson(5.0, Until::count(200), s))),
        ("diurnal", |s| Box::new(diurnal(s))),
        ("onoff", |s| Box::new(onoff(s))),
        ("closed", |s| Box::new(closed(20, Until::count(200), s))),
        ("conversations", |s| Box::new(conversations(s, 600))),
        ("mix", |s| {
            Box::new(
                LongPromptMix::new(
                    LongPromptMixConfig {
                        start: 0,
                        rate_per_s: 5.0,
                        until: Until::count(200),
                        long_fraction: 0.5,
                        long_prompt: LengthDist::Uniform {
                            min: 10_000,
                            max: 20_000,
                        },
                        short_prompt: LengthDist::Uniform { min: 1, max: 100 },
                        output: LengthDist::Fixed(3),
                    },
                    s,
                )
                .unwrap(),
            )
        }),
        ("merge", |s| {
            Box::new(Merge::new(vec![
                Box::new(poisson(5.0, Until::count(100), s)),
                Box::new(conversations(s, 0)),
            ]))
        }),
    ];
    // Drain open-loop arrivals and answer every arrival with a completion 1 s later, so
    // closed-loop follow-ups are part of the compared sequence.
    let run = |make: Make, seed: u64| {
        let mut src = make(seed);
        let mut out = drain(&mut *src);
        let mut i = 0;
        while i < out.len() && out.len() < 2000 {
            let a = &out[i];
            if let Some(f) = src.on_complete(a.at + S, a.tag) {
                out.push(f);
            }
            i += 1;
        }
        out
    };
    for (name, make) in makers {
        let a = run(make, 11);
        assert!(!a.is_empty(), "{name}");
        assert_eq!(
            a,
            run(make, 11),
            "{name}: same seed must give the same stream"
        );
        assert_ne!(
            a,
            run(make, 12),
            "{name}: a different seed must change the stream"
        );
    }
}

#[test]
fn invalid_configs_name_the_field() {
    let (prompt, output) = lens();
    let e = Poisson::new(
        PoissonConfig {
            start: 0,
            rate_per_s: 0.0,
            until: Until::count(1),
            prompt,
            output,
        },
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("Poisson") && e.contains("rate_per_s") && e.contains("> 0"),
        "{e}"
    );
    let e = Poisson::new(
        PoissonConfig {
            start: 0,
            rate_per_s: 1.0,
            until: Until::default(),
            prompt,
            output,
        },
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("until"), "{e}");
    assert!(
        ClosedLoop::new(
            ClosedLoopConfig {
                start: 0,
                users: 0,
                ramp: 0,
                think: DurationDist::Fixed(0),
                until: Until::count(1),
                prompt,
                output
            },
            0
        )
        .is_err()
    );
}
