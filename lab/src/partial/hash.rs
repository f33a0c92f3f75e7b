//! The content hash a partial result carries: FNV-1a (64 bits) over the inputs' bytes in a fixed
//! order and the canonical options, so shards made from different inputs never merge.
//!
//! FNV-1a is not a cryptographic hash; it guards against mistakes (a changed scenario, another
//! option), not against an adversary, which is all a merge needs.

use routelab_policies::streams::{FNV1A_OFFSET, fnv1a_extend};
use routelab_sim::{HardwareProfile, Scenario, TrafficSpec};
use std::collections::{BTreeSet, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file an input hash could not read.
#[derive(Debug, thiserror::Error)]
#[error("{file}: cannot read for the inputs' hash: {source}")]
pub struct HashReadError {
    /// The file.
    pub file: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// Builds the 64-bit FNV-1a hash of a command's inputs. Every item is its bytes, their length,
/// then its tag and the tag's length, so the sequence of items reads back unambiguously from
/// the end (moving bytes from one item to the next changes the hash), and a file can be
/// streamed without knowing its length first. A file (by path) and a hardware profile (by
/// content) are hashed once per command, however many scenarios or grid points read them.
#[derive(Debug, Clone)]
pub struct InputsHash {
    state: u64,
    files: HashSet<PathBuf>,
    profiles: HashSet<String>,
}

impl Default for InputsHash {
    fn default() -> Self {
        InputsHash {
            state: FNV1A_OFFSET,
            files: HashSet::new(),
            profiles: HashSet::new(),
        }
    }
}

impl InputsHash {
    /// Nothing hashed yet.
    pub fn new() -> InputsHash {
        InputsHash::default()
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.state = fnv1a_extend(self.state, bytes);
    }

    fn end_item(&mut self, tag: &str, len: u64) {
        self.raw(&len.to_le_bytes());
        self.raw(tag.as_bytes());
        self.raw(&(tag.len() as u64).to_le_bytes());
    }

    /// Hash one tagged item.
    pub fn item(&mut self, tag: &str, bytes: &[u8]) -> &mut Self {
        self.raw(bytes);
        self.end_item(tag, bytes.len() as u64);
        self
    }

    /// Hash the text of file `path` as the caller read (and parsed) it, so the hash is of the
    /// very bytes the results come from; the path is then not read again.
    pub fn text(&mut self, path: &Path, bytes: &[u8]) -> &mut Self {
        if self.files.insert(path.to_path_buf()) {
            self.item(&path.display().to_string(), bytes);
        }
        self
    }

    /// Hash a file's bytes, streamed (tagged with its path as given); a path already hashed is
    /// skipped.
    pub fn file(&mut self, path: &Path) -> Result<&mut Self, HashReadError> {
        if !self.files.insert(path.to_path_buf()) {
            return Ok(self);
        }
        let failed = |source| HashReadError {
            file: path.to_path_buf(),
            source,
        };
        let mut reader = std::fs::File::open(path).map_err(failed)?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut len = 0u64;
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.raw(&buf[..n]);
                    len += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(e)),
            }
        }
        self.end_item(&path.display().to_string(), len);
        Ok(self)
    }

    /// Hash what a validated scenario read besides its own file (whose text the caller hashes
    /// with [`InputsHash::text`] as it parses it): the resolved hardware profiles, in a fixed
    /// order, and the trace files.
    pub fn scenario_reads(&mut self, scenario: &Scenario) -> Result<&mut Self, HashReadError> {
        // Workers of one fleet entry share their profile; render each distinct one once.
        let mut seen = HashSet::new();
        let profiles: BTreeSet<String> = scenario
            .setup
            .workers
            .iter()
            .filter(|w| seen.insert(Arc::as_ptr(&w.profile)))
            .map(|w| profile_content(&w.profile))
            .collect();
        for p in profiles {
            if !self.profiles.contains(&p) {
                self.item("profile", p.as_bytes());
                self.profiles.insert(p);
            }
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
        self.state
    }
}

/// A profile's content without where it was read from: the same profile under another path
/// (another host's checkout) is the same input.
fn profile_content(profile: &HardwareProfile) -> String {
    format!("{profile:?}").replacen(&format!("origin: {:?}, ", profile.origin()), "", 1)
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

    #[test]
    fn a_streamed_file_hashes_as_its_bytes_once() {
        let dir = std::env::temp_dir().join(format!("routelab-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("input.txt");
        // Longer than one read buffer, so the streaming crosses chunks.
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let streamed = InputsHash::new().file(&path).unwrap().finish();
        let tag = path.display().to_string();
        assert_eq!(streamed, InputsHash::new().item(&tag, &bytes).finish());
        assert_eq!(streamed, InputsHash::new().text(&path, &bytes).finish());
        // The second mention of a path adds nothing.
        let mut twice = InputsHash::new();
        twice.file(&path).unwrap().file(&path).unwrap();
        assert_eq!(twice.finish(), streamed);
        let missing = InputsHash::new().file(&dir.join("absent")).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_hashes_the_same_from_any_path() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/hardware");
        let file = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "yaml"))
            .unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let here = HardwareProfile::from_yaml_str(&text, "/a/hardware/x.yaml").unwrap();
        let there = HardwareProfile::from_yaml_str(&text, "/b/other/x.yaml").unwrap();
        assert_eq!(profile_content(&here), profile_content(&there));
        assert!(!profile_content(&here).contains("/a/hardware"));
        // Its content still counts: another prefill rate is another input.
        let changed: String = text
            .lines()
            .map(|l| match l.starts_with("prefill_tok_s:") {
                true => "prefill_tok_s: 1234.5\n".to_string(),
                false => format!("{l}\n"),
            })
            .collect();
        let other = HardwareProfile::from_yaml_str(&changed, "/a/hardware/x.yaml").unwrap();
        assert_ne!(profile_content(&here), profile_content(&other));
    }
}
