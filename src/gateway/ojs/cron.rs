//! OJS's cron jobs: a registration is a Drover schedule of the request's
//! tenant ([`crate::gateway::api::schedules`]); its job template is an OJS
//! enqueue (type, args, meta, options), checked and translated as one.
//!
//! Both shapes in use are read: the conformance suite's (`expression`,
//! `job_template`) and the spec's (`cron`, with `type`, `args` and
//! `options` at the top), and answers carry both names (`cron` and
//! `cron_job`, `crons` and `cron_jobs`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::envelope::{self, Stored};
use super::time::rfc3339;
use super::{now_ms, reply, JsonBody, Ojs, OjsCall, OjsError};
use crate::proto::gateway as pb;

fn text<'a>(body: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, OjsError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(OjsError::invalid(format!("{name} must be a string, got {other}"))),
    }
}

/// A registration's body as `drover.v1` takes it.
fn registration(body: &Value, tenant: String) -> Result<pb::PutScheduleRequest, OjsError> {
    let fields = body.as_object().ok_or_else(|| OjsError::invalid("a cron job must be a JSON object"))?;
    let name = text(fields, "name")?.ok_or_else(|| OjsError::invalid("name is required"))?.to_string();
    let expression = text(fields, "expression")?
        .or(text(fields, "cron")?)
        .ok_or_else(|| OjsError::invalid("expression (or cron) is required: a cron expression such as \"0 9 * * *\""))?
        .to_string();
    // The template: `job_template`, or the job's fields at the top.
    let template = match fields.get("job_template") {
        Some(template @ Value::Object(_)) => template.clone(),
        Some(_) => return Err(OjsError::invalid("job_template must be a JSON object")),
        None => {
            let mut template = Map::new();
            for field in ["type", "args", "meta", "options"] {
                if let Some(value) = fields.get(field) {
                    template.insert(field.into(), value.clone());
                }
            }
            if !template.contains_key("args") {
                template.insert("args".into(), json!([]));
            }
            Value::Object(template)
        }
    };
    let options = template.get("options").and_then(Value::as_object);
    if template.get("id").is_some() || options.is_some_and(|o| o.contains_key("unique")) {
        return Err(OjsError::invalid("a cron job's template takes no id or unique key: each tick makes a new job"));
    }
    if options.is_some_and(|o| o.contains_key("delay_until") || o.contains_key("scheduled_at")) {
        return Err(OjsError::invalid("a cron job's template takes no delay_until: each tick's job is due at once"));
    }
    let mut job = envelope::enqueue(&template, now_ms()).map_err(OjsError::refused)?.request;
    // Each job is stamped when its tick makes it, not now.
    job.custom_headers.remove(envelope::AT);
    let enabled = match fields.get("enabled") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(enabled)) => *enabled,
        Some(other) => return Err(OjsError::invalid(format!("enabled must be true or false, got {other}"))),
    };
    Ok(pb::PutScheduleRequest {
        name,
        tenant_id: tenant,
        expression,
        timezone: text(fields, "timezone")?.unwrap_or_default().to_string(),
        job: Some(job),
        overlap: text(fields, "overlap_policy")?.unwrap_or_default().to_string(),
        misfire: text(fields, "misfire_policy")?.unwrap_or_default().to_string(),
        paused: !enabled,
        description: text(fields, "description")?.unwrap_or_default().to_string(),
    })
}

fn time_or_null(ms: i64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        json!(rfc3339(ms))
    }
}

