//! The recorded modes' table (`unbounded`, `approximate`): open addressing over the slots with
//! a CLOCK ring per pool.

use super::checkpoints::{checkpoints, credit, position};
use super::slots::{Pool, Slot, Slots, ZERO_KEY};
use crate::worker::WorkerId;

/// Most marks of a prompt whose home slots are loaded ahead of a lookup or record (a sparse
/// 64-block prompt has 11; a dense one's 64 would cost more than they save).
pub(super) const WARM_MARKS: usize = 16;

/// Sentinel of [`Recorded::pool_of`] for a worker not registered yet.
pub(super) const NO_POOL: u32 = u32::MAX;

/// The recorded modes' table.
#[derive(Clone)]
pub(super) struct Recorded {
    pub(super) slots: Slots,
    pub(super) mask: usize,
    pub(super) len: usize,
    pub(super) pools: Vec<Pool>,
    /// The sum of the pools' `entries` (kept, so a registration does not sum the fleet's
    /// pools: that was O(n²) over a 10,000-worker fleet's start-up).
    pub(super) total_entries: usize,
    /// Pool of each worker, by id.
    pub(super) pool_of: Vec<u32>,
    /// The pool of workers without a per-worker bound.
    pub(super) shared: Option<u32>,
    /// Entries of the shared pool (created on first use in `approximate`).
    pub(super) shared_entries: usize,
    /// Per-worker bounds from the workers' cache sizes (`approximate`).
    pub(super) per_worker_bounds: bool,
    /// Blocks credited to each worker (its "tree size"), indexed by worker id.
    pub(super) credit: Vec<u64>,
    /// Record and look up every block, not only the checkpoints (see [`super::PrefixIndex::dense`]).
    pub(super) dense: bool,
}

impl Recorded {
    pub(super) fn add_pool(&mut self, pool: Pool) -> u32 {
        self.total_entries += pool.entries;
        self.pools.push(pool);
        let total = self.total_entries;
        let want = if total == 0 {
            0
        } else {
            (total * 2).next_power_of_two()
        };
        if want > self.slots.len() {
            // Rare (a registration): rebuild the table at its new size. Before anything is
            // recorded (a fleet's start-up) there is nothing to move, and the old table is not
            // read: its pages were never touched.
            let old = std::mem::replace(&mut self.slots, Slots::zeroed(want));
            self.mask = want - 1;
            if self.len > 0 {
                for j in 0..old.len() {
                    let s = old.get(j);
                    if s.key == 0 {
                        continue;
                    }
                    let mut i = self.home(s.key);
                    while self.slots.key(i) != 0 {
                        i = (i + 1) & self.mask;
                    }
                    self.slots.set(i, s);
                }
            }
        }
        (self.pools.len() - 1) as u32
    }

    pub(super) fn register(&mut self, worker: WorkerId, cache_blocks: Option<u32>) {
        let i = worker.index();
        if self.pool_of.len() <= i {
            self.pool_of.resize(i + 1, NO_POOL);
            self.credit.resize(i + 1, 0);
        }
        if self.pool_of[i] != NO_POOL {
            return;
        }
        self.pool_of[i] = match (self.per_worker_bounds, cache_blocks) {
            (true, Some(blocks)) => {
                let blocks = blocks.min(crate::worker::MAX_CACHE_BLOCKS) as usize;
                self.add_pool(Pool::new(blocks, Some(blocks as u64)))
            }
            _ => match self.shared {
                Some(p) => p,
                None => {
                    let p = self.add_pool(Pool::new(self.shared_entries, None));
                    self.shared = Some(p);
                    p
                }
            },
        };
    }

    /// The pool of a worker; a worker never registered is in the shared pool (when there is
    /// one: `unbounded`, or `approximate` once a worker of unknown size registered).
    #[inline]
    pub(super) fn pool(&self, worker: u32) -> Option<u32> {
        match self.pool_of.get(worker as usize) {
            Some(&p) if p != NO_POOL => Some(p),
            _ => self.shared,
        }
    }

    /// Checkpoints of an `n`-block prompt: every block when dense.
    #[inline]
    pub(super) fn marks(&self, n: usize) -> usize {
        if self.dense { n } else { checkpoints(n) }
    }

    /// Block index of the `k`-th of the `m` marks of an `n`-block prompt.
    #[inline]
    pub(super) fn mark(&self, k: usize, m: usize, n: usize) -> usize {
        if self.dense { k } else { position(k, m, n) }
    }

    #[inline]
    pub(super) fn credit_of(&self, worker: u32) -> u64 {
        self.credit.get(worker as usize).copied().unwrap_or(0)
    }

    /// Credit (or debit) a worker's blocks; a worker never registered has no count.
    #[inline]
    pub(super) fn add_credit(&mut self, worker: u32, blocks: u64, add: bool) {
        if let Some(c) = self.credit.get_mut(worker as usize) {
            *c = if add {
                *c + blocks
            } else {
                c.saturating_sub(blocks)
            };
        }
    }

