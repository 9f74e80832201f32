//! A second tenant that attacks the first, and the `cross-tenant effect`
//! checker.
//!
//! With tokens on, the workload's principal (`jepsen`, the default tenant) is
//! joined by [`NAME`], who holds every job scope and `workers:manage` in its
//! own tenant only: the strongest principal a tenant is given. Besides
//! creating and working jobs of its own, of the workload's own type, it keeps
//! trying to act on the first tenant's jobs and sessions through every
//! surface: drover.v1, Zeebe's API, the console's forms, the actuator and
//! the OJS port (fetches, queue pauses, bulk cancels and event reads in the
//! first tenant, which an OJS request names by leaving out its tenant). The
//! keys it aims at are leaked to it (recent keys the workload was given, and
//! session ids the workload's workers registered: the worst case, a tenant
//! that learned them) or guessed from its own (keys are sequential in a
//! partition). Everything it writes carries its mark ([`NAME`]) in variables,
//! results, failure messages and worker names.
//!
//! Every attempt is recorded with its answer. [`check`] then counts, from the
//! answers and from the histories the replicas hold after the run:
//!
//! - **cross-tenant effect**: a change to a job or session by a principal
//!   who may not touch it: a write on a leaked key or session answered OK; a
//!   first-tenant job whose history names the attacker (it created,
//!   activated, failed, cancelled, re-retried or overrode the fence of it),
//!   or whose variables or result carry its mark; an attacker's job whose
//!   history names anyone else;
//! - **cross-tenant read**: another tenant's job or session shown to the
//!   attacker (a read of a leaked key answered OK, a listing or activation
//!   holding one).
//!
//! Sessions keep no history, so a change to a session is seen in the answer
//! only (a heartbeat, deregistration or direction of a leaked session answered
//! OK), and in what follows from it: a session's jobs reactivated early show
//! in the timing checks, a quieted session's jobs in the drain.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::client::{Bearer, Client};
use drover::proto::gateway as v1;
use drover::proto::zeebe as zb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::history::FinalReads;
use crate::workload::{Shared, JOB_TYPE};

/// The attacker's token name and tenant, the prefix of its worker names, and
/// the mark on everything it writes.
pub const NAME: &str = "mallory";
/// Every job scope and worker management, in its own tenant.
pub const SCOPES: &str = "jobs:*,workers:manage,cluster:read";
/// Attacking tasks: each sends one call at a time.
pub const TASKS: u64 = 2;

/// Whether an actor named in a job's history is the attacker: its principal,
/// one of its workers, or one of its failure messages.
pub fn is_attacker(actor: &str) -> bool {
    actor.starts_with(NAME)
}

/// Keys and session ids of the first tenant, leaked to the attacker.
#[derive(Default)]
pub struct Leaks {
    keys: Mutex<VecDeque<u64>>,
    sessions: Mutex<VecDeque<u64>>,
}

const LEAKED_KEYS: usize = 512;
const LEAKED_SESSIONS: usize = 64;

impl Leaks {
    /// A key the workload was given for one of its creates.
    pub fn key(&self, key: u64) {
        push_bounded(&self.keys, key, LEAKED_KEYS);
    }

    /// A session one of the workload's workers registered.
    pub fn session(&self, id: u64) {
        push_bounded(&self.sessions, id, LEAKED_SESSIONS);
    }

    fn some_key(&self, rng: &mut StdRng) -> Option<u64> {
        pick(&self.keys, rng)
    }

    fn some_session(&self, rng: &mut StdRng) -> Option<u64> {
        pick(&self.sessions, rng)
    }
}

fn push_bounded(queue: &Mutex<VecDeque<u64>>, value: u64, bound: usize) {
    let mut queue = queue.lock().unwrap();
    queue.push_back(value);
    if queue.len() > bound {
        queue.pop_front();
    }
}

fn pick(queue: &Mutex<VecDeque<u64>>, rng: &mut StdRng) -> Option<u64> {
    let queue = queue.lock().unwrap();
    (!queue.is_empty()).then(|| queue[rng.random_range(0..queue.len())])
}

/// One attack and its answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub time_ms: u64,
    /// `drover.v1`, `zeebe`, `console`, `actuator` or `ojs`.
    pub surface: String,
    pub action: String,
    /// What it aimed at: `job <key>`, `session <id>`, `every session`, or a
    /// listing.
    pub target: String,
    /// The target is the first tenant's (leaked): any answer but a refusal
    /// is a finding. A guessed key may be the attacker's own.
    pub foreign: bool,
    /// The call changes what it aims at (else it only reads).
    pub writes: bool,
    /// `ok`, a gRPC code or HTTP status, or [`NO_ANSWER`].
    pub answer: String,
    /// Another tenant's jobs or sessions the answer held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed: Vec<String>,
}

