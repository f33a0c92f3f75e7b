//! What a mapped log's arrival field holds: the units, reading a value in one, and the doubts
//! a declared unit raises when the whole log is read in it.

use super::MappedRow;
use crate::traffic::trace::parse_datetime;

/// What the arrival field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ArrivalUnit {
    /// Decided from the first row: an ISO-8601 date-time, or an epoch number whose magnitude
    /// gives its unit (`1e8 ≤ x < 1e11` seconds, `< 1e14` ms, `< 1e17` µs, else ns — each range
    /// is 1973-03-03 to the year 5138, so they never overlap). A number below `1e8` is refused:
    /// it is a time from the start, whose unit only the mapping can say.
    #[default]
    Auto,
    /// Seconds since the Unix epoch (integer or fractional).
    EpochS,
    /// Milliseconds since the Unix epoch.
    EpochMs,
    /// Microseconds since the Unix epoch.
    EpochUs,
    /// Nanoseconds since the Unix epoch (an integer, e.g. OpenTelemetry's `startTimeUnixNano`).
    EpochNs,
    /// ISO-8601 / RFC 3339 date-time; without a zone it is UTC.
    Iso8601,
    /// Seconds from the start of the log.
    OffsetS,
    /// Milliseconds from the start of the log.
    OffsetMs,
}

const ISO_EXAMPLES: &str = "`2025-03-01T12:00:00Z`, `2025-03-01T14:00:00+02:00` or \
                            `2025-03-01 12:00:00.123` (no zone = UTC)";

/// An arrival that cannot be read in its unit. The message is the field's problem; the reader
/// names the file, line and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArrivalError {
    /// `auto` met a negative number.
    #[error("is negative ({0}); expected a time >= 0")]
    NegativeTime(String),
    /// `auto` met a number too small for an epoch time: an offset, whose unit it cannot tell.
    #[error(
        "is {0}, a time from the start whose unit `arrival_unit: auto` cannot tell; set \
         `arrival_unit: offset_s` or `offset_ms` (auto reads numbers >= 1e8 as epoch seconds, \
         ms, µs or ns by magnitude)"
    )]
    OffsetForAuto(String),
    /// `auto` met neither a number nor a date-time.
    #[error(
        "`{0}` is neither a date-time nor a number; `arrival_unit: auto` accepts an ISO-8601 \
         date-time ({iso}) or epoch seconds, ms, µs or ns (a number >= 1e8)",
        iso = ISO_EXAMPLES
    )]
    NotATime(String),
    /// `iso8601` met something else.
    #[error("`{0}` is not an ISO-8601 / RFC 3339 date-time; expected e.g. {iso}", iso = ISO_EXAMPLES)]
    NotADateTime(String),
    /// A date-time before the epoch the replay measures from.
    #[error("`{0}` is before 1970-01-01T00:00:00Z; expected a date-time from 1970 on")]
    BeforeEpoch(String),
    /// A number unit met a negative number.
    #[error("is negative ({0}); expected a number >= 0")]
    Negative(String),
    /// A number unit met an infinity or NaN.
    #[error("is {0}; expected a number >= 0 (finite)")]
    NotFinite(String),
    /// A time past what nanoseconds in an `i64` hold.
    #[error(
        "is {text}, too large for `arrival_unit: {unit}`; expected a time before the year 2262"
    )]
    TooLarge {
        /// The value as written.
        text: String,
        /// The unit's name.
        unit: &'static str,
    },
    /// A number unit met text that is not a number.
    #[error(
        "`{text}` is not a number; `arrival_unit: {unit}` expects a number >= 0 (for a date-time \
         like {iso}, set `arrival_unit: iso8601` or `auto`)",
        iso = ISO_EXAMPLES
    )]
    NotANumber {
        /// The value as written.
        text: String,
        /// The unit's name.
        unit: &'static str,
    },
}

impl ArrivalUnit {
    /// Every unit's name, as the mapping's `arrival_unit` accepts it.
    pub const NAMES: &'static str =
        "auto, epoch_s, epoch_ms, epoch_us, epoch_ns, iso8601, offset_s, offset_ms";

