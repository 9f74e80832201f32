//! Large jobs on three real nodes: every message between clients, gateways and
//! partition leaders stays within its limit, so jobs near the payload limit
//! commit, activate and reach stream workers instead of stalling a partition
//! or being activated and then lost on the way to the worker.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{http_get, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::{CreateJobRequest, StreamActivatedJobsRequest};

/// Just under the default payload limit of 4 MiB.
const NEAR_LIMIT: usize = 3_900_000;
/// An append of a few MiB must reach a follower and be synced there within a
/// heartbeat; on a busy test machine 250 ms is not always enough.
const SLOW_DISK_RAFT: &[&str] = &["--heartbeat-ms", "1000", "--election-timeout-ms", "5000"];

/// A JSON object of about `size` bytes.
fn variables(n: usize, size: usize) -> String {
    format!(r#"{{"n":{n},"blob":"{}"}}"#, "x".repeat(size))
}

fn create(job_type: &str, n: usize, size: usize) -> CreateJobRequest {
    CreateJobRequest { r#type: job_type.into(), variables: variables(n, size), ..Default::default() }
}

/// A node's raw partition view, for failure messages.
async fn partitions(cluster: &ProcessCluster, node: usize) -> String {
    match http_get(&cluster.node(node).admin, "/actuator/partitions").await {
        Ok((_, body)) => body,
        Err(e) => format!("unavailable: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_near_the_payload_limit_commit_together() {
    // Creates queue behind each other; the whole test has 30 s, so requests
    // get as long.
    let mut args = SLOW_DISK_RAFT.to_vec();
    args.extend(["--request-timeout-ms", "30000"]);
    let cluster = ProcessCluster::start(3, 1, 3, &args);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let client = cluster.node(leader).client().await;

    // A CreateJobs stream, and forty concurrent calls besides: the
    // leader batches whatever waits while its writes are in flight, so these
    // pile up into one Raft entry unless entries are cut by bytes.
    let started = Instant::now();
    let stream = async {
        let requests: Vec<CreateJobRequest> = (0..10).map(|n| create("large", n, NEAR_LIMIT)).collect();
        let mut replies = client.raw().create_jobs(futures::stream::iter(requests)).await?.into_inner();
        let mut keys = Vec::new();
        while let Some(reply) = replies.message().await? {
            assert!(reply.error.is_none(), "streamed create {} failed: {:?}", keys.len(), reply.error);
            keys.push(reply.key);
        }
        Ok::<_, tonic::Status>(keys)
    };
    let calls = futures::future::join_all((0..40).map(|n| client.create(create("large", n, NEAR_LIMIT))));
    let created = tokio::time::timeout(Duration::from_secs(30), futures::future::join(stream, calls)).await;
    let Ok((streamed, called)) = created else {
        panic!(
            "50 creates of 3.9 MB did not commit within 30 s; the leader's partitions: {}",
            partitions(&cluster, leader).await
        )
    };
    let mut keys = streamed.expect("the create stream succeeds");
    assert_eq!(keys.len(), 10, "one answer per streamed create");
    for (n, result) in called.into_iter().enumerate() {
        keys.push(result.unwrap_or_else(|e| panic!("create call {n} failed: {e}")));
    }
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 50, "fifty distinct jobs");
    eprintln!("50 creates of 3.9 MB committed in {:?}", started.elapsed());

    // The jobs are readable through another gateway, whole.
    let other = cluster.node((leader + 1) % 3).client().await;
    let job = other.get_job(keys[9]).await.expect("the last streamed job is readable through a follower's gateway");
    assert_eq!(job.variables, variables(9, NEAR_LIMIT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activating_two_large_jobs_delivers_them_or_leaves_them_activatable() {
    let cluster = ProcessCluster::start(3, 1, 3, &[]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    // Through the leader's gateway (its reply limit) and a follower's (the
    // forwarded reply between nodes).
    for (round, gateway) in [leader, (leader + 1) % 3].into_iter().enumerate() {
        let job_type = format!("large-activate-{round}");
        let client = cluster.node(gateway).client().await;
        let mut keys = HashSet::new();
        for n in 0..2 {
            keys.insert(client.create(create(&job_type, n, 3_000_000)).await.expect("create a 3 MB job"));
        }
        let mut delivered = HashSet::new();
        for _ in 0..4 {
            if delivered.len() == keys.len() {
                break;
            }
            match client.activate(&job_type, "w", 2, 600_000, 1_000).await {
                Ok(jobs) => {
                    for job in jobs {
                        assert_eq!(job.variables.len(), variables(0, 3_000_000).len(), "job {} is whole", job.key);
                        assert!(delivered.insert(job.key), "job {} delivered twice", job.key);
                    }
                }
                Err(status) => eprintln!("activate through node {gateway}: {status}"),
            }
        }
        // Nothing is held by an activation its worker never received.
        for key in &keys {
            let job = client.get_job(*key).await.expect("the job is readable");
            if delivered.contains(key) {
                assert_eq!(job.state, "activated", "delivered job {key}");
            } else {
                assert_eq!(job.state, "activatable", "job {key} was not delivered, so it must still be activatable");
            }
        }
        assert_eq!(delivered, keys, "both jobs were delivered through node {gateway} within four calls");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_jobs_are_pushed_to_a_stream_worker_on_another_node() {
    let cluster = ProcessCluster::start(3, 1, 3, SLOW_DISK_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let producer = cluster.node(leader).client().await;
    // Waiting before the stream opens, so the first push offers all of them:
    // about 78 MB together.
    let mut keys = HashSet::new();
    for n in 0..20 {
        keys.insert(producer.create(create("large-push", n, NEAR_LIMIT)).await.expect("create a 3.9 MB job"));
    }

    let gateway = cluster.node((leader + 1) % 3).grpc.clone();
    let request = StreamActivatedJobsRequest {
        r#type: "large-push".into(),
        worker: "w".into(),
        timeout: 600_000,
        max_jobs_in_flight: 32,
        ..Default::default()
    };
    let mut stream =
        Client::connect(&gateway).await.unwrap().raw().stream_activated_jobs(request).await.unwrap().into_inner();
    let mut received = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < keys.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(job))) => {
                assert!(job.variables.len() > NEAR_LIMIT, "job {} is whole", job.key);
                received.insert(job.key);
            }
            Ok(other) => panic!("the stream ended after {} of 20 jobs: {other:?}", received.len()),
            Err(_) => panic!(
                "the worker received {} of 20 large jobs within 30 s; pushes failing on the leader: {}",
                received.len(),
                cluster.metric(leader, "drover_broker_jobs_push_fail_try_count_total").await
            ),
        }
    }
    assert_eq!(received, keys, "every job reached the worker");
}
