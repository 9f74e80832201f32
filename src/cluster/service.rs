//! The cluster gRPC service.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use super::links::from_spec;
use crate::context::NodeContext;
use crate::core::{ActivatedJobData, Command, JobKey, JobRef};
use crate::leaders;
use crate::proto::cluster::cluster_server::Cluster;
use crate::proto::cluster::*;
use crate::raft::RpcKind;
use crate::streams::PushOutcome;

/// The longest a peer's read waits for a job to become final.
const MAX_DESCRIBE_WAIT_MS: u64 = 600_000;
/// The most jobs one listing answer carries.
const MAX_LIST_LIMIT: usize = 1000;

pub struct ClusterService {
    ctx: Arc<OnceLock<Arc<NodeContext>>>,
}

/// What the cluster port answers before the node serves: calls, and each
/// message on a stream, whenever it arrives in that time.
const STARTING: &str = "node is starting";

impl ClusterService {
    pub fn new(ctx: Arc<OnceLock<Arc<NodeContext>>>) -> Self {
        ClusterService { ctx }
    }

    fn ctx(&self) -> Result<&Arc<NodeContext>, Status> {
        self.ctx.get().ok_or_else(|| Status::unavailable(STARTING))
    }

    async fn raft(&self, kind: RpcKind, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let ctx = self.ctx()?;
        Ok(Response::new(raft_reply(ctx, kind, request.into_inner()).await))
    }
}

/// Counts a message on a stream between nodes as the request it stands for
/// (an append, a push, a release), so a job's messages between nodes read the
/// same whether they came as calls or on streams.
fn count_request(method: &'static str) {
    metrics::counter!(crate::metrics::CLUSTER_REQUESTS, "method" => method, "code" => "Ok").increment(1);
}

/// A gateway's answer to a push of jobs to one of its streams. A node still
/// starting (`None`) holds no streams: whatever the caller registered was its
/// previous run's.
async fn push_reply(ctx: Option<&Arc<NodeContext>>, request: PushRequest) -> Result<PushReply, Status> {
    let Some(ctx) = ctx else {
        return Ok(PushReply { unknown_stream: true, ..Default::default() });
    };
    let jobs: Vec<ActivatedJobData> = bincode::deserialize(&request.jobs)
        .map_err(|e| Status::invalid_argument(format!("malformed pushed jobs: {e}")))?;
    let keys: Vec<u64> = jobs.iter().map(|j| j.key.0).collect();
    Ok(match ctx.gateway.streams.push(request.stream_id, request.partition_id, jobs).await {
        PushOutcome::Answered { rejected, room } => {
            PushReply { rejected: rejected.into_iter().map(|k| k.0).collect(), room, ..Default::default() }
        }
        PushOutcome::NotDelivered { unknown_stream, .. } => {
            PushReply { rejected: keys, unknown_stream, ..Default::default() }
        }
        PushOutcome::Unknown { .. } => PushReply { outcome_unknown: true, ..Default::default() },
    })
}

/// Frees the released activations' slots in this gateway's streams.
fn release(ctx: &NodeContext, request: ReleaseJobsRequest) {
    for activation in request.activations {
        ctx.gateway.streams.release(JobKey(activation.key), activation.attempt);
    }
}

/// This node's answer to a command batch another node's gateway forwarded:
/// the batch runs only if this node leads its partition (a forward is never
/// forwarded again), and the reply says the outcome or why it did not run.
async fn forward_reply(ctx: &NodeContext, request: ForwardRequest, deadline: Instant) -> Result<ForwardReply, Status> {
    let commands: Vec<Command> = bincode::deserialize(&request.commands)
        .map_err(|e| Status::invalid_argument(format!("malformed forwarded commands: {e}")))?;
    let principal: Option<Arc<crate::auth::Principal>> = if request.principal.is_empty() {
        None
    } else {
        Some(Arc::new(
            bincode::deserialize(&request.principal)
                .map_err(|e| Status::invalid_argument(format!("malformed forwarded principal: {e}")))?,
        ))
    };
    Ok(match leaders::submit_here(ctx, principal.as_ref(), request.partition_id, commands, deadline).await {
        Ok(Ok(results)) => ForwardReply {
            results: bincode::serialize(&results).map_err(|e| Status::internal(e.to_string()))?.into(),
            ..Default::default()
        },
        Ok(Err(leader_hint)) => ForwardReply {
            code: tonic::Code::Unavailable as i32,
            message: format!("node {} does not lead partition {}", ctx.topology.node_id, request.partition_id),
            leader_hint,
            ..Default::default()
        },
        Err(error) => ForwardReply { code: error.code() as i32, message: error.to_string(), ..Default::default() },
    })
}

