//! The router's mirror of the engines' prefix caches, built from their KV events
//! (`prefix_knowledge: kv-events`): for every worker, exactly the blocks it announced stored and
//! has not announced removed.
//!
//! A block is of use to an engine only with every block before it, so the mirror also keeps,
//! per worker, which of its blocks are *rooted* (their whole chain of parents, as the `Stored`
//! events name them, is held too). Rooted blocks are closed under "parent of", so a binary
//! search over a request's chain (7 probes for 64 blocks) finds the longest leading match
//! exactly, whatever order the engine evicts in. Removing a block un-roots the blocks below it
//! on that worker and storing it again re-roots them (both rare: vLLM evicts a chain from its
//! end, whose blocks have nothing below them). Among the workers with the longest match, the
//! one whose deepest matched block became rooted last is the holder. Looking up never
//! allocates; applying events may (a block seen for the first time).

use crate::kv::KvEvent;
use crate::worker::WorkerId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block hashes are already chain hashes; one multiply spreads them over the table's bits
/// (hashbrown reads the top bits for its tags and the low ones for the bucket).
#[derive(Default, Clone, Copy)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type Build = BuildHasherDefault<BlockHasher>;

/// A block a worker holds.
#[derive(Clone, Copy, Debug)]
struct Held {
    parent: Option<u64>,
    rooted: bool,
}

/// One worker's announced blocks.
#[derive(Clone, Default)]
struct Cache {
    held: HashMap<u64, Held, Build>,
    /// Parent → its children the worker holds, in the order they were stored.
    children: HashMap<u64, Vec<u64>, Build>,
}

/// Every worker's announced blocks.
#[derive(Clone, Default)]
pub(crate) struct KvMirror {
    /// Block → the workers on which it is rooted, in the order it became so (the last is the
    /// holder).
    rooted: HashMap<u64, Vec<u32>, Build>,
    /// Per worker (by id).
    caches: Vec<Cache>,
    /// (worker, block) pairs held.
    pairs: usize,
}

impl KvMirror {
    /// Make room for workers `0..n`.
    pub fn reserve_workers(&mut self, n: usize) {
        if self.caches.len() < n {
            self.caches.resize_with(n, Cache::default);
        }
    }

    /// Apply a worker's events in the order the engine published them.
    pub fn apply(&mut self, worker: WorkerId, events: &[KvEvent]) {
        self.reserve_workers(worker.index() + 1);
        for e in events {
            match *e {
                KvEvent::Stored { block, parent } => self.store(worker.0, block, parent),
                KvEvent::Removed { block } => self.remove(worker.0, block),
                KvEvent::AllCleared => self.forget_worker(worker),
            }
        }
    }

    fn store(&mut self, w: u32, block: u64, parent: Option<u64>) {
        let cache = &mut self.caches[w as usize];
        if cache.held.contains_key(&block) {
            return;
        }
        let rooted = match parent {
            None => true,
            Some(p) => cache.held.get(&p).is_some_and(|h| h.rooted),
        };
        cache.held.insert(
            block,
            Held {
                parent,
                rooted: false,
            },
        );
        if let Some(p) = parent {
            cache.children.entry(p).or_default().push(block);
        }
        self.pairs += 1;
        if rooted {
            self.set_rooted(w, block, true);
        }
    }

    fn remove(&mut self, w: u32, block: u64) {
        let cache = &mut self.caches[w as usize];
        let Some(gone) = cache.held.remove(&block) else {
            return;
        };
        if let Some(p) = gone.parent
            && let Some(list) = cache.children.get_mut(&p)
        {
            if let Some(pos) = list.iter().position(|&c| c == block) {
                list.remove(pos);
            }
            if list.is_empty() {
                cache.children.remove(&p);
            }
        }
        self.pairs -= 1;
        if gone.rooted {
            self.unroot_block(block, w);
            // What hung below it is held still but no longer of use.
            self.set_rooted(w, block, false);
        }
    }

