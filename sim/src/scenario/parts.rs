//! A scenario given in parts (`routelab plan --fleet F.yaml --trace T`): a **fleet file**, a
//! scenario file without `traffic:` (its fleet, model, profiles' directory, seed and
//! settings), and one trace source from the command line, written as a scenario's `trace:`
//! source is (a bare path, or `{path: …, format: …, mapping: {…}}`). Both are read by the
//! scenario reader itself, so a fleet file accepts and refuses exactly what a scenario's fleet
//! does; the trace source is checked on its own first, so its errors name `--trace` rather
//! than a line of the fleet file.

use super::reader::ScenarioReader;
use super::{RawScenario, RawTraffic, Scenario, ScenarioError};
use routelab_policies::located::{InputError, parse_yaml};
use serde_saphyr::{Location, Spanned};
use std::path::Path;

/// The name a trace source given on the command line goes by in errors.
pub const TRACE_FLAG: &str = "--trace";

impl Scenario {
    /// The scenario of a fleet file (`fleet_src`, read from `fleet_path`) and a trace source
    /// (`trace`, as the command line gives it). A relative trace path is taken from the
    /// working directory, as a command line's paths are.
    ///
    /// # Errors
    /// A located [`InputError`]: the fleet file's (its file, line and field; a fleet file
    /// with its own `traffic:` is refused, `--trace` replaces it), or the trace source's,
    /// named `--trace`.
    pub fn from_fleet_and_trace(
        fleet_src: &str,
        fleet_path: &Path,
        trace: &str,
    ) -> Result<Scenario, ScenarioError> {
        let mut raw: RawScenario = parse_yaml(fleet_src, &fleet_path.display().to_string())?;
        if raw.traffic.is_some() {
            return Err(InputError::new(
                fleet_path.display().to_string(),
                "traffic",
                "a fleet file holds no traffic: --trace gives it",
            )
            .valid("the scenario's fields but `traffic`, or run `routelab plan` on the scenario"));
        }
        let source = trace_source(trace)?;
        // Checked alone, so that what is wrong with it names --trace (the path, the format,
        // the mapping); the reader's second look, in place, then finds nothing new.
        ScenarioReader::new(Path::new(TRACE_FLAG)).trace(&Location::UNKNOWN, "trace", &source)?;
        raw.traffic = Some(vec![Spanned::new(
            source,
            Location::UNKNOWN,
            Location::UNKNOWN,
        )]);
        ScenarioReader::new(fleet_path).scenario(raw)
    }
}

/// The trace source a command line gives: a bare path (its format from the extension), or
/// the body of a scenario's `trace:` source in YAML's flow style. Its path made absolute
/// from the working directory.
fn trace_source(text: &str) -> Result<RawTraffic, ScenarioError> {
    let text = text.trim();
    let mut source = if text.starts_with('{') {
        parse_yaml::<RawTraffic>(&format!("trace: {text}"), TRACE_FLAG)?
    } else if text.is_empty() {
        return Err(InputError::new(TRACE_FLAG, "", "is empty").valid(TRACE_VALID));
    } else {
        RawTraffic::Trace {
            path: text.to_string(),
            format: None,
            mapping: None,
            time_scale: None,
            rate_scale: None,
            limit: None,
            skip_rows: None,
            start_offset_s: None,
            on_bad_row: None,
            resample: None,
        }
    };
    let RawTraffic::Trace { path, .. } = &mut source else {
        unreachable!("parsed under `trace:`")
    };
    let absolute = std::path::absolute(Path::new(path.as_str()))
        .map_err(|e| InputError::new(TRACE_FLAG, "trace.path", e.to_string()))?;
    *path = absolute.display().to_string();
    Ok(source)
}

/// What `--trace` may be.
const TRACE_VALID: &str = "a trace file (azure .csv, mooncake .jsonl) or a scenario's trace \
                           source, e.g. \"{path: log.csv, format: csv, mapping: {arrival: ts, \
                           prompt_tokens: in, output_tokens: out}}\" (docs/traces.md)";

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for one test, and the fleet file's path in it.
    fn dir(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!("routelab-parts-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("fleet.yaml");
        (d, p)
    }

    const FLEET: &str = "model: gemma-27b\nfleet:\n  - { name: a, profile: rtx-pro-6000-27b }\n";

    fn trace_file(dir: &Path) -> String {
        let t = dir.join("log.csv");
        std::fs::write(&t, "at,in,out\n0.0,100,10\n0.5,200,20\n1.5,300,30\n").unwrap();
        t.display().to_string()
    }

    #[test]
    fn a_fleet_and_a_mapped_trace_make_the_scenario() {
        let (d, p) = dir("mapped");
        let t = trace_file(&d);
        let sc = Scenario::from_fleet_and_trace(
            FLEET,
            &p,
            &format!(
                "{{path: {t}, format: csv, mapping: {{arrival: at, arrival_unit: offset_s, prompt_tokens: in, output_tokens: out}}}}"
            ),
        )
        .unwrap();
        assert_eq!(sc.name, "fleet");
        assert_eq!(sc.setup.workers.len(), 1);
        assert_eq!(sc.trace_sources().count(), 1);
        let (_, path, format, _) = sc.trace_sources().next().unwrap();
        assert_eq!(path, Path::new(&t));
        assert_eq!(format.name(), "csv");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn errors_name_the_file_or_the_flag_at_fault() {
        let (d, p) = dir("errors");
        let t = trace_file(&d);
        // the fleet file's own traffic
        let with_traffic = format!("{FLEET}traffic:\n  - trace: {{path: {t}}}\n");
        let e = Scenario::from_fleet_and_trace(&with_traffic, &p, &t).unwrap_err();
        assert!(
            e.to_string()
                .contains("fleet.yaml: traffic: a fleet file holds no traffic"),
            "{e}"
        );
        // a fleet error, located in the fleet file
        let bad = "model: m\nfleet:\n  - { name: a, profile: no-such-profile }\n";
        let e = Scenario::from_fleet_and_trace(bad, &p, &t)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fleet.yaml:3:") && e.contains("fleet[0].profile"),
            "{e}"
        );
        // the trace's: a missing file, an unknown field, a bad mapping; each names --trace
        for (trace, want) in [
            ("no/such.csv".to_string(), "trace.path: no such file"),
            (format!("{{path: {t}, speed: 2}}"), "speed"),
            (
                format!("{{path: {t}, format: csv, mapping: {{arrival: at}}}}"),
                "trace.mapping",
            ),
            (String::new(), "is empty"),
        ] {
            let e = Scenario::from_fleet_and_trace(FLEET, &p, &trace)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("--trace") && e.contains(want), "{trace}: {e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
