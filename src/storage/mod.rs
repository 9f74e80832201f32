//! The only module that talks to RocksDB.
//!
//! One RocksDB instance per node holds every partition's Raft log, Raft metadata
//! and job records, in column families keyed by a big-endian partition prefix. Column families share one WAL, so a batch that spans them is atomic.
//!
//! Durability: log appends are written at once, unsynced, then the
//! [`SyncWriter`], a thread that drains every append waiting from every
//! partition, syncs the WAL once for all of them before any caller is told its
//! append is durable (group commit).
//! State-machine writes are not synced: they carry their applied log id in the
//! same batch, so recovery always finds a consistent prefix and Raft re-applies
//! the rest from the synced log.
//!
//! Failures are never worked around. A database damaged anywhere but in the
//! torn last record of a WAL (a write that never finished, so was never
//! acknowledged) is refused at open with [`StorageError::Corrupt`]: recovering
//! around the damage would bring the node back with an older vote and a
//! shorter log than it promised its peers. A write or a WAL sync that fails
//! ends the process ([`writer::fail_stop`]): openraft cannot carry on a group
//! whose storage refused a write, and a node that keeps answering without its
//! groups is worse than one its supervisor restarts.

mod index;
mod mark;
mod migrate;
mod open;
mod prefix;
mod stats;
mod writer;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};

pub use index::index_key;
use index::INDEX_PREFIX;
pub use migrate::Migrated;
pub use open::MemoryBudget;
use open::COLUMN_FAMILIES;
pub use stats::CacheReads;
pub use writer::{fail_stop, SyncWriter};

use crate::core::PartitionId;

const CF_LOG: &str = "raft_log";
const CF_META: &str = "raft_meta";
const CF_JOBS: &str = "jobs";
const CF_DONE: &str = "jobs_done";
const CF_EXPIRY: &str = "jobs_expiry";
const CF_REQUESTS: &str = "requests";
const CF_SPECS: &str = "job_specs";
/// Added at data version 11: a database of an older build lacks it and
/// gets it at open.
const CF_EVENTS: &str = "job_events";

/// A storage failure. RocksDB errors are not something a client can fix, so they
/// surface as UNAVAILABLE/INTERNAL at the edge.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    #[error(
        "the database in {} is damaged ({damage}). Drover does not open a damaged database: recovering around \
         the damage could forget votes and log entries this node acknowledged. Re-seed this node from its peers \
         (docs/operations.md, \"Re-seeding a node\").",
        dir.display()
    )]
    Corrupt { dir: PathBuf, damage: String },
    #[error("{0}")]
    Codec(#[from] crate::codec::CodecError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Which column family a record lives in.
#[derive(Clone, Copy, Debug)]
pub enum Table {
    /// Raft log entries by (partition, index).
    Log,
    /// Raft vote, purge point, committed id, applied state, by (partition, name).
    Meta,
    /// Non-final job records by (partition, key).
    Jobs,
    /// Completed and cancelled job records by (partition, key), and (data
    /// version 10 on) an empty entry per record under an [`index_key`] of
    /// (tenant, key); see `raft::state_machine::retention`.
    Done,
    /// The order final records are pruned in: (partition, finish sequence) ->
    /// (finished at, job key, and from data version 10 its tenant); see
    /// `raft::state_machine::retention`.
    Expiry,
    /// Remembered creates by (partition, storage id: expiry time, then a
    /// sequence number) -> (request id, the job it made), and (data version
    /// 10 on) the same by request id, under [`index_key`]s ->
    /// (storage id, the job it made); see `raft::state_machine::requests`.
    Requests,
    /// Job specs by (partition, key), live and final: the part of a job
    /// [`Table::Jobs`] and [`Table::Done`] records leave out (see
    /// `raft::records`).
    Specs,
    /// Lifecycle events by (partition, the log index of the entry that made
    /// them), kept for the retention window; see `raft::state_machine::events`.
    Events,
}

impl Table {
    pub const ALL: [Table; 8] = [
        Table::Log,
        Table::Meta,
        Table::Jobs,
        Table::Done,
        Table::Expiry,
        Table::Requests,
        Table::Specs,
        Table::Events,
    ];

    /// Its column family's name.
    pub fn cf_name(self) -> &'static str {
        match self {
            Table::Log => CF_LOG,
            Table::Meta => CF_META,
            Table::Jobs => CF_JOBS,
            Table::Done => CF_DONE,
            Table::Expiry => CF_EXPIRY,
            Table::Requests => CF_REQUESTS,
            Table::Specs => CF_SPECS,
            Table::Events => CF_EVENTS,
        }
    }
}

