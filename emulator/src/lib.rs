//! # routelab-emulator
//!
//! Sim-to-real for routelab: the production gateway in front of **emulated engines** whose
//! timing is the simulator's own hardware model, and a **real-time player** that replays a
//! scenario's traffic against it and measures it as the simulator does.
//!
//! - [`serve`]: an OpenAI-compatible server (`POST /v1/chat/completions`, `POST
//!   /v1/completions`, `GET /v1/models`, `GET /health`, `GET /metrics`, `GET /emulator/stats`,
//!   and what the field's routers read from a worker: SGLang's `GET /get_load`, vLLM's `POST
//!   /tokenize` and `POST /v1/{chat/,}completions/render` with the engine's own token ids;
//!   every answer names its worker in `x-routelab-worker`) driven by one
//!   [`routelab_sim::FluidEngine`] in real time — `speedup` times faster than the wall clock
//!   when asked, so a 300 s scenario plays in 30 s. First token at the model's first-token
//!   time (the end of the prefill), then one token per decode step of the sequence's
//!   progress, the last one at the model's completion: `N` tokens in all for `N` asked; round trips, cold start, degraded speed and the prefix cache as in the
//!   simulator. It always generates exactly `max_tokens` tokens (there is no end-of-sequence
//!   model; `min_tokens` and `ignore_eos` are accepted and checked). A request whose client
//!   goes away before its end (the connection closes) is aborted in the engine at once, as vLLM
//!   does, freeing its batch slot and KV (`aborted` in `/emulator/stats`). See
//!   [`EmulatorOptions`].
//! - [`start_fleet`]: one emulator per worker of a scenario, and a gateway configuration for
//!   them ([`EmulatedFleet::gateway_config`]).
//! - [`play`] / [`play_with`]: the scenario's traffic (closed-loop follow-ups included) sent in
//!   real time to a gateway as streaming requests; fills a [`routelab_sim::RunMetrics`] in
//!   scenario time, so the very same `summary.json` as `routelab run` can be written from it.
//! - [`bench`]: a closed-loop benchmark of any OpenAI-compatible endpoint (`routelab bench`),
//!   the player on a `closed_loop` scenario, written as `vllm bench serve --save-result` writes
//!   its results, so a sweep is `routelab profile fit --from vllm-bench`'s input as it is.
//!
//! ```no_run
//! # async fn demo(scenario: routelab_sim::Scenario) -> Result<(), Box<dyn std::error::Error>> {
//! let speedup = 10.0;
//! let fleet = routelab_emulator::start_fleet(&scenario.setup, speedup).await?;
//! let config = fleet.gateway_config("seed-v3", scenario.setup.seed, speedup);
//! let gateway = routelab_gateway::start_on(config, tokio::net::TcpListener::bind("127.0.0.1:0").await?).await?;
//! let url = format!("http://{}", gateway.local_addr());
//! let metrics = routelab_emulator::play(&scenario, scenario.setup.seed, &url, speedup).await?;
//! println!("{} of {} completed", metrics.completed, metrics.requests);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod bench;
mod driver;
mod fleet;
pub mod h2h;
mod kv;
mod openai;
mod player;
mod server;

pub use bench::{BenchConfig, BenchError, BenchResult, bench, unsaturated_rise};
pub use driver::{DriverCounters, EngineSnapshot};
pub use fleet::{EmulatedFleet, FleetOptions, start_fleet, start_fleet_with};
pub use player::{
    PlayError, PlayOptions, PlayReport, PlayedRequest, admin_weights_of, play, play_with,
    prompt_text, provenance_from_str,
};
pub use server::{Emulator, EmulatorError, EmulatorOptions, MetricsNames, serve};
