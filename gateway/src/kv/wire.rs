//! vLLM's KV event wire format: what one ZeroMQ message carries and how its payload decodes.
//!
//! vLLM's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`) sends each batch as a three-frame
//! message `[topic, seq, payload]`: the topic as configured (default empty), the batch's sequence
//! number as an 8-byte big-endian integer counting from 0, and the batch encoded by msgspec's
//! msgpack encoder. Its ROUTER replay socket answers a request whose last frame is a start
//! sequence (8 bytes, big-endian) with one `[seq, payload]` message per buffered batch from there
//! on, then `[-1 as 8 signed bytes, empty]`.
//!
//! The payload is a `KVEventBatch` (`ts: float`, `events: list[...]`, since 0.10
//! `data_parallel_rank: int | None = None`) of tagged events:
//! - `BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, …)`,
//! - `BlockRemoved(block_hashes, medium, …)`,
//! - `AllBlocksCleared()`.
//!
//! Two encodings exist: the structs were declared `array_like=True` until recent releases (a
//! batch is an array, an event an array whose first element is its tag, the class name, as
//! `examples/online_serving/kv_events_subscriber.py` decodes them), and are plain structs now (a
//! batch is a map, an event a map with its tag under `"type"`). Both decode here. msgspec leaves
//! trailing fields at their default out (`omit_defaults=True`), and newer releases append fields
//! (`lora_name`, `extra_keys`, `group_idx`, …): missing ones read as absent, unknown ones are
//! skipped. A block hash is an integer or, with a byte-string hash function, bytes
//! (`ExternalBlockHash = bytes | int`); either becomes a 64-bit key ([`BlockHash`]).

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The sequence number vLLM's replay socket sends after the last buffered batch.
pub const END_OF_REPLAY: i64 = -1;

/// An engine's block hash as a 64-bit key: an integer hash as its two's-complement bits, a
/// byte-string hash folded by FNV-1a (distinct digests stay distinct keys but for 2⁻⁶⁴ chances).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// The key of a byte-string hash.
    pub fn of_bytes(b: &[u8]) -> BlockHash {
        BlockHash(routelab_policies::streams::fnv1a(b))
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = BlockHash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a block hash (an integer or bytes)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<BlockHash, E> {
                Ok(BlockHash(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<BlockHash, E> {
                Ok(BlockHash(v as u64))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<BlockHash, E> {
                Ok(BlockHash::of_bytes(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Blocks the engine computed and keeps for reuse, first to last of one chain.
    BlockStored {
        /// The blocks' hashes, in chain order.
        block_hashes: Vec<BlockHash>,
        /// The hash of the block before the first (none: the first starts a prompt).
        parent: Option<BlockHash>,
        /// The blocks' token ids, `block_size` per block, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// The LoRA adapter the blocks were computed with, if any.
        lora_id: Option<i64>,
        /// Where the blocks live (`"GPU"`, or a CPU / disk tier of an offloading connector).
        medium: Option<String>,
        /// The KV cache group (hybrid models), if the engine says.
        group_idx: Option<i64>,
    },
    /// Blocks the engine evicted.
    BlockRemoved {
        /// Their hashes.
        block_hashes: Vec<BlockHash>,
        /// Where they lived.
        medium: Option<String>,
        /// The KV cache group, if the engine says.
        group_idx: Option<i64>,
    },
    /// The engine dropped its whole cache.
    AllBlocksCleared,
    /// An event of a kind this gateway does not know (skipped and counted).
    Unknown(String),
}

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// When the engine made it (its wall clock, seconds).
    pub ts: f64,
    /// The events, in the order they happened.
    pub events: Vec<Event>,
    /// The data-parallel rank that published it, when the engine says.
    pub data_parallel_rank: Option<i64>,
}

/// A payload that is not a `KVEventBatch`.
#[derive(Debug, thiserror::Error)]
#[error("not a vLLM KVEventBatch: {0}")]
pub struct DecodeError(String);

/// Decode one payload (either encoding).
pub fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
    rmp_serde::from_slice(payload).map_err(|e| DecodeError(e.to_string()))
}

/// Encode a batch as vLLM's `array_like` structs do (the encoding its subscriber example
/// decodes): `[ts, [[tag, fields…], …]]`, trailing absent fields left out as msgspec's
/// `omit_defaults` leaves them. The emulator publishes with it.
pub fn encode(batch: &Batch) -> Vec<u8> {
    rmp_serde::to_vec(&ArrayLike(batch)).expect("msgpack encoding of plain data cannot fail")
}

struct ArrayLike<'a>(&'a Batch);

impl Serialize for ArrayLike<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.0;
        let n = if b.data_parallel_rank.is_some() { 3 } else { 2 };
        let mut seq = s.serialize_seq(Some(n))?;
        seq.serialize_element(&b.ts)?;
        seq.serialize_element(&EventsArray(&b.events))?;
        if let Some(r) = b.data_parallel_rank {
            seq.serialize_element(&r)?;
        }
        seq.end()
    }
}

struct EventsArray<'a>(&'a [Event]);

impl Serialize for EventsArray<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for e in self.0 {
            seq.serialize_element(&EventArray(e))?;
        }
        seq.end()
    }
}

