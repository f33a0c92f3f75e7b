//! The router's own, bounded record of which worker recently served which prompt prefix.
//!
//! Keys are prefix-block hashes: hash `i` of a request identifies its whole prompt prefix up to
//! and including block `i` (a chain hash), so equal hashes mean equal prefixes.
//!
//! Two choices keep a decision with a 64-block prompt well under a microsecond:
//!
//! - **Sparse recording.** Only the blocks at *checkpoints* are recorded: indices 0, 1, 3, then
//!   every 8th (7, 15, 23, …) and the prompt's last block. A 64-block prompt records 11 blocks
//!   instead of 64, and a lookup binary-searches the same checkpoints (4 probes). The price is
//!   granularity: beyond the 8th block a match is found to the nearest checkpoint (within 8
//!   blocks, 4,096 tokens) unless it ends exactly at the earlier prompt's last block — which is
//!   what the next turn of a conversation shares.
//! - **A flat open-addressing table with CLOCK eviction.** Each probe touches one 16-byte slot
//!   (linear probing over a power-of-two table sized at twice the capacity); recency is a
//!   "referenced" bit swept by a clock hand over a ring of keys, not a linked list. Everything is
//!   allocated up front: recording and looking up never allocate.
//!
//! It is an approximation of the engines' caches — it forgets by its own clock, not theirs — and
//! the simulator measures how far it is from the truth.

use crate::worker::WorkerId;

/// Key stored for a block hash of 0 (0 marks an empty slot).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    worker: u32,
    referenced: bool,
}

/// Bounded map from prefix-block hash to the worker that last served it.
#[derive(Clone)]
pub struct PrefixIndex {
    slots: Vec<Slot>,
    mask: usize,
    /// Keys in insertion order; the clock hand sweeps it to choose a victim.
    ring: Vec<u64>,
    hand: usize,
    len: usize,
    capacity: usize,
    /// Blocks attributed to each worker (its "tree size"), indexed by worker id.
    per_worker: Vec<u32>,
    /// Record and look up every block, not only the checkpoints (see [`PrefixIndex::dense`]).
    dense: bool,
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Index of the `k`-th checkpoint: 0, 1, 3, 7, 15, 23, 31, … (then every 8th).
#[inline]
fn checkpoint(k: usize) -> usize {
    match k {
        0 => 0,
        1 => 1,
        2 => 3,
        _ => 8 * (k - 2) - 1,
    }
}

/// Number of checkpoints below `n` blocks, counting the last block `n - 1` as one.
#[inline]
fn checkpoints(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let last = n - 1;
    // Regular checkpoints <= last.
    let regular = match last {
        0 => 1,
        1 | 2 => 2,
        3..=6 => 3,
        _ => 3 + (last + 1) / 8,
    };
    if checkpoint(regular - 1) == last {
        regular
    } else {
        regular + 1
    }
}

/// Block index of the `k`-th of the `m` checkpoints of an `n`-block prompt.
#[inline]
fn position(k: usize, m: usize, n: usize) -> usize {
    if k + 1 == m { n - 1 } else { checkpoint(k) }
}

impl PrefixIndex {
    /// An index remembering at most `capacity` blocks (0 disables it).
    pub fn new(capacity: usize) -> Self {
        let slots = if capacity == 0 {
            0
        } else {
            (capacity * 2).next_power_of_two()
        };
        PrefixIndex {
            slots: vec![Slot::default(); slots],
            mask: slots.saturating_sub(1),
            ring: Vec::with_capacity(capacity),
            hand: 0,
            len: 0,
            capacity,
            per_worker: Vec::new(),
            dense: false,
        }
    }

    /// An index that records every block of a prompt, not only the checkpoints: exact match
    /// lengths, as a radix tree would give, for rules that compare the match to the prompt
    /// (the field's routers); about 6 × the upserts of the sparse index on a 64-block prompt.
    pub fn dense(capacity: usize) -> Self {
        PrefixIndex {
            dense: true,
            ..PrefixIndex::new(capacity)
        }
    }

    /// Checkpoints of an `n`-block prompt: every block when dense.
    #[inline]
    fn marks(&self, n: usize) -> usize {
        if self.dense { n } else { checkpoints(n) }
    }

    /// Block index of the `k`-th of the `m` marks of an `n`-block prompt.
    #[inline]
    fn mark(&self, k: usize, m: usize, n: usize) -> usize {
        if self.dense { k } else { position(k, m, n) }
    }

    /// Make room for per-worker block counts of workers `0..n` (called at registration, so
    /// recording never allocates).
    pub fn reserve_workers(&mut self, n: usize) {
        if self.per_worker.len() < n {
            self.per_worker.resize(n, 0);
        }
    }

    /// Blocks the index attributes to `worker` (checkpoint blocks: see the module notes).
    pub fn blocks_of(&self, worker: WorkerId) -> usize {
        self.per_worker
            .get(worker.index())
            .map_or(0, |&n| n as usize)
    }

