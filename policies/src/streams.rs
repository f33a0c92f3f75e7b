//! Random streams, hashes and time units that every crate shares: SplitMix64 and the seed
//! derivation built on it, the table of the simulator's random streams, FNV-1a 64 and the
//! seconds ↔ nanoseconds conversions.
//!
//! They live in one module of the lowest crate so that the simulator, the emulator, the gateway
//! and the lab import them rather than keep copies: a drift between two copies of a mixer, a
//! hash or a rounding would silently change every output (or, for the prefix hash, make the
//! gateway's keys disagree with the engines' or the simulator's), and two components given the
//! same stream number by accident would draw correlated randomness.

// ---------------------------------------------------------------------------------------------
// SplitMix64

/// The SplitMix64 increment (2^64 / φ, odd).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64 finaliser: a bijective, well-mixing map on `u64`.
///
/// The one integer mixer of the project: engine noise, router seeds, synthetic prefix hashes,
/// the player's filler text and `pulsar`'s rendezvous hashing all mix with it.
#[inline]
#[must_use]
pub const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derive an independent seed for component `stream` from the root seed (SplitMix64 of both),
/// so that adding a component never shifts another's random stream. `stream` is one of the
/// named streams below (plus an index where the stream is per source, worker or replica).
#[inline]
#[must_use]
pub const fn derive_seed(root: u64, stream: u64) -> u64 {
    splitmix64(root ^ stream.wrapping_mul(GAMMA))
}

// ---------------------------------------------------------------------------------------------
// The random streams: every component that draws randomness from a run's root seed, and the
// number it draws under. The values are part of every output (changing one changes every run
// that uses it), so they never change; a new component takes a new number, far from the ranges
// below.

/// The router of the single gateway, or of replica 0 when the gateway is replicated
/// (`derive_seed(seed, ROUTER_STREAM)`): the chooser's random picks.
pub const ROUTER_STREAM: u64 = 1;

/// Traffic source `i` of a scenario (`derive_seed(seed, TRAFFIC_STREAM + i)`): its arrivals,
/// prompt and output lengths. Room for [`TRAFFIC_STREAM_ROOM`] sources before the engines'
/// streams begin.
pub const TRAFFIC_STREAM: u64 = 100;

/// How many traffic sources fit below [`ENGINE_STREAM`].
pub const TRAFFIC_STREAM_ROOM: u64 = ENGINE_STREAM - TRAFFIC_STREAM;

/// The inference engine of worker `i` (`derive_seed(seed, ENGINE_STREAM + i)`): its speed noise,
/// in the simulator and in the emulator that replays the same fleet.
pub const ENGINE_STREAM: u64 = 1000;

/// Trace source `i`'s resample (`derive_seed(seed, RESAMPLE_STREAM + i)`): the block bootstrap
/// that redraws a trace's episodes. Far above any fleet's engine streams.
pub const RESAMPLE_STREAM: u64 = 1 << 36;

/// The L4 balancer's `random` split across gateway replicas.
pub const SPLIT_STREAM: u64 = (1 << 40) - 1;

/// The holds of a spread dispatch stream across gateway replicas (each arriving request's
/// random wait before its replica routes it).
pub const SPREAD_STREAM: u64 = (1 << 40) - 2;

/// The router of gateway replica `r ≥ 1` (`derive_seed(seed, REPLICA_STREAM + r)`; replica 0
/// draws from [`ROUTER_STREAM`]). Far from the traffic, engine and resample streams whatever the
/// fleet's size.
pub const REPLICA_STREAM: u64 = 1 << 40;

/// Salt of an engine's noise epochs: epoch `k` of an engine seeded `s` draws its speed factor
/// from `splitmix64(s ^ splitmix64(k ^ ENGINE_EPOCH_SALT))`, a pure function of the seed and
/// the epoch, so it does not depend on when or how often the engine asks.
pub const ENGINE_EPOCH_SALT: u64 = 0xE90C;

/// Salt of a conversation source's content keys: `splitmix64(seed ^ CONVERSATION_SALT)` makes
/// the conversations' prompt blocks differ between seeds (the shared system prompt does not).
pub const CONVERSATION_SALT: u64 = 0x5EED_C0A7_0000_0001;

// ---------------------------------------------------------------------------------------------
// FNV-1a 64

/// The FNV-1a 64 offset basis: the hash of no bytes, and the start of a chain.
pub const FNV1A_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The FNV-1a 64 prime.
const FNV1A_PRIME: u64 = 0x100_0000_01b3;

