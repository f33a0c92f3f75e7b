//! The traps between a user's own data and the answer (issue 29), each with the answer a
//! careful tool gives: empty traces refused, the OpenTelemetry Collector's nested export read,
//! implausible declared units warned about (stated thresholds), session ids that only group
//! requests, and a log with its own columns told how to map them.

use std::path::{Path, PathBuf};

use routelab_sim::Scenario;
use routelab_sim::traffic::{
    Arrival, ArrivalUnit, FieldPath, ReplayOptions, SessionPrefix, TraceFormat, TraceLayout,
    TraceMapping, TraceReplay, TraceStats, TrafficError, TrafficSource,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routelab-traps-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn drain(src: &mut dyn TrafficSource) -> Result<Vec<Arrival>, TrafficError> {
    let mut v = Vec::new();
    while let Some(a) = src.next_arrival()? {
        v.push(a);
    }
    Ok(v)
}

fn replay_with(path: &Path, format: TraceFormat, options: ReplayOptions) -> TraceReplay {
    TraceReplay::open(path, format, options).unwrap()
}

fn replay(path: &Path, format: TraceFormat) -> TraceReplay {
    replay_with(path, format, ReplayOptions::default())
}

fn jsonl(arrival: &str, unit: ArrivalUnit, session: Option<&str>) -> TraceMapping {
    let f = |s: &str| FieldPath::parse(s).unwrap();
    TraceMapping::custom(
        TraceLayout::Jsonl,
        f(arrival),
        unit,
        f("in"),
        f("out"),
        session.map(f),
        None,
    )
    .unwrap()
}

fn mapped(m: TraceMapping) -> TraceFormat {
    TraceFormat::Mapped(Box::new(m))
}

#[test]
fn trap3_an_empty_trace_is_refused_saying_what_the_file_held() {
    let dir = scratch("empty");
    let header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    let cases: Vec<(PathBuf, TraceFormat, ReplayOptions, &str)> = vec![
        (
            write(&dir, "zero.csv", ""),
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
            "the file is empty (0 bytes)",
        ),
        (
            write(&dir, "header.csv", header),
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
            "hold no data row",
        ),
        (
            write(&dir, "zero.jsonl", ""),
            TraceFormat::MooncakeJsonl,
            ReplayOptions::default(),
            "the file is empty (0 bytes)",
        ),
        (
            write(&dir, "blank.jsonl", "\n  \n"),
            mapped(jsonl("t", ArrivalUnit::OffsetS, None)),
            ReplayOptions::default(),
            "its 2 line(s) hold no data row",
        ),
        (
            write(
                &dir,
                "two.csv",
                &format!("{header}2023-11-16 18:17:03,5,1\n2023-11-16 18:17:04,5,1\n"),
            ),
            TraceFormat::AzureCsv,
            ReplayOptions {
                skip_rows: 5,
                ..ReplayOptions::default()
            },
            "`skip_rows: 5` leaves out all 2 of its data rows",
        ),
        (
            write(
                &dir,
                "spans.jsonl",
                "{\"name\": \"http GET\", \"startTimeUnixNano\": \"1740830400000000000\", \"attributes\": {}}\n",
            ),
            TraceFormat::from_name("otel-genai").unwrap(),
            ReplayOptions::default(),
            "its 1 row(s) are not requests (spans without gen_ai.usage",
        ),
    ];
    for (path, format, options, says) in cases {
        let e = drain(&mut replay_with(&path, format, options)).unwrap_err();
        assert!(matches!(e, TrafficError::Empty { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.starts_with(&format!("{}: no requests to replay: ", path.display()))
                && m.contains(says)
                && m.contains("a trace source needs at least one valid row"),
            "{says} :: {m}"
        );
    }
    // `limit: 0` is refused up front.
    let e = TraceReplay::open(
        dir.join("header.csv"),
        TraceFormat::AzureCsv,
        ReplayOptions {
            limit: Some(0),
            ..ReplayOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`limit` is 0; expected at least 1 row"), "{e}");
    // Through a scenario: the run's traffic fails with the same error.
    let yaml = "fleet: [{ name: w, profile: rtx-pro-6000-27b }]\n\
                traffic: [{ trace: { path: header.csv, format: azure } }]\n";
    let sc = Scenario::from_yaml(yaml, &dir.join("s.yaml")).unwrap();
    let e = drain(&mut *sc.traffic_source(1).unwrap()).unwrap_err();
    assert!(matches!(e, TrafficError::Empty { .. }), "{e}");
}

/// One line as the OpenTelemetry Collector's file exporter writes it: two resources, a scope
/// each, three spans (two inference spans with OTLP attribute lists, one HTTP span).
const COLLECTOR_LINE: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"chat"}}]},"scopeSpans":[{"scope":{"name":"genai"},"spans":[{"traceId":"a1","spanId":"01","name":"chat gemma","startTimeUnixNano":"1740830400000000000","endTimeUnixNano":"1740830401000000000","attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":"812"}},{"key":"gen_ai.usage.output_tokens","value":{"intValue":"203"}},{"key":"gen_ai.conversation.id","value":{"stringValue":"c1"}}]},{"traceId":"a1","spanId":"02","name":"GET /health","startTimeUnixNano":"1740830400500000000","attributes":[]}]}]},{"resource":{"attributes":[]},"scopeSpans":[{"scope":{"name":"genai"},"spans":[{"traceId":"b2","spanId":"03","name":"chat gemma","startTimeUnixNano":"1740830402000000000","attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":"1300"}},{"key":"gen_ai.usage.output_tokens","value":{"intValue":"90"}},{"key":"gen_ai.conversation.id","value":{"stringValue":"c1"}}]}]}]}]}"#;

