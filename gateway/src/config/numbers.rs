//! What every numeric field of the configuration accepts: one table ([`number_rule`]) for the
//! check at load and for the words added to a parser's type error, and the bounds it names.

use super::worker::MAX_CACHE_TOKENS;
use routelab_policies::located::rule;
use routelab_policies::{InputError, PREFIX_BLOCK_TOKENS};
use std::time::Duration;

/// Largest `max_body_bytes` and `upstream.max_response_bytes`: a body is held in memory while
/// it is routed or relayed.
pub const MAX_BODY_BYTES: u64 = 1 << 30;
/// The default `max_buffered_body_bytes` (when `max_body_bytes` is not larger): 32 bodies of
/// the default 4 MiB at once, a bound well under the gateway's RSS target of 200 MB.
pub const DEFAULT_BUFFERED_BODY_BYTES: u64 = 128 << 20;
/// Largest `max_buffered_body_bytes` (1 TiB).
pub const MAX_BUFFERED_BODY_BYTES: u64 = 1 << 40;
/// Largest `retries` (more than any fleet has workers to try).
pub const MAX_RETRIES: u64 = 100;
/// Largest `upstream.max_idle_per_worker` (more than a host has ports).
pub const MAX_IDLE_PER_WORKER: u64 = 65_536;
/// Largest `server.max_connections`.
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// Largest `request_log.max_bytes` (1 TiB).
pub const MAX_LOG_BYTES: u64 = 1 << 40;
/// Largest `request_log.keep`.
pub const MAX_LOG_KEEP: u64 = 1000;
/// Bounds of `clock_scale`: beyond them a wall-time period standing for policy time (the probe
/// poll) would be absurdly long or shorter than a timer tick.
pub const CLOCK_SCALE_RANGE: (f64, f64) = (1e-3, 1e3);

/// What a numeric field of the configuration accepts. One table ([`number_rule`]) serves both
/// the check at load ([`GatewayConfig::validate`]) and the words added to a parser's type error
/// ("invalid u32" at `retries: -1` does not say what is valid).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum NumberRule {
    /// A whole number in `min..=max`.
    Whole(u64, u64),
    /// Seconds from 0: 0 has a meaning (do not wait in the queue).
    Seconds,
    /// A timeout or timer period: 0 would fail every request or close every connection, and a
    /// timer loop needs a period it can keep (a probe poll of 1e-12 s panicked the probe task).
    Period,
    /// 0 (off) or a period.
    OffOrPeriod,
    /// The clock scale, within [`CLOCK_SCALE_RANGE`].
    Scale,
    /// A percentage, 0 to 100.
    Percent,
}

impl NumberRule {
    pub(super) fn check(self, x: f64) -> Result<(), rule::Violation> {
        match self {
            NumberRule::Whole(min, max) => rule::whole(x, min, max).map(drop),
            NumberRule::Seconds => rule::seconds(x).map(drop),
            NumberRule::Period => rule::period(x).map(drop),
            NumberRule::OffOrPeriod if x == 0.0 => Ok(()),
            NumberRule::OffOrPeriod => rule::period(x)
                .map(drop)
                .map_err(|v| rule::Violation::new(x, format!("0 (off) or {}", v.expected))),
            NumberRule::Percent if x.is_finite() && (0.0..=100.0).contains(&x) => Ok(()),
            NumberRule::Percent => Err(rule::Violation::new(x, "a percentage from 0 to 100")),
            NumberRule::Scale => {
                let (min, max) = CLOCK_SCALE_RANGE;
                if x.is_finite() && (min..=max).contains(&x) {
                    Ok(())
                } else {
                    Err(rule::Violation::new(
                        x,
                        format!("a finite number from {min} to {max} (1 in production)"),
                    ))
                }
            }
        }
    }

    /// What the rule accepts, in the rules' own words (every rule refuses NaN).
    pub(super) fn describe(self) -> String {
        self.check(f64::NAN)
            .err()
            .map(|v| v.expected)
            .unwrap_or_default()
    }
}

/// The rule of each numeric field.
pub(super) fn number_rule(field: &str) -> Option<NumberRule> {
    use NumberRule::*;
    Some(match field {
        "seed" => Whole(0, u64::MAX),
        "max_body_bytes" | "upstream.max_response_bytes" => Whole(1, MAX_BODY_BYTES),
        "retries" => Whole(0, MAX_RETRIES),
        "max_buffered_body_bytes" => Whole(1, MAX_BUFFERED_BODY_BYTES),
        "upstream.max_idle_per_worker" => Whole(0, MAX_IDLE_PER_WORKER),
        "server.max_connections" => Whole(1, MAX_CONNECTIONS),
        "health.unhealthy_after" | "health.healthy_after" => Whole(1, u32::MAX.into()),
        "request_log.max_bytes" => Whole(1, MAX_LOG_BYTES),
        "request_log.keep" => Whole(0, MAX_LOG_KEEP),
        "queue_timeout_s" | "capacity.min_observed_s" => Seconds,
        "health.interval_s" => OffOrPeriod,
        "upstream.connect_timeout_s"
        | "upstream.response_timeout_s"
        | "upstream.stream_idle_timeout_s"
        | "health.timeout_s"
        | "probe.poll_interval_s"
        | "probe.request_timeout_s"
        | "probe.budget_s"
        | "server.header_read_timeout_s"
        | "server.body_read_timeout_s"
        | "server.drain_timeout_s" => Period,
        "health.max_ejection_percent" | "health.panic_threshold_percent" => Percent,
        "clock_scale" => Scale,
        "slo.ttft_s" | "slo.tpot_s" => Period,
        f if f.starts_with("workers[") && f.ends_with("].context_window") => {
            Whole(1, u32::MAX.into())
        }
        f if f.starts_with("workers[") && f.ends_with("].cache_tokens") => {
            Whole(PREFIX_BLOCK_TOKENS.into(), MAX_CACHE_TOKENS)
        }
        _ => return None,
    })
}

/// A parser error about a numeric field, with what the field accepts.
pub(super) fn with_valid_number(e: InputError) -> InputError {
    if e.valid.is_some() || e.message.contains("expected") {
        return e;
    }
    match number_rule(&e.field) {
        Some(rule) => e.valid(rule.describe()),
        None => e,
    }
}

/// Seconds (validated finite and ≥ 0) as a duration; `file` and `field` locate an error.
pub(crate) fn secs(file: &str, field: &str, v: f64) -> Result<Duration, InputError> {
    // Bounded as well as non-negative: `Duration::from_secs_f64(1e20)` panics.
    rule::seconds(v).map_err(|e| e.at_field(file, field))
}
