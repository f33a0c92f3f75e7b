//! Policy configuration: raw serde structs at the edge, validated domain types inside, and the
//! named presets that reproduce the source's history.
//!
//! A policy is four independent parts: weights, chooser, affinity, cap. In YAML:
//!
//! ```yaml
//! name: mine            # optional; defaults to the preset or composition name
//! preset: seed-v3       # optional base; the parts below override it
//! weights: { kind: probe, warmup: true, clamp: [0.25, 8] }
//! chooser: { kind: sed, ties: higher-weight }
//! affinity: { kind: capacity, base: 2, per_1k_tokens: 0.25, max: 8 }
//! cap: { kind: weighted, limit: 24 }
//! prefix_knowledge: approximate   # the default; or unbounded, or kv-events
//! kv_event_delay_s: 0             # kv-events only: how late the engines' events arrive
//! ```
//!
//! On a command line a policy is a preset name (`seed-v3`) or a composition
//! `WEIGHTS[/CHOOSER[:TIES]][/AFFINITY][/CAP[:N]][/KNOWLEDGE[:DELAY_S]]`, e.g.
//! `at-load/sed/capacity/weighted:24` or `probe/p2c/capacity/flat:24/kv-events:0.05`. The
//! knowledge is a policy-level field, not part of `affinity`, because the field's routers read
//! the prefix index too and have no affinity part.

use crate::catalog;
use crate::chooser::{Chooser, TieRule};
use crate::error::{ConfigError, PrefillProbeTooLong};
use crate::located::{InputError, rule};
use crate::predictive::PredictiveParams;
use crate::weights::{
    AtLoadConfig, AtLoadWeights, Clamp, EqualWeights, LiveConfig, LiveWeights, OracleWeights,
    PrefillProbe, ProbeConfig, ProbeWeights, Shaping, SlowStart, TableConfig, TableWeights,
    Unmeasured, WeightStrategy,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Which weight strategy, with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightsConfig {
    /// v1: GPU-name table.
    Table(TableConfig),
    /// v2: the live correction.
    Live(LiveConfig),
    /// v3: the burst probe.
    Probe(ProbeConfig),
    /// Lab only: true capacity.
    Oracle(Clamp),
    /// All 1.0.
    Equal,
    /// Ours: capacity measured passively at load.
    AtLoad(AtLoadConfig),
}

impl WeightsConfig {
    /// Valid kind names.
    pub const NAMES: &'static [&'static str] = &catalog::names(&catalog::WEIGHTS);

    /// The kind's name.
    pub fn name(&self) -> &'static str {
        match self {
            WeightsConfig::Table(_) => "table",
            WeightsConfig::Live(_) => "live",
            WeightsConfig::Probe(_) => "probe",
            WeightsConfig::Oracle(_) => "oracle",
            WeightsConfig::Equal => "equal",
            WeightsConfig::AtLoad(_) => "at-load",
        }
    }

    /// Default parameters of a kind.
    pub fn from_name(name: &str) -> Option<WeightsConfig> {
        Some(match name {
            "table" => WeightsConfig::Table(TableConfig::default()),
            "live" => WeightsConfig::Live(LiveConfig::default()),
            "probe" => WeightsConfig::Probe(ProbeConfig::default()),
            "oracle" => WeightsConfig::Oracle(Clamp::SOURCE),
            "equal" => WeightsConfig::Equal,
            "at-load" => WeightsConfig::AtLoad(AtLoadConfig::default()),
            _ => return None,
        })
    }

    /// A fresh strategy (wrapped in its [`Shaping`] when that changes anything).
    pub fn build(&self) -> Box<dyn WeightStrategy> {
        match self {
            WeightsConfig::Table(c) => Box::new(TableWeights::new(c.clone())),
            WeightsConfig::Live(c) => c
                .shaping
                .wrap(Box::new(LiveWeights::new(c.clone())), c.clamp),
            WeightsConfig::Probe(c) => c
                .shaping
                .wrap(Box::new(ProbeWeights::new(c.clone())), c.clamp),
            WeightsConfig::Oracle(c) => Box::new(OracleWeights::new(*c)),
            WeightsConfig::Equal => Box::new(EqualWeights),
            WeightsConfig::AtLoad(c) => c
                .shaping
                .wrap(Box::new(AtLoadWeights::new(c.clone())), c.clamp),
        }
    }
}

/// In which units "busier" is measured for prefix affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityUnits {
    /// Raw in-flight counts (the source's bug).
    Raw,
    /// in_flight / weight, the unit of the main choice (the source's fix).
    Capacity,
}

/// How much busier than the freest candidate a prefix holder may be and still be kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowance {
    /// Allowance for a short prompt.
    pub base: f64,
    /// Added per 1,000 prompt tokens (long prompts gain more from a cache hit).
    pub per_1k_tokens: f64,
    /// Upper bound.
    pub max: f64,
}

impl Default for Allowance {
    fn default() -> Self {
        Allowance {
            base: 2.0,
            per_1k_tokens: 0.25,
            max: 8.0,
        }
    }
}

impl Allowance {
    /// Allowance for a prompt of `tokens`.
    pub fn at(&self, tokens: u32) -> f64 {
        (self.base + self.per_1k_tokens * f64::from(tokens) / 1000.0).min(self.max)
    }
}

/// Prefix-cache affinity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Affinity {
    /// Ignore prefixes.
    None,
    /// Prefer the worker that last served the longest prefix.
    Prefix {
        /// Units of "busier".
        units: AffinityUnits,
        /// How much busier is allowed.
        allowance: Allowance,
        /// Blocks the router's prefix index remembers: the whole fleet's under `unbounded`; under
        /// `approximate`, those of the workers whose cache size is unknown (the others are
        /// bounded by their own).
        index_blocks: usize,
    },
}

impl Affinity {
    /// Valid kind names.
    pub const NAMES: &'static [&'static str] = &catalog::names(&catalog::AFFINITIES);
    /// Blocks the router's prefix index remembers unless the policy says otherwise.
    pub const DEFAULT_INDEX_BLOCKS: usize = 1 << 16;
    /// How a composition writes [`Affinity::None`] (`none` alone would be read as a cap).
    pub const NO_AFFINITY: &'static str = "no-affinity";

    /// The part as a composition writes it: `capacity`, `raw`, `no-affinity`.
    pub fn composition(&self) -> &'static str {
        match self {
            Affinity::None => Self::NO_AFFINITY,
            _ => self.name(),
        }
    }

    /// The kind's name.
    pub fn name(&self) -> &'static str {
        match self {
            Affinity::None => "none",
            Affinity::Prefix {
                units: AffinityUnits::Raw,
                ..
            } => "raw",
            Affinity::Prefix {
                units: AffinityUnits::Capacity,
                ..
            } => "capacity",
        }
    }

    /// Default parameters of a kind.
    pub fn from_name(name: &str) -> Option<Affinity> {
        let units = match name {
            "none" => return Some(Affinity::None),
            "raw" => AffinityUnits::Raw,
            "capacity" => AffinityUnits::Capacity,
            _ => return None,
        };
        Some(Affinity::Prefix {
            units,
            allowance: Allowance::default(),
            index_blocks: Self::DEFAULT_INDEX_BLOCKS,
        })
    }
}

