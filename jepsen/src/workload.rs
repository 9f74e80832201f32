//! Clients that create jobs with unique ids through random gateways, and
//! workers (long polling and streaming) that complete, fail, ignore or
//! complete-too-late what they receive. Every operation is recorded.
//!
//! Jobs are of four types. [`JOB_TYPE`] is polled and streamed. [`PUSHED_TYPE`]
//! is only ever streamed: no worker polls it, so a job of that type reaches a
//! worker only if a broker pushes it. One such worker is homed on each
//! gateway and always reconnects to it, so a restarted gateway sees its
//! workers come back. [`STAGED_TYPE`] declares [`STAGES`]; its workers
//! checkpoint each stage and sometimes die between two. The fourth,
//! `jepsen-session`, is worked by real worker processes (see `sessions`).
//!
//! Streaming workers run with worker sessions (a new one per connection,
//! beating every 500 ms with no jobs listed, so unanswered jobs still time
//! out); pollers run without, so both paths are under faults.
//!
//! Every create carries an idempotency key made from its id, and a create
//! whose outcome is unknown is sent again with the same key, as a careful
//! producer would: the key must make it one job however often it is sent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::proto::gateway::{
    ActivatedJob, CheckpointJobRequest, CreateJobRequest, DeregisterWorkerRequest, FailJobRequest, HeartbeatRequest,
    RegisterWorkerRequest, RetryPolicy, StreamActivatedJobsRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::attacker::Leaks;
use crate::history::{Kind, Op, Phase};

/// Polled by the long-polling workers and streamed to the streaming ones.
pub const JOB_TYPE: &str = "jepsen";
/// Only streamed: it reaches a worker through a push or not at all.
pub const PUSHED_TYPE: &str = "jepsen-pushed";
/// Polled by the staged workers; declares [`STAGES`].
pub const STAGED_TYPE: &str = "jepsen-staged";
pub const STAGES: [&str; 3] = ["reserved", "charged", "notified"];
/// The types the workload's own workers ask for: every job of theirs
/// carries a workload id.
pub const WORKLOAD_TYPES: [&str; 3] = [JOB_TYPE, PUSHED_TYPE, STAGED_TYPE];
/// How often a producer sends a create whose outcome it does not know.
const CREATE_SENDS: usize = 3;
/// Short, so timeouts and redeliveries happen often.
pub const ACTIVATION_TIMEOUT_MS: i64 = 2_000;
/// A worker's failure asks for this back-off before the next attempt.
pub const FAIL_BACK_OFF_MS: i64 = 1_000;
/// Retries every job of the workload is created with (session jobs too).
/// Only its worker's failure asking for none (1 in [`FAILS_FOR_GOOD`]
/// failures, on purpose) may leave it without: a dead session's attempt uses
/// one (`worker-died`: a session worker the `workers` nemesis kills, a
/// streaming worker's session that missed its beats), and the nemesis may
/// kill each holder of one job in turn, but a run has far fewer of those
/// than this, so an incident that no failure asking for none explains is a
/// finding.
pub const RETRIES: i32 = 1_000;
/// The custom header a job's retry policy rides (drover.v1's `retry_policy`).
const POLICY_HEADER: &str = "drover.retry";

/// The retry policy the workload's drover.v1 creates carry: the back-off a
/// worker's own failure asks for, exactly, so a failure by the policy and a
/// worker's own are held to the same wait.
fn workload_policy() -> RetryPolicy {
    RetryPolicy {
        backoff: "constant".into(),
        initial_interval: Some(FAIL_BACK_OFF_MS),
        max_interval: Some(FAIL_BACK_OFF_MS),
        jitter: Some(false),
        ..Default::default()
    }
}

/// One failure in this many asks for no retries: the job becomes an
/// incident, as the workload meant.
const FAILS_FOR_GOOD: u32 = 10;
/// Jobs acknowledged and not yet completed, at most, before producers wait.
/// The workers misbehave on purpose (one in ten never answers, one in twenty
/// answers 2.5 s late, one in ten fails with a back-off), so they finish
/// fewer jobs a second than 16 producers create: left unbounded, the backlog
/// grows with the run's length until no drain can work it off, and the
/// checker reports every job still activatable at its end as lost (a 30-minute
/// run left 245,000 such jobs, all activatable on every replica). A producer
/// with backpressure waits too. Jobs worked by the session worker processes
/// are not counted: their completions are not seen here.
pub const MAX_BACKLOG: u64 = 6_000;
/// Of those, pushed jobs at most: their three workers take one job at a time,
/// so beyond this producers create the polled type in their place.
pub const MAX_PUSHED_BACKLOG: u64 = 2_000;