#[test]
fn trap4_the_collectors_nested_export_is_read_span_by_span() {
    let dir = scratch("otlp");
    let p = write(&dir, "export.jsonl", &format!("{COLLECTOR_LINE}\n"));
    let format = TraceFormat::from_name("otel-genai").unwrap();
    let mut r = replay(&p, format.clone());
    let v = drain(&mut r).unwrap();
    assert_eq!(v.len(), 2, "two inference spans in one line");
    assert_eq!(
        r.ignored_rows(),
        1,
        "the HTTP span is counted as not a request"
    );
    assert_eq!(
        (v[0].prompt_tokens, v[0].output_tokens, v[0].at),
        (812, 203, 0)
    );
    assert_eq!((v[1].prompt_tokens, v[1].at), (1300, 2_000_000_000));
    // The same conversation: the second request shares the first one's full block.
    assert_eq!(v[0].prefix_blocks[0], v[1].prefix_blocks[0]);
    let stats = TraceStats::of_trace(&p, format.clone(), ReplayOptions::default()).unwrap();
    assert_eq!((stats.rows, stats.ignored_rows), (2, 1));
    // A bad span is located at its place in the line.
    let bad = COLLECTOR_LINE.replacen("\"812\"", "\"-3\"", 1);
    let p = write(&dir, "bad.jsonl", &format!("{bad}\n"));
    let e = drain(&mut replay(&p, format)).unwrap_err().to_string();
    assert!(
        e.contains(":1: field `resourceSpans[0].scopeSpans[0].spans[0].attributes.\"gen_ai.usage.input_tokens\"`")
            && e.contains("negative"),
        "{e}"
    );
}

