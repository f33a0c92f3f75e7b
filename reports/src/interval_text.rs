//! How an interval across seeds ([`Interval`]) is written, in every output that shows one: the
//! console tables, the HTML pages, `docs/findings.md` and `capacity.json`. One place, so that a
//! capacity in the findings, a replica study's cell and a comparison's cell cannot drift apart.
//!
//! - `mean ± half-width`: [`cell`] (plain figures to `sig` significant digits) and [`metric_cell`]
//!   (a metric's own formatting; fractions' half-widths in percent points). A half-width with no
//!   spread ([`no_spread`]: every seed gave the same value) prints as `± 0`; one value, as its
//!   mean alone; no value, as `-`.
//! - [`columns`]: the same two parts for a table that gives each its column.
//! - [`bounds`]: `[low, high]`, for a ratio whose verdict reads its ends.
//! - [`json`]: `{n, mean, low, high, half_width}` to 6 significant digits.

use crate::metric::{Metric, Unit};
use crate::num::{fmt_sig, r6};
use crate::stats::Interval;
use serde_json::{Value, json};

/// Whether an interval over several seeds has no width: every seed gave the same value, up to
/// the rounding noise of identical seeds (a billionth of the mean or less).
pub(crate) fn no_spread(iv: &Interval) -> bool {
    iv.half_width.is_some_and(|h| h <= iv.mean.abs() * 1e-9)
}

/// `± h` for the interval's half-width, 2 significant digits (`± 0` with no spread); `None`
/// for one value.
fn half_width(iv: &Interval) -> Option<String> {
    let h = iv.half_width?;
    Some(if no_spread(iv) {
        "± 0".into()
    } else {
        format!("± {}", fmt_sig(Some(h), 2))
    })
}

/// `mean ± h` with the mean to `sig` significant digits; the mean alone for one value, `-` for
/// none.
pub(crate) fn cell(iv: Option<Interval>, sig: i32) -> String {
    let (mean, hw) = columns(iv, sig);
    match iv.and_then(|i| i.half_width) {
        Some(_) => format!("{mean} {hw}"),
        None => mean,
    }
}

/// `mean ± h` of metric `m`: the mean as the metric prints its statistics, the half-width of a
/// fraction in percent points (`82.5% ± 1.2`).
pub(crate) fn metric_cell(m: &Metric, iv: Option<Interval>) -> String {
    let Some(iv) = iv else { return "-".into() };
    let mean = m.fmt_stat(Some(iv.mean));
    match iv.half_width {
        Some(h) if m.unit == Unit::Fraction && !no_spread(&iv) => {
            format!("{mean} ± {:.1}", h * 100.0)
        }
        Some(_) => format!("{mean} {}", half_width(&iv).unwrap_or_default()),
        None => mean,
    }
}

/// The mean (to `sig` significant digits) and `± h`, each for its own column; `-` for what is
/// missing.
pub(crate) fn columns(iv: Option<Interval>, sig: i32) -> (String, String) {
    match iv {
        Some(i) => (
            fmt_sig(Some(i.mean), sig),
            half_width(&i).unwrap_or_else(|| "-".into()),
        ),
        None => ("-".into(), "-".into()),
    }
}

/// `[low, high]` to `sig` significant digits; `None` for one value (no interval).
pub(crate) fn bounds(iv: &Interval, sig: i32) -> Option<String> {
    iv.half_width?;
    Some(format!(
        "[{}, {}]",
        fmt_sig(Some(iv.low()), sig),
        fmt_sig(Some(iv.high()), sig)
    ))
}

/// The interval as JSON (`null` for none).
pub(crate) fn json(iv: Option<Interval>) -> Value {
    match iv {
        Some(i) => json!({
            "n": i.n,
            "mean": r6(i.mean),
            "low": r6(i.low()),
            "high": r6(i.high()),
            "half_width": i.half_width.and_then(r6),
        }),
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::view;

    fn iv(xs: &[f64]) -> Option<Interval> {
        Interval::of(xs.iter().copied())
    }

    #[test]
    fn plain_cells_say_mean_and_half_width_or_what_is_missing() {
        assert_eq!(cell(iv(&[1.0, 2.0, 3.0]), 3), "2.00 ± 2.5");
        assert_eq!(cell(iv(&[4.0, 4.0]), 3), "4.00 ± 0");
        assert_eq!(cell(iv(&[1.23456]), 3), "1.23");
        assert_eq!(cell(None, 3), "-");
        assert_eq!(columns(iv(&[1.23456]), 3), ("1.23".into(), "-".into()));
        assert_eq!(columns(None, 3), ("-".into(), "-".into()));
    }

    #[test]
    fn a_fractions_half_width_is_in_percent_points() {
        let frac = crate::metric::CATALOG
            .iter()
            .find(|m| m.unit == Unit::Fraction)
            .expect("the catalog has a fraction");
        let s = metric_cell(frac, iv(&[0.80, 0.85, 0.82]));
        assert_eq!(s, "82.3% ± 6.3");
        // No spread is `± 0` whatever the unit.
        assert!(metric_cell(frac, iv(&[0.5, 0.5])).ends_with("± 0"));
        let secs = view("e2e_mean_s");
        assert!(metric_cell(secs, iv(&[1.0, 2.0, 3.0])).ends_with("± 2.5"));
        assert_eq!(metric_cell(secs, None), "-");
    }

    #[test]
    fn bounds_need_a_width_and_json_keeps_every_part() {
        assert_eq!(
            bounds(&iv(&[1.0, 2.0, 3.0]).unwrap(), 3).unwrap(),
            "[-0.484, 4.48]"
        );
        assert_eq!(bounds(&iv(&[1.0]).unwrap(), 3), None);
        let j = json(iv(&[1.0, 3.0]));
        assert_eq!(j["n"], 2);
        assert_eq!(j["mean"], 2.0);
        assert!(j["half_width"].as_f64().unwrap() > 0.0);
        assert_eq!(json(None), Value::Null);
    }
}
