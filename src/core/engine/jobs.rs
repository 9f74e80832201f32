//! The job lifecycle on one partition: create, activate, complete, fail,
//! retries, timeouts, cancel, yield and checkpoints, and the one path every
//! failed attempt takes (a worker's failure or its death): retries left
//! decide between an incident, a back-off and activatable at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::{queues, ApplyOutput, PartitionState};
use crate::core::retry;
use crate::core::workflow::StepState;
use crate::core::{
    describe_fence, event_text, fence_admits, payload_fingerprint, Checkpoint, CommandError, CommandResult, EventKind,
    FailReason, Guard, History, Job, JobKey, JobSpec, JobState, Lifecycle, NewJob, Outcome, Refusal, RequestId, Tally,
    YieldReason, TAGGED_ATTEMPT,
};

/// A worker's failure of an attempt, as [`crate::core::Command::Fail`] carries it.
pub(super) struct Failure<'a> {
    pub key: JobKey,
    pub attempt: u32,
    pub retries: i32,
    pub message: &'a str,
    pub back_off_ms: i64,
    pub variables: &'a Bytes,
    pub max_payload_bytes: u64,
    pub reason: FailReason,
}

/// A failure the job's policy decides, as [`crate::core::Command::FailByPolicy`] carries it.
pub(super) struct PolicyFailure<'a> {
    pub key: JobKey,
    pub attempt: u32,
    pub message: &'a str,
    pub error_type: &'a str,
    pub retryable: bool,
    pub jitter: u16,
    pub variables: &'a Bytes,
    pub max_payload_bytes: u64,
}

impl PartitionState {
    pub(super) fn complete(
        &mut self,
        key: JobKey,
        attempt: u32,
        variables: &Bytes,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        self.activation_of(key, attempt, "complete")?;
        let mut job = self.remove(key);
        job.state = JobState::Completed;
        job.history.record(self.clock, EventKind::Completed { attempt: job.attempt });
        job.result = variables.clone();
        out.activated_to_completed.push(self.clock - job.activated_at);
        out.count(&job.spec.job_type, Outcome::Completed);
        queues::tally(
            &mut self.windows,
            self.clock,
            &job.spec,
            Tally::Completed { ran_ms: self.clock - job.activated_at },
        );
        out.happen(Lifecycle::Completed, &job, self.clock - job.activated_at, String::new());
        out.finished.push(job);
        self.step_ended(key, StepState::Completed, variables, "", out);
        Ok(CommandResult::Done)
    }

    /// A completion that must pass `guard` first ([`Command::CompleteGuarded`]).
    pub(super) fn complete_guarded(
        &mut self,
        key: JobKey,
        attempt: u32,
        variables: &Bytes,
        guard: &Guard,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        let Some(job) = self.jobs.get(&key) else {
            return Err(self.absent(key));
        };
        match guard.admits(job) {
            Err(Refusal::NotThisJob) => return Err(CommandError::not_found(key)),
            Err(Refusal::NotThisActivation(why)) => return Err(CommandError::precondition(why)),
            Ok(()) => {}
        }
        // Whichever activation holds the job; a job not held is refused by
        // the fence as any completion is (with 0: "it is ..., not activated").
        let fence = if attempt == 0 && job.state == JobState::Activated { job.attempt } else { attempt };
        self.complete(key, fence, variables, out)?;
        Ok(CommandResult::Completed { attempt: fence })
    }

    pub(super) fn fail(&mut self, failure: Failure<'_>, out: &mut ApplyOutput) -> Result<CommandResult, CommandError> {
        let Failure { key, attempt, retries, message, back_off_ms, variables, max_payload_bytes, reason } = failure;
        if retries < 0 || back_off_ms < 0 {
            return Err(CommandError::invalid("retries and retry_back_off must be zero or more"));
        }
        if self.already_failed(key, attempt) {
            // A retried request whose first send took effect.
            return Ok(CommandResult::Done);
        }
        self.begin_failure(key, attempt, variables, max_payload_bytes, out)?;
        let job = &self.jobs[&key];
        let (retries, back_off_ms) = match reason {
            FailReason::MalformedPayload | FailReason::BusinessError => (0, 0),
            FailReason::WorkerShutdown => (job.retries, 0),
            _ => (retries, back_off_ms),
        };
        self.fail_attempt(key, reason, message.to_string(), retries, back_off_ms, out);
        Ok(CommandResult::Done)
    }

