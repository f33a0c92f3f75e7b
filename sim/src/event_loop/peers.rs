//! The replicas' dispatch stream (`share: dispatch-stream` and `route-and-reserve`): each
//! replica publishes every dispatch, first token and end of a request on a bus, and every other
//! replica applies it one bus hop later ([`PeerBus`]).
//!
//! What a message carries is what the receiving router needs to count the request as the
//! sender did: the worker, the sender's [`Charge`] (prompt tokens, the uncached part, what the
//! sender saw at dispatch), the prompt's prefix blocks at dispatch, and the completion at the
//! end (so a router that measures capacity learns from every replica's completions, not a
//! 1/N share). A message is applied to every replica but its sender in replica order, at one
//! event, so the order of events (and the run's output) depends only on the scenario and seed.
//!
//! `route-and-reserve` differs in one place: a dispatch is applied to the other replicas at
//! once (a reservation they see before their next decision), and the request reaches its
//! worker one bus round trip later, the reservation's cost.

use super::{Ev, Sim, Sink};
use crate::traffic::TrafficSource;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use routelab_policies::streams::{SPREAD_STREAM, derive_seed};
use routelab_policies::{Charge, Completion, WorkerId};

use super::replicas::{Replicas, Share};

/// What happened to a request, as the bus tells the other replicas.
#[derive(Debug)]
pub(super) enum PeerOp {
    /// Dispatched, with its prompt's prefix blocks.
    Dispatch { prefix: Vec<u64> },
    /// Its first token: the uncached prompt no longer waits.
    FirstToken,
    /// It ended: completed (with what it measured) or failed.
    Ended { completion: Option<Completion> },
}

/// One message on the bus.
#[derive(Debug)]
pub(super) struct PeerMsg {
    /// The replica that published it.
    pub(super) from: u32,
    /// The worker, by the id every replica gives it alike.
    pub(super) worker: WorkerId,
    /// The sender's charge (at the first token: the uncached tokens it releases).
    pub(super) charge: Charge,
    pub(super) op: PeerOp,
}

/// The bus between the replicas, and the messages on their way.
#[derive(Debug, Default)]
pub(super) struct PeerBus {
    /// One hop, ns; `None` when the replicas publish nothing.
    latency_ns: Option<u64>,
    /// `route-and-reserve`: dispatches are applied at once.
    reserve: bool,
    /// Messages on their way (slots reused through `free`).
    msgs: Vec<Option<PeerMsg>>,
    free: Vec<u32>,
    /// Prefix vectors of delivered messages, reused.
    spare: Vec<Vec<u64>>,
    /// A spread dispatch stream's hold window, ns (0: requests are routed on arrival).
    spread_ns: u64,
    /// The holds' draws ([`SPREAD_STREAM`]; drawn only when `spread_ns` > 0, so a run without
    /// a spread draws exactly what it drew before spreads existed).
    spread_rng: Option<Xoshiro256PlusPlus>,
}

impl PeerBus {
    /// The bus of `share`, for a run of `replicas` replicas (one replica publishes nothing,
    /// and holds nothing) from the run's root `seed`.
    pub(super) fn new(share: Share, replicas: usize, seed: u64) -> PeerBus {
        let latency_ns = share.bus_latency_ns().filter(|_| replicas > 1);
        let spread_ns = if replicas > 1 { share.spread_ns() } else { 0 };
        PeerBus {
            latency_ns,
            reserve: matches!(share, Share::RouteAndReserve { .. }),
            spread_ns,
            spread_rng: (spread_ns > 0)
                .then(|| Xoshiro256PlusPlus::seed_from_u64(derive_seed(seed, SPREAD_STREAM))),
            ..PeerBus::default()
        }
    }

    /// How long the replica receiving a request now holds it before routing it, ns: a uniform
    /// draw in `[0, spread]`, `None` without a spread.
    pub(super) fn hold_ns(&mut self) -> Option<u64> {
        let rng = self.spread_rng.as_mut()?;
        Some(rng.random_range(0..=self.spread_ns))
    }

    /// Whether the replicas publish their dispatches.
    #[inline]
    pub(super) fn enabled(&self) -> bool {
        self.latency_ns.is_some()
    }

    /// How much later than the network alone a dispatched request reaches its worker: one bus
    /// round trip under `route-and-reserve`, else nothing.
    #[inline]
    pub(super) fn dispatch_delay_ns(&self) -> u64 {
        match self.latency_ns {
            Some(l) if self.reserve => l.saturating_mul(2),
            _ => 0,
        }
    }

