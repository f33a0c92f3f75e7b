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
//! What the router knows about the engines' caches is the policy's
//! [`PrefixKnowledge`](crate::PrefixKnowledge), and this index serves all three modes:
//!
//! - **`unbounded`**: one table and one CLOCK for the whole fleet, `capacity` blocks (the
//!   index before the knowledge modes). It forgets by its own clock, not the engines'.
//! - **`approximate`**: the same table, but each worker whose cache size is known
//!   ([`crate::WorkerSpec::cache_blocks`]) has its own CLOCK ring and may be *credited* with at
//!   most that many blocks; recording more forgets its oldest first. Credit counts blocks, not
//!   entries: a recorded regular checkpoint stands for the blocks since the previous one (block
//!   63 of a 64-block prompt for blocks 56 to 63), and a prompt's last block, when it is not a
//!   regular checkpoint, for none (the next turn's checkpoint beyond it covers it), so a chain
//!   of `n` blocks is credited `n` rounded down to its last regular checkpoint: up to 7 blocks
//!   less than the engine holds for the newest turn of each conversation, where crediting every
//!   turn's last block would have counted up to 7 blocks twice per turn. A prompt longer than
//!   the cache is recorded up to the cache size. Workers whose size is unknown share one ring
//!   of `capacity` entries, as in `unbounded`.
//! - **`kv-events`**: the engines' announced blocks, mirrored exactly ([`crate::mirror`]);
//!   recording at dispatch does nothing.

mod checkpoints;
mod recorded;
mod slots;

use recorded::Recorded;
use slots::{Pool, Slots};

use crate::kv::KvEvent;
use crate::mirror::KvMirror;
use crate::worker::WorkerId;

#[derive(Clone)]
enum Inner {
    Recorded(Recorded),
    Mirrored(KvMirror),
}

/// The router's knowledge of which worker holds which prompt prefix.
#[derive(Clone)]
pub struct PrefixIndex {
    inner: Inner,
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("mode", &self.mode())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl PrefixIndex {
    /// An `unbounded` index remembering at most `capacity` blocks for the whole fleet (0
    /// disables it).
    pub fn new(capacity: usize) -> Self {
        Self::recorded(capacity, false, false)
    }

    /// An index that records every block of a prompt, not only the checkpoints: exact match
    /// lengths, as a radix tree would give, for rules that compare the match to the prompt
    /// (the field's routers); about 6 × the upserts of the sparse index on a 64-block prompt.
    pub fn dense(capacity: usize) -> Self {
        Self::recorded(capacity, true, false)
    }

    /// An `approximate` index: each worker registered with a cache size is credited with at
    /// most that many blocks; the others share `capacity` entries. `dense` as
    /// [`PrefixIndex::dense`].
    pub fn approximate(capacity: usize, dense: bool) -> Self {
        Self::recorded(capacity, dense, true)
    }

    /// A `kv-events` index: the engines' announced blocks ([`PrefixIndex::apply`]).
    pub fn mirrored() -> Self {
        PrefixIndex {
            inner: Inner::Mirrored(KvMirror::default()),
        }
    }

    fn recorded(capacity: usize, dense: bool, per_worker_bounds: bool) -> Self {
        let mut r = Recorded {
            slots: Slots::default(),
            mask: 0,
            len: 0,
            pools: Vec::new(),
            total_entries: 0,
            pool_of: Vec::new(),
            shared: None,
            shared_entries: capacity,
            per_worker_bounds,
            credit: Vec::new(),
            dense,
        };
        // `approximate` creates the shared pool when a worker of unknown size registers.
        if !per_worker_bounds {
            r.add_pool(Pool::new(capacity, None));
            r.shared = Some(0);
        }
        PrefixIndex {
            inner: Inner::Recorded(r),
        }
    }

    /// The knowledge mode's name.
    pub fn mode(&self) -> &'static str {
        match &self.inner {
            Inner::Recorded(r) if r.per_worker_bounds => "approximate",
            Inner::Recorded(_) => "unbounded",
            Inner::Mirrored(_) => "kv-events",
        }
    }

    /// Make room for workers `0..n` of unknown cache size (so recording never allocates).
    pub fn reserve_workers(&mut self, n: usize) {
        for id in 0..n {
            self.register_worker(WorkerId(id as u32), None);
        }
    }

    /// Make room for a worker and, in `approximate`, bound it by its cache size in blocks (done
    /// once per worker; called at registration, so recording never allocates).
    pub fn register_worker(&mut self, worker: WorkerId, cache_blocks: Option<u32>) {
        match &mut self.inner {
            Inner::Recorded(r) => r.register(worker, cache_blocks),
            Inner::Mirrored(m) => m.reserve_workers(worker.index() + 1),
        }
    }