    /// What every failure by a worker checks and takes before the job
    /// changes: that `attempt` holds it, and the variables it merges (which
    /// may refuse the failure, so they are decided first).
    fn begin_failure(
        &mut self,
        key: JobKey,
        attempt: u32,
        variables: &Bytes,
        max_payload_bytes: u64,
        out: &mut ApplyOutput,
    ) -> Result<(), CommandError> {
        self.activation_of(key, attempt, "fail")?;
        if !variables.is_empty() {
            let spec = self.spec_with_variables(key, variables, max_payload_bytes, "fail")?;
            self.jobs.get_mut(&key).expect("checked by activation_of").spec = spec;
            out.specs.push(key);
        }
        Ok(())
    }

    /// A failed attempt whose job's retry policy decides what follows
    /// ([`crate::core::Command::FailByPolicy`]): the same path as a
    /// worker's failure, with the retries and back-off the policy gives.
    pub(super) fn fail_by_policy(
        &mut self,
        failure: PolicyFailure<'_>,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        let PolicyFailure { key, attempt, message, error_type, retryable, jitter, variables, max_payload_bytes } =
            failure;
        if self.already_failed(key, attempt) {
            // A retried request whose first send took effect: answered with
            // what it decided (the wait that is left of its back-off).
            let job = &self.jobs[&key];
            let back_off_ms = match job.state {
                JobState::Scheduled => (job.due_at - self.clock).max(0),
                _ => 0,
            };
            return Ok(CommandResult::Failed { retries: job.retries, back_off_ms });
        }
        self.begin_failure(key, attempt, variables, max_payload_bytes, out)?;
        let job = &self.jobs[&key];
        let policy = retry::retry_policy(&job.spec).unwrap_or_default();
        let (retries, back_off_ms) = policy.decide(job.retries, job.attempt, error_type, retryable, jitter);
        self.fail_attempt(key, FailReason::Failed, message.to_string(), retries, back_off_ms, out);
        Ok(CommandResult::Failed { retries, back_off_ms })
    }

    /// The one path of a failed attempt, whoever ended it (its worker, or
    /// the broker when its session died): the activation ends, the failure
    /// is recorded, and with `retries` left the job is due again after
    /// `back_off_ms` (at once without one); with none it is an incident.
    pub(super) fn fail_attempt(
        &mut self,
        key: JobKey,
        reason: FailReason,
        message: String,
        retries: i32,
        back_off_ms: i64,
        out: &mut ApplyOutput,
    ) {
        let now = self.clock;
        let job = self.jobs.get_mut(&key).expect("the caller checked the job is activated");
        self.deadlines.remove(&(job.deadline, key));
        self.held.remove(&(job.session, key));
        job.deadline = 0;
        job.retries = retries;
        job.failed_attempt = job.attempt;
        job.fail_reason = reason;
        let back_off_ms = if retries == 0 { 0 } else { back_off_ms };
        job.history.record(
            now,
            EventKind::Failed { attempt: job.attempt, reason, message: message.clone(), retries, back_off_ms },
        );
        job.error_message = message;
        out.count(&job.spec.job_type, Outcome::Failed);
        queues::tally(&mut self.windows, now, &job.spec, Tally::Failed);
        out.happen(Lifecycle::Failed, job, 0, event_text(&job.error_message));
        out.failures.push((job.spec.job_type.clone(), reason, job.worker.clone()));
        if retries == 0 {
            out.count(&job.spec.job_type, Outcome::Incident);
            queues::tally(&mut self.windows, now, &job.spec, Tally::Exhausted);
            out.happen(Lifecycle::Incident, job, 0, String::new());
            job.history.record(now, EventKind::Incident);
            job.state = JobState::Incident;
        } else if back_off_ms > 0 {
            job.state = JobState::Scheduled;
            job.due_at = now.saturating_add(back_off_ms);
            self.due.insert((job.due_at, key));
            out.happen(Lifecycle::Retrying, job, job.due_at, String::new());
        } else {
            job.state = JobState::Activatable;
            out.happen(Lifecycle::Retrying, job, now, String::new());
            self.make_ready(key, out);
        }
        out.touched.push(key);
        if retries == 0 && !self.step_jobs.is_empty() {
            let error = self.jobs[&key].error_message.clone();
            self.step_ended(key, StepState::Failed, &Bytes::new(), &error, out);
        }
    }

