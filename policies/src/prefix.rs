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

use crate::kv::KvEvent;
use crate::mirror::KvMirror;
use crate::worker::WorkerId;

/// Key stored for a block hash of 0 (0 marks an empty slot).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Bits of [`Slot::meta`] holding the entry's place in its pool's ring.
const PLACE_BITS: u32 = 26;
const PLACE_MASK: u32 = (1 << PLACE_BITS) - 1;
/// Most entries one pool holds: a ring place must fit in [`PLACE_BITS`] (the policy's
/// `index_blocks` stops at 2^26, a worker's cache at [`crate::worker::MAX_CACHE_BLOCKS`]).
const MAX_POOL_ENTRIES: usize = 1 << PLACE_BITS;
const WEIGHT_SHIFT: u32 = PLACE_BITS;
const WEIGHT_MASK: u32 = 0xF;
/// Set on the blocks of the prompt a worker's own ring is recording, for that record only:
/// the sweep that makes room for the prompt's new blocks must not take the prompt's own.
const PINNED: u32 = 1 << 30;
const REFERENCED: u32 = 1 << 31;

/// One table entry, 16 bytes. `meta` packs its place in its pool's ring (so a ring entry is
/// live only when the key's slot points back at it: a key taken over from a ring and later
/// recorded back into it leaves a stale entry behind, which must not evict it), the blocks it
/// credits to its worker (at most 8, see the module notes), the pin of the record in progress
/// and CLOCK's referenced bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    key: u64,
    worker: u32,
    meta: u32,
}

impl Slot {
    #[inline]
    fn new(key: u64, worker: u32, place: usize, weight: u8, referenced: bool) -> Slot {
        debug_assert!(place <= PLACE_MASK as usize && u32::from(weight) <= WEIGHT_MASK);
        let mut meta = place as u32 | (u32::from(weight) << WEIGHT_SHIFT);
        if referenced {
            meta |= REFERENCED;
        }
        Slot { key, worker, meta }
    }

    #[inline]
    fn place(&self) -> usize {
        (self.meta & PLACE_MASK) as usize
    }

    #[inline]
    fn set_place(&mut self, place: usize) {
        self.meta = (self.meta & !PLACE_MASK) | place as u32;
    }

    /// Blocks this entry credits to its worker.
    #[inline]
    fn weight(&self) -> u64 {
        u64::from((self.meta >> WEIGHT_SHIFT) & WEIGHT_MASK)
    }

    #[inline]
    fn referenced(&self) -> bool {
        self.meta & REFERENCED != 0
    }

    #[inline]
    fn set_referenced(&mut self, on: bool) {
        if on {
            self.meta |= REFERENCED;
        } else {
            self.meta &= !REFERENCED;
        }
    }

    #[inline]
    fn pinned(&self) -> bool {
        self.meta & PINNED != 0
    }

    #[inline]
    fn set_pinned(&mut self, on: bool) {
        if on {
            self.meta |= PINNED;
        } else {
            self.meta &= !PINNED;
        }
    }
}

/// The open-addressing table: each [`Slot`] stored as two words (its key; its worker and
/// `meta`), so that a new table is allocated zeroed. `vec![[0u64; 2]; n]` takes the allocator's
/// zeroed pages, which are touched only when used, where a `Vec` of structs is written out in
/// full: `approximate` sizes the table for every worker's cache, hundreds of MB at 10,000
/// workers, and writing it out at each doubling was most of such a fleet's start-up.
#[derive(Clone, Default)]
struct Slots(Vec<[u64; 2]>);

impl Slots {
    /// `n` empty slots.
    fn zeroed(n: usize) -> Slots {
        Slots(vec![[0; 2]; n])
    }

    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key of slot `i` (0: empty).
    #[inline]
    fn key(&self, i: usize) -> u64 {
        self.0[i][0]
    }

    #[inline]
    fn get(&self, i: usize) -> Slot {
        let [key, rest] = self.0[i];
        Slot {
            key,
            worker: rest as u32,
            meta: (rest >> 32) as u32,
        }
    }

    #[inline]
    fn set(&mut self, i: usize, s: Slot) {
        self.0[i] = [s.key, u64::from(s.worker) | (u64::from(s.meta) << 32)];
    }

    /// Empty slot `i`.
    #[inline]
    fn clear(&mut self, i: usize) {
        self.0[i] = [0; 2];
    }
}

/// One CLOCK: a ring of keys in insertion order swept by a hand.
#[derive(Debug, Clone)]
struct Pool {
    ring: Vec<u64>,
    hand: usize,
    /// Most keys the ring holds.
    entries: usize,
    /// Most blocks its one worker may be credited with (`None`: a shared pool, bounded by
    /// entries only).
    bound: Option<u64>,
}