    /// Blocks the index credits to `worker` (in `kv-events`, the blocks its engine announced).
    pub fn blocks_of(&self, worker: WorkerId) -> usize {
        match &self.inner {
            Inner::Recorded(r) => r.credit.get(worker.index()).map_or(0, |&n| n as usize),
            Inner::Mirrored(m) => m.blocks_of(worker),
        }
    }

    /// Most blocks `worker` may be credited with, when bounded on its own (`approximate` with a
    /// known cache size).
    pub fn bound_of(&self, worker: WorkerId) -> Option<u64> {
        match &self.inner {
            Inner::Recorded(r) => r
                .pool_of
                .get(worker.index())
                .and_then(|&p| r.pools.get(p as usize))
                .and_then(|p| p.bound),
            Inner::Mirrored(_) => None,
        }
    }

    /// Entries remembered (in `kv-events`, (worker, block) pairs).
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Recorded(r) => r.len,
            Inner::Mirrored(m) => m.len(),
        }
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most entries it will remember (unbounded in `kv-events`: the engines bound it).
    pub fn capacity(&self) -> usize {
        match &self.inner {
            Inner::Recorded(r) => r.total_entries,
            Inner::Mirrored(_) => usize::MAX,
        }
    }

    /// The worker believed to hold the longest prefix of `blocks`, and how many leading blocks
    /// that prefix has (recorded modes: the last worker that served it, to checkpoint
    /// granularity; see the module notes).
    #[inline]
    pub fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        // Checked here, inlined into the caller, so a prompt without hashes costs no call.
        if blocks.is_empty() {
            return None;
        }
        match &self.inner {
            Inner::Recorded(r) => r.longest(blocks),
            Inner::Mirrored(m) => m.longest(blocks),
        }
    }

    /// Leading blocks of `blocks` believed held by `worker` when it is not the holder
    /// [`PrefixIndex::longest`] named: in the recorded modes a block has one holder, so 0; in
    /// `kv-events` several workers may hold a prefix and this is the worker's own match.
    pub fn match_besides_holder(&self, blocks: &[u64], worker: WorkerId) -> usize {
        match &self.inner {
            Inner::Recorded(_) => 0,
            Inner::Mirrored(m) => m.match_of(blocks, worker),
        }
    }

    /// True when the index believes `worker` holds `block` (recorded modes: the block was
    /// recorded, as a checkpoint, for that worker and not forgotten since).
    pub fn holds(&self, worker: WorkerId, block: u64) -> bool {
        match &self.inner {
            Inner::Recorded(r) => r
                .find(block)
                .is_some_and(|i| r.slots.get(i).worker == worker.0),
            Inner::Mirrored(m) => m.holds(worker, block),
        }
    }

    /// Remember that `worker` now holds the prefix `blocks` (the recorded modes; `kv-events`
    /// learns only from the engines).
    pub fn record(&mut self, blocks: &[u64], worker: WorkerId) {
        if let Inner::Recorded(r) = &mut self.inner {
            r.record(blocks, worker);
        }
    }

    /// Mirror a worker's cache events (`kv-events`; the recorded modes ignore them).
    pub fn apply(&mut self, worker: WorkerId, events: &[KvEvent]) {
        if let Inner::Mirrored(m) = &mut self.inner {
            m.apply(worker, events);
        }
    }

    /// Forget every block held by `worker` (its engine restarted or crashed, or it left).
    pub fn forget_worker(&mut self, worker: WorkerId) {
        match &mut self.inner {
            Inner::Recorded(r) => r.forget_worker(worker),
            Inner::Mirrored(m) => m.forget_worker(worker),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoints::{checkpoint, checkpoints, credit, position};
    use super::slots::{MAX_POOL_ENTRIES, Slot};
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
    fn a_recorded_chain_is_credited_its_blocks_to_its_last_regular_checkpoint() {
        for n in 1..300 {
            let m = checkpoints(n);
            let credited: usize = (0..m).map(|k| usize::from(credit(k, m, n))).sum();
            let regular = (0..).map(checkpoint).take_while(|&p| p < n).last().unwrap();
            assert_eq!(credited, regular + 1, "{n} blocks");
            assert!(n - credited <= 7, "{n} blocks");
        }
        // A conversation whose turns grow by 3 blocks is credited its length, not once per turn.
        let mut p = PrefixIndex::approximate(64, false);
        p.register_worker(WorkerId(0), Some(1_000));
        let chain: Vec<u64> = (1..=64).collect();
        for n in (4..=64).step_by(3) {
            p.record(&chain[..n], WorkerId(0));
        }
        assert_eq!(p.blocks_of(WorkerId(0)), 64);
    }

    #[test]
    fn approximate_credits_blocks_and_forgets_a_chain_from_its_end() {
        let mut p = PrefixIndex::approximate(64, false);
        p.register_worker(WorkerId(0), Some(100));
        p.register_worker(WorkerId(1), None);
        let first: Vec<u64> = (1..=64).collect();
        let second: Vec<u64> = (1_001..=1_064).collect();
        p.record(&first, WorkerId(0));
        assert_eq!((p.blocks_of(WorkerId(0)), p.len()), (64, 11));
        p.record(&second, WorkerId(0));
        assert!(
            p.blocks_of(WorkerId(0)) <= 100,
            "{}",
            p.blocks_of(WorkerId(0))
        );
        assert_eq!(p.longest(&second), Some((WorkerId(0), 64)));
        // The older conversation lost its deepest blocks, not its root.
        let (w, kept) = p.longest(&first).unwrap();
        assert_eq!(w, WorkerId(0));
        assert!((1..64).contains(&kept), "{kept}");
        assert!(p.holds(WorkerId(0), first[0]));
        // A prompt longer than the cache: its leading 100 blocks are believed.
        let long: Vec<u64> = (5_001..=5_300).collect();
        p.record(&long, WorkerId(0));
        assert_eq!(
            p.longest(&long).map(|(_, n)| n),
            Some(96),
            "checkpoint 95 of 100"
        );
        assert!(p.blocks_of(WorkerId(0)) <= 100);
        // Another worker serving a prefix takes it over: the first worker's credit drops.
        let before = p.blocks_of(WorkerId(0));
        p.record(&second[..8], WorkerId(1));
        assert_eq!(p.blocks_of(WorkerId(1)), 8);
        assert_eq!(p.longest(&second[..8]), Some((WorkerId(1), 8)));
        assert!(p.blocks_of(WorkerId(0)) < before);
        p.forget_worker(WorkerId(0));
        assert_eq!(p.blocks_of(WorkerId(0)), 0);
        assert_eq!(p.longest(&second[..8]), Some((WorkerId(1), 8)));
        assert_eq!(p.mode(), "approximate");
        assert_eq!(p.capacity(), 164);
    }

    #[test]
    fn a_slot_keeps_its_place_weight_and_referenced_bit_apart() {
        let max_place = MAX_POOL_ENTRIES - 1;
        for (place, weight, referenced) in [(0, 0, false), (max_place, 8, true), (5, 15, false)] {
            let mut s = Slot::new(7, 3, place, weight, referenced);
            assert_eq!(
                (s.place(), s.weight(), s.referenced()),
                (place, u64::from(weight), referenced)
            );
            s.set_referenced(!referenced);
            s.set_place(max_place - place);
            assert_eq!(
                (s.place(), s.weight(), s.referenced(), s.key, s.worker),
                (max_place - place, u64::from(weight), !referenced, 7, 3)
            );
        }
        // A pool never holds more entries than a place can name.
        assert_eq!(Pool::new(usize::MAX, None).entries, MAX_POOL_ENTRIES);
    }

    #[test]
    fn the_slot_table_starts_empty_and_keeps_each_field_of_a_slot() {
        let mut t = Slots::zeroed(4);
        assert_eq!(t.len(), 4);
        assert!((0..4).all(|i| t.key(i) == 0 && t.get(i).key == 0));
        let s = Slot::new(u64::MAX - 1, u32::MAX - 2, MAX_POOL_ENTRIES - 1, 15, true);
        t.set(2, s);
        assert_eq!((t.get(2), t.key(2)), (s, u64::MAX - 1));
        assert_eq!(t.get(1).key, 0, "a neighbour is untouched");
        t.clear(2);
        assert_eq!(t.key(2), 0);
        assert!(Slots::default().is_empty());
    }

    #[test]
    fn growing_the_table_keeps_what_was_recorded() {
        // Worker 0's prompts are recorded while the table is small; registering more workers
        // grows it (a rehash of the live entries) and every prompt is still found.
        let mut p = PrefixIndex::approximate(0, false);
        p.register_worker(WorkerId(0), Some(64));
        let prompts: Vec<Vec<u64>> = (0..6u64)
            .map(|c| (0..4).map(|b| c * 1_000 + b + 1).collect())
            .collect();
        for prompt in &prompts {
            p.record(prompt, WorkerId(0));
        }
        let before = p.len();
        for id in 1..40 {
            p.register_worker(WorkerId(id), Some(1_000));
        }
        assert_eq!(p.len(), before);
        for prompt in &prompts {
            assert_eq!(p.longest(prompt), Some((WorkerId(0), 4)));
        }
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut p = PrefixIndex::new(0);
        p.record(&[1, 2], WorkerId(0));
        assert!(p.is_empty());
        assert_eq!(p.longest(&[1]), None);
    }
}
