//! Several gateway replicas behind an L4 balancer: the scenario's `gateways:` block as a
//! domain type ([`Gateways`]), the balancer's split rule, and the in-flight exchange of
//! `share: probes-and-load`.
//!
//! Each replica is a [`Router`] built from the same policy with its own in-flight view and its
//! own RNG stream. Replica 0 keeps the single gateway's stream, so one replica is exactly the
//! run without a `gateways:` block; the others and the balancer draw from streams of their own
//! ([`REPLICA_STREAM`], [`SPLIT_STREAM`]).
//!
//! What is shared follows [`Share`]:
//! - `none`: every replica orders and serves its own probes (N× the probe traffic of one
//!   gateway, as independent gateways would send);
//! - `probes`: probe results are shared as a shared state file or store would share them. At
//!   most one burst per worker and phase runs at a time: a replica that orders a probe of a
//!   worker while another replica's burst of it runs waits for that burst, and every waiting
//!   replica receives its result. Replicas that register the same workers at the same time
//!   order the same probes at the same instants, so the fleet sees one burst per worker and
//!   every replica the same measurement; pins are lifecycle events and reach every replica in
//!   every mode;
//! - `probes-and-load`: as `probes`, and every `sync_interval_s` each replica learns the
//!   others' in-flight counts per worker ([`Router::set_remote_in_flight`]).

use super::fleet::Fleet;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use routelab_policies::streams::secs_to_nanos;
use routelab_policies::streams::{
    REPLICA_STREAM, ROUTER_STREAM, SPLIT_STREAM, derive_seed, splitmix64,
};
use routelab_policies::{AdminError, DEFAULT_REPLICA_SPREAD_S, Router, WorkerId};

/// The most replicas a scenario may declare.
pub const MAX_REPLICAS: u32 = 64;

/// How the L4 balancer in front of the replicas spreads requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Each request to a replica drawn uniformly at random.
    Random,
    /// A session's requests (a conversation, a closed-loop user: the traffic's tag) to one
    /// replica; a request without a session by its own id.
    HashBySession,
    /// Replicas in turn.
    RoundRobin,
}

impl Split {
    /// Every split rule: its name in a scenario, and the rule.
    pub const ALL: [(&'static str, Split); 3] = [
        ("random", Split::Random),
        ("hash-by-session", Split::HashBySession),
        ("round-robin", Split::RoundRobin),
    ];

    /// The rule of a name, if any.
    pub fn from_name(name: &str) -> Option<Split> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, s)| *s == self)
            .map_or("", |(n, _)| n)
    }
}

/// The bus latency `dispatch-stream` and `route-and-reserve` assume when a scenario gives
/// none, s: one publish-to-delivery hop of a NATS bus, the median measured here (0.19-0.22 ms
/// over three runs through a loopback `nats-server`, docs/performance.md "One hop of the bus").
/// Between hosts the network's one-way latency adds to it; a scenario states its own with
/// `gateways.bus_latency_s`.
pub const DEFAULT_BUS_LATENCY_S: f64 = 0.0002;

/// What the replicas share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Nothing: each replica probes on its own.
    None,
    /// Probe results (a shared state file or store).
    Probes,
    /// Probe results, and each replica's in-flight counts every `sync_interval_ns`.
    ProbesAndLoad {
        /// Period of the exchange, ns (> 0).
        sync_interval_ns: u64,
    },
    /// Probe results, and what every replica gets from the engines themselves: every
    /// `poll_interval_ns` each replica reads each engine's sequences (running and waiting) and
    /// counts those that are not its own as the other replicas' load; between polls it adds
    /// only its own dispatches.
    EngineTruth {
        /// Period of the engines' poll, ns (> 0).
        poll_interval_ns: u64,
    },
    /// Probe results, and every dispatch, first token and completion published on a bus and
    /// applied by every other replica `bus_latency_ns` later: in-flight counts, token charges,
    /// the prefixes dispatched, and completions for the capacity a router measures.
    DispatchStream {
        /// One hop of the bus, ns.
        bus_latency_ns: u64,
        /// Each replica holds an arriving request a uniform random time in `[0, spread_ns]`
        /// before routing it (0: it routes at once). Replicas that receive requests at the same
        /// instant see the same fleet and, a bus hop apart, would all pick the same worker; a
        /// random hold orders their decisions, so most of them see the others' dispatches. The
        /// request pays the hold (half the spread on average) in its TTFT.
        spread_ns: u64,
    },
    /// As `DispatchStream`, but a dispatch is reserved before it is sent: every replica sees
    /// it before its next decision, and the request reaches its worker one bus round trip
    /// later (the reservation's cost). First tokens and completions travel as in the stream.
    RouteAndReserve {
        /// One hop of the bus, ns.
        bus_latency_ns: u64,
    },
}

