//! Rendering the engine's records on the wire: a job and its history as
//! `drover.v1` shows them, to a principal who may see some of it.

use crate::core::{EventKind, Job, JobEvent, Via};
use crate::proto::gateway as pb;

/// `job` as `principal` sees it: the worker session holding it only for a
/// principal that may manage workers (a session id is what a worker acts
/// as, so it is not handed to every reader).
pub fn job_for(principal: &crate::auth::Principal, job: &Job) -> pb::Job {
    let mut view = self::job(job);
    if !principal.has(crate::auth::WORKERS_MANAGE) {
        view.session_id = 0;
    }
    view
}

pub fn job(job: &Job) -> pb::Job {
    pb::Job {
        key: job.key.0,
        r#type: job.spec.job_type.clone(),
        tenant_id: job.spec.tenant.clone(),
        variables: String::from_utf8_lossy(&job.spec.variables).into_owned(),
        custom_headers: job.spec.custom_headers.iter().cloned().collect(),
        retries: job.retries,
        priority: job.spec.priority,
        state: job.state.as_str().into(),
        attempt: job.attempt,
        worker: job.worker.clone(),
        deadline: job.deadline,
        due_at: job.due_at,
        created_at: job.created_at,
        error_message: job.error_message.clone(),
        result: String::from_utf8_lossy(&job.result).into_owned(),
        partition_id: job.key.partition(),
        idempotency_key: job.spec.idempotency_key.clone(),
        user: job.spec.user.clone(),
        stages: job.spec.stages.clone(),
        checkpoints: job
            .checkpoints
            .iter()
            .map(|c| pb::Checkpoint { stage: c.stage.clone(), attempt: c.attempt, at: c.at })
            .collect(),
        stage: job.stage().unwrap_or_default().to_string(),
        failure_reason: if job.failed_attempt == 0 { String::new() } else { job.fail_reason.as_str().to_string() },
        attempts: job.attempt,
        session_id: job.session,
        retry_back_off: job.spec.retry_back_off_ms,
        required_labels: job.spec.routing.required.clone(),
        preferred_labels: job.spec.routing.preferred.clone(),
        expires_at: crate::core::expires_at(&job.spec).unwrap_or(0),
        history: Vec::new(),
        history_dropped: 0,
    }
}

/// A job's history as `principal` sees it: the sessions that activated it
/// only for a principal that may manage workers, as in [`job_for`].
pub fn history_for(principal: &crate::auth::Principal, job: &Job) -> Vec<pb::JobEvent> {
    let mut events = history(job);
    if !principal.has(crate::auth::WORKERS_MANAGE) {
        for event in &mut events {
            event.session_id = 0;
        }
    }
    events
}

/// A job's history as the API shows it.
pub fn history(job: &Job) -> Vec<pb::JobEvent> {
    job.history.events().map(job_event).collect()
}

fn job_event(event: &JobEvent) -> pb::JobEvent {
    let mut out = pb::JobEvent { at: event.at, kind: event.kind.name().into(), ..Default::default() };
    match &event.kind {
        EventKind::Created { user, gateway, idempotency_key } => {
            out.user.clone_from(user);
            out.gateway_node_id = *gateway;
            out.idempotency_key.clone_from(idempotency_key);
        }
        EventKind::Activated { attempt, worker, session, via } => {
            out.attempt = *attempt;
            out.worker.clone_from(worker);
            out.session_id = *session;
            match via {
                Via::Unknown => {}
                Via::Poll { gateway } => {
                    out.via = "poll".into();
                    out.gateway_node_id = *gateway;
                }
                Via::Push { gateway, stream } => {
                    out.via = "push".into();
                    out.gateway_node_id = *gateway;
                    out.stream_id = *stream;
                }
            }
        }
        EventKind::Yielded { attempt, gateway, reason } => {
            out.attempt = *attempt;
            out.gateway_node_id = *gateway;
            out.reason = reason.as_str().to_string();
        }
        EventKind::TimedOut { attempt } | EventKind::Completed { attempt } => {
            out.attempt = *attempt;
        }
        EventKind::Extended { attempt, deadline, count } => {
            out.attempt = *attempt;
            out.deadline = *deadline;
            out.count = *count;
        }
        EventKind::Failed { attempt, reason, message, retries, back_off_ms } => {
            out.attempt = *attempt;
            out.reason = reason.as_str().into();
            out.message.clone_from(message);
            out.retries = *retries;
            out.back_off = *back_off_ms;
        }
        EventKind::RetriesUpdated { retries, by } => {
            out.retries = *retries;
            out.user.clone_from(by);
        }
        EventKind::Cancelled { by } => out.user.clone_from(by),
        EventKind::FenceOverridden { attempt, by } => {
            out.attempt = *attempt;
            out.user.clone_from(by);
        }
        EventKind::Checkpointed { attempt, stage } => {
            out.attempt = *attempt;
            out.stage.clone_from(stage);
        }
        EventKind::Expired { at } => out.deadline = *at,
        EventKind::Due | EventKind::Incident => {}
    }
    out
}

/// A limit in words, for people: "10 per 1000 ms (burst 2), 4 at once;
/// each key: 1 at once".
pub fn describe(limit: &pb::QueueLimit) -> String {
    let level = |l: &Option<pb::LimitLevel>| {
        let l = l.unwrap_or_default();
        let mut parts = Vec::new();
        if l.rate > 0 {
            parts.push(format!("{} per {} ms (burst {})", l.rate, l.period_ms, l.burst));
        }
        if l.concurrency > 0 {
            parts.push(format!("{} at once", l.concurrency));
        }
        parts.join(", ")
    };
    let (queue, per_key) = (level(&limit.queue), level(&limit.per_key));
    match (queue.is_empty(), per_key.is_empty()) {
        (false, true) => queue,
        (true, false) => format!("each key: {per_key}"),
        _ => format!("{queue}; each key: {per_key}"),
    }
}

/// What a limited queue's limit holds now, in words: "home partition 2,
/// 3 held, 1 token, 5 waiting on other partitions".
pub fn describe_now(q: &pb::Queue) -> String {
    let mut text = format!("home partition {}, {} held", q.limit_home, q.limit_active);
    if q.limit_tokens >= 0 {
        text.push_str(&format!(", {} token{}", q.limit_tokens, if q.limit_tokens == 1 { "" } else { "s" }));
    }
    if q.limit_keys > 0 {
        text.push_str(&format!(", {} keys", q.limit_keys));
    }
    if q.limit_waiting_elsewhere > 0 {
        text.push_str(&format!(", {} waiting on other partitions", q.limit_waiting_elsewhere));
    }
    text
}
