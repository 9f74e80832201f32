//! The `PartitionLeader` actor.
//!
//! While its node leads a partition, the actor owns the partition's writes:
//! it batches submitted commands into Raft entries, runs the timers, and
//! pushes activated jobs to registered streams.
//!
//! **Time.** Every entry carries the leader's time, and the engine's timers
//! (activation deadlines, back-offs, delays, retention and dedupe windows)
//! run on it. A leader's time is a steady clock: it starts from the
//! partition's replicated time as this node last saw it advance, plus the
//! time elapsed here since (see `SharedState::clock_estimate`), and then
//! runs with the process's monotonic clock. A node that has just restarted
//! and leads before it applied any new entry has no such estimate: it takes
//! the lower median of its peers' estimates when, with itself, a majority
//! answered; failing that (a new partition, most replicas restarted) the
//! lower median of a majority's wall clocks; failing that the replicated
//! time (see `resume_time`). So a wall clock that steps (NTP, a VM resume) or
//! is skewed on a minority of nodes moves no deadline, and time never runs
//! backwards within a partition.
//!
//! **Taking over.** A new leader first commits an empty entry of its own:
//! once that applies, every entry of earlier terms has applied too, and the
//! leader schedules their timers and offers their activatable jobs.
//!
//! **Pushing.** A job is activated for a stream only when the stream has room
//! as far as the leader knows ([`StreamRooms`]): every push's answer says how
//! many more jobs the stream's clients can take, and a push never carries more.
//! When every stream that could take a job is full, the job stays activatable
//! (for long polls, and for the next push) instead of being activated and
//! yielded: the gateway of a stream it answered "full" offers the room to one
//! waiting partition when a client frees a slot ([`LeaderMsg::RoomOffered`]).
//! Yields remain for races: another partition took the room first, or the
//! stream is not what its registration said.
//!
//! **Stopping.** Before leadership moves on purpose (a hand-over to the
//! preferred replica, a node stopping), the node drains the actor
//! ([`LeaderMsg::Drain`]): it activates nothing more and takes no new
//! commands but hand-backs, and answers once its writes in flight have
//! committed and their pushes have been answered, the jobs a gateway refused
//! yielded. Otherwise a push answered after the actor stopped would leave its
//! refused jobs activated, waiting for their activation timeout. Yields this
//! leader can no longer write (it lost leadership, or it stopped before a
//! push was answered) go to whichever replica leads, as a gateway's
//! hand-backs do ([`GatewayLink::yield_elsewhere`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::seq::IndexedRandom;

use super::streams::{BrokerStreams, PushOutcome, PushedActivations, RemoteStream, Reservation, StreamRooms};
use crate::admin::stages::{self, Stage};
use crate::core::{
    ActivatedJobData, Activation, Batch, Command, CommandResult, JobKey, Millis, PartitionId, Retention, Routing,
    Taker, Via, YieldReason,
};
use crate::raft::{NodeId, Replica, WriteError};

/// Commands in one Raft entry, at most.
const MAX_BATCH_COMMANDS: usize = 4096;
/// Bytes of commands ([`Command::encoded_len`]) in one Raft entry, at most,
/// unless one submission alone is larger: a submission is one outcome and is
/// never split, so submitters with many commands cut them to this size
/// (the gateway does). It keeps an entry, and so a Raft append, quick to ship
/// and sync within a heartbeat.
pub const MAX_ENTRY_BYTES: usize = 4 << 20;
/// Raft writes in flight at once; more commands wait and join the next entry.
/// One: openraft keeps one append in flight per follower, so a second write
/// in flight gains little parallelism; it mostly splits what would have been
/// one entry into several, each with its own syncs and appends on every
/// replica. Against four, one gave the same throughput (3 nodes 16,963-17,371
/// against 16,591-16,962 jobs/s; 1 node 35,856-37,466 against 34,463-35,683)
/// and, at 1,000 jobs/s on 3 nodes, p50 3.9 ms instead of 4.6 ms, p99 6.3-6.8
/// instead of 7.9-9.0, and less CPU (docs/benchmarks.md).
const MAX_IN_FLIGHT: usize = 1;
/// Commands waiting for a write; beyond this, submitters get RESOURCE_EXHAUSTED.
const MAX_PENDING_COMMANDS: usize = 100_000;
/// Jobs activated for one push to one stream, at most (and never more than
/// the stream has room for). With [`MAX_PUSHES_PER_TYPE`] it bounds how fast
/// a partition hands jobs out while creates run ahead: 32 jobs and 4 pushes
/// held 1 node to 37,000 jobs/s end to end with the machine a quarter idle,
/// and 3 nodes to 17,400-17,800; 128 and 8 gave 48,000-50,600 and
/// 24,700-25,200, with less memory, as the backlog drains (docs/benchmarks.md).
const PUSH_BATCH: u32 = 128;
/// Bytes of jobs ([`ActivatedJobData::encoded_len`]) activated for one push,
/// at most (or one job, whatever its size), so the push fits one message.
const PUSH_BATCH_BYTES: u64 = 16 << 20;
/// Pushes of one type in flight at once (each a Raft write, then an RPC to a
/// gateway). One at a time capped a partition's delivery at one batch per
/// commit-and-push round trip while creates ran far ahead.
const MAX_PUSHES_PER_TYPE: usize = 8;
/// How often a leader offers every activatable type again.
const REOFFER_EVERY: Duration = Duration::from_secs(1);
/// How long a stream is skipped after a push to it was not delivered, or its
/// gateway could not say what became of it (full streams wait for room instead).
const BLOCKED_FOR: Duration = Duration::from_millis(100);

/// Why a submitted batch did not run.
#[derive(Clone, Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("this node does not lead partition {partition}")]
    NotLeader { partition: PartitionId, leader: Option<NodeId> },
    #[error("partition {partition} has {pending} commands waiting; retry with back-off")]
    Overloaded { partition: PartitionId, pending: usize },
    #[error("partition {partition} could not commit: {message}")]
    Stopped { partition: PartitionId, message: String },
}

