use super::json::key_position;
use super::*;
use crate::hardware::{UncertainField, mixed_step_s};

#[test]
fn isotonic_pools_violators_by_weight() {
    assert_eq!(isotonic(&[1.0, 2.0, 3.0], &[1.0; 3]), vec![1.0, 2.0, 3.0]);
    assert_eq!(isotonic(&[1.0, 3.0, 2.0], &[1.0; 3]), vec![1.0, 2.5, 2.5]);
    // the heavier point moves less
    assert_eq!(
        isotonic(&[1.0, 4.0, 1.0], &[1.0, 3.0, 1.0]),
        vec![1.0, 3.25, 3.25]
    );
    // a violation that spans several blocks pools them all
    let out = isotonic(&[5.0, 6.0, 7.0, 0.0], &[1.0; 4]);
    assert!(out.windows(2).all(|w| w[0] <= w[1]), "{out:?}");
    assert!((out.iter().sum::<f64>() - 18.0).abs() < 1e-12, "{out:?}");
}

fn csv(text: &str) -> FitInput {
    FitInput {
        origin: "m.csv".into(),
        text: text.into(),
    }
}

fn opts() -> FitOptions {
    FitOptions {
        name: "t".into(),
        ..FitOptions::default()
    }
}

#[test]
fn csv_fit_writes_the_notes_and_defaults() {
    let f = fit(
        FitSource::Csv,
        &[csv(
            "concurrency,aggregate_tok_s,cold_burst_tok_s\n1,100,\n8,420,\n16,410,100\n",
        )],
        &opts(),
    )
    .unwrap();
    let p = &f.profile;
    assert_eq!(p.origin(), "fitted:t");
    assert_eq!(p.max_running(), DEFAULT_MAX_RUNNING);
    assert_eq!(p.context_window(), DEFAULT_CONTEXT_WINDOW);
    assert!((p.aggregate_tok_s(8.0) - 415.0).abs() < 1e-9);
    assert!((p.aggregate_tok_s(16.0) - 415.0).abs() < 1e-9);
    assert!((p.prefill_tok_s() - 1000.0).abs() < 1e-9);
    let cold = p.cold_start();
    assert!((cold.speed_factor - 100.0 / 415.0).abs() < 1e-4);
    // one probe burst of work: 64 prompt + 127 decode tokens per sequence
    assert_eq!(cold.warmup_tokens, 16.0 * 191.0);
    assert!(
        p.extrapolated()
            .iter()
            .any(|e| e.contains("16 x (64 prompt + 127 decode) tokens")),
        "{:?}",
        p.extrapolated()
    );
    assert!(
        p.fitted().iter().any(|n| n.contains("2 of 3 points moved")),
        "{:?}",
        p.fitted()
    );
    // the first note says what the decode figures are
    assert!(
        p.fitted()[0].starts_with("decode aggregate from pure-decode rows: the rows give no"),
        "{:?}",
        p.fitted()
    );
    for field in [
        "max_running",
        "kv_capacity_tokens",
        "context_window",
        "prefill_tok_s",
    ] {
        assert!(
            p.extrapolated().iter().any(|e| e.starts_with(field)),
            "{field} not listed: {:?}",
            p.extrapolated()
        );
    }
}

