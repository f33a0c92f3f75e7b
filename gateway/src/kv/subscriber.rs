//! One worker's KV event subscription: connect, catch up by replay, follow the PUB socket,
//! fill gaps by replay, check liveness by replay; on any failure mark the stream down (the
//! fallback takes over) and reconnect.

use super::translate::Translator;
use super::wire;
use super::zmtp::{self, Connection, SocketType, ZmtpError};
use super::{KvEventsConfig, StreamState};
use crate::app::shared::Shared;
use bytes::Bytes;
use routelab_policies::{KvEvent, WorkerId};
use std::sync::Arc;
use std::time::Duration;

/// How long a connection attempt and a replay answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How long one replay may take in all: a replay socket that keeps answering without its end
/// marker would otherwise hold the live stream (which is not read meanwhile) forever. Ten
/// heartbeats, at least 2 s (vLLM's 10,000-batch buffer replays in well under a second on a
/// LAN), at most 30 s.
fn replay_deadline(cfg: &KvEventsConfig) -> Duration {
    Duration::from_secs_f64((cfg.heartbeat_s * 10.0).clamp(2.0, 30.0))
}

/// Follow a worker's stream until the task is aborted (the worker was removed).
pub(crate) async fn run(s: Arc<Shared>, id: WorkerId, cfg: KvEventsConfig) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Read at each session: the admin API may have changed the worker's cache size.
        let cache_tokens = s
            .routing
            .core()
            .workers
            .get(id)
            .and_then(|w| w.cfg.cache_tokens.map(crate::config::CacheTokens::tokens));
        s.signals.kv_update(id, |st| {
            st.status.sessions += 1;
            if st.status.state != StreamState::Down {
                st.status.state = StreamState::Connecting;
            }
        });
        let mut session = Session {
            s: s.clone(),
            id,
            translator: Translator::for_cache(cache_tokens),
            last: None,
            live_last: None,
            replay_deadline: replay_deadline(&cfg),
        };
        let reason = match session.run(&cfg).await {
            Ok(never) => match never {},
            Err(e) => e,
        };
        // A peer that broke a size limit is refused and counted; it is reconnected to with the
        // growing backoff (not the short one of a stream that had worked), so a hostile peer
        // costs a handshake every few seconds at most.
        let refused = reason.refusal;
        if refused {
            s.signals.kv_update(id, |st| st.status.refused += 1);
        }
        if session.last.is_some() && !refused {
            backoff = Duration::from_millis(100);
        }
        s.signals.kv_down(&s.routing, id, &reason.message);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

enum Never {}

/// Why a session ended.
struct Ended {
    message: String,
    /// The peer broke a size limit ([`ZmtpError::is_refusal`]).
    refusal: bool,
}

impl From<String> for Ended {
    fn from(message: String) -> Ended {
        Ended {
            message,
            refusal: false,
        }
    }
}

fn ended(what: &str, e: ZmtpError) -> Ended {
    Ended {
        refusal: e.is_refusal(),
        message: format!("{what}: {e}"),
    }
}

struct Session {
    s: Arc<Shared>,
    id: WorkerId,
    translator: Translator,
    /// The last batch applied (live or replayed).
    last: Option<i64>,
    /// The last sequence number the PUB socket itself sent: an engine's PUB stream only counts
    /// up, so a number at or below it is a new stream (the engine restarted), while one at or
    /// below `last` but above it is a batch a replay already applied.
    live_last: Option<i64>,
    replay_deadline: Duration,
}

