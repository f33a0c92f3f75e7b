//! One-pass summary statistics of a trace (or of any traffic source).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::trace::{ReplayOptions, TraceFormat, TraceReplay};
use super::{Arrival, BLOCK_TOKENS, TrafficError, TrafficSource};

mod series;
mod sessions;

use series::SeriesAccumulator;
pub use series::{
    RateSeries, SERIES_MAX_FIXED_WINDOWS, SERIES_MAX_WINDOWS, SERIES_WINDOWS_S, SeriesWindow,
    WindowTooFine, sparkline,
};
use sessions::SessionAccumulator;
pub use sessions::{COUNTER_MAX_RESUMED, SESSION_MIN_JUDGED, SessionStats};

/// Exact summary of a token-length column.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LengthStats {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: u32,
    /// Median (nearest rank).
    pub p50: u32,
    /// 99th percentile (nearest rank).
    pub p99: u32,
    /// Largest value.
    pub max: u32,
}

/// Prefix-block reuse with an unbounded cache.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct PrefixReuse {
    /// Requests carrying prefix blocks.
    pub requests: u64,
    /// Block references over all requests.
    pub blocks_referenced: u64,
    /// Distinct block hashes.
    pub distinct_blocks: u64,
    /// References to a block hash seen in an earlier request (same whole prefix).
    pub reused_blocks: u64,
    /// `reused_blocks / blocks_referenced`.
    pub reuse_fraction: f64,
}

/// Summary of a trace, computed in one streaming pass.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TraceStats {
    /// Replayed rows (arrivals).
    pub rows: u64,
    /// Invalid rows skipped (with [`BadRowPolicy::Skip`](super::BadRowPolicy::Skip)).
    pub skipped_rows: u64,
    /// The first few skipped rows' errors ([`SKIPPED_EXAMPLES_SHOWN`] at most).
    pub skipped_examples: Vec<String>,
    /// Rows that are not requests, ignored and counted (e.g. OpenTelemetry spans of other kinds).
    pub ignored_rows: u64,
    /// What the ignored rows are.
    pub ignored_rows_are: Option<&'static str>,
    /// First arrival time, ns.
    pub first_at: u64,
    /// Last arrival time, ns.
    pub last_at: u64,
    /// `last_at - first_at`, ns.
    pub span_ns: u64,
    /// `rows / span` in requests per second (None when the span is 0).
    pub mean_rate_per_s: Option<f64>,
    /// Prompt tokens.
    pub prompt: LengthStats,
    /// Output tokens.
    pub output: LengthStats,
    /// Prefix reuse, when any arrival carried prefix blocks.
    pub prefix: Option<PrefixReuse>,
    /// The session ids, when the trace's mapping reads them (their prefix blocks, with
    /// `session_prefix: growing`, are assumed, not read from the log).
    pub sessions: Option<SessionStats>,
    /// Requests and tokens per window.
    pub series: RateSeries,
    /// What the replay doubted (units, growing session prefixes) and what the session ids
    /// look like.
    pub warnings: Vec<String>,
}

impl TraceStats {
    /// Drain `source`'s open-loop arrivals and summarise them. Memory: one counter per distinct
    /// length (exact quantiles) plus one `u64` per distinct prefix block.
    ///
    /// # Errors
    /// The first error of the source.
    pub fn from_source(source: &mut dyn TrafficSource) -> Result<Self, TrafficError> {
        let mut acc = Accumulator::new(None);
        while let Some(a) = source.next_arrival()? {
            acc.add(&a, None);
        }
        let mut stats = acc.finish().map_err(|e| too_fine("the source", e))?;
        stats.warnings.splice(0..0, source.warnings());
        Ok(stats)
    }

