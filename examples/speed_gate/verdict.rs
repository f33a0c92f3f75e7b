//! The gate's one comparison: a measured count against its reference and the tolerance.

/// How a count compares with its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the tolerance either way.
    Within,
    /// Above the reference by more than the tolerance: the gate fails.
    Slower,
    /// Below the reference by more than the tolerance: the gate passes and says that new
    /// references would lock the gain in.
    Faster,
}

/// A comparison's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    /// The measured count's change from the reference, in percent.
    pub change_percent: f64,
    /// What the gate makes of it.
    pub verdict: Verdict,
}

/// Compare `measured` with `reference` (both instruction counts over the same units) under a
/// tolerance of `tolerance_percent` (exactly at the tolerance is within).
pub fn judge(measured: u64, reference: u64, tolerance_percent: f64) -> Judged {
    // Counts stay far below 2^53, so these are exact; the allowance is the only rounding.
    let (measured, reference) = (measured as f64, reference as f64);
    let allowance = reference * tolerance_percent / 100.0;
    let verdict = if measured - reference > allowance {
        Verdict::Slower
    } else if reference - measured > allowance {
        Verdict::Faster
    } else {
        Verdict::Within
    };
    Judged {
        change_percent: (measured - reference) / reference * 100.0,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_percent_more_fails_a_one_percent_gate() {
        // A count inflated by 5 % over today's fleet-64 reference.
        let reference = 515_843_547u64;
        let inflated = reference + reference / 20;
        let j = judge(inflated, reference, 1.0);
        assert_eq!(j.verdict, Verdict::Slower);
        assert!(
            (j.change_percent - 5.0).abs() < 1e-6,
            "{}",
            j.change_percent
        );
        // …and a 2 % budget catches it too.
        assert_eq!(judge(inflated, reference, 2.0).verdict, Verdict::Slower);
    }

    #[test]
    fn the_tolerance_is_the_edge() {
        let reference = 1_000_000u64;
        assert_eq!(judge(reference, reference, 1.0).verdict, Verdict::Within);
        assert_eq!(judge(1_010_000, reference, 1.0).verdict, Verdict::Within);
        assert_eq!(judge(1_010_001, reference, 1.0).verdict, Verdict::Slower);
        assert_eq!(judge(990_000, reference, 1.0).verdict, Verdict::Within);
        assert_eq!(judge(989_999, reference, 1.0).verdict, Verdict::Faster);
        // the run-to-run variation measured (a few thousand in hundreds of millions) is
        // far inside a 1 % tolerance
        assert_eq!(
            judge(515_843_547 + 25_000, 515_843_547, 1.0).verdict,
            Verdict::Within
        );
    }
}
