//! Traffic sources against the real public traces, bad-row fixtures and a small closed-loop
//! driver exercising the public API.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use routelab_sim::traffic::{
    Arrival, BadRowPolicy, Burst, BurstConfig, ClosedLoop, ClosedLoopConfig, Conversations,
    ConversationsConfig, Diurnal, DiurnalConfig, DurationDist, LengthDist, LongPromptMix,
    LongPromptMixConfig, Merge, OnOff, OnOffConfig, Poisson, PoissonConfig, ReplayOptions,
    TraceFormat, TraceReplay, TraceStats, TrafficError, TrafficSource, Until,
};

const S: u64 = 1_000_000_000;

/// The repository's `data/traces/` (the vendored public traces). Fails (never skips) when absent.
fn traces_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/traces");
    assert!(
        dir.is_dir(),
        "trace directory {} not found: these tests replay the public traces vendored in the \
         repository's data/traces/ (see data/README.md)",
        dir.display()
    );
    dir
}

fn code_csv() -> PathBuf {
    traces_dir().join("azure_llm_2023/AzureLLMInferenceTrace_code.csv")
}
fn conv_csv() -> PathBuf {
    traces_dir().join("azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
}
fn mooncake() -> PathBuf {
    traces_dir().join("mooncake_fast25/conversation_trace.jsonl")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn drain(src: &mut dyn TrafficSource) -> Result<Vec<Arrival>, TrafficError> {
    let mut v = Vec::new();
    while let Some(a) = src.next_arrival()? {
        v.push(a);
    }
    Ok(v)
}

fn stats(path: &Path) -> TraceStats {
    let format = TraceFormat::from_path(path).unwrap();
    TraceStats::of_trace(path, format, ReplayOptions::default()).unwrap()
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got / want - 1.0).abs() <= rel
}

// --- real traces -----------------------------------------------------------------------------

#[test]
fn azure_code_matches_readme() {
    let s = stats(&code_csv());
    assert_eq!(s.rows, 8_819);
    assert_eq!(s.skipped_rows, 0);
    assert!(close(s.mean_rate_per_s.unwrap(), 2.57, 0.02), "{s}");
    assert!(close(s.span_ns as f64 / 1e9, 3_436.0, 0.001), "{s}");
    assert!(close(s.prompt.mean, 2_048.0, 0.005), "{s}");
    assert_eq!(
        (s.prompt.p50, s.prompt.p99, s.prompt.max),
        (1_469, 7_436, 7_437),
        "{s}"
    );
    assert!(close(s.output.mean, 28.0, 0.02), "{s}");
    assert_eq!(
        (s.output.p50, s.output.p99, s.output.max),
        (13, 252, 1_899),
        "{s}"
    );
    assert!(s.prefix.is_none());
}

#[test]
fn azure_conv_matches_readme() {
    let s = stats(&conv_csv());
    assert_eq!(s.rows, 19_366);
    assert!(close(s.mean_rate_per_s.unwrap(), 5.53, 0.02), "{s}");
    assert!(close(s.prompt.mean, 1_155.0, 0.005), "{s}");
    assert_eq!(
        (s.prompt.p50, s.prompt.p99, s.prompt.max),
        (1_020, 4_142, 14_050),
        "{s}"
    );
    assert!(close(s.output.mean, 211.0, 0.005), "{s}");
    assert_eq!(
        (s.output.p50, s.output.p99, s.output.max),
        (129, 601, 1_000),
        "{s}"
    );
    assert!(s.prompt.min >= 1 && s.output.min >= 1);
}

#[test]
fn mooncake_matches_readme() {
    let s = stats(&mooncake());
    assert_eq!(s.rows, 12_031);
    assert!(close(s.mean_rate_per_s.unwrap(), 3.40, 0.02), "{s}");
    assert_eq!(s.span_ns, 3_536_999 * 1_000_000);
    assert!(close(s.prompt.mean, 12_035.0, 0.001), "{s}");
    assert_eq!(
        (s.prompt.p50, s.prompt.p99, s.prompt.max),
        (6_909, 85_401, 126_195),
        "{s}"
    );
    assert!(close(s.output.mean, 343.0, 0.005), "{s}");
    assert_eq!(
        (s.output.p50, s.output.p99, s.output.max),
        (350, 1_120, 2_000),
        "{s}"
    );
    let p = s.prefix.unwrap();
    assert_eq!(p.requests, 12_031);
    assert_eq!(p.blocks_referenced, 288_500);
    assert_eq!(p.distinct_blocks, 182_790);
    assert!((p.reuse_fraction * 100.0 - 36.6).abs() <= 0.5, "{s}");
}

#[test]
fn mooncake_prefix_hashes_share_block_zero_and_are_prefix_ids() {
    let opts = ReplayOptions {
        limit: Some(2_000),
        ..ReplayOptions::default()
    };
    let mut r = TraceReplay::open(mooncake(), TraceFormat::MooncakeJsonl, opts).unwrap();
    let v = drain(&mut r).unwrap();
    assert_eq!(v.len(), 2_000);
    let b0 = v[0].prefix_blocks[0];
    assert!(
        v.iter().all(|a| a.prefix_blocks[0] == b0),
        "every request starts with block 0"
    );
    for a in &v {
        assert_eq!(a.prefix_blocks.len() as u32, a.prompt_tokens.div_ceil(512));
    }
    // Hash i identifies the whole prefix: a shared hash at i implies shared hashes before i.
    let mut first_seen = std::collections::HashMap::new();
    for a in &v {
        for (i, h) in a.prefix_blocks.iter().enumerate() {
            let owner = *first_seen.entry(*h).or_insert((a.tag, i));
            assert_eq!(owner.1, i, "a prefix hash appears at one position only");
        }
    }
}

#[test]
fn replay_limit_offset_and_scaling() {
    let base = |o: ReplayOptions| {
        drain(&mut TraceReplay::open(code_csv(), TraceFormat::AzureCsv, o).unwrap()).unwrap()
    };
    let plain = base(ReplayOptions {
        limit: Some(1_000),
        ..Default::default()
    });
    assert_eq!(plain.len(), 1_000);
    assert_eq!(plain[0].at, 0);
    assert_eq!(plain[1].at, 52_000_000); // 18:17:03.9799600 -> 18:17:04.0319600
    assert_eq!(plain[0].tag, 2, "tag = line number");

    let slow = base(ReplayOptions {
        limit: Some(1_000),
        time_scale: 2.0,
        ..Default::default()
    });
    let fast = base(ReplayOptions {
        limit: Some(1_000),
        rate_scale: 4.0,
        ..Default::default()
    });
    let shifted = base(ReplayOptions {
        limit: Some(1_000),
        start_offset: 5 * S,
        ..Default::default()
    });
    for i in 0..1_000 {
        assert_eq!(slow[i].at, plain[i].at * 2);
        assert!(fast[i].at.abs_diff(plain[i].at / 4) <= 1);
        assert_eq!(shifted[i].at, plain[i].at + 5 * S);
        assert_eq!(slow[i].prompt_tokens, plain[i].prompt_tokens);
    }
    // The whole trace at 4× rate: mean rate ×4.
    let opts = ReplayOptions {
        rate_scale: 4.0,
        ..Default::default()
    };
    let s = TraceStats::of_trace(conv_csv(), TraceFormat::AzureCsv, opts).unwrap();
    assert!(close(s.mean_rate_per_s.unwrap(), 4.0 * 5.53, 0.02), "{s}");
    // skip_rows starts later in the file; arrival times restart at the offset.
    let skipped = base(ReplayOptions {
        skip_rows: 10,
        limit: Some(5),
        ..Default::default()
    });
    assert_eq!(skipped[0].at, 0);
    assert_eq!(skipped[0].prompt_tokens, plain[10].prompt_tokens);
    assert_eq!(skipped[4].at, plain[14].at - plain[10].at);
    // Mooncake timestamps are milliseconds.
    let opts = ReplayOptions {
        limit: Some(12_031),
        time_scale: 0.5,
        ..Default::default()
    };
    let s = TraceStats::of_trace(mooncake(), TraceFormat::MooncakeJsonl, opts).unwrap();
    assert_eq!(s.span_ns, 3_536_999 * 500_000);
}

// --- bad rows --------------------------------------------------------------------------------

fn first_error(name: &str, format: TraceFormat) -> String {
    let mut r = TraceReplay::open(fixture(name), format, ReplayOptions::default()).unwrap();
    let e = drain(&mut r).unwrap_err();
    assert!(e.is_row_error(), "{e}");
    let m = e.to_string();
    assert!(m.contains(name), "error must name the file: {m}");
    m
}

#[test]
fn bad_rows_name_file_line_and_field() {
    let m = first_error("azure_malformed.csv", TraceFormat::AzureCsv);
    assert!(
        m.contains(":3:") && m.contains("GeneratedTokens") && m.contains("2 column"),
        "{m}"
    );
    let m = first_error("azure_negative.csv", TraceFormat::AzureCsv);
    assert!(
        m.contains(":3:") && m.contains("`ContextTokens`") && m.contains("negative"),
        "{m}"
    );
    assert!(m.contains("expected an integer >= 0"), "{m}");
    let m = first_error("azure_unsorted.csv", TraceFormat::AzureCsv);
    assert!(
        m.contains(":4:") && m.contains("TIMESTAMP") && m.contains("non-decreasing"),
        "{m}"
    );
    assert!(m.contains("line 3"), "{m}");
    let m = first_error("mooncake_bad_json.jsonl", TraceFormat::MooncakeJsonl);
    assert!(
        m.contains(":2:") && m.contains("invalid JSON") && m.contains("column"),
        "{m}"
    );
    let m = first_error("mooncake_hash_len.jsonl", TraceFormat::MooncakeJsonl);
    assert!(
        m.contains(":2:") && m.contains("hash_ids") && m.contains("ceil(2290/512) = 5"),
        "{m}"
    );
}

#[test]
fn skip_policy_counts_bad_rows() {
    let skip = ReplayOptions {
        on_bad_row: BadRowPolicy::Skip,
        ..ReplayOptions::default()
    };
    let mut r = TraceReplay::open(
        fixture("azure_mixed_bad.csv"),
        TraceFormat::AzureCsv,
        skip.clone(),
    )
    .unwrap();
    let v = drain(&mut r).unwrap();
    assert_eq!(
        v.iter().map(|a| a.tag).collect::<Vec<_>>(),
        [2, 4, 7, 11, 12]
    );
    assert_eq!(r.skipped_rows(), 5);
    let lines: Vec<u64> = r
        .skipped_examples()
        .iter()
        .filter_map(TrafficError::line)
        .collect();
    assert_eq!(lines, [3, 5, 6, 9, 10]);
    assert_eq!(v[4].at, 8 * S);

    let s = TraceStats::of_trace(
        fixture("mooncake_mixed_bad.jsonl"),
        TraceFormat::MooncakeJsonl,
        skip,
    )
    .unwrap();
    assert_eq!((s.rows, s.skipped_rows), (3, 4));
    assert!(s.to_string().contains("skipped rows  4"));
    // Without skipping, the first bad row stops the replay.
    let e = TraceStats::of_trace(
        fixture("mooncake_mixed_bad.jsonl"),
        TraceFormat::MooncakeJsonl,
        ReplayOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(2));
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let e = TraceReplay::open(
        fixture("nope.csv"),
        TraceFormat::AzureCsv,
        ReplayOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, TrafficError::Io { .. }));
    assert!(e.to_string().contains("nope.csv"));
}

