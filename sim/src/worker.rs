//! One simulated inference engine (vLLM-like), in either of two modes behind one interface,
//! [`InferenceEngine`]: the fluid model ([`FluidEngine`], `fluid.rs`: no per-token events, the
//! fast default) and the step-level one ([`StepEngine`], `step.rs`: one event per scheduler
//! step, the reference). Both own an [`EngineCore`] (`core.rs`: clock, readiness, pacing,
//! noise, busy accounting, prefix cache) and a slab of sequences (`slots.rs`); [`Engine`]
//! (`mode.rs`) is the one type the event loop holds.
//!
//! # Driving it
//!
//! ```text
//! engine.admit(now, Admission::new(seq, prompt, output, &prefix_blocks)); // or any other mutation
//! if let Some(t) = engine.next_event_time() { schedule(t, engine.generation()) }
//! ...
//! on wake-up(t, generation):
//!     if generation != engine.generation() { ignore; }          // stale
//!     engine.advance_to(t, &mut outputs);                        // FirstToken / Completed
//!     reschedule at engine.next_event_time()
//! ```
//!
//! `next_event_time` may also be an internal rate change (warm-up finished, new noise epoch,
//! engine ready) at which `advance_to` emits nothing. Network round trips are the caller's.
//! Every mutating call takes `now` and `now` must never go backwards.

mod cache;
mod core;
mod fluid;
mod inference;
mod mode;
mod slots;
mod speed;
mod step;
pub use self::core::EngineCore;
pub use fluid::FluidEngine;
pub use inference::{Admission, InferenceEngine};
pub use mode::{Engine, EngineMode, EngineModeError};
pub use step::StepEngine;

/// Tokens of one KV block as an engine allocates them: vLLM's default `--block-size` (16).
/// The step engine allocates in these; the fluid one reports its allocation in them
/// ([`InferenceEngine::kv_allocated_tokens`]). The prefix cache keeps its own 512-token hash
/// blocks ([`BLOCK_TOKENS`]); allocating KV in those would strand up to 511 tokens per sequence and,
/// on the KV-bound profiles, cost a third of the saturation throughput in preemptions
/// (rtx4090: 0.58 against 0.87 req/s in step mode).
pub const KV_BLOCK_TOKENS: u32 = 16;

/// Prefix-cache block size in tokens: the traffic's prefix block, so that one arrival block is
/// one engine cache block.
pub use crate::traffic::BLOCK_TOKENS;

/// Tolerance (tokens) when comparing fluid positions against finish marks.
pub(crate) const EPS_TOKENS: f64 = 1e-6;

/// Per-worker settings on top of the hardware profile.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOverrides {
    /// Multiplies every rate (degraded node < 1). Default 1.
    pub speed_factor: f64,
    /// Coefficient of variation of the per-request lognormal work multiplier. Default 0.
    pub request_noise_cv: f64,
    /// Coefficient of variation of the per-epoch lognormal engine speed factor. Default 0.
    pub epoch_noise_cv: f64,
    /// Length of a noise epoch in seconds. Default 60.
    pub epoch_s: f64,
    /// Replaces the profile's `max_running`.
    pub max_running: Option<u32>,
    /// Replaces the profile's `kv_capacity_tokens`.
    pub kv_capacity_tokens: Option<u64>,
    /// Replaces the profile's `prefill_chunk_tokens`.
    pub prefill_chunk_tokens: Option<u32>,
    /// Start the engine cold (as if it had just been started) instead of warm.
    pub start_cold: bool,
}

impl Default for EngineOverrides {
    fn default() -> Self {
        EngineOverrides {
            speed_factor: 1.0,
            request_noise_cv: 0.0,
            epoch_noise_cv: 0.0,
            epoch_s: 60.0,
            max_running: None,
            kv_capacity_tokens: None,
            prefill_chunk_tokens: None,
            start_cold: false,
        }
    }
}

impl EngineOverrides {
    /// Checks the values.
    ///
    /// # Errors
    /// The first field out of range, with what is valid.
    pub fn validate(&self) -> Result<(), OverridesError> {
        let pos = |field: &'static str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(OverridesError::NotPositive { field, value })
            }
        };
        let nonneg = |field: &'static str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(OverridesError::Negative { field, value })
            }
        };
        pos("speed_factor", self.speed_factor)?;
        nonneg("request_noise_cv", self.request_noise_cv)?;
        nonneg("epoch_noise_cv", self.epoch_noise_cv)?;
        pos("epoch_s", self.epoch_s)?;
        let counts = [
            ("max_running", self.max_running.map(u64::from)),
            ("kv_capacity_tokens", self.kv_capacity_tokens),
            (
                "prefill_chunk_tokens",
                self.prefill_chunk_tokens.map(u64::from),
            ),
        ];
        match counts.into_iter().find(|(_, v)| *v == Some(0)) {
            Some((field, _)) => Err(OverridesError::Zero { field }),
            None => Ok(()),
        }
    }
}

/// An [`EngineOverrides`] field out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverridesError {
    /// A factor or duration that must be positive.
    #[error("{field} = {value}: must be a finite number > 0")]
    NotPositive {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// A coefficient of variation that must not be negative.
    #[error("{field} = {value}: must be a finite number >= 0")]
    Negative {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// A limit of zero.
    #[error("{field} = 0: must be at least 1")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
}

/// What [`InferenceEngine::admit`] learned at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitInfo {
    /// Prompt tokens found in the engine's prefix cache, if the sequence started at once;
    /// `None` if it waits inside the engine (the figure then comes with
    /// [`EngineOutput::FirstToken`]).
    pub cached_tokens: Option<u32>,
}

impl AdmitInfo {
    /// Whether the sequence has to wait inside the engine (running set or KV full).
    pub fn waits(&self) -> bool {
        self.cached_tokens.is_none()
    }
}

/// Something that happened to a sequence inside the engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EngineOutput {
    /// Prefill finished: the first output token is out.
    FirstToken {
        /// Sequence id given at admission.
        seq: u64,
        /// Time (ns).
        at: u64,
        /// Prompt tokens that came from the engine's prefix cache.
        cached_tokens: u32,
    },
    /// All output tokens are out.
    Completed(Completion),
}

impl EngineOutput {
    /// The sequence id.
    pub fn seq(&self) -> u64 {
        match self {
            EngineOutput::FirstToken { seq, .. } => *seq,
            EngineOutput::Completed(c) => c.seq,
        }
    }

    /// When it happened (ns).
    pub fn at(&self) -> u64 {
        match self {
            EngineOutput::FirstToken { at, .. } => *at,
            EngineOutput::Completed(c) => c.at,
        }
    }

    pub(crate) fn rank(&self) -> u8 {
        match self {
            EngineOutput::FirstToken { .. } => 0,
            EngineOutput::Completed(_) => 1,
        }
    }
}

/// A finished sequence, with its timeline inside the engine (all times ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Sequence id given at admission.
    pub seq: u64,
    /// Completion time.
    pub at: u64,
    /// When it was handed to the engine.
    pub admitted_at: u64,
    /// When it left the engine's waiting queue.
    pub started_at: u64,
    /// When its first token came out (prefill end).
    pub first_token_at: u64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

/// Prompt tokens served from `hit_blocks` cached leading blocks: at least one prompt token is
/// always computed (the engine needs it for the first output token).
pub(crate) fn cached_tokens(prompt: u32, hit_blocks: usize) -> u32 {
    if prompt == 0 {
        return 0;
    }
    (hit_blocks as u64 * u64::from(BLOCK_TOKENS)).min(u64::from(prompt - 1)) as u32
}