    /// Stream the trace at `path` once and summarise it; skipped rows are reported.
    ///
    /// # Errors
    /// As [`TraceReplay::open`] and [`TraceReplay::next_arrival`](TrafficSource::next_arrival).
    pub fn of_trace(
        path: impl AsRef<Path>,
        format: TraceFormat,
        options: ReplayOptions,
    ) -> Result<Self, TrafficError> {
        Self::of_trace_per_window(path, format, options, None)
    }

    /// [`Self::of_trace`] with the series' window (s, >= 1; `None`: one of
    /// [`SERIES_WINDOWS_S`] giving at most [`SERIES_MAX_WINDOWS`] windows). Session ids are
    /// judged here (a mapped log's rows carry them).
    ///
    /// # Errors
    /// As [`Self::of_trace`].
    pub fn of_trace_per_window(
        path: impl AsRef<Path>,
        format: TraceFormat,
        options: ReplayOptions,
        window_s: Option<u64>,
    ) -> Result<Self, TrafficError> {
        let ignored_rows_are = match &format {
            TraceFormat::Mapped(m) => m.ignored_rows_are(),
            _ => None,
        };
        let path = path.as_ref();
        let mut replay = TraceReplay::open(path, format, options)?;
        let mut acc = Accumulator::new(window_s);
        while let Some((a, session)) = replay.next_row()? {
            acc.add(&a, session);
        }
        let mut stats = acc
            .finish()
            .map_err(|e| too_fine(&path.display().to_string(), e))?;
        stats.warnings.splice(0..0, replay.warnings());
        stats.skipped_rows = replay.skipped_rows();
        stats.skipped_examples = replay
            .skipped_examples()
            .iter()
            .take(SKIPPED_EXAMPLES_SHOWN)
            .map(ToString::to_string)
            .collect();
        stats.ignored_rows = replay.ignored_rows();
        stats.ignored_rows_are = ignored_rows_are;
        Ok(stats)
    }
}

/// How many skipped rows' errors [`TraceStats`] keeps and prints.
pub const SKIPPED_EXAMPLES_SHOWN: usize = 3;

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rows          {} requests", self.rows)?;
        if self.skipped_rows > 0 {
            writeln!(f, "skipped rows  {} (invalid, skipped)", self.skipped_rows)?;
            for e in &self.skipped_examples {
                writeln!(f, "  e.g. {e}")?;
            }
        }
        if self.ignored_rows > 0 {
            writeln!(
                f,
                "ignored rows  {} ({})",
                self.ignored_rows,
                self.ignored_rows_are.unwrap_or("not requests")
            )?;
        }
        writeln!(f, "span          {:.3} s", self.span_ns as f64 / 1e9)?;
        match self.mean_rate_per_s {
            Some(r) => writeln!(f, "mean rate     {r:.3} req/s")?,
            None => writeln!(f, "mean rate     n/a (zero span)")?,
        }
        for (name, s) in [("prompt", &self.prompt), ("output", &self.output)] {
            writeln!(
                f,
                "{name:<13} mean {:.1} / min {} / p50 {} / p99 {} / max {} tokens",
                s.mean, s.min, s.p50, s.p99, s.max
            )?;
        }
        match &self.prefix {
            Some(p) => writeln!(
                f,
                "prefix reuse  {:.2} %{} ({} of {} block references; {} distinct blocks)",
                100.0 * p.reuse_fraction,
                if self.sessions.is_some() {
                    " assumed from the session ids, not read from the log"
                } else {
                    ""
                },
                p.reused_blocks,
                p.blocks_referenced,
                p.distinct_blocks
            ),
            None => writeln!(f, "prefix reuse  n/a (no prefix information)"),
        }?;
        if let Some(p) = self.prefix {
            writeln!(
                f,
                "prefix blocks {} requests carry them ({} tokens each)",
                p.requests, BLOCK_TOKENS
            )?;
        }
        if let Some(s) = &self.sessions {
            write_sessions(f, s)?;
        }
        write_series(f, &self.series)?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

