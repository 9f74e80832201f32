//! A partition's indexes: records of a table found by another key than
//! their id, under keys whose prefix is no partition's (see
//! `raft::state_machine::requests` and `raft::state_machine::retention`).

use rocksdb::{Direction, IteratorMode};

use super::{StorageError, Store, Table};
use crate::core::PartitionId;

/// What an index key's prefix has that no partition's has (partitions are
/// below 4096).
pub(super) const INDEX_PREFIX: PartitionId = 1 << 31;

/// A key of a partition's index in a table: records found by another key
/// than their id. Its prefix is no partition's, so the partition's records
/// and their scans never meet it.
pub fn index_key(partition: PartitionId, by: &[u8]) -> Vec<u8> {
    let mut k = (partition | INDEX_PREFIX).to_be_bytes().to_vec();
    k.extend_from_slice(by);
    k
}

impl Store {
    /// Visits the entries of a partition's index in a table ([`index_key`])
    /// that begin with `prefix`, from `prefix` + `from` on, in key order,
    /// while `visit` (given the rest of each key after `prefix`) answers true.
    pub fn scan_index(
        &self,
        table: Table,
        partition: PartitionId,
        prefix: &[u8],
        from: &[u8],
        mut visit: impl FnMut(&[u8]) -> Result<bool, StorageError>,
    ) -> Result<(), StorageError> {
        let within = index_key(partition, prefix);
        let mut start = within.clone();
        start.extend_from_slice(from);
        for item in self.db.iterator_cf(self.cf(table), IteratorMode::From(&start, Direction::Forward)) {
            let (k, _) = item?;
            if !k.starts_with(&within) || !visit(&k[within.len()..])? {
                break;
            }
        }
        Ok(())
    }

    /// The rest of the last key of a partition's index in a table that
    /// begins with `prefix` and whose rest is at most `to` (one seek, from
    /// the end), or None when no key of it begins with `prefix`.
    pub fn last_in_index(
        &self,
        table: Table,
        partition: PartitionId,
        prefix: &[u8],
        to: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let within = index_key(partition, prefix);
        let mut end = within.clone();
        end.extend_from_slice(to);
        // Stops at the prefix: a seek past it would walk every deleted key
        // below, back to a live one.
        let mut bounded = rocksdb::ReadOptions::default();
        bounded.set_iterate_lower_bound(within.clone());
        let mode = IteratorMode::From(&end, Direction::Reverse);
        match self.db.iterator_cf_opt(self.cf(table), bounded, mode).next() {
            Some(item) => {
                let (k, _) = item?;
                Ok(k.strip_prefix(within.as_slice()).map(<[u8]>::to_vec))
            }
            None => Ok(None),
        }
    }
}