/// A key in any table: partition prefix, then an 8-byte id or a name.
pub fn key(partition: PartitionId, id: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&partition.to_be_bytes());
    k[4..].copy_from_slice(&id.to_be_bytes());
    k
}

pub fn meta_key(partition: PartitionId, name: &str) -> Vec<u8> {
    let mut k = partition.to_be_bytes().to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

fn id_of(key: &[u8]) -> u64 {
    u64::from_be_bytes(key[4..12].try_into().expect("12-byte key"))
}

/// The node's RocksDB and its WAL group-commit writer.
pub struct Store {
    db: Arc<DB>,
    /// The options the database was opened with: they hold its statistics.
    options: Options,
    /// Key and value bytes put since open, by table (see [`Store::put_bytes`]).
    put_bytes: [AtomicU64; Table::ALL.len()],
    writer: SyncWriter,
    /// Dropped after the writer, so it writes down the writer's last sync.
    _mark: mark::MarkWriter,
}

/// Bytes a node's database wrote, by where they went (see [`Store::written`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Written {
    /// Keys and values of the write batches (RocksDB's `rocksdb.bytes.written`).
    pub user: u64,
    /// To the WAL, framing included.
    pub wal: u64,
    /// To table files by memtable flushes.
    pub flush: u64,
    /// To table files by compactions.
    pub compaction: u64,
}

impl Written {
    /// `(kind, bytes)` in the order a write meets them.
    pub fn kinds(&self) -> [(&'static str, u64); 4] {
        [("user", self.user), ("wal", self.wal), ("flush", self.flush), ("compaction", self.compaction)]
    }
}

/// How far a table's records of one partition are deleted from its start, so
/// each deletion covers only what is new. RocksDB keeps range deletions until
/// compaction and, at each memtable switch, fragments overlapping ones into a
/// piece per pair: ranges that each began at 0 took memory quadratic in their
/// number (nodes grew to 12 GiB in two minutes at 1,000 jobs/s). 0 after a
/// start, so the first deletion covers whatever an earlier run left.
#[derive(Clone, Debug, Default)]
pub struct DeletedBelow(u64);

impl DeletedBelow {
    /// Deletes the partition's ids below `end` in `table` that are not yet deleted.
    pub fn delete_below(&mut self, batch: &mut Batch<'_>, table: Table, partition: PartitionId, end: u64) {
        if end > self.0 {
            batch.delete_ids(table, partition, self.0..end);
            self.0 = end;
        }
    }
}

/// Atomic multi-table writes, built by callers and committed with [`Store::write`]
/// or [`Store::write_synced`].
pub struct Batch<'a> {
    store: &'a Store,
    inner: WriteBatch,
    /// Key and value bytes put, by table.
    put_bytes: [u64; Table::ALL.len()],
}

impl Batch<'_> {
    pub fn put(&mut self, table: Table, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let cf = self.store.cf(table);
        let (key, value) = (key.as_ref(), value.as_ref());
        self.put_bytes[table as usize] += (key.len() + value.len()) as u64;
        self.inner.put_cf(cf, key, value);
    }
    pub fn delete(&mut self, table: Table, key: impl AsRef<[u8]>) {
        let cf = self.store.cf(table);
        self.inner.delete_cf(cf, key);
    }
    /// Deletes ids `range` of a partition in a table, as one range deletion.
    /// For clearing a table or a stretch too long to name key by key: RocksDB
    /// fragments every range deletion of a memtable when it flushes and again
    /// in compactions, and with one per apply that took tens of MiB for a
    /// moment at each flush (docs/benchmarks.md). Steady deletions name their
    /// keys ([`Batch::delete`]).
    pub fn delete_ids(&mut self, table: Table, partition: PartitionId, range: Range<u64>) {
        let cf = self.store.cf(table);
        self.inner.delete_range_cf(cf, key(partition, range.start), key(partition, range.end));
    }
}

