//! The gateway's clock, the only place it reads time for the policy crate.
//!
//! [`Time`] is nanoseconds on a monotonic clock ([`Instant`]) whose epoch is the gateway's start
//! minus [`HISTORY`]. The offset lets a probe measurement made before a restart (persisted in
//! wall-clock Unix time) map back to a `Time` in the past, so the probe cache's TTL keeps
//! counting across restarts instead of restarting at zero.

use routelab_policies::Time;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How far back persisted timestamps can be represented (30 days, longer than any sane cache
/// TTL). Older ones map to `Time::ZERO`, i.e. "at least 30 days old".
pub const HISTORY: Duration = Duration::from_secs(30 * 24 * 3600);

/// Monotonic policy time plus the wall-clock anchor used to persist timestamps.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    start_unix_ms: i64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Clock {
            start: Instant::now(),
            start_unix_ms,
        }
    }

    /// The policy crate's "now".
    pub fn now(&self) -> Time {
        Time::from_nanos(0) + HISTORY + self.start.elapsed()
    }

    /// A policy time as Unix milliseconds (for the state file).
    pub fn to_unix_ms(&self, t: Time) -> i64 {
        let since_start_ms = (t.as_nanos() as i128 - HISTORY.as_nanos() as i128) / 1_000_000;
        self.start_unix_ms + since_start_ms as i64
    }

    /// Unix milliseconds back to a policy time (clamped to the representable past).
    pub fn from_unix_ms(&self, ms: i64) -> Time {
        let nanos =
            HISTORY.as_nanos() as i128 + (ms as i128 - self.start_unix_ms as i128) * 1_000_000;
        Time::from_nanos(nanos.clamp(0, u64::MAX as i128) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_round_trip() {
        let c = Clock::new();
        let t = c.now();
        let back = c.from_unix_ms(c.to_unix_ms(t));
        assert!(t.as_nanos().abs_diff(back.as_nanos()) < 2_000_000);
        // An hour before start is still representable.
        let hour_ago = c.from_unix_ms(c.to_unix_ms(t) - 3_600_000);
        assert!(t.saturating_since(hour_ago) >= Duration::from_secs(3599));
        assert_eq!(c.from_unix_ms(0), Time::ZERO);
    }
}
