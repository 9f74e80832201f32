//! What other parts of the node read of a partition's state: jobs by key or
//! request, waits for a job to become final, listings, the leader's view of
//! its engine. Lock holds are short and never span an await.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::{records, Inner};
use crate::core::{Job, JobFilter, JobKey, JobRef, Millis, PartitionId, PartitionState};
use crate::storage::{self, key, Store, Table};

/// Removes a finished or abandoned wait's entry (see [`SharedState::await_final`]).
struct ForgetWait<'a> {
    state: &'a SharedState,
    key: JobKey,
}

impl Drop for ForgetWait<'_> {
    fn drop(&mut self) {
        let mut waiters = self.state.waiting();
        if let Some(senders) = waiters.get_mut(&self.key) {
            senders.retain(|s| !s.is_closed());
            if senders.is_empty() {
                waiters.remove(&self.key);
            }
        }
    }
}

/// The partition's state, shared between the Raft state machine (the only
/// writer) and readers on this node: `GetJob`, the leader's push decisions,
/// metrics. Lock holds are short and never span an await.
pub struct SharedState {
    pub(super) partition: PartitionId,
    pub(super) store: Arc<Store>,
    /// Where snapshot files are made.
    pub(super) snapshot_dir: PathBuf,
    pub(super) inner: Mutex<Inner>,
    /// Readers waiting for a job to become final ([`SharedState::await_final`]).
    pub(super) waiters: Mutex<HashMap<JobKey, Vec<oneshot::Sender<()>>>>,
}

impl SharedState {
    /// Where this partition's snapshots and staged backups are written.
    pub fn snapshot_dir(&self) -> &std::path::Path {
        &self.snapshot_dir
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("state machine lock poisoned")
    }

    /// The cluster plan this replica has applied (partition 0's; `None`
    /// before it was first changed).
    pub fn plan(&self) -> Option<crate::core::ClusterPlan> {
        self.lock().engine.plan().cloned()
    }

    /// The partition's leader time now, from this process's own steady clock:
    /// the time of a live entry applied here plus the time since it was
    /// applied (the entry that gives the latest time; see [`observe`]). `None` until this process has applied an entry written
    /// since it started (entries replayed from its own log tell nothing of
    /// how long it was down).
    pub fn clock_estimate(&self) -> Option<Millis> {
        let inner = self.lock();
        let (at, seen) = inner.observed?;
        Some(at.saturating_add(seen.elapsed().as_millis() as Millis).max(inner.engine.clock()))
    }

    /// Up to about `limit` of the partition's lifecycle events after log
    /// index `after`, as this replica holds them (see [`super::events`]).
    pub fn events(&self, after: u64, limit: usize) -> Result<super::events::EventsPage, storage::StorageError> {
        let held = {
            let inner = self.lock();
            (inner.events.first(), inner.last_applied.map_or(0, |id| id.index))
        };
        super::events::read(&self.store, self.partition, after, limit, held)
    }

    /// Reads the engine state.
    pub fn read<R>(&self, f: impl FnOnce(&PartitionState) -> R) -> R {
        f(&self.lock().engine)
    }

    /// A job's record, live or final.
    pub fn lookup(&self, job: JobKey) -> Result<Option<Job>, storage::StorageError> {
        if let Some(live) = self.lock().engine.job(job).cloned() {
            return Ok(Some(live));
        }
        match self.store.get(Table::Done, key(self.partition, job.0))? {
            Some(bytes) => self.final_record(job.0, &bytes),
            None => Ok(None),
        }
    }

    /// A final job from its `jobs_done` record and its spec; `None` when it
    /// was pruned after its record was read (a prune deletes both records in
    /// one batch, so a spec gone with its final record still there is damage).
    pub(super) fn final_record(&self, job: u64, progress: &[u8]) -> Result<Option<Job>, storage::StorageError> {
        let k = key(self.partition, job);
        let spec = match self.store.get(Table::Specs, k)? {
            None if self.store.get(Table::Done, k)?.is_none() => return Ok(None),
            spec => records::decode_spec(job, spec)?,
        };
        records::decode_progress(spec, progress).map(Some)
    }

