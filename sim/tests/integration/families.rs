//! The `family` traffic kind (issue 38): refusals named by field, determinism per seed, what
//! each family's requests look like (sessions, shared prefixes, bursts, the day), how the load
//! scale applies, and the bundled family scenarios.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use proptest::prelude::*;
use routelab_sim::Scenario;
use routelab_sim::scenario::TrafficSpec;
use routelab_sim::traffic::{
    Arrival, BLOCK_TOKENS, Family, FamilyConfig, FamilyKind, TrafficSource, blocks_for_tokens,
};

/// A one-worker scenario whose traffic is `source` (a `family:` block's value).
fn scenario(source: &str) -> Result<Scenario, routelab_policies::InputError> {
    let yaml = format!(
        "fleet: [{{ name: w, profile: rtx-pro-6000-27b, context_window: 131072 }}]\ntraffic:\n  - family: {source}\n"
    );
    Scenario::from_yaml(&yaml, Path::new("families-test.yaml"))
}

fn config(source: &str) -> FamilyConfig {
    let sc = scenario(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    let TrafficSpec::Family(c) = &sc.traffic[0] else {
        panic!("a family source")
    };
    c.clone()
}

/// A request's service time in the stand-in server of [`drive`]: 1 s, 20 µs per prompt token
/// and 20 ms per output token (a fixed rule, so that completions and follow-ups are
/// deterministic).
fn service_ns(a: &Arrival) -> u64 {
    1_000_000_000 + u64::from(a.prompt_tokens) * 20_000 + u64::from(a.output_tokens) * 20_000_000
}

/// Every request `src` sends when each is answered after [`service_ns`] (follow-ups included),
/// in the order they arrive.
fn drive(src: &mut dyn TrafficSource) -> Vec<Arrival> {
    let mut out = Vec::new();
    let mut completions: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut follow: Vec<Arrival> = Vec::new();
    let mut next = src.next_arrival().unwrap();
    loop {
        let t_next = next.as_ref().map(|a| a.at);
        let first_follow = follow
            .iter()
            .enumerate()
            .min_by_key(|(_, a)| a.at)
            .map(|(i, a)| (i, a.at));
        let t_comp = completions.peek().map(|Reverse((t, _))| *t);
        let Some(now) = [t_next, first_follow.map(|f| f.1), t_comp]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        if t_comp == Some(now) {
            let Reverse((t, tag)) = completions.pop().unwrap();
            if let Some(a) = src.on_complete(t, tag) {
                assert!(a.at >= t, "a follow-up comes after its completion");
                follow.push(a);
            }
            continue;
        }
        let a = match first_follow {
            Some((i, t)) if t == now => follow.swap_remove(i),
            _ => {
                let a = next.take().unwrap();
                next = src.next_arrival().unwrap();
                a
            }
        };
        completions.push(Reverse((a.at + service_ns(&a), a.tag)));
        out.push(a);
    }
    out
}

fn family(source: &str, seed: u64) -> Vec<Arrival> {
    drive(&mut Family::new(config(source), seed).unwrap())
}

/// What a turn asks: prompt and output tokens and prefix blocks.
type Turn = (u32, u32, Vec<u64>);

/// The requests of each session (tag), in order.
fn sessions(v: &[Arrival]) -> HashMap<u64, Vec<&Arrival>> {
    let mut m: HashMap<u64, Vec<&Arrival>> = HashMap::new();
    for a in v {
        m.entry(a.tag).or_default().push(a);
    }
    m
}

#[test]
fn every_out_of_range_parameter_is_a_located_error_naming_its_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "{ kind: nope, rate_per_s: 1, duration_s: 10 }",
            "traffic[0].family.kind",
            "unknown family `nope`",
        ),
        (
            "{ kind: chat, rate_per_s: -1, duration_s: 10 }",
            "traffic[0].family.rate_per_s",
            "expected a finite number > 0",
        ),
        (
            "{ kind: chat, rate_per_s: 1, duration_s: 0 }",
            "traffic[0].family.duration_s",
            "expected a number of seconds",
        ),
        (
            "{ kind: agentic, rate_per_s: 1, duration_s: 10, turns: { fixed: 0 } }",
            "traffic[0].family.turns",
            "expected at least 1 turn",
        ),
        (
            "{ kind: chat, rate_per_s: 1, duration_s: 10, turns: { uniform: { min: 0, max: 4 } } }",
            "traffic[0].family.turns",
            "expected at least 1 turn",
        ),
        (
            "{ kind: code, rate_per_s: 1, duration_s: 10, prompt: { uniform: { min: 900, max: 100 } } }",
            "traffic[0].family.prompt",
            "expected 1 <= min <= max",
        ),
        (
            "{ kind: rag, rate_per_s: 1, duration_s: 10, shared_prompt_tokens: { uniform: { min: 9, max: 1 } } }",
            "traffic[0].family.shared_prompt_tokens",
            "expected 1 <= min <= max",
        ),
        (
            "{ kind: chat, rate_per_s: 1, duration_s: 10, cv: 2 }",
            "traffic[0].family.cv",
            "does not apply to the `chat` family",
        ),
        (
            "{ kind: code, rate_per_s: 1, duration_s: 10, cv: 0 }",
            "traffic[0].family.cv",
            "expected a coefficient of variation > 0",
        ),
        (
            "{ kind: batch-day, rate_per_s: 1, duration_s: 10, batch_fraction: 1.5 }",
            "traffic[0].family.batch_fraction",
            "expected a number from 0 to 1",
        ),
        (
            "{ kind: batch-day, rate_per_s: 1, duration_s: 10, batch_size: { fixed: 0 } }",
            "traffic[0].family.batch_size",
            "expected at least 1 request",
        ),
        (
            "{ kind: rag, rate_per_s: 1, duration_s: 10, shared_prompts: 0 }",
            "traffic[0].family.shared_prompts",
            "expected 1 to 1000000",
        ),
        (
            "{ kind: rag, rate_per_s: 1, duration_s: 10, zipf_s: -1 }",
            "traffic[0].family.zipf_s",
            "expected a finite exponent >= 0",
        ),
        (
            "{ kind: agentic, rate_per_s: 1, duration_s: 10, burst_size: { uniform: { min: 0, max: 3 } } }",
            "traffic[0].family.burst_size",
            "expected at least 1 session",
        ),
        (
            "{ kind: chat, rate_per_s: 1, duration_s: 10, max_prompt_tokens: 0 }",
            "traffic[0].family.max_prompt_tokens",
            "expected a token count >= 1",
        ),
        (
            "{ kind: code, rate_per_s: 1, duration_s: 10, max_prompt_tokens: 4096 }",
            "traffic[0].family.max_prompt_tokens",
            "does not apply to the `code` family",
        ),
        (
            "{ kind: chat, rate_per_s: 1, duration_s: 10, think_s: { uniform: { min: 5, max: 1 } } }",
            "traffic[0].family.think_s",
            "expected min <= max",
        ),
        (
            "{ kind: rag, rate_per_s: 1, duration_s: 10, burst_size: { fixed: 2 } }",
            "traffic[0].family.burst_size",
            "does not apply to the `rag` family",
        ),
    ];
    for (source, field, says) in cases {
        let e = scenario(source).expect_err(source);
        assert_eq!(&e.field, field, "{source}: {e}");
        assert!(e.to_string().contains(says), "{source}: {e}");
        assert_eq!(e.line, Some(3), "{source}: located at its source: {e}");
    }
    // The unknown family's error lists the families; a parameter for another family names the
    // families it is for.
    let e = scenario("{ kind: nope, rate_per_s: 1, duration_s: 10 }").unwrap_err();
    assert_eq!(
        e.valid.as_deref(),
        Some("chat, code, rag, agentic, batch-day")
    );
    let e = scenario("{ kind: chat, rate_per_s: 1, duration_s: 10, cv: 2 }").unwrap_err();
    assert!(e.valid.as_deref().unwrap().contains("for code only"), "{e}");
    // Refused by the parser, still located: an unknown parameter, a negative count, a missing
    // rate.
    for source in [
        "{ kind: chat, rate_per_s: 1, duration_s: 10, turnz: { fixed: 2 } }",
        "{ kind: rag, rate_per_s: 1, duration_s: 10, shared_prompts: -3 }",
        "{ kind: rag, duration_s: 10 }",
    ] {
        let e = scenario(source).expect_err(source);
        assert_eq!(e.line, Some(3), "{source}: {e}");
    }
}