    pub(super) fn update_timeout(
        &mut self,
        key: JobKey,
        attempt: u32,
        timeout_ms: i64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if timeout_ms <= 0 {
            return Err(CommandError::invalid("timeout must be greater than zero"));
        }
        self.activation_of(key, attempt, "update the timeout of")?;
        let deadline = self.clock.saturating_add(timeout_ms);
        let job = self.jobs.get_mut(&key).expect("checked by activation_of");
        self.deadlines.remove(&(job.deadline, key));
        job.deadline = deadline;
        // Later checkpoints extend by the timeout the worker asked for last.
        job.timeout_ms = timeout_ms;
        job.history.record(self.clock, EventKind::Extended { attempt: job.attempt, deadline, count: 1 });
        self.deadlines.insert((deadline, key));
        out.touched.push(key);
        Ok(CommandResult::Deadline(deadline))
    }

    pub(super) fn update_retries(
        &mut self,
        key: JobKey,
        retries: i32,
        by: &str,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if retries < 0 {
            return Err(CommandError::invalid("retries must be zero or more"));
        }
        let now = self.clock;
        let job = self.live_job(key)?;
        job.retries = retries;
        job.history.record(now, EventKind::RetriesUpdated { retries, by: by.to_string() });
        let revive = job.state == JobState::Incident && retries > 0;
        if revive {
            job.state = JobState::Activatable;
            job.error_message.clear();
            self.make_ready(key, out);
        }
        out.touched.push(key);
        Ok(CommandResult::Done)
    }

    pub(super) fn cancel(
        &mut self,
        key: JobKey,
        by: &str,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        self.live_job(key)?;
        let mut job = self.remove(key);
        job.state = JobState::Cancelled;
        job.history.record(self.clock, EventKind::Cancelled { by: by.to_string() });
        out.happen(Lifecycle::Cancelled, &job, 0, event_text(by));
        out.count(&job.spec.job_type, Outcome::Cancelled);
        out.finished.push(job);
        self.step_ended(key, StepState::Failed, &Bytes::new(), &format!("cancelled by {by}"), out);
        Ok(CommandResult::Done)
    }

    /// A pushed activation no client could take: activatable again, no retry used.
    pub(super) fn yield_job(
        &mut self,
        key: JobKey,
        attempt: u32,
        gateway: u64,
        reason: YieldReason,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        self.activation_of(key, attempt, "yield")?;
        let job = self.jobs.get_mut(&key).expect("checked by activation_of");
        self.deadlines.remove(&(job.deadline, key));
        self.held.remove(&(job.session, key));
        job.deadline = 0;
        job.state = JobState::Activatable;
        job.history.record(self.clock, EventKind::Yielded { attempt: job.attempt, gateway, reason });
        out.count(&job.spec.job_type, Outcome::Yielded);
        self.make_ready(key, out);
        out.touched.push(key);
        Ok(CommandResult::Done)
    }