impl Pool {
    fn new(entries: usize, bound: Option<u64>) -> Pool {
        let entries = entries.min(MAX_POOL_ENTRIES);
        Pool {
            ring: Vec::with_capacity(entries),
            hand: 0,
            entries,
            bound,
        }
    }
}

/// Most marks of a prompt whose home slots are loaded ahead of a lookup or record (a sparse
/// 64-block prompt has 11; a dense one's 64 would cost more than they save).
const WARM_MARKS: usize = 16;

/// Sentinel of [`Recorded::pool_of`] for a worker not registered yet.
const NO_POOL: u32 = u32::MAX;

/// The recorded modes' table.
#[derive(Clone)]
struct Recorded {
    slots: Slots,
    mask: usize,
    len: usize,
    pools: Vec<Pool>,
    /// The sum of the pools' `entries` (kept, so a registration does not sum the fleet's
    /// pools: that was O(n²) over a 10,000-worker fleet's start-up).
    total_entries: usize,
    /// Pool of each worker, by id.
    pool_of: Vec<u32>,
    /// The pool of workers without a per-worker bound.
    shared: Option<u32>,
    /// Entries of the shared pool (created on first use in `approximate`).
    shared_entries: usize,
    /// Per-worker bounds from the workers' cache sizes (`approximate`).
    per_worker_bounds: bool,
    /// Blocks credited to each worker (its "tree size"), indexed by worker id.
    credit: Vec<u64>,
    /// Record and look up every block, not only the checkpoints (see [`PrefixIndex::dense`]).
    dense: bool,
}

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

/// Blocks the `k`-th of the `m` checkpoints of an `n`-block prompt credits: a regular
/// checkpoint stands for the blocks since the previous one ([`span`]); a prompt's last block,
/// when it is not a regular checkpoint, for none, because the next turn of the conversation
/// records the regular checkpoint beyond it, whose span covers it again (crediting both counted
/// up to 7 blocks twice per turn, and a conversation of 12 turns nearly twice its length).
#[inline]
fn credit(k: usize, m: usize, n: usize) -> u8 {
    if k + 1 == m && checkpoint(k) != n - 1 {
        0
    } else {
        span(position(k, m, n))
    }
}

/// Blocks a regular checkpoint at block `p` stands for: those after the previous one.
#[inline]
fn span(p: usize) -> u8 {
    let w = match p {
        0..=2 => 1,
        3 => 2,
        4..=7 => p - 3,
        _ => p % 8 + 1,
    };
    w as u8
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

impl Recorded {
    fn add_pool(&mut self, pool: Pool) -> u32 {
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

    fn register(&mut self, worker: WorkerId, cache_blocks: Option<u32>) {
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
    fn pool(&self, worker: u32) -> Option<u32> {
        match self.pool_of.get(worker as usize) {
            Some(&p) if p != NO_POOL => Some(p),
            _ => self.shared,
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

    #[inline]
    fn credit_of(&self, worker: u32) -> u64 {
        self.credit.get(worker as usize).copied().unwrap_or(0)
    }

    /// Credit (or debit) a worker's blocks; a worker never registered has no count.
    #[inline]
    fn add_credit(&mut self, worker: u32, blocks: u64, add: bool) {
        if let Some(c) = self.credit.get_mut(worker as usize) {
            *c = if add {
                *c + blocks
            } else {
                c.saturating_sub(blocks)
            };
        }
    }

    fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
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

    fn record(&mut self, blocks: &[u64], worker: WorkerId) {
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

    fn forget_worker(&mut self, worker: WorkerId) {
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
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    /// Read the home slot of each key, so the probes that follow hit the cache: the loads are
    /// independent, and the processor overlaps their misses.
    #[inline]
    fn warm(&self, keys: impl Iterator<Item = u64>) {
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
    fn find(&self, key: u64) -> Option<usize> {
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
    fn upsert(&mut self, key: u64, worker: u32, weight: u8, pool: u32, pin: bool) {
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
    fn live(&self, key: u64, at: usize, pool: u32) -> Option<usize> {
        self.find(key).filter(|&i| {
            let s = self.slots.get(i);
            s.place() == at && self.pool(s.worker) == Some(pool)
        })
    }

    /// CLOCK over one pool: sweep its ring, giving referenced blocks a second chance and passing
    /// over pinned ones, remove the first other unpinned one. Returns the ring place freed (a stale entry's,
    /// whose key left the pool, is a free place too), or `None` when two whole turns of the
    /// hand found nothing but pinned entries.
    fn evict_one(&mut self, pool: u32) -> Option<usize> {
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
    fn remove_at(&mut self, mut hole: usize) {
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