#[test]
fn lengths_beyond_every_window_are_not_an_input_error() {
    // No profile holds a million-token prompt: the router refuses such requests at run time
    // and counts them, as for any source.
    let c = config("{ kind: code, rate_per_s: 1, duration_s: 10, prompt: { fixed: 1000000 } }");
    assert_eq!(
        c.prompt,
        routelab_sim::traffic::LengthDist::Fixed(1_000_000)
    );
}

#[test]
fn the_same_seed_gives_the_same_requests_and_another_seed_others() {
    let yaml = "fleet: [{ name: w, profile: rtx-pro-6000-27b, context_window: 131072 }]\n\
                traffic:\n\
                \x20 - family: { kind: chat, rate_per_s: 0.5, duration_s: 120 }\n\
                \x20 - family: { kind: code, rate_per_s: 2, duration_s: 120 }\n\
                \x20 - family: { kind: rag, rate_per_s: 0.3, duration_s: 120 }\n\
                \x20 - family: { kind: agentic, rate_per_s: 0.2, duration_s: 120 }\n\
                \x20 - family: { kind: batch-day, rate_per_s: 3, duration_s: 120 }\n";
    let sc = Scenario::from_yaml(yaml, Path::new("five.yaml")).unwrap();
    let run = |seed| drive(&mut *sc.traffic_source(seed).unwrap());
    let a = run(7);
    assert!(a.len() > 300, "{}", a.len());
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
    // Every source took part.
    let sources: std::collections::HashSet<u64> = a.iter().map(|r| r.tag % 5).collect();
    assert_eq!(sources.len(), 5);
}

