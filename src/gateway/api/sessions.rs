//! Worker sessions and job schemas at the gateway.
//!
//! Every partition keeps its own lease of every session (see
//! [`crate::core::Session`] for why), so registrations, heartbeats,
//! directions and ends go to every partition at once and the answers are
//! merged here: a heartbeat's directed state is the strongest any partition
//! holds and its revoked jobs are all of theirs. A session that some
//! partitions no longer know (its lease lapsed there alone, or a
//! registration never reached them) while others beat it is registered
//! again where it was missing, as the principal that beats it, and the jobs
//! the worker held there are revoked: one partition's fault costs the
//! worker that partition's jobs, never its session. Nothing here ends a
//! session as the broker: an end always carries the principal that asked.
//! Schemas go to every partition too, so each one's leader checks its own
//! creates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::validate;
use super::ApiError;
use crate::auth::Principal;
use crate::context::NodeContext;
use crate::core::{
    Command, CommandResult, JobKey, PartitionId, Schema, Session, SessionId, SessionInfo, SessionTarget, WorkerState,
    OWNED_SESSIONS,
};
use crate::leaders;
use crate::leaders::fanout::{everywhere, everywhere_as};
use crate::proto::gateway as pb;

/// How often a worker beats unless it asks otherwise.
pub const DEFAULT_HEARTBEAT_MS: i64 = 5_000;
/// How long without a beat before a worker is dead, unless it asks otherwise.
pub const DEFAULT_DEAD_AFTER_MS: i64 = 30_000;
const MIN_HEARTBEAT_MS: i64 = 100;
pub const MAX_DEAD_AFTER_MS: i64 = 3_600_000;
/// The most job types one worker session serves (and one OJS fetch names).
pub const MAX_JOB_TYPES: usize = 100;
const MAX_LABELS: usize = validate::MAX_WORKER_LABELS;
const MAX_NAME_LEN: usize = 255;

/// Ends a session everywhere as `principal` without waiting: after a failed
/// registration of a new session, or a heartbeat no partition answered
/// but to say the session is over. As the principal, so the owner check at
/// apply holds (an end can never reach another principal's session).
fn end_in_background(ctx: &Arc<NodeContext>, principal: &Arc<Principal>, session: SessionId) {
    let ctx = Arc::clone(ctx);
    let principal = Arc::clone(principal);
    tokio::spawn(async move {
        let deadline = Instant::now() + ctx.settings.request_timeout;
        let end = |_| Command::EndSession { session };
        for result in everywhere_as(&ctx, Some(&principal), end, deadline).await {
            if let Err(error) = result {
                tracing::debug!(session = %format!("{session:x}"), "ending the session failed: {error}");
            }
        }
    });
}

