//! Partial results of a sharded run (`--shard K/N`) and the checks `routelab merge` makes.
//!
//! A command's job list is cut into *units* (deterministic, numbered the same whatever N is;
//! [`crate::shard::Shard::owns`] deals them out). A shard runs its units and records what the
//! command's writers need of each run — never the outputs themselves — in a [`Partial`]: the
//! routelab version, the command, its arguments, K and N, and a content hash of the inputs and
//! options ([`InputsHash`], taken before the runs). `merge` checks the partials belong together
//! ([`check_set`]: one version, command, hash and set of arguments, every shard once) and which
//! records each holds ([`Results::from_shards`]: each its shard's, each once), then hands them
//! back to the command, which assembles exactly the structures a single run builds and calls
//! the same writers. A single run goes the same way with one shard that owns every unit,
//! so the two cannot drift apart.
//!
//! The file is JSON (raw serde structs in `raw.rs`; the domain types stay non-`Serialize`):
//! `f64` values round-trip exactly through serde_json, integers stay integers.

mod hash;
mod raw;

pub use hash::{HashReadError, InputsHash};

use crate::shard::Shard;
use routelab_policies::InputError;
use routelab_reports::PerfRun;
use routelab_reports::RunSummary;
use routelab_reports::capacity::SeedCapacity;
use routelab_sim::histogram::Histogram;
use std::path::{Path, PathBuf};

/// One run of `compare`: scenario `scenario`, seed ordinal `ordinal`, policy `policy` (indices
/// into the command's lists).
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRun {
    /// Scenario index.
    pub scenario: usize,
    /// Seed ordinal (k of [`crate::seed_of`]).
    pub ordinal: usize,
    /// Policy index within the scenario.
    pub policy: usize,
    /// The seed.
    pub seed: u64,
    /// Its catalog values.
    pub summary: RunSummary,
    /// The end-to-end latency histogram, kept for the first seed only (the CDF chart's).
    pub e2e: Option<Histogram>,
    /// Requests simulated (the console's total).
    pub requests: u64,
    /// Wall-clock figures (`perf.json` only).
    pub perf: PerfRun,
}

impl routelab_reports::SeedResult for CompareRun {
    fn push_to(&self, policy: &mut routelab_reports::PolicySeeds, seed: u64) {
        policy.push_summary(seed, self.summary.clone(), self.e2e.as_ref());
    }
}

/// One run of `sweep`: job `job` in the command's order (grid point, policy, seed).
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRun {
    /// Job index.
    pub job: usize,
    /// The seed.
    pub seed: u64,
    /// Its catalog values.
    pub summary: RunSummary,
}

/// One capacity search of `capacity`: scenario, policy (indices) and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityRun {
    /// Scenario index.
    pub scenario: usize,
    /// Policy index within the study.
    pub policy: usize,
    /// What the search found (its seed inside).
    pub found: SeedCapacity,
}

/// One run of `check`: job `job` in the gate's order, and its gate values.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRun {
    /// Job index (`Gate::jobs` order).
    pub job: usize,
    /// [`crate::gate::gate_values`] of the run.
    pub values: Vec<(String, Option<f64>)>,
}

/// The records of one or more shards.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Records {
    /// `compare`.
    Compare(Vec<CompareRun>),
    /// `sweep`.
    Sweep(Vec<SweepRun>),
    /// `capacity`.
    Capacity(Vec<CapacityRun>),
    /// `check`.
    Check(Vec<CheckRun>),
}

impl Records {
    /// The command these records belong to.
    pub fn command(&self) -> &'static str {
        match self {
            Records::Compare(_) => "compare",
            Records::Sweep(_) => "sweep",
            Records::Capacity(_) => "capacity",
            Records::Check(_) => "check",
        }
    }
}

/// One kind of record: what identifies it within its command's job list, and its place in
/// [`Records`].
pub trait Record: Sized {
    /// Identifies a record; no two records of one run share it.
    type Key: Ord + Clone + std::fmt::Debug;
    /// This record's key.
    fn key(&self) -> Self::Key;
    /// Records of this kind as [`Records`].
    fn into_records(records: Vec<Self>) -> Records;
    /// The records of this kind, if `records` holds this kind.
    fn from_records(records: Records) -> Option<Vec<Self>>;
}

