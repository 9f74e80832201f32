//! The Open Job Spec's HTTP binding (`/ojs/v1/...`, docs/ojs.md): OJS's
//! job envelope, worker endpoints, dead-letter queue and error catalog,
//! served on the node's own OJS port.
//!
//! An adapter like [`super::zeebe`]: every request becomes calls of the typed
//! job API ([`super::JobApi`]), which authorizes them, so OJS clients get the
//! same tokens, scopes, tenants and limits as gRPC clients, and a job made
//! here is the same job on drover.v1. Each request passes the same admission
//! as a gRPC call ([`super::call`]): its bearer token is authenticated and
//! rate-limited, its in-flight count lets a stopping node drain it, and it
//! continues the caller's trace (`traceparent`) while spans are exported. Only
//! `/ojs/v1/health` and `/ojs/manifest` need no token.
//!
//! Decisions OJS leaves to the server, made in the job's partition where
//! they must be (fencing, retries left) and here where they may be (the
//! back-off a policy gives, a unique key's generation): see [`worker`],
//! [`jobs`] and [`envelope`].

mod cron;
mod dead_letter;
mod envelope;
mod events;
pub mod ids;
mod jobs;
mod limits;
mod queues;
mod retry;
mod time;
mod worker;
mod workflows;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::api::{ApiError, Call, JobApi};
use crate::context::NodeContext;

/// OJS's media type; every answer carries it.
pub const MEDIA_TYPE: &str = "application/openjobspec+json";
/// The OJS version this binding speaks.
pub const SPEC_VERSION: &str = "1.0";

/// What each handler gets.
#[derive(Clone)]
pub(crate) struct Ojs {
    api: JobApi,
    ctx: Arc<NodeContext>,
    /// OJS workers' sessions this gateway registered, and when it last
    /// renewed each (see `worker`).
    sessions: Arc<std::sync::Mutex<std::collections::HashMap<u64, std::time::Instant>>>,
}

/// Serves the OJS binding on `listener` until `stop`.
pub async fn serve(
    ctx: Arc<NodeContext>,
    listener: TcpListener,
    tls: Option<Arc<crate::tls::ReloadingServer>>,
    mut stop: watch::Receiver<bool>,
) {
    let app = routes(Arc::clone(&ctx));
    let listener = crate::tls::HttpListener::new(listener, tls, stop.clone());
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        tracing::error!("OJS server failed: {e}");
    }
}

/// The paths served, with `{id}` for a job id (the metrics' route labels).
const ROUTES: [&str; 23] = [
    "/ojs/manifest",
    "/ojs/v1/health",
    "/ojs/v1/jobs",
    "/ojs/v1/jobs/batch",
    "/ojs/v1/jobs/{id}",
    "/ojs/v1/workers/fetch",
    "/ojs/v1/workers/ack",
    "/ojs/v1/workers/nack",
    "/ojs/v1/workers/heartbeat",
    "/ojs/v1/dead-letter",
    "/ojs/v1/dead-letter/{id}",
    "/ojs/v1/dead-letter/{id}/retry",
    "/ojs/v1/admin/jobs/bulk/cancel",
    "/ojs/v1/queues",
    "/ojs/v1/events",
    "/ojs/v1/events/stream",
    "/ojs/v1/queues/{name}/stats",
    "/ojs/v1/queues/{name}/pause",
    "/ojs/v1/queues/{name}/resume",
    "/ojs/v1/cron",
    "/ojs/v1/cron/{name}",
    "/ojs/v1/workflows",
    "/ojs/v1/workflows/{id}",
];