    /// The unit called `name` (see [`ArrivalUnit::NAMES`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "auto" => Self::Auto,
            "epoch_s" => Self::EpochS,
            "epoch_ms" => Self::EpochMs,
            "epoch_us" => Self::EpochUs,
            "epoch_ns" => Self::EpochNs,
            "iso8601" => Self::Iso8601,
            "offset_s" => Self::OffsetS,
            "offset_ms" => Self::OffsetMs,
            _ => return None,
        })
    }

    /// The unit's name as a mapping writes it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::EpochS => "epoch_s",
            Self::EpochMs => "epoch_ms",
            Self::EpochUs => "epoch_us",
            Self::EpochNs => "epoch_ns",
            Self::Iso8601 => "iso8601",
            Self::OffsetS => "offset_s",
            Self::OffsetMs => "offset_ms",
        }
    }

    /// Nanoseconds per unit of a numeric unit.
    const fn ns_per_unit(self) -> Option<i64> {
        match self {
            Self::EpochS | Self::OffsetS => Some(1_000_000_000),
            Self::EpochMs | Self::OffsetMs => Some(1_000_000),
            Self::EpochUs => Some(1_000),
            Self::EpochNs => Some(1),
            Self::Auto | Self::Iso8601 => None,
        }
    }

    /// The unit `auto` reads `text` (the first row's arrival) in.
    ///
    /// # Errors
    /// What is wrong with `text` and what `auto` accepts.
    pub fn detect(text: &str) -> Result<Self, ArrivalError> {
        if let Ok(x) = text.parse::<f64>()
            && x.is_finite()
        {
            return Ok(match x {
                x if x < 0.0 => return Err(ArrivalError::NegativeTime(text.to_owned())),
                x if x < 1e8 => return Err(ArrivalError::OffsetForAuto(text.to_owned())),
                x if x < 1e11 => Self::EpochS,
                x if x < 1e14 => Self::EpochMs,
                x if x < 1e17 => Self::EpochUs,
                _ => Self::EpochNs,
            });
        }
        if parse_datetime(text.as_bytes()).is_some() {
            return Ok(Self::Iso8601);
        }
        Err(ArrivalError::NotATime(text.to_owned()))
    }

    fn too_large(self, text: &str) -> ArrivalError {
        ArrivalError::TooLarge {
            text: text.to_owned(),
            unit: self.name(),
        }
    }

    /// Parse `text` in this unit into nanoseconds (absolute for epoch units and date-times,
    /// from the start for offsets; the replay makes both relative to the first row).
    ///
    /// # Errors
    /// What is wrong and what would be valid. `Auto` must be resolved first ([`Self::detect`]).
    pub fn parse(self, text: &str) -> Result<i64, ArrivalError> {
        let Some(per) = self.ns_per_unit() else {
            let unit = if self == Self::Auto {
                Self::detect(text)?
            } else {
                self
            };
            if unit != Self::Iso8601 {
                return unit.parse(text);
            }
            let ns = parse_datetime(text.as_bytes())
                .ok_or_else(|| ArrivalError::NotADateTime(text.to_owned()))?;
            // Epoch numbers must be >= 0; a date-time before 1970 is refused the same way, so
            // that arrivals never precede the epoch the replay measures from.
            if ns < 0 {
                return Err(ArrivalError::BeforeEpoch(text.to_owned()));
            }
            return Ok(ns);
        };
        if text.starts_with('-') && text[1..].parse::<f64>().is_ok() {
            return Err(ArrivalError::Negative(text.to_owned()));
        }
        // Plain decimals are converted exactly (an f64 of epoch seconds is off by ~100 ns).
        if let Some((int, frac)) = text.split_once('.').or(Some((text, "")))
            && !int.is_empty()
            && int.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
        {
            let whole = int.parse::<i64>().ok().and_then(|n| n.checked_mul(per));
            let frac = &frac[..frac.len().min(18)];
            let part = if frac.is_empty() {
                0
            } else {
                let scale = 10_i128.pow(frac.len() as u32);
                let f: i128 = frac.parse().unwrap_or(0);
                ((f * i128::from(per) + scale / 2) / scale) as i64
            };
            return whole
                .and_then(|w| w.checked_add(part))
                .ok_or_else(|| self.too_large(text));
        }
        match text.parse::<f64>() {
            Ok(x) if !x.is_finite() => Err(ArrivalError::NotFinite(text.to_owned())),
            Ok(x) if x < 0.0 => Err(ArrivalError::Negative(text.to_owned())),
            Ok(x) if x * (per as f64) < 9.2e18 => Ok((x * per as f64).round() as i64),
            Ok(_) => Err(self.too_large(text)),
            Err(_) => Err(ArrivalError::NotANumber {
                text: text.to_owned(),
                unit: self.name(),
            }),
        }
    }
}

