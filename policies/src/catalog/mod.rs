//! The catalog of policy parts: every weight strategy, chooser, tie rule, affinity, cap and
//! preset, with a one-line description and, for parametrised parts, their parameters and
//! defaults.
//!
//! It is the one list of names: the composition parser's `NAMES`, the validation messages'
//! `valid: …` lists, the fields a part accepts and `routelab policies` are all read from it.
//! Descriptions and defaults are rendered from the very constants and `Default` impls the
//! validated configuration uses, so the printed figures cannot drift from the code (a test
//! feeds every printed default back through validation).
//!
//! To add a part: add its entry here, then its variant where the kind is built
//! (`WeightsConfig::from_name`, `Chooser::from_name`, …); the agreement tests fail until both
//! exist.

use crate::config::{Affinity, Allowance, Cap, PolicyConfig, PrefixKnowledge};
use crate::weights::{LiveConfig, ProbeConfig};
use std::time::Duration;

/// A parameter of a part, as written in a policy's YAML.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// The YAML field.
    pub name: &'static str,
    /// The default as a YAML value; `None` when the default is not a single value (the source's
    /// GPU table).
    pub default: Option<fn() -> String>,
}

/// One part of a policy (or a preset).
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// Name in YAML and in compositions.
    pub name: &'static str,
    describe: fn() -> String,
    /// Parameters, in the order messages list them.
    pub params: &'static [Param],
}

impl Part {
    /// One line on what it does, with its default figures.
    pub fn description(&self) -> String {
        (self.describe)()
    }

