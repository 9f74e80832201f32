//! Opening the node's database: the options every column family gets, the
//! memory budget, and the checks that refuse a damaged database instead of
//! recovering around the damage (see the module doc of [`super`]).

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBRecoveryMode, Options, DB};

use super::{
    mark, StorageError, Store, SyncWriter, CF_DONE, CF_EVENTS, CF_EXPIRY, CF_JOBS, CF_LOG, CF_META, CF_REQUESTS,
    CF_SPECS,
};

/// What RocksDB may hold in memory: the two budgets that decide most of a
/// node's resident memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Memtables of every column family together; past it the largest is
    /// flushed.
    pub memtables: usize,
    /// The block cache shared by every column family (data, index and filter
    /// blocks).
    pub block_cache: usize,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget { memtables: 64 << 20, block_cache: 32 << 20 }
    }
}

impl Drop for Store {
    /// Writes and syncs the WAL records still in RocksDB's buffer (unsynced
    /// writes since the last group commit, see `set_manual_wal_flush`).
    /// RocksDB would write them to the file as it closes, but not sync them:
    /// a clean stop followed by a power cut keeps them this way.
    fn drop(&mut self) {
        if let Err(e) = self.db.flush_wal(!super::writer::skip_wal_sync()) {
            tracing::warn!("flushing the WAL as the database closes failed: {e}");
        }
    }
}

impl Store {
    /// Opens (creating if needed) the node's database under `dir`, with the
    /// default memory budget.
    pub fn open(dir: &Path) -> Result<Arc<Store>, StorageError> {
        Store::open_with(dir, MemoryBudget::default())
    }

    /// Opens (creating if needed) the node's database under `dir`.
    pub fn open_with(dir: &Path, memory: MemoryBudget) -> Result<Arc<Store>, StorageError> {
        std::fs::create_dir_all(dir)?;
        // RocksDB syncs its own directory, not the entry that names it: sync
        // the parent too, so a power failure cannot take the whole database
        // away with an unsynced directory entry.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(parent)?.sync_all()?;
        }
        let mut opts = recovery_options()?;
        opts.create_if_missing(true);
        // Column families are created with the database; an existing one may
        // lack only those added later (see `check_column_families`).
        check_column_families(dir)?;
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        opts.set_bytes_per_sync(1 << 20);
        opts.set_max_total_wal_size(256 << 20);
        opts.set_keep_log_file_num(4);
        // WAL records wait in RocksDB's buffer until the group-commit thread
        // flushes and syncs them (or a synced write does), instead of each
        // write making its own `write(2)`: an append, its apply and the commit
        // index written after it reach the file in one call. Nothing that was
        // acknowledged depends on an unsynced write reaching the page cache: a
        // power cut loses those anyway, and a restart re-applies from the log.
        opts.set_manual_wal_flush(true);
        // Memory is bounded, not grown with the data: memtables of every
        // column family share one budget, and block, index and filter blocks
        // share one cache (by default each column family would get its own
        // cache, and index blocks would sit outside any, growing with files).
        opts.set_db_write_buffer_size(memory.memtables);
        // Counters only (no histograms or timers): what `written` reports.
        opts.enable_statistics();
        opts.set_statistics_level(rocksdb::statistics::StatsLevel::ExceptHistogramOrTimers);
        let cache = rocksdb::Cache::new_lru_cache(memory.block_cache);
        // One column family's memtable is at most half the budget, so that a
        // full one is flushed while the next fills.
        let memtable = (memory.memtables / 2).min(16 << 20);
        // A memtable insert starts from where the last one with the same
        // 4-byte prefix (the partition) went, not from the skip list's top:
        // a table's keys mostly arrive in order within a partition (job keys,
        // log indexes, expiry-ordered ids), so most inserts are found in a
        // step or two. It took 2-3% of the CPU off a 3-node throughput run.
        let column_family_base = Options::default().get_options_from_string(MEMTABLE_INSERT_HINT)?;
        let cf = |name: &str| {
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_block_cache(&cache);
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            // A table file's index and filter come in 4 KiB partitions under
            // a small top level that stays pinned, so a lookup loads one
            // partition of each. Whole, they grow with the file, and RocksDB
            // pins them only for files about a memtable's size: once a
            // compaction's file had a filter larger than a shard of the cache
            // (512 KiB of the default 32 MiB), every lookup read it from the
            // file and checksummed it again, and a 3-node throughput run fell
            // from 40,000 to 11,000 jobs/s after 300,000 jobs
            // (docs/benchmarks.md).
            table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
            table.set_partition_filters(true);
            table.set_metadata_block_size(4096);
            table.set_pin_top_level_index_and_filter(true);
            let mut cf_opts = column_family_base.clone();
            if name == CF_REQUESTS {
                // Nearly every lookup there is of a request not remembered
                // (a create made once): filters on the memtable and on each
                // table file answer most without a search.
                table.set_bloom_filter(10.0, false);
                cf_opts.set_memtable_prefix_bloom_ratio(0.05);
                cf_opts.set_memtable_whole_key_filtering(true);
            }
            cf_opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
            cf_opts.set_write_buffer_size(memtable);
            cf_opts.set_block_based_table_factory(&table);
            ColumnFamilyDescriptor::new(name, cf_opts)
        };
        let cfs = COLUMN_FAMILIES.map(cf);
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| opening_error(dir, e))?;
        let corrupt = |damage: String| StorageError::Corrupt { dir: dir.to_path_buf(), damage };
        verify_checksums(&db).map_err(|message| {
            if is_damage(&message) {
                corrupt(message)
            } else {
                StorageError::Io(std::io::Error::other(message))
            }
        })?;
        // A WAL cut short opens like one whose last write was torn; the
        // synced mark tells them apart (see `mark`).
        let marked = mark::read(dir).map_err(corrupt)?;
        let recovered = db.latest_sequence_number();
        if let Some(marked) = marked.filter(|&m| m > recovered) {
            return Err(corrupt(format!(
                "the WAL was synced up to sequence {marked} before the node stopped, but the database recovered only \
                 up to {recovered}: a WAL lost writes that were synced and acknowledged (cut short or deleted)"
            )));
        }
        let synced = Arc::new(mark::Synced::default());
        let mark = mark::MarkWriter::start(dir, Arc::clone(&synced), marked.unwrap_or(recovered))?;
        let db = Arc::new(db);
        let writer = SyncWriter::start(Arc::clone(&db), synced);
        Ok(Arc::new(Store { db, options: opts, put_bytes: Default::default(), writer, _mark: mark }))
    }
}

