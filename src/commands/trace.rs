//! `routelab trace stats FILE`: rate, lengths and prefix reuse of a trace, in one streaming pass.

use anyhow::Context;
use routelab_sim::traffic::{BadRowPolicy, ReplayOptions, TraceFormat, TraceStats};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Print the statistics of one trace file.
pub fn stats(
    file: &Path,
    format: Option<&str>,
    limit: Option<u64>,
    skip_bad_rows: bool,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let format = match format {
        Some("azure") => TraceFormat::AzureCsv,
        Some("mooncake") => TraceFormat::MooncakeJsonl,
        Some(other) => anyhow::bail!("unknown trace format `{other}`; valid: azure, mooncake"),
        None => TraceFormat::from_path(file).with_context(|| {
            format!(
                "{}: cannot tell the format from the extension; pass --format azure or --format mooncake",
                file.display()
            )
        })?,
    };
    let options = ReplayOptions {
        limit,
        on_bad_row: if skip_bad_rows {
            BadRowPolicy::Skip
        } else {
            BadRowPolicy::Error
        },
        ..ReplayOptions::default()
    };
    let stats = TraceStats::of_trace(file, format, options)?;
    writeln!(out, "{}", file.display())?;
    write!(out, "{stats}")?;
    Ok(ExitCode::SUCCESS)
}
