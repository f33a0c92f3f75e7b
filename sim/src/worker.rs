//! One simulated inference engine (vLLM-like), as a fluid, event-driven model.
//!
//! No per-token events: between two events every rate is constant, and the model only
//! computes when the next thing happens.
//!
//! # Model
//!
//! * **Admission.** [`EngineModel::admit`] hands a sequence to the engine. It runs at once if
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
//! * **KV events.** On request ([`EngineModel::publish_kv_events`]) the engine records the
//!   [`KvEvent`]s vLLM's publisher sends (block stored with its parent, block removed, all
//!   cleared on restart or crash), drained with [`EngineModel::drain_kv_events`].
//! * **Chunked prefill, processor-shared decode.** One engine step decodes one token for each
//!   of the `n` decoding sequences and processes a chunk `c = min(prefill_chunk_tokens, queued
//!   prefill tokens)` of the FIFO prefill queue, fixed when the step starts (a call in the middle
//!   of a step does not change it). It lasts what the one step-time model
//!   (`hardware::step`) says for a decode of `step_time_s(n)` beside a prefill of `c /
//!   prefill_tok_s`: the longer of the two plus the part of the shorter that does not hide under
//!   it (`prefill_overlap`). Each decoding sequence therefore advances at `1 / step` tokens/s
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
//!
//! # Driving it
//!
//! ```text
//! engine.admit(now, seq, prompt, output, &prefix_blocks);      // or any other mutation
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

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Distribution, LogNormal};

use crate::hardware::{HardwareProfile, mixed_step_s};
use routelab_policies::KvEvent;
use routelab_policies::streams::{NANOS_PER_SEC, nanos_to_secs, secs_to_nanos_ceil};

mod cache;
use cache::PrefixCache;
mod mode;
mod speed;
mod step;
pub use mode::{Engine, EngineMode};
pub use step::StepEngine;

/// Tokens of one KV block as an engine allocates them: vLLM's default `--block-size` (16).
/// The step engine allocates in these; the fluid one reports its allocation in them
/// ([`EngineModel::kv_allocated_tokens`]). The prefix cache keeps its own 512-token hash blocks
/// ([`BLOCK_TOKENS`]); allocating KV in those would strand up to 511 tokens per sequence and,
/// on the KV-bound profiles, cost a third of the saturation throughput in preemptions
/// (rtx4090: 0.58 against 0.87 req/s in step mode).
pub const KV_BLOCK_TOKENS: u32 = 16;

/// Prefix-cache block size in tokens: the traffic's prefix block, so that one arrival block is
/// one engine cache block.
pub use crate::traffic::BLOCK_TOKENS;

/// Tolerance (tokens) when comparing fluid positions against finish marks.
const EPS_TOKENS: f64 = 1e-6;
/// Tolerance (steps) when asking whether the step clock is on a step boundary, on top of the
/// two nanoseconds' worth of steps by which an event time rounded up to a whole nanosecond can
/// overshoot one.
const EPS_STEPS: f64 = 1e-9;
/// How many breakpoints [`EngineModel::compute_next`] looks through before it wakes the host at
/// the last (enough for a gate and a short last chunk, the most a step run has).
const MAX_LOOKAHEAD_BREAKS: u32 = 4;

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
    /// Checks the values; the message names the field and what is valid.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name} = {v}: must be a finite number > 0"))
            }
        };
        let nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{name} = {v}: must be a finite number >= 0"))
            }
        };
        pos("speed_factor", self.speed_factor)?;
        nonneg("request_noise_cv", self.request_noise_cv)?;
        nonneg("epoch_noise_cv", self.epoch_noise_cv)?;
        pos("epoch_s", self.epoch_s)?;
        if self.max_running == Some(0) {
            return Err("max_running = 0: must be at least 1".into());
        }
        if self.kv_capacity_tokens == Some(0) {
            return Err("kv_capacity_tokens = 0: must be at least 1".into());
        }
        if self.prefill_chunk_tokens == Some(0) {
            return Err("prefill_chunk_tokens = 0: must be at least 1".into());
        }
        Ok(())
    }
}

/// What [`EngineModel::admit`] learned at admission.
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

    fn rank(&self) -> u8 {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    Waiting,
    /// In the running set, in the prefill queue (or gated: admitted mid-step, its work joins
    /// at the next step boundary).
    Prefill,
    Decode,
}

/// The engine's fluid clocks and rates, valid at one instant. Plain data, so that the next
/// event can be looked for ahead of time through the breakpoints (below) without touching the
/// engine.
///
/// **Breakpoints.** Within one step the batch is fixed, so the rates change at step boundaries
/// even when nothing is emitted there: where the gated sequences join the prefill work, and
/// where less than a chunk of prefill work is left (the step is shorter). These are crossed
/// lazily — [`EngineModel::advance`] integrates piecewise through them, with no event and no
/// change of generation — because an event per admission would cost the host a wake-up each.
#[derive(Debug, Clone, Copy)]
struct Fluid {
    /// The step clock: engine steps done since the engine last idled (fractional). Step
    /// boundaries are its whole values; every decoding sequence gets one token per step, so it
    /// is also the decode service clock.
    v: f64,
    /// Prefill work done (cumulative, against the sequences' `prefill_end` marks).
    q: f64,
    /// End mark of the prefill work the running step sees (the gated sequences' excluded).
    q_joined: f64,
    /// Sequences at the front of `prefill` whose work is joined.
    joined: u32,
    /// Sequences at the back of `prefill` waiting for the boundary `gate_v`.
    gated: u32,
    rate_v: f64,
    rate_q: f64,
    /// The next breakpoint on the step clock (`INFINITY`: none).
    break_v: f64,
    /// [`tolerance_at`]`(rate_v)`, set with the rates: every boundary test reads it, and the
    /// division is paid once per change of rates instead of once per test.
    tol: f64,
    /// Decode plus prefill work done since the engine became ready (for the warm-up).
    work: f64,
    /// Prompt tokens the step under way prefills: fixed when the step starts (on a boundary),
    /// so that a call in the middle of it does not change its length.
    c_step: f64,
}