/// [`forward_reply`] for a forward on a `Deliver` stream: its deadline is in
/// the message, and what a call would have failed with is in the reply (a
/// node still starting answers UNAVAILABLE, so the gateway tries again).
async fn forwarded_on_stream(ctx: Option<&Arc<NodeContext>>, request: ForwardRequest) -> ForwardReply {
    let Some(ctx) = ctx else {
        let message = STARTING.to_string();
        return ForwardReply { code: tonic::Code::Unavailable as i32, message, ..Default::default() };
    };
    let _running = ctx.gateway.request_started();
    let timeout = match request.timeout_ms {
        0 => ctx.settings.request_timeout,
        ms => Duration::from_millis(ms),
    };
    let deadline =
        crate::leaders::deadline_after(timeout).unwrap_or_else(|| Instant::now() + ctx.settings.request_timeout);
    forward_reply(ctx, request, deadline).await.unwrap_or_else(|status| ForwardReply {
        code: status.code() as i32,
        message: status.message().to_string(),
        ..Default::default()
    })
}

/// This node's answer to a Raft RPC for one of its replicas.
async fn raft_reply(ctx: &NodeContext, kind: RpcKind, request: RaftRequest) -> RaftReply {
    let Some(replica) = ctx.routing.replica(request.partition_id) else {
        return RaftReply {
            error: format!("node {} hosts no replica of partition {}", ctx.topology.node_id, request.partition_id),
            ..Default::default()
        };
    };
    match replica.handle_rpc(kind, &request.payload).await {
        Ok(payload) => RaftReply { payload: payload.into(), ..Default::default() },
        Err(error) => RaftReply { error, ..Default::default() },
    }
}

/// The replies of an append stream: each request is read, handled and
/// answered (with its number) before the next is read, all while the reply
/// stream is polled (no task or channel of its own). The stream ends when
/// the peer closes its side, or after telling it why a request could not be
/// read. A peer that drops it mid-append drops that append's wait, not the
/// append (openraft's core carries it out either way). Each message counts
/// as an `AppendEntries` request between nodes.
fn append_replies(
    ctx: Arc<NodeContext>,
    requests: tonic::Streaming<RaftRequest>,
) -> impl futures::Stream<Item = Result<RaftReply, Status>> + Send + 'static {
    futures::stream::unfold(Some((ctx, requests)), |state| async move {
        let (ctx, mut requests) = state?;
        match requests.message().await {
            Ok(Some(request)) => {
                let seq = request.seq;
                let reply = RaftReply { seq, ..raft_reply(&ctx, RpcKind::AppendEntries, request).await };
                count_request("AppendEntries");
                Some((Ok(reply), Some((ctx, requests))))
            }
            Ok(None) => None,
            // Said to the peer (a message over the size limit is how it
            // learns to send fewer entries), and the stream ends.
            Err(status) => Some((Err(status), None)),
        }
    })
}

/// This node's replica of `partition` when this node leads it; otherwise
/// the code and message of a reply that tells the caller to look elsewhere.
fn led_replica(ctx: &NodeContext, partition: u32) -> Result<Arc<crate::raft::Replica>, (i32, String)> {
    match (ctx.routing.replica(partition), ctx.routing.local_leader(partition).is_some()) {
        (Some(replica), true) => Ok(replica),
        _ => Err((
            tonic::Code::Unavailable as i32,
            format!("node {} does not lead partition {partition}", ctx.topology.node_id),
        )),
    }
}

