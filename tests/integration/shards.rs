//! `--shard K/N` and `routelab merge`: N shards run as separate processes and merged write
//! exactly what the whole command writes (every file but `perf.json`, byte for byte), print the
//! same console output and return the same exit code; merge refuses partials that do not
//! belong together, naming them.

use crate::common::{routelab, scratch, text};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const CRASH: &str = "scenarios/ci/crash.yaml";
const AZURE: &str = "scenarios/ci/azure-conv-slice.yaml";

/// Every file under `dir` (relative path → bytes), `perf.json` aside.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != "perf.json") {
                files.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    files
}

/// stdout without the wall-clock line `compare` ends with (timing, like `perf.json`).
fn console(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| match l.find(" requests simulated in ") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Run `args` as N shard processes at once (all started, then all awaited), each writing
/// `partials/shard-K.json`, and merge them (merge writes where the command would, since the
/// partials record its arguments).
fn shards_then_merge(args: &[String], n: u32, partials: &Path) -> Output {
    let running: Vec<_> = (1..=n)
        .map(|k| {
            Command::new(env!("CARGO_BIN_EXE_routelab"))
                .args(args)
                .arg("--shard")
                .arg(format!("{k}/{n}"))
                .arg("--partial")
                .arg(partials.join(format!("shard-{k}.json")))
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the binary starts")
        })
        .collect();
    let children: Vec<Output> = running
        .into_iter()
        .map(|c| c.wait_with_output().expect("the shard finishes"))
        .collect();
    for (k, o) in children.iter().enumerate() {
        assert!(o.status.success(), "shard {}/{n}: {}", k + 1, text(o));
        let said = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            said.lines().count(),
            1,
            "one line naming the partial: {said}"
        );
        assert!(said.starts_with("partial: "), "{said}");
    }
    let mut merge = vec!["merge".to_string()];
    // In reverse order: the merge does not depend on the order it is given the partials.
    merge.extend((1..=n).rev().map(|k| {
        partials
            .join(format!("shard-{k}.json"))
            .display()
            .to_string()
    }));
    let refs: Vec<&str> = merge.iter().map(String::as_str).collect();
    routelab(&refs)
}

/// The whole command's outputs in `out`, then for each N the merged shards' in the same place:
/// every file, the console and the exit code agree.
fn same_as_whole(name: &str, args: &[&str], out: &Path, ns: &[u32]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let whole = routelab(&refs);
    assert!(
        whole.status.code().is_some_and(|c| c < 2),
        "{name}: {}",
        text(&whole)
    );
    let expected = tree(out);
    assert!(
        expected.len() >= 2,
        "{name}: the whole run wrote {:?}",
        expected.keys()
    );
    std::fs::remove_dir_all(out).unwrap();
    for &n in ns {
        let partials = out.with_extension(format!("partials-{n}"));
        let merged = shards_then_merge(&args, n, &partials);
        assert_eq!(
            merged.status.code(),
            whole.status.code(),
            "{name} N={n}: {}",
            text(&merged)
        );
        assert_eq!(console(&merged), console(&whole), "{name} N={n}");
        assert_eq!(
            String::from_utf8_lossy(&merged.stderr),
            String::from_utf8_lossy(&whole.stderr),
            "{name} N={n}"
        );
        let got = tree(out);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{name} N={n}"
        );
        for (file, bytes) in &expected {
            assert!(
                got[file] == *bytes,
                "{name} N={n}: {} differs",
                file.display()
            );
        }
        std::fs::remove_dir_all(out).unwrap();
    }
    whole
}

#[test]
fn compare_with_fixed_seeds_merges_to_the_whole_run_for_1_2_3_and_7_shards() {
    let dir = scratch("shards-compare");
    let out = dir.join("out");
    let (o, f) = (
        out.display().to_string(),
        out.join("findings.md").display().to_string(),
    );
    same_as_whole(
        "compare",
        &[
            "compare",
            CRASH,
            AZURE,
            "--policy",
            "seed-v1",
            "--policy",
            "seed-v3",
            "--seeds",
            "2",
            "--out",
            &o,
            "--findings",
            &f,
        ],
        &out,
        &[1, 2, 3, 7],
    );
}

