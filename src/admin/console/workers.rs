//! The console's workers page: worker sessions across the cluster (quiet,
//! resume, terminate), and the job streams registered with this node.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use minijinja::{context, Value};

use super::*;
use crate::auth::Principal;
use crate::context::NodeContext;

/// Worker sessions across the cluster, and the job streams registered with
/// this node's partitions.
pub(super) async fn workers(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let sessions = match api.list_workers(&call, ListWorkersRequest::default()).await {
        Ok(workers) => workers,
        Err(error) => return failure(&ctx, &principal, "Worker sessions", &error.into()),
    };
    let now = crate::auth::now_ms() as i64;
    let sessions: Vec<Value> = sessions
        .iter()
        .map(|w| {
            context! {
                id => format!("{:x}", w.session_id),
                worker => &w.worker_id,
                host => format!("{} (pid {})", w.hostname, w.pid),
                types => w.job_types.join(", "),
                labels => w.labels.join(", "),
                tenants => w.tenant_ids.join(", "),
                concurrency => w.concurrency,
                reported => &w.reported_state,
                directed => &w.directed_state,
                held => w.held_jobs,
                beat => time::ago(now, w.last_heartbeat),
                registered => time::ago(now, w.registered_at),
                missing => w.missing_on.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            }
        })
        .collect();
    let mut registered = ctx.broker.streams.all();
    registered.sort_by_key(|s| (s.job_type.clone(), s.gateway, s.stream_id));
    let streams: Vec<Value> = registered
        .iter()
        .filter(|s| principal.shares_tenant(&s.tenants))
        .map(|s| {
            context! {
                gateway => s.gateway,
                id => format!("{:x}", s.stream_id),
                job_type => &s.job_type,
                worker => &s.worker,
                timeout => s.timeout_ms,
                tenants => s.tenants.join(", "),
                session => if s.session == 0 { String::new() } else { format!("{:x}", s.session) },
            }
        })
        .collect();
    let page = context! { sessions => sessions, streams => streams };
    render(&ctx, Some(&principal), "workers.html", page)
}

pub(super) async fn direct_worker(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Path((session, state)): Path<(String, String)>,
) -> Response {
    let Ok(session_id) = u64::from_str_radix(&session, 16) else {
        let status = tonic::Status::invalid_argument(format!("{session:?} is not a session id (hex, as listed)"));
        return failure(&ctx, &principal, "Directing a worker", &status);
    };
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let request = SetWorkerStateRequest { session_id, label: String::new(), all: false, state };
    match api.set_worker_state(&call, request).await {
        Ok(_) => Redirect::to("/console/workers").into_response(),
        Err(error) => failure(&ctx, &principal, "Directing a worker", &error.into()),
    }
}
