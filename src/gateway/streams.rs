//! The gateway's side of job streaming: worker streams aggregated by
//! equivalence, and the hand-off of pushed jobs to a ready client.
//!
//! Two worker streams are equivalent when they ask for the same job type,
//! worker name, activation timeout, set of fetch variables and set of tenants
//! (order and repeats do not matter). Equivalent streams share one aggregated
//! stream id, registered once with every broker, and one
//! [`StreamAggregator`](super::aggregator::StreamAggregator) actor that owns
//! their clients and hands out pushed jobs.
//!
//! A client is ready while it holds fewer jobs than its `max_jobs_in_flight`:
//! a job pushed to it is held until the worker completes or fails it (through
//! this gateway, or through another one whose partition leader then tells this
//! gateway), or its activation timeout has passed on this gateway's own clock
//! ([`Held`]). HTTP/2 flow control alone cannot say a worker is busy: a
//! client's receive window holds thousands of small jobs, which would sit there
//! past their timeout.
//!
//! Stream ids carry a per-start epoch in their high 32 bits, so a restarted
//! gateway never answers to a registration its previous run left at a broker.
//!
//! Every push's answer also says how many more jobs the stream's clients can
//! take, so partition leaders push no more than that. A partition whose push
//! found the stream full is offered the room once a client frees a slot
//! ([`LeaderLink::offer_room`]; see the aggregator for the order of offers):
//! the leader keeps its jobs activatable meanwhile, rather than activating
//! them for a stream that would answer "not ready".
//!
//! A pushed job is reported as rejected only when no client certainly got it:
//! the aggregator hands out nothing from a push older than
//! [`PUSH_DELIVER_WITHIN`], and the gateway waits for its answer up to
//! [`PUSH_ANSWER_WITHIN`]. A push still unanswered then is reported as of
//! unknown outcome, so its jobs are not yielded to a second worker while the
//! first may still receive them. When the aggregator comes to that push, it
//! knows which jobs no client took, and the gateway yields those itself
//! ([`LeaderLink::hand_back`]) instead of leaving them to their activation
//! timeout.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::aggregator::{AggregatorArgs, AggregatorMsg, StreamAggregator};
use super::convert::WorkerSpec;
use crate::core::{fence_admits, ActivatedJobData, JobKey, PartitionId, SessionId, TAGGED_ATTEMPT};
use crate::partition::streams::{PushOutcome, RemoteStream};
use crate::proto::gateway as pb;
use crate::raft::NodeId;

/// Jobs a worker stream holds at once when it names no limit.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;
/// The largest `max_jobs_in_flight` a stream may ask for.
pub const MAX_IN_FLIGHT_LIMIT: usize = 1000;

/// How a gateway reaches partition leaders (its own node's or another's).
pub trait LeaderLink: Send + Sync + 'static {
    /// Offers `partition`'s leader `room` for jobs in `stream`, whose push it
    /// found full.
    fn offer_room(
        &self,
        partition: PartitionId,
        stream: &RemoteStream,
        room: u32,
    ) -> Pin<Box<dyn Future<Output = OfferAnswer> + Send>>;

    /// Yields pushed activations that no client took, from a push whose
    /// leader had stopped waiting for the answer (and so would leave them to
    /// their activation timeout).
    fn hand_back(&self, activations: Vec<(JobKey, u32)>);
}

/// What became of an offer of room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferAnswer {
    /// The leader activated jobs and pushes them into the stream.
    Accepted,
    /// The leader has no jobs for the stream now (it knows the room is there).
    Declined,
    /// No leader of the partition answered: it is offered the room again later.
    Unreachable,
}

/// Tells a stream's aggregator that one of its clients may take another job
/// (a slot freed, or a job left its buffer), once per arming: the aggregator
/// arms it while partitions wait for room, so room made while nobody waits
/// costs no message.
#[derive(Default)]
pub struct RoomSignal {
    armed: AtomicBool,
    aggregator: OnceLock<ActorRef<AggregatorMsg>>,
}

impl RoomSignal {
    pub(super) fn attach(&self, aggregator: ActorRef<AggregatorMsg>) {
        let _ = self.aggregator.set(aggregator);
    }

    pub(super) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    fn freed(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            if let Some(aggregator) = self.aggregator.get() {
                let _ = aggregator.cast(AggregatorMsg::Freed);
            }
        }
    }
}

/// A client's jobs in hand, against its limit.
pub struct Credits {
    held: AtomicUsize,
    max: usize,
    /// The client's stream's signal, told when a slot frees.
    signal: Arc<RoomSignal>,
}

