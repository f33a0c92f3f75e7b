//! What this replica knows of its peers: each one's instance, sequence and the requests of its
//! that this replica's router counts, one by one, so that exactly what was counted is released
//! (by the peer's end, its snapshot, its silence, or the loss of the bus).

use super::wire::{self, Body, Header};
use super::{Bus, Ignored};
use crate::app::shared::Shared;
use routelab_policies::{Charge, Completion, Time, WorkerId};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Most peer names remembered: garbage with ever new names must not grow the table without
/// bound (a fleet has 2 to 64 replicas).
pub const MAX_PEERS: usize = 1024;
/// Earlier instances remembered per peer name, to tell a collision from a restart.
const RETIRED_KEPT: usize = 4;

/// A peer's request this router counts.
#[derive(Debug, Clone, Copy)]
struct Remote {
    worker: WorkerId,
    /// As the peer charged it (its uncached part released at the first token).
    charge: Charge,
}

/// One peer replica.
#[derive(Debug)]
struct Peer {
    instance: u64,
    /// Its earlier instances: one of them speaking again is a second replica with its name.
    retired: Vec<u64>,
    /// The sequence number expected next (none: take the next one as it comes).
    next_seq: Option<u64>,
    last_heard: Instant,
    /// Silent longer than `peer_timeout_s` (its requests released).
    silent: bool,
    requests: HashMap<u64, Remote>,
    events: u64,
    missed: u64,
}

/// Every peer heard from.
#[derive(Debug, Default)]
pub struct Peers {
    map: HashMap<String, Peer>,
}

impl Peers {
    /// Apply one message received on the subject; `Err` says why it was ignored.
    pub(crate) fn receive(&mut self, bus: &Bus, s: &Shared, payload: &[u8]) -> Result<(), Ignored> {
        let (h, body) = wire::decode(payload).map_err(|e| match e {
            wire::DecodeError::Version(_) => Ignored::Version,
            wire::DecodeError::Malformed(_) => Ignored::Malformed,
        })?;
        if h.sender == bus.name() {
            // Our own event (only if the server echoed it), or another replica with our name.
            return if h.instance == bus.instance {
                Ok(())
            } else {
                Err(Ignored::Collision)
            };
        }
        let now = Instant::now();
        let peer = self.peer(bus, s, &h, now)?;
        if let Some(next) = peer.next_seq {
            if h.seq < next {
                return Err(Ignored::Stale);
            }
            let gap = h.seq - next;
            if gap > 0 {
                peer.missed += gap;
                bus.counters.missed.fetch_add(gap, Relaxed);
            }
        }
        peer.next_seq = Some(h.seq.saturating_add(1));
        peer.last_heard = now;
        peer.events += 1;
        if peer.silent {
            peer.silent = false;
            crate::logging::log("bus_peer_back", &[("peer", h.sender)]);
        }
        apply(peer, bus, s, body)
    }

    /// The peer `h` comes from, created or restarted as its instance says.
    fn peer(
        &mut self,
        bus: &Bus,
        s: &Shared,
        h: &Header<'_>,
        now: Instant,
    ) -> Result<&mut Peer, Ignored> {
        if !self.map.contains_key(h.sender) {
            if self.map.len() >= MAX_PEERS {
                return Err(Ignored::PeerLimit);
            }
            crate::logging::log(
                "bus_peer_joined",
                &[
                    ("peer", h.sender),
                    ("instance", &format!("{:016x}", h.instance)),
                ],
            );
            self.map.insert(
                h.sender.to_string(),
                Peer {
                    instance: h.instance,
                    retired: Vec::new(),
                    next_seq: None,
                    last_heard: now,
                    silent: false,
                    requests: HashMap::new(),
                    events: 0,
                    missed: 0,
                },
            );
        }
        let Some(peer) = self.map.get_mut(h.sender) else {
            return Err(Ignored::PeerLimit);
        };
        if peer.instance != h.instance {
            if peer.retired.contains(&h.instance) {
                return Err(Ignored::Collision);
            }
            // A restart: what its previous instance had in flight ended with it.
            crate::logging::log(
                "bus_peer_restarted",
                &[
                    ("peer", h.sender),
                    ("instance", &format!("{:016x}", h.instance)),
                ],
            );
            release_all(peer, bus, s);
            peer.retired.push(peer.instance);
            if peer.retired.len() > RETIRED_KEPT {
                peer.retired.remove(0);
            }
            peer.instance = h.instance;
            peer.next_seq = None;
        }
        Ok(peer)
    }

