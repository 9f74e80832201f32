//! The Zeebe gateway (`gateway_protocol.Gateway`) on a real node, through a
//! client generated from Zeebe's published protocol: Zeebe's semantics where
//! they differ from Drover's, the fencing of stale activations, gzip, health,
//! and Zeebe streams sharing Drover's aggregation. Published clients run in
//! `zeebe_clients.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, http_get, LocalNode};
use drover::proto::gateway as pb;
use drover::proto::zeebe as zb;
use drover::proto::zeebe::gateway_client::GatewayClient;
use futures::StreamExt;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::Code;

async fn zeebe(node: &LocalNode) -> GatewayClient<Channel> {
    let address = format!("http://{}", node.node().grpc_addr);
    GatewayClient::connect(address).await.expect("zeebe client connects")
}

fn activate(job_type: &str, max: i32, timeout: i64, request_timeout: i64) -> zb::ActivateJobsRequest {
    zb::ActivateJobsRequest {
        r#type: job_type.into(),
        worker: "zeebe-test".into(),
        timeout,
        max_jobs_to_activate: max,
        request_timeout,
        ..Default::default()
    }
}

/// Every job an ActivateJobs call answers, and how many messages carried them.
async fn activate_all(
    client: &mut GatewayClient<Channel>,
    request: zb::ActivateJobsRequest,
) -> (Vec<zb::ActivatedJob>, usize) {
    let mut stream = client.activate_jobs(request).await.expect("activate").into_inner();
    let (mut jobs, mut messages) = (Vec::new(), 0);
    while let Some(reply) = stream.next().await {
        jobs.extend(reply.expect("an activation message").jobs);
        messages += 1;
    }
    (jobs, messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_zeebe_worker_cannot_complete_a_job_activated_again() {
    let node = LocalNode::start().await;
    let key = node.client.create_job("fenced", r#"{"n":1}"#).await.unwrap();
    let mut client = zeebe(&node).await;

    let (first, _) = activate_all(&mut client, activate("fenced", 1, 200, -1)).await;
    assert_eq!(first.len(), 1);
    assert_ne!(first[0].key as u64, key, "an activation's key carries its attempt's tag");
    // The activation times out and the job is activated again.
    let mut second = Vec::new();
    let started = Instant::now();
    while second.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "the job was not activated again after its timeout");
        second = activate_all(&mut client, activate("fenced", 1, 60_000, 1_000)).await.0;
    }
    assert_ne!(second[0].key, first[0].key);

    let stale = zb::CompleteJobRequest { job_key: first[0].key, variables: r#"{"by":"stale"}"#.into() };
    let refused = client.complete_job(stale.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("no longer yours"), "{}", refused.message());
    for fenced in [
        client.fail_job(zb::FailJobRequest { job_key: first[0].key, retries: 1, ..Default::default() }).await,
        client
            .throw_error(zb::ThrowErrorRequest { job_key: first[0].key, error_code: "E".into(), ..Default::default() })
            .await
            .map(|r| r.map(|_| zb::FailJobResponse {})),
        client
            .update_job_timeout(zb::UpdateJobTimeoutRequest { job_key: first[0].key, timeout: 60_000 })
            .await
            .map(|r| r.map(|_| zb::FailJobResponse {})),
    ] {
        assert_eq!(fenced.unwrap_err().code(), Code::FailedPrecondition);
    }

    let current = zb::CompleteJobRequest { job_key: second[0].key, variables: r#"{"by":"current"}"#.into() };
    client.complete_job(current.clone()).await.expect("the current activation completes");
    client.complete_job(current).await.expect("its repeat (a retry after a lost answer) is answered done");
    let job = node.client.get_job(key).await.unwrap();
    assert_eq!((job.state.as_str(), job.result.as_str()), ("completed", r#"{"by":"current"}"#));

    // A finished job is gone for Zeebe clients, whatever the key.
    let gone = client.complete_job(stale).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    let gone = client.update_job_retries(zb::UpdateJobRetriesRequest { job_key: key as i64, retries: 2 }).await;
    assert_eq!(gone.unwrap_err().code(), Code::NotFound);
    let unknown = client.complete_job(zb::CompleteJobRequest { job_key: key as i64 + 1000, ..Default::default() });
    assert_eq!(unknown.await.unwrap_err().code(), Code::NotFound);

    // So is a cancelled one, even to the worker that holds it.
    node.client.create_job("fenced", "{}").await.unwrap();
    let (held, _) = activate_all(&mut client, activate("fenced", 1, 60_000, -1)).await;
    let (zeebe_key, _) = drover::gateway::zeebe::job_of(held[0].key).unwrap();
    node.client.raw().cancel_job(pb::CancelJobRequest { key: zeebe_key.0 }).await.unwrap();
    let cancelled = zb::CompleteJobRequest { job_key: held[0].key, ..Default::default() };
    assert_eq!(client.complete_job(cancelled).await.unwrap_err().code(), Code::NotFound);
    let fail = zb::FailJobRequest { job_key: held[0].key, retries: 1, ..Default::default() };
    assert_eq!(client.fail_job(fail).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_a_tag_names_whichever_activation_the_job_has() {
    let node = LocalNode::start().await;
    let key = node.client.create_job("plain", "{}").await.unwrap();
    let mut client = zeebe(&node).await;
    let (jobs, _) = activate_all(&mut client, activate("plain", 1, 60_000, -1)).await;
    assert_eq!(jobs.len(), 1);
    client
        .update_job_timeout(zb::UpdateJobTimeoutRequest { job_key: key as i64, timeout: 90_000 })
        .await
        .expect("the key drover job create printed extends the activation");
    client
        .complete_job(zb::CompleteJobRequest { job_key: key as i64, variables: String::new() })
        .await
        .expect("and completes it");
    assert_eq!(node.client.get_job(key).await.unwrap().state, "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_follows_zeebes_long_poll_and_limits() {
    let node = LocalNode::start_with(|c| c.limits.zeebe_long_poll_ms = 300).await;
    let mut client = zeebe(&node).await;

    let started = Instant::now();
    let (jobs, messages) = activate_all(&mut client, activate("idle", 10, 1000, -1)).await;
    assert_eq!((jobs.len(), messages), (0, 0), "a negative requestTimeout answers at once, with no message");

    let started_poll = Instant::now();
    let (jobs, messages) = activate_all(&mut client, activate("idle", 10, 1000, 0)).await;
    assert_eq!((jobs.len(), messages), (0, 0), "a long poll that times out ends the stream OK");
    assert!(
        started_poll.elapsed() >= Duration::from_millis(300),
        "requestTimeout 0 waits the configured default, it waited {:?}",
        started_poll.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    for n in 0..3 {
        node.client.create_job("many", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let (jobs, messages) = activate_all(&mut client, activate("many", 1_000_000, 60_000, -1)).await;
    assert_eq!((jobs.len(), messages), (3, 1), "maxJobsToActivate above the limit is clamped, not refused");
    let refused = client.activate_jobs(activate("many", 0, 60_000, -1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "Zeebe refuses zero jobs too");

    for job in &jobs {
        assert!(job.variables.starts_with('{') && job.custom_headers == "{}", "{job:?}");
        assert_eq!((job.process_instance_key, job.bpmn_process_id.as_str()), (0, ""));
        assert_eq!((job.worker.as_str(), job.tenant_id.as_str(), job.retries), ("zeebe-test", "<default>", 3));
    }
    // A blank worker name is accepted.
    node.client.create_job("blank", "{}").await.unwrap();
    let blank = zb::ActivateJobsRequest { worker: String::new(), ..activate("blank", 1, 60_000, -1) };
    assert_eq!(activate_all(&mut client, blank).await.0.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_clamp_and_thrown_errors_become_incidents_with_their_code() {
    let node = LocalNode::start().await;
    let mut client = zeebe(&node).await;
    let failing = node.client.create_job("errors", r#"{"kind":"fail"}"#).await.unwrap();
    let throwing = node.client.create_job("errors", r#"{"kind":"throw"}"#).await.unwrap();
    let (jobs, _) = activate_all(&mut client, activate("errors", 2, 60_000, -1)).await;
    assert_eq!(jobs.len(), 2);
    let key_of = |job_key: u64| jobs.iter().find(|j| (j.key as u64) << 4 >> 4 == job_key).expect("activated").key;

    client
        .fail_job(zb::FailJobRequest {
            job_key: key_of(failing),
            retries: -5,
            error_message: "negative".into(),
            retry_back_off: -100,
            variables: String::new(),
        })
        .await
        .expect("negative retries and back-off are clamped to 0");
    let job = node.client.get_job(failing).await.unwrap();
    assert_eq!((job.state.as_str(), job.retries), ("incident", 0));

    let blank = zb::ThrowErrorRequest { job_key: key_of(throwing), ..Default::default() };
    assert_eq!(client.throw_error(blank).await.unwrap_err().code(), Code::InvalidArgument);
    client
        .throw_error(zb::ThrowErrorRequest {
            job_key: key_of(throwing),
            error_code: "NO_FUNDS".into(),
            error_message: "the balance is 0".into(),
            variables: r#"{"balance":0}"#.into(),
        })
        .await
        .expect("throw");
    let job = node.client.get_job(throwing).await.unwrap();
    assert_eq!((job.state.as_str(), job.failure_reason.as_str()), ("incident", "business-error"));
    assert!(job.error_message.contains("NO_FUNDS") && job.error_message.contains("the balance is 0"), "{job:?}");
    assert!(job.variables.contains(r#""balance":0"#), "the error's variables are kept: {}", job.variables);

    let unimplemented = client.create_process_instance(zb::CreateProcessInstanceRequest::default()).await.unwrap_err();
    assert_eq!(unimplemented.code(), Code::Unimplemented);
    assert!(unimplemented.message().contains("no BPMN engine"), "{}", unimplemented.message());
    let unimplemented = client.publish_message(zb::PublishMessageRequest::default()).await.unwrap_err();
    assert_eq!(unimplemented.code(), Code::Unimplemented);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_large_for_a_zeebe_message_becomes_an_incident_and_replies_stay_within_4_mib() {
    let node = LocalNode::start_with(|c| c.limits.max_payload_bytes = 6 << 20).await;
    let client = zeebe(&node).await;
    let blob = |bytes: usize| format!(r#"{{"blob":"{}"}}"#, "x".repeat(bytes));
    for _ in 0..3 {
        node.client.create_job("big", &blob(1_500_000)).await.unwrap();
    }
    let huge = node.client.create_job("big", &blob(4_500_000)).await.unwrap();
    let mut client = client.max_decoding_message_size(4 << 20);
    let (jobs, messages) = activate_all(&mut client, activate("big", 10, 60_000, -1)).await;
    assert_eq!(jobs.len(), 3, "the three that fit");
    assert!(messages >= 2, "1.5 MB jobs come two to a message at most, got {messages} messages");
    let (jobs, messages) = activate_all(&mut client, activate("big", 10, 60_000, -1)).await;
    assert_eq!((jobs.len(), messages), (0, 0), "the job too large for a message is not sent");
    eventually(Duration::from_secs(10), "the oversized job to become an incident", || {
        let client = node.client.clone();
        async move { client.get_job(huge).await.is_ok_and(|j| j.state == "incident") }
    })
    .await;
    let job = node.client.get_job(huge).await.unwrap();
    assert!(job.error_message.contains("Zeebe"), "{}", job.error_message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeebe_streams_join_drovers_aggregation_and_their_completions_give_credits_back() {
    let node = LocalNode::start().await;
    let mut client = zeebe(&node).await;
    let admin = node.node().admin_addr.to_string();
    let spec = |worker: &str| zb::StreamActivatedJobsRequest {
        r#type: "shared".into(),
        worker: worker.into(),
        timeout: 60_000,
        ..Default::default()
    };
    let mut zeebe_stream = client.stream_activated_jobs(spec("w")).await.unwrap().into_inner();
    let native = pb::StreamActivatedJobsRequest {
        r#type: "shared".into(),
        worker: "w".into(),
        timeout: 60_000,
        ..Default::default()
    };
    let _native_stream = node.client.raw().stream_activated_jobs(native).await.unwrap().into_inner();
    eventually(Duration::from_secs(10), "one aggregated stream with both clients", || {
        let admin = admin.clone();
        async move {
            let Ok((200, body)) = http_get(&admin, "/actuator/jobstreams").await else { return false };
            let view: serde_json::Value = serde_json::from_str(&body).unwrap();
            let client = view["client"].as_array().cloned().unwrap_or_default();
            client.len() == 1 && client[0]["clients"].as_array().is_some_and(|c| c.len() == 2)
        }
    })
    .await;
    drop(_native_stream);
    eventually(Duration::from_secs(10), "the native client to leave", || {
        let admin = admin.clone();
        async move {
            let Ok((200, body)) = http_get(&admin, "/actuator/jobstreams").await else { return false };
            let view: serde_json::Value = serde_json::from_str(&body).unwrap();
            view["client"][0]["clients"].as_array().is_some_and(|c| c.len() == 1)
        }
    })
    .await;

    // More jobs than a stream may hold at once: they all arrive only if each
    // completion through the Zeebe service gives its credit back.
    let total = 3 * drover::streams::DEFAULT_MAX_IN_FLIGHT;
    for n in 0..total {
        node.client.create_job("shared", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < total {
        let job = tokio::time::timeout(Duration::from_secs(20), zeebe_stream.next())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} of {total} jobs: credits not given back", seen.len()))
            .expect("the stream stays open")
            .expect("a job");
        assert_eq!(job.variables.len(), job.variables.trim().len());
        client.complete_job(zb::CompleteJobRequest { job_key: job.key, variables: "{}".into() }).await.unwrap();
        seen.insert(job.key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_services_take_gzip_and_report_serving_health() {
    let node = LocalNode::start().await;
    let address = format!("http://{}", node.node().grpc_addr);
    let channel = Channel::from_shared(address).unwrap().connect().await.unwrap();
    let mut native = pb::gateway_client::GatewayClient::new(channel.clone())
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let variables = format!(r#"{{"text":"{}"}}"#, "compressible ".repeat(1000));
    let created = native
        .create_job(pb::CreateJobRequest { r#type: "gz".into(), variables: variables.clone(), ..Default::default() })
        .await
        .expect("a gzip create");
    let mut client = GatewayClient::new(channel.clone())
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let (jobs, _) = activate_all(&mut client, activate("gz", 1, 60_000, -1)).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].variables, variables, "a gzip reply decodes to the job");
    client
        .complete_job(zb::CompleteJobRequest { job_key: jobs[0].key, variables: "{}".into() })
        .await
        .expect("a gzip complete");
    assert_eq!(node.client.get_job(created.into_inner().key).await.unwrap().state, "completed");

    let topology = client.topology(zb::TopologyRequest {}).await.unwrap().into_inner();
    assert_eq!((topology.cluster_size, topology.partitions_count, topology.replication_factor), (1, 1, 1));
    let partition = &topology.brokers[0].partitions[0];
    assert_eq!(partition.partition_id, 1, "Zeebe numbers partitions from 1");
    assert_eq!(partition.role, zb::partition::PartitionBrokerRole::Leader as i32);

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "drover.v1.Gateway", "gateway_protocol.Gateway"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e}"))
            .into_inner()
            .status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service:?}");
    }
}