/// The session lines: how the ids group the requests, and the prefix reuse they give split
/// into what `session_prefix: growing` assumes and what the prompt lengths allow.
fn write_sessions(f: &mut fmt::Formatter<'_>, s: &SessionStats) -> fmt::Result {
    writeln!(
        f,
        "sessions      {} ids over {} requests; {} follow-up requests, {} resume after another \
         session's request, {} resend their history (prompt >= the previous prompt + output tokens)",
        s.sessions, s.requests, s.follow_ups, s.resumed, s.resending
    )?;
    if s.blocks_referenced > 0 {
        let pct = |n: u64| 100.0 * n as f64 / s.blocks_referenced as f64;
        writeln!(
            f,
            "  their reuse {:.2} % assumed (`session_prefix: growing` gives a follow-up its \
             session's earlier blocks; the log has no prefix hashes), {:.2} % in follow-ups \
             that resend their history ({} and {} of {} block references)",
            pct(s.reused_blocks),
            pct(s.supported_reused_blocks),
            s.reused_blocks,
            s.supported_reused_blocks,
            s.blocks_referenced
        )?;
    }
    Ok(())
}

/// The series as two sparklines with their range; every window is in `--series`' CSV.
fn write_series(f: &mut fmt::Formatter<'_>, series: &RateSeries) -> fmt::Result {
    let w = series.window_s;
    if series.windows.is_empty() {
        return Ok(());
    }
    writeln!(
        f,
        "rate series   {} windows of {w} s from the first arrival (the last may be partial)",
        series.windows.len()
    )?;
    let rows: [(&str, &str, Vec<f64>); 2] = [
        (
            "requests",
            "req/s",
            series.windows.iter().map(|x| x.requests_per_s(w)).collect(),
        ),
        (
            "tokens",
            "tokens/s (prompt + output)",
            series.windows.iter().map(|x| x.tokens_per_s(w)).collect(),
        ),
    ];
    for (name, unit, v) in rows {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0_f64, f64::max);
        writeln!(
            f,
            "  {name:<11} {} min {min:.3} / max {max:.3} {unit}",
            sparkline(&v)
        )?;
    }
    Ok(())
}

struct Accumulator {
    rows: u64,
    first: Option<u64>,
    last: u64,
    prompt: Counts,
    output: Counts,
    seen: HashSet<u64>,
    prefix: PrefixReuse,
    sessions: SessionAccumulator,
    series: SeriesAccumulator,
}

impl Accumulator {
    fn new(window_s: Option<u64>) -> Self {
        Self {
            rows: 0,
            first: None,
            last: 0,
            prompt: Counts::default(),
            output: Counts::default(),
            seen: HashSet::new(),
            prefix: PrefixReuse::default(),
            sessions: SessionAccumulator::default(),
            series: SeriesAccumulator::new(window_s),
        }
    }

    /// `session`: the row's session key, when the trace's mapping reads a session id.
    fn add(&mut self, a: &Arrival, session: Option<u64>) {
        if let Some(key) = session {
            self.sessions.add(a, key);
        }
        self.series.add(a);
        self.rows += 1;
        self.first.get_or_insert(a.at);
        self.last = self.last.max(a.at);
        self.prompt.add(a.prompt_tokens);
        self.output.add(a.output_tokens);
        if !a.prefix_blocks.is_empty() {
            self.prefix.requests += 1;
            self.prefix.blocks_referenced += a.prefix_blocks.len() as u64;
            // Blocks already known before this request (a request's own blocks are distinct).
            let reused = a
                .prefix_blocks
                .iter()
                .filter(|h| self.seen.contains(h))
                .count();
            self.prefix.reused_blocks += reused as u64;
            self.seen.extend(a.prefix_blocks.iter().copied());
        }
    }