impl From<&WriteError> for SubmitError {
    fn from(e: &WriteError) -> Self {
        match e {
            WriteError::NotLeader { partition, leader } => {
                SubmitError::NotLeader { partition: *partition, leader: *leader }
            }
            WriteError::Stopped { partition, message } => {
                SubmitError::Stopped { partition: *partition, message: message.clone() }
            }
        }
    }
}

pub type SubmitReply = RpcReplyPort<Result<Vec<CommandResult>, SubmitError>>;

/// How a partition leader reaches gateways (its own node's or another's).
pub trait GatewayLink: Send + Sync + 'static {
    /// Hands activated jobs to a stream's gateway.
    fn push(
        &self,
        stream: &RemoteStream,
        partition: PartitionId,
        jobs: Vec<ActivatedJobData>,
    ) -> Pin<Box<dyn Future<Output = PushOutcome> + Send>>;
    /// Tells every gateway that jobs of a type became activatable here.
    fn jobs_available(&self, partition: PartitionId, job_type: &str);
    /// Tells a gateway that workers finished these pushed (key, attempt)
    /// activations, wherever they reported it (best effort).
    fn release(&self, gateway: NodeId, activations: Vec<(JobKey, u32)>);
    /// Runs `yields` ([`Command::Yield`] of this partition's jobs) on
    /// whichever replica leads the partition now, in the background: for
    /// yields this leader can no longer write itself.
    fn yield_elsewhere(&self, partition: PartitionId, yields: Vec<Command>);
    /// The clocks of those of `nodes` that answer within `limit`: each one's
    /// wall clock and its estimate of `partition`'s time, if it has one.
    fn peer_clocks(
        &self,
        nodes: Vec<NodeId>,
        partition: PartitionId,
        limit: Duration,
    ) -> Pin<Box<dyn Future<Output = Vec<PeerClock>> + Send>>;
}

/// What a peer said of its clocks (see [`GatewayLink::peer_clocks`]).
#[derive(Clone, Copy, Debug)]
pub struct PeerClock {
    pub wall: Millis,
    /// Its estimate of the partition's time now; `None` if it has applied no
    /// entry since it started.
    pub estimate: Option<Millis>,
}

pub enum LeaderMsg {
    /// Run commands through Raft; the reply carries one result per command.
    Submit { commands: Vec<Command>, reply: SubmitReply },
    /// A stream for this type registered: push to it what is waiting.
    StreamAdded { job_type: String },
    /// The gateway of a stream (`gateway`, `stream_id`) that answered a push
    /// of this partition as full has `room` for jobs again. The reply says
    /// whether jobs were activated to push there (false: none the stream
    /// serves are waiting, so the gateway offers the room to another partition).
    RoomOffered { gateway: NodeId, stream_id: u64, job_type: String, room: u32, reply: RpcReplyPort<bool> },
    /// A write finished (internal).
    Written { available: Vec<String>, next_timer: Option<Millis>, error: Option<SubmitError> },
    /// The partition's earliest timer is due (internal).
    TimerFired { generation: u64 },
    /// A push is about to leave for `gateway` (internal). Sent before the push
    /// itself, so it is here before any completion of these activations.
    Handing { gateway: NodeId, activations: Vec<(JobKey, u32, Millis)> },
    /// A push finished (internal).
    PushDone(PushReport),
    /// Try pushing a type again after streams were blocked (internal).
    RetryPush { job_type: String },
    /// The leader's first entry applied: every earlier entry has too (internal).
    TookOver,
    /// Offer what is activatable again (internal, every [`REOFFER_EVERY`]):
    /// a stream that went away (closed, expired, its session quiet) may have
    /// been the better tier some jobs waited for, and nothing else tells.
    Reoffer,
    /// Activate nothing more, take no new commands but hand-backs, and answer
    /// once every write in flight has committed and every push has been
    /// answered (refused jobs yielded): leadership is about to move.
    Drain { reply: RpcReplyPort<()> },
}

/// A push on its way: the stream, its claim on the stream's room, and the
/// gateway's offer it answers, if any.
pub struct PushTicket {
    stream: Arc<RemoteStream>,
    reservation: Reservation,
    offer: Option<RpcReplyPort<bool>>,
}

/// What a finished push tells its leader.
pub struct PushReport {
    stream: Arc<RemoteStream>,
    reservation: Reservation,
    /// The stream's room after the push, when its gateway answered and said.
    room: Option<u32>,
    activated: usize,
    /// Activations no client took, for certain: yielded.
    rejected: Refused,
    /// Activations a client took, or may have.
    handed: usize,
    /// The gateway holds no such stream any more.
    unknown_stream: bool,
    /// Whether the jobs in `handed` reached a client is not known.
    outcome_unknown: bool,
}

impl PushReport {
    fn empty(stream: Arc<RemoteStream>, reservation: Reservation) -> Self {
        PushReport {
            stream,
            reservation,
            room: None,
            activated: 0,
            rejected: Refused::none(),
            handed: 0,
            unknown_stream: false,
            outcome_unknown: false,
        }
    }
}

enum ReplyTo {
    Client(SubmitReply),
    Push(PushTicket),
    /// The leader's first entry.
    TakeOver,
    /// Yields of jobs a push's gateway refused: when this leader cannot
    /// write them, the partition's current leader does.
    Yields(Refused),
    Ignore,
}

/// A partition leader's steady clock: see the module doc.
struct LeaderClock {
    base: Millis,
    started: Instant,
}

/// How long a new leader without a clock estimate waits for its peers' clocks.
const PEER_CLOCKS_WAIT: Duration = Duration::from_millis(500);

impl LeaderClock {
    async fn start(replica: &Replica, link: &dyn GatewayLink) -> Self {
        let shared = replica.state();
        let base = match shared.clock_estimate() {
            Some(estimate) => estimate,
            None => {
                let replicated = shared.read(|s| s.clock());
                let peers: Vec<NodeId> =
                    replica.status().members.into_iter().filter(|n| *n != replica.node_id()).collect();
                let answers = link.peer_clocks(peers.clone(), replica.partition, PEER_CLOCKS_WAIT).await;
                let estimates: Vec<Millis> = answers.iter().filter_map(|a| a.estimate).collect();
                let mut walls: Vec<Millis> = answers.iter().map(|a| a.wall).collect();
                walls.push(now_millis());
                resume_time(replica, replicated, &estimates, walls, peers.len() + 1)
            }
        };
        LeaderClock { base, started: Instant::now() }
    }

