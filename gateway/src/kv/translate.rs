//! From an engine's blocks to the router's: the gateway keys a prompt prefix by the token ids it
//! covers, so it re-keys the engine's announced blocks from the token ids the events carry and
//! never needs the engine's hash function or its seed.
//!
//! The router's prefix blocks are [`PREFIX_BLOCK_TOKENS`] (512) tokens, chain-hashed over the
//! token ids' little-endian bytes ([`crate::tokens::block_keys`]); an engine's blocks are its own
//! size (vLLM: 16 tokens). Each stored engine block extends its parent's running hash by its
//! tokens; every 512-token boundary it completes is a router block, announced `Stored` with the
//! router block before it as parent. A removed engine block takes the router blocks it completed
//! with it. Several engine blocks may complete the same router block (the same tokens under
//! another LoRA or cache salt): a router block is announced stored when its first holder appears
//! and removed when its last goes.
//!
//! An engine block whose parent is unknown (announced before the gateway listened, or lost in a
//! gap that no replay recovered) cannot be placed: it and its descendants are skipped and
//! counted ([`Translator::unplaced`]).

use super::wire::{BlockHash, Event};
use routelab_policies::streams::{FNV1A_OFFSET, fnv1a_extend};
use routelab_policies::{KvEvent, PREFIX_BLOCK_TOKENS};
use std::collections::HashMap;

/// Extend a chain hash by one token id (its little-endian bytes): FNV-1a, the gateway's prefix
/// chain hash, as [`crate::prompt::prefix_hashes`] hashes bytes.
#[inline]
pub(crate) fn hash_token(h: u64, id: u32) -> u64 {
    fnv1a_extend(h, &id.to_le_bytes())
}

/// Most engine blocks placed per worker whatever its cache size; past it the worker's mirror
/// starts again (an engine that never announces removals must not grow the gateway without
/// bound). 4 Mi blocks of 16 tokens is 64 Mi tokens, far beyond any one engine's KV cache; a
/// worker with a configured `cache_tokens` is held much tighter ([`Translator::for_cache`]).
pub const MAX_PLACED: usize = 4 << 20;

/// A worker's placed blocks may cover this many times its configured `cache_tokens`: an engine
/// announces a block stored before it announces the evictions that made room, and the same
/// tokens may be cached twice (another LoRA, another salt), so the mirror gets slack, not an
/// exact fit.
pub const CACHE_SLACK: u64 = 2;

/// Where an engine block sits in its prompt.
#[derive(Debug, Clone)]
struct Placed {
    /// Tokens from the prompt's start to this block's end.
    end: u64,
    /// Tokens in this block.
    size: u32,
    /// The chain hash over those tokens.
    state: u64,
    /// The last router block completed at or before this block's end.
    last_key: Option<u64>,
    /// Router blocks this block completed (usually none or one).
    keys: Vec<u64>,
}

/// One worker's engine blocks, placed.
#[derive(Debug, Default)]
pub struct Translator {
    placed: HashMap<BlockHash, Placed>,
    /// Router block → engine blocks completing it that are held.
    holders: HashMap<u64, u32>,
    /// Tokens the placed blocks cover.
    placed_tokens: u64,
    /// Most tokens the placed blocks may cover (none: bounded by [`MAX_PLACED`] blocks only).
    max_tokens: Option<u64>,
    /// Engine blocks skipped because their parent was unknown.
    pub unplaced: u64,
    /// Events skipped as not about the GPU cache (another medium, another KV cache group, an
    /// unknown kind) or malformed (fewer token ids than blocks × block size).
    pub skipped: u64,
}

impl Translator {
    /// A translator for a worker whose KV cache holds `cache_tokens` (when configured): its
    /// placed blocks cover at most [`CACHE_SLACK`] times that, so one worker's mirror costs in
    /// proportion to its cache (the probe saw ~0.8 GB per worker under the fixed bound).
    pub fn for_cache(cache_tokens: Option<u64>) -> Translator {
        Translator {
            max_tokens: cache_tokens.map(|t| t.saturating_mul(CACHE_SLACK)),
            ..Translator::default()
        }
    }

    /// Tokens the placed blocks cover.
    pub fn placed_tokens(&self) -> u64 {
        self.placed_tokens
    }

    /// Engine blocks placed now.
    pub fn len(&self) -> usize {
        self.placed.len()
    }

