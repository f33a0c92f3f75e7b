//! Where a scenario's `profile:` (or `routelab profile show PROFILE`) is found: the one lookup.
//!
//! A `profile:` that contains a path separator or ends in `.yaml` / `.yml` is a file, relative
//! to the scenario's directory. Anything else is a name, looked up in this order, first match
//! wins:
//!
//! 1. the scenario's `hardware_dir` (relative to the scenario's directory), when given;
//! 2. the nearest `hardware/` or `scenarios/hardware/` directory beside the scenario or above
//!    it (the walk stops at the first one that exists);
//! 3. the profiles bundled into the binary ([`BUNDLED`], the repository's
//!    `scenarios/hardware/*.yaml`), so a scenario anywhere can name them;
//! 4. the directories of the `ROUTELAB_HARDWARE` environment variable, a path list separated as
//!    `PATH` is.
//!
//! A name `n` is the file `n.yaml` in a directory. Because the bundled profiles come after the
//! scenario's own directories, a bundled scenario still reads its profiles from disk (the same
//! bytes, see the test that the bundled list equals the directory).

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

use routelab_policies::located::InputError;

use super::HardwareProfile;

/// The environment variable with extra profile directories (searched last).
pub const ENV_VAR: &str = "ROUTELAB_HARDWARE";

/// Origin prefix of a bundled profile: `bundled:<name>`.
pub const BUNDLED_ORIGIN_PREFIX: &str = "bundled:";

/// Every profile of `scenarios/hardware/`, built into the binary: (name, YAML text). A unit test
/// checks that this list equals the directory, so a new file cannot be forgotten.
pub const BUNDLED: &[(&str, &str)] = &[
    (
        "h100-27b",
        include_str!("../../../scenarios/hardware/h100-27b.yaml"),
    ),
    (
        "mac-m2-ultra-27b",
        include_str!("../../../scenarios/hardware/mac-m2-ultra-27b.yaml"),
    ),
    (
        "mac-m3-ultra-27b",
        include_str!("../../../scenarios/hardware/mac-m3-ultra-27b.yaml"),
    ),
    (
        "rtx-pro-6000-27b",
        include_str!("../../../scenarios/hardware/rtx-pro-6000-27b.yaml"),
    ),
    (
        "rtx4090-27b",
        include_str!("../../../scenarios/hardware/rtx4090-27b.yaml"),
    ),
    (
        "rtx4090x2-27b",
        include_str!("../../../scenarios/hardware/rtx4090x2-27b.yaml"),
    ),
    (
        "rtx5090-27b",
        include_str!("../../../scenarios/hardware/rtx5090-27b.yaml"),
    ),
];

/// A profile that could not be found or read.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LookupError {
    /// No directory holds the name and no bundled profile has it.
    NotFound {
        /// The name asked for.
        name: String,
        /// Every place looked in, in lookup order.
        looked_in: Vec<String>,
        /// Every name that would have been found.
        available: Vec<String>,
    },
    /// A path profile whose file does not exist.
    MissingFile {
        /// The path, as resolved against the scenario's directory.
        path: String,
    },
    /// The profile was found but is not valid (the error is located in the profile's file).
    Invalid {
        /// The `profile:` as written.
        spec: String,
        /// What is wrong with it (boxed: the error stays small in every `Result`).
        error: Box<InputError>,
    },
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::NotFound {
                name,
                looked_in,
                available,
            } => write!(
                f,
                "no hardware profile `{name}` (looked in: {}); available: {}",
                looked_in.join("; "),
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ),
            LookupError::MissingFile { path } => write!(f, "no profile file {path}"),
            LookupError::Invalid { spec, error } => {
                write!(f, "profile `{spec}` is invalid: {error}")
            }
        }
    }
}

impl std::error::Error for LookupError {}

impl LookupError {
    /// As the located error of the input that named the profile (`file`, `field`).
    pub fn located(&self, file: impl Into<String>, field: impl Into<String>) -> InputError {
        let e = InputError::new(file, field, self.to_string());
        match self {
            LookupError::NotFound { .. } => e.valid(
                "one of the available names, or a path to a profile file (containing `/` or \
                 ending in .yaml / .yml; relative to the scenario's directory, or to the \
                 current directory for `routelab profile show`)",
            ),
            LookupError::MissingFile { .. } => e.valid(
                "an existing profile file (a profile containing `/` or ending in .yaml / .yml \
                 is a path, relative to the scenario's directory, or to the current directory \
                 for `routelab profile show`)",
            ),
            LookupError::Invalid { .. } => e,
        }
    }
}

/// The places a profile name is looked in, for one scenario (or the current directory).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileLookup {
    /// Directory that path profiles are relative to.
    base: PathBuf,
    /// `hardware_dir` (if given), then the nearest walked directory (if any).
    dirs: Vec<PathBuf>,
    /// The `ROUTELAB_HARDWARE` directories.
    env_dirs: Vec<PathBuf>,
    /// Whether `ROUTELAB_HARDWARE` was set (for the not-found message).
    env_set: bool,
}

