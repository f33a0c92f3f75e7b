//! [`FluidEngine`]: one simulated inference engine (vLLM-like) as a fluid, event-driven model,
//! the fast default engine mode.
//!
//! No per-token events: between two events every rate is constant, and the model only
//! computes when the next thing happens.
//!
//! # Model
//!
//! * **Admission.** [`InferenceEngine::admit`] hands a sequence to the engine. It runs at once if
//!   the running set has room (`max_running`) and its KV reservation (its prompt and four fifths
//!   of its output: `RESERVED_OUTPUT_FIFTHS`, standing in for vLLM's allocate-as-computed and
//!   preempt) fits in `kv_capacity_tokens` next to the running ones; otherwise it waits, FIFO, inside the
//!   engine (a request larger than the whole KV cache runs alone once the engine is empty).
//! * **Prefix cache** (`cache.rs`, as vLLM's block manager keeps it). 512-token blocks,
//!   reference-counted: a running sequence holds the leading blocks it found cached when it
//!   started and every block it has computed since; what finished sequences leave behind stays
//!   cached, LRU, in the KV memory the running sequences do not reserve (`kv_capacity_tokens -
//!   kv_used`), and is evicted when a starting sequence needs the room. When a sequence starts,
//!   its leading blocks found in the cache are its cached prefix (capped at `prompt - 1`: at
//!   least one token is always computed); only the rest is prefilled.
//! * **Blocks are reusable as soon as computed.** While a sequence prefills, the full blocks
//!   its prefill has passed (`(cached + prefilled tokens) / 512`) are cached; at the end of its
//!   prefill all its blocks are. The engine has no per-token events, so this is brought up to
//!   date whenever the engine moves in time (every event and every call), from the prefill
//!   clock and the sequence's start mark — a sequence that starts then sees exactly the blocks
//!   computed so far, and the event count is unchanged.
//! * **KV events.** On request ([`InferenceEngine::publish_kv_events`]) the engine records the
//!   [`KvEvent`]s vLLM's publisher sends (block stored with its parent, block removed, all
//!   cleared on restart or crash), drained with [`InferenceEngine::drain_kv_events`].
//! * **Chunked prefill, processor-shared decode.** One engine step decodes one token for each
//!   of the `n` decoding sequences and processes a chunk `c = min(prefill_chunk_tokens, queued
//!   prefill tokens)` of the FIFO prefill queue, fixed when the step starts (a call in the middle
//!   of a step does not change it). It lasts what the one step-time model
//!   (`hardware::step`) says for a decode of `step_time_s(n)` beside a prefill of `c /
//!   prefill_tok_s`: the longer of the two plus the part of the shorter that does not hide under
//!   it (`prefill_overlap`). With a `kv_read_s_per_ktok` the decode part also reads the KV of
//!   the tokens the decoding sequences attend to (prompts and outputs so far), counted at the
//!   step's start and held until the next event or breakpoint (the fluid model's rates are
//!   constant between them; a busy engine's events come every few steps). Each decoding sequence therefore advances at `1 / step` tokens/s
//!   (processor sharing; with no prefill that is `per_request_tok_s(n)`), the prefill queue at
//!   `c / step` tokens/s (the full `prefill_tok_s` when nothing decodes).
//! * **Step boundaries.** A step clock counts the engine's steps (fractional between two
//!   boundaries; it is also the decode service clock, one token per step). The batch of a
//!   running step is fixed: a sequence that starts mid-step has its prefill work gated until the
//!   next boundary, and the step after less than a chunk is left is shorter; both change the
//!   rates at a boundary where nothing may be emitted, so they are *breakpoints*, crossed by
//!   integrating piecewise rather than by an event. A sequence's first token comes at the end
//!   of the step that finishes its prefill (the next boundary after its fluid prefill end),
//!   and it decodes from that boundary on. An idle engine starts a step at once.
//! * **The first token is the prefill's.** As in vLLM, the step that finishes a sequence's
//!   prefill also samples its first output token, so `T` output tokens are `T` emissions in
//!   all: the first when the prefill ends, then `T - 1` decode steps' worth of service (one
//!   sequence alone completes at `prefill + (T - 1) / per_request_tok_s(1)`; a 1-token output
//!   completes at its first token, and TPOT = (e2e - TTFT) / (T - 1) is one decode step).
//! * **Speed multipliers** (all rates): the node's `speed_factor` (degraded node), the cold
//!   penalty (`cold_start.speed_factor` until `cold_start.warmup_tokens` of decode + prefill work
//!   have been done since ready), and an epoch factor, lognormal with mean 1, redrawn every
//!   `epoch_s` of simulated time (a pure function of the seed and the epoch index). Per-request
//!   noise multiplies one request's token work (prefill and decode) by a lognormal factor.
//!
//! Internally the step clock `V` (decode steps received by every decoding sequence so far) and
//! a min-heap of finish values `V_start + work` give the next completion in O(log n); the
//! prefill queue uses the same idea with cumulative prefilled tokens. First tokens come out
//! only on a step boundary.