struct EventArray<'a>(&'a Event);

impl Serialize for EventArray<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let hashes = |h: &[BlockHash]| h.iter().map(|b| b.0).collect::<Vec<u64>>();
        match self.0 {
            Event::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                medium,
                group_idx,
            } => {
                let mut seq = s.serialize_seq(None)?;
                seq.serialize_element("BlockStored")?;
                seq.serialize_element(&hashes(block_hashes))?;
                seq.serialize_element(&parent.map(|p| p.0))?;
                seq.serialize_element(token_ids)?;
                seq.serialize_element(block_size)?;
                seq.serialize_element(lora_id)?;
                seq.serialize_element(medium)?;
                if let Some(g) = group_idx {
                    // lora_name, extra_keys, then group_idx
                    seq.serialize_element(&Option::<String>::None)?;
                    seq.serialize_element(&Option::<()>::None)?;
                    seq.serialize_element(g)?;
                }
                seq.end()
            }
            Event::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            } => {
                let mut seq = s.serialize_seq(None)?;
                seq.serialize_element("BlockRemoved")?;
                seq.serialize_element(&hashes(block_hashes))?;
                seq.serialize_element(medium)?;
                if let Some(g) = group_idx {
                    seq.serialize_element(g)?;
                }
                seq.end()
            }
            Event::AllBlocksCleared => {
                let mut seq = s.serialize_seq(Some(1))?;
                seq.serialize_element("AllBlocksCleared")?;
                seq.end()
            }
            Event::Unknown(tag) => {
                let mut seq = s.serialize_seq(Some(1))?;
                seq.serialize_element(tag)?;
                seq.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Batch;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a KVEventBatch (an array [ts, events, …] or a map)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Batch, A::Error> {
                let ts: f64 = a
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let events: Vec<Event> = a
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                let data_parallel_rank: Option<i64> = a.next_element()?.flatten();
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Batch {
                    ts,
                    events,
                    data_parallel_rank,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Batch, A::Error> {
                let (mut ts, mut events, mut rank) = (None, None, None);
                while let Some(k) = a.next_key::<String>()? {
                    match k.as_str() {
                        "ts" => ts = Some(a.next_value()?),
                        "events" => events = Some(a.next_value()?),
                        "data_parallel_rank" => rank = a.next_value()?,
                        _ => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Batch {
                    ts: ts.ok_or_else(|| de::Error::missing_field("ts"))?,
                    events: events.ok_or_else(|| de::Error::missing_field("events"))?,
                    data_parallel_rank: rank,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The fields of an event by name, whichever encoding carried them.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<BlockHash>>,
    parent: Option<BlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    group_idx: Option<i64>,
}

impl Fields {
    fn into_event<E: de::Error>(self, tag: String) -> Result<Event, E> {
        Ok(match tag.as_str() {
            "BlockStored" => Event::BlockStored {
                block_hashes: self
                    .block_hashes
                    .ok_or_else(|| E::missing_field("block_hashes"))?,
                parent: self.parent,
                token_ids: self.token_ids.unwrap_or_default(),
                block_size: self
                    .block_size
                    .ok_or_else(|| E::missing_field("block_size"))?,
                lora_id: self.lora_id,
                medium: self.medium,
                group_idx: self.group_idx,
            },
            "BlockRemoved" => Event::BlockRemoved {
                block_hashes: self
                    .block_hashes
                    .ok_or_else(|| E::missing_field("block_hashes"))?,
                medium: self.medium,
                group_idx: self.group_idx,
            },
            "AllBlocksCleared" => Event::AllBlocksCleared,
            _ => Event::Unknown(tag),
        })
    }
}

/// The positional field order of each tag (vLLM's declaration order).
fn field_order(tag: &str) -> &'static [&'static str] {
    match tag {
        "BlockStored" => &[
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
        ],
        "BlockRemoved" => &["block_hashes", "medium", "group_idx"],
        _ => &[],
    }
}

fn read_field<'de, A: SeqAccess<'de>>(
    a: &mut A,
    name: &str,
    f: &mut Fields,
) -> Result<bool, A::Error> {
    Ok(match name {
        "block_hashes" => a
            .next_element()?
            .map(|v| f.block_hashes = Some(v))
            .is_some(),
        "parent_block_hash" => a.next_element()?.map(|v| f.parent = v).is_some(),
        "token_ids" => a.next_element()?.map(|v| f.token_ids = Some(v)).is_some(),
        "block_size" => a.next_element()?.map(|v| f.block_size = Some(v)).is_some(),
        "lora_id" => a.next_element()?.map(|v| f.lora_id = v).is_some(),
        "medium" => a.next_element()?.map(|v| f.medium = v).is_some(),
        "group_idx" => a.next_element()?.map(|v| f.group_idx = v).is_some(),
        _ => a.next_element::<IgnoredAny>()?.is_some(),
    })
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Event;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a KV cache event (an array [tag, fields…] or a map with \"type\")")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Event, A::Error> {
                let tag: String = a
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let mut f = Fields::default();
                for name in field_order(&tag) {
                    if !read_field(&mut a, name, &mut f)? {
                        break;
                    }
                }
                while a.next_element::<IgnoredAny>()?.is_some() {}
                f.into_event(tag)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Event, A::Error> {
                let mut tag = None;
                let mut f = Fields::default();
                while let Some(k) = a.next_key::<String>()? {
                    match k.as_str() {
                        "type" => tag = Some(a.next_value()?),
                        "block_hashes" => f.block_hashes = Some(a.next_value()?),
                        "parent_block_hash" => f.parent = a.next_value()?,
                        "token_ids" => f.token_ids = Some(a.next_value()?),
                        "block_size" => f.block_size = Some(a.next_value()?),
                        "lora_id" => f.lora_id = a.next_value()?,
                        "medium" => f.medium = a.next_value()?,
                        "group_idx" => f.group_idx = a.next_value()?,
                        _ => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                f.into_event(tag.ok_or_else(|| de::Error::missing_field("type"))?)
            }
        }
        d.deserialize_any(V)
    }
}

/// The sequence number frame: 8 bytes, big-endian, signed (the replay's end marker is -1).
pub fn seq_of(frame: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(frame).ok().map(i64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch {
        Batch {
            ts: 1.5,
            events: vec![
                Event::BlockStored {
                    block_hashes: vec![BlockHash(7), BlockHash(u64::MAX)],
                    parent: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_id: None,
                    medium: Some("GPU".into()),
                    group_idx: None,
                },
                Event::BlockRemoved {
                    block_hashes: vec![BlockHash(7)],
                    medium: None,
                    group_idx: Some(0),
                },
                Event::AllBlocksCleared,
            ],
            data_parallel_rank: None,
        }
    }

    #[test]
    fn the_array_like_encoding_round_trips() {
        let b = sample();
        assert_eq!(decode(&encode(&b)).unwrap(), b);
    }

    #[test]
    fn missing_trailing_fields_read_as_absent_and_extra_ones_are_skipped() {
        // [ts, [["BlockRemoved", [5]]], 0, "extra"]: medium omitted, a rank and an unknown tail.
        let payload =
            rmp_serde::to_vec(&(2.0, vec![("BlockRemoved", vec![5u64])], 0i64, "extra")).unwrap();
        let b = decode(&payload).unwrap();
        assert_eq!(b.data_parallel_rank, Some(0));
        assert_eq!(
            b.events,
            [Event::BlockRemoved {
                block_hashes: vec![BlockHash(5)],
                medium: None,
                group_idx: None
            }]
        );
    }

    #[test]
    fn a_byte_string_hash_and_a_negative_one_are_keys() {
        let payload = rmp_serde::to_vec(&(0.0, vec![("BlockRemoved", vec![-1i64])])).unwrap();
        let b = decode(&payload).unwrap();
        assert!(
            matches!(&b.events[0], Event::BlockRemoved { block_hashes, .. } if block_hashes[0] == BlockHash(u64::MAX))
        );
        assert_ne!(BlockHash::of_bytes(b"ab"), BlockHash::of_bytes(b"ba"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for p in [&b""[..], b"\xc1", b"\x93\x01", b"\x92\xa1x\x90"] {
            assert!(decode(p).is_err(), "{p:?}");
        }
    }

    #[test]
    fn the_sequence_frame_is_eight_big_endian_bytes() {
        assert_eq!(seq_of(&7i64.to_be_bytes()), Some(7));
        assert_eq!(seq_of(&(-1i64).to_be_bytes()), Some(END_OF_REPLAY));
        assert_eq!(seq_of(b"short"), None);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn event() -> impl Strategy<Value = Event> {
        let hashes = prop::collection::vec(any::<u64>().prop_map(BlockHash), 0..6);
        let medium = prop::option::of(prop_oneof![
            Just("GPU".to_string()),
            Just("CPU".to_string())
        ]);
        prop_oneof![
            (
                hashes.clone(),
                prop::option::of(any::<u64>().prop_map(BlockHash)),
                prop::collection::vec(any::<u32>(), 0..40),
                1u32..64,
                prop::option::of(any::<i64>()),
                medium.clone(),
                prop::option::of(0i64..3),
            )
                .prop_map(
                    |(block_hashes, parent, token_ids, block_size, lora_id, medium, group_idx)| {
                        Event::BlockStored {
                            block_hashes,
                            parent,
                            token_ids,
                            block_size,
                            lora_id,
                            medium,
                            group_idx,
                        }
                    }
                ),
            (hashes, medium, prop::option::of(0i64..3)).prop_map(
                |(block_hashes, medium, group_idx)| {
                    Event::BlockRemoved {
                        block_hashes,
                        medium,
                        group_idx,
                    }
                }
            ),
            Just(Event::AllBlocksCleared),
        ]
    }

    proptest! {
        /// Whatever a publisher sends, decoding answers a batch or an error, never a panic.
        #[test]
        fn any_bytes_decode_to_a_batch_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        /// The array-like encoding round-trips every batch (absent trailing fields included).
        #[test]
        fn every_batch_round_trips(
            ts in -1e12f64..1e12,
            events in prop::collection::vec(event(), 0..5),
            rank in prop::option::of(0i64..8),
        ) {
            let b = Batch { ts, events, data_parallel_rank: rank };
            prop_assert_eq!(decode(&encode(&b)).unwrap(), b);
        }
    }
}
