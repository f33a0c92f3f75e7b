//! What a simulator run is given besides the policy and the traffic: the fleet
//! ([`WorkerSetup`]), the scenario's lifecycle events ([`LifecycleEvent`]) and the periods and
//! limits of the run ([`SimSetup`]).

use super::replicas::Gateways;
use crate::HardwareProfile;
use crate::record::Slo;
use crate::traffic::TrafficError;
use crate::worker::{EngineMode, EngineOverrides};
use routelab_policies::WorkerSpec;
use std::sync::Arc;

/// The value of [`SimSetup::max_time_ns`] that means "no time limit" (far beyond any run, yet
/// with room to add intervals to it without overflow).
pub const NO_TIME_LIMIT_NS: u64 = u64::MAX / 4;

/// One worker of the simulated fleet.
#[derive(Debug, Clone)]
pub struct WorkerSetup {
    /// What it announces to the router.
    pub spec: WorkerSpec,
    /// Its hardware.
    pub profile: Arc<HardwareProfile>,
    /// Per-worker changes to the hardware model.
    pub overrides: EngineOverrides,
    /// How its engine is simulated (fluid or step-level).
    pub engine: EngineMode,
    /// Network round trip between gateway and worker, ns.
    pub rtt_ns: u64,
    /// When it registers, ns.
    pub register_at: u64,
}

/// Something that happens to a worker at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The engine restarts (in-flight requests fail). It is ready `ready_after_ns` later, and
    /// re-registers with the router `register_after_ns` after that, with `launch_args` if given.
    Restart {
        /// New launch arguments (`None`: unchanged).
        launch_args: Option<String>,
        /// Start-up time of the engine.
        ready_after_ns: u64,
        /// Delay between ready and registration (the source's probe ran 5 s after ready).
        register_after_ns: u64,
        /// Whether the fresh engine is cold.
        cold: bool,
    },
    /// The engine crashes: in-flight requests fail, it stays down until a `Restart`.
    Crash,
    /// The connection to the gateway drops (the engine keeps working).
    Disconnect,
    /// The connection comes back.
    Reconnect,
    /// The node manager restarts, keeping or losing its probe cache.
    NodeManagerRestart {
        /// Whether the cache survives.
        keep_cache: bool,
    },
    /// An administrator pins the weight.
    Pin(f64),
    /// An administrator clears the pin.
    Unpin,
    /// An administrator asks for a fresh probe.
    Reprobe,
    /// The node degrades or recovers: every rate is multiplied by this factor from now on.
    SetSpeed(f64),
    /// The worker is deregistered for good.
    Remove,
}

impl Action {
    /// The scenario's name of the action (`restart`, `pin`, `degrade`, …).
    pub const fn name(&self) -> &'static str {
        match self {
            Action::Restart { .. } => "restart",
            Action::Crash => "crash",
            Action::Disconnect => "disconnect",
            Action::Reconnect => "reconnect",
            Action::NodeManagerRestart { .. } => "node-manager-restart",
            Action::Pin(_) => "pin",
            Action::Unpin => "unpin",
            Action::Reprobe => "reprobe",
            Action::SetSpeed(_) => "degrade",
            Action::Remove => "remove",
        }
    }
}

/// A lifecycle event of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleEvent {
    /// When, ns.
    pub at: u64,
    /// Which worker (index into the fleet).
    pub worker: usize,
    /// What happens.
    pub action: Action,
}

/// Everything about a run except the policy and the traffic.
#[derive(Debug, Clone)]
pub struct SimSetup {
    /// Model name all traffic asks for.
    pub model: String,
    /// The fleet.
    pub workers: Vec<WorkerSetup>,
    /// Lifecycle events.
    pub events: Vec<LifecycleEvent>,
    /// Root seed; every component derives its own stream from it.
    pub seed: u64,
    /// Router tick period, ns.
    pub tick_ns: u64,
    /// Timeline sampling period, ns (0: no timeline).
    pub timeline_ns: u64,
    /// Hard stop, ns: nothing happens after it ([`NO_TIME_LIMIT_NS`]: none).
    pub max_time_ns: u64,
    /// SLO for attainment.
    pub slo: Slo,
    /// Concurrency at which the oracle reads each profile's true capacity.
    pub oracle_concurrency: f64,
    /// Re-route a request whose worker failed before its first token, at most this often.
    pub max_retries: u32,
    /// The gateway replicas ([`Gateways::ONE`]: one gateway).
    pub gateways: Gateways,
}

impl SimSetup {
    /// A setup with default periods: tick 1 s, timeline 10 s, no lifecycle events, no time
    /// limit.
    pub fn new(model: impl Into<String>, workers: Vec<WorkerSetup>, seed: u64) -> SimSetup {
        SimSetup {
            model: model.into(),
            workers,
            events: Vec::new(),
            seed,
            tick_ns: 1_000_000_000,
            timeline_ns: 10_000_000_000,
            max_time_ns: NO_TIME_LIMIT_NS,
            slo: Slo::default(),
            oracle_concurrency: 16.0,
            max_retries: 2,
            gateways: Gateways::ONE,
        }
    }

    /// The hard stop, ns, if the run has one.
    pub fn time_limit_ns(&self) -> Option<u64> {
        (self.max_time_ns < NO_TIME_LIMIT_NS).then_some(self.max_time_ns)
    }
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The traffic source failed (bad trace row, unreadable file).
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// The setup is impossible.
    #[error("{0}")]
    Setup(String),
}
