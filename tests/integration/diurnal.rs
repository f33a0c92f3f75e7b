//! Issue 41: resampling keeps a trace's non-stationarity. On the bundled synthetic two-hour
//! diurnal log (`scenarios/traces/diurnal.yaml`), the resampled capacity stays near the capacity
//! as recorded, with the automatic block length and with 10 s blocks (what the Politis–White
//! rule chose on the user's own diurnal log).
//!
//! Measured (least-load, `--slo "ttft<=2s,tpot<=100ms" --target 0.9`, seeds 1-5, load scale):
//! as recorded 2.28 on every seed. The circular block bootstrap before this issue: 2.24 ± 0.18
//! with its automatic 227 s blocks, and 2.63 ± 0.16 [2.47, 2.79] with 10 s blocks (+15 %,
//! excluding 2.28): the peak's blocks laid beside the night's. The local block bootstrap:
//! 2.18 ± 0.10 [2.08, 2.28] (227 s blocks) and 2.15 ± 0.08 [2.07, 2.23] (10 s). The upward
//! bias is gone, but a downward one of 4-6 % is left (a resample is a rougher day than the
//! recorded one, and capacity is convex in load), so with 10 s blocks and 5 seeds the interval
//! still narrowly excludes the recorded value: what this test holds is the bias, not the
//! interval's coverage.

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
