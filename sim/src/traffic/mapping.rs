//! Any request log as a trace: JSON Lines or CSV read through a field mapping (which key or
//! column holds the arrival time, the prompt and output lengths, and optionally a session id
//! or the prompt's prefix-block hashes), plus the ready-made mappings `gateway-log` (the
//! gateway's own request log) and `otel-genai` (OpenTelemetry GenAI spans).
//!
//! A mapped trace is read whole and sorted by arrival (a stable sort, so equal times keep
//! their file order): logs written at completion are not in arrival order. Memory is one
//! small record per row. The format reference is `docs/traces.md`.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;

use super::TrafficError;
use super::hash::{
    block_content_key, blocks_for_tokens, chain_in_place, grow_prefix_blocks, key_of_bytes,
};
use super::trace::{check_count, parse_count, parse_datetime};
use routelab_policies::streams::splitmix64;

/// How the rows of a mapped trace are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceLayout {
    /// One JSON object per line; fields are found by [`FieldPath`].
    Jsonl,
    /// A header line, then comma-separated rows (double-quoted fields may hold commas, `""` is
    /// a quote); fields are columns named in the header.
    Csv,
}

/// What the arrival field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ArrivalUnit {
    /// Decided from the first row: an ISO-8601 date-time, or an epoch number whose magnitude
    /// gives its unit (`1e8 ≤ x < 1e11` seconds, `< 1e14` ms, `< 1e17` µs, else ns — each range
    /// is 1973-03-03 to the year 5138, so they never overlap). A number below `1e8` is refused:
    /// it is a time from the start, whose unit only the mapping can say.
    #[default]
    Auto,
    /// Seconds since the Unix epoch (integer or fractional).
    EpochS,
    /// Milliseconds since the Unix epoch.
    EpochMs,
    /// Microseconds since the Unix epoch.
    EpochUs,
    /// Nanoseconds since the Unix epoch (an integer, e.g. OpenTelemetry's `startTimeUnixNano`).
    EpochNs,
    /// ISO-8601 / RFC 3339 date-time; without a zone it is UTC.
    Iso8601,
    /// Seconds from the start of the log.
    OffsetS,
    /// Milliseconds from the start of the log.
    OffsetMs,
}

const ISO_EXAMPLES: &str = "`2025-03-01T12:00:00Z`, `2025-03-01T14:00:00+02:00` or \
                            `2025-03-01 12:00:00.123` (no zone = UTC)";

impl ArrivalUnit {
    /// Every unit's name, as the mapping's `arrival_unit` accepts it.
    pub const NAMES: &'static str =
        "auto, epoch_s, epoch_ms, epoch_us, epoch_ns, iso8601, offset_s, offset_ms";

