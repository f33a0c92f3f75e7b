//! The replicas' wire format, version 1: one compact binary event per NATS message.
//!
//! Binary rather than JSON because every request publishes three events and every replica
//! receives every other's: a dispatch is ~40 bytes plus 8 per prefix block here, against ~200
//! as JSON. Integers are unsigned LEB128 varints (`v`) unless said otherwise; strings are a
//! varint length then UTF-8 bytes.
//!
//! | field | encoding |
//! |---|---|
//! | magic | 1 byte, [`MAGIC`] (0xA7: a UTF-8 continuation byte, so no text or JSON starts with it): anything else is not an event |
//! | version | 1 byte, [`VERSION`]; a receiver ignores (and counts) any other |
//! | kind | 1 byte: 1 dispatch, 2 first token, 3 end, 4 snapshot |
//! | sender | string, the replica's name (1 to 64 bytes) |
//! | instance | 8 bytes little-endian: random per start of the sender, so a restart (a new instance) is told from a replica using another's name (two instances at once) |
//! | seq | v: the sender instance's event counter, from 1, +1 per event it publishes |
//! | body | by kind, below |
//!
//! - dispatch: request id (v, per sender instance), worker name (string), the router's
//!   `Charge` (tokens, uncached, prefill_at_dispatch, sharing_at_dispatch: 4 × v), prefix
//!   blocks (v count, then 8 bytes little-endian each, at most [`MAX_PREFIX_BLOCKS`]).
//! - first token: request id (v).
//! - end: request id (v), then 0 (failed or abandoned) or 1 (completed) followed by prompt
//!   tokens, output tokens, dispatch-to-first-token and first-token-to-end in nanoseconds of
//!   the sender's policy time (4 × v).
//! - snapshot (the heartbeat): the highest request id the sender had issued when it took the
//!   snapshot (v), then its requests in flight: a count (v) and their ids ascending,
//!   delta-encoded (v each). A receiver releases every request of that sender it counts, up to
//!   that id, that the snapshot does not list: the end it never received.
//!
//! Nothing after the body: trailing bytes make the event malformed.

use routelab_policies::Charge;

/// The first byte of every event.
pub const MAGIC: u8 = 0xA7;
/// The one version this gateway writes and reads.
pub const VERSION: u8 = 1;
/// Most prefix blocks a dispatch carries (a 2-million-token prompt of 512-token blocks; the
/// router reads only the leading ones anyway).
pub const MAX_PREFIX_BLOCKS: usize = 4096;
/// Most request ids a snapshot lists; a replica with more in flight sends none (and its peers
/// then reconcile nothing from it) rather than a message the bus may refuse.
pub const MAX_SNAPSHOT_IDS: usize = 65_536;
/// Longest name (a sender's or a worker's) a receiver accepts.
const MAX_NAME: usize = 1024;

const KIND_DISPATCH: u8 = 1;
const KIND_FIRST_TOKEN: u8 = 2;
const KIND_END: u8 = 3;
const KIND_SNAPSHOT: u8 = 4;

/// Who sent an event, and where it stands in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub sender: &'a str,
    pub instance: u64,
    pub seq: u64,
}

/// What a completed request measured, in the sender's policy time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// From dispatch to the first token, ns.
    pub ttft_ns: u64,
    /// From the first token to the end, ns.
    pub decode_ns: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    Dispatch {
        id: u64,
        worker: &'a str,
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
    Snapshot {
        watermark: u64,
        ids: Vec<u64>,
    },
}

/// Why an event could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("wire version {0} (this gateway reads {VERSION})")]
    Version(u8),
    #[error("malformed event: {0}")]
    Malformed(&'static str),
}

