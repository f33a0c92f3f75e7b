//! The engines' KV events in the gateway (`prefix_knowledge: kv-events`).
//!
//! A worker with `kv_events: { endpoint, replay_endpoint }` is subscribed to as vLLM's own
//! subscriber example does it ([`subscriber`]): a SUB socket on the engine's PUB socket and a
//! DEALER on its ROUTER replay socket, both through our own bounded ZMTP client ([`zmtp`]). Each batch ([`wire`]) is re-keyed from the token ids it
//! carries ([`translate`]) and handed to [`routelab_policies::Router::apply_kv_events`], which
//! feeds the mirror the simulator's `kv-events` runs on. A sequence gap asks the replay socket
//! for the missing batches; the same request, sent every `heartbeat_s` for what came after the
//! last batch, is the stream's liveness check (and recovers a lost last batch). While a worker's
//! stream is down the gateway records what it dispatches to it instead, as `approximate` does
//! ([`Fallback`]), and says so (`/admin`, `routelab_worker_kv_events_live`).

pub mod publisher;
pub(crate) mod subscriber;
pub mod translate;
pub mod wire;
pub mod zmtp;

use routelab_policies::KvEvent;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Where a worker's engine publishes its KV events (vLLM: `--kv-events-config
/// '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
/// "replay_endpoint": "tcp://*:5558"}'`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// The engine's PUB socket, `tcp://host:port`.
    pub endpoint: String,
    /// The engine's ROUTER replay socket; none: gaps cannot be recovered (the worker's mirror
    /// starts again from the next batch) and liveness is the connection's only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// The topic the engine publishes under (vLLM's default: empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topic: String,
    /// Seconds between liveness checks (replay requests for what follows the last batch).
    #[serde(default = "default_heartbeat_s")]
    pub heartbeat_s: f64,
    /// Wall seconds between two `kv_events_down` log lines of this worker (the ones between
    /// are counted in the next line's `suppressed`).
    #[serde(
        default = "default_down_log_every_s",
        skip_serializing_if = "is_default_down_log_every_s"
    )]
    pub down_log_every_s: f64,
}

fn default_heartbeat_s() -> f64 {
    1.0
}

/// One `kv_events_down` line a minute per worker unless configured.
pub const DEFAULT_DOWN_LOG_EVERY_S: f64 = 60.0;

fn default_down_log_every_s() -> f64 {
    DEFAULT_DOWN_LOG_EVERY_S
}

fn is_default_down_log_every_s(s: &f64) -> bool {
    *s == default_down_log_every_s()
}

impl KvEventsConfig {
    /// Check the endpoints' form (`tcp://host:port`) and the heartbeat; the message names what
    /// is wrong.
    pub fn validate(&self) -> Result<(), KvEventsError> {
        for (field, e) in [
            ("endpoint", Some(&self.endpoint)),
            ("replay_endpoint", self.replay_endpoint.as_ref()),
        ] {
            let Some(e) = e else { continue };
            let ok = e
                .strip_prefix("tcp://")
                .and_then(|hp| hp.rsplit_once(':'))
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(KvEventsError::Endpoint {
                    field,
                    endpoint: e.clone(),
                });
            }
        }
        if !(self.heartbeat_s.is_finite() && (0.01..=3600.0).contains(&self.heartbeat_s)) {
            return Err(KvEventsError::Heartbeat(self.heartbeat_s));
        }
        let every = self.down_log_every_s;
        if !(every.is_finite() && (0.01..=86_400.0).contains(&every)) {
            return Err(KvEventsError::DownLogEvery(every));
        }
        Ok(())
    }
}

/// What is wrong with a `kv_events` block ([`KvEventsConfig::validate`]); the message names the
/// field and what is valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KvEventsError {
    /// An endpoint that is not `tcp://HOST:PORT`.
    #[error(
        "kv_events.{field} `{endpoint}` is not a ZeroMQ TCP endpoint (valid: tcp://HOST:PORT, port 1-65535)"
    )]
    Endpoint {
        /// `endpoint` or `replay_endpoint`.
        field: &'static str,
        /// As configured.
        endpoint: String,
    },
    /// A heartbeat outside 0.01 to 3600 seconds.
    #[error("kv_events.heartbeat_s = {0} (valid: 0.01 to 3600 seconds)")]
    Heartbeat(f64),
    /// A `kv_events_down` log window outside 0.01 to 86,400 seconds.
    #[error("kv_events.down_log_every_s = {0} (valid: 0.01 to 86400 seconds)")]
    DownLogEvery(f64),
}

/// Where a worker's stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Not configured for this worker.
    Off,
    /// Connecting (or reconnecting); the fallback records dispatches meanwhile.
    Connecting,
    /// Receiving: the mirror is the engine's announced cache.
    Live,
    /// Lost; reconnecting, the fallback records dispatches meanwhile.
    Down,
}

impl StreamState {
    /// The name shown.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamState::Off => "off",
            StreamState::Connecting => "connecting",
            StreamState::Live => "live",
            StreamState::Down => "down",
        }
    }
}

