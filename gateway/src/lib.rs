//! # routelab-gateway
//!
//! An OpenAI-compatible reverse proxy for LLM inference workers that routes with
//! [`routelab_policies`] — the very crate the `routelab` simulator runs — so a policy measured in
//! the lab is the policy in production.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: the body is parsed just enough to route
//!   (model, messages/prompt, max_tokens, stream; see [`prompt`]) and forwarded unchanged;
//!   SSE streams are passed through frame by frame.
//! - `GET /v1/models`: the union of the workers' models.
//! - `GET /metrics`: Prometheus text ([`metrics`]); `GET /health`: the gateway itself.
//! - `/admin/...`: workers, drain, pins, re-probe, the passive capacity curve ([`capacity`]),
//!   behind a bearer token ([`admin`]). With `admin_listen` it is served on a listener of its
//!   own, and the public one answers 404.
//! - An optional request log, one JSON line per finished request ([`reqlog`]).
//!
//! The HTTP server is our own accept loop ([`server`]): header and body read timeouts and a
//! connection cap per listener, graceful shutdown.
//!
//! Background tasks run the burst probe ([`probe`]), the health checks ([`health`]) and the
//! engine signals ([`signals`]: KV event streams, the engines' `/metrics`, the admin page's
//! history), each restarted, logged and counted if it panics ([`supervise`]); the probe cache
//! and pins are persisted atomically in a state file ([`persist`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), routelab_gateway::GatewayError> {
//! let config = routelab_gateway::GatewayConfig::load("gateway.yaml".as_ref())?;
//! let gateway = routelab_gateway::start(config).await?;
//! println!("listening on {}", gateway.local_addr());
//! gateway.shutdown().await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod admin;
mod admin_page;
mod app;
pub mod capacity;
pub mod clock;
pub mod config;
mod drain;
pub mod engine_metrics;
pub mod error;
pub mod health;
pub mod kv;
pub mod logging;
pub mod metrics;
pub mod persist;
pub mod probe;
pub mod prompt;
pub mod proxy;
pub mod replicas;
pub mod reqlog;
mod routing;
pub mod server;
pub mod session;
pub mod signals;
pub mod supervise;
pub mod tokens;
pub mod upstream;

pub use app::{Handler, RunningGateway, check, start, start_on};
pub use config::{GatewayConfig, Secret, SloConfig, WorkerConfig};
pub use error::{GatewayError, WorkerError};
pub use logging::log;
pub use routelab_policies::PolicyEntry;
