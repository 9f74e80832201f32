//! Why an attempt failed decides what happens next, on three real nodes:
//! malformed payloads become incidents at once, a worker's shutdown uses no
//! retry, and internal errors are counted per worker; a failure by the job's
//! retry policy is decided where the job lives, as the policy says.

mod common;

use std::time::Duration;

use common::ProcessCluster;
use drover::client::{Client, JobOutcome, Worker, WorkerOptions};
use drover::proto::gateway::{CreateJobRequest, FailJobRequest, RetryPolicy};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_by_the_jobs_retry_policy_is_decided_where_the_job_lives() {
    // None armed at start: the test arms the gateway's own decision on one node.
    let cluster =
        ProcessCluster::start_with_failpoints("", 1, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway = (leader + 1) % 3;
    let client = Client::connect(&cluster.node(gateway).grpc).await.unwrap();
    let policy = RetryPolicy {
        backoff: "linear".into(),
        initial_interval: Some(60_000),
        max_interval: Some(90_000),
        jitter: Some(false),
        non_retryable_errors: vec!["Fraud.*".into()],
        ..Default::default()
    };
    let create = |job_type: &str| CreateJobRequest {
        r#type: job_type.into(),
        retries: Some(3),
        retry_policy: Some(policy.clone()),
        ..Default::default()
    };
    let by_policy = |key, attempt, error_type: &str| FailJobRequest {
        key,
        attempt,
        error_message: "card declined".into(),
        by_policy: true,
        error_type: error_type.into(),
        ..Default::default()
    };

    // Retries left and an error that may retry: one retry used, due after
    // the policy's first wait, and the answer says so.
    let key = client.create(create("charge")).await.unwrap();
    let job = client.activate("charge", "w", 1, 60_000, 1_000).await.unwrap().remove(0);
    let decided = client.fail_by_policy(key, job.attempt, "Declined", "card declined").await.unwrap();
    assert_eq!((decided.retries, decided.retry_back_off), (2, 60_000));
    let failed = client.get_job(key).await.unwrap();
    assert_eq!((failed.state.as_str(), failed.retries), ("scheduled", 2));
    assert!(failed.custom_headers.contains_key("drover.retry"), "the policy is kept with the job: {failed:?}");
    // Sent again (its answer lost): the same decision, no retry used.
    let again = client.raw().fail_job(by_policy(key, job.attempt, "Declined")).await.unwrap().into_inner();
    assert_eq!(again.retries, 2);
    assert!((59_000..=60_000).contains(&again.retry_back_off), "the wait that is left: {again:?}");
    assert_eq!(client.get_job(key).await.unwrap().retries, 2);

    // An error the policy never retries: an incident at once.
    let key = client.create(create("refund")).await.unwrap();
    let job = client.activate("refund", "w", 1, 60_000, 1_000).await.unwrap().remove(0);
    let decided = client.raw().fail_job(by_policy(key, job.attempt, "Fraud.Suspected")).await.unwrap().into_inner();
    assert_eq!((decided.retries, decided.retry_back_off), (0, 0));
    assert_eq!(client.get_job(key).await.unwrap().state, "incident");

    // The same decision made by the gateway, as while a member is older than
    // the policies' data version.
    let armed = common::http_request(
        "PUT",
        &cluster.node(gateway).admin,
        "/actuator/failpoints/retry_policy_at_gateway?count=1",
    )
    .await
    .unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let key = client.create(create("payout")).await.unwrap();
    let job = client.activate("payout", "w", 1, 60_000, 1_000).await.unwrap().remove(0);
    let decided = client.raw().fail_job(by_policy(key, job.attempt, "Declined")).await.unwrap().into_inner();
    assert_eq!((decided.retries, decided.retry_back_off), (2, 60_000));
    let failed = client.get_job(key).await.unwrap();
    assert_eq!((failed.state.as_str(), failed.retries), ("scheduled", 2));

    // Bad input, named.
    let bad = CreateJobRequest {
        retry_policy: Some(RetryPolicy { backoff_coefficient: Some(0.5), ..Default::default() }),
        ..create("charge")
    };
    let error = client.raw().create_job(bad).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("backoff_coefficient"), "{}", error.message());
    let mut forged = create("charge");
    forged.retry_policy = None;
    forged.custom_headers.insert("drover.retry".into(), "{\"backoff\":\"Sometimes\"}".into());
    let error = client.raw().create_job(forged).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("drover.retry"), "{}", error.message());
    let key = client.create(create("charge")).await.unwrap();
    let job = client.activate("charge", "w", 1, 60_000, 1_000).await.unwrap();
    let mixed = FailJobRequest { retries: 1, ..by_policy(key, job[0].attempt, "Declined") };
    let error = client.raw().fail_job(mixed).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("by_policy"), "{}", error.message());
}

/// A Rust worker's handler fails by the job's policy: an error the policy
/// retries is retried after its wait, one it never retries is an incident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_failure_by_policy_follows_the_jobs_policy() {
    let cluster = ProcessCluster::start(3, 1, 3, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();
    let policy = RetryPolicy {
        backoff: "constant".into(),
        initial_interval: Some(0),
        jitter: Some(false),
        non_retryable_errors: vec!["Fraud.*".into()],
        ..Default::default()
    };
    let mut keys = Vec::new();
    for order in ["flaky", "fraud"] {
        let request = CreateJobRequest {
            r#type: "charge".into(),
            variables: format!(r#"{{"order":"{order}"}}"#),
            retries: Some(3),
            retry_policy: Some(policy.clone()),
            ..Default::default()
        };
        keys.push(client.create(request).await.unwrap());
    }
    let worker = Worker::new(Client::connect(&cluster.gateway(1)).await.unwrap(), WorkerOptions::new("charge"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(
        |job: drover::proto::gateway::ActivatedJob| async move {
            match (job.variables.contains("fraud"), job.attempt) {
                (true, _) => {
                    JobOutcome::FailByPolicy { error_type: "Fraud.Stolen".into(), message: "stolen card".into() }
                }
                (false, 1) => JobOutcome::FailByPolicy { error_type: "Timeout".into(), message: "bank slow".into() },
                (false, _) => JobOutcome::Complete(r#"{"charged":true}"#.into()),
            }
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let states = || async {
        let mut states = Vec::new();
        for key in &keys {
            let job = client.get_job(*key).await.unwrap();
            states.push((job.state, job.retries));
        }
        states
    };
    common::eventually(
        Duration::from_secs(30),
        "the flaky charge to complete and the fraud to be an incident",
        || async { states().await == [("completed".to_string(), 2), ("incident".to_string(), 0)] },
    )
    .await;
    let _ = stop.send(());
    worker.await.unwrap();
}
