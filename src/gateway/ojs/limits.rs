//! OJS's `options.rate_limit`: a job declares its queue's limit (the
//! queue's own, or with a key each key's), and the enqueue sets it on the
//! queue before the job is made, when it is not the queue's limit already.
//! Setting it is managing the queue: it needs `jobs:manage:<queue>`, as
//! `drover queue limit` does; an enqueue that declares the limit the queue
//! has needs only `jobs:create`. Two enqueues declaring different levels at
//! once both read, merge and write: the later write wins, and the next
//! enqueue that declares the lost level sets it again.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::time::parse_duration;
use super::{Ojs, OjsCall, OjsError};
use crate::core::limit::limit_home;
use crate::gateway::api::queues as limits;
use crate::proto::gateway as pb;

/// `options.rate_limit`: a level of the queue's limit, the queue's own or,
/// with a key, each key's (the job carries its key as `drover.limit_key`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredLimit {
    pub per_key: bool,
    pub level: pb::LimitLevel,
}

/// How long this gateway trusts the limit it last saw a queue have.
const KNOWN_FOR: Duration = Duration::from_secs(5);

/// The limits this gateway last saw, by (tenant, queue).
pub(super) type Known = std::collections::HashMap<(String, String), (pb::QueueLimit, Instant)>;

impl Ojs {
    /// Makes `declared` the limit of `queue` (merged with the level it does
    /// not name), unless it is already. The queue's limit is read as the
    /// broker (a producer that may only create learns no more than whether
    /// its declaration matched), fresh whenever this gateway's last sight of
    /// it does not already match: a level another gateway set meanwhile is
    /// kept, not overwritten from a stale copy.
    pub(super) async fn declare_limit(
        &self,
        call: &OjsCall,
        queue: &str,
        declared: &DeclaredLimit,
    ) -> Result<(), OjsError> {
        let tenant = call.scope();
        let name = (tenant.clone(), queue.to_string());
        let home = limit_home(&tenant, queue, self.ctx.topology.formed_partitions);
        let known = {
            let known = self.limits.lock().expect("limits lock");
            known.get(&name).filter(|(_, at)| at.elapsed() < KNOWN_FOR).map(|(limit, _)| *limit)
        };
        if known.is_some() && Some(merged(known, declared, home)?) == known {
            return Ok(());
        }
        let states = limits::states(&self.ctx, None, vec![tenant.clone()], queue, call).await?;
        let current = states.first().map(|s| limits::to_proto(&s.limit));
        let wanted = merged(current, declared, home)?;
        if current != Some(wanted) {
            let limit = limits::from_proto(wanted, home)?;
            crate::auth::audit(
                &call.principal,
                "limit_queue",
                serde_json::json!({"type": queue, "tenant": tenant, "limit": format!("{limit:?}"), "via": "ojs"}),
            );
            limits::set_everywhere(&self.ctx, Some(&call.principal), &tenant, queue, Some(limit), call).await?;
        }
        self.limits.lock().expect("limits lock").insert(name, (wanted, Instant::now()));
        Ok(())
    }
}

/// `current` with the level `declared` names replaced, as it reads back
/// once set (defaults filled in).
fn merged(
    current: Option<pb::QueueLimit>,
    declared: &DeclaredLimit,
    home: crate::core::PartitionId,
) -> Result<pb::QueueLimit, OjsError> {
    let mut wanted = current.unwrap_or_default();
    match declared.per_key {
        true => wanted.per_key = Some(declared.level),
        false => wanted.queue = Some(declared.level),
    }
    Ok(limits::to_proto(&limits::from_proto(wanted, home)?))
}

/// `options.rate_limit` as a limit level and its key: `max_per_second`,
/// or a `throttle` (evenly spaced: a burst of one) or `rate` window, each
/// `{limit, period}` (an ISO 8601 duration), and a `concurrency`.
pub(super) fn parse(value: &Value) -> Result<(pb::LimitLevel, Option<String>), String> {
    let fields = value.as_object().ok_or("options.rate_limit must be an object")?;
    let whole = |name: &str| -> Result<Option<u32>, String> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=u64::from(u32::MAX)).contains(&n) => Ok(Some(n as u32)),
                _ => Err(format!("options.rate_limit.{name} must be a whole number above 0, got {v}")),
            },
        }
    };
    let window = |name: &str| -> Result<Option<(u32, i64)>, String> {
        let Some(window) = fields.get(name).filter(|v| !v.is_null()) else { return Ok(None) };
        let limit = window.get("limit").and_then(Value::as_u64).filter(|n| (1..=u64::from(u32::MAX)).contains(n));
        let period = window.get("period").and_then(Value::as_str).and_then(parse_duration).filter(|ms| *ms > 0);
        match (limit, period) {
            (Some(limit), Some(period)) => Ok(Some((limit as u32, period))),
            _ => Err(format!(
                "options.rate_limit.{name} needs limit (a whole number above 0) and period (an ISO 8601 duration)"
            )),
        }
    };
    let mut level = pb::LimitLevel { concurrency: whole("concurrency")?.unwrap_or(0), ..Default::default() };
    if let Some(per_second) = whole("max_per_second")? {
        (level.rate, level.period_ms) = (per_second, 1_000);
    } else if let Some((limit, period)) = window("throttle")? {
        (level.rate, level.period_ms, level.burst) = (limit, period, 1);
    } else if let Some((limit, period)) = window("rate")? {
        (level.rate, level.period_ms, level.burst) = (limit, period, limit);
    }
    if level.rate == 0 && level.concurrency == 0 {
        return Err("options.rate_limit needs max_per_second, throttle, rate or concurrency".into());
    }
    let key = match fields.get("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) if !key.is_empty() && key.len() <= 255 => Some(key.clone()),
        Some(other) => return Err(format!("options.rate_limit.key must be a string of 1 to 255 bytes, got {other}")),
    };
    Ok((level, key))
}
