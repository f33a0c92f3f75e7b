//! Bounded-memory log-bucketed latency histogram.
//!
//! Values are **`u64` nanoseconds** (the simulator's time unit); `*_secs` helpers convert from
//! and to `f64` seconds. The bucketing is log-linear (as in HdrHistogram): values below 128 ns
//! are counted exactly, and every power-of-two range `[2^e, 2^(e+1))` above is split into 64
//! equal buckets, so consecutive bucket bounds grow by a factor of at most 1 + 1/64 ≈ 1.0156.
//! A quantile is reported as the middle of its bucket (clamped to the observed min/max), giving
//! a **relative error ≤ 1/128 ≈ 0.78 %** over the whole `u64` range (1 µs … 1 day and beyond).
//!
//! `record` is O(1) (a leading-zeros count and a shift). Memory grows with the largest value
//! recorded, at most 3 776 counters (≈ 30 KiB; ≈ 21 KiB for values up to a day).
//! `quantile` walks the buckets (O(buckets)) by the rule every histogram shares
//! ([`routelab_policies::histogram`]). `mean`, `count`, `min`, `max` are exact.

use routelab_policies::histogram::{bucket_at_rank, nearest_rank};
use routelab_policies::streams::{NANOS_PER_SEC, nanos_to_secs, secs_to_nanos};
use std::fmt;

/// Mantissa bits: 2^6 = 64 buckets per power of two.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this are their own bucket.
const EXACT: u64 = 2 * SUB;
/// Number of buckets needed for the whole `u64` range.
const MAX_BUCKETS: usize = bucket_index(u64::MAX) + 1;

/// Bucket of `v`.
#[inline]
const fn bucket_index(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let shift = e - SUB_BITS;
    let mantissa = v >> shift; // in [SUB, 2 SUB)
    (EXACT + (shift as u64 - 1) * SUB + (mantissa - SUB)) as usize
}

/// Smallest value and width of bucket `i`.
#[inline]
const fn bucket_bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < EXACT {
        return (i, 1);
    }
    let shift = (i - EXACT) / SUB + 1;
    let mantissa = SUB + (i - EXACT) % SUB;
    (mantissa << shift, 1 << shift)
}

/// Below this many nanoseconds (2^50, 13 days) `ns` taken to seconds and back,
/// `round_nanos(ns as f64 / 1e9 * 1e9)`, is `ns` again: `ns` is exact as a double, and the
/// division's and the product's roundings (each a relative error of at most 2^-53) move it by
/// less than `ns` · 2^-52 < 1/4 ns, which the rounding to whole nanoseconds removes.
const EXACT_SECS_NS: u64 = 1 << 50;

/// Log-linear histogram of `u64` nanosecond values with ≤ 0.78 % relative quantile error.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max())
            .finish()
    }
}

impl Histogram {
    /// Upper bound of the relative error of [`Histogram::quantile`].
    pub const MAX_RELATIVE_ERROR: f64 = 1.0 / (2 * SUB) as f64;

