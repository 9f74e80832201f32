//! Queue limits on real nodes (docs/limits.md): a queue limited to a rate
//! and a concurrency holds both across three gateways polling at once and
//! through a SIGKILL of its home partition's leader, judged by the jobs'
//! own histories in partition time; and its creates gather on its home
//! from every gateway. (OJS's `rate_limit`, and who may set a limit, are in
//! `ojs.rs` and `auth.rs`.)

mod common;

use std::time::Duration;

use common::{eventually, ProcessCluster};
use drover::core::JobKey;
use drover::proto::gateway::*;

const TYPE: &str = "paced";
const RATE: u32 = 10;
const BURST: u32 = 2;
const CONCURRENCY: u32 = 4;
const JOBS: usize = 60;

/// Polls `client` for jobs of TYPE until `stop`, holding each a while
/// before completing it.
async fn worker(client: drover::client::Client, stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        let Ok(jobs) = client.activate(TYPE, "w", 3, 5_000, 500).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        for job in jobs {
            tokio::time::sleep(Duration::from_millis(120)).await;
            // A completion lost with its node is fenced off or timed out;
            // the job runs again, which the histories show.
            let _ = client.complete(job.key, job.attempt, "{}").await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_limit_holds_across_the_cluster_and_through_a_leader_kill() {
    let mut cluster = ProcessCluster::start(3, 3, 3, &[]);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let limit = QueueLimit {
        queue: Some(LimitLevel { rate: RATE, period_ms: 1_000, burst: BURST, concurrency: CONCURRENCY }),
        per_key: None,
    };
    let request = SetQueueLimitRequest { r#type: TYPE.into(), limit: Some(limit), ..Default::default() };
    let queue = client.raw().set_queue_limit(request).await.expect("sets the limit").into_inner().queue.unwrap();
    let home = queue.limit_home;
    assert_eq!(queue.limit.and_then(|l| l.queue).map(|l| (l.rate, l.burst)), Some((RATE, BURST)));

    // Creates through every gateway gather on the home partition.
    let all: Vec<_> = futures::future::join_all((0..3).map(|n| cluster.node(n).client())).await;
    let mut keys = Vec::new();
    for i in 0..JOBS {
        let create =
            CreateJobRequest { r#type: TYPE.into(), variables: "{}".into(), retries: Some(5), ..Default::default() };
        let made = all[i % 3].raw().create_job(create).await.expect("creates").into_inner();
        assert_eq!(JobKey(made.key).partition(), home, "job {i} was made on the queue's home");
        keys.push(made.key);
    }

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let workers: Vec<_> = all.iter().map(|c| tokio::spawn(worker(c.clone(), stop.clone()))).collect();
    // A third of the way through, the home's leader dies.
    let completed = |client: drover::client::Client| async move {
        let request = ListQueuesRequest { r#type: TYPE.into(), ..Default::default() };
        let queues = client.raw().list_queues(request).await.map(|r| r.into_inner().queues).unwrap_or_default();
        queues.first().and_then(|q| q.last_hour).map_or(0, |h| h.completed)
    };
    let first = all[0].clone();
    eventually(Duration::from_secs(60), "a third of the jobs to complete", || {
        let first = first.clone();
        async move { completed(first).await >= (JOBS / 3) as u64 }
    })
    .await;
    let leader = cluster.leader_of(home, Duration::from_secs(10)).await;
    cluster.kill(leader);
    let survivor = cluster.node(cluster.live()[0]).client().await;
    let watcher = survivor.clone();
    eventually(Duration::from_secs(90), "every job to complete after the kill", || {
        let watcher = watcher.clone();
        async move { completed(watcher).await >= JOBS as u64 }
    })
    .await;
    stop_tx.send(true).expect("workers listen");
    for w in workers {
        w.abort();
    }

    // Judged by the jobs' histories, in the home partition's time.
    let mut activations = Vec::new();
    let mut held: Vec<(i64, i64)> = Vec::new();
    for key in keys {
        let request = GetJobRequest { key, include_history: true, ..Default::default() };
        let job = survivor.raw().get_job(request).await.expect("reads the job").into_inner().job.expect("a job");
        assert_eq!(job.state, "completed", "job {key}");
        let mut since = None;
        for event in &job.history {
            match event.kind.as_str() {
                "activated" => {
                    activations.push(event.at);
                    since = Some(event.at);
                }
                "completed" | "timed_out" | "failed" | "yielded" => {
                    if let Some(at) = since.take() {
                        held.push((at, event.at));
                    }
                }
                _ => {}
            }
        }
    }
    activations.sort_unstable();
    assert!(activations.len() >= JOBS, "{} activations", activations.len());
    for (i, at) in activations.iter().enumerate() {
        let within = activations[i..].iter().take_while(|t| **t < at + 1_000).count() as u32;
        assert!(
            within <= RATE + BURST,
            "{within} activations in the second from {at} (partition time): more than the rate {RATE} and burst \
             {BURST} allow"
        );
    }
    for (at, _) in &held {
        let overlapping = held.iter().filter(|(from, to)| from <= at && at < to).count() as u32;
        assert!(
            overlapping <= CONCURRENCY,
            "{overlapping} activations held at {at}: over the concurrency {CONCURRENCY}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_limits_shows_and_lifts_a_queues_limit_and_says_why_it_refuses_one() {
    let node = common::LocalNode::start().await;
    let address = node.node().grpc_addr.to_string();
    let cli = common::Cli::new("queue", address);
    let drover = |args: &'static [&'static str]| cli.run(args);
    let (ok, out, err) =
        drover(&["limit", "mail", "--rate", "5", "--concurrency", "2", "--key-concurrency", "1"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("5 per 1000 ms (burst 1), 2 at once; each key: 1 at once"), "{out}");
    let (ok, out, err) = drover(&["list", "mail"]).await;
    assert!(ok && out.contains("limit: 5 per 1000 ms") && out.contains("home partition"), "{out}{err}");
    let (ok, _, err) = drover(&["limit", "mail", "--concurrency", "0"]).await;
    assert!(!ok && err.contains("needs a rate or a concurrency"), "{err}");
    let (ok, out, err) = drover(&["unlimit", "mail"]).await;
    assert!(ok && !out.contains("limit:"), "{out}{err}");
}
