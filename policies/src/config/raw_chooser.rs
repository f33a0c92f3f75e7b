//! Validation of a raw chooser (ours and the field's rules) into a [`Chooser`].

use super::raw::*;
use super::*;

/// Most candidates wait-and-widen may open (a bound so a decision stays a short scan).
pub const MAX_WIDEN_CANDIDATES: u32 = 1024;

/// Largest pulsar `key_blocks`: 2^20 blocks of 512 tokens is far beyond any context window, so
/// a larger key would mean the same (the whole prompt); the bound keeps a typo such as `1e12`
/// from passing as "the whole prompt" silently.
pub const MAX_KEY_BLOCKS: u32 = 1 << 20;

/// Largest weight of a `predictive` future term (`reserve`, `evict`): 100 x a request's own
/// completion time is past any use, so a larger figure is a typo.
pub const MAX_FUTURE_WEIGHT: f64 = 100.0;

/// A future term's weight: in `[0, MAX_FUTURE_WEIGHT]`.
fn future_weight(field: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let x = non_negative(field, v, default)?;
    if x > MAX_FUTURE_WEIGHT {
        return Err(invalid(
            field,
            format!("{x} is above {MAX_FUTURE_WEIGHT}; valid: 0 (off) to {MAX_FUTURE_WEIGHT}"),
        ));
    }
    Ok(x)
}

impl RawChooser {
    /// The peer rules' parameters that are set.
    fn peer_fields(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! seen {
            ($($f:ident),*) => { $( if self.$f.is_some() { v.push(stringify!($f)); } )* };
        }
        seen!(
            cutoffs,
            oracle_tuned,
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
            prefix_aware,
            reserve,
            evict
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
            reserve: future_weight("reserve", self.reserve, d.reserve)?,
            evict: future_weight("evict", self.evict, d.evict)?,
        })
    }

    /// `sita`'s cut-offs over the defaults `d`.
    fn sita(&self, d: SitaParams) -> Result<SitaParams, ConfigError> {
        let oracle_tuned = self.oracle_tuned.unwrap_or(d.oracle_tuned);
        let Some(list) = &self.cutoffs else {
            let mut p = d;
            p.oracle_tuned = oracle_tuned;
            return Ok(p);
        };
        let whole = list
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                rule::whole(x, 1, u64::from(u32::MAX))
                    .map_err(|e| invalid(&format!("cutoffs[{i}]"), e.to_string()))
            })
            .collect::<Result<Vec<u64>, _>>()?;
        SitaParams::new(&whole, oracle_tuned).map_err(|e| invalid("cutoffs", e.to_string()))
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
            Chooser::Sita(d) => Chooser::Sita(self.sita(d)?),
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
