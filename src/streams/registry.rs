//! The gateway's registry of its aggregated streams: equivalence key to
//! stream id to its aggregator actor. Opening and closing a worker's stream,
//! handing pushed jobs to the aggregator, and the stream's registration with
//! brokers go through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use tokio::sync::mpsc;
use tonic::Status;

use super::aggregator::{AggregatorArgs, AggregatorMsg, StreamAggregator};
use super::broker::{PushOutcome, RemoteStream};
use super::flow::{Credits, Held, LeaderLink, RoomSignal, StreamKey};
use super::spec::WorkerSpec;
use crate::core::{ActivatedJobData, JobKey, NodeId, PartitionId};
use crate::proto::gateway as pb;

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
    /// Set when this client created the aggregated stream (registered with
    /// the brokers through the [`LeaderLink`]).
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
            Ok(CallResult::Success(())) => {
                if let (Some(stream), Some(leaders)) = (&new_stream, self.leaders.get()) {
                    leaders.register(stream);
                }
                Ok(Opened { stream_id, client_id, receiver, new_stream, signal })
            }
            _ => Err(Status::unavailable("the stream aggregator did not answer; reconnect")),
        }
    }

    /// Removes a client; when it was the last one, the stream is removed
    /// from the brokers, and returned.
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
        let stream = self.remote(stream_id, &entry.key);
        if let Some(leaders) = self.leaders.get() {
            leaders.remove(&stream);
        }
        Some(stream)
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;

    use super::*;
    use crate::streams::flow::OfferAnswer;

    fn spec(timeout_ms: i64, fetch: &[&str]) -> WorkerSpec {
        let mut fetch_variables: Vec<String> = fetch.iter().map(|s| s.to_string()).collect();
        fetch_variables.sort();
        fetch_variables.dedup();
        WorkerSpec {
            job_type: "t".into(),
            worker: "w".into(),
            timeout_ms,
            fetch_variables,
            tenants: vec![crate::core::DEFAULT_TENANT.into()],
            session: 0,
            labels: vec![],
        }
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

        fn register(&self, _stream: &RemoteStream) {}

        fn remove(&self, _stream: &RemoteStream) {}

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
        let spec = WorkerSpec { job_type: "a".into(), tenants, ..spec(60_000, &[]) };
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
