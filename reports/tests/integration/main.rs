//! End-to-end tests: run the simulator on the source's sixteen-at-once case and check every
//! report file.

use routelab_reports::metric;
use routelab_reports::{
    PolicyRun, PolicySeeds, RunMeta, RunSummary, ScenarioComparison, SeedRun, SweepRow,
    compare_table, findings_markdown, run_table, summary_table, sweep_table, write_compare,
    write_run, write_sweep,
};
use routelab_sim::{RequestRecord, RunMetrics, Scenario};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn scenario_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/seed/sixteen-at-once.yaml")
}

fn scenario() -> Scenario {
    Scenario::load(scenario_path()).expect("scenario loads")
}

fn simulate(sc: &Scenario, seed: u64) -> Vec<(RunMetrics, Vec<RequestRecord>)> {
    let setup = sc.setup_for_seed(seed);
    sc.policies
        .iter()
        .map(|p| {
            let mut traffic = sc.traffic_source(seed).expect("traffic");
            let mut rows: Vec<RequestRecord> = Vec::new();
            let m = routelab_sim::run(&setup, p, traffic.as_mut(), Some(&mut rows)).expect("run");
            (m, rows)
        })
        .collect()
}

fn runs() -> (RunMeta, Vec<PolicyRun>) {
    let sc = scenario();
    let seed = sc.setup.seed;
    let meta = RunMeta {
        // A fixed path so the snapshot does not depend on the checkout location.
        scenario_path: "scenarios/seed/sixteen-at-once.yaml".into(),
        ..RunMeta::from_scenario(&sc, seed)
    };
    let runs = simulate(&sc, seed)
        .into_iter()
        .map(|(m, rows)| PolicyRun::new(m, Some(rows)))
        .collect();
    (meta, runs)
}

/// A fresh directory under cargo's per-test temporary directory.
fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("routelab-reports")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Also write into `$ROUTELAB_REPORTS_KEEP/<name>` when set, to look at the charts.
fn keep(name: &str) -> Option<PathBuf> {
    std::env::var_os("ROUTELAB_REPORTS_KEEP").map(|d| PathBuf::from(d).join(name))
}

const RUN_FILES: &[&str] = &[
    "summary.json",
    "requests.csv",
    "timeline.csv",
    "ttft_cdf.svg",
    "ttft_cdf.png",
    "e2e_cdf.svg",
    "e2e_cdf.png",
    "share.svg",
    "share.png",
    "weights.svg",
    "weights.png",
    "in_flight.svg",
    "in_flight.png",
    "report.html",
];

fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{}: not a PNG",
        path.display()
    );
    assert!(
        bytes.len() > 10_000,
        "{}: only {} bytes",
        path.display(),
        bytes.len()
    );
    // IHDR: width and height.
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!(w, 900, "{}", path.display());
    assert!(h >= 400, "{}: height {h}", path.display());
}

