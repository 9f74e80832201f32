//! The job API's operations on single jobs and listings: create (one, and a
//! create stream's chunks), complete (and a complete stream's chunks),
//! fail, timeouts, retries, cancel, checkpoints, reads, awaiting a result,
//! and listings with their bulk retry and cancel. Activations and streams
//! are in [`super::activation`], sessions and schemas in [`super::workers`].

use std::time::{Duration, Instant};

use super::{fence, job_ref, key_of, listing, render, settle, validate, ApiError, Call, JobApi, Repeat};
use crate::auth::{Principal, Verb};
use crate::core::{Command, CommandResult, FailReason, Guard, Job, JobKey, JobState, NewJob, PartitionId};
use crate::leaders;
use crate::leaders::fanout::run_chunk;
use crate::proto::gateway as pb;

/// AwaitJob's wait when the request names none, and the longest it may name.
const DEFAULT_AWAIT_MS: i64 = 60_000;
const MAX_AWAIT_MS: i64 = 600_000;
/// How long the look before an await may take (a read of the job, no wait).
const AWAIT_CHECK: Duration = Duration::from_secs(10);
/// How long before the caller's own deadline a wait answers without what it
/// waited for (AwaitJob "not final yet", a long poll with no jobs).
pub(super) const AWAIT_MARGIN: Duration = Duration::from_millis(200);

impl JobApi {
    /// Whether a create may carry the job's own activation timeout: every
    /// member reads data version 19 ([`crate::core::JOB_TIMEOUTS`]); until
    /// then such a create is FAILED_PRECONDITION. A surface whose protocol
    /// keeps the timeout elsewhere too (the Open Job Spec's options) leaves
    /// it out meanwhile, and moves each activation's deadline itself.
    pub fn takes_activation_timeouts(&self) -> bool {
        leaders::versions::cluster_reads(&self.ctx, crate::core::JOB_TIMEOUTS)
    }

    /// Whether a completion may carry a guard ([`Command::CompleteGuarded`]):
    /// every member reads data version 20 ([`crate::core::GUARDED_OUTCOMES`]).
    pub fn takes_guarded_outcomes(&self) -> bool {
        leaders::versions::cluster_reads(&self.ctx, crate::core::GUARDED_OUTCOMES)
    }