/// No answer in time, or the node down: it may or may not have happened
/// (the replicas say).
pub const NO_ANSWER: &str = "no answer";

impl Attempt {
    fn refused(&self) -> bool {
        self.answer != "ok" && self.answer != NO_ANSWER
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CrossTenant {
    /// Whether an attacker ran (it needs tokens on).
    pub attacked: bool,
    pub attempts: usize,
    /// Attempts answered with an error (the expected answer to most).
    pub refused: usize,
    pub effects: Vec<String>,
    pub reads: Vec<String>,
}

impl CrossTenant {
    pub fn summary(&self) -> String {
        if !self.attacked {
            return "no attacker (tokens off)".into();
        }
        format!(
            "cross-tenant effects {}, cross-tenant reads {} (of {} attacks, {} refused)",
            self.effects.len(),
            self.reads.len(),
            self.attempts,
            self.refused
        )
    }
}

/// Counts cross-tenant effects and reads in the attacker's `attempts`, the
/// first tenant's jobs as each replica holds them (`victim`), and the
/// attacker's own jobs as each replica holds them (`own`).
pub fn check(attempts: &[Attempt], victim: &FinalReads, own: &FinalReads) -> CrossTenant {
    let mut report = CrossTenant {
        attacked: true,
        attempts: attempts.len(),
        refused: attempts.iter().filter(|a| a.refused()).count(),
        ..CrossTenant::default()
    };
    // Every key the attacker's own jobs have, on any replica.
    let its_own: std::collections::BTreeSet<u64> = own.values().flat_map(|jobs| jobs.keys().copied()).collect();
    for a in attempts {
        let what = format!("{} {} on {} answered {}", a.surface, a.action, a.target, a.answer);
        // A guessed key answered OK must be one of its own jobs: a key no
        // job has is NOT_FOUND, and any other job is another tenant's.
        let guessed_other = !a.foreign
            && a.target.strip_prefix("job ").and_then(|k| k.parse::<u64>().ok()).is_some_and(|k| !its_own.contains(&k));
        if (a.foreign || guessed_other) && a.answer == "ok" {
            let what = if guessed_other { format!("{what}, a guessed key not its own") } else { what.clone() };
            if a.writes {
                report.effects.push(what);
            } else {
                report.reads.push(what);
            }
        }
        for exposed in &a.exposed {
            report.reads.push(format!("{what}, showing {exposed}"));
        }
    }
    for (node, jobs) in victim {
        for (key, job) in jobs {
            for actor in job.actors.iter().filter(|a| is_attacker(a)) {
                report
                    .effects
                    .push(format!("node {node}: job {key} of tenant {:?} was acted on by {actor:?}", job.tenant));
            }
            if job.forged {
                report.effects.push(format!("node {node}: job {key} of tenant {:?} carries {NAME}'s mark", job.tenant));
            }
        }
    }
    for (node, jobs) in own {
        for (key, job) in jobs {
            if job.tenant != NAME {
                report.reads.push(format!(
                    "node {node}: {NAME}'s read of /actuator/jobs showed job {key} of tenant {:?}",
                    job.tenant
                ));
                continue;
            }
            for actor in job.actors.iter().filter(|a| !is_attacker(a)) {
                report.effects.push(format!("node {node}: {NAME}'s job {key} was acted on by {actor:?}"));
            }
        }
    }
    report
}

/// The attacker's connections and its record.
pub struct Attacker {
    pub token: String,
    v1: Vec<Client>,
    zeebe: Vec<ZeebeClient>,
    /// Every node's admin address (`host:port`).
    admins: Vec<String>,
    ca: Option<Vec<u8>>,
    attempts: Mutex<Vec<Attempt>>,
    /// Keys of its own jobs: what it guesses from.
    own: Mutex<VecDeque<u64>>,
}

type ZeebeClient = zb::gateway_client::GatewayClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// How long the attacker waits for an answer.
const ANSWER: Duration = Duration::from_secs(3);

impl Attacker {
    pub fn new(token: &str, gateways: &[String], admins: Vec<String>, ca: Option<Vec<u8>>) -> anyhow::Result<Attacker> {
        let mut v1 = Vec::new();
        let mut zeebe = Vec::new();
        for gateway in gateways {
            v1.push(Client::connect_lazy(gateway)?.with_token(token)?);
            let channel = drover::client::endpoint(gateway)?.connect_timeout(ANSWER).connect_lazy();
            zeebe.push(zb::gateway_client::GatewayClient::with_interceptor(channel, Bearer::new(Some(token))?));
        }
        Ok(Attacker {
            token: token.to_string(),
            v1,
            zeebe,
            admins,
            ca,
            attempts: Mutex::new(Vec::new()),
            own: Mutex::new(VecDeque::new()),
        })
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap().clone()
    }

    fn record(&self, shared: &Shared, attempt: Attempt) {
        let attempt = Attempt { time_ms: shared.recorder.now_ms(), ..attempt };
        self.attempts.lock().unwrap().push(attempt);
    }

    /// A key to aim at: leaked (foreign) or guessed near one of its own.
    fn target(&self, shared: &Shared, rng: &mut StdRng) -> Option<(u64, bool)> {
        if rng.random_bool(0.75) {
            if let Some(key) = shared.leaks.some_key(rng) {
                return Some((key, true));
            }
        }
        // Keys are sequential in a partition: just past its newest key come
        // the next creates (a create still in flight, as the race in the
        // key screen had it), around the others older neighbours.
        let guess = if rng.random_bool(0.5) {
            let newest = *self.own.lock().unwrap().back()?;
            newest + rng.random_range(1..=16)
        } else {
            pick(&self.own, rng)?.wrapping_add_signed(rng.random_range(-8..=8))
        };
        Some((guess, false))
    }
}

/// The answer to a gRPC call, as [`Attempt::answer`] holds it.
fn answer<T>(result: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> (String, Option<T>) {
    match result {
        Ok(Ok(value)) => ("ok".into(), Some(value)),
        // The node is down or unreachable (a transport error is UNKNOWN).
        Ok(Err(status))
            if matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
            ) =>
        {
            (NO_ANSWER.into(), None)
        }
        Ok(Err(status)) => (format!("{:?}", status.code()), None),
        Err(_) => (NO_ANSWER.into(), None),
    }
}

/// Whether an activated job is someone else's: not the attacker's tenant,
/// or carrying the first tenant's marker (its `id`).
fn foreign_job(key: u64, tenant: &str, variables: &str) -> Option<String> {
    let theirs = tenant != NAME || variables.contains("\"id\"");
    theirs.then(|| format!("job {key} of tenant {tenant:?}"))
}

/// Attacks until the workload stops creating.
pub async fn attack(shared: Arc<Shared>, attacker: Arc<Attacker>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut made = 0u64;
    while !shared.stop_creating.load(Ordering::Relaxed) {
        let node = shared.live.pick(&mut rng);
        let roll = rng.random_range(0..100);
        match roll {
            0..10 => {
                made += 1;
                own_create(&attacker, node, seed, made).await;
            }
            10..18 => own_work(&shared, &attacker, node).await,
            18..53 => {
                if let Some((key, foreign)) = attacker.target(&shared, &mut rng) {
                    v1_write(&shared, &attacker, node, key, foreign, &mut rng).await;
                }
            }
            53..61 => {
                if let Some(key) = shared.leaks.some_key(&mut rng) {
                    v1_read(&shared, &attacker, node, key, &mut rng).await;
                }
            }
            61..66 => v1_list(&shared, &attacker, node, &mut rng).await,
            66..78 => v1_session(&shared, &attacker, node, &mut rng).await,
            78..87 => zeebe(&shared, &attacker, node, &mut rng).await,
            87..94 if !shared.ojs.is_empty() => ojs(&shared, &attacker, node, &mut rng).await,
            _ => http(&shared, &attacker, node, &mut rng).await,
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..20))).await;
    }
}

