//! Queues as objects (see [`crate::core::queue`]): pausing and resuming a
//! tenant's queue of a job type, and the figures a partition reports of its
//! queues. A paused queue's activatable jobs wait in `parked` instead of
//! `ready`, so nothing that looks for activatable jobs (activations, pushes,
//! long polls, metrics) sees them until it resumes.

use std::collections::BTreeMap;

use super::{ApplyOutput, FastMap, PartitionState, QueueKey, ReadyQueue};
use crate::core::{CommandResult, Happened, JobKey, JobSpec, JobState, Lifecycle, Millis, QueueStats, Tally, Window};

/// Counts `tally` of a job in its queue's window at `now`; a free function,
/// so it may run while one of the state's jobs is borrowed.
pub(super) fn tally(windows: &mut FastMap<String, FastMap<String, Window>>, now: Millis, spec: &JobSpec, tally: Tally) {
    // The type's and tenant's windows usually exist: look them up before cloning names.
    let by_tenant = match windows.get_mut(&spec.job_type) {
        Some(by_tenant) => by_tenant,
        None => windows.entry(spec.job_type.clone()).or_default(),
    };
    let window = match by_tenant.get_mut(&spec.tenant) {
        Some(window) => window,
        None => by_tenant.entry(spec.tenant.clone()).or_default(),
    };
    window.record(now, tally);
}

const MINUTE_MS: Millis = 60_000;
const HOUR_MS: Millis = 60 * MINUTE_MS;

impl PartitionState {
    /// Whether `tenant`'s queue of `job_type` is paused.
    pub fn is_paused(&self, tenant: &str, job_type: &str) -> bool {
        !self.paused.is_empty() && self.paused.get(job_type).is_some_and(|tenants| tenants.contains_key(tenant))
    }

    /// The paused queues as stored: (tenant, job type, paused at).
    pub fn paused_records(&self) -> Vec<(String, String, Millis)> {
        let mut records: Vec<_> = self
            .paused
            .iter()
            .flat_map(|(job_type, tenants)| tenants.iter().map(move |(t, at)| (t.clone(), job_type.clone(), *at)))
            .collect();
        records.sort();
        records
    }

    /// Restores the paused queues of [`Self::paused_records`] (before any
    /// job is indexed, so their jobs are parked as they are indexed).
    pub(super) fn restore_paused(&mut self, records: Vec<(String, String, Millis)>) {
        for (tenant, job_type, at) in records {
            self.paused.entry(job_type).or_default().insert(tenant, at);
        }
    }

    /// Where activatable jobs of `tenant`'s `job_type` wait: parked while
    /// the queue is paused, ready otherwise.
    pub(super) fn queues_for(
        &mut self,
        tenant: &str,
        job_type: &str,
    ) -> &mut FastMap<String, FastMap<QueueKey, ReadyQueue>> {
        if self.is_paused(tenant, job_type) {
            &mut self.parked
        } else {
            &mut self.ready
        }
    }

    /// Pauses or resumes a queue: its activatable jobs move between `ready`
    /// and `parked`. Pausing a paused queue keeps its first pause time.
    pub(super) fn set_paused(
        &mut self,
        tenant: &str,
        job_type: &str,
        paused: bool,
        out: &mut ApplyOutput,
    ) -> CommandResult {
        if paused == self.is_paused(tenant, job_type) {
            return CommandResult::Done;
        }
        let (from, to) = if paused { (&mut self.ready, &mut self.parked) } else { (&mut self.parked, &mut self.ready) };
        if let Some(queues) = from.get_mut(job_type) {
            let moving: Vec<QueueKey> = queues.keys().filter(|k| k.tenant == tenant).cloned().collect();
            for key in moving {
                let queue = queues.remove(&key).expect("listed just now");
                to.entry(job_type.to_string()).or_default().insert(key, queue);
            }
            if queues.is_empty() {
                from.remove(job_type);
            }
        }
        if paused {
            self.paused.entry(job_type.to_string()).or_default().insert(tenant.to_string(), self.clock);
        } else {
            if let Some(tenants) = self.paused.get_mut(job_type) {
                tenants.remove(tenant);
                if tenants.is_empty() {
                    self.paused.remove(job_type);
                }
            }
            if self.ready.contains_key(job_type) && !out.available.iter().any(|t| t == job_type) {
                out.available.push(job_type.to_string());
            }
        }
        out.paused_changed = true;
        if self.partition == 0 {
            // One event per pause, though every partition applies it.
            let spec = std::sync::Arc::new(JobSpec {
                job_type: job_type.to_string(),
                tenant: tenant.to_string(),
                ..Default::default()
            });
            let lifecycle = if paused { Lifecycle::QueuePaused } else { Lifecycle::QueueResumed };
            let happened = Happened { lifecycle, key: JobKey(0), spec, attempt: 0, detail: 0, text: String::new() };
            out.happened.push(happened);
        }
        CommandResult::Done
    }

