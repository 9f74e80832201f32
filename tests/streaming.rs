//! Job streaming across gateways on a three-node cluster: aggregation, random
//! routing, yield and reroute when a worker is not ready, hand-back of buffered
//! jobs, streams that survive gateway and leader loss, tenant-aware routing,
//! restarted gateways, pushes whose outcome is unknown (and jobs of pushes
//! answered too late, handed back), credits released by completions
//! through another gateway, and the batch calls (several jobs to a message).

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{http_get, LocalNode, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::gateway_client::GatewayClient;
use drover::proto::gateway::{ActivatedJob, CreateJobRequest, StreamActivatedJobsRequest};
use tonic::transport::Endpoint;
use tonic::Streaming;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];
/// Long enough that a job waiting for its activation timeout fails the test.
const TIMEOUT_MS: i64 = 120_000;

fn request(job_type: &str, timeout: i64, fetch: &[&str]) -> StreamActivatedJobsRequest {
    StreamActivatedJobsRequest {
        r#type: job_type.into(),
        worker: "w".into(),
        timeout,
        fetch_variable: fetch.iter().map(|s| s.to_string()).collect(),
        tenant_ids: vec![],
        ..Default::default()
    }
}

/// A client whose HTTP/2 receive window is tiny, so a worker that stops
/// reading holds almost nothing in its transport.
async fn small_window_client(gateway: &str) -> GatewayClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("http://{gateway}"))
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .initial_connection_window_size(Some(1024))
        .connect()
        .await
        .unwrap();
    GatewayClient::new(channel)
}

async fn open(gateway: &str, request: StreamActivatedJobsRequest) -> Streaming<ActivatedJob> {
    Client::connect(gateway).await.unwrap().raw().stream_activated_jobs(request).await.unwrap().into_inner()
}

async fn jobstreams(cluster: &ProcessCluster, node: usize) -> serde_json::Value {
    let (_, body) = http_get(&cluster.node(node).admin, "/actuator/jobstreams").await.unwrap();
    serde_json::from_str(&body).unwrap()
}

