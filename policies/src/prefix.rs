//! The router's own, bounded record of which worker recently served which prompt prefix.
//!
//! Keys are prefix-block hashes: hash `i` of a request identifies its whole prompt prefix up to
//! and including block `i` (a chain hash), so equal hashes mean equal prefixes. The map is an
//! LRU over blocks with a fixed capacity allocated up front: recording and looking up never
//! allocate. It is an approximation of the engines' caches — it forgets by its own LRU, not by
//! theirs — and the simulator measures how far it is from the truth.

use crate::worker::WorkerId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block hashes are already well mixed; one multiply spreads any that are not.
#[derive(Default, Clone, Copy)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: u64,
    worker: WorkerId,
    prev: u32,
    next: u32,
}

/// Bounded LRU map from prefix-block hash to the worker that last served it.
#[derive(Clone)]
pub struct PrefixIndex {
    map: HashMap<u64, u32, BuildHasherDefault<BlockHasher>>,
    nodes: Vec<Node>,
    head: u32, // most recent
    tail: u32, // least recent
    capacity: usize,
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("len", &self.nodes.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl PrefixIndex {
    /// An index remembering at most `capacity` blocks (0 disables it).
    pub fn new(capacity: usize) -> Self {
        PrefixIndex {
            // Twice the entries: evictions leave tombstones in the (SwissTable) map, and when
            // they use up its spare room it rehashes — in place only while it is at most half
            // full, otherwise by allocating a table twice the size, on the request path (a
            // 4 MB allocation and a full rehash for the default 65,536 blocks). At 2x the map
            // is never more than half full, so it never grows after construction.
            map: HashMap::with_capacity_and_hasher(
                capacity.saturating_mul(2),
                BuildHasherDefault::default(),
            ),
            nodes: Vec::with_capacity(capacity),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Most blocks it will remember.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The worker that last served the longest remembered prefix of `blocks`, and how many
    /// leading blocks that prefix has.
    ///
    /// Recording touches a request's blocks deepest-first, so a remembered block's ancestors are
    /// always more recent than it and evicted later: the remembered blocks of any prompt form a
    /// prefix, which makes a binary search exact.
    pub fn longest(&self, blocks: &[u64]) -> Option<(WorkerId, usize)> {
        if blocks.is_empty() || self.nodes.is_empty() {
            return None;
        }
        let (mut lo, mut hi) = (0usize, blocks.len()); // blocks[..lo] known present
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.map.get(&blocks[mid]) {
                Some(&idx) => {
                    found = Some((self.nodes[idx as usize].worker, mid + 1));
                    lo = mid + 1;
                }
                None => hi = mid,
            }
        }
        found
    }

    /// Remember that `worker` now holds every block of `blocks`.
    pub fn record(&mut self, blocks: &[u64], worker: WorkerId) {
        if self.capacity == 0 {
            return;
        }
        for &key in blocks.iter().rev() {
            match self.map.get(&key) {
                Some(&idx) => {
                    self.nodes[idx as usize].worker = worker;
                    self.move_to_front(idx);
                }
                None => {
                    let idx = if self.nodes.len() < self.capacity {
                        self.nodes.push(Node {
                            key,
                            worker,
                            prev: NIL,
                            next: NIL,
                        });
                        (self.nodes.len() - 1) as u32
                    } else {
                        let idx = self.tail;
                        self.unlink(idx);
                        let old = self.nodes[idx as usize].key;
                        self.map.remove(&old);
                        self.nodes[idx as usize].key = key;
                        self.nodes[idx as usize].worker = worker;
                        idx
                    };
                    self.map.insert(key, idx);
                    self.push_front(idx);
                }
            }
        }
    }

    /// Forget every block held by `worker` (its engine restarted or crashed).
    pub fn forget_worker(&mut self, worker: WorkerId) {
        // Rare: rebuild without the worker's blocks, keeping recency order.
        let mut order = Vec::with_capacity(self.nodes.len());
        let mut cur = self.tail;
        while cur != NIL {
            let n = self.nodes[cur as usize];
            if n.worker != worker {
                order.push((n.key, n.worker));
            }
            cur = n.prev;
        }
        self.map.clear();
        self.nodes.clear();
        self.head = NIL;
        self.tail = NIL;
        for (key, w) in order {
            self.nodes.push(Node {
                key,
                worker: w,
                prev: NIL,
                next: NIL,
            });
            let idx = (self.nodes.len() - 1) as u32;
            self.map.insert(key, idx);
            self.push_front(idx);
        }
    }

    fn unlink(&mut self, idx: u32) {
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, idx: u32) {
        self.nodes[idx as usize].prev = NIL;
        self.nodes[idx as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = idx;
        }
        self.head = idx;
        if self.tail == NIL {
            self.tail = idx;
        }
    }

    fn move_to_front(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.push_front(idx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_and_eviction_keep_prefixes_closed() {
        let mut p = PrefixIndex::new(4);
        p.record(&[1, 2, 3], WorkerId(7));
        assert_eq!(p.longest(&[1, 2, 3, 4]), Some((WorkerId(7), 3)));
        assert_eq!(p.longest(&[1, 9]), Some((WorkerId(7), 1)));
        assert_eq!(p.longest(&[9]), None);
        // Two more blocks evict the deepest, least recent ones first.
        p.record(&[10, 11], WorkerId(2));
        assert_eq!(p.len(), 4);
        assert_eq!(p.longest(&[1, 2, 3]), Some((WorkerId(7), 2)));
        assert_eq!(p.longest(&[10, 11]), Some((WorkerId(2), 2)));
        p.forget_worker(WorkerId(2));
        assert_eq!(p.longest(&[10, 11]), None);
        assert_eq!(p.longest(&[1, 2]), Some((WorkerId(7), 2)));
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut p = PrefixIndex::new(0);
        p.record(&[1, 2], WorkerId(0));
        assert!(p.is_empty());
        assert_eq!(p.longest(&[1]), None);
    }
}
