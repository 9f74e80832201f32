//! Tokens, scopes and tenants on every RPC and admin endpoint: no token is
//! UNAUTHENTICATED; each scope allows exactly its RPCs; another tenant's jobs
//! are invisible and untouchable; JWTs verify against the JWKS, and expired
//! or foreign ones are refused; a forwarded command is screened by the
//! leader against the principal the gateway authenticated.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{http_request_with, LocalNode, ProcessCluster};
use drover::auth::keys::{create_token, generate_secret, token_entry, write_signing_key};

use drover::client::Client;
use drover::proto::gateway::*;
use tonic::Code;

/// The tokens of the table test: one per scope, plus everything and nothing.
const NAMES: [(&str, &[&str]); 9] = [
    ("admin", &["*"]),
    ("create", &["jobs:create:t"]),
    ("work", &["jobs:work:t"]),
    ("read", &["jobs:read:t"]),
    ("manage", &["jobs:manage:t"]),
    ("workers", &["workers:manage"]),
    ("cluster-read", &["cluster:read"]),
    ("cluster-admin", &["cluster:admin"]),
    ("nothing", &[]),
];

struct Tokens {
    _dir: tempfile::TempDir,
    file: PathBuf,
    secrets: Vec<(String, String)>,
}

impl Tokens {
    /// A tokens file: the table's tokens for `<default>`, and `jobs:*`
    /// tokens for tenants acme and globex.
    fn new() -> Tokens {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        let mut secrets = Vec::new();
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut add = |name: &str, scopes: &[&str], tenants: &[&str]| {
            let secret = generate_secret();
            text.push_str(&token_entry(name, &secret, &strings(scopes), &strings(tenants)));
            secrets.push((name.to_string(), secret));
        };
        for (name, scopes) in NAMES {
            add(name, scopes, if name == "admin" { &["*"] } else { &["<default>"] });
        }
        add("acme", &["jobs:*", "cluster:read"], &["acme"]);
        add("globex", &["jobs:*", "cluster:read"], &["globex"]);
        add("globex-workers", &["workers:manage", "cluster:read"], &["globex"]);
        // Another worker of acme's, and acme's operator of workers.
        add("acme-peer", &["jobs:*", "cluster:read"], &["acme"]);
        add("acme-workers", &["jobs:work:t", "workers:manage"], &["acme"]);
        let file = dir.path().join("tokens.toml");
        std::fs::write(&file, text).unwrap();
        Tokens { _dir: dir, file, secrets }
    }

    fn secret(&self, name: &str) -> &str {
        &self.secrets.iter().find(|(n, _)| n == name).expect("a token of the table").1
    }
}

async fn node_with(tokens: &Tokens) -> LocalNode {
    let file = tokens.file.clone();
    LocalNode::start_with(move |config| config.auth.tokens_file = Some(file)).await
}

fn as_token(node: &LocalNode, token: &str) -> Client {
    node.client.with_token(token).unwrap()
}

/// Every RPC of drover.v1.Gateway, each called on job type `t`.
#[derive(Clone, Copy, Debug)]
enum Rpc {
    CreateJob,
    CreateJobs,
    ActivateJobs,
    StreamActivatedJobs,
    CompleteJob,
    CompleteJobs,
    FailJob,
    UpdateJobTimeout,
    UpdateJobRetries,
    CancelJob,
    GetJob,
    GetJobHistory,
    AwaitJob,
    CheckpointJob,
    ListJobs,
    RetryJobs,
    CancelJobs,
    Topology,
    RegisterWorker,
    Heartbeat,
    DeregisterWorker,
    ListWorkers,
    SetWorkerState,
    SetSchema,
    GetSchema,
    SetQueuePaused,
    SetQueueLimit,
    ListQueues,
    WatchEvents,
    PutSchedule,
    GetSchedule,
    ListSchedules,
    DeleteSchedule,
    SetSchedulePaused,
    CreateWorkflow,
    GetWorkflow,
    ListWorkflows,
    CancelWorkflow,
}

impl Rpc {
    const ALL: [Rpc; 38] = [
        Rpc::CreateJob,
        Rpc::CreateJobs,
        Rpc::ActivateJobs,
        Rpc::StreamActivatedJobs,
        Rpc::CompleteJob,
        Rpc::CompleteJobs,
        Rpc::FailJob,
        Rpc::UpdateJobTimeout,
        Rpc::UpdateJobRetries,
        Rpc::CancelJob,
        Rpc::GetJob,
        Rpc::GetJobHistory,
        Rpc::AwaitJob,
        Rpc::CheckpointJob,
        Rpc::ListJobs,
        Rpc::RetryJobs,
        Rpc::CancelJobs,
        Rpc::Topology,
        Rpc::RegisterWorker,
        Rpc::Heartbeat,
        Rpc::DeregisterWorker,
        Rpc::ListWorkers,
        Rpc::SetWorkerState,
        Rpc::SetSchema,
        Rpc::GetSchema,
        Rpc::SetQueuePaused,
        Rpc::SetQueueLimit,
        Rpc::ListQueues,
        Rpc::WatchEvents,
        Rpc::PutSchedule,
        Rpc::GetSchedule,
        Rpc::ListSchedules,
        Rpc::DeleteSchedule,
        Rpc::SetSchedulePaused,
        Rpc::CreateWorkflow,
        Rpc::GetWorkflow,
        Rpc::ListWorkflows,
        Rpc::CancelWorkflow,
    ];

