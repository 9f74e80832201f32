//! The `StreamAggregator` actor: one per aggregated stream on a gateway. It
//! owns the stream's clients and hands each pushed job to one of them.
//!
//! It hands out only jobs of its stream's type and tenants (anything else
//! went to the wrong stream and is refused), and nothing from a push that
//! waited in its mailbox past the push's `deliver_by`: the gateway stopped
//! waiting for that answer and reported the outcome as unknown. The jobs of
//! a push nobody waits for any more that no client took are handed back
//! (yielded) by the gateway itself: their leader, which could not tell, would
//! leave them to their activation timeout.
//!
//! It also owns the stream's room: every push's answer says how many more
//! jobs the clients can take, and a partition whose push found the stream
//! full waits for it. When a client can take a job again (its worker finished
//! one, a job's activation timeout passed, or a job left a full buffer) the
//! aggregator offers the room to one waiting partition, picked at random, and
//! to the next one only once that partition's push has come, or it declined:
//! so partitions that wait for one slot do not all push into it, only for all
//! but one to be yielded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::Rng;
use tokio::sync::mpsc::{self, error::TrySendError};
use tonic::Status;

use super::broker::RemoteStream;
use super::flow::{Credits, Held, LeaderLink, OfferAnswer, RoomSignal, StreamKey};
use super::spec::activated_job;
use crate::core::{ActivatedJobData, JobKey, PartitionId};
use crate::proto::gateway as pb;

/// How long an accepted offer of room holds the stream's other waiting
/// partitions back if its push does not come (it was lost).
const OFFER_USED_WITHIN: Duration = Duration::from_secs(1);
/// How long offers wait after a partition's leader could not be reached.
const OFFER_AGAIN_AFTER: Duration = Duration::from_millis(250);

pub type ClientSender = mpsc::Sender<Result<pb::ActivatedJob, Status>>;

pub enum AggregatorMsg {
    /// A worker stream joins.
    AddClient { client_id: u64, sender: ClientSender, credits: Arc<Credits>, reply: RpcReplyPort<()> },
    /// A worker stream left; the reply says whether none are left.
    RemoveClient { client_id: u64, reply: RpcReplyPort<bool> },
    /// Jobs pushed by `partition`'s leader; the reply lists the keys no
    /// client took and the jobs the clients can take after them. Handled
    /// after `deliver_by`, it hands out none.
    Push {
        partition: PartitionId,
        jobs: Vec<ActivatedJobData>,
        deliver_by: Instant,
        reply: RpcReplyPort<(Vec<JobKey>, u32)>,
    },
    /// The ids of the clients, for `/actuator/jobstreams`.
    Clients { reply: RpcReplyPort<Vec<u64>> },
    /// A client may take another job while partitions wait for room (from
    /// [`RoomSignal`]).
    Freed,
    /// What became of offer number `offer` (internal).
    OfferAnswered { offer: u64, answer: OfferAnswer },
    /// Offer number `offer` holds others back no longer (internal).
    OfferLapsed { offer: u64 },
    /// The earliest held activation's timeout has passed (internal).
    Expire,
}

pub struct StreamAggregator;

/// What an aggregator starts with.
pub struct AggregatorArgs {
    pub key: StreamKey,
    /// The stream as brokers know it.
    pub stream: RemoteStream,
    pub held: Arc<Held>,
    pub signal: Arc<RoomSignal>,
    /// How offers of room reach partition leaders (none: nobody to offer to).
    pub leaders: Option<Arc<dyn LeaderLink>>,
    /// Test hook: ms the next push waits before it is handled.
    pub slow_next_push: Arc<AtomicU64>,
}

pub struct AggregatorState {
    key: StreamKey,
    stream: RemoteStream,
    held: Arc<Held>,
    signal: Arc<RoomSignal>,
    leaders: Option<Arc<dyn LeaderLink>>,
    slow_next_push: Arc<AtomicU64>,
    clients: Vec<(u64, ClientSender, Arc<Credits>)>,
    /// Partitions whose push found the stream full, waiting for room.
    waiting: Vec<PartitionId>,
    /// The offer of room in progress: its number and partition.
    offer: Option<(u64, PartitionId)>,
    offers_made: u64,
    /// When the expiry timer set for a full stream fires.
    expiry_at: Option<Instant>,
}