    /// The unit called `name` (see [`ArrivalUnit::NAMES`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "auto" => Self::Auto,
            "epoch_s" => Self::EpochS,
            "epoch_ms" => Self::EpochMs,
            "epoch_us" => Self::EpochUs,
            "epoch_ns" => Self::EpochNs,
            "iso8601" => Self::Iso8601,
            "offset_s" => Self::OffsetS,
            "offset_ms" => Self::OffsetMs,
            _ => return None,
        })
    }

    /// The unit's name as a mapping writes it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::EpochS => "epoch_s",
            Self::EpochMs => "epoch_ms",
            Self::EpochUs => "epoch_us",
            Self::EpochNs => "epoch_ns",
            Self::Iso8601 => "iso8601",
            Self::OffsetS => "offset_s",
            Self::OffsetMs => "offset_ms",
        }
    }

    /// Nanoseconds per unit of a numeric unit.
    const fn ns_per_unit(self) -> Option<i64> {
        match self {
            Self::EpochS | Self::OffsetS => Some(1_000_000_000),
            Self::EpochMs | Self::OffsetMs => Some(1_000_000),
            Self::EpochUs => Some(1_000),
            Self::EpochNs => Some(1),
            Self::Auto | Self::Iso8601 => None,
        }
    }

    /// The unit `auto` reads `text` (the first row's arrival) in.
    ///
    /// # Errors
    /// What is wrong with `text` and what `auto` accepts.
    pub fn detect(text: &str) -> Result<Self, String> {
        if let Ok(x) = text.parse::<f64>()
            && x.is_finite()
        {
            return Ok(match x {
                x if x < 0.0 => return Err(format!("is negative ({text}); expected a time >= 0")),
                x if x < 1e8 => {
                    return Err(format!(
                        "is {text}, a time from the start whose unit `arrival_unit: auto` cannot \
                         tell; set `arrival_unit: offset_s` or `offset_ms` (auto reads numbers \
                         >= 1e8 as epoch seconds, ms, µs or ns by magnitude)"
                    ));
                }
                x if x < 1e11 => Self::EpochS,
                x if x < 1e14 => Self::EpochMs,
                x if x < 1e17 => Self::EpochUs,
                _ => Self::EpochNs,
            });
        }
        if parse_datetime(text.as_bytes()).is_some() {
            return Ok(Self::Iso8601);
        }
        Err(format!(
            "`{text}` is neither a date-time nor a number; `arrival_unit: auto` accepts an \
             ISO-8601 date-time ({ISO_EXAMPLES}) or epoch seconds, ms, µs or ns (a number >= 1e8)"
        ))
    }

    fn too_large(self, text: &str) -> String {
        format!(
            "is {text}, too large for `arrival_unit: {}`; expected a time before the year 2262",
            self.name()
        )
    }

    /// Parse `text` in this unit into nanoseconds (absolute for epoch units and date-times,
    /// from the start for offsets; the replay makes both relative to the first row).
    ///
    /// # Errors
    /// What is wrong and what would be valid. `Auto` must be resolved first ([`Self::detect`]).
    pub fn parse(self, text: &str) -> Result<i64, String> {
        let Some(per) = self.ns_per_unit() else {
            let unit = if self == Self::Auto {
                Self::detect(text)?
            } else {
                self
            };
            if unit != Self::Iso8601 {
                return unit.parse(text);
            }
            let ns = parse_datetime(text.as_bytes()).ok_or_else(|| {
                format!(
                    "`{text}` is not an ISO-8601 / RFC 3339 date-time; expected e.g. {ISO_EXAMPLES}"
                )
            })?;
            // Epoch numbers must be >= 0; a date-time before 1970 is refused the same way, so
            // that arrivals never precede the epoch the replay measures from.
            if ns < 0 {
                return Err(format!(
                    "`{text}` is before 1970-01-01T00:00:00Z; expected a date-time from 1970 on"
                ));
            }
            return Ok(ns);
        };
        let expect = "expected a number >= 0";
        if text.starts_with('-') && text[1..].parse::<f64>().is_ok() {
            return Err(format!("is negative ({text}); {expect}"));
        }
        // Plain decimals are converted exactly (an f64 of epoch seconds is off by ~100 ns).
        if let Some((int, frac)) = text.split_once('.').or(Some((text, "")))
            && !int.is_empty()
            && int.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
        {
            let whole = int.parse::<i64>().ok().and_then(|n| n.checked_mul(per));
            let frac = &frac[..frac.len().min(18)];
            let part = if frac.is_empty() {
                0
            } else {
                let scale = 10_i128.pow(frac.len() as u32);
                let f: i128 = frac.parse().unwrap_or(0);
                ((f * i128::from(per) + scale / 2) / scale) as i64
            };
            return whole
                .and_then(|w| w.checked_add(part))
                .ok_or_else(|| self.too_large(text));
        }
        match text.parse::<f64>() {
            Ok(x) if !x.is_finite() => Err(format!("is {text}; {expect} (finite)")),
            Ok(x) if x < 0.0 => Err(format!("is negative ({text}); {expect}")),
            Ok(x) if x * (per as f64) < 9.2e18 => Ok((x * per as f64).round() as i64),
            Ok(_) => Err(self.too_large(text)),
            Err(_) => Err(format!(
                "`{text}` is not a number; `arrival_unit: {}` expects a number >= 0 (for a \
                 date-time like {ISO_EXAMPLES}, set `arrival_unit: iso8601` or `auto`)",
                self.name()
            )),
        }
    }
}

