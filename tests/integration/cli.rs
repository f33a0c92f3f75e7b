//! The command line: exit codes, messages, determinism of the gate, snapshots of the output.

use super::common::{routelab, scratch, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn policies_lists_every_part_and_preset() {
    let o = routelab(&["policies"]);
    assert!(o.status.success());
    insta::assert_snapshot!(String::from_utf8_lossy(&o.stdout));
}

#[test]
fn validate_gives_four_distinct_located_messages_and_exit_2() {
    let dir = scratch("cli-validate");
    let good = std::fs::read_to_string(repo("scenarios/seed/sixteen-at-once.yaml")).unwrap();
    let good = good.replace("name: seed/sixteen-at-once", "name: t\nhardware_dir: HW");
    let good = good.replace("HW", &repo("scenarios/hardware"));
    let cases = [
        ("typo.yaml", good.replace("seed: 1", "sede: 1")),
        ("type.yaml", good.replace("size: 16", "size: sixteen")),
        (
            "profile.yaml",
            good.replace("rtx-pro-6000-27b", "rtx-pro-9000-27b"),
        ),
        (
            "value.yaml",
            good.replace(
                "profile: rtx4090x2-27b }",
                "profile: rtx4090x2-27b, rtt_ms: -5 }",
            ),
        ),
    ];
    let mut files = Vec::new();
    for (name, body) in &cases {
        let f = dir.join(name);
        std::fs::write(&f, body).unwrap();
        files.push(f.display().to_string());
    }
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let o = routelab(&args);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    let errors: Vec<&str> = t.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 4, "{t}");
    // Each names its file with a line and column, and what is wrong.
    assert!(errors[0].contains("typo.yaml:") && errors[0].contains("unknown field `sede`"));
    assert!(errors[1].contains("type.yaml:") && errors[1].contains("traffic[0].burst.size"));
    assert!(
        errors[2].contains("profile.yaml:")
            && errors[2].contains("fleet[1].profile")
            && errors[2].contains("rtx-pro-6000-27b"),
        "lists the available profiles: {}",
        errors[2]
    );
    assert!(errors[3].contains("value.yaml:") && errors[3].contains("fleet[0].rtt_ms"));
    for e in &errors {
        let loc = e.trim_start_matches("error: ").split(": ").next().unwrap();
        let mut parts = loc.rsplit(':');
        let (col, line) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(
            col.parse::<u32>().is_ok() && line.parse::<u32>().is_ok(),
            "line and column in {e}"
        );
    }
}

