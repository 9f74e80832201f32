//! Listing jobs over every partition, and the bulk operations built on it:
//! `ListJobs` pages through partitions in key order; `RetryJobs` and
//! `CancelJobs` walk the same listing and send one command per matching job.

use std::sync::Arc;
use std::time::Instant;

use super::render;
use super::validate;
use super::ApiError;
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::{Command, CommandResult, Job, JobFilter, JobKey, JobState, PartitionId};
use crate::leaders;
use crate::leaders::fanout::run_chunk;
use crate::proto::gateway as pb;

pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 1000;
/// Reasons a bulk answer carries at most.
const MAX_BULK_ERRORS: usize = 10;
/// Keys of changed jobs an audit line names at most (it always counts all).
const MAX_AUDITED_KEYS: usize = 1000;

/// Where a listing resumes: after this key (in its partition), or at the
/// start of partition 0.
fn resume_at(token: &str) -> Result<JobKey, ApiError> {
    if token.is_empty() {
        return Ok(JobKey::new(0, 0));
    }
    token.parse().map(JobKey).map_err(|_| {
        ApiError::InvalidArgument(format!("page_token {token:?} is not one ListJobs gave; start with an empty one"))
    })
}

/// One page: up to `size` jobs from `from` on, within about the request
/// byte limit, and where the next page starts (`None`: nothing is left).
pub async fn page(
    ctx: &NodeContext,
    filter: &JobFilter,
    (principal, verb): (&Principal, Verb),
    mut from: JobKey,
    size: usize,
    deadline: Instant,
) -> Result<(Vec<Job>, Option<JobKey>), ApiError> {
    // The tenants it may see go with the read, so a partition pages through
    // those only; what comes back is filtered here all the same.
    let tenants = if principal.in_tenant("*") { Vec::new() } else { principal.tenants.clone() };
    let visible = |job: &Job| principal.sees(verb, job);
    let partitions = ctx.topology.partition_count();
    let budget = ctx.settings.limits.max_request_bytes();
    let mut jobs: Vec<Job> = Vec::new();
    let mut bytes = 0;
    while from.partition() < partitions {
        let partition: PartitionId = from.partition();
        let got = leaders::list(ctx, partition, (filter, &tenants), from, size - jobs.len(), deadline).await?;
        let Some(last) = got.last().map(|job| job.key) else {
            // This partition has nothing more: on to the next.
            from = JobKey::new(partition + 1, 0);
            continue;
        };
        let got: Vec<Job> = got.into_iter().filter(|job| visible(job)).collect();
        bytes += got.iter().map(|j| j.spec.encoded_len() + j.result.len() + j.error_message.len()).sum::<usize>();
        jobs.extend(got);
        from = last;
        if jobs.len() >= size || bytes >= budget {
            return Ok((jobs, Some(from)));
        }
    }
    Ok((jobs, None))
}

/// What `principal` may `verb` among jobs matching `filter`: a filter that
/// names a type or tenant it may not use is refused; without one, jobs it may
/// not see are left out of the answers.
fn screen_filter(principal: &Principal, verb: Verb, filter: &JobFilter) -> Result<(), ApiError> {
    if filter.job_type.is_empty() {
        principal.require_some(verb)?;
    } else {
        principal.require_job(verb, &filter.job_type)?;
    }
    if !filter.tenant.is_empty() {
        principal.require_tenant(&filter.tenant)?;
    }
    Ok(())
}

pub async fn list(
    ctx: &NodeContext,
    principal: &Principal,
    request: pb::ListJobsRequest,
    deadline: Instant,
) -> Result<pb::ListJobsResponse, ApiError> {
    let filter = validate::job_filter(request.filter)?;
    screen_filter(principal, Verb::Read, &filter)?;
    let size = match request.page_size {
        0 => DEFAULT_PAGE_SIZE,
        n if n > 0 && n as usize <= MAX_PAGE_SIZE => n as usize,
        n => {
            return Err(ApiError::InvalidArgument(format!(
                "page_size must be between 1 and {MAX_PAGE_SIZE} (0 for {DEFAULT_PAGE_SIZE}), got {n}"
            )))
        }
    };
    let (jobs, next) =
        page(ctx, &filter, (principal, Verb::Read), resume_at(&request.page_token)?, size, deadline).await?;
    Ok(pb::ListJobsResponse {
        jobs: jobs.iter().map(|job| render::job_for(principal, job)).collect(),
        next_page_token: next.map(|key| key.0.to_string()).unwrap_or_default(),
    })
}