    /// The figures of `tenants`' queues (every tenant's when they hold `*`;
    /// of `job_type` only, unless it is empty): every queue with a live job,
    /// a pause, or a job counted in the last hour. Windows with nothing left
    /// to count are dropped here.
    pub(super) fn queue_stats(&mut self, tenants: &[String], job_type: &str) -> Vec<QueueStats> {
        let now = self.clock;
        let stats = self.queue_figures(tenants, job_type, now);
        self.windows.retain(|_, by_tenant| {
            by_tenant.retain(|_, window| !window.is_stale(now));
            !by_tenant.is_empty()
        });
        stats
    }

    /// The figures [`Self::queue_stats`] answers, as of `now`, changing
    /// nothing: what a read off the log answers.
    pub(super) fn queue_figures(&self, tenants: &[String], job_type: &str, now: Millis) -> Vec<QueueStats> {
        let every_tenant = tenants.iter().any(|t| t == "*");
        let listed = |t: &String| every_tenant || tenants.contains(t);
        let mut stats: BTreeMap<(&str, &str), QueueStats> = BTreeMap::new();
        let wanted = |t: &str| job_type.is_empty() || t == job_type;
        let blank = |tenant: &str, job_type: &str| QueueStats {
            tenant: tenant.to_string(),
            job_type: job_type.to_string(),
            at: now,
            ..Default::default()
        };
        for (tenant, keys) in self.by_tenant.iter().filter(|(t, _)| listed(t)) {
            for job in keys.iter().filter_map(|k| self.jobs.get(k)).filter(|j| wanted(&j.spec.job_type)) {
                let entry = stats
                    .entry((tenant.as_str(), job.spec.job_type.as_str()))
                    .or_insert_with(|| blank(tenant, &job.spec.job_type));
                match job.state {
                    JobState::Activatable => {
                        entry.available += 1;
                        entry.oldest_available_at =
                            Some(entry.oldest_available_at.map_or(job.created_at, |at| at.min(job.created_at)));
                    }
                    JobState::Activated => entry.active += 1,
                    JobState::Scheduled if job.attempt > 0 => entry.retrying += 1,
                    JobState::Scheduled => entry.scheduled += 1,
                    JobState::Incident => entry.incidents += 1,
                    JobState::Completed | JobState::Cancelled | JobState::Expired => {}
                }
            }
        }
        for (queue_type, by_tenant) in self.paused.iter().filter(|(t, _)| wanted(t)) {
            for (tenant, at) in by_tenant.iter().filter(|(t, _)| listed(t)) {
                stats.entry((tenant, queue_type)).or_insert_with(|| blank(tenant, queue_type)).paused_at = Some(*at);
            }
        }
        for (queue_type, by_tenant) in self.windows.iter().filter(|(t, _)| wanted(t)) {
            for (tenant, window) in by_tenant.iter().filter(|(t, w)| listed(t) && !w.is_stale(now)) {
                let entry = stats.entry((tenant, queue_type)).or_insert_with(|| blank(tenant, queue_type));
                entry.last_minute = window.since(now, MINUTE_MS);
                entry.last_hour = window.since(now, HOUR_MS);
            }
        }
        stats.into_values().collect()
    }
}
