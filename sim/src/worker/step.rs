//! One simulated inference engine stepped as vLLM's (V1) scheduler steps it: the step-level
//! engine mode (`engine: step`), the reference the fluid [`FluidEngine`](super::FluidEngine) is
//! checked against. Same profile, same [`EngineOverrides`], same interface
//! ([`InferenceEngine`]) and outputs.
//!
//! # Model
//!
//! * **Discrete steps.** An idle engine starts a step at once when work arrives; a sequence
//!   admitted while a step runs waits for that step to end (the step boundary). The engine's
//!   events ([`StepEngine::next_event_time`]) are the end of the running step and the start of
//!   a step on an idle engine: at the arrival's instant (or when a restarted engine becomes
//!   ready), planned when the host advances the engine to it, so every sequence handed in at
//!   that instant shares the step. A step boundary plans the next step at once.
//! * **One step** (planned at its start, vLLM V1 order): every running sequence that decodes
//!   gets one token (decodes first, in the running set's order); then a prefill budget of
//!   `prefill_chunk_tokens` is filled FIFO — first from running sequences still prefilling,
//!   then from the waiting queue. A waiting sequence joins when the running set has room
//!   (`max_running`) and its first chunk's KV can be allocated; the queue is FIFO, so the first
//!   that cannot join stops the others. Chunked prefill: a prompt larger than what is left of
//!   the budget takes that part and continues next step, and several prompts may share a step.
//! * **Step length** = [`HardwareProfile::mixed_step_time_at_s`]`(decodes, the tokens they
//!   attend to, prefill tokens)` (the one step-time model; a decode attends to the tokens whose
//!   KV its sequence holds, which lengthens the step only if the profile has a
//!   `kv_read_s_per_ktok`) divided by the speed multiplier at the step's start: the node's
//!   `speed_factor` × the cold factor (until `cold_start.warmup_tokens` of decode + prefill
//!   work are done) × the epoch factor ([`super::speed`], the fluid engine's rule). A step in
//!   flight keeps its length when the speed changes; the next one uses the new speed.
//! * **Outputs at step ends.** The step that finishes a sequence's prefill emits its
//!   `FirstToken` at the step's end (a 1-token output completes there); then one token per
//!   step; `Completed` at the end of the step that produced the last token.
//! * **Per-request noise** multiplies a request's prefill tokens and its decode steps by its
//!   lognormal factor, each rounded up to whole tokens / steps (noise 1 changes nothing).
//! * **KV as vLLM allocates it**: blocks of [`KV_BLOCK_TOKENS`] (vLLM's default block size)
//!   for the prompt and generated tokens as they are computed (the tokens found in the prefix
//!   cache are allocated at start), out of `kv_capacity_tokens / KV_BLOCK_TOKENS` blocks. When a running sequence cannot
//!   get the block its next token needs, the most recently started running sequence is
//!   **preempted** (recompute, vLLM's default): its KV is freed and it goes back to the front of
//!   the waiting queue with its computed tokens lost; its generated tokens are kept, so when it
//!   runs again it prefills its prompt and those tokens, that step samples its next token, and
//!   it emits no second first token. A sequence alone in the engine always gets its room (a
//!   request larger than the whole KV runs alone once the engine is empty, as in the fluid
//!   engine).
//! * **Prefix cache**: the core's prefix cache used as the fluid engine uses it — a starting sequence
//!   holds its leading hits, the full prompt blocks its prefill has computed are held at each
//!   step's end (reusable by a sequence starting at the next boundary), all of them when its
//!   prefill ends; released when it leaves; evictable blocks live in the blocks the running set
//!   has not allocated.
//!
//! Deterministic: vectors and queues only (the cache's map is looked up, never iterated), and
//! the per-request noise comes from one seeded stream in admission order, as in the fluid
//! engine.

use std::collections::VecDeque;
use std::sync::Arc;

use super::core::EngineCore;
use super::inference::sealed::Moves;
use super::slots::{Phase, Slot, Slots};
use super::{
    Admission, AdmitInfo, EngineOutput, EngineOverrides, InferenceEngine, KV_BLOCK_TOKENS,
};
use crate::hardware::HardwareProfile;

mod schedule;

/// A sequence's progress through the steps.
#[derive(Debug, Clone, Default)]
struct StepSeq {
    /// Tokens the current computation covers: the prompt, or after a preemption the prompt and
    /// the tokens generated so far.
    ctx: u64,
    /// Of those, found in the prefix cache when the current computation started.
    ctx_cached: u64,
    /// Prefill work of the current computation (noise-scaled tokens), and the part done.
    prefill_total: u64,
    prefill_done: u64,
    /// Decode steps after the first token (noise-scaled), and the steps done.
    decode_total: u64,
    decoded: u64,
    /// Tokens whose KV it has computed (or found cached), and the blocks allocated for them.
    kv_tokens: u64,
    kv_blocks: u64,
    /// Whether its first token is out (a recomputation after a preemption emits no other).
    first_out: bool,
    /// Planned in the running step: prefill work tokens, or one decode.
    step_prefill: u64,
    step_decode: bool,
}

