//! The scenario reader's `trace:` sources: the file, its format (a named one, or a `jsonl` /
//! `csv` log read through a mapping), the replay options and what a seed does to it.

use super::reader::ScenarioReader;
use super::{RawResample, RawTraceMapping, RawTraffic, ScenarioError, TrafficSpec};
use crate::traffic::{
    ArrivalUnit, BadRowPolicy, FieldPath, READY_MADE_MAPPINGS, ReplayOptions, Resample,
    SessionPrefix, TraceFormat, TraceLayout, TraceMapping,
};
use serde_saphyr::Location;
use std::path::Path;

/// What a `resample:` may be.
const RESAMPLE_VALID: &str = "none (every seed replays the trace as recorded), block (each \
                              seed a block-bootstrap resample, the block length chosen from \
                              the trace) or { block_s: <seconds > 0> }";

impl ScenarioReader<'_> {
    /// A `trace:` source at `field` (`traffic[i].trace`).
    pub(super) fn trace(
        &self,
        loc: &Location,
        field: &str,
        raw: &RawTraffic,
    ) -> Result<TrafficSpec, ScenarioError> {
        let RawTraffic::Trace {
            path,
            format,
            mapping,
            time_scale,
            rate_scale,
            limit,
            skip_rows,
            start_offset_s,
            on_bad_row,
            resample,
        } = raw
        else {
            unreachable!("ScenarioReader::traffic sends traces only");
        };
        let base = self.path.parent().unwrap_or(Path::new("."));
        let resolved = base.join(path);
        let format =
            self.trace_format(loc, field, &resolved, format.as_deref(), mapping.as_ref())?;
        if !resolved.is_file() {
            return Err(self.file.at(
                loc,
                format!("{field}.path"),
                format!("no such file: {}", resolved.display()),
            ));
        }
        let on_bad_row = match on_bad_row.as_deref() {
            None | Some("error") => BadRowPolicy::Error,
            Some("skip") => BadRowPolicy::Skip,
            Some(other) => {
                return Err(self.file.at(
                    loc,
                    format!("{field}.on_bad_row"),
                    format!("unknown policy `{other}`; valid: error, skip"),
                ));
            }
        };
        let options = ReplayOptions {
            time_scale: time_scale.unwrap_or(1.0),
            rate_scale: rate_scale.unwrap_or(1.0),
            limit: *limit,
            skip_rows: skip_rows.unwrap_or(0),
            start_offset: self.secs(
                loc,
                &format!("{field}.start_offset_s"),
                *start_offset_s,
                0.0,
            )?,
            start_after_warmup: start_offset_s.is_none(),
            on_bad_row,
            resample: resample
                .as_ref()
                .map(|r| self.resample(loc, &format!("{field}.resample"), r))
                .transpose()?,
            window: None,
        };
        self.file.check(loc, field, options.validate())?;
        Ok(TrafficSpec::Trace {
            path: resolved,
            format,
            options,
        })
    }

    /// A trace's `resample:`.
    fn resample(
        &self,
        loc: &Location,
        field: &str,
        r: &RawResample,
    ) -> Result<Resample, ScenarioError> {
        match r {
            RawResample::Name(n) if n == "none" => Ok(Resample::Exact),
            RawResample::Name(n) if n == "block" => Ok(Resample::BLOCK_AUTO),
            RawResample::Name(n) => Err(self
                .file
                .at(loc, field, format!("unknown resample `{n}`"))
                .valid(RESAMPLE_VALID)),
            RawResample::Block { block_s } => {
                let ns = self.secs(loc, &format!("{field}.block_s"), Some(*block_s), 0.0)?;
                if ns == 0 {
                    return Err(self
                        .file
                        .at(loc, format!("{field}.block_s"), "is 0")
                        .valid(RESAMPLE_VALID));
                }
                Ok(Resample::Block { block_ns: Some(ns) })
            }
        }
    }

    /// The format of `traffic[i].trace` (`field`): a named one, or `jsonl` / `csv` (given or
    /// guessed from the extension) read through its `mapping`.
    fn trace_format(
        &self,
        loc: &Location,
        field: &str,
        file: &Path,
        format: Option<&str>,
        mapping: Option<&RawTraceMapping>,
    ) -> Result<TraceFormat, ScenarioError> {
        let Some(m) = mapping else {
            return self.unmapped_format(loc, field, file, format);
        };
        let session_prefix = match m.session_prefix.as_deref() {
            None => None,
            Some(p) => Some(SessionPrefix::from_name(p).ok_or_else(|| {
                self.file
                    .at(
                        loc,
                        format!("{field}.mapping.session_prefix"),
                        format!("unknown session prefix `{p}`"),
                    )
                    .valid(SessionPrefix::NAMES)
            })?),
        };
        let with_prefix = |mapping: TraceMapping| match session_prefix {
            None => Ok(mapping),
            Some(p) => self.file.check(
                loc,
                &format!("{field}.mapping.session_prefix"),
                mapping.with_session_prefix(p),
            ),
        };
        let only_session_prefix = m.arrival.is_none()
            && m.arrival_unit.is_none()
            && m.prompt_tokens.is_none()
            && m.output_tokens.is_none()
            && m.session_id.is_none()
            && m.prefix_hashes.is_none();
        // A ready-made mapping takes its own fields; only what its sessions mean may be said.
        if let Some(name) = format
            && only_session_prefix
            && let Some(TraceFormat::Mapped(ready)) = TraceFormat::from_name(name)
        {
            return with_prefix(*ready).map(|m| TraceFormat::Mapped(Box::new(m)));
        }
        let layout = self.mapped_layout(loc, field, file, format)?;
        self.custom_mapping(loc, field, layout, m)
            .and_then(with_prefix)
            .map(|m| TraceFormat::Mapped(Box::new(m)))
    }

    /// A format named (or guessed from the extension) without a mapping.
    fn unmapped_format(
        &self,
        loc: &Location,
        field: &str,
        file: &Path,
        format: Option<&str>,
    ) -> Result<TraceFormat, ScenarioError> {
        match format {
            Some(name @ ("jsonl" | "csv")) => Err(self.file.at(
                loc,
                format!("{field}.mapping"),
                format!(
                    "is missing: `format: {name}` reads any log through a mapping; give \
                     `mapping: {{ arrival: <key>, prompt_tokens: <key>, output_tokens: <key> }}` \
                     or a ready-made format ({READY_MADE_MAPPINGS})"
                ),
            )),
            Some(name) => self.named_format(loc, field, name),
            None => TraceFormat::from_path(file).ok_or_else(|| {
                self.file
                    .at(
                        loc,
                        format!("{field}.format"),
                        "cannot tell the format from the extension; set `format: azure` (CSV) \
                         or `format: mooncake` (JSONL)",
                    )
                    .valid(TraceFormat::NAMES)
            }),
        }
    }

    /// The format called `name`.
    fn named_format(
        &self,
        loc: &Location,
        field: &str,
        name: &str,
    ) -> Result<TraceFormat, ScenarioError> {
        TraceFormat::from_name(name).ok_or_else(|| {
            self.file
                .at(
                    loc,
                    format!("{field}.format"),
                    format!("unknown format `{name}`"),
                )
                .valid(TraceFormat::NAMES)
        })
    }

    /// The layout a custom mapping reads: `format: jsonl` / `csv`, or the file's extension.
    fn mapped_layout(
        &self,
        loc: &Location,
        field: &str,
        file: &Path,
        format: Option<&str>,
    ) -> Result<TraceLayout, ScenarioError> {
        match format {
            Some("jsonl") => Ok(TraceLayout::Jsonl),
            Some("csv") => Ok(TraceLayout::Csv),
            Some(name) => {
                self.named_format(loc, field, name)?;
                Err(self
                    .file
                    .at(
                        loc,
                        format!("{field}.mapping"),
                        format!("does not apply to `format: {name}`, which has its own fields"),
                    )
                    .valid(
                        "a mapping with `format: jsonl` or `format: csv`, no mapping, or (for \
                         `otel-genai`) a mapping with `session_prefix` alone",
                    ))
            }
            None => TraceFormat::layout_from_path(file).ok_or_else(|| {
                self.file.at(
                    loc,
                    format!("{field}.format"),
                    "cannot tell the layout of a mapped log from the extension; set `format: \
                     jsonl` or `format: csv`",
                )
            }),
        }
    }

    /// The mapping's keys (or columns), parsed for `layout`.
    fn custom_mapping(
        &self,
        loc: &Location,
        field: &str,
        layout: TraceLayout,
        m: &RawTraceMapping,
    ) -> Result<TraceMapping, ScenarioError> {
        let key =
            |name: &str, value: Option<&String>| -> Result<Option<FieldPath>, ScenarioError> {
                value
                    .map(|v| {
                        let parsed = match layout {
                            TraceLayout::Csv => FieldPath::column(v),
                            TraceLayout::Jsonl => FieldPath::parse(v),
                        };
                        self.file
                            .check(loc, &format!("{field}.mapping.{name}"), parsed)
                    })
                    .transpose()
            };
        let required = |name: &str, value: Option<&String>| {
            key(name, value)?.ok_or_else(|| {
                self.file.at(
                    loc,
                    format!("{field}.mapping.{name}"),
                    "is missing; a mapping names the arrival, prompt_tokens and output_tokens \
                     fields",
                )
            })
        };
        let unit = match m.arrival_unit.as_deref() {
            None => ArrivalUnit::Auto,
            Some(u) => ArrivalUnit::from_name(u).ok_or_else(|| {
                self.file
                    .at(
                        loc,
                        format!("{field}.mapping.arrival_unit"),
                        format!("unknown unit `{u}`"),
                    )
                    .valid(ArrivalUnit::NAMES)
            })?,
        };
        let mapping = TraceMapping::custom(
            layout,
            required("arrival", m.arrival.as_ref())?,
            unit,
            required("prompt_tokens", m.prompt_tokens.as_ref())?,
            required("output_tokens", m.output_tokens.as_ref())?,
            key("session_id", m.session_id.as_ref())?,
            key("prefix_hashes", m.prefix_hashes.as_ref())?,
        );
        self.file.check(loc, &format!("{field}.mapping"), mapping)
    }
}