impl Actor for StreamAggregator {
    type Msg = AggregatorMsg;
    type State = AggregatorState;
    type Arguments = AggregatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AggregatorMsg>,
        args: AggregatorArgs,
    ) -> Result<AggregatorState, ActorProcessingErr> {
        args.signal.attach(myself);
        Ok(AggregatorState {
            key: args.key,
            stream: args.stream,
            held: args.held,
            signal: args.signal,
            leaders: args.leaders,
            slow_next_push: args.slow_next_push,
            clients: Vec::new(),
            waiting: Vec::new(),
            offer: None,
            offers_made: 0,
            expiry_at: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<AggregatorMsg>,
        message: AggregatorMsg,
        state: &mut AggregatorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AggregatorMsg::AddClient { client_id, sender, credits, reply } => {
                state.clients.push((client_id, sender, credits));
                metrics::gauge!("drover_gateway_job_stream_clients").increment(1.0);
                let _ = reply.send(());
                state.offer_room(&myself);
            }
            AggregatorMsg::RemoveClient { client_id, reply } => {
                let before = state.clients.len();
                state.clients.retain(|(id, _, _)| *id != client_id);
                if state.clients.len() < before {
                    metrics::gauge!("drover_gateway_job_stream_clients").decrement(1.0);
                }
                let _ = reply.send(state.clients.is_empty());
            }
            AggregatorMsg::Push { partition, jobs, deliver_by, reply } => {
                let delay = state.slow_next_push.swap(0, Ordering::AcqRel);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let rejected = if Instant::now() > deliver_by {
                    metrics::counter!("drover_gateway_job_stream_push_late_total").increment(jobs.len() as u64);
                    jobs.iter().map(|j| (j.key, j.attempt)).collect()
                } else {
                    state.push(jobs)
                };
                if state.offer.is_some_and(|(_, offered)| offered == partition) {
                    state.offer = None;
                }
                let room = state.room();
                if room == 0 && !state.waiting.contains(&partition) {
                    state.waiting.push(partition);
                }
                let keys = rejected.iter().map(|(key, _)| *key).collect();
                if reply.send((keys, room)).is_err() && !rejected.is_empty() {
                    // Nobody waits for this answer any more: the leader took the
                    // push's outcome as unknown and would leave the jobs no
                    // client took to their activation timeout.
                    if let Some(leaders) = &state.leaders {
                        leaders.hand_back(rejected);
                    }
                }
                state.offer_room(&myself);
            }
            AggregatorMsg::Clients { reply } => {
                let _ = reply.send(state.clients.iter().map(|(id, _, _)| *id).collect());
            }
            AggregatorMsg::Freed => state.offer_room(&myself),
            AggregatorMsg::OfferAnswered { offer, answer } => {
                let Some((current, partition)) = state.offer else { return Ok(()) };
                if current != offer {
                    return Ok(());
                }
                let hold_for = match answer {
                    // Until its push comes (which ends the offer).
                    OfferAnswer::Accepted => OFFER_USED_WITHIN,
                    OfferAnswer::Declined => {
                        state.offer = None;
                        state.offer_room(&myself);
                        return Ok(());
                    }
                    // Its leader still waits (it may not even know): it is
                    // offered the room again, after a pause.
                    OfferAnswer::Unreachable => {
                        if !state.waiting.contains(&partition) {
                            state.waiting.push(partition);
                        }
                        OFFER_AGAIN_AFTER
                    }
                };
                let me = myself.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(hold_for).await;
                    let _ = me.cast(AggregatorMsg::OfferLapsed { offer });
                });
            }
            AggregatorMsg::OfferLapsed { offer } => {
                if state.offer.is_some_and(|(current, _)| current == offer) {
                    state.offer = None;
                    state.offer_room(&myself);
                }
            }
            AggregatorMsg::Expire => {
                state.expiry_at = None;
                state.held.expire(Instant::now());
                state.offer_room(&myself);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AggregatorMsg>,
        state: &mut AggregatorState,
    ) -> Result<(), ActorProcessingErr> {
        metrics::gauge!("drover_gateway_job_stream_clients").decrement(state.clients.len() as f64);
        Ok(())
    }
}

