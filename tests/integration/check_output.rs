//! `routelab check` on the bundled suite: a short default, every row with `--verbose`, Markdown
//! that fits a pull-request comment, JSON with every comparison.

use super::common::{routelab, text};

/// GitHub cuts a pull-request comment at 65,536 characters; the Markdown keeps below this.
const COMMENT_LIMIT: usize = 60_000;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn check_is_short_by_default_and_verbose_json_and_csv_hold_every_comparison() {
    let short = routelab(&["check"]);
    assert!(short.status.success(), "{}", text(&short));
    let s = stdout(&short);
    let lines: Vec<&str> = s.lines().collect();
    // The bundled tree passes its own baselines: nothing fails, so one line says it all.
    assert_eq!(lines.len(), 1, "{s}");
    assert!(
        lines[0].starts_with("check passed: ")
            && lines[0].contains(" comparison(s): 0 regression(s), ")
            && lines[0].ends_with("`--verbose` prints every row"),
        "{s}"
    );

    let json = routelab(&["check", "--format", "json"]);
    assert!(json.status.success(), "{}", text(&json));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document: {e}\n{}", text(&json)));
    let rows = doc["comparisons"].as_array().unwrap();
    assert_eq!(doc["verdict"], "passed");
    assert_eq!(
        doc["counts"]["comparisons"].as_u64(),
        Some(rows.len() as u64)
    );
    assert_eq!(
        doc["counts"]["ok"].as_u64().unwrap()
            + doc["counts"]["changed"].as_u64().unwrap()
            + doc["counts"]["improved"].as_u64().unwrap()
            + doc["counts"]["regressions"].as_u64().unwrap()
            + doc["counts"]["no_baseline"].as_u64().unwrap(),
        rows.len() as u64
    );
    assert_eq!(
        doc["counts"]["invariants"].as_u64(),
        Some(doc["invariants"].as_array().unwrap().len() as u64)
    );
    assert!(lines[0].contains(&format!("check passed: {} comparison(s)", rows.len())));

    // Every comparison: as many as the CSV has rows and the verbose table has lines, each
    // (scenario, policy, metric) present.
    let csv = routelab(&["check", "--format", "csv"]);
    assert!(csv.status.success(), "{}", text(&csv));
    assert_eq!(stdout(&csv).lines().count(), 1 + rows.len());
    let verbose = routelab(&["check", "--verbose"]);
    assert!(verbose.status.success(), "{}", text(&verbose));
    let v = stdout(&verbose);
    assert!(v.starts_with("scenario "), "{v}");
    let table_rows: Vec<&str> = v.lines().skip(1).take_while(|l| !l.is_empty()).collect();
    assert_eq!(table_rows.len(), rows.len());
    for (line, row) in table_rows.iter().zip(rows) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (words[0], words[1], words[2], *words.last().unwrap()),
            (
                row["scenario"].as_str().unwrap(),
                row["policy"].as_str().unwrap(),
                row["metric"].as_str().unwrap(),
                row["status"].as_str().unwrap()
            )
        );
    }
    assert!(v.contains("\ninvariants:\n  [ok] "), "{v}");
    assert!(
        v.ends_with(&format!(
            "\n{} comparison(s): 0 regression(s), 0 improvement(s), 0 without baseline; {} invariant(s), 0 failed\n",
            rows.len(),
            doc["invariants"].as_array().unwrap().len()
        )),
        "the verbose output ends with today's summary: {}",
        &v[v.len().saturating_sub(300)..]
    );
}

#[test]
fn check_markdown_fits_a_pull_request_comment_and_says_what_it_left_out() {
    let o = routelab(&["check", "--format", "markdown"]);
    assert!(o.status.success(), "{}", text(&o));
    let md = stdout(&o);
    let chars = md.chars().count();
    assert!(chars < COMMENT_LIMIT, "{chars} characters");
    assert!(md.starts_with("## routelab check: passed\n"), "{md}");
    assert!(md.contains("\nNo failures.\n"), "{md}");
    // Every scenario of the suite has its line of counts.
    let per_scenario = md
        .split("### Per scenario")
        .nth(1)
        .and_then(|s| s.split("###").next())
        .unwrap();
    let scenarios = per_scenario
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
        .count();
    let suite = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/ci/suite.yaml"),
    )
    .unwrap();
    let listed = suite
        .split("\nscenarios:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  - "))
        .count();
    assert_eq!(scenarios, listed, "{per_scenario}");
    // The suite's rows do not all fit: the omitted ones are counted and JSON is named.
    let note = md
        .lines()
        .find(|l| l.ends_with(" rows omitted; run `routelab check --format json` for all"))
        .unwrap_or_else(|| panic!("an omitted-rows note: {}", &md[md.len() - 400..]));
    let omitted: usize = note.split(' ').next().unwrap().parse().unwrap();
    let shown = md
        .split("### Every comparison")
        .nth(1)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("| ") && l.ends_with(" |") && !l.starts_with("| scenario"))
        .count();
    let json = routelab(&["check", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        shown + omitted,
        doc["comparisons"].as_array().unwrap().len(),
        "{note}"
    );
    // The plain-text verdict goes to stderr, so stdout is the comment and nothing else.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("comparison(s): 0 regression(s)"),
        "{}",
        text(&o)
    );
}

#[test]
fn verbose_applies_only_to_the_table() {
    let o = routelab(&["check", "--format", "markdown", "--verbose"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("--verbose") && t.contains("applies only to `--format table`"),
        "{t}"
    );
}