impl Slot<StepSeq> {
    /// Tokens of the current computation whose KV exists after `done` prefill work tokens.
    fn computed_after(&self, done: u64) -> u64 {
        let s = &self.state;
        computed_tokens(s.ctx, s.ctx_cached, s.prefill_total, done)
    }
}

/// Tokens whose KV exists when a computation of `ctx` tokens, `cached` of them found in the
/// prefix cache and the rest taking `total` prefill work tokens (noise-scaled), has done `done`
/// of that work.
fn computed_tokens(ctx: u64, cached: u64, total: u64, done: u64) -> u64 {
    let uncached = ctx.saturating_sub(cached).max(1);
    let real = (u128::from(done) * u128::from(uncached)).div_ceil(u128::from(total.max(1))) as u64;
    cached + real.min(uncached)
}

const KV_ALLOC_TOKENS: u64 = KV_BLOCK_TOKENS as u64;

/// KV blocks that hold `tokens` tokens.
fn blocks_for(tokens: u64) -> u64 {
    tokens.div_ceil(KV_ALLOC_TOKENS)
}

/// One engine simulated step by step. See the [module documentation](self); the interface is
/// [`InferenceEngine`].
#[derive(Debug, Clone)]
pub struct StepEngine {
    /// What both engine modes share (clock, readiness, pacing, cache).
    core: EngineCore,
    // --- configuration
    chunk: u64,
    kv_capacity_blocks: u64,
    // --- lifecycle
    work_since_ready: f64,
    // --- the running step
    step_start: u64,
    step_end: Option<u64>,
    step_s: f64,
    step_decodes: u32,
    step_prefill_tokens: u64,
    /// Sequences with work in the running step.
    sched: Vec<u32>,
    // --- sequences
    n_decoding: u32,
    used_blocks: u64,
    preemptions: u64,
    slots: Slots<StepSeq>,
    /// The running set, in the order the sequences (re)started.
    running: Vec<u32>,
    waiting: VecDeque<u32>,
}

impl StepEngine {
    /// A warm engine (cold if `overrides.start_cold`), ready at time 0.
    ///
    /// # Panics
    /// If `overrides` fail [`EngineOverrides::validate`].
    pub fn new(profile: Arc<HardwareProfile>, overrides: EngineOverrides, seed: u64) -> Self {
        let core = EngineCore::new(profile, &overrides, seed);
        let mut engine = StepEngine {
            chunk: u64::from(core.prefill_chunk_tokens),
            kv_capacity_blocks: core.kv_capacity / KV_ALLOC_TOKENS,
            core,
            work_since_ready: 0.0,
            step_start: 0,
            step_end: None,
            step_s: 0.0,
            step_decodes: 0,
            step_prefill_tokens: 0,
            sched: Vec::new(),
            n_decoding: 0,
            used_blocks: 0,
            preemptions: 0,
            slots: Slots::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
        };
        engine.refresh();
        engine
    }

    /// Preemptions so far (sequences sent back to the waiting queue for want of KV).
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }
}

impl Moves for StepEngine {
    fn core(&self) -> &EngineCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut EngineCore {
        &mut self.core
    }

    /// Processes step ends up to `now` (buffering outputs) and moves the engine to `now`.
    fn catch_up(&mut self, now: u64) {
        debug_assert!(
            now >= self.core.t0,
            "time went backwards: {now} < {}",
            self.core.t0
        );
        let mut buf = std::mem::take(&mut self.core.deferred);
        self.run_until(now, &mut buf, false);
        self.core.deferred = buf;
        self.move_to(now);
    }

    fn refresh(&mut self) {
        self.core.generation += 1;
        self.core.next_event = match self.step_end {
            Some(t) => Some(t),
            // an idle engine with work starts a step when it is up: now, or once ready
            None if self.in_flight() > 0 && self.core.ready_at != u64::MAX => {
                Some(self.core.ready_at.max(self.core.t0))
            }
            None => None,
        };
    }

    /// Also drops the running step (a step in flight keeps its length otherwise).
    fn drop_sequences(&mut self) -> Vec<u64> {
        let failed = self.slots.fail_all();
        self.running.clear();
        self.waiting.clear();
        self.sched.clear();
        self.step_end = None;
        self.n_decoding = 0;
        self.used_blocks = 0;
        self.work_since_ready = 0.0;
        failed
    }
}

