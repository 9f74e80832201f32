//! The client-facing gRPC API: validation, routing to partition leaders,
//! aggregation of worker streams, and long polling.
//!
//! A gateway owns no job state. It validates input (so nothing malformed is
//! replicated), picks a partition for new jobs (round-robin) or reads it from a
//! job's key, and sends commands to that partition's leader wherever it runs.

mod aggregator;
pub mod convert;
pub mod error;
mod observe;
pub mod router;
mod service;
pub mod streams;

use std::time::Duration;

pub use convert::Limits;
pub use error::ApiError;
pub use observe::Observe;
pub use service::{cluster_status, cluster_status_json, GatewayService};

/// Parses a `grpc-timeout` header value (`100m`, `5S`, ...).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}