    fn now(&self) -> Millis {
        self.base.saturating_add(self.started.elapsed().as_millis() as Millis)
    }
}

pub struct LeaderArgs {
    pub replica: Arc<Replica>,
    pub streams: Arc<BrokerStreams>,
    pub link: Arc<dyn GatewayLink>,
    pub retention: Retention,
    pub locality: Arc<Locality>,
}

/// Which gateways are in the leader's region: streams and polls there are
/// preferred among equals (see [`crate::core::routing`]).
#[derive(Clone, Debug, Default)]
pub struct Locality {
    /// This node's region (empty: none, every gateway is as near as any).
    pub own: String,
    /// Node id -> region.
    pub regions: HashMap<NodeId, String>,
    /// This node, when its leaders prefer an equivalent stream on its own
    /// gateway to the one picked at random (`--push-placement local`).
    pub node: Option<NodeId>,
}

impl Locality {
    pub fn near(&self, gateway: NodeId) -> bool {
        !self.own.is_empty() && self.regions.get(&gateway).is_some_and(|r| *r == self.own)
    }

    fn taker(&self, stream: &RemoteStream) -> Taker {
        Taker::new(stream.labels.clone(), self.near(stream.gateway))
    }
}

pub struct PartitionLeader;

pub struct LeaderState {
    partition: PartitionId,
    replica: Arc<Replica>,
    streams: Arc<BrokerStreams>,
    link: Arc<dyn GatewayLink>,
    retention: Retention,
    locality: Arc<Locality>,
    clock: LeaderClock,
    /// Submissions waiting for a write slot, with when each arrived.
    pending: VecDeque<(Vec<Command>, ReplyTo, Instant)>,
    pending_commands: usize,
    in_flight: usize,
    timer_at: Option<Millis>,
    timer_generation: u64,
    /// Pushes in flight per type. Each activation takes its jobs when it
    /// applies, so concurrent pushes never hand out the same job.
    pushing: HashMap<String, usize>,
    /// Types that became available again while a push was in flight.
    push_again: HashSet<String>,
    /// Streams a push did not reach, or reached with an unknown outcome:
    /// skipped until then (see [`BLOCKED_FOR`]).
    blocked: HashMap<(NodeId, u64), Instant>,
    retry_scheduled: HashSet<String>,
    /// How many more jobs each stream can take, as far as this leader knows.
    rooms: StreamRooms,
    /// Pushed activations, to tell their gateway when they finish.
    pushed: PushedActivations,
    /// Finished pushed activations per gateway, sent after the next write.
    releases: HashMap<NodeId, Vec<(JobKey, u32)>>,
    /// Whether this leader's take-over entry has applied.
    took_over: bool,
    /// Set by [`LeaderMsg::Drain`]: who waits for the drain to finish.
    draining: Option<Vec<RpcReplyPort<()>>>,
}

