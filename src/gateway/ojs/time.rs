//! The two time formats OJS speaks: RFC 3339 timestamps (UTC) and ISO 8601
//! durations (`PT1S`, `PT5M`, `P1D`).

use crate::calendar::{days_from_civil, utc_parts};

/// `ms` (Unix) as `2026-11-28T02:03:04.005Z`.
pub fn rfc3339(ms: i64) -> String {
    let (year, month, day, h, m, s, milli) = utc_parts(ms);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// An RFC 3339 timestamp as Unix ms: `YYYY-MM-DDTHH:MM:SS`, optional
/// fraction, then `Z` or an offset `+HH:MM`.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, m, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3 = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = first3.parse::<i64>().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(rest.as_bytes()[0], b'+' | b'-') && rest.as_bytes()[3] == b':' => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let (oh, om): (i64, i64) = (rest[1..3].parse().ok()?, rest[4..6].parse().ok()?);
            sign * (oh * 60 + om)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month as u32, day as u32);
    Some(((days * 24 + h) * 60 + m - offset_minutes) * 60_000 + s * 1000 + millis)
}

/// An ISO 8601 duration (`P[nD]T[nH][nM][n[.f]S]`, weeks as `PnW`) in ms.
pub fn parse_duration(text: &str) -> Option<i64> {
    let rest = text.strip_prefix('P')?;
    if rest.is_empty() {
        return None;
    }
    let (date, time) = match rest.split_once('T') {
        Some((date, time)) if !time.is_empty() => (date, Some(time)),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut total = 0f64;
    for (part, units) in [
        (date, &[('W', 604_800_000f64), ('D', 86_400_000f64)][..]),
        (time.unwrap_or(""), &[('H', 3_600_000f64), ('M', 60_000f64), ('S', 1000f64)][..]),
    ] {
        let mut number = String::new();
        let mut next_unit = 0;
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                number.push(c);
                continue;
            }
            let at = units.iter().skip(next_unit).position(|(u, _)| *u == c)? + next_unit;
            total += number.parse::<f64>().ok()? * units[at].1;
            number.clear();
            next_unit = at + 1;
        }
        if !number.is_empty() {
            return None;
        }
    }
    (total.is_finite() && total < 1e15).then_some(total.round() as i64)
}

/// A time option: an RFC 3339 timestamp, or `+` and an ISO 8601 duration
/// from `now_ms` (`+PT30S`), as OJS clients send them.
pub fn parse_time_option(text: &str, now_ms: i64) -> Option<i64> {
    match text.strip_prefix('+') {
        Some(duration) => parse_duration(duration).map(|ms| now_ms.saturating_add(ms)),
        None => parse_rfc3339(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        for ms in [0, 1_764_295_384_005, 4_102_444_799_000, 951_782_400_000] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms), "{}", rfc3339(ms));
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_rfc3339("2099-12-31T23:59:59Z"), Some(4_102_444_799_000));
        assert_eq!(parse_rfc3339("2020-01-01T01:00:00+01:00"), Some(1_577_836_800_000));
        for bad in ["", "2020-01-01", "2020-13-01T00:00:00Z", "2020-01-01T00:00:00", "yesterday"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_read_as_iso_8601() {
        assert_eq!(parse_duration("PT1S"), Some(1000));
        assert_eq!(parse_duration("PT5M"), Some(300_000));
        assert_eq!(parse_duration("PT1H30M"), Some(5_400_000));
        assert_eq!(parse_duration("P1DT0.5S"), Some(86_400_500));
        assert_eq!(parse_duration("P2W"), Some(1_209_600_000));
        for bad in ["", "P", "PT", "1S", "PT1X", "PTS", "PT1M1H"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