    /// The tokens of the table allowed to make this call.
    fn allowed(self) -> &'static [&'static str] {
        match self {
            // Scheduling jobs of a type is creating them.
            // ... and so is making a workflow of it.
            Rpc::CreateJob
            | Rpc::CreateJobs
            | Rpc::PutSchedule
            | Rpc::DeleteSchedule
            | Rpc::SetSchedulePaused
            | Rpc::CreateWorkflow => &["admin", "create"],
            Rpc::ActivateJobs | Rpc::StreamActivatedJobs => &["admin", "work"],
            Rpc::CompleteJob | Rpc::CompleteJobs | Rpc::FailJob | Rpc::UpdateJobTimeout | Rpc::CheckpointJob => {
                &["admin", "work"]
            }
            Rpc::RegisterWorker | Rpc::Heartbeat | Rpc::DeregisterWorker => &["admin", "work"],
            Rpc::UpdateJobRetries
            | Rpc::CancelJob
            | Rpc::RetryJobs
            | Rpc::CancelJobs
            | Rpc::SetSchema
            | Rpc::SetQueuePaused
            | Rpc::SetQueueLimit
            | Rpc::CancelWorkflow => &["admin", "manage"],
            Rpc::GetJob
            | Rpc::GetJobHistory
            | Rpc::ListJobs
            | Rpc::ListQueues
            | Rpc::WatchEvents
            | Rpc::GetSchedule
            | Rpc::ListSchedules
            | Rpc::GetWorkflow
            | Rpc::ListWorkflows => &["admin", "read"],
            Rpc::AwaitJob | Rpc::GetSchema => &["admin", "read", "create"],
            Rpc::Topology => {
                &["admin", "create", "work", "read", "manage", "workers", "cluster-read", "cluster-admin", "nothing"]
            }
            Rpc::ListWorkers => &["admin", "workers", "cluster-read"],
            Rpc::SetWorkerState => &["admin", "workers"],
        }
    }

    /// Makes the call on job `key` (of type `t`, activated at attempt 1)
    /// and answers its status; a streaming call's status is its first item's.
    async fn call(self, client: &Client, key: u64) -> Result<(), tonic::Status> {
        let mut raw = client.raw();
        let short = Duration::from_millis(200);
        let create = || CreateJobRequest { r#type: "t".into(), ..Default::default() };
        match self {
            Rpc::CreateJob => raw.create_job(create()).await.map(drop),
            Rpc::CreateJobs => {
                let mut answers = raw.create_jobs(futures::stream::iter([create()])).await?.into_inner();
                first(&mut answers).await
            }
            Rpc::ActivateJobs => {
                let request = ActivateJobsRequest {
                    r#type: "t".into(),
                    max_jobs_to_activate: 1,
                    timeout: 60_000,
                    ..Default::default()
                };
                raw.activate_jobs(request).await.map(drop)
            }
            Rpc::StreamActivatedJobs => {
                let request = StreamActivatedJobsRequest { r#type: "t".into(), timeout: 60_000, ..Default::default() };
                raw.stream_activated_jobs(request).await.map(drop)
            }
            Rpc::CompleteJob => {
                raw.complete_job(CompleteJobRequest { key, attempt: 1, ..Default::default() }).await.map(drop)
            }
            Rpc::CompleteJobs => {
                let request = CompleteJobRequest { key, attempt: 1, ..Default::default() };
                let mut answers = raw.complete_jobs(futures::stream::iter([request])).await?.into_inner();
                match answers.message().await? {
                    Some(CompleteJobsResponse { error: Some(error), .. }) => {
                        Err(tonic::Status::new(Code::from_i32(error.code), error.message))
                    }
                    _ => Ok(()),
                }
            }
            Rpc::FailJob => {
                let request =
                    FailJobRequest { key, attempt: 1, retries: 1, reason: "failed".into(), ..Default::default() };
                raw.fail_job(request).await.map(drop)
            }
            Rpc::UpdateJobTimeout => raw
                .update_job_timeout(UpdateJobTimeoutRequest { key, attempt: 1, timeout: 60_000, override_fence: false })
                .await
                .map(drop),
            Rpc::UpdateJobRetries => {
                raw.update_job_retries(UpdateJobRetriesRequest { key, retries: 3 }).await.map(drop)
            }
            Rpc::CancelJob => raw.cancel_job(CancelJobRequest { key }).await.map(drop),
            Rpc::GetJob => raw.get_job(GetJobRequest { key, ..Default::default() }).await.map(drop),
            Rpc::GetJobHistory => raw.get_job_history(GetJobRequest { key, ..Default::default() }).await.map(drop),
            Rpc::AwaitJob => {
                let request = AwaitJobRequest { key, timeout: 1, ..Default::default() };
                let mut answers = raw.await_job(request).await?.into_inner();
                answers.message().await.map(drop)
            }
            Rpc::CheckpointJob => {
                let request = CheckpointJobRequest { key, attempt: 1, stage: "s".into(), ..Default::default() };
                raw.checkpoint_job(request).await.map(drop)
            }
            Rpc::ListJobs => {
                let filter = JobFilter { r#type: "t".into(), ..Default::default() };
                raw.list_jobs(ListJobsRequest { filter: Some(filter), ..Default::default() }).await.map(drop)
            }
            Rpc::RetryJobs => {
                let filter = JobFilter { r#type: "t".into(), ..Default::default() };
                raw.retry_jobs(RetryJobsRequest { filter: Some(filter), dry_run: true, ..Default::default() })
                    .await
                    .map(drop)
            }
            Rpc::CancelJobs => {
                let filter = JobFilter { r#type: "t".into(), ..Default::default() };
                raw.cancel_jobs(CancelJobsRequest { filter: Some(filter), dry_run: true }).await.map(drop)
            }
            Rpc::Topology => raw.topology(TopologyRequest {}).await.map(drop),
            Rpc::RegisterWorker => {
                let request = RegisterWorkerRequest {
                    worker_id: "w".into(),
                    job_types: vec!["t".into()],
                    heartbeat_interval: 1_000,
                    dead_after: 5_000,
                    ..Default::default()
                };
                raw.register_worker(request).await.map(drop)
            }
            Rpc::Heartbeat => {
                let mut request = tonic::Request::new(HeartbeatRequest { session_id: 1, ..Default::default() });
                request.set_timeout(short * 10);
                raw.heartbeat(request).await.map(drop)
            }
            Rpc::DeregisterWorker => raw.deregister_worker(DeregisterWorkerRequest { session_id: 1 }).await.map(drop),
            Rpc::ListWorkers => raw.list_workers(ListWorkersRequest::default()).await.map(drop),
            Rpc::SetWorkerState => {
                let request =
                    SetWorkerStateRequest { label: "pool:none".into(), state: "quiet".into(), ..Default::default() };
                raw.set_worker_state(request).await.map(drop)
            }
            Rpc::SetSchema => {
                raw.set_schema(SetSchemaRequest { r#type: "t".into(), schema: String::new() }).await.map(drop)
            }
            Rpc::GetSchema => raw.get_schema(GetSchemaRequest { r#type: "t".into() }).await.map(drop),
            // Pausing a queue no job of the matrix uses.
            Rpc::SetQueuePaused => raw
                .set_queue_paused(SetQueuePausedRequest { r#type: "t".into(), paused: false, ..Default::default() })
                .await
                .map(drop),
            // Lifting the limit of a queue no job of the matrix uses.
            Rpc::SetQueueLimit => {
                raw.set_queue_limit(SetQueueLimitRequest { r#type: "t".into(), ..Default::default() }).await.map(drop)
            }
            Rpc::ListQueues => {
                raw.list_queues(ListQueuesRequest { r#type: "t".into(), ..Default::default() }).await.map(drop)
            }
            Rpc::WatchEvents => {
                let request = WatchEventsRequest { types: vec!["t".into()], from_now: true, ..Default::default() };
                raw.watch_events(request).await.map(drop)
            }
            // Schedule `s` of type `t` (see `schedule_t`): put again as it is,
            // read, resumed while running; a delete of one that never was.
            Rpc::PutSchedule => raw.put_schedule(schedule_t()).await.map(drop),
            Rpc::GetSchedule => raw.get_schedule(named("s")).await.map(drop),
            Rpc::ListSchedules => raw.list_schedules(ListSchedulesRequest::default()).await.map(drop),
            Rpc::DeleteSchedule => match raw.delete_schedule(named("never")).await {
                Err(status) if status.code() == Code::NotFound => Ok(()),
                other => other.map(drop),
            },
            Rpc::SetSchedulePaused => {
                let request = SetSchedulePausedRequest { name: "s".into(), paused: false, ..Default::default() };
                raw.set_schedule_paused(request).await.map(drop)
            }
            // Workflow `w` of type `t` (see `workflow_t`): created again as
            // it is, read; a cancel of one that never was.
            Rpc::CreateWorkflow => raw.create_workflow(workflow_t()).await.map(drop),
            Rpc::GetWorkflow => raw.get_workflow(workflow_named("w")).await.map(drop),
            Rpc::ListWorkflows => raw.list_workflows(ListWorkflowsRequest::default()).await.map(drop),
            Rpc::CancelWorkflow => match raw.cancel_workflow(workflow_named("never")).await {
                Err(status) if status.code() == Code::NotFound => Ok(()),
                other => other.map(drop),
            },
        }
    }
}

/// Schedule `s`: a daily job of type `t`.
fn schedule_t() -> PutScheduleRequest {
    PutScheduleRequest {
        name: "s".into(),
        expression: "@daily".into(),
        job: Some(CreateJobRequest { r#type: "t".into(), ..Default::default() }),
        ..Default::default()
    }
}

/// Workflow `w`: a group of one job of type `t`.
fn workflow_t() -> CreateWorkflowRequest {
    CreateWorkflowRequest {
        id: "w".into(),
        kind: "group".into(),
        steps: vec![CreateJobRequest { r#type: "t".into(), ..Default::default() }],
        ..Default::default()
    }
}

fn workflow_named(id: &str) -> GetWorkflowRequest {
    GetWorkflowRequest { id: id.into(), ..Default::default() }
}

fn named(name: &str) -> GetScheduleRequest {
    GetScheduleRequest { name: name.into(), ..Default::default() }
}

async fn first(answers: &mut tonic::Streaming<CreateJobResponse>) -> Result<(), tonic::Status> {
    match answers.message().await? {
        Some(CreateJobResponse { error: Some(error), .. }) => {
            Err(tonic::Status::new(Code::from_i32(error.code), error.message))
        }
        _ => Ok(()),
    }
}

/// A job of type `t` in `tenant`, activated once (attempt 1), by `admin`.
async fn activated_job(admin: &Client, tenant: &str) -> u64 {
    let request = CreateJobRequest { r#type: "t".into(), tenant_id: tenant.into(), ..Default::default() };
    let key = admin.create(request).await.unwrap();
    let activate = ActivateJobsRequest {
        r#type: "t".into(),
        max_jobs_to_activate: 100,
        timeout: 600_000,
        tenant_ids: if tenant.is_empty() { Vec::new() } else { vec![tenant.to_string()] },
        ..Default::default()
    };
    let mut answers = admin.raw().activate_jobs(activate).await.unwrap().into_inner();
    let jobs = answers.message().await.unwrap().unwrap().jobs;
    assert!(jobs.iter().any(|j| j.key == key), "the new job {key} is activated");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_unauthenticated_and_each_scope_allows_exactly_its_rpcs() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let admin = as_token(&node, tokens.secret("admin"));
    let mut failures = Vec::new();
    admin.raw().put_schedule(schedule_t()).await.expect("the schedule the matrix reads and resumes");
    admin.raw().create_workflow(workflow_t()).await.expect("the workflow the matrix reads");
    for rpc in Rpc::ALL {
        let key = activated_job(&admin, "").await;
        match rpc.call(&node.client, key).await {
            Err(status) if status.code() == Code::Unauthenticated => {}
            other => failures.push(format!("{rpc:?} without a token: {other:?}, not UNAUTHENTICATED")),
        }
        for (name, _) in NAMES {
            // A fresh job each time: an allowed cancel or failure ends it.
            let key = activated_job(&admin, "").await;
            let answer = rpc.call(&as_token(&node, tokens.secret(name)), key).await;
            let denied = matches!(&answer, Err(s) if s.code() == Code::PermissionDenied);
            let allowed = rpc.allowed().contains(&name);
            if allowed && (denied || matches!(&answer, Err(s) if s.code() == Code::Unauthenticated)) {
                failures.push(format!("{rpc:?} with {name}: {answer:?}, but the scope allows it"));
            }
            if !allowed && !denied {
                failures.push(format!("{rpc:?} with {name}: {answer:?}, not PERMISSION_DENIED"));
            }
            if let (false, Err(status)) = (allowed, &answer) {
                if !status.message().contains("lacks the scope") {
                    failures.push(format!("{rpc:?} with {name}: the refusal names no scope: {}", status.message()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} wrong answers:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_job_is_invisible_and_untouchable_through_every_rpc_and_the_admin_port() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let admin = as_token(&node, tokens.secret("admin"));
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let key = activated_job(&admin, "acme").await;
    // Through every RPC that names a job, globex finds none.
    for rpc in [
        Rpc::CompleteJob,
        Rpc::CompleteJobs,
        Rpc::FailJob,
        Rpc::UpdateJobTimeout,
        Rpc::UpdateJobRetries,
        Rpc::CancelJob,
        Rpc::GetJob,
        Rpc::GetJobHistory,
        Rpc::AwaitJob,
        Rpc::CheckpointJob,
    ] {
        let answer = rpc.call(&globex, key).await;
        assert!(matches!(&answer, Err(s) if s.code() == Code::NotFound), "{rpc:?} by globex: {answer:?}");
    }
    // And through Zeebe's gateway, by the job's key as Zeebe clients send it.
    let mut globex_zeebe = zeebe_as(&node, Some(tokens.secret("globex"))).await;
    for rpc in [
        ZeebeRpc::CompleteJob,
        ZeebeRpc::FailJob,
        ZeebeRpc::ThrowError,
        ZeebeRpc::UpdateJobRetries,
        ZeebeRpc::UpdateJobTimeout,
    ] {
        let answer = rpc.call(&mut globex_zeebe, key as i64).await;
        assert!(matches!(&answer, Err(s) if s.code() == Code::NotFound), "Zeebe {rpc:?} by globex: {answer:?}");
    }
    let all = || JobFilter { r#type: "t".into(), ..Default::default() };
    let listed = globex.raw().list_jobs(ListJobsRequest { filter: Some(all()), ..Default::default() }).await.unwrap();
    assert!(listed.into_inner().jobs.is_empty(), "globex lists none of acme's jobs");
    let cancel = CancelJobsRequest { filter: Some(all()), dry_run: false };
    assert_eq!(globex.raw().cancel_jobs(cancel).await.unwrap().into_inner().matched, 0);
    // Naming acme's tenant is refused outright.
    let create = CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() };
    assert_eq!(globex.create(create).await.unwrap_err().code(), Code::PermissionDenied);
    let activate = ActivateJobsRequest {
        r#type: "t".into(),
        max_jobs_to_activate: 1,
        tenant_ids: vec!["acme".into()],
        ..Default::default()
    };
    assert_eq!(globex.raw().activate_jobs(activate).await.unwrap_err().code(), Code::PermissionDenied);
    let by_tenant = JobFilter { tenant_id: "acme".into(), ..Default::default() };
    let listing = globex.raw().list_jobs(ListJobsRequest { filter: Some(by_tenant), ..Default::default() }).await;
    assert_eq!(listing.unwrap_err().code(), Code::PermissionDenied);
    // acme sees and completes it.
    let found = acme.raw().get_job(GetJobRequest { key, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(found.job.unwrap().tenant_id, "acme");
    // The admin port: /actuator/jobs shows each principal its own tenants' jobs.
    let admin_addr = node.node().admin_addr.to_string();
    let jobs_as = |token: &str| {
        let header = format!("Authorization: Bearer {token}\r\n");
        let admin_addr = admin_addr.clone();
        async move { http_request_with("GET", &admin_addr, "/actuator/jobs", &header).await.unwrap() }
    };
    let (code, body) = jobs_as(tokens.secret("globex")).await;
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains(&format!("\"key\":{key}")), "globex's /actuator/jobs shows acme's job: {body}");
    let (code, body) = jobs_as(tokens.secret("acme")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("\"key\":{key}")), "acme's /actuator/jobs misses its job: {body}");
    acme.complete(key, 1, "{}").await.unwrap();
    // Worker sessions, by gRPC and on the admin port: only those of one's tenants.
    let register = RegisterWorkerRequest {
        worker_id: "acme-worker".into(),
        job_types: vec!["t".into()],
        tenant_ids: vec!["acme".into()],
        heartbeat_interval: 1_000,
        dead_after: 60_000,
        ..Default::default()
    };
    acme.raw().register_worker(register).await.unwrap();
    let listed = |client: Client| async move {
        let workers = client.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
        workers.iter().any(|w| w.worker_id == "acme-worker")
    };
    assert!(listed(admin.clone()).await, "the admin lists acme's worker");
    assert!(!listed(globex.clone()).await, "globex lists acme's worker");
    let header = format!("Authorization: Bearer {}\r\n", tokens.secret("globex"));
    let (code, body) = http_request_with("GET", &admin_addr, "/actuator/workers", &header).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("acme-worker"), "globex's /actuator/workers shows acme's worker: {body}");
}

/// AwaitJob looks before it waits: another tenant's job is NOT_FOUND at
/// once, not when it ends (which would tell that it exists, and when it ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_another_tenants_job_is_not_found_at_once() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let key = acme.create(CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() });
    let key = key.await.unwrap();
    let wait = AwaitJobRequest { key, timeout: 600_000, ..Default::default() };
    let refused = async {
        match globex.raw().await_job(wait).await {
            Err(status) => status,
            Ok(answers) => answers.into_inner().message().await.expect_err("globex awaits acme's job"),
        }
    };
    let refused = tokio::time::timeout(std::time::Duration::from_secs(30), refused)
        .await
        .expect("globex's await of acme's unfinished job is answered at once, not when it ends");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
}

/// A key just past the partition's counter that no create is making (a
/// typo, a probe) is NOT_FOUND once its create could have applied: never a
/// wait to the deadline answered as "no leader, retry".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_a_key_never_made_is_not_found_rather_than_unavailable() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let acme = as_token(&node, tokens.secret("acme"));
    let key = acme.create(CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() });
    let key = key.await.unwrap();
    for ahead in [1, 5] {
        let complete = CompleteJobRequest { key: key + ahead, attempt: 1, ..Default::default() };
        let error = acme.raw().complete_job(complete).await.expect_err("no such job");
        assert_eq!(error.code(), Code::NotFound, "key {}: {error:?}", key + ahead);
    }
    assert_eq!(acme.get_job(key).await.unwrap().state, "activatable", "the job that was made is untouched");
}

/// Keys are sequential, so a stranger can guess the next ones and aim at
/// jobs whose creates are still in flight. Such a command waits until the
/// job is known, and then finds it is not the stranger's: no job of acme's is
/// ever cancelled by globex, however the two race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_guessing_the_next_keys_never_acts_on_jobs_whose_creates_race_it() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let last = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..4)
        .map(|_| {
            let (acme, last) = (acme.clone(), Arc::clone(&last));
            tokio::spawn(async move {
                let mut keys = Vec::new();
                for _ in 0..150 {
                    let create =
                        CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() };
                    let key = acme.create(create).await.unwrap();
                    last.fetch_max(key, Ordering::Relaxed);
                    keys.push(key);
                }
                keys
            })
        })
        .collect();
    let attacker = {
        let (last, done) = (Arc::clone(&last), Arc::clone(&done));
        tokio::spawn(async move {
            let (mut tried, mut cancelled) = (0u32, Vec::new());
            while !done.load(Ordering::Relaxed) {
                let guess = last.load(Ordering::Relaxed);
                for ahead in 1..=4 {
                    tried += 1;
                    if globex.raw().cancel_job(CancelJobRequest { key: guess + ahead }).await.is_ok() {
                        cancelled.push(guess + ahead);
                    }
                }
            }
            (tried, cancelled)
        })
    };
    let mut keys = Vec::new();
    for producer in producers {
        keys.extend(producer.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    let (tried, cancelled) = attacker.await.unwrap();
    assert!(tried > 100, "the attacker made only {tried} attempts");
    assert!(cancelled.is_empty(), "globex cancelled acme's jobs {cancelled:?} ({tried} attempts)");
    for key in keys {
        assert_eq!(acme.get_job(key).await.unwrap().state, "activatable", "acme's job {key}");
    }
}

/// Attempt 0 acts whatever the job's attempt: a worker token may not send
/// it (its completions name their attempt); one that may manage the type may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_zero_is_an_operators_override_that_a_worker_token_may_not_send() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let admin = as_token(&node, tokens.secret("admin"));
    let worker = as_token(&node, tokens.secret("work"));
    let key = activated_job(&admin, "").await;
    let refused = worker.complete(key, 0, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "attempt 0 is no default: {refused:?}");
    let refused = worker.complete_overriding(key, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("jobs:manage:t"), "{}", refused.message());
    let fail = FailJobRequest { key, retries: 1, override_fence: true, ..Default::default() };
    let refused = worker.raw().fail_job(fail).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(admin.get_job(key).await.unwrap().state, "activated", "neither refusal touched the job");
    admin.complete_overriding(key, r#"{"by":"operator"}"#).await.expect("an operator's override");
    assert_eq!(admin.get_job(key).await.unwrap().state, "completed");
    // The history names who overrode the fence, after the completion.
    let history = admin.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await;
    let events = history.unwrap().into_inner().events;
    let last = events.last().expect("events");
    assert_eq!((last.kind.as_str(), last.attempt, last.user.as_str()), ("fence_overridden", 1, "admin"));
    // The worker's own completion lost to the override: not OK, and it says whose result stands.
    let lost = worker.complete(key, 1, r#"{"by":"worker"}"#).await.unwrap_err();
    assert_eq!(lost.code(), Code::FailedPrecondition, "{lost:?}");
    assert!(lost.message().contains("\"admin\", overriding the fence"), "{}", lost.message());
}

/// A backup holds every tenant's jobs: only a principal with cluster:admin
/// over every tenant may take, read or release one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_of_every_tenant_may_take_read_or_release_a_backup() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let start = |id: &str| StartBackupRequest { backup_id: id.into() };
    let read = |id: &str| ReadBackupRequest { backup_id: id.into(), partition_id: 0 };
    let release = |id: &str| ReleaseBackupRequest { backup_id: id.into() };
    for (name, why) in [("acme", "cluster:admin"), ("cluster-admin", "tenant")] {
        let client = as_token(&node, tokens.secret(name));
        let refused = client.raw().start_backup(start("b")).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{name}: {refused:?}");
        assert!(refused.message().contains(why), "{name}: {}", refused.message());
        let refused = client.raw().read_backup(read("b")).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{name} reads: {refused:?}");
        let refused = client.raw().release_backup(release("b")).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{name} releases: {refused:?}");
    }
    let admin = as_token(&node, tokens.secret("admin"));
    admin.raw().start_backup(start("b")).await.expect("the admin of every tenant takes a backup");
    let mut chunks = admin.raw().read_backup(read("b")).await.unwrap().into_inner();
    let mut described = false;
    while let Some(chunk) = chunks.message().await.unwrap() {
        described |= chunk.part.is_some();
    }
    assert!(described, "the admin reads the part whole");
    admin.raw().release_backup(release("b")).await.unwrap();
}

/// The cluster plan decides where every tenant's jobs live: changing it
/// takes cluster:admin over every tenant; reading it, cluster:read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_of_every_tenant_may_change_the_cluster_plan() {
    use drover::proto::gateway::change_cluster_plan_request::Change;
    use drover::proto::gateway::{ChangeClusterPlanRequest, GetClusterPlanRequest};
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let pause = || ChangeClusterPlanRequest { change: Some(Change::Pause(true)) };
    let grow = ChangeClusterPlanRequest { change: Some(Change::AddPartitionsTo(9)) };
    for (name, why) in [("acme", "cluster:admin"), ("cluster-admin", "tenant"), ("cluster-read", "cluster:admin")] {
        for change in [pause(), grow.clone()] {
            let refused = as_token(&node, tokens.secret(name)).raw().change_cluster_plan(change.clone()).await;
            let refused = refused.unwrap_err();
            assert_eq!(refused.code(), Code::PermissionDenied, "{name} {change:?}: {refused:?}");
            assert!(refused.message().contains(why), "{name}: {}", refused.message());
        }
    }
    for name in ["nothing", "create"] {
        let refused = as_token(&node, tokens.secret(name)).raw().get_cluster_plan(GetClusterPlanRequest {}).await;
        assert_eq!(refused.unwrap_err().code(), Code::PermissionDenied, "{name} reads the plan");
    }
    let admin = as_token(&node, tokens.secret("admin"));
    let paused = admin.raw().change_cluster_plan(pause()).await.expect("the admin pauses the plan").into_inner();
    assert!(paused.paused && paused.changed, "{paused:?}");
    let reader = as_token(&node, tokens.secret("cluster-read"));
    let read = reader.raw().get_cluster_plan(GetClusterPlanRequest {}).await.expect("cluster:read reads it");
    assert!(read.into_inner().paused, "the change is partition 0's");
}

async fn within<T>(
    seconds: u64,
    future: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(std::time::Duration::from_secs(seconds), future).await
}

/// A completion for someone else's job frees no room on the stream that
/// holds it: the worker with one job in flight is offered no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_completion_makes_no_room_on_a_workers_stream() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let open = StreamActivatedJobsRequest {
        r#type: "t".into(),
        worker: "acme-streamer".into(),
        timeout: 600_000,
        tenant_ids: vec!["acme".into()],
        max_jobs_in_flight: 1,
        ..Default::default()
    };
    let mut stream = acme.raw().stream_activated_jobs(open).await.unwrap().into_inner();
    for _ in 0..2 {
        acme.create(CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() })
            .await
            .unwrap();
    }
    let first = within(30, stream.message()).await.expect("the first job is pushed").unwrap().unwrap();
    let refused = globex.complete(first.key, first.attempt, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    // Nothing to wait for but an absence: a second push would come in milliseconds.
    assert!(within(3, stream.message()).await.is_err(), "globex's completion made room for a second job");
    acme.complete(first.key, first.attempt, "{}").await.unwrap();
    let second = within(30, stream.message()).await.expect("the second job once the first is done").unwrap().unwrap();
    assert_ne!(second.key, first.key);
}

/// An activation of one job of type `t` for `tenant` under `session`.
fn activate_under(session: u64, tenant: &str) -> ActivateJobsRequest {
    ActivateJobsRequest {
        r#type: "t".into(),
        max_jobs_to_activate: 1,
        timeout: 600_000,
        tenant_ids: vec![tenant.into()],
        session_id: session,
        ..Default::default()
    }
}

/// A session `acme` registers (labelled `pool:shared`), holding one acme job
/// it activated under it: the session, the job's key and its attempt.
async fn acme_session_holding_a_job(acme: &Client) -> (u64, u64, u32) {
    let register = RegisterWorkerRequest {
        worker_id: "acme-worker".into(),
        job_types: vec!["t".into()],
        tenant_ids: vec!["acme".into()],
        labels: vec!["pool:shared".into()],
        heartbeat_interval: 1_000,
        dead_after: 60_000,
        ..Default::default()
    };
    let session = acme.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let key = acme.create(CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() });
    let key = key.await.unwrap();
    let mut answers = acme.raw().activate_jobs(activate_under(session, "acme")).await.unwrap().into_inner();
    let held = answers.message().await.unwrap().unwrap().jobs;
    assert_eq!(held.iter().map(|j| j.key).collect::<Vec<_>>(), [key], "acme's session holds acme's job");
    (session, key, held[0].attempt)
}

/// A worker session belongs to its tenants: another tenant's token can
/// neither beat it (and so get tokens for its jobs), end it, activate as it
/// nor direct it, and only those who may direct a session see its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_worker_session_is_neither_beaten_ended_used_nor_directed() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let globex_manager = as_token(&node, tokens.secret("globex-workers"));
    let (session, key, attempt) = acme_session_holding_a_job(&acme).await;
    let activate = |tenant: &str| activate_under(session, tenant);
    let beat = HeartbeatRequest { session_id: session, jobs: vec![HeldJob { key, attempt }], ..Default::default() };

    let refused = globex.raw().heartbeat(beat.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "globex beats acme's session: {refused:?}");
    let refused = globex.raw().deregister_worker(DeregisterWorkerRequest { session_id: session }).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "globex ends acme's session: {refused:?}");
    let refused = globex.raw().activate_jobs(activate("globex")).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "globex activates as acme's session: {refused:?}");

    let direct = |session_id: u64, label: &str, all: bool| SetWorkerStateRequest {
        session_id,
        label: label.into(),
        all,
        state: "terminate".into(),
    };
    let refused = globex_manager.raw().set_worker_state(direct(0, "", true)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "all=true without tenant *: {refused:?}");
    let refused = globex_manager.raw().set_worker_state(direct(session, "", false)).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "globex directs acme's session: {refused:?}");
    let directed = globex_manager.raw().set_worker_state(direct(0, "pool:shared", false)).await.unwrap();
    assert!(directed.into_inner().workers.is_empty(), "a label directs only globex's own sessions");
    let listed = globex_manager.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner();
    assert!(listed.workers.is_empty(), "globex lists acme's worker: {:?}", listed.workers);

    // acme reads its job and its workers without session ids: it may not direct them.
    assert_eq!(acme.get_job(key).await.unwrap().session_id, 0);
    let listed = acme.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
    assert_eq!(listed.iter().map(|w| (w.worker_id.as_str(), w.session_id)).collect::<Vec<_>>(), [("acme-worker", 0)]);
    // The admin, who may, sees it.
    let admin = as_token(&node, tokens.secret("admin"));
    assert_eq!(admin.get_job(key).await.unwrap().session_id, session);

    // acme's own session was untouched: it beats on, holding its job.
    let beaten = acme.raw().heartbeat(beat).await.unwrap().into_inner();
    assert_eq!((beaten.state.as_str(), beaten.revoked.len()), ("running", 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_its_registrants_and_a_peer_of_its_tenant_may_not_act_as_it() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, peer) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("acme-peer")));
    let manager = as_token(&node, tokens.secret("acme-workers"));
    let (session, key, attempt) = acme_session_holding_a_job(&acme).await;
    let activate = activate_under(session, "acme");
    let beat = HeartbeatRequest { session_id: session, jobs: vec![HeldJob { key, attempt }], state: "quiet".into() };

    // A peer of the same tenant, with the same scopes, that learned the id.
    let refused = peer.raw().heartbeat(beat.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "a peer beats acme's session: {refused:?}");
    assert!(refused.message().contains("acme-peer may not act as worker session"), "{}", refused.message());
    let refused = peer.raw().deregister_worker(DeregisterWorkerRequest { session_id: session }).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "a peer ends acme's session: {refused:?}");
    let refused = peer.raw().activate_jobs(activate.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "a peer activates as acme's session: {refused:?}");
    let stream = StreamActivatedJobsRequest {
        r#type: "t".into(),
        timeout: 600_000,
        tenant_ids: vec!["acme".into()],
        session_id: session,
        ..Default::default()
    };
    let refused = peer.raw().stream_activated_jobs(stream.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "a peer streams as acme's session: {refused:?}");
    // Nor does the job's history hand it the session's id.
    let history = peer.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await.unwrap();
    assert!(history.into_inner().events.iter().all(|e| e.session_id == 0), "the history shows the session id");

    // Its owner's session is as it was: running, holding its job.
    let owner_beat = HeartbeatRequest { state: String::new(), ..beat.clone() };
    let beaten = acme.raw().heartbeat(owner_beat).await.unwrap().into_inner();
    assert_eq!((beaten.state.as_str(), beaten.revoked.len()), ("running", 0));
    // acme's operator of workers may act as it; so may its owner.
    let beaten = manager.raw().heartbeat(beat).await.unwrap().into_inner();
    assert_eq!(beaten.revoked.len(), 0);
    let opened = acme.raw().stream_activated_jobs(stream.clone()).await;
    assert!(opened.is_ok(), "its owner streams as it: {:?}", opened.err());
    acme.raw().deregister_worker(DeregisterWorkerRequest { session_id: session }).await.unwrap();
    // The gateway remembers the session's labels, not that it lives: an
    // ended session's stream is refused, to its owner and to the admin.
    let admin = as_token(&node, tokens.secret("admin"));
    for (who, client) in [("its owner", &acme), ("the admin", &admin)] {
        let refused = client.raw().stream_activated_jobs(stream.clone()).await.unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{who} streams as an ended session: {refused:?}");
    }
}

/// `/actuator/jobs` answers a page at a time, of the caller's tenants only,
/// and following `next` lists each of them once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actuators_jobs_page_through_the_callers_tenants() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let mut mine = Vec::new();
    for n in 0..5 {
        let create = |tenant: &str| CreateJobRequest {
            r#type: "t".into(),
            tenant_id: tenant.into(),
            variables: format!(r#"{{"n":{n}}}"#),
            ..Default::default()
        };
        mine.push(acme.create(create("acme")).await.unwrap());
        globex.create(create("globex")).await.unwrap();
    }
    let admin_addr = node.node().admin_addr.to_string();
    let header = format!("Authorization: Bearer {}\r\n", tokens.secret("acme"));
    let (mut listed, mut path, mut pages) = (Vec::new(), "/actuator/jobs?limit=2".to_string(), 0);
    loop {
        let (code, body) = http_request_with("GET", &admin_addr, &path, &header).await.unwrap();
        assert_eq!(code, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let jobs = page["jobs"].as_array().unwrap();
        assert!(jobs.len() <= 2, "a page of at most the limit: {body}");
        assert!(jobs.iter().all(|j| j["tenant"] == "acme"), "only acme's jobs: {body}");
        listed.extend(jobs.iter().map(|j| j["key"].as_u64().unwrap()));
        pages += 1;
        match page["next"].as_u64() {
            Some(after) => path = format!("/actuator/jobs?limit=2&after={after}"),
            None => break,
        }
        assert!(pages < 20, "the pages never end: {listed:?}");
    }
    listed.sort_unstable();
    mine.sort_unstable();
    assert_eq!(listed, mine, "every one of acme's jobs, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_needs_a_token_with_the_route_scope_but_the_probes_do_not() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let addr = node.node().admin_addr.to_string();
    let get = |path: &'static str, token: Option<&str>, method: &'static str| {
        let header = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let addr = addr.clone();
        async move { http_request_with(method, &addr, path, &header).await.unwrap().0 }
    };
    assert_eq!(get("/health", None, "GET").await, 200);
    assert_eq!(get("/ready", None, "GET").await, 200);
    for path in ["/metrics", "/actuator/partitions", "/actuator/workers", "/actuator/jobstreams", "/actuator/jobs"] {
        assert_eq!(get(path, None, "GET").await, 401, "{path} without a token");
        assert_eq!(get(path, Some("drv_unknown"), "GET").await, 401, "{path} with an unknown token");
    }
    // Job scopes alone do not open the replicas' job listing.
    assert_eq!(get("/actuator/jobs", Some(tokens.secret("work")), "GET").await, 403);
    let reader = Some(tokens.secret("cluster-read"));
    assert_eq!(get("/metrics", reader, "GET").await, 200);
    assert_eq!(get("/actuator/partitions", reader, "GET").await, 200);
    assert_eq!(get("/metrics", Some(tokens.secret("work")), "GET").await, 403);
    assert_eq!(get("/actuator/workers/quiet?label=pool:x", reader, "POST").await, 403);
    assert_eq!(get("/actuator/workers/quiet?label=pool:x", Some(tokens.secret("workers")), "POST").await, 200);
    assert_eq!(get("/actuator/failpoints/x?count=1", Some(tokens.secret("workers")), "PUT").await, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_from_the_configured_issuer_verify_and_expired_or_foreign_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = write_signing_key(dir.path()).unwrap();
    let jwks = dir.path().join("jwks.json");
    let node = LocalNode::start_with(move |config| {
        config.auth.jwks_file = Some(jwks);
        config.auth.jwt_issuers = vec!["https://issuer.example".into()];
    })
    .await;
    let scopes = vec!["jobs:create:t".to_string()];
    let tenants = vec!["<default>".to_string()];
    let sign = |issuer: &str, ttl: u64| {
        create_token(&key.private_pem, issuer, "producer", &scopes, &tenants, Duration::from_secs(ttl)).unwrap()
    };
    let good = node.client.with_token(&sign("https://issuer.example", 60)).unwrap();
    good.create_job("t", "{}").await.expect("a valid JWT creates");
    let denied = good.create_job("u", "{}").await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(denied.message().contains("jobs:create:u"), "{}", denied.message());
    let foreign = node.client.with_token(&sign("https://elsewhere.example", 60)).unwrap();
    let refused = foreign.create_job("t", "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("issuer"), "{}", refused.message());
    // Expired an hour ago: past any leeway.
    let pem = key.private_pem.clone();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = serde_json::json!({"iss": "https://issuer.example", "sub": "p", "exp": now - 3600, "scope": "jobs:*"});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(key.key_id.clone());
    let expired =
        jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap())
            .unwrap();
    let refused = node.client.with_token(&expired).unwrap().create_job("t", "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("expired"), "{}", refused.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_command_is_screened_by_the_leader_against_the_gateways_principal() {
    let tokens = Tokens::new();
    let file = tokens.file.display().to_string();
    let cluster = ProcessCluster::start(3, 3, 3, &["--tokens-file", &file]);
    // The admin port wants a token too: partition 1's leader, from Topology.
    let any = Client::connect_lazy(&cluster.gateway(0)).unwrap().with_token(tokens.secret("admin")).unwrap();
    let started = std::time::Instant::now();
    let leader = loop {
        if let Ok(topology) = any.raw().topology(TopologyRequest {}).await {
            let leader = topology.into_inner().brokers.iter().find_map(|b| {
                b.partitions.iter().any(|p| p.partition_id == 1 && p.role == "leader").then_some(b.node_id as usize)
            });
            if let Some(leader) = leader {
                break Some(leader);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(30), "partition 1 has no leader after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leader = leader.unwrap();
    let gateway = (leader + 1) % 3;
    let client =
        |name: &str| Client::connect_lazy(&cluster.gateway(gateway)).unwrap().with_token(tokens.secret(name)).unwrap();
    // Created through the leader's own gateway: a keyless create goes to a
    // partition its gateway's node leads, in turn.
    let creator = Client::connect_lazy(&cluster.gateway(leader)).unwrap().with_token(tokens.secret("admin")).unwrap();
    let mut tries = 0;
    let key = loop {
        let key = activated_job(&creator, "acme").await;
        if drover::core::JobKey(key).partition() == 1 {
            break key;
        }
        tries += 1;
        assert!(tries < 50, "50 creates through node {leader}, partition 1's leader, and none landed on partition 1");
    };
    let refused = client("globex").complete(key, 1, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "another tenant's job through a forward: {refused:?}");
    let refused = client("work").complete(key, 1, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "the default tenant's worker: {refused:?}");
    client("acme").complete(key, 1, "{}").await.expect("acme completes its job through a forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_past_its_stream_or_call_limit_is_resource_exhausted_and_others_are_not() {
    let tokens = Tokens::new();
    let file = tokens.file.clone();
    let node = LocalNode::start_with(move |config| {
        config.auth.tokens_file = Some(file);
        config.auth.streams = 1;
        config.auth.requests_per_second = 5;
    })
    .await;
    let (work, admin) = (as_token(&node, tokens.secret("work")), as_token(&node, tokens.secret("admin")));
    let stream = || StreamActivatedJobsRequest { r#type: "t".into(), timeout: 60_000, ..Default::default() };
    let first = work.raw().stream_activated_jobs(stream()).await.expect("the first stream opens");
    let second = work.raw().stream_activated_jobs(stream()).await.unwrap_err();
    assert_eq!(second.code(), Code::ResourceExhausted, "{second:?}");
    assert!(second.message().contains("--principal-streams"), "{}", second.message());
    admin.raw().stream_activated_jobs(stream()).await.expect("another principal's stream opens");
    // An event watch holds a stream permit too, counted with job streams.
    let acme = as_token(&node, tokens.secret("acme"));
    let watch = acme.raw().watch_events(WatchEventsRequest::default()).await.expect("the first watch opens");
    for refused in [
        acme.raw().watch_events(WatchEventsRequest::default()).await.map(drop).unwrap_err(),
        acme.raw()
            .stream_activated_jobs(StreamActivatedJobsRequest { tenant_ids: vec!["acme".into()], ..stream() })
            .await
            .map(drop)
            .unwrap_err(),
    ] {
        assert_eq!(refused.code(), Code::ResourceExhausted, "past acme's one stream: {refused:?}");
        assert!(refused.message().contains("--principal-streams"), "{}", refused.message());
    }
    drop(watch);
    drop(first);
    // The slot comes back when the server sees the stream close.
    let started = std::time::Instant::now();
    loop {
        match work.raw().stream_activated_jobs(stream()).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {}
            Err(other) => panic!("reopening the stream: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the closed stream's slot never came back");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Calls: a burst past 5 a second is refused for this principal only.
    let mut refused = 0;
    for _ in 0..20 {
        match work.raw().topology(TopologyRequest {}).await {
            Ok(_) => {}
            Err(status) if status.code() == Code::ResourceExhausted => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(refused >= 10, "20 calls at once past a limit of 5 a second: only {refused} refused");
    admin.raw().topology(TopologyRequest {}).await.expect("another principal is not limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_token_works_its_own_job_and_attempt_and_nothing_else() {
    let tokens = Tokens::new();
    let (file, key_file) = (tokens.file.clone(), tokens.file.with_file_name("job-token.key"));
    std::fs::write(&key_file, generate_secret()).unwrap();
    let node = LocalNode::start_with(move |config| {
        config.auth.tokens_file = Some(file);
        config.auth.job_token_key = Some(key_file);
    })
    .await;
    let admin = as_token(&node, tokens.secret("admin"));
    let work = as_token(&node, tokens.secret("work"));
    let (a, b) = (admin.create_job("t", "{}").await.unwrap(), admin.create_job("t", "{}").await.unwrap());
    let activate =
        ActivateJobsRequest { r#type: "t".into(), max_jobs_to_activate: 2, timeout: 60_000, ..Default::default() };
    let jobs =
        work.raw().activate_jobs(activate.clone()).await.unwrap().into_inner().message().await.unwrap().unwrap().jobs;
    assert_eq!(jobs.len(), 2);
    let job_a = jobs.iter().find(|j| j.key == a).unwrap().clone();
    let job_b = jobs.iter().find(|j| j.key == b).unwrap().clone();
    assert!(job_a.job_token.starts_with("drj_"), "an activation carries a job token: {:?}", job_a.job_token);
    let as_job_a = node.client.with_token(&job_a.job_token).unwrap();
    // Not another job, not another RPC.
    let other = as_job_a.complete(b, job_b.attempt, "{}").await.unwrap_err();
    assert_eq!(other.code(), Code::PermissionDenied, "{other:?}");
    assert!(other.message().contains("its own job"), "{}", other.message());
    let read = as_job_a.raw().get_job(GetJobRequest { key: a, ..Default::default() }).await.unwrap_err();
    // It has no tenants: even its own job is not there to read.
    assert_eq!(read.code(), Code::NotFound, "a job token reads nothing: {read:?}");
    let create = as_job_a.create_job("t", "{}").await.unwrap_err();
    assert_eq!(create.code(), Code::PermissionDenied, "a job token creates nothing: {create:?}");
    // Renewed by UpdateJobTimeout, and still only for this attempt.
    let renewed = as_job_a
        .raw()
        .update_job_timeout(UpdateJobTimeoutRequest {
            key: a,
            attempt: job_a.attempt,
            timeout: 120_000,
            override_fence: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(renewed.job_token.starts_with("drj_") && renewed.job_token != job_a.job_token);
    // Fail it back: the next attempt is another activation, which this token is not.
    let fail =
        FailJobRequest { key: a, attempt: job_a.attempt, retries: 3, reason: "failed".into(), ..Default::default() };
    as_job_a.raw().fail_job(fail).await.expect("a job token fails its own attempt");
    let again =
        work.raw().activate_jobs(activate.clone()).await.unwrap().into_inner().message().await.unwrap().unwrap().jobs;
    let next = again.iter().find(|j| j.key == a).expect("job a again");
    assert!(next.attempt > job_a.attempt);
    let stale = node.client.with_token(&renewed.job_token).unwrap().complete(a, next.attempt, "{}").await.unwrap_err();
    assert_eq!(stale.code(), Code::PermissionDenied, "the last attempt's token on the next attempt: {stale:?}");
    node.client
        .with_token(&next.job_token)
        .unwrap()
        .complete(a, next.attempt, "{}")
        .await
        .expect("its own token completes it");
    // A token altered to name job b does not verify at all.
    let forged = job_a.job_token.replacen(&format!("drj_{a}_"), &format!("drj_{b}_"), 1);
    let refused = node.client.with_token(&forged).unwrap().complete(b, job_b.attempt, "{}").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // A heartbeat renews the tokens of the jobs its session holds, and mints
    // none for a job it lists but does not hold (job b, activated without it).
    let register = RegisterWorkerRequest { worker_id: "w".into(), job_types: vec!["t".into()], ..Default::default() };
    let session = work.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let c = admin.create_job("t", "{}").await.unwrap();
    let with_session = ActivateJobsRequest { session_id: session, max_jobs_to_activate: 1, ..activate.clone() };
    let held = work.raw().activate_jobs(with_session).await.unwrap().into_inner().message().await.unwrap().unwrap();
    let job_c = held.jobs.into_iter().find(|j| j.key == c).expect("job c, for the session");
    let jobs = vec![HeldJob { key: c, attempt: job_c.attempt }, HeldJob { key: b, attempt: job_b.attempt }];
    let beat = HeartbeatRequest { session_id: session, state: "running".into(), jobs };
    let answer = work.raw().heartbeat(beat).await.unwrap().into_inner();
    let minted: Vec<u64> = answer.job_tokens.iter().map(|t| t.key).collect();
    assert_eq!(minted, [c], "a token for the session's own job only: {answer:?}");
    let renewed = node.client.with_token(&answer.job_tokens[0].token).unwrap();
    renewed.complete(c, job_c.attempt, "{}").await.expect("the renewed token completes its job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_library_reports_each_outcome_with_the_jobs_own_token() {
    let tokens = Tokens::new();
    let (file, key_file) = (tokens.file.clone(), tokens.file.with_file_name("job-token.key"));
    std::fs::write(&key_file, generate_secret()).unwrap();
    let node = LocalNode::start_with(move |config| {
        config.auth.tokens_file = Some(file);
        config.auth.job_token_key = Some(key_file);
    })
    .await;
    let admin = as_token(&node, tokens.secret("admin"));
    let job_token_calls = || async {
        let header = format!("Authorization: Bearer {}\r\n", tokens.secret("cluster-read"));
        let (_, body) =
            http_request_with("GET", &node.node().admin_addr.to_string(), "/metrics", &header).await.unwrap();
        body.lines()
            .find(|l| l.starts_with("drover_auth_job_token_calls_total"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = job_token_calls().await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.push(admin.create_job("t", "{}").await.unwrap());
    }
    let options = drover::client::WorkerOptions { session: true, ..drover::client::WorkerOptions::new("t") };
    let worker = drover::client::Worker::new(as_token(&node, tokens.secret("work")), options);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running =
        tokio::spawn(worker.run(|_job| async { drover::client::JobOutcome::Complete("{}".into()) }, async move {
            let _ = stop_rx.await;
        }));
    common::eventually(Duration::from_secs(20), "the worker to complete its three jobs", || {
        let admin = admin.clone();
        let keys = keys.clone();
        async move {
            for key in keys {
                if !admin.get_job(key).await.is_ok_and(|j| j.state == "completed") {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let after = job_token_calls().await;
    assert!(after - before >= 3.0, "three completions, {} of them with job tokens", after - before);
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
}

/// The Zeebe gateway's RPCs, each on job type `t`.
#[derive(Clone, Copy, Debug)]
enum ZeebeRpc {
    ActivateJobs,
    StreamActivatedJobs,
    CompleteJob,
    FailJob,
    ThrowError,
    UpdateJobRetries,
    UpdateJobTimeout,
    Topology,
}

impl ZeebeRpc {
    const ALL: [ZeebeRpc; 8] = [
        ZeebeRpc::ActivateJobs,
        ZeebeRpc::StreamActivatedJobs,
        ZeebeRpc::CompleteJob,
        ZeebeRpc::FailJob,
        ZeebeRpc::ThrowError,
        ZeebeRpc::UpdateJobRetries,
        ZeebeRpc::UpdateJobTimeout,
        ZeebeRpc::Topology,
    ];

    fn allowed(self) -> &'static [&'static str] {
        match self {
            ZeebeRpc::UpdateJobRetries => &["admin", "manage"],
            ZeebeRpc::Topology => {
                &["admin", "create", "work", "read", "manage", "workers", "cluster-read", "cluster-admin", "nothing"]
            }
            _ => &["admin", "work"],
        }
    }

    async fn call(self, client: &mut ZeebeClient, key: i64) -> Result<(), tonic::Status> {
        use drover::proto::zeebe as zb;
        match self {
            ZeebeRpc::ActivateJobs => {
                let request = zb::ActivateJobsRequest {
                    r#type: "t".into(),
                    worker: "z".into(),
                    timeout: 60_000,
                    max_jobs_to_activate: 1,
                    request_timeout: -1,
                    ..Default::default()
                };
                client.activate_jobs(request).await.map(drop)
            }
            ZeebeRpc::StreamActivatedJobs => {
                let request =
                    zb::StreamActivatedJobsRequest { r#type: "t".into(), timeout: 60_000, ..Default::default() };
                client.stream_activated_jobs(request).await.map(drop)
            }
            ZeebeRpc::CompleteJob => {
                client.complete_job(zb::CompleteJobRequest { job_key: key, variables: String::new() }).await.map(drop)
            }
            ZeebeRpc::FailJob => {
                let request = zb::FailJobRequest { job_key: key, retries: 1, ..Default::default() };
                client.fail_job(request).await.map(drop)
            }
            ZeebeRpc::ThrowError => {
                let request = zb::ThrowErrorRequest { job_key: key, error_code: "e".into(), ..Default::default() };
                client.throw_error(request).await.map(drop)
            }
            ZeebeRpc::UpdateJobRetries => {
                let request = zb::UpdateJobRetriesRequest { job_key: key, retries: 3 };
                client.update_job_retries(request).await.map(drop)
            }
            ZeebeRpc::UpdateJobTimeout => {
                let request = zb::UpdateJobTimeoutRequest { job_key: key, timeout: 60_000 };
                client.update_job_timeout(request).await.map(drop)
            }
            ZeebeRpc::Topology => client.topology(zb::TopologyRequest {}).await.map(drop),
        }
    }
}

type ZeebeClient = drover::proto::zeebe::gateway_client::GatewayClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, drover::client::Bearer>,
>;

async fn zeebe_as(node: &LocalNode, token: Option<&str>) -> ZeebeClient {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.node().grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    drover::proto::zeebe::gateway_client::GatewayClient::with_interceptor(
        channel,
        drover::client::Bearer::new(token).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scope_allows_exactly_its_zeebe_rpcs() {
    use drover::proto::zeebe as zb;
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let admin = as_token(&node, tokens.secret("admin"));
    let mut admin_zeebe = zeebe_as(&node, Some(tokens.secret("admin"))).await;
    let mut failures = Vec::new();
    for rpc in ZeebeRpc::ALL {
        for name in std::iter::once(None).chain(NAMES.iter().map(|(name, _)| Some(*name))) {
            // A job activated through the Zeebe gateway: its key is the activation's.
            let created = admin.create_job("t", "{}").await.unwrap();
            let mut request = zb::ActivateJobsRequest {
                r#type: "t".into(),
                worker: "admin".into(),
                timeout: 600_000,
                max_jobs_to_activate: 100,
                request_timeout: -1,
                ..Default::default()
            };
            // Jobs an earlier RPC made activatable again come back too; ask
            // until the new one is among them (bounded).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut key = None;
            while key.is_none() && tokio::time::Instant::now() < deadline {
                let mut answers = admin_zeebe.activate_jobs(request.clone()).await.unwrap().into_inner();
                // Asking again, wait (up to 1 s) for jobs rather than spin.
                request.request_timeout = 1_000;
                while let Some(reply) = answers.message().await.unwrap() {
                    let ours = |j: &&zb::ActivatedJob| {
                        drover::gateway::zeebe::job_of(j.key).is_ok_and(|(k, _)| k.0 == created)
                    };
                    key = key.or(reply.jobs.iter().find(ours).map(|j| j.key));
                }
            }
            let key = key.unwrap_or_else(|| panic!("job {created} was not activated through Zeebe within 10 s"));
            let mut client = zeebe_as(&node, name.map(|n| tokens.secret(n))).await;
            let answer = rpc.call(&mut client, key).await;
            let code = answer.as_ref().err().map(|s| s.code());
            let wrong = match name {
                None => (code != Some(Code::Unauthenticated)).then(|| "not UNAUTHENTICATED".to_string()),
                Some(name) if rpc.allowed().contains(&name) => {
                    matches!(code, Some(Code::PermissionDenied | Code::Unauthenticated))
                        .then(|| format!("refused to {name}, whose scope allows it"))
                }
                Some(name) => {
                    (code != Some(Code::PermissionDenied)).then(|| format!("not PERMISSION_DENIED for {name}"))
                }
            };
            if let Some(wrong) = wrong {
                failures.push(format!("{rpc:?}: {answer:?}, {wrong}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} wrong answers:\n{}", failures.len(), failures.join("\n"));
}

/// Every administrative action leaves one JSON audit line naming who did
/// what to which jobs; and a node without TLS says in its log that it
/// serves plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn administrative_actions_are_audited_and_plaintext_is_announced() {
    let tokens = Tokens::new();
    let dir = tempfile::tempdir().unwrap();
    let file = tokens.file.display().to_string();
    let (mut node, stderr) = common::NodeProcess::start_capturing_stderr(
        dir.path(),
        &["--tokens-file", &file, "--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let admin = Client::connect(&node.grpc).await.unwrap().with_token(tokens.secret("admin")).unwrap();
    let (a, b) = (admin.create_job("t", "{}").await.unwrap(), admin.create_job("t", "{}").await.unwrap());
    admin.raw().update_job_retries(UpdateJobRetriesRequest { key: a, retries: 5 }).await.unwrap();
    admin.raw().cancel_job(CancelJobRequest { key: b }).await.unwrap();
    let filter = JobFilter { r#type: "t".into(), ..Default::default() };
    admin.raw().cancel_jobs(CancelJobsRequest { filter: Some(filter), dry_run: false }).await.unwrap();
    let direct = SetWorkerStateRequest { all: true, state: "quiet".into(), ..Default::default() };
    admin.raw().set_worker_state(direct).await.unwrap();
    node.signal(libc::SIGTERM);
    node.exited(Duration::from_secs(30)).await;
    let log = stderr.join().unwrap();

    let audits: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["target"] == "drover::audit")
        .map(|line| serde_json::from_str(line["fields"]["message"].as_str().unwrap_or_default()).unwrap())
        .collect();
    let actions: Vec<&str> = audits.iter().map(|a| a["action"].as_str().unwrap_or_default()).collect();
    assert_eq!(actions, ["update_job_retries", "cancel_job", "cancel_jobs", "set_worker_state"], "{log}");
    assert!(audits.iter().all(|a| a["principal"] == "admin"), "each names who: {audits:?}");
    assert_eq!(audits[0]["details"]["jobs"], serde_json::json!([a]), "which job: {audits:?}");
    assert_eq!(audits[1]["details"]["jobs"], serde_json::json!([b]));
    assert_eq!(audits[2]["details"]["jobs"], serde_json::json!([a]), "the bulk cancel names what it cancelled");
    assert!(log.contains("serving PLAINTEXT"), "a node without TLS says so: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_pauses_and_sees_its_own_queues_only() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let admin = as_token(&node, tokens.secret("admin"));
    for (client, tenant) in [(&acme, "acme"), (&globex, "globex")] {
        client
            .create(CreateJobRequest { r#type: "t".into(), tenant_id: tenant.into(), ..Default::default() })
            .await
            .unwrap();
    }
    let pause = |tenant: &str| SetQueuePausedRequest { r#type: "t".into(), tenant_id: tenant.into(), paused: true };
    let refused = acme.raw().set_queue_paused(pause("globex")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Nor may it limit (or lift the limit of) another tenant's queue.
    let limit = |tenant: &str| SetQueueLimitRequest {
        r#type: "t".into(),
        tenant_id: tenant.into(),
        limit: Some(QueueLimit {
            queue: Some(LimitLevel { concurrency: 1, ..Default::default() }),
            ..Default::default()
        }),
    };
    let refused = acme.raw().set_queue_limit(limit("globex")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let limited = acme.raw().set_queue_limit(limit("acme")).await.expect("acme limits its own queue").into_inner();
    assert_eq!(limited.queue.map(|q| (q.tenant_id, q.limit.is_some())), Some(("acme".to_string(), true)));
    acme.raw()
        .set_queue_limit(SetQueueLimitRequest { r#type: "t".into(), tenant_id: "acme".into(), limit: None })
        .await
        .expect("and lifts it");
    acme.raw().set_queue_paused(pause("acme")).await.expect("acme pauses its own queue");
    // globex's queue of the same type runs on.
    let activate = ActivateJobsRequest {
        r#type: "t".into(),
        max_jobs_to_activate: 10,
        timeout: 60_000,
        tenant_ids: vec!["globex".into()],
        ..Default::default()
    };
    let mut answers = globex.raw().activate_jobs(activate).await.unwrap().into_inner();
    assert_eq!(answers.message().await.unwrap().map(|a| a.jobs.len()), Some(1), "globex's job is activated");
    let listed = |client: &Client| {
        let client = client.clone();
        async move {
            let queues = client.raw().list_queues(ListQueuesRequest::default()).await.unwrap().into_inner().queues;
            queues.into_iter().map(|q| (q.tenant_id, q.paused)).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(&acme).await, vec![("acme".to_string(), true)]);
    assert_eq!(listed(&globex).await, vec![("globex".to_string(), false)]);
    assert_eq!(listed(&admin).await, vec![("acme".to_string(), true), ("globex".to_string(), false)]);
    let peek = ListQueuesRequest { tenant_id: "globex".into(), ..Default::default() };
    assert_eq!(acme.raw().list_queues(peek).await.unwrap_err().code(), Code::PermissionDenied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_event_watch_hears_only_its_own_jobs() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let peek = WatchEventsRequest { tenant_id: "globex".into(), ..Default::default() };
    assert_eq!(acme.raw().watch_events(peek).await.err().map(|e| e.code()), Some(Code::PermissionDenied));
    let mut events = acme.raw().watch_events(WatchEventsRequest::default()).await.unwrap().into_inner();
    globex
        .create(CreateJobRequest { r#type: "t".into(), tenant_id: "globex".into(), ..Default::default() })
        .await
        .unwrap();
    let mine = acme.create(CreateJobRequest { r#type: "t".into(), tenant_id: "acme".into(), ..Default::default() });
    let mine = mine.await.unwrap();
    let first = within(30, events.message()).await.expect("acme's create is heard").unwrap().unwrap();
    assert_eq!((first.key, first.tenant_id.as_str(), first.kind.as_str()), (mine, "acme", "created"), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_schedule_is_invisible_and_untouchable() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let in_acme = |name: &str| GetScheduleRequest { name: name.into(), tenant_id: "acme".into() };
    let put = PutScheduleRequest { tenant_id: "acme".into(), ..schedule_t() };
    acme.raw().put_schedule(put.clone()).await.expect("acme schedules in its tenant");
    // Named in acme's tenant, every schedule RPC is refused to globex.
    let answer = globex.raw().put_schedule(put).await;
    assert!(matches!(&answer, Err(s) if s.code() == Code::PermissionDenied), "{answer:?}");
    for answer in [
        globex.raw().get_schedule(in_acme("s")).await.map(drop),
        globex.raw().delete_schedule(in_acme("s")).await.map(drop),
        globex
            .raw()
            .set_schedule_paused(SetSchedulePausedRequest { name: "s".into(), tenant_id: "acme".into(), paused: true })
            .await
            .map(drop),
        globex.raw().list_schedules(ListSchedulesRequest { tenant_id: "acme".into() }).await.map(drop),
    ] {
        assert!(matches!(&answer, Err(s) if s.code() == Code::PermissionDenied), "{answer:?}");
    }
    // In its own tenant there is no such schedule, and its listing is empty.
    let in_globex = GetScheduleRequest { name: "s".into(), tenant_id: "globex".into() };
    let answer = globex.raw().get_schedule(in_globex).await;
    assert!(matches!(&answer, Err(s) if s.code() == Code::NotFound), "{answer:?}");
    let listed = globex.raw().list_schedules(ListSchedulesRequest::default()).await.unwrap().into_inner();
    assert!(listed.schedules.is_empty(), "globex sees {:?}", listed.schedules);
    let schedule = acme.raw().get_schedule(in_acme("s")).await.expect("acme's schedule").into_inner();
    assert!(!schedule.paused, "untouched: {schedule:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_workflow_is_invisible_and_untouchable() {
    let tokens = Tokens::new();
    let node = node_with(&tokens).await;
    let (acme, globex) = (as_token(&node, tokens.secret("acme")), as_token(&node, tokens.secret("globex")));
    let in_acme = |id: &str| GetWorkflowRequest { id: id.into(), tenant_id: "acme".into() };
    let create = CreateWorkflowRequest { tenant_id: "acme".into(), ..workflow_t() };
    acme.raw().create_workflow(create.clone()).await.expect("acme makes a workflow in its tenant");
    // Named in acme's tenant, every workflow RPC is refused to globex.
    for answer in [
        globex.raw().create_workflow(create).await.map(drop),
        globex.raw().get_workflow(in_acme("w")).await.map(drop),
        globex.raw().cancel_workflow(in_acme("w")).await.map(drop),
        globex
            .raw()
            .list_workflows(ListWorkflowsRequest { tenant_id: "acme".into(), ..Default::default() })
            .await
            .map(drop),
    ] {
        assert!(matches!(&answer, Err(s) if s.code() == Code::PermissionDenied), "{answer:?}");
    }
    // In its own tenant there is no such workflow, and its listing is empty.
    let in_globex = GetWorkflowRequest { id: "w".into(), tenant_id: "globex".into() };
    let answer = globex.raw().get_workflow(in_globex).await;
    assert!(matches!(&answer, Err(s) if s.code() == Code::NotFound), "{answer:?}");
    let listed = globex.raw().list_workflows(ListWorkflowsRequest::default()).await.unwrap().into_inner();
    assert!(listed.workflows.is_empty(), "globex sees {:?}", listed.workflows);
    let workflow = acme.raw().get_workflow(in_acme("w")).await.expect("acme's workflow").into_inner();
    assert_eq!(workflow.state, "running", "untouched: {workflow:?}");
}
