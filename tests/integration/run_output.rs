//! `routelab run`'s per-request output: `requests.csv`, written while the simulations run.

use super::common::{routelab, scratch, text};

/// Every policy's rows, in one block per policy in the scenario's order, one row per request
/// that ended (as many as `summary.json` counts); `--no-requests` writes no file.
#[test]
fn requests_csv_holds_each_policy_in_order_and_no_requests_writes_none() {
    let dir = scratch("run-requests");
    let out = dir.join("with");
    let o = routelab(&[
        "run",
        "scenarios/seed/burst-probe.yaml",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let runs = summary["runs"].as_array().unwrap();
    assert!(runs.len() >= 2, "a multi-policy scenario");
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("policy,id,arrival_s,worker,status,")
    );
    // Runs of equal policy cells, in file order.
    let mut blocks: Vec<(String, u64)> = Vec::new();
    for line in lines {
        let policy = line.split(',').next().unwrap();
        match blocks.last_mut() {
            Some((p, n)) if p == policy => *n += 1,
            _ => blocks.push((policy.to_string(), 1)),
        }
    }
    let expected: Vec<(String, u64)> = runs
        .iter()
        .map(|r| {
            let ended = ["completed", "failed", "rejected"]
                .iter()
                .map(|k| r[k].as_u64().unwrap())
                .sum();
            (r["policy"].as_str().unwrap().to_string(), ended)
        })
        .collect();
    assert_eq!(blocks, expected);

    let out = dir.join("without");
    let o = routelab(&[
        "run",
        "scenarios/seed/burst-probe.yaml",
        "--no-requests",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.join("summary.json").exists());
    assert!(!out.join("requests.csv").exists());
}

/// A trace replayed with `on_bad_row: skip`: the run says how many rows it skipped and the
/// first one's error, on the console and in `summary.json`, never silently.
#[test]
fn skipped_trace_rows_are_reported_by_run() {
    let dir = scratch("run-skipped-rows");
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 20, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 1000, \"input_length\": -5, \"output_length\": 20, \"hash_ids\": [1]}\n\
         {\"timestamp\": 2000, \"input_length\": 300, \"output_length\": 10, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let hardware = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hardware");
    std::fs::write(
        dir.join("s.yaml"),
        format!(
            "seed: 1\nmodel: m\nhardware_dir: {}\nfleet:\n  - {{ name: w, profile: rtx-pro-6000-27b }}\n\
             traffic:\n  - trace: {{ path: t.jsonl, on_bad_row: skip }}\npolicies: [seed-v1]\n",
            hardware.display()
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let o = routelab(&[
        "run",
        dir.join("s.yaml").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("skipped 1 bad trace row(s)") && said.contains("t.jsonl:2"),
        "{said}"
    );
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    assert!(summary.contains("skipped 1 bad trace row(s)"), "{summary}");
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "two requests replayed: {csv}");
}