#[test]
fn what_a_session_asks_does_not_depend_on_when_its_turns_are_answered() {
    // The same source driven by two different servers: every session's prompts and outputs
    // are the same; only the times differ. So every policy of a comparison sees the same
    // sessions.
    let cfg = config("{ kind: agentic, rate_per_s: 0.5, duration_s: 60 }");
    let fast = drive(&mut Family::new(cfg.clone(), 11).unwrap());
    let mut slow_src = Family::new(cfg, 11).unwrap();
    let mut slow = Vec::new();
    // A slower server: each completion comes 10 s after the arrival, in arrival order.
    let mut queue: Vec<Arrival> = Vec::new();
    while let Some(a) = slow_src.next_arrival().unwrap() {
        queue.push(a);
    }
    while !queue.is_empty() {
        queue.sort_by_key(|a| a.at);
        let a = queue.remove(0);
        if let Some(f) = slow_src.on_complete(a.at + 10_000_000_000, a.tag) {
            queue.push(f);
        }
        slow.push(a);
    }
    let content = |v: &[Arrival]| {
        let mut s: Vec<(u64, Vec<Turn>)> = sessions(v)
            .into_iter()
            .map(|(tag, turns)| {
                (
                    tag,
                    turns
                        .iter()
                        .map(|a| (a.prompt_tokens, a.output_tokens, a.prefix_blocks.clone()))
                        .collect(),
                )
            })
            .collect();
        s.sort();
        s
    };
    assert_eq!(content(&fast), content(&slow));
    assert_ne!(
        fast.iter().map(|a| a.at).collect::<Vec<_>>(),
        slow.iter().map(|a| a.at).collect::<Vec<_>>()
    );
}

#[test]
fn the_load_scale_sends_the_same_requests_sooner() {
    let sc = scenario("{ kind: code, rate_per_s: 2, duration_s: 300 }").unwrap();
    let double = sc.with_load_scale(2.0).unwrap();
    let TrafficSpec::Family(c) = &double.traffic[0] else {
        panic!("a family")
    };
    assert_eq!(c.rate_per_s, 4.0);
    assert_eq!(c.duration, 300_000_000_000, "the duration stays as written");
    let one = drive(&mut *sc.traffic_source(3).unwrap());
    let two = drive(&mut *double.traffic_source(3).unwrap());
    // Twice the requests in the same time; the first ones are the same requests, sooner.
    let ratio = two.len() as f64 / one.len() as f64;
    assert!((1.8..2.2).contains(&ratio), "{ratio}");
    for (a, b) in one.iter().zip(&two).take(100) {
        assert_eq!(
            (a.prompt_tokens, a.output_tokens, &a.prefix_blocks),
            (b.prompt_tokens, b.output_tokens, &b.prefix_blocks)
        );
        assert!(b.at <= a.at);
    }
    // A scale of 1 is the same scenario.
    let same = sc.with_load_scale(1.0).unwrap();
    assert_eq!(drive(&mut *same.traffic_source(3).unwrap()), one);
}

