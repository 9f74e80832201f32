//! Queue limits on one partition: the limits set here, their buckets and
//! the activations they count, and the admission an activation asks of
//! them (see [`crate::core::limit`]).
//!
//! Everything here is decided at apply from replicated state in partition
//! time, so every replica admits the same jobs. The counts of held
//! activations are not stored: they are the queue's activated jobs, counted
//! again when the state is restored or a limit is set. The buckets are
//! stored with the limit ([`PartitionState::limit_records`]), so a restarted
//! replica takes up where the others are.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{ApplyOutput, PartitionState, QueueKey};
use crate::core::limit::{limit_key, Bucket, Limit, LimitRecord, LimitState, QueueLimit, MAX_KEYS};
use crate::core::{CommandResult, JobKey, JobState, Millis, PartitionId};

/// Jobs of one queue an activation passes over for their keys' limits, at
/// most; the rest of the queue waits for the next.
pub(super) const MAX_PASSED: usize = 1024;

/// (tenant, job type).
pub(super) type QueueName = (String, String);

/// One limited queue on this partition.
#[derive(Debug, Default)]
pub(super) struct Limited {
    limit: Option<QueueLimit>,
    /// Rate buckets by key (`""`: the queue's own); absent ones are full.
    buckets: BTreeMap<String, Bucket>,
    /// Activations held, by key (`""`: the whole queue's).
    active: BTreeMap<String, u32>,
    /// When full buckets were last forgotten to make room for a new key
    /// (once per entry's time at most).
    dropped_at: Option<Millis>,
}

/// Why an activation may not take a job now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Blocked {
    /// Nothing more of the queue: no job of it is taken in this activation.
    Queue,
    /// Not this job's key; other keys' jobs may go.
    Key,
}

impl Limited {
    fn limit(&self) -> &QueueLimit {
        self.limit.as_ref().expect("a queue in `limits` has a limit")
    }

    /// Whether one more activation may start for `key` at `now`, each level
    /// refilled first; the buckets are not taken from.
    fn check(&mut self, key: Option<&str>, now: Millis) -> Result<(), Blocked> {
        let QueueLimit { queue, per_key, .. } = *self.limit();
        self.level_allows("", &queue, now).map_err(|_| Blocked::Queue)?;
        if let Some(key) = key {
            if !per_key.is_none() {
                if !self.buckets.contains_key(key) && self.buckets.len() >= MAX_KEYS {
                    // Full buckets are as good as none: forget them first
                    // (once per entry: another new key finds them gone).
                    if self.dropped_at != Some(now) {
                        self.dropped_at = Some(now);
                        self.drop_full(now);
                    }
                    if self.buckets.len() >= MAX_KEYS {
                        return Err(Blocked::Key);
                    }
                }
                self.level_allows(key, &per_key, now).map_err(|_| Blocked::Key)?;
            }
        }
        Ok(())
    }

    fn level_allows(&mut self, key: &str, limit: &Limit, now: Millis) -> Result<(), ()> {
        if let Some(most) = limit.concurrency {
            if self.active.get(key).copied().unwrap_or(0) >= most {
                return Err(());
            }
        }
        if let Some(rate) = limit.rate {
            if let Some(bucket) = self.buckets.get_mut(key) {
                bucket.refill(&rate, now);
                if bucket.tokens() < 1 {
                    return Err(());
                }
            }
        }
        Ok(())
    }

    /// Takes one start for `key` (checked by [`Self::check`] at `now`).
    fn take(&mut self, key: Option<&str>, now: Millis) {
        let QueueLimit { queue, per_key, .. } = *self.limit();
        let mut levels = vec![("", queue)];
        if let Some(key) = key.filter(|_| !per_key.is_none()) {
            levels.push((key, per_key));
        }
        for (key, limit) in levels {
            if let Some(rate) = limit.rate {
                self.buckets.entry(key.to_string()).or_insert_with(|| Bucket::full(&rate, now)).take();
            }
            *self.active.entry(key.to_string()).or_default() += 1;
        }
    }

    /// When a token of the level that blocks `key` comes back (`None`: a
    /// concurrency blocks it, which a finished activation lifts).
    fn next_token_at(&self, key: &str, limit: &Limit) -> Option<Millis> {
        let rate = limit.rate?;
        let bucket = self.buckets.get(key)?;
        (bucket.tokens() < 1).then(|| bucket.next_token_at(&rate))
    }