use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use routelab_policies::streams::nanos_to_secs;

use super::core::EngineCore;
use super::inference::sealed::Moves;
use super::slots::{Phase, Slot, Slots};
use super::{
    Admission, AdmitInfo, BLOCK_TOKENS, EPS_TOKENS, EngineOutput, EngineOverrides, InferenceEngine,
    KV_BLOCK_TOKENS, cached_tokens,
};
use crate::hardware::HardwareProfile;
use clock::{Crossing, DecodeKey, Fluid, ceil_nn, round_nn};

mod clock;
mod flow;

/// Tolerance (steps) when asking whether the step clock is on a step boundary, on top of the
/// two nanoseconds' worth of steps by which an event time rounded up to a whole nanosecond can
/// overshoot one.
const EPS_STEPS: f64 = 1e-9;
/// How many breakpoints [`FluidEngine::compute_next`] looks through before it wakes the host at
/// the last (enough for a gate and a short last chunk, the most a step run has).
const MAX_LOOKAHEAD_BREAKS: u32 = 4;

/// A sequence's fluid marks.
#[derive(Debug, Clone, Default)]
struct FluidSeq {
    /// Cumulative prefill mark at which this sequence's prefill ends.
    prefill_end: f64,
    /// Its prefill work (noise-scaled tokens): it starts at the mark `prefill_end - work`.
    prefill_work: f64,
    /// Decode service clock `V` when this sequence started decoding.
    decode_start: f64,
}

impl Slot<FluidSeq> {
    /// What admission reserves for this sequence: its prompt and [`RESERVED_OUTPUT_FIFTHS`]
    /// fifths of its output.
    fn kv_tokens(&self) -> u64 {
        u64::from(self.prompt) + (u64::from(self.output) * RESERVED_OUTPUT_FIFTHS).div_ceil(5)
    }
}

/// The share of a sequence's output, in fifths, that admission reserves in KV beside its
/// prompt. vLLM allocates KV as tokens are computed and preempts (recomputes) the newest
/// sequence when it runs out; this model cannot preempt, so it reserves at admission. The whole
/// output admits too few where KV binds (mean TTFT at 85 % load 27 % above the step-level
/// engine's on rtx4090, 7 % on rtx5090), half of it — a sequence's mean occupancy — too many
/// (the engine pays its preemptions); four fifths agrees with the step-level reference within
/// 5.9 % on TTFT and 0.8 % on saturation there (`sim/tests/integration/engine_modes.rs`).
const RESERVED_OUTPUT_FIFTHS: u64 = 4;

