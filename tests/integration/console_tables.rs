//! The console tables of `run`, `compare` and `sweep`: a rejected column, and `compare` saying
//! why an interval reads `± 0`.

use super::common::{routelab, scratch, text};

/// A prompt longer than every context window is rejected by the router.
fn rejecting_scenario(dir: &std::path::Path) -> String {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios/seed/sixteen-at-once.yaml"),
    )
    .unwrap();
    let hw = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hardware");
    let src = src
        .replace(
            "name: seed/sixteen-at-once",
            &format!("name: t/rejects\nhardware_dir: {}", hw.display()),
        )
        .replace(
            "  - burst: { at_s: 60, size: 16, prompt: { fixed: 200 }, output: { fixed: 256 } }",
            "  - burst: { at_s: 60, size: 16, prompt: { fixed: 200 }, output: { fixed: 256 } }\n  \
             - burst: { at_s: 61, size: 3, prompt: { fixed: 10000000 }, output: { fixed: 8 } }",
        );
    let file = dir.join("rejects.yaml");
    std::fs::write(&file, src).unwrap();
    file.display().to_string()
}

/// The cell under `column` in the row starting with `row` of an aligned table.
fn cell(table: &str, column: &str, row: &str) -> String {
    let mut lines = table
        .lines()
        .skip_while(|l| !(l.starts_with("policy") && l.contains(column)));
    let header = lines.next().unwrap_or_else(|| panic!("{column}: {table}"));
    let end = header.find(column).unwrap() + column.len();
    let line = lines
        .find(|l| l.starts_with(row))
        .unwrap_or_else(|| panic!("{row}: {table}"));
    // Right-aligned numbers end where their header ends.
    line[..end].rsplit(' ').next().unwrap().to_string()
}

#[test]
fn run_compare_and_sweep_tables_show_rejected_requests() {
    let dir = scratch("console-rejected");
    let scenario = rejecting_scenario(&dir);
    let out = dir.join("out");
    let out = out.to_str().unwrap();
    let o = routelab(&["run", &scenario, "--out", out]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert_eq!(cell(&t, " rej", "seed-v1"), "3", "{t}");
    assert_eq!(cell(&t, " req", "seed-v1"), "19", "{t}");

    let o = routelab(&["compare", &scenario, "--seeds", "2", "--out", out]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("  rejected"), "{t}");
    // The rejected column is the table's last: the row ends with its cell (a bare
    // `contains("3 ± 0")` once passed on a TTFT of 0.203 ± 0 instead).
    let row = t.lines().find(|l| l.starts_with("seed-v1")).unwrap();
    assert!(row.trim_end().ends_with("3.00 ± 0"), "{t}");

    let o = routelab(&[
        "sweep",
        &scenario,
        "--set",
        "traffic[1].burst.size=1,4",
        "--out",
        out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    let rejected: Vec<String> = t
        .lines()
        .skip(2)
        .take(4)
        .map(|l| l.split_whitespace().nth(4).unwrap().to_string())
        .collect();
    assert_eq!(rejected, ["1", "1", "4", "4"], "{t}");
}

#[test]
fn compare_says_why_every_seed_gave_the_same_result() {
    let dir = scratch("console-zero-spread");
    // Sixteen identical requests at once: nothing in the run depends on the seed.
    let o = routelab(&[
        "compare",
        "scenarios/seed/sixteen-at-once.yaml",
        "--seeds",
        "3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains(" ± 0"), "{t}");
    assert!(
        t.contains(
            "± 0: every seed gave identical results for every policy and metric (3 seeds): \
             nothing in this scenario depends on the seed"
        ),
        "{t}"
    );
    // Poisson arrivals: latencies vary with the seed, so no such claim.
    let o = routelab(&[
        "compare",
        "scenarios/seed/identical-4090s.yaml",
        "--seeds",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(!t.contains("identical results"), "{t}");
}