/// Registers a session under `id` (a new random one when `None`; a repeat
/// of a known id renews its lease).
pub async fn register(
    ctx: &Arc<NodeContext>,
    principal: &Arc<Principal>,
    request: pb::RegisterWorkerRequest,
    id: Option<SessionId>,
    deadline: Instant,
) -> Result<pb::RegisterWorkerResponse, ApiError> {
    if request.worker_id.is_empty() {
        return Err(ApiError::InvalidArgument("worker_id is required: the worker's name".into()));
    }
    validate::name("worker_id", &request.worker_id, MAX_NAME_LEN)?;
    validate::name("hostname", &request.hostname, MAX_NAME_LEN)?;
    if request.job_types.len() > MAX_JOB_TYPES {
        return Err(ApiError::InvalidArgument(format!(
            "job_types names {} types; a worker may serve at most {MAX_JOB_TYPES}",
            request.job_types.len()
        )));
    }
    for job_type in &request.job_types {
        validate::job_type(job_type)?;
    }
    let heartbeat_ms = match request.heartbeat_interval {
        0 => DEFAULT_HEARTBEAT_MS,
        ms if (MIN_HEARTBEAT_MS..=MAX_DEAD_AFTER_MS / 2).contains(&ms) => ms,
        ms => {
            return Err(ApiError::InvalidArgument(format!(
                "heartbeat_interval must be between {MIN_HEARTBEAT_MS} and {} ms (0 for {DEFAULT_HEARTBEAT_MS}), \
                 got {ms}",
                MAX_DEAD_AFTER_MS / 2
            )))
        }
    };
    let dead_after_ms = match request.dead_after {
        0 => DEFAULT_DEAD_AFTER_MS.max(2 * heartbeat_ms),
        ms if (2 * heartbeat_ms..=MAX_DEAD_AFTER_MS).contains(&ms) => ms,
        ms => {
            return Err(ApiError::InvalidArgument(format!(
                "dead_after must be at least twice the heartbeat interval ({} ms) and at most {MAX_DEAD_AFTER_MS} \
                 ms (0 for {DEFAULT_DEAD_AFTER_MS}), got {ms}: one late beat must not kill a worker",
                2 * heartbeat_ms
            )))
        }
    };
    let given = id.filter(|id| *id != 0);
    let id = given.unwrap_or_else(|| loop {
        let id: u64 = rand::random();
        if id != 0 {
            break id;
        }
    });
    let info = Arc::new(SessionInfo {
        id,
        worker: request.worker_id,
        hostname: request.hostname,
        pid: request.pid,
        job_types: request.job_types,
        concurrency: request.concurrency,
        labels: validate::labels("labels", request.labels, MAX_LABELS)?,
        tenants: validate::tenants(request.tenant_ids)?,
        heartbeat_ms,
        dead_after_ms,
    });
    // Owned by the principal that registers it, once every member reads that.
    let owned = owned_sessions(ctx);
    let register = |_| match owned {
        true => Command::RegisterOwned(Arc::clone(&info)),
        false => Command::Register(Arc::clone(&info)),
    };
    let results = everywhere_as(ctx, Some(principal), register, deadline).await;
    if let Some(error) = results.into_iter().find_map(Result::err) {
        // A new session, which the worker will not use: ended where it was
        // made. A given id may name a live session this only renewed (an
        // OJS worker's, registered again by each gateway): it is left as it
        // is, and the worker's next request registers it again.
        if given.is_none() {
            end_in_background(ctx, principal, id);
        }
        return Err(error);
    }
    metrics::counter!("drover_worker_sessions_registered_total").increment(1);
    tracing::info!(session = %format!("{id:x}"), worker = %info.worker, host = %info.hostname, "worker registered");
    Ok(pb::RegisterWorkerResponse { session_id: id, heartbeat_interval: heartbeat_ms, dead_after: dead_after_ms })
}

/// The most jobs one heartbeat may list as held.
const MAX_HELD_JOBS: usize = 10_000;

fn session_id(id: u64) -> Result<SessionId, ApiError> {
    if id == 0 {
        return Err(ApiError::InvalidArgument("session_id is required (RegisterWorker answers it)".into()));
    }
    Ok(id)
}

