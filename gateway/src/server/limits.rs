//! What every listener is held to: its limits (`server.*`) and the connection counters the
//! accept loop keeps, read by the metrics and the admin page.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The limits every listener applies (from `server.*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: u32,
    /// How long connections may finish their requests after a shutdown began.
    pub drain_timeout: Duration,
}

/// The default `server.max_connections`: 4,096 (well above what one gateway in front of a few
/// dozen engines serves at once), or less where the process's soft open-file limit would run
/// out first. Each client request also holds a descriptor to its worker, and the process needs
/// a few of its own, so the cap is half of what the limit leaves after a reserve: with
/// `ulimit -n 512`, 224. Where the limit cannot be read (not Linux), 4,096.
pub(crate) fn default_max_connections() -> u32 {
    let limits = std::fs::read_to_string("/proc/self/limits").ok();
    max_connections_for(limits.as_deref().and_then(soft_open_files_limit))
}

/// Descriptors kept for the process itself (listeners, state file, logs, the runtime).
const RESERVED_DESCRIPTORS: u64 = 64;
/// The cap when the open-file limit allows it (or is unknown).
const DEFAULT_MAX_CONNECTIONS: u32 = 4096;

fn max_connections_for(open_files: Option<u64>) -> u32 {
    match open_files {
        None => DEFAULT_MAX_CONNECTIONS,
        Some(n) => {
            let fit = n.saturating_sub(RESERVED_DESCRIPTORS) / 2;
            fit.clamp(1, u64::from(DEFAULT_MAX_CONNECTIONS)) as u32
        }
    }
}

/// The soft "Max open files" of `/proc/self/limits` (`None`: absent or unlimited).
fn soft_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Connection counters of all listeners.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Client connections open now.
    pub open: AtomicU64,
    /// Connections answered 503 because a listener was at `server.max_connections`.
    pub rejected: AtomicU64,
    /// Unix second of the last rejection log line (they are logged at most once a second).
    pub(super) last_rejection_log_s: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_room_in_the_open_file_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95000                95000                processes \n\
                      Max open files            512                  524288               files     \n";
        assert_eq!(soft_open_files_limit(limits), Some(512));
        // Regression: with `ulimit -n 512`, 600 silent connections exhausted the descriptors
        // while the cap (4,096) was never reached.
        assert_eq!(max_connections_for(Some(512)), 224);
        assert_eq!(max_connections_for(Some(1_048_576)), 4096);
        assert_eq!(max_connections_for(Some(10)), 1);
        assert_eq!(max_connections_for(None), 4096);
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files_limit(unlimited), None);
        assert_eq!(soft_open_files_limit("nothing here"), None);
        // On this machine the default is derived from the real limit and stays in range.
        assert!((1..=4096).contains(&default_max_connections()));
    }
}
