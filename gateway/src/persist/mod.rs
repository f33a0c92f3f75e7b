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
//! changed since its own last write and the pin or unpin the write is for ([`Changes`]), and
//! replaces the file. So no replica overwrites another's pins or measurements with its older
//! view, and an administrator's pin or unpin always reaches the file. The load at start takes
//! no lock: the atomic replace already guarantees a whole file, and a load changes nothing.

use crate::clock::Clock;
use routelab_policies::weights::{Clamp, PersistedProbeState, ProbeCacheEntry, ProbePin};
use routelab_policies::{PolicyConfig, WeightsConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod fs;
mod merge;
pub mod writer;

use fs::lock;
pub use fs::{
    LOCK_TIMEOUT, StateDirectoryError, check_directory, lock_path, resolve_links, write_atomic,
};
use merge::merge;
pub use merge::{Changes, Forget, PinChange, Update};

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
    /// The prefill-bound burst's prompt tokens/s, when the probe has one (absent otherwise, so
    /// a file written without prefill probes reads and writes as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefill_tok_s: Option<f64>,
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

impl CacheEntry {
    /// A measurement as the file holds it (wall-clock milliseconds).
    fn of(e: &ProbeCacheEntry, clock: &Clock) -> CacheEntry {
        CacheEntry {
            node: e.node.clone(),
            model: e.model.clone(),
            launch_args: e.launch_args.clone(),
            throughput_tok_s: e.throughput_tok_s,
            prefill_tok_s: e.prefill_tok_s,
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
        crate::logging::log(
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
            None => {
                // A bad prefill speed is dropped alone: the throughput beside it stands, and
                // the prefill-bound burst measures it again.
                let prefill_tok_s = e.prefill_tok_s.filter(|v| {
                    let ok = v.is_finite() && *v > 0.0;
                    if !ok {
                        ignored.push(IgnoredEntry {
                            entry: format!("cache[{i}].prefill_tok_s"),
                            key: format!("{}/{}/{}", e.node, e.model, e.launch_args),
                            reason: format!(
                                "prefill_tok_s {v} is not a positive finite number (the throughput is kept; the prefill speed is measured again)"
                            ),
                        });
                    }
                    ok
                });
                cache.push(ProbeCacheEntry {
                    node: e.node,
                    model: e.model,
                    launch_args: e.launch_args,
                    throughput_tok_s: e.throughput_tok_s,
                    prefill_tok_s,
                    measured_at: clock.from_unix_ms(e.measured_at_unix_ms),
                })
            }
        }
    }
    let mut pins = Vec::with_capacity(file.pins.len());
    for (i, p) in file.pins.into_iter().enumerate() {
        let reason = check_pin(p.weight, pin_range).err().map(|e| e.to_string());
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
pub fn check_pin(weight: f64, range: Option<Clamp>) -> Result<(), PinError> {
    let positive = weight.is_finite() && weight > 0.0;
    match range {
        Some(r) if !(positive && weight >= r.min && weight <= r.max) => {
            Err(PinError::OutsideClamp {
                weight,
                min: r.min,
                max: r.max,
            })
        }
        None if !positive => Err(PinError::NotPositive { weight }),
        _ => Ok(()),
    }
}

/// Why a weight cannot be a pin ([`check_pin`]); the message says what would be valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// Outside the clamp of the policy's `probe` weights (or not a finite number).
    #[error(
        "weight {weight} is out of range: a pin must be a number from {min} to {max} (the policy's weight clamp)"
    )]
    OutsideClamp {
        /// The weight asked for.
        weight: f64,
        /// The clamp's lower end.
        min: f64,
        /// The clamp's upper end.
        max: f64,
    },
    /// Not a finite number > 0 (a strategy without a clamp).
    #[error("weight {weight} is out of range: a pin must be a finite number > 0")]
    NotPositive {
        /// The weight asked for.
        weight: f64,
    },
}

/// Write this gateway's state to `path`, shared safely with other writers: take an exclusive
/// advisory lock on [`lock_path`] (waiting up to [`LOCK_TIMEOUT`] for other writers), read the
/// current file, merge into it what `update` carries ([`Changes::between`] its last write and
/// now, plus its explicit pin change; `merge`), write it atomically ([`write_atomic`]),
/// release the lock. When the file does not exist, the whole of `now` is written. When it
/// exists and nothing changed (and there is no explicit pin change), nothing is written. A file
/// that cannot be parsed or has another version is an error and is left alone (it is not
/// overwritten with a partial view).
///
/// Blocking: call it from a blocking thread.
pub fn save(path: &Path, update: &Update<'_>, clock: &Clock) -> Result<(), StateFileError> {
    // A state file that is a symbolic link is written through the link: the rename replaces the
    // file it points to, not the link (which would leave the link's target stale and the pins
    // lost at the next start from it). The lock is the target's, so that writers naming the
    // file through different links share it.
    let path = &resolve_links(path).map_err(|error| StateFileError::Write {
        path: path.to_path_buf(),
        error,
    })?;
    let _lock = lock(path, LOCK_TIMEOUT)?;
    let existing = read(path)?;
    let existed = existing.is_some();
    let changes = Changes::of(update, existed);
    if existed && changes.is_empty() {
        return Ok(());
    }
    let mut file = existing.unwrap_or(StateFile {
        version: VERSION,
        saved_at_unix_ms: 0,
        cache: Vec::new(),
        pins: Vec::new(),
    });
    merge(&mut file, &changes, clock);
    file.saved_at_unix_ms = clock.to_unix_ms(clock.now());
    write_atomic(path, &to_bytes(&file)).map_err(|error| StateFileError::Write {
        path: path.to_path_buf(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::fs::write_atomic_with;
    use super::*;
    use routelab_policies::Time;

    #[test]
    fn round_trip_through_a_file() {
        let clock = Clock::new();
        let state = PersistedProbeState {
            cache: vec![ProbeCacheEntry {
                node: "n".into(),
                model: "m".into(),
                launch_args: "--x".into(),
                throughput_tok_s: 992.0,
                prefill_tok_s: None,
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
        // Written whole when there is no file; merged into it (the same entries) when there is.
        let none = PersistedProbeState::default();
        save(&path, &update(&none, &state, &clock), &clock).unwrap();
        save(&path, &update(&none, &state, &clock), &clock).unwrap();
        let back = load(&path, &clock, None).unwrap().unwrap();
        assert_eq!(back.pins, state.pins);
        assert_eq!(back.cache[0].throughput_tok_s, 992.0);
        let dt = back.cache[0]
            .measured_at
            .as_nanos()
            .abs_diff(state.cache[0].measured_at.as_nanos());
        assert!(dt < 2_000_000, "{dt}");
        // No temp file left behind.
        assert_eq!(names_in(&dir), ["state.json", "state.json.lock"]);
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

    /// A write of `now` by a gateway that last wrote `written`, taken now, no explicit pin.
    fn update<'a>(
        written: &'a PersistedProbeState,
        now: &'a PersistedProbeState,
        clock: &Clock,
    ) -> Update<'a> {
        Update {
            written,
            now,
            taken_at: clock.now(),
            explicit_pin: None,
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
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
            prefill_tok_s: None,
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

    /// A cached prefill speed (predictive's prefill-bound probe) that is not a positive
    /// number is ignored alone and reported: the throughput beside it is kept, the others'
    /// prefill speeds too. A measurement without one is written without the field, so files
    /// of policies without a prefill probe are unchanged.
    #[test]
    fn a_bad_cached_prefill_speed_is_ignored_alone_and_reported() {
        let clock = Clock::new();
        let now = clock.to_unix_ms(clock.now());
        let entry = |node: &str, prefill: &str| {
            format!(
                r#"{{"node":"{node}","model":"m","launch_args":"","throughput_tok_s":900.0,{prefill}"measured_at_unix_ms":{now}}}"#
            )
        };
        let text = format!(
            r#"{{"version":1,"saved_at_unix_ms":{now},"cache":[{},{},{},{}],"pins":[]}}"#,
            entry("zero", r#""prefill_tok_s":0.0,"#),
            entry("negative", r#""prefill_tok_s":-3.5,"#),
            entry("good", r#""prefill_tok_s":5000.0,"#),
            entry("none", ""),
        );
        let f: StateFile = serde_json::from_str(&text).unwrap();
        let (state, ignored) = validate(f, &clock, now, None);
        let kept: Vec<(&str, f64, Option<f64>)> = state
            .cache
            .iter()
            .map(|e| (e.node.as_str(), e.throughput_tok_s, e.prefill_tok_s))
            .collect();
        assert_eq!(
            kept,
            [
                ("zero", 900.0, None),
                ("negative", 900.0, None),
                ("good", 900.0, Some(5000.0)),
                ("none", 900.0, None),
            ]
        );
        let report: Vec<&str> = ignored.iter().map(|i| i.entry.as_str()).collect();
        assert_eq!(report, ["cache[0].prefill_tok_s", "cache[1].prefill_tok_s"]);
        assert!(
            ignored[1]
                .reason
                .starts_with("prefill_tok_s -3.5 is not a positive finite number"),
            "{:?}",
            ignored[1]
        );
        let written = to_bytes(&file(vec![cache_entry("none", 900.0, now)], vec![]));
        assert!(
            !String::from_utf8(written)
                .unwrap()
                .contains("prefill_tok_s")
        );
    }

    fn measured(clock: &Clock, node: &str, tp: f64, at_ms: i64) -> ProbeCacheEntry {
        ProbeCacheEntry {
            node: node.into(),
            model: "m".into(),
            launch_args: "--x".into(),
            throughput_tok_s: tp,
            prefill_tok_s: None,
            measured_at: clock.from_unix_ms(at_ms),
        }
    }

    fn forget(clock: &Clock, node: &str, invalidated_at_ms: i64) -> Forget {
        Forget {
            node: node.into(),
            model: "m".into(),
            launch_args: "--x".into(),
            invalidated_at: clock.from_unix_ms(invalidated_at_ms),
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
        let taken_at = clock.from_unix_ms(t + 5000);
        let c = Changes::between(&written, &now, taken_at);
        let nodes = |v: &[ProbeCacheEntry]| v.iter().map(|e| e.node.clone()).collect::<Vec<_>>();
        assert_eq!(nodes(&c.measured), ["b", "new"]);
        let forgotten: Vec<(&str, Time)> = c
            .forgotten
            .iter()
            .map(|f| (f.node.as_str(), f.invalidated_at))
            .collect();
        assert_eq!(forgotten, [("gone", taken_at)]);
        let pins: Vec<(&str, Option<f64>)> =
            c.pins.iter().map(|p| (p.node.as_str(), p.weight)).collect();
        assert_eq!(pins, [("b", Some(4.0)), ("d", Some(0.5)), ("c", None)]);
        assert!(Changes::between(&now, &now, taken_at).is_empty());
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
            // Both invalidated at t + 1000: the file's measurement from before goes, the one
            // made after stays.
            forgotten: vec![
                forget(&clock, "forgotten-here", t + 1000),
                forget(&clock, "remeasured-there", t + 1000),
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
        save(&path, &update(&empty, &a1, &clock), &clock).unwrap();
        let b1 = PersistedProbeState {
            cache: vec![measured(&clock, "b", 200.0, t)],
            pins: vec![probe_pin("b", 3.0)],
        };
        save(&path, &update(&empty, &b1, &clock), &clock).unwrap();
        let a2 = PersistedProbeState {
            cache: vec![measured(&clock, "a", 150.0, t + 1000)],
            pins: vec![],
        };
        save(&path, &update(&a1, &a2, &clock), &clock).unwrap();
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
            save(&path, &update(&a2, &a1, &clock), &clock),
            Err(StateFileError::Invalid { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"{broken");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The pins in the file at `path`, by node.
    fn pins_in(path: &Path, clock: &Clock) -> Vec<(String, f64)> {
        load(path, clock, None)
            .unwrap()
            .unwrap()
            .pins
            .into_iter()
            .map(|p| (p.node, p.weight))
            .collect()
    }

    /// Regression: an administrator's pin or unpin that did not change the replica's own view
    /// (it had loaded X=2 and another replica has since written X=3; or it never had the pin)
    /// was not written, though answered 200: the file kept the other value.
    #[test]
    fn an_explicit_pin_or_unpin_is_written_even_when_this_replicas_view_already_held_it() {
        let clock = Clock::new();
        let dir =
            std::env::temp_dir().join(format!("routelab-persist-explicit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let none = PersistedProbeState::default();
        let x = |w: f64| PersistedProbeState {
            cache: vec![],
            pins: vec![probe_pin("x", w)],
        };
        let explicit = |w: Option<f64>| PinChange {
            node: "x".into(),
            model: "m".into(),
            weight: w,
        };
        let (x2, x3) = (x(2.0), x(3.0));
        // A wrote (or loaded) X=2; B then pins X=3.
        save(&path, &update(&none, &x2, &clock), &clock).unwrap();
        let b = Update {
            explicit_pin: Some(explicit(Some(3.0))),
            ..update(&x2, &x3, &clock)
        };
        save(&path, &b, &clock).unwrap();
        assert_eq!(pins_in(&path, &clock), [("x".to_string(), 3.0)]);
        // A's view is unchanged at X=2: a background write (no explicit change) leaves the
        // file alone, the administrator's X=2 through A is written.
        save(&path, &update(&x2, &x2, &clock), &clock).unwrap();
        assert_eq!(pins_in(&path, &clock), [("x".to_string(), 3.0)]);
        let a = Update {
            explicit_pin: Some(explicit(Some(2.0))),
            ..update(&x2, &x2, &clock)
        };
        save(&path, &a, &clock).unwrap();
        assert_eq!(pins_in(&path, &clock), [("x".to_string(), 2.0)]);
        // C never had the pin: its unpin is written as a removal all the same.
        let c = Update {
            explicit_pin: Some(explicit(None)),
            ..update(&none, &none, &clock)
        };
        save(&path, &c, &clock).unwrap();
        assert_eq!(pins_in(&path, &clock), []);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Regression: a forget removed the file's measurement only up to the time of the
    /// forgetting replica's own (older) measurement, so another replica's measurement from
    /// before the restart survived it.
    #[test]
    fn a_forget_removes_every_measurement_made_before_it_whoever_made_it() {
        let clock = Clock::new();
        let t = clock.to_unix_ms(clock.now()) - 60_000;
        let dir =
            std::env::temp_dir().join(format!("routelab-persist-forget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let none = PersistedProbeState::default();
        let at = |tp: f64, ms: i64| PersistedProbeState {
            cache: vec![measured(&clock, "x", tp, ms)],
            pins: vec![],
        };
        let a_measured = at(100.0, t);
        // A measured X at t, B at t + 1000 (newer: the file keeps B's).
        save(&path, &update(&none, &a_measured, &clock), &clock).unwrap();
        save(&path, &update(&none, &at(120.0, t + 1000), &clock), &clock).unwrap();
        // X's node manager restarts without its cache at t + 2000; A drops X and writes.
        let forget_at = Update {
            taken_at: clock.from_unix_ms(t + 2000),
            ..update(&a_measured, &none, &clock)
        };
        save(&path, &forget_at, &clock).unwrap();
        let back = load(&path, &clock, None).unwrap().unwrap();
        assert_eq!(
            back.cache,
            [],
            "B's measurement from before the restart survived"
        );
        // A measurement made after the invalidation is kept.
        save(&path, &update(&none, &at(130.0, t + 3000), &clock), &clock).unwrap();
        save(&path, &forget_at, &clock).unwrap();
        let back = load(&path, &clock, None).unwrap().unwrap();
        assert_eq!(back.cache.len(), 1);
        assert_eq!(back.cache[0].throughput_tok_s, 130.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Regression: a directory fsync failing after the rename made the write an error, so an
    /// admin pin was rolled back in memory while the file kept it, and nothing corrected it.
    #[test]
    fn a_failed_directory_sync_after_the_rename_is_a_successful_write() {
        let dir =
            std::env::temp_dir().join(format!("routelab-persist-dirsync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let failing = |_: &Path| Err(std::io::Error::other("EIO"));
        write_atomic_with(&path, b"first\n", failing).unwrap();
        write_atomic_with(&path, b"second\n", failing).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second\n");
        assert_eq!(names_in(&dir), ["state.json"]);
        // A failure before the rename is still an error, and leaves the file as it was.
        let missing = dir.join("no-such-dir").join("state.json");
        assert!(write_atomic_with(&missing, b"x", |_| Ok(())).is_err());
        assert_eq!(names_in(&dir), ["state.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Regression: the lock was taken without a timeout, so a writer that hung while holding
    /// it blocked every other writer's thread for good.
    #[test]
    fn a_lock_held_past_the_timeout_is_an_error_naming_the_lock_file() {
        let dir =
            std::env::temp_dir().join(format!("routelab-persist-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let held = lock(&path, LOCK_TIMEOUT).unwrap();
        let started = std::time::Instant::now();
        let e = lock(&path, std::time::Duration::from_millis(100)).unwrap_err();
        assert!(started.elapsed() >= std::time::Duration::from_millis(100));
        let StateFileError::Lock { path: at, error } = &e else {
            panic!("{e}");
        };
        assert_eq!(at, &lock_path(&path));
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        let shown = e.to_string();
        assert!(
            shown.starts_with(&lock_path(&path).display().to_string()),
            "{shown}"
        );
        assert!(
            shown.contains("held the lock for more than 0.1 s"),
            "{shown}"
        );
        assert!(shown.contains("hung gateway"), "{shown}");
        // Released, it is taken again at once.
        drop(held);
        lock(&path, std::time::Duration::ZERO).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pin_checks_name_the_valid_range() {
        let r = Some(Clamp::SOURCE);
        assert!(check_pin(0.25, r).is_ok() && check_pin(8.0, r).is_ok());
        for bad in [8.000001, 0.2499, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = check_pin(bad, r).unwrap_err().to_string();
            assert!(
                e.ends_with("from 0.25 to 8 (the policy's weight clamp)"),
                "{e}"
            );
        }
        assert!(check_pin(1e9, None).is_ok());
        assert!(check_pin(f64::NAN, None).is_err());
    }
}
