//! # routelab-sim
//!
//! A discrete-event simulator of heterogeneous LLM inference fleets, routed by the very same
//! `routelab-policies` crate a production gateway embeds.
//!
//! - [`hardware`]: worker hardware profiles (decode throughput over concurrency, prefill, KV,
//!   cold start), loaded from YAML.
//! - [`worker`]: one inference engine as a fluid processor-sharing model ([`EngineModel`]).
//! - [`traffic`]: synthetic generators and streaming trace replay.
//! - [`engine`]: the event loop that ties a fleet, a router, probes and lifecycle events
//!   together ([`run`]).
//! - [`histogram`]: bounded-memory latency quantiles.
#![forbid(unsafe_code)]

pub mod engine;
pub mod hardware;
pub mod histogram;
pub mod scenario;
pub mod sweep;
pub mod traffic;
pub mod worker;

pub use engine::{
    Action, LifecycleEvent, RequestRecord, RequestSink, RunMetrics, SimError, SimSetup, Slo,
    TimelineRow, WorkerSetup, WorkerTotals, run,
};
pub use hardware::HardwareProfile;
pub use scenario::{Scenario, ScenarioError, TrafficSpec};
pub use worker::{EngineModel, EngineOverrides};

/// Derive an independent seed for component `stream` from the root seed (SplitMix64 of both),
/// so that adding a component never shifts another's random stream.
pub fn derive_seed(root: u64, stream: u64) -> u64 {
    let mut z = root ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
