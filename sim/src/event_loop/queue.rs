//! The event queue: events keyed by `(time, sequence number)` — free-standing ones in a 4-ary
//! min-heap, each worker's wake-up in one slot of a tournament tree.
//!
//! Simulated time is an integer ([`Time`], nanoseconds), so "the same time" is exact. The
//! sequence number is assigned when an event is scheduled, so events due at the same time pop
//! in the order they were scheduled — the order they were caused — never in heap, hash-map or
//! thread order. This is what makes a run reproducible.

use routelab_policies::Time;

/// Children per node. A 4-ary heap is half as deep as a binary one, and the least of four keys
/// is found without data-dependent branches; the run's queue holds about one entry per worker,
/// so its cost is the branch mispredictions of the sift, not memory.
const ARITY: usize = 4;

/// The heap key of an event: its time in the high 64 bits, its sequence number in the low 64,
/// so one integer comparison orders by time, then by scheduling order.
#[inline]
fn key(at: Time, seq: u64) -> u128 {
    (u128::from(at.as_nanos()) << 64) | u128::from(seq)
}

/// Events in `(time, scheduling order)` order.
///
/// Ordered by [`key`]s, kept apart from the events so that comparisons read densely packed
/// integers, in two parts: a min-heap of free-standing events ([`EventQueue::push`]) and a
/// tournament tree of events that belong to a *slot*, at most one per slot
/// ([`EventQueue::schedule_slot`]; the engine's slots are its workers' wake-ups). A slot's
/// event that is rescheduled is replaced in place instead of being left behind as a stale
/// entry. Keys are unique, so the order in which events pop does not depend on either
/// structure's shape.
#[derive(Debug, Clone)]
pub(crate) struct EventQueue<E> {
    keys: Vec<u128>,
    events: Vec<E>,
    slotted: SlotTree<E>,
    seq: u64,
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue.
    pub(crate) fn new() -> EventQueue<E> {
        EventQueue {
            keys: Vec::new(),
            events: Vec::new(),
            slotted: SlotTree::new(),
            seq: 0,
        }
    }

    /// The key of an event scheduled now at `at`: after every event already scheduled.
    #[inline]
    fn next_key(&mut self, at: Time) -> u128 {
        self.seq += 1;
        key(at, self.seq)
    }

    /// Schedule `ev` at `at`; after every event already scheduled at the same time.
    #[inline]
    pub(crate) fn push(&mut self, at: Time, ev: E) {
        let k = self.next_key(at);
        let mut hole = self.keys.len();
        self.keys.push(k);
        self.events.push(ev);
        while hole > 0 {
            let parent = (hole - 1) / ARITY;
            if self.keys[parent] <= k {
                break;
            }
            self.keys[hole] = self.keys[parent];
            self.events[hole] = self.events[parent];
            hole = parent;
        }
        self.keys[hole] = k;
        self.events[hole] = ev;
    }

    /// Schedule `ev` at `at` as slot `slot`'s event (ordered like [`EventQueue::push`]),
    /// replacing the slot's queued event, whose time is returned: that event will not pop.
    #[inline]
    pub(crate) fn schedule_slot(&mut self, slot: u32, at: Time, ev: E) -> Option<Time> {
        let k = self.next_key(at);
        self.slotted
            .set(slot, k, ev)
            .map(|old| Time::from_nanos((old >> 64) as u64))
    }

