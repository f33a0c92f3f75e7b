//! `--from gateway`: a saved `GET /admin/capacity` of the routelab gateway
//! ([`GATEWAY_SCHEMA`]), one worker's passive points weighted by `observed_s`.

use routelab_policies::located::{InputError, rule};
use serde_json::{Map, Value};

use super::super::MIN_CONTEXT_WINDOW;
use super::json::{key_position, parse_json};
use super::{FitInput, GATEWAY_SCHEMA, Measured, Obs, RowAt, not_valid};

/// Reads the worker `worker` names (or the file's only one): its points, `gpu_names` and
/// `context_window`.
pub(super) fn read_gateway(input: &FitInput, worker: Option<&str>) -> Result<Measured, InputError> {
    let what = format!(
        "the JSON of the gateway's GET /admin/capacity: {{\"schema\": \"{GATEWAY_SCHEMA}\", \
         \"model\", \"generated_unix_s\", \"workers\": [{{\"name\", \"gpu_names\", \
         \"context_window\", \"points\": [{{\"concurrency\", \"aggregate_tok_s\", \
         \"observed_s\", \"tokens\"}}]}}]}}"
    );
    let v = parse_json(input, &what)?;
    let origin = input.origin.as_str();
    let Some(obj) = v.as_object() else {
        return Err(InputError::new(origin, "", "not a JSON object").valid(what));
    };
    check_schema(input, obj)?;
    let model = obj.get("model").and_then(Value::as_str).unwrap_or("?");
    let workers = obj
        .get("workers")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            at_key(
                input,
                "workers",
                "missing or not a list".into(),
                "a list of workers",
            )
        })?;
    let index = pick_worker(origin, workers, worker)?;
    let w = Worker {
        input,
        value: &workers[index],
        field: format!("workers[{index}]"),
    };
    let wname = name_of(w.value).ok_or_else(|| {
        w.bad(
            format!("{}.name", w.field),
            "missing or not a string".into(),
            "a name",
        )
    })?;
    let mut m = Measured {
        weight_name: "each point's observed_s",
        ..Measured::default()
    };
    w.read_card(&mut m)?;
    w.read_points(&wname, &mut m)?;
    let generated = obj
        .get("generated_unix_s")
        .map_or_else(|| "?".to_string(), Value::to_string);
    m.sources.push(format!(
        "{origin} ({GATEWAY_SCHEMA}, model {model}, worker {wname}, generated_unix_s \
         {generated}): points concurrency, aggregate_tok_s, observed_s; gpu_names; \
         context_window"
    ));
    Ok(m)
}

/// An error at the first `"key"` of the file (its field named as the key).
fn at_key(input: &FitInput, key: &str, msg: String, valid: &str) -> InputError {
    let (l, c) = key_position(&input.text, key);
    InputError::new(&input.origin, key, msg)
        .at(l, c)
        .valid(valid)
}

/// The file must declare [`GATEWAY_SCHEMA`].
fn check_schema(input: &FitInput, obj: &Map<String, Value>) -> Result<(), InputError> {
    match obj.get("schema") {
        Some(Value::String(s)) if s == GATEWAY_SCHEMA => Ok(()),
        Some(other) => Err(at_key(
            input,
            "schema",
            format!("schema {other} is not the gateway capacity format"),
            &format!("\"{GATEWAY_SCHEMA}\" (a saved GET /admin/capacity)"),
        )),
        None => Err(
            InputError::new(&input.origin, "schema", "missing field `schema`").valid(format!(
                "\"{GATEWAY_SCHEMA}\" (a saved GET /admin/capacity)"
            )),
        ),
    }
}

/// A worker's `name`.
fn name_of(w: &Value) -> Option<String> {
    w.get("name").and_then(Value::as_str).map(str::to_string)
}

/// The index of the worker `want` names, or of the only worker; the error lists the names.
fn pick_worker(origin: &str, workers: &[Value], want: Option<&str>) -> Result<usize, InputError> {
    let listed = || {
        let names: Vec<String> = workers.iter().filter_map(name_of).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    match want {
        Some(want) => workers
            .iter()
            .position(|w| name_of(w).as_deref() == Some(want))
            .ok_or_else(|| {
                InputError::new(origin, "workers", format!("no worker `{want}`"))
                    .valid(format!("--worker one of: {}", listed()))
            }),
        None if workers.len() == 1 => Ok(0),
        None => Err(InputError::new(
            origin,
            "workers",
            format!("{} workers; say which one to fit", workers.len()),
        )
        .valid(format!("--worker one of: {}", listed()))),
    }
}

/// The worker being fitted, with its field path (`workers[i]`) for errors.
struct Worker<'a> {
    input: &'a FitInput,
    value: &'a Value,
    field: String,
}

