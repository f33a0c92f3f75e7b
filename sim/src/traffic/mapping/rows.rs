//! Reading a mapped log: each line's mapped fields into a row (or a located bad-row error),
//! then the rows sorted by arrival with their sessions linked.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;

use super::{ArrivalUnit, FieldPath, SessionPrefix, TraceLayout, TraceMapping};
use crate::traffic::TrafficError;
use crate::traffic::hash::{
    block_content_key, blocks_for_tokens, chain_in_place, grow_prefix_blocks, key_of_bytes,
};
use crate::traffic::trace::{check_count, parse_count};
use routelab_policies::streams::splitmix64;

/// One valid row, before sorting.
#[derive(Debug)]
pub(crate) struct MappedRow {
    pub ts: i64,
    pub prompt: u32,
    pub output: u32,
    pub session: Option<String>,
    pub blocks: Vec<u64>,
    pub line: u64,
    /// The session's key once linked ([`sort_and_link_sessions`]): what groups a session's
    /// requests when the trace is resampled.
    pub session_key: Option<u64>,
}

/// What one physical line was.
pub(crate) enum Parsed {
    /// Blank, the header or a left-out leading row.
    Nothing,
    /// Not a request (see [`TraceMapping::ignored_rows_are`]).
    Ignored,
    /// A request.
    Row(MappedRow),
    /// Several spans of one line (an OpenTelemetry Collector export, `resourceSpans` →
    /// `scopeSpans` → `spans`), each a request, a row that is not one, or its own error.
    Spans(Vec<Result<Parsed, TrafficError>>),
}

/// A field's value in one row.
pub(super) enum Cell<'a> {
    Json(&'a Value),
    Text(&'a str),
    Null,
    Absent(String),
}

/// The mapped fields' values in one row.
struct Cells<'a> {
    arrival: Cell<'a>,
    prompt: Cell<'a>,
    output: Cell<'a>,
    session: Option<Cell<'a>>,
    hashes: Option<Cell<'a>>,
}

/// The CSV columns of the mapped fields.
struct Columns {
    names: Vec<String>,
    arrival: usize,
    prompt: usize,
    output: usize,
    session: Option<usize>,
    hashes: Option<usize>,
}

/// Line-by-line parser of a mapped trace.
pub(crate) struct MappedRows {
    mapping: TraceMapping,
    path: PathBuf,
    line: u64,
    columns: Option<Columns>,
    unit: ArrivalUnit,
    data_rows: u64,
    skip_rows: u64,
}

impl MappedRows {
    pub(crate) fn new(mapping: TraceMapping, path: PathBuf, skip_rows: u64) -> Self {
        Self {
            unit: mapping.arrival_unit,
            mapping,
            path,
            line: 0,
            columns: None,
            data_rows: 0,
            skip_rows,
        }
    }

    pub(crate) const fn line(&self) -> u64 {
        self.line
    }

    /// The arrival unit (`auto` resolved once a row was read) and whether the mapping declared
    /// it (rather than `auto` choosing it).
    pub(crate) fn unit(&self) -> (ArrivalUnit, bool) {
        (self.unit, self.mapping.arrival_unit != ArrivalUnit::Auto)
    }

    /// Data rows seen (after a CSV header), those left out by `skip_rows` included.
    pub(crate) const fn data_rows(&self) -> u64 {
        self.data_rows
    }

    /// The mapping read.
    pub(crate) const fn mapping(&self) -> &TraceMapping {
        &self.mapping
    }

    fn bad(&self, field: &FieldPath, problem: impl Into<String>) -> TrafficError {
        TrafficError::BadRow {
            path: self.path.clone(),
            line: self.line,
            field: field.as_str().to_owned(),
            problem: problem.into(),
        }
    }

