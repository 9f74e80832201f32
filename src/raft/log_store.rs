//! A partition's Raft log and vote in the node's RocksDB.
//!
//! Appends are durable before openraft hears of them: the write goes to the
//! storage group-commit writer and `LogFlushed` fires only after the WAL sync
//! that covers it. Votes are written synced before `save_vote` returns; that
//! sync covers every append written before it, so a leader that takes another
//! leader's vote never answers it for entries it had not flushed. A
//! write or sync that fails ends the process (see [`crate::storage`]), so
//! none of these report a write error to openraft.
//!
//! Replication reads at most [`MAX_APPEND_BYTES`] of entries for one append
//! (at least one entry), so an append ships and syncs within a heartbeat and
//! fits the cluster's message limit.
//!
//! The entries this node appended are also kept, as they were handed over,
//! until the state machine reads them to apply them ([`Unapplied`]): apply
//! then takes them instead of reading them back from RocksDB and decoding
//! them. Anything not kept (after a restart, or past the bound) is read from
//! the database as before.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::Instant;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogId, StorageError, StorageIOError, Vote};

use super::{NodeId, TypeConfig};
use crate::core::PartitionId;
use crate::storage::{self, meta_key, DeletedBelow, Store, Table};

/// The log meta of a partition restored from a backup taken at `at`: the
/// log purged and committed up to it, and `vote` (see
/// [`super::state_machine::restore`]).
pub(super) fn restored(batch: &mut storage::Batch<'_>, partition: PartitionId, at: LogId<NodeId>, vote: Vote<NodeId>) {
    batch.put(Table::Meta, meta_key(partition, PURGED), storage::encode(&at));
    batch.put(Table::Meta, meta_key(partition, COMMITTED), storage::encode(&Some(at)));
    batch.put(Table::Meta, meta_key(partition, VOTE), storage::encode(&vote));
}

/// Whether `partition` has Raft state in `store`: a vote, a log entry or a
/// purge point (what openraft counts as initialized).
pub fn has_raft_state(store: &Store, partition: PartitionId) -> Result<bool, storage::StorageError> {
    let stored = |name| store.get(Table::Meta, meta_key(partition, name)).map(|bytes| bytes.is_some());
    Ok(stored(VOTE)? || stored(PURGED)? || store.last(Table::Log, partition)?.is_some())
}

const VOTE: &str = "vote";
const PURGED: &str = "purged";
const COMMITTED: &str = "committed";
/// Bytes of stored entries sent in one append, at most, unless one entry is
/// larger (it then goes alone).
pub const MAX_APPEND_BYTES: usize = 8 << 20;

/// Entries kept for apply, at most: a state machine that falls further
/// behind reads the rest from the database.
const UNAPPLIED_MAX_ENTRIES: usize = 1024;
/// Bytes (as stored) of entries kept for apply, at most.
const UNAPPLIED_MAX_BYTES: usize = 32 << 20;

pub struct LogStore {
    partition: PartitionId,
    store: Arc<Store>,
    max_append_bytes: usize,
    /// How far purges have deleted the log.
    purged: DeletedBelow,
    /// Entries appended here and not yet read for apply (readers, which
    /// replicate, start without any).
    unapplied: Unapplied,
    /// When recent appends were made, shared with the partition's network.
    appended: Arc<AppendTimes>,
}

impl Clone for LogStore {
    fn clone(&self) -> Self {
        LogStore {
            partition: self.partition,
            store: Arc::clone(&self.store),
            max_append_bytes: self.max_append_bytes,
            purged: self.purged.clone(),
            unapplied: Unapplied::default(),
            appended: Arc::clone(&self.appended),
        }
    }
}

/// When this node appended its recent entries: the network times an
/// AppendEntries' oldest entry from its append to its send
/// (`Stage::AppendWait`). Bounded by [`APPEND_TIMES_KEPT`] appends; an entry
/// past them is not timed.
#[derive(Default)]
pub struct AppendTimes {
    /// `(first index, last index, when)` of each append, oldest first.
    appends: std::sync::Mutex<std::collections::VecDeque<(u64, u64, Instant)>>,
}

/// Appends whose time is kept, at most.
const APPEND_TIMES_KEPT: usize = 256;

impl AppendTimes {
    fn record(&self, first: u64, last: u64, at: Instant) {
        let mut appends = self.appends.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // An append overwrites the log from its first entry on.
        while appends.back().is_some_and(|(from, _, _)| *from >= first) {
            appends.pop_back();
        }
        if let Some(back) = appends.back_mut() {
            back.1 = back.1.min(first - 1);
        }
        if appends.len() == APPEND_TIMES_KEPT {
            appends.pop_front();
        }
        appends.push_back((first, last, at));
    }

