//! Every RPC the client port serves passes the call layer before its handler:
//! walked from the contracts themselves (every method of every service in
//! `proto/` but the node-to-node one), so an RPC or a service added without
//! the layer fails here. Without a token each is UNAUTHENTICATED, with a
//! malformed `grpc-timeout` each is INVALID_ARGUMENT, before any handler
//! reads its message; gRPC's health service alone is open.

mod common;

use std::time::Duration;

use common::LocalNode;
use drover::auth::keys::{generate_secret, token_entry};
use prost::Message;
use tonic::Code;
use tonic_prost::ProstCodec;

/// The client port's RPCs: (`/package.Service/Method`), from the contracts.
fn client_rpcs() -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(drover::proto::DESCRIPTORS).expect("descriptors decode");
    let mut rpcs = Vec::new();
    for file in &set.file {
        let package = file.package();
        if package.starts_with("drover.cluster") {
            continue; // the node-to-node port's service, not the client port's
        }
        for service in &file.service {
            for method in &service.method {
                rpcs.push(format!("/{package}.{}/{}", service.name(), method.name()));
            }
        }
    }
    rpcs
}

/// Calls `path` with one empty message (every proto3 message reads empty
/// bytes), with `metadata` set, and returns the status it ends with.
async fn call(address: &str, path: &str, metadata: &[(&'static str, &str)]) -> tonic::Status {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(futures::stream::iter([()]));
    for (name, value) in metadata {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let codec = ProstCodec::<(), ()>::default();
    let answer = tokio::time::timeout(Duration::from_secs(10), grpc.streaming(request, path.parse().unwrap(), codec))
        .await
        .unwrap_or_else(|_| panic!("{path} did not answer within 10 s"));
    match answer {
        Err(status) => status,
        Ok(_) => tonic::Status::ok(format!("{path} answered")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_client_rpc_is_authenticated_and_deadlined_by_the_call_layer() {
    let dir = tempfile::tempdir().unwrap();
    let secret = generate_secret();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, token_entry("admin", &secret, &["*".into()], &["*".into()])).unwrap();
    let node = LocalNode::start_with(move |config| config.auth.tokens_file = Some(tokens)).await;
    let address = node.node().grpc_addr.to_string();
    let rpcs = client_rpcs();
    assert!(rpcs.len() > 30, "the contracts list the client API's RPCs: {rpcs:?}");
    assert!(rpcs.iter().any(|r| r == "/drover.v1.Gateway/CreateJob"), "{rpcs:?}");
    assert!(rpcs.iter().any(|r| r == "/gateway_protocol.Gateway/CompleteJob"), "{rpcs:?}");

    let bearer = format!("Bearer {secret}");
    for rpc in &rpcs {
        let anonymous = call(&address, rpc, &[]).await;
        assert_eq!(anonymous.code(), Code::Unauthenticated, "{rpc} without a token: {anonymous:?}");
        assert!(anonymous.message().contains("carries no token"), "{rpc}: {anonymous:?}");

        let bad_deadline = call(&address, rpc, &[("authorization", &bearer), ("grpc-timeout", "5s")]).await;
        assert_eq!(bad_deadline.code(), Code::InvalidArgument, "{rpc} with grpc-timeout 5s: {bad_deadline:?}");
        assert!(bad_deadline.message().contains("is not a gRPC timeout"), "{rpc}: {bad_deadline:?}");
    }

    // Probes carry no token: the health service answers without one.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let served = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(served.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}
