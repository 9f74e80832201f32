//! What fires at a batch's time: jobs that became due, activations whose
//! deadline passed, sessions whose lease ran out, and schedules' ticks.

use super::{ApplyOutput, PartitionState};
use bytes::Bytes;

use crate::core::workflow::StepState;
use crate::core::{expires_at, EventKind, Job, JobKey, JobState, Lifecycle, Outcome};

impl PartitionState {
    pub(super) fn fire_timers(&mut self, out: &mut ApplyOutput) {
        let now = self.clock;
        while let Some(&(at, key)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if let Some(job) = self.jobs.get_mut(&key) {
                job.state = JobState::Activatable;
                job.history.record(now, EventKind::Due);
                self.make_ready(key, out);
            }
        }
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(job) = self.jobs.get_mut(&key) {
                // A timeout hands the job back without consuming a retry.
                job.state = JobState::Activatable;
                job.deadline = 0;
                self.held.remove(&(job.session, key));
                job.history.record(now, EventKind::TimedOut { attempt: job.attempt });
                out.count(&job.spec.job_type, Outcome::TimedOut);
                out.happen(crate::core::Lifecycle::TimedOut, job, 0, String::new());
                self.make_ready(key, out);
            }
        }
        while let Some(&(at, id)) = self.session_expiry.first() {
            if at > now {
                break;
            }
            self.session_expiry.pop_first();
            let Some(session) = self.sessions.remove(&id) else { continue };
            self.session_owners.remove(&id);
            out.sessions_changed = true;
            let why = format!(
                "worker {:?} (session {id:x} on {:?}, pid {}) died: no heartbeat for {} ms",
                session.info.worker, session.info.hostname, session.info.pid, session.info.dead_after_ms
            );
            for key in self.take_held(id) {
                self.worker_died(key, &why, out);
            }
            out.sessions_died.push(session.info);
        }
        while let Some(&(at, key)) = self.expiring.first() {
            if at > now {
                break;
            }
            self.expiring.pop_first();
            // An activated job runs on; should it come back, making it
            // ready expires it then.
            self.expire_if_due(key, out);
        }
        self.fire_schedules(out);
        self.forget_workflows(out);
        self.wake_limits(out);
    }
}

impl PartitionState {
    /// Indexes a live job's expiry, if it has one.
    pub(super) fn note_expiry(&mut self, job: &Job) {
        if job.state.is_final() {
            return;
        }
        if let Some(at) = expires_at(&job.spec) {
            self.expiries_seen = true;
            self.expiring.insert((at, job.key));
        }
    }

    /// Ends a job past its expiry that waits (scheduled or activatable) as
    /// expired; answers whether it did. An activated job, or one in an
    /// incident, is left as it is.
    pub(super) fn expire_if_due(&mut self, key: JobKey, out: &mut ApplyOutput) -> bool {
        let now = self.clock;
        let Some(job) = self.jobs.get(&key) else { return false };
        let Some(at) = expires_at(&job.spec).filter(|at| *at <= now) else { return false };
        if !matches!(job.state, JobState::Scheduled | JobState::Activatable) {
            return false;
        }
        let mut job = self.remove(key);
        job.state = JobState::Expired;
        job.history.record(now, EventKind::Expired { at });
        out.happen(Lifecycle::Expired, &job, at, String::new());
        out.count(&job.spec.job_type, Outcome::Expired);
        out.finished.push(job);
        self.step_ended(key, StepState::Failed, &Bytes::new(), "expired", out);
        true
    }
}
