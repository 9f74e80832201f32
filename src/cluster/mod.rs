//! Node-to-node traffic: the cluster gRPC service (Raft RPCs for every
//! partition, forwarded commands, job-stream registration, pushes, releases
//! and offers of room, status, campaigns), [`Links`], through which a
//! partition leader reaches gateways and a gateway's streams reach partition
//! leaders, [`Deliveries`], the streams that carry a node's pushes and
//! releases to other nodes' gateways and its gateway's forwards to their
//! leaders, and the hand-over of leadership by a stopping node.

mod deliveries;
mod handover;
mod links;
mod service;

pub use deliveries::{Delivered, Deliveries};
pub use handover::{hand_over_leadership, hand_over_to_preferred};
pub use links::{refresh_stream_registrations, register_everywhere, remove_all_everywhere, remove_everywhere, Links};
pub use service::ClusterService;