impl Default for Fluid {
    /// An idle engine's clocks: nothing done, nothing stepping.
    fn default() -> Self {
        Fluid {
            v: 0.0,
            q: 0.0,
            q_joined: 0.0,
            joined: 0,
            gated: 0,
            rate_v: 0.0,
            rate_q: 0.0,
            break_v: 0.0,
            tol: tolerance_at(0.0),
            work: 0.0,
            c_step: 0.0,
        }
    }
}

/// How far (steps) the step clock may be from a whole value and still be on a boundary when
/// it runs at `rate_v` steps/s: an event time is rounded up to a whole nanosecond, so it may
/// overshoot by a hair.
#[inline]
fn tolerance_at(rate_v: f64) -> f64 {
    EPS_STEPS + rate_v * 2.0 / NANOS_PER_SEC
}

/// Whether the step clock at `v`, running at `rate_v` with boundary tolerance `tol`, is
/// between two boundaries.
#[inline]
fn mid_step_at(v: f64, rate_v: f64, tol: f64) -> bool {
    rate_v > 0.0 && (v - round_nn(v)).abs() > tol
}

/// The first step boundary after the step clock at `v` (see [`Fluid::next_boundary`]).
#[inline]
fn next_boundary_at(v: f64, rate_v: f64, tol: f64) -> f64 {
    if mid_step_at(v, rate_v, tol) {
        ceil_nn(v)
    } else {
        round_nn(v) + 1.0
    }
}

/// The first breakpoint [`EngineModel::compute_next`]'s look-ahead crossed at the last refresh,
/// kept for the move that crosses it later. That move starts from the very state the look-ahead
/// started from (every change of the clocks is a move or a mutation, and each is followed by a
/// refresh before the next move), so working the crossing out again would give the same bits.
#[derive(Debug, Clone, Copy)]
struct Crossing {
    /// Seconds from the refresh's state to the breakpoint ([`Fluid::secs_to_break`]).
    secs: f64,
    /// The clocks just past it: moved there and crossed ([`EngineModel::cross`]).
    fl: Fluid,
}

/// The rates of a step and its next breakpoint, as [`EngineModel::rates`] works them out.
#[derive(Debug, Clone, Copy)]
struct Rates {
    v: f64,
    q: f64,
    break_v: f64,
    /// [`tolerance_at`]`(v)`.
    tol: f64,
}

impl Fluid {
    /// How far (steps) the step clock may be from a whole value and still be on a boundary
    /// under the current rates ([`tolerance_at`]).
    #[inline]
    fn tolerance(&self) -> f64 {
        self.tol
    }

    /// Whether a step is under way: the engine is stepping and the clock is between two
    /// boundaries.
    #[inline]
    fn mid_step(&self) -> bool {
        mid_step_at(self.v, self.rate_v, self.tol)
    }

    /// The first step boundary after the clock (the end of the running step; the end of the
    /// step starting now when on a boundary).
    #[inline]
    fn next_boundary(&self) -> f64 {
        next_boundary_at(self.v, self.rate_v, self.tol)
    }

    /// Takes the rates of the step under way and its next breakpoint.
    #[inline]
    fn set_rates(&mut self, r: Rates) {
        self.rate_v = r.v;
        self.rate_q = r.q;
        self.break_v = r.break_v;
        self.tol = r.tol;
    }

    /// Seconds to the next breakpoint under the current rates (`INFINITY`: none).
    fn secs_to_break(&self) -> f64 {
        if self.break_v.is_finite() && self.rate_v > 0.0 {
            ((self.break_v - self.v) / self.rate_v).max(0.0)
        } else {
            f64::INFINITY
        }
    }

    /// Whether `other` is this state bit for bit (debug checks).
    fn same_bits(&self, other: &Fluid) -> bool {
        let floats = |f: &Fluid| {
            [
                f.v, f.q, f.q_joined, f.rate_v, f.rate_q, f.break_v, f.tol, f.work, f.c_step,
            ]
            .map(f64::to_bits)
        };
        floats(self) == floats(other) && (self.joined, self.gated) == (other.joined, other.gated)
    }

    /// Moves the clocks `dt` seconds under the current rates (no breakpoint in between).
    fn flow(&mut self, dt: f64, n_decoding: u32) {
        let dv = self.rate_v * dt;
        // the queue cannot drain below empty (event times are rounded up to whole ns)
        let dq = (self.rate_q * dt).min((self.q_joined - self.q).max(0.0));
        self.v += dv;
        self.q += dq;
        self.work += dv * f64::from(n_decoding) + dq;
    }
}

#[derive(Debug, Clone)]
struct Slot {
    seq: u64,
    phase: Phase,
    prompt: u32,
    output: u32,
    cached: u32,
    /// Per-request work multiplier (noise).
    noise: f64,
    /// Cumulative prefill mark at which this sequence's prefill ends.
    prefill_end: f64,
    /// Its prefill work (noise-scaled tokens): it starts at the mark `prefill_end - work`.
    prefill_work: f64,
    /// Leading blocks of `blocks` it holds in the prefix cache (found cached or computed).
    held: u32,
    admitted_at: u64,
    started_at: u64,
    first_token_at: u64,
    /// Decode service clock `V` when this sequence started decoding.
    decode_start: f64,
    /// While free: the next free slot ([`NO_SLOT`]: none), see [`EngineModel::free_head`].
    next_free: u32,
    /// Prefix block hashes (capacity reused across requests).
    blocks: Vec<u64>,
}

