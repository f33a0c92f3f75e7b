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
use crate::sita::SitaParams;
use crate::weights::{
    AtLoadConfig, AtLoadWeights, Clamp, EqualWeights, LiveConfig, LiveWeights, OracleWeights,
    PrefillProbe, ProbeConfig, ProbeWeights, SlowStart, TableConfig, TableWeights, WeightStrategy,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

mod names;
mod raw;
mod raw_chooser;
mod raw_weights;

use raw::invalid;
pub use raw::{RawAffinity, RawCap, RawChooser, RawPolicy, RawWeights};

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

    /// A fresh strategy (wrapped in its [`Shaping`](crate::weights::Shaping) when that changes anything).
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

/// What a policy is when a verdict names it, decided from its validated config (never from its
/// name, so a YAML policy with a name of its own is classified like the preset it composes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyRole {
    /// One of the field's routers (`rules.rs`): what a user could deploy instead.
    Field,
    /// Oracle weights: the true capacities, which only the lab knows; an upper bound to measure
    /// the others against, not a policy a gateway can deploy.
    Oracle,
    /// Everything else: the source's presets and our own compositions.
    #[default]
    Ours,
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

    /// True when the policy reads what only the lab knows: the oracle's weights (the true
    /// capacities) or `sita` cut-offs searched on the scenario reported (`sita-oracle`), so it
    /// is an upper bound to compare with, not one a gateway can deploy.
    pub fn is_oracle(&self) -> bool {
        matches!(self.weights, WeightsConfig::Oracle(_))
            || matches!(self.chooser, Chooser::Sita(p) if p.oracle_tuned)
    }

    /// What the policy is in a verdict. Oracle weights first: a field rule composed over them
    /// (`oracle/least-load`) reads what no gateway knows, so it is no router a user could
    /// deploy instead; then the field's rules; else ours.
    pub fn role(&self) -> PolicyRole {
        if self.is_oracle() {
            PolicyRole::Oracle
        } else if self.chooser.is_peer_rule() {
            PolicyRole::Field
        } else {
            PolicyRole::Ours
        }
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

/// Which bound of an SLO a value is (for [`implausible_slo_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloBound {
    /// Time to first token.
    Ttft,
    /// Time per output token.
    Tpot,
}

/// The range of each SLO bound, in seconds, that no host warns about: `(TTFT low, TTFT high)`,
/// `(TPOT low, TPOT high)`. Outside it a bound is legal but almost certainly a unit slip
/// (`ttft_s: 2000` meant in milliseconds, `tpot<=100s` meant `100ms`): a TTFT bound above the
/// gateway's default response timeout (300 s) would be cut by the gateway before it could be
/// missed, and one under 10 ms is below any network round trip plus a prefill step; a TPOT
/// bound above 1 s is slower than one token a second, and one under 1 ms is faster than any
/// engine decodes a single sequence.
pub const PLAUSIBLE_SLO_S: [(SloBound, f64, f64); 2] =
    [(SloBound::Ttft, 0.01, 300.0), (SloBound::Tpot, 0.001, 1.0)];

/// Why an SLO bound of `seconds` is implausible, in words a host appends to the field it names
/// (`slo.ttft_s`, `--slo`), or `None` when it is within [`PLAUSIBLE_SLO_S`]. **The one
/// plausibility rule** of an SLO: the scenario reader, `capacity --slo` and the gateway's
/// configuration warn by it (a warning, not an error: an unusual bound may be meant).
pub fn implausible_slo_bound(bound: SloBound, seconds: f64) -> Option<String> {
    let (_, low, high) = PLAUSIBLE_SLO_S.into_iter().find(|(b, ..)| *b == bound)?;
    let what = match bound {
        SloBound::Ttft => "time to first token",
        SloBound::Tpot => "time per output token",
    };
    if seconds > high {
        Some(format!(
            "a {what} bound of {seconds} s is implausibly long (above {high} s); \
             was it meant in milliseconds?"
        ))
    } else if seconds < low {
        Some(format!(
            "a {what} bound of {seconds} s is implausibly short (below {low} s); \
             was it meant in seconds?"
        ))
    } else {
        None
    }
}

impl PolicyConfig {
    /// Whether workers with these context windows (one model's) can serve every band of a
    /// `sita` chooser; `Ok` for every other chooser. Hosts check their configured workers.
    pub fn sita_fits(&self, windows: &[u32]) -> Result<(), crate::sita::BandError> {
        match &self.chooser {
            Chooser::Sita(p) => p.fits(windows),
            _ => Ok(()),
        }
    }

    /// True when the chooser aims at an SLO and has no bounds of its own: it aims at the one
    /// its host hands it (`Router::aim_at`: the simulator's scenario `slo`, the gateway's
    /// top-level `slo`), and without one it routes by predicted completion alone.
    pub fn awaits_host_slo(&self) -> bool {
        matches!(&self.chooser, Chooser::Predictive(p) if p.ttft_s.is_none() && p.tpot_s.is_none())
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

#[cfg(test)]
mod tests {
    use super::raw_chooser::MAX_KEY_BLOCKS;
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
    fn a_policys_role_comes_from_its_config_not_its_name() {
        let role = |n: &str| PolicyConfig::from_name(n).unwrap().role();
        assert_eq!(role("least-load"), PolicyRole::Field);
        assert_eq!(role("kv-cost"), PolicyRole::Field);
        assert_eq!(role("seed-v3"), PolicyRole::Ours);
        assert_eq!(role("predictive"), PolicyRole::Ours);
        assert_eq!(role("oracle/sed/capacity/weighted:24"), PolicyRole::Oracle);
        // A field rule over oracle weights reads what no gateway knows: the lab's, not the field's.
        assert_eq!(role("oracle/least-load"), PolicyRole::Oracle);
        // A YAML policy names itself: the name says nothing, the parts decide.
        for n in ["oracle/p2c", "cache-aware", "seed-v1"] {
            let mut c = PolicyConfig::from_name(n).unwrap();
            let expected = c.role();
            c.name = "my-router".into();
            assert_eq!(c.role(), expected, "{n}");
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
            "preset: predictive\nchooser: { kind: predictive, ttft_s: 30, tpot_s: 0.1, scan: 2, pool_prefill_tok_s: 15928, prefix_aware: false, victims: 0.5, reserve: 2, evict: 0.5 }",
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
                reserve: 2.0,
                evict: 0.5,
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
            ("reserve: -0.5", "chooser.reserve"),
            ("reserve: 101", "chooser.reserve"),
            ("evict: .nan", "chooser.evict"),
            ("evict: 1e9", "chooser.evict"),
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

    /// Issue 41: the one plausibility rule of an SLO bound, and which policies await a host's SLO.
    #[test]
    fn implausible_slo_bounds_and_the_policies_that_aim_at_a_hosts_slo() {
        assert_eq!(implausible_slo_bound(SloBound::Ttft, 30.0), None);
        assert_eq!(implausible_slo_bound(SloBound::Tpot, 0.1), None);
        let long = implausible_slo_bound(SloBound::Ttft, 2000.0).unwrap();
        assert!(
            long.contains("implausibly long") && long.contains("milliseconds"),
            "{long}"
        );
        assert!(implausible_slo_bound(SloBound::Tpot, 100.0).is_some());
        assert!(implausible_slo_bound(SloBound::Tpot, 0.0001).is_some());
        assert!(implausible_slo_bound(SloBound::Ttft, 0.002).is_some());
        assert!(
            PolicyConfig::preset("predictive")
                .unwrap()
                .awaits_host_slo()
        );
        assert!(
            !PolicyConfig::preset("least-load")
                .unwrap()
                .awaits_host_slo()
        );
        let own = PolicyEntry::Full(Box::new(
            crate::located::parse_yaml(
                "preset: predictive\nchooser: { kind: predictive, tpot_s: 0.1 }",
                "p.yaml",
            )
            .unwrap(),
        ));
        assert!(!own.build().unwrap().awaits_host_slo());
    }
}
