//! The limited workload: a queue limited to `--limit-rate` jobs a second
//! (`drover queue limit`, docs/limits.md), a backlog far beyond it, and a
//! streaming worker on every gateway that completes each job at once; half
//! way through, the leader of the queue's home partition is SIGKILLed (and
//! started again at the end). What the workers receive each second is the
//! limit as the cluster holds it: the figures are its mean over the run
//! (the first second, the burst, left out), the slowest and fastest whole
//! seconds, and the mean over the seconds after the kill.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::{BenchArgs, LocalCluster};
use crate::client::{Client, JobOutcome, Worker, WorkerOptions};
use crate::proto::gateway::{ActivatedJob, CreateJobRequest, LimitLevel, QueueLimit, SetQueueLimitRequest};

const QUEUE: &str = "bench-limited";
/// Concurrent creates while the backlog is made.
const CREATORS: usize = 32;

#[derive(Debug, Default, Serialize)]
pub struct LimitFigures {
    /// The queue's limit, jobs a second.
    pub limit_per_s: u64,
    pub burst: u32,
    pub nodes: usize,
    pub workers: usize,
    pub backlog: u64,
    pub seconds: u64,
    /// Jobs received a second over the whole seconds before the kill (the
    /// first, the burst, left out).
    pub before_kill_per_s: f64,
    /// Jobs received a second over the whole seconds from one second after
    /// jobs flowed again to the end.
    pub after_kill_per_s: f64,
    /// The fastest whole second of the run (the first left out): what the
    /// limit let through at most.
    pub fastest_second: u64,
    /// How long no job arrived after the kill, ms: the home's election and
    /// the streams' return.
    pub kill_gap_ms: f64,
    /// Jobs received a second over the whole run, the gap included.
    pub mean_per_s: f64,
    pub killed_node: usize,
}

impl LimitFigures {
    pub fn print(&self) {
        let off = |rate: f64| (rate / self.limit_per_s as f64 - 1.0) * 100.0;
        println!(
            "limited: queue limited to {}/s (burst {}), {} nodes, {} workers, backlog {}, {} s, the home's leader \
             (node {}) killed half way: before the kill {:.1} jobs/s ({:+.2}%), after it {:.1} jobs/s ({:+.2}%), \
             fastest second {}, no job for {:.0} ms after the kill; {:.1} jobs/s over the whole run",
            self.limit_per_s,
            self.burst,
            self.nodes,
            self.workers,
            self.backlog,
            self.seconds,
            self.killed_node,
            self.before_kill_per_s,
            off(self.before_kill_per_s),
            self.after_kill_per_s,
            off(self.after_kill_per_s),
            self.fastest_second,
            self.kill_gap_ms,
            self.mean_per_s
        );
    }
}

pub async fn limited(args: &BenchArgs, cluster: &mut LocalCluster) -> anyhow::Result<LimitFigures> {
    if cluster.nodes.len() < 3 {
        bail!("the limited workload kills the home partition's leader: it needs --local-nodes 3 or more");
    }
    let gateways = cluster.gateways();
    let token = cluster.token.clone();
    let connect = |address: &str| -> anyhow::Result<Client> {
        let client = Client::connect_lazy(address).context("a client of the cluster")?;
        Ok(match &token {
            Some(token) => client.with_token(token)?,
            None => client,
        })
    };
    let admin = connect(&gateways[0])?;
    let rate = u32::try_from(args.limit_rate).context("--limit-rate")?;
    let limit = QueueLimit { queue: Some(LimitLevel { rate, period_ms: 1_000, ..Default::default() }), per_key: None };
    let request = SetQueueLimitRequest { r#type: QUEUE.into(), limit: Some(limit), ..Default::default() };
    let queue = admin.raw().set_queue_limit(request).await.context("setting the queue's limit")?.into_inner();
    let queue = queue.queue.context("the limited queue's figures")?;
    let burst = queue.limit.and_then(|l| l.queue).map_or(0, |l| l.burst);
    let home = queue.limit_home;

    // A backlog the run cannot drain.
    let backlog = args.limit_rate * (args.duration + 5);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let creators: Vec<_> = (0..CREATORS)
        .map(|i| {
            let (client, next) = (connect(&gateways[i % gateways.len()]), Arc::clone(&next));
            tokio::spawn(async move {
                let client = client?;
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < backlog {
                    let create =
                        CreateJobRequest { r#type: QUEUE.into(), variables: "{}".into(), ..Default::default() };
                    client.raw().create_job(create).await.context("a create of the backlog")?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for creator in creators {
        creator.await??;
    }

    let received: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for gateway in &gateways {
        let mut options = WorkerOptions::new(QUEUE);
        options.concurrency = 64;
        let worker = Worker::new(connect(gateway)?, options);
        let (received, mut stopped) = (Arc::clone(&received), stopped.clone());
        workers.push(tokio::spawn(worker.run(
            move |_job: ActivatedJob| {
                received.lock().expect("received").push(Instant::now());
                async { JobOutcome::Complete("{}".into()) }
            },
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        )));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.duration / 2)).await;
    let live = vec![true; cluster.nodes.len()];
    let leader = super::faults::leader_of(cluster, home, &live, Duration::from_secs(30)).await?;
    let killed_at = Instant::now();
    cluster.kill(leader);
    tokio::time::sleep(Duration::from_secs(args.duration - args.duration / 2)).await;
    let _ = stop.send(true);
    let ended = Instant::now();
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    }
    cluster.restart(leader)?;

    let mut times = received.lock().expect("received").clone();
    times.retain(|t| *t < ended);
    times.sort_unstable();
    let seconds = ended.duration_since(started).as_secs();
    let mut per_second = vec![0u64; seconds as usize + 1];
    for t in &times {
        per_second[t.duration_since(started).as_secs() as usize] += 1;
    }
    let whole = |from: Instant, to: Instant| -> f64 {
        // Jobs a second over the whole seconds from `from` to `to`.
        let secs = to.duration_since(from).as_secs();
        let until = from + Duration::from_secs(secs);
        let n = times.iter().filter(|t| **t >= from && **t < until).count();
        n as f64 / secs.max(1) as f64
    };
    // The longest time without a job after the kill, and when jobs flowed again.
    let (mut gap, mut flowing) = (Duration::ZERO, ended);
    let mut last = killed_at;
    for t in times.iter().filter(|t| **t >= killed_at) {
        if t.duration_since(last) > gap {
            (gap, flowing) = (t.duration_since(last), *t);
        }
        last = *t;
    }
    Ok(LimitFigures {
        limit_per_s: args.limit_rate,
        burst,
        nodes: cluster.nodes.len(),
        workers: gateways.len(),
        backlog,
        seconds,
        before_kill_per_s: whole(started + Duration::from_secs(1), killed_at),
        after_kill_per_s: whole(flowing + Duration::from_secs(1), ended),
        fastest_second: per_second.iter().skip(1).take(seconds.saturating_sub(1) as usize).copied().max().unwrap_or(0),
        kill_gap_ms: gap.as_secs_f64() * 1000.0,
        mean_per_s: whole(started + Duration::from_secs(1), ended),
        killed_node: leader,
    })
}