/// The end of the free slots' list.
const NO_SLOT: u32 = u32::MAX;

impl Slot {
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

/// Min-heap entry: smallest finish first (in [`f64::total_cmp`]'s order), ties by sequence id.
/// The finish mark is kept as its total-order integer ([`total_order`]), worked out once at the
/// push, so each of the heap's comparisons is an integer one.
#[derive(Debug, Clone, Copy)]
struct DecodeKey {
    /// `total_order(finish)`.
    order: i64,
    seq: u64,
    slot: u32,
}

impl DecodeKey {
    fn new(finish: f64, seq: u64, slot: u32) -> DecodeKey {
        DecodeKey {
            order: total_order(finish),
            seq,
            slot,
        }
    }

    /// The finish mark on the step clock, bit for bit as pushed.
    fn finish(&self) -> f64 {
        from_total_order(self.order)
    }
}

/// The integer whose order is [`f64::total_cmp`]'s (its own transformation of the bits): a
/// negative float's magnitude bits are flipped, so that the signed integers sort as the floats
/// do, `-0.0` before `+0.0`. Its own inverse on the bits ([`from_total_order`]).
#[inline]
fn total_order(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The float [`total_order`] came from (the flip keeps the sign bit, so it undoes itself).
#[inline]
fn from_total_order(order: i64) -> f64 {
    f64::from_bits((order ^ (((order >> 63) as u64) >> 1) as i64) as u64)
}

impl PartialEq for DecodeKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for DecodeKey {}
impl PartialOrd for DecodeKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for DecodeKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // reversed: BinaryHeap is a max-heap
        other
            .order
            .cmp(&self.order)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// One simulated inference engine. See the [module documentation](self).
///
/// `repr(C)` keeps the fields in the order written: what every event reads or writes comes
/// first, together, and what only some calls touch (the cache, the noise, the configuration
/// admission reads) after it. A fleet of thousands of engines finds each engine's state cold in
/// memory, so every cache line an event touches is a miss; the compiler's own order scattered
/// the hot fields over the whole struct.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct EngineModel {
    // --- driver interface and fluid state, valid at `t0` (every event)
    t0: u64,
    next_event: Option<u64>,
    generation: u64,
    fl: Fluid,
    n_decoding: u32,
    running: u32,
    /// Work starts at this time; `u64::MAX` = down (crashed).
    ready_at: u64,
    /// The speed multiplier the rates were computed with (constant between events).
    speed: f64,
    /// End mark of all queued prefill work, the gated sequences' included.
    q_tail: f64,
    /// The step boundary at which the gated sequences (the last `fl.gated` of `prefill`) join
    /// the prefill work.
    gate_v: f64,
    busy_ns: u64,
    /// ∫ sequences decoding dt while busy, sequence-nanoseconds: the operating concurrency's
    /// numerator (the weight error's second reference).
    decoding_ns: u64,
    // --- what the rates are made of (every refresh)
    /// `step_time_s(n)` for (at least) `n = 0..=max_running`: the profile's shared table
    /// ([`HardwareProfile::step_times`]).
    step_time: Arc<[f64]>,
    prefill_tok_s: f64,
    /// The profile's `prefill_overlap` (`hardware::step`).
    overlap: f64,
    chunk: f64,
    /// The speed multiplier's rule (node, cold, epoch), shared with the step engine.
    pace: speed::Speed,
    // --- sequences
    slots: Vec<Slot>,
    prefill: VecDeque<u32>,
    decode: BinaryHeap<DecodeKey>,
    waiting: VecDeque<u32>,
    /// Prefilling sequences with prefix blocks (what `cache_computed_blocks` looks at).
    prefills_with_blocks: u32,
    /// The free slots, last freed first, linked through their `next_free` ([`NO_SLOT`]: none):
    /// taking or returning one touches only the slot itself, which the caller touches anyway.
    free_head: u32,
    kv_used: u64,
    deferred: Vec<EngineOutput>,
    /// The look-ahead's first crossing from `fl`, valid until the clocks next move.
    crossing: Option<Crossing>,
    // --- touched by some calls only
    max_running: u32,
    kv_capacity: u64,
    cache: PrefixCache,
    request_noise: Option<LogNormal<f64>>,
    rng: Xoshiro256PlusPlus,
    profile: Arc<HardwareProfile>,
}

impl EngineModel {
    /// A warm engine (cold if `overrides.start_cold`), ready at time 0.
    ///
    /// # Panics
    /// If `overrides` fail [`EngineOverrides::validate`].
    pub fn new(profile: Arc<HardwareProfile>, overrides: EngineOverrides, seed: u64) -> Self {
        if let Err(e) = overrides.validate() {
            panic!("invalid engine overrides for {}: {e}", profile.name());
        }
        let max_running = overrides.max_running.unwrap_or(profile.max_running());
        let kv_capacity = overrides
            .kv_capacity_tokens
            .unwrap_or(profile.kv_capacity_tokens());
        let chunk = overrides
            .prefill_chunk_tokens
            .unwrap_or(profile.prefill_chunk_tokens());
        let step_time = profile.step_times(max_running);
        let pace = speed::Speed::new(&overrides, profile.cold_start(), seed);
        let cache_blocks = usize::try_from(kv_capacity / u64::from(BLOCK_TOKENS)).unwrap_or(0);
        let mut engine = EngineModel {
            prefill_tok_s: profile.prefill_tok_s(),
            overlap: profile.prefill_overlap(),
            profile,
            step_time,
            chunk: f64::from(chunk),
            max_running,
            kv_capacity,
            request_noise: speed::lognormal(overrides.request_noise_cv),
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            ready_at: 0,
            pace,
            busy_ns: 0,
            decoding_ns: 0,
            t0: 0,
            fl: Fluid::default(),
            crossing: None,
            q_tail: 0.0,
            speed: 0.0,
            n_decoding: 0,
            prefills_with_blocks: 0,
            running: 0,
            kv_used: 0,
            slots: Vec::new(),
            free_head: NO_SLOT,
            waiting: VecDeque::new(),
            prefill: VecDeque::new(),
            gate_v: 0.0,
            decode: BinaryHeap::new(),
            cache: PrefixCache::new(cache_blocks),
            generation: 0,
            next_event: None,
            deferred: Vec::new(),
        };
        engine.refresh();
        engine
    }