impl Batch<'_> {
    /// Deletes every record of `partition` in every table, its indexes
    /// included: a replica the cluster plan moved to other nodes.
    pub fn delete_partition(&mut self, partition: PartitionId) {
        for table in Table::ALL {
            let cf = self.store.cf(table);
            self.inner.delete_range_cf(cf, partition.to_be_bytes(), (partition + 1).to_be_bytes());
            self.delete_index(table, partition);
        }
    }

    /// Deletes a partition's whole index in a table ([`index_key`]).
    pub fn delete_index(&mut self, table: Table, partition: PartitionId) {
        let cf = self.store.cf(table);
        let (from, to) = ((partition | INDEX_PREFIX).to_be_bytes(), ((partition + 1) | INDEX_PREFIX).to_be_bytes());
        self.inner.delete_range_cf(cf, from, to);
    }
}

impl Store {
    fn cf(&self, table: Table) -> &rocksdb::ColumnFamily {
        // Column families are created at open and never dropped.
        self.db.cf_handle(table.cf_name()).expect("column family exists")
    }

    pub fn batch(&self) -> Batch<'_> {
        Batch { store: self, inner: WriteBatch::default(), put_bytes: [0; Table::ALL.len()] }
    }

    /// Writes without syncing the WAL (state-machine writes; see the module
    /// doc). A failed write ends the process.
    pub fn write(&self, batch: Batch<'_>) {
        self.write_with(batch, false, "write");
    }

    /// Writes and syncs before returning (votes, truncations, snapshot
    /// installs). Blocking. A failed write or sync ends the process.
    pub fn write_synced(&self, batch: Batch<'_>) {
        self.write_with(batch, true, "synced write");
    }

    /// Writes the batch now (readable when this returns) and hands it to the
    /// group-commit writer; `done` runs once a WAL sync covers it. A failed
    /// write or sync ends the process, so `done` never hears of one.
    pub fn write_durable(&self, batch: Batch<'_>, done: writer::Completion) {
        self.write_with(batch, false, "write");
        self.writer.sync(done);
    }

    fn write_with(&self, batch: Batch<'_>, sync: bool, what: &str) {
        for (total, bytes) in self.put_bytes.iter().zip(batch.put_bytes) {
            if bytes > 0 {
                total.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(sync && !writer::skip_wal_sync());
        if let Err(e) = self.db.write_opt(batch.inner, &opts) {
            writer::fail_stop(what, &e);
        }
    }

    pub fn get(&self, table: Table, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.db.get_cf(self.cf(table), key)?)
    }

    /// Values of ids `range` of a partition, in order.
    pub fn scan(
        &self,
        table: Table,
        partition: PartitionId,
        range: Range<u64>,
    ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let cf = self.cf(table);
        let start = key(partition, range.start);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item?;
            if k.len() != 12 || k[..4] != partition.to_be_bytes() {
                break;
            }
            let id = id_of(&k);
            if id >= range.end {
                break;
            }
            out.push((id, v.into_vec()));
        }
        Ok(out)
    }

    /// Visits the records of a partition in a table from id `from`, in id
    /// order, while `visit` answers true.
    pub fn scan_while(
        &self,
        table: Table,
        partition: PartitionId,
        from: u64,
        mut visit: impl FnMut(u64, &[u8]) -> Result<bool, StorageError>,
    ) -> Result<(), StorageError> {
        let start = key(partition, from);
        for item in self.db.iterator_cf(self.cf(table), IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item?;
            if k.len() != 12 || k[..4] != partition.to_be_bytes() || !visit(id_of(&k), &v)? {
                break;
            }
        }
        Ok(())
    }

    /// Visits every record of a partition in a table, in id order.
    pub fn for_each(
        &self,
        table: Table,
        partition: PartitionId,
        visit: impl FnMut(u64, &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let start = key(partition, 0);
        visit_partition(
            self.db.iterator_cf(self.cf(table), IteratorMode::From(&start, Direction::Forward)),
            partition,
            visit,
        )
    }

    /// The highest id of a partition in a table, with its value.
    pub fn last(&self, table: Table, partition: PartitionId) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let cf = self.cf(table);
        let end = key(partition, u64::MAX);
        let mut iter = self.db.iterator_cf(cf, IteratorMode::From(&end, Direction::Reverse));
        match iter.next() {
            Some(item) => {
                let (k, v) = item?;
                if k.len() == 12 && k[..4] == partition.to_be_bytes() {
                    Ok(Some((id_of(&k), v.into_vec())))
                } else {
                    Ok(None)
                }
            }
            None => Ok(None),
        }
    }

    /// A consistent point-in-time view: reads through it see exactly the
    /// writes made before it was taken, however long they take.
    pub fn point_in_time(&self) -> PointInTime<'_> {
        PointInTime { store: self, snapshot: self.db.snapshot() }
    }

    /// RocksDB's own figures for the admin metrics.
    pub fn property(&self, name: &str) -> Option<u64> {
        self.db.property_int_value(name).ok().flatten()
    }

    /// A per-column-family integer property summed over every table (and
    /// the default column family): RocksDB answers sizes such as
    /// `rocksdb.cur-size-all-mem-tables` for one column family at a time.
    pub fn property_total(&self, name: &str) -> Option<u64> {
        Some(self.property(name)? + self.table_properties(name).sum::<u64>())
    }

    /// A property of what the tables share (the block cache), read through
    /// them: the default column family has no table options of ours.
    pub fn property_shared(&self, name: &str) -> Option<u64> {
        self.table_properties(name).max()
    }

    fn table_properties<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u64> + 'a {
        Table::ALL
            .into_iter()
            .filter_map(move |table| self.db.property_int_value_cf(self.cf(table), name).ok().flatten())
    }

    /// Bytes written since the database was opened, from RocksDB's own
    /// statistics.
    pub fn written(&self) -> Written {
        use rocksdb::statistics::Ticker;
        let ticker = |t| self.options.get_ticker_count(t);
        Written {
            user: ticker(Ticker::BytesWritten),
            wal: ticker(Ticker::WalFileBytes),
            flush: ticker(Ticker::FlushWriteBytes),
            compaction: ticker(Ticker::CompactWriteBytes),
        }
    }

    /// Records read since open, by point reads and by iterator steps (for
    /// tests of what a read touches).
    #[cfg(test)]
    pub fn records_read(&self) -> u64 {
        use rocksdb::statistics::Ticker;
        let ticker = |t| self.options.get_ticker_count(t);
        ticker(Ticker::NumberKeysRead) + ticker(Ticker::NumberDbNext) + ticker(Ticker::NumberDbSeek)
    }

    /// Key and value bytes put into each table since open: where the
    /// user bytes of [`Store::written`] come from (deletes not counted).
    pub fn put_bytes(&self) -> [(Table, u64); Table::ALL.len()] {
        Table::ALL.map(|table| (table, self.put_bytes[table as usize].load(Ordering::Relaxed)))
    }

    pub fn sync_stats(&self) -> writer::SyncStats {
        self.writer.stats()
    }

    /// Syncs the WAL (on graceful shutdown, and before the node records that
    /// it formed). A failed sync ends the process.
    pub fn flush(&self) {
        if let Err(e) = self.db.flush_wal(true) {
            writer::fail_stop("WAL sync", &e);
        }
    }

    /// Range deletions in a table's files, from RocksDB's aggregated table
    /// properties (memtables not counted: flush them first).
    #[cfg(test)]
    pub(crate) fn range_deletions_in_files(&self, table: Table) -> u64 {
        let properties = self.db.property_value_cf(self.cf(table), "rocksdb.aggregated-table-properties");
        let properties = properties.expect("read table properties").unwrap_or_default();
        let count = properties.split(';').find_map(|p| p.trim().strip_prefix("# range deletions="));
        count.and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    /// Writes every memtable to table files (on graceful shutdown), so the
    /// next start replays no WAL. A failure is logged: the WAL still holds
    /// everything, synced.
    pub fn flush_memtables(&self) {
        for name in COLUMN_FAMILIES {
            let cf = self.db.cf_handle(name).expect("column family exists");
            if let Err(e) = self.db.flush_cf(cf) {
                tracing::warn!(column_family = name, "writing memtables to table files at shutdown failed: {e}");
                return;
            }
        }
    }
}