#[test]
fn run_writes_every_file_with_the_design_fields() {
    let (meta, runs) = runs();
    let dir = out_dir("run");
    let written = write_run(&dir, &meta, &runs).expect("write_run");
    let names: Vec<String> = written
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, RUN_FILES);
    for f in RUN_FILES {
        let len = std::fs::metadata(dir.join(f)).expect(f).len();
        assert!(len > 100, "{f} is {len} bytes");
    }
    if let Some(k) = keep("run") {
        write_run(&k, &meta, &runs).unwrap();
    }

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["scenario"], "seed/sixteen-at-once");
    assert_eq!(json["seed"], 1);
    assert_eq!(json["slo"]["ttft_s"], 2.0, "the SLO applied (the default)");
    assert_eq!(json["slo"]["tpot_s"], 0.1);
    let runs_json = json["runs"].as_array().unwrap();
    assert_eq!(runs_json.len(), 2);
    for r in runs_json {
        for k in [
            "policy",
            "requests",
            "completed",
            "failed",
            "output_tok_s",
            "probe_gpu_s",
            "prefix_hit_fraction",
            "workers",
            "rejected",
            "retried",
            "slo_attainment",
            "believed_prefix_hit_fraction",
            "probe_bursts",
            "probe_measurements",
        ] {
            assert!(r.get(k).is_some(), "missing {k}");
        }
        for q in ["ttft_s", "e2e_s", "tpot_s", "queue_s"] {
            for k in ["mean", "p50", "p90", "p99"] {
                assert!(r[q][k].is_number(), "{q}.{k} = {}", r[q][k]);
            }
        }
        assert_eq!(r["requests"], 16);
        assert_eq!(r["completed"], 16);
        assert_eq!(r["failed"], 0);
        for w in r["workers"].as_array().unwrap() {
            for k in [
                "id",
                "requests",
                "share",
                "output_tokens",
                "weight",
                "provenance",
                "completed",
                "failed",
            ] {
                assert!(w.get(k).is_some(), "worker field {k}");
            }
        }
    }
    let v1 = &runs_json[0];
    assert_eq!(v1["policy"], "seed-v1");
    let w = v1["workers"].as_array().unwrap();
    assert_eq!(
        (w[0]["id"].as_str(), w[0]["requests"].as_u64()),
        (Some("pair"), Some(12))
    );
    assert_eq!(
        (w[1]["id"].as_str(), w[1]["requests"].as_u64()),
        (Some("pro6000"), Some(4))
    );
    assert_eq!(w[0]["share"], 0.75);
    assert_eq!(w[1]["share"], 0.25);
    assert_eq!(w[1]["output_tokens"], 4 * 256);
    assert_eq!(w[0]["weight"], 3.5);
    assert_eq!(w[1]["weight"], 1.0);
    assert_eq!(w[0]["provenance"], "table");
    // Under seed-v3 the PRO 6000 carries the majority and probes cost GPU time.
    let v3 = &runs_json[1];
    assert_eq!(v3["policy"], "seed-v3");
    assert!(v3["workers"][1]["requests"].as_u64().unwrap() > 8);
    assert!(v3["probe_gpu_s"].as_f64().unwrap() > 0.0);
    assert!(
        !std::fs::read_to_string(dir.join("summary.json"))
            .unwrap()
            .contains("NaN")
    );

    // CSVs: one row per request per policy; one per sample per worker per policy.
    let req = std::fs::read_to_string(dir.join("requests.csv")).unwrap();
    assert!(req.starts_with("policy,id,arrival_s,worker,status,"));
    assert_eq!(req.lines().count(), 1 + 32);
    assert_eq!(
        req.lines()
            .filter(|l| l.starts_with("seed-v1,") && l.contains(",pair,"))
            .count(),
        12
    );
    let tl = std::fs::read_to_string(dir.join("timeline.csv")).unwrap();
    assert!(tl.starts_with(
        "policy,t_s,worker,in_flight,running,waiting,weight,provenance,dispatched,output_tokens\n"
    ));
    let samples: usize = runs.iter().map(|r| r.metrics.timeline.len()).sum();
    assert_eq!(tl.lines().count(), 1 + samples);
    assert!(samples > 0);
}

#[test]
fn run_outputs_are_byte_identical() {
    let (meta, runs) = runs();
    let (a, b) = (out_dir("same-a"), out_dir("same-b"));
    write_run(&a, &meta, &runs).unwrap();
    // Recompute from scratch: the simulator and the writers together are deterministic.
    let (meta2, runs2) = self::runs();
    write_run(&b, &meta2, &runs2).unwrap();
    for f in RUN_FILES {
        let (x, y) = (
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
        );
        assert!(x == y, "{f} differs between two identical writes");
    }
}

