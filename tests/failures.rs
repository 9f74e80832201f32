//! Why an attempt failed decides what happens next, on three real nodes:
//! malformed payloads become incidents at once, a worker's shutdown uses no
//! retry, and internal errors are counted per worker.

mod common;

use std::time::Duration;

use common::ProcessCluster;
use drover::client::Client;
use drover::proto::gateway::{CreateJobRequest, FailJobRequest};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_reason_decides_the_retry_and_is_counted() {
    let cluster = ProcessCluster::start(3, 1, 3, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let client = Client::connect(&cluster.node((leader + 1) % 3).grpc).await.unwrap();
    let create = |job_type: &str| CreateJobRequest { r#type: job_type.into(), retries: Some(3), ..Default::default() };
    for job_type in ["parse", "deploy", "render"] {
        client.create(create(job_type)).await.unwrap();
    }

    // A payload that can never be processed: an incident at once, retries or not.
    let job = client.activate("parse", "parser-1", 1, 60_000, 1_000).await.unwrap().remove(0);
    client.fail_for("malformed-payload", job.key, job.attempt, 2, "no field \"order\"", 1_000).await.unwrap();
    let failed = client.get_job(job.key).await.unwrap();
    assert_eq!(
        (failed.state.as_str(), failed.retries, failed.failure_reason.as_str()),
        ("incident", 0, "malformed-payload")
    );
    assert_eq!(failed.error_message, "no field \"order\"");

    // The worker stopped: activatable again at once, no retry used, whatever it asked.
    let job = client.activate("deploy", "deployer-1", 1, 60_000, 1_000).await.unwrap().remove(0);
    client.fail_for("worker-shutdown", job.key, job.attempt, 0, "SIGTERM", 60_000).await.unwrap();
    let again = client.activate("deploy", "deployer-2", 1, 60_000, 1_000).await.unwrap().remove(0);
    assert_eq!((again.key, again.attempt, again.retries), (job.key, 2, 3));

    // A bad machine: retried as asked, and counted per worker.
    let job = client.activate("render", "render-7", 1, 60_000, 1_000).await.unwrap().remove(0);
    client.fail_for("internal-error", job.key, job.attempt, 2, "segfault", 0).await.unwrap();
    let retried = client.get_job(job.key).await.unwrap();
    assert_eq!((retried.state.as_str(), retried.retries), ("activatable", 2));
    let (_, metrics) = common::http_get(&cluster.node(leader).admin, "/metrics").await.unwrap();
    let sample = |name: &str, label: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(sample("drover_worker_internal_errors_total{", "worker=\"render-7\"").as_deref(), Some("1"));
    assert_eq!(sample("drover_job_failures_total{", "reason=\"malformed-payload\"").as_deref(), Some("1"));

    let unknown = FailJobRequest { key: job.key, attempt: 2, reason: "gave-up".into(), ..Default::default() };
    let error = client.raw().fail_job(unknown).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("worker-shutdown"), "the error lists the reasons: {}", error.message());
}
