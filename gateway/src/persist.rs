//! The state file: probe cache and admin pins, so a restart (even after SIGKILL) keeps them.
//!
//! Written atomically after every probe result and every pin/unpin: the JSON goes to a
//! temporary file in the same directory, which is fsynced and renamed over the state file, and
//! the directory is fsynced. A reader therefore sees the old file or the new one, never a torn
//! one. Timestamps are Unix milliseconds, so the cache TTL keeps counting across restarts.

use crate::clock::Clock;
use routelab_policies::weights::{PersistedProbeState, ProbeCacheEntry, ProbePin};
use serde::{Deserialize, Serialize};
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
            .map(|e| CacheEntry {
                node: e.node.clone(),
                model: e.model.clone(),
                launch_args: e.launch_args.clone(),
                throughput_tok_s: e.throughput_tok_s,
                measured_at_unix_ms: clock.to_unix_ms(e.measured_at),
            })
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
    let mut v = serde_json::to_vec_pretty(&file).expect("plain data serializes");
    v.push(b'\n');
    v
}

/// Read the state file; `Ok(None)` when it does not exist yet.
pub fn load(path: &Path, clock: &Clock) -> Result<Option<PersistedProbeState>, StateFileError> {
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
    Ok(Some(PersistedProbeState {
        cache: file
            .cache
            .into_iter()
            .map(|e| ProbeCacheEntry {
                node: e.node,
                model: e.model,
                launch_args: e.launch_args,
                throughput_tok_s: e.throughput_tok_s,
                measured_at: clock.from_unix_ms(e.measured_at_unix_ms),
            })
            .collect(),
        pins: file
            .pins
            .into_iter()
            .map(|p| ProbePin {
                node: p.node,
                model: p.model,
                weight: p.weight,
            })
            .collect(),
    }))
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
        assert_eq!(load(&path, &clock).unwrap(), None);
        write_atomic(&path, &encode(&state, &clock)).unwrap();
        write_atomic(&path, &encode(&state, &clock)).unwrap();
        let back = load(&path, &clock).unwrap().unwrap();
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
            load(&path, &clock),
            Err(StateFileError::Invalid { .. })
        ));
        std::fs::write(
            &path,
            br#"{"version":2,"saved_at_unix_ms":0,"cache":[],"pins":[]}"#,
        )
        .unwrap();
        let e = load(&path, &clock).unwrap_err();
        assert!(matches!(e, StateFileError::Version { version: 2, .. }));
        assert!(
            e.to_string()
                .ends_with("state file version 2 is not supported (expected 1)"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
