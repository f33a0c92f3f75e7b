//! Mean and 95 % confidence interval across seeds (Student's t), and the paired interval of a
//! difference between two policies run on the same seeds (common random numbers).

use serde::{Deserialize, Serialize};

/// Two-sided 97.5 % quantiles of Student's t for 1..=30 degrees of freedom.
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// t(0.975, df): exact table up to 30, then the usual coarse steps, 1.96 in the limit.
pub fn t975(df: usize) -> Option<f64> {
    match df {
        0 => None,
        1..=30 => Some(T975[df - 1]),
        31..=40 => Some(2.021),
        41..=60 => Some(2.000),
        61..=120 => Some(1.980),
        _ => Some(1.960),
    }
}

/// Mean and 95 % interval of a sample (e.g. one metric across seeds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Number of values.
    pub n: usize,
    /// Sample mean.
    pub mean: f64,
    /// Sample standard deviation (`None` for one value).
    pub sd: Option<f64>,
    /// Half-width of the 95 % interval, `t(0.975, n-1) · sd / √n` (`None` for one value).
    pub half_width: Option<f64>,
}

impl Interval {
    /// Of the finite values of `xs`; `None` when there are none.
    pub fn of(xs: impl IntoIterator<Item = f64>) -> Option<Interval> {
        let xs: Vec<f64> = xs.into_iter().filter(|x| x.is_finite()).collect();
        let n = xs.len();
        if n == 0 {
            return None;
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Interval {
                n,
                mean,
                sd: None,
                half_width: None,
            });
        }
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        let sd = var.sqrt();
        let t = t975(n - 1).unwrap_or(1.96);
        Some(Interval {
            n,
            mean,
            sd: Some(sd),
            half_width: Some(t * sd / (n as f64).sqrt()),
        })
    }

    /// Lower end (the mean when the width is unknown).
    pub fn low(&self) -> f64 {
        self.mean - self.half_width.unwrap_or(0.0)
    }

    /// Upper end (the mean when the width is unknown).
    pub fn high(&self) -> f64 {
        self.mean + self.half_width.unwrap_or(0.0)
    }

    /// Whether the two intervals overlap (single values overlap only when equal).
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.low() <= other.high() && other.low() <= self.high()
    }
}

/// The paired comparison of two policies on the same seeds: the interval of the per-seed
/// differences `a[i] - b[i]` (only seeds where both are finite count). With common random
/// numbers the seed-to-seed noise both share cancels, so this interval is far narrower than the
/// two policies' own intervals, and it is the one a verdict may rest on.
pub fn paired_difference(a: &[f64], b: &[f64]) -> Option<Interval> {
    Interval::of(a.iter().zip(b).map(|(x, y)| x - y))
}

/// The paired interval of the per-seed ratios `a[i] / b[i]` (seeds where both are finite and
/// `b[i]` is not 0), for "how many times the baseline's capacity".
pub fn paired_ratio(a: &[f64], b: &[f64]) -> Option<Interval> {
    Interval::of(
        a.iter()
            .zip(b)
            .filter(|(_, y)| **y != 0.0)
            .map(|(x, y)| x / y),
    )
}

/// A paired difference (or ratio, against `null` = 1) is established when its 95 % interval
/// excludes `null`; one seed never establishes anything.
pub fn excludes(iv: &Interval, null: f64) -> bool {
    iv.half_width.is_some() && (iv.low() > null || iv.high() < null)
}

/// `--seeds auto`: add seeds until every reported paired difference is known to a stated
/// precision, or a maximum count is reached. Shared by `compare` and `capacity`; the rule's
/// parameters, stored with the results that report them (the rule itself is the lab's,
/// `routelab_lab::seeds::stop`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoSeeds {
    /// Seeds run before the first look (an interval needs at least two).
    pub start: usize,
    /// Seeds added between looks.
    pub step: usize,
    /// Never more seeds than this.
    pub max: usize,
    /// Stop when every difference's half-width is at most this fraction of the baseline's mean.
    pub rel_half_width: f64,
}

impl Default for AutoSeeds {
    fn default() -> AutoSeeds {
        AutoSeeds {
            start: 3,
            step: 2,
            max: 20,
            rel_half_width: 0.05,
        }
    }
}

/// Why a run stopped adding seeds (the report says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SeedStop {
    /// A fixed count was asked for (`--seeds N`).
    Fixed,
    /// Every difference's half-width fell below the stated fraction.
    Precise,
    /// The maximum count was reached first.
    MaxSeeds,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_matches_hand_computation() {
        // 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.303 → half-width 4.303/√3 = 2.4843.
        let i = Interval::of([1.0, 2.0, 3.0]).unwrap();
        assert_eq!(i.n, 3);
        assert!((i.mean - 2.0).abs() < 1e-12);
        assert!((i.sd.unwrap() - 1.0).abs() < 1e-12);
        assert!((i.half_width.unwrap() - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        let one = Interval::of([5.0, f64::NAN]).unwrap();
        assert_eq!((one.n, one.half_width), (1, None));
        assert_eq!(one.low(), 5.0);
        assert!(Interval::of([f64::NAN]).is_none());
        assert!(i.overlaps(&one) == (5.0 <= i.high()));
        assert_eq!(t975(0), None);
        assert_eq!(t975(1), Some(12.706));
        assert_eq!(t975(1000), Some(1.96));
    }

    #[test]
    fn paired_interval_cancels_shared_seed_noise() {
        // Seed noise (10, 20, 30) shared by both policies; b is always 1 lower.
        let a = [11.0, 21.0, 31.0];
        let b = [10.0, 20.0, 30.0];
        let d = paired_difference(&a, &b).unwrap();
        assert!((d.mean - 1.0).abs() < 1e-12);
        assert!(d.half_width.unwrap() < 1e-9);
        assert!(excludes(&d, 0.0));
        // Unpaired, the two intervals overlap: the win would not be established.
        assert!(Interval::of(a).unwrap().overlaps(&Interval::of(b).unwrap()));
        // A NaN seed drops out of the pairs; one pair establishes nothing.
        let one = paired_difference(&[f64::NAN, 2.0], &[1.0, 1.0]).unwrap();
        assert_eq!(one.n, 1);
        assert!(!excludes(&one, 0.0));
        let r = paired_ratio(&[2.0, 4.0, 6.0], &[1.0, 2.0, 0.0]).unwrap();
        assert_eq!(r.n, 2);
        assert!((r.mean - 2.0).abs() < 1e-12);
        assert!(excludes(&r, 1.0));
        assert!(!excludes(
            &paired_difference(&[1.0, 3.0], &[2.0, 2.0]).unwrap(),
            0.0
        ));
    }
}
