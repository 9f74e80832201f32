//! OJS's job endpoints: enqueue (one, or a batch), info, cancel, and the
//! bulk cancel an operator (or a test runner's reset) uses; and finding a
//! job by its OJS id.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::envelope::{self, Conflict, Enqueue, Unique};
use super::{body_json, ids, now_ms, reply, JsonBody, Ojs, OjsCall, OjsError};
use crate::auth::Verb;
use crate::gateway::api::{validate, ApiError};
use crate::proto::gateway as pb;

/// How many generations of a unique key an enqueue walks (each a job that
/// no longer blocks) before it gives up.
const MAX_UNIQUE_GENERATIONS: usize = 64;
/// The most jobs one batch enqueue takes.
const MAX_BATCH: usize = 1000;

impl Ojs {
    /// The job OJS id `id` names, with its history when `history`, if the
    /// caller may read it.
    pub(super) async fn find(&self, call: &OjsCall, id: &str, history: bool) -> Result<pb::Job, OjsError> {
        self.find_for(call, id, history, Verb::Read).await
    }

    /// The job OJS id `id` names, if the caller may `verb` it (a worker
    /// answering for a job it holds: `jobs:work:<queue>`).
    pub(super) async fn find_for(
        &self,
        call: &OjsCall,
        id: &str,
        history: bool,
        verb: Verb,
    ) -> Result<pb::Job, OjsError> {
        let missing = || OjsError::not_found(format!("no job with id {id}"));
        if !ids::is_uuidv7(id) {
            return Err(missing());
        }
        if let Some(key) = ids::key_of(id).filter(|k| k.partition() < self.ctx.topology.partition_count()) {
            let request = pb::GetJobRequest { key: key.0, include_history: history, ..Default::default() };
            match self.api.get_for(call, request, verb).await {
                Ok(job) if envelope::Stored::of(&job.r#type, &job.custom_headers).id(job.key, job.created_at) == id => {
                    return Ok(job)
                }
                Ok(_) | Err(ApiError::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        self.by_idempotency_key(call, &envelope::id_key(id), history, verb).await?.ok_or_else(missing)
    }

    async fn by_idempotency_key(
        &self,
        call: &OjsCall,
        key: &str,
        history: bool,
        verb: Verb,
    ) -> Result<Option<pb::Job>, OjsError> {
        let request = pb::GetJobRequest {
            idempotency_key: key.to_string(),
            tenant_id: call.tenant.clone(),
            include_history: history,
            ..Default::default()
        };
        match self.api.get_for(call, request, verb).await {
            Ok(job) => Ok(Some(job)),
            Err(ApiError::NotFound(_)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Refuses a job over the node's payload limit as too large (413): the
    /// job API would refuse it as RESOURCE_EXHAUSTED, which OJS reads as a
    /// rate limit to retry.
    fn check_size(&self, request: &pb::CreateJobRequest) -> Result<(), OjsError> {
        let (bytes, limit) = (validate::payload_bytes(request), self.ctx.settings.limits.max_payload_bytes);
        if bytes > limit {
            return Err(OjsError::too_large(bytes, limit));
        }
        Ok(())
    }

    /// Leaves a job's own activation timeout out of its create while some
    /// member cannot take it (below data version 19): the fetch that takes
    /// such a job moves its activation's deadline instead (see
    /// [`super::worker`]), from the options the job keeps.
    pub(super) fn fit_timeout(&self, request: &mut pb::CreateJobRequest) {
        if request.activation_timeout != 0 && !self.api.takes_activation_timeouts() {
            request.activation_timeout = 0;
        }
    }

    /// Creates one checked enqueue: the status and the envelope to answer.
    async fn create(&self, call: &OjsCall, mut enqueue: Enqueue) -> Result<(StatusCode, Value), OjsError> {
        self.check_size(&enqueue.request)?;
        self.fit_timeout(&mut enqueue.request);
        enqueue.request.tenant_id.clone_from(&call.tenant);
        if let Some(declared) = &enqueue.limit {
            self.api.declare_limit(call, &call.scope(), &enqueue.request.r#type, declared, "ojs").await?;
        }
        match enqueue.unique.clone() {
            Some(unique) if enqueue.request.idempotency_key.is_empty() => {
                self.create_unique(call, enqueue, unique).await
            }
            _ => {
                let client_id = enqueue.request.custom_headers.get(envelope::ID).cloned();
                let duplicate = |id: Option<String>| {
                    OjsError::duplicate(format!("a job with id {} exists already", id.unwrap_or_default()))
                };
                let created = match self.api.create(call, enqueue.request.clone()).await {
                    Ok(created) if created.created => created,
                    Ok(_) => return Err(duplicate(client_id)),
                    // The same id with other contents.
                    Err(ApiError::FailedPrecondition(_)) if client_id.is_some() => return Err(duplicate(client_id)),
                    // Without an id a second send may make a second job.
                    Err(error) if enqueue.request.idempotency_key.is_empty() => {
                        return Err(OjsError::from(error).unless_outcome_unknown())
                    }
                    Err(error) => return Err(error.into()),
                };
                Ok((StatusCode::CREATED, created_envelope(&enqueue.request, &created)))
            }
        }
    }

    /// OJS's unique jobs on idempotency keys: the unique fields hash to a
    /// key; a job under it that no longer blocks (its state is not among
    /// `states`, or its period passed) hands the key on to the next
    /// generation, named after that job, so concurrent enqueues of one
    /// duplicate agree on which job is made.
    async fn create_unique(
        &self,
        call: &OjsCall,
        mut enqueue: Enqueue,
        unique: Unique,
    ) -> Result<(StatusCode, Value), OjsError> {
        let now = now_ms();
        let mut key = unique.key.clone();
        for _ in 0..MAX_UNIQUE_GENERATIONS {
            if let Some(existing) = self.by_idempotency_key(call, &key, false, Verb::Read).await? {
                let state = envelope::state(&existing.state, existing.attempt);
                let blocks = unique.states.iter().any(|s| s == state)
                    && unique.period_ms.is_none_or(|period| existing.created_at + period > now);
                if blocks {
                    match unique.on_conflict {
                        Conflict::Reject => {
                            let id = envelope::Stored::of(&existing.r#type, &existing.custom_headers)
                                .id(existing.key, existing.created_at);
                            return Err(OjsError::duplicate(format!(
                                "job {id} is a duplicate under options.unique and is {state}"
                            )));
                        }
                        Conflict::Ignore => return Ok((StatusCode::OK, json!({ "job": envelope::job(&existing) }))),
                        Conflict::Replace => {
                            match self.api.cancel(call, pb::CancelJobRequest { key: existing.key }).await {
                                Ok(()) | Err(ApiError::FailedPrecondition(_)) => {}
                                Err(error) => return Err(error.into()),
                            }
                        }
                    }
                }
                key = format!("{}#{}", unique.key, existing.key);
                continue;
            }
            enqueue.request.idempotency_key = key.clone();
            match self.api.create(call, enqueue.request.clone()).await {
                Ok(created) if created.created => {
                    return Ok((StatusCode::CREATED, created_envelope(&enqueue.request, &created)))
                }
                // Another enqueue made this generation meanwhile: look again.
                Ok(_) | Err(ApiError::FailedPrecondition(_)) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(OjsError::from(ApiError::Unavailable(format!(
            "{MAX_UNIQUE_GENERATIONS} generations of this unique key exist within the de-duplication window; \
             give the job options.unique.period, or retry later"
        ))))
    }
}

/// OJS's rule for a tenant named twice: the header's and `meta.tenant_id`
/// must agree.
fn check_tenant(call: &OjsCall, job: &Value) -> Result<(), OjsError> {
    match job.pointer("/meta/tenant_id").and_then(Value::as_str) {
        Some(meta) if !call.tenant.is_empty() && meta != call.tenant => Err(OjsError::invalid(format!(
            "meta.tenant_id {meta:?} differs from the X-OJS-Tenant header {:?}",
            call.tenant
        ))),
        _ => Ok(()),
    }
}

/// The envelope of a job just made, from the request (no read).
fn created_envelope(request: &pb::CreateJobRequest, created: &pb::CreateJobResponse) -> Value {
    let at = request.custom_headers.get(envelope::AT).and_then(|at| at.parse().ok()).unwrap_or_else(now_ms);
    let job = pb::Job {
        key: created.key,
        r#type: request.r#type.clone(),
        variables: request.variables.clone(),
        custom_headers: request.custom_headers.clone(),
        priority: request.priority,
        retries: request.retries.unwrap_or_default(),
        state: created.state.clone(),
        created_at: at,
        due_at: if request.run_at > 0 { request.run_at } else { at },
        ..Default::default()
    };
    json!({ "job": envelope::job(&job) })
}

pub(super) async fn enqueue(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let enqueue = envelope::enqueue(&body, now_ms()).map_err(OjsError::refused)?;
    check_tenant(&call, &body)?;
    let (status, answer) = ojs.create(&call, enqueue).await?;
    Ok(reply(status, answer))
}

/// `POST /ojs/v1/jobs/batch`: every job is checked before any is made, so a
/// batch with one bad job makes none. Jobs without an id or unique key are
/// made in one round per partition; a partition that fails leaves its jobs
/// with an error in the answer (207) and the others made.
pub(super) async fn enqueue_batch(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let Some(jobs) = body.get("jobs").and_then(Value::as_array) else {
        return Err(OjsError::invalid("a batch is {\"jobs\": [...]}, with 1 to 1000 jobs"));
    };
    if jobs.is_empty() || jobs.len() > MAX_BATCH {
        return Err(OjsError::invalid(format!("a batch holds 1 to {MAX_BATCH} jobs, got {}", jobs.len())));
    }
    let now = now_ms();
    let enqueues = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            envelope::enqueue(job, now).map_err(|mut e| {
                e.message = format!("jobs[{i}]: {}", e.message);
                OjsError::refused(e)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (job, enqueue) in jobs.iter().zip(&enqueues) {
        check_tenant(&call, job)?;
        ojs.check_size(&enqueue.request)?;
    }
    let requests: Vec<_> = enqueues
        .into_iter()
        .map(|mut e| {
            e.request.tenant_id.clone_from(&call.tenant);
            ojs.fit_timeout(&mut e.request);
            e
        })
        .collect();
    let enqueues = requests;
    let mut answers = Vec::with_capacity(enqueues.len());
    let mut failed = 0;
    if enqueues.iter().any(|e| e.unique.is_some() || !e.request.idempotency_key.is_empty()) {
        for enqueue in enqueues {
            answers.push(match ojs.create(&call, enqueue).await {
                Ok((_, answer)) => answer["job"].clone(),
                Err(error) => {
                    failed += 1;
                    error.body()
                }
            });
        }
    } else {
        let requests: Vec<_> = enqueues.into_iter().map(|e| e.request).collect();
        let created = ojs.api.create_many(&call, requests.clone()).await;
        for (request, created) in requests.iter().zip(created) {
            answers.push(match created.error {
                None => created_envelope(request, &created)["job"].clone(),
                Some(error) => {
                    failed += 1;
                    // Outcome unknown: a second send of a job without an id may make a second job.
                    let unknown = error.code == tonic::Code::DeadlineExceeded as i32;
                    let code = if unknown { "timeout" } else { "backend_error" };
                    json!({ "error": { "code": code, "message": error.message, "retryable": !unknown } })
                }
            });
        }
    }
    let status = if failed == 0 { StatusCode::CREATED } else { StatusCode::MULTI_STATUS };
    Ok(reply(status, json!({ "jobs": answers, "count": answers.len(), "failed": failed })))
}

pub(super) async fn info(State(ojs): State<Ojs>, call: OjsCall, Path(id): Path<String>) -> Result<Response, OjsError> {
    let job = ojs.find(&call, &id, true).await?;
    Ok(reply(StatusCode::OK, json!({ "job": envelope::job(&job) })))
}

/// `DELETE /ojs/v1/jobs/{id}`: cancels a job that is not finished; a
/// completed, cancelled or discarded one is a conflict.
pub(super) async fn cancel(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(id): Path<String>,
) -> Result<Response, OjsError> {
    let job = ojs.find(&call, &id, false).await?;
    let state = envelope::state(&job.state, job.attempt);
    if matches!(state, "completed" | "cancelled" | "discarded") {
        return Err(OjsError::conflict(format!("job {id} is {state}: a finished job cannot be cancelled")));
    }
    ojs.api.cancel(&call, pb::CancelJobRequest { key: job.key }).await?;
    let job = ojs.find(&call, &id, true).await?;
    Ok(reply(StatusCode::OK, json!({ "job": envelope::job(&job) })))
}

#[derive(serde::Deserialize, Default)]
pub(super) struct BulkQuery {
    #[serde(default)]
    confirm: bool,
    #[serde(default)]
    queue: String,
}

/// `POST /ojs/v1/admin/jobs/bulk/cancel`: cancels every unfinished job of
/// `queue` (all queues without one) the caller may cancel. It needs
/// `confirm=true`, in the query or the body.
pub(super) async fn bulk_cancel(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Query(query): Query<BulkQuery>,
    body: Bytes,
) -> Result<Response, OjsError> {
    let body = if body.is_empty() { json!({}) } else { body_json(&body)? };
    let confirm = query.confirm || body.get("confirm").and_then(Value::as_bool).unwrap_or(false);
    if !confirm {
        return Err(OjsError::invalid("a bulk cancel needs confirm=true (in the query or the body)"));
    }
    let queue = body.get("queue").and_then(Value::as_str).map_or(query.queue, str::to_string);
    let filter = pb::JobFilter { r#type: queue, tenant_id: call.scope(), ..Default::default() };
    let done = ojs.api.cancel_jobs(&call, pb::CancelJobsRequest { filter: Some(filter), ..Default::default() }).await?;
    Ok(reply(
        StatusCode::OK,
        json!({ "matched": done.matched, "cancelled": done.changed, "failed": done.failed, "errors": done.errors }),
    ))
}
