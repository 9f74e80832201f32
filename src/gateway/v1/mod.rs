//! `drover.v1.Gateway` over tonic: each RPC reads the [`Call`] the call
//! layer made, hands its message to the [`JobApi`], and wraps the answer.
//! Nothing here checks who may do what: the call layer authenticated the
//! caller, the job API authorizes the body.

mod chunks;
pub mod client_streams;

use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::api::{Call, JobApi};
use crate::context::NodeContext;
use crate::proto::gateway::gateway_server::Gateway;
use crate::proto::gateway::*;
use crate::streams::{ClientBatches, ClientStream};
use client_streams::{batch_too_large, chunked, rebatch, unbatch, BoxStream};

pub struct GatewayService {
    api: JobApi,
}

impl GatewayService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        GatewayService { api: JobApi::new(ctx) }
    }
}

/// The call and message of a unary request.
fn parts<T>(request: Request<T>) -> Result<(Call, T), Status> {
    let call = Call::of(&request)?;
    Ok((call, request.into_inner()))
}

fn once<T: Send + 'static>(reply: T) -> BoxStream<T> {
    Box::pin(futures::stream::iter([Ok(reply)]))
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
    type ReadBackupStream = BoxStream<BackupChunk>;

    async fn create_job(&self, request: Request<CreateJobRequest>) -> Result<Response<CreateJobResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.create(&call, request).await?))
    }

    async fn create_jobs(
        &self,
        request: Request<Streaming<CreateJobRequest>>,
    ) -> Result<Response<Self::CreateJobsStream>, Status> {
        let (call, requests) = parts(request)?;
        let api = self.api.clone();
        Ok(Response::new(chunked("CreateJobs", requests, move |chunk| {
            let (api, call) = (api.clone(), call.clone());
            async move { api.create_many(&call, chunk).await }
        })))
    }

    async fn create_job_batches(
        &self,
        request: Request<Streaming<CreateJobBatch>>,
    ) -> Result<Response<Self::CreateJobBatchesStream>, Status> {
        let (call, batches) = parts(request)?;
        let api = self.api.clone();
        Ok(Response::new(chunked("CreateJobBatches", batches, move |batches: Vec<CreateJobBatch>| {
            let (api, call) = (api.clone(), call.clone());
            let (requests, shapes) = unbatch(batches.into_iter().map(|b| b.jobs).collect());
            async move {
                let answers = api.create_many(&call, requests).await;
                let refused =
                    |n| CreateJobResponse { error: Some(batch_too_large(n).to_proto()), ..Default::default() };
                rebatch(answers, shapes, refused).into_iter().map(|jobs| CreateJobBatchResponse { jobs }).collect()
            }
        })))
    }

    async fn activate_jobs(
        &self,
        request: Request<ActivateJobsRequest>,
    ) -> Result<Response<Self::ActivateJobsStream>, Status> {
        let (call, request) = parts(request)?;
        let jobs = self.api.activate(&call, request).await?;
        Ok(Response::new(once(ActivateJobsResponse { jobs })))
    }

    async fn stream_activated_jobs(
        &self,
        request: Request<StreamActivatedJobsRequest>,
    ) -> Result<Response<Self::StreamActivatedJobsStream>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.open_stream(&call, request).await?))
    }

    async fn stream_activated_job_batches(
        &self,
        request: Request<StreamActivatedJobsRequest>,
    ) -> Result<Response<Self::StreamActivatedJobBatchesStream>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(ClientBatches::new(self.api.open_stream(&call, request).await?)))
    }

    async fn complete_job(
        &self,
        request: Request<CompleteJobRequest>,
    ) -> Result<Response<CompleteJobResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.complete(&call, request).await?;
        Ok(Response::new(CompleteJobResponse {}))
    }

    async fn complete_jobs(
        &self,
        request: Request<Streaming<CompleteJobRequest>>,
    ) -> Result<Response<Self::CompleteJobsStream>, Status> {
        let (call, requests) = parts(request)?;
        self.api.may_complete_many(&call)?;
        let api = self.api.clone();
        Ok(Response::new(chunked("CompleteJobs", requests, move |chunk| {
            let (api, call) = (api.clone(), call.clone());
            async move { api.complete_many(&call, chunk).await }
        })))
    }

    async fn complete_job_batches(
        &self,
        request: Request<Streaming<CompleteJobBatch>>,
    ) -> Result<Response<Self::CompleteJobBatchesStream>, Status> {
        let (call, batches) = parts(request)?;
        self.api.may_complete_many(&call)?;
        let api = self.api.clone();
        Ok(Response::new(chunked("CompleteJobBatches", batches, move |batches: Vec<CompleteJobBatch>| {
            let (api, call) = (api.clone(), call.clone());
            let keys: Vec<Vec<u64>> = batches.iter().map(|b| b.jobs.iter().map(|j| j.key).collect()).collect();
            let (requests, shapes) = unbatch(batches.into_iter().map(|b| b.jobs).collect());
            async move {
                let answers = api.complete_many(&call, requests).await;
                let refused = |n| CompleteJobsResponse { key: 0, error: Some(batch_too_large(n).to_proto()) };
                let mut batches = rebatch(answers, shapes, refused);
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
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.fail(&call, request).await?))
    }

    async fn update_job_timeout(
        &self,
        request: Request<UpdateJobTimeoutRequest>,
    ) -> Result<Response<UpdateJobTimeoutResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.update_timeout(&call, request).await?))
    }

    async fn update_job_retries(
        &self,
        request: Request<UpdateJobRetriesRequest>,
    ) -> Result<Response<UpdateJobRetriesResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.update_retries(&call, request).await?;
        Ok(Response::new(UpdateJobRetriesResponse {}))
    }

    async fn cancel_job(&self, request: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.cancel(&call, request).await?;
        Ok(Response::new(CancelJobResponse {}))
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(GetJobResponse { job: Some(self.api.get(&call, request).await?) }))
    }

    async fn get_job_history(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobHistoryResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.history(&call, request).await?))
    }

    async fn await_job(&self, request: Request<AwaitJobRequest>) -> Result<Response<Self::AwaitJobStream>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(once(self.api.await_job(&call, request).await?)))
    }

    async fn checkpoint_job(
        &self,
        request: Request<CheckpointJobRequest>,
    ) -> Result<Response<CheckpointJobResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.checkpoint(&call, request).await?))
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.list(&call, request).await?))
    }

    async fn retry_jobs(&self, request: Request<RetryJobsRequest>) -> Result<Response<BulkJobsResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.retry_jobs(&call, request).await?))
    }

    async fn cancel_jobs(&self, request: Request<CancelJobsRequest>) -> Result<Response<BulkJobsResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.cancel_jobs(&call, request).await?))
    }

    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.register_worker(&call, request).await?))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.heartbeat(&call, request).await?))
    }

    async fn deregister_worker(
        &self,
        request: Request<DeregisterWorkerRequest>,
    ) -> Result<Response<DeregisterWorkerResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.deregister_worker(&call, request).await?;
        Ok(Response::new(DeregisterWorkerResponse {}))
    }

    async fn list_workers(
        &self,
        request: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(ListWorkersResponse { workers: self.api.list_workers(&call, request).await? }))
    }

    async fn set_worker_state(
        &self,
        request: Request<SetWorkerStateRequest>,
    ) -> Result<Response<SetWorkerStateResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(SetWorkerStateResponse { workers: self.api.set_worker_state(&call, request).await? }))
    }

    async fn set_schema(&self, request: Request<SetSchemaRequest>) -> Result<Response<SetSchemaResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.set_schema(&call, request).await?;
        Ok(Response::new(SetSchemaResponse {}))
    }

    async fn get_schema(&self, request: Request<GetSchemaRequest>) -> Result<Response<GetSchemaResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(GetSchemaResponse { schema: self.api.get_schema(&call, request).await? }))
    }

    async fn set_queue_paused(
        &self,
        request: Request<SetQueuePausedRequest>,
    ) -> Result<Response<SetQueuePausedResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(SetQueuePausedResponse { queue: Some(self.api.set_queue_paused(&call, request).await?) }))
    }

    async fn set_queue_limit(
        &self,
        request: Request<SetQueueLimitRequest>,
    ) -> Result<Response<SetQueueLimitResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(SetQueueLimitResponse { queue: Some(self.api.set_queue_limit(&call, request).await?) }))
    }

    async fn list_queues(&self, request: Request<ListQueuesRequest>) -> Result<Response<ListQueuesResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(ListQueuesResponse { queues: self.api.list_queues(&call, request).await? }))
    }

    async fn put_schedule(
        &self,
        request: Request<PutScheduleRequest>,
    ) -> Result<Response<PutScheduleResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.put_schedule(&call, request).await?))
    }

    async fn get_schedule(&self, request: Request<GetScheduleRequest>) -> Result<Response<Schedule>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.get_schedule(&call, request).await?))
    }

    async fn list_schedules(
        &self,
        request: Request<ListSchedulesRequest>,
    ) -> Result<Response<ListSchedulesResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(ListSchedulesResponse { schedules: self.api.list_schedules(&call, request).await? }))
    }

    async fn delete_schedule(&self, request: Request<GetScheduleRequest>) -> Result<Response<Schedule>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.delete_schedule(&call, request).await?))
    }

    async fn set_schedule_paused(
        &self,
        request: Request<SetSchedulePausedRequest>,
    ) -> Result<Response<Schedule>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.set_schedule_paused(&call, request).await?))
    }

    async fn create_workflow(&self, request: Request<CreateWorkflowRequest>) -> Result<Response<Workflow>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.create_workflow(&call, request).await?))
    }

    async fn get_workflow(&self, request: Request<GetWorkflowRequest>) -> Result<Response<Workflow>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.get_workflow(&call, request).await?))
    }

    async fn list_workflows(
        &self,
        request: Request<ListWorkflowsRequest>,
    ) -> Result<Response<ListWorkflowsResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(ListWorkflowsResponse { workflows: self.api.list_workflows(&call, request).await? }))
    }

    async fn cancel_workflow(&self, request: Request<GetWorkflowRequest>) -> Result<Response<Workflow>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.cancel_workflow(&call, request).await?))
    }

    type WatchEventsStream = BoxStream<LifecycleEvent>;

    async fn watch_events(
        &self,
        request: Request<WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let (call, request) = parts(request)?;
        let (cursor, filter) = self.api.events_request(&call, request).await?;
        Ok(Response::new(Box::pin(self.api.watch_events(&call, cursor, filter)?)))
    }

    async fn get_cluster_plan(&self, request: Request<GetClusterPlanRequest>) -> Result<Response<ClusterPlan>, Status> {
        let (call, _) = parts(request)?;
        Ok(Response::new(self.api.get_cluster_plan(&call).await?))
    }

    async fn change_cluster_plan(
        &self,
        request: Request<ChangeClusterPlanRequest>,
    ) -> Result<Response<ClusterPlan>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.change_cluster_plan(&call, request).await?))
    }

    async fn topology(&self, request: Request<TopologyRequest>) -> Result<Response<TopologyResponse>, Status> {
        let (call, _) = parts(request)?;
        Ok(Response::new(self.api.topology(&call).await))
    }

    async fn start_backup(
        &self,
        request: Request<StartBackupRequest>,
    ) -> Result<Response<StartBackupResponse>, Status> {
        let (call, request) = parts(request)?;
        Ok(Response::new(self.api.start_backup(&call, request).await?))
    }

    async fn read_backup(
        &self,
        request: Request<ReadBackupRequest>,
    ) -> Result<Response<Self::ReadBackupStream>, Status> {
        let (call, request) = parts(request)?;
        let chunks = self.api.read_backup(&call, request).await?;
        Ok(Response::new(Box::pin(chunks.map(|chunk| chunk.map_err(Status::from)))))
    }

    async fn release_backup(
        &self,
        request: Request<ReleaseBackupRequest>,
    ) -> Result<Response<ReleaseBackupResponse>, Status> {
        let (call, request) = parts(request)?;
        self.api.release_backup(&call, request).await?;
        Ok(Response::new(ReleaseBackupResponse {}))
    }
}
