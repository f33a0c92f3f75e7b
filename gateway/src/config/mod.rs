//! The gateway's YAML configuration.
//!
//! ```yaml
//! listen: 127.0.0.1:8080
//! policy: predictive           # a preset / composition name, or a full policy mapping
//! seed: 1                      # routing RNG seed
//! state_file: gateway-state.json
//! admin_token: change-me-to-a-secret
//! workers:
//!   - name: pair
//!     base_url: http://127.0.0.1:8001
//!     node: node-a
//!     model: gemma-27b
//!     gpu_names: [RTX 4090, RTX 4090]
//!     context_window: 32768
//!     launch_args: "--max-model-len 32768"
//!     cache_tokens: 262144         # optional: the engine's KV cache size, from its logs
//! ```
//!
//! See `gateway/examples/gateway.yaml` for every field with its default (the request log and the
//! capacity curve included: `request_log: {path, max_bytes, keep}`, `capacity: {min_observed_s}`).

mod fleet;
mod numbers;
mod replicas;
mod secret;
mod sections;
mod worker;

pub use fleet::fleet_config;
pub(crate) use numbers::secs;
pub use numbers::{
    CLOCK_SCALE_RANGE, DEFAULT_BUFFERED_BODY_BYTES, MAX_BODY_BYTES, MAX_BUFFERED_BODY_BYTES,
    MAX_CONNECTIONS, MAX_IDLE_PER_WORKER, MAX_LOG_BYTES, MAX_LOG_KEEP, MAX_RETRIES,
};
use numbers::{number_rule, with_valid_number};
pub use sections::{
    CapacityConfig, HealthConfig, ProbeRunnerConfig, RequestLogConfig, ServerConfig, SloConfig,
    UpstreamConfig,
};

pub use replicas::{Credentials, ReplicaSettings, ReplicasConfig};
pub(crate) use secret::redact_error;
pub use secret::{REDACTED, Secret};
pub use worker::{CacheTokens, MAX_CACHE_TOKENS, MAX_NAME_BYTES, WorkerConfig};

