//! Worker sessions on one partition (register, beat, direct, end, die) and
//! the JSON Schemas creates must satisfy.

use std::sync::Arc;

use bytes::Bytes;

use super::{ApplyOutput, PartitionState};
use crate::core::{
    Batch, Command, CommandError, CommandResult, ErrorKind, EventKind, FailReason, JobKey, JobState, Millis, Outcome,
    Schema, Session, SessionId, SessionInfo, SessionTarget, WorkerState,
};

impl PartitionState {
    /// A new leader's entry restarts leases before timers fire: those its
    /// leading [`Command::RenewLeases`] threatens, or every one when it set
    /// the flag of data versions before 18.
    pub(super) fn renew_leases(&mut self, batch: &Batch, out: &mut ApplyOutput) {
        if batch.renew_sessions {
            self.renew_sessions(None, out);
        }
        if let Some(Command::RenewLeases { gap_ms }) = batch.commands.first() {
            self.renew_sessions(Some(*gap_ms), out);
        }
    }
    /// Restarts from now the lease of every session a leaderless gap of
    /// `gap` ms threatens, or of every session without a gap (a take-over's
    /// entry below data version 18).
    fn renew_sessions(&mut self, gap: Option<Millis>, out: &mut ApplyOutput) {
        let now = self.clock;
        for (id, session) in &mut self.sessions {
            if session.last_beat < now && gap.is_none_or(|gap| session.info.threatened_by(gap)) {
                self.session_expiry.remove(&(session.expires_at(), *id));
                session.last_beat = now;
                self.session_expiry.insert((session.expires_at(), *id));
                out.sessions_changed = true;
            }
        }
    }
    /// Removes and returns the jobs a session holds here.
    pub(super) fn take_held(&mut self, id: SessionId) -> Vec<JobKey> {
        let keys: Vec<JobKey> =
            self.held.range((id, JobKey(0))..=(id, JobKey(u64::MAX))).map(|(_, key)| *key).collect();
        for key in &keys {
            self.held.remove(&(id, *key));
        }
        keys
    }
    /// Ends the activation of a job whose worker died: a failed attempt, one
    /// retry fewer, due again after the job's retry back-off; an incident at
    /// no retries left.
    pub(super) fn worker_died(&mut self, key: JobKey, why: &str, out: &mut ApplyOutput) {
        let Some(job) = self.jobs.get(&key) else { return };
        if job.state != JobState::Activated {
            return;
        }
        let (retries, back_off_ms) = ((job.retries - 1).max(0), job.spec.retry_back_off_ms);
        self.fail_attempt(key, FailReason::WorkerDied, why.to_string(), retries, back_off_ms, out);
    }