#[test]
fn compare_with_auto_seeds_merges_to_the_whole_run() {
    let dir = scratch("shards-compare-auto");
    let out = dir.join("out");
    let o = out.display().to_string();
    // A precision no scenario reaches: each grows past its first 3 seeds, to the maximum.
    let whole = same_as_whole(
        "compare --seeds auto",
        &[
            "compare",
            CRASH,
            AZURE,
            "--policy",
            "seed-v1",
            "--policy",
            "seed-next",
            "--seeds",
            "auto",
            "--max-seeds",
            "5",
            "--precision",
            "0.001",
            "--out",
            &o,
        ],
        &out,
        &[1, 2, 3],
    );
    let said = console(&whole);
    assert!(
        said.contains("ci/crash (5 seeds)") && said.contains("ci/azure-conv-slice (5 seeds)"),
        "{said}"
    );
}

#[test]
fn capacity_with_auto_seeds_merges_to_the_whole_run() {
    let dir = scratch("shards-capacity-auto");
    let out = dir.join("out");
    let o = out.display().to_string();
    let whole = same_as_whole(
        "capacity --seeds auto",
        &[
            "capacity",
            CRASH,
            AZURE,
            "--policy",
            "seed-v3",
            "--slo",
            "ttft_p99<=2s",
            "--seeds",
            "auto",
            "--precision",
            "0.2",
            "--out",
            &o,
        ],
        &out,
        &[1, 2],
    );
    assert!(
        console(&whole).contains("--seeds auto"),
        "{}",
        console(&whole)
    );
}

#[test]
fn sweep_merges_to_the_whole_run() {
    let dir = scratch("shards-sweep");
    let out = dir.join("out");
    let o = out.display().to_string();
    same_as_whole(
        "sweep",
        &[
            "sweep",
            CRASH,
            "--set",
            "traffic[0].poisson.rate_per_s=2,4",
            "--policy",
            "seed-v1",
            "--policy",
            "seed-v3",
            "--seeds",
            "2",
            "--out",
            &o,
        ],
        &out,
        &[1, 3, 7],
    );
}

#[test]
fn capacity_merges_to_the_whole_run() {
    let dir = scratch("shards-capacity");
    let out = dir.join("out");
    let (o, f) = (
        out.display().to_string(),
        out.join("findings.md").display().to_string(),
    );
    same_as_whole(
        "capacity",
        &[
            "capacity",
            CRASH,
            "--policy",
            "seed-v3",
            "--slo",
            "ttft_p99<=2s",
            "--seeds",
            "2",
            "--precision",
            "0.2",
            "--out",
            &o,
            "--findings",
            &f,
        ],
        &out,
        &[1, 2, 3],
    );
}

/// A suite of one CI scenario on two seeds, with the committed baseline (measured on three
/// seeds, so the gate may well fail: the exit code must agree either way).
fn small_suite(dir: &Path) -> (PathBuf, PathBuf) {
    let suite = dir.join("suite");
    let baselines = dir.join("baselines");
    std::fs::create_dir_all(&suite).unwrap();
    std::fs::create_dir_all(&baselines).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::write(
        suite.join("suite.yaml"),
        format!(
            "seeds: [1, 2]\nscenarios:\n  - {}\ninvariants:\n  - {{ scenario: ci/crash, policy: \"*\", metric: lost, op: \"==\", value: 0, why: \"none lost\" }}\n",
            root.join(CRASH).display()
        ),
    )
    .unwrap();
    std::fs::copy(
        root.join("baselines/ci__crash.json"),
        baselines.join("ci__crash.json"),
    )
    .unwrap();
    (suite, baselines)
}

