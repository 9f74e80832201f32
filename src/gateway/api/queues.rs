//! The job API's queues: a tenant's queue of a job type, paused and resumed
//! on every partition, its figures merged over the partitions (see
//! [`crate::core::queue`]), and its rate and concurrency limit, set on every
//! partition as a pause is (the partitions other than the queue's home send
//! its creates there, and hold what jobs of it they have to the limit
//! themselves) and read from every partition to go with the queue's figures
//! (see [`crate::core::limit`]). All of them ride the partitions' logs, so a
//! pause or a limit holds whichever leader is in office and a listing reads
//! what each leader applied.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::validate;
use super::{ApiError, Call, JobApi};
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::limit::{limit_home, Limit, Rate};
use crate::core::{Command, CommandResult, LimitState, QueueCounts, QueueLimit, QueueStats, LIMITS};
use crate::leaders::fanout::{everywhere_as, gather_everywhere};
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
        validate::job_type(&request.r#type)?;
        let tenant = validate::tenant_id("tenant_id", request.tenant_id)?;
        principal.require_job(Verb::Manage, &request.r#type)?;
        principal.require_tenant(&tenant)?;
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
            validate::job_type(&request.r#type)?;
            principal.require_job(Verb::Read, &request.r#type)?;
        }
        let tenants = validate::listed_tenants(principal, request.tenant_id)?;
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
    if crate::leaders::versions::cluster_reads(ctx, LIMITS) {
        let states = states(ctx, principal, tenants, job_type, call).await?;
        attach(&mut queues, states);
    }
    Ok(queues)
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

impl JobApi {
    /// Sets or lifts a queue's limit on every partition; answers the
    /// queue's figures with it once every partition applied it.
    pub async fn set_queue_limit(&self, call: &Call, request: pb::SetQueueLimitRequest) -> Result<pb::Queue, ApiError> {
        let principal = &call.principal;
        validate::job_type(&request.r#type)?;
        let tenant = validate::tenant_id("tenant_id", request.tenant_id)?;
        principal.require_job(Verb::Manage, &request.r#type)?;
        principal.require_tenant(&tenant)?;
        let job_type = request.r#type;
        let home = limit_home(&tenant, &job_type, self.ctx.topology.formed_partitions);
        let limit = request.limit.map(|l| from_proto(l, home)).transpose()?;
        crate::auth::audit(
            principal,
            if limit.is_some() { "limit_queue" } else { "unlimit_queue" },
            serde_json::json!({"type": job_type, "tenant": tenant, "limit": format!("{limit:?}")}),
        );
        set_everywhere(&self.ctx, Some(principal), &tenant, &job_type, limit, call).await?;
        tracing::info!(job_type, tenant, "queue limit set");
        // Its manager sees the queue's figures, whether or not it may read its jobs.
        let mut queues = described(&self.ctx, None, vec![tenant.clone()], &job_type, call).await?;
        Ok(queues.pop().unwrap_or_else(|| queue(QueueStats { tenant, job_type, ..Default::default() })))
    }
}

/// A level of a queue's limit that a create declares (the Open Job Spec's
/// `options.rate_limit`): the queue's own, or with a key each key's (the job
/// carries its key as `drover.limit_key`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredLimit {
    pub per_key: bool,
    pub level: pb::LimitLevel,
}

/// How long a gateway trusts the limit it last saw a queue have.
const SEEN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

impl JobApi {
    /// Makes `declared` a level of `tenant`'s queue `job_type`'s limit
    /// (merged with the level it does not name), unless it is already, for a
    /// create that declares it. Setting it is managing the queue: it needs
    /// `jobs:manage:<type>` (checked at apply), as `SetQueueLimit` does; a
    /// create that declares the limit the queue has needs only to create. The
    /// limit is read as the broker (a producer that may only create learns no
    /// more than whether its declaration matched), fresh whenever this
    /// gateway's last sight of it does not already match: a level another
    /// gateway set meanwhile is kept, not overwritten from a stale copy. Two
    /// creates declaring different levels at once both read, merge and
    /// write: the later write wins, and the next create that declares the
    /// lost level sets it again.
    pub async fn declare_limit(
        &self,
        call: &Call,
        tenant: &str,
        job_type: &str,
        declared: &DeclaredLimit,
        via: &str,
    ) -> Result<(), ApiError> {
        let name = (tenant.to_string(), job_type.to_string());
        let home = limit_home(tenant, job_type, self.ctx.topology.formed_partitions);
        let seen = {
            let seen = self.ctx.gateway.seen_limits.lock().expect("seen limits lock");
            seen.get(&name).filter(|(_, at)| at.elapsed() < SEEN_FOR).map(|(limit, _)| *limit)
        };
        if seen.is_some() && Some(merged(seen, declared, home)?) == seen {
            return Ok(());
        }
        let current = states(&self.ctx, None, vec![tenant.to_string()], job_type, call).await?;
        let current = current.first().map(|s| to_proto(&s.limit));
        let wanted = merged(current, declared, home)?;
        if current != Some(wanted) {
            let limit = from_proto(wanted, home)?;
            crate::auth::audit(
                &call.principal,
                "limit_queue",
                serde_json::json!({"type": job_type, "tenant": tenant, "limit": format!("{limit:?}"), "via": via}),
            );
            set_everywhere(&self.ctx, Some(&call.principal), tenant, job_type, Some(limit), call).await?;
        }
        let mut seen = self.ctx.gateway.seen_limits.lock().expect("seen limits lock");
        if seen.len() >= MAX_SEEN_LIMITS {
            seen.clear();
        }
        seen.insert(name, (wanted, std::time::Instant::now()));
        Ok(())
    }
}

/// The most queue limits a gateway remembers seeing; then it forgets them
/// all and reads again.
const MAX_SEEN_LIMITS: usize = 10_000;

/// `current` with the level `declared` names replaced, as it reads back
/// once set (defaults filled in).
fn merged(
    current: Option<pb::QueueLimit>,
    declared: &DeclaredLimit,
    home: crate::core::PartitionId,
) -> Result<pb::QueueLimit, ApiError> {
    let mut wanted = current.unwrap_or_default();
    match declared.per_key {
        true => wanted.per_key = Some(declared.level),
        false => wanted.queue = Some(declared.level),
    }
    Ok(to_proto(&from_proto(wanted, home)?))
}

/// Sets `limit` (or lifts it) on every partition, as `principal` (checked
/// at apply), or as the broker.
async fn set_everywhere(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    tenant: &str,
    job_type: &str,
    limit: Option<QueueLimit>,
    call: &Call,
) -> Result<(), ApiError> {
    let command =
        |_| Command::SetLimit { tenant: tenant.to_string(), job_type: job_type.to_string(), limit: limit.clone() };
    for result in everywhere_as(ctx, principal, command, call.deadline).await {
        result?;
    }
    Ok(())
}

/// Every partition's view of `tenants`' limited queues (of `job_type`,
/// unless empty).
async fn states(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    tenants: Vec<String>,
    job_type: &str,
    call: &Call,
) -> Result<Vec<LimitState>, ApiError> {
    let command = |_| Command::GetLimits { tenants: tenants.clone(), job_type: job_type.to_string() };
    gather_everywhere(ctx, principal, command, call.deadline, "a limit listing", |result| match result {
        CommandResult::Limits(states) => Some(std::mem::take(states)),
        _ => None,
    })
    .await
}

/// Puts each limited queue's limit and its figures over the partitions on
/// its entry of `queues` (adding one for a limited queue with no figures).
pub fn attach(queues: &mut Vec<pb::Queue>, states: Vec<LimitState>) {
    let mut by_queue: BTreeMap<(String, String), Vec<LimitState>> = BTreeMap::new();
    for state in states {
        by_queue.entry((state.tenant.clone(), state.job_type.clone())).or_default().push(state);
    }
    for ((tenant, job_type), parts) in by_queue {
        let index = match queues.iter().position(|q| q.tenant_id == tenant && q.r#type == job_type) {
            Some(index) => index,
            None => {
                queues.push(queue(QueueStats { tenant, job_type, ..Default::default() }));
                queues.len() - 1
            }
        };
        let queue = &mut queues[index];
        let home = parts[0].limit.home;
        // Every partition holds the same limit; the home's figures lead.
        let lead = parts.iter().find(|p| p.partition == home).unwrap_or(&parts[0]);
        queue.limit = Some(to_proto(&lead.limit));
        queue.limit_home = home;
        queue.limit_tokens = lead.tokens.unwrap_or(-1);
        queue.limit_active = parts.iter().map(|p| p.active).sum();
        queue.limit_keys = parts.iter().map(|p| p.keys).sum();
        queue.limit_waiting_elsewhere = parts.iter().filter(|p| p.partition != home).map(|p| p.waiting).sum();
    }
}

/// A limit as a person asked for it, checked.
pub fn from_proto(limit: pb::QueueLimit, home: crate::core::PartitionId) -> Result<QueueLimit, ApiError> {
    let limit = QueueLimit { home, queue: level(limit.queue), per_key: level(limit.per_key) };
    limit.validate().map_err(ApiError::InvalidArgument)?;
    Ok(limit)
}

fn level(level: Option<pb::LimitLevel>) -> Limit {
    let Some(level) = level else { return Limit::default() };
    let rate = (level.rate > 0).then(|| {
        let period_ms = if level.period_ms == 0 { 1_000 } else { level.period_ms };
        let rate = Rate::new(level.rate, period_ms);
        Rate { burst: if level.burst == 0 { rate.burst } else { level.burst }, ..rate }
    });
    Limit { rate, concurrency: (level.concurrency > 0).then_some(level.concurrency) }
}

pub fn to_proto(limit: &QueueLimit) -> pb::QueueLimit {
    let level = |l: &Limit| pb::LimitLevel {
        rate: l.rate.map_or(0, |r| r.limit),
        period_ms: l.rate.map_or(0, |r| r.period_ms),
        burst: l.rate.map_or(0, |r| r.burst),
        concurrency: l.concurrency.unwrap_or(0),
    };
    pb::QueueLimit { queue: Some(level(&limit.queue)), per_key: Some(level(&limit.per_key)) }
}
