//! The state file: probe cache and admin pins, so a restart (even after SIGKILL) keeps them.
//!
//! Written atomically after every probe result and every pin/unpin: the JSON goes to a
//! temporary file in the same directory, which is fsynced and renamed over the state file, and
//! the directory is fsynced. A reader therefore sees the old file or the new one, never a torn
//! one. Timestamps are Unix milliseconds, so the cache TTL keeps counting across restarts.
//!
//! Several gateway replicas may share one state file (on one host or a shared volume). Each
//! write is a read-merge-write under an exclusive advisory lock on the sibling file
//! `<state>.lock` ([`save`]): the writer reads the current file, merges into it only what it
//! changed since its own last write ([`Changes`]), and replaces the file. So no replica
//! overwrites another's pins or measurements with its older view. The load at start takes no
//! lock: the atomic replace already guarantees a whole file, and a load changes nothing.

use crate::clock::Clock;
use routelab_policies::weights::{Clamp, PersistedProbeState, ProbeCacheEntry, ProbePin};
use routelab_policies::{PolicyConfig, WeightsConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    saved_at_unix_ms: i64,
    cache: Vec<CacheEntry>,
    pins: Vec<Pin>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CacheEntry {
    node: String,
    model: String,
    launch_args: String,
    throughput_tok_s: f64,
    measured_at_unix_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Pin {
    node: String,
    model: String,
    weight: f64,
}

/// The state file version this gateway writes and reads.
const VERSION: u32 = 1;

/// Why the state file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// It exists but cannot be read.
    #[error("{}: cannot read state file: {error}", path.display())]
    Read {
        /// The state file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It is not a state file.
    #[error("{}: invalid state file: {error}", path.display())]
    Invalid {
        /// The state file.
        path: PathBuf,
        /// Why.
        error: serde_json::Error,
    },
    /// It cannot be written (the admin change that needed it is not applied).
    #[error("{}: cannot write state file: {error}", path.display())]
    Write {
        /// The state file.
        path: PathBuf,
        /// Why (the OS error).
        error: std::io::Error,
    },
    /// The lock that serialises writers sharing the file cannot be taken (the change that
    /// needed the write is not applied).
    #[error("{}: cannot lock state file: {error}", path.display())]
    Lock {
        /// The lock file, `<state>.lock`.
        path: PathBuf,
        /// Why (the OS error).
        error: std::io::Error,
    },
    /// Written by another version.
    #[error(
        "{}: state file version {version} is not supported (expected {VERSION})",
        path.display()
    )]
    Version {
        /// The state file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
}

/// Serialize a strategy's durable state.
pub fn encode(state: &PersistedProbeState, clock: &Clock) -> Vec<u8> {
    let file = StateFile {
        version: VERSION,
        saved_at_unix_ms: clock.to_unix_ms(clock.now()),
        cache: state
            .cache
            .iter()
            .map(|e| CacheEntry::of(e, clock))
            .collect(),
        pins: state
            .pins
            .iter()
            .map(|p| Pin {
                node: p.node.clone(),
                model: p.model.clone(),
                weight: p.weight,
            })
            .collect(),
    };
    to_bytes(&file)
}

impl CacheEntry {
    /// A measurement as the file holds it (wall-clock milliseconds).
    fn of(e: &ProbeCacheEntry, clock: &Clock) -> CacheEntry {
        CacheEntry {
            node: e.node.clone(),
            model: e.model.clone(),
            launch_args: e.launch_args.clone(),
            throughput_tok_s: e.throughput_tok_s,
            measured_at_unix_ms: clock.to_unix_ms(e.measured_at),
        }
    }
}

fn to_bytes(file: &StateFile) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(file).expect("plain data serializes");
    v.push(b'\n');
    v
}

/// How far in the future a persisted measurement time may lie before the entry is treated as
/// corrupt. A little slack absorbs a wall clock stepped back (NTP) between save and load; a
/// timestamp far in the future would make the cached measurement never expire.
pub const FUTURE_SLACK: std::time::Duration = std::time::Duration::from_secs(60);

