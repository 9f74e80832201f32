//! What clients wait through a node's death and through a rolling restart,
//! measured on a cluster of local processes (`--local-nodes`, at least 3):
//!
//! - `failover`: `--producers` clients create jobs through the gateway of a
//!   node that does not lead partition 0 while its leader is SIGKILLed; the
//!   figure is the longest pause in acknowledgements around each kill. The
//!   killed node is started again, and caught up, before the next of
//!   `--kills` kills.
//! - `rolling-restart`: producers create, and workers activate and complete,
//!   through every gateway while each node in turn is SIGTERMed (as
//!   Kubernetes does during an upgrade), kept down for `--down-ms` (the pod
//!   being replaced) and started again; the figure is the longest time any
//!   create or completion waited, retries included.
//!
//! Creates carry idempotency keys, so a create retried after an unknown
//! outcome is still one job.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::{BenchArgs, LocalCluster};
use crate::client::Client;
use crate::proto::gateway::{ActivateJobsRequest, CompleteJobRequest, CreateJobRequest};

const JOB_TYPE: &str = "bench-faults";
/// How long one fault's window is watched for acknowledgements to resume.
const RESUME_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Default, Serialize)]
pub struct FaultFigures {
    /// One line per fault: which node, and what clients waited.
    pub rounds: Vec<Round>,
    /// The longest wait of any round, ms.
    pub longest_ms: f64,
    pub creates_acknowledged: u64,
    pub completions_acknowledged: u64,
    /// Calls that failed and were tried again (each a client's retry).
    pub retried_calls: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Round {
    pub node: u64,
    /// Failover: the longest gap between acknowledgements across the kill.
    /// Rolling restart: the longest any single create waited.
    pub create_ms: f64,
    /// Rolling restart: the longest any single completion waited.
    pub completion_ms: Option<f64>,
    /// The node's restart, until it was ready again, ms.
    pub restart_ms: f64,
}

impl FaultFigures {
    pub fn print(&self, name: &str) {
        println!("== {name} ==");
        for (i, r) in self.rounds.iter().enumerate() {
            let completion = r.completion_ms.map(|c| format!(", longest completion {c:.0} ms")).unwrap_or_default();
            println!(
                "  fault {}: node {}: longest create wait {:.0} ms{completion} (node back in {:.1} s)",
                i + 1,
                r.node,
                r.create_ms,
                r.restart_ms / 1000.0
            );
        }
        println!("  longest wait                  {:.0} ms", self.longest_ms);
        println!(
            "  creates / completions acknowledged  {} / {}; calls retried {}",
            self.creates_acknowledged, self.completions_acknowledged, self.retried_calls
        );
    }
}

/// The node that leads `partition`, by the nodes' own statuses: the first
/// live node whose replica says it leads, within `limit`.
pub(super) async fn leader_of(
    cluster: &LocalCluster,
    partition: u32,
    live: &[bool],
    limit: Duration,
) -> anyhow::Result<usize> {
    let started = Instant::now();
    loop {
        for index in (0..cluster.nodes.len()).filter(|i| live[*i]) {
            let Ok((200, body)) = cluster.admin_get(index, "/actuator/partitions").await else { continue };
            let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let leads =
                status["local"].as_array().into_iter().flatten().any(|p| {
                    p["partition"].as_u64() == Some(u64::from(partition)) && p["role"].as_str() == Some("leader")
                });
            if leads {
                return Ok(index);
            }
        }
        if started.elapsed() > limit {
            bail!("no node led partition {partition} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_node_ready(cluster: &LocalCluster, index: usize, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    while !cluster.admin_get(index, "/ready").await.is_ok_and(|(code, _)| code == 200) {
        if started.elapsed() > limit {
            bail!("node {index} was not ready within {limit:?} of its restart");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn client(gateways: &[String], token: Option<&str>) -> anyhow::Result<Client> {
    let client = Client::connect_lazy(&gateways.join(",")).context("a client of the cluster")?;
    Ok(match token {
        Some(token) => client.with_token(token)?,
        None => client,
    })
}

/// What the producers and workers of one measurement share.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    next: AtomicU64,
    /// When each create was acknowledged.
    acks: Mutex<Vec<Instant>>,
    /// How long each acknowledged create and completion waited, retries included.
    create_waits: Mutex<Vec<(Instant, Duration)>>,
    completion_waits: Mutex<Vec<(Instant, Duration)>>,
    completions: AtomicU64,
    retried: AtomicU64,
}

impl Load {
    /// Creates one keyed job after another, each tried until acknowledged.
    async fn produce(self: Arc<Self>, client: Client) {
        while !self.stop.load(Ordering::Relaxed) {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let request = CreateJobRequest {
                r#type: JOB_TYPE.into(),
                variables: format!(r#"{{"n":{n}}}"#),
                idempotency_key: format!("bench-faults-{n}"),
                ..Default::default()
            };
            let first = Instant::now();
            loop {
                match client.raw().create_job(request.clone()).await {
                    Ok(_) => {
                        let now = Instant::now();
                        self.acks.lock().expect("acks").push(now);
                        self.create_waits.lock().expect("waits").push((now, now - first));
                        break;
                    }
                    Err(_) if self.stop.load(Ordering::Relaxed) => return,
                    Err(_) => {
                        self.retried.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    }

    /// Activates and completes jobs, each completion tried until acknowledged.
    async fn work(self: Arc<Self>, client: Client) {
        let activate = ActivateJobsRequest {
            r#type: JOB_TYPE.into(),
            worker: "bench-faults".into(),
            timeout: 30_000,
            max_jobs_to_activate: 32,
            request_timeout: 500,
            ..Default::default()
        };
        while !self.stop.load(Ordering::Relaxed) {
            let jobs = match client.raw().activate_jobs(activate.clone()).await {
                Ok(answer) => {
                    let mut stream = answer.into_inner();
                    let mut jobs = Vec::new();
                    while let Ok(Some(reply)) = stream.message().await {
                        jobs.extend(reply.jobs);
                    }
                    jobs
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            for job in jobs {
                let request = CompleteJobRequest {
                    key: job.key,
                    attempt: job.attempt,
                    variables: "{}".into(),
                    override_fence: false,
                };
                let first = Instant::now();
                loop {
                    match client.raw().complete_job(request.clone()).await {
                        Ok(_) => {
                            let now = Instant::now();
                            self.completion_waits.lock().expect("waits").push((now, now - first));
                            self.completions.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        // Timed out and handed to another worker meanwhile: not ours to wait for.
                        Err(status) if status.code() == tonic::Code::FailedPrecondition => break,
                        Err(_) if self.stop.load(Ordering::Relaxed) => return,
                        Err(_) => {
                            self.retried.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            }
        }
    }

    /// The longest gap between acknowledgements from `from` on, counting from
    /// the last acknowledgement before it.
    fn longest_gap_since(&self, from: Instant) -> Duration {
        let acks = self.acks.lock().expect("acks");
        let mut last = acks.iter().rev().find(|t| **t <= from).copied().unwrap_or(from);
        let mut longest = Duration::ZERO;
        for t in acks.iter().filter(|t| **t > from) {
            longest = longest.max(*t - last);
            last = *t;
        }
        longest
    }

    fn longest_wait(waits: &Mutex<Vec<(Instant, Duration)>>, from: Instant) -> Duration {
        waits.lock().expect("waits").iter().filter(|(at, _)| *at >= from).map(|(_, w)| *w).max().unwrap_or_default()
    }
}

fn check(args: &BenchArgs, cluster: Option<&LocalCluster>) -> anyhow::Result<()> {
    match cluster {
        Some(c) if c.nodes.len() >= 3 && args.replication_factor >= 3 => {}
        _ => bail!(
            "the failover and rolling-restart workloads need --local-nodes 3 (or more) and --replication-factor 3"
        ),
    }
    if args.tls {
        bail!("the failover and rolling-restart workloads run without --tls");
    }
    Ok(())
}

/// Kills partition 0's leader `--kills` times while producers create
/// through another node's gateway.
pub async fn failover(args: &BenchArgs, cluster: &mut LocalCluster) -> anyhow::Result<FaultFigures> {
    check(args, Some(cluster))?;
    let mut figures = FaultFigures::default();
    let mut live = vec![true; cluster.nodes.len()];
    let token = cluster.token.clone();
    for _ in 0..args.kills {
        let leader = leader_of(cluster, 0, &live, Duration::from_secs(30)).await?;
        let gateway = (0..cluster.nodes.len()).find(|i| *i != leader).expect("three nodes");
        let load = Arc::new(Load::default());
        let client = client(&[cluster.gateways()[gateway].clone()], token.as_deref())?;
        let producers: Vec<_> =
            (0..args.producers).map(|_| tokio::spawn(Arc::clone(&load).produce(client.clone()))).collect();
        // Steady first: acknowledgements flowing for a second.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if load.acks.lock().expect("acks").is_empty() {
            bail!("no create was acknowledged through node {gateway} before the kill");
        }
        let killed_at = Instant::now();
        cluster.kill(leader);
        live[leader] = false;
        // Until acknowledgements have flowed again for two seconds.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let last = load.acks.lock().expect("acks").last().copied();
            if last.is_some_and(|t| t > killed_at && t.elapsed() < Duration::from_millis(200))
                && killed_at.elapsed() > load.longest_gap_since(killed_at) + Duration::from_secs(2)
            {
                break;
            }
            if killed_at.elapsed() > RESUME_LIMIT {
                break;
            }
        }
        load.stop.store(true, Ordering::Relaxed);
        for producer in producers {
            let _ = producer.await;
        }
        let pause = load.longest_gap_since(killed_at);
        figures.creates_acknowledged += load.acks.lock().expect("acks").len() as u64;
        figures.retried_calls += load.retried.load(Ordering::Relaxed);
        let restart = Instant::now();
        cluster.restart(leader)?;
        live[leader] = true;
        wait_node_ready(cluster, leader, Duration::from_secs(60)).await?;
        figures.rounds.push(Round {
            node: leader as u64,
            create_ms: pause.as_secs_f64() * 1000.0,
            completion_ms: None,
            restart_ms: restart.elapsed().as_secs_f64() * 1000.0,
        });
        // Let the restarted node settle before the next kill.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    figures.longest_ms = figures.rounds.iter().map(|r| r.create_ms).fold(0.0, f64::max);
    Ok(figures)
}

/// SIGTERMs each node in turn and starts it again, while producers and
/// workers use every gateway.
pub async fn rolling_restart(args: &BenchArgs, cluster: &mut LocalCluster) -> anyhow::Result<FaultFigures> {
    check(args, Some(cluster))?;
    let mut figures = FaultFigures::default();
    let client = client(&cluster.gateways(), cluster.token.as_deref())?;
    let load = Arc::new(Load::default());
    let mut tasks: Vec<_> =
        (0..args.producers).map(|_| tokio::spawn(Arc::clone(&load).produce(client.clone()))).collect();
    tasks.extend((0..args.workers).map(|_| tokio::spawn(Arc::clone(&load).work(client.clone()))));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for node in 0..cluster.nodes.len() {
        let from = Instant::now();
        if !cluster.terminate(node, Duration::from_secs(60)) {
            tracing::warn!(node, "did not stop within 60 s of SIGTERM; killed");
        }
        tokio::time::sleep(Duration::from_millis(args.down_ms)).await;
        let restart = Instant::now();
        cluster.restart(node)?;
        wait_node_ready(cluster, node, Duration::from_secs(60)).await?;
        let restart_ms = restart.elapsed().as_secs_f64() * 1000.0;
        // Calls that began during this node's restart end within a few seconds.
        tokio::time::sleep(Duration::from_secs(3)).await;
        figures.rounds.push(Round {
            node: node as u64,
            create_ms: Load::longest_wait(&load.create_waits, from).as_secs_f64() * 1000.0,
            completion_ms: Some(Load::longest_wait(&load.completion_waits, from).as_secs_f64() * 1000.0),
            restart_ms,
        });
    }
    load.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    figures.creates_acknowledged = load.acks.lock().expect("acks").len() as u64;
    figures.completions_acknowledged = load.completions.load(Ordering::Relaxed);
    figures.retried_calls = load.retried.load(Ordering::Relaxed);
    figures.longest_ms =
        figures.rounds.iter().map(|r| r.create_ms.max(r.completion_ms.unwrap_or(0.0))).fold(0.0, f64::max);
    Ok(figures)
}
