//! The choosers' entries of the catalog, and the peer rules' defaults read from their
//! constants.

use super::{Param, Part, TIES, joined, secs};
use crate::chooser::Chooser;
use crate::config::PolicyConfig;
use crate::predictive::PredictiveParams;

const TIES_PARAM: Param = Param {
    name: "ties",
    default: Some(|| PolicyConfig::DEFAULT_TIES.as_str().to_string()),
};

/// Choosers.
pub const CHOOSERS: [Part; 16] = [
    Part {
        name: "p2c",
        describe: || {
            format!(
                "power of two choices on in_flight / weight; ties: {}",
                joined(&TIES, " | ")
            )
        },
        params: &[TIES_PARAM],
    },
    Part {
        name: "sed",
        describe: || {
            "shortest expected delay: p2c on (in_flight + 1) / weight, the load after adding the request".into()
        },
        params: &[TIES_PARAM],
    },
    Part {
        name: "jsq",
        describe: || "join the shortest queue: full scan on in_flight / weight".into(),
        params: &[TIES_PARAM],
    },
    Part {
        name: "least-request",
        describe: || "Envoy's least-request: p2c on weight / (active + 1)^bias".into(),
        params: &[
            TIES_PARAM,
            Param {
                name: "bias",
                default: Some(|| Chooser::DEFAULT_BIAS.to_string()),
            },
        ],
    },
    Part {
        name: "wrr",
        describe: || "smooth weighted round-robin (ignores load)".into(),
        params: &[],
    },
    Part {
        name: "random",
        describe: || "uniform random among eligible workers".into(),
        params: &[],
    },
    Part {
        name: "round-robin",
        describe: || "plain round-robin among eligible workers".into(),
        params: &[],
    },
    Part {
        name: "cache-aware",
        describe: || {
            let Chooser::CacheAware {
                abs,
                rel,
                cache_threshold,
            } = Chooser::CACHE_AWARE
            else {
                unreachable!()
            };
            format!(
                "SGLang gateway cache_aware (vLLM router's is its fork): if max - min requests in flight > {abs} and max > {rel} x min, the fewest in flight; else the best prefix match if above {cache_threshold} of the prompt, else the fewest in flight, ties to the first worker (as sglang-router 0.3.2 and vllm-router 0.1.17 do and print their defaults; their tree is of characters, bounded at 67,108,864 / 33,554,432 per worker; the preset keeps the unbounded prefix record)"
            )
        },
        params: &[
            Param {
                name: "abs",
                default: Some(|| peer(Chooser::CACHE_AWARE, "abs")),
            },
            Param {
                name: "rel",
                default: Some(|| peer(Chooser::CACHE_AWARE, "rel")),
            },
            Param {
                name: "cache_threshold",
                default: Some(|| peer(Chooser::CACHE_AWARE, "cache_threshold")),
            },
        ],
    },
    Part {
        name: "least-load",
        describe: || {
            format!(
                "SGLang gateway least_load: (queued + in-flight tokens) / the engine's generation tok/s + {} s x kv/(1 - kv) (the penalty's shape is ours); engines polled every {} s, dispatched tokens counted locally between polls; without a poller (the gateway today) local tokens / ({} tok/s x weight)",
                peer(Chooser::LEAST_LOAD, "penalty_s"),
                peer(Chooser::LEAST_LOAD, "poll_s"),
                crate::rules::DEFAULT_GENERATION_TOK_S
            )
        },
        params: &[
            Param {
                name: "penalty_s",
                default: Some(|| peer(Chooser::LEAST_LOAD, "penalty_s")),
            },
            Param {
                name: "poll_s",
                default: Some(|| peer(Chooser::LEAST_LOAD, "poll_s")),
            },
        ],
    },
    Part {
        name: "sticky-until-saturated",
        describe: || {
            format!(
                "llm-d: stay on a worker holding >= {} of the prompt unless its TTFT estimate (uncached tokens in flight / prefill tok/s) exceeds the best other's by {} s; else the fewest uncached tokens in flight; prefill {} tok/s for the whole pool (published), or with measured: true that figure x the worker's weight / the mean weight",
                peer(Chooser::STICKY, "match_fraction"),
                peer(Chooser::STICKY, "gap_s"),
                peer(Chooser::STICKY, "peak_prefill_tok_s"),
            )
        },
        params: &[
            Param {
                name: "match_fraction",
                default: Some(|| peer(Chooser::STICKY, "match_fraction")),
            },
            Param {
                name: "gap_s",
                default: Some(|| peer(Chooser::STICKY, "gap_s")),
            },
            Param {
                name: "peak_prefill_tok_s",
                default: Some(|| peer(Chooser::STICKY, "peak_prefill_tok_s")),
            },
            Param {
                name: "measured",
                default: Some(|| peer(Chooser::STICKY, "measured")),
            },
        ],
    },
    Part {
        name: "pulsar",
        describe: || {
            format!(
                "NVIDIA Stargate pulsar: weighted rendezvous hash of the prompt's first {} prefix block(s) (key_blocks: unpublished; ours; a shorter prompt hashes all of its), weight = the worker's peak observed input tok/s (prompt / TTFT; {} x weight before any); no prefix: fewest in flight / that figure",
                peer(Chooser::PULSAR, "key_blocks"),
                crate::rules::DEFAULT_INPUT_TOK_S
            )
        },
        params: &[Param {
            name: "key_blocks",
            default: Some(|| peer(Chooser::PULSAR, "key_blocks")),
        }],
    },
    Part {
        name: "wait-and-widen",
        describe: || {
            format!(
                "NVIDIA Stargate: TTFT estimate = the worker's round trip if the host knows it (the simulator does; else {} s, ours) + (uncached tokens in flight + own) / input tok/s; pulsar's choice (hashing {} prefix block(s), key_blocks: unpublished; ours) alone within {} s, then one more random candidate per window of excess, up to {}; lowest estimate wins",
                peer(Chooser::WAIT_AND_WIDEN, "rtt_s"),
                peer(Chooser::WAIT_AND_WIDEN, "key_blocks"),
                peer(Chooser::WAIT_AND_WIDEN, "window_s"),
                peer(Chooser::WAIT_AND_WIDEN, "max_candidates"),
            )
        },
        params: &[
            Param {
                name: "key_blocks",
                default: Some(|| peer(Chooser::WAIT_AND_WIDEN, "key_blocks")),
            },
            Param {
                name: "window_s",
                default: Some(|| peer(Chooser::WAIT_AND_WIDEN, "window_s")),
            },
            Param {
                name: "max_candidates",
                default: Some(|| peer(Chooser::WAIT_AND_WIDEN, "max_candidates")),
            },
            Param {
                name: "rtt_s",
                default: Some(|| peer(Chooser::WAIT_AND_WIDEN, "rtt_s")),
            },
        ],
    },
    Part {
        name: "kv-cost",
        describe: || {
            format!(
                "NVIDIA Dynamo KV router: {} x new prefill blocks (prompt - believed cached) + prompt blocks in flight on the worker; lowest wins, softmax-sampled at temperature > 0 (default {})",
                peer(Chooser::KV_COST, "prefill_weight"),
                peer(Chooser::KV_COST, "temperature"),
            )
        },
        params: &[
            Param {
                name: "prefill_weight",
                default: Some(|| peer(Chooser::KV_COST, "prefill_weight")),
            },
            Param {
                name: "temperature",
                default: Some(|| peer(Chooser::KV_COST, "temperature")),
            },
        ],
    },
    Part {
        name: "hit-minus-load",
        describe: || {
            format!(
                "vLLM production-stack: prefix hit fraction - beta x in flight / the busiest's; highest wins (beta unpublished: {} is ours)",
                peer(Chooser::HIT_MINUS_LOAD, "beta")
            )
        },
        params: &[Param {
            name: "beta",
            default: Some(|| peer(Chooser::HIT_MINUS_LOAD, "beta")),
        }],
    },
    Part {
        name: "predictive",
        describe: || {
            let p = PredictiveParams::DEFAULT;
            format!(
                "ours: per worker, predicted TTFT = round trip + (uncached tokens waiting + own uncached) in {}-token chunks, each a mixed step beside its decode at its measured prefill tok/s + a wait for KV memory when its cache is full, and TPOT = its measured decode step a + b x (running + 1); lowest (predicted SLO misses, this request's + victims ({}) x running requests pushed over the TPOT bound) + {} x (completion + victims x damage to the running); predicted to miss everywhere: least harm to the others (their misses and damage + the prefill queue it holds up); bounds: ttft_s / tpot_s, else the host's SLO; every candidate up to scan ({}), else scan drawn + the prefix holder; pool_prefill_tok_s: one pool figure instead (ablation); prefix_aware: false ignores cached prefixes (ablation); the requests to come: + reserve ({}) x the pressure on the larger windows (routed prompt tokens only they hold / their share of the measured prefill speed) x own prefill s on a worker above the smallest window that holds the request (scarce capacity), + evict ({}) x the routed tokens' reuse share x the re-prefill s of the prefixes its prompt overflows from a full cache (cache value); 0 turns a term off",
                crate::capacity::CHUNK_TOKENS,
                p.victims,
                crate::predictive::COMPLETION_WEIGHT,
                p.scan,
                p.reserve,
                p.evict
            )
        },
        params: &[
            Param {
                name: "ttft_s",
                default: None,
            },
            Param {
                name: "tpot_s",
                default: None,
            },
            Param {
                name: "victims",
                default: Some(|| PredictiveParams::DEFAULT.victims.to_string()),
            },
            Param {
                name: "scan",
                default: Some(|| PredictiveParams::DEFAULT.scan.to_string()),
            },
            Param {
                name: "pool_prefill_tok_s",
                default: None,
            },
            Param {
                name: "prefix_aware",
                default: Some(|| PredictiveParams::DEFAULT.prefix_aware.to_string()),
            },
            Param {
                name: "reserve",
                default: Some(|| PredictiveParams::DEFAULT.reserve.to_string()),
            },
            Param {
                name: "evict",
                default: Some(|| PredictiveParams::DEFAULT.evict.to_string()),
            },
        ],
    },
    Part {
        name: "sita",
        describe: || {
            format!(
                "size-interval task assignment (Harchol-Balter et al.): ascending cut-offs (at most {}) in uncached prompt tokens make bands, the last band to the largest context window, the one below to the next window down, the first to every smaller window; within its class the least (in flight + uncached share of the prompt) / weight; a full class overflows to a larger window, then anywhere. oracle_tuned: true marks cut-offs searched on the scenario reported (role oracle, not deployable)",
                crate::sita::MAX_CUTOFFS
            )
        },
        params: &[
            Param {
                name: "cutoffs",
                default: Some(|| "[]".into()),
            },
            Param {
                name: "oracle_tuned",
                default: Some(|| "false".into()),
            },
        ],
    },
];

