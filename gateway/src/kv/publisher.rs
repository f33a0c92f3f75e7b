//! A KV event publisher that speaks vLLM's wire protocol ([`super::wire`]): a PUB socket sending
//! `[topic, seq, payload]` and a ROUTER socket answering replay requests from a buffer of the
//! last batches, as vLLM's `ZmqEventPublisher` does. The emulator publishes its simulated
//! cache with it; the tests use it to replay recorded fixtures (and to drop a batch, to make a
//! gap).

use super::wire::{self, Batch};
use bytes::Bytes;
use std::collections::VecDeque;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's default replay buffer: the last 10,000 batches.
pub const DEFAULT_BUFFER: usize = 10_000;

enum Command {
    Payload(Vec<u8>),
    /// Keep the next `n` batches from the PUB socket (they stay in the replay buffer).
    Drop(u32),
}

/// A running publisher. Dropping it closes both sockets.
pub struct Publisher {
    tx: mpsc::UnboundedSender<Command>,
    endpoint: String,
    replay_endpoint: String,
    task: JoinHandle<()>,
}

/// Bind a PUB and a ROUTER socket on `host` (ports chosen by the system) and start serving.
pub async fn start(host: &str, topic: &str, buffer: usize) -> Result<Publisher, zeromq::ZmqError> {
    let mut publ = zeromq::PubSocket::new();
    let endpoint = publ.bind(&format!("tcp://{host}:0")).await?.to_string();
    let mut router = zeromq::RouterSocket::new();
    let replay_endpoint = router.bind(&format!("tcp://{host}:0")).await?.to_string();
    let (tx, mut rx) = mpsc::unbounded_channel::<Command>();
    let topic = Bytes::copy_from_slice(topic.as_bytes());
    let task = tokio::spawn(async move {
        let mut seq: i64 = 0;
        let mut kept: VecDeque<(i64, Bytes)> = VecDeque::new();
        let mut dropping = 0u32;
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    None => break,
                    Some(Command::Drop(n)) => dropping += n,
                    Some(Command::Payload(p)) => {
                        let payload = Bytes::from(p);
                        if dropping > 0 {
                            dropping -= 1;
                        } else {
                            let frames = vec![
                                topic.clone(),
                                Bytes::copy_from_slice(&seq.to_be_bytes()),
                                payload.clone(),
                            ];
                            if let Ok(m) = ZmqMessage::try_from(frames) {
                                let _ = publ.send(m).await;
                            }
                        }
                        kept.push_back((seq, payload));
                        if kept.len() > buffer.max(1) {
                            kept.pop_front();
                        }
                        seq += 1;
                    }
                },
                req = router.recv() => {
                    let Ok(req) = req else { continue };
                    let frames = req.into_vec();
                    // [identity, empty delimiter, start seq], as vLLM's ROUTER expects.
                    if frames.len() != 3 {
                        continue;
                    }
                    let Some(start) = wire::seq_of(&frames[2]) else { continue };
                    let id = frames[0].clone();
                    for (s, p) in kept.iter().filter(|(s, _)| *s >= start) {
                        let m = vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), p.clone()];
                        if let Ok(m) = ZmqMessage::try_from(m) {
                            let _ = router.send(m).await;
                        }
                    }
                    let end = vec![id, Bytes::new(), Bytes::copy_from_slice(&wire::END_OF_REPLAY.to_be_bytes()), Bytes::new()];
                    if let Ok(m) = ZmqMessage::try_from(end) {
                        let _ = router.send(m).await;
                    }
                }
            }
        }
    });
    Ok(Publisher {
        tx,
        endpoint,
        replay_endpoint,
        task,
    })
}

impl Publisher {
    /// Where subscribers connect (`tcp://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where replay requests go.
    pub fn replay_endpoint(&self) -> &str {
        &self.replay_endpoint
    }

    /// Publish a batch (encoded as vLLM's `array_like` structs).
    pub fn publish(&self, batch: &Batch) {
        let _ = self.tx.send(Command::Payload(wire::encode(batch)));
    }

    /// Publish an already encoded payload (a recorded fixture).
    pub fn publish_raw(&self, payload: Vec<u8>) {
        let _ = self.tx.send(Command::Payload(payload));
    }

    /// Do not send the next `n` batches on the PUB socket (subscribers see a sequence gap);
    /// they are still numbered and kept for replay.
    pub fn drop_next(&self, n: u32) {
        let _ = self.tx.send(Command::Drop(n));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
