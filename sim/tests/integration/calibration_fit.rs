//! Calibration without double counting (issue 15): a profile fitted by `profile fit` from the
//! closed-loop benchmark results of a step-level engine, fed to the simulator's fluid engine
//! under the same closed loop, reproduces those results; the old fit, which took the
//! closed-loop output tok/s as the decode aggregate, does not.
//!
//! The "benchmark" runs on the step-level engine (`engine: step`, vLLM's scheduling: each step
//! decodes every running sequence one token and fills a prefill budget of
//! `prefill_chunk_tokens` FIFO, and lasts `mixed_step_time_s` of the TRUE profile); C clients
//! each send their next request as soon as the last completes (`vllm bench serve
//! --max-concurrency C --request-rate inf`), and the run is reported as the benchmark reports
//! it.

use std::collections::HashMap;
use std::sync::Arc;

use routelab_sim::hardware::HardwareProfile;
use routelab_sim::hardware::fit::{FitInput, FitOptions, FitSource, MixedStep, fit};
use routelab_sim::worker::{Admission, Engine, EngineMode, EngineOutput, EngineOverrides};

const NS: f64 = 1e9;
/// The concurrencies benchmarked and checked.
const CONCURRENCY: [u32; 4] = [1, 4, 16, 64];
/// Requests per client in a run (`--num-prompts` = this x C).
const ROUNDS: u32 = 20;
/// The bound: the simulated closed loop reproduces the benchmark's output tok/s.
const TOLERANCE: f64 = 0.05;
/// The fitted decode aggregate against the truth's at each C (it is seen at the batch the loop
/// decodes, a little under C while prompts prefill; 2.4 % under at C = 64 against the
/// step-level engine, whose KV is allocated in blocks and whose arrivals wait for a boundary).
const CURVE_TOLERANCE: f64 = 0.03;

/// A PRO 6000-like card (the decode curve of `rtx-pro-6000-27b`, continued to 64) whose
/// mixed steps hide `overlap` of their shorter part: the truth the benchmark runs on.
fn true_profile(overlap: f64) -> HardwareProfile {
    let yaml = format!(
        "name: truth\ndecode:\n  points:\n    - {{ concurrency: 1, aggregate_tok_s: 106 }}\n    \
         - {{ concurrency: 8, aggregate_tok_s: 688 }}\n    - {{ concurrency: 16, \
         aggregate_tok_s: 1093 }}\n    - {{ concurrency: 32, aggregate_tok_s: 1440 }}\n    \
         - {{ concurrency: 64, aggregate_tok_s: 1700 }}\nprefill_tok_s: 6000\n\
         prefill_chunk_tokens: 512\nprefill_overlap: {overlap}\nkv_capacity_tokens: 230000\n\
         max_running: 64\ncontext_window: 32768\n"
    );
    HardwareProfile::from_yaml_str(&yaml, "test:truth").unwrap_or_else(|e| panic!("{e}"))
}

/// What `vllm bench serve` reports of one closed-loop run.
#[derive(Debug, Clone, Copy)]
struct Bench {
    concurrency: u32,
    completed: u32,
    duration_s: f64,
    prompt_tokens: u32,
    output_tokens: u32,
    mean_ttft_s: f64,
    mean_tpot_s: f64,
}

impl Bench {
    fn output_tok_s(&self) -> f64 {
        f64::from(self.completed) * f64::from(self.output_tokens) / self.duration_s
    }

    /// The result file `vllm bench serve --save-result` writes (the fields the fit reads and
    /// a few it does not).
    fn result_json(&self) -> FitInput {
        let completed = f64::from(self.completed);
        let text = serde_json::json!({
            "backend": "reference-step-engine",
            "num_prompts": self.completed,
            "request_rate": "inf",
            "max_concurrency": self.concurrency,
            "duration": self.duration_s,
            "completed": self.completed,
            "total_input_tokens": completed * f64::from(self.prompt_tokens),
            "total_output_tokens": completed * f64::from(self.output_tokens),
            "request_throughput": completed / self.duration_s,
            "output_throughput": self.output_tok_s(),
            "mean_ttft_ms": self.mean_ttft_s * 1e3,
            "mean_tpot_ms": self.mean_tpot_s * 1e3,
        })
        .to_string();
        FitInput {
            origin: format!("c{}.json", self.concurrency),
            text,
        }
    }
}