macro_rules! record_kind {
    ($run:ty, $variant:ident, $key:ty, |$r:ident| $make:expr) => {
        impl Record for $run {
            type Key = $key;
            fn key(&self) -> $key {
                let $r = self;
                $make
            }
            fn into_records(records: Vec<Self>) -> Records {
                Records::$variant(records)
            }
            fn from_records(records: Records) -> Option<Vec<Self>> {
                match records {
                    Records::$variant(r) => Some(r),
                    _ => None,
                }
            }
        }
    };
}

record_kind!(CompareRun, Compare, (usize, usize, usize), |r| (
    r.scenario, r.ordinal, r.policy
));
record_kind!(SweepRun, Sweep, usize, |r| r.job);
record_kind!(CapacityRun, Capacity, (usize, usize, u64), |r| (
    r.scenario,
    r.policy,
    r.found.seed
));
record_kind!(CheckRun, Check, usize, |r| r.job);

/// One shard's partial result.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// The routelab version that wrote it ([`VERSION`]).
    pub version: String,
    /// `compare`, `sweep`, `capacity` or `check`.
    pub command: String,
    /// The command's arguments as given, without `--shard` and `--partial` (so `merge` can
    /// take the same options, `--out` and `--findings` included).
    pub args: Vec<String>,
    /// Which shard.
    pub shard: Shard,
    /// Units in the whole job list (the same for every shard).
    pub units: usize,
    /// [`InputsHash`] of the inputs and canonical options.
    pub inputs_hash: u64,
    /// Wall seconds this shard took (for `perf.json`).
    pub wall_s: f64,
    /// Worker threads it used (for `perf.json`).
    pub threads: usize,
    /// What its units produced.
    pub records: Records,
}

/// This routelab's version, recorded in every partial: a merge refuses partials another
/// version wrote (its runs or its record format may differ).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where a shard writes its partial by default: `out/partials/shard-K-of-N.json`.
pub fn default_partial_path(shard: Shard) -> PathBuf {
    Path::new("out").join("partials").join(format!(
        "shard-{}-of-{}.json",
        shard.index(),
        shard.count()
    ))
}

/// A partial that cannot be written, read, or merged with the others.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// Unreadable or malformed (not a partial, or values that are not what a shard writes).
    #[error(transparent)]
    Input(#[from] InputError),
    /// Could not be written.
    #[error("{file}: cannot write the partial result: {source}")]
    Write {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Partials of different commands, inputs, options or shard counts.
    #[error(
        "{first} and {other} were made from different inputs ({first}: {first_what}; {other}: \
         {other_what}); run every shard with the same files and options"
    )]
    DifferentInputs {
        /// The first partial given.
        first: String,
        /// What it was made from.
        first_what: String,
        /// A partial that differs from it.
        other: String,
        /// What that one was made from.
        other_what: String,
    },
    /// Partials of one input hash whose recorded arguments differ (e.g. `--out`): the merge
    /// would depend on which came first, so it refuses.
    #[error(
        "{first} and {other} were run with different arguments (`{first_args}` and \
         `{other_args}`); run every shard with the same arguments but `--shard` and `--partial`"
    )]
    DifferentArgs {
        /// The first partial given.
        first: String,
        /// Its arguments.
        first_args: String,
        /// A partial that differs from it.
        other: String,
        /// Its arguments.
        other_args: String,
    },
    /// Written by another routelab version.
    #[error(
        "{file} was made by routelab {made_by}, this is {this}; run the shards and the merge with one routelab"
    )]
    OtherVersion {
        /// The partial.
        file: String,
        /// The version that wrote it.
        made_by: String,
        /// This version.
        this: &'static str,
    },
    /// A record its shard does not own, or one its command's job list does not have.
    #[error(
        "{file} holds a result {what} that shard {shard} does not run; was the partial edited, \
         or made by another command line?"
    )]
    NotOwned {
        /// The partial.
        file: String,
        /// Its shard.
        shard: Shard,
        /// The record, as its key.
        what: String,
    },
    /// The same record in two partials (or twice in one).
    #[error("the result {what} is in both {first} and {second}; was a partial edited?")]
    DuplicateRecord {
        /// The record, as its key.
        what: String,
        /// One file.
        first: String,
        /// The other.
        second: String,
    },
    /// A record the command needs is in no partial.
    #[error(
        "the results hold no run of {what}; {owner} should hold it; were the partial results edited?"
    )]
    MissingRecord {
        /// The run.
        what: String,
        /// The shard and file that should hold it.
        owner: String,
    },
    /// The same shard twice.
    #[error("shard {shard} is given twice: {first} and {second}")]
    Duplicate {
        /// Which shard.
        shard: Shard,
        /// One file.
        first: String,
        /// The other.
        second: String,
    },
    /// Some shards have no partial.
    #[error("missing shards {missing} of {count} (given: {given})")]
    Missing {
        /// The missing shard numbers, e.g. `2, 5`.
        missing: String,
        /// N.
        count: u32,
        /// The files given.
        given: String,
    },
    /// Nothing to merge.
    #[error("no partial results given")]
    Empty,
    /// The inputs or options read at the merge hash otherwise than the shards' did.
    #[error(
        "the inputs or options changed since the shards ran (the partials' inputs hash is \
         {partials:016x}, the files here hash to {now:016x}); merge where the shards' input \
         files are, or run the shards again"
    )]
    InputsChanged {
        /// The partials' hash.
        partials: u64,
        /// The hash of the inputs read now.
        now: u64,
    },
    /// A record the command's job list does not have.
    #[error("{what} is not a run of `{command}`")]
    NotARun {
        /// The record, as its key.
        what: String,
        /// The command.
        command: &'static str,
    },
}