/// Whether a RocksDB error says the database is damaged: a record or block
/// that fails its checksum, or a file the database lists but cannot find (a
/// deleted SST, MANIFEST or WAL), which is damage too, not an I/O hiccup.
fn is_damage(message: &str) -> bool {
    message.starts_with("Corruption") || message.contains("No such file or directory")
}

/// An error from opening the database in `dir`: damage, or RocksDB's own.
fn opening_error(dir: &Path, error: rocksdb::Error) -> StorageError {
    if is_damage(error.as_ref()) {
        StorageError::Corrupt { dir: dir.to_path_buf(), damage: error.into_string() }
    } else {
        StorageError::RocksDb(error)
    }
}

/// The names of every column family, in the order they are created.
pub(super) const COLUMN_FAMILIES: [&str; 8] =
    [CF_LOG, CF_META, CF_JOBS, CF_DONE, CF_EXPIRY, CF_REQUESTS, CF_SPECS, CF_EVENTS];

/// Column families a database of an older build may lack: made at open.
const ADDED_LATER: [&str; 1] = [CF_EVENTS];

/// Checks that a database in `dir`, if there is one, lists every column
/// family (but those added later). A MANIFEST cut short at a record boundary opens without error but
/// without the records that created the last column families, and RocksDB
/// would create them again, empty, and skip their records in the WAL as
/// belonging to dropped families: the node would start with its jobs gone
/// but its Raft log saying they were applied. A database whose files are
/// there without `CURRENT` (which names the MANIFEST) is damaged too, not new.
fn check_column_families(dir: &Path) -> Result<(), StorageError> {
    let corrupt = |damage: String| StorageError::Corrupt { dir: dir.to_path_buf(), damage };
    if !dir.join("CURRENT").exists() {
        let database_files = std::fs::read_dir(dir)?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with("MANIFEST-") || name.ends_with(".sst") || name.ends_with(".log"))
            .count();
        if database_files > 0 {
            return Err(corrupt(format!("{database_files} database files but no CURRENT file naming the MANIFEST")));
        }
        return Ok(());
    }
    let listed = DB::list_cf(&Options::default(), dir).map_err(|e| opening_error(dir, e))?;
    let missing: Vec<&str> = COLUMN_FAMILIES
        .into_iter()
        .filter(|name| !listed.iter().any(|l| l == name) && !ADDED_LATER.contains(name))
        .collect();
    if !missing.is_empty() {
        return Err(corrupt(format!(
            "the MANIFEST does not list the column families {missing:?}, which every Drover database has: it was \
             cut short or replaced"
        )));
    }
    Ok(())
}