/// What the router knows about the engines' prefix caches: the knowledge behind whatever reads
/// the prefix index (prefix affinity and the field's routers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefixKnowledge {
    /// The router records what it dispatched, and its record of each worker is bounded by that
    /// worker's cache size in blocks ([`crate::WorkerSpec::cache_blocks`]; a worker whose size is
    /// unknown shares one bound of the affinity's `index_blocks`), forgetting the oldest first.
    Approximate,
    /// One index of `index_blocks` blocks for the whole fleet, whatever the engines hold (the
    /// index before the knowledge modes, kept for comparison).
    Unbounded,
    /// The engines publish the blocks they store and evict (vLLM's KV events) and the router
    /// mirrors them, `delay` after they happen; nothing is recorded at dispatch.
    KvEvents {
        /// How long an event takes to reach the router.
        delay: Duration,
    },
}

impl PrefixKnowledge {
    /// Valid mode names.
    pub const NAMES: &'static [&'static str] = &catalog::names(&catalog::KNOWLEDGE);
    /// The knowledge of a policy that names none.
    pub const DEFAULT: PrefixKnowledge = PrefixKnowledge::Approximate;

    /// The mode's name.
    pub fn name(&self) -> &'static str {
        match self {
            PrefixKnowledge::Approximate => "approximate",
            PrefixKnowledge::Unbounded => "unbounded",
            PrefixKnowledge::KvEvents { .. } => "kv-events",
        }
    }

    /// A mode with its default parameters.
    pub fn from_name(name: &str) -> Option<PrefixKnowledge> {
        Some(match name {
            "approximate" => PrefixKnowledge::Approximate,
            "unbounded" => PrefixKnowledge::Unbounded,
            "kv-events" => PrefixKnowledge::KvEvents {
                delay: Duration::ZERO,
            },
            _ => return None,
        })
    }

    /// The part as a composition writes it: `approximate`, `kv-events:0.05`.
    pub fn composition(&self) -> String {
        match self {
            PrefixKnowledge::KvEvents { delay } if !delay.is_zero() => {
                format!("{}:{}", self.name(), delay.as_secs_f64())
            }
            _ => self.name().to_string(),
        }
    }

    /// The delay of a `kv-events` mode written `SECONDS` (a composition's `kv-events:0.05`, a
    /// YAML `kv_event_delay_s`): the shared rule for seconds (finite, 0 or more).
    fn with_delay(self, field: &str, seconds: f64) -> Result<PrefixKnowledge, ConfigError> {
        match self {
            PrefixKnowledge::KvEvents { .. } => Ok(PrefixKnowledge::KvEvents {
                delay: rule::seconds(seconds).map_err(|e| invalid(field, e.to_string()))?,
            }),
            other => Err(invalid(
                field,
                format!(
                    "applies only to `{KNOWLEDGE_FIELD}: kv-events`, not `{}`",
                    other.name()
                ),
            )),
        }
    }
}

/// The YAML field that names a policy's [`PrefixKnowledge`].
pub const KNOWLEDGE_FIELD: &str = "prefix_knowledge";

/// Per-worker concurrency cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Uncapped.
    None,
    /// The same cap for every worker (source: 24).
    Flat(u32),
    /// The cap scaled by the worker's weight (at least 1).
    Weighted(u32),
}

impl Cap {
    /// Valid kind names.
    pub const NAMES: &'static [&'static str] = &catalog::names(&catalog::CAPS);
    /// The limit of `flat` and `weighted` when none is given (the source's 24).
    pub const DEFAULT_LIMIT: u32 = 24;

    /// The part as a composition writes it: `none`, `flat:24`, `weighted:16`.
    pub fn composition(&self) -> String {
        match self {
            Cap::None => self.name().to_string(),
            Cap::Flat(n) | Cap::Weighted(n) => format!("{}:{n}", self.name()),
        }
    }

    /// The kind's name.
    pub fn name(&self) -> &'static str {
        match self {
            Cap::None => "none",
            Cap::Flat(_) => "flat",
            Cap::Weighted(_) => "weighted",
        }
    }
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Display name (a preset's name, a composition string, or the YAML `name`).
    pub name: String,
    /// Weight strategy.
    pub weights: WeightsConfig,
    /// Chooser.
    pub chooser: Chooser,
    /// Prefix affinity.
    pub affinity: Affinity,
    /// Concurrency cap.
    pub cap: Cap,
    /// What the router knows about the engines' prefix caches.
    pub knowledge: PrefixKnowledge,
}

impl PolicyConfig {
    /// The tie rule of a composition's chooser when it names none.
    pub const DEFAULT_TIES: TieRule = TieRule::HigherWeight;

    /// True when the weights are the oracle's: the true capacities, which only the lab knows,
    /// so the policy is an upper bound to compare with, not one a gateway can deploy.
    pub fn is_oracle(&self) -> bool {
        matches!(self.weights, WeightsConfig::Oracle(_))
    }

    /// True when something reads the router's prefix index: a prefix affinity or one of the
    /// field's routers (their rules carry their own prefix preference). Without a reader the
    /// knowledge mode has nothing to inform.
    pub fn reads_prefixes(&self) -> bool {
        self.affinity != Affinity::None || self.chooser.reads_prefixes()
    }

    /// When the router mirrors the engines' KV events: the delay after which a host should hand
    /// them over; `None` for the other modes and for a policy that reads no prefixes.
    pub fn kv_event_delay(&self) -> Option<Duration> {
        match self.knowledge {
            PrefixKnowledge::KvEvents { delay } if self.reads_prefixes() => Some(delay),
            _ => None,
        }
    }

    /// What a composition fills in for the parts it omits: chooser, affinity, cap
    /// (`p2c:higher-weight`, `capacity`, `flat:24`).
    pub fn composition_default() -> (Chooser, Affinity, Cap) {
        (
            Chooser::P2c {
                ties: Self::DEFAULT_TIES,
            },
            Affinity::from_name("capacity").expect("known"),
            Cap::Flat(Cap::DEFAULT_LIMIT),
        )
    }