    /// The parameter names, comma-separated, or `(none)`.
    pub fn param_list(&self) -> String {
        if self.params.is_empty() {
            "(none)".to_string()
        } else {
            self.params
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// The part of `section` named `name`.
pub fn find(section: &'static [Part], name: &str) -> Option<&'static Part> {
    section.iter().find(|p| p.name == name)
}

/// The names of a section, in order (usable in `const` items).
pub(crate) const fn names<const N: usize>(parts: &[Part; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = parts[i].name;
        i += 1;
    }
    out
}

/// A section's names joined with `sep`.
pub fn joined(section: &[Part], sep: &str) -> String {
    section.iter().map(|p| p.name).collect::<Vec<_>>().join(sep)
}

/// What a composition fills in for the parts it omits, e.g. `p2c:higher-weight, capacity,
/// flat:24`.
pub fn composition_defaults() -> String {
    let (chooser, affinity, cap) = PolicyConfig::composition_default();
    format!(
        "{}, {}, {}",
        chooser.composition(),
        affinity.composition(),
        cap.composition()
    )
}

// ----- rendering helpers ----------------------------------------------------------------------

/// A duration as YAML seconds.
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

// ----- the sections ---------------------------------------------------------------------------

mod choosers;
mod weight_strategies;

pub use choosers::CHOOSERS;
pub use weight_strategies::{AT_LOAD_PRIORS, WEIGHTS, slow_start_defaults};

/// Tie rules of the choosers that compare scores.
pub const TIES: [Part; 3] = [
    Part {
        name: "first",
        describe: || {
            "the first of the two random candidates (the source's original coin toss)".into()
        },
        params: &[],
    },
    Part {
        name: "random",
        describe: || "an explicit coin flip".into(),
        params: &[],
    },
    Part {
        name: "higher-weight",
        describe: || {
            "the higher weight (the source's fix: quiet hours go to the fastest worker)".into()
        },
        params: &[],
    },
];

const ALLOWANCE_PARAMS: &[Param] = &[
    Param {
        name: "base",
        default: Some(|| Allowance::default().base.to_string()),
    },
    Param {
        name: "per_1k_tokens",
        default: Some(|| Allowance::default().per_1k_tokens.to_string()),
    },
    Param {
        name: "max",
        default: Some(|| Allowance::default().max.to_string()),
    },
    Param {
        name: "index_blocks",
        default: Some(|| Affinity::DEFAULT_INDEX_BLOCKS.to_string()),
    },
];

/// Prefix affinities (`none` is written `no-affinity` in a composition).
pub const AFFINITIES: [Part; 3] = [
    Part {
        name: "none",
        describe: || "ignore prompt prefixes".into(),
        params: &[],
    },
    Part {
        name: "raw",
        describe: || {
            "keep the prefix holder unless its raw in-flight count exceeds the freest's by an allowance growing with prompt length".into()
        },
        params: ALLOWANCE_PARAMS,
    },
    Part {
        name: "capacity",
        describe: || {
            "the same rule in in_flight / weight units, the unit of the main choice".into()
        },
        params: ALLOWANCE_PARAMS,
    },
];

/// What the router knows about the engines' prefix caches (the policy's `prefix_knowledge`;
/// in a composition, a part such as `/kv-events:0.05`). It informs whatever reads the prefix
/// index: a prefix affinity and the field's routers.
pub const KNOWLEDGE: [Part; 3] = [
    Part {
        name: "approximate",
        describe: || {
            format!(
                "the default: the router records what it dispatches; its record of each worker holds at most that worker's cache size in {}-token blocks (from its registration: the engine's KV capacity) and forgets the oldest first; a worker whose size is unknown shares one bound of index_blocks ({} by default) with the others",
                crate::PREFIX_BLOCK_TOKENS,
                Affinity::DEFAULT_INDEX_BLOCKS
            )
        },
        params: &[],
    },
    Part {
        name: "unbounded",
        describe: || {
            format!(
                "for comparison: one record of index_blocks ({} by default) for the whole fleet, kept whatever the engines still hold (routelab's index before the knowledge modes)",
                Affinity::DEFAULT_INDEX_BLOCKS
            )
        },
        params: &[],
    },
    Part {
        name: "kv-events",
        describe: || {
            "the router mirrors the blocks each engine stores and evicts (vLLM's KV events, as Dynamo's KV router and llm-d's precise prefix scorer consume them; the gateway subscribes to each worker's stream), kv_event_delay_s after they happen; the holder is the worker with the longest leading match; nothing is recorded at dispatch".into()
        },
        params: &[Param {
            name: "kv_event_delay_s",
            default: Some(|| match PrefixKnowledge::from_name("kv-events") {
                Some(PrefixKnowledge::KvEvents { delay }) => secs(delay),
                other => unreachable!("kv-events is {other:?}"),
            }),
        }],
    },
];

const LIMIT: Param = Param {
    name: "limit",
    default: Some(|| Cap::DEFAULT_LIMIT.to_string()),
};

/// Concurrency caps.
pub const CAPS: [Part; 3] = [
    Part {
        name: "none",
        describe: || "no per-worker concurrency cap".into(),
        params: &[],
    },
    Part {
        name: "flat",
        describe: || {
            format!(
                "the same cap for every worker (default {}); requests queue FIFO at the gateway when all are full",
                Cap::DEFAULT_LIMIT
            )
        },
        params: &[LIMIT],
    },
    Part {
        name: "weighted",
        describe: || {
            format!(
                "the cap scaled by weight ({} x weight, at least 1)",
                Cap::DEFAULT_LIMIT
            )
        },
        params: &[LIMIT],
    },
];

/// The preset of one of the field's routers with its published defaults, described by its
/// chooser's entry.
macro_rules! peer_preset_part {
    ($name:literal) => {
        Part {
            name: $name,
            describe: || {
                format!(
                    "{}; equal weights, no cap",
                    find(&CHOOSERS, $name).expect("a chooser").description()
                )
            },
            params: &[],
        }
    };
}

/// The presets, in historical order (built by [`PolicyConfig::preset`]), then the field's
/// routers as published: equal weights (the measured sticky variant: at-load), no affinity part
/// (each rule carries its own), no cap (none of them has one).
pub const PRESETS: [Part; 15] = [
    Part {
        name: "seed-v1",
        describe: || {
            format!(
                "GPU-name table weights, p2c with ties to the first candidate, raw-count prefix affinity, flat cap {}",
                Cap::DEFAULT_LIMIT
            )
        },
        params: &[],
    },
    Part {
        name: "seed-v2",
        describe: || {
            format!(
                "seed-v1 routing with the {}-minute live correction (median speed x busy fraction, blended with the table)",
                LiveConfig::default().interval.as_secs() / 60
            )
        },
        params: &[],
    },
    Part {
        name: "seed-v3-cold",
        describe: || {
            "seed-v3 without the warm-up burst: the first probe can measure a cold engine".into()
        },
        params: &[],
    },
    Part {
        name: "seed-v3",
        describe: || {
            let p = ProbeConfig::default();
            format!(
                "{}x{} burst probe with warm-up, ties to the higher weight, capacity-unit prefix affinity, flat cap {}",
                p.concurrency,
                p.output_tokens,
                Cap::DEFAULT_LIMIT
            )
        },
        params: &[],
    },
    Part {
        name: "seed-next",
        describe: || {
            format!(
                "seed-v3 with the cap scaled by weight ({} x weight), the source's announced next change",
                Cap::DEFAULT_LIMIT
            )
        },
        params: &[],
    },
    peer_preset_part!("cache-aware"),
    peer_preset_part!("least-load"),
    peer_preset_part!("sticky-until-saturated"),
    Part {
        name: "sticky-until-saturated-measured",
        describe: || {
            "sticky-until-saturated with each worker's prefill figure = the pool constant x its at-load weight / the pool's mean weight (at-load measures capacity from live traffic)".into()
        },
        params: &[],
    },
    peer_preset_part!("pulsar"),
    peer_preset_part!("wait-and-widen"),
    peer_preset_part!("kv-cost"),
    peer_preset_part!("hit-minus-load"),
    Part {
        name: "sita",
        describe: || {
            "the sita chooser over seed-v3's burst-probe weights with warm-up, no affinity part, no cap; `sita:C1,C2` sets the cut-offs, `sita-oracle:C1,C2` marks cut-offs searched on the scenario reported (oracle-tuned, not deployable)".into()
        },
        params: &[],
    },
    Part {
        name: "predictive",
        describe: || {
            let p = crate::weights::PrefillProbe::DEFAULT;
            format!(
                "ours: the predictive chooser (each worker's prefill speed and decode curve measured from its completions; aims at the host's SLO) over seed-v3's burst-probe weights with warm-up plus a prefill-bound burst ({} x {}-token prompts or the context window less one, one output token: the prefill speed until traffic has measured it; the weights are its prior for a worker traffic has not measured yet), no affinity part (it weighs the prefix itself), no cap",
                p.requests,
                crate::weights::PrefillProbe::PROMPT_TOKENS
            )
        },
        params: &[],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chooser::Chooser;
    use crate::config::{RawAffinity, RawCap, RawChooser, RawWeights, WeightsConfig};
    use crate::located::parse_yaml;
    use crate::predictive::PredictiveParams;
    use crate::{ConfigError, TieRule};

    #[test]
    fn every_catalog_name_parses_and_every_parsed_name_is_listed() {
        for p in &WEIGHTS {
            let w = WeightsConfig::from_name(p.name).expect(p.name);
            assert_eq!(w.name(), p.name);
            assert_eq!(PolicyConfig::from_name(p.name).unwrap().weights, w);
        }
        for p in &CHOOSERS {
            let c = PolicyConfig::from_name(&format!("equal/{}", p.name)).unwrap();
            assert_eq!(c.chooser.name(), p.name);
        }
        for p in &TIES {
            let t = TieRule::parse(p.name).expect(p.name);
            assert_eq!(t.as_str(), p.name);
            let c = PolicyConfig::from_name(&format!("equal/p2c:{}", p.name)).unwrap();
            assert_eq!(c.chooser.ties(), Some(t));
        }
        for p in &AFFINITIES {
            let a = Affinity::from_name(p.name).expect(p.name);
            assert_eq!(a.name(), p.name);
            let c = PolicyConfig::from_name(&format!("equal/{}", a.composition())).unwrap();
            assert_eq!(c.affinity, a);
        }
        for p in &CAPS {
            let c = PolicyConfig::from_name(&format!("equal/{}", p.name)).unwrap();
            assert_eq!(c.cap.name(), p.name);
            assert_eq!(
                PolicyConfig::from_name(&format!("equal/{}", c.cap.composition()))
                    .unwrap()
                    .cap,
                c.cap
            );
        }
        for p in &PRESETS {
            assert_eq!(PolicyConfig::preset(p.name).unwrap().name, p.name);
        }
        for p in &KNOWLEDGE {
            let k = PrefixKnowledge::from_name(p.name).expect(p.name);
            assert_eq!(k.name(), p.name);
            let c = PolicyConfig::from_name(&format!("equal/{}", k.composition())).unwrap();
            assert_eq!(c.knowledge, k);
        }
        // The parser's lists are the catalog's.
        assert_eq!(PrefixKnowledge::NAMES, names(&KNOWLEDGE));
        assert_eq!(WeightsConfig::NAMES, names(&WEIGHTS));
        assert_eq!(Chooser::NAMES, names(&CHOOSERS));
        assert_eq!(TieRule::NAMES, names(&TIES));
        assert_eq!(Affinity::NAMES, names(&AFFINITIES));
        assert_eq!(Cap::NAMES, names(&CAPS));
        match PolicyConfig::preset("seed-v9").unwrap_err() {
            ConfigError::UnknownName { valid, .. } => assert_eq!(valid, joined(&PRESETS, ", ")),
            other => panic!("{other:?}"),
        }
        match PolicyConfig::from_name("equal/bogus").unwrap_err() {
            ConfigError::UnknownName { valid, .. } => assert!(
                valid.contains("an affinity (raw, capacity, no-affinity)")
                    && valid.contains(&Chooser::NAMES.join(", ")),
                "{valid}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_printed_composition_defaults_are_the_ones_used() {
        let printed = composition_defaults();
        assert_eq!(printed, "p2c:higher-weight, capacity, flat:24");
        let spelled =
            PolicyConfig::from_name(&format!("at-load/{}", printed.replace(", ", "/"))).unwrap();
        let omitted = PolicyConfig::from_name("at-load").unwrap();
        assert_eq!(
            (spelled.chooser, spelled.affinity, spelled.cap),
            (omitted.chooser, omitted.affinity, omitted.cap)
        );
    }

    /// Validate `kind: NAME` plus `extra` YAML lines as the section's raw type.
    fn validate(section: &str, name: &str, extra: &str) -> Result<String, ConfigError> {
        let src = format!("kind: {name}\n{extra}");
        fn parsed<T: serde::de::DeserializeOwned>(src: &str) -> T {
            parse_yaml::<T>(src, "t").unwrap_or_else(|e| panic!("{src}: {e}"))
        }
        Ok(match section {
            "weights" => format!("{:?}", parsed::<RawWeights>(&src).validate()?),
            "chooser" => format!(
                "{:?}",
                parsed::<RawChooser>(&src).validate(PolicyConfig::DEFAULT_TIES)?
            ),
            "affinity" => format!("{:?}", parsed::<RawAffinity>(&src).validate()?),
            _ => format!("{:?}", parsed::<RawCap>(&src).validate()?),
        })
    }

    #[test]
    fn every_printed_parameter_default_is_the_default_used() {
        let mut checked = 0;
        for (section, parts) in [
            ("weights", &WEIGHTS[..]),
            ("chooser", &CHOOSERS[..]),
            ("affinity", &AFFINITIES[..]),
            ("cap", &CAPS[..]),
        ] {
            for part in parts {
                for param in part.params {
                    // at-load reads a table only with the table prior.
                    let base =
                        if part.name == "at-load" && ["table", "unknown"].contains(&param.name) {
                            "prior: table\n"
                        } else {
                            ""
                        };
                    let omitted = validate(section, part.name, base).unwrap();
                    let Some(default) = param.default else {
                        continue;
                    };
                    let line = format!("{base}{}: {}\n", param.name, default());
                    let given = validate(section, part.name, &line)
                        .unwrap_or_else(|e| panic!("{} {line}: {e}", part.name));
                    assert_eq!(given, omitted, "{} {line}", part.name);
                    checked += 1;
                }
            }
        }
        assert!(checked > 25, "{checked}");
    }

    #[test]
    fn every_printed_knowledge_default_is_the_default_used() {
        let build = |yaml: &str| {
            let raw: crate::RawPolicy = parse_yaml(yaml, "t").unwrap();
            PolicyConfig::from_raw(&raw).unwrap().knowledge
        };
        let mut checked = 0;
        for part in &KNOWLEDGE {
            let base = format!("preset: seed-v3\nprefix_knowledge: {}\n", part.name);
            assert_eq!(build(&base), PrefixKnowledge::from_name(part.name).unwrap());
            for param in part.params {
                let default = param.default.expect("a single value")();
                let given = build(&format!("{base}{}: {default}\n", param.name));
                assert_eq!(given, build(&base), "{} {}", part.name, param.name);
                checked += 1;
            }
        }
        assert_eq!(checked, 1);
        // Unnamed, a policy gets the default, which the catalog lists first.
        assert_eq!(build("preset: seed-v3\n"), PrefixKnowledge::DEFAULT);
        assert_eq!(KNOWLEDGE[0].name, PrefixKnowledge::DEFAULT.name());
        let d = find(&KNOWLEDGE, "approximate").unwrap().description();
        assert!(
            d.contains("512-token blocks") && d.contains("index_blocks (65536 by default)"),
            "{d}"
        );
    }

    #[test]
    fn a_field_outside_the_catalog_is_rejected_with_the_catalog_list() {
        let e = validate("weights", "probe", "interval_s: 3\n").unwrap_err();
        let probe = find(&WEIGHTS, "probe").unwrap();
        assert!(e.to_string().ends_with(&probe.param_list()), "{e}");
        let e = validate("weights", "equal", "clamp: [1, 2]\n").unwrap_err();
        assert!(e.to_string().ends_with("(none)"), "{e}");
    }

    #[test]
    fn descriptions_carry_the_crate_defaults() {
        let d = |s: &'static [Part], n| find(s, n).unwrap().description();
        assert_eq!(
            d(&WEIGHTS, "table"),
            "v1: weight from a GPU-name table (RTX 4090 1.75, RTX 5090 2.5, H100 3.5; sum over cards; unknown 1.0)"
        );
        assert!(d(&WEIGHTS, "probe").starts_with("v3: 16 x 128-token burst;"));
        assert!(d(&WEIGHTS, "probe").contains("clamped [0.25, 8]; warm-up, 6 h cache"));
        assert!(d(&CAPS, "flat").contains("(default 24)"));
        assert!(d(&CHOOSERS, "p2c").ends_with("ties: first | random | higher-weight"));
        assert!(d(&PRESETS, "seed-v2").contains("3-minute live correction"));
        // The field's routers carry their published figures.
        assert!(
            d(&CHOOSERS, "cache-aware").contains("> 64 and max > 1.5 x min")
                && d(&CHOOSERS, "cache-aware").contains("above 0.3 of the prompt"),
            "{}",
            d(&CHOOSERS, "cache-aware")
        );
        assert!(d(&CHOOSERS, "least-load").contains("+ 0.15 s x kv/(1 - kv)"));
        assert!(d(&CHOOSERS, "least-load").contains("polled every 10 s"));
        assert!(d(&CHOOSERS, "sticky-until-saturated").contains(">= 0.8 of the prompt"));
        assert!(d(&CHOOSERS, "sticky-until-saturated").contains("by 18 s"));
        assert!(d(&CHOOSERS, "sticky-until-saturated").contains("prefill 15928 tok/s"));
        assert!(d(&CHOOSERS, "wait-and-widen").contains("alone within 0.2 s"));
        assert!(d(&CHOOSERS, "wait-and-widen").contains("up to 64"));
        // pulsar's key length is ours and says so, in both rules that hash.
        assert!(
            d(&CHOOSERS, "pulsar")
                .contains("first 1 prefix block(s) (key_blocks: unpublished; ours;"),
            "{}",
            d(&CHOOSERS, "pulsar")
        );
        assert!(
            d(&CHOOSERS, "wait-and-widen")
                .contains("hashing 1 prefix block(s), key_blocks: unpublished; ours"),
            "{}",
            d(&CHOOSERS, "wait-and-widen")
        );
        assert!(d(&CHOOSERS, "kv-cost").starts_with("NVIDIA Dynamo KV router: 1 x new prefill"));
        assert!(d(&CHOOSERS, "hit-minus-load").contains("0.5 is ours"));
        assert!(d(&PRESETS, "pulsar").ends_with("; equal weights, no cap"));
    }

    #[test]
    fn predictive_is_ours_measured_uncapped_and_aims_at_the_hosts_slo() {
        let cfg = PolicyConfig::preset("predictive").unwrap();
        assert!(!cfg.chooser.is_peer_rule(), "ours, not a field router");
        assert!(cfg.chooser.reads_prefixes() && cfg.reads_prefixes());
        assert_eq!((cfg.affinity, cfg.cap), (Affinity::None, Cap::None));
        // seed-v3's probe, plus the prefill-bound burst.
        let WeightsConfig::Probe(mut probe) = cfg.weights.clone() else {
            panic!("{:?}", cfg.weights)
        };
        assert_eq!(probe.prefill, Some(crate::weights::PrefillProbe::DEFAULT));
        probe.prefill = None;
        assert_eq!(
            WeightsConfig::Probe(probe),
            PolicyConfig::preset("seed-v3").unwrap().weights
        );
        assert_eq!(
            cfg.chooser,
            crate::Chooser::Predictive(PredictiveParams::DEFAULT)
        );
        assert_eq!(
            PolicyConfig::from_name("at-load/predictive")
                .unwrap()
                .chooser,
            cfg.chooser,
            "the composition grammar knows it"
        );
        let mut r = crate::Router::new(cfg);
        r.aim_at(2.0, 0.1);
        let crate::Chooser::Predictive(p) = r.config().chooser else {
            panic!("predictive")
        };
        assert_eq!((p.ttft_s, p.tpot_s), (Some(2.0), Some(0.1)));
        // Bounds of its own win over the host's.
        let own = PolicyConfig::from_raw(
            &crate::located::parse_yaml(
                "preset: predictive\nchooser: { kind: predictive, ttft_s: 30 }",
                "p.yaml",
            )
            .unwrap(),
        )
        .unwrap();
        let mut r = crate::Router::new(own);
        r.aim_at(2.0, 0.1);
        let crate::Chooser::Predictive(p) = r.config().chooser else {
            panic!("predictive")
        };
        assert_eq!((p.ttft_s, p.tpot_s), (Some(30.0), Some(0.1)));
    }

    #[test]
    fn peer_presets_are_their_chooser_with_equal_weights_no_affinity_and_no_cap() {
        let mut peers = 0;
        for p in PRESETS
            .iter()
            .filter(|p| !p.name.starts_with("seed-") && !["predictive", "sita"].contains(&p.name))
        {
            let cfg = PolicyConfig::preset(p.name).unwrap();
            assert!(cfg.chooser.is_peer_rule(), "{}", p.name);
            assert_eq!(
                (cfg.affinity, cfg.cap),
                (Affinity::None, Cap::None),
                "{}",
                p.name
            );
            let measured = p.name == "sticky-until-saturated-measured";
            assert_eq!(
                cfg.weights.name(),
                if measured { "at-load" } else { "equal" }
            );
            if !measured {
                assert_eq!(
                    Some(cfg.chooser),
                    Chooser::from_name(p.name, PolicyConfig::DEFAULT_TIES)
                );
            }
            peers += 1;
        }
        assert_eq!(peers, 8);
        assert!(matches!(
            PolicyConfig::preset("sticky-until-saturated-measured")
                .unwrap()
                .chooser,
            Chooser::StickyUntilSaturated { measured: true, .. }
        ));
    }

    #[test]
    fn a_peer_parameter_out_of_range_or_on_the_wrong_kind_is_a_field_error() {
        let e = validate("chooser", "cache-aware", "cache_threshold: 1.5\n").unwrap_err();
        assert!(
            e.to_string().contains("cache_threshold") && e.to_string().contains("from 0 to 1"),
            "{e}"
        );
        let e = validate("chooser", "wait-and-widen", "max_candidates: 0\n").unwrap_err();
        assert!(e.to_string().contains("max_candidates"), "{e}");
        let e = validate("chooser", "least-load", "poll_s: 0\n").unwrap_err();
        assert!(e.to_string().contains("poll_s"), "{e}");
        let e = validate("chooser", "p2c", "beta: 1\n").unwrap_err();
        assert!(
            e.to_string()
                .ends_with(&find(&CHOOSERS, "p2c").unwrap().param_list()),
            "{e}"
        );
        let e = validate("chooser", "kv-cost", "temperature: -1\n").unwrap_err();
        assert!(e.to_string().contains("temperature"), "{e}");
        // key_blocks belongs to the two rules that hash pulsar's key, no other.
        let e = validate("chooser", "kv-cost", "key_blocks: 2\n").unwrap_err();
        assert!(
            e.to_string().contains("key_blocks") && e.to_string().contains("does not apply"),
            "{e}"
        );
    }
}