    /// Consume one physical line.
    pub(crate) fn process(&mut self, raw: &[u8]) -> Result<Parsed, TrafficError> {
        self.line += 1;
        let is_header = self.mapping.layout == TraceLayout::Csv && self.columns.is_none();
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t.trim(),
            Err(e) => return Err(TrafficError::not_utf8(&self.path, self.line, is_header, e)),
        };
        if text.is_empty() {
            return Ok(Parsed::Nothing);
        }
        if is_header {
            self.columns = Some(self.header(text)?);
            return Ok(Parsed::Nothing);
        }
        if self.data_rows < self.skip_rows {
            self.data_rows += 1;
            return Ok(Parsed::Nothing);
        }
        self.data_rows += 1;
        match self.mapping.layout {
            TraceLayout::Jsonl => {
                let value: Value = serde_json::from_str(text).map_err(|e| {
                    TrafficError::bad_json(&self.path, self.line, &e, self.expected_object())
                })?;
                if !value.is_object() {
                    return Err(TrafficError::BadJson {
                        path: self.path.clone(),
                        line: self.line,
                        detail: format!("the line is {}, not an object", kind(&value)),
                        expected: self.expected_object(),
                    });
                }
                if let Some(spans) = self.collector_spans(&value) {
                    let items = spans
                        .into_iter()
                        .map(|(at, span)| {
                            let cells = self.cells(|path| json_cell(span, path));
                            self.row(cells).map_err(|e| e.within_field(&at))
                        })
                        .collect();
                    return Ok(Parsed::Spans(items));
                }
                let cells = self.cells(|path| json_cell(&value, path));
                self.row(cells)
            }
            TraceLayout::Csv => {
                let fields = split_csv(text);
                let cols = self.columns.as_ref().expect("header read first");
                if fields.len() != cols.names.len() {
                    return Err(TrafficError::BadRow {
                        path: self.path.clone(),
                        line: self.line,
                        field: cols
                            .names
                            .get(fields.len())
                            .map_or("<row>", String::as_str)
                            .to_owned(),
                        problem: format!(
                            "row has {} column(s) but the header has {}; expected `{}`",
                            fields.len(),
                            cols.names.len(),
                            cols.names.join(",")
                        ),
                    });
                }
                let cell = |i: usize| match fields[i].as_str() {
                    "" => Cell::Null,
                    t => Cell::Text(t),
                };
                let cells = Cells {
                    arrival: cell(cols.arrival),
                    prompt: cell(cols.prompt),
                    output: cell(cols.output),
                    session: cols.session.map(cell),
                    hashes: cols.hashes.map(cell),
                };
                self.row(cells)
            }
        }
    }

    /// The spans of an OpenTelemetry Collector export line (its file exporter writes one
    /// `ExportTraceServiceRequest` per line: `resourceSpans[].scopeSpans[].spans[]`, or
    /// `instrumentationLibrarySpans` before OTLP 0.15), each with where it sits in the line;
    /// `None` for a line that is one row (unless the mapping itself starts at `resourceSpans`).
    fn collector_spans<'v>(&self, line: &'v Value) -> Option<Vec<(String, &'v Value)>> {
        const RESOURCE: &str = "resourceSpans";
        let resources = line.get(RESOURCE)?.as_array()?;
        if self.mapping.arrival.keys.first().map(String::as_str) == Some(RESOURCE) {
            return None;
        }
        let mut spans = Vec::new();
        for (i, resource) in resources.iter().enumerate() {
            for scope_key in ["scopeSpans", "instrumentationLibrarySpans"] {
                let Some(scopes) = resource.get(scope_key).and_then(Value::as_array) else {
                    continue;
                };
                for (j, scope) in scopes.iter().enumerate() {
                    let Some(list) = scope.get("spans").and_then(Value::as_array) else {
                        continue;
                    };
                    spans.extend(list.iter().enumerate().map(|(k, span)| {
                        (format!("{RESOURCE}[{i}].{scope_key}[{j}].spans[{k}]"), span)
                    }));
                }
            }
        }
        Some(spans)
    }

    fn expected_object(&self) -> String {
        let m = &self.mapping;
        let mut keys = vec![
            format!("{}: <time>", m.arrival),
            format!("{}: <int >= 0>", m.prompt_tokens),
            format!("{}: <int >= 1>", m.output_tokens),
        ];
        keys.extend(m.session_id.iter().map(|s| format!("{s}: <id>")));
        keys.extend(m.prefix_hashes.iter().map(|s| format!("{s}: [<u64>, ...]")));
        format!(
            "one JSON object per line with {} (mapping `{}`)",
            keys.join(", "),
            m.name
        )
    }

    fn header(&self, text: &str) -> Result<Columns, TrafficError> {
        let names = split_csv(text);
        let m = &self.mapping;
        let find = |want: &FieldPath| {
            let want = want.as_str();
            names
                .iter()
                .position(|n| n == want)
                .or_else(|| names.iter().position(|n| n.eq_ignore_ascii_case(want)))
        };
        let mut missing = Vec::new();
        let mut need = |key: &str, path: &FieldPath| {
            find(path).unwrap_or_else(|| {
                missing.push(format!("`{path}` (mapping `{key}`)"));
                0
            })
        };
        let arrival = need("arrival", &m.arrival);
        let prompt = need("prompt_tokens", &m.prompt_tokens);
        let output = need("output_tokens", &m.output_tokens);
        let session = m.session_id.as_ref().map(|p| need("session_id", p));
        let hashes = m.prefix_hashes.as_ref().map(|p| need("prefix_hashes", p));
        if !missing.is_empty() {
            return Err(TrafficError::BadHeader {
                path: self.path.clone(),
                line: self.line,
                problem: format!(
                    "no column {}; the header's columns are: {}",
                    missing.join(", no column "),
                    names.join(", ")
                ),
            });
        }
        Ok(Columns {
            names,
            arrival,
            prompt,
            output,
            session,
            hashes,
        })
    }

    fn cells<'a>(&self, cell: impl Fn(&FieldPath) -> Cell<'a>) -> Cells<'a> {
        let m = &self.mapping;
        Cells {
            arrival: cell(&m.arrival),
            prompt: cell(&m.prompt_tokens),
            output: cell(&m.output_tokens),
            session: m.session_id.as_ref().map(&cell),
            hashes: m.prefix_hashes.as_ref().map(&cell),
        }
    }

    fn row(&mut self, cells: Cells<'_>) -> Result<Parsed, TrafficError> {
        if self.mapping.ignore_without_lengths.is_some()
            && matches!(cells.prompt, Cell::Absent(_))
            && matches!(cells.output, Cell::Absent(_))
        {
            return Ok(Parsed::Ignored);
        }
        let arrival = self.arrival(cells.arrival)?;
        let m = &self.mapping;
        let prompt = self.count(&m.prompt_tokens, cells.prompt, 0)?;
        let output = self.count(&m.output_tokens, cells.output, 1)?;
        let session = match (&m.session_id, cells.session) {
            (Some(p), Some(c)) => self.session(p, c)?,
            _ => None,
        };
        let blocks = match (&m.prefix_hashes, cells.hashes) {
            (Some(p), Some(c)) => self.hashes(p, c, prompt)?,
            _ => Vec::new(),
        };
        Ok(Parsed::Row(MappedRow {
            ts: arrival,
            prompt,
            output,
            session,
            blocks,
            line: self.line,
            session_key: None,
        }))
    }

    /// The error of a required field that is absent, or of an optional one absent from a row
    /// of a custom mapping.
    fn absent(&self, path: &FieldPath, keys: &str) -> TrafficError {
        self.bad(
            path,
            if keys.is_empty() {
                "is missing from this row".to_owned()
            } else {
                format!("is missing from this row; keys there: {keys}")
            },
        )
    }

    fn text_of<'a>(&self, path: &FieldPath, cell: &Cell<'a>) -> Result<String, TrafficError> {
        Ok(match cell {
            Cell::Json(Value::String(s)) => s.clone(),
            Cell::Json(Value::Number(n)) => n.to_string(),
            Cell::Json(v) => {
                return Err(self.bad(path, format!("is {}, expected a time", kind(v))));
            }
            Cell::Text(t) => t.trim().to_owned(),
            Cell::Null => return Err(self.bad(path, "is empty or null; expected a time")),
            Cell::Absent(keys) => return Err(self.absent(path, keys)),
        })
    }

    fn arrival(&mut self, cell: Cell<'_>) -> Result<i64, TrafficError> {
        let path = &self.mapping.arrival;
        let text = self.text_of(path, &cell)?;
        if self.unit == ArrivalUnit::Auto {
            self.unit = ArrivalUnit::detect(&text).map_err(|p| self.bad(path, p.to_string()))?;
        }
        self.unit
            .parse(&text)
            .map_err(|p| self.bad(path, p.to_string()))
    }

    fn count(&self, path: &FieldPath, cell: Cell<'_>, min: u32) -> Result<u32, TrafficError> {
        let expect = if min == 0 {
            "expected an integer >= 0".to_owned()
        } else {
            format!("expected an integer >= {min} (the tokens of a completed request)")
        };
        match cell {
            Cell::Json(Value::Number(n)) => {
                if let Some(u) = n.as_u64() {
                    check_count(u, min, &expect)
                } else if n.as_f64().is_some_and(|f| f < 0.0) {
                    Err(format!("is negative ({n}); {expect}"))
                } else {
                    Err(format!("is {n}, not an integer; {expect}"))
                }
            }
            Cell::Json(Value::String(s)) => parse_count(s.trim(), min),
            Cell::Text(t) => parse_count(t.trim(), min),
            Cell::Json(v) => Err(format!("is {}, not a number; {expect}", kind(v))),
            Cell::Null if min > 0 => Err(format!("is empty or null (a failed request?); {expect}")),
            Cell::Null => Err(format!("is empty or null; {expect}")),
            Cell::Absent(keys) => return Err(self.absent(path, &keys)),
        }
        .map_err(|p| self.bad(path, p))
    }

    fn session(&self, path: &FieldPath, cell: Cell<'_>) -> Result<Option<String>, TrafficError> {
        match cell {
            Cell::Json(Value::String(s)) if s.is_empty() => Ok(None),
            Cell::Json(Value::String(s)) => Ok(Some(s.clone())),
            Cell::Json(Value::Number(n)) => Ok(Some(n.to_string())),
            Cell::Json(v) => Err(self.bad(
                path,
                format!(
                    "is {}; expected a session id (a string or a number) or null",
                    kind(v)
                ),
            )),
            Cell::Text(t) => Ok(Some(t.trim().to_owned()).filter(|s| !s.is_empty())),
            Cell::Null => Ok(None),
            Cell::Absent(_) if self.mapping.optional_may_be_absent => Ok(None),
            Cell::Absent(keys) => Err(self.absent(path, &keys)),
        }
    }

    fn hashes(
        &self,
        path: &FieldPath,
        cell: Cell<'_>,
        prompt: u32,
    ) -> Result<Vec<u64>, TrafficError> {
        const EXPECT: &str = "expected an integer hash in 0..2^64";
        let element = |i: usize, v: &Value| -> Result<u64, TrafficError> {
            let parsed = match unwrap_any_value(v) {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            };
            parsed.ok_or_else(|| self.bad(path, format!("element {i} is {v}; {EXPECT}")))
        };
        let mut hashes = match cell {
            Cell::Json(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| element(i, v))
                .collect::<Result<Vec<_>, _>>()?,
            Cell::Json(v) => {
                return Err(self.bad(
                    path,
                    format!("is {}; expected a list of integer block hashes", kind(v)),
                ));
            }
            Cell::Text(t) => t
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(|c: char| c == ',' || c == ';' || c == '|' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .enumerate()
                .map(|(i, s)| {
                    s.parse()
                        .map_err(|_| self.bad(path, format!("element {i} is `{s}`; {EXPECT}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Cell::Null => Vec::new(),
            Cell::Absent(_) if self.mapping.optional_may_be_absent => Vec::new(),
            Cell::Absent(keys) => return Err(self.absent(path, &keys)),
        };
        let blocks = blocks_for_tokens(u64::from(prompt));
        if hashes.len() as u64 > blocks && self.mapping.cut_extra_hashes {
            hashes.truncate(usize::try_from(blocks).unwrap_or(usize::MAX));
        }
        if hashes.len() as u64 > blocks {
            return Err(self.bad(
                path,
                format!(
                    "has {} hashes but {prompt} prompt tokens make ceil({prompt}/512) = {blocks} \
                     blocks; expected at most {blocks} (one per 512-token block)",
                    hashes.len()
                ),
            ));
        }
        // Chaining makes hash i identify the whole prefix up to block i, whether the log's
        // hashes already did (the gateway's) or named one block each.
        chain_in_place(&mut hashes);
        Ok(hashes)
    }
}

/// Sort rows by arrival (stably: equal times keep their file order) and key each session;
/// with [`SessionPrefix::Growing`] give each session's requests their growing shared prefix.
/// `source` (the log's file name) salts the session keys, so that session `1` of one log
/// shares nothing with session `1` of another in the same scenario.
///
/// Returns the rows and, when a growing prefix does not fit the data, a warning: more than
/// [`SHRINKING_FOLLOW_UPS`] of a session's follow-up requests (at least
/// [`SHRINKING_MIN_FOLLOW_UPS`] in all) have a shorter prompt than the request before them, so
/// the prompts do not resend the session's history.
pub(crate) fn sort_and_link_sessions(
    mut rows: Vec<MappedRow>,
    source: &str,
    prefix: SessionPrefix,
) -> (Vec<MappedRow>, Option<String>) {
    rows.sort_by_key(|r| r.ts);
    let salt = key_of_bytes(source.as_bytes());
    // Per session: its key, its full blocks so far, its last prompt.
    let mut sessions: HashMap<String, (u64, Vec<u64>, u32)> = HashMap::new();
    let (mut follow_ups, mut shrinking) = (0u64, 0u64);
    for row in &mut rows {
        let Some(id) = &row.session else { continue };
        let mut first = false;
        let (key, full, last) = sessions.entry(id.clone()).or_insert_with(|| {
            first = true;
            (
                splitmix64(salt ^ key_of_bytes(id.as_bytes())),
                Vec::new(),
                0,
            )
        });
        let key = *key;
        row.session_key = Some(key);
        if !first {
            follow_ups += 1;
            shrinking += u64::from(row.prompt < *last);
        }
        *last = row.prompt;
        if prefix == SessionPrefix::Growing {
            // Block `index` of a session is the same content in each of its requests (the
            // chat history grows at the end); a trailing partial block also encodes its fill.
            row.blocks = grow_prefix_blocks(full, row.prompt, |index, fill| {
                block_content_key(key, index, fill)
            });
        }
    }
    let warning = (prefix == SessionPrefix::Growing
        && follow_ups >= SHRINKING_MIN_FOLLOW_UPS
        && shrinking as f64 > SHRINKING_FOLLOW_UPS * follow_ups as f64)
        .then(|| {
            format!(
                "{source}: {shrinking} of the {follow_ups} follow-up requests of its sessions \
                 have a shorter prompt than the session's request before them, so the prompts \
                 do not resend the session's history; `session_prefix: growing` (the default) \
                 still gives each the blocks of its session's earlier prompts, which overstates \
                 prefix reuse: set `session_prefix: none` in the mapping if the session id only \
                 groups requests (this warning: more than {} % of at least {} follow-ups)",
                SHRINKING_FOLLOW_UPS * 100.0,
                SHRINKING_MIN_FOLLOW_UPS
            )
        });
    (rows, warning)
}

/// Above this fraction of shorter follow-up prompts, a growing session prefix is doubted (a
/// chat's next prompt holds the previous prompt and its answer, so it never shrinks unless the
/// client cuts the history).
pub const SHRINKING_FOLLOW_UPS: f64 = 0.25;
/// The fewest follow-ups the shrinking test judges.
pub const SHRINKING_MIN_FOLLOW_UPS: u64 = 10;

pub(super) fn json_cell<'v>(root: &'v Value, path: &FieldPath) -> Cell<'v> {
    let mut cur = root;
    for key in &path.keys {
        let next = match cur {
            Value::Object(map) => map.get(key),
            Value::Array(items) => items
                .iter()
                .find(|item| item.get("key").and_then(Value::as_str) == Some(key))
                .and_then(|item| item.get("value")),
            _ => None,
        };
        match next {
            Some(v) => cur = unwrap_any_value(v),
            None => return Cell::Absent(keys_at(cur)),
        }
    }
    if cur.is_null() {
        Cell::Null
    } else {
        Cell::Json(cur)
    }
}

/// The value inside an OTLP `AnyValue` (`{"intValue": "812"}`), or `v` itself.
fn unwrap_any_value(v: &Value) -> &Value {
    if let Value::Object(map) = v
        && map.len() == 1
        && let Some((k, inner)) = map.iter().next()
    {
        return match k.as_str() {
            "stringValue" | "intValue" | "doubleValue" | "boolValue" => inner,
            "arrayValue" => inner.get("values").unwrap_or(inner),
            _ => v,
        };
    }
    v
}

/// The keys one could have meant at this level (for "missing" errors), at most a dozen.
fn keys_at(v: &Value) -> String {
    const MAX: usize = 12;
    let keys: Vec<&str> = match v {
        Value::Object(map) => map.keys().map(String::as_str).collect(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i.get("key").and_then(Value::as_str))
            .collect(),
        _ => return format!("(a {}, which has no keys)", kind(v)),
    };
    let mut out = keys
        .iter()
        .take(MAX)
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > MAX {
        out.push_str(&format!(" … ({} in all)", keys.len()));
    }
    if out.is_empty() {
        out.push_str("(none)");
    }
    out
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Split one CSV line (RFC 4180 through the `csv` crate: a field in double quotes may hold
/// commas, `""` in it is a quote), each field trimmed. A trace row is one line, so a quoted
/// field cannot span lines.
pub(super) fn split_csv(line: &str) -> Vec<String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .buffer_capacity(line.len().max(64))
        .from_reader(line.as_bytes());
    let mut record = csv::StringRecord::new();
    match reader.read_record(&mut record) {
        Ok(true) => record.iter().map(str::to_owned).collect(),
        // The line is valid UTF-8 text, so the reader cannot fail on it; an empty one has
        // been left out before.
        _ => vec![line.trim().to_owned()],
    }
}
