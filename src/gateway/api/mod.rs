//! The typed job API: the one door below every adapter. Every operation on
//! jobs, worker sessions, schedules, workflows, queues and the cluster a
//! client can ask for takes the [`Call`] (who, by when) and typed arguments,
//! and answers typed results or an [`ApiError`].
//!
//! Its arguments and answers are drover.v1's messages, the one vocabulary of
//! the client API: the protocols built on it translate into them.
//! `drover.v1` ([`super::v1`]), the Zeebe facade ([`super::zeebe`]), the Open
//! Job Spec binding ([`super::ojs`]) and the console are adapters over this
//! API; none of them checks what a principal may do. This API does, per body,
//! in one place: the job type and tenant a create or an activation names,
//! and for commands on an existing job, the job's own type and tenant,
//! checked where the job lives (the screen in [`crate::leaders`]), and again
//! at apply on every replica. Authentication and admission happened in the
//! call layer before ([`super::call`]).
//!
//! Below it is [`crate::leaders`], which reaches each partition's leader;
//! above it nothing but adapters. The operations are split by what they act
//! on, each file its own `impl JobApi`: [`jobs`] single jobs and listings,
//! [`activation`] polls and streams, [`workers`] sessions and schemas,
//! [`queues`] queue figures, pauses and limits, [`events`] lifecycle events,
//! [`schedules`], [`workflows`], [`plan`] the cluster plan, [`backups`], and
//! [`status`] the cluster's status, [`retry`] retry policies. [`validate`]
//! checks client input and builds the engine's commands; [`render`] shows the engine's records.

mod activation;
mod backups;
pub mod events;
mod jobs;
mod listing;
mod plan;
pub mod queues;
pub mod render;
pub mod retry;
pub mod schedules;
mod sessions;
pub mod status;
pub mod validate;
mod workers;
pub mod workflows;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

pub use super::Call;
use crate::auth::Principal;
use crate::context::NodeContext;
use crate::core::{Command, CommandResult, EventKind, Job, JobKey, JobRef, JobState};
use crate::leaders;
pub use crate::leaders::ApiError;
pub use sessions::{MAX_DEAD_AFTER_MS, MAX_JOB_TYPES};
pub use status::{cluster_status, cluster_status_json};

/// The job API of one node's gateway.
#[derive(Clone)]
pub struct JobApi {
    pub(super) ctx: Arc<NodeContext>,
}

impl JobApi {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        JobApi { ctx }
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
            leaders::submit_as(&self.ctx, Some(principal), key.partition(), vec![command], deadline).await?;
        match results.pop() {
            Some(CommandResult::Rejected(error)) => settle(&self.ctx, key, repeat, error.into(), deadline).await,
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
        (0, false) => Ok(JobRef::Request(validate::idempotency_request(idempotency_key, tenant, user)?)),
        (key, true) => Ok(JobRef::Key(key_of(key)?)),
        (_, false) => Err(ApiError::InvalidArgument("give the job's key or its idempotency_key, not both".into())),
    }
}

fn key_of(key: u64) -> Result<JobKey, ApiError> {
    if key == 0 {
        return Err(ApiError::InvalidArgument("key is required".into()));
    }
    Ok(JobKey(key))
}

/// A completion or cancellation that may repeat one that already ended the
/// job (a client's retry, or the gateway's own re-send after a lost answer).
#[derive(Clone)]
struct Repeat {
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
            Command::Complete { attempt, variables, .. } if *attempt != 0 => {
                Some(Repeat { state: JobState::Completed, attempt: *attempt, result: Some(variables.clone()) })
            }
            Command::Cancel { .. } => Some(Repeat { state: JobState::Cancelled, attempt: 0, result: None }),
            _ => None,
        }
    }
}

/// What a command on `key` that its partition refused as FAILED_PRECONDITION
/// answers, decided here once for every adapter. A repeated completion or
/// cancellation succeeds when the job already ended the way it asked:
/// completed by that very attempt with that very result, or cancelled. A
/// completion of the same attempt with another result did not take effect
/// (another completion won, an operator's override, say): it stays
/// FAILED_PRECONDITION, saying whose result stands. Any other refusal of a
/// job that is finished is [`ApiError::Finished`] (Zeebe's clients hear
/// NOT_FOUND for it, drover.v1's and OJS's a precondition). The partition
/// keeps final records only in storage, so this reads the job; it runs only
/// on a refusal.
async fn settle(
    ctx: &NodeContext,
    key: JobKey,
    repeat: Option<Repeat>,
    error: ApiError,
    deadline: Instant,
) -> Result<CommandResult, ApiError> {
    let ApiError::FailedPrecondition(refusal) = &error else { return Err(error) };
    let job = match leaders::describe(ctx, key, deadline).await {
        Ok(job) => job,
        // A record pruned after its retention: the job was finished.
        Err(ApiError::NotFound(_)) => return Err(ApiError::Finished(refusal.clone())),
        Err(_) => return Err(error),
    };
    if let Some(repeat) = repeat.filter(|r| job.state == r.state && crate::core::fence_admits(r.attempt, job.attempt)) {
        return match &repeat.result {
            Some(result) if *result != job.result => Err(ApiError::FailedPrecondition(format!(
                "job {key} was already completed, for attempt {} by {}, with another result than this \
                 completion's; that result stands and this completion was not applied",
                job.attempt,
                completed_by(&job)
            ))),
            _ => Ok(CommandResult::Done),
        };
    }
    match job.state.is_final() {
        true => Err(ApiError::Finished(format!("job {key} is already {}: {refusal}", job.state.as_str()))),
        false => Err(error),
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
