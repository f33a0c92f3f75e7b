//! A policy from its name: the presets and the composition grammar
//! `WEIGHTS[/CHOOSER[:TIES]][/AFFINITY][/CAP[:N]][/KNOWLEDGE[:DELAY_S]]`, with `sita`'s
//! cut-offs in the name. The raw (YAML) form is validated in the parent module; both end in the
//! same [`PolicyConfig`].

use super::{
    Affinity, Cap, KNOWLEDGE_FIELD, PolicyConfig, PrefixKnowledge, WeightsConfig, raw::invalid,
};
use crate::catalog;
use crate::chooser::{Chooser, TieRule};
use crate::error::ConfigError;
use crate::predictive::PredictiveParams;
use crate::sita::SitaParams;
use crate::weights::{AtLoadConfig, LiveConfig, PrefillProbe, ProbeConfig, TableConfig};

impl PolicyConfig {
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
            "sita" => (
                probe(true),
                Chooser::Sita(SitaParams::default()),
                Affinity::None,
                Cap::None,
            ),
            sita if let Some(p) = sita_name(sita)? => {
                (probe(true), Chooser::Sita(p), Affinity::None, Cap::None)
            }
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
            // The originals' tree grows with every prompt sent, bounded only by a per-worker
            // character budget far above any worker's cache (issue 39), so a prefix they match
            // is one they sent, whether or not the engine still holds it.
            knowledge: if name == "cache-aware" {
                PrefixKnowledge::Unbounded
            } else {
                PrefixKnowledge::DEFAULT
            },
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
            if head == "sita" || head == SITA_ORACLE {
                chooser = Chooser::Sita(sita_name(part)?.unwrap_or_default());
            } else if Chooser::NAMES.contains(&head) {
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
}

/// The name that marks `sita`'s cut-offs as searched on the scenario reported.
const SITA_ORACLE: &str = "sita-oracle";

/// `sita:C1,C2` or `sita-oracle:C1,C2` (`sita-oracle` alone: one band), `None` for any other
/// name.
fn sita_name(name: &str) -> Result<Option<SitaParams>, ConfigError> {
    let (head, arg) = name.split_once(':').unwrap_or((name, ""));
    let oracle_tuned = match head {
        "sita" if !arg.is_empty() => false,
        SITA_ORACLE => true,
        _ => return Ok(None),
    };
    let field = "chooser.cutoffs";
    let cutoffs = arg
        .split(',')
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.trim().parse::<u64>().map_err(|_| {
                invalid(
                    field,
                    format!("`{c}` is not a whole number of tokens (as in `sita:4096,16384`)"),
                )
            })
        })
        .collect::<Result<Vec<u64>, _>>()?;
    SitaParams::new(&cutoffs, oracle_tuned)
        .map(Some)
        .map_err(|e| invalid(field, e.to_string()))
}
