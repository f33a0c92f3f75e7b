//! [`InferenceEngine`], the one interface of a simulated inference engine, whichever mode
//! simulates it. What both modes do the same way (readiness, pacing, the prefix cache, restart
//! and crash) is written here once over their [`EngineCore`]; each mode writes what its model of
//! the running set decides.

use std::sync::Arc;

use routelab_policies::KvEvent;

use super::core::EngineCore;
use super::{AdmitInfo, EngineOutput};
use crate::hardware::HardwareProfile;

/// A sequence handed to an engine: the caller's id (unique among the sequences in the engine),
/// its prompt and output lengths in tokens, and the 512-token prefix block hashes of its prompt
/// (hash `i` identifies the whole prefix up to block `i`; may be empty).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The caller's id.
    pub seq: u64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens to generate.
    pub output_tokens: u32,
    /// The prompt's prefix block hashes.
    pub prefix: &'a [u64],
}

impl<'a> Admission<'a> {
    /// Sequence `seq` of `prompt_tokens` and `output_tokens` tokens with these prefix blocks.
    #[inline]
    #[must_use]
    pub const fn new(seq: u64, prompt_tokens: u32, output_tokens: u32, prefix: &'a [u64]) -> Self {
        Admission {
            seq,
            prompt_tokens,
            output_tokens,
            prefix,
        }
    }
}

pub(crate) mod sealed {
    use super::EngineCore;

    /// The hooks the shared methods drive: an engine's core, how it moves in time and what a
    /// restart clears. Not for callers (they cannot name it).
    pub trait Moves {
        /// The state both modes share.
        fn core(&self) -> &EngineCore;
        /// The same, to change.
        fn core_mut(&mut self) -> &mut EngineCore;
        /// Processes the events due by `now` (their outputs deferred to the next
        /// `advance_to`) and moves the engine to `now`.
        fn catch_up(&mut self, now: u64);
        /// Recomputes what the engine does next after a change; bumps the generation.
        fn refresh(&mut self);
        /// Drops every sequence and the running set's state (a restart): the failed ids,
        /// sorted.
        fn drop_sequences(&mut self) -> Vec<u64>;
    }
}

/// One simulated inference engine: sequences are handed in with [`Self::admit`], the host
/// wakes the engine at [`Self::next_event_time`] (unless [`Self::generation`] moved since) and
/// collects first tokens and completions with [`Self::advance_to`]. Every mutating call takes
/// `now`, which never goes backwards.
pub trait InferenceEngine: sealed::Moves {
    /// Hands sequence `s` to the engine at `now` (ns).
    fn admit(&mut self, now: u64, s: Admission<'_>) -> AdmitInfo;

    /// Moves the engine to `now` and appends everything that happened at or before `now`, in
    /// time order (ties by sequence id, a sequence's first token before its completion).
    fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>);

    /// Decode progress of sequence `seq` at `now`: the decode steps' worth of service since its
    /// first token, in `0..=output_tokens - 1`; `None` if it is not decoding.
    fn decoded_tokens(&self, now: u64, seq: u64) -> Option<f64>;

    /// Sequences in the engine (running + waiting).
    fn in_flight(&self) -> u32;

    /// Sequences in the running set (prefilling or decoding).
    fn running(&self) -> u32;

    /// Sequences currently decoding.
    fn decoding(&self) -> u32;

    /// Sequences waiting inside the engine.
    fn waiting(&self) -> u32;

    /// KV tokens the running set uses.
    fn kv_used_tokens(&self) -> u64;

    /// KV tokens allocated at `now`, as an engine's KV-usage metric reports them.
    fn kv_allocated_tokens(&self, now: u64) -> u64;

    /// The sequences [`Self::waiting_prompt_tokens`] counts.
    fn queued(&self) -> u32;

    /// Prompt tokens of the sequences waiting for the running set (what an engine's metrics
    /// endpoint reports as queued).
    fn waiting_prompt_tokens(&self) -> u64;

    /// Output tokens per second the engine generates now.
    fn generation_tok_s(&self) -> f64;

    /// ∫ sequences decoding dt up to `now` (not before the engine's last move), in
    /// sequence-nanoseconds; between events it extends the last move to `now`.
    fn decoding_ns(&self, now: u64) -> u64;

    /// Current overall speed multiplier (node factor × cold factor × epoch factor; 0 if not up).
    fn speed_multiplier(&self) -> f64;