#[test]
fn charts_and_html_are_sound() {
    let (meta, runs) = runs();
    let dir = out_dir("charts");
    write_run(&dir, &meta, &runs).unwrap();
    for stem in ["ttft_cdf", "e2e_cdf", "share", "weights", "in_flight"] {
        check_png(&dir.join(format!("{stem}.png")));
    }
    let svg = |s: &str| std::fs::read_to_string(dir.join(format!("{s}.svg"))).unwrap();
    // plotters writes each text element's content on a line of its own.
    let has_text = |s: &str, t: &str| svg(s).contains(&format!("\n{t}\n</text>"));
    assert!(
        has_text("ttft_cdf", "time to first token (s, log scale)")
            || has_text("ttft_cdf", "time to first token (s)")
    );
    assert!(has_text("ttft_cdf", "requests at or below (CDF)"));
    assert!(svg("e2e_cdf").contains("\nend-to-end latency (s"));
    assert!(has_text("share", "share of requests"));
    assert!(has_text("share", "worker"));
    assert!(has_text("share", "pro6000") && has_text("share", "pair"));
    assert!(has_text("weights", "simulated time (s)"));
    assert!(has_text("weights", "weight"));
    assert!(has_text("in_flight", "requests in flight"));
    for s in ["ttft_cdf", "e2e_cdf", "share", "weights", "in_flight"] {
        assert!(
            has_text(s, "seed-v1") && has_text(s, "seed-v3"),
            "{s}: policy names"
        );
    }
    for s in ["weights", "in_flight"] {
        assert!(has_text(s, "pair") && has_text(s, "pro6000"), "{s}: legend");
    }

    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "external reference"
    );
    assert!(!html.contains("<script"));
    assert!(!html.contains("<img") && !html.contains("<link"));
    assert_eq!(html.matches("<svg").count(), 5, "every chart inline");
    assert!(html.contains("seed/sixteen-at-once"));
    assert!(html.contains(&meta.description));
    assert!(html.contains("class=\"best\""));
    assert!(html.contains("<td class=\"l\">pro6000</td>"));
    // The SLO bounds the attainment and goodput columns were judged by.
    assert!(
        html.contains("SLO applied: TTFT ≤ 2 s and TPOT ≤ 0.1 s per request"),
        "thresholds shown"
    );
    assert!(html.contains("<th>goodput</th>") || html.contains(">goodput<"));
}

#[test]
fn terminal_table_and_summary_snapshots() {
    let (meta, runs) = runs();
    insta::assert_snapshot!("run_table", run_table(&runs));
    let dir = out_dir("snapshot");
    write_run(&dir, &meta, &runs).unwrap();
    insta::assert_snapshot!(
        "summary_json",
        std::fs::read_to_string(dir.join("summary.json")).unwrap()
    );
}

fn comparison() -> ScenarioComparison {
    let sc = scenario();
    let mut policies: Vec<PolicySeeds> = sc.policies.iter().map(PolicySeeds::of).collect();
    for seed in [1, 2, 3] {
        for (p, (m, _)) in policies.iter_mut().zip(simulate(&sc, seed)) {
            p.push(seed, &m);
        }
    }
    ScenarioComparison::new(sc.name.clone(), sc.description.clone(), policies)
}