    fn count(&mut self, worker: u32, add: bool) {
        if let Some(n) = self.per_worker.get_mut(worker as usize) {
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
        }
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most blocks it will remember.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The worker that last served the longest remembered prefix of `blocks`, and how many
    /// leading blocks that prefix has (see the module notes on checkpoint granularity).
    pub fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        if blocks.is_empty() || self.len == 0 {
            return None;
        }
        let n = blocks.len();
        let m = self.marks(n);
        // Checkpoints are recorded together, ancestors refreshed whenever a descendant is, so
        // presence is (nearly) prefix-closed and a binary search finds the deepest.
        let (mut lo, mut hi) = (0usize, m);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let pos = self.mark(mid, m, n);
            match self.find(blocks[pos]) {
                Some(i) => {
                    found = Some((WorkerId(self.slots[i].worker), pos + 1));
                    lo = mid + 1;
                }
                None => hi = mid,
            }
        }
        found
    }

    /// Remember that `worker` now holds the prefix `blocks`.
    pub fn record(&mut self, blocks: &[u64], worker: WorkerId) {
        if self.capacity == 0 || blocks.is_empty() {
            return;
        }
        let n = blocks.len();
        let m = self.marks(n);
        for k in 0..m {
            self.upsert(blocks[self.mark(k, m, n)], worker.0);
        }
    }

