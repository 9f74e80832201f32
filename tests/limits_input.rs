//! What a node does with client input it must record, bound or refuse: failure
//! variables, `grpc-timeout` headers, tenant lists and invented job types.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{http_get, LocalNode, NodeProcess};
use drover::proto::cluster::{DeliverReply, DeliverRequest, ForwardRequest};
use drover::proto::gateway::*;
use tonic::metadata::MetadataValue;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_job_variables_are_merged_into_the_job_for_the_next_attempt() {
    let node = LocalNode::start().await;
    let key = node.client.create_job("invoice", r#"{"order":42,"step":"draft","note":"x"}"#).await.unwrap();
    let first = node.client.activate("invoice", "w", 1, 30_000, 0).await.unwrap().remove(0);

    let failure = FailJobRequest {
        key,
        attempt: first.attempt,
        retries: 2,
        error_message: "printer jammed".into(),
        retry_back_off: 0,
        variables: r#"{"step":"printed","tray":{"id":3}}"#.into(),
        ..Default::default()
    };
    node.client.raw().fail_job(failure).await.expect("fail with variables");

    let stored = node.client.get_job(key).await.unwrap();
    let variables: serde_json::Value = serde_json::from_str(&stored.variables).unwrap();
    assert_eq!(
        variables,
        serde_json::json!({"order": 42, "step": "printed", "note": "x", "tray": {"id": 3}}),
        "the failure's top-level keys replace the job's, the others stay"
    );
    assert_eq!(stored.error_message, "printer jammed");

    let second = node.client.activate("invoice", "w", 1, 30_000, 0).await.unwrap().remove(0);
    assert_eq!(second.attempt, first.attempt + 1);
    let seen: serde_json::Value = serde_json::from_str(&second.variables).unwrap();
    assert_eq!(seen, variables, "the next attempt sees the merged variables");

    // A failure without variables leaves them as they are.
    node.client.fail(key, second.attempt, 1, "again", 0).await.unwrap();
    let unchanged: serde_json::Value =
        serde_json::from_str(&node.client.get_job(key).await.unwrap().variables).unwrap();
    assert_eq!(unchanged, variables);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_job_variables_that_would_outgrow_the_payload_limit_are_refused() {
    let node = LocalNode::start_with(|c| c.limits.max_payload_bytes = 1024).await;
    let key = node.client.create_job("big", &format!(r#"{{"a":"{}"}}"#, "x".repeat(600))).await.unwrap();
    let job = node.client.activate("big", "w", 1, 30_000, 0).await.unwrap().remove(0);
    let failure = |variables: String| FailJobRequest {
        key,
        attempt: job.attempt,
        retries: 1,
        error_message: "boom".into(),
        retry_back_off: 0,
        variables,
        ..Default::default()
    };

    let status = node.client.raw().fail_job(failure("[1]".into())).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    let status = node.client.raw().fail_job(failure(format!(r#"{{"b":"{}"}}"#, "y".repeat(600)))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{}", status.message());
    assert!(status.message().contains("max_payload_bytes"), "{}", status.message());
    assert_eq!(node.client.get_job(key).await.unwrap().state, "activated", "a refused failure changes nothing");

    // Replacing a key with a smaller value fits.
    node.client.raw().fail_job(failure(r#"{"a":"small"}"#.into())).await.expect("fits after the merge");
    assert_eq!(node.client.get_job(key).await.unwrap().variables, r#"{"a":"small"}"#);
}

fn with_grpc_timeout<T>(message: T, value: &'static str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("grpc-timeout", MetadataValue::from_static(value));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_grpc_timeout_is_refused_and_the_node_keeps_serving() {
    let node = LocalNode::start().await;
    let mut raw = node.client.raw();
    let key = node.client.create_job("t", "{}").await.unwrap();

    let create = CreateJobRequest { r#type: "t".into(), variables: "{}".into(), ..Default::default() };
    let status = raw.create_job(with_grpc_timeout(create.clone(), "18446744073709551615S")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("grpc-timeout"), "{}", status.message());
    let status =
        raw.get_job(with_grpc_timeout(GetJobRequest { key, ..Default::default() }, "123456789m")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "nine digits are one too many: {status:?}");

    // The longest valid timeout works, and so does everything after.
    let job = raw
        .get_job(with_grpc_timeout(GetJobRequest { key, ..Default::default() }, "99999999H"))
        .await
        .expect("8 digits are valid");
    assert_eq!(job.into_inner().job.unwrap().key, key);
    raw.create_job(create).await.expect("the node still serves");

    // Node-to-node forwarding reads the header too; it falls back to the
    // default and goes on to judge the request itself.
    let mut cluster = common::peer(format!("http://{}", node.node().cluster_addr)).await.unwrap();
    let forward = ForwardRequest { partition_id: 0, commands: b"not bincode".to_vec().into(), ..Default::default() };
    let status = cluster.forward(with_grpc_timeout(forward, "18446744073709551615S")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("malformed forwarded commands"), "{}", status.message());
    node.client.create_job("t", "{}").await.expect("the node still serves");
}

fn activate_request(tenants: usize) -> ActivateJobsRequest {
    ActivateJobsRequest {
        r#type: "t".into(),
        timeout: 1_000,
        max_jobs_to_activate: 1,
        tenant_ids: (0..tenants).map(|i| format!("tenant-{i}")).collect(),
        ..Default::default()
    }
}

/// The next reply on a delivery stream, within 10 s.
async fn next_reply(replies: &mut tonic::Streaming<DeliverReply>) -> DeliverReply {
    let reply = tokio::time::timeout(Duration::from_secs(10), replies.message()).await;
    reply.expect("a reply within 10 s").expect("a reply, not an error").expect("the stream goes on")
}

/// On the delivery stream between nodes, a message of a kind this node does
/// not know (a newer node's) is answered as unsupported, under its id, so its
/// sender makes it a call; a forward this node cannot read is answered with
/// INVALID_ARGUMENT, as the call is; and the stream and the node go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_stream_answers_unknown_kinds_and_malformed_forwards() {
    let node = LocalNode::start().await;
    let mut cluster = common::peer(format!("http://{}", node.node().cluster_addr)).await.unwrap();
    let (requests, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let opened = cluster.deliver(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing)).await;
    let mut replies = opened.expect("the node opens a delivery stream").into_inner();
    requests.send(DeliverRequest { id: 7, ..Default::default() }).unwrap();
    let reply = next_reply(&mut replies).await;
    assert_eq!(reply.id, 7, "{reply:?}");
    assert!(reply.unsupported && reply.push.is_none() && reply.forward.is_none(), "{reply:?}");

    let forward = ForwardRequest {
        partition_id: 0,
        commands: b"not bincode".to_vec().into(),
        timeout_ms: 5_000,
        ..Default::default()
    };
    requests.send(DeliverRequest { id: 8, forward: Some(forward), ..Default::default() }).unwrap();
    let reply = next_reply(&mut replies).await;
    assert_eq!(reply.id, 8, "{reply:?}");
    assert!(!reply.unsupported, "a forward is a kind the node knows: {reply:?}");
    let answer = reply.forward.expect("the forward's reply");
    assert_eq!(answer.code, Code::InvalidArgument as i32, "{answer:?}");
    assert!(answer.message.contains("malformed forwarded commands"), "{}", answer.message);
    node.client.create_job("t", "{}").await.expect("the node still serves");
}

/// A delivery stream a peer opened while this node was still starting (its
/// cluster port answers before the node serves, and a peer whose stream
/// broke with this node's restart opens the next one at once) serves once
/// the node has started: each message is answered by the node as it is when
/// the message arrives, never as it was when the stream opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_stream_opened_while_the_node_starts_serves_once_it_has() {
    // Each test runs in its own process (nextest): only this node holds.
    std::env::set_var("DROVER_FAILPOINTS", "start_hold=1@3000");
    let port = common::free_port();
    let starting = tokio::spawn(LocalNode::start_with(move |config| {
        config.cluster_addr = format!("127.0.0.1:{port}").parse().expect("literal");
    }));
    let address = format!("http://127.0.0.1:{port}");
    let mut cluster = None;
    for _ in 0..100 {
        if let Ok(client) = common::peer(address.clone()).await {
            cluster = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut cluster = cluster.expect("the starting node's cluster port accepts within 2 s");
    let (requests, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let opened = cluster.deliver(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing)).await;
    let mut replies = opened.expect("a starting node opens a delivery stream").into_inner();
    let list_sessions = || ForwardRequest {
        partition_id: 0,
        commands: bincode::serialize(&vec![drover::core::Command::ListSessions]).unwrap().into(),
        timeout_ms: 5_000,
        ..Default::default()
    };

    requests.send(DeliverRequest { id: 1, forward: Some(list_sessions()), ..Default::default() }).unwrap();
    let early = next_reply(&mut replies).await.forward.expect("the forward's reply");
    assert!(
        early.code == Code::Unavailable as i32 && early.message.contains("starting"),
        "the stream did not open while the node was starting (the start-up hold did not hold): {early:?}"
    );

    let node = starting.await.expect("the node's start-up task");
    requests.send(DeliverRequest { id: 2, forward: Some(list_sessions()), ..Default::default() }).unwrap();
    let reply = next_reply(&mut replies).await;
    assert_eq!(reply.id, 2, "{reply:?}");
    let answer = reply.forward.expect("the forward's reply");
    assert_eq!(answer.code, Code::Ok as i32, "the node has started, yet its stream still says: {answer:?}");
    let results: Vec<drover::core::CommandResult> = bincode::deserialize(&answer.results).unwrap();
    assert!(matches!(results.as_slice(), [drover::core::CommandResult::Sessions(s)] if s.is_empty()), "{results:?}");
    node.client.create_job("t", "{}").await.expect("the node serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_lists_and_tenant_ids_are_bounded() {
    let node = LocalNode::start().await;
    let mut raw = node.client.raw();

    raw.activate_jobs(activate_request(100)).await.expect("100 tenants are allowed");
    let status = raw.activate_jobs(activate_request(101)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("tenant_ids") && status.message().contains("100"), "{}", status.message());

    let stream = StreamActivatedJobsRequest {
        r#type: "t".into(),
        timeout: 1_000,
        tenant_ids: activate_request(101).tenant_ids,
        ..Default::default()
    };
    let status = raw.stream_activated_jobs(stream).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    let long_tenant = CreateJobRequest { r#type: "t".into(), tenant_id: "x".repeat(300), ..Default::default() };
    let status = raw.create_job(long_tenant).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("tenant_id"), "{}", status.message());
    let mut long_in_list = activate_request(1);
    long_in_list.tenant_ids[0] = "x".repeat(300);
    assert_eq!(raw.activate_jobs(long_in_list).await.unwrap_err().code(), Code::InvalidArgument);
}

/// The values of `label` on the samples of `family` in a Prometheus text page.
fn label_values(page: &str, family: &str, label: &str) -> BTreeSet<String> {
    let needle = format!("{label}=\"");
    page.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| {
            let start = l.find(&needle)? + needle.len();
            Some(l[start..].split('"').next()?.to_string())
        })
        .collect()
}

fn sample(page: &str, family: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_job_types_and_methods_do_not_grow_the_metrics_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    node.wait_ready().await;
    let client = node.client().await;
    let limit = drover::metrics::MAX_JOB_TYPE_LABELS;
    let extra = 25;

    let requests: Vec<CreateJobRequest> = (0..limit + extra)
        .map(|i| CreateJobRequest { r#type: format!("invented-{i}"), ..Default::default() })
        .collect();
    let mut answers = client.raw().create_jobs(futures::stream::iter(requests)).await.unwrap().into_inner();
    let mut created = 0;
    while let Some(answer) = answers.message().await.unwrap() {
        assert!(answer.error.is_none(), "{:?}", answer.error);
        created += 1;
    }
    assert_eq!(created, limit + extra);

    // A method the gateway does not have answers UNIMPLEMENTED and must not
    // become a label of its own.
    let mut grpc = tonic::client::Grpc::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc)).unwrap().connect().await.unwrap(),
    );
    grpc.ready().await.unwrap();
    let invented: Result<tonic::Response<TopologyResponse>, _> = grpc
        .unary(
            tonic::Request::new(TopologyRequest {}),
            "/drover.v1.Gateway/InventedMethod".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(invented.unwrap_err().code(), Code::Unimplemented);

    // The gauges are published every second: wait for the overflow types to show.
    let started = std::time::Instant::now();
    let page = loop {
        let page = http_get(&node.admin, "/metrics").await.map(|(_, body)| body).unwrap_or_default();
        if sample(&page, "drover_jobs_activatable", &["type=\"other\""]) == extra as f64 {
            break page;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no drover_jobs_activatable{{type=\"other\"}} of {extra}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let types = label_values(&page, "drover_jobs_total", "type");
    assert!(types.len() <= limit + 1, "{} type labels; at most {limit} and \"other\"", types.len());
    assert!(types.contains("other"));
    assert_eq!(sample(&page, "drover_jobs_total", &["type=\"other\"", "outcome=\"created\""]), extra as f64);
    let gauge_types = label_values(&page, "drover_jobs_activatable", "type");
    assert!(gauge_types.len() <= limit + 1, "{} type labels on the gauge", gauge_types.len());
    let methods = label_values(&page, "drover_grpc_requests_total", "method");
    assert!(!methods.contains("InventedMethod"), "{methods:?}");
}
