//! OJS's worker endpoints: fetch (jobs from several queues, in the order
//! given), ack, nack (with the job's retry policy) and heartbeat.
//!
//! An ack or nack names a job by id. A request that names the activation
//! (`attempt`, which a fetch answers, or else `worker_id`) is refused when
//! the job's activation is another one: a stale worker's outcome never
//! lands on the next worker's activation; one that names neither is refused
//! once an earlier activation lapsed. An ack of a job this binding named is
//! one write from data version 20: the partition checks the id and the
//! activation at apply ([`crate::core::Guard`]). Otherwise, and on any
//! refusal, the gateway reads the job and acts on the activation it finds,
//! fenced by its attempt (an id a client chose could pass the check of a
//! server-made one by chance and name another job's key; the read tells).
//! A repeated ack (a retry after a lost answer, naming its attempt and
//! result) is answered OK, as Drover answers a repeated completion. A nack
//! still reads the job first: its answer tells the job's policy.
//!
//! A job's own timeout (`options.timeout_ms` or `visibility_timeout_ms`)
//! is its activation timeout at its partition from data version 19; a fetch
//! moves the deadline itself, with one more write, only for a job made
//! without it (before the upgrade, or while a member ran an older build).
//!
//! A fetch or heartbeat that names a `worker_id` acts as that worker's
//! Drover session (one per principal, tenant and worker id, registered on
//! first use): the worker is listed with `drover.v1`'s and Zeebe's, an
//! operator's quiet or terminate reaches it in its heartbeat's `state`, and
//! a quiet or terminated worker's fetches get nothing.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::envelope::{self, Stored};
use super::time::rfc3339;
use super::{ids, now_ms, reply, JsonBody, Ojs, OjsCall, OjsError};
use crate::auth::Verb;
use crate::core::retry::{RetryPolicy as EnginePolicy, RETRY_POLICY_HEADER};
use crate::core::{Guard, Identity, ACTIVATION_TIMEOUT_HEADER};
use crate::gateway::api::{ApiError, MAX_JOB_TYPES};
use crate::proto::gateway as pb;

/// How long an activation lasts when neither the fetch nor the job names a
/// timeout: OJS's default visibility timeout, 30 minutes (the worker
/// protocol's). A worker that dies sooner is noticed by its session.
const DEFAULT_VISIBILITY_MS: i64 = 1_800_000;
/// The worker a fetch that names no `worker_id` activates for; a beat
/// cannot tell such a worker from another.
const ANONYMOUS_WORKER: &str = "ojs-worker";
/// The longest a fetch may wait for a job.
const MAX_WAIT_MS: i64 = 30_000;
/// The most jobs one heartbeat extends (each is a read and a write).
const MAX_BEAT_JOBS: usize = 1000;
/// An OJS worker's session lease: OJS workers need not beat, so the
/// longest a session may go without one (its jobs are held by their own
/// visibility timeouts meanwhile). A gateway renews the session of a worker
/// that fetches or beats through it every [`SESSION_RENEWAL`].
const SESSION_BEAT_MS: i64 = crate::gateway::api::MAX_DEAD_AFTER_MS / 2;
const SESSION_RENEWAL: std::time::Duration = std::time::Duration::from_secs(600);

/// The Drover session of OJS worker `worker` acting through `call`: one
/// per (principal, tenant, worker id), derived (FNV-1a) so that every
/// gateway names the same one without asking another.
fn session_of(call: &OjsCall, worker: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let parts: [&[u8]; 5] = [call.principal.name.as_bytes(), &[0], call.tenant.as_bytes(), &[0], worker.as_bytes()];
    for byte in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash.max(1)
}

