//! The console's queues page: per tenant and job type, jobs by state, the
//! oldest waiting job's age, the last minute's and hour's rates, whether
//! it is paused, with pause and resume, and its rate and concurrency limit.

use std::sync::Arc;

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use minijinja::{context, Value};
use serde::Deserialize;

use super::*;
use crate::auth::Principal;
use crate::context::NodeContext;

#[derive(Deserialize, Default)]
pub(super) struct QueuesQuery {
    #[serde(default)]
    done: String,
    #[serde(default)]
    queue: String,
}

/// A rate per minute over a window of whole minutes (see `drover.v1.Queue`):
/// the last minute's figures cover the minute under way and the one before.
fn per_minute(count: u64, at: i64) -> String {
    let span_ms = at.rem_euclid(60_000) + 60_000;
    format!("{:.1}", count as f64 * 60_000.0 / span_ms as f64)
}

fn mean_ms(sum: u64, n: u64) -> String {
    match sum.checked_div(n) {
        Some(mean) if n > 0 => format!("{mean} ms"),
        _ => "—".into(),
    }
}

pub(super) async fn queues(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Query(query): Query<QueuesQuery>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let queues = match api.list_queues(&call, ListQueuesRequest::default()).await {
        Ok(queues) => queues,
        Err(error) => return failure(&ctx, &principal, "Queues", &error.into()),
    };
    let rows: Vec<Value> = queues
        .iter()
        .map(|q| {
            let (minute, hour) = (q.last_minute.unwrap_or_default(), q.last_hour.unwrap_or_default());
            context! {
                tenant => &q.tenant_id,
                job_type => &q.r#type,
                paused => q.paused,
                paused_ago => time::ago(q.at, q.paused_at),
                available => q.available,
                active => q.active,
                scheduled => q.scheduled,
                retrying => q.retrying,
                incidents => q.incidents,
                oldest => if q.oldest_available_at == 0 { String::new() } else { time::ago(q.at, q.oldest_available_at) },
                created_rate => per_minute(minute.created, q.at),
                completed_rate => per_minute(minute.completed, q.at),
                completed_hour => hour.completed,
                failed_hour => hour.failed,
                wait => mean_ms(hour.wait_ms, hour.activated),
                run => mean_ms(hour.run_ms, hour.completed),
                limit => q.limit.as_ref().map(crate::gateway::api::render::describe).unwrap_or_default(),
                limit_now => q.limit.as_ref().map(|_| crate::gateway::api::render::describe_now(q)).unwrap_or_default(),
            }
        })
        .collect();
    let notice = match query.done.as_str() {
        "paused" => Some(format!("Queue {} paused: its jobs wait until it is resumed.", query.queue)),
        "resumed" => Some(format!("Queue {} resumed.", query.queue)),
        _ => None,
    };
    render(&ctx, Some(&principal), "queues.html", context! { queues => rows, notice => notice })
}

#[derive(Deserialize)]
pub(super) struct PauseForm {
    #[serde(rename = "type")]
    job_type: String,
    #[serde(default)]
    tenant: String,
    paused: bool,
}

pub(super) async fn set_paused(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Form(form): Form<PauseForm>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let name = format!("{}/{}", form.tenant, form.job_type);
    let request = SetQueuePausedRequest { r#type: form.job_type, tenant_id: form.tenant, paused: form.paused };
    match api.set_queue_paused(&call, request).await {
        Ok(_) => {
            let done = if form.paused { "paused" } else { "resumed" };
            Redirect::to(&format!("/console/queues?done={done}&queue={}", encode(&name))).into_response()
        }
        Err(error) => failure(&ctx, &principal, "Pausing a queue", &error.into()),
    }
}
