//! Drover: a clustered job broker.
//!
//! Producers create jobs; workers receive them (pushed over a gRPC stream, or by
//! long polling), do the work and complete or fail them. Job state is split into
//! partitions, each a Raft group over RocksDB, so an acknowledged job survives
//! the loss of a minority of nodes.
//!
//! With `default-features = false` this crate is only the gRPC contract
//! ([`proto`]) and the client/worker library ([`client`]), without RocksDB,
//! openraft or any server part.

pub mod calendar;
pub mod client;
pub mod placement;
pub mod proto;
#[cfg(feature = "otel")]
pub mod trace_context;

#[cfg(feature = "server")]
pub mod admin;
#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "server")]
pub mod backup;
#[cfg(feature = "server")]
pub mod bench;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod codec;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod context;
#[cfg(feature = "server")]
pub mod core;
#[cfg(feature = "server")]
pub mod failpoints;
#[cfg(feature = "server")]
pub mod gateway;
#[cfg(feature = "server")]
pub mod leaders;
#[cfg(feature = "server")]
pub mod memory;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod node;
#[cfg(feature = "server")]
pub mod outbox;
#[cfg(feature = "server")]
pub mod partition;
#[cfg(feature = "server")]
pub mod raft;
#[cfg(feature = "server")]
pub mod storage;
#[cfg(feature = "server")]
pub mod streams;
#[cfg(feature = "server")]
pub mod tasks;
#[cfg(feature = "server")]
pub mod telemetry;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
pub mod transport;
