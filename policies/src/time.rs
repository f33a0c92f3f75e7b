//! Time as the policy crate sees it: an integer count of nanoseconds since an epoch the host
//! chooses (simulation start, process start, the Unix epoch). The crate never reads a clock.

use crate::streams::{nanos_to_secs, secs_to_nanos};
use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in integer nanoseconds since a host-chosen epoch.
///
/// Integer time keeps simulations exact and reproducible: two events at "the same" time compare
/// equal on every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);

    /// A time `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// A time `secs` seconds after the epoch, rounded to the nearest nanosecond (negative or NaN
    /// clamp to zero, infinity to the last representable time).
    pub fn from_secs_f64(secs: f64) -> Time {
        Time(secs_to_nanos(secs))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        nanos_to_secs(self.0)
    }

    /// `nanos` nanoseconds later (saturating). Hosts that keep intervals as integer
    /// nanoseconds (the simulator's event loop) add them without a `Duration` round trip.
    #[inline]
    #[must_use]
    pub const fn plus_nanos(self, nanos: u64) -> Time {
        Time(self.0.saturating_add(nanos))
    }

    /// Nanoseconds elapsed since `earlier`; zero if `earlier` is later than `self`.
    #[inline]
    #[must_use]
    pub const fn nanos_since(self, earlier: Time) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Time elapsed since `earlier`; zero if `earlier` is later than `self`.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(
            self.0
                .saturating_add(u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_nanosecond_arithmetic_saturates() {
        let t = Time::from_nanos(10);
        assert_eq!(t.plus_nanos(5), Time::from_nanos(15));
        assert_eq!(
            Time::from_nanos(u64::MAX - 1).plus_nanos(5).as_nanos(),
            u64::MAX
        );
        assert_eq!(t.plus_nanos(5).nanos_since(t), 5);
        assert_eq!(
            t.nanos_since(t.plus_nanos(5)),
            0,
            "an earlier time is zero, not a wrap"
        );
    }
}
