//! The web console at `/console` on the admin port: the cluster (nodes,
//! partitions with leaders, terms and lag, sparklines of this node's own
//! metrics), worker sessions and job streams (quiet, resume, terminate), job
//! search, a job's page with its history, and incidents with retry and cancel.
//!
//! Owns the console's pages, its sign-in cookie and its metric samples. Every
//! read and every action goes through this node's gateway in-process, as the
//! signed-in principal: the gateway routes it to the partition leaders
//! wherever they are and checks the principal's scopes and tenants, so each
//! page works from any node and shows only what its viewer may see. Pages
//! are rendered on the server from templates compiled into the binary.

use std::sync::{Arc, OnceLock};

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use minijinja::{context, Environment, Value};
use serde::Deserialize;
use tonic::Request;

use crate::auth::Principal;
use crate::gateway::GatewayService;
use crate::node::NodeContext;
use crate::proto::gateway::gateway_server::Gateway as _;
use crate::proto::gateway::*;

mod samples;
mod time;

pub use samples::run as sample_metrics;

/// The sign-in cookie: the bearer token, sent back only to `/console`.
pub const COOKIE: &str = "drover_console_token";
/// Jobs per page of a search.
const PAGE_SIZE: i32 = 50;
/// Job states a search can ask for, in a job's usual order.
const STATES: [&str; 6] = ["scheduled", "activatable", "activated", "incident", "completed", "cancelled"];

pub fn routes() -> Router<Arc<NodeContext>> {
    Router::new()
        .route("/console", get(cluster))
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/static/style.css", get(style))
        .route("/console/static/console.js", get(script))
        .route("/console/workers", get(workers))
        .route("/console/workers/{session}/{state}", post(direct_worker))
        .route("/console/jobs", get(jobs))
        .route("/console/jobs/{key}", get(job))
        .route("/console/jobs/{key}/retry", post(retry))
        .route("/console/jobs/{key}/cancel", post(cancel))
        .route("/console/incidents", get(incidents))
        .route("/console/incidents/retry", post(retry_all))
}

/// Console paths open to anyone: the sign-in page and the static files.
pub fn is_open(path: &str) -> bool {
    path == "/console/login" || path.starts_with("/console/static/")
}

/// The token a console request carries in its cookie, if any.
pub fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// Whether a form post comes from a console page: a browser names the page's
/// origin in `Origin`, and it must be this server (`Host`). With the
/// cookie's `SameSite=Strict`, another site cannot act as the signed-in user.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        // Not a browser form (curl with a bearer token): nothing to forge.
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    !host.is_empty() && origin_host == host
}

/// Where an unauthenticated console request is sent: the sign-in page, then
/// back to what it asked for.
pub fn sign_in(path_and_query: &str) -> Response {
    let next = if path_and_query.starts_with("/console") { path_and_query } else { "/console" };
    Redirect::to(&format!("/console/login?next={}", encode(next))).into_response()
}

fn templates() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, source) in [
            ("base.html", include_str!("templates/base.html")),
            ("login.html", include_str!("templates/login.html")),
            ("cluster.html", include_str!("templates/cluster.html")),
            ("workers.html", include_str!("templates/workers.html")),
            ("jobs.html", include_str!("templates/jobs.html")),
            ("job.html", include_str!("templates/job.html")),
            ("incidents.html", include_str!("templates/incidents.html")),
            ("job_rows.html", include_str!("templates/job_rows.html")),
            ("error.html", include_str!("templates/error.html")),
        ] {
            env.add_template(name, source).expect("console templates compile");
        }
        env
    })
}

/// Renders `name` with the values every page has (this node, the viewer).
fn render(ctx: &NodeContext, principal: Option<&Principal>, name: &str, page: Value) -> Response {
    let nav = match name {
        "cluster.html" => "cluster",
        "workers.html" => "workers",
        "jobs.html" | "job.html" => "jobs",
        "incidents.html" => "incidents",
        _ => "",
    };
    let common = context! {
        nav => nav,
        node_id => ctx.node_id,
        nodes => ctx.members.len(),
        viewer => principal.map(|p| p.name.clone()),
        signed_in => ctx.auth.enabled(),
        page => page,
    };
    match templates().get_template(name).and_then(|t| t.render(common)) {
        Ok(html) => Html(html).into_response(),
        Err(error) => {
            tracing::error!("console page {name} failed to render: {error:#}");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("the page {name} failed to render: {error}")).into_response()
        }
    }
}