pub async fn heartbeat(
    ctx: &Arc<NodeContext>,
    principal: &Arc<Principal>,
    request: pb::HeartbeatRequest,
    deadline: Instant,
) -> Result<Beaten, ApiError> {
    let session = session_id(request.session_id)?;
    let state = match request.state.as_str() {
        "" => WorkerState::Running,
        name => WorkerState::parse(name).ok_or_else(|| {
            ApiError::InvalidArgument(format!("state must be running, quiet or terminate, got {name:?}"))
        })?,
    };
    if request.jobs.len() > MAX_HELD_JOBS {
        return Err(ApiError::InvalidArgument(format!(
            "a heartbeat lists {} held jobs; a session may list at most {MAX_HELD_JOBS}",
            request.jobs.len()
        )));
    }
    let partitions = ctx.topology.partition_count();
    let mut held: Vec<Vec<(JobKey, u32)>> = vec![Vec::new(); partitions as usize];
    let mut revoked = Vec::new();
    for job in request.jobs {
        let key = JobKey(job.key);
        match held.get_mut(key.partition() as usize) {
            Some(list) if key.counter() != 0 => list.push((key, job.attempt)),
            // No such job can exist: the worker must not hold it.
            _ => revoked.push(job.key),
        }
    }
    let results = everywhere_as(
        ctx,
        Some(principal),
        |p| Command::Beat { session, state, held: held[p as usize].clone() },
        deadline,
    )
    .await;
    let mut directed = WorkerState::Running;
    let mut renewed = Vec::new();
    let mut first_error = None;
    let (mut beaten, mut unknown) = (None, Vec::new());
    for (partition, result) in results.into_iter().enumerate() {
        match result {
            Ok(CommandResult::Beat { directed: d, revoked: r, renewed: n }) => {
                directed = directed.max(d);
                revoked.extend(r.into_iter().map(|k| k.0));
                renewed.extend(n);
                beaten.get_or_insert(partition as PartitionId);
            }
            Ok(other) => return Err(ApiError::Internal(format!("unexpected heartbeat result {other:?}"))),
            Err(ApiError::NotFound(message)) => unknown.push((partition as PartitionId, message)),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some((_, message)) = unknown.first() {
        let Some(beaten) = beaten else {
            // No partition beat it: over. Ended where it may linger, and
            // the worker stops its jobs and registers again.
            end_in_background(ctx, principal, session);
            return Err(ApiError::NotFound(message.clone()));
        };
        let missing: Vec<PartitionId> = unknown.iter().map(|(p, _)| *p).collect();
        register_again(ctx, principal, session, beaten, &missing, deadline).await?;
        // What it held there was handed back with its lease, or was never
        // its own there: the worker stops it.
        revoked.extend(missing.iter().flat_map(|p| held[*p as usize].iter().map(|(key, _)| key.0)));
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    metrics::counter!("drover_worker_heartbeats_total").increment(1);
    let response = pb::HeartbeatResponse { state: directed.as_str().into(), revoked, job_tokens: Vec::new() };
    Ok(Beaten { response, renewed })
}

/// Registers `session` again on the partitions `missing` that no longer know
/// it, as `principal` (partition `beaten` just took its beat from them, so
/// it is theirs), with the registration `beaten` holds.
async fn register_again(
    ctx: &Arc<NodeContext>,
    principal: &Arc<Principal>,
    session: SessionId,
    beaten: PartitionId,
    missing: &[PartitionId],
    deadline: Instant,
) -> Result<(), ApiError> {
    let mut listed = leaders::submit(ctx, beaten, vec![Command::ListSessions], deadline).await?;
    let info = match listed.pop() {
        Some(CommandResult::Sessions(sessions)) => sessions.into_iter().find(|(s, _)| s.info.id == session),
        other => return Err(ApiError::Internal(format!("unexpected session list {other:?}"))),
    };
    let Some((known, _)) = info else {
        return Err(ApiError::Unavailable(format!(
            "worker session {session:x} was just beaten on partition {beaten} but is not listed there: retry"
        )));
    };
    let owned = owned_sessions(ctx);
    for partition in missing {
        let register = match owned {
            true => Command::RegisterOwned(Arc::clone(&known.info)),
            false => Command::Register(Arc::clone(&known.info)),
        };
        let mut answer = leaders::submit_as(ctx, Some(principal), *partition, vec![register], deadline).await?;
        if let Some(CommandResult::Rejected(error)) = answer.pop() {
            return Err(error.into());
        }
    }
    metrics::counter!("drover_worker_sessions_repaired_total").increment(missing.len() as u64);
    tracing::warn!(
        session = %format!("{session:x}"),
        worker = %known.info.worker,
        partitions = ?missing,
        "worker session unknown on some partitions while others beat it (its lease lapsed there alone, or its \
         registration missed them): registered again there; the jobs it held there are revoked"
    );
    Ok(())
}

/// A heartbeat's answer, and the listed jobs the session holds under the
/// listed attempt: only those may be given job tokens.
pub struct Beaten {
    pub response: pb::HeartbeatResponse,
    pub renewed: Vec<JobKey>,
}

pub async fn deregister(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    session: u64,
    deadline: Instant,
) -> Result<(), ApiError> {
    let session = session_id(session)?;
    let results = everywhere_as(ctx, Some(principal), |_| Command::EndSession { session }, deadline).await;
    if let Some(error) = results.into_iter().find_map(Result::err) {
        return Err(error);
    }
    tracing::info!(session = %format!("{session:x}"), "worker deregistered");
    Ok(())
}

/// The labels and tenants of `session`; NOT_FOUND unless it is live (on
/// partition 0). This lists partition 0's sessions: what this gateway has
/// seen before is taken from [`crate::context::KnownSessions`] instead where
/// a check of its own says whether the session still lives.
pub async fn known(ctx: &NodeContext, session: SessionId, deadline: Instant) -> Result<Arc<SessionInfo>, ApiError> {
    let mut results = leaders::submit(ctx, 0, vec![Command::ListSessions], deadline).await?;
    match results.pop() {
        Some(CommandResult::Sessions(sessions)) => match sessions.into_iter().find(|(s, _)| s.info.id == session) {
            Some((s, _)) => {
                ctx.gateway.known_sessions.remember(&s.info);
                Ok(Arc::clone(&s.info))
            }
            None => Err(no_session(session)),
        },
        other => Err(ApiError::Internal(format!("unexpected result {other:?}"))),
    }
}

/// The labels and tenants of live session `session`, for a stream that
/// names it, once `principal` may act as it. A session this gateway has seen
/// costs one lookup of the session on partition 0 (`ActAs`, which also says
/// whether it still lives), not a listing of every session there.
pub async fn for_stream(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    session: SessionId,
    deadline: Instant,
) -> Result<Arc<SessionInfo>, ApiError> {
    let remembered = ctx.gateway.known_sessions.get(session).filter(|_| owned_sessions(ctx));
    let info = match &remembered {
        Some(info) => Arc::clone(info),
        None => known(ctx, session, deadline).await?,
    };
    check_owner(ctx, principal, session, deadline).await?;
    if remembered.is_some() {
        act_as(ctx, principal, session, deadline).await?;
    } else {
        check_act_as(ctx, principal, session, deadline).await?;
    }
    Ok(info)
}

fn no_session(session: SessionId) -> ApiError {
    ApiError::NotFound(format!(
        "no worker session {session:x}: it ended, or missed its heartbeats for its dead-after time; register again"
    ))
}

/// Whether `principal` may act as worker session `session`: it may act for
/// every tenant the session serves. A session of another tenant is not
/// there for it (NOT_FOUND), as another tenant's job is not.
pub async fn check_owner(
    ctx: &NodeContext,
    principal: &crate::auth::Principal,
    session: SessionId,
    deadline: Instant,
) -> Result<(), ApiError> {
    if principal.in_tenant("*") || session == 0 || crate::failpoints::fire("gateway_skip_checks").is_some() {
        return Ok(());
    }
    let tenants = match ctx.gateway.known_sessions.get(session) {
        Some(info) => info,
        None => known(ctx, session, deadline).await?,
    }
    .tenants
    .clone();
    if principal.require_tenants(&tenants).is_err() {
        return Err(no_session(session));
    }
    Ok(())
}

/// Whether sessions get owners: every member reads [`OWNED_SESSIONS`].
fn owned_sessions(ctx: &NodeContext) -> bool {
    ctx.transport.peers.versions().cluster_version() >= OWNED_SESSIONS
}

/// Whether `principal` may act as owned session `session`, as partition 0
/// decides where the session lives: its owner may, and a principal holding
/// `workers:manage` over every tenant it serves. For what acts as a session
/// without a command of its own in the log: a stream that names it. (Beats,
/// ends and activations are judged so on every partition as they apply.)
pub async fn check_act_as(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    session: SessionId,
    deadline: Instant,
) -> Result<(), ApiError> {
    if session == 0 || principal.unrestricted() || !owned_sessions(ctx) {
        return Ok(());
    }
    act_as(ctx, principal, session, deadline).await
}

/// `ActAs` on partition 0: whether session `session` lives and `principal`
/// may act as it.
async fn act_as(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    session: SessionId,
    deadline: Instant,
) -> Result<(), ApiError> {
    let command = Command::ActAs { session };
    match leaders::submit_as(ctx, Some(principal), 0, vec![command], deadline).await?.pop() {
        Some(CommandResult::Rejected(error)) => Err(error.into()),
        Some(_) => Ok(()),
        None => Err(ApiError::Internal("partition 0 returned no result".into())),
    }
}

/// Merges each partition's view of the sessions into one per session.
fn merge(results: Vec<Result<CommandResult, ApiError>>) -> Result<Vec<pb::WorkerSession>, ApiError> {
    let partitions = results.len() as u32;
    let mut merged: BTreeMap<SessionId, (pb::WorkerSession, Vec<u32>)> = BTreeMap::new();
    for (partition, result) in results.into_iter().enumerate() {
        let CommandResult::Sessions(sessions) = result? else {
            return Err(ApiError::Internal("unexpected answer to a session listing".into()));
        };
        for (session, held) in sessions {
            let (view, seen) = merged.entry(session.info.id).or_insert_with(|| (worker_session(&session), Vec::new()));
            seen.push(partition as u32);
            view.held_jobs += held;
            view.registered_at = view.registered_at.min(session.registered_at);
            if session.last_beat > view.last_heartbeat {
                view.last_heartbeat = session.last_beat;
                view.reported_state = session.reported.as_str().into();
            }
            let directed = WorkerState::parse(&view.directed_state).unwrap_or_default().max(session.directed);
            view.directed_state = directed.as_str().into();
        }
    }
    Ok(merged
        .into_values()
        .map(|(mut view, seen)| {
            view.missing_on = (0..partitions).filter(|p| !seen.contains(p)).collect();
            view
        })
        .collect())
}

fn worker_session(session: &Session) -> pb::WorkerSession {
    let info = &session.info;
    pb::WorkerSession {
        session_id: info.id,
        worker_id: info.worker.clone(),
        hostname: info.hostname.clone(),
        pid: info.pid,
        job_types: info.job_types.clone(),
        concurrency: info.concurrency,
        labels: info.labels.clone(),
        tenant_ids: info.tenants.clone(),
        heartbeat_interval: info.heartbeat_ms,
        dead_after: info.dead_after_ms,
        registered_at: session.registered_at,
        last_heartbeat: session.last_beat,
        reported_state: session.reported.as_str().into(),
        directed_state: session.directed.as_str().into(),
        held_jobs: 0,
        missing_on: Vec::new(),
    }
}

pub async fn list(ctx: &NodeContext, label: &str, deadline: Instant) -> Result<Vec<pb::WorkerSession>, ApiError> {
    if !label.is_empty() {
        validate::labels("label", vec![label.to_string()], 1)?;
    }
    let mut sessions = merge(everywhere(ctx, |_| Command::ListSessions, deadline).await)?;
    sessions.retain(|s| label.is_empty() || s.labels.iter().any(|l| l == label));
    Ok(sessions)
}

pub async fn direct(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    request: pb::SetWorkerStateRequest,
    deadline: Instant,
) -> Result<Vec<pb::WorkerSession>, ApiError> {
    let state = WorkerState::parse(&request.state).ok_or_else(|| {
        ApiError::InvalidArgument(format!("state must be running, quiet or terminate, got {:?}", request.state))
    })?;
    let target = match (request.session_id, request.label.is_empty(), request.all) {
        (0, true, true) => SessionTarget::All,
        (0, false, false) => {
            validate::labels("label", vec![request.label.clone()], 1)?;
            SessionTarget::Label(request.label)
        }
        (id, true, false) if id != 0 => SessionTarget::One(id),
        _ => {
            return Err(ApiError::InvalidArgument(
                "name exactly one of session_id, label and all: which workers to direct".into(),
            ))
        }
    };
    let sessions = merge(
        everywhere_as(ctx, Some(principal), |_| Command::Direct { target: target.clone(), state }, deadline).await,
    )?;
    if sessions.is_empty() && matches!(target, SessionTarget::One(_)) {
        return Err(ApiError::NotFound(format!("no live worker session matches {target}")));
    }
    tracing::info!(%target, state = state.as_str(), covered = sessions.len(), "workers directed");
    Ok(sessions)
}

pub async fn set_schema(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    request: pb::SetSchemaRequest,
    deadline: Instant,
) -> Result<(), ApiError> {
    validate::job_type(&request.r#type)?;
    let schema = Bytes::from(request.schema);
    if !schema.is_empty() {
        if schema.len() > ctx.settings.limits.max_payload_bytes {
            return Err(ApiError::ResourceExhausted(format!(
                "the schema is {} bytes; at most {} (max_payload_bytes) are accepted",
                schema.len(),
                ctx.settings.limits.max_payload_bytes
            )));
        }
        Schema::compile(schema.clone()).map_err(ApiError::InvalidArgument)?;
    }
    let job_type = request.r#type;
    let results = everywhere_as(
        ctx,
        Some(principal),
        |_| Command::SetSchema { job_type: job_type.clone(), schema: schema.clone() },
        deadline,
    )
    .await;
    if let Some(error) = results.into_iter().find_map(Result::err) {
        return Err(error);
    }
    tracing::info!(job_type, removed = schema.is_empty(), "job schema set");
    Ok(())
}

pub async fn get_schema(ctx: &NodeContext, job_type: String, deadline: Instant) -> Result<String, ApiError> {
    validate::job_type(&job_type)?;
    let mut results = leaders::submit(ctx, 0, vec![Command::GetSchema { job_type }], deadline).await?;
    match results.pop() {
        Some(CommandResult::Schema(schema)) => Ok(String::from_utf8_lossy(&schema).into_owned()),
        other => Err(ApiError::Internal(format!("unexpected result {other:?}"))),
    }
}
