//! Head to head: one router at a time in front of the same emulated workers, the same traffic
//! played through each in real time.
//!
//! [`run_one`] starts a fresh fleet of emulators for a scenario (cold caches for every router),
//! puts one router in front of it — ours (`routelab-gateway`, in process) or one of the field's
//! (SGLang's model gateway `smg`, vLLM's `vllm-router`, each its own process from the venv
//! `deploy/field-routers/install.sh` fills) — plays the scenario through it with the real-time
//! player ([`crate::play_with`]), and stops everything it started on every way out: a router
//! process is killed by its process id when its guard is dropped, the gateway and the emulators
//! when theirs are. While the traffic plays a watchdog checks the router process and every
//! worker's `GET /health`; a router that exits or a worker that stops answering ends the run
//! with an error naming it.
//!
//! The field's routers run with their projects' documented defaults (retries, circuit breakers,
//! queues, thresholds), bound to `127.0.0.1` (the router and its Prometheus port), with
//! `HF_ENDPOINT` pointed at a closed loopback port so nothing is fetched from a model hub: the
//! rules are in `docs/head-to-head.md`. Every worker names itself in `x-routelab-worker`, which
//! both routers relay, so per-worker shares are measured the same way behind each.

use crate::fleet::{EmulatedFleet, FleetOptions, start_fleet_with};
use crate::player::{PlayError, PlayOptions, PlayReport, play_with};
use crate::server::EmulatorError;
use routelab_sim::Scenario;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// SGLang's model gateway's policies (`smg launch --help`, sglang-router 0.3.2), its default
/// first.
pub const SGLANG_POLICIES: &[&str] = &["cache_aware", "power_of_two", "round_robin", "random"];
/// vLLM router's policies (`vllm-router --help`, vllm-router 0.1.17), its default first.
pub const VLLM_POLICIES: &[&str] = &[
    "cache_aware",
    "power_of_two",
    "kv_aware",
    "consistent_hash",
    "sticky_least_loaded",
    "round_robin",
    "random",
];
/// Where `HF_ENDPOINT` points the field's routers: a loopback port nothing listens on, so a
/// tokenizer download fails at once instead of reaching a model hub.
pub const HUB_ENDPOINT: &str = "http://127.0.0.1:9";

/// Which router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    /// `routelab-gateway`, in process.
    Ours,
    /// SGLang's model gateway (`smg launch`, package `sglang-router`).
    Sglang,
    /// vLLM's router (`vllm-router`, package `vllm-router`).
    Vllm,
}

/// One router under test: `ours`, `ours:POLICY`, `sglang:POLICY` or `vllm:POLICY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterSpec {
    /// Which router.
    pub kind: RouterKind,
    /// Its policy: for ours a preset or composition (`None`: the gateway's default), for the
    /// field's routers one of their policy names.
    pub policy: Option<String>,
}

impl RouterSpec {
    /// Parse `ours`, `ours:POLICY`, `sglang[:POLICY]`, `vllm[:POLICY]` (a field router without
    /// a policy runs its default, `cache_aware` for both).
    pub fn parse(text: &str) -> Result<RouterSpec, H2hError> {
        let bad = |why: String| H2hError::BadRouter {
            given: text.to_string(),
            why,
        };
        let (name, policy) = match text.split_once(':') {
            Some((n, p)) => (n.trim(), Some(p.trim().to_string())),
            None => (text.trim(), None),
        };
        let field = |kind: RouterKind, valid: &[&str]| match policy.as_deref() {
            None => Ok(RouterSpec {
                kind,
                policy: Some(valid[0].to_string()),
            }),
            Some(p) if valid.contains(&p) => Ok(RouterSpec {
                kind,
                policy: Some(p.to_string()),
            }),
            Some(p) => Err(bad(format!(
                "`{p}` is not a policy of {name}; valid: {}",
                valid.join(", ")
            ))),
        };
        match name {
            "ours" => match policy {
                Some(p) if p.is_empty() => Err(bad("`ours:` names no policy".into())),
                p => Ok(RouterSpec {
                    kind: RouterKind::Ours,
                    policy: p,
                }),
            },
            "sglang" => field(RouterKind::Sglang, SGLANG_POLICIES),
            "vllm" => field(RouterKind::Vllm, VLLM_POLICIES),
            other => Err(bad(format!(
                "unknown router `{other}`; valid: ours, ours:POLICY, sglang:{{{}}}, vllm:{{{}}}",
                SGLANG_POLICIES.join("|"),
                VLLM_POLICIES.join("|")
            ))),
        }
    }

