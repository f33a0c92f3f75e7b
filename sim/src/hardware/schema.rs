//! The profile file's schema, declared once for both directions: what `HardwareProfile::load`
//! reads (every number [`Spanned`], so that validation can point at a line and column) and what
//! `profile fit` writes. The fields are in the order the written file holds them; the serde
//! attributes say how each is written, in the layout of the bundled profiles: strings
//! double-quoted, `gpu_names` on one line, each decode point and the cold start on one line
//! (serde-saphyr's flow mappings have no spaces inside the braces), whole numbers without a
//! decimal point.

use serde::{Deserialize, Serialize, Serializer};
use serde_saphyr::{DoubleQuoted, FlowMap, FlowSeq, Location, Spanned};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    #[serde(serialize_with = "quoted")]
    pub(super) name: Spanned<String>,
    #[serde(default, serialize_with = "quoted_optional")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
    #[serde(default, serialize_with = "quoted_flow_list")]
    pub(super) gpu_names: Vec<String>,
    #[serde(default, serialize_with = "quoted_list")]
    pub(super) sources: Vec<String>,
    #[serde(default, serialize_with = "quoted_list")]
    pub(super) fitted: Vec<String>,
    pub(super) decode: Spanned<RawDecode>,
    #[serde(serialize_with = "figure")]
    pub(super) prefill_tok_s: Spanned<f64>,
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prefill_chunk_tokens: Option<Spanned<f64>>,
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prefill_overlap: Option<Spanned<f64>>,
    /// Absent = 0: the decode step does not grow with the context its sequences attend to.
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) kv_read_s_per_ktok: Option<Spanned<f64>>,
    #[serde(serialize_with = "figure")]
    pub(super) kv_capacity_tokens: Spanned<f64>,
    #[serde(serialize_with = "figure")]
    pub(super) max_running: Spanned<f64>,
    #[serde(serialize_with = "figure")]
    pub(super) context_window: Spanned<f64>,
    #[serde(default, serialize_with = "flow_map")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cold_start: Option<RawColdStart>,
    #[serde(default, serialize_with = "quoted_list")]
    pub(super) extrapolated: Vec<String>,
    /// `profile fit` declares one when its calibration loops miss or its overlap is poorly
    /// pinned (`fit/simulated.rs`), written on one line.
    #[serde(default, serialize_with = "uncertainty_map")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) uncertainty: Option<std::collections::BTreeMap<String, Spanned<f64>>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDecode {
    #[serde(default, serialize_with = "flow_points")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) points: Option<Vec<RawPoint>>,
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) single_tok_s: Option<Spanned<f64>>,
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) saturation_tok_s: Option<Spanned<f64>>,
    #[serde(default, serialize_with = "optional_figure")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) half_concurrency: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPoint {
    #[serde(serialize_with = "figure")]
    pub(super) concurrency: Spanned<f64>,
    #[serde(serialize_with = "figure")]
    pub(super) aggregate_tok_s: Spanned<f64>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawColdStart {
    #[serde(serialize_with = "figure")]
    pub(super) speed_factor: Spanned<f64>,
    #[serde(serialize_with = "figure")]
    pub(super) warmup_tokens: Spanned<f64>,
}

impl RawProfile {
    /// The profile's YAML text. Every string is quoted and every figure finite or a YAML
    /// special (`.nan`, `.inf`), so writing cannot fail.
    pub(super) fn to_yaml(&self) -> String {
        let layout = serde_saphyr::ser_options! {
            compact_list_indent: false,
            prefer_block_scalars: false,
        };
        serde_saphyr::to_string_with_options(self, layout).expect("a profile serialises")
    }
}

/// A value made in the program rather than read from a file: it has no place to point at.
pub(super) fn unlocated<T>(value: T) -> Spanned<T> {
    Spanned::new(value, Location::UNKNOWN, Location::UNKNOWN)
}

