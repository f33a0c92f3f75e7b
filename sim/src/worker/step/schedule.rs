//! How the step engine runs a step: planning it at its start (decodes first, then the prefill
//! budget, FIFO, from the running set and the waiting queue), its tokens at its end, and the
//! KV blocks it allocates as it computes (with recompute preemption when they run out).

use routelab_policies::streams::secs_to_nanos_ceil;

use super::{KV_ALLOC_TOKENS, StepEngine, blocks_for, computed_tokens};
use crate::worker::slots::Phase;
use crate::worker::{BLOCK_TOKENS, EPS_TOKENS, EngineOutput};

impl StepEngine {
    /// The speed multiplier of a step starting at `t` (0 if the engine is not up).
    fn speed_at(&mut self, t: u64) -> f64 {
        if t < self.core.ready_at {
            return 0.0;
        }
        self.core.pace.enter_epoch(t);
        self.core.pace.current()
    }

    fn free_blocks(&self) -> u64 {
        self.kv_capacity_blocks.saturating_sub(self.used_blocks)
    }

    /// Evicts cached blocks (LRU) until the evictable ones fit in the unallocated blocks.
    fn fit_cache(&mut self) {
        let free_tokens = self.free_blocks() * KV_ALLOC_TOKENS;
        self.core.fit_cache(free_tokens);
    }

    /// Allocates the blocks sequence `h` needs to hold `tokens` tokens, if they are free (or it
    /// is alone in the running set).
    fn grow(&mut self, h: u32, tokens: u64) -> bool {
        let need = blocks_for(tokens).saturating_sub(self.slots[h as usize].state.kv_blocks);
        if need > self.free_blocks() && self.running.len() > 1 {
            return false;
        }
        self.used_blocks += need;
        let s = &mut self.slots[h as usize];
        s.state.kv_blocks += need;
        s.state.kv_tokens = tokens;
        if need > 0 {
            self.fit_cache();
        }
        true
    }

    /// [`Self::grow`], preempting the most recently started running sequences until it fits.
    /// `false` if `h` itself was preempted.
    fn make_room(&mut self, h: u32, tokens: u64) -> bool {
        loop {
            if self.grow(h, tokens) {
                return true;
            }
            let victim = self
                .running
                .pop()
                .expect("a sequence that grows is running");
            self.preempt(victim);
            if victim == h {
                return false;
            }
        }
    }

    /// Sends running sequence `h` (already out of `running`) back to the front of the waiting
    /// queue, its KV freed (recompute preemption).
    fn preempt(&mut self, h: u32) {
        self.preemptions += 1;
        self.sched.retain(|&r| r != h);
        if self.slots[h as usize].phase == Phase::Decode {
            let s = &mut self.slots[h as usize];
            // its prompt and every token generated so far are recomputed
            s.state.ctx = u64::from(s.prompt) + 1 + s.state.decoded;
        }
        self.leave_running(h);
        let s = &mut self.slots[h as usize];
        s.phase = Phase::Waiting;
        s.state.prefill_done = 0;
        s.state.kv_tokens = 0;
        self.waiting.push_front(h);
    }

    /// Frees what running sequence `h` holds: its step work, decode count, KV blocks and its
    /// prefix-cache references.
    pub(super) fn leave_running(&mut self, h: u32) {
        let s = &mut self.slots[h as usize];
        s.state.step_decode = false;
        s.state.step_prefill = 0;
        if s.phase == Phase::Decode {
            self.n_decoding -= 1;
        }
        self.used_blocks -= s.state.kv_blocks;
        s.state.kv_blocks = 0;
        if s.held > 0 {
            self.core.cache.release(&s.blocks, s.held as usize);
            s.held = 0;
        }
        self.fit_cache();
    }