    /// Whether it is one of the field's routers (a process from the venv).
    pub fn is_field(&self) -> bool {
        self.kind != RouterKind::Ours
    }

    /// The lab's copy of this field router's rule, as the simulator runs it (a preset or a
    /// composition): `cache-aware` for both `cache_aware`s, power of two choices on in-flight
    /// requests, round robin, random, and for vLLM's `kv_aware` the KV-event router (`kv-cost`
    /// over the engines' KV events). `None` for ours and for the rules the lab carries no copy
    /// of (`consistent_hash`, `sticky_least_loaded`).
    ///
    /// The compositions name `no-affinity` and the cap `none`: the originals keep no prefix
    /// affinity and cap nothing. A composition's `none` is the cap's name, not the affinity's,
    /// so `equal/round-robin/none/none` (these copies' names before issue 39's third pass)
    /// carries the grammar's default `capacity` prefix affinity: its "round robin" kept each
    /// prefix on its holder, 13 points off the originals' 25/25/25/25 on h2h/mooncake-same
    /// and a quarter of their TTFT.
    pub fn copy_policy(&self) -> Option<&'static str> {
        if self.kind == RouterKind::Ours {
            return None;
        }
        match self.policy.as_deref() {
            None | Some("cache_aware") => Some("cache-aware"),
            Some("power_of_two") => Some("equal/p2c:random/no-affinity/none"),
            Some("round_robin") => Some("equal/round-robin/no-affinity/none"),
            Some("random") => Some("equal/random/no-affinity/none"),
            Some("kv_aware") if self.kind == RouterKind::Vllm => {
                Some("equal/kv-cost/no-affinity/none/kv-events")
            }
            _ => None,
        }
    }

    /// Every field router's policy, as `--routers` names them (`sglang:cache_aware`, …).
    pub fn every_field_router() -> Vec<String> {
        SGLANG_POLICIES
            .iter()
            .map(|p| format!("sglang:{p}"))
            .chain(VLLM_POLICIES.iter().map(|p| format!("vllm:{p}")))
            .collect()
    }

    /// The executable under the venv's `bin/`.
    fn program(&self) -> Option<&'static str> {
        match self.kind {
            RouterKind::Ours => None,
            RouterKind::Sglang => Some("smg"),
            RouterKind::Vllm => Some("vllm-router"),
        }
    }
}

impl fmt::Display for RouterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            RouterKind::Ours => "ours",
            RouterKind::Sglang => "sglang",
            RouterKind::Vllm => "vllm",
        };
        match &self.policy {
            Some(p) => write!(f, "{name}:{p}"),
            None => f.write_str(name),
        }
    }
}

/// How to run a head-to-head.
#[derive(Debug, Clone)]
pub struct H2hOptions {
    /// Scenario time runs this many times faster than wall time (the emulators' speed-up and
    /// our gateway's clock scale).
    pub speedup: f64,
    /// The venv holding the field's routers (`bin/smg`, `bin/vllm-router`).
    pub field_routers: PathBuf,
    /// How long a router may take to answer `GET /health` (and, for a field router, to list the
    /// model) after it is started.
    pub start_timeout: Duration,
    /// Wall-time limit of one request.
    pub request_timeout: Duration,
    /// The port the router under test listens on (default: a free one each run).
    pub router_port: Option<u16>,
    /// How often the watchdog checks the router process and the workers.
    pub watch_interval: Duration,
    /// Fault injection for tests: crash this worker's emulator this long after the traffic
    /// starts.
    pub kill_worker_after: Option<(String, Duration)>,
}

