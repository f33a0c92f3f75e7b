//! The sequences inside an engine, as both engine modes keep them: a slab of slots reused
//! across requests, with a free list. What a sequence is in either mode (its id, lengths,
//! noise, timeline and prefix blocks) is here once; each mode adds its own bookkeeping as `S`.

use std::ops::{Deref, DerefMut};

use super::core::EngineCore;
use super::{Admission, Completion};

/// Where a sequence is in an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The slot holds no sequence.
    Free,
    /// Waiting inside the engine for room (or, in step mode, for the next step).
    Waiting,
    /// In the running set, prefilling.
    Prefill,
    /// In the running set, decoding.
    Decode,
}

/// One sequence in an engine: what both modes know of it, and the mode's own state `S`.
#[derive(Debug, Clone)]
pub(crate) struct Slot<S> {
    pub(crate) seq: u64,
    pub(crate) phase: Phase,
    pub(crate) prompt: u32,
    pub(crate) output: u32,
    /// Prompt tokens found in the prefix cache when it (first) started: what outputs report.
    pub(crate) cached: u32,
    /// Per-request work multiplier (noise).
    pub(crate) noise: f64,
    /// Leading blocks of `blocks` it holds in the prefix cache (found cached or computed).
    pub(crate) held: u32,
    pub(crate) admitted_at: u64,
    pub(crate) started_at: u64,
    pub(crate) first_token_at: u64,
    /// While free: the next free slot ([`NO_SLOT`]: none), see [`Slots`].
    pub(crate) next_free: u32,
    /// Prefix block hashes (capacity reused across requests).
    pub(crate) blocks: Vec<u64>,
    /// The engine mode's own bookkeeping.
    pub(crate) state: S,
}

impl<S> Slot<S> {
    /// The sequence's completion at `now`, with its timeline.
    pub(crate) fn completion(&self, now: u64) -> Completion {
        Completion {
            seq: self.seq,
            at: now,
            admitted_at: self.admitted_at,
            started_at: self.started_at,
            first_token_at: self.first_token_at,
            prompt_tokens: self.prompt,
            output_tokens: self.output,
            cached_tokens: self.cached,
        }
    }
}

/// The end of the free slots' list.
const NO_SLOT: u32 = u32::MAX;

/// The slab of an engine's sequences. The free slots are linked through their `next_free`,
/// last freed first: taking or returning one touches only the slot itself, which the caller
/// touches anyway. Reads as a slice of slots.
#[derive(Debug, Clone)]
pub(crate) struct Slots<S> {
    all: Vec<Slot<S>>,
    free_head: u32,
}

impl<S> Deref for Slots<S> {
    type Target = [Slot<S>];
    fn deref(&self) -> &[Slot<S>] {
        &self.all
    }
}

impl<S> DerefMut for Slots<S> {
    fn deref_mut(&mut self) -> &mut [Slot<S>] {
        &mut self.all
    }
}

impl<S: Default> Slots<S> {
    /// No slots yet.
    pub(crate) fn new() -> Self {
        Slots {
            all: Vec::new(),
            free_head: NO_SLOT,
        }
    }

    /// A slot for sequence `a` handed in at `now`, waiting: the free slot freed last, or a new
    /// one, with the request noise `core` draws for it. Its mode state is left as it was (each
    /// mode sets what it reads).
    #[inline]
    pub(crate) fn admit(&mut self, now: u64, a: &Admission<'_>, core: &mut EngineCore) -> u32 {
        let noise = core.request_noise();
        let h = match self.take_free() {
            Some(h) => h,
            None => {
                self.all.push(Slot {
                    seq: 0,
                    phase: Phase::Free,
                    prompt: 0,
                    output: 0,
                    cached: 0,
                    noise: 1.0,
                    held: 0,
                    admitted_at: 0,
                    started_at: 0,
                    first_token_at: 0,
                    next_free: NO_SLOT,
                    blocks: Vec::new(),
                    state: S::default(),
                });
                u32::try_from(self.all.len() - 1).expect("fewer than 2^32 sequences in flight")
            }
        };
        let s = &mut self.all[h as usize];
        s.seq = a.seq;
        s.phase = Phase::Waiting;
        s.prompt = a.prompt_tokens;
        s.output = a.output_tokens;
        s.cached = 0;
        s.held = 0;
        s.noise = noise;
        s.admitted_at = now;
        s.blocks.clear();
        s.blocks.extend_from_slice(a.prefix);
        h
    }
}

impl<S> Slots<S> {
    /// The free slot freed last, taken off the free list.
    #[inline]
    fn take_free(&mut self) -> Option<u32> {
        let h = self.free_head;
        if h == NO_SLOT {
            return None;
        }
        self.free_head = self.all[h as usize].next_free;
        Some(h)
    }

    /// Slot `h`'s sequence has left the engine (its cache hold already released): the slot
    /// goes on the free list.
    #[inline]
    pub(crate) fn free(&mut self, h: u32) {
        let s = &mut self.all[h as usize];
        s.phase = Phase::Free;
        s.blocks.clear();
        s.next_free = self.free_head;
        self.free_head = h;
    }

    /// Every sequence in the engine fails (a restart or crash): their ids, sorted; every slot is
    /// freed, the lowest to be taken first.
    pub(crate) fn fail_all(&mut self) -> Vec<u64> {
        let mut failed: Vec<u64> = self
            .all
            .iter()
            .filter(|s| s.phase != Phase::Free)
            .map(|s| s.seq)
            .collect();
        failed.sort_unstable();
        self.free_head = NO_SLOT;
        // freed last to first, so that the lowest slot is taken first
        for h in (0..self.all.len() as u32).rev() {
            self.all[h as usize].held = 0;
            self.free(h);
        }
        failed
    }

    /// The slot of sequence `seq`, if it is in the engine.
    pub(crate) fn find(&self, seq: u64) -> Option<u32> {
        self.all
            .iter()
            .position(|s| s.seq == seq && s.phase != Phase::Free)
            .map(|h| h as u32)
    }

    /// Sequence `seq`'s slot, if it is decoding.
    pub(crate) fn decoding(&self, seq: u64) -> Option<&Slot<S>> {
        self.all
            .iter()
            .find(|s| s.seq == seq && s.phase == Phase::Decode)
    }

    /// The free list from its head (tests).
    #[cfg(test)]
    pub(crate) fn free_list(&self) -> Vec<u32> {
        let mut list = Vec::new();
        let mut h = self.free_head;
        while h != NO_SLOT {
            list.push(h);
            assert!(list.len() <= self.all.len(), "the free list loops");
            h = self.all[h as usize].next_free;
        }
        list
    }
}