    pub(super) fn checkpoint(
        &mut self,
        key: JobKey,
        attempt: u32,
        stage: &str,
        variables: &Bytes,
        max_payload_bytes: u64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if attempt == 0 {
            return Err(CommandError::invalid(format!(
                "cannot checkpoint job {key} without the activation's attempt: a checkpoint is fenced by it"
            )));
        }
        self.activation_of(key, attempt, "checkpoint")?;
        // The fence may name the activation by its tag; record the attempt itself.
        let attempt = self.jobs[&key].attempt;
        // A retried checkpoint whose first send took effect extends the lease again.
        let repeat = self.jobs[&key].checkpoints.last().is_some_and(|c| c.stage == stage && c.attempt == attempt);
        if !repeat {
            self.check_stage_order(key, stage)?;
        }
        let spec = if variables.is_empty() || repeat {
            None
        } else {
            Some(self.spec_with_variables(key, variables, max_payload_bytes, "checkpoint")?)
        };
        let now = self.clock;
        let job = self.jobs.get_mut(&key).expect("checked by activation_of");
        if let Some(spec) = spec {
            job.spec = spec;
            out.specs.push(key);
        }
        if !repeat {
            job.checkpoints.push(Checkpoint { stage: stage.to_string(), attempt, at: now });
            job.history.record(now, EventKind::Checkpointed { attempt, stage: stage.to_string() });
            out.checkpoints.push((job.spec.job_type.clone(), stage.to_string()));
            out.count(&job.spec.job_type, Outcome::Checkpointed);
        }
        // A checkpoint is a sign of life: the lease runs a full timeout from now.
        self.deadlines.remove(&(job.deadline, key));
        job.deadline = now.saturating_add(job.timeout_ms.max(1));
        self.deadlines.insert((job.deadline, key));
        out.touched.push(key);
        Ok(CommandResult::Deadline(job.deadline))
    }
    /// Checks that `stage` is declared by the job and after its last committed one.
    pub(super) fn check_stage_order(&self, key: JobKey, stage: &str) -> Result<(), CommandError> {
        let job = &self.jobs[&key];
        let declared = &job.spec.stages;
        if declared.is_empty() {
            return Err(CommandError::precondition(format!(
                "cannot checkpoint job {key}: it declares no stages (give stages when creating the job)"
            )));
        }
        let Some(position) = declared.iter().position(|s| s == stage) else {
            return Err(CommandError::invalid(format!(
                "cannot checkpoint job {key} at stage {stage:?}: its stages are {declared:?}"
            )));
        };
        if let Some(last) = job.checkpoints.last() {
            let reached = declared.iter().position(|s| *s == last.stage).unwrap_or(0);
            if position <= reached {
                return Err(CommandError::precondition(format!(
                    "cannot checkpoint job {key} at stage {stage:?}: stage {:?} is already committed (by attempt \
                     {}), and stages only move forward along {declared:?}; resume after it",
                    last.stage, last.attempt
                )));
            }
        }
        Ok(())
    }
    /// The job's spec with `update` merged into its variables (see
    /// [`Command::Fail`]); refused when the result outgrows the payload limit.
    pub(super) fn spec_with_variables(
        &self,
        key: JobKey,
        update: &[u8],
        max_payload_bytes: u64,
        verb: &str,
    ) -> Result<Arc<JobSpec>, CommandError> {
        let spec = &self.jobs[&key].spec;
        let merged = merge_variables(&spec.variables, update).map_err(|e| {
            CommandError::invalid(format!("cannot {verb} job {key}: variables must be a JSON object ({e})"))
        })?;
        let headers: usize = spec.custom_headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        let payload = (merged.len() + headers) as u64;
        // A job created under a larger limit may keep its size, never grow past this one.
        if payload > max_payload_bytes && merged.len() > spec.variables.len() {
            return Err(CommandError::exhausted(format!(
                "cannot {verb} job {key} with these variables: merged into the job's, its variables and custom \
                 headers would be {payload} bytes; this node accepts at most {max_payload_bytes} (setting \
                 max_payload_bytes); send fewer or smaller variables, or none"
            )));
        }
        Ok(Arc::new(JobSpec { variables: merged, ..JobSpec::clone(spec) }))
    }
    /// A producer's create: made here, or, for a limited queue whose home
    /// is another partition, answered [`CommandResult::Elsewhere`] (the
    /// gateway sends it there). A create with an idempotency key stays where
    /// its repeats will look for it, and so does a repeat of one made here
    /// before the limit; the jobs a schedule or workflow makes are made
    /// where they are (through [`Self::create`]).
    pub(super) fn create_or_redirect(
        &mut self,
        new_job: &NewJob,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if !matches!(new_job.request, Some(RequestId::Key { .. })) {
            if let Some(home) = self.limit_elsewhere(&new_job.spec.tenant, &new_job.spec.job_type) {
                if new_job.request.as_ref().is_none_or(|request| self.requests.find(request).is_none()) {
                    return Ok(CommandResult::Elsewhere(home));
                }
            }
        }
        self.create(new_job, out)
    }

