//! Any request log as a trace: custom JSONL / CSV mappings, every arrival unit, sessions,
//! the ready-made `gateway-log` and `otel-genai` mappings, bad input as located errors, and a
//! scenario that replays a mapped log.

use std::path::{Path, PathBuf};

use routelab_sim::Scenario;
use routelab_sim::scenario::TrafficSpec;
use routelab_sim::traffic::{
    Arrival, ArrivalUnit, BadRowPolicy, FieldPath, ReplayOptions, TraceFormat, TraceLayout,
    TraceMapping, TraceReplay, TraceStats, TrafficError, TrafficSource,
};

const S: u64 = 1_000_000_000;

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-mapped-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn field(s: &str) -> FieldPath {
    FieldPath::parse(s).unwrap()
}

fn column(s: &str) -> FieldPath {
    FieldPath::column(s).unwrap()
}

/// A custom mapping without session or hashes.
fn mapping(layout: TraceLayout, fields: [&str; 3], unit: ArrivalUnit) -> TraceFormat {
    let f = |s: &str| match layout {
        TraceLayout::Jsonl => field(s),
        TraceLayout::Csv => column(s),
    };
    TraceFormat::Mapped(Box::new(
        TraceMapping::custom(
            layout,
            f(fields[0]),
            unit,
            f(fields[1]),
            f(fields[2]),
            None,
            None,
        )
        .unwrap(),
    ))
}

fn replay(path: &Path, format: TraceFormat, options: ReplayOptions) -> TraceReplay {
    TraceReplay::open(path, format, options).unwrap()
}

fn drain(src: &mut dyn TrafficSource) -> Result<Vec<Arrival>, TrafficError> {
    let mut v = Vec::new();
    while let Some(a) = src.next_arrival()? {
        v.push(a);
    }
    Ok(v)
}

fn all(path: &Path, format: TraceFormat) -> Result<Vec<Arrival>, TrafficError> {
    drain(&mut replay(path, format, ReplayOptions::default()))
}

fn at_s(v: &[Arrival]) -> Vec<f64> {
    v.iter().map(|a| a.at as f64 / S as f64).collect()
}

#[test]
fn custom_jsonl_reads_nested_and_dotted_keys() {
    let dir = scratch("jsonl");
    let p = write(
        &dir,
        "log.jsonl",
        r#"{"ts": 1740830400.25, "req": {"usage": {"in.tokens": 812}}, "out": 203}
{"ts": 1740830401.75, "req": {"usage": {"in.tokens": 90}}, "out": "7", "other": [1]}
"#,
    );
    let fmt = mapping(
        TraceLayout::Jsonl,
        ["ts", "req.usage.\"in.tokens\"", "out"],
        ArrivalUnit::Auto,
    );
    let v = all(&p, fmt).unwrap();
    assert_eq!(at_s(&v), [0.0, 1.5]);
    assert_eq!((v[0].prompt_tokens, v[0].output_tokens), (812, 203));
    assert_eq!((v[1].prompt_tokens, v[1].output_tokens), (90, 7));
    assert_eq!((v[0].tag, v[1].tag), (1, 2), "tags are line numbers");
    assert!(v.iter().all(|a| a.prefix_blocks.is_empty()));
}

#[test]
fn custom_csv_reads_renamed_columns_with_quoted_fields() {
    let dir = scratch("csv");
    let p = write(
        &dir,
        "log.csv",
        "id,When,user,Input Tokens,completion\n\
         a,2025-03-01T12:00:00Z,\"Smith, J\",100,10\n\
         b,2025-03-01T12:00:02.5Z,\"O\"\"Neil\",200,20\n",
    );
    let fmt = mapping(
        TraceLayout::Csv,
        ["when", "Input Tokens", "completion"],
        ArrivalUnit::Iso8601,
    );
    let v = all(&p, fmt).unwrap();
    assert_eq!(at_s(&v), [0.0, 2.5]);
    assert_eq!(
        v.iter()
            .map(|a| (a.prompt_tokens, a.output_tokens))
            .collect::<Vec<_>>(),
        [(100, 10), (200, 20)]
    );
}

