//! Verdicts on a trace (issue 29) from the command line: `compare` and `capacity` resample a
//! trace per seed by default (so a deterministic router's interval is not zero), say what a seed
//! is in every output, check the winner out of sample with `--holdout` and write both to the
//! findings; `run` replays exactly; and the input traps answer as a careful tool does.

use super::common::{azure_slice, routelab, scratch, text};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn slice(dir: &Path) -> PathBuf {
    azure_slice(dir, "test/azure-slice")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const ROUND_ROBIN: &str = "equal/round-robin/none/none";

fn capacity(dir: &Path, out: &str, extra: &[&str]) -> (String, Value) {
    let sc = slice(dir);
    let out = dir.join(out);
    let mut args = vec![
        "capacity",
        sc.to_str().unwrap(),
        "--slo",
        "ttft<=2s,tpot<=100ms",
        "--target",
        "0.9",
        "--seeds",
        "3",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = routelab(&args);
    assert!(o.status.success(), "{}", text(&o));
    (text(&o), json(&out.join("capacity.json")))
}

fn half_width(study: &Value, policy: &str) -> f64 {
    let p = study["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == policy)
        .unwrap();
    p["capacity_scale"]["half_width"].as_f64().unwrap_or(0.0)
}

#[test]
fn capacity_resamples_a_trace_per_seed_and_the_findings_hold_it_out() {
    let dir = scratch("study-capacity");
    let findings = dir.join("findings.md");
    let (console, study) = capacity(
        &dir,
        "resampled",
        &["--holdout", "0.3", "--findings", findings.to_str().unwrap()],
    );
    // Round robin routes deterministically: its interval across seeds is the traffic's.
    assert!(half_width(&study, ROUND_ROBIN) > 0.0, "{study}");
    let meaning = study["seed_meaning"].as_str().unwrap();
    assert!(
        meaning.starts_with(
            "A seed: traffic[0] (AzureLLMInferenceTrace_conv.csv, the first 70 % of its span) is \
             a new local block-bootstrap resample of the trace on each seed (blocks of"
        ) && meaning.contains("Warm-up: traffic[0] starts at 9.0 s"),
        "{meaning}"
    );
    assert!(console.contains(meaning), "{console}");
    assert!(
        study["ship"].as_str().unwrap().starts_with("Ship `"),
        "{study}"
    );
    let oos = &study["out_of_sample"];
    assert_eq!(
        oos["held_out"], "the last 30 % of each trace's span",
        "{oos}"
    );
    assert!(
        console.contains(
            "Out of sample (the last 30 % of each trace's span held out; the winner \
                          picked on the rest by the most capacity at the SLO of any deployable \
                          policy): "
        ),
        "{console}"
    );
    assert!(dir.join("resampled/held-out/capacity.json").is_file());
    // Issue 41: the held-out part picks no policy of its own ("Ship `predictive`" there sat in
    // a report that shipped another): its outputs lead with the verdict of the report it is in.
    let held: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("resampled/held-out/capacity.json")).unwrap(),
    )
    .unwrap();
    let held_ship = held["ship"].as_str().unwrap();
    assert!(
        held_ship.starts_with("This is the held-out part: it checks the policy picked on the rest")
            && !held_ship.contains("Ship ")
            && held_ship.contains(oos["detail"].as_str().unwrap())
            && held_ship.contains(&format!("`{}`", oos["winner"].as_str().unwrap())),
        "{held_ship}"
    );
    let held_page = std::fs::read_to_string(dir.join("resampled/held-out/report.html")).unwrap();
    assert!(
        held_page.contains("This is the held-out part"),
        "held-out report.html"
    );
    // The findings part: resampled intervals, what a seed is, and the out-of-sample line.
    let md = std::fs::read_to_string(&findings).unwrap();
    assert!(
        md.contains("### test/azure-slice at `ttft<=2s,tpot<=100ms` for 90% of requests"),
        "{md}"
    );
    assert!(md.contains("3 seeds (trace resampled ("), "{md}");
    let rr_row = md
        .lines()
        .find(|l| l.starts_with(&format!("| `{ROUND_ROBIN}` |")))
        .unwrap();
    assert!(
        rr_row.contains(" ± ") && !rr_row.contains(" ± 0 "),
        "{rr_row}"
    );
    assert!(
        md.contains("\nOut of sample (the last 30 % of each trace's span held out;"),
        "{md}"
    );

    // As recorded (`--resample none`), every seed is the same traffic: round robin's capacity
    // does not move with the seed, and the outputs say why.
    let (console, exact) = capacity(&dir, "exact", &["--resample", "none"]);
    assert_eq!(half_width(&exact, ROUND_ROBIN), 0.0, "{exact}");
    assert!(
        console.contains(
            "is replayed as recorded on every seed (`resample: none`), so the \
                          intervals carry none of the traffic's variability"
        ),
        "{console}"
    );
}

#[test]
fn compare_checks_its_winner_out_of_sample_and_says_what_a_seed_is() {
    let dir = scratch("study-compare");
    let sc = slice(&dir);
    let out = dir.join("out");
    let findings = dir.join("findings.md");
    let o = routelab(&[
        "compare",
        sc.to_str().unwrap(),
        "--seeds",
        "3",
        "--holdout",
        "0.3",
        "--out",
        out.to_str().unwrap(),
        "--findings",
        findings.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let console = text(&o);
    assert!(
        console.contains(
            "Out of sample (the last 30 % of each trace's span held out; the winner \
                          picked on the rest by lowest e2e mean): "
        ),
        "{console}"
    );
    let file = json(&out.join("compare.json"));
    let st = &file["scenarios"][0];
    assert_eq!(
        file["scenarios"].as_array().unwrap().len(),
        1,
        "held-out parts are not reported"
    );
    assert!(
        st["seed_meaning"]
            .as_str()
            .unwrap()
            .contains("local block-bootstrap resample"),
        "{st}"
    );
    assert!(
        ["yes", "tied", "no"].contains(&st["out_of_sample"]["holds"].as_str().unwrap()),
        "{st}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Out of sample (the last 30 %") && html.contains("A seed: traffic[0]"));
    let md = std::fs::read_to_string(&findings).unwrap();
    assert!(
        md.contains("| scenario | baseline | seeds | decided by | traffic per seed |")
            && md.contains("| test/azure-slice | seed-v1 | 3 | fixed count | trace resampled ("),
        "{md}"
    );
    assert!(
        md.contains("## Out of sample")
            && md.contains("| scenario | winner in sample | best held out | verdict |"),
        "{md}"
    );
}

#[test]
fn run_replays_a_trace_as_recorded_and_says_so() {
    let dir = scratch("study-run");
    let sc = slice(&dir);
    let out = dir.join("out");
    let o = routelab(&[
        "run",
        sc.to_str().unwrap(),
        "--no-requests",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let said = "A seed: traffic[0] (AzureLLMInferenceTrace_conv.csv) is replayed as recorded on \
                every seed (`resample: none`)";
    assert!(text(&o).contains(said), "{}", text(&o));
    let summary = json(&out.join("summary.json"));
    assert!(summary["seed_meaning"].as_str().unwrap().starts_with(said));
}

#[test]
fn trap3_capacity_refuses_an_empty_trace_instead_of_calling_policies_infeasible() {
    let dir = scratch("study-empty");
    std::fs::write(
        dir.join("empty.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n",
    )
    .unwrap();
    let sc = dir.join("s.yaml");
    std::fs::write(
        &sc,
        "fleet: [{ name: w, profile: rtx-pro-6000-27b }]\n\
         traffic: [{ trace: { path: empty.csv, format: azure } }]\npolicies: [seed-v1]\n",
    )
    .unwrap();
    let o = routelab(&[
        "capacity",
        sc.to_str().unwrap(),
        "--slo",
        "ttft<=2s",
        "--target",
        "0.9",
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("empty.csv: no requests to replay: its 1 line(s) hold no data row")
            && !t.contains("infeasible"),
        "{t}"
    );
}

#[test]
fn trap5_validate_refuses_a_source_the_machine_cannot_hold() {
    let dir = scratch("study-memory");
    let sc = dir.join("huge.yaml");
    std::fs::write(
        &sc,
        "fleet: [{ name: w, profile: rtx4090-27b }]\n\
         traffic:\n  - poisson: { rate_per_s: 1e6, duration_s: 86400, prompt: { fixed: 100 }, output: { fixed: 10 } }\n",
    )
    .unwrap();
    let o = routelab(&["validate", sc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("would keep about 8.640e10 requests waiting at the gateway"),
        "{}",
        text(&o)
    );
}

#[test]
fn trap7_run_counts_rejections_by_reason_in_summary_json_and_the_console() {
    let dir = scratch("study-rejections");
    let sc = dir.join("long.yaml");
    std::fs::write(
        &sc,
        "fleet: [{ name: w, profile: rtx4090-27b, context_window: 4096 }]\n\
         traffic:\n  - poisson: { rate_per_s: 1, count: 8, prompt: { fixed: 6000 }, output: { fixed: 10 } }\n\
         policies: [seed-v1]\n",
    )
    .unwrap();
    let out = dir.join("out");
    let o = routelab(&[
        "run",
        sc.to_str().unwrap(),
        "--no-requests",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(
            "warning: seed-v1: 8 request(s) rejected: 8 because prompt + output exceed every \
             worker's context window (the largest is 4096 tokens; the longest refused request \
             6010 tokens)"
        ),
        "{}",
        text(&o)
    );
    let run = &json(&out.join("summary.json"))["runs"][0];
    assert_eq!(run["rejected"], 8);
    assert_eq!(run["rejected_by"]["context_window"], 8);
    assert_eq!(run["rejected_by"]["no_worker"], 0);
}

#[test]
fn trap9_trace_stats_on_a_csv_with_its_own_columns_says_how_to_map_them() {
    let dir = scratch("study-own-columns");
    let log = dir.join("requests.csv");
    std::fs::write(&log, "ts,in,out\n1740830400,812,203\n").unwrap();
    let o = routelab(&["trace", "stats", log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("missing column(s) `TIMESTAMP`")
            && t.contains("A log with its own columns (ts, in, out) is read through a mapping")
            && t.contains("routelab trace stats <scenario>.yaml"),
        "{t}"
    );
}
