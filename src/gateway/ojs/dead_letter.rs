//! OJS's dead-letter queue: Drover's incidents (jobs discarded after their
//! last attempt), listed, retried and deleted.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::envelope::{self, Stored};
use super::{reply, Ojs, OjsCall, OjsError};
use crate::proto::gateway as pb;

const DEFAULT_LIMIT: i32 = 50;
const MAX_LIMIT: i32 = 500;

#[derive(serde::Deserialize, Default)]
pub(super) struct ListQuery {
    #[serde(default)]
    queue: String,
    #[serde(default)]
    limit: Option<i32>,
    #[serde(default)]
    cursor: String,
}

/// `GET /ojs/v1/dead-letter?queue=&limit=&cursor=`: discarded jobs, each
/// with its errors.
pub(super) async fn list(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Query(query): Query<ListQuery>,
) -> Result<Response, OjsError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(OjsError::invalid(format!("limit must be from 1 to {MAX_LIMIT}, got {limit}")));
    }
    let filter =
        pb::JobFilter { state: "incident".into(), r#type: query.queue, tenant_id: call.scope(), ..Default::default() };
    let request = pb::ListJobsRequest { filter: Some(filter), page_size: limit, page_token: query.cursor };
    let page = ojs.api.list(&call, request).await?;
    let mut jobs = Vec::with_capacity(page.jobs.len());
    for job in page.jobs {
        // The listing has no histories: read each job's for its errors.
        let request = pb::GetJobRequest { key: job.key, include_history: true, ..Default::default() };
        let job = ojs.api.get(&call, request).await.unwrap_or(job);
        jobs.push(envelope::job(&job));
    }
    let next = (!page.next_page_token.is_empty()).then_some(page.next_page_token);
    Ok(reply(StatusCode::OK, json!({ "jobs": jobs, "count": jobs.len(), "next_cursor": next })))
}

async fn discarded(ojs: &Ojs, call: &OjsCall, id: &str) -> Result<pb::Job, OjsError> {
    let job = ojs.find(call, id, false).await?;
    if job.state != "incident" {
        let state = envelope::state(&job.state, job.attempt);
        return Err(OjsError::not_found(format!("job {id} is {state}, not in the dead-letter queue")));
    }
    Ok(job)
}

/// `POST /ojs/v1/dead-letter/{id}/retry`: the job gets its policy's attempts
/// again and is available at once.
pub(super) async fn retry(State(ojs): State<Ojs>, call: OjsCall, Path(id): Path<String>) -> Result<Response, OjsError> {
    let job = discarded(&ojs, &call, &id).await?;
    let retries = Stored::of(&job.r#type, &job.custom_headers).policy().max_attempts;
    ojs.api.update_retries(&call, pb::UpdateJobRetriesRequest { key: job.key, retries }).await?;
    let job = ojs.find(&call, &id, true).await?;
    Ok(reply(StatusCode::OK, json!({ "job": envelope::job(&job) })))
}

/// `DELETE /ojs/v1/dead-letter/{id}`: the job leaves the queue for good
/// (Drover cancels it; its record stays readable until retention ends).
pub(super) async fn delete(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(id): Path<String>,
) -> Result<Response, OjsError> {
    let job = discarded(&ojs, &call, &id).await?;
    ojs.api.cancel(&call, pb::CancelJobRequest { key: job.key }).await?;
    Ok(reply(StatusCode::OK, json!({ "deleted": true, "job_id": id })))
}
