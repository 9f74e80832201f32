//! A partition's state machine: the pure engine, persisted write-through.
//!
//! Applying entries runs [`PartitionState::apply`] and writes every changed job
//! record, the applied log id and the membership in one unsynced RocksDB batch
//! (see [`crate::storage`] for why that is safe). Snapshots carry every record,
//! live and final, so a follower that installs one answers `GetJob` like the rest.

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::{BatchResponse, NodeId, TypeConfig};
use crate::core::{Job, JobKey, PartitionId, PartitionState, StateSnapshot};
use crate::storage::{self, key, meta_key, Store, Table};

const APPLIED: &str = "applied";

/// What is persisted beside the records after every apply.
#[derive(Serialize, Deserialize)]
struct AppliedMeta {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    engine: StateSnapshot,
}

#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    engine: StateSnapshot,
    jobs: Vec<Job>,
    /// Final records as stored (bincode of `Job`), copied without decoding.
    done: Vec<(u64, serde_bytes_vec::Bytes)>,
}

/// Raw bytes that serialize as one length-prefixed blob.
mod serde_bytes_vec {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Bytes(#[serde(with = "bytes_as_seq")] pub Vec<u8>);

    mod bytes_as_seq {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            <Vec<u8> as serde::Deserialize>::deserialize(d)
        }
    }
}

