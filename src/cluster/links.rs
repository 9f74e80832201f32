//! How partition leaders reach gateways and gateways reach brokers and
//! partition leaders: directly on the same node, over the cluster service
//! otherwise.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use ractor::rpc::CallResult;

use crate::context::NodeContext;
use crate::core::{ActivatedJobData, Command, JobKey, PartitionId, YieldReason};
use crate::partition::{GatewayLink, LeaderMsg, PeerClock};
use crate::proto::cluster::{
    NotifyAvailableRequest, OfferRoomRequest, PushRequest, RegisterStreamRequest, ReleaseJobsRequest,
    ReleasedActivation, RemoveStreamRequest, StatusRequest, StreamSpec,
};
use crate::raft::NodeId;
use crate::streams::{LeaderLink, OfferAnswer, PushOutcome, RemoteStream};
use crate::tasks::LoopStatus;
use crate::transport::Delivered;

/// How often gateways re-register their streams with every broker (brokers
/// forget registrations after [`crate::streams::STREAM_TTL`]).
const REFRESH_EVERY: Duration = Duration::from_secs(3);
/// How long a broker waits for a gateway's answer to a push: longer than the
/// gateway waits for its aggregator, so a gateway's answer (even "unknown")
/// arrives before the broker gives up.
const PUSH_RPC_TIMEOUT: Duration = Duration::from_secs(crate::streams::PUSH_ANSWER_WITHIN.as_secs() + 2);
/// How long a stopping gateway waits for brokers to drop its streams.
const REMOVE_ON_SHUTDOWN_WITHIN: Duration = Duration::from_secs(1);
/// How long a gateway waits for a partition leader's answer to an offer of
/// room (the leader answers once its activation has committed).
const OFFER_ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// How often, at most, a leader tells one peer that jobs of one type are
/// available on one partition. The notices wake long polls parked on other
/// gateways; sent for every write that made jobs available, they were 1.7
/// requests per job at 1,000 jobs/s on three nodes, a third of all requests
/// between nodes. The first notice in a window goes at once; later ones become
/// one notice at the window's end, so a parked poll waits at most this long.
const NOTIFY_EVERY: Duration = Duration::from_millis(50);

pub struct Links {
    ctx: Weak<NodeContext>,
    notices: Arc<Mutex<Notices>>,
}

impl Links {
    pub fn new(ctx: Weak<NodeContext>) -> Self {
        Links { ctx, notices: Default::default() }
    }
}

/// When to send an availability notice.
#[derive(Debug, PartialEq)]
enum Notice {
    Now,
    /// At the end of the current window (one notice for every call until then).
    At(Instant),
    /// One is already due at the end of the window.
    AlreadyDue,
}

/// Whom a notice goes to, and about what: (peer, partition, job type).
type NoticeKey = (NodeId, PartitionId, Arc<str>);

/// Availability notices by key: when the last one went, and when the next is
/// due, if one is.
#[derive(Default)]
struct Notices {
    sent: HashMap<NoticeKey, (Instant, Option<Instant>)>,
    /// Entries beyond which idle ones are dropped (job types are the client's).
    sweep_above: usize,
}

impl Notices {
    /// The least `sweep_above`.
    const KEEP: usize = 4096;

    fn admit(&mut self, key: NoticeKey, now: Instant) -> Notice {
        if self.sent.len() >= self.sweep_above.max(Self::KEEP) {
            self.sent.retain(|_, (last, due)| {
                due.is_some_and(|at| !Self::stale(at, now)) || now.saturating_duration_since(*last) < NOTIFY_EVERY
            });
            // What is left is live: sweep again only once the map has doubled.
            self.sweep_above = self.sent.len() * 2;
        }
        match self.sent.get_mut(&key) {
            Some((_, Some(at))) if !Self::stale(*at, now) => Notice::AlreadyDue,
            Some((last, due)) if now.saturating_duration_since(*last) < NOTIFY_EVERY => {
                let at = *last + NOTIFY_EVERY;
                *due = Some(at);
                Notice::At(at)
            }
            _ => {
                self.sent.insert(key, (now, None));
                Notice::Now
            }
        }
    }

    /// A due notice whose time is a whole window past was never marked sent
    /// (its task did not run): it no longer holds later notices back.
    fn stale(at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) >= NOTIFY_EVERY
    }

    /// A notice that was due went at `at`.
    fn sent_due(&mut self, key: NoticeKey, at: Instant) {
        self.sent.insert(key, (at, None));
    }
}