use crate::error::WorkerError;
use routelab_policies::located::parse_yaml;
use routelab_policies::{InputError, PolicyEntry, SloBound, implausible_slo_bound};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on (`host:port`); port 0 picks a free port.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The routing policy (default `predictive`): a preset / composition name (`seed-v3`,
    /// `probe/sed/capacity/weighted:24`) or a full mapping with `preset`, `weights`, `chooser`,
    /// `affinity`, `cap` (as in the simulator's scenarios).
    #[serde(default = "default_policy")]
    pub policy: PolicyEntry,
    /// The SLO the fleet is held to: a policy that aims at one (`predictive`) and has no
    /// bounds of its own aims at this, as the simulator's `predictive` aims at its scenario's
    /// `slo` ([`SloConfig`]). None: such a policy has no SLO (`--check` warns).
    #[serde(default)]
    pub slo: Option<SloConfig>,
    /// Seed of the routing RNG (`Xoshiro256PlusPlus`).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Where the probe cache and pins are persisted (JSON); none: not persisted. Several
    /// gateways may share one file (`persist::save` merges under a lock).
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    /// Bearer token of the admin API; none: the admin API answers 401 to everyone.
    #[serde(default)]
    pub admin_token: Option<Secret>,
    /// A separate `host:port` for `/admin` (the API and the page); when set, the public
    /// listener answers 404 to every `/admin` path. None: `/admin` is served on `listen`.
    #[serde(default)]
    pub admin_listen: Option<String>,
    /// How many times faster than wall time the policy's clock runs (probe cache TTL,
    /// re-probe when idle, live correction cadence, probe throughput). For tests and
    /// emulations only (an emulation at `--speedup K` runs the gateway at `clock_scale: K`);
    /// production keeps the default 1.
    #[serde(default = "default_clock_scale")]
    pub clock_scale: f64,
    /// The client-facing HTTP server: read timeouts and the connection cap.
    #[serde(default)]
    pub server: ServerConfig,
    /// Largest accepted request body, in bytes (413 above).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Largest total of request bodies held at once while they are read, counted and sent
    /// (503 with `Retry-After` above; [`crate::proxy`]); none: the larger of
    /// [`DEFAULT_BUFFERED_BODY_BYTES`] and `max_body_bytes`.
    #[serde(default)]
    pub max_buffered_body_bytes: Option<u64>,
    /// How long a request may wait in the gateway's queue when every worker is at its cap
    /// before it is answered 429.
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout_s: f64,
    /// Retries on another worker when a worker fails before the first response byte.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Upstream (worker) connection settings.
    #[serde(default)]
    pub upstream: UpstreamConfig,
    /// Active health checks.
    #[serde(default)]
    pub health: HealthConfig,
    /// Burst-probe runner.
    #[serde(default)]
    pub probe: ProbeRunnerConfig,
    /// The request log (one JSON line per finished request, rotated by size); none: no log.
    #[serde(default)]
    pub request_log: Option<RequestLogConfig>,
    /// The passive capacity curve (`GET /admin/capacity`).
    #[serde(default)]
    pub capacity: CapacityConfig,
    /// Models whose prompts are counted with their own tokenizer ([`crate::tokens`]); the
    /// others by the bytes / 4 estimate.
    #[serde(default)]
    pub models: Vec<crate::tokens::ModelConfig>,
    /// Polling the engines' `/metrics` for the rules that read engine reports
    /// ([`crate::signals`]).
    #[serde(default)]
    pub engine_metrics: crate::signals::settings::EngineMetricsConfig,
    /// Workers known at start (more can be added with the admin API).
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// Several gateway replicas sharing what each dispatches over a NATS bus
    /// ([`crate::replicas`]); none: this gateway counts only its own requests.
    #[serde(default)]
    pub replicas: Option<ReplicasConfig>,
    /// Where a request's session comes from (`user`, a header, the prefix chain) and the cap
    /// on its key ([`crate::session`]).
    #[serde(default)]
    pub sessions: crate::session::SessionsConfig,
    /// Where the configuration came from (the file, or the origin given to
    /// [`GatewayConfig::from_yaml`]), for located errors.
    #[serde(skip, default = "default_origin")]
    origin: String,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
/// `predictive`: ours, and the lab's winner (docs/findings.md: it carries more load at the SLO
/// than every field router on the bundled heterogeneous traces, and far more than seed-v3, the
/// default before it). Without bounds written into it the gateway has no SLO to aim at, and it
/// routes by the least predicted completion plus the delay it adds to the running requests.
fn default_policy() -> PolicyEntry {
    PolicyEntry::Name("predictive".into())
}
fn default_origin() -> String {
    "<config>".into()
}
fn default_seed() -> u64 {
    1
}
fn default_max_body() -> usize {
    4 * 1024 * 1024
}
fn default_queue_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    2
}
fn default_clock_scale() -> f64 {
    1.0
}
impl GatewayConfig {
    /// A `sita` policy's bands against each model's configured workers: each band must go to
    /// a class of context windows that can hold its requests.
    fn check_sita(
        &self,
        file: &str,
        policy: &routelab_policies::PolicyConfig,
    ) -> Result<(), InputError> {
        let mut models: Vec<&str> = self.workers.iter().map(|w| w.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        for model in models {
            let windows: Vec<u32> = (self.workers.iter())
                .filter(|w| w.model == model)
                .map(|w| w.context_window)
                .collect();
            policy.sita_fits(&windows).map_err(|e| {
                InputError::new(
                    file,
                    "policy.chooser.cutoffs",
                    format!("model {model}: {e}"),
                )
            })?;
        }
        Ok(())
    }

    /// Parse YAML text; `origin` names the file in errors.
    /// Errors never show the secrets the text holds (`admin_token`).
    pub fn from_yaml(text: &str, origin: &str) -> Result<GatewayConfig, InputError> {
        let parse = || {
            let mut cfg: GatewayConfig = parse_yaml(text, origin)?;
            cfg.origin = origin.to_string();
            let base = crate::tokens::config_base(origin);
            for (i, w) in cfg.workers.iter_mut().enumerate() {
                w.read_api_key(&base).map_err(|e| e.located(origin, i))?;
            }
            cfg.validate()?;
            Ok(cfg)
        };
        parse().map_err(|e| redact_error(with_valid_number(e), text))
    }

    /// Read and parse a YAML file.
    pub fn load(path: &Path) -> Result<GatewayConfig, InputError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| InputError::unreadable(&file, &e))?;
        GatewayConfig::from_yaml(&text, &file)
    }

    /// Where the configuration came from (the file named in errors).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Every numeric field and its value (none: not set, nothing to check); [`number_rule`]
    /// says what each accepts.
    fn numbers(&self) -> [(&'static str, Option<f64>); 28] {
        let (u, h, p, srv) = (&self.upstream, &self.health, &self.probe, &self.server);
        let log = self.request_log.as_ref();
        [
            ("slo.ttft_s", self.slo.map(|s| s.ttft_s)),
            ("slo.tpot_s", self.slo.map(|s| s.tpot_s)),
            ("request_log.max_bytes", log.map(|l| l.max_bytes as f64)),
            ("request_log.keep", log.map(|l| f64::from(l.keep))),
            (
                "capacity.min_observed_s",
                Some(self.capacity.min_observed_s),
            ),
            ("queue_timeout_s", Some(self.queue_timeout_s)),
            ("health.interval_s", Some(h.interval_s)),
            ("upstream.connect_timeout_s", Some(u.connect_timeout_s)),
            ("upstream.response_timeout_s", Some(u.response_timeout_s)),
            ("upstream.stream_idle_timeout_s", u.stream_idle_timeout_s),
            ("health.timeout_s", Some(h.timeout_s)),
            ("probe.poll_interval_s", Some(p.poll_interval_s)),
            ("probe.request_timeout_s", Some(p.request_timeout_s)),
            ("probe.budget_s", Some(p.budget_s)),
            (
                "server.header_read_timeout_s",
                Some(srv.header_read_timeout_s),
            ),
            ("server.body_read_timeout_s", Some(srv.body_read_timeout_s)),
            ("clock_scale", Some(self.clock_scale)),
            ("max_body_bytes", Some(self.max_body_bytes as f64)),
            (
                "max_buffered_body_bytes",
                self.max_buffered_body_bytes.map(|v| v as f64),
            ),
            ("retries", Some(f64::from(self.retries))),
            (
                "upstream.max_idle_per_worker",
                Some(u.max_idle_per_worker as f64),
            ),
            ("server.max_connections", srv.max_connections.map(f64::from)),
            ("health.unhealthy_after", Some(f64::from(h.unhealthy_after))),
            ("health.healthy_after", Some(f64::from(h.healthy_after))),
            ("health.max_ejection_percent", Some(h.max_ejection_percent)),
            (
                "health.panic_threshold_percent",
                Some(h.panic_threshold_percent),
            ),
            (
                "upstream.max_response_bytes",
                Some(u.max_response_bytes as f64),
            ),
            ("server.drain_timeout_s", Some(srv.drain_timeout_s)),
        ]
    }

    /// What `--check` warns about in the file itself (a valid configuration that likely does
    /// not do what was meant): an SLO-aiming policy without any SLO, and implausible SLO
    /// bounds (by the policy crate's one plausibility rule).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(policy) = self.policy.build()
            && policy.awaits_host_slo()
            && self.slo.is_none()
        {
            out.push(format!(
                "{}: policy {} aims at an SLO, but neither its chooser (ttft_s, tpot_s) nor a \
                 top-level `slo: {{ttft_s, tpot_s}}` gives one: it routes by predicted \
                 completion time alone, not as the lab measured it against an SLO",
                self.origin, policy.name
            ));
        }
        if let Some(slo) = self.slo {
            for (field, bound, x) in [
                ("slo.ttft_s", SloBound::Ttft, slo.ttft_s),
                ("slo.tpot_s", SloBound::Tpot, slo.tpot_s),
            ] {
                if let Some(why) = implausible_slo_bound(bound, x) {
                    out.push(format!("{}: {field}: {why}", self.origin));
                }
            }
        }
        out
    }

    /// The validated policy with the top-level SLO handed to it, as a router: what the gateway
    /// runs (and what `--check` checks).
    pub fn router(&self) -> Result<routelab_policies::Router, InputError> {
        let mut router =
            routelab_policies::Router::new(self.policy.build_in(&self.origin, "policy")?);
        if let Some(slo) = &self.slo {
            slo.aim(&mut router);
        }
        Ok(router)
    }

    /// Check everything that does not need the network.
    pub fn validate(&self) -> Result<(), InputError> {
        let file = self.origin.as_str();
        // The probe's shape is bounded by the policy crate (a burst is real requests here).
        let policy = self.policy.build_in(file, "policy")?;
        self.engine_metrics.validate(file)?;
        self.sessions.validate(file)?;
        self.check_sita(file, &policy)?;
        if let Some(replicas) = &self.replicas {
            replicas.validate(file)?;
        }
        for (field, value) in self.numbers() {
            if let (Some(x), Some(rule)) = (value, number_rule(field)) {
                rule.check(x).map_err(|e| e.at_field(file, field))?;
            }
        }
        for (field, addr) in [
            ("listen", Some(&self.listen)),
            ("admin_listen", self.admin_listen.as_ref()),
        ] {
            if let Some(addr) = addr {
                check_listen_address(file, field, addr)?;
            }
        }
        // Port 0 picks a free port for each, so only a fixed port can collide.
        if self.admin_listen.as_ref() == Some(&self.listen) && !self.listen.ends_with(":0") {
            return Err(
                InputError::new(file, "admin_listen", "must differ from `listen`")
                    .valid("another host:port, or no admin_listen to serve /admin on `listen`"),
            );
        }
        if let Some(cap) = self.max_buffered_body_bytes
            && cap < self.max_body_bytes as u64
        {
            return Err(InputError::new(
                file,
                "max_buffered_body_bytes",
                format!(
                    "{cap} is less than max_body_bytes ({}): one body alone would not fit",
                    self.max_body_bytes
                ),
            )
            .valid("at least max_body_bytes"));
        }
        if let Some(log) = &self.request_log
            && log.path.as_os_str().is_empty()
        {
            return Err(
                InputError::new(file, "request_log.path", "must not be empty")
                    .valid("a file path, e.g. /var/log/routelab/requests.jsonl"),
            );
        }
        if let Some(t) = &self.admin_token {
            let n = t.expose().chars().count();
            // Empty is "no token" (state::Settings drops it); a short one is guessable, and
            // redaction rewrites every log line containing it (a token of `tok` turned `tok_s`
            // into `<redacted>_s`).
            if n > 0 && n < MIN_ADMIN_TOKEN_CHARS {
                return Err(InputError::new(
                    file,
                    "admin_token",
                    format!("is {n} characters long, too short to be a secret"),
                )
                .valid(format!(
                    "at least {MIN_ADMIN_TOKEN_CHARS} characters, e.g. the output of `openssl rand -hex 16`"
                )));
            }
        }
        let path_problem = crate::upstream::check_path(&self.health.path)
            .err()
            .map(|e| e.to_string())
            .or_else(|| worker::text_problem(&self.health.path));
        if let Some(reason) = path_problem {
            return Err(InputError::new(file, "health.path", reason)
                .valid("a path such as /health or /v1/models"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, w) in self.workers.iter().enumerate() {
            w.validate().map_err(|e| e.located(file, i))?;
            if !names.insert(w.name.as_str()) {
                return Err(WorkerError::Duplicate(w.name.clone()).located(file, i));
            }
            if let Err(reason) = policy.prefill_probe_fits(w.context_window) {
                return Err(InputError::new(
                    file,
                    format!("workers[{i}].context_window"),
                    reason.to_string(),
                ));
            }
        }
        Ok(())
    }
}

/// Shortest `admin_token` accepted.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 12;

/// `host:port` with a port number (the host is resolved when binding).
fn check_listen_address(file: &str, field: &str, addr: &str) -> Result<(), InputError> {
    let port = addr.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
    match port {
        Some(Ok(_)) => Ok(()),
        _ => Err(
            InputError::new(file, field, format!("`{addr}` is not a host:port address"))
                .valid("host:port, e.g. 127.0.0.1:8081 (port 0 picks a free port)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::numbers::NumberRule;
    use super::*;

    #[test]
    fn the_example_config_is_valid() {
        let c =
            GatewayConfig::from_yaml(include_str!("../../examples/gateway.yaml"), "gateway.yaml")
                .unwrap();
        assert_eq!(c.workers.len(), 2);
        assert_eq!(c.policy.build().unwrap().name, "seed-v3+probe+weighted");
        assert_eq!(c.origin(), "gateway.yaml");
        assert_eq!(c.workers[0].spec().node, "node-a");
        // 262,144 tokens of KV cache: 512 prefix blocks; the second worker gives none.
        assert_eq!(c.workers[0].spec().cache_blocks, Some(512));
        assert_eq!(c.workers[1].spec().cache_blocks, None);
    }

    const WORKER: &str = "workers:\n  - {name: a, base_url: http://h, model: m, context_window: 9";

    #[test]
    fn cache_tokens_become_whole_cache_blocks() {
        for (tokens, blocks) in [(512, 1), (1_000, 1), (1_048_576, 2_048)] {
            let c = GatewayConfig::from_yaml(
                &format!("{WORKER}, cache_tokens: {tokens}}}\n"),
                "g.yaml",
            )
            .unwrap();
            assert_eq!(c.workers[0].spec().cache_blocks, Some(blocks), "{tokens}");
            // It survives the admin API's JSON both ways.
            let json = serde_json::to_string(&c.workers[0]).unwrap();
            assert!(
                json.contains(&format!("\"cache_tokens\":{tokens}")),
                "{json}"
            );
            let back: WorkerConfig = serde_json::from_str(&json).unwrap();
            assert_eq!(back, c.workers[0]);
        }
    }

    #[test]
    fn a_bad_cache_size_is_located_with_what_is_valid() {
        let valid = format!("a whole number from 512 to {MAX_CACHE_TOKENS}");
        for bad in ["0", "511", "-4096", "1536.5", ".nan", "1e30"] {
            let e =
                GatewayConfig::from_yaml(&format!("{WORKER}, cache_tokens: {bad}}}\n"), "g.yaml")
                    .unwrap_err();
            assert_eq!(e.field, "workers[0].cache_tokens", "{bad}: {e}");
            assert_eq!(e.line, Some(2), "{bad}: {e}");
            assert!(e.to_string().contains(&valid), "{bad}: {e}");
        }
        // The admin API reads workers as JSON: the same rule.
        let e = serde_json::from_str::<WorkerConfig>(
            r#"{"name": "a", "base_url": "http://h", "model": "m", "context_window": 9, "cache_tokens": 0}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains(&valid), "{e}");
    }

    #[test]
    fn a_policy_that_asks_for_kv_events_is_accepted_and_workers_name_their_streams() {
        for policy in [
            "{preset: seed-v3, prefix_knowledge: kv-events}",
            "probe/sed/capacity/kv-events",
        ] {
            let c = GatewayConfig::from_yaml(&format!("policy: {policy}\n"), "g.yaml").unwrap();
            assert!(
                c.policy.build().unwrap().kv_event_delay().is_some(),
                "{policy}"
            );
        }
        let yaml = "workers:\n  - {name: a, base_url: \"http://h:1\", model: m, context_window: 9, kv_events: {endpoint: \"tcp://h:5557\", replay_endpoint: \"tcp://h:5558\"}}\n";
        let c = GatewayConfig::from_yaml(yaml, "g.yaml").unwrap();
        assert_eq!(c.workers[0].kv_events.as_ref().unwrap().heartbeat_s, 1.0);
        let e = GatewayConfig::from_yaml(&yaml.replace("tcp://h:5557", "h:5557"), "g.yaml")
            .unwrap_err();
        assert_eq!(e.field, "workers[0].kv_events", "{e}");
        assert!(e.to_string().contains("tcp://HOST:PORT"), "{e}");
        let e =
            GatewayConfig::from_yaml("engine_metrics: {interval_s: -1}\n", "g.yaml").unwrap_err();
        assert_eq!(e.field, "engine_metrics.interval_s", "{e}");
    }

    #[test]
    fn errors_are_located() {
        let e = GatewayConfig::from_yaml("policy: nope\n", "g.yaml").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("g.yaml", "policy.preset")
        );
        assert!(
            e.to_string()
                .starts_with("g.yaml: policy.preset: unknown preset `nope`; valid: seed-v1"),
            "{e}"
        );
        // A composition that does not parse is about the entry as a whole.
        let e = GatewayConfig::from_yaml("policy: probe/bogus\n", "g.yaml").unwrap_err();
        assert_eq!(e.field, "policy");
        assert!(
            e.valid.as_deref().unwrap_or("").contains("no-affinity"),
            "{e}"
        );
        // A full policy: the path inside it.
        let e =
            GatewayConfig::from_yaml("policy: {weights: {kind: magic}}\n", "g.yaml").unwrap_err();
        assert_eq!(e.field, "policy.weights.kind");
        // Parse errors have the line and column.
        let e = GatewayConfig::from_yaml("listen: x\nbogus: 1\n", "g.yaml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(2), "bogus"));
        assert!(e.to_string().starts_with("g.yaml:2:"), "{e}");
        let w = "workers:\n  - {name: a, base_url: https://h, model: m, context_window: 9}\n";
        let e = GatewayConfig::from_yaml(w, "g.yaml").unwrap_err();
        assert_eq!(e.field, "workers[0].base_url");
        assert!(e.message.contains("plain http"), "{e}");
        let w = "workers:\n  - {name: a, base_url: http://h, model: m, context_window: 9}\n  - {name: a, base_url: http://h, model: m, context_window: 9}\n";
        let e = GatewayConfig::from_yaml(w, "g.yaml").unwrap_err();
        assert_eq!(e.to_string(), "g.yaml: workers[1].name: duplicate name `a`");
        let e = GatewayConfig::from_yaml("queue_timeout_s: -1\n", "g.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "g.yaml: queue_timeout_s: -1 is not valid; expected a finite number of seconds from 0 to 1e9"
        );
    }

    /// A prefill-bound probe whose given prompt length cannot fit a configured worker's
    /// context window is a located error naming the window and what would fit; one that fits
    /// is accepted, and predictive's default (no length given) fits its prompts to each window.
    #[test]
    fn a_prefill_probe_that_cannot_fit_a_context_window_is_a_located_error() {
        let worker = "workers:\n  - {name: a, base_url: \"http://h:1\", model: m, context_window: 9}\n  - {name: b, base_url: \"http://h:2\", model: m, context_window: 2048}\n";
        GatewayConfig::from_yaml(&format!("policy: predictive\n{worker}"), "g.yaml").unwrap();
        let given = |tokens: u32| {
            format!(
                "policy: {{preset: predictive, weights: {{kind: probe, prefill_requests: 4, prefill_prompt_tokens: {tokens}}}}}\n"
            )
        };
        GatewayConfig::from_yaml(&format!("{}{worker}", given(8)), "g.yaml").unwrap();
        let e = GatewayConfig::from_yaml(&format!("{}{worker}", given(9)), "g.yaml").unwrap_err();
        assert_eq!(e.field, "workers[0].context_window", "{e}");
        assert!(
            e.message.contains("(9 prompt tokens and 1 output token)")
                && e.message.contains("context window of 9 tokens")
                && e.message.contains("prefill_prompt_tokens to at most 8"),
            "{e}"
        );
        // The second worker's window equals the prompt: no room for the output token.
        let only_b =
            "workers:\n  - {name: b, base_url: \"http://h:2\", model: m, context_window: 2048}\n";
        let e =
            GatewayConfig::from_yaml(&format!("{}{only_b}", given(2048)), "g.yaml").unwrap_err();
        assert_eq!(e.field, "workers[0].context_window", "{e}");
        GatewayConfig::from_yaml(&format!("{}{only_b}", given(2047)), "g.yaml").unwrap();
        // Without `prefill_requests`, the prompt length alone is refused by name.
        let e = GatewayConfig::from_yaml(
            "policy: {preset: seed-v3, weights: {kind: probe, prefill_prompt_tokens: 8}}\n",
            "g.yaml",
        )
        .unwrap_err();
        assert_eq!(e.field, "policy.weights.prefill_prompt_tokens", "{e}");
    }

    fn bounds(c: &GatewayConfig) -> (Option<f64>, Option<f64>) {
        match &c.router().unwrap().config().chooser {
            routelab_policies::Chooser::Predictive(p) => (p.ttft_s, p.tpot_s),
            other => panic!("not predictive: {other:?}"),
        }
    }

    /// Issue 41: a top-level `slo` reaches the policy the gateway builds, as the simulator
    /// hands its scenario's `slo` to the policy; a chooser's own bounds win over it.
    #[test]
    fn a_top_level_slo_is_what_predictive_aims_at() {
        let c = GatewayConfig::from_yaml(
            "slo: {ttft_s: 30, tpot_s: 0.1}
",
            "g.yaml",
        )
        .unwrap();
        assert_eq!(
            c.slo,
            Some(SloConfig {
                ttft_s: 30.0,
                tpot_s: 0.1
            })
        );
        assert_eq!(bounds(&c), (Some(30.0), Some(0.1)));
        // Without one, the default policy has no bounds at all.
        let none = GatewayConfig::from_yaml(
            "listen: 127.0.0.1:0
",
            "g.yaml",
        )
        .unwrap();
        assert_eq!(bounds(&none), (None, None));
        // The chooser's own bounds win, bound by bound (the simulator's rule).
        let own = GatewayConfig::from_yaml(
            "policy: {preset: predictive, chooser: {kind: predictive, ttft_s: 5}}
slo: {ttft_s: 30, tpot_s: 0.1}
",
            "g.yaml",
        )
        .unwrap();
        assert_eq!(bounds(&own), (Some(5.0), Some(0.1)));
        // A policy that aims at no SLO is built unchanged.
        let other = GatewayConfig::from_yaml(
            "policy: least-load
slo: {ttft_s: 30, tpot_s: 0.1}
",
            "g.yaml",
        )
        .unwrap();
        assert_eq!(
            other.router().unwrap().config(),
            &routelab_policies::PolicyConfig::preset("least-load").unwrap()
        );
    }

    #[test]
    fn a_bad_slo_is_a_located_error() {
        for (yaml, field, line) in [
            (
                "slo: {ttft_s: 0, tpot_s: 0.1}
",
                "slo.ttft_s",
                None,
            ),
            (
                "slo: {ttft_s: 2, tpot_s: -1}
",
                "slo.tpot_s",
                None,
            ),
            (
                "slo: {ttft_s: .nan, tpot_s: 0.1}
",
                "slo.ttft_s",
                None,
            ),
            (
                "listen: 127.0.0.1:0
slo: {ttft_s: 2}
",
                "slo",
                Some(2),
            ),
            (
                "slo: {ttft_s: 2, tpot_s: 0.1, p99: true}
",
                "slo.p99",
                Some(1),
            ),
            (
                "slo: {ttft_s: fast, tpot_s: 0.1}
",
                "slo.ttft_s",
                Some(1),
            ),
        ] {
            let e = GatewayConfig::from_yaml(yaml, "g.yaml").unwrap_err();
            assert_eq!(e.file, "g.yaml", "{yaml}: {e}");
            assert!(e.field.starts_with(field), "{yaml}: {e}");
            if line.is_some() {
                assert_eq!(e.line, line, "{yaml}: {e}");
            }
        }
        let e = GatewayConfig::from_yaml(
            "slo: {ttft_s: 0, tpot_s: 0.1}
",
            "g.yaml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("a number of seconds from"), "{e}");
    }

    /// `--check`'s warnings: an SLO-aiming policy without any SLO, and implausible bounds.
    #[test]
    fn an_slo_aiming_policy_without_an_slo_is_warned_about() {
        let w = GatewayConfig::from_yaml(
            "listen: 127.0.0.1:0
",
            "g.yaml",
        )
        .unwrap()
        .warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("policy predictive aims at an SLO") && w[0].contains("slo: {ttft_s"),
            "{w:?}"
        );
        for quiet in [
            "slo: {ttft_s: 30, tpot_s: 0.1}
",
            "policy: least-load
",
            "policy: {preset: predictive, chooser: {kind: predictive, ttft_s: 5}}
",
        ] {
            let w = GatewayConfig::from_yaml(quiet, "g.yaml")
                .unwrap()
                .warnings();
            assert!(w.is_empty(), "{quiet}: {w:?}");
        }
        let w = GatewayConfig::from_yaml(
            "slo: {ttft_s: 2000, tpot_s: 100}
",
            "g.yaml",
        )
        .unwrap()
        .warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("g.yaml: slo.ttft_s: ") && w[0].contains("milliseconds"));
        assert!(w[1].starts_with("g.yaml: slo.tpot_s: "), "{w:?}");
    }

    /// Issue 27: the lab's winner is the gateway's default policy.
    #[test]
    fn the_default_policy_is_predictive() {
        let c = GatewayConfig::from_yaml("listen: 127.0.0.1:0\n", "g.yaml").unwrap();
        assert_eq!(
            c.policy.build().unwrap(),
            routelab_policies::PolicyConfig::preset("predictive").unwrap()
        );
    }

    #[test]
    fn durations_that_would_panic_are_located_errors() {
        // Regression: `Duration::from_secs_f64` panicked on these at `--check` and at start.
        for (yaml, field) in [
            ("queue_timeout_s: 1e20\n", "queue_timeout_s"),
            (
                "upstream: { response_timeout_s: 1e300 }\n",
                "upstream.response_timeout_s",
            ),
            (
                "upstream: { connect_timeout_s: 1e30 }\n",
                "upstream.connect_timeout_s",
            ),
            ("health: { interval_s: 1e20 }\n", "health.interval_s"),
            (
                "probe: { poll_interval_s: 1e-12 }\n",
                "probe.poll_interval_s",
            ),
        ] {
            let e = GatewayConfig::from_yaml(yaml, "g.yaml").unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
            assert!(e.message.contains("expected"), "{e}");
        }
    }

    #[test]
    fn debug_output_never_shows_the_admin_token() {
        let c = GatewayConfig::from_yaml("admin_token: hunter2-debug\n", "g.yaml").unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert_eq!(
            c.admin_token.as_ref().map(Secret::expose),
            Some("hunter2-debug")
        );
    }

    #[test]
    fn every_numeric_field_has_its_rule() {
        let c = GatewayConfig::from_yaml("{}\n", "g.yaml").unwrap();
        for (field, _) in c.numbers() {
            let rule = number_rule(field).unwrap_or_else(|| panic!("{field} has no rule"));
            assert!(!rule.describe().is_empty(), "{field}");
        }
        assert_eq!(
            number_rule("health.interval_s")
                .map(NumberRule::describe)
                .as_deref(),
            Some("0 (off) or a number of seconds from 1e-6 to 1e9")
        );
    }

    /// Regression: a parse error printed the surrounding YAML, `admin_token` included.
    #[test]
    fn config_errors_never_show_the_admin_token() {
        for yaml in [
            "admin_token: hunter2-plain\nbogus: 1\n",
            "admin_token: \"hunter2 quoted\"  # the token\nlisten: [oops\n",
            "seed: 1\nadmin_token: 'hunter2-single'\nretries: -3\n",
            "{seed: 1, admin_token: hunter2-flow, bogus: 2}\n",
            "admin_token: hunter2-typed\nqueue_timeout_s: soon\n",
            "admin_token: [hunter2-in-a-list]\n",
        ] {
            let e = GatewayConfig::from_yaml(yaml, "g.yaml").unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("hunter2"), "{yaml}: {shown}");
            // The error still says where and what.
            assert!(e.to_string().starts_with("g.yaml"), "{e}");
        }
        // The snippet is kept, with the value hidden.
        let e = GatewayConfig::from_yaml("admin_token: hunter2-plain\nbogus: 1\n", "g.yaml")
            .unwrap_err();
        let snippet = e.snippet.as_deref().unwrap_or("");
        assert!(snippet.contains("admin_token: <redacted>"), "{snippet}");
        assert!(snippet.contains("bogus"), "{snippet}");
    }

    /// Regression: numbers that passed `--check` and broke the gateway (a spinning timer, a
    /// 0 timeout failing everything, absurd sizes) are located errors naming what is valid.
    #[test]
    fn every_number_out_of_range_is_a_located_error() {
        for (yaml, field) in [
            ("max_body_bytes: 0\n", "max_body_bytes"),
            ("max_body_bytes: 1099511627776\n", "max_body_bytes"),
            ("retries: 4000000000\n", "retries"),
            ("retries: -1\n", "retries"),
            ("seed: -1\n", "seed"),
            ("seed: 1e300\n", "seed"),
            (
                "upstream: {max_idle_per_worker: 1000000000}\n",
                "upstream.max_idle_per_worker",
            ),
            (
                "upstream: {connect_timeout_s: 0}\n",
                "upstream.connect_timeout_s",
            ),
            (
                "upstream: {response_timeout_s: .nan}\n",
                "upstream.response_timeout_s",
            ),
            ("health: {interval_s: 1e-9}\n", "health.interval_s"),
            ("health: {timeout_s: -.inf}\n", "health.timeout_s"),
            ("health: {unhealthy_after: 0}\n", "health.unhealthy_after"),
            ("health: {healthy_after: 0}\n", "health.healthy_after"),
            (
                "probe: {request_timeout_s: 1e300}\n",
                "probe.request_timeout_s",
            ),
            (
                "server: {header_read_timeout_s: 0}\n",
                "server.header_read_timeout_s",
            ),
            (
                "server: {body_read_timeout_s: 1e-300}\n",
                "server.body_read_timeout_s",
            ),
            ("server: {max_connections: 0}\n", "server.max_connections"),
            (
                "server: {max_connections: 1e300}\n",
                "server.max_connections",
            ),
            ("clock_scale: 0\n", "clock_scale"),
            ("clock_scale: .inf\n", "clock_scale"),
            ("clock_scale: 1e-300\n", "clock_scale"),
            ("clock_scale: 1e6\n", "clock_scale"),
            ("admin_listen: nowhere\n", "admin_listen"),
            (
                "request_log: {path: r.jsonl, max_bytes: 0}\n",
                "request_log.max_bytes",
            ),
            (
                "request_log: {path: r.jsonl, max_bytes: -5}\n",
                "request_log.max_bytes",
            ),
            (
                "request_log: {path: r.jsonl, keep: 5000}\n",
                "request_log.keep",
            ),
            (
                "request_log: {path: r.jsonl, keep: 1.5}\n",
                "request_log.keep",
            ),
            ("request_log: {path: \"\"}\n", "request_log.path"),
            (
                "capacity: {min_observed_s: -1}\n",
                "capacity.min_observed_s",
            ),
            (
                "capacity: {min_observed_s: .nan}\n",
                "capacity.min_observed_s",
            ),
            (
                "policy: {preset: seed-v3, weights: {kind: probe, concurrency: 4000000000}}\n",
                "policy.weights.concurrency",
            ),
            (
                "policy: {preset: seed-v3, weights: {kind: probe, prompt_tokens: 4000000000}}\n",
                "policy.weights.prompt_tokens",
            ),
            (
                "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8080\n",
                "admin_listen",
            ),
        ] {
            let e = GatewayConfig::from_yaml(yaml, "g.yaml").unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
            // What would be valid: in the message (the shared rules, the parser's "invalid
            // value … expected …") or in `valid`.
            assert!(
                e.message.contains("expected") || e.valid.is_some(),
                "{yaml}: {e}"
            );
        }
        // The bounds themselves are valid.
        let edge = "max_body_bytes: 1073741824\nretries: 100\nclock_scale: 1000\n\
                    health: {interval_s: 0}\nserver: {max_connections: 1000000}\n";
        GatewayConfig::from_yaml(edge, "g.yaml").unwrap();
    }

    #[test]
    fn the_request_log_and_the_capacity_curve_have_their_defaults() {
        let c = GatewayConfig::from_yaml("{}\n", "g.yaml").unwrap();
        assert_eq!(c.request_log, None);
        assert_eq!(
            c.capacity.min_observed_s,
            crate::capacity::DEFAULT_MIN_OBSERVED_S
        );
        let c = GatewayConfig::from_yaml(
            "request_log: {path: /tmp/r.jsonl}\ncapacity: {min_observed_s: 0}\n",
            "g.yaml",
        )
        .unwrap();
        let log = c.request_log.unwrap();
        assert_eq!(
            (log.path.to_str(), log.max_bytes, log.keep),
            (Some("/tmp/r.jsonl"), 104_857_600, 5)
        );
        assert_eq!(c.capacity.min_observed_s, 0.0);
        let e = GatewayConfig::from_yaml("request_log: {max_bytes: 10}\n", "g.yaml").unwrap_err();
        assert_eq!(e.field, "request_log");
        assert!(e.message.contains("missing field `path`"), "{e}");
        // The message says what would be valid.
        let e =
            GatewayConfig::from_yaml("request_log: {path: r, keep: 5000}\n", "g.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "g.yaml: request_log.keep: 5000 is not valid; expected a whole number from 0 to 1000"
        );
    }

    /// Regression (issue 30, hardening 10): these workers were accepted, from the file and the
    /// admin API alike; now each is an error at its line, naming the field and what is valid.
    #[test]
    fn workers_with_unusable_urls_or_names_are_located_at_their_line() {
        for (entry, field, says) in [
            ("name: w, base_url: \"http://h:0\"", "base_url", "port"),
            ("name: w, base_url: \"http://h:99999\"", "base_url", "port"),
            (
                "name: w, base_url: \"http://u:p@h\"",
                "base_url",
                "user information",
            ),
            ("name: w, base_url: \"http://h/#f\"", "base_url", "fragment"),
            (
                "name: \"a\\nb\", base_url: \"http://h\"",
                "name",
                "control character",
            ),
            (
                "name: \"a\\u202Eb\", base_url: \"http://h\"",
                "name",
                "bidirectional",
            ),
            (
                "name: w, node: \"n\\u0007\", base_url: \"http://h\"",
                "node",
                "control",
            ),
            (
                "name: w, base_url: \"http://h\", model: \"m\\u2066\"",
                "model",
                "bidirectional",
            ),
        ] {
            let model = if entry.contains("model:") {
                ""
            } else {
                ", model: m"
            };
            let yaml = format!(
                "listen: 127.0.0.1:0\nworkers:\n  - {{{entry}{model}, context_window: 9}}\n"
            );
            let e = GatewayConfig::from_yaml(&yaml, "g.yaml").unwrap_err();
            assert_eq!(e.field, format!("workers[0].{field}"), "{entry}: {e}");
            assert_eq!(e.line, Some(3), "{entry}: {e}");
            assert!(e.to_string().contains(says), "{entry}: {e}");
        }
        let long = format!("n{}", "x".repeat(MAX_NAME_BYTES));
        let e = GatewayConfig::from_yaml(
            &format!("{WORKER}}}\n").replace("name: a", &format!("name: {long}")),
            "g.yaml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("at most 256"), "{e}");
    }

    #[test]
    fn a_missing_file_is_a_located_error() {
        let e = GatewayConfig::load(Path::new("/nonexistent/g.yaml")).unwrap_err();
        assert_eq!(e.file, "/nonexistent/g.yaml");
        assert!(e.message.starts_with("cannot read"), "{e}");
    }
}
