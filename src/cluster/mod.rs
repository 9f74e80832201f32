//! Node-to-node traffic: the cluster gRPC service (Raft RPCs for every
//! partition, forwarded commands, job-stream registration, pushes and
//! releases, status) and [`Links`], through which a partition leader reaches
//! gateways.

mod links;
mod service;

pub use links::{refresh_stream_registrations, register_everywhere, remove_all_everywhere, remove_everywhere, Links};
pub use service::ClusterService;