/// A worker's stream counters (cumulative) and state.
#[derive(Debug, Clone, Serialize)]
pub struct StreamStatus {
    /// Now.
    pub state: StreamState,
    /// The last batch's sequence number.
    pub last_seq: Option<i64>,
    /// Batches applied (live and replayed).
    pub batches: u64,
    /// Engine events in them.
    pub events: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Batches recovered by replay requests.
    pub replayed: u64,
    /// Gaps no replay could fill (the worker's mirror started again).
    pub unrecovered: u64,
    /// Payloads that were not a `KVEventBatch`, and messages that were not three frames.
    pub malformed: u64,
    /// Sessions ended because the peer broke a size limit (a frame or message too large, too
    /// many frames: [`zmtp::Limits`]).
    pub refused: u64,
    /// Times the PUB stream's sequence went backwards (an engine restart, wrapped numbers): the
    /// worker's mirror was cleared and started again.
    pub resets: u64,
    /// Engine blocks whose parent was unknown.
    pub unplaced: u64,
    /// Events not about the GPU cache of the first KV cache group, or of an unknown kind.
    pub skipped: u64,
    /// Sessions (connections) started.
    pub sessions: u64,
    /// Why the stream last went down.
    pub last_error: Option<String>,
    /// Router blocks the fallback recorded while the stream was not live.
    pub fallback_blocks: usize,
}

impl StreamStatus {
    pub(crate) fn new(state: StreamState) -> StreamStatus {
        StreamStatus {
            state,
            last_seq: None,
            batches: 0,
            events: 0,
            gaps: 0,
            replayed: 0,
            unrecovered: 0,
            malformed: 0,
            refused: 0,
            resets: 0,
            unplaced: 0,
            skipped: 0,
            sessions: 0,
            last_error: None,
            fallback_blocks: 0,
        }
    }
}

/// While a worker's stream is not live: what the gateway dispatched to it, as `approximate`
/// records it (the prompt's blocks, the oldest forgotten first beyond the worker's cache), so
/// the router's belief about that worker is a guess rather than empty.
#[derive(Debug, Default)]
pub struct Fallback {
    ring: VecDeque<u64>,
    held: std::collections::HashSet<u64>,
}

/// Blocks the fallback keeps for a worker of unknown cache size (the affinity's shared index
/// is 65,536 blocks for the fleet; one worker's guess stays well below it).
pub const FALLBACK_BLOCKS: usize = 16_384;

impl Fallback {
    /// The events recording a dispatched prefix: its blocks not yet held, stored in chain order;
    /// the oldest removed beyond `bound` blocks.
    pub fn record(&mut self, prefix: &[u64], bound: usize, out: &mut Vec<KvEvent>) {
        for (i, &b) in prefix.iter().enumerate() {
            if self.held.insert(b) {
                self.ring.push_back(b);
                out.push(KvEvent::Stored {
                    block: b,
                    parent: i.checked_sub(1).map(|p| prefix[p]),
                });
            }
        }
        while self.ring.len() > bound.max(1) {
            if let Some(old) = self.ring.pop_front() {
                self.held.remove(&old);
                out.push(KvEvent::Removed { block: old });
            }
        }
    }

    /// Blocks recorded.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.ring.clear();
        self.held.clear();
    }
}

/// A worker's stream as the gateway tracks it.
#[derive(Debug)]
pub(crate) struct WorkerStream {
    pub status: StreamStatus,
    pub fallback: Fallback,
    /// The `kv_events_down` log line's throttle.
    pub down_log: Throttle,
}

/// Lets a repeated log line through at most once per `every`, counting the ones it held back.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: std::time::Duration,
    last: Option<std::time::Instant>,
    held: u64,
}

impl Throttle {
    /// At most one line per `every`.
    pub fn new(every: std::time::Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            held: 0,
        }
    }

    /// `Some(lines held back since the last)` when a line may be written at `now`.
    pub fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_records_a_chain_once_and_forgets_the_oldest() {
        let mut f = Fallback::default();
        let mut out = Vec::new();
        f.record(&[1, 2, 3], 4, &mut out);
        assert_eq!(out.len(), 3);
        out.clear();
        f.record(&[1, 2, 5, 6], 4, &mut out);
        assert_eq!(
            out,
            [
                KvEvent::Stored {
                    block: 5,
                    parent: Some(2)
                },
                KvEvent::Stored {
                    block: 6,
                    parent: Some(5)
                },
                KvEvent::Removed { block: 1 },
            ]
        );
        assert_eq!(f.len(), 4);
    }

    /// `kv_events_down` was logged at every reconnection attempt: one line a minute now, with
    /// the count of the ones held back.
    #[test]
    fn the_down_line_is_throttled_and_counts_what_it_held_back() {
        let every = std::time::Duration::from_secs(60);
        let mut t = Throttle::new(every);
        let t0 = std::time::Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for i in 1..=100 {
            assert_eq!(
                t.admit(t0 + std::time::Duration::from_millis(i * 100)),
                None
            );
        }
        assert_eq!(t.admit(t0 + every), Some(100));
        assert_eq!(t.admit(t0 + every), None);
    }

    #[test]
    fn endpoints_must_be_tcp_host_port() {
        let mut c = KvEventsConfig {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay_endpoint: Some("tcp://127.0.0.1:5558".into()),
            topic: String::new(),
            heartbeat_s: 1.0,
            down_log_every_s: DEFAULT_DOWN_LOG_EVERY_S,
        };
        assert!(c.validate().is_ok());
        for bad in [
            "127.0.0.1:5557",
            "tcp://:1",
            "tcp://h:0",
            "tcp://h:99999",
            "ipc:///x",
        ] {
            c.endpoint = bad.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("kv_events.endpoint") && e.contains("tcp://HOST:PORT"),
                "{e}"
            );
        }
        c.endpoint = "tcp://h:1".into();
        c.heartbeat_s = 0.0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("heartbeat_s")
        );
    }
}
