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
    assert!(lines.next().unwrap().starts_with("policy,id,arrival_s,worker,status,"));
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