    /// The presets that are the field's routers (their chooser is a peer rule), in
    /// [`catalog::PRESETS`] order: one list for the tests and benches that cover them all.
    pub fn field_presets() -> impl Iterator<Item = &'static str> {
        catalog::PRESETS
            .iter()
            .map(|p| p.name)
            .filter(|n| PolicyConfig::preset(n).is_ok_and(|c| c.chooser.is_peer_rule()))
    }

    /// Whether a worker whose context window is `context_window` tokens can take the
    /// probe's prefill-bound requests of the `prefill_prompt_tokens` given and one output
    /// token; the reason when it cannot. Hosts check the workers they are configured with (a
    /// worker added later, like every worker when no length is given, gets prompts fitted to
    /// its window).
    pub fn prefill_probe_fits(&self, context_window: u32) -> Result<(), PrefillProbeTooLong> {
        // Without a length given, the prompts are fitted to each window.
        let WeightsConfig::Probe(ProbeConfig {
            prefill:
                Some(PrefillProbe {
                    prompt_tokens: Some(prompt),
                    ..
                }),
            ..
        }) = &self.weights
        else {
            return Ok(());
        };
        if *prompt < context_window {
            return Ok(());
        }
        Err(PrefillProbeTooLong {
            prompt_tokens: *prompt,
            context_window,
        })
    }

    /// A preset by name (the list is [`catalog::PRESETS`]).
    pub fn preset(name: &str) -> Result<PolicyConfig, ConfigError> {
        let p2c_first = Chooser::P2c {
            ties: TieRule::First,
        };
        let p2c_higher = Chooser::P2c {
            ties: TieRule::HigherWeight,
        };
        let raw = Affinity::from_name("raw").expect("known");
        let capacity = Affinity::from_name("capacity").expect("known");
        let probe = |warmup| {
            WeightsConfig::Probe(ProbeConfig {
                warmup,
                ..ProbeConfig::default()
            })
        };
        let (weights, chooser, affinity, cap) = match name {
            "seed-v1" => (
                WeightsConfig::Table(TableConfig::default()),
                p2c_first,
                raw,
                Cap::Flat(Cap::DEFAULT_LIMIT),
            ),
            "seed-v2" => (
                WeightsConfig::Live(LiveConfig::default()),
                p2c_first,
                raw,
                Cap::Flat(Cap::DEFAULT_LIMIT),
            ),
            "seed-v3-cold" => (
                probe(false),
                p2c_higher,
                capacity,
                Cap::Flat(Cap::DEFAULT_LIMIT),
            ),
            "seed-v3" => (
                probe(true),
                p2c_higher,
                capacity,
                Cap::Flat(Cap::DEFAULT_LIMIT),
            ),
            "seed-next" => (
                probe(true),
                p2c_higher,
                capacity,
                Cap::Weighted(Cap::DEFAULT_LIMIT),
            ),
            // The field's routers with their published defaults (catalog::PRESETS says why
            // equal weights, no affinity part and no cap).
            "sticky-until-saturated-measured" => (
                WeightsConfig::AtLoad(AtLoadConfig::default()),
                Chooser::STICKY_MEASURED,
                Affinity::None,
                Cap::None,
            ),
            // Ours: predicted latency from measured capacity; it weighs the prefix and the
            // load itself, so no affinity part and no cap. The burst probe's weights (with
            // warm-up) are its prior for a worker no traffic has measured yet: a cold fleet or a
            // restarted worker is not routed as if every worker were the same.
            // Its probe adds the prefill-bound burst: the prefill speed it predicts TTFT with,
            // measured before traffic has measured it.
            "predictive" => (
                WeightsConfig::Probe(ProbeConfig {
                    prefill: Some(PrefillProbe::DEFAULT),
                    ..ProbeConfig::default()
                }),
                Chooser::Predictive(PredictiveParams::DEFAULT),
                Affinity::None,
                Cap::None,
            ),
            peer if catalog::find(&catalog::PRESETS, peer).is_some()
                && let Some(chooser) = Chooser::from_name(peer, TieRule::First)
                && chooser.is_peer_rule() =>
            {
                (WeightsConfig::Equal, chooser, Affinity::None, Cap::None)
            }
            _ => {
                return Err(ConfigError::UnknownName {
                    field: "preset".into(),
                    what: "preset",
                    got: name.into(),
                    valid: catalog::joined(&catalog::PRESETS, ", "),
                });
            }
        };
        Ok(PolicyConfig {
            name: name.to_string(),
            weights,
            chooser,
            affinity,
            cap,
            knowledge: PrefixKnowledge::DEFAULT,
        })
    }

    /// A preset name or a composition
    /// `WEIGHTS[/CHOOSER[:TIES]][/AFFINITY][/CAP[:N]][/KNOWLEDGE[:DELAY_S]]`. Omitted parts
    /// default to [`PolicyConfig::composition_default`] (`p2c:higher-weight`, `capacity`,
    /// `flat:24`) and [`PrefixKnowledge::DEFAULT`].
    pub fn from_name(name: &str) -> Result<PolicyConfig, ConfigError> {
        if !name.contains('/') && WeightsConfig::from_name(name).is_none() {
            return PolicyConfig::preset(name);
        }
        let mut parts = name.split('/');
        let w = parts.next().unwrap_or_default();
        let weights = WeightsConfig::from_name(w).ok_or_else(|| ConfigError::UnknownName {
            field: "weights".into(),
            what: "weight strategy",
            got: w.into(),
            valid: WeightsConfig::NAMES.join(", "),
        })?;
        let (mut chooser, mut affinity, mut cap) = PolicyConfig::composition_default();
        let mut knowledge = None;
        for part in parts {
            let (head, arg) = match part.split_once(':') {
                Some((h, a)) => (h, Some(a)),
                None => (part, None),
            };
            if Chooser::NAMES.contains(&head) {
                let ties = match arg {
                    None => PolicyConfig::DEFAULT_TIES,
                    Some(t) => TieRule::parse(t).ok_or_else(|| ConfigError::UnknownName {
                        field: "chooser.ties".into(),
                        what: "tie rule",
                        got: t.into(),
                        valid: TieRule::NAMES.join(", "),
                    })?,
                };
                chooser = Chooser::from_name(head, ties).expect("listed");
            } else if Affinity::NAMES.contains(&head) && arg.is_none() && head != "none" {
                affinity = Affinity::from_name(head).expect("listed");
            } else if head == Affinity::NO_AFFINITY {
                affinity = Affinity::None;
            } else if let Some(k) = PrefixKnowledge::from_name(head) {
                knowledge = Some(match arg {
                    None => k,
                    Some(a) => {
                        let seconds = a.parse::<f64>().map_err(|_| {
                            invalid(
                                KNOWLEDGE_FIELD,
                                format!(
                                    "`{a}` is not a number of seconds (as in `kv-events:0.05`)"
                                ),
                            )
                        })?;
                        k.with_delay(KNOWLEDGE_FIELD, seconds)?
                    }
                });
            } else if Cap::NAMES.contains(&head) {
                let n = match arg {
                    None => Cap::DEFAULT_LIMIT,
                    Some(a) => a.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        ConfigError::Invalid {
                            field: "cap.limit".into(),
                            message: format!("`{a}` is not a whole number > 0"),
                        }
                    })?,
                };
                cap = match head {
                    "none" => Cap::None,
                    "flat" => Cap::Flat(n),
                    _ => Cap::Weighted(n),
                };
            } else {
                return Err(ConfigError::UnknownName {
                    field: "policy".into(),
                    what: "policy part",
                    got: part.into(),
                    valid: format!(
                        "a chooser ({}) optionally with :TIES, an affinity ({}), a cap ({}) optionally with :N, or a prefix knowledge ({}; kv-events optionally with :DELAY_S)",
                        Chooser::NAMES.join(", "),
                        Affinity::NAMES
                            .iter()
                            .filter_map(|&n| Affinity::from_name(n))
                            .filter(|a| *a != Affinity::None)
                            .map(|a| a.composition())
                            .chain([Affinity::NO_AFFINITY])
                            .collect::<Vec<_>>()
                            .join(", "),
                        Cap::NAMES.join(", "),
                        PrefixKnowledge::NAMES.join(", ")
                    ),
                });
            }
        }
        let mut cfg = PolicyConfig {
            name: name.to_string(),
            weights,
            chooser,
            affinity,
            cap,
            knowledge: PrefixKnowledge::DEFAULT,
        };
        if let Some(k) = knowledge {
            cfg.set_knowledge(k, KNOWLEDGE_FIELD)?;
        }
        Ok(cfg)
    }

    /// Set the knowledge a policy asked for explicitly: only a policy that reads prefixes can
    /// use one (an ignored setting would be silently dropped data).
    fn set_knowledge(&mut self, k: PrefixKnowledge, field: &str) -> Result<(), ConfigError> {
        if !self.reads_prefixes() {
            return Err(invalid(
                field,
                format!(
                    "`{}` has nothing to inform: the policy reads no prompt prefixes (give it a prefix affinity, raw or capacity, or one of the field's routers)",
                    k.name()
                ),
            ));
        }
        self.knowledge = k;
        Ok(())
    }

    /// Validate a raw (deserialized) policy.
    pub fn from_raw(raw: &RawPolicy) -> Result<PolicyConfig, ConfigError> {
        let mut cfg = match (&raw.preset, &raw.weights) {
            (Some(p), _) => PolicyConfig::preset(p)?,
            (None, Some(_)) => PolicyConfig::from_name("equal")?,
            (None, None) => {
                return Err(ConfigError::Invalid {
                    field: String::new(),
                    message: "a policy needs `preset` or `weights` (with optional `chooser`, `affinity`, `cap`)".into(),
                });
            }
        };
        let mut parts: Vec<String> = Vec::new();
        if let Some(w) = &raw.weights {
            cfg.weights = w.validate().map_err(|e| e.within("weights"))?;
            parts.push(cfg.weights.name().into());
        }
        if let Some(c) = &raw.chooser {
            // A chooser without `ties` keeps the base preset's rule (seed-v3's fix must not be
            // dropped silently), else the composition default, higher-weight.
            let default_ties = match (&raw.preset, cfg.chooser.ties()) {
                (Some(_), Some(t)) => t,
                _ => PolicyConfig::DEFAULT_TIES,
            };
            cfg.chooser = c.validate(default_ties).map_err(|e| e.within("chooser"))?;
            parts.push(cfg.chooser.name().into());
        }
        if let Some(a) = &raw.affinity {
            cfg.affinity = a.validate().map_err(|e| e.within("affinity"))?;
            parts.push(cfg.affinity.name().into());
        }
        if let Some(c) = &raw.cap {
            cfg.cap = c.validate().map_err(|e| e.within("cap"))?;
            parts.push(cfg.cap.name().into());
        }
        if let Some(k) = raw.knowledge()? {
            cfg.set_knowledge(k, KNOWLEDGE_FIELD)?;
            parts.push(k.name().into());
        }
        cfg.name = match (&raw.name, &raw.preset) {
            (Some(n), _) => {
                if n.trim().is_empty() {
                    return Err(ConfigError::Invalid {
                        field: "name".into(),
                        message: "must not be empty".into(),
                    });
                }
                n.clone()
            }
            (None, Some(p)) if parts.is_empty() => p.clone(),
            (None, Some(p)) => format!("{p}+{}", parts.join("+")),
            (None, None) => parts.join("/"),
        };
        Ok(cfg)
    }
}

