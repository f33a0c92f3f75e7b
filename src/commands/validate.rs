//! `routelab validate FILE...`: lint scenario files without running them.
//!
//! A scenario that loads can still fail its first run on a trace it names: an empty file, or a
//! mapping that names a column the CSV header lacks, is only read when the trace is replayed.
//! So every trace source is read through here too, as a run reads it, and its errors are the
//! file's (issue 41: `validate` said ok, and the run then failed under a policy's name).

use routelab_sim::Scenario;
use routelab_sim::traffic::{TrafficError, TrafficSource, open_trace};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Validate every file; print one line per file (and every error); exit 2 if any is invalid.
pub fn run(
    files: &[PathBuf],
    policies: &[String],
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut bad = 0usize;
    for f in files {
        let loaded = Scenario::load(f)
            .map_err(anyhow::Error::new)
            .and_then(|sc| {
                read_traces(&sc)
                    .map(|()| sc)
                    .map_err(|(i, e)| anyhow::anyhow!("{}: traffic[{i}]: {e}", f.display()))
            })
            .and_then(|sc| super::run::policies_for(&sc, policies).map(|_| sc));
        match loaded {
            Ok(sc) => {
                writeln!(
                    out,
                    "ok    {}  ({}: {} workers, {} traffic sources, {} events, {} policies)",
                    f.display(),
                    sc.name,
                    sc.setup.workers.len(),
                    sc.traffic.len(),
                    sc.setup.events.len(),
                    sc.policies.len()
                )?;
                for w in super::scenario_warnings(&sc) {
                    writeln!(err, "warning: {}: {w}", f.display())?;
                }
            }
            Err(e) => {
                bad += 1;
                writeln!(err, "error: {e:#}")?;
            }
        }
    }
    if bad > 0 {
        writeln!(err, "{bad} of {} file(s) invalid", files.len())?;
        Ok(ExitCode::from(crate::EXIT_BAD_INPUT))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// Read every trace source of `sc` whole, as recorded (a resample draws from the same rows),
/// so an empty trace, a missing mapping column or a bad row is reported now, not by the run.
fn read_traces(sc: &Scenario) -> Result<(), (usize, TrafficError)> {
    for (i, path, format, options) in sc.trace_sources() {
        let options = routelab_sim::traffic::ReplayOptions {
            resample: None,
            ..options.clone()
        };
        let drained = open_trace(path, format.clone(), &options, 0).and_then(|mut source| {
            while source.next_arrival()?.is_some() {}
            Ok(())
        });
        drained.map_err(|e| (i, e))?;
    }
    Ok(())
}