/// One simulated inference engine as a fluid model. See the [module documentation](self).
///
/// `repr(C)` keeps the fields in the order written: what every event reads or writes comes
/// first, together (the core's clock, then the fluid state), and what only some calls touch
/// after it. A fleet of thousands of engines finds each engine's state cold in memory, so every
/// cache line an event touches is a miss; the compiler's own order scattered the hot fields
/// over the whole struct.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct FluidEngine {
    /// What both engine modes share (clock, readiness, pacing, cache).
    core: EngineCore,
    // --- fluid state, valid at `core.t0` (every event)
    fl: Fluid,
    n_decoding: u32,
    running: u32,
    /// The speed multiplier the rates were computed with (constant between events).
    speed: f64,
    /// End mark of all queued prefill work, the gated sequences' included.
    q_tail: f64,
    /// The step boundary at which the gated sequences (the last `fl.gated` of `prefill`) join
    /// the prefill work.
    gate_v: f64,
    // --- what the rates are made of (every refresh)
    /// `step_time_s(n)` for (at least) `n = 0..=max_running`: the profile's shared table
    /// ([`HardwareProfile::step_times`]).
    step_time: Arc<[f64]>,
    prefill_tok_s: f64,
    /// The profile's `prefill_overlap` (`hardware::step`).
    overlap: f64,
    /// The core's `prefill_chunk_tokens`, as the float every refresh reads.
    chunk: f64,
    /// The profile's [`HardwareProfile::kv_read_s_per_tok`]: 0 (the usual case) leaves the
    /// decode step the curve's and the two sums below untouched.
    kv_read_s: f64,
    /// The tokens the decoding sequences attend to at step clock `V` are
    /// `ctx_base + ctx_per_v * V`: each holds its prompt and first token, and gains a token per
    /// `noise` of the clock since it started decoding (kept only when `kv_read_s > 0`).
    ctx_base: f64,
    ctx_per_v: f64,
    // --- sequences
    slots: Slots<FluidSeq>,
    prefill: VecDeque<u32>,
    decode: BinaryHeap<DecodeKey>,
    waiting: VecDeque<u32>,
    /// Prefilling sequences with prefix blocks (what `cache_computed_blocks` looks at).
    prefills_with_blocks: u32,
    kv_used: u64,
    /// The look-ahead's first crossing from `fl`, valid until the clocks next move.
    crossing: Option<Crossing>,
}

impl FluidEngine {
    /// A warm engine (cold if `overrides.start_cold`), ready at time 0.
    ///
    /// # Panics
    /// If `overrides` fail [`EngineOverrides::validate`].
    pub fn new(profile: Arc<HardwareProfile>, overrides: EngineOverrides, seed: u64) -> Self {
        let core = EngineCore::new(profile, &overrides, seed);
        let mut engine = FluidEngine {
            prefill_tok_s: core.profile.prefill_tok_s(),
            overlap: core.profile.prefill_overlap(),
            step_time: core.profile.step_times(core.max_running),
            chunk: f64::from(core.prefill_chunk_tokens),
            kv_read_s: core.profile.kv_read_s_per_tok(),
            ctx_base: 0.0,
            ctx_per_v: 0.0,
            core,
            fl: Fluid::default(),
            crossing: None,
            q_tail: 0.0,
            speed: 0.0,
            n_decoding: 0,
            prefills_with_blocks: 0,
            running: 0,
            kv_used: 0,
            slots: Slots::new(),
            waiting: VecDeque::new(),
            prefill: VecDeque::new(),
            gate_v: 0.0,
            decode: BinaryHeap::new(),
        };
        engine.refresh();
        engine
    }
}

impl Moves for FluidEngine {
    #[inline]
    fn core(&self) -> &EngineCore {
        &self.core
    }

    #[inline]
    fn core_mut(&mut self) -> &mut EngineCore {
        &mut self.core
    }

    /// Processes events up to `now` (buffering outputs) and moves the fluid state to `now`.
    fn catch_up(&mut self, now: u64) {
        debug_assert!(
            now >= self.core.t0,
            "time went backwards: {now} < {}",
            self.core.t0
        );
        if self.core.next_event.is_some_and(|te| te <= now) {
            let mut buf = std::mem::take(&mut self.core.deferred);
            self.run_until(now, &mut buf);
            self.core.deferred = buf;
        }
        self.move_to(now);
    }

    fn refresh(&mut self) {
        self.refresh_rates();
    }

    fn drop_sequences(&mut self) -> Vec<u64> {
        let failed = self.slots.fail_all();
        self.waiting.clear();
        self.prefill.clear();
        self.decode.clear();
        self.running = 0;
        self.n_decoding = 0;
        (self.ctx_base, self.ctx_per_v) = (0.0, 0.0);
        self.prefills_with_blocks = 0;
        self.kv_used = 0;
        self.fl = Fluid::default();
        self.q_tail = 0.0;
        failed
    }
}

