//! Admin HTTP: `/health`, `/ready`, `/metrics` (Prometheus text format) and JSON
//! views under `/actuator/*`, and the web console. The metrics themselves
//! (recorder, names, stages) are [`crate::metrics`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::context::NodeContext;

mod console;
mod job_json;

use job_json::job_json;

pub async fn serve(
    ctx: Arc<NodeContext>,
    listener: TcpListener,
    tls: Option<Arc<crate::tls::ReloadingServer>>,
    mut stop: watch::Receiver<bool>,
) {
    crate::metrics::register_metrics();
    let samples = stop.clone();
    ctx.tasks.spawn(crate::tasks::named("console samples", move |status| console::sample_metrics(samples, status)));
    let admin_tls = console::AdminTls(tls.is_some());
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .route("/actuator/partitions", get(partitions))
        .route("/actuator/jobstreams", get(jobstreams))
        .route("/actuator/tasks", get(tasks))
        .route("/actuator/plan", get(plan))
        .route("/actuator/jobs", get(local_jobs))
        .route("/actuator/workers", get(workers))
        .route("/actuator/workers/{state}", axum::routing::post(direct_workers))
        .route("/actuator/failpoints/{name}", axum::routing::put(arm_failpoint))
        .merge(console::routes())
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&ctx), authorize))
        .layer(axum::Extension(admin_tls))
        .with_state(ctx);
    let listener = crate::tls::HttpListener::new(listener, tls, stop.clone());
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        tracing::error!("admin server failed: {e}");
    }
}

/// The scope a request to the admin port needs; `None`: none (the probes,
/// the console's sign-in page and static files). The console needs only a
/// principal: it shows what that one may see, and the gateway checks each
/// console action's scope as for any client. `/actuator/jobs`, a debugging
/// view of every replica's jobs, needs `cluster:read` and then shows only the
/// jobs the principal may read.
fn admin_scope(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    use crate::auth::{CLUSTER_ADMIN, CLUSTER_READ, WORKERS_MANAGE};
    match (method.as_str(), path) {
        (_, "/health" | "/ready") => None,
        (_, p) if console::is_open(p) => None,
        (_, p) if p == "/console" || p.starts_with("/console/") => Some(""),
        ("POST", p) if p.starts_with("/actuator/workers/") => Some(WORKERS_MANAGE),
        ("PUT", p) if p.starts_with("/actuator/failpoints/") => Some(CLUSTER_ADMIN),
        _ => Some(CLUSTER_READ),
    }
}

/// Admits every admin request but the probes as the client port admits a
/// call ([`crate::gateway::call::admit`]: authenticated by `Authorization:
/// Bearer` or the console's sign-in cookie, rate-limited, counted in flight
/// so a stopping node drains it, traced), checks the scope its route needs,
/// and hands the principal and the call on.
async fn authorize(
    State(ctx): State<Arc<NodeContext>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(scope) = admin_scope(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let for_console = path == "/console" || path.starts_with("/console/");
    if for_console && request.method() == axum::http::Method::POST && !console::same_origin(request.headers()) {
        let error = crate::gateway::api::ApiError::PermissionDenied(
            "a console form must be posted from this console's own pages".into(),
        );
        return api_error(error).into_response();
    }
    // A browser on the console sends its token in the sign-in cookie.
    let cookie = match for_console && !request.headers().contains_key(axum::http::header::AUTHORIZATION) {
        true => console::cookie_token(request.headers()),
        false => None,
    };
    let route = format!("{} {}", request.method(), request.uri().path());
    let span_name = || format!("admin {route}");
    let door = crate::gateway::call::Door {
        service: "admin",
        method: &route,
        span_name: &span_name,
        token: cookie.as_deref(),
    };
    let admitted = match crate::gateway::call::admit(&ctx, request.headers(), door) {
        Ok(admitted) => admitted,
        Err(crate::gateway::api::ApiError::Unauthenticated(_)) if for_console => {
            let target = request.uri().path_and_query().map_or("/console", |p| p.as_str());
            return console::sign_in(target);
        }
        Err(error) => {
            let unauthenticated = matches!(error, crate::gateway::api::ApiError::Unauthenticated(_));
            let mut response = api_error(error).into_response();
            if unauthenticated {
                let challenge = "Bearer".parse().expect("literal");
                response.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, challenge);
            }
            return response;
        }
    };
    let principal = Arc::clone(&admitted.call.principal);
    if !scope.is_empty() {
        if let Err(error) = principal.require(scope) {
            return api_error(error).into_response();
        }
    }
    if request.method() != axum::http::Method::GET {
        let action = format!("{} {}", request.method(), request.uri().path());
        crate::auth::audit(&principal, &action, json!({ "query": request.uri().query().unwrap_or_default() }));
    }
    request.extensions_mut().insert(principal);
    request.extensions_mut().insert(admitted.call.clone());
    admitted.serve(next.run(request)).await
}

