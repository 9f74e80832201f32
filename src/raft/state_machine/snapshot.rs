//! The snapshot format: a header (bincode) with the engine's compact state,
//! its live jobs, remembered creates, sessions and schemas and the pruning
//! order, then one frame per final record, streamed between storage and the
//! snapshot file one at a time.
//!
//! A snapshot is a message between nodes too: it is written at the cluster
//! version, so every member reads it. From data version 9 on, the header is
//! followed by the sessions' owners (their own value, so the header's layout
//! stays that of older versions); a partition with owned sessions is
//! snapshotted at version 9 or later whatever a node's view of the cluster
//! version, since owners exist only once every member read version 9. From
//! data version 11 on, the paused queues follow the owners, from 12 on
//! the cron schedules follow them, from 13 on the workflows follow
//! those, and from 14 on the queue limits follow the workflows, under the
//! same rule. At data version 7 and later the header
//! and each frame's record carry the version ([`crate::codec`]); at 6 they are
//! bare bincode, as a build of version 6 wrote and reads them. From data
//! version 10 on, the remembered creates are not in the header but stream
//! after it (and after the owners) from storage, one frame each behind a
//! byte 1, ending at a byte 0: a replica keeps them on disk
//! (`requests`), and neither writing nor installing a snapshot holds them
//! whole. A reader tells
//! them apart by the header's first bytes (the magic cannot begin a version-6
//! header: that begins with a partition id, below 4096).

use std::io::{BufRead, BufWriter, Read, Seek, Write};
use std::sync::Arc;

use openraft::storage::{Snapshot, SnapshotMeta};
use openraft::{BasicNode, RaftSnapshotBuilder, StorageError};
use serde::{Deserialize, Serialize};

use super::{records, sm_write_err, Inner, NodeId, SharedState, TypeConfig};
use crate::core::{
    Deduped, Job, Millis, PartitionState, Registry, RequestId, StateSnapshot, LIMITS, OWNED_SESSIONS, PAUSED_QUEUES,
    PLANS, SCHEDULES, WORKFLOWS,
};
use crate::storage::{self, key, Table};

/// The data version from which snapshots stream their remembered creates
/// instead of carrying them in the header.
pub const REQUESTS_STREAMED: u16 = 10;

/// A snapshot is this header (bincode), then one frame per final record:
/// job key (u64 LE), length (u32 LE), the whole job (its spec and progress
/// joined, as `records` stores them apart). Final records stream between
/// storage and snapshot one at a time, never gathered into a second buffer.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotHeader {
    pub engine: StateSnapshot,
    pub jobs: Vec<Job>,
    /// Remembered creates with their storage ids, before data version 10
    /// ([`REQUESTS_STREAMED`]); empty from it on.
    pub requests: Vec<(u64, RequestId, Deduped)>,
    pub registry: Registry,
    /// The pruning order of the final records: the first one's sequence
    /// number, then (finished at, job key) oldest first.
    pub finished_first: u64,
    pub finished: Vec<(Millis, u64)>,
}

fn push_frame(out: &mut impl Write, job_key: u64, record: &[u8]) -> std::io::Result<()> {
    out.write_all(&job_key.to_le_bytes())?;
    out.write_all(&(record.len() as u32).to_le_bytes())?;
    out.write_all(record)
}

/// The next frame of `input`; `None` at its end.
/// No job record is near this large (records are bounded by the request
/// limit); a frame that claims more is corrupt.
const MAX_FRAME_BYTES: usize = 256 << 20;

pub(super) fn next_frame(input: &mut impl Read) -> Result<Option<(u64, Vec<u8>)>, std::io::Error> {
    let mut head = [0u8; 12];
    let mut filled = 0;
    while filled < head.len() {
        match input.read(&mut head[filled..])? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(std::io::Error::other("snapshot ends inside a job record")),
            n => filled += n,
        }
    }
    let job_key = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::other(format!("a job record in the snapshot claims {len} bytes; it is corrupt")));
    }
    // Read through `take`: the buffer grows with what arrives, so a length
    // that lies costs no more memory than the snapshot holds.
    let mut record = Vec::new();
    input.take(len as u64).read_to_end(&mut record)?;
    if record.len() != len {
        return Err(std::io::Error::other("snapshot ends inside a job record"));
    }
    Ok(Some((job_key, record)))
}

