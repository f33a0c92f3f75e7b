//! Trace timestamps: ISO-8601 / RFC 3339 date-times (naive = UTC) and epoch seconds, as
//! nanoseconds since the Unix epoch.

/// Parse `YYYY-MM-DD[ T]HH:MM:SS[.f…][Z|±HH:MM]` (naive = UTC) or a plain number of seconds
/// into nanoseconds since the Unix epoch.
pub(crate) fn parse_timestamp(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() >= 19 && b[4] == b'-' {
        parse_datetime(b)
    } else {
        let secs: f64 = s.parse().ok()?;
        (secs.is_finite() && secs.abs() < 9.2e9).then(|| (secs * 1e9).round() as i64)
    }
}

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |acc, d| acc * 10 + i64::from(d - b'0')))
}

/// `YYYY-MM-DD[T ]hh:mm:ss[.frac][Z|±hh:mm]` as nanoseconds since the Unix epoch; `None` for
/// anything else, a shorter text included (the caller's bytes come straight from a user's file).
pub(crate) fn parse_datetime(b: &[u8]) -> Option<i64> {
    if b.len() < 19 {
        return None;
    }
    if b[7] != b'-' || !matches!(b[10], b' ' | b'T') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let (h, mi, sec) = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59
    {
        return None;
    }
    let mut rest = &b[19..];
    let mut frac_ns = 0;
    if let Some(r) = rest.strip_prefix(b".") {
        let n = r.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        let (f, r) = r.split_at(n);
        let used = &f[..n.min(9)];
        frac_ns = digits(used)? * 10_i64.pow(9 - used.len() as u32);
        rest = r;
    }
    let offset_s = match rest {
        [] | [b'Z'] => 0,
        [sign @ (b'+' | b'-'), hh @ ..] => {
            let (oh, om) = match hh {
                [a, b2, b':', c, d2] | [a, b2, c, d2] => (digits(&[*a, *b2])?, digits(&[*c, *d2])?),
                [a, b2] => (digits(&[*a, *b2])?, 0),
                _ => return None,
            };
            let off = oh * 3600 + om * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

const fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

const fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
const fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
