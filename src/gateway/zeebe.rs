//! Zeebe's `gateway_protocol.Gateway`, its job-worker RPCs, served beside
//! `drover.v1.Gateway` on the same port so that existing Zeebe job workers
//! run on Drover unmodified (docs/zeebe.md).
//!
//! This module owns the translation only. Every call becomes the native call
//! that does the same, so both services share one set of rules, one
//! aggregation of worker streams and one set of credits. Where Zeebe's
//! documented semantics differ from Drover's, Zeebe's win here:
//! - `requestTimeout` 0 is the configured default long poll, a negative one
//!   none; `maxJobsToActivate` above the limit is clamped, not refused;
//! - `FailJob`'s negative retries and back-off count as 0; a blank worker
//!   name is accepted;
//! - an activated job's variables and custom headers are always JSON object
//!   strings, and its process fields are zero or empty;
//! - a completed or cancelled job answers NOT_FOUND, as Zeebe deletes them;
//! - `ThrowError` raises an incident whose message starts with the error code;
//! - no reply message exceeds [`MAX_MESSAGE_BYTES`]: activations are cut
//!   into several messages, and a job too large for one message alone
//!   raises an incident instead of breaking the client;
//! - every RPC that needs a process engine answers UNIMPLEMENTED.
//!
//! Fencing, which Zeebe lacks: a job key handed out here is the job's key
//! with its attempt's tag ([`crate::core::attempt_tag`]) in bits 60..62,
//! which no Drover key uses. Complete, fail, throw and timeout updates with
//! such a key act only on an activation with that tag, so a stale worker's
//! call after the job was activated again is refused with
//! FAILED_PRECONDITION. A key without a tag, as `drover job create` prints
//! it, names whichever activation the job has.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use prost::Message;
use tonic::{Code, Request, Response, Status};

use super::convert::Limits;
use super::service::cluster_status;
use super::{router, ApiError, GatewayService};
use crate::core::{attempt_tag, FailReason, JobKey, TAGGED_ATTEMPT};
use crate::node::NodeContext;
use crate::proto::gateway as pb;
use crate::proto::gateway::gateway_server::Gateway as Native;
use crate::proto::zeebe as zb;
use crate::proto::zeebe::gateway_server::Gateway;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The largest message a Zeebe client accepts by default (gRPC's 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Where a Zeebe job key carries its activation's tag.
const TAG_SHIFT: u32 = 60;
const TAG_BITS: u64 = 0b111 << TAG_SHIFT;

/// The version Topology reports for the gateway and every broker.
const VERSION: &str = env!("CARGO_PKG_VERSION");

pub struct ZeebeService {
    native: GatewayService,
    ctx: Arc<NodeContext>,
}

impl ZeebeService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        ZeebeService { native: GatewayService::new(Arc::clone(&ctx)), ctx }
    }

    /// A call the native service failed with FAILED_PRECONDITION: NOT_FOUND
    /// if the job is finished (Zeebe deletes completed and cancelled jobs),
    /// as it was otherwise. Reads the job only on this error path.
    async fn gone_if_finished(&self, key: JobKey, status: Status) -> Status {
        if status.code() != Code::FailedPrecondition {
            return status;
        }
        let deadline = Instant::now() + self.ctx.request_timeout;
        match router::describe(&self.ctx, key, deadline).await {
            Ok(job) if job.state.is_final() => Status::not_found(format!(
                "job {key} is already {}: a finished job is gone for Zeebe clients",
                job.state.as_str()
            )),
            Err(ApiError::NotFound(message)) => Status::not_found(message),
            _ => status,
        }
    }

    /// Answers every RPC that needs a process engine.
    fn no_engine<T>(rpc: &str) -> Result<Response<T>, Status> {
        Err(Status::unimplemented(format!(
            "{rpc} is not served: Drover is a job broker and has no BPMN engine (no processes, messages, \
             decisions, signals or deployments); it serves the job-worker RPCs of gateway_protocol.Gateway \
             (ActivateJobs, StreamActivatedJobs, CompleteJob, FailJob, ThrowError, UpdateJobRetries, \
             UpdateJobTimeout, Topology)"
        )))
    }
}

