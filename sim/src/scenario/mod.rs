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

mod parts;
mod raw;
mod reader;
mod sources;
mod trace;
mod uncertain;
mod warmup;

pub use parts::TRACE_FLAG;
pub use raw::{
    RawEvent, RawGateways, RawNoise, RawResample, RawScenario, RawSeconds, RawSlo, RawTraceMapping,
    RawTraffic, RawWorker,
};
pub use uncertain::UncertainFleet;
pub use warmup::{WARMUP_REFERENCE, Warmup, WarmupError};

use crate::traffic::catalog::{self, LoadScale, TrafficKind};

use crate::event_loop::SimSetup;
use crate::traffic::{
    Burst, BurstConfig, ClosedLoop, ClosedLoopConfig, Conversations, ConversationsConfig, Diurnal,
    DiurnalConfig, Family, FamilyConfig, LongPromptMix, LongPromptMixConfig, Merge, OnOff,
    OnOffConfig, Poisson, PoissonConfig, ReplayOptions, Resample, TimeWindow, TraceFormat,
    TraceStats, TrafficError, TrafficSource, open_trace,
};
use reader::ScenarioReader;
use routelab_policies::PolicyConfig;
use routelab_policies::located::{InputError, parse_yaml, rule};
use routelab_policies::streams::{RESAMPLE_STREAM, TRAFFIC_STREAM, derive_seed};
use std::path::{Path, PathBuf};

/// An invalid scenario: the one located error of routelab ([`InputError`]), naming the file,
/// the line and column, the field path and what would be valid.
pub type ScenarioError = InputError;

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
    /// A traffic family.
    Family(FamilyConfig),
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

impl TrafficSpec {
    /// Its entry in the catalog of traffic kinds.
    pub fn kind(&self) -> &'static TrafficKind {
        let name = match self {
            TrafficSpec::Burst(_) => "burst",
            TrafficSpec::Poisson(_) => "poisson",
            TrafficSpec::Diurnal(_) => "diurnal",
            TrafficSpec::OnOff(_) => "on_off",
            TrafficSpec::ClosedLoop(_) => "closed_loop",
            TrafficSpec::Conversations(_) => "conversations",
            TrafficSpec::LongPromptMix(_) => "long_prompt_mix",
            TrafficSpec::Family(_) => "family",
            TrafficSpec::Trace { .. } => "trace",
        };
        catalog::find(name).expect("every traffic kind is in the catalog")
    }

    /// A synthetic source's generator for `seed` (its constructor checks the parameters);
    /// `None` for a trace, which the scenario opens (it may wait for the fleet's warm-up).
    fn generator(&self, seed: u64) -> Option<Result<Box<dyn TrafficSource>, TrafficError>> {
        fn boxed<S: TrafficSource + 'static>(
            s: Result<S, TrafficError>,
        ) -> Result<Box<dyn TrafficSource>, TrafficError> {
            s.map(|s| Box::new(s) as Box<dyn TrafficSource>)
        }
        Some(match self.clone() {
            TrafficSpec::Burst(c) => boxed(Burst::new(c, seed)),
            TrafficSpec::Poisson(c) => boxed(Poisson::new(c, seed)),
            TrafficSpec::Diurnal(c) => boxed(Diurnal::new(c, seed)),
            TrafficSpec::OnOff(c) => boxed(OnOff::new(c, seed)),
            TrafficSpec::ClosedLoop(c) => boxed(ClosedLoop::new(c, seed)),
            TrafficSpec::Conversations(c) => boxed(Conversations::new(c, seed)),
            TrafficSpec::LongPromptMix(c) => boxed(LongPromptMix::new(c, seed)),
            TrafficSpec::Family(c) => boxed(Family::new(c, seed)),
            TrafficSpec::Trace { .. } => return None,
        })
    }
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
        ScenarioReader::new(path).scenario(raw)
    }

    /// The merged traffic of this scenario for a given seed.
    pub fn traffic_source(&self, seed: u64) -> Result<Box<dyn TrafficSource>, TrafficError> {
        let mut sources: Vec<Box<dyn TrafficSource>> = Vec::with_capacity(self.traffic.len());
        for (i, t) in self.traffic.iter().enumerate() {
            sources.push(match t {
                TrafficSpec::Trace {
                    path,
                    format,
                    options,
                } => {
                    let mut options = options.clone();
                    if options.start_after_warmup {
                        options.start_offset = self.warmup_ns()?;
                    }
                    let resample_seed = derive_seed(seed, RESAMPLE_STREAM + i as u64);
                    open_trace(path, format.clone(), &options, resample_seed)?
                }
                synthetic => synthetic
                    .generator(derive_seed(seed, TRAFFIC_STREAM + i as u64))
                    .expect("every source but a trace has a generator")?,
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
    /// - `family`: `rate_per_s` × scale (sessions, requests and batch jobs start more often;
    ///   what each is, and the day's length, unchanged);
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
                TrafficSpec::Family(c) => (TrafficSpec::Family(c.with_load_scale(scale)), true),
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
                    let kind = t.kind();
                    let LoadScale::Refused(why) = kind.load_scale else {
                        unreachable!("the catalog refuses to scale a closed loop");
                    };
                    return Err(InputError::new(
                        file,
                        format!("traffic[{i}].{}", kind.name),
                        format!("its load cannot be scaled: {why}"),
                    )
                    .valid(format!(
                        "open-loop sources ({}); model the users as an arrival rate to measure \
                         capacity",
                        catalog::scalable_names()
                    )));
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
            .valid(format!(
                "at least one rate-driven source ({}; a burst with repeats > 1)",
                catalog::scalable_names()
            )));
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

    /// The scenario's trace sources with their places in `traffic` (`traffic[i]`): what
    /// `validate` reads whole and `trace stats` describes.
    pub fn trace_sources(
        &self,
    ) -> impl Iterator<Item = (usize, &Path, &TraceFormat, &ReplayOptions)> + '_ {
        self.traffic
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t {
                TrafficSpec::Trace {
                    path,
                    format,
                    options,
                } => Some((i, path.as_path(), format, options)),
                _ => None,
            })
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
                        "traffic[{i}] ({name}{part}) is a new local block-bootstrap resample \
                         of the trace on each seed ({how}, each drawn within {:.0} s of its own \
                         time, so the rate's shape over the trace is kept; a session's requests \
                         stay together), so the intervals carry the traffic's variability",
                        loaded.window_ns(block_ns).unwrap_or(0) as f64 / 1e9
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
        if let Some(w) = self.warmup_note()? {
            sentence.push(' ');
            sentence.push_str(&w);
        }
        Ok(SeedMeaning {
            short: short.join(" + "),
            sentence,
        })
    }

    /// The setup with another seed.
    pub fn setup_for_seed(&self, seed: u64) -> SimSetup {
        SimSetup {
            seed,
            ..self.setup.clone()
        }
    }
}