    /// Root (or un-root) the held blocks below `from` on worker `w` (and `from` itself when it
    /// is held), depth first in the order they were stored.
    fn set_rooted(&mut self, w: u32, from: u64, rooted: bool) {
        let cache = &mut self.caches[w as usize];
        if !cache.children.contains_key(&from) {
            // The common case (a new leaf, an evicted tail): nothing below, no walk.
            if let Some(h) = cache.held.get_mut(&from)
                && h.rooted != rooted
            {
                h.rooted = rooted;
                if rooted {
                    self.rooted.entry(from).or_default().push(w);
                } else {
                    self.unroot_block(from, w);
                }
            }
            return;
        }
        let mut stack = vec![from];
        while let Some(b) = stack.pop() {
            let cache = &mut self.caches[w as usize];
            if let Some(h) = cache.held.get_mut(&b) {
                if h.rooted == rooted {
                    continue;
                }
                h.rooted = rooted;
                if rooted {
                    self.rooted.entry(b).or_default().push(w);
                } else {
                    self.unroot_block(b, w);
                }
            } else if b != from {
                continue;
            }
            if let Some(kids) = self.caches[w as usize].children.get(&b) {
                stack.extend(kids.iter().rev());
            }
        }
    }

    fn unroot_block(&mut self, block: u64, w: u32) {
        if let Some(list) = self.rooted.get_mut(&block) {
            if let Some(pos) = list.iter().position(|&x| x == w) {
                // Order-preserving, so the holder left is the same whatever order blocks go in.
                list.remove(pos);
            }
            if list.is_empty() {
                self.rooted.remove(&block);
            }
        }
    }

    /// Drop everything a worker holds (its engine restarted, or it left).
    pub fn forget_worker(&mut self, worker: WorkerId) {
        let Some(cache) = self.caches.get_mut(worker.index()) else {
            return;
        };
        let cache = std::mem::take(cache);
        self.pairs -= cache.held.len();
        for (block, h) in cache.held {
            if h.rooted {
                self.unroot_block(block, worker.0);
            }
        }
        // The worker's own maps went with it; the shared one keeps its peak capacity unless
        // shrunk (a reset of a large worker otherwise left hundreds of MB allocated). Only
        // well below a quarter full, so a worker that restarts often does not rehash each time.
        let len = self.rooted.len();
        if self.rooted.capacity() > 4 * len + 4096 {
            self.rooted.shrink_to(2 * len);
        }
    }

    /// True when `worker` holds `block` (rooted or not).
    pub fn holds(&self, worker: WorkerId, block: u64) -> bool {
        self.caches
            .get(worker.index())
            .is_some_and(|c| c.held.contains_key(&block))
    }

    /// Blocks `worker` holds.
    pub fn blocks_of(&self, worker: WorkerId) -> usize {
        self.caches.get(worker.index()).map_or(0, |c| c.held.len())
    }

    /// (worker, block) pairs held.
    pub fn len(&self) -> usize {
        self.pairs
    }

    /// The worker with the longest leading match of `blocks`, and its length in blocks.
    pub fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        let depth = leading(blocks, |b| self.rooted.contains_key(&b));
        let last = *self.rooted.get(&blocks[depth.checked_sub(1)?])?.last()?;
        Some((WorkerId(last), depth))
    }

    /// Leading blocks of `blocks` that `worker` holds.
    pub fn match_of(&self, blocks: &[u64], worker: WorkerId) -> usize {
        match self.caches.get(worker.index()) {
            Some(c) if !c.held.is_empty() => {
                leading(blocks, |b| c.held.get(&b).is_some_and(|h| h.rooted))
            }
            _ => 0,
        }
    }
}

