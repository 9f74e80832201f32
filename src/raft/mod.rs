//! The only module that names openraft types.
//!
//! Every partition is one openraft group. This module owns the type config, the
//! log store and state machine over [`crate::storage`], the network that carries
//! Raft RPCs over the cluster gRPC service, and [`Replica`]: one partition's Raft
//! handle plus the state the rest of the node may read. Everything outside sees
//! Drover's own types: [`Replica::write`], [`ReplicaStatus`], [`WriteError`].
//!
//! A group is formed (`initialize`) only on the cluster's first start, and a
//! node whose data directory was wiped joins its groups without forming them:
//! see [`formation`] for the rules and why.

// openraft's storage traits dictate `StorageError` as the error type; its size
// is not ours to change.
#![allow(clippy::result_large_err)]

mod formation;
mod leadership;
mod log_store;
mod membership;
mod network;
mod records;
mod state_machine;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::AppendEntriesRequest;
use openraft::{BasicNode, Config, LogId, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use crate::transport::PeerChannels;
use formation::CatchUp;
pub use formation::Formation;
pub use log_store::has_raft_state;
pub use membership::GroupMembers;
pub use network::ClusterNetwork;
pub use state_machine::backup::{check_id as check_backup_id, PartitionBackup};
pub use state_machine::backup::{
    clear_staged as clear_staged_backups, expire_staged as expire_staged_backups,
    release_staged as release_staged_backup, staged_chunks,
};
pub use state_machine::events::{EventsPage, ReadEvent, StoredEvent};
pub use state_machine::{check_snapshot, check_snapshot_from, restore, snapshot_bytes, SharedState};

use crate::core::{Batch, CommandResult, Millis, Outcome, PartitionId};
use crate::storage::Store;

pub use crate::core::NodeId;

/// What applying one Raft entry produced, returned to the writer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchResponse {
    pub results: Vec<CommandResult>,
    /// Job types that gained activatable jobs.
    pub available: Vec<String>,
    /// When the partition's next timer fires, after this entry.
    pub next_timer: Option<Millis>,
    /// Jobs per (type, outcome) in this entry, for the leader's metrics.
    pub outcomes: Vec<(String, Outcome, u64)>,
    /// Creation to activation (ms) of each job activated in this entry.
    pub created_to_activated: Vec<Millis>,
    /// Activation to completion (ms) of each job completed in this entry.
    pub activated_to_completed: Vec<Millis>,
    /// (job type, stage) of each checkpoint committed in this entry.
    pub checkpoints: Vec<(String, String)>,
    /// (job type, reason, worker) of each failure recorded in this entry.
    pub failures: Vec<(String, crate::core::FailReason, String)>,
    /// (kind, created or how it ended) of each workflow made or ended here.
    pub workflows: Vec<(String, String)>,
}

openraft::declare_raft_types!(
    /// Drover's openraft configuration: entries are command batches.
    pub TypeConfig:
        D = Batch,
        R = BatchResponse,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = tokio::fs::File,
);

/// Tunables for every partition's group.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    /// Log entries applied since the last snapshot that trigger a new one.
    pub snapshot_every: u64,
    /// Entries kept behind a snapshot for followers that are only a little behind.
    pub keep_after_snapshot: u64,
    /// Where snapshots being sent or received are spooled (unnamed files).
    pub snapshot_dir: std::path::PathBuf,
}

impl RaftSettings {
    /// Timing for links between regions (`--network-profile wan`). A follower
    /// has one heartbeat to answer an append, so the heartbeat covers a
    /// 150 ms round trip plus a loaded follower's sync and a full append's
    /// transfer (500 ms); the election timeout is five heartbeats, so a
    /// leader is deposed only after several in a row went missing, never by
    /// one slow round trip or a burst of jitter.
    pub fn wan() -> Self {
        RaftSettings {
            heartbeat_interval: Duration::from_millis(500),
            election_timeout_min: Duration::from_millis(2_500),
            ..RaftSettings::default()
        }
    }
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            // openraft also gives every AppendEntries one heartbeat interval
            // to answer, follower sync included: below the worst round trip,
            // nothing commits at all.
            heartbeat_interval: Duration::from_millis(250),
            election_timeout_min: Duration::from_millis(600),
            snapshot_every: 20_000,
            keep_after_snapshot: 5_000,
            snapshot_dir: std::env::temp_dir(),
        }
    }
}

