//! The one validation error of routelab: an input that is not valid, located.
//!
//! Every input a host reads — a scenario, a hardware profile, a policy, a CI suite, a baseline,
//! the gateway's configuration — is parsed raw and then validated, and every failure of either
//! step is an [`InputError`]: the file, the line and column where the parser or the validator
//! knows them, the field path (`fleet[2].profile`), what is wrong and what would be valid.
//! It lives in the lowest crate so that the simulator, the lab and the gateway share it.
//!
//! Rendering (one line, then the parser's source snippet when there is one):
//!
//! ```text
//! scenarios/x.yaml:7:12: policies[0].preset: unknown preset `nope`; valid: seed-v1, seed-v2
//! ```
//!
//! ```
//! use routelab_policies::located::{parse_yaml, InputError};
//! #[derive(serde::Deserialize, Debug)]
//! #[serde(deny_unknown_fields)]
//! struct Conf { rate: f64 }
//! let err: InputError = parse_yaml::<Conf>("rate: 1\nrtae: 2\n", "conf.yaml").unwrap_err();
//! assert_eq!(err.file, "conf.yaml");
//! assert_eq!(err.line, Some(2));
//! assert!(err.to_string().starts_with("conf.yaml:2:1: "));
//! ```

use std::fmt;

use crate::error::ConfigError;

/// An invalid input: where it is, which field, what is wrong, what would be valid.
///
/// The rarely set parts are boxed so that the error stays small in every `Result` that carries
/// it (clippy's `result_large_err`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InputError {
    /// The file (as the user named it), or a description of the input such as `<config>`.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<u32>,
    /// 1-based column, when known (only with a line).
    pub column: Option<u32>,
    /// Field path, e.g. `fleet[2].profile`; empty when the error is about the whole input.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// What would be valid, when the message does not already say it.
    pub valid: Option<Box<str>>,
    /// The parser's source excerpt (several lines), when it gives one.
    pub snippet: Option<Box<str>>,
}

impl InputError {
    /// An error about `field` of `file`, position unknown.
    pub fn new(
        file: impl Into<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        InputError {
            file: file.into(),
            line: None,
            column: None,
            field: field.into(),
            message: message.into(),
            valid: None,
            snippet: None,
        }
    }

    /// The file could not be read.
    pub fn unreadable(file: impl Into<String>, err: &std::io::Error) -> Self {
        InputError::new(file, "", format!("cannot read: {err}"))
    }

    /// Set the 1-based position (a line of 0 means unknown).
    pub fn at(mut self, line: Option<u32>, column: Option<u32>) -> Self {
        self.line = line.filter(|l| *l > 0);
        self.column = column.filter(|c| *c > 0 && self.line.is_some());
        self
    }

    /// Set the position to a YAML parser's location (`Spanned::referenced`; the parser's
    /// `Location::UNKNOWN` leaves it unknown).
    pub fn at_location(self, loc: serde_saphyr::Location) -> Self {
        self.at(
            u32::try_from(loc.line()).ok(),
            u32::try_from(loc.column()).ok(),
        )
    }

    /// Say what would be valid.
    pub fn valid(mut self, valid: impl Into<String>) -> Self {
        self.valid = Some(valid.into().into_boxed_str());
        self
    }

    /// A policy error found in `file` (the policy crate knows fields, not files).
    pub fn from_config(file: impl Into<String>, e: &ConfigError) -> Self {
        match e {
            ConfigError::UnknownName {
                field,
                what,
                got,
                valid,
            } => InputError::new(file, field.clone(), format!("unknown {what} `{got}`"))
                .valid(valid.clone()),
            ConfigError::Invalid { field, message } => {
                InputError::new(file, field.clone(), message.clone())
            }
        }
    }

    /// Prefix the field path (e.g. with `policy` or `policies[2]`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_string()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }

    /// `file:line:column` (as much of it as is known).
    pub fn location(&self) -> String {
        let mut s = self.file.clone();
        if let Some(l) = self.line {
            s.push_str(&format!(":{l}"));
            if let Some(c) = self.column {
                s.push_str(&format!(":{c}"));
            }
        }
        s
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.location())?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)?;
        if let Some(v) = &self.valid {
            write!(f, "; valid: {v}")?;
        }
        if let Some(s) = &self.snippet {
            write!(f, "\n{s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InputError {}

/// The value rules every input shares, said once: what a number must be, and the words that
/// say so. A host attaches the field and position ([`Violation::at_field`]).
pub mod rule {
    use std::fmt;
    use std::time::Duration;

    /// The longest duration any input may give, in seconds (about 31 years): far beyond any
    /// real timeout or simulated day, far below where `Duration` or integer nanoseconds
    /// overflow.
    pub const MAX_SECONDS: f64 = 1e9;
    /// The shortest non-zero duration an input may give, in seconds (one microsecond): a
    /// shorter period would make a timer loop spin.
    pub const MIN_PERIOD_SECONDS: f64 = 1e-6;

    /// A value that breaks a rule: what was given and what would be valid.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Violation {
        /// The value as given.
        pub got: String,
        /// What would be valid.
        pub expected: String,
    }

    impl fmt::Display for Violation {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} is not valid; expected {}", self.got, self.expected)
        }
    }

    impl Violation {
        /// `got` breaks a rule of a host's own; `expected` says what would be valid.
        pub fn new(got: impl fmt::Display, expected: impl Into<String>) -> Self {
            Violation {
                got: got.to_string(),
                expected: expected.into(),
            }
        }

        /// As an [`InputError`](super::InputError) about `field` of `file`.
        pub fn at_field(
            &self,
            file: impl Into<String>,
            field: impl Into<String>,
        ) -> super::InputError {
            super::InputError::new(file, field, self.to_string())
        }
    }

    /// A finite number > 0.
    pub fn positive(x: f64) -> Result<f64, Violation> {
        if x.is_finite() && x > 0.0 {
            Ok(x)
        } else {
            Err(Violation::new(x, "a finite number > 0"))
        }
    }

    /// A finite number >= 0.
    pub fn non_negative(x: f64) -> Result<f64, Violation> {
        if x.is_finite() && x >= 0.0 {
            Ok(x)
        } else {
            Err(Violation::new(x, "a finite number >= 0"))
        }
    }

    /// A whole number in `min..=max` (given as a float, as YAML numbers are read).
    pub fn whole(x: f64, min: u64, max: u64) -> Result<u64, Violation> {
        if x.is_finite() && x.fract() == 0.0 && x >= min as f64 && x <= max as f64 {
            Ok(x as u64)
        } else {
            Err(Violation::new(
                x,
                format!("a whole number from {min} to {max}"),
            ))
        }
    }

    /// A fraction in `[0, 1]`.
    pub fn fraction(x: f64) -> Result<f64, Violation> {
        if x.is_finite() && (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err(Violation::new(x, "a number from 0 to 1"))
        }
    }

    /// A share in `(0, 1]`: a part of something that cannot be nothing (slow start's floor).
    pub fn share(x: f64) -> Result<f64, Violation> {
        if x.is_finite() && x > 0.0 && x <= 1.0 {
            Ok(x)
        } else {
            Err(Violation::new(x, "a number > 0 and at most 1"))
        }
    }

    /// A count >= 1.
    pub fn count(n: u32) -> Result<u32, Violation> {
        if n >= 1 {
            Ok(n)
        } else {
            Err(Violation::new(n, "a whole number >= 1"))
        }
    }

    /// A number of seconds in `[0, MAX_SECONDS]` (0 allowed: "at once" or "off").
    pub fn seconds(x: f64) -> Result<Duration, Violation> {
        if x.is_finite() && (0.0..=MAX_SECONDS).contains(&x) {
            Ok(Duration::from_secs_f64(x))
        } else {
            Err(Violation::new(
                x,
                format!("a finite number of seconds from 0 to {MAX_SECONDS:e}"),
            ))
        }
    }

    /// A period in seconds, in `[MIN_PERIOD_SECONDS, MAX_SECONDS]`.
    pub fn period(x: f64) -> Result<Duration, Violation> {
        if x.is_finite() && (MIN_PERIOD_SECONDS..=MAX_SECONDS).contains(&x) {
            Ok(Duration::from_secs_f64(x))
        } else {
            Err(Violation::new(
                x,
                format!("a number of seconds from {MIN_PERIOD_SECONDS:e} to {MAX_SECONDS:e}"),
            ))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn rules_accept_and_refuse() {
            assert_eq!(positive(2.5), Ok(2.5));
            for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
                assert!(positive(bad).is_err(), "{bad}");
            }
            assert_eq!(non_negative(0.0), Ok(0.0));
            assert!(non_negative(-0.1).is_err());
            assert_eq!(whole(3.0, 1, 5), Ok(3));
            for bad in [0.0, 6.0, 2.5, f64::NAN] {
                assert!(whole(bad, 1, 5).is_err(), "{bad}");
            }
            assert!(count(0).is_err());
            assert_eq!(seconds(0.0), Ok(Duration::ZERO));
            // the values that made `Duration::from_secs_f64` panic are refused, not converted
            for bad in [1e20, 1e300, -1.0, f64::NAN] {
                assert!(seconds(bad).is_err(), "{bad}");
                assert!(period(bad).is_err(), "{bad}");
            }
            assert!(period(1e-12).is_err());
            assert_eq!(period(0.5), Ok(Duration::from_millis(500)));
            assert_eq!(
                positive(-1.0).unwrap_err().to_string(),
                "-1 is not valid; expected a finite number > 0"
            );
        }
    }
}

