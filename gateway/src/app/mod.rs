//! The app, at the top of the gateway's floor plan: it builds each feature's state from the
//! configuration ([`shared::Shared`] composes them), serves the HTTP routes on the listeners
//! and starts the background tasks. Nothing below imports it but the handlers and tasks that
//! are handed its state.

pub(crate) mod settings;
pub(crate) mod shared;

use crate::config;
use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::logging::{self, log};
use crate::routing::{HealthRule, Routing};
use crate::{
    admin, admin_page, clock, health, metrics, persist, probe, proxy, replicas, reqlog, server,
    signals, supervise, tokens, upstream,
};
use axum::Router as HttpRouter;
use axum::routing::{get, post};
use routelab_policies::Router;
use settings::Settings;
use shared::Shared;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running gateway. Dropping it (or [`RunningGateway::kill`]) stops everything at once,
/// without a graceful shutdown — as a `SIGKILL` would, short of the process exit.
pub struct RunningGateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shutdown: Option<watch::Sender<bool>>,
    server: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    connections: Arc<server::ConnectionStats>,
    request_log: Option<Arc<reqlog::RequestLog>>,
}

impl RunningGateway {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `/admin` is served when `admin_listen` is set (else on [`Self::local_addr`]).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Client connection counters (open, rejected at the cap).
    pub fn connections(&self) -> &server::ConnectionStats {
        &self.connections
    }

