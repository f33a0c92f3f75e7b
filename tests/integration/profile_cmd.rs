//! `routelab profile fit` / `profile show` and profiles found through `ROUTELAB_HARDWARE`.

use super::common::{routelab, scratch, text};
use std::path::Path;
use std::process::{Command, Output};

const DATA: &str = "tests/data/profiles";

fn vllm_files() -> Vec<String> {
    [1, 2, 4, 8, 16]
        .iter()
        .map(|c| format!("{DATA}/vllm-bench/c{c}.json"))
        .collect()
}

/// `routelab ARGS` run in `dir` with `ROUTELAB_HARDWARE` set to `env` (or removed).
fn routelab_in(dir: &Path, env: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_routelab"));
    cmd.args(args).current_dir(dir);
    match env {
        Some(e) => cmd.env("ROUTELAB_HARDWARE", e),
        None => cmd.env_remove("ROUTELAB_HARDWARE"),
    };
    cmd.output().expect("the binary runs")
}

/// Asserts exit code 2 and that stderr holds every `needle`.
fn bad_input(o: &Output, needles: &[&str]) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for n in needles {
        assert!(t.contains(n), "missing `{n}` in: {t}");
    }
}

#[test]
fn fit_from_each_source_writes_a_profile_that_show_reads() {
    let dir = scratch("profile-fit-sources");
    let vllm = vllm_files();
    let mut cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "csv",
            vec![
                "--from".into(),
                "csv".into(),
                format!("{DATA}/measured.csv"),
            ],
            "372.0",
        ),
        // the runs' prompts' prefill subtracted (issue 15): 284.4, not the measured 248.2
        ("vllm", vec!["--from".into(), "vllm-bench".into()], "284.4"),
        (
            "gateway",
            vec![
                "--from".into(),
                "gateway".into(),
                format!("{DATA}/gateway-capacity.json"),
                "--worker".into(),
                "pro6000".into(),
            ],
            "398.0",
        ),
    ];
    cases[1].1.extend(vllm);
    for (name, mut args, top) in cases {
        let out = dir.join(format!("{name}.yaml"));
        args.splice(0..0, ["profile".to_string(), "fit".to_string()]);
        args.extend([
            "--name".into(),
            format!("my-{name}"),
            "--max-running".into(),
            "48".into(),
            "--out".into(),
            out.display().to_string(),
        ]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = routelab(&argv);
        let t = text(&o);
        assert!(o.status.success(), "{name}: {t}");
        assert!(t.contains(&format!("my-{name}  (fitted:my-{name})")), "{t}");
        let yaml = std::fs::read_to_string(&out).unwrap();
        assert!(
            yaml.contains("fitted:\n") && yaml.contains("sources:\n"),
            "{yaml}"
        );
        assert!(yaml.contains("max_running: 48"), "{yaml}");

        let show = routelab(&[
            "profile",
            "show",
            &out.display().to_string(),
            "--out",
            &dir.join(format!("{name}-chart")).display().to_string(),
        ]);
        let t = text(&show);
        assert!(show.status.success(), "{t}");
        // the last measured point is on the curve and held flat up to max_running
        let row48 = t
            .lines()
            .find(|l| l.trim_start().starts_with("48 "))
            .unwrap_or_else(|| panic!("no row at 48: {t}"));
        assert!(row48.contains(top), "{name}: {row48}");
        assert!(
            dir.join(format!("{name}-chart/profile-my-{name}.png"))
                .is_file()
        );
    }
}

