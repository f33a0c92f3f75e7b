//! `routelab trace stats FILE`: rate, lengths and prefix reuse of a trace, in one pass.
//!
//! FILE is a trace (`--format` azure, mooncake, gateway-log or otel-genai; azure / mooncake
//! are also told by the extension) or a scenario (`.yaml` / `.yml`), whose trace sources are
//! summarised as the scenario replays them — the way to read a log through a custom `jsonl` /
//! `csv` mapping.

use anyhow::Context;
use routelab_sim::Scenario;
use routelab_sim::traffic::{BadRowPolicy, ReplayOptions, TraceFormat, TraceStats};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Print the statistics of one trace file, or of every trace source of a scenario.
pub fn stats(
    file: &Path,
    format: Option<&str>,
    limit: Option<u64>,
    skip_bad_rows: bool,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let overrides = |options: &ReplayOptions| ReplayOptions {
        limit: limit.or(options.limit),
        on_bad_row: if skip_bad_rows {
            BadRowPolicy::Skip
        } else {
            options.on_bad_row
        },
        ..options.clone()
    };
    if is_scenario(file) {
        if let Some(f) = format {
            anyhow::bail!(
                "--format {f} applies to a trace file; {} is a scenario, whose trace sources \
                 name their own format and mapping",
                file.display()
            );
        }
        return scenario_stats(file, &overrides, out);
    }
    let format = match format {
        Some(name @ ("jsonl" | "csv")) => anyhow::bail!(
            "--format {name} needs a mapping (which key or column holds the arrival time and \
             the lengths): write it in a scenario's trace source (`format: {name}`, `mapping: \
             {{ arrival: ..., prompt_tokens: ..., output_tokens: ... }}`, see docs/traces.md) and \
             run `routelab trace stats SCENARIO.yaml`"
        ),
        Some(name) => TraceFormat::from_name(name).with_context(|| {
            format!(
                "unknown trace format `{name}`; valid: {}",
                TraceFormat::COMPLETE_NAMES
            )
        })?,
        None => TraceFormat::from_path(file).with_context(|| {
            format!(
                "{}: cannot tell the format from the extension; pass --format (one of {})",
                file.display(),
                TraceFormat::COMPLETE_NAMES
            )
        })?,
    };
    let stats = TraceStats::of_trace(file, format, overrides(&ReplayOptions::default()))?;
    writeln!(out, "{}", file.display())?;
    write!(out, "{stats}")?;
    Ok(ExitCode::SUCCESS)
}

fn is_scenario(file: &Path) -> bool {
    file.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

fn scenario_stats(
    file: &Path,
    overrides: &dyn Fn(&ReplayOptions) -> ReplayOptions,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let scenario = Scenario::load(file)?;
    let mut traces = 0;
    for (i, path, format, options) in scenario.trace_sources() {
        if traces > 0 {
            writeln!(out)?;
        }
        traces += 1;
        let stats = TraceStats::of_trace(path, format.clone(), overrides(options))?;
        writeln!(out, "traffic[{i}]: {} ({})", path.display(), format.name())?;
        write!(out, "{stats}")?;
    }
    if traces == 0 {
        anyhow::bail!(
            "{}: the scenario has no trace source; give a trace file or a scenario with a \
             `trace:` traffic source",
            file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