    /// Plans and starts a step at `t` if the engine is up and has work.
    pub(super) fn start_step(&mut self, t: u64) {
        debug_assert!(self.step_end.is_none());
        if self.running.is_empty() && self.waiting.is_empty() {
            return;
        }
        let speed = self.speed_at(t);
        if speed <= 0.0 {
            return;
        }
        self.sched.clear();
        let preempted_before = self.preemptions;
        // 1. one token for every decoding sequence, in the running set's order
        let mut i = 0;
        while i < self.running.len() {
            let h = self.running[i];
            if self.slots[h as usize].phase == Phase::Decode {
                let want = self.slots[h as usize].state.kv_tokens + 1;
                if !self.make_room(h, want) {
                    continue; // `h` was the last one: the loop ends
                }
                self.slots[h as usize].state.step_decode = true;
                self.sched.push(h);
            }
            i += 1;
        }
        // 2. the prefill budget, FIFO: running sequences still prefilling first
        let mut budget = self.chunk;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let h = self.running[i];
            let s = &self.slots[h as usize];
            if s.phase == Phase::Prefill {
                let n = (s.state.prefill_total - s.state.prefill_done).min(budget);
                let want = s.computed_after(s.state.prefill_done + n);
                if !self.make_room(h, want) {
                    continue;
                }
                self.slots[h as usize].state.step_prefill = n;
                self.sched.push(h);
                budget -= n;
            }
            i += 1;
        }
        // 3. then the waiting queue, while the running set and the KV have room; not in a step
        // that had to preempt (as vLLM V1's scheduler: the victim, now at the front of the
        // queue, would otherwise come straight back and thrash)
        while budget > 0
            && (self.running.len() as u32) < self.core.max_running
            && self.preemptions == preempted_before
        {
            let Some(&h) = self.waiting.front() else {
                break;
            };
            let s = &self.slots[h as usize];
            let hits = if s.prompt == 0 || s.blocks.is_empty() {
                0
            } else {
                self.core.cache.leading_hits(&s.blocks)
            };
            // at least one token is computed: it samples the next output token
            let ctx_cached =
                (hits as u64 * u64::from(BLOCK_TOKENS)).min(s.state.ctx.saturating_sub(1));
            let uncached = (s.state.ctx - ctx_cached).max(1);
            let total = ((uncached as f64 * s.noise).ceil() as u64).max(1);
            let n = total.min(budget);
            let want = computed_tokens(s.state.ctx, ctx_cached, total, n);
            let fits = self.running.is_empty() || blocks_for(want) <= self.free_blocks();
            if !fits {
                break;
            }
            self.waiting.pop_front();
            let s = &mut self.slots[h as usize];
            // The hits are held before anything is evicted for the room it needs.
            if hits > 0 {
                self.core.cache.hold(&s.blocks, 0, hits);
            }
            s.held = hits as u32;
            s.state.ctx_cached = ctx_cached;
            s.state.prefill_total = total;
            s.state.prefill_done = 0;
            if !s.state.first_out {
                s.cached = ctx_cached as u32;
                s.started_at = t;
            }
            s.phase = Phase::Prefill;
            s.state.step_prefill = n;
            self.running.push(h);
            let grown = self.grow(h, want);
            debug_assert!(grown, "checked above");
            self.sched.push(h);
            budget -= n;
        }
        if self.sched.is_empty() {
            return;
        }
        let (mut decodes, mut prefill, mut attended) = (0u32, 0u64, 0u64);
        for &h in &self.sched {
            let s = &self.slots[h as usize];
            decodes += u32::from(s.state.step_decode);
            prefill += s.state.step_prefill;
            if s.state.step_decode {
                // a decode attends to every token whose KV its sequence holds
                attended += s.state.kv_tokens;
            }
        }
        let step_s = self.core.profile.mixed_step_time_at_s(
            f64::from(decodes),
            attended as f64,
            prefill as f64,
        ) / speed;
        let ns = secs_to_nanos_ceil(step_s).max(1);
        self.step_start = t;
        self.step_end = Some(t.saturating_add(ns));
        self.step_s = step_s;
        self.step_decodes = decodes;
        self.step_prefill_tokens = prefill;
    }

    /// The running step ends at `e`: its tokens come out.
    pub(super) fn finish_step(&mut self, e: u64, out: &mut Vec<EngineOutput>) {
        self.step_end = None;
        let first = out.len();
        if !self.core.pace.is_warm() {
            self.work_since_ready += f64::from(self.step_decodes) + self.step_prefill_tokens as f64;
            self.core.pace.note_work(self.work_since_ready, EPS_TOKENS);
        }
        let sched = std::mem::take(&mut self.sched);
        for &h in &sched {
            let s = &mut self.slots[h as usize];
            if s.state.step_decode {
                s.state.step_decode = false;
                s.state.decoded += 1;
                if s.state.decoded >= s.state.decode_total {
                    self.complete(h, e, out);
                }
            } else if s.state.step_prefill > 0 {
                s.state.prefill_done += s.state.step_prefill;
                s.state.step_prefill = 0;
                self.hold_computed(h);
                let s = &self.slots[h as usize];
                if s.state.prefill_done >= s.state.prefill_total {
                    self.finish_prefill(h, e, out);
                }
            }
        }
        self.sched = sched;
        self.sched.clear();
        self.running
            .retain(|&h| self.slots[h as usize].phase != Phase::Free);
        out[first..].sort_unstable_by_key(|o| (o.seq(), o.rank()));
    }

    /// Holds the full prompt blocks sequence `h` has computed.
    fn hold_computed(&mut self, h: u32) {
        let s = &mut self.slots[h as usize];
        let computed =
            (s.state.kv_tokens / u64::from(BLOCK_TOKENS)).min(s.blocks.len() as u64) as u32;
        if computed > s.held {
            self.core
                .cache
                .hold(&s.blocks, s.held as usize, computed as usize);
            s.held = computed;
        }
    }

    fn finish_prefill(&mut self, h: u32, now: u64, out: &mut Vec<EngineOutput>) {
        let s = &mut self.slots[h as usize];
        if (s.held as usize) < s.blocks.len() {
            self.core
                .cache
                .hold(&s.blocks, s.held as usize, s.blocks.len());
            s.held = s.blocks.len() as u32;
        }
        if s.state.first_out {
            // a recomputation after a preemption: its step sampled the next token
            s.state.decoded += 1;
            if s.state.decoded >= s.state.decode_total {
                self.complete(h, now, out);
                return;
            }
        } else {
            s.state.first_out = true;
            s.first_token_at = now;
            if s.output > 0 {
                out.push(EngineOutput::FirstToken {
                    seq: s.seq,
                    at: now,
                    cached_tokens: s.cached,
                });
            }
            if s.output <= 1 || s.state.decode_total == 0 {
                self.complete(h, now, out);
                return;
            }
        }
        s.phase = Phase::Decode;
        self.n_decoding += 1;
    }

    /// Sequence `h` is done: it leaves the running set (the caller drops it from `running`).
    fn complete(&mut self, h: u32, now: u64, out: &mut Vec<EngineOutput>) {
        out.push(EngineOutput::Completed(
            self.slots[h as usize].completion(now),
        ));
        self.leave_running(h);
        self.slots.free(h);
    }
}
