//! Stable 64-bit mixing used for synthetic and remapped prefix-block hashes.

/// Tokens per prefix block (the Mooncake trace convention, also used by synthetic sources): the
/// router's own figure, so its believed-cached tokens and the simulator's blocks agree.
pub const BLOCK_TOKENS: u32 = routelab_policies::PREFIX_BLOCK_TOKENS;

pub use crate::seed::splitmix64;

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
    fn blocks_round_up() {
        assert_eq!(blocks_for_tokens(0), 0);
        assert_eq!(blocks_for_tokens(1), 1);
        assert_eq!(blocks_for_tokens(512), 1);
        assert_eq!(blocks_for_tokens(513), 2);
    }
}
