//! A partition's state machine: the pure engine, persisted write-through.
//!
//! Applying entries runs [`PartitionState::apply`] and writes every changed job
//! record (its spec only when new or replaced: see [`records`]), the applied
//! log id and the membership in one unsynced RocksDB batch
//! (see [`crate::storage`] for why that is safe). Snapshots carry every record,
//! live and final, so a follower that installs one answers `GetJob` like the rest.
//!
//! A snapshot is made only when a follower needs one, into an unnamed file in
//! the data directory: the final records stream from a RocksDB point-in-time
//! view to the file, and openraft sends it in chunks, so neither side holds
//! the retained records in memory while sending. Installing writes one synced
//! batch (it must be atomic), which holds the snapshot's records once. At
//! start openraft asks only for the snapshot's identity; that is answered
//! without making one.
//!
//! Final records are kept for a while, then pruned, oldest first, under the
//! [`Retention`] the leader stamped on each entry. Every replica prunes after
//! the same entry, so replicas at one applied index hold the same records; and
//! memory, storage and snapshot size stay bounded however long the node runs.
//!
//! This file is the apply side (openraft's `RaftStateMachine`); the snapshot
//! format is [`snapshot`]'s, the reads other parts of the node make
//! ([`SharedState`]) are [`reads`]'s, and the pruning order of final records
//! is [`retention`]'s.

mod reads;
mod retention;
mod snapshot;

use std::collections::VecDeque;
use std::io::{BufReader, Seek};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{BasicNode, Entry, EntryPayload, LogId, StorageError, StorageIOError, StoredMembership};
use serde::{Deserialize, Serialize};

use super::{records, BatchResponse, NodeId, TypeConfig};
use crate::core::{Deduped, JobKey, Millis, PartitionId, PartitionState, Registry, RequestId, StateSnapshot};
use crate::storage::{self, key, meta_key, Store, Table};
pub use reads::SharedState;
use retention::{expiry_value, parse_expiry, Finished};
pub use snapshot::{check_snapshot, snapshot_bytes, SnapshotBuilder};
use snapshot::{decode_record, next_frame, read_header, snapshot_file, snapshot_meta};

const APPLIED: &str = "applied";
/// The partition's worker sessions, rewritten whenever an entry changes them
/// (every heartbeat does).
const SESSIONS: &str = "sessions";
/// The partition's job schemas, kept apart from the sessions: they are large
/// and rarely change.
const SCHEMAS: &str = "schemas";

/// What is persisted beside the records after every apply.
#[derive(Serialize, Deserialize)]
struct AppliedMeta {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    engine: StateSnapshot,
    /// The finish sequence number the next final record gets.
    finished_next: u64,
}

struct Inner {
    engine: PartitionState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    finished: Finished,
    /// The leader time of the newest entry applied here that was appended
    /// after this process started, and when it was applied (see
    /// [`SharedState::clock_estimate`]).
    observed: Option<(Millis, std::time::Instant)>,
}

pub struct StateMachine {
    partition: PartitionId,
    /// The last log index present when the store was opened: entries up to
    /// it are replays, not news of the leader's clock.
    replayed_until: u64,
    /// Whether openraft has had the snapshot identity it reads at start.
    identity_served: bool,
    store: Arc<Store>,
    shared: Arc<SharedState>,
    /// The cluster version: what a snapshot is written at.
    versions: Arc<crate::transport::Versions>,
}

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(&e).into()
}

/// Snapshot files are the state machine's own writes besides RocksDB.
fn sm_write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&e).into()
}