/// Verifies the checksum of every block of every live table file (RocksDB's
/// `VerifyChecksum`: data, index and meta blocks), so a flipped bit in a
/// table file refuses the open instead of surfacing later as a failed read
/// or a failed compaction on a node that already voted and led from the file.
/// A scan of the records would not do: it skips blocks whose keys a range
/// deletion covers (purged log entries), which compaction still reads. It
/// reads every table file once per start (about a second per GB), with the
/// block cache bypassed.
fn verify_checksums(db: &DB) -> Result<(), String> {
    use rocksdb::AsRawPtr;
    let started = std::time::Instant::now();
    let mut error: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: `db` is open for the whole call; `error` is null or set by
    // RocksDB to a C string that is freed with `rocksdb_free` below.
    unsafe {
        librocksdb_sys::rocksdb_verify_checksum(db.as_raw_ptr(), &mut error);
        if !error.is_null() {
            let message = std::ffi::CStr::from_ptr(error).to_string_lossy().into_owned();
            librocksdb_sys::rocksdb_free(error.cast());
            return Err(message);
        }
    }
    let files = db.live_files().map(|files| files.len()).unwrap_or_default();
    tracing::info!(
        table_files = files,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "storage checksums verified"
    );
    Ok(())
}

/// The options that decide what a restart recovers. After a crash only a torn
/// last record of a WAL is dropped (a write that never completed, so was never
/// synced or acknowledged); any other damage fails the open:
/// - `TolerateCorruptedTailRecords`, not RocksDB's default `PointInTime`, which
///   stops replaying at the first bad record and opens without everything
///   after it: synced votes and acknowledged entries included.
/// - `track_and_verify_wals` (the rust crate has no setter for it, so it is
///   set by name): every new WAL records its predecessor's size and last
///   sequence number, so a missing or cut-short WAL fails the open instead of
///   leaving a hole.
/// - `paranoid_checks`, the default, set because fail-stop relies on it: a
///   failed WAL write or sync becomes a background error that fails every
///   later write and sync, so nothing written after it is acknowledged.
fn recovery_options() -> Result<Options, StorageError> {
    let mut opts = Options::default().get_options_from_string("track_and_verify_wals=true")?;
    opts.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
    opts.set_paranoid_checks(true);
    Ok(opts)
}

/// Every column family's memtable inserts start from the last insert with
/// the same partition prefix (see [`Store::open_with`]).
pub(super) const MEMTABLE_INSERT_HINT: &str = "memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.4";

#[cfg(test)]
mod tests {
    use super::super::{key, Table};
    use super::*;

    /// A lookup of a key a large table file does not hold reads a few KiB
    /// of that file's filter and index, not all of it, even when the whole
    /// filter would not fit in a shard of the cache.
    #[test]
    fn a_lookup_in_a_large_table_file_loads_a_partition_of_its_filter_not_all_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // One cache shard of 64 KiB, and 2 MiB memtables; the file's whole
        // filter is about 125 KB.
        let store = Store::open_with(dir.path(), MemoryBudget { memtables: 4 << 20, block_cache: 64 << 10 }).unwrap();
        let mut batch = store.batch();
        for id in (0..200_000u64).step_by(2) {
            let value: Vec<u8> =
                (0..8).flat_map(|i| id.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i * 8).to_le_bytes()).collect();
            batch.put(Table::Requests, key(1, id), value);
        }
        store.write(batch);
        let cf = store.cf(Table::Requests);
        store.db.flush_cf(cf).unwrap();
        // One file of several memtables' size: RocksDB pins the filter of a
        // file about a memtable's size (a flush's), not of this one.
        store.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        let loaded = || {
            let reads = store.block_cache_reads();
            reads.iter().filter(|(block, _)| *block != "data").map(|(_, reads)| reads.loaded_bytes).sum::<u64>()
        };
        let before = loaded();
        let lookups = 200;
        for n in 0..lookups {
            // Odd ids: inside the file's key range, never written.
            assert_eq!(store.get(Table::Requests, key(1, (2 * 997 * n) % 200_000 + 1)).unwrap(), None);
        }
        let per_lookup = (loaded() - before) / lookups;
        assert!(per_lookup <= 16 << 10, "each lookup loaded {per_lookup} bytes of filter and index into the cache");
    }
}
