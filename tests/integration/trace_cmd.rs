//! `routelab trace stats` on mapped logs: the ready-made formats, a scenario's custom mapping,
//! and bad input as located errors with exit code 2.

use super::common::{routelab, scratch, text};
use std::path::{Path, PathBuf};

const GATEWAY_LOG: &str = r#"{"arrival_unix_ms": 1733050004000, "model": "gemma-27b", "prompt_tokens": 1100, "output_tokens": 203, "prefix_hashes": [11, 22], "worker": "pro6000", "status": "ok", "ttft_ms": 412.5, "e2e_ms": 9012.0}
{"arrival_unix_ms": 1733050000000, "model": "gemma-27b", "prompt_tokens": 1000, "output_tokens": 100, "prefix_hashes": [11], "worker": "pair", "status": "ok", "ttft_ms": 100.0, "e2e_ms": 2000.0}
{"arrival_unix_ms": 1733050001000, "model": "gemma-27b", "prompt_tokens": 10, "output_tokens": null, "prefix_hashes": [], "worker": "pair", "status": "error", "ttft_ms": null, "e2e_ms": null}
"#;

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn stats(args: &[&str]) -> (bool, Option<i32>, String) {
    let mut all = vec!["trace", "stats"];
    all.extend_from_slice(args);
    let o = routelab(&all);
    (o.status.success(), o.status.code(), text(&o))
}

#[test]
fn gateway_log_stats_skip_and_report_failed_requests_with_units() {
    let dir = scratch("trace-cmd-gateway");
    let log = write(&dir, "gateway.jsonl", GATEWAY_LOG);
    let log = log.to_str().unwrap();

    let (ok, code, t) = stats(&[log, "--format", "gateway-log"]);
    assert!(!ok && code == Some(2), "{t}");
    assert!(
        t.contains(&format!("{log}:3: field `output_tokens`")) && t.contains("completed request"),
        "{t}"
    );

    let (ok, _, t) = stats(&[log, "--format", "gateway-log", "--skip-bad-rows"]);
    assert!(ok, "{t}");
    for want in [
        "rows          2 requests",
        "skipped rows  1 (invalid, skipped)",
        "  e.g. ",
        "span          4.000 s",
        "mean rate     0.500 req/s",
        "prompt        mean 1050.0 / min 1000 / p50 1000 / p99 1100 / max 1100 tokens",
        "prefix reuse  33.33 % (1 of 3 block references; 2 distinct blocks)",
    ] {
        assert!(t.contains(want), "missing `{want}` in\n{t}");
    }
}