/// A policy as a scenario or the gateway's configuration writes it: a preset or composition
/// name (`seed-v3`, `at-load/sed/capacity/weighted:24`), or a full definition. The one
/// "name or full policy" entry of routelab, shared by the simulator and the gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PolicyEntry {
    /// A preset or composition name.
    Name(String),
    /// A full policy.
    Full(Box<RawPolicy>),
}

impl PolicyEntry {
    /// Validate into a policy. Errors of a full definition name fields inside it (`weights.kind`);
    /// the host prefixes where the entry sits (`policies[2]`, `policy`).
    pub fn build(&self) -> Result<PolicyConfig, ConfigError> {
        match self {
            PolicyEntry::Name(n) => PolicyConfig::from_name(n),
            PolicyEntry::Full(raw) => PolicyConfig::from_raw(raw),
        }
    }

    /// [`PolicyEntry::build`] with a located error: the entry sits at field `at` (`policy`,
    /// `policies[2]`) of `file`.
    pub fn build_in(&self, file: &str, at: &str) -> Result<PolicyConfig, InputError> {
        self.build().map_err(|e| {
            let mut e = InputError::from_config(file, &e);
            // A composition that does not parse is wrong as a whole: its error is about the
            // entry itself, not about a field called `policy` inside it.
            if matches!(self, PolicyEntry::Name(_)) && e.field == "policy" {
                e.field.clear();
            }
            e.within(at)
        })
    }
}

// ----- raw (serde) side ----------------------------------------------------------------------

/// A policy as written in YAML.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Display name.
    pub name: Option<String>,
    /// Base preset.
    pub preset: Option<String>,
    /// Weight strategy.
    pub weights: Option<RawWeights>,
    /// Chooser.
    pub chooser: Option<RawChooser>,
    /// Affinity.
    pub affinity: Option<RawAffinity>,
    /// Cap.
    pub cap: Option<RawCap>,
    /// What the router knows about the engines' caches: one of [`PrefixKnowledge::NAMES`].
    pub prefix_knowledge: Option<String>,
    /// `kv-events` only: seconds before an engine's event reaches the router (default 0).
    pub kv_event_delay_s: Option<f64>,
}

impl RawPolicy {
    /// The prefix knowledge it asks for, validated; `None` when it names none.
    fn knowledge(&self) -> Result<Option<PrefixKnowledge>, ConfigError> {
        let Some(name) = self.prefix_knowledge.as_deref() else {
            return match self.kv_event_delay_s {
                None => Ok(None),
                Some(_) => Err(invalid(
                    "kv_event_delay_s",
                    format!("applies only with `{KNOWLEDGE_FIELD}: kv-events`"),
                )),
            };
        };
        let k = PrefixKnowledge::from_name(name).ok_or_else(|| ConfigError::UnknownName {
            field: KNOWLEDGE_FIELD.into(),
            what: "prefix knowledge",
            got: name.into(),
            valid: PrefixKnowledge::NAMES.join(", "),
        })?;
        match self.kv_event_delay_s {
            None => Ok(Some(k)),
            Some(s) => k.with_delay("kv_event_delay_s", s).map(Some),
        }
    }
}

/// Raw weight-strategy parameters; which apply depends on `kind`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawWeights {
    /// One of [`WeightsConfig::NAMES`].
    pub kind: String,
    /// table, live, at-load (prior): GPU name → weight of one card.
    pub table: Option<BTreeMap<String, f64>>,
    /// table, live: weight of an unknown card.
    pub unknown: Option<f64>,
    /// live, probe, oracle, at-load: `[min, max]`.
    pub clamp: Option<[f64; 2]>,
    /// live: re-derivation cadence.
    pub interval_s: Option<f64>,
    /// live: requests before the table figure is fully replaced.
    pub min_requests: Option<u32>,
    /// probe: concurrent requests per burst.
    pub concurrency: Option<u32>,
    /// probe: output tokens per request.
    pub output_tokens: Option<u32>,
    /// probe: prompt tokens per request.
    pub prompt_tokens: Option<u32>,
    /// probe: send a warm-up burst first.
    pub warmup: Option<bool>,
    /// probe: requests of the prefill-bound burst after each measurement (0: none).
    pub prefill_requests: Option<u32>,
    /// probe: prompt tokens of each prefill-bound request.
    pub prefill_prompt_tokens: Option<u32>,
    /// probe: result cache lifetime.
    pub cache_ttl_s: Option<f64>,
    /// probe: re-measure period (only when idle).
    pub reprobe_period_s: Option<f64>,
    /// probe: retry delay after a failed burst.
    pub retry_after_s: Option<f64>,
    /// at-load: forgetting time constant.
    pub time_constant_s: Option<f64>,
    /// at-load: samples needed before the estimate is trusted.
    pub min_samples: Option<f64>,
    /// at-load: re-derivation cadence.
    pub update_interval_s: Option<f64>,
    /// at-load: `equal` or `table`.
    pub prior: Option<String>,
    /// at-load: half-life of the weight's approach to its estimate, seconds of busy time.
    pub half_life_s: Option<f64>,
    /// at-load: busy seconds needed since the last change before a measured weight moves.
    pub min_busy_s: Option<f64>,
    /// at-load: largest factor one update may move a measured weight by.
    pub max_step: Option<f64>,
    /// live, probe, at-load: weight of an unmeasured worker (`neutral`, `floor`, `median`).
    pub unmeasured: Option<String>,
    /// live, probe, at-load: slow start of new and restarted workers.
    pub slow_start: Option<RawSlowStart>,
}

/// Raw slow start (Envoy's slow-start mode); omitted fields take [`SlowStart::default`].
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSlowStart {
    /// Length of the ramp, seconds (> 0).
    pub window_s: Option<f64>,
    /// Shape of the ramp (> 0; 1 is linear).
    pub aggression: Option<f64>,
    /// Smallest factor, in (0, 1].
    pub floor: Option<f64>,
}

