//! A job's history on three real nodes: every step of its life is recorded,
//! in order, by the partition, and read back after its leader was killed.
//! Its one yield comes from a new leader that did not yet know a stream was
//! full: a leader that knows pushes nothing there.

mod common;

use std::time::{Duration, Instant};

use common::{drover_bin, eventually, http_get, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::{
    ActivateJobsRequest, ActivatedJob, CancelJobRequest, CheckpointJobRequest, CreateJobRequest, GetJobRequest,
    RegisterWorkerRequest, StreamActivatedJobsRequest, UpdateJobRetriesRequest, UpdateJobTimeoutRequest,
};

/// The first job one of these long polls hands out, within 20 s.
async fn one(client: &Client, request: ActivateJobsRequest) -> ActivatedJob {
    let started = Instant::now();
    loop {
        if let Ok(reply) = client.raw().activate_jobs(request.clone()).await {
            if let Ok(Some(mut message)) = reply.into_inner().message().await {
                if !message.jobs.is_empty() {
                    return message.jobs.remove(0);
                }
            }
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no job to activate within 20 s");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_history_tells_its_whole_life_across_a_leader_change() {
    let mut cluster = ProcessCluster::start(3, 1, 3, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway_node = (leader + 1) % 3;
    let gateway = cluster.node(gateway_node).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();

    // A stream that holds at most one job, and holds one already: its leader
    // learns it is full, and pushes it nothing more.
    let filler = client.create(CreateJobRequest { r#type: "hist".into(), ..Default::default() }).await.unwrap();
    let open = StreamActivatedJobsRequest {
        r#type: "hist".into(),
        worker: "full".into(),
        timeout: 60_000,
        max_jobs_in_flight: 1,
        ..Default::default()
    };
    let mut stream = client.raw().stream_activated_jobs(open).await.unwrap().into_inner();
    let held = tokio::time::timeout(Duration::from_secs(20), stream.message()).await.expect("the filler is pushed");
    assert_eq!(held.unwrap().unwrap().key, filler);
    for node in 0..3 {
        eventually(Duration::from_secs(10), "every broker to know the stream", || {
            let admin = cluster.node(node).admin.clone();
            async move {
                let (_, body) = http_get(&admin, "/actuator/jobstreams").await.unwrap();
                let view: serde_json::Value = serde_json::from_str(&body).unwrap();
                view["remote"].as_array().unwrap().iter().any(|s| s["worker"] == "full")
            }
        })
        .await;
    }

    let create = CreateJobRequest {
        r#type: "hist".into(),
        user: "alice".into(),
        idempotency_key: "h-1".into(),
        delay: 200,
        retries: Some(2),
        stages: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    let key = client.create(create).await.unwrap();
    let poll = |worker: &str, timeout: i64, session_id: u64| ActivateJobsRequest {
        r#type: "hist".into(),
        worker: worker.into(),
        timeout,
        max_jobs_to_activate: 1,
        request_timeout: 1_000,
        session_id,
        ..Default::default()
    };

    // Attempt 1: polled, extended twice, a stage committed, failed with back-off.
    let job = one(&client, poll("p1", 60_000, 0)).await;
    for timeout in [30_000, 40_000] {
        let update = UpdateJobTimeoutRequest { key, attempt: job.attempt, timeout, override_fence: false };
        client.raw().update_job_timeout(update).await.unwrap();
    }
    let checkpoint = CheckpointJobRequest { key, attempt: job.attempt, stage: "a".into(), variables: String::new() };
    client.raw().checkpoint_job(checkpoint).await.unwrap();
    client.fail_for("intermittent", key, job.attempt, 1, "the printer is warming up", 100).await.unwrap();

    // The leader dies; the rest happens under the next one.
    cluster.kill(leader);

    // Attempt 2: the new leader does not know the stream is full. It pushes
    // the job there once, the stream's gateway yields it, and the leader
    // knows from its answer.
    eventually(Duration::from_secs(10), "the full stream's gateway to yield the job", || async {
        let history = client.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await;
        history.is_ok_and(|h| h.into_inner().events.iter().any(|e| e.kind == "yielded"))
    })
    .await;

    // Attempt 3: with a session, left to time out.
    let register =
        RegisterWorkerRequest { worker_id: "p2".into(), job_types: vec!["hist".into()], ..Default::default() };
    let session = client.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let job = one(&client, poll("p2", 500, session)).await;
    assert_eq!(job.attempt, 3);
    eventually(Duration::from_secs(10), "attempt 3 to time out", || async {
        client.get_job(key).await.map(|j| j.state == "activatable").unwrap_or(false)
    })
    .await;

    // Attempt 4: out of retries, an incident.
    let job = one(&client, poll("p3", 60_000, 0)).await;
    client.fail_for("failed", key, job.attempt, 0, "out of paper", 0).await.unwrap();

    // Given retries back, the job waits for a poll: the stream is still full.
    client.raw().update_job_retries(UpdateJobRetriesRequest { key, retries: 1 }).await.unwrap();
    let job = one(&client, poll("p4", 60_000, 0)).await;
    client.complete(job.key, job.attempt, "{}").await.unwrap();
    drop(stream);

    let history = client.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await.unwrap().into_inner();
    let kinds: Vec<&str> = history.events.iter().map(|e| e.kind.as_str()).collect();
    let expected = [
        "created",
        "due",
        "activated",
        "extended",
        "checkpointed",
        "failed",
        "due",
        "activated",
        "yielded",
        "activated",
        "timed_out",
        "activated",
        "failed",
        "incident",
        "retries_updated",
        "activated",
        "completed",
    ];
    assert_eq!(kinds, expected, "{history:#?}");
    assert_eq!(history.dropped, 0);
    let e = &history.events;
    assert_eq!((e[0].user.as_str(), e[0].idempotency_key.as_str()), ("alice", "h-1"));
    assert_eq!((e[2].worker.as_str(), e[2].via.as_str(), e[2].gateway_node_id), ("p1", "poll", gateway_node as u64));
    assert_eq!((e[3].count, e[3].attempt), (2, 1), "two timeout updates of attempt 1, coalesced");
    assert_eq!(e[4].stage, "a");
    assert_eq!((e[5].reason.as_str(), e[5].retries, e[5].back_off), ("intermittent", 1, 100));
    let (pushed, yielded) = (&e[7], &e[8]);
    assert_eq!((pushed.worker.as_str(), pushed.via.as_str(), pushed.attempt), ("full", "push", 2));
    assert_eq!(
        (yielded.attempt, yielded.gateway_node_id, yielded.reason.as_str()),
        (2, gateway_node as u64, "no client ready"),
        "the yield names the stream's gateway and why"
    );
    assert_eq!((e[9].attempt, e[9].session_id), (3, session));
    assert_eq!((e[12].reason.as_str(), e[12].message.as_str()), ("failed", "out of paper"));
    assert_eq!((e[14].retries, e[14].user.as_str()), (1, "anonymous"), "who gave the retries back");
    assert_eq!((e[15].worker.as_str(), e[15].attempt), ("p4", 5));
    assert!(e.windows(2).all(|w| w[0].at <= w[1].at), "events are in time order");

    let with_history = GetJobRequest { key, include_history: true, ..Default::default() };
    let job = client.raw().get_job(with_history).await.unwrap().into_inner().job.unwrap();
    assert_eq!(job.history, history.events, "GetJob shows the same history on request");

    let output = tokio::process::Command::new(drover_bin())
        .args(["job", "history", &key.to_string(), "--address", &gateway])
        .output()
        .await
        .unwrap();
    let timeline = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(timeline.contains("created by alice"), "{timeline}");
    assert!(timeline.contains("failed (attempt 1, intermittent): the printer is warming up"), "{timeline}");
    assert!(timeline.contains(&format!("by node {gateway_node}: no client ready")), "{timeline}");

    // A job cancelled: the last event, naming who cancelled it.
    let other = client.create(CreateJobRequest { r#type: "hist-cancel".into(), ..Default::default() }).await.unwrap();
    client.raw().cancel_job(CancelJobRequest { key: other }).await.unwrap();
    let history = client.raw().get_job_history(GetJobRequest { key: other, ..Default::default() }).await.unwrap();
    let kinds: Vec<(String, String)> = history.into_inner().events.into_iter().map(|e| (e.kind, e.user)).collect();
    assert_eq!(kinds, [("created".into(), String::new()), ("cancelled".into(), "anonymous".into())]);
}
