//! Partition leadership: the `PartitionLeader` actor.
//!
//! On the node that leads a partition, one [`PartitionLeader`] actor owns the
//! path into Raft: it batches every waiting command into one entry, runs the
//! partition's timers (activation deadlines, back-offs, delayed jobs) by
//! appending ticks stamped with its clock, and pushes activatable jobs to
//! registered streams that serve their tenants and have room for them (as
//! their gateways last said), yielding them when a gateway's clients are
//! certainly not ready after all (never when a push's outcome is unknown:
//! the activation timeout returns those). It remembers which gateway holds each
//! pushed activation, and tells that gateway when the job is completed or
//! failed, through whichever gateway that came.
//! It never touches storage or the engine's state except through Raft writes and
//! read-only looks at [`crate::raft::SharedState`].

mod leader;

pub use leader::{
    now_millis, GatewayLink, LeaderArgs, LeaderMsg, Locality, PartitionLeader, PeerClock, SubmitError, SubmitReply,
    MAX_ENTRY_BYTES,
};
