//! Stable 64-bit mixing used for synthetic and remapped prefix-block hashes.

/// Tokens per prefix block (the Mooncake trace convention, also used by synthetic sources): the
/// router's own figure, so its believed-cached tokens and the simulator's blocks agree.
pub const BLOCK_TOKENS: u32 = routelab_policies::PREFIX_BLOCK_TOKENS;

use routelab_policies::streams::splitmix64;

/// One link of a prefix hash chain: the hash of block `i` given the hash of block `i - 1`
/// (`prev`, [`CHAIN_ROOT`] for block 0) and a key identifying block `i`'s own content.
///
/// Two chains agree at position `i` iff (up to 64-bit collisions) they agree on every key
/// `0..=i`, so the result identifies the whole prefix up to and including block `i`.
#[inline]
#[must_use]
pub const fn chain_block_hash(prev: u64, key: u64) -> u64 {
    splitmix64(prev.rotate_left(29) ^ splitmix64(key ^ 0xA076_1D64_78BD_642F))
}

/// The `prev` value used for block 0 of every chain.
pub const CHAIN_ROOT: u64 = 0x2D35_8DCC_AA6C_78A5;

/// Number of prefix blocks covering `tokens` tokens (the last one possibly partial).
#[inline]
#[must_use]
pub const fn blocks_for_tokens(tokens: u64) -> u64 {
    tokens.div_ceil(BLOCK_TOKENS as u64)
}

/// Remap positional block ids (as in Mooncake's `hash_ids`) in place into prefix-identifying
/// hashes: element `i` becomes the chain hash of ids `0..=i`.
pub fn chain_in_place(ids: &mut [u64]) {
    let mut h = CHAIN_ROOT;
    for id in ids {
        h = chain_block_hash(h, *id);
        *id = h;
    }
}

/// Extend `full` (the chained hashes of a prompt's full blocks so far) to the full blocks of a
/// `prompt`-token prompt and return the prompt's block list: its full blocks, then a trailing
/// partial block when `prompt` is not a multiple of [`BLOCK_TOKENS`].
///
/// `key(index, fill)` names block `index`'s content (`fill` = its tokens, [`BLOCK_TOKENS`] for a
/// full block). Growing sources (conversations, trace sessions) keep `full` between requests,
/// so a later, longer prompt shares every earlier full block and adds its own.
pub(crate) fn grow_prefix_blocks(
    full: &mut Vec<u64>,
    prompt: u32,
    key: impl Fn(u64, u32) -> u64,
) -> Vec<u64> {
    let n_full = (prompt / BLOCK_TOKENS) as usize;
    while full.len() < n_full {
        let prev = full.last().copied().unwrap_or(CHAIN_ROOT);
        full.push(chain_block_hash(prev, key(full.len() as u64, BLOCK_TOKENS)));
    }
    let fill = prompt % BLOCK_TOKENS;
    let mut out = Vec::with_capacity(n_full + usize::from(fill != 0));
    out.extend_from_slice(&full[..n_full]);
    if fill != 0 {
        let prev = out.last().copied().unwrap_or(CHAIN_ROOT);
        out.push(chain_block_hash(prev, key(n_full as u64, fill)));
    }
    out
}

/// The content key of block `index` of a growing prompt whose source is named by `key` (a
/// conversation, a trace session): the `key` argument [`grow_prefix_blocks`] takes. `fill` (the
/// block's tokens) is part of it, so a trailing partial block is shared only by a prompt that
/// ends in the same place.
#[must_use]
pub(crate) fn block_content_key(key: u64, index: u64, fill: u32) -> u64 {
    splitmix64(key ^ (index << 10 | u64::from(fill)))
}

/// A stable 64-bit key of a byte string (e.g. a session id), built on [`splitmix64`] so it is
/// the same on every platform and Rust release (unlike `std`'s `DefaultHasher`).
#[must_use]
pub(crate) fn key_of_bytes(bytes: &[u8]) -> u64 {
    let mut h = splitmix64(bytes.len() as u64);
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = splitmix64(h ^ u64::from_le_bytes(word));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_identifies_whole_prefix() {
        let mut a = vec![0, 1, 2, 3];
        let mut b = vec![0, 1, 9, 3];
        chain_in_place(&mut a);
        chain_in_place(&mut b);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Same id at the same position after a divergence still differs.
        assert_ne!(a[3], b[3]);
    }

    #[test]
    fn grown_blocks_share_the_full_ones() {
        let key = |i: u64, fill: u32| i << 10 | u64::from(fill);
        let mut full = Vec::new();
        let a = grow_prefix_blocks(&mut full, 1100, key);
        let b = grow_prefix_blocks(&mut full, 1600, key);
        assert_eq!((a.len(), b.len()), (3, 4));
        assert_eq!(a[..2], b[..2]);
        // a's partial third block (76 tokens) is not b's full third block.
        assert_ne!(a[2], b[2]);
        assert_eq!(full.len(), 3);
        assert!(grow_prefix_blocks(&mut Vec::new(), 0, key).is_empty());
    }

    #[test]
    fn byte_keys_are_stable_and_length_aware() {
        assert_eq!(key_of_bytes(b"conv-1"), key_of_bytes(b"conv-1"));
        assert_ne!(key_of_bytes(b"conv-1"), key_of_bytes(b"conv-2"));
        assert_ne!(key_of_bytes(b""), key_of_bytes(b"\0"));
        assert_ne!(key_of_bytes(b"abcdefgh"), key_of_bytes(b"abcdefgh\0"));
    }

    #[test]
    fn blocks_round_up() {
        assert_eq!(blocks_for_tokens(0), 0);
        assert_eq!(blocks_for_tokens(1), 1);
        assert_eq!(blocks_for_tokens(512), 1);
        assert_eq!(blocks_for_tokens(513), 2);
    }
}
