//! The pruning order of final records: completed and cancelled jobs kept
//! readable for their retention, then removed oldest first, alike on every
//! replica.
//!
//! Final records are also indexed by tenant (data version 10): the `jobs_done`
//! table holds, under an [`index_key`] of (tenant, job key), an empty entry
//! per final record, so a listing for some tenants reads their records and no
//! other's. The entry is written with the record and deleted with it; the
//! pruning order carries each record's tenant for that (in its expiry entry,
//! after the time and key). A replica that starts without the index (a data
//! directory of an older build) writes it before it serves, reading each
//! retained record's tenant from its spec once, and records that it did
//! (`final_tenant_index`).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::core::{Job, JobKey, Millis, PartitionId, Retention};
use crate::storage::{self, index_key, key, meta_key, StorageError, Store, Table};

/// Set once a partition's final records are indexed by tenant.
const INDEXED: &str = "final_tenant_index";
/// Records indexed per batch when an older directory is indexed.
const INDEX_BATCH: usize = 4096;

/// A final record in the pruning order.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Finish {
    pub at: Millis,
    pub job: JobKey,
    pub tenant: Arc<str>,
}

/// Final records in the order they finished, oldest first: what pruning takes
/// next. It mirrors [`Table::Expiry`] so deciding what to prune reads nothing.
#[derive(Default)]
pub(super) struct Finished {
    /// The sequence number of `order.front()`.
    pub first: u64,
    pub order: VecDeque<Finish>,
    /// Each tenant's name once, shared by its records in `order`.
    tenants: HashSet<Arc<str>>,
}

impl Finished {
    /// An empty order whose first record will have sequence number `first`.
    pub fn starting_at(first: u64) -> Finished {
        Finished { first, ..Finished::default() }
    }

    pub fn next(&self) -> u64 {
        self.first + self.order.len() as u64
    }

    fn tenant(&mut self, tenant: &str) -> Arc<str> {
        if let Some(known) = self.tenants.get(tenant) {
            return Arc::clone(known);
        }
        let name: Arc<str> = Arc::from(tenant);
        self.tenants.insert(Arc::clone(&name));
        name
    }

    /// Appends a record finished at `at`, writing its expiry entry and its
    /// tenant index entry.
    pub fn append(
        &mut self,
        batch: &mut storage::Batch<'_>,
        partition: PartitionId,
        at: Millis,
        job: JobKey,
        tenant: &str,
    ) {
        let tenant = self.tenant(tenant);
        batch.put(Table::Expiry, key(partition, self.next()), expiry_value(at, job, &tenant));
        batch.put(Table::Done, tenant_key(partition, &tenant, job), []);
        self.order.push_back(Finish { at, job, tenant });
    }

    /// Records `job`, finished at `at`, as the newest final record.
    pub fn push(&mut self, batch: &mut storage::Batch<'_>, partition: PartitionId, at: Millis, job: &Job) {
        self.append(batch, partition, at, job.key, &job.spec.tenant);
    }

    /// Drops the oldest records while there are more than `retention` keeps
    /// at `now`, with their expiry and tenant index entries. Every deletion
    /// names its key: a range deletion per apply would leave RocksDB
    /// thousands of range tombstones per memtable to fragment at each flush
    /// (see [`storage::Batch::delete_ids`]).
    pub fn prune(&mut self, batch: &mut storage::Batch<'_>, partition: PartitionId, retention: Retention, now: Millis) {
        let oldest_kept = now.saturating_sub(retention.max_age_ms);
        while let Some(oldest) = self.order.front() {
            if self.order.len() as u64 <= retention.max_jobs && oldest.at >= oldest_kept {
                break;
            }
            batch.delete(Table::Done, key(partition, oldest.job.0));
            batch.delete(Table::Done, tenant_key(partition, &oldest.tenant, oldest.job));
            batch.delete(Table::Specs, key(partition, oldest.job.0));
            batch.delete(Table::Expiry, key(partition, self.first));
            self.order.pop_front();
            self.first += 1;
        }
    }

