//! Streaming replay of public request traces (Azure LLM 2023 CSV, Mooncake JSONL).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::mapping::{
    MappedRow, MappedRows, Parsed, TraceLayout, TraceMapping, sort_and_link_sessions, unit_warning,
};
use super::resample::{Resample, TimeWindow};
use super::{Arrival, Skipped, TrafficError, TrafficSource};
use std::collections::VecDeque;

mod builtin;
mod time;

use builtin::{Builtin, ParseState};
pub(crate) use builtin::{check_count, parse_count};
pub(crate) use time::{parse_datetime, parse_timestamp};

/// Supported trace formats.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023: CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`
    /// (columns found by name, case-insensitive, any order, extra columns ignored).
    /// `TIMESTAMP` is `YYYY-MM-DD HH:MM:SS[.fraction]` (a `T` separator and a trailing `Z` or
    /// `±HH:MM` offset are accepted too) or a plain number of seconds. No prefix information.
    AzureCsv,
    /// Mooncake JSON Lines: `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`;
    /// other keys are ignored. `hash_ids` (one id per 512-token block) are remapped to prefix
    /// hashes: block i's hash is the chain hash of ids `0..=i`.
    MooncakeJsonl,
    /// Any JSONL or CSV request log read through a [`TraceMapping`] (a custom one or a
    /// ready-made one: [`TraceMapping::gateway_log`], [`TraceMapping::otel_genai`]). Read whole
    /// and sorted by arrival.
    Mapped(Box<TraceMapping>),
}

impl TraceFormat {
    /// The formats a file names on its own, with no mapping: what [`TraceFormat::from_name`]
    /// returns a format for.
    pub const COMPLETE_NAMES: &'static str = "azure, mooncake, gateway-log, otel-genai";
    /// Every format name a scenario accepts (`jsonl` and `csv` need a mapping).
    pub const NAMES: &'static str = "azure, mooncake, gateway-log, otel-genai, jsonl, csv";

    /// The named format: `azure`, `mooncake` or a ready-made mapping ([`READY_MADE_MAPPINGS`](super::READY_MADE_MAPPINGS)).
    /// `jsonl` and `csv` are not complete without a mapping and give `None`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "azure" => Some(Self::AzureCsv),
            "mooncake" => Some(Self::MooncakeJsonl),
            other => TraceMapping::ready_made(other).map(|m| Self::Mapped(Box::new(m))),
        }
    }

    /// Guess the format from the file extension (`.csv`, `.jsonl` / `.json`).
    #[must_use]
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "csv" => Some(Self::AzureCsv),
            "jsonl" | "json" | "ndjson" => Some(Self::MooncakeJsonl),
            _ => None,
        }
    }

    /// The layout of a custom mapping's file, guessed from the extension like
    /// [`TraceFormat::from_path`].
    #[must_use]
    pub fn layout_from_path(path: &Path) -> Option<TraceLayout> {
        match Self::from_path(path)? {
            Self::AzureCsv => Some(TraceLayout::Csv),
            _ => Some(TraceLayout::Jsonl),
        }
    }

    /// The format's name (`azure`, `mooncake`, `jsonl`, `csv`, `gateway-log`, `otel-genai`).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::AzureCsv => "azure",
            Self::MooncakeJsonl => "mooncake",
            Self::Mapped(m) => m.name(),
        }
    }
}

/// What to do with an invalid row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadRowPolicy {
    /// Stop with the row's error.
    #[default]
    Error,
    /// Skip the row; it is counted in [`TraceReplay::skipped_rows`] and the first few errors are
    /// kept in [`TraceReplay::skipped_examples`].
    Skip,
}

