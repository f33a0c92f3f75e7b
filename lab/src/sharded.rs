//! One path for a whole run, a shard and a merge: a command works out its plan ([`Sharded`]),
//! and [`run`] runs all of its units (or a shard's, into a [`Partial`]) while [`merge`] builds
//! the outputs from the partials of every shard, exactly as a whole run builds them.
//!
//! The host keeps its own error type ([`Sharded::Error`]): the lab's failures (a partial that
//! cannot be written, a record no shard holds, inputs that changed since the shards ran) are
//! [`MergeError`]s converted into it, and the plan's own failures pass through untouched.

use crate::partial::{MergeError, MergeSet, Partial, Record, Results, VERSION};
use crate::shard::Shard;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// How long the runs took and on how many threads (the console's last line and `perf.json`;
/// for a merge, the shards' figures summed).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Wall seconds.
    pub wall_s: f64,
    /// Worker threads.
    pub threads: usize,
}

impl Timing {
    /// This process since `started`, on rayon's threads.
    pub fn since(started: Instant) -> Timing {
        Timing {
            wall_s: started.elapsed().as_secs_f64(),
            threads: rayon::current_num_threads(),
        }
    }
}

/// A command's plan, worked out from its arguments and inputs before anything runs: its job
/// list cut into units (numbered the same whatever the shard count), how to run some of them,
/// and how to build every output from the records of all of them.
pub trait Sharded {
    /// What one run (or search) leaves for the outputs.
    type Record: Record + Send;
    /// The host's error: the lab's own failures convert into it.
    type Error: From<MergeError> + From<std::io::Error>;
    /// The command's name.
    const COMMAND: &'static str;
    /// Units in the whole job list.
    fn units(&self) -> usize;
    /// The unit the record `key` belongs to; `None` when the job list has no such record.
    fn unit_of(&self, key: &RecordKey<Self>) -> Option<usize>;
    /// The record `key` in words (for the error when it is missing).
    fn describe(&self, key: &RecordKey<Self>) -> String;
    /// [`InputsHash`](crate::partial::InputsHash) of the inputs (as parsed, where the plan read them) and the canonical
    /// options.
    fn inputs_hash(&self) -> Result<u64, Self::Error>;
    /// Run these units (ascending); their records, in any order.
    fn run_units(&self, units: &[usize]) -> Result<Vec<Self::Record>, Self::Error>;
    /// Build the outputs from the records, [`Found::take`]n as needed, and write them.
    fn finish(
        &self,
        found: Found<'_, Self>,
        timing: Timing,
        out: &mut dyn Write,
        note: &mut dyn Write,
    ) -> Result<ExitCode, Self::Error>;
}

/// The key of a command's records.
pub type RecordKey<C> = <<C as Sharded>::Record as Record>::Key;

/// The records a command's outputs are built from, looked up by key: one place says which
/// shard and file should have held a missing one.
pub struct Found<'a, C: Sharded + ?Sized> {
    plan: &'a C,
    results: Results<C::Record>,
}

impl<C: Sharded + ?Sized> Found<'_, C> {
    /// The record `key`.
    ///
    /// # Errors
    /// [`MergeError::NotARun`] when the command's job list has no such record,
    /// [`MergeError::MissingRecord`] when no shard's partial holds it.
    pub fn take(&mut self, key: &RecordKey<C>) -> Result<C::Record, MergeError> {
        let unit = self.plan.unit_of(key).ok_or_else(|| MergeError::NotARun {
            what: format!("{key:?}"),
            command: C::COMMAND,
        })?;
        self.results.take(key, unit, || self.plan.describe(key))
    }
}

/// A shard's part of a command: which shard, where its partial goes, and the command line it
/// records (the arguments after the subcommand, without `--shard` and `--partial`).
#[derive(Debug, Clone)]
pub struct ShardRun {
    /// The shard.
    pub shard: Shard,
    /// The partial result's file.
    pub file: PathBuf,
    /// What the partial records of the command line.
    pub args: Vec<String>,
}

/// Run a command: the whole job list, or with `shard` the units it owns into a partial result
/// (the inputs hash is taken before anything runs, so an edit during the runs cannot be
/// recorded with results of the old inputs).
///
/// # Errors
/// The plan's, and a partial that cannot be written.
pub fn run<C: Sharded>(
    plan: &C,
    shard: Option<ShardRun>,
    out: &mut dyn Write,
    note: &mut dyn Write,
) -> Result<ExitCode, C::Error> {
    let Some(ShardRun { shard, file, args }) = shard else {
        let started = Instant::now();
        let all: Vec<usize> = (0..plan.units()).collect();
        let records = plan.run_units(&all)?;
        let found = Found {
            plan,
            results: Results::whole(records),
        };
        return plan.finish(found, Timing::since(started), out, note);
    };
    let inputs_hash = plan.inputs_hash()?;
    let units = plan.units();
    let owned: Vec<usize> = (0..units).filter(|&u| shard.owns(u)).collect();
    let started = Instant::now();
    let records = plan.run_units(&owned)?;
    let timing = Timing::since(started);
    Partial {
        version: VERSION.to_string(),
        command: C::COMMAND.to_string(),
        args,
        shard,
        units,
        inputs_hash,
        wall_s: timing.wall_s,
        threads: timing.threads,
        records: C::Record::into_records(records),
    }
    .write(&file)?;
    writeln!(
        out,
        "partial: {} (shard {shard}: {} of {units} units; `routelab merge` combines the {} \
         shards)",
        file.display(),
        owned.len(),
        shard.count()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Merge a command's partials (checked to belong together by
/// [`check_set`](crate::partial::check_set)): the inputs read now must hash as the shards' did,
/// each record must be its shard's and appear once; then the outputs are built as a whole run
/// builds them.
///
/// # Errors
/// [`MergeError::InputsChanged`], a record out of place, and the plan's own.
pub fn merge<C: Sharded>(
    plan: &C,
    set: MergeSet,
    out: &mut dyn Write,
    note: &mut dyn Write,
) -> Result<ExitCode, C::Error> {
    let now = plan.inputs_hash()?;
    if set.inputs_hash != now {
        return Err(MergeError::InputsChanged {
            partials: set.inputs_hash,
            now,
        }
        .into());
    }
    let results = Results::from_shards(set.parts, |key| plan.unit_of(key))?;
    let timing = Timing {
        wall_s: set.wall_s,
        threads: set.threads,
    };
    plan.finish(Found { plan, results }, timing, out, note)
}