/// A point-in-time view that holds its store, so it can move to another
/// task (a backup written after the apply that took it).
pub struct OwnedPointInTime {
    // Declared before the store it borrows from: fields drop in order.
    view: PointInTime<'static>,
    _store: Arc<Store>,
}

impl std::ops::Deref for OwnedPointInTime {
    type Target = PointInTime<'static>;

    fn deref(&self) -> &PointInTime<'static> {
        &self.view
    }
}

impl Store {
    /// [`Store::point_in_time`], holding the store.
    pub fn owned_point_in_time(self: &Arc<Self>) -> OwnedPointInTime {
        let view = self.point_in_time();
        // SAFETY: the view borrows `*self`, which the Arc kept beside it holds
        // alive, at the same address (it is on the heap), until after the view
        // is dropped (fields drop in declaration order). The view's borrow is
        // private, so nothing takes the extended lifetime out of it.
        let view = unsafe { std::mem::transmute::<PointInTime<'_>, PointInTime<'static>>(view) };
        OwnedPointInTime { view, _store: Arc::clone(self) }
    }
}

/// See [`Store::point_in_time`].
pub struct PointInTime<'a> {
    store: &'a Store,
    snapshot: rocksdb::Snapshot<'a>,
}

impl PointInTime<'_> {
    pub fn get(&self, table: Table, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.snapshot.get_cf(self.store.cf(table), key)?)
    }

    /// Visits every record of a partition in a table as of the snapshot.
    pub fn for_each(
        &self,
        table: Table,
        partition: PartitionId,
        visit: impl FnMut(u64, &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let start = key(partition, 0);
        let iter = self.snapshot.iterator_cf(self.store.cf(table), IteratorMode::From(&start, Direction::Forward));
        visit_partition(iter, partition, visit)
    }
}