    /// The earliest event (the first scheduled among equal times) and its time.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Time, E)> {
        let (k, ev) = match self.slotted.first_key() {
            Some(slotted) if self.keys.first().is_none_or(|&free| slotted < free) => {
                self.slotted.pop_first()?
            }
            _ => self.pop_free()?,
        };
        Some((Time::from_nanos((k >> 64) as u64), ev))
    }

    /// The earliest free-standing event, with its key.
    #[inline]
    fn pop_free(&mut self) -> Option<(u128, E)> {
        let (&top_key, &top_ev) = (self.keys.first()?, self.events.first()?);
        let (last_key, last_ev) = (self.keys.pop()?, self.events.pop()?);
        let n = self.keys.len();
        if n > 0 {
            // Move the last entry into the root's hole and down below every smaller child.
            let mut hole = 0;
            loop {
                let first = hole * ARITY + 1;
                if first >= n {
                    break;
                }
                let mut least = first;
                let mut least_key = self.keys[first];
                for c in first + 1..(first + ARITY).min(n) {
                    let k = self.keys[c];
                    if k < least_key {
                        least = c;
                        least_key = k;
                    }
                }
                if least_key >= last_key {
                    break;
                }
                self.keys[hole] = least_key;
                self.events[hole] = self.events[least];
                hole = least;
            }
            self.keys[hole] = last_key;
            self.events[hole] = last_ev;
        }
        Some((top_key, top_ev))
    }

    /// Number of queued events.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len() + self.slotted.len()
    }
}

/// The key of a slot with no queued event: above every real key (a sequence number never
/// reaches `u64::MAX`).
const ABSENT: u128 = u128::MAX;

/// A node of the [`SlotTree`]: the least key below it and the slot that holds it.
#[derive(Debug, Clone, Copy)]
struct Node {
    key: u128,
    slot: u32,
}

impl Node {
    /// The winner of `self` against `other`: `other` only if its key is less. Selected by
    /// arithmetic rather than a branch, since which side wins is as good as random.
    #[inline]
    fn against(self, other: Node) -> Node {
        let other_wins = u128::from(other.key < self.key).wrapping_neg();
        Node {
            key: self.key ^ ((self.key ^ other.key) & other_wins),
            slot: self.slot ^ ((self.slot ^ other.slot) & other_wins as u32),
        }
    }
}

/// At most one event per slot, in a tournament tree: each node holds the least key below it
/// and its slot, so the earliest event is at the root, and changing one slot's key replays
/// only its path towards the root, each match reading one stored sibling. A replay stops as
/// soon as the path's winners no longer change: a key that moved earlier climbs only while it
/// beats the node's winner, one that moved later only while its slot was the node's winner.
///
/// Popping the root leaves its path to be replayed by the next change ([`SlotTree::stale`]):
/// the engine reschedules the worker it just woke at once, so its pop and its new wake-up cost
/// one replay between them (of the whole path, which the popped slot won at every node).
#[derive(Debug, Clone)]
struct SlotTree<E> {
    /// The tree: node `n`'s children are `2n` and `2n + 1`, node 1 is the root, and the
    /// leaves `leaves + s` hold slot `s`'s own key ([`ABSENT`] when it has no event).
    nodes: Vec<Node>,
    events: Vec<Option<E>>,
    /// Number of leaves (a power of two, ≥ the number of slots).
    leaves: usize,
    /// A popped slot whose path still holds the key it was popped with (its leaf is already
    /// [`ABSENT`]).
    stale: Option<usize>,
}

impl<E: Copy> SlotTree<E> {
    fn new() -> Self {
        SlotTree {
            nodes: Vec::new(),
            events: Vec::new(),
            leaves: 0,
            stale: None,
        }
    }

    /// The earliest key (after replaying a pending path).
    #[inline]
    fn first_key(&mut self) -> Option<u128> {
        if let Some(s) = self.stale.take() {
            self.replay_won_path(s, ABSENT);
        }
        let k = self.nodes.get(1)?.key;
        (k != ABSENT).then_some(k)
    }