/// What a session id says about the prompts of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionPrefix {
    /// A chat: each request's prompt begins with the session's previous prompt and output, so
    /// the session's requests share a growing prefix (the default).
    #[default]
    Growing,
    /// The id only groups requests (a user, a job): their prompts share nothing by it. The
    /// grouping still keeps a session's requests together when a trace is resampled.
    None,
}

impl SessionPrefix {
    /// Every value's name, as a mapping's `session_prefix` accepts it.
    pub const NAMES: &'static str = "growing, none";

    /// The value called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "growing" => Some(Self::Growing),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// A field of a row: a CSV column's name, or a path into a JSON object.
///
/// JSON path syntax: keys separated by `.`; a key holding dots is written in double quotes,
/// e.g. `attributes."gen_ai.usage.input_tokens"`. A key applied to an OpenTelemetry attribute
/// list (`[{"key": k, "value": {...}}]`) finds the entry with that key, and an OTLP typed value
/// (`{"intValue": "812"}`, `stringValue`, `doubleValue`, `boolValue`, `arrayValue`) is read as
/// the value it holds. For CSV the whole text is the column name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    keys: Vec<String>,
}

impl FieldPath {
    /// Parse a field as written in a mapping.
    ///
    /// # Errors
    /// An empty key or an unterminated quote, with what would be valid.
    pub fn parse(text: &str) -> Result<Self, String> {
        const SYNTAX: &str = "expected keys separated by `.`, a key with dots in double quotes \
                              (e.g. attributes.\"gen_ai.usage.input_tokens\")";
        let mut keys = Vec::new();
        let mut rest = text;
        loop {
            let (key, after) = if let Some(q) = rest.strip_prefix('"') {
                let end = q
                    .find('"')
                    .ok_or_else(|| format!("`{text}` has an unterminated quote; {SYNTAX}"))?;
                (&q[..end], &q[end + 1..])
            } else {
                let end = rest.find('.').unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if key.is_empty() {
                return Err(format!("`{text}` has an empty key; {SYNTAX}"));
            }
            keys.push(key.to_owned());
            if after.is_empty() {
                break;
            }
            rest = after.strip_prefix('.').ok_or_else(|| {
                format!("`{text}`: a quoted key must be followed by `.` or the end; {SYNTAX}")
            })?;
        }
        Ok(Self {
            text: text.to_owned(),
            keys,
        })
    }

    /// A CSV column, named whole (dots and quotes are part of the name).
    ///
    /// # Errors
    /// An empty name.
    pub fn column(name: &str) -> Result<Self, String> {
        if name.trim().is_empty() {
            return Err("is empty; expected a column name of the header".to_owned());
        }
        Ok(Self {
            text: name.trim().to_owned(),
            keys: vec![name.trim().to_owned()],
        })
    }

    /// The field as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Which fields of a row make a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceMapping {
    name: &'static str,
    layout: TraceLayout,
    arrival: FieldPath,
    arrival_unit: ArrivalUnit,
    prompt_tokens: FieldPath,
    output_tokens: FieldPath,
    session_id: Option<FieldPath>,
    /// What a session id says about its requests' prompts.
    session_prefix: SessionPrefix,
    prefix_hashes: Option<FieldPath>,
    /// Ready-made mappings know their optional fields may be absent from a row; in a custom
    /// mapping every named field must be present (`null` = none), so a typo is an error.
    optional_may_be_absent: bool,
    /// Rows with neither length field are not requests (OpenTelemetry spans of other kinds):
    /// ignored and counted, not errors.
    ignore_without_lengths: Option<&'static str>,
    /// More hashes than `ceil(prompt / 512)` blocks are cut to that many instead of refused:
    /// the gateway hashes a token-id prompt's text (`"id,id,…"`, several bytes per token) while
    /// its `prompt_tokens` counts the ids, so its own log can carry a few hashes more.
    cut_extra_hashes: bool,
}

/// The ready-made mappings' names.
pub const READY_MADE_MAPPINGS: &str = "gateway-log, otel-genai";

impl TraceMapping {
    /// A custom mapping. `session_id` (requests of one session share a growing prefix) and
    /// `prefix_hashes` (the prompt's block hashes) are alternatives.
    ///
    /// # Errors
    /// Both `session_id` and `prefix_hashes` given (the message says why).
    pub fn custom(
        layout: TraceLayout,
        arrival: FieldPath,
        arrival_unit: ArrivalUnit,
        prompt_tokens: FieldPath,
        output_tokens: FieldPath,
        session_id: Option<FieldPath>,
        prefix_hashes: Option<FieldPath>,
    ) -> Result<Self, String> {
        if session_id.is_some() && prefix_hashes.is_some() {
            return Err(
                "sets both `session_id` and `prefix_hashes`; give one: the prefix \
                        blocks come either from the log's hashes or from the session's history"
                    .to_owned(),
            );
        }
        Ok(Self {
            name: match layout {
                TraceLayout::Jsonl => "jsonl",
                TraceLayout::Csv => "csv",
            },
            layout,
            arrival,
            arrival_unit,
            prompt_tokens,
            output_tokens,
            session_id,
            session_prefix: SessionPrefix::Growing,
            prefix_hashes,
            optional_may_be_absent: false,
            ignore_without_lengths: None,
            cut_extra_hashes: false,
        })
    }

