//! A partition's lifecycle events (see [`crate::core::Lifecycle`]), kept for
//! subscribers: one record per applied entry that made any, under the
//! entry's log index in [`Table::Events`], written in the same batch as the
//! entry's effects. A reader's cursor is a log index, so a subscriber that
//! reconnects with its cursor reads on from where it stopped.
//!
//! Events are kept as long as the records of final jobs (the entries'
//! [`Retention`]: 10 minutes by default) and at most
//! [`EVENTS_PER_JOB`] times as many as those records. Every replica keeps
//! the events of the entries it applies: a replica that installs a
//! snapshot holds none before it, and says so ([`EventsPage::from`]), as
//! does a read whose cursor fell behind the retention window: a reader
//! learns of a gap, never misses events silently.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::core::{Happened, Lifecycle, Millis, PartitionId, Retention};
use crate::storage::{self, key, Batch, DeletedBelow, StorageError, Store, Table};

/// Events kept per final record the retention keeps: a job makes about
/// three (created, activated, completed).
pub const EVENTS_PER_JOB: u64 = 4;

/// One event as stored and read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub lifecycle: Lifecycle,
    /// The job's key (0 for a queue's event).
    pub key: u64,
    pub job_type: String,
    pub tenant: String,
    pub attempt: u32,
    /// See [`Happened::detail`].
    pub detail: Millis,
    /// See [`Happened::text`].
    pub text: String,
}

/// The events of one entry.
#[derive(Serialize, Deserialize)]
struct Record {
    at: Millis,
    events: Vec<StoredEvent>,
}

/// One event read: its entry's log index, its place in the entry, and the
/// entry's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadEvent {
    pub index: u64,
    pub seq: u32,
    pub at: Millis,
    pub event: StoredEvent,
}

/// A read of a partition's events after a cursor.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EventsPage {
    /// Whole entries' events, in log order.
    pub events: Vec<ReadEvent>,
    /// The cursor after this read: the last entry read (the cursor asked
    /// for when none was).
    pub through: u64,
    /// The first log index this replica holds events from: a cursor below
    /// `from - 1` missed events (pruned, or before a snapshot).
    pub from: u64,
    /// The last log index this replica had applied when it read: a cursor
    /// there reads only what comes next.
    pub applied: u64,
}

impl EventsPage {
    /// Whether a reader at `after` missed events this replica no longer holds.
    pub fn gap_after(&self, after: u64) -> bool {
        after > 0 && after.saturating_add(1) < self.from
    }
}

/// What the state machine keeps of the events it wrote: enough to prune them.
pub(super) struct EventLog {
    /// (time, log index, events) of each record written since start, oldest
    /// first; records left by an earlier run count as one, written at open.
    kept: VecDeque<(Millis, u64, u64)>,
    count: u64,
    first: u64,
    deleted: DeletedBelow,
}

impl EventLog {
    /// The log of `partition` as `store` holds it, `applied` being the last
    /// entry applied and `now` the partition's time.
    pub(super) fn open(store: &Store, partition: PartitionId, applied: u64, now: Millis) -> Result<Self, StorageError> {
        let mut first = None;
        store.scan_while(Table::Events, partition, 0, |index, _| {
            first = Some(index);
            Ok(false)
        })?;
        let mut kept = VecDeque::new();
        if let Some((last, _)) = store.last(Table::Events, partition)? {
            kept.push_back((now, last, 0));
        }
        Ok(EventLog { kept, count: 0, first: first.unwrap_or(applied + 1), deleted: DeletedBelow::default() })
    }

    /// Writes entry `index`'s events (made at `at`) and prunes what
    /// `retention` no longer keeps.
    pub(super) fn record(
        &mut self,
        batch: &mut Batch<'_>,
        partition: PartitionId,
        (index, at): (u64, Millis),
        happened: &[Happened],
        retention: Retention,
    ) {
        if !happened.is_empty() {
            let events: Vec<StoredEvent> = happened
                .iter()
                .map(|h| StoredEvent {
                    lifecycle: h.lifecycle,
                    key: h.key.0,
                    job_type: h.spec.job_type.clone(),
                    tenant: h.spec.tenant.clone(),
                    attempt: h.attempt,
                    detail: h.detail,
                    text: h.text.clone(),
                })
                .collect();
            batch.put(Table::Events, key(partition, index), storage::encode(&Record { at, events }));
            self.kept.push_back((at, index, happened.len() as u64));
            self.count += happened.len() as u64;
        }
        let most = retention.max_jobs.saturating_mul(EVENTS_PER_JOB);
        let mut cut = None;
        while let Some(&(written, index, n)) = self.kept.front() {
            if written.saturating_add(retention.max_age_ms) >= at && self.count <= most {
                break;
            }
            self.kept.pop_front();
            self.count -= n;
            cut = Some(index);
        }
        if let Some(index) = cut {
            self.deleted.delete_below(batch, Table::Events, partition, index + 1);
            self.first = self.first.max(index + 1);
        }
    }

    /// A snapshot up to `next - 1` was installed: the events held are of a
    /// history with a hole in it, so none is kept before `next`.
    pub(super) fn installed(&mut self, batch: &mut Batch<'_>, partition: PartitionId, next: u64) {
        self.deleted.delete_below(batch, Table::Events, partition, next);
        self.kept.clear();
        self.count = 0;
        self.first = next;
    }

    pub(super) fn first(&self) -> u64 {
        self.first
    }
}

/// Up to about `limit` events of `partition` after log index `after` (whole
/// entries: at least one entry's, even if it holds more; none for a limit of
/// 0), `from` being the first index held and `applied` the last applied.
pub(super) fn read(
    store: &Store,
    partition: PartitionId,
    after: u64,
    limit: usize,
    (from, applied): (u64, u64),
) -> Result<EventsPage, StorageError> {
    let mut page = EventsPage { events: Vec::new(), through: after, from, applied };
    if limit == 0 {
        return Ok(page);
    }
    store.scan_while(Table::Events, partition, after.saturating_add(1), |index, bytes| {
        let record: Record = storage::decode("lifecycle events", bytes)?;
        if !page.events.is_empty() && page.events.len() + record.events.len() > limit {
            return Ok(false);
        }
        for (seq, event) in record.events.into_iter().enumerate() {
            page.events.push(ReadEvent { index, seq: seq as u32, at: record.at, event });
        }
        page.through = index;
        Ok(page.events.len() < limit)
    })?;
    Ok(page)
}
