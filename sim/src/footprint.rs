//! What a scenario would hold in memory, estimated before it runs, so that a source the machine
//! cannot hold is refused with the figure instead of taking all the memory it can.
//!
//! The simulator streams arrivals (one is read ahead), so memory grows only with the requests
//! *waiting* at the gateway: a source that sends faster than the fleet can serve keeps the
//! difference waiting, each in a request slot ([`BYTES_PER_WAITING_REQUEST`]). The estimate
//! takes the open-loop sources' requests and span from their parameters and the fleet's most
//! optimistic service rate — every worker at its profile's peak aggregate decode rate (at its
//! `max_running`), each request costing only its mean output tokens — so a refusal never hits a
//! scenario the fleet could keep up with. Traces read whole (mapped logs, resamples, held-out
//! parts) are checked when they are read, against their file size
//! ([`check_trace_fits`]).

use std::path::Path;

use crate::event_loop::WorkerSetup;
use crate::traffic::{TrafficError, Until};

/// What one waiting request costs the simulator, bytes: its slot, its place in the gateway's
/// queue and its event, measured as the growth of the peak resident set (`VmHWM`) of a release
/// build per request left waiting by an overloaded `poisson` run without prefix hashes: 176 B
/// with 500,000 waiting, 150-190 B with 2,000,000. The lower figure keeps the estimate from
/// refusing what would fit; prefix hashes add 8 B each on top, not counted.
pub const BYTES_PER_WAITING_REQUEST: u64 = 176;

/// What a trace row read whole costs, bytes, besides its prefix hashes (8 B each): the
/// arrival, its session key and the sorted copy a resample builds.
pub const BYTES_PER_LOADED_ROW: u64 = 160;

