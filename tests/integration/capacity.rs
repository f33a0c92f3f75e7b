//! `routelab capacity`: the knee it finds where queueing theory gives it in closed form, common
//! random numbers across policies, the console output, and every bad input as a located error
//! with exit code 2.

use super::common::{routelab, scratch, text};
use routelab_sim::{RequestRecord, Scenario, run};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn hardware() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sim/tests/data/hardware")
        .display()
        .to_string()
}

/// One worker with a constant total decode rate of 1000 tok/s shared equally by its running
/// requests and (almost) free prefill (`sim/tests/data/hardware/constant-rate.yaml`); Poisson
/// arrivals at 1 req/s × the load scale, 1-token prompts, 100-token outputs; no gateway cap.
fn ps_scenario(dir: &Path, count: u32, policies: &str) -> String {
    fleet_scenario(
        dir,
        "- { name: only, profile: constant-rate }",
        count,
        policies,
    )
}

/// [`ps_scenario`] on another fleet (of `constant-rate` workers).
fn fleet_scenario(dir: &Path, fleet: &str, count: u32, policies: &str) -> String {
    let f = dir.join("ps.yaml");
    std::fs::write(
        &f,
        format!(
            "name: test/capacity-ps\nseed: 1\nhardware_dir: {}\nfleet:\n  {fleet}\n\
             traffic:\n  - poisson: {{ rate_per_s: 1, count: {count}, prompt: {{ fixed: 1 }}, output: {{ fixed: 100 }} }}\n\
             policies: [{policies}]\ntimeline_s: 0\n",
            hardware()
        ),
    )
    .unwrap();
    f.display().to_string()
}

/// The knee in closed form. Each request needs S = 100 tokens / 1000 tok/s = 0.1 s of the
/// worker, which it shares equally among its running requests: an M/D/1 processor-sharing
/// queue, whose mean response time is S / (1 − ρ) for any service distribution, ρ = λ S. At
/// load scale x, λ = x req/s, so `e2el_mean <= 0.5 s` holds while 0.1 / (1 − 0.1 x) <= 0.5,
/// i.e. up to x = 8 (ρ = 0.8). The search brackets to 2 % (its `--precision`); a finite run
/// of 20,000 requests measures the mean within about 2 % at ρ = 0.8, which moves the knee by
/// only (1 − ρ)/ρ × 2 % = 0.5 %. So every seed's capacity must be within 2.5 % of 8.
#[test]
fn capacity_finds_the_processor_sharing_knee() {
    let dir = scratch("capacity-knee");
    let sc = ps_scenario(&dir, 20_000, "\"equal/p2c/none/none\"");
    let out = dir.join("out");
    let o = routelab(&[
        "capacity",
        &sc,
        "--slo",
        "e2el_mean<=500ms",
        "--seeds",
        "2",
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("capacity.json")).unwrap()).unwrap();
    assert_eq!(json["precision"], 0.02);
    assert_eq!(json["baseline"], "equal/round-robin/none/none");
    let base_rate = json["base_rate_per_s"].as_f64().unwrap();
    assert!((base_rate - 1.0).abs() < 0.03, "{base_rate}");
    for p in json["policies"].as_array().unwrap() {
        for s in p["seeds"].as_array().unwrap() {
            let (low, high) = (
                s["scale"].as_f64().unwrap(),
                s["failing_scale"].as_f64().unwrap(),
            );
            assert!(high / low <= 1.02 + 1e-6, "bracket {low}..{high}");
            assert!((low / 8.0 - 1.0).abs() <= 0.025, "{}: {low}", p["policy"]);
        }
    }
    for f in [
        "capacity.json",
        "capacity.csv",
        "capacity_evaluations.csv",
        "capacity.svg",
        "capacity.png",
        "report.html",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
}

fn arrival_columns(sc: &Scenario, policy: usize) -> Vec<(u64, u64, u32, u32)> {
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, &sc.policies[policy], &mut *t, Some(&mut rows)).unwrap();
    let mut cols: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.id,
                r.arrival_s.to_bits(),
                r.prompt_tokens,
                r.output_tokens,
            )
        })
        .collect();
    cols.sort_unstable();
    cols
}