/// Reads a snapshot as a follower installing it would, without storing it:
/// the header, every final record's frame (decoded as a later read would),
/// and the engine restored from them. Returns the records read. The entry
/// point of the snapshot fuzz target.
pub fn check_snapshot(bytes: &[u8]) -> Result<usize, String> {
    check_snapshot_from(&mut { bytes }, bytes.len() as u64)
}

/// [`check_snapshot`] of the snapshot `input` holds (at most `size` bytes),
/// read as it goes: a backup's part is checked without holding it whole.
pub fn check_snapshot_from(input: &mut impl BufRead, size: u64) -> Result<usize, String> {
    let (version, mut body) = read_header(input, size).map_err(|e| e.to_string())?;
    let mut requests = Vec::new();
    read_requests(version, input, &mut body, |id, request, entry| {
        requests.push((id, request, entry));
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let mut records = body.jobs.len();
    while let Some((_, record)) = next_frame(input).map_err(|e| e.to_string())? {
        decode_record(version, &record).map_err(|e| e.to_string())?;
        records += 1;
    }
    PartitionState::restore(body.engine, body.jobs, requests, body.registry);
    Ok(records)
}

/// A snapshot of `state` holding `finished` as its final records, in the
/// format [`check_snapshot`] reads: the fuzz target's seeds.
pub fn snapshot_bytes(state: &PartitionState, finished: &[Job]) -> Vec<u8> {
    let header = SnapshotHeader {
        engine: state.meta(),
        jobs: state.jobs().cloned().collect(),
        requests: Vec::new(),
        registry: Registry::default(),
        finished_first: 0,
        finished: finished.iter().map(|j| (0, j.key.0)).collect(),
    };
    let mut out = storage::encode(&header);
    // This build's version carries the registry's sections after the
    // header (owners, paused queues, schedules, workflows, limits, the
    // cluster plan), then the remembered creates (none).
    out.extend_from_slice(&storage::encode(&header.registry.owners));
    out.extend_from_slice(&storage::encode(&header.registry.paused));
    out.extend_from_slice(&storage::encode(&header.registry.schedules));
    out.extend_from_slice(&storage::encode(&header.registry.workflows));
    out.extend_from_slice(&storage::encode(&header.registry.limits));
    out.extend_from_slice(&storage::encode(&header.registry.plan));
    out.push(0);
    for job in finished {
        let record = storage::encode(job);
        out.extend_from_slice(&job.key.0.to_le_bytes());
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(&record);
    }
    out
}

/// A snapshot's header and the data version it was written at, from
/// `input` holding at most `size` bytes (a corrupt length inside is an error,
/// not an allocation).
pub(super) fn read_header(input: &mut impl BufRead, size: u64) -> Result<(u16, SnapshotHeader), storage::StorageError> {
    let versioned = input.fill_buf()?.starts_with(&crate::codec::header(0)[..2]);
    if versioned {
        let head = input.fill_buf()?;
        let (version, _) =
            crate::codec::split("snapshot header", head.get(..crate::codec::HEADER_LEN).unwrap_or(head))?;
        let mut header: SnapshotHeader = storage::decode_bounded("snapshot header", &mut *input, size)?;
        if version >= OWNED_SESSIONS {
            header.registry.owners = storage::decode_bounded("snapshot's session owners", &mut *input, size)?;
        }
        if version >= PAUSED_QUEUES {
            header.registry.paused = storage::decode_bounded("snapshot's paused queues", &mut *input, size)?;
        }
        if version >= SCHEDULES {
            header.registry.schedules = storage::decode_bounded("snapshot's schedules", &mut *input, size)?;
        }
        if version >= WORKFLOWS {
            header.registry.workflows = storage::decode_bounded("snapshot's workflows", &mut *input, size)?;
        }
        if version >= LIMITS {
            header.registry.limits = storage::decode_bounded("snapshot's queue limits", &mut *input, size)?;
        }
        if version >= PLANS {
            header.registry.plan = storage::decode_bounded("snapshot's cluster plan", input, size)?;
        }
        return Ok((version, header));
    }
    use bincode::Options;
    let header = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(size)
        .deserialize_from(input)
        .map_err(|source| crate::codec::CodecError::Malformed { what: "snapshot header", source })?;
    Ok((crate::codec::OLDEST_VERSION, header))
}

/// Feeds `visit` the remembered creates of a snapshot written at `version`
/// whose header `input` has just given: from the header before data version
/// 10, from `input` after it.
pub(super) fn read_requests(
    version: u16,
    input: &mut impl BufRead,
    header: &mut SnapshotHeader,
    mut visit: impl FnMut(u64, RequestId, Deduped) -> Result<(), storage::StorageError>,
) -> Result<(), storage::StorageError> {
    for (id, request, entry) in std::mem::take(&mut header.requests) {
        visit(id, request, entry)?;
    }
    if version < REQUESTS_STREAMED {
        return Ok(());
    }
    let cut = || std::io::Error::other("the snapshot ends inside its remembered creates");
    loop {
        let mut more = [0u8];
        input.read_exact(&mut more).map_err(|_| cut())?;
        match more[0] {
            0 => return Ok(()),
            1 => {
                let (id, bytes) = next_frame(input)?.ok_or_else(cut)?;
                let (request, entry) = storage::decode("remembered create in the snapshot", &bytes)?;
                visit(id, request, entry)?;
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "the snapshot's remembered creates are corrupt: a frame begins with {other}, not 0 or 1"
                ))
                .into())
            }
        }
    }
}

