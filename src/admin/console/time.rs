//! Times as the console shows them: UTC timestamps and "how long ago".

/// `ms` (Unix epoch) as `YYYY-MM-DD HH:MM:SS.mmm UTC`; empty for zero.
pub fn utc(ms: i64) -> String {
    if ms == 0 {
        return String::new();
    }
    let (year, month, day, h, m, s, milli) = crate::calendar::utc_parts(ms);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{milli:03} UTC")
}

/// How long before `now` the moment `then` was, roughly: `12 s ago`,
/// `5 min ago`, `3 h ago`, `2 d ago`; `in 4 s` for the future; empty for zero.
pub fn ago(now: i64, then: i64) -> String {
    if then == 0 {
        return String::new();
    }
    let (seconds, future) = if now >= then { ((now - then) / 1000, false) } else { ((then - now) / 1000, true) };
    let span = match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7_199 => format!("{} min", seconds / 60),
        7_200..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_read_in_utc() {
        assert_eq!(utc(0), "");
        assert_eq!(utc(1), "1970-01-01 00:00:00.001 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(utc(1_795_612_323_456), "2026-11-25 13:12:03.456 UTC");
    }

    #[test]
    fn spans_read_in_the_largest_sensible_unit() {
        assert_eq!(ago(10_000, 0), "");
        assert_eq!(ago(10_000, 4_000), "6 s ago");
        assert_eq!(ago(1_000_000, 100_000), "15 min ago");
        assert_eq!(ago(100_000_000, 1), "27 h ago");
        assert_eq!(ago(1_000, 5_000), "in 4 s");
    }
}