impl InferenceEngine for FluidEngine {
    /// See [`InferenceEngine::admit`]. The sequence starts at once if the running set and the
    /// KV have room (its prefill work gated to the next step boundary if a step is under way);
    /// the returned info then has its cached prompt tokens.
    fn admit(&mut self, now: u64, s: Admission<'_>) -> AdmitInfo {
        self.catch_up(now);
        let h = self.slots.admit(now, &s, &mut self.core);
        // With nobody waiting, the sequence is the queue's front: start it, if it fits,
        // without a trip through the queue (whose memory a large fleet's engines keep cold).
        if self.waiting.is_empty() && self.fits(self.slots[h as usize].kv_tokens()) {
            self.start_sequence(h, now);
        } else {
            self.waiting.push_back(h);
            self.start_waiting(now);
        }
        let s = &self.slots[h as usize];
        let info = AdmitInfo {
            cached_tokens: (s.phase != Phase::Waiting).then_some(s.cached),
        };
        self.refresh();
        info
    }

    #[inline]
    fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        out.append(&mut self.core.deferred);
        self.run_until(now, out);
    }

    /// Fractional here (the prefill produced the first token, decode step `k` the token
    /// `k + 1`). Read-only and allocation-free (a scan of the engine's slots); exact for `now`
    /// between the last event processed and [`InferenceEngine::next_event_time`], clamped
    /// beyond it, so call [`InferenceEngine::advance_to`] first. For hosts that pace a token
    /// stream.
    fn decoded_tokens(&self, now: u64, seq: u64) -> Option<f64> {
        let s = self.slots.decoding(seq)?;
        let dt = nanos_to_secs(now.saturating_sub(self.core.t0));
        let v = self.advance(self.fl, dt).v;
        let done = (v - s.state.decode_start) / s.noise;
        Some(done.clamp(0.0, f64::from(s.output - 1)))
    }

    fn in_flight(&self) -> u32 {
        self.running + self.waiting.len() as u32
    }

    fn running(&self) -> u32 {
        self.running
    }

    fn decoding(&self) -> u32 {
        self.n_decoding
    }

    /// Those waiting for room.
    fn waiting(&self) -> u32 {
        self.waiting.len() as u32
    }

    /// The running set's reservations (see [`RESERVED_OUTPUT_FIFTHS`]).
    fn kv_used_tokens(&self) -> u64 {
        self.kv_used
    }

    /// Each running sequence's computed tokens (its prompt as far as prefilled, the cached part
    /// included, then the tokens generated) in whole blocks of [`KV_BLOCK_TOKENS`], as vLLM
    /// allocates them. Admission reserves more ([`InferenceEngine::kv_used_tokens`]); a router
    /// reading this figure sees what it would see from a real engine, not the model's
    /// reservation. O(running sequences); for polls.
    fn kv_allocated_tokens(&self, now: u64) -> u64 {
        let dt = nanos_to_secs(now.saturating_sub(self.core.t0));
        let fl = self.advance(self.fl, dt);
        let block = u64::from(KV_BLOCK_TOKENS);
        self.slots
            .iter()
            .map(|s| {
                let tokens = match s.phase {
                    Phase::Free | Phase::Waiting => return 0,
                    Phase::Prefill => {
                        let start = s.state.prefill_end - s.state.prefill_work;
                        let done = (fl.q - start).clamp(0.0, s.state.prefill_work) / s.noise;
                        u64::from(s.cached) + done as u64
                    }
                    Phase::Decode => {
                        let decoded = ((fl.v - s.state.decode_start) / s.noise).max(0.0) as u64;
                        u64::from(s.prompt) + 1 + decoded.min(u64::from(s.output - 1))
                    }
                };
                tokens.div_ceil(block) * block
            })
            .sum()
    }

    /// Those waiting for room and the gated ones (what an engine's metrics endpoint reports as
    /// requests waiting).
    fn queued(&self) -> u32 {
        self.waiting.len() as u32 + (self.prefill.len() as u32).saturating_sub(self.fl.joined)
    }

    fn waiting_prompt_tokens(&self) -> u64 {
        // the gated sequences (admitted mid-step) are still in an engine's waiting queue until
        // the scheduler runs at the step's end
        self.waiting
            .iter()
            .chain(self.prefill.iter().skip(self.fl.joined as usize))
            .map(|&i| u64::from(self.slots[i as usize].prompt))
            .sum()
    }

    /// Decoding sequences × the current per-sequence decode rate (0 when nothing decodes or
    /// the engine is down).
    fn generation_tok_s(&self) -> f64 {
        self.fl.rate_v * f64::from(self.n_decoding)
    }

    fn decoding_ns(&self, now: u64) -> u64 {
        let working = self.running > 0 && self.core.ready_at <= self.core.t0;
        self.core.decoding_ns_at(now, self.n_decoding, working)
    }

    fn speed_multiplier(&self) -> f64 {
        self.speed_at(self.core.t0)
    }

    /// Prefill work it had not yet done is taken out of the prefill queue; the others speed
    /// up and a waiting one may start.
    fn abort(&mut self, now: u64, seq: u64) -> bool {
        self.catch_up(now);
        let Some(h) = self.slots.find(seq) else {
            return false;
        };
        match self.slots[h as usize].phase {
            Phase::Free => return false,
            Phase::Waiting => {
                self.waiting.retain(|&w| w != h);
            }
            Phase::Prefill => {
                let pos = self
                    .prefill
                    .iter()
                    .position(|&p| p == h)
                    .expect("a prefilling sequence is in the prefill queue");
                // Its share of the FIFO prefill queue not yet done: its marks are contiguous,
                // from `end - work` to `end`, and the queue has done work up to `q`.
                let s = &self.slots[h as usize];
                let (end, work) = (s.state.prefill_end, s.state.prefill_work);
                let left = (end - self.fl.q.max(end - work)).max(0.0);
                self.prefill.remove(pos);
                for &later in self.prefill.iter().skip(pos) {
                    self.slots[later as usize].state.prefill_end -= left;
                }
                self.q_tail -= left;
                if pos < self.fl.joined as usize {
                    self.fl.joined -= 1;
                    self.fl.q_joined -= left;
                } else {
                    self.fl.gated -= 1;
                }
                self.fl.q = self.fl.q.min(self.fl.q_joined);
                if !self.slots[h as usize].blocks.is_empty() {
                    self.prefills_with_blocks -= 1;
                }
                self.running -= 1;
                self.kv_used -= self.slots[h as usize].kv_tokens();
                self.release_blocks(h);
            }
            Phase::Decode => {
                self.decode.retain(|k| k.slot != h);
                self.n_decoding -= 1;
                self.leave_decode(h);
                self.running -= 1;
                self.kv_used -= self.slots[h as usize].kv_tokens();
                self.release_blocks(h);
            }
        }
        self.slots.free(h);
        self.start_waiting(now);
        self.refresh();
        true
    }
}