/// Common random numbers: for a seed, every policy sees the same arrivals and lengths, at any
/// load scale (the capacity search's runs) and in `requests.csv` (`routelab run`).
#[test]
fn every_policy_sees_the_same_arrivals_for_a_seed() {
    let dir = scratch("capacity-crn");
    let f = dir.join("mixed.yaml");
    std::fs::write(
        &f,
        format!(
            "name: test/crn\nseed: 4\nhardware_dir: {}\nfleet:\n  - {{ name: w, profile: constant-rate, count: 3 }}\n\
             traffic:\n  - poisson: {{ rate_per_s: 20, count: 400, prompt: {{ uniform: {{ min: 1, max: 900 }} }}, output: {{ exponential: {{ mean: 50 }} }} }}\n\
             \x20 - on_off: {{ burst_size: {{ uniform: {{ min: 1, max: 8 }} }}, window_s: 1, gap_s: {{ exponential: {{ mean: 3 }} }}, count: 100, prompt: {{ fixed: 30 }}, output: {{ uniform: {{ min: 1, max: 90 }} }} }}\n\
             policies: [\"equal/random/none/none\", seed-v3]\ntimeline_s: 0\n",
            hardware()
        ),
    )
    .unwrap();
    let sc = Scenario::load(&f).unwrap();
    for scale in [1.0, 2.5] {
        let scaled = sc.with_load_scale(scale).unwrap();
        let (a, b) = (arrival_columns(&scaled, 0), arrival_columns(&scaled, 1));
        assert_eq!(a.len(), 500);
        assert_eq!(a, b, "scale {scale}");
    }
    // The same through the command line's requests.csv.
    let out = dir.join("out");
    let o = routelab(&[
        "run",
        &f.display().to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let keep = [
        col("id"),
        col("arrival_s"),
        col("prompt_tokens"),
        col("output_tokens"),
    ];
    let mut by_policy: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for l in lines {
        let cells: Vec<&str> = l.split(',').collect();
        let policy = cells[col("policy")].to_string();
        let row: Vec<String> = keep.iter().map(|&i| cells[i].to_string()).collect();
        match by_policy.iter_mut().find(|(p, _)| *p == policy) {
            Some((_, rows)) => rows.push(row),
            None => by_policy.push((policy, vec![row])),
        }
    }
    assert_eq!(by_policy.len(), 2);
    for (_, rows) in &mut by_policy {
        rows.sort_by_key(|r| r[0].parse::<u64>().unwrap());
    }
    assert_eq!(by_policy[0].1.len(), 500);
    assert_eq!(by_policy[0].1, by_policy[1].1);
}

/// Two workers, one at 40 % speed: round robin overloads the slow one, least-loaded choosers
/// do not, so the table shows established ratios.
#[test]
fn console_output_snapshot() {
    let dir = scratch("capacity-snapshot");
    let sc = fleet_scenario(
        &dir,
        "- { name: fast, profile: constant-rate }\n  - { name: slow, profile: constant-rate, speed_factor: 0.4 }",
        2_000,
        "\"equal/p2c/none/none\", \"equal/random/none/none\"",
    );
    let o = routelab(&[
        "capacity",
        &sc,
        "--slo",
        "ttft_p99<=50ms,e2el_p90<=1s",
        "--seeds",
        "3",
        "--out",
        &dir.join("out").display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // The last line names the temporary output directory.
    let shown: String = stdout
        .lines()
        .filter(|l| !l.starts_with("report: "))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!(shown);
    // The same files on one thread as on several.
    let one = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args([
            "capacity",
            &sc,
            "--slo",
            "ttft_p99<=50ms,e2el_p90<=1s",
            "--seeds",
            "3",
            "--out",
            &dir.join("one").display().to_string(),
        ])
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(one.status.success(), "{}", text(&one));
    for f in [
        "capacity.json",
        "capacity.csv",
        "capacity_evaluations.csv",
        "capacity.svg",
    ] {
        assert!(
            std::fs::read(dir.join("out").join(f)).unwrap()
                == std::fs::read(dir.join("one").join(f)).unwrap(),
            "{f} depends on the thread count"
        );
    }
}

/// Each bad input: exit code 2 and a located message (flag or file, field, what is valid).
#[test]
fn bad_input_is_a_located_error_with_exit_2() {
    let dir = scratch("capacity-bad");
    let sc = ps_scenario(&dir, 100, "\"equal/p2c/none/none\"");
    let closed = dir.join("closed.yaml");
    std::fs::write(
        &closed,
        format!(
            "seed: 1\nhardware_dir: {}\nfleet:\n  - {{ name: only, profile: constant-rate }}\n\
             traffic:\n  - poisson: {{ rate_per_s: 1, count: 10, prompt: {{ fixed: 1 }}, output: {{ fixed: 10 }} }}\n\
             \x20 - closed_loop: {{ users: 4, think_s: {{ fixed: 1 }}, count: 10, prompt: {{ fixed: 1 }}, output: {{ fixed: 10 }} }}\n",
            hardware()
        ),
    )
    .unwrap();
    let closed = closed.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--slo", "ttft_p99=2s"],
            "error: --slo: ttft_p99=2s: is not a bound; valid: comma-separated bounds",
        ),
        (
            &["--slo", "ttft_p99<=2s,ttfx_p99<=1s"],
            "error: --slo: ttfx_p99<=1s: unknown metric `ttfx`; valid: ttft, tpot, itl, e2el",
        ),
        (
            &["--slo", "ttft_p99<=-1s"],
            "error: --slo: ttft_p99<=-1s: -1 is not valid; expected a finite number > 0",
        ),
        (
            &["--slo", "ttft_p99<=2"],
            "error: --slo: ttft_p99<=2: `2` has no unit",
        ),
        (
            &["--slo", "ttft_p99<=2s", "--target", "1.5"],
            "error: --target: 1.5 is not valid; expected a fraction of requests in (0, 1]",
        ),
        (
            &["--slo", "ttft_p99<=2s", "--target", "0"],
            "error: --target: 0 is not valid; expected a fraction of requests in (0, 1]",
        ),
        (
            &["--slo", "ttft_p99<=2s", "--seeds", "0"],
            "error: command line: --seeds: 0 is not valid; valid: a whole number from 1 to 1000, or `auto`",
        ),
        (
            &["--slo", "ttft_p99<=2s", "--precision", "1.5"],
            "error: command line: --precision: 1.5 is not valid; expected a fraction > 0 and < 1, e.g. 0.02 for 2 %",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["capacity", sc.as_str()];
        args.extend_from_slice(extra);
        let o = routelab(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        assert!(
            text(&o).starts_with(expected),
            "{extra:?}: expected `{expected}`, got {}",
            text(&o)
        );
    }
    // A scenario whose load cannot be scaled: the error names the file and the source.
    let o = routelab(&["capacity", &closed, "--slo", "ttft_p99<=2s"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.starts_with(&format!(
            "error: {closed}: traffic[1].closed_loop: its load cannot be scaled"
        )),
        "{t}"
    );
    assert!(t.contains("valid: open-loop sources"), "{t}");
    // An SLO no load meets is an answer, not bad input: every policy is marked infeasible
    // (capacity 0) with where the search stopped and what failed there.
    let o = routelab(&[
        "capacity",
        &sc,
        "--slo",
        "e2el_p50<=10ms",
        "--seeds",
        "1",
        "--out",
        &dir.join("none").display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("infeasible on 1/1 seeds (counted as 0): the SLO does not hold even at load scale 0.015625 (1/64): e2el_p50 = ")
            && t.contains(" s > 0.0100 s"),
        "{t}"
    );
    let json = std::fs::read_to_string(dir.join("none").join("capacity.json")).unwrap();
    assert!(json.contains("\"scale\": 0.0"), "{json}");
}

/// `capacity --findings` writes its section of the findings document for every scenario it
/// studies, replaces it on the next run, and `compare --findings` regenerates the rest of the
/// document without losing it.
#[test]
fn the_capacity_section_of_the_findings_survives_both_generators() {
    let dir = scratch("capacity-findings");
    let a = ps_scenario(&dir, 2_000, "\"equal/p2c/none/none\", cache-aware");
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b = fleet_scenario(
        &b_dir,
        "- { name: w, profile: constant-rate, count: 2 }",
        2_000,
        "\"equal/p2c/none/none\"",
    );
    // Two scenarios with one name would share one part of the findings: name b apart.
    let yaml = std::fs::read_to_string(&b).unwrap();
    std::fs::write(
        &b,
        yaml.replace("name: test/capacity-ps", "name: test/capacity-pair"),
    )
    .unwrap();
    let findings = dir.join("findings.md");
    let capacity = |out: &str| {
        let o = routelab(&[
            "capacity",
            &a,
            &b,
            "--slo",
            "e2el_mean<=500ms",
            "--seeds",
            "2",
            "--out",
            &dir.join(out).display().to_string(),
            "--findings",
            &findings.display().to_string(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        std::fs::read_to_string(&findings).unwrap()
    };
    let first = capacity("c1");
    // Several scenarios: one numbered output directory each.
    for sub in ["1_test-capacity-ps", "2_test-capacity-pair"] {
        assert!(
            dir.join("c1").join(sub).join("capacity.json").is_file(),
            "{sub}"
        );
    }
    assert_eq!(first.matches("### test/capacity-p").count(), 2, "{first}");
    assert!(first.contains("| `cache-aware` | field |"), "{first}");
    assert!(first.contains("Ship `"), "{first}");
    let o = routelab(&[
        "compare",
        &a,
        "--seeds",
        "1",
        "--out",
        &dir.join("cmp").display().to_string(),
        "--findings",
        &findings.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let after_compare = std::fs::read_to_string(&findings).unwrap();
    assert!(after_compare.starts_with("# Findings"), "{after_compare}");
    let section = |doc: &str| {
        routelab_reports::findings::section(doc, routelab_reports::findings::CAPACITY)
            .map(str::to_string)
    };
    assert_eq!(section(&after_compare), section(&first));
    // A second capacity run replaces its section in place and keeps compare's part.
    let second = capacity("c2");
    assert_eq!(
        second, after_compare,
        "deterministic: the same section again"
    );
    assert_eq!(second.matches("routelab:capacity:begin").count(), 1);
    // Studying one scenario at another SLO adds a part beside the first; the rest stays.
    let o = routelab(&[
        "capacity",
        &b,
        "--slo",
        "e2el_mean<=300ms",
        "--seeds",
        "1",
        "--out",
        &dir.join("c3").display().to_string(),
        "--findings",
        &findings.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let third = std::fs::read_to_string(&findings).unwrap();
    let parts = |doc: &str| {
        routelab_reports::findings::sections_with_prefix(doc, "capacity/")
            .into_iter()
            .map(|(name, whole)| (name, whole.to_string()))
            .collect::<Vec<_>>()
    };
    let (before, after) = (parts(&second), parts(&third));
    assert_eq!(before.len(), 2);
    assert_eq!(after.len(), 3);
    assert_eq!(
        after[..2],
        before[..],
        "the earlier parts are kept as they were"
    );
    assert_eq!(
        after[2].0,
        "capacity/test/capacity-pair at e2el_mean<=300ms"
    );
}

/// `--baseline` names one of the scenario's own named policies (issue 38's paired ablations:
/// each term's row against the policy it ablates); a name that is neither a studied policy nor
/// a preset is a located error naming the scenario.
#[test]
fn the_baseline_can_be_a_scenarios_own_named_policy() {
    let dir = scratch("capacity-named-baseline");
    let sc = ps_scenario(
        &dir,
        2_000,
        "{ name: mine, preset: least-load }, \"equal/p2c/none/none\"",
    );
    let out = dir.join("out");
    let o = routelab(&[
        "capacity",
        &sc,
        "--slo",
        "e2el_mean<=500ms",
        "--seeds",
        "2",
        "--baseline",
        "mine",
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("capacity.json")).unwrap()).unwrap();
    assert_eq!(json["baseline"], "mine");
    let names: Vec<&str> = json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine", "equal/p2c/none/none"], "not added twice");
    let o = routelab(&[
        "capacity",
        &sc,
        "--slo",
        "e2el_mean<=500ms",
        "--baseline",
        "yours",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--baseline yours: not one of") && text(&o).contains("ps.yaml"),
        "{}",
        text(&o)
    );
}
