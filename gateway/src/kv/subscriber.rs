//! One worker's KV event subscription: connect, catch up by replay, follow the PUB socket,
//! fill gaps by replay, check liveness by replay; on any failure mark the stream down (the
//! fallback takes over) and reconnect.

use super::translate::Translator;
use super::wire;
use super::{KvEventsConfig, StreamState};
use crate::state::Shared;
use bytes::Bytes;
use routelab_policies::{KvEvent, WorkerId};
use std::sync::Arc;
use std::time::Duration;
use zeromq::{Socket, SocketOptions, SocketRecv, SocketSend, ZmqMessage};

/// How long a connection attempt and a replay answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Follow a worker's stream until the task is aborted (the worker was removed).
pub(crate) async fn run(s: Arc<Shared>, id: WorkerId, cfg: KvEventsConfig) {
    let mut backoff = Duration::from_millis(100);
    loop {
        s.signals.kv_update(id, |st| {
            st.status.sessions += 1;
            if st.status.state != StreamState::Down {
                st.status.state = StreamState::Connecting;
            }
        });
        let mut session = Session {
            s: s.clone(),
            id,
            translator: Translator::default(),
            last: None,
        };
        let reason = match session.run(&cfg).await {
            Ok(never) => match never {},
            Err(e) => e,
        };
        if session.last.is_some() {
            backoff = Duration::from_millis(100);
        }
        s.signals.kv_down(&s, id, &reason);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

enum Never {}

struct Session {
    s: Arc<Shared>,
    id: WorkerId,
    translator: Translator,
    last: Option<i64>,
}

impl Session {
    async fn run(&mut self, cfg: &KvEventsConfig) -> Result<Never, String> {
        let mut opts = SocketOptions::default();
        opts.connect_timeout(ANSWER_TIMEOUT);
        let mut sub = zeromq::SubSocket::with_options(opts);
        tokio::time::timeout(ANSWER_TIMEOUT * 2, sub.connect(&cfg.endpoint))
            .await
            .map_err(|_| format!("connecting to {} timed out", cfg.endpoint))?
            .map_err(|e| format!("cannot connect to {}: {e}", cfg.endpoint))?;
        sub.subscribe(&cfg.topic)
            .await
            .map_err(|e| format!("cannot subscribe on {}: {e}", cfg.endpoint))?;
        let mut dealer = match &cfg.replay_endpoint {
            Some(r) => {
                let mut opts = SocketOptions::default();
                opts.connect_timeout(ANSWER_TIMEOUT);
                let mut d = zeromq::DealerSocket::with_options(opts);
                tokio::time::timeout(ANSWER_TIMEOUT * 2, d.connect(r))
                    .await
                    .map_err(|_| format!("connecting to {r} timed out"))?
                    .map_err(|e| format!("cannot connect to {r}: {e}"))?;
                Some(d)
            }
            None => None,
        };
        // A fresh start: what the router believed of this worker (the fallback's guesses, or a
        // mirror that missed events) goes; the replay buffer tells what the engine holds.
        self.s.signals.kv_live(&self.s, self.id);
        if let Some(d) = dealer.as_mut() {
            self.catch_up(d, 0, None).await?;
        }
        let heartbeat = Duration::from_secs_f64(cfg.heartbeat_s);
        let mut tick = tokio::time::interval(heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                msg = sub.recv() => {
                    let msg = msg.map_err(|e| format!("the PUB stream broke: {e}"))?;
                    self.on_message(msg, dealer.as_mut()).await?;
                }
                _ = tick.tick() => {
                    if let Some(d) = dealer.as_mut() {
                        let next = self.last.map_or(0, |l| l + 1);
                        self.catch_up(d, next, None).await?;
                    }
                }
            }
        }
    }

    async fn on_message(
        &mut self,
        msg: ZmqMessage,
        dealer: Option<&mut zeromq::DealerSocket>,
    ) -> Result<(), String> {
        let frames = msg.into_vec();
        let (Some(seq), Some(payload)) = (
            frames.get(1).and_then(|f| wire::seq_of(f)),
            frames.get(2).filter(|_| frames.len() == 3),
        ) else {
            self.s
                .signals
                .kv_update(self.id, |st| st.status.malformed += 1);
            return Ok(());
        };
        if let Some(last) = self.last {
            if seq <= last {
                return Ok(()); // already applied (a replay got there first)
            }
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

    /// Ask the replay socket for every batch from `from` on (before `until`, when given) and
    /// apply them; a missing answer is a dead stream.
    async fn catch_up(
        &mut self,
        d: &mut zeromq::DealerSocket,
        from: i64,
        until: Option<i64>,
    ) -> Result<(), String> {
        let req = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
        let req = ZmqMessage::try_from(req).map_err(|e| e.to_string())?;
        tokio::time::timeout(ANSWER_TIMEOUT, d.send(req))
            .await
            .map_err(|_| "the replay socket did not take a request in time".to_string())?
            .map_err(|e| format!("the replay socket refused a request: {e}"))?;
        loop {
            let reply = tokio::time::timeout(ANSWER_TIMEOUT, d.recv())
                .await
                .map_err(|_| "the replay socket did not answer in time".to_string())?
                .map_err(|e| format!("the replay socket broke: {e}"))?;
            let mut frames = reply.into_vec();
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
        let now = self.s.clock.now();
        self.s
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
            let now = self.s.clock.now();
            self.s.core().router.apply_kv_events(now, self.id, &out);
        }
    }
}
