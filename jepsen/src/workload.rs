//! Clients that create jobs with unique ids through random gateways, and
//! workers (long polling and streaming) that complete, fail, ignore or
//! complete-too-late what they receive. Every operation is recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::proto::gateway::{ActivatedJob, StreamActivatedJobsRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::history::{Kind, Op, Phase};

pub const JOB_TYPE: &str = "jepsen";
/// Short, so timeouts and redeliveries happen often.
pub const ACTIVATION_TIMEOUT_MS: i64 = 2_000;

pub struct Recorder {
    started: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder { started: Instant::now(), ops: Mutex::new(Vec::new()) }
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(&self, process: u64, node: usize, kind: Kind, phase: Phase, id: u64, key: Option<u64>, attempt: u32) {
        let op = Op { time_ms: self.now_ms(), process, node, kind, phase, id, key, attempt };
        self.ops.lock().unwrap().push(op);
    }

    pub fn take(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }
}

/// Whether an error means "certainly did not happen".
fn certain_failure(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::ResourceExhausted)
}

pub struct Shared {
    pub recorder: Recorder,
    pub gateways: Vec<String>,
    pub next_id: AtomicU64,
    /// Producers stop when this is set.
    pub stop_creating: AtomicBool,
    /// Workers stop misbehaving (the drain) when this is set.
    pub draining: AtomicBool,
    /// Everything stops when this is set.
    pub stop: AtomicBool,
}

fn id_of(job: &ActivatedJob) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_str(&job.variables).ok()?;
    value["id"].as_u64()
}

pub async fn producer(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clients: Vec<Client> = shared.gateways.iter().map(|g| Client::connect_lazy(g).unwrap()).collect();
    while !shared.stop_creating.load(Ordering::Relaxed) {
        let node = rng.random_range(0..clients.len());
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        shared.recorder.record(process, node, Kind::Create, Phase::Invoke, id, None, 0);
        let variables = format!(r#"{{"id":{id}}}"#);
        let create = clients[node].create_job(JOB_TYPE, &variables);
        match tokio::time::timeout(Duration::from_secs(5), create).await {
            Ok(Ok(key)) => shared.recorder.record(process, node, Kind::Create, Phase::Ok, id, Some(key), 0),
            Ok(Err(status)) if certain_failure(&status) => {
                shared.recorder.record(process, node, Kind::Create, Phase::Fail, id, None, 0)
            }
            _ => {
                shared.recorder.record(process, node, Kind::Create, Phase::Info, id, None, 0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
    }
}

/// Handles one activated job the way a (sometimes unreliable) worker would.
async fn handle(shared: &Shared, client: &Client, process: u64, node: usize, job: ActivatedJob, rng: &mut StdRng) {
    let Some(id) = id_of(&job) else { return };
    shared.recorder.record(process, node, Kind::Activate, Phase::Ok, id, Some(job.key), job.attempt);
    let roll: u32 = if shared.draining.load(Ordering::Relaxed) { 0 } else { rng.random_range(0..100) };
    if roll >= 90 {
        return; // never answers: the activation times out
    }
    if (80..90).contains(&roll) {
        shared.recorder.record(process, node, Kind::Fail, Phase::Invoke, id, Some(job.key), job.attempt);
        let retries = (job.retries - 1).max(1);
        let result = client.fail(job.key, job.attempt, retries, "jepsen says no", 100).await;
        let phase = match result {
            Ok(()) => Phase::Ok,
            Err(status) if certain_failure(&status) => Phase::Fail,
            Err(_) => Phase::Info,
        };
        shared.recorder.record(process, node, Kind::Fail, phase, id, Some(job.key), job.attempt);
        return;
    }
    if (75..80).contains(&roll) {
        // Answers after the activation timed out: must be rejected if the job
        // was handed to someone else meanwhile.
        tokio::time::sleep(Duration::from_millis(ACTIVATION_TIMEOUT_MS as u64 + 500)).await;
    }
    shared.recorder.record(process, node, Kind::Complete, Phase::Invoke, id, Some(job.key), job.attempt);
    let result = tokio::time::timeout(Duration::from_secs(5), client.complete(job.key, job.attempt, "{}")).await;
    let phase = match result {
        Ok(Ok(())) => Phase::Ok,
        Ok(Err(status)) if certain_failure(&status) => Phase::Fail,
        _ => Phase::Info,
    };
    shared.recorder.record(process, node, Kind::Complete, phase, id, Some(job.key), job.attempt);
}

pub async fn poller(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clients: Vec<Client> = shared.gateways.iter().map(|g| Client::connect_lazy(g).unwrap()).collect();
    while !shared.stop.load(Ordering::Relaxed) {
        let node = rng.random_range(0..clients.len());
        let worker = format!("poller-{process}");
        let activate = clients[node].activate(JOB_TYPE, &worker, 8, ACTIVATION_TIMEOUT_MS, 500);
        let jobs = match tokio::time::timeout(Duration::from_secs(5), activate).await {
            Ok(Ok(jobs)) => jobs,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for job in jobs {
            handle(&shared, &clients[node], process, node, job, &mut rng).await;
        }
    }
}

pub async fn streamer(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !shared.stop.load(Ordering::Relaxed) {
        let node = rng.random_range(0..shared.gateways.len());
        let client = Client::connect_lazy(&shared.gateways[node]).unwrap();
        let request = StreamActivatedJobsRequest {
            r#type: JOB_TYPE.into(),
            worker: "streamer".into(),
            timeout: ACTIVATION_TIMEOUT_MS,
            // It works one job at a time: more would wait past their timeout.
            max_jobs_in_flight: 2,
            ..Default::default()
        };
        let opened = tokio::time::timeout(Duration::from_secs(3), client.raw().stream_activated_jobs(request)).await;
        let Ok(Ok(response)) = opened else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = response.into_inner();
        while !shared.stop.load(Ordering::Relaxed) {
            match tokio::time::timeout(Duration::from_secs(3), stream.message()).await {
                Ok(Ok(Some(job))) => handle(&shared, &client, process, node, job, &mut rng).await,
                Ok(_) => break,
                Err(_) => {
                    // Idle: reconnect now and then, possibly to another gateway.
                    if rng.random_bool(0.3) {
                        break;
                    }
                }
            }
        }
    }
}