#[test]
fn compare_outputs() {
    let cmp = vec![comparison()];
    let dir = out_dir("compare");
    let written = write_compare(&dir, &cmp).unwrap();
    let names: Vec<String> = written
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "compare.json",
            "compare.csv",
            "compare_seeds.csv",
            "compare_1_seed-sixteen-at-once_bars.svg",
            "compare_1_seed-sixteen-at-once_bars.png",
            "compare_1_seed-sixteen-at-once_e2e_cdf.svg",
            "compare_1_seed-sixteen-at-once_e2e_cdf.png",
            "report.html",
        ]
    );
    if let Some(k) = keep("compare") {
        write_compare(&k, &cmp).unwrap();
    }
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("compare.json")).unwrap()).unwrap();
    let s = &json["scenarios"][0];
    assert_eq!(s["policies"][0]["seeds"], serde_json::json!([1, 2, 3]));
    let e2e = s["policies"][0]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "e2e_mean_s")
        .unwrap();
    assert_eq!(e2e["n"], 3);
    assert!(e2e["ci95_low"].as_f64().unwrap() <= e2e["mean"].as_f64().unwrap());
    let w = s["winners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["metric"] == "e2e_mean_s")
        .unwrap();
    assert_eq!(
        w["winner"], "seed-v3",
        "the probe's weights finish the batch sooner"
    );
    // Paired on the same three seeds (the same traffic): the verdict rests on the per-seed
    // differences.
    assert_eq!(s["baseline"], "seed-v1");
    assert_eq!(
        (s["seeds_run"].as_u64(), s["seed_stop"].as_str()),
        (Some(3), Some("fixed"))
    );
    assert!(
        s["policies"][0].get("vs_baseline").is_none(),
        "the baseline itself"
    );
    let d = s["policies"][1]["vs_baseline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["metric"] == "e2e_mean_s")
        .unwrap();
    assert_eq!(d["n"], 3);
    let (lo, hi) = (
        d["ci95_low"].as_f64().unwrap(),
        d["ci95_high"].as_f64().unwrap(),
    );
    assert!(lo <= d["mean"].as_f64().unwrap() && d["mean"].as_f64().unwrap() <= hi);
    assert_eq!(d["established"], hi < 0.0 || lo > 0.0);
    assert_eq!(
        w["paired"]["established"], d["established"],
        "two policies: same pair"
    );
    let csv = std::fs::read_to_string(dir.join("compare.csv")).unwrap();
    assert!(csv.starts_with(
        "scenario,policy,metric,unit,better,n,mean,sd,ci95_low,ci95_high,winner,baseline,\
         vs_baseline_mean,vs_baseline_ci95_low,vs_baseline_ci95_high,vs_baseline_verdict\n"
    ));
    assert!(csv.contains("seed/sixteen-at-once,seed-v3,e2e_mean_s,s,lower,3,"));
    let seeds = std::fs::read_to_string(dir.join("compare_seeds.csv")).unwrap();
    assert_eq!(seeds.lines().count(), 1 + 2 * 3);
    check_png(&dir.join("compare_1_seed-sixteen-at-once_bars.png"));
    check_png(&dir.join("compare_1_seed-sixteen-at-once_e2e_cdf.png"));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert_eq!(html.matches("<svg").count(), 2);
    assert!(html.contains("class=\"best\""));
    assert!(html.contains("Paired difference from the baseline, seed-v1"));
    assert!(html.contains("3 seeds (fixed count)"));

    let md = findings_markdown(&cmp);
    assert!(
        md.contains("| seed/sixteen-at-once | e2e mean (s) | seed-v3 ("),
        "{md}"
    );
    let table = compare_table(&cmp);
    assert!(
        table.starts_with("seed/sixteen-at-once (3 seeds)\n"),
        "{table}"
    );

    // Deterministic too.
    let again = out_dir("compare-again");
    write_compare(&again, &[comparison()]).unwrap();
    for f in &names {
        assert!(
            std::fs::read(dir.join(f)).unwrap() == std::fs::read(again.join(f)).unwrap(),
            "{f} differs"
        );
    }
}

#[test]
fn sweep_outputs() {
    let sc = scenario();
    let params = vec!["burst_size".to_string(), "rtt_ms".to_string()];
    let mut rows: Vec<SweepRow> = Vec::new();
    for (size, rtt) in [(16, "0"), (32, "0"), (64, "0"), (16, "20"), (64, "20")] {
        for (m, _) in simulate(&sc, 1) {
            // Scale a real summary so the chart has a shape (the writer does not care).
            let mut s = RunSummary::from_metrics(&m);
            let f = f64::from(size) / 16.0;
            let (e2e, ttft) = (
                metric::by_name("e2e_mean_s").unwrap(),
                metric::by_name("ttft_p99_s").unwrap(),
            );
            s.set(e2e, s.get(e2e).map(|v| v * f));
            s.set(
                ttft,
                s.get(ttft)
                    .map(|v| v * f + rtt.parse::<f64>().unwrap() / 1000.0),
            );
            let mut row = SweepRow::new(
                vec![size.to_string(), rtt.to_string()],
                PolicySeeds::new(m.policy.clone(), m.role),
            );
            row.runs.runs.push(SeedRun {
                seed: 1,
                summary: s,
            });
            rows.push(row);
        }
    }
    let dir = out_dir("sweep");
    let w = write_sweep(&dir, "t/sweep", "", &params, &rows).unwrap();
    assert_eq!(w.files.len(), 4);
    if let Some(k) = keep("sweep") {
        write_sweep(&k, "t/sweep", "", &params, &rows).unwrap();
    }
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert!(csv.starts_with("burst_size,rtt_ms,policy,requests,"));
    assert_eq!(csv.lines().count(), 1 + rows.len());
    check_png(&dir.join("sweep.png"));
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).unwrap();
    assert!(svg.contains("\nburst_size\n</text>"));
    assert!(svg.contains("\nseed-v3 (rtt_ms=20)\n</text>"));
    let t = sweep_table(&params, &rows);
    assert_eq!(t.lines().count(), 2 + rows.len());
    // Categorical first parameter (not numbers): one tick per value, in order of appearance.
    let cat: Vec<SweepRow> = rows
        .iter()
        .map(|r| {
            let label = if r.values[0] == "16" {
                "small burst"
            } else {
                "large burst"
            };
            SweepRow {
                values: vec![label.to_string()],
                ..r.clone()
            }
        })
        .collect();
    let cat_dir = out_dir("sweep-categorical");
    write_sweep(&cat_dir, "t/sweep", "", &["traffic".to_string()], &cat).unwrap();
    if let Some(k) = keep("sweep-categorical") {
        write_sweep(&k, "t/sweep", "", &["traffic".to_string()], &cat).unwrap();
    }
    let svg = std::fs::read_to_string(cat_dir.join("sweep.svg")).unwrap();
    assert!(svg.contains("\nsmall burst\n</text>") && svg.contains("\nlarge burst\n</text>"));
    // A row with the wrong number of values is an error naming the file.
    let bad = vec![SweepRow {
        values: vec!["1".to_string()],
        ..rows[0].clone()
    }];
    let err = write_sweep(&out_dir("sweep-bad"), "t/sweep", "", &params, &bad).unwrap_err();
    assert!(err.to_string().contains("sweep.csv"));
}