impl H2hOptions {
    /// Defaults: 60 s to start, 300 s per request, a free port, a check every 250 ms.
    pub fn new(speedup: f64, field_routers: impl Into<PathBuf>) -> H2hOptions {
        H2hOptions {
            speedup,
            field_routers: field_routers.into(),
            start_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(300),
            router_port: None,
            watch_interval: Duration::from_millis(250),
            kill_worker_after: None,
        }
    }

    /// The executable a field router runs from, if it is one.
    pub fn program(&self, router: &RouterSpec) -> Option<PathBuf> {
        router
            .program()
            .map(|p| self.field_routers.join("bin").join(p))
    }
}

/// What went wrong in a head-to-head; every variant names the router or worker concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum H2hError {
    /// A `--routers` entry is not a router.
    #[error("router `{given}`: {why}")]
    BadRouter {
        /// The entry.
        given: String,
        /// What is wrong and what would be valid.
        why: String,
    },
    /// The field's routers are not installed where looked for.
    #[error(
        "{router}: {path} is missing (the field's routers are not installed there); run deploy/field-routers/install.sh or point --field-routers at its venv"
    )]
    NotInstalled {
        /// The router.
        router: String,
        /// The executable looked for.
        path: PathBuf,
    },
    /// The router's port is taken.
    #[error("{router}: port {port} on 127.0.0.1 is in use ({error}); free it or choose another")]
    PortInUse {
        /// The router.
        router: String,
        /// The port.
        port: u16,
        /// The bind error.
        error: std::io::Error,
    },
    /// A router did not start.
    #[error("{router} did not start: {why} (its log: {})", .log.display())]
    RouterDidNotStart {
        /// The router.
        router: String,
        /// Why.
        why: String,
        /// Its output.
        log: PathBuf,
    },
    /// A router process ended while the traffic played.
    #[error("{router} exited mid-run ({status}) (its log: {})", .log.display())]
    RouterExited {
        /// The router.
        router: String,
        /// How it ended.
        status: ExitStatus,
        /// Its output.
        log: PathBuf,
    },
    /// A worker stopped answering while the traffic played.
    #[error("worker `{worker}` disappeared mid-run under {router}: {why}")]
    WorkerGone {
        /// The worker.
        worker: String,
        /// The router in front of it then.
        router: String,
        /// What its health check got.
        why: String,
    },
    /// Our gateway did not start.
    #[error("ours did not start: {0}")]
    Gateway(#[from] routelab_gateway::GatewayError),
    /// The emulated fleet could not be started.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    /// The play failed.
    #[error(transparent)]
    Play(#[from] PlayError),
    /// A file or socket operation failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        error: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> H2hError {
    let what = what.into();
    move |error| H2hError::Io { what, error }
}

/// A router process, killed by its process id (and reaped) when dropped.
struct RouterProcess {
    child: Child,
    label: String,
    log: PathBuf,
}

impl RouterProcess {
    /// `Some(status)` once it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The router in front of the fleet during one run.
enum Front {
    Ours(routelab_gateway::RunningGateway),
    Field(RouterProcess),
}

/// Play `scenario` for `seed` through `router` in front of a fresh emulated fleet, and stop
/// everything it started before returning, whatever happens. The router's output (a field
/// router's) is written to `log`.
pub async fn run_one(
    scenario: &Scenario,
    seed: u64,
    router: &RouterSpec,
    opts: &H2hOptions,
    log: &Path,
) -> Result<PlayReport, H2hError> {
    let label = router.to_string();
    let program = opts.program(router);
    if let Some(p) = &program
        && !p.is_file()
    {
        return Err(H2hError::NotInstalled {
            router: label,
            path: p.clone(),
        });
    }
    let listener = bind_router_port(&label, opts.router_port).await?;
    let addr = listener
        .local_addr()
        .map_err(io(format!("{label}: reading the router's address")))?;
    let setup = scenario.setup_for_seed(seed);
    let kv_events = router.kind == RouterKind::Vllm && router.policy.as_deref() == Some("kv_aware");
    let mut fleet = start_fleet_with(
        &setup,
        opts.speedup,
        &FleetOptions {
            kv_events,
            ..FleetOptions::default()
        },
    )
    .await?;
    let origin = Instant::now();
    let mut front = match program {
        None => {
            let mut config = fleet.gateway_config("predictive", seed, opts.speedup);
            config.policy = match &router.policy {
                Some(p) => routelab_gateway::PolicyEntry::Name(p.clone()),
                None => {
                    routelab_gateway::GatewayConfig::from_yaml("workers: []\n", "defaults")
                        .map_err(routelab_gateway::GatewayError::from)?
                        .policy
                }
            };
            Front::Ours(routelab_gateway::start_on(config, listener).await?)
        }
        Some(program) => {
            // The router binds the port itself: free it for it (a fixed port was checked free).
            drop(listener);
            let metrics_port = free_port(&label).await?;
            let args = field_args(router, &fleet, addr.port(), metrics_port);
            Front::Field(spawn_router(&label, &program, &args, log)?)
        }
    };
    let url = format!("http://{addr}");
    let client = crate::player::http_client(4);
    if let Front::Field(process) = &mut front {
        wait_ready(process, &client, &url, opts.start_timeout).await?;
    }
    let mut play = PlayOptions::new(opts.speedup);
    play.policy = label.clone();
    play.request_timeout = opts.request_timeout;
    play.origin = Some(match front {
        Front::Ours(_) => origin,
        Front::Field(_) => Instant::now(),
    });
    let report = {
        let played = play_with(scenario, seed, &url, &play);
        let watched = watchdog(&label, &mut front, &mut fleet, &client, opts);
        tokio::select! {
            r = played => r?,
            e = watched => return Err(e),
        }
    };
    // Orderly stop: the router first (nothing more reaches the workers), then the fleet.
    match front {
        Front::Ours(gateway) => gateway.shutdown().await,
        Front::Field(process) => drop(process),
    }
    fleet.shutdown(Duration::from_secs(1)).await;
    Ok(report)
}

/// The router's listening socket: the given port (refused with [`H2hError::PortInUse`] when
/// taken) or a free one.
async fn bind_router_port(label: &str, port: Option<u16>) -> Result<TcpListener, H2hError> {
    let p = port.unwrap_or(0);
    TcpListener::bind(("127.0.0.1", p))
        .await
        .map_err(|error| match port {
            Some(port) => H2hError::PortInUse {
                router: label.to_string(),
                port,
                error,
            },
            None => H2hError::Io {
                what: format!("{label}: binding a free loopback port"),
                error,
            },
        })
}

async fn free_port(label: &str) -> Result<u16, H2hError> {
    let l = bind_router_port(label, None).await?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io(format!("{label}: reading a free port")))
}

/// The field router's command line: loopback for the router and its metrics, the fleet's
/// workers, the policy; everything else at the project's default. `kv_aware` is given each
/// worker's KV event stream (and its replay endpoint) and the model's name.
fn field_args(
    router: &RouterSpec,
    fleet: &EmulatedFleet,
    port: u16,
    metrics_port: u16,
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    if router.kind == RouterKind::Sglang {
        a.push("launch".into());
    }
    for (k, v) in [
        ("--host", "127.0.0.1".to_string()),
        ("--port", port.to_string()),
        ("--prometheus-host", "127.0.0.1".to_string()),
        ("--prometheus-port", metrics_port.to_string()),
    ] {
        a.push(k.into());
        a.push(v);
    }
    a.push("--worker-urls".into());
    a.extend(fleet.workers().iter().map(|w| w.base_url.clone()));
    if let Some(p) = &router.policy {
        a.push("--policy".into());
        a.push(p.clone());
    }
    // vllm-router 0.1.17 refuses static KV event sources without a model identity.
    if let Some(w) = fleet.workers().iter().find(|w| w.kv_events.is_some()) {
        a.push("--kv-event-model".into());
        a.push(w.model.clone());
    }
    for w in fleet.workers() {
        if let Some(kv) = &w.kv_events {
            a.push("--kv-event-source".into());
            a.push(format!("{}={}", w.base_url, kv.endpoint));
            if let Some(replay) = &kv.replay_endpoint {
                a.push("--kv-event-replay-source".into());
                a.push(format!("{}={replay}", w.base_url));
            }
        }
    }
    a
}

fn spawn_router(
    label: &str,
    program: &Path,
    args: &[String],
    log: &Path,
) -> Result<RouterProcess, H2hError> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    let out = std::fs::File::create(log).map_err(io(format!("creating {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("opening {}", log.display())))?;
    let child = Command::new(program)
        .args(args)
        .env("HF_ENDPOINT", HUB_ENDPOINT)
        .env("HF_HUB_OFFLINE", "1")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| H2hError::RouterDidNotStart {
            router: label.to_string(),
            why: format!("cannot run {}: {e}", program.display()),
            log: log.to_path_buf(),
        })?;
    Ok(RouterProcess {
        child,
        label: label.to_string(),
        log: log.to_path_buf(),
    })
}

/// Wait until the router answers `GET /health` with 200 and lists a model on `GET /v1/models`
/// (its workers are registered; SGLang's lists `unknown` when a worker does not tell its model
/// name), within `timeout`; a router that exits first, or is not ready by then, did not start.
async fn wait_ready(
    process: &mut RouterProcess,
    client: &crate::player::HttpClient,
    url: &str,
    timeout: Duration,
) -> Result<(), H2hError> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        if let Some(status) = process.exited() {
            return Err(H2hError::RouterDidNotStart {
                router: process.label.clone(),
                why: format!("it exited at start ({status})"),
                log: process.log.clone(),
            });
        }
        match get(client, &format!("{url}/health")).await {
            Ok((200, _)) => match get(client, &format!("{url}/v1/models")).await {
                Ok((200, body)) if lists_a_model(&body) => return Ok(()),
                Ok((s, body)) => last = format!("GET /v1/models: {s} {}", clip(&body)),
                Err(e) => last = format!("GET /v1/models: {e}"),
            },
            Ok((s, body)) => last = format!("GET /health: {s} {}", clip(&body)),
            Err(e) => last = format!("GET /health: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(H2hError::RouterDidNotStart {
        router: process.label.clone(),
        why: format!("not ready within {timeout:?} (last: {last})"),
        log: process.log.clone(),
    })
}

/// An OpenAI model list with at least one model.
fn lists_a_model(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("data")?.as_array().map(|d| !d.is_empty()))
        .unwrap_or(false)
}