    /// The hardware profile.
    pub fn profile(&self) -> &Arc<HardwareProfile> {
        &self.profile
    }

    /// Hands a sequence to the engine at `now` (ns). `seq` is the caller's id (unique among the
    /// sequences in this engine), `prefix` the 512-token prefix block hashes of the prompt
    /// (hash `i` identifies the whole prefix up to block `i`; may be empty).
    pub fn admit(
        &mut self,
        now: u64,
        seq: u64,
        prompt_tokens: u32,
        output_tokens: u32,
        prefix: &[u64],
    ) -> AdmitInfo {
        self.catch_up(now);
        let noise = match &self.request_noise {
            Some(d) => d.sample(&mut self.rng),
            None => 1.0,
        };
        let h = match self.take_free_slot() {
            Some(h) => h,
            None => {
                self.slots.push(Slot {
                    seq: 0,
                    phase: Phase::Free,
                    prompt: 0,
                    output: 0,
                    cached: 0,
                    noise: 1.0,
                    prefill_end: 0.0,
                    prefill_work: 0.0,
                    held: 0,
                    admitted_at: 0,
                    started_at: 0,
                    first_token_at: 0,
                    decode_start: 0.0,
                    next_free: NO_SLOT,
                    blocks: Vec::new(),
                });
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 sequences in flight")
            }
        };
        let s = &mut self.slots[h as usize];
        s.seq = seq;
        s.phase = Phase::Waiting;
        s.prompt = prompt_tokens;
        s.output = output_tokens;
        s.cached = 0;
        s.held = 0;
        s.noise = noise;
        s.admitted_at = now;
        s.blocks.clear();
        s.blocks.extend_from_slice(prefix);
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

    /// The absolute time (ns) of the next first token, completion or internal rate change, if
    /// anything is pending. Valid until the next mutating call (see [`Self::generation`]).
    pub fn next_event_time(&self) -> Option<u64> {
        self.next_event
    }

    /// Moves the engine to `now` and appends everything that happened at or before `now`, in
    /// time order (ties by sequence id, a sequence's first token before its completion).
    pub fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        out.append(&mut self.deferred);
        self.run_until(now, out);
    }

    /// Bumped on every change of rates or pending events; a wake-up scheduled under an older
    /// generation is stale.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Decode progress of sequence `seq` at `now` (ns): the decode steps' worth of service it
    /// has received since its first token, in `0..=output_tokens - 1` (fractional; the prefill
    /// produced the first token, decode step `k` the token `k + 1`, and it completes after
    /// `output_tokens - 1` of them). `None` if `seq` is not decoding (waiting, prefilling,
    /// finished or unknown). Read-only and allocation-free (a scan of the engine's slots);
    /// exact for `now` between the last event processed and [`Self::next_event_time`], clamped
    /// beyond it, so call [`Self::advance_to`] first. For hosts that pace a token stream.
    pub fn decoded_tokens(&self, now: u64, seq: u64) -> Option<f64> {
        let s = self
            .slots
            .iter()
            .find(|s| s.seq == seq && s.phase == Phase::Decode)?;
        let dt = nanos_to_secs(now.saturating_sub(self.t0));
        let v = self.advance(self.fl, dt).v;
        let done = (v - s.decode_start) / s.noise;
        Some(done.clamp(0.0, f64::from(s.output - 1)))
    }

    /// Sequences in the engine (running + waiting).
    pub fn in_flight(&self) -> u32 {
        self.running + self.waiting.len() as u32
    }

    /// Sequences in the running set (prefilling or decoding).
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Sequences currently decoding.
    pub fn decoding(&self) -> u32 {
        self.n_decoding
    }

    /// Sequences waiting inside the engine for room.
    pub fn waiting(&self) -> u32 {
        self.waiting.len() as u32
    }

    /// KV tokens reserved by the running set.
    pub fn kv_used_tokens(&self) -> u64 {
        self.kv_used
    }

    /// KV tokens the running set holds at `now` as vLLM allocates them, what an engine's
    /// KV-usage metric reports: each running sequence's computed tokens (its prompt as far as
    /// prefilled, the cached part included, then the tokens generated) in whole blocks of
    /// [`KV_BLOCK_TOKENS`]. Admission reserves more ([`Self::kv_used_tokens`]: prompt + whole
    /// output); a router reading this figure sees what it would see from a real engine, not the
    /// model's reservation. O(running sequences); for polls.
    pub fn kv_allocated_tokens(&self, now: u64) -> u64 {
        let dt = nanos_to_secs(now.saturating_sub(self.t0));
        let fl = self.advance(self.fl, dt);
        let block = u64::from(KV_BLOCK_TOKENS);
        self.slots
            .iter()
            .map(|s| {
                let tokens = match s.phase {
                    Phase::Free | Phase::Waiting => return 0,
                    Phase::Prefill => {
                        let start = s.prefill_end - s.prefill_work;
                        let done = (fl.q - start).clamp(0.0, s.prefill_work) / s.noise;
                        u64::from(s.cached) + done as u64
                    }
                    Phase::Decode => {
                        let decoded = ((fl.v - s.decode_start) / s.noise).max(0.0) as u64;
                        u64::from(s.prompt) + 1 + decoded.min(u64::from(s.output - 1))
                    }
                };
                tokens.div_ceil(block) * block
            })
            .sum()
    }

