//! The OJS workload: the throughput workload's jobs through the Open Job
//! Spec's HTTP binding (docs/ojs.md), in OJS's own shape: one request per
//! enqueue, one per fetch (up to 32 jobs), one per ack, each producer and
//! worker on its own keep-alive connection to one node's OJS port.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde_json::{json, Value};

use super::local::LocalCluster;
use super::workload::total;
use super::BenchArgs;

/// Jobs a worker asks for per fetch.
const FETCH: usize = 32;
const QUEUE: &str = "bench-ojs";

#[derive(Debug, Default, Serialize)]
pub struct OjsFigures {
    pub producers: usize,
    pub workers: usize,
    pub jobs_created: u64,
    pub jobs_completed_unique: u64,
    pub lost: u64,
    pub completed_twice: u64,
    pub request_errors: u64,
    pub elapsed_s: f64,
    /// Jobs enqueued, fetched and acknowledged per second, end to end.
    pub jobs_per_s: f64,
    /// Enqueues acknowledged per second while the producers ran.
    pub enqueue_per_s: f64,
    /// HTTP requests per job (enqueue, fetches, acks).
    pub requests_per_job: f64,
    /// What the gateways read of jobs, per job (local nodes; none from a
    /// build that does not count them).
    pub job_reads_per_job: Option<f64>,
    /// Commands the partition leaders proposed per job: its writes.
    pub raft_commands_per_job: Option<f64>,
}

impl OjsFigures {
    pub fn print(&self) {
        println!(
            "ojs: {} jobs in {:.1} s through the OJS HTTP port: {:.0} jobs/s end to end, {:.0} enqueues/s; \
             {:.2} requests, {} job reads and {} Raft commands per job; {} producers, {} workers; lost {}, \
             completed twice {}, request errors {}",
            self.jobs_created,
            self.elapsed_s,
            self.jobs_per_s,
            self.enqueue_per_s,
            self.requests_per_job,
            per_job(self.job_reads_per_job),
            per_job(self.raft_commands_per_job),
            self.producers,
            self.workers,
            self.lost,
            self.completed_twice,
            self.request_errors
        );
    }
}

fn per_job(figure: Option<f64>) -> String {
    figure.map_or_else(|| "n/a".into(), |f| format!("{f:.2}"))
}

/// What the nodes counted, read before and after the run.
const COUNTED: [&str; 2] = [crate::metrics::JOB_READS, "drover_raft_commands_per_entry_sum"];

/// One keep-alive HTTP/1.1 connection to an OJS port.
struct Conn {
    addr: String,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        Conn { addr: addr.to_string(), sender: None }
    }

    async fn post(&mut self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let tcp = tokio::net::TcpStream::connect(&self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            tcp.set_nodelay(true)?;
            let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
            tokio::spawn(connection);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().expect("connected");
        sender.ready().await?;
        let request = hyper::Request::post(path)
            .header("host", &self.addr)
            .header("content-type", crate::gateway::ojs::MEDIA_TYPE)
            .body(Full::new(Bytes::from(body.to_string())))?;
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            Err(error) => {
                self.sender = None;
                return Err(error.into());
            }
        };
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }
}

/// Runs the workload against OJS ports `addresses`.
pub async fn ojs(args: &BenchArgs, addresses: &[String], cluster: Option<&LocalCluster>) -> anyhow::Result<OjsFigures> {
    if addresses.is_empty() {
        bail!("the ojs workload needs OJS ports: run it with --local-nodes, or give --ojs-address");
    }
    let mut counted_before = Vec::new();
    for name in COUNTED {
        counted_before.push(total(cluster, name).await);
    }
    let jobs = args.jobs;
    let (producers, workers) = (args.producers.max(1), args.workers.max(1));
    let next = Arc::new(AtomicU64::new(0));
    let created = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..jobs.div_ceil(64)).map(|_| AtomicU64::new(0)).collect());
    let twice = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut producing = Vec::new();
    for p in 0..producers {
        let (next, created, requests, errors) = (next.clone(), created.clone(), requests.clone(), errors.clone());
        let mut conn = Conn::new(&addresses[p % addresses.len()]);
        producing.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= jobs {
                    break;
                }
                let body = json!({"type": "bench.job", "args": [n], "options": {"queue": QUEUE}});
                loop {
                    requests.fetch_add(1, Ordering::Relaxed);
                    match conn.post("/ojs/v1/jobs", &body).await {
                        Ok((201, _)) => break,
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                created.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let completed = Arc::new(AtomicU64::new(0));
    let mut working = Vec::new();
    for w in 0..workers {
        let (completed, requests, errors, done, twice) =
            (completed.clone(), requests.clone(), errors.clone(), done.clone(), twice.clone());
        let mut conn = Conn::new(&addresses[w % addresses.len()]);
        let worker = format!("bench-ojs-{w}");
        working.push(tokio::spawn(async move {
            let fetch = json!({"queues": [QUEUE], "count": FETCH, "worker_id": worker, "wait_ms": 1000});
            while completed.load(Ordering::Relaxed) < jobs {
                requests.fetch_add(1, Ordering::Relaxed);
                let fetched = match conn.post("/ojs/v1/workers/fetch", &fetch).await {
                    Ok((200, answer)) => answer["jobs"].as_array().cloned().unwrap_or_default(),
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                for job in fetched {
                    let ack = json!({"job_id": job["id"], "attempt": job["attempt"], "worker_id": worker});
                    requests.fetch_add(1, Ordering::Relaxed);
                    match conn.post("/ojs/v1/workers/ack", &ack).await {
                        Ok((200, _)) => {
                            let n = job["args"][0].as_u64().unwrap_or(u64::MAX);
                            if let Some(word) = done.get((n / 64) as usize) {
                                if word.fetch_or(1 << (n % 64), Ordering::Relaxed) & (1 << (n % 64)) != 0 {
                                    twice.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                        // Its activation timed out meanwhile: it comes back.
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    for task in producing {
        task.await?;
    }
    let enqueue_elapsed = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(120 + jobs / 200);
    for task in working {
        tokio::time::timeout_at(deadline.into(), task).await.context("the OJS workers did not finish")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let unique: u64 = done.iter().map(|w| u64::from(w.load(Ordering::Relaxed).count_ones())).sum();
    let created = created.load(Ordering::Relaxed);
    let mut per_job = Vec::new();
    for (name, before) in COUNTED.into_iter().zip(counted_before) {
        let after = total(cluster, name).await;
        per_job.push(after.map(|after| (after - before.unwrap_or(0.0)) / created.max(1) as f64));
    }
    Ok(OjsFigures {
        producers,
        workers,
        jobs_created: created,
        jobs_completed_unique: unique,
        lost: created.saturating_sub(unique),
        completed_twice: twice.load(Ordering::Relaxed),
        request_errors: errors.load(Ordering::Relaxed),
        elapsed_s: elapsed,
        jobs_per_s: unique as f64 / elapsed,
        enqueue_per_s: created as f64 / enqueue_elapsed,
        requests_per_job: requests.load(Ordering::Relaxed) as f64 / created.max(1) as f64,
        job_reads_per_job: per_job[0],
        raft_commands_per_job: per_job[1],
    })
}
