//! The call layer: what every RPC on the client port gets before its handler
//! runs, wrapped around each service the port serves (inside the request
//! counter, so refused calls are counted too), so a new RPC is
//! authenticated, admitted, deadlined, drained at shutdown and traced by
//! construction.
//!
//! For each call it
//! - authenticates the caller (`authorization: Bearer ...`) and admits it
//!   against its rate limit: UNAUTHENTICATED or RESOURCE_EXHAUSTED before any
//!   handler runs;
//! - parses `grpc-timeout` into the call's deadline (INVALID_ARGUMENT for a
//!   header that is not a gRPC timeout; the node's request timeout without one);
//! - counts the call in flight until its handler has answered, so a stopping
//!   node waits for it;
//! - continues the caller's trace (`traceparent`) in a `gateway.<rpc>` span
//!   while spans are exported;
//! - hands the handler a [`Call`] in the request's extensions.
//!
//! Handlers read the [`Call`] with [`Call::of`]; one that finds none answers
//! INTERNAL, so a service that bypassed the layer fails loudly, never open.
//! What a call may do with a given job (its type, its tenant) is decided
//! below, by the job API and at the partition, not here.
//!
//! Only gRPC's health service is served without a principal: probes carry
//! no token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::codegen::http;
use tracing::Instrument;

use crate::auth::Principal;
use crate::context::{InFlight, NodeContext};
use crate::leaders::ApiError;

/// The services on the client port that need no principal.
pub const OPEN_SERVICES: &[&str] = &["grpc.health.v1.Health"];

/// What the call layer learnt of a call: who makes it, by when it must be
/// answered, and the trace it continues.
#[derive(Clone, Debug)]
pub struct Call {
    pub principal: Arc<Principal>,
    /// When the answer is due: the caller's `grpc-timeout`, or the node's
    /// request timeout without one.
    pub deadline: Instant,
    /// The caller's own deadline, when it sent one: waits that answer "not
    /// yet" (a long poll, AwaitJob) end in time for the caller to hear it.
    pub caller_deadline: Option<Instant>,
    /// The caller's W3C `traceparent`, empty without one.
    pub traceparent: String,
}

impl Call {
    /// The call the layer put in `request`'s extensions.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Call, ApiError> {
        request.extensions().get::<Call>().cloned().ok_or_else(|| {
            ApiError::Internal(
                "this call did not pass the gateway's call layer (a server built without it); nothing was done".into(),
            )
        })
    }

    /// A call made inside this node on behalf of `principal` (the console,
    /// a facade's own follow-up), due within `timeout`.
    pub fn internal(principal: Arc<Principal>, timeout: Duration) -> Call {
        Call { principal, deadline: Instant::now() + timeout, caller_deadline: None, traceparent: String::new() }
    }

    /// The broker acting on its own (raising an incident, say).
    pub fn system(timeout: Duration) -> Call {
        Call::internal(Arc::new(Principal::system()), timeout)
    }
}

/// Puts [`CallService`] around each of the client port's services.
#[derive(Clone)]
pub struct CallLayer {
    ctx: Arc<NodeContext>,
}

impl CallLayer {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        CallLayer { ctx }
    }
}

impl<S> tower::Layer<S> for CallLayer {
    type Service = CallService<S>;

    fn layer(&self, inner: S) -> CallService<S> {
        CallService { inner, ctx: Arc::clone(&self.ctx) }
    }
}