/// Length of the leading run of `blocks` for which `held` is true, by binary search (exact
/// because `held` is closed under "parent of" along the chain: see the module notes).
#[inline]
fn leading(blocks: &[u64], held: impl Fn(u64) -> bool) -> usize {
    let (mut lo, mut hi) = (0usize, blocks.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if held(blocks[mid]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(chain: &[u64]) -> Vec<KvEvent> {
        KvEvent::stored_chain(chain).collect()
    }

    /// The probe's mirror kept 543 MB after its worker's reset: a reset now gives the shared
    /// map's memory back, and what another worker holds is untouched.
    #[test]
    fn a_reset_gives_the_memory_back() {
        let mut m = KvMirror::default();
        let big: Vec<u64> = (1..100_000).collect();
        m.apply(WorkerId(0), &stored(&big));
        m.apply(WorkerId(1), &stored(&[7, 8, 9]));
        assert!(m.rooted.capacity() >= 100_000);
        m.apply(WorkerId(0), &[KvEvent::AllCleared]);
        assert!(m.rooted.capacity() < 8192, "{}", m.rooted.capacity());
        assert_eq!(m.blocks_of(WorkerId(0)), 0);
        assert_eq!(m.longest(&[7, 8, 9]), Some((WorkerId(1), 3)));
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn the_longest_leading_match_wins_and_removals_shorten_it() {
        let mut m = KvMirror::default();
        let chain: Vec<u64> = (100..120).collect();
        m.apply(WorkerId(0), &stored(&chain[..6]));
        m.apply(WorkerId(1), &stored(&chain[..12]));
        assert_eq!(m.longest(&chain), Some((WorkerId(1), 12)));
        assert_eq!(m.match_of(&chain, WorkerId(0)), 6);
        // Worker 1 evicts its chain from the end (as vLLM does), down to 4 blocks.
        let removed: Vec<KvEvent> = chain[4..12]
            .iter()
            .rev()
            .map(|&block| KvEvent::Removed { block })
            .collect();
        m.apply(WorkerId(1), &removed);
        assert_eq!(m.longest(&chain), Some((WorkerId(0), 6)));
        assert_eq!(m.match_of(&chain, WorkerId(1)), 4);
        // Both hold the first 4 blocks: the one that stored block 3 last is the holder.
        assert_eq!(m.longest(&chain[..4]), Some((WorkerId(1), 4)));
        m.apply(WorkerId(0), &[KvEvent::AllCleared]);
        assert_eq!(m.longest(&chain), Some((WorkerId(1), 4)));
        assert_eq!((m.blocks_of(WorkerId(0)), m.blocks_of(WorkerId(1))), (0, 4));
        assert_eq!(m.len(), 4);
        assert_eq!(m.longest(&[1, 2]), None);
        assert_eq!(m.longest(&[]), None);
    }

    #[test]
    fn a_chain_without_its_root_is_of_no_use_until_the_root_is_stored_again() {
        let mut m = KvMirror::default();
        let chain: Vec<u64> = (1..=8).collect();
        m.apply(WorkerId(0), &stored(&chain));
        m.apply(WorkerId(1), &stored(&chain[..3]));
        // Worker 0 evicts its root first (an LRU that ties by block order would).
        m.apply(WorkerId(0), &[KvEvent::Removed { block: 1 }]);
        assert_eq!(m.blocks_of(WorkerId(0)), 7);
        assert_eq!(m.match_of(&chain, WorkerId(0)), 0);
        assert_eq!(m.longest(&chain), Some((WorkerId(1), 3)));
        // Stored again: the blocks below it are of use again.
        m.apply(
            WorkerId(0),
            &[KvEvent::Stored {
                block: 1,
                parent: None,
            }],
        );
        assert_eq!(m.longest(&chain), Some((WorkerId(0), 8)));
        // A hole in the middle cuts the match there.
        m.apply(WorkerId(0), &[KvEvent::Removed { block: 5 }]);
        assert_eq!(m.longest(&chain), Some((WorkerId(0), 4)));
        assert_eq!(m.len(), 7 + 3);
    }

    #[test]
    fn events_are_idempotent_and_unknown_removals_change_nothing() {
        let mut m = KvMirror::default();
        m.apply(WorkerId(2), &stored(&[7, 8]));
        m.apply(WorkerId(2), &stored(&[7, 8]));
        m.apply(WorkerId(2), &[KvEvent::Removed { block: 99 }]);
        m.apply(WorkerId(3), &[KvEvent::Removed { block: 7 }]);
        assert_eq!((m.len(), m.blocks_of(WorkerId(2))), (2, 2));
        assert!(m.holds(WorkerId(2), 8) && !m.holds(WorkerId(3), 7));
        assert_eq!(m.longest(&[7, 8, 9]), Some((WorkerId(2), 2)));
    }
}