    fn field(text: &str) -> FieldPath {
        FieldPath::parse(text).expect("ready-made field paths are valid")
    }

    /// The gateway's JSONL request log: `arrival_unix_ms` (epoch ms), `prompt_tokens`,
    /// `output_tokens` (null or 0 for a failed request: a bad row), `prefix_hashes` (u64, may
    /// be absent or null). Rows are written at completion, so arrivals are sorted on reading.
    #[must_use]
    pub fn gateway_log() -> Self {
        Self {
            name: "gateway-log",
            layout: TraceLayout::Jsonl,
            arrival: Self::field("arrival_unix_ms"),
            arrival_unit: ArrivalUnit::EpochMs,
            prompt_tokens: Self::field("prompt_tokens"),
            output_tokens: Self::field("output_tokens"),
            session_id: None,
            session_prefix: SessionPrefix::Growing,
            prefix_hashes: Some(Self::field("prefix_hashes")),
            optional_may_be_absent: true,
            ignore_without_lengths: None,
            cut_extra_hashes: true,
        }
    }

    /// OpenTelemetry GenAI spans, one per line: `startTimeUnixNano` (ns, a string or a
    /// number), `attributes."gen_ai.usage.input_tokens"` / `output_tokens` and the optional
    /// `attributes."gen_ai.conversation.id"` as the session. `attributes` may be an object or
    /// an OTLP attribute list. Spans without either `gen_ai.usage` attribute are not inference
    /// spans: ignored and counted.
    #[must_use]
    pub fn otel_genai() -> Self {
        Self {
            name: "otel-genai",
            layout: TraceLayout::Jsonl,
            arrival: Self::field("startTimeUnixNano"),
            arrival_unit: ArrivalUnit::EpochNs,
            prompt_tokens: Self::field("attributes.\"gen_ai.usage.input_tokens\""),
            output_tokens: Self::field("attributes.\"gen_ai.usage.output_tokens\""),
            session_id: Some(Self::field("attributes.\"gen_ai.conversation.id\"")),
            session_prefix: SessionPrefix::Growing,
            prefix_hashes: None,
            optional_may_be_absent: true,
            ignore_without_lengths: Some(
                "spans without gen_ai.usage.input_tokens / output_tokens: not inference spans",
            ),
            cut_extra_hashes: false,
        }
    }

