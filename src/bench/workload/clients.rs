//! The bench's clients: producers that create jobs and workers that
//! complete them, over streams or one call each, and their bookkeeping.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde::Deserialize;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

use crate::client::leaders::Leaders;
use crate::client::Client;
use crate::proto::gateway::{
    ActivatedJob, CompleteJobBatch, CompleteJobRequest, CompleteJobsResponse, CreateJobBatch, CreateJobRequest,
    CreateJobResponse, StreamActivatedJobsRequest,
};

#[derive(Deserialize)]
pub(super) struct Payload {
    seq: u64,
    sent: u64,
}

pub(crate) fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Padded with letters drawn from `seq` (xorshift) when `incompressible`,
/// else with `x`.
pub(super) fn padded(seq: u64, size: usize, incompressible: bool) -> String {
    let head = format!("{{\"seq\":{seq},\"sent\":{},\"pad\":\"", now_micros());
    let pad = size.saturating_sub(head.len() + 2);
    let mut text = String::with_capacity(head.len() + pad + 2);
    text.push_str(&head);
    if incompressible {
        const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        text.extend((0..pad).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            LETTERS[(state % 64) as usize] as char
        }));
    } else {
        text.extend(std::iter::repeat_n('x', pad));
    }
    text.push_str("\"}");
    text
}

/// The next job a worker's stream brings, with the time it arrived (µs since
/// the epoch); `None` once `stop` is set or the stream ends.
pub(crate) async fn next_job(
    jobs: &mut tonic::Streaming<ActivatedJob>,
    stop: &mut watch::Receiver<bool>,
) -> Option<(ActivatedJob, u64)> {
    let job = tokio::select! {
        job = jobs.message() => job,
        _ = stop.wait_for(|s| *s) => return None,
    };
    let job = job.ok()??;
    Some((job, now_micros()))
}

/// Jobs each bench worker's stream may hold before it completes some.
pub(super) const WORKER_JOBS_IN_FLIGHT: i32 = 256;
/// Creates in one CreateJobBatches message, at most (the gateway's limit).
pub(super) const MAX_CREATE_BATCH: u64 = 1024;

/// Per-sequence-number bookkeeping shared by producers and workers.
pub(super) struct Tracker {
    pub(super) acked: Vec<AtomicBool>,
    pub(super) completions: Vec<AtomicU32>,
    pub(super) deliveries: Vec<AtomicU32>,
    pub(super) acked_total: AtomicU64,
    pub(super) create_errors: AtomicU64,
    pub(super) completed_unique: AtomicU64,
}

impl Tracker {
    pub(super) fn new(jobs: u64) -> Self {
        Tracker {
            acked: (0..jobs).map(|_| AtomicBool::new(false)).collect(),
            completions: (0..jobs).map(|_| AtomicU32::new(0)).collect(),
            deliveries: (0..jobs).map(|_| AtomicU32::new(0)).collect(),
            acked_total: AtomicU64::new(0),
            create_errors: AtomicU64::new(0),
            completed_unique: AtomicU64::new(0),
        }
    }
}

/// The CA the bench's clients trust for `https://` gateways (set once, before
/// the first workload; `None`: the client library's default).
pub(super) static GATEWAY_CA: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();

pub fn trust(ca: Option<Vec<u8>>) {
    let _ = GATEWAY_CA.set(ca);
}

pub(super) fn gateway_ca() -> Option<&'static [u8]> {
    GATEWAY_CA.get().and_then(|ca| ca.as_deref())
}

pub(super) static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The token every client sends; without one, $DROVER_TOKEN's.
pub fn authenticate(token: Option<String>) {
    let _ = TOKEN.set(token);
}

pub(super) fn bearer() -> crate::client::Bearer {
    match TOKEN.get().and_then(Option::as_deref) {
        Some(token) => crate::client::Bearer::new(Some(token)).unwrap_or_default(),
        None => crate::client::Bearer::from_env(),
    }
}

pub(super) async fn connect(gateway: &str) -> anyhow::Result<Client> {
    let client =
        Client::connect_with_ca(gateway, gateway_ca()).await.with_context(|| format!("connecting to {gateway}"))?;
    match TOKEN.get().and_then(Option::as_deref) {
        Some(token) => Ok(client.with_token(token)?),
        None => Ok(client),
    }
}

/// A batch stream's answers one job at a time, in order.
pub(super) fn each_answer<B: Send + 'static, A: Send + 'static>(
    batches: tonic::Streaming<B>,
    jobs: fn(B) -> Vec<A>,
) -> BoxStream<'static, Result<A, tonic::Status>> {
    batches.map_ok(move |batch| futures::stream::iter(jobs(batch).into_iter().map(Ok))).try_flatten().boxed()
}

