//! The console's job pages: search, a job with its history (retry, cancel),
//! and incidents (retry all that match).

use std::sync::Arc;

use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use minijinja::{context, Value};
use serde::Deserialize;

use super::*;
use crate::auth::Principal;
use crate::context::NodeContext;

#[derive(Deserialize, Default)]
pub(super) struct Search {
    #[serde(default)]
    state: String,
    #[serde(default, rename = "type")]
    job_type: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    page: String,
}

impl Search {
    fn filter(&self) -> JobFilter {
        JobFilter {
            state: self.state.trim().to_string(),
            r#type: self.job_type.trim().to_string(),
            tenant_id: self.tenant.trim().to_string(),
            error_contains: self.error.trim().to_string(),
            ..Default::default()
        }
    }

    /// This search's query string without its page.
    fn query(&self) -> String {
        format!(
            "state={}&type={}&tenant={}&error={}",
            encode(&self.state),
            encode(&self.job_type),
            encode(&self.tenant),
            encode(&self.error)
        )
    }
}

/// One row of a job list.
pub(super) fn job_row(job: &Job, now: i64) -> Value {
    context! {
        key => job.key.to_string(),
        job_type => &job.r#type,
        tenant => &job.tenant_id,
        state => &job.state,
        retries => job.retries,
        attempt => job.attempt,
        worker => &job.worker,
        created => time::ago(now, job.created_at),
        error => shorten(&job.error_message, 120),
        reason => &job.failure_reason,
    }
}

/// `text` cut to about `chars` characters, with an ellipsis when cut.
pub(super) fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// A page of jobs matching `search`, through ListJobs.
pub(super) async fn list(
    ctx: &Arc<NodeContext>,
    call: &crate::gateway::api::Call,
    search: &Search,
) -> Result<(Vec<Value>, String), tonic::Status> {
    let api = crate::gateway::api::JobApi::new(Arc::clone(ctx));
    let request =
        ListJobsRequest { filter: Some(search.filter()), page_size: PAGE_SIZE, page_token: search.page.clone() };
    let answer = api.list(call, request).await?;
    let now = crate::auth::now_ms() as i64;
    Ok((answer.jobs.iter().map(|j| job_row(j, now)).collect(), answer.next_page_token))
}

pub(super) async fn jobs(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Query(search): Query<Search>,
) -> Response {
    let key = search.key.trim();
    if !key.is_empty() {
        return match key.parse::<u64>() {
            Ok(key) => Redirect::to(&format!("/console/jobs/{key}")).into_response(),
            Err(_) => {
                let status = tonic::Status::invalid_argument(format!("{key:?} is not a job key (a decimal number)"));
                failure(&ctx, &principal, "Finding a job", &status)
            }
        };
    }
    let (rows, next) = match list(&ctx, &call, &search).await {
        Ok(found) => found,
        Err(status) => return failure(&ctx, &principal, "Searching jobs", &status),
    };
    let page = context! {
        states => STATES,
        state => &search.state,
        job_type => &search.job_type,
        tenant => &search.tenant,
        error => &search.error,
        jobs => rows,
        next => if next.is_empty() { None } else { Some(format!("/console/jobs?{}&page={}", search.query(), encode(&next))) },
    };
    render(&ctx, Some(&principal), "jobs.html", page)
}

pub(super) async fn incidents(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Query(mut search): Query<Search>,
) -> Response {
    search.state = "incident".into();
    let (rows, next) = match list(&ctx, &call, &search).await {
        Ok(found) => found,
        Err(status) => return failure(&ctx, &principal, "Listing incidents", &status),
    };
    let page = context! {
        job_type => &search.job_type,
        tenant => &search.tenant,
        error => &search.error,
        jobs => rows,
        next => if next.is_empty() {
            None
        } else {
            Some(format!("/console/incidents?{}&page={}", search.query(), encode(&next)))
        },
    };
    render(&ctx, Some(&principal), "incidents.html", page)
}

#[derive(Deserialize, Default)]
pub(super) struct Notice {
    #[serde(default)]
    done: String,
}