// --- generators through the public API -------------------------------------------------------

/// A toy gateway: every request completes `service` ns after arrival.
fn run_closed(src: &mut dyn TrafficSource, service: u64, max: usize) -> Vec<(Arrival, u64)> {
    let mut pending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new(); // (done, tag)
    let mut next = src.next_arrival().unwrap();
    let mut out = Vec::new();
    while out.len() < max {
        let next_done = pending.peek().map(|Reverse((t, _))| *t);
        match (&next, next_done) {
            (Some(a), d) if d.is_none_or(|d| a.at <= d) => {
                let a = next.take().unwrap();
                pending.push(Reverse((a.at + service, a.tag)));
                out.push((a, 0));
                next = src.next_arrival().unwrap();
            }
            (_, Some(done)) => {
                let Reverse((_, tag)) = pending.pop().unwrap();
                if let Some(f) = src.on_complete(done, tag) {
                    assert!(f.at >= done, "a follow-up never precedes the completion");
                    pending.push(Reverse((f.at + service, f.tag)));
                    out.push((f, done));
                }
            }
            _ => break,
        }
    }
    out
}

#[test]
fn merged_scenario_with_closed_loop_and_conversations() {
    let lengths = (LengthDist::Fixed(100), LengthDist::Fixed(10));
    let poisson = Poisson::new(
        PoissonConfig {
            start: 0,
            rate_per_s: 2.0,
            until: Until::duration(60 * S),
            prompt: lengths.0,
            output: lengths.1,
        },
        1,
    )
    .unwrap();
    let closed = ClosedLoop::new(
        ClosedLoopConfig {
            start: 0,
            users: 3,
            ramp: S,
            think: DurationDist::Exponential { mean: S },
            until: Until::duration(60 * S),
            prompt: lengths.0,
            output: lengths.1,
        },
        2,
    )
    .unwrap();
    let conv = Conversations::new(
        ConversationsConfig {
            start: 0,
            rate_per_s: 0.5,
            conversations: 10,
            turns: LengthDist::Uniform { min: 2, max: 5 },
            user_tokens: LengthDist::LogNormal {
                median: 300.0,
                sigma: 0.5,
                max: 4_000,
            },
            output: LengthDist::Uniform { min: 50, max: 500 },
            think: DurationDist::Uniform { min: S, max: 5 * S },
            system_prompt_tokens: 1_024,
            system_prompt_id: 1,
            max_prompt_tokens: Some(32_768),
        },
        3,
    )
    .unwrap();
    let mut m = Merge::new(vec![Box::new(poisson), Box::new(closed), Box::new(conv)]);
    let out = run_closed(&mut m, 2 * S, 10_000);
    // Closed-loop: at most 3 outstanding, and each user's requests are ≥ service time apart.
    let mut last_by_user = std::collections::HashMap::new();
    for (a, _) in out.iter().filter(|(a, _)| a.tag % 3 == 1) {
        if let Some(prev) = last_by_user.insert(a.tag, a.at) {
            assert!(a.at >= prev + 2 * S);
        }
    }
    assert_eq!(last_by_user.len(), 3);
    // Conversations: turns of one conversation extend each other's full blocks.
    let mut by_conv: std::collections::HashMap<u64, Vec<&Arrival>> = Default::default();
    for (a, _) in out.iter().filter(|(a, _)| a.tag % 3 == 2) {
        by_conv.entry(a.tag).or_default().push(a);
    }
    assert_eq!(by_conv.len(), 10);
    for turns in by_conv.values() {
        assert!((2..=5).contains(&turns.len()));
        for w in turns.windows(2) {
            let full = (w[0].prompt_tokens / 512) as usize;
            assert!(w[1].prompt_tokens > w[0].prompt_tokens);
            assert_eq!(w[1].prefix_blocks[..full], w[0].prefix_blocks[..full]);
        }
        // The 1,024-token system prompt = 2 blocks shared by all conversations.
        assert_eq!(
            turns[0].prefix_blocks[..2],
            out.iter()
                .find(|(a, _)| a.tag % 3 == 2)
                .unwrap()
                .0
                .prefix_blocks[..2]
        );
    }
}