impl InferenceEngine for StepEngine {
    /// See [`InferenceEngine::admit`]. It joins the running set at the next step boundary; an
    /// idle engine starts a step at `now`, planned when the host next advances it, so every
    /// sequence handed in at the same instant shares that step. The returned info always says
    /// it waits (the cached figure comes with its first token).
    fn admit(&mut self, now: u64, s: Admission<'_>) -> AdmitInfo {
        self.catch_up(now);
        let h = self.slots.admit(now, &s, &mut self.core);
        let slot = &mut self.slots[h as usize];
        slot.state = StepSeq {
            ctx: u64::from(s.prompt_tokens),
            decode_total: (f64::from(s.output_tokens.saturating_sub(1)) * slot.noise).ceil() as u64,
            ..StepSeq::default()
        };
        self.waiting.push_back(h);
        self.refresh();
        // It joins a step at the earliest when the host next advances the engine (the step
        // that starts now, or the next boundary): the cached figure comes with its first token.
        AdmitInfo {
            cached_tokens: None,
        }
    }

    fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        out.append(&mut self.core.deferred);
        self.run_until(now, out, true);
    }

    /// Whole tokens here (they come out at step ends); `now` is not read.
    fn decoded_tokens(&self, _now: u64, seq: u64) -> Option<f64> {
        let s = self.slots.decoding(seq)?;
        let tokens = f64::from(s.output - 1);
        let done = s.state.decoded as f64 * tokens / s.state.decode_total.max(1) as f64;
        Some(done.clamp(0.0, tokens))
    }

    fn in_flight(&self) -> u32 {
        (self.running.len() + self.waiting.len()) as u32
    }

    fn running(&self) -> u32 {
        self.running.len() as u32
    }

    fn decoding(&self) -> u32 {
        self.n_decoding
    }

    /// Those waiting for room or for the next step boundary.
    fn waiting(&self) -> u32 {
        self.waiting.len() as u32
    }

    /// The running set's allocated blocks, in tokens.
    fn kv_used_tokens(&self) -> u64 {
        self.used_blocks * KV_ALLOC_TOKENS
    }

    /// The same as [`InferenceEngine::kv_used_tokens`] here (this engine allocates as it
    /// computes).
    fn kv_allocated_tokens(&self, _now: u64) -> u64 {
        self.kv_used_tokens()
    }

    /// The waiting ones here.
    fn queued(&self) -> u32 {
        self.waiting()
    }

    fn waiting_prompt_tokens(&self) -> u64 {
        self.waiting
            .iter()
            .map(|&i| u64::from(self.slots[i as usize].prompt))
            .sum()
    }

    /// The running step's decodes over its length (0 when no step runs).
    fn generation_tok_s(&self) -> f64 {
        if self.step_end.is_some() && self.step_s > 0.0 {
            f64::from(self.step_decodes) / self.step_s
        } else {
            0.0
        }
    }

    fn decoding_ns(&self, now: u64) -> u64 {
        self.core
            .decoding_ns_at(now, self.n_decoding, self.step_end.is_some())
    }

    fn speed_multiplier(&self) -> f64 {
        let t = self.core.t0;
        if t < self.core.ready_at {
            return 0.0;
        }
        self.core.pace.at(t)
    }

    /// The running step keeps its length: its work was launched.
    fn abort(&mut self, now: u64, seq: u64) -> bool {
        self.catch_up(now);
        let Some(h) = self.slots.find(seq) else {
            return false;
        };
        match self.slots[h as usize].phase {
            Phase::Free => return false,
            Phase::Waiting => self.waiting.retain(|&w| w != h),
            Phase::Prefill | Phase::Decode => {
                self.running.retain(|&r| r != h);
                self.sched.retain(|&r| r != h);
                self.leave_running(h);
            }
        }
        self.slots.free(h);
        self.refresh();
        true
    }
}

impl StepEngine {
    /// Processes the events due by `now`: step ends (each boundary plans the next step at
    /// once) and the start of a step on an idle engine — one due exactly at `now` only if
    /// `start_at_now` (the host advancing the engine), so that every sequence handed in at
    /// that instant joins the step.
    fn run_until(&mut self, now: u64, out: &mut Vec<EngineOutput>, start_at_now: bool) {
        while let Some(te) = self.core.next_event {
            if te > now {
                break;
            }
            self.move_to(te);
            if self.step_end == Some(te) {
                self.finish_step(te, out);
                self.start_step(te);
            } else if te < now || start_at_now {
                self.start_step(te);
            } else {
                break;
            }
            self.refresh();
        }
    }

    fn move_to(&mut self, t: u64) {
        if t <= self.core.t0 {
            return;
        }
        if self.step_end.is_some() {
            self.core.note_busy(t - self.core.t0, self.n_decoding);
        }
        self.core.t0 = t;
    }
}

#[cfg(test)]
mod tests;