/// A final record of a snapshot written at `version`.
pub(super) fn decode_record(version: u16, record: &[u8]) -> Result<Job, storage::StorageError> {
    let what = "job record in the snapshot";
    if version >= 7 {
        storage::decode(what, record)
    } else {
        Ok(crate::codec::decode_unversioned(what, record)?)
    }
}

/// `value` as a snapshot written at `version` holds it: behind that
/// version's header, which a build of that version reads.
fn encode_at<T: serde::Serialize>(version: u16, value: &T) -> Vec<u8> {
    if version >= 7 {
        crate::codec::encode_as(version, value)
    } else {
        bincode::serialize(value).expect("in-memory values always serialize")
    }
}

/// An unnamed file in `dir` for a snapshot: gone when closed.
pub(super) fn snapshot_file(dir: &std::path::Path) -> Result<std::fs::File, StorageError<NodeId>> {
    std::fs::create_dir_all(dir).map_err(sm_write_err)?;
    tempfile::tempfile_in(dir).map_err(sm_write_err)
}

pub(super) fn snapshot_meta(inner: &Inner) -> SnapshotMeta<NodeId, BasicNode> {
    let snapshot_id = match inner.last_applied {
        Some(id) => format!("{}-{}", id.leader_id, id.index),
        None => "empty".to_string(),
    };
    SnapshotMeta { last_log_id: inner.last_applied, last_membership: inner.membership.clone(), snapshot_id }
}

/// The header of a snapshot of the state `inner` holds.
pub(super) fn header_of(inner: &Inner) -> SnapshotHeader {
    SnapshotHeader {
        engine: inner.engine.meta(),
        jobs: inner.engine.jobs().cloned().collect(),
        requests: Vec::new(),
        registry: inner.engine.registry(),
        finished_first: inner.finished.first,
        finished: inner.finished.order.iter().map(|f| (f.at, f.job.0)).collect(),
    }
}

