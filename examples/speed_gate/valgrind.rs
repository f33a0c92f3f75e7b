//! Counting a child's instructions with valgrind's cachegrind, with what moves a count held
//! still.
//!
//! What can move the count of the same code on the same input, and what is done about it:
//! - the environment (its size shifts the stack, and `RUST_*` variables change what std does):
//!   the child gets an empty one;
//! - address-space randomisation: the child runs under `setarch -R` where the kernel allows it;
//! - threads: the workloads are single-threaded, and valgrind runs one thread at a time anyway;
//! - the hash seeds of std's `HashMap`s (the router's model names, the probe cache), drawn from
//!   the OS at each start: not controlled; they account for the residual variation that
//!   `docs/performance.md` reports (a few thousand instructions in hundreds of millions).

use anyhow::{Context, bail};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to tell someone without valgrind what to install.
pub const INSTALL_HINT: &str = "the speed gate counts instructions with valgrind's cachegrind: \
     install Debian's `valgrind` package (`apt-get install valgrind`), or name a valgrind with \
     --valgrind PATH";

/// Runs children under cachegrind.
#[derive(Debug)]
pub struct Counter {
    valgrind: PathBuf,
    /// `setarch`, when it can turn address randomisation off here.
    setarch: Option<PathBuf>,
    /// Where cachegrind writes its output files.
    scratch: PathBuf,
}

/// One child's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// Instructions executed by the whole child process.
    pub instructions: u64,
    /// What the child printed as its outcome.
    pub outcome: u64,
}

impl Counter {
    /// Find `valgrind` (a path, or a name looked up on `PATH`) and check that it runs; find
    /// `setarch` and check that it may turn address randomisation off. Output files go under
    /// `scratch` (created).
    pub fn new(valgrind: &Path, scratch: PathBuf) -> anyhow::Result<Counter> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let Some(found) = locate(valgrind, &path) else {
            bail!(
                "valgrind not found (looked for `{}`{}): {INSTALL_HINT}",
                valgrind.display(),
                if is_bare_name(valgrind) {
                    " on PATH"
                } else {
                    ""
                }
            );
        };
        let version = Command::new(&found)
            .arg("--version")
            .output()
            .with_context(|| format!("cannot run {}: {INSTALL_HINT}", found.display()))?;
        if !version.status.success() {
            bail!(
                "{} --version failed ({}): {INSTALL_HINT}",
                found.display(),
                version.status
            );
        }
        let setarch = locate(Path::new("setarch"), &path).filter(|s| {
            Command::new(s)
                .args(["-R", "true"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("cannot create {}", scratch.display()))?;
        Ok(Counter {
            valgrind: found,
            setarch,
            scratch,
        })
    }

    /// Whether address randomisation is off in the children.
    pub fn randomisation_off(&self) -> bool {
        self.setarch.is_some()
    }

    /// `valgrind --version` (e.g. `valgrind-3.19.0`).
    pub fn version(&self) -> String {
        tool_version(&self.valgrind, "--version")
    }

    /// Count the instructions of `program args` run in `dir` under cachegrind, in an empty
    /// environment; `label` names the run in errors and its output file.
    pub fn count(
        &self,
        label: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
    ) -> anyhow::Result<Count> {
        let out_file = self.scratch.join(format!("{label}.cachegrind"));
        let mut cmd = match &self.setarch {
            Some(setarch) => {
                let mut c = Command::new(setarch);
                c.arg("-R").arg(&self.valgrind);
                c
            }
            None => Command::new(&self.valgrind),
        };
        cmd.arg("--tool=cachegrind")
            .arg("--cache-sim=no")
            .arg("--branch-sim=no")
            .arg(format!("--cachegrind-out-file={}", out_file.display()))
            .arg(program)
            .args(args)
            .current_dir(dir)
            .env_clear();
        let output = cmd
            .output()
            .with_context(|| format!("{label}: cannot start {}", self.valgrind.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!(
                "{label}: the measured run failed ({}):\n{}",
                output.status,
                tail(&stderr, 20)
            );
        }
        let text = std::fs::read_to_string(&out_file).with_context(|| {
            format!(
                "{label}: cachegrind wrote no {}:\n{}",
                out_file.display(),
                tail(&stderr, 20)
            )
        })?;
        let instructions = summary(&text)
            .with_context(|| format!("{label}: {} has no `summary:` line", out_file.display()))?;
        let _ = std::fs::remove_file(&out_file);
        let outcome = outcome(&stdout)
            .with_context(|| format!("{label}: the run printed no outcome:\n{stdout}"))?;
        Ok(Count {
            instructions,
            outcome,
        })
    }
}

/// A name without a directory part is looked up on `PATH`.
fn is_bare_name(p: &Path) -> bool {
    p.components().count() == 1 && !p.is_absolute()
}

/// `program` if it names an executable file, else its first match on `path` (a `PATH` value).
pub fn locate(program: &Path, path: &std::ffi::OsStr) -> Option<PathBuf> {
    if !is_bare_name(program) {
        return is_executable(program).then(|| program.to_path_buf());
    }
    std::env::split_paths(&OsString::from(path))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first line `tool flag` prints, or `unknown`.
pub fn tool_version(tool: &Path, flag: &str) -> String {
    Command::new(tool)
        .arg(flag)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The total of a cachegrind output file: its `summary: N` line (one event, `Ir`).
fn summary(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|n| n.trim().parse().ok())
}

/// The child's `outcome N` line.
fn outcome(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("outcome "))
        .and_then(|n| n.trim().parse().ok())
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_valgrind_names_the_package_to_install() {
        let scratch = std::env::temp_dir().join("speed-gate-test-missing");
        for missing in ["valgrind-that-is-not-installed", "/nowhere/bin/valgrind"] {
            let e = Counter::new(Path::new(missing), scratch.clone()).unwrap_err();
            let msg = format!("{e:#}");
            assert!(msg.starts_with("valgrind not found"), "{msg}");
            assert!(msg.contains(missing), "{msg}");
            assert!(msg.contains("Debian's `valgrind` package"), "{msg}");
        }
        let e = Counter::new(Path::new("valgrind-that-is-not-installed"), scratch).unwrap_err();
        assert!(format!("{e:#}").contains("on PATH"), "{e:#}");
    }

    #[test]
    fn locate_searches_path_in_order_and_skips_what_cannot_run() {
        let dir = std::env::temp_dir().join(format!("speed-gate-locate-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        // `a/tool` is not executable, `b/tool` is.
        std::fs::write(a.join("tool"), "").unwrap();
        std::fs::write(b.join("tool"), "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(locate(Path::new("tool"), &path), Some(b.join("tool")));
        assert_eq!(locate(Path::new("other"), &path), None);
        assert_eq!(locate(&a.join("tool"), &path), None);
        assert_eq!(locate(&b.join("tool"), &path), Some(b.join("tool")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_cachegrind_summary_and_the_outcome() {
        let out = "desc: I1 cache: none\ncmd: x\nevents: Ir\nfl=a.rs\n1 5\nsummary: 522723434\n";
        assert_eq!(summary(out), Some(522_723_434));
        assert_eq!(summary("events: Ir\n"), None);
        assert_eq!(summary("summary: 12 34\n"), None);
        assert_eq!(outcome("noise\noutcome 366708\n"), Some(366_708));
        assert_eq!(outcome("outcome x\n"), None);
        assert_eq!(tail("1\n2\n3", 2), "2\n3");
    }
}