/// The key a Zeebe client gets for an activation: the job's key with the
/// attempt's tag in bits 60..62.
pub fn activation_key(key: JobKey, attempt: u32) -> i64 {
    (key.0 | (u64::from(attempt_tag(attempt)) << TAG_SHIFT)) as i64
}

/// The job a Zeebe job key names, and the fence (see
/// [`crate::core::fence_admits`]) its tag sets: 0 for a key without one.
pub fn job_of(key: i64) -> Result<(JobKey, u32), ApiError> {
    if key <= 0 {
        return Err(ApiError::NotFound(format!("no job with key {key}: job keys are positive")));
    }
    let key = key as u64;
    let tag = ((key & TAG_BITS) >> TAG_SHIFT) as u32;
    let fence = if tag == 0 { 0 } else { TAGGED_ATTEMPT | tag };
    Ok((JobKey(key & !TAG_BITS), fence))
}

/// `maxJobsToActivate` as Drover takes it: above the limit clamps to it.
/// Below 1 is refused, as Zeebe refuses it.
pub fn max_jobs(requested: i32, limit: i32) -> Result<i32, ApiError> {
    if requested < 1 {
        return Err(ApiError::InvalidArgument(format!("maxJobsToActivate must be greater than zero, got {requested}")));
    }
    Ok(requested.min(limit))
}

/// Zeebe's `requestTimeout` as Drover's long poll: 0 is the default,
/// negative is none (answer at once).
pub fn long_poll_ms(request_timeout: i64, default_ms: i64) -> i64 {
    match request_timeout {
        0 => default_ms,
        ms if ms < 0 => 0,
        ms => ms,
    }
}

/// A JSON object string, `{}` for none.
fn object_or_empty(text: String) -> String {
    if text.trim().is_empty() {
        "{}".into()
    } else {
        text
    }
}

/// A native activation as Zeebe's `ActivatedJob`.
pub fn activated_job(job: pb::ActivatedJob) -> zb::ActivatedJob {
    let custom_headers = if job.custom_headers.is_empty() {
        "{}".to_string()
    } else {
        let headers: serde_json::Map<String, serde_json::Value> =
            job.custom_headers.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
        serde_json::Value::Object(headers).to_string()
    };
    zb::ActivatedJob {
        key: activation_key(JobKey(job.key), job.attempt),
        r#type: job.r#type,
        process_instance_key: 0,
        bpmn_process_id: String::new(),
        process_definition_version: 0,
        process_definition_key: 0,
        element_id: String::new(),
        element_instance_key: 0,
        custom_headers,
        worker: job.worker,
        retries: job.retries,
        deadline: job.deadline,
        variables: object_or_empty(job.variables),
        tenant_id: job.tenant_id,
    }
}

/// The native request a Zeebe request becomes, with its metadata (deadline,
/// trace context) and extensions.
fn native_request<Z, N>(
    request: Request<Z>,
    convert: impl FnOnce(Z) -> Result<N, ApiError>,
) -> Result<Request<N>, ApiError> {
    let (metadata, extensions, message) = request.into_parts();
    Ok(Request::from_parts(metadata, extensions, convert(message)?))
}

/// `labels`: what a Zeebe worker, which names none, is labelled with here
/// ([`crate::node::NodeContext::default_worker_labels`]).
pub fn activate_request(
    r: zb::ActivateJobsRequest,
    limits: &Limits,
    labels: Vec<String>,
) -> Result<pb::ActivateJobsRequest, ApiError> {
    Ok(pb::ActivateJobsRequest {
        r#type: r.r#type,
        worker: r.worker,
        timeout: r.timeout,
        max_jobs_to_activate: max_jobs(r.max_jobs_to_activate, limits.max_jobs_to_activate)?,
        fetch_variable: r.fetch_variable,
        request_timeout: long_poll_ms(r.request_timeout, limits.zeebe_long_poll_ms),
        tenant_ids: r.tenant_ids,
        session_id: 0,
        labels,
    })
}

pub fn stream_request(r: zb::StreamActivatedJobsRequest, labels: Vec<String>) -> pb::StreamActivatedJobsRequest {
    pb::StreamActivatedJobsRequest {
        r#type: r.r#type,
        worker: r.worker,
        timeout: r.timeout,
        fetch_variable: r.fetch_variable,
        tenant_ids: r.tenant_ids,
        // The same per-stream limit as a native stream that names none.
        max_jobs_in_flight: 0,
        session_id: 0,
        labels,
    }
}