impl RawSlowStart {
    /// Validate into a [`SlowStart`]; fields are named relative to `slow_start`.
    pub fn validate(&self) -> Result<SlowStart, ConfigError> {
        let d = SlowStart::default();
        let floor = match self.floor {
            None => d.floor,
            Some(x) => rule::share(x).map_err(|v| invalid("floor", v.to_string()))?,
        };
        Ok(SlowStart {
            window: seconds("window_s", self.window_s, d.window)?,
            aggression: positive("aggression", self.aggression, d.aggression)?,
            floor,
        })
    }
}

/// Raw chooser.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawChooser {
    /// One of [`Chooser::NAMES`].
    pub kind: String,
    /// Tie rule (p2c, sed, jsq, least-request).
    pub ties: Option<String>,
    /// least-request: active-request bias.
    pub bias: Option<f64>,
    /// cache-aware: imbalance threshold in requests.
    pub abs: Option<u32>,
    /// cache-aware: imbalance ratio.
    pub rel: Option<f64>,
    /// cache-aware: match ratio that wins.
    pub cache_threshold: Option<f64>,
    /// least-load: KV penalty weight, seconds.
    pub penalty_s: Option<f64>,
    /// least-load: engine poll interval, seconds.
    pub poll_s: Option<f64>,
    /// sticky-until-saturated: share of the prompt a sticky worker holds.
    pub match_fraction: Option<f64>,
    /// sticky-until-saturated: TTFT gap that breaks stickiness, seconds.
    pub gap_s: Option<f64>,
    /// sticky-until-saturated: pool prefill throughput, tokens/s.
    pub peak_prefill_tok_s: Option<f64>,
    /// sticky-until-saturated: scale it by each worker's weight.
    pub measured: Option<bool>,
    /// pulsar, wait-and-widen: leading prefix blocks the hash key covers (a whole number >= 1;
    /// read as a number so a negative or a fraction gets the rule's message, not serde's).
    pub key_blocks: Option<f64>,
    /// wait-and-widen: affinity-only window, seconds.
    pub window_s: Option<f64>,
    /// wait-and-widen: most candidates.
    pub max_candidates: Option<u32>,
    /// wait-and-widen: round trip, seconds.
    pub rtt_s: Option<f64>,
    /// kv-cost: weight of the prefill term.
    pub prefill_weight: Option<f64>,
    /// kv-cost: softmax temperature.
    pub temperature: Option<f64>,
    /// hit-minus-load: load weight.
    pub beta: Option<f64>,
    /// predictive: TTFT bound, seconds.
    pub ttft_s: Option<f64>,
    /// predictive: TPOT bound, seconds.
    pub tpot_s: Option<f64>,
    /// predictive: weight of the running requests' misses and damage.
    pub victims: Option<f64>,
    /// predictive: candidates scanned (a whole number >= 1; read as a number so a negative or
    /// a fraction gets the rule's message).
    pub scan: Option<f64>,
    /// predictive: one pool-wide prefill speed instead of measured ones (ablation), tok/s.
    pub pool_prefill_tok_s: Option<f64>,
    /// predictive: credit believed-cached prefixes.
    pub prefix_aware: Option<bool>,
}

/// Raw affinity.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawAffinity {
    /// `none`, `raw` or `capacity`.
    pub kind: String,
    /// Allowance for a short prompt.
    pub base: Option<f64>,
    /// Allowance added per 1,000 prompt tokens.
    pub per_1k_tokens: Option<f64>,
    /// Largest allowance.
    pub max: Option<f64>,
    /// Blocks the router's prefix index remembers (see [`Affinity::Prefix`]).
    pub index_blocks: Option<usize>,
}

/// Raw cap.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawCap {
    /// `none`, `flat` or `weighted`.
    pub kind: String,
    /// Requests per worker (weighted: per unit of weight).
    pub limit: Option<u32>,
}

fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The fields set on a part must be among its catalog entry's parameters (the one list of what
/// a weight kind or a chooser accepts).
fn only_fields_of(
    part: &catalog::Part,
    kind: &str,
    set: Vec<&'static str>,
) -> Result<(), ConfigError> {
    match set
        .into_iter()
        .find(|f| !part.params.iter().any(|p| p.name == *f))
    {
        Some(f) => Err(invalid(
            f,
            format!(
                "does not apply to kind `{kind}`; its fields are: {}",
                part.param_list()
            ),
        )),
        None => Ok(()),
    }
}

// The value rules are the ones every input shares (`located::rule`); these attach the field and
// the default of an omitted value.

fn positive(field: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::positive(x).map_err(|e| invalid(field, e.to_string()))
    })
}

fn non_negative(field: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::non_negative(x).map_err(|e| invalid(field, e.to_string()))
    })
}

/// A period: positive and bounded, so that `Duration` conversion cannot panic (1e20 did).
fn seconds(field: &str, v: Option<f64>, default: Duration) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::period(x).map_err(|e| invalid(field, e.to_string()))
    })
}

/// A duration that may be 0 ("no minimum"), bounded like every other.
fn non_negative_seconds(
    field: &str,
    v: Option<f64>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::seconds(x).map_err(|e| invalid(field, e.to_string()))
    })
}

fn count(field: &str, v: Option<u32>, default: u32) -> Result<u32, ConfigError> {
    v.map_or(Ok(default), |n| {
        rule::count(n).map_err(|e| invalid(field, e.to_string()))
    })
}

fn count_at_most(field: &str, v: Option<u32>, default: u32, max: u32) -> Result<u32, ConfigError> {
    v.map_or(Ok(default), |n| {
        rule::whole(f64::from(n), 1, u64::from(max))
            .map(|_| n)
            .map_err(|e| invalid(field, e.to_string()))
    })
}

fn clamp(v: Option<[f64; 2]>) -> Result<Clamp, ConfigError> {
    match v {
        None => Ok(Clamp::SOURCE),
        Some([min, max]) => {
            if !(min.is_finite() && max.is_finite() && min > 0.0) {
                Err(invalid(
                    "clamp",
                    format!(
                        "[{min}, {max}] is not valid; expected [min, max] with finite 0 < min <= max"
                    ),
                ))
            } else if min > max {
                Err(invalid(
                    "clamp",
                    format!("[{min}, {max}] is inverted: min must be <= max"),
                ))
            } else {
                Ok(Clamp { min, max })
            }
        }
    }
}

fn table(
    t: &Option<BTreeMap<String, f64>>,
    unknown: Option<f64>,
) -> Result<TableConfig, ConfigError> {
    let mut cfg = TableConfig::default();
    if let Some(t) = t {
        if t.is_empty() {
            return Err(invalid(
                "table",
                "the table is empty; give at least one `GPU name: weight` entry, or omit `table` for the source's table",
            ));
        }
        cfg.entries = Vec::with_capacity(t.len());
        for (name, w) in t {
            if name.trim().is_empty() {
                return Err(invalid("table", "a GPU name is empty"));
            }
            let w = positive(&format!("table.{name}"), Some(*w), 1.0)?;
            cfg.entries.push((name.clone(), w));
        }
    }
    cfg.unknown = positive("unknown", unknown, cfg.unknown)?;
    Ok(cfg)
}

impl RawWeights {
    fn set_fields(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! seen {
            ($($f:ident),*) => { $( if self.$f.is_some() { v.push(stringify!($f)); } )* };
        }
        seen!(
            table,
            unknown,
            clamp,
            interval_s,
            min_requests,
            concurrency,
            output_tokens,
            prompt_tokens,
            warmup,
            prefill_requests,
            prefill_prompt_tokens,
            cache_ttl_s,
            reprobe_period_s,
            retry_after_s,
            time_constant_s,
            min_samples,
            update_interval_s,
            prior,
            half_life_s,
            min_busy_s,
            max_step,
            unmeasured,
            slow_start
        );
        v
    }

