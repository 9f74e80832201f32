//! The indexes of a partition's live jobs, kept in step with each job's
//! state: the ready and parked queues (by type, then by queue key and
//! priority), deadlines, the jobs each session holds, due times, and each
//! tenant's keys.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{ApplyOutput, PartitionState, QueueKey};
use crate::core::{Job, JobKey, JobState};

impl PartitionState {
    /// Adds a new live job's key to its tenant's (see `by_tenant`).
    pub(super) fn list_under_tenant(&mut self, job: &Job) {
        match self.by_tenant.get_mut(&job.spec.tenant) {
            Some(keys) => {
                keys.insert(job.key);
            }
            None => {
                self.by_tenant.insert(job.spec.tenant.clone(), BTreeSet::from([job.key]));
            }
        }
    }

    pub(super) fn make_ready(&mut self, key: JobKey, out: &mut ApplyOutput) {
        if self.expiries_seen && self.expire_if_due(key, out) {
            return;
        }
        if !self.step_jobs.is_empty() && self.cancel_if_workflow_ended(key, out) {
            return;
        }
        let job = &self.jobs[&key];
        let job_type = &job.spec.job_type;
        let paused = self.is_paused(&job.spec.tenant, job_type);
        if !paused && !out.available.iter().any(|t| t == job_type) {
            out.available.push(job_type.clone());
        }
        let entry = (Reverse(job.spec.priority), key);
        let queues = if paused { &mut self.parked } else { &mut self.ready };
        // The type's queue usually exists: look it up before cloning names.
        let queue = match queues.get_mut(job_type) {
            Some(queues) => queues.entry(QueueKey::of(job)).or_default(),
            None => queues.entry(job_type.clone()).or_default().entry(QueueKey::of(job)).or_default(),
        };
        queue.insert(entry);
        out.touched.push(key);
    }

    pub(super) fn index(&mut self, job: &Job) {
        match job.state {
            JobState::Activatable => {
                self.queues_for(&job.spec.tenant, &job.spec.job_type)
                    .entry(job.spec.job_type.clone())
                    .or_default()
                    .entry(QueueKey::of(job))
                    .or_default()
                    .insert((Reverse(job.spec.priority), job.key));
            }
            JobState::Activated => {
                self.deadlines.insert((job.deadline, job.key));
                if job.session != 0 {
                    self.held.insert((job.session, job.key));
                }
            }
            JobState::Scheduled => {
                self.due.insert((job.due_at, job.key));
            }
            JobState::Incident | JobState::Completed | JobState::Cancelled | JobState::Expired => {}
        }
        self.note_expiry(job);
    }

    pub(super) fn unindex(&mut self, job: &Job) {
        match job.state {
            JobState::Activatable => {
                let by_type = self.queues_for(&job.spec.tenant, &job.spec.job_type);
                if let Some(queues) = by_type.get_mut(&job.spec.job_type) {
                    let key = QueueKey::of(job);
                    if let Some(queue) = queues.get_mut(&key) {
                        queue.remove(&(Reverse(job.spec.priority), job.key));
                        if queue.is_empty() {
                            queues.remove(&key);
                        }
                    }
                    if queues.is_empty() {
                        by_type.remove(&job.spec.job_type);
                    }
                }
            }
            JobState::Activated => {
                self.deadlines.remove(&(job.deadline, job.key));
                self.held.remove(&(job.session, job.key));
            }
            JobState::Scheduled => {
                self.due.remove(&(job.due_at, job.key));
            }
            JobState::Incident | JobState::Completed | JobState::Cancelled | JobState::Expired => {}
        }
    }
}
