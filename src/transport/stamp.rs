//! Calls between nodes name their sender and its data version, both ways:
//! [`Stamped`] on the calling side (what a peer client sends through), and
//! [`Admit`] around the cluster service on the answering side. Each side
//! learns the other's version from them ([`Versions::heard`]), and the
//! answering side refuses a caller whose version the cluster can no longer
//! speak with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;

use super::versions::{Versions, NODE_HEADER, VERSION_HEADER};
use crate::codec::DATA_VERSION;
use crate::core::NodeId;

/// The node id and data version a request or answer names in its metadata.
pub fn sender_of(headers: &http::HeaderMap) -> (Option<NodeId>, Option<u16>) {
    let number = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    (number(NODE_HEADER), number(VERSION_HEADER).and_then(|v| u16::try_from(v).ok()))
}

fn stamp(headers: &mut http::HeaderMap, node: NodeId) {
    headers.insert(NODE_HEADER, http::HeaderValue::from(node));
    headers.insert(VERSION_HEADER, http::HeaderValue::from(DATA_VERSION));
}

/// A channel to peer `peer` that stamps every call with this node's id and
/// version, and learns the peer's from every answer.
#[derive(Clone)]
pub struct Stamped {
    inner: tonic::transport::Channel,
    peer: NodeId,
    versions: Arc<Versions>,
}

impl Stamped {
    pub fn new(inner: tonic::transport::Channel, peer: NodeId, versions: Arc<Versions>) -> Self {
        Stamped { inner, peer, versions }
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Stamped {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        stamp(request.headers_mut(), self.versions.own_node());
        let answered = tower::Service::call(&mut self.inner, request);
        let (peer, versions) = (self.peer, Arc::clone(&self.versions));
        Box::pin(async move {
            let response = answered.await?;
            let (node, version) = sender_of(response.headers());
            // An answer without our metadata is not the peer's (a proxy's
            // error, a connection refused): it says nothing of its version.
            if node == Some(peer) {
                versions.heard(peer, version);
            }
            Ok(response)
        })
    }
}

/// Wraps the cluster service: learns each caller's version, refuses a caller
/// the cluster cannot speak with (FAILED_PRECONDITION, saying why), and
/// stamps every answer with this node's id and version.
#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    versions: Arc<Versions>,
}

impl<S> Admit<S> {
    pub fn new(inner: S, versions: Arc<Versions>) -> Self {
        Admit { inner, versions }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Admit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for Admit<S>
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

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (node, version) = sender_of(request.headers());
        let own = self.versions.own_node();
        if let Some(node) = node {
            self.versions.heard(node, version);
        }
        if let Err(why) = self.versions.admit(node, version) {
            let mut response = tonic::Status::failed_precondition(why).into_http::<tonic::body::Body>();
            stamp(response.headers_mut(), own);
            return Box::pin(std::future::ready(Ok(response)));
        }
        let answered = self.inner.call(request);
        Box::pin(async move {
            let mut response = answered.await?;
            stamp(response.headers_mut(), own);
            Ok(response)
        })
    }
}