    /// The shaping of new and unmeasured workers (live, probe, at-load).
    fn shaping(&self) -> Result<Shaping, ConfigError> {
        let unmeasured = match self.unmeasured.as_deref() {
            None => Unmeasured::default(),
            Some(n) => Unmeasured::from_name(n).ok_or_else(|| ConfigError::UnknownName {
                field: "unmeasured".into(),
                what: "unmeasured weight",
                got: n.into(),
                valid: Unmeasured::NAMES.join(", "),
            })?,
        };
        let slow_start = self
            .slow_start
            .as_ref()
            .map(|s| s.validate().map_err(|e| e.within("slow_start")))
            .transpose()?;
        Ok(Shaping {
            unmeasured,
            slow_start,
        })
    }

    /// The probe's prefill-bound part: `prefill_requests` > 0 turns it on.
    fn prefill_probe(&self) -> Result<Option<PrefillProbe>, ConfigError> {
        let d = PrefillProbe::DEFAULT;
        let requests = match self.prefill_requests {
            None | Some(0) => {
                if self.prefill_prompt_tokens.is_some() {
                    return Err(invalid(
                        "prefill_prompt_tokens",
                        "applies only with `prefill_requests` of 1 or more (0 or unset: no prefill-bound burst)".to_string(),
                    ));
                }
                return Ok(None);
            }
            Some(n) => count_at_most(
                "prefill_requests",
                Some(n),
                d.requests,
                crate::weights::MAX_PROBE_CONCURRENCY,
            )?,
        };
        let prompt_tokens = match self.prefill_prompt_tokens {
            None => None,
            given => Some(count_at_most(
                "prefill_prompt_tokens",
                given,
                PrefillProbe::PROMPT_TOKENS,
                crate::weights::MAX_PROBE_PROMPT_TOKENS,
            )?),
        };
        Ok(Some(PrefillProbe {
            requests,
            prompt_tokens,
        }))
    }

    /// Validate into a [`WeightsConfig`].
    pub fn validate(&self) -> Result<WeightsConfig, ConfigError> {
        // The fields each kind accepts are its parameters in the catalog.
        let Some(part) = catalog::find(&catalog::WEIGHTS, &self.kind) else {
            return Err(ConfigError::UnknownName {
                field: "kind".into(),
                what: "weight strategy",
                got: self.kind.clone(),
                valid: WeightsConfig::NAMES.join(", "),
            });
        };
        only_fields_of(part, &self.kind, self.set_fields())?;
        Ok(match self.kind.as_str() {
            "table" => WeightsConfig::Table(table(&self.table, self.unknown)?),
            "live" => {
                let d = LiveConfig::default();
                WeightsConfig::Live(LiveConfig {
                    table: table(&self.table, self.unknown)?,
                    interval: seconds("interval_s", self.interval_s, d.interval)?,
                    min_requests: count("min_requests", self.min_requests, d.min_requests)?,
                    clamp: clamp(self.clamp)?,
                    shaping: self.shaping()?,
                })
            }
            "probe" => {
                let d = ProbeConfig::default();
                WeightsConfig::Probe(ProbeConfig {
                    concurrency: count_at_most(
                        "concurrency",
                        self.concurrency,
                        d.concurrency,
                        crate::weights::MAX_PROBE_CONCURRENCY,
                    )?,
                    output_tokens: count("output_tokens", self.output_tokens, d.output_tokens)?,
                    prompt_tokens: count_at_most(
                        "prompt_tokens",
                        self.prompt_tokens,
                        d.prompt_tokens,
                        crate::weights::MAX_PROBE_PROMPT_TOKENS,
                    )?,
                    warmup: self.warmup.unwrap_or(d.warmup),
                    cache_ttl: seconds("cache_ttl_s", self.cache_ttl_s, d.cache_ttl)?,
                    reprobe_period: seconds(
                        "reprobe_period_s",
                        self.reprobe_period_s,
                        d.reprobe_period,
                    )?,
                    clamp: clamp(self.clamp)?,
                    retry_after: seconds("retry_after_s", self.retry_after_s, d.retry_after)?,
                    shaping: self.shaping()?,
                    prefill: self.prefill_probe()?,
                })
            }
            "oracle" => WeightsConfig::Oracle(clamp(self.clamp)?),
            "equal" => WeightsConfig::Equal,
            _ => {
                let d = AtLoadConfig::default();
                let [equal, with_table] = catalog::AT_LOAD_PRIORS;
                let prior = match self.prior.as_deref().unwrap_or(equal) {
                    p if p == equal => {
                        if self.table.is_some() || self.unknown.is_some() {
                            return Err(invalid(
                                "table",
                                format!("applies only with `prior: {with_table}`"),
                            ));
                        }
                        None
                    }
                    p if p == with_table => Some(table(&self.table, self.unknown)?),
                    other => {
                        return Err(ConfigError::UnknownName {
                            field: "prior".into(),
                            what: "prior",
                            got: other.into(),
                            valid: catalog::AT_LOAD_PRIORS.join(", "),
                        });
                    }
                };
                WeightsConfig::AtLoad(AtLoadConfig {
                    time_constant: seconds(
                        "time_constant_s",
                        self.time_constant_s,
                        d.time_constant,
                    )?,
                    min_samples: non_negative("min_samples", self.min_samples, d.min_samples)?,
                    update_interval: seconds(
                        "update_interval_s",
                        self.update_interval_s,
                        d.update_interval,
                    )?,
                    prior,
                    clamp: clamp(self.clamp)?,
                    half_life: seconds("half_life_s", self.half_life_s, d.half_life)?,
                    min_busy: non_negative_seconds("min_busy_s", self.min_busy_s, d.min_busy)?,
                    max_step: match self.max_step {
                        None => d.max_step,
                        Some(x) if x.is_finite() && x > 1.0 => x,
                        Some(x) => {
                            return Err(invalid(
                                "max_step",
                                rule::Violation::new(x, "a finite number > 1").to_string(),
                            ));
                        }
                    },
                    shaping: self.shaping()?,
                })
            }
        })
    }
}

/// Most candidates wait-and-widen may open (a bound so a decision stays a short scan).
pub const MAX_WIDEN_CANDIDATES: u32 = 1024;

/// Largest pulsar `key_blocks`: 2^20 blocks of 512 tokens is far beyond any context window, so
/// a larger key would mean the same (the whole prompt); the bound keeps a typo such as `1e12`
/// from passing as "the whole prompt" silently.
pub const MAX_KEY_BLOCKS: u32 = 1 << 20;

impl RawChooser {
    /// The peer rules' parameters that are set.
    fn peer_fields(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! seen {
            ($($f:ident),*) => { $( if self.$f.is_some() { v.push(stringify!($f)); } )* };
        }
        seen!(
            abs,
            rel,
            cache_threshold,
            penalty_s,
            poll_s,
            match_fraction,
            gap_s,
            peak_prefill_tok_s,
            measured,
            key_blocks,
            window_s,
            max_candidates,
            rtt_s,
            prefill_weight,
            temperature,
            beta,
            ttft_s,
            tpot_s,
            victims,
            scan,
            pool_prefill_tok_s,
            prefix_aware
        );
        v
    }