impl Credits {
    pub fn new(max: usize, signal: Arc<RoomSignal>) -> Arc<Credits> {
        Arc::new(Credits { held: AtomicUsize::new(0), max, signal })
    }

    /// Takes one if the client is under its limit.
    pub fn try_take(&self) -> bool {
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| (h < self.max).then_some(h + 1)).is_ok()
    }

    /// Gives back one taken for a job that did not reach the client.
    pub fn give_back(&self) {
        let _ = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(1));
    }

    /// Gives back the slot of a job the client held: its stream has room.
    fn release(&self) {
        self.give_back();
        self.signal.freed();
    }

    /// Jobs the client can take before its limit.
    pub fn free(&self) -> usize {
        self.max.saturating_sub(self.held.load(Ordering::Acquire))
    }
}

/// Activations held by clients: (key, attempt) -> (the client's credits, expiry).
/// Ordered, so the activations of one key are found without the attempt.
type HeldJobs = BTreeMap<(JobKey, u32), (Arc<Credits>, Instant)>;

/// Jobs pushed to this gateway's clients, by (key, attempt), until the worker
/// finishes them or their activation timeout passes.
///
/// Expiry runs on this gateway's monotonic clock: a job expires its timeout
/// after it was handed to the client, which is never before the leader's
/// deadline for it. Comparing the leader's deadline with this node's wall
/// clock would free slots early (or late) by the clocks' skew.
pub struct Held {
    jobs: Mutex<HeldJobs>,
    /// The origin of `earliest_expiry`.
    base: Instant,
    /// No held expiry is earlier than this many ms after `base` (it may be
    /// earlier than needed after releases): expiry scans only once it passed.
    earliest_expiry: AtomicU64,
}

impl Default for Held {
    fn default() -> Self {
        Held { jobs: Mutex::default(), base: Instant::now(), earliest_expiry: AtomicU64::new(u64::MAX) }
    }
}

impl Held {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HeldJobs> {
        self.jobs.lock().expect("held jobs lock poisoned")
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64
    }

    pub fn hold(&self, key: JobKey, attempt: u32, credits: Arc<Credits>, expires: Instant) {
        let mut jobs = self.jobs();
        self.earliest_expiry.fetch_min(self.millis(expires), Ordering::AcqRel);
        let previous = jobs.insert((key, attempt), (credits, expires));
        drop(jobs);
        if let Some((previous, _)) = previous {
            previous.release();
        }
    }

    /// Takes back a hold whose job did not reach the client (its credit is
    /// given back by the caller, which took it): only the hold `credits`
    /// made, never a later push's of the same activation.
    pub fn unhold(&self, key: JobKey, attempt: u32, credits: &Arc<Credits>) {
        let mut jobs = self.jobs();
        if jobs.get(&(key, attempt)).is_some_and(|(held, _)| Arc::ptr_eq(held, credits)) {
            jobs.remove(&(key, attempt));
        }
    }

    /// The worker is done with this activation (or it never reached it).
    /// `fence` names it as job commands do ([`fence_admits`]): exactly, by
    /// its tag, or (0) whichever activation of the job is held.
    pub fn release(&self, key: JobKey, fence: u32) {
        let released = {
            let mut jobs = self.jobs();
            let held = if fence != 0 && fence & TAGGED_ATTEMPT == 0 {
                Some((key, fence))
            } else {
                jobs.range((key, 0)..=(key, u32::MAX))
                    .map(|(k, _)| *k)
                    .find(|(_, attempt)| fence_admits(fence, *attempt))
            };
            held.and_then(|held| jobs.remove(&held))
        };
        if let Some((credits, _)) = released {
            credits.release();
        }
    }

    /// Lets go of activations past their expiry (the job is no longer the
    /// worker's). Scans only when the earliest held expiry has passed.
    pub fn expire(&self, now: Instant) {
        if self.millis(now) < self.earliest_expiry.load(Ordering::Acquire) {
            return;
        }
        let mut jobs = self.jobs();
        let mut earliest = u64::MAX;
        jobs.retain(|_, (credits, expires)| {
            let keep = *expires > now;
            if keep {
                earliest = earliest.min(self.millis(*expires));
            } else {
                credits.release();
            }
            keep
        });
        self.earliest_expiry.store(earliest, Ordering::Release);
    }

    /// When [`Held::expire`] may next let an activation go (possibly earlier
    /// than needed); `None` while nothing is held.
    pub fn next_expiry(&self) -> Option<Instant> {
        let earliest = self.earliest_expiry.load(Ordering::Acquire);
        // A millisecond on: the stored expiry is rounded down.
        (earliest != u64::MAX).then(|| self.base + Duration::from_millis(earliest.saturating_add(1)))
    }
}