#[test]
fn trace_stats_matches_the_published_figures() {
    let o = routelab(&[
        "trace",
        "stats",
        &repo("data/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("rows          8819"), "{t}");
    assert!(t.contains("2.567 req/s"), "{t}");
}

fn small_suite(dir: &Path) {
    std::fs::write(
        dir.join("suite.yaml"),
        format!(
            "seeds: [1, 2]\nscenarios: [{}]\ninvariants:\n  - {{ scenario: seed/sixteen-at-once, policy: seed-v3, metric: e2e_max_s, op: \"<\", than: seed-v1 }}\n",
            repo("scenarios/seed/sixteen-at-once.yaml")
        ),
    )
    .unwrap();
}

/// A small suite in `dir`, its baselines directory, and `check` with extra arguments on it.
fn small_gate(dir: &Path) -> (PathBuf, impl Fn(&[&str]) -> Output) {
    small_suite(dir);
    let base = dir.join("baselines");
    let (suite, baselines) = (dir.display().to_string(), base.display().to_string());
    let check = move |extra: &[&str]| {
        let mut args = vec!["check", "--suite", &suite, "--baselines", &baselines];
        args.extend_from_slice(extra);
        routelab(&args)
    };
    (base, check)
}

#[test]
fn the_gate_is_deterministic_bites_on_regressions_and_rejects_bad_baselines() {
    let dir = scratch("cli-check");
    let (base, check) = small_gate(&dir);
    let o = check(&["--update"]);
    assert!(o.status.success(), "{}", text(&o));
    let file = base.join("seed__sixteen-at-once.json");
    assert!(file.exists());

    // Unchanged tree: exit 0, identical output twice.
    let (a, b) = (check(&[]), check(&[]));
    assert!(a.status.success(), "{}", text(&a));
    assert_eq!(a.stdout, b.stdout);
    assert!(text(&a).contains("0 regression(s)"));

    // A baseline better than reality: the gate bites and names scenario, policy and metric.
    let original = std::fs::read_to_string(&file).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&original).unwrap();
    let stat = &mut json["policies"]["seed-v3"]["e2e_mean_s"];
    let mean = stat["mean"].as_f64().unwrap();
    stat["mean"] = serde_json::json!(mean * 0.5);
    std::fs::write(&file, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(
        t.contains("REGRESSION: scenario seed/sixteen-at-once policy seed-v3 metric e2e_mean_s"),
        "{t}"
    );
    // Markdown and JSON formats carry the same verdict.
    let md = check(&["--format", "markdown"]);
    assert!(text(&md).contains("| seed/sixteen-at-once | seed-v3 | e2e_mean_s |"));
    let js = check(&["--format", "json"]);
    assert!(text(&js).contains("\"status\": \"REGRESSION\""));
    let csv = check(&["--format", "csv"]);
    assert!(
        String::from_utf8_lossy(&csv.stdout).contains("seed/sixteen-at-once,seed-v3,e2e_mean_s,"),
        "{}",
        text(&csv)
    );

    // A malformed baseline: exit 2 with the file and the place.
    std::fs::write(&file, "{ \"scenario\": \"seed/sixteen-at-once\", \"seeds\": [1, 2],\n  \"policies\": { \"seed-v1\": 7 } }").unwrap();
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("seed__sixteen-at-once.json:2:") && t.contains(": policies.seed-v1: "),
        "file, line, column and field: {t}"
    );

    // A baseline naming an unknown policy, and one for a scenario not in the suite.
    let bad_policy = original.replace("\"seed-v1\"", "\"seed-v9\"");
    std::fs::write(&file, bad_policy).unwrap();
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("policies.seed-v9: unknown policy"),
        "{}",
        text(&o)
    );
    std::fs::write(&file, &original).unwrap();
    std::fs::write(base.join("seed__nowhere.json"), &original).unwrap();
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("seed__nowhere.json: names a scenario that is not in the suite"));
}

fn run_with_threads(threads: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(args)
        .env("RAYON_NUM_THREADS", threads)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs")
}