pub struct Recorder {
    started: Instant,
    /// The wall clock at `started` (ms since the epoch), to place logs of
    /// other processes on the history's time line.
    epoch_ms: u64,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn new() -> Self {
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Recorder { started: Instant::now(), epoch_ms, ops: Mutex::new(Vec::new()) }
    }

    pub fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(&self, process: u64, node: usize, kind: Kind, phase: Phase, id: u64, key: Option<u64>, attempt: u32) {
        self.record_op(Op { process, node, kind, phase, id, key, attempt, ..Op::default() });
    }

    /// Records `op`, stamped with the time now.
    pub fn record_op(&self, op: Op) {
        let op = Op { time_ms: self.now_ms(), ..op };
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

/// The nodes whose gateways clients use: every node, unless the
/// `membership` nemesis changes the cluster's members. Then it holds the
/// members the plan lists and not leaving, set by `cluster::Nodes` as the
/// nemesis adds, removes and replaces nodes (a node leaving or retired may
/// still run; clients prefer the members, as a load balancer would).
pub struct Live {
    ids: RwLock<Vec<usize>>,
}

impl Live {
    pub fn new(ids: Vec<usize>) -> Live {
        Live { ids: RwLock::new(ids) }
    }

    pub fn set(&self, mut ids: Vec<usize>) {
        ids.sort_unstable();
        ids.dedup();
        *self.ids.write().unwrap() = ids;
    }

    pub fn ids(&self) -> Vec<usize> {
        self.ids.read().unwrap().clone()
    }

    pub fn contains(&self, node: usize) -> bool {
        self.ids.read().unwrap().contains(&node)
    }

    /// A random one (one draw of `rng`, as a draw over `0..n` was when every
    /// node was a member).
    pub fn pick(&self, rng: &mut StdRng) -> usize {
        let ids = self.ids.read().unwrap();
        if ids.is_empty() {
            return 0;
        }
        ids[rng.random_range(0..ids.len())]
    }

    /// The one after `at`, in id order, wrapping round.
    pub fn after(&self, at: usize) -> usize {
        let ids = self.ids.read().unwrap();
        ids.iter().copied().find(|i| *i > at).or_else(|| ids.first().copied()).unwrap_or(0)
    }
}

pub struct Shared {
    pub recorder: Recorder,
    /// Every node slot's gateway, by node id (spare slots' too, with the
    /// `membership` nemesis): clients pick among [`Shared::live`].
    pub gateways: Vec<String>,
    pub live: Arc<Live>,
    pub next_id: AtomicU64,
    /// Producers stop when this is set.
    pub stop_creating: AtomicBool,
    /// Workers stop misbehaving (the drain) when this is set.
    pub draining: AtomicBool,
    /// Everything stops when this is set.
    pub stop: AtomicBool,
    /// Ids of jobs acknowledged and not yet completed, of the polled, pushed
    /// and staged types (see [`MAX_BACKLOG`]).
    pub backlog: [Mutex<HashSet<u64>>; 3],
    /// Sets of in-process workers: session jobs are rarer by this factor.
    pub worker_sets: u64,
    /// Keys and session ids the attacker learns (see `attacker`).
    pub leaks: crate::attacker::Leaks,
    /// Each node's OJS HTTP address (`ip:port`), and the CA to trust when
    /// the run serves TLS.
    pub ojs: Vec<String>,
    pub ca: Option<Vec<u8>>,
}

impl Shared {
    /// The gateways of the live nodes, in id order.
    pub fn live_gateways(&self) -> Vec<String> {
        self.live.ids().into_iter().filter_map(|i| self.gateways.get(i).cloned()).collect()
    }

    /// Until everything stops: polls up to `max` jobs of `job_type` (5 s
    /// activations) through gateway `home + 1` and the next ones in turn,
    /// records what each poll was handed (as `process`), and hands each
    /// batch, with the client that took it, to `work`.
    pub async fn poll_in_turn<F, Fut>(
        &self,
        (process, home): (u64, usize),
        job_type: &str,
        worker: &str,
        max: i32,
        mut work: F,
    ) where
        F: FnMut(Client, Vec<drover::proto::gateway::ActivatedJob>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut at = home;
        while !self.stop.load(Ordering::Relaxed) {
            at = self.live.after(at);
            let Ok(client) = Client::connect_lazy(&self.gateways[at]) else { continue };
            let activated =
                tokio::time::timeout(Duration::from_secs(5), client.activate(job_type, worker, max, 5_000, 1_000))
                    .await;
            let Ok(Ok(jobs)) = activated else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            record_handed(self, (process, at), (job_type, worker), &jobs);
            work(client, jobs).await;
        }
    }

    fn backlog_of(&self, job_type: &str) -> Option<&Mutex<HashSet<u64>>> {
        match job_type {
            JOB_TYPE => Some(&self.backlog[0]),
            PUSHED_TYPE => Some(&self.backlog[1]),
            STAGED_TYPE => Some(&self.backlog[2]),
            _ => None,
        }
    }

    fn backlog_total(&self) -> u64 {
        self.backlog.iter().map(|b| b.lock().unwrap().len() as u64).sum()
    }

    fn acknowledged(&self, job_type: &str, id: u64) {
        if let Some(backlog) = self.backlog_of(job_type) {
            backlog.lock().unwrap().insert(id);
        }
    }

    /// A completion of job `id` was answered OK, or not answered (it may
    /// have taken effect, and then nothing would ever take the id out).
    fn completed(&self, job_type: &str, id: u64) {
        if let Some(backlog) = self.backlog_of(job_type) {
            backlog.lock().unwrap().remove(&id);
        }
    }
}

fn id_of(job: &ActivatedJob) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_str(&job.variables).ok()?;
    id_in(&value)
}

pub async fn producer(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clients: Vec<Client> = shared.gateways.iter().map(|g| Client::connect_lazy(g).unwrap()).collect();
    while !shared.stop_creating.load(Ordering::Relaxed) {
        if shared.backlog_total() >= MAX_BACKLOG {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let job_type = match rng.random_range(0..20) {
            0..8 => JOB_TYPE,
            8..15 if shared.backlog[1].lock().unwrap().len() as u64 >= MAX_PUSHED_BACKLOG => JOB_TYPE,
            8..15 => PUSHED_TYPE,
            15..18 => STAGED_TYPE,
            // The session worker processes do not grow with the worker sets.
            _ if shared.worker_sets > 1 && !rng.random_ratio(1, shared.worker_sets as u32) => JOB_TYPE,
            _ => crate::sessions::SESSION_TYPE,
        };
        // The id is the create's marker: the final reads find its jobs by it.
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        // One in eight of the polled type waits 0.5-3 s before it is due.
        let delay = (job_type == JOB_TYPE && rng.random_ratio(1, 8)).then(|| rng.random_range(500..3_000));
        // One in sixteen of the others expires 1-4 s after it is sent (see `expiry`).
        let expires_at = (job_type == JOB_TYPE && delay.is_none() && rng.random_ratio(1, 16))
            .then(|| drover::auth::now_ms() as i64 + rng.random_range(1_000..4_000));
        let request = CreateJobRequest {
            r#type: job_type.into(),
            variables: format!(r#"{{"id":{id}}}"#),
            delay: delay.unwrap_or(0),
            idempotency_key: format!("jepsen-{id}"),
            stages: if job_type == STAGED_TYPE { STAGES.map(String::from).to_vec() } else { Vec::new() },
            retries: Some(RETRIES),
            expires_at: expires_at.unwrap_or(0),
            retry_policy: Some(workload_policy()),
            ..Default::default()
        };
        // One in four of the polled type's other undelayed creates goes through OJS.
        if job_type == JOB_TYPE
            && delay.is_none()
            && expires_at.is_none()
            && !shared.ojs.is_empty()
            && rng.random_ratio(1, 4)
        {
            ojs_create(&shared, process, id, &mut rng).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
            continue;
        }
        for _ in 0..CREATE_SENDS {
            // Each send through any gateway, as a producer behind a load balancer.
            let node = shared.live.pick(&mut rng);
            shared.recorder.record_op(Op {
                process,
                node,
                kind: Kind::Create,
                phase: Phase::Invoke,
                id,
                job_type: Some(job_type.into()),
                wait_ms: delay.map(|d| d as u64),
                expires_at,
                ..Op::default()
            });
            let create = clients[node].create(request.clone());
            match tokio::time::timeout(Duration::from_secs(5), create).await {
                Ok(Ok(key)) => {
                    shared.recorder.record(process, node, Kind::Create, Phase::Ok, id, Some(key), 0);
                    shared.leaks.key(key);
                    // A job that may expire unrun would never leave the backlog.
                    if expires_at.is_none() {
                        shared.acknowledged(job_type, id);
                    }
                    break;
                }
                Ok(Err(status)) if certain_failure(&status) => {
                    shared.recorder.record(process, node, Kind::Create, Phase::Fail, id, None, 0);
                    break;
                }
                _ => {
                    // Unknown: send it again with the same key.
                    shared.recorder.record(process, node, Kind::Create, Phase::Info, id, None, 0);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
    }
}

/// The name a create through OJS carries in the history.
pub const OJS_PRODUCER: &str = "ojs-producer";

/// A create of [`JOB_TYPE`] through a node's OJS port, its args `[{"id": id}]`.
/// Its OJS id is made from the workload id, so a resend after an unknown
/// outcome is answered `duplicate` (409), and the job is then read back by
/// that id for its key. Its retry policy gives it the retries of every other
/// create ([`RETRIES`]): OJS's default of 3 attempts, with the deliberate
/// failures and a dead session, would use them up and make an incident that
/// no failure asked for.
async fn ojs_create(shared: &Shared, process: u64, id: u64, rng: &mut StdRng) {
    let token = std::env::var(drover::client::TOKEN_ENV).ok();
    let (ca, token) = (shared.ca.as_deref(), token.as_deref().map(str::trim));
    let ojs_id = format!("01900000-0000-7000-8000-{id:012x}");
    let body = serde_json::json!({
        "type": "jepsen.ojs", "id": ojs_id, "args": [{ "id": id }],
        "options": { "queue": JOB_TYPE, "retry": { "max_attempts": RETRIES } },
    })
    .to_string();
    let key_in = |body: &str| -> Option<u64> {
        serde_json::from_str::<serde_json::Value>(body).ok()?["job"]["drover"]["key"].as_str()?.parse().ok()
    };
    for _ in 0..CREATE_SENDS {
        let node = shared.live.pick(rng);
        // The sender is named, so the history shows which creates went through OJS.
        let invoke = Op { process, node, kind: Kind::Create, phase: Phase::Invoke, id, ..Op::default() };
        shared.recorder.record_op(Op { job_type: Some(JOB_TYPE.into()), worker: Some(OJS_PRODUCER.into()), ..invoke });
        let addr = &shared.ojs[node];
        let sent = crate::cluster::http_as(addr, "POST", "/ojs/v1/jobs", &body, ca, token);
        let key = match tokio::time::timeout(Duration::from_secs(5), sent).await {
            Ok(Ok((201, answer))) => key_in(&answer),
            // An earlier send made it: read it back by its id.
            Ok(Ok((409, _))) => {
                let path = format!("/ojs/v1/jobs/{ojs_id}");
                let read = crate::cluster::http_as(addr, "GET", &path, "", ca, token);
                match tokio::time::timeout(Duration::from_secs(5), read).await {
                    Ok(Ok((200, answer))) => key_in(&answer),
                    _ => None,
                }
            }
            // Refused before anything was made.
            Ok(Ok((400..=499, _))) => {
                shared.recorder.record(process, node, Kind::Create, Phase::Fail, id, None, 0);
                return;
            }
            _ => None,
        };
        match key {
            Some(key) => {
                shared.recorder.record(process, node, Kind::Create, Phase::Ok, id, Some(key), 0);
                shared.leaks.key(key);
                shared.acknowledged(JOB_TYPE, id);
                return;
            }
            None => {
                // Unknown: send it again with the same id.
                shared.recorder.record(process, node, Kind::Create, Phase::Info, id, None, 0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The workload id a job's variables carry: `{"id": N}`, or as OJS's args
/// `{"args": [{"id": N}]}` for a job created through OJS.
pub fn id_in(variables: &serde_json::Value) -> Option<u64> {
    variables["id"].as_u64().or_else(|| variables["args"][0]["id"].as_u64())
}

/// What a worker asked for: the checker compares it with what it was handed.
struct Wanted<'a> {
    job_type: &'a str,
    worker: &'a str,
    /// When the poll that returned the job was sent, or the stream that
    /// was pushed it asked for.
    requested_ms: Option<u64>,
}

/// The record of an activation handed to a worker that asked for `wanted`.
fn activated(process: u64, node: usize, wanted: &Wanted<'_>, job: &ActivatedJob, id: u64) -> Op {
    Op {
        requested_ms: wanted.requested_ms,
        process,
        node,
        kind: Kind::Activate,
        phase: Phase::Ok,
        id,
        key: Some(job.key),
        attempt: job.attempt,
        job_type: Some(wanted.job_type.into()),
        worker: Some(wanted.worker.into()),
        assigned_worker: Some(job.worker.clone()),
        stage: (!job.stage.is_empty()).then(|| job.stage.clone()),
        handed_type: Some(job.r#type.clone()),
        tenant: Some(job.tenant_id.clone()),
        ..Op::default()
    }
}

/// Records every job of one poll by a worker that does not otherwise
/// record its work (the workflow and limited queues' workers): what it was
/// handed, so the checker holds it to what the worker asked for. Their
/// jobs carry no workload id (id 0).
pub fn record_handed(shared: &Shared, (process, node): (u64, usize), wanted: (&str, &str), jobs: &[ActivatedJob]) {
    let (job_type, worker) = wanted;
    let wanted = Wanted { job_type, worker, requested_ms: None };
    for job in jobs {
        shared.recorder.record_op(activated(process, node, &wanted, job, id_of(job).unwrap_or(0)));
    }
}

/// Handles one activated job the way a (sometimes unreliable) worker would.
async fn handle(
    shared: &Shared,
    client: &Client,
    (process, node): (u64, usize),
    wanted: &Wanted<'_>,
    job: ActivatedJob,
    rng: &mut StdRng,
) {
    // Every job of the workload carries an id: one without is another's
    // (a schedule's, a workflow's, the limited queue's, another tenant's),
    // handed to a worker that did not ask for it. Recorded (the checker
    // judges it) and left to time out.
    let Some(id) = id_of(&job) else {
        shared.recorder.record_op(activated(process, node, wanted, &job, 0));
        return;
    };
    shared.recorder.record_op(activated(process, node, wanted, &job, id));
    let roll: u32 = if shared.draining.load(Ordering::Relaxed) { 0 } else { rng.random_range(0..100) };
    if roll >= 90 {
        return; // never answers: the activation times out
    }
    if (80..90).contains(&roll) {
        // Now and then for good: no retries left, an incident on purpose.
        let for_good = rng.random_ratio(1, FAILS_FOR_GOOD);
        // Half of the failures of a job that carries the workload's policy
        // let it decide (the partition, at apply): the same retries and
        // back-off as the worker's own, so the checker holds both alike.
        let by_policy = job.custom_headers.contains_key(POLICY_HEADER) && rng.random_ratio(1, 2);
        let retries = match (for_good, by_policy) {
            (true, _) => 0,
            (false, true) => job.retries - 1,
            (false, false) => (job.retries - 1).max(1),
        };
        let op = Op {
            process,
            node,
            kind: Kind::Fail,
            phase: Phase::Invoke,
            id,
            key: Some(job.key),
            attempt: job.attempt,
            wait_ms: Some(FAIL_BACK_OFF_MS as u64),
            retries: Some(retries),
            ..Op::default()
        };
        shared.recorder.record_op(op.clone());
        let result = if by_policy {
            let request = FailJobRequest {
                key: job.key,
                attempt: job.attempt,
                error_message: "jepsen says no".into(),
                by_policy: true,
                retries: -1,
                error_type: "Jepsen".into(),
                not_retryable: for_good,
                ..Default::default()
            };
            client.raw().fail_job(request).await.map(drop)
        } else {
            client.fail(job.key, job.attempt, retries, "jepsen says no", FAIL_BACK_OFF_MS).await
        };
        let phase = match result {
            Ok(()) => Phase::Ok,
            Err(status) if certain_failure(&status) => Phase::Fail,
            Err(_) => Phase::Info,
        };
        if retries == 0 && phase != Phase::Fail {
            // It is over (or may be): nothing will complete it.
            shared.completed(wanted.job_type, id);
        }
        shared.recorder.record_op(Op { phase, wait_ms: None, ..op });
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
    if phase != Phase::Fail {
        shared.completed(wanted.job_type, id);
    }
    shared.recorder.record(process, node, Kind::Complete, phase, id, Some(job.key), job.attempt);
}

/// One long poll for up to `max` jobs through a random gateway: the
/// gateway's index and its jobs, or `None` after a pause when it failed.
async fn poll(
    (clients, live): (&[Client], &Live),
    job_type: &str,
    worker: &str,
    max: i32,
    rng: &mut StdRng,
) -> Option<(usize, Vec<ActivatedJob>)> {
    let node = live.pick(rng);
    let activate = clients[node].activate(job_type, worker, max, ACTIVATION_TIMEOUT_MS, 500);
    match tokio::time::timeout(Duration::from_secs(5), activate).await {
        Ok(Ok(jobs)) => Some((node, jobs)),
        _ => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}

pub async fn poller(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clients: Vec<Client> = shared.gateways.iter().map(|g| Client::connect_lazy(g).unwrap()).collect();
    let worker = format!("poller-{process}");
    while !shared.stop.load(Ordering::Relaxed) {
        let requested = shared.recorder.now_ms();
        let Some((node, jobs)) = poll((&clients, &shared.live), JOB_TYPE, &worker, 8, &mut rng).await else { continue };
        let wanted = Wanted { job_type: JOB_TYPE, worker: &worker, requested_ms: Some(requested) };
        for job in jobs {
            handle(&shared, &clients[node], (process, node), &wanted, job, &mut rng).await;
        }
    }
}

/// A worker of [`JOB_TYPE`] that speaks the Open Job Spec's HTTP binding:
/// fetches through any node's OJS port, and acknowledges naming the attempt
/// it was handed, sometimes after its activation timed out (the ack must
/// then be refused), sometimes never.
pub async fn ojs_poller(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let worker = format!("ojs-{process}");
    let token = std::env::var(drover::client::TOKEN_ENV).ok();
    let (ca, token) = (shared.ca.as_deref(), token.as_deref().map(str::trim));
    let fetch = serde_json::json!({
        "queues": [JOB_TYPE], "count": 8, "worker_id": worker, "visibility_timeout_ms": ACTIVATION_TIMEOUT_MS,
    })
    .to_string();
    while !shared.stop.load(Ordering::Relaxed) {
        let node = shared.live.pick(&mut rng);
        let requested = shared.recorder.now_ms();
        let sent = crate::cluster::http_as(&shared.ojs[node], "POST", "/ojs/v1/workers/fetch", &fetch, ca, token);
        let jobs = match tokio::time::timeout(Duration::from_secs(5), sent).await {
            Ok(Ok((200, body))) => serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["jobs"].as_array().cloned())
                .unwrap_or_default(),
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for job in jobs {
            let (Some(key), Some(attempt)) = (
                job["drover"]["key"].as_str().and_then(|k| k.parse::<u64>().ok()),
                job["attempt"].as_u64().map(|a| a as u32),
            ) else {
                continue;
            };
            // The envelope does not say whose activation it is: the checker
            // takes that from the replicas' record of the attempt (not this
            // worker's own name, which would always match).
            let handed = Op {
                requested_ms: Some(requested),
                process,
                node,
                kind: Kind::Activate,
                phase: Phase::Ok,
                id: job["args"][0]["id"].as_u64().unwrap_or(0),
                key: Some(key),
                attempt,
                job_type: Some(JOB_TYPE.into()),
                worker: Some(worker.clone()),
                handed_type: job["queue"].as_str().map(str::to_string),
                ..Op::default()
            };
            let id = handed.id;
            shared.recorder.record_op(handed);
            if id == 0 {
                continue; // not the workload's: left to time out
            }
            let roll: u32 = if shared.draining.load(Ordering::Relaxed) { 0 } else { rng.random_range(0..100) };
            if roll >= 90 {
                continue; // never answers: the activation times out
            }
            if (80..90).contains(&roll) {
                tokio::time::sleep(Duration::from_millis(ACTIVATION_TIMEOUT_MS as u64 + 500)).await;
            }
            shared.recorder.record(process, node, Kind::Complete, Phase::Invoke, id, Some(key), attempt);
            let ack = serde_json::json!({ "job_id": job["id"], "attempt": attempt, "worker_id": worker }).to_string();
            let sent = crate::cluster::http_as(&shared.ojs[node], "POST", "/ojs/v1/workers/ack", &ack, ca, token);
            let phase = match tokio::time::timeout(Duration::from_secs(5), sent).await {
                Ok(Ok((200, _))) => Phase::Ok,
                // Refused before anything was done: not active, another
                // activation, or no such job.
                Ok(Ok((400..=499, _))) => Phase::Fail,
                _ => Phase::Info,
            };
            if phase != Phase::Fail {
                shared.completed(JOB_TYPE, id);
            }
            shared.recorder.record(process, node, Kind::Complete, phase, id, Some(key), attempt);
        }
    }
}

/// A worker of [`STAGED_TYPE`]: commits each stage after the one the job
/// resumes at, sometimes dies between two (its activation times out and the
/// next attempt resumes), then completes.
pub async fn staged(shared: Arc<Shared>, process: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clients: Vec<Client> = shared.gateways.iter().map(|g| Client::connect_lazy(g).unwrap()).collect();
    let worker = format!("staged-{process}");
    while !shared.stop.load(Ordering::Relaxed) {
        let requested = shared.recorder.now_ms();
        let Some((node, jobs)) = poll((&clients, &shared.live), STAGED_TYPE, &worker, 4, &mut rng).await else {
            continue;
        };
        for job in jobs {
            let wanted = Wanted { job_type: STAGED_TYPE, worker: &worker, requested_ms: Some(requested) };
            let Some(id) = id_of(&job) else {
                // Not the workload's: recorded for the checker, left to time out.
                shared.recorder.record_op(activated(process, node, &wanted, &job, 0));
                continue;
            };
            shared.recorder.record_op(activated(process, node, &wanted, &job, id));
            let resume = STAGES.iter().position(|s| *s == job.stage).map_or(0, |i| i + 1);
            let mut alive = true;
            for stage in &STAGES[resume..] {
                let draining = shared.draining.load(Ordering::Relaxed);
                if !draining && rng.random_range(0..100) < 15 {
                    // Dies before this stage: the next attempt resumes here.
                    alive = false;
                    break;
                }
                let op = Op {
                    process,
                    node,
                    kind: Kind::Checkpoint,
                    id,
                    key: Some(job.key),
                    attempt: job.attempt,
                    stage: Some(stage.to_string()),
                    ..Op::default()
                };
                shared.recorder.record_op(Op { phase: Phase::Invoke, ..op.clone() });
                let request = CheckpointJobRequest {
                    key: job.key,
                    attempt: job.attempt,
                    stage: stage.to_string(),
                    variables: format!(r#"{{"{stage}":{}}}"#, job.attempt),
                };
                let mut raw = clients[node].raw();
                let sent = tokio::time::timeout(Duration::from_secs(5), raw.checkpoint_job(request));
                let phase = match sent.await {
                    Ok(Ok(_)) => Phase::Ok,
                    Ok(Err(status)) if certain_failure(&status) => Phase::Fail,
                    _ => Phase::Info,
                };
                shared.recorder.record_op(Op { phase, ..op });
                if phase != Phase::Ok {
                    // Superseded, or unknown: this attempt stops here.
                    alive = false;
                    break;
                }
            }
            if !alive {
                continue;
            }
            shared.recorder.record(process, node, Kind::Complete, Phase::Invoke, id, Some(job.key), job.attempt);
            let complete = clients[node].complete(job.key, job.attempt, "{}");
            let phase = match tokio::time::timeout(Duration::from_secs(5), complete).await {
                Ok(Ok(())) => Phase::Ok,
                Ok(Err(status)) if certain_failure(&status) => Phase::Fail,
                _ => Phase::Info,
            };
            if phase != Phase::Fail {
                shared.completed(STAGED_TYPE, id);
            }
            shared.recorder.record(process, node, Kind::Complete, phase, id, Some(job.key), job.attempt);
        }
    }
}

/// Where a streaming worker opens its streams.
#[derive(Clone, Copy, Debug)]
pub enum Gateways {
    /// A random gateway on every (re)connection.
    Any,
    /// Always this one: after it restarts, the worker comes back to it.
    Home(usize),
}

/// Reconnection back-off: doubles from `FIRST` up to `LONGEST` while opening
/// fails, and starts over once a stream is open.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const LONGEST: Duration = Duration::from_secs(2);

    fn new() -> Backoff {
        Backoff { next: Backoff::FIRST }
    }

    fn wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Backoff::LONGEST);
        wait
    }

    fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }
}

/// A streaming worker's session: registered at each connection, beating
/// every [`SESSION_BEAT_MS`] until dropped (then deregistered, best effort)
/// or until the server no longer knows it.
struct Session {
    id: u64,
    beats: tokio::task::JoinHandle<()>,
    lost: Arc<AtomicBool>,
    client: Client,
}

const SESSION_BEAT_MS: i64 = 500;

impl Session {
    async fn start(client: &Client, worker: &str, job_type: &str, leaks: &Leaks) -> Option<Session> {
        let register = RegisterWorkerRequest {
            worker_id: worker.into(),
            job_types: vec![job_type.into()],
            heartbeat_interval: SESSION_BEAT_MS,
            dead_after: 3_000,
            ..Default::default()
        };
        let mut raw = client.raw();
        let registered = tokio::time::timeout(Duration::from_secs(3), raw.register_worker(register));
        let id = registered.await.ok()?.ok()?.into_inner().session_id;
        leaks.session(id);
        let lost = Arc::new(AtomicBool::new(false));
        let beats = tokio::spawn({
            let (client, lost) = (client.clone(), Arc::clone(&lost));
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(SESSION_BEAT_MS as u64)).await;
                    let beat = HeartbeatRequest { session_id: id, ..Default::default() };
                    let answer = tokio::time::timeout(Duration::from_secs(2), client.raw().heartbeat(beat)).await;
                    if matches!(answer, Ok(Err(status)) if status.code() == Code::NotFound) {
                        lost.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }
        });
        Some(Session { id, beats, lost, client: client.clone() })
    }

    fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.beats.abort();
        let (client, id) = (self.client.clone(), self.id);
        tokio::spawn(async move {
            let mut raw = client.raw();
            let end = raw.deregister_worker(DeregisterWorkerRequest { session_id: id });
            let _ = tokio::time::timeout(Duration::from_secs(2), end).await;
        });
    }
}

/// A worker that receives jobs of `job_type` only through
/// `StreamActivatedJobs` pushes. Every (re)connection opens a stream under
/// one of two worker names, so a gateway aggregates several kinds of stream
/// and numbers them in the order workers come back after a restart.
pub async fn streamer(shared: Arc<Shared>, process: u64, seed: u64, job_type: &'static str, gateways: Gateways) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut backoff = Backoff::new();
    let prefix = if job_type == PUSHED_TYPE { "pushed" } else { "streamer" };
    while !shared.stop.load(Ordering::Relaxed) {
        let node = match gateways {
            Gateways::Any => shared.live.pick(&mut rng),
            // A spare slot not started yet, or a node that left: wait until
            // (if ever) its gateway serves the cluster.
            Gateways::Home(node) if !shared.live.contains(node) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Gateways::Home(node) => node,
        };
        let client = Client::connect_lazy(&shared.gateways[node]).unwrap();
        let worker = format!("{prefix}-{}", if rng.random_bool(0.5) { "a" } else { "b" });
        // Whatever the stream is pushed was activated after its session was
        // registered: the earliest its lease (and the session's) can have
        // begun.
        let asked = shared.recorder.now_ms();
        // Every connection is a worker session; its beats list no jobs, so
        // a job the worker never answers still times out.
        let Some(session) = Session::start(&client, &worker, job_type, &shared.leaks).await else {
            tokio::time::sleep(backoff.wait()).await;
            continue;
        };
        let request = StreamActivatedJobsRequest {
            r#type: job_type.into(),
            worker: worker.clone(),
            timeout: ACTIVATION_TIMEOUT_MS,
            // It works one job at a time: more would wait past their timeout.
            max_jobs_in_flight: 2,
            session_id: session.id,
            ..Default::default()
        };
        let opened = tokio::time::timeout(Duration::from_secs(3), client.raw().stream_activated_jobs(request)).await;
        let Ok(Ok(response)) = opened else {
            // The gateway is down, restarting or unreachable: try again later.
            tokio::time::sleep(backoff.wait()).await;
            continue;
        };
        backoff.reset();
        let wanted = Wanted { job_type, worker: &worker, requested_ms: Some(asked) };
        let mut stream = response.into_inner();
        while !shared.stop.load(Ordering::Relaxed) && !session.lost() {
            match tokio::time::timeout(Duration::from_secs(3), stream.message()).await {
                Ok(Ok(Some(job))) => handle(&shared, &client, (process, node), &wanted, job, &mut rng).await,
                // The gateway ended the stream (it is stopping) or the
                // connection broke (it died): reconnect after a pause.
                Ok(_) => {
                    tokio::time::sleep(backoff.wait()).await;
                    break;
                }
                Err(_) => {
                    // Idle: reconnect now and then, possibly to another gateway.
                    if rng.random_bool(0.3) {
                        break;
                    }
                }
            }
        }
        // The session ends here (it is deregistered as it drops): what it
        // still holds goes back at once, no lease left to wait out.
        let release = Op { process, node, kind: Kind::Release, phase: Phase::Ok, ..Op::default() };
        shared.recorder.record_op(release);
        drop(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_gateways_are_drawn_as_a_range_was_when_every_node_is_live() {
        // Runs without the membership nemesis keep their seeds' choices.
        let live = Live::new(vec![0, 1, 2]);
        let (mut a, mut b) = (StdRng::seed_from_u64(7), StdRng::seed_from_u64(7));
        for _ in 0..50 {
            assert_eq!(live.pick(&mut a), b.random_range(0..3));
        }
        assert_eq!([live.after(0), live.after(1), live.after(2)], [1, 2, 0]);
    }

    #[test]
    fn live_gateways_follow_the_members() {
        let live = Live::new(vec![0, 1, 2]);
        live.set(vec![5, 2, 3, 2]);
        assert_eq!(live.ids(), [2, 3, 5]);
        assert!(live.contains(5) && !live.contains(0));
        let mut rng = StdRng::seed_from_u64(1);
        assert!((0..50).all(|_| [2, 3, 5].contains(&live.pick(&mut rng))));
        // In turn from a node that left, or from a spare slot's index.
        assert_eq!([live.after(0), live.after(3), live.after(5), live.after(8)], [2, 5, 2, 2]);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_bound_and_starts_over() {
        let mut backoff = Backoff::new();
        let waits: Vec<u128> = (0..7).map(|_| backoff.wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.wait(), Duration::from_millis(100));
    }
}
