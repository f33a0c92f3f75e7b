//! Parameter grids over a scenario: `--set traffic[0].poisson.rate_per_s=1,2,4`.
//!
//! An [`Axis`] is a field path into the scenario's YAML and the values to give it; several axes
//! make a grid (their cartesian product, the last axis varying fastest). Each point is the base
//! document with the values set, validated again as a whole scenario, so a value out of range
//! is the same located error a hand-written file would get.

use crate::scenario::Scenario;
use routelab_policies::InputError;
use serde_json::Value;
use std::path::Path;

/// Where `--set` errors point: the command-line option, not a file.
const SET: &str = "--set";

/// One step of a field path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// One axis of a grid: a field path and its values, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The path as written, e.g. `traffic[0].poisson.rate_per_s`.
    pub path: String,
    steps: Vec<Step>,
    /// The values as written (each read as YAML/JSON when it parses, else as a string).
    pub values: Vec<String>,
}

/// One point of a grid: the value of each axis, and the scenario with them set.
#[derive(Debug, Clone)]
pub struct GridPoint {
    /// One label per axis: the value given to it.
    pub labels: Vec<String>,
    /// The validated scenario.
    pub scenario: Scenario,
}

/// Why a grid could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// A `--set` argument is not valid, or the scenario is not (its located error).
    #[error(transparent)]
    Input(#[from] Box<InputError>),
    /// A point of the grid is not a valid scenario.
    #[error("with {with}")]
    Point {
        /// `path=value` of each axis at that point.
        with: String,
        /// The scenario's error.
        source: Box<InputError>,
    },
}

fn set_error(path: &str, message: impl Into<String>) -> Box<InputError> {
    Box::new(InputError::new(SET, path, message))
}

impl Axis {
    /// Parse `path=v1,v2,...`.
    pub fn parse(arg: &str) -> Result<Axis, Box<InputError>> {
        let (path, values) = arg.split_once('=').ok_or_else(|| {
            Box::new(
                InputError::new(SET, "", format!("`{arg}` has no `=`"))
                    .valid("path=v1,v2,..., e.g. traffic[0].poisson.rate_per_s=1,2,4"),
            )
        })?;
        let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
        if values.iter().any(String::is_empty) {
            return Err(set_error(path, format!("`{arg}` has an empty value")));
        }
        Ok(Axis {
            path: path.to_string(),
            steps: parse_path(path)?,
            values,
        })
    }
}

fn parse_path(path: &str) -> Result<Vec<Step>, Box<InputError>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if key.is_empty() && rest.is_empty() {
            return Err(Box::new(
                InputError::new(SET, path, "empty segment")
                    .valid("a path such as traffic[0].poisson.rate_per_s"),
            ));
        }
        if !key.is_empty() {
            steps.push(Step::Key(key.to_string()));
        }
        while let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(|| set_error(path, "missing `]`"))?;
            let idx = r[..end]
                .parse()
                .map_err(|_| set_error(path, format!("`{}` is not an index", &r[..end])))?;
            steps.push(Step::Index(idx));
            rest = &r[end + 1..];
        }
    }
    Ok(steps)
}

fn set_path(doc: &mut Value, axis: &Axis, value: Value) -> Result<(), Box<InputError>> {
    let path = axis.path.as_str();
    let mut cur = doc;
    for (i, s) in axis.steps.iter().enumerate() {
        let last = i + 1 == axis.steps.len();
        cur = match s {
            Step::Key(k) => {
                let map = cur
                    .as_object_mut()
                    .ok_or_else(|| set_error(path, format!("`{k}` is not inside a mapping")))?;
                if last {
                    map.insert(k.clone(), value);
                    return Ok(());
                }
                map.get_mut(k)
                    .ok_or_else(|| set_error(path, format!("the scenario has no `{k}` there")))?
            }
            Step::Index(n) => {
                let list = cur
                    .as_array_mut()
                    .ok_or_else(|| set_error(path, format!("[{n}] is not inside a list")))?;
                let len = list.len();
                let item = list.get_mut(*n).ok_or_else(|| {
                    set_error(
                        path,
                        format!("index {n} is out of range (the list has {len})"),
                    )
                })?;
                if last {
                    *item = value;
                    return Ok(());
                }
                item
            }
        };
    }
    Err(set_error(path, "empty path"))
}