#[test]
fn otel_stats_count_the_spans_that_are_not_inference() {
    let dir = scratch("trace-cmd-otel");
    let log = write(
        &dir,
        "spans.jsonl",
        r#"{"startTimeUnixNano": "1733050000000000000", "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "812"}}, {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "20"}}]}
{"startTimeUnixNano": "1733050000100000000", "attributes": [{"key": "http.request.method", "value": {"stringValue": "GET"}}]}
{"startTimeUnixNano": 1733050001000000000, "attributes": {"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10}}
"#,
    );
    let (ok, _, t) = stats(&[log.to_str().unwrap(), "--format", "otel-genai"]);
    assert!(ok, "{t}");
    assert!(t.contains("rows          2 requests"), "{t}");
    assert!(
        t.contains("ignored rows  1 (spans without gen_ai.usage"),
        "{t}"
    );
    assert!(t.contains("mean rate     2.000 req/s"), "{t}");
}

/// A scenario in `dir` whose only traffic is `trace` (YAML lines under `- trace:`).
fn scenario(dir: &Path, trace: &str) -> String {
    let hardware = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hardware");
    write(
        dir,
        "scenario.yaml",
        &format!(
            "seed: 1\nmodel: m\nhardware_dir: {}\nfleet:\n  - {{ name: a, profile: rtx4090-27b }}\ntraffic:\n  - trace:\n{trace}policies: [seed-v1]\n",
            hardware.display()
        ),
    )
    .display()
    .to_string()
}

#[test]
fn a_scenarios_custom_mapping_is_used_for_its_trace_sources() {
    let dir = scratch("trace-cmd-scenario");
    write(
        &dir,
        "requests.csv",
        "when,conv,in,out\n\
         2025-03-01 12:00:00,c1,600,50\n\
         2025-03-01 12:00:10,c1,1200,50\n\
         2025-03-01 12:00:20,c2,600,50\n",
    );
    let sc = scenario(
        &dir,
        "      path: requests.csv\n      mapping: { arrival: when, prompt_tokens: in, output_tokens: out, session_id: conv }\n",
    );
    let (ok, _, t) = stats(&[&sc]);
    assert!(ok, "{t}");
    assert!(
        t.contains("traffic[0]: ") && t.contains("requests.csv (csv)"),
        "{t}"
    );
    assert!(t.contains("span          20.000 s"), "{t}");
    // c1's second request reuses its first full block; c2 shares nothing with c1. The blocks
    // come from the session ids, so the reuse is labelled assumed (issue 41).
    assert!(
        t.contains("prefix reuse  14.29 % assumed from the session ids")
            && t.contains("(1 of 7 block references"),
        "{t}"
    );
    let (ok, _, t) = stats(&[&sc, "--limit", "1"]);
    assert!(ok && t.contains("rows          1 requests"), "{t}");
}

#[test]
fn bad_mapped_input_exits_2_with_a_located_error() {
    let dir = scratch("trace-cmd-bad");
    write(&dir, "requests.csv", "time,in,out\n1,2,3\n");
    let sc = scenario(
        &dir,
        "      path: requests.csv\n      mapping: { arrival: when, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out }\n",
    );
    let (_, code, t) = stats(&[&sc]);
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains("requests.csv:1: bad header: no column `when` (mapping `arrival`)")
            && t.contains("columns are: time, in, out"),
        "{t}"
    );

    let sc = scenario(
        &dir,
        "      path: requests.csv\n      mapping: { arrival: time, prompt: in, output_tokens: out }\n",
    );
    let (_, code, t) = stats(&[&sc]);
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains("unknown field `prompt`") && t.contains("prompt_tokens"),
        "{t}"
    );

    let csv = dir.join("requests.csv");
    let (_, code, t) = stats(&[csv.to_str().unwrap(), "--format", "csv"]);
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains("needs a mapping") && t.contains("SCENARIO.yaml"),
        "{t}"
    );
}

/// A log whose `sid` column is a time bucket (a new id every 20 s), not a conversation: 300
/// requests 2 s apart whose prompts alternate long and short, so a "follow-up" is shorter than
/// the request before it half of the time.
fn counter_log(dir: &Path) -> String {
    let mut body = String::from("t,sid,in,out\n");
    for k in 0..300u32 {
        let t = 2 * k;
        let prompt = if k % 2 == 0 { 6_000 } else { 2_500 + 7 * k };
        body.push_str(&format!("{t},{},{prompt},{}\n", t / 20, 100 + k % 50));
    }
    write(dir, "counter.csv", &body);
    scenario(
        dir,
        "      path: counter.csv\n      mapping: { arrival: t, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out, session_id: sid }\n",
    )
}