    /// The job a reference names: by key, or by the create request this
    /// replica remembers (`None` once the request's window has passed).
    pub fn resolve(&self, job: &JobRef) -> Option<JobKey> {
        match job {
            JobRef::Key(key) => Some(*key),
            // An entry with counter 0 names no job, only where the key went.
            JobRef::Request(request) => {
                self.lock().engine.request(request).map(|seen| seen.job).filter(|key| key.counter() != 0)
            }
        }
    }

    /// A job's record once it is final, or as it is when `wait` has passed
    /// (or at once, when it is final already or unknown).
    pub async fn await_final(&self, key: JobKey, wait: Duration) -> Result<Option<Job>, storage::StorageError> {
        if wait.is_zero() {
            return self.lookup(key);
        }
        // Dropped when this read ends, however it ends (a caller that goes
        // away included), after the receiver below: forgets the wait.
        let _forget = ForgetWait { state: self, key };
        let (sender, finished) = oneshot::channel();
        self.waiting().entry(key).or_default().push(sender);
        // Registered first: a job that finishes after this read wakes us.
        match self.lookup(key) {
            Ok(Some(job)) if !job.state.is_final() => {
                let _ = tokio::time::timeout(wait, finished).await;
                self.lookup(key)
            }
            other => other,
        }
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<JobKey, Vec<oneshot::Sender<()>>>> {
        self.waiters.lock().expect("waiters lock poisoned")
    }

    /// Wakes the readers waiting for these jobs, which just became final.
    pub(super) fn wake(&self, finished: &[JobKey]) {
        let mut waiters = self.waiting();
        if waiters.is_empty() {
            return;
        }
        for key in finished {
            for sender in waiters.remove(key).unwrap_or_default() {
                let _ = sender.send(());
            }
        }
    }

    /// Up to `limit` jobs matching `filter` with keys after `after`, in key
    /// order, of `tenants` (empty: every tenant), live and final, and no more
    /// than about `max_bytes` of them (at least one). A job that finishes
    /// during the read is listed once, as final. Live jobs are read under the
    /// lock apply takes, in O(page) plus the jobs of those tenants the rest of
    /// the filter skips ([`crate::core::PartitionState::list_live`]); final
    /// records after it, from storage, outside the lock: a caller's tenants'
    /// through their index (see `retention`), so other tenants' records are
    /// never read.
    pub fn list(
        &self,
        filter: &JobFilter,
        tenants: &[String],
        after: JobKey,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Job>, storage::StorageError> {
        let mut live: Vec<Job> = if filter.covers_live() {
            let inner = self.lock();
            inner.engine.list_live(filter, tenants, after, limit).into_iter().cloned().collect()
        } else {
            Vec::new()
        };
        let mut done = Vec::new();
        if filter.covers_final() && limit > 0 {
            let from = after.0.saturating_add(1);
            // The tenants whose records to read, as for live jobs: the
            // filter's if it names one the caller may read, else the
            // caller's (`None`: every tenant).
            let named: Option<&[String]> = match filter.tenant.as_str() {
                "" if tenants.is_empty() => None,
                "" => Some(tenants),
                one if tenants.is_empty() || tenants.iter().any(|t| t == one) => {
                    Some(std::slice::from_ref(&filter.tenant))
                }
                _ => Some(&[]),
            };
            if let Some(named) = named {
                // Each tenant's records through its index, then merged: the
                // first `limit` of all are among each one's first `limit`.
                for tenant in named {
                    let mut page = Page::new(limit, max_bytes);
                    super::retention::scan_tenant(&self.store, self.partition, tenant, from, |id| {
                        let k = key(self.partition, id);
                        let Some(bytes) = self.store.get(Table::Done, k)? else { return Ok(true) };
                        let job = self.final_record(id, &bytes)?;
                        Ok(page.take(job.filter(|job| filter.matches(job)), bytes.len()))
                    })?;
                    done.extend(page.jobs);
                }
            } else {
                let mut page = Page::new(limit, max_bytes);
                self.store.scan_while(Table::Done, self.partition, from, |id, bytes| {
                    let job = self.final_record(id, bytes)?;
                    Ok(page.take(job.filter(|job| filter.matches(job)), bytes.len()))
                })?;
                done = page.jobs;
            }
        }
        live.retain(|job| !done.iter().any(|d| d.key == job.key));
        live.extend(done);
        live.sort_unstable_by_key(|job| job.key);
        live.truncate(limit);
        let mut total = 0;
        let within = live
            .iter()
            .position(|job| {
                total += job.spec.encoded_len() + job.result.len() + job.error_message.len() + job.worker.len();
                total > max_bytes
            })
            .unwrap_or(live.len());
        live.truncate(within.max(1));
        Ok(live)
    }

    /// Every job this replica holds, live and final (for tests; reads the
    /// whole partition under the lock apply takes).
    #[cfg(test)]
    pub fn all_jobs(&self) -> Result<Vec<Job>, storage::StorageError> {
        let inner = self.lock();
        let mut jobs: Vec<Job> = inner.engine.jobs().cloned().collect();
        self.store.for_each(Table::Done, self.partition, |id, bytes| {
            // Read under the lock apply holds: nothing is pruned meanwhile.
            jobs.extend(self.final_record(id, bytes)?);
            Ok(())
        })?;
        Ok(jobs)
    }
}

/// A page of final records being read: full at `limit` records or about
/// `max_bytes`.
struct Page {
    jobs: Vec<Job>,
    bytes: usize,
    limit: usize,
    max_bytes: usize,
}

impl Page {
    fn new(limit: usize, max_bytes: usize) -> Page {
        Page { jobs: Vec::new(), bytes: 0, limit, max_bytes }
    }
    /// Takes `job` (if it is one to list), stored as `stored` bytes; whether
    /// the page has room for more.
    fn take(&mut self, job: Option<Job>, stored: usize) -> bool {
        if let Some(job) = job {
            self.bytes += stored + job.spec.encoded_len();
            self.jobs.push(job);
        }
        self.jobs.len() < self.limit && self.bytes < self.max_bytes
    }
}

/// What a replica knows of the partition's time once it applies an entry
/// stamped `at` at `seen`, having known `observed` before: the observation
/// that puts the time further on. An entry is stamped when its leader
/// proposes it and applied when it commits, so one whose commit waited (a
/// lost quorum, slow links) is stamped long before it is seen: taken alone,
/// it would set this replica's estimate back by the wait, and the next
/// leader, which resumes from the replicas' estimates, would carry the
/// partition's time that far behind the wall clocks for good. Both
/// observations advance with the same steady clock, so the one ahead now
/// stays ahead.
pub(super) fn observe(
    observed: Option<(Millis, std::time::Instant)>,
    at: Millis,
    seen: std::time::Instant,
) -> (Millis, std::time::Instant) {
    match observed {
        Some((before, when)) => {
            let since = seen.saturating_duration_since(when).as_millis() as Millis;
            if before.saturating_add(since) > at {
                (before, when)
            } else {
                (at, seen)
            }
        }
        None => (at, seen),
    }
}

#[cfg(test)]
mod observe_tests {
    use std::time::{Duration, Instant};

    use super::observe;

    #[test]
    fn an_entry_that_committed_late_does_not_set_the_estimate_back() {
        let start = Instant::now();
        let later = |ms| start + Duration::from_millis(ms);
        // Stamped 1,000 and seen at once; the next, stamped 1,100, seen 100 ms on.
        let first = observe(None, 1_000, start);
        let on_time = observe(Some(first), 1_100, later(100));
        assert_eq!(on_time, (1_100, later(100)), "an entry on time is the newest word");
        // Proposed at 1,200 (200 ms on), then the quorum was lost for 3 s:
        // applied at 3,200 ms on, it would say 1,200 where the steady clock says 4,200.
        let late = observe(Some(on_time), 1_200, later(3_200));
        assert_eq!(late, on_time, "the late entry says less than what was known");
        let estimate = |(at, when): (i64, Instant), now: Instant| at + now.duration_since(when).as_millis() as i64;
        assert_eq!(estimate(late, later(3_200)), 4_200);
        // A leader whose clock runs ahead moves it on.
        let ahead = observe(Some(late), 9_000, later(3_300));
        assert_eq!(ahead, (9_000, later(3_300)));
    }
}