#[test]
fn flags_replace_defaults_and_are_checked() {
    let input = [csv(
        "concurrency,aggregate_tok_s,prefill_tok_s\n1,100,5000\n4,300,\n",
    )];
    let o = FitOptions {
        kv_capacity_tokens: Some(50_000),
        max_running: Some(12),
        context_window: Some(16_384),
        ..opts()
    };
    let p = fit(FitSource::Csv, &input, &o).unwrap().profile;
    assert_eq!(
        (p.kv_capacity_tokens(), p.max_running(), p.context_window()),
        (50_000, 12, 16_384)
    );
    assert_eq!(p.prefill_tok_s(), 5000.0);
    let bad = FitOptions {
        kv_capacity_tokens: Some(1000),
        ..opts()
    };
    let e = fit(FitSource::Csv, &input, &bad).unwrap_err();
    assert_eq!(e.field, "--kv-capacity-tokens", "{e}");
    // Above what a profile may declare: refused at the flag, not in the generated YAML.
    let huge = FitOptions {
        kv_capacity_tokens: Some(super::super::MAX_KV_CAPACITY_TOKENS + 1),
        ..opts()
    };
    let e = fit(FitSource::Csv, &input, &huge).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.field.as_str()),
        ("<command line>", "--kv-capacity-tokens"),
        "{e}"
    );
    let many = FitOptions {
        max_running: Some(super::super::MAX_RUNNING_LIMIT + 1),
        ..opts()
    };
    let e = fit(FitSource::Csv, &input, &many).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.field.as_str()),
        ("<command line>", "--max-running"),
        "{e}"
    );
}

#[test]
fn csv_errors_are_located() {
    let cases = [
        (
            "concurrency,aggregate_tok_s\n1,100\n1,200\n",
            "concurrency",
            Some(3),
        ),
        (
            "concurrency,aggregate_tok_s\n1,100\n2,-5\n",
            "aggregate_tok_s",
            Some(3),
        ),
        (
            "concurrency,aggregate_tok_s\n1,NaN\n",
            "aggregate_tok_s",
            Some(2),
        ),
        ("concurrency,tok_s\n1,100\n", "tok_s", Some(1)),
        ("concurrency\n1\n", "aggregate_tok_s", Some(1)),
        ("concurrency,aggregate_tok_s\n", "", None),
    ];
    for (text, field, line) in cases {
        let e = fit(FitSource::Csv, &[csv(text)], &opts()).unwrap_err();
        assert_eq!(e.field, field, "{text}: {e}");
        assert_eq!(e.line, line, "{text}: {e}");
        assert!(e.valid.is_some(), "{e}");
    }
}

/// Requests of 500 prompt and 101 output tokens at one request a second: 101 output tok/s,
/// of which 100 from decode steps; their prefill alone, at 5,000 tok/s, takes 0.1 s of
/// every second (q).
fn loop_at(concurrency: f64) -> ClosedLoop {
    ClosedLoop {
        concurrency,
        output_tok_s: 101.0,
        prompt_tokens: 500.0,
        output_tokens: 101.0,
    }
}

fn model(overlap: f64) -> StepModel {
    StepModel {
        prefill_tok_s: 5000.0,
        prefill_chunk_tokens: 512,
        prefill_overlap: overlap,
    }
}

fn close(got: f64, want: f64) -> bool {
    (got / want - 1.0).abs() < 1e-12
}

#[test]
fn one_client_subtracts_its_whole_prefill() {
    // nothing decodes beside the prompt: 0.9 s of decode for 100 tokens, whatever overlap
    for o in [0.0, 0.4, 1.0] {
        let a = loop_at(1.0).decode_aggregate(&model(o)).unwrap();
        assert!(close(a, 100.0 / 0.9), "overlap {o}: {a}");
    }
}

#[test]
fn a_prefill_under_the_decode_hides_its_overlap() {
    // 16 clients: each 512-token prefill step (102.4 ms alone) runs beside ~15 decodes
    // (~140 ms alone), the decode-bound side: delta = 1 - (1 - overlap) q
    for (o, delta) in [(0.0, 0.9), (0.4, 0.94), (1.0, 1.0)] {
        let a = loop_at(16.0).decode_aggregate(&model(o)).unwrap();
        assert!(
            close(a, 100.0 / delta),
            "overlap {o}: {a}, want {}",
            100.0 / delta
        );
    }
}