/// Why a write did not commit.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("this node does not lead partition {partition}")]
    NotLeader { partition: PartitionId, leader: Option<NodeId> },
    #[error("partition {partition} is shutting down or failed: {message}")]
    Stopped { partition: PartitionId, message: String },
}

/// One partition's Raft role and progress, as this node sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub partition: PartitionId,
    pub role: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub members: Vec<NodeId>,
    /// A leader no majority has answered for longer than an election
    /// timeout: it takes no requests ([`Replica::cut_off`]).
    pub cut_off: bool,
}

/// The leadership facts other modules act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub is_leader: bool,
    pub leader: Option<NodeId>,
    pub term: u64,
}

/// One partition's replica on this node.
pub struct Replica {
    pub partition: PartitionId,
    node_id: NodeId,
    raft: Raft<TypeConfig>,
    shared: Arc<SharedState>,
    /// Set while this replica is joining: it grants no votes until caught up.
    catch_up: Option<CatchUp>,
    started: std::time::Instant,
    /// How long a leader may go without a majority's acknowledgement before
    /// it counts as cut off ([`Replica::cut_off`]).
    quorum_lost_after: Duration,
    /// What every member reads, so a leader writes only what they decode.
    versions: Arc<crate::transport::Versions>,
}

impl Replica {
    /// Opens the partition's log and state from storage and starts its group.
    /// A group with no Raft state here is formed from `members` only when
    /// `formation` is [`Formation::New`]; see [`formation`].
    pub async fn start(
        partition: PartitionId,
        node_id: NodeId,
        members: &BTreeMap<NodeId, String>,
        store: Arc<Store>,
        peers: PeerChannels,
        settings: &RaftSettings,
        formation: Formation,
    ) -> anyhow::Result<Arc<Replica>> {
        let config = Config {
            cluster_name: format!("drover-partition-{partition}"),
            heartbeat_interval: settings.heartbeat_interval.as_millis() as u64,
            election_timeout_min: settings.election_timeout_min.as_millis() as u64,
            election_timeout_max: settings.election_timeout_min.as_millis() as u64 * 2,
            install_snapshot_timeout: 10_000,
            // At most; the log store cuts an append by bytes as well, and the
            // network asks for fewer entries when an append would not fit
            // one message.
            max_payload_entries: 16,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(settings.snapshot_every),
            max_in_snapshot_log_to_keep: settings.keep_after_snapshot,
            purge_batch_size: 256,
            ..Default::default()
        };
        let config = Arc::new(config.validate()?);
        let log = log_store::LogStore::new(partition, Arc::clone(&store), peers.max_message_bytes());
        let versions = Arc::clone(peers.versions());
        let (state_machine, shared) = state_machine::StateMachine::open(
            partition,
            store,
            settings.snapshot_dir.clone(),
            Arc::clone(peers.versions()),
        )?;
        let network = ClusterNetwork::new(partition, peers, log.append_times());
        let raft = Raft::new(node_id, config, network, log, state_machine).await?;
        // A vote or any log entry (or a purge point) is Raft state.
        let has_raft_state = raft.is_initialized().await?;
        if !has_raft_state {
            match formation {
                Formation::New => {
                    let nodes: BTreeMap<NodeId, BasicNode> =
                        members.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
                    if let Err(e) = raft.initialize(nodes).await {
                        bail!("forming partition {partition}: {e}");
                    }
                }
                // Its leader copies the group here.
                Formation::Joining if members.len() > 1 => {}
                Formation::Joining => {
                    raft.shutdown().await.ok();
                    bail!(
                        "partition {partition} has no replica but this node's, so a joining node (one started \
                         with --join-existing on an empty data directory) has nothing to copy it from. To form a \
                         new cluster instead, start on an empty data directory without --join-existing."
                    );
                }
                Formation::Formed => {
                    raft.shutdown().await.ok();
                    bail!(
                        "this node formed or joined partition {partition} before, but its Raft state (vote and \
                         log) is not in the database: storage lost data. The group is not formed again, which \
                         would forget what this node promised its peers. Re-seed this node from its peers \
                         (docs/operations.md, \"Re-seeding a node\")."
                    );
                }
            }
        }
        // With no other replica there is no leader to catch up with.
        let catch_up = (formation == Formation::Joining && members.len() > 1).then(CatchUp::new);
        Ok(Arc::new(Replica {
            partition,
            node_id,
            raft,
            shared,
            catch_up,
            started: std::time::Instant::now(),
            // The followers elect another leader after at most twice the
            // minimum election timeout without hearing from this one.
            quorum_lost_after: settings.election_timeout_min * 2,
            versions,
        }))
    }