fn routes(ctx: Arc<NodeContext>) -> Router {
    let state = Ojs { api: JobApi::new(Arc::clone(&ctx)), ctx: Arc::clone(&ctx), sessions: Default::default() };
    Router::new()
        .route("/ojs/manifest", get(manifest))
        .route("/ojs/v1/health", get(health))
        .route("/ojs/v1/jobs", post(jobs::enqueue))
        .route("/ojs/v1/jobs/batch", post(jobs::enqueue_batch))
        .route("/ojs/v1/jobs/{id}", get(jobs::info).delete(jobs::cancel))
        .route("/ojs/v1/workers/fetch", post(worker::fetch))
        .route("/ojs/v1/workers/ack", post(worker::ack))
        .route("/ojs/v1/workers/nack", post(worker::nack))
        .route("/ojs/v1/workers/heartbeat", post(worker::heartbeat))
        .route("/ojs/v1/dead-letter", get(dead_letter::list))
        .route("/ojs/v1/dead-letter/{id}", axum::routing::delete(dead_letter::delete))
        .route("/ojs/v1/dead-letter/{id}/retry", post(dead_letter::retry))
        .route("/ojs/v1/admin/jobs/bulk/cancel", post(jobs::bulk_cancel))
        .route("/ojs/v1/queues", get(queues::list))
        .route("/ojs/v1/cron", get(cron::list).post(cron::register))
        .route("/ojs/v1/cron/{name}", get(cron::get).delete(cron::delete).patch(cron::toggle))
        .route("/ojs/v1/workflows", post(workflows::create))
        .route("/ojs/v1/workflows/{id}", get(workflows::get).delete(workflows::cancel))
        .route("/ojs/v1/events", get(events::list))
        .route("/ojs/v1/events/stream", get(events::stream))
        .route("/ojs/v1/queues/{name}/stats", get(queues::stats))
        .route("/ojs/v1/queues/{name}/pause", post(queues::pause))
        .route("/ojs/v1/queues/{name}/resume", post(queues::resume))
        .fallback(|| async { OjsError::not_found("no OJS endpoint at this path (docs/ojs.md lists them)") })
        .method_not_allowed_fallback(|| async {
            OjsError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        // A batch of jobs at the payload limit each still fits.
        .layer(axum::extract::DefaultBodyLimit::max(ctx.settings.limits.max_request_bytes()))
        .layer(axum::middleware::from_fn_with_state(ctx, admit))
        .with_state(state)
}

/// An admitted request: the call, and the tenant it acts in: OJS's tenant
/// header `X-OJS-Tenant`, the default tenant without one. (`meta.tenant_id`
/// is the producer's metadata, kept as such: OJS clients send it on jobs
/// they then fetch without naming a tenant.)
#[derive(Clone)]
pub(crate) struct OjsCall {
    call: Call,
    tenant: String,
}

impl OjsCall {
    /// The tenant a listing or bulk action covers: the header's, the
    /// default tenant without one (never every tenant the token holds).
    pub(crate) fn scope(&self) -> String {
        if self.tenant.is_empty() {
            crate::core::DEFAULT_TENANT.to_string()
        } else {
            self.tenant.clone()
        }
    }
}

impl std::ops::Deref for OjsCall {
    type Target = Call;

    fn deref(&self) -> &Call {
        &self.call
    }
}

/// The header OJS names a request's tenant in.
const TENANT_HEADER: &str = "x-ojs-tenant";

/// A path with its job id and queue name replaced, as a span names it (ids
/// would make every span name unique).
fn route_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    let named = |i: usize| i == 4 && matches!(parts[..4], ["", "ojs", "v1", "queues" | "cron"]);
    let parts: Vec<&str> = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            if ids::is_uuidv7(part) {
                "{id}"
            } else if named(i) {
                "{name}"
            } else {
                part
            }
        })
        .collect();
    parts.join("/")
}

/// The paths served without a token: probes and discovery.
fn is_open(path: &str) -> bool {
    matches!(path, "/ojs/manifest" | "/ojs/v1/health")
}