/// A job with its history, and what may be done with it.
pub(super) async fn job(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Path(key): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let Ok(key) = key.parse::<u64>() else {
        let status = tonic::Status::invalid_argument(format!("{key:?} is not a job key (a decimal number)"));
        return failure(&ctx, &principal, "A job", &status);
    };
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let request = GetJobRequest { key, include_history: true, ..Default::default() };
    let job = match api.get(&call, request).await {
        Ok(job) => job,
        Err(error) => return failure(&ctx, &principal, &format!("Job {key}"), &error.into()),
    };
    let start = job.history.first().map_or(0, |e| e.at);
    let events: Vec<Value> = job
        .history
        .iter()
        .enumerate()
        .map(|(i, e)| {
            context! {
                offset => format!("{:+.3}s", (e.at - start) as f64 / 1000.0),
                at => time::utc(e.at),
                at_ms => e.at,
                kind => &e.kind,
                text => crate::client::describe_event(e, start),
                dropped_after => if i + 1 == 8 && job.history_dropped > 0 { Some(job.history_dropped) } else { None },
            }
        })
        .collect();
    let now = crate::auth::now_ms() as i64;
    let notice = match notice.done.as_str() {
        "retried" => Some("Retries set: the job is activatable again."),
        "cancelled" => Some("The job was cancelled."),
        _ => None,
    };
    let pretty = |json: &str| {
        serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| json.to_string())
    };
    let page = context! {
        key => job.key.to_string(),
        job_type => job.r#type,
        tenant => job.tenant_id,
        state => &job.state,
        retries => job.retries,
        attempt => job.attempt,
        worker => job.worker,
        session => if job.session_id == 0 { String::new() } else { format!("{:x}", job.session_id) },
        partition => job.partition_id,
        created => time::utc(job.created_at),
        created_ago => time::ago(now, job.created_at),
        due => if job.due_at > 0 { time::utc(job.due_at) } else { String::new() },
        deadline => if job.deadline > 0 { time::utc(job.deadline) } else { String::new() },
        error => job.error_message,
        reason => job.failure_reason,
        idempotency_key => job.idempotency_key,
        user => job.user,
        stage => job.stage,
        stages => job.stages,
        headers => job.custom_headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>(),
        variables => pretty(&job.variables),
        result => if job.result.is_empty() { String::new() } else { pretty(&job.result) },
        events => events,
        can_retry => job.state == "incident",
        can_cancel => !matches!(job.state.as_str(), "completed" | "cancelled" | "expired"),
        expires => if job.expires_at > 0 { time::utc(job.expires_at) } else { String::new() },
        notice => notice,
    };
    render(&ctx, Some(&principal), "job.html", page)
}

#[derive(Deserialize)]
pub(super) struct RetryForm {
    retries: i32,
    #[serde(default)]
    back: String,
}

/// Where a form's action goes back to: the page it names, when it is a
/// console page; otherwise `fallback`.
pub(super) fn back_to(back: &str, fallback: String) -> Redirect {
    if back.starts_with("/console") && !back.starts_with("//") {
        Redirect::to(back)
    } else {
        Redirect::to(&fallback)
    }
}

pub(super) async fn retry(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Path(key): Path<u64>,
    Form(form): Form<RetryForm>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let request = UpdateJobRetriesRequest { key, retries: form.retries };
    match api.update_retries(&call, request).await {
        Ok(()) => back_to(&form.back, format!("/console/jobs/{key}?done=retried")).into_response(),
        Err(error) => failure(&ctx, &principal, &format!("Retrying job {key}"), &error.into()),
    }
}

#[derive(Deserialize)]
pub(super) struct CancelForm {
    #[serde(default)]
    back: String,
}

pub(super) async fn cancel(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Path(key): Path<u64>,
    Form(form): Form<CancelForm>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    match api.cancel(&call, CancelJobRequest { key }).await {
        Ok(()) => back_to(&form.back, format!("/console/jobs/{key}?done=cancelled")).into_response(),
        Err(error) => failure(&ctx, &principal, &format!("Cancelling job {key}"), &error.into()),
    }
}

#[derive(Deserialize)]
pub(super) struct RetryAllForm {
    retries: i32,
    #[serde(default, rename = "type")]
    job_type: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    error: String,
}

/// Every incident matching the incidents page's filter gets `retries`.
pub(super) async fn retry_all(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Form(form): Form<RetryAllForm>,
) -> Response {
    let search = Search { job_type: form.job_type, tenant: form.tenant, error: form.error, ..Default::default() };
    let mut filter = search.filter();
    filter.state = "incident".into();
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let request = RetryJobsRequest { filter: Some(filter), retries: form.retries, dry_run: false };
    match api.retry_jobs(&call, request).await {
        Ok(_) => Redirect::to(&format!("/console/incidents?{}", search.query())).into_response(),
        Err(error) => failure(&ctx, &principal, "Retrying incidents", &error.into()),
    }
}
