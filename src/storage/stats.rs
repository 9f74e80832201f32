//! What RocksDB's statistics say about reads through the block cache, for
//! the node's metrics: a filter or index that no longer stays in the cache
//! shows as bytes loaded growing with every lookup.

use rocksdb::statistics::Ticker;

use super::Store;

/// Block cache lookups of one kind of block since the database was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheReads {
    pub hits: u64,
    pub misses: u64,
    /// Bytes read from table files into the cache (one block per miss).
    pub loaded_bytes: u64,
}

impl Store {
    /// Block cache lookups by kind of block: `filter`, `index` and `data`.
    pub fn block_cache_reads(&self) -> [(&'static str, CacheReads); 3] {
        let read = |hit, miss, inserted| CacheReads {
            hits: self.options.get_ticker_count(hit),
            misses: self.options.get_ticker_count(miss),
            loaded_bytes: self.options.get_ticker_count(inserted),
        };
        [
            (
                "filter",
                read(Ticker::BlockCacheFilterHit, Ticker::BlockCacheFilterMiss, Ticker::BlockCacheFilterBytesInsert),
            ),
            (
                "index",
                read(Ticker::BlockCacheIndexHit, Ticker::BlockCacheIndexMiss, Ticker::BlockCacheIndexBytesInsert),
            ),
            ("data", read(Ticker::BlockCacheDataHit, Ticker::BlockCacheDataMiss, Ticker::BlockCacheDataBytesInsert)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::super::{key, Table};
    use super::*;

    fn reads(store: &Store, kind: &str) -> CacheReads {
        store.block_cache_reads().into_iter().find(|(k, _)| *k == kind).unwrap().1
    }

    #[test]
    fn a_read_from_a_table_file_loads_its_block_once_and_then_hits_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut batch = store.batch();
        for id in 0..1_000 {
            batch.put(Table::Jobs, key(1, id), [id as u8; 100]);
        }
        store.write(batch);
        store.db.flush_cf(store.cf(Table::Jobs)).unwrap();
        let before = reads(&store, "data");
        assert!(store.get(Table::Jobs, key(1, 500)).unwrap().is_some());
        let first = reads(&store, "data");
        assert_eq!(first.misses, before.misses + 1, "{before:?} -> {first:?}");
        assert!(first.loaded_bytes > before.loaded_bytes, "{before:?} -> {first:?}");
        // The same key again: its block is in the cache now.
        assert!(store.get(Table::Jobs, key(1, 500)).unwrap().is_some());
        let second = reads(&store, "data");
        assert_eq!((second.hits, second.misses), (first.hits + 1, first.misses), "{first:?} -> {second:?}");
        assert_eq!(second.loaded_bytes, first.loaded_bytes);
    }
}