pub fn complete_request(r: zb::CompleteJobRequest) -> Result<pb::CompleteJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::CompleteJobRequest { key: key.0, variables: r.variables, attempt: fence })
}

pub fn fail_request(r: zb::FailJobRequest) -> Result<pb::FailJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::FailJobRequest {
        key: key.0,
        attempt: fence,
        retries: r.retries.max(0),
        error_message: r.error_message,
        retry_back_off: r.retry_back_off.max(0),
        variables: r.variables,
        reason: String::new(),
    })
}

pub fn throw_request(r: zb::ThrowErrorRequest) -> Result<pb::FailJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    if r.error_code.trim().is_empty() {
        return Err(ApiError::InvalidArgument("errorCode is required to throw an error".into()));
    }
    let error_message = if r.error_message.is_empty() {
        format!("error {} thrown by the worker", r.error_code)
    } else {
        format!("error {} thrown by the worker: {}", r.error_code, r.error_message)
    };
    Ok(pb::FailJobRequest {
        key: key.0,
        attempt: fence,
        retries: 0,
        error_message,
        retry_back_off: 0,
        variables: r.variables,
        reason: FailReason::BusinessError.as_str().into(),
    })
}

pub fn retries_request(r: zb::UpdateJobRetriesRequest) -> Result<pb::UpdateJobRetriesRequest, ApiError> {
    Ok(pb::UpdateJobRetriesRequest { key: job_of(r.job_key)?.0 .0, retries: r.retries })
}

pub fn timeout_request(r: zb::UpdateJobTimeoutRequest) -> Result<pb::UpdateJobTimeoutRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::UpdateJobTimeoutRequest { key: key.0, timeout: r.timeout, attempt: fence })
}

/// Activated jobs cut into replies of at most `max_bytes` each, in order, and
/// the jobs too large for any reply.
pub fn split_replies(
    jobs: Vec<zb::ActivatedJob>,
    max_bytes: usize,
) -> (Vec<zb::ActivateJobsResponse>, Vec<zb::ActivatedJob>) {
    let mut replies: Vec<zb::ActivateJobsResponse> = Vec::new();
    let mut too_large = Vec::new();
    let mut bytes = 0;
    for job in jobs {
        // The job as field 1 of the reply: its tag, its length and itself.
        let size = prost::encoding::message::encoded_len(1, &job);
        if size > max_bytes {
            too_large.push(job);
            continue;
        }
        match replies.last_mut() {
            Some(reply) if bytes + size <= max_bytes => {
                bytes += size;
                reply.jobs.push(job);
            }
            _ => {
                bytes = size;
                replies.push(zb::ActivateJobsResponse { jobs: vec![job] });
            }
        }
    }
    (replies, too_large)
}

/// Whether a job's fields could add up to more than a message; the other
/// fields (type, worker, tenant, numbers) take well under 64 KiB.
fn may_exceed_a_message(job: &zb::ActivatedJob) -> bool {
    job.variables.len() + job.custom_headers.len() > MAX_MESSAGE_BYTES - (64 << 10)
}

/// Raises an incident on an activation too large for a Zeebe client's
/// message, instead of sending what the client cannot read.
fn incident_for_too_large(ctx: &Arc<NodeContext>, job: &zb::ActivatedJob) {
    let Ok((key, fence)) = job_of(job.key) else { return };
    let bytes = job.encoded_len();
    let request = pb::FailJobRequest {
        key: key.0,
        attempt: fence,
        retries: 0,
        error_message: format!(
            "the job is {bytes} bytes as a Zeebe ActivatedJob, more than the {MAX_MESSAGE_BYTES} bytes a Zeebe \
             client reads in one message; make its variables smaller, or work it through drover.v1"
        ),
        reason: FailReason::MalformedPayload.as_str().into(),
        ..Default::default()
    };
    let native = GatewayService::new(Arc::clone(ctx));
    // The broker's own action, not the client's: it needs no token.
    let mut request = Request::new(request);
    request.extensions_mut().insert(Arc::new(crate::auth::Principal::system()));
    tokio::spawn(async move {
        if let Err(status) = Native::fail_job(&native, request).await {
            tracing::warn!(%key, %status, "could not raise the incident of a job too large for a Zeebe client");
        }
    });
}

