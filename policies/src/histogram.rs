//! How a bucketed histogram reads a quantile: the one rule behind the simulator's latency
//! percentiles (`routelab_sim::Histogram::quantile`) and the live strategy's median request
//! speed (`weights::live`).
//!
//! Both answer "the nearest-rank quantile": the smallest value with at least ⌈q · n⌉ of the
//! `n` recorded values at or below it, read as the first bucket whose cumulative count reaches
//! that rank. They differ only in their buckets (log-linear nanoseconds with exact min/max;
//! 2 % geometric speeds), which is why the buckets stay with each. The gateway's Prometheus
//! histogram reads no quantile: it exposes its cumulative counts, and the reader computes one.

/// The nearest rank of quantile `q` among `count` values: ⌈q · count⌉, at least 1 and at most
/// `count` (for `0 < q < 1`; `count > 0`).
#[inline]
#[must_use]
pub fn nearest_rank(q: f64, count: u64) -> u64 {
    ((q * count as f64).ceil() as u64).clamp(1, count)
}

/// The first bucket whose cumulative count reaches `rank`, or `None` when all of `counts`
/// together stay below it.
#[inline]
#[must_use]
pub fn bucket_at_rank<C: Copy + Into<u64>>(counts: &[C], rank: u64) -> Option<usize> {
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        seen += c.into();
        if seen >= rank {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_rank_is_half_the_count_rounded_up() {
        for n in 1..1000u64 {
            assert_eq!(nearest_rank(0.5, n), n.div_ceil(2), "{n}");
        }
        assert_eq!(nearest_rank(0.99, 100), 99);
        assert_eq!(nearest_rank(0.999, 100), 100);
        assert_eq!(nearest_rank(1e-9, 100), 1);
    }

    #[test]
    fn the_rank_falls_in_the_first_bucket_that_reaches_it() {
        let counts: [u32; 5] = [0, 2, 0, 3, 1];
        assert_eq!(bucket_at_rank(&counts, 1), Some(1));
        assert_eq!(bucket_at_rank(&counts, 2), Some(1));
        assert_eq!(bucket_at_rank(&counts, 3), Some(3));
        assert_eq!(bucket_at_rank(&counts, 6), Some(4));
        assert_eq!(bucket_at_rank(&counts, 7), None);
        assert_eq!(bucket_at_rank::<u64>(&[], 1), None);
    }
}