#[derive(serde::Deserialize)]
struct ArmFailpoint {
    count: u32,
    #[serde(default)]
    hold_ms: u64,
}

/// Test-only: see [`crate::failpoints`].
async fn arm_failpoint(
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(arm): axum::extract::Query<ArmFailpoint>,
) -> impl IntoResponse {
    if !crate::failpoints::enabled() {
        return (StatusCode::NOT_FOUND, "failpoints are off (DROVER_FAILPOINTS is not set)".to_string());
    }
    crate::failpoints::arm(&name, arm.count, Duration::from_millis(arm.hold_ms));
    (StatusCode::OK, format!("{name} armed"))
}

async fn ready(State(ctx): State<Arc<NodeContext>>) -> impl IntoResponse {
    if ctx.routing.ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: a partition on this node has no known leader")
    }
}

async fn partitions(State(ctx): State<Arc<NodeContext>>) -> impl IntoResponse {
    let brokers = crate::gateway::api::cluster_status_json(&ctx).await;
    Json(json!({
        "nodeId": ctx.topology.node_id,
        "clusterSize": ctx.topology.cluster_size(),
        "partitionsCount": ctx.topology.partition_count(),
        "replicationFactor": ctx.topology.replication_factor,
        "local": ctx.routing.replicas().iter().map(|r| r.status()).collect::<Vec<_>>(),
        "brokers": brokers,
    }))
}

#[derive(serde::Deserialize, Default)]
struct JobsQuery {
    /// Where the page starts: after this key (`next` of the previous page).
    #[serde(default)]
    after: Option<u64>,
    /// Jobs per page: at most [`MAX_JOBS_PAGE`].
    #[serde(default)]
    limit: Option<usize>,
}

/// Jobs per page of `/actuator/jobs` unless the request asks for fewer.
const MAX_JOBS_PAGE: usize = 1000;

/// The jobs held by this node's replicas, as this node sees them (not routed
/// to leaders): key, partition, type, tenant, state, attempt, variables,
/// result, and who acted on it (see [`actors`]). Only jobs the request's
/// principal may read: its tenants, its types. A page at a time, in key order,
/// within one partition: `next` is the `after` of the next page, absent at
/// the end. Each page holds the lock apply takes for that page only (see
/// `SharedState::list`), never for every job.
async fn local_jobs(
    State(ctx): State<Arc<NodeContext>>,
    axum::Extension(principal): axum::Extension<Arc<crate::auth::Principal>>,
    axum::extract::Query(query): axum::extract::Query<JobsQuery>,
) -> impl IntoResponse {
    let limit = query.limit.unwrap_or(MAX_JOBS_PAGE).clamp(1, MAX_JOBS_PAGE);
    let after = crate::core::JobKey(query.after.unwrap_or(0));
    let tenants = if principal.in_tenant("*") { Vec::new() } else { principal.tenants.clone() };
    let max_bytes = ctx.settings.limits.max_request_bytes();
    let mut jobs = Vec::new();
    let mut next = None;
    for replica in ctx.routing.replicas().into_iter().filter(|r| r.partition >= after.partition()) {
        let partition = replica.partition;
        let from = if partition == after.partition() { after } else { crate::core::JobKey::new(partition, 0) };
        let filter = crate::core::JobFilter::default();
        let page = match replica.state().list(&filter, &tenants, from, limit, max_bytes) {
            Ok(page) => page,
            Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({ "error": e.to_string() }))),
        };
        // A page holds one partition's jobs: the next starts after its last
        // (the partition may hold more than a page, or than its byte budget).
        if let Some(last) = page.last() {
            next = Some(last.key.0);
            jobs.extend(page.iter().filter(|j| principal.sees(crate::auth::Verb::Read, j)).map(job_json));
            break;
        }
    }
    (StatusCode::OK, Json(json!({ "nodeId": ctx.topology.node_id, "jobs": jobs, "next": next })))
}