fn role(role: &str) -> zb::partition::PartitionBrokerRole {
    use zb::partition::PartitionBrokerRole as Role;
    match role {
        "leader" => Role::Leader,
        "follower" => Role::Follower,
        _ => Role::Inactive,
    }
}

fn host_port(address: &str) -> (String, i32) {
    match address.rsplit_once(':') {
        Some((host, port)) => (host.trim_matches(['[', ']']).to_string(), port.parse().unwrap_or(0)),
        None => (address.to_string(), 0),
    }
}

/// Drover's cluster view as Zeebe's topology. Zeebe numbers partitions from
/// 1, so partition `p` is reported as `p + 1`.
pub fn topology(
    brokers: Vec<pb::BrokerInfo>,
    cluster_size: u32,
    partitions: u32,
    replication_factor: u32,
) -> zb::TopologyResponse {
    use zb::partition::PartitionBrokerHealth as Health;
    let brokers = brokers
        .into_iter()
        .map(|broker| {
            let (host, port) = host_port(&broker.address);
            zb::BrokerInfo {
                node_id: broker.node_id as i32,
                host,
                port,
                partitions: broker
                    .partitions
                    .iter()
                    .map(|p| zb::Partition {
                        partition_id: p.partition_id as i32 + 1,
                        role: role(&p.role) as i32,
                        health: if p.health == "healthy" { Health::Healthy } else { Health::Unhealthy } as i32,
                    })
                    .collect(),
                version: VERSION.into(),
            }
        })
        .collect();
    zb::TopologyResponse {
        brokers,
        cluster_size: cluster_size as i32,
        partitions_count: partitions as i32,
        replication_factor: replication_factor as i32,
        gateway_version: VERSION.into(),
    }
}

#[tonic::async_trait]
impl Gateway for ZeebeService {
    type ActivateJobsStream = BoxStream<zb::ActivateJobsResponse>;
    type StreamActivatedJobsStream = BoxStream<zb::ActivatedJob>;

    async fn activate_jobs(
        &self,
        request: Request<zb::ActivateJobsRequest>,
    ) -> Result<Response<Self::ActivateJobsStream>, Status> {
        let request =
            native_request(request, |r| activate_request(r, &self.ctx.limits, self.ctx.default_worker_labels()))?;
        let mut answers = Native::activate_jobs(&self.native, request).await?.into_inner();
        let mut jobs = Vec::new();
        while let Some(answer) = answers.next().await {
            jobs.extend(answer?.jobs.into_iter().map(activated_job));
        }
        // No jobs: the stream ends with no message, as Zeebe's gateway ends a
        // long poll that timed out.
        let (replies, too_large) = split_replies(jobs, MAX_MESSAGE_BYTES);
        for job in &too_large {
            incident_for_too_large(&self.ctx, job);
        }
        Ok(Response::new(Box::pin(futures::stream::iter(replies.into_iter().map(Ok)))))
    }

    async fn stream_activated_jobs(
        &self,
        request: Request<zb::StreamActivatedJobsRequest>,
    ) -> Result<Response<Self::StreamActivatedJobsStream>, Status> {
        let request = native_request(request, |r| Ok(stream_request(r, self.ctx.default_worker_labels())))?;
        let jobs = Native::stream_activated_jobs(&self.native, request).await?.into_inner();
        let ctx = Arc::clone(&self.ctx);
        let jobs = jobs.filter_map(move |item| {
            let out = match item.map(activated_job) {
                Ok(job) if may_exceed_a_message(&job) && job.encoded_len() > MAX_MESSAGE_BYTES => {
                    incident_for_too_large(&ctx, &job);
                    None
                }
                other => Some(other),
            };
            futures::future::ready(out)
        });
        Ok(Response::new(Box::pin(jobs)))
    }

    async fn complete_job(
        &self,
        request: Request<zb::CompleteJobRequest>,
    ) -> Result<Response<zb::CompleteJobResponse>, Status> {
        let request = native_request(request, complete_request)?;
        let key = JobKey(request.get_ref().key);
        match Native::complete_job(&self.native, request).await {
            Ok(_) => Ok(Response::new(zb::CompleteJobResponse {})),
            Err(status) => Err(self.gone_if_finished(key, status).await),
        }
    }

