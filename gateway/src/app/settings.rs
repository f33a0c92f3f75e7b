//! The configuration resolved into what the running gateway reads (durations checked and
//! converted, defaults applied), once at start.

use crate::config::{GatewayConfig, HealthConfig, secs};
use routelab_policies::InputError;
use std::path::PathBuf;
use std::time::Duration;

/// Settings resolved from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub max_body: usize,
    /// `max_buffered_body_bytes`, defaulted.
    pub max_buffered_bodies: usize,
    pub queue_timeout: Duration,
    pub retries: u32,
    pub response_timeout: Duration,
    /// `upstream.stream_idle_timeout_s`, defaulted to the response timeout.
    pub stream_idle_timeout: Duration,
    pub health: HealthConfig,
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub probe_poll: Duration,
    pub probe_timeout: Duration,
    /// `probe.budget_s`, policy time.
    pub probe_budget: Duration,
    pub state_file: Option<PathBuf>,
    pub admin_token: Option<crate::config::Secret>,
    /// The client-facing server's limits (`server.*`).
    pub server: crate::server::limits::Limits,
    /// `capacity.min_observed_s`, policy time.
    pub min_observed: Duration,
    /// The engines' metrics poll (`engine_metrics`).
    pub engine_poll: crate::signals::settings::PollSettings,
    /// `upstream.max_response_bytes`.
    pub max_response_bytes: usize,
    /// The `replicas:` block, resolved (its credentials file read).
    pub replicas: Option<crate::config::ReplicaSettings>,
    /// The `sessions:` block, validated.
    pub sessions: crate::session::Sessions,
    /// Where the configuration's relative paths start (a worker's `api_key_file` added
    /// through the admin API too).
    pub config_dir: PathBuf,
}

impl Settings {
    pub fn from_config(c: &GatewayConfig) -> Result<Settings, InputError> {
        let secs = |field, v| secs(c.origin(), field, v);
        Ok(Settings {
            max_body: c.max_body_bytes,
            max_buffered_bodies: usize::try_from(c.max_buffered_body_bytes.unwrap_or(
                crate::config::DEFAULT_BUFFERED_BODY_BYTES.max(c.max_body_bytes as u64),
            ))
            .unwrap_or(usize::MAX),
            queue_timeout: secs("queue_timeout_s", c.queue_timeout_s)?,
            retries: c.retries,
            response_timeout: secs("upstream.response_timeout_s", c.upstream.response_timeout_s)?,
            stream_idle_timeout: secs(
                "upstream.stream_idle_timeout_s",
                c.upstream
                    .stream_idle_timeout_s
                    .unwrap_or(c.upstream.response_timeout_s),
            )?,
            health: c.health.clone(),
            health_interval: secs("health.interval_s", c.health.interval_s)?,
            health_timeout: secs("health.timeout_s", c.health.timeout_s)?,
            probe_poll: secs("probe.poll_interval_s", c.probe.poll_interval_s)?,
            probe_timeout: secs("probe.request_timeout_s", c.probe.request_timeout_s)?,
            probe_budget: secs("probe.budget_s", c.probe.budget_s)?,
            state_file: c.state_file.clone(),
            admin_token: c.admin_token.clone().filter(|t| !t.expose().is_empty()),
            server: crate::server::limits::Limits {
                header_read_timeout: secs(
                    "server.header_read_timeout_s",
                    c.server.header_read_timeout_s,
                )?,
                body_read_timeout: secs(
                    "server.body_read_timeout_s",
                    c.server.body_read_timeout_s,
                )?,
                max_connections: c
                    .server
                    .max_connections
                    .unwrap_or_else(crate::server::limits::default_max_connections),
                drain_timeout: secs("server.drain_timeout_s", c.server.drain_timeout_s)?,
            },
            min_observed: secs("capacity.min_observed_s", c.capacity.min_observed_s)?,
            engine_poll: c.engine_metrics.settings(
                c.policy
                    .build_in(c.origin(), "policy")?
                    .chooser
                    .engine_poll_interval(),
            ),
            max_response_bytes: c.upstream.max_response_bytes,
            replicas: c
                .replicas
                .as_ref()
                .map(|r| r.settings(c.origin(), &crate::tokens::config_base(c.origin())))
                .transpose()?,
            sessions: c.sessions.validate(c.origin())?,
            config_dir: crate::tokens::config_base(c.origin()),
        })
    }
}
