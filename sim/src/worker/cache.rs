//! The engine's prefix cache, kept as vLLM's block manager keeps it (automatic prefix caching).
//!
//! # Model
//!
//! The cache is a set of 512-token blocks, each named by its prefix chain hash (hash `i`
//! identifies the whole prompt up to and including block `i`), with a reference count:
//!
//! * **Held blocks** (count > 0) belong to running sequences: the leading blocks a sequence found
//!   cached when it started, and the blocks it has computed since. Several running sequences
//!   that share a prefix hold the same blocks (shared, reference-counted, as in vLLM). A held
//!   block is never evicted; it lives inside its sequences' KV reservation.
//! * **Evictable blocks** (count 0) are what finished or aborted sequences left behind. They
//!   live in the KV memory the running sequences do not reserve, so the engine keeps at most
//!   `(kv_capacity - kv_used) / 512` of them; when a starting sequence needs the space, the
//!   least recently used go first ([`PrefixCache::evict_to`]).
//! * A sequence releases its blocks last to first, so its tail is nearer eviction than its
//!   head — a shorter prefix of the conversation outlives a longer one (vLLM frees a request's
//!   blocks in reverse order for the same reason).
//!
//! Both kinds are hits for a sequence that starts: a running sequence's prompt is reusable as
//! soon as it is computed.
//!
//! When asked ([`PrefixCache::set_publish`]) the cache records what vLLM's KV event publisher
//! announces: a block stored (with its parent) when it first enters the cache, a block removed
//! when evicted, everything cleared on [`PrefixCache::clear`]. Runs that do not ask pay nothing.
//!
//! Allocation-free in steady state: nodes are recycled through a free list and the map is
//! sized for the engine's blocks up front.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use routelab_policies::KvEvent;

/// Hasher for u64 keys that may be small sequential integers (trace block ids).
#[derive(Default, Clone, Copy)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let p = u128::from(x ^ self.0) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    hash: u64,
    /// Running sequences holding the block; 0 = evictable (then it is in the LRU list).
    refs: u32,
    prev: u32,
    next: u32,
}

/// Reference-counted prefix blocks with an LRU list of the evictable ones. See the
/// [module documentation](self).
#[derive(Debug, Clone)]
pub(crate) struct PrefixCache {
    map: HashMap<u64, u32, BuildHasherDefault<MixHasher>>,
    nodes: Vec<Node>,
    /// Recycled node indices.
    spare: Vec<u32>,
    /// Most recently used evictable block.
    head: u32,
    /// Least recently used evictable block.
    tail: u32,
    evictable: usize,
    publish: bool,
    events: Vec<KvEvent>,
}

impl PrefixCache {
    /// An empty cache expecting about `blocks` entries (the engine's KV capacity in blocks).
    pub(crate) fn new(blocks: usize) -> Self {
        PrefixCache {
            // twice the entries so that tombstones are cleaned by in-place rehashing
            map: HashMap::with_capacity_and_hasher(
                blocks.min(1 << 22).saturating_mul(2),
                BuildHasherDefault::default(),
            ),
            nodes: Vec::new(),
            spare: Vec::new(),
            head: NIL,
            tail: NIL,
            evictable: 0,
            publish: false,
            events: Vec::new(),
        }
    }

    /// Blocks in the cache, held and evictable.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Blocks no running sequence holds.
    pub(crate) fn evictable(&self) -> usize {
        self.evictable
    }

    /// Record [`KvEvent`]s from now on (or stop, dropping the undrained ones).
    pub(crate) fn set_publish(&mut self, on: bool) {
        self.publish = on;
        if !on {
            self.events.clear();
        }
    }

    /// Appends the events recorded since the last drain, in the order they happened.
    pub(crate) fn drain_events(&mut self, out: &mut Vec<KvEvent>) {
        out.append(&mut self.events);
    }