impl GatewayLink for Links {
    fn push(
        &self,
        stream: &RemoteStream,
        partition: PartitionId,
        jobs: Vec<ActivatedJobData>,
    ) -> Pin<Box<dyn Future<Output = PushOutcome> + Send>> {
        let not_sent = |reason: String| PushOutcome::NotDelivered { reason, unknown_stream: false };
        let Some(ctx) = self.ctx.upgrade() else {
            return Box::pin(async move { not_sent("node stopping".into()) });
        };
        let gateway = stream.gateway;
        let stream_id = stream.stream_id;
        Box::pin(async move {
            if gateway == ctx.topology.node_id {
                return ctx.gateway.streams.push(stream_id, partition, jobs).await;
            }
            let Some(mut client) = ctx.transport.peers.client(gateway) else {
                return not_sent(format!("unknown gateway {gateway}"));
            };
            let encoded = match bincode::serialize(&jobs) {
                Ok(encoded) => encoded,
                Err(e) => return not_sent(format!("encoding the jobs: {e}")),
            };
            let request = PushRequest { stream_id, partition_id: partition, jobs: encoded.into() };
            let reply = match ctx
                .transport
                .deliveries
                .push(&ctx.transport.peers, gateway, request.clone(), PUSH_RPC_TIMEOUT)
                .await
            {
                Delivered::Reply(reply) => Ok(reply),
                Delivered::NotSent(reason) => return not_sent(format!("to gateway {gateway}: {reason}")),
                Delivered::Failed(status) => Err(status),
                Delivered::UseCall => {
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(PUSH_RPC_TIMEOUT);
                    client.push(request).await.map(tonic::Response::into_inner)
                }
            };
            match reply {
                Ok(reply) if reply.outcome_unknown => {
                    PushOutcome::Unknown { reason: format!("gateway {gateway} could not tell") }
                }
                Ok(reply) if reply.unknown_stream => {
                    let reason = format!("gateway {gateway} has no stream {stream_id}");
                    PushOutcome::NotDelivered { reason, unknown_stream: true }
                }
                Ok(reply) => {
                    let rejected = reply.rejected.into_iter().map(JobKey).collect();
                    PushOutcome::Answered { rejected, room: reply.room }
                }
                Err(status) if never_sent(&status) => not_sent(status.to_string()),
                Err(status) => PushOutcome::Unknown { reason: status.to_string() },
            }
        })
    }

