//! Scenario files: a fleet, its traffic, lifecycle events and the policies to compare.
//!
//! Parsed in two steps, like every input of routelab: serde structs that mirror the YAML
//! (`Raw*`, unknown fields rejected), then validation into domain types ([`Scenario`]). Every
//! error names the file, the line and column, the field path and what would be valid.
//!
//! ```yaml
//! name: seed/sixteen-at-once
//! seed: 1
//! model: gemma-27b
//! fleet:
//!   - { name: pair, profile: rtx4090x2-27b }
//!   - { name: pro6000, profile: rtx-pro-6000-27b, rtt_ms: 2 }
//! traffic:
//!   - burst: { at_s: 60, size: 16, prompt: { fixed: 200 }, output: { fixed: 256 } }
//! events:
//!   - { at_s: 600, worker: pro6000, action: restart, launch_args: "--max-model-len 65536" }
//! policies: [seed-v1, seed-v3, { preset: seed-v3, chooser: { kind: sed, ties: higher-weight } }]
//! ```

use crate::engine::{
    Action, Gateways, LifecycleEvent, MAX_REPLICAS, Share, SimSetup, Slo, Split, WorkerSetup,
};
use crate::hardware::{HardwareProfile, ProfileLookup};
use crate::traffic::{
    ArrivalUnit, BadRowPolicy, Burst, BurstConfig, ClosedLoop, ClosedLoopConfig, Conversations,
    ConversationsConfig, Diurnal, DiurnalConfig, DurationDist, FieldPath, LengthDist,
    LongPromptMix, LongPromptMixConfig, Merge, OnOff, OnOffConfig, Poisson, PoissonConfig,
    READY_MADE_MAPPINGS, ReplayOptions, Resample, SessionPrefix, TimeWindow, TraceFormat,
    TraceLayout, TraceMapping, TraceStats, TrafficError, TrafficSource, Until, open_trace,
};
use crate::worker::{EngineMode, EngineOverrides};
use routelab_policies::located::{InputError, parse_yaml, rule};
use routelab_policies::streams::{
    NANOS_PER_SEC, RESAMPLE_STREAM, TRAFFIC_STREAM, derive_seed, nanos_to_secs, secs_to_nanos,
};
use routelab_policies::{PolicyConfig, PolicyEntry, WorkerSpec};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// No traffic at all: the warm-up run's source.
struct NoTraffic;

impl TrafficSource for NoTraffic {
    fn next_arrival(&mut self) -> Result<Option<crate::traffic::Arrival>, TrafficError> {
        Ok(None)
    }
}

/// An invalid scenario: the one located error of routelab ([`InputError`]), naming the file,
/// the line and column, the field path and what would be valid.
pub type ScenarioError = InputError;

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
    /// Traffic sources, merged by time.
    pub traffic: Vec<Spanned<RawTraffic>>,
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
    /// What the replicas share: `none` (default), `probes` or `probes-and-load`.
    pub share: Option<String>,
    /// `probes-and-load`: period of the in-flight exchange, s (required there, only there).
    pub sync_interval_s: Option<f64>,
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

/// One validated traffic source.
#[derive(Debug, Clone)]
pub enum TrafficSpec {
    /// Burst.
    Burst(BurstConfig),
    /// Poisson.
    Poisson(PoissonConfig),
    /// Diurnal.
    Diurnal(DiurnalConfig),
    /// On/off.
    OnOff(OnOffConfig),
    /// Closed loop.
    ClosedLoop(ClosedLoopConfig),
    /// Conversations.
    Conversations(ConversationsConfig),
    /// Long-prompt mix.
    LongPromptMix(LongPromptMixConfig),
    /// Trace replay.
    Trace {
        /// Resolved path.
        path: PathBuf,
        /// Format.
        format: TraceFormat,
        /// Options.
        options: ReplayOptions,
    },
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Display name.
    pub name: String,
    /// Description.
    pub description: String,
    /// The file it came from.
    pub path: PathBuf,
    /// Fleet, events and settings (its `seed` is the scenario's default seed).
    pub setup: SimSetup,
    /// Traffic sources.
    pub traffic: Vec<TrafficSpec>,
    /// Policies to run.
    pub policies: Vec<PolicyConfig>,
    /// The fleet's warm-up, worked out once when a trace needs it ([`Scenario::warmup_ns`])
    /// and shared by the scenario's copies (load scales, held-out parts).
    pub warmup: Warmup,
}

/// What a seed of a scenario is ([`Scenario::seed_meaning`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedMeaning {
    /// For a table cell: `trace resampled (143 s blocks)`, `trace replayed as recorded`,
    /// `synthetic traffic drawn per seed`.
    pub short: String,
    /// The sentences every output states (with the warm-up, when a trace waits for one).
    pub sentence: String,
}

/// The fleet's warm-up ([`Scenario::warmup_ns`]), computed on first use and shared by clones.
#[derive(Debug, Clone, Default)]
pub struct Warmup(Arc<std::sync::OnceLock<Result<u64, String>>>);

/// The policy whose registration probes define the warm-up: the probing preset.
pub const WARMUP_REFERENCE: &str = "seed-v3";