    pub(super) fn create(&mut self, new_job: &NewJob, out: &mut ApplyOutput) -> Result<CommandResult, CommandError> {
        if let Some(request) = &new_job.request {
            if let Some(seen) = self.requests.find(request) {
                // The key went to another partition after partitions were
                // added (see `probe_key`): the create goes there.
                if seen.job.counter() == 0 {
                    return Ok(CommandResult::Elsewhere(seen.job.partition()));
                }
                if matches!(request, RequestId::Key { .. }) && seen.fingerprint != payload_fingerprint(&new_job.spec) {
                    return Err(CommandError::precondition(format!(
                        "{request} was used for job {} with another type, variables or custom headers; \
                         an idempotency key names one job's content for its whole window",
                        seen.job
                    )));
                }
                let state = self.jobs.get(&seen.job).map(|job| job.state);
                return Ok(CommandResult::Created { key: seen.job, created: false, state });
            }
        }
        if let Some(schema) = self.schemas.get(&new_job.spec.job_type) {
            schema.check(&new_job.spec.variables).map_err(|e| {
                CommandError::invalid(format!(
                    "the variables do not match the schema of job type {:?} {e}",
                    new_job.spec.job_type
                ))
            })?;
        }
        let now = self.clock;
        let key = JobKey::new(self.partition, self.next_counter);
        self.next_counter += 1;
        let due_at = match new_job.run_at {
            Some(at) => at,
            None => now.saturating_add(new_job.delay_ms.max(0)),
        };
        let state = if due_at > now { JobState::Scheduled } else { JobState::Activatable };
        let mut job = Job {
            key,
            spec: Arc::clone(&new_job.spec),
            state,
            retries: new_job.retries,
            attempt: 0,
            worker: String::new(),
            deadline: 0,
            due_at: due_at.max(now),
            created_at: now,
            error_message: String::new(),
            result: Default::default(),
            activated_at: 0,
            failed_attempt: 0,
            timeout_ms: 0,
            fail_reason: FailReason::Failed,
            checkpoints: Vec::new(),
            session: 0,
            history: History::default(),
        };
        let gateway = match &new_job.request {
            Some(RequestId::Gateway { node, .. }) => *node,
            _ => 0,
        };
        job.history.record(
            now,
            EventKind::Created {
                user: new_job.spec.user.clone(),
                gateway,
                idempotency_key: new_job.spec.idempotency_key.clone(),
            },
        );
        out.count(&new_job.spec.job_type, Outcome::Created);
        queues::tally(&mut self.windows, now, &new_job.spec, Tally::Created);
        out.happen(Lifecycle::Created, &job, 0, String::new());
        self.list_under_tenant(&job);
        self.note_expiry(&job);
        self.jobs.insert(key, job);
        if state == JobState::Scheduled {
            self.due.insert((due_at, key));
        } else {
            self.make_ready(key, out);
        }
        out.touched.push(key);
        out.specs.push(key);
        if let Some(request) = &new_job.request {
            self.remember(request, key, &new_job.spec, new_job.dedupe_window_ms, out);
        }
        // A job created already past its expiry ended at once.
        let state = self.jobs.get(&key).map_or(JobState::Expired, |job| job.state);
        Ok(CommandResult::Created { key, created: true, state: Some(state) })
    }
    /// Whether attempt `attempt` of `key` already failed, by a worker's own
    /// failure, and nothing has activated the job since. An attempt the
    /// broker ended because its session died or ended is not: the worker's
    /// failure (and its back-off) did not take effect, and it is told so
    /// rather than answered OK.
    pub(super) fn already_failed(&self, key: JobKey, attempt: u32) -> bool {
        attempt != 0
            && self.jobs.get(&key).is_some_and(|job| {
                job.state != JobState::Activated
                    && fence_admits(attempt, job.attempt)
                    && job.failed_attempt == job.attempt
                    && !job.fail_reason.by_broker()
            })
    }
    /// Checks that `key` is activated under the fence `attempt` (see [`fence_admits`]).
    pub(super) fn activation_of(&self, key: JobKey, attempt: u32, verb: &str) -> Result<(), CommandError> {
        let Some(job) = self.jobs.get(&key) else {
            return Err(self.absent(key));
        };
        if job.state != JobState::Activated {
            let over =
                if attempt & TAGGED_ATTEMPT != 0 { job.attempt > 0 } else { attempt != 0 && job.attempt >= attempt };
            if over {
                return Err(CommandError::precondition(format!(
                    "cannot {verb} job {key}: {} is over (it timed out or was handed back; the job is {}); \
                     the job is no longer yours",
                    describe_fence(attempt),
                    job.state.as_str()
                )));
            }
            return Err(CommandError::precondition(format!(
                "cannot {verb} job {key}: it is {}, not activated",
                job.state.as_str()
            )));
        }
        if !fence_admits(attempt, job.attempt) {
            return Err(CommandError::precondition(format!(
                "cannot {verb} job {key}: {} was superseded by attempt {} (it timed out and was activated \
                 again); the job is no longer yours",
                describe_fence(attempt),
                job.attempt
            )));
        }
        Ok(())
    }
}

/// `update`'s top-level keys written over `current`'s (both JSON objects).
/// Values keep the bytes they were sent as; the top level is written anew,
/// keys in order.
fn merge_variables(current: &[u8], update: &[u8]) -> Result<Bytes, serde_json::Error> {
    let mut merged: BTreeMap<String, &RawValue> = serde_json::from_slice(current)?;
    let update: BTreeMap<String, &RawValue> = serde_json::from_slice(update)?;
    merged.extend(update);
    Ok(Bytes::from(serde_json::to_vec(&merged)?))
}
