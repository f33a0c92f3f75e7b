//! The references file (`benches/speed-gate.yaml`): the committed instruction count of each
//! case and the tolerance, read raw and validated into [`References`] (every failure a located
//! [`InputError`]), and written back through the same fields by `--update`.

use crate::workload::{CASES, Case, case_names};
use routelab_policies::InputError;
use routelab_policies::located::parse_yaml;
use serde::{Deserialize, Serialize};
use serde_saphyr::{Commented, Location, Spanned};

/// What the file says before its fields, when `--update` writes it.
const HEADER: &str = "\
# Reference instruction counts of the speed gate. `cargo run --release --example speed_gate`
# counts each case's measured part under valgrind (cachegrind) and fails when a count is above
# its reference by more than tolerance_percent. `-- --update` rewrites this file from a new
# measurement; docs/performance.md (\"The speed gate\") says when that is legitimate.
# taken_with: what measured them (a new compiler or C library moves the counts by itself).
# outcome: what the measured part computed (a simulation's events; the sum of the decisions'
# worker ids), so that a changed count can be told apart from changed work.
";

/// The tolerance of a new file.
pub const DEFAULT_TOLERANCE_PERCENT: f64 = 1.0;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReferences {
    tolerance_percent: Spanned<f64>,
    taken_with: TakenWith,
    cases: Vec<Spanned<RawReference>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReference {
    case: Spanned<String>,
    units: Spanned<u64>,
    instructions: Spanned<u64>,
    outcome: u64,
}

/// The tools a measurement was taken with, as they name themselves.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TakenWith {
    /// `rustc -V`.
    pub rustc: String,
    /// `valgrind --version`.
    pub valgrind: String,
    /// `getconf GNU_LIBC_VERSION` (libm's `log` is part of the counts).
    pub glibc: String,
}

/// One case's reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// The case's name.
    pub case: String,
    /// Requests or decisions the count was taken over.
    pub units: u64,
    /// Instructions of the measured part.
    pub instructions: u64,
    /// What the measured part computed.
    pub outcome: u64,
    /// Where the entry is, for errors found after parsing.
    at: Location,
}

impl Reference {
    /// A reference from a measurement (no position: it is not from a file).
    pub fn measured(case: &Case, instructions: u64, outcome: u64) -> Reference {
        Reference {
            case: case.name.to_string(),
            units: case.units,
            instructions,
            outcome,
            at: Location::UNKNOWN,
        }
    }

    /// Instructions per request or decision.
    pub fn per_unit(&self) -> f64 {
        self.instructions as f64 / self.units as f64
    }
}

/// A validated references file.
#[derive(Debug, Clone, PartialEq)]
pub struct References {
    /// The file, as named.
    pub file: String,
    /// A count fails when it is above its reference by more than this, in percent.
    pub tolerance_percent: f64,
    /// What measured the counts.
    pub taken_with: TakenWith,
    /// One entry per case, in the file's order.
    pub cases: Vec<Reference>,
}

/// The valid tolerances, in words.
const TOLERANCE_RULE: &str = "a percentage above 0 and below 100, e.g. 1.0";

/// A tolerance given on the command line or in the file, checked.
pub fn valid_tolerance(percent: f64) -> bool {
    percent.is_finite() && percent > 0.0 && percent < 100.0
}

impl References {
    /// Read and validate `path`, named `file` in errors.
    pub fn read(path: &std::path::Path, file: &str) -> Result<References, InputError> {
        let src = std::fs::read_to_string(path).map_err(|e| InputError::unreadable(file, &e))?;
        References::parse(&src, file)
    }

    /// A file with no references yet, named `file`.
    pub fn empty(file: String) -> References {
        References {
            file,
            tolerance_percent: DEFAULT_TOLERANCE_PERCENT,
            taken_with: TakenWith {
                rustc: String::new(),
                valgrind: String::new(),
                glibc: String::new(),
            },
            cases: Vec::new(),
        }
    }

    /// Validate references text; `file` names it in errors. Names are checked against the
    /// gate's cases by [`References::check_names`], not here, so that `--update` can drop the
    /// entries of removed cases.
    pub fn parse(src: &str, file: &str) -> Result<References, InputError> {
        let raw: RawReferences = parse_yaml(src, file)?;
        let tolerance = raw.tolerance_percent.value;
        if !valid_tolerance(tolerance) {
            return Err(InputError::new(
                file,
                "tolerance_percent",
                format!("{tolerance} is not valid"),
            )
            .valid(TOLERANCE_RULE)
            .at_location(raw.tolerance_percent.referenced));
        }
        let mut cases: Vec<Reference> = Vec::with_capacity(raw.cases.len());
        for (i, entry) in raw.cases.iter().enumerate() {
            let r = &entry.value;
            let field = |name: &str| format!("cases[{i}].{name}");
            if cases.iter().any(|c| c.case == r.case.value) {
                return Err(InputError::new(
                    file,
                    field("case"),
                    format!("`{}` has a second entry", r.case.value),
                )
                .at_location(r.case.referenced));
            }
            for (name, value) in [("units", &r.units), ("instructions", &r.instructions)] {
                if value.value == 0 {
                    return Err(InputError::new(file, field(name), "0 is not valid")
                        .valid("a count ≥ 1")
                        .at_location(value.referenced));
                }
            }
            cases.push(Reference {
                case: r.case.value.clone(),
                units: r.units.value,
                instructions: r.instructions.value,
                outcome: r.outcome,
                at: r.case.referenced,
            });
        }
        Ok(References {
            file: file.to_string(),
            tolerance_percent: tolerance,
            taken_with: raw.taken_with,
            cases,
        })
    }

