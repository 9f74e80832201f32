//! Reaching partition leaders from any node: the client of the partitions
//! that the gateway's job API, the cluster service and the node's own loops
//! all send through.
//!
//! - [`submit`], [`submit_as`] and [`submit_here`] run commands on a
//!   partition's leader, on this node or another (the router: see its
//!   doc for which failures are retried and which leave the outcome unknown);
//!   every batch first passes the version gate ([`versions`]).
//! - [`creates`] decides where a create goes, for single creates and chunks.
//! - [`fanout`] runs chunks of commands over partitions and one command on
//!   every partition.
//! - [`describe`], [`read`], [`list`] and [`events`] read from a leader's
//!   applied state without a log entry.
//! - [`keys`] follows idempotency keys across partition counts; [`yields`]
//!   hands undelivered pushes back.
//! - [`ApiError`] is every error a client can see, mapped once to a gRPC
//!   status; [`timeout`] turns `grpc-timeout` into deadlines.
//!
//! It decides nothing about jobs (the engine in [`crate::core`] does) and
//! checks no principal's right to a body (the job API does, and the engine
//! again at apply); it does screen a principal's commands against the
//! leader's applied state before they are proposed. It must not import the
//! gateway, the admin server, the cluster service or the node's start-up.

pub mod creates;
mod error;
pub mod fanout;
pub mod keys;
mod reads;
mod router;
mod timeout;
pub mod versions;
pub mod yields;

pub use error::ApiError;
pub use reads::{describe, events, list, read};
pub use router::{submit, submit_as, submit_here};
pub use timeout::{deadline_after, parse_grpc_timeout, MAX_GRPC_TIMEOUT_DIGITS};
pub use versions::require_cluster_version;
