//! Trap 1 of issue 29: a trace that starts while a probing policy's registration probes run
//! biases the comparison against it (its weights are measured under customer load). A trace
//! without `start_offset_s` starts after the fleet's warm-up, for every policy alike, and the
//! outputs say when.

use routelab_policies::PolicyConfig;
use routelab_sim::traffic::{Arrival, TrafficSource};
use routelab_sim::{Scenario, run};
use std::path::Path;

fn scenario(offset: &str) -> Scenario {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
    let yaml = format!(
        "seed: 1\nmodel: gemma-27b\nfleet:\n  - {{ name: l, profile: rtx4090x2-27b, count: 3 }}\n\
         traffic:\n  - trace: {{ path: {}, format: azure, limit: 3000, rate_scale: 0.6{offset} }}\n\
         policies: [seed-v3]\n",
        trace.display()
    );
    Scenario::from_yaml(&yaml, Path::new("/tmp/warmup.yaml")).unwrap()
}

fn first(sc: &Scenario) -> Arrival {
    sc.traffic_source(1)
        .unwrap()
        .next_arrival()
        .unwrap()
        .unwrap()
}

fn weights(sc: &Scenario) -> Vec<f64> {
    let mut t = sc.traffic_source(1).unwrap();
    let m = run(
        &sc.setup,
        &PolicyConfig::preset("seed-v3").unwrap(),
        &mut *t,
        None,
    )
    .unwrap();
    m.workers.iter().map(|w| w.final_weight).collect()
}

fn spread(w: &[f64]) -> f64 {
    let max = w.iter().copied().fold(f64::MIN, f64::max);
    let min = w.iter().copied().fold(f64::MAX, f64::min);
    max / min
}

#[test]
fn a_trace_starts_after_the_fleets_registration_probes_and_says_so() {
    let auto = scenario("");
    let w = auto.warmup_ns().unwrap();
    // seed-v3's warm-up and measured bursts on three 4090 pairs: 9.05 s.
    assert!((8_000_000_000..12_000_000_000).contains(&w), "{w}");
    assert_eq!(
        first(&auto).at,
        w,
        "the trace's first request arrives at the warm-up"
    );
    let note = auto.warmup_note().unwrap().unwrap();
    assert!(
        note.starts_with(
            "Warm-up: traffic[0] starts at 9.0 s, when the fleet's registration \
                          probes have measured every worker"
        ) && note.contains("for every policy alike")
            && note.contains("`start_offset_s`"),
        "{note}"
    );
    // The same warm-up for every copy of the scenario (load scales share it).
    assert_eq!(auto.with_load_scale(2.0).unwrap().warmup_ns(), Ok(w));
    // Three identical workers: measured apart from customer load, their weights agree; with
    // the trace started at 0 s (the trap), the probes share the engines with customers and
    // the identical workers are weighted 0.986 to 1.036.
    let clean = weights(&auto);
    assert!(spread(&clean) < 1.001, "{clean:?}");
    let zero = scenario(", start_offset_s: 0");
    assert_eq!(
        zero.warmup_note(),
        Ok(None),
        "an explicit start is the user's"
    );
    assert_eq!(first(&zero).at, 0);
    let biased = weights(&zero);
    assert!(spread(&biased) > 1.02, "{biased:?}");
}

#[test]
fn sources_other_than_traces_keep_their_start() {
    // Sources other than traces keep their own start; the warm-up is not computed for them.
    let yaml = "fleet: [{ name: w, profile: rtx-pro-6000-27b }]\n\
                traffic: [{ poisson: { rate_per_s: 1, count: 5, prompt: { fixed: 100 }, output: { fixed: 10 } } }]\n";
    let sc = Scenario::from_yaml(yaml, Path::new("/tmp/p.yaml")).unwrap();
    assert_eq!(sc.warmup_note(), Ok(None));
    let mut t = sc.traffic_source(1).unwrap();
    let mut n = 0;
    while let Some(a) = t.next_arrival().unwrap() {
        assert!(a.at < 10_000_000_000);
        n += 1;
    }
    assert_eq!(n, 5);
}

/// Issue 41: an explicit `start_offset_s` inside the warm-up is used as written but warned
/// about; one after it, or none written, is not.
#[test]
fn an_explicit_start_inside_the_warm_up_is_warned_about() {
    let inside = scenario(", start_offset_s: 2");
    let w = inside.start_warnings().unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("traffic[0]: start_offset_s 2 is inside the fleet's warm-up (9.")
            && w[0].contains("at least 9."),
        "{w:?}"
    );
    assert_eq!(first(&inside).at, 2_000_000_000, "used as written");
    assert_eq!(
        scenario(", start_offset_s: 30").start_warnings(),
        Ok(vec![])
    );
    assert_eq!(scenario("").start_warnings(), Ok(vec![]));
}