    /// The ready-made mapping called `name` ([`READY_MADE_MAPPINGS`]).
    #[must_use]
    pub fn ready_made(name: &str) -> Option<Self> {
        match name {
            "gateway-log" => Some(Self::gateway_log()),
            "otel-genai" => Some(Self::otel_genai()),
            _ => None,
        }
    }

    /// `jsonl`, `csv` or the ready-made mapping's name.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The row layout.
    #[must_use]
    pub const fn layout(&self) -> TraceLayout {
        self.layout
    }

    /// Why rows without lengths are ignored, when this mapping ignores them.
    #[must_use]
    pub const fn ignored_rows_are(&self) -> Option<&'static str> {
        self.ignore_without_lengths
    }

    /// This mapping with `session_prefix` (what its session ids say about the prompts).
    ///
    /// # Errors
    /// `none` on a mapping without a session id (the message says why).
    pub fn with_session_prefix(mut self, session_prefix: SessionPrefix) -> Result<Self, String> {
        if self.session_id.is_none() && session_prefix != SessionPrefix::Growing {
            return Err(
                "`session_prefix` applies to a mapping with a `session_id`; this one has \
                        none"
                    .to_owned(),
            );
        }
        self.session_prefix = session_prefix;
        Ok(self)
    }

    /// What this mapping's session ids say about the prompts.
    #[must_use]
    pub const fn session_prefix(&self) -> SessionPrefix {
        self.session_prefix
    }
}

// ----- reading --------------------------------------------------------------------------------

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
enum Cell<'a> {
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
            self.unit = ArrivalUnit::detect(&text).map_err(|p| self.bad(path, p))?;
        }
        self.unit.parse(&text).map_err(|p| self.bad(path, p))
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

/// A declared `offset_s` is doubted when the log then spans more than this (1 day)…
pub const OFFSET_S_DOUBT_SPAN_S: f64 = 86_400.0;
/// …at fewer requests per second than this (1 per minute): millisecond offsets read as seconds.
pub const OFFSET_S_DOUBT_RATE: f64 = 1.0 / 60.0;
/// A declared `offset_ms` is doubted when the log then spans less than this (60 s)…
pub const OFFSET_MS_DOUBT_SPAN_S: f64 = 60.0;
/// …at more requests per second than this: second offsets read as milliseconds.
pub const OFFSET_MS_DOUBT_RATE: f64 = 1_000.0;
/// A declared epoch unit is doubted when the first arrival reads as a date before this one
/// (1990-01-01T00:00:00Z, in seconds): a coarser unit's numbers read in a finer unit.
pub const EPOCH_DOUBT_BEFORE_S: i64 = 631_152_000;

