//! A job as one replica holds it, in JSON, for the admin port's
//! `/actuator/jobs` (what the fault suite reads of every replica): its state and
//! attempt, who acted on it, its timers, failures, activations and
//! checkpoints, and the headers that tie it to a schedule or a workflow.

use serde_json::json;

pub(super) fn job_json(j: &crate::core::Job) -> serde_json::Value {
    json!({
        "key": j.key.0,
        "partition": j.key.partition(),
        "type": j.spec.job_type,
        "tenant": j.spec.tenant,
        "state": j.state.as_str(),
        "attempt": j.attempt,
        "variables": String::from_utf8_lossy(&j.spec.variables),
        "result": String::from_utf8_lossy(&j.result),
        "actors": actors(j),
        "checkpoints": j.checkpoints.iter().map(|c| json!({
            "stage": c.stage, "attempt": c.attempt, "at": c.at,
        })).collect::<Vec<_>>(),
        "timers": timer_events(j),
        "failures": failures(j),
        "expiresAt": crate::core::expires_at(&j.spec),
        "activatedAt": j.history.events().filter(|e| matches!(e.kind, crate::core::EventKind::Activated { .. }))
            .map(|e| e.at).collect::<Vec<_>>(),
        "activations": j.history.events().filter_map(|e| match &e.kind {
            crate::core::EventKind::Activated { attempt, worker, .. } => {
                Some(json!({ "attempt": attempt, "worker": worker, "at": e.at }))
            }
            _ => None,
        }).collect::<Vec<_>>(),
        "schedule": header(j, crate::core::schedule::SCHEDULE_HEADER),
        "tick": header(j, crate::core::schedule::TICK_HEADER).and_then(|t| t.parse::<i64>().ok()),
        "workflow": header(j, crate::core::workflow::WORKFLOW_HEADER),
        "step": header(j, crate::core::workflow::STEP_HEADER),
    })
}

fn header<'a>(job: &'a crate::core::Job, name: &str) -> Option<&'a str> {
    job.spec.custom_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// Who acted on a job, from its history as this replica holds it: the
/// principal that created it, each worker that activated it, each principal
/// that updated its retries, cancelled it or overrode its fence, and each
/// failure's message (a worker's own words). What the fault suite's
/// cross-tenant check reads.
fn actors(job: &crate::core::Job) -> Vec<&str> {
    use crate::core::EventKind;
    let mut actors: Vec<&str> = job
        .history
        .events()
        .filter_map(|e| match &e.kind {
            EventKind::Created { user, .. } => Some(user.as_str()),
            EventKind::Activated { worker, .. } => Some(worker.as_str()),
            EventKind::RetriesUpdated { by, .. }
            | EventKind::Cancelled { by }
            | EventKind::FenceOverridden { by, .. } => Some(by.as_str()),
            EventKind::Failed { message, .. } => Some(message.as_str()),
            _ => None,
        })
        .filter(|actor| !actor.is_empty())
        .collect();
    actors.sort_unstable();
    actors.dedup();
    actors
}

/// A job's timer events in the partition's time: when it was created, each
/// failure with its back-off, and each time it became due. What the fault
/// suite holds the timers to.
fn timer_events(job: &crate::core::Job) -> Vec<serde_json::Value> {
    use crate::core::EventKind;
    job.history
        .events()
        .filter_map(|e| match &e.kind {
            EventKind::Created { .. } => Some(json!({ "kind": "created", "at": e.at })),
            EventKind::Due => Some(json!({ "kind": "due", "at": e.at })),
            EventKind::Failed { back_off_ms, .. } => {
                Some(json!({ "kind": "failed", "at": e.at, "back_off": back_off_ms }))
            }
            _ => None,
        })
        .collect()
}

/// Each failed attempt of a job as this replica's history holds it: the
/// attempt, the reason, the retries it left and its message. What the fault
/// suite reads to tell whose failure made an incident.
fn failures(job: &crate::core::Job) -> Vec<serde_json::Value> {
    job.history
        .events()
        .filter_map(|e| match &e.kind {
            crate::core::EventKind::Failed { attempt, reason, message, retries, .. } => Some(json!({
                "attempt": attempt, "reason": reason.as_str(), "retries": retries, "message": message,
            })),
            _ => None,
        })
        .collect()
}
