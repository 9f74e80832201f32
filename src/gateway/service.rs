//! The `drover.v1.Gateway` service.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::chunks::BudgetChunks;
use super::convert::{self, WorkerSpec};
use super::error::ApiError;
use super::router;
use super::sessions;
use super::streams::{ClientBatches, ClientStream};
use crate::auth::{Principal, Verb, CLUSTER_READ, WORKERS_MANAGE};
use crate::core::{
    ActivatedJobData, Command, CommandResult, FailReason, Job, JobKey, JobRef, JobState, PartitionId, RequestId,
    YieldReason,
};
use crate::node::NodeContext;
use crate::partition::MAX_ENTRY_BYTES;
use crate::proto::cluster::StatusRequest;
use crate::proto::gateway::gateway_server::Gateway;
use crate::proto::gateway::*;
use crate::raft::ReplicaStatus;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// AwaitJob's wait when the request names none, and the longest it may name.
const DEFAULT_AWAIT_MS: i64 = 60_000;
const MAX_AWAIT_MS: i64 = 600_000;
/// How long before the caller's own deadline a wait answers without what it
/// waited for (AwaitJob "not final yet", a long poll with no jobs).
const AWAIT_MARGIN: Duration = Duration::from_millis(200);

/// A job token a heartbeat renews lasts this long (plus the grace every job
/// token has): many beats, so one lost beat does not let it lapse.
const HEARTBEAT_JOB_TOKEN_MS: i64 = 30_000;

/// Requests of a client stream read together into one batch per partition.
const STREAM_CHUNK: usize = 1024;
/// A chunk also closes when its requests reach this many bytes, so a stream
/// holds at most `STREAM_CHUNKS_IN_FLIGHT` × (this + one request) in memory.
const STREAM_CHUNK_BYTES: usize = 1 << 20;
/// Chunks of a client stream in flight at once.
const STREAM_CHUNKS_IN_FLIGHT: usize = 4;

pub struct GatewayService {
    ctx: Arc<NodeContext>,
}

impl GatewayService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        GatewayService { ctx }
    }

    /// The request's deadline: its `grpc-timeout`, or the node's request
    /// timeout without one. A header that is not a valid gRPC timeout is the
    /// client's mistake and answered INVALID_ARGUMENT, not guessed around.
    fn deadline<T>(&self, request: &Request<T>) -> Result<Instant, ApiError> {
        let Some(header) = request.metadata().get("grpc-timeout") else {
            return Ok(self.default_deadline());
        };
        let text = header.to_str().unwrap_or_default();
        let timeout = super::parse_grpc_timeout(text).ok_or_else(|| {
            ApiError::InvalidArgument(format!(
                "the grpc-timeout header {text:?} is not a gRPC timeout: it must be 1 to {} digits and a unit \
                 (H, M, S, m, u or n), like 30S",
                super::MAX_GRPC_TIMEOUT_DIGITS
            ))
        })?;
        // Eight digits of hours fit any clock we run on; should one not, the
        // client gets the default rather than a panic.
        Ok(super::deadline_after(timeout).unwrap_or_else(|| self.default_deadline()))
    }

    fn default_deadline(&self) -> Instant {
        Instant::now() + self.ctx.request_timeout
    }

    /// Who sent `request` (its bearer token), or UNAUTHENTICATED.
    fn principal<T>(&self, request: &Request<T>) -> Result<Arc<Principal>, ApiError> {
        principal_of(&self.ctx, request)
    }

    /// Who completes jobs over a CompleteJobs stream: a job token's holder
    /// (checked per job), or a principal allowed to work on some type.
    fn completing_principal<T>(&self, request: &Request<T>) -> Result<Arc<Principal>, ApiError> {
        let principal = self.principal(request)?;
        if principal.job.is_none() {
            principal.require_some(Verb::Work)?;
        }
        Ok(principal)
    }

    /// Opens a worker's stream of pushed jobs (`StreamActivatedJobs` and its
    /// batch form): checks, registers it with the aggregate, and hands back on
    /// close what never reached the worker.
    async fn open_client_stream(&self, request: Request<StreamActivatedJobsRequest>) -> Result<ClientStream, Status> {
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        principal.require_job(Verb::Work, &request.r#type)?;
        principal.require_tenants(&request.tenant_ids)?;
        let permit = self.ctx.auth.open_stream(&principal)?;
        let max_in_flight = convert::max_jobs_in_flight(request.max_jobs_in_flight)?;
        let mut spec = convert::worker_spec(
            request.r#type,
            request.worker,
            request.timeout,
            request.fetch_variable,
            request.tenant_ids,
            request.session_id,
            request.labels,
        )?;
        if spec.session != 0 {
            // An ended session's stream would never be offered a job: say so
            // now. The stream has the session's labels too.
            let session_labels = sessions::known(&self.ctx, spec.session, self.default_deadline()).await?;
            spec.labels.extend(session_labels);
            spec.labels.sort_unstable();
            spec.labels.dedup();
        }
        let opened = self.ctx.gateway_streams.open(&spec, max_in_flight).await?;
        if let Some(stream) = &opened.new_stream {
            crate::cluster::register_everywhere(&self.ctx, stream);
        }
        let ctx = Arc::clone(&self.ctx);
        let (stream_id, client_id) = (opened.stream_id, opened.client_id);
        let on_close = Box::new(move |buffered: Vec<(JobKey, u32)>| {
            // The principal's stream slot is free again.
            drop(permit);
            // Jobs that never reached the worker go back at once instead of
            // waiting for their activation timeout.
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                if let Some(stream) = ctx.gateway_streams.close(stream_id, client_id).await {
                    crate::cluster::remove_everywhere(&ctx, &stream);
                }
                for (key, attempt) in &buffered {
                    ctx.gateway_streams.release(*key, *attempt);
                }
                hand_back(&ctx, buffered, YieldReason::StreamClosed).await;
            });
        });
        Ok(ClientStream::new(opened, on_close).with_job_tokens(&self.ctx.auth))
    }

    /// Creates a chunk of a create stream's jobs: one answer per request, in order.
    async fn create_chunk(
        self: Arc<Self>,
        principal: Arc<Principal>,
        traceparent: String,
        requests: Vec<CreateJobRequest>,
    ) -> Vec<CreateJobResponse> {
        let started = Instant::now();
        let commands: Vec<_> =
            requests.into_iter().map(|r| self.create_command(&principal, r, traceparent.clone())).collect();
        let partitions: Vec<Option<PartitionId>> = commands.iter().map(|c| c.as_ref().ok().map(|(p, _)| *p)).collect();
        let deadline = Instant::now() + self.ctx.request_timeout;
        let results = run_chunk(&self.ctx, None, commands, deadline).await;
        metrics::histogram!("drover_create_ack_seconds").record(started.elapsed().as_secs_f64());
        let mut out = Vec::with_capacity(results.len());
        for (result, partition) in results.into_iter().zip(partitions) {
            out.push(match result {
                Ok(CommandResult::Created { key, created, state }) => {
                    self.created(partition.unwrap_or_default(), key, created, state, deadline).await
                }
                Ok(other) => CreateJobResponse {
                    error: Some(ApiError::Internal(format!("unexpected {other:?}")).to_proto()),
                    ..Default::default()
                },
                Err(e) => CreateJobResponse { error: Some(e.to_proto()), ..Default::default() },
            });
        }
        out
    }

    /// Completes a chunk of a complete stream's jobs: one answer per request, in order.
    async fn complete_chunk(
        self: Arc<Self>,
        principal: Arc<Principal>,
        requests: Vec<CompleteJobRequest>,
    ) -> Vec<CompleteJobsResponse> {
        let keys: Vec<u64> = requests.iter().map(|r| r.key).collect();
        let commands: Vec<_> = requests.into_iter().map(|r| self.complete_command(r)).collect();
        let repeats: Vec<Option<Repeat>> =
            commands.iter().map(|c| c.as_ref().ok().and_then(|(_, c)| Repeat::of(c))).collect();
        let deadline = Instant::now() + self.ctx.request_timeout;
        let results = run_chunk(&self.ctx, Some(&principal), commands, deadline).await;
        let mut out = Vec::with_capacity(results.len());
        for ((result, key), repeat) in results.into_iter().zip(keys).zip(repeats) {
            let result = match result {
                Err(error) => settle(&self.ctx, repeat, error, deadline).await,
                ok => ok,
            };
            out.push(CompleteJobsResponse { key, error: result.err().map(|e| e.to_proto()) });
        }
        out
    }

    /// The answer to a create: the job's key, whether this request made it,
    /// and its state (read from its partition for a repeat whose job is final).
    async fn created(
        &self,
        partition: PartitionId,
        key: JobKey,
        created: bool,
        state: Option<JobState>,
        deadline: Instant,
    ) -> CreateJobResponse {
        let state = match state {
            Some(state) => state.as_str().to_string(),
            None => match router::describe(&self.ctx, key, deadline).await {
                Ok(job) => job.state.as_str().to_string(),
                // The job exists (the partition remembered it); only its state
                // could not be read in time.
                Err(_) => String::new(),
            },
        };
        CreateJobResponse { key: key.0, partition_id: partition, error: None, created, state }
    }

    /// The job a read names: `key`, or an idempotency key with its scope.
    fn job_ref(key: u64, idempotency_key: String, tenant: String, user: String) -> Result<JobRef, ApiError> {
        match (key, idempotency_key.is_empty()) {
            (0, true) => Err(ApiError::InvalidArgument("give the job's key or its idempotency_key".into())),
            (0, false) => Ok(JobRef::Request(convert::idempotency_request(idempotency_key, tenant, user)?)),
            (key, true) => Ok(JobRef::Key(key_of(key)?)),
            (_, false) => Err(ApiError::InvalidArgument("give the job's key or its idempotency_key, not both".into())),
        }
    }

    /// The job a `GetJobRequest` names, read from its partition's leader, if
    /// `principal` may read it.
    async fn read_job(
        &self,
        principal: &Principal,
        request: GetJobRequest,
        deadline: Instant,
    ) -> Result<Job, ApiError> {
        if !request.tenant_id.is_empty() {
            principal.require_tenant(&request.tenant_id)?;
        }
        let job = Self::job_ref(request.key, request.idempotency_key, request.tenant_id, request.user)?;
        let found = router::read(&self.ctx, &job, None, deadline).await?;
        principal.check_job(Verb::Read, &found.spec.tenant, &found.spec.job_type, found.key.0)?;
        Ok(found)
    }

    /// Runs one command on the partition of `key`, for `principal`.
    async fn one(
        &self,
        principal: &Arc<Principal>,
        key: JobKey,
        command: Command,
        deadline: Instant,
    ) -> Result<CommandResult, ApiError> {
        if key.partition() >= self.ctx.partition_count() || key.counter() == 0 {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let repeat = Repeat::of(&command);
        let mut results =
            router::submit_as(&self.ctx, Some(principal), key.partition(), vec![command], deadline).await?;
        match results.pop() {
            Some(CommandResult::Rejected(error)) => settle(&self.ctx, repeat, error.into(), deadline).await,
            Some(result) => Ok(result),
            None => Err(ApiError::Internal("partition returned no result".into())),
        }
    }
}

