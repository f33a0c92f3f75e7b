//! The `engine_metrics` block and the polling settings resolved from it.

use routelab_policies::InputError;
use serde::Deserialize;
use std::time::Duration;

/// The `engine_metrics` block.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetricsConfig {
    /// When to poll: `auto` (when the policy reads engine reports), `on`, `off`.
    pub poll: PollMode,
    /// Seconds of policy time between polls; none: the policy's own interval (the simulator's
    /// 10 s for `least-load`), else 10.
    pub interval_s: Option<f64>,
    /// Timeout of one poll, wall seconds.
    pub timeout_s: f64,
    /// A report older than this (policy seconds) ages out; none: three intervals.
    pub stale_after_s: Option<f64>,
    /// The path appended to a worker's base URL.
    pub path: String,
}

/// When to poll the engines' metrics.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// When the policy reads engine reports.
    Auto,
    /// Always (the admin page shows the figures).
    On,
    /// Never (a policy that reads reports falls back to the gateway's own counts).
    Off,
}

impl Default for EngineMetricsConfig {
    fn default() -> Self {
        EngineMetricsConfig {
            poll: PollMode::Auto,
            interval_s: None,
            timeout_s: 2.0,
            stale_after_s: None,
            path: "/metrics".into(),
        }
    }
}

/// The default engine poll interval when the policy names none (the simulator's).
pub const DEFAULT_POLL_S: f64 = 10.0;

/// Validated polling settings.
#[derive(Debug, Clone)]
pub(crate) struct PollSettings {
    pub enabled: bool,
    pub interval_s: f64,
    pub timeout: Duration,
    pub stale_after_s: f64,
    pub path: String,
}

impl EngineMetricsConfig {
    /// Check the numbers and path; the error, about `file`, names the field and what is valid.
    pub fn validate(&self, file: &str) -> Result<(), InputError> {
        let secs = |f: &str, v: f64| {
            if v.is_finite() && (0.001..=86_400.0).contains(&v) {
                Ok(())
            } else {
                Err(InputError::new(
                    file,
                    format!("engine_metrics.{f}"),
                    format!("{v} is out of range"),
                )
                .valid("a number of seconds from 0.001 to 86400"))
            }
        };
        if let Some(v) = self.interval_s {
            secs("interval_s", v)?;
        }
        secs("timeout_s", self.timeout_s)?;
        if let Some(v) = self.stale_after_s {
            secs("stale_after_s", v)?;
        }
        // The rule every path the gateway requests from a worker follows (`health.path` too).
        if let Err(reason) = crate::upstream::check_path(&self.path) {
            return Err(InputError::new(
                file,
                "engine_metrics.path",
                format!("`{}` {reason}", self.path),
            )
            .valid("a path such as /metrics"));
        }
        Ok(())
    }

    pub(crate) fn settings(&self, policy_interval: Option<Duration>) -> PollSettings {
        let interval_s = self
            .interval_s
            .or(policy_interval.map(|d| d.as_secs_f64()))
            .unwrap_or(DEFAULT_POLL_S);
        PollSettings {
            enabled: match self.poll {
                PollMode::Auto => policy_interval.is_some(),
                PollMode::On => true,
                PollMode::Off => false,
            },
            interval_s,
            timeout: Duration::from_secs_f64(self.timeout_s),
            stale_after_s: self.stale_after_s.unwrap_or(3.0 * interval_s),
            path: self.path.clone(),
        }
    }
}