impl AggregatorState {
    /// Jobs the clients can take now: what their limits and their buffers
    /// leave them (a client whose worker went away takes none).
    fn room(&self) -> u32 {
        let room: usize = self
            .clients
            .iter()
            .filter(|(_, sender, _)| !sender.is_closed())
            .map(|(_, sender, credits)| credits.free().min(sender.capacity()))
            .sum();
        u32::try_from(room).unwrap_or(u32::MAX)
    }

    /// Offers the room the clients have to one waiting partition, unless an
    /// offer is in progress. A full stream waits for a client to free a slot
    /// ([`AggregatorMsg::Freed`]) or for its earliest held activation to
    /// time out.
    fn offer_room(&mut self, myself: &ActorRef<AggregatorMsg>) {
        if self.waiting.is_empty() {
            return;
        }
        // Armed before the room is counted: a slot freed after the count
        // still sends `Freed`.
        self.signal.arm();
        if self.offer.is_some() {
            return;
        }
        let room = self.room();
        if room == 0 {
            self.expire_later(myself);
            return;
        }
        let Some(leaders) = self.leaders.clone() else {
            self.waiting.clear();
            return;
        };
        let partition = self.waiting.swap_remove(rand::rng().random_range(0..self.waiting.len()));
        self.offers_made += 1;
        let offer = self.offers_made;
        self.offer = Some((offer, partition));
        metrics::counter!("drover_gateway_job_stream_room_offers_total").increment(1);
        let answer = leaders.offer_room(partition, &self.stream, room);
        let me = myself.clone();
        tokio::spawn(async move {
            let answer = answer.await;
            let _ = me.cast(AggregatorMsg::OfferAnswered { offer, answer });
        });
    }

    /// Wakes the aggregator when the earliest held activation times out,
    /// unless a wake-up is set already.
    fn expire_later(&mut self, myself: &ActorRef<AggregatorMsg>) {
        if self.expiry_at.is_some() {
            return;
        }
        let Some(at) = self.held.next_expiry() else { return };
        self.expiry_at = Some(at);
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let _ = me.cast(AggregatorMsg::Expire);
        });
    }

    /// Each job goes to a client picked at random; when the pick is not ready
    /// (it holds as many jobs as it allows, or it is gone) the others are tried.
    /// Jobs of another type or tenant are refused.
    fn push(&self, jobs: Vec<ActivatedJobData>) -> Vec<(JobKey, u32)> {
        let now = Instant::now();
        self.held.expire(now);
        let expires = now + Duration::from_millis(self.key.timeout_ms.max(0) as u64);
        let mut rejected = Vec::new();
        let mut rng = rand::rng();
        let count = self.clients.len();
        for job in jobs {
            if job.spec.job_type != self.key.job_type || !self.key.tenants.contains(&job.spec.tenant) {
                metrics::counter!("drover_gateway_job_stream_push_refused_total").increment(1);
                tracing::warn!(
                    key = %job.key,
                    job_type = %job.spec.job_type,
                    tenant = %job.spec.tenant,
                    "refused a pushed job this stream does not serve"
                );
                rejected.push((job.key, job.attempt));
                continue;
            }
            let mut message = Some(Ok(activated_job(&job, &self.key.fetch_variables)));
            if count > 0 {
                let start = rng.random_range(0..count);
                for offset in 0..count {
                    let (_, client, credits) = &self.clients[(start + offset) % count];
                    if !credits.try_take() {
                        metrics::counter!("drover_gateway_job_stream_push_fail_try_total").increment(1);
                        continue;
                    }
                    // Held before it is sent: once sent, the worker may
                    // finish the job and its release reach this gateway
                    // before this thread runs again, and a hold recorded
                    // after that release would keep the slot taken until
                    // the activation timeout.
                    self.held.hold(job.key, job.attempt, Arc::clone(credits), expires);
                    match client.try_send(message.take().expect("message present")) {
                        Ok(()) => break,
                        Err(TrySendError::Full(m) | TrySendError::Closed(m)) => {
                            self.held.unhold(job.key, job.attempt, credits);
                            credits.give_back();
                            metrics::counter!("drover_gateway_job_stream_push_fail_try_total").increment(1);
                            message = Some(m);
                        }
                    }
                }
            }
            if message.is_some() {
                rejected.push((job.key, job.attempt));
            } else {
                metrics::counter!("drover_gateway_job_stream_push_total").increment(1);
            }
        }
        rejected
    }
}
