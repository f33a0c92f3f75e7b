//! Issue 41: resampling keeps a trace's non-stationarity. On the bundled synthetic two-hour
//! diurnal log (`scenarios/traces/diurnal.yaml`), the resampled capacity stays near the capacity
//! as recorded, with the automatic block length and with 10 s blocks (what the Politis–White
//! rule chose on the user's own diurnal log).
//!
//! Measured (least-load, `--slo "ttft<=2s,tpot<=100ms" --target 0.9`, load scale): as recorded
//! 2.28 on every seed. The circular block bootstrap before this issue: 2.24 ± 0.18 with its
//! automatic 227 s blocks, and 2.63 ± 0.16 [2.47, 2.79] with 10 s blocks (+15 %, excluding
//! 2.28): the peak's blocks laid beside the night's. The local block bootstrap, seeds 1-5:
//! 2.18 ± 0.10 (227 s blocks), 2.15 (10 s), 2.21 (300 s), 2.21 (600 s), 2.16 (1,200 s).
//!
//! **The 4 % left is not the bootstrap's.** It does not move with the block length (above), so
//! it is not blocks shorter than the rate's correlation time; and the log is one draw of a
//! known process (`data/traces/diurnal_synthetic/generate.yaml`), so the capacity of the
//! process itself can be measured: ten fresh draws of it (seeds 41-50, the log's own seed 41
//! first) give 2.20, sd 0.105, 95 % interval [2.13, 2.28]; ten resamples of the log give 2.185,
//! sd 0.081, [2.13, 2.24]. The resamples estimate the process's capacity, which is what a
//! study wants (next week's traffic is another draw); the recorded log is a draw 3.4 % above
//! it (0.7 sd; its own seed, synthesised rather than read, gives 2.33). So the interval of a
//! *mean* over resamples narrows towards the process's capacity and may exclude one draw's,
//! correctly; what must contain the capacity as recorded is the resamples' 95 % *prediction*
//! interval (where one more draw falls), which `recorded_capacity_is_a_draw_the_resamples_predict`
//! holds, with the resamples' mean held to the fresh draws' interval.
use super::common::{routelab, scratch, text};
use serde_json::Value;
use std::path::Path;

fn capacity(out: &Path, seeds: &str, resample: &str) -> Value {
    let o = routelab(&[
        "capacity",
        "scenarios/traces/diurnal.yaml",
        "--slo",
        "ttft<=2s,tpot<=100ms",
        "--target",
        "0.9",
        "--policy",
        "least-load",
        "--baseline",
        "least-load",
        "--seeds",
        seeds,
        "--resample",
        resample,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_str(&std::fs::read_to_string(out.join("capacity.json")).unwrap()).unwrap()
}

fn scales(study: &Value) -> Vec<f64> {
    study["policies"][0]["seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scale"].as_f64().unwrap())
        .collect()
}

#[test]
fn the_resampled_capacity_of_a_diurnal_trace_stays_near_its_capacity_as_recorded() {
    let dir = scratch("diurnal-capacity");
    let recorded = scales(&capacity(&dir.join("none"), "1", "none"))[0];
    for resample in ["block", "10"] {
        let study = capacity(&dir.join(resample), "5", resample);
        let got = scales(&study);
        let mean = got.iter().sum::<f64>() / got.len() as f64;
        // The circular bootstrap's 10 s blocks: +15 % (2.63 against 2.28). The local one:
        // -4 % (automatic blocks) and -6 % (10 s), a resample's own bias on a statistic as
        // non-linear as a capacity; 8 % separates the two.
        assert!(
            (mean / recorded - 1.0).abs() < 0.08,
            "--resample {resample}: mean {mean:.3} against {recorded:.3} as recorded ({got:?})"
        );
        let meaning = study["seed_meaning"].as_str().unwrap();
        assert!(meaning.contains("local block-bootstrap"), "{meaning}");
    }
}

/// A capacity study's per-seed load scales, run on `scenario` (least-load, 90 % within
/// TTFT <= 2 s and TPOT <= 100 ms).
fn scales_of(scenario: &str, out: &Path, seeds: &str, resample: &str) -> Vec<f64> {
    let o = routelab(&[
        "capacity",
        scenario,
        "--slo",
        "ttft<=2s,tpot<=100ms",
        "--target",
        "0.9",
        "--policy",
        "least-load",
        "--baseline",
        "least-load",
        "--seeds",
        seeds,
        "--resample",
        resample,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let study: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("capacity.json")).unwrap()).unwrap();
    scales(&study)
}

/// Mean, standard deviation and the 95 % t quantile for `n - 1` degrees of freedom (n = 10).
fn mean_sd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let v = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - 1.0);
    (m, v.sqrt())
}

/// Issue 41, containment: the capacity as recorded lies within the resamples' 95 % prediction
/// interval, and the resamples' mean within the 95 % interval of fresh draws of the process
/// the log was drawn from (the module documentation has the figures and why this is the test).
#[test]
fn recorded_capacity_is_a_draw_the_resamples_predict() {
    const T975_9: f64 = 2.262;
    let dir = scratch("diurnal-containment");
    let recorded = scales_of(
        "scenarios/traces/diurnal.yaml",
        &dir.join("none"),
        "1",
        "none",
    )[0];
    let resampled = scales_of(
        "scenarios/traces/diurnal.yaml",
        &dir.join("block"),
        "10",
        "block",
    );
    let (m, sd) = mean_sd(&resampled);
    let pi = T975_9 * sd * (1.0 + 1.0 / 10.0_f64).sqrt();
    assert!(
        (m - pi..=m + pi).contains(&recorded),
        "recorded {recorded:.3} outside the resamples' prediction interval {m:.3} ± {pi:.3}"
    );
    // Fresh draws of the generating process, on the same fleet and SLO.
    let generate = std::fs::read_to_string("data/traces/diurnal_synthetic/generate.yaml").unwrap();
    let traffic = generate
        .lines()
        .find(|l| l.trim_start().starts_with("- diurnal:"))
        .unwrap();
    let process = dir.join("process.yaml");
    std::fs::write(
        &process,
        format!(
            "name: diurnal-process\nseed: 41\nmodel: gemma-27b\nfleet:\n  \
             - {{ name: pro6000, profile: rtx-pro-6000-27b }}\n  \
             - {{ name: pair, profile: rtx4090x2-27b, count: 2 }}\n  \
             - {{ name: mac, profile: mac-m3-ultra-27b }}\ntraffic:\n{traffic}\n\
             policies: [least-load]\ntimeline_s: 0\n"
        ),
    )
    .unwrap();
    let fresh = scales_of(
        process.to_str().unwrap(),
        &dir.join("process"),
        "10",
        "none",
    );
    let (pm, psd) = mean_sd(&fresh);
    let ci = T975_9 * psd / 10.0_f64.sqrt();
    assert!(
        (m - pm).abs() <= ci,
        "resamples' mean {m:.3} against the process's {pm:.3} ± {ci:.3} ({fresh:?})"
    );
}