/// A completion or cancellation that may repeat one that already ended the
/// job (a client's retry, or the gateway's own re-send after a lost answer).
#[derive(Clone, Copy)]
struct Repeat {
    key: JobKey,
    state: JobState,
    /// The attempt the completion was for; 0 for a cancellation.
    attempt: u32,
}

impl Repeat {
    fn of(command: &Command) -> Option<Repeat> {
        match command {
            // Attempt 0 is an operator's override: nothing tells its repeat apart.
            Command::Complete { key, attempt, .. } if *attempt != 0 => {
                Some(Repeat { key: *key, state: JobState::Completed, attempt: *attempt })
            }
            Command::Cancel { key, .. } => Some(Repeat { key: *key, state: JobState::Cancelled, attempt: 0 }),
            _ => None,
        }
    }
}

/// Turns the refusal of a repeated completion or cancellation into success
/// when the job already ended the way it asked: completed by that very
/// attempt, or cancelled. The partition keeps final records only in storage,
/// so this reads the job; it runs only on a refusal.
async fn settle(
    ctx: &NodeContext,
    repeat: Option<Repeat>,
    error: ApiError,
    deadline: Instant,
) -> Result<CommandResult, ApiError> {
    let (Some(repeat), ApiError::FailedPrecondition(_)) = (repeat, &error) else { return Err(error) };
    match router::describe(ctx, repeat.key, deadline).await {
        Ok(job) if job.state == repeat.state && crate::core::fence_admits(repeat.attempt, job.attempt) => {
            Ok(CommandResult::Done)
        }
        _ => Err(error),
    }
}

/// Who sent `request`: the principal its `authorization` header names.
/// A principal already in the request's extensions is the broker's own
/// action (clients cannot set extensions).
pub(super) fn principal_of<T>(ctx: &NodeContext, request: &Request<T>) -> Result<Arc<Principal>, ApiError> {
    if let Some(principal) = request.extensions().get::<Arc<Principal>>() {
        return Ok(Arc::clone(principal));
    }
    let header = request.metadata().get("authorization").map(|v| v.to_str().unwrap_or("?"));
    let principal = ctx.auth.authenticate(header)?;
    ctx.auth.admit(&principal)?;
    Ok(principal)
}