    /// An empty histogram.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            counts: Vec::new(),
            count: 0,
            sum: 0,
            min: 0,
            max: 0,
        }
    }

    /// Record one value (ns). Always inlined, as [`Histogram::record_n`].
    #[inline(always)]
    pub fn record(&mut self, ns: u64) {
        self.record_n(ns, 1);
    }

    /// Record `n` occurrences of a value (ns). Always inlined: a run records five latencies
    /// per request, and a call costs about as much as the recording (left to itself, the
    /// compiler inlines it in some builds and not in others).
    #[inline(always)]
    pub fn record_n(&mut self, ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        let i = bucket_index(ns);
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += n;
        if self.count == 0 {
            self.min = ns;
            self.max = ns;
        } else {
            self.min = self.min.min(ns);
            self.max = self.max.max(ns);
        }
        self.count += n;
        self.sum += u128::from(ns) * u128::from(n);
    }

    /// Record a value in seconds (negative and NaN count as 0; rounded to the nanosecond).
    #[inline]
    pub fn record_secs(&mut self, secs: f64) {
        self.record_secs_n(secs, 1);
    }

    /// Record `n` occurrences of a value in seconds (a weighted sample: e.g. one request's
    /// mean inter-token latency once per gap between its tokens). Negative and NaN count as 0.
    #[inline]
    pub fn record_secs_n(&mut self, secs: f64, n: u64) {
        self.record_n(secs_to_nanos(secs), n);
    }

    /// Record a duration of `ns` nanoseconds taken as seconds: exactly what
    /// `record_secs(ns as f64 / 1e9)` records, without the round trip through a double below
    /// [`EXACT_SECS_NS`] (where it gives `ns` back). Always inlined: a call per latency costs
    /// about as much as recording it.
    #[inline(always)]
    pub fn record_secs_of_ns(&mut self, ns: u64) {
        if ns < EXACT_SECS_NS {
            self.record(ns);
        } else {
            self.record_secs(nanos_to_secs(ns));
        }
    }

    /// Number of recorded values.
    #[must_use]
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// True when nothing was recorded.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Exact sum of the recorded values, ns.
    #[must_use]
    pub const fn sum(&self) -> u128 {
        self.sum
    }

    /// Smallest recorded value (exact), ns.
    #[must_use]
    pub const fn min(&self) -> Option<u64> {
        if self.count == 0 {
            None
        } else {
            Some(self.min)
        }
    }

    /// Largest recorded value (exact), ns.
    #[must_use]
    pub const fn max(&self) -> Option<u64> {
        if self.count == 0 {
            None
        } else {
            Some(self.max)
        }
    }

    /// Exact mean, ns.
    #[must_use]
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// Exact mean, seconds.
    #[must_use]
    pub fn mean_secs(&self) -> Option<f64> {
        self.mean().map(|ns| ns / NANOS_PER_SEC)
    }

    /// Nearest-rank quantile, ns: an estimate (relative error ≤
    /// [`MAX_RELATIVE_ERROR`](Self::MAX_RELATIVE_ERROR)) of the smallest recorded value `v` with
    /// at least `ceil(q · count)` values ≤ `v`. `q ≤ 0` gives the exact minimum, `q ≥ 1` the
    /// exact maximum. `None` when empty or `q` is NaN.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 || q.is_nan() {
            return None;
        }
        if q <= 0.0 {
            return Some(self.min);
        }
        if q >= 1.0 {
            return Some(self.max);
        }
        let rank = nearest_rank(q, self.count);
        let Some(i) = bucket_at_rank(&self.counts, rank) else {
            return Some(self.max);
        };
        let (lo, width) = bucket_bounds(i);
        let mid = lo + (width - 1) / 2;
        Some(mid.clamp(self.min, self.max))
    }

    /// [`quantile`](Self::quantile) in seconds.
    #[must_use]
    pub fn quantile_secs(&self, q: f64) -> Option<f64> {
        self.quantile(q).map(nanos_to_secs)
    }

    /// Add all values of `other` to `self`.
    pub fn merge(&mut self, other: &Self) {
        if other.count == 0 {
            return;
        }
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        if self.count == 0 {
            self.min = other.min;
            self.max = other.max;
        } else {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
        }
        self.count += other.count;
        self.sum += other.sum;
    }

    /// Forget all values (keeps the allocation).
    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.count = 0;
        self.sum = 0;
        self.min = 0;
        self.max = 0;
    }

    /// Non-empty buckets as `(lowest value, highest value, count)`, ascending, ns.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, &c)| {
                let (lo, w) = bucket_bounds(i);
                (lo, lo + (w - 1), c)
            })
    }

    /// Counters allocated (memory is `8 ×` this many bytes, at most 3 776 counters).
    #[must_use]
    pub fn allocated_buckets(&self) -> usize {
        self.counts.len()
    }
}