    /// Effective running-set limit.
    pub fn max_running(&self) -> u32 {
        self.max_running
    }

    /// Effective KV capacity (tokens).
    pub fn kv_capacity_tokens(&self) -> u64 {
        self.kv_capacity
    }

    /// The sequences [`Self::waiting_prompt_tokens`] counts: those waiting for room and the
    /// gated ones (what an engine's metrics endpoint reports as requests waiting).
    pub fn queued(&self) -> u32 {
        self.waiting.len() as u32 + (self.prefill.len() as u32).saturating_sub(self.fl.joined)
    }

    /// Prompt tokens of the sequences waiting for admission to the running set (what an
    /// engine's metrics endpoint reports as queued).
    pub fn waiting_prompt_tokens(&self) -> u64 {
        // the gated sequences (admitted mid-step) are still in an engine's waiting queue until
        // the scheduler runs at the step's end
        self.waiting
            .iter()
            .chain(self.prefill.iter().skip(self.fl.joined as usize))
            .map(|&i| u64::from(self.slots[i as usize].prompt))
            .sum()
    }

    /// Output tokens per second the engine generates now: decoding sequences × the current
    /// per-sequence decode rate (0 when nothing decodes or the engine is down).
    pub fn generation_tok_s(&self) -> f64 {
        self.fl.rate_v * f64::from(self.n_decoding)
    }

    /// Whether the cold-start penalty is over.
    pub fn is_warm(&self) -> bool {
        self.pace.is_warm()
    }

    /// Whether the engine serves at `now` (ready and not crashed).
    pub fn is_up(&self, now: u64) -> bool {
        now >= self.ready_at
    }

    /// Blocks currently in the prefix cache (held by running sequences and evictable).
    pub fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// Blocks in the prefix cache that no running sequence holds (the evictable part).
    pub fn evictable_blocks(&self) -> usize {
        self.cache.evictable()
    }

    /// From now on record the [`KvEvent`]s vLLM's KV event publisher would send (or stop,
    /// dropping undrained ones). Off by default, so runs that do not need them pay nothing.
    pub fn publish_kv_events(&mut self, on: bool) {
        self.cache.set_publish(on);
    }

    /// Appends the KV events recorded since the last drain, in the order they happened. The
    /// cache they describe is the one [`Self::peek_cached_tokens`] reads.
    pub fn drain_kv_events(&mut self, out: &mut Vec<KvEvent>) {
        self.cache.drain_events(out);
    }

    /// Whether KV events are waiting to be drained.
    pub fn has_kv_events(&self) -> bool {
        self.cache.has_events()
    }

    /// The prompt tokens the engine would serve from its prefix cache right now (without
    /// touching the cache), for comparison with the router's belief: the blocks running
    /// sequences hold (those prefilling: as far as computed when the engine last moved, at its
    /// last event or call) and the evictable ones.
    pub fn peek_cached_tokens(&self, prompt_tokens: u32, prefix: &[u64]) -> u32 {
        self.cached_for(prompt_tokens, prefix)
    }

    /// Nanoseconds during which the engine had running sequences and was up, up to the last
    /// time it was moved to (the last event or call).
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// ∫ sequences decoding dt up to `now` (not before the engine's last move), in
    /// sequence-nanoseconds: what [`Self::busy_ns`] counts, weighted by the decoding count.
    /// Read between events, it extends the last move to `now` (nothing changes the count
    /// between the engine's events).
    pub fn decoding_ns(&self, now: u64) -> u64 {
        let ahead = if self.running > 0 && self.ready_at <= self.t0 {
            u64::from(self.n_decoding) * now.saturating_sub(self.t0)
        } else {
            0
        };
        self.decoding_ns + ahead
    }

    /// Current overall speed multiplier (node factor × cold factor × epoch factor; 0 if not up).
    pub fn speed_multiplier(&self) -> f64 {
        self.speed_at(self.t0)
    }

    /// The node's speed factor (1.0 healthy, below 1 degraded).
    pub fn speed_factor(&self) -> f64 {
        self.pace.node
    }

    /// From `now` on, every rate is multiplied by `factor` (a node degrades or recovers).
    /// Non-finite or non-positive factors are ignored.
    pub fn set_speed_factor(&mut self, now: u64, factor: f64) {
        if !(factor.is_finite() && factor > 0.0) {
            return;
        }
        self.catch_up(now);
        self.pace.node = factor;
        self.refresh();
    }

    /// Restarts the engine at `now`: every in-flight sequence fails (their ids are returned,
    /// sorted), the prefix cache is emptied, and the engine serves again from `ready_at`, cold
    /// if `cold` (and the profile has a cold penalty). Outputs that happened before `now` are
    /// kept for the next [`Self::advance_to`].
    pub fn restart(&mut self, now: u64, ready_at: u64, cold: bool) -> Vec<u64> {
        self.catch_up(now);
        let mut failed: Vec<u64> = self
            .slots
            .iter()
            .filter(|s| s.phase != Phase::Free)
            .map(|s| s.seq)
            .collect();
        failed.sort_unstable();
        self.free_head = NO_SLOT;
        // freed last to first, so that the lowest slot is taken first
        for h in (0..self.slots.len() as u32).rev() {
            let s = &mut self.slots[h as usize];
            s.phase = Phase::Free;
            s.held = 0;
            s.blocks.clear();
            self.free_slot(h);
        }
        self.waiting.clear();
        self.prefill.clear();
        self.decode.clear();
        self.cache.clear();
        self.running = 0;
        self.n_decoding = 0;
        self.prefills_with_blocks = 0;
        self.kv_used = 0;
        self.fl = Fluid::default();
        self.q_tail = 0.0;
        self.ready_at = ready_at.max(now);
        self.pace.restart(cold);
        self.refresh();
        failed
    }