impl Scenario {
    /// Load and validate a scenario file.
    pub fn load(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| InputError::unreadable(path.display().to_string(), &e))?;
        Scenario::from_yaml(&src, path)
    }

    /// Validate scenario text; `path` names it in errors and anchors relative paths.
    pub fn from_yaml(src: &str, path: &Path) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = parse_yaml(src, &path.display().to_string())?;
        Validator {
            path,
            profiles: HashMap::new(),
        }
        .scenario(raw)
    }

    /// The merged traffic of this scenario for a given seed.
    pub fn traffic_source(&self, seed: u64) -> Result<Box<dyn TrafficSource>, TrafficError> {
        let mut sources: Vec<Box<dyn TrafficSource>> = Vec::with_capacity(self.traffic.len());
        for (i, t) in self.traffic.iter().enumerate() {
            let s = derive_seed(seed, TRAFFIC_STREAM + i as u64);
            sources.push(match t.clone() {
                TrafficSpec::Burst(c) => Box::new(Burst::new(c, s)?),
                TrafficSpec::Poisson(c) => Box::new(Poisson::new(c, s)?),
                TrafficSpec::Diurnal(c) => Box::new(Diurnal::new(c, s)?),
                TrafficSpec::OnOff(c) => Box::new(OnOff::new(c, s)?),
                TrafficSpec::ClosedLoop(c) => Box::new(ClosedLoop::new(c, s)?),
                TrafficSpec::Conversations(c) => Box::new(Conversations::new(c, s)?),
                TrafficSpec::LongPromptMix(c) => Box::new(LongPromptMix::new(c, s)?),
                TrafficSpec::Trace {
                    path,
                    format,
                    mut options,
                } => {
                    if options.start_after_warmup {
                        options.start_offset = self
                            .warmup_ns()
                            .map_err(|e| TrafficError::config("warm-up", "start_offset_s", e))?;
                    }
                    open_trace(
                        &path,
                        format,
                        &options,
                        derive_seed(seed, RESAMPLE_STREAM + i as u64),
                    )?
                }
            });
        }
        Ok(if sources.len() == 1 {
            sources.pop().expect("one source")
        } else {
            Box::new(Merge::new(sources))
        })
    }

    /// This scenario with its load multiplied by `scale` (the load scale of `routelab
    /// capacity`): every source's arrival rate times `scale`, lengths and burst sizes unchanged.
    ///
    /// What scales, per source:
    /// - `poisson`, `long_prompt_mix`: `rate_per_s` × scale;
    /// - `diurnal`: `min_rate_per_s` and `max_rate_per_s` × scale (period and phase unchanged);
    /// - `conversations`: the conversation start rate × scale (turns, think times unchanged);
    /// - `on_off`: the burst window and the idle gaps ÷ scale (burst sizes unchanged);
    /// - `burst` with `repeats` > 1: the period ÷ scale (sizes unchanged); a single burst is an
    ///   event, not a rate, and stays as it is;
    /// - `trace`: `rate_scale` × scale (the same rows, inter-arrival times ÷ scale).
    ///
    /// Stop conditions stay as written: a source bounded by `count` sends the same requests
    /// sooner, one bounded by `duration_s` sends more of them in the same time.
    ///
    /// A scale of 1 gives an equal scenario (and so byte-identical runs).
    ///
    /// # Errors
    /// A located [`InputError`] when `scale` is not a finite number > 0, when a source's load
    /// cannot be scaled (a `closed_loop`: its load is set by its users and their think time, not
    /// by an arrival rate; the error names it, `traffic[2].closed_loop`), or when no source has
    /// an arrival rate at all (only single bursts).
    pub fn with_load_scale(&self, scale: f64) -> Result<Scenario, ScenarioError> {
        let file = self.path.display().to_string();
        let scale = rule::positive(scale).map_err(|v| v.at_field(file.as_str(), "load scale"))?;
        let mut rated = false;
        let mut traffic = Vec::with_capacity(self.traffic.len());
        for (i, t) in self.traffic.iter().enumerate() {
            let (scaled, has_rate) = match t {
                TrafficSpec::Burst(c) => {
                    (TrafficSpec::Burst(c.with_load_scale(scale)), c.has_rate())
                }
                TrafficSpec::Poisson(c) => (TrafficSpec::Poisson(c.with_load_scale(scale)), true),
                TrafficSpec::Diurnal(c) => (TrafficSpec::Diurnal(c.with_load_scale(scale)), true),
                TrafficSpec::OnOff(c) => (TrafficSpec::OnOff(c.with_load_scale(scale)), true),
                TrafficSpec::Conversations(c) => {
                    (TrafficSpec::Conversations(c.with_load_scale(scale)), true)
                }
                TrafficSpec::LongPromptMix(c) => {
                    (TrafficSpec::LongPromptMix(c.with_load_scale(scale)), true)
                }
                TrafficSpec::Trace {
                    path,
                    format,
                    options,
                } => (
                    TrafficSpec::Trace {
                        path: path.clone(),
                        format: format.clone(),
                        options: options.with_load_scale(scale),
                    },
                    true,
                ),
                TrafficSpec::ClosedLoop(_) => {
                    return Err(InputError::new(
                        file,
                        format!("traffic[{i}].closed_loop"),
                        "its load cannot be scaled: a closed loop's load is set by its users and \
                         their think time, not by an arrival rate",
                    )
                    .valid(
                        "open-loop sources (poisson, diurnal, on_off, burst, conversations, \
                         long_prompt_mix, trace); model the users as an arrival rate to measure \
                         capacity",
                    ));
                }
            };
            rated |= has_rate;
            traffic.push(scaled);
        }
        if !rated {
            return Err(InputError::new(
                file,
                "traffic",
                "has no arrival rate to scale: every source is a single burst",
            )
            .valid("at least one rate-driven source (poisson, diurnal, on_off, repeated burst, conversations, long_prompt_mix, trace)"));
        }
        Ok(Scenario {
            traffic,
            ..self.clone()
        })
    }

    /// The mean arrival rate of this scenario's new requests for `seed`, requests per second:
    /// its open-loop arrivals over their span (conversations count their first turns only; the
    /// follow-ups depend on completions). `None` when the span is 0 (e.g. one burst).
    ///
    /// # Errors
    /// The traffic's error (an unreadable trace or a bad row).
    pub fn mean_arrival_rate_per_s(&self, seed: u64) -> Result<Option<f64>, TrafficError> {
        let mut source = self.traffic_source(seed)?;
        Ok(TraceStats::from_source(&mut *source)?.mean_rate_per_s)
    }

    /// This scenario with every trace source whose `resample:` is not written resampled as
    /// `default` (`compare`, `capacity`, `sweep` and `replicas` give
    /// [`Resample::BLOCK_AUTO`]; `run` and `check` leave them replayed as recorded).
    #[must_use]
    pub fn with_resample_default(&self, default: Resample) -> Scenario {
        let mut out = self.clone();
        for t in &mut out.traffic {
            if let TrafficSpec::Trace { options, .. } = t {
                options.resample.get_or_insert(default);
            }
        }
        out
    }

    /// This scenario with every trace source replayed as recorded, whatever its `resample:`
    /// says (what a trace's own mean rate is read from).
    #[must_use]
    pub fn as_recorded(&self) -> Scenario {
        let mut out = self.clone();
        for t in &mut out.traffic {
            if let TrafficSpec::Trace { options, .. } = t {
                options.resample = Some(Resample::Exact);
            }
        }
        out
    }

    /// Whether any trace source is resampled per seed.
    #[must_use]
    pub fn resamples(&self) -> bool {
        self.traffic.iter().any(|t| {
            matches!(t, TrafficSpec::Trace { options, .. }
                if matches!(options.resample, Some(Resample::Block { .. })))
        })
    }

    /// The scenario split by time for an out-of-sample check: every trace source cut at `1 -
    /// held_out` of its span, the first part to pick a winner on and the rest to check it on.
    /// Other sources are kept whole in both (the check then runs on other seeds, see the
    /// commands).
    ///
    /// # Errors
    /// A located [`InputError`] (naming `--holdout`) when `held_out` is not a fraction in
    /// (0, 1) or the scenario has no trace source to split.
    pub fn holdout(&self, held_out: f64) -> Result<(Scenario, Scenario), ScenarioError> {
        if !(held_out.is_finite() && held_out > 0.0 && held_out < 1.0) {
            return Err(InputError::new(
                "command line",
                "--holdout",
                format!("{held_out} is not a fraction of the trace"),
            )
            .valid("a fraction > 0 and < 1, e.g. 0.3 to hold out the last 30 % of each trace"));
        }
        if !self
            .traffic
            .iter()
            .any(|t| matches!(t, TrafficSpec::Trace { .. }))
        {
            return Err(InputError::new(
                self.path.display().to_string(),
                "traffic",
                "has no trace source to hold part of out",
            )
            .valid(
                "a scenario with a `trace:` source (`--holdout` picks the winner on the first \
                 part of each trace by time and checks it on the rest)",
            ));
        }
        let cut = 1.0 - held_out;
        let part = |window: TimeWindow| {
            let mut sc = self.clone();
            for t in &mut sc.traffic {
                if let TrafficSpec::Trace { options, .. } = t {
                    options.window = Some(window);
                }
            }
            sc
        };
        Ok((
            part(TimeWindow { from: 0.0, to: cut }),
            part(TimeWindow { from: cut, to: 1.0 }),
        ))
    }

    /// What a seed of this scenario is, for every output: for each trace source, whether
    /// seeds replay it as recorded or resample it (and with which blocks), and that the
    /// engines' noise and the routers' random choices follow the seed too; and the warm-up a
    /// trace waits for ([`Scenario::warmup_note`]).
    ///
    /// # Errors
    /// The error of a trace that cannot be read (a resampled one is read to tell its block
    /// length), or of the warm-up run.
    pub fn seed_meaning(&self) -> Result<SeedMeaning, TrafficError> {
        let mut parts = Vec::new();
        let mut short = Vec::new();
        let mut synthetic = false;
        for (i, t) in self.traffic.iter().enumerate() {
            let TrafficSpec::Trace {
                path,
                format,
                options,
            } = t
            else {
                synthetic = true;
                continue;
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let part = options
                .window
                .map(|w| format!(", {}", w.describe()))
                .unwrap_or_default();
            match options.resample.unwrap_or(Resample::Exact) {
                Resample::Exact => {
                    short.push("trace replayed as recorded".to_owned());
                    parts.push(format!(
                        "traffic[{i}] ({name}{part}) is replayed as recorded on every seed \
                         (`resample: none`), so the intervals carry none of the traffic's \
                         variability"
                    ));
                }
                Resample::Block { block_ns } => {
                    let loaded = crate::traffic::LoadedTrace::load(path, format.clone(), options)?;
                    let (how, tag) = match (loaded.block_length(block_ns), block_ns) {
                        (None, _) => (
                            "it cannot be resampled (all at one instant)".to_owned(),
                            "trace (one instant)".to_owned(),
                        ),
                        (Some(b), None) => (
                            format!(
                                "blocks of {:.0} s, chosen from the trace by the Politis-White \
                                 rule",
                                b as f64 / 1e9
                            ),
                            format!("trace resampled ({:.0} s blocks)", b as f64 / 1e9),
                        ),
                        (Some(b), Some(_)) => (
                            format!("blocks of {:.0} s", b as f64 / 1e9),
                            format!("trace resampled ({:.0} s blocks)", b as f64 / 1e9),
                        ),
                    };
                    short.push(tag);
                    parts.push(format!(
                        "traffic[{i}] ({name}{part}) is a new circular block-bootstrap resample \
                         of the trace on each seed ({how}; a session's requests stay together), \
                         so the intervals carry the traffic's variability"
                    ));
                }
            }
        }
        if synthetic {
            short.push("synthetic traffic drawn per seed".to_owned());
            parts.push("the synthetic sources are drawn anew from each seed".to_owned());
        }
        parts.push(
            "each seed also draws the engines' noise and the routers' random choices".to_owned(),
        );
        let mut sentence = format!("A seed: {}.", parts.join("; "));
        if let Some(w) = self
            .warmup_note()
            .map_err(|e| TrafficError::config("warm-up", "start_offset_s", e))?
        {
            sentence.push(' ');
            sentence.push_str(&w);
        }
        Ok(SeedMeaning {
            short: short.join(" + "),
            sentence,
        })
    }

    /// The fleet's warm-up, ns: when every worker registered at the fleet's first registration
    /// has its first measured weight, as the probing preset ([`WARMUP_REFERENCE`]) measures
    /// them on this fleet with no traffic (one gateway, no lifecycle events). A trace without
    /// `start_offset_s` starts then, for every policy alike: its requests do not meet the
    /// registration probes, so a probing policy's weights are not measured under customer load
    /// and no policy is judged on the seconds before any router could know the fleet. 0 when
    /// the reference measures no worker.
    ///
    /// # Errors
    /// The reference run's error (a fleet the simulator refuses), as text.
    pub fn warmup_ns(&self) -> Result<u64, String> {
        self.warmup
            .0
            .get_or_init(|| {
                let mut setup = self.setup.clone();
                setup.events.clear();
                setup.gateways = Gateways::ONE;
                setup.timeline_ns = 0;
                setup.max_time_ns = 3_600_000_000_000;
                let reference =
                    PolicyConfig::preset(WARMUP_REFERENCE).expect("the warm-up preset exists");
                let m = crate::run(&setup, &reference, &mut NoTraffic, None)
                    .map_err(|e| format!("the fleet's warm-up run failed: {e}"))?;
                let first = setup
                    .workers
                    .iter()
                    .map(|w| w.register_at)
                    .min()
                    .unwrap_or(0);
                Ok(setup
                    .workers
                    .iter()
                    .zip(&m.workers)
                    .filter(|(w, _)| w.register_at == first)
                    .filter_map(|(_, t)| t.first_measured_ns)
                    .max()
                    .unwrap_or(0))
            })
            .clone()
    }

    /// What the outputs say about a warm-up: for each trace that starts after the fleet's
    /// warm-up, when and why (empty when no trace does).
    ///
    /// # Errors
    /// [`Scenario::warmup_ns`]'s.
    pub fn warmup_note(&self) -> Result<Option<String>, String> {
        let auto: Vec<String> = self
            .traffic
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                matches!(t, TrafficSpec::Trace { options, .. } if options.start_after_warmup)
            })
            .map(|(i, _)| format!("traffic[{i}]"))
            .collect();
        if auto.is_empty() {
            return Ok(None);
        }
        let w = self.warmup_ns()?;
        Ok(Some(format!(
            "Warm-up: {} start{} at {:.1} s, when the fleet's registration probes have measured \
             every worker ({WARMUP_REFERENCE}'s probes on this fleet with no traffic), for \
             every policy alike; set `start_offset_s` to choose another start.",
            auto.join(", "),
            if auto.len() == 1 { "s" } else { "" },
            w as f64 / 1e9
        )))
    }

    /// The setup with another seed.
    pub fn setup_for_seed(&self, seed: u64) -> SimSetup {
        SimSetup {
            seed,
            ..self.setup.clone()
        }
    }
}