/// Admits a request as the call layer admits a gRPC call, counts it in
/// flight, and stamps OJS's headers on the answer.
async fn admit(State(ctx): State<Arc<NodeContext>>, mut request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = format!("{} {}", request.method(), route_of(request.uri().path()));
    let mut response = if is_open(request.uri().path()) {
        next.run(request).await
    } else {
        let span_name = || format!("ojs {route}");
        let door = super::call::Door { service: "ojs", method: &route, span_name: &span_name, token: None };
        match super::call::admit(&ctx, request.headers(), door) {
            Ok(admitted) => {
                let tenant = match request.headers().get(TENANT_HEADER).map(|v| v.to_str()) {
                    None => String::new(),
                    Some(Ok(tenant)) => tenant.to_string(),
                    Some(Err(_)) => {
                        return OjsError::invalid("X-OJS-Tenant must be a visible ASCII string").into_response();
                    }
                };
                request.extensions_mut().insert(OjsCall { call: admitted.call.clone(), tenant });
                admitted.serve(next.run(request)).await
            }
            Err(error) => OjsError::from(error).into_response(),
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
    headers.insert("ojs-version", HeaderValue::from_static(SPEC_VERSION));
    // Paths that are not routes (a scan, a malformed id) share one label.
    let route = if ROUTES.iter().any(|r| route.ends_with(&format!(" {r}"))) { route } else { "other".into() };
    let status = response.status().as_u16().to_string();
    metrics::counter!(crate::metrics::OJS_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!(crate::metrics::OJS_REQUEST_SECONDS, "route" => route).record(started.elapsed().as_secs_f64());
    response
}

/// An error as OJS's catalog answers it: `{"error": {code, message,
/// retryable, hint, docs_url}}` with its HTTP status.
#[derive(Debug)]
pub(crate) struct OjsError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retryable: bool,
}

impl OjsError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let retryable = status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS;
        OjsError { status, code, message: message.into(), retryable }
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        OjsError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// An enqueue the envelope's checks refused.
    pub(crate) fn refused(invalid: envelope::Invalid) -> Self {
        if invalid.unprocessable {
            OjsError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", invalid.message)
        } else {
            OjsError::invalid(invalid.message)
        }
    }

    /// A job larger than the node keeps (not a rate limit: retrying will
    /// not help).
    fn too_large(bytes: usize, limit: usize) -> Self {
        OjsError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "envelope_too_large",
            format!("the job's args, meta and options take {bytes} bytes; this node keeps at most {limit} per job"),
        )
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        OjsError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        OjsError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub(crate) fn duplicate(message: impl Into<String>) -> Self {
        OjsError::new(StatusCode::CONFLICT, "duplicate", message)
    }

    /// This error, not retryable when it says the outcome is unknown: for an
    /// enqueue without an id, whose retry may make a second job.
    pub(crate) fn unless_outcome_unknown(mut self) -> Self {
        if self.code == "timeout" {
            self.retryable = false;
        }
        self
    }

    fn hint(&self) -> &'static str {
        match self.code {
            "invalid_request" | "invalid_payload" => "fix the request as the message says and send it again",
            "not_found" => {
                "check the job id; a client's own id is found for the de-duplication window (24 h by default)"
            }
            "conflict" => {
                "read the job (GET /ojs/v1/jobs/{id}) to see its state; only an active job is acked or nacked"
            }
            "duplicate" => "a job with this id or unique key exists; read it instead of creating it again",
            "unauthenticated" => "send Authorization: Bearer <token>",
            "forbidden" => "ask for a token with the scope, job type and tenant the request needs",
            "rate_limited" => "slow down and retry after a pause",
            "envelope_too_large" => "store large data elsewhere and pass a reference in args",
            "timeout" => {
                "the request may or may not have taken effect: read before sending it again; an enqueue with an \
                 id is safe to send again"
            }
            _ => "retry later; if it persists, see the node's log and /actuator/partitions",
        }
    }

    fn body(&self) -> Value {
        let kind = match self.code {
            "invalid_request" | "invalid_payload" => "validation_error",
            code => code,
        };
        json!({ "error": {
            "code": self.code,
            "type": kind,
            "message": self.message,
            "retryable": self.retryable,
            "hint": self.hint(),
            "docs_url": "docs/ojs.md#errors",
        }})
    }
}