    /// Crashes the engine at `now`: in-flight sequences fail (ids returned, sorted), the cache
    /// is lost, and it stays down until [`Self::restart`].
    pub fn crash(&mut self, now: u64) -> Vec<u64> {
        self.restart(now, u64::MAX, true)
    }

    /// Aborts sequence `seq` at `now`, as an engine does when the request's client went away:
    /// it leaves the waiting queue or the running set at once, its KV reservation and batch slot
    /// are freed (the others speed up, a waiting one may start) and it produces no further
    /// output. Prefill work it had not yet done is taken out of the prefill queue. Returns
    /// whether it was in the engine (`false` if unknown or already finished). Outputs that
    /// happened before `now` are kept for the next [`Self::advance_to`].
    pub fn abort(&mut self, now: u64, seq: u64) -> bool {
        self.catch_up(now);
        let Some(h) = self
            .slots
            .iter()
            .position(|s| s.seq == seq && s.phase != Phase::Free)
        else {
            return false;
        };
        let h = h as u32;
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
                let (end, work) = (s.prefill_end, s.prefill_work);
                let left = (end - self.fl.q.max(end - work)).max(0.0);
                self.prefill.remove(pos);
                for &later in self.prefill.iter().skip(pos) {
                    self.slots[later as usize].prefill_end -= left;
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
                self.running -= 1;
                self.kv_used -= self.slots[h as usize].kv_tokens();
                self.release_blocks(h);
            }
        }
        let s = &mut self.slots[h as usize];
        s.phase = Phase::Free;
        s.blocks.clear();
        self.free_slot(h);
        self.start_waiting(now);
        self.refresh();
        true
    }

    // -----------------------------------------------------------------------------------------
    // internals
    // -----------------------------------------------------------------------------------------

    /// Processes events up to `now` (buffering outputs) and moves the fluid state to `now`.
    fn catch_up(&mut self, now: u64) {
        debug_assert!(now >= self.t0, "time went backwards: {now} < {}", self.t0);
        if self.next_event.is_some_and(|te| te <= now) {
            let mut buf = std::mem::take(&mut self.deferred);
            self.run_until(now, &mut buf);
            self.deferred = buf;
        }
        self.move_to(now);
    }

    fn run_until(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        while let Some(te) = self.next_event {
            if te > now {
                break;
            }
            self.step_at(te, out);
        }
    }

    /// Moves the fluid state to `t`, through the breakpoints on the way.
    fn move_to(&mut self, t: u64) {
        if t <= self.t0 {
            return;
        }
        let dt_ns = t - self.t0;
        let q_before = self.fl.q;
        let dt = nanos_to_secs(dt_ns);
        // kept for this move only: the clocks are about to change
        let crossing = self.crossing.take();
        if self.fl.v + self.fl.rate_v * dt < self.fl.break_v {
            // no breakpoint on the way (most moves): in place
            self.fl.flow(dt, self.n_decoding);
        } else if let Some(c) = crossing.filter(|c| c.secs <= dt) {
            // the last refresh's look-ahead crossed the first breakpoint from this very state:
            // go on from there (what `advance_through` does after its first crossing)
            let fl = self.advance(c.fl, dt - c.secs);
            debug_assert!(
                fl.same_bits(&self.advance_through(self.fl, dt)),
                "the kept crossing is not the move's"
            );
            self.fl = fl;
        } else {
            self.fl = self.advance_through(self.fl, dt);
        }
        if self.running > 0 && self.ready_at <= self.t0 {
            self.busy_ns += dt_ns;
            // the decoding count is constant between the engine's events, as the flow assumes
            self.decoding_ns += u64::from(self.n_decoding) * dt_ns;
        }
        self.t0 = t;
        if self.fl.q > q_before && self.prefills_with_blocks > 0 {
            self.cache_computed_blocks();
        }
    }

    /// `fl` moved `dt` seconds ahead, integrating piecewise through its breakpoints. Pure: the
    /// same path serves moving the engine, looking for its next event and reading a decode's
    /// progress.
    fn advance(&self, mut fl: Fluid, dt: f64) -> Fluid {
        // most moves cross no breakpoint: tell without the division
        if fl.v + fl.rate_v * dt < fl.break_v {
            fl.flow(dt, self.n_decoding);
            return fl;
        }
        self.advance_through(fl, dt)
    }

    /// [`Self::advance`] once its quick test has failed: a breakpoint may come within `dt`.
    fn advance_through(&self, mut fl: Fluid, mut dt: f64) -> Fluid {
        loop {
            let to_break = fl.secs_to_break();
            if to_break > dt {
                fl.flow(dt, self.n_decoding);
                return fl;
            }
            fl.flow(to_break, self.n_decoding);
            self.cross(&mut fl);
            dt -= to_break;
            if fl.v + fl.rate_v * dt < fl.break_v {
                fl.flow(dt, self.n_decoding);
                return fl;
            }
        }
    }

    /// `fl` at its breakpoint, a step boundary: the gated work joins when due, and the rates
    /// of the step starting there.
    fn cross(&self, fl: &mut Fluid) {
        fl.v = fl.break_v;
        if fl.gated > 0 && fl.v >= self.gate_v - fl.tolerance() {
            fl.joined += fl.gated;
            fl.gated = 0;
            fl.q_joined = self.q_tail;
        }
        fl.c_step = self.step_chunk(fl);
        self.set_rates(fl);
    }

