//! The policy as written in YAML (serde, `deny_unknown_fields`) and the rules that attach a
//! field and a default to each value; `raw_weights` and `raw_chooser` validate those parts into
//! the domain types of [`super`].

use super::*;

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
    pub(super) fn knowledge(&self) -> Result<Option<PrefixKnowledge>, ConfigError> {
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
    /// sita: ascending cut-offs in uncached prompt tokens (read as numbers so a fraction or a
    /// negative gets the rule's message).
    pub cutoffs: Option<Vec<f64>>,
    /// sita: the cut-offs were searched on the scenario reported.
    pub oracle_tuned: Option<bool>,
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
    /// predictive: weight of the scarce-capacity term (0 off).
    pub reserve: Option<f64>,
    /// predictive: weight of the cache-eviction term (0 off).
    pub evict: Option<f64>,
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

pub(super) fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The fields set on a part must be among its catalog entry's parameters (the one list of what
/// a weight kind or a chooser accepts).
pub(super) fn only_fields_of(
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

pub(super) fn positive(field: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::positive(x).map_err(|e| invalid(field, e.to_string()))
    })
}

pub(super) fn non_negative(field: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::non_negative(x).map_err(|e| invalid(field, e.to_string()))
    })
}

/// A period: positive and bounded, so that `Duration` conversion cannot panic (1e20 did).
pub(super) fn seconds(
    field: &str,
    v: Option<f64>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::period(x).map_err(|e| invalid(field, e.to_string()))
    })
}

/// A duration that may be 0 ("no minimum"), bounded like every other.
pub(super) fn non_negative_seconds(
    field: &str,
    v: Option<f64>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |x| {
        rule::seconds(x).map_err(|e| invalid(field, e.to_string()))
    })
}

pub(super) fn count(field: &str, v: Option<u32>, default: u32) -> Result<u32, ConfigError> {
    v.map_or(Ok(default), |n| {
        rule::count(n).map_err(|e| invalid(field, e.to_string()))
    })
}

pub(super) fn count_at_most(
    field: &str,
    v: Option<u32>,
    default: u32,
    max: u32,
) -> Result<u32, ConfigError> {
    v.map_or(Ok(default), |n| {
        rule::whole(f64::from(n), 1, u64::from(max))
            .map(|_| n)
            .map_err(|e| invalid(field, e.to_string()))
    })
}

pub(super) fn clamp(v: Option<[f64; 2]>) -> Result<Clamp, ConfigError> {
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

pub(super) fn table(
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