    /// Forget the requests of every peer silent longer than `peer_timeout_s`, and peers that
    /// have been silent (with nothing in flight) for ten timeouts.
    pub(crate) fn expire(&mut self, bus: &Bus, s: &Shared) {
        let now = Instant::now();
        let timeout = bus.settings.peer_timeout;
        self.map.retain(|name, peer| {
            let quiet = now.duration_since(peer.last_heard);
            if quiet >= timeout && !peer.silent {
                peer.silent = true;
                crate::logging::log(
                    "bus_peer_silent",
                    &[
                        ("peer", name),
                        ("released", &peer.requests.len().to_string()),
                    ],
                );
                release_all(peer, bus, s);
                // Its stream resumes wherever it is when it speaks again.
                peer.next_seq = None;
            }
            quiet < timeout * 10 || !peer.requests.is_empty()
        });
    }

    /// Forget every peer's requests (the bus is lost, or the bus task starts again): this
    /// replica routes on its own view until the bus is back.
    pub(crate) fn forget_all(&mut self, bus: &Bus, s: &Shared) {
        for peer in self.map.values_mut() {
            release_all(peer, bus, s);
            peer.next_seq = None;
        }
    }

    /// Requests of peers this router counts now.
    pub fn counted(&self) -> usize {
        self.map.values().map(|p| p.requests.len()).sum()
    }

    /// Peers heard from within `peer_timeout_s`.
    pub fn live(&self) -> usize {
        self.map.values().filter(|p| !p.silent).count()
    }

    /// Seconds since the freshest event of any peer, if one was ever heard.
    pub fn freshest_age_s(&self) -> Option<f64> {
        let now = Instant::now();
        self.map
            .values()
            .map(|p| now.duration_since(p.last_heard).as_secs_f64())
            .min_by(f64::total_cmp)
    }

    /// The peers for `/admin`, by name.
    pub fn view(&self) -> Vec<Value> {
        let now = Instant::now();
        let mut names: Vec<&String> = self.map.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|n| {
                let p = self.map.get(n)?;
                Some(json!({
                    "name": n,
                    "instance": format!("{:016x}", p.instance),
                    "live": !p.silent,
                    "last_event_age_s": now.duration_since(p.last_heard).as_secs_f64(),
                    "requests_counted": p.requests.len(),
                    "events": p.events,
                    "missed": p.missed,
                }))
            })
            .collect()
    }
}

/// Apply one peer event to the router.
fn apply(peer: &mut Peer, bus: &Bus, s: &Shared, body: Body<'_>) -> Result<(), Ignored> {
    match body {
        Body::Dispatch {
            id,
            worker,
            charge,
            prefix,
        } => {
            if peer.requests.contains_key(&id) {
                return Ok(());
            }
            let mut core = s.routing.core();
            let Some(w) = core.lookup(worker) else {
                return Err(Ignored::UnknownWorker);
            };
            core.router.remote_dispatch(w, charge, &prefix);
            peer.requests.insert(id, Remote { worker: w, charge });
        }
        Body::FirstToken { id } => {
            if let Some(r) = peer.requests.get_mut(&id) {
                s.routing
                    .core()
                    .router
                    .remote_first_token(r.worker, &mut r.charge);
            }
        }
        Body::End { id, done } => {
            if let Some(r) = peer.requests.remove(&id) {
                let now = s.routing.clock.now();
                let mut core = s.routing.core();
                if let Some(d) = done {
                    let first = now.as_nanos().saturating_sub(d.decode_ns);
                    let c = Completion {
                        prompt_tokens: d.prompt_tokens,
                        output_tokens: d.output_tokens,
                        dispatched_at: Time::from_nanos(first.saturating_sub(d.ttft_ns)),
                        first_token_at: Time::from_nanos(first),
                        completed_at: now,
                    };
                    core.router.remote_completion(r.worker, r.charge, &c);
                }
                core.router.remote_release(r.worker, r.charge);
                // Room under a cap may have opened.
                core.pump(now);
            }
        }
        Body::Snapshot { watermark, ids } => {
            let listed: HashSet<u64> = ids.into_iter().collect();
            let gone: Vec<u64> = peer
                .requests
                .keys()
                .copied()
                .filter(|id| *id <= watermark && !listed.contains(id))
                .collect();
            if !gone.is_empty() {
                release(peer, bus, s, &gone);
            }
        }
    }
    Ok(())
}

/// Release the peer's requests `ids` without their end (counted as expired).
fn release(peer: &mut Peer, bus: &Bus, s: &Shared, ids: &[u64]) {
    let now = s.routing.clock.now();
    let mut core = s.routing.core();
    for id in ids {
        if let Some(r) = peer.requests.remove(id) {
            core.router.remote_release(r.worker, r.charge);
            bus.counters.expired.fetch_add(1, Relaxed);
        }
    }
    core.pump(now);
}

fn release_all(peer: &mut Peer, bus: &Bus, s: &Shared) {
    if peer.requests.is_empty() {
        return;
    }
    let ids: Vec<u64> = peer.requests.keys().copied().collect();
    release(peer, bus, s, &ids);
}