#[test]
fn trap6_a_declared_unit_that_makes_the_data_implausible_is_warned_about() {
    let dir = scratch("units");
    // One request a second for an hour, written in milliseconds from the start.
    let ms: String = (0..3600)
        .map(|i| format!("{{\"t\": {}, \"in\": 100, \"out\": 10}}\n", i * 1000))
        .collect();
    let p = write(&dir, "ms.jsonl", &ms);
    let warn = |unit: ArrivalUnit| {
        let mut r = replay(&p, mapped(jsonl("t", unit, None)));
        drain(&mut r).unwrap();
        r.warnings()
    };
    // Declared seconds: 3,600 requests over 41.7 days at 0.001 req/s.
    let w = warn(ArrivalUnit::OffsetS);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("read as `arrival_unit: offset_s`")
            && w[0].contains("41.7 days")
            && w[0].contains("set `arrival_unit: offset_ms`")
            && w[0].contains("over 1 day at under 1 request per minute"),
        "{}",
        w[0]
    );
    assert!(warn(ArrivalUnit::OffsetMs).is_empty(), "the right unit");
    // Seconds declared as milliseconds: 3,600 requests in 3.6 s.
    let s: String = (0..3600)
        .map(|i| format!("{{\"t\": {i}, \"in\": 100, \"out\": 10}}\n"))
        .collect();
    let p2 = write(&dir, "s.jsonl", &s);
    let mut r = replay(&p2, mapped(jsonl("t", ArrivalUnit::OffsetMs, None)));
    drain(&mut r).unwrap();
    let w = r.warnings();
    assert!(
        w.len() == 1
            && w[0].contains("set `arrival_unit: offset_s`")
            && w[0].contains("over 1,000 req/s"),
        "{w:?}"
    );
    // Epoch seconds declared as milliseconds read as January 1970.
    let epoch = "{\"t\": 1740830400, \"in\": 100, \"out\": 10}\n{\"t\": 1740830401, \"in\": 100, \"out\": 10}\n";
    let p3 = write(&dir, "epoch.jsonl", epoch);
    let mut r = replay(&p3, mapped(jsonl("t", ArrivalUnit::EpochMs, None)));
    drain(&mut r).unwrap();
    assert!(
        r.warnings()
            .iter()
            .any(|w| w.contains("before 1990") && w.contains("`arrival_unit: epoch_s`")),
        "{:?}",
        r.warnings()
    );
    // The warning reaches a run's warnings.
    let yaml = "fleet: [{ name: w, profile: rtx-pro-6000-27b }]\n\
                traffic: [{ trace: { path: ms.jsonl, format: jsonl, mapping: { arrival: t, \
                arrival_unit: offset_s, prompt_tokens: in, output_tokens: out } } }]\n";
    let sc = Scenario::from_yaml(yaml, &dir.join("s.yaml")).unwrap();
    let mut t = sc.traffic_source(1).unwrap();
    drain(&mut *t).unwrap();
    assert_eq!(t.warnings().len(), 1);
}

#[test]
fn trap8_a_session_id_may_only_group_requests() {
    let dir = scratch("sessions");
    // Spans of one user whose prompts do not grow (each request stands alone).
    let text: String = (0..30)
        .map(|i| {
            format!(
                "{{\"t\": {i}, \"in\": {}, \"out\": 10, \"user\": \"u{}\"}}\n",
                2000 - 50 * (i % 7),
                i % 3
            )
        })
        .collect();
    let p = write(&dir, "users.jsonl", &text);
    let growing = jsonl("t", ArrivalUnit::OffsetS, Some("user"));
    assert_eq!(growing.session_prefix(), SessionPrefix::Growing);
    let mut r = replay(&p, mapped(growing.clone()));
    let v = drain(&mut r).unwrap();
    assert!(v.iter().all(|a| !a.prefix_blocks.is_empty()));
    let w = r.warnings();
    assert!(
        w.len() == 1
            && w[0].contains("do not resend the session's history")
            && w[0].contains("set `session_prefix: none`"),
        "{w:?}"
    );
    let none = growing.with_session_prefix(SessionPrefix::None).unwrap();
    let mut r = replay(&p, mapped(none.clone()));
    let v = drain(&mut r).unwrap();
    assert!(
        v.iter().all(|a| a.prefix_blocks.is_empty()),
        "no invented prefix"
    );
    assert!(r.warnings().is_empty());
    let stats = TraceStats::of_trace(&p, mapped(none), ReplayOptions::default()).unwrap();
    assert_eq!(stats.prefix, None, "no prefix reuse reported");
    // In a scenario: the mapping key, and with the ready-made otel-genai alone.
    let scenario = |trace: &str| {
        let yaml = format!(
            "fleet: [{{ name: w, profile: rtx-pro-6000-27b }}]\ntraffic: [{{ trace: {trace} }}]\n"
        );
        Scenario::from_yaml(&yaml, &dir.join("s.yaml"))
    };
    let sc = scenario(
        "{ path: users.jsonl, format: jsonl, mapping: { arrival: t, arrival_unit: offset_s, \
         prompt_tokens: in, output_tokens: out, session_id: user, session_prefix: none } }",
    )
    .unwrap();
    let v = drain(&mut *sc.traffic_source(1).unwrap()).unwrap();
    assert!(v.iter().all(|a| a.prefix_blocks.is_empty()));
    write(&dir, "spans.jsonl", &format!("{COLLECTOR_LINE}\n"));
    let sc =
        scenario("{ path: spans.jsonl, format: otel-genai, mapping: { session_prefix: none } }")
            .unwrap();
    let v = drain(&mut *sc.traffic_source(1).unwrap()).unwrap();
    assert!(v.len() == 2 && v.iter().all(|a| a.prefix_blocks.is_empty()));
    for (trace, field, says) in [
        (
            "{ path: users.jsonl, format: jsonl, mapping: { arrival: t, arrival_unit: offset_s, \
             prompt_tokens: in, output_tokens: out, session_prefix: none } }",
            "traffic[0].trace.mapping.session_prefix",
            "applies to a mapping with a `session_id`",
        ),
        (
            "{ path: users.jsonl, format: jsonl, mapping: { arrival: t, arrival_unit: offset_s, \
             prompt_tokens: in, output_tokens: out, session_id: user, session_prefix: shared } }",
            "traffic[0].trace.mapping.session_prefix",
            "unknown session prefix `shared`",
        ),
    ] {
        let e = scenario(trace).unwrap_err();
        assert_eq!(e.field, field);
        assert!(e.to_string().contains(says), "{e}");
    }
}

