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
//! ([`SharedState`]) are [`reads`]'s, the pruning order of final records and
//! their index by tenant are [`retention`]'s, and the remembered creates the
//! engine reads from disk are [`requests`]'.

pub mod backup;
pub mod events;
mod install;
mod named;
mod reads;
mod requests;
mod retention;
mod snapshot;

use std::io::{BufReader, Seek};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{BasicNode, Entry, EntryPayload, LogId, StorageError, StorageIOError, StoredMembership};
use serde::{Deserialize, Serialize};

use super::{records, BatchResponse, NodeId, TypeConfig};
use crate::core::{CommandResult, JobKey, Millis, PartitionId, PartitionState, Registry, StateSnapshot};
use crate::storage::{self, key, meta_key, Store, Table};
use install::install_records;
pub use install::restore;
pub use reads::SharedState;
use retention::Finished;
pub use snapshot::{check_snapshot, check_snapshot_from, snapshot_bytes, SnapshotBuilder};
use snapshot::{decode_record, next_frame, read_header, read_requests, snapshot_file, snapshot_meta};

const APPLIED: &str = "applied";
/// The partition's worker sessions, rewritten whenever an entry changes them
/// (every heartbeat does).
const SESSIONS: &str = "sessions";
/// Each owned session's owner (data version 9 on; see [`crate::core::Registry::owners`]).
const SESSION_OWNERS: &str = "session_owners";
/// The paused queues (data version 11 on; see [`crate::core::Registry::paused`]).
const PAUSED: &str = "paused_queues";
/// The cron schedules (data version 12 on; see [`crate::core::Registry::schedules`]),
/// rewritten whenever one changes (every tick does).
const SCHEDULES: &str = "schedules";
/// Partition 0's cluster plan (data version 15 on).
const PLAN: &str = "cluster_plan";
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
    /// A leader time of an entry applied here that was appended after this
    /// process started, and when it was applied: of the entries since, the
    /// one that puts the partition's time furthest on now (see
    /// [`reads::observe`] and [`SharedState::clock_estimate`]).
    observed: Option<(Millis, std::time::Instant)>,
    /// The lifecycle events kept for subscribers (see [`events`]).
    events: events::EventLog,
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
        let requests = Box::new(requests::DiskRequests::open(&store, partition)?);
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
            owners: store
                .get(Table::Meta, meta_key(partition, SESSION_OWNERS))?
                .map(|b| storage::decode("worker session owners", &b))
                .transpose()?
                .unwrap_or_default(),
            paused: store
                .get(Table::Meta, meta_key(partition, PAUSED))?
                .map(|b| storage::decode("paused queues", &b))
                .transpose()?
                .unwrap_or_default(),
            schedules: store
                .get(Table::Meta, meta_key(partition, SCHEDULES))?
                .map(|b| storage::decode("cron schedules", &b))
                .transpose()?
                .unwrap_or_default(),
            workflows: named::WORKFLOWS.load(&store, partition)?,
            limits: named::LIMITS.load(&store, partition)?,
            plan: store
                .get(Table::Meta, meta_key(partition, PLAN))?
                .map(|b| storage::decode("cluster plan", &b))
                .transpose()?,
        };
        let (mut finished, first) = Finished::open(&store, partition)?;
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
                let applied = meta.last_applied.map_or(0, |id| id.index);
                Inner {
                    events: events::EventLog::open(&store, partition, applied, meta.engine.clock)?,
                    engine: PartitionState::restore_on(meta.engine, jobs, requests, registry),
                    last_applied: meta.last_applied,
                    membership: meta.membership,
                    finished,
                    observed: None,
                }
            }
            None => Inner {
                engine: PartitionState::restore_on(
                    StateSnapshot { partition, ..StateSnapshot::default() },
                    [],
                    requests,
                    Registry::default(),
                ),
                last_applied: None,
                membership: StoredMembership::default(),
                finished,
                observed: None,
                events: events::EventLog::open(&store, partition, 0, 0)?,
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
        let hold = crate::failpoints::fire("apply_hold").or_else(|| {
            crate::failpoints::enabled()
                .then(|| crate::failpoints::fire(&format!("apply_hold_{}", self.partition)))
                .flatten()
        });
        if let Some(hold) = hold {
            tokio::time::sleep(hold).await;
        }
        let started = std::time::Instant::now();
        let mut responses = Vec::new();
        let mut batch = self.store.batch();
        let mut inner = self.shared.lock();
        let mut touched = Vec::new();
        let mut finished_keys = Vec::new();
        let pruned_from = inner.finished.first;
        let (mut sessions_changed, mut schemas_changed, mut paused_changed) = (false, false, false);
        let mut schedules_changed = false;
        let mut workflows_changed = std::collections::BTreeSet::new();
        let mut limits_changed = std::collections::BTreeSet::new();
        let mut plan_changed = false;
        // Backups marked in these entries: (response, command, backup id).
        let mut marks: Vec<(usize, usize, String)> = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(BatchResponse::default()),
                EntryPayload::Membership(membership) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), membership);
                    responses.push(BatchResponse::default());
                }
                EntryPayload::Normal(commands) => {
                    // A mark's result is at its place among the results,
                    // which a principal's run of several commands shifts.
                    let mut at = 0;
                    for command in &commands.commands {
                        if let crate::core::Command::BackupMark { id } = command {
                            marks.push((responses.len(), at, id.clone()));
                        }
                        at += command.results();
                    }
                    if crate::failpoints::enabled() {
                        // Bugs a negative control plants, alike on every replica.
                        inner.engine.plant(crate::core::Plants {
                            drop_ticks: crate::failpoints::armed("apply_drop_tick"),
                            limit_overrun: crate::failpoints::armed("apply_limit_overrun"),
                        });
                    }
                    let out = inner.engine.apply(&commands);
                    let now = inner.engine.clock();
                    let at = (entry.log_id.index, now);
                    inner.events.record(&mut batch, self.partition, at, &out.happened, commands.retention);
                    if entry.log_id.index > self.replayed_until {
                        inner.observed = Some(reads::observe(inner.observed, now, std::time::Instant::now()));
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
                    paused_changed |= out.paused_changed;
                    schedules_changed |= out.schedules_changed;
                    workflows_changed.extend(out.workflows_changed);
                    limits_changed.extend(out.limits_changed);
                    plan_changed |= out.plan_changed;
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
                    for (id, request) in &out.requests_expired {
                        requests::delete(&mut batch, self.partition, *id, request);
                    }
                    for (id, request, entry) in &out.requests_added {
                        requests::put(&mut batch, self.partition, *id, request, entry);
                    }
                    for job in out.finished {
                        finished_keys.push(job.key);
                        let k = key(self.partition, job.key.0);
                        batch.delete(Table::Jobs, k);
                        batch.put(Table::Done, k, records::encode_progress(&job));
                        inner.finished.push(&mut batch, self.partition, now, &job);
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
                        workflows: out.workflows.iter().map(|(k, e)| (k.to_string(), e.to_string())).collect(),
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
            let owners = inner.engine.session_owners();
            batch.put(Table::Meta, meta_key(self.partition, SESSION_OWNERS), storage::encode(&owners));
        }
        if schemas_changed {
            let schemas = inner.engine.schema_records();
            batch.put(Table::Meta, meta_key(self.partition, SCHEMAS), storage::encode(&schemas));
        }
        if paused_changed {
            let paused = inner.engine.paused_records();
            batch.put(Table::Meta, meta_key(self.partition, PAUSED), storage::encode(&paused));
        }
        if let Some(plan) = inner.engine.plan().filter(|_| plan_changed) {
            batch.put(Table::Meta, meta_key(self.partition, PLAN), storage::encode(plan));
        }
        if schedules_changed {
            let schedules = inner.engine.schedule_records();
            batch.put(Table::Meta, meta_key(self.partition, SCHEDULES), storage::encode(&schedules));
        }
        let engine = &inner.engine;
        named::WORKFLOWS.write_changed(&mut batch, self.partition, &workflows_changed, |tenant, id| {
            engine.workflow_record(tenant, id)
        });
        named::LIMITS.write_changed(&mut batch, self.partition, &limits_changed, |tenant, job_type| {
            engine.limit_record(tenant, job_type)
        });
        self.persist_meta(&mut batch, &inner);
        // Written under the lock: a snapshot or a lookup never sees a job gone
        // from memory whose final record is not yet stored.
        self.store.write(batch);
        inner.engine.requests_written();
        if let (false, Some(at)) = (marks.is_empty(), inner.last_applied) {
            // A backup's state is this apply's: what it has just written.
            for (response, command, id) in marks {
                let marked = CommandResult::BackupMarked {
                    term: at.leader_id.term,
                    leader: at.leader_id.node_id,
                    index: at.index,
                };
                responses[response].results[command] = marked;
                // Replayed at a start, the mark's backup is long done.
                if at.index > self.replayed_until {
                    backup::stage(&self.shared, &inner, id);
                }
            }
        }
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
        let mut batch = self.store.batch();
        let installed = install_records(&mut batch, self.partition, &mut rest, size).map_err(sm_read_err)?;
        let (engine, finished) = installed.engine(&self.store, self.partition);
        let mut inner = self.shared.lock();
        inner.engine = engine;
        let next = meta.last_log_id.map_or(0, |id| id.index) + 1;
        inner.events.installed(&mut batch, self.partition, next);
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
mod limit_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod requests_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod workflow_tests;
