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
    // c1's second request reuses its first full block; c2 shares nothing with c1.
    assert!(
        t.contains("prefix reuse  14.29 % (1 of 7 block references"),
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