/// The time a leader that has seen no entry apply since it started takes up
/// from, never before the replicated time:
/// - with estimates of the partition's time from enough peers that, with
///   itself, a majority of the replicas answered: the lower median of those
///   estimates. A peer that kept running knows the partition's time from the
///   entries it applied and its own steady clock, so the time goes on from
///   where the partition was, whatever the wall clocks say;
/// - otherwise (a new partition, or most replicas restarted too), with a
///   majority's wall clocks (its own among them): their lower median, so the
///   partition's time, which jobs' timestamps show, stays near the wall
///   clocks and one node's clock moves nothing;
/// - alone (no peers): its own wall clock;
/// - with neither: the replicated time plus the time this replica has run,
///   so timers fire late by the outage, never early.
///
/// Estimates come first because the partition's time may lag the wall
/// clocks (every hand-over starts from an entry's time as a replica saw it
/// applied, and a leader without a majority resumes from its last entry):
/// moving it up to them while leases run would end those leases early by
/// the lag. That can still happen after most replicas restarted together.
fn resume_time(
    replica: &Replica,
    replicated: Millis,
    estimates: &[Millis],
    walls: Vec<Millis>,
    replicas: usize,
) -> Millis {
    let partition = replica.partition;
    let resume = choose_resume_time(replicated, estimates, &walls, replicas);
    if matches!(resume, Resume::WallClocks(_)) {
        warn_if_wall_clock_off(partition, &walls);
    }
    match resume {
        Resume::Estimates(time) | Resume::WallClocks(time) | Resume::OwnWallClock(time) => time,
        Resume::Replicated => {
            tracing::warn!(
                partition,
                answered = walls.len(),
                replicas,
                "leading without a majority's clocks: the partition's time resumes from its last entry"
            );
            replicated.saturating_add(replica.running_for().as_millis() as Millis)
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Resume {
    Estimates(Millis),
    WallClocks(Millis),
    OwnWallClock(Millis),
    /// From the replicated time plus the time this replica has run.
    Replicated,
}

/// The decision of [`resume_time`]; `walls` ends with this node's own.
fn choose_resume_time(replicated: Millis, estimates: &[Millis], walls: &[Millis], replicas: usize) -> Resume {
    let lower_median = |values: &[Millis]| {
        let mut values = values.to_vec();
        values.sort_unstable();
        values[(values.len() - 1) / 2].max(replicated)
    };
    if replicas <= 1 {
        return Resume::OwnWallClock(walls.last().copied().unwrap_or(replicated).max(replicated));
    }
    let majority = replicas / 2 + 1;
    if !estimates.is_empty() && estimates.len() + 1 >= majority {
        return Resume::Estimates(lower_median(estimates));
    }
    if walls.len() >= majority {
        return Resume::WallClocks(lower_median(walls));
    }
    Resume::Replicated
}

fn warn_if_wall_clock_off(partition: PartitionId, walls: &[Millis]) {
    let Some(own) = walls.last().copied() else { return };
    let mut sorted = walls.to_vec();
    sorted.sort_unstable();
    let median = sorted[(sorted.len() - 1) / 2];
    if own.abs_diff(median) > 1_000 {
        tracing::warn!(
            partition,
            off_ms = own - median,
            ?walls,
            "this node's wall clock is off the other replicas'; the partition's time does not follow it"
        );
    }
}

pub fn now_millis() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

impl Actor for PartitionLeader {
    type Msg = LeaderMsg;
    type State = LeaderState;
    type Arguments = LeaderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<LeaderMsg>,
        args: LeaderArgs,
    ) -> Result<LeaderState, ActorProcessingErr> {
        let partition = args.replica.partition;
        let clock = LeaderClock::start(&args.replica, args.link.as_ref()).await;
        let mut state = LeaderState {
            partition,
            clock,
            replica: args.replica,
            streams: args.streams,
            link: args.link,
            retention: args.retention,
            locality: args.locality,
            pending: VecDeque::new(),
            pending_commands: 0,
            in_flight: 0,
            timer_at: None,
            timer_generation: 0,
            pushing: HashMap::new(),
            push_again: HashSet::new(),
            blocked: HashMap::new(),
            retry_scheduled: HashSet::new(),
            rooms: StreamRooms::default(),
            pushed: PushedActivations::default(),
            releases: HashMap::new(),
            took_over: false,
            draining: None,
        };
        // A new leader resumes the timers the replicated state holds, and offers
        // what is already activatable to streams and long polls; again once its
        // first entry has applied, for what earlier terms left unapplied.
        state.resume(&myself);
        state.enqueue(Vec::new(), ReplyTo::TakeOver);
        state.flush(&myself);
        let me = myself.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REOFFER_EVERY).await;
                if me.cast(LeaderMsg::Reoffer).is_err() {
                    break;
                }
            }
        });
        metrics::counter!("drover_partition_leader_changes_total", "partition" => partition.to_string()).increment(1);
        tracing::info!(partition, "partition leader started");
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<LeaderMsg>,
        message: LeaderMsg,
        state: &mut LeaderState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            LeaderMsg::Submit { commands, reply } => {
                if state.draining.is_some() && !commands.iter().all(|c| matches!(c, Command::Yield { .. })) {
                    // Leadership is about to move: the submitter tries again,
                    // here (if it stays) or at the next leader.
                    let _ = reply.send(Err(SubmitError::NotLeader { partition: state.partition, leader: None }));
                    return Ok(());
                }
                if state.pending_commands + commands.len() > MAX_PENDING_COMMANDS {
                    let _ = reply.send(Err(SubmitError::Overloaded {
                        partition: state.partition,
                        pending: state.pending_commands,
                    }));
                    return Ok(());
                }
                state.note_finished(&commands);
                let commands = state.route_polls(commands);
                state.enqueue(commands, ReplyTo::Client(reply));
                state.flush(&myself);
            }
            LeaderMsg::StreamAdded { job_type } => state.try_push(&myself, &job_type),
            LeaderMsg::RoomOffered { gateway, stream_id, job_type, room, reply } => {
                match state.offered_activation((gateway, stream_id), &job_type, room) {
                    Some((activation, mut ticket)) => {
                        ticket.offer = Some(reply);
                        state.enqueue(vec![activation], ReplyTo::Push(ticket));
                        state.flush(&myself);
                    }
                    None => {
                        let _ = reply.send(false);
                    }
                }
            }
            LeaderMsg::Written { available, next_timer, error } => {
                state.in_flight -= 1;
                state.send_releases();
                if let Some(error) = error {
                    if matches!(error, SubmitError::NotLeader { .. }) {
                        tracing::info!(partition = state.partition, "lost leadership; leader actor stops");
                        myself.stop(Some("not leader".into()));
                        return Ok(());
                    }
                }
                for job_type in &available {
                    state.link.jobs_available(state.partition, job_type);
                    state.try_push(&myself, job_type);
                }
                state.schedule_timer(&myself, next_timer);
                state.flush(&myself);
            }
            LeaderMsg::TimerFired { generation } => {
                if generation == state.timer_generation && state.draining.is_none() {
                    state.timer_at = None;
                    state.enqueue(Vec::new(), ReplyTo::Ignore);
                    state.flush(&myself);
                }
            }
            LeaderMsg::PushDone(report) => {
                let PushReport {
                    stream,
                    reservation,
                    room,
                    activated,
                    rejected,
                    handed,
                    unknown_stream,
                    outcome_unknown,
                } = report;
                if let Some(count) = state.pushing.get_mut(&stream.job_type) {
                    *count -= 1;
                    if *count == 0 {
                        state.pushing.remove(&stream.job_type);
                    }
                }
                let job_type = stream.job_type.clone();
                let mut again = state.push_again.remove(&job_type);
                state.rooms.finished(&stream, reservation, activated, room);
                if unknown_stream {
                    // The gateway restarted or closed the stream: nothing was delivered.
                    state.streams.remove(stream.gateway, stream.stream_id);
                }
                if outcome_unknown {
                    // Not yielded: their activation timeout returns what was not delivered.
                    metrics::counter!("drover_broker_jobs_push_fail_try_count_total", "code" => "UNKNOWN")
                        .increment(handed as u64);
                    state.block(&stream);
                } else {
                    metrics::counter!("drover_broker_jobs_pushed_count_total").increment(handed as u64);
                }
                if !rejected.yields.is_empty() {
                    metrics::counter!("drover_broker_jobs_push_fail_try_count_total", "code" => "BLOCKED")
                        .increment(rejected.yields.len() as u64);
                    if room != Some(0) {
                        // Not delivered, refused though the stream had room, or
                        // a gateway that does not say its room: skipped a while.
                        // A full stream waits for its gateway's offer instead.
                        state.block(&stream);
                    }
                    // Yielding makes the jobs available again, which pushes them
                    // to a stream with room, if any (this one has none now).
                    state.enqueue(rejected.yields.clone(), ReplyTo::Yields(rejected));
                    state.flush(&myself);
                } else if activated > 0 {
                    // There may be more waiting: the batch was full, or cut
                    // short by its bytes (`try_push` pushes only if jobs wait).
                    again = true;
                }
                if again {
                    state.try_push(&myself, &job_type);
                }
            }
            LeaderMsg::Handing { gateway, activations } => {
                state.pushed.handed(gateway, &activations, state.clock.now());
            }
            LeaderMsg::RetryPush { job_type } => {
                state.retry_scheduled.remove(&job_type);
                state.try_push(&myself, &job_type);
            }
            LeaderMsg::TookOver => {
                state.took_over = true;
                state.resume(&myself);
            }
            LeaderMsg::Reoffer => state.offer_waiting(&myself, false),
            LeaderMsg::Drain { reply } => {
                state.draining.get_or_insert_with(Vec::new).push(reply);
            }
        }
        state.answer_if_drained();
        Ok(())
    }

    async fn post_stop(&self, _myself: ActorRef<LeaderMsg>, state: &mut LeaderState) -> Result<(), ActorProcessingErr> {
        let leader = state.replica.leadership().leader;
        // Yields still queued are dropped here, and so go to the partition's
        // current leader (see `Refused`).
        for (_, reply, _) in state.pending.drain(..) {
            match reply {
                ReplyTo::Client(port) => {
                    let _ = port.send(Err(SubmitError::NotLeader { partition: state.partition, leader }));
                }
                ReplyTo::Push(PushTicket { offer: Some(offer), .. }) => {
                    // Nothing will be pushed: the gateway offers the room elsewhere.
                    let _ = offer.send(false);
                }
                _ => {}
            }
        }
        tracing::info!(partition = state.partition, "partition leader stopped");
        Ok(())
    }
}