fn put_v(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_v(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Append one event to `out`.
pub fn encode(out: &mut Vec<u8>, h: &Header<'_>, body: &Body<'_>) {
    out.push(MAGIC);
    out.push(VERSION);
    out.push(match body {
        Body::Dispatch { .. } => KIND_DISPATCH,
        Body::FirstToken { .. } => KIND_FIRST_TOKEN,
        Body::End { .. } => KIND_END,
        Body::Snapshot { .. } => KIND_SNAPSHOT,
    });
    put_str(out, h.sender);
    out.extend_from_slice(&h.instance.to_le_bytes());
    put_v(out, h.seq);
    match body {
        Body::Dispatch {
            id,
            worker,
            charge,
            prefix,
        } => {
            put_v(out, *id);
            put_str(out, worker);
            for x in [
                charge.tokens,
                charge.uncached,
                charge.prefill_at_dispatch,
                charge.sharing_at_dispatch,
            ] {
                put_v(out, x.into());
            }
            let blocks = &prefix[..prefix.len().min(MAX_PREFIX_BLOCKS)];
            put_v(out, blocks.len() as u64);
            for b in blocks {
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
        Body::FirstToken { id } => put_v(out, *id),
        Body::End { id, done } => {
            put_v(out, *id);
            match done {
                None => out.push(0),
                Some(d) => {
                    out.push(1);
                    put_v(out, d.prompt_tokens.into());
                    put_v(out, d.output_tokens.into());
                    put_v(out, d.ttft_ns);
                    put_v(out, d.decode_ns);
                }
            }
        }
        Body::Snapshot { watermark, ids } => {
            put_v(out, *watermark);
            let ids = if ids.len() > MAX_SNAPSHOT_IDS {
                &[][..]
            } else {
                &ids[..]
            };
            put_v(out, ids.len() as u64);
            let mut last = 0;
            for &id in ids {
                put_v(out, id.wrapping_sub(last));
                last = id;
            }
        }
    }
}

/// A reader over one event's bytes; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self
            .buf
            .split_first()
            .ok_or(DecodeError::Malformed("truncated"))?;
        self.buf = rest;
        Ok(b)
    }

    fn v(&mut self) -> Result<u64, DecodeError> {
        let mut x: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return Err(DecodeError::Malformed("varint overflows 64 bits"));
            }
            x |= part << shift;
            if b < 0x80 {
                return Ok(x);
            }
        }
        Err(DecodeError::Malformed("varint longer than 10 bytes"))
    }

    fn v32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.v()?).map_err(|_| DecodeError::Malformed("number beyond 32 bits"))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Malformed("truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u64_le(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    }

    fn string(&mut self) -> Result<&'a str, DecodeError> {
        let n = usize::try_from(self.v()?).unwrap_or(usize::MAX);
        if n == 0 || n > MAX_NAME {
            return Err(DecodeError::Malformed("name length"));
        }
        std::str::from_utf8(self.bytes(n)?).map_err(|_| DecodeError::Malformed("name not UTF-8"))
    }

    /// A count of items of at least `min_size` bytes each, bounded by what is left and `max`.
    fn count(&mut self, min_size: usize, max: usize) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.v()?).unwrap_or(usize::MAX);
        if n > max || n.saturating_mul(min_size) > self.buf.len() {
            return Err(DecodeError::Malformed("count"));
        }
        Ok(n)
    }
}