/// A figure as a person would write it: a whole number without a decimal point (`512`, not
/// `512.0`), any other in the shortest decimal that reads back to the same `f64`.
fn figure<S: Serializer>(x: &Spanned<f64>, s: S) -> Result<S::Ok, S::Error> {
    // every whole f64 below 2⁶³ in magnitude is an i64 exactly
    const I64_RANGE: f64 = 9_223_372_036_854_775_808.0;
    let x = x.value;
    if x.fract() == 0.0 && x.abs() < I64_RANGE {
        s.serialize_i64(x as i64)
    } else {
        s.serialize_f64(x)
    }
}

fn optional_figure<S: Serializer>(x: &Option<Spanned<f64>>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => figure(x, s),
        None => s.serialize_none(),
    }
}

fn quoted<S: Serializer>(text: &Spanned<String>, s: S) -> Result<S::Ok, S::Error> {
    DoubleQuoted(&text.value).serialize(s)
}

fn quoted_optional<S: Serializer>(text: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match text {
        Some(text) => DoubleQuoted(text).serialize(s),
        None => s.serialize_none(),
    }
}

/// A list of strings, one per line.
fn quoted_list<S: Serializer>(items: &[String], s: S) -> Result<S::Ok, S::Error> {
    QuotedList(items).serialize(s)
}

/// A list of strings on one line: `[\"a\", \"b\"]`.
fn quoted_flow_list<S: Serializer>(items: &[String], s: S) -> Result<S::Ok, S::Error> {
    FlowSeq(QuotedList(items)).serialize(s)
}

struct QuotedList<'a>(&'a [String]);

impl Serialize for QuotedList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(DoubleQuoted))
    }
}

/// The decode points, one per line.
fn flow_points<S: Serializer>(points: &Option<Vec<RawPoint>>, s: S) -> Result<S::Ok, S::Error> {
    match points {
        Some(points) => s.collect_seq(points.iter().map(FlowMap)),
        None => s.serialize_none(),
    }
}

/// `uncertainty:` on one line, its figures as a person writes them.
fn uncertainty_map<S: Serializer>(
    map: &Option<std::collections::BTreeMap<String, Spanned<f64>>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    struct Figure(f64);
    impl Serialize for Figure {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            figure(&unlocated(self.0), s)
        }
    }
    match map {
        Some(map) => {
            let figures: std::collections::BTreeMap<&str, Figure> = map
                .iter()
                .map(|(k, v)| (k.as_str(), Figure(v.value)))
                .collect();
            FlowMap(figures).serialize(s)
        }
        None => s.serialize_none(),
    }
}