    async fn fail_job(&self, request: Request<zb::FailJobRequest>) -> Result<Response<zb::FailJobResponse>, Status> {
        let request = native_request(request, fail_request)?;
        let key = JobKey(request.get_ref().key);
        match Native::fail_job(&self.native, request).await {
            Ok(_) => Ok(Response::new(zb::FailJobResponse {})),
            Err(status) => Err(self.gone_if_finished(key, status).await),
        }
    }

    async fn throw_error(
        &self,
        request: Request<zb::ThrowErrorRequest>,
    ) -> Result<Response<zb::ThrowErrorResponse>, Status> {
        let request = native_request(request, throw_request)?;
        let key = JobKey(request.get_ref().key);
        match Native::fail_job(&self.native, request).await {
            Ok(_) => Ok(Response::new(zb::ThrowErrorResponse {})),
            Err(status) => Err(self.gone_if_finished(key, status).await),
        }
    }

    async fn update_job_retries(
        &self,
        request: Request<zb::UpdateJobRetriesRequest>,
    ) -> Result<Response<zb::UpdateJobRetriesResponse>, Status> {
        let request = native_request(request, retries_request)?;
        let key = JobKey(request.get_ref().key);
        match Native::update_job_retries(&self.native, request).await {
            Ok(_) => Ok(Response::new(zb::UpdateJobRetriesResponse {})),
            Err(status) => Err(self.gone_if_finished(key, status).await),
        }
    }

    async fn update_job_timeout(
        &self,
        request: Request<zb::UpdateJobTimeoutRequest>,
    ) -> Result<Response<zb::UpdateJobTimeoutResponse>, Status> {
        let request = native_request(request, timeout_request)?;
        let key = JobKey(request.get_ref().key);
        match Native::update_job_timeout(&self.native, request).await {
            Ok(_) => Ok(Response::new(zb::UpdateJobTimeoutResponse {})),
            Err(status) => Err(self.gone_if_finished(key, status).await),
        }
    }

    async fn topology(&self, request: Request<zb::TopologyRequest>) -> Result<Response<zb::TopologyResponse>, Status> {
        let _running = self.ctx.request_started("topology");
        // Any principal: clients read the cluster's shape to connect.
        super::service::principal_of(&self.ctx, &request)?;
        let brokers = cluster_status(&self.ctx).await;
        let ctx = &self.ctx;
        Ok(Response::new(topology(brokers, ctx.cluster_size(), ctx.partition_count(), ctx.replication_factor)))
    }

    async fn cancel_process_instance(
        &self,
        _: Request<zb::CancelProcessInstanceRequest>,
    ) -> Result<Response<zb::CancelProcessInstanceResponse>, Status> {
        Self::no_engine("CancelProcessInstance")
    }

    async fn create_process_instance(
        &self,
        _: Request<zb::CreateProcessInstanceRequest>,
    ) -> Result<Response<zb::CreateProcessInstanceResponse>, Status> {
        Self::no_engine("CreateProcessInstance")
    }

    async fn create_process_instance_with_result(
        &self,
        _: Request<zb::CreateProcessInstanceWithResultRequest>,
    ) -> Result<Response<zb::CreateProcessInstanceWithResultResponse>, Status> {
        Self::no_engine("CreateProcessInstanceWithResult")
    }

    async fn evaluate_decision(
        &self,
        _: Request<zb::EvaluateDecisionRequest>,
    ) -> Result<Response<zb::EvaluateDecisionResponse>, Status> {
        Self::no_engine("EvaluateDecision")
    }

    async fn deploy_process(
        &self,
        _: Request<zb::DeployProcessRequest>,
    ) -> Result<Response<zb::DeployProcessResponse>, Status> {
        Self::no_engine("DeployProcess")
    }

    async fn deploy_resource(
        &self,
        _: Request<zb::DeployResourceRequest>,
    ) -> Result<Response<zb::DeployResourceResponse>, Status> {
        Self::no_engine("DeployResource")
    }

    async fn publish_message(
        &self,
        _: Request<zb::PublishMessageRequest>,
    ) -> Result<Response<zb::PublishMessageResponse>, Status> {
        Self::no_engine("PublishMessage")
    }

