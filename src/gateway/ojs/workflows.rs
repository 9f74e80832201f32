//! OJS's workflows (`/ojs/v1/workflows`): a chain, group or batch is a
//! Drover workflow of the request's tenant ([`crate::gateway::api::workflows`]);
//! each of its jobs is an OJS enqueue (type, args, meta, options), checked
//! and translated as one.
//!
//! A chain's steps come as `steps`, a group's or batch's jobs as `jobs`
//! (either name is read for any kind), a batch's callbacks as `callbacks`
//! with `on_complete`, `on_success` and `on_failure`. Answers carry both
//! counts' names (`steps_total` and `jobs_total`, ...). A step's job finds
//! its predecessors' results in `parent_results`: an array in step order
//! (OJS's object keyed by index, as a list), all of a chain's earlier steps
//! for a chain step, every job's (null for one without) for a callback.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::envelope;
use super::time::rfc3339;
use super::{now_ms, reply, JsonBody, Ojs, OjsCall, OjsError};
use crate::proto::gateway as pb;

/// One job of a workflow, as `drover.v1` takes it.
fn job_of(envelope: &Value, what: &str, now: i64) -> Result<pb::CreateJobRequest, OjsError> {
    let fields = envelope.as_object().ok_or_else(|| OjsError::invalid(format!("{what} must be a JSON object")))?;
    let options = fields.get("options").and_then(Value::as_object);
    if fields.get("id").is_some() || options.is_some_and(|o| o.contains_key("unique")) {
        return Err(OjsError::invalid(format!(
            "{what}: a workflow's job takes no id or unique key: the workflow makes it once"
        )));
    }
    if options.is_some_and(|o| o.contains_key("delay_until") || o.contains_key("scheduled_at")) {
        return Err(OjsError::invalid(format!(
            "{what}: a workflow's job takes no delay: it is due when its turn comes"
        )));
    }
    let mut job = envelope::enqueue(envelope, now)
        .map_err(|invalid| {
            let refused = OjsError::refused(invalid);
            OjsError::invalid(format!("{what}: {}", refused.message()))
        })?
        .request;
    // Each job is stamped when its turn makes it, not now.
    job.custom_headers.remove(envelope::AT);
    Ok(job)
}

/// A create's body as `drover.v1` takes it.
fn creation(body: &Value, tenant: String) -> Result<pb::CreateWorkflowRequest, OjsError> {
    let fields = body.as_object().ok_or_else(|| OjsError::invalid("a workflow must be a JSON object"))?;
    let kind = match fields.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err(OjsError::invalid("type is required: chain, group or batch")),
    };
    let name = match fields.get("name") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(name)) => name.clone(),
        Some(other) => return Err(OjsError::invalid(format!("name must be a string, got {other}"))),
    };
    let listed = fields.get("steps").or_else(|| fields.get("jobs"));
    let Some(Value::Array(listed)) = listed else {
        return Err(OjsError::invalid(
            "steps (a chain's) or jobs (a group's or batch's) is required: an array of jobs",
        ));
    };
    let now = now_ms();
    let steps =
        listed.iter().enumerate().map(|(i, job)| job_of(job, &format!("steps[{i}]"), now)).collect::<Result<_, _>>()?;
    let mut request = pb::CreateWorkflowRequest { kind, name, tenant_id: tenant, steps, ..Default::default() };
    match fields.get("callbacks") {
        None | Some(Value::Null) => {}
        Some(Value::Object(callbacks)) => {
            for (when, job) in callbacks {
                let job = Some(job_of(job, &format!("callbacks.{when}"), now)?);
                match when.as_str() {
                    "on_complete" => request.on_complete = job,
                    "on_success" => request.on_success = job,
                    "on_failure" => request.on_failure = job,
                    other => {
                        return Err(OjsError::invalid(format!(
                            "callbacks.{other} is not a callback: give on_complete, on_success or on_failure"
                        )))
                    }
                }
            }
        }
        Some(_) => return Err(OjsError::invalid("callbacks must be a JSON object")),
    }
    Ok(request)
}

fn time_or_null(ms: i64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        json!(rfc3339(ms))
    }
}

/// OJS's state of a step.
fn step_state(state: &str) -> &str {
    match state {
        "created" => "pending",
        other => other,
    }
}