    /// `predictive`'s parameters over the defaults `d`.
    fn predictive(&self, d: PredictiveParams) -> Result<PredictiveParams, ConfigError> {
        let optional_positive =
            |field: &str, v: Option<f64>| v.map(|x| positive(field, Some(x), x)).transpose();
        Ok(PredictiveParams {
            ttft_s: optional_positive("ttft_s", self.ttft_s)?,
            tpot_s: optional_positive("tpot_s", self.tpot_s)?,
            victims: non_negative("victims", self.victims, d.victims)?,
            scan: self.scan.map_or(Ok(d.scan), |x| {
                rule::whole(x, 1, u64::from(MAX_WIDEN_CANDIDATES))
                    .map(|n| u32::try_from(n).unwrap_or(MAX_WIDEN_CANDIDATES))
                    .map_err(|e| invalid("scan", e.to_string()))
            })?,
            pool_prefill_tok_s: optional_positive("pool_prefill_tok_s", self.pool_prefill_tok_s)?,
            prefix_aware: self.prefix_aware.unwrap_or(d.prefix_aware),
        })
    }

    /// Validate into a [`Chooser`]; `default_ties` applies when `ties` is not given (the base
    /// preset's rule, else `higher-weight`, as in command-line compositions).
    pub fn validate(&self, default_ties: TieRule) -> Result<Chooser, ConfigError> {
        let ties = match self.ties.as_deref() {
            None => default_ties,
            Some(t) => TieRule::parse(t).ok_or_else(|| ConfigError::UnknownName {
                field: "ties".into(),
                what: "tie rule",
                got: t.into(),
                valid: TieRule::NAMES.join(", "),
            })?,
        };
        let chooser =
            Chooser::from_name(&self.kind, ties).ok_or_else(|| ConfigError::UnknownName {
                field: "kind".into(),
                what: "chooser",
                got: self.kind.clone(),
                valid: Chooser::NAMES.join(", "),
            })?;
        if self.ties.is_some() && chooser.ties().is_none() {
            return Err(invalid(
                "ties",
                format!(
                    "`{}` does not compare scores; ties apply to p2c, sed, jsq, least-request",
                    self.kind
                ),
            ));
        }
        // The field's rules' parameters: the fields a kind accepts are its catalog entry's.
        let part = catalog::find(&catalog::CHOOSERS, &self.kind).expect("a known chooser");
        only_fields_of(part, &self.kind, self.peer_fields())?;
        let fraction = |field: &str, v: Option<f64>, d: f64| {
            v.map_or(Ok(d), |x| {
                rule::fraction(x).map_err(|e| invalid(field, e.to_string()))
            })
        };
        let key_blocks = |d: u32| {
            self.key_blocks.map_or(Ok(d), |x| {
                rule::whole(x, 1, u64::from(MAX_KEY_BLOCKS))
                    .map(|n| u32::try_from(n).unwrap_or(MAX_KEY_BLOCKS))
                    .map_err(|e| invalid("key_blocks", e.to_string()))
            })
        };
        let chooser = match chooser {
            Chooser::Pulsar { key_blocks: d } => Chooser::Pulsar {
                key_blocks: key_blocks(d)?,
            },
            Chooser::CacheAware {
                abs,
                rel,
                cache_threshold,
            } => Chooser::CacheAware {
                abs: self.abs.unwrap_or(abs),
                rel: positive("rel", self.rel, rel)?,
                cache_threshold: fraction(
                    "cache_threshold",
                    self.cache_threshold,
                    cache_threshold,
                )?,
            },
            Chooser::LeastLoad { penalty_s, poll } => Chooser::LeastLoad {
                penalty_s: non_negative("penalty_s", self.penalty_s, penalty_s)?,
                poll: seconds("poll_s", self.poll_s, poll)?,
            },
            Chooser::StickyUntilSaturated {
                match_fraction,
                gap_s,
                peak_prefill_tok_s,
                measured,
            } => Chooser::StickyUntilSaturated {
                match_fraction: fraction("match_fraction", self.match_fraction, match_fraction)?,
                gap_s: non_negative("gap_s", self.gap_s, gap_s)?,
                peak_prefill_tok_s: positive(
                    "peak_prefill_tok_s",
                    self.peak_prefill_tok_s,
                    peak_prefill_tok_s,
                )?,
                measured: self.measured.unwrap_or(measured),
            },
            Chooser::WaitAndWiden {
                key_blocks: d,
                window_s,
                max_candidates,
                rtt_s,
            } => Chooser::WaitAndWiden {
                key_blocks: key_blocks(d)?,
                window_s: positive("window_s", self.window_s, window_s)?,
                max_candidates: count_at_most(
                    "max_candidates",
                    self.max_candidates,
                    max_candidates,
                    MAX_WIDEN_CANDIDATES,
                )?,
                rtt_s: non_negative("rtt_s", self.rtt_s, rtt_s)?,
            },
            Chooser::KvCost {
                prefill_weight,
                temperature,
            } => Chooser::KvCost {
                prefill_weight: non_negative(
                    "prefill_weight",
                    self.prefill_weight,
                    prefill_weight,
                )?,
                temperature: non_negative("temperature", self.temperature, temperature)?,
            },
            Chooser::HitMinusLoad { beta } => Chooser::HitMinusLoad {
                beta: non_negative("beta", self.beta, beta)?,
            },
            Chooser::Predictive(d) => Chooser::Predictive(self.predictive(d)?),
            other => other,
        };
        match (chooser, self.bias) {
            (Chooser::LeastRequest { ties, .. }, Some(b)) => {
                let bias = non_negative("bias", Some(b), Chooser::DEFAULT_BIAS)?;
                Ok(Chooser::LeastRequest { bias, ties })
            }
            (_, Some(_)) => Err(invalid("bias", "applies only to kind `least-request`")),
            (c, None) => Ok(c),
        }
    }
}

impl RawAffinity {
    /// Validate into an [`Affinity`].
    pub fn validate(&self) -> Result<Affinity, ConfigError> {
        let base = Affinity::from_name(&self.kind).ok_or_else(|| ConfigError::UnknownName {
            field: "kind".into(),
            what: "affinity",
            got: self.kind.clone(),
            valid: Affinity::NAMES.join(", "),
        })?;
        match base {
            Affinity::None => {
                if self.base.is_some()
                    || self.per_1k_tokens.is_some()
                    || self.max.is_some()
                    || self.index_blocks.is_some()
                {
                    return Err(invalid(
                        "kind",
                        "`none` takes no parameters (base, per_1k_tokens, max, index_blocks)",
                    ));
                }
                Ok(Affinity::None)
            }
            Affinity::Prefix {
                units,
                allowance,
                index_blocks,
            } => {
                let allowance = Allowance {
                    base: non_negative("base", self.base, allowance.base)?,
                    per_1k_tokens: non_negative(
                        "per_1k_tokens",
                        self.per_1k_tokens,
                        allowance.per_1k_tokens,
                    )?,
                    max: non_negative("max", self.max, allowance.max)?,
                };
                if allowance.max < allowance.base {
                    return Err(invalid(
                        "max",
                        format!(
                            "{} is below base {}: max must be >= base",
                            allowance.max, allowance.base
                        ),
                    ));
                }
                let index_blocks = self.index_blocks.unwrap_or(index_blocks);
                if index_blocks == 0 || index_blocks > 1 << 26 {
                    return Err(invalid(
                        "index_blocks",
                        format!("{index_blocks} is not valid; expected 1 to 67108864"),
                    ));
                }
                Ok(Affinity::Prefix {
                    units,
                    allowance,
                    index_blocks,
                })
            }
        }
    }
}