    /// Sets `fl`'s rates for the step under way (its decode batch and the chunk of joined
    /// prefill work it carries, timed by the one step-time model) and its next breakpoint.
    fn set_rates(&self, fl: &mut Fluid) {
        fl.set_rates(self.rates(fl));
    }

    /// The prompt tokens a step starting at `fl` prefills: a chunk, or what joined work is left.
    fn step_chunk(&self, fl: &Fluid) -> f64 {
        if fl.joined == 0 {
            0.0
        } else {
            self.chunk
                .min((fl.q_joined - fl.q).max(0.0))
                .max(EPS_TOKENS)
        }
    }

    /// The rates of the step under way in `fl` and its next breakpoint. See
    /// [`Self::set_rates`].
    #[inline]
    fn rates(&self, fl: &Fluid) -> Rates {
        let queued = (fl.q_joined - fl.q).max(0.0);
        let c = fl.c_step;
        let decode_s = self.step_time[self.n_decoding as usize];
        // a step without prefill is its decode (`mixed_step_s` of a zero prefill, exactly):
        // no division for it
        let step = if c > 0.0 {
            mixed_step_s(decode_s, c / self.prefill_tok_s, self.overlap)
        } else {
            decode_s
        };
        let (rate_v, rate_q) = if step > 0.0 && self.speed > 0.0 {
            let rate_v = self.speed / step;
            (rate_v, if c > 0.0 { rate_v * c } else { 0.0 })
        } else {
            (0.0, 0.0)
        };
        let tol = tolerance_at(rate_v);
        let mut next = f64::INFINITY;
        if fl.gated > 0 {
            next = self.gate_v;
        }
        if rate_q > 0.0 && c >= self.chunk {
            // whole chunks until the boundary at which less than one is left: that step is
            // shorter
            let first = next_boundary_at(fl.v, rate_v, tol);
            let left = queued - (first - fl.v) * c;
            let whole = floor_nn((left / self.chunk).max(0.0));
            if left - whole * self.chunk > EPS_TOKENS {
                next = next.min(first + whole);
            }
        }
        Rates {
            v: rate_v,
            q: rate_q,
            break_v: next,
            tol,
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
            let start = s.prefill_end - s.prefill_work;
            if self.fl.q <= start {
                break;
            }
            if s.held as usize >= s.blocks.len() {
                continue;
            }
            let done = (self.fl.q - start).min(s.prefill_work) / s.noise;
            let tokens = f64::from(s.cached) + done + EPS_TOKENS;
            let computed = ((tokens / f64::from(BLOCK_TOKENS)) as usize).min(s.blocks.len());
            if computed > s.held as usize {
                self.cache.hold(&s.blocks, s.held as usize, computed);
                s.held = computed as u32;
            }
        }
    }

    /// Drops sequence `h`'s hold on its blocks and evicts what no longer fits.
    fn release_blocks(&mut self, h: u32) {
        let s = &mut self.slots[h as usize];
        if s.held > 0 {
            self.cache.release(&s.blocks, s.held as usize);
            s.held = 0;
        }
        self.fit_cache();
    }

    /// Evicts cached blocks (LRU) until the evictable ones fit in the KV memory the running
    /// sequences do not reserve.
    fn fit_cache(&mut self) {
        if self.cache.evictable() == 0 {
            return;
        }
        let free_blocks = self.kv_capacity.saturating_sub(self.kv_used) / u64::from(BLOCK_TOKENS);
        self.cache
            .evict_to(usize::try_from(free_blocks).unwrap_or(usize::MAX));
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
            let end = self.slots[h as usize].prefill_end;
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
            self.cache.hold(&s.blocks, s.held as usize, s.blocks.len());
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
        s.decode_start = self.fl.v;
        let finish = self.fl.v + f64::from(s.output - 1) * s.noise;
        self.decode.push(DecodeKey::new(finish, s.seq, h));
        self.n_decoding += 1;
    }

    fn complete(&mut self, h: u32, now: u64, out: &mut Vec<EngineOutput>) {
        let s = &mut self.slots[h as usize];
        out.push(EngineOutput::Completed(Completion {
            seq: s.seq,
            at: now,
            admitted_at: s.admitted_at,
            started_at: s.started_at,
            first_token_at: s.first_token_at,
            prompt_tokens: s.prompt,
            output_tokens: s.output,
            cached_tokens: s.cached,
        }));
        self.running -= 1;
        self.kv_used -= s.kv_tokens();
        self.release_blocks(h);
        let s = &mut self.slots[h as usize];
        s.phase = Phase::Free;
        s.blocks.clear();
        self.free_slot(h);
    }

    /// The free slot freed last, taken off the free list.
    #[inline]
    fn take_free_slot(&mut self) -> Option<u32> {
        let h = self.free_head;
        if h == NO_SLOT {
            return None;
        }
        self.free_head = self.slots[h as usize].next_free;
        Some(h)
    }

    /// Puts slot `h` (marked free) on the free list.
    #[inline]
    fn free_slot(&mut self, h: u32) {
        self.slots[h as usize].next_free = self.free_head;
        self.free_head = h;
    }