impl FluidEngine {
    fn run_until(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        while let Some(te) = self.core.next_event {
            if te > now {
                break;
            }
            self.step_at(te, out);
        }
    }

    /// Caches the full blocks the prefilling sequences have computed by the prefill clock `q`
    /// (FIFO: only the front ones have started). Allocation-free; O(started prefills + new
    /// blocks): the started part of the queue is walked, sequences already holding all their
    /// blocks are skipped in O(1) (the queue is short: chunked prefill keeps few sequences
    /// started at once). Kept out of line so that `move_to`, on every event's path, stays
    /// small, and only called while a prefilling sequence has prefix blocks.
    #[inline(never)]
    fn cache_computed_blocks(&mut self) {
        for &h in &self.prefill {
            let s = &mut self.slots[h as usize];
            let start = s.state.prefill_end - s.state.prefill_work;
            if self.fl.q <= start {
                break;
            }
            if s.held as usize >= s.blocks.len() {
                continue;
            }
            let done = (self.fl.q - start).min(s.state.prefill_work) / s.noise;
            let tokens = f64::from(s.cached) + done + EPS_TOKENS;
            let computed = ((tokens / f64::from(BLOCK_TOKENS)) as usize).min(s.blocks.len());
            if computed > s.held as usize {
                self.core.cache.hold(&s.blocks, s.held as usize, computed);
                s.held = computed as u32;
            }
        }
    }

