//! # routelab-policies
//!
//! Routing and weight strategies for LLM inference gateways that serve one model name from
//! many heterogeneous workers. The same crate runs inside the `routelab` simulator and inside a
//! production gateway: it never reads a clock, never draws from a global RNG, never does I/O and
//! never depends on an async runtime. Time ([`Time`]) and randomness (`&mut impl Rng`) are
//! passed in.
//!
//! A policy ([`PolicyConfig`]) combines four parts:
//! - **weights** ([`WeightsConfig`]): `table`, `live`, `probe`, `oracle`, `equal`, `at-load`;
//! - **chooser** ([`Chooser`]): `p2c`, `sed`, `jsq`, `least-request`, `wrr`, `random`,
//!   `round-robin`, with a [`TieRule`]; and the field's routers as published (`cache-aware`,
//!   `least-load`, `sticky-until-saturated`, `pulsar`, `wait-and-widen`, `kv-cost`,
//!   `hit-minus-load`), which read router-local [`Signals`] and polled [`EngineReport`]s;
//!   and ours, `predictive`: predicted TTFT and TPOT per worker from its measured prefill speed
//!   and decode curve ([`capacity`]);
//! - **affinity** ([`Affinity`]): `none`, `raw`, `capacity` prefix-cache preference;
//! - **cap** ([`Cap`]): `none`, `flat`, `weighted`, with FIFO queueing at the host;
//!
//! and the **prefix knowledge** ([`PrefixKnowledge`]) behind the affinity and the field's
//! routers: `approximate` (bounded per worker by its cache size), `unbounded`, `kv-events`.
//!
//! ```
//! use rand::SeedableRng;
//! use rand::rngs::Xoshiro256PlusPlus;
//! use routelab_policies::{PolicyConfig, RouteRequest, Router, Time, WorkerSpec};
//!
//! let mut router = Router::new(PolicyConfig::preset("seed-v1").unwrap());
//! let spec = |name: &str, gpus: &[&str]| WorkerSpec {
//!     name: name.into(),
//!     node: name.into(),
//!     model: "gemma-27b".into(),
//!     gpu_names: gpus.iter().map(|g| g.to_string()).collect(),
//!     context_window: 32_768,
//!     launch_args: String::new(),
//!     cache_blocks: None,
//! };
//! let pair = router.register(Time::ZERO, spec("pair", &["RTX 4090", "RTX 4090"]));
//! let pro = router.register(Time::ZERO, spec("pro6000", &["RTX PRO 6000"]));
//! let model = router.model_id("gemma-27b").unwrap();
//! let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
//! let mut to_pair = 0;
//! for _ in 0..16 {
//!     let req = RouteRequest { model, context_tokens: 500, prefix: &[], prompt_tokens: 400, session: None };
//!     let d = router.route(Time::ZERO, &req, &mut rng).unwrap();
//!     if d.worker == pair { to_pair += 1 } else { assert_eq!(d.worker, pro) }
//! }
//! // The source's first finding: table weights 3.5 vs 1.0 send 12 of 16 to the slower pair.
//! assert_eq!(to_pair, 12);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capacity;
pub mod catalog;
mod chooser;
mod config;
mod error;
pub mod explain;
pub mod foresight;
pub mod histogram;
mod kv;
mod load_index;
pub mod located;
mod mirror;
mod predictive;
mod prefix;
mod router;
mod rules;
mod signals;
mod sita;
pub mod streams;
mod time;
pub mod weights;
mod worker;

pub use catalog::{PRESETS, Part};
pub use chooser::{Chooser, TieRule};
pub use config::{
    Affinity, AffinityUnits, Allowance, Cap, KNOWLEDGE_FIELD, PLAUSIBLE_SLO_S, PolicyConfig,
    PolicyEntry, PolicyRole, PrefixKnowledge, RawAffinity, RawCap, RawChooser, RawPolicy,
    RawWeights, SloBound, WeightsConfig, implausible_slo_bound,
};
pub use error::{AdminError, ConfigError, PrefillProbeTooLong, RouteError};
pub use explain::{Explanation, Predicted, Reason, Scored, ShownCandidate, ShownDecision};
pub use kv::KvEvent;
pub use located::InputError;
pub use predictive::PredictiveParams;
pub use prefix::PrefixIndex;
pub use router::{DEFAULT_REPLICA_SPREAD_S, Decision, RouteRequest, Router};
pub use rules::{DEFAULT_GENERATION_TOK_S, DEFAULT_INPUT_TOK_S};
pub use signals::{Charge, EngineReport, PREFIX_BLOCK_TOKENS, Signals};
pub use sita::{BandError, CutoffError, MAX_CUTOFFS, SitaParams};
pub use time::Time;
pub use weights::{
    Clamp, Completion, ProbeOrder, ProbePhase, ProbeResult, WeightChange, WeightEvent,
    WeightStrategy,
};
pub use worker::{
    Fleet, MAX_CACHE_BLOCKS, ModelId, Provenance, Weight, WorkerId, WorkerInfo, WorkerSpec,
    WorkerState,
};