#[test]
fn code_arrivals_are_bursty_at_the_rate_written() {
    let v = family("{ kind: code, rate_per_s: 5, duration_s: 2000 }", 1);
    let rate = v.len() as f64 / 2000.0;
    assert!((rate - 5.0).abs() < 0.5, "{rate}");
    let gaps: Vec<f64> = v.windows(2).map(|w| (w[1].at - w[0].at) as f64).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    // cv 2 written by default; Poisson would be 1.
    assert!(sd / mean > 1.6, "cv {}", sd / mean);
    // Short prompts and outputs (Azure code medians 1,469 and 13 tokens).
    let mut outs: Vec<u32> = v.iter().map(|a| a.output_tokens).collect();
    outs.sort_unstable();
    assert!(
        (9..=18).contains(&outs[outs.len() / 2]),
        "{}",
        outs[outs.len() / 2]
    );
}

#[test]
fn rag_requests_start_with_a_few_hot_documents() {
    let v = family("{ kind: rag, rate_per_s: 1, duration_s: 1000 }", 2);
    assert!(v.len() > 800);
    let mut by_first: HashMap<u64, usize> = HashMap::new();
    for a in &v {
        assert!(
            a.prompt_tokens >= 16_384,
            "a document is 16k tokens or more"
        );
        assert!(a.prompt_tokens <= 122_880 + 4096);
        *by_first.entry(a.prefix_blocks[0]).or_default() += 1;
    }
    let mut counts: Vec<usize> = by_first.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let top5: usize = counts.iter().take(5).sum();
    // Zipf 1 over 200 documents: the top 5 carry 2.28 / 5.88 = 39 % of requests.
    let share = top5 as f64 / v.len() as f64;
    assert!((0.3..0.5).contains(&share), "{share}");
    // Requests of the same document share every block wholly inside it, then part.
    let first = &v[0];
    let twin = v[1..]
        .iter()
        .find(|a| a.prefix_blocks[0] == first.prefix_blocks[0])
        .expect("a hot document repeats");
    let shared = first
        .prefix_blocks
        .iter()
        .zip(&twin.prefix_blocks)
        .take_while(|(x, y)| x == y)
        .count();
    assert!(shared >= 32, "at least 16k tokens shared, {shared} blocks");
    assert!(shared < first.prefix_blocks.len());
}

#[test]
fn agent_sessions_grow_by_tool_output_over_up_to_forty_turns() {
    let v = family("{ kind: agentic, rate_per_s: 0.5, duration_s: 600 }", 4);
    let s = sessions(&v);
    assert!(s.len() > 200, "{}", s.len());
    let mut longest = 0;
    let mut apps = std::collections::HashSet::new();
    for turns in s.values() {
        longest = longest.max(turns.len());
        assert!(turns.len() <= 40);
        assert!(
            turns[0].prompt_tokens >= 2000,
            "an app prompt is 2k tokens or more"
        );
        apps.insert(turns[0].prefix_blocks[0]);
        for w in turns.windows(2) {
            assert!(w[1].at >= w[0].at);
            // The next prompt is the last prompt, its output and the tool's output.
            assert!(w[1].prompt_tokens > w[0].prompt_tokens + w[0].output_tokens);
            let full = (w[0].prompt_tokens / BLOCK_TOKENS) as usize;
            assert_eq!(w[0].prefix_blocks[..full], w[1].prefix_blocks[..full]);
        }
    }
    assert!(longest >= 25, "{longest}");
    assert!(apps.len() <= 8 && apps.len() >= 4, "{}", apps.len());
    // Sessions start in bursts: many first turns within 2 s of the one before.
    let mut starts: Vec<u64> = s.values().map(|t| t[0].at).collect();
    starts.sort_unstable();
    let close = starts
        .windows(2)
        .filter(|w| w[1] - w[0] < 2_000_000_000)
        .count();
    // At 0.5 sessions/s a Poisson process puts 63 % of starts within 2 s of the previous; bursts of 4.5 on average, many more.
    assert!(
        close as f64 / starts.len() as f64 > 0.75,
        "{close}/{}",
        starts.len()
    );
}

#[test]
fn a_chat_session_ends_before_it_outgrows_max_prompt_tokens() {
    let v = family(
        "{ kind: chat, rate_per_s: 1, duration_s: 300, turns: { fixed: 30 }, max_prompt_tokens: 3000 }",
        5,
    );
    assert!(v.iter().all(|a| a.prompt_tokens <= 3000));
    let s = sessions(&v);
    assert!(
        s.values().all(|t| t.len() < 30),
        "every session stops early"
    );
    assert!(s.values().any(|t| t.len() >= 3));
}

