//! The `regions` workload: what a worker in a far region sees.
//!
//! Five local nodes, 0-2 in region `a` (zones a1-a3) and 3-4 in region `b`
//! (b1, b2); every link between the regions goes through a [`DelayLink`] of
//! 40 ms each way with up to 5 ms of jitter, links within a region are
//! direct. Nodes run with `--network-profile wan`. A producer on a gateway in
//! `a` creates jobs at `--rate` for `--duration`, alternating jobs that
//! require `region:a` and `region:b`; one worker streams on a gateway in each
//! region with its region's label. Each job's create-to-worker latency is
//! recorded by the worker that got it. The run is made twice: with
//! `--leader-regions a`, then with `--leader-regions b`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::{watch, Mutex};

use super::delay::DelayLink;
use super::local::{LocalCluster, Topology};
use super::workload::{next_job, now_micros, Percentiles};
use super::BenchArgs;
use crate::client::Client;
use crate::proto::gateway::{CompleteJobRequest, CreateJobRequest, StreamActivatedJobsRequest};

const LOCATIONS: [&str; 5] = ["a/a1", "a/a2", "a/a3", "b/b1", "b/b2"];
const ONE_WAY: Duration = Duration::from_millis(40);
const JITTER: Duration = Duration::from_millis(5);
const JOB_TYPE: &str = "bench-regions";

fn region(node: usize) -> &'static str {
    &LOCATIONS[node][..1]
}

#[derive(Debug, Default, Serialize)]
pub struct RegionFigures {
    pub rounds: Vec<RegionRound>,
}

#[derive(Debug, Serialize)]
pub struct RegionRound {
    pub leader_region: String,
    pub jobs_created: u64,
    pub create_errors: u64,
    /// Create sent (by the producer, in a) -> job received, per worker.
    pub worker_a_ms: Percentiles,
    pub worker_b_ms: Percentiles,
    /// Create sent -> acknowledged, through a gateway in a.
    pub create_ack_ms: Percentiles,
}

impl RegionFigures {
    pub fn print(&self) {
        println!(
            "Regions: 3 nodes in a, 2 in b, {} ms each way between them (jitter up to {} ms); producer in a",
            ONE_WAY.as_millis(),
            JITTER.as_millis()
        );
        for r in &self.rounds {
            println!(
                "  leaders in {}: {} jobs ({} create errors); create ack p50 {:.1} p99 {:.1} ms",
                r.leader_region, r.jobs_created, r.create_errors, r.create_ack_ms.p50, r.create_ack_ms.p99
            );
            for (name, p) in [("a", &r.worker_a_ms), ("b", &r.worker_b_ms)] {
                println!(
                    "    worker in {name}: create -> worker p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1} ms ({} jobs)",
                    p.p50, p.p99, p.p999, p.max, p.count
                );
            }
        }
    }
}

pub async fn regions(args: &BenchArgs) -> anyhow::Result<RegionFigures> {
    let mut figures = RegionFigures::default();
    for leader_region in ["a", "b"] {
        figures.rounds.push(round(args, leader_region).await?);
    }
    Ok(figures)
}

