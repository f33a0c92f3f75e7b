//! The configuration's sections beside the workers: the top-level `slo`, the client-facing
//! server, the upstream client, health checks, the probe runner, the request log and the
//! capacity curve, each with its defaults.

use serde::Deserialize;
use std::path::PathBuf;

/// The top-level `slo`: per-request bounds, both required (the simulator's scenario SLO has
/// both too, so the router measured there and the router shipped here aim alike).
#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SloConfig {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token, seconds.
    pub tpot_s: f64,
}

impl SloConfig {
    /// Hand the SLO to a router: **the one rule** (`Router::aim_at`) by which a host's SLO
    /// reaches a policy, the simulator's included; a chooser's own bounds win over it.
    pub fn aim(&self, router: &mut routelab_policies::Router) {
        router.aim_at(self.ttft_s, self.tpot_s);
    }
}

/// The client-facing HTTP server (each listener applies it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A connection that has not sent a complete request head this long after it opened (or
    /// after its previous response) is closed: it stops slowloris clients and frees idle
    /// keep-alive connections.
    pub header_read_timeout_s: f64,
    /// A request body not fully received this long after its head is answered 408 and its
    /// connection closed.
    pub body_read_timeout_s: f64,
    /// Open client connections per listener; one more is answered 503 and closed. Default:
    /// 4,096, or less where the process's open-file limit would run out first
    /// (`server::default_max_connections`).
    pub max_connections: Option<u32>,
    /// After a shutdown signal, how long requests in flight may still run; then their
    /// connections are closed (a stream trickling for minutes must not hold the shutdown).
    pub drain_timeout_s: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            // A real client writes its whole head at once, in milliseconds; 10 s tolerates a
            // congested link and still frees a silent socket (or an idle keep-alive one) soon.
            header_read_timeout_s: 10.0,
            // A 4 MiB body (the default `max_body_bytes`) takes 30 s only below ~1 Mbit/s.
            body_read_timeout_s: 30.0,
            // Derived from the open-file limit at start (see `server::default_max_connections`).
            max_connections: None,
            // Kubernetes' default grace period before SIGKILL is 30 s: finish within it.
            drain_timeout_s: 25.0,
        }
    }
}

/// Upstream connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// TCP connect timeout.
    pub connect_timeout_s: f64,
    /// Longest wait for a worker's response headers and first body chunk (a slow prefill
    /// counts here).
    pub response_timeout_s: f64,
    /// Idle keep-alive connections kept per worker.
    pub max_idle_per_worker: usize,
    /// Longest gap between two body chunks from a worker once its body has started; none:
    /// `response_timeout_s`. A stream that stalls longer ends with an SSE error event.
    pub stream_idle_timeout_s: Option<f64>,
    /// Largest worker body the gateway holds in memory: a non-streamed answer (502
    /// `response_too_large` past it), a probe reply or a health check's (a failure past it).
    /// Streams are passed through and not bounded.
    pub max_response_bytes: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout_s: 2.0,
            response_timeout_s: 300.0,
            max_idle_per_worker: 256,
            stream_idle_timeout_s: None,
            // A non-streamed completion is kilobytes; 32 MiB still holds a long one with
            // per-token log-probabilities.
            max_response_bytes: 32 * 1024 * 1024,
        }
    }
}

/// Active health checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Seconds between checks; 0 disables active checks.
    pub interval_s: f64,
    /// Path appended to the worker's base URL (`/health`, or `/v1/models`).
    pub path: String,
    /// Timeout of one check.
    pub timeout_s: f64,
    /// Consecutive failures (checks or requests failing before the first byte) before the
    /// worker is ejected (`Router::disconnect`). A refused connection ejects at once.
    pub unhealthy_after: u32,
    /// Consecutive successful checks before an ejected worker is re-admitted.
    pub healthy_after: u32,
    /// Most of a model's workers that failing requests may eject, in percent (Envoy's
    /// `max_ejection_percent`); one is always allowed. Health checks are not capped: a worker
    /// that fails its own checks is out, and too many out starts the panic mode.
    pub max_ejection_percent: f64,
    /// When fewer than this percentage of a model's workers (not drained) are healthy, the
    /// model is in panic mode: requests go to all of them, ejected or not (Envoy's
    /// `healthy_panic_threshold`); 0 turns the panic mode off.
    pub panic_threshold_percent: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_s: 5.0,
            path: "/health".into(),
            timeout_s: 2.0,
            unhealthy_after: 3,
            healthy_after: 1,
            // Envoy's defaults.
            max_ejection_percent: 10.0,
            panic_threshold_percent: 50.0,
        }
    }
}

/// The burst-probe runner (the probe's shape itself is the policy's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeRunnerConfig {
    /// How often the router is asked for probe orders (and ticked).
    pub poll_interval_s: f64,
    /// Timeout of one probe request; a burst with a timed-out request is a failed burst.
    pub request_timeout_s: f64,
    /// Policy time a burst may take: a burst still running then is cut, and its throughput is
    /// the output tokens streamed within the budget over the budget (a slow engine is
    /// measured rather than timed out; the admin view and the log say which).
    pub budget_s: f64,
}

impl Default for ProbeRunnerConfig {
    fn default() -> Self {
        ProbeRunnerConfig {
            poll_interval_s: 1.0,
            request_timeout_s: 120.0,
            budget_s: 30.0,
        }
    }
}

/// The request log ([`crate::reqlog`] has its line schema).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequestLogConfig {
    /// The live file (appended to; its directory must exist).
    pub path: PathBuf,
    /// Largest size of one file in bytes: a line that would take it past this first rotates it
    /// to `<path>.1`.
    #[serde(default = "default_log_max_bytes")]
    pub max_bytes: u64,
    /// Rotated files kept (`<path>.1` … `<path>.<keep>`); 0 keeps none.
    #[serde(default = "default_log_keep")]
    pub keep: u32,
}

/// The passive capacity curve.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CapacityConfig {
    /// A concurrency is exported once it was observed this many seconds of policy time.
    pub min_observed_s: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            min_observed_s: crate::capacity::DEFAULT_MIN_OBSERVED_S,
        }
    }
}

impl RequestLogConfig {
    /// The log's settings (the numbers were validated with the configuration).
    pub fn settings(&self) -> crate::reqlog::LogSettings {
        crate::reqlog::LogSettings {
            path: self.path.clone(),
            max_bytes: self.max_bytes,
            keep: self.keep,
        }
    }
}

fn default_log_max_bytes() -> u64 {
    100 * 1024 * 1024
}
fn default_log_keep() -> u32 {
    5
}