impl Session {
    async fn run(&mut self, cfg: &KvEventsConfig) -> Result<Never, Ended> {
        let mut sub = Connection::connect(
            &cfg.endpoint,
            SocketType::Sub,
            zmtp::LIMITS,
            ANSWER_TIMEOUT * 2,
        )
        .await
        .map_err(|e| ended(&format!("cannot connect to {}", cfg.endpoint), e))?;
        sub.subscribe(cfg.topic.as_bytes())
            .await
            .map_err(|e| ended(&format!("cannot subscribe on {}", cfg.endpoint), e))?;
        let mut dealer = match &cfg.replay_endpoint {
            Some(r) => Some(
                Connection::connect(r, SocketType::Dealer, zmtp::LIMITS, ANSWER_TIMEOUT * 2)
                    .await
                    .map_err(|e| ended(&format!("cannot connect to {r}"), e))?,
            ),
            None => None,
        };
        // A fresh start: what the router believed of this worker (the fallback's guesses, or a
        // mirror that missed events) goes; the replay buffer tells what the engine holds.
        self.s.signals.kv_live(&self.s.routing, self.id);
        if let Some(d) = dealer.as_mut() {
            self.catch_up(d, 0, None).await?;
        }
        let heartbeat = Duration::from_secs_f64(cfg.heartbeat_s);
        let mut tick = tokio::time::interval(heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                // `Connection::recv` is cancel-safe: a message half read when the tick fires
                // stays in its decoder.
                msg = sub.recv() => {
                    let msg = msg.map_err(|e| ended("the PUB stream broke", e))?;
                    self.on_message(msg, dealer.as_mut()).await?;
                }
                _ = tick.tick() => {
                    if let Some(d) = dealer.as_mut() {
                        // After `i64::MAX` nothing can follow: ask from there (the end marker
                        // answers), and the next live batch is a new stream.
                        let next = self.last.map_or(0, |l| l.saturating_add(1));
                        self.catch_up(d, next, None).await?;
                    }
                }
            }
        }
    }

    async fn on_message(
        &mut self,
        frames: Vec<Bytes>,
        mut dealer: Option<&mut Connection>,
    ) -> Result<(), Ended> {
        let (Some(seq), Some(payload)) = (
            frames.get(1).and_then(|f| wire::seq_of(f)),
            frames.get(2).filter(|_| frames.len() == 3),
        ) else {
            self.s
                .signals
                .kv_update(self.id, |st| st.status.malformed += 1);
            return Ok(());
        };
        if self.live_last.is_some_and(|l| seq <= l) {
            // The PUB stream went backwards: the engine restarted (its sequence starts at 0
            // again) or its numbers wrapped. Nothing the mirror holds is the new engine's.
            self.new_stream(seq);
            if let Some(d) = dealer.as_deref_mut() {
                // What the new engine buffered before this batch.
                self.catch_up(d, 0, Some(seq)).await?;
            }
        }
        self.live_last = Some(seq);
        if let Some(last) = self.last {
            if seq <= last {
                return Ok(()); // already applied (a replay got there first)
            }
            // `last < seq`, so `last + 1` cannot overflow.
            if seq > last + 1 {
                self.s.signals.kv_update(self.id, |st| st.status.gaps += 1);
                if let Some(d) = dealer {
                    self.catch_up(d, last + 1, Some(seq)).await?;
                }
                if self.last.is_some_and(|l| l + 1 < seq) {
                    self.restart_mirror();
                }
            }
        }
        self.apply(seq, payload, false);
        Ok(())
    }

    /// The sequence went backwards: a new stream. The worker's mirror is cleared (and said so:
    /// `resets` in `/admin` and `/metrics`, a log line), then filled again from what follows.
    fn new_stream(&mut self, seq: i64) {
        let from = self.live_last.unwrap_or_default();
        self.translator.clear();
        self.last = None;
        self.live_last = None;
        self.s
            .signals
            .kv_update(self.id, |st| st.status.resets += 1);
        let now = self.s.routing.clock.now();
        self.s
            .routing
            .core()
            .router
            .apply_kv_events(now, self.id, &[KvEvent::AllCleared]);
        crate::logging::log(
            "kv_events_sequence_reset",
            &[
                ("worker", &self.worker_name()),
                ("from", &from.to_string()),
                ("to", &seq.to_string()),
            ],
        );
    }

    fn worker_name(&self) -> String {
        self.s
            .routing
            .core()
            .workers
            .get(self.id)
            .map(|w| w.cfg.name.clone())
            .unwrap_or_default()
    }

    /// Ask the replay socket for every batch from `from` on (before `until`, when given) and
    /// apply them; a missing answer, or a replay not finished within its deadline, is a dead
    /// stream.
    async fn catch_up(
        &mut self,
        d: &mut Connection,
        from: i64,
        until: Option<i64>,
    ) -> Result<(), Ended> {
        let deadline = tokio::time::Instant::now() + self.replay_deadline;
        let req = from.to_be_bytes();
        tokio::time::timeout(ANSWER_TIMEOUT, d.send(&[b"", &req]))
            .await
            .map_err(|_| "the replay socket did not take a request in time".to_string())?
            .map_err(|e| ended("the replay socket refused a request", e))?;
        loop {
            let wait =
                ANSWER_TIMEOUT.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            let reply = match tokio::time::timeout(wait, d.recv()).await {
                Ok(r) => r.map_err(|e| ended("the replay socket broke", e))?,
                Err(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "the replay did not end within {:.1} s (no end marker)",
                        self.replay_deadline.as_secs_f64()
                    )
                    .into());
                }
                Err(_) => {
                    return Err("the replay socket did not answer in time"
                        .to_string()
                        .into());
                }
            };
            let mut frames = reply;
            // [empty delimiter, seq, payload]; tolerate a peer that sends no delimiter.
            if frames.len() == 3 && frames[0].is_empty() {
                frames.remove(0);
            }
            let (Some(seq), Some(payload)) =
                (frames.first().and_then(|f| wire::seq_of(f)), frames.get(1))
            else {
                self.s
                    .signals
                    .kv_update(self.id, |st| st.status.malformed += 1);
                continue;
            };
            if seq == wire::END_OF_REPLAY {
                return Ok(());
            }
            if self.last.is_some_and(|l| seq <= l) || until.is_some_and(|u| seq >= u) {
                continue;
            }
            if let Some(l) = self.last
                && seq > l + 1
            {
                // The buffer no longer holds what came between: start the mirror again.
                self.restart_mirror();
            }
            self.apply(seq, payload, true);
        }
    }
    /// The mirror missed batches no replay can give back: forget the worker's blocks and build
    /// them again from what comes next.
    fn restart_mirror(&mut self) {
        self.translator.clear();
        self.s
            .signals
            .kv_update(self.id, |st| st.status.unrecovered += 1);
        let now = self.s.routing.clock.now();
        self.s
            .routing
            .core()
            .router
            .apply_kv_events(now, self.id, &[KvEvent::AllCleared]);
    }

    fn apply(&mut self, seq: i64, payload: &[u8], replayed: bool) {
        self.last = Some(seq);
        let batch = match wire::decode(payload) {
            Ok(b) => b,
            Err(e) => {
                self.s.signals.kv_update(self.id, |st| {
                    st.status.malformed += 1;
                    st.status.last_seq = Some(seq);
                    st.status.last_error = Some(e.to_string());
                });
                return;
            }
        };
        let mut out = Vec::new();
        for e in &batch.events {
            self.translator.apply(e, &mut out);
        }
        let (unplaced, skipped) = (self.translator.unplaced, self.translator.skipped);
        self.s.signals.kv_update(self.id, |st| {
            st.status.batches += 1;
            st.status.events += batch.events.len() as u64;
            st.status.replayed += u64::from(replayed);
            st.status.last_seq = Some(seq);
            st.status.unplaced = unplaced;
            st.status.skipped = skipped;
        });
        if !out.is_empty() {
            let now = self.s.routing.clock.now();
            self.s
                .routing
                .core()
                .router
                .apply_kv_events(now, self.id, &out);
        }
    }
}