#[test]
fn every_arrival_unit_gives_the_same_relative_times() {
    let dir = scratch("units");
    let cases: [(&str, &str, &str, ArrivalUnit); 9] = [
        (
            "\"2025-03-01T12:00:00Z\"",
            "\"2025-03-01T12:00:01.5Z\"",
            "iso-z",
            ArrivalUnit::Auto,
        ),
        (
            "\"2025-03-01T14:00:00+02:00\"",
            "\"2025-03-01T12:00:01.5Z\"",
            "iso-offset",
            ArrivalUnit::Iso8601,
        ),
        (
            "\"2025-03-01 12:00:00\"",
            "\"2025-03-01 12:00:01.500\"",
            "iso-naive",
            ArrivalUnit::Auto,
        ),
        ("1740830400", "1740830401.5", "epoch-s", ArrivalUnit::Auto),
        (
            "1740830400000",
            "1740830401500",
            "epoch-ms",
            ArrivalUnit::Auto,
        ),
        (
            "\"1740830400000000000\"",
            "1740830401500000000",
            "epoch-ns",
            ArrivalUnit::EpochNs,
        ),
        (
            "1740830400",
            "1740830401.5",
            "epoch-s-named",
            ArrivalUnit::EpochS,
        ),
        ("10", "11.5", "offset-s", ArrivalUnit::OffsetS),
        ("0", "1500", "offset-ms", ArrivalUnit::OffsetMs),
    ];
    for (t0, t1, name, unit) in cases {
        let p = write(
            &dir,
            &format!("{name}.jsonl"),
            &format!("{{\"t\": {t1}, \"p\": 2, \"o\": 1}}\n{{\"t\": {t0}, \"p\": 1, \"o\": 1}}\n"),
        );
        let v = all(&p, mapping(TraceLayout::Jsonl, ["t", "p", "o"], unit))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Out of order in the file, sorted on replay, relative to the earliest.
        assert_eq!(at_s(&v), [0.0, 1.5], "{name}");
        assert_eq!(v[0].prompt_tokens, 1, "{name}");
    }
}

#[test]
fn requests_of_a_session_share_the_previous_requests_blocks() {
    let dir = scratch("sessions");
    let p = write(
        &dir,
        "chat.jsonl",
        r#"{"t": 0, "conv": "a", "p": 1000, "o": 200}
{"t": 1, "conv": "b", "p": 1000, "o": 200}
{"t": 5, "conv": "a", "p": 1300, "o": 100}
{"t": 9, "conv": null, "p": 1300, "o": 100}
"#,
    );
    let fmt = TraceFormat::Mapped(Box::new(
        TraceMapping::custom(
            TraceLayout::Jsonl,
            field("t"),
            ArrivalUnit::OffsetS,
            field("p"),
            field("o"),
            Some(field("conv")),
            None,
        )
        .unwrap(),
    ));
    let v = all(&p, fmt.clone()).unwrap();
    let (a1, b1, a2, none) = (&v[0], &v[1], &v[2], &v[3]);
    assert_eq!((a1.prefix_blocks.len(), a2.prefix_blocks.len()), (2, 3));
    // The second request of session `a` starts with the first's full block (its history).
    assert_eq!(a2.prefix_blocks[0], a1.prefix_blocks[0]);
    // Another session shares nothing; a request without a session has no blocks.
    assert!(
        b1.prefix_blocks
            .iter()
            .all(|h| !a1.prefix_blocks.contains(h))
    );
    assert!(none.prefix_blocks.is_empty());
    // Deterministic: the same file gives the same hashes.
    assert_eq!(all(&p, fmt).unwrap(), v);
}

const GATEWAY_LOG: &str = r#"{"arrival_unix_ms": 1733050002000, "model": "gemma-27b", "prompt_tokens": 812, "output_tokens": 203, "prefix_hashes": [123, 456], "worker": "pro6000", "status": "ok", "ttft_ms": 412.5, "e2e_ms": 9012.0}
{"arrival_unix_ms": 1733050000000, "model": "gemma-27b", "prompt_tokens": 1100, "output_tokens": 50, "prefix_hashes": [123, 456, 789], "worker": "pair", "status": "ok", "ttft_ms": 100.0, "e2e_ms": 2000.0}
{"arrival_unix_ms": 1733050001000, "model": "gemma-27b", "prompt_tokens": 10, "output_tokens": null, "prefix_hashes": [], "worker": "pair", "status": "error", "ttft_ms": null, "e2e_ms": null}
{"arrival_unix_ms": 1733050003000, "model": "gemma-27b", "prompt_tokens": 10, "output_tokens": 0, "prefix_hashes": [18446744073709551615], "worker": "pair", "status": "ok", "ttft_ms": null, "e2e_ms": null}
"#;