impl Worker<'_> {
    /// An error at `field` (no position: the worker's fields repeat across workers).
    fn bad(&self, field: String, msg: String, valid: &str) -> InputError {
        InputError::new(&self.input.origin, field, msg).valid(valid)
    }

    /// Its `gpu_names` and `context_window`, when given.
    fn read_card(&self, m: &mut Measured) -> Result<(), InputError> {
        if let Some(g) = self.value.get("gpu_names").and_then(Value::as_array) {
            m.gpu_names = g
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect();
        }
        if let Some(c) = self.value.get("context_window") {
            let cw = c
                .as_f64()
                .and_then(|x| {
                    rule::whole(x, u64::from(MIN_CONTEXT_WINDOW), u64::from(u32::MAX)).ok()
                })
                .ok_or_else(|| {
                    self.bad(
                        format!("{}.context_window", self.field),
                        format!("{c} is not a context window"),
                        "a whole number of tokens >= 1024",
                    )
                })?;
            m.context_window = Some((cw as u32, "the gateway's context_window".to_string()));
        }
        Ok(())
    }

    /// Its points in concurrency order, one per concurrency; those without a token counted
    /// are left out and said so in a note.
    fn read_points(&self, wname: &str, m: &mut Measured) -> Result<(), InputError> {
        let wf = &self.field;
        let points = self
            .value
            .get("points")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                self.bad(
                    format!("{wf}.points"),
                    "missing or not a list".into(),
                    "a list of {concurrency, aggregate_tok_s, observed_s, tokens}",
                )
            })?;
        if points.is_empty() {
            return Err(self.bad(
                format!("{wf}.points"),
                format!("worker `{wname}` has no measured points yet"),
                "at least one point (let the gateway serve traffic first)",
            ));
        }
        // A concurrency observed long enough but with no token counted (only failed or
        // buffered responses were decoding there) says nothing about speed: left out, and
        // said so.
        let mut without_tokens = Vec::new();
        for (i, p) in points.iter().enumerate() {
            match self.point(i, p)? {
                Some(obs) => m.points.push(obs),
                None => without_tokens.push(self.number(i, p, "concurrency")?),
            }
        }
        if m.points.is_empty() {
            return Err(self.bad(
                format!("{wf}.points"),
                format!("worker `{wname}` has no point with tokens (every aggregate_tok_s is 0)"),
                "at least one point with aggregate_tok_s > 0 (let the gateway serve streamed traffic)",
            ));
        }
        if !without_tokens.is_empty() {
            m.notes.push(format!(
                "decode.points: left out the gateway's points at concurrency {} (observed, but \
                 no output token counted there)",
                without_tokens
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        m.points
            .sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
        for pair in m.points.windows(2) {
            if pair[0].concurrency == pair[1].concurrency {
                return Err(self.bad(
                    format!("{wf}.points"),
                    format!("concurrency {} appears twice", pair[0].concurrency),
                    "one point per concurrency",
                ));
            }
        }
        Ok(())
    }

    /// The number > 0 at `key` of point `i`.
    fn number(&self, i: usize, p: &Value, key: &str) -> Result<f64, InputError> {
        let f = format!("{}.points[{i}].{key}", self.field);
        let v = p
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| self.bad(f.clone(), "missing or not a number".into(), "a number > 0"))?;
        rule::positive(v).map_err(|e| self.bad(f, not_valid(&e), &e.expected))
    }

    /// Point `i` as a measured point; none when no token was counted there.
    fn point(&self, i: usize, p: &Value) -> Result<Option<Obs>, InputError> {
        if p.get("aggregate_tok_s").and_then(Value::as_f64) == Some(0.0) {
            return Ok(None);
        }
        let (line, column) = key_position(&self.input.text, "points");
        Ok(Some(Obs {
            concurrency: self.number(i, p, "concurrency")?,
            aggregate_tok_s: self.number(i, p, "aggregate_tok_s")?,
            weight: self.number(i, p, "observed_s")?,
            closed_loop: None,
            rounds: 1,
            context_tokens: None,
            at: RowAt {
                file: self.input.origin.clone(),
                field: format!("{}.points[{i}].aggregate_tok_s", self.field),
                line,
                column,
            },
        }))
    }
}