impl LeaderState {
    /// Schedules the earliest timer and offers every activatable type.
    fn resume(&mut self, myself: &ActorRef<LeaderMsg>) {
        let next = self.replica.state().read(|s| s.next_timer());
        self.schedule_timer(myself, next);
        self.offer_waiting(myself, true);
    }

    /// Pushes every activatable type to the streams that take it; with
    /// `tell_gateways`, tells every gateway too (which wakes parked polls).
    fn offer_waiting(&mut self, myself: &ActorRef<LeaderMsg>, tell_gateways: bool) {
        let waiting = self.replica.state().read(|s| s.activatable_by_type());
        for (job_type, count) in waiting {
            if count > 0 {
                if tell_gateways {
                    self.link.jobs_available(self.partition, &job_type);
                }
                self.try_push(myself, &job_type);
            }
        }
    }

    fn enqueue(&mut self, commands: Vec<Command>, reply: ReplyTo) {
        self.pending_commands += commands.len();
        self.pending.push_back((commands, reply, Instant::now()));
    }

    /// Starts Raft writes for whatever is waiting, up to the in-flight limit.
    fn flush(&mut self, myself: &ActorRef<LeaderMsg>) {
        while self.in_flight < MAX_IN_FLIGHT && !self.pending.is_empty() {
            let mut commands = Vec::new();
            let mut replies = Vec::new();
            let mut bytes = 0usize;
            while let Some((next, _, _)) = self.pending.front() {
                let next_bytes: usize = next.iter().map(Command::encoded_len).sum();
                if !commands.is_empty()
                    && (commands.len() + next.len() > MAX_BATCH_COMMANDS || bytes + next_bytes > MAX_ENTRY_BYTES)
                {
                    break;
                }
                bytes += next_bytes;
                let (next, reply, arrived) = self.pending.pop_front().expect("front exists");
                stages::record(Stage::LeaderQueue, arrived.elapsed());
                replies.push((next.len(), reply));
                commands.extend(next);
            }
            self.pending_commands -= commands.len();
            // Jobs created in this entry can be activated for a stream in the
            // same entry: one commit instead of two before a worker has them.
            let created = created_by_type(&commands);
            for (job_type, kinds) in created {
                if let Some((activation, ticket)) = self.push_activation(myself, &job_type, &kinds) {
                    commands.push(activation);
                    replies.push((1, ReplyTo::Push(ticket)));
                }
            }
            self.in_flight += 1;
            metrics::histogram!("drover_raft_commands_per_entry").record(commands.len() as f64);
            // Every entry until the take-over entry has applied restarts every
            // session's lease (see `Batch`): writes run concurrently, and one
            // started later may reach the log first, firing the timers of
            // sessions that could not beat while the partition had no leader.
            let renew_sessions = !self.took_over;
            let batch = Batch { now: self.clock.now(), retention: self.retention, commands, renew_sessions };
            tokio::spawn(write(Arc::clone(&self.replica), Arc::clone(&self.link), batch, replies, myself.clone()));
        }
    }

