//! One scenario per job lifecycle rule, against a real node over gRPC.

mod common;

use std::time::{Duration, Instant};

use common::LocalNode;
use drover::proto::gateway::*;
use tonic::Code;

const LONG_POLL_MS: i64 = 10_000;

async fn create(node: &LocalNode, job_type: &str, variables: &str) -> u64 {
    node.client.create_job(job_type, variables).await.expect("create")
}

async fn activate(node: &LocalNode, job_type: &str, max: i32, timeout_ms: i64, wait_ms: i64) -> Vec<ActivatedJob> {
    node.client.activate(job_type, "tester", max, timeout_ms, wait_ms).await.expect("activate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_activate_complete() {
    let node = LocalNode::start().await;
    let mut request = CreateJobRequest {
        r#type: "email".into(),
        variables: r#"{"to":"ops@example.com","subject":"hi","size":3}"#.into(),
        ..Default::default()
    };
    request.custom_headers.insert("channel".into(), "ops".into());
    let key = node.client.create(request).await.unwrap();

    let mut raw = node.client.raw();
    let mut stream = raw
        .activate_jobs(ActivateJobsRequest {
            r#type: "email".into(),
            worker: "mailer-1".into(),
            timeout: 30_000,
            max_jobs_to_activate: 5,
            fetch_variable: vec!["to".into(), "size".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let jobs = stream.message().await.unwrap().expect("one response").jobs;
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job.key, key);
    assert_eq!(job.worker, "mailer-1");
    assert_eq!(job.attempt, 1);
    assert_eq!(job.retries, 3, "default retries");
    assert_eq!(job.custom_headers.get("channel").map(String::as_str), Some("ops"));
    assert_eq!(job.variables, r#"{"size":3,"to":"ops@example.com"}"#, "fetch_variable limits the variables");
    let activated_at = job.deadline - 30_000;
    assert!(activated_at >= job.created_at);

    node.client.complete(key, job.attempt, r#"{"sent":true}"#).await.unwrap();
    let stored = node.client.get_job(key).await.unwrap();
    assert_eq!(stored.state, "completed");
    assert_eq!(stored.result, r#"{"sent":true}"#);
    assert!(activate(&node, "email", 5, 1_000, 0).await.is_empty(), "a completed job is never activated again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_with_back_off_delays_the_next_activation() {
    let node = LocalNode::start().await;
    let key = create(&node, "charge", "{}").await;
    let first = activate(&node, "charge", 1, 30_000, 0).await.remove(0);
    node.client.fail(key, first.attempt, 2, "card declined", 400).await.unwrap();

    let failed = node.client.get_job(key).await.unwrap();
    assert_eq!(failed.state, "scheduled");
    assert_eq!(failed.retries, 2);
    assert_eq!(failed.error_message, "card declined");
    assert!(activate(&node, "charge", 1, 30_000, 0).await.is_empty(), "still backing off");

    let retried = activate(&node, "charge", 1, 30_000, LONG_POLL_MS).await;
    assert_eq!(retried.len(), 1, "the back-off elapsed within the long poll");
    let activated_at = retried[0].deadline - 30_000;
    assert!(
        activated_at >= failed.due_at,
        "activated at {activated_at}, before the back-off ended at {}",
        failed.due_at
    );
    assert_eq!(retried[0].attempt, 2);
    assert_eq!(retried[0].retries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retries_left_is_an_incident_until_retries_are_given_back() {
    let node = LocalNode::start().await;
    let key = create(&node, "ship", "{}").await;
    let job = activate(&node, "ship", 1, 30_000, 0).await.remove(0);
    node.client.fail(key, job.attempt, 0, "address unknown", 0).await.unwrap();

    let incident = node.client.get_job(key).await.unwrap();
    assert_eq!(incident.state, "incident");
    assert_eq!(incident.error_message, "address unknown");
    assert!(activate(&node, "ship", 1, 30_000, 0).await.is_empty());

    node.client.raw().update_job_retries(UpdateJobRetriesRequest { key, retries: 1 }).await.unwrap();
    assert_eq!(node.client.get_job(key).await.unwrap().state, "activatable");
    let again = activate(&node, "ship", 1, 30_000, 0).await;
    assert_eq!(again[0].key, key);
    assert_eq!(again[0].retries, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_timeout_reactivates_without_using_a_retry() {
    let node = LocalNode::start().await;
    let key = create(&node, "resize", "{}").await;
    let first = activate(&node, "resize", 1, 300, 0).await.remove(0);
    let second = activate(&node, "resize", 1, 30_000, LONG_POLL_MS).await;
    assert_eq!(second.len(), 1, "the timed-out job came back within the long poll");
    assert_eq!(second[0].key, key);
    assert_eq!(second[0].attempt, first.attempt + 1);
    assert_eq!(second[0].retries, first.retries, "a timeout does not consume a retry");
    assert!(second[0].deadline - 30_000 >= first.deadline, "not re-activated before the deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_job_timeout_sets_the_deadline_from_now() {
    let node = LocalNode::start().await;
    let key = create(&node, "report", "{}").await;
    let job = activate(&node, "report", 1, 60_000, 0).await.remove(0);
    let mut raw = node.client.raw();

    let shortened = raw
        .update_job_timeout(UpdateJobTimeoutRequest { key, timeout: 200, attempt: job.attempt, override_fence: false })
        .await
        .unwrap()
        .into_inner();
    assert!(shortened.deadline < job.deadline, "shortened");
    let again = activate(&node, "report", 1, 60_000, LONG_POLL_MS).await;
    assert_eq!(again.len(), 1, "the shortened activation timed out");
    assert!(again[0].deadline - 60_000 >= shortened.deadline);

    let extended = raw
        .update_job_timeout(UpdateJobTimeoutRequest {
            key,
            timeout: 600_000,
            attempt: again[0].attempt,
            override_fence: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(extended.deadline > again[0].deadline, "extended");
    assert_eq!(node.client.get_job(key).await.unwrap().deadline, extended.deadline);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_activation_cannot_complete_the_job() {
    let node = LocalNode::start().await;
    let key = create(&node, "sync", "{}").await;
    let stale = activate(&node, "sync", 1, 200, 0).await.remove(0);
    let current = activate(&node, "sync", 1, 60_000, LONG_POLL_MS).await.remove(0);
    assert_eq!(current.key, key);

    let rejected = node.client.complete(key, stale.attempt, "{}").await.unwrap_err();
    assert_eq!(rejected.code(), Code::FailedPrecondition, "{rejected:?}");
    assert!(rejected.message().contains("superseded"), "{}", rejected.message());
    let rejected = node.client.fail(key, stale.attempt, 0, "late", 0).await.unwrap_err();
    assert_eq!(rejected.code(), Code::FailedPrecondition);

    node.client.complete(key, current.attempt, "{}").await.unwrap();
    assert_eq!(node.client.get_job(key).await.unwrap().state, "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_first_fifo_within_a_priority() {
    let node = LocalNode::start().await;
    let mut keys = Vec::new();
    for priority in [0, 5, 0, 5] {
        let request = CreateJobRequest { r#type: "prio".into(), priority, ..Default::default() };
        keys.push(node.client.create(request).await.unwrap());
    }
    let order: Vec<u64> = activate(&node, "prio", 10, 30_000, 0).await.iter().map(|j| j.key).collect();
    assert_eq!(order, vec![keys[1], keys[3], keys[0], keys[2]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_waits_until_due() {
    let node = LocalNode::start().await;
    let request = CreateJobRequest { r#type: "later".into(), delay: 400, ..Default::default() };
    let key = node.client.create(request).await.unwrap();
    let stored = node.client.get_job(key).await.unwrap();
    assert_eq!(stored.state, "scheduled");
    assert_eq!(stored.due_at, stored.created_at + 400);
    assert!(activate(&node, "later", 1, 30_000, 0).await.is_empty());
    let due = activate(&node, "later", 1, 30_000, LONG_POLL_MS).await;
    assert_eq!(due.len(), 1);
    assert!(due[0].deadline - 30_000 >= stored.due_at);

    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 + 60_000;
    let run_at = CreateJobRequest { r#type: "at".into(), run_at: at, ..Default::default() };
    let key = node.client.create(run_at).await.unwrap();
    assert_eq!(node.client.get_job(key).await.unwrap().due_at, at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_wakes_on_create_and_returns_empty_when_time_is_up() {
    let node = LocalNode::start().await;
    let started = Instant::now();
    let empty = activate(&node, "quiet", 1, 1_000, 300).await;
    assert!(empty.is_empty(), "no jobs is an empty answer, not an error");
    assert!(started.elapsed() >= Duration::from_millis(300), "the poll waited its request_timeout");

    let poller = {
        let client = node.client.clone();
        tokio::spawn(async move { client.activate("wake", "tester", 1, 30_000, 60_000).await })
    };
    // The poll must be parked before the create for this to test waking.
    let ctx = node.node().ctx.clone();
    common::eventually(Duration::from_secs(10), "the poll to park", || {
        let ctx = ctx.clone();
        async move { ctx.gateway.available.receiver_count() > 0 }
    })
    .await;
    let key = create(&node, "wake", "{}").await;
    let woken = tokio::time::timeout(Duration::from_secs(30), poller).await.expect("woken well before 60 s");
    let jobs = woken.unwrap().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].key, key);

    // A caller that waits less than its poll hears "no jobs" before it gives up.
    let mut request = tonic::Request::new(ActivateJobsRequest {
        r#type: "quiet".into(),
        worker: "tester".into(),
        timeout: 1_000,
        max_jobs_to_activate: 1,
        request_timeout: 60_000,
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(1_500));
    let started = Instant::now();
    let mut answer = node.client.raw().activate_jobs(request).await.expect("an answer, not the caller's deadline");
    let reply = answer.get_mut().message().await.expect("a message, not the caller's deadline");
    assert!(reply.is_some_and(|r| r.jobs.is_empty()), "an empty answer");
    assert!(started.elapsed() < Duration::from_millis(1_500), "within the caller's deadline: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_receives_jobs_as_they_become_activatable() {
    let node = LocalNode::start().await;
    let mut stream = node
        .client
        .raw()
        .stream_activated_jobs(StreamActivatedJobsRequest {
            r#type: "push".into(),
            worker: "streamer".into(),
            timeout: 30_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let before = create(&node, "push", r#"{"n":1}"#).await;
    let mut keys = vec![before];
    for n in 2..=3 {
        keys.push(create(&node, "push", &format!(r#"{{"n":{n}}}"#)).await);
    }
    let mut received = Vec::new();
    while received.len() < 3 {
        let job = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("pushed within 10 s")
            .unwrap()
            .expect("stream open");
        assert_eq!(job.worker, "streamer");
        assert_eq!(job.attempt, 1);
        received.push(job.key);
    }
    received.sort();
    assert_eq!(received, keys);
    for key in keys {
        assert_eq!(node.client.get_job(key).await.unwrap().state, "activated");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_status() {
    let node = LocalNode::start_with(|c| c.limits.max_payload_bytes = 1024).await;
    let mut raw = node.client.raw();
    let create = |job_type: &str, variables: &str| CreateJobRequest {
        r#type: job_type.into(),
        variables: variables.into(),
        ..Default::default()
    };

    let status = raw.create_job(create("", "{}")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("type"), "{}", status.message());
    let status = raw.create_job(create(&"x".repeat(300), "{}")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = raw.create_job(create("t", "[1,2]")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("JSON object"), "{}", status.message());
    let status = raw.create_job(create("t", "{\"a\":")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(2048));
    let status = raw.create_job(create("t", &big)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("max_payload_bytes"), "{}", status.message());
    let negative = CreateJobRequest { retries: Some(-1), ..create("t", "{}") };
    assert_eq!(raw.create_job(negative).await.unwrap_err().code(), Code::InvalidArgument);

    let unknown = drover::proto::gateway::GetJobRequest { key: 12345, ..Default::default() };
    assert_eq!(raw.get_job(unknown).await.unwrap_err().code(), Code::NotFound);
    let status = node.client.complete(999, 1, "{}").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    let negative_timeout =
        ActivateJobsRequest { r#type: "t".into(), timeout: -5, max_jobs_to_activate: 1, ..Default::default() };
    assert_eq!(raw.activate_jobs(negative_timeout).await.unwrap_err().code(), Code::InvalidArgument);
    let no_max =
        ActivateJobsRequest { r#type: "t".into(), timeout: 1000, max_jobs_to_activate: 0, ..Default::default() };
    assert_eq!(raw.activate_jobs(no_max).await.unwrap_err().code(), Code::InvalidArgument);

    let key = node.client.create_job("t", "{}").await.unwrap();
    let status = node.client.complete_overriding(key, "{}").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "completing a job nobody activated");
    let status = node.client.complete(key, 0, "{}").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "no attempt, and no override either");
    assert!(status.message().contains("attempt is required"), "{}", status.message());
    let status = node.client.fail(key, 1, -1, "x", 0).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let timeout = |timeout| UpdateJobTimeoutRequest { key, timeout, attempt: 0, override_fence: true };
    let status = raw.update_job_timeout(timeout(-1)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = raw.update_job_timeout(timeout(100)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let both = UpdateJobTimeoutRequest { key, timeout: 100, attempt: 3, override_fence: true };
    assert_eq!(raw.update_job_timeout(both).await.unwrap_err().code(), Code::InvalidArgument);
    let status = raw.update_job_retries(UpdateJobRetriesRequest { key, retries: -2 }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = node.client.complete(key, 0, "not json").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_names_one_job_for_its_window() {
    let node = LocalNode::start_with(|c| c.partitions = 3).await;
    let mut raw = node.client.raw();
    let request = |tenant: &str, variables: &str| CreateJobRequest {
        r#type: "refund".into(),
        variables: variables.into(),
        tenant_id: tenant.into(),
        idempotency_key: "order-7/refund".into(),
        ..Default::default()
    };
    let first = raw.create_job(request("t1", r#"{"cents":500}"#)).await.unwrap().into_inner();
    assert!(first.created, "{first:?}");
    // Through the CreateJobs stream too, the key finds the first job.
    let again = raw.create_job(request("t1", r#"{"cents":500}"#)).await.unwrap().into_inner();
    assert_eq!((again.key, again.created), (first.key, false));
    let streamed = raw
        .create_jobs(futures::stream::iter([request("t1", r#"{"cents":500}"#)]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!((streamed.key, streamed.created), (first.key, false));
    // Other content under the key is a client bug that names the key.
    let error = raw.create_job(request("t1", r#"{"cents":900}"#)).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(error.message().contains("order-7/refund"), "{}", error.message());
    // Keys are per tenant.
    let other = raw.create_job(request("t2", r#"{"cents":900}"#)).await.unwrap().into_inner();
    assert!(other.created && other.key != first.key);
    assert_eq!(node.client.get_job(first.key).await.unwrap().idempotency_key, "order-7/refund");

    // Bad keys and windows are refused up front.
    let mut long = request("t1", "{}");
    long.idempotency_key = "k".repeat(256);
    assert_eq!(raw.create_job(long).await.unwrap_err().code(), Code::InvalidArgument);
    let mut short = request("t1", "{}");
    short.idempotency_window = 1_000;
    let error = raw.create_job(short).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("idempotency_window"), "{}", error.message());
}