    /// Drops sequence `h`'s hold on its blocks and evicts what no longer fits.
    fn release_blocks(&mut self, h: u32) {
        let s = &mut self.slots[h as usize];
        if s.held > 0 {
            self.core.cache.release(&s.blocks, s.held as usize);
            s.held = 0;
        }
        self.fit_cache();
    }

    /// Evicts cached blocks (LRU) until the evictable ones fit in the KV memory the running
    /// sequences do not reserve.
    #[inline]
    fn fit_cache(&mut self) {
        let free_tokens = self.core.kv_capacity.saturating_sub(self.kv_used);
        self.core.fit_cache(free_tokens);
    }

    /// Processes everything due at `te` (the current next event).
    fn step_at(&mut self, te: u64, out: &mut Vec<EngineOutput>) {
        self.move_to(te);
        // Put the step clock exactly on the boundary it is at (the event time was rounded up
        // to a whole nanosecond), so that marks set now are whole, and cross a breakpoint
        // that falls here but was missed by that hair.
        let r = round_nn(self.fl.v);
        let snapped = (self.fl.v - r).abs() <= self.fl.tolerance();
        if snapped {
            self.fl.v = r;
        }
        let crossed = self.fl.v >= self.fl.break_v - self.fl.tolerance();
        if crossed {
            let mut fl = self.fl;
            self.cross(&mut fl);
            self.fl = fl;
        }
        let first = out.len();
        // prefill completions, FIFO (the gated ones have not started), only at the end of a
        // step: a prefill done in the fluid sense mid-step samples its first token when the
        // step ends (an event mid-step — a noisy decode's end, a new noise epoch — must not
        // emit it early). Unless a breakpoint was crossed (new rates, new tolerance), the
        // snapping above has already told: a snapped clock is whole, one left alone is further
        // than the tolerance from its nearest boundary (what `mid_step` would work out again).
        let on_boundary = if crossed {
            !self.fl.mid_step()
        } else {
            snapped || self.fl.rate_v <= 0.0
        };
        while on_boundary && self.fl.joined > 0 {
            let h = *self.prefill.front().expect("joined sequences are queued");
            let end = self.slots[h as usize].state.prefill_end;
            if end > self.fl.q + EPS_TOKENS {
                break;
            }
            self.fl.q = self.fl.q.max(end);
            self.prefill.pop_front();
            self.fl.joined -= 1;
            self.finish_prefill(h, te, out);
        }
        // decode completions
        while let Some(&top) = self.decode.peek() {
            let finish = top.finish();
            if finish > self.fl.v + EPS_TOKENS {
                break;
            }
            self.fl.v = self.fl.v.max(finish);
            self.decode.pop();
            self.n_decoding -= 1;
            self.leave_decode(top.slot);
            self.complete(top.slot, te, out);
        }
        // most events emit one output or none: nothing to order
        if out.len() - first > 1 {
            out[first..].sort_unstable_by_key(|o| (o.seq(), o.rank()));
        }
        self.start_waiting(te);
        self.refresh();
    }

    /// The gated sequences' work joins the prefill work the steps see.
    fn join_gated(&mut self) {
        self.fl.joined += self.fl.gated;
        self.fl.gated = 0;
        self.fl.q_joined = self.q_tail;
    }

    fn finish_prefill(&mut self, h: u32, now: u64, out: &mut Vec<EngineOutput>) {
        let s = &mut self.slots[h as usize];
        s.first_token_at = now;
        if !s.blocks.is_empty() {
            self.prefills_with_blocks -= 1;
        }
        if (s.held as usize) < s.blocks.len() {
            self.core
                .cache
                .hold(&s.blocks, s.held as usize, s.blocks.len());
            s.held = s.blocks.len() as u32;
        }
        if s.output == 0 {
            self.complete(h, now, out);
            return;
        }
        out.push(EngineOutput::FirstToken {
            seq: s.seq,
            at: now,
            cached_tokens: s.cached,
        });
        // The prefill step produced the first token: `output - 1` decode steps remain, none
        // for a 1-token output, which is complete now.
        if s.output == 1 {
            self.complete(h, now, out);
            return;
        }
        s.phase = Phase::Decode;
        s.state.decode_start = self.fl.v;
        let finish = self.fl.v + f64::from(s.output - 1) * s.noise;
        self.decode.push(DecodeKey::new(finish, s.seq, h));
        self.n_decoding += 1;
        if self.kv_read_s > 0.0 {
            let s = &self.slots[h as usize];
            let per_v = 1.0 / s.noise;
            self.ctx_base += f64::from(s.prompt) + 1.0 - s.state.decode_start * per_v;
            self.ctx_per_v += per_v;
        }
    }