/// A state-file entry that was not restored, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct IgnoredEntry {
    /// Where in the file: `pins[2]`, `cache[0]`.
    pub entry: String,
    /// What it is about: `node/model` (pins) or `node/model/launch_args` (cache).
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Read the state file; `Ok(None)` when it does not exist yet. Entries that are not valid (a pin
/// outside `pin_range`, the policy's weight clamp, or not a positive finite number; a throughput
/// that is not a positive finite number; a measurement time more than [`FUTURE_SLACK`] in the
/// future) are left out and each is logged as `state_entry_ignored`; the others are kept.
pub fn load(
    path: &Path,
    clock: &Clock,
    pin_range: Option<Clamp>,
) -> Result<Option<PersistedProbeState>, StateFileError> {
    let Some(file) = read(path)? else {
        return Ok(None);
    };
    let now_unix_ms = clock.to_unix_ms(clock.now());
    let (state, ignored) = validate(file, clock, now_unix_ms, pin_range);
    let shown = path.display().to_string();
    for i in &ignored {
        crate::log(
            "state_entry_ignored",
            &[
                ("path", &shown),
                ("entry", &i.entry),
                ("key", &i.key),
                ("reason", &i.reason),
            ],
        );
    }
    Ok(Some(state))
}

/// Read and parse the state file as it is on disk; `Ok(None)` when it does not exist yet.
fn read(path: &Path) -> Result<Option<StateFile>, StateFileError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(StateFileError::Read {
                path: path.to_path_buf(),
                error,
            });
        }
    };
    let file: StateFile =
        serde_json::from_slice(&bytes).map_err(|error| StateFileError::Invalid {
            path: path.to_path_buf(),
            error,
        })?;
    if file.version != VERSION {
        return Err(StateFileError::Version {
            path: path.to_path_buf(),
            version: file.version,
        });
    }
    Ok(Some(file))
}

