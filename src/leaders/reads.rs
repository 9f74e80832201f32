//! Reads from partition leaders: a job by key or idempotency key, a page of
//! a partition's jobs, a page of its lifecycle events. Each goes to the
//! partition's leader, here or on another node, as commands do
//! ([`super::router`]), but answers from the leader's applied state without
//! a log entry.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::ApiError;
use super::router::{FIRST_BACK_OFF, MAX_BACK_OFF};
use crate::context::NodeContext;
use crate::core::{Job, JobFilter, JobKey, JobRef, PartitionId, RequestId};
use crate::proto::cluster::{DescribeRequest, ListJobsRequest, ReadEventsRequest};
use crate::raft::{EventsPage, Replica};
use crate::transport::PeerClient;

/// Reads a job from its partition's leader.
pub async fn describe(ctx: &NodeContext, key: JobKey, deadline: Instant) -> Result<Job, ApiError> {
    read(ctx, &JobRef::Key(key), None, deadline).await
}

/// Reads a job from its partition's leader; with `final_by`, the leader
/// answers once the job is final or at that time, whichever comes first. A
/// job named by its idempotency key is looked for under each partition
/// count the key may have been made under ([`key_partitions`]).
pub async fn read(
    ctx: &NodeContext,
    job: &JobRef,
    final_by: Option<Instant>,
    deadline: Instant,
) -> Result<Job, ApiError> {
    let JobRef::Request(request @ RequestId::Key { .. }) = job else {
        return read_on(ctx, job.partition(ctx.topology.partition_count()), job, final_by, deadline).await;
    };
    let mut not_found = None;
    for partition in super::keys::key_partitions(ctx, request) {
        match read_on(ctx, partition, job, final_by, deadline).await {
            Err(ApiError::NotFound(message)) => not_found = Some(ApiError::NotFound(message)),
            answer => return answer,
        }
    }
    Err(not_found.unwrap_or_else(|| no_record(job)))
}

async fn read_on(
    ctx: &NodeContext,
    partition: PartitionId,
    job: &JobRef,
    final_by: Option<Instant>,
    deadline: Instant,
) -> Result<Job, ApiError> {
    if partition >= ctx.topology.partition_count() {
        return Err(ApiError::NotFound(format!(
            "no job with {job} (it names partition {partition}, which does not exist)"
        )));
    }
    metrics::counter!(crate::metrics::JOB_READS).increment(1);
    let request_bytes: bytes::Bytes = match job {
        JobRef::Key(_) => Default::default(),
        JobRef::Request(request) => bincode::serialize(request).map_err(|e| ApiError::Internal(e.to_string()))?.into(),
    };
    let key = match job {
        JobRef::Key(key) => key.0,
        JobRef::Request(_) => 0,
    };
    let wait = || final_by.map_or(Duration::ZERO, |at| at.saturating_duration_since(Instant::now()));
    let local = |replica: Arc<Replica>| async move {
        let state = replica.state();
        let Some(key) = state.resolve(job) else { return Err(no_record(job)) };
        state.await_final(key, wait()).await?.ok_or_else(|| no_record(job))
    };
    let remote = |mut client: PeerClient, timeout: Duration| {
        let request_bytes = request_bytes.clone();
        async move {
            let wait_ms = wait().as_millis() as u64;
            let mut request =
                tonic::Request::new(DescribeRequest { partition_id: partition, key, request: request_bytes, wait_ms });
            request.set_timeout(timeout.max(Duration::from_millis(wait_ms)));
            let reply = client.describe(request).await.ok()?.into_inner();
            if reply.code != 0 {
                return None;
            }
            let found: Result<Option<Job>, _> = bincode::deserialize(&reply.job);
            Some(found.map_err(|e| ApiError::Internal(e.to_string())).and_then(|f| f.ok_or_else(|| no_record(job))))
        }
    };
    on_leader(ctx, partition, deadline, local, remote).await
}

