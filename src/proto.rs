//! Code generated from `proto/` (see `build.rs`).

/// The client-facing API, `drover.v1`.
pub mod gateway {
    tonic::include_proto!("drover.v1");
}

/// Node-to-node traffic, `drover.cluster.v1`. Not a client API.
pub mod cluster {
    tonic::include_proto!("drover.cluster.v1");
}

/// Zeebe's job-worker API, `gateway_protocol` (served beside `drover.v1` on
/// the same port; see `gateway::zeebe`). Its comments are Zeebe's, as
/// published, not written for rustdoc.
#[allow(clippy::all, rustdoc::all)]
pub mod zeebe {
    tonic::include_proto!("gateway_protocol");
}

/// Every contract above as an encoded `FileDescriptorSet`: what the services
/// and their RPCs are, for tests that walk each RPC a port serves.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