/// What each create of a producer looks like.
#[derive(Clone, Copy)]
pub(super) struct CreateShape {
    pub(super) payload_bytes: usize,
    pub(super) incompressible: bool,
    /// Every create carries an idempotency key.
    pub(super) keyed: bool,
    /// Creates travel several to a message (CreateJobBatches).
    pub(super) batched: bool,
}

/// Creates `seqs` over one CreateJobBatches stream (CreateJobs unless
/// `shape.batched`) with at most `in_flight` waiting. With `rate`, paces
/// sends, one create at a time; records acknowledgement latency.
pub(super) async fn produce(
    gateway: String,
    job_type: String,
    seqs: std::ops::Range<u64>,
    shape: CreateShape,
    in_flight: usize,
    rate: Option<u64>,
    tracker: Arc<Tracker>,
) -> anyhow::Result<Histogram<u64>> {
    let CreateShape { payload_bytes, incompressible, keyed, batched } = shape;
    let client = connect(&gateway).await?;
    let (tx, rx) = mpsc::channel::<Vec<CreateJobRequest>>(in_flight);
    let permits = Arc::new(Semaphore::new(in_flight));
    let sent_at: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
    let mut responses: BoxStream<'static, Result<CreateJobResponse, tonic::Status>> = if batched {
        let batches = ReceiverStream::new(rx).map(|jobs| CreateJobBatch { jobs });
        let answers = client.raw().create_job_batches(batches).await?.into_inner();
        each_answer(answers, |batch| batch.jobs)
    } else {
        let requests = ReceiverStream::new(rx).flat_map(futures::stream::iter);
        client.raw().create_jobs(requests).await?.into_inner().boxed()
    };
    let sender = {
        let (permits, sent_at, mut seqs) = (Arc::clone(&permits), Arc::clone(&sent_at), seqs.clone());
        tokio::spawn(async move {
            let mut ticker = rate.map(|r| {
                let mut t = tokio::time::interval(Duration::from_nanos(1_000_000_000 / r.max(1)));
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                t
            });
            let create = |seq: u64| CreateJobRequest {
                r#type: job_type.clone(),
                variables: padded(seq, payload_bytes, incompressible),
                idempotency_key: if keyed { format!("{job_type}-{seq}") } else { String::new() },
                ..Default::default()
            };
            while let Some(first) = seqs.next() {
                if let Some(t) = ticker.as_mut() {
                    t.tick().await;
                }
                permits.acquire().await.expect("open").forget();
                // Unpaced, every create the window allows leaves together
                // (in one message when batched), as a busy producer's would.
                let more = match rate {
                    Some(_) => 0,
                    None => (permits.available_permits() as u64).min(seqs.end - seqs.start).min(MAX_CREATE_BATCH - 1),
                };
                if more > 0 {
                    permits.try_acquire_many(more as u32).expect("only this task takes permits").forget();
                }
                let batch: Vec<CreateJobRequest> =
                    std::iter::once(first).chain(seqs.by_ref().take(more as usize)).map(create).collect();
                {
                    let (mut sent_at, now) = (sent_at.lock().expect("lock"), Instant::now());
                    sent_at.extend(std::iter::repeat_n(now, batch.len()));
                }
                if tx.send(batch).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut ack_latency = Histogram::<u64>::new(3)?;
    let mut seq = seqs.start;
    while seq < seqs.end {
        let Some(response) = responses.next().await.transpose()? else { break };
        let sent = sent_at.lock().expect("lock").pop_front();
        if let Some(sent) = sent {
            let _ = ack_latency.record(sent.elapsed().as_micros() as u64);
        }
        if response.error.is_some() {
            tracker.create_errors.fetch_add(1, Ordering::Relaxed);
        } else {
            tracker.acked[seq as usize].store(true, Ordering::Relaxed);
            tracker.acked_total.fetch_add(1, Ordering::Relaxed);
        }
        permits.add_permits(1);
        seq += 1;
    }
    sender.abort();
    Ok(ack_latency)
}

/// A worker's CompleteJobs (or CompleteJobBatches) streams: one per gateway,
/// opened when first needed. Each completion goes to the gateway on its
/// partition's leader when that is known (no forward), else through the
/// worker's own gateway.
pub(super) struct Completer {
    own: String,
    leaders: Option<Arc<Leaders>>,
    /// Completions travel several to a message.
    batched: bool,
    streams: HashMap<String, mpsc::Sender<Vec<CompleteJobRequest>>>,
    /// Gateways whose stream could not be opened or broke: not routed to
    /// again in this run.
    unusable: std::collections::HashSet<String>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// Sequence numbers by job key, of completions sent and not answered.
    pending: Arc<Mutex<HashMap<u64, u64>>>,
    tracker: Arc<Tracker>,
}

impl Completer {
    async fn open(&mut self, gateway: &str) -> anyhow::Result<()> {
        let client = connect(gateway).await?;
        let (tx, rx) = mpsc::channel::<Vec<CompleteJobRequest>>(4096);
        let mut answers: BoxStream<'static, Result<CompleteJobsResponse, tonic::Status>> = if self.batched {
            let batches = ReceiverStream::new(rx).map(|jobs| CompleteJobBatch { jobs });
            let answers = client.raw().complete_job_batches(batches).await?.into_inner();
            each_answer(answers, |batch| batch.jobs)
        } else {
            let requests = ReceiverStream::new(rx).flat_map(futures::stream::iter);
            client.raw().complete_jobs(requests).await?.into_inner().boxed()
        };
        let (pending, tracker) = (Arc::clone(&self.pending), Arc::clone(&self.tracker));
        self.readers.push(tokio::spawn(async move {
            while let Some(Ok(response)) = answers.next().await {
                let seq = pending.lock().expect("lock").remove(&response.key);
                if let (Some(seq), None) = (seq, response.error) {
                    if tracker.completions[seq as usize].fetch_add(1, Ordering::Relaxed) == 0 {
                        tracker.completed_unique.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
        self.streams.insert(gateway.to_string(), tx);
        Ok(())
    }

    /// Sends completions (each with its job's sequence number), together per
    /// gateway; false when not even the worker's own gateway takes them.
    async fn complete(&mut self, completions: Vec<(CompleteJobRequest, u64)>) -> bool {
        let mut by_gateway: Vec<(String, Vec<CompleteJobRequest>)> = Vec::new();
        {
            let mut pending = self.pending.lock().expect("lock");
            for (request, seq) in completions {
                pending.insert(request.key, seq);
                let routed = self.leaders.as_ref().and_then(|l| l.gateway_of_key(request.key));
                let gateway = routed.filter(|g| !self.unusable.contains(*g)).unwrap_or(&self.own);
                match by_gateway.iter_mut().find(|(g, _)| g == gateway) {
                    Some((_, requests)) => requests.push(request),
                    None => by_gateway.push((gateway.to_string(), vec![request])),
                }
            }
        }
        for (gateway, requests) in by_gateway {
            if !self.send(gateway, requests).await {
                return false;
            }
        }
        true
    }

    async fn send(&mut self, mut gateway: String, requests: Vec<CompleteJobRequest>) -> bool {
        if !self.streams.contains_key(&gateway) && self.open(&gateway).await.is_err() {
            self.unusable.insert(gateway);
            gateway = self.own.clone();
        }
        let Some(stream) = self.streams.get(&gateway) else { return false };
        match stream.send(requests).await {
            Ok(()) => true,
            Err(mpsc::error::SendError(requests)) if gateway != self.own => {
                // That gateway's stream broke: its completions go through
                // the worker's own gateway from now on.
                self.streams.remove(&gateway);
                self.unusable.insert(gateway);
                match self.streams.get(&self.own) {
                    Some(own) => own.send(requests).await.is_ok(),
                    None => false,
                }
            }
            Err(_) => false,
        }
    }

    async fn finish(self) {
        drop(self.streams);
        for reader in self.readers {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
    }
}

/// Receives jobs over a stream and completes them over a CompleteJobs
/// stream, routed by `leaders` when given; with `batched`, the batch forms of
/// both, each received message's completions together.
pub(super) async fn work(
    gateway: String,
    job_type: String,
    tracker: Arc<Tracker>,
    leaders: Option<Arc<Leaders>>,
    batched: bool,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Histogram<u64>> {
    let client = connect(&gateway).await?;
    let mut completer = Completer {
        own: gateway.clone(),
        leaders,
        batched,
        streams: HashMap::new(),
        unusable: Default::default(),
        readers: Vec::new(),
        pending: Arc::default(),
        tracker: Arc::clone(&tracker),
    };
    completer.open(&gateway).await?;
    let request = StreamActivatedJobsRequest {
        r#type: job_type,
        worker: "bench".into(),
        timeout: 30_000,
        // Completions are pipelined: the window must cover throughput x round trip.
        max_jobs_in_flight: WORKER_JOBS_IN_FLIGHT,
        ..Default::default()
    };
    let mut messages: BoxStream<'static, Result<Vec<ActivatedJob>, tonic::Status>> = if batched {
        client.raw().stream_activated_job_batches(request).await?.into_inner().map_ok(|batch| batch.jobs).boxed()
    } else {
        client.raw().stream_activated_jobs(request).await?.into_inner().map_ok(|job| vec![job]).boxed()
    };
    let mut latency = Histogram::<u64>::new(3)?;
    loop {
        let jobs = tokio::select! {
            jobs = messages.next() => jobs,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Some(Ok(jobs)) = jobs else { break };
        let received = now_micros();
        let mut completions = Vec::with_capacity(jobs.len());
        for job in jobs {
            let Ok(payload) = serde_json::from_str::<Payload>(&job.variables) else { continue };
            let _ = latency.record(received.saturating_sub(payload.sent));
            tracker.deliveries[payload.seq as usize].fetch_add(1, Ordering::Relaxed);
            completions.push((
                CompleteJobRequest {
                    key: job.key,
                    attempt: job.attempt,
                    variables: String::new(),
                    override_fence: false,
                },
                payload.seq,
            ));
        }
        if !completer.complete(completions).await {
            break;
        }
    }
    completer.finish().await;
    Ok(latency)
}

/// The partitions' leader gateways among `gateways`, learned now and every
/// second until `stop` (a stale map costs forwards, not errors).
pub(super) async fn learn_leaders(
    gateways: &[String],
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Arc<Leaders>> {
    let leaders = Arc::new(Leaders::new(gateways));
    let client = connect(&gateways[0]).await?;
    leaders.learn(&client.topology().await?);
    let learner = Arc::clone(&leaders);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if let Ok(topology) = client.topology().await {
                learner.learn(&topology);
            }
        }
    });
    Ok(leaders)
}

/// Which service a one-call-per-completion worker speaks.
#[derive(Clone, Copy)]
pub(super) enum Protocol {
    Drover,
    Zeebe,
}

/// A worker as Zeebe's clients work: one stream with the per-stream limit a
/// stream that names none gets, and a CompleteJob call per job, at most as
/// many at once as the stream may hold. Through `protocol`'s service, so that
/// the two differ only in it.
pub(super) async fn work_one_by_one(
    gateway: String,
    job_type: String,
    tracker: Arc<Tracker>,
    mut stop: watch::Receiver<bool>,
    protocol: Protocol,
) -> anyhow::Result<Histogram<u64>> {
    use crate::proto::zeebe as zb;
    type Jobs = std::pin::Pin<Box<dyn futures::Stream<Item = Result<(u64, u32, String), tonic::Status>> + Send>>;
    let channel = match gateway_ca() {
        Some(ca) => crate::client::endpoint_with_ca(&gateway, Some(ca))?,
        None => crate::client::endpoint(&gateway)?,
    }
    .tcp_nodelay(true)
    .connect()
    .await
    .with_context(|| format!("connecting to {gateway}"))?;
    let drover = crate::proto::gateway::gateway_client::GatewayClient::with_interceptor(channel.clone(), bearer());
    let zeebe = zb::gateway_client::GatewayClient::with_interceptor(channel, bearer());
    let mut jobs: Jobs = match protocol {
        Protocol::Drover => {
            let request = StreamActivatedJobsRequest {
                r#type: job_type,
                worker: "bench".into(),
                timeout: 30_000,
                ..Default::default()
            };
            let jobs = drover.clone().stream_activated_jobs(request).await?.into_inner();
            Box::pin(jobs.map(|job| job.map(|j| (j.key, j.attempt, j.variables))))
        }
        Protocol::Zeebe => {
            let request = zb::StreamActivatedJobsRequest {
                r#type: job_type,
                worker: "bench".into(),
                timeout: 30_000,
                ..Default::default()
            };
            let jobs = zeebe.clone().stream_activated_jobs(request).await?.into_inner();
            Box::pin(jobs.map(|job| job.map(|j| (j.key as u64, 0, j.variables))))
        }
    };
    let completing = Arc::new(Semaphore::new(crate::streams::DEFAULT_MAX_IN_FLIGHT));
    let mut latency = Histogram::<u64>::new(3)?;
    loop {
        let job = tokio::select! {
            job = jobs.next() => job,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Some(Ok((key, attempt, variables))) = job else { break };
        let received = now_micros();
        let Ok(payload) = serde_json::from_str::<Payload>(&variables) else { continue };
        let _ = latency.record(received.saturating_sub(payload.sent));
        tracker.deliveries[payload.seq as usize].fetch_add(1, Ordering::Relaxed);
        let permit = Arc::clone(&completing).acquire_owned().await.expect("open");
        let (mut drover, mut zeebe, tracker) = (drover.clone(), zeebe.clone(), Arc::clone(&tracker));
        tokio::spawn(async move {
            let completed = match protocol {
                Protocol::Drover => {
                    let complete = CompleteJobRequest { key, attempt, variables: String::new(), override_fence: false };
                    drover.complete_job(complete).await.is_ok()
                }
                Protocol::Zeebe => {
                    let complete = zb::CompleteJobRequest { job_key: key as i64, variables: String::new() };
                    zeebe.complete_job(complete).await.is_ok()
                }
            };
            if completed && tracker.completions[payload.seq as usize].fetch_add(1, Ordering::Relaxed) == 0 {
                tracker.completed_unique.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    Ok(latency)
}