#[test]
fn gateway_log_is_sorted_and_failed_requests_are_bad_rows() {
    let dir = scratch("gateway");
    let p = write(&dir, "gateway.jsonl", GATEWAY_LOG);
    let fmt = TraceFormat::from_name("gateway-log").unwrap();
    let e = all(&p, fmt.clone()).unwrap_err();
    assert!(e.is_row_error());
    let m = e.to_string();
    assert!(
        m.starts_with(&format!(
            "{}:3: field `output_tokens`: is empty or null",
            p.display()
        )) && m.contains("completed request"),
        "{m}"
    );
    let mut r = replay(
        &p,
        fmt,
        ReplayOptions {
            on_bad_row: BadRowPolicy::Skip,
            ..ReplayOptions::default()
        },
    );
    let v = drain(&mut r).unwrap();
    assert_eq!(
        at_s(&v),
        [0.0, 2.0],
        "written at completion, replayed by arrival"
    );
    assert_eq!((v[0].tag, v[1].tag), (2, 1));
    // The logged hashes are prefix hashes: the shared leading blocks stay shared.
    assert_eq!(v[0].prefix_blocks[..2], v[1].prefix_blocks[..]);
    assert_eq!(r.skipped_rows(), 2);
    let zero = r.skipped_examples()[1].to_string();
    assert!(
        zero.contains(":4:") && zero.contains("zero length"),
        "{zero}"
    );
}

