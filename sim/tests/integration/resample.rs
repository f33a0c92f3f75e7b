//! Seeds that resample a trace: two seeds give different arrivals with the trace's statistics
//! (rate, length distributions, session structure and prefix reuse within stated tolerances),
//! `resample: none` replays every seed exactly as the streamed replay always did, and the two
//! parts of a held-out split partition the trace.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use routelab_sim::Scenario;
use routelab_sim::traffic::{
    Arrival, LoadedTrace, ReplayOptions, Resample, TimeWindow, TraceFormat, TraceReplay,
    TraceStats, TrafficError, TrafficSource, open_trace,
};

fn data(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/traces")
        .join(rel);
    assert!(p.is_file(), "{} missing (vendored traces)", p.display());
    p
}

fn drain(src: &mut dyn TrafficSource) -> Result<Vec<Arrival>, TrafficError> {
    let mut v = Vec::new();
    while let Some(a) = src.next_arrival()? {
        v.push(a);
    }
    Ok(v)
}

fn resampled(path: &Path, format: TraceFormat, seed: u64) -> Vec<Arrival> {
    let options = ReplayOptions {
        resample: Some(Resample::BLOCK_AUTO),
        ..ReplayOptions::default()
    };
    drain(&mut *open_trace(path, format, &options, seed).unwrap()).unwrap()
}

struct Source<'a>(std::slice::Iter<'a, Arrival>);

impl TrafficSource for Source<'_> {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        Ok(self.0.next().cloned())
    }
}

fn stats_of(v: &[Arrival]) -> TraceStats {
    TraceStats::from_source(&mut Source(v.iter())).unwrap()
}

fn rel(got: f64, want: f64) -> f64 {
    (got / want - 1.0).abs()
}

/// The tolerances a resample is held to against its trace, stated from the spread a block
/// bootstrap has on these one-hour traces (measured over 20 seeds: the request count moves by
/// 2-3 % (SD) on Mooncake and 4 % on Azure conv, the mean prompt by 3-4 %, the output median by
/// up to 20 % on Azure conv, whose outputs cluster in time):
/// - each seed: request count and mean rate within 15 %, mean lengths within 15 %, median and
///   p99 lengths within 25 %, prefix reuse within 5 percentage points, and every length one the
///   trace has (min and max within the trace's);
/// - the mean over 20 seeds (unbiasedness): count, rate and mean lengths within 3 %, prefix
///   reuse within 1 point.
const SEED_COUNT_AND_RATE: f64 = 0.15;
const SEED_MEAN_LENGTH: f64 = 0.15;
const SEED_QUANTILE: f64 = 0.25;
const SEED_REUSE_POINTS: f64 = 0.05;
const MEAN_OVER_SEEDS: f64 = 0.03;
const MEAN_REUSE_POINTS: f64 = 0.01;

fn assert_faithful(original: &TraceStats, seed: u64, got: &TraceStats) {
    let what = format!("seed {seed}: {got:?}\nvs the trace {original:?}");
    assert!(
        rel(got.rows as f64, original.rows as f64) <= SEED_COUNT_AND_RATE,
        "rows: {what}"
    );
    assert!(
        rel(
            got.mean_rate_per_s.unwrap(),
            original.mean_rate_per_s.unwrap()
        ) <= SEED_COUNT_AND_RATE,
        "rate: {what}"
    );
    for (g, o) in [(got.prompt, original.prompt), (got.output, original.output)] {
        assert!(
            rel(g.mean, o.mean) <= SEED_MEAN_LENGTH,
            "mean length: {what}"
        );
        for (gq, oq) in [(g.p50, o.p50), (g.p99, o.p99)] {
            assert!(
                rel(f64::from(gq), f64::from(oq)) <= SEED_QUANTILE,
                "length quantile: {what}"
            );
        }
        assert!(
            g.max <= o.max && g.min >= o.min,
            "lengths come from the trace: {what}"
        );
    }
    match (got.prefix, original.prefix) {
        (Some(g), Some(o)) => assert!(
            (g.reuse_fraction - o.reuse_fraction).abs() <= SEED_REUSE_POINTS,
            "prefix reuse: {what}"
        ),
        (None, None) => {}
        _ => panic!("prefix information kept: {what}"),
    }
}

type Stat = fn(&TraceStats) -> f64;

