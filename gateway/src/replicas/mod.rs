//! Several gateway replicas behind an L4 balancer, sharing what each dispatches over a NATS bus
//! (the simulator's `share: dispatch-stream`, `docs/replicas.md`).
//!
//! Each replica publishes every dispatch (worker, the router's `Charge`, the prompt's prefix
//! blocks), every first token and every end of a request (with what a completed one measured)
//! on `<subject>.<name>`, and applies every other replica's events to its router as they
//! arrive (`Router::remote_dispatch`, `remote_first_token`, `remote_release`,
//! `remote_completion`), under the router's lock like any decision. The events are
//! [`wire`]'s compact binary format.
//!
//! **A request never waits on the bus.** The request path hands each event to a bounded
//! channel ([`Bus::dispatched`], [`Bus::first_token`], [`Bus::ended`]); a full channel, or a
//! bus that is down, drops the event and counts it. One supervised background task
//! ([`task`]) owns the connection: it publishes, receives and keeps the peers' state.
//!
//! **Lost messages never leave phantom load.** A receiver counts each peer's requests one by
//! one ([`peers`]), keyed by the peer's instance and request id, and releases exactly what it
//! counted. Every `heartbeat_s` each replica publishes a snapshot of the ids it has in flight
//! (taken from its own table, which the request path keeps beside the lossy channel); a
//! receiver releases every request of that peer it still counts, up to the snapshot's
//! watermark, that the snapshot does not list — the end it missed. A peer silent for
//! `peer_timeout_s` is forgotten (all its requests released), and so is every peer the moment
//! this replica loses the bus: it then routes on its own view (and the engines' reports, for
//! a policy that polls them) until the bus is back. A periodic snapshot that *replaced* the
//! per-worker sums would also be robust, but it would lose the token signals and the prefix
//! records a dispatch carries, and would overwrite requests dispatched since the snapshot
//! with a stale count; releasing by id keeps the exact accounting of the stream and bounds the
//! damage of a lost end to one heartbeat.
//!
//! **Identity.** Events carry the sender's name, a random instance number chosen at start and
//! a sequence number. A replica ignores its own events (the connection asks the server not to
//! echo them anyway); an event with this replica's name and another instance is a colliding
//! identity (another replica configured with our name), ignored and counted; a peer name
//! seen with a new instance is a restart (its old requests are released), and its old
//! instance, if it speaks again, a collision between two peers. Garbage, another wire
//! version, a stale or repeated sequence number and a worker this replica does not know are
//! ignored and counted too (`routelab_gateway_bus_events_ignored_total{reason}`), each reason
//! logged once a minute at most.

pub mod peers;
pub(crate) mod task;
pub mod wire;

use crate::config::ReplicaSettings;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use routelab_policies::Charge;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub use wire::Done;

/// An event of this replica's on its way to the bus.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Dispatch {
        id: u64,
        worker: Box<str>,
        charge: Charge,
        prefix: Vec<u64>,
    },
    FirstToken {
        id: u64,
    },
    End {
        id: u64,
        done: Option<Done>,
    },
}

/// Why a received event was ignored (one counter each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// Not an event (cannot be decoded).
    Malformed,
    /// Another wire version.
    Version,
    /// Another replica uses this replica's name, or two peers share a name.
    Collision,
    /// A sequence number at or below one already received from that instance.
    Stale,
    /// A worker this replica does not know (by name).
    UnknownWorker,
    /// A new peer name beyond [`peers::MAX_PEERS`] known ones.
    PeerLimit,
}