/// The deadline a peer's gateway set (`grpc-timeout`). Peers are Drover nodes,
/// which always send a valid header; anything else gets the default rather
/// than an error, and never a deadline the clock cannot hold.
fn deadline_of<T>(request: &Request<T>, default: Duration) -> Instant {
    let timeout = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::leaders::parse_grpc_timeout)
        .unwrap_or(default);
    crate::leaders::deadline_after(timeout).unwrap_or_else(|| Instant::now() + default)
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn append_entries(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.raft(RpcKind::AppendEntries, request).await
    }

    type AppendEntriesStreamStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send>>;

    async fn append_entries_stream(
        &self,
        request: Request<tonic::Streaming<RaftRequest>>,
    ) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
        let ctx = Arc::clone(self.ctx()?);
        if crate::failpoints::fire("append_stream_unimplemented").is_some() {
            return Err(Status::unimplemented("append streams are refused here (failpoint)"));
        }
        Ok(Response::new(Box::pin(append_replies(ctx, request.into_inner()))))
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.raft(RpcKind::Vote, request).await
    }

    async fn install_snapshot(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.raft(RpcKind::InstallSnapshot, request).await
    }

    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardReply>, Status> {
        let ctx = self.ctx()?;
        // Shutdown waits for this: cutting a forwarded batch that is already
        // in the log would leave its gateway with an unknown outcome.
        let _running = ctx.gateway.request_started();
        let deadline = deadline_of(&request, ctx.settings.request_timeout);
        forward_reply(ctx, request.into_inner(), deadline).await.map(Response::new)
    }

    async fn describe(&self, request: Request<DescribeRequest>) -> Result<Response<DescribeReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let replica = match led_replica(ctx, request.partition_id) {
            Ok(replica) => replica,
            Err((code, message)) => return Ok(Response::new(DescribeReply { code, message, ..Default::default() })),
        };
        let job = if request.key != 0 {
            JobRef::Key(JobKey(request.key))
        } else {
            let named = bincode::deserialize(&request.request)
                .map_err(|e| Status::invalid_argument(format!("malformed request id: {e}")))?;
            JobRef::Request(named)
        };
        let state = replica.state();
        let job = match state.resolve(&job) {
            Some(key) => state
                .await_final(key, Duration::from_millis(request.wait_ms.min(MAX_DESCRIBE_WAIT_MS)))
                .await
                .map_err(|e| Status::internal(e.to_string()))?,
            None => None,
        };
        let encoded = bincode::serialize(&job).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(DescribeReply { job: encoded.into(), ..Default::default() }))
    }

    async fn list_jobs(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let replica = match led_replica(ctx, request.partition_id) {
            Ok(replica) => replica,
            Err((code, message)) => return Ok(Response::new(ListJobsReply { code, message, ..Default::default() })),
        };
        let filter = bincode::deserialize(&request.filter)
            .map_err(|e| Status::invalid_argument(format!("malformed job filter: {e}")))?;
        let limit = (request.limit as usize).min(MAX_LIST_LIMIT);
        let jobs = replica
            .state()
            .list(&filter, &request.tenants, JobKey(request.after), limit, ctx.settings.limits.max_request_bytes())
            .map_err(|e| Status::internal(e.to_string()))?;
        let encoded = bincode::serialize(&jobs).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(ListJobsReply { jobs: encoded.into(), ..Default::default() }))
    }

    async fn read_events(&self, request: Request<ReadEventsRequest>) -> Result<Response<ReadEventsReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let replica = match led_replica(ctx, request.partition_id) {
            Ok(replica) => replica,
            Err((code, message)) => return Ok(Response::new(ReadEventsReply { code, message, ..Default::default() })),
        };
        let limit = (request.limit as usize).min(MAX_LIST_LIMIT);
        let page = replica.state().events(request.after, limit).map_err(|e| Status::internal(e.to_string()))?;
        let encoded = bincode::serialize(&page).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(ReadEventsReply { page: encoded.into(), ..Default::default() }))
    }

    async fn register_stream(
        &self,
        request: Request<RegisterStreamRequest>,
    ) -> Result<Response<RegisterStreamReply>, Status> {
        let ctx = self.ctx()?;
        let spec = request.into_inner().stream.ok_or_else(|| Status::invalid_argument("stream is required"))?;
        ctx.broker_register(from_spec(spec));
        Ok(Response::new(RegisterStreamReply {}))
    }

    async fn remove_stream(
        &self,
        request: Request<RemoveStreamRequest>,
    ) -> Result<Response<RemoveStreamReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        ctx.broker.streams.remove(request.gateway_node_id, request.stream_id);
        Ok(Response::new(RemoveStreamReply {}))
    }

    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushReply>, Status> {
        push_reply(self.ctx().ok(), request.into_inner()).await.map(Response::new)
    }

    async fn release_jobs(&self, request: Request<ReleaseJobsRequest>) -> Result<Response<ReleaseJobsReply>, Status> {
        release(self.ctx()?, request.into_inner());
        Ok(Response::new(ReleaseJobsReply {}))
    }

    type DeliverStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<DeliverReply, Status>> + Send>>;

    async fn deliver(
        &self,
        request: Request<tonic::Streaming<DeliverRequest>>,
    ) -> Result<Response<Self::DeliverStream>, Status> {
        if crate::failpoints::fire("deliver_unimplemented").is_some() {
            return Err(Status::unimplemented("delivery streams are refused here (failpoint)"));
        }
        // The stream outlives the start-up it may have opened in: each
        // message reads the context as it is when it arrives, so a stream a
        // peer opened while this node was starting serves once it has started.
        let late_ctx = Arc::clone(&self.ctx);
        let mut requests = request.into_inner();
        let (replies, out) = tokio::sync::mpsc::unbounded_channel();
        // Pushes wait for the gateway's clients and forwards for their
        // commit, so each runs on its own and its reply goes when it is
        // ready; releases are done at once.
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                let id = request.id;
                let ctx = late_ctx.get().cloned();
                if let Some(push) = request.push {
                    count_request("Push");
                    let replies = replies.clone();
                    tokio::spawn(async move {
                        // A push this node cannot read is answered "unknown", as a call's error would be.
                        let reply = push_reply(ctx.as_ref(), push)
                            .await
                            .unwrap_or(PushReply { outcome_unknown: true, ..Default::default() });
                        let _ = replies.send(Ok(DeliverReply { id, push: Some(reply), ..Default::default() }));
                    });
                } else if let Some(forward) = request.forward {
                    count_request("Forward");
                    let replies = replies.clone();
                    tokio::spawn(async move {
                        let reply = forwarded_on_stream(ctx.as_ref(), forward).await;
                        let _ = replies.send(Ok(DeliverReply { id, forward: Some(reply), ..Default::default() }));
                    });
                } else if let Some(released) = request.release {
                    if let Some(ctx) = &ctx {
                        count_request("ReleaseJobs");
                        release(ctx, released);
                    }
                } else if id != 0 {
                    // A newer node's kind of request: it makes it as a call.
                    let _ = replies.send(Ok(DeliverReply { id, unsupported: true, ..Default::default() }));
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(out))))
    }

    async fn offer_room(&self, request: Request<OfferRoomRequest>) -> Result<Response<OfferRoomReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let stream = (request.gateway_node_id, request.stream_id, request.r#type);
        let reply = match super::links::offer_local_leader(ctx, request.partition_id, stream, request.room).await {
            Some(accepted) => OfferRoomReply { accepted, ..Default::default() },
            None => OfferRoomReply {
                not_leader: true,
                leader_hint: ctx
                    .routing
                    .known_leader(request.partition_id)
                    .filter(|node| *node != ctx.topology.node_id),
                ..Default::default()
            },
        };
        Ok(Response::new(reply))
    }

    async fn notify_available(
        &self,
        request: Request<NotifyAvailableRequest>,
    ) -> Result<Response<NotifyAvailableReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let _ = ctx.gateway.available.send((request.partition_id, Arc::from(request.r#type.as_str())));
        Ok(Response::new(NotifyAvailableReply {}))
    }

    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let ctx = self.ctx()?;
        let statuses: Vec<_> = ctx.routing.replicas().iter().map(|r| r.status()).collect();
        Ok(Response::new(StatusReply {
            node_id: ctx.topology.node_id,
            partitions: bincode::serialize(&statuses).map_err(|e| Status::internal(e.to_string()))?.into(),
            gateway_address: ctx.topology.grpc_addr.to_string(),
            admin_address: ctx.topology.admin_addr.to_string(),
            wall_ms: crate::partition::now_millis(),
            partition_clocks: ctx
                .routing
                .replicas()
                .iter()
                .filter_map(|r| {
                    let estimate_ms = r.state().clock_estimate()?;
                    Some(PartitionClock { partition_id: r.partition, estimate_ms })
                })
                .collect(),
            plan: ctx
                .topology
                .plan()
                .map(|plan| serde_json::to_vec(&plan).unwrap_or_default())
                .unwrap_or_default()
                .into(),
        }))
    }

    async fn campaign(&self, request: Request<CampaignRequest>) -> Result<Response<CampaignReply>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        let error = match ctx.routing.replica(request.partition_id) {
            // Leadership handed to a stopping node would be leaderless again
            // as soon as it stops.
            Some(_) if *ctx.stopping.borrow() => format!("node {} is stopping", ctx.topology.node_id),
            Some(replica) => match replica.campaign_for(request.leader, request.term).await {
                Ok(()) => {
                    tracing::info!(
                        partition = request.partition_id,
                        leader = request.leader,
                        "standing for election: the leader is stopping and handed leadership here"
                    );
                    String::new()
                }
                Err(error) => error,
            },
            None => format!("node {} hosts no replica of partition {}", ctx.topology.node_id, request.partition_id),
        };
        Ok(Response::new(CampaignReply { error }))
    }

    type ReadStagedBackupStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<StagedBackupChunk, Status>> + Send>>;

    async fn read_staged_backup(
        &self,
        request: Request<ReadStagedBackupRequest>,
    ) -> Result<Response<Self::ReadStagedBackupStream>, Status> {
        let ctx = self.ctx()?;
        let request = request.into_inner();
        crate::raft::check_backup_id(&request.backup_id).map_err(Status::invalid_argument)?;
        let Some(replica) = ctx.routing.replica(request.partition_id) else {
            let node = ctx.topology.node_id;
            return Err(Status::not_found(format!(
                "node {node} hosts no replica of partition {}",
                request.partition_id
            )));
        };
        let until = Instant::now() + Duration::from_millis(request.wait_ms.min(600_000));
        match replica.staged_backup(&request.backup_id, until).await {
            Ok(Some((part, file))) => Ok(Response::new(Box::pin(staged_chunks(part, file)))),
            Ok(None) => Err(Status::not_found(format!(
                "node {} has not staged partition {}'s part of backup {:?}",
                ctx.topology.node_id, request.partition_id, request.backup_id
            ))),
            Err(e) => Err(Status::internal(format!("reading a staged backup: {e}"))),
        }
    }

    async fn release_staged_backup(
        &self,
        request: Request<ReleaseStagedBackupRequest>,
    ) -> Result<Response<ReleaseStagedBackupReply>, Status> {
        let ctx = self.ctx()?;
        let id = request.into_inner().backup_id;
        crate::raft::check_backup_id(&id).map_err(Status::invalid_argument)?;
        crate::raft::release_staged_backup(&ctx.settings.snapshot_dir, &id)
            .map_err(|e| Status::internal(format!("deleting a staged backup: {e}")))?;
        Ok(Response::new(ReleaseStagedBackupReply {}))
    }
}

/// A staged part as this node sends it to another node's gateway: the
/// last chunk carries the part's description, as JSON.
fn staged_chunks(
    part: crate::raft::PartitionBackup,
    file: std::fs::File,
) -> impl futures::Stream<Item = Result<crate::proto::cluster::StagedBackupChunk, Status>> + Send {
    use futures::StreamExt;
    let json = serde_json::to_string(&part).unwrap_or_default();
    crate::raft::staged_chunks(file, STAGED_CHUNK_BYTES).map(move |chunk| {
        let (data, last) = chunk.map_err(|e| Status::internal(format!("reading a staged backup: {e}")))?;
        Ok(crate::proto::cluster::StagedBackupChunk {
            data: data.into(),
            part: if last { json.clone() } else { String::new() },
        })
    })
}

/// A staged part's bytes per message between nodes.
const STAGED_CHUNK_BYTES: usize = 1 << 20;