/// Feeds `visit` the records of one partition from an iterator positioned at
/// its first key.
fn visit_partition<I>(
    iter: I,
    partition: PartitionId,
    mut visit: impl FnMut(u64, &[u8]) -> Result<(), StorageError>,
) -> Result<(), StorageError>
where
    I: Iterator<Item = Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
{
    for item in iter {
        let (k, v) = item?;
        if k.len() != 12 || k[..4] != partition.to_be_bytes() {
            break;
        }
        visit(id_of(&k), &v)?;
    }
    Ok(())
}

/// `value` as records are stored: versioned bincode ([`crate::codec`]).
pub fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    crate::codec::encode(value)
}

pub fn decode<T: serde::de::DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StorageError> {
    Ok(crate::codec::decode(what, bytes)?)
}

/// Decodes a value from `reader`, reading at most `limit` bytes (what the
/// input holds): a corrupt or hostile length prefix is an error, never an
/// allocation of the size it claims. Same encoding as [`decode`].
pub fn decode_bounded<T: serde::de::DeserializeOwned>(
    what: &'static str,
    reader: impl std::io::Read,
    limit: u64,
) -> Result<T, StorageError> {
    Ok(crate::codec::decode_bounded(what, reader, limit)?)
}

/// Decodes a value from the front of `bytes` and advances past it.
pub fn decode_from<T: serde::de::DeserializeOwned>(what: &'static str, bytes: &mut &[u8]) -> Result<T, StorageError> {
    Ok(crate::codec::decode_from(what, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::open::MEMTABLE_INSERT_HINT;
    use super::*;

    #[test]
    fn a_length_past_the_input_is_an_error_not_an_allocation() {
        // A byte string, a text and a list each claiming 2^60 items, then 8 bytes.
        let mut bytes = (1u64 << 60).to_le_bytes().to_vec();
        bytes.extend([7u8; 8]);
        let limit = bytes.len() as u64;
        assert!(decode_bounded::<bytes::Bytes>("bytes", &bytes[..], limit).is_err());
        assert!(decode_bounded::<String>("text", &bytes[..], limit).is_err());
        assert!(decode_bounded::<Vec<crate::core::Job>>("jobs", &bytes[..], limit).is_err());
        // What fits decodes as before.
        let job = crate::core::JobSpec { job_type: "t".into(), ..Default::default() };
        let encoded = encode(&job);
        let back: crate::core::JobSpec = decode_bounded("spec", &encoded[..], encoded.len() as u64).unwrap();
        assert_eq!(back, job);
    }

    #[test]
    fn deletes_below_cover_each_id_once_and_never_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut batch = store.batch();
        for id in 0..10 {
            batch.put(Table::Log, key(3, id), [1]);
        }
        store.write(batch);
        let mut deleted = DeletedBelow::default();
        let left = |store: &Store| store.scan(Table::Log, 3, 0..u64::MAX).unwrap().len();
        for (end, expected) in [(4, 6), (2, 6), (7, 3), (7, 3)] {
            let mut batch = store.batch();
            deleted.delete_below(&mut batch, Table::Log, 3, end);
            store.write(batch);
            assert_eq!(left(&store), expected, "after deleting below {end}");
        }
        // Only what is new is in a batch: an id written again below the mark stays.
        let mut batch = store.batch();
        batch.put(Table::Log, key(3, 1), [2]);
        store.write(batch);
        let mut batch = store.batch();
        deleted.delete_below(&mut batch, Table::Log, 3, 8);
        store.write(batch);
        let ids: Vec<u64> = store.scan(Table::Log, 3, 0..u64::MAX).unwrap().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, vec![1, 8, 9]);
    }

    #[test]
    fn bytes_written_are_counted_by_table_and_by_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let before = store.written();
        let mut batch = store.batch();
        batch.put(Table::Jobs, key(1, 7), [0u8; 100]);
        batch.put(Table::Done, key(1, 8), [0u8; 50]);
        batch.delete(Table::Jobs, key(1, 6));
        store.write(batch);
        let put: Vec<(&str, u64)> = store.put_bytes().iter().map(|(t, b)| (t.cf_name(), *b)).collect();
        assert!(put.contains(&(CF_JOBS, 112)), "{put:?}");
        assert!(put.contains(&(CF_DONE, 62)), "{put:?}");
        assert!(put.contains(&(CF_LOG, 0)), "{put:?}");
        let after = store.written();
        // RocksDB counts the batch's records (keys, values, framing), and the WAL as much again.
        assert!(after.user >= before.user + 174, "{before:?} -> {after:?}");
        assert!(after.wal >= before.wal + 174, "{before:?} -> {after:?}");
    }

    #[test]
    fn the_recovery_and_memtable_options_reach_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        // RocksDB writes the options it opened with to OPTIONS-<number>.
        let options: String = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .map(|path| std::fs::read_to_string(path).unwrap())
            .collect();
        for option in
            ["wal_recovery_mode=kTolerateCorruptedTailRecords", "track_and_verify_wals=true", "paranoid_checks=true"]
        {
            assert!(options.contains(option), "{option} is not in\n{options}");
        }
        // Every column family inserts into its memtable from a per-partition hint.
        let hinted = options.matches(MEMTABLE_INSERT_HINT).count();
        assert_eq!(hinted, COLUMN_FAMILIES.len(), "column families with the insert hint in\n{options}");
    }
}
