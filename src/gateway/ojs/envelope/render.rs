//! A Drover job shown as an OJS envelope: read with GetJob, or handed out
//! by a fetch.

use serde_json::{json, Map, Value};

use super::super::time::rfc3339;
use super::parse::result_of;
use super::{state, Stored};
use crate::proto::gateway as pb;

/// An error as OJS shows it, from what a failure recorded: the OJS error
/// object a worker sent through this binding, or a Drover failure message.
fn error_of(message: &str, attempt: u32, at: Option<i64>) -> Value {
    let mut error = match serde_json::from_str::<Value>(message) {
        Ok(Value::Object(error)) if error.contains_key("code") => error,
        _ => {
            let mut error = Map::new();
            error.insert("code".into(), json!("handler_error"));
            error.insert("type".into(), json!("handler_error"));
            error.insert("message".into(), json!(message));
            error
        }
    };
    error.insert("attempt".into(), json!(attempt));
    if let Some(at) = at {
        error.insert("occurred_at".into(), json!(rfc3339(at)));
    }
    Value::Object(error)
}

/// A job read with GetJob (its history, when read with it, gives the
/// times and the errors).
pub fn job(job: &pb::Job) -> Value {
    let stored = Stored::of(&job.r#type, &job.custom_headers);
    let mut out = stored.base(job.key, job.created_at, &job.variables, job.priority);
    let state = state(&job.state, job.attempt);
    out.insert("state".into(), json!(state));
    out.insert("attempt".into(), json!(job.attempt));
    let max_attempts = if stored.is_ojs() { stored.policy().max_attempts } else { job.attempt as i32 + job.retries };
    out.insert("max_attempts".into(), json!(max_attempts));
    if job.state == "scheduled" {
        out.insert("scheduled_at".into(), json!(rfc3339(job.due_at)));
    }
    let mut errors = Vec::new();
    for event in &job.history {
        let at = rfc3339(event.at);
        match event.kind.as_str() {
            "activated" => {
                out.insert("started_at".into(), json!(at));
            }
            "completed" => {
                out.insert("completed_at".into(), json!(at));
            }
            "incident" => {
                out.insert("completed_at".into(), json!(at));
                out.insert("discarded_at".into(), json!(at));
            }
            "cancelled" => {
                out.insert("cancelled_at".into(), json!(at));
            }
            "expired" => {
                out.insert("discarded_at".into(), json!(at));
                out.insert("expired_at".into(), json!(at));
            }
            "failed" => errors.push(error_of(&event.message, event.attempt, Some(event.at))),
            "timed_out" => errors.push(json!({
                "code": "timeout", "type": "timeout", "attempt": event.attempt, "occurred_at": at,
                "message": format!("attempt {} was neither acknowledged nor failed before its timeout", event.attempt),
            })),
            _ => {}
        }
    }
    if !matches!(state, "completed" | "cancelled") {
        if let Some(last) = errors.last() {
            out.insert("error".into(), last.clone());
        } else if !job.error_message.is_empty() {
            out.insert("error".into(), error_of(&job.error_message, job.attempt, None));
        }
    }
    if !job.history.is_empty() || !errors.is_empty() {
        out.insert("errors".into(), Value::Array(errors));
    }
    if job.state == "completed" && !job.result.is_empty() {
        out.insert("result".into(), result_of(&job.result));
    }
    Value::Object(out)
}

/// A job a fetch activated.
pub fn activated(job: &pb::ActivatedJob, now_ms: i64) -> Value {
    let stored = Stored::of(&job.r#type, &job.custom_headers);
    let mut out = stored.base(job.key, job.created_at, &job.variables, job.priority);
    out.insert("state".into(), json!("active"));
    out.insert("attempt".into(), json!(job.attempt));
    let max_attempts = if stored.is_ojs() { stored.policy().max_attempts } else { job.attempt as i32 + job.retries };
    out.insert("max_attempts".into(), json!(max_attempts));
    out.insert("started_at".into(), json!(rfc3339(now_ms)));
    out.insert("deadline".into(), json!(rfc3339(job.deadline)));
    if stored.is_ojs() && job.attempt > 1 {
        // The wait the policy gave before this attempt, without jitter.
        out.insert("retry_delay_ms".into(), json!(stored.policy().delay_ms(job.attempt - 1)));
    }
    Value::Object(out)
}
