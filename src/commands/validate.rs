//! `routelab validate FILE...`: lint scenario files without running them.

use routelab_sim::Scenario;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Validate every file; print one line per file (and every error); exit 2 if any is invalid.
pub fn run(
    files: &[PathBuf],
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut bad = 0usize;
    for f in files {
        match Scenario::load(f) {
            Ok(sc) => writeln!(
                out,
                "ok    {}  ({}: {} workers, {} traffic sources, {} events, {} policies)",
                f.display(),
                sc.name,
                sc.setup.workers.len(),
                sc.traffic.len(),
                sc.setup.events.len(),
                sc.policies.len()
            )?,
            Err(e) => {
                bad += 1;
                writeln!(err, "error: {e}")?;
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