/// The equivalence key of worker streams.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct StreamKey {
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    pub fetch_variables: Vec<String>,
    pub tenants: Vec<String>,
    /// Streams of different sessions are never one stream: a quiet session's
    /// stream must not be offered jobs while another's is.
    pub session: SessionId,
    /// The workers' labels: jobs are routed by them.
    pub labels: Vec<String>,
}

impl From<&WorkerSpec> for StreamKey {
    fn from(spec: &WorkerSpec) -> Self {
        // WorkerSpec already holds fetch variables and tenants sorted and deduplicated.
        StreamKey {
            job_type: spec.job_type.clone(),
            worker: spec.worker.clone(),
            timeout_ms: spec.timeout_ms,
            fetch_variables: spec.fetch_variables.clone(),
            tenants: spec.tenants.clone(),
            session: spec.session,
            labels: spec.labels.clone(),
        }
    }
}

struct Entry {
    key: StreamKey,
    actor: ActorRef<AggregatorMsg>,
    signal: Arc<RoomSignal>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<StreamKey, u64>,
    streams: HashMap<u64, Entry>,
}

/// The registry of this gateway's aggregated streams: equivalence key to
/// stream id to its [`StreamAggregator`] actor. Joining and leaving are
/// serialised here, so a stream never loses a client to a concurrent removal.
pub struct GatewayStreams {
    node_id: NodeId,
    /// This run's epoch, in the high 32 bits of every stream id.
    epoch: u64,
    next_id: AtomicU64,
    inner: tokio::sync::Mutex<Inner>,
    held: Arc<Held>,
    slow_next_push: Arc<AtomicU64>,
    /// How aggregators offer room to partition leaders (see [`GatewayStreams::connect`]).
    leaders: OnceLock<Arc<dyn LeaderLink>>,
}

/// A client's place in an aggregated stream.
pub struct Opened {
    pub stream_id: u64,
    pub client_id: u64,
    pub receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>,
    /// Set when this client created the aggregated stream: register it.
    pub new_stream: Option<RemoteStream>,
    /// The stream's signal, for the client's end to say its buffer has room.
    pub signal: Arc<RoomSignal>,
}

/// The `client` view of `/actuator/jobstreams`.
#[derive(Serialize)]
pub struct ClientStreamView {
    pub id: u64,
    pub key: StreamKey,
    pub clients: Vec<u64>,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// An aggregator hands out nothing from a push that waited longer than this
/// in its mailbox: whoever sent it has stopped waiting.
pub const PUSH_DELIVER_WITHIN: Duration = Duration::from_secs(1);
/// How long the gateway waits for an aggregator's answer to a push. Longer
/// than [`PUSH_DELIVER_WITHIN`], so that an answer given in time arrives; the
/// broker's push RPC waits longer still.
pub const PUSH_ANSWER_WITHIN: Duration = Duration::from_secs(2);

impl GatewayStreams {
    pub fn new(node_id: NodeId) -> Self {
        // Random, not the start time: two starts within a clock tick (or on a
        // clock set back) must not share an epoch.
        let epoch = u64::from(rand::random::<u32>().max(1)) << 32;
        GatewayStreams {
            node_id,
            epoch,
            next_id: AtomicU64::new(1),
            inner: tokio::sync::Mutex::new(Inner::default()),
            held: Arc::new(Held::default()),
            slow_next_push: Arc::new(AtomicU64::new(0)),
            leaders: OnceLock::new(),
        }
    }

    /// Sets how this gateway's streams offer room to partition leaders. Until
    /// it is set (and in tests without one), a full stream offers none, and
    /// leaders learn of its room from their next push's answer.
    pub fn connect(&self, leaders: Arc<dyn LeaderLink>) {
        let _ = self.leaders.set(leaders);
    }

    /// Test hook: the next push one of this gateway's aggregators handles
    /// waits `delay` first, as an overloaded aggregator would.
    #[doc(hidden)]
    pub fn slow_down_next_push(&self, delay: Duration) {
        self.slow_next_push.store(delay.as_millis() as u64, Ordering::Release);
    }

    fn remote(&self, stream_id: u64, key: &StreamKey) -> RemoteStream {
        RemoteStream {
            gateway: self.node_id,
            stream_id,
            job_type: key.job_type.clone(),
            worker: key.worker.clone(),
            timeout_ms: key.timeout_ms,
            tenants: key.tenants.clone(),
            fetch_variables: key.fetch_variables.clone(),
            session: key.session,
            labels: key.labels.clone(),
        }
    }