    /// Sequence `h` stops decoding: its context leaves the sums the decode step reads (an
    /// engine with no decoder left has none, exactly).
    fn leave_decode(&mut self, h: u32) {
        if self.kv_read_s > 0.0 {
            if self.n_decoding == 0 {
                (self.ctx_base, self.ctx_per_v) = (0.0, 0.0);
            } else {
                let s = &self.slots[h as usize];
                let per_v = 1.0 / s.noise;
                self.ctx_base -= f64::from(s.prompt) + 1.0 - s.state.decode_start * per_v;
                self.ctx_per_v -= per_v;
            }
        }
    }

    fn complete(&mut self, h: u32, now: u64, out: &mut Vec<EngineOutput>) {
        let s = &self.slots[h as usize];
        out.push(EngineOutput::Completed(s.completion(now)));
        self.running -= 1;
        self.kv_used -= s.kv_tokens();
        self.release_blocks(h);
        self.slots.free(h);
    }

    /// Moves sequences from the waiting queue into the running set while they fit.
    #[inline]
    fn start_waiting(&mut self, now: u64) {
        // most events leave nobody waiting: no call
        if !self.waiting.is_empty() {
            self.start_waiting_front(now);
        }
    }

    /// [`Self::start_waiting`]'s work, out of line.
    #[inline(never)]
    fn start_waiting_front(&mut self, now: u64) {
        while let Some(&h) = self.waiting.front() {
            if !self.fits(self.slots[h as usize].kv_tokens()) {
                break;
            }
            self.waiting.pop_front();
            self.start_sequence(h, now);
        }
    }

    /// Whether a sequence reserving `kv` tokens may join the running set now (always, into an
    /// empty one).
    #[inline]
    fn fits(&self, kv: u64) -> bool {
        self.running == 0
            || (self.running < self.core.max_running && self.kv_used + kv <= self.core.kv_capacity)
    }

    /// Moves sequence `h` (out of the waiting queue, or just admitted with nobody waiting) into
    /// the running set at `now`: its cached prefix, its prefill work queued (gated if a step is
    /// under way), its KV reserved.
    #[inline]
    fn start_sequence(&mut self, h: u32, now: u64) {
        let mid_step = self.fl.mid_step();
        let s = &mut self.slots[h as usize];
        let kv = s.kv_tokens();
        let hits = if s.prompt == 0 || s.blocks.is_empty() {
            0
        } else {
            self.core.cache.leading_hits(&s.blocks)
        };
        // The hits are held before anything is evicted for the room it needs.
        if hits > 0 {
            self.core.cache.hold(&s.blocks, 0, hits);
        }
        s.held = hits as u32;
        let cached = cached_tokens(s.prompt, hits);
        s.cached = cached;
        s.started_at = now;
        s.phase = Phase::Prefill;
        let work = f64::from((s.prompt - cached).max(1)) * s.noise;
        if self.prefill.is_empty() {
            // re-base the prefill clock while nothing is queued
            self.fl.q = 0.0;
            self.fl.q_joined = 0.0;
            self.q_tail = 0.0;
        }
        self.q_tail += work;
        s.state.prefill_end = self.q_tail;
        s.state.prefill_work = work;
        if !s.blocks.is_empty() {
            self.prefills_with_blocks += 1;
        }
        self.prefill.push_back(h);
        // A sequence scheduled while a step runs starts its prefill at the step's end: the
        // running step's batch is fixed. Its work is queued but gated until that boundary.
        if mid_step {
            if self.fl.gated == 0 {
                self.gate_v = ceil_nn(self.fl.v);
            }
            self.fl.gated += 1;
        } else {
            self.fl.gated += 1;
            self.join_gated();
        }
        self.running += 1;
        self.kv_used += kv;
        self.fit_cache();
    }
}

#[cfg(test)]
mod tests;