/// `c` clients, `ROUNDS` requests each, of `prompt` prompt and `output` output tokens, each
/// client sending its next request when its last completes, on one engine of `mode` with
/// `profile`: the benchmark on the step-level engine, its reproduction on the fluid one.
fn closed_loop(
    mode: EngineMode,
    profile: &HardwareProfile,
    c: u32,
    prompt: u32,
    output: u32,
) -> Bench {
    assert!(c <= profile.max_running() && output >= 2);
    let requests = c * ROUNDS;
    let mut e = Engine::new(
        mode,
        Arc::new(profile.clone()),
        EngineOverrides::default(),
        7,
    );
    let mut arrival: HashMap<u64, u64> = HashMap::new();
    for seq in 0..u64::from(c) {
        e.admit(0, Admission::new(seq, prompt, output, &[]));
        arrival.insert(seq, 0);
    }
    let mut sent = c;
    let (mut done, mut ttft_sum, mut tpot_sum, mut end) = (0u32, 0.0f64, 0.0f64, 0u64);
    let mut outs = Vec::new();
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut outs);
        for o in outs.drain(..) {
            if let EngineOutput::Completed(done_seq) = o {
                done += 1;
                end = end.max(done_seq.at);
                let first = (done_seq.first_token_at - arrival[&done_seq.seq]) as f64 / NS;
                ttft_sum += first;
                tpot_sum +=
                    (done_seq.at - done_seq.first_token_at) as f64 / NS / f64::from(output - 1);
                if sent < requests {
                    let seq = u64::from(sent);
                    e.admit(t, Admission::new(seq, prompt, output, &[]));
                    arrival.insert(seq, t);
                    sent += 1;
                }
            }
        }
    }
    assert_eq!(done, requests);
    Bench {
        concurrency: c,
        completed: done,
        duration_s: end as f64 / NS,
        prompt_tokens: prompt,
        output_tokens: output,
        mean_ttft_s: ttft_sum / f64::from(done),
        mean_tpot_s: tpot_sum / f64::from(done),
    }
}

/// One concurrency's figures: the benchmark, the simulator with the new fit, with the old.
struct Row {
    bench: Bench,
    fitted: Bench,
    old: Bench,
}

impl Row {
    fn error(&self, sim: &Bench) -> f64 {
        sim.output_tok_s() / self.bench.output_tok_s() - 1.0
    }
}

/// How the fit learns the overlap in a case.
#[derive(Debug, Clone, Copy)]
enum OverlapFrom {
    /// `--prefill-overlap` with the truth's value.
    Given,
    /// `--mixed-step` measured on the truth: 16 sequences (a benchmarked concurrency, so the
    /// fitted curve has its decode step) decoding beside one 512-token chunk.
    MixedStep,
}

/// A case's benchmark and the two fits of it.
struct Fits {
    benches: Vec<Bench>,
    new: HardwareProfile,
    old: HardwareProfile,
}