impl StateMachine {
    /// Loads the partition's applied state and live jobs from storage.
    pub fn open(
        partition: PartitionId,
        store: Arc<Store>,
        snapshot_dir: PathBuf,
        versions: Arc<crate::transport::Versions>,
    ) -> anyhow::Result<(StateMachine, Arc<SharedState>)> {
        let meta: Option<AppliedMeta> = store
            .get(Table::Meta, meta_key(partition, APPLIED))?
            .map(|b| storage::decode("applied state", &b))
            .transpose()?;
        let mut jobs = Vec::new();
        store.for_each(Table::Jobs, partition, |id, bytes| {
            let spec = records::decode_spec(id, store.get(Table::Specs, key(partition, id))?)?;
            jobs.push(records::decode_progress(spec, bytes)?);
            Ok(())
        })?;
        let mut requests = Vec::new();
        store.for_each(Table::Requests, partition, |id, bytes| {
            let (request, entry): (RequestId, Deduped) = storage::decode("request entry", bytes)?;
            requests.push((id, request, entry));
            Ok(())
        })?;
        let registry = Registry {
            sessions: store
                .get(Table::Meta, meta_key(partition, SESSIONS))?
                .map(|b| storage::decode("worker sessions", &b))
                .transpose()?
                .unwrap_or_default(),
            schemas: store
                .get(Table::Meta, meta_key(partition, SCHEMAS))?
                .map(|b| storage::decode("job schemas", &b))
                .transpose()?
                .unwrap_or_default(),
        };
        let mut finished = Finished::default();
        let mut first = None;
        store.for_each(Table::Expiry, partition, |seq, bytes| {
            first.get_or_insert(seq);
            let entry = parse_expiry(bytes).ok_or_else(|| {
                storage::StorageError::Io(std::io::Error::other(format!("corrupt expiry entry {seq}")))
            })?;
            finished.order.push_back(entry);
            Ok(())
        })?;
        let inner = match meta {
            Some(meta) => {
                finished.first = first.unwrap_or(meta.finished_next);
                if finished.next() != meta.finished_next {
                    anyhow::bail!(
                        "partition {partition}: the expiry index ends at {} but the applied state expects {}",
                        finished.next(),
                        meta.finished_next
                    );
                }
                Inner {
                    engine: PartitionState::restore(meta.engine, jobs, requests, registry),
                    last_applied: meta.last_applied,
                    membership: meta.membership,
                    finished,
                    observed: None,
                }
            }
            None => Inner {
                engine: PartitionState::new(partition),
                last_applied: None,
                membership: StoredMembership::default(),
                finished,
                observed: None,
            },
        };
        let replayed_until = store.last(Table::Log, partition)?.map(|(index, _)| index).unwrap_or(0);
        let shared = Arc::new(SharedState {
            partition,
            store: Arc::clone(&store),
            snapshot_dir,
            inner: Mutex::new(inner),
            waiters: Mutex::default(),
        });
        Ok((
            StateMachine {
                partition,
                replayed_until,
                identity_served: false,
                store,
                shared: Arc::clone(&shared),
                versions,
            },
            shared,
        ))
    }