    /// When the entry at `index` was appended, if that is still kept.
    pub fn appended_at(&self, index: u64) -> Option<Instant> {
        let appends = self.appends.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = appends.partition_point(|(_, last, _)| *last < index);
        appends.get(at).filter(|(first, _, _)| *first <= index).map(|(_, _, when)| *when)
    }
}

/// Entries by index, as appended, until apply takes them; bounded by
/// [`UNAPPLIED_MAX_ENTRIES`] and [`UNAPPLIED_MAX_BYTES`]. It holds only what
/// the log holds: an append replaces what it overwrites, truncation and
/// purges drop what they delete.
#[derive(Default)]
struct Unapplied {
    entries: BTreeMap<u64, (Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl Unapplied {
    /// Keeps `entry` (`bytes` as stored) at `index`, after dropping whatever
    /// was kept at `index` and after it (an append overwrites the log from its
    /// first entry on). Past the bound, it is not kept.
    fn append(&mut self, index: u64, entry: Entry<TypeConfig>, bytes: usize) {
        self.drop_from(index);
        if self.entries.len() < UNAPPLIED_MAX_ENTRIES && self.bytes + bytes <= UNAPPLIED_MAX_BYTES {
            self.bytes += bytes;
            self.entries.insert(index, (entry, bytes));
        }
    }

    /// Takes the entries `start..end` if every one of them is kept, and drops
    /// anything before `start` (apply has gone past it).
    fn take(&mut self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let mut rest = self.entries.split_off(&start);
        for (_, bytes) in self.entries.values() {
            self.bytes -= bytes;
        }
        let complete =
            end > start && end - start <= rest.len() as u64 && rest.range(start..end).count() as u64 == end - start;
        if !complete {
            self.entries = rest;
            return None;
        }
        let after = rest.split_off(&end);
        self.entries = after;
        let taken: Vec<Entry<TypeConfig>> = rest
            .into_values()
            .map(|(entry, bytes)| {
                self.bytes -= bytes;
                entry
            })
            .collect();
        Some(taken)
    }

    /// Drops the entries from `index` on (the log was truncated there).
    fn drop_from(&mut self, index: u64) {
        for (_, bytes) in self.entries.split_off(&index).into_values() {
            self.bytes -= bytes;
        }
    }

    /// Drops the entries up to `index` (purged).
    fn drop_through(&mut self, index: u64) {
        let rest = self.entries.split_off(&index.saturating_add(1));
        for (_, bytes) in std::mem::replace(&mut self.entries, rest).into_values() {
            self.bytes -= bytes;
        }
    }
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
            unapplied: Unapplied::default(),
            appended: Arc::default(),
        }
    }