/// Every file but perf.json, as (name, bytes), sorted by name.
fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "perf.json")
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn outputs_are_byte_identical_on_one_and_two_threads() {
    let dir = scratch("cli-threads");
    let scenario = repo("scenarios/seed/burst-probe.yaml");
    for (cmd, extra) in [("run", vec![]), ("compare", vec!["--seeds", "2"])] {
        let mut got = Vec::new();
        for threads in ["1", "2"] {
            let out = dir.join(format!("{cmd}-{threads}"));
            let out_s = out.display().to_string();
            let mut args = vec![cmd, scenario.as_str(), "--out", out_s.as_str()];
            args.extend(extra.iter().copied());
            let o = run_with_threads(threads, &args);
            assert!(o.status.success(), "{}", text(&o));
            assert!(out.join("perf.json").exists());
            got.push(outputs(&out));
        }
        assert!(
            got[0].len() >= 5,
            "{cmd}: {:?}",
            got[0].iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        assert_eq!(
            got[0].iter().map(|f| &f.0).collect::<Vec<_>>(),
            got[1].iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        for (a, b) in got[0].iter().zip(&got[1]) {
            assert!(a.1 == b.1, "{cmd}: {} differs between 1 and 2 threads", a.0);
        }
    }
    // The run wrote the whole report.
    let names: Vec<String> = outputs(&dir.join("run-1"))
        .into_iter()
        .map(|f| f.0)
        .collect();
    for f in [
        "summary.json",
        "requests.csv",
        "timeline.csv",
        "report.html",
        "e2e_cdf.png",
        "ttft_cdf.svg",
        "share.png",
        "weights.svg",
        "in_flight.png",
    ] {
        assert!(names.iter().any(|n| n == f), "{f} missing from {names:?}");
    }
}

#[test]
fn sweep_runs_a_grid_and_rejects_bad_paths() {
    let dir = scratch("cli-sweep");
    let out = dir.join("s").display().to_string();
    let scenario = repo("scenarios/seed/identical-4090s.yaml");
    let o = routelab(&[
        "sweep",
        &scenario,
        "--set",
        "traffic[0].poisson.rate_per_s=0.4,0.8",
        "--set",
        "fleet[1].speed_factor=0.5,1.0",
        "--policy",
        "seed-v1",
        "--out",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("s/sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    assert!(dir.join("s/sweep.png").exists());
    let o = routelab(&[
        "sweep",
        &scenario,
        "--set",
        "traffic[7].poisson.rate_per_s=1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("out of range"), "{}", text(&o));
    let o = routelab(&["run", &scenario, "--policy", "seed-v9"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("unknown preset `seed-v9`"),
        "{}",
        text(&o)
    );
}

#[test]
fn check_json_prints_only_json_on_stdout() {
    let dir = scratch("cli-check-json");
    let (_, check) = small_gate(&dir);
    // No baselines yet: every comparison is new, the gate fails, stdout still parses.
    for (extra, code) in [
        (&["--format", "json"][..], 1),
        (&["--format", "json", "--update"][..], 0),
        (&["--format", "json"][..], 0),
    ] {
        let o = check(extra);
        assert_eq!(o.status.code(), Some(code), "{extra:?}: {}", text(&o));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "{extra:?}: stdout is not one JSON document: {e}\n{}",
                text(&o)
            )
        });
        let rows = doc["comparisons"].as_array().unwrap();
        assert!(rows.len() > 20, "{extra:?}");
        assert_eq!(doc["invariants"].as_array().unwrap().len(), 1);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("comparison(s)"),
            "the verdict goes to stderr: {}",
            text(&o)
        );
    }
}

#[test]
fn a_scenario_that_completes_nothing_fails_the_gate_on_missing_latency() {
    let dir = scratch("cli-check-nothing");
    let good = std::fs::read_to_string(repo("scenarios/seed/sixteen-at-once.yaml")).unwrap();
    let good = good.replace(
        "name: seed/sixteen-at-once",
        &format!(
            "name: t/nothing\nhardware_dir: {}",
            repo("scenarios/hardware")
        ),
    );
    let scenario = dir.join("nothing.yaml");
    std::fs::write(&scenario, &good).unwrap();
    std::fs::write(
        dir.join("suite.yaml"),
        "seeds: [1]\nscenarios: [nothing.yaml]\n",
    )
    .unwrap();
    let base = dir.join("baselines");
    let (suite, baselines) = (dir.display().to_string(), base.display().to_string());
    let check = || routelab(&["check", "--suite", &suite, "--baselines", &baselines]);
    let o = routelab(&[
        "check",
        "--suite",
        &suite,
        "--baselines",
        &baselines,
        "--update",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(check().status.success());

    // Prompts longer than any context window: every request is rejected, nothing completes,
    // so there is no latency at all — which is not 0 s.
    std::fs::write(&scenario, good.replace("fixed: 200", "fixed: 10000000")).unwrap();
    let o = check();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("REGRESSION: scenario t/nothing policy seed-v1 metric e2e_mean_s: ")
            && t.contains(" -> - (-, tolerance"),
        "{t}"
    );
    assert!(t.contains("metric ttft_p99_s"), "{t}");
}

/// A scenario event the router ignores (a pin under table weights, which keep no pins) used to
/// be dropped silently; now `run` says so on stderr and lists it in `summary.json`.
#[test]
fn an_ignored_scenario_event_is_reported_by_run() {
    let dir = scratch("cli-warnings");
    let src = format!(
        "name: t\nseed: 1\nmodel: m\nhardware_dir: {}\nfleet:\n  - {{ name: a, profile: rtx4090-27b }}\n\
         traffic:\n  - burst: {{ at_s: 1, size: 2, prompt: {{ fixed: 100 }}, output: {{ fixed: 10 }} }}\n\
         events:\n  - {{ at_s: 0.5, worker: a, action: pin, weight: 2 }}\npolicies: [seed-v1]\n",
        repo("scenarios/hardware")
    );
    let file = dir.join("pin.yaml");
    std::fs::write(&file, src).unwrap();
    let out = dir.join("out");
    let o = routelab(&[
        "run",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("warning: seed-v1: "), "{stderr}");
    assert!(stderr.contains("pin"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let text = summary.to_string();
    assert!(text.contains("\"warnings\""), "{text}");
}
