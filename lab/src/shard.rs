//! `--shard K/N`: which deterministic slice of a command's job list one process runs.
//!
//! K counts from 1 (as Playwright's and Jest's `--shard` do), so a scheduler whose task index
//! starts at 0 (a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX`) passes `index + 1`, and a Slurm
//! array declared `--array=1-N` passes `SLURM_ARRAY_TASK_ID` as it is. Units are dealt round
//! robin (unit `u` belongs to shard `u % N + 1`), so shards get similar mixes of scenarios.

use routelab_policies::InputError;
use std::fmt;

/// The largest shard count accepted (far more than any job list needs; it bounds the merge's
/// bookkeeping).
pub const MAX_SHARDS: u32 = 10_000;

/// One shard of `count`: `index` is in `1..=count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// The whole job in one process (`1/1`).
    pub const WHOLE: Shard = Shard { index: 1, count: 1 };

    /// Shard `index` of `count`; `None` unless `1 <= index <= count <= MAX_SHARDS`.
    pub fn new(index: u32, count: u32) -> Option<Shard> {
        (index >= 1 && index <= count && count <= MAX_SHARDS).then_some(Shard { index, count })
    }

    /// K, from 1.
    pub fn index(self) -> u32 {
        self.index
    }

    /// N.
    pub fn count(self) -> u32 {
        self.count
    }

    /// Whether unit `unit` (0-based position in the command's deterministic unit list) is this
    /// shard's to run.
    pub fn owns(self, unit: usize) -> bool {
        unit % self.count as usize == (self.index - 1) as usize
    }

    /// Parse `K/N` as given to `flag` (e.g. `--shard`), with a located error saying what would
    /// be valid.
    pub fn parse(text: &str, file: &str, flag: &str) -> Result<Shard, InputError> {
        let bad = |why: String| {
            InputError::new(file, flag, why).valid(format!(
                "K/N with whole numbers 1 <= K <= N <= {MAX_SHARDS}, e.g. 2/7"
            ))
        };
        let Some((k, n)) = text.trim().split_once('/') else {
            return Err(bad(format!("`{text}` is not of the form K/N")));
        };
        let (Ok(k), Ok(n)) = (k.trim().parse::<u32>(), n.trim().parse::<u32>()) else {
            return Err(bad(format!("`{text}`: K and N must be whole numbers")));
        };
        Shard::new(k, n).ok_or_else(|| {
            bad(format!(
                "`{text}`: shard {k} of {n} does not exist (shards count from 1)"
            ))
        })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_k_of_n_from_one() {
        let s = Shard::parse("2/7", "command line", "--shard").unwrap();
        assert_eq!((s.index(), s.count()), (2, 7));
        assert_eq!(s.to_string(), "2/7");
        assert_eq!(
            Shard::parse(" 1 / 1 ", "command line", "--shard").unwrap(),
            Shard::WHOLE
        );
    }

    #[test]
    fn refuses_what_is_not_a_shard_and_says_what_is() {
        for (text, says) in [
            ("0/3", "count from 1"),
            ("4/3", "does not exist"),
            ("3", "form K/N"),
            ("a/3", "whole numbers"),
            ("1/-2", "whole numbers"),
            ("1/10001", "does not exist"),
        ] {
            let e = Shard::parse(text, "command line", "--shard").unwrap_err();
            assert_eq!(e.field, "--shard", "{text}");
            let shown = e.to_string();
            assert!(shown.contains(says), "{text}: {shown}");
            assert!(shown.contains("1 <= K <= N"), "{text}: {shown}");
        }
    }

    #[test]
    fn every_unit_belongs_to_exactly_one_shard() {
        for n in [1u32, 2, 3, 7] {
            for unit in 0..50 {
                let owners = (1..=n)
                    .filter(|&k| Shard::new(k, n).unwrap().owns(unit))
                    .count();
                assert_eq!(owners, 1, "unit {unit} of {n} shards");
            }
        }
    }
}
