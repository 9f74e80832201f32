//! OJS's queues: a queue is a Drover job type of the request's tenant
//! (docs/ojs.md), listed with its figures, paused and resumed through the
//! job API's queues ([`crate::gateway::api::queues`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::time::rfc3339;
use super::{envelope, now_ms, reply, Ojs, OjsCall, OjsError};
use crate::proto::gateway as pb;

fn name_of(queue: String) -> Result<String, OjsError> {
    if !envelope::is_queue(&queue) {
        return Err(OjsError::invalid(format!(
            "queue {queue:?} is not a queue name: lower-case letters, digits, '-' and '.', starting with a letter \
             or digit"
        )));
    }
    Ok(queue)
}

fn status(q: &pb::Queue) -> &'static str {
    if q.paused {
        "paused"
    } else {
        "active"
    }
}

fn ms_or_null(ms: i64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        json!(rfc3339(ms))
    }
}

/// A queue as OJS's conformance suite reads it (`queue` an object with its
/// counts), with the spec's names beside (`status`, `completed_last_hour`).
fn described(q: &pb::Queue) -> Value {
    let hour = q.last_hour.unwrap_or_default();
    let mut described = json!({
        "name": q.r#type,
        "status": status(q),
        "paused": q.paused,
        "paused_at": ms_or_null(q.paused_at),
        "available": q.available,
        "active": q.active,
        "scheduled": q.scheduled,
        "retryable": q.retrying,
        "discarded": q.incidents,
        "completed": hour.completed,
        "failed": hour.failed,
        "oldest_available_at": ms_or_null(q.oldest_available_at),
    });
    if let Some(limit) = &q.limit {
        described["configuration"] = configuration(limit);
    }
    described
}

/// A limit as the admin API's queue `configuration` shows it: the queue's
/// concurrency and rate, and each key's.
fn configuration(limit: &pb::QueueLimit) -> Value {
    let level = |l: &Option<pb::LimitLevel>| {
        let l = l.unwrap_or_default();
        json!({
            "concurrency": (l.concurrency > 0).then_some(l.concurrency),
            "rate_limit": (l.rate > 0).then(|| json!({"limit": l.rate, "period_ms": l.period_ms, "burst": l.burst})),
        })
    };
    let mut shown = level(&limit.queue);
    shown["per_key"] = level(&limit.per_key);
    shown
}

/// The spec's statistics block: counts, the last hour's figures, and the
/// last minute's throughput (whole minutes: see `drover.v1.Queue`).
fn statistics(q: &pb::Queue) -> Value {
    let hour = q.last_hour.unwrap_or_default();
    let minute = q.last_minute.unwrap_or_default();
    let mean = |sum: u64, n: u64| sum.checked_div(n).unwrap_or(0);
    let minute_ms = (q.at.rem_euclid(60_000) + 60_000) as f64;
    json!({
        "available": q.available,
        "active": q.active,
        "scheduled": q.scheduled,
        "retryable": q.retrying,
        "discarded": q.incidents,
        "completed_last_hour": hour.completed,
        "failed_last_hour": hour.failed,
        "avg_duration_ms": mean(hour.run_ms, hour.completed),
        "avg_wait_ms": mean(hour.wait_ms, hour.activated),
        "throughput_per_second": minute.completed as f64 * 1000.0 / minute_ms,
        "oldest_available_age_ms": if q.oldest_available_at == 0 { 0 } else { (q.at - q.oldest_available_at).max(0) },
    })
}

async fn one(ojs: &Ojs, call: &OjsCall, queue: &str) -> Result<pb::Queue, OjsError> {
    let request = pb::ListQueuesRequest { r#type: queue.to_string(), tenant_id: call.scope() };
    let found = ojs.api.list_queues(call, request).await?.pop();
    // A queue with nothing in it, never paused, has no figures: all zero.
    Ok(found.unwrap_or_else(|| pb::Queue { r#type: queue.to_string(), ..Default::default() }))
}

/// `GET /ojs/v1/queues`: every queue of the tenant with a job, a pause or
/// an hour's figures.
pub(super) async fn list(State(ojs): State<Ojs>, call: OjsCall) -> Result<Response, OjsError> {
    let request = pb::ListQueuesRequest { r#type: String::new(), tenant_id: call.scope() };
    let queues = ojs.api.list_queues(&call, request).await?;
    let total = queues.len();
    let queues: Vec<Value> = queues.iter().map(described).collect();
    Ok(reply(
        StatusCode::OK,
        json!({
            "queues": queues,
            "pagination": { "total": total, "limit": total, "offset": 0, "has_more": false },
        }),
    ))
}

/// `GET /ojs/v1/queues/{name}/stats`.
pub(super) async fn stats(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(queue): Path<String>,
) -> Result<Response, OjsError> {
    let queue = name_of(queue)?;
    let q = one(&ojs, &call, &queue).await?;
    Ok(reply(
        StatusCode::OK,
        json!({
            "queue": described(&q),
            "status": status(&q),
            "stats": statistics(&q),
            "computed_at": rfc3339(if q.at == 0 { now_ms() } else { q.at }),
        }),
    ))
}

async fn set_paused(ojs: &Ojs, call: &OjsCall, queue: String, paused: bool) -> Result<Response, OjsError> {
    let queue = name_of(queue)?;
    let request = pb::SetQueuePausedRequest { r#type: queue, tenant_id: call.scope(), paused };
    let q = ojs.api.set_queue_paused(call, request).await?;
    Ok(reply(StatusCode::OK, json!({ "queue": described(&q) })))
}

/// `POST /ojs/v1/queues/{name}/pause`: workers fetch nothing from it until
/// it is resumed; enqueues still land (they wait in it).
pub(super) async fn pause(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(queue): Path<String>,
) -> Result<Response, OjsError> {
    set_paused(&ojs, &call, queue, true).await
}

/// `POST /ojs/v1/queues/{name}/resume`.
pub(super) async fn resume(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(queue): Path<String>,
) -> Result<Response, OjsError> {
    set_paused(&ojs, &call, queue, false).await
}