/// FNV-1a 64 of `bytes` continued from state `h` (the hash of what came before, or
/// [`FNV1A_OFFSET`]). The gateway's prefix chain hashes (prompt bytes, token ids), the keys of
/// vLLM's byte-string block hashes and the lab's inputs hash are all this one function, so the
/// gateway's keys from bytes and from token ids agree by construction.
#[inline]
#[must_use]
pub const fn fnv1a_extend(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h = (h ^ bytes[i] as u64).wrapping_mul(FNV1A_PRIME);
        i += 1;
    }
    h
}

/// FNV-1a 64 of `bytes`. Not a cryptographic hash: it tells inputs apart, it does not resist an
/// adversary.
#[inline]
#[must_use]
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_extend(FNV1A_OFFSET, bytes)
}

// ---------------------------------------------------------------------------------------------
// Seconds ↔ nanoseconds. Time is integer nanoseconds everywhere ([`crate::Time`]); a duration
// in seconds becomes nanoseconds by one of three roundings, chosen by what the value is for,
// and each is one function here.

/// Nanoseconds per second, as the conversions multiply and divide by it.
pub const NANOS_PER_SEC: f64 = 1e9;

/// `secs` seconds as whole nanoseconds, rounded to the nearest (half away from zero); negative
/// and NaN give 0, beyond `u64::MAX` (infinity included) saturates. Configured durations, trace
/// offsets and recorded latencies.
#[inline]
#[must_use]
pub fn secs_to_nanos(secs: f64) -> u64 {
    round_nanos(secs * NANOS_PER_SEC)
}

/// `secs` seconds as whole nanoseconds, rounded up (negative and NaN give 0, saturating): an
/// engine's step or event that must not come before the time it needs.
#[inline]
#[must_use]
pub fn secs_to_nanos_ceil(secs: f64) -> u64 {
    ceil_nanos(secs * NANOS_PER_SEC)
}

/// `secs` seconds as whole nanoseconds, truncated toward zero (negative and NaN give 0,
/// saturating). Kept for the engines' noise epoch length, which has always been truncated: every
/// output with engine noise depends on it.
#[inline]
#[must_use]
pub fn secs_to_nanos_truncating(secs: f64) -> u64 {
    truncate_nanos(secs * NANOS_PER_SEC)
}

/// Whole nanoseconds as seconds (`ns / 1e9`, the division rather than a product with 1e-9,
/// which rounds differently).
#[inline]
#[must_use]
pub fn nanos_to_secs(ns: u64) -> f64 {
    ns as f64 / NANOS_PER_SEC
}

/// A time in fractional nanoseconds rounded to the nearest whole one (half away from zero);
/// negative and NaN give 0, saturating. Equal to `ns.round().max(0.0) as u64` without libm's
/// call.
#[inline]
#[must_use]
pub fn round_nanos(ns: f64) -> u64 {
    if ns > 0.0 {
        // `as` truncates and saturates.
        let whole = ns as u64;
        whole.saturating_add(u64::from(ns - whole as f64 >= 0.5))
    } else {
        0
    }
}

/// A time in fractional nanoseconds rounded up to a whole one; negative and NaN give 0,
/// saturating at `u64::MAX`. Equal to `ns.ceil() as u64` without libm's call: below 2^63 the
/// signed conversions do it (one instruction each way, where the unsigned ones are a dozen on
/// the baseline x86-64 target); from there `ns` is whole and the unsigned `as` saturates. On
/// the simulator's event path.
#[inline]
#[must_use]
pub fn ceil_nanos(ns: f64) -> u64 {
    if ns < I64_LIMIT {
        let whole = ns as i64;
        (if (whole as f64) < ns {
            whole + 1
        } else {
            whole
        })
        .max(0) as u64
    } else {
        // `as` truncates and saturates, a whole `ns` stays (NaN gives 0)
        let whole = ns as u64;
        if (whole as f64) < ns {
            whole.saturating_add(1)
        } else {
            whole
        }
    }
}

/// A time in fractional nanoseconds truncated toward zero (`as`: negative and NaN give 0,
/// saturating). The open-loop generators' clocks, which keep absolute time in `f64` ns and have
/// always truncated it: every synthetic arrival time depends on it.
#[inline]
#[must_use]
pub fn truncate_nanos(ns: f64) -> u64 {
    ns as u64
}

