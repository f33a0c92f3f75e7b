//! The router's mirror of the engines' prefix caches, built from their KV events
//! (`prefix_knowledge: kv-events`): for every worker, exactly the blocks it announced stored and
//! has not announced removed.
//!
//! A lookup finds the worker with the longest leading match of a request's block chain by a
//! binary search over the chain (7 probes for 64 blocks), which is exact when each engine's
//! cache holds whole leading chains: a block is only of use with every block before it, and
//! vLLM frees a finished request's blocks tail first, so it evicts a chain from its end. Among
//! workers with the same longest match the one that stored the deepest block last is the
//! holder. Looking up never allocates; applying events may (a block seen for the first time).

use crate::kv::KvEvent;
use crate::worker::WorkerId;
use std::collections::{HashMap, HashSet};
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

/// Every worker's announced blocks.
#[derive(Clone, Default)]
pub(crate) struct KvMirror {
    /// Block → the workers holding it, in the order they stored it (the last is the holder).
    holders: HashMap<u64, Vec<u32>, Build>,
    /// Per worker (by id): the blocks it holds.
    held: Vec<HashSet<u64, Build>>,
    /// (worker, block) pairs held.
    pairs: usize,
}

impl KvMirror {
    /// Make room for workers `0..n`.
    pub fn reserve_workers(&mut self, n: usize) {
        if self.held.len() < n {
            self.held.resize_with(n, HashSet::default);
        }
    }

    /// Apply a worker's events in the order the engine published them.
    pub fn apply(&mut self, worker: WorkerId, events: &[KvEvent]) {
        self.reserve_workers(worker.index() + 1);
        for e in events {
            match *e {
                // The parent is implied: a chain hash names the whole prefix up to its block.
                KvEvent::Stored { block, .. } => {
                    if self.held[worker.index()].insert(block) {
                        self.holders.entry(block).or_default().push(worker.0);
                        self.pairs += 1;
                    }
                }
                KvEvent::Removed { block } => {
                    if self.held[worker.index()].remove(&block) {
                        self.unhold(block, worker.0);
                    }
                }
                KvEvent::AllCleared => self.forget_worker(worker),
            }
        }
    }

    fn unhold(&mut self, block: u64, worker: u32) {
        self.pairs -= 1;
        if let Some(list) = self.holders.get_mut(&block) {
            if let Some(pos) = list.iter().position(|&w| w == worker) {
                // Order-preserving, so the holder left is the same whatever order blocks go in.
                list.remove(pos);
            }
            if list.is_empty() {
                self.holders.remove(&block);
            }
        }
    }

    /// Drop everything a worker holds (its engine restarted, or it left).
    pub fn forget_worker(&mut self, worker: WorkerId) {
        let Some(set) = self.held.get_mut(worker.index()) else {
            return;
        };
        let blocks = std::mem::take(set);
        for block in blocks {
            self.unhold(block, worker.0);
        }
    }

    /// True when `worker` holds `block`.
    pub fn holds(&self, worker: WorkerId, block: u64) -> bool {
        self.held
            .get(worker.index())
            .is_some_and(|s| s.contains(&block))
    }

    /// Blocks `worker` holds.
    pub fn blocks_of(&self, worker: WorkerId) -> usize {
        self.held.get(worker.index()).map_or(0, HashSet::len)
    }

    /// (worker, block) pairs held.
    pub fn len(&self) -> usize {
        self.pairs
    }

    /// The worker with the longest leading match of `blocks`, and its length in blocks.
    pub fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        let depth = leading(blocks, |b| self.holders.contains_key(&b));
        let last = *self.holders.get(&blocks[depth.checked_sub(1)?])?.last()?;
        Some((WorkerId(last), depth))
    }

    /// Leading blocks of `blocks` that `worker` holds.
    pub fn match_of(&self, blocks: &[u64], worker: WorkerId) -> usize {
        match self.held.get(worker.index()) {
            Some(set) if !set.is_empty() => leading(blocks, |b| set.contains(&b)),
            _ => 0,
        }
    }
}

/// Length of the leading run of `blocks` for which `held` is true, by binary search (exact when
/// `held` is prefix-closed along the chain: see the module notes).
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
        chain
            .iter()
            .enumerate()
            .map(|(i, &block)| KvEvent::Stored {
                block,
                parent: i.checked_sub(1).map(|p| chain[p]),
            })
            .collect()
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