    fn jobs_available(&self, partition: PartitionId, job_type: &str) {
        let Some(ctx) = self.ctx.upgrade() else { return };
        let job_type: Arc<str> = Arc::from(job_type);
        let _ = ctx.gateway.available.send((partition, Arc::clone(&job_type)));
        let now = Instant::now();
        for node in ctx.topology.peers() {
            let Some(mut client) = ctx.transport.peers.client(node) else { continue };
            let key = (node, partition, Arc::clone(&job_type));
            let when = self.notices.lock().expect("notice lock poisoned").admit(key.clone(), now);
            let at = match when {
                Notice::AlreadyDue => continue,
                Notice::Now => None,
                Notice::At(at) => Some(at),
            };
            let request = NotifyAvailableRequest { partition_id: partition, r#type: job_type.to_string() };
            let notices = Arc::clone(&self.notices);
            tokio::spawn(async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at.into()).await;
                    notices.lock().expect("notice lock poisoned").sent_due(key, at);
                }
                let mut request = tonic::Request::new(request);
                request.set_timeout(Duration::from_secs(1));
                let _ = client.notify_available(request).await;
            });
        }
    }

    fn peer_clocks(
        &self,
        nodes: Vec<NodeId>,
        partition: PartitionId,
        limit: Duration,
    ) -> Pin<Box<dyn Future<Output = Vec<PeerClock>> + Send>> {
        let Some(ctx) = self.ctx.upgrade() else { return Box::pin(async { Vec::new() }) };
        Box::pin(async move {
            let asks =
                nodes.into_iter().filter_map(|node| ctx.transport.peers.client(node)).map(|mut client| async move {
                    let mut request = tonic::Request::new(StatusRequest {});
                    request.set_timeout(limit);
                    let answer = tokio::time::timeout(limit, client.status(request)).await;
                    let reply = answer.ok()?.ok()?.into_inner();
                    let estimate =
                        reply.partition_clocks.iter().find(|c| c.partition_id == partition).map(|c| c.estimate_ms);
                    Some(PeerClock { wall: reply.wall_ms, estimate })
                });
            futures::future::join_all(asks).await.into_iter().flatten().collect()
        })
    }

    fn release(&self, gateway: NodeId, activations: Vec<(JobKey, u32)>) {
        let Some(ctx) = self.ctx.upgrade() else { return };
        if gateway == ctx.topology.node_id {
            for (key, attempt) in activations {
                ctx.gateway.streams.release(key, attempt);
            }
            return;
        }
        let activations =
            activations.into_iter().map(|(key, attempt)| ReleasedActivation { key: key.0, attempt }).collect();
        let Err(request) =
            ctx.transport.deliveries.release(&ctx.transport.peers, gateway, ReleaseJobsRequest { activations })
        else {
            return;
        };
        let Some(mut client) = ctx.transport.peers.client(gateway) else { return };
        tokio::spawn(async move {
            let mut request = tonic::Request::new(request);
            request.set_timeout(Duration::from_secs(2));
            // Best effort: a gateway that misses it frees the slots at the activation timeout.
            let _ = client.release_jobs(request).await;
        });
    }

    fn yield_elsewhere(&self, partition: PartitionId, yields: Vec<Command>) {
        let count = yields.len();
        let (Some(ctx), Ok(runtime)) = (self.ctx.upgrade(), tokio::runtime::Handle::try_current()) else {
            tracing::warn!(
                partition,
                "the node is stopping: {count} pushed jobs a gateway refused become activatable again at their \
                 activation timeout"
            );
            return;
        };
        runtime.spawn(async move {
            let yielded = crate::leaders::yields::run_yields(&ctx, yields).await;
            metrics::counter!("drover_broker_jobs_yielded_elsewhere_total").increment(yielded as u64);
            if yielded < count {
                // Moved on (nothing to do), or no leader answered in time
                // (left to their activation timeout, as after a crash).
                tracing::info!(
                    partition,
                    "yielded {yielded} of {count} refused pushed jobs at the partition's leader; the others had \
                     moved on or wait for their activation timeout"
                );
            }
        });
    }
}

impl LeaderLink for Links {
    fn hand_back(&self, activations: Vec<(JobKey, u32)>) {
        let Some(ctx) = self.ctx.upgrade() else { return };
        tokio::spawn(async move {
            crate::leaders::yields::hand_back(&ctx, activations, YieldReason::Late).await;
        });
    }

    fn register(&self, stream: &RemoteStream) {
        if let Some(ctx) = self.ctx.upgrade() {
            register_everywhere(&ctx, stream);
        }
    }

    fn remove(&self, stream: &RemoteStream) {
        if let Some(ctx) = self.ctx.upgrade() {
            remove_everywhere(&ctx, stream);
        }
    }

    fn offer_room(
        &self,
        partition: PartitionId,
        stream: &RemoteStream,
        room: u32,
    ) -> Pin<Box<dyn Future<Output = OfferAnswer> + Send>> {
        let Some(ctx) = self.ctx.upgrade() else { return Box::pin(async { OfferAnswer::Unreachable }) };
        let stream = stream.clone();
        Box::pin(async move {
            // The partition's leader as the router finds it: here, the last
            // hint, or each replica in turn.
            for rotation in 0..=ctx.topology.replica_nodes(partition).len() {
                let named = (stream.gateway, stream.stream_id, stream.job_type.clone());
                if ctx.routing.local_leader(partition).is_some() {
                    return match offer_local_leader(&ctx, partition, named, room).await {
                        Some(true) => OfferAnswer::Accepted,
                        Some(false) => OfferAnswer::Declined,
                        None => OfferAnswer::Unreachable,
                    };
                }
                let target = ctx.routing.leader_hint(partition, rotation).filter(|node| *node != ctx.topology.node_id);
                let Some(mut client) = target.and_then(|node| ctx.transport.peers.client(node)) else { continue };
                let (gateway_node_id, stream_id, r#type) = named;
                let offer = OfferRoomRequest { partition_id: partition, gateway_node_id, stream_id, r#type, room };
                let mut request = tonic::Request::new(offer);
                request.set_timeout(OFFER_ANSWER_WITHIN);
                match client.offer_room(request).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        if !reply.not_leader {
                            return if reply.accepted { OfferAnswer::Accepted } else { OfferAnswer::Declined };
                        }
                        ctx.routing.set_leader_hint(partition, reply.leader_hint);
                    }
                    Err(status) if never_sent(&status) => {}
                    // Perhaps taken after all: offering it again later costs
                    // at worst a push that is answered "full".
                    Err(_) => return OfferAnswer::Unreachable,
                }
            }
            OfferAnswer::Unreachable
        })
    }
}