    /// When this store's recent entries were appended, for the network.
    pub fn append_times(&self) -> Arc<AppendTimes> {
        Arc::clone(&self.appended)
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
        if let Some(entries) = self.unapplied.take(start, end) {
            return Ok(entries);
        }
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
        let mut first_last = None;
        for entry in entries {
            let index = entry.get_log_id().index;
            first_last = Some((first_last.map_or(index, |(first, _)| first), index));
            let encoded = storage::encode(&entry);
            let bytes = encoded.len();
            batch.put(Table::Log, storage::key(self.partition, index), encoded);
            self.unapplied.append(index, entry, bytes);
            count += 1;
        }
        metrics::counter!("drover_raft_entries_appended_total").increment(count);
        // The entries are written (readable) when this returns; openraft learns
        // they are durable from the callback, after the group sync that covers
        // them. A follower answers its leader only after that callback; a
        // leader replicates the entries at once and counts itself in the
        // quorum after it (vendor/openraft/DROVER.md).
        let written = Instant::now();
        if let Some((first, last)) = first_last {
            self.appended.record(first, last, written);
        }
        self.store.write_durable(
            batch,
            Box::new(move |result: Result<(), String>| {
                crate::metrics::stages::record(crate::metrics::stages::Stage::LogSync, written.elapsed());
                callback.log_io_completed(result.map_err(io::Error::other));
            }),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.delete_ids(Table::Log, self.partition, log_id.index..u64::MAX);
        self.store.write_synced(batch);
        self.unapplied.drop_from(log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut batch = self.store.batch();
        batch.put(Table::Meta, meta_key(self.partition, PURGED), storage::encode(&log_id));
        self.purged.delete_below(&mut batch, Table::Log, self.partition, log_id.index + 1);
        self.store.write(batch);
        self.unapplied.drop_through(log_id.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
    }

    fn indexes_and_terms(entries: &[Entry<TypeConfig>]) -> Vec<(u64, u64)> {
        entries.iter().map(|e| (e.log_id.index, e.log_id.leader_id.term)).collect()
    }

    #[test]
    fn an_entrys_append_time_is_its_latest_appends_and_only_while_kept() {
        let times = AppendTimes::default();
        let start = Instant::now();
        let at = |ms: u64| start + std::time::Duration::from_millis(ms);
        times.record(1, 3, at(1));
        times.record(4, 4, at(2));
        times.record(5, 9, at(3));
        assert_eq!(times.appended_at(2), Some(at(1)));
        assert_eq!(times.appended_at(4), Some(at(2)));
        assert_eq!(times.appended_at(9), Some(at(3)));
        assert_eq!(times.appended_at(10), None, "never appended");
        // A new leader's entries overwrite the log from index 4 on.
        times.record(4, 5, at(4));
        assert_eq!(times.appended_at(3), Some(at(1)));
        assert_eq!(times.appended_at(5), Some(at(4)));
        assert_eq!(times.appended_at(6), None, "overwritten, and not appended again");
        // From 2 on, within what was the first append.
        times.record(2, 2, at(5));
        assert_eq!(times.appended_at(1), Some(at(1)));
        assert_eq!(times.appended_at(2), Some(at(5)));
        assert_eq!(times.appended_at(3), None);
        for n in 0..APPEND_TIMES_KEPT as u64 {
            times.record(10 + n, 10 + n, at(10 + n));
        }
        assert_eq!(times.appended_at(1), None, "forgotten past the bound");
        assert_eq!(times.appended_at(10 + APPEND_TIMES_KEPT as u64 - 1), Some(at(9 + APPEND_TIMES_KEPT as u64)));
    }

    #[test]
    fn apply_takes_whole_ranges_of_kept_entries_and_nothing_else() {
        let mut kept = Unapplied::default();
        for index in 1..=5 {
            kept.append(index, entry(1, index), 10);
        }
        assert_eq!(kept.take(1, 3).as_deref().map(indexes_and_terms), Some(vec![(1, 1), (2, 1)]));
        assert_eq!(kept.take(1, 3).map(|e| e.len()), None, "taken once: a second read goes to the database");
        assert!(kept.take(3, 7).is_none(), "6 was never kept");
        assert!(kept.take(3, u64::MAX).is_none(), "an open range is never complete");
        assert_eq!(kept.take(3, 6).as_deref().map(indexes_and_terms), Some(vec![(3, 1), (4, 1), (5, 1)]));
        assert_eq!((kept.entries.len(), kept.bytes), (0, 0));
    }

    #[test]
    fn kept_entries_follow_overwrites_truncation_and_purges() {
        let mut kept = Unapplied::default();
        for index in 1..=6 {
            kept.append(index, entry(1, index), 10);
        }
        // A new leader's entry overwrites 4 and everything after it.
        kept.append(4, entry(2, 4), 10);
        assert!(!kept.entries.contains_key(&5), "5 of the old term is gone with the overwrite");
        kept.append(5, entry(2, 5), 10);
        kept.drop_from(5);
        kept.drop_through(1);
        assert_eq!(kept.bytes, 30);
        assert!(kept.take(1, 3).is_none(), "1 was purged");
        assert_eq!(kept.take(2, 5).as_deref().map(indexes_and_terms), Some(vec![(2, 1), (3, 1), (4, 2)]));
        assert_eq!(kept.bytes, 0);
    }

    #[test]
    fn a_read_from_an_index_drops_what_was_kept_before_it() {
        let mut kept = Unapplied::default();
        for index in 1..=3 {
            kept.append(index, entry(1, index), 10);
        }
        assert!(kept.take(2, 5).is_none());
        assert_eq!(kept.bytes, 20, "1 dropped: apply has gone past it");
        assert!(kept.take(1, 2).is_none());
    }

    #[test]
    fn entries_past_the_bound_are_not_kept() {
        let mut kept = Unapplied::default();
        kept.append(1, entry(1, 1), UNAPPLIED_MAX_BYTES);
        kept.append(2, entry(1, 2), 1);
        assert!(kept.take(1, 3).is_none(), "2 did not fit");
        assert_eq!(kept.take(1, 2).map(|e| e.len()), Some(1), "the failed take dropped nothing at or after its start");
    }
}
