//! Once in effect, on three real nodes: an idempotency key names one job
//! whichever gateways its creates go through and whichever leader dies;
//! a stage a worker committed is where the next attempt resumes, and a
//! superseded attempt cannot commit another; producers wait for results with
//! AwaitJob instead of polling.

mod common;

use std::time::{Duration, Instant};

use common::ProcessCluster;
use drover::client::Client;
use drover::core::{idempotency_partition, DEFAULT_TENANT};
use drover::proto::gateway::{AwaitJobRequest, CheckpointJobRequest, CreateJobRequest, GetJobRequest};
use tonic::Code;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];

fn keyed(key: &str, variables: &str) -> CreateJobRequest {
    CreateJobRequest {
        r#type: "refund".into(),
        variables: variables.into(),
        idempotency_key: key.into(),
        user: "alice".into(),
        idempotency_window: 60_000,
        ..Default::default()
    }
}

async fn create_within(
    client: &Client,
    request: CreateJobRequest,
    limit: Duration,
) -> Result<(u64, bool), tonic::Status> {
    let mut request = tonic::Request::new(request);
    request.set_timeout(limit);
    let answer = client.raw().create_job(request).await?.into_inner();
    Ok((answer.key, answer.created))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_sent_through_two_gateways_while_the_leader_dies_makes_one_job() {
    let mut cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let key = "refund-order-77";
    let partition = idempotency_partition(DEFAULT_TENANT, "alice", key, 3);
    let leader = cluster.leader_of(partition, Duration::from_secs(20)).await;
    let gateways: Vec<usize> = cluster.live().into_iter().filter(|n| *n != leader).collect();
    let first = Client::connect(&cluster.node(gateways[0]).grpc).await.unwrap();
    let second = Client::connect(&cluster.node(gateways[1]).grpc).await.unwrap();

    let variables = r#"{"order":77,"marker":"one-key"}"#;
    let sends = [first.clone(), second.clone()].map(|client| {
        tokio::spawn(async move { create_within(&client, keyed(key, variables), Duration::from_secs(30)).await })
    });
    cluster.kill(leader);
    let mut answers = Vec::new();
    for send in sends {
        answers.push(send.await.unwrap().expect("a keyed create is acknowledged once a new leader answers"));
    }
    assert_eq!(answers[0].0, answers[1].0, "both answers carry the one job's key: {answers:?}");
    assert!(answers.iter().filter(|(_, created)| *created).count() <= 1, "two creates made the job: {answers:?}");
    let job_key = answers[0].0;

    let new_leader = cluster.leader_of(partition, Duration::from_secs(20)).await;
    let jobs = cluster.jobs_with(new_leader, "one-key").await;
    assert_eq!(jobs.len(), 1, "one key made {} jobs: {jobs:?}", jobs.len());
    assert_eq!(jobs[0]["key"].as_u64(), Some(job_key));

    // Read back by key, through either gateway: the job and its user.
    let by_key = GetJobRequest { idempotency_key: key.into(), user: "alice".into(), ..Default::default() };
    let job = first.raw().get_job(by_key.clone()).await.expect("GetJob by idempotency key").into_inner().job.unwrap();
    assert_eq!((job.key, job.user.as_str(), job.state.as_str()), (job_key, "alice", "activatable"));
    // Another user's key of the same name is another job's.
    let other_user = GetJobRequest { user: "bob".into(), ..by_key };
    assert_eq!(second.raw().get_job(other_user).await.unwrap_err().code(), Code::NotFound);

    // The same key with other content is a client bug, never a second job.
    let refused = create_within(&second, keyed(key, r#"{"order":78}"#), Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(key), "the refusal names the key: {}", refused.message());
    let repeat = second.raw().create_job(keyed(key, variables)).await.unwrap().into_inner();
    assert_eq!((repeat.key, repeat.created, repeat.state.as_str()), (job_key, false, "activatable"));

    // Once its window (a minute here) has passed, the key names nothing and makes a new job.
    let window_ends = Instant::now() + Duration::from_secs(60);
    tokio::time::sleep_until(window_ends.into()).await;
    let fresh = loop {
        let answer = second.raw().create_job(keyed(key, r#"{"order":78}"#)).await.unwrap().into_inner();
        if answer.created {
            break answer.key;
        }
        assert!(window_ends.elapsed() < Duration::from_secs(20), "the key still names its job 20 s after its window");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(fresh, job_key, "a key past its window makes a new job");
}

fn checkpoint(
    job: &drover::proto::gateway::ActivatedJob,
    attempt: u32,
    stage: &str,
    variables: &str,
) -> CheckpointJobRequest {
    CheckpointJobRequest { key: job.key, attempt, stage: stage.into(), variables: variables.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_after_a_checkpoint_is_resumed_at_its_stage() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway = cluster.live().into_iter().find(|n| *n != leader).unwrap();
    let client = Client::connect(&cluster.node(gateway).grpc).await.unwrap();
    let request = CreateJobRequest {
        r#type: "refund".into(),
        variables: r#"{"amount":500}"#.into(),
        stages: vec!["charged".into(), "notified".into(), "receipt".into()],
        retries: Some(3),
        ..Default::default()
    };
    let key = client.create(request).await.unwrap();

    // The first attempt charges, commits "charged" with the charge id, and dies.
    let first = client.activate("refund", "worker-a", 1, 1_500, 5_000).await.unwrap().remove(0);
    assert_eq!((first.attempt, first.stage.as_str()), (1, ""));
    let extended = client.raw().checkpoint_job(checkpoint(&first, 1, "charged", r#"{"charge":"ch_1"}"#)).await;
    assert!(extended.unwrap().into_inner().deadline >= first.deadline, "a checkpoint extends the lease");
    // The stage is replicated: it survives its leader.
    cluster.kill(leader);

    // The next attempt, after the first one's lease ran out, starts at "charged".
    let asked = Instant::now();
    let mut second = loop {
        let jobs = client.activate("refund", "worker-b", 1, 60_000, 1_000).await.unwrap_or_default();
        if !jobs.is_empty() {
            break jobs;
        }
        assert!(asked.elapsed() < Duration::from_secs(30), "the job was not activated again within 30 s");
    };
    let second = second.remove(0);
    assert_eq!((second.key, second.attempt, second.stage.as_str()), (key, 2, "charged"));
    let variables: serde_json::Value = serde_json::from_str(&second.variables).unwrap();
    assert_eq!((variables["amount"].as_i64(), variables["charge"].as_str()), (Some(500), Some("ch_1")));
    assert_eq!(second.retries, 3, "a lapsed lease is not a failure");

    // The dead attempt's checkpoints are refused, even a repeat of its own.
    for stage in ["notified", "charged"] {
        let zombie = client.raw().checkpoint_job(checkpoint(&second, 1, stage, "{}")).await.unwrap_err();
        assert_eq!(zombie.code(), Code::FailedPrecondition, "{zombie:?}");
    }
    // Stages only move forward: "charged" is done.
    let again = client.raw().checkpoint_job(checkpoint(&second, 2, "charged", "{}")).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("already committed"), "{}", again.message());
    let unknown = client.raw().checkpoint_job(checkpoint(&second, 2, "shipped", "{}")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown:?}");

    client.raw().checkpoint_job(checkpoint(&second, 2, "notified", r#"{"mail":"m_9"}"#)).await.unwrap();
    // A repeat of a checkpoint that took effect (a retry after a lost answer) is OK.
    client.raw().checkpoint_job(checkpoint(&second, 2, "notified", r#"{"mail":"m_9"}"#)).await.unwrap();
    client.complete(key, 2, r#"{"receipt":"r_1"}"#).await.unwrap();

    let job = client.get_job(key).await.unwrap();
    assert_eq!((job.state.as_str(), job.stage.as_str()), ("completed", "notified"));
    let committed: Vec<(&str, u32)> = job.checkpoints.iter().map(|c| (c.stage.as_str(), c.attempt)).collect();
    assert_eq!(committed, [("charged", 1), ("notified", 2)], "each stage once, by the attempt that did it");
    assert!(job.variables.contains("m_9") && job.result.contains("r_1"), "{job:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn await_job_answers_when_the_job_is_final_and_says_so_when_time_runs_out() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway = cluster.live().into_iter().find(|n| *n != leader).unwrap();
    let producer = Client::connect(&cluster.node(gateway).grpc).await.unwrap();
    let worker = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    let key = producer.create(keyed("order-5", r#"{"order":5}"#)).await.unwrap();

    // Nothing finishes it: "not final yet", not an error, once the wait is over.
    let started = Instant::now();
    let (job, is_final) = producer.await_job(key, Duration::from_millis(300)).await.expect("a wait that ends is OK");
    assert!(!is_final && job.state == "activatable", "{job:?}");
    assert!(started.elapsed() >= Duration::from_millis(300), "answered before the wait was over");
    // A caller's own deadline shorter than the wait: answered before it, not DEADLINE_EXCEEDED.
    let mut short = tonic::Request::new(AwaitJobRequest { key, ..Default::default() });
    short.set_timeout(Duration::from_secs(1));
    let mut stream = producer.raw().await_job(short).await.expect("AwaitJob within the caller's deadline").into_inner();
    let reply = stream.message().await.expect("an answer, not DEADLINE_EXCEEDED").expect("one message");
    assert!(!reply.r#final);

    // Waiting by idempotency key, through a gateway that does not lead the partition.
    let by_key = AwaitJobRequest {
        idempotency_key: "order-5".into(),
        user: "alice".into(),
        timeout: 30_000,
        ..Default::default()
    };
    let mut raw = producer.raw();
    let waiting = tokio::spawn(async move {
        let reply = raw.await_job(by_key).await?.into_inner().message().await?;
        Ok::<_, tonic::Status>((reply, Instant::now()))
    });
    let job = worker.activate("refund", "w", 1, 60_000, 5_000).await.unwrap().remove(0);
    worker.complete(job.key, job.attempt, r#"{"refunded":true}"#).await.unwrap();
    let completed = Instant::now();
    let (reply, answered) = waiting.await.unwrap().expect("AwaitJob answers");
    let reply = reply.expect("one message");
    let job = reply.job.unwrap();
    assert!(reply.r#final, "{job:?}");
    assert_eq!((job.key, job.state.as_str(), job.result.as_str()), (key, "completed", r#"{"refunded":true}"#));
    eprintln!(
        "AwaitJob answered {:?} after the completion was acknowledged",
        answered.saturating_duration_since(completed)
    );
    assert!(
        answered.saturating_duration_since(completed) < Duration::from_secs(5),
        "AwaitJob answered {:?} after the completion, not when the job became final",
        answered.saturating_duration_since(completed)
    );
    // A final job answers at once.
    let (job, is_final) = producer.await_job(key, Duration::from_secs(30)).await.unwrap();
    assert!(is_final && job.state == "completed");

    // Bad requests name what is wrong.
    for bad in [
        AwaitJobRequest::default(),
        AwaitJobRequest { key, idempotency_key: "order-5".into(), ..Default::default() },
        AwaitJobRequest { key, timeout: -1, ..Default::default() },
        AwaitJobRequest { key, timeout: 600_001, ..Default::default() },
    ] {
        let Err(error) = producer.raw().await_job(bad).await else { panic!("a bad AwaitJob was accepted") };
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    }
    let missing = producer.raw().await_job(AwaitJobRequest { key: key + 1000, ..Default::default() }).await;
    let Err(missing) = missing else { panic!("AwaitJob of a job that does not exist was accepted") };
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_are_checked_when_a_job_is_created() {
    let cluster = ProcessCluster::start(1, 1, 1, &[]);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let with_stages = |stages: Vec<String>| CreateJobRequest { r#type: "t".into(), stages, ..Default::default() };
    for (stages, needle) in [
        (vec!["a".into(), "a".into()], "declared twice"),
        (vec![String::new()], "must not be empty"),
        ((0..33).map(|n| n.to_string()).collect(), "at most 32"),
    ] {
        let error = client.create(with_stages(stages)).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().contains(needle), "{}", error.message());
    }
    // A job without stages cannot be checkpointed.
    let key = client.create(with_stages(Vec::new())).await.unwrap();
    let job = client.activate("t", "w", 1, 60_000, 0).await.unwrap().remove(0);
    assert_eq!(job.key, key);
    let error = client.raw().checkpoint_job(checkpoint(&job, job.attempt, "a", "{}")).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(error.message().contains("declares no stages"), "{}", error.message());
}

/// `drover job ...` against `address`: (exit code, stdout).
fn cli(address: &str, args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(common::drover_bin())
        .args(["job", "--address", address])
        .args(args)
        .output()
        .expect("run drover job");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_with_a_key_and_waits_for_the_result() {
    let cluster = ProcessCluster::start(1, 1, 1, &[]);
    cluster.wait_ready().await;
    let address = cluster.node(0).grpc.clone();
    let create = ["create", "--type", "invoice", "--idempotency-key", "inv-1", "--user", "ops", "--stage", "drafted"];
    let (code, out) = cli(&address, &create);
    assert_eq!(code, 0, "{out}");
    let key: u64 = out.trim().parse().expect("the key");
    let (code, out) = cli(&address, &create);
    assert_eq!((code, out.trim()), (0, key.to_string().as_str()), "the same key names the same job");

    let (code, out) = cli(&address, &["wait", &key.to_string(), "--timeout-ms", "200"]);
    assert_eq!(code, 4, "a wait that ends before the job is final: {out}");
    let client = Client::connect(&address).await.unwrap();
    let job = client.activate("invoice", "w", 1, 60_000, 1_000).await.unwrap().remove(0);
    client.complete(job.key, job.attempt, r#"{"number":"F-1"}"#).await.unwrap();
    let (code, out) = cli(&address, &["wait", "--idempotency-key", "inv-1", "--user", "ops"]);
    assert_eq!(code, 0, "{out}");
    let printed: serde_json::Value = serde_json::from_str(&out).expect("the job as JSON");
    assert_eq!((printed["state"].as_str(), printed["result"]["number"].as_str()), (Some("completed"), Some("F-1")));
    assert_eq!(printed["stages"], serde_json::json!(["drafted"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_incidents_page_through_three_partitions_and_are_retried_in_bulk() {
    use drover::proto::gateway::{FailJobRequest, JobFilter, ListJobsRequest, RetryJobsRequest};
    use futures::StreamExt;

    const JOBS: usize = 10_000;
    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let requests = (0..JOBS).map(|n| CreateJobRequest {
        r#type: "ledger".into(),
        variables: format!(r#"{{"n":{n}}}"#),
        retries: Some(1),
        ..Default::default()
    });
    let mut answers = client.raw().create_jobs(futures::stream::iter(requests)).await.unwrap().into_inner();
    let mut created = std::collections::BTreeSet::new();
    while let Some(answer) = answers.message().await.unwrap() {
        assert!(answer.error.is_none(), "{answer:?}");
        created.insert(answer.key);
    }
    assert_eq!(created.len(), JOBS);
    let partitions: std::collections::BTreeSet<u64> = created.iter().map(|k| k >> 48).collect();
    assert_eq!(partitions.len(), 3, "jobs spread over the three partitions");

    // Every job fails its last retry: ten thousand incidents.
    let mut held = Vec::new();
    while held.len() < JOBS {
        let jobs = client.activate("ledger", "w", 1000, 600_000, 1_000).await.unwrap();
        assert!(!jobs.is_empty(), "only {} of {JOBS} jobs were activated", held.len());
        held.extend(jobs);
    }
    futures::stream::iter(held)
        .for_each_concurrent(64, |job| {
            let mut raw = client.raw();
            async move {
                let request = FailJobRequest {
                    key: job.key,
                    attempt: job.attempt,
                    retries: 0,
                    error_message: "ledger locked".into(),
                    ..Default::default()
                };
                raw.fail_job(request).await.expect("fail");
            }
        })
        .await;

    let incidents = JobFilter { state: "incident".into(), r#type: "ledger".into(), ..Default::default() };
    let mut listed = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let request = ListJobsRequest { filter: Some(incidents.clone()), page_size: 700, page_token: token };
        // Each page through another gateway: a token is not tied to one.
        let gateway = Client::connect(&cluster.node(pages % 3).grpc).await.unwrap();
        let page = gateway.raw().list_jobs(request).await.expect("a page").into_inner();
        assert!(page.jobs.len() <= 700);
        assert!(page.jobs.iter().all(|j| j.state == "incident" && j.error_message == "ledger locked"));
        listed.extend(page.jobs.iter().map(|j| j.key));
        pages += 1;
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
        assert!(pages < 100, "paging does not end");
    }
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "pages repeat or go back");
    let listed_set: std::collections::BTreeSet<u64> = listed.iter().copied().collect();
    assert_eq!(listed_set, created, "the pages hold exactly the incidents");

    let bad = client.raw().list_jobs(ListJobsRequest { page_token: "x".into(), ..Default::default() }).await;
    assert_eq!(bad.unwrap_err().code(), Code::InvalidArgument);

    let dry = RetryJobsRequest { filter: Some(incidents.clone()), retries: 2, dry_run: true };
    let counted = client.raw().retry_jobs(dry).await.unwrap().into_inner();
    assert_eq!((counted.matched, counted.changed), (JOBS as u64, 0), "{counted:?}");
    let retried =
        client.raw().retry_jobs(RetryJobsRequest { filter: Some(incidents), retries: 2, dry_run: false }).await;
    let retried = retried.unwrap().into_inner();
    assert_eq!((retried.matched, retried.changed, retried.failed), (JOBS as u64, JOBS as u64, 0), "{retried:?}");

    // They are activatable again, with the retries given.
    let ready = JobFilter { state: "activatable".into(), r#type: "ledger".into(), ..Default::default() };
    let mut again = 0;
    let mut token = String::new();
    loop {
        let request = ListJobsRequest { filter: Some(ready.clone()), page_size: 1000, page_token: token };
        let page = client.raw().list_jobs(request).await.unwrap().into_inner();
        assert!(page.jobs.iter().all(|j| j.retries == 2));
        again += page.jobs.len();
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(again, JOBS);
    let activated = client.activate("ledger", "w2", 10, 60_000, 1_000).await.unwrap();
    assert_eq!(activated.len(), 10, "retried incidents are activated");
}

/// The de-duplication table is bounded by its size as well as its window: a
/// create with a new key past the bound is RESOURCE_EXHAUSTED (nothing is
/// made), while a repeat of a remembered key and creates without a key go on,
/// and the table's size is a metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_dedupe_table_refuses_new_keys_and_still_answers_repeats() {
    let cluster = ProcessCluster::start(1, 1, 1, &["--idempotency-max-keys", "3"]);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let limit = Duration::from_secs(10);
    let mut keys = Vec::new();
    for n in 0..3 {
        let (key, created) = create_within(&client, keyed(&format!("bounded-{n}"), "{}"), limit).await.unwrap();
        assert!(created);
        keys.push(key);
    }
    let refused = create_within(&client, keyed("bounded-3", "{}"), limit).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("--idempotency-max-keys 3"), "{}", refused.message());
    let by_key = GetJobRequest { idempotency_key: "bounded-3".into(), user: "alice".into(), ..Default::default() };
    let missing = client.raw().get_job(by_key).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "the refused create made no job");
    let (again, created) = create_within(&client, keyed("bounded-1", "{}"), limit).await.unwrap();
    assert_eq!((again, created), (keys[1], false), "a repeat finds its job");
    let plain = CreateJobRequest { r#type: "refund".into(), ..Default::default() };
    let (_, created) = create_within(&client, plain, limit).await.unwrap();
    assert!(created, "a create without a key goes on");
    common::eventually(Duration::from_secs(30), "the table's size metric", || {
        let cluster = &cluster;
        async move { cluster.metric(0, "drover_dedupe_entries").await >= 3.0 }
    })
    .await;
}

/// A tenant's share of the table: one tenant that uses its share up is
/// refused, and another tenant's keys still have room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_use_up_the_dedupe_table_for_another() {
    let args = ["--idempotency-max-keys", "10", "--idempotency-max-keys-per-tenant", "2"];
    let cluster = ProcessCluster::start(1, 1, 1, &args);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let limit = Duration::from_secs(10);
    let of = |tenant: &str, key: &str| CreateJobRequest { tenant_id: tenant.into(), ..keyed(key, "{}") };
    let (first, _) = create_within(&client, of("acme", "a-0"), limit).await.unwrap();
    create_within(&client, of("acme", "a-1"), limit).await.unwrap();
    let refused = create_within(&client, of("acme", "a-2"), limit).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("tenant \"acme\" holds its share"), "{}", refused.message());
    let (_, created) = create_within(&client, of("globex", "g-0"), limit).await.unwrap();
    assert!(created, "another tenant's key has room");
    let (again, created) = create_within(&client, of("acme", "a-0"), limit).await.unwrap();
    assert_eq!((again, created), (first, false), "a repeat of a remembered key is answered");
}
