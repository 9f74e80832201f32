//! The job API's queues: a tenant's queue of a job type, paused and resumed
//! on every partition, and its figures merged over the partitions (see
//! [`crate::core::queue`]). Both ride the partitions' logs, so a pause holds
//! whichever leader is in office and a listing reads what each leader
//! applied.

use std::sync::Arc;

use super::call::Call;
use super::convert;
use super::error::ApiError;
use super::fanout::{everywhere_as, gather_everywhere};
use super::jobs::JobApi;
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::{Command, CommandResult, QueueCounts, QueueStats, PAUSED_QUEUES};
use crate::proto::gateway as pb;

impl JobApi {
    /// Pauses or resumes a queue on every partition; answers its figures
    /// once every partition applied the change.
    pub async fn set_queue_paused(
        &self,
        call: &Call,
        request: pb::SetQueuePausedRequest,
    ) -> Result<pb::Queue, ApiError> {
        let principal = &call.principal;
        convert::job_type(&request.r#type)?;
        let tenant = convert::tenant_id("tenant_id", request.tenant_id)?;
        principal.require_job(Verb::Manage, &request.r#type)?;
        principal.require_tenant(&tenant)?;
        require_cluster_version(&self.ctx)?;
        crate::auth::audit(
            principal,
            if request.paused { "pause_queue" } else { "resume_queue" },
            serde_json::json!({"type": request.r#type, "tenant": tenant}),
        );
        let (job_type, paused) = (request.r#type, request.paused);
        let command = |_| Command::SetPaused { tenant: tenant.clone(), job_type: job_type.clone(), paused };
        for result in everywhere_as(&self.ctx, Some(principal), command, call.deadline).await {
            result?;
        }
        tracing::info!(job_type, tenant, paused, "queue {}", if paused { "paused" } else { "resumed" });
        // Its manager sees the queue's figures, whether or not it may read its jobs.
        let mut queues = described(&self.ctx, None, vec![tenant.clone()], &job_type, call).await?;
        Ok(queues.pop().unwrap_or_else(|| {
            // Resumed with nothing in it: a queue with no figures.
            queue(QueueStats { tenant, job_type, ..Default::default() })
        }))
    }

    /// The figures of the queues `request` names that the caller may read.
    pub async fn list_queues(&self, call: &Call, request: pb::ListQueuesRequest) -> Result<Vec<pb::Queue>, ApiError> {
        let principal = &call.principal;
        if request.r#type.is_empty() {
            principal.require_some(Verb::Read)?;
        } else {
            convert::job_type(&request.r#type)?;
            principal.require_job(Verb::Read, &request.r#type)?;
        }
        let tenants = convert::listed_tenants(principal, request.tenant_id)?;
        require_cluster_version(&self.ctx)?;
        let queues = described(&self.ctx, Some(principal), tenants, &request.r#type, call).await?;
        Ok(queues.into_iter().filter(|q| principal.may(Verb::Read, &q.r#type)).collect())
    }
}

/// `tenants`' queues (of `job_type`, unless empty) as `drover.v1` gives
/// them: every partition's figures merged, with each queue's limit once
/// every member reads limits.
pub async fn described(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    tenants: Vec<String>,
    job_type: &str,
    call: &Call,
) -> Result<Vec<pb::Queue>, ApiError> {
    let mut queues: Vec<pb::Queue> =
        figures(ctx, principal, tenants.clone(), job_type, call).await?.into_iter().map(queue).collect();
    if super::limits::require_cluster_version(ctx).is_ok() {
        let states = super::limits::states(ctx, principal, tenants, job_type, call).await?;
        super::limits::attach(&mut queues, states);
    }
    Ok(queues)
}

/// Queues travel as data version 11 commands: refused, saying why, while a
/// member runs an older build.
fn require_cluster_version(ctx: &NodeContext) -> Result<(), ApiError> {
    super::status::require_cluster_version(ctx, PAUSED_QUEUES, "paused queues and queue listings")
}

/// Every partition's figures of `tenants`' queues (of `job_type`, unless
/// empty), merged; read as `principal` (checked at apply), or as the broker.
async fn figures(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    tenants: Vec<String>,
    job_type: &str,
    call: &Call,
) -> Result<Vec<QueueStats>, ApiError> {
    let command = |_| Command::QueueStats { tenants: tenants.clone(), job_type: job_type.to_string() };
    let parts = gather_everywhere(ctx, principal, command, call.deadline, "a queue listing", |result| match result {
        CommandResult::Queues(queues) => Some(std::mem::take(queues)),
        _ => None,
    })
    .await?;
    Ok(QueueStats::merge_all(parts))
}

fn counts(c: QueueCounts) -> pb::QueueCounts {
    pb::QueueCounts {
        created: c.created,
        activated: c.activated,
        completed: c.completed,
        failed: c.failed,
        exhausted: c.exhausted,
        wait_ms: c.wait_ms,
        run_ms: c.run_ms,
    }
}

/// A queue's figures as `drover.v1` gives them.
pub fn queue(s: QueueStats) -> pb::Queue {
    pb::Queue {
        r#type: s.job_type,
        tenant_id: s.tenant,
        paused: s.paused_at.is_some(),
        paused_at: s.paused_at.unwrap_or(0),
        available: s.available,
        active: s.active,
        scheduled: s.scheduled,
        retrying: s.retrying,
        incidents: s.incidents,
        oldest_available_at: s.oldest_available_at.unwrap_or(0),
        last_minute: Some(counts(s.last_minute)),
        last_hour: Some(counts(s.last_hour)),
        at: s.at,
        ..Default::default()
    }
}