#[test]
fn check_merges_to_the_whole_run_with_its_exit_code() {
    let dir = scratch("shards-check");
    let (suite, baselines) = small_suite(&dir);
    let (s, b) = (suite.display().to_string(), baselines.display().to_string());
    // The gate writes no files: the console (report on stdout, verdict on stderr for JSON)
    // and the exit code are its output.
    for format in ["table", "json"] {
        let args: Vec<String> = [
            "check",
            "--suite",
            &s,
            "--baselines",
            &b,
            "--format",
            format,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let whole = routelab(&refs);
        assert!(
            whole.status.code().is_some_and(|c| c < 2),
            "{}",
            text(&whole)
        );
        assert!(!whole.stdout.is_empty());
        for n in [1, 3] {
            let merged = shards_then_merge(&args, n, &dir.join(format!("partials-{format}-{n}")));
            assert_eq!(
                merged.status.code(),
                whole.status.code(),
                "{format} N={n}: {}",
                text(&merged)
            );
            assert_eq!(merged.stdout, whole.stdout, "{format} N={n}");
            assert_eq!(merged.stderr, whole.stderr, "{format} N={n}");
        }
    }
    // `--update` through merge writes the baselines the whole `--update` writes.
    let update: Vec<String> = ["check", "--suite", &s, "--baselines", &b, "--update"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let refs: Vec<&str> = update.iter().map(String::as_str).collect();
    let whole = routelab(&refs);
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole));
    let written = std::fs::read(baselines.join("ci__crash.json")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci__crash.json"),
        baselines.join("ci__crash.json"),
    )
    .unwrap();
    let merged = shards_then_merge(&update, 2, &dir.join("partials-update"));
    assert_eq!(merged.status.code(), Some(0), "{}", text(&merged));
    assert_eq!(
        std::fs::read(baselines.join("ci__crash.json")).unwrap(),
        written
    );
}

/// Two shards of a compare of `scenario` into `dir`, with `extra` options on shard 2 only.
fn two_shards(dir: &Path, scenario: &str, extra2: &[&str]) -> (String, String) {
    let mut files = Vec::new();
    for k in 1..=2 {
        let partial = dir.join(format!("p{k}.json")).display().to_string();
        let mut args = vec![
            "compare", scenario, "--policy", "seed-v1", "--seeds", "1", "--shard",
        ];
        let shard = format!("{k}/2");
        args.push(&shard);
        args.extend(["--partial", &partial]);
        if k == 2 {
            args.extend(extra2);
        }
        let o = routelab(&args);
        assert!(o.status.success(), "{}", text(&o));
        files.push(partial);
    }
    (files[0].clone(), files[1].clone())
}