    /// Every entry names one of the gate's cases (a typo would otherwise leave a case without
    /// its reference and the entry unused).
    pub fn check_names(&self) -> Result<(), InputError> {
        for (i, r) in self.cases.iter().enumerate() {
            if !CASES.iter().any(|c| c.name == r.case) {
                return Err(InputError::new(
                    &self.file,
                    format!("cases[{i}].case"),
                    format!("unknown case `{}`", r.case),
                )
                .at_location(r.at)
                .valid(case_names()));
            }
        }
        Ok(())
    }

    /// The reference of `case`, taken over as many units as the case runs.
    pub fn for_case(&self, case: &Case) -> Result<&Reference, InputError> {
        let Some((i, r)) = self
            .cases
            .iter()
            .enumerate()
            .find(|(_, r)| r.case == case.name)
        else {
            return Err(InputError::new(
                &self.file,
                "cases",
                format!(
                    "no reference for case `{}`: take one with `cargo run --release --example \
                     speed_gate -- --update --case {}`",
                    case.name, case.name
                ),
            ));
        };
        if r.units != case.units {
            return Err(InputError::new(
                &self.file,
                format!("cases[{i}].units"),
                format!(
                    "`{}` was counted over {} {}s and now runs {}: the counts do not compare; \
                     take a new reference with --update",
                    case.name, r.units, case.unit, case.units
                ),
            )
            .at_location(r.at));
        }
        Ok(r)
    }

    /// Replace (or add) the reference of each measured case, drop those of cases the gate no
    /// longer has, keep the others; cases in the gate's order.
    pub fn update(&mut self, measured: Vec<Reference>, taken_with: TakenWith) {
        let mut kept: Vec<Reference> = Vec::new();
        for case in &CASES {
            if let Some(m) = measured.iter().find(|m| m.case == case.name) {
                kept.push(m.clone());
            } else if let Some(old) = self.cases.iter().find(|r| r.case == case.name) {
                kept.push(old.clone());
            }
        }
        self.cases = kept;
        self.taken_with = taken_with;
    }

