//! Validation of a raw weight strategy into a [`WeightsConfig`].

use super::raw::*;
use super::*;
use crate::weights::{Shaping, Unmeasured};

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