const _: () = assert!(MAX_BUCKETS == 3776);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngExt, SeedableRng};
    use routelab_policies::streams::round_nanos;

    /// The seconds round trip `record_secs_of_ns` skips, and the edges around its bound.
    fn via_secs(ns: u64) -> Histogram {
        let mut h = Histogram::new();
        h.record_secs(ns as f64 / 1e9);
        h
    }

    #[test]
    fn recording_ns_as_secs_equals_the_round_trip_at_the_edges() {
        let b = EXACT_SECS_NS;
        for ns in [
            0,
            1,
            127,
            128,
            999_999_999,
            b - 2,
            b - 1,
            b,
            b + 1,
            1 << 53,
            u64::MAX,
        ] {
            let mut h = Histogram::new();
            h.record_secs_of_ns(ns);
            assert_eq!(h, via_secs(ns), "{ns}");
        }
        // Far enough beyond the bound the round trip moves a value: the fallback is needed.
        let odd = (1 << 53) + 1;
        assert_ne!(round_nanos(odd as f64 / 1e9 * 1e9), odd);
    }

    proptest! {
        /// Below the bound (every magnitude) and above it, the same counts, sum, min and max.
        #[test]
        fn recording_ns_as_secs_equals_the_round_trip(
            ns in prop_oneof![0u64..EXACT_SECS_NS, (0u32..64).prop_flat_map(|e| 0..=(u64::MAX >> e))]
        ) {
            let mut h = Histogram::new();
            h.record_secs_of_ns(ns);
            prop_assert_eq!(h, via_secs(ns));
        }
    }

    const US: u64 = 1_000;
    const DAY: u64 = 86_400 * 1_000_000_000;

    fn exact(sorted: &[u64], q: f64) -> u64 {
        let n = sorted.len() as u64;
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        sorted[(rank - 1) as usize]
    }

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut prev_end = 0;
        for i in 0..MAX_BUCKETS {
            let (lo, w) = bucket_bounds(i);
            assert_eq!(lo, prev_end, "bucket {i}");
            assert_eq!(bucket_index(lo), i);
            assert_eq!(bucket_index(lo + (w - 1)), i);
            if w > 1 {
                // Exact buckets (width 1) need no bound.
                assert!(
                    (lo as f64 + w as f64) / lo as f64 <= 1.0 + 1.0 / 64.0 + 1e-12,
                    "growth at {i}"
                );
            }
            prev_end = lo.wrapping_add(w);
        }
        assert_eq!(prev_end, 0, "last bucket ends at u64::MAX");
        assert!(bucket_index(DAY) < 2700);
    }

    #[test]
    fn quantiles_within_one_percent_on_random_data() {
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(42);
        let qs = [
            0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0,
        ];
        // Log-uniform over 1 µs .. 1 day, and a narrow lognormal-ish cluster.
        let datasets: [Vec<u64>; 2] = [
            (0..200_000)
                .map(|_| {
                    let x: f64 = rng.random::<f64>() * ((DAY / US) as f64).ln();
                    (US as f64 * x.exp()) as u64
                })
                .collect(),
            (0..50_000)
                .map(|_| 40_000_000 + rng.random_range(0..5_000_000u64))
                .collect(),
        ];
        for data in datasets {
            let mut h = Histogram::new();
            data.iter().for_each(|&v| h.record(v));
            let mut sorted = data.clone();
            sorted.sort_unstable();
            for q in qs {
                let (got, want) = (h.quantile(q).unwrap(), exact(&sorted, q));
                let err = (got as f64 - want as f64).abs() / want as f64;
                assert!(err <= 0.01, "q={q}: got {got}, exact {want}, err {err}");
                assert!(
                    err <= Histogram::MAX_RELATIVE_ERROR + 1e-12,
                    "q={q}: err {err}"
                );
            }
            let mean = data.iter().map(|&v| u128::from(v)).sum::<u128>() as f64 / data.len() as f64;
            assert!((h.mean().unwrap() - mean).abs() <= mean * 1e-12);
            assert_eq!(h.min(), sorted.first().copied());
            assert_eq!(h.max(), sorted.last().copied());
            assert_eq!(h.count(), data.len() as u64);
            assert!(h.allocated_buckets() <= 2700);
        }
    }

    #[test]
    fn small_values_are_exact_and_empty_is_none() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.mean(), None);
        for v in [3, 1, 2, 100, 127] {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), Some(3));
        assert_eq!(h.quantile(0.8), Some(100));
        assert_eq!(h.quantile(f64::NAN), None);
        h.record_secs(0.25);
        assert_eq!(h.max(), Some(250_000_000));
        assert!((h.quantile_secs(1.0).unwrap() - 0.25).abs() < 1e-12);
        h.clear();
        assert!(h.is_empty());
        assert_eq!(h.quantile(0.5), None);
    }

    #[test]
    fn a_weighted_record_counts_like_repeated_records() {
        let mut weighted = Histogram::new();
        weighted.record_secs_n(0.02, 9);
        weighted.record_secs_n(0.5, 1);
        weighted.record_secs_n(7.0, 0);
        let mut repeated = Histogram::new();
        for _ in 0..9 {
            repeated.record_secs(0.02);
        }
        repeated.record_secs(0.5);
        assert_eq!(weighted, repeated);
        assert_eq!(weighted.count(), 10);
        // The weight moves the quantiles: 9 of 10 values are 20 ms.
        assert_eq!(weighted.quantile_secs(0.9), repeated.quantile_secs(0.9));
        assert!((weighted.quantile_secs(0.9).unwrap() - 0.02).abs() < 0.02 / 64.0);
        assert_eq!(
            weighted.max(),
            Some(500_000_000),
            "a zero weight records nothing"
        );
        assert!((weighted.mean_secs().unwrap() - (0.18 + 0.5) / 10.0).abs() < 1e-12);
    }

    #[test]
    fn merge_equals_recording_everything() {
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(7);
        let (mut a, mut b, mut all) = (Histogram::new(), Histogram::new(), Histogram::new());
        for i in 0..10_000 {
            let v = rng.random_range(0..DAY);
            if i % 3 == 0 {
                a.record(v)
            } else {
                b.record(v)
            }
            all.record(v);
        }
        let mut m = a.clone();
        m.merge(&b);
        let mut m2 = Histogram::new();
        m2.merge(&b);
        m2.merge(&a);
        assert_eq!(m.count(), all.count());
        assert_eq!(m.sum(), all.sum());
        for q in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
            assert_eq!(m.quantile(q), all.quantile(q));
            assert_eq!(m2.quantile(q), all.quantile(q));
        }
        assert_eq!((m.min(), m.max()), (all.min(), all.max()));
        assert_eq!(m.buckets().map(|b| b.2).sum::<u64>(), all.count());
    }

    proptest! {
        #[test]
        fn quantiles_are_monotone(values in prop::collection::vec(any::<u64>(), 1..300),
                                  mut qs in prop::collection::vec(0.0f64..=1.0, 2..20)) {
            let mut h = Histogram::new();
            values.iter().for_each(|&v| h.record(v));
            qs.sort_by(f64::total_cmp);
            let got: Vec<u64> = qs.iter().map(|&q| h.quantile(q).unwrap()).collect();
            prop_assert!(got.windows(2).all(|w| w[0] <= w[1]), "{:?} -> {:?}", qs, got);
            prop_assert!(got.iter().all(|&g| g >= h.min().unwrap() && g <= h.max().unwrap()));
        }

        #[test]
        fn quantile_error_is_bounded(values in prop::collection::vec(1u64..(1 << 50), 1..300),
                                     q in 0.0f64..=1.0) {
            let mut h = Histogram::new();
            values.iter().for_each(|&v| h.record(v));
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let (got, want) = (h.quantile(q).unwrap(), exact(&sorted, q));
            let err = (got as f64 - want as f64).abs() / want as f64;
            prop_assert!(err <= Histogram::MAX_RELATIVE_ERROR + 1e-12, "got {} want {}", got, want);
        }
    }
}