    /// Forget every block held by `worker` (its engine restarted or crashed).
    pub fn forget_worker(&mut self, worker: WorkerId) {
        // Rare: drop the worker's keys and rebuild the ring in clock order.
        let mut kept = Vec::with_capacity(self.ring.len());
        let n = self.ring.len();
        for step in 0..n {
            let key = self.ring[(self.hand + step) % n];
            if let Some(i) = self.find(key) {
                if self.slots[i].worker == worker.0 {
                    self.remove_at(i);
                    self.len -= 1;
                } else {
                    kept.push(key);
                }
            }
        }
        self.ring = kept;
        self.ring
            .reserve_exact(self.capacity.saturating_sub(self.ring.len()));
        self.hand = 0;
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let key = if key == 0 { ZERO_KEY } else { key };
        let mut i = self.home(key);
        loop {
            let s = &self.slots[i];
            if s.key == key {
                return Some(i);
            }
            if s.key == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    fn upsert(&mut self, key: u64, worker: u32) {
        let key = if key == 0 { ZERO_KEY } else { key };
        let mut i = self.home(key);
        loop {
            let s = &mut self.slots[i];
            if s.key == key {
                let old = s.worker;
                s.worker = worker;
                s.referenced = true;
                if old != worker {
                    self.count(old, false);
                    self.count(worker, true);
                }
                return;
            }
            if s.key == 0 {
                break;
            }
            i = (i + 1) & self.mask;
        }
        // A new block: make room first (which may move slots), then insert.
        if self.len == self.capacity {
            self.evict_one();
        }
        let mut i = self.home(key);
        while self.slots[i].key != 0 {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = Slot {
            key,
            worker,
            referenced: false,
        };
        self.len += 1;
        self.count(worker, true);
        if self.ring.len() < self.capacity {
            self.ring.push(key);
        } else {
            // The hand stands just past the victim's place in the ring: reuse it.
            let at = (self.hand + self.ring.len() - 1) % self.ring.len();
            self.ring[at] = key;
        }
    }

    /// CLOCK: sweep the ring, giving referenced blocks a second chance, remove the first other.
    fn evict_one(&mut self) {
        let n = self.ring.len();
        loop {
            let key = self.ring[self.hand];
            self.hand = (self.hand + 1) % n;
            match self.find(key) {
                Some(i) if self.slots[i].referenced => self.slots[i].referenced = false,
                Some(i) => {
                    self.remove_at(i);
                    self.len -= 1;
                    return;
                }
                // Defensive: a ring entry whose block is gone is a free place.
                None => return,
            }
        }
    }

    /// Backward-shift deletion for linear probing (no tombstones).
    fn remove_at(&mut self, mut hole: usize) {
        let gone = self.slots[hole].worker;
        self.count(gone, false);
        self.slots[hole] = Slot::default();
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots[j];
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
                self.slots[hole] = s;
                self.slots[j] = Slot::default();
                hole = j;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_0_1_3_then_every_8th_and_the_last() {
        let list = |n: usize| {
            let m = checkpoints(n);
            (0..m).map(|k| position(k, m, n)).collect::<Vec<_>>()
        };
        assert_eq!(list(1), vec![0]);
        assert_eq!(list(2), vec![0, 1]);
        assert_eq!(list(3), vec![0, 1, 2]);
        assert_eq!(list(4), vec![0, 1, 3]);
        assert_eq!(list(5), vec![0, 1, 3, 4]);
        assert_eq!(list(8), vec![0, 1, 3, 7]);
        assert_eq!(list(9), vec![0, 1, 3, 7, 8]);
        assert_eq!(list(16), vec![0, 1, 3, 7, 15]);
        assert_eq!(list(64), vec![0, 1, 3, 7, 15, 23, 31, 39, 47, 55, 63]);
        for n in 1..300 {
            let l = list(n);
            assert!(l.windows(2).all(|w| w[0] < w[1]), "{n}: {l:?}");
            assert_eq!(*l.last().unwrap(), n - 1);
        }
    }

    #[test]
    fn longest_prefix_with_checkpoint_granularity() {
        let mut p = PrefixIndex::new(64);
        let chain: Vec<u64> = (1..=20).collect();
        p.record(&chain[..12], WorkerId(7));
        // The same prompt, and a longer one extending it, match to its last block.
        assert_eq!(p.longest(&chain[..12]), Some((WorkerId(7), 12)));
        assert_eq!(p.longest(&chain), Some((WorkerId(7), 8)));
        assert_eq!(p.longest(&chain[..2]), Some((WorkerId(7), 2)));
        assert_eq!(p.longest(&[1, 99, 98, 97]), Some((WorkerId(7), 1)));
        assert_eq!(p.longest(&[99]), None);
        // Hash 0 is a valid block hash.
        p.record(&[0], WorkerId(3));
        assert_eq!(p.longest(&[0, 5]), Some((WorkerId(3), 1)));
    }

    #[test]
    fn a_dense_index_matches_to_the_exact_block() {
        let mut p = PrefixIndex::dense(64);
        let chain: Vec<u64> = (1..=20).collect();
        p.record(&chain[..12], WorkerId(7));
        // The sparse index finds 8 of these 12 blocks (the test above); the dense one all.
        assert_eq!(p.longest(&chain), Some((WorkerId(7), 12)));
        assert_eq!(p.longest(&chain[..10]), Some((WorkerId(7), 10)));
        assert_eq!(p.len(), 12);
    }

    #[test]
    fn per_worker_block_counts_follow_records_takeovers_evictions_and_forgetting() {
        let mut p = PrefixIndex::dense(6);
        p.reserve_workers(3);
        p.record(&[1, 2, 3], WorkerId(0));
        p.record(&[10, 11], WorkerId(1));
        assert_eq!((p.blocks_of(WorkerId(0)), p.blocks_of(WorkerId(1))), (3, 2));
        // Worker 2 serves a prompt sharing two of worker 0's blocks: they are its now.
        p.record(&[1, 2, 4], WorkerId(2));
        assert_eq!(
            (0..3).map(|w| p.blocks_of(WorkerId(w))).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        // Full (6 blocks): a new block evicts one, and its holder's count drops.
        p.record(&[30], WorkerId(1));
        let total: usize = (0..3).map(|w| p.blocks_of(WorkerId(w))).sum();
        assert_eq!(total, p.len());
        p.forget_worker(WorkerId(2));
        assert_eq!(p.blocks_of(WorkerId(2)), 0);
        let total: usize = (0..3).map(|w| p.blocks_of(WorkerId(w))).sum();
        assert_eq!(total, p.len());
        // A worker never reserved reads 0.
        assert_eq!(p.blocks_of(WorkerId(9)), 0);
    }

    #[test]
    fn clock_eviction_keeps_the_size_bounded_and_referenced_blocks_longer() {
        let mut p = PrefixIndex::new(4);
        p.record(&[1, 2], WorkerId(1)); // records 1, 2
        p.record(&[1, 2], WorkerId(1)); // both referenced now
        p.record(&[10, 11], WorkerId(2));
        assert_eq!(p.len(), 4);
        p.record(&[20], WorkerId(3)); // evicts an unreferenced block: 10
        assert_eq!(p.len(), 4);
        assert_eq!(p.longest(&[1, 2]), Some((WorkerId(1), 2)));
        assert_eq!(p.longest(&[20]), Some((WorkerId(3), 1)));
        assert_eq!(p.longest(&[10]), None);
        for k in 100..1_000u64 {
            p.record(&[k], WorkerId(4));
            assert!(p.len() <= 4);
        }
        assert_eq!(p.longest(&[999]), Some((WorkerId(4), 1)));
    }

    #[test]
    fn forget_worker_and_deletion_keep_probing_correct() {
        let mut p = PrefixIndex::new(256);
        for k in 1..=200u64 {
            p.record(&[k], WorkerId((k % 3) as u32));
        }
        p.forget_worker(WorkerId(1));
        for k in 1..=200u64 {
            let expected = (k % 3 != 1).then_some((WorkerId((k % 3) as u32), 1));
            assert_eq!(p.longest(&[k]), expected, "block {k}");
        }
        // Still bounded and usable after the rebuild.
        for k in 1_000..2_000u64 {
            p.record(&[k], WorkerId(9));
        }
        assert_eq!(p.len(), 256);
        assert_eq!(p.longest(&[1_999]), Some((WorkerId(9), 1)));
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut p = PrefixIndex::new(0);
        p.record(&[1, 2], WorkerId(0));
        assert!(p.is_empty());
        assert_eq!(p.longest(&[1]), None);
    }
}
