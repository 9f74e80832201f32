//! Counts client gRPC requests by method and status code, as a wrapper around
//! the gateway service. Errors answered before any message (every
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
}

impl<S> Observe<S> {
    pub fn new(inner: S) -> Self {
        Observe { inner }
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
            metrics::counter!("drover_grpc_requests_total", "method" => method, "code" => code).increment(1);
            Ok(response)
        })
    }
}