impl RawCap {
    /// Validate into a [`Cap`].
    pub fn validate(&self) -> Result<Cap, ConfigError> {
        match self.kind.as_str() {
            "none" => match self.limit {
                None => Ok(Cap::None),
                Some(_) => Err(invalid("limit", "does not apply to kind `none`")),
            },
            "flat" => Ok(Cap::Flat(count("limit", self.limit, Cap::DEFAULT_LIMIT)?)),
            "weighted" => Ok(Cap::Weighted(count(
                "limit",
                self.limit,
                Cap::DEFAULT_LIMIT,
            )?)),
            other => Err(ConfigError::UnknownName {
                field: "kind".into(),
                what: "cap",
                got: other.into(),
                valid: Cap::NAMES.join(", "),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_as_designed() {
        let v1 = PolicyConfig::preset("seed-v1").unwrap();
        assert_eq!(v1.weights.name(), "table");
        assert_eq!(
            v1.chooser,
            Chooser::P2c {
                ties: TieRule::First
            }
        );
        assert_eq!(v1.affinity.name(), "raw");
        assert_eq!(v1.cap, Cap::Flat(Cap::DEFAULT_LIMIT));
        let cold = PolicyConfig::preset("seed-v3-cold").unwrap();
        assert!(matches!(
            cold.weights,
            WeightsConfig::Probe(ProbeConfig { warmup: false, .. })
        ));
        let v3 = PolicyConfig::preset("seed-v3").unwrap();
        assert!(matches!(
            v3.weights,
            WeightsConfig::Probe(ProbeConfig { warmup: true, .. })
        ));
        assert_eq!(
            v3.chooser,
            Chooser::P2c {
                ties: TieRule::HigherWeight
            }
        );
        assert_eq!(v3.affinity.name(), "capacity");
        assert_eq!(
            PolicyConfig::preset("seed-next").unwrap().cap,
            Cap::Weighted(Cap::DEFAULT_LIMIT)
        );
        assert_eq!(
            PolicyConfig::preset("seed-v2").unwrap().weights.name(),
            "live"
        );
        for p in catalog::PRESETS {
            assert!(PolicyConfig::preset(p.name).is_ok());
        }
    }

    #[test]
    fn unknown_preset_lists_the_valid_ones() {
        let e = PolicyConfig::from_name("seed-v4").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("seed-v4") && msg.contains("seed-v3-cold"),
            "{msg}"
        );
    }

    #[test]
    fn compositions_parse() {
        let p = PolicyConfig::from_name("at-load/sed/capacity/weighted:16").unwrap();
        assert_eq!(p.weights.name(), "at-load");
        assert_eq!(
            p.chooser,
            Chooser::Sed {
                ties: TieRule::HigherWeight
            }
        );
        assert_eq!(p.cap, Cap::Weighted(16));
        let p = PolicyConfig::from_name("probe/p2c:random/no-affinity/none").unwrap();
        assert_eq!(p.affinity, Affinity::None);
        assert_eq!(p.cap, Cap::None);
        assert!(PolicyConfig::from_name("probe/p2c:sometimes").is_err());
        assert!(PolicyConfig::from_name("probe/flat:0").is_err());
        assert!(PolicyConfig::from_name("magic/sed").is_err());
    }

    /// The chooser part of a full policy definition, validated.
    fn chooser_of(yaml: &str) -> Result<Chooser, ConfigError> {
        let raw: RawPolicy =
            crate::located::parse_yaml(yaml, "p.yaml").unwrap_or_else(|e| panic!("{yaml}: {e}"));
        PolicyConfig::from_raw(&raw).map(|p| p.chooser)
    }

    #[test]
    fn key_blocks_is_a_whole_number_from_1_for_the_two_rules_that_hash_pulsars_key() {
        // Omitted: 1, so presets and existing definitions keep the first-block key.
        assert_eq!(
            chooser_of("weights: { kind: equal }\nchooser: { kind: pulsar }").unwrap(),
            Chooser::Pulsar { key_blocks: 1 }
        );
        assert_eq!(
            PolicyConfig::preset("pulsar").unwrap().chooser,
            Chooser::Pulsar { key_blocks: 1 }
        );
        assert_eq!(
            chooser_of("weights: { kind: equal }\nchooser: { kind: pulsar, key_blocks: 4 }")
                .unwrap(),
            Chooser::Pulsar { key_blocks: 4 }
        );
        assert!(matches!(
            chooser_of("preset: wait-and-widen\nchooser: { kind: wait-and-widen, key_blocks: 8 }")
                .unwrap(),
            Chooser::WaitAndWiden { key_blocks: 8, .. }
        ));
        let valid = format!("expected a whole number from 1 to {MAX_KEY_BLOCKS}");
        for kind in ["pulsar", "wait-and-widen"] {
            for (bad, got) in [
                ("0", "0"),
                ("-2", "-2"),
                ("1.5", "1.5"),
                ("1e12", "1000000000000"),
                (".nan", "NaN"),
            ] {
                let yaml = format!(
                    "weights: {{ kind: equal }}\nchooser: {{ kind: {kind}, key_blocks: {bad} }}"
                );
                let e = chooser_of(&yaml).unwrap_err();
                // The field path names the field; the message says what was given and what
                // would be valid.
                assert_eq!(e.field(), "chooser.key_blocks", "{yaml}");
                assert!(
                    matches!(e, ConfigError::Invalid { .. })
                        && e.to_string()
                            .contains(&format!("{got} is not valid; {valid}")),
                    "{yaml}: {e}"
                );
                // A host locates it in its file and list, as for every other policy field.
                let entry = PolicyEntry::Full(Box::new(
                    crate::located::parse_yaml(&yaml, "s.yaml").unwrap(),
                ));
                let located = entry.build_in("s.yaml", "policies[0]").unwrap_err();
                assert_eq!(located.field, "policies[0].chooser.key_blocks");
                assert!(
                    located
                        .to_string()
                        .starts_with("s.yaml: policies[0].chooser.key_blocks: "),
                    "{located}"
                );
            }
        }
        // Not a parameter of the other choosers.
        let e = chooser_of("weights: { kind: equal }\nchooser: { kind: p2c, key_blocks: 2 }")
            .unwrap_err();
        assert_eq!(e.field(), "chooser.key_blocks");
    }

    #[test]
    fn predictive_takes_its_bounds_and_ablations_and_refuses_bad_values_by_field() {
        let c = chooser_of(
            "preset: predictive\nchooser: { kind: predictive, ttft_s: 30, tpot_s: 0.1, scan: 2, pool_prefill_tok_s: 15928, prefix_aware: false, victims: 0.5 }",
        )
        .unwrap();
        assert_eq!(
            c,
            Chooser::Predictive(PredictiveParams {
                ttft_s: Some(30.0),
                tpot_s: Some(0.1),
                victims: 0.5,
                scan: 2,
                pool_prefill_tok_s: Some(15_928.0),
                prefix_aware: false,
            })
        );
        for (yaml, field) in [
            ("ttft_s: 0", "chooser.ttft_s"),
            ("tpot_s: -1", "chooser.tpot_s"),
            ("tpot_s: .nan", "chooser.tpot_s"),
            ("scan: 0", "chooser.scan"),
            ("scan: 2.5", "chooser.scan"),
            ("victims: -1", "chooser.victims"),
            ("pool_prefill_tok_s: .inf", "chooser.pool_prefill_tok_s"),
            ("beta: 1", "chooser.beta"),
        ] {
            let e = chooser_of(&format!(
                "preset: predictive\nchooser: {{ kind: predictive, {yaml} }}"
            ))
            .unwrap_err();
            assert_eq!(e.field(), field, "{yaml}: {e}");
        }
        // Its parameters are not the other choosers'.
        let e =
            chooser_of("weights: { kind: equal }\nchooser: { kind: p2c, scan: 4 }").unwrap_err();
        assert_eq!(e.field(), "chooser.scan");
    }
}
