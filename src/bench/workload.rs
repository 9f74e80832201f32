//! The two workloads and their bookkeeping.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

use super::local::LocalCluster;
use super::{BenchArgs, Workload};
use crate::client::leaders::Leaders;
use crate::client::Client;
use crate::proto::gateway::{
    ActivatedJob, CompleteJobBatch, CompleteJobRequest, CompleteJobsResponse, CreateJobBatch, CreateJobRequest,
    CreateJobResponse, StreamActivatedJobsRequest,
};

/// Give up waiting for completions after this long without progress.
const STALL_LIMIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub count: u64,
}

impl Percentiles {
    pub(super) fn of(h: &Histogram<u64>) -> Self {
        let ms = |micros: u64| micros as f64 / 1000.0;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            count: h.len(),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Figures {
    /// Producers that created the jobs, each on its own gateway while there
    /// are gateways enough (the latency workload's rate is split over them).
    pub producers: usize,
    /// Creates each producer had acknowledged.
    pub created_per_producer: Vec<u64>,
    pub jobs_created: u64,
    pub create_errors: u64,
    pub jobs_completed_unique: u64,
    pub lost: u64,
    pub completed_twice: u64,
    pub redelivered: u64,
    pub elapsed_s: f64,
    pub jobs_per_s: f64,
    pub create_ack_per_s: f64,
    pub latency_ms: Option<Percentiles>,
    pub create_ack_latency_ms: Option<Percentiles>,
    pub rss_start_mib: Vec<f64>,
    pub rss_peak_mib: Vec<f64>,
    pub rss_end_mib: Vec<f64>,
    /// Each node's peak resident set in each minute of the run (is memory flat?).
    pub rss_peak_per_minute_mib: Vec<Vec<f64>>,
    pub wal_syncs: Vec<u64>,
    pub jobs_per_sync: Option<f64>,
    /// How many partitions each gateway's node led when the workload began
    /// and when it ended (empty when the topology did not say): a node that
    /// leads every partition does all the leaders' work.
    pub leaders_per_node: Vec<Vec<usize>>,
    /// The machine's 1-minute load average just before the workload started.
    pub load_average_before: Option<f64>,
    /// Of the machine's CPU time during the workload, the percent that was
    /// busy (everything on it, the bench included) and that the hypervisor
    /// gave to other guests (steal).
    pub cpu_busy_percent: Option<f64>,
    pub cpu_steal_percent: Option<f64>,
    /// Where the time went, by stage, summed over the local nodes.
    pub stages: Vec<super::stages::StageFigure>,
    /// Bytes the local nodes' databases wrote per completed job, summed over
    /// nodes, by kind (user: write batches; wal; flush; compaction), then the
    /// bytes put into each table (the user bytes' sources, deletes aside).
    pub written_per_job: Vec<(String, f64)>,
    /// Requests between the local nodes per completed job, by method
    /// (Raft appends, forwards, pushes...), largest first.
    pub cluster_requests_per_job: Vec<(String, f64)>,
    /// Client requests the local gateways answered per completed job, by method.
    pub client_requests_per_job: Vec<(String, f64)>,
    /// Messages both ways on the local gateways' job streams per completed
    /// job, by method.
    pub client_messages_per_job: Vec<(String, f64)>,
    /// Pushed jobs whose leader could not tell whether a worker got them,
    /// summed over the local nodes; of those, the ones their gateway handed
    /// back when it came to the push. The rest wait for their activation
    /// timeout (a run's slowest job then takes that long).
    pub pushed_outcome_unknown: u64,
    pub handed_back_late: u64,
}

impl Figures {
    /// Whether a partition's leadership changed during the workload: the
    /// local nodes asked each other for votes, or a leader handed over.
    pub fn leadership_changed(&self) -> bool {
        self.cluster_requests_per_job
            .iter()
            .any(|(method, per_job)| matches!(method.as_str(), "Vote" | "Campaign") && *per_job > 0.0)
    }

    pub fn print(&self, workload: Workload) {
        println!("== {workload:?} ==");
        println!("  producers (jobs each)         {} {:?}", self.producers, self.created_per_producer);
        println!("  jobs created (acknowledged)   {}", self.jobs_created);
        println!("  create errors                 {}", self.create_errors);
        println!("  jobs completed (unique)       {}", self.jobs_completed_unique);
        println!("  lost / completed twice        {} / {}", self.lost, self.completed_twice);
        println!("  redelivered                   {}", self.redelivered);
        println!("  elapsed                       {:.2} s", self.elapsed_s);
        println!("  end-to-end throughput         {:.0} jobs/s", self.jobs_per_s);
        println!("  create acknowledgements       {:.0} /s", self.create_ack_per_s);
        if let Some(l) = self.latency_ms {
            println!(
                "  create sent -> worker received  p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
                l.p50, l.p99, l.p999, l.max
            );
        }
        if let Some(l) = self.create_ack_latency_ms {
            println!(
                "  create acknowledgement         p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
                l.p50, l.p99, l.p999, l.max
            );
        }
        if !self.rss_peak_mib.is_empty() {
            println!(
                "  RSS per node (MiB)  start {:?}  peak {:?}  end {:?}",
                self.rss_start_mib, self.rss_peak_mib, self.rss_end_mib
            );
        }
        if self.rss_peak_per_minute_mib.iter().any(|minutes| minutes.len() > 1) {
            for (node, minutes) in self.rss_peak_per_minute_mib.iter().enumerate() {
                println!("  RSS peak per minute, node {node} (MiB)  {minutes:?}");
            }
        }
        if let Some(jobs_per_sync) = self.jobs_per_sync {
            println!("  WAL syncs per node {:?}; jobs per sync {:.1}", self.wal_syncs, jobs_per_sync);
        }
        match self.leaders_per_node.as_slice() {
            [start, end] if start != end => {
                println!("  partitions led per node       {start:?} at the start, {end:?} at the end")
            }
            [start, ..] => println!("  partitions led per node       {start:?}"),
            [] => {}
        }
        if !self.written_per_job.is_empty() {
            let kinds: Vec<String> = self.written_per_job.iter().map(|(k, b)| format!("{k} {b:.0}")).collect();
            let (written, tables) = kinds.split_at(kinds.len().min(4));
            println!("  bytes written per job, all nodes  {}", written.join(", "));
            println!("    put by table                    {}", tables.join(", "));
        }
        for (what, requests) in [
            ("requests between nodes", &self.cluster_requests_per_job),
            ("client requests", &self.client_requests_per_job),
            ("client stream messages", &self.client_messages_per_job),
        ] {
            if !requests.is_empty() {
                let total: f64 = requests.iter().map(|(_, n)| n).sum();
                let each: Vec<String> = requests.iter().map(|(m, n)| format!("{m} {n:.3}")).collect();
                println!("  {what} per job  {total:.3}: {}", each.join(", "));
            }
        }
        if self.pushed_outcome_unknown > 0 || self.handed_back_late > 0 {
            println!(
                "  pushed jobs of unknown outcome  {} ({} handed back by their gateway, the rest wait for their activation timeout)",
                self.pushed_outcome_unknown, self.handed_back_late
            );
        }
        if let Some(load) = self.load_average_before {
            println!("  load average before           {load:.2}");
        }
        if let (Some(busy), Some(steal)) = (self.cpu_busy_percent, self.cpu_steal_percent) {
            println!("  CPU during the run            busy {busy:.1}%, stolen {steal:.1}%");
        }
        super::stages::print(&self.stages);
    }
}

#[derive(Deserialize)]
struct Payload {
    seq: u64,
    sent: u64,
}

pub(super) fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn payload(seq: u64, size: usize) -> String {
    let head = format!("{{\"seq\":{seq},\"sent\":{},\"pad\":\"", now_micros());
    let pad = size.saturating_sub(head.len() + 2);
    let mut text = String::with_capacity(head.len() + pad + 2);
    text.push_str(&head);
    text.extend(std::iter::repeat_n('x', pad));
    text.push_str("\"}");
    text
}

/// The next job a worker's stream brings, with the time it arrived (µs since
/// the epoch); `None` once `stop` is set or the stream ends.
pub(super) async fn next_job(
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
const WORKER_JOBS_IN_FLIGHT: i32 = 256;
/// Creates in one CreateJobBatches message, at most (the gateway's limit).
const MAX_CREATE_BATCH: u64 = 1024;

/// Per-sequence-number bookkeeping shared by producers and workers.
struct Tracker {
    acked: Vec<AtomicBool>,
    completions: Vec<AtomicU32>,
    deliveries: Vec<AtomicU32>,
    acked_total: AtomicU64,
    create_errors: AtomicU64,
    completed_unique: AtomicU64,
}

impl Tracker {
    fn new(jobs: u64) -> Self {
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
static GATEWAY_CA: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();

pub fn trust(ca: Option<Vec<u8>>) {
    let _ = GATEWAY_CA.set(ca);
}

fn gateway_ca() -> Option<&'static [u8]> {
    GATEWAY_CA.get().and_then(|ca| ca.as_deref())
}

static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The token every client sends; without one, $DROVER_TOKEN's.
pub fn authenticate(token: Option<String>) {
    let _ = TOKEN.set(token);
}

fn bearer() -> crate::client::Bearer {
    match TOKEN.get().and_then(Option::as_deref) {
        Some(token) => crate::client::Bearer::new(Some(token)).unwrap_or_default(),
        None => crate::client::Bearer::from_env(),
    }
}

async fn connect(gateway: &str) -> anyhow::Result<Client> {
    let client =
        Client::connect_with_ca(gateway, gateway_ca()).await.with_context(|| format!("connecting to {gateway}"))?;
    match TOKEN.get().and_then(Option::as_deref) {
        Some(token) => Ok(client.with_token(token)?),
        None => Ok(client),
    }
}

/// A batch stream's answers one job at a time, in order.
fn each_answer<B: Send + 'static, A: Send + 'static>(
    batches: tonic::Streaming<B>,
    jobs: fn(B) -> Vec<A>,
) -> BoxStream<'static, Result<A, tonic::Status>> {
    batches.map_ok(move |batch| futures::stream::iter(jobs(batch).into_iter().map(Ok))).try_flatten().boxed()
}

/// What each create of a producer looks like.
#[derive(Clone, Copy)]
struct CreateShape {
    payload_bytes: usize,
    /// Every create carries an idempotency key.
    keyed: bool,
    /// Creates travel several to a message (CreateJobBatches).
    batched: bool,
}

/// Creates `seqs` over one CreateJobBatches stream (CreateJobs unless
/// `shape.batched`) with at most `in_flight` waiting. With `rate`, paces
/// sends, one create at a time; records acknowledgement latency.
async fn produce(
    gateway: String,
    job_type: String,
    seqs: std::ops::Range<u64>,
    shape: CreateShape,
    in_flight: usize,
    rate: Option<u64>,
    tracker: Arc<Tracker>,
) -> anyhow::Result<Histogram<u64>> {
    let CreateShape { payload_bytes, keyed, batched } = shape;
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
                variables: payload(seq, payload_bytes),
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
struct Completer {
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
async fn work(
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
                CompleteJobRequest { key: job.key, attempt: job.attempt, variables: String::new() },
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
async fn learn_leaders(gateways: &[String], mut stop: watch::Receiver<bool>) -> anyhow::Result<Arc<Leaders>> {
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
enum Protocol {
    Drover,
    Zeebe,
}

/// A worker as Zeebe's clients work: one stream with the per-stream limit a
/// stream that names none gets, and a CompleteJob call per job, at most as
/// many at once as the stream may hold. Through `protocol`'s service, so that
/// the two differ only in it.
async fn work_one_by_one(
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
    let completing = Arc::new(Semaphore::new(crate::gateway::streams::DEFAULT_MAX_IN_FLIGHT));
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
                    let complete = CompleteJobRequest { key, attempt, variables: String::new() };
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

/// Pushed jobs of unknown outcome and jobs handed back late, summed over
/// the local nodes.
async fn push_doubts(cluster: Option<&LocalCluster>) -> (f64, f64) {
    let unknown = "drover_broker_jobs_push_fail_try_count_total{code=\"UNKNOWN\"} ";
    let late = "drover_gateway_job_stream_handed_back_total{reason=\"late\"} ";
    (sample_per_node(cluster, unknown).await.iter().sum(), sample_per_node(cluster, late).await.iter().sum())
}

async fn wal_syncs(cluster: Option<&LocalCluster>) -> Vec<u64> {
    sample_per_node(cluster, "drover_storage_wal_syncs_total ").await.into_iter().map(|v| v as u64).collect()
}

/// Bytes the local nodes' databases have written, by kind, then the bytes
/// put into each table, summed over nodes.
async fn written(cluster: Option<&LocalCluster>) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    for kind in ["user", "wal", "flush", "compaction"] {
        let sample = format!("{}{{kind=\"{kind}\"}} ", crate::admin::WRITTEN_METRIC);
        out.push((kind, sample_per_node(cluster, &sample).await.iter().sum()));
    }
    for table in crate::storage::Table::ALL.map(crate::storage::Table::cf_name) {
        let sample = format!("{}{{table=\"{table}\"}} ", crate::admin::PUT_METRIC);
        out.push((table, sample_per_node(cluster, &sample).await.iter().sum()));
    }
    out
}

/// Requests counted in `metric` (by `method` and `code`), by method, summed
/// over the local nodes and codes.
async fn requests_by_method(cluster: Option<&LocalCluster>, metric: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Some(cluster) = cluster else { return out };
    let prefix = format!("{metric}{{");
    for index in 0..cluster.nodes.len() {
        let Ok((_, body)) = cluster.admin_get(index, "/metrics").await else { continue };
        for line in body.lines() {
            let Some((labels, value)) = line.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once("} ")) else {
                continue;
            };
            let (Some(method), Ok(value)) = (super::stages::label(labels, "method"), value.trim().parse::<f64>())
            else {
                continue;
            };
            *out.entry(method.to_string()).or_default() += value;
        }
    }
    out
}

/// Per job, what `after` counted more than `before`, largest first.
fn per_job_by_method(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, jobs: u64) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .map(|(method, n)| (method.clone(), (n - before.get(method).copied().unwrap_or(0.0)) / jobs.max(1) as f64))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// Each local node's value of the sample whose line starts with `prefix`
/// (name, labels and the space before the value); 0 where it is missing.
async fn sample_per_node(cluster: Option<&LocalCluster>, prefix: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let Some(cluster) = cluster else { return out };
    for index in 0..cluster.nodes.len() {
        let value = match cluster.admin_get(index, "/metrics").await {
            Ok((_, body)) => body
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0),
            Err(_) => 0.0,
        };
        out.push(value);
    }
    out
}

fn mib(bytes: &[u64]) -> Vec<f64> {
    bytes.iter().map(|b| (*b as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0).collect()
}

async fn run(
    args: &BenchArgs,
    gateways: &[String],
    cluster: Option<&LocalCluster>,
    jobs: u64,
    rate: Option<u64>,
    producers: Option<usize>,
) -> anyhow::Result<Figures> {
    let job_type = format!("bench-{}", rand::random::<u32>());
    let tracker = Arc::new(Tracker::new(jobs));
    let (stop_tx, stop_rx) = watch::channel(false);
    let rss_start = cluster.map(|c| c.resident_bytes()).unwrap_or_default();
    let syncs_before = wal_syncs(cluster).await;
    let doubts_before = push_doubts(cluster).await;
    let written_before = written(cluster).await;
    let cluster_requests_before = requests_by_method(cluster, crate::gateway::CLUSTER_REQUESTS).await;
    let client_requests_before = requests_by_method(cluster, "drover_grpc_requests_total").await;
    let client_messages_before = requests_by_method(cluster, crate::gateway::STREAM_MESSAGES).await;

    let leaders = match args.unrouted {
        true => None,
        false => match learn_leaders(gateways, stop_rx.clone()).await {
            Ok(leaders) => Some(leaders),
            Err(e) => {
                eprintln!(
                    "bench: no topology from {} ({e:#}): completions go through each worker's gateway",
                    gateways[0]
                );
                None
            }
        },
    };
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let gateway = gateways[i % gateways.len()].clone();
        let (job_type, tracker, stop) = (job_type.clone(), Arc::clone(&tracker), stop_rx.clone());
        workers.push(match (args.zeebe, args.one_by_one) {
            (true, _) => tokio::spawn(work_one_by_one(gateway, job_type, tracker, stop, Protocol::Zeebe)),
            (false, true) => tokio::spawn(work_one_by_one(gateway, job_type, tracker, stop, Protocol::Drover)),
            (false, false) => {
                tokio::spawn(work(gateway, job_type, tracker, leaders.clone(), !args.one_job_per_message, stop))
            }
        });
    }
    // Let the streams register before the first job, as long-running workers would be.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let load_average_before = super::conditions::load_average();
    let cpu_before = super::conditions::CpuTimes::read();
    let stages_before = match cluster {
        Some(cluster) => super::stages::read(cluster).await,
        None => Default::default(),
    };

    let rss_peak: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(rss_start.clone()));
    let rss_minutes: Arc<Mutex<Vec<Vec<u64>>>> = Arc::new(Mutex::new(vec![Vec::new(); rss_start.len()]));
    let sampler = cluster.map(|c| {
        let pids: Vec<u32> = c.nodes.iter().map(|n| n.child.id()).collect();
        let (peak, minutes, mut stop) = (Arc::clone(&rss_peak), Arc::clone(&rss_minutes), stop_rx.clone());
        let sampling_since = Instant::now();
        tokio::spawn(async move {
            loop {
                {
                    let minute = (sampling_since.elapsed().as_secs() / 60) as usize;
                    let (mut peak, mut minutes) = (peak.lock().expect("lock"), minutes.lock().expect("lock"));
                    for (i, pid) in pids.iter().enumerate() {
                        let rss = crate::node::memory::resident_bytes(*pid);
                        peak[i] = peak[i].max(rss);
                        if minutes[i].len() <= minute {
                            minutes[i].resize(minute + 1, 0);
                        }
                        minutes[i][minute] = minutes[i][minute].max(rss);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    });

    // Producers use gateways on partition leaders when the topology says
    // which: their keyless creates then stay on the node that takes them.
    let producer_gateways: Vec<String> = match &leaders {
        Some(leaders) => {
            let leading = leaders.leading_gateways();
            if leading.is_empty() {
                gateways.to_vec()
            } else {
                leading
            }
        }
        None => gateways.to_vec(),
    };
    let leaders_at_start = leaders.as_ref().map(|l| l.led_per_gateway());
    // Without a number, one producer per gateway they use.
    let producers = producers.unwrap_or(producer_gateways.len()).max(1);
    let started = Instant::now();
    let mut producer_tasks = Vec::new();
    let mut first = 0;
    for p in 0..producers as u64 {
        // The jobs and the rate are split evenly, the first producers taking
        // one more of each while there is a remainder.
        let range = first..first + share(jobs, producers as u64, p);
        first = range.end;
        let gateway = producer_gateways[p as usize % producer_gateways.len()].clone();
        let producer_rate = rate.map(|r| share(r, producers as u64, p).max(1));
        producer_tasks.push(tokio::spawn(produce(
            gateway,
            job_type.clone(),
            range,
            CreateShape {
                payload_bytes: args.payload_bytes,
                keyed: args.idempotency_keys,
                batched: !args.one_job_per_message,
            },
            args.in_flight,
            producer_rate,
            Arc::clone(&tracker),
        )));
    }
    let mut ack_latency = Histogram::<u64>::new(3)?;
    let mut created_per_producer = Vec::new();
    for task in producer_tasks {
        let histogram = task.await??;
        created_per_producer.push(histogram.len());
        ack_latency.add(histogram)?;
    }
    let produced_in = started.elapsed();

    let mut last = (0, Instant::now());
    loop {
        let done = tracker.completed_unique.load(Ordering::Relaxed);
        let acked = tracker.acked_total.load(Ordering::Relaxed);
        if done >= acked {
            break;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > STALL_LIMIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    let mut latency = Histogram::<u64>::new(3)?;
    for worker in workers {
        latency.add(worker.await??)?;
    }
    if let Some(sampler) = sampler {
        let _ = sampler.await;
    }
    let syncs_after = wal_syncs(cluster).await;
    let doubts_after = push_doubts(cluster).await;
    let written_after = written(cluster).await;
    let cluster_requests_after = requests_by_method(cluster, crate::gateway::CLUSTER_REQUESTS).await;
    let client_requests_after = requests_by_method(cluster, "drover_grpc_requests_total").await;
    let client_messages_after = requests_by_method(cluster, crate::gateway::STREAM_MESSAGES).await;

    let cpu = cpu_before.zip(super::conditions::CpuTimes::read()).and_then(|(before, after)| after.since(&before));
    let mut figures = Figures {
        producers,
        created_per_producer,
        leaders_per_node: leaders_at_start.into_iter().chain(leaders.map(|l| l.led_per_gateway())).collect(),
        load_average_before,
        cpu_steal_percent: cpu.map(|(steal, _)| steal),
        cpu_busy_percent: cpu.map(|(_, busy)| busy),
        pushed_outcome_unknown: (doubts_after.0 - doubts_before.0).max(0.0) as u64,
        handed_back_late: (doubts_after.1 - doubts_before.1).max(0.0) as u64,
        ..Figures::default()
    };
    if let Some(cluster) = cluster {
        figures.stages = super::stages::between(&stages_before, &super::stages::read(cluster).await);
    }
    for seq in 0..jobs as usize {
        let acked = tracker.acked[seq].load(Ordering::Relaxed);
        let completions = tracker.completions[seq].load(Ordering::Relaxed);
        if acked && completions == 0 {
            figures.lost += 1;
        }
        if completions > 1 {
            figures.completed_twice += 1;
        }
        figures.redelivered += tracker.deliveries[seq].load(Ordering::Relaxed).saturating_sub(1) as u64;
    }
    figures.jobs_created = tracker.acked_total.load(Ordering::Relaxed);
    figures.create_errors = tracker.create_errors.load(Ordering::Relaxed);
    figures.jobs_completed_unique = tracker.completed_unique.load(Ordering::Relaxed);
    figures.elapsed_s = elapsed.as_secs_f64();
    figures.jobs_per_s = figures.jobs_completed_unique as f64 / elapsed.as_secs_f64();
    figures.create_ack_per_s = figures.jobs_created as f64 / produced_in.as_secs_f64();
    figures.latency_ms = Some(Percentiles::of(&latency));
    figures.create_ack_latency_ms = Some(Percentiles::of(&ack_latency));
    if let Some(cluster) = cluster {
        figures.rss_start_mib = mib(&rss_start);
        figures.rss_peak_mib = mib(&rss_peak.lock().expect("lock"));
        figures.rss_end_mib = mib(&cluster.resident_bytes());
        figures.rss_peak_per_minute_mib = rss_minutes.lock().expect("lock").iter().map(|m| mib(m)).collect();
    }
    if cluster.is_some() {
        figures.wal_syncs = syncs_after.iter().zip(&syncs_before).map(|(a, b)| a.saturating_sub(*b)).collect();
        let busiest = figures.wal_syncs.iter().copied().max().unwrap_or(0);
        if busiest > 0 {
            figures.jobs_per_sync = Some(figures.jobs_completed_unique as f64 / busiest as f64);
        }
        if figures.jobs_completed_unique > 0 {
            let per_job = |(after, before): (&(&str, f64), &(&str, f64))| {
                let bytes = (after.1 - before.1).max(0.0) / figures.jobs_completed_unique as f64;
                (after.0.to_string(), bytes.round())
            };
            figures.written_per_job = written_after.iter().zip(&written_before).map(per_job).collect();
        }
        let jobs = figures.jobs_completed_unique;
        figures.cluster_requests_per_job = per_job_by_method(&cluster_requests_before, &cluster_requests_after, jobs);
        figures.client_requests_per_job = per_job_by_method(&client_requests_before, &client_requests_after, jobs);
        figures.client_messages_per_job = per_job_by_method(&client_messages_before, &client_messages_after, jobs);
    }
    Ok(figures)
}

/// Producer `p`'s share of `total` split over `producers`.
fn share(total: u64, producers: u64, p: u64) -> u64 {
    total / producers + u64::from(p < total % producers)
}

pub async fn throughput(
    args: &BenchArgs,
    gateways: &[String],
    cluster: Option<&LocalCluster>,
) -> anyhow::Result<Figures> {
    run(args, gateways, cluster, args.jobs, None, Some(args.producers)).await
}

pub async fn latency(args: &BenchArgs, gateways: &[String], cluster: Option<&LocalCluster>) -> anyhow::Result<Figures> {
    let jobs = args.rate * args.duration;
    run(args, gateways, cluster, jobs, Some(args.rate), args.latency_producers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn votes_or_hand_overs_between_nodes_are_a_change_of_leadership() {
        let with = |requests: &[(&str, f64)]| Figures {
            cluster_requests_per_job: requests.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
            ..Default::default()
        };
        assert!(!with(&[("AppendEntries", 1.5), ("Push", 0.5), ("Vote", 0.0)]).leadership_changed());
        assert!(with(&[("AppendEntries", 1.5), ("Vote", 0.0004)]).leadership_changed());
        assert!(with(&[("Campaign", 0.00015)]).leadership_changed());
    }
}
