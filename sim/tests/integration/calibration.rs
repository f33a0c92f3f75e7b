//! Calibration: the real profiles in `scenarios/hardware/`, run through the engine model,
//! reproduce the figures of the source post (DESIGN.md §6).

use std::path::PathBuf;
use std::sync::Arc;

use routelab_sim::hardware::HardwareProfile;
use routelab_sim::worker::{
    Admission, EngineOutput, EngineOverrides, FluidEngine, InferenceEngine,
};

const NS: f64 = 1e9;

fn profile_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/hardware")
}

fn load(name: &str) -> Arc<HardwareProfile> {
    let path = profile_dir().join(format!("{name}.yaml"));
    Arc::new(HardwareProfile::load(&path).unwrap_or_else(|e| panic!("{e}")))
}

fn warm_engine(p: &Arc<HardwareProfile>) -> FluidEngine {
    FluidEngine::new(p.clone(), EngineOverrides::default(), 7)
}

/// Runs the engine until it is empty; returns every output.
fn drain(engine: &mut FluidEngine, outputs: &mut Vec<EngineOutput>) {
    let mut guard = 0;
    while let Some(t) = engine.next_event_time() {
        engine.advance_to(t, outputs);
        guard += 1;
        assert!(guard < 1_000_000, "engine does not settle");
    }
    assert_eq!(engine.in_flight(), 0);
}

/// Mean per-request decode speed with `n` sequences admitted together, long outputs, short
/// prompts: the tokens after the first over the time after it, `(N - 1) / (e2e - TTFT)` =
/// 1 / TPOT (the first token comes with the prefill step).
fn per_request_decode(p: &Arc<HardwareProfile>, n: u64) -> f64 {
    let mut e = warm_engine(p);
    let out_tokens = 4000;
    for s in 0..n {
        e.admit(0, Admission::new(s, 64, out_tokens, &[]));
    }
    let mut outs = Vec::new();
    drain(&mut e, &mut outs);
    let speeds: Vec<f64> = outs
        .iter()
        .filter_map(|o| match o {
            EngineOutput::Completed(c) => {
                Some(f64::from(c.output_tokens - 1) / ((c.at - c.first_token_at) as f64 / NS))
            }
            _ => None,
        })
        .collect();
    assert_eq!(speeds.len() as u64, n);
    speeds.iter().sum::<f64>() / speeds.len() as f64
}

/// The probe: 16 concurrent requests of 128 output tokens, 64-token prompts, admitted at
/// `start`; total output tokens / wall time (first send to last completion).
fn burst(e: &mut FluidEngine, start: u64) -> (f64, u64) {
    let mut outs = Vec::new();
    e.advance_to(start, &mut outs);
    for s in 0..16 {
        e.admit(start, Admission::new(1_000 + start + s, 64, 128, &[]));
    }
    drain(e, &mut outs);
    let end = outs.iter().map(|o| o.at()).max().expect("outputs");
    let tok_s = 16.0 * 128.0 / ((end - start) as f64 / NS);
    (tok_s, end)
}

fn within(measured: f64, target: f64, tolerance: f64) -> bool {
    (measured / target - 1.0).abs() <= tolerance
}

#[test]
fn per_request_decode_matches_source() {
    let pro = load("rtx-pro-6000-27b");
    let pair = load("rtx4090x2-27b");
    for (p, n, target) in [
        (&pro, 1, 106.0),
        (&pro, 8, 86.0),
        (&pro, 32, 45.0),
        (&pair, 1, 94.0),
        (&pair, 8, 50.0),
    ] {
        let got = per_request_decode(p, n);
        println!(
            "{} at {n}: {got:.1} tok/s per request (target {target})",
            p.name()
        );
        assert!(
            within(got, target, 0.05),
            "{} at {n}: {got:.1} tok/s per request, want {target} +-5%",
            p.name()
        );
    }
}

#[test]
fn warm_burst_matches_source() {
    for (name, target) in [("rtx-pro-6000-27b", 992.0), ("rtx4090x2-27b", 453.0)] {
        let p = load(name);
        let mut e = warm_engine(&p);
        let (got, _) = burst(&mut e, 0);
        println!("{name}: warm 16 x 128 burst {got:.0} tok/s (target {target})");
        assert!(
            within(got, target, 0.05),
            "{name}: warm burst {got:.0} tok/s, want {target} +-5%"
        );
    }
}

/// The numbers fitted to a burst reproduce it closely, not just within the table's 5 %:
/// `rtx-pro-6000-27b`'s aggregate at 16 (992 tok/s warm) and cold start (275 tok/s cold), and
/// `rtx4090x2-27b`'s flat top (453 tok/s warm). Refitted in issue 10, when the first token
/// became the prefill's (127 decode steps per 128-token request instead of 128).
#[test]
fn fitted_numbers_reproduce_their_bursts() {
    for (name, target) in [("rtx-pro-6000-27b", 992.0), ("rtx4090x2-27b", 453.0)] {
        let (got, _) = burst(&mut warm_engine(&load(name)), 0);
        assert!(
            within(got, target, 0.005),
            "{name}: warm burst {got:.1} tok/s, fitted to {target} +-0.5%"
        );
    }
    let p = load("rtx-pro-6000-27b");
    let mut e = warm_engine(&p);
    assert!(e.restart(0, 0, true).is_empty());
    let (cold, _) = burst(&mut e, 0);
    assert!(
        within(cold, 275.0, 0.01),
        "cold burst {cold:.1} tok/s, fitted to 275 +-1%"
    );
}

#[test]
fn cold_burst_then_warm_burst() {
    let p = load("rtx-pro-6000-27b");
    let mut e = warm_engine(&p);
    let (warm, end) = burst(&mut e, 0);
    // restart, ready 30 s later, probe 5 s after ready
    let restart_at = end + 10 * 1_000_000_000;
    let ready = restart_at + 30 * 1_000_000_000;
    assert!(e.restart(restart_at, ready, true).is_empty());
    assert!(!e.is_warm());
    let (cold, end) = burst(&mut e, ready + 5 * 1_000_000_000);
    let (second, _) = burst(&mut e, end + 1_000_000_000);
    println!("cold burst {cold:.0} tok/s (target 275), second {second:.0} (warm {warm:.0})");
    assert!(
        within(cold, 275.0, 0.15),
        "cold burst {cold:.0}, want 275 +-15%"
    );
    assert!(e.is_warm());
    assert!(
        within(second, warm, 0.10),
        "second burst {second:.0}, want within 10% of the warm {warm:.0}"
    );
}

#[test]
fn every_shipped_profile_loads() {
    let mut n = 0;
    for entry in std::fs::read_dir(profile_dir()).expect("scenarios/hardware") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|x| x == "yaml") {
            let p = HardwareProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!p.sources().is_empty(), "{}: no sources", p.name());
            assert_eq!(
                path.file_stem().and_then(|s| s.to_str()),
                Some(p.name()),
                "file name and profile name differ"
            );
            // a probe burst runs to completion on every profile
            let mut e = warm_engine(&Arc::new(p.clone()));
            let (tok_s, _) = burst(&mut e, 0);
            println!("{}: burst {tok_s:.0} tok/s", p.name());
            assert!(tok_s.is_finite() && tok_s > 0.0);
            n += 1;
        }
    }
    assert!(n >= 7, "expected at least 7 profiles, found {n}");
}