/// Writes a snapshot of `partition` to `out` at data `version`: `header`,
/// the remembered creates and one frame per final record `view` holds.
/// Returns the records written.
pub(super) fn write_snapshot(
    partition: crate::core::PartitionId,
    mut header: SnapshotHeader,
    view: &storage::PointInTime<'_>,
    version: u16,
    out: &mut impl Write,
) -> Result<u64, storage::StorageError> {
    let version = if header.registry.owners.is_empty() { version } else { version.max(OWNED_SESSIONS) };
    let version = if header.registry.paused.is_empty() { version } else { version.max(PAUSED_QUEUES) };
    let version = if header.registry.schedules.is_empty() { version } else { version.max(SCHEDULES) };
    let version = if header.registry.workflows.is_empty() { version } else { version.max(WORKFLOWS) };
    let version = if header.registry.limits.is_empty() { version } else { version.max(LIMITS) };
    let version = if header.registry.plan.is_none() { version } else { version.max(PLANS) };
    let each_request = |visit: &mut dyn FnMut(u64, RequestId, Deduped) -> Result<(), storage::StorageError>| {
        view.for_each(Table::Requests, partition, |id, bytes| {
            let (request, entry) = storage::decode("request entry", bytes)?;
            visit(id, request, entry)
        })
    };
    if version < REQUESTS_STREAMED {
        // A build before version 10 reads them from the header only.
        each_request(&mut |id, request, entry| {
            header.requests.push((id, request, entry));
            Ok(())
        })?;
    }
    out.write_all(&encode_at(version, &header))?;
    if version >= OWNED_SESSIONS {
        out.write_all(&encode_at(version, &header.registry.owners))?;
    }
    if version >= PAUSED_QUEUES {
        out.write_all(&encode_at(version, &header.registry.paused))?;
    }
    if version >= SCHEDULES {
        out.write_all(&encode_at(version, &header.registry.schedules))?;
    }
    if version >= WORKFLOWS {
        out.write_all(&encode_at(version, &header.registry.workflows))?;
    }
    if version >= LIMITS {
        out.write_all(&encode_at(version, &header.registry.limits))?;
    }
    if version >= PLANS {
        out.write_all(&encode_at(version, &header.registry.plan))?;
    }
    if version >= REQUESTS_STREAMED {
        each_request(&mut |id, request, entry| {
            out.write_all(&[1])?;
            Ok(push_frame(out, id, &encode_at(version, &(request, entry)))?)
        })?;
        out.write_all(&[0])?;
    }
    let mut records = header.jobs.len() as u64;
    drop(header);
    // A frame carries the whole job, its spec and progress joined.
    view.for_each(Table::Done, partition, |job_key, progress| {
        let spec = records::decode_spec(job_key, view.get(Table::Specs, key(partition, job_key))?)?;
        let job = records::decode_progress(spec, progress)?;
        records += 1;
        Ok(push_frame(out, job_key, &encode_at(version, &job))?)
    })?;
    Ok(records)
}

impl SharedState {
    /// Serialises the state as of now, at data `version`: the live jobs,
    /// counters and pruning order under the lock apply holds, then the final
    /// records from a point-in-time view taken under the same lock, without
    /// blocking apply.
    pub(super) fn snapshot(&self, version: u16) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let (header, meta, view) = {
            let inner = self.lock();
            if inner.last_applied.is_none() {
                return Ok(None);
            }
            (header_of(&inner), snapshot_meta(&inner), self.store.point_in_time())
        };
        let mut out = BufWriter::with_capacity(1 << 20, snapshot_file(&self.snapshot_dir)?);
        write_snapshot(self.partition, header, &view, version, &mut out).map_err(sm_write_err)?;
        let mut file = out.into_inner().map_err(|e| sm_write_err(e.into_error()))?;
        file.rewind().map_err(sm_write_err)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) }))
    }
}

pub struct SnapshotBuilder {
    pub(super) shared: Arc<SharedState>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    /// Marks the applied index as snapshotted so openraft may purge the log
    /// behind it. Everything a snapshot holds is already in storage, so
    /// nothing is copied here; the data is made when a follower needs it
    /// ([`RaftStateMachine::get_current_snapshot`]). openraft keeps only the
    /// meta of what this returns.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let meta = snapshot_meta(&self.shared.lock());
        metrics::counter!("drover_raft_snapshots_built_total", "partition" => self.shared.partition.to_string())
            .increment(1);
        let empty = tokio::fs::File::from_std(snapshot_file(&self.shared.snapshot_dir)?);
        Ok(Snapshot { meta, snapshot: Box::new(empty) })
    }
}