fn step_view(step: &pb::WorkflowStep, index: Option<usize>) -> Value {
    let mut out = Map::new();
    match index {
        Some(i) => out.insert("index".into(), json!(i)),
        None => out.insert("callback".into(), json!(step.name)),
    };
    out.insert("type".into(), json!(step.r#type));
    out.insert("state".into(), json!(step_state(&step.state)));
    let job_id = match step.job_key {
        0 => Value::Null,
        key => json!(super::ids::job_id(crate::core::JobKey(key), step.created_at)),
    };
    out.insert("job_id".into(), job_id);
    if !step.result.is_empty() {
        let result = serde_json::from_str::<Value>(&step.result).unwrap_or_else(|_| json!(step.result));
        out.insert("result".into(), result);
    }
    if !step.error.is_empty() {
        out.insert("error".into(), json!({ "message": step.error }));
    }
    if step.ended_at != 0 {
        out.insert("completed_at".into(), json!(rfc3339(step.ended_at)));
    }
    Value::Object(out)
}

/// A workflow as OJS shows it.
fn described(w: &pb::Workflow) -> Value {
    let steps: Vec<Value> = w.steps.iter().enumerate().map(|(i, s)| step_view(s, Some(i))).collect();
    let callbacks: Vec<Value> = w.callbacks.iter().map(|s| step_view(s, None)).collect();
    let total = w.steps.len();
    let failed_step = w.steps.iter().position(|s| s.state == "failed");
    let failed_jobs: Vec<Value> = w
        .steps
        .iter()
        .chain(&w.callbacks)
        .filter(|s| s.state == "failed" && s.job_key != 0)
        .map(|s| json!(super::ids::job_id(crate::core::JobKey(s.job_key), s.created_at)))
        .collect();
    let mut out = json!({
        "id": w.id,
        "type": w.kind,
        "name": w.name,
        "state": w.state,
        "steps": steps,
        "jobs": steps,
        "callbacks": callbacks,
        "steps_total": total,
        "jobs_total": total,
        "steps_completed": w.steps_completed,
        "jobs_completed": w.steps_completed,
        "steps_failed": w.steps_failed,
        "jobs_failed": w.steps_failed,
        "created_at": rfc3339(w.created_at),
        "completed_at": time_or_null(w.ended_at),
        "metadata": {
            "created_at": rfc3339(w.created_at),
            "completed_at": time_or_null(w.ended_at),
            "job_count": total,
            "completed_count": w.steps_completed,
            "failed_count": w.steps_failed,
        },
        "drover": { "partition": w.partition_id },
    });
    if !failed_jobs.is_empty() {
        out["failed_job_ids"] = json!(failed_jobs);
    }
    if let (Some(i), "chain") = (failed_step, w.kind.as_str()) {
        out["failed_step_index"] = json!(i);
    }
    if w.state == "cancelled" {
        out["metadata"]["cancelled_at"] = time_or_null(w.ended_at);
    }
    out
}

/// `POST /ojs/v1/workflows`: creates and starts a workflow (201).
pub(super) async fn create(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let mut request = creation(&body, call.scope())?;
    let callbacks = [&mut request.on_complete, &mut request.on_success, &mut request.on_failure];
    for job in request.steps.iter_mut().chain(callbacks.into_iter().flatten()) {
        ojs.fit_timeout(job);
    }
    let workflow = ojs.api.create_workflow(&call, request).await?;
    Ok(reply(StatusCode::CREATED, json!({ "workflow": described(&workflow) })))
}

/// `GET /ojs/v1/workflows/{id}`.
pub(super) async fn get(State(ojs): State<Ojs>, call: OjsCall, Path(id): Path<String>) -> Result<Response, OjsError> {
    let request = pb::GetWorkflowRequest { id, tenant_id: call.scope() };
    let workflow = ojs.api.get_workflow(&call, request).await?;
    Ok(reply(StatusCode::OK, json!({ "workflow": described(&workflow) })))
}

/// `DELETE /ojs/v1/workflows/{id}`: cancels it (409 when it already ended).
pub(super) async fn cancel(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(id): Path<String>,
) -> Result<Response, OjsError> {
    let request = pb::GetWorkflowRequest { id, tenant_id: call.scope() };
    let workflow = ojs.api.cancel_workflow(&call, request).await?;
    Ok(reply(StatusCode::OK, json!({ "workflow": described(&workflow) })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_and_a_batch_become_workflow_creates() {
        let chain = json!({"type": "chain", "name": "c", "steps": [
            {"type": "a.b", "args": [1], "options": {"queue": "q1"}},
            {"type": "c.d", "args": [], "options": {"queue": "q1", "retry": {"max_attempts": 1}}},
        ]});
        let request = creation(&chain, "t".into()).unwrap();
        assert_eq!((request.kind.as_str(), request.steps.len()), ("chain", 2));
        assert_eq!(request.steps[0].r#type, "q1");
        assert!(!request.steps[0].custom_headers.contains_key(envelope::AT), "stamped when made");
        let batch = json!({"type": "batch", "jobs": [{"type": "a", "args": []}],
            "callbacks": {"on_failure": {"type": "cb", "args": [{"x": 1}]}}});
        let request = creation(&batch, "t".into()).unwrap();
        assert!(request.on_failure.is_some() && request.on_success.is_none());
    }

    #[test]
    fn bad_workflows_are_refused_with_a_reason() {
        let cases = [
            (json!({"steps": []}), "type is required"),
            (json!({"type": "chain"}), "steps"),
            (json!({"type": "chain", "steps": [{"type": "a", "args": [], "id": "x"}]}), "no id"),
            (json!({"type": "batch", "jobs": [], "callbacks": {"on_done": {"type": "a", "args": []}}}), "on_done"),
            (json!({"type": "chain", "steps": [{"type": "a"}]}), "steps[0]"),
        ];
        for (body, needle) in cases {
            let error = creation(&body, "t".into()).expect_err("refused");
            assert!(error.message().contains(needle), "{body}: {}", error.message());
        }
    }
}