    /// Stop accepting, let in-flight requests finish, flush the request log, stop the
    /// background tasks.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.flush_request_log().await;
        // Drop aborts the background tasks.
    }

    /// Wait until every request log line of a request that has ended is written and flushed
    /// (nothing to do without a log).
    pub async fn flush_request_log(&self) {
        if let Some(log) = &self.request_log {
            log.sync().await;
        }
    }

    /// Stop at once, without a graceful shutdown.
    pub fn kill(self) {}

    /// Wait until the server stops (it stops only on [`RunningGateway::shutdown`] or an error).
    pub async fn wait(&mut self) {
        if let Some(server) = self.server.as_mut() {
            let _ = server.await;
            self.server = None;
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The state file as start reads it: the directory it is written in must exist, and the
/// file, if there is one yet, must be a state file (entries that are not valid are ignored and
/// logged). `--check` reads it the same way ([`check`]).
fn load_state(
    config: &GatewayConfig,
    router: &Router,
    clock: &clock::Clock,
) -> Result<Option<routelab_policies::weights::PersistedProbeState>, GatewayError> {
    let Some(path) = &config.state_file else {
        return Ok(None);
    };
    persist::check_directory(path).map_err(|reason| {
        routelab_policies::InputError::new(config.origin(), "state_file", reason.to_string()).valid(
            "a file in an existing directory (the file itself is created at the first write)",
        )
    })?;
    Ok(persist::load(
        path,
        clock,
        persist::pin_range(router.config()),
    )?)
}

/// What start would refuse beyond the configuration itself, without starting: the state file
/// read as start reads it (a corrupt one fails here as it fails the start), and the request
/// log's directory. For `routelab-gateway --check`.
pub fn check(config: &GatewayConfig) -> Result<(), GatewayError> {
    config.validate()?;
    Settings::from_config(config)?;
    let router = config.router()?;
    load_state(config, &router, &clock::Clock::scaled(config.clock_scale))?;
    if let Some(log) = &config.request_log {
        let dir = match log.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            return Err(routelab_policies::InputError::new(
                config.origin(),
                "request_log.path",
                format!("the directory `{}` does not exist", dir.display()),
            )
            .valid("a writable file in an existing directory")
            .into());
        }
    }
    Ok(())
}

/// Build the router, restore the state file, register the configured workers.
fn build(config: &GatewayConfig, settings: Settings) -> Result<Arc<Shared>, GatewayError> {
    let clock = clock::Clock::scaled(config.clock_scale);
    // The policy with the configuration's SLO handed to it, as the simulator hands its
    // scenario's.
    let mut router = config.router()?;
    if let Some(state) = load_state(config, &router, &clock)?
        && let Some(path) = &config.state_file
    {
        log(
            "state_loaded",
            &[
                ("path", &path.display().to_string()),
                ("cached", &state.cache.len().to_string()),
                ("pins", &state.pins.len().to_string()),
            ],
        );
        router.import_state(state);
    }
    // What the state file holds as far as this gateway knows: its later writes merge only what
    // changed from here (other replicas may share the file).
    let loaded = router.strategy().export_state().unwrap_or_default();
    let connect_timeout = config::secs(
        config.origin(),
        "upstream.connect_timeout_s",
        config.upstream.connect_timeout_s,
    )?;
    let client = upstream::client(connect_timeout, config.upstream.max_idle_per_worker);
    let fresh = upstream::client(connect_timeout, 0);
    let request_log = match &config.request_log {
        Some(l) => Some(Arc::new(reqlog::RequestLog::open(l.settings()).map_err(
            |e| {
                routelab_policies::InputError::new(
                    config.origin(),
                    "request_log.path",
                    format!("cannot open `{}` for appending: {e}", l.path.display()),
                )
                .valid("a writable file in an existing directory")
            },
        )?)),
        None => None,
    };
    let tokenizers = tokens::Tokenizers::load(
        &config.models,
        &tokens::config_base(config.origin()),
        config.origin(),
    )?;
    let bus = settings.replicas.clone().map(replicas::Bus::new);
    let health = HealthRule {
        config: settings.health.clone(),
        ejection_enabled: !settings.health_interval.is_zero(),
    };
    let bodies = proxy::budget::BodyBudget::new(settings.max_buffered_bodies);
    let shared = Arc::new(Shared {
        state_file: persist::writer::StateWriter::new(settings.state_file.clone(), loaded),
        settings,
        routing: Arc::new(Routing::new(clock, router, config.seed, health)),
        client,
        fresh,
        global: Default::default(),
        connections: Arc::default(),
        bodies,
        request_log,
        signals: Default::default(),
        tokenizers,
        bus,
        drain: Default::default(),
    });
    {
        let mut core = shared.routing.core();
        let now = shared.routing.clock.now();
        for w in &config.workers {
            core.add_worker(now, w.clone())?;
        }
    }
    Ok(shared)
}

/// The HTTP routes.
fn app(shared: Arc<Shared>) -> HttpRouter {
    let admin_routes = HttpRouter::new()
        .route("/admin/workers", get(admin::list).post(admin::add))
        .route(
            "/admin/workers/{name}",
            axum::routing::delete(admin::remove),
        )
        .route("/admin/workers/{name}/drain", post(admin::drain))
        .route("/admin/workers/{name}/undrain", post(admin::undrain))
        .route("/admin/workers/{name}/pin", post(admin::pin))
        .route("/admin/workers/{name}/unpin", post(admin::unpin))
        .route("/admin/workers/{name}/reprobe", post(admin::reprobe))
        .route("/admin/capacity", get(admin::capacity));
    // Only with a `replicas:` block: without one the paths are what they were.
    let admin_routes = if shared.bus.is_some() {
        admin_routes.route("/admin/replicas", get(admin::replicas))
    } else {
        admin_routes
    };
    let admin_routes = admin_routes.route_layer(axum::middleware::from_fn_with_state(
        admin::AdminToken(shared.settings.admin_token.clone()),
        admin::require_token,
    ));
    HttpRouter::new()
        .route("/v1/chat/completions", post(proxy::chat))
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/models", get(proxy::models))
        .route("/metrics", get(metrics::handler))
        .route("/health", get(|| async { "ok\n" }))
        .route("/admin", get(admin_page::page))
        .merge(admin_routes)
        // After every route: the 405 fallback is set on the routes registered so far.
        .fallback(proxy::unknown_path)
        .method_not_allowed_fallback(proxy::method_not_allowed)
        // Each listener adds its layers around these, the rejection counter outermost
        // (`server::scoped`).
        .with_state(shared)
}

/// The gateway's HTTP service without a listener or background tasks (no probe runner, no health
/// checks): one request in, one response out, through every per-request layer the listener
/// applies. For benches and embedding; [`start`] serves the same routes on a socket.
pub struct Handler {
    routes: axum::Router,
}

impl Handler {
    /// Build the router, restore the state file and register the configured workers, as
    /// [`start`] does.
    pub fn new(config: GatewayConfig) -> Result<Handler, GatewayError> {
        config.validate()?;
        let settings = Settings::from_config(&config)?;
        let limits = settings.server;
        let shared = build(&config, settings)?;
        Ok(Handler {
            routes: server::scoped(
                app(shared.clone()),
                server::Scope::All,
                limits,
                shared.global.clone(),
            ),
        })
    }

    /// Answer one request.
    pub async fn call<B>(&self, req: hyper::Request<B>) -> axum::response::Response
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let service = hyper_util::service::TowerToHyperService::new(self.routes.clone());
        match hyper::service::Service::call(&service, req).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// Bind `config.listen` and start.
pub async fn start(config: GatewayConfig) -> Result<RunningGateway, GatewayError> {
    let listener =
        TcpListener::bind(&config.listen)
            .await
            .map_err(|error| GatewayError::Listen {
                addr: config.listen.clone(),
                error,
            })?;
    start_on(config, listener).await
}

/// Start on an already bound listener (tests bind port 0); `admin_listen`, when set, is bound
/// here.
pub async fn start_on(
    config: GatewayConfig,
    listener: TcpListener,
) -> Result<RunningGateway, GatewayError> {
    config.validate()?;
    if let Some(token) = &config.admin_token {
        logging::register_secret(token.expose());
    }
    let settings = Settings::from_config(&config)?;
    let limits = settings.server;
    let shared = build(&config, settings)?;
    let addr = listener.local_addr().map_err(GatewayError::LocalAddr)?;
    let admin_listener = bind_admin(&config).await?;
    let admin_addr = match &admin_listener {
        Some(l) => Some(l.local_addr().map_err(GatewayError::LocalAddr)?),
        None => None,
    };
    let (tx, rx) = watch::channel(false);
    let server = serve_listeners(&shared, listener, admin_listener, limits, rx);
    let tasks = start_background(&shared);
    log_started(&config, &shared, addr, admin_addr, limits);
    Ok(RunningGateway {
        addr,
        admin_addr,
        shutdown: Some(tx),
        server: Some(server),
        tasks,
        connections: shared.connections.clone(),
        request_log: shared.request_log.clone(),
    })
}

/// The admin API's own listener, when the configuration gives it an address of its own.
async fn bind_admin(config: &GatewayConfig) -> Result<Option<TcpListener>, GatewayError> {
    let Some(admin) = &config.admin_listen else {
        return Ok(None);
    };
    TcpListener::bind(admin)
        .await
        .map(Some)
        .map_err(|error| GatewayError::Listen {
            addr: admin.clone(),
            error,
        })
}

/// Serve the routes until `shutdown`: everything on `listener`, or the public routes there and
/// the admin routes on `admin` when the admin API listens apart.
fn serve_listeners(
    shared: &Arc<Shared>,
    listener: TcpListener,
    admin: Option<TcpListener>,
    limits: server::Limits,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let connections = shared.connections.clone();
    let routes = app(shared.clone());
    let public_scope = if admin.is_some() {
        server::Scope::Public
    } else {
        server::Scope::All
    };
    let public = server::serve(
        listener,
        server::scoped(routes.clone(), public_scope, limits, shared.global.clone()),
        limits,
        connections.clone(),
        (shutdown.clone(), shared.drain.clone()),
    );
    let admin = admin.map(|l| {
        server::serve(
            l,
            server::scoped(routes, server::Scope::Admin, limits, shared.global.clone()),
            limits,
            connections,
            (shutdown, shared.drain.clone()),
        )
    });
    tokio::spawn(async move {
        match admin {
            Some(admin) => {
                tokio::join!(public, admin);
            }
            None => public.await,
        }
    })
}

/// The supervised background tasks: the probes, the health ejection when it is on, the engine
/// signals, and the replicas' bus when there is one.
fn start_background(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    use supervise::{BackgroundTask, RESTART_PAUSE, supervise};
    let mut tasks = vec![supervise(
        shared.clone(),
        BackgroundTask::Probe,
        RESTART_PAUSE,
        probe::run,
    )];
    if shared.ejection_enabled() {
        tasks.push(supervise(
            shared.clone(),
            BackgroundTask::Health,
            RESTART_PAUSE,
            health::run,
        ));
    }
    tasks.extend(signals::start(shared));
    if let Some(bus) = &shared.bus {
        if let config::Credentials::Token(secret)
        | config::Credentials::UserPassword {
            password: secret, ..
        } = &bus.settings.credentials
        {
            logging::register_secret(secret.expose());
        }
        shared
            .global
            .bus_task
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tasks.push(supervise(
            shared.clone(),
            BackgroundTask::Bus,
            RESTART_PAUSE,
            replicas::task::run,
        ));
    }
    tasks
}

/// The `started` line (and `clock_scaled`, when policy time runs faster than wall time).
fn log_started(
    config: &GatewayConfig,
    shared: &Shared,
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    limits: server::Limits,
) {
    log(
        "started",
        &[
            ("listen", &addr.to_string()),
            (
                "admin_listen",
                &admin_addr.map(|a| a.to_string()).unwrap_or_default(),
            ),
            (
                "policy",
                &shared.routing.core().router.config().name.clone(),
            ),
            ("workers", &config.workers.len().to_string()),
            ("max_connections", &limits.max_connections.to_string()),
        ],
    );
    if config.clock_scale != 1.0 {
        log(
            "clock_scaled",
            &[
                ("scale", &config.clock_scale.to_string()),
                (
                    "warning",
                    "policy time runs faster than wall time: for tests and emulations only",
                ),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (the merge of the signals and hardening branches): a worker removed and added
    /// again takes its old slot back (`Router::revive`), so the engine report polled from the
    /// removed engine, and what the signal hub knew of it, must not describe the new one.
    #[test]
    fn a_worker_added_again_in_its_slot_starts_without_the_removed_engines_signals() {
        let config = GatewayConfig::from_yaml(
            "policy: least-load\nhealth: {interval_s: 0}\nworkers:\n  - {name: a, base_url: \"http://127.0.0.1:9\", model: m, context_window: 4096}\n",
            "t.yaml",
        )
        .unwrap();
        let shared = build(&config, Settings::from_config(&config).unwrap()).unwrap();
        let report = routelab_policies::EngineReport {
            kv_used_fraction: 0.5,
            queued_prompt_tokens: 1_000,
            running_tokens: 2_000,
            generation_tok_s: 300.0,
        };
        let now = shared.routing.clock.now();
        let id = {
            let mut core = shared.routing.core();
            let id = core.by_name["a"];
            core.router.engine_report(now, id, report);
            assert_eq!(core.router.signals(id).unwrap().report, Some(report));
            core.remove_worker(now, id);
            id
        };
        shared.signals.forget_worker(id);
        assert!(shared.signals.stream(id).is_none() && shared.signals.poll(id).is_none());
        let mut core = shared.routing.core();
        let again = core.add_worker(now, config.workers[0].clone()).unwrap();
        assert_eq!(again, id, "the worker took its slot back");
        assert_eq!(core.router.signals(id).unwrap().report, None);
    }

    /// Issue 41: the running gateway's router aims at the configuration's top-level SLO.
    #[test]
    fn the_built_gateway_aims_at_the_configured_slo() {
        let config =
            GatewayConfig::from_yaml("workers: []\nslo: {ttft_s: 30, tpot_s: 0.1}\n", "t.yaml")
                .unwrap();
        let shared = build(&config, Settings::from_config(&config).unwrap()).unwrap();
        let core = shared.routing.core();
        match &core.router.config().chooser {
            routelab_policies::Chooser::Predictive(p) => {
                assert_eq!((p.ttft_s, p.tpot_s), (Some(30.0), Some(0.1)));
            }
            other => panic!("the default policy is predictive, not {other:?}"),
        }
    }

    /// A supervised task that returns (rather than panics) ends its supervisor: nothing is
    /// restarted and no restart is counted for it, only for the panic before.
    #[tokio::test]
    async fn a_supervised_task_that_returns_ends_its_supervisor() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        use supervise::BackgroundTask;
        let config = GatewayConfig::from_yaml("workers: []\n", "t.yaml").unwrap();
        let shared = build(&config, Settings::from_config(&config).unwrap()).unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let task = supervise::supervise(
            shared.clone(),
            BackgroundTask::History,
            std::time::Duration::from_millis(5),
            move |_| {
                let first = r.fetch_add(1, SeqCst) == 0;
                async move { assert!(!first, "the first run dies") }
            },
        );
        tokio::time::timeout(std::time::Duration::from_secs(10), task)
            .await
            .expect("the supervisor ended")
            .unwrap();
        assert_eq!(runs.load(SeqCst), 2);
        let restarts = &shared.global.task_restarts;
        assert_eq!(restarts.of(BackgroundTask::History), 1);
        assert_eq!(restarts.of(BackgroundTask::KvStreams), 0);
    }

    /// Regression (issue 30, hardening 1): a panic ended the health or probe loop silently and
    /// for good. Supervised, it is counted and the task started again; aborting the
    /// supervisor (shutdown) ends the task it runs.
    #[tokio::test]
    async fn a_background_task_that_panics_is_counted_and_started_again() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
        use supervise::BackgroundTask;
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let config = GatewayConfig::from_yaml("health: {interval_s: 0}\n", "t.yaml").unwrap();
        let shared = build(&config, Settings::from_config(&config).unwrap()).unwrap();
        let (runs, dropped) = (
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (r, d) = (runs.clone(), dropped.clone());
        let task = supervise::supervise(
            shared.clone(),
            BackgroundTask::Health,
            std::time::Duration::from_millis(5),
            move |_| {
                let n = r.fetch_add(1, SeqCst);
                let flag = Flag(d.clone());
                async move {
                    let _flag = flag;
                    assert!(n >= 2, "run {n} broke");
                    std::future::pending::<()>().await;
                }
            },
        );
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while runs.load(SeqCst) < 3 {
            assert!(tokio::time::Instant::now() < deadline, "not restarted");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let restarts = &shared.global.task_restarts;
        assert_eq!(restarts.of(BackgroundTask::Health), 2);
        assert_eq!(restarts.of(BackgroundTask::Probe), 0);
        dropped.store(false, SeqCst);
        task.abort();
        let _ = task.await;
        while !dropped.load(SeqCst) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task outlived its supervisor"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(runs.load(SeqCst), 3);
    }
}
