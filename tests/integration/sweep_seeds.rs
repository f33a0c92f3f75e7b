//! `routelab sweep --seeds N`: intervals across seeds in sweep.csv, every run in
//! sweep_seeds.csv, and report.html with the chart; one seed keeps the plain CSV.

use super::common::{routelab, scratch, text};

fn sweep(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "sweep",
        "scenarios/seed/identical-4090s.yaml",
        "--set",
        "traffic[0].poisson.rate_per_s=0.5,1",
        "--set",
        "traffic[0].poisson.duration_s=300",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    routelab(&args)
}

#[test]
fn sweep_with_three_seeds_writes_intervals_every_run_and_a_report() {
    let dir = scratch("sweep-seeds");
    let o = sweep(&dir, &["--seeds", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains(" ± "), "{t}");
    assert!(t.contains("mean ± 95 % half-width across 3 seeds"), "{t}");

    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        &header[..6],
        &[
            "traffic[0].poisson.rate_per_s",
            "traffic[0].poisson.duration_s",
            "policy",
            "seeds",
            "requests",
            "requests_ci95_low"
        ]
    );
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (mean, low, high) = (
        col("e2e_mean_s"),
        col("e2e_mean_s_ci95_low"),
        col("e2e_mean_s_ci95_high"),
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // Two grid points × the scenario's three policies.
    assert_eq!(rows.len(), 6);
    for r in &rows {
        assert_eq!(r[3], "3");
        let (m, lo, hi): (f64, f64, f64) = (
            r[mean].parse().unwrap(),
            r[low].parse().unwrap(),
            r[high].parse().unwrap(),
        );
        // Poisson arrivals differ per seed: a real interval around the mean.
        assert!(lo < m && m < hi, "{lo} {m} {hi}");
    }

    let seeds = std::fs::read_to_string(dir.join("sweep_seeds.csv")).unwrap();
    let seed_col: Vec<&str> = seeds
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(3).unwrap())
        .collect();
    assert_eq!(seed_col.len(), 18);
    // The scenario's seed (1) plus 0, 1, 2, as `compare --seeds 3` runs them.
    assert_eq!(&seed_col[..3], &["1", "2", "3"]);

    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains("<h1>routelab sweep: seed/identical-4090s</h1>"));
    assert!(html.contains("<svg"), "the chart is inline");
    assert!(html.contains("Sweep over traffic[0].poisson.rate_per_s"));
    assert!(html.contains("3 seeds each"));
    assert!(dir.join("sweep.svg").exists() && dir.join("sweep.png").exists());
}

#[test]
fn sweep_with_one_seed_keeps_the_plain_csv_and_refuses_zero_seeds() {
    let dir = scratch("sweep-one-seed");
    let o = sweep(&dir, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert!(
        csv.starts_with(
            "traffic[0].poisson.rate_per_s,traffic[0].poisson.duration_s,policy,requests,completed,failed,rejected,"
        ),
        "{csv}"
    );
    assert!(!csv.contains("ci95"), "{csv}");
    assert!(!dir.join("sweep_seeds.csv").exists());
    assert!(dir.join("report.html").exists());
    // `--seeds 1` is the default, byte for byte.
    let again = scratch("sweep-one-seed-explicit");
    assert!(sweep(&again, &["--seeds", "1"]).status.success());
    assert_eq!(
        std::fs::read(again.join("sweep.csv")).unwrap(),
        csv.as_bytes()
    );

    for bad in ["0", "2.5"] {
        let o = sweep(&scratch("sweep-bad-seeds"), &["--seeds", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains("--seeds") && t.contains("whole number"),
            "{bad}: {t}"
        );
    }
}