    /// A worker finished (or gave up) an activation it may have received
    /// from this gateway: its stream may take another job.
    pub fn release(&self, key: JobKey, attempt: u32) {
        self.held.release(key, attempt);
    }

    /// Adds a worker stream, holding at most `max_in_flight` jobs, to its
    /// aggregate, starting the aggregate's actor if it is the first of its kind.
    pub async fn open(&self, spec: &WorkerSpec, max_in_flight: usize) -> Result<Opened, Status> {
        let key = StreamKey::from(spec);
        let (sender, receiver) = mpsc::channel(max_in_flight.max(1));
        let client_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock().await;
        let (stream_id, new_stream) = match inner.by_key.get(&key) {
            Some(id) => (*id, None),
            None => {
                let id = self.epoch | (self.next_id.fetch_add(1, Ordering::Relaxed) & u64::from(u32::MAX));
                let signal = Arc::new(RoomSignal::default());
                let args = AggregatorArgs {
                    key: key.clone(),
                    stream: self.remote(id, &key),
                    held: Arc::clone(&self.held),
                    signal: Arc::clone(&signal),
                    leaders: self.leaders.get().cloned(),
                    slow_next_push: Arc::clone(&self.slow_next_push),
                };
                let (actor, _) = Actor::spawn(None, StreamAggregator, args)
                    .await
                    .map_err(|e| Status::internal(format!("starting the stream aggregator: {e}")))?;
                inner.by_key.insert(key.clone(), id);
                inner.streams.insert(id, Entry { key: key.clone(), actor, signal });
                metrics::gauge!("drover_gateway_job_stream_streams").increment(1.0);
                (id, Some(self.remote(id, &key)))
            }
        };
        let Entry { actor, signal, .. } = &inner.streams[&stream_id];
        let (credits, signal) = (Credits::new(max_in_flight, Arc::clone(signal)), Arc::clone(signal));
        match actor
            .call(|reply| AggregatorMsg::AddClient { client_id, sender, credits, reply }, Some(CALL_TIMEOUT))
            .await
        {
            Ok(CallResult::Success(())) => Ok(Opened { stream_id, client_id, receiver, new_stream, signal }),
            _ => Err(Status::unavailable("the stream aggregator did not answer; reconnect")),
        }
    }

    /// Removes a client; returns the stream when it was the last one, to be
    /// removed from the brokers.
    pub async fn close(&self, stream_id: u64, client_id: u64) -> Option<RemoteStream> {
        let mut inner = self.inner.lock().await;
        let entry = inner.streams.get(&stream_id)?;
        let empty = matches!(
            entry.actor.call(|reply| AggregatorMsg::RemoveClient { client_id, reply }, Some(CALL_TIMEOUT)).await,
            Ok(CallResult::Success(true))
        );
        if !empty {
            return None;
        }
        let entry = inner.streams.remove(&stream_id).expect("present");
        inner.by_key.remove(&entry.key);
        entry.actor.stop(Some("last client left".into()));
        metrics::gauge!("drover_gateway_job_stream_streams").decrement(1.0);
        Some(self.remote(stream_id, &entry.key))
    }

    /// Hands jobs `partition`'s leader pushed to the stream's aggregator.
    pub async fn push(&self, stream_id: u64, partition: PartitionId, jobs: Vec<ActivatedJobData>) -> PushOutcome {
        let actor = self.inner.lock().await.streams.get(&stream_id).map(|e| e.actor.clone());
        let Some(actor) = actor else {
            let reason = format!("gateway {} has no stream {stream_id}", self.node_id);
            return PushOutcome::NotDelivered { reason, unknown_stream: true };
        };
        let deliver_by = Instant::now() + PUSH_DELIVER_WITHIN;
        let push = |reply| AggregatorMsg::Push { partition, jobs, deliver_by, reply };
        match actor.call(push, Some(PUSH_ANSWER_WITHIN)).await {
            Ok(CallResult::Success((rejected, room))) => PushOutcome::Answered { rejected, room: Some(room) },
            Ok(CallResult::Timeout) => PushOutcome::Unknown {
                reason: format!("the stream's aggregator did not answer within {PUSH_ANSWER_WITHIN:?}"),
            },
            // The push never reached the mailbox, or was dropped from it unread:
            // the last client left and the aggregator stopped. Aggregators are
            // stopped (between messages), never killed mid-push.
            Err(e) => PushOutcome::NotDelivered {
                reason: format!("the stream's aggregator stopped: {e}"),
                unknown_stream: true,
            },
            Ok(CallResult::SenderError) => PushOutcome::NotDelivered {
                reason: "the stream's aggregator stopped before handling the push".into(),
                unknown_stream: true,
            },
        }
    }

