//! Records named by a key prefix rather than an id (a partition's
//! workflows, one record each): visiting and deleting them by prefix.

use rocksdb::{Direction, IteratorMode};

use super::{Batch, StorageError, Store, Table};

impl Store {
    /// Visits every key of a table that begins with `prefix`, in key order,
    /// with the rest of its key and its value.
    pub fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        for item in self.db.iterator_cf(self.cf(table), IteratorMode::From(prefix, Direction::Forward)) {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            visit(&k[prefix.len()..], &v)?;
        }
        Ok(())
    }
}

impl Batch<'_> {
    /// Deletes every key of a table that begins with `prefix` (not empty,
    /// and not ending in 0xFF), as one range deletion.
    pub fn delete_prefix(&mut self, table: Table, prefix: &[u8]) {
        let cf = self.store.cf(table);
        let mut end = prefix.to_vec();
        *end.last_mut().expect("a prefix is not empty") += 1;
        self.inner.delete_range_cf(cf, prefix, end.as_slice());
    }
}