fn refused(args: &[&str], says: &[&str]) {
    let o = routelab(args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    for s in says {
        assert!(t.contains(s), "expected `{s}` in: {t}");
    }
}

#[test]
fn merge_refuses_partials_from_different_inputs_naming_them() {
    let dir = scratch("shards-refuse-inputs");
    // One option changed on one shard.
    let (a, b) = two_shards(&dir, CRASH, &["--baseline", "seed-v1"]);
    refused(
        &["merge", &a, &b],
        &[&format!("{a} and {b} were made from different inputs")],
    );

    // One byte of the scenario changed between the shards.
    let scenario = dir.join("crash.yaml");
    let original =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(CRASH)).unwrap();
    std::fs::write(&scenario, &original).unwrap();
    let s = scenario.display().to_string();
    let p1 = dir.join("s1.json").display().to_string();
    let p2 = dir.join("s2.json").display().to_string();
    let run = |k: &str, p: &str| {
        let o = routelab(&[
            "compare",
            &s,
            "--policy",
            "seed-v1",
            "--seeds",
            "1",
            "--shard",
            k,
            "--partial",
            p,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    };
    run("1/2", &p1);
    std::fs::write(&scenario, original.replacen("# CI", "# ci", 1)).unwrap();
    run("2/2", &p2);
    refused(
        &["merge", &p1, &p2],
        &[&format!("{p1} and {p2} were made from different inputs")],
    );

    // The shards agree, but the input changed before the merge.
    std::fs::write(&scenario, &original).unwrap();
    run("2/2", &p2);
    std::fs::write(&scenario, original.replacen("# CI", "# Ci", 1)).unwrap();
    refused(
        &["merge", &p1, &p2],
        &["the inputs or options changed since the shards ran"],
    );
}

#[test]
fn merge_reports_missing_duplicate_and_malformed_partials() {
    let dir = scratch("shards-refuse-set");
    let partial = |k: u32| {
        dir.join(format!("shard-{k}-of-3.json"))
            .display()
            .to_string()
    };
    for k in [1, 3] {
        let p = partial(k);
        let shard = format!("{k}/3");
        let o = routelab(&[
            "compare",
            CRASH,
            "--policy",
            "seed-v1",
            "--seeds",
            "3",
            "--shard",
            &shard,
            "--partial",
            &p,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    refused(
        &["merge", &partial(1), &partial(3)],
        &["missing shards 2 of 3"],
    );
    let copy = dir.join("copy.json").display().to_string();
    std::fs::copy(partial(1), &copy).unwrap();
    refused(
        &["merge", &partial(1), &partial(3), &copy],
        &[&format!(
            "shard 1/3 is given twice: {} and {copy}",
            partial(1)
        )],
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"routelab_partial\": 1, \"command\": 3}").unwrap();
    let b = bad.display().to_string();
    refused(
        &["merge", &b, &partial(1)],
        &[&format!("{b}:1:"), "command", "a partial result written by"],
    );
    let nothing = dir.join("absent.json").display().to_string();
    refused(&["merge", &nothing], &[&nothing]);
}

#[test]
fn shard_errors_are_located_with_exit_2() {
    for (shard, says) in [
        ("0/3", "count from 1"),
        ("4/3", "does not exist"),
        ("2", "form K/N"),
        ("x/2", "whole numbers"),
    ] {
        for cmd in [
            &["compare", CRASH][..],
            &["sweep", CRASH, "--set", "traffic[0].poisson.rate_per_s=2"][..],
            &["capacity", CRASH, "--slo", "ttft_p99<=2s"][..],
            &["check"][..],
        ] {
            let mut args = cmd.to_vec();
            args.extend(["--shard", shard]);
            refused(&args, &["command line", "--shard", says, "1 <= K <= N"]);
        }
    }
    // `--partial` means nothing without `--shard`.
    refused(&["compare", CRASH, "--partial", "p.json"], &["--shard"]);
}

/// Two shards of `compare SCENARIO --policy seed-v1 --seeds 3` into `dir` (shard 1 runs seed
/// ordinals 0 and 2, shard 2 ordinal 1); the partials' paths.
fn three_seeds_two_shards(dir: &Path, scenario: &str) -> [String; 2] {
    [1, 2].map(|k| {
        let p = dir.join(format!("part{k}.json")).display().to_string();
        let shard = format!("{k}/2");
        let o = routelab(&[
            "compare",
            scenario,
            "--policy",
            "seed-v1",
            "--seeds",
            "3",
            "--shard",
            &shard,
            "--partial",
            &p,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        p
    })
}

#[test]
fn merge_refuses_a_profile_or_trace_changed_after_the_shards_ran() {
    let dir = scratch("shards-refuse-reads");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let profile =
        std::fs::read_to_string(root.join("scenarios/hardware/rtx5090-27b.yaml")).unwrap();
    std::fs::write(dir.join("hw.yaml"), &profile).unwrap();
    let trace: String = std::fs::read_to_string(
        root.join("data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    )
    .unwrap()
    .lines()
    .take(400)
    .map(|l| format!("{l}\n"))
    .collect();
    std::fs::write(dir.join("trace.csv"), &trace).unwrap();
    let scenario = dir.join("local.yaml");
    std::fs::write(
        &scenario,
        "name: local\nmodel: gemma-27b\nfleet:\n  - { name: a, profile: ./hw.yaml, count: 2 }\n\
         traffic:\n  - trace: { path: trace.csv, format: azure, limit: 200 }\npolicies: [seed-v1]\n",
    )
    .unwrap();
    let [p1, p2] = three_seeds_two_shards(&dir, &scenario.display().to_string());
    let out = dir.join("out").display().to_string();
    let merge = ["merge", p1.as_str(), p2.as_str(), "--out", out.as_str()];
    let changed = "the inputs or options changed since the shards ran";

    // Another prefill rate in the scenario's own profile file.
    let faster: String = profile
        .lines()
        .map(|l| match l.starts_with("prefill_tok_s:") {
            true => "prefill_tok_s: 4500\n".to_string(),
            false => format!("{l}\n"),
        })
        .collect();
    assert_ne!(faster, profile);
    std::fs::write(dir.join("hw.yaml"), &faster).unwrap();
    refused(&merge, &[changed]);
    std::fs::write(dir.join("hw.yaml"), &profile).unwrap();
    let o = routelab(&merge);
    assert!(o.status.success(), "restored: {}", text(&o));

    // One more row in the trace, beyond the rows the scenario reads: still another input.
    let longer: String = std::fs::read_to_string(
        root.join("data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    )
    .unwrap()
    .lines()
    .take(401)
    .map(|l| format!("{l}\n"))
    .collect();
    std::fs::write(dir.join("trace.csv"), longer).unwrap();
    refused(&merge, &[changed]);
}

/// The records of a compare partial's text: the text before them, each record, the text after.
fn split_records(text: &str) -> (String, Vec<String>, String) {
    let opening = "\"records\":{\"compare\":[";
    let open = text.find(opening).unwrap() + opening.len();
    let close = text.rfind("]}").unwrap();
    // A record opens with its scenario index; its `perf` object's scenario is a name.
    let starts: Vec<usize> = text[open..close]
        .match_indices("{\"scenario\":")
        .map(|(i, _)| open + i)
        .filter(|&i| text.as_bytes()[i + 12].is_ascii_digit())
        .collect();
    let records = starts
        .iter()
        .enumerate()
        .map(|(j, &a)| {
            let b = starts.get(j + 1).map_or(close, |&b| b - 1);
            text[a..b].to_string()
        })
        .collect();
    (text[..open].to_string(), records, text[close..].to_string())
}

fn join_records(head: &str, records: &[String], tail: &str) -> String {
    format!("{head}{}{tail}", records.join(","))
}

#[test]
fn merge_refuses_edited_partials_naming_the_file() {
    let dir = scratch("shards-refuse-records");
    let [p1, p2] = three_seeds_two_shards(&dir, CRASH);
    let out = dir.join("out").display().to_string();
    let merge = ["merge", p1.as_str(), p2.as_str(), "--out", out.as_str()];
    let (t1, t2) = (
        std::fs::read_to_string(&p1).unwrap(),
        std::fs::read_to_string(&p2).unwrap(),
    );
    let (h1, r1, e1) = split_records(&t1);
    let (h2, r2, e2) = split_records(&t2);
    assert_eq!(
        (r1.len(), r2.len()),
        (2, 1),
        "one policy, seeds 0 and 2 | 1"
    );
    assert_eq!(join_records(&h1, &r1, &e1), t1);
    let o = routelab(&merge);
    assert!(o.status.success(), "as written: {}", text(&o));

    // A run removed: the error names the shard and file that should hold it.
    std::fs::write(&p1, join_records(&h1, &r1[..1], &e1)).unwrap();
    refused(
        &merge,
        &[&format!(
            "no run of `ci/crash`, seed ordinal 2, policy `seed-v1`; shard 1/2 ({p1}) should hold it"
        )],
    );
    std::fs::write(&p1, &t1).unwrap();

    // Shard 1's run copied into shard 2's partial: shard 2 does not run it.
    let mut both = r2.clone();
    both.push(r1[0].clone());
    std::fs::write(&p2, join_records(&h2, &both, &e2)).unwrap();
    refused(
        &merge,
        &[&format!(
            "{p2} holds a result (0, 0, 0) that shard 2/2 does not run"
        )],
    );
    std::fs::write(&p2, &t2).unwrap();

    // A run twice in one partial.
    let twice = [r1.clone(), vec![r1[1].clone()]].concat();
    std::fs::write(&p1, join_records(&h1, &twice, &e1)).unwrap();
    refused(
        &merge,
        &[&format!("the result (0, 2, 0) is in both {p1} and {p1}")],
    );
}

#[test]
fn merge_refuses_partials_run_with_other_arguments() {
    let dir = scratch("shards-refuse-args");
    let mut files = Vec::new();
    for (k, out) in [(1, "a"), (2, "b")] {
        let p = dir.join(format!("p{k}.json")).display().to_string();
        let o = dir.join(out).display().to_string();
        let shard = format!("{k}/2");
        let r = routelab(&[
            "compare",
            CRASH,
            "--policy",
            "seed-v1",
            "--seeds",
            "2",
            "--out",
            &o,
            "--shard",
            &shard,
            "--partial",
            &p,
        ]);
        assert!(r.status.success(), "{}", text(&r));
        files.push(p);
    }
    // The inputs agree, `--out` does not: in either order, the merge refuses.
    for (a, b) in [(&files[0], &files[1]), (&files[1], &files[0])] {
        refused(
            &["merge", a, b],
            &[&format!("{a} and {b} were run with different arguments")],
        );
    }
}

#[test]
fn records_the_merge_never_asks_for_count_nowhere() {
    // `--seeds auto` on one scenario that stops at its first 3 seeds (of at most 6): a record of
    // seed ordinal 4 is one its shard could have run, but the merge never asks for it.
    let dir = scratch("shards-unasked");
    let out = dir.join("out").display().to_string();
    let args = [
        "compare",
        CRASH,
        "--policy",
        "seed-v3",
        "--policy",
        "seed-next",
        "--seeds",
        "auto",
        "--max-seeds",
        "6",
        "--precision",
        "0.99",
        "--out",
        &out,
    ];
    let whole = routelab(&args);
    assert!(whole.status.success(), "{}", text(&whole));
    assert!(
        console(&whole).contains("ci/crash (3 seeds)"),
        "{}",
        console(&whole)
    );
    let perf = std::fs::read_to_string(dir.join("out/perf.json")).unwrap();
    let partial = dir.join("p.json").display().to_string();
    let shard = routelab(&[&args[..], &["--shard", "1/1", "--partial", &partial]].concat());
    assert!(shard.status.success(), "{}", text(&shard));
    let (head, mut records, tail) = split_records(&std::fs::read_to_string(&partial).unwrap());
    assert_eq!(records.len(), 6);
    let extra = records[0].replacen(
        "{\"scenario\":0,\"ordinal\":0,",
        "{\"scenario\":0,\"ordinal\":4,",
        1,
    );
    assert_ne!(extra, records[0]);
    records.push(extra);
    std::fs::write(&partial, join_records(&head, &records, &tail)).unwrap();
    let merged = routelab(&["merge", &partial]);
    assert!(merged.status.success(), "{}", text(&merged));
    assert_eq!(console(&merged), console(&whole));
    assert!(
        console(&merged).contains("\n6 runs, "),
        "{}",
        console(&merged)
    );
    let merged_perf = std::fs::read_to_string(dir.join("out/perf.json")).unwrap();
    assert_eq!(
        merged_perf.matches("\"seed\"").count(),
        perf.matches("\"seed\"").count()
    );
}

/// Issue 41: context-window rejections reach `capacity`'s outputs, through the shards' partial
/// files and `merge` as in a whole run (requests up to 60,000 tokens on 32,768-token workers).
#[test]
fn capacity_names_context_window_rejections_whole_and_merged() {
    let dir = scratch("shards-capacity-rejections");
    let sc = dir.join("long.yaml");
    std::fs::write(
        &sc,
        "model: gemma-27b\nfleet: [{ name: w, profile: rtx4090x2-27b, count: 2 }]\ntraffic:\n  - poisson: { start_s: 20, rate_per_s: 0.5, count: 30, prompt: { uniform: { min: 1000, max: 60000 } }, output: { fixed: 16 } }\npolicies: [least-load]\ntimeline_s: 0\n",
    )
    .unwrap();
    let out = dir.join("out");
    let o = out.display().to_string();
    let whole = same_as_whole(
        "capacity with rejections",
        &[
            "capacity",
            sc.to_str().unwrap(),
            "--slo",
            "ttft_p99<=120s",
            "--seeds",
            "2",
            "--precision",
            "0.2",
            "--out",
            &o,
        ],
        &out,
        &[2],
    );
    let t = text(&whole);
    assert!(
        t.contains("note: least-load: requests refused on 2/2 seeds; the most at seed ")
            && t.contains("because prompt + output exceed every worker's context window"),
        "{t}"
    );
}