/// Reads and completes jobs from `stream` until `stop` says so.
fn complete_all(gateway: String, mut stream: Streaming<ActivatedJob>) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let client = Client::connect(&gateway).await.unwrap();
        let mut done = Vec::new();
        while let Ok(Ok(Some(job))) = tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
            client.complete(job.key, job.attempt, "{}").await.unwrap();
            done.push(job.key);
        }
        done
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivalent_workers_share_one_stream_and_others_do_not() {
    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let gateway = cluster.node(0).grpc.clone();
    let _a = open(&gateway, request("agg", 30_000, &["x", "y"])).await;
    let _b = open(&gateway, request("agg", 30_000, &["y", "x", "y"])).await;
    let _c = open(&gateway, request("agg", 45_000, &["x", "y"])).await;
    let _d = open(&gateway, request("agg", 30_000, &["x"])).await;

    let view = jobstreams(&cluster, 0).await;
    let client: Vec<&serde_json::Value> =
        view["client"].as_array().unwrap().iter().filter(|s| s["key"]["job_type"] == "agg").collect();
    assert_eq!(
        client.len(),
        3,
        "same parameters in another order aggregate; other timeout or variables do not: {view}"
    );
    let mut sizes: Vec<usize> = client.iter().map(|s| s["clients"].as_array().unwrap().len()).collect();
    sizes.sort();
    assert_eq!(sizes, vec![1, 1, 2]);

    // Every broker knows the three aggregated streams of gateway 0.
    for node in 0..3 {
        common::eventually(Duration::from_secs(10), "brokers to learn the streams", || {
            let cluster = &cluster;
            async move {
                let view = jobstreams(cluster, node).await;
                view["remote"].as_array().unwrap().iter().filter(|s| s["jobType"] == "agg").count() == 3
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_two_gateways_both_receive_jobs() {
    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let (g0, g1) = (cluster.node(0).grpc.clone(), cluster.node(1).grpc.clone());
    let on_0 = complete_all(g0.clone(), open(&g0, request("fair", TIMEOUT_MS, &[])).await);
    let on_1 = complete_all(g1.clone(), open(&g1, request("fair", TIMEOUT_MS, &[])).await);
    common::eventually(Duration::from_secs(10), "both streams registered everywhere", || {
        let cluster = &cluster;
        async move {
            let mut ok = true;
            for node in 0..3 {
                let view = jobstreams(cluster, node).await;
                ok &= view["remote"].as_array().unwrap().iter().filter(|s| s["jobType"] == "fair").count() == 2;
            }
            ok
        }
    })
    .await;
    let producer = Client::connect(&cluster.node(2).grpc).await.unwrap();
    for n in 0..200 {
        producer.create_job("fair", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let (a, b) = (on_0.await.unwrap(), on_1.await.unwrap());
    assert_eq!(a.len() + b.len(), 200, "every job completed once");
    assert!(a.len() >= 20 && b.len() >= 20, "neither gateway starves: {} / {}", a.len(), b.len());
}

/// `--push-placement local`: a partition's leader pushes to the stream on
/// its own node's gateway while that stream has room (none of the jobs go to
/// the two other gateways' workers, where at random two thirds would), and to
/// the others once it is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_push_placement_a_leader_serves_its_own_gateway_first() {
    let args = [FAST_RAFT, &["--push-placement", "local"]].concat();
    let cluster = ProcessCluster::start(3, 1, 3, &args);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateways: Vec<String> = (0..3).map(|n| cluster.node(n).grpc.clone()).collect();
    let registered = |job_type: &'static str| {
        let cluster = &cluster;
        async move {
            let view = jobstreams(cluster, leader).await;
            view["remote"].as_array().unwrap().iter().filter(|s| s["jobType"] == job_type).count() == 3
        }
    };

    let mut workers = Vec::new();
    for g in &gateways {
        workers.push(complete_all(g.clone(), open(g, request("near", TIMEOUT_MS, &[])).await));
    }
    common::eventually(Duration::from_secs(10), "three streams registered with the leader", || registered("near"))
        .await;
    let producer = Client::connect(&gateways[leader]).await.unwrap();
    for n in 0..30 {
        producer.create_job("near", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let mut done = Vec::new();
    for worker in workers {
        done.push(worker.await.unwrap().len());
    }
    // While a push to the leader's own stream is in flight its room is
    // claimed, so a job created then may go elsewhere: nearly all, not all.
    // At random, about ten of the thirty would.
    assert!(done[leader] >= 24, "the jobs went to node {leader}'s own gateway (jobs per gateway {done:?})");
    assert_eq!(done.iter().sum::<usize>(), 30, "every job completed once (jobs per gateway {done:?})");

    // The leader's own stream takes two jobs at most and finishes none.
    let mut full = request("near-full", TIMEOUT_MS, &[]);
    full.max_jobs_in_flight = 2;
    let mut own = open(&gateways[leader], full).await;
    let mut others = Vec::new();
    for g in gateways.iter().enumerate().filter(|(n, _)| *n != leader).map(|(_, g)| g) {
        others.push(complete_all(g.clone(), open(g, request("near-full", TIMEOUT_MS, &[])).await));
    }
    common::eventually(Duration::from_secs(10), "three streams registered with the leader", || registered("near-full"))
        .await;
    for n in 0..10 {
        producer.create_job("near-full", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let mut elsewhere = 0;
    for worker in others {
        elsewhere += worker.await.unwrap().len();
    }
    assert_eq!(elsewhere, 8, "the jobs the full stream had no room for went to the other gateways");
    for _ in 0..2 {
        let job = tokio::time::timeout(Duration::from_secs(5), own.message()).await;
        assert!(matches!(job, Ok(Ok(Some(_)))), "the leader's own stream holds two jobs: {job:?}");
    }
}

/// Jobs a stuck worker may hold beyond the gateway's buffer: one in the
/// encoder plus the two or three padded jobs that fit in a 1 KiB HTTP/2 window.
const IN_TRANSPORT: usize = 5;

fn padded(n: usize) -> String {
    format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(400))
}

async fn blocked_total(cluster: &ProcessCluster) -> f64 {
    let mut total = 0.0;
    for node in 0..3 {
        total += cluster.metric(node, "drover_broker_jobs_push_fail_try_count_total").await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_reading_has_its_jobs_rerouted() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let (g0, g1) = (cluster.node(0).grpc.clone(), cluster.node(1).grpc.clone());
    // The stuck worker: opens its stream on gateway 0 and stops reading.
    let mut stuck_client = small_window_client(&g0).await;
    let mut stuck = stuck_client.stream_activated_jobs(request("slow", TIMEOUT_MS, &[])).await.unwrap().into_inner();
    let healthy = complete_all(g1.clone(), open(&g1, request("slow", TIMEOUT_MS, &[])).await);
    let blocked_before = blocked_total(&cluster).await;

    let producer = Client::connect(&cluster.node(2).grpc).await.unwrap();
    let started = Instant::now();
    let mut keys = HashSet::new();
    for n in 0..150 {
        keys.insert(producer.create_job("slow", &padded(n)).await.unwrap());
    }
    let done: HashSet<u64> = healthy.await.unwrap().into_iter().collect();
    let elapsed = started.elapsed();
    // Whatever the stuck worker holds is what the healthy one did not get.
    let mut held = HashSet::new();
    while let Ok(Ok(Some(job))) = tokio::time::timeout(Duration::from_millis(500), stuck.message()).await {
        held.insert(job.key);
    }
    assert_eq!(
        blocked_total(&cluster).await,
        blocked_before,
        "once the stuck worker's stream was full, no job was pushed there only to be yielded"
    );
    assert_eq!(done.len() + held.len(), keys.len(), "every job went to exactly one worker");
    assert!(held.len() <= streams_buffer(), "the stuck worker held {} jobs", held.len());
    assert!(done.len() >= keys.len() - streams_buffer());
    assert!(
        elapsed < Duration::from_millis(TIMEOUT_MS as u64 / 4),
        "done in {elapsed:?}, far under the activation timeout"
    );
}

async fn next_job(stream: &mut Streaming<ActivatedJob>) -> ActivatedJob {
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(job))) => job,
        other => panic!("expected a job within 10 s, got {other:?}"),
    }
}

/// What a stream that names no limit holds at most.
fn streams_buffer() -> usize {
    drover::streams::DEFAULT_MAX_IN_FLIGHT
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_buffered_for_a_closed_stream_are_handed_back_at_once() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let g0 = cluster.node(0).grpc.clone();
    let mut stuck_client = small_window_client(&g0).await;
    let stuck = stuck_client.stream_activated_jobs(request("handback", TIMEOUT_MS, &[])).await.unwrap().into_inner();
    let producer = Client::connect(&cluster.node(1).grpc).await.unwrap();
    let started = Instant::now();
    let mut keys = HashSet::new();
    // More than the stuck worker's buffer holds: the rest wait for another worker.
    for n in 0..streams_buffer() + 44 {
        keys.insert(producer.create_job("handback", &padded(n)).await.unwrap());
    }
    common::eventually(Duration::from_secs(10), "the stuck worker's buffer to fill", || {
        let cluster = &cluster;
        async move { cluster.metric(0, "drover_gateway_job_stream_push_total").await >= streams_buffer() as f64 }
    })
    .await;
    drop(stuck);
    drop(stuck_client);
    let g2 = cluster.node(2).grpc.clone();
    let done: HashSet<u64> = complete_all(g2.clone(), open(&g2, request("handback", TIMEOUT_MS, &[])).await)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let handed_back = cluster.metric(0, "drover_gateway_job_stream_handed_back_total").await;
    assert!(handed_back >= (streams_buffer() - IN_TRANSPORT) as f64, "{handed_back} jobs handed back");
    assert!(done.len() >= keys.len() - IN_TRANSPORT, "only {} of {} completed", done.len(), keys.len());
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS as u64 / 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_survive_the_loss_of_a_gateway_and_of_a_leader() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway_node = (leader + 1) % 3;
    let other = (leader + 2) % 3;

    // A worker on a gateway that is not the leader; the gateway dies.
    let g = cluster.node(gateway_node).grpc.clone();
    let _first = open(&g, request("survive", TIMEOUT_MS, &[])).await;
    cluster.kill(gateway_node);
    // The worker reconnects to another gateway and keeps receiving.
    let g_other = cluster.node(other).grpc.clone();
    let mut reconnected = open(&g_other, request("survive", TIMEOUT_MS, &[])).await;
    let producer = Client::connect(&g_other).await.unwrap();
    let key = producer.create_job("survive", "{}").await.unwrap();
    let job = tokio::time::timeout(Duration::from_secs(10), reconnected.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(job.key, key);

    // Bring the gateway back, then kill the partition leader: the stream keeps
    // receiving from the new leader.
    cluster.start_node(gateway_node);
    cluster.node(gateway_node).wait_ready().await;
    cluster.kill(leader);
    let new_leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let key = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(key) = producer.create_job("survive", "{}").await {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a create succeeds under the new leader");
    let job = tokio::time::timeout(Duration::from_secs(10), reconnected.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(job.key, key, "pushed by the new leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_no_more_jobs_than_it_allows_until_it_finishes_some() {
    let cluster = ProcessCluster::start(1, 1, 1, FAST_RAFT);
    cluster.wait_ready().await;
    let g = cluster.node(0).grpc.clone();
    let client = Client::connect(&g).await.unwrap();

    let mut too_many = request("limited", TIMEOUT_MS, &[]);
    too_many.max_jobs_in_flight = 1001;
    let refused = client.raw().stream_activated_jobs(too_many).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    let mut limited = request("limited", TIMEOUT_MS, &[]);
    limited.max_jobs_in_flight = 2;
    let mut stream = open(&g, limited).await;
    for n in 0..5 {
        client.create_job("limited", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let first = next_job(&mut stream).await;
    let _second = next_job(&mut stream).await;
    // A push past the limit would have brought a third job by now.
    let third = tokio::time::timeout(Duration::from_millis(700), stream.message()).await;
    assert!(third.is_err(), "a third job arrived while two were held: {third:?}");

    client.fail(first.key, first.attempt, 3, "try again later", 60_000).await.unwrap();
    let third = next_job(&mut stream).await;
    assert_ne!(third.key, first.key, "the failed job waits for its back-off");
}

fn tenant_request(job_type: &str, tenants: &[&str]) -> StreamActivatedJobsRequest {
    StreamActivatedJobsRequest {
        tenant_ids: tenants.iter().map(|t| t.to_string()).collect(),
        ..request(job_type, TIMEOUT_MS, &[])
    }
}

async fn create_for_tenant(client: &Client, job_type: &str, tenant: &str) -> u64 {
    let request = CreateJobRequest {
        r#type: job_type.into(),
        variables: "{}".into(),
        tenant_id: tenant.into(),
        ..Default::default()
    };
    client.create(request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_gets_no_jobs_meant_for_its_previous_streams() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let (gateway, producer_node) = ((leader + 1) % 3, (leader + 2) % 3);

    let _before = open(&cluster.node(gateway).grpc, tenant_request("restarted", &["t1"])).await;
    wait_for_registration(&cluster, gateway, leader).await;
    // The gateway dies without a word and comes back on the same data directory.
    cluster.kill(gateway);
    cluster.start_node(gateway);
    cluster.node(gateway).wait_ready().await;
    let mut t2 = open(&cluster.node(gateway).grpc, tenant_request("restarted", &["t2"])).await;
    wait_for_registration(&cluster, gateway, leader).await;

    let producer = Client::connect(&cluster.node(producer_node).grpc).await.unwrap();
    let key = create_for_tenant(&producer, "restarted", "t1").await;
    let wrong = tokio::time::timeout(Duration::from_secs(3), t2.message()).await;
    assert!(wrong.is_err(), "the tenant-t2 worker received a job of tenant t1: {wrong:?}");

    // The job waits for a worker of its own tenant.
    let mut t1 = open(&cluster.node(producer_node).grpc, tenant_request("restarted", &["t1"])).await;
    let job = next_job(&mut t1).await;
    assert_eq!((job.key, job.tenant_id.as_str()), (key, "t1"));
}

/// Waits until the partition leader knows the stream `gateway` now holds
/// (its only one) under the id the gateway gave it.
async fn wait_for_registration(cluster: &ProcessCluster, gateway: usize, leader: usize) {
    let view = jobstreams(cluster, gateway).await;
    let id = view["client"][0]["id"].as_u64().expect("the gateway holds a stream");
    common::eventually(Duration::from_secs(10), "the leader to learn the gateway's stream", || async move {
        let view = jobstreams(cluster, leader).await;
        view["remote"].as_array().unwrap().iter().any(|s| s["gatewayNodeId"] == gateway as u64 && s["streamId"] == id)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_is_pushed_to_a_stream_of_its_tenant() {
    let node = LocalNode::start().await;
    let gateway = node.node().grpc_addr.to_string();
    let _tenant_a = open(&gateway, tenant_request("split", &["a"])).await;
    let mut tenant_b = open(&gateway, tenant_request("split", &["b"])).await;
    for n in 0..50 {
        let key = create_for_tenant(&node.client, "split", "b").await;
        let job = match tokio::time::timeout(Duration::from_secs(5), tenant_b.message()).await {
            Ok(Ok(Some(job))) => job,
            other => panic!("job {n} ({key}) of tenant b was not pushed to the tenant-b stream within 5 s: {other:?}"),
        };
        assert_eq!(job.key, key, "job {n}");
        node.client.complete(job.key, job.attempt, "{}").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_the_gateway_could_not_confirm_reaches_at_most_one_worker() {
    let node = LocalNode::start().await;
    let gateway = node.node().grpc_addr.to_string();
    // Activations time out after 3 s, so a job that was not delivered comes back soon.
    let (mut first, mut second) = (
        open(&gateway, request("unconfirmed", 3_000, &[])).await,
        open(&gateway, request("unconfirmed", 3_000, &[])).await,
    );
    // The aggregator takes longer over the first push than anyone waits for it.
    node.node().ctx.gateway.streams.slow_down_next_push(Duration::from_secs(6));
    let mut keys = HashSet::new();
    for n in 0..5 {
        keys.insert(node.client.create_job("unconfirmed", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }
    let mut deliveries: HashMap<u64, Vec<u32>> = HashMap::new();
    let started = Instant::now();
    // Read until every job arrived, then 2 s more for late second deliveries.
    let mut quiet_until = None;
    loop {
        let until = quiet_until.unwrap_or(started + Duration::from_secs(30));
        let next = tokio::select! {
            job = first.message() => job,
            job = second.message() => job,
            _ = tokio::time::sleep_until(until.into()) => break,
        };
        let job = next.unwrap().expect("stream open");
        deliveries.entry(job.key).or_default().push(job.attempt);
        // A duplicate's completion is refused; the delivery is what counts.
        let _ = node.client.complete(job.key, job.attempt, "{}").await;
        if quiet_until.is_none() && keys.iter().all(|k| deliveries.contains_key(k)) {
            quiet_until = Some(Instant::now() + Duration::from_secs(2));
        }
    }
    let twice: Vec<_> = deliveries.iter().filter(|(_, attempts)| attempts.len() > 1).collect();
    assert!(twice.is_empty(), "jobs delivered more than once (key, attempts): {twice:?}");
    assert_eq!(deliveries.len(), keys.len(), "every job was delivered: {deliveries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_a_push_answered_too_late_go_out_again_before_their_timeout() {
    let node = LocalNode::start().await;
    let gateway = node.node().grpc_addr.to_string();
    let mut stream = open(&gateway, request("late", TIMEOUT_MS, &[])).await;
    // The aggregator comes to the first push after its leader stopped
    // waiting: the leader cannot tell whether a client took the job.
    node.node().ctx.gateway.streams.slow_down_next_push(Duration::from_millis(2_500));
    let mut keys = HashSet::new();
    for n in 0..5 {
        keys.insert(node.client.create_job("late", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }
    let mut deliveries: HashMap<u64, u32> = HashMap::new();
    while deliveries.len() < keys.len() {
        let job = match tokio::time::timeout(Duration::from_secs(20), stream.message()).await {
            Ok(Ok(Some(job))) => job,
            other => panic!(
                "{} of {} jobs delivered after 20 s (the activation timeout is {} s): {other:?}",
                deliveries.len(),
                keys.len(),
                TIMEOUT_MS / 1000
            ),
        };
        *deliveries.entry(job.key).or_default() += 1;
        node.client.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    assert!(deliveries.values().all(|n| *n == 1), "each job delivered once: {deliveries:?}");
    let (_, body) = http_get(&node.node().ctx.topology.admin_addr.to_string(), "/metrics").await.unwrap();
    let late = common::metric_sum(&body, r#"drover_gateway_job_stream_handed_back_total{reason="late"}"#);
    assert!(late >= 1.0, "the late push's job was handed back by the gateway ({late})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_completing_through_another_gateway_keeps_receiving_jobs() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let mut limited = request("elsewhere", TIMEOUT_MS, &[]);
    limited.max_jobs_in_flight = 2;
    let mut stream = open(&cluster.node(0).grpc, limited).await;
    // Completions go through another node, as behind a load balancer.
    let completer = Client::connect(&cluster.node(1).grpc).await.unwrap();
    let producer = Client::connect(&cluster.node(2).grpc).await.unwrap();
    for n in 0..10 {
        producer.create_job("elsewhere", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let started = Instant::now();
    for n in 0..10 {
        let job = match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(job))) => job,
            other => panic!("job {n} not pushed within 10 s (the stream allows 2 in flight): {other:?}"),
        };
        completer.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS as u64 / 4), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_gracefully_removes_its_streams_from_every_broker() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let _stream = open(&cluster.node(0).grpc, request("leaving", TIMEOUT_MS, &[])).await;
    let registered = |view: serde_json::Value| {
        view["remote"].as_array().unwrap().iter().any(|s| s["gatewayNodeId"] == 0 && s["jobType"] == "leaving")
    };
    for node in 1..3 {
        common::eventually(Duration::from_secs(10), "the brokers to learn the stream", || {
            let cluster = &cluster;
            async move { registered(jobstreams(cluster, node).await) }
        })
        .await;
    }
    cluster.node(0).signal(libc::SIGTERM);
    let process = &mut cluster.nodes[0].as_mut().unwrap().child;
    let deadline = Instant::now() + Duration::from_secs(20);
    while process.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "node 0 did not exit within 20 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Registrations left behind would live on for their 15 s TTL.
    for node in 1..3 {
        let view = jobstreams(&cluster, node).await;
        assert!(!registered(view.clone()), "node {node} still knows the stopped gateway's stream: {view}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_pushed_towards_a_dead_gateway_reach_a_live_one_at_once() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let (dead, live) = ((leader + 1) % 3, (leader + 2) % 3);
    let _orphan = open(&cluster.node(dead).grpc, request("rerouted", TIMEOUT_MS, &[])).await;
    let mut stream = open(&cluster.node(live).grpc, request("rerouted", TIMEOUT_MS, &[])).await;
    common::eventually(Duration::from_secs(10), "the leader to know both streams", || {
        let cluster = &cluster;
        async move {
            let view = jobstreams(cluster, leader).await;
            view["remote"].as_array().unwrap().iter().filter(|s| s["jobType"] == "rerouted").count() == 2
        }
    })
    .await;
    // Its registration outlives it: pushes to it fail to connect, which is
    // certain non-delivery, so the jobs are yielded to the live stream.
    cluster.kill(dead);
    let producer = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    let client = Client::connect(&cluster.node(live).grpc).await.unwrap();
    for n in 0..20 {
        let key = producer.create_job("rerouted", "{}").await.unwrap();
        let job = match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
            Ok(Ok(Some(job))) => job,
            other => panic!("job {n} ({key}) did not reach the live stream within 5 s: {other:?}"),
        };
        assert_eq!(job.key, key);
        client.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    let failed = |code: &'static str| {
        let cluster = &cluster;
        async move {
            cluster.metric(leader, &format!("drover_broker_jobs_push_fail_try_count_total{{code=\"{code}\"}}")).await
        }
    };
    assert!(failed("BLOCKED").await > 0.0, "some pushes went towards the dead gateway and were yielded");
    assert_eq!(failed("UNKNOWN").await, 0.0, "a refused connection is not an unknown outcome");
}

/// Jobs queued for the saturation test, and how long its workers spend on each.
const SATURATING_JOBS: usize = 200;
const WORK: Duration = Duration::from_millis(50);

/// A slow worker: reads a job, works on it for [`WORK`], completes it, until
/// `total` jobs are done (its own and others'). Returns the (key, attempt) of
/// every job it completed.
fn slow_worker(
    gateway: String,
    mut stream: Streaming<ActivatedJob>,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    total: usize,
) -> tokio::task::JoinHandle<Vec<(u64, u32)>> {
    use std::sync::atomic::Ordering;
    tokio::spawn(async move {
        let client = Client::connect(&gateway).await.unwrap();
        let mut completed = Vec::new();
        while done.load(Ordering::Acquire) < total {
            let job = match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                Ok(Ok(Some(job))) => job,
                // Another worker may have finished the last job meanwhile.
                Err(_) if done.load(Ordering::Acquire) >= total => break,
                other => {
                    panic!("no job pushed within 10 s with {} of {total} done: {other:?}", done.load(Ordering::Acquire))
                }
            };
            tokio::time::sleep(WORK).await;
            client.complete(job.key, job.attempt, "{}").await.unwrap();
            completed.push((job.key, job.attempt));
            done.fetch_add(1, Ordering::AcqRel);
        }
        completed
    })
}

/// Two workers on two gateways that each hold at most two jobs and take 50 ms
/// over each, and 200 jobs queued on three partitions: a leader pushes a job
/// only to a stream with room, so each job is activated about once (every
/// activation is counted by the attempt its worker completes), not pushed
/// and yielded again and again while the streams are full; and jobs waiting
/// for room stay activatable for a long poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_for_room_in_saturated_streams_instead_of_being_pushed_and_yielded() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let (g0, g1) = (cluster.node(0).grpc.clone(), cluster.node(1).grpc.clone());
    let mut limited = request("saturated", TIMEOUT_MS, &[]);
    limited.max_jobs_in_flight = 2;
    let (s0, s1) = (open(&g0, limited.clone()).await, open(&g1, limited).await);
    for node in 0..3 {
        common::eventually(Duration::from_secs(10), "every broker to know both streams", || {
            let cluster = &cluster;
            async move {
                let view = jobstreams(cluster, node).await;
                view["remote"].as_array().unwrap().iter().filter(|s| s["jobType"] == "saturated").count() == 2
            }
        })
        .await;
    }
    let done = Arc::new(AtomicUsize::new(0));
    let workers = [
        slow_worker(g0.clone(), s0, Arc::clone(&done), SATURATING_JOBS),
        slow_worker(g1.clone(), s1, Arc::clone(&done), SATURATING_JOBS),
    ];
    let producer = Client::connect(&cluster.node(2).grpc).await.unwrap();
    let mut keys = HashSet::new();
    for n in 0..SATURATING_JOBS {
        keys.insert(producer.create_job("saturated", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }

    // The streams hold four jobs between them; the rest wait, activatable.
    let polled = producer.activate("saturated", "poller", 5, TIMEOUT_MS, 5_000).await.unwrap();
    assert!(!polled.is_empty(), "a long poll found no job while the streams were full");
    let mut completed: Vec<(u64, u32)> = Vec::new();
    for job in &polled {
        producer.complete(job.key, job.attempt, "{}").await.unwrap();
        completed.push((job.key, job.attempt));
    }
    done.fetch_add(polled.len(), Ordering::AcqRel);
    for worker in workers {
        completed.extend(worker.await.unwrap());
    }

    let mut seen = HashSet::new();
    let twice: Vec<u64> = completed.iter().map(|(key, _)| *key).filter(|key| !seen.insert(*key)).collect();
    assert!(twice.is_empty(), "jobs completed more than once: {twice:?}");
    assert_eq!(seen, keys, "every job completed");
    let activations: u64 = completed.iter().map(|(_, attempt)| u64::from(*attempt)).sum();
    let most = completed.iter().map(|(_, attempt)| *attempt).max().unwrap_or(0);
    let yields = activations - SATURATING_JOBS as u64;
    eprintln!("{activations} activations of {SATURATING_JOBS} jobs ({yields} yields), at most {most} for one job");
    assert!(
        activations * 10 <= SATURATING_JOBS as u64 * 12,
        "{activations} activations for {SATURATING_JOBS} jobs (the most for one job: {most}): jobs were pushed \
         to full streams and yielded"
    );
}

async fn next_answer<T>(answers: &mut Streaming<T>) -> T {
    match tokio::time::timeout(Duration::from_secs(10), answers.message()).await {
        Ok(Ok(Some(answer))) => answer,
        other => panic!(
            "expected an answer to a batch within 10 s, got {}",
            if other.is_err() { "nothing" } else { "an error or the end" }
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_calls_carry_several_jobs_to_a_message_and_answer_each_job() {
    use drover::proto::gateway::{CompleteJobBatch, CompleteJobRequest, CreateJobBatch};
    let cluster = ProcessCluster::start(1, 1, 1, FAST_RAFT);
    cluster.wait_ready().await;
    let g = cluster.node(0).grpc.clone();
    let client = Client::connect(&g).await.unwrap();
    // A worker that does not read yet, with a tiny transport window: what is
    // pushed waits in the gateway, and leaves together once it reads.
    let mut worker = small_window_client(&g).await;
    let mut batched = request("batched", TIMEOUT_MS, &[]);
    batched.max_jobs_in_flight = 300;
    let mut messages = worker.stream_activated_job_batches(batched).await.unwrap().into_inner();

    let create = |n: usize| CreateJobRequest {
        r#type: "batched".into(),
        variables: format!(r#"{{"n":{n}}}"#),
        ..Default::default()
    };
    let batches = vec![
        CreateJobBatch { jobs: (0..200).map(create).collect() },
        CreateJobBatch { jobs: vec![create(200), CreateJobRequest { r#type: String::new(), ..create(201) }] },
        CreateJobBatch { jobs: vec![] },
        CreateJobBatch { jobs: (0..1025).map(create).collect() },
    ];
    let mut answers = client.raw().create_job_batches(futures::stream::iter(batches)).await.unwrap().into_inner();
    let first = next_answer(&mut answers).await.jobs;
    assert_eq!(first.len(), 200, "one answer per job of the batch");
    assert!(first.iter().all(|a| a.error.is_none() && a.key != 0), "{:?}", first.iter().find(|a| a.error.is_some()));
    let second = next_answer(&mut answers).await.jobs;
    assert_eq!(second.len(), 2);
    assert!(second[0].error.is_none(), "{:?}", second[0]);
    let refused = second[1].error.as_ref().expect("a job without a type is refused");
    assert_eq!(refused.code, tonic::Code::InvalidArgument as i32, "{refused:?}");
    assert!(next_answer(&mut answers).await.jobs.is_empty(), "an empty batch is answered with an empty batch");
    let too_large = next_answer(&mut answers).await.jobs;
    assert_eq!(too_large.len(), 1025);
    assert!(
        too_large
            .iter()
            .all(|a| a.error.as_ref().is_some_and(
                |e| e.code == tonic::Code::InvalidArgument as i32 && e.message.contains("at most 1024 jobs")
            )),
        "every job of a batch over the limit is refused: {:?}",
        too_large[0]
    );
    let mut created: HashSet<u64> = first.iter().map(|a| a.key).collect();
    created.insert(second[0].key);

    common::eventually(Duration::from_secs(10), "201 jobs pushed to the worker's gateway", || {
        let cluster = &cluster;
        async move { cluster.metric(0, "drover_gateway_job_stream_push_total").await >= 201.0 }
    })
    .await;
    let (mut received, mut count) = (Vec::new(), 0);
    while received.len() < created.len() {
        match tokio::time::timeout(Duration::from_secs(10), messages.message()).await {
            Ok(Ok(Some(batch))) => {
                assert!(!batch.jobs.is_empty(), "a message carries at least one job");
                received.extend(batch.jobs);
                count += 1;
            }
            other => panic!("expected jobs within 10 s, got {other:?} after {} jobs", received.len()),
        }
    }
    let keys: HashSet<u64> = received.iter().map(|j| j.key).collect();
    assert_eq!(keys, created, "every job created, once each");
    assert!(count < received.len() / 4, "{} jobs came in {count} messages", received.len());

    let mut completions: Vec<CompleteJobRequest> = received
        .iter()
        .map(|j| CompleteJobRequest { key: j.key, attempt: j.attempt, variables: "{}".into(), override_fence: false })
        .collect();
    let unknown = drover::core::JobKey::new(0, 999_999).0;
    completions
        .insert(7, CompleteJobRequest { key: unknown, attempt: 1, variables: "{}".into(), override_fence: false });
    let batch = CompleteJobBatch { jobs: completions };
    let mut answers = client.raw().complete_job_batches(futures::stream::iter([batch])).await.unwrap().into_inner();
    let answer = answers.message().await.unwrap().expect("an answer").jobs;
    assert_eq!(answer.len(), received.len() + 1);
    assert_eq!(answer[7].key, unknown, "answers keep the batch's order");
    assert_eq!(answer[7].error.as_ref().map(|e| e.code), Some(tonic::Code::NotFound as i32), "{:?}", answer[7]);
    let failed: Vec<_> = answer.iter().enumerate().filter(|(i, a)| *i != 7 && a.error.is_some()).collect();
    assert!(failed.is_empty(), "completions refused: {failed:?}");
    let job = client.get_job(received[0].key).await.unwrap();
    assert_eq!(job.state, "completed", "{job:?}");
    // Every message counted, both ways: four create batches and their
    // answers, the pushed messages, one completion batch and its answer.
    let messages = cluster.metric(0, "drover_gateway_stream_messages_total").await;
    assert_eq!(messages, (8 + count + 2) as f64, "messages counted on the job streams");
}

/// Runs ten jobs through a worker on a gateway that does not lead the
/// partition, allowing two in flight, with completions through a third node
/// (so each completion's release of the worker's slot goes between nodes);
/// the worker's gateway node.
async fn pushed_and_released_across_nodes(cluster: &ProcessCluster, job_type: &str) -> usize {
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let others: Vec<usize> = cluster.live().into_iter().filter(|id| *id != leader).collect();
    let (gateway, completer) = (others[0], others[1]);
    let mut limited = request(job_type, TIMEOUT_MS, &[]);
    limited.max_jobs_in_flight = 2;
    let mut stream = open(&cluster.node(gateway).grpc, limited).await;
    wait_for_registration(cluster, gateway, leader).await;
    let completer = Client::connect(&cluster.node(completer).grpc).await.unwrap();
    let producer = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    for n in 0..10 {
        producer.create_job(job_type, &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    for n in 0..10 {
        let job = match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(job))) => job,
            other => panic!("job {n} not pushed within 10 s (the stream allows 2 in flight): {other:?}"),
        };
        completer.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    gateway
}

/// A leader's pushes and releases to another node's gateway go as messages
/// on one delivery stream, not a call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_and_releases_to_another_node_go_on_one_delivery_stream() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let gateway = pushed_and_released_across_nodes(&cluster, "delivered").await;
    let streams = cluster.answered(gateway, "Deliver").await;
    assert!((1.0..=3.0).contains(&streams), "{streams} delivery streams opened to the worker's gateway");
    assert!(cluster.answered(gateway, "Push").await >= 5.0, "ten jobs, two at a time, came in under five pushes");
    assert!(cluster.answered(gateway, "ReleaseJobs").await >= 1.0, "no release reached the worker's gateway");
}

/// A gateway without delivery streams (an older node, here a failpoint on
/// every node) answers UNIMPLEMENTED; leaders then push and release with
/// calls, and jobs flow as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_go_as_calls_to_a_gateway_without_delivery_streams() {
    let cluster = ProcessCluster::start_with_failpoints("deliver_unimplemented=1000000", 1, FAST_RAFT);
    cluster.wait_ready().await;
    let gateway = pushed_and_released_across_nodes(&cluster, "called").await;
    assert_eq!(cluster.answered(gateway, "Deliver").await, 0.0, "a refused stream was counted as opened");
    assert!(cluster.answered(gateway, "unknown").await >= 1.0, "the gateway refused no stream");
    assert!(cluster.answered(gateway, "Push").await >= 5.0, "the pushes did not arrive as calls");
}
