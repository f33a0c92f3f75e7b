//! The bus task: one NATS connection that publishes this replica's events, receives its
//! peers', sends the heartbeat snapshot and forgets silent peers. Supervised
//! ([`crate::supervise`], task `bus`): a panic is logged, counted and the task started again,
//! from the local view (every peer's requests released first).
//!
//! The client reconnects on its own (every attempt at most a second apart, for ever); the
//! connection's state comes from the client's events, and is checked again at every
//! heartbeat. While the bus is down, events are dropped (counted) rather than buffered: the
//! peers forget this replica's requests when it goes silent, and its first snapshot after the
//! reconnection tells them what is in flight now.

use super::wire::{self, Body, Header};
use super::{Bus, Outgoing};
use crate::app::shared::Shared;
use crate::config::Credentials;
use async_nats::connection::State;
use async_nats::{Client, ConnectOptions, Event, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc;

/// Longest wait between two reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// Longest a publish may wait for the client's own buffer (full only while the connection is
/// being lost): the task must go on receiving.
const PUBLISH_WAIT: Duration = Duration::from_millis(100);

/// Run the bus (returns at once without a `replicas:` block).
pub(crate) async fn run(s: Arc<Shared>) {
    let Some(bus) = s.bus.as_ref() else {
        return;
    };
    // A task started again may have missed events: start from the local view.
    lock(&bus.peers).forget_all(bus, &s);
    bus.set_up(false);
    let mut outgoing = bus.rx.lock().await;
    let (events_tx, mut events) = mpsc::channel::<Event>(64);
    let (client, mut sub) = connect(bus, events_tx).await;
    let mut tick = tokio::time::interval(bus.settings.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut publisher = Publisher {
        bus,
        client: &client,
        subject: format!("{}.{}", bus.settings.subject, bus.settings.name),
        seq: 0,
        buf: Vec::with_capacity(256),
    };
    loop {
        tokio::select! {
            Some(event) = events.recv() => on_event(bus, &s, event, &mut publisher).await,
            msg = sub.next() => match msg {
                Some(msg) => receive(bus, &s, &msg.payload),
                // The client was closed under us: start again (supervised, counted).
                None => panic!("the bus subscription ended"),
            },
            Some(out) = outgoing.recv() => match out {
                Outgoing::Dispatch { id, worker, charge, prefix } => {
                    let body = Body::Dispatch { id, worker: &worker, charge, prefix };
                    publisher.publish(&body).await;
                }
                Outgoing::FirstToken { id } => publisher.publish(&Body::FirstToken { id }).await,
                Outgoing::End { id, done } => publisher.publish(&Body::End { id, done }).await,
            },
            _ = tick.tick() => {
                // The client's state is the truth; its events only make us notice sooner.
                let connected = client.connection_state() == State::Connected;
                if connected != bus.is_up() {
                    went(bus, &s, connected, &mut publisher).await;
                }
                if bus.is_up() {
                    publisher.snapshot().await;
                }
                lock(&bus.peers).expire(bus, &s);
            }
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Connect (the client retries in the background when the bus is unreachable: this never
/// waits for it) and subscribe to every replica's subject.
async fn connect(bus: &Bus, events: mpsc::Sender<Event>) -> (Client, Subscriber) {
    loop {
        let mut options = ConnectOptions::new()
            .name(format!("routelab-gateway {}", bus.settings.name))
            // Our own events would only come back to be ignored.
            .no_echo()
            .retry_on_initial_connect()
            .max_reconnects(None::<usize>)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(100 * attempts as u64).min(MAX_RECONNECT_DELAY)
            })
            // A bus that stops answering (not a closed socket) is noticed within about a
            // peer timeout: the client gives up after two unanswered pings.
            .ping_interval((bus.settings.peer_timeout / 2).max(Duration::from_millis(100)))
            .event_callback({
                let events = events.clone();
                move |e| {
                    // Never wait on our own loop: a lost notification is caught at the next
                    // heartbeat from the client's state.
                    let _ = events.try_send(e);
                    async {}
                }
            });
        match &bus.settings.credentials {
            Credentials::None => {}
            Credentials::Token(t) => options = options.token(t.expose().to_string()),
            Credentials::UserPassword { user, password } => {
                options = options.user_and_password(user.clone(), password.expose().to_string());
            }
        }
        let connected = match options.connect(bus.settings.server.as_str()).await {
            Ok(client) => {
                let subject = format!("{}.*", bus.settings.subject);
                match client.subscribe(subject).await {
                    Ok(sub) => return (client, sub),
                    Err(e) => e.to_string(),
                }
            }
            Err(e) => e.to_string(),
        };
        bus.log_throttled(
            "bus_error",
            "bus_error",
            &[("address", &bus.settings.server), ("error", &connected)],
        );
        tokio::time::sleep(MAX_RECONNECT_DELAY).await;
    }
}

/// This replica's side of the connection: its subject, sequence and encoding buffer.
struct Publisher<'a> {
    bus: &'a Bus,
    client: &'a Client,
    subject: String,
    /// The last sequence number published (the first event is 1).
    seq: u64,
    buf: Vec<u8>,
}

impl Publisher<'_> {
    async fn publish(&mut self, body: &Body<'_>) {
        if !self.bus.is_up() {
            self.bus.counters.dropped_down.fetch_add(1, Relaxed);
            return;
        }
        self.seq += 1;
        self.buf.clear();
        let h = Header {
            sender: &self.bus.settings.name,
            instance: self.bus.instance,
            seq: self.seq,
        };
        wire::encode(&mut self.buf, &h, body);
        let payload = Bytes::copy_from_slice(&self.buf);
        let sent = tokio::time::timeout(
            PUBLISH_WAIT,
            self.client.publish(self.subject.clone(), payload),
        )
        .await;
        match sent {
            Ok(Ok(())) => {
                self.bus.counters.published.fetch_add(1, Relaxed);
            }
            _ => {
                self.bus.counters.dropped_down.fetch_add(1, Relaxed);
            }
        }
    }

    /// The heartbeat: every request in flight here, by id.
    async fn snapshot(&mut self) {
        let (watermark, ids) = self.bus.in_flight();
        self.publish(&Body::Snapshot { watermark, ids }).await;
    }
}

/// Apply one received message, counting it (and why it was ignored, if it was).
fn receive(bus: &Bus, s: &Shared, payload: &[u8]) {
    bus.counters.received.fetch_add(1, Relaxed);
    let result = lock(&bus.peers).receive(bus, s, payload);
    if let Err(why) = result {
        bus.counters.ignore(why);
        bus.log_throttled(
            why.log_key(),
            "bus_event_ignored",
            &[
                ("reason", why.as_str()),
                ("total", &bus.counters.ignored_of(why).to_string()),
            ],
        );
    }
}

/// A client event.
async fn on_event(bus: &Bus, s: &Shared, event: Event, publisher: &mut Publisher<'_>) {
    match event {
        Event::Connected => went(bus, s, true, publisher).await,
        Event::Disconnected | Event::Closed => went(bus, s, false, publisher).await,
        other => bus.log_throttled("bus_error", "bus_error", &[("error", &other.to_string())]),
    }
}

/// The connection went up or down (logged once per change).
async fn went(bus: &Bus, s: &Shared, up: bool, publisher: &mut Publisher<'_>) {
    if !bus.set_up(up) {
        return;
    }
    if up {
        crate::logging::log(
            "bus_up",
            &[("address", &bus.settings.server), ("replica", bus.name())],
        );
        // Tell the peers what is in flight here now, at once.
        publisher.snapshot().await;
    } else {
        let released = {
            let mut peers = lock(&bus.peers);
            let n = peers.counted();
            peers.forget_all(bus, s);
            n
        };
        crate::logging::log(
            "bus_down",
            &[
                ("address", &bus.settings.server),
                ("released", &released.to_string()),
                (
                    "note",
                    "routing on this replica's own view until the bus is back",
                ),
            ],
        );
    }
}
