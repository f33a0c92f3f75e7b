//! `routelab compare`: paired differences from a baseline, `--seeds auto` and its stopping
//! reasons, and the flags' located errors.

use super::common::{routelab, text};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn scenario(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/seed")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn seeds_auto_says_what_stopped_it_and_pairs_against_the_baseline() {
    let dir = std::env::temp_dir().join(format!("routelab-compare-auto-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    let findings = dir.join("findings.md");
    let (out_s, findings_s) = (out.display().to_string(), findings.display().to_string());
    // sixteen-at-once is one deterministic burst: every seed gives the same differences, so
    // they are precise at the first look. identical-4090s is Poisson traffic whose TTFT p99
    // difference is wider than 5 % of the baseline's mean after 3 seeds: it runs to the
    // maximum, 4.
    let o = routelab(&[
        "compare",
        &scenario("sixteen-at-once.yaml"),
        &scenario("identical-4090s.yaml"),
        "--seeds",
        "auto",
        "--max-seeds",
        "4",
        "--baseline",
        "seed-v2",
        "--out",
        &out_s,
        "--findings",
        &findings_s,
    ]);
    // seed-v2 is not a policy of sixteen-at-once: a located error, exit 2.
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("command line: --baseline: `seed-v2` is not one of the policies compared on `seed/sixteen-at-once`; valid: `seed-v1`, `seed-v3`"),
        "{t}"
    );

    let o = routelab(&[
        "compare",
        &scenario("sixteen-at-once.yaml"),
        &scenario("identical-4090s.yaml"),
        "--policy",
        "seed-v1",
        "--policy",
        "seed-v2",
        "--baseline",
        "seed-v2",
        "--seeds",
        "auto",
        "--max-seeds",
        "4",
        "--out",
        &out_s,
        "--findings",
        &findings_s,
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    let sc = json["scenarios"].as_array().unwrap();
    assert_eq!(sc[0]["seed_stop"], "precise", "{}", sc[0]);
    assert_eq!(sc[0]["seeds_run"], 3);
    assert_eq!(sc[1]["seed_stop"], "max_seeds", "{}", sc[1]);
    assert_eq!(sc[1]["seeds_run"], 4);
    assert_eq!(sc[1]["auto_seeds"]["rel_half_width"], 0.05);
    for s in sc {
        assert_eq!(s["baseline"], "seed-v2");
        let v1 = &s["policies"][0];
        assert_eq!(v1["policy"], "seed-v1");
        let seeds = v1["seeds"].as_array().unwrap().len();
        assert_eq!(seeds, s["seeds_run"].as_u64().unwrap() as usize);
        let d = v1["vs_baseline"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["metric"] == "ttft_p99_s")
            .unwrap();
        assert_eq!(
            d["n"].as_u64().unwrap() as usize,
            seeds,
            "paired on every seed"
        );
        assert!(s["policies"][1].get("vs_baseline").is_none());
    }
    assert!(
        t.contains("seeds: 4 seeds (--seeds auto: stopped at the maximum of 4 seeds"),
        "{t}"
    );
    assert!(t.contains("vs baseline seed-v2:"), "{t}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("stopped at the maximum of 4 seeds"));
    assert!(html.contains("Paired difference from the baseline, seed-v2"));
    let md = std::fs::read_to_string(&findings).unwrap();
    assert!(
        md.contains("| seed/identical-4090s | seed-v2 | 4 | auto: maximum count reached |"),
        "{md}"
    );
    assert!(
        md.contains(
            "| seed/sixteen-at-once | seed-v2 | 3 | auto: every difference precise enough |"
        ),
        "{md}"
    );
}

#[test]
fn bad_seed_flags_are_located_errors_with_exit_2() {
    let s = scenario("sixteen-at-once.yaml");
    for (args, says) in [
        (
            vec!["--seeds", "0"],
            "command line: --seeds: 0 is not valid",
        ),
        (
            vec!["--seeds", "some"],
            "command line: --seeds: `some` is not a number of seeds",
        ),
        (
            vec!["--seeds", "auto", "--precision", "2"],
            "command line: --precision: 2 is not valid; expected a fraction > 0 and < 1",
        ),
        (
            vec!["--seeds", "3", "--max-seeds", "9"],
            "command line: --max-seeds: applies only with `--seeds auto`",
        ),
    ] {
        let mut argv = vec!["compare", s.as_str(), "--out", "/nonexistent/never-written"];
        argv.extend(args.iter().copied());
        let o = routelab(&argv);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

#[test]
fn seeds_auto_gives_the_same_bytes_on_one_and_two_threads() {
    let dir = std::env::temp_dir().join(format!("routelab-compare-threads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut files = Vec::new();
    for threads in ["1", "2"] {
        let out = dir.join(threads);
        let out_s = out.display().to_string();
        let o = Command::new(env!("CARGO_BIN_EXE_routelab"))
            .args([
                "compare",
                &scenario("distant-node.yaml"),
                "--seeds",
                "auto",
                "--max-seeds",
                "5",
                "--out",
                &out_s,
            ])
            .env("RAYON_NUM_THREADS", threads)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("the binary runs");
        assert!(o.status.success(), "{}", text(&o));
        files.push(
            [
                "compare.json",
                "compare.csv",
                "compare_seeds.csv",
                "report.html",
            ]
            .map(|f| std::fs::read(out.join(f)).unwrap()),
        );
    }
    assert!(
        files[0] == files[1],
        "--seeds auto depends on the thread count"
    );
}