#[test]
fn a_prefill_longer_than_its_decode_hides_the_decode() {
    // 2 clients: the 102.4 ms prefill step beside one decode of ~9 ms is prefill-bound; it
    // adds p - overlap d: 1 = delta + q - overlap m b delta / D, so
    // delta = (1 - q) / (1 - overlap m b / D)
    let o = 0.4;
    let m = 500.0 / 512.0; // prefill steps a second, 512 tokens each
    let b = 2.0 - 512.0 / 500.0; // sequences decoding beside them
    let delta = 0.9 / (1.0 - o * m * b / 100.0);
    let a = loop_at(2.0).decode_aggregate(&model(o)).unwrap();
    assert!(close(a, 100.0 / delta), "{a} vs {}", 100.0 / delta);
    // and the step the solution implies is the step model's own
    let d = b * delta / 100.0;
    let p = 512.0 / 5000.0;
    assert!(d < p);
    let second = delta + m * (mixed_step_s(d, p, o) - d);
    assert!((second - 1.0).abs() < 1e-12, "{second}");
}

#[test]
fn impossible_closed_loops_are_refused() {
    let one_token = ClosedLoop {
        output_tokens: 1.0,
        ..loop_at(4.0)
    };
    let e = one_token.decode_aggregate(&model(0.4)).unwrap_err();
    assert!(matches!(e, ClosedLoopError::NoDecodeStep { .. }), "{e}");
    assert!(e.to_string().contains("no decode step"), "{e}");
    // 101 tok/s of 500-token prompts need 500 prompt tok/s: more than a 400 tok/s prefill
    let slow = StepModel {
        prefill_tok_s: 400.0,
        ..model(0.4)
    };
    let e = loop_at(4.0).decode_aggregate(&slow).unwrap_err();
    assert!(e.to_string().contains("leave no time to decode"), "{e}");
    let e = ClosedLoop {
        output_tok_s: f64::NAN,
        ..loop_at(4.0)
    }
    .decode_aggregate(&model(0.4))
    .unwrap_err();
    assert!(matches!(
        e,
        ClosedLoopError::NotPositive {
            name: "output tok/s",
            ..
        }
    ));
    assert!(e.to_string().contains("output tok/s = NaN"), "{e}");
}

#[test]
fn mixed_steps_parse_or_say_what_is_valid() {
    let m = MixedStep::parse(" 256 : 539 : 16.3 ").unwrap();
    assert_eq!((m.decoding, m.prompt_tokens), (256, 539));
    assert!((m.step_s - 0.0163).abs() < 1e-15, "{m:?}");
    for (text, says) in [
        ("256:539", "not three numbers"),
        ("256:539:16.3:1", "not three numbers"),
        ("a:539:16.3", "N `a` is not a number"),
        ("0:539:16.3", "N: 0 is not valid"),
        ("256:5.5:16.3", "PROMPT_TOKENS: 5.5 is not valid"),
        ("256:539:-1", "STEP_MS: -1 is not valid"),
        ("256:539:inf", "STEP_MS: inf is not valid"),
    ] {
        let e = MixedStep::parse(text).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("<command line>", "--mixed-step"),
            "{e}"
        );
        assert!(e.message.contains(says), "{text}: {e}");
        assert!(
            e.valid
                .as_deref()
                .is_some_and(|v| v.contains("N:PROMPT_TOKENS:STEP_MS")),
            "{e}"
        );
    }
}

/// Pure-decode rows (100 tok/s at 1 -> 10 ms, 800 at 16 -> 20 ms steps) and a 2,000 tok/s
/// prefill: one mixed step of 16 beside 100 prompt tokens (50 ms alone) fits the overlap.
const PURE: &str = "concurrency,aggregate_tok_s,prefill_tok_s\n1,100,2000\n16,800,\n";