    /// Ends every client stream (node shutdown): workers see their stream
    /// close and reconnect elsewhere. Returns the streams, to be removed from
    /// the brokers.
    pub async fn close_all(&self) -> Vec<RemoteStream> {
        let mut inner = self.inner.lock().await;
        inner.by_key.clear();
        let mut closed = Vec::new();
        for (id, entry) in inner.streams.drain() {
            entry.actor.stop(Some("node stopping".into()));
            metrics::gauge!("drover_gateway_job_stream_streams").decrement(1.0);
            closed.push(self.remote(id, &entry.key));
        }
        closed
    }

    /// Every aggregated stream, for (re-)registration with brokers.
    pub async fn registrations(&self) -> Vec<RemoteStream> {
        let inner = self.inner.lock().await;
        inner.streams.iter().map(|(id, e)| self.remote(*id, &e.key)).collect()
    }

    pub async fn view(&self) -> Vec<ClientStreamView> {
        let streams: Vec<(u64, StreamKey, ActorRef<AggregatorMsg>)> = {
            let inner = self.inner.lock().await;
            inner.streams.iter().map(|(id, e)| (*id, e.key.clone(), e.actor.clone())).collect()
        };
        let mut views = Vec::new();
        for (id, key, actor) in streams {
            let clients = match actor.call(|reply| AggregatorMsg::Clients { reply }, Some(CALL_TIMEOUT)).await {
                Ok(CallResult::Success(clients)) => clients,
                _ => Vec::new(),
            };
            views.push(ClientStreamView { id, key, clients });
        }
        views.sort_by_key(|v| v.id);
        views
    }
}

/// A worker's end of an aggregated stream. Dropping it (the worker went away)
/// leaves the aggregate and hands back every job still buffered for it, so
/// those jobs do not wait for their activation timeout.
pub struct ClientStream {
    receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>,
    /// Told when jobs leave the buffer: a buffer that was full has room
    /// (its jobs' slots may have been freed while they waited in it).
    signal: Arc<RoomSignal>,
    on_close: Option<OnClose>,
    /// Set after handing out a message: the next poll says Pending once, so
    /// the encoder sends each message in its own chunk instead of draining
    /// the buffer into a write it cannot take back. Jobs left in the buffer
    /// can then be handed back when the client goes away.
    just_yielded: bool,
    /// An error that ended a batch, for the next poll.
    failed: Option<Status>,
    /// Mints each job's job token as it leaves, when job tokens are on.
    job_tokens: Option<Arc<crate::auth::Authenticator>>,
    /// The call, for [`super::STREAM_MESSAGES`].
    method: &'static str,
}

/// Jobs in one message of `StreamActivatedJobBatches`, at most.
pub const BATCH_MESSAGE_JOBS: usize = 1024;
/// Bytes of jobs in one such message, about: the job that reaches it is the last.
pub const BATCH_MESSAGE_BYTES: usize = 1 << 20;

impl ClientStream {
    pub fn new(opened: Opened, on_close: OnClose) -> Self {
        ClientStream {
            receiver: opened.receiver,
            signal: opened.signal,
            on_close: Some(on_close),
            just_yielded: false,
            failed: None,
            job_tokens: None,
            method: "StreamActivatedJobs",
        }
    }

    /// Jobs leave with a job token from `auth`, if it mints them.
    pub fn with_job_tokens(mut self, auth: &Arc<crate::auth::Authenticator>) -> Self {
        self.job_tokens = auth.mints_job_tokens().then(|| Arc::clone(auth));
        self
    }

