//! The content hash a partial result carries: FNV-1a (64 bits) over the inputs' bytes in a fixed
//! order and the canonical options, so shards made from different inputs never merge.
//!
//! FNV-1a is not a cryptographic hash; it guards against mistakes (a changed scenario, another
//! option), not against an adversary, which is all a merge needs.

use routelab_sim::{Scenario, TrafficSpec};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// A file an input hash could not read.
#[derive(Debug, thiserror::Error)]
#[error("{file}: cannot read for the inputs' hash: {source}")]
pub struct HashReadError {
    /// The file.
    pub file: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// Builds the 64-bit FNV-1a hash of a command's inputs. Every item is length-prefixed and
/// tagged, so moving bytes from one item to the next changes the hash.
#[derive(Debug, Clone)]
pub struct InputsHash(u64);

impl Default for InputsHash {
    fn default() -> Self {
        InputsHash(OFFSET)
    }
}

impl InputsHash {
    /// Nothing hashed yet.
    pub fn new() -> InputsHash {
        InputsHash::default()
    }

    fn raw(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Hash one tagged item.
    pub fn item(&mut self, tag: &str, bytes: &[u8]) -> &mut Self {
        for part in [tag.as_bytes(), bytes] {
            self.raw(&(part.len() as u64).to_le_bytes());
            self.raw(part);
        }
        self
    }

    /// Hash a file's bytes (tagged with its path as given).
    pub fn file(&mut self, path: &Path) -> Result<&mut Self, HashReadError> {
        let bytes = std::fs::read(path).map_err(|source| HashReadError {
            file: path.to_path_buf(),
            source,
        })?;
        Ok(self.item(&path.display().to_string(), &bytes))
    }

    /// Hash a scenario file's bytes and what it reads: its hardware profiles as resolved (a
    /// bundled profile has no file) and its trace files' bytes.
    pub fn scenario(&mut self, scenario: &Scenario) -> Result<&mut Self, HashReadError> {
        self.file(&scenario.path)?;
        self.scenario_reads(scenario)
    }

    /// Hash what a validated scenario read besides its own file (for `sweep`, whose grid
    /// points are made from one file): the resolved hardware profiles, in a fixed order, and
    /// the trace files.
    pub fn scenario_reads(&mut self, scenario: &Scenario) -> Result<&mut Self, HashReadError> {
        // Workers of one fleet entry share their profile; render each distinct one once.
        let mut seen = HashSet::new();
        let profiles: BTreeSet<String> = scenario
            .setup
            .workers
            .iter()
            .filter(|w| seen.insert(Arc::as_ptr(&w.profile)))
            .map(|w| format!("{:?}", w.profile))
            .collect();
        for p in &profiles {
            self.item("profile", p.as_bytes());
        }
        for t in &scenario.traffic {
            if let TrafficSpec::Trace { path, .. } = t {
                self.file(path)?;
            }
        }
        Ok(self)
    }

    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // FNV-1a 64 of "" and "a" (the reference vectors of the FNV authors' test suite).
        let mut h = InputsHash::new();
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        h.raw(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn items_are_delimited() {
        let a = InputsHash::new().item("x", b"ab").item("y", b"c").finish();
        let b = InputsHash::new().item("x", b"a").item("y", b"bc").finish();
        assert_ne!(a, b);
        assert_eq!(
            a,
            InputsHash::new().item("x", b"ab").item("y", b"c").finish()
        );
    }
}