    /// Waits until this replica may vote: at once unless it is joining, else
    /// until it has applied what the first leader it heard from had committed
    /// (see [`formation`]). False if the group stopped first.
    pub async fn caught_up(&self) -> bool {
        let Some(catch_up) = &self.catch_up else { return true };
        let mut target = catch_up.subscribe();
        let mut metrics = self.raft.metrics();
        loop {
            target.borrow_and_update();
            if catch_up.caught_up(applied_count(&metrics.borrow_and_update())) {
                return true;
            }
            let changed = tokio::select! {
                changed = target.changed() => changed,
                changed = metrics.changed() => changed,
            };
            if changed.is_err() {
                return false;
            }
        }
    }

    /// Whether this replica may grant a vote now.
    fn may_vote(&self) -> bool {
        self.catch_up.as_ref().is_none_or(|c| c.caught_up(applied_count(&self.raft.metrics().borrow())))
    }

    /// Replicates one batch and returns what applying it produced. Resolves only
    /// once the entry is committed on a majority and applied here.
    pub async fn write(&self, batch: Batch) -> Result<BatchResponse, WriteError> {
        match self.raft.client_write(batch).await {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(WriteError::NotLeader { partition: self.partition, leader: forward.leader_id })
            }
            Err(e) => Err(WriteError::Stopped { partition: self.partition, message: e.to_string() }),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The data version every member of the cluster reads (see
    /// `docs/upgrades.md`): a leader's own commands newer than it are not
    /// written.
    pub fn cluster_version(&self) -> u16 {
        self.versions.cluster_version()
    }

    /// How long this replica's group has run in this process.
    pub fn running_for(&self) -> Duration {
        self.started.elapsed()
    }

    /// State shared with the state machine: read-only access for leaders and reads.
    pub fn state(&self) -> &Arc<SharedState> {
        &self.shared
    }

    /// This replica's staged part of backup `id`, once staged; waits until
    /// `until`, `None` when it is not there by then.
    pub async fn staged_backup(
        &self,
        id: &str,
        until: std::time::Instant,
    ) -> std::io::Result<Option<(PartitionBackup, std::fs::File)>> {
        state_machine::backup::open_staged(self.shared.snapshot_dir(), id, self.partition, until).await
    }

    pub fn leadership(&self) -> Leadership {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        Leadership {
            is_leader: m.state == ServerState::Leader && m.current_leader == Some(self.node_id),
            leader: m.current_leader,
            term: m.current_term,
        }
    }

    /// Whether this replica leads now, confirmed by a majority's answers
    /// to a heartbeat round (no log entry, no fsync), and has applied
    /// everything committed by then (openraft's read index): a read of its
    /// state after it sees every write acknowledged before the call, as an
    /// entry would. False when it does not lead, a majority does not answer
    /// by `until`, or the replica stops.
    pub async fn confirm_leading(&self, until: std::time::Instant) -> bool {
        let within = until.saturating_duration_since(std::time::Instant::now());
        matches!(tokio::time::timeout(within, self.raft.ensure_linearizable()).await, Ok(Ok(_)))
    }

    /// Changes of this replica's vote, role, leader or membership. Not of
    /// its log: openraft's full metrics change with every loop of its core
    /// (every append, sync, acknowledgement and apply), and a loop that woke
    /// on each did its work several times per entry on every node.
    pub fn watch(&self) -> watch::Receiver<openraft::metrics::RaftServerMetrics<NodeId, BasicNode>> {
        self.raft.server_metrics()
    }

    /// Changes of this replica's log and what it applied (and, on a leader,
    /// its quorum's acknowledgements): for a rare wait on an apply, never a
    /// loop that runs on every change.
    pub fn applying(&self) -> watch::Receiver<openraft::metrics::RaftDataMetrics<NodeId>> {
        self.raft.data_metrics()
    }

    pub fn status(&self) -> ReplicaStatus {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        let applied = m.last_applied.map(|l| l.index).unwrap_or(0);
        ReplicaStatus {
            partition: self.partition,
            role: role.into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            // openraft publishes no commit index to metrics; applied trails it by
            // at most the entries in flight, and a leader's committed entries are
            // applied before clients hear of them.
            commit_index: applied,
            applied_index: applied,
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            members: m.membership_config.membership().voter_ids().collect(),
            cut_off: Self::is_cut_off(&m, self.quorum_lost_after),
        }
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(partition = self.partition, "raft shutdown: {e}");
        }
    }

    /// Handles an incoming Raft RPC for this group (bincode in, bincode out).
    pub async fn handle_rpc(&self, kind: RpcKind, payload: &[u8]) -> Result<Vec<u8>, String> {
        fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
            bincode::deserialize(payload).map_err(|e| format!("malformed raft request: {e}"))
        }
        let started = std::time::Instant::now();
        let encoded = match kind {
            RpcKind::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> = decode(payload)?;
                if let Some(catch_up) = &self.catch_up {
                    catch_up.heard_from_leader(count(request.leader_commit));
                }
                bincode::serialize(&self.raft.append_entries(request).await)
            }
            RpcKind::Vote if !self.may_vote() => {
                return Err(format!(
                    "node {} is re-seeding partition {} and votes once it has caught up with a leader",
                    self.node_id, self.partition
                ));
            }
            RpcKind::Vote => bincode::serialize(&self.raft.vote(decode(payload)?).await),
            RpcKind::InstallSnapshot => bincode::serialize(&self.raft.install_snapshot(decode(payload)?).await),
        };
        metrics::histogram!("drover_raft_rpc_handled_seconds", "rpc" => kind.as_str())
            .record(started.elapsed().as_secs_f64());
        if kind == RpcKind::AppendEntries {
            crate::metrics::stages::record(crate::metrics::stages::Stage::FollowerAppend, started.elapsed());
        }
        encoded.map_err(|e| format!("encode raft reply: {e}"))
    }
}

/// Entries up to and including `log_id`: its index + 1, or 0 for none.
fn count(log_id: Option<LogId<NodeId>>) -> u64 {
    log_id.map_or(0, |l| l.index + 1)
}

fn applied_count(metrics: &RaftMetrics<NodeId, BasicNode>) -> u64 {
    count(metrics.last_applied)
}

/// The three Raft RPCs carried by the cluster service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcKind {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl RpcKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RpcKind::AppendEntries => "append_entries",
            RpcKind::Vote => "vote",
            RpcKind::InstallSnapshot => "install_snapshot",
        }
    }
}