/// Split a parsed state file into the entries to restore and the ones to ignore.
fn validate(
    file: StateFile,
    clock: &Clock,
    now_unix_ms: i64,
    pin_range: Option<Clamp>,
) -> (PersistedProbeState, Vec<IgnoredEntry>) {
    let mut ignored = Vec::new();
    let latest_ms = now_unix_ms.saturating_add(FUTURE_SLACK.as_millis() as i64);
    let mut cache = Vec::with_capacity(file.cache.len());
    for (i, e) in file.cache.into_iter().enumerate() {
        let reason = if !(e.throughput_tok_s.is_finite() && e.throughput_tok_s > 0.0) {
            Some(format!(
                "throughput_tok_s {} is not a positive finite number",
                e.throughput_tok_s
            ))
        } else if e.measured_at_unix_ms > latest_ms {
            Some(format!(
                "measured_at_unix_ms {} is {} s in the future (more than {} s)",
                e.measured_at_unix_ms,
                (e.measured_at_unix_ms - now_unix_ms) / 1000,
                FUTURE_SLACK.as_secs()
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => ignored.push(IgnoredEntry {
                entry: format!("cache[{i}]"),
                key: format!("{}/{}/{}", e.node, e.model, e.launch_args),
                reason,
            }),
            None => cache.push(ProbeCacheEntry {
                node: e.node,
                model: e.model,
                launch_args: e.launch_args,
                throughput_tok_s: e.throughput_tok_s,
                measured_at: clock.from_unix_ms(e.measured_at_unix_ms),
            }),
        }
    }
    let mut pins = Vec::with_capacity(file.pins.len());
    for (i, p) in file.pins.into_iter().enumerate() {
        let reason = check_pin(p.weight, pin_range).err();
        match reason {
            Some(reason) => ignored.push(IgnoredEntry {
                entry: format!("pins[{i}]"),
                key: format!("{}/{}", p.node, p.model),
                reason,
            }),
            None => pins.push(ProbePin {
                node: p.node,
                model: p.model,
                weight: p.weight,
            }),
        }
    }
    (PersistedProbeState { cache, pins }, ignored)
}

/// The range a pin must lie in: the clamp of the policy's `probe` weights, the strategy that
/// supports pins (a pin outside the clamp would be clamped, so the weight would silently differ
/// from what the administrator asked for). `None` for the other strategies: they refuse pins
/// whatever the value (409 `pins_unsupported`), and their state files hold none.
pub fn pin_range(policy: &PolicyConfig) -> Option<Clamp> {
    match &policy.weights {
        WeightsConfig::Probe(c) => Some(c.clamp),
        _ => None,
    }
}

/// Whether `weight` is a valid pin: a finite number > 0, inside `range` when there is one. The
/// error says what would be valid; the admin API answers it and the state file loader logs it.
pub fn check_pin(weight: f64, range: Option<Clamp>) -> Result<(), String> {
    let positive = weight.is_finite() && weight > 0.0;
    match range {
        Some(r) if !(positive && weight >= r.min && weight <= r.max) => Err(format!(
            "weight {weight} is out of range: a pin must be a number from {} to {} (the policy's weight clamp)",
            r.min, r.max
        )),
        None if !positive => Err(format!(
            "weight {weight} is out of range: a pin must be a finite number > 0"
        )),
        _ => Ok(()),
    }
}

/// A pin this gateway set (`Some`) or removed (`None`) since it last wrote the state file.
#[derive(Debug, Clone, PartialEq)]
pub struct PinChange {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// The new pin, or `None` for an unpin.
    pub weight: Option<f64>,
}

/// What this gateway changed in its durable state since it last wrote the state file: the part
/// of its view it merges into the file. Recording changes rather than the whole view is what
/// lets replicas share a file: a replica that never heard of another's pin does not erase it,
/// and an unpin is written as a removal rather than lost as an absence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Changes {
    /// Measurements new or different since the last write.
    pub measured: Vec<ProbeCacheEntry>,
    /// Measurements dropped from this gateway's cache since the last write, as they were.
    pub forgotten: Vec<ProbeCacheEntry>,
    /// Pins set, changed or removed since the last write.
    pub pins: Vec<PinChange>,
}

type CacheKey<'a> = (&'a str, &'a str, &'a str);

fn cache_key(e: &ProbeCacheEntry) -> CacheKey<'_> {
    (&e.node, &e.model, &e.launch_args)
}

impl Changes {
    /// The changes that turn `written` (what this gateway last wrote, or loaded at start) into
    /// `now` (its current state).
    pub fn between(written: &PersistedProbeState, now: &PersistedProbeState) -> Changes {
        let before: BTreeMap<CacheKey<'_>, &ProbeCacheEntry> =
            written.cache.iter().map(|e| (cache_key(e), e)).collect();
        let after: BTreeMap<CacheKey<'_>, &ProbeCacheEntry> =
            now.cache.iter().map(|e| (cache_key(e), e)).collect();
        let measured = after
            .iter()
            .filter(|(k, e)| before.get(*k) != Some(*e))
            .map(|(_, e)| (*e).clone())
            .collect();
        let forgotten = before
            .iter()
            .filter(|(k, _)| !after.contains_key(*k))
            .map(|(_, e)| (*e).clone())
            .collect();
        let pin_map = |s: &PersistedProbeState| -> BTreeMap<(String, String), f64> {
            s.pins
                .iter()
                .map(|p| ((p.node.clone(), p.model.clone()), p.weight))
                .collect()
        };
        let (before, after) = (pin_map(written), pin_map(now));
        let mut pins: Vec<PinChange> = after
            .iter()
            .filter(|(k, w)| before.get(*k) != Some(*w))
            .map(|((node, model), w)| PinChange {
                node: node.clone(),
                model: model.clone(),
                weight: Some(*w),
            })
            .collect();
        pins.extend(
            before
                .keys()
                .filter(|k| !after.contains_key(*k))
                .map(|(node, model)| PinChange {
                    node: node.clone(),
                    model: model.clone(),
                    weight: None,
                }),
        );
        Changes {
            measured,
            forgotten,
            pins,
        }
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.measured.is_empty() && self.forgotten.is_empty() && self.pins.is_empty()
    }
}