#[test]
fn perf_json_is_written_apart() {
    let dir = out_dir("perf");
    let perf = routelab_reports::PerfInfo {
        total_wall_s: 1.5,
        threads: 2,
        runs: vec![routelab_reports::PerfRun {
            scenario: "s".into(),
            policy: "p".into(),
            seed: 1,
            wall_s: 0.5,
            sim_events: 1000,
            simulated_s: 60.0,
        }],
    };
    let p = routelab_reports::write_perf(&dir, &perf).unwrap();
    assert_eq!(p, dir.join("perf.json"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    assert_eq!(v["runs"][0]["events_per_s"], 2000.0);
    assert_eq!(v["runs"][0]["speedup"], 120.0);
    assert_eq!(v["threads"], 2);
}

#[test]
fn unwritable_directory_names_the_path() {
    let (meta, runs) = runs();
    let file = out_dir("not-a-dir");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"x").unwrap();
    let err = write_run(&file, &meta, &runs).unwrap_err();
    assert!(err.to_string().contains("not-a-dir"), "{err}");
    let _ = summary_table(&[]);
}

#[test]
fn degenerate_inputs_still_write_every_file() {
    let (meta, mut runs) = runs();
    for r in &mut runs {
        r.metrics.timeline.clear();
        r.requests = Some(Vec::new());
    }
    let dir = out_dir("degenerate");
    write_run(&dir, &meta, &runs).unwrap();
    if let Some(k) = keep("degenerate") {
        write_run(&k, &meta, &runs).unwrap();
    }
    let req = std::fs::read_to_string(dir.join("requests.csv")).unwrap();
    assert_eq!(req.lines().count(), 1, "header only");
    // Runs without rows (streamed elsewhere, or not asked for) leave requests.csv alone.
    for r in &mut runs {
        r.requests = None;
    }
    let streamed = out_dir("streamed-elsewhere");
    write_run(&streamed, &meta, &runs).unwrap();
    assert!(!streamed.join("requests.csv").exists());
    assert!(
        std::fs::read_to_string(dir.join("weights.svg"))
            .unwrap()
            .contains("\nno data\n</text>")
    );
    let empty = out_dir("empty");
    write_run(&empty, &meta, &[]).unwrap();
    for f in RUN_FILES.iter().filter(|f| **f != "requests.csv") {
        assert!(empty.join(f).exists(), "{f}");
    }
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(empty.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(json["runs"], serde_json::json!([]));
    let cmp = write_compare(&out_dir("compare-empty"), &[]).unwrap();
    assert_eq!(cmp.files.len(), 4);
    assert_eq!(findings_markdown(&[]).lines().count(), 2);
}
