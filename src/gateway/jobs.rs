//! The typed job API: every operation on jobs, worker sessions and schemas a
//! client can ask for, taking the [`Call`] (who, by when) and typed
//! arguments, answering typed results or an [`ApiError`].
//!
//! Its arguments and answers are drover.v1's messages, the one vocabulary of
//! the client API: the protocols built on it translate into them.
//! `drover.v1` ([`super::v1`]), the Zeebe facade ([`super::zeebe`]) and the
//! console are adapters over this API; none of them checks what a principal
//! may do. This API does, per body, in one place: the job type and tenant a
//! create or an activation names, and for commands on an existing job, the
//! job's own type and tenant, checked where the job lives (see
//! [`super::router`]'s screen). Authentication and admission happened in the
//! call layer before.
//!
//! This file holds the operations on single jobs and listings; activations
//! and streams are in [`super::activation`], sessions and schemas in
//! [`super::workers`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::call::Call;
use super::convert;
use super::error::ApiError;
use super::fanout::run_chunk;
use super::keys;
use super::listing;
use super::router;
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::{
    Command, CommandResult, EventKind, FailReason, Job, JobKey, JobRef, JobState, PartitionId, RequestId,
};
use crate::proto::gateway as pb;

/// AwaitJob's wait when the request names none, and the longest it may name.
const DEFAULT_AWAIT_MS: i64 = 60_000;
const MAX_AWAIT_MS: i64 = 600_000;
/// How long the look before an await may take (a read of the job, no wait).
const AWAIT_CHECK: Duration = Duration::from_secs(10);
/// How long before the caller's own deadline a wait answers without what it
/// waited for (AwaitJob "not final yet", a long poll with no jobs).
pub(super) const AWAIT_MARGIN: Duration = Duration::from_millis(200);

/// The job API of one node's gateway.
#[derive(Clone)]
pub struct JobApi {
    pub(super) ctx: Arc<NodeContext>,
}