/// Merge one writer's `changes` into the file's entries. Per measurement (node, model, launch
/// arguments) the newer one by its timestamp wins, whoever wrote it; a forgotten measurement is
/// removed unless the file holds a newer one. A pin set or removed by this writer wins for its
/// (node, model). Entries the writer did not change are kept as they are, including ones this
/// gateway ignores on load (another replica's policy may accept them). Entries come out sorted
/// by key, as [`encode`] writes them.
fn merge(file: &mut StateFile, changes: &Changes, clock: &Clock) {
    let mut cache: BTreeMap<(String, String, String), CacheEntry> = std::mem::take(&mut file.cache)
        .into_iter()
        .map(|e| ((e.node.clone(), e.model.clone(), e.launch_args.clone()), e))
        .collect();
    let key = |e: &ProbeCacheEntry| (e.node.clone(), e.model.clone(), e.launch_args.clone());
    for e in &changes.measured {
        let entry = CacheEntry::of(e, clock);
        let newer_on_file = cache
            .get(&key(e))
            .is_some_and(|f| f.measured_at_unix_ms > entry.measured_at_unix_ms);
        if !newer_on_file {
            cache.insert(key(e), entry);
        }
    }
    for e in &changes.forgotten {
        let at = clock.to_unix_ms(e.measured_at);
        if cache
            .get(&key(e))
            .is_some_and(|f| f.measured_at_unix_ms <= at)
        {
            cache.remove(&key(e));
        }
    }
    let mut pins: BTreeMap<(String, String), Pin> = std::mem::take(&mut file.pins)
        .into_iter()
        .map(|p| ((p.node.clone(), p.model.clone()), p))
        .collect();
    for p in &changes.pins {
        let k = (p.node.clone(), p.model.clone());
        match p.weight {
            Some(weight) => {
                pins.insert(
                    k,
                    Pin {
                        node: p.node.clone(),
                        model: p.model.clone(),
                        weight,
                    },
                );
            }
            None => {
                pins.remove(&k);
            }
        }
    }
    file.cache = cache.into_values().collect();
    file.pins = pins.into_values().collect();
}

/// The lock file beside `path`: `<state>.lock`. A separate file, because the state file itself
/// is replaced by a rename at every write, and a lock on a replaced file would lock nothing.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

/// Write this gateway's state to `path`, shared safely with other writers: take an exclusive
/// advisory lock on [`lock_path`] (blocking until other writers are done), read the current
/// file, merge into it the changes from `written` (what this gateway last wrote, or loaded at
/// start) to `now` ([`Changes::between`], [`merge`]), write it atomically ([`write_atomic`]),
/// release the lock. When the file does not exist, the whole of `now` is written. When it
/// exists and nothing changed, nothing is written. A file that cannot be parsed or has another
/// version is an error and is left alone (it is not overwritten with a partial view).
///
/// Blocking: call it from a blocking thread.
pub fn save(
    path: &Path,
    written: &PersistedProbeState,
    now: &PersistedProbeState,
    clock: &Clock,
) -> Result<(), StateFileError> {
    let lock_at = lock_path(path);
    let locked = |error| StateFileError::Lock {
        path: lock_at.clone(),
        error,
    };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_at)
        .map_err(locked)?;
    // flock(2) on Unix, LockFileEx on Windows; released when `lock` is closed, also when the
    // process dies while holding it.
    lock.lock().map_err(locked)?;
    let existing = read(path)?;
    let existed = existing.is_some();
    let (mut file, changes) = match existing {
        Some(file) => (file, Changes::between(written, now)),
        None => (
            StateFile {
                version: VERSION,
                saved_at_unix_ms: 0,
                cache: Vec::new(),
                pins: Vec::new(),
            },
            Changes::between(&PersistedProbeState::default(), now),
        ),
    };
    if existed && changes.is_empty() {
        return Ok(());
    }
    merge(&mut file, &changes, clock);
    file.saved_at_unix_ms = clock.to_unix_ms(clock.now());
    write_atomic(path, &to_bytes(&file)).map_err(|error| StateFileError::Write {
        path: path.to_path_buf(),
        error,
    })
}