struct Inner {
    engine: PartitionState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

/// The partition's state, shared between the Raft state machine (the only
/// writer) and readers on this node: `GetJob`, the leader's push decisions,
/// metrics. Lock holds are short and never span an await.
pub struct SharedState {
    partition: PartitionId,
    store: Arc<Store>,
    inner: Mutex<Inner>,
}

impl SharedState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("state machine lock poisoned")
    }

    /// Reads the engine state.
    pub fn read<R>(&self, f: impl FnOnce(&PartitionState) -> R) -> R {
        f(&self.lock().engine)
    }

    /// A job's record, live or final.
    pub fn lookup(&self, job: JobKey) -> Result<Option<Job>, storage::StorageError> {
        if let Some(live) = self.lock().engine.job(job).cloned() {
            return Ok(Some(live));
        }
        match self.store.get(Table::Done, key(self.partition, job.0))? {
            Some(bytes) => Ok(Some(storage::decode("job record", &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every job this replica holds, live and final (for fault-test
    /// verification and operators; reads the whole partition).
    pub fn all_jobs(&self) -> Result<Vec<Job>, storage::StorageError> {
        let inner = self.lock();
        let mut jobs: Vec<Job> = inner.engine.jobs().cloned().collect();
        self.store.for_each(Table::Done, self.partition, |_, bytes| {
            jobs.push(storage::decode::<Job>("job record", bytes)?);
            Ok(())
        })?;
        Ok(jobs)
    }
}

pub struct StateMachine {
    partition: PartitionId,
    store: Arc<Store>,
    shared: Arc<SharedState>,
}

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(&e).into()
}

fn sm_write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&e).into()
}

impl StateMachine {
    /// Loads the partition's applied state and live jobs from storage.
    pub fn open(partition: PartitionId, store: Arc<Store>) -> anyhow::Result<(StateMachine, Arc<SharedState>)> {
        let meta: Option<AppliedMeta> = store
            .get(Table::Meta, meta_key(partition, APPLIED))?
            .map(|b| storage::decode("applied state", &b))
            .transpose()?;
        let mut jobs = Vec::new();
        store.for_each(Table::Jobs, partition, |_, bytes| {
            jobs.push(storage::decode::<Job>("job record", bytes)?);
            Ok(())
        })?;
        let inner = match meta {
            Some(meta) => Inner {
                engine: PartitionState::restore(meta.engine, jobs),
                last_applied: meta.last_applied,
                membership: meta.membership,
            },
            None => Inner {
                engine: PartitionState::new(partition),
                last_applied: None,
                membership: StoredMembership::default(),
            },
        };
        let shared = Arc::new(SharedState { partition, store: Arc::clone(&store), inner: Mutex::new(inner) });
        Ok((StateMachine { partition, store, shared: Arc::clone(&shared) }, shared))
    }

    fn persist_meta(&self, batch: &mut storage::Batch<'_>, inner: &Inner) {
        let meta = AppliedMeta {
            last_applied: inner.last_applied,
            membership: inner.membership.clone(),
            engine: inner.engine.meta(),
        };
        batch.put(Table::Meta, meta_key(self.partition, APPLIED), storage::encode(&meta));
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>> {
        let inner = self.shared.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut responses = Vec::new();
        let mut batch = self.store.batch();
        let mut inner = self.shared.lock();
        let mut touched = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(BatchResponse::default()),
                EntryPayload::Membership(membership) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), membership);
                    responses.push(BatchResponse::default());
                }
                EntryPayload::Normal(commands) => {
                    let out = inner.engine.apply(&commands);
                    touched.extend(out.touched);
                    for job in out.finished {
                        let k = key(self.partition, job.key.0);
                        batch.delete(Table::Jobs, k);
                        batch.put(Table::Done, k, storage::encode(&job));
                    }
                    responses.push(BatchResponse {
                        results: out.results,
                        available: out.available,
                        next_timer: None,
                        outcomes: out.outcomes,
                        created_to_activated: out.created_to_activated,
                        activated_to_completed: out.activated_to_completed,
                    });
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for job_key in touched {
            // A touched job that finished later in the same batch is already in Done.
            if let Some(job) = inner.engine.job(job_key) {
                batch.put(Table::Jobs, key(self.partition, job_key.0), storage::encode(job));
            }
        }
        let next_timer = inner.engine.next_timer();
        for response in &mut responses {
            response.next_timer = next_timer;
        }
        self.persist_meta(&mut batch, &inner);
        // Written under the lock: a snapshot or a lookup never sees a job gone
        // from memory whose final record is not yet stored.
        self.store.write(batch).map_err(sm_write_err)?;
        drop(inner);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { partition: self.partition, store: Arc::clone(&self.store), shared: Arc::clone(&self.shared) }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let body: SnapshotBody = storage::decode("snapshot", &data).map_err(sm_read_err)?;
        let mut batch = self.store.batch();
        batch.delete_ids(Table::Jobs, self.partition, 0..u64::MAX);
        batch.delete_ids(Table::Done, self.partition, 0..u64::MAX);
        for job in &body.jobs {
            batch.put(Table::Jobs, key(self.partition, job.key.0), storage::encode(job));
        }
        for (job_key, record) in &body.done {
            batch.put(Table::Done, key(self.partition, *job_key), &record.0);
        }
        let mut inner = self.shared.lock();
        inner.engine = PartitionState::restore(body.engine, body.jobs);
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        self.persist_meta(&mut batch, &inner);
        batch.put(Table::Snapshot, key(self.partition, 0), storage::encode(&(meta, data)));
        self.store.write_synced(batch).map_err(sm_write_err)?;
        drop(inner);
        metrics::counter!("drover_raft_snapshots_installed_total", "partition" => self.partition.to_string())
            .increment(1);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        load_snapshot(&self.store, self.partition)
    }
}

fn load_snapshot(store: &Store, partition: PartitionId) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
    let Some(bytes) = store.get(Table::Snapshot, key(partition, 0)).map_err(sm_read_err)? else {
        return Ok(None);
    };
    let (meta, data): (SnapshotMeta<NodeId, BasicNode>, Vec<u8>) =
        storage::decode("snapshot", &bytes).map_err(sm_read_err)?;
    Ok(Some(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
}

pub struct SnapshotBuilder {
    partition: PartitionId,
    store: Arc<Store>,
    shared: Arc<SharedState>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // Only the live jobs, the counters and a point-in-time view of storage
        // are taken under the lock apply holds; final records (which grow with
        // every completed job) are read from that view without blocking apply.
        let (mut body, last_applied, membership, view) = {
            let inner = self.shared.lock();
            let body = SnapshotBody {
                engine: inner.engine.meta(),
                jobs: inner.engine.jobs().cloned().collect(),
                done: Vec::new(),
            };
            (body, inner.last_applied, inner.membership.clone(), self.store.point_in_time())
        };
        view.for_each(Table::Done, self.partition, |job_key, bytes| {
            body.done.push((job_key, serde_bytes_vec::Bytes(bytes.to_vec())));
            Ok(())
        })
        .map_err(sm_read_err)?;
        drop(view);
        let data = storage::encode(&body);
        let snapshot_id = match last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, data.len()),
            None => format!("empty-{}", data.len()),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
        let mut batch = self.store.batch();
        batch.put(Table::Snapshot, key(self.partition, 0), storage::encode(&(&meta, &data)));
        self.store.write(batch).map_err(sm_write_err)?;
        metrics::counter!("drover_raft_snapshots_built_total", "partition" => self.partition.to_string()).increment(1);
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}