impl JobApi {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        JobApi { ctx }
    }

    pub async fn create(&self, call: &Call, request: pb::CreateJobRequest) -> Result<pb::CreateJobResponse, ApiError> {
        let started = Instant::now();
        let (mut partition, command) = self.create_command(&call.principal, request, call.traceparent.clone())?;
        let keyless = matches!(&command, Command::Create(job) if !matches!(job.request, Some(RequestId::Key { .. })));
        let partitions = self.ctx.topology.partition_count();
        let principal = Some(&call.principal);
        if let Some((made_on, result)) =
            keys::made_under_older_count(&self.ctx, &command, partition, call.deadline).await?
        {
            return self.answer_create(made_on, Some(result), started, call.deadline).await;
        }
        let mut submitted =
            router::submit_as(&self.ctx, principal, partition, vec![command.clone()], call.deadline).await;
        // A create without an idempotency key may be made on any partition:
        // one out of this node's reach (its region cut off) sent nothing, so
        // the create goes to the next partition instead.
        for _ in 1..partitions {
            if !(keyless && matches!(submitted, Err(ApiError::OutOfReach(_)))) {
                break;
            }
            partition = (partition + 1) % partitions;
            submitted = router::submit_as(&self.ctx, principal, partition, vec![command.clone()], call.deadline).await;
        }
        let mut result = submitted?.pop();
        if let Some(CommandResult::Elsewhere(home)) = result {
            // A limited queue's jobs are made on its home partition.
            partition = home;
            result = router::submit_as(&self.ctx, principal, home, vec![command], call.deadline).await?.pop();
        }
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
        let mut commands: Vec<_> =
            requests.into_iter().map(|r| self.create_command(&call.principal, r, call.traceparent.clone())).collect();
        let mut partitions: Vec<Option<PartitionId>> =
            commands.iter().map(|c| c.as_ref().ok().map(|(p, _)| *p)).collect();
        let deadline = Instant::now() + self.ctx.settings.request_timeout;
        let sent: Vec<Option<Command>> = commands.iter().map(|c| c.as_ref().ok().map(|(_, c)| c.clone())).collect();
        // Keys made under an older partition count are answered from there
        // (nothing to probe while the count never changed).
        let mut made_before = Vec::new();
        if self.ctx.topology.partition_count() != self.ctx.topology.formed_partitions {
            for (i, command) in commands.iter_mut().enumerate() {
                let Ok((partition, sent)) = command else { continue };
                match keys::made_under_older_count(&self.ctx, sent, *partition, deadline).await {
                    Ok(None) => continue,
                    Ok(Some((made_on, result))) => made_before.push((i, made_on, Ok(result))),
                    Err(error) => made_before.push((i, *partition, Err(error))),
                }
                // Sent nowhere; its answer is filled in below.
                *command = Err(ApiError::Internal("answered by an older partition".into()));
            }
        }
        let mut results = run_chunk(&self.ctx, Some(&call.principal), commands, deadline).await;
        for (i, made_on, result) in made_before {
            partitions[i] = Some(made_on);
            results[i] = result;
        }
        // A limited queue's jobs are made on its home partition: those
        // creates go there now, in one more round.
        let elsewhere: Vec<(usize, PartitionId)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Ok(CommandResult::Elsewhere(home)) => Some((i, *home)),
                _ => None,
            })
            .collect();
        if !elsewhere.is_empty() {
            let again = elsewhere
                .iter()
                .map(|(i, home)| Ok((*home, sent[*i].clone().expect("a sent command was answered"))))
                .collect();
            let answers = run_chunk(&self.ctx, Some(&call.principal), again, deadline).await;
            for ((i, home), answer) in elsewhere.into_iter().zip(answers) {
                partitions[i] = Some(home);
                results[i] = answer;
            }
        }
        metrics::histogram!("drover_create_ack_seconds").record(started.elapsed().as_secs_f64());
        let mut out = Vec::with_capacity(results.len());
        for (result, partition) in results.into_iter().zip(partitions) {
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
                Err(error) => settle(&self.ctx, repeat, error, deadline).await,
                ok => ok,
            };
            self.answered(JobKey(key), attempt, &result);
            out.push(pb::CompleteJobsResponse { key, error: result.err().map(|e| e.to_proto()) });
        }
        out
    }

    pub async fn fail(&self, call: &Call, request: pb::FailJobRequest) -> Result<(), ApiError> {
        let (key, attempt) = (key_of(request.key)?, request.attempt);
        let result = match self.fail_command(key, request) {
            Ok(command) => self.one(&call.principal, key, command, call.deadline).await,
            Err(error) => Err(error),
        };
        self.answered(key, attempt, &result);
        result.map(|_| ())
    }

    fn fail_command(&self, key: JobKey, request: pb::FailJobRequest) -> Result<Command, ApiError> {
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
        let variables = convert::merged_variables("failure", request.variables, limits)?;
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
        convert::stage_name(&request.stage)?;
        if request.attempt == 0 {
            return Err(ApiError::InvalidArgument(
                "attempt is required: a checkpoint is fenced by the activation's attempt (ActivatedJob.attempt)".into(),
            ));
        }
        let limits = &self.ctx.settings.limits;
        let variables = convert::merged_variables("checkpoint", request.variables, limits)?;
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
        let mut answer = convert::job_for(&call.principal, &job);
        if include_history {
            answer.history = convert::history_for(&call.principal, &job);
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
        let events = convert::history_for(&call.principal, &job);
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
                principal.check_job(Verb::Read, &found.spec.tenant, &found.spec.job_type, found.key.0)?;
            } else if !principal.in_tenant(&found.spec.tenant) {
                return Err(ApiError::NotFound(format!("no job with key {}", found.key)));
            }
            Ok(())
        };
        // Checked before any wait: a job the caller may not see is NOT_FOUND
        // at once, not when it ends (which would tell when that was).
        let now = router::read(&self.ctx, &job, None, deadline.min(Instant::now() + AWAIT_CHECK)).await?;
        permitted(&now)?;
        let found = if now.state.is_final() {
            now
        } else {
            let found = router::read(&self.ctx, &job, Some(final_by), deadline).await?;
            permitted(&found)?;
            found
        };
        Ok(pb::AwaitJobResponse { r#final: found.state.is_final(), job: Some(convert::job_for(principal, &found)) })
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

    fn create_command(
        &self,
        principal: &Principal,
        request: pb::CreateJobRequest,
        traceparent: String,
    ) -> Result<(PartitionId, Command), ApiError> {
        principal.require_job(Verb::Create, &request.r#type)?;
        principal.require_tenant(&request.tenant_id)?;
        let ctx = &self.ctx;
        let settings = &ctx.settings;
        let ordering = convert::ordering_partition(&request, ctx.topology.formed_partitions)?;
        let job = convert::new_job(request, traceparent, &settings.limits, &settings.dedupe, || {
            ctx.gateway.next_request_id()
        })?;
        if crate::core::expires_at(&job.spec).is_some() {
            super::status::require_cluster_version(ctx, crate::core::SCHEDULES, "job expiry (expires_at)")?;
        }
        // Every repeat of an idempotency key must reach the partition that
        // remembers it; other creates go to a partition led here if any.
        let partition = match &job.request {
            Some(request @ RequestId::Key { .. }) => {
                JobRef::Request(request.clone()).partition(ctx.topology.partition_count())
            }
            _ => ordering.unwrap_or_else(|| ctx.routing.next_create_partition()),
        };
        Ok((partition, Command::Create(job)))
    }

    fn complete_command(&self, request: pb::CompleteJobRequest) -> Result<(PartitionId, Command), ApiError> {
        let key = key_of(request.key)?;
        if key.partition() >= self.ctx.topology.partition_count() {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let attempt = fence(request.attempt, request.override_fence)?;
        let variables = convert::json_object("variables", request.variables)?;
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
            None => match router::describe(&self.ctx, key, deadline).await {
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
        let found = router::read(&self.ctx, &job, None, deadline).await?;
        principal.check_job(verb, &found.spec.tenant, &found.spec.job_type, found.key.0)?;
        Ok(found)
    }

    /// Runs one command on the partition of `key`, for `principal`.
    async fn one(
        &self,
        principal: &Arc<Principal>,
        key: JobKey,
        command: Command,
        deadline: Instant,
    ) -> Result<CommandResult, ApiError> {
        if key.partition() >= self.ctx.topology.partition_count() || key.counter() == 0 {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let repeat = Repeat::of(&command);
        let mut results =
            router::submit_as(&self.ctx, Some(principal), key.partition(), vec![command], deadline).await?;
        match results.pop() {
            Some(CommandResult::Rejected(error)) => settle(&self.ctx, repeat, error.into(), deadline).await,
            Some(result) => Ok(result),
            None => Err(ApiError::Internal("partition returned no result".into())),
        }
    }
}

/// The attempt a worker command is fenced by: the activation's, or, for an
/// operator's override, 0 (acting whatever the job's attempt; the partition
/// checks the manage scope and writes the override in the job's history).
/// Attempt 0 is never a default: proto3 sends it for a field left out.
fn fence(attempt: u32, override_fence: bool) -> Result<u32, ApiError> {
    match (attempt, override_fence) {
        (0, false) => Err(ApiError::InvalidArgument(
            "attempt is required: give the attempt the activation answered (ActivatedJob.attempt). An operator who \
             means to act whatever the job's attempt sets override_fence instead, which needs jobs:manage:<type>"
                .into(),
        )),
        (0, true) => Ok(0),
        (attempt, false) => Ok(attempt),
        (attempt, true) => Err(ApiError::InvalidArgument(format!(
            "override_fence acts whatever the job's attempt, so it takes no attempt; got attempt {attempt}"
        ))),
    }
}

/// The job a read names: `key`, or an idempotency key with its scope.
fn job_ref(key: u64, idempotency_key: String, tenant: String, user: String) -> Result<JobRef, ApiError> {
    match (key, idempotency_key.is_empty()) {
        (0, true) => Err(ApiError::InvalidArgument("give the job's key or its idempotency_key".into())),
        (0, false) => Ok(JobRef::Request(convert::idempotency_request(idempotency_key, tenant, user)?)),
        (key, true) => Ok(JobRef::Key(key_of(key)?)),
        (_, false) => Err(ApiError::InvalidArgument("give the job's key or its idempotency_key, not both".into())),
    }
}

pub(super) fn key_of(key: u64) -> Result<JobKey, ApiError> {
    if key == 0 {
        return Err(ApiError::InvalidArgument("key is required".into()));
    }
    Ok(JobKey(key))
}

/// A completion or cancellation that may repeat one that already ended the
/// job (a client's retry, or the gateway's own re-send after a lost answer).
#[derive(Clone)]
struct Repeat {
    key: JobKey,
    state: JobState,
    /// The attempt the completion was for; 0 for a cancellation.
    attempt: u32,
    /// The completion's result: a repeat carries the same.
    result: Option<Bytes>,
}

impl Repeat {
    fn of(command: &Command) -> Option<Repeat> {
        match command {
            // Attempt 0 is an operator's override: nothing tells its repeat apart.
            Command::Complete { key, attempt, variables } if *attempt != 0 => Some(Repeat {
                key: *key,
                state: JobState::Completed,
                attempt: *attempt,
                result: Some(variables.clone()),
            }),
            Command::Cancel { key, .. } => {
                Some(Repeat { key: *key, state: JobState::Cancelled, attempt: 0, result: None })
            }
            _ => None,
        }
    }
}

/// Turns the refusal of a repeated completion or cancellation into success
/// when the job already ended the way it asked: completed by that very
/// attempt with that very result, or cancelled. A completion of the same
/// attempt with another result did not take effect (another completion won,
/// an operator's override, say): it stays FAILED_PRECONDITION, saying whose
/// result stands. The partition keeps final records only in storage, so
/// this reads the job; it runs only on a refusal.
async fn settle(
    ctx: &NodeContext,
    repeat: Option<Repeat>,
    error: ApiError,
    deadline: Instant,
) -> Result<CommandResult, ApiError> {
    let (Some(repeat), ApiError::FailedPrecondition(_)) = (repeat, &error) else { return Err(error) };
    let job = match router::describe(ctx, repeat.key, deadline).await {
        Ok(job) if job.state == repeat.state && crate::core::fence_admits(repeat.attempt, job.attempt) => job,
        _ => return Err(error),
    };
    match &repeat.result {
        Some(result) if *result != job.result => Err(ApiError::FailedPrecondition(format!(
            "job {} was already completed, for attempt {} by {}, with another result than this completion's; that \
             result stands and this completion was not applied",
            repeat.key,
            job.attempt,
            completed_by(&job)
        ))),
        _ => Ok(CommandResult::Done),
    }
}

/// Who ended a completed job, as its history tells: an operator who
/// overrode the fence, else the worker of its last activation.
fn completed_by(job: &Job) -> String {
    let overridden = job.history.events().filter_map(|e| match &e.kind {
        EventKind::FenceOverridden { by, .. } => Some(format!("{by:?}, overriding the fence")),
        _ => None,
    });
    overridden.last().unwrap_or_else(|| format!("worker {:?}", job.worker))
}