/// Replace `path` with `bytes` atomically (temp file in the same directory, fsync, rename,
/// fsync of the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("state file path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_a_file() {
        let clock = Clock::new();
        let state = PersistedProbeState {
            cache: vec![ProbeCacheEntry {
                node: "n".into(),
                model: "m".into(),
                launch_args: "--x".into(),
                throughput_tok_s: 992.0,
                measured_at: clock.now(),
            }],
            pins: vec![ProbePin {
                node: "n".into(),
                model: "m".into(),
                weight: 1.5,
            }],
        };
        let dir = std::env::temp_dir().join(format!("routelab-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        assert_eq!(load(&path, &clock, None).unwrap(), None);
        write_atomic(&path, &encode(&state, &clock)).unwrap();
        write_atomic(&path, &encode(&state, &clock)).unwrap();
        let back = load(&path, &clock, None).unwrap().unwrap();
        assert_eq!(back.pins, state.pins);
        assert_eq!(back.cache[0].throughput_tok_s, 992.0);
        let dt = back.cache[0]
            .measured_at
            .as_nanos()
            .abs_diff(state.cache[0].measured_at.as_nanos());
        assert!(dt < 2_000_000, "{dt}");
        // No temp file left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::write(&path, b"{broken").unwrap();
        assert!(matches!(
            load(&path, &clock, None),
            Err(StateFileError::Invalid { .. })
        ));
        std::fs::write(
            &path,
            br#"{"version":2,"saved_at_unix_ms":0,"cache":[],"pins":[]}"#,
        )
        .unwrap();
        let e = load(&path, &clock, None).unwrap_err();
        assert!(matches!(e, StateFileError::Version { version: 2, .. }));
        assert!(
            e.to_string()
                .ends_with("state file version 2 is not supported (expected 1)"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn file(cache: Vec<CacheEntry>, pins: Vec<Pin>) -> StateFile {
        StateFile {
            version: VERSION,
            saved_at_unix_ms: 0,
            cache,
            pins,
        }
    }

    fn cache_entry(node: &str, tp: f64, at_ms: i64) -> CacheEntry {
        CacheEntry {
            node: node.into(),
            model: "m".into(),
            launch_args: "--x".into(),
            throughput_tok_s: tp,
            measured_at_unix_ms: at_ms,
        }
    }

    fn pin(node: &str, weight: f64) -> Pin {
        Pin {
            node: node.into(),
            model: "m".into(),
            weight,
        }
    }

    /// Regression: a negative or out-of-clamp pin and a measurement time far in the future were
    /// restored (the latter never expires); now each is ignored with a reason, the rest kept.
    #[test]
    fn invalid_entries_are_ignored_and_reported_the_valid_ones_kept() {
        let clock = Clock::new();
        let now = clock.to_unix_ms(clock.now());
        let day_ms = 24 * 3_600_000;
        let f = file(
            vec![
                cache_entry("good", 900.0, now - 1000),
                cache_entry("skewed", 800.0, now + 30_000),
                cache_entry("future", 900.0, now + day_ms),
                cache_entry("zero", 0.0, now),
                cache_entry("negative", -5.0, now),
            ],
            vec![
                pin("good", 1.5),
                pin("lowest", 0.25),
                pin("negative", -1.0),
                pin("huge", 1e9),
                pin("tiny", 5e-324),
            ],
        );
        let (state, ignored) = validate(f, &clock, now, Some(Clamp::SOURCE));
        let kept: Vec<&str> = state.cache.iter().map(|e| e.node.as_str()).collect();
        assert_eq!(kept, ["good", "skewed"]);
        let kept: Vec<&str> = state.pins.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(kept, ["good", "lowest"]);
        let report: Vec<(&str, &str)> = ignored
            .iter()
            .map(|i| (i.entry.as_str(), i.key.as_str()))
            .collect();
        assert_eq!(
            report,
            [
                ("cache[2]", "future/m/--x"),
                ("cache[3]", "zero/m/--x"),
                ("cache[4]", "negative/m/--x"),
                ("pins[2]", "negative/m"),
                ("pins[3]", "huge/m"),
                ("pins[4]", "tiny/m"),
            ]
        );
        assert!(
            ignored[0].reason.contains("in the future"),
            "{:?}",
            ignored[0]
        );
        assert!(
            ignored[1].reason.contains("throughput_tok_s 0"),
            "{:?}",
            ignored[1]
        );
        assert_eq!(
            ignored[4].reason,
            "weight 1000000000 is out of range: a pin must be a number from 0.25 to 8 (the policy's weight clamp)"
        );
        // Without a clamp (a strategy without pins) only non-positive pins are invalid.
        let f = file(vec![], vec![pin("huge", 1e9), pin("negative", -1.0)]);
        let (state, ignored) = validate(f, &clock, now, None);
        assert_eq!(state.pins.len(), 1);
        assert_eq!(ignored[0].entry, "pins[1]");
    }

    fn measured(clock: &Clock, node: &str, tp: f64, at_ms: i64) -> ProbeCacheEntry {
        ProbeCacheEntry {
            node: node.into(),
            model: "m".into(),
            launch_args: "--x".into(),
            throughput_tok_s: tp,
            measured_at: clock.from_unix_ms(at_ms),
        }
    }

    fn probe_pin(node: &str, weight: f64) -> ProbePin {
        ProbePin {
            node: node.into(),
            model: "m".into(),
            weight,
        }
    }

    #[test]
    fn changes_are_what_moved_since_the_last_write_removals_included() {
        let clock = Clock::new();
        let t = clock.to_unix_ms(clock.now()) - 60_000;
        let written = PersistedProbeState {
            cache: vec![
                measured(&clock, "a", 100.0, t),
                measured(&clock, "b", 200.0, t),
                measured(&clock, "gone", 50.0, t),
            ],
            pins: vec![
                probe_pin("a", 2.0),
                probe_pin("b", 3.0),
                probe_pin("c", 1.0),
            ],
        };
        let now = PersistedProbeState {
            cache: vec![
                measured(&clock, "a", 100.0, t),
                measured(&clock, "b", 250.0, t + 1000),
                measured(&clock, "new", 300.0, t + 2000),
            ],
            pins: vec![
                probe_pin("a", 2.0),
                probe_pin("b", 4.0),
                probe_pin("d", 0.5),
            ],
        };
        let c = Changes::between(&written, &now);
        let nodes = |v: &[ProbeCacheEntry]| v.iter().map(|e| e.node.clone()).collect::<Vec<_>>();
        assert_eq!(nodes(&c.measured), ["b", "new"]);
        assert_eq!(nodes(&c.forgotten), ["gone"]);
        let pins: Vec<(&str, Option<f64>)> =
            c.pins.iter().map(|p| (p.node.as_str(), p.weight)).collect();
        assert_eq!(pins, [("b", Some(4.0)), ("d", Some(0.5)), ("c", None)]);
        assert!(Changes::between(&now, &now).is_empty());
    }

    #[test]
    fn the_merge_keeps_the_newer_measurement_and_this_writers_pins_and_removals() {
        let clock = Clock::new();
        let t = clock.to_unix_ms(clock.now()) - 60_000;
        // What another replica wrote.
        let mut f = file(
            vec![
                cache_entry("older-here", 100.0, t + 2000),
                cache_entry("newer-here", 100.0, t),
                cache_entry("forgotten-here", 100.0, t),
                cache_entry("remeasured-there", 100.0, t + 5000),
                cache_entry("theirs", 700.0, t),
            ],
            vec![
                pin("set-here", 2.0),
                pin("removed-here", 1.5),
                pin("their-pin", 3.0),
            ],
        );
        let changes = Changes {
            measured: vec![
                measured(&clock, "older-here", 111.0, t + 1000),
                measured(&clock, "newer-here", 222.0, t + 3000),
                measured(&clock, "only-here", 333.0, t),
            ],
            forgotten: vec![
                measured(&clock, "forgotten-here", 100.0, t),
                measured(&clock, "remeasured-there", 90.0, t + 1000),
            ],
            pins: vec![
                PinChange {
                    node: "set-here".into(),
                    model: "m".into(),
                    weight: Some(4.0),
                },
                PinChange {
                    node: "removed-here".into(),
                    model: "m".into(),
                    weight: None,
                },
            ],
        };
        merge(&mut f, &changes, &clock);
        let cache: Vec<(&str, f64, i64)> = f
            .cache
            .iter()
            .map(|e| {
                (
                    e.node.as_str(),
                    e.throughput_tok_s,
                    e.measured_at_unix_ms - t,
                )
            })
            .collect();
        assert_eq!(
            cache,
            [
                ("newer-here", 222.0, 3000),
                ("older-here", 100.0, 2000),
                ("only-here", 333.0, 0),
                ("remeasured-there", 100.0, 5000),
                ("theirs", 700.0, 0),
            ]
        );
        let pins: Vec<(&str, f64)> = f.pins.iter().map(|p| (p.node.as_str(), p.weight)).collect();
        assert_eq!(pins, [("set-here", 4.0), ("their-pin", 3.0)]);
    }

    /// Two writers that never read each other's state (as two gateway replicas) take turns on
    /// one file: each keeps the other's pins and measurements, an unpin stays removed.
    #[test]
    fn writers_sharing_a_file_keep_each_others_entries() {
        let clock = Clock::new();
        let t = clock.to_unix_ms(clock.now()) - 60_000;
        let dir =
            std::env::temp_dir().join(format!("routelab-persist-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let empty = PersistedProbeState::default();
        let a1 = PersistedProbeState {
            cache: vec![measured(&clock, "a", 100.0, t)],
            pins: vec![probe_pin("a", 2.0)],
        };
        save(&path, &empty, &a1, &clock).unwrap();
        let b1 = PersistedProbeState {
            cache: vec![measured(&clock, "b", 200.0, t)],
            pins: vec![probe_pin("b", 3.0)],
        };
        save(&path, &empty, &b1, &clock).unwrap();
        let a2 = PersistedProbeState {
            cache: vec![measured(&clock, "a", 150.0, t + 1000)],
            pins: vec![],
        };
        save(&path, &a1, &a2, &clock).unwrap();
        let back = load(&path, &clock, None).unwrap().unwrap();
        let cache: Vec<(&str, f64)> = back
            .cache
            .iter()
            .map(|e| (e.node.as_str(), e.throughput_tok_s))
            .collect();
        assert_eq!(cache, [("a", 150.0), ("b", 200.0)]);
        assert_eq!(back.pins, [probe_pin("b", 3.0)]);
        assert!(lock_path(&path).exists());
        // A file this gateway cannot read is an error, not overwritten with a partial view.
        std::fs::write(&path, b"{broken").unwrap();
        assert!(matches!(
            save(&path, &a2, &a1, &clock),
            Err(StateFileError::Invalid { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"{broken");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pin_checks_name_the_valid_range() {
        let r = Some(Clamp::SOURCE);
        assert!(check_pin(0.25, r).is_ok() && check_pin(8.0, r).is_ok());
        for bad in [8.000001, 0.2499, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = check_pin(bad, r).unwrap_err();
            assert!(
                e.ends_with("from 0.25 to 8 (the policy's weight clamp)"),
                "{e}"
            );
        }
        assert!(check_pin(1e9, None).is_ok());
        assert!(check_pin(f64::NAN, None).is_err());
    }
}