/// 2^63, the first `f64` a signed 64-bit conversion saturates at.
const I64_LIMIT: f64 = 9_223_372_036_854_775_808.0;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn stream_numbers_are_pinned_and_apart() {
        // Pinned: every bundled output depends on these numbers.
        assert_eq!(
            [
                ROUTER_STREAM,
                TRAFFIC_STREAM,
                ENGINE_STREAM,
                RESAMPLE_STREAM,
                SPLIT_STREAM,
                REPLICA_STREAM,
            ],
            [1, 100, 1000, 1 << 36, (1 << 40) - 1, 1 << 40]
        );
        assert_eq!(
            (ENGINE_EPOCH_SALT, CONVERSATION_SALT),
            (0xE90C, 0x5EED_C0A7_0000_0001)
        );
        // Each indexed stream's range, [start, start + room), as far as the next one begins:
        // 900 traffic sources, 2^36 − 1000 workers, 2^40 − 1 − 2^36 trace sources, then the
        // split and the replicas (at most 64 of them).
        let ranges = [
            (ROUTER_STREAM, 1),
            (TRAFFIC_STREAM, TRAFFIC_STREAM_ROOM),
            (ENGINE_STREAM, RESAMPLE_STREAM - ENGINE_STREAM),
            (RESAMPLE_STREAM, SPLIT_STREAM - RESAMPLE_STREAM),
            (SPLIT_STREAM, 1),
            (REPLICA_STREAM, 64),
        ];
        for pair in ranges.windows(2) {
            let ((a, room), (b, _)) = (pair[0], pair[1]);
            assert!(a + room <= b, "stream {a} (+{room}) runs into stream {b}");
        }
        let salts = [ENGINE_EPOCH_SALT, CONVERSATION_SALT];
        assert_ne!(salts[0], salts[1]);
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // FNV-1a 64 of "" and "a" and "foobar" (the FNV authors' test suite).
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        // A chain continued piecewise is the hash of the whole.
        assert_eq!(fnv1a_extend(fnv1a(b"foo"), b"bar"), fnv1a(b"foobar"));
    }

    #[test]
    fn conversions_round_as_named() {
        assert_eq!(secs_to_nanos(1.5), 1_500_000_000);
        assert_eq!(round_nanos(2.5), 3, "half away from zero");
        assert_eq!(secs_to_nanos(-1.0), 0);
        assert_eq!(secs_to_nanos(f64::NAN), 0);
        assert_eq!(secs_to_nanos(f64::INFINITY), u64::MAX);
        assert_eq!(secs_to_nanos_ceil(1.2e-9), 2);
        assert_eq!(secs_to_nanos_ceil(-0.3), 0);
        assert_eq!(secs_to_nanos_truncating(1.9e-9), 1);
        assert_eq!(secs_to_nanos_truncating(-0.3), 0);
        assert_eq!(nanos_to_secs(1_500_000_000), 1.5);
        assert_eq!(ceil_nanos(0.5), 1);
        assert_eq!(ceil_nanos(f64::INFINITY), u64::MAX);
        assert_eq!(ceil_nanos(f64::NAN), 0);
    }

    /// The rounding the histograms have always done, which `round_nanos` must equal exactly.
    fn library_round(ns: f64) -> u64 {
        ns.round().max(0.0) as u64
    }

    /// The library's ceiling (what the engines' step times always used; the fluid engine's own
    /// libm-free ceiling was tested equal to it), which `ceil_nanos` must equal exactly.
    fn library_ceil(x: f64) -> u64 {
        x.ceil() as u64
    }

    #[test]
    fn nanos_roundings_equal_the_library_ones_at_the_edges() {
        let below_limit = f64::from_bits(I64_LIMIT.to_bits() - 1);
        for x in [
            0.0,
            -0.0,
            0.25,
            0.499_999_999_999_999_94,
            0.5,
            1.0,
            1.5,
            2.5,
            1e9,
            4_503_599_627_370_495.5,
            4_503_599_627_370_496.0,
            9_007_199_254_740_993.0,
            below_limit,
            I64_LIMIT,
            1.5e19,
            18_446_744_073_709_549_568.0,
            18_446_744_073_709_551_616.0,
            1e30,
            f64::MAX,
            f64::INFINITY,
            f64::MIN_POSITIVE,
            -0.25,
            -0.5,
            -1.5,
            -7.0,
            -1e30,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            assert_eq!(round_nanos(x), library_round(x), "{x:e}");
            assert_eq!(ceil_nanos(x), library_ceil(x), "{x:e}");
        }
    }

    proptest! {
        /// Over every bit pattern of a double (so every sign, exponent and fraction).
        #[test]
        fn nanos_roundings_equal_the_library_ones(bits in any::<u64>()) {
            let x = f64::from_bits(bits);
            prop_assert_eq!(round_nanos(x), library_round(x));
            prop_assert_eq!(ceil_nanos(x), library_ceil(x));
        }

        /// Over the seconds a latency histogram sees, with fractions of a nanosecond.
        #[test]
        fn secs_to_nanos_equals_the_library_rounding_on_latencies(secs in 0.0f64..1e6) {
            prop_assert_eq!(secs_to_nanos(secs), library_round(secs * 1e9));
        }

        /// Over the times an engine's events fall at.
        #[test]
        fn ceil_nanos_equals_the_library_ceiling_on_event_scales(x in 0.0f64..1e15) {
            prop_assert_eq!(ceil_nanos(x), library_ceil(x));
        }
    }
}
