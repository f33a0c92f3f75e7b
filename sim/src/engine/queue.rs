//! The event queue: a min-heap of events keyed by `(time, sequence number)`.
//!
//! Simulated time is an integer ([`Time`], nanoseconds), so "the same time" is exact. The
//! sequence number is assigned when an event is scheduled, so events due at the same time pop
//! in the order they were scheduled — the order they were caused — never in heap, hash-map or
//! thread order. This is what makes a run reproducible.

use routelab_policies::Time;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// An event scheduled at a time, with its tie-breaking sequence number.
#[derive(Debug, Clone, Copy)]
struct Scheduled<E> {
    at: Time,
    seq: u64,
    ev: E,
}

// Ordered by (time, sequence) only: sequence numbers are unique, so the event itself never
// takes part in the order (and needs no `Ord`).
impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Scheduled<E> {}

impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Events in `(time, scheduling order)` order.
#[derive(Debug, Clone)]
pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Scheduled<E>>>,
    seq: u64,
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub(crate) fn new() -> EventQueue<E> {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Schedule `ev` at `at`; after every event already scheduled at the same time.
    #[inline]
    pub(crate) fn push(&mut self, at: Time, ev: E) {
        self.seq += 1;
        self.heap.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            ev,
        }));
    }

    /// The earliest event (the first scheduled among equal times) and its time.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Time, E)> {
        self.heap.pop().map(|Reverse(s)| (s.at, s.ev))
    }

    /// Number of queued events.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ns: u64) -> Time {
        Time::from_nanos(ns)
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

    proptest! {
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
