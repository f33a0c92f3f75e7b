//! # routelab-sim
//!
//! A discrete-event simulator of heterogeneous LLM inference fleets, routed by the very same
//! `routelab-policies` crate a production gateway embeds.
//!
//! - [`hardware`]: worker hardware profiles (decode throughput over concurrency, prefill, KV,
//!   cold start), loaded from YAML, found by [`ProfileLookup`] (paths, directories, the bundled
//!   profiles, `ROUTELAB_HARDWARE`) and fitted from measurements ([`hardware::fit`]).
//! - [`worker`]: one inference engine as a fluid processor-sharing model ([`FluidEngine`]) or
//!   stepped as vLLM's scheduler steps it ([`StepEngine`]); [`Engine`] holds either
//!   ([`EngineMode`]).
//! - [`traffic`]: synthetic generators and streaming trace replay.
//! - [`event_loop`]: the event loop that ties a fleet, a router, probes and lifecycle events
//!   together ([`run`]).
//! - [`record`]: the one results recorder (request [`Outcome`] → run totals and
//!   [`RequestRecord`] rows, [`Status`]), shared with the emulator's real-time player.
//! - [`results`]: what a run measured ([`RunMetrics`], [`WorkerTotals`], [`TimelineRow`]).
//! - [`histogram`]: bounded-memory latency quantiles.
//! - [`footprint`]: what a scenario would hold in memory, checked before it runs.
#![forbid(unsafe_code)]

pub mod event_loop;
pub mod footprint;
pub mod hardware;
pub mod histogram;
pub mod record;
pub mod results;
pub mod scenario;
pub mod sweep;
pub mod traffic;
pub mod worker;

pub use event_loop::{
    Action, DEFAULT_BUS_LATENCY_S, Gateways, LifecycleEvent, MAX_REPLICAS, NO_TIME_LIMIT_NS, Share,
    SimError, SimSetup, Split, WorkerSetup, run,
};
pub use hardware::{HardwareProfile, ProfileLookup};
pub use record::{
    Outcome, Recorder, RequestRecord, RequestSink, RunWarning, Slo, Status, WarningReason,
};
pub use results::{Rejections, ReplicaTotals, RunMetrics, TimelineRow, WorkerTotals};
pub use scenario::{Scenario, ScenarioError, SeedMeaning, TrafficSpec};
pub use worker::{Engine, EngineMode, EngineOverrides, FluidEngine, InferenceEngine, StepEngine};
