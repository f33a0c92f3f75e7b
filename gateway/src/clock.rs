//! The gateway's clock, the only place it reads time for the policy crate.
//!
//! [`Time`] is nanoseconds on a monotonic clock ([`Instant`]) whose epoch is the gateway's start
//! minus [`HISTORY`]. The offset lets a probe measurement made before a restart (persisted in
//! wall-clock Unix time) map back to a `Time` in the past, so the probe cache's TTL keeps
//! counting across restarts instead of restarting at zero.
//!
//! **Scale** (`clock_scale`, tests and emulations only): policy time runs `scale` times faster
//! than wall time, so that an emulation at `--speedup K` behind a gateway at scale K sees the
//! probe cache expire, idle workers re-probed and the live correction run at the emulated
//! pace. Persisted timestamps stay real wall-clock times: a policy time maps to the wall
//! instant at which the clock showed it, so a state file written at any scale holds no
//! future timestamps, and a measurement made W wall seconds before start is `scale × W`
//! policy seconds old.

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
    /// Policy seconds per wall second (validated finite and > 0 by the configuration).
    scale: f64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now, running at wall speed.
    pub fn new() -> Clock {
        Clock::scaled(1.0)
    }

    /// A clock starting now whose policy time runs `scale` times faster than wall time
    /// (`scale` finite and > 0; anything else is taken as 1).
    pub fn scaled(scale: f64) -> Clock {
        let scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Clock {
            start: Instant::now(),
            start_unix_ms,
            scale,
        }
    }

    /// Policy seconds per wall second.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The policy crate's "now".
    pub fn now(&self) -> Time {
        Time::from_nanos(0) + HISTORY + self.to_policy(self.start.elapsed())
    }

    /// A wall-time span as the policy-time span it stands for (e.g. a probe burst's duration,
    /// so that its throughput is in policy time).
    pub fn to_policy(&self, wall: Duration) -> Duration {
        if self.scale == 1.0 {
            return wall;
        }
        // Saturates rather than panics; `Time + Duration` saturates too.
        Duration::try_from_secs_f64(wall.as_secs_f64() * self.scale).unwrap_or(Duration::MAX)
    }

    /// A policy-time span as the wall-time span that shows it (e.g. how often to poll for
    /// probe orders).
    pub fn to_wall(&self, policy: Duration) -> Duration {
        if self.scale == 1.0 {
            return policy;
        }
        Duration::try_from_secs_f64(policy.as_secs_f64() / self.scale).unwrap_or(Duration::MAX)
    }

    /// A policy time as Unix milliseconds (for the state file): the wall instant at which the
    /// clock showed it.
    pub fn to_unix_ms(&self, t: Time) -> i64 {
        let since_start_ns = t.as_nanos() as i128 - HISTORY.as_nanos() as i128;
        let wall_ms = if self.scale == 1.0 {
            since_start_ns / 1_000_000
        } else {
            (since_start_ns as f64 / self.scale / 1e6) as i128
        };
        (self.start_unix_ms as i128 + wall_ms).clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// Unix milliseconds back to a policy time (clamped to the representable past).
    pub fn from_unix_ms(&self, ms: i64) -> Time {
        let wall_ms = ms as i128 - self.start_unix_ms as i128;
        let since_start_ns = if self.scale == 1.0 {
            wall_ms * 1_000_000
        } else {
            // `as` saturates a float out of range.
            (wall_ms as f64 * 1e6 * self.scale) as i128
        };
        let nanos = HISTORY.as_nanos() as i128 + since_start_ns;
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

    #[test]
    fn a_scaled_clock_runs_faster_and_persists_wall_times() {
        let c = Clock::scaled(100.0);
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(50));
        let t1 = c.now();
        // 50 ms of wall time are 5 s of policy time (give the sleep some slack).
        let policy = t1.saturating_since(t0);
        assert!(
            policy >= Duration::from_secs(5) && policy < Duration::from_secs(60),
            "{policy:?}"
        );
        // Persisted as wall time: the round trip holds, and 50 ms of wall time apart.
        let (ms0, ms1) = (c.to_unix_ms(t0), c.to_unix_ms(t1));
        assert!((40..1000).contains(&(ms1 - ms0)), "{}", ms1 - ms0);
        let back = c.from_unix_ms(ms1);
        // One wall millisecond of rounding is 100 policy milliseconds.
        assert!(t1.as_nanos().abs_diff(back.as_nanos()) <= 200_000_000);
        // Never a timestamp in the future of the wall clock.
        let wall_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(ms1 <= wall_now + 5, "{ms1} > {wall_now}");
        // A measurement made a wall second before start is 100 policy seconds old.
        let before = c.from_unix_ms(c.to_unix_ms(t0) - 1000);
        let age = t0.saturating_since(before);
        assert!(
            age.as_secs_f64() > 99.0 && age.as_secs_f64() < 101.0,
            "{age:?}"
        );
        assert_eq!(c.to_wall(Duration::from_secs(1)), Duration::from_millis(10));
        assert_eq!(
            c.to_policy(Duration::from_millis(10)),
            Duration::from_secs(1)
        );
    }
}