/// A mapping on one line.
fn flow_map<S: Serializer, T: Serialize>(value: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => FlowMap(value).serialize(s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{HardwareProfile, validate};
    use super::*;

    /// Names a YAML writer could get wrong: quotes, backslashes, non-ASCII, control characters
    /// (C0, DEL, C1), Unicode line separators and a byte-order mark, and plain text YAML would
    /// read as something else (a comment, a boolean, a number, null, a list, a mapping).
    const AWKWARD: [&str; 14] = [
        "A \"quoted\" GPU",
        "back\\slash",
        "Ünïcode 显卡 🚀",
        "tab\there\nnewline\r",
        "bell\u{7} esc\u{1b} nul\u{0} del\u{7f} c1\u{9b}",
        "nel\u{85} ls\u{2028} ps\u{2029} bom\u{feff}",
        "",
        "  spaced  ",
        "# not a comment",
        "yes",
        "0.5",
        "null",
        "- dash",
        "{ flow: 1 }",
    ];

    fn profile(strings: &[&str], figures: [f64; 4], parametric: bool) -> RawProfile {
        let [a, b, c, d] = figures;
        let list = || strings.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let point = |concurrency, aggregate_tok_s| RawPoint {
            concurrency: unlocated(concurrency),
            aggregate_tok_s: unlocated(aggregate_tok_s),
        };
        let decode = if parametric {
            RawDecode {
                points: None,
                single_tok_s: Some(unlocated(a)),
                saturation_tok_s: Some(unlocated(a * (b + 1.0))),
                half_concurrency: Some(unlocated(b + 1.0)),
            }
        } else {
            RawDecode {
                points: Some(vec![point(1.0, a), point(b + 1.0, a * (b + 1.0))]),
                single_tok_s: None,
                saturation_tok_s: None,
                half_concurrency: None,
            }
        };
        RawProfile {
            name: unlocated(format!("n\"a\\me ü {}", strings.len())),
            description: Some(strings.concat()),
            gpu_names: list(),
            sources: list(),
            fitted: list(),
            decode: unlocated(decode),
            prefill_tok_s: unlocated(c),
            prefill_chunk_tokens: Some(unlocated(512.0)),
            prefill_overlap: Some(unlocated(d)),
            kv_read_s_per_ktok: None,
            kv_capacity_tokens: unlocated(131_072.0),
            max_running: unlocated(256.0),
            context_window: unlocated(32_768.0),
            cold_start: Some(RawColdStart {
                speed_factor: unlocated(d.max(1e-9)),
                warmup_tokens: unlocated(c),
            }),
            extrapolated: list(),
            uncertainty: None,
        }
    }

    /// What is written reads back, through the profile reader, to the profile its figures make
    /// without any text in between: every string, and every figure to the bit.
    #[test]
    fn a_written_profile_reads_back_to_the_same_profile() {
        let figure_sets = [
            [29.6, 7.0, 2400.0, 0.4],
            [1.0 / 3.0, 0.1, 1e-7, 1e-6],
            [1e-5, 1.5, 1e19, 1.0],
            [4_503_599_627_370_495.5, 1e16, 12_345_678.9, 0.0],
        ];
        for parametric in [false, true] {
            for strings in [&AWKWARD[..], &[]] {
                for figures in figure_sets {
                    let written = profile(strings, figures, parametric);
                    let text = written.to_yaml();
                    let read = HardwareProfile::from_yaml_str(&text, "w.yaml")
                        .unwrap_or_else(|e| panic!("{e}\n{text}"));
                    let direct = validate(profile(strings, figures, parametric), "w.yaml")
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(read, direct, "{text}");
                    assert_eq!(read.gpu_names(), strings, "{text}");
                    assert_eq!(read.prefill_tok_s().to_bits(), figures[2].to_bits());
                    assert_eq!(read.prefill_overlap().to_bits(), figures[3].to_bits());
                }
            }
        }
    }

    /// The layout of the bundled profiles, but for the flow mappings: serde-saphyr writes them
    /// without spaces inside the braces (`{concurrency: 1, ...}`, where the bundled files and
    /// the hand-written writer before it have `{ concurrency: 1, ... }`).
    #[test]
    fn the_text_has_the_bundled_profiles_layout() {
        let mut p = profile(
            &["RTX 4090", "RTX \"4090\""],
            [29.6, 7.0, 2400.0, 0.4],
            false,
        );
        p.description = None;
        p.prefill_chunk_tokens = None;
        p.sources.clear();
        p.fitted.truncate(1);
        assert_eq!(
            p.to_yaml(),
            "name: \"n\\\"a\\\\me ü 2\"\n\
             gpu_names: [\"RTX 4090\", \"RTX \\\"4090\\\"\"]\n\
             sources: []\n\
             fitted:\n  - \"RTX 4090\"\n\
             decode:\n  points:\n\
             \x20   - {concurrency: 1, aggregate_tok_s: 29.6}\n\
             \x20   - {concurrency: 8, aggregate_tok_s: 236.8}\n\
             prefill_tok_s: 2400\n\
             prefill_overlap: 0.4\n\
             kv_capacity_tokens: 131072\n\
             max_running: 256\n\
             context_window: 32768\n\
             cold_start: {speed_factor: 0.4, warmup_tokens: 2400}\n\
             extrapolated:\n  - \"RTX 4090\"\n  - \"RTX \\\"4090\\\"\"\n"
        );
    }
}