impl Partial {
    /// Write the partial as JSON to `file` (creating its directory).
    pub fn write(&self, file: &Path) -> Result<(), MergeError> {
        let text = raw::to_json(self)?;
        let write = |source| MergeError::Write {
            file: file.to_path_buf(),
            source,
        };
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(write)?;
        }
        std::fs::write(file, text).map_err(write)
    }

    /// Read a partial written by [`Partial::write`].
    pub fn read(file: &Path) -> Result<Partial, MergeError> {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(file).map_err(|e| InputError::unreadable(&name, &e))?;
        Ok(raw::from_json(&text, &name)?)
    }

    /// What this partial was made from, as the "different inputs" error shows it.
    fn made_from(&self) -> String {
        format!(
            "`{}` with {} shards, inputs and options hash {:016x}",
            self.command,
            self.shard.count(),
            self.inputs_hash
        )
    }
}

/// Partials that belong together: one command, one inputs hash, one set of arguments, every
/// shard exactly once.
#[derive(Debug, Clone)]
pub struct MergeSet {
    /// The command.
    pub command: String,
    /// Its arguments (every partial's are the same).
    pub args: Vec<String>,
    /// The inputs hash they share.
    pub inputs_hash: u64,
    /// Every shard's file and records, in shard order.
    pub parts: Vec<(String, Shard, Records)>,
    /// The shards' wall seconds, summed (for `perf.json`).
    pub wall_s: f64,
    /// The shards' threads, summed.
    pub threads: usize,
}