    /// Aborts sequence `seq` at `now`, as an engine does when the request's client went away:
    /// it leaves the engine at once, its KV and batch slot are freed, and it produces no further
    /// output. Returns whether it was in the engine. Outputs from before `now` are kept for the
    /// next [`Self::advance_to`].
    fn abort(&mut self, now: u64, seq: u64) -> bool;

    /// The hardware profile.
    fn profile(&self) -> &Arc<HardwareProfile> {
        &self.core().profile
    }

    /// The absolute time (ns) of the engine's next event, if anything is pending. Valid until
    /// the next mutating call (see [`Self::generation`]).
    #[inline]
    fn next_event_time(&self) -> Option<u64> {
        self.core().next_event
    }

    /// Bumped on every change of rates or pending events; a wake-up scheduled under an older
    /// generation is stale.
    #[inline]
    fn generation(&self) -> u64 {
        self.core().generation
    }

    /// Effective running-set limit.
    fn max_running(&self) -> u32 {
        self.core().max_running
    }

    /// Effective KV capacity (tokens).
    fn kv_capacity_tokens(&self) -> u64 {
        self.core().kv_capacity
    }

    /// Whether the cold-start penalty is over.
    fn is_warm(&self) -> bool {
        self.core().pace.is_warm()
    }

    /// Whether the engine serves at `now` (ready and not crashed).
    fn is_up(&self, now: u64) -> bool {
        self.core().is_up(now)
    }

    /// Blocks currently in the prefix cache (held by running sequences and evictable).
    fn cached_blocks(&self) -> usize {
        self.core().cache.len()
    }

    /// Blocks in the prefix cache that no running sequence holds (the evictable part).
    fn evictable_blocks(&self) -> usize {
        self.core().cache.evictable()
    }

    /// From now on record the [`KvEvent`]s vLLM's KV event publisher would send (or stop,
    /// dropping undrained ones). Off by default, so runs that do not need them pay nothing.
    fn publish_kv_events(&mut self, on: bool) {
        self.core_mut().cache.set_publish(on);
    }

    /// Appends the KV events recorded since the last drain, in the order they happened. The
    /// cache they describe is the one [`Self::peek_cached_tokens`] reads.
    fn drain_kv_events(&mut self, out: &mut Vec<KvEvent>) {
        self.core_mut().cache.drain_events(out);
    }

    /// Whether KV events are waiting to be drained.
    fn has_kv_events(&self) -> bool {
        self.core().cache.has_events()
    }

    /// The prompt tokens the engine would serve from its prefix cache right now (without
    /// touching the cache), for comparison with the router's belief.
    fn peek_cached_tokens(&self, prompt_tokens: u32, prefix: &[u64]) -> u32 {
        self.core().cached_for(prompt_tokens, prefix)
    }

    /// Nanoseconds during which the engine worked, up to the last time it was moved to (the
    /// last event or call).
    fn busy_ns(&self) -> u64 {
        self.core().busy_ns
    }

    /// The node's speed factor (1.0 healthy, below 1 degraded).
    fn speed_factor(&self) -> f64 {
        self.core().pace.node
    }

    /// From `now` on, every rate is multiplied by `factor` (a node degrades or recovers; in
    /// step mode a step under way keeps its length). Non-finite or non-positive factors are
    /// ignored.
    fn set_speed_factor(&mut self, now: u64, factor: f64) {
        if !(factor.is_finite() && factor > 0.0) {
            return;
        }
        self.catch_up(now);
        self.core_mut().pace.node = factor;
        self.refresh();
    }

    /// Restarts the engine at `now`: every in-flight sequence fails (their ids are returned,
    /// sorted), the prefix cache is emptied, and the engine serves again from `ready_at`, cold
    /// if `cold` (and the profile has a cold penalty). Outputs that happened before `now` are
    /// kept for the next [`Self::advance_to`].
    fn restart(&mut self, now: u64, ready_at: u64, cold: bool) -> Vec<u64> {
        self.catch_up(now);
        let failed = self.drop_sequences();
        self.core_mut().restart(now, ready_at, cold);
        self.refresh();
        failed
    }

    /// Crashes the engine at `now`: in-flight sequences fail (ids returned, sorted), the cache
    /// is lost, and it stays down until [`Self::restart`].
    fn crash(&mut self, now: u64) -> Vec<u64> {
        self.restart(now, u64::MAX, true)
    }
}