#[test]
fn a_mixed_step_fits_and_writes_the_overlap() {
    let step = MixedStep {
        decoding: 16,
        prompt_tokens: 100,
        step_s: mixed_step_s(0.020, 0.050, 0.25),
    };
    let f = fit(
        FitSource::Csv,
        &[csv(PURE)],
        &FitOptions {
            mixed_step: Some(step),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(f.profile.prefill_overlap(), 0.25);
    assert!(f.yaml.contains("prefill_overlap: 0.25\n"), "{}", f.yaml);
    assert!(
        f.profile
            .fitted()
            .iter()
            .any(|n| n.starts_with("prefill_overlap 0.25 from one mixed step")),
        "{:?}",
        f.profile.fitted()
    );
    // no closed-loop row: nothing was subtracted, and nothing says it was
    assert!(
        !f.profile
            .fitted()
            .iter()
            .any(|n| n.contains("prefill subtracted"))
    );
}

#[test]
fn bad_overlaps_and_steps_are_located() {
    let input = [csv(PURE)];
    let refused = |o: FitOptions| fit(FitSource::Csv, &input, &o).unwrap_err();
    for bad in [-0.1, 1.5, f64::NAN] {
        let e = refused(FitOptions {
            prefill_overlap: Some(bad),
            ..opts()
        });
        assert_eq!(e.field, "--prefill-overlap", "{e}");
        assert!(
            e.valid
                .as_deref()
                .is_some_and(|v| v.contains("from 0 to 1")),
            "{e}"
        );
    }
    // a step shorter than its decode alone (20 ms), and one longer than both added (70 ms)
    for ms in [15.0, 80.0] {
        let e = refused(FitOptions {
            mixed_step: Some(MixedStep {
                decoding: 16,
                prompt_tokens: 100,
                step_s: ms / 1e3,
            }),
            ..opts()
        });
        assert_eq!(e.field, "--mixed-step", "{e}");
        assert!(
            e.message.contains("cannot carry a decode of 20.000 ms"),
            "{e}"
        );
    }
    let e = refused(FitOptions {
        prefill_overlap: Some(0.5),
        mixed_step: MixedStep::parse("16:100:60").ok(),
        ..opts()
    });
    assert!(e.message.contains("given with --mixed-step"), "{e}");
}

#[test]
fn closed_loop_rows_need_a_prefill_speed_and_room_to_decode() {
    let no_prefill =
        csv("concurrency,aggregate_tok_s,mean_prompt_tokens,mean_output_tokens\n1,100,500,101\n");
    let e = fit(FitSource::Csv, std::slice::from_ref(&no_prefill), &opts()).unwrap_err();
    assert_eq!(e.field, "--prefill-tok-s", "{e}");
    assert!(
        e.valid
            .as_deref()
            .is_some_and(|v| v.contains("--pure-decode")),
        "{e}"
    );
    // taken as pure decode when the user says so
    let f = fit(
        FitSource::Csv,
        &[no_prefill],
        &FitOptions {
            pure_decode: true,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(f.profile.aggregate_tok_s(1.0), 100.0);
    // a row whose prompts alone would take longer than the run: file, line and field
    let e = fit(
        FitSource::Csv,
        &[csv(
            "concurrency,aggregate_tok_s,prefill_tok_s,mean_prompt_tokens,mean_output_tokens\n\
             1,100,5000,500,101\n4,2000,,500,101\n",
        )],
        &opts(),
    )
    .unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.field.as_str(), e.line),
        ("m.csv", "aggregate_tok_s", Some(3)),
        "{e}"
    );
    assert!(e.message.contains("leave no time to decode"), "{e}");
}

#[test]
fn the_decode_shape_keeps_both_rules() {
    // already shaped: unchanged
    let c = [1.0, 2.0, 4.0, 8.0];
    let ok = [60.0, 110.0, 200.0, 320.0];
    assert_eq!(decode_shape(&ok, &c, &[1.0; 4]), ok.to_vec());
    // a per-request speed that rises (35 at 2, then 50 at 4): pooled until it does not
    let out = decode_shape(&[60.0, 70.0, 200.0, 320.0], &c, &[1.0; 4]);
    for i in 1..out.len() {
        assert!(out[i] >= out[i - 1] - 1e-9, "{out:?}");
        assert!(out[i] / c[i] <= out[i - 1] / c[i - 1] + 1e-9, "{out:?}");
    }
    // and it is the closest such curve: no shaped neighbour is nearer
    let err = |v: &[f64]| -> f64 {
        v.iter()
            .zip([60.0, 70.0, 200.0, 320.0])
            .map(|(a, b)| (a - b) * (a - b))
            .sum()
    };
    let pooled_speed = [60.0, 2.0 * 45.0, 4.0 * 45.0, 320.0];
    assert!(err(&out) <= err(&pooled_speed) + 1e-9, "{out:?}");
}

#[test]
fn key_positions_are_one_based() {
    assert_eq!(key_position("{\n  \"a\": 1\n}", "a"), (Some(2), Some(3)));
    assert_eq!(key_position("{}", "a"), (None, None));
}

#[test]
fn chunk_tokens_is_the_engines_budget_and_the_default_is_unchanged() {
    let rows = "concurrency,aggregate_tok_s,prefill_tok_s,mean_prompt_tokens,mean_output_tokens\n\
                1,40,2000,600,64\n4,120,,600,64\n8,180,,600,64\n";
    let default = fit(FitSource::Csv, &[csv(rows)], &opts()).unwrap();
    assert_eq!(default.profile.prefill_chunk_tokens(), 512);
    assert!(
        default
            .yaml
            .contains("\"prefill_chunk_tokens (routelab's default 512)\""),
        "{}",
        default.yaml
    );
    let given = fit(
        FitSource::Csv,
        &[csv(rows)],
        &FitOptions {
            chunk_tokens: Some(2048),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(given.profile.prefill_chunk_tokens(), 2048);
    assert!(
        given
            .yaml
            .contains("prefill_chunk_tokens 2048: the engine's")
    );
    assert!(!given.yaml.contains("routelab's default 512"));
    // the budget changes what the subtraction takes out: 4 x 600 prompt tokens are two steps
    // of 2048 tokens beside the decodes, five of 512
    assert_ne!(default.moves, given.moves);
    let e = fit(
        FitSource::Csv,
        &[csv(rows)],
        &FitOptions {
            chunk_tokens: Some(0),
            ..opts()
        },
    )
    .unwrap_err();
    assert_eq!(e.field, "--chunk-tokens", "{e}");
    assert!(e.to_string().contains("max_num_batched_tokens"), "{e}");
}

#[test]
fn a_fit_whose_loops_miss_declares_the_miss_as_uncertainty() {
    // closed loops the profile cannot reproduce exactly: the speeds' declared uncertainty
    // covers the largest miss, and the profile reads it back
    let rows = "concurrency,aggregate_tok_s,prefill_tok_s,mean_prompt_tokens,mean_output_tokens\n\
                1,40,2000,600,64\n4,120,,600,64\n8,150,,600,64\n16,160,,600,64\n";
    let f = fit(FitSource::Csv, &[csv(rows)], &opts()).unwrap();
    let miss = f
        .errors
        .iter()
        .filter(|e| e.what == "closed-loop output tok/s")
        .map(|e| e.relative().abs())
        .fold(0.0f64, f64::max);
    assert!(miss > 0.0, "{:?}", f.errors);
    for field in [UncertainField::Decode, UncertainField::PrefillTokS] {
        let u = f.profile.uncertainty(field).unwrap();
        assert!(
            u + 1e-12 >= miss && u < miss + 0.0101,
            "{field:?} ±{u}, miss {miss}"
        );
    }
    assert!(f.yaml.contains("\nuncertainty: {decode: "), "{}", f.yaml);
    assert!(f.yaml.contains("the fit's own error"), "{}", f.yaml);
}

/// A decode sweep of steps `t0(n) = 10 ms + 0.1 ms n` whose sequences read
/// `k = 4e-5 s per 1,000 tokens` attended, at the contexts given.
fn context_sweep(contexts: &[f64]) -> String {
    let mut s = String::from("concurrency,aggregate_tok_s,mean_context_tokens\n");
    for &c in contexts {
        for n in [1.0, 4.0, 16.0, 64.0] {
            let step = 0.010 + 0.0001 * n + 4e-8 * n * c;
            s.push_str(&format!("{n},{},{c}\n", n / step));
        }
    }
    s
}

fn with_sweep(sweep: String) -> Result<FittedProfile, InputError> {
    let rows = "concurrency,aggregate_tok_s,prefill_tok_s,mean_prompt_tokens,mean_output_tokens\n\
                1,40,2000,600,64\n4,120,,600,64\n8,180,,600,64\n";
    fit(
        FitSource::Csv,
        &[csv(rows)],
        &FitOptions {
            decode_sweep: Some(FitInput {
                origin: "decode.csv".into(),
                text: sweep,
            }),
            max_running: Some(64),
            ..opts()
        },
    )
}

#[test]
fn a_sweep_at_two_contexts_fits_the_kv_read_and_the_curve_at_no_context() {
    let f = with_sweep(context_sweep(&[144.0, 1040.0])).unwrap();
    let p = &f.profile;
    assert!(
        (p.kv_read_s_per_tok() * 1e3 - 4e-5).abs() < 1e-10,
        "{}",
        p.kv_read_s_per_tok()
    );
    assert!(
        f.yaml.contains("\nkv_read_s_per_ktok: 0.00004\n"),
        "{}",
        f.yaml
    );
    assert!(
        f.yaml.contains("kv_read_s_per_ktok 0.00004 ± "),
        "{}",
        f.yaml
    );
    // the curve is the step at no context, and the sweep's rows are reproduced at theirs
    for n in [1.0, 4.0, 16.0, 64.0] {
        let t0 = 0.010 + 0.0001 * n;
        assert!((p.step_time_s(n) / t0 - 1.0).abs() < 1e-4, "n = {n}");
        for c in [144.0, 1040.0] {
            let want = t0 + 4e-8 * n * c;
            assert!((p.decode_step_time_s(n, n * c) / want - 1.0).abs() < 1e-4);
        }
    }
    let sweep_errors: Vec<_> = f
        .errors
        .iter()
        .filter(|e| e.source.starts_with("decode.csv"))
        .collect();
    assert_eq!(sweep_errors.len(), 8);
    assert!(
        sweep_errors.iter().all(|e| e.relative().abs() < 1e-3),
        "{sweep_errors:?}"
    );
    // one context: no term, the curve as measured (today's fit)
    let one = with_sweep(context_sweep(&[144.0])).unwrap();
    assert_eq!(one.profile.kv_read_s_per_tok(), 0.0);
    assert!(!one.yaml.contains("kv_read_s_per_ktok"), "{}", one.yaml);
    let plain = context_sweep(&[144.0])
        .replace(",144\n", "\n")
        .replace(",mean_context_tokens", "");
    assert_eq!(
        with_sweep(plain).unwrap().yaml,
        one.yaml.replace(", mean_context_tokens", "")
    );
}

#[test]
fn a_context_sweep_that_cannot_fit_the_term_is_refused_where_it_breaks() {
    // a row without a context among rows with one
    let mut s = context_sweep(&[144.0, 1040.0]);
    s.push_str("128,9000,\n");
    let e = with_sweep(s).unwrap_err();
    assert_eq!(e.field, "mean_context_tokens", "{e}");
    assert_eq!(e.line, Some(10), "{e}");
    // a longer context's concurrency the shortest did not measure
    let mut s = context_sweep(&[144.0, 1040.0]);
    let at = s.rfind("\n4,").unwrap();
    s.replace_range(at..at + 3, "\n5,");
    let e = with_sweep(s).unwrap_err();
    assert_eq!(e.field, "concurrency", "{e}");
    assert!(
        e.to_string().contains("no row at the shortest context"),
        "{e}"
    );
    // a context on the measured rows (not a sweep)
    let e = fit(
        FitSource::Csv,
        &[csv(
            "concurrency,aggregate_tok_s,mean_context_tokens\n1,100,50\n",
        )],
        &opts(),
    )
    .unwrap_err();
    assert_eq!(e.field, "mean_context_tokens", "{e}");
    assert!(e.to_string().contains("--decode-sweep"), "{e}");
}