/// An open-loop source's load for the memory estimate ([`crate::footprint`]): none for a closed
/// loop (its users bound what waits) and a trace (checked when read).
fn source_load(t: &TrafficSpec) -> Option<crate::footprint::SourceLoad> {
    use crate::footprint::SourceLoad;
    Some(match t {
        TrafficSpec::Burst(c) => SourceLoad {
            requests: f64::from(c.size) * f64::from(c.repeats.max(1)),
            span_s: nanos_to_secs(c.period) * f64::from(c.repeats.saturating_sub(1)),
            output_mean: c.output.mean(),
        },
        TrafficSpec::Poisson(c) => SourceLoad::rated(c.rate_per_s, &c.until, c.output.mean()),
        TrafficSpec::Diurnal(c) => SourceLoad::rated(
            (c.min_rate_per_s + c.max_rate_per_s) / 2.0,
            &c.until,
            c.output.mean(),
        ),
        TrafficSpec::OnOff(c) => {
            let cycle_s = (c.window as f64 + c.gap.mean_ns()) / NANOS_PER_SEC;
            let rate = if cycle_s > 0.0 {
                c.burst_size.mean() / cycle_s
            } else {
                f64::INFINITY
            };
            SourceLoad::rated(rate, &c.until, c.output.mean())
        }
        TrafficSpec::LongPromptMix(c) => SourceLoad::rated(c.rate_per_s, &c.until, c.output.mean()),
        TrafficSpec::Conversations(c) => SourceLoad {
            requests: c.conversations as f64 * c.turns.mean(),
            span_s: c.conversations as f64 / c.rate_per_s.max(f64::MIN_POSITIVE),
            output_mean: c.output.mean(),
        },
        TrafficSpec::ClosedLoop(_) | TrafficSpec::Trace { .. } => return None,
    })
}