/// Two seeds differ, a seed repeats itself, each of 20 seeds is faithful and their mean is
/// the trace's.
fn check_trace(rel_path: &str, format: TraceFormat) {
    let path = data(rel_path);
    let original = TraceStats::of_trace(&path, format.clone(), ReplayOptions::default()).unwrap();
    let draws: Vec<Vec<Arrival>> = (1..=20)
        .map(|seed| resampled(&path, format.clone(), seed))
        .collect();
    assert_ne!(draws[0], draws[1], "two seeds draw different arrivals");
    assert_eq!(
        draws[0],
        resampled(&path, format, 1),
        "a seed draws the same resample every time"
    );
    let stats: Vec<TraceStats> = draws.iter().map(|v| stats_of(v)).collect();
    for (seed, (v, s)) in (1..).zip(draws.iter().zip(&stats)) {
        assert!(v.windows(2).all(|w| w[0].at <= w[1].at), "sorted by time");
        assert_faithful(&original, seed, s);
    }
    let mean = |f: Stat| stats.iter().map(f).sum::<f64>() / stats.len() as f64;
    let checks: [(&str, Stat); 4] = [
        ("rows", |s| s.rows as f64),
        ("rate", |s| s.mean_rate_per_s.unwrap()),
        ("prompt mean", |s| s.prompt.mean),
        ("output mean", |s| s.output.mean),
    ];
    for (name, f) in checks {
        assert!(
            rel(mean(f), f(&original)) <= MEAN_OVER_SEEDS,
            "{rel_path}: the mean {name} over 20 seeds is {} against the trace's {}",
            mean(f),
            f(&original)
        );
    }
    if let Some(o) = original.prefix {
        let reuse = mean(|s| s.prefix.unwrap().reuse_fraction);
        assert!(
            (reuse - o.reuse_fraction).abs() <= MEAN_REUSE_POINTS,
            "{rel_path}: mean reuse {reuse} against {}",
            o.reuse_fraction
        );
    }
}

#[test]
fn seeds_of_mooncake_differ_and_keep_its_statistics_and_prefix_reuse() {
    check_trace(
        "mooncake_fast25/conversation_trace.jsonl",
        TraceFormat::MooncakeJsonl,
    );
}

#[test]
fn seeds_of_an_azure_trace_differ_and_keep_its_statistics() {
    check_trace(
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        TraceFormat::AzureCsv,
    );
}