#[test]
fn otel_genai_reads_both_attribute_shapes_and_counts_other_spans() {
    let dir = scratch("otel");
    let p = write(
        &dir,
        "spans.jsonl",
        r#"{"name": "chat", "startTimeUnixNano": "1733050000000000000", "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "812"}}, {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "20"}}, {"key": "gen_ai.conversation.id", "value": {"stringValue": "c1"}}]}
{"name": "GET /health", "startTimeUnixNano": 1733050000500000000, "attributes": {"http.request.method": "GET"}}
{"name": "chat", "startTimeUnixNano": 1733050002000000000, "attributes": {"gen_ai.usage.input_tokens": 1300, "gen_ai.usage.output_tokens": 40, "gen_ai.conversation.id": "c1"}}
{"name": "chat", "startTimeUnixNano": 1733050003000000000, "attributes": {"gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 4}}
"#,
    );
    let fmt = TraceFormat::from_name("otel-genai").unwrap();
    let mut r = replay(&p, fmt.clone(), ReplayOptions::default());
    let v = drain(&mut r).unwrap();
    assert_eq!(at_s(&v), [0.0, 2.0, 3.0]);
    assert_eq!((v[0].prompt_tokens, v[0].output_tokens), (812, 20));
    assert_eq!((v[1].prompt_tokens, v[1].output_tokens), (1300, 40));
    assert_eq!(
        v[1].prefix_blocks[0], v[0].prefix_blocks[0],
        "same conversation"
    );
    assert!(v[2].prefix_blocks.is_empty(), "no conversation id");
    assert_eq!(r.ignored_rows(), 1);
    let s = TraceStats::of_trace(&p, fmt, ReplayOptions::default()).unwrap();
    assert_eq!((s.rows, s.ignored_rows), (3, 1));
    assert!(
        s.to_string()
            .contains("ignored rows  1 (spans without gen_ai.usage"),
        "{s}"
    );
}

#[test]
fn a_missing_csv_column_is_reported_at_the_header_with_the_columns_there() {
    let dir = scratch("csv-missing");
    let p = write(&dir, "log.csv", "time,in,out\n1,2,3\n");
    let e = all(
        &p,
        mapping(
            TraceLayout::Csv,
            ["time", "prompt", "out"],
            ArrivalUnit::OffsetS,
        ),
    )
    .unwrap_err();
    assert!(!e.is_row_error(), "a header error is never skipped");
    let m = e.to_string();
    assert!(
        m.starts_with(&format!("{}:1: bad header", p.display()))
            && m.contains("`prompt` (mapping `prompt_tokens`)")
            && m.contains("columns are: time, in, out"),
        "{m}"
    );
}

#[test]
fn a_missing_json_key_is_reported_on_the_first_row_lacking_it() {
    let dir = scratch("json-missing");
    let p = write(
        &dir,
        "log.jsonl",
        "{\"t\": 0, \"p\": 1, \"o\": 1}\n\n{\"t\": 1, \"prompt\": 1, \"o\": 1}\n",
    );
    let e = all(
        &p,
        mapping(TraceLayout::Jsonl, ["t", "p", "o"], ArrivalUnit::OffsetS),
    )
    .unwrap_err();
    assert_eq!(e.line(), Some(3));
    let m = e.to_string();
    assert!(
        m.contains("field `p`: is missing from this row; keys there: `o`, `prompt`, `t`"),
        "{m}"
    );
}

#[test]
fn bad_values_are_located_and_say_what_is_valid() {
    let dir = scratch("bad-values");
    let cases = [
        (
            r#"{"t": "01/03/2025 12:00", "p": 1, "o": 1}"#,
            "`t`",
            "ISO-8601",
        ),
        (
            r#"{"t": 5, "p": 1, "o": 1}"#,
            "`t`",
            "arrival_unit: offset_s",
        ),
        (
            r#"{"t": 1740830400, "p": -3, "o": 1}"#,
            "`p`",
            "is negative",
        ),
        (
            r#"{"t": 1740830400, "p": "NaN", "o": 1}"#,
            "`p`",
            "not a non-negative integer",
        ),
        (
            r#"{"t": 1740830400, "p": 1, "o": 2.5}"#,
            "`o`",
            "not an integer",
        ),
        (
            r#"{"t": 1740830400, "p": 1, "o": 1"#,
            "invalid JSON",
            "mapping `jsonl`",
        ),
        (r#"[1, 2]"#, "invalid JSON", "not an object"),
    ];
    for (i, (row, where_, what)) in cases.into_iter().enumerate() {
        let p = write(&dir, &format!("{i}.jsonl"), &format!("{row}\n"));
        let e = all(
            &p,
            mapping(TraceLayout::Jsonl, ["t", "p", "o"], ArrivalUnit::Auto),
        )
        .unwrap_err();
        let m = e.to_string();
        assert!(
            e.is_row_error()
                && m.starts_with(&format!("{}:1: ", p.display()))
                && m.contains(where_)
                && m.contains(what),
            "{row} :: {m}"
        );
    }
    let p = write(&dir, "nan.csv", "t,p,o\n1,nan,1\n2,-1,1\n");
    let fmt = mapping(TraceLayout::Csv, ["t", "p", "o"], ArrivalUnit::OffsetS);
    let mut r = replay(
        &p,
        fmt,
        ReplayOptions {
            on_bad_row: BadRowPolicy::Skip,
            ..ReplayOptions::default()
        },
    );
    // Every row bad and skipped: nothing to replay, which is refused (never an empty run).
    let e = drain(&mut r).unwrap_err().to_string();
    assert!(
        e.contains("no requests to replay: every one of its 2 data row(s) was bad and skipped"),
        "{e}"
    );
    let lines: Vec<_> = r.skipped_examples().iter().map(|e| e.line()).collect();
    assert_eq!(lines, [Some(2), Some(3)]);
}

#[test]
fn limit_and_skip_rows_count_file_rows_before_sorting() {
    let dir = scratch("limit");
    let p = write(
        &dir,
        "log.jsonl",
        "{\"t\": 3, \"p\": 3, \"o\": 1}\n{\"t\": 2, \"p\": 2, \"o\": 1}\n{\"t\": 1, \"p\": 1, \"o\": 1}\n",
    );
    let fmt = mapping(TraceLayout::Jsonl, ["t", "p", "o"], ArrivalUnit::OffsetS);
    let opts = ReplayOptions {
        skip_rows: 1,
        limit: Some(1),
        rate_scale: 2.0,
        start_offset: 7,
        ..ReplayOptions::default()
    };
    let v = drain(&mut replay(&p, fmt.clone(), opts)).unwrap();
    assert_eq!(v.iter().map(|a| a.prompt_tokens).collect::<Vec<_>>(), [2]);
    assert_eq!(v[0].at, 7);
    let opts = ReplayOptions {
        rate_scale: 2.0,
        ..ReplayOptions::default()
    };
    let v = drain(&mut replay(&p, fmt, opts)).unwrap();
    assert_eq!(v.iter().map(|a| a.at).collect::<Vec<_>>(), [0, S / 2, S]);
}

/// A scenario beside the bundled hardware profiles, with one trace source.
fn scenario(dir: &Path, trace: &str) -> Result<Scenario, routelab_policies::InputError> {
    let hardware = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/hardware");
    let p = write(
        dir,
        "scenario.yaml",
        &format!(
            "seed: 1\nmodel: m\nhardware_dir: {}\nfleet:\n  - {{ name: a, profile: rtx4090-27b }}\ntraffic:\n  - trace:\n{trace}policies: [seed-v1]\n",
            hardware.display()
        ),
    );
    Scenario::load(p)
}

#[test]
fn a_scenario_replays_a_mapped_log() {
    let dir = scratch("scenario");
    write(
        &dir,
        "requests.csv",
        "ts,conversation,input_tokens,output_tokens\n\
         2025-03-01T12:00:00Z,c1,600,50\n\
         2025-03-01T12:00:04Z,c1,1200,50\n",
    );
    let s = scenario(
        &dir,
        "      path: requests.csv\n      mapping:\n        arrival: ts\n        arrival_unit: iso8601\n        prompt_tokens: input_tokens\n        output_tokens: output_tokens\n        session_id: conversation\n      time_scale: 0.5\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let TrafficSpec::Trace { format, .. } = &s.traffic[0] else {
        panic!("a trace source")
    };
    assert_eq!(format.name(), "csv", "the layout follows the extension");
    let v = drain(&mut *s.traffic_source(1).unwrap()).unwrap();
    // Without `start_offset_s` the trace starts after the fleet's warm-up.
    let w = s.warmup_ns().unwrap() as f64 / S as f64;
    assert!(w > 0.0);
    assert_eq!(at_s(&v), [w, w + 2.0]);
    assert_eq!(v[1].prefix_blocks[0], v[0].prefix_blocks[0]);
    let s = scenario(
        &dir,
        "      path: requests.csv\n      format: gateway-log\n",
    )
    .unwrap();
    assert!(
        matches!(&s.traffic[0], TrafficSpec::Trace { format, .. } if format.name() == "gateway-log")
    );
}

#[test]
fn scenario_mapping_errors_are_located_with_what_is_valid() {
    let dir = scratch("scenario-errors");
    write(&dir, "log.jsonl", "{}\n");
    let cases = [
        (
            "      path: log.jsonl\n      mapping: { arrival: t, prompt_tokens: p, output_tokens: o, model: m }\n",
            "unknown field `model`",
            "prompt_tokens",
        ),
        (
            "      path: log.jsonl\n      mapping: { arrival: t, arrival_unit: minutes, prompt_tokens: p, output_tokens: o }\n",
            "traffic[0].trace.mapping.arrival_unit",
            "epoch_ms",
        ),
        (
            "      path: log.jsonl\n      mapping: { arrival: t, prompt_tokens: p }\n",
            "traffic[0].trace.mapping.output_tokens",
            "is missing",
        ),
        (
            "      path: log.jsonl\n      mapping: { arrival: t, prompt_tokens: p, output_tokens: o, session_id: s, prefix_hashes: h }\n",
            "traffic[0].trace.mapping",
            "give one",
        ),
        (
            "      path: log.jsonl\n      mapping: { arrival: \"a.\", prompt_tokens: p, output_tokens: o }\n",
            "traffic[0].trace.mapping.arrival",
            "empty key",
        ),
        (
            "      path: log.jsonl\n      format: jsonl\n",
            "traffic[0].trace.mapping",
            "is missing",
        ),
        (
            "      path: log.jsonl\n      format: gateway-log\n      mapping: { arrival: t, prompt_tokens: p, output_tokens: o }\n",
            "traffic[0].trace.mapping",
            "format: jsonl",
        ),
        (
            "      path: log.jsonl\n      format: parquet\n",
            "traffic[0].trace.format",
            "otel-genai",
        ),
    ];
    for (trace, field, what) in cases {
        let e = scenario(&dir, trace).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(field) && m.contains(what) && e.line.is_some(),
            "{trace} :: {m}"
        );
    }
}

/// The gateway hashes a token-id prompt's text (`"id,id,…"`, several bytes per id) while its
/// `prompt_tokens` counts the ids, so its own log can carry more hashes than 512-token blocks:
/// `gateway-log` keeps the first `ceil(prompt/512)` instead of refusing the row; a custom
/// mapping still refuses them.
#[test]
fn gateway_log_cuts_the_hashes_of_a_token_id_prompt_to_its_blocks() {
    let dir = scratch("gateway-token-ids");
    let row = r#"{"arrival_unix_ms": 1733050000000, "model": "m", "prompt_tokens": 1024, "output_tokens": 5, "prefix_hashes": [11, 12, 13], "worker": "w", "status": "ok", "ttft_ms": 1.0, "e2e_ms": 2.0}"#;
    let p = write(&dir, "gw.jsonl", &format!("{row}\n"));
    let v = all(&p, TraceFormat::from_name("gateway-log").unwrap()).unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].prefix_blocks.len(), 2, "ceil(1024/512) blocks");
}