    /// True when no engine block is placed.
    pub fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Forget everything (the engine cleared its cache, or its stream can no longer be trusted).
    pub fn clear(&mut self) {
        // New maps rather than `clear()`: a cleared map keeps its capacity, and a worker's
        // mirror after a reset held on to its peak (543 MB in the probe).
        self.placed = HashMap::new();
        self.holders = HashMap::new();
        self.placed_tokens = 0;
    }

    /// Translate one engine event into router events, appended to `out`.
    pub fn apply(&mut self, event: &Event, out: &mut Vec<KvEvent>) {
        if !on_gpu(event) {
            self.skipped += 1;
            return;
        }
        match event {
            Event::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                ..
            } => self.store(block_hashes, *parent, token_ids, *block_size, out),
            Event::BlockRemoved { block_hashes, .. } => {
                for h in block_hashes {
                    self.remove(*h, out);
                }
            }
            Event::AllBlocksCleared => {
                self.clear();
                out.push(KvEvent::AllCleared);
            }
            Event::Unknown(_) => {}
        }
    }

    fn store(
        &mut self,
        hashes: &[BlockHash],
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_size: u32,
        out: &mut Vec<KvEvent>,
    ) {
        let bs = block_size as usize;
        if bs == 0 || tokens.len() < hashes.len().saturating_mul(bs) {
            self.skipped += 1;
            return;
        }
        let (mut end, mut state, mut last_key) = match parent {
            None => (0u64, FNV1A_OFFSET, None),
            Some(p) => match self.placed.get(&p) {
                Some(p) => (p.end, p.state, p.last_key),
                None => {
                    self.unplaced += hashes.len() as u64;
                    return;
                }
            },
        };
        let adding = (hashes.len() as u64).saturating_mul(bs as u64);
        if self.placed.len() + hashes.len() > MAX_PLACED
            || self
                .max_tokens
                .is_some_and(|m| self.placed_tokens.saturating_add(adding) > m)
        {
            self.clear();
            out.push(KvEvent::AllCleared);
            self.unplaced += hashes.len() as u64;
            return;
        }
        let router = u64::from(PREFIX_BLOCK_TOKENS);
        for (h, ids) in hashes.iter().zip(tokens.chunks_exact(bs)) {
            let mut keys = Vec::new();
            for &id in ids {
                state = hash_token(state, id);
                end += 1;
                if end % router == 0 {
                    let n = self.holders.entry(state).or_insert(0);
                    *n += 1;
                    if *n == 1 {
                        out.push(KvEvent::Stored {
                            block: state,
                            parent: last_key,
                        });
                    }
                    keys.push(state);
                    last_key = Some(state);
                }
            }
            let placed = Placed {
                end,
                size: block_size,
                state,
                last_key,
                keys,
            };
            self.placed_tokens += u64::from(block_size);
            if let Some(old) = self.placed.insert(*h, placed) {
                // Announced twice without a removal: the first placement's holds go.
                self.placed_tokens -= u64::from(old.size);
                self.release(&old.keys, out);
            }
        }
    }

    fn remove(&mut self, h: BlockHash, out: &mut Vec<KvEvent>) {
        if let Some(p) = self.placed.remove(&h) {
            self.placed_tokens -= u64::from(p.size);
            self.release(&p.keys, out);
        }
    }

    fn release(&mut self, keys: &[u64], out: &mut Vec<KvEvent>) {
        for k in keys {
            if let Some(n) = self.holders.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.holders.remove(k);
                    out.push(KvEvent::Removed { block: *k });
                }
            }
        }
    }
}