/// Up to `limit` of a partition's jobs matching `filter` with keys after
/// `after`, in key order, of `tenants` (empty: every tenant), from its leader.
pub async fn list(
    ctx: &NodeContext,
    partition: PartitionId,
    (filter, tenants): (&JobFilter, &[String]),
    after: JobKey,
    limit: usize,
    deadline: Instant,
) -> Result<Vec<Job>, ApiError> {
    let encoded: bytes::Bytes = bincode::serialize(filter).map_err(|e| ApiError::Internal(e.to_string()))?.into();
    let max_bytes = ctx.settings.limits.max_request_bytes();
    let local =
        |replica: Arc<Replica>| async move { Ok(replica.state().list(filter, tenants, after, limit, max_bytes)?) };
    let remote = |mut client: PeerClient, timeout: Duration| {
        let filter = encoded.clone();
        async move {
            let mut request = tonic::Request::new(ListJobsRequest {
                partition_id: partition,
                filter,
                after: after.0,
                limit: limit as u32,
                tenants: tenants.to_vec(),
            });
            request.set_timeout(timeout);
            let reply = client.list_jobs(request).await.ok()?.into_inner();
            if reply.code != 0 {
                return None;
            }
            let jobs: Result<Vec<Job>, _> = bincode::deserialize(&reply.jobs);
            Some(jobs.map_err(|e| ApiError::Internal(e.to_string())))
        }
    };
    on_leader(ctx, partition, deadline, local, remote).await
}

/// Up to about `limit` of a partition's lifecycle events after log index
/// `after`, from its leader.
pub async fn events(
    ctx: &NodeContext,
    partition: PartitionId,
    after: u64,
    limit: usize,
    deadline: Instant,
) -> Result<EventsPage, ApiError> {
    // Older builds keep no events and serve no such read: the one read with a
    // version gate of its own.
    super::require_cluster_version(ctx, crate::core::PAUSED_QUEUES, "lifecycle events")?;
    let local = |replica: Arc<Replica>| async move { Ok(replica.state().events(after, limit)?) };
    let remote = |mut client: PeerClient, timeout: Duration| async move {
        let mut request =
            tonic::Request::new(ReadEventsRequest { partition_id: partition, after, limit: limit as u32 });
        request.set_timeout(timeout);
        let reply = client.read_events(request).await.ok()?.into_inner();
        if reply.code != 0 {
            return None;
        }
        let page: Result<EventsPage, _> = bincode::deserialize(&reply.page);
        Some(page.map_err(|e| ApiError::Internal(e.to_string())))
    };
    on_leader(ctx, partition, deadline, local, remote).await
}

/// Runs a read on a partition's leader: on this node's replica when this
/// node leads the partition, else on the node the leader hints name (`remote`
/// answers `None` when that node did not lead it), backing off until
/// `deadline`, then UNAVAILABLE.
async fn on_leader<T, L, LF, R, RF>(
    ctx: &NodeContext,
    partition: PartitionId,
    deadline: Instant,
    local: L,
    remote: R,
) -> Result<T, ApiError>
where
    L: Fn(Arc<Replica>) -> LF,
    LF: Future<Output = Result<T, ApiError>>,
    R: Fn(PeerClient, Duration) -> RF,
    RF: Future<Output = Option<Result<T, ApiError>>>,
{
    let started = Instant::now();
    let mut back_off = FIRST_BACK_OFF;
    let mut rotation = 0usize;
    loop {
        if ctx.routing.local_leader(partition).is_some() {
            if let Some(replica) = ctx.routing.replica(partition) {
                return local(replica).await;
            }
        }
        let target = ctx.routing.leader_hint(partition, rotation);
        rotation += 1;
        if let Some(node) = target.filter(|n| *n != ctx.topology.node_id) {
            if let Some(client) = ctx.transport.peers.client(node) {
                let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                if let Some(result) = remote(client, timeout).await {
                    return result;
                }
            }
        }
        if Instant::now() + back_off >= deadline {
            return Err(ApiError::no_leader(partition, started.elapsed().as_millis()));
        }
        ctx.routing.back_off_for_leader(partition, back_off).await;
        back_off = (back_off * 2).min(MAX_BACK_OFF);
    }
}

/// NOT_FOUND for a job whose partition exists but holds no record of it.
fn no_record(job: &JobRef) -> ApiError {
    match job {
        JobRef::Key(key) => ApiError::NotFound(format!(
            "no job with key {key} (records of completed and cancelled jobs are kept only for the retention period)"
        )),
        JobRef::Request(request) => ApiError::NotFound(format!(
            "no job for {request} (a key names its job only within its idempotency window, and records of \
             completed and cancelled jobs are kept only for the retention period)"
        )),
    }
}
