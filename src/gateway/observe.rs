//! Counts gRPC requests by method and status code, as a wrapper around a
//! service: the gateway's client services (`drover_grpc_requests_total`) and
//! the cluster service between nodes (`drover_cluster_requests_total`, the
//! messages a job costs between nodes). Errors answered before any message (every
//! unary error) carry their code in the response headers; a response without
//! one is counted as `Ok` (for streams: opened). Paths the gateway does not
//! serve answer UNIMPLEMENTED and are counted as `method="unknown"`, so a
//! client inventing paths adds no series.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metric: &'static str,
}

impl<S> Observe<S> {
    /// Counts a client service's requests.
    pub fn new(inner: S) -> Self {
        Observe { inner, metric: crate::metrics::GRPC_REQUESTS }
    }

    /// Counts the cluster service's requests (from other nodes).
    pub fn cluster(inner: S) -> Self {
        Observe { inner, metric: crate::metrics::CLUSTER_REQUESTS }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Observe<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or("unknown").to_string();
        let future = self.inner.call(request);
        let metric = self.metric;
        Box::pin(async move {
            let response = future.await?;
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(tonic::Code::from_i32)
                .unwrap_or(tonic::Code::Ok);
            // The path is the client's to choose; only methods the gateway has
            // (it never answers UNIMPLEMENTED itself) get a label of their own.
            let method = if code == tonic::Code::Unimplemented { "unknown".to_string() } else { method };
            let code = format!("{code:?}");
            metrics::counter!(metric, "method" => method, "code" => code).increment(1);
            Ok(response)
        })
    }
}
