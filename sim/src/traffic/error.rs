//! Errors of traffic generators and trace readers.

use std::path::PathBuf;

/// Everything that can go wrong while configuring a traffic source or reading a trace.
///
/// Row-level variants ([`TrafficError::is_row_error`]) name the file, the 1-based line, the
/// column / JSON field and what would have been valid; with
/// [`BadRowPolicy::Skip`](super::BadRowPolicy::Skip) they are counted and skipped instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrafficError {
    /// A generator configuration value is out of range.
    #[error("invalid {generator} configuration: `{field}` {problem}")]
    InvalidConfig {
        /// Generator (or option set) being configured, e.g. `Poisson`.
        generator: &'static str,
        /// Offending field.
        field: &'static str,
        /// What is wrong and what would be valid.
        problem: String,
    },
    /// The trace file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// Trace file.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The CSV header is missing or lacks a required column (never skippable).
    #[error("{path}:{line}: bad header: {problem}")]
    BadHeader {
        /// Trace file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// A row has a missing or invalid value.
    #[error("{path}:{line}: field `{field}`: {problem}")]
    BadRow {
        /// Trace file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// Column (CSV) or key (JSON) at fault.
        field: String,
        /// What is wrong and what would be valid.
        problem: String,
    },
    /// A JSON line is not a valid JSON object.
    #[error("{path}:{line}: invalid JSON ({detail}); expected {expected}")]
    BadJson {
        /// Trace file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// Parser message (includes the column within the line).
        detail: String,
        /// What a valid line looks like in this format.
        expected: String,
    },
    /// A row's timestamp is earlier than the previous accepted row's.
    #[error(
        "{path}:{line}: field `{field}`: timestamp `{value}` is {behind_s:.6} s earlier than the \
         previous row (line {prev_line}); timestamps must be non-decreasing (trace sorted by time)",
        behind_s = *.behind_ns as f64 / 1e9
    )]
    Unsorted {
        /// Trace file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// Timestamp column / key.
        field: &'static str,
        /// The offending timestamp as written.
        value: String,
        /// How far back it goes.
        behind_ns: u64,
        /// Line of the previous accepted row.
        prev_line: u64,
    },
    /// `hash_ids` does not have one entry per 512-token block of the prompt.
    #[error(
        "{path}:{line}: field `hash_ids`: has {found} entries, inconsistent with input_length \
         {input_length}: expected ceil({input_length}/512) = {expected} block ids"
    )]
    HashIdsLength {
        /// Trace file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// `input_length` of the row.
        input_length: u64,
        /// Number of ids present.
        found: usize,
        /// Number of ids expected.
        expected: u64,
    },
    /// A trace source has no request to replay (an empty file, a header without rows, every
    /// row skipped or left out): refused, so that a run never reports on no traffic.
    #[error("{path}: no requests to replay: {detail}; a trace source needs at least one valid row")]
    Empty {
        /// Trace file.
        path: PathBuf,
        /// What the file held instead.
        detail: String,
    },
    /// A [`Merge`](super::Merge) could not encode a source's tag.
    #[error(
        "tag {tag} of merged source #{source_index} is too large to encode among {sources} \
         sources; expected tags < u64::MAX / {sources}"
    )]
    TagOverflow {
        /// The inner tag.
        tag: u64,
        /// Index of the source within the merge.
        source_index: usize,
        /// Number of merged sources.
        sources: usize,
    },
}

impl TrafficError {
    /// Line `line` of `path` is not UTF-8: a bad header when it was to be the CSV header, else
    /// a bad row (skippable).
    pub(crate) fn not_utf8(
        path: &std::path::Path,
        line: u64,
        header: bool,
        e: std::str::Utf8Error,
    ) -> TrafficError {
        let problem = format!("line is not valid UTF-8 ({e}); expected a UTF-8 text row");
        let path = path.to_path_buf();
        if header {
            TrafficError::BadHeader {
                path,
                line,
                problem,
            }
        } else {
            TrafficError::BadRow {
                path,
                line,
                field: "<line>".to_owned(),
                problem,
            }
        }
    }

    /// True for errors about a single trace row (those [`BadRowPolicy::Skip`] skips).
    ///
    /// [`BadRowPolicy::Skip`]: super::BadRowPolicy::Skip
    #[must_use]
    pub const fn is_row_error(&self) -> bool {
        matches!(
            self,
            Self::BadRow { .. }
                | Self::BadJson { .. }
                | Self::Unsorted { .. }
                | Self::HashIdsLength { .. }
        )
    }

    /// The 1-based trace line this error is about, if any.
    #[must_use]
    pub const fn line(&self) -> Option<u64> {
        match self {
            Self::BadHeader { line, .. }
            | Self::BadRow { line, .. }
            | Self::BadJson { line, .. }
            | Self::Unsorted { line, .. }
            | Self::HashIdsLength { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// This error with its field found at `at` within the line (a span of an OpenTelemetry
    /// Collector export line: `resourceSpans[0].scopeSpans[0].spans[3]`).
    #[must_use]
    pub(crate) fn within_field(self, at: &str) -> Self {
        match self {
            Self::BadRow {
                path,
                line,
                field,
                problem,
            } => Self::BadRow {
                path,
                line,
                field: format!("{at}.{field}"),
                problem,
            },
            other => other,
        }
    }

    /// A JSON line serde could not parse, located at its column.
    pub(crate) fn bad_json(
        path: &std::path::Path,
        line: u64,
        e: &serde_json::Error,
        expected: String,
    ) -> Self {
        // serde_json's location names "line 1" of the single line it was given.
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map_or(msg.as_str(), |(m, _)| m);
        Self::BadJson {
            path: path.to_path_buf(),
            line,
            detail: format!("{msg} at column {}", e.column()),
            expected,
        }
    }

    pub(crate) fn config(
        generator: &'static str,
        field: &'static str,
        problem: impl Into<String>,
    ) -> Self {
        Self::InvalidConfig {
            generator,
            field,
            problem: problem.into(),
        }
    }
}
