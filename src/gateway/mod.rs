//! The client-facing API: one call layer, one typed job API, and the
//! protocols that are adapters over it.
//!
//! A gateway owns no job state. It validates input (so nothing malformed is
//! replicated), picks a partition for new jobs (one this node leads, or
//! round-robin: `--create-placement`) or reads it from a job's key, and sends
//! commands to that partition's leader wherever it runs.
//!
//! The layers, top down:
//! - [`call`]: every RPC on the client port passes it: authentication,
//!   admission, the deadline, the in-flight count, the trace.
//! - [`v1`] (`drover.v1.Gateway`), [`zeebe`] (Zeebe's job-worker RPCs), and
//!   the console in [`crate::admin`]: adapters that translate and call
//! - [`jobs::JobApi`], the typed job API, which authorizes each request's
//!   body (job types, tenants) and runs it through
//! - [`router`] (to the partition's leader, here or on another node),
//!   [`fanout`] (chunks of commands over partitions), [`listing`],
//!   [`sessions`], [`yields`] and [`status`].
//!
//! Below it: [`crate::context`], [`crate::streams`], [`crate::partition`].
//! It must not import the admin server, the cluster service or the node's
//! start-up.

mod activation;
pub mod backups;
pub mod call;
mod chunks;
pub mod client_streams;
pub mod convert;
pub mod error;
pub mod events;
pub mod fanout;
pub mod jobs;
mod keys;
pub mod limits;
mod listing;
mod observe;
pub mod ojs;
pub mod plan;
pub mod queues;
mod reads;
pub mod router;
pub mod schedules;
pub mod sessions;
pub mod status;
pub mod v1;
mod workers;
pub mod workflows;
pub mod yields;
pub mod zeebe;

use std::time::{Duration, Instant};

pub use call::{Call, CallLayer};
pub use error::ApiError;
pub use jobs::JobApi;
pub use observe::Observe;
pub use status::{cluster_status, cluster_status_json};
pub use v1::GatewayService;
pub use zeebe::ZeebeService;

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

/// gRPC allows at most eight digits in a `grpc-timeout` value.
pub const MAX_GRPC_TIMEOUT_DIGITS: usize = 8;

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