/// Check that `partials` (file name, partial) are the N shards of one run by this routelab.
/// Refuses partials of another version, made from different inputs or arguments, a shard given
/// twice and missing shards, naming the files. Which records each holds is checked by
/// [`Results::from_shards`], which knows the command's units.
pub fn check_set(partials: Vec<(String, Partial)>) -> Result<MergeSet, MergeError> {
    let Some((first_file, first)) = partials.first() else {
        return Err(MergeError::Empty);
    };
    for (file, p) in &partials {
        if p.version != VERSION {
            return Err(MergeError::OtherVersion {
                file: file.clone(),
                made_by: p.version.clone(),
                this: VERSION,
            });
        }
    }
    let count = first.shard.count();
    for (file, p) in &partials[1..] {
        if p.command != first.command
            || p.inputs_hash != first.inputs_hash
            || p.shard.count() != count
            || p.units != first.units
        {
            return Err(MergeError::DifferentInputs {
                first: first_file.clone(),
                first_what: first.made_from(),
                other: file.clone(),
                other_what: p.made_from(),
            });
        }
        if p.args != first.args {
            return Err(MergeError::DifferentArgs {
                first: first_file.clone(),
                first_args: first.args.join(" "),
                other: file.clone(),
                other_args: p.args.join(" "),
            });
        }
    }
    let mut by_shard: Vec<Option<&str>> = vec![None; count as usize];
    for (file, p) in &partials {
        let slot = &mut by_shard[p.shard.index() as usize - 1];
        if let Some(earlier) = slot {
            return Err(MergeError::Duplicate {
                shard: p.shard,
                first: earlier.to_string(),
                second: file.clone(),
            });
        }
        *slot = Some(file);
    }
    let missing: Vec<String> = by_shard
        .iter()
        .enumerate()
        .filter(|(_, f)| f.is_none())
        .map(|(i, _)| (i + 1).to_string())
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing {
            missing: missing.join(", "),
            count,
            given: partials
                .iter()
                .map(|(f, _)| f.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let (command, args, inputs_hash) =
        (first.command.clone(), first.args.clone(), first.inputs_hash);
    let mut sorted = partials;
    sorted.sort_by_key(|(_, p)| p.shard);
    let mut wall_s = 0.0;
    let mut threads = 0;
    let mut parts = Vec::with_capacity(sorted.len());
    for (file, p) in sorted {
        wall_s += p.wall_s;
        threads += p.threads;
        parts.push((file, p.shard, p.records));
    }
    Ok(MergeSet {
        command,
        args,
        inputs_hash,
        parts,
        wall_s,
        threads,
    })
}

/// The records a command assembles its outputs from, by key, and where they came from: one
/// process, or the files of N shards (so a missing record names the shard and file that
/// should hold it). Assembling [`Results::take`]s each record it needs; what is never taken
/// counts nowhere.
#[derive(Debug)]
pub struct Results<R: Record> {
    by_key: std::collections::BTreeMap<R::Key, R>,
    /// Shard k's file at k − 1; empty for one process.
    files: Vec<String>,
}

impl<R: Record> Results<R> {
    /// The records of one process that ran every unit.
    pub fn whole(records: Vec<R>) -> Results<R> {
        Results {
            by_key: records.into_iter().map(|r| (r.key(), r)).collect(),
            files: Vec::new(),
        }
    }

    /// The records of a checked set's shards (in shard order, as [`check_set`] returns them).
    /// Each record must belong to a unit of the command (`unit_of` its key is `Some`) that its
    /// shard owns, and appear once across the set; otherwise the error names the file.
    pub fn from_shards(
        parts: Vec<(String, Shard, Records)>,
        unit_of: impl Fn(&R::Key) -> Option<usize>,
    ) -> Result<Results<R>, MergeError> {
        let mut by_key = std::collections::BTreeMap::new();
        let mut from: std::collections::BTreeMap<R::Key, usize> = Default::default();
        let mut files = Vec::with_capacity(parts.len());
        for (at, (file, shard, records)) in parts.into_iter().enumerate() {
            let records = R::from_records(records).ok_or_else(|| {
                InputError::new(&file, "records", "holds results of another command")
            })?;
            for r in records {
                let key = r.key();
                if !unit_of(&key).is_some_and(|u| shard.owns(u)) {
                    return Err(MergeError::NotOwned {
                        file,
                        shard,
                        what: format!("{key:?}"),
                    });
                }
                if let Some(&earlier) = from.get(&key) {
                    let first: &String = files.get(earlier).unwrap_or(&file);
                    return Err(MergeError::DuplicateRecord {
                        what: format!("{key:?}"),
                        first: first.clone(),
                        second: file,
                    });
                }
                from.insert(key.clone(), at);
                by_key.insert(key, r);
            }
            files.push(file);
        }
        Ok(Results { by_key, files })
    }

    /// The record `key` (of unit `unit`, described as `what` should it be missing).
    pub fn take(
        &mut self,
        key: &R::Key,
        unit: usize,
        what: impl FnOnce() -> String,
    ) -> Result<R, MergeError> {
        self.by_key.remove(key).ok_or_else(|| {
            let n = self.files.len();
            MergeError::MissingRecord {
                what: what(),
                owner: match self.files.get(unit % n.max(1)) {
                    Some(file) => format!("shard {}/{n} ({file})", unit % n + 1),
                    None => "the run".to_string(),
                },
            }
        })
    }
}

#[cfg(test)]
mod tests;
