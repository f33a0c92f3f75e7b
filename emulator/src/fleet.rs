//! One emulator per worker of a scenario, and a gateway configuration in front of them.

use crate::server::{Emulator, EmulatorError, EmulatorOptions, serve};
use routelab_gateway::kv::{DEFAULT_DOWN_LOG_EVERY_S, KvEventsConfig};
use routelab_gateway::tokens::ModelConfig;
use routelab_gateway::{GatewayConfig, PolicyEntry, WorkerConfig};
use routelab_policies::streams::{ENGINE_STREAM, derive_seed};
use routelab_sim::SimSetup;
use std::time::Duration;
use tokio::net::TcpListener;

/// The emulated workers of a scenario, each on its own loopback port.
pub struct EmulatedFleet {
    emulators: Vec<Option<Emulator>>,
    workers: Vec<WorkerConfig>,
    tick_s: f64,
    models: Vec<ModelConfig>,
}

/// What the emulated engines publish beside their answers.
#[derive(Debug, Clone, Default)]
pub struct FleetOptions {
    /// Every emulator publishes its KV events (vLLM's wire format) and the gateway
    /// configuration subscribes to them (`kv_events` per worker).
    pub kv_events: bool,
    /// The model's tokenizer and chat template (absolute paths): every emulator counts prompts
    /// with them, and the gateway configuration names them for the scenario's model.
    pub tokenizer: Option<(std::path::PathBuf, Option<std::path::PathBuf>)>,
    /// Whose names the emulators' `/metrics` use.
    pub metrics: crate::server::MetricsNames,
}

/// Start one emulator per worker of `setup` on `127.0.0.1:0`: its hardware profile, overrides
/// (speed factor, cold start, noise, limits), round trip and context window, the engine seed
/// the simulator gives it (`derive_seed(seed, ENGINE_STREAM + i)`), all running `speedup`
/// times faster than wall time. Lifecycle events and late registrations are not replayed.
pub async fn start_fleet(setup: &SimSetup, speedup: f64) -> Result<EmulatedFleet, EmulatorError> {
    start_fleet_with(setup, speedup, &FleetOptions::default()).await
}

/// [`start_fleet`] with KV events and / or a tokenizer ([`FleetOptions`]).
pub async fn start_fleet_with(
    setup: &SimSetup,
    speedup: f64,
    options: &FleetOptions,
) -> Result<EmulatedFleet, EmulatorError> {
    let tokenizer = match &options.tokenizer {
        Some((t, c)) => Some(std::sync::Arc::new(
            routelab_gateway::tokens::ModelTokenizer::load(t, c.as_deref())
                .map_err(EmulatorError::Tokenizer)?,
        )),
        None => None,
    };
    let mut emulators = Vec::with_capacity(setup.workers.len());
    let mut workers = Vec::with_capacity(setup.workers.len());
    for (i, w) in setup.workers.iter().enumerate() {
        let mut opts = EmulatorOptions::new(w.profile.clone());
        opts.overrides = w.overrides.clone();
        opts.model = w.spec.model.clone();
        opts.rtt_ms = w.rtt_ns as f64 / 1e6;
        opts.speedup = speedup;
        opts.seed = derive_seed(setup.seed, ENGINE_STREAM + i as u64);
        opts.context_window = Some(w.spec.context_window);
        opts.tokenizer = tokenizer.clone();
        opts.kv_events = options.kv_events;
        opts.metrics = options.metrics;
        opts.worker_name = Some(w.spec.name.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let emu = serve(listener, opts).await?;
        let kv_events = emu.kv_endpoints().map(|(endpoint, replay)| KvEventsConfig {
            endpoint,
            replay_endpoint: Some(replay),
            topic: String::new(),
            heartbeat_s: 1.0,
            down_log_every_s: DEFAULT_DOWN_LOG_EVERY_S,
        });
        // The emulated engine's cache, as the simulator announces it.
        workers.push(WorkerConfig {
            kv_events,
            ..WorkerConfig::from_spec(&w.spec, emu.base_url())
        });
        emulators.push(Some(emu));
    }
    Ok(EmulatedFleet {
        emulators,
        workers,
        tick_s: setup.tick_ns as f64 / 1e9,
        models: options
            .tokenizer
            .iter()
            .map(|(t, c)| ModelConfig {
                name: setup
                    .workers
                    .first()
                    .map(|w| w.spec.model.clone())
                    .unwrap_or_default(),
                tokenizer: t.clone(),
                chat_template: c.clone(),
            })
            .collect(),
    })
}

impl EmulatedFleet {
    /// The workers as a gateway configures them (names, nodes, GPUs, context windows and
    /// launch arguments as in the scenario; base URLs of the emulators).
    pub fn workers(&self) -> &[WorkerConfig] {
        &self.workers
    }

    /// The emulator of a worker, unless killed.
    pub fn emulator(&self, name: &str) -> Option<&Emulator> {
        let i = self.workers.iter().position(|w| w.name == name)?;
        self.emulators[i].as_ref()
    }

    /// Crash a worker's emulator (see [`Emulator::kill`]); false if unknown or already dead.
    pub fn kill(&mut self, name: &str) -> bool {
        let Some(i) = self.workers.iter().position(|w| w.name == name) else {
            return false;
        };
        match self.emulators[i].take() {
            Some(e) => {
                e.kill();
                true
            }
            None => false,
        }
    }

    /// A gateway configuration for this fleet: `policy`, routing seed `seed`, listening on
    /// `127.0.0.1:0`, its clock scaled by `speedup` (so the policy's timers — probe cache TTL,
    /// re-probe when idle, live cadence — and measured throughputs are in model time, as in the
    /// simulator), and the router ticked / probes polled every scenario tick (`tick_s / speedup`
    /// of wall time) as the simulator does. Everything else (timeouts) is the gateway's default,
    /// in wall time.
    pub fn gateway_config(&self, policy: &str, seed: u64, speedup: f64) -> GatewayConfig {
        let mut c = GatewayConfig::from_yaml("workers: []\n", "emulated-fleet")
            .expect("the minimal gateway config is valid");
        c.listen = "127.0.0.1:0".into();
        c.policy = PolicyEntry::Name(policy.to_string());
        c.seed = seed;
        c.clock_scale = speedup;
        // In policy time: the gateway divides it by its clock scale.
        c.probe.poll_interval_s = self.tick_s;
        c.workers = self.workers.clone();
        c.models = self.models.clone();
        c
    }

    /// Stop every emulator, letting in-flight requests finish for up to `grace`.
    pub async fn shutdown(self, grace: Duration) {
        for e in self.emulators.into_iter().flatten() {
            e.shutdown(grace).await;
        }
    }
}