/// Offers room in a stream, named by (gateway, stream id, job type), to this
/// node's leader of `partition`: whether it took it, or `None` when this node
/// does not lead the partition (any more) or its leader did not answer in time.
pub async fn offer_local_leader(
    ctx: &NodeContext,
    partition: PartitionId,
    (gateway, stream_id, job_type): (NodeId, u64, String),
    room: u32,
) -> Option<bool> {
    let leader = ctx.routing.local_leader(partition)?;
    let offer = |reply| LeaderMsg::RoomOffered { gateway, stream_id, job_type, room, reply };
    match leader.call(offer, Some(OFFER_ANSWER_WITHIN)).await {
        Ok(CallResult::Success(accepted)) => Some(accepted),
        _ => None,
    }
}

/// Whether a failed RPC certainly never reached the peer: the connection
/// could not be made. Any other failure (a timeout, a reset) may have come
/// after the peer acted on it.
fn never_sent(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

pub fn to_spec(stream: &RemoteStream) -> StreamSpec {
    StreamSpec {
        gateway_node_id: stream.gateway,
        stream_id: stream.stream_id,
        r#type: stream.job_type.clone(),
        worker: stream.worker.clone(),
        timeout: stream.timeout_ms,
        fetch_variable: stream.fetch_variables.clone(),
        tenant_ids: stream.tenants.clone(),
        session_id: stream.session,
        labels: stream.labels.clone(),
    }
}

pub fn from_spec(spec: StreamSpec) -> RemoteStream {
    RemoteStream {
        gateway: spec.gateway_node_id,
        stream_id: spec.stream_id,
        job_type: spec.r#type,
        worker: spec.worker,
        timeout_ms: spec.timeout,
        tenants: spec.tenant_ids,
        fetch_variables: spec.fetch_variable,
        session: spec.session_id,
        labels: spec.labels,
    }
}

/// Registers a gateway stream with every broker (best effort; the periodic
/// refresh retries the ones that failed).
pub fn register_everywhere(ctx: &Arc<NodeContext>, stream: &RemoteStream) {
    ctx.broker_register(stream.clone());
    for node in ctx.topology.peers() {
        let Some(mut client) = ctx.transport.peers.client(node) else { continue };
        let spec = to_spec(stream);
        tokio::spawn(async move {
            let mut request = tonic::Request::new(RegisterStreamRequest { stream: Some(spec) });
            request.set_timeout(Duration::from_secs(2));
            let _ = client.register_stream(request).await;
        });
    }
}

/// Removes a stopping gateway's streams from every broker, waiting (briefly)
/// for the answers. A broker that did not hear of it yields whatever it
/// pushes there (the connection is refused) until the registration's TTL
/// ends, or until the restarted gateway answers "no such stream".
pub async fn remove_all_everywhere(ctx: &Arc<NodeContext>, streams: &[RemoteStream]) {
    let mut calls = Vec::new();
    for stream in streams {
        ctx.broker.streams.remove(stream.gateway, stream.stream_id);
        for node in ctx.topology.peers() {
            let Some(mut client) = ctx.transport.peers.client(node) else { continue };
            let request = RemoveStreamRequest { gateway_node_id: stream.gateway, stream_id: stream.stream_id };
            calls.push(async move {
                let mut request = tonic::Request::new(request);
                request.set_timeout(REMOVE_ON_SHUTDOWN_WITHIN);
                let _ = client.remove_stream(request).await;
            });
        }
    }
    futures::future::join_all(calls).await;
}

pub fn remove_everywhere(ctx: &Arc<NodeContext>, stream: &RemoteStream) {
    ctx.broker.streams.remove(stream.gateway, stream.stream_id);
    for node in ctx.topology.peers() {
        let Some(mut client) = ctx.transport.peers.client(node) else { continue };
        let request = RemoveStreamRequest { gateway_node_id: stream.gateway, stream_id: stream.stream_id };
        tokio::spawn(async move {
            let mut request = tonic::Request::new(request);
            request.set_timeout(Duration::from_secs(2));
            let _ = client.remove_stream(request).await;
        });
    }
}

/// Re-registers this gateway's streams everywhere, so brokers that restarted
/// or missed a registration learn of them.
pub async fn refresh_stream_registrations(ctx: Arc<NodeContext>, mut stop: watch::Receiver<bool>, status: LoopStatus) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REFRESH_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let streams = ctx.gateway.streams.registrations().await;
        for stream in &streams {
            ctx.broker_register(stream.clone());
        }
        // Re-register with every other broker; count the brokers that have
        // all of this gateway's streams.
        let mut servers = 1;
        for node in ctx.topology.peers() {
            let Some(mut client) = ctx.transport.peers.client(node) else { continue };
            let mut all = true;
            for stream in &streams {
                let mut request = tonic::Request::new(RegisterStreamRequest { stream: Some(to_spec(stream)) });
                request.set_timeout(Duration::from_secs(1));
                all &= client.register_stream(request).await.is_ok();
            }
            servers += all as usize;
        }
        let servers = if streams.is_empty() { 0 } else { servers };
        metrics::gauge!("drover_gateway_job_stream_servers").set(servers as f64);
        let members = ctx.topology.cluster_size() as usize;
        if !streams.is_empty() && servers < members {
            status.error(format!("{} of {members} brokers did not take every registration", members - servers));
        }
        status.set(format!("{} streams registered with {servers} of {members} brokers", streams.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_notices_go_at_most_once_a_window_and_none_is_dropped() {
        let mut notices = Notices::default();
        let key = |node: NodeId| (node, 0, Arc::<str>::from("t"));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(notices.admit(key(1), t0), Notice::Now, "the first goes at once");
        assert_eq!(notices.admit(key(2), t0), Notice::Now, "each peer has its own window");
        assert_eq!(notices.admit(key(1), t0 + ms(10)), Notice::At(t0 + NOTIFY_EVERY), "later ones wait for the window");
        assert_eq!(notices.admit(key(1), t0 + ms(20)), Notice::AlreadyDue, "and become one notice");
        // The due notice goes at the window's end; the next window starts there.
        notices.sent_due(key(1), t0 + NOTIFY_EVERY);
        assert_eq!(notices.admit(key(1), t0 + NOTIFY_EVERY + ms(1)), Notice::At(t0 + NOTIFY_EVERY * 2));
        notices.sent_due(key(1), t0 + NOTIFY_EVERY * 2);
        assert_eq!(notices.admit(key(1), t0 + NOTIFY_EVERY * 3), Notice::Now, "a quiet window: at once again");
    }

    #[test]
    fn idle_notice_entries_are_dropped_but_due_ones_kept() {
        let mut notices = Notices::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // One type with a notice due, then enough others to reach the sweep.
        let due = (1, 0, Arc::<str>::from("type-0"));
        assert_eq!(notices.admit(due.clone(), t0), Notice::Now);
        assert_eq!(notices.admit(due.clone(), t0 + ms(1)), Notice::At(t0 + NOTIFY_EVERY));
        for n in 1..Notices::KEEP {
            notices.admit((1, 0, Arc::from(format!("type-{n}").as_str())), t0 + ms(1));
        }
        assert_eq!(notices.sent.len(), Notices::KEEP);
        let later = t0 + ms(60);
        assert_eq!(notices.admit((1, 0, Arc::from("new")), later), Notice::Now);
        assert_eq!(notices.sent.len(), 2, "the idle entries went; the due one and the new one stayed");
        assert_eq!(notices.admit(due, later), Notice::AlreadyDue);
    }

    #[test]
    fn a_due_notice_never_marked_sent_stops_holding_notices_back() {
        let mut notices = Notices::default();
        let key = (1, 0, Arc::<str>::from("t"));
        let t0 = Instant::now();
        assert_eq!(notices.admit(key.clone(), t0), Notice::Now);
        assert_eq!(notices.admit(key.clone(), t0 + Duration::from_millis(1)), Notice::At(t0 + NOTIFY_EVERY));
        // Its task never ran: a window after it was due, notices go again.
        assert_eq!(notices.admit(key, t0 + NOTIFY_EVERY * 2), Notice::Now);
    }
}