/// Issue 41: `trace stats` gave no session-id warnings, showed the prefix reuse a growing
/// session prefix invents (74.8 % on the user's log) as if the log said so, and had no time
/// series.
#[test]
fn trace_stats_says_counter_session_ids_invent_reuse_and_shows_the_rate_over_time() {
    let dir = scratch("trace-cmd-counter");
    let sc = counter_log(&dir);
    let csv = dir.join("series.csv");
    let (ok, _, t) = stats(&[&sc, "--series", csv.to_str().unwrap()]);
    assert!(ok, "{t}");
    // The reuse is labelled assumed, and split from what the prompt lengths allow.
    assert!(
        t.contains("% assumed from the session ids, not read from the log"),
        "{t}"
    );
    assert!(
        t.contains("sessions      30 ids over 300 requests; 270 follow-up requests, 0 resume"),
        "{t}"
    );
    // Both warnings: the replay's (shorter follow-ups) and the ids' shape (a counter).
    assert!(
        t.contains("warning: counter.csv: ") && t.contains("shorter prompt"),
        "{t}"
    );
    assert!(
        t.contains("warning: session ids look like a counter"),
        "{t}"
    );
    // 598 s at the picked window: 10 s windows (60 of them, the most shown), 5 requests each
    // (0.5 req/s, a flat line).
    assert!(
        t.contains("rate series   60 windows of 10 s from the first arrival"),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "  requests    {} min 0.500 / max 0.500 req/s",
            "█".repeat(60)
        )),
        "{t}"
    );
    let series = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = series.lines().collect();
    assert_eq!(lines.len(), 61, "{series}");
    assert!(lines[1].starts_with("traffic[0],0,10,5,"), "{series}");
    assert!(lines[1].contains(",0.500000,"), "{series}");

    // The console output, paths left out (they name the scratch directory).
    let shown: String = t
        .lines()
        .filter(|l| !l.starts_with("traffic[") && !l.starts_with("series "))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!(shown);

    // A fixed window, and `session_prefix: none`: no blocks, so no reuse and no counter warning
    // (the id only groups requests).
    let sc = scenario(
        &dir,
        "      path: counter.csv\n      mapping: { arrival: t, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out, session_id: sid, session_prefix: none }\n",
    );
    let (ok, _, t) = stats(&[&sc, "--window", "300"]);
    assert!(ok, "{t}");
    assert!(t.contains("prefix reuse  n/a"), "{t}");
    assert!(!t.contains("look like a counter"), "{t}");
    assert!(t.contains("rate series   2 windows of 300 s"), "{t}");
    let (ok, code, t) = stats(&[&sc, "--window", "0"]);
    assert!(!ok && code == Some(2), "{t}");
}

/// Issue 41: ids unique per request are a request id, and an arrival unit the data doubts is
/// warned about in `trace stats` too (it was only in a run's warnings).
#[test]
fn trace_stats_warns_about_request_ids_and_a_doubtful_arrival_unit() {
    let dir = scratch("trace-cmd-unique");
    // 200 arrivals, two a tick, declared in milliseconds: 0.1 s at 2,000 req/s (seconds,
    // surely).
    let mut body = String::from("t,rid,in,out\n");
    for k in 0..200u32 {
        body.push_str(&format!("{},r{k},800,40\n", k / 2));
    }
    write(&dir, "ids.csv", &body);
    let sc = scenario(
        &dir,
        "      path: ids.csv\n      mapping: { arrival: t, arrival_unit: offset_ms, prompt_tokens: in, output_tokens: out, session_id: rid }\n",
    );
    let (ok, _, t) = stats(&[&sc]);
    assert!(ok, "{t}");
    assert!(
        t.contains("warning: session ids: only 0 of the 200 requests"),
        "{t}"
    );
    assert!(
        t.contains("warning: ids.csv") && t.contains("offset_s"),
        "{t}"
    );
}

/// Regression (found in review after issue 41): a fixed `--window` laid its windows out densely
/// from the first arrival to the last, so a span of 10^9 s (seconds read as a unit they are not)
/// and `--window 1` asked for 10^9 windows. It is refused at `--window`, naming the span and the
/// finest window allowed; left to pick, the ladder widens past a day and shows a short series.
#[test]
fn a_window_too_fine_for_the_span_is_refused_and_the_picked_one_widens_past_a_day() {
    let dir = scratch("trace-cmd-span");
    write(&dir, "span.csv", "t,in,out\n0,100,10\n1000000000,100,10\n");
    let sc = scenario(
        &dir,
        "      path: span.csv\n      mapping: { arrival: t, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out }\n",
    );
    let (ok, code, t) = stats(&[&sc, "--window", "1"]);
    assert!(!ok && code != Some(0), "{t}");
    assert!(t.contains("`--window`"), "{t}");
    assert!(t.contains("span of 1000000000 s"), "{t}");
    assert!(t.contains("1000000001 windows"), "{t}");
    assert!(t.contains("give --window 10001 or more"), "{t}");
    let (ok, _, t) = stats(&[&sc, "--window", "10001"]);
    assert!(ok, "{t}");
    let (ok, _, t) = stats(&[&sc]);
    assert!(ok, "{t}");
    // 10^9 s is 11,574 days: tenfold rungs past a day reach 1,000 days, 12 windows.
    assert!(t.contains("rate series   12 windows of 86400000 s"), "{t}");
}