/// What a bulk operation does to each matching job.
pub enum Bulk {
    Retry { retries: i32 },
    Cancel,
}

/// Walks every job matching `filter` and applies `bulk` to each (or only
/// counts them, on a dry run).
pub async fn bulk(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    filter: JobFilter,
    bulk: Bulk,
    dry_run: bool,
    deadline: Instant,
) -> Result<pb::BulkJobsResponse, ApiError> {
    screen_filter(principal, Verb::Manage, &filter)?;
    let mut answer = pb::BulkJobsResponse::default();
    let mut changed: Vec<u64> = Vec::new();
    let mut from = Some(JobKey::new(0, 0));
    while let Some(start) = from {
        let (jobs, next) = page(ctx, &filter, (principal, Verb::Manage), start, MAX_PAGE_SIZE, deadline).await?;
        from = next;
        let keys: Vec<JobKey> = jobs.iter().filter(|j| !j.state.is_final()).map(|j| j.key).collect();
        answer.matched += keys.len() as u64;
        if dry_run || keys.is_empty() {
            continue;
        }
        let commands = keys
            .iter()
            .map(|key| {
                let command = match bulk {
                    Bulk::Retry { retries } => {
                        Command::UpdateRetries { key: *key, retries, by: principal.name.clone() }
                    }
                    Bulk::Cancel => Command::Cancel { key: *key, by: principal.name.clone() },
                };
                Ok((key.partition(), command))
            })
            .collect();
        for (result, key) in run_chunk(ctx, Some(principal), commands, deadline).await.into_iter().zip(&keys) {
            let error = match result {
                Ok(CommandResult::Rejected(error)) => ApiError::from(error),
                Ok(_) => {
                    answer.changed += 1;
                    if changed.len() < MAX_AUDITED_KEYS {
                        changed.push(key.0);
                    }
                    continue;
                }
                Err(error) => error,
            };
            answer.failed += 1;
            if answer.errors.len() < MAX_BULK_ERRORS {
                answer.errors.push(error.to_string());
            }
        }
    }
    if !dry_run {
        let action = match bulk {
            Bulk::Retry { .. } => "retry_jobs",
            Bulk::Cancel => "cancel_jobs",
        };
        crate::auth::audit(
            principal,
            action,
            serde_json::json!({
                "filter": format!("{filter:?}"), "changed": answer.changed, "failed": answer.failed,
                "jobs": changed, "jobs_listed_at_most": MAX_AUDITED_KEYS,
            }),
        );
    }
    Ok(answer)
}

pub async fn retry(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    request: pb::RetryJobsRequest,
    deadline: Instant,
) -> Result<pb::BulkJobsResponse, ApiError> {
    let mut filter = validate::job_filter(request.filter)?;
    match filter.state {
        None | Some(JobState::Incident) => filter.state = Some(JobState::Incident),
        Some(other) => {
            return Err(ApiError::InvalidArgument(format!(
                "RetryJobs retries incidents only; the filter asks for {} jobs",
                other.as_str()
            )))
        }
    }
    let retries = match request.retries {
        0 => 1,
        n if n > 0 => n,
        n => return Err(ApiError::InvalidArgument(format!("retries must be zero (for 1) or more, got {n}"))),
    };
    bulk(ctx, principal, filter, Bulk::Retry { retries }, request.dry_run, deadline).await
}

pub async fn cancel(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    request: pb::CancelJobsRequest,
    deadline: Instant,
) -> Result<pb::BulkJobsResponse, ApiError> {
    let filter = validate::job_filter(request.filter)?;
    if let Some(state) = filter.state.filter(|s| s.is_final()) {
        return Err(ApiError::InvalidArgument(format!(
            "CancelJobs cancels jobs that are not final; the filter asks for {} jobs",
            state.as_str()
        )));
    }
    bulk(ctx, principal, filter, Bulk::Cancel, request.dry_run, deadline).await
}