    /// Completes the job at `key` if it passes `guard`, in one write,
    /// answering the attempt it completed; `attempt` 0 is whichever
    /// activation holds the job. A refusal comes back as the partition gave
    /// it, unread: the caller named the job by an outside id and judges what
    /// the refusal means (the job at `key` may not be the one it named, so a
    /// repeat cannot be told here).
    pub async fn complete_guarded(
        &self,
        call: &Call,
        key: u64,
        attempt: u32,
        variables: String,
        guard: Guard,
    ) -> Result<u32, ApiError> {
        let key = key_of(key)?;
        if key.partition() >= self.ctx.topology.partition_count() || key.counter() == 0 {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let variables = validate::json_object("variables", variables)?;
        let command = Command::CompleteGuarded { key, attempt, variables, guard };
        let results =
            leaders::submit_as(&self.ctx, Some(&call.principal), key.partition(), vec![command], call.deadline).await;
        let result = match results.map(|mut results| results.pop()) {
            Ok(Some(CommandResult::Completed { attempt })) => Ok(attempt),
            Ok(Some(CommandResult::Rejected(error))) => Err(error.into()),
            Ok(other) => Err(ApiError::Internal(format!("a guarded completion was answered {other:?}"))),
            Err(error) => Err(error),
        };
        // A refusal of attempt 0 frees nothing: "whichever activation holds
        // the job" is then another worker's, whose stream slot it must keep.
        if result.is_ok() || attempt != 0 {
            self.answered(key, result.as_ref().map_or(attempt, |done| *done), &result);
        }
        result
    }

    pub async fn create(&self, call: &Call, request: pb::CreateJobRequest) -> Result<pb::CreateJobResponse, ApiError> {
        let started = Instant::now();
        let (job, ordering) = self.new_job(&call.principal, request, call.traceparent.clone())?;
        let (partition, result) =
            leaders::creates::create(&self.ctx, &call.principal, job, ordering, call.deadline).await?;
        self.answer_create(partition, result, started, call.deadline).await
    }

    async fn answer_create(
        &self,
        partition: PartitionId,
        result: Option<CommandResult>,
        started: Instant,
        deadline: Instant,
    ) -> Result<pb::CreateJobResponse, ApiError> {
        match result {
            Some(CommandResult::Created { key, created, state }) => {
                tracing::Span::current().record("key", key.0);
                metrics::histogram!("drover_create_ack_seconds").record(started.elapsed().as_secs_f64());
                Ok(self.created(partition, key, created, state, deadline).await)
            }
            Some(CommandResult::Rejected(error)) => Err(error.into()),
            other => Err(ApiError::Internal(format!("unexpected create result {other:?}"))),
        }
    }

    /// Creates a chunk of a create stream's jobs: one answer per request, in order.
    pub async fn create_many(&self, call: &Call, requests: Vec<pb::CreateJobRequest>) -> Vec<pb::CreateJobResponse> {
        let started = Instant::now();
        let creates =
            requests.into_iter().map(|r| self.new_job(&call.principal, r, call.traceparent.clone())).collect();
        let deadline = Instant::now() + self.ctx.settings.request_timeout;
        let answers = leaders::creates::create_many(&self.ctx, &call.principal, creates, deadline).await;
        metrics::histogram!("drover_create_ack_seconds").record(started.elapsed().as_secs_f64());
        let mut out = Vec::with_capacity(answers.len());
        for (partition, result) in answers {
            out.push(match result {
                Ok(CommandResult::Created { key, created, state }) => {
                    self.created(partition.unwrap_or_default(), key, created, state, deadline).await
                }
                Ok(other) => pb::CreateJobResponse {
                    error: Some(ApiError::Internal(format!("unexpected {other:?}")).to_proto()),
                    ..Default::default()
                },
                Err(e) => pb::CreateJobResponse { error: Some(e.to_proto()), ..Default::default() },
            });
        }
        out
    }

    /// Whether the call may complete jobs over a stream: a job token's holder
    /// (checked per job), or a principal allowed to work on some type.
    pub fn may_complete_many(&self, call: &Call) -> Result<(), ApiError> {
        if call.principal.job.is_none() {
            call.principal.require_some(Verb::Work)?;
        }
        Ok(())
    }

    pub async fn complete(&self, call: &Call, request: pb::CompleteJobRequest) -> Result<(), ApiError> {
        let (key, attempt) = (key_of(request.key)?, request.attempt);
        let result = match self.complete_command(request) {
            Ok((_, command)) => self.one(&call.principal, key, command, call.deadline).await,
            Err(error) => Err(error),
        };
        self.answered(key, attempt, &result);
        result.map(|_| ())
    }

    /// A worker's answer about `key` at `attempt` came back `result`: the
    /// worker is done with the activation, however the answer fared, and its
    /// stream's slot for the job is free. But an answer the caller may not
    /// give (another tenant's job, NOT_FOUND; a type it may not work) frees
    /// nothing: a stranger must not make room on another worker's stream.
    fn answered<T>(&self, key: JobKey, attempt: u32, result: &Result<T, ApiError>) {
        if !matches!(result, Err(ApiError::NotFound(_) | ApiError::PermissionDenied(_))) {
            self.ctx.gateway.streams.release(key, attempt);
        }
    }

    /// Completes a chunk of a complete stream's jobs: one answer per request, in order.
    pub async fn complete_many(
        &self,
        call: &Call,
        requests: Vec<pb::CompleteJobRequest>,
    ) -> Vec<pb::CompleteJobsResponse> {
        let keys: Vec<(u64, u32)> = requests.iter().map(|r| (r.key, r.attempt)).collect();
        let commands: Vec<_> = requests.into_iter().map(|r| self.complete_command(r)).collect();
        let repeats: Vec<Option<Repeat>> =
            commands.iter().map(|c| c.as_ref().ok().and_then(|(_, c)| Repeat::of(c))).collect();
        let deadline = Instant::now() + self.ctx.settings.request_timeout;
        let results = run_chunk(&self.ctx, Some(&call.principal), commands, deadline).await;
        let mut out = Vec::with_capacity(results.len());
        for ((result, (key, attempt)), repeat) in results.into_iter().zip(keys).zip(repeats) {
            let result = match result {
                Err(error) => settle(&self.ctx, JobKey(key), repeat, error, deadline).await,
                ok => ok,
            };
            self.answered(JobKey(key), attempt, &result);
            out.push(pb::CompleteJobsResponse { key, error: result.err().map(|e| e.to_proto()) });
        }
        out
    }

    /// Fails an attempt: with the retries and back-off it names, or as the
    /// job's retry policy decides (`by_policy`), answering what it decided.
    pub async fn fail(&self, call: &Call, request: pb::FailJobRequest) -> Result<pb::FailJobResponse, ApiError> {
        let (key, attempt, by_policy) = (key_of(request.key)?, request.attempt, request.by_policy);
        let command = match self.fail_command(key, request) {
            Ok(command) => self.as_cluster_takes(command, call.deadline).await,
            Err(error) => Err(error),
        };
        // Decided here (a cluster not yet at the policies' version): the
        // answer is what was decided.
        let decided = match &command {
            Ok(Command::Fail { retries, back_off_ms, .. }) if by_policy => {
                pb::FailJobResponse { retries: *retries, retry_back_off: *back_off_ms }
            }
            _ => pb::FailJobResponse::default(),
        };
        let result = match command {
            Ok(command) => self.one(&call.principal, key, command, call.deadline).await,
            Err(error) => Err(error),
        };
        self.answered(key, attempt, &result);
        Ok(match result? {
            CommandResult::Failed { retries, back_off_ms } => {
                pb::FailJobResponse { retries, retry_back_off: back_off_ms }
            }
            _ => decided,
        })
    }

    fn fail_command(&self, key: JobKey, request: pb::FailJobRequest) -> Result<Command, ApiError> {
        if request.by_policy {
            let attempt = fence(request.attempt, request.override_fence)?;
            let limits = &self.ctx.settings.limits;
            let variables = validate::merged_variables("failure", request.variables.clone(), limits)?;
            return super::retry::by_policy(key, attempt, request, variables, limits.max_payload_bytes as u64);
        }
        if request.retries < 0 {
            return Err(ApiError::InvalidArgument(format!("retries must be zero or more, got {}", request.retries)));
        }
        if request.retry_back_off < 0 {
            return Err(ApiError::InvalidArgument(format!(
                "retry_back_off must be zero or more ms, got {}",
                request.retry_back_off
            )));
        }
        let attempt = fence(request.attempt, request.override_fence)?;
        let limits = &self.ctx.settings.limits;
        let variables = validate::merged_variables("failure", request.variables, limits)?;
        let reason = FailReason::parse(&request.reason).ok_or_else(|| {
            let names: Vec<&str> = FailReason::ALL.iter().filter(|r| !r.by_broker()).map(|r| r.as_str()).collect();
            ApiError::InvalidArgument(format!("reason {:?} is not one of {}", request.reason, names.join(", ")))
        })?;
        Ok(Command::Fail {
            reason,
            key,
            attempt,
            retries: request.retries,
            error_message: request.error_message,
            back_off_ms: request.retry_back_off,
            variables,
            max_payload_bytes: limits.max_payload_bytes as u64,
        })
    }

    pub async fn update_timeout(
        &self,
        call: &Call,
        request: pb::UpdateJobTimeoutRequest,
    ) -> Result<pb::UpdateJobTimeoutResponse, ApiError> {
        let key = key_of(request.key)?;
        if request.timeout <= 0 {
            return Err(ApiError::InvalidArgument(format!(
                "timeout must be greater than zero (the new deadline is now + timeout ms), got {}",
                request.timeout
            )));
        }
        let attempt = fence(request.attempt, request.override_fence)?;
        let command = Command::UpdateTimeout { key, attempt, timeout_ms: request.timeout };
        match self.one(&call.principal, key, command, call.deadline).await? {
            CommandResult::Deadline(deadline) => {
                // An override holds no activation: no job token names attempt 0.
                let job_token = if attempt == 0 { String::new() } else { self.ctx.job_token(key.0, attempt, deadline) };
                Ok(pb::UpdateJobTimeoutResponse { deadline, job_token })
            }
            other => Err(ApiError::Internal(format!("unexpected result {other:?}"))),
        }
    }

    pub async fn update_retries(&self, call: &Call, request: pb::UpdateJobRetriesRequest) -> Result<(), ApiError> {
        let principal = &call.principal;
        let key = key_of(request.key)?;
        if request.retries < 0 {
            return Err(ApiError::InvalidArgument(format!("retries must be zero or more, got {}", request.retries)));
        }
        let command = Command::UpdateRetries { key, retries: request.retries, by: principal.name.clone() };
        self.one(principal, key, command, call.deadline).await?;
        crate::auth::audit(
            principal,
            "update_job_retries",
            serde_json::json!({"jobs": [key.0], "retries": request.retries}),
        );
        Ok(())
    }

    pub async fn cancel(&self, call: &Call, request: pb::CancelJobRequest) -> Result<(), ApiError> {
        let principal = &call.principal;
        let key = key_of(request.key)?;
        self.one(principal, key, Command::Cancel { key, by: principal.name.clone() }, call.deadline).await?;
        crate::auth::audit(principal, "cancel_job", serde_json::json!({"jobs": [key.0]}));
        Ok(())
    }

    pub async fn checkpoint(
        &self,
        call: &Call,
        request: pb::CheckpointJobRequest,
    ) -> Result<pb::CheckpointJobResponse, ApiError> {
        let key = key_of(request.key)?;
        validate::stage_name(&request.stage)?;
        if request.attempt == 0 {
            return Err(ApiError::InvalidArgument(
                "attempt is required: a checkpoint is fenced by the activation's attempt (ActivatedJob.attempt)".into(),
            ));
        }
        let limits = &self.ctx.settings.limits;
        let variables = validate::merged_variables("checkpoint", request.variables, limits)?;
        let command = Command::Checkpoint {
            key,
            attempt: request.attempt,
            stage: request.stage,
            variables,
            max_payload_bytes: limits.max_payload_bytes as u64,
        };
        let attempt = request.attempt;
        match self.one(&call.principal, key, command, call.deadline).await? {
            CommandResult::Deadline(deadline) => {
                let job_token = self.ctx.job_token(key.0, attempt, deadline);
                Ok(pb::CheckpointJobResponse { deadline, job_token })
            }
            other => Err(ApiError::Internal(format!("unexpected result {other:?}"))),
        }
    }

    /// A job, with its history when the request asks for it.
    pub async fn get(&self, call: &Call, request: pb::GetJobRequest) -> Result<pb::Job, ApiError> {
        self.get_for(call, request, Verb::Read).await
    }

    /// A job as `get` answers it, to a caller who may `verb` it: a worker
    /// finds the job it holds to answer for it with `jobs:work:<type>`.
    pub async fn get_for(&self, call: &Call, request: pb::GetJobRequest, verb: Verb) -> Result<pb::Job, ApiError> {
        let include_history = request.include_history;
        let job = self.read_job(&call.principal, request, verb, call.deadline).await?;
        let mut answer = render::job_for(&call.principal, &job);
        if include_history {
            answer.history = render::history_for(&call.principal, &job);
            answer.history_dropped = job.history.dropped();
        }
        Ok(answer)
    }

    pub async fn history(
        &self,
        call: &Call,
        request: pb::GetJobRequest,
    ) -> Result<pb::GetJobHistoryResponse, ApiError> {
        let job = self.read_job(&call.principal, request, Verb::Read, call.deadline).await?;
        let events = render::history_for(&call.principal, &job);
        Ok(pb::GetJobHistoryResponse { key: job.key.0, events, dropped: job.history.dropped() })
    }

    /// A job once it is final, or as it is when the wait ends.
    pub async fn await_job(&self, call: &Call, request: pb::AwaitJobRequest) -> Result<pb::AwaitJobResponse, ApiError> {
        let principal = &call.principal;
        if !request.tenant_id.is_empty() {
            principal.require_tenant(&request.tenant_id)?;
        }
        let wait = match request.timeout {
            0 => DEFAULT_AWAIT_MS,
            ms if (1..=MAX_AWAIT_MS).contains(&ms) => ms,
            ms => {
                return Err(ApiError::InvalidArgument(format!(
                    "timeout must be between 1 and {MAX_AWAIT_MS} ms (0 for {DEFAULT_AWAIT_MS}), got {ms}"
                )))
            }
        };
        let job = job_ref(request.key, request.idempotency_key, request.tenant_id, request.user)?;
        let mut final_by = Instant::now() + Duration::from_millis(wait as u64);
        if let Some(caller) = call.caller_deadline {
            // Answer "not final yet" in time for the caller to hear it.
            final_by = final_by.min(caller.checked_sub(AWAIT_MARGIN).unwrap_or_else(Instant::now));
        }
        let deadline = final_by.max(Instant::now() + self.ctx.settings.request_timeout);
        let deadline = call.caller_deadline.map_or(deadline, |caller| deadline.min(caller));
        // A producer awaits the jobs it may create; a reader, those it may read.
        let permitted = |found: &Job| -> Result<(), ApiError> {
            if !principal.may(Verb::Create, &found.spec.job_type) {
                may_read(principal, Verb::Read, found)?;
            } else if !principal.in_tenant(&found.spec.tenant) {
                return Err(ApiError::NotFound(format!("no job with key {}", found.key)));
            }
            Ok(())
        };
        // Checked before any wait: a job the caller may not see is NOT_FOUND
        // at once, not when it ends (which would tell when that was).
        let now = leaders::read(&self.ctx, &job, None, deadline.min(Instant::now() + AWAIT_CHECK)).await?;
        permitted(&now)?;
        let found = if now.state.is_final() {
            now
        } else {
            let found = leaders::read(&self.ctx, &job, Some(final_by), deadline).await?;
            permitted(&found)?;
            found
        };
        Ok(pb::AwaitJobResponse { r#final: found.state.is_final(), job: Some(render::job_for(principal, &found)) })
    }

    pub async fn list(&self, call: &Call, request: pb::ListJobsRequest) -> Result<pb::ListJobsResponse, ApiError> {
        listing::list(&self.ctx, &call.principal, request, call.deadline).await
    }

    pub async fn retry_jobs(
        &self,
        call: &Call,
        request: pb::RetryJobsRequest,
    ) -> Result<pb::BulkJobsResponse, ApiError> {
        listing::retry(&self.ctx, &call.principal, request, call.deadline).await
    }

    pub async fn cancel_jobs(
        &self,
        call: &Call,
        request: pb::CancelJobsRequest,
    ) -> Result<pb::BulkJobsResponse, ApiError> {
        listing::cancel(&self.ctx, &call.principal, request, call.deadline).await
    }

    /// The job a create asks for, checked, and the partition its ordering
    /// key places it on, if it has one (where it goes is the partition
    /// client's to decide: [`leaders::creates`]).
    fn new_job(
        &self,
        principal: &Principal,
        request: pb::CreateJobRequest,
        traceparent: String,
    ) -> Result<(NewJob, Option<PartitionId>), ApiError> {
        principal.require_job(Verb::Create, &request.r#type)?;
        principal.require_tenant(&request.tenant_id)?;
        let ctx = &self.ctx;
        let settings = &ctx.settings;
        let ordering = validate::ordering_partition(&request, ctx.topology.formed_partitions)?;
        let job = validate::new_job(request, traceparent, &settings.limits, &settings.dedupe, || {
            ctx.gateway.next_request_id()
        })?;
        Ok((job, ordering))
    }

    fn complete_command(&self, request: pb::CompleteJobRequest) -> Result<(PartitionId, Command), ApiError> {
        let key = key_of(request.key)?;
        if key.partition() >= self.ctx.topology.partition_count() {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let attempt = fence(request.attempt, request.override_fence)?;
        let variables = validate::json_object("variables", request.variables)?;
        Ok((key.partition(), Command::Complete { key, attempt, variables }))
    }

    /// The answer to a create: the job's key, whether this request made it,
    /// and its state (read from its partition for a repeat whose job is final).
    async fn created(
        &self,
        partition: PartitionId,
        key: JobKey,
        created: bool,
        state: Option<JobState>,
        deadline: Instant,
    ) -> pb::CreateJobResponse {
        let state = match state {
            Some(state) => state.as_str().to_string(),
            None => match leaders::describe(&self.ctx, key, deadline).await {
                Ok(job) => job.state.as_str().to_string(),
                // The job exists (the partition remembered it); only its state
                // could not be read in time.
                Err(_) => String::new(),
            },
        };
        pb::CreateJobResponse { key: key.0, partition_id: partition, error: None, created, state }
    }

    /// The job a `GetJobRequest` names, read from its partition's leader, if
    /// `principal` may `verb` it.
    async fn read_job(
        &self,
        principal: &Principal,
        request: pb::GetJobRequest,
        verb: Verb,
        deadline: Instant,
    ) -> Result<Job, ApiError> {
        if !request.tenant_id.is_empty() {
            principal.require_tenant(&request.tenant_id)?;
        }
        let job = job_ref(request.key, request.idempotency_key, request.tenant_id, request.user)?;
        let found = leaders::read(&self.ctx, &job, None, deadline).await?;
        may_read(principal, verb, &found)?;
        Ok(found)
    }
}

/// Whether `principal` may `verb` the job it read: NOT_FOUND for another
/// tenant's job, PERMISSION_DENIED without the scope.
fn may_read(principal: &Principal, verb: Verb, job: &Job) -> Result<(), ApiError> {
    // A planted bug for the fault suite (test only, see crate::failpoints):
    // reads that skip the check of the job's tenant.
    if verb == Verb::Read && crate::failpoints::fire("read_any_tenant").is_some() {
        return Ok(());
    }
    Ok(principal.check_job(verb, &job.spec.tenant, &job.spec.job_type, job.key.0)?)
}
