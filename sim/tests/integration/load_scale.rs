//! The load scale of `routelab capacity` (`Scenario::with_load_scale`): what scales, what does
//! not, scale 1 changes nothing, and the sources that cannot be scaled are located errors.

use routelab_sim::traffic::{Arrival, TraceStats};
use routelab_sim::{RequestRecord, Scenario, TrafficSpec, run};
use std::path::Path;

/// Every scalable kind of source in one scenario (beside the test hardware profiles).
const MIXED: &str = "\
name: t
seed: 3
hardware_dir: hardware
fleet:
  - { name: a, profile: constant-rate, count: 2 }
traffic:
  - poisson: { rate_per_s: 2, count: 200, prompt: { fixed: 10 }, output: { fixed: 20 } }
  - diurnal: { min_rate_per_s: 0.5, max_rate_per_s: 2, period_s: 60, count: 100, prompt: { fixed: 10 }, output: { fixed: 20 } }
  - on_off: { burst_size: { fixed: 4 }, window_s: 2, gap_s: { exponential: { mean: 10 } }, count: 100, prompt: { fixed: 10 }, output: { fixed: 20 } }
  - burst: { at_s: 5, size: 3, repeats: 10, period_s: 20, prompt: { fixed: 10 }, output: { fixed: 20 } }
  - burst: { at_s: 1, size: 5, prompt: { fixed: 10 }, output: { fixed: 20 } }
  - conversations: { rate_per_s: 0.5, conversations: 20, turns: { fixed: 3 }, user_tokens: { fixed: 30 }, output: { fixed: 20 }, think_s: { fixed: 5 } }
  - long_prompt_mix: { rate_per_s: 1, count: 100, long_fraction: 0.1, long_prompt: { fixed: 900 }, short_prompt: { fixed: 10 }, output: { fixed: 20 } }
policies: [\"equal/p2c/none/none\"]
timeline_s: 0
";

fn inline(src: &str) -> Result<Scenario, routelab_policies::InputError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/inline.yaml");
    Scenario::from_yaml(src, &path)
}

fn arrivals(sc: &Scenario) -> Vec<Arrival> {
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    std::iter::from_fn(|| t.next_arrival().unwrap()).collect()
}

fn rows(sc: &Scenario) -> Vec<RequestRecord> {
    let mut rows: Vec<RequestRecord> = Vec::new();
    let mut t = sc.traffic_source(sc.setup.seed).unwrap();
    run(&sc.setup, &sc.policies[0], &mut *t, Some(&mut rows)).unwrap();
    rows
}

