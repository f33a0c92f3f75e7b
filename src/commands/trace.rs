//! `routelab trace stats FILE`: rate, lengths and prefix reuse of a trace, in one pass.
//!
//! FILE is a trace (`--format` azure, mooncake, gateway-log or otel-genai; azure / mooncake
//! are also told by the extension) or a scenario (`.yaml` / `.yml`), whose trace sources are
//! summarised as the scenario replays them — the way to read a log through a custom `jsonl` /
//! `csv` mapping.
//!
//! Besides the totals it prints the rate over time (requests and tokens per second per window,
//! as sparklines; `--series FILE.csv` writes every window) and what the replay doubted: the
//! arrival unit, a growing session prefix the prompts do not bear out, session ids that look
//! like a counter or unique per request.

use anyhow::Context;
use routelab_sim::Scenario;
use routelab_sim::traffic::{BadRowPolicy, ReplayOptions, TraceFormat, TraceStats};
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// `trace stats`' options beside the file.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatsOptions<'a> {
    /// `--format` (a trace file only).
    pub format: Option<&'a str>,
    /// `--limit`: at most this many rows.
    pub limit: Option<u64>,
    /// `--skip-bad-rows`.
    pub skip_bad_rows: bool,
    /// `--window`: the rate series' window, s (`None`: picked).
    pub window_s: Option<u64>,
    /// `--series`: the CSV to write every window to.
    pub series: Option<&'a Path>,
}

/// Print the statistics of one trace file, or of every trace source of a scenario.
pub fn stats(
    file: &Path,
    opts: &StatsOptions<'_>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let StatsOptions {
        format,
        limit,
        skip_bad_rows,
        window_s,
        series,
    } = *opts;
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
        return scenario_stats(file, &overrides, window_s, series, out);
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
    let stats = TraceStats::of_trace_per_window(
        file,
        format,
        overrides(&ReplayOptions::default()),
        window_s,
    )?;
    writeln!(out, "{}", file.display())?;
    write!(out, "{stats}")?;
    if let Some(path) = series {
        write_series(path, &[(file.display().to_string(), &stats)], out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The CSV of every window of each trace's series (one `source` column names the trace).
fn write_series(
    path: &Path,
    traces: &[(String, &TraceStats)],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut csv = String::from(
        "source,window_start_s,window_s,requests,prompt_tokens,output_tokens,requests_per_s,tokens_per_s\n",
    );
    for (source, stats) in traces {
        let w = stats.series.window_s;
        for x in &stats.series.windows {
            writeln!(
                csv,
                "{},{},{w},{},{},{},{:.6},{:.6}",
                csv_field(source),
                x.start_s,
                x.requests,
                x.prompt_tokens,
                x.output_tokens,
                x.requests_per_s(w),
                x.tokens_per_s(w)
            )?;
        }
    }
    std::fs::write(path, csv).with_context(|| format!("writing --series {}", path.display()))?;
    writeln!(out, "series        written to {}", path.display())?;
    Ok(())
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn is_scenario(file: &Path) -> bool {
    file.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

fn scenario_stats(
    file: &Path,
    overrides: &dyn Fn(&ReplayOptions) -> ReplayOptions,
    window_s: Option<u64>,
    series: Option<&Path>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let scenario = Scenario::load(file)?;
    let mut traces = Vec::new();
    for (i, path, format, options) in scenario.trace_sources() {
        if !traces.is_empty() {
            writeln!(out)?;
        }
        let stats =
            TraceStats::of_trace_per_window(path, format.clone(), overrides(options), window_s)?;
        writeln!(out, "traffic[{i}]: {} ({})", path.display(), format.name())?;
        write!(out, "{stats}")?;
        traces.push((format!("traffic[{i}]"), stats));
    }
    if let Some(path) = series
        && !traces.is_empty()
    {
        let refs: Vec<(String, &TraceStats)> =
            traces.iter().map(|(name, s)| (name.clone(), s)).collect();
        write_series(path, &refs, out)?;
    }
    if traces.is_empty() {
        anyhow::bail!(
            "{}: the scenario has no trace source; give a trace file or a scenario with a \
             `trace:` traffic source",
            file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
