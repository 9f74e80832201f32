//! A partition's Raft log and vote in the node's RocksDB.
//!
//! Appends are durable before openraft hears of them: the write goes to the
//! storage group-commit writer and `LogFlushed` fires only after the WAL sync
//! that covers it. Votes are written synced before `save_vote` returns. A
//! write or sync that fails ends the process (see [`crate::storage`]), so
//! none of these report a write error to openraft.
//!
//! Replication reads at most [`MAX_APPEND_BYTES`] of entries for one append
//! (at least one entry), so an append ships and syncs within a heartbeat and
//! fits the cluster's message limit.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogId, StorageError, StorageIOError, Vote};

use super::{NodeId, TypeConfig};
use crate::core::PartitionId;
use crate::storage::{self, meta_key, DeletedBelow, Store, Table};

const VOTE: &str = "vote";
const PURGED: &str = "purged";
const COMMITTED: &str = "committed";
/// Bytes of stored entries sent in one append, at most, unless one entry is
/// larger (it then goes alone).
pub const MAX_APPEND_BYTES: usize = 8 << 20;

#[derive(Clone)]
pub struct LogStore {
    partition: PartitionId,
    store: Arc<Store>,
    max_append_bytes: usize,
    /// How far purges have deleted the log.
    purged: DeletedBelow,
}

impl LogStore {
    /// `max_message_bytes` is the cluster's message limit: an append never
    /// reads more than half of it (or [`MAX_APPEND_BYTES`]).
    pub fn new(partition: PartitionId, store: Arc<Store>, max_message_bytes: usize) -> Self {
        LogStore {
            partition,
            store,
            max_append_bytes: MAX_APPEND_BYTES.min(max_message_bytes / 2),
            purged: DeletedBelow::default(),
        }
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StorageError<NodeId>> {
        let bytes = self.store.get(Table::Meta, meta_key(self.partition, name)).map_err(read_err)?;
        bytes.map(|b| storage::decode("raft meta", &b)).transpose().map_err(read_err)
    }
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_logs(&e).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let rows = self.store.scan(Table::Log, self.partition, start..end).map_err(read_err)?;
        rows.iter().map(|(_, bytes)| storage::decode("raft log", bytes).map_err(read_err)).collect()
    }

    /// The entries of one append: from `start`, up to `max_append_bytes` as
    /// stored, at least one.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let rows = self.store.scan(Table::Log, self.partition, start..end).map_err(read_err)?;
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        for (_, row) in &rows {
            if !entries.is_empty() && bytes + row.len() > self.max_append_bytes {
                break;
            }
            bytes += row.len();
            entries.push(storage::decode("raft log", row).map_err(read_err)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_meta(PURGED)?;
        let last = self.store.last(Table::Log, self.partition).map_err(read_err)?;
        let last_log_id = match last {
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> = storage::decode("raft log", &bytes).map_err(read_err)?;
                Some(*entry.get_log_id())
            }
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.put(Table::Meta, meta_key(self.partition, VOTE), storage::encode(vote));
        // A vote must never be forgotten: synced before we answer.
        self.store.write_synced(batch);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.read_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.put(Table::Meta, meta_key(self.partition, COMMITTED), storage::encode(&committed));
        self.store.write(batch);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.read_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut batch = self.store.batch();
        let mut count = 0u64;
        for entry in entries {
            batch.put(Table::Log, storage::key(self.partition, entry.get_log_id().index), storage::encode(&entry));
            count += 1;
        }
        metrics::counter!("drover_raft_entries_appended_total").increment(count);
        // The entries are written (readable) when this returns; openraft learns
        // they are durable from the callback, after the group sync that covers
        // them. openraft 0.9 awaits that callback (`append_to_log`) before it
        // does anything else for the group: a leader replicates the entries,
        // and a follower answers the leader, only after this node's sync.
        // Returning early only lets the sync be shared with other partitions.
        let written = std::time::Instant::now();
        self.store.write_durable(
            batch,
            Box::new(move |result: Result<(), String>| {
                crate::admin::stages::record(crate::admin::stages::Stage::LogSync, written.elapsed());
                callback.log_io_completed(result.map_err(io::Error::other));
            }),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.delete_ids(Table::Log, self.partition, log_id.index..u64::MAX);
        self.store.write_synced(batch);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.put(Table::Meta, meta_key(self.partition, PURGED), storage::encode(&log_id));
        self.purged.delete_below(&mut batch, Table::Log, self.partition, log_id.index + 1);
        self.store.write(batch);
        Ok(())
    }
}