#[derive(serde::Deserialize, Default)]
struct WorkersQuery {
    /// A session id in hex (as `drover worker list` shows it).
    #[serde(default)]
    session: String,
    #[serde(default)]
    label: String,
    #[serde(default)]
    all: bool,
}

fn worker_json(w: &crate::proto::gateway::WorkerSession) -> serde_json::Value {
    json!({
        "sessionId": format!("{:x}", w.session_id),
        "workerId": w.worker_id,
        "hostname": w.hostname,
        "pid": w.pid,
        "jobTypes": w.job_types,
        "concurrency": w.concurrency,
        "labels": w.labels,
        "tenantIds": w.tenant_ids,
        "heartbeatInterval": w.heartbeat_interval,
        "deadAfter": w.dead_after,
        "registeredAt": w.registered_at,
        "lastHeartbeat": w.last_heartbeat,
        "reportedState": w.reported_state,
        "directedState": w.directed_state,
        "heldJobs": w.held_jobs,
        "missingOn": w.missing_on,
    })
}

fn api_error(error: impl Into<crate::gateway::api::ApiError>) -> (StatusCode, Json<serde_json::Value>) {
    use crate::gateway::api::ApiError;
    let error = error.into();
    let status = match &error {
        ApiError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        ApiError::NotFound(_) => StatusCode::NOT_FOUND,
        ApiError::FailedPrecondition(_) | ApiError::Finished(_) => StatusCode::CONFLICT,
        ApiError::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
        ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        ApiError::PermissionDenied(_) => StatusCode::FORBIDDEN,
        ApiError::Unavailable(_) | ApiError::OutOfReach(_) | ApiError::OutcomeUnknown(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(json!({ "error": error.to_string() })))
}

/// Every live worker session (`?label=name:value` for some) that takes jobs
/// of one of the principal's tenants.
async fn workers(
    State(ctx): State<Arc<NodeContext>>,
    axum::Extension(call): axum::Extension<crate::gateway::api::Call>,
    axum::extract::Query(query): axum::extract::Query<WorkersQuery>,
) -> impl IntoResponse {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let request = crate::proto::gateway::ListWorkersRequest { label: query.label };
    match api.list_workers(&call, request).await {
        Ok(workers) => {
            (StatusCode::OK, Json(json!({ "workers": workers.iter().map(worker_json).collect::<Vec<_>>() })))
        }
        Err(error) => api_error(error),
    }
}

/// `POST /actuator/workers/{running|quiet|terminate}?session=ID|label=L|all=true`.
async fn direct_workers(
    State(ctx): State<Arc<NodeContext>>,
    axum::Extension(call): axum::Extension<crate::gateway::api::Call>,
    axum::extract::Path(state): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<WorkersQuery>,
) -> impl IntoResponse {
    let session_id = if query.session.is_empty() {
        0
    } else {
        match u64::from_str_radix(&query.session, 16) {
            Ok(id) => id,
            Err(_) => {
                let message = format!("session {:?} is not a session id (hex, as listed)", query.session);
                return api_error(crate::gateway::api::ApiError::InvalidArgument(message));
            }
        }
    };
    let request =
        crate::proto::gateway::SetWorkerStateRequest { session_id, label: query.label, all: query.all, state };
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    match api.set_worker_state(&call, request).await {
        Ok(workers) => {
            (StatusCode::OK, Json(json!({ "workers": workers.iter().map(worker_json).collect::<Vec<_>>() })))
        }
        Err(error) => api_error(error),
    }
}

/// The node's background loops: name, state, status and last error.
async fn tasks(State(ctx): State<Arc<NodeContext>>) -> impl IntoResponse {
    Json(json!({ "nodeId": ctx.topology.node_id, "tasks": ctx.tasks.list() }))
}

/// The cluster plan this node follows (docs/membership.md), with the moves
/// still to make; before the plan's first change, the placement the cluster
/// formed with.
async fn plan(State(ctx): State<Arc<NodeContext>>) -> impl IntoResponse {
    let (plan, changed) = ctx.topology.shown_plan().map_or((None, false), |(plan, changed)| (Some(plan), changed));
    let pending: Vec<_> = plan
        .iter()
        .flat_map(|p| p.pending())
        .map(|m| json!({ "partition": m.partition, "from": m.from, "to": m.to }))
        .collect();
    let moving: Vec<_> =
        plan.iter().flat_map(|p| (0..p.partitions()).filter(|i| p.may_move(*i)).collect::<Vec<_>>()).collect();
    Json(json!({
        "nodeId": ctx.topology.node_id,
        "changed": changed,
        "plan": plan,
        "pendingMoves": pending,
        "movingNow": moving,
    }))
}

/// Only streams that serve one of the principal's tenants.
async fn jobstreams(
    State(ctx): State<Arc<NodeContext>>,
    axum::Extension(principal): axum::Extension<Arc<crate::auth::Principal>>,
) -> impl IntoResponse {
    let remote: Vec<_> = ctx
        .broker
        .streams
        .all()
        .iter()
        .filter(|s| principal.shares_tenant(&s.tenants))
        .map(|s| {
            json!({
                "gatewayNodeId": s.gateway,
                "streamId": s.stream_id,
                "jobType": s.job_type,
                "worker": s.worker,
                "timeout": s.timeout_ms,
                "tenantIds": s.tenants,
                "fetchVariables": s.fetch_variables,
                "sessionId": format!("{:x}", s.session),
            })
        })
        .collect();
    let mut client = ctx.gateway.streams.view().await;
    client.retain(|view| principal.shares_tenant(&view.key.tenants));
    Json(json!({ "client": client, "remote": remote }))
}

/// Activatable jobs of a partition this node leads that no open stream may
/// take (it lacks a label they require), by their labels as
/// [`crate::core::Routing::describe`] writes them.
fn unroutable_jobs(ctx: &NodeContext, replica: &crate::raft::Replica) -> Vec<(String, usize)> {
    replica.state().read(|s| {
        let mut found = Vec::new();
        for (job_type, _) in s.activatable_by_type() {
            let streams = ctx.broker.streams.live(&job_type);
            for (routing, count) in s.activatable_by_routing(&job_type) {
                let takers = streams.iter().map(|st| crate::core::Taker::new(st.labels.clone(), false));
                if !routing.required.is_empty() && !takers.into_iter().any(|t| routing.allows(&t)) {
                    found.push((routing.describe(), count));
                }
            }
        }
        found
    })
}

/// The exposition, with the storage figures read at the scrape (the bench
/// divides bytes written by jobs over runs of a few seconds).
async fn metrics_text(State(ctx): State<Arc<NodeContext>>) -> String {
    record_storage(&ctx.store);
    crate::metrics::recorder().render()
}

/// RocksDB's, the allocator's and the WAL writer's figures, as gauges and
/// counters. Sizes are summed over every column family; the block cache (one
/// for all tables) is read through the tables; the stall flag is the
/// database's.
fn record_storage(store: &crate::storage::Store) {
    enum Read {
        Summed,
        Shared,
        Database,
    }
    for (name, property, read) in [
        ("drover_rocksdb_memtable_bytes", "rocksdb.cur-size-all-mem-tables", Read::Summed),
        ("drover_rocksdb_sst_bytes", "rocksdb.total-sst-files-size", Read::Summed),
        ("drover_rocksdb_table_readers_bytes", "rocksdb.estimate-table-readers-mem", Read::Summed),
        ("drover_rocksdb_pending_compaction_bytes", "rocksdb.estimate-pending-compaction-bytes", Read::Summed),
        ("drover_rocksdb_block_cache_bytes", "rocksdb.block-cache-usage", Read::Shared),
        ("drover_rocksdb_block_cache_pinned_bytes", "rocksdb.block-cache-pinned-usage", Read::Shared),
        ("drover_rocksdb_write_stalled", "rocksdb.is-write-stopped", Read::Database),
        ("drover_rocksdb_running_flushes", "rocksdb.num-running-flushes", Read::Database),
        ("drover_rocksdb_running_compactions", "rocksdb.num-running-compactions", Read::Database),
    ] {
        let value = match read {
            Read::Summed => store.property_total(property),
            Read::Shared => store.property_shared(property),
            Read::Database => store.property(property),
        };
        if let Some(value) = value {
            metrics::gauge!(name).set(value as f64);
        }
    }
    for (kind, bytes) in store.written().kinds() {
        metrics::counter!(crate::metrics::WRITTEN_METRIC, "kind" => kind).absolute(bytes);
    }
    for (block, reads) in store.block_cache_reads() {
        metrics::counter!("drover_rocksdb_block_cache_hits_total", "block" => block).absolute(reads.hits);
        metrics::counter!("drover_rocksdb_block_cache_misses_total", "block" => block).absolute(reads.misses);
        metrics::counter!("drover_rocksdb_block_cache_loaded_bytes_total", "block" => block)
            .absolute(reads.loaded_bytes);
    }
    for (table, bytes) in store.put_bytes() {
        metrics::counter!(crate::metrics::PUT_METRIC, "table" => table.cf_name()).absolute(bytes);
    }
    if let Some(heap) = crate::memory::allocator_stats() {
        metrics::gauge!("drover_allocator_allocated_bytes").set(heap.allocated as f64);
        metrics::gauge!("drover_allocator_resident_bytes").set(heap.resident as f64);
        metrics::gauge!("drover_allocator_retained_bytes").set(heap.retained as f64);
    }
    let sync = store.sync_stats();
    metrics::gauge!("drover_storage_wal_syncs").set(sync.syncs as f64);
    metrics::gauge!("drover_storage_appends_synced").set(sync.batches as f64);
}

/// Publishes gauges that are read rather than counted: partition roles and
/// progress, activatable jobs per type, storage figures.
pub async fn record_gauges(ctx: Arc<NodeContext>, mut stop: watch::Receiver<bool>, status: crate::tasks::LoopStatus) {
    // Series of `drover_jobs_unroutable` set last time, so they drop to 0.
    let mut unroutable_before: BTreeSet<(String, String)> = BTreeSet::new();
    loop {
        let mut unroutable: BTreeMap<(String, String), usize> = BTreeMap::new();
        for replica in ctx.routing.replicas().iter() {
            let status = replica.status();
            let p = status.partition.to_string();
            let leader = if status.role == "leader" { 1.0 } else { 0.0 };
            metrics::gauge!("drover_partition_role_leader", "partition" => p.clone()).set(leader);
            metrics::gauge!("drover_partition_term", "partition" => p.clone()).set(status.term as f64);
            metrics::gauge!("drover_partition_commit_index", "partition" => p.clone()).set(status.commit_index as f64);
            metrics::gauge!("drover_partition_applied_index", "partition" => p.clone())
                .set(status.applied_index as f64);
            metrics::gauge!("drover_partition_has_leader", "partition" => p.clone()).set(if status.leader.is_some() {
                1.0
            } else {
                0.0
            });
            // The de-duplication table: what --idempotency-max-keys bounds.
            let remembered = replica.state().read(|s| s.requests_len());
            metrics::gauge!("drover_dedupe_entries", "partition" => p.clone()).set(remembered as f64);
            if status.role == "leader" {
                // Types beyond the label limit share one series: sum them before setting it.
                let mut by_label: std::collections::BTreeMap<String, usize> = Default::default();
                for (job_type, count) in replica.state().read(|s| s.activatable_by_type()) {
                    *by_label.entry(crate::metrics::job_type_label(job_type)).or_default() += count;
                }
                for (label, count) in by_label {
                    metrics::gauge!("drover_jobs_activatable", "partition" => p.clone(), "type" => label)
                        .set(count as f64);
                }
                for (routing, count) in unroutable_jobs(&ctx, replica) {
                    *unroutable.entry((p.clone(), crate::metrics::job_type_label(routing))).or_default() += count;
                }
            }
        }
        for (partition, labels) in std::mem::take(&mut unroutable_before) {
            if !unroutable.contains_key(&(partition.clone(), labels.clone())) {
                metrics::gauge!("drover_jobs_unroutable", "partition" => partition, "labels" => labels).set(0.0);
            }
        }
        for ((partition, labels), count) in unroutable {
            metrics::gauge!("drover_jobs_unroutable", "partition" => partition.clone(), "labels" => labels.clone())
                .set(count as f64);
            unroutable_before.insert((partition, labels));
        }
        record_storage(&ctx.store);
        crate::metrics::recorder().run_upkeep();
        status.set(format!("gauges of {} partitions read", ctx.routing.replicas().len()));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