/// OJS worker `worker`'s session, registered (serving `queues`) unless
/// this gateway did so lately; a repeat registration renews its lease.
async fn session(ojs: &Ojs, call: &OjsCall, worker: &str, queues: &[String]) -> Result<u64, OjsError> {
    let session = session_of(call, worker);
    let renewed = ojs.sessions.lock().expect("OJS sessions").get(&session).copied();
    if renewed.is_some_and(|at| at.elapsed() < SESSION_RENEWAL) {
        return Ok(session);
    }
    let request = pb::RegisterWorkerRequest {
        worker_id: worker.to_string(),
        hostname: "ojs".into(),
        job_types: queues.to_vec(),
        tenant_ids: if call.tenant.is_empty() { Vec::new() } else { vec![call.tenant.clone()] },
        heartbeat_interval: SESSION_BEAT_MS,
        dead_after: 2 * SESSION_BEAT_MS,
        ..Default::default()
    };
    ojs.api.register_worker_as(call, request, session).await?;
    let mut sessions = ojs.sessions.lock().expect("OJS sessions");
    if sessions.len() >= 100_000 {
        sessions.clear();
    }
    sessions.insert(session, std::time::Instant::now());
    Ok(session)
}

/// An activation's or beat's answer, unless it says the worker's session is
/// over (an operator ended it, or it went an hour without a fetch or beat
/// through any gateway): the session is forgotten, so the worker's next
/// request registers it again, and this one is answered as retryable.
fn unless_ended<T>(ojs: &Ojs, session: u64, answer: Result<T, ApiError>) -> Result<T, OjsError> {
    match answer {
        Err(ApiError::NotFound(message)) if message.contains("no worker session") => {
            ojs.sessions.lock().expect("OJS sessions").remove(&session);
            Err(ApiError::Unavailable(format!("{message}; this worker's next request registers it again: retry"))
                .into())
        }
        answer => Ok(answer?),
    }
}

fn strings(body: &Value, field: &str) -> Result<Vec<String>, OjsError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str().map(str::to_string).ok_or_else(|| OjsError::invalid(format!("{field} must hold strings")))
            })
            .collect(),
        Some(_) => Err(OjsError::invalid(format!("{field} must be an array of strings"))),
    }
}

fn positive(body: &Value, field: &str, default: i64, max: i64) -> Result<i64, OjsError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_i64() {
            Some(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(OjsError::invalid(format!("{field} must be a whole number from 1 to {max}, got {v}"))),
        },
    }
}