    /// Whether undrained events are waiting.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Drops every block (engine restart or crash).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.nodes.clear();
        self.spare.clear();
        self.head = NIL;
        self.tail = NIL;
        self.evictable = 0;
        if self.publish {
            self.events.push(KvEvent::AllCleared);
        }
    }

    /// How many leading blocks of `blocks` are cached.
    pub(crate) fn leading_hits(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|h| self.map.contains_key(h))
            .count()
    }

    /// A running sequence holds `blocks[from..to]` (found cached or just computed): each is
    /// referenced once more, inserted (and announced) if new. Leaves the LRU list untouched
    /// apart from taking the blocks out of it, so nothing is evicted here.
    pub(crate) fn hold(&mut self, blocks: &[u64], from: usize, to: usize) {
        for (i, &hash) in blocks.iter().enumerate().take(to).skip(from) {
            if let Some(&n) = self.map.get(&hash) {
                if self.nodes[n as usize].refs == 0 {
                    self.unlink(n);
                    self.evictable -= 1;
                }
                self.nodes[n as usize].refs += 1;
                continue;
            }
            let node = Node {
                hash,
                refs: 1,
                prev: NIL,
                next: NIL,
            };
            let n = match self.spare.pop() {
                Some(n) => {
                    self.nodes[n as usize] = node;
                    n
                }
                None => {
                    self.nodes.push(node);
                    u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 cached blocks")
                }
            };
            self.map.insert(hash, n);
            if self.publish {
                self.events.push(KvEvent::Stored {
                    block: hash,
                    parent: i.checked_sub(1).map(|p| blocks[p]),
                });
            }
        }
    }

    /// A sequence that held `blocks[..to]` leaves the running set: its references go, last
    /// block first, and the blocks nobody else holds become the most recently used evictable
    /// ones. The caller then calls [`Self::evict_to`] with the room the engine has.
    pub(crate) fn release(&mut self, blocks: &[u64], to: usize) {
        for &hash in blocks[..to].iter().rev() {
            let n = *self
                .map
                .get(&hash)
                .expect("a held block stays in the cache");
            let node = &mut self.nodes[n as usize];
            debug_assert!(node.refs > 0, "released a block nobody holds");
            node.refs -= 1;
            if node.refs == 0 {
                self.push_front(n);
                self.evictable += 1;
            }
        }
    }

    /// Evicts least recently used evictable blocks until at most `limit` remain.
    pub(crate) fn evict_to(&mut self, limit: usize) {
        while self.evictable > limit {
            let n = self.tail;
            self.unlink(n);
            self.evictable -= 1;
            let hash = self.nodes[n as usize].hash;
            self.map.remove(&hash);
            self.spare.push(n);
            if self.publish {
                self.events.push(KvEvent::Removed { block: hash });
            }
        }
    }

    fn unlink(&mut self, n: u32) {
        let Node { prev, next, .. } = self.nodes[n as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, n: u32) {
        self.nodes[n as usize].prev = NIL;
        self.nodes[n as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = n;
        }
        self.head = n;
        if self.tail == NIL {
            self.tail = n;
        }
    }

    /// Evictable blocks from least to most recently used (tests).
    #[cfg(test)]
    fn lru_order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut n = self.tail;
        while n != NIL {
            out.push(self.nodes[n as usize].hash);
            n = self.nodes[n as usize].prev;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(c: &mut PrefixCache) -> Vec<KvEvent> {
        let mut out = Vec::new();
        c.drain_events(&mut out);
        out
    }

    #[test]
    fn held_blocks_are_hits_and_never_evicted() {
        let mut c = PrefixCache::new(8);
        c.hold(&[1, 2, 3], 0, 3);
        assert_eq!(c.leading_hits(&[1, 2, 3, 4]), 3);
        assert_eq!(c.evictable(), 0);
        c.evict_to(0);
        assert_eq!(c.len(), 3, "held blocks survive any eviction");
        c.release(&[1, 2, 3], 3);
        assert_eq!(c.evictable(), 3);
        c.evict_to(0);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn release_frees_the_tail_first_and_eviction_is_lru() {
        let mut c = PrefixCache::new(8);
        c.hold(&[1, 2, 3], 0, 3);
        c.release(&[1, 2, 3], 3);
        // released last to first: the head block is the most recently used
        assert_eq!(c.lru_order(), vec![3, 2, 1]);
        c.hold(&[7], 0, 1);
        c.release(&[7], 1);
        assert_eq!(c.lru_order(), vec![3, 2, 1, 7]);
        c.evict_to(2);
        assert_eq!(c.lru_order(), vec![1, 7]);
        assert_eq!(c.leading_hits(&[1, 2]), 1);
    }

    #[test]
    fn a_hit_takes_the_block_out_of_the_lru_until_released_again() {
        let mut c = PrefixCache::new(8);
        c.hold(&[1, 2], 0, 2);
        c.release(&[1, 2], 2);
        c.hold(&[5], 0, 1);
        c.release(&[5], 1);
        assert_eq!(c.lru_order(), vec![2, 1, 5]);
        // a sequence starts on [1]: the block is held, out of eviction's reach
        c.hold(&[1], 0, 1);
        assert_eq!(c.lru_order(), vec![2, 5]);
        c.evict_to(0);
        assert_eq!(c.len(), 1);
        assert_eq!(c.leading_hits(&[1, 2]), 1);
        // released, it is the most recently used
        c.release(&[1], 1);
        assert_eq!(c.lru_order(), vec![1]);
    }

    #[test]
    fn shared_blocks_become_evictable_when_the_last_holder_leaves() {
        let mut c = PrefixCache::new(8);
        c.hold(&[1, 2], 0, 2);
        c.hold(&[1, 2, 3], 0, 3);
        c.release(&[1, 2], 2);
        assert_eq!(c.evictable(), 0, "still held by the second sequence");
        c.release(&[1, 2, 3], 3);
        assert_eq!(c.evictable(), 3);
    }

    #[test]
    fn nodes_are_recycled() {
        let mut c = PrefixCache::new(4);
        for i in 0..1_000u64 {
            c.hold(&[i, i + 10_000], 0, 2);
            c.release(&[i, i + 10_000], 2);
            c.evict_to(4);
        }
        assert_eq!(c.len(), 4);
        assert!(c.nodes.len() <= 6, "node slab grew to {}", c.nodes.len());
    }

    #[test]
    fn events_are_recorded_only_when_asked() {
        let mut c = PrefixCache::new(4);
        c.hold(&[1, 2], 0, 2);
        assert!(!c.has_events());
        c.set_publish(true);
        // already cached: no event; new blocks: stored with their parent
        c.hold(&[1, 2, 3], 0, 3);
        assert_eq!(
            published(&mut c),
            vec![KvEvent::Stored {
                block: 3,
                parent: Some(2)
            }]
        );
        c.hold(&[9], 0, 1);
        c.release(&[9], 1);
        c.evict_to(0);
        assert_eq!(
            published(&mut c),
            vec![
                KvEvent::Stored {
                    block: 9,
                    parent: None
                },
                KvEvent::Removed { block: 9 }
            ]
        );
        c.clear();
        assert_eq!(published(&mut c), vec![KvEvent::AllCleared]);
        assert_eq!(c.len(), 0);
    }
}