impl Share {
    /// The names of the sharing modes, in a scenario.
    pub const NAMES: [&'static str; 6] = [
        "none",
        "probes",
        "probes-and-load",
        "engine-truth",
        "dispatch-stream",
        "route-and-reserve",
    ];

    /// The mode of a name, if any: `period_ns` is the exchange's or the poll's period
    /// (`probes-and-load`, `engine-truth`), `bus_latency_ns` one hop of the bus
    /// (`dispatch-stream`, `route-and-reserve`); the others ignore both. The dispatch stream
    /// spreads its decisions over [`DEFAULT_REPLICA_SPREAD_S`] ([`Share::with_spread`] sets
    /// another spread).
    pub fn from_name(name: &str, period_ns: u64, bus_latency_ns: u64) -> Option<Share> {
        match name {
            "none" => Some(Share::None),
            "probes" => Some(Share::Probes),
            "probes-and-load" => Some(Share::ProbesAndLoad {
                sync_interval_ns: period_ns,
            }),
            "engine-truth" => Some(Share::EngineTruth {
                poll_interval_ns: period_ns,
            }),
            "dispatch-stream" => Some(Share::DispatchStream {
                bus_latency_ns,
                spread_ns: secs_to_nanos(DEFAULT_REPLICA_SPREAD_S),
            }),
            "route-and-reserve" => Some(Share::RouteAndReserve { bus_latency_ns }),
            _ => None,
        }
    }

    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        match self {
            Share::None => Self::NAMES[0],
            Share::Probes => Self::NAMES[1],
            Share::ProbesAndLoad { .. } => Self::NAMES[2],
            Share::EngineTruth { .. } => Self::NAMES[3],
            Share::DispatchStream { .. } => Self::NAMES[4],
            Share::RouteAndReserve { .. } => Self::NAMES[5],
        }
    }

    /// Whether probe results are shared.
    pub fn probes(self) -> bool {
        !matches!(self, Share::None)
    }

    /// Whether the mode runs on a period (`sync_interval_s`): the exchange of
    /// `probes-and-load`, the engines' poll of `engine-truth`.
    pub fn periodic(self) -> bool {
        matches!(
            self,
            Share::ProbesAndLoad { .. } | Share::EngineTruth { .. }
        )
    }

    /// The bus hop of a mode that publishes dispatches, ns.
    pub fn bus_latency_ns(self) -> Option<u64> {
        match self {
            Share::DispatchStream { bus_latency_ns, .. }
            | Share::RouteAndReserve { bus_latency_ns } => Some(bus_latency_ns),
            _ => None,
        }
    }

    /// The dispatch stream with its decisions spread over `spread_ns` (see
    /// [`Share::DispatchStream`]); `None` for every other mode, which has no spread.
    pub fn with_spread(self, spread_ns: u64) -> Option<Share> {
        match self {
            Share::DispatchStream { bus_latency_ns, .. } => Some(Share::DispatchStream {
                bus_latency_ns,
                spread_ns,
            }),
            _ => None,
        }
    }

    /// How long a replica may hold an arriving request before routing it, ns (0 but for a
    /// spread dispatch stream).
    pub fn spread_ns(self) -> u64 {
        match self {
            Share::DispatchStream { spread_ns, .. } => spread_ns,
            _ => 0,
        }
    }
}

/// The gateway replicas of a run (validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateways {
    /// How many (1..=[`MAX_REPLICAS`]).
    pub replicas: u32,
    /// The balancer's rule.
    pub split: Split,
    /// What they share.
    pub share: Share,
}