/// How a trace is replayed.
///
/// Arrival time of a row = `start_offset + (t_row − t_first) · time_scale / rate_scale`, where
/// `t_first` is the timestamp of the first replayed row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayOptions {
    /// Multiplies inter-arrival times (2.0 = half the rate). Finite, > 0.
    pub time_scale: f64,
    /// Multiplies the arrival rate (2.0 = inter-arrival times halved). Finite, > 0.
    pub rate_scale: f64,
    /// Replay at most this many rows (after `skip_rows`; skipped bad rows do not count).
    pub limit: Option<u64>,
    /// Leave out this many leading data rows (unvalidated) before replaying.
    pub skip_rows: u64,
    /// Simulated time of the first replayed row, ns.
    pub start_offset: u64,
    /// Start at the fleet's warm-up instead: set for a scenario's trace without
    /// `start_offset_s`, and resolved by the scenario into `start_offset`
    /// (`Scenario::warmup_ns`) before the trace is opened; [`TraceReplay`] reads `start_offset`
    /// only.
    pub start_after_warmup: bool,
    /// Error out on, or skip and count, invalid rows.
    pub on_bad_row: BadRowPolicy,
    /// How seeds relate to the trace (`None`: not said in the scenario; the command decides,
    /// and a plain replay is [`Resample::Exact`]). Not read by [`TraceReplay`] itself, which
    /// always replays as recorded: see [`super::open_trace`].
    pub resample: Option<Resample>,
    /// Only this part of the trace by time (a held-out part); `None`: all of it.
    pub window: Option<TimeWindow>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            time_scale: 1.0,
            rate_scale: 1.0,
            limit: None,
            skip_rows: 0,
            start_offset: 0,
            start_after_warmup: false,
            on_bad_row: BadRowPolicy::Error,
            resample: None,
            window: None,
        }
    }
}

impl ReplayOptions {
    /// Check the scales.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] when a scale is not a finite positive number.
    pub fn validate(&self) -> Result<(), TrafficError> {
        if self.limit == Some(0) {
            return Err(TrafficError::config(
                "ReplayOptions",
                "limit",
                "is 0; expected at least 1 row (leave it out to replay every row)",
            ));
        }
        for (field, v) in [
            ("time_scale", self.time_scale),
            ("rate_scale", self.rate_scale),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(TrafficError::config(
                    "ReplayOptions",
                    field,
                    format!("is {v}; expected a finite factor > 0"),
                ));
            }
        }
        Ok(())
    }

    fn factor(&self) -> f64 {
        self.time_scale / self.rate_scale
    }

    /// The replay's `rate_scale` times `factor` (the load scale of `routelab capacity`): the
    /// same rows, their inter-arrival times divided by `factor`.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            rate_scale: self.rate_scale * factor,
            ..self.clone()
        }
    }
}

/// How many skipped-row errors [`TraceReplay`] keeps as examples.
pub const MAX_SKIPPED_EXAMPLES: usize = 16;

/// Trace replayer: yields one [`Arrival`] per valid row; the arrival's `tag` is the row's
/// 1-based line number. Output lengths must be ≥ 1; prompt lengths ≥ 0.
///
/// Azure and Mooncake traces are streamed one line at a time (memory independent of the file
/// length); their rows must be sorted by time, an earlier timestamp than the previous row is an
/// error ([`TrafficError::Unsorted`]). A [`TraceFormat::Mapped`] log is read whole on the first
/// call (one small record per row) and replayed sorted by arrival, equal times in file order.
pub struct TraceReplay {
    reader: Box<dyn BufRead + Send>,
    buf: Vec<u8>,
    format: TraceFormat,
    st: ParseState,
    /// The mapped log's parser (`None` for the streamed formats).
    mapped: Option<MappedRows>,
    /// The mapped log's rows, sorted, once read; and the first one's time.
    sorted: Option<(VecDeque<MappedRow>, i64)>,
    ignored: u64,
    factor: f64,
    limit: u64,
    start_offset: u64,
    policy: BadRowPolicy,
    emitted: u64,
    skipped: u64,
    examples: Vec<TrafficError>,
    finished: bool,
    /// What the replay noticed about the data ([`TrafficSource::warnings`]).
    warnings: Vec<String>,
}