fn job_id(body: &Value) -> Result<String, OjsError> {
    body.get("job_id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| OjsError::invalid("job_id is required"))
}

/// `POST /ojs/v1/workers/fetch`: `{queues, count?, worker_id?,
/// visibility_timeout_ms?, wait_ms?}`. Queues are tried in the order given
/// until `count` jobs are held; with `wait_ms`, a fetch that found none
/// waits that long on the first queue.
pub(super) async fn fetch(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let queues = strings(&body, "queues")?;
    if queues.is_empty() {
        return Err(OjsError::invalid("queues is required: the queues to fetch from, in order"));
    }
    if queues.len() > MAX_JOB_TYPES {
        return Err(OjsError::invalid(format!(
            "queues names {} queues; a fetch takes from at most {MAX_JOB_TYPES}: fetch from the rest in another request",
            queues.len()
        )));
    }
    if let Some(bad) = queues.iter().find(|q| !envelope::is_queue(q)) {
        return Err(OjsError::invalid(format!("queue {bad:?} is not a queue name")));
    }
    let limit = ojs.ctx.settings.limits.max_jobs_to_activate as i64;
    let count = positive(&body, "count", 1, limit)?;
    let visibility = positive(&body, "visibility_timeout_ms", DEFAULT_VISIBILITY_MS, i64::from(i32::MAX))?;
    let wait = match body.get("wait_ms") {
        None | Some(Value::Null) => 0,
        Some(v) if v.as_i64() == Some(0) => 0,
        Some(_) => positive(&body, "wait_ms", 0, MAX_WAIT_MS)?,
    };
    let named = body.get("worker_id").and_then(Value::as_str).filter(|w| !w.is_empty());
    let worker = named.unwrap_or(ANONYMOUS_WORKER).to_string();
    let session = match named {
        Some(worker) => session(&ojs, &call, worker, &queues).await?,
        None => 0,
    };
    // The whole fetch has one request timeout (plus its wait): queues not
    // reached by then are not tried, and the jobs already held are answered.
    let deadline = std::time::Instant::now() + ojs.ctx.settings.request_timeout;
    let mut jobs = Vec::new();
    for (i, queue) in queues.iter().enumerate() {
        let remaining = count - jobs.len() as i64;
        if remaining == 0 || (i > 0 && std::time::Instant::now() >= deadline) {
            break;
        }
        let last = i + 1 == queues.len();
        let request = pb::ActivateJobsRequest {
            r#type: queue.clone(),
            worker: worker.clone(),
            timeout: visibility,
            max_jobs_to_activate: remaining as i32,
            request_timeout: if last && jobs.is_empty() && queues.len() == 1 { wait } else { 0 },
            tenant_ids: if call.tenant.is_empty() { Vec::new() } else { vec![call.tenant.clone()] },
            session_id: session,
            ..Default::default()
        };
        jobs.extend(unless_ended(&ojs, session, ojs.api.activate(&call, request).await)?);
    }
    let now = now_ms();
    let mut shown = Vec::with_capacity(jobs.len());
    for mut job in jobs {
        // A job that names its own timeout holds its activation that long:
        // its partition gave it that deadline when the job carries the
        // timeout as its own (data version 19); one made before, or while
        // a member could not take it, is moved here.
        let own = job.custom_headers.contains_key(ACTIVATION_TIMEOUT_HEADER);
        let named = Stored::of(&job.r#type, &job.custom_headers).timeout_ms().filter(|t| *t != visibility && !own);
        if let Some(timeout) = named {
            let request =
                pb::UpdateJobTimeoutRequest { key: job.key, timeout, attempt: job.attempt, ..Default::default() };
            if let Ok(updated) = ojs.api.update_timeout(&call, request).await {
                job.deadline = updated.deadline;
            }
        }
        shown.push(envelope::activated(&job, now));
    }
    let first = shown.first().cloned().unwrap_or(Value::Null);
    Ok(reply(StatusCode::OK, json!({ "jobs": shown, "job": first })))
}

/// The job an ack or nack names, which must be active, and active under the
/// activation the request names: its `attempt` when it gives one (an
/// extension: what the fetch answered), else its `worker_id` when it gives
/// one. A request with neither acts on the job's activation only while no
/// earlier one lapsed (see [`lapsed_before`]).
async fn active(ojs: &Ojs, call: &OjsCall, body: &Value, verb: &str) -> Result<(String, pb::Job), OjsError> {
    let id = job_id(body)?;
    let job = ojs.find_for(call, &id, !names_activation(body), Verb::Work).await?;
    held(id, job, body, verb)
}

/// Whether `body` names the activation it acts for (`attempt` or `worker_id`).
fn names_activation(body: &Value) -> bool {
    body.get("attempt").is_some() || body.get("worker_id").and_then(Value::as_str).is_some()
}

/// An earlier activation of `job` (read with its history) that ended
/// without its worker's word: it timed out, or its worker's session died or
/// ended. That worker may still be at work, and may not know it; an outcome
/// that does not say which activation it is for may be its. A history that
/// dropped its oldest events is taken to hold such a one.
fn lapsed_before(job: &pb::Job) -> Option<String> {
    let lapse = job.history.iter().find(|e| {
        e.attempt < job.attempt
            && (e.kind == "timed_out"
                || e.kind == "failed" && matches!(e.reason.as_str(), "worker-died" | "session-ended"))
    });
    match lapse {
        Some(e) if e.kind == "timed_out" => Some(format!("attempt {} timed out", e.attempt)),
        Some(e) => Some(format!("attempt {} ended as {}", e.attempt, e.reason)),
        None if job.history_dropped > 0 && job.attempt > 1 => Some("its early history is no longer kept".into()),
        None => None,
    }
}

/// `job` (OJS id `id`), if the activation `body` names still holds it.
fn held(id: String, job: pb::Job, body: &Value, verb: &str) -> Result<(String, pb::Job), OjsError> {
    if job.state != "activated" {
        let state = envelope::state(&job.state, job.attempt);
        return Err(OjsError::conflict(format!("job {id} is {state}: only an active job can be {verb}")));
    }
    match (body.get("attempt"), body.get("worker_id").and_then(Value::as_str)) {
        (Some(attempt), _) if attempt.as_u64() != Some(u64::from(job.attempt)) => Err(OjsError::conflict(format!(
            "job {id} is at attempt {}, not {attempt}: that activation is over and its outcome is refused",
            job.attempt
        ))),
        (None, Some(worker)) if worker != job.worker => Err(OjsError::conflict(format!(
            "job {id} is held by worker {:?} now, not {worker:?}: that activation is over and its outcome is refused",
            job.worker
        ))),
        (None, None) => match lapsed_before(&job) {
            Some(lapse) => Err(OjsError::conflict(format!(
                "job {id} is at attempt {} after an earlier activation lapsed ({lapse}); an outcome that names \
                 neither attempt nor worker_id may be that worker's, so it is refused: send the attempt the fetch \
                 answered, or the worker_id that fetched it",
                job.attempt
            ))),
            None => Ok((id, job)),
        },
        _ => Ok((id, job)),
    }
}

/// An outcome the partition refused because the activation moved on.
fn moved_on(id: &str, error: ApiError) -> OjsError {
    match error {
        ApiError::FailedPrecondition(message) => {
            OjsError::conflict(format!("job {id} is no longer held by this activation: {message}"))
        }
        other => other.into(),
    }
}

/// `POST /ojs/v1/workers/ack`: `{job_id, result?, attempt?, worker_id?}`.
pub(super) async fn ack(State(ojs): State<Ojs>, call: OjsCall, JsonBody(body): JsonBody) -> Result<Response, OjsError> {
    let variables = envelope::result_variables(body.get("result"));
    let acked = |id: &str, attempt: u32| {
        reply(
            StatusCode::OK,
            json!({
                "acknowledged": true, "id": id, "job_id": id, "state": "completed", "attempt": attempt,
                "completed_at": rfc3339(now_ms()),
            }),
        )
    };
    let id = job_id(&body)?;
    if let Some(attempt) = guarded_ack(&ojs, &call, &id, &body, &variables).await? {
        return Ok(acked(&id, attempt));
    }
    // Read first, and the id compared: an id a client chose passes the
    // check of a server-made one by chance one time in 1024, and would then
    // name another job's key.
    let job = ojs.find_for(&call, &id, !names_activation(&body), Verb::Work).await?;
    // The same ack again (its answer was lost): the job completed by the
    // attempt it names, with its result.
    let named = body.get("attempt").and_then(Value::as_u64);
    let object = |text: &str| if text.is_empty() { "{}".to_string() } else { text.to_string() };
    let same_result = object(&job.result) == object(&variables);
    if job.state == "completed" && named == Some(u64::from(job.attempt)) && same_result {
        return Ok(acked(&id, job.attempt));
    }
    let (id, job) = held(id, job, &body, "acknowledged")?;
    let request = pb::CompleteJobRequest { key: job.key, variables, attempt: job.attempt, ..Default::default() };
    ojs.api.complete(&call, request).await.map_err(|e| moved_on(&id, e))?;
    Ok(acked(&id, job.attempt))
}

/// An ack in one write, for a job this binding named: its partition checks
/// at apply what [`held`] checks of a read (that the id is the job's, and
/// the activation the request names, or that none lapsed), and answers the
/// attempt it completed. `None` when the job must be read to answer: a
/// client's id, a cluster below data version 20, or a refusal (the read
/// tells a repeat from an id that is not the job's, and says why the
/// activation is over).
async fn guarded_ack(
    ojs: &Ojs,
    call: &OjsCall,
    id: &str,
    body: &Value,
    variables: &str,
) -> Result<Option<u32>, OjsError> {
    let Some((key, at)) = ids::stamped_key_of(id).filter(|_| ojs.api.takes_guarded_outcomes()) else {
        return Ok(None);
    };
    let attempt = match body.get("attempt").map(|a| a.as_u64().and_then(|a| u32::try_from(a).ok())) {
        None => 0,
        Some(Some(attempt)) if attempt != 0 => attempt,
        Some(_) => return Ok(None),
    };
    let worker = match body.get("worker_id").and_then(Value::as_str) {
        _ if attempt != 0 => String::new(),
        Some("") => return Ok(None),
        worker => worker.unwrap_or_default().to_string(),
    };
    let identity = Identity::Stamped { chosen: envelope::ID.into(), stamp: envelope::AT.into(), at };
    let guard = Guard { identity: Some(identity), no_lapse: attempt == 0 && worker.is_empty(), worker };
    match ojs.api.complete_guarded(call, key.0, attempt, variables.to_string(), guard).await {
        Ok(attempt) => Ok(Some(attempt)),
        // Answered from a read, as before guards: a job token, say, may
        // read and complete its own activation, but not one it does not name.
        Err(
            ApiError::NotFound(_)
            | ApiError::FailedPrecondition(_)
            | ApiError::Finished(_)
            | ApiError::PermissionDenied(_),
        ) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// `POST /ojs/v1/workers/nack`: `{job_id, error?, requeue?, attempt?,
/// worker_id?}`. With
/// `requeue`, the job is available again at once and the attempt does not
/// count as a failure; otherwise the job's retry policy decides: discarded
/// when no attempt is left or the error is not retryable (`retryable:
/// false`, or its type among `non_retryable_errors`), else retryable after
/// the policy's back-off.
pub(super) async fn nack(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let error = match body.get("error") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(error)) => error.clone(),
        Some(_) => return Err(OjsError::invalid("error must be an object: {code, message, retryable?, details?}")),
    };
    let requeue = body.get("requeue").and_then(Value::as_bool).unwrap_or(false);
    let (id, job) = active(&ojs, &call, &body, "failed").await?;
    let policy = Stored::of(&job.r#type, &job.custom_headers).policy();
    let (message, kind) = envelope::error_message(&error);
    let not_retryable = error.get("retryable").and_then(Value::as_bool) == Some(false);
    let mut request =
        pb::FailJobRequest { key: job.key, attempt: job.attempt, error_message: message, ..Default::default() };
    if requeue {
        request.retries = job.retries;
        request.reason = "worker-shutdown".into();
    } else if policy.engine != EnginePolicy::default() && !job.custom_headers.contains_key(RETRY_POLICY_HEADER) {
        // Enqueued before the partition kept its policy: decided here, by
        // the engine's rule, and sent as any worker's failure.
        (request.retries, request.retry_back_off) =
            policy.engine.decide(job.retries, job.attempt, &kind, !not_retryable, rand::random());
    } else {
        request.by_policy = true;
        // OJS bounds no error type; past the job API's 255 bytes the
        // policy's patterns (themselves at most 255) see its start.
        request.error_type = truncated(kind, crate::gateway::api::retry::MAX_ERROR_TYPE_LEN);
        request.not_retryable = not_retryable;
    }
    let (by_policy, retries, back_off) = (request.by_policy, request.retries, request.retry_back_off);
    let decided = ojs.api.fail(&call, request).await.map_err(|e| moved_on(&id, e))?;
    let (retries, back_off) = if by_policy { (decided.retries, decided.retry_back_off) } else { (retries, back_off) };
    let now = now_ms();
    let mut answer = json!({ "id": id, "job_id": id, "attempt": job.attempt, "max_attempts": policy.max_attempts });
    let state = if requeue {
        "available"
    } else if retries == 0 {
        answer["discarded_at"] = json!(rfc3339(now));
        answer["completed_at"] = json!(rfc3339(now));
        "discarded"
    } else {
        answer["retry_delay_ms"] = json!(back_off);
        answer["next_attempt_at"] = json!(rfc3339(now + back_off));
        if back_off > 0 {
            "retryable"
        } else {
            "available"
        }
    };
    answer["state"] = json!(state);
    Ok(reply(StatusCode::OK, answer))
}

/// `POST /ojs/v1/workers/heartbeat`: `{worker_id, active_jobs: [id]}`.
/// Each listed job still active (held by `worker_id`, when the beat names
/// one) has its deadline moved to now + its timeout; the others are
/// answered as revoked, so the worker stops them.
pub(super) async fn heartbeat(
    State(ojs): State<Ojs>,
    call: OjsCall,
    JsonBody(body): JsonBody,
) -> Result<Response, OjsError> {
    let mut ids = strings(&body, "active_jobs")?;
    ids.extend(strings(&body, "active_job_ids")?);
    if ids.len() > MAX_BEAT_JOBS {
        return Err(OjsError::invalid(format!(
            "a heartbeat lists at most {MAX_BEAT_JOBS} jobs, got {}; beat for them in several requests",
            ids.len()
        )));
    }
    let worker = body.get("worker_id").and_then(Value::as_str).filter(|w| !w.is_empty());
    let (mut extended, mut revoked) = (Vec::new(), Vec::new());
    let mut directed: Option<&str> = None;
    for id in ids {
        let job = match ojs.find_for(&call, &id, false, Verb::Work).await {
            // Another worker holds it now (this one's activation lapsed): it
            // is this worker's to stop, and the holder's deadline stays.
            Ok(job) if job.worker != ANONYMOUS_WORKER && worker.is_some_and(|w| w != job.worker) => {
                revoked.push(id);
                continue;
            }
            Ok(job) if job.state == "activated" => job,
            Ok(_) | Err(OjsError { code: "not_found", .. }) => {
                revoked.push(id);
                continue;
            }
            Err(error) => return Err(error),
        };
        if ojs.ctx.settings.ojs_test_directives {
            directed = directed.max(test_directive(&job));
        }
        let timeout = Stored::of(&job.r#type, &job.custom_headers).timeout_ms().unwrap_or(DEFAULT_VISIBILITY_MS);
        let request = pb::UpdateJobTimeoutRequest { key: job.key, timeout, attempt: job.attempt, ..Default::default() };
        match ojs.api.update_timeout(&call, request).await {
            Ok(_) => extended.push(id),
            Err(ApiError::FailedPrecondition(_) | ApiError::NotFound(_)) => revoked.push(id),
            Err(error) => return Err(error.into()),
        }
    }
    let state = match worker {
        Some(worker) => beat(&ojs, &call, worker).await?,
        None => "running".to_string(),
    };
    // Only with --ojs-test-directives, for the conformance suite: the
    // answer, not the session, takes the directive.
    let state = match directed {
        Some(directive) if state == "running" || directive == "terminate" => directive.to_string(),
        _ => state,
    };
    Ok(reply(
        StatusCode::OK,
        json!({ "state": state, "server_time": rfc3339(now_ms()), "jobs_extended": extended, "revoked": revoked }),
    ))
}

/// Beats OJS worker `worker`'s session (registering it first if need be);
/// the state an operator directs it to: running, quiet or terminate.
async fn beat(ojs: &Ojs, call: &OjsCall, worker: &str) -> Result<String, OjsError> {
    let session = session(ojs, call, worker, &[]).await?;
    let request = pb::HeartbeatRequest { session_id: session, ..Default::default() };
    Ok(unless_ended(ojs, session, ojs.api.heartbeat(call, request).await)?.state)
}

/// The conformance suite's directive a job carries in
/// `options.metadata.test_directive` (`quiet` or `terminate`; `terminate`
/// orders after `quiet`, so the stronger wins).
fn test_directive(job: &pb::Job) -> Option<&'static str> {
    let options = Stored::of(&job.r#type, &job.custom_headers).options();
    match options.get("metadata").and_then(|m| m.get("test_directive")).and_then(Value::as_str) {
        Some("quiet") => Some("quiet"),
        Some("terminate") => Some("terminate"),
        _ => None,
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncated(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_type_is_cut_on_a_character_boundary() {
        assert_eq!(super::truncated("Timeout".into(), 255), "Timeout");
        let long = "é".repeat(200); // 400 bytes
        let cut = super::truncated(long, 255);
        assert_eq!((cut.len(), cut.chars().count()), (254, 127));
    }
}