fn traceparent<T>(request: &Request<T>) -> String {
    request.metadata().get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
}

fn key_of(key: u64) -> Result<JobKey, ApiError> {
    if key == 0 {
        return Err(ApiError::InvalidArgument("key is required".into()));
    }
    Ok(JobKey(key))
}

/// A message of a client stream that the gateway reads in chunks: one
/// request, or a batch of them.
trait Carries: prost::Message + Send + 'static {
    /// The requests the message carries.
    fn requests(&self) -> usize {
        1
    }
}

impl Carries for CreateJobRequest {}
impl Carries for CompleteJobRequest {}

impl Carries for CreateJobBatch {
    fn requests(&self) -> usize {
        self.jobs.len()
    }
}

impl Carries for CompleteJobBatch {
    fn requests(&self) -> usize {
        self.jobs.len()
    }
}

/// Answers a client stream in chunks: the messages waiting are read together
/// (whole messages carrying about [`STREAM_CHUNK`] requests, or about
/// [`STREAM_CHUNK_BYTES`]), handled as one batch per partition by `handle`,
/// which answers each message, and answered in order. A broken inbound
/// stream ends the answers with its status. `method` names the call in
/// [`super::STREAM_MESSAGES`].
fn chunked<In, Msg, Resp, F, Fut>(method: &'static str, inbound: In, handle: F) -> BoxStream<Resp>
where
    In: Stream<Item = Result<Msg, Status>> + Unpin + Send + 'static,
    Msg: Carries,
    Resp: Send + 'static,
    F: Fn(Vec<Msg>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Vec<Resp>> + Send + 'static,
{
    let weigh = |item: &Result<Msg, Status>| item.as_ref().map_or((1, 0), |m| (m.requests(), m.encoded_len()));
    let responses = BudgetChunks::new(inbound, STREAM_CHUNK, STREAM_CHUNK_BYTES, weigh)
        .map(move |chunk| {
            let mut failed_read = None;
            let requests: Vec<Msg> = chunk
                .into_iter()
                .filter_map(|item| match item {
                    Ok(request) => Some(request),
                    Err(status) => {
                        failed_read = Some(status);
                        None
                    }
                })
                .collect();
            let received = requests.len() as u64;
            let answers = handle(requests);
            async move {
                let mut out: Vec<Result<Resp, Status>> = answers.await.into_iter().map(Ok).collect();
                metrics::counter!(super::STREAM_MESSAGES, "method" => method).increment(received + out.len() as u64);
                out.extend(failed_read.map(Err));
                futures::stream::iter(out)
            }
        })
        .buffered(STREAM_CHUNKS_IN_FLIGHT)
        .flatten();
    Box::pin(responses)
}

/// The jobs of a chunk of batches, for handling as one chunk of requests,
/// and how to answer each batch: `Ok(n)` with the next `n` answers, or
/// `Err(n)` when it carried `n` jobs, more than a batch may (it is refused
/// whole).
fn unbatch<Req>(batches: Vec<Vec<Req>>) -> (Vec<Req>, Vec<Result<usize, usize>>) {
    let mut requests = Vec::with_capacity(batches.iter().map(Vec::len).sum());
    let shapes = batches
        .into_iter()
        .map(|batch| match batch.len() {
            n if n > STREAM_CHUNK => Err(n),
            n => {
                requests.extend(batch);
                Ok(n)
            }
        })
        .collect();
    (requests, shapes)
}

/// The answers of [`unbatch`]'s requests, grouped back into one answer per
/// batch; a refused batch gets `refused(n)` for each of its jobs.
fn rebatch<Resp>(
    answers: Vec<Resp>,
    shapes: Vec<Result<usize, usize>>,
    refused: impl Fn(usize) -> Resp,
) -> Vec<Vec<Resp>> {
    let mut answers = answers.into_iter();
    shapes
        .into_iter()
        .map(|shape| match shape {
            Ok(n) => answers.by_ref().take(n).collect(),
            Err(n) => (0..n).map(|_| refused(n)).collect(),
        })
        .collect()
}

/// What each job of a batch over [`STREAM_CHUNK`] jobs is answered.
fn batch_too_large(jobs: usize) -> ApiError {
    ApiError::InvalidArgument(format!(
        "a batch carries at most {STREAM_CHUNK} jobs, this one carried {jobs}: nothing of it was done; send it as smaller batches"
    ))
}

/// Cuts one partition's commands into batches of at most `max_bytes` as
/// encoded (at least one command each), in order.
fn split_by_bytes(indexes: Vec<usize>, commands: Vec<Command>, max_bytes: usize) -> Vec<(Vec<usize>, Vec<Command>)> {
    let mut batches: Vec<(Vec<usize>, Vec<Command>)> = Vec::new();
    let mut bytes = 0usize;
    for (index, command) in indexes.into_iter().zip(commands) {
        let size = command.encoded_len();
        match batches.last_mut() {
            Some((indexes, commands)) if bytes.saturating_add(size) <= max_bytes => {
                bytes += size;
                indexes.push(index);
                commands.push(command);
            }
            _ => {
                bytes = size;
                batches.push((vec![index], vec![command]));
            }
        }
    }
    batches
}

/// Yields pushed activations that never reached a worker, for `reason`, so
/// their jobs go to another worker now rather than at their activation
/// timeout. An activation that ended meanwhile is left as it is (the yield
/// names its attempt).
pub(crate) async fn hand_back(ctx: &NodeContext, activations: Vec<(JobKey, u32)>, reason: YieldReason) {
    if activations.is_empty() {
        return;
    }
    let gateway = ctx.node_id;
    let yields =
        activations.into_iter().map(|(key, attempt)| Command::Yield { key, attempt, gateway, reason }).collect();
    let yielded = run_yields(ctx, yields).await;
    let reason = match reason {
        YieldReason::Late => "late",
        YieldReason::StreamClosed => "stream_closed",
        YieldReason::NotReady => "not_ready",
        YieldReason::Unknown => "unknown",
    };
    metrics::counter!("drover_gateway_job_stream_handed_back_total", "reason" => reason).increment(yielded as u64);
}

/// Runs `yields` ([`Command::Yield`]; other commands are skipped) at their
/// partitions' leaders, wherever those are, within the request timeout: how
/// many made their job activatable again. A yield of an activation that has
/// moved on (completed, timed out, activated again) is refused, and not counted.
pub(crate) async fn run_yields(ctx: &NodeContext, yields: Vec<Command>) -> usize {
    let commands = yields
        .into_iter()
        .filter_map(|command| {
            let partition = match &command {
                Command::Yield { key, .. } => key.partition(),
                _ => return None,
            };
            Some(Ok((partition, command)))
        })
        .collect();
    let deadline = Instant::now() + ctx.request_timeout;
    run_chunk(ctx, None, commands, deadline).await.iter().filter(|result| result.is_ok()).count()
}

/// Runs a chunk of per-key commands: per partition, batches cut by bytes and
/// run in order; the partitions concurrently; results back in the chunk's order.
pub(super) async fn run_chunk(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    commands: Vec<Result<(PartitionId, Command), ApiError>>,
    deadline: Instant,
) -> Vec<Result<CommandResult, ApiError>> {
    let mut by_partition: BTreeMap<PartitionId, (Vec<usize>, Vec<Command>)> = BTreeMap::new();
    let mut out: Vec<Option<Result<CommandResult, ApiError>>> = Vec::with_capacity(commands.len());
    for (index, command) in commands.into_iter().enumerate() {
        match command {
            Ok((partition, command)) => {
                let entry = by_partition.entry(partition).or_default();
                entry.0.push(index);
                entry.1.push(command);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    // A batch is one outcome and one Raft entry; the partition leader never
    // splits one, so it is cut here to the entry size (which also keeps a
    // forwarded batch within the cluster's message limit).
    let max_bytes = MAX_ENTRY_BYTES;
    let partitions = by_partition.into_iter().map(|(partition, (indexes, commands))| async move {
        let mut done = Vec::new();
        for (indexes, commands) in split_by_bytes(indexes, commands, max_bytes) {
            done.push((indexes, router::submit_as(ctx, principal, partition, commands, deadline).await));
        }
        done
    });
    for (indexes, result) in futures::future::join_all(partitions).await.into_iter().flatten() {
        match result {
            Ok(results) => {
                for (index, result) in indexes.into_iter().zip(results) {
                    out[index] = Some(match result {
                        CommandResult::Rejected(error) => Err(error.into()),
                        other => Ok(other),
                    });
                }
            }
            Err(error) => {
                let message = error.to_string();
                let code = error.code() as i32;
                for index in indexes {
                    out[index] = Some(Err(ApiError::from_code(code, message.clone())));
                }
            }
        }
    }
    out.into_iter().map(|r| r.unwrap_or_else(|| Err(ApiError::Internal("missing result".into())))).collect()
}

impl GatewayService {
    fn create_command(
        &self,
        principal: &Principal,
        request: CreateJobRequest,
        traceparent: String,
    ) -> Result<(PartitionId, Command), ApiError> {
        principal.require_job(Verb::Create, &request.r#type)?;
        principal.require_tenant(&request.tenant_id)?;
        let ctx = &self.ctx;
        let job = convert::new_job(request, traceparent, &ctx.limits, &ctx.dedupe, || ctx.next_request_id())?;
        // Every repeat of an idempotency key must reach the partition that
        // remembers it; other creates go to a partition led here if any.
        let partition = match &job.request {
            Some(request @ RequestId::Key { .. }) => JobRef::Request(request.clone()).partition(ctx.partition_count()),
            _ => ctx.next_create_partition(),
        };
        Ok((partition, Command::Create(job)))
    }

    fn complete_command(&self, request: CompleteJobRequest) -> Result<(PartitionId, Command), ApiError> {
        let key = key_of(request.key)?;
        // The worker is done with this activation, however the completion fares.
        self.ctx.gateway_streams.release(key, request.attempt);
        if key.partition() >= self.ctx.partition_count() {
            return Err(ApiError::NotFound(format!("no job with key {key}")));
        }
        let variables = convert::json_object("variables", request.variables)?;
        Ok((key.partition(), Command::Complete { key, attempt: request.attempt, variables }))
    }

    /// One activation round over every partition, starting at a rotating one.
    /// The reply holds at most `max` jobs and about [`convert::Limits::max_request_bytes`]:
    /// each partition activates only what the bytes left allow (at least one
    /// job), so no activation is committed that the reply cannot carry.
    async fn activate_round(
        &self,
        spec: &WorkerSpec,
        max: u32,
        deadline: Instant,
    ) -> Result<Vec<ActivatedJob>, ApiError> {
        let mut jobs = Vec::new();
        let partitions = self.ctx.partition_count();
        let start = self.ctx.next_partition();
        let mut last_error = None;
        let mut bytes_left = self.ctx.limits.max_request_bytes() as u64;
        for offset in 0..partitions {
            let remaining = max - jobs.len() as u32;
            if remaining == 0 || bytes_left == 0 {
                break;
            }
            let partition = (start + offset) % partitions;
            let command = Command::Activate(convert::activation(spec, remaining, bytes_left, self.ctx.node_id));
            match router::submit(&self.ctx, partition, vec![command], deadline).await {
                Ok(mut results) => {
                    let result = results.pop();
                    if let Some(CommandResult::Rejected(error)) = result {
                        // The worker's session is over: no partition will serve it.
                        return Err(error.into());
                    }
                    if let Some(CommandResult::Activated(activated)) = result {
                        metrics::counter!("drover_gateway_jobs_polled_total").increment(activated.len() as u64);
                        let bytes: usize =
                            activated.iter().map(|j| ActivatedJobData::encoded_len(&j.spec, &j.worker)).sum();
                        bytes_left = bytes_left.saturating_sub(bytes as u64);
                        crate::trace_context::activation_spans(partition, &activated);
                        jobs.extend(activated.iter().map(|j| {
                            let mut job = convert::activated_job(j, &spec.fetch_variables);
                            job.job_token = self.ctx.auth.job_token(job.key, job.attempt, job.deadline);
                            job
                        }));
                    }
                }
                // One partition without a leader must not hide jobs on others.
                Err(error) => last_error = Some(error),
            }
        }
        match (jobs.is_empty(), last_error) {
            (true, Some(error)) if partitions == 1 => Err(error),
            _ => Ok(jobs),
        }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    type CreateJobsStream = BoxStream<CreateJobResponse>;
    type ActivateJobsStream = BoxStream<ActivateJobsResponse>;
    type StreamActivatedJobsStream = ClientStream;
    type CompleteJobsStream = BoxStream<CompleteJobsResponse>;
    type CreateJobBatchesStream = BoxStream<CreateJobBatchResponse>;
    type CompleteJobBatchesStream = BoxStream<CompleteJobBatchResponse>;
    type StreamActivatedJobBatchesStream = ClientBatches;
    type AwaitJobStream = BoxStream<AwaitJobResponse>;

    async fn create_job(&self, request: Request<CreateJobRequest>) -> Result<Response<CreateJobResponse>, Status> {
        let _running = self.ctx.request_started("create_job");
        let started = Instant::now();
        let deadline = self.deadline(&request)?;
        let traceparent = traceparent(&request);
        let principal = self.principal(&request)?;
        let span = tracing::info_span!("gateway.create_job", job_type = %request.get_ref().r#type, key = tracing::field::Empty);
        crate::trace_context::continue_trace(&span, &traceparent);
        let (mut partition, command) = self.create_command(&principal, request.into_inner(), traceparent)?;
        let keyless = matches!(&command, Command::Create(job) if !matches!(job.request, Some(RequestId::Key { .. })));
        let mut submitted =
            router::submit(&self.ctx, partition, vec![command.clone()], deadline).instrument(span.clone()).await;
        // A create without an idempotency key may be made on any partition:
        // one out of this node's reach (its region cut off) sent nothing, so
        // the create goes to the next partition instead.
        for _ in 1..self.ctx.partition_count() {
            if !(keyless && matches!(submitted, Err(ApiError::OutOfReach(_)))) {
                break;
            }
            partition = (partition + 1) % self.ctx.partition_count();
            submitted =
                router::submit(&self.ctx, partition, vec![command.clone()], deadline).instrument(span.clone()).await;
        }
        match submitted?.pop() {
            Some(CommandResult::Created { key, created, state }) => {
                span.record("key", key.0);
                metrics::histogram!("drover_create_ack_seconds").record(started.elapsed().as_secs_f64());
                Ok(Response::new(self.created(partition, key, created, state, deadline).await))
            }
            Some(CommandResult::Rejected(error)) => Err(ApiError::from(error).into()),
            other => Err(ApiError::Internal(format!("unexpected create result {other:?}")).into()),
        }
    }

    async fn create_jobs(
        &self,
        request: Request<Streaming<CreateJobRequest>>,
    ) -> Result<Response<Self::CreateJobsStream>, Status> {
        let traceparent = traceparent(&request);
        let principal = self.principal(&request)?;
        let service = Arc::new(GatewayService { ctx: Arc::clone(&self.ctx) });
        Ok(Response::new(chunked("CreateJobs", request.into_inner(), move |requests| {
            Arc::clone(&service).create_chunk(Arc::clone(&principal), traceparent.clone(), requests)
        })))
    }

    async fn create_job_batches(
        &self,
        request: Request<Streaming<CreateJobBatch>>,
    ) -> Result<Response<Self::CreateJobBatchesStream>, Status> {
        let traceparent = traceparent(&request);
        let principal = self.principal(&request)?;
        let service = Arc::new(GatewayService { ctx: Arc::clone(&self.ctx) });
        Ok(Response::new(chunked("CreateJobBatches", request.into_inner(), move |batches: Vec<CreateJobBatch>| {
            let (requests, shapes) = unbatch(batches.into_iter().map(|b| b.jobs).collect());
            let answers = Arc::clone(&service).create_chunk(Arc::clone(&principal), traceparent.clone(), requests);
            async move {
                let refused =
                    |n| CreateJobResponse { error: Some(batch_too_large(n).to_proto()), ..Default::default() };
                rebatch(answers.await, shapes, refused)
                    .into_iter()
                    .map(|jobs| CreateJobBatchResponse { jobs })
                    .collect()
            }
        })))
    }

    async fn activate_jobs(
        &self,
        request: Request<ActivateJobsRequest>,
    ) -> Result<Response<Self::ActivateJobsStream>, Status> {
        let _running = self.ctx.request_started("activate_jobs");
        let call_deadline = request.metadata().get("grpc-timeout").map(|_| self.deadline(&request)).transpose()?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        principal.require_job(Verb::Work, &request.r#type)?;
        principal.require_tenants(&request.tenant_ids)?;
        if request.max_jobs_to_activate <= 0 || request.max_jobs_to_activate > self.ctx.limits.max_jobs_to_activate {
            return Err(ApiError::InvalidArgument(format!(
                "max_jobs_to_activate must be between 1 and {}, got {}",
                self.ctx.limits.max_jobs_to_activate, request.max_jobs_to_activate
            ))
            .into());
        }
        if request.request_timeout < 0 {
            return Err(ApiError::InvalidArgument(format!(
                "request_timeout must be zero (no long polling) or more, got {}",
                request.request_timeout
            ))
            .into());
        }
        let spec = convert::worker_spec(
            request.r#type,
            request.worker,
            request.timeout,
            request.fetch_variable,
            request.tenant_ids,
            request.session_id,
            request.labels,
        )?;
        let max = request.max_jobs_to_activate as u32;
        let poll_for =
            Duration::from_millis(request.request_timeout.min(self.ctx.limits.max_request_timeout_ms) as u64);
        let mut poll_deadline = super::deadline_after(poll_for).unwrap_or_else(|| self.default_deadline());
        if let Some(call_deadline) = call_deadline {
            // A poll longer than the caller waits ends empty in time for the
            // caller to hear it, rather than with the caller's own deadline.
            poll_deadline = poll_deadline.min(call_deadline.checked_sub(AWAIT_MARGIN).unwrap_or_else(Instant::now));
        }
        // Subscribe before the first attempt, so a job created between an empty
        // attempt and parking still wakes us.
        let mut available = self.ctx.available.subscribe();
        loop {
            let attempt_deadline = Instant::now() + self.ctx.request_timeout;
            let jobs = self.activate_round(&spec, max, attempt_deadline).await?;
            if !jobs.is_empty() || Instant::now() >= poll_deadline {
                let reply = ActivateJobsResponse { jobs };
                return Ok(Response::new(Box::pin(futures::stream::iter([Ok(reply)]))));
            }
            metrics::gauge!("drover_gateway_parked_long_polls").increment(1.0);
            let mut stopping = self.ctx.stopping.clone();
            let woken = loop {
                let next = tokio::select! {
                    next = tokio::time::timeout_at(poll_deadline.into(), available.recv()) => next,
                    _ = stopping.wait_for(|s| *s) => break false,
                };
                match next {
                    Err(_) => break false,
                    Ok(Ok((_, job_type))) if *job_type == *spec.job_type => break true,
                    Ok(Ok(_)) => continue,
                    Ok(Err(RecvError::Lagged(_))) => break true,
                    Ok(Err(RecvError::Closed)) => break false,
                }
            };
            metrics::gauge!("drover_gateway_parked_long_polls").decrement(1.0);
            if !woken {
                // Time is up: one last look, then an empty answer, never an error.
                let jobs = self.activate_round(&spec, max, Instant::now() + self.ctx.request_timeout).await?;
                return Ok(Response::new(Box::pin(futures::stream::iter([Ok(ActivateJobsResponse { jobs })]))));
            }
        }
    }

    async fn stream_activated_jobs(
        &self,
        request: Request<StreamActivatedJobsRequest>,
    ) -> Result<Response<Self::StreamActivatedJobsStream>, Status> {
        Ok(Response::new(self.open_client_stream(request).await?))
    }

    async fn stream_activated_job_batches(
        &self,
        request: Request<StreamActivatedJobsRequest>,
    ) -> Result<Response<Self::StreamActivatedJobBatchesStream>, Status> {
        Ok(Response::new(ClientBatches::new(self.open_client_stream(request).await?)))
    }

    async fn complete_job(
        &self,
        request: Request<CompleteJobRequest>,
    ) -> Result<Response<CompleteJobResponse>, Status> {
        let _running = self.ctx.request_started("complete_job");
        let deadline = self.deadline(&request)?;
        let span = tracing::info_span!(
            "gateway.complete_job",
            key = request.get_ref().key,
            attempt = request.get_ref().attempt
        );
        crate::trace_context::continue_trace(&span, &traceparent(&request));
        let principal = self.principal(&request)?;
        let (_, command) = self.complete_command(request.into_inner())?;
        let Command::Complete { key, .. } = &command else { unreachable!("complete_command builds a Complete") };
        self.one(&principal, *key, command, deadline).instrument(span).await?;
        Ok(Response::new(CompleteJobResponse {}))
    }

    async fn complete_jobs(
        &self,
        request: Request<Streaming<CompleteJobRequest>>,
    ) -> Result<Response<Self::CompleteJobsStream>, Status> {
        let principal = self.completing_principal(&request)?;
        let service = Arc::new(GatewayService { ctx: Arc::clone(&self.ctx) });
        Ok(Response::new(chunked("CompleteJobs", request.into_inner(), move |requests| {
            Arc::clone(&service).complete_chunk(Arc::clone(&principal), requests)
        })))
    }

    async fn complete_job_batches(
        &self,
        request: Request<Streaming<CompleteJobBatch>>,
    ) -> Result<Response<Self::CompleteJobBatchesStream>, Status> {
        let principal = self.completing_principal(&request)?;
        let service = Arc::new(GatewayService { ctx: Arc::clone(&self.ctx) });
        Ok(Response::new(chunked("CompleteJobBatches", request.into_inner(), move |batches: Vec<CompleteJobBatch>| {
            let keys: Vec<Vec<u64>> = batches.iter().map(|b| b.jobs.iter().map(|j| j.key).collect()).collect();
            let (requests, shapes) = unbatch(batches.into_iter().map(|b| b.jobs).collect());
            let answers = Arc::clone(&service).complete_chunk(Arc::clone(&principal), requests);
            async move {
                let refused = |n| CompleteJobsResponse { key: 0, error: Some(batch_too_large(n).to_proto()) };
                let mut batches = rebatch(answers.await, shapes, refused);
                // A refused batch's answers name their keys too.
                for (batch, keys) in batches.iter_mut().zip(keys) {
                    for (answer, key) in batch.iter_mut().zip(keys) {
                        answer.key = key;
                    }
                }
                batches.into_iter().map(|jobs| CompleteJobBatchResponse { jobs }).collect()
            }
        })))
    }

    async fn fail_job(&self, request: Request<FailJobRequest>) -> Result<Response<FailJobResponse>, Status> {
        let _running = self.ctx.request_started("fail_job");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        let key = key_of(request.key)?;
        self.ctx.gateway_streams.release(key, request.attempt);
        if request.retries < 0 {
            return Err(
                ApiError::InvalidArgument(format!("retries must be zero or more, got {}", request.retries)).into()
            );
        }
        if request.retry_back_off < 0 {
            return Err(ApiError::InvalidArgument(format!(
                "retry_back_off must be zero or more ms, got {}",
                request.retry_back_off
            ))
            .into());
        }
        let variables = convert::merged_variables("failure", request.variables, &self.ctx.limits)?;
        let reason = FailReason::parse(&request.reason).ok_or_else(|| {
            let names: Vec<&str> = FailReason::ALL.iter().filter(|r| !r.by_broker()).map(|r| r.as_str()).collect();
            ApiError::InvalidArgument(format!("reason {:?} is not one of {}", request.reason, names.join(", ")))
        })?;
        let command = Command::Fail {
            reason,
            key,
            attempt: request.attempt,
            retries: request.retries,
            error_message: request.error_message,
            back_off_ms: request.retry_back_off,
            variables,
            max_payload_bytes: self.ctx.limits.max_payload_bytes as u64,
        };
        self.one(&principal, key, command, deadline).await?;
        Ok(Response::new(FailJobResponse {}))
    }

    async fn update_job_timeout(
        &self,
        request: Request<UpdateJobTimeoutRequest>,
    ) -> Result<Response<UpdateJobTimeoutResponse>, Status> {
        let _running = self.ctx.request_started("update_job_timeout");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        let key = key_of(request.key)?;
        if request.timeout <= 0 {
            return Err(ApiError::InvalidArgument(format!(
                "timeout must be greater than zero (the new deadline is now + timeout ms), got {}",
                request.timeout
            ))
            .into());
        }
        let command = Command::UpdateTimeout { key, attempt: request.attempt, timeout_ms: request.timeout };
        match self.one(&principal, key, command, deadline).await? {
            CommandResult::Deadline(deadline) => {
                let job_token = self.ctx.auth.job_token(key.0, request.attempt, deadline);
                Ok(Response::new(UpdateJobTimeoutResponse { deadline, job_token }))
            }
            other => Err(ApiError::Internal(format!("unexpected result {other:?}")).into()),
        }
    }

    async fn update_job_retries(
        &self,
        request: Request<UpdateJobRetriesRequest>,
    ) -> Result<Response<UpdateJobRetriesResponse>, Status> {
        let _running = self.ctx.request_started("update_job_retries");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        let key = key_of(request.key)?;
        if request.retries < 0 {
            return Err(
                ApiError::InvalidArgument(format!("retries must be zero or more, got {}", request.retries)).into()
            );
        }
        self.one(
            &principal,
            key,
            Command::UpdateRetries { key, retries: request.retries, by: principal.name.clone() },
            deadline,
        )
        .await?;
        crate::auth::audit(
            &principal,
            "update_job_retries",
            serde_json::json!({"jobs": [key.0], "retries": request.retries}),
        );
        Ok(Response::new(UpdateJobRetriesResponse {}))
    }

    async fn cancel_job(&self, request: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        let _running = self.ctx.request_started("cancel_job");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let key = key_of(request.into_inner().key)?;
        self.one(&principal, key, Command::Cancel { key, by: principal.name.clone() }, deadline).await?;
        crate::auth::audit(&principal, "cancel_job", serde_json::json!({"jobs": [key.0]}));
        Ok(Response::new(CancelJobResponse {}))
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        let _running = self.ctx.request_started("get_job");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        let include_history = request.include_history;
        let job = self.read_job(&principal, request, deadline).await?;
        let mut answer = convert::job(&job);
        if include_history {
            answer.history = convert::history(&job);
            answer.history_dropped = job.history.dropped();
        }
        Ok(Response::new(GetJobResponse { job: Some(answer) }))
    }

    async fn get_job_history(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobHistoryResponse>, Status> {
        let _running = self.ctx.request_started("get_job_history");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let job = self.read_job(&principal, request.into_inner(), deadline).await?;
        Ok(Response::new(GetJobHistoryResponse {
            key: job.key.0,
            events: convert::history(&job),
            dropped: job.history.dropped(),
        }))
    }

    async fn await_job(&self, request: Request<AwaitJobRequest>) -> Result<Response<Self::AwaitJobStream>, Status> {
        let _running = self.ctx.request_started("await_job");
        let call_deadline = request.metadata().get("grpc-timeout").map(|_| self.deadline(&request)).transpose()?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        if !request.tenant_id.is_empty() {
            principal.require_tenant(&request.tenant_id)?;
        }
        let wait = match request.timeout {
            0 => DEFAULT_AWAIT_MS,
            ms if (1..=MAX_AWAIT_MS).contains(&ms) => ms,
            ms => {
                return Err(ApiError::InvalidArgument(format!(
                    "timeout must be between 1 and {MAX_AWAIT_MS} ms (0 for {DEFAULT_AWAIT_MS}), got {ms}"
                ))
                .into())
            }
        };
        let job = Self::job_ref(request.key, request.idempotency_key, request.tenant_id, request.user)?;
        let mut final_by = Instant::now() + Duration::from_millis(wait as u64);
        if let Some(call_deadline) = call_deadline {
            // Answer "not final yet" in time for the caller to hear it.
            final_by = final_by.min(call_deadline.checked_sub(AWAIT_MARGIN).unwrap_or_else(Instant::now));
        }
        let deadline = final_by.max(Instant::now() + self.ctx.request_timeout);
        let deadline = call_deadline.map_or(deadline, |call| deadline.min(call));
        let found = router::read(&self.ctx, &job, Some(final_by), deadline).await?;
        // A producer awaits the jobs it may create; a reader, those it may read.
        if !principal.may(Verb::Create, &found.spec.job_type) {
            principal.check_job(Verb::Read, &found.spec.tenant, &found.spec.job_type, found.key.0)?;
        } else if !principal.in_tenant(&found.spec.tenant) {
            return Err(ApiError::NotFound(format!("no job with key {}", found.key)).into());
        }
        let reply = AwaitJobResponse { r#final: found.state.is_final(), job: Some(convert::job(&found)) };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(reply)]))))
    }

    async fn checkpoint_job(
        &self,
        request: Request<CheckpointJobRequest>,
    ) -> Result<Response<CheckpointJobResponse>, Status> {
        let _running = self.ctx.request_started("checkpoint_job");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        let key = key_of(request.key)?;
        convert::stage_name(&request.stage)?;
        if request.attempt == 0 {
            return Err(ApiError::InvalidArgument(
                "attempt is required: a checkpoint is fenced by the activation's attempt (ActivatedJob.attempt)".into(),
            )
            .into());
        }
        let variables = convert::merged_variables("checkpoint", request.variables, &self.ctx.limits)?;
        let command = Command::Checkpoint {
            key,
            attempt: request.attempt,
            stage: request.stage,
            variables,
            max_payload_bytes: self.ctx.limits.max_payload_bytes as u64,
        };
        let attempt = request.attempt;
        match self.one(&principal, key, command, deadline).await? {
            CommandResult::Deadline(deadline) => {
                let job_token = self.ctx.auth.job_token(key.0, attempt, deadline);
                Ok(Response::new(CheckpointJobResponse { deadline, job_token }))
            }
            other => Err(ApiError::Internal(format!("unexpected result {other:?}")).into()),
        }
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let _running = self.ctx.request_started("list_jobs");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        Ok(Response::new(super::listing::list(&self.ctx, &principal, request.into_inner(), deadline).await?))
    }

    async fn retry_jobs(&self, request: Request<RetryJobsRequest>) -> Result<Response<BulkJobsResponse>, Status> {
        let _running = self.ctx.request_started("retry_jobs");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        Ok(Response::new(super::listing::retry(&self.ctx, &principal, request.into_inner(), deadline).await?))
    }

    async fn cancel_jobs(&self, request: Request<CancelJobsRequest>) -> Result<Response<BulkJobsResponse>, Status> {
        let _running = self.ctx.request_started("cancel_jobs");
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        Ok(Response::new(super::listing::cancel(&self.ctx, &principal, request.into_inner(), deadline).await?))
    }

    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        principal.require_some(Verb::Work)?;
        for job_type in &request.job_types {
            principal.require_job(Verb::Work, job_type)?;
        }
        principal.require_tenants(&request.tenant_ids)?;
        Ok(Response::new(sessions::register(&self.ctx, request, deadline).await?))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        let deadline = self.deadline(&request)?;
        self.principal(&request)?.require_some(Verb::Work)?;
        let request = request.into_inner();
        let held: Vec<(u64, u32)> = request.jobs.iter().map(|j| (j.key, j.attempt)).collect();
        let sessions::Beaten { response: mut answer, renewed } =
            sessions::heartbeat(&self.ctx, request, deadline).await?;
        if self.ctx.auth.mints_job_tokens() {
            // Jobs the session holds get tokens that outlast the next few
            // beats; a listed job it does not hold gets none, so a beat cannot
            // mint a token for someone else's job.
            let until = (crate::auth::now_ms() as i64).saturating_add(HEARTBEAT_JOB_TOKEN_MS);
            answer.job_tokens = held
                .into_iter()
                .filter(|(key, _)| renewed.contains(&JobKey(*key)))
                .map(|(key, attempt)| HeldJobToken {
                    key,
                    attempt,
                    token: self.ctx.auth.job_token(key, attempt, until),
                })
                .collect();
        }
        Ok(Response::new(answer))
    }

    async fn deregister_worker(
        &self,
        request: Request<DeregisterWorkerRequest>,
    ) -> Result<Response<DeregisterWorkerResponse>, Status> {
        let deadline = self.deadline(&request)?;
        self.principal(&request)?.require_some(Verb::Work)?;
        sessions::deregister(&self.ctx, request.into_inner().session_id, deadline).await?;
        Ok(Response::new(DeregisterWorkerResponse {}))
    }

    async fn list_workers(
        &self,
        request: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        if !principal.has(WORKERS_MANAGE) {
            principal.require(CLUSTER_READ)?;
        }
        let mut workers = sessions::list(&self.ctx, &request.into_inner().label, deadline).await?;
        // Sessions that take jobs of the principal's tenants only.
        workers.retain(|w| principal.shares_tenant(&w.tenant_ids));
        Ok(Response::new(ListWorkersResponse { workers }))
    }

    async fn set_worker_state(
        &self,
        request: Request<SetWorkerStateRequest>,
    ) -> Result<Response<SetWorkerStateResponse>, Status> {
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        principal.require(WORKERS_MANAGE)?;
        let request = request.into_inner();
        crate::auth::audit(
            &principal,
            "set_worker_state",
            serde_json::json!({"session": request.session_id, "label": request.label, "all": request.all, "state": request.state}),
        );
        let workers = sessions::direct(&self.ctx, request, deadline).await?;
        Ok(Response::new(SetWorkerStateResponse { workers }))
    }

    async fn set_schema(&self, request: Request<SetSchemaRequest>) -> Result<Response<SetSchemaResponse>, Status> {
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let request = request.into_inner();
        principal.require_job(Verb::Manage, &request.r#type)?;
        crate::auth::audit(
            &principal,
            "set_schema",
            serde_json::json!({"type": request.r#type, "bytes": request.schema.len()}),
        );
        sessions::set_schema(&self.ctx, request, deadline).await?;
        Ok(Response::new(SetSchemaResponse {}))
    }

    async fn get_schema(&self, request: Request<GetSchemaRequest>) -> Result<Response<GetSchemaResponse>, Status> {
        let deadline = self.deadline(&request)?;
        let principal = self.principal(&request)?;
        let job_type = request.into_inner().r#type;
        if !principal.may(Verb::Create, &job_type) {
            principal.require_job(Verb::Read, &job_type)?;
        }
        let schema = sessions::get_schema(&self.ctx, job_type, deadline).await?;
        Ok(Response::new(GetSchemaResponse { schema }))
    }

    async fn topology(&self, request: Request<TopologyRequest>) -> Result<Response<TopologyResponse>, Status> {
        let _running = self.ctx.request_started("topology");
        // Any principal: clients read the cluster's shape to connect.
        self.principal(&request)?;
        let brokers = cluster_status(&self.ctx).await;
        Ok(Response::new(TopologyResponse {
            brokers,
            cluster_size: self.ctx.cluster_size(),
            partitions_count: self.ctx.partition_count(),
            replication_factor: self.ctx.replication_factor,
            gateway_node_id: self.ctx.node_id,
        }))
    }
}

fn partition_info(status: &ReplicaStatus) -> PartitionInfo {
    PartitionInfo {
        partition_id: status.partition,
        role: status.role.clone(),
        health: if status.leader.is_some() { "healthy" } else { "unhealthy" }.into(),
        term: status.term,
        leader_id: status.leader,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
    }
}

/// Every node's view of its partitions; unreachable nodes appear with none.
pub async fn cluster_status(ctx: &Arc<NodeContext>) -> Vec<BrokerInfo> {
    let mut brokers = Vec::new();
    for (node, _) in ctx.members.iter() {
        if *node == ctx.node_id {
            brokers.push(BrokerInfo {
                node_id: *node,
                address: ctx.grpc_addr.to_string(),
                partitions: ctx.replicas.values().map(|r| partition_info(&r.status())).collect(),
            });
            continue;
        }
        let mut info = BrokerInfo { node_id: *node, address: String::new(), partitions: Vec::new() };
        if let Some(mut client) = ctx.peers.client(*node) {
            let mut request = Request::new(StatusRequest {});
            request.set_timeout(Duration::from_millis(1500));
            if let Ok(reply) = client.status(request).await {
                let reply = reply.into_inner();
                info.address = reply.gateway_address;
                let statuses: Vec<ReplicaStatus> = bincode::deserialize(&reply.partitions).unwrap_or_default();
                info.partitions = statuses.iter().map(partition_info).collect();
            }
        }
        brokers.push(info);
    }
    brokers
}

/// [`cluster_status`] as JSON for `/actuator/partitions`.
pub async fn cluster_status_json(ctx: &Arc<NodeContext>) -> serde_json::Value {
    let brokers = cluster_status(ctx).await;
    serde_json::Value::Array(
        brokers
            .into_iter()
            .map(|b| {
                serde_json::json!({
                    "nodeId": b.node_id,
                    "address": b.address,
                    "partitions": b.partitions.iter().map(|p| serde_json::json!({
                        "partitionId": p.partition_id,
                        "role": p.role,
                        "health": p.health,
                        "term": p.term,
                        "leaderId": p.leader_id,
                        "commitIndex": p.commit_index,
                        "appliedIndex": p.applied_index,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use prost::Message;

    use super::*;

    #[tokio::test]
    async fn a_stream_of_large_requests_is_held_in_chunks_within_the_byte_budget() {
        let big = CreateJobRequest {
            r#type: "t".into(),
            variables: format!(r#"{{"blob":"{}"}}"#, "x".repeat(256 << 10)),
            ..Default::default()
        };
        let one = big.encoded_len();
        let requests = futures::stream::iter((0..40).map(move |_| Ok(big.clone())));
        let chunk_bytes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&chunk_bytes);
        let answers: Vec<_> = chunked("CreateJobs", requests, move |chunk: Vec<CreateJobRequest>| {
            seen.lock().unwrap().push(chunk.iter().map(Message::encoded_len).sum::<usize>());
            async move { chunk.into_iter().map(|r| r.r#type).collect::<Vec<_>>() }
        })
        .collect()
        .await;

        assert_eq!(answers.len(), 40, "one answer per request");
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|t| t == "t")));
        let chunk_bytes = chunk_bytes.lock().unwrap();
        assert!(chunk_bytes.len() > 1, "40 requests of {one} bytes in one chunk");
        for bytes in chunk_bytes.iter() {
            assert!(*bytes < STREAM_CHUNK_BYTES + one, "a chunk of {bytes} bytes; the budget is {STREAM_CHUNK_BYTES}");
        }
    }

    #[test]
    fn batches_are_answered_in_their_shape_and_one_over_the_limit_is_refused_whole() {
        let batches = vec![vec![1, 2], vec![], vec![0; STREAM_CHUNK + 1], vec![3]];
        let (requests, shapes) = unbatch(batches);
        assert_eq!(requests, [1, 2, 3], "the refused batch's jobs are not handled");
        let answers: Vec<i64> = requests.iter().map(|r| r * 10).collect();
        let answered = rebatch(answers, shapes, |n| -(n as i64));
        assert_eq!(answered.len(), 4, "one answer per batch");
        assert_eq!(answered[0], [10, 20]);
        assert!(answered[1].is_empty());
        assert_eq!(answered[2], vec![-((STREAM_CHUNK + 1) as i64); STREAM_CHUNK + 1], "every job refused");
        assert_eq!(answered[3], [30]);
    }
}