/// What is implausible about a log's arrivals read in the unit its mapping declares (`unit`,
/// after `auto` was resolved; `declared` false for `auto`, which picks by magnitude and is not
/// doubted): the log's `rows` (sorted) would span an implausible time at an implausible rate,
/// or start before 1990. `None` when nothing is.
pub(crate) fn unit_warning(
    unit: ArrivalUnit,
    declared: bool,
    rows: &[MappedRow],
    source: &str,
) -> Option<String> {
    let (first, last) = (rows.first()?.ts, rows.last()?.ts);
    if !declared {
        return None;
    }
    let span_s = (last - first) as f64 / 1e9;
    let n = rows.len() as f64;
    let rate = |span: f64| if span > 0.0 { n / span } else { f64::INFINITY };
    let span_text = |s: f64| {
        if s >= 2.0 * 86_400.0 {
            format!("{:.1} days", s / 86_400.0)
        } else if s >= 7_200.0 {
            format!("{:.1} h", s / 3_600.0)
        } else {
            format!("{s:.1} s")
        }
    };
    let set = |name: &str| format!("set `arrival_unit: {name}`");
    match unit {
        ArrivalUnit::OffsetS
            if span_s > OFFSET_S_DOUBT_SPAN_S && rate(span_s) < OFFSET_S_DOUBT_RATE =>
        {
            Some(format!(
                "{source}: read as `arrival_unit: offset_s`, its {} requests span {} ({:.4} \
                 req/s); if the offsets are milliseconds they span {} ({:.2} req/s): {} (this \
                 warning: `offset_s` giving a span over 1 day at under 1 request per minute)",
                rows.len(),
                span_text(span_s),
                rate(span_s),
                span_text(span_s / 1e3),
                rate(span_s / 1e3),
                set("offset_ms")
            ))
        }
        ArrivalUnit::OffsetMs
            if span_s < OFFSET_MS_DOUBT_SPAN_S && rate(span_s) > OFFSET_MS_DOUBT_RATE =>
        {
            Some(format!(
                "{source}: read as `arrival_unit: offset_ms`, its {} requests span {} ({:.0} \
                 req/s); if the offsets are seconds they span {} ({:.2} req/s): {} (this \
                 warning: `offset_ms` giving over 1,000 req/s within a span under 60 s)",
                rows.len(),
                span_text(span_s),
                rate(span_s),
                span_text(span_s * 1e3),
                rate(span_s * 1e3),
                set("offset_s")
            ))
        }
        ArrivalUnit::EpochMs | ArrivalUnit::EpochUs | ArrivalUnit::EpochNs
            if first / 1_000_000_000 < EPOCH_DOUBT_BEFORE_S =>
        {
            let coarser = match unit {
                ArrivalUnit::EpochMs => ArrivalUnit::EpochS,
                ArrivalUnit::EpochUs => ArrivalUnit::EpochMs,
                _ => ArrivalUnit::EpochUs,
            };
            Some(format!(
                "{source}: read as `arrival_unit: {}`, its first arrival is {} s after \
                 1970-01-01, before 1990; the numbers look like a coarser unit: {} (this \
                 warning: an epoch time before 1990-01-01)",
                unit.name(),
                first / 1_000_000_000,
                set(coarser.name())
            ))
        }
        _ => None,
    }
}