#[derive(Clone)]
pub struct CallService<S> {
    inner: S,
    ctx: Arc<NodeContext>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for CallService<S> {
    const NAME: &'static str = S::NAME;
}

/// The call's service and method (`drover.v1.Gateway`, `CreateJob`) from its path.
fn service_and_method(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.split_once('/').unwrap_or((path, ""))
}

/// `CreateJob` as `create_job`.
fn snake_case(method: &str) -> String {
    let mut out = String::with_capacity(method.len() + 4);
    for (i, c) in method.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A request admitted on one of the node's ports: the [`Call`] its handler
/// gets, counted in flight until this drops (a stopping node waits for it),
/// in the span that continues the caller's trace.
pub struct Admitted {
    pub call: Call,
    pub span: tracing::Span,
    _running: InFlight,
}

impl Admitted {
    /// Runs `handler` in the call's span, the call counted in flight until
    /// it has answered.
    pub async fn serve<F: Future>(self, handler: F) -> F::Output {
        let Admitted { span, _running, .. } = self;
        let answer = handler.instrument(span).await;
        drop(_running);
        answer
    }
}

/// Where a request comes in, for its span: the protocol's service
/// (`drover.v1.Gateway`, `ojs`, `admin`) and the span's name.
pub struct Door<'a> {
    pub service: &'a str,
    /// The RPC, or the HTTP method and route.
    pub method: &'a str,
    pub span_name: &'a dyn Fn() -> String,
    /// The caller's bearer token, when it comes another way than the
    /// `authorization` header (the console's sign-in cookie).
    pub token: Option<&'a str>,
}

/// Admits a request with these headers, the one admission of every port
/// (gRPC's call layer, the OJS port, the admin port): authenticates the
/// caller (`authorization: Bearer ...`, or the door's token), admits it
/// against its rate limit, parses its deadline (`grpc-timeout`; the node's
/// request timeout without one), counts it in flight and opens its span.
/// The error is what it is refused with.
pub fn admit(ctx: &NodeContext, headers: &http::HeaderMap, door: Door<'_>) -> Result<Admitted, ApiError> {
    let caller_deadline = match headers.get("grpc-timeout") {
        None => None,
        Some(header) => {
            let text = header.to_str().unwrap_or_default();
            let timeout = crate::leaders::parse_grpc_timeout(text).ok_or_else(|| {
                ApiError::InvalidArgument(format!(
                    "the grpc-timeout header {text:?} is not a gRPC timeout: it must be 1 to {} digits and a \
                     unit (H, M, S, m, u or n), like 30S",
                    crate::leaders::MAX_GRPC_TIMEOUT_DIGITS
                ))
            })?;
            // Eight digits of hours fit any clock we run on; should one
            // not, the call gets the node's default.
            crate::leaders::deadline_after(timeout)
        }
    };
    let bearer = door.token.map(|token| format!("Bearer {token}"));
    let authorization = match &bearer {
        Some(bearer) => Some(bearer.as_str()),
        None => headers.get("authorization").map(|v| v.to_str().unwrap_or("?")),
    };
    let principal = ctx.auth.authenticate(authorization)?;
    ctx.auth.admit(&principal)?;
    let deadline = caller_deadline.unwrap_or_else(|| Instant::now() + ctx.settings.request_timeout);
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let call = Call { principal, deadline, caller_deadline, traceparent };
    let span = if crate::trace_context::exporting() {
        let name = (door.span_name)();
        let span = tracing::info_span!(
            "gateway.call",
            otel.name = %name,
            rpc.service = %door.service,
            rpc.method = %door.method,
            key = tracing::field::Empty,
        );
        crate::trace_context::continue_trace(&span, &call.traceparent);
        span
    } else {
        tracing::Span::none()
    };
    Ok(Admitted { call, span, _running: ctx.gateway.request_started() })
}

impl<S, B> tower::Service<http::Request<B>> for CallService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let (service, method) = service_and_method(request.uri().path());
        if OPEN_SERVICES.contains(&service) {
            return Box::pin(self.inner.call(request));
        }
        let span_name = || format!("gateway.{}", snake_case(method));
        let door = Door { service, method, span_name: &span_name, token: None };
        let admitted = match admit(&self.ctx, request.headers(), door) {
            Ok(admitted) => admitted,
            Err(error) => {
                let status: tonic::Status = error.into();
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        request.extensions_mut().insert(admitted.call.clone());
        let answered = self.inner.call(request);
        Box::pin(admitted.serve(answered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_service_and_method() {
        assert_eq!(service_and_method("/drover.v1.Gateway/CreateJob"), ("drover.v1.Gateway", "CreateJob"));
        assert_eq!(service_and_method("/grpc.health.v1.Health/Check"), ("grpc.health.v1.Health", "Check"));
        assert_eq!(service_and_method("/nonsense"), ("nonsense", ""));
        assert_eq!(snake_case("StreamActivatedJobBatches"), "stream_activated_job_batches");
    }
}
