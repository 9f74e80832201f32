//! Deadlines from the wire: gRPC's `grpc-timeout` header as a duration, and
//! a deadline that no client's timeout can overflow. Used by the client
//! port's call layer and by the cluster service between nodes alike.

use std::time::{Duration, Instant};

/// gRPC allows at most eight digits in a `grpc-timeout` value.
pub const MAX_GRPC_TIMEOUT_DIGITS: usize = 8;

/// Parses a `grpc-timeout` header value (`100m`, `5S`, ...) as gRPC defines it:
/// one to eight ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
/// Anything else, such as `18446744073709551615S`, is `None`: no deadline a
/// client can send overflows a clock.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > MAX_GRPC_TIMEOUT_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match &value[digits.len()..] {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// `now + timeout`, or `None` where the platform's clock cannot represent it.
pub fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_have_one_to_eight_digits_and_a_unit() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for invalid in ["", "S", "5", "5s", "-5S", "+5S", " 5S", "123456789m", "18446744073709551615S", "5SS", "5µ"] {
            assert_eq!(parse_grpc_timeout(invalid), None, "{invalid:?}");
        }
        assert!(deadline_after(parse_grpc_timeout("99999999H").unwrap()).is_some());
    }
}