/// A page saying what went wrong, with the status the gateway's answer maps to.
fn failure(ctx: &NodeContext, principal: &Principal, what: &str, status: &tonic::Status) -> Response {
    let code = http_status(status.code());
    let page = context! { what => what, code => format!("{:?}", status.code()), message => status.message() };
    let mut response = render(ctx, Some(principal), "error.html", page);
    *response.status_mut() = code;
    response
}

fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A gateway call made as `principal` (the extension the gateway trusts,
/// which a remote client cannot set).
fn as_principal<T>(principal: &Arc<Principal>, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.extensions_mut().insert(Arc::clone(principal));
    request
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("static/style.css"))
}

async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("static/console.js"))
}

#[derive(Deserialize, Default)]
struct Next {
    #[serde(default)]
    next: String,
}

async fn login_page(State(ctx): State<Arc<NodeContext>>, Query(next): Query<Next>) -> Response {
    let page = context! { next => next.next, error => Option::<String>::None };
    render(&ctx, None, "login.html", page)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

/// Whether the admin port serves TLS (the sign-in cookie is then `Secure`).
#[derive(Clone, Copy)]
pub struct AdminTls(pub bool);

/// Checks the token as the gateway would, then keeps it in an HttpOnly,
/// SameSite=Strict cookie scoped to `/console`.
async fn login(
    State(ctx): State<Arc<NodeContext>>,
    Extension(tls): Extension<AdminTls>,
    Form(form): Form<LoginForm>,
) -> Response {
    let token = form.token.trim();
    let valid_chars = token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b));
    let checked = if token.is_empty() || !valid_chars {
        Err("paste a bearer token: a secret from the tokens file or a JWT".to_string())
    } else {
        ctx.auth.authenticate(Some(&format!("Bearer {token}"))).map_err(|e| e.to_string())
    };
    if let Err(error) = checked {
        let page = context! { next => form.next, error => error };
        let mut response = render(&ctx, None, "login.html", page);
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    }
    let next = if form.next.starts_with("/console") && !form.next.starts_with("//") { &form.next } else { "/console" };
    let secure = if tls.0 { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict{secure}");
    ([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response()
}

async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console/login")).into_response()
}

/// The cluster: every node's partitions (role, term, lag), and this node's
/// own rates and latencies.
async fn cluster(State(ctx): State<Arc<NodeContext>>, Extension(principal): Extension<Arc<Principal>>) -> Response {
    if let Err(error) = principal.require(crate::auth::CLUSTER_READ) {
        return failure(&ctx, &principal, "The cluster", &error.into());
    }
    let brokers = crate::gateway::cluster_status(&ctx).await;
    let mut partitions: std::collections::BTreeMap<u32, Vec<(u64, &PartitionInfo)>> = Default::default();
    for broker in &brokers {
        for p in &broker.partitions {
            partitions.entry(p.partition_id).or_default().push((broker.node_id, p));
        }
    }
    let partitions: Vec<Value> = partitions
        .iter()
        .map(|(id, replicas)| {
            let committed = replicas.iter().map(|(_, p)| p.commit_index).max().unwrap_or(0);
            let leader = replicas.iter().find(|(_, p)| p.role == "leader");
            let term = replicas.iter().map(|(_, p)| p.term).max().unwrap_or(0);
            context! {
                id => id,
                leader => leader.map(|(node, _)| *node),
                term => term,
                committed => committed,
                replicas => replicas.iter().map(|(node, p)| context! {
                    node => node,
                    role => &p.role,
                    term => p.term,
                    applied => p.applied_index,
                    lag => committed.saturating_sub(p.applied_index),
                }).collect::<Vec<_>>(),
            }
        })
        .collect();
    let nodes: Vec<Value> = brokers
        .iter()
        .map(|b| {
            context! {
                id => b.node_id,
                address => &b.address,
                reachable => b.node_id == ctx.node_id || !b.address.is_empty(),
                leads => b.partitions.iter().filter(|p| p.role == "leader").count(),
                replicas => b.partitions.len(),
                healthy => !b.partitions.is_empty() && b.partitions.iter().all(|p| p.health == "healthy"),
            }
        })
        .collect();
    let samples = samples::samples();
    let series = |f: fn(&samples::Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let spark = |label: &str, unit: &str, values: Vec<f64>| {
        let last = values.last().copied().unwrap_or(0.0);
        context! {
            label => label,
            unit => unit,
            last => format!("{last:.1}"),
            svg => Value::from_safe_string(samples::sparkline(&values, unit)),
        }
    };
    let sparks = vec![
        spark("Jobs created", "jobs/s", series(|s| s.created)),
        spark("Jobs completed", "jobs/s", series(|s| s.completed)),
        spark("Jobs failed", "jobs/s", series(|s| s.failed)),
        spark("Client requests", "req/s", series(|s| s.requests)),
        spark("Create ack, mean", "ms", series(|s| s.ack_mean_ms)),
        spark("Create ack, p99 bucket", "ms", series(|s| s.ack_p99_ms)),
    ];
    let page = context! {
        ready => ctx.ready(),
        partitions_count => ctx.partition_count(),
        replication_factor => ctx.replication_factor,
        nodes => nodes,
        partitions => partitions,
        sparks => sparks,
        window_seconds => samples::INTERVAL.as_secs() * samples::KEPT as u64,
    };
    render(&ctx, Some(&principal), "cluster.html", page)
}

/// Worker sessions across the cluster, and the job streams registered with
/// this node's partitions.
async fn workers(State(ctx): State<Arc<NodeContext>>, Extension(principal): Extension<Arc<Principal>>) -> Response {
    let gateway = GatewayService::new(Arc::clone(&ctx));
    let sessions = match gateway.list_workers(as_principal(&principal, ListWorkersRequest::default())).await {
        Ok(answer) => answer.into_inner().workers,
        Err(status) => return failure(&ctx, &principal, "Worker sessions", &status),
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
    let mut registered = ctx.broker_streams.all();
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

async fn direct_worker(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path((session, state)): Path<(String, String)>,
) -> Response {
    let Ok(session_id) = u64::from_str_radix(&session, 16) else {
        let status = tonic::Status::invalid_argument(format!("{session:?} is not a session id (hex, as listed)"));
        return failure(&ctx, &principal, "Directing a worker", &status);
    };
    let gateway = GatewayService::new(Arc::clone(&ctx));
    let request = SetWorkerStateRequest { session_id, label: String::new(), all: false, state };
    match gateway.set_worker_state(as_principal(&principal, request)).await {
        Ok(_) => Redirect::to("/console/workers").into_response(),
        Err(status) => failure(&ctx, &principal, "Directing a worker", &status),
    }
}

#[derive(Deserialize, Default)]
struct Search {
    #[serde(default)]
    state: String,
    #[serde(default, rename = "type")]
    job_type: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    page: String,
}

impl Search {
    fn filter(&self) -> JobFilter {
        JobFilter {
            state: self.state.trim().to_string(),
            r#type: self.job_type.trim().to_string(),
            tenant_id: self.tenant.trim().to_string(),
            error_contains: self.error.trim().to_string(),
            ..Default::default()
        }
    }

    /// This search's query string without its page.
    fn query(&self) -> String {
        format!(
            "state={}&type={}&tenant={}&error={}",
            encode(&self.state),
            encode(&self.job_type),
            encode(&self.tenant),
            encode(&self.error)
        )
    }
}

/// One row of a job list.
fn job_row(job: &Job, now: i64) -> Value {
    context! {
        key => job.key.to_string(),
        job_type => &job.r#type,
        tenant => &job.tenant_id,
        state => &job.state,
        retries => job.retries,
        attempt => job.attempt,
        worker => &job.worker,
        created => time::ago(now, job.created_at),
        error => shorten(&job.error_message, 120),
        reason => &job.failure_reason,
    }
}

/// `text` cut to about `chars` characters, with an ellipsis when cut.
fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// A page of jobs matching `search`, through ListJobs.
async fn list(
    ctx: &Arc<NodeContext>,
    principal: &Arc<Principal>,
    search: &Search,
) -> Result<(Vec<Value>, String), tonic::Status> {
    let gateway = GatewayService::new(Arc::clone(ctx));
    let request =
        ListJobsRequest { filter: Some(search.filter()), page_size: PAGE_SIZE, page_token: search.page.clone() };
    let answer = gateway.list_jobs(as_principal(principal, request)).await?.into_inner();
    let now = crate::auth::now_ms() as i64;
    Ok((answer.jobs.iter().map(|j| job_row(j, now)).collect(), answer.next_page_token))
}

async fn jobs(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Query(search): Query<Search>,
) -> Response {
    let key = search.key.trim();
    if !key.is_empty() {
        return match key.parse::<u64>() {
            Ok(key) => Redirect::to(&format!("/console/jobs/{key}")).into_response(),
            Err(_) => {
                let status = tonic::Status::invalid_argument(format!("{key:?} is not a job key (a decimal number)"));
                failure(&ctx, &principal, "Finding a job", &status)
            }
        };
    }
    let (rows, next) = match list(&ctx, &principal, &search).await {
        Ok(found) => found,
        Err(status) => return failure(&ctx, &principal, "Searching jobs", &status),
    };
    let page = context! {
        states => STATES,
        state => &search.state,
        job_type => &search.job_type,
        tenant => &search.tenant,
        error => &search.error,
        jobs => rows,
        next => if next.is_empty() { None } else { Some(format!("/console/jobs?{}&page={}", search.query(), encode(&next))) },
    };
    render(&ctx, Some(&principal), "jobs.html", page)
}

async fn incidents(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Query(mut search): Query<Search>,
) -> Response {
    search.state = "incident".into();
    let (rows, next) = match list(&ctx, &principal, &search).await {
        Ok(found) => found,
        Err(status) => return failure(&ctx, &principal, "Listing incidents", &status),
    };
    let page = context! {
        job_type => &search.job_type,
        tenant => &search.tenant,
        error => &search.error,
        jobs => rows,
        next => if next.is_empty() {
            None
        } else {
            Some(format!("/console/incidents?{}&page={}", search.query(), encode(&next)))
        },
    };
    render(&ctx, Some(&principal), "incidents.html", page)
}

#[derive(Deserialize, Default)]
struct Notice {
    #[serde(default)]
    done: String,
}

/// A job with its history, and what may be done with it.
async fn job(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(key): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let Ok(key) = key.parse::<u64>() else {
        let status = tonic::Status::invalid_argument(format!("{key:?} is not a job key (a decimal number)"));
        return failure(&ctx, &principal, "A job", &status);
    };
    let gateway = GatewayService::new(Arc::clone(&ctx));
    let request = GetJobRequest { key, include_history: true, ..Default::default() };
    let job = match gateway.get_job(as_principal(&principal, request)).await {
        Ok(answer) => answer.into_inner().job.unwrap_or_default(),
        Err(status) => return failure(&ctx, &principal, &format!("Job {key}"), &status),
    };
    let start = job.history.first().map_or(0, |e| e.at);
    let events: Vec<Value> = job
        .history
        .iter()
        .enumerate()
        .map(|(i, e)| {
            context! {
                offset => format!("{:+.3}s", (e.at - start) as f64 / 1000.0),
                at => time::utc(e.at),
                at_ms => e.at,
                kind => &e.kind,
                text => crate::client::describe_event(e, start),
                dropped_after => if i + 1 == 8 && job.history_dropped > 0 { Some(job.history_dropped) } else { None },
            }
        })
        .collect();
    let now = crate::auth::now_ms() as i64;
    let notice = match notice.done.as_str() {
        "retried" => Some("Retries set: the job is activatable again."),
        "cancelled" => Some("The job was cancelled."),
        _ => None,
    };
    let pretty = |json: &str| {
        serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| json.to_string())
    };
    let page = context! {
        key => job.key.to_string(),
        job_type => job.r#type,
        tenant => job.tenant_id,
        state => &job.state,
        retries => job.retries,
        attempt => job.attempt,
        worker => job.worker,
        session => if job.session_id == 0 { String::new() } else { format!("{:x}", job.session_id) },
        partition => job.partition_id,
        created => time::utc(job.created_at),
        created_ago => time::ago(now, job.created_at),
        due => if job.due_at > 0 { time::utc(job.due_at) } else { String::new() },
        deadline => if job.deadline > 0 { time::utc(job.deadline) } else { String::new() },
        error => job.error_message,
        reason => job.failure_reason,
        idempotency_key => job.idempotency_key,
        user => job.user,
        stage => job.stage,
        stages => job.stages,
        headers => job.custom_headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>(),
        variables => pretty(&job.variables),
        result => if job.result.is_empty() { String::new() } else { pretty(&job.result) },
        events => events,
        can_retry => job.state == "incident",
        can_cancel => !matches!(job.state.as_str(), "completed" | "cancelled"),
        notice => notice,
    };
    render(&ctx, Some(&principal), "job.html", page)
}

#[derive(Deserialize)]
struct RetryForm {
    retries: i32,
    #[serde(default)]
    back: String,
}

/// Where a form's action goes back to: the page it names, when it is a
/// console page; otherwise `fallback`.
fn back_to(back: &str, fallback: String) -> Redirect {
    if back.starts_with("/console") && !back.starts_with("//") {
        Redirect::to(back)
    } else {
        Redirect::to(&fallback)
    }
}

async fn retry(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(key): Path<u64>,
    Form(form): Form<RetryForm>,
) -> Response {
    let gateway = GatewayService::new(Arc::clone(&ctx));
    let request = UpdateJobRetriesRequest { key, retries: form.retries };
    match gateway.update_job_retries(as_principal(&principal, request)).await {
        Ok(_) => back_to(&form.back, format!("/console/jobs/{key}?done=retried")).into_response(),
        Err(status) => failure(&ctx, &principal, &format!("Retrying job {key}"), &status),
    }
}

#[derive(Deserialize)]
struct CancelForm {
    #[serde(default)]
    back: String,
}

async fn cancel(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Path(key): Path<u64>,
    Form(form): Form<CancelForm>,
) -> Response {
    let gateway = GatewayService::new(Arc::clone(&ctx));
    match gateway.cancel_job(as_principal(&principal, CancelJobRequest { key })).await {
        Ok(_) => back_to(&form.back, format!("/console/jobs/{key}?done=cancelled")).into_response(),
        Err(status) => failure(&ctx, &principal, &format!("Cancelling job {key}"), &status),
    }
}

#[derive(Deserialize)]
struct RetryAllForm {
    retries: i32,
    #[serde(default, rename = "type")]
    job_type: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    error: String,
}

/// Every incident matching the incidents page's filter gets `retries`.
async fn retry_all(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Form(form): Form<RetryAllForm>,
) -> Response {
    let search = Search { job_type: form.job_type, tenant: form.tenant, error: form.error, ..Default::default() };
    let mut filter = search.filter();
    filter.state = "incident".into();
    let gateway = GatewayService::new(Arc::clone(&ctx));
    let request = RetryJobsRequest { filter: Some(filter), retries: form.retries, dry_run: false };
    match gateway.retry_jobs(as_principal(&principal, request)).await {
        Ok(_) => Redirect::to(&format!("/console/incidents?{}", search.query())).into_response(),
        Err(status) => failure(&ctx, &principal, "Retrying incidents", &status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_post_must_come_from_this_server() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers), "no Origin: not a browser form");
        headers.insert(header::HOST, "127.0.0.1:9600".parse().unwrap());
        headers.insert(header::ORIGIN, "http://127.0.0.1:9600".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!same_origin(&headers));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("a=1; {COOKIE}=drv_secret; b=2").parse().unwrap());
        assert_eq!(cookie_token(&headers).as_deref(), Some("drv_secret"));
        assert_eq!(cookie_token(&HeaderMap::new()), None);
    }

    #[test]
    fn sign_in_returns_only_to_console_pages() {
        let to = |r: Response| r.headers()[header::LOCATION].to_str().unwrap().to_string();
        assert_eq!(to(sign_in("/console/jobs?state=incident")), "/console/login?next=/console/jobs%3Fstate%3Dincident");
        assert_eq!(to(sign_in("https://evil.example")), "/console/login?next=/console");
    }

    #[test]
    fn every_template_compiles() {
        let env = templates();
        for name in ["login.html", "cluster.html", "workers.html", "jobs.html", "job.html", "incidents.html"] {
            env.get_template(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