/// A chat log: 600 sessions of 1 to 6 turns over an hour, each turn's prompt the previous
/// prompt plus 300 tokens.
fn chat_log(dir: &Path) -> PathBuf {
    let mut text = String::new();
    let mut s = 7u64;
    let mut next = |m: u64| {
        s = routelab_policies::streams::splitmix64(s);
        s % m
    };
    for session in 0..600 {
        let start = next(3_400);
        let turns = 1 + next(6);
        for t in 0..turns {
            let at = start + t * (20 + next(60));
            text.push_str(&format!(
                "{{\"t\": {at}, \"in\": {}, \"out\": {}, \"conv\": \"c{session}\"}}\n",
                200 + 300 * t,
                50 + next(200)
            ));
        }
    }
    let p = dir.join("chats.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

fn chat_scenario(dir: &Path, resample: &str) -> Scenario {
    let log = chat_log(dir);
    let yaml = format!(
        "fleet: [{{ name: w, profile: rtx-pro-6000-27b }}]\n\
         traffic:\n  - trace: {{ path: {}, format: jsonl, resample: {resample}, mapping: {{ \
         arrival: t, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out, \
         session_id: conv }} }}\n",
        log.file_name().unwrap().to_string_lossy()
    );
    Scenario::from_yaml(&yaml, &dir.join("chats.yaml")).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-resample-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The sessions of a run's arrivals, by their first prefix block (private to a session, and
/// salted anew in each repeated copy): each session's prompt lengths in time order.
fn sessions(v: &[Arrival]) -> Vec<Vec<u32>> {
    let mut by: BTreeMap<u64, Vec<(u64, u32)>> = BTreeMap::new();
    for a in v {
        by.entry(a.prefix_blocks[0])
            .or_default()
            .push((a.at, a.prompt_tokens));
    }
    by.into_values()
        .map(|mut s| {
            s.sort_by_key(|&(at, p)| (at, p));
            s.into_iter().map(|(_, p)| p).collect()
        })
        .collect()
}

#[test]
fn a_sessions_requests_stay_together_and_the_turn_structure_is_the_logs() {
    let dir = scratch("sessions");
    let sc = chat_scenario(&dir, "block");
    let exact = drain(&mut *chat_scenario(&dir, "none").traffic_source(1).unwrap()).unwrap();
    let original = sessions(&exact);
    let turns = |s: &[Vec<u32>]| {
        let mut h: BTreeMap<usize, usize> = BTreeMap::new();
        for x in s {
            *h.entry(x.len()).or_default() += 1;
        }
        h
    };
    let mean_turns = |s: &[Vec<u32>]| s.iter().map(Vec::len).sum::<usize>() as f64 / s.len() as f64;
    let mut draws = Vec::new();
    for seed in [1, 2] {
        let v = drain(&mut *sc.traffic_source(seed).unwrap()).unwrap();
        let got = sessions(&v);
        // Every session copy is one of the log's sessions, whole, its turns in order (a copy
        // that wraps round the end of the timeline keeps its turns, not their order).
        for s in &got {
            let mut sorted = s.clone();
            sorted.sort_unstable();
            assert!(
                original.contains(&sorted),
                "seed {seed}: {s:?} is no session of the log"
            );
        }
        // The session structure: as many sessions and turns per session, within the stated
        // tolerance; a session count that moves by seed.
        assert!(rel(got.len() as f64, original.len() as f64) <= SEED_COUNT_AND_RATE);
        assert!(rel(mean_turns(&got), mean_turns(&original)) <= SEED_MEAN_LENGTH);
        assert_eq!(
            turns(&got).keys().max(),
            turns(&original).keys().max(),
            "seed {seed}: the longest session is drawn (600 sessions, ~1/6 of them of 6 turns)"
        );
        draws.push(v);
    }
    assert_ne!(draws[0], draws[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resample_none_replays_every_seed_as_the_streamed_replay_does() {
    let path = data("mooncake_fast25/conversation_trace.jsonl");
    let options = ReplayOptions {
        rate_scale: 0.3,
        limit: Some(2000),
        start_offset: 30_000_000_000,
        ..ReplayOptions::default()
    };
    let streamed =
        drain(&mut TraceReplay::open(&path, TraceFormat::MooncakeJsonl, options.clone()).unwrap())
            .unwrap();
    for resample in [None, Some(Resample::Exact)] {
        let o = ReplayOptions {
            resample,
            ..options.clone()
        };
        for seed in [1, 2, 99] {
            let got = drain(&mut *open_trace(&path, TraceFormat::MooncakeJsonl, &o, seed).unwrap())
                .unwrap();
            assert_eq!(got, streamed, "{resample:?}, seed {seed}");
        }
        // Read whole (as a resample reads it) and replayed as recorded: the same arrivals too.
        let whole = LoadedTrace::load(&path, TraceFormat::MooncakeJsonl, &o)
            .unwrap()
            .exact(&o);
        assert_eq!(drain(&mut { whole }).unwrap(), streamed);
    }
}

#[test]
fn a_resample_scales_with_the_load_like_the_trace() {
    // The capacity search multiplies rate_scale: the same resample, its times divided.
    let path = data("azure_llm_2023/AzureLLMInferenceTrace_code.csv");
    let at = |rate_scale: f64| {
        let o = ReplayOptions {
            rate_scale,
            resample: Some(Resample::BLOCK_AUTO),
            ..ReplayOptions::default()
        };
        drain(&mut *open_trace(&path, TraceFormat::AzureCsv, &o, 5).unwrap()).unwrap()
    };
    let (one, two) = (at(1.0), at(2.0));
    assert_eq!(one.len(), two.len());
    for (a, b) in one.iter().zip(&two) {
        assert_eq!(
            (a.prompt_tokens, a.output_tokens),
            (b.prompt_tokens, b.output_tokens)
        );
        assert!((b.at as f64 - a.at as f64 / 2.0).abs() <= 1.0);
    }
}

#[test]
fn the_held_out_parts_partition_the_trace_by_time() {
    let path = data("azure_llm_2023/AzureLLMInferenceTrace_code.csv");
    let all = LoadedTrace::load(&path, TraceFormat::AzureCsv, &ReplayOptions::default()).unwrap();
    let part = |from, to| {
        let o = ReplayOptions {
            window: Some(TimeWindow { from, to }),
            ..ReplayOptions::default()
        };
        drain(&mut *open_trace(&path, TraceFormat::AzureCsv, &o, 1).unwrap()).unwrap()
    };
    let (head, tail) = (part(0.0, 0.7), part(0.7, 1.0));
    assert_eq!(head.len() + tail.len(), all.len());
    assert_eq!(
        (head[0].at, tail[0].at),
        (0, 0),
        "each part starts at its first row"
    );
    let span = all.span_ns() as f64;
    let head_span = head.last().unwrap().at as f64;
    assert!(
        head_span < 0.7 * span && head_span > 0.69 * span,
        "{head_span} of {span}"
    );
    // Tags are trace lines: the held-out part is the later lines, each row in one part once.
    assert!(head.iter().map(|a| a.tag).max() < tail.iter().map(|a| a.tag).min());
    let mut lines: HashMap<u64, usize> = HashMap::new();
    for a in head.iter().chain(&tail) {
        *lines.entry(a.tag).or_default() += 1;
    }
    assert!(lines.values().all(|&n| n == 1));
}
