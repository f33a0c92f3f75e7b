//! The burst probe's parameters and the state it persists across restarts.

use crate::time::Time;
use crate::weights::{Clamp, Shaping};
use std::time::Duration;

/// Largest burst: in a gateway every probe request is a real request, one task and one
/// connection each (a burst of 4e9 froze the gateway's runtime).
pub const MAX_PROBE_CONCURRENCY: u32 = 1024;
/// Largest probe prompt, in tokens: a gateway builds the body in memory (≈ 4 bytes a token), and
/// 2^20 tokens is beyond any engine's context window.
pub const MAX_PROBE_PROMPT_TOKENS: u32 = 1 << 20;

/// Parameters of the burst probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Concurrent requests per burst (source: 16).
    pub concurrency: u32,
    /// Exact output tokens per request (source: 128).
    pub output_tokens: u32,
    /// Prompt tokens per request (a short chat prompt).
    pub prompt_tokens: u32,
    /// Send the burst twice and keep the second (the fix for cold engines).
    pub warmup: bool,
    /// How long a result stays valid per (node, model, launch arguments) (source: 6 h).
    pub cache_ttl: Duration,
    /// Re-measure this often, but only when the worker has nothing in flight (source: 6 h).
    pub reprobe_period: Duration,
    /// Bounds of the weight (source: [0.25, 8]).
    pub clamp: Clamp,
    /// Wait before retrying after a failed burst.
    pub retry_after: Duration,
    /// New and unmeasured workers' weights.
    pub shaping: Shaping,
    /// A prefill-bound burst after each measurement (`None`: none, the source's probe).
    pub prefill: Option<PrefillProbe>,
}

/// The prefill-bound part of the burst probe: `requests` concurrent requests of
/// `prompt_tokens` fresh prompt tokens and one output token each. Their prompt tokens over
/// the burst's wall time are the worker's prefill speed (its GPU time is counted like the
/// rest of the probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillProbe {
    /// Concurrent requests (ours: 4).
    pub requests: u32,
    /// Prompt tokens of each, as configured. `None`: [`PrefillProbe::PROMPT_TOKENS`] or the
    /// worker's context window less one token, whichever is shorter. A length given must fit
    /// the configured workers' windows (hosts check it); a worker added later with a smaller
    /// window gets prompts of its window less one token.
    pub prompt_tokens: Option<u32>,
}

impl PrefillProbe {
    /// The default prompt length (ours: 2,048 tokens, four 512-token chunks per request: long
    /// enough that a step's fixed cost is a small share of the burst).
    pub const PROMPT_TOKENS: u32 = 2048;

    /// `predictive`'s prefill probe.
    pub const DEFAULT: PrefillProbe = PrefillProbe {
        requests: 4,
        prompt_tokens: None,
    };

    /// The prompt length on a worker whose context window is `window` tokens.
    pub fn prompt_on(&self, window: u32) -> u32 {
        self.prompt_tokens
            .unwrap_or(Self::PROMPT_TOKENS)
            .min(window.saturating_sub(1))
            .max(1)
    }
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            concurrency: 16,
            output_tokens: 128,
            prompt_tokens: 64,
            warmup: true,
            cache_ttl: Duration::from_secs(6 * 3600),
            reprobe_period: Duration::from_secs(6 * 3600),
            clamp: Clamp::SOURCE,
            retry_after: Duration::from_secs(60),
            shaping: Shaping::default(),
            prefill: None,
        }
    }
}

/// One cached measurement, as persisted by a host.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeCacheEntry {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// Launch arguments.
    pub launch_args: String,
    /// Measured throughput, tokens/s.
    pub throughput_tok_s: f64,
    /// Measured prefill speed, prompt tokens/s (a prefill-bound burst's; `None`: not measured).
    pub prefill_tok_s: Option<f64>,
    /// When it was measured.
    pub measured_at: Time,
}

/// One administrator pin, as persisted by a host.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbePin {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// Pinned weight.
    pub weight: f64,
}

/// The probe strategy's durable state: what a gateway writes to disk.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PersistedProbeState {
    /// Cached measurements.
    pub cache: Vec<ProbeCacheEntry>,
    /// Pins.
    pub pins: Vec<ProbePin>,
}
