//! SplitMix64, the simulator's one integer mixer, and the seed derivation built on it.
//!
//! Every stream of the simulator (engine noise, router randomness, synthetic prefix hashes, the
//! player's filler text) mixes integers with this one function, so a change of mixer is one
//! edit and no two copies can drift apart (a drift would silently change every output).

/// The SplitMix64 increment (2^64 / φ, odd).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64 finaliser: a bijective, well-mixing map on `u64`.
#[inline]
#[must_use]
pub const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derive an independent seed for component `stream` from the root seed (SplitMix64 of both),
/// so that adding a component never shifts another's random stream.
#[inline]
#[must_use]
pub const fn derive_seed(root: u64, stream: u64) -> u64 {
    splitmix64(root ^ stream.wrapping_mul(GAMMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The reference SplitMix64 generator seeded with 0 yields splitmix64(k·γ) for k = 0, 1, …
        // Its first output is 0xE220A8397B1DCDAF (Vigna's splitmix64.c).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn derived_seeds_are_pinned() {
        // Values of the former hand-inlined derivation: every bundled output depends on them.
        assert_eq!(derive_seed(42, 1), 0x28EF_E333_B266_F103);
        assert_eq!(derive_seed(7, 1003), 0xE680_67CC_AB26_E7AB);
        assert_ne!(derive_seed(42, 1), derive_seed(42, 2));
        assert_ne!(derive_seed(42, 1), derive_seed(43, 1));
    }
}