impl std::fmt::Debug for TraceReplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReplay")
            .field("path", &self.st.path)
            .field("format", &self.format)
            .field("line", &self.st.line)
            .field("emitted", &self.emitted)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl TraceReplay {
    /// Open `path` for streaming replay.
    ///
    /// # Errors
    /// [`TrafficError::Io`] when the file cannot be opened, [`TrafficError::InvalidConfig`] for
    /// bad options.
    pub fn open(
        path: impl AsRef<Path>,
        format: TraceFormat,
        options: ReplayOptions,
    ) -> Result<Self, TrafficError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| TrafficError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_reader(
            BufReader::with_capacity(1 << 16, file),
            path,
            format,
            options,
        )
    }

    /// Replay from any buffered reader; `name` is used as the file name in errors.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for bad options.
    pub fn from_reader(
        reader: impl BufRead + Send + 'static,
        name: impl Into<PathBuf>,
        format: TraceFormat,
        options: ReplayOptions,
    ) -> Result<Self, TrafficError> {
        options.validate()?;
        let path: PathBuf = name.into();
        let (builtin, mapped) = match &format {
            TraceFormat::AzureCsv => (Builtin::Azure, None),
            TraceFormat::MooncakeJsonl => (Builtin::Mooncake, None),
            TraceFormat::Mapped(m) => (
                Builtin::Mooncake,
                Some(MappedRows::new(
                    (**m).clone(),
                    path.clone(),
                    options.skip_rows,
                )),
            ),
        };
        Ok(Self {
            reader: Box::new(reader),
            buf: Vec::with_capacity(256),
            format,
            mapped,
            sorted: None,
            ignored: 0,
            st: ParseState {
                path,
                format: builtin,
                line: 0,
                columns: None,
                data_rows: 0,
                skip_rows: options.skip_rows,
                first: None,
                prev: None,
            },
            factor: options.factor(),
            limit: options.limit.unwrap_or(u64::MAX),
            start_offset: options.start_offset,
            policy: options.on_bad_row,
            emitted: 0,
            skipped: 0,
            examples: Vec::new(),
            finished: false,
            warnings: Vec::new(),
        })
    }

    /// The trace's file name.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.st.path
    }

    /// The trace's format.
    #[must_use]
    pub const fn format(&self) -> &TraceFormat {
        &self.format
    }

    /// Rows that are not requests, ignored and counted (OpenTelemetry spans of other kinds;
    /// [`TraceMapping::ignored_rows_are`] says which).
    #[must_use]
    pub const fn ignored_rows(&self) -> u64 {
        self.ignored
    }

    /// Rows replayed so far.
    #[must_use]
    pub const fn rows_emitted(&self) -> u64 {
        self.emitted
    }

    /// Invalid rows skipped so far (always 0 with [`BadRowPolicy::Error`]).
    #[must_use]
    pub const fn skipped_rows(&self) -> u64 {
        self.skipped
    }

    /// The errors of the first [`MAX_SKIPPED_EXAMPLES`] skipped rows.
    #[must_use]
    pub fn skipped_examples(&self) -> &[TrafficError] {
        &self.examples
    }

    /// Lines read so far.
    #[must_use]
    pub fn lines_read(&self) -> u64 {
        self.mapped.as_ref().map_or(self.st.line, MappedRows::line)
    }

    fn skip(&mut self, e: TrafficError) {
        self.skipped += 1;
        if self.examples.len() < MAX_SKIPPED_EXAMPLES {
            self.examples.push(e);
        }
    }

    /// Read a mapped log whole (at most `limit` valid rows, in file order), then sort it.
    fn load_mapped(&mut self) -> Result<VecDeque<MappedRow>, TrafficError> {
        crate::footprint::check_trace_fits(
            &self.st.path,
            (self.limit < u64::MAX).then_some(self.limit),
        )?;
        let mut rows = Vec::new();
        'lines: while (rows.len() as u64) < self.limit {
            self.buf.clear();
            if let Err(source) = self.reader.read_until(b'\n', &mut self.buf) {
                return Err(TrafficError::Io {
                    path: self.st.path.clone(),
                    source,
                });
            }
            if self.buf.is_empty() {
                break;
            }
            let parser = self
                .mapped
                .as_mut()
                .expect("a mapped replay has its parser");
            let items = match parser.process(&self.buf) {
                Ok(Parsed::Spans(items)) => items,
                other => vec![other],
            };
            for item in items {
                if rows.len() as u64 >= self.limit {
                    break 'lines;
                }
                match item {
                    Ok(Parsed::Nothing | Parsed::Spans(_)) => {}
                    Ok(Parsed::Ignored) => self.ignored += 1,
                    Ok(Parsed::Row(row)) => rows.push(row),
                    Err(e) if e.is_row_error() && self.policy == BadRowPolicy::Skip => {
                        self.skip(e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // The file's name, not its path: the same scenario run from another directory (or
        // through `./`) must give the same bytes.
        let source = self
            .st
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parser = self
            .mapped
            .as_ref()
            .expect("a mapped replay has its parser");
        let (rows, shrinking) =
            sort_and_link_sessions(rows, &source, parser.mapping().session_prefix());
        let (unit, declared) = parser.unit();
        self.warnings
            .extend(unit_warning(unit, declared, &rows, &source));
        self.warnings.extend(shrinking);
        if rows.is_empty() {
            return Err(self.empty(parser.data_rows()));
        }
        Ok(rows.into())
    }

    /// The error of a trace that replays nothing, saying what it held (`data_rows`: rows after
    /// a header, those left out by `skip_rows` included).
    fn empty(&self, data_rows: u64) -> TrafficError {
        let lines = self.lines_read();
        let skip_rows = self.st.skip_rows;
        let detail = if lines == 0 {
            "the file is empty (0 bytes)".to_owned()
        } else if self.skipped > 0 {
            format!(
                "every one of its {} data row(s) was bad and skipped (on_bad_row: skip); the \
                 first: {}",
                self.skipped,
                self.examples
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )
        } else if self.ignored > 0 {
            let what = match &self.format {
                TraceFormat::Mapped(m) => m.ignored_rows_are(),
                _ => None,
            };
            format!(
                "its {} row(s) are not requests ({})",
                self.ignored,
                what.unwrap_or("ignored")
            )
        } else if skip_rows > 0 && data_rows > 0 {
            format!("`skip_rows: {skip_rows}` leaves out all {data_rows} of its data rows")
        } else if self.limit == 0 {
            "`limit: 0` replays no row".to_owned()
        } else {
            format!(
                "its {lines} line(s) hold no data row (a header, blank lines or nothing but \
                 whitespace)"
            )
        };
        TrafficError::Empty {
            path: self.st.path.clone(),
            detail,
        }
    }

    fn next_mapped(&mut self) -> Result<Option<(Arrival, Option<u64>)>, TrafficError> {
        if self.sorted.is_none() {
            if self.finished {
                return Ok(None);
            }
            match self.load_mapped() {
                Ok(rows) => {
                    let first = rows.front().map_or(0, |r| r.ts);
                    self.sorted = Some((rows, first));
                }
                Err(e) => {
                    self.finished = true;
                    return Err(e);
                }
            }
        }
        let Some((rows, first)) = self.sorted.as_mut() else {
            return Ok(None);
        };
        let first = *first;
        let Some(row) = rows.pop_front() else {
            return Ok(None);
        };
        let delta = u64::try_from(row.ts.saturating_sub(first)).unwrap_or(0);
        self.emitted += 1;
        Ok(Some((
            Arrival {
                at: self.start_offset.saturating_add(self.scale(delta)),
                prompt_tokens: row.prompt,
                output_tokens: row.output,
                prefix_blocks: row.blocks,
                tag: row.line,
            },
            row.session_key,
        )))
    }

    #[inline]
    fn scale(&self, delta_ns: u64) -> u64 {
        if self.factor == 1.0 {
            delta_ns
        } else {
            (delta_ns as f64 * self.factor).round() as u64 // saturating
        }
    }
}

impl TraceReplay {
    /// The next row as an arrival, with its session's key (mapped logs with a session id;
    /// `None` otherwise): what a loaded trace ([`super::resample`]) groups sessions by.
    ///
    /// # Errors
    /// As [`TrafficSource::next_arrival`].
    pub(crate) fn next_row(&mut self) -> Result<Option<(Arrival, Option<u64>)>, TrafficError> {
        if self.mapped.is_some() {
            return self.next_mapped();
        }
        loop {
            if self.finished || self.emitted >= self.limit {
                return Ok(None);
            }
            self.buf.clear();
            if let Err(source) = self.reader.read_until(b'\n', &mut self.buf) {
                self.finished = true;
                return Err(TrafficError::Io {
                    path: self.st.path.clone(),
                    source,
                });
            }
            if self.buf.is_empty() {
                self.finished = true;
                if self.emitted == 0 {
                    return Err(self.empty(self.st.data_rows));
                }
                return Ok(None);
            }
            match self.st.process(&self.buf) {
                Ok(None) => {}
                Ok(Some(row)) => {
                    let first = *self.st.first.get_or_insert(row.ts);
                    let delta = u64::try_from(row.ts.saturating_sub(first)).unwrap_or(0);
                    let at = self.start_offset.saturating_add(self.scale(delta));
                    self.emitted += 1;
                    return Ok(Some((
                        Arrival {
                            at,
                            prompt_tokens: row.prompt,
                            output_tokens: row.output,
                            prefix_blocks: row.blocks,
                            tag: self.st.line,
                        },
                        None,
                    )));
                }
                Err(e) if e.is_row_error() && self.policy == BadRowPolicy::Skip => self.skip(e),
                Err(e) => {
                    self.finished = true;
                    return Err(e);
                }
            }
        }
    }
}

impl TrafficSource for TraceReplay {
    fn skipped(&self) -> Skipped {
        Skipped {
            rows: self.skipped,
            first: self.examples.first().map(ToString::to_string),
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        Ok(self.next_row()?.map(|(a, _)| a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn replay(text: &str, format: TraceFormat, opts: ReplayOptions) -> TraceReplay {
        TraceReplay::from_reader(Cursor::new(text.to_owned()), "mem.trace", format, opts).unwrap()
    }

    fn drain(r: &mut TraceReplay) -> Result<Vec<Arrival>, TrafficError> {
        let mut v = Vec::new();
        while let Some(a) = r.next_arrival()? {
            v.push(a);
        }
        Ok(v)
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp("1970-01-02 00:00:01.5"),
            Some(86_401_500_000_000)
        );
        let a = parse_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_timestamp("2023-11-16 18:17:04.0319600").unwrap();
        assert_eq!(b - a, 52_000_000);
        // 2023-11-16T18:17:03Z = 1700158623
        assert_eq!(
            parse_timestamp("2023-11-16T18:17:03Z"),
            Some(1_700_158_623_000_000_000)
        );
        assert_eq!(
            parse_timestamp("2024-05-10 00:00:00.009930+00:00"),
            Some(1_715_299_200_009_930_000)
        );
        assert_eq!(
            parse_timestamp("2024-05-10 02:00:00+02:00"),
            parse_timestamp("2024-05-10 00:00:00")
        );
        assert_eq!(parse_timestamp("2024-02-29 00:00:00").map(|_| ()), Some(()));
        assert_eq!(parse_timestamp("12.5"), Some(12_500_000_000));
        for bad in [
            "2023-02-29 00:00:00",
            "2023-13-01 00:00:00",
            "2023-11-16 24:00:00",
            "x",
            "",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:17:03 junk",
            "2023/11/16 18:17:03",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn csv_basic_and_scaling() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:03.0,10,1\r\n\
                    2023-11-16 18:17:04.0,20,2\n\
                    \n\
                    2023-11-16 18:17:06.0,30,3\n";
        let v = drain(&mut replay(
            text,
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
        ))
        .unwrap();
        let at: Vec<u64> = v.iter().map(|a| a.at).collect();
        assert_eq!(at, [0, 1_000_000_000, 3_000_000_000]);
        assert_eq!(v[2].prompt_tokens, 30);
        assert_eq!(v[2].output_tokens, 3);
        assert_eq!(v[2].tag, 5);
        let opts = ReplayOptions {
            time_scale: 3.0,
            rate_scale: 2.0,
            start_offset: 7,
            skip_rows: 1,
            limit: Some(1),
            ..ReplayOptions::default()
        };
        let v = drain(&mut replay(text, TraceFormat::AzureCsv, opts)).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].at, v[0].prompt_tokens), (7, 20));
        let opts = ReplayOptions {
            skip_rows: 1,
            time_scale: 3.0,
            rate_scale: 2.0,
            ..Default::default()
        };
        let v = drain(&mut replay(text, TraceFormat::AzureCsv, opts)).unwrap();
        assert_eq!(v[1].at, 3_000_000_000);
    }

    #[test]
    fn csv_reordered_columns_and_header_errors() {
        let text = "GeneratedTokens,extra,TIMESTAMP,ContextTokens\n5,x,2023-11-16 18:17:03,9\n";
        let v = drain(&mut replay(
            text,
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
        ))
        .unwrap();
        assert_eq!((v[0].prompt_tokens, v[0].output_tokens), (9, 5));
        let mut r = replay(
            "time,ContextTokens\n1,2\n",
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
        );
        let e = r.next_arrival().unwrap_err().to_string();
        assert!(
            e.contains("mem.trace:1")
                && e.contains("`TIMESTAMP`")
                && e.contains("`GeneratedTokens`"),
            "{e}"
        );
    }

    #[test]
    fn csv_row_errors() {
        let cases = [
            ("2023-11-16 18:17:03,5", "GeneratedTokens", "2 column"),
            ("2023-11-16 18:17:03,-5,3", "ContextTokens", "negative"),
            (
                "2023-11-16 18:17:03,abc,3",
                "ContextTokens",
                "not a non-negative integer",
            ),
            ("2023-11-16 18:17:03,5,0", "GeneratedTokens", "zero length"),
            ("yesterday,5,1", "TIMESTAMP", "not a timestamp"),
            (
                "2023-11-16 18:17:03,5,99999999999",
                "GeneratedTokens",
                "too large",
            ),
        ];
        for (row, field, what) in cases {
            let text = format!("TIMESTAMP,ContextTokens,GeneratedTokens\n{row}\n");
            let e = drain(&mut replay(
                &text,
                TraceFormat::AzureCsv,
                ReplayOptions::default(),
            ))
            .unwrap_err();
            assert!(e.is_row_error());
            assert_eq!(e.line(), Some(2));
            let m = e.to_string();
            assert!(
                m.starts_with("mem.trace:2: ") && m.contains(field) && m.contains(what),
                "{m}"
            );
        }
    }

    #[test]
    fn unsorted_and_skip() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:05,1,1\n\
                    2023-11-16 18:17:04,1,1\n\
                    2023-11-16 18:17:06,1,1\n";
        let e = drain(&mut replay(
            text,
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
        ))
        .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("mem.trace:3")
                && m.contains("TIMESTAMP")
                && m.contains("line 2")
                && m.contains("non-decreasing"),
            "{m}"
        );
        let mut r = replay(
            text,
            TraceFormat::AzureCsv,
            ReplayOptions {
                on_bad_row: BadRowPolicy::Skip,
                ..Default::default()
            },
        );
        let v = drain(&mut r).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].at, 1_000_000_000);
        assert_eq!(r.skipped_rows(), 1);
        assert_eq!(r.skipped_examples()[0].line(), Some(3));
    }

    #[test]
    fn mooncake_rows() {
        let text = r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 3000, "input_length": 512, "output_length": 5, "hash_ids": [0], "extra": true}
{"timestamp": 3000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 7]}
"#;
        let v = drain(&mut replay(
            text,
            TraceFormat::MooncakeJsonl,
            ReplayOptions::default(),
        ))
        .unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[1].at, 3_000_000_000);
        assert_eq!(v[0].prefix_blocks[0], v[1].prefix_blocks[0]);
        assert_eq!(v[0].prefix_blocks[..2], v[2].prefix_blocks[..2]);
        assert_eq!(v[2].prefix_blocks.len(), 3);
    }

    #[test]
    fn mooncake_errors() {
        let cases = [
            (
                r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}"#,
                "ceil(600/512) = 2",
            ),
            (
                r#"{"timestamp": 0, "input_length": -1, "output_length": 5, "hash_ids": []}"#,
                "`input_length`: is negative",
            ),
            (
                r#"{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [0]}"#,
                "`output_length`: is 0 (zero length)",
            ),
            (
                r#"{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [0]}"#,
                "`timestamp`: is \"x\", not a number",
            ),
            (
                r#"{"timestamp": 0, "input_length": 1, "output_length": 1}"#,
                "`hash_ids`: is missing",
            ),
            (
                r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-3]}"#,
                "`hash_ids`: element 0 is -3",
            ),
            (r#"{"timestamp": 0, "input_length": 1,"#, "invalid JSON"),
            (
                r#"{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [0]}"#,
                "not an integer",
            ),
        ];
        for (row, what) in cases {
            let e = drain(&mut replay(
                row,
                TraceFormat::MooncakeJsonl,
                ReplayOptions::default(),
            ))
            .unwrap_err();
            let m = e.to_string();
            assert!(
                m.starts_with("mem.trace:1: ") && m.contains(what),
                "{what} :: {m}"
            );
        }
    }

    #[test]
    fn options_are_validated() {
        for (t, r) in [
            (0.0, 1.0),
            (1.0, -1.0),
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
        ] {
            let o = ReplayOptions {
                time_scale: t,
                rate_scale: r,
                ..Default::default()
            };
            assert!(
                TraceReplay::from_reader(Cursor::new(""), "x", TraceFormat::AzureCsv, o).is_err()
            );
        }
        let e = TraceReplay::open(
            "/nonexistent/x.csv",
            TraceFormat::AzureCsv,
            ReplayOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/x.csv"), "{e}");
    }

    #[test]
    fn format_name_lists_agree_with_from_name() {
        for name in TraceFormat::COMPLETE_NAMES.split(", ") {
            assert!(TraceFormat::from_name(name).is_some(), "{name}");
        }
        assert_eq!(
            TraceFormat::NAMES,
            format!("{}, jsonl, csv", TraceFormat::COMPLETE_NAMES)
        );
        assert!(TraceFormat::from_name("jsonl").is_none());
    }

    #[test]
    fn format_from_path() {
        assert_eq!(
            TraceFormat::from_path(Path::new("a/b.CSV")),
            Some(TraceFormat::AzureCsv)
        );
        assert_eq!(
            TraceFormat::from_path(Path::new("t.jsonl")),
            Some(TraceFormat::MooncakeJsonl)
        );
        assert_eq!(TraceFormat::from_path(Path::new("t.txt")), None);
    }
}
