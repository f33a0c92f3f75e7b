//! The state file on disk: where it may be written, the lock its writers share, and the
//! atomic replace that keeps a reader from seeing a torn file.

use super::StateFileError;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The lock file beside `path`: `<state>.lock`. A separate file, because the state file itself
/// is replaced by a rename at every write, and a lock on a replaced file would lock nothing.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

/// How long [`save`] waits for another writer's lock before it gives up: a write takes
/// milliseconds, so a lock held this long belongs to a writer that hangs.
pub const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most symbolic links followed from the state file to a regular file (Linux's own bound).
const MAX_LINKS: usize = 40;

/// The file `path` names once every symbolic link on the way is followed (a link's relative
/// target is relative to the link's directory); `path` itself when it is not a link or does
/// not exist yet. A loop of links is an error.
pub fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&at)?;
                at = match at.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(_) => return Ok(at),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(at),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "more than {MAX_LINKS} symbolic links from `{}` (a loop?)",
        path.display()
    )))
}

/// Whether the state file can be written where it is: the directory of the file it names
/// (links followed) exists. The error names the directory.
pub fn check_directory(path: &Path) -> Result<(), StateDirectoryError> {
    let file = resolve_links(path).map_err(|error| StateDirectoryError::Links {
        path: path.to_path_buf(),
        error,
    })?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(StateDirectoryError::Missing { dir })
    }
}

/// Why the state file could not be written where it is ([`check_directory`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateDirectoryError {
    /// Its symbolic links cannot be followed (a loop, or one cannot be read).
    #[error("cannot follow `{}`: {error}", .path.display())]
    Links {
        /// The state file as configured.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The directory it would be written in does not exist.
    #[error(
        "the directory `{}` does not exist: the state file could never be written, and every pin would fail",
        .dir.display()
    )]
    Missing {
        /// That directory.
        dir: PathBuf,
    },
}

/// Take the exclusive lock on [`lock_path`]`(path)`, trying until `timeout` has passed. Held
/// until the returned file is closed (flock(2) on Unix, LockFileEx on Windows), which also
/// happens when the process dies while holding it.
pub(super) fn lock(
    path: &Path,
    timeout: std::time::Duration,
) -> Result<std::fs::File, StateFileError> {
    let lock_at = lock_path(path);
    let locked = |error| StateFileError::Lock {
        path: lock_at.clone(),
        error,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_at)
        .map_err(locked)?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::Error(error)) => return Err(locked(error)),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(locked(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "another process has held the lock for more than {} s; a write takes \
                         milliseconds, so check for a hung gateway sharing this state file \
                         (`fuser` or `lsof` on the lock file name it) and, on a network file \
                         system, that its lock service works",
                        timeout.as_secs_f64()
                    ),
                )));
            }
        }
    }
}

/// Replace `path` with `bytes` atomically (temp file in the same directory, fsync, rename,
/// fsync of the directory).
///
/// Once the rename has succeeded, every reader sees the new file, so a failed fsync of the
/// directory after it is logged (`state_dir_sync_failed`) and counted as success: the data is
/// in place and only the rename's durability across a power loss is in doubt. Reporting it as
/// a failure would make an admin change roll back in memory while the file keeps it, and nothing
/// would correct that later: the gateway's next writes carry only what changes in its view.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, bytes, |dir| std::fs::File::open(dir)?.sync_all())
}

/// [`write_atomic`] with the directory fsync given (so a test can make it fail).
pub(super) fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    sync_dir: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
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
    let replaced = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = replaced {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // Make the rename itself durable.
    if let Err(e) = sync_dir(&dir) {
        crate::logging::log(
            "state_dir_sync_failed",
            &[
                ("path", &path.display().to_string()),
                ("error", &e.to_string()),
            ],
        );
    }
    Ok(())
}