impl Gateways {
    /// One gateway: a scenario without `gateways:`.
    pub const ONE: Gateways = Gateways {
        replicas: 1,
        split: Split::RoundRobin,
        share: Share::None,
    };
}

impl Default for Gateways {
    fn default() -> Self {
        Gateways::ONE
    }
}

/// One replica at run time.
pub(super) struct Replica {
    pub(super) router: Router,
    pub(super) rng: Xoshiro256PlusPlus,
}

impl Replica {
    /// Replica `r` of a run with root seed `seed`; replica 0 draws from the single gateway's
    /// stream.
    fn new(router: Router, seed: u64, r: u32) -> Replica {
        let stream = if r == 0 {
            ROUTER_STREAM
        } else {
            REPLICA_STREAM + u64::from(r)
        };
        Replica {
            router,
            rng: Xoshiro256PlusPlus::seed_from_u64(derive_seed(seed, stream)),
        }
    }
}

/// The L4 balancer: picks the replica of each arriving request.
struct Balancer {
    split: Split,
    replicas: u32,
    rng: Xoshiro256PlusPlus,
    next: u32,
}

impl Balancer {
    fn new(g: Gateways, seed: u64) -> Balancer {
        Balancer {
            split: g.split,
            replicas: g.replicas.max(1),
            rng: Xoshiro256PlusPlus::seed_from_u64(derive_seed(seed, SPLIT_STREAM)),
            next: 0,
        }
    }

    /// The replica of a request with traffic tag `session`: a session id where the source has
    /// sessions (a conversation, a closed-loop user), else unique to the request (an open-loop
    /// sequence number, a trace line). One replica draws nothing.
    fn pick(&mut self, session: u64) -> u32 {
        if self.replicas == 1 {
            return 0;
        }
        match self.split {
            Split::Random => self.rng.random_range(0..self.replicas),
            Split::HashBySession => (splitmix64(session) % u64::from(self.replicas)) as u32,
            Split::RoundRobin => {
                let r = self.next;
                self.next = (self.next + 1) % self.replicas;
                r
            }
        }
    }
}

/// The gateway replicas of a run and the balancer in front of them.
pub(super) struct Replicas {
    list: Vec<Replica>,
    balancer: Balancer,
}

impl Replicas {
    /// `g.replicas` routers (at least one), each built by `router`.
    pub(super) fn new(g: Gateways, seed: u64, mut router: impl FnMut() -> Router) -> Replicas {
        let n = g.replicas.max(1);
        Replicas {
            list: (0..n).map(|r| Replica::new(router(), seed, r)).collect(),
            balancer: Balancer::new(g, seed),
        }
    }

    /// The first replica's router: what every replica knows alike (the fleet's workers,
    /// their states and ids, the model) is read from it.
    #[inline]
    pub(super) fn first(&self) -> &Router {
        &self.list[0].router
    }

    /// Whether there are several replicas (and so per-replica metrics).
    #[inline]
    pub(super) fn several(&self) -> bool {
        self.list.len() > 1
    }

    /// How many.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Replica `r`.
    #[inline]
    pub(super) fn get(&self, r: usize) -> &Replica {
        &self.list[r]
    }

    /// Replica `r`, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, r: usize) -> &mut Replica {
        &mut self.list[r]
    }

    /// Every replica, in order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Replica> {
        self.list.iter()
    }

    /// Every replica, in order, to change.
    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Replica> {
        self.list.iter_mut()
    }

    /// The replica of an arriving request with traffic tag `session` ([`Balancer::pick`]).
    #[inline]
    pub(super) fn pick(&mut self, session: u64) -> u32 {
        self.balancer.pick(session)
    }

    /// Apply an administrative call to every replica (a lifecycle event reaches them all);
    /// the first refusal, if any, is the answer (replicas that saw the same events answer
    /// alike).
    pub(super) fn on_all(
        &mut self,
        mut call: impl FnMut(&mut Router) -> Result<(), AdminError>,
    ) -> Result<(), AdminError> {
        let mut answer = Ok(());
        for r in &mut self.list {
            let result = call(&mut r.router);
            if answer.is_ok() {
                answer = result;
            }
        }
        answer
    }

    /// `probes-and-load`: every replica learns the others' in-flight count of every worker.
    pub(super) fn sync_load(&mut self, fleet: &Fleet) {
        for w in &fleet.workers {
            let Some(id) = w.id else {
                continue;
            };
            let total: u32 = self
                .list
                .iter()
                .map(|r| local_in_flight(&r.router, id))
                .sum();
            for r in &mut self.list {
                let own = local_in_flight(&r.router, id);
                r.router.set_remote_in_flight(id, total - own);
            }
        }
    }
}