    /// The partition's pruning order as stored, and the sequence number of
    /// its first record if it has any; indexes the records by tenant if an
    /// older build stored them.
    pub fn open(store: &Store, partition: PartitionId) -> Result<(Finished, Option<u64>), StorageError> {
        let indexed = store.get(Table::Meta, meta_key(partition, INDEXED))?.is_some();
        let mut finished = Finished::default();
        let mut first = None;
        let (mut batch, mut pending) = (store.batch(), 0);
        store.for_each(Table::Expiry, partition, |seq, bytes| {
            first.get_or_insert(seq);
            let corrupt = || StorageError::Io(std::io::Error::other(format!("corrupt expiry entry {seq}")));
            let (at, job, tenant) = parse_expiry(bytes).ok_or_else(corrupt)?;
            let tenant = match tenant {
                Some(tenant) => finished.tenant(tenant),
                None => {
                    // Written by a build before the index: its spec says.
                    let spec = super::records::decode_spec(job.0, store.get(Table::Specs, key(partition, job.0))?)?;
                    let tenant = finished.tenant(&spec.tenant);
                    batch.put(Table::Expiry, key(partition, seq), expiry_value(at, job, &tenant));
                    tenant
                }
            };
            if !indexed {
                batch.put(Table::Done, tenant_key(partition, &tenant, job), []);
                pending += 1;
                if pending == INDEX_BATCH {
                    store.write(std::mem::replace(&mut batch, store.batch()));
                    pending = 0;
                }
            }
            finished.order.push_back(Finish { at, job, tenant });
            Ok(())
        })?;
        if !indexed {
            batch.put(Table::Meta, meta_key(partition, INDEXED), []);
            store.write_synced(batch);
        }
        Ok((finished, first))
    }
}

/// Deletes the partition's tenant index (a snapshot or a backup replaces
/// its final records; [`Finished::append`] writes the new ones').
pub(super) fn clear(batch: &mut storage::Batch<'_>, partition: PartitionId) {
    batch.delete_index(Table::Done, partition);
    batch.put(Table::Meta, meta_key(partition, INDEXED), []);
}

/// Where a tenant's final records are listed in key order: the tenant's
/// name behind its length, then the job key.
fn tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut by = Vec::with_capacity(2 + tenant.len() + 8);
    by.extend_from_slice(&(tenant.len() as u16).to_be_bytes());
    by.extend_from_slice(tenant.as_bytes());
    by
}

fn tenant_key(partition: PartitionId, tenant: &str, job: JobKey) -> Vec<u8> {
    let mut by = tenant_prefix(tenant);
    by.extend_from_slice(&job.0.to_be_bytes());
    index_key(partition, &by)
}

/// Visits the keys of `tenant`'s final records from `from` on, in key
/// order, while `visit` answers true.
pub(super) fn scan_tenant(
    store: &Store,
    partition: PartitionId,
    tenant: &str,
    from: u64,
    mut visit: impl FnMut(u64) -> Result<bool, StorageError>,
) -> Result<(), StorageError> {
    let prefix = tenant_prefix(tenant);
    store.scan_index(Table::Done, partition, &prefix, &from.to_be_bytes(), |rest| {
        let job = u64::from_be_bytes(rest.try_into().map_err(|_| {
            StorageError::Io(std::io::Error::other(format!("corrupt tenant index entry of tenant {tenant:?}")))
        })?);
        visit(job)
    })
}

/// An expiry entry: finish time and job key (16 bytes), then the tenant's
/// name (data version 10 on; entries of older builds end after the key).
pub(super) fn expiry_value(at: Millis, job: JobKey, tenant: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(16 + tenant.len());
    value.extend_from_slice(&at.to_be_bytes());
    value.extend_from_slice(&job.0.to_be_bytes());
    value.extend_from_slice(tenant.as_bytes());
    value
}

pub(super) fn parse_expiry(value: &[u8]) -> Option<(Millis, JobKey, Option<&str>)> {
    let at = Millis::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let job = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    let tenant = match &value[16..] {
        [] => None,
        name => Some(std::str::from_utf8(name).ok()?),
    };
    Some((at, JobKey(job), tenant))
}
