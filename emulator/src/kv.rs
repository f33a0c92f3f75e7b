//! The emulator's KV event stream: its simulated prefix cache announced as vLLM announces its
//! own ([`routelab_gateway::kv::publisher`], vLLM's wire format).
//!
//! The simulated cache keeps 512-token blocks keyed by the gateway's chain hashes; vLLM keeps
//! 16-token blocks under hashes of its own. So each cached block is announced as 32 blocks of
//! [`ENGINE_BLOCK_TOKENS`] with their token ids and hashes derived from a per-emulator salt —
//! never the gateway's keys — so a subscriber has to re-key them from the token ids, as it must
//! with a real engine.

use routelab_gateway::kv::publisher::{self, Publisher};
use routelab_gateway::kv::wire::{Batch, BlockHash, Event};
use routelab_policies::{KvEvent, PREFIX_BLOCK_TOKENS};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// vLLM's default KV block size.
pub const ENGINE_BLOCK_TOKENS: u32 = 16;

/// Block keys whose token ids are kept beyond those cached, for the requests in flight.
const SLACK: usize = 20_000;

#[derive(Default)]
struct Tokens {
    /// Block key → the prompt's ids and where the block starts in them.
    ids: HashMap<u64, (Arc<[u32]>, usize)>,
    /// Blocks the cache holds (announced stored, not removed).
    stored: HashSet<u64>,
}

/// A running KV stream.
pub(crate) struct KvStream {
    publisher: Arc<Publisher>,
    tokens: Arc<Mutex<Tokens>>,
    task: JoinHandle<()>,
}

impl KvStream {
    /// Bind the PUB and replay sockets on loopback and start turning the engine's events
    /// (received on the returned sender) into vLLM batches.
    pub async fn start(
        salt: u64,
    ) -> Result<(KvStream, mpsc::UnboundedSender<Vec<KvEvent>>), zeromq::ZmqError> {
        let publisher =
            Arc::new(publisher::start("127.0.0.1", "", publisher::DEFAULT_BUFFER).await?);
        let tokens = Arc::new(Mutex::new(Tokens::default()));
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<KvEvent>>();
        let (p, t) = (publisher.clone(), tokens.clone());
        let task = tokio::spawn(async move {
            while let Some(events) = rx.recv().await {
                let batch = {
                    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                    to_batch(&mut t, salt, &events)
                };
                if !batch.events.is_empty() {
                    p.publish(&batch);
                }
            }
        });
        Ok((
            KvStream {
                publisher,
                tokens,
                task,
            },
            tx,
        ))
    }

    /// `(endpoint, replay_endpoint)`.
    pub fn endpoints(&self) -> (String, String) {
        (
            self.publisher.endpoint().to_string(),
            self.publisher.replay_endpoint().to_string(),
        )
    }

    /// Remember a prompt's token ids under its block keys (before the engine may store them).
    pub fn remember(&self, blocks: &[u64], ids: &Arc<[u32]>) {
        let block = PREFIX_BLOCK_TOKENS as usize;
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &b) in blocks.iter().enumerate() {
            if (i + 1) * block <= ids.len() {
                t.ids.entry(b).or_insert_with(|| (ids.clone(), i * block));
            }
        }
        if t.ids.len() > 4 * t.stored.len() + SLACK {
            let Tokens { ids, stored } = &mut *t;
            ids.retain(|k, _| stored.contains(k));
        }
    }
}

impl Drop for KvStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hash the emulator's engine gives sub-block `j` of a cached block: salted, so it is no
/// key the gateway computes.
fn engine_hash(salt: u64, block: u64, j: u32) -> BlockHash {
    let mut h = salt ^ block.rotate_left(17) ^ u64::from(j).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    BlockHash(h)
}

fn to_batch(t: &mut Tokens, salt: u64, events: &[KvEvent]) -> Batch {
    let per = PREFIX_BLOCK_TOKENS / ENGINE_BLOCK_TOKENS;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        match *e {
            KvEvent::Stored { block, parent } => {
                let Some((ids, start)) = t.ids.get(&block) else {
                    continue; // not a prompt this emulator saw (cannot happen; skipped)
                };
                let token_ids = ids[*start..*start + PREFIX_BLOCK_TOKENS as usize].to_vec();
                t.stored.insert(block);
                out.push(Event::BlockStored {
                    block_hashes: (0..per).map(|j| engine_hash(salt, block, j)).collect(),
                    parent: parent.map(|p| engine_hash(salt, p, per - 1)),
                    token_ids,
                    block_size: ENGINE_BLOCK_TOKENS,
                    lora_id: None,
                    medium: Some("GPU".into()),
                    group_idx: None,
                });
            }
            KvEvent::Removed { block } => {
                t.stored.remove(&block);
                t.ids.remove(&block);
                out.push(Event::BlockRemoved {
                    block_hashes: (0..per)
                        .rev()
                        .map(|j| engine_hash(salt, block, j))
                        .collect(),
                    medium: Some("GPU".into()),
                    group_idx: None,
                });
            }
            KvEvent::AllCleared => {
                t.stored.clear();
                out.push(Event::AllBlocksCleared);
            }
            _ => {}
        }
    }
    Batch {
        ts: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        events: out,
        data_parallel_rank: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_gateway::kv::translate::Translator;
    use routelab_gateway::tokens::block_keys;

    /// What the emulator announces re-keys, through the gateway's translator, to the very keys
    /// its engine cached: the round trip the sim-to-real runs rely on.
    #[test]
    fn announced_blocks_rekey_to_the_engines_keys() {
        let ids: Arc<[u32]> = (0..1100u32).map(|i| i * 3 + 1).collect::<Vec<_>>().into();
        let keys = block_keys(&ids);
        let mut t = Tokens::default();
        let mut tr = Translator::default();
        for (i, &b) in keys.iter().enumerate() {
            t.ids.insert(b, (ids.clone(), i * 512));
        }
        let events: Vec<KvEvent> = KvEvent::stored_chain(&keys).collect();
        let batch = to_batch(&mut t, 42, &events);
        assert_eq!(batch.events.len(), 2);
        let mut out = Vec::new();
        for e in &batch.events {
            tr.apply(e, &mut out);
        }
        assert_eq!(
            out, events,
            "the gateway re-derives the engine's keys from the token ids"
        );
        let gone = to_batch(
            &mut t,
            42,
            &[KvEvent::Removed { block: keys[1] }, KvEvent::AllCleared],
        );
        out.clear();
        for e in &gone.events {
            tr.apply(e, &mut out);
        }
        assert_eq!(
            out,
            [KvEvent::Removed { block: keys[1] }, KvEvent::AllCleared]
        );
        assert!(t.stored.is_empty());
    }
}
