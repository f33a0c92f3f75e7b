//! Scenario files as written: serde structs that mirror the YAML, unknown fields rejected.

use crate::traffic::LengthDist;
use crate::traffic::catalog::{self, TrafficKind};
use routelab_policies::PolicyEntry;
use serde::Deserialize;
use serde_saphyr::Spanned;

// ----- raw ------------------------------------------------------------------------------------

/// A scenario as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    /// Display name (default: the file stem).
    pub name: Option<String>,
    /// What the scenario shows.
    pub description: Option<String>,
    /// Root seed (default 1).
    pub seed: Option<u64>,
    /// Model name every request asks for (default `model`).
    pub model: Option<String>,
    /// Directory searched first for profile names (relative to the file); then the nearest
    /// `hardware/` beside or above the file, the bundled profiles and `ROUTELAB_HARDWARE`.
    pub hardware_dir: Option<String>,
    /// The workers.
    pub fleet: Vec<Spanned<RawWorker>>,
    /// Traffic sources, merged by time (required; absent in a fleet file, whose traffic
    /// `routelab plan --trace` gives).
    pub traffic: Option<Vec<Spanned<RawTraffic>>>,
    /// Lifecycle events.
    #[serde(default)]
    pub events: Vec<Spanned<RawEvent>>,
    /// Policies to run (default: every preset).
    #[serde(default)]
    pub policies: Vec<Spanned<PolicyEntry>>,
    /// Service-level objective.
    pub slo: Option<RawSlo>,
    /// Router tick period, s (default 1).
    pub tick_s: Option<f64>,
    /// Timeline sampling period, s (default 10; 0 disables).
    pub timeline_s: Option<f64>,
    /// Hard stop, s (default: none).
    pub max_duration_s: Option<f64>,
    /// Re-routes of a request whose worker failed before its first token (default 2).
    pub max_retries: Option<u32>,
    /// Concurrency at which the oracle reads true capacity (default 16, the probe's).
    pub oracle_concurrency: Option<f64>,
    /// Several gateway replicas behind an L4 balancer (default: one gateway).
    pub gateways: Option<Spanned<RawGateways>>,
    /// How every worker's engine is simulated: `fluid` (default) or `step`.
    pub engine: Option<Spanned<String>>,
}

/// The `gateways:` block as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateways {
    /// How many replicas (default 1).
    pub replicas: Option<f64>,
    /// The balancer's rule: `random`, `hash-by-session` or `round-robin` (default).
    pub split: Option<String>,
    /// What the replicas share: `none` (default), `probes`, `probes-and-load`, `engine-truth`,
    /// `dispatch-stream` or `route-and-reserve`.
    pub share: Option<String>,
    /// `probes-and-load`: period of the in-flight exchange, s; `engine-truth`: period of the
    /// engines' poll (required there, only there).
    pub sync_interval_s: Option<f64>,
    /// `dispatch-stream`, `route-and-reserve`: one hop of the bus, s (default
    /// `DEFAULT_BUS_LATENCY_S`; only there).
    pub bus_latency_s: Option<f64>,
    /// `dispatch-stream`: each replica holds an arriving request a uniform random time up to
    /// this many seconds before routing it (default 0; only there).
    pub spread_s: Option<f64>,
}

/// One worker entry (or `count` identical ones).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorker {
    /// Name (with `-1`, `-2`, … appended when `count` > 1).
    pub name: String,
    /// Hardware profile: a path (containing `/` or ending in `.yaml` / `.yml`, relative to the
    /// file) or a name found by [`ProfileLookup`].
    pub profile: String,
    /// How many identical workers.
    pub count: Option<u32>,
    /// Node name (default: the worker name).
    pub node: Option<String>,
    /// GPU names announced to the router (default: the profile's).
    pub gpu_names: Option<Vec<String>>,
    /// Context window (default: the profile's).
    pub context_window: Option<u32>,
    /// Launch arguments.
    pub launch_args: Option<String>,
    /// Round trip to the gateway, ms.
    pub rtt_ms: Option<f64>,
    /// Degraded node: every rate × this.
    pub speed_factor: Option<f64>,
    /// Start with a cold engine.
    pub start_cold: Option<bool>,
    /// Registration time, s.
    pub register_at_s: Option<f64>,
    /// Engine's max running sequences (default: the profile's).
    pub max_running: Option<u32>,
    /// KV capacity in tokens (default: the profile's).
    pub kv_capacity_tokens: Option<u64>,
    /// Noise.
    pub noise: Option<RawNoise>,
    /// How its engine is simulated: `fluid` or `step` (default: the scenario's `engine`).
    pub engine: Option<Spanned<String>>,
}