    fn schedule_timer(&mut self, myself: &ActorRef<LeaderMsg>, next: Option<Millis>) {
        let Some(at) = next else { return };
        if matches!(self.timer_at, Some(current) if current <= at) {
            return;
        }
        self.timer_generation += 1;
        self.timer_at = Some(at);
        let generation = self.timer_generation;
        let wait = Duration::from_millis(at.saturating_sub(self.clock.now()).max(0) as u64);
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.cast(LeaderMsg::TimerFired { generation });
        });
    }

    /// Activates a batch of `job_type` for a randomly picked stream with room.
    fn try_push(&mut self, myself: &ActorRef<LeaderMsg>, job_type: &str) {
        if let Some((activation, ticket)) = self.push_activation(myself, job_type, &[]) {
            self.enqueue(vec![activation], ReplyTo::Push(ticket));
            self.flush(myself);
        }
    }

    /// The activation command for a push of `job_type`, if fewer than
    /// [`MAX_PUSHES_PER_TYPE`] pushes of it are in flight and a stream can take
    /// a job: it may take an activatable job or one of `created` (jobs
    /// created in the entry the activation joins), and has room. The stream is picked at random among those that are not
    /// blocked (then swapped for an equivalent on this node's gateway with
    /// `--push-placement local`: [`LeaderState::own_equivalent`]); when the only ones with room are, the type is tried again once
    /// they unblock. When none has room, nothing is activated: the jobs wait,
    /// activatable, for a stream's gateway to offer room.
    fn push_activation(
        &mut self,
        myself: &ActorRef<LeaderMsg>,
        job_type: &str,
        created: &[(String, Routing)],
    ) -> Option<(Command, PushTicket)> {
        if self.draining.is_some() {
            return None;
        }
        if self.pushing.get(job_type).copied().unwrap_or(0) >= MAX_PUSHES_PER_TYPE {
            self.push_again.insert(job_type.to_string());
            return None;
        }
        let live = self.streams.live(job_type);
        self.rooms.retain_live(job_type, &live);
        let serving = self.serving(job_type, live, created);
        let now = Instant::now();
        self.blocked.retain(|_, until| *until > now);
        let with_room: Vec<&(Arc<RemoteStream>, Vec<Taker>)> =
            serving.iter().filter(|(s, _)| self.rooms.room(s) > 0).collect();
        let open: Vec<&(Arc<RemoteStream>, Vec<Taker>)> =
            with_room.iter().copied().filter(|(s, _)| !self.blocked.contains_key(&(s.gateway, s.stream_id))).collect();
        let picked = open.choose(&mut rand::rng()).map(|picked| self.own_equivalent(picked, &open));
        let Some((stream, rivals)) = picked.map(|(s, r)| (Arc::clone(s), r.clone())) else {
            if !with_room.is_empty() && self.retry_scheduled.insert(job_type.to_string()) {
                let me = myself.clone();
                let job_type = job_type.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(BLOCKED_FOR).await;
                    let _ = me.cast(LeaderMsg::RetryPush { job_type });
                });
            }
            return None;
        };
        Some(self.activation(stream, rivals))
    }

    /// With `--push-placement local`, a stream of `open` on this node's
    /// gateway that takes the same jobs as `picked` (the same tenants, labels
    /// and nearness), if there is one; `picked` otherwise. Only equivalents
    /// are swapped, so jobs that only other streams may take still get their
    /// turn at random.
    fn own_equivalent<'a>(
        &self,
        picked: &'a (Arc<RemoteStream>, Vec<Taker>),
        open: &[&'a (Arc<RemoteStream>, Vec<Taker>)],
    ) -> &'a (Arc<RemoteStream>, Vec<Taker>) {
        let Some(node) = self.locality.node else { return picked };
        if picked.0.gateway == node {
            return picked;
        }
        let taker = self.locality.taker(&picked.0);
        let equivalent = |s: &RemoteStream| s.tenants == picked.0.tenants && self.locality.taker(s) == taker;
        open.iter().copied().find(|(s, _)| s.gateway == node && equivalent(s)).unwrap_or(picked)
    }

    /// Notes `room` in the stream `(gateway, stream id)` of `job_type`, which
    /// its gateway has just offered, and the activation command for a push
    /// into it, if it serves jobs that are waiting and a push of its type may
    /// start.
    fn offered_activation(
        &mut self,
        (gateway, stream_id): (NodeId, u64),
        job_type: &str,
        room: u32,
    ) -> Option<(Command, PushTicket)> {
        let live = self.streams.live(job_type);
        let offered = Arc::clone(live.iter().find(|s| s.gateway == gateway && s.stream_id == stream_id)?);
        self.rooms.offered(&offered, room);
        if self.draining.is_some() {
            return None;
        }
        if self.pushing.get(job_type).copied().unwrap_or(0) >= MAX_PUSHES_PER_TYPE {
            // The type is tried again once a push of it finishes.
            self.push_again.insert(job_type.to_string());
            return None;
        }
        let (stream, rivals) = self
            .serving(job_type, live, &[])
            .into_iter()
            .find(|(s, _)| s.gateway == gateway && s.stream_id == stream_id)?;
        let now = Instant::now();
        self.blocked.retain(|_, until| *until > now);
        if self.blocked.contains_key(&(stream.gateway, stream.stream_id)) || self.rooms.room(&stream) == 0 {
            return None;
        }
        Some(self.activation(stream, rivals))
    }

    /// The streams of `live` that would take a job now: their session takes
    /// jobs, and they may take (see [`crate::core::routing`]) an activatable
    /// job or one of `created` (the tenants and labels of jobs created in the
    /// entry the activation joins); each with the other open streams of the
    /// type, its rivals.
    fn serving(
        &self,
        job_type: &str,
        live: Vec<Arc<RemoteStream>>,
        created: &[(String, Routing)],
    ) -> Vec<(Arc<RemoteStream>, Vec<Taker>)> {
        if live.is_empty() {
            return Vec::new();
        }
        self.replica.state().read(|s| {
            // A quiet or terminated session's stream is not offered (no
            // yields spent on it), and is no rival.
            let open: Vec<Arc<RemoteStream>> =
                live.into_iter().filter(|stream| s.session_takes_jobs(stream.session)).collect();
            let rivals = self.rivals(&open);
            open.into_iter()
                .filter(|stream| {
                    let taker = self.locality.taker(stream);
                    created.iter().any(|(t, r)| stream.tenants.contains(t) && r.admits(t, &taker, &rivals))
                        || s.activatable_for(job_type, &stream.tenants, &taker, &rivals) > 0
                })
                .map(|stream| (stream, rivals.clone()))
                .collect()
        })
    }

    /// The open streams as takers, each label set and tenant list once.
    fn rivals(&self, open: &[Arc<RemoteStream>]) -> Vec<Taker> {
        let mut rivals: Vec<Taker> = open.iter().map(|s| self.locality.taker(s).serving(&s.tenants)).collect();
        rivals.sort_unstable();
        rivals.dedup();
        rivals
    }

    /// Polls (activations a gateway submitted) are routed like pushes: the
    /// leader says whether the poll's gateway is near and which streams are
    /// open, so a poll takes only what no better stream is there for.
    fn route_polls(&self, mut commands: Vec<Command>) -> Vec<Command> {
        for command in &mut commands {
            if let Command::Activate(activation) = command {
                if let Via::Poll { gateway } = activation.via {
                    activation.taker.local = self.locality.near(gateway);
                    let live = self.streams.live(&activation.job_type);
                    let open: Vec<Arc<RemoteStream>> = self
                        .replica
                        .state()
                        .read(|s| live.into_iter().filter(|stream| s.session_takes_jobs(stream.session)).collect());
                    activation.rivals = self.rivals(&open);
                }
            }
        }
        commands
    }

    /// An activation of as many jobs as `stream` has room for (at most a
    /// push's batch), with its claim on that room.
    fn activation(&mut self, stream: Arc<RemoteStream>, rivals: Vec<Taker>) -> (Command, PushTicket) {
        *self.pushing.entry(stream.job_type.clone()).or_default() += 1;
        let max_jobs = self.rooms.room(&stream).min(PUSH_BATCH);
        let reservation = self.rooms.reserve(&stream, max_jobs);
        let activation = Command::Activate(Activation {
            job_type: stream.job_type.clone(),
            tenants: stream.tenants.clone(),
            worker: stream.worker.clone(),
            timeout_ms: stream.timeout_ms,
            max_jobs,
            max_bytes: PUSH_BATCH_BYTES,
            session: stream.session,
            via: Via::Push { gateway: stream.gateway, stream: stream.stream_id },
            taker: self.locality.taker(&stream),
            rivals,
        });
        (activation, PushTicket { stream, reservation, offer: None })
    }

    /// Notes pushed activations that a worker completes or fails in
    /// `commands`, so their gateway frees the worker's slot even when the
    /// worker reported through another gateway (the gateway then offers the
    /// room to a partition waiting for it).
    fn note_finished(&mut self, commands: &[Command]) {
        for command in commands {
            if let Command::Complete { key, attempt, .. } | Command::Fail { key, attempt, .. } = command {
                if let Some((gateway, pushed)) = self.pushed.finished(*key, *attempt) {
                    self.releases.entry(gateway).or_default().push((*key, pushed));
                }
            }
        }
    }

    /// Answers whoever waits for the drain once nothing is queued, no write
    /// is in flight and every push has been answered.
    fn answer_if_drained(&mut self) {
        if self.pending.is_empty() && self.in_flight == 0 && self.pushing.is_empty() {
            for reply in self.draining.as_mut().map(std::mem::take).unwrap_or_default() {
                let _ = reply.send(());
            }
        }
    }

    /// Skips `stream` for [`BLOCKED_FOR`].
    fn block(&mut self, stream: &RemoteStream) {
        self.blocked.insert((stream.gateway, stream.stream_id), Instant::now() + BLOCKED_FOR);
    }

    fn send_releases(&mut self) {
        for (gateway, activations) in self.releases.drain() {
            self.link.release(gateway, activations);
        }
    }
}

