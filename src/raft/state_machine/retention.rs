//! The pruning order of final records: completed and cancelled jobs kept
//! readable for their retention, then removed oldest first, alike on every
//! replica.

use std::collections::VecDeque;

use crate::core::{JobKey, Millis, PartitionId, Retention};
use crate::storage::{self, key, Table};

/// Final records in the order they finished, oldest first: what pruning takes
/// next. It mirrors [`Table::Expiry`] so deciding what to prune reads nothing.
#[derive(Default)]
pub(super) struct Finished {
    /// The sequence number of `order.front()`.
    pub first: u64,
    pub order: VecDeque<(Millis, JobKey)>,
}

impl Finished {
    pub fn next(&self) -> u64 {
        self.first + self.order.len() as u64
    }

    /// Records `job`, finished at `at`, as the newest final record.
    pub fn push(&mut self, batch: &mut storage::Batch<'_>, partition: PartitionId, at: Millis, job: JobKey) {
        batch.put(Table::Expiry, key(partition, self.next()), expiry_value(at, job));
        self.order.push_back((at, job));
    }

    /// Drops the oldest records while there are more than `retention` keeps
    /// at `now`, with their expiry index entries. Every deletion names its
    /// key: a range deletion per apply would leave RocksDB thousands of range
    /// tombstones per memtable to fragment at each flush (see
    /// [`storage::Batch::delete_ids`]).
    pub fn prune(&mut self, batch: &mut storage::Batch<'_>, partition: PartitionId, retention: Retention, now: Millis) {
        let oldest_kept = now.saturating_sub(retention.max_age_ms);
        while let Some(&(at, job)) = self.order.front() {
            if self.order.len() as u64 <= retention.max_jobs && at >= oldest_kept {
                break;
            }
            batch.delete(Table::Done, key(partition, job.0));
            batch.delete(Table::Specs, key(partition, job.0));
            batch.delete(Table::Expiry, key(partition, self.first));
            self.order.pop_front();
            self.first += 1;
        }
    }
}

pub(super) fn expiry_value(at: Millis, job: JobKey) -> [u8; 16] {
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&at.to_be_bytes());
    value[8..].copy_from_slice(&job.0.to_be_bytes());
    value
}

pub(super) fn parse_expiry(value: &[u8]) -> Option<(Millis, JobKey)> {
    let at = Millis::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let job = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    Some((at, JobKey(job)))
}