/// Seeded noise of a worker.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawNoise {
    /// Coefficient of variation of each request's work.
    pub request_cv: Option<f64>,
    /// Coefficient of variation of the engine speed per epoch.
    pub epoch_cv: Option<f64>,
    /// Epoch length, s.
    pub epoch_s: Option<f64>,
}

/// A duration distribution in seconds.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawSeconds {
    /// Always this long.
    Fixed(f64),
    /// Uniform between min and max.
    Uniform {
        /// Shortest.
        min: f64,
        /// Longest.
        max: f64,
    },
    /// Exponential with this mean.
    Exponential {
        /// Mean.
        mean: f64,
    },
}

/// One traffic source.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawTraffic {
    /// N requests at one instant, optionally repeated.
    Burst {
        /// When, s.
        at_s: Option<f64>,
        /// Requests per burst.
        size: u32,
        /// Bursts.
        repeats: Option<u32>,
        /// Period between bursts, s.
        period_s: Option<f64>,
        /// Prompt tokens.
        prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// Poisson arrivals.
    Poisson {
        /// Start, s.
        start_s: Option<f64>,
        /// Mean rate, requests/s.
        rate_per_s: f64,
        /// Stop after, s.
        duration_s: Option<f64>,
        /// Stop after this many.
        count: Option<u64>,
        /// Prompt tokens.
        prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// Sinusoidal rate.
    Diurnal {
        /// Start, s.
        start_s: Option<f64>,
        /// Lowest rate.
        min_rate_per_s: f64,
        /// Highest rate.
        max_rate_per_s: f64,
        /// Period, s.
        period_s: f64,
        /// Phase, s.
        phase_s: Option<f64>,
        /// Stop after, s.
        duration_s: Option<f64>,
        /// Stop after this many.
        count: Option<u64>,
        /// Prompt tokens.
        prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// Sparse bursts with idle gaps.
    OnOff {
        /// Start, s.
        start_s: Option<f64>,
        /// Requests per burst.
        burst_size: LengthDist,
        /// A burst's requests spread over this window, s.
        window_s: f64,
        /// Idle gap between bursts, s.
        gap_s: RawSeconds,
        /// Stop after, s.
        duration_s: Option<f64>,
        /// Stop after this many.
        count: Option<u64>,
        /// Prompt tokens.
        prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// Users who wait for an answer and think before the next request.
    ClosedLoop {
        /// Start, s.
        start_s: Option<f64>,
        /// Users.
        users: u32,
        /// Users start spread over this ramp, s.
        ramp_s: Option<f64>,
        /// Think time, s.
        think_s: RawSeconds,
        /// Stop after, s.
        duration_s: Option<f64>,
        /// Stop after this many.
        count: Option<u64>,
        /// Prompt tokens.
        prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// Multi-turn conversations with growing shared prefixes.
    Conversations {
        /// Start, s.
        start_s: Option<f64>,
        /// Conversation start rate.
        rate_per_s: f64,
        /// Number of conversations.
        conversations: u64,
        /// Turns per conversation.
        turns: LengthDist,
        /// New user tokens per turn.
        user_tokens: LengthDist,
        /// Output tokens per turn.
        output: LengthDist,
        /// Think time between turns, s.
        think_s: RawSeconds,
        /// Shared system prompt, tokens.
        system_prompt_tokens: Option<u32>,
        /// Conversation ends when the prompt would exceed this.
        max_prompt_tokens: Option<u32>,
    },
    /// A mix of long and short prompts.
    LongPromptMix {
        /// Start, s.
        start_s: Option<f64>,
        /// Rate.
        rate_per_s: f64,
        /// Stop after, s.
        duration_s: Option<f64>,
        /// Stop after this many.
        count: Option<u64>,
        /// Fraction of long prompts.
        long_fraction: f64,
        /// Long prompt tokens.
        long_prompt: LengthDist,
        /// Short prompt tokens.
        short_prompt: LengthDist,
        /// Output tokens.
        output: LengthDist,
    },
    /// A family of realistic traffic (`docs/scenarios.md`, Traffic families).
    Family {
        /// `chat`, `code`, `rag`, `agentic` or `batch-day`.
        kind: String,
        /// Start, s.
        start_s: Option<f64>,
        /// New sessions or requests per second.
        rate_per_s: f64,
        /// How long new sessions and requests start, s.
        duration_s: f64,
        /// Each request's new tokens (default: the family's).
        prompt: Option<LengthDist>,
        /// Output tokens (default: the family's).
        output: Option<LengthDist>,
        /// Turns per session (chat, agentic).
        turns: Option<LengthDist>,
        /// Between a turn's completion and the next turn, s (chat, agentic).
        think_s: Option<RawSeconds>,
        /// A session ends before a turn whose prompt would exceed this (chat, agentic).
        max_prompt_tokens: Option<u32>,
        /// How many shared prefixes requests draw from (chat, rag, agentic).
        shared_prompts: Option<u32>,
        /// A shared prefix's length (chat, rag, agentic; batch-day: a job's instructions).
        shared_prompt_tokens: Option<LengthDist>,
        /// Zipf exponent of the shared prefixes' popularity (chat, rag, agentic).
        zipf_s: Option<f64>,
        /// Coefficient of variation of the gaps between requests (code).
        cv: Option<f64>,
        /// Agent sessions launched together (agentic).
        burst_size: Option<LengthDist>,
        /// Share of requests from batch jobs (batch-day).
        batch_fraction: Option<f64>,
        /// Requests per batch job (batch-day).
        batch_size: Option<LengthDist>,
    },
    /// Replay of a trace file.
    Trace {
        /// Path, relative to the scenario file.
        path: String,
        /// `azure`, `mooncake`, `gateway-log`, `otel-genai`, or `jsonl` / `csv` with a
        /// `mapping` (default: from the extension).
        format: Option<String>,
        /// Which key / column holds what, for a `jsonl` or `csv` log.
        mapping: Option<RawTraceMapping>,
        /// Multiply inter-arrival times.
        time_scale: Option<f64>,
        /// Multiply the rate.
        rate_scale: Option<f64>,
        /// At most this many rows.
        limit: Option<u64>,
        /// Skip this many rows first.
        skip_rows: Option<u64>,
        /// Shift all arrivals, s.
        start_offset_s: Option<f64>,
        /// `error` (default) or `skip` (counted, never silent).
        on_bad_row: Option<String>,
        /// What a seed means: `none` (every seed replays the trace as recorded), `block` (each
        /// seed a block-bootstrap resample, block length chosen from the trace) or `{ block_s:
        /// N }`. Default: `none` under `run` and `check`, `block` under `compare`, `capacity`,
        /// `sweep` and `replicas`.
        resample: Option<RawResample>,
    },
}

impl RawTraffic {
    /// Its entry in the catalog of traffic kinds (the key it was written under).
    pub fn kind(&self) -> &'static TrafficKind {
        let name = match self {
            RawTraffic::Burst { .. } => "burst",
            RawTraffic::Poisson { .. } => "poisson",
            RawTraffic::Diurnal { .. } => "diurnal",
            RawTraffic::OnOff { .. } => "on_off",
            RawTraffic::ClosedLoop { .. } => "closed_loop",
            RawTraffic::Conversations { .. } => "conversations",
            RawTraffic::LongPromptMix { .. } => "long_prompt_mix",
            RawTraffic::Family { .. } => "family",
            RawTraffic::Trace { .. } => "trace",
        };
        catalog::find(name).expect("every traffic kind is in the catalog")
    }
}

/// A trace's `resample:` as written.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawResample {
    /// `none` or `block`.
    Name(String),
    /// `{ block_s: N }`.
    Block {
        /// Block length, s.
        block_s: f64,
    },
}

/// A trace's field mapping as written (`docs/traces.md`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraceMapping {
    /// Arrival time key / column.
    pub arrival: Option<String>,
    /// What the arrival holds (default `auto`).
    pub arrival_unit: Option<String>,
    /// Prompt length key / column, tokens.
    pub prompt_tokens: Option<String>,
    /// Output length key / column, tokens.
    pub output_tokens: Option<String>,
    /// Session id key / column: a session's requests share a growing prefix.
    pub session_id: Option<String>,
    /// Prefix-block hashes key / column (one per 512-token block).
    pub prefix_hashes: Option<String>,
    /// What a session id says about the prompts: `growing` (a chat, the default) or `none`
    /// (the id only groups requests).
    pub session_prefix: Option<String>,
}

/// A lifecycle event as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEvent {
    /// When, s.
    pub at_s: f64,
    /// Worker name.
    pub worker: String,
    /// What happens.
    pub action: String,
    /// restart: new launch arguments.
    pub launch_args: Option<String>,
    /// restart: engine start-up time, s (default 60).
    pub ready_after_s: Option<f64>,
    /// restart: registration delay after ready, s (default 5).
    pub register_after_s: Option<f64>,
    /// restart: the new engine is cold (default true).
    pub cold: Option<bool>,
    /// node-manager-restart: keep the probe cache (default true).
    pub keep_cache: Option<bool>,
    /// pin: the weight.
    pub weight: Option<f64>,
    /// degrade: speed factor.
    pub speed_factor: Option<f64>,
}

/// SLO as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlo {
    /// TTFT bound, s.
    pub ttft_s: Option<f64>,
    /// TPOT bound, s.
    pub tpot_s: Option<f64>,
}

// ----- validated ------------------------------------------------------------------------------