impl From<ApiError> for OjsError {
    fn from(error: ApiError) -> Self {
        let message = error.to_string();
        let (status, code) = match error {
            ApiError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::FailedPrecondition(_) | ApiError::Finished(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::ResourceExhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            ApiError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::Unavailable(_) | ApiError::OutOfReach(_) => (StatusCode::SERVICE_UNAVAILABLE, "backend_error"),
            ApiError::OutcomeUnknown(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "backend_error"),
        };
        OjsError::new(status, code, message)
    }
}

impl IntoResponse for OjsError {
    fn into_response(self) -> Response {
        (self.status, self.body().to_string()).into_response()
    }
}

/// A JSON answer with `status`.
pub(crate) fn reply(status: StatusCode, body: Value) -> Response {
    (status, body.to_string()).into_response()
}

/// A request body as JSON; an empty or malformed one is OJS's invalid_payload.
pub(crate) fn body_json(bytes: &Bytes) -> Result<Value, OjsError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = if bytes.is_empty() { "the request has no body".to_string() } else { format!("{e}") };
        OjsError::new(StatusCode::BAD_REQUEST, "invalid_payload", format!("the body must be JSON: {what}"))
    })
}

/// The admitted call, as a handler's argument: the admission middleware put
/// it on the request.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for OjsCall {
    type Rejection = OjsError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, OjsError> {
        parts.extensions.get::<OjsCall>().cloned().ok_or_else(|| {
            ApiError::Internal("the OJS request did not pass the port's admission; nothing was done".into()).into()
        })
    }
}

/// A request body read as JSON, as a handler's argument: an empty or
/// malformed body is invalid_payload, one over the request limit
/// envelope_too_large.
pub(crate) struct JsonBody(pub Value);

impl<S: Send + Sync> axum::extract::FromRequest<S> for JsonBody {
    type Rejection = OjsError;

    async fn from_request(request: Request, state: &S) -> Result<Self, OjsError> {
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                OjsError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "envelope_too_large",
                    "the request is larger than this node takes; store large data elsewhere and pass a reference",
                )
            } else {
                OjsError::new(StatusCode::BAD_REQUEST, "invalid_payload", rejection.body_text())
            }
        })?;
        body_json(&bytes).map(JsonBody)
    }
}

pub(crate) fn now_ms() -> i64 {
    crate::auth::now_ms() as i64
}

async fn manifest(State(ojs): State<Ojs>) -> Response {
    reply(
        StatusCode::OK,
        json!({
            "specversion": SPEC_VERSION,
            "implementation": {
                "name": "drover",
                "version": env!("CARGO_PKG_VERSION"),
                "language": "rust",
                "backend": "raft+rocksdb",
            },
            // A level is declared only when every case of it and of every
            // level below passes (the spec's hierarchy). Levels 2 to 4 pass
            // whole, but four level-1 cases fail on purpose (docs/ojs.md,
            // "Conformance"), so the level Drover may declare is 0.
            "conformance_level": 0,
            "conformance_tier": "runtime",
            "backend": "raft+rocksdb",
            "protocols": ["http"],
            "capabilities": {
                "priority": true, "unique_jobs": true, "batch_enqueue": true, "dead_letter": true,
                "retries": true, "visibility_timeout": true, "heartbeat": true, "events": true,
                "queue_pause": true, "cron": true, "expiry": true, "workflows": true,
            },
            "partitions": ojs.ctx.topology.partition_count(),
        }),
    )
}

/// 200 `ok` while this node knows a leader for each partition it hosts
/// (what `/ready` on the admin port says), 503 `degraded` otherwise.
async fn health(State(ojs): State<Ojs>) -> Response {
    let (status, word) =
        if ojs.ctx.routing.ready() { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "degraded") };
    reply(status, json!({ "status": word, "version": env!("CARGO_PKG_VERSION") }))
}