    /// The next message's jobs: those ready now, at least one, at most
    /// `max_jobs`, until their encoded bytes reach `max_bytes`.
    fn poll_jobs(
        &mut self,
        cx: &mut Context<'_>,
        max_jobs: usize,
        max_bytes: usize,
    ) -> Poll<Option<Result<Vec<pb::ActivatedJob>, Status>>> {
        if self.just_yielded {
            self.just_yielded = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(status) = self.failed.take() {
            return Poll::Ready(Some(Err(status)));
        }
        let mut jobs = Vec::new();
        let mut bytes = 0;
        while jobs.len() < max_jobs && bytes < max_bytes {
            match self.receiver.poll_recv(cx) {
                Poll::Ready(Some(Ok(mut job))) => {
                    if let Some(auth) = &self.job_tokens {
                        job.job_token = auth.job_token(job.key, job.attempt, job.deadline);
                    }
                    if max_bytes < usize::MAX {
                        bytes += prost::Message::encoded_len(&job);
                    }
                    jobs.push(job);
                }
                Poll::Ready(Some(Err(status))) if jobs.is_empty() => return Poll::Ready(Some(Err(status))),
                Poll::Ready(Some(Err(status))) => {
                    self.failed = Some(status);
                    break;
                }
                Poll::Ready(None) if jobs.is_empty() => return Poll::Ready(None),
                Poll::Pending if jobs.is_empty() => return Poll::Pending,
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        self.just_yielded = true;
        self.signal.freed();
        metrics::counter!(super::STREAM_MESSAGES, "method" => self.method).increment(1);
        Poll::Ready(Some(Ok(jobs)))
    }
}

/// Runs when a client stream ends, with the (key, attempt) of every job still
/// buffered for it.
pub type OnClose = Box<dyn FnOnce(Vec<(JobKey, u32)>) + Send>;

impl Stream for ClientStream {
    type Item = Result<pb::ActivatedJob, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_jobs(cx, 1, usize::MAX)
            .map(|next| next.map(|jobs| jobs.map(|mut jobs| jobs.pop().expect("a message holds a job"))))
    }
}

/// A worker's end of an aggregated stream, several jobs to a message
/// (`StreamActivatedJobBatches`): each message takes what is ready, up to
/// [`BATCH_MESSAGE_JOBS`] and about [`BATCH_MESSAGE_BYTES`].
pub struct ClientBatches(ClientStream);

impl ClientBatches {
    pub fn new(mut stream: ClientStream) -> Self {
        stream.method = "StreamActivatedJobBatches";
        ClientBatches(stream)
    }
}

impl Stream for ClientBatches {
    type Item = Result<pb::ActivatedJobBatch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.0.poll_jobs(cx, BATCH_MESSAGE_JOBS, BATCH_MESSAGE_BYTES);
        next.map(|next| next.map(|jobs| jobs.map(|jobs| pb::ActivatedJobBatch { jobs })))
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.receiver.close();
        let mut buffered = Vec::new();
        while let Ok(item) = self.receiver.try_recv() {
            if let Ok(job) = item {
                buffered.push((JobKey(job.key), job.attempt));
            }
        }
        if let Some(on_close) = self.on_close.take() {
            on_close(buffered);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gateway::convert;

    fn spec(timeout_ms: i64, fetch: &[&str]) -> WorkerSpec {
        convert::worker_spec(
            "t".into(),
            "w".into(),
            timeout_ms,
            fetch.iter().map(|s| s.to_string()).collect(),
            vec![],
            0,
            vec![],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn equivalent_streams_aggregate_regardless_of_order() {
        let streams = GatewayStreams::new(0);
        let a = streams.open(&spec(1000, &["x", "y"]), 8).await.unwrap();
        let b = streams.open(&spec(1000, &["y", "x", "x"]), 8).await.unwrap();
        let c = streams.open(&spec(2000, &["x", "y"]), 8).await.unwrap();
        assert!(a.new_stream.is_some());
        assert!(b.new_stream.is_none());
        assert_eq!(a.stream_id, b.stream_id);
        assert_ne!(a.stream_id, c.stream_id);
        assert_eq!(streams.view().await.iter().find(|v| v.id == a.stream_id).unwrap().clients.len(), 2);
        assert_eq!(streams.close(a.stream_id, a.client_id).await, None);
        assert!(streams.close(b.stream_id, b.client_id).await.is_some(), "last client removes the stream");
    }

    fn job(n: u64, job_type: &str, tenant: &str, deadline: crate::core::Millis) -> ActivatedJobData {
        ActivatedJobData {
            key: JobKey(n),
            spec: Arc::new(crate::core::JobSpec {
                job_type: job_type.into(),
                tenant: tenant.into(),
                variables: "{}".into(),
                custom_headers: vec![],
                ..Default::default()
            }),
            worker: "w".into(),
            retries: 3,
            deadline,
            attempt: 1,
            created_at: 0,
            stage: String::new(),
        }
    }

    fn rejected(outcome: PushOutcome) -> Vec<JobKey> {
        match outcome {
            PushOutcome::Answered { rejected, .. } => rejected,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn clients_at_their_limit_reject_pushes_until_jobs_are_released() {
        let streams = GatewayStreams::new(0);
        let mut opened = streams.open(&spec(60_000, &[]), 4).await.unwrap();
        let t = |n: u64| job(n, "t", crate::core::DEFAULT_TENANT, 0);
        let outcome = streams.push(opened.stream_id, 0, (1..=7).map(t).collect()).await;
        assert_eq!(
            rejected(outcome),
            vec![JobKey(5), JobKey(6), JobKey(7)],
            "the client holds 4; the rest are not taken"
        );
        // The worker reads them: they leave the buffer but are still its to finish.
        let mut received = 0;
        while opened.receiver.try_recv().is_ok() {
            received += 1;
        }
        assert_eq!(received, 4);

        streams.release(JobKey(1), 1);
        streams.release(JobKey(2), 7); // another attempt: not one this client holds
        streams.release(JobKey(3), crate::core::TAGGED_ATTEMPT | 2); // a tag none of them has
                                                                     // The jobs' deadlines (by the leader's clock) are long past; what counts
                                                                     // is the activation timeout on this gateway's clock.
        let outcome = streams.push(opened.stream_id, 0, vec![t(8), t(9)]).await;
        assert_eq!(rejected(outcome), vec![JobKey(9)], "one released, one taken");
        // A Zeebe key names the activation by its tag, a key without one any activation.
        streams.release(JobKey(2), crate::core::TAGGED_ATTEMPT | crate::core::attempt_tag(1));
        streams.release(JobKey(3), 0);
        let outcome = streams.push(opened.stream_id, 0, vec![t(10), t(11), t(12)]).await;
        assert_eq!(rejected(outcome), vec![JobKey(12)], "two released by tag and by key alone");
    }

    /// Partition leaders that take every offer of room, noting it, and note
    /// the activations handed back to them.
    struct Leaders {
        offers: std::sync::mpsc::Sender<(PartitionId, u32)>,
        handed_back: std::sync::mpsc::Sender<(JobKey, u32)>,
    }

    impl Leaders {
        fn new(offers: std::sync::mpsc::Sender<(PartitionId, u32)>) -> Arc<Leaders> {
            Arc::new(Leaders { offers, handed_back: std::sync::mpsc::channel().0 })
        }
    }

    impl LeaderLink for Leaders {
        fn offer_room(
            &self,
            partition: PartitionId,
            _stream: &RemoteStream,
            room: u32,
        ) -> Pin<Box<dyn Future<Output = OfferAnswer> + Send>> {
            self.offers.send((partition, room)).unwrap();
            Box::pin(async { OfferAnswer::Accepted })
        }

        fn hand_back(&self, activations: Vec<(JobKey, u32)>) {
            for activation in activations {
                let _ = self.handed_back.send(activation);
            }
        }
    }

    #[tokio::test]
    async fn a_full_stream_offers_freed_room_to_one_waiting_partition_at_a_time() {
        let streams = GatewayStreams::new(0);
        let (offered, offers) = std::sync::mpsc::channel();
        streams.connect(Leaders::new(offered));
        let mut opened = streams.open(&spec(60_000, &[]), 2).await.unwrap();
        let t = |n: u64| job(n, "t", crate::core::DEFAULT_TENANT, 0);
        let answer = |outcome| match outcome {
            PushOutcome::Answered { rejected, room } => (rejected, room),
            other => panic!("expected an answer, got {other:?}"),
        };
        assert_eq!(answer(streams.push(opened.stream_id, 1, vec![t(1)]).await), (vec![], Some(1)));
        assert_eq!(answer(streams.push(opened.stream_id, 2, vec![t(2), t(3)]).await), (vec![JobKey(3)], Some(0)));
        assert_eq!(answer(streams.push(opened.stream_id, 3, vec![t(4)]).await), (vec![JobKey(4)], Some(0)));
        // The aggregator has handled what was sent before a view: a sync point.
        let settle = || async { streams.view().await };
        // The worker reads its two jobs.
        assert!(opened.receiver.try_recv().is_ok() && opened.receiver.try_recv().is_ok());

        streams.release(JobKey(1), 1);
        settle().await;
        let (first, room) = offers.try_recv().expect("the freed slot is offered");
        assert!(room == 1 && (first == 2 || first == 3), "offered {room} to partition {first}");
        streams.release(JobKey(2), 1);
        settle().await;
        assert!(offers.try_recv().is_err(), "one offer at a time: the first may take both slots");

        // The first partition's push comes and takes one slot: the other
        // waiting partition is offered what is left.
        assert_eq!(answer(streams.push(opened.stream_id, first, vec![t(5)]).await), (vec![], Some(1)));
        settle().await;
        let other = if first == 2 { 3 } else { 2 };
        assert_eq!(offers.try_recv().ok(), Some((other, 1)));
        assert!(offers.try_recv().is_err(), "partition 1 never found the stream full");
    }

    #[test]
    fn held_activations_expire_by_the_gateway_clock() {
        let held = Held::default();
        let credits = Credits::new(1, Arc::default());
        assert!(credits.try_take());
        let now = Instant::now();
        held.hold(JobKey(1), 1, Arc::clone(&credits), now + Duration::from_millis(50));
        held.expire(now);
        assert!(!credits.try_take(), "held until its expiry");
        held.expire(now + Duration::from_millis(60));
        assert!(credits.try_take(), "expired and given back");
    }

    #[test]
    fn taking_back_a_hold_leaves_another_clients_hold_of_the_activation() {
        let held = Held::default();
        let expires = Instant::now() + Duration::from_secs(60);
        let (first, second) = (Credits::new(1, Arc::default()), Credits::new(1, Arc::default()));
        assert!(first.try_take() && second.try_take());
        held.hold(JobKey(1), 1, Arc::clone(&first), expires);
        held.unhold(JobKey(1), 1, &second);
        held.release(JobKey(1), 1);
        assert!(first.try_take(), "the first client's hold was still there for the worker's release");

        held.hold(JobKey(2), 1, Arc::clone(&second), expires);
        held.unhold(JobKey(2), 1, &second);
        second.give_back();
        held.release(JobKey(2), 1);
        assert!(second.try_take(), "given back once");
        assert!(!second.try_take(), "and not twice: the release found nothing held");
    }

    #[tokio::test]
    async fn a_stream_takes_only_jobs_of_its_type_and_tenants() {
        let streams = GatewayStreams::new(0);
        let tenants = vec!["t1".to_string()];
        let spec = convert::worker_spec("a".into(), "w".into(), 60_000, vec![], tenants, 0, vec![]).unwrap();
        let mut opened = streams.open(&spec, 8).await.unwrap();
        let jobs = vec![job(1, "a", "t1", 0), job(2, "a", "t2", 0), job(3, "b", "t1", 0)];
        let outcome = streams.push(opened.stream_id, 0, jobs).await;
        assert_eq!(rejected(outcome), vec![JobKey(2), JobKey(3)]);
        assert_eq!(opened.receiver.try_recv().unwrap().unwrap().key, 1);
        assert!(opened.receiver.try_recv().is_err());
    }

    #[tokio::test]
    async fn stream_ids_differ_between_starts_and_unknown_ids_are_said_so() {
        let (before, after) = (GatewayStreams::new(0), GatewayStreams::new(0));
        let old = before.open(&spec(1000, &[]), 8).await.unwrap();
        let new = after.open(&spec(1000, &[]), 8).await.unwrap();
        assert_ne!(old.stream_id, new.stream_id, "a restarted gateway never reuses an id");
        let outcome = after.push(old.stream_id, 0, vec![job(1, "t", crate::core::DEFAULT_TENANT, 0)]).await;
        assert!(matches!(outcome, PushOutcome::NotDelivered { unknown_stream: true, .. }), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_push_that_waited_past_its_time_hands_out_nothing_and_hands_its_jobs_back() {
        let streams = GatewayStreams::new(0);
        let (handed_back, handed_back_to) = std::sync::mpsc::channel();
        streams.connect(Arc::new(Leaders { offers: std::sync::mpsc::channel().0, handed_back }));
        let mut opened = streams.open(&spec(60_000, &[]), 8).await.unwrap();
        streams.slow_down_next_push(PUSH_ANSWER_WITHIN + Duration::from_millis(200));
        let outcome = streams.push(opened.stream_id, 0, vec![job(1, "t", crate::core::DEFAULT_TENANT, 0)]).await;
        assert!(matches!(outcome, PushOutcome::Unknown { .. }), "{outcome:?}");
        // The aggregator handles it late, and hands nothing out.
        let outcome = streams.push(opened.stream_id, 0, vec![job(2, "t", crate::core::DEFAULT_TENANT, 0)]).await;
        assert_eq!(rejected(outcome), vec![]);
        assert_eq!(opened.receiver.try_recv().unwrap().unwrap().key, 2, "only the push in time is delivered");
        assert!(opened.receiver.try_recv().is_err());
        // Nobody waited for the late push's answer: its job went back to its
        // leader (the answered push's leader yields what it is told of).
        assert_eq!(handed_back_to.try_iter().collect::<Vec<_>>(), vec![(JobKey(1), 1)]);
    }
}
