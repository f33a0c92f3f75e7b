//! The prefix affinity's freest candidate without a scan of the fleet.
//!
//! The affinity rule keeps a prefix holder unless it is much busier than the *freest* eligible
//! candidate: the least affinity load ([`affinity_load`]) among a model's routable members whose
//! context window holds the request and which are below their cap. The members are sorted by
//! context window, largest first, so the eligible ones are always a prefix `members[..k]`, and
//! the freest load is a prefix minimum. [`LoadIndex`] is a min segment tree over the members'
//! loads (a full worker counts as +∞, the identity of the minimum, exactly as the scan skips
//! it): a query and an update each cost O(log n).
//!
//! The result is exact, not an approximation: the minimum of a set of floating-point numbers
//! that holds no NaN and no negative zero (a load is a non-negative count divided by a positive,
//! finite weight) is the same number whatever the order of comparison, so the tree answers
//! bit for bit what `fold(f64::INFINITY, f64::min)` over the candidates answered.

use crate::chooser::Hot;
use crate::config::AffinityUnits;

/// A worker's load as the affinity rule compares it, or +∞ when it is at its cap (the scan's
/// filter: a full worker is never the freest candidate).
#[inline]
pub(crate) fn affinity_load(h: &Hot, units: AffinityUnits) -> f64 {
    if !h.open() {
        return f64::INFINITY;
    }
    match units {
        AffinityUnits::Raw => f64::from(h.in_flight),
        AffinityUnits::Capacity => f64::from(h.in_flight) / h.weight,
    }
}

/// A min segment tree over one model's members, in `members` order. It goes stale when the
/// members change (positions shift) or every weight changes at once, and is rebuilt by the next
/// query: a registration costs no rebuild of its own, and a burst of registrations one.
#[derive(Debug, Clone)]
pub(crate) struct LoadIndex {
    /// Leaves: the members' count rounded up to a power of two (at least 1).
    leaves: usize,
    /// `tree[leaves + i]` is member `i`'s load; `tree[j]` the minimum of its two children;
    /// `tree[0]` unused.
    tree: Vec<f64>,
    stale: bool,
}

impl Default for LoadIndex {
    fn default() -> Self {
        LoadIndex {
            leaves: 1,
            tree: Vec::new(),
            stale: true,
        }
    }
}

impl LoadIndex {
    /// The members changed, or many loads did: rebuild at the next query.
    #[inline]
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    /// True when the next query must rebuild first.
    #[inline]
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// Make room for `members` members, so a rebuild on the decision path never allocates
    /// (registration allocates anyway).
    pub fn reserve(&mut self, members: usize) {
        let want = 2 * members.next_power_of_two().max(1);
        self.tree.reserve(want.saturating_sub(self.tree.len()));
    }

    /// Rebuild from the members' loads, in `members` order.
    pub fn rebuild(&mut self, loads: impl ExactSizeIterator<Item = f64>) {
        self.leaves = loads.len().next_power_of_two().max(1);
        self.tree.clear();
        self.tree.resize(2 * self.leaves, f64::INFINITY);
        for (i, load) in loads.enumerate() {
            self.tree[self.leaves + i] = load;
        }
        for j in (1..self.leaves).rev() {
            self.tree[j] = self.tree[2 * j].min(self.tree[2 * j + 1]);
        }
        self.stale = false;
    }

    /// Member `pos`'s load is now `load` (ignored while stale: the rebuild reads it).
    #[inline]
    pub fn set(&mut self, pos: usize, load: f64) {
        if self.stale {
            return;
        }
        let mut j = self.leaves + pos;
        self.tree[j] = load;
        while j > 1 {
            j /= 2;
            let min = self.tree[2 * j].min(self.tree[2 * j + 1]);
            // Unchanged here means unchanged above.
            if min.to_bits() == self.tree[j].to_bits() {
                break;
            }
            self.tree[j] = min;
        }
    }

    /// The least load among members `0..k` (+∞ when all of them are full or `k` is 0). Must
    /// not be stale.
    #[inline]
    pub fn prefix_min(&self, k: usize) -> f64 {
        debug_assert!(!self.stale, "query of a stale load index");
        debug_assert!(k <= self.leaves);
        if k == self.leaves {
            return self.tree[1];
        }
        let (mut l, mut r) = (self.leaves, self.leaves + k);
        let mut min = f64::INFINITY;
        while l < r {
            if l & 1 == 1 {
                min = min.min(self.tree[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                min = min.min(self.tree[r]);
            }
            l /= 2;
            r /= 2;
        }
        min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(loads: &[f64], k: usize) -> f64 {
        loads[..k].iter().copied().fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn prefix_min_equals_the_scan_for_every_prefix_after_updates() {
        let mut loads: Vec<f64> = (0..37).map(|i| f64::from((i * 7919) % 23) / 3.0).collect();
        let mut index = LoadIndex::default();
        index.rebuild(loads.iter().copied());
        for step in 0..200usize {
            let pos = (step * 31) % loads.len();
            let load = if step % 5 == 0 {
                f64::INFINITY
            } else {
                f64::from(((step * 13) % 17) as u32) / 7.0
            };
            loads[pos] = load;
            index.set(pos, load);
            for k in 0..=loads.len() {
                assert_eq!(index.prefix_min(k).to_bits(), scan(&loads, k).to_bits());
            }
        }
    }

    #[test]
    fn a_stale_index_ignores_updates_until_rebuilt() {
        let mut index = LoadIndex::default();
        assert!(index.is_stale());
        index.rebuild([3.0, 1.0].into_iter());
        index.invalidate();
        index.set(1, 9.0);
        index.rebuild([3.0, 2.0, 5.0].into_iter());
        assert_eq!(index.prefix_min(3), 2.0);
        assert_eq!(index.prefix_min(1), 3.0);
        assert_eq!(index.prefix_min(0), f64::INFINITY);
    }
}