/// A peer rule's parameter, as YAML, from the chooser's default constant (so the catalog cannot
/// drift from the code).
fn peer(c: Chooser, field: &str) -> String {
    match (c, field) {
        (Chooser::CacheAware { abs, .. }, "abs") => abs.to_string(),
        (Chooser::CacheAware { rel, .. }, "rel") => rel.to_string(),
        (
            Chooser::CacheAware {
                cache_threshold, ..
            },
            "cache_threshold",
        ) => cache_threshold.to_string(),
        (Chooser::LeastLoad { penalty_s, .. }, "penalty_s") => penalty_s.to_string(),
        (Chooser::LeastLoad { poll, .. }, "poll_s") => secs(poll),
        (Chooser::StickyUntilSaturated { match_fraction, .. }, "match_fraction") => {
            match_fraction.to_string()
        }
        (Chooser::StickyUntilSaturated { gap_s, .. }, "gap_s") => gap_s.to_string(),
        (
            Chooser::StickyUntilSaturated {
                peak_prefill_tok_s, ..
            },
            "peak_prefill_tok_s",
        ) => peak_prefill_tok_s.to_string(),
        (Chooser::StickyUntilSaturated { measured, .. }, "measured") => measured.to_string(),
        (Chooser::Pulsar { key_blocks }, "key_blocks")
        | (Chooser::WaitAndWiden { key_blocks, .. }, "key_blocks") => key_blocks.to_string(),
        (Chooser::WaitAndWiden { window_s, .. }, "window_s") => window_s.to_string(),
        (Chooser::WaitAndWiden { max_candidates, .. }, "max_candidates") => {
            max_candidates.to_string()
        }
        (Chooser::WaitAndWiden { rtt_s, .. }, "rtt_s") => rtt_s.to_string(),
        (Chooser::KvCost { prefill_weight, .. }, "prefill_weight") => prefill_weight.to_string(),
        (Chooser::KvCost { temperature, .. }, "temperature") => temperature.to_string(),
        (Chooser::HitMinusLoad { beta }, "beta") => beta.to_string(),
        _ => unreachable!("{field} is not a parameter of {}", c.name()),
    }
}