/// A value as YAML/JSON when it parses (`2.5`, `true`), else as a string.
fn scalar(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

/// Every point of the grid over scenario `text` (read from `path`), in a fixed order: the last
/// axis varies fastest.
pub fn grid(text: &str, path: &Path, axes: &[Axis]) -> Result<Vec<GridPoint>, SweepError> {
    let file = path.display().to_string();
    let doc: Value = routelab_policies::located::parse_yaml(text, &file).map_err(Box::new)?;
    let mut grid: Vec<Vec<usize>> = vec![Vec::new()];
    for axis in axes {
        grid = grid
            .into_iter()
            .flat_map(|g| {
                (0..axis.values.len()).map(move |i| {
                    let mut g = g.clone();
                    g.push(i);
                    g
                })
            })
            .collect();
    }
    let mut points = Vec::with_capacity(grid.len());
    for g in &grid {
        let mut d = doc.clone();
        let mut labels = Vec::with_capacity(axes.len());
        for (axis, &i) in axes.iter().zip(g) {
            set_path(&mut d, axis, scalar(&axis.values[i]))?;
            labels.push(axis.values[i].clone());
        }
        let with = || {
            axes.iter()
                .zip(&labels)
                .map(|(a, v)| format!("{}={v}", a.path))
                .collect::<Vec<_>>()
                .join(" ")
        };
        // A document built from valid YAML always serialises; say so rather than panic.
        let yaml = serde_saphyr::to_string(&d).map_err(|e| SweepError::Point {
            with: with(),
            source: Box::new(InputError::new(
                &file,
                "",
                format!("cannot re-serialise: {e}"),
            )),
        })?;
        // The point is validated as the re-serialised document, whose lines are not the
        // file's (issue 41: an error pointed at line 9 of a 7-line file): its error keeps the
        // file and the field path, which are the file's, and drops the line and column.
        let scenario = Scenario::from_yaml(&yaml, path).map_err(|e| SweepError::Point {
            with: with(),
            source: Box::new(e.at(None, None)),
        })?;
        points.push(GridPoint { labels, scenario });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_and_set() {
        let axis = Axis::parse("traffic[0].poisson.rate_per_s=2.5, 3").unwrap();
        assert_eq!(
            axis.steps,
            vec![
                Step::Key("traffic".into()),
                Step::Index(0),
                Step::Key("poisson".into()),
                Step::Key("rate_per_s".into())
            ]
        );
        assert_eq!(axis.values, ["2.5", "3"]);
        let mut doc: Value =
            serde_json::from_str(r#"{"traffic":[{"poisson":{"rate_per_s":1}}]}"#).unwrap();
        set_path(&mut doc, &axis, scalar("2.5")).unwrap();
        assert_eq!(doc["traffic"][0]["poisson"]["rate_per_s"], 2.5);
        let err = set_path(
            &mut doc,
            &Axis::parse("traffic[3].x=1").unwrap(),
            scalar("1"),
        );
        let err = err.unwrap_err();
        assert_eq!(err.field, "traffic[3].x");
        assert!(err.message.contains("out of range"), "{err}");
        assert!(Axis::parse("a[x]=1").is_err());
        assert!(
            Axis::parse("a.b")
                .unwrap_err()
                .to_string()
                .contains("valid: path=")
        );
        assert!(Axis::parse("a=1,,2").is_err());
    }

    /// Issue 41: a bad value of a point was located at a line of the re-serialised document
    /// (line 9 of a 7-line file); it names the file and the field, and no line.
    #[test]
    fn a_bad_point_names_the_field_and_no_line_of_another_document() {
        let text = "seed: 1\nmodel: m\nfleet:\n  - { name: a, profile: rtx4090-27b }\ntraffic:\n  - poisson: { rate_per_s: 1, count: 5, prompt: { fixed: 10 }, output: { fixed: 5 } }\npolicies: [seed-v1]\n";
        assert_eq!(text.lines().count(), 7);
        let axes = [Axis::parse("traffic[0].poisson.rate_per_s=1,-2").unwrap()];
        let e = grid(text, Path::new("s.yaml"), &axes).unwrap_err();
        let SweepError::Point { with, source } = e else {
            panic!("a point's error: {e}");
        };
        assert_eq!(with, "traffic[0].poisson.rate_per_s=-2");
        assert_eq!(source.file, "s.yaml");
        assert!(source.field.starts_with("traffic[0]"), "{source}");
        assert_eq!((source.line, source.column), (None, None), "{source}");
    }
}
