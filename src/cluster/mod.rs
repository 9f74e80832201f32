//! Node-to-node traffic: the cluster gRPC service (Raft RPCs for every
//! partition, forwarded commands, job-stream registration, pushes, releases
//! and offers of room, status, campaigns), [`Links`], through which a
//! partition leader reaches gateways and a gateway's streams reach partition
//! leaders, the hand-over of leadership by a stopping node, and what a node
//! hears of the times of partitions it hosts no replica of. The channels
//! and delivery streams these travel on are [`crate::transport`]'s.

mod clocks;
mod handover;
mod links;
mod service;

pub use clocks::learn_partition_clocks;
pub use handover::{hand_over_leadership, hand_over_to_preferred};
pub use links::{refresh_stream_registrations, register_everywhere, remove_all_everywhere, remove_everywhere, Links};
pub use service::ClusterService;