#[test]
fn fit_prints_the_yaml_without_out() {
    let o = routelab(&[
        "profile",
        "fit",
        "--from",
        "csv",
        &format!("{DATA}/measured.csv"),
        "--name",
        "printed",
        "--context-window",
        "16384",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let y = String::from_utf8_lossy(&o.stdout);
    assert!(
        y.starts_with("# Fitted by `routelab profile fit --from csv`"),
        "{y}"
    );
    assert!(y.contains("name: \"printed\"\n") && y.contains("context_window: 16384\n"));
    // the 88 tok/s cold burst against the fitted 320.2 tok/s at 16
    assert!(
        y.contains("cold_start: {speed_factor: 0.2748, warmup_tokens: 3056}"),
        "{y}"
    );
}

#[test]
fn show_prints_the_curve_with_units_and_the_fields() {
    let dir = scratch("profile-show");
    let o = routelab(&[
        "profile",
        "show",
        "mac-m2-ultra-27b",
        "--out",
        &dir.display().to_string(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0],
        "mac-m2-ultra-27b  (scenarios/hardware/mac-m2-ultra-27b.yaml)"
    );
    assert!(
        t.contains("decode curve (parametric: 30.00 tok/s at 1, half-way to 39.50 tok/s at 4.00)")
    );
    assert!(t.contains("concurrency  aggregate (tok/s)  per request (tok/s)  step time (ms)"));
    // agg(8) = 30 + 9.5 x 7 / 10 = 36.65 tok/s: 4.581 per request, 218.3 ms a step
    let row8 = lines
        .iter()
        .find(|l| l.trim_start().starts_with("8 "))
        .unwrap();
    assert_eq!(
        row8.split_whitespace().collect::<Vec<_>>(),
        ["8", "36.65", "4.581", "218.3"]
    );
    assert!(t.contains("max_running           8 sequences"), "{t}");
    assert!(
        t.contains("rates x 0.80 until 512 tokens of work since ready"),
        "{t}"
    );
    let svg = std::fs::read_to_string(dir.join("profile-mac-m2-ultra-27b.svg")).unwrap();
    assert!(svg.contains("Aggregate decode throughput"));
}

#[test]
fn a_scenario_anywhere_finds_profiles_bundled_by_path_and_in_routelab_hardware() {
    let dir = scratch("profile-env");
    let envdir = dir.join("site-profiles");
    std::fs::create_dir_all(&envdir).unwrap();
    let fitted = routelab(&[
        "profile",
        "fit",
        "--from",
        "csv",
        &format!("{DATA}/measured.csv"),
        "--name",
        "site-gpu",
        "--out",
        &envdir.join("site-gpu.yaml").display().to_string(),
    ]);
    assert!(fitted.status.success(), "{}", text(&fitted));
    std::fs::write(
        dir.join("s.yaml"),
        "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: site-gpu }\n  - { name: b, profile: \
         rtx-pro-6000-27b }\n  - { name: c, profile: site-profiles/site-gpu.yaml }\ntraffic:\n  \
         - poisson: { rate_per_s: 1, duration_s: 10, prompt: { fixed: 100 }, output: { fixed: 10 } \
         }\npolicies: [seed-v1]\n",
    )
    .unwrap();
    let o = routelab_in(&dir, Some(&envdir), &["validate", "s.yaml"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("3 workers"));

    let o = routelab_in(&dir, None, &["validate", "s.yaml"]);
    bad_input(
        &o,
        &[
            "s.yaml:4:",
            "fleet[0].profile",
            "no hardware profile `site-gpu`",
            "the profiles bundled into routelab",
            "ROUTELAB_HARDWARE (not set)",
            "rtx-pro-6000-27b",
        ],
    );

    // Run from the scenario's own directory (`cd scenarios/mine && routelab validate x.yaml`):
    // the walk goes on above the current directory and finds `scenarios/hardware`.
    let hw = dir.join("proj/scenarios/hardware");
    let mine = dir.join("proj/scenarios/mine");
    std::fs::create_dir_all(&hw).unwrap();
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::copy(envdir.join("site-gpu.yaml"), hw.join("site-gpu.yaml")).unwrap();
    std::fs::write(
        mine.join("x.yaml"),
        "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: site-gpu }\ntraffic:\n  - poisson: \
         { rate_per_s: 1, duration_s: 10, prompt: { fixed: 100 }, output: { fixed: 10 } }\n\
         policies: [seed-v1]\n",
    )
    .unwrap();
    let o = routelab_in(&mine, None, &["validate", "x.yaml"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn bad_measurement_files_are_located_errors() {
    let dir = scratch("profile-bad");
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let fit = |from: &str, files: &[String], extra: &[&str]| {
        let mut args = vec!["profile", "fit", "--from", from, "--name", "x"];
        args.extend(files.iter().map(String::as_str));
        args.extend(extra);
        routelab(&args)
    };
    let csv = |name: &str, body: &str| vec![write(name, body)];

    let f = csv("dup.csv", "concurrency,aggregate_tok_s\n1,10\n4,30\n4,31\n");
    bad_input(
        &fit("csv", &f, &[]),
        &[
            "dup.csv:4",
            "concurrency",
            "not greater",
            "strictly increasing",
        ],
    );
    let f = csv("neg.csv", "concurrency,aggregate_tok_s\n1,10\n2,-3\n");
    bad_input(
        &fit("csv", &f, &[]),
        &["neg.csv:3", "aggregate_tok_s", "a finite number > 0"],
    );
    let f = csv("nan.csv", "concurrency,aggregate_tok_s\n1,NaN\n");
    bad_input(
        &fit("csv", &f, &[]),
        &["nan.csv:2", "aggregate_tok_s", "NaN"],
    );
    let f = csv("col.csv", "concurrency,tok_s\n1,10\n");
    bad_input(
        &fit("csv", &f, &[]),
        &[
            "col.csv:1",
            "unknown column `tok_s`",
            "concurrency,aggregate_tok_s",
        ],
    );
    let f = csv("nocol.csv", "concurrency\n1\n");
    bad_input(
        &fit("csv", &f, &[]),
        &["nocol.csv:1", "missing column `aggregate_tok_s`"],
    );

    let f = csv("array.json", "[{\"max_concurrency\": 1}]\n");
    bad_input(
        &fit("vllm-bench", &f, &[]),
        &[
            "array.json:1:1",
            "a JSON array",
            "vllm bench serve --save-result",
        ],
    );
    let c1 = std::fs::read_to_string(format!("{DATA}/vllm-bench/c1.json")).unwrap();
    let f = csv(
        "noout.json",
        &c1.replace("\"output_throughput\"", "\"output_tput\""),
    );
    bad_input(
        &fit("vllm-bench", &f, &[]),
        &["noout.json", "output_throughput", "missing field"],
    );
    let f = csv(
        "rate.json",
        &c1.replace("\"max_concurrency\": 1,", "\"max_concurrency\": null,"),
    );
    bad_input(
        &fit("vllm-bench", &f, &[]),
        &["rate.json:11:", "max_concurrency", "--max-concurrency"],
    );

    let g = std::fs::read_to_string(format!("{DATA}/gateway-capacity.json")).unwrap();
    let f = csv(
        "schema.json",
        &g.replace("routelab-gateway-capacity/1", "routelab-gateway-capacity/2"),
    );
    bad_input(
        &fit("gateway", &f, &["--worker", "pro6000"]),
        &["schema.json:2:", "schema", "routelab-gateway-capacity/1"],
    );
    let f = vec![format!("{DATA}/gateway-capacity.json")];
    bad_input(
        &fit("gateway", &f, &[]),
        &["2 workers", "--worker one of: pro6000, mac"],
    );
    bad_input(
        &fit("gateway", &f, &["--worker", "h100"]),
        &["no worker `h100`", "pro6000, mac"],
    );
}

/// The step-model flags: `--pure-decode` keeps the closed-loop figures, `--mixed-step` fits
/// and writes the overlap, and bad values are located errors with exit code 2.
#[test]
fn step_model_flags_are_written_or_refused() {
    let vllm = vllm_files();
    let fit = |extra: &[&str]| {
        let mut args = vec!["profile", "fit", "--from", "vllm-bench", "--name", "x"];
        args.extend(vllm.iter().map(String::as_str));
        args.extend(extra);
        routelab(&args)
    };
    let o = fit(&["--pure-decode"]);
    assert!(o.status.success(), "{}", text(&o));
    let y = String::from_utf8_lossy(&o.stdout);
    assert!(y.contains("decode aggregate from pure-decode rows"), "{y}");
    assert!(
        y.contains("- {concurrency: 16, aggregate_tok_s: 248.174}"),
        "{y}"
    );

    // 16 decoding (about 57 ms alone on the fitted curve) beside 512 prompt tokens (152.31 ms
    // alone): 170 ms is an overlap of about 0.69
    let o = fit(&["--mixed-step", "16:512:170"]);
    assert!(o.status.success(), "{}", text(&o));
    let y = String::from_utf8_lossy(&o.stdout);
    assert!(
        y.contains("from one mixed step (--mixed-step): 16 sequences"),
        "{y}"
    );
    let overlap: f64 = y
        .lines()
        .find_map(|l| l.strip_prefix("prefill_overlap: "))
        .expect("written")
        .parse()
        .unwrap();
    assert!(overlap > 0.6 && overlap < 0.75, "{overlap}");

    bad_input(
        &fit(&["--prefill-overlap", "1.5"]),
        &[
            "--prefill-overlap",
            "1.5 is not valid",
            "a number from 0 to 1",
        ],
    );
    bad_input(
        &fit(&["--mixed-step", "16:512"]),
        &[
            "--mixed-step",
            "not three numbers",
            "N:PROMPT_TOKENS:STEP_MS",
        ],
    );
    bad_input(
        &fit(&["--mixed-step", "16:512:20"]),
        &[
            "--mixed-step",
            "cannot carry",
            "between the longer part alone",
        ],
    );
    bad_input(
        &fit(&["--mixed-step", "16:512:170", "--prefill-overlap", "0.5"]),
        &["--prefill-overlap", "given with --mixed-step"],
    );
}

#[test]
fn show_of_an_unknown_profile_lists_the_places_looked_in() {
    let o = routelab(&["profile", "show", "rtx-9999"]);
    bad_input(
        &o,
        &[
            "PROFILE",
            "no hardware profile `rtx-9999`",
            "scenarios/hardware",
            "the profiles bundled into routelab",
            "h100-27b, mac-m2-ultra-27b",
        ],
    );
}

/// A profile whose decode step time falls as the batch grows, or whose overlap is not a
/// share, is a located error with exit code 2 wherever it is read (here: `profile show`).
#[test]
fn a_bad_step_time_table_or_overlap_is_located() {
    let dir = scratch("profile-step-rules");
    let good = std::fs::read_to_string("scenarios/hardware/rtx-pro-6000-27b.yaml").unwrap();
    let falling = good.replace(
        "{ concurrency: 32, aggregate_tok_s: 1440 }",
        "{ concurrency: 32, aggregate_tok_s: 2400 }",
    );
    assert_ne!(falling, good);
    std::fs::write(dir.join("falling.yaml"), falling).unwrap();
    let o = routelab_in(&dir, None, &["profile", "show", "falling.yaml"]);
    bad_input(
        &o,
        &[
            "falling.yaml",
            "decode.points[3].aggregate_tok_s",
            "step time falls",
            "per-request speed may not rise",
        ],
    );
    std::fs::write(
        dir.join("overlap.yaml"),
        format!("{good}prefill_overlap: 1.2\n"),
    )
    .unwrap();
    let o = routelab_in(&dir, None, &["profile", "show", "overlap.yaml"]);
    bad_input(&o, &["overlap.yaml", "prefill_overlap", "[0, 1]"]);
}

/// Issue 29: `profile fit` reports its own error — every input point against what the fitted
/// profile gives (the closed loops simulated back) — warns on a KV size and a running limit
/// below what the engine held, and takes `--gpu-names`.
#[test]
fn fit_reports_each_points_error_warns_on_kv_and_takes_gpu_names() {
    let dir = scratch("profile-check");
    let out = dir.join("p.yaml");
    let mut args = vec![
        "profile",
        "fit",
        "--from",
        "vllm-bench",
        "--name",
        "checked",
        "--out",
        out.to_str().unwrap(),
        "--kv-capacity-tokens",
        "4096",
        "--context-window",
        "2048",
        "--max-running",
        "8",
        "--gpu-names",
        "RTX 4090, RTX 4090",
    ];
    let files = vllm_files();
    args.extend(files.iter().map(String::as_str));
    let o = routelab(&args);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("fit check"), "{t}");
    for c in [1, 2, 4, 8, 16] {
        let row = t
            .lines()
            .find(|l| l.contains(&format!("c{c}.json")) && l.contains("closed-loop output tok/s"))
            .unwrap_or_else(|| panic!("no error row for c{c}: {t}"));
        assert!(row.trim_end().ends_with('%'), "{row}");
    }
    // 16 clients of 512 + 256 tokens held 12,288 tokens of KV
    assert!(
        t.contains("warning: kv_capacity_tokens 4096 cannot hold the measured concurrency"),
        "{t}"
    );
    assert!(
        t.contains("warning: max_running 8 is below the measured concurrency 16"),
        "{t}"
    );
    let y = std::fs::read_to_string(&out).unwrap();
    assert!(y.contains("gpu_names: [\"RTX 4090\", \"RTX 4090\"]"), "{y}");
}

/// Issue 29, trap 6: a TTFT in seconds declared as ms made a 1.7 M tok/s prefill without a
/// word; a point corrected by more than 25 % passed silently too. Both warn, with the threshold.
#[test]
fn implausible_units_and_large_corrections_are_warned_about() {
    let dir = scratch("profile-units");
    let c1 = std::fs::read_to_string(format!("{DATA}/vllm-bench/c1.json")).unwrap();
    let seconds = dir.join("c1.json");
    std::fs::write(
        &seconds,
        c1.replace("\"mean_ttft_ms\": 152.31", "\"mean_ttft_ms\": 0.15231"),
    )
    .unwrap();
    let mut files = vec![seconds.display().to_string()];
    files.extend(vllm_files().into_iter().skip(1));
    let mut args = vec!["profile", "fit", "--from", "vllm-bench", "--name", "u"];
    args.extend(files.iter().map(String::as_str));
    let o = routelab(&args);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("x the single-sequence decode speed (more than 1000 x")
            && t.contains("in seconds rather than milliseconds"),
        "{t}"
    );
    // the untouched files give no such warning
    let mut args = vec!["profile", "fit", "--from", "vllm-bench", "--name", "u"];
    let good = vllm_files();
    args.extend(good.iter().map(String::as_str));
    let t = text(&routelab(&args));
    assert!(!t.contains("rather than milliseconds"), "{t}");

    let csv = dir.join("bent.csv");
    std::fs::write(&csv, "concurrency,aggregate_tok_s\n1,100\n2,60\n4,400\n").unwrap();
    let o = routelab(&[
        "profile",
        "fit",
        "--from",
        "csv",
        csv.to_str().unwrap(),
        "--name",
        "bent",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("warning: decode.points[1] (concurrency 2) was corrected by")
            && t.contains("more than 25 %"),
        "{t}"
    );
}
