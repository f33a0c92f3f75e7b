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

/// Append the decimal digits of `n` (what `n.to_string()` gives) without allocating.
pub(crate) fn push_uint(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Append exactly what `fmt_fixed(x, 6)` gives, without allocating in the common case: the
/// per-request rows of a million-request run hold several million such figures.
///
/// Fast path: for `0 <= x < 1e6` the product `x * 1e6` is below 1e12, so its rounding error is
/// under 1.2e-4 of a unit in the sixth decimal. When its fractional part is more than 1e-3 away
/// from one half, rounding the product gives the same digits as rounding the exact binary value
/// (what `format!` does). Everything else (ties within the error, large, negative or
/// non-finite values) takes `fmt_fixed` itself, so the two can never disagree.
pub(crate) fn push_fixed6(out: &mut Vec<u8>, x: f64) {
    if (0.0..1e6).contains(&x) {
        let scaled = x * 1e6;
        let whole = scaled.floor();
        let frac = scaled - whole;
        if (frac - 0.5).abs() > 1e-3 {
            let micros = whole as u64 + u64::from(frac > 0.5);
            push_uint(out, micros / 1_000_000);
            out.push(b'.');
            let mut fraction = micros % 1_000_000;
            let mut digits = [b'0'; 6];
            for d in digits.iter_mut().rev() {
                *d = b'0' + (fraction % 10) as u8;
                fraction /= 10;
            }
            out.extend_from_slice(&digits);
            return;
        }
    }
    out.extend_from_slice(fmt_fixed(x, 6).as_bytes());
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

    fn fixed6(x: f64) -> String {
        let mut out = Vec::new();
        push_fixed6(&mut out, x);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fast_fixed6_equals_fmt_fixed_on_edges() {
        for x in [
            0.0,
            -0.0,
            0.0000005,
            0.0000015,
            0.0000025,
            1.0000005,
            0.1234565,
            999_999.999_999_5,
            1e6,
            1e6 + 0.25,
            1e12,
            -0.000_000_4,
            -1.5,
            f64::MIN_POSITIVE,
            f64::EPSILON,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(fixed6(x), fmt_fixed(x, 6), "x = {x:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn fast_fixed6_equals_fmt_fixed(
            small in 0.0f64..10.0,
            mid in 0.0f64..1e6,
            ticks in 0u64..2_000_000_000,
            any in proptest::num::f64::ANY,
        ) {
            // `ticks` hits exact and half-way microsecond values, where rounding matters most.
            for x in [small, mid, ticks as f64 / 2e6, ticks as f64 / 1e9, any] {
                proptest::prop_assert_eq!(fixed6(x), fmt_fixed(x, 6), "x = {:e}", x);
            }
        }

        #[test]
        fn push_uint_equals_to_string(n in proptest::num::u64::ANY) {
            let mut out = Vec::new();
            push_uint(&mut out, n);
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
    }
}
