//! The weight strategies' entries of the catalog, with the parameters they share (clamp,
//! unmeasured, slow start).

use super::{Param, Part, secs};
use crate::weights::{
    AtLoadConfig, Clamp, LiveConfig, ProbeConfig, SlowStart, TableConfig, Unmeasured,
};

fn clamp_yaml() -> String {
    let c = Clamp::SOURCE;
    format!("[{}, {}]", c.min, c.max)
}

const CLAMP: Param = Param {
    name: "clamp",
    default: Some(clamp_yaml),
};
const TABLE: Param = Param {
    name: "table",
    default: None,
};
const UNKNOWN: Param = Param {
    name: "unknown",
    default: Some(|| format!("{}", TableConfig::default().unknown)),
};

/// The weight of a worker not yet measured (live, probe, at-load).
const UNMEASURED: Param = Param {
    name: "unmeasured",
    default: Some(|| Unmeasured::default().name().to_string()),
};
/// Slow start of new and restarted workers (live, probe, at-load); off unless given, so its
/// default is not a single value (`slow_start: {}` takes [`slow_start_defaults`]).
const SLOW_START: Param = Param {
    name: "slow_start",
    default: None,
};

/// The fields of a `slow_start` block and their defaults, as YAML.
pub fn slow_start_defaults() -> String {
    let d = SlowStart::default();
    format!(
        "{{ window_s: {}, aggression: {}, floor: {} }}",
        secs(d.window),
        d.aggression,
        d.floor
    )
}

/// The sentence the measured strategies' descriptions end with.
fn shaping_sentence() -> String {
    format!(
        "; unmeasured: {} (default {}); slow_start: {} (off unless given)",
        Unmeasured::NAMES.join(" | "),
        Unmeasured::default().name(),
        slow_start_defaults()
    )
}

// ----- the sections ---------------------------------------------------------------------------

/// Weight strategies.
pub const WEIGHTS: [Part; 6] = [
    Part {
        name: "table",
        describe: || {
            let t = TableConfig::default();
            let cards: Vec<String> = t.entries.iter().map(|(n, w)| format!("{n} {w}")).collect();
            format!(
                "v1: weight from a GPU-name table ({}; sum over cards; unknown {:?})",
                cards.join(", "),
                t.unknown
            )
        },
        params: &[TABLE, UNKNOWN],
    },
    Part {
        name: "live",
        describe: || {
            format!(
                "v2: every {} min, median per-request speed x busy fraction / median of peers, blended with the table{}",
                LiveConfig::default().interval.as_secs() / 60,
                shaping_sentence()
            )
        },
        params: &[
            TABLE,
            UNKNOWN,
            CLAMP,
            Param {
                name: "interval_s",
                default: Some(|| secs(LiveConfig::default().interval)),
            },
            Param {
                name: "min_requests",
                default: Some(|| LiveConfig::default().min_requests.to_string()),
            },
            UNMEASURED,
            SLOW_START,
        ],
    },
    Part {
        name: "probe",
        describe: || {
            let p = ProbeConfig::default();
            format!(
                "v3: {} x {}-token burst; throughput / median of the model's workers, clamped [{}, {}]; warm-up, {} h cache, pins{}; prefill_requests > 0 adds a prefill-bound burst after each measurement (that many prompts of prefill_prompt_tokens, default {} or the worker's context window less one, one output token each: prompt tokens / wall time = the prefill speed predictive uses)",
                p.concurrency,
                p.output_tokens,
                p.clamp.min,
                p.clamp.max,
                p.cache_ttl.as_secs() / 3600,
                shaping_sentence(),
                crate::weights::PrefillProbe::PROMPT_TOKENS
            )
        },
        params: &[
            CLAMP,
            Param {
                name: "concurrency",
                default: Some(|| ProbeConfig::default().concurrency.to_string()),
            },
            Param {
                name: "output_tokens",
                default: Some(|| ProbeConfig::default().output_tokens.to_string()),
            },
            Param {
                name: "prompt_tokens",
                default: Some(|| ProbeConfig::default().prompt_tokens.to_string()),
            },
            Param {
                name: "warmup",
                default: Some(|| ProbeConfig::default().warmup.to_string()),
            },
            Param {
                name: "prefill_requests",
                default: Some(|| "0".into()),
            },
            // Its default (printed in the description) applies only with `prefill_requests`.
            Param {
                name: "prefill_prompt_tokens",
                default: None,
            },
            Param {
                name: "cache_ttl_s",
                default: Some(|| secs(ProbeConfig::default().cache_ttl)),
            },
            Param {
                name: "reprobe_period_s",
                default: Some(|| secs(ProbeConfig::default().reprobe_period)),
            },
            Param {
                name: "retry_after_s",
                default: Some(|| secs(ProbeConfig::default().retry_after)),
            },
            UNMEASURED,
            SLOW_START,
        ],
    },
    Part {
        name: "oracle",
        describe: || {
            "lab only: the simulator's true capacity, relative to the median (the best any estimator could do)".into()
        },
        params: &[CLAMP],
    },
    Part {
        name: "equal",
        describe: || "every worker 1.0: plain least-loaded balancing".into(),
        params: &[],
    },
    Part {
        name: "at-load",
        describe: || {
            let d = AtLoadConfig::default();
            format!(
                "ours: capacity measured passively from live traffic while the worker is busy; no GPU cost, reacts in minutes; a measured weight moves after {} s busy, half-way per {} s busy, at most x{} per update{}",
                secs(d.min_busy),
                secs(d.half_life),
                d.max_step,
                shaping_sentence()
            )
        },
        params: &[
            TABLE,
            UNKNOWN,
            CLAMP,
            Param {
                name: "time_constant_s",
                default: Some(|| secs(AtLoadConfig::default().time_constant)),
            },
            Param {
                name: "min_samples",
                default: Some(|| AtLoadConfig::default().min_samples.to_string()),
            },
            Param {
                name: "update_interval_s",
                default: Some(|| secs(AtLoadConfig::default().update_interval)),
            },
            Param {
                name: "prior",
                default: Some(|| AT_LOAD_PRIORS[0].to_string()),
            },
            Param {
                name: "half_life_s",
                default: Some(|| secs(AtLoadConfig::default().half_life)),
            },
            Param {
                name: "min_busy_s",
                default: Some(|| secs(AtLoadConfig::default().min_busy)),
            },
            Param {
                name: "max_step",
                default: Some(|| AtLoadConfig::default().max_step.to_string()),
            },
            UNMEASURED,
            SLOW_START,
        ],
    },
];

/// The at-load strategy's priors; the first is the default.
pub const AT_LOAD_PRIORS: [&str; 2] = ["equal", "table"];