#[test]
fn batch_day_peaks_at_mid_day_and_releases_jobs_in_bursts() {
    let v = family("{ kind: batch-day, rate_per_s: 4, duration_s: 3000 }", 6);
    let rate = v.len() as f64 / 3000.0;
    assert!((rate - 4.0).abs() < 0.8, "{rate}");
    let online: Vec<&Arrival> = v.iter().filter(|a| a.tag % 2 == 0).collect();
    let batch = v.len() - online.len();
    let share = batch as f64 / v.len() as f64;
    assert!((0.1..0.5).contains(&share), "batch share {share}");
    let in_third = |k: u64| {
        online
            .iter()
            .filter(|a| a.at / 1_000_000_000 / 1000 == k)
            .count()
    };
    // Trough at the start, peak at mid-day: the middle third is the busiest.
    assert!(
        in_third(1) as f64 > 1.5 * in_third(0) as f64,
        "{} {}",
        in_third(0),
        in_third(1)
    );
    // A job's requests come within its 10 s window and share its instructions.
    let mut by_first: HashMap<u64, Vec<u64>> = HashMap::new();
    for a in v.iter().filter(|a| a.tag % 2 == 1) {
        by_first.entry(a.prefix_blocks[0]).or_default().push(a.at);
    }
    let biggest = by_first.values().map(Vec::len).max().unwrap();
    assert!(biggest >= 100, "{biggest}");
    for times in by_first.values().filter(|t| t.len() >= 100) {
        let span = times.iter().max().unwrap() - times.iter().min().unwrap();
        assert!(span <= 10_000_000_000, "{span}");
    }
}

#[test]
fn every_bundled_family_scenario_is_valid_and_scales() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/families");
    let mut seen = std::collections::HashSet::new();
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let sc = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        sc.with_load_scale(1.5).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\nslo:"),
            "{}: an SLO fit to the family",
            path.display()
        );
        for t in &sc.traffic {
            if let TrafficSpec::Family(c) = t {
                seen.insert(c.family);
            }
        }
        n += 1;
    }
    assert!(n >= 10, "{n} scenarios");
    assert_eq!(
        seen.len(),
        FamilyKind::ALL.len(),
        "every family has scenarios"
    );
}

fn any_family() -> impl Strategy<Value = FamilyKind> {
    prop::sample::select(FamilyKind::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever the family, seed and rate: arrivals in time order, every request's blocks cover
    /// its prompt, every session's turns later and longer than the one before and starting with
    /// it, and every request at least as long as its shared prefix (the family's shortest).
    #[test]
    fn every_family_keeps_its_invariants(f in any_family(), seed in any::<u64>(), rate in 0.05f64..3.0) {
        let cfg = f.defaults(0, rate, 60_000_000_000);
        let shortest_shared = match f {
            FamilyKind::Rag => 16_384,
            FamilyKind::Agentic => 2000,
            FamilyKind::Chat | FamilyKind::BatchDay => 0,
            FamilyKind::Code => 0,
        };
        let mut src = Family::new(cfg, seed).unwrap();
        let mut last = 0;
        let mut first_turns = Vec::new();
        while let Some(a) = src.next_arrival().unwrap() {
            prop_assert!(a.at >= last);
            last = a.at;
            first_turns.push(a);
        }
        let v = drive(&mut Family::new(f.defaults(0, rate, 60_000_000_000), seed).unwrap());
        prop_assert!(v.len() >= first_turns.len());
        for a in &v {
            prop_assert!(a.prompt_tokens >= 1 && a.output_tokens >= 1);
            prop_assert!(a.prompt_tokens >= shortest_shared);
            prop_assert_eq!(a.prefix_blocks.len() as u64, blocks_for_tokens(u64::from(a.prompt_tokens)));
        }
        for turns in sessions(&v).values() {
            prop_assert!(f.has_sessions() || turns.len() == 1);
            for w in turns.windows(2) {
                prop_assert!(w[1].at >= w[0].at);
                prop_assert!(w[1].prompt_tokens > w[0].prompt_tokens);
                let full = (w[0].prompt_tokens / BLOCK_TOKENS) as usize;
                prop_assert_eq!(&w[0].prefix_blocks[..full], &w[1].prefix_blocks[..full]);
            }
        }
    }
}