    pub(super) fn register(&mut self, info: &Arc<SessionInfo>, out: &mut ApplyOutput) {
        let now = self.clock;
        out.sessions_changed = true;
        if let Some(session) = self.sessions.get_mut(&info.id) {
            // A repeated registration (its first answer was lost): renew the lease.
            self.session_expiry.remove(&(session.expires_at(), info.id));
            session.last_beat = now;
            self.session_expiry.insert((session.expires_at(), info.id));
            return;
        }
        let session = Session::new(Arc::clone(info), now);
        self.session_expiry.insert((session.expires_at(), info.id));
        self.sessions.insert(info.id, session);
        self.offer(info, out);
    }
    /// Marks the types a session serves as available, so leaders offer their
    /// waiting jobs to its streams.
    pub(super) fn offer(&self, info: &SessionInfo, out: &mut ApplyOutput) {
        for job_type in &info.job_types {
            if !out.available.contains(job_type) {
                out.available.push(job_type.clone());
            }
        }
    }
    pub(super) fn beat(
        &mut self,
        id: SessionId,
        state: WorkerState,
        held: &[(JobKey, u32)],
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        let now = self.clock;
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(unknown_session(id));
        };
        self.session_expiry.remove(&(session.expires_at(), id));
        let was_taking = session.takes_jobs();
        session.last_beat = now;
        session.reported = state;
        self.session_expiry.insert((session.expires_at(), id));
        let directed = session.directed;
        if !was_taking && session.takes_jobs() {
            let info = Arc::clone(&session.info);
            self.offer(&info, out);
        }
        out.sessions_changed = true;
        let (mut revoked, mut renewed) = (Vec::new(), Vec::new());
        for &(key, attempt) in held {
            let Some(job) = self.jobs.get_mut(&key) else {
                revoked.push(key);
                continue;
            };
            if job.state != JobState::Activated || job.attempt != attempt {
                revoked.push(key);
                continue;
            }
            if job.session != id {
                // Held through another activation path; not this session's to renew.
                continue;
            }
            renewed.push(key);
            // The visibility timeout: a beat keeps the job a full timeout from now.
            let deadline = now.saturating_add(job.timeout_ms.max(1));
            if deadline > job.deadline {
                self.deadlines.remove(&(job.deadline, key));
                job.deadline = deadline;
                self.deadlines.insert((deadline, key));
                job.history.record(now, EventKind::Extended { attempt, deadline, count: 1 });
                out.touched.push(key);
            }
        }
        Ok(CommandResult::Beat { directed, revoked, renewed })
    }
    pub(super) fn direct(
        &mut self,
        target: &SessionTarget,
        state: WorkerState,
        out: &mut ApplyOutput,
    ) -> Vec<(Session, u32)> {
        let mut covered = Vec::new();
        let mut resumed = Vec::new();
        for session in self.sessions.values_mut().filter(|s| target.matches(&s.info)) {
            let was_taking = session.takes_jobs();
            session.directed = state;
            if !was_taking && session.takes_jobs() {
                resumed.push(Arc::clone(&session.info));
            }
            covered.push(session.clone());
        }
        for info in resumed {
            self.offer(&info, out);
        }
        out.sessions_changed |= !covered.is_empty();
        covered
            .into_iter()
            .map(|s| {
                let held = self.held_by(s.info.id) as u32;
                (s, held)
            })
            .collect()
    }
    /// Ends a session: what it still holds is handed back at once, no retry used.
    pub(super) fn end_session(&mut self, id: SessionId, out: &mut ApplyOutput) {
        let Some(session) = self.sessions.remove(&id) else { return };
        self.session_owners.remove(&id);
        self.session_expiry.remove(&(session.expires_at(), id));
        out.sessions_changed = true;
        for key in self.take_held(id) {
            let Some(job) = self.jobs.get_mut(&key) else { continue };
            if job.state != JobState::Activated {
                continue;
            }
            self.deadlines.remove(&(job.deadline, key));
            job.deadline = 0;
            job.failed_attempt = job.attempt;
            job.fail_reason = FailReason::SessionEnded;
            job.error_message = format!("worker {:?} ended its session while holding the job", session.info.worker);
            job.history.record(
                self.clock,
                EventKind::Failed {
                    attempt: job.attempt,
                    reason: FailReason::SessionEnded,
                    message: job.error_message.clone(),
                    retries: job.retries,
                    back_off_ms: 0,
                },
            );
            job.state = JobState::Activatable;
            out.count(&job.spec.job_type, Outcome::Failed);
            super::queues::tally(&mut self.windows, self.clock, &job.spec, crate::core::Tally::Failed);
            out.happen(crate::core::Lifecycle::Failed, job, 0, "its worker session ended".into());
            out.failures.push((job.spec.job_type.clone(), FailReason::SessionEnded, job.worker.clone()));
            self.make_ready(key, out);
        }
    }

    pub(super) fn set_schema(
        &mut self,
        job_type: &str,
        schema: &Bytes,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if schema.is_empty() {
            self.schemas.remove(job_type);
        } else {
            let compiled = Schema::compile(schema.clone())
                .map_err(|e| CommandError::invalid(format!("schema for job type {job_type:?}: {e}")))?;
            self.schemas.insert(job_type.to_string(), compiled);
        }
        out.schemas_changed = true;
        Ok(CommandResult::Done)
    }
}

pub(super) fn unknown_session(id: SessionId) -> CommandError {
    CommandError {
        kind: ErrorKind::NotFound,
        message: format!(
            "no worker session {id:x}: it ended, or missed its heartbeats for its dead-after time; register again"
        ),
    }
}
