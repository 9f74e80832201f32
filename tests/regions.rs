//! Two regions on one machine: nodes 0-2 in region a, 3-4 in region b, and
//! every link between the regions through a proxy that delays each way by
//! 40 ms with 5 ms of jitter. Leaders prefer region a (`--leader-regions a`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, http_get, ProcessCluster};
use drover::bench::delay::DelayLink;
use drover::client::Client;
use drover::placement::{self, Location};
use drover::proto::gateway::{CompleteJobRequest, CreateJobRequest, StreamActivatedJobsRequest};
use tokio::sync::mpsc;

const LOCATIONS: [&str; 5] = ["a/a1", "a/a2", "a/a3", "b/b1", "b/b2"];
const PARTITIONS: u32 = 3;
const TYPE: &str = "geo";

fn region(node: usize) -> &'static str {
    &LOCATIONS[node][..1]
}

/// A worker's stream: every job it receives is reported as (marker, key),
/// then completed.
fn worker(gateway: String, labels: &[&str], got: mpsc::UnboundedSender<(String, u64)>) -> tokio::task::JoinHandle<()> {
    let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    tokio::spawn(async move {
        let client = Client::connect(&gateway).await.expect("worker connects");
        let request = StreamActivatedJobsRequest {
            r#type: TYPE.into(),
            worker: labels.join(","),
            timeout: 60_000,
            labels,
            ..Default::default()
        };
        let mut stream = client.raw().stream_activated_jobs(request).await.expect("stream opens").into_inner();
        while let Ok(Some(job)) = stream.message().await {
            let marker: serde_json::Value = serde_json::from_str(&job.variables).expect("variables are JSON");
            let _ = got.send((marker["m"].as_str().unwrap_or_default().to_string(), job.key));
            // Completed in the background: a completion of a job on a partition
            // the cut leaves out of reach waits, and must not hold the others.
            let done = CompleteJobRequest { key: job.key, attempt: job.attempt, ..Default::default() };
            let client = client.clone();
            tokio::spawn(async move { client.raw().complete_job(done).await });
        }
    })
}