/// A declared `offset_s` is doubted when the log then spans more than this (1 day)…
pub const OFFSET_S_DOUBT_SPAN_S: f64 = 86_400.0;
/// …at fewer requests per second than this (1 per minute): millisecond offsets read as seconds.
pub const OFFSET_S_DOUBT_RATE: f64 = 1.0 / 60.0;
/// A declared `offset_ms` is doubted when the log then spans less than this (60 s)…
pub const OFFSET_MS_DOUBT_SPAN_S: f64 = 60.0;
/// …at more requests per second than this: second offsets read as milliseconds.
pub const OFFSET_MS_DOUBT_RATE: f64 = 1_000.0;
/// A declared epoch unit is doubted when the first arrival reads as a date before this one
/// (1990-01-01T00:00:00Z, in seconds): a coarser unit's numbers read in a finer unit.
pub const EPOCH_DOUBT_BEFORE_S: i64 = 631_152_000;

/// What is implausible about a log's arrivals read in the unit its mapping declares (`unit`,
/// after `auto` was resolved; `declared` false for `auto`, which picks by magnitude and is not
/// doubted): the log's `rows` (sorted) would span an implausible time at an implausible rate,
/// or start before 1990. `None` when nothing is.
pub(crate) fn unit_warning(
    unit: ArrivalUnit,
    declared: bool,
    rows: &[MappedRow],
    source: &str,
) -> Option<String> {
    let (first, last) = (rows.first()?.ts, rows.last()?.ts);
    if !declared {
        return None;
    }
    let span_s = (last - first) as f64 / 1e9;
    let n = rows.len() as f64;
    let rate = |span: f64| if span > 0.0 { n / span } else { f64::INFINITY };
    let span_text = |s: f64| {
        if s >= 2.0 * 86_400.0 {
            format!("{:.1} days", s / 86_400.0)
        } else if s >= 7_200.0 {
            format!("{:.1} h", s / 3_600.0)
        } else {
            format!("{s:.1} s")
        }
    };
    let set = |name: &str| format!("set `arrival_unit: {name}`");
    match unit {
        ArrivalUnit::OffsetS
            if span_s > OFFSET_S_DOUBT_SPAN_S && rate(span_s) < OFFSET_S_DOUBT_RATE =>
        {
            Some(format!(
                "{source}: read as `arrival_unit: offset_s`, its {} requests span {} ({:.4} \
                 req/s); if the offsets are milliseconds they span {} ({:.2} req/s): {} (this \
                 warning: `offset_s` giving a span over 1 day at under 1 request per minute)",
                rows.len(),
                span_text(span_s),
                rate(span_s),
                span_text(span_s / 1e3),
                rate(span_s / 1e3),
                set("offset_ms")
            ))
        }
        ArrivalUnit::OffsetMs
            if span_s < OFFSET_MS_DOUBT_SPAN_S && rate(span_s) > OFFSET_MS_DOUBT_RATE =>
        {
            Some(format!(
                "{source}: read as `arrival_unit: offset_ms`, its {} requests span {} ({:.0} \
                 req/s); if the offsets are seconds they span {} ({:.2} req/s): {} (this \
                 warning: `offset_ms` giving over 1,000 req/s within a span under 60 s)",
                rows.len(),
                span_text(span_s),
                rate(span_s),
                span_text(span_s * 1e3),
                rate(span_s * 1e3),
                set("offset_s")
            ))
        }
        ArrivalUnit::EpochMs | ArrivalUnit::EpochUs | ArrivalUnit::EpochNs
            if first / 1_000_000_000 < EPOCH_DOUBT_BEFORE_S =>
        {
            let coarser = match unit {
                ArrivalUnit::EpochMs => ArrivalUnit::EpochS,
                ArrivalUnit::EpochUs => ArrivalUnit::EpochMs,
                _ => ArrivalUnit::EpochUs,
            };
            Some(format!(
                "{source}: read as `arrival_unit: {}`, its first arrival is {} s after \
                 1970-01-01, before 1990; the numbers look like a coarser unit: {} (this \
                 warning: an epoch time before 1990-01-01)",
                unit.name(),
                first / 1_000_000_000,
                set(coarser.name())
            ))
        }
        _ => None,
    }
}