    /// The file's text: a header that says what it is, then the fields (through serde).
    pub fn to_yaml(&self) -> String {
        #[derive(Serialize)]
        struct Written<'a> {
            tolerance_percent: f64,
            taken_with: &'a TakenWith,
            cases: Vec<WrittenReference<'a>>,
        }
        #[derive(Serialize)]
        struct WrittenReference<'a> {
            case: &'a str,
            units: Commented<u64>,
            instructions: Commented<u64>,
            outcome: u64,
        }
        let written = Written {
            tolerance_percent: self.tolerance_percent,
            taken_with: &self.taken_with,
            cases: self
                .cases
                .iter()
                .map(|r| {
                    let unit = CASES
                        .iter()
                        .find(|c| c.name == r.case)
                        .map_or("unit", |c| c.unit);
                    WrittenReference {
                        case: &r.case,
                        units: Commented(r.units, format!("{unit}s")),
                        instructions: Commented(
                            r.instructions,
                            format!("{:.1} per {unit}", r.per_unit()),
                        ),
                        outcome: r.outcome,
                    }
                })
                .collect(),
        };
        let body = serde_saphyr::to_string(&written).expect("plain fields serialize");
        format!("{HEADER}{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::case;

    fn taken_with() -> TakenWith {
        TakenWith {
            rustc: "rustc 1.95.0".into(),
            valgrind: "valgrind-3.19.0".into(),
            glibc: "glibc 2.36".into(),
        }
    }

    fn sample() -> References {
        let mut r = References {
            file: "refs.yaml".into(),
            tolerance_percent: 1.0,
            taken_with: taken_with(),
            cases: Vec::new(),
        };
        let measured = CASES
            .iter()
            .enumerate()
            .map(|(i, c)| Reference::measured(c, 1_000_000 + i as u64, 7 + i as u64))
            .collect();
        r.update(measured, taken_with());
        r
    }

    /// Positions do not survive a write (a measurement has none): compare without them.
    fn unlocated(r: &References) -> References {
        let mut r = r.clone();
        for c in &mut r.cases {
            c.at = Location::UNKNOWN;
        }
        r
    }

    #[test]
    fn written_file_reads_back_the_same() {
        let r = sample();
        let text = r.to_yaml();
        assert!(text.starts_with("# Reference instruction counts"), "{text}");
        assert!(
            text.contains("instructions: 1000001 # 10.0 per request"),
            "{text}"
        );
        let back = References::parse(&text, "refs.yaml").unwrap();
        assert_eq!(unlocated(&back), r);
        back.check_names().unwrap();
        for c in &CASES {
            assert_eq!(back.for_case(c).unwrap().case, c.name);
        }
    }

    #[test]
    fn update_replaces_measured_keeps_the_rest_and_drops_removed_cases() {
        let mut r = sample();
        r.cases.push(Reference {
            case: "fleet-removed".into(),
            units: 1,
            instructions: 1,
            outcome: 0,
            at: Location::UNKNOWN,
        });
        let fleet_64 = case("fleet-64").unwrap();
        let mut newer = taken_with();
        newer.rustc = "rustc 1.96.0".into();
        r.update(vec![Reference::measured(fleet_64, 42, 1)], newer.clone());
        assert_eq!(r.cases.len(), CASES.len());
        assert_eq!(r.for_case(fleet_64).unwrap().instructions, 42);
        assert_eq!(
            r.for_case(case("fleet-10k").unwrap()).unwrap().instructions,
            1_000_000
        );
        assert!(r.cases.iter().all(|c| c.case != "fleet-removed"));
        assert_eq!(r.taken_with, newer);
    }

    /// The error for `text` with `from` replaced by `to` in the sample file.
    fn error_for(from: &str, to: &str) -> String {
        let text = sample().to_yaml();
        assert!(text.contains(from), "{from} not in\n{text}");
        let text = text.replacen(from, to, 1);
        let e = match References::parse(&text, "refs.yaml") {
            Err(e) => e,
            Ok(r) => match r.check_names() {
                Err(e) => e,
                Ok(()) => CASES
                    .iter()
                    .find_map(|c| r.for_case(c).err())
                    .expect("an error"),
            },
        };
        e.to_string()
    }

    /// The 1-based line of the first line of the sample file that contains `needle`.
    fn line_of(needle: &str) -> usize {
        sample()
            .to_yaml()
            .lines()
            .position(|l| l.contains(needle))
            .expect("present")
            + 1
    }

    #[test]
    fn malformed_files_give_located_errors() {
        let line = line_of("instructions: 1000001");
        let e = error_for("instructions: 1000001", "instructions: many");
        assert!(e.starts_with(&format!("refs.yaml:{line}:")), "{e}");
        assert!(e.contains("cases[1].instructions"), "{e}");

        let e = error_for("instructions: 1000001", "instructions: 0");
        assert!(e.starts_with(&format!("refs.yaml:{line}:")), "{e}");
        assert!(
            e.contains("cases[1].instructions: 0 is not valid; valid: a count ≥ 1"),
            "{e}"
        );

        let e = error_for("instructions: 1000001", "instrs: 1000001");
        assert!(e.contains("unknown field `instrs`"), "{e}");

        let line = line_of("tolerance_percent:");
        let e = error_for("tolerance_percent: 1.0", "tolerance_percent: -2");
        assert!(e.starts_with(&format!("refs.yaml:{line}:")), "{e}");
        assert!(
            e.contains("tolerance_percent: -2 is not valid; valid: a percentage above 0"),
            "{e}"
        );

        let e = error_for("tolerance_percent: 1.0\n", "");
        assert!(e.contains("missing field `tolerance_percent`"), "{e}");
    }

    #[test]
    fn names_and_cuts_are_checked_against_the_gate() {
        let line = line_of("case: fleet-64");
        let e = error_for("case: fleet-64", "case: fleet-46");
        assert_eq!(
            e,
            format!(
                "refs.yaml:{line}:9: cases[1].case: unknown case `fleet-46`; valid: {}",
                case_names()
            )
        );

        let e = error_for("case: fleet-64", "case: fleet-10k");
        assert!(
            e.contains("cases[1].case: `fleet-10k` has a second entry"),
            "{e}"
        );

        let e = error_for("units: 100000 # requests", "units: 50000 # requests");
        assert!(
            e.contains(
                "cases[1].units: `fleet-64` was counted over 50000 requests and now runs 100000"
            ),
            "{e}"
        );
        assert!(e.starts_with(&format!("refs.yaml:{line}:")), "{e}");

        let mut r = sample();
        r.cases.retain(|c| c.case != "decision-64");
        let e = r.for_case(case("decision-64").unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "refs.yaml: cases: no reference for case `decision-64`: take one with `cargo run \
             --release --example speed_gate -- --update --case decision-64`"
        );
    }

    #[test]
    fn tolerances_are_checked() {
        assert!(valid_tolerance(1.0));
        assert!(valid_tolerance(0.01));
        for bad in [0.0, -1.0, 100.0, f64::NAN, f64::INFINITY] {
            assert!(!valid_tolerance(bad), "{bad}");
        }
    }
}