fn json_cell<'v>(root: &'v Value, path: &FieldPath) -> Cell<'v> {
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
fn split_csv(line: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths() {
        let p = FieldPath::parse("attributes.\"gen_ai.usage.input_tokens\"").unwrap();
        assert_eq!(p.keys, ["attributes", "gen_ai.usage.input_tokens"]);
        assert_eq!(FieldPath::parse("a.b.c").unwrap().keys, ["a", "b", "c"]);
        assert_eq!(FieldPath::parse("\"x.y\"").unwrap().keys, ["x.y"]);
        for bad in ["", "a..b", "a.", "\"open", "\"a\"b"] {
            assert!(FieldPath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn units_parse_and_auto_is_unambiguous() {
        const T0: i64 = 1_740_830_400_000_000_000; // 2025-03-01T12:00:00Z
        for (text, unit) in [
            ("1740830400", ArrivalUnit::EpochS),
            ("1740830400.5", ArrivalUnit::EpochS),
            ("1740830400000", ArrivalUnit::EpochMs),
            ("1740830400000000", ArrivalUnit::EpochUs),
            ("1740830400000000000", ArrivalUnit::EpochNs),
            ("2025-03-01T12:00:00Z", ArrivalUnit::Iso8601),
        ] {
            assert_eq!(ArrivalUnit::detect(text), Ok(unit), "{text}");
            let ns = unit.parse(text).unwrap();
            assert!((ns - T0).abs() <= 500_000_000, "{text}: {ns}");
        }
        assert_eq!(
            ArrivalUnit::EpochNs.parse("1740830400000000001"),
            Ok(T0 + 1)
        );
        assert!(
            ArrivalUnit::detect("12.5")
                .unwrap_err()
                .contains("offset_s")
        );
        assert!(ArrivalUnit::detect("-3").unwrap_err().contains("negative"));
        assert!(
            ArrivalUnit::detect("yesterday")
                .unwrap_err()
                .contains("ISO-8601")
        );
        // Date-like texts shorter than a full date-time are refused, never read past their end.
        for short in [
            "2025-03-01",
            "2025-03-01T12:00",
            "2025-03-01T12:00:0",
            "2025-03-01T",
        ] {
            assert!(ArrivalUnit::detect(short).is_err(), "{short}");
            assert!(ArrivalUnit::Iso8601.parse(short).is_err(), "{short}");
        }
        assert!(
            ArrivalUnit::Iso8601
                .parse("1969-12-31T23:59:59Z")
                .unwrap_err()
                .contains("before 1970")
        );
        assert_eq!(ArrivalUnit::OffsetMs.parse("1500"), Ok(1_500_000_000));
        assert_eq!(ArrivalUnit::OffsetS.parse("1.25"), Ok(1_250_000_000));
        assert!(ArrivalUnit::OffsetS.parse("NaN").is_err());
        let m = ArrivalUnit::EpochMs
            .parse("2025-03-01T12:00:00Z")
            .unwrap_err();
        assert!(m.contains("epoch_ms") && m.contains("iso8601"), "{m}");
        assert!(
            ArrivalUnit::EpochS
                .parse("1e300")
                .unwrap_err()
                .contains("2262")
        );
        assert!(
            ArrivalUnit::OffsetS
                .parse("-1")
                .unwrap_err()
                .contains("negative")
        );
        assert!(
            ArrivalUnit::Iso8601
                .parse("01/03/2025")
                .unwrap_err()
                .contains("RFC 3339")
        );
        assert_eq!(
            ArrivalUnit::Iso8601.parse("2025-03-01T14:00:00+02:00"),
            Ok(T0)
        );
        assert_eq!(
            ArrivalUnit::Iso8601.parse("2025-03-01 12:00:00.123"),
            Ok(T0 + 123_000_000)
        );
        for name in ArrivalUnit::NAMES.split(", ") {
            assert_eq!(
                ArrivalUnit::from_name(name).map(ArrivalUnit::name),
                Some(name)
            );
        }
    }

    #[test]
    fn csv_split_handles_quotes() {
        assert_eq!(
            split_csv("a ,\"b,c\",\"d\"\"e\","),
            ["a", "b,c", "d\"e", ""]
        );
        assert_eq!(split_csv("x"), ["x"]);
    }

    #[test]
    fn otlp_values_unwrap() {
        let v: Value = serde_json::from_str(
            r#"{"attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "812"}}]}"#,
        )
        .unwrap();
        let p = FieldPath::parse("attributes.\"gen_ai.usage.input_tokens\"").unwrap();
        assert!(matches!(json_cell(&v, &p), Cell::Json(Value::String(s)) if s == "812"));
        let q = FieldPath::parse("attributes.\"gen_ai.usage.output_tokens\"").unwrap();
        assert!(
            matches!(json_cell(&v, &q), Cell::Absent(k) if k.contains("gen_ai.usage.input_tokens"))
        );
    }

    #[test]
    fn sessions_grow_and_stay_apart() {
        let row = |ts, prompt, session: &str| MappedRow {
            ts,
            prompt,
            output: 100,
            session: Some(session.to_owned()),
            blocks: Vec::new(),
            line: 0,
            session_key: None,
        };
        let rows = || vec![row(20, 2000, "a"), row(10, 1100, "a"), row(15, 1100, "b")];
        let (linked, _) = sort_and_link_sessions(rows(), "one.jsonl", SessionPrefix::Growing);
        assert_eq!(linked[0].blocks.len(), 3);
        assert_eq!(linked[2].blocks.len(), 4);
        assert_eq!(linked[0].blocks[..2], linked[2].blocks[..2]);
        assert_ne!(linked[0].blocks[0], linked[1].blocks[0]);
        // The same session ids in another log are other sessions.
        let (other, _) = sort_and_link_sessions(rows(), "two.jsonl", SessionPrefix::Growing);
        assert_ne!(linked[0].blocks[0], other[0].blocks[0]);
    }
}
