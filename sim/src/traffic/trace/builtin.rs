//! The streamed formats' rows: Azure LLM 2023 CSV and Mooncake JSONL lines, each into a row or
//! a located bad-row error, and the token counts every format reads.
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;

use super::parse_timestamp;
use crate::traffic::TrafficError;
use crate::traffic::hash::{blocks_for_tokens, chain_in_place};

// ---------------------------------------------------------------------------------------------

pub(super) struct Row {
    /// Timestamp, ns (absolute for Azure, relative for Mooncake).
    pub(super) ts: i64,
    pub(super) prompt: u32,
    pub(super) output: u32,
    pub(super) blocks: Vec<u64>,
}

#[derive(Debug)]
pub(super) struct CsvColumns {
    names: Vec<String>,
    ts: usize,
    prompt: usize,
    output: usize,
}

/// The streamed formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Builtin {
    Azure,
    Mooncake,
}

pub(super) struct ParseState {
    pub(super) path: PathBuf,
    pub(super) format: Builtin,
    pub(super) line: u64,
    pub(super) columns: Option<CsvColumns>,
    pub(super) data_rows: u64,
    pub(super) skip_rows: u64,
    /// Timestamp of the first accepted row.
    pub(super) first: Option<i64>,
    /// Timestamp and line of the last accepted row.
    pub(super) prev: Option<(i64, u64)>,
}

const AZURE_HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

impl ParseState {
    fn bad(&self, field: &str, problem: impl Into<String>) -> TrafficError {
        TrafficError::BadRow {
            path: self.path.clone(),
            line: self.line,
            field: field.to_owned(),
            problem: problem.into(),
        }
    }