/// Read one event.
pub fn decode(buf: &[u8]) -> Result<(Header<'_>, Body<'_>), DecodeError> {
    let mut r = Reader { buf };
    if r.byte()? != MAGIC {
        return Err(DecodeError::Malformed("not a replica event"));
    }
    let version = r.byte()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = r.byte()?;
    let header = Header {
        sender: r.string()?,
        instance: r.u64_le()?,
        seq: r.v()?,
    };
    let body = match kind {
        KIND_DISPATCH => {
            let id = r.v()?;
            let worker = r.string()?;
            let charge = Charge {
                tokens: r.v32()?,
                uncached: r.v32()?,
                prefill_at_dispatch: r.v32()?,
                sharing_at_dispatch: r.v32()?,
            };
            let n = r.count(8, MAX_PREFIX_BLOCKS)?;
            let mut prefix = Vec::with_capacity(n);
            for _ in 0..n {
                prefix.push(r.u64_le()?);
            }
            Body::Dispatch {
                id,
                worker,
                charge,
                prefix,
            }
        }
        KIND_FIRST_TOKEN => Body::FirstToken { id: r.v()? },
        KIND_END => {
            let id = r.v()?;
            let done = match r.byte()? {
                0 => None,
                1 => Some(Done {
                    prompt_tokens: r.v32()?,
                    output_tokens: r.v32()?,
                    ttft_ns: r.v()?,
                    decode_ns: r.v()?,
                }),
                _ => return Err(DecodeError::Malformed("end flag")),
            };
            Body::End { id, done }
        }
        KIND_SNAPSHOT => {
            let watermark = r.v()?;
            let n = r.count(1, MAX_SNAPSHOT_IDS)?;
            let mut ids = Vec::with_capacity(n);
            let mut last: u64 = 0;
            for _ in 0..n {
                last = last
                    .checked_add(r.v()?)
                    .ok_or(DecodeError::Malformed("snapshot id"))?;
                ids.push(last);
            }
            Body::Snapshot { watermark, ids }
        }
        _ => return Err(DecodeError::Malformed("unknown kind")),
    };
    if !r.buf.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok((header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(body: Body<'_>) -> usize {
        let h = Header {
            sender: "gw-a",
            instance: 0x0123_4567_89ab_cdef,
            seq: 300,
        };
        let mut out = Vec::new();
        encode(&mut out, &h, &body);
        let (h2, b2) = decode(&out).unwrap();
        assert_eq!((h2, &b2), (h, &body));
        out.len()
    }

    #[test]
    fn every_kind_round_trips_in_few_bytes() {
        let charge = Charge {
            tokens: 812,
            uncached: 300,
            prefill_at_dispatch: 1200,
            sharing_at_dispatch: 3,
        };
        let dispatch = round_trip(Body::Dispatch {
            id: 1000,
            worker: "pro6000",
            charge,
            prefix: vec![u64::MAX, 7],
        });
        // 3 + 5 + 8 + 2 (header) + 2 + 8 + 7 (charge) + 1 + 16 (two blocks)
        assert_eq!(dispatch, 52);
        assert_eq!(round_trip(Body::FirstToken { id: 1000 }), 20);
        let done = Done {
            prompt_tokens: 812,
            output_tokens: 203,
            ttft_ns: 412_000_000,
            decode_ns: 9_000_000_000,
        };
        assert_eq!(
            round_trip(Body::End {
                id: 1000,
                done: Some(done)
            }),
            35
        );
        assert_eq!(
            round_trip(Body::End {
                id: 1000,
                done: None
            }),
            21
        );
        round_trip(Body::Snapshot {
            watermark: 5000,
            ids: vec![3, 4, 4000, u64::MAX],
        });
        round_trip(Body::Snapshot {
            watermark: 0,
            ids: vec![],
        });
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let mut good = Vec::new();
        encode(
            &mut good,
            &Header {
                sender: "a",
                instance: 1,
                seq: 1,
            },
            &Body::Dispatch {
                id: 1,
                worker: "w",
                charge: Charge::NONE,
                prefix: vec![1, 2, 3],
            },
        );
        // Every truncation, and every single-byte change, is read or refused without a panic.
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..good.len() {
            for b in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = decode(&bad);
            }
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            decode(&trailing),
            Err(DecodeError::Malformed("trailing bytes"))
        );
        let mut v2 = good.clone();
        v2[1] = 2;
        assert_eq!(decode(&v2), Err(DecodeError::Version(2)));
        assert!(decode(b"{\"json\": true}").is_err());
        // A count that promises more than the message holds allocates nothing.
        let mut huge = vec![MAGIC, VERSION, KIND_SNAPSHOT, 1, b'a'];
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&[1, 0, 0xff, 0xff, 0x03]);
        assert_eq!(decode(&huge), Err(DecodeError::Malformed("count")));
    }
}
