//! What fires at a batch's time: jobs that became due, activations whose
//! deadline passed, and sessions whose lease ran out.

use super::{ApplyOutput, PartitionState};
use crate::core::{EventKind, JobState, Outcome};

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
    }
}