    fn finish(self) -> Result<TraceStats, WindowTooFine> {
        let first = self.first.unwrap_or(0);
        let span_ns = self.last - first;
        let sessions = self.sessions.finish();
        let series = self.series.finish(span_ns)?;
        let prefix = (self.prefix.requests > 0).then(|| PrefixReuse {
            distinct_blocks: self.seen.len() as u64,
            reuse_fraction: self.prefix.reused_blocks as f64 / self.prefix.blocks_referenced as f64,
            ..self.prefix
        });
        Ok(TraceStats {
            rows: self.rows,
            skipped_rows: 0,
            skipped_examples: Vec::new(),
            ignored_rows: 0,
            ignored_rows_are: None,
            first_at: first,
            last_at: self.last,
            span_ns,
            mean_rate_per_s: (span_ns > 0).then(|| self.rows as f64 / (span_ns as f64 / 1e9)),
            prompt: self.prompt.summary(),
            output: self.output.summary(),
            prefix,
            warnings: sessions.map(|s| s.warnings()).unwrap_or_default(),
            sessions,
            series,
        })
    }
}

/// Exact value → count table (bounded by the number of distinct lengths).
#[derive(Default)]
struct Counts {
    n: u64,
    sum: u128,
    table: BTreeMap<u32, u64>,
}

impl Counts {
    fn add(&mut self, v: u32) {
        self.n += 1;
        self.sum += u128::from(v);
        *self.table.entry(v).or_default() += 1;
    }

    /// Nearest-rank quantile: the smallest value with at least `ceil(q·n)` values ≤ it.
    fn quantile(&self, q: f64) -> u32 {
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n.max(1));
        let mut seen = 0;
        for (&v, &c) in &self.table {
            seen += c;
            if seen >= rank {
                return v;
            }
        }
        0
    }

    fn summary(&self) -> LengthStats {
        if self.n == 0 {
            return LengthStats::default();
        }
        LengthStats {
            mean: self.sum as f64 / self.n as f64,
            min: self.table.keys().next().copied().unwrap_or(0),
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            max: self.table.keys().next_back().copied().unwrap_or(0),
        }
    }
}

/// `--window` too fine for a trace's span, as a located configuration error.
fn too_fine(source: &str, e: WindowTooFine) -> TrafficError {
    TrafficError::InvalidConfig {
        generator: "trace stats",
        field: "--window",
        problem: format!(
            "{} s over {source}'s span of {} s would lay out {} windows; at most {} are kept: \
             give --window {} or more, or leave it out to have one picked",
            e.window_s,
            e.span_s,
            e.windows(),
            SERIES_MAX_FIXED_WINDOWS,
            e.finest_allowed_s()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_quantiles_are_nearest_rank() {
        let mut c = Counts::default();
        for v in 1..=100 {
            c.add(v);
        }
        assert_eq!(c.quantile(0.5), 50);
        assert_eq!(c.quantile(0.99), 99);
        assert_eq!(c.quantile(1.0), 100);
        assert_eq!(c.quantile(0.0), 1);
        let s = c.summary();
        assert!((s.mean - 50.5).abs() < 1e-12);
        assert_eq!((s.min, s.max), (1, 100));
    }

    #[test]
    fn reuse_counts_only_earlier_requests() {
        let mut acc = Accumulator::new(None);
        let mk = |at, blocks: &[u64]| Arrival {
            at,
            prompt_tokens: 1,
            output_tokens: 1,
            prefix_blocks: blocks.to_vec(),
            tag: 0,
        };
        acc.add(&mk(0, &[1, 2, 3]), None);
        acc.add(&mk(1_000_000_000, &[1, 2, 4]), None);
        acc.add(&mk(2_000_000_000, &[]), None);
        let s = acc.finish().unwrap();
        let p = s.prefix.unwrap();
        assert_eq!(
            (
                p.requests,
                p.blocks_referenced,
                p.reused_blocks,
                p.distinct_blocks
            ),
            (2, 6, 2, 4)
        );
        assert!((p.reuse_fraction - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.mean_rate_per_s, Some(1.5));
        assert!(s.to_string().contains("33.33 %"));
    }
}