async fn round(args: &BenchArgs, leader_region: &str) -> anyhow::Result<RegionRound> {
    let links: std::sync::Mutex<Vec<DelayLink>> = std::sync::Mutex::default();
    let failed: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::default();
    let dial = |from: usize, to: usize, port: u16| -> String {
        if region(from) == region(to) {
            return format!("127.0.0.1:{port}");
        }
        match DelayLink::start(std::net::SocketAddr::from(([127, 0, 0, 1], port)), ONE_WAY, JITTER) {
            Ok(link) => {
                let addr = format!("127.0.0.1:{}", link.port());
                links.lock().expect("links").push(link);
                addr
            }
            Err(e) => {
                *failed.lock().expect("error") = Some(e);
                String::new()
            }
        }
    };
    let locations: Vec<String> = LOCATIONS.iter().map(|l| l.to_string()).collect();
    let extra: Vec<String> =
        ["--network-profile", "wan", "--leader-regions", leader_region].iter().map(|s| s.to_string()).collect();
    let topology = Topology { locations: &locations, dial: &dial };
    let mut cluster = LocalCluster::start_located(5, args.partitions.max(3), 3, None, &extra, false, &topology)?;
    if let Some(e) = failed.lock().expect("error").take() {
        bail!("starting a delaying proxy: {e}");
    }
    cluster.wait_ready(Duration::from_secs(60)).await?;
    wait_for_leaders(&cluster, args.partitions.max(3) as usize, leader_region, Duration::from_secs(60)).await?;

    let gateways = cluster.gateways();
    let (stop, stop_rx) = watch::channel(false);
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker_a = tokio::spawn(work(gateways[0].clone(), "region:a", Arc::clone(&received), stop_rx.clone()));
    let worker_b = tokio::spawn(work(gateways[3].clone(), "region:b", Arc::clone(&received), stop_rx));
    wait_for_streams(&cluster, 2, Duration::from_secs(30)).await?;

    let producer = Client::connect(&gateways[1]).await.context("connecting the producer")?;
    let jobs = args.rate * args.duration;
    let acks = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut ticker = tokio::time::interval(Duration::from_nanos(1_000_000_000 / args.rate.max(1)));
    let mut creates = Vec::with_capacity(jobs as usize);
    for seq in 0..jobs {
        ticker.tick().await;
        let (client, acks, errors) = (producer.clone(), Arc::clone(&acks), Arc::clone(&errors));
        creates.push(tokio::spawn(async move {
            let label = if seq % 2 == 0 { "region:a" } else { "region:b" };
            let request = CreateJobRequest {
                r#type: JOB_TYPE.into(),
                variables: format!(r#"{{"sent":{}}}"#, now_micros()),
                required_labels: vec![label.into()],
                ..Default::default()
            };
            let started = Instant::now();
            match client.raw().create_job(request).await {
                Ok(_) => {
                    let _ = acks.lock().await.record(started.elapsed().as_micros() as u64);
                }
                Err(_) => {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for create in creates {
        let _ = create.await;
    }
    let created = jobs - errors.load(std::sync::atomic::Ordering::Relaxed);
    // Every created job reaches its worker within a bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(std::sync::atomic::Ordering::Relaxed) < created && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(true);
    let worker_a = worker_a.await??;
    let worker_b = worker_b.await??;
    cluster.stop();
    drop(links);
    let ack = Percentiles::of(&*acks.lock().await);
    Ok(RegionRound {
        leader_region: leader_region.into(),
        jobs_created: created,
        create_errors: jobs - created,
        worker_a_ms: Percentiles::of(&worker_a),
        worker_b_ms: Percentiles::of(&worker_b),
        create_ack_ms: ack,
    })
}

/// The sum of a metric's samples on node `index` (0 when it does not answer).
async fn cluster_metric(cluster: &LocalCluster, index: usize, name: &str) -> f64 {
    let Ok((_, body)) = cluster.admin_get(index, "/metrics").await else { return 0.0 };
    body.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

async fn wait_for_leaders(
    cluster: &LocalCluster,
    partitions: usize,
    region_wanted: &str,
    limit: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let mut leaders = std::collections::BTreeMap::new();
        for index in 0..cluster.nodes.len() {
            let Ok((200, body)) = cluster.admin_get(index, "/actuator/partitions").await else { continue };
            let view: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            for p in view["local"].as_array().into_iter().flatten() {
                if p["role"] == "leader" {
                    leaders.insert(p["partition"].as_u64().unwrap_or(0), index);
                }
            }
        }
        if leaders.len() == partitions && leaders.values().all(|n| region(*n) == region_wanted) {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("partition leaders did not all move to region {region_wanted} in {limit:?}: {leaders:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_for_streams(cluster: &LocalCluster, streams: usize, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let mut everywhere = true;
        for index in 0..cluster.nodes.len() {
            everywhere &= cluster_metric(cluster, index, "drover_broker_open_job_stream_count").await >= streams as f64;
        }
        if everywhere {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("the workers' streams were not registered with every node in {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker with `label`: receives, records create -> receipt, completes.
async fn work(
    gateway: String,
    label: &'static str,
    received_total: Arc<std::sync::atomic::AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Histogram<u64>> {
    let client = Client::connect(&gateway).await?;
    let request = StreamActivatedJobsRequest {
        r#type: JOB_TYPE.into(),
        worker: label.into(),
        timeout: 30_000,
        max_jobs_in_flight: 256,
        labels: vec![label.into()],
        ..Default::default()
    };
    let mut jobs = client.raw().stream_activated_jobs(request).await?.into_inner();
    let mut latency = Histogram::<u64>::new(3)?;
    while let Some((job, received)) = next_job(&mut jobs, &mut stop).await {
        let sent = serde_json::from_str::<serde_json::Value>(&job.variables)
            .ok()
            .and_then(|v| v["sent"].as_u64())
            .unwrap_or(received);
        let _ = latency.record(received.saturating_sub(sent));
        received_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let complete =
            CompleteJobRequest { key: job.key, attempt: job.attempt, variables: String::new(), override_fence: false };
        let client = client.clone();
        tokio::spawn(async move { client.raw().complete_job(complete).await });
    }
    Ok(latency)
}
