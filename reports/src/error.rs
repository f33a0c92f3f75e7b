//! The one error type of this crate: every variant names the file it failed on.

use std::path::PathBuf;

/// A report could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The output directory could not be created.
    #[error("{dir}: cannot create the output directory: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("{file}: cannot write: {source}")]
    Write {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// JSON serialisation failed.
    #[error("{file}: cannot serialise JSON: {source}")]
    Json {
        /// The file.
        file: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// CSV serialisation failed.
    #[error("{file}: cannot write CSV: {source}")]
    Csv {
        /// The file.
        file: PathBuf,
        /// Why.
        source: csv::Error,
    },
    /// A chart could not be drawn or encoded.
    #[error("{file}: cannot draw chart: {message}")]
    Chart {
        /// The file.
        file: PathBuf,
        /// What the drawing backend said.
        message: String,
    },
    /// The input cannot be reported (e.g. rows of a sweep with the wrong number of values).
    #[error("{file}: {message}")]
    Input {
        /// The file that was about to be written.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
}
