//! The job API's backups (scope `cluster:admin`, tenant `*`): marking a cut in every
//! partition's log, reading each partition's staged part from a replica
//! that holds it, and releasing the staged parts. Where the parts go (a
//! directory, an object store) is the caller's business (`drover backup`).

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::CLUSTER_ADMIN;
use crate::core::{Command, CommandResult, PartitionId};
use crate::leaders::fanout::everywhere;
use crate::proto::cluster::{ReadStagedBackupRequest, ReleaseStagedBackupRequest};
use crate::proto::gateway as pb;
use crate::raft::PartitionBackup;

/// A backup part's bytes per message.
const CHUNK_BYTES: usize = 1 << 20;

pub type Chunks = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, ApiError>> + Send>>;

/// A backup holds every tenant's jobs: taking, reading or releasing one
/// needs `cluster:admin` and tenant `*`.
fn may_back_up(call: &Call) -> Result<(), ApiError> {
    call.principal.require(CLUSTER_ADMIN)?;
    call.principal.require_tenant("*")?;
    Ok(())
}

fn check_id(id: &str) -> Result<(), ApiError> {
    crate::raft::check_backup_id(id).map_err(ApiError::InvalidArgument)
}

fn part_of(part: &PartitionBackup) -> pb::BackupPart {
    pb::BackupPart {
        partition_id: part.partition,
        term: part.term,
        leader: part.leader,
        index: part.index,
        bytes: part.bytes,
        sha256: part.sha256.clone(),
        records: part.records,
        data_version: u32::from(part.data_version),
    }
}

impl JobApi {
    /// Marks backup `backup_id`'s cut in every partition's log: every job
    /// acknowledged before this call is in the backup. Each replica stages
    /// its partition's state as of the mark.
    pub async fn start_backup(
        &self,
        call: &Call,
        request: pb::StartBackupRequest,
    ) -> Result<pb::StartBackupResponse, ApiError> {
        may_back_up(call)?;
        check_id(&request.backup_id)?;
        let versions = self.ctx.transport.peers.versions();
        crate::auth::audit(&call.principal, "start_backup", serde_json::json!({ "backup": request.backup_id }));
        let id = request.backup_id;
        let mut marks = Vec::new();
        let results = everywhere(&self.ctx, |_| Command::BackupMark { id: id.clone() }, call.deadline).await;
        for (partition, result) in results.into_iter().enumerate() {
            match result? {
                CommandResult::BackupMarked { term, leader, index } => marks.push(pb::BackupPart {
                    partition_id: partition as PartitionId,
                    term,
                    leader,
                    index,
                    ..Default::default()
                }),
                other => return Err(ApiError::Internal(format!("unexpected answer to a backup mark: {other:?}"))),
            }
        }
        tracing::info!(backup = %id, partitions = marks.len(), "backup marked in every partition");
        let topology = &self.ctx.topology;
        Ok(pb::StartBackupResponse {
            marks,
            partitions_count: topology.partition_count(),
            replication_factor: topology.replication_factor,
            cluster_size: topology.cluster_size(),
            cluster_version: u32::from(versions.cluster_version()),
            formed_partitions: topology.formed_partitions,
        })
    }

    /// One partition's staged part of a backup, in chunks, from this node's
    /// replica or another's; the last chunk describes the part.
    pub async fn read_backup(&self, call: &Call, request: pb::ReadBackupRequest) -> Result<Chunks, ApiError> {
        may_back_up(call)?;
        check_id(&request.backup_id)?;
        let partition = request.partition_id;
        if partition >= self.ctx.topology.partition_count() {
            return Err(ApiError::NotFound(format!("no partition {partition}")));
        }
        if let Some(replica) = self.ctx.routing.replica(partition) {
            if let Some((part, file)) = replica.staged_backup(&request.backup_id, call.deadline).await? {
                return Ok(local_chunks(part, file));
            }
        }
        let mut missing = Vec::new();
        let wait = call.deadline.saturating_duration_since(Instant::now());
        for node in self.ctx.topology.replica_nodes(partition) {
            if node == self.ctx.topology.node_id {
                continue;
            }
            let Some(mut client) = self.ctx.transport.peers.client(node) else { continue };
            let mut asked = tonic::Request::new(ReadStagedBackupRequest {
                backup_id: request.backup_id.clone(),
                partition_id: partition,
                wait_ms: wait.as_millis() as u64,
            });
            asked.set_timeout(wait + Duration::from_secs(30));
            match client.read_staged_backup(asked).await {
                Ok(stream) => return Ok(remote_chunks(stream.into_inner())),
                Err(status) => missing.push(format!("node {node}: {}", status.message())),
            }
        }
        Err(ApiError::NotFound(format!(
            "no replica of partition {partition} has staged backup {:?} ({}); was it started, or released?",
            request.backup_id,
            if missing.is_empty() { "none answered".to_string() } else { missing.join("; ") }
        )))
    }

    /// Deletes the staged parts of a backup on every node.
    pub async fn release_backup(&self, call: &Call, request: pb::ReleaseBackupRequest) -> Result<(), ApiError> {
        may_back_up(call)?;
        check_id(&request.backup_id)?;
        crate::raft::release_staged_backup(&self.ctx.settings.snapshot_dir, &request.backup_id)
            .map_err(|e| ApiError::Internal(format!("deleting the staged backup here: {e}")))?;
        let mut failed = Vec::new();
        for node in self.ctx.topology.peers() {
            let Some(mut client) = self.ctx.transport.peers.client(node) else { continue };
            let mut release = tonic::Request::new(ReleaseStagedBackupRequest { backup_id: request.backup_id.clone() });
            release.set_timeout(call.deadline.saturating_duration_since(Instant::now()));
            if let Err(status) = client.release_staged_backup(release).await {
                failed.push(format!("node {node}: {}", status.message()));
            }
        }
        if !failed.is_empty() {
            return Err(ApiError::Unavailable(format!(
                "the staged parts were deleted here, but not on {} (a node's start deletes them too); retry",
                failed.join("; ")
            )));
        }
        Ok(())
    }
}

/// A staged part read from this node's disk; the last chunk carries the
/// part's description.
fn local_chunks(part: PartitionBackup, file: std::fs::File) -> Chunks {
    let described = pb::BackupChunk { part: Some(part_of(&part)), ..Default::default() };
    Box::pin(crate::raft::staged_chunks(file, CHUNK_BYTES).map(move |chunk| {
        let (data, last) = chunk.map_err(|e| ApiError::Internal(format!("reading the staged part: {e}")))?;
        Ok(pb::BackupChunk { data, part: if last { described.part.clone() } else { None } })
    }))
}

/// A staged part streamed from another node.
fn remote_chunks(stream: tonic::Streaming<crate::proto::cluster::StagedBackupChunk>) -> Chunks {
    Box::pin(stream.map(|chunk| {
        let chunk = chunk.map_err(|status| ApiError::from_code(status.code() as i32, status.message().to_string()))?;
        let part = if chunk.part.is_empty() {
            None
        } else {
            let part: PartitionBackup = serde_json::from_str(&chunk.part)
                .map_err(|e| ApiError::Internal(format!("a peer described a backup part as {e}")))?;
            Some(part_of(&part))
        };
        Ok(pb::BackupChunk { data: chunk.data.into(), part })
    }))
}

impl From<std::io::Error> for ApiError {
    fn from(e: std::io::Error) -> Self {
        ApiError::Internal(format!("reading a staged backup: {e}"))
    }
}