    /// Number of queued events.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes[self.leaves..]
            .iter()
            .filter(|n| n.key != ABSENT)
            .count()
    }

    /// Room for slot `slot`: the leaves doubled until it fits, and the tree rebuilt.
    #[cold]
    fn grow(&mut self, slot: usize) {
        let leaves = (slot + 1).next_power_of_two().max(2);
        let absent = Node {
            key: ABSENT,
            slot: 0,
        };
        let mut nodes = vec![absent; 2 * leaves];
        for s in 0..leaves {
            let key = if s < self.leaves {
                self.nodes[self.leaves + s].key
            } else {
                ABSENT
            };
            nodes[leaves + s] = Node {
                key,
                slot: s as u32,
            };
        }
        for n in (1..leaves).rev() {
            let (a, b) = (nodes[2 * n], nodes[2 * n + 1]);
            nodes[n] = if b.key < a.key { b } else { a };
        }
        self.nodes = nodes;
        self.events.resize(leaves, None);
        self.leaves = leaves;
        // Every path is replayed.
        self.stale = None;
    }

    /// Slot `slot`'s key moved earlier, to `k` (its leaf already holds it): it takes over
    /// every node on its path whose winner it now beats — a run from the leaf up, since a
    /// node's key is never above its children's.
    #[inline]
    fn climb_earlier(&mut self, slot: usize, k: u128) {
        let mut n = (self.leaves + slot) / 2;
        while n > 0 && k < self.nodes[n].key {
            self.nodes[n] = Node {
                key: k,
                slot: slot as u32,
            };
            n /= 2;
        }
    }

    /// Slot `slot`'s key moved later, to `k` (its leaf holding `k` or [`ABSENT`]): the nodes it
    /// won — a run from the leaf up — are replayed against their other child, the winner
    /// carried up from below (a slot that did not win a node cannot win its parents).
    #[inline]
    fn climb_later(&mut self, slot: usize, k: u128) {
        let mut cur = Node {
            key: k,
            slot: slot as u32,
        };
        let mut n = self.leaves + slot;
        while n > 1 && self.nodes[n / 2].slot == slot as u32 {
            cur = cur.against(self.nodes[n ^ 1]);
            n /= 2;
            self.nodes[n] = cur;
        }
    }

    /// Slot `slot`, the winner of its whole path (the slot just popped), is keyed `k`: every
    /// node up to the root is replayed against its other child, without
    /// [`SlotTree::climb_later`]'s test of whether the slot won it.
    #[inline]
    fn replay_won_path(&mut self, slot: usize, k: u128) {
        let mut cur = Node {
            key: k,
            slot: slot as u32,
        };
        let nodes = &mut self.nodes[..];
        // The tree has `2 * leaves` nodes, a power of two, so masking an index with one less
        // changes no index on the path, and lets the compiler prove every index in bounds.
        let mask = nodes.len().max(1) - 1;
        let mut n = self.leaves + slot;
        while n > 1 {
            cur = cur.against(nodes[(n ^ 1) & mask]);
            n /= 2;
            nodes[n & mask] = cur;
        }
    }

    /// Key slot `slot`'s event `ev` with `k`, replacing (and returning the key of) its queued
    /// one. (Kept out of line: inlined into the engine's `reschedule` it ran more instructions,
    /// the caller's registers spilled around it.)
    #[inline(never)]
    fn set(&mut self, slot: u32, k: u128, ev: E) -> Option<u128> {
        let s = slot as usize;
        if s >= self.leaves {
            self.grow(s);
        }
        let leaf = self.leaves + s;
        let old = std::mem::replace(&mut self.nodes[leaf].key, k);
        self.events[s] = Some(ev);
        match self.stale.take() {
            // Its whole path still names it (with the key it was popped with): replayed with
            // `k`, whichever side of that key `k` is.
            Some(p) if p == s => self.replay_won_path(s, k),
            stale => {
                if let Some(p) = stale {
                    self.replay_won_path(p, ABSENT);
                }
                if k < old {
                    self.climb_earlier(s, k);
                } else {
                    self.climb_later(s, k);
                }
            }
        }
        (old != ABSENT).then_some(old)
    }

    /// The earliest event, removed from its slot; right after [`SlotTree::first_key`] said
    /// there is one (no path is pending).
    fn pop_first(&mut self) -> Option<(u128, E)> {
        let Node { key: k, slot } = self.nodes[1];
        let s = slot as usize;
        self.nodes[self.leaves + s].key = ABSENT;
        self.stale = Some(s);
        let ev = self.events[s].take()?;
        Some((k, ev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ns: u64) -> Time {
        Time::from_nanos(ns)
    }

    /// Schedules `seq` at `at` as slot `slot`'s event in `q`, and in the list model, where the
    /// slot is tagged `tag`: the time replaced must be the model's entry for that tag.
    fn reschedule_both<S: PartialEq + Copy>(
        q: &mut EventQueue<u64>,
        model: &mut Vec<(Time, u64, S)>,
        (slot, tag): (u32, S),
        at: Time,
        seq: u64,
    ) -> Result<(), TestCaseError> {
        let old = model
            .iter()
            .position(|e| e.2 == tag)
            .map(|i| model.remove(i).0);
        prop_assert_eq!(q.schedule_slot(slot, at, seq), old);
        model.push((at, seq, tag));
        Ok(())
    }

    /// What is left in `q` pops in the model's (time, sequence) order.
    fn drains_like<S: Ord>(
        q: &mut EventQueue<u64>,
        mut model: Vec<(Time, u64, S)>,
    ) -> Result<(), TestCaseError> {
        model.sort_unstable();
        let rest: Vec<(Time, u64)> = std::iter::from_fn(|| q.pop()).collect();
        let want: Vec<(Time, u64)> = model.iter().map(|&(t, s, _)| (t, s)).collect();
        prop_assert_eq!(rest, want);
        Ok(())
    }

    #[test]
    fn pops_in_time_order() {
        let mut q = EventQueue::new();
        q.push(t(30), 'c');
        q.push(t(10), 'a');
        q.push(t(20), 'b');
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some((t(10), 'a')));
        assert_eq!(q.pop(), Some((t(20), 'b')));
        assert_eq!(q.pop(), Some((t(30), 'c')));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn equal_times_pop_in_scheduling_order() {
        let mut q = EventQueue::new();
        // Pushed in an order a heap keyed on the payload would reverse.
        for ev in [9, 3, 7, 1, 5] {
            q.push(t(100), ev);
        }
        q.push(t(50), 0);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            popped,
            vec![
                (t(50), 0),
                (t(100), 9),
                (t(100), 3),
                (t(100), 7),
                (t(100), 1),
                (t(100), 5)
            ]
        );
    }

    #[test]
    fn an_event_scheduled_while_popping_runs_after_its_equals() {
        let mut q = EventQueue::new();
        q.push(t(5), "first");
        q.push(t(5), "second");
        assert_eq!(q.pop(), Some((t(5), "first")));
        // Caused by "first", due at the same time: after "second", which was already due.
        q.push(t(5), "caused");
        assert_eq!(q.pop(), Some((t(5), "second")));
        assert_eq!(q.pop(), Some((t(5), "caused")));
    }

    #[test]
    fn the_whole_time_range_orders_by_time_first() {
        let mut q = EventQueue::new();
        // The sequence number never outweighs a time difference, even of one nanosecond at
        // the ends of the range.
        q.push(t(u64::MAX), "last");
        q.push(t(1), "one");
        q.push(t(u64::MAX - 1), "before last");
        q.push(t(0), "zero");
        q.push(t(u64::MAX), "last again");
        let popped: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            popped,
            vec![
                (t(0), "zero"),
                (t(1), "one"),
                (t(u64::MAX - 1), "before last"),
                (t(u64::MAX), "last"),
                (t(u64::MAX), "last again"),
            ]
        );
    }

    #[test]
    fn a_rescheduled_slot_event_replaces_its_queued_one() {
        let mut q = EventQueue::new();
        assert_eq!(q.schedule_slot(0, t(50), "w0 late"), None);
        q.push(t(40), "free");
        assert_eq!(q.schedule_slot(1, t(45), "w1"), None);
        // Earlier: the late one is replaced (and its time reported), not left behind.
        assert_eq!(q.schedule_slot(0, t(40), "w0 early"), Some(t(50)));
        assert_eq!(q.len(), 3);
        // Equal times pop in scheduling order across free and slotted events.
        assert_eq!(q.pop(), Some((t(40), "free")));
        assert_eq!(q.pop(), Some((t(40), "w0 early")));
        // A popped slot is empty again: scheduling it replaces nothing.
        assert_eq!(q.schedule_slot(0, t(70), "w0 again"), None);
        // Later: re-keyed downwards.
        assert_eq!(q.schedule_slot(1, t(80), "w1 later"), Some(t(45)));
        assert_eq!(q.pop(), Some((t(70), "w0 again")));
        assert_eq!(q.pop(), Some((t(80), "w1 later")));
        assert_eq!(q.pop(), None);
    }

    proptest! {
        /// Free and slotted events interleaved with pops: every pop is the least queued
        /// (time, sequence number) among the free events and each slot's latest event, checked
        /// against a plain list model, and rescheduling a slot reports the time it replaced.
        #[test]
        fn slots_keep_one_event_each(
            ops in proptest::collection::vec((0u64..30, 0u8..6), 1..400)
        ) {
            let mut q = EventQueue::new();
            // (time, seq, slot or none)
            let mut model: Vec<(Time, u64, Option<u32>)> = Vec::new();
            let mut seq = 0u64;
            for (at, op) in ops {
                match op {
                    0 | 1 => {
                        model.sort_unstable();
                        let want = (!model.is_empty()).then(|| model.remove(0));
                        prop_assert_eq!(q.pop(), want.map(|(t, s, _)| (t, s)));
                    }
                    2 => {
                        seq += 1;
                        q.push(t(at), seq);
                        model.push((t(at), seq, None));
                    }
                    slot => {
                        let slot = u32::from(slot - 3);
                        seq += 1;
                        reschedule_both(&mut q, &mut model, (slot, Some(slot)), t(at), seq)?;
                    }
                }
                prop_assert_eq!(q.len(), model.len());
            }
            drains_like(&mut q, model)?;
        }

        /// Many slots (the tree grows and is deep), each pop mostly followed by rescheduling the
        /// popped slot later (as the engine does after a wake-up), and other slots rescheduled
        /// earlier or later: every pop matches a plain list model, as does what each
        /// rescheduling replaced.
        #[test]
        fn slot_tree_replays_match_a_list(
            ops in proptest::collection::vec((0u64..1000, 0u8..8, 0u32..40), 1..600)
        ) {
            let mut q = EventQueue::new();
            let mut model: Vec<(Time, u64, u32)> = Vec::new();
            let mut seq = 0u64;
            let mut now = 0u64;
            for (dt, op, slot) in ops {
                match op {
                    0 | 1 => {
                        model.sort_unstable();
                        let want = (!model.is_empty()).then(|| model.remove(0));
                        prop_assert_eq!(q.pop(), want.map(|(t, s, _)| (t, s)));
                        if let Some((at, _, popped)) = want {
                            now = at.as_nanos();
                            if op == 0 {
                                // The woken slot's next wake-up, never earlier than now.
                                seq += 1;
                                prop_assert_eq!(q.schedule_slot(popped, t(now + dt), seq), None);
                                model.push((t(now + dt), seq, popped));
                            }
                        }
                    }
                    _ => {
                        seq += 1;
                        reschedule_both(&mut q, &mut model, (slot, slot), t(now + dt), seq)?;
                    }
                }
                prop_assert_eq!(q.len(), model.len());
            }
            drains_like(&mut q, model)?;
        }

        /// Whatever is pushed, and however pushes and pops interleave, every pop is the least
        /// queued (time, sequence number) — checked against a plain sorted-list model — and the
        /// events drained at the end come out sorted by (time, sequence).
        #[test]
        fn pops_are_sorted_by_time_then_sequence(
            ops in proptest::collection::vec((0u64..20, any::<bool>()), 1..300)
        ) {
            let mut q = EventQueue::new();
            let mut model: Vec<(Time, u64)> = Vec::new();
            let mut seq = 0u64;
            for (at, pop) in ops {
                if pop {
                    model.sort_unstable();
                    let want = (!model.is_empty()).then(|| model.remove(0));
                    prop_assert_eq!(q.pop(), want);
                } else {
                    seq += 1;
                    // The payload is the sequence number the queue gives it.
                    q.push(t(at), seq);
                    model.push((t(at), seq));
                }
            }
            let rest: Vec<(Time, u64)> = std::iter::from_fn(|| q.pop()).collect();
            prop_assert_eq!(rest.len(), model.len());
            prop_assert!(rest.windows(2).all(|w| w[0] < w[1]), "sorted by (time, seq)");
        }
    }
}