impl Replicas {
    /// `engine-truth`: replica `r` reads each engine's sequences (running and waiting, as its
    /// metrics endpoint shows them) and counts those beyond its own requests in flight there
    /// as the other replicas' load. Its own requests still on their way are among its own and
    /// not yet in the engine's count, so the others' load is, if anything, counted short; a
    /// stopped engine holds nothing.
    pub(super) fn sync_engine_truth(&mut self, r: usize, fleet: &Fleet) {
        let router = &mut self.list[r].router;
        for w in &fleet.workers {
            let Some(id) = w.id else {
                continue;
            };
            let engine = if w.up {
                w.engine.running() + w.engine.waiting()
            } else {
                0
            };
            let own = local_in_flight(router, id);
            router.set_remote_in_flight(id, engine.saturating_sub(own));
        }
    }
}

/// A replica's own requests in flight on `id` (without what it was told of the others).
pub(super) fn local_in_flight(router: &Router, id: WorkerId) -> u32 {
    router.fleet().get(id).map_or(0, |i| i.in_flight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateways(replicas: u32, split: Split) -> Gateways {
        Gateways {
            replicas,
            split,
            share: Share::None,
        }
    }

    #[test]
    fn round_robin_alternates_exactly() {
        let mut b = Balancer::new(gateways(3, Split::RoundRobin), 7);
        let picks: Vec<u32> = (0..7).map(|i| b.pick(i)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn hash_by_session_keeps_a_session_on_one_replica_and_spreads_sessions() {
        let mut b = Balancer::new(gateways(4, Split::HashBySession), 7);
        for session in 0..50 {
            let first = b.pick(session);
            for _turn in 1..5 {
                assert_eq!(b.pick(session), first, "session {session}");
            }
        }
        let mut seen = [false; 4];
        for session in 0..50 {
            seen[b.pick(session) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "50 sessions reach every replica");
    }

    #[test]
    fn random_spreads_about_evenly_and_depends_on_the_seed_only() {
        let mut b = Balancer::new(gateways(4, Split::Random), 7);
        let mut counts = [0u32; 4];
        let picks: Vec<u32> = (0..40_000).map(|i| b.pick(i)).collect();
        for p in &picks {
            counts[*p as usize] += 1;
        }
        for c in counts {
            assert!((9_500..=10_500).contains(&c), "{counts:?}");
        }
        let mut again = Balancer::new(gateways(4, Split::Random), 7);
        assert!(
            picks
                .iter()
                .enumerate()
                .all(|(i, p)| again.pick(i as u64) == *p)
        );
    }

    #[test]
    fn one_replica_is_always_replica_zero() {
        for (_, split) in Split::ALL {
            let mut b = Balancer::new(gateways(1, split), 3);
            assert!((0..20).all(|i| b.pick(i) == 0));
        }
    }

    #[test]
    fn share_names_round_trip() {
        for name in Share::NAMES {
            assert_eq!(Share::from_name(name, 5, 7).map(Share::name), Some(name));
        }
        assert_eq!(
            Share::from_name("probes-and-load", 5, 7),
            Some(Share::ProbesAndLoad {
                sync_interval_ns: 5
            })
        );
        assert_eq!(
            Share::from_name("dispatch-stream", 5, 7),
            Some(Share::DispatchStream {
                bus_latency_ns: 7,
                spread_ns: 10_000_000
            })
        );
        assert_eq!(Share::from_name("all", 5, 7), None);
    }

    #[test]
    fn names_round_trip() {
        for (name, split) in Split::ALL {
            assert_eq!(Split::from_name(name), Some(split));
            assert_eq!(split.name(), name);
        }
        assert_eq!(Split::from_name("sticky"), None);
    }
}
