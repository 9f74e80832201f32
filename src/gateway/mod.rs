//! The client-facing API: one call layer, one typed job API, and the
//! protocols that are adapters over it.
//!
//! A gateway owns no job state. It validates input (so nothing malformed is
//! replicated) and sends commands through [`crate::leaders`] to the
//! partitions' leaders wherever they run.
//!
//! The layers, top down (`tests/architecture.rs` holds them):
//! - the adapters: [`v1`] (`drover.v1.Gateway`), [`zeebe`] (Zeebe's
//!   job-worker RPCs), [`ojs`] (the Open Job Spec's HTTP binding), and the
//!   console in [`crate::admin`]. They translate their protocol and call
//!   the job API; they name nothing of the gateway but [`api`] and [`call`].
//! - [`api`]: the typed job API, the one door: it authorizes each request's
//!   body (job types, tenants) and sends the commands it builds.
//! - [`call`]: what every request on every port gets before its handler
//!   runs (authentication, admission, the deadline, the in-flight count, the
//!   trace); [`observe`] counts gRPC requests by method and code.
//!
//! It must not import the admin server, the cluster service or the node's
//! start-up.

pub mod api;
pub mod call;
mod observe;
pub mod ojs;
pub mod v1;
pub mod zeebe;

pub use api::{cluster_status, cluster_status_json, ApiError, JobApi};
pub use call::{Call, CallLayer};
pub use observe::Observe;
pub use v1::GatewayService;
pub use zeebe::ZeebeService;