#[test]
fn scale_1_runs_byte_identically() {
    let sc = inline(MIXED).unwrap();
    let same = sc.with_load_scale(1.0).unwrap();
    let (a, b) = (rows(&sc), rows(&same));
    assert!(a.len() > 500, "{}", a.len());
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

#[test]
fn every_rate_doubles_and_lengths_stay() {
    let sc = inline(MIXED).unwrap();
    let double = sc.with_load_scale(2.0).unwrap();
    // Each source on its own: same requests (count-bounded), arrivals over half the span.
    for i in [0usize, 2, 3, 6] {
        let one = |s: &Scenario| Scenario {
            traffic: vec![s.traffic[i].clone()],
            ..s.clone()
        };
        let (a, b) = (arrivals(&one(&sc)), arrivals(&one(&double)));
        assert_eq!(a.len(), b.len(), "source {i}");
        let lengths = |v: &[Arrival]| {
            v.iter()
                .map(|x| (x.prompt_tokens, x.output_tokens))
                .collect::<Vec<_>>()
        };
        assert_eq!(lengths(&a), lengths(&b), "source {i}: lengths unchanged");
        let span = |v: &[Arrival]| (v.last().unwrap().at - v.first().unwrap().at) as f64;
        let r = span(&b) / span(&a);
        // Poisson, on/off and the long-prompt mix draw the same numbers at any rate, so their
        // gaps halve (to the nanosecond); the repeated burst's period halves.
        assert!((r - 0.5).abs() < 0.02, "source {i}: span ratio {r}");
    }
    // The Poisson source: every arrival at half its time (one rounding of the f64 clock).
    let p = |s: &Scenario| Scenario {
        traffic: vec![s.traffic[0].clone()],
        ..s.clone()
    };
    for (a, b) in arrivals(&p(&sc)).iter().zip(arrivals(&p(&double))) {
        assert!(
            (a.at as i64 / 2 - b.at as i64).abs() <= 1,
            "{} vs {}",
            a.at,
            b.at
        );
    }
    // The diurnal source: both rates doubled, the day as long (its thinning then accepts
    // different instants, so its arrivals are not simply compressed).
    match &double.traffic[1] {
        TrafficSpec::Diurnal(c) => {
            assert_eq!((c.min_rate_per_s, c.max_rate_per_s), (1.0, 4.0));
            assert_eq!(c.period, 60_000_000_000);
        }
        other => panic!("{other:?}"),
    }
    // The single burst is an event, not a rate: unchanged.
    let single = |s: &Scenario| Scenario {
        traffic: vec![s.traffic[4].clone()],
        ..s.clone()
    };
    assert_eq!(arrivals(&single(&sc)), arrivals(&single(&double)));
    // Conversations start twice as often.
    let conv = |s: &Scenario| Scenario {
        traffic: vec![s.traffic[5].clone()],
        ..s.clone()
    };
    let rate = |s: &Scenario| s.mean_arrival_rate_per_s(3).unwrap().unwrap();
    let r = rate(&conv(&double)) / rate(&conv(&sc));
    assert!((r - 2.0).abs() < 1e-6, "{r}");
}

#[test]
fn a_trace_scales_its_rate_scale() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv");
    let src = format!(
        "seed: 1\nhardware_dir: hardware\nfleet:\n  - {{ name: a, profile: constant-rate }}\n\
         traffic:\n  - trace: {{ path: {}, rate_scale: 1.5, limit: 500 }}\n",
        trace.display()
    );
    let sc = inline(&src).unwrap();
    let stats = |s: &Scenario| {
        let mut t = s.traffic_source(1).unwrap();
        TraceStats::from_source(&mut *t).unwrap()
    };
    let (a, b) = (stats(&sc), stats(&sc.with_load_scale(4.0).unwrap()));
    assert_eq!((a.rows, b.rows), (500, 500));
    let r = b.mean_rate_per_s.unwrap() / a.mean_rate_per_s.unwrap();
    assert!((r - 4.0).abs() < 1e-3, "{r}");
}

#[test]
fn unscalable_sources_and_bad_scales_are_located_errors() {
    let closed = MIXED.replace(
        "  - burst: { at_s: 1, size: 5,",
        "  - closed_loop: { users: 4, think_s: { fixed: 1 }, count: 10, prompt: { fixed: 10 }, output: { fixed: 20 } }\n  - burst: { at_s: 1, size: 5,",
    );
    let e = inline(&closed).unwrap().with_load_scale(2.0).unwrap_err();
    assert!(e.file.ends_with("inline.yaml"), "{e}");
    assert_eq!(e.field, "traffic[4].closed_loop");
    assert!(e.to_string().contains("its load cannot be scaled"), "{e}");
    assert!(e.to_string().contains("valid: open-loop sources"), "{e}");
    // Only single bursts: nothing has a rate.
    let only = "seed: 1\nhardware_dir: hardware\nfleet:\n  - { name: a, profile: constant-rate }\ntraffic:\n  - burst: { at_s: 1, size: 5, prompt: { fixed: 10 }, output: { fixed: 20 } }\n";
    let e = inline(only).unwrap().with_load_scale(2.0).unwrap_err();
    assert_eq!(e.field, "traffic");
    assert!(e.to_string().contains("no arrival rate to scale"), "{e}");
    let sc = inline(MIXED).unwrap();
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = sc.with_load_scale(bad).unwrap_err();
        assert_eq!(e.field, "load scale");
        assert!(
            e.to_string().contains("expected a finite number > 0"),
            "{e}"
        );
    }
}