impl Ignored {
    /// Every reason, in counter order.
    pub const ALL: [Ignored; 6] = [
        Ignored::Malformed,
        Ignored::Version,
        Ignored::Collision,
        Ignored::Stale,
        Ignored::UnknownWorker,
        Ignored::PeerLimit,
    ];

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::Malformed => "malformed",
            Ignored::Version => "version",
            Ignored::Collision => "collision",
            Ignored::Stale => "stale",
            Ignored::UnknownWorker => "unknown_worker",
            Ignored::PeerLimit => "peer_limit",
        }
    }

    /// Its key for the throttled log (one line a minute per reason).
    pub(crate) fn log_key(self) -> &'static str {
        match self {
            Ignored::Malformed => "ignored_malformed",
            Ignored::Version => "ignored_version",
            Ignored::Collision => "ignored_collision",
            Ignored::Stale => "ignored_stale",
            Ignored::UnknownWorker => "ignored_unknown_worker",
            Ignored::PeerLimit => "ignored_peer_limit",
        }
    }
}

/// The bus's counters, rendered in `/metrics` ([`crate::metrics::render::render_bus`]).
#[derive(Debug, Default)]
pub struct BusCounters {
    /// Events this replica published (snapshots included).
    pub published: AtomicU64,
    /// Messages received on the subject (ignored ones included).
    pub received: AtomicU64,
    /// Events dropped before the bus: the channel was full.
    pub dropped_full: AtomicU64,
    /// Events dropped before the bus: the bus was down.
    pub dropped_down: AtomicU64,
    /// Received events ignored, by [`Ignored`] reason.
    pub ignored: [AtomicU64; Ignored::ALL.len()],
    /// Events a peer published that never arrived (gaps in its sequence numbers).
    pub missed: AtomicU64,
    /// Peers' requests released without their end: missing from a snapshot, their peer
    /// silent, or the bus lost.
    pub expired: AtomicU64,
    /// Times the connection to the bus was lost.
    pub disconnects: AtomicU64,
}

impl BusCounters {
    /// Count one ignored event.
    pub fn ignore(&self, why: Ignored) {
        self.ignored[why as usize].fetch_add(1, Relaxed);
    }

    /// Ignored events of one reason so far.
    pub fn ignored_of(&self, why: Ignored) -> u64 {
        self.ignored[why as usize].load(Relaxed)
    }
}

/// The replica's side of the bus, shared by the request path, the bus task, `/metrics` and
/// `/admin`.
pub struct Bus {
    pub(crate) settings: ReplicaSettings,
    /// This start's instance number (random).
    pub(crate) instance: u64,
    next_id: AtomicU64,
    tx: mpsc::Sender<Outgoing>,
    /// The channel's receiving end, held by the running bus task (a restarted task takes it
    /// over).
    pub(crate) rx: tokio::sync::Mutex<mpsc::Receiver<Outgoing>>,
    /// This replica's requests in flight, by id: what its snapshots list. Kept by the request
    /// path itself, so that an event dropped on its way cannot make a snapshot lie.
    local: Mutex<HashSet<u64>>,
    /// Whether the connection to the bus is up.
    up: AtomicBool,
    /// Since when it is up or down (for `/admin`).
    pub(crate) since: Mutex<Instant>,
    pub counters: BusCounters,
    /// What this replica knows of its peers.
    pub(crate) peers: Mutex<peers::Peers>,
    /// Log lines throttled by key: when each was last written.
    throttle: Mutex<HashMap<&'static str, Instant>>,
    /// The random holds of arriving requests (`spread_s`). Seeded from this start's random
    /// instance number, not the gateway's seed: replicas started from one configuration must
    /// draw different holds, or they would stay in step and herd as before.
    spread_rng: Mutex<Xoshiro256PlusPlus>,
}

/// How often at most a throttled log line (an ignored event's reason, a bus error) is written.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