fn clip(s: &str) -> &str {
    let end = s.char_indices().nth(200).map_or(s.len(), |(i, _)| i);
    s[..end].trim()
}

/// A GET with a 2 s limit: status and body.
async fn get(client: &crate::player::HttpClient, url: &str) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let req = hyper::Request::get(uri)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .map_err(|e| e.to_string())?;
    let work = async {
        let r = client.request(req).await.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        let body = r.into_body().collect().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ))
    };
    tokio::time::timeout(Duration::from_secs(2), work)
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
}

/// Runs while the traffic plays and returns only on a failure: the router process exited, or a
/// worker's `GET /health` failed. Also carries out [`H2hOptions::kill_worker_after`].
async fn watchdog(
    label: &str,
    front: &mut Front,
    fleet: &mut EmulatedFleet,
    client: &crate::player::HttpClient,
    opts: &H2hOptions,
) -> H2hError {
    let start = Instant::now();
    let mut to_kill = opts.kill_worker_after.clone();
    let workers: Vec<(String, String)> = fleet
        .workers()
        .iter()
        .map(|w| (w.name.clone(), w.base_url.clone()))
        .collect();
    loop {
        tokio::time::sleep(opts.watch_interval).await;
        if let Some((name, after)) = &to_kill
            && start.elapsed() >= *after
        {
            fleet.kill(name);
            to_kill = None;
        }
        if let Front::Field(process) = front
            && let Some(status) = process.exited()
        {
            return H2hError::RouterExited {
                router: label.to_string(),
                status,
                log: process.log.clone(),
            };
        }
        for (name, base) in &workers {
            let why = match get(client, &format!("{base}/health")).await {
                Ok((200, _)) => continue,
                Ok((s, _)) => format!("GET /health answered {s}"),
                Err(e) => format!("GET /health: {e}"),
            };
            return H2hError::WorkerGone {
                worker: name.clone(),
                router: label.to_string(),
                why,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_specs_parse_and_name_what_is_valid() {
        let s = RouterSpec::parse("sglang:power_of_two").unwrap();
        assert_eq!(
            (s.kind, s.policy.as_deref()),
            (RouterKind::Sglang, Some("power_of_two"))
        );
        assert_eq!(s.to_string(), "sglang:power_of_two");
        assert_eq!(
            RouterSpec::parse("vllm").unwrap().to_string(),
            "vllm:cache_aware",
            "a field router without a policy runs its default"
        );
        assert_eq!(RouterSpec::parse("ours").unwrap().policy, None);
        assert_eq!(
            RouterSpec::parse("ours:seed-v3").unwrap().to_string(),
            "ours:seed-v3"
        );
        let e = RouterSpec::parse("sglang:kv_aware")
            .unwrap_err()
            .to_string();
        assert!(e.contains("valid: cache_aware, power_of_two"), "{e}");
        let e = RouterSpec::parse("nginx").unwrap_err().to_string();
        assert!(
            e.contains("unknown router `nginx`") && e.contains("vllm:{"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_router_program_names_the_install_step() {
        let opts = H2hOptions::new(10.0, "/nonexistent/venv");
        let p = opts.program(&RouterSpec::parse("vllm:round_robin").unwrap());
        assert_eq!(p, Some(PathBuf::from("/nonexistent/venv/bin/vllm-router")));
        assert_eq!(opts.program(&RouterSpec::parse("ours").unwrap()), None);
    }

    #[test]
    fn every_copy_of_a_field_router_is_a_policy_the_simulator_runs() {
        let mut copied = 0;
        for r in RouterSpec::every_field_router() {
            let spec = RouterSpec::parse(&r).unwrap();
            if let Some(c) = spec.copy_policy() {
                routelab_policies::PolicyConfig::from_name(c)
                    .unwrap_or_else(|e| panic!("{r}'s copy {c}: {e}"));
                copied += 1;
            }
        }
        assert_eq!(copied, 9, "all but consistent_hash and sticky_least_loaded");
        let kv = RouterSpec::parse("vllm:kv_aware").unwrap().copy_policy();
        assert_eq!(kv, Some("equal/kv-cost/no-affinity/none/kv-events"));
        assert_eq!(RouterSpec::parse("ours").unwrap().copy_policy(), None);
        assert_eq!(
            RouterSpec::parse("vllm:consistent_hash")
                .unwrap()
                .copy_policy(),
            None
        );
    }

    /// Issue 39, third pass: the originals keep no prefix affinity and no concurrency cap, and
    /// neither may their copies. `equal/round-robin/none/none` parsed with the grammar's
    /// default `capacity` affinity (a `none` is the cap's), which sent a prefix back to its
    /// holder: not round robin.
    #[test]
    fn the_copies_of_rules_without_affinity_or_cap_carry_neither() {
        use routelab_policies::{Affinity, Cap, PolicyConfig};
        for r in [
            "sglang:power_of_two",
            "sglang:round_robin",
            "sglang:random",
            "vllm:power_of_two",
            "vllm:round_robin",
            "vllm:random",
            "vllm:kv_aware",
        ] {
            let copy = RouterSpec::parse(r).unwrap().copy_policy().unwrap();
            let cfg = PolicyConfig::from_name(copy).unwrap();
            assert_eq!(
                (cfg.affinity, cfg.cap),
                (Affinity::None, Cap::None),
                "{r}'s copy {copy}"
            );
        }
    }
}