    async fn resolve_incident(
        &self,
        _: Request<zb::ResolveIncidentRequest>,
    ) -> Result<Response<zb::ResolveIncidentResponse>, Status> {
        Self::no_engine("ResolveIncident")
    }

    async fn set_variables(
        &self,
        _: Request<zb::SetVariablesRequest>,
    ) -> Result<Response<zb::SetVariablesResponse>, Status> {
        Self::no_engine("SetVariables")
    }

    async fn modify_process_instance(
        &self,
        _: Request<zb::ModifyProcessInstanceRequest>,
    ) -> Result<Response<zb::ModifyProcessInstanceResponse>, Status> {
        Self::no_engine("ModifyProcessInstance")
    }

    async fn migrate_process_instance(
        &self,
        _: Request<zb::MigrateProcessInstanceRequest>,
    ) -> Result<Response<zb::MigrateProcessInstanceResponse>, Status> {
        Self::no_engine("MigrateProcessInstance")
    }

    async fn delete_resource(
        &self,
        _: Request<zb::DeleteResourceRequest>,
    ) -> Result<Response<zb::DeleteResourceResponse>, Status> {
        Self::no_engine("DeleteResource")
    }

    async fn broadcast_signal(
        &self,
        _: Request<zb::BroadcastSignalRequest>,
    ) -> Result<Response<zb::BroadcastSignalResponse>, Status> {
        Self::no_engine("BroadcastSignal")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{fence_admits, MAX_PARTITIONS};

    fn native_job() -> pb::ActivatedJob {
        pb::ActivatedJob {
            key: JobKey::new(3, 42).0,
            r#type: "payment".into(),
            variables: r#"{"amount":5}"#.into(),
            custom_headers: [("region".to_string(), "eu".to_string())].into_iter().collect(),
            worker: "w-1".into(),
            retries: 2,
            deadline: 1_700_000_000_000,
            attempt: 9,
            tenant_id: "acme".into(),
            priority: 7,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            created_at: 1_600_000_000_000,
            stage: "charged".into(),
            job_token: String::new(),
        }
    }

    #[test]
    fn an_activation_key_carries_the_attempts_tag_and_names_the_job_and_that_tag() {
        for partition in [0, 1, MAX_PARTITIONS - 1] {
            for counter in [1, 2, (1 << 48) - 1] {
                let job = JobKey::new(partition, counter);
                assert_eq!(job.0 & TAG_BITS, 0, "a Drover key never uses the tag's bits");
                for attempt in 1..=30 {
                    let key = activation_key(job, attempt);
                    assert!(key > 0, "{key} must be a positive int64");
                    let (decoded, fence) = job_of(key).unwrap();
                    assert_eq!(decoded, job);
                    assert!(fence_admits(fence, attempt), "attempt {attempt} admitted by its own key");
                    assert!(!fence_admits(fence, attempt + 1), "the next attempt is fenced off");
                    assert!(fence_admits(fence, attempt + 7), "tags repeat every seven attempts");
                }
                // The key `drover job create` prints names any activation.
                assert_eq!(job_of(job.0 as i64).unwrap(), (job, 0));
            }
        }
        for invalid in [0, -1, i64::MIN] {
            assert!(matches!(job_of(invalid), Err(ApiError::NotFound(_))), "{invalid}");
        }
    }

    #[test]
    fn an_activated_job_maps_every_field_and_zeroes_the_process_fields() {
        let job = activated_job(native_job());
        assert_eq!(job.key, activation_key(JobKey::new(3, 42), 9));
        assert_eq!(job.r#type, "payment");
        assert_eq!(job.variables, r#"{"amount":5}"#);
        assert_eq!(job.custom_headers, r#"{"region":"eu"}"#);
        assert_eq!(job.worker, "w-1");
        assert_eq!(job.retries, 2);
        assert_eq!(job.deadline, 1_700_000_000_000);
        assert_eq!(job.tenant_id, "acme");
        assert_eq!((job.process_instance_key, job.process_definition_key, job.process_definition_version), (0, 0, 0));
        assert_eq!((job.bpmn_process_id.as_str(), job.element_id.as_str(), job.element_instance_key), ("", "", 0));

        let bare = activated_job(pb::ActivatedJob { variables: String::new(), ..native_job() });
        assert_eq!(bare.variables, "{}", "no variables is an empty object, never an empty string");
        let bare = activated_job(pb::ActivatedJob { custom_headers: Default::default(), ..native_job() });
        assert_eq!(bare.custom_headers, "{}");
        let quoted = activated_job(pb::ActivatedJob {
            custom_headers: [("a\"b".to_string(), "x\ny".to_string())].into_iter().collect(),
            ..native_job()
        });
        let parsed: serde_json::Value = serde_json::from_str(&quoted.custom_headers).unwrap();
        assert_eq!(parsed["a\"b"], "x\ny", "headers are escaped as JSON");
    }

    #[test]
    fn activation_requests_clamp_what_zeebe_clients_send() {
        let limits = Limits { max_jobs_to_activate: 1000, zeebe_long_poll_ms: 10_000, ..Limits::default() };
        let zeebe = zb::ActivateJobsRequest {
            r#type: "t".into(),
            worker: String::new(),
            timeout: 30_000,
            max_jobs_to_activate: 32,
            fetch_variable: vec!["a".into()],
            request_timeout: 0,
            tenant_ids: vec!["acme".into()],
        };
        let native = activate_request(zeebe.clone(), &limits, vec![]).unwrap();
        assert_eq!(native.r#type, "t");
        assert_eq!(native.worker, "", "a blank worker is accepted (Drover names it \"default\")");
        assert_eq!(native.timeout, 30_000);
        assert_eq!(native.max_jobs_to_activate, 32);
        assert_eq!(native.fetch_variable, ["a"]);
        assert_eq!(native.request_timeout, 10_000, "0 is the default long poll");
        assert_eq!(native.tenant_ids, ["acme"]);
        assert_eq!(native.session_id, 0);

        let clamp = |max, poll| {
            let r = zb::ActivateJobsRequest { max_jobs_to_activate: max, request_timeout: poll, ..zeebe.clone() };
            activate_request(r, &limits, vec![]).map(|n| (n.max_jobs_to_activate, n.request_timeout))
        };
        assert_eq!(clamp(5000, -1).unwrap(), (1000, 0), "over the limit clamps; negative polls not at all");
        assert_eq!(clamp(1, 2500).unwrap(), (1, 2500));
        assert!(matches!(clamp(0, 0), Err(ApiError::InvalidArgument(_))), "Zeebe refuses 0 jobs too");
    }

    #[test]
    fn job_requests_carry_the_fence_and_clamp_negative_failures() {
        let key = activation_key(JobKey::new(1, 7), 2);
        let fence = job_of(key).unwrap().1;
        let complete =
            complete_request(zb::CompleteJobRequest { job_key: key, variables: r#"{"ok":true}"#.into() }).unwrap();
        assert_eq!(
            (complete.key, complete.attempt, complete.variables.as_str()),
            (JobKey::new(1, 7).0, fence, r#"{"ok":true}"#)
        );

        let fail = fail_request(zb::FailJobRequest {
            job_key: key,
            retries: -3,
            error_message: "boom".into(),
            retry_back_off: -10,
            variables: r#"{"n":1}"#.into(),
        })
        .unwrap();
        assert_eq!((fail.retries, fail.retry_back_off), (0, 0), "negative retries and back-off clamp to 0");
        assert_eq!((fail.key, fail.attempt, fail.error_message.as_str()), (JobKey::new(1, 7).0, fence, "boom"));
        assert_eq!((fail.variables.as_str(), fail.reason.as_str()), (r#"{"n":1}"#, ""));
        let kept =
            fail_request(zb::FailJobRequest { job_key: key, retries: 4, retry_back_off: 250, ..Default::default() })
                .unwrap();
        assert_eq!((kept.retries, kept.retry_back_off), (4, 250));

        let thrown = throw_request(zb::ThrowErrorRequest {
            job_key: key,
            error_code: "NO_FUNDS".into(),
            error_message: "balance 0".into(),
            variables: "{}".into(),
        })
        .unwrap();
        assert_eq!((thrown.retries, thrown.reason.as_str()), (0, "business-error"));
        assert_eq!(thrown.error_message, "error NO_FUNDS thrown by the worker: balance 0");
        assert_eq!(thrown.attempt, fence);
        assert!(matches!(
            throw_request(zb::ThrowErrorRequest { job_key: key, ..Default::default() }),
            Err(ApiError::InvalidArgument(_))
        ));

        let timeout = timeout_request(zb::UpdateJobTimeoutRequest { job_key: key, timeout: 5000 }).unwrap();
        assert_eq!((timeout.key, timeout.timeout, timeout.attempt), (JobKey::new(1, 7).0, 5000, fence));
        let retries = retries_request(zb::UpdateJobRetriesRequest { job_key: key, retries: 3 }).unwrap();
        assert_eq!((retries.key, retries.retries), (JobKey::new(1, 7).0, 3), "retries are not fenced");

        let stream = stream_request(
            zb::StreamActivatedJobsRequest {
                r#type: "t".into(),
                worker: "w".into(),
                timeout: 100,
                fetch_variable: vec!["x".into()],
                tenant_ids: vec!["acme".into()],
            },
            vec!["region:eu".into()],
        );
        assert_eq!(stream.labels, vec!["region:eu"], "a Zeebe worker has its gateway's region");
        assert_eq!((stream.r#type.as_str(), stream.worker.as_str(), stream.timeout), ("t", "w", 100));
        assert_eq!((stream.fetch_variable, stream.tenant_ids), (vec!["x".to_string()], vec!["acme".to_string()]));
        assert_eq!((stream.max_jobs_in_flight, stream.session_id), (0, 0));
    }

    #[test]
    fn replies_are_cut_to_the_message_limit_and_a_job_too_large_for_one_is_set_apart() {
        let job = |bytes: usize| zb::ActivatedJob {
            variables: format!(r#"{{"b":"{}"}}"#, "x".repeat(bytes)),
            ..Default::default()
        };
        let jobs = vec![job(1_500_000), job(1_500_000), job(1_500_000), job(5_000_000), job(10)];
        let (replies, too_large) = split_replies(jobs, MAX_MESSAGE_BYTES);
        assert_eq!(too_large.len(), 1);
        assert_eq!(replies.iter().map(|r| r.jobs.len()).collect::<Vec<_>>(), [2, 2]);
        for reply in &replies {
            assert!(reply.encoded_len() <= MAX_MESSAGE_BYTES, "a reply of {} bytes", reply.encoded_len());
        }
        assert_eq!(replies[1].jobs[1].variables.len(), r#"{"b":""}"#.len() + 10, "order is kept");
        assert!(split_replies(Vec::new(), MAX_MESSAGE_BYTES).0.is_empty(), "no jobs, no message");
    }

    #[test]
    fn topology_sets_every_role_and_numbers_partitions_from_one() {
        use zb::partition::{PartitionBrokerHealth as Health, PartitionBrokerRole as Role};
        let part = |id, role: &str, health: &str| pb::PartitionInfo {
            partition_id: id,
            role: role.into(),
            health: health.into(),
            ..Default::default()
        };
        let brokers = vec![
            pb::BrokerInfo {
                node_id: 2,
                address: "10.0.0.2:26500".into(),
                partitions: vec![part(0, "follower", "healthy"), part(1, "candidate", "unhealthy")],
            },
            pb::BrokerInfo {
                node_id: 3,
                address: "[::1]:26501".into(),
                partitions: vec![part(0, "leader", "healthy")],
            },
        ];
        let roles =
            |b: &zb::BrokerInfo| b.partitions.iter().map(|p| (p.partition_id, p.role, p.health)).collect::<Vec<_>>();
        let answer = topology(brokers, 3, 2, 3);
        assert_eq!((answer.cluster_size, answer.partitions_count, answer.replication_factor), (3, 2, 3));
        assert_eq!(answer.gateway_version, VERSION);
        let mapped = answer.brokers;
        assert_eq!((mapped[0].host.as_str(), mapped[0].port), ("10.0.0.2", 26500));
        assert_eq!((mapped[1].host.as_str(), mapped[1].port), ("::1", 26501));
        assert_eq!(
            roles(&mapped[0]),
            [(1, Role::Follower as i32, Health::Healthy as i32), (2, Role::Inactive as i32, Health::Unhealthy as i32)]
        );
        assert_eq!(roles(&mapped[1]), [(1, Role::Leader as i32, Health::Healthy as i32)]);
        assert!(mapped.iter().all(|b| b.version == VERSION));
        assert!(VERSION.split('.').count() == 3 && VERSION.split('.').all(|p| p.parse::<u32>().is_ok()));
    }
}
