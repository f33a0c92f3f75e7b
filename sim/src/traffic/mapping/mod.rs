//! Any request log as a trace: JSON Lines or CSV read through a field mapping (which key or
//! column holds the arrival time, the prompt and output lengths, and optionally a session id
//! or the prompt's prefix-block hashes), plus the ready-made mappings `gateway-log` (the
//! gateway's own request log) and `otel-genai` (OpenTelemetry GenAI spans).
//!
//! A mapped trace is read whole and sorted by arrival (a stable sort, so equal times keep
//! their file order): logs written at completion are not in arrival order. Memory is one
//! small record per row. The format reference is `docs/traces.md`.

mod rows;
mod unit;

pub(crate) use rows::{MappedRow, MappedRows, Parsed, sort_and_link_sessions};
pub use rows::{SHRINKING_FOLLOW_UPS, SHRINKING_MIN_FOLLOW_UPS};
pub(crate) use unit::unit_warning;
pub use unit::{
    ArrivalError, ArrivalUnit, EPOCH_DOUBT_BEFORE_S, OFFSET_MS_DOUBT_RATE, OFFSET_MS_DOUBT_SPAN_S,
    OFFSET_S_DOUBT_RATE, OFFSET_S_DOUBT_SPAN_S,
};

/// What a field path means, for the errors that name one.
const FIELD_SYNTAX: &str = "expected keys separated by `.`, a key with dots in double quotes \
                            (e.g. attributes.\"gen_ai.usage.input_tokens\")";

/// A mapping, or one of its fields, as written is not valid. The message is the field's
/// problem; the reader names the field (`traffic[0].trace.mapping.arrival`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MappingError {
    /// A JSON path with a quote that never closes.
    #[error("`{0}` has an unterminated quote; {syntax}", syntax = FIELD_SYNTAX)]
    UnterminatedQuote(String),
    /// A JSON path with an empty key (`a..b`, `a.`).
    #[error("`{0}` has an empty key; {syntax}", syntax = FIELD_SYNTAX)]
    EmptyKey(String),
    /// A JSON path with text right after a quoted key.
    #[error("`{0}`: a quoted key must be followed by `.` or the end; {syntax}", syntax = FIELD_SYNTAX)]
    TextAfterQuote(String),
    /// An empty CSV column name.
    #[error("is empty; expected a column name of the header")]
    EmptyColumn,
    /// Both a session id and prefix hashes: the prefix blocks come from one or the other.
    #[error(
        "sets both `session_id` and `prefix_hashes`; give one: the prefix blocks come either \
         from the log's hashes or from the session's history"
    )]
    SessionAndHashes,
    /// `session_prefix: none` on a mapping without a session id.
    #[error("`session_prefix` applies to a mapping with a `session_id`; this one has none")]
    PrefixWithoutSession,
}

/// How the rows of a mapped trace are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceLayout {
    /// One JSON object per line; fields are found by [`FieldPath`].
    Jsonl,
    /// A header line, then comma-separated rows (double-quoted fields may hold commas, `""` is
    /// a quote); fields are columns named in the header.
    Csv,
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
    pub fn parse(text: &str) -> Result<Self, MappingError> {
        let mut keys = Vec::new();
        let mut rest = text;
        loop {
            let (key, after) = if let Some(q) = rest.strip_prefix('"') {
                let end = q
                    .find('"')
                    .ok_or_else(|| MappingError::UnterminatedQuote(text.to_owned()))?;
                (&q[..end], &q[end + 1..])
            } else {
                let end = rest.find('.').unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if key.is_empty() {
                return Err(MappingError::EmptyKey(text.to_owned()));
            }
            keys.push(key.to_owned());
            if after.is_empty() {
                break;
            }
            rest = after
                .strip_prefix('.')
                .ok_or_else(|| MappingError::TextAfterQuote(text.to_owned()))?;
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
    pub fn column(name: &str) -> Result<Self, MappingError> {
        if name.trim().is_empty() {
            return Err(MappingError::EmptyColumn);
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
    ) -> Result<Self, MappingError> {
        if session_id.is_some() && prefix_hashes.is_some() {
            return Err(MappingError::SessionAndHashes);
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
    pub fn with_session_prefix(
        mut self,
        session_prefix: SessionPrefix,
    ) -> Result<Self, MappingError> {
        if self.session_id.is_none() && session_prefix != SessionPrefix::Growing {
            return Err(MappingError::PrefixWithoutSession);
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

#[cfg(test)]
mod tests {
    use super::rows::{Cell, json_cell, split_csv};
    use super::*;
    use serde_json::Value;

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
                .to_string()
                .contains("offset_s")
        );
        assert!(
            ArrivalUnit::detect("-3")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(
            ArrivalUnit::detect("yesterday")
                .unwrap_err()
                .to_string()
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
                .to_string()
                .contains("before 1970")
        );
        assert_eq!(ArrivalUnit::OffsetMs.parse("1500"), Ok(1_500_000_000));
        assert_eq!(ArrivalUnit::OffsetS.parse("1.25"), Ok(1_250_000_000));
        assert!(ArrivalUnit::OffsetS.parse("NaN").is_err());
        let m = ArrivalUnit::EpochMs
            .parse("2025-03-01T12:00:00Z")
            .unwrap_err()
            .to_string();
        assert!(m.contains("epoch_ms") && m.contains("iso8601"), "{m}");
        assert!(
            ArrivalUnit::EpochS
                .parse("1e300")
                .unwrap_err()
                .to_string()
                .contains("2262")
        );
        assert!(
            ArrivalUnit::OffsetS
                .parse("-1")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(
            ArrivalUnit::Iso8601
                .parse("01/03/2025")
                .unwrap_err()
                .to_string()
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
