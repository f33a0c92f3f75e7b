//! Issue 41, the user's list: what `validate` and the commands said nothing about.

use super::common::{routelab, scratch, text};

const FLEET: &str = "model: gemma-27b\nfleet: [{ name: w, profile: rtx4090x2-27b, count: 2 }]\n";

/// `validate` said ok on an empty trace (and the run then failed).
#[test]
fn validate_refuses_an_empty_trace() {
    let dir = scratch("user-list-empty");
    std::fs::write(
        dir.join("empty.csv"),
        "arrival_s,prompt_tokens,output_tokens\n",
    )
    .unwrap();
    let sc = dir.join("s.yaml");
    std::fs::write(
        &sc,
        format!(
            "{FLEET}traffic:\n  - trace: {{ path: empty.csv, format: csv, mapping: {{ arrival: arrival_s, arrival_unit: offset_s, prompt_tokens: prompt_tokens, output_tokens: output_tokens }} }}\n"
        ),
    )
    .unwrap();
    let o = routelab(&["validate", sc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("traffic[0]") && text(&o).contains("empty.csv"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("ok "), "{}", text(&o));
}

/// `validate` missed a mapping column absent from the CSV header, and the run then blamed a
/// policy for it.
#[test]
fn validate_refuses_a_mapping_column_the_header_lacks_and_the_run_blames_the_traffic() {
    let dir = scratch("user-list-column");
    std::fs::write(
        dir.join("log.csv"),
        "arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1.5,200,20\n",
    )
    .unwrap();
    let sc = dir.join("s.yaml");
    std::fs::write(
        &sc,
        format!(
            "{FLEET}traffic:\n  - trace: {{ path: log.csv, format: csv, mapping: {{ arrival: arrival_s, arrival_unit: offset_s, prompt_tokens: input_tokens, output_tokens: output_tokens }} }}\npolicies: [seed-v3]\n"
        ),
    )
    .unwrap();
    let o = routelab(&["validate", sc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("input_tokens"), "{}", text(&o));
    let out = dir.join("out");
    let o = routelab(&["run", sc.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("traffic") && !text(&o).contains("policy seed-v3"),
        "{}",
        text(&o)
    );
}

/// An explicit `start_offset_s` inside the fleet's warm-up, and an implausible `slo`, are
/// warned about (and still accepted).
#[test]
fn validate_warns_about_a_start_inside_the_warm_up_and_an_implausible_slo() {
    let dir = scratch("user-list-warn");
    std::fs::write(
        dir.join("log.csv"),
        "arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n1.5,200,20\n",
    )
    .unwrap();
    let sc = dir.join("s.yaml");
    std::fs::write(
        &sc,
        format!(
            "{FLEET}traffic:\n  - trace: {{ path: log.csv, format: csv, start_offset_s: 1, mapping: {{ arrival: arrival_s, arrival_unit: offset_s, prompt_tokens: prompt_tokens, output_tokens: output_tokens }} }}\nslo: {{ ttft_s: 2000, tpot_s: 0.1 }}\n"
        ),
    )
    .unwrap();
    let o = routelab(&["validate", sc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("ok "), "{t}");
    assert!(
        t.contains("warning: ") && t.contains("start_offset_s 1 is inside the fleet's warm-up"),
        "{t}"
    );
    assert!(
        t.contains("slo.ttft_s: a time to first token bound of 2000 s"),
        "{t}"
    );
}

/// Issue 41: requests longer than every worker's context window are rejected, and
/// `report.html` says so by reason (it said nothing).
#[test]
fn report_html_names_context_window_rejections() {
    let dir = scratch("user-list-window");
    let sc = dir.join("long.yaml");
    std::fs::write(
        &sc,
        format!(
            "{FLEET}traffic:\n  - poisson: {{ start_s: 20, rate_per_s: 1, count: 20, prompt: {{ uniform: {{ min: 1000, max: 60000 }} }}, output: {{ fixed: 16 }} }}\npolicies: [least-load]\ntimeline_s: 0\n"
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let o = routelab(&["run", sc.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("least-load: ")
            && html.contains("because prompt + output exceed every worker&#39;s context window"),
        "report.html names no context-window rejection"
    );
}