    /// Forgets the buckets that are full again: a bucket not kept is full.
    fn drop_full(&mut self, now: Millis) {
        let QueueLimit { queue, per_key, .. } = *self.limit();
        self.buckets.retain(|key, bucket| {
            let rate = if key.is_empty() { queue.rate } else { per_key.rate };
            match rate {
                Some(rate) => {
                    bucket.refill(&rate, now);
                    !bucket.is_full(&rate)
                }
                None => false,
            }
        });
    }
}

impl PartitionState {
    /// Sets (or, with `None`, clears) a queue's limit here, and counts the
    /// queue's activations held now against it.
    pub(super) fn set_limit(
        &mut self,
        tenant: &str,
        job_type: &str,
        limit: &Option<QueueLimit>,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, crate::core::CommandError> {
        let name = (tenant.to_string(), job_type.to_string());
        if let Some(limit) = limit {
            limit.validate().map_err(crate::core::CommandError::invalid)?;
        }
        // The held activations are counted anew from the jobs.
        self.limit_active.retain(|_, (queue, _)| *queue != name);
        match limit {
            None => {
                if let Some(tenants) = self.limits.get_mut(job_type) {
                    tenants.remove(tenant);
                    if tenants.is_empty() {
                        self.limits.remove(job_type);
                    }
                }
            }
            Some(limit) => {
                let limited =
                    self.limits.entry(job_type.to_string()).or_default().entry(tenant.to_string()).or_default();
                limited.limit = Some(limit.clone());
                limited.active.clear();
                limited.drop_full(self.clock);
                let held: Vec<JobKey> = self
                    .jobs
                    .values()
                    .filter(|j| {
                        j.state == JobState::Activated && j.spec.tenant == tenant && j.spec.job_type == job_type
                    })
                    .map(|j| j.key)
                    .collect();
                for key in held {
                    self.count_held(key);
                }
            }
        }
        out.limits_changed.push(name);
        // Looser limits may let waiting jobs go now.
        if !out.available.iter().any(|t| t == job_type) {
            out.available.push(job_type.to_string());
        }
        Ok(CommandResult::Done)
    }

    /// Counts an activated job against its queue's limit, if it has one.
    fn count_held(&mut self, key: JobKey) {
        let job = &self.jobs[&key];
        let Some(limited) = self.limits.get_mut(&job.spec.job_type).and_then(|t| t.get_mut(&job.spec.tenant)) else {
            return;
        };
        let name = (job.spec.tenant.clone(), job.spec.job_type.clone());
        let per_key = limited.limit().per_key;
        let job_key = limit_key(&job.spec.custom_headers).filter(|_| !per_key.is_none()).map(str::to_string);
        *limited.active.entry(String::new()).or_default() += 1;
        if let Some(k) = &job_key {
            *limited.active.entry(k.clone()).or_default() += 1;
        }
        self.limit_active.insert(key, (name, job.attempt));
    }

    /// The queue's limit here, if it has one.
    fn limited(&self, tenant: &str, job_type: &str) -> Option<&Limited> {
        self.limits.get(job_type)?.get(tenant)
    }

    fn limited_mut(&mut self, tenant: &str, job_type: &str) -> Option<&mut Limited> {
        self.limits.get_mut(job_type)?.get_mut(tenant)
    }

    /// Whether the queue is limited here.
    pub(super) fn is_limited(&self, tenant: &str, job_type: &str) -> bool {
        !self.limits.is_empty() && self.limited(tenant, job_type).is_some()
    }

    /// Where a create of a limited queue is to be made, when not here.
    pub(super) fn limit_elsewhere(&self, tenant: &str, job_type: &str) -> Option<PartitionId> {
        if self.limits.is_empty() {
            return None;
        }
        let home = self.limited(tenant, job_type)?.limit().home;
        (home != self.partition).then_some(home)
    }

    /// Whether the activation may take `key` (a ready job of a limited
    /// queue) now; takes its start if so.
    pub(super) fn admit(&mut self, key: JobKey) -> Result<(), Blocked> {
        let now = self.clock;
        let spec = std::sync::Arc::clone(&self.jobs[&key].spec);
        let job_key = limit_key(&spec.custom_headers);
        let overrun = self.plants.limit_overrun;
        let limited = self.limited_mut(&spec.tenant, &spec.job_type).expect("admit is asked of limited queues");
        match limited.check(job_key, now) {
            // A planted bug (test only): the limit lets it through anyway.
            Ok(()) | Err(_) if overrun => {
                limited.take(job_key, now);
                Ok(())
            }
            Ok(()) => {
                limited.take(job_key, now);
                Ok(())
            }
            Err(blocked) => {
                let QueueLimit { queue, per_key, .. } = *limited.limit();
                let wake = match (blocked, job_key) {
                    (Blocked::Queue, _) => limited.next_token_at("", &queue),
                    // No room for another key's bucket: full ones free up in time.
                    (Blocked::Key, Some(k)) if !limited.buckets.contains_key(k) && !limited.active.contains_key(k) => {
                        per_key.rate.map(|rate| now.saturating_add(rate.period_ms.min(1_000)))
                    }
                    (Blocked::Key, k) => k.and_then(|k| limited.next_token_at(k, &per_key)),
                };
                if let Some(at) = wake {
                    self.limit_wake = Some(self.limit_wake.map_or(at, |w| w.min(at)));
                }
                Err(blocked)
            }
        }
    }

    /// Notes an activation just admitted, so its end frees its slot. An
    /// earlier activation of the job still noted (it timed out in this
    /// batch) frees its own first.
    pub(super) fn note_admitted(&mut self, key: JobKey) {
        let job = &self.jobs[&key];
        let (name, attempt, spec) =
            ((job.spec.tenant.clone(), job.spec.job_type.clone()), job.attempt, job.spec.clone());
        if let Some((old, _)) = self.limit_active.insert(key, (name, attempt)) {
            self.free_slot(&old, &spec.custom_headers);
        }
    }

    /// An activation of `name` whose job has `headers` ended.
    fn free_slot(&mut self, name: &QueueName, headers: &[(String, String)]) {
        let Some(limited) = self.limited_mut(&name.0, &name.1) else { return };
        let per_key = limited.limit().per_key;
        let job_key = limit_key(headers).filter(|_| !per_key.is_none());
        for level in std::iter::once("").chain(job_key) {
            if let Some(count) = limited.active.get_mut(level) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    limited.active.remove(level);
                }
            }
        }
    }

    /// Puts back a ready job an activation passed over for its key.
    pub(super) fn put_back(&mut self, job_type: &str, queue: QueueKey, entry: (Reverse<i32>, JobKey)) {
        self.ready.entry(job_type.to_string()).or_default().entry(queue).or_default().insert(entry);
    }

    /// After timers, before an activation and after a batch: the held activations of limited queues among the jobs
    /// it touched or finished that ended free their slots, and their queues'
    /// waiting jobs are offered again.
    pub(super) fn release_slots(&mut self, out: &mut ApplyOutput) {
        // Each key is looked at once per batch: from where the last look stopped.
        let (touched, finished) = out.limits_scanned;
        out.limits_scanned = (out.touched.len(), out.finished.len());
        // (key, its spec) of each job touched or finished since.
        let live = out.touched[touched..].iter().filter_map(|key| Some((*key, &self.jobs.get(key)?.spec)));
        let gone = out.finished[finished..].iter().map(|job| (job.key, &job.spec));
        let ended: Vec<(JobKey, std::sync::Arc<crate::core::JobSpec>)> = live
            .chain(gone)
            .filter(|(key, _)| {
                self.limit_active.get(key).is_some_and(|(_, attempt)| {
                    !self.jobs.get(key).is_some_and(|j| j.state == JobState::Activated && j.attempt == *attempt)
                })
            })
            .map(|(key, spec)| (key, std::sync::Arc::clone(spec)))
            .collect();
        for (key, spec) in ended {
            let Some((name, _)) = self.limit_active.remove(&key) else { continue };
            self.free_slot(&name, &spec.custom_headers);
            if !out.available.contains(&name.1) {
                out.available.push(name.1.clone());
            }
        }
    }

    /// Fires the limits' wake-up: a bucket that held jobs back has a token
    /// again, so their types are offered.
    pub(super) fn wake_limits(&mut self, out: &mut ApplyOutput) {
        let Some(at) = self.limit_wake else { return };
        if at > self.clock {
            return;
        }
        self.limit_wake = None;
        for job_type in self.limits.keys() {
            if self.ready.contains_key(job_type) && !out.available.iter().any(|t| t == job_type) {
                out.available.push(job_type.clone());
            }
        }
    }

    /// A queue's limit as stored, with its buckets; `None`: not limited.
    pub fn limit_record(&self, tenant: &str, job_type: &str) -> Option<LimitRecord> {
        let limited = self.limited(tenant, job_type)?;
        Some(LimitRecord {
            tenant: tenant.to_string(),
            job_type: job_type.to_string(),
            limit: limited.limit().clone(),
            buckets: limited.buckets.iter().map(|(k, b)| (k.clone(), *b)).collect(),
        })
    }

    /// Every limit, as stored.
    pub fn all_limit_records(&self) -> Vec<LimitRecord> {
        let names = self.limits.iter().flat_map(|(job_type, tenants)| tenants.keys().map(move |t| (t, job_type)));
        names.filter_map(|(tenant, job_type)| self.limit_record(tenant, job_type)).collect()
    }

    /// Restores the stored limits (before the jobs are indexed, which
    /// counts the activations they hold).
    pub(super) fn restore_limits(&mut self, records: Vec<LimitRecord>) {
        for record in records {
            let limited = Limited {
                limit: Some(record.limit),
                buckets: record.buckets.into_iter().collect(),
                active: Default::default(),
                dropped_at: None,
            };
            self.limits.entry(record.job_type).or_default().insert(record.tenant, limited);
        }
    }

    /// Counts a restored job, if activated, against its queue's limit.
    pub(super) fn restore_held(&mut self, key: JobKey) {
        let job = &self.jobs[&key];
        if job.state == JobState::Activated && self.is_limited(&job.spec.tenant, &job.spec.job_type) {
            self.count_held(key);
        }
    }

    /// The limits of `tenants`' queues ("*": every tenant's; of `job_type`,
    /// unless empty) here.
    pub(super) fn limit_states(&self, tenants: &[String], job_type: &str) -> Vec<LimitState> {
        let every_tenant = tenants.iter().any(|t| t == "*");
        self.limits
            .iter()
            .filter(|(t, _)| job_type.is_empty() || *t == job_type)
            .flat_map(|(t, by_tenant)| by_tenant.iter().map(move |(tenant, limited)| (tenant, t, limited)))
            .filter(|(tenant, _, _)| every_tenant || tenants.contains(tenant))
            .map(|(tenant, t, limited)| {
                let limit = limited.limit().clone();
                let tokens = limit.queue.rate.map(|rate| {
                    let mut bucket =
                        limited.buckets.get("").copied().unwrap_or_else(|| Bucket::full(&rate, self.clock));
                    bucket.refill(&rate, self.clock);
                    bucket.tokens()
                });
                let keys = limited.buckets.keys().chain(limited.active.keys()).filter(|k| !k.is_empty());
                let mut keys: Vec<&String> = keys.collect();
                keys.sort_unstable();
                keys.dedup();
                LimitState {
                    tenant: tenant.clone(),
                    job_type: t.clone(),
                    limit,
                    partition: self.partition,
                    active: limited.active.get("").copied().unwrap_or(0),
                    tokens,
                    keys: keys.len() as u32,
                    waiting: self.activatable_count(t, std::slice::from_ref(tenant)) as u64,
                }
            })
            .collect()
    }

    /// How many jobs of the queue an activation could take, at most, by
    /// its concurrency (`None`: not limited so); for the leader's offers. A
    /// rate is not judged here: the leader's time has moved on since the
    /// last entry, and an activation the bucket refuses sets the wake-up
    /// for its next token.
    pub(super) fn limit_room(&self, tenant: &str, job_type: &str) -> Option<u64> {
        let limited = self.limited(tenant, job_type)?;
        let most = limited.limit().queue.concurrency?;
        Some(u64::from(most.saturating_sub(limited.active.get("").copied().unwrap_or(0))))
    }
}
