//! Code generated from `proto/` (see `build.rs`).

/// The client-facing API, `drover.v1`.
pub mod gateway {
    tonic::include_proto!("drover.v1");
}

/// Node-to-node traffic, `drover.cluster.v1`. Not a client API.
pub mod cluster {
    tonic::include_proto!("drover.cluster.v1");
}