    /// Consume one physical line. `Ok(None)` for blank lines, the header and `skip_rows` rows.
    pub(super) fn process(&mut self, raw: &[u8]) -> Result<Option<Row>, TrafficError> {
        self.line += 1;
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t.trim(),
            Err(e) => {
                let header = self.format == Builtin::Azure && self.columns.is_none();
                return Err(TrafficError::not_utf8(&self.path, self.line, header, e));
            }
        };
        if text.is_empty() {
            return Ok(None);
        }
        if self.format == Builtin::Azure && self.columns.is_none() {
            self.columns = Some(self.parse_header(text)?);
            return Ok(None);
        }
        if self.data_rows < self.skip_rows {
            self.data_rows += 1;
            return Ok(None);
        }
        self.data_rows += 1;
        let row = match self.format {
            Builtin::Azure => self.parse_csv_row(text)?,
            Builtin::Mooncake => self.parse_json_row(text)?,
        };
        if let Some((prev, prev_line)) = self.prev
            && row.ts < prev
        {
            let (field, value) = match (&self.format, &self.columns) {
                (Builtin::Azure, Some(c)) => (
                    "TIMESTAMP",
                    text.split(',')
                        .nth(c.ts)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                ),
                _ => ("timestamp", format!("{} ms", row.ts as f64 / 1e6)),
            };
            return Err(TrafficError::Unsorted {
                path: self.path.clone(),
                line: self.line,
                field,
                value,
                behind_ns: prev.abs_diff(row.ts),
                prev_line,
            });
        }
        self.prev = Some((row.ts, self.line));
        Ok(Some(row))
    }

    fn parse_header(&self, text: &str) -> Result<CsvColumns, TrafficError> {
        let names: Vec<String> = text.split(',').map(|s| unquote(s).to_owned()).collect();
        let find = |want: &str| names.iter().position(|n| n.eq_ignore_ascii_case(want));
        let mut missing = Vec::new();
        let mut get = |want: &'static str| {
            find(want).unwrap_or_else(|| {
                missing.push(want);
                0
            })
        };
        let (ts, prompt, output) = (
            get("TIMESTAMP"),
            get("ContextTokens"),
            get("GeneratedTokens"),
        );
        if !missing.is_empty() {
            return Err(TrafficError::BadHeader {
                path: self.path.clone(),
                line: self.line,
                problem: format!(
                    "missing column(s) {}; expected a header like `{AZURE_HEADER}` (the Azure \
                     2023 trace, which `.csv` is read as), found `{text}`. {}",
                    missing
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    own_columns_hint("csv", &names)
                ),
            });
        }
        Ok(CsvColumns {
            names,
            ts,
            prompt,
            output,
        })
    }

    fn parse_csv_row(&self, text: &str) -> Result<Row, TrafficError> {
        let Some(cols) = &self.columns else {
            unreachable!("header parsed first")
        };
        let (mut ts, mut prompt, mut output) = (None, None, None);
        let mut n = 0;
        for (i, field) in text.split(',').enumerate() {
            n = i + 1;
            if i == cols.ts {
                ts = Some(field);
            } else if i == cols.prompt {
                prompt = Some(field);
            } else if i == cols.output {
                output = Some(field);
            }
        }
        if n != cols.names.len() {
            let field = cols.names.get(n).map_or("<row>", String::as_str);
            return Err(self.bad(
                field,
                format!(
                    "row has {n} column(s) but the header has {}; expected `{}`",
                    cols.names.len(),
                    cols.names.join(",")
                ),
            ));
        }
        let (Some(ts), Some(prompt), Some(output)) = (ts, prompt, output) else {
            unreachable!("all columns present when the count matches the header")
        };
        let ts_text = unquote(ts);
        let ts = parse_timestamp(ts_text).ok_or_else(|| {
            self.bad(
                &cols.names[cols.ts],
                format!(
                    "`{ts_text}` is not a timestamp; expected `YYYY-MM-DD HH:MM:SS[.fraction]` \
                     (e.g. `2023-11-16 18:17:03.9799600`) or seconds as a number"
                ),
            )
        })?;
        let prompt =
            parse_count(unquote(prompt), 0).map_err(|p| self.bad(&cols.names[cols.prompt], p))?;
        let output =
            parse_count(unquote(output), 1).map_err(|p| self.bad(&cols.names[cols.output], p))?;
        Ok(Row {
            ts,
            prompt,
            output,
            blocks: Vec::new(),
        })
    }

    fn parse_json_row(&self, text: &str) -> Result<Row, TrafficError> {
        let raw: MooncakeRow = serde_json::from_str(text).map_err(|e| {
            TrafficError::bad_json(
                &self.path,
                self.line,
                &e,
                "one object per line like {\"timestamp\": <ms >= 0>, \"input_length\": \
                 <int >= 0>, \"output_length\": <int >= 1>, \"hash_ids\": [<int>, ...]}"
                    .to_owned(),
            )
        })?;
        if raw.timestamp.is_none() && raw.input_length.is_none() && raw.output_length.is_none() {
            let keys: Vec<String> = serde_json::from_str::<serde_json::Map<String, Value>>(text)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            return Err(self.bad(
                "timestamp",
                format!(
                    "is missing, and so are `input_length` and `output_length`: this is not a \
                     Mooncake row (which `.jsonl` is read as). {}",
                    own_columns_hint("jsonl", &keys)
                ),
            ));
        }
        let ts = json_timestamp_ns(raw.timestamp.as_ref()).map_err(|p| self.bad("timestamp", p))?;
        let prompt =
            json_count(raw.input_length.as_ref(), 0).map_err(|p| self.bad("input_length", p))?;
        let output =
            json_count(raw.output_length.as_ref(), 1).map_err(|p| self.bad("output_length", p))?;
        let Some(HashIds(mut blocks)) = raw.hash_ids else {
            return Err(self.bad(
                "hash_ids",
                "is missing; expected a list of ceil(input_length/512) integer block ids",
            ));
        };
        let expected = blocks_for_tokens(u64::from(prompt));
        if blocks.len() as u64 != expected {
            return Err(TrafficError::HashIdsLength {
                path: self.path.clone(),
                line: self.line,
                input_length: u64::from(prompt),
                found: blocks.len(),
                expected,
            });
        }
        chain_in_place(&mut blocks);
        Ok(Row {
            ts,
            prompt,
            output,
            blocks,
        })
    }
}

