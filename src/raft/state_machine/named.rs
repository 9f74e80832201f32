//! Records kept one per name in the meta table, under a prefix of the
//! partition's: a partition's workflows (data version 13 on) and queue
//! limits (14 on), each under its (tenant, name), rewritten when it changes
//! and deleted when the partition forgets it. One record each, not one for
//! all: a workflow step's end rewrites its own workflow only, a limited
//! queue's activations its own limit's buckets only.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::PartitionId;
use crate::storage::{self, meta_key, Batch, StorageError, Store, Table};

/// One kind of named record: its key prefix and what a reader calls it.
pub(super) struct Named {
    prefix: &'static str,
    what: &'static str,
}

/// The workflows, by (tenant, id).
pub(super) const WORKFLOWS: Named = Named { prefix: "workflow\0", what: "workflow" };
/// The queue limits with their buckets, by (tenant, job type).
pub(super) const LIMITS: Named = Named { prefix: "limit\0", what: "queue limit" };

impl Named {
    fn prefix(&self, partition: PartitionId) -> Vec<u8> {
        meta_key(partition, self.prefix)
    }

    fn record_key(&self, partition: PartitionId, tenant: &str, name: &str) -> Vec<u8> {
        let mut key = self.prefix(partition);
        key.extend_from_slice(tenant.as_bytes());
        key.push(0);
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// The partition's stored records of this kind.
    pub(super) fn load<T: DeserializeOwned>(
        &self,
        store: &Store,
        partition: PartitionId,
    ) -> Result<Vec<T>, StorageError> {
        let mut records = Vec::new();
        store.scan_prefix(Table::Meta, &self.prefix(partition), |_, bytes| {
            records.push(storage::decode(self.what, bytes)?);
            Ok(())
        })?;
        Ok(records)
    }

    /// Writes the records an apply changed as `now` gives them, and deletes
    /// those it answers `None` for (forgotten).
    pub(super) fn write_changed<T: Serialize>(
        &self,
        batch: &mut Batch<'_>,
        partition: PartitionId,
        changed: &BTreeSet<(String, String)>,
        now: impl Fn(&str, &str) -> Option<T>,
    ) {
        for (tenant, name) in changed {
            let key = self.record_key(partition, tenant, name);
            match now(tenant, name) {
                Some(record) => batch.put(Table::Meta, key, storage::encode(&record)),
                None => batch.delete(Table::Meta, key),
            }
        }
    }

    /// Makes the stored records of this kind exactly `records` (a
    /// snapshot's), each under the name `name_of` gives it.
    pub(super) fn replace_all<T: Serialize>(
        &self,
        batch: &mut Batch<'_>,
        partition: PartitionId,
        records: &[T],
        name_of: impl Fn(&T) -> (&str, &str),
    ) {
        batch.delete_prefix(Table::Meta, &self.prefix(partition));
        for record in records {
            let (tenant, name) = name_of(record);
            batch.put(Table::Meta, self.record_key(partition, tenant, name), storage::encode(record));
        }
    }
}
