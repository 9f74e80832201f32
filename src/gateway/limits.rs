//! The job API's queue limits: set on every partition, as a pause is (the
//! partitions other than the queue's home send its creates there, and hold
//! what jobs of it they have to the limit themselves), and read from every
//! partition to go with the queue's figures (see [`crate::core::limit`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::call::Call;
use super::convert;
use super::error::ApiError;
use super::fanout::{everywhere_as, gather_everywhere};
use super::jobs::JobApi;
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::limit::{limit_home, Limit, Rate};
use crate::core::{Command, CommandResult, LimitState, QueueLimit, QueueStats, LIMITS};
use crate::proto::gateway as pb;

impl JobApi {
    /// Sets or lifts a queue's limit on every partition; answers the
    /// queue's figures with it once every partition applied it.
    pub async fn set_queue_limit(&self, call: &Call, request: pb::SetQueueLimitRequest) -> Result<pb::Queue, ApiError> {
        let principal = &call.principal;
        convert::job_type(&request.r#type)?;
        let tenant = convert::tenant_id("tenant_id", request.tenant_id)?;
        principal.require_job(Verb::Manage, &request.r#type)?;
        principal.require_tenant(&tenant)?;
        require_cluster_version(&self.ctx)?;
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
        let mut queues = super::queues::described(&self.ctx, None, vec![tenant.clone()], &job_type, call).await?;
        Ok(queues.pop().unwrap_or_else(|| super::queues::queue(QueueStats { tenant, job_type, ..Default::default() })))
    }
}

/// Sets `limit` (or lifts it) on every partition, as `principal` (checked
/// at apply), or as the broker.
pub async fn set_everywhere(
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

/// Limits travel as data version 14 commands.
pub fn require_cluster_version(ctx: &NodeContext) -> Result<(), ApiError> {
    super::status::require_cluster_version(ctx, LIMITS, "queue limits")
}

/// Every partition's view of `tenants`' limited queues (of `job_type`,
/// unless empty).
pub async fn states(
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
                queues.push(super::queues::queue(QueueStats { tenant, job_type, ..Default::default() }));
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

/// A limit in words, for people: "10 per 1000 ms (burst 2), 4 at once;
/// each key: 1 at once".
pub fn describe(limit: &pb::QueueLimit) -> String {
    let level = |l: &Option<pb::LimitLevel>| {
        let l = l.unwrap_or_default();
        let mut parts = Vec::new();
        if l.rate > 0 {
            parts.push(format!("{} per {} ms (burst {})", l.rate, l.period_ms, l.burst));
        }
        if l.concurrency > 0 {
            parts.push(format!("{} at once", l.concurrency));
        }
        parts.join(", ")
    };
    let (queue, per_key) = (level(&limit.queue), level(&limit.per_key));
    match (queue.is_empty(), per_key.is_empty()) {
        (false, true) => queue,
        (true, false) => format!("each key: {per_key}"),
        _ => format!("{queue}; each key: {per_key}"),
    }
}

/// What a limited queue's limit holds now, in words: "home partition 2,
/// 3 held, 1 token, 5 waiting on other partitions".
pub fn describe_now(q: &pb::Queue) -> String {
    let mut text = format!("home partition {}, {} held", q.limit_home, q.limit_active);
    if q.limit_tokens >= 0 {
        text.push_str(&format!(", {} token{}", q.limit_tokens, if q.limit_tokens == 1 { "" } else { "s" }));
    }
    if q.limit_keys > 0 {
        text.push_str(&format!(", {} keys", q.limit_keys));
    }
    if q.limit_waiting_elsewhere > 0 {
        text.push_str(&format!(", {} waiting on other partitions", q.limit_waiting_elsewhere));
    }
    text
}