/// How to read a log with its own columns or keys (`layout` `csv` or `jsonl`, `names` the
/// ones it has): a mapping in a scenario's trace source, which `trace stats` reads too.
pub(crate) fn own_columns_hint(layout: &str, names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(12).map(String::as_str).collect();
    let what = if layout == "csv" { "columns" } else { "keys" };
    format!(
        "A log with its own {what} ({}) is read through a mapping in a scenario: `trace: {{ \
         path: <file>, format: {layout}, mapping: {{ arrival: <{what}>, prompt_tokens: \
         <{what}>, output_tokens: <{what}> }} }}` (optional `arrival_unit`, `session_id`, \
         `session_prefix`, `prefix_hashes`; docs/traces.md), then `routelab trace stats \
         <scenario>.yaml` shows what it reads",
        shown.join(", ")
    )
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(s)
        .trim()
}

/// Parse a token count `>= min` that fits in `u32`; the error says what would be valid.
pub(crate) fn parse_count(s: &str, min: u32) -> Result<u32, String> {
    let expect = format!("expected an integer >= {min}");
    if s.is_empty() {
        return Err(format!("is empty; {expect}"));
    }
    if let Some(rest) = s.strip_prefix('-')
        && rest.parse::<f64>().is_ok()
    {
        return Err(format!("is negative ({s}); {expect}"));
    }
    let v: u64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a non-negative integer; {expect}"))?;
    check_count(v, min, &expect)
}

pub(crate) fn check_count(v: u64, min: u32, expect: &str) -> Result<u32, String> {
    if v < u64::from(min) {
        let what = if v == 0 { "zero length" } else { "too small" };
        return Err(format!("is {v} ({what}); {expect}"));
    }
    u32::try_from(v).map_err(|_| format!("is {v}, too large; expected at most {}", u32::MAX))
}

fn json_count(v: Option<&Value>, min: u32) -> Result<u32, String> {
    let expect = format!("expected an integer >= {min}");
    match v {
        None => Err(format!("is missing; {expect}")),
        Some(Value::Number(n)) => {
            if let Some(u) = n.as_u64() {
                check_count(u, min, &expect)
            } else if n.as_i64().is_some() || n.as_f64().is_some_and(|f| f < 0.0) {
                Err(format!("is negative ({n}); {expect}"))
            } else {
                Err(format!("is {n}, not an integer; {expect}"))
            }
        }
        Some(other) => Err(format!("is {other}, not a number; {expect}")),
    }
}

fn json_timestamp_ns(v: Option<&Value>) -> Result<i64, String> {
    const EXPECT: &str = "expected milliseconds >= 0 as a number";
    let Some(v) = v else {
        return Err(format!("is missing; {EXPECT}"));
    };
    let Value::Number(n) = v else {
        return Err(format!("is {v}, not a number; {EXPECT}"));
    };
    if let Some(ms) = n.as_u64() {
        return ms
            .checked_mul(1_000_000)
            .and_then(|ns| i64::try_from(ns).ok())
            .ok_or_else(|| format!("is {ms}, too large; {EXPECT} below 9.2e12"));
    }
    match n.as_f64() {
        Some(ms) if ms < 0.0 => Err(format!("is negative ({n}); {EXPECT}")),
        Some(ms) if ms * 1e6 < 9.2e18 => Ok((ms * 1e6).round() as i64),
        _ => Err(format!("is {n}, out of range; {EXPECT}")),
    }
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: Option<Value>,
    input_length: Option<Value>,
    output_length: Option<Value>,
    hash_ids: Option<HashIds>,
}

/// `hash_ids` with an error message that names the field.
struct HashIds(Vec<u64>);

impl<'de> Deserialize<'de> for HashIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = HashIds;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("field `hash_ids` to be a list of integer block ids >= 0")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<HashIds, A::Error> {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(16));
                while let Some(n) = seq.next_element::<serde_json::Number>()? {
                    let Some(id) = n.as_u64() else {
                        return Err(serde::de::Error::custom(format!(
                            "field `hash_ids`: element {} is {n}; expected an integer block id >= 0",
                            ids.len()
                        )));
                    };
                    ids.push(id);
                }
                Ok(HashIds(ids))
            }
        }
        d.deserialize_seq(V)
    }
}