/// The memory this process may use, bytes: the smallest of the machine's `MemTotal` and the
/// cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`); `None` where none can be
/// read (the check is then skipped).
#[must_use]
pub fn memory_limit_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let cgroup = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    [
        meminfo,
        cgroup("/sys/fs/cgroup/memory.max"),
        cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Bytes as `1.4 TB`, `512 MB`.
#[must_use]
pub fn fmt_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One open-loop source's load: requests, the span they arrive over (s) and their mean output
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceLoad {
    /// Requests it sends.
    pub requests: f64,
    /// Seconds they arrive over (0: at once).
    pub span_s: f64,
    /// Mean output tokens per request.
    pub output_mean: f64,
}

impl SourceLoad {
    /// A source sending at `rate_per_s` until `until`.
    #[must_use]
    pub fn rated(rate_per_s: f64, until: &Until, output_mean: f64) -> SourceLoad {
        let by_time = until.duration.map(|d| rate_per_s * d as f64 / 1e9);
        let requests = match (by_time, until.count) {
            (Some(t), Some(c)) => t.min(c as f64),
            (Some(t), None) => t,
            (None, Some(c)) => c as f64,
            (None, None) => 0.0,
        };
        SourceLoad {
            requests,
            span_s: if rate_per_s > 0.0 {
                requests / rate_per_s
            } else {
                0.0
            },
            output_mean,
        }
    }
}

/// The fleet's most optimistic service rate for requests of `output_mean` tokens, requests per
/// second: every worker at its profile's peak aggregate decode rate.
#[must_use]
pub fn fleet_requests_per_s(workers: &[WorkerSetup], output_mean: f64) -> f64 {
    let tok_s: f64 = workers
        .iter()
        .map(|w| {
            let n = w.overrides.max_running.unwrap_or(w.profile.max_running());
            w.profile.aggregate_tok_s(f64::from(n)) * w.overrides.speed_factor
        })
        .sum();
    tok_s / output_mean.max(1.0)
}

/// Why the traffic would not fit: `None` when it would (or the limit is unknown).
#[must_use]
pub fn waiting_overflow(
    loads: &[SourceLoad],
    workers: &[WorkerSetup],
    limit_bytes: Option<u64>,
) -> Option<String> {
    let limit = limit_bytes? as f64;
    let requests: f64 = loads.iter().map(|l| l.requests).sum();
    if requests <= 0.0 {
        return None;
    }
    let span_s = loads.iter().map(|l| l.span_s).fold(0.0, f64::max);
    let output_mean = loads
        .iter()
        .map(|l| l.requests * l.output_mean)
        .sum::<f64>()
        / requests;
    let served = fleet_requests_per_s(workers, output_mean);
    let waiting = (requests - served * span_s).max(0.0);
    let bytes = waiting * BYTES_PER_WAITING_REQUEST as f64;
    (bytes > limit).then(|| {
        format!(
            "would keep about {waiting:.3e} requests waiting at the gateway: its open-loop \
             sources send {requests:.3e} requests over {span_s:.0} s ({:.3e} req/s) and the \
             fleet serves at most {served:.1} req/s (every worker at its profile's peak decode \
             rate, {output_mean:.0} output tokens a request), which at {BYTES_PER_WAITING_REQUEST} \
             B a waiting request is {} of memory; this machine allows {}",
            if span_s > 0.0 {
                requests / span_s
            } else {
                f64::INFINITY
            },
            fmt_bytes(bytes),
            fmt_bytes(limit)
        )
    })
}

/// Refuse to read a trace whole when its rows would not fit in memory: the rows estimated from
/// the file's size and its first 64 KiB (bytes per line, prefix hashes per line), each
/// [`BYTES_PER_LOADED_ROW`] plus 8 B per hash, against [`memory_limit_bytes`].
///
/// # Errors
/// [`TrafficError::InvalidConfig`] with the estimate.
pub fn check_trace_fits(path: &Path, limit_rows: Option<u64>) -> Result<(), TrafficError> {
    let Some(limit) = memory_limit_bytes() else {
        return Ok(());
    };
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // opening it reports the error
    };
    let size = meta.len();
    let mut head = vec![0u8; 64 * 1024];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let head = &head[..n];
    let lines = head.iter().filter(|&&b| b == b'\n').count().max(1) as f64;
    let bytes_per_line = (n as f64 / lines).max(1.0);
    // Hashes: the commas of a line's lists, roughly one per hash (none for lists-free rows).
    let commas = head.iter().filter(|&&b| b == b',').count() as f64 / lines;
    let mut rows = size as f64 / bytes_per_line;
    if let Some(l) = limit_rows {
        rows = rows.min(l as f64);
    }
    let bytes = rows * (BYTES_PER_LOADED_ROW as f64 + 8.0 * commas);
    if bytes > limit as f64 {
        return Err(TrafficError::config(
            "trace",
            "path",
            format!(
                "{}: reading it whole (a mapped log, a resample or a held-out part) would hold \
                 about {rows:.3e} rows, {} of memory ({} bytes in the file, {bytes_per_line:.0} \
                 bytes a line); this machine allows {}: set `limit`, or replay it as recorded \
                 (`resample: none`, an `azure` or `mooncake` trace streams)",
                path.display(),
                fmt_bytes(bytes),
                size,
                fmt_bytes(limit as f64)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_their_unit() {
        assert_eq!(fmt_bytes(512.0), "512 B");
        assert_eq!(fmt_bytes(1.4e12), "1.4 TB");
        assert_eq!(fmt_bytes(23.4e9), "23.4 GB");
    }

    #[test]
    fn a_rated_source_sends_until_its_first_stop() {
        let until = Until {
            duration: Some(3_600_000_000_000),
            count: Some(1_000),
        };
        let l = SourceLoad::rated(10.0, &until, 200.0);
        assert_eq!((l.requests, l.span_s), (1_000.0, 100.0));
        let l = SourceLoad::rated(
            1e6,
            &Until {
                duration: Some(3_600_000_000_000),
                count: None,
            },
            200.0,
        );
        assert_eq!((l.requests, l.span_s), (3.6e9, 3600.0));
    }
}