    /// A vector for a dispatch's prefix blocks (a reused one when there is one).
    pub(super) fn prefix_vec(&mut self, blocks: &[u64]) -> Vec<u64> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(blocks);
        v
    }

    fn park(&mut self, msg: PeerMsg) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.msgs[i as usize] = Some(msg);
                i
            }
            None => {
                self.msgs.push(Some(msg));
                (self.msgs.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, i: u32) -> Option<PeerMsg> {
        let msg = self.msgs.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(msg)
    }

    fn recycle(&mut self, msg: PeerMsg) {
        if let PeerOp::Dispatch { prefix } = msg.op {
            self.spare.push(prefix);
        }
    }
}

/// Apply a message to every replica but its sender.
fn apply(replicas: &mut Replicas, msg: &PeerMsg) {
    for (r, replica) in replicas.iter_mut().enumerate() {
        if r as u32 == msg.from {
            continue;
        }
        let router = &mut replica.router;
        match &msg.op {
            PeerOp::Dispatch { prefix } => router.remote_dispatch(msg.worker, msg.charge, prefix),
            PeerOp::FirstToken => {
                let mut charge = msg.charge;
                router.remote_first_token(msg.worker, &mut charge);
            }
            PeerOp::Ended { completion } => {
                if let Some(c) = completion {
                    router.remote_completion(msg.worker, msg.charge, c);
                }
                router.remote_release(msg.worker, msg.charge);
            }
        }
    }
}

impl Sim<'_> {
    /// Publish what replica `from` did with a request on `worker` (nothing when the replicas
    /// share no dispatches).
    pub(super) fn publish(&mut self, from: u32, worker: WorkerId, charge: Charge, op: PeerOp) {
        let Some(latency) = self.peers.latency_ns else {
            return;
        };
        let msg = PeerMsg {
            from,
            worker,
            charge,
            op,
        };
        if self.peers.reserve && matches!(msg.op, PeerOp::Dispatch { .. }) {
            apply(&mut self.replicas, &msg);
            self.peers.recycle(msg);
            return;
        }
        let i = self.peers.park(msg);
        self.push(self.after(latency), Ev::Peer { msg: i });
    }

    /// A message of the bus reaches the other replicas.
    pub(super) fn on_peer(&mut self, i: u32, traffic: &mut dyn TrafficSource, sink: Sink<'_, '_>) {
        let Some(msg) = self.peers.take(i) else {
            return;
        };
        apply(&mut self.replicas, &msg);
        let released = matches!(msg.op, PeerOp::Ended { .. });
        self.peers.recycle(msg);
        if released {
            // Fewer requests elsewhere may leave room under a cap now.
            self.drain_queue(traffic, sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dispatch_modes_publish_and_only_with_several_replicas() {
        let stream = Share::DispatchStream {
            bus_latency_ns: 1_000_000,
            spread_ns: 0,
        };
        assert!(PeerBus::new(stream, 4, 0).enabled());
        assert!(!PeerBus::new(stream, 1, 0).enabled());
        assert_eq!(PeerBus::new(stream, 4, 0).dispatch_delay_ns(), 0);
        let reserve = Share::RouteAndReserve {
            bus_latency_ns: 1_000_000,
        };
        assert_eq!(PeerBus::new(reserve, 4, 0).dispatch_delay_ns(), 2_000_000);
        for share in [
            Share::None,
            Share::Probes,
            Share::ProbesAndLoad {
                sync_interval_ns: 5,
            },
            Share::EngineTruth {
                poll_interval_ns: 5,
            },
        ] {
            assert!(!PeerBus::new(share, 4, 0).enabled(), "{share:?}");
        }
    }

    #[test]
    fn message_slots_are_reused_and_a_slot_is_taken_once() {
        let mut bus = PeerBus::new(
            Share::DispatchStream {
                bus_latency_ns: 10,
                spread_ns: 0,
            },
            2,
            0,
        );
        let msg = |from| PeerMsg {
            from,
            worker: WorkerId(0),
            charge: Charge::NONE,
            op: PeerOp::FirstToken,
        };
        let a = bus.park(msg(0));
        let b = bus.park(msg(1));
        assert_ne!(a, b);
        assert_eq!(bus.take(a).map(|m| m.from), Some(0));
        assert!(bus.take(a).is_none(), "a delivered message is gone");
        assert_eq!(bus.park(msg(1)), a, "its slot is reused");
        let v = bus.prefix_vec(&[1, 2, 3]);
        bus.recycle(PeerMsg {
            op: PeerOp::Dispatch { prefix: v },
            ..msg(0)
        });
        assert_eq!(
            bus.prefix_vec(&[9]),
            vec![9],
            "a reused vector holds only the new blocks"
        );
    }
}