impl ProfileLookup {
    /// The lookup for a scenario file with its optional `hardware_dir`, reading
    /// `ROUTELAB_HARDWARE` from the environment.
    pub fn for_scenario(scenario: &Path, hardware_dir: Option<&str>) -> Self {
        let base = scenario.parent().unwrap_or(Path::new("."));
        Self::new(base, hardware_dir, std::env::var_os(ENV_VAR).as_deref())
    }

    /// The lookup of a profile named on the command line (`profile show`, `emulate`): paths
    /// and the directory walk start from the current directory, as a scenario's start from
    /// the scenario's.
    #[must_use]
    pub fn for_command_line() -> Self {
        Self::new(Path::new(""), None, std::env::var_os(ENV_VAR).as_deref())
    }

    /// The lookup from directory `base` (paths are relative to it), with an optional
    /// `hardware_dir` (relative to `base`) and the value of `ROUTELAB_HARDWARE` (`None` when
    /// unset).
    pub fn new(base: &Path, hardware_dir: Option<&str>, env: Option<&OsStr>) -> Self {
        let mut dirs = Vec::new();
        if let Some(d) = hardware_dir {
            dirs.push(base.join(d));
        }
        if let Some(walked) = nearest_hardware_dir(base)
            && !dirs.contains(&walked)
        {
            dirs.push(walked);
        }
        let env_dirs = env
            .map(|v| {
                std::env::split_paths(v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        ProfileLookup {
            base: base.to_path_buf(),
            dirs,
            env_dirs,
            env_set: env.is_some(),
        }
    }

    /// Whether `spec` names a file rather than a profile name.
    pub fn is_path(spec: &str) -> bool {
        spec.contains('/')
            || spec.contains(std::path::MAIN_SEPARATOR)
            || spec.ends_with(".yaml")
            || spec.ends_with(".yml")
    }

    /// Finds, reads and validates the profile `spec` (a path or a name).
    pub fn find(&self, spec: &str) -> Result<HardwareProfile, LookupError> {
        let invalid = |error| LookupError::Invalid {
            spec: spec.to_string(),
            error: Box::new(error),
        };
        if Self::is_path(spec) {
            let path = self.base.join(spec);
            if !path.is_file() {
                return Err(LookupError::MissingFile {
                    path: path.display().to_string(),
                });
            }
            return HardwareProfile::load(&path).map_err(invalid);
        }
        let in_dir = |dir: &Path| -> Option<Result<HardwareProfile, LookupError>> {
            let file = dir.join(format!("{spec}.yaml"));
            file.is_file()
                .then(|| HardwareProfile::load(&file).map_err(invalid))
        };
        if let Some(found) = self.dirs.iter().find_map(|d| in_dir(d)) {
            return found;
        }
        if let Some((name, src)) = BUNDLED.iter().find(|(n, _)| *n == spec) {
            let origin = format!("{BUNDLED_ORIGIN_PREFIX}{name}");
            return HardwareProfile::from_yaml_str(src, &origin).map_err(invalid);
        }
        if let Some(found) = self.env_dirs.iter().find_map(|d| in_dir(d)) {
            return found;
        }
        Err(LookupError::NotFound {
            name: spec.to_string(),
            looked_in: self.places(),
            available: self.available(),
        })
    }

    /// Every place a name is looked in, in order, as a person would read it.
    pub fn places(&self) -> Vec<String> {
        let mut out: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        out.push("the profiles bundled into routelab".to_string());
        if self.env_set {
            out.extend(
                self.env_dirs
                    .iter()
                    .map(|d| format!("{} (from {ENV_VAR})", d.display())),
            );
        } else {
            out.push(format!("{ENV_VAR} (not set)"));
        }
        out
    }

    /// Every name the lookup can find, sorted, without repeats.
    pub fn available(&self) -> Vec<String> {
        let mut names: Vec<String> = BUNDLED.iter().map(|(n, _)| n.to_string()).collect();
        for dir in self.dirs.iter().chain(&self.env_dirs) {
            names.extend(yaml_stems(dir));
        }
        names.sort();
        names.dedup();
        names
    }
}

/// The nearest `hardware/` or `scenarios/hardware/` at or above `base`.
fn nearest_hardware_dir(base: &Path) -> Option<PathBuf> {
    let found_in = |d: &Path| {
        [d.join("hardware"), d.join("scenarios").join("hardware")]
            .into_iter()
            .find(|candidate| candidate.is_dir())
    };
    // The relative ancestors first, so a directory found there keeps the path it is named by.
    let mut dir = Some(base);
    while let Some(d) = dir {
        if let Some(found) = found_in(d) {
            return Some(found);
        }
        dir = d.parent();
    }
    // A relative path's ancestors end at the current directory (`""`); the walk goes on above
    // it, so `cd scenarios/mine && routelab run x.yaml` finds `scenarios/hardware`.
    if base.is_relative() {
        let cwd = std::env::current_dir().ok()?;
        let mut dir = cwd.parent();
        while let Some(d) = dir {
            if let Some(found) = found_in(d) {
                return Some(found);
            }
            dir = d.parent();
        }
    }
    None
}

/// The stems of the `*.yaml` files of `dir` (none when it cannot be read).
fn yaml_stems(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let p = e.path();
                    (p.extension()? == "yaml").then(|| p.file_stem()?.to_str().map(String::from))?
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_hardware_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/hardware")
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("routelab-lookup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn profile_text(name: &str) -> String {
        BUNDLED
            .iter()
            .find(|(n, _)| *n == "rtx4090-27b")
            .unwrap()
            .1
            .replace("name: rtx4090-27b", &format!("name: {name}"))
    }

    #[test]
    fn bundled_list_equals_the_directory() {
        let mut on_disk: Vec<(String, String)> = std::fs::read_dir(repo_hardware_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .map(|p| {
                let stem = p.file_stem().unwrap().to_str().unwrap().to_string();
                (stem, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        on_disk.sort();
        let bundled: Vec<(String, String)> = BUNDLED
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
        assert_eq!(
            bundled.iter().map(|b| &b.0).collect::<Vec<_>>(),
            on_disk.iter().map(|b| &b.0).collect::<Vec<_>>(),
            "BUNDLED must list every scenarios/hardware/*.yaml, sorted"
        );
        assert_eq!(bundled, on_disk);
        for (name, src) in BUNDLED {
            let p = HardwareProfile::from_yaml_str(src, name).unwrap();
            assert_eq!(p.name(), *name, "a bundled profile's name is its file stem");
        }
    }

    #[test]
    fn path_or_name() {
        assert!(ProfileLookup::is_path("x.yaml"));
        assert!(ProfileLookup::is_path("x.yml"));
        assert!(ProfileLookup::is_path("../hw/x"));
        assert!(!ProfileLookup::is_path("rtx-pro-6000-27b"));
    }

    #[test]
    fn order_is_hardware_dir_walk_bundled_env() {
        let root = scratch("order");
        let sc = root.join("a/b");
        std::fs::create_dir_all(&sc).unwrap();
        let own = root.join("own");
        let walked = root.join("a/hardware");
        let env1 = root.join("env1");
        let env2 = root.join("env2");
        for d in [&own, &walked, &env1, &env2] {
            std::fs::create_dir_all(d).unwrap();
        }
        // a bundled name shadowed by hardware_dir and by the walked directory
        std::fs::write(own.join("rtx4090-27b.yaml"), profile_text("from-own")).unwrap();
        std::fs::write(walked.join("walked-only.yaml"), profile_text("walked")).unwrap();
        std::fs::write(walked.join("h100-27b.yaml"), profile_text("walked-h100")).unwrap();
        std::fs::write(env1.join("h100-27b.yaml"), profile_text("env-h100")).unwrap();
        std::fs::write(env2.join("env-only.yaml"), profile_text("env2")).unwrap();
        let env = std::env::join_paths([&env1, &env2]).unwrap();
        let l = ProfileLookup::new(&sc, Some("../../own"), Some(&env));

        assert_eq!(l.find("rtx4090-27b").unwrap().name(), "from-own");
        assert_eq!(l.find("walked-only").unwrap().name(), "walked");
        assert_eq!(l.find("h100-27b").unwrap().name(), "walked-h100");
        let bundled = l.find("rtx5090-27b").unwrap();
        assert_eq!(bundled.origin(), "bundled:rtx5090-27b");
        assert_eq!(l.find("env-only").unwrap().name(), "env2");
        let by_path = l.find("../hardware/walked-only.yaml").unwrap();
        assert_eq!(by_path.name(), "walked");

        // without the scenario's directories the bundled profile wins over the environment
        let bare = ProfileLookup::new(&root.join("env1"), None, Some(&env));
        assert_eq!(bare.find("h100-27b").unwrap().origin(), "bundled:h100-27b");
    }

    #[test]
    fn not_found_lists_places_and_names() {
        let root = scratch("missing");
        let l = ProfileLookup::new(&root, None, None);
        let e = l.find("nope").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("the profiles bundled into routelab"), "{msg}");
        assert!(msg.contains("ROUTELAB_HARDWARE (not set)"), "{msg}");
        for (name, _) in BUNDLED {
            assert!(msg.contains(name), "{msg}");
        }
        let located = e.located("s.yaml", "fleet[0].profile");
        assert_eq!(located.field, "fleet[0].profile");
        assert!(located.valid.is_some());
        let e = l.find("gone.yaml").unwrap_err();
        assert!(matches!(e, LookupError::MissingFile { .. }), "{e}");
    }

    #[test]
    fn invalid_profile_names_its_own_file() {
        let root = scratch("invalid");
        std::fs::write(root.join("bad.yaml"), "name: bad\n").unwrap();
        let e = ProfileLookup::new(&root, None, None)
            .find("bad.yaml")
            .unwrap_err();
        let LookupError::Invalid { error, .. } = &e else {
            panic!("{e}")
        };
        assert!(error.file.ends_with("bad.yaml"), "{e}");
        assert_eq!(error.field, "decode", "{e}");
    }
}
