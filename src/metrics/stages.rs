//! Where one job's time goes: `drover_stage_seconds{stage}`.
//!
//! Each stage is timed where it happens, on the node where it happens, so a
//! three-node cluster's figures are the sum of what every node records. A
//! create's acknowledgement is roughly `gateway_forward` (or `leader_call`,
//! when the gateway's own node leads) and, inside it, `leader_queue` then
//! `raft_write`; `raft_write` is the leader's `log_sync`, a `replicate`
//! round trip (the follower's `follower_append`, which holds its own
//! `log_sync`), then `apply`. A pushed job then takes a `push` to its
//! stream's gateway. `drover bench` reads these from every node before and
//! after a workload and prints their quantiles beside its own end-to-end
//! figures.
//!
//! The buckets are finer than other latencies' (100 µs to 10 s), since the
//! question they answer is which millisecond goes where.

use std::sync::OnceLock;
use std::time::Duration;

/// The histogram every stage is recorded in.
pub const STAGE_METRIC: &str = "drover_stage_seconds";

/// Bucket bounds of [`STAGE_METRIC`], in seconds.
pub const STAGE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One timed step of a job's way through the cluster. The discriminants
/// are the positions in [`Stage::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A gateway's forward of a command batch to the partition's leader on
    /// another node, from send to reply.
    GatewayForward,
    /// A gateway's hand-off of a command batch from one of its clients to
    /// the partition leader actor on its own node, from call to reply (a
    /// batch forwarded from another gateway is not counted here).
    LeaderCall,
    /// Commands waiting in the leader actor for a Raft write slot.
    LeaderQueue,
    /// One Raft write on the leader: append, replication to a majority,
    /// commit and apply.
    RaftWrite,
    /// A log append on any replica, from the write to the group sync that
    /// makes it durable.
    LogSync,
    /// An AppendEntries round trip, leader side (heartbeats included).
    Replicate,
    /// An AppendEntries on a follower, from receipt to reply (its log sync
    /// included).
    FollowerAppend,
    /// Applying committed entries to the state machine, on any replica.
    Apply,
    /// A leader's push of activated jobs to a stream's gateway, until the
    /// gateway answered that its clients took them.
    Push,
    /// On a leader, per follower: the oldest entry of an AppendEntries, from
    /// its append to the leader's log to the request's send. A follower
    /// catching up, or an append sent again after a failed exchange, counts
    /// its whole wait (while the entry's time is still kept).
    AppendWait,
    /// The part of [`Stage::AppendWait`] spent behind the exchange before it
    /// to the same follower, still in flight when the entry was appended
    /// (openraft 0.9 keeps one AppendEntries in flight per follower); recorded
    /// only for the appends that had such a wait. More appends in flight
    /// would save at most this.
    AppendBehind,
}

impl Stage {
    pub const ALL: [Stage; 11] = [
        Stage::GatewayForward,
        Stage::LeaderCall,
        Stage::LeaderQueue,
        Stage::RaftWrite,
        Stage::LogSync,
        Stage::Replicate,
        Stage::FollowerAppend,
        Stage::Apply,
        Stage::Push,
        Stage::AppendWait,
        Stage::AppendBehind,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::GatewayForward => "gateway_forward",
            Stage::LeaderCall => "leader_call",
            Stage::LeaderQueue => "leader_queue",
            Stage::RaftWrite => "raft_write",
            Stage::LogSync => "log_sync",
            Stage::Replicate => "replicate",
            Stage::FollowerAppend => "follower_append",
            Stage::Apply => "apply",
            Stage::Push => "push",
            Stage::AppendWait => "append_wait",
            Stage::AppendBehind => "append_behind",
        }
    }
}

/// Records that `stage` took `elapsed`.
pub fn record(stage: Stage, elapsed: Duration) {
    // One handle per stage, made once the recorder is installed: recording
    // is then an atomic add, with no key built or looked up per command.
    static HANDLES: OnceLock<Vec<metrics::Histogram>> = OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        super::recorder();
        Stage::ALL.iter().map(|s| metrics::histogram!(STAGE_METRIC, "stage" => s.as_str())).collect()
    });
    handles[stage as usize].record(elapsed.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_is_at_its_own_position() {
        for (i, stage) in Stage::ALL.iter().enumerate() {
            assert_eq!(*stage as usize, i, "{stage:?}");
        }
    }
}