/// The yields of a push's activations that its stream's gateway refused,
/// until they are written. Dropped unwritten (the actor stopped before it
/// handled the push's report, or with the yields queued, or their write
/// failed), they go to the partition's current leader
/// ([`GatewayLink::yield_elsewhere`]), so no refused job waits for its
/// activation timeout because this leader went away.
pub struct Refused {
    yields: Vec<Command>,
    to: Option<(PartitionId, Arc<dyn GatewayLink>)>,
}

impl Refused {
    fn none() -> Self {
        Refused { yields: Vec::new(), to: None }
    }

    /// Written: nothing is left to yield elsewhere.
    fn written(mut self) {
        self.yields.clear();
    }
}

impl Drop for Refused {
    fn drop(&mut self) {
        if let (false, Some((partition, link))) = (self.yields.is_empty(), &self.to) {
            link.yield_elsewhere(*partition, std::mem::take(&mut self.yields));
        }
    }
}

/// The tenants and labels of the jobs each type gets in `commands`.
fn created_by_type(commands: &[Command]) -> Vec<(String, Vec<(String, Routing)>)> {
    let mut created: Vec<(String, Vec<(String, Routing)>)> = Vec::new();
    for command in commands {
        if let Command::Create(job) = command {
            let (job_type, kind) = (&job.spec.job_type, (job.spec.tenant.clone(), job.spec.routing.clone()));
            match created.iter_mut().find(|(t, _)| t == job_type) {
                Some((_, kinds)) if kinds.contains(&kind) => {}
                Some((_, kinds)) => kinds.push(kind),
                None => created.push((job_type.clone(), vec![kind])),
            }
        }
    }
    created
}

/// One Raft write and the hand-back of its results.
async fn write(
    replica: Arc<Replica>,
    link: Arc<dyn GatewayLink>,
    batch: Batch,
    replies: Vec<(usize, ReplyTo)>,
    leader: ActorRef<LeaderMsg>,
) {
    let partition = replica.partition;
    let started = Instant::now();
    match replica.write(batch).await {
        Ok(response) => {
            metrics::histogram!("drover_raft_append_to_commit_seconds").record(started.elapsed().as_secs_f64());
            stages::record(Stage::RaftWrite, started.elapsed());
            let mut results = response.results.into_iter();
            for (count, reply) in replies {
                let chunk: Vec<CommandResult> = results.by_ref().take(count).collect();
                match reply {
                    ReplyTo::Client(port) => {
                        let _ = port.send(Ok(chunk));
                    }
                    ReplyTo::Push(ticket) => {
                        tokio::spawn(push(Arc::clone(&link), partition, ticket, chunk, leader.clone()));
                    }
                    ReplyTo::TakeOver => {
                        let _ = leader.cast(LeaderMsg::TookOver);
                    }
                    ReplyTo::Yields(refused) => refused.written(),
                    ReplyTo::Ignore => {}
                }
            }
            let p = partition.to_string();
            for (job_type, outcome, count) in response.outcomes {
                let job_type = crate::admin::job_type_label(job_type);
                metrics::counter!("drover_jobs_total", "partition" => p.clone(), "type" => job_type, "outcome" => outcome.as_str())
                    .increment(count);
            }
            for (job_type, reason, worker) in response.failures {
                let job_type = crate::admin::job_type_label(job_type);
                metrics::counter!("drover_job_failures_total", "type" => job_type, "reason" => reason.as_str())
                    .increment(1);
                if reason == crate::core::FailReason::InternalError {
                    // Which machine keeps failing: bounded like job types.
                    let worker = crate::admin::job_type_label(worker);
                    metrics::counter!("drover_worker_internal_errors_total", "worker" => worker).increment(1);
                }
            }
            for (job_type, stage) in response.checkpoints {
                let job_type = crate::admin::job_type_label(job_type);
                let stage = crate::admin::job_type_label(stage);
                metrics::counter!("drover_job_checkpoints_total", "type" => job_type, "stage" => stage).increment(1);
            }
            for ms in &response.created_to_activated {
                metrics::histogram!("drover_job_create_to_activate_seconds").record(*ms as f64 / 1000.0);
            }
            for ms in &response.activated_to_completed {
                metrics::histogram!("drover_job_activate_to_complete_seconds").record(*ms as f64 / 1000.0);
            }
            let _ = leader.cast(LeaderMsg::Written {
                available: response.available,
                next_timer: response.next_timer,
                error: None,
            });
        }
        Err(error) => {
            let error = SubmitError::from(&error);
            for (_, reply) in replies {
                match reply {
                    ReplyTo::Client(port) => {
                        let _ = port.send(Err(error.clone()));
                    }
                    ReplyTo::Push(PushTicket { stream, reservation, offer }) => {
                        if let Some(offer) = offer {
                            // Nothing will be pushed: the gateway offers the room elsewhere.
                            let _ = offer.send(false);
                        }
                        let _ = leader.cast(LeaderMsg::PushDone(PushReport::empty(stream, reservation)));
                    }
                    // Not written here: dropped, the partition's leader yields them.
                    ReplyTo::Yields(_) | ReplyTo::TakeOver | ReplyTo::Ignore => {}
                }
            }
            let _ = leader.cast(LeaderMsg::Written { available: Vec::new(), next_timer: None, error: Some(error) });
        }
    }
}