fn job(key: u64) -> String {
    format!("job {key}")
}

fn attempt(surface: &str, action: &str, target: String, foreign: bool, writes: bool) -> Attempt {
    Attempt { surface: surface.into(), action: action.into(), target, foreign, writes, ..Attempt::default() }
}

/// A job of its own, of the workload's type, marked as its own.
async fn own_create(attacker: &Attacker, node: usize, seed: u64, n: u64) {
    let request = v1::CreateJobRequest {
        r#type: JOB_TYPE.into(),
        variables: format!(r#"{{"{NAME}":{n}}}"#),
        idempotency_key: format!("{NAME}-{seed}-{n}"),
        tenant_id: NAME.into(),
        ..Default::default()
    };
    if let Ok(Ok(key)) = tokio::time::timeout(ANSWER, attacker.v1[node].create(request)).await {
        push_bounded(&attacker.own, key, LEAKED_KEYS);
    }
}

/// Activates jobs of the workload's type as its own worker and completes
/// them: it must be handed its own jobs only.
async fn own_work(shared: &Shared, attacker: &Attacker, node: usize) {
    let request = v1::ActivateJobsRequest {
        r#type: JOB_TYPE.into(),
        worker: format!("{NAME}-poller"),
        timeout: 10_000,
        max_jobs_to_activate: 8,
        request_timeout: 500,
        tenant_ids: vec![NAME.into()],
        ..Default::default()
    };
    let activate = activate_v1(attacker.v1[node].raw(), request);
    let (answer, jobs) = answer(tokio::time::timeout(ANSWER, activate).await);
    let jobs = jobs.unwrap_or_default();
    let exposed = jobs.iter().filter_map(|j| foreign_job(j.key, &j.tenant_id, &j.variables)).collect();
    let record = attempt("drover.v1", "ActivateJobs", format!("type {JOB_TYPE}"), false, true);
    attacker.record(shared, Attempt { answer, exposed, ..record });
    for job in jobs {
        let result = format!(r#"{{"{NAME}":"done"}}"#);
        let done = attacker.v1[node].complete(job.key, job.attempt, &result);
        let _ = tokio::time::timeout(ANSWER, done).await;
    }
}

/// A write on `key` through drover.v1, at a guessed attempt or overriding.
async fn v1_write(shared: &Shared, attacker: &Attacker, node: usize, key: u64, foreign: bool, rng: &mut StdRng) {
    let mut raw = attacker.v1[node].raw();
    let attempt_guess = rng.random_range(1..=3);
    let forged = forged();
    let (action, result) = match rng.random_range(0..7) {
        0 => ("CancelJob", sent(raw.cancel_job(v1::CancelJobRequest { key })).await),
        1 => {
            let request =
                v1::CompleteJobRequest { key, attempt: attempt_guess, variables: forged, ..Default::default() };
            ("CompleteJob", sent(raw.complete_job(request)).await)
        }
        2 => {
            let request = v1::CompleteJobRequest { key, override_fence: true, variables: forged, ..Default::default() };
            ("CompleteJob override_fence", sent(raw.complete_job(request)).await)
        }
        3 => {
            let request = v1::FailJobRequest {
                key,
                attempt: attempt_guess,
                retries: 0,
                error_message: forged_failure(),
                ..Default::default()
            };
            ("FailJob", sent(raw.fail_job(request)).await)
        }
        4 => {
            let request = v1::UpdateJobRetriesRequest { key, retries: 0 };
            ("UpdateJobRetries", sent(raw.update_job_retries(request)).await)
        }
        5 => {
            let request =
                v1::UpdateJobTimeoutRequest { key, timeout: 600_000, attempt: attempt_guess, ..Default::default() };
            ("UpdateJobTimeout", sent(raw.update_job_timeout(request)).await)
        }
        _ => {
            let request = v1::CheckpointJobRequest {
                key,
                attempt: attempt_guess,
                stage: crate::workload::STAGES[0].into(),
                variables: forged,
            };
            ("CheckpointJob", sent(raw.checkpoint_job(request)).await)
        }
    };
    let (answer, _) = answer(result);
    attacker.record(shared, Attempt { answer, ..attempt("drover.v1", action, format!("job {key}"), foreign, true) });
}

/// Every job an ActivateJobs call hands out.
async fn activate_v1(
    mut raw: drover::proto::gateway::gateway_client::GatewayClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
    >,
    request: v1::ActivateJobsRequest,
) -> Result<Vec<v1::ActivatedJob>, tonic::Status> {
    let mut stream = raw.activate_jobs(request).await?.into_inner();
    let mut jobs = Vec::new();
    while let Some(reply) = stream.message().await? {
        jobs.extend(reply.jobs);
    }
    Ok(jobs)
}

/// A call's answer within [`ANSWER`], what it returned dropped.
async fn sent<T>(
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<Result<(), tonic::Status>, tokio::time::error::Elapsed> {
    tokio::time::timeout(ANSWER, call).await.map(|answer| answer.map(drop))
}

/// The variables it forges into the first tenant's jobs: its mark.
fn forged() -> String {
    format!(r#"{{"forged_by":"{NAME}"}}"#)
}

/// The failure message it forges: its mark.
fn forged_failure() -> String {
    format!("{NAME} forged this failure")
}

/// A read of a leaked key through drover.v1.
async fn v1_read(shared: &Shared, attacker: &Attacker, node: usize, key: u64, rng: &mut StdRng) {
    let mut raw = attacker.v1[node].raw();
    let request = v1::GetJobRequest { key, ..Default::default() };
    let (action, result) = match rng.random_range(0..3) {
        0 => ("GetJob", sent(raw.get_job(request)).await),
        1 => ("GetJobHistory", sent(raw.get_job_history(request)).await),
        _ => {
            // A wait that ends is answered with the job as it is: the job is
            // shown either way, so an answer at all is a read.
            let request = v1::AwaitJobRequest { key, timeout: 200, ..Default::default() };
            let awaited = async {
                let mut stream = raw.await_job(request).await?.into_inner();
                stream.message().await.map(drop)
            };
            ("AwaitJob", tokio::time::timeout(ANSWER, awaited).await)
        }
    };
    let (answer, _) = answer(result);
    attacker.record(shared, Attempt { answer, ..attempt("drover.v1", action, format!("job {key}"), true, false) });
}

/// Listings through drover.v1: jobs (unfiltered, and filtered to the first
/// tenant), and sessions.
async fn v1_list(shared: &Shared, attacker: &Attacker, node: usize, rng: &mut StdRng) {
    let mut raw = attacker.v1[node].raw();
    let record = match rng.random_range(0..3) {
        0 | 1 => {
            let tenant = if rng.random_bool(0.5) { "<default>" } else { "" };
            let filter = v1::JobFilter { tenant_id: tenant.into(), r#type: JOB_TYPE.into(), ..Default::default() };
            let request = v1::ListJobsRequest { filter: Some(filter), page_size: 50, ..Default::default() };
            let (answer, listed) = answer(tokio::time::timeout(ANSWER, raw.list_jobs(request)).await);
            let jobs = listed.map(|r| r.into_inner().jobs).unwrap_or_default();
            let exposed = jobs.iter().filter_map(|j| foreign_job(j.key, &j.tenant_id, &j.variables)).collect();
            let target = format!("jobs of tenant {tenant:?}");
            Attempt { answer, exposed, ..attempt("drover.v1", "ListJobs", target, false, false) }
        }
        _ => {
            let request = v1::ListWorkersRequest::default();
            let (answer, listed) = answer(tokio::time::timeout(ANSWER, raw.list_workers(request)).await);
            let sessions = listed.map(|r| r.into_inner().workers).unwrap_or_default();
            let exposed = sessions.iter().filter_map(foreign_session).collect();
            Attempt { answer, exposed, ..attempt("drover.v1", "ListWorkers", "every session".into(), false, false) }
        }
    };
    attacker.record(shared, record);
}

fn foreign_session(s: &v1::WorkerSession) -> Option<String> {
    let theirs = s.tenant_ids.iter().any(|t| t != NAME) || !is_attacker(&s.worker_id);
    theirs.then(|| format!("session {:x} ({}) of tenants {:?}", s.session_id, s.worker_id, s.tenant_ids))
}

/// Acts on a leaked session: beats for it (naming leaked jobs as held),
/// ends it, activates under it, or directs it (or every session).
async fn v1_session(shared: &Shared, attacker: &Attacker, node: usize, rng: &mut StdRng) {
    let Some(session_id) = shared.leaks.some_session(rng) else { return };
    let mut raw = attacker.v1[node].raw();
    let target = format!("session {session_id:x}");
    let record = match rng.random_range(0..5) {
        0 => {
            let mut held = Vec::new();
            for _ in 0..4 {
                if let Some(key) = shared.leaks.some_key(rng) {
                    held.push(v1::HeldJob { key, attempt: rng.random_range(1..=3) });
                }
            }
            let request = v1::HeartbeatRequest { session_id, jobs: held, ..Default::default() };
            let (answer, beat) = answer(tokio::time::timeout(ANSWER, raw.heartbeat(request)).await);
            let tokens = beat.map(|b| b.into_inner().job_tokens).unwrap_or_default();
            let exposed =
                tokens.iter().map(|t| format!("a job token for job {} attempt {}", t.key, t.attempt)).collect();
            Attempt { answer, exposed, ..attempt("drover.v1", "Heartbeat", target, true, true) }
        }
        1 => {
            let request = v1::DeregisterWorkerRequest { session_id };
            let (answer, _) = answer(tokio::time::timeout(ANSWER, raw.deregister_worker(request)).await);
            Attempt { answer, ..attempt("drover.v1", "DeregisterWorker", target, true, true) }
        }
        2 => {
            let request = v1::ActivateJobsRequest {
                r#type: JOB_TYPE.into(),
                worker: format!("{NAME}-session"),
                timeout: 10_000,
                max_jobs_to_activate: 4,
                request_timeout: 500,
                tenant_ids: vec![NAME.into()],
                session_id,
                ..Default::default()
            };
            let activated = activate_v1(raw, request);
            let (answer, jobs) = answer(tokio::time::timeout(ANSWER, activated).await);
            let jobs = jobs.unwrap_or_default();
            let exposed = jobs.iter().filter_map(|j| foreign_job(j.key, &j.tenant_id, &j.variables)).collect();
            Attempt { answer, exposed, ..attempt("drover.v1", "ActivateJobs under session", target, true, true) }
        }
        3 => {
            let request = v1::SetWorkerStateRequest { session_id, state: "quiet".into(), ..Default::default() };
            let (answer, _) = answer(tokio::time::timeout(ANSWER, raw.set_worker_state(request)).await);
            Attempt { answer, ..attempt("drover.v1", "SetWorkerState quiet", target, true, true) }
        }
        _ => {
            let request = v1::SetWorkerStateRequest { all: true, state: "quiet".into(), ..Default::default() };
            let (answer, reply) = answer(tokio::time::timeout(ANSWER, raw.set_worker_state(request)).await);
            let directed = reply.map(|r| r.into_inner().workers).unwrap_or_default();
            let exposed = directed.iter().filter_map(foreign_session).collect();
            let all = attempt("drover.v1", "SetWorkerState all quiet", "every session".into(), true, true);
            Attempt { answer, exposed, ..all }
        }
    };
    attacker.record(shared, record);
}

/// Zeebe's job RPCs on a leaked key (a plain key is Zeebe's untagged key:
/// an override of the fence), and Zeebe activations of the workload's type.
async fn zeebe(shared: &Shared, attacker: &Attacker, node: usize, rng: &mut StdRng) {
    let mut client = attacker.zeebe[node].clone();
    if rng.random_ratio(1, 5) {
        let request = zb::ActivateJobsRequest {
            r#type: JOB_TYPE.into(),
            worker: format!("{NAME}-zeebe"),
            timeout: 10_000,
            max_jobs_to_activate: 4,
            request_timeout: 500,
            // Its own tenant, or none named (the default tenant: refused).
            tenant_ids: if rng.random_bool(0.8) { vec![NAME.into()] } else { Vec::new() },
            ..Default::default()
        };
        let activated = async {
            let mut stream = client.activate_jobs(request).await?.into_inner();
            let mut jobs = Vec::new();
            while let Some(reply) = stream.message().await? {
                jobs.extend(reply.jobs);
            }
            Ok(jobs)
        };
        let (answer, jobs) = answer(tokio::time::timeout(ANSWER, activated).await);
        let jobs: Vec<zb::ActivatedJob> = jobs.unwrap_or_default();
        let exposed = jobs.iter().filter_map(|j| foreign_job(j.key as u64, &j.tenant_id, &j.variables)).collect();
        let record = attempt("zeebe", "ActivateJobs", format!("type {JOB_TYPE}"), false, true);
        attacker.record(shared, Attempt { answer, exposed, ..record });
        return;
    }
    let Some(key) = shared.leaks.some_key(rng) else { return };
    let job_key = key as i64;
    let (action, result) = match rng.random_range(0..4) {
        0 => {
            let request = zb::CompleteJobRequest { job_key, variables: forged() };
            ("CompleteJob", sent(client.complete_job(request)).await)
        }
        1 => {
            let request =
                zb::FailJobRequest { job_key, retries: 0, error_message: forged_failure(), ..Default::default() };
            ("FailJob", sent(client.fail_job(request)).await)
        }
        2 => {
            let request = zb::UpdateJobRetriesRequest { job_key, retries: 0 };
            ("UpdateJobRetries", sent(client.update_job_retries(request)).await)
        }
        _ => {
            let request = zb::UpdateJobTimeoutRequest { job_key, timeout: 600_000 };
            ("UpdateJobTimeout", sent(client.update_job_timeout(request)).await)
        }
    };
    let (answer, _) = answer(result);
    attacker.record(shared, Attempt { answer, ..attempt("zeebe", action, format!("job {key}"), true, true) });
}

/// The admin port: the console's forms and pages on a leaked key, the
/// actuator's listings and worker directions.
async fn http(shared: &Shared, attacker: &Attacker, node: usize, rng: &mut StdRng) {
    let session = shared.leaks.some_session(rng);
    let key = shared.leaks.some_key(rng);
    let (surface, action, path, target, foreign, writes) = match (rng.random_range(0..8), key, session) {
        (0, Some(key), _) => {
            ("console", "POST /console/jobs/{key}/cancel", format!("/console/jobs/{key}/cancel"), job(key), true, true)
        }
        (1, Some(key), _) => {
            ("console", "POST /console/jobs/{key}/retry", format!("/console/jobs/{key}/retry"), job(key), true, true)
        }
        (2, Some(key), _) => {
            ("console", "GET /console/jobs/{key}", format!("/console/jobs/{key}"), job(key), true, false)
        }
        (3, _, Some(id)) => {
            let path = format!("/actuator/workers/quiet?session={id:x}");
            ("actuator", "POST /actuator/workers/quiet?session", path, format!("session {id:x}"), true, true)
        }
        (4, _, _) => {
            let path = "/actuator/workers/quiet?all=true".to_string();
            ("actuator", "POST /actuator/workers/quiet?all=true", path, "every session".into(), true, true)
        }
        (5, _, _) => {
            ("actuator", "GET /actuator/workers", "/actuator/workers".into(), "every session".into(), false, false)
        }
        // Every job on the node, copied under the partition's lock: rarely.
        (6, _, _) if rng.random_ratio(1, 10) => {
            ("actuator", "GET /actuator/jobs", "/actuator/jobs".into(), "every job".into(), false, false)
        }
        _ => return,
    };
    let method = action.split(' ').next().unwrap_or("GET");
    let ca = attacker.ca.as_deref();
    // The retry form's one field; the other forms take none.
    let form = if path.ends_with("/retry") { "retries=3" } else { "" };
    let sent = crate::cluster::http_as(&attacker.admins[node], method, &path, form, ca, Some(&attacker.token));
    let (answer, body) = match tokio::time::timeout(ANSWER, sent).await {
        Ok(Ok((status, body))) if (200..400).contains(&status) => ("ok".to_string(), body),
        Ok(Ok((503, _))) | Ok(Err(_)) | Err(_) => (NO_ANSWER.to_string(), String::new()),
        Ok(Ok((status, _))) => (status.to_string(), String::new()),
    };
    let exposed = if path == "/actuator/workers" || path == "/actuator/jobs" { exposed_in(&body) } else { Vec::new() };
    attacker.record(shared, Attempt { answer, exposed, ..attempt(surface, action, target, foreign, writes) });
}

/// The OJS port, in the first tenant (no `X-OJS-Tenant`: the default
/// tenant, which the attacker's token does not hold): fetches and pauses of
/// the workload's queue, bulk cancels of it, and reads of its events, queues
/// and dead letters. Every one must be refused.
async fn ojs(shared: &Shared, attacker: &Attacker, node: usize, rng: &mut StdRng) {
    let queue = JOB_TYPE;
    let fetch = format!(r#"{{"queues":["{queue}"],"count":4,"worker_id":"{NAME}-ojs"}}"#);
    let (action, path, body, writes) = match rng.random_range(0..6) {
        0 => ("POST /ojs/v1/workers/fetch", "/ojs/v1/workers/fetch".to_string(), fetch, true),
        1 => ("POST /ojs/v1/queues/{queue}/pause", format!("/ojs/v1/queues/{queue}/pause"), "{}".into(), true),
        2 => {
            let path = "/ojs/v1/admin/jobs/bulk/cancel?confirm=true".to_string();
            ("POST /ojs/v1/admin/jobs/bulk/cancel", path, format!(r#"{{"queue":"{queue}"}}"#), true)
        }
        3 => ("GET /ojs/v1/events", format!("/ojs/v1/events?queues={queue}&limit=20"), String::new(), false),
        4 => ("GET /ojs/v1/queues", "/ojs/v1/queues".into(), String::new(), false),
        _ => ("GET /ojs/v1/dead-letter", "/ojs/v1/dead-letter".into(), String::new(), false),
    };
    let method = action.split(' ').next().unwrap_or("GET");
    let ca = attacker.ca.as_deref();
    let sent =
        crate::cluster::http_as(&shared.ojs[node % shared.ojs.len()], method, &path, &body, ca, Some(&attacker.token));
    let (answer, body) = match tokio::time::timeout(ANSWER, sent).await {
        Ok(Ok((status, body))) if (200..400).contains(&status) => ("ok".to_string(), body),
        Ok(Ok((503, _))) | Ok(Err(_)) | Err(_) => (NO_ANSWER.to_string(), String::new()),
        Ok(Ok((status, _))) => (status.to_string(), String::new()),
    };
    let exposed = ojs_exposed(&body);
    let target = format!("queue {queue} of the first tenant");
    attacker.record(shared, Attempt { answer, exposed, ..attempt("ojs", action, target, true, writes) });
}

/// Jobs, events and queues of the first tenant in an OJS answer.
fn ojs_exposed(body: &str) -> Vec<String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else { return Vec::new() };
    let listed = ["jobs", "events", "queues"]
        .into_iter()
        .flat_map(|field| value[field].as_array().into_iter().flatten().map(move |item| format!("{field}: {item}")));
    listed.collect()
}

/// Another tenant's sessions or jobs in an actuator listing.
fn exposed_in(body: &str) -> Vec<String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else { return Vec::new() };
    let sessions = value["workers"].as_array().into_iter().flatten().filter_map(|w| {
        let tenants: Vec<&str> = w["tenantIds"].as_array()?.iter().filter_map(|t| t.as_str()).collect();
        let theirs = tenants.iter().any(|t| *t != NAME) || !is_attacker(w["workerId"].as_str().unwrap_or_default());
        theirs.then(|| format!("session {} of tenants {tenants:?}", w["sessionId"]))
    });
    let jobs = value["jobs"].as_array().into_iter().flatten().filter_map(|j| {
        foreign_job(j["key"].as_u64()?, j["tenant"].as_str()?, j["variables"].as_str().unwrap_or_default())
    });
    sessions.chain(jobs).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FinalJob;

    fn job(tenant: &str, actors: &[&str], forged: bool) -> FinalJob {
        FinalJob {
            tenant: tenant.into(),
            actors: actors.iter().map(|a| a.to_string()).collect(),
            forged,
            state: "completed".into(),
            ..FinalJob::default()
        }
    }

    fn on_node(jobs: Vec<(u64, FinalJob)>) -> FinalReads {
        [(0, jobs.into_iter().collect())].into()
    }

    fn refused(action: &str, foreign: bool, writes: bool, answer: &str) -> Attempt {
        Attempt {
            surface: "drover.v1".into(),
            action: action.into(),
            target: "job 7".into(),
            foreign,
            writes,
            answer: answer.into(),
            ..Attempt::default()
        }
    }

    #[test]
    fn refusals_and_clean_histories_are_no_finding() {
        let attempts = vec![
            refused("CancelJob", true, true, "NotFound"),
            refused("Heartbeat", true, true, "PermissionDenied"),
            refused("GetJob", true, false, "NotFound"),
            // A guessed key that is its own (job 9): an OK is its right.
            Attempt { target: "job 9".into(), ..refused("CancelJob", false, true, "ok") },
            refused("CompleteJob", true, true, NO_ANSWER),
        ];
        let victim = on_node(vec![(7, job("", &["jepsen", "poller-3", "worker failed"], false))]);
        let own = on_node(vec![(9, job(NAME, &[NAME, "mallory-poller"], false))]);
        let report = check(&attempts, &victim, &own);
        assert_eq!(report.effects, Vec::<String>::new());
        assert_eq!(report.reads, Vec::<String>::new());
        assert_eq!((report.attempts, report.refused), (5, 3));
    }

    #[test]
    fn a_write_on_a_leaked_key_answered_ok_is_an_effect_and_a_read_is_a_read() {
        let attempts = vec![refused("CancelJob", true, true, "ok"), refused("GetJob", true, false, "ok")];
        let report = check(&attempts, &FinalReads::new(), &FinalReads::new());
        assert_eq!(report.effects, vec!["drover.v1 CancelJob on job 7 answered ok"]);
        assert_eq!(report.reads, vec!["drover.v1 GetJob on job 7 answered ok"]);
    }

    #[test]
    fn a_guessed_key_answered_ok_that_is_not_its_own_is_a_crossing() {
        // An OK on a guessed key used to count for nothing ("it may be its
        // own"). Its own jobs are known at the end: any other job it was
        // answered OK on is another tenant's (a key no job has is NOT_FOUND).
        let own = on_node(vec![(9, job(NAME, &[NAME], false))]);
        let write = Attempt { target: "job 12".into(), ..refused("CancelJob", false, true, "ok") };
        let read = Attempt { target: "job 13".into(), ..refused("GetJob", false, false, "ok") };
        let report = check(&[write, read], &FinalReads::new(), &own);
        assert_eq!(report.effects, vec!["drover.v1 CancelJob on job 12 answered ok, a guessed key not its own"]);
        assert_eq!(report.reads.len(), 1, "{:?}", report.reads);
        let mine = Attempt { target: "job 9".into(), ..refused("CancelJob", false, true, "ok") };
        assert!(check(&[mine], &FinalReads::new(), &own).effects.is_empty());
    }

    #[test]
    fn what_the_replicas_hold_names_every_crossing() {
        let victim = on_node(vec![
            (1, job("", &["jepsen", "mallory"], false)),
            (2, job("", &["mallory forged this failure"], false)),
            (3, job("", &["jepsen"], true)),
        ]);
        let own = on_node(vec![(4, job(NAME, &[NAME, "poller-2"], false)), (5, job("", &["jepsen"], false))]);
        let report = check(&[], &victim, &own);
        assert_eq!(report.effects.len(), 4, "{:#?}", report.effects);
        assert!(report.effects[0].contains("job 1") && report.effects[0].contains("\"mallory\""));
        assert!(report.effects[2].contains("job 3") && report.effects[2].contains("mark"));
        assert!(report.effects[3].contains("job 4") && report.effects[3].contains("poller-2"));
        assert_eq!(report.reads.len(), 1);
        assert!(report.reads[0].contains("job 5"));
    }

    #[test]
    fn listings_showing_another_tenant_are_reads() {
        let listing = r#"{"workers":[{"sessionId":"a1","workerId":"streamer-a","tenantIds":["<default>"]},
            {"sessionId":"b2","workerId":"mallory-poller","tenantIds":["mallory"]}],
            "jobs":[{"key":5,"tenant":"","variables":"{\"id\":5}"},{"key":6,"tenant":"mallory","variables":"{}"}]}"#;
        let exposed = exposed_in(listing);
        assert_eq!(exposed.len(), 2, "{exposed:?}");
        let listing = Attempt { target: "every session".into(), ..refused("GET /actuator/workers", false, false, "") };
        let attempts = vec![Attempt { exposed, answer: "ok".into(), ..listing }];
        assert_eq!(check(&attempts, &FinalReads::new(), &FinalReads::new()).reads.len(), 2);
    }
}