/// The one adapter from a YAML reader's positions to located [`InputError`]s: a reader names
/// its file once, then turns the `referenced` location of a [`serde_saphyr::Spanned`] value
/// and a field path into an error, or a validation rule's refusal into one.
///
/// ```
/// use routelab_policies::located::{SourceFile, rule};
/// let file = SourceFile::new("s.yaml");
/// let err = file.check(&serde_saphyr::Location::UNKNOWN, "tick_s", rule::positive(-1.0));
/// assert_eq!(err.unwrap_err().to_string(), "s.yaml: tick_s: -1 is not valid; expected a finite number > 0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    name: String,
}

impl SourceFile {
    /// Errors of the input `name` (a path as the user gave it, or a description).
    pub fn new(name: impl Into<String>) -> Self {
        SourceFile { name: name.into() }
    }

    /// The input's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An error about `field`, position unknown (the whole input, or a default it lacks).
    pub fn error(&self, field: impl Into<String>, message: impl Into<String>) -> InputError {
        InputError::new(self.name.clone(), field, message)
    }

    /// An error about `field` of the value read at `loc` (a `Spanned` value's `referenced`).
    pub fn at(
        &self,
        loc: &serde_saphyr::Location,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> InputError {
        self.error(field, message).at_location(*loc)
    }

    /// A rule's or a model's verdict on `field` at `loc`: its refusal, as written, is the
    /// message.
    pub fn check<T, E: fmt::Display>(
        &self,
        loc: &serde_saphyr::Location,
        field: &str,
        verdict: Result<T, E>,
    ) -> Result<T, InputError> {
        verdict.map_err(|e| self.at(loc, field, e.to_string()))
    }
}

/// Parse YAML text into a raw serde struct; on failure an [`InputError`] with the line, column
/// and field path of the problem and the parser's snippet (with `file` in place of its
/// `<input>`). [`serde_saphyr::Spanned`] wrappers do not show in field paths.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(src: &str, file: &str) -> Result<T, InputError> {
    // serde_path_to_error records where in the document a type error happened.
    let mut field = String::new();
    serde_saphyr::with_deserializer_from_str(src, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            // `Spanned` wraps values in a `value` field the user never wrote.
            field = e.path().to_string().replace(".value", "");
            e.into_inner()
        })
    })
    .map_err(|e| yaml_error(file, &field, &e))
}