    pub(super) fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        if blocks.is_empty() || self.len == 0 {
            return None;
        }
        let n = blocks.len();
        let m = self.marks(n);
        // The sparse search probes 4 of 11 checkpoints, each probe depending on the last: load
        // all their home slots at once first, so the misses overlap instead of queueing.
        if m <= WARM_MARKS {
            self.warm((0..m).map(|k| blocks[self.mark(k, m, n)]));
        }
        // Checkpoints are recorded together, ancestors refreshed whenever a descendant is, so
        // presence is (nearly) prefix-closed and a binary search finds the deepest.
        let (mut lo, mut hi) = (0usize, m);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let pos = self.mark(mid, m, n);
            match self.find(blocks[pos]) {
                Some(i) => {
                    found = Some((WorkerId(self.slots.get(i).worker), pos + 1));
                    lo = mid + 1;
                }
                None => hi = mid,
            }
        }
        found
    }

    pub(super) fn record(&mut self, blocks: &[u64], worker: WorkerId) {
        let Some(pool) = self.pool(worker.0) else {
            return;
        };
        let (entries, bound) = {
            let p = &self.pools[pool as usize];
            (p.entries, p.bound)
        };
        if entries == 0 || blocks.is_empty() {
            return;
        }
        let n = blocks.len();
        let m = self.marks(n);
        if m <= WARM_MARKS {
            // Overlap the cache misses of the upserts: the marks' home slots, and those of the
            // keys the hand will meet next (which a new prompt evicts).
            self.warm((0..m).map(|k| blocks[self.mark(k, m, n)]));
            let p = &self.pools[pool as usize];
            let ahead = p.ring.len().min(m);
            self.warm((0..ahead).map(|step| p.ring[(p.hand + step) % p.ring.len()]));
        }
        let Some(bound) = bound else {
            for k in 0..m {
                let pos = self.mark(k, m, n);
                let weight = if self.dense { 1 } else { credit(k, m, n) };
                self.upsert(blocks[pos], worker.0, weight, pool, false);
            }
            return;
        };
        // A worker's own ring: a prompt longer than its cache leaves its leading part (what
        // fits). Recorded deepest first, so its ring ages a chain from its end, as vLLM frees
        // a finished request's blocks tail first. Each block recorded is pinned until the
        // record ends: a block the worker already held keeps its old ring place, and the sweep
        // making room for the prompt's new blocks could otherwise clear its referenced bit and
        // come round to it again, evicting part of the very prompt just served (what the
        // property `approximate_never_credits_a_worker_beyond_its_cache` caught). The prompt
        // fits (its credit is at most `bound`), so a ring always has an unpinned entry to take.
        let fits = (0..m)
            .take_while(|&k| (self.mark(k, m, n) as u64) < bound)
            .count();
        for k in (0..fits).rev() {
            let pos = self.mark(k, m, n);
            let weight = if self.dense { 1 } else { credit(k, m, n) };
            self.upsert(blocks[pos], worker.0, weight, pool, true);
        }
        for k in 0..fits {
            if let Some(i) = self.find(blocks[self.mark(k, m, n)]) {
                let mut s = self.slots.get(i);
                s.set_pinned(false);
                self.slots.set(i, s);
            }
        }
    }

    pub(super) fn forget_worker(&mut self, worker: WorkerId) {
        let Some(pool) = self.pool(worker.0) else {
            return;
        };
        // Rare: drop the worker's keys and rebuild the pool's ring in clock order.
        let p = &self.pools[pool as usize];
        let n = p.ring.len();
        let mut kept = Vec::with_capacity(n);
        for step in 0..n {
            let p = &self.pools[pool as usize];
            let key = p.ring[(p.hand + step) % n];
            let at = (p.hand + step) % n;
            if let Some(i) = self.live(key, at, pool) {
                if self.slots.get(i).worker == worker.0 {
                    self.remove_at(i);
                    self.len -= 1;
                } else {
                    kept.push(key);
                }
            }
        }
        for (place, &key) in kept.iter().enumerate() {
            if let Some(i) = self.find(key) {
                let mut s = self.slots.get(i);
                s.set_place(place);
                self.slots.set(i, s);
            }
        }
        let p = &mut self.pools[pool as usize];
        p.ring = kept;
        p.ring.reserve_exact(p.entries.saturating_sub(p.ring.len()));
        p.hand = 0;
    }

    #[inline]
    pub(super) fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    /// Read the home slot of each key, so the probes that follow hit the cache: the loads are
    /// independent, and the processor overlaps their misses.
    #[inline]
    pub(super) fn warm(&self, keys: impl Iterator<Item = u64>) {
        if self.slots.is_empty() {
            return;
        }
        let mut seen = 0u64;
        for key in keys {
            let key = if key == 0 { ZERO_KEY } else { key };
            seen ^= self.slots.key(self.home(key));
        }
        std::hint::black_box(seen);
    }

    #[inline]
    pub(super) fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let key = if key == 0 { ZERO_KEY } else { key };
        let mut i = self.home(key);
        loop {
            let k = self.slots.key(i);
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Record `key` for `worker` in `pool`; `pin` protects it from eviction until the record
    /// in progress unpins it (see [`Recorded::record`]).
    pub(super) fn upsert(&mut self, key: u64, worker: u32, weight: u8, pool: u32, pin: bool) {
        let stored = if key == 0 { ZERO_KEY } else { key };
        if let Some(i) = self.find(key) {
            let mut s = self.slots.get(i);
            let old = s.worker;
            s.set_referenced(true);
            if old == worker {
                s.set_pinned(pin);
            }
            self.slots.set(i, s);
            if old == worker {
                return;
            }
            if self.pool(old) == Some(pool) {
                // Taken over within one ring (the shared pool): the key keeps its place.
                let w = s.weight();
                s.worker = worker;
                self.slots.set(i, s);
                self.add_credit(old, w, false);
                self.add_credit(worker, w, true);
                return;
            }
            // Taken over from another worker's ring: it leaves that record (its ring entry
            // goes stale and is reclaimed by that ring's hand) and joins this one as new.
            self.remove_at(i);
            self.len -= 1;
        }
        // A new block: make room first (which may move slots), then insert.
        let mut free = None;
        if let Some(bound) = self.pools[pool as usize].bound {
            // At most two sweeps of the ring: every live key is evicted within them, so a
            // credit still over the bound after that is not this ring's to free (a worker
            // credited before it had its own pool) and must not spin the hand for ever.
            let mut sweeps_left = 2 * self.pools[pool as usize].ring.len() + 1;
            while self.credit_of(worker) + u64::from(weight) > bound
                && !self.pools[pool as usize].ring.is_empty()
                && sweeps_left > 0
            {
                sweeps_left -= 1;
                match self.evict_one(pool) {
                    Some(at) => free = Some(at),
                    None => break,
                }
            }
        }
        {
            let p = &self.pools[pool as usize];
            if free.is_none() && p.ring.len() == p.entries {
                match self.evict_one(pool) {
                    Some(at) => free = Some(at),
                    // Every entry pinned: cannot happen for a prompt that fits (see `record`);
                    // remembering one block less is the safe answer if it ever did.
                    None => return,
                }
            }
        }
        let mut i = self.home(stored);
        while self.slots.key(i) != 0 {
            i = (i + 1) & self.mask;
        }
        // In a worker's own ring a new block counts as used (CLOCK's usual rule), so the sweep
        // that makes room for a prompt takes the oldest blocks, not the prompt's own; the
        // shared ring keeps the rule of the index before issue 10 (inserted unreferenced).
        let referenced = self.pools[pool as usize].bound.is_some();
        let place = free.unwrap_or(self.pools[pool as usize].ring.len());
        let mut slot = Slot::new(stored, worker, place, weight, referenced);
        slot.set_pinned(pin);
        self.slots.set(i, slot);
        self.len += 1;
        self.add_credit(worker, u64::from(weight), true);
        let p = &mut self.pools[pool as usize];
        match free {
            Some(at) => p.ring[at] = key,
            None => p.ring.push(key),
        }
    }

    /// The slot of the key at ring place `at` of `pool`, when that ring entry is live: the key
    /// is still in the pool, at that place. An entry left behind when its key was taken over by
    /// another pool is stale, and stays stale when the key comes back to this pool elsewhere.
    #[inline]
    pub(super) fn live(&self, key: u64, at: usize, pool: u32) -> Option<usize> {
        self.find(key).filter(|&i| {
            let s = self.slots.get(i);
            s.place() == at && self.pool(s.worker) == Some(pool)
        })
    }

    /// CLOCK over one pool: sweep its ring, giving referenced blocks a second chance and passing
    /// over pinned ones, remove the first other unpinned one. Returns the ring place freed (a stale entry's,
    /// whose key left the pool, is a free place too), or `None` when two whole turns of the
    /// hand found nothing but pinned entries.
    pub(super) fn evict_one(&mut self, pool: u32) -> Option<usize> {
        let turns = 2 * self.pools[pool as usize].ring.len() + 1;
        for _ in 0..turns {
            let p = &mut self.pools[pool as usize];
            let n = p.ring.len();
            let at = p.hand;
            let key = p.ring[at];
            p.hand = (p.hand + 1) % n;
            match self.live(key, at, pool) {
                // A pinned entry loses its second chance like any other (so the ring ages as
                // it did before pins), but is never taken.
                Some(i) if self.slots.get(i).referenced() => {
                    let mut s = self.slots.get(i);
                    s.set_referenced(false);
                    self.slots.set(i, s);
                }
                Some(i) if self.slots.get(i).pinned() => {}
                Some(i) => {
                    self.remove_at(i);
                    self.len -= 1;
                    return Some(at);
                }
                None => return Some(at),
            }
        }
        None
    }

    /// Backward-shift deletion for linear probing (no tombstones).
    pub(super) fn remove_at(&mut self, mut hole: usize) {
        let gone = self.slots.get(hole);
        self.add_credit(gone.worker, gone.weight(), false);
        self.slots.clear(hole);
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots.get(j);
            if s.key == 0 {
                return;
            }
            let home = self.home(s.key);
            // Entry at j may move into the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots.set(hole, s);
                self.slots.clear(j);
                hole = j;
            }
        }
    }
}