    fn persist_meta(&self, batch: &mut storage::Batch<'_>, inner: &Inner) {
        let meta = AppliedMeta {
            last_applied: inner.last_applied,
            membership: inner.membership.clone(),
            engine: inner.engine.meta(),
            finished_next: inner.finished.next(),
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
        if let Some(hold) = crate::failpoints::fire("apply_hold") {
            tokio::time::sleep(hold).await;
        }
        let started = std::time::Instant::now();
        let mut responses = Vec::new();
        let mut batch = self.store.batch();
        let mut inner = self.shared.lock();
        let mut touched = Vec::new();
        let mut finished_keys = Vec::new();
        let pruned_from = inner.finished.first;
        let (mut sessions_changed, mut schemas_changed) = (false, false);
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
                    let now = inner.engine.clock();
                    if entry.log_id.index > self.replayed_until {
                        inner.observed = Some((now, std::time::Instant::now()));
                    }
                    touched.extend(out.touched);
                    // Before this entry's prune, which deletes the specs of
                    // the final records it drops (a job may be created,
                    // finish and be pruned in one entry).
                    for job_key in &out.specs {
                        let finished = || out.finished.iter().find(|job| job.key == *job_key).map(|job| &job.spec);
                        if let Some(spec) = inner.engine.job(*job_key).map(|job| &job.spec).or_else(finished) {
                            batch.put(Table::Specs, key(self.partition, job_key.0), storage::encode(&**spec));
                        }
                    }
                    sessions_changed |= out.sessions_changed;
                    schemas_changed |= out.schemas_changed;
                    for died in &out.sessions_died {
                        tracing::warn!(
                            partition = self.partition,
                            session = %format!("{:x}", died.id),
                            worker = %died.worker,
                            "worker session died: no heartbeat for {} ms; its jobs here are activatable again",
                            died.dead_after_ms
                        );
                        metrics::counter!("drover_worker_sessions_died_total", "partition" => self.partition.to_string())
                            .increment(1);
                    }
                    for id in &out.requests_expired {
                        batch.delete(Table::Requests, key(self.partition, *id));
                    }
                    for (id, request, entry) in &out.requests_added {
                        batch.put(Table::Requests, key(self.partition, *id), storage::encode(&(request, entry)));
                    }
                    for job in out.finished {
                        finished_keys.push(job.key);
                        let k = key(self.partition, job.key.0);
                        batch.delete(Table::Jobs, k);
                        batch.put(Table::Done, k, records::encode_progress(&job));
                        inner.finished.push(&mut batch, self.partition, now, job.key);
                    }
                    inner.finished.prune(&mut batch, self.partition, commands.retention, now);
                    responses.push(BatchResponse {
                        results: out.results,
                        available: out.available,
                        next_timer: None,
                        outcomes: out.outcomes,
                        created_to_activated: out.created_to_activated,
                        activated_to_completed: out.activated_to_completed,
                        checkpoints: out.checkpoints,
                        failures: out.failures,
                    });
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for job_key in touched {
            // A touched job that finished later in the same batch is already in Done.
            if let Some(job) = inner.engine.job(job_key) {
                batch.put(Table::Jobs, key(self.partition, job_key.0), records::encode_progress(job));
            }
        }
        let pruned_to = inner.finished.first;
        if pruned_to > pruned_from {
            metrics::counter!("drover_jobs_pruned_total", "partition" => self.partition.to_string())
                .increment(pruned_to - pruned_from);
        }
        let next_timer = inner.engine.next_timer();
        for response in &mut responses {
            response.next_timer = next_timer;
        }
        if sessions_changed {
            let sessions = inner.engine.session_records();
            batch.put(Table::Meta, meta_key(self.partition, SESSIONS), storage::encode(&sessions));
        }
        if schemas_changed {
            let schemas = inner.engine.schema_records();
            batch.put(Table::Meta, meta_key(self.partition, SCHEMAS), storage::encode(&schemas));
        }
        self.persist_meta(&mut batch, &inner);
        // Written under the lock: a snapshot or a lookup never sees a job gone
        // from memory whose final record is not yet stored.
        self.store.write(batch);
        drop(inner);
        self.shared.wake(&finished_keys);
        crate::metrics::stages::record(crate::metrics::stages::Stage::Apply, started.elapsed());
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { shared: Arc::clone(&self.shared) }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError<NodeId>> {
        Ok(Box::new(tokio::fs::File::from_std(snapshot_file(&self.shared.snapshot_dir)?)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut file = snapshot.into_std().await;
        file.rewind().map_err(sm_read_err)?;
        let size = file.metadata().map_err(sm_read_err)?.len();
        let mut rest = BufReader::with_capacity(1 << 20, file);
        // Bounded by the file: a corrupt length inside is an error, not an allocation.
        let (version, body) = read_header(&mut rest, size).map_err(sm_read_err)?;
        let mut batch = self.store.batch();
        batch.delete_ids(Table::Jobs, self.partition, 0..u64::MAX);
        batch.delete_ids(Table::Done, self.partition, 0..u64::MAX);
        batch.delete_ids(Table::Expiry, self.partition, 0..u64::MAX);
        batch.delete_ids(Table::Requests, self.partition, 0..u64::MAX);
        batch.delete_ids(Table::Specs, self.partition, 0..u64::MAX);
        for (id, request, entry) in &body.requests {
            batch.put(Table::Requests, key(self.partition, *id), storage::encode(&(request, entry)));
        }
        let mut finished = Finished { first: body.finished_first, order: VecDeque::with_capacity(body.finished.len()) };
        for (at, job) in &body.finished {
            finished.order.push_back((*at, JobKey(*job)));
        }
        for (i, (at, job)) in finished.order.iter().enumerate() {
            batch.put(Table::Expiry, key(self.partition, finished.first + i as u64), expiry_value(*at, *job));
        }
        for job in &body.jobs {
            batch.put(Table::Jobs, key(self.partition, job.key.0), records::encode_progress(job));
            batch.put(Table::Specs, key(self.partition, job.key.0), storage::encode(&*job.spec));
        }
        // Frames carry whole jobs; stored, each is split in two again.
        while let Some((job_key, record)) = next_frame(&mut rest).map_err(sm_read_err)? {
            let job = decode_record(version, &record).map_err(sm_read_err)?;
            batch.put(Table::Done, key(self.partition, job_key), records::encode_progress(&job));
            batch.put(Table::Specs, key(self.partition, job_key), storage::encode(&*job.spec));
        }
        let mut inner = self.shared.lock();
        batch.put(Table::Meta, meta_key(self.partition, SESSIONS), storage::encode(&body.registry.sessions));
        batch.put(Table::Meta, meta_key(self.partition, SCHEMAS), storage::encode(&body.registry.schemas));
        inner.engine = PartitionState::restore(body.engine, body.jobs, body.requests, body.registry);
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.finished = finished;
        self.persist_meta(&mut batch, &inner);
        self.store.write_synced(batch);
        drop(inner);
        metrics::counter!("drover_raft_snapshots_installed_total", "partition" => self.partition.to_string())
            .increment(1);
        Ok(())
    }

    /// The partition's state as a snapshot, made now. Snapshots are not kept:
    /// openraft asks for one only to send it to a follower whose log was
    /// purged past, and the state machine worker that asks applies nothing
    /// meanwhile, so the snapshot matches the applied index it names.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        if !self.identity_served {
            // Raft::new reads the snapshot only for its identity (meta);
            // making one would copy every retained record at every start.
            self.identity_served = true;
            let meta = {
                let inner = self.shared.lock();
                if inner.last_applied.is_none() {
                    return Ok(None);
                }
                snapshot_meta(&inner)
            };
            let empty = tokio::fs::File::from_std(snapshot_file(&self.shared.snapshot_dir)?);
            return Ok(Some(Snapshot { meta, snapshot: Box::new(empty) }));
        }
        self.shared.snapshot(self.versions.cluster_version())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::io::Read;

    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::*;
    use crate::core::{Batch, Command, CommandResult, JobSpec, JobState, NewJob, Retention, DEFAULT_TENANT};

    const RETENTION: Retention = Retention { max_age_ms: 10_000, max_jobs: 3 };

    /// A one-node cluster's versions: it speaks its own.
    fn versions() -> Arc<crate::transport::Versions> {
        Arc::new(crate::transport::Versions::new(0, vec![0], 0))
    }

    /// A cluster whose other member has not been heard from: it runs at the
    /// oldest version this build reads.
    fn mixed_versions() -> Arc<crate::transport::Versions> {
        Arc::new(crate::transport::Versions::new(0, vec![0, 1], 0))
    }

    fn entry(index: u64, now: Millis, commands: Vec<Command>) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(Batch { now, retention: RETENTION, commands, renew_sessions: false }),
        }
    }

    fn create() -> Command {
        Command::Create(NewJob {
            spec: Arc::new(JobSpec {
                job_type: "t".into(),
                tenant: DEFAULT_TENANT.into(),
                variables: "{}".into(),
                custom_headers: Vec::new(),
                ..Default::default()
            }),
            retries: 1,
            run_at: None,
            delay_ms: 0,
            request: None,
            dedupe_window_ms: 0,
        })
    }

    fn states(shared: &SharedState) -> Vec<(u64, JobState)> {
        let mut jobs: Vec<(u64, JobState)> =
            shared.all_jobs().unwrap().into_iter().map(|j| (j.key.counter(), j.state)).collect();
        jobs.sort_unstable_by_key(|(k, _)| *k);
        jobs
    }

    #[tokio::test]
    async fn final_records_are_pruned_alike_after_restart_and_snapshot_install() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, shared) =
            StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
                .unwrap();
        sm.apply([entry(1, 1_000, (0..6).map(|_| create()).collect())]).await.unwrap();
        // Five of six finish: only the newest three final records stay.
        let cancels = (1..=5).map(|c| Command::Cancel { key: JobKey::new(0, c), by: String::new() }).collect();
        sm.apply([entry(2, 2_000, cancels)]).await.unwrap();
        let expected = vec![
            (3, JobState::Cancelled),
            (4, JobState::Cancelled),
            (5, JobState::Cancelled),
            (6, JobState::Activatable),
        ];
        assert_eq!(states(&shared), expected);
        assert!(shared.lookup(JobKey::new(0, 1)).unwrap().is_none(), "the oldest final record is pruned");