fn yaml_error(file: &str, field: &str, e: &serde_saphyr::Error) -> InputError {
    let loc = e.location();
    let text = e.to_string();
    // The parser repeats the position in its first line ("error: line L column C: ..."): drop it.
    let text = match text
        .strip_prefix("error: line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((_, message)) => message.to_string(),
        None => text,
    };
    let text = text.replace("<input>", file);
    let (message, snippet) = match text.split_once('\n') {
        Some((first, rest)) => (first.to_string(), Some(rest.to_string())),
        None => (text, None),
    };
    let field = if field == "." { "" } else { field };
    let mut err = InputError::new(file, field, message);
    if let Some(loc) = loc {
        err = err.at_location(loc);
    }
    err.snippet = snippet.map(String::into_boxed_str);
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        items: Vec<Item>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        rate: f64,
    }

    #[test]
    fn unknown_field_names_file_line_column_and_path() {
        let e =
            parse_yaml::<Doc>("items:\n  - { rate: 1 }\n  - { rat: 2 }\n", "d.yaml").unwrap_err();
        assert_eq!(e.file, "d.yaml");
        assert_eq!(e.line, Some(3));
        assert_eq!(e.field, "items[1].rat");
        assert!(e.message.contains("unknown field `rat`"), "{e}");
        assert!(e.to_string().starts_with("d.yaml:3:"), "{e}");
        assert!(!e.to_string().contains("<input>"));
    }

    #[test]
    fn at_location_takes_the_values_position() {
        #[derive(Debug, serde::Deserialize)]
        struct Spans {
            rate: serde_saphyr::Spanned<f64>,
        }
        let doc = parse_yaml::<Spans>("# rate\nrate:   -3\n", "s.yaml").unwrap();
        let e =
            InputError::new("s.yaml", "rate", "-3 is not valid").at_location(doc.rate.referenced);
        assert_eq!(e.to_string(), "s.yaml:2:9: rate: -3 is not valid");
        let e = InputError::new("s.yaml", "rate", "m").at_location(serde_saphyr::Location::UNKNOWN);
        assert_eq!(e.to_string(), "s.yaml: rate: m");
    }

    #[test]
    fn a_source_file_locates_errors_and_rule_refusals() {
        #[derive(Debug, serde::Deserialize)]
        struct Spans {
            rate: serde_saphyr::Spanned<f64>,
        }
        let doc = parse_yaml::<Spans>("# rate\nrate:   -3\n", "s.yaml").unwrap();
        let file = SourceFile::new("s.yaml");
        let loc = &doc.rate.referenced;
        assert_eq!(
            file.check(loc, "rate", rule::positive(doc.rate.value))
                .unwrap_err()
                .to_string(),
            "s.yaml:2:9: rate: -3 is not valid; expected a finite number > 0"
        );
        assert_eq!(file.check(loc, "rate", rule::positive(2.0)), Ok(2.0));
        assert_eq!(file.error("rate", "m").to_string(), "s.yaml: rate: m");
        assert_eq!(file.at(loc, "rate", "m").location(), "s.yaml:2:9");
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = parse_yaml::<Doc>("items:\n  - { rate: fast }\n", "d.yaml").unwrap_err();
        assert_eq!(e.field, "items[0].rate");
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn renders_valid_and_prefix() {
        let e = InputError::new("f.yaml", "kind", "unknown kind `x`")
            .valid("a, b")
            .at(Some(3), Some(4))
            .within("policies[1]");
        assert_eq!(
            e.to_string(),
            "f.yaml:3:4: policies[1].kind: unknown kind `x`; valid: a, b"
        );
        assert_eq!(
            InputError::new("f", "", "m")
                .at(Some(0), Some(2))
                .to_string(),
            "f: m"
        );
    }

    #[test]
    fn config_errors_keep_field_and_valid_list() {
        let c = ConfigError::UnknownName {
            field: "preset".into(),
            what: "preset",
            got: "nope".into(),
            valid: "seed-v1".into(),
        };
        let e = InputError::from_config("s.yaml", &c).within("policies[0]");
        assert_eq!(
            e.to_string(),
            "s.yaml: policies[0].preset: unknown preset `nope`; valid: seed-v1"
        );
    }
}