/// Whether an event is about the GPU cache of the first KV cache group (what a prefill
/// reuses): not another tier's copy, not another group's, not an unknown kind.
fn on_gpu(event: &Event) -> bool {
    let (medium, group) = match event {
        Event::BlockStored {
            medium, group_idx, ..
        }
        | Event::BlockRemoved {
            medium, group_idx, ..
        } => (medium.as_deref(), *group_idx),
        Event::AllBlocksCleared => (None, None),
        Event::Unknown(_) => return false,
    };
    medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu")) && group.is_none_or(|g| g == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::block_keys;

    fn stored(hashes: &[u64], parent: Option<u64>, ids: &[u32], bs: u32) -> Event {
        Event::BlockStored {
            block_hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
            parent: parent.map(BlockHash),
            token_ids: ids.to_vec(),
            block_size: bs,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
        }
    }

    #[test]
    fn sixteen_token_blocks_become_the_routers_512_token_keys() {
        let ids: Vec<u32> = (0..1100).map(|i| i * 7 + 3).collect();
        let keys = block_keys(&ids);
        assert_eq!(keys.len(), 2);
        let mut t = Translator::default();
        let mut out = Vec::new();
        // 68 engine blocks of 16 (1,088 tokens), announced in three events with odd hashes.
        let hashes: Vec<u64> = (0..68).map(|i| 1000 + i * 31).collect();
        t.apply(&stored(&hashes[..20], None, &ids[..320], 16), &mut out);
        assert!(out.is_empty(), "no 512-token boundary yet");
        t.apply(
            &stored(&hashes[20..40], Some(hashes[19]), &ids[320..640], 16),
            &mut out,
        );
        t.apply(
            &stored(&hashes[40..], Some(hashes[39]), &ids[640..1088], 16),
            &mut out,
        );
        assert_eq!(
            out,
            [
                KvEvent::Stored {
                    block: keys[0],
                    parent: None
                },
                KvEvent::Stored {
                    block: keys[1],
                    parent: Some(keys[0])
                },
            ]
        );
        out.clear();
        // Evicting the chain's tail takes the second router block; the first stays.
        t.apply(
            &Event::BlockRemoved {
                block_hashes: vec![BlockHash(hashes[67]), BlockHash(hashes[63])],
                medium: None,
                group_idx: None,
            },
            &mut out,
        );
        assert_eq!(out, [KvEvent::Removed { block: keys[1] }]);
    }

    #[test]
    fn a_block_with_an_unknown_parent_is_counted_not_guessed() {
        let mut t = Translator::default();
        let mut out = Vec::new();
        t.apply(&stored(&[1, 2], Some(99), &[0; 1024], 512), &mut out);
        assert!(out.is_empty());
        assert_eq!((t.unplaced, t.len()), (2, 0));
    }

    #[test]
    fn the_same_tokens_under_two_engine_hashes_are_one_router_block_until_both_go() {
        let ids = vec![5u32; 512];
        let mut t = Translator::default();
        let mut out = Vec::new();
        t.apply(&stored(&[1], None, &ids, 512), &mut out);
        t.apply(&stored(&[2], None, &ids, 512), &mut out);
        assert_eq!(out.len(), 1);
        let rm = |h| Event::BlockRemoved {
            block_hashes: vec![BlockHash(h)],
            medium: Some("GPU".into()),
            group_idx: None,
        };
        t.apply(&rm(1), &mut out);
        assert_eq!(out.len(), 1, "still held through block 2");
        t.apply(&rm(2), &mut out);
        assert_eq!(
            out.last(),
            Some(&KvEvent::Removed {
                block: block_keys(&ids)[0]
            })
        );
    }

    #[test]
    fn other_mediums_groups_and_short_token_lists_are_skipped() {
        let mut t = Translator::default();
        let mut out = Vec::new();
        let mut e = stored(&[1], None, &[0; 512], 512);
        if let Event::BlockStored { medium, .. } = &mut e {
            *medium = Some("CPU".into());
        }
        t.apply(&e, &mut out);
        t.apply(&stored(&[1, 2], None, &[0; 600], 512), &mut out);
        t.apply(&Event::Unknown("Future".into()), &mut out);
        assert!(out.is_empty());
        assert_eq!(t.skipped, 3);
    }

    /// The probe's mirror: an engine announcing far more than its cache without removals is
    /// held to [`CACHE_SLACK`] times its `cache_tokens`, then its mirror starts again.
    #[test]
    fn a_worker_with_a_cache_size_places_at_most_twice_its_cache() {
        let mut t = Translator::for_cache(Some(1024));
        let mut out = Vec::new();
        let mut parent = None;
        for i in 0..200u64 {
            let ids: Vec<u32> = (0..16).map(|k| (i * 16 + k) as u32).collect();
            t.apply(&stored(&[i + 1], parent, &ids, 16), &mut out);
            parent = Some(i + 1);
            assert!(t.placed_tokens() <= 2048, "{}", t.placed_tokens());
            assert!(t.len() <= 128);
        }
        assert!(
            out.contains(&KvEvent::AllCleared),
            "the bound started the mirror again"
        );
        assert!(t.unplaced > 0);
        // Removals give the room back.
        let mut t = Translator::for_cache(Some(1024));
        for i in 0..500u64 {
            let ids: Vec<u32> = (0..16).map(|k| (i * 16 + k) as u32).collect();
            t.apply(&stored(&[i + 1], None, &ids, 16), &mut out);
            t.apply(
                &Event::BlockRemoved {
                    block_hashes: vec![BlockHash(i + 1)],
                    medium: None,
                    group_idx: None,
                },
                &mut out,
            );
        }
        assert_eq!((t.len(), t.placed_tokens(), t.unplaced), (0, 0, 0));
    }

    /// After a reset the translator gives its memory back (a cleared map kept its capacity).
    #[test]
    fn clearing_releases_the_maps_capacity() {
        let mut t = Translator::default();
        let mut out = Vec::new();
        for i in 0..10_000u64 {
            let ids: Vec<u32> = (0..16).map(|k| (i * 16 + k) as u32).collect();
            t.apply(&stored(&[i + 1], None, &ids, 16), &mut out);
        }
        assert!(t.placed.capacity() >= 10_000);
        t.apply(&Event::AllBlocksCleared, &mut out);
        assert_eq!(t.placed.capacity(), 0);
        assert_eq!(t.holders.capacity(), 0);
        assert_eq!(t.placed_tokens(), 0);
    }

    #[test]
    fn all_cleared_forgets_every_placement() {
        let mut t = Translator::default();
        let mut out = Vec::new();
        t.apply(&stored(&[1], None, &[0; 512], 512), &mut out);
        t.apply(&Event::AllBlocksCleared, &mut out);
        assert_eq!(out.last(), Some(&KvEvent::AllCleared));
        assert!(t.is_empty());
        // A child of a forgotten block is now unplaced.
        t.apply(&stored(&[2], Some(1), &[0; 512], 512), &mut out);
        assert_eq!(t.unplaced, 1);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However an engine stores and evicts the blocks of a few prompts, the router blocks
        /// the translator announces held are exactly those completed by a placed engine block:
        /// each key stored once while held, removed once when its last holder goes.
        #[test]
        fn announced_blocks_are_exactly_the_held_ones(
            ops in prop::collection::vec((0usize..3, 0usize..64, any::<bool>()), 1..200),
        ) {
            // Three prompts of 1,024 tokens in 16-token blocks; engine hashes per (prompt, block).
            let prompts: Vec<Vec<u32>> = (0..3u32).map(|p| (0..1024).map(|i| i * 3 + p * 7).collect()).collect();
            let hash = |p: usize, b: usize| BlockHash((p * 1000 + b) as u64);
            let mut t = Translator::default();
            let mut held: std::collections::HashSet<(usize, usize)> = Default::default();
            let mut announced: HashMap<u64, u32> = HashMap::new();
            for (p, b, store) in ops {
                let mut out = Vec::new();
                if store {
                    // Stored with its parent, as an engine stores a block after its prefix.
                    let parent = b.checked_sub(1).map(|q| hash(p, q));
                    if b > 0 && !held.contains(&(p, b - 1)) {
                        continue;
                    }
                    t.apply(&Event::BlockStored {
                        block_hashes: vec![hash(p, b)],
                        parent,
                        token_ids: prompts[p][b * 16..(b + 1) * 16].to_vec(),
                        block_size: 16,
                        lora_id: None,
                        medium: None,
                        group_idx: None,
                    }, &mut out);
                    held.insert((p, b));
                } else {
                    t.apply(&Event::BlockRemoved { block_hashes: vec![hash(p, b)], medium: None, group_idx: None }, &mut out);
                    held.remove(&(p, b));
                }
                for e in out {
                    match e {
                        KvEvent::Stored { block, .. } => {
                            prop_assert!(announced.insert(block, 1).is_none(), "stored twice");
                        }
                        KvEvent::Removed { block } => {
                            prop_assert!(announced.remove(&block).is_some(), "removed unheld");
                        }
                        _ => prop_assert!(false, "no clear here"),
                    }
                }
            }
            // Held router blocks: a block ending at a 512 boundary that was placed (its whole
            // chain was stored when it was).
            let expect: std::collections::HashSet<u64> = held
                .iter()
                .filter(|(_, b)| (b + 1) % 32 == 0)
                .filter(|(p, b)| t.placed.contains_key(&hash(*p, *b)))
                .map(|(p, b)| crate::tokens::block_keys(&prompts[*p][..(b + 1) * 16])[(b + 1) / 32 - 1])
                .collect();
            let got: std::collections::HashSet<u64> = announced.keys().copied().collect();
            prop_assert_eq!(got, expect);
        }
    }
}