/// Hands one push's activations to the stream's gateway.
async fn push(
    link: Arc<dyn GatewayLink>,
    partition: PartitionId,
    ticket: PushTicket,
    results: Vec<CommandResult>,
    leader: ActorRef<LeaderMsg>,
) {
    let PushTicket { stream, reservation, offer } = ticket;
    let jobs = match results.into_iter().next() {
        Some(CommandResult::Activated(jobs)) => jobs,
        _ => Vec::new(),
    };
    if let Some(offer) = offer {
        let _ = offer.send(!jobs.is_empty());
    }
    let mut report = PushReport::empty(Arc::clone(&stream), reservation);
    report.activated = jobs.len();
    if jobs.is_empty() {
        let _ = leader.cast(LeaderMsg::PushDone(report));
        return;
    }
    crate::trace_context::activation_spans(partition, &jobs);
    let activations: Vec<(JobKey, u32, Millis)> = jobs.iter().map(|j| (j.key, j.attempt, j.deadline)).collect();
    let _ = leader.cast(LeaderMsg::Handing { gateway: stream.gateway, activations: activations.clone() });
    if let Some(hold) = crate::failpoints::fire("leader_push_hold") {
        tokio::time::sleep(hold).await;
    }
    let pushed = Instant::now();
    let outcome = link.push(&stream, partition, jobs).await;
    stages::record(Stage::Push, pushed.elapsed());
    let rejected: HashSet<JobKey> = match outcome {
        PushOutcome::Answered { rejected, room } => {
            report.room = room;
            rejected.into_iter().collect()
        }
        PushOutcome::NotDelivered { reason, unknown_stream } => {
            tracing::debug!(partition, gateway = stream.gateway, "push not delivered: {reason}");
            report.unknown_stream = unknown_stream;
            activations.iter().map(|(key, _, _)| *key).collect()
        }
        PushOutcome::Unknown { reason } => {
            tracing::info!(
                partition,
                gateway = stream.gateway,
                "push outcome unknown, left to the activation timeout: {reason}"
            );
            report.outcome_unknown = true;
            HashSet::new()
        }
    };
    let (gateway, reason) = (stream.gateway, YieldReason::NotReady);
    for (key, attempt, _) in activations {
        if rejected.contains(&key) {
            report.rejected.yields.push(Command::Yield { key, attempt, gateway, reason });
        } else {
            report.handed += 1;
        }
    }
    report.rejected.to = Some((partition, link));
    // If the actor has stopped, or stops before it comes to this report, the
    // report is dropped, and the refused jobs are yielded elsewhere.
    let _ = leader.cast(LeaderMsg::PushDone(report));
}

#[cfg(test)]
mod clock_tests {
    use super::{choose_resume_time, Resume};

    #[test]
    fn a_restarted_leader_resumes_from_its_peers_estimates_never_their_wall_clocks() {
        // Three replicas: one peer's estimate and this node make a majority.
        // The wall clocks are a second ahead of the partition's time (it
        // resumed from an entry after an earlier outage): they must not move it.
        let walls = [10_000, 10_000];
        assert_eq!(choose_resume_time(5_000, &[9_000], &walls, 3), Resume::Estimates(9_000));
        // Of several estimates the lower median, never before the replicated time.
        assert_eq!(choose_resume_time(5_000, &[9_000, 8_500, 9_100, 9_050], &walls, 5), Resume::Estimates(9_000));
        assert_eq!(choose_resume_time(9_500, &[9_000], &walls, 3), Resume::Estimates(9_500));
    }

    #[test]
    fn without_a_majority_of_estimates_a_majority_of_wall_clocks_sets_the_time() {
        // A new partition, or a full restart: the lower median of the wall
        // clocks (this node's last), so one clock an hour ahead moves nothing.
        assert_eq!(choose_resume_time(5_000, &[], &[10_000, 3_610_000], 3), Resume::WallClocks(10_000));
        assert_eq!(choose_resume_time(5_000, &[9_000], &[10_000, 11_000, 12_000], 5), Resume::WallClocks(11_000));
        assert_eq!(choose_resume_time(50_000, &[], &[10_000, 11_000], 3), Resume::WallClocks(50_000));
    }

    #[test]
    fn with_neither_the_time_resumes_from_the_last_entry() {
        assert_eq!(choose_resume_time(5_000, &[], &[10_000], 3), Resume::Replicated);
    }

    #[test]
    fn a_single_node_takes_its_own_wall_clock() {
        assert_eq!(choose_resume_time(5_000, &[], &[12_000], 1), Resume::OwnWallClock(12_000));
        assert_eq!(choose_resume_time(15_000, &[], &[12_000], 1), Resume::OwnWallClock(15_000));
    }
}