#[test]
fn poisson_mean_rate_over_100k_arrivals() {
    for (seed, rate) in [(1, 3.0), (2, 250.0), (3, 10_000.0)] {
        let mut p = Poisson::new(
            PoissonConfig {
                start: 7 * S,
                rate_per_s: rate,
                until: Until::count(100_000),
                prompt: LengthDist::Fixed(1),
                output: LengthDist::Fixed(1),
            },
            seed,
        )
        .unwrap();
        let s = TraceStats::from_source(&mut p).unwrap();
        assert_eq!(s.rows, 100_000);
        assert!(close(s.mean_rate_per_s.unwrap(), rate, 0.02), "{rate}: {s}");
    }
}

/// `cargo test -p routelab-sim --release --test integration -- --ignored generator_throughput --nocapture`
#[test]
#[ignore = "performance check; meaningful in --release only"]
fn generator_throughput() {
    const N: u64 = 20_000_000;
    let prompt = LengthDist::LogNormal {
        median: 1_000.0,
        sigma: 1.0,
        max: 32_000,
    };
    let output = LengthDist::Uniform { min: 1, max: 1_000 };
    let sources: Vec<(&str, Box<dyn TrafficSource>)> = vec![
        (
            "poisson",
            Box::new(
                Poisson::new(
                    PoissonConfig {
                        start: 0,
                        rate_per_s: 1_000.0,
                        until: Until::count(N),
                        prompt,
                        output,
                    },
                    1,
                )
                .unwrap(),
            ),
        ),
        (
            "burst",
            Box::new(
                Burst::new(
                    BurstConfig {
                        at: 0,
                        size: 1_000,
                        repeats: (N / 1_000) as u32,
                        period: S,
                        prompt,
                        output,
                    },
                    1,
                )
                .unwrap(),
            ),
        ),
        (
            "diurnal",
            Box::new(
                Diurnal::new(
                    DiurnalConfig {
                        start: 0,
                        min_rate_per_s: 100.0,
                        max_rate_per_s: 1_000.0,
                        period: 3_600 * S,
                        phase: 0,
                        until: Until::count(N),
                        prompt,
                        output,
                    },
                    1,
                )
                .unwrap(),
            ),
        ),
        (
            "on_off",
            Box::new(
                OnOff::new(
                    OnOffConfig {
                        start: 0,
                        burst_size: LengthDist::Uniform { min: 10, max: 100 },
                        window: S,
                        gap: DurationDist::Exponential { mean: 30 * S },
                        until: Until::count(N),
                        prompt,
                        output,
                    },
                    1,
                )
                .unwrap(),
            ),
        ),
        (
            "long_prompt_mix",
            Box::new(
                LongPromptMix::new(
                    LongPromptMixConfig {
                        start: 0,
                        rate_per_s: 1_000.0,
                        until: Until::count(N),
                        long_fraction: 0.05,
                        long_prompt: LengthDist::Uniform {
                            min: 30_000,
                            max: 120_000,
                        },
                        short_prompt: prompt,
                        output,
                    },
                    1,
                )
                .unwrap(),
            ),
        ),
    ];
    for (name, mut src) in sources {
        let t = std::time::Instant::now();
        let (mut n, mut sum) = (0_u64, 0_u64);
        while let Some(a) = src.next_arrival().unwrap() {
            n += 1;
            sum = sum.wrapping_add(a.at ^ u64::from(a.prompt_tokens));
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        println!("{name}: {rate:.3e} arrivals/s over {n} (checksum {sum})");
        assert!(rate > 1e7, "{name}: {rate:.3e} arrivals/s");
    }
    for path in [conv_csv(), mooncake()] {
        let t = std::time::Instant::now();
        let format = TraceFormat::from_path(&path).unwrap();
        let s = TraceStats::of_trace(&path, format, ReplayOptions::default()).unwrap();
        let rate = s.rows as f64 / t.elapsed().as_secs_f64();
        println!("{}: {rate:.3e} rows/s (stats pass)", path.display());
    }
}