    fn cached_for(&self, prompt: u32, prefix: &[u64]) -> u32 {
        if prefix.is_empty() || prompt == 0 {
            return 0;
        }
        cached_tokens(prompt, self.cache.leading_hits(prefix))
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
            || (self.running < self.max_running && self.kv_used + kv <= self.kv_capacity)
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
            self.cache.leading_hits(&s.blocks)
        };
        // The hits are held before anything is evicted for the room it needs.
        if hits > 0 {
            self.cache.hold(&s.blocks, 0, hits);
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
        s.prefill_end = self.q_tail;
        s.prefill_work = work;
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

    fn speed_at(&self, t: u64) -> f64 {
        if t < self.ready_at {
            return 0.0;
        }
        self.pace.current()
    }

    /// Recomputes rates and the next event after any change at `t0`; bumps the generation.
    fn refresh(&mut self) {
        let t = self.t0;
        if self.n_decoding == 0 && self.fl.joined == 0 {
            // Nothing is stepping: the next step starts now. Re-base the step clock (the decode
            // heap is empty) and let the gated sequences in.
            self.fl.v = 0.0;
            self.join_gated();
        }
        self.pace.note_work(self.fl.work, EPS_TOKENS);
        self.pace.enter_epoch(t);
        self.speed = self.speed_at(t);
        if !self.fl.mid_step() {
            // a step starts here: its prefill is fixed until its end
            self.fl.c_step = self.step_chunk(&self.fl);
        } else if self.fl.joined == 0 {
            // the work it carried was aborted
            self.fl.c_step = 0.0;
        }
        let rates = self.rates(&self.fl);
        self.fl.set_rates(rates);
        self.generation += 1;
        self.next_event = self.compute_next();
    }

    /// Seconds from `fl` to the next thing the host must be woken for under `fl`'s rates
    /// (a completion, a first token, the end of the warm-up); `INFINITY` if none.
    fn first_change(&self, fl: &Fluid) -> f64 {
        let mut best = f64::INFINITY;
        if fl.rate_v <= 0.0 {
            return best;
        }
        if let Some(top) = self.decode.peek() {
            best = best.min((top.finish() - fl.v) / fl.rate_v);
        }
        if fl.joined > 0 && fl.rate_q > 0.0 {
            // The front's first token comes at the end of the step that finishes its prefill.
            let h = *self.prefill.front().expect("joined sequences are queued");
            let per_step = fl.rate_q / fl.rate_v;
            let v_done = fl.v + (self.slots[h as usize].prefill_end - fl.q) / per_step;
            let v_event = ceil_nn(v_done - fl.tolerance()).max(fl.next_boundary());
            best = best.min((v_event - fl.v) / fl.rate_v);
        }
        if !self.pace.is_warm() {
            let work_rate = fl.rate_v * f64::from(self.n_decoding) + fl.rate_q;
            best = best.min(self.pace.warmup_left(fl.work) / work_rate);
        }
        best.max(0.0)
    }

    /// The next event's time; keeps the look-ahead's first crossing, if it made one, in
    /// `crossing`.
    fn compute_next(&mut self) -> Option<u64> {
        let t = self.t0;
        let at = |dt_s: f64| -> u64 { t.saturating_add(secs_to_nanos_ceil(dt_s)) };
        let mut best: Option<u64> = None;
        let mut consider = |x: u64| best = Some(best.map_or(x, |b: u64| b.min(x)));
        let busy = self.running > 0;
        if busy && self.ready_at > t && self.ready_at != u64::MAX {
            consider(self.ready_at);
        }
        // Look ahead through the breakpoints for the first change the host must see; after a
        // few, wake at the last one reached (crossing it there changes nothing either).
        let mut change = self.first_change(&self.fl);
        let mut to_break = self.fl.secs_to_break();
        self.crossing = None;
        if change <= to_break {
            // no breakpoint before it (most refreshes): no look-ahead copy
            if change.is_finite() {
                consider(at(change));
            }
        } else {
            // the first breakpoint comes before the change (just tested): cross it at once
            let mut fl = self.fl;
            let mut ahead = 0.0;
            for crossed in 1.. {
                fl.flow(to_break, self.n_decoding);
                self.cross(&mut fl);
                if crossed == 1 {
                    self.crossing = Some(Crossing { secs: to_break, fl });
                }
                ahead += to_break;
                change = self.first_change(&fl);
                to_break = fl.secs_to_break();
                if change <= to_break {
                    if change.is_finite() {
                        consider(at(ahead + change));
                    }
                    break;
                }
                if crossed == MAX_LOOKAHEAD_BREAKS {
                    consider(at(ahead + to_break));
                    break;
                }
            }
        }
        if busy
            && self.ready_at <= t
            && let Some(next) = self.pace.next_epoch_after(t)
        {
            consider(next);
        }
        best
    }
}

/// `x.floor()` for `x` in `[0, 2^53)` (below 0: 0), without the libm call the baseline x86-64
/// target makes for `f64::floor` (`as` truncates toward zero and saturates). For the step
/// clock and token counts, on every event's path.
#[inline]
fn floor_nn(x: f64) -> f64 {
    // the signed conversion is one instruction; the unsigned one is not
    (x as i64).max(0) as f64
}

/// `x.ceil()` for `x` in `[0, 2^53)` (below 0: 0), without the libm call.
#[inline]
fn ceil_nn(x: f64) -> f64 {
    let t = floor_nn(x);
    if t < x { t + 1.0 } else { t }
}

/// The whole number nearest `x` in `[0, 2^53)`, halves up, without the libm call.
#[inline]
fn round_nn(x: f64) -> f64 {
    floor_nn(x + 0.5)
}

/// Prompt tokens served from `hit_blocks` cached leading blocks: at least one prompt token is
/// always computed (the engine needs it for the first output token).
fn cached_tokens(prompt: u32, hit_blocks: usize) -> u32 {
    if prompt == 0 {
        return 0;
    }
    (hit_blocks as u64 * u64::from(BLOCK_TOKENS)).min(u64::from(prompt - 1)) as u32
}

#[cfg(test)]
mod tests;