/// Benchmarks the truth at every C and fits a profile the way a user would (the result files,
/// `--max-running` and `--kv-capacity-tokens` of the launch, the overlap as `how` says), and
/// the old way (`--pure-decode`); checks the fitted decode aggregates against the truth's.
fn fit_case(overlap: f64, how: OverlapFrom, prompt: u32, output: u32) -> Fits {
    let truth = true_profile(overlap);
    let benches: Vec<Bench> = CONCURRENCY
        .iter()
        .map(|&c| closed_loop(EngineMode::Step, &truth, c, prompt, output))
        .collect();
    let inputs: Vec<FitInput> = benches.iter().map(Bench::result_json).collect();
    let mixed = MixedStep {
        decoding: 16,
        prompt_tokens: 512,
        step_s: truth.mixed_step_time_s(16.0, 512.0),
    };
    let opts = FitOptions {
        name: "fitted".into(),
        max_running: Some(truth.max_running()),
        kv_capacity_tokens: Some(truth.kv_capacity_tokens()),
        prefill_overlap: matches!(how, OverlapFrom::Given).then_some(overlap),
        mixed_step: matches!(how, OverlapFrom::MixedStep).then_some(mixed),
        ..FitOptions::default()
    };
    let new = fit(FitSource::VllmBench, &inputs, &opts).unwrap_or_else(|e| panic!("{e}"));
    let old = fit(
        FitSource::VllmBench,
        &inputs,
        &FitOptions {
            pure_decode: true,
            ..opts.clone()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // the fit recovers what the benchmark could reveal of the truth
    assert!(
        (new.profile.prefill_tok_s() / truth.prefill_tok_s() - 1.0).abs() < 0.01,
        "prefill {} vs {}",
        new.profile.prefill_tok_s(),
        truth.prefill_tok_s()
    );
    assert!(
        (new.profile.prefill_overlap() - overlap).abs() < 0.03,
        "overlap {} vs {overlap}",
        new.profile.prefill_overlap()
    );
    println!(
        "true overlap {overlap}, fitted {} ({how:?}); P = {prompt}, N = {output}",
        new.profile.prefill_overlap()
    );
    // The decode aggregate the subtraction finds is the truth's, seen at the batch the closed
    // loop decodes (a little under C while a prompt prefills): this holds whatever the fluid
    // engine does with the profile.
    for &c in &CONCURRENCY {
        let c = f64::from(c);
        let (got, want, old_got) = (
            new.profile.aggregate_tok_s(c),
            truth.aggregate_tok_s(c),
            old.profile.aggregate_tok_s(c),
        );
        println!(
            "decode aggregate at {c}: truth {want:.1}, fitted {got:.1} ({:+.2} %), old fit \
             {old_got:.1} ({:+.2} %)",
            (got / want - 1.0) * 100.0,
            (old_got / want - 1.0) * 100.0
        );
        assert!(
            (got / want - 1.0).abs() <= CURVE_TOLERANCE
                && (old_got / want - 1.0) < -(got / want - 1.0).abs(),
            "decode aggregate at {c}: truth {want:.1}, fitted {got:.1}, old fit {old_got:.1}"
        );
    }
    Fits {
        benches,
        new: new.profile,
        old: old.profile,
    }
}

/// [`fit_case`], then the same closed loops on the fluid engine with both fits, printed.
fn closed_loop_case(overlap: f64, how: OverlapFrom, prompt: u32, output: u32) -> Vec<Row> {
    let Fits { benches, new, old } = fit_case(overlap, how, prompt, output);
    println!(
        "{:>4} {:>10} {:>10} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "C",
        "bench",
        "fitted",
        "err %",
        "old fit",
        "err %",
        "TTFT ms",
        "sim TTFT",
        "TPOT ms",
        "sim TPOT"
    );
    benches
        .into_iter()
        .map(|bench| {
            let c = bench.concurrency;
            let row = Row {
                bench,
                fitted: closed_loop(EngineMode::Fluid, &new, c, prompt, output),
                old: closed_loop(EngineMode::Fluid, &old, c, prompt, output),
            };
            println!(
                "{c:>4} {:>10.1} {:>10.1} {:>+8.2} {:>10.1} {:>+8.2} {:>9.1} {:>9.1} {:>9.2} {:>9.2}",
                row.bench.output_tok_s(),
                row.fitted.output_tok_s(),
                row.error(&row.fitted) * 100.0,
                row.old.output_tok_s(),
                row.error(&row.old) * 100.0,
                row.bench.mean_ttft_s * 1e3,
                row.fitted.mean_ttft_s * 1e3,
                row.bench.mean_tpot_s * 1e3,
                row.fitted.mean_tpot_s * 1e3,
            );
            row
        })
        .collect()
}

/// The must-show, for one case: within [`TOLERANCE`] at every C, and the old fit (prefill
/// counted twice: once in the closed-loop figure taken as decode, once by the simulator) too
/// slow and further off at every C.
fn assert_reproduced(rows: &[Row]) {
    for row in rows {
        let c = row.bench.concurrency;
        let new = row.error(&row.fitted);
        let old = row.error(&row.old);
        assert!(
            new.abs() <= TOLERANCE,
            "C = {c}: the fitted profile's closed loop is off by {:+.2} %",
            new * 100.0
        );
        assert!(
            old < 0.0 && old.abs() > new.abs(),
            "C = {c}: the old fit is off by {:+.2} %, the new by {:+.2} %",
            old * 100.0,
            new * 100.0
        );
    }
}

/// Additive steps (overlap 0): the fluid engine before issue 15's step model times a mixed
/// step so, which makes this the case that holds on either side of that change.
#[test]
fn a_closed_loop_fit_reproduces_its_benchmark_with_additive_steps() {
    for (prompt, output) in [(512, 128), (256, 256)] {
        assert_reproduced(&closed_loop_case(0.0, OverlapFrom::Given, prompt, output));
    }
}

/// With the default overlap learned from one mixed step, the subtraction finds the truth's
/// decode curve (within [`CURVE_TOLERANCE`]; the old fit misses it by more) whatever the fluid
/// engine then does with it.
#[test]
fn the_subtraction_finds_the_decode_curve_under_the_default_overlap() {
    for (prompt, output) in [(512, 128), (256, 256)] {
        fit_case(
            routelab_sim::hardware::DEFAULT_PREFILL_OVERLAP,
            OverlapFrom::MixedStep,
            prompt,
            output,
        );
    }
}

/// The default overlap, learned from one mixed step as a user would. The benchmark's steps
/// hide 40 % of their shorter part, and the fluid engine times its mixed steps with the same
/// `mixed_step_s`.
#[test]
fn a_closed_loop_fit_reproduces_its_benchmark_with_the_default_overlap() {
    for (prompt, output) in [(512, 128), (256, 256)] {
        assert_reproduced(&closed_loop_case(
            routelab_sim::hardware::DEFAULT_PREFILL_OVERLAP,
            OverlapFrom::MixedStep,
            prompt,
            output,
        ));
    }
}

/// The pure-decode sweep a user measures: `c` sequences of a 1-token prompt decoding `output`
/// tokens together (one burst, nothing prefilling beside them once they decode), reported as
/// `routelab bench`'s `decode.csv` reports it: `c` × tokens after the first ÷ time after the
/// first token.
fn decode_sweep_csv(truth: &HardwareProfile, output: u32) -> String {
    let mut csv = String::from("concurrency,aggregate_tok_s\n");
    for &c in &CONCURRENCY {
        let mut e = Engine::new(
            EngineMode::Step,
            Arc::new(truth.clone()),
            EngineOverrides::default(),
            7,
        );
        for seq in 0..u64::from(c) {
            e.admit(0, Admission::new(seq, 1, output, &[]));
        }
        let (mut tokens, mut secs) = (0.0, 0.0);
        let mut outs = Vec::new();
        while let Some(t) = e.next_event_time() {
            e.advance_to(t, &mut outs);
            for o in outs.drain(..) {
                if let EngineOutput::Completed(d) = o {
                    tokens += f64::from(output - 1);
                    secs += (d.at - d.first_token_at) as f64 / NS;
                }
            }
        }
        csv.push_str(&format!("{c},{:.3}\n", f64::from(c) * tokens / secs));
    }
    csv
}

/// Issue 31's must-show: `prefill_overlap` inferred from closed-loop benchmark results of a
/// step-level engine with a known overlap — against a pure-decode sweep of the same engine,
/// and without one from runs at two prompt lengths per concurrency — within ±0.1 of the truth,
/// with an uncertainty; and the profile fitted so predicts the benchmark's closed loops.
#[test]
fn the_overlap_is_recovered_from_closed_loop_results_with_and_without_a_decode_sweep() {
    const BOUND: f64 = 0.1;
    let (long, short, output) = (1024, 256, 128);
    for truth_overlap in [0.1, 0.5, 0.9] {
        let truth = true_profile(truth_overlap);
        let runs = |prompt: u32| -> Vec<Bench> {
            CONCURRENCY
                .iter()
                .map(|&c| closed_loop(EngineMode::Step, &truth, c, prompt, output))
                .collect()
        };
        let (long_runs, short_runs) = (runs(long), runs(short));
        let opts = FitOptions {
            name: "fitted".into(),
            max_running: Some(truth.max_running()),
            kv_capacity_tokens: Some(truth.kv_capacity_tokens()),
            ..FitOptions::default()
        };
        let sweep = FitInput {
            origin: "decode.csv".into(),
            text: decode_sweep_csv(&truth, 256),
        };
        let with_sweep = fit(
            FitSource::VllmBench,
            &long_runs.iter().map(Bench::result_json).collect::<Vec<_>>(),
            &FitOptions {
                decode_sweep: Some(sweep),
                ..opts.clone()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // without a sweep: the long-prompt runs and the short-prompt runs at the same C must
        // give one decode aggregate
        let mut both: Vec<FitInput> = long_runs.iter().map(Bench::result_json).collect();
        both.extend(short_runs.iter().map(|b| FitInput {
            origin: format!("short-c{}.json", b.concurrency),
            ..b.result_json()
        }));
        let without_sweep =
            fit(FitSource::VllmBench, &both, &opts).unwrap_or_else(|e| panic!("{e}"));
        for (how, f) in [("with the sweep", &with_sweep), ("without", &without_sweep)] {
            let of = f.overlap_fit.as_ref().expect("an overlap was fitted");
            println!(
                "truth {truth_overlap}: {how}: fitted {:.3} ± {:?}, per row {:?}",
                of.value, of.std_error, of.per_row
            );
            assert!(
                (of.value - truth_overlap).abs() <= BOUND,
                "{how}: fitted overlap {:.3}, truth {truth_overlap}",
                of.value
            );
            assert_eq!(f.profile.prefill_overlap(), of.value);
            assert!(
                of.std_error.is_some_and(|e| e.is_finite()),
                "{how}: no uncertainty"
            );
            // predict: the fitted profile's closed loops against the benchmark's
            for b in &long_runs {
                let sim = closed_loop(EngineMode::Fluid, &f.profile, b.concurrency, long, output);
                let err = sim.output_tok_s() / b.output_tok_s() - 1.0;
                assert!(
                    err.abs() <= TOLERANCE,
                    "{how}: C = {}: predicted {:.1} tok/s, benchmark {:.1} ({:+.2} %)",
                    b.concurrency,
                    sim.output_tok_s(),
                    b.output_tok_s(),
                    err * 100.0
                );
            }
        }
    }
}