/// A schedule as OJS shows a cron job.
fn described(s: &pb::Schedule) -> Value {
    let job = s.job.clone().unwrap_or_default();
    let stored = Stored::of(&job.r#type, &job.custom_headers);
    let mut options = stored.options();
    options.insert("queue".into(), json!(job.r#type));
    if job.priority != 0 {
        options.insert("priority".into(), json!(job.priority));
    }
    let mut template = json!({ "type": stored.kind(), "args": stored.args(&job.variables), "options": options });
    if let Some(meta) = stored.meta() {
        template["meta"] = meta;
    }
    json!({
        "name": s.name,
        "expression": s.expression,
        "cron": s.expression,
        "timezone": s.timezone,
        "type": template["type"],
        "args": template["args"],
        "options": template["options"],
        "job_template": template,
        "overlap_policy": s.overlap,
        "misfire_policy": s.misfire,
        "enabled": !s.paused,
        "status": if s.paused { "paused" } else { "active" },
        "description": s.description,
        "last_run_at": time_or_null(s.last_run_at),
        "next_run_at": if s.paused { Value::Null } else { time_or_null(s.next_run_at) },
        "run_count": s.runs,
        "skipped_count": s.skipped,
        "missed_count": s.missed,
        "last_error": if s.last_error.is_empty() { Value::Null } else { json!(s.last_error) },
        "created_at": time_or_null(s.created_at),
        "updated_at": time_or_null(s.updated_at),
    })
}

fn one(schedule: &pb::Schedule) -> Value {
    let described = described(schedule);
    json!({ "cron": described, "cron_job": described })
}

/// `POST /ojs/v1/cron`: registers a cron job, or updates the one of that
/// name (201 when new, 200 when updated).
pub(super) async fn register(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let mut request = registration(&body, call.scope())?;
    if let Some(job) = request.job.as_mut() {
        ojs.fit_timeout(job);
    }
    let put = ojs.api.put_schedule(&call, request).await?;
    let status = if put.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(reply(status, one(&put.schedule.unwrap_or_default())))
}

/// The most cron jobs one page lists.
const MAX_LIMIT: usize = 1_000;

/// `GET /ojs/v1/cron[?enabled=true|false][&limit=N&offset=M]`: the tenant's
/// cron jobs by name, a page at a time (limit 1 to 1000, 100 by default).
pub(super) async fn list(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, OjsError> {
    let enabled = match query.get("enabled").map(String::as_str) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => return Err(OjsError::invalid(format!("enabled must be true or false, got {other:?}"))),
    };
    let number = |name: &str, default: usize| match query.get(name) {
        None => Ok(default),
        Some(text) => {
            text.parse::<usize>().map_err(|_| OjsError::invalid(format!("{name} must be a whole number, got {text:?}")))
        }
    };
    let (limit, offset) = (number("limit", 100)?, number("offset", 0)?);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(OjsError::invalid(format!("limit must be from 1 to {MAX_LIMIT}, got {limit}")));
    }
    let request = pb::ListSchedulesRequest { tenant_id: call.scope() };
    let schedules = ojs.api.list_schedules(&call, request).await?;
    let matching: Vec<&pb::Schedule> =
        schedules.iter().filter(|s| enabled.is_none_or(|enabled| enabled != s.paused)).collect();
    let total = matching.len();
    let crons: Vec<Value> = matching.into_iter().skip(offset).take(limit).map(described).collect();
    let pagination =
        json!({ "total": total, "limit": limit, "offset": offset, "has_more": offset + crons.len() < total });
    let count = crons.len();
    Ok(reply(StatusCode::OK, json!({ "crons": crons, "cron_jobs": crons, "count": count, "pagination": pagination })))
}

/// `GET /ojs/v1/cron/{name}`.
pub(super) async fn get(State(ojs): State<Ojs>, call: OjsCall, Path(name): Path<String>) -> Result<Response, OjsError> {
    let request = pb::GetScheduleRequest { name, tenant_id: call.scope() };
    let schedule = ojs.api.get_schedule(&call, request).await?;
    Ok(reply(StatusCode::OK, one(&schedule)))
}

/// `DELETE /ojs/v1/cron/{name}`: the jobs it made stay.
pub(super) async fn delete(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(name): Path<String>,
) -> Result<Response, OjsError> {
    let request = pb::GetScheduleRequest { name, tenant_id: call.scope() };
    let schedule = ojs.api.delete_schedule(&call, request).await?;
    let mut answer = one(&schedule);
    answer["deleted"] = json!(true);
    answer["name"] = json!(schedule.name);
    Ok(reply(StatusCode::OK, answer))
}

/// `PATCH /ojs/v1/cron/{name}` with `{"enabled": bool}`: pauses or resumes it.
pub(super) async fn toggle(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let Some(enabled) = body.get("enabled").and_then(Value::as_bool) else {
        return Err(OjsError::invalid("a toggle is {\"enabled\": true} or {\"enabled\": false}"));
    };
    let request = pb::SetSchedulePausedRequest { name, tenant_id: call.scope(), paused: !enabled };
    let schedule = ojs.api.set_schedule_paused(&call, request).await?;
    Ok(reply(StatusCode::OK, one(&schedule)))
}
