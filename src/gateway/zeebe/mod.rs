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

mod convert;

use futures::{Stream, StreamExt};
use prost::Message;
use tonic::{Request, Response, Status};

pub use convert::*;

use super::api::{ApiError, Call, JobApi};
use crate::context::NodeContext;
use crate::core::FailReason;
use crate::proto::gateway as pb;
use crate::proto::zeebe as zb;
use crate::proto::zeebe::gateway_server::Gateway;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The largest message a Zeebe client accepts by default (gRPC's 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

pub struct ZeebeService {
    api: JobApi,
    ctx: Arc<NodeContext>,
}

impl ZeebeService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        ZeebeService { api: JobApi::new(Arc::clone(&ctx)), ctx }
    }

    /// Runs a job command the Zeebe request `request` translates to.
    async fn on_job<Z, N, F, Fut, T>(
        &self,
        request: Request<Z>,
        translate: impl FnOnce(Z) -> Result<N, ApiError>,
        run: F,
        answer: T,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(JobApi, Call, N) -> Fut,
        Fut: std::future::Future<Output = Result<(), ApiError>>,
    {
        let call = Call::of(&request)?;
        let native = translate(request.into_inner())?;
        match run(self.api.clone(), call, native).await {
            Ok(()) => Ok(Response::new(answer)),
            // Zeebe deletes completed and cancelled jobs: a finished job is
            // gone for its clients.
            Err(ApiError::Finished(message)) => Err(Status::not_found(message)),
            Err(error) => Err(error.into()),
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
    let api = JobApi::new(Arc::clone(ctx));
    // The broker's own action, not the client's: it needs no token.
    let call = Call::system(ctx.settings.request_timeout);
    tokio::spawn(async move {
        if let Err(error) = api.fail(&call, request).await {
            tracing::warn!(%key, %error, "could not raise the incident of a job too large for a Zeebe client");
        }
    });
}

#[tonic::async_trait]
impl Gateway for ZeebeService {
    type ActivateJobsStream = BoxStream<zb::ActivateJobsResponse>;
    type StreamActivatedJobsStream = BoxStream<zb::ActivatedJob>;

    async fn activate_jobs(
        &self,
        request: Request<zb::ActivateJobsRequest>,
    ) -> Result<Response<Self::ActivateJobsStream>, Status> {
        let call = Call::of(&request)?;
        let labels = self.ctx.topology.default_worker_labels();
        let request = activate_request(request.into_inner(), &self.ctx.settings.limits, labels)?;
        let jobs: Vec<_> = self.api.activate(&call, request).await?.into_iter().map(activated_job).collect();
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
        let call = Call::of(&request)?;
        let request = stream_request(request.into_inner(), self.ctx.topology.default_worker_labels());
        let jobs = self.api.open_stream(&call, request).await?;
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
        let run = |api: JobApi, call: Call, r| async move { api.complete(&call, r).await };
        self.on_job(request, complete_request, run, zb::CompleteJobResponse {}).await
    }

    async fn fail_job(&self, request: Request<zb::FailJobRequest>) -> Result<Response<zb::FailJobResponse>, Status> {
        let run = |api: JobApi, call: Call, r| async move { api.fail(&call, r).await.map(drop) };
        self.on_job(request, fail_request, run, zb::FailJobResponse {}).await
    }

    async fn throw_error(
        &self,
        request: Request<zb::ThrowErrorRequest>,
    ) -> Result<Response<zb::ThrowErrorResponse>, Status> {
        let run = |api: JobApi, call: Call, r| async move { api.fail(&call, r).await.map(drop) };
        self.on_job(request, throw_request, run, zb::ThrowErrorResponse {}).await
    }

    async fn update_job_retries(
        &self,
        request: Request<zb::UpdateJobRetriesRequest>,
    ) -> Result<Response<zb::UpdateJobRetriesResponse>, Status> {
        let run = |api: JobApi, call: Call, r| async move { api.update_retries(&call, r).await };
        self.on_job(request, retries_request, run, zb::UpdateJobRetriesResponse {}).await
    }

    async fn update_job_timeout(
        &self,
        request: Request<zb::UpdateJobTimeoutRequest>,
    ) -> Result<Response<zb::UpdateJobTimeoutResponse>, Status> {
        let run = |api: JobApi, call: Call, r| async move { api.update_timeout(&call, r).await.map(|_| ()) };
        self.on_job(request, timeout_request, run, zb::UpdateJobTimeoutResponse {}).await
    }

    async fn topology(&self, request: Request<zb::TopologyRequest>) -> Result<Response<zb::TopologyResponse>, Status> {
        let call = Call::of(&request)?;
        let t = self.api.topology(&call).await;
        Ok(Response::new(topology(t.brokers, t.cluster_size, t.partitions_count, t.replication_factor)))
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