async fn create(client: &Client, marker: &str, required: &[&str], preferred: &[&str]) -> Result<u64, tonic::Status> {
    let request = CreateJobRequest {
        r#type: TYPE.into(),
        variables: format!(r#"{{"m":"{marker}"}}"#),
        required_labels: required.iter().map(|l| l.to_string()).collect(),
        preferred_labels: preferred.iter().map(|l| l.to_string()).collect(),
        ..Default::default()
    };
    Ok(client.raw().create_job(request).await?.into_inner().key)
}

/// Receives `n` jobs within a bound, by marker.
async fn receive(got: &mut mpsc::UnboundedReceiver<(String, u64)>, n: usize, what: &str) -> Vec<String> {
    let mut markers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while markers.len() < n {
        match tokio::time::timeout_at(deadline.into(), got.recv()).await {
            Ok(Some((marker, _))) => markers.push(marker),
            _ => panic!("{what}: received {} of {n} jobs in 30 s: {markers:?}", markers.len()),
        }
    }
    markers
}

/// The sum of `drover_jobs_unroutable` series for `labels` over the nodes.
async fn unroutable(cluster: &ProcessCluster, labels: &str) -> f64 {
    let mut total = 0.0;
    for id in cluster.live() {
        let Ok((_, body)) = http_get(&cluster.node(id).admin, "/metrics").await else { continue };
        total += body
            .lines()
            .filter(|l| l.starts_with("drover_jobs_unroutable{") && l.contains(&format!("labels=\"{labels}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_go_to_workers_by_region_and_a_cut_off_region_answers_at_once() {
    let links: Arc<Mutex<Vec<DelayLink>>> = Arc::default();
    let dial = {
        let links = Arc::clone(&links);
        move |from: usize, to: usize, port: u16| {
            if region(from) == region(to) {
                return format!("127.0.0.1:{port}");
            }
            let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let link = DelayLink::start(target, Duration::from_millis(40), Duration::from_millis(5)).expect("proxy");
            let addr = format!("127.0.0.1:{}", link.port());
            links.lock().unwrap().push(link);
            addr
        }
    };
    let extra = ["--network-profile", "wan", "--leader-regions", "a"];
    let cluster = ProcessCluster::start_located(5, PARTITIONS, 3, &extra, &LOCATIONS, &dial);
    cluster.wait_ready().await;

    // Every partition has a replica in each region, and leaders settle in a.
    let locations: BTreeMap<u64, Location> =
        LOCATIONS.iter().enumerate().map(|(i, l)| (i as u64, Location::parse(l).unwrap())).collect();
    let placement = placement::place(PARTITIONS, 3, &locations);
    for (p, nodes) in placement.iter().enumerate() {
        let regions: BTreeSet<&str> = nodes.iter().map(|n| region(*n as usize)).collect();
        assert_eq!(regions.len(), 2, "partition {p} on {nodes:?}");
    }
    for partition in 0..PARTITIONS {
        eventually(Duration::from_secs(60), &format!("partition {partition}'s leader to move to region a"), || {
            let cluster = &cluster;
            async move {
                let leader = cluster.leader_of(partition, Duration::from_secs(30)).await;
                region(leader) == "a"
            }
        })
        .await;
    }

    // One worker in each region, on its region's gateway.
    let (a_sent, mut a_got) = mpsc::unbounded_channel();
    let (b_sent, mut b_got) = mpsc::unbounded_channel();
    let _a_worker = worker(cluster.gateway(0), &["region:a"], a_sent);
    let b_worker = worker(cluster.gateway(3), &["region:b"], b_sent);
    eventually(Duration::from_secs(30), "both streams to be registered with every node", || {
        let cluster = &cluster;
        async move {
            let mut all = true;
            for id in cluster.live() {
                all &= cluster.metric(id, "drover_broker_open_job_stream_count").await >= 2.0;
            }
            all
        }
    })
    .await;

    let producer = Client::connect(&cluster.gateway(1)).await.unwrap();
    for n in 0..10 {
        create(&producer, &format!("plain-{n}"), &[], &[]).await.expect("create");
        create(&producer, &format!("prefers-b-{n}"), &[], &["region:b"]).await.expect("create");
        create(&producer, &format!("requires-b-{n}"), &["region:b"], &[]).await.expect("create");
    }
    for n in 0..5 {
        create(&producer, &format!("requires-c-{n}"), &["region:c"], &[]).await.expect("create");
    }
    let at_a = receive(&mut a_got, 10, "the worker in a").await;
    let at_b = receive(&mut b_got, 20, "the worker in b").await;
    assert!(at_a.iter().all(|m| m.starts_with("plain-")), "a's worker took only unlabelled jobs: {at_a:?}");
    assert!(
        at_b.iter().all(|m| m.starts_with("prefers-b-") || m.starts_with("requires-b-")),
        "b's worker took only jobs that require or prefer b, while a's worker is there: {at_b:?}"
    );
    // Nobody serves region c: its jobs wait, counted.
    eventually(Duration::from_secs(30), "5 jobs requiring region:c to be counted as unroutable", || async {
        unroutable(&cluster, "+region:c").await == 5.0
    })
    .await;
    assert!(a_got.try_recv().is_err() && b_got.try_recv().is_err(), "no worker got a region:c job");

    // B's worker goes: what only prefers b goes to a, including jobs created
    // while leaders still count b's stream as open (they wait for it, then
    // go to a once it is gone); what requires b waits.
    b_worker.abort();
    for n in 0..5 {
        create(&producer, &format!("late-prefers-b-{n}"), &[], &["region:b"]).await.expect("create");
        create(&producer, &format!("late-requires-b-{n}"), &["region:b"], &[]).await.expect("create");
    }
    eventually(Duration::from_secs(30), "b's stream to be gone from every node", || {
        let cluster = &cluster;
        async move {
            let mut gone = true;
            for id in cluster.live() {
                gone &= cluster.metric(id, "drover_broker_open_job_stream_count").await <= 1.0;
            }
            gone
        }
    })
    .await;
    let rerouted = receive(&mut a_got, 5, "the worker in a, once b's is gone").await;
    assert!(rerouted.iter().all(|m| m.starts_with("late-prefers-b-")), "{rerouted:?}");

    // Region b is cut off.
    for link in links.lock().unwrap().iter() {
        link.cut();
    }
    let a_majority: BTreeSet<u32> = placement
        .iter()
        .enumerate()
        .filter(|(_, nodes)| nodes.iter().filter(|n| region(**n as usize) == "a").count() >= 2)
        .map(|(p, _)| p as u32)
        .collect();
    assert!(!a_majority.is_empty() && a_majority.len() < PARTITIONS as usize, "{placement:?}");
    // A leader in a of a partition whose majority is in b stops taking
    // requests once no majority has answered it for an election timeout.
    for partition in (0..PARTITIONS).filter(|p| !a_majority.contains(p)) {
        eventually(
            Duration::from_secs(30),
            &format!("region a to hold no working leader of partition {partition}"),
            || {
                let cluster = &cluster;
                async move {
                    let mut working = false;
                    for id in (0..3).filter(|id| cluster.nodes[*id].is_some()) {
                        let statuses = cluster.status(id).await.unwrap_or_default();
                        working |=
                            statuses.iter().any(|s| s.partition == partition && s.role == "leader" && !s.cut_off);
                    }
                    !working
                }
            },
        )
        .await;
    }
    // a keeps serving its partitions: creates without a key go to one it
    // reaches, and its worker completes them.
    let mut made = BTreeSet::new();
    for n in 0..20 {
        let key = create(&producer, &format!("cut-{n}"), &[], &[]).await.expect("a create in region a during the cut");
        assert!(a_majority.contains(&((key >> 48) as u32)), "job {key} went to a partition a cannot commit on");
        made.insert(format!("cut-{n}"));
    }
    let done: BTreeSet<String> = receive(&mut a_got, 20, "the worker in a during the cut").await.into_iter().collect();
    assert_eq!(done, made, "every job created in a during the cut is done");
    // b's gateway answers at once for a partition only a reaches.
    let b_client = Client::connect(&cluster.gateway(3)).await.unwrap();
    let mut tried = 0;
    for n in 0..200 {
        let key = format!("k{n}");
        let request = drover::core::RequestId::Key {
            tenant: drover::core::DEFAULT_TENANT.into(),
            user: String::new(),
            key: key.clone(),
        };
        let partition = drover::core::JobRef::Request(request).partition(PARTITIONS);
        if !a_majority.contains(&partition) {
            continue;
        }
        let started = Instant::now();
        let mut request =
            tonic::Request::new(CreateJobRequest { r#type: TYPE.into(), idempotency_key: key, ..Default::default() });
        request.set_timeout(Duration::from_secs(20));
        let error = b_client.raw().create_job(request).await.expect_err("b cannot reach that partition's majority");
        assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "b's gateway answered after {:?}, not at once: {error:?}",
            started.elapsed()
        );
        tried += 1;
        if tried == 3 {
            break;
        }
    }
    assert_eq!(tried, 3);
}