struct Validator<'p> {
    path: &'p Path,
    profiles: HashMap<String, Arc<HardwareProfile>>,
}

impl Validator<'_> {
    fn invalid(
        &self,
        loc: Option<&serde_saphyr::Location>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ScenarioError {
        let to_u32 = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        InputError::new(self.path.display().to_string(), field, message).at(
            loc.map(|l| to_u32(l.line())),
            loc.map(|l| to_u32(l.column())),
        )
    }

    fn secs(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        v: Option<f64>,
        default: f64,
    ) -> Result<u64, ScenarioError> {
        let v = v.unwrap_or(default);
        // The rule bounds the value; the conversion is the one rounding to nanoseconds.
        rule::seconds(v)
            .map(|_| secs_to_nanos(v))
            .map_err(|e| self.invalid(Some(loc), field, e.to_string()))
    }

    fn positive(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        v: f64,
    ) -> Result<f64, ScenarioError> {
        rule::positive(v).map_err(|e| self.invalid(Some(loc), field, e.to_string()))
    }

    /// The profile `spec` of a fleet entry, through the one lookup ([`ProfileLookup`]); each
    /// `profile:` string is read once per scenario.
    fn profile(
        &mut self,
        lookup: &ProfileLookup,
        spec: &str,
        loc: &serde_saphyr::Location,
        field: &str,
    ) -> Result<Arc<HardwareProfile>, ScenarioError> {
        if let Some(p) = self.profiles.get(spec) {
            return Ok(p.clone());
        }
        let to_u32 = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        let p = Arc::new(lookup.find(spec).map_err(|e| {
            e.located(self.path.display().to_string(), field)
                .at(Some(to_u32(loc.line())), Some(to_u32(loc.column())))
        })?);
        self.profiles.insert(spec.to_string(), p.clone());
        Ok(p)
    }

    fn scenario(mut self, raw: RawScenario) -> Result<Scenario, ScenarioError> {
        let name = match raw.name {
            Some(n) if n.trim().is_empty() => {
                return Err(self.invalid(None, "name", "must not be empty"));
            }
            Some(n) => n,
            None => self
                .path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("scenario")
                .to_string(),
        };
        let model = raw.model.unwrap_or_else(|| "model".to_string());
        let lookup = ProfileLookup::for_scenario(self.path, raw.hardware_dir.as_deref());
        if raw.fleet.is_empty() {
            return Err(self.invalid(
                None,
                "fleet",
                "is empty; a scenario needs at least one worker",
            ));
        }
        let scenario_engine = match &raw.engine {
            Some(e) => self.engine_mode(e, "engine")?,
            None => EngineMode::default(),
        };
        let mut workers: Vec<WorkerSetup> = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, w) in raw.fleet.iter().enumerate() {
            let loc = &w.referenced;
            let f = |s: &str| format!("fleet[{i}].{s}");
            let w = &w.value;
            if w.name.trim().is_empty() {
                return Err(self.invalid(Some(loc), f("name"), "must not be empty"));
            }
            let profile = self.profile(&lookup, &w.profile, loc, &f("profile"))?;
            let count = w.count.unwrap_or(1);
            if count == 0 || count > 100_000 {
                return Err(self.invalid(
                    Some(loc),
                    f("count"),
                    format!("{count} is not valid; expected 1 to 100000"),
                ));
            }
            let context_window = w.context_window.unwrap_or(profile.context_window());
            if context_window < 1024 {
                return Err(self.invalid(
                    Some(loc),
                    f("context_window"),
                    format!("{context_window} is too small; expected at least 1024 tokens (the probe prompt must fit)"),
                ));
            }
            let engine = match &w.engine {
                Some(e) => self.engine_mode(e, &f("engine"))?,
                None => scenario_engine,
            };
            let noise = w.noise.as_ref();
            let overrides = EngineOverrides {
                speed_factor: w.speed_factor.unwrap_or(1.0),
                request_noise_cv: noise.and_then(|n| n.request_cv).unwrap_or(0.0),
                epoch_noise_cv: noise.and_then(|n| n.epoch_cv).unwrap_or(0.0),
                epoch_s: noise.and_then(|n| n.epoch_s).unwrap_or(60.0),
                max_running: w.max_running,
                kv_capacity_tokens: w.kv_capacity_tokens,
                prefill_chunk_tokens: None,
                start_cold: w.start_cold.unwrap_or(false),
            };
            overrides
                .validate()
                .map_err(|m| self.invalid(Some(loc), format!("fleet[{i}]"), m))?;
            let rtt_ns = self.secs(loc, &f("rtt_ms"), w.rtt_ms.map(|ms| ms / 1000.0), 0.0)?;
            let register_at = self.secs(loc, &f("register_at_s"), w.register_at_s, 0.0)?;
            let gpu_names = w
                .gpu_names
                .clone()
                .unwrap_or_else(|| profile.gpu_names().to_vec());
            // What the engine's launch arguments tell a gateway: its KV memory in cache blocks.
            let cache_blocks = u32::try_from(
                w.kv_capacity_tokens.unwrap_or(profile.kv_capacity_tokens())
                    / u64::from(crate::traffic::BLOCK_TOKENS),
            )
            .unwrap_or(u32::MAX);
            for k in 0..count {
                let wname = if count == 1 {
                    w.name.clone()
                } else {
                    format!("{}-{}", w.name, k + 1)
                };
                if names.insert(wname.clone(), workers.len()).is_some() {
                    return Err(self.invalid(
                        Some(loc),
                        f("name"),
                        format!("`{wname}` is used twice; worker names must be unique"),
                    ));
                }
                let node = match (&w.node, count) {
                    (Some(n), 1) => n.clone(),
                    (Some(n), _) => format!("{n}-{}", k + 1),
                    (None, _) => wname.clone(),
                };
                workers.push(WorkerSetup {
                    spec: WorkerSpec {
                        name: wname,
                        node,
                        model: model.clone(),
                        gpu_names: gpu_names.clone(),
                        context_window,
                        launch_args: w.launch_args.clone().unwrap_or_default(),
                        cache_blocks: Some(cache_blocks),
                    },
                    profile: profile.clone(),
                    overrides: overrides.clone(),
                    engine,
                    rtt_ns,
                    register_at,
                });
            }
        }

        if raw.traffic.is_empty() {
            return Err(self.invalid(None, "traffic", "is empty; give at least one source (burst, poisson, diurnal, on_off, closed_loop, conversations, long_prompt_mix, trace)"));
        }
        let mut traffic = Vec::new();
        for (i, t) in raw.traffic.iter().enumerate() {
            traffic.push(self.traffic(i, t)?);
        }

        let loads: Vec<(usize, crate::footprint::SourceLoad)> = traffic
            .iter()
            .enumerate()
            .filter_map(|(i, t)| source_load(t).map(|l| (i, l)))
            .collect();
        let only: Vec<crate::footprint::SourceLoad> = loads.iter().map(|(_, l)| *l).collect();
        if let Some(why) = crate::footprint::waiting_overflow(
            &only,
            &workers,
            crate::footprint::memory_limit_bytes(),
        ) {
            let (i, _) = loads
                .iter()
                .max_by(|a, b| a.1.requests.total_cmp(&b.1.requests))
                .expect("an overflow has a source");
            return Err(self
                .invalid(
                    Some(&raw.traffic[*i].referenced),
                    format!("traffic[{i}]"),
                    why,
                )
                .valid(
                    "traffic the fleet can keep up with, or fewer requests (`count`, \
                     `duration_s`): a run holds every waiting request in memory",
                ));
        }

        let mut events = Vec::new();
        for (i, e) in raw.events.iter().enumerate() {
            events.push(self.event(i, e, &names)?);
        }

        let mut policies = Vec::new();
        for (i, p) in raw.policies.iter().enumerate() {
            let cfg = p.value.build().map_err(|e| {
                let at = self.invalid(Some(&p.referenced), "", "");
                InputError::from_config(at.file, &e)
                    .within(&format!("policies[{i}]"))
                    .at(at.line, at.column)
            })?;
            // A prefill-bound probe (predictive's) must fit every worker's context window.
            if let Some((w, reason)) = workers
                .iter()
                .find_map(|w| Some((w, cfg.prefill_probe_fits(w.spec.context_window).err()?)))
            {
                return Err(self.invalid(
                    Some(&p.referenced),
                    format!("policies[{i}]"),
                    format!(
                        "policy `{}` on worker `{}`: {reason}",
                        cfg.name, w.spec.name
                    ),
                ));
            }
            if policies.iter().any(|q: &PolicyConfig| q.name == cfg.name) {
                return Err(self.invalid(
                    Some(&p.referenced),
                    format!("policies[{i}]"),
                    format!("policy `{}` is listed twice; give one a `name`", cfg.name),
                ));
            }
            policies.push(cfg);
        }
        if policies.is_empty() {
            policies = routelab_policies::PRESETS
                .iter()
                .map(|p| PolicyConfig::preset(p.name).expect("presets are valid"))
                .collect();
        }

        let none = serde_saphyr::Location::UNKNOWN;
        let mut setup = SimSetup::new(model, workers, raw.seed.unwrap_or(1));
        setup.events = events;
        setup.tick_ns = self.secs(&none, "tick_s", raw.tick_s, 1.0)?.max(1_000_000);
        setup.timeline_ns = self.secs(&none, "timeline_s", raw.timeline_s, 10.0)?;
        if let Some(d) = raw.max_duration_s {
            setup.max_time_ns = self.secs(&none, "max_duration_s", Some(d), 0.0)?;
        }
        if let Some(r) = raw.max_retries {
            setup.max_retries = r;
        }
        if let Some(c) = raw.oracle_concurrency {
            setup.oracle_concurrency = self.positive(&none, "oracle_concurrency", c)?;
        }
        if let Some(slo) = raw.slo {
            if let Some(t) = slo.ttft_s {
                setup.slo.ttft_s = self.positive(&none, "slo.ttft_s", t)?;
            }
            if let Some(t) = slo.tpot_s {
                setup.slo.tpot_s = self.positive(&none, "slo.tpot_s", t)?;
            }
        } else {
            setup.slo = Slo::default();
        }
        if let Some(g) = &raw.gateways {
            setup.gateways = self.gateways(g)?;
        }
        Ok(Scenario {
            name,
            description: raw.description.unwrap_or_default(),
            path: self.path.to_path_buf(),
            setup,
            traffic,
            policies,
            warmup: Warmup::default(),
        })
    }

    /// An `engine:` mode (the scenario's or a fleet entry's).
    fn engine_mode(&self, e: &Spanned<String>, field: &str) -> Result<EngineMode, ScenarioError> {
        EngineMode::parse(&e.value).map_err(|_| {
            self.invalid(
                Some(&e.referenced),
                field,
                format!("unknown engine mode `{}`", e.value),
            )
            .valid(EngineMode::NAMES.join(", "))
        })
    }

    /// The `gateways:` block.
    fn gateways(&self, g: &Spanned<RawGateways>) -> Result<Gateways, ScenarioError> {
        let loc = &g.referenced;
        let g = &g.value;
        let replicas = match g.replicas {
            None => 1,
            Some(n) => rule::whole(n, 1, u64::from(MAX_REPLICAS))
                .map_err(|e| self.invalid(Some(loc), "gateways.replicas", e.to_string()))?
                as u32,
        };
        let names = |all: &[&str]| all.join(", ");
        let split = match g.split.as_deref() {
            None => Split::RoundRobin,
            Some(name) => Split::from_name(name).ok_or_else(|| {
                let valid: Vec<&str> = Split::ALL.iter().map(|(n, _)| *n).collect();
                self.invalid(
                    Some(loc),
                    "gateways.split",
                    format!("unknown split `{name}`"),
                )
                .valid(names(&valid))
            })?,
        };
        let name = g.share.as_deref().unwrap_or(Share::NAMES[0]);
        let sync_ns = match g.sync_interval_s {
            None => None,
            Some(s) => Some(
                rule::period(s)
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                    .map_err(|e| {
                        self.invalid(Some(loc), "gateways.sync_interval_s", e.to_string())
                    })?,
            ),
        };
        let share = Share::from_name(name, sync_ns.unwrap_or(0)).ok_or_else(|| {
            self.invalid(
                Some(loc),
                "gateways.share",
                format!("unknown share `{name}`"),
            )
            .valid(names(&Share::NAMES))
        })?;
        match (share, sync_ns) {
            (Share::ProbesAndLoad { .. }, None) => {
                return Err(self.invalid(
                    Some(loc),
                    "gateways.sync_interval_s",
                    "is missing; `share: probes-and-load` exchanges in-flight counts every \
                     `sync_interval_s` seconds (a number > 0)",
                ));
            }
            (Share::None | Share::Probes, Some(_)) => {
                return Err(self.invalid(
                    Some(loc),
                    "gateways.sync_interval_s",
                    format!(
                        "is given with `share: {name}`; only `share: probes-and-load` \
                         exchanges in-flight counts"
                    ),
                ));
            }
            _ => {}
        }
        Ok(Gateways {
            replicas,
            split,
            share,
        })
    }

    fn until(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        duration_s: Option<f64>,
        count: Option<u64>,
    ) -> Result<Until, ScenarioError> {
        if duration_s.is_none() && count.is_none() {
            return Err(self.invalid(
                Some(loc),
                field,
                "sets neither `duration_s` nor `count`; give at least one so the source ends",
            ));
        }
        Ok(Until {
            duration: duration_s
                .map(|d| self.secs(loc, &format!("{field}.duration_s"), Some(d), 0.0))
                .transpose()?,
            count,
        })
    }

    fn seconds_dist(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        d: RawSeconds,
    ) -> Result<DurationDist, ScenarioError> {
        let s = |v: f64| self.secs(loc, field, Some(v), 0.0);
        Ok(match d {
            RawSeconds::Fixed(v) => DurationDist::Fixed(s(v)?),
            RawSeconds::Uniform { min, max } => {
                if min > max {
                    return Err(self.invalid(
                        Some(loc),
                        field,
                        format!("uniform min {min} > max {max}; expected min <= max"),
                    ));
                }
                DurationDist::Uniform {
                    min: s(min)?,
                    max: s(max)?,
                }
            }
            RawSeconds::Exponential { mean } => DurationDist::Exponential { mean: s(mean)? },
        })
    }

    fn traffic(&self, i: usize, t: &Spanned<RawTraffic>) -> Result<TrafficSpec, ScenarioError> {
        let loc = &t.referenced;
        let f = |s: &str| format!("traffic[{i}].{s}");
        let spec = match &t.value {
            RawTraffic::Burst {
                at_s,
                size,
                repeats,
                period_s,
                prompt,
                output,
            } => TrafficSpec::Burst(BurstConfig {
                at: self.secs(loc, &f("burst.at_s"), *at_s, 0.0)?,
                size: *size,
                repeats: repeats.unwrap_or(1),
                period: self.secs(loc, &f("burst.period_s"), *period_s, 0.0)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Poisson {
                start_s,
                rate_per_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::Poisson(PoissonConfig {
                start: self.secs(loc, &f("poisson.start_s"), *start_s, 0.0)?,
                rate_per_s: *rate_per_s,
                until: self.until(loc, &f("poisson"), *duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Diurnal {
                start_s,
                min_rate_per_s,
                max_rate_per_s,
                period_s,
                phase_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::Diurnal(DiurnalConfig {
                start: self.secs(loc, &f("diurnal.start_s"), *start_s, 0.0)?,
                min_rate_per_s: *min_rate_per_s,
                max_rate_per_s: *max_rate_per_s,
                period: self.secs(loc, &f("diurnal.period_s"), Some(*period_s), 0.0)?,
                phase: self.secs(loc, &f("diurnal.phase_s"), *phase_s, 0.0)?,
                until: self.until(loc, &f("diurnal"), *duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::OnOff {
                start_s,
                burst_size,
                window_s,
                gap_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::OnOff(OnOffConfig {
                start: self.secs(loc, &f("on_off.start_s"), *start_s, 0.0)?,
                burst_size: *burst_size,
                window: self.secs(loc, &f("on_off.window_s"), Some(*window_s), 0.0)?,
                gap: self.seconds_dist(loc, &f("on_off.gap_s"), *gap_s)?,
                until: self.until(loc, &f("on_off"), *duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::ClosedLoop {
                start_s,
                users,
                ramp_s,
                think_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::ClosedLoop(ClosedLoopConfig {
                start: self.secs(loc, &f("closed_loop.start_s"), *start_s, 0.0)?,
                users: *users,
                ramp: self.secs(loc, &f("closed_loop.ramp_s"), *ramp_s, 0.0)?,
                think: self.seconds_dist(loc, &f("closed_loop.think_s"), *think_s)?,
                until: self.until(loc, &f("closed_loop"), *duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Conversations {
                start_s,
                rate_per_s,
                conversations,
                turns,
                user_tokens,
                output,
                think_s,
                system_prompt_tokens,
                max_prompt_tokens,
            } => TrafficSpec::Conversations(ConversationsConfig {
                start: self.secs(loc, &f("conversations.start_s"), *start_s, 0.0)?,
                rate_per_s: *rate_per_s,
                conversations: *conversations,
                turns: *turns,
                user_tokens: *user_tokens,
                output: *output,
                think: self.seconds_dist(loc, &f("conversations.think_s"), *think_s)?,
                system_prompt_tokens: system_prompt_tokens.unwrap_or(0),
                system_prompt_id: 0,
                max_prompt_tokens: *max_prompt_tokens,
            }),
            RawTraffic::LongPromptMix {
                start_s,
                rate_per_s,
                duration_s,
                count,
                long_fraction,
                long_prompt,
                short_prompt,
                output,
            } => TrafficSpec::LongPromptMix(LongPromptMixConfig {
                start: self.secs(loc, &f("long_prompt_mix.start_s"), *start_s, 0.0)?,
                rate_per_s: *rate_per_s,
                until: self.until(loc, &f("long_prompt_mix"), *duration_s, *count)?,
                long_fraction: *long_fraction,
                long_prompt: *long_prompt,
                short_prompt: *short_prompt,
                output: *output,
            }),
            RawTraffic::Trace {
                path,
                format,
                mapping,
                time_scale,
                rate_scale,
                limit,
                skip_rows,
                start_offset_s,
                on_bad_row,
                resample,
            } => {
                let base = self.path.parent().unwrap_or(Path::new("."));
                let resolved = base.join(path);
                let format = self.trace_format(
                    loc,
                    &f("trace"),
                    &resolved,
                    format.as_deref(),
                    mapping.as_ref(),
                )?;
                if !resolved.is_file() {
                    return Err(self.invalid(
                        Some(loc),
                        f("trace.path"),
                        format!("no such file: {}", resolved.display()),
                    ));
                }
                let on_bad_row = match on_bad_row.as_deref() {
                    None | Some("error") => BadRowPolicy::Error,
                    Some("skip") => BadRowPolicy::Skip,
                    Some(other) => {
                        return Err(self.invalid(
                            Some(loc),
                            f("trace.on_bad_row"),
                            format!("unknown policy `{other}`; valid: error, skip"),
                        ));
                    }
                };
                let options = ReplayOptions {
                    time_scale: time_scale.unwrap_or(1.0),
                    rate_scale: rate_scale.unwrap_or(1.0),
                    limit: *limit,
                    skip_rows: skip_rows.unwrap_or(0),
                    start_offset: self.secs(
                        loc,
                        &f("trace.start_offset_s"),
                        *start_offset_s,
                        0.0,
                    )?,
                    start_after_warmup: start_offset_s.is_none(),
                    on_bad_row,
                    resample: resample
                        .as_ref()
                        .map(|r| self.resample(loc, &f("trace.resample"), r))
                        .transpose()?,
                    window: None,
                };
                options
                    .validate()
                    .map_err(|e| self.invalid(Some(loc), f("trace"), e.to_string()))?;
                TrafficSpec::Trace {
                    path: resolved,
                    format,
                    options,
                }
            }
        };
        // Let each generator check its own parameters now, not at run time.
        let probe = Scenario {
            name: String::new(),
            description: String::new(),
            path: PathBuf::new(),
            setup: SimSetup::new("", Vec::new(), 0),
            traffic: vec![spec.clone()],
            policies: Vec::new(),
            warmup: Warmup::default(),
        };
        if !matches!(spec, TrafficSpec::Trace { .. })
            && let Err(e) = probe.traffic_source(0)
        {
            return Err(self.invalid(Some(loc), format!("traffic[{i}]"), e.to_string()));
        }
        Ok(spec)
    }

    /// A trace's `resample:`.
    fn resample(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        r: &RawResample,
    ) -> Result<Resample, ScenarioError> {
        const VALID: &str = "none (every seed replays the trace as recorded), block (each seed a \
                             block-bootstrap resample, the block length chosen from the trace) \
                             or { block_s: <seconds > 0> }";
        match r {
            RawResample::Name(n) if n == "none" => Ok(Resample::Exact),
            RawResample::Name(n) if n == "block" => Ok(Resample::BLOCK_AUTO),
            RawResample::Name(n) => Err(self
                .invalid(Some(loc), field, format!("unknown resample `{n}`"))
                .valid(VALID)),
            RawResample::Block { block_s } => {
                let ns = self.secs(loc, &format!("{field}.block_s"), Some(*block_s), 0.0)?;
                if ns == 0 {
                    return Err(self
                        .invalid(Some(loc), format!("{field}.block_s"), "is 0")
                        .valid(VALID));
                }
                Ok(Resample::Block { block_ns: Some(ns) })
            }
        }
    }

    /// The format of `traffic[i].trace` (`field`): a named one, or `jsonl` / `csv` (given or
    /// guessed from the extension) read through its `mapping`.
    fn trace_format(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        file: &Path,
        format: Option<&str>,
        mapping: Option<&RawTraceMapping>,
    ) -> Result<TraceFormat, ScenarioError> {
        let named = |name: &str| {
            TraceFormat::from_name(name).ok_or_else(|| {
                self.invalid(
                    Some(loc),
                    format!("{field}.format"),
                    format!("unknown format `{name}`"),
                )
                .valid(TraceFormat::NAMES)
            })
        };
        let Some(m) = mapping else {
            return match format {
                Some(name @ ("jsonl" | "csv")) => Err(self.invalid(
                    Some(loc),
                    format!("{field}.mapping"),
                    format!(
                        "is missing: `format: {name}` reads any log through a mapping; give \
                         `mapping: {{ arrival: <key>, prompt_tokens: <key>, output_tokens: <key> }}` \
                         or a ready-made format ({READY_MADE_MAPPINGS})"
                    ),
                )),
                Some(name) => named(name),
                None => TraceFormat::from_path(file).ok_or_else(|| {
                    self.invalid(
                        Some(loc),
                        format!("{field}.format"),
                        "cannot tell the format from the extension; set `format: azure` (CSV) or `format: mooncake` (JSONL)",
                    )
                    .valid(TraceFormat::NAMES)
                }),
            };
        };
        let session_prefix = match m.session_prefix.as_deref() {
            None => None,
            Some(p) => Some(SessionPrefix::from_name(p).ok_or_else(|| {
                self.invalid(
                    Some(loc),
                    format!("{field}.mapping.session_prefix"),
                    format!("unknown session prefix `{p}`"),
                )
                .valid(SessionPrefix::NAMES)
            })?),
        };
        let with_prefix = |mapping: TraceMapping| match session_prefix {
            None => Ok(mapping),
            Some(p) => mapping
                .with_session_prefix(p)
                .map_err(|e| self.invalid(Some(loc), format!("{field}.mapping.session_prefix"), e)),
        };
        let only_session_prefix = m.arrival.is_none()
            && m.arrival_unit.is_none()
            && m.prompt_tokens.is_none()
            && m.output_tokens.is_none()
            && m.session_id.is_none()
            && m.prefix_hashes.is_none();
        // A ready-made mapping takes its own fields; only what its sessions mean may be said.
        if let Some(name) = format
            && only_session_prefix
            && let Some(TraceFormat::Mapped(ready)) = TraceFormat::from_name(name)
        {
            return with_prefix(*ready).map(|m| TraceFormat::Mapped(Box::new(m)));
        }
        let layout = match format {
            Some("jsonl") => TraceLayout::Jsonl,
            Some("csv") => TraceLayout::Csv,
            Some(name) => {
                named(name)?;
                return Err(self
                    .invalid(
                        Some(loc),
                        format!("{field}.mapping"),
                        format!("does not apply to `format: {name}`, which has its own fields"),
                    )
                    .valid(
                        "a mapping with `format: jsonl` or `format: csv`, no mapping, or (for \
                         `otel-genai`) a mapping with `session_prefix` alone",
                    ));
            }
            None => TraceFormat::layout_from_path(file).ok_or_else(|| {
                self.invalid(
                    Some(loc),
                    format!("{field}.format"),
                    "cannot tell the layout of a mapped log from the extension; set `format: jsonl` or `format: csv`",
                )
            })?,
        };
        let key = |name: &str,
                   value: Option<&String>|
         -> Result<Option<FieldPath>, ScenarioError> {
            value
                .map(|v| {
                    let parsed = match layout {
                        TraceLayout::Csv => FieldPath::column(v),
                        TraceLayout::Jsonl => FieldPath::parse(v),
                    };
                    parsed
                        .map_err(|e| self.invalid(Some(loc), format!("{field}.mapping.{name}"), e))
                })
                .transpose()
        };
        let required = |name: &str, value: Option<&String>| {
            key(name, value)?.ok_or_else(|| {
                self.invalid(
                    Some(loc),
                    format!("{field}.mapping.{name}"),
                    "is missing; a mapping names the arrival, prompt_tokens and output_tokens \
                     fields",
                )
            })
        };
        let unit = match m.arrival_unit.as_deref() {
            None => ArrivalUnit::Auto,
            Some(u) => ArrivalUnit::from_name(u).ok_or_else(|| {
                self.invalid(
                    Some(loc),
                    format!("{field}.mapping.arrival_unit"),
                    format!("unknown unit `{u}`"),
                )
                .valid(ArrivalUnit::NAMES)
            })?,
        };
        TraceMapping::custom(
            layout,
            required("arrival", m.arrival.as_ref())?,
            unit,
            required("prompt_tokens", m.prompt_tokens.as_ref())?,
            required("output_tokens", m.output_tokens.as_ref())?,
            key("session_id", m.session_id.as_ref())?,
            key("prefix_hashes", m.prefix_hashes.as_ref())?,
        )
        .map_err(|e| self.invalid(Some(loc), format!("{field}.mapping"), e))
        .and_then(with_prefix)
        .map(|m| TraceFormat::Mapped(Box::new(m)))
    }

    fn event(
        &self,
        i: usize,
        e: &Spanned<RawEvent>,
        names: &HashMap<String, usize>,
    ) -> Result<LifecycleEvent, ScenarioError> {
        let loc = &e.referenced;
        let f = |s: &str| format!("events[{i}].{s}");
        let r = &e.value;
        let at = self.secs(loc, &f("at_s"), Some(r.at_s), 0.0)?;
        let Some(&worker) = names.get(&r.worker) else {
            let mut known: Vec<&str> = names.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(self.invalid(
                Some(loc),
                f("worker"),
                format!("no worker `{}`; workers: {}", r.worker, known.join(", ")),
            ));
        };
        const ACTIONS: &str = "restart, crash, disconnect, reconnect, node-manager-restart, pin, unpin, reprobe, degrade, remove";
        let allowed: &[&str] = match r.action.as_str() {
            "restart" => &["launch_args", "ready_after_s", "register_after_s", "cold"],
            "node-manager-restart" => &["keep_cache"],
            "pin" => &["weight"],
            "degrade" => &["speed_factor"],
            "crash" | "disconnect" | "reconnect" | "unpin" | "reprobe" | "remove" => &[],
            other => {
                return Err(self.invalid(
                    Some(loc),
                    f("action"),
                    format!("unknown action `{other}`; valid: {ACTIONS}"),
                ));
            }
        };
        let set = [
            ("launch_args", r.launch_args.is_some()),
            ("ready_after_s", r.ready_after_s.is_some()),
            ("register_after_s", r.register_after_s.is_some()),
            ("cold", r.cold.is_some()),
            ("keep_cache", r.keep_cache.is_some()),
            ("weight", r.weight.is_some()),
            ("speed_factor", r.speed_factor.is_some()),
        ];
        if let Some((name, _)) = set.iter().find(|(n, s)| *s && !allowed.contains(n)) {
            return Err(self.invalid(
                Some(loc),
                f(name),
                format!(
                    "does not apply to action `{}`; its fields: {}",
                    r.action,
                    if allowed.is_empty() {
                        "(none)".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
        let action = match r.action.as_str() {
            "restart" => Action::Restart {
                launch_args: r.launch_args.clone(),
                ready_after_ns: self.secs(loc, &f("ready_after_s"), r.ready_after_s, 60.0)?,
                register_after_ns: self.secs(
                    loc,
                    &f("register_after_s"),
                    r.register_after_s,
                    5.0,
                )?,
                cold: r.cold.unwrap_or(true),
            },
            "crash" => Action::Crash,
            "disconnect" => Action::Disconnect,
            "reconnect" => Action::Reconnect,
            "node-manager-restart" => Action::NodeManagerRestart {
                keep_cache: r.keep_cache.unwrap_or(true),
            },
            "pin" => {
                let w = r.weight.ok_or_else(|| {
                    self.invalid(Some(loc), f("weight"), "`pin` needs a weight > 0")
                })?;
                Action::Pin(self.positive(loc, &f("weight"), w)?)
            }
            "unpin" => Action::Unpin,
            "reprobe" => Action::Reprobe,
            "degrade" => {
                let s = r.speed_factor.ok_or_else(|| {
                    self.invalid(
                        Some(loc),
                        f("speed_factor"),
                        "`degrade` needs a speed_factor > 0 (1.0 = healthy)",
                    )
                })?;
                Action::SetSpeed(self.positive(loc, &f("speed_factor"), s)?)
            }
            _ => Action::Remove,
        };
        Ok(LifecycleEvent { at, worker, action })
    }
}
