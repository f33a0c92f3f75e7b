//! Deterministic number formatting: the same value prints the same way on every machine.

/// Round to `sig` significant digits; `None` for NaN and infinities.
pub(crate) fn round_sig(x: f64, sig: usize) -> Option<f64> {
    if !x.is_finite() {
        return None;
    }
    if x == 0.0 {
        return Some(0.0);
    }
    // Formatting through the shortest-exact decimal printer is platform independent.
    format!("{:.*e}", sig.saturating_sub(1), x).parse().ok()
}

/// [`round_sig`] with the precision of every JSON figure (6 significant digits).
pub(crate) fn r6(x: f64) -> Option<f64> {
    round_sig(x, 6)
}

/// At least `sig` significant digits, fixed notation, no exponent: `0.0106`, `1.23`, `123`,
/// `12345`. `-` for missing values.
pub(crate) fn fmt_sig(x: Option<f64>, sig: i32) -> String {
    match x {
        Some(v) if v.is_finite() => {
            if v == 0.0 {
                return "0".into();
            }
            let mag = v.abs().log10().floor() as i32;
            let decimals = (sig - 1 - mag).clamp(0, 9) as usize;
            let s = format!("{v:.decimals$}");
            if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
                s[1..].to_string()
            } else {
                s
            }
        }
        _ => "-".into(),
    }
}

/// `± h` for a 95 % half-width next to its `mean`, 2 significant digits; rounding noise of
/// identical seeds (a half-width a billionth of the mean or less) prints as `± 0`.
pub(crate) fn fmt_half_width(mean: f64, h: f64) -> String {
    if h <= mean.abs() * 1e-9 {
        "± 0".into()
    } else {
        format!("± {}", fmt_sig(Some(h), 2))
    }
}

/// A fraction as a percentage with one decimal: `75.0%`.
pub(crate) fn fmt_pct(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{:.1}%", v * 100.0),
        _ => "-".into(),
    }
}

/// Fixed decimals for CSV; empty for missing or non-finite values.
pub(crate) fn fmt_fixed(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        let s = format!("{x:.decimals$}");
        if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
            s[1..].to_string()
        } else {
            s
        }
    } else {
        String::new()
    }
}

/// A short axis label: up to 3 significant digits, trailing zeros trimmed (`0.05`, `2`, `150`,
/// `12000`).
pub(crate) fn fmt_axis(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    if v.abs() < 1e-12 {
        return "0".into();
    }
    let s = fmt_sig(Some(v), 3);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A file-name-safe slug of a name: lower-case ASCII letters, digits and `-`.
pub(crate) fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out.truncate(40);
    if out.is_empty() { "x".into() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_formatting() {
        assert_eq!(r6(1.0 / 3.0), Some(0.333333));
        assert_eq!(r6(f64::NAN), None);
        assert_eq!(r6(f64::INFINITY), None);
        assert_eq!(r6(0.1 + 0.2), Some(0.3));
        assert_eq!(r6(123456789.0), Some(123457000.0));
        assert_eq!(fmt_sig(Some(0.010_63), 3), "0.0106");
        assert_eq!(fmt_sig(Some(1.234_56), 3), "1.23");
        assert_eq!(fmt_sig(Some(12_345.6), 3), "12346");
        assert_eq!(fmt_sig(None, 3), "-");
        assert_eq!(fmt_sig(Some(-0.000_000_000_01), 3), "0.000000000");
        assert_eq!(fmt_pct(Some(0.75)), "75.0%");
        assert_eq!(fmt_fixed(f64::NAN, 3), "");
        assert_eq!(fmt_fixed(-0.0001, 3), "0.000");
        assert_eq!(fmt_axis(0.05), "0.05");
        assert_eq!(fmt_axis(2.0), "2");
        assert_eq!(fmt_axis(150.0), "150");
        assert_eq!(fmt_axis(0.25), "0.25");
        assert_eq!(slug("seed-v3 + {sed / higher}"), "seed-v3-sed-higher");
        assert_eq!(slug("///"), "x");
    }
}
