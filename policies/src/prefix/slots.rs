//! The table's storage: 16-byte slots packing a key, its worker and the CLOCK/ring metadata,
//! and the pools (one CLOCK ring each) entries are charged to.

/// Key stored for a block hash of 0 (0 marks an empty slot).
pub(super) const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Bits of [`Slot::meta`] holding the entry's place in its pool's ring.
pub(super) const PLACE_BITS: u32 = 26;
pub(super) const PLACE_MASK: u32 = (1 << PLACE_BITS) - 1;
/// Most entries one pool holds: a ring place must fit in [`PLACE_BITS`] (the policy's
/// `index_blocks` stops at 2^26, a worker's cache at [`crate::worker::MAX_CACHE_BLOCKS`]).
pub(super) const MAX_POOL_ENTRIES: usize = 1 << PLACE_BITS;
pub(super) const WEIGHT_SHIFT: u32 = PLACE_BITS;
pub(super) const WEIGHT_MASK: u32 = 0xF;
/// Set on the blocks of the prompt a worker's own ring is recording, for that record only:
/// the sweep that makes room for the prompt's new blocks must not take the prompt's own.
pub(super) const PINNED: u32 = 1 << 30;
pub(super) const REFERENCED: u32 = 1 << 31;

/// One table entry, 16 bytes. `meta` packs its place in its pool's ring (so a ring entry is
/// live only when the key's slot points back at it: a key taken over from a ring and later
/// recorded back into it leaves a stale entry behind, which must not evict it), the blocks it
/// credits to its worker (at most 8, see the module notes), the pin of the record in progress
/// and CLOCK's referenced bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) key: u64,
    pub(super) worker: u32,
    pub(super) meta: u32,
}

impl Slot {
    #[inline]
    pub(super) fn new(key: u64, worker: u32, place: usize, weight: u8, referenced: bool) -> Slot {
        debug_assert!(place <= PLACE_MASK as usize && u32::from(weight) <= WEIGHT_MASK);
        let mut meta = place as u32 | (u32::from(weight) << WEIGHT_SHIFT);
        if referenced {
            meta |= REFERENCED;
        }
        Slot { key, worker, meta }
    }

    #[inline]
    pub(super) fn place(&self) -> usize {
        (self.meta & PLACE_MASK) as usize
    }

    #[inline]
    pub(super) fn set_place(&mut self, place: usize) {
        self.meta = (self.meta & !PLACE_MASK) | place as u32;
    }

    /// Blocks this entry credits to its worker.
    #[inline]
    pub(super) fn weight(&self) -> u64 {
        u64::from((self.meta >> WEIGHT_SHIFT) & WEIGHT_MASK)
    }

    #[inline]
    pub(super) fn referenced(&self) -> bool {
        self.meta & REFERENCED != 0
    }

    #[inline]
    pub(super) fn set_referenced(&mut self, on: bool) {
        if on {
            self.meta |= REFERENCED;
        } else {
            self.meta &= !REFERENCED;
        }
    }

    #[inline]
    pub(super) fn pinned(&self) -> bool {
        self.meta & PINNED != 0
    }

    #[inline]
    pub(super) fn set_pinned(&mut self, on: bool) {
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
pub(super) struct Slots(Vec<[u64; 2]>);

impl Slots {
    /// `n` empty slots.
    pub(super) fn zeroed(n: usize) -> Slots {
        Slots(vec![[0; 2]; n])
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key of slot `i` (0: empty).
    #[inline]
    pub(super) fn key(&self, i: usize) -> u64 {
        self.0[i][0]
    }

    #[inline]
    pub(super) fn get(&self, i: usize) -> Slot {
        let [key, rest] = self.0[i];
        Slot {
            key,
            worker: rest as u32,
            meta: (rest >> 32) as u32,
        }
    }

    #[inline]
    pub(super) fn set(&mut self, i: usize, s: Slot) {
        self.0[i] = [s.key, u64::from(s.worker) | (u64::from(s.meta) << 32)];
    }

    /// Empty slot `i`.
    #[inline]
    pub(super) fn clear(&mut self, i: usize) {
        self.0[i] = [0; 2];
    }
}

/// One CLOCK: a ring of keys in insertion order swept by a hand.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    pub(super) ring: Vec<u64>,
    pub(super) hand: usize,
    /// Most keys the ring holds.
    pub(super) entries: usize,
    /// Most blocks its one worker may be credited with (`None`: a shared pool, bounded by
    /// entries only).
    pub(super) bound: Option<u64>,
}

impl Pool {
    pub(super) fn new(entries: usize, bound: Option<u64>) -> Pool {
        let entries = entries.min(MAX_POOL_ENTRIES);
        Pool {
            ring: Vec::with_capacity(entries),
            hand: 0,
            entries,
            bound,
        }
    }
}