#[test]
fn trap9_a_csv_with_its_own_columns_is_told_how_to_map_them() {
    let dir = scratch("own-columns");
    let p = write(
        &dir,
        "requests.csv",
        "ts,input_tokens,output_tokens,user\n1740830400,812,203,u1\n",
    );
    let e = drain(&mut replay(&p, TraceFormat::AzureCsv))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing column(s) `TIMESTAMP`")
            && e.contains("(ts, input_tokens, output_tokens, user)")
            && e.contains("format: csv, mapping: { arrival:")
            && e.contains("routelab trace stats <scenario>.yaml"),
        "{e}"
    );
    let p = write(
        &dir,
        "requests.jsonl",
        "{\"ts\": 1740830400, \"n_in\": 5, \"n_out\": 2}\n",
    );
    let e = drain(&mut replay(&p, TraceFormat::MooncakeJsonl))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("this is not a Mooncake row")
            && e.contains("(n_in, n_out, ts)")
            && e.contains("format: jsonl"),
        "{e}"
    );
}

#[test]
fn trap7_rejected_requests_are_counted_by_reason_and_said() {
    // Prompts longer than every worker's context window: all rejected, and the run says why.
    let yaml = "fleet:\n  - { name: a, profile: rtx4090-27b, context_window: 2048 }\n  \
                - { name: b, profile: rtx4090-27b, context_window: 4096 }\n\
                traffic:\n  - poisson: { rate_per_s: 1, count: 6, prompt: { uniform: { min: 100, max: 9000 } }, output: { fixed: 10 } }\n";
    let sc = Scenario::from_yaml(yaml, Path::new("/tmp/trap7.yaml")).unwrap();
    let mut t = sc.traffic_source(3).unwrap();
    let m = routelab_sim::run(
        &sc.setup,
        &routelab_policies::PolicyConfig::preset("seed-v1").unwrap(),
        &mut *t,
        None,
    )
    .unwrap();
    assert!(
        m.rejected > 0 && m.completed > 0,
        "{} {}",
        m.rejected,
        m.completed
    );
    assert_eq!(m.rejections.context_window, m.rejected);
    assert_eq!(m.rejections.largest_window, 4096);
    assert!(m.rejections.longest_request > 4096);
    let lines = m.warning_lines();
    let line = lines
        .iter()
        .find(|l| l.contains("rejected"))
        .expect("a line says why requests were rejected");
    assert!(
        line.starts_with(&format!("{} request(s) rejected: {} because prompt + output exceed every worker's context window (the largest is 4096 tokens", m.rejected, m.rejected)),
        "{line}"
    );
}