        // A follower installing a snapshot gets the same records and pruning order.
        // At start openraft asks only for the identity: nothing is copied.
        let identity = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
        assert_eq!(identity.meta.last_log_id.map(|l| l.index), Some(2));
        assert_eq!(identity.snapshot.metadata().await.unwrap().len(), 0);
        let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
        assert!(snapshot.snapshot.metadata().await.unwrap().len() > 0);
        let (mut follower, follower_shared) =
            StateMachine::open(0, Store::open(&dir.path().join("b")).unwrap(), dir.path().join("snap-b"), versions())
                .unwrap();
        follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        assert_eq!(states(&follower_shared), expected);

        // A restart restores the pruning order from storage.
        drop((sm, shared));
        let (mut sm, shared) =
            StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
                .unwrap();
        assert_eq!(states(&shared), expected);

        // Past their age, every final record goes, on both, and only those.
        let later = entry(3, 2_000 + RETENTION.max_age_ms + 1, Vec::new());
        sm.apply([later.clone()]).await.unwrap();
        follower.apply([later]).await.unwrap();
        assert_eq!(states(&shared), vec![(6, JobState::Activatable)]);
        assert_eq!(states(&follower_shared), vec![(6, JobState::Activatable)]);

        // And the index picks up where it stopped.
        sm.apply([entry(4, 20_000, vec![Command::Cancel { key: JobKey::new(0, 6), by: String::new() }])])
            .await
            .unwrap();
        drop((sm, shared));
        let (_sm, shared) =
            StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
                .unwrap();
        assert_eq!(states(&shared), vec![(6, JobState::Cancelled)]);
    }

    #[tokio::test]
    async fn a_snapshot_is_written_at_the_cluster_version_and_either_version_installs() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("a")).unwrap();
        let (mut sm, shared) = StateMachine::open(0, store, dir.path().join("snap-a"), mixed_versions()).unwrap();
        sm.apply([entry(1, 1_000, (0..4).map(|_| create()).collect())]).await.unwrap();
        sm.apply([entry(2, 2_000, vec![Command::Cancel { key: JobKey::new(0, 1), by: String::new() }])]).await.unwrap();
        let expected = states(&shared);
        sm.get_current_snapshot().await.unwrap(); // the identity, asked at start
        for (name, cluster, written_at) in
            [("older member", mixed_versions(), crate::codec::OLDEST_VERSION), ("one version", versions(), 7)]
        {
            sm.versions = cluster;
            let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
            let meta = snapshot.meta.clone();
            let mut file = snapshot.snapshot.into_std().await;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            let versioned = bytes.starts_with(&crate::codec::header(written_at)[..2]);
            assert_eq!(versioned, written_at >= 7, "{name}: a version-{written_at} snapshot");
            assert_eq!(check_snapshot(&bytes).unwrap(), 4, "{name}: every record reads");
            file.rewind().unwrap();
            let follower_store = Store::open(&dir.path().join(format!("follower-{written_at}"))).unwrap();
            let (mut follower, follower_shared) =
                StateMachine::open(0, follower_store, dir.path().join("snap-f"), versions()).unwrap();
            follower.install_snapshot(&meta, Box::new(tokio::fs::File::from_std(file))).await.unwrap();
            assert_eq!(states(&follower_shared), expected, "{name}: the follower holds what the leader holds");
        }
    }

    fn stored_ids(store: &Store, table: Table) -> Vec<u64> {
        let mut ids = Vec::new();
        store
            .for_each(table, 0, |id, _| {
                ids.push(id);
                Ok(())
            })
            .unwrap();
        ids
    }

    #[tokio::test]
    async fn expired_request_entries_and_pruned_expiry_entries_leave_storage_one_by_one() {
        use crate::core::RequestId;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("a")).unwrap();
        let (mut sm, _shared) =
            StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
        let create_as = |seq: u64, window: Millis| {
            let Command::Create(mut job) = create() else { unreachable!("create() makes a create") };
            job.request = Some(RequestId::Gateway { node: 1, epoch: 7, seq });
            job.dedupe_window_ms = window;
            Command::Create(job)
        };
        // Request 1 is remembered for 5 s, request 2 for a minute.
        sm.apply([entry(1, 1_000, vec![create_as(1, 5_000), create_as(2, 60_000)])]).await.unwrap();
        let requests = stored_ids(&store, Table::Requests);
        assert_eq!(requests.len(), 2);
        // At 10 s the first has expired: its entry, and only it, leaves storage.
        sm.apply([entry(2, 10_000, Vec::new())]).await.unwrap();
        assert_eq!(stored_ids(&store, Table::Requests), vec![requests[1]]);

        // Six final records with three kept: the expiry index keeps the newest three.
        sm.apply([entry(3, 11_000, (0..4).map(|_| create()).collect())]).await.unwrap();
        let cancels = (1..=6).map(|c| Command::Cancel { key: JobKey::new(0, c), by: String::new() }).collect();
        sm.apply([entry(4, 12_000, cancels)]).await.unwrap();
        assert_eq!(stored_ids(&store, Table::Expiry), vec![3, 4, 5]);
        assert_eq!(stored_ids(&store, Table::Done).len(), 3);
        // Each went as a point deletion: range deletions, one or more per
        // apply, made RocksDB fragment thousands of them at each flush.
        store.flush_memtables();
        assert_eq!(store.range_deletions_in_files(Table::Requests), 0);
        assert_eq!(store.range_deletions_in_files(Table::Expiry), 0);

        // A restart finds the same, and expires what is left as before.
        drop(sm);
        let (mut sm, _shared) =
            StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
        sm.apply([entry(5, 70_000, Vec::new())]).await.unwrap();
        assert_eq!(stored_ids(&store, Table::Requests), Vec::<u64>::new());
        assert_eq!(stored_ids(&store, Table::Expiry), Vec::<u64>::new(), "past their age every final record goes");
    }

    fn spec_bytes(store: &Store) -> u64 {
        store.put_bytes().iter().find(|(t, _)| t.cf_name() == "job_specs").map(|(_, b)| *b).unwrap()
    }

    #[tokio::test]
    async fn specs_are_written_when_new_or_replaced_and_leave_with_their_final_record() {
        use crate::core::{Activation, FailReason, Via};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("a")).unwrap();
        let (mut sm, shared) =
            StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
        // Job 2 is created and cancelled in one batch: its spec is stored all the same.
        let cancel_2 = Command::Cancel { key: JobKey::new(0, 2), by: String::new() };
        sm.apply([entry(1, 1_000, vec![create(), create(), cancel_2])]).await.unwrap();
        let after_creates = spec_bytes(&store);
        assert!(after_creates > 0);

        // An activation rewrites the job's progress, never its spec.
        let activate = Command::Activate(Activation {
            job_type: "t".into(),
            tenants: vec![DEFAULT_TENANT.into()],
            worker: "w".into(),
            timeout_ms: 5_000,
            max_jobs: 1,
            max_bytes: u64::MAX,
            session: 0,
            via: Via::Unknown,
            taker: Default::default(),
            rivals: Vec::new(),
        });
        sm.apply([entry(2, 1_100, vec![activate])]).await.unwrap();
        assert_eq!(spec_bytes(&store), after_creates, "an activation wrote a spec");

        // A failure that sets variables replaces the spec.
        let fail = Command::Fail {
            key: JobKey::new(0, 1),
            attempt: 1,
            retries: 1,
            error_message: "again".into(),
            back_off_ms: 0,
            variables: r#"{"v":2}"#.into(),
            max_payload_bytes: u64::MAX,
            reason: FailReason::Failed,
        };
        sm.apply([entry(3, 1_200, vec![fail])]).await.unwrap();
        assert!(spec_bytes(&store) > after_creates);

        let check = |shared: &SharedState| {
            let live = shared.lookup(JobKey::new(0, 1)).unwrap().expect("job 1");
            assert_eq!((live.state, &live.spec.variables[..]), (JobState::Activatable, &br#"{"v":2}"#[..]));
            let done = shared.lookup(JobKey::new(0, 2)).unwrap().expect("job 2");
            assert_eq!((done.state, done.spec.job_type.as_str()), (JobState::Cancelled, "t"));
        };
        check(&shared);
        // The same after a restart, and on a follower that installs a snapshot.
        drop((sm, shared));
        let (mut sm, shared) =
            StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
        check(&shared);
        let snapshot = sm.get_current_snapshot().await.unwrap().expect("identity");
        assert_eq!(snapshot.snapshot.metadata().await.unwrap().len(), 0);
        let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
        let follower_store = Store::open(&dir.path().join("b")).unwrap();
        let (mut follower, follower_shared) =
            StateMachine::open(0, Arc::clone(&follower_store), dir.path().join("snap-b"), versions()).unwrap();
        follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        check(&follower_shared);

        // Pruned, a final record takes its spec with it, on both.
        let later = entry(4, 1_000 + RETENTION.max_age_ms + 1, Vec::new());
        sm.apply([later.clone()]).await.unwrap();
        follower.apply([later]).await.unwrap();
        for (store, shared) in [(&store, &shared), (&follower_store, &follower_shared)] {
            assert!(shared.lookup(JobKey::new(0, 2)).unwrap().is_none());
            assert_eq!(store.get(Table::Specs, key(0, JobKey::new(0, 2).0)).unwrap(), None);
            assert!(store.get(Table::Specs, key(0, JobKey::new(0, 1).0)).unwrap().is_some());
        }
        // Created, finished and pruned in one entry (no final records kept):
        // no spec is left behind.
        let none_kept = Retention { max_age_ms: 10_000, max_jobs: 0 };
        // The third job created in this partition.
        let third = JobKey::new(0, 3);
        let mut gone = entry(5, 21_000, vec![create(), Command::Cancel { key: third, by: String::new() }]);
        if let EntryPayload::Normal(batch) = &mut gone.payload {
            batch.retention = none_kept;
        }
        let answers = sm.apply([gone]).await.unwrap();
        assert!(answers[0].results.iter().all(|r| !matches!(r, CommandResult::Rejected(_))), "{answers:?}");
        assert_eq!(shared.lookup(third).unwrap(), None, "kept no final record");
        assert_eq!(store.get(Table::Specs, key(0, third.0)).unwrap(), None, "a pruned job's spec stayed");

        // A reader that got a final record just before its prune finds nothing, not damage...
        let progress = records::encode_progress(&shared.lookup(JobKey::new(0, 1)).unwrap().unwrap());
        assert_eq!(shared.final_record(JobKey::new(0, 2).0, &progress).unwrap(), None);
        // ...while a final record without its spec is damage, and says so.
        let mut batch = store.batch();
        batch.put(Table::Done, key(0, JobKey::new(0, 9).0), &progress);
        store.write(batch);
        let damaged = shared.lookup(JobKey::new(0, 9)).unwrap_err().to_string();
        assert!(damaged.contains("no spec record"), "{damaged}");
    }
}