impl Bus {
    /// The bus of a `replicas:` block (nothing connects until the task starts).
    pub fn new(settings: ReplicaSettings) -> Bus {
        let (tx, rx) = mpsc::channel(settings.publish_queue.max(1));
        let instance = random_instance();
        Bus {
            instance,
            spread_rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(instance)),
            settings,
            next_id: AtomicU64::new(1),
            tx,
            rx: tokio::sync::Mutex::new(rx),
            local: Mutex::default(),
            up: AtomicBool::new(false),
            since: Mutex::new(Instant::now()),
            counters: BusCounters::default(),
            peers: Mutex::default(),
            throttle: Mutex::default(),
        }
    }

    /// How long to hold a request arriving now before routing it: a uniform random time up to
    /// `spread_s`, so that replicas receiving requests at one instant decide in turn and see
    /// each other's dispatches. `None` without a spread, or while the bus is down (no peer
    /// would see the dispatch: the hold would buy nothing).
    pub fn hold(&self) -> Option<Duration> {
        let spread = self.settings.spread;
        if spread.is_zero() || !self.is_up() {
            return None;
        }
        let ns = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
        let draw = self
            .spread_rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_range(0..=ns);
        Some(Duration::from_nanos(draw))
    }

    /// This replica's name.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// Whether the connection to the bus is up.
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// The connection went up or down; false if it already was.
    pub(crate) fn set_up(&self, up: bool) -> bool {
        if self.up.swap(up, Relaxed) == up {
            return false;
        }
        *self.since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if !up {
            self.counters.disconnects.fetch_add(1, Relaxed);
        }
        true
    }

    /// This replica dispatched a request to `worker`: returns the id its later events carry.
    pub fn dispatched(&self, worker: &str, charge: Charge, prefix: &[u64]) -> u64 {
        let id = self.next_id.fetch_add(1, Relaxed);
        self.local
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        if self.publishing() {
            let prefix = prefix[..prefix.len().min(wire::MAX_PREFIX_BLOCKS)].to_vec();
            self.send(Outgoing::Dispatch {
                id,
                worker: worker.into(),
                charge,
                prefix,
            });
        }
        id
    }

    /// Request `id`'s first token.
    pub fn first_token(&self, id: u64) {
        if self.publishing() {
            self.send(Outgoing::FirstToken { id });
        }
    }

    /// Request `id` ended: completed (`done`) or not.
    pub fn ended(&self, id: u64, done: Option<Done>) {
        self.local
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if self.publishing() {
            self.send(Outgoing::End { id, done });
        }
    }

    /// Whether events go to the bus now; a bus that is down drops them (counted): nobody
    /// would receive them, and the snapshot after the reconnection says what is in flight.
    fn publishing(&self) -> bool {
        if self.is_up() {
            return true;
        }
        self.counters.dropped_down.fetch_add(1, Relaxed);
        false
    }

    fn send(&self, ev: Outgoing) {
        if self.tx.try_send(ev).is_err() {
            self.counters.dropped_full.fetch_add(1, Relaxed);
            self.log_throttled(
                "bus_publish_dropped",
                "bus_publish_dropped",
                &[(
                    "dropped_total",
                    &self.counters.dropped_full.load(Relaxed).to_string(),
                )],
            );
        }
    }

    /// The highest request id issued so far and the ids in flight, ascending: a snapshot.
    pub(crate) fn in_flight(&self) -> (u64, Vec<u64>) {
        let local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the table's lock: an id issued later is not yet in the table.
        let watermark = self.next_id.load(Relaxed).saturating_sub(1);
        let mut ids: Vec<u64> = local.iter().copied().collect();
        drop(local);
        ids.sort_unstable();
        (watermark, ids)
    }

    /// Write `event` unless a line of the same `key` was written less than [`LOG_EVERY`] ago.
    pub(crate) fn log_throttled(&self, key: &'static str, event: &str, fields: &[(&str, &str)]) {
        let now = Instant::now();
        {
            let mut t = self.throttle.lock().unwrap_or_else(|p| p.into_inner());
            match t.get(key) {
                Some(&last) if now.duration_since(last) < LOG_EVERY => return,
                _ => {
                    t.insert(key, now);
                }
            }
        }
        crate::logging::log(event, fields);
    }
}

/// A random 64-bit instance number: a restarted replica must not look like its previous
/// self (which a receiver would take for a collision or a stale stream).
fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // The standard library's hasher keys are random per process; mix in the time and pid so
    // two replicas started in the same instant still differ.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}
