//! `--from vllm-bench`: the result files of `vllm bench serve --save-result`, one closed loop
//! per `--max-concurrency` run.

use routelab_policies::located::{InputError, rule};
use serde_json::Value;

use super::json::{key_position, parse_json};
use super::{ClosedLoop, FitInput, Measured, Obs, RowAt, not_valid};

/// lengths differ by more than this share.
const SAME_LENGTH_SHARE: f64 = 0.05;

/// The fields of a `vllm bench serve --save-result` file that the fit reads.
pub const VLLM_FIELDS: [&str; 7] = [
    "max_concurrency",
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "mean_ttft_ms",
];

/// What one result file says.
struct BenchRun {
    origin: String,
    concurrency: f64,
    completed: f64,
    duration_s: f64,
    total_input_tokens: f64,
    total_output_tokens: f64,
    output_tok_s: f64,
    mean_ttft_ms: f64,
    /// Where `output_throughput` is, for errors about the point.
    at: RowAt,
}

/// One result file.
fn read_vllm_one(input: &FitInput) -> Result<BenchRun, InputError> {
    let what = "the JSON object `vllm bench serve --save-result` writes (max_concurrency, \
                completed, duration, total_input_tokens, total_output_tokens, output_throughput, \
                mean_ttft_ms, ...)";
    let v = parse_json(input, what)?;
    let Some(obj) = v.as_object() else {
        let kind = match v {
            Value::Array(_) => "a JSON array",
            Value::String(_) => "a JSON string",
            Value::Number(_) => "a JSON number",
            Value::Bool(_) => "a JSON boolean",
            _ => "JSON null",
        };
        return Err(
            InputError::new(&input.origin, "", format!("{kind}, not a benchmark result"))
                .at(Some(1), Some(1))
                .valid(what),
        );
    };
    let origin = input.origin.as_str();
    let err = |key: &str, msg: String, valid: &str| {
        let (l, c) = key_position(&input.text, key);
        InputError::new(origin, key, msg).at(l, c).valid(valid)
    };
    let num = |key: &str, valid: &str| -> Result<f64, InputError> {
        match obj.get(key) {
            None => Err(err(
                key,
                format!("missing field `{key}`"),
                "the result JSON of `vllm bench serve --save-result`, which has it",
            )),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| err(key, format!("{n} is out of range"), valid)),
            Some(other) => Err(err(key, format!("{other} is not a number"), valid)),
        }
    };
    let concurrency = match obj.get("max_concurrency") {
        Some(Value::Null) => {
            return Err(err(
                "max_concurrency",
                "null: this run was limited by request rate, not by concurrency".into(),
                "a run with `--max-concurrency N` (one file per N) so that the throughput \
                 belongs to a known concurrency",
            ));
        }
        _ => num("max_concurrency", "a whole number >= 1")?,
    };
    rule::whole(concurrency, 1, 1 << 20)
        .map_err(|e| err("max_concurrency", not_valid(&e), &e.expected))?;
    let positive = |key: &str| -> Result<f64, InputError> {
        let v = num(key, "a number > 0")?;
        rule::positive(v).map_err(|e| err(key, not_valid(&e), &e.expected))
    };
    Ok(BenchRun {
        origin: origin.to_string(),
        concurrency,
        completed: positive("completed")?,
        duration_s: positive("duration")?,
        total_input_tokens: positive("total_input_tokens")?,
        total_output_tokens: positive("total_output_tokens")?,
        output_tok_s: positive("output_throughput")?,
        mean_ttft_ms: positive("mean_ttft_ms")?,
        at: {
            let (line, column) = key_position(&input.text, "output_throughput");
            RowAt {
                file: origin.to_string(),
                field: "output_throughput".into(),
                line,
                column,
            }
        },
    })
}

/// Reads the runs, one point each (a closed loop weighted by its duration); the
/// `max_concurrency` 1 run gives the prefill speed.
pub(super) fn read_vllm(inputs: &[FitInput]) -> Result<Measured, InputError> {
    let mut runs = inputs
        .iter()
        .map(read_vllm_one)
        .collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
    let lengths = |r: &BenchRun| {
        (
            r.total_input_tokens / r.completed,
            r.total_output_tokens / r.completed,
        )
    };
    let differ = |a: f64, b: f64| (a / b - 1.0).abs() > SAME_LENGTH_SHARE;
    for w in runs.windows(2) {
        let ((p0, n0), (p1, n1)) = (lengths(&w[0]), lengths(&w[1]));
        if w[0].concurrency == w[1].concurrency && !differ(p0, p1) && !differ(n0, n1) {
            return Err(InputError::new(
                &w[1].origin,
                "max_concurrency",
                format!(
                    "max_concurrency {} is also the one of {}",
                    w[1].concurrency, w[0].origin
                ),
            )
            .valid(
                "one file per --max-concurrency value, or runs at one concurrency whose mean \
                 prompt or output lengths differ by more than 5 % (they fit prefill_overlap)",
            ));
        }
    }
    let mut m = Measured {
        weight_name: "each run's duration (s)",
        ..Measured::default()
    };
    for r in &runs {
        m.points.push(Obs {
            concurrency: r.concurrency,
            aggregate_tok_s: r.output_tok_s,
            weight: r.duration_s,
            // a --max-concurrency run is a closed loop: its output throughput holds the time
            // its prompts were prefilled
            closed_loop: Some(ClosedLoop {
                concurrency: r.concurrency,
                output_tok_s: r.output_tok_s,
                prompt_tokens: r.total_input_tokens / r.completed,
                output_tokens: r.total_output_tokens / r.completed,
            }),
            context_tokens: None,
            rounds: ((r.completed / r.concurrency).round() as u32).max(1),
            at: r.at.clone(),
        });
        m.sources.push(format!(
            "{} (vllm bench serve --save-result): max_concurrency {}, output_throughput, \
             duration, completed, total_input_tokens, total_output_tokens, mean_ttft_ms",
            r.origin, r.concurrency
        ));
    }
    if let Some(r) = runs.iter().find(|r| r.concurrency == 1.0) {
        let mean_in = r.total_input_tokens / r.completed;
        let ttft_s = r.mean_ttft_ms / 1000.0;
        m.prefill = Some((
            mean_in / ttft_s,
            format!(
                "prefill_tok_s = mean input tokens / mean TTFT of the max_concurrency 1 run ({}): \
                 {mean_in} / {ttft_s} s; TTFT also holds scheduling and the network, so this is \
                 a lower bound",
                r.origin
            ),
        ));
    }
    Ok(m)
}
