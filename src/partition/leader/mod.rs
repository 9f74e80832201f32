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

mod clock;
mod push;
mod write;

pub use clock::now_millis;
use clock::LeaderClock;
use push::{created_by_type, push, PushReport, PushTicket, Refused};
use write::write;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::core::{
    ActivatedJobData, Activation, Batch, Command, CommandResult, JobKey, Millis, PartitionId, Retention, Routing,
    Taker, Via, YieldReason, LEASES_BY_MARGIN,
};
use crate::metrics::stages::{self, Stage};
use crate::raft::{NodeId, Replica, WriteError};
use crate::streams::{BrokerStreams, PushOutcome, PushedActivations, RemoteStream, Reservation, StreamRooms};

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

pub struct LeaderArgs {
    pub replica: Arc<Replica>,
    pub streams: Arc<BrokerStreams>,
    pub link: Arc<dyn GatewayLink>,
    pub retention: Retention,
    pub locality: Arc<Locality>,
}

/// Which gateways are in the leader's region: streams and polls there are
/// preferred among equals (see [`crate::core::routing`]).
#[derive(Debug, Default)]
pub struct Locality {
    /// This node's region (empty: none, every gateway is as near as any).
    pub own: String,
    /// Node id -> region (the cluster plan's members, once it changed).
    pub regions: std::sync::RwLock<HashMap<NodeId, String>>,
    /// This node, when its leaders prefer an equivalent stream on its own
    /// gateway to the one picked at random (`--push-placement local`).
    pub node: Option<NodeId>,
}

impl Locality {
    pub fn near(&self, gateway: NodeId) -> bool {
        !self.own.is_empty() && self.regions.read().expect("regions lock").get(&gateway).is_some_and(|r| *r == self.own)
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
                if state.pending_commands + answers(&commands) > MAX_PENDING_COMMANDS {
                    let _ = reply.send(Err(SubmitError::Overloaded {
                        partition: state.partition,
                        pending: state.pending_commands,
                    }));
                    return Ok(());
                }
                state.note_finished(&commands);
                let commands = state.route_polls(planted(commands));
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
        self.pending_commands += answers(&commands);
        self.pending.push_back((commands, reply, Instant::now()));
    }

    /// Starts Raft writes for whatever is waiting, up to the in-flight limit.
    fn flush(&mut self, myself: &ActorRef<LeaderMsg>) {
        while self.in_flight < MAX_IN_FLIGHT && !self.pending.is_empty() {
            let mut commands: Vec<Command> = Vec::new();
            let mut replies = Vec::new();
            let (mut bytes, mut count) = (0usize, 0usize);
            while let Some((next, _, _)) = self.pending.front() {
                let next_bytes: usize = next.iter().map(Command::encoded_len).sum();
                let next_count = answers(next);
                if !commands.is_empty()
                    && (count + next_count > MAX_BATCH_COMMANDS || bytes + next_bytes > MAX_ENTRY_BYTES)
                {
                    break;
                }
                (bytes, count) = (bytes + next_bytes, count + next_count);
                let (next, reply, arrived) = self.pending.pop_front().expect("front exists");
                stages::record(Stage::LeaderQueue, arrived.elapsed());
                replies.push((next_count, reply));
                append_merging(&mut commands, next);
            }
            self.pending_commands -= count;
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
            metrics::histogram!("drover_raft_commands_per_entry").record(answers(&commands) as f64);
            // Every entry until the take-over entry has applied restarts the
            // leases of the sessions the gap since the partition's last entry
            // threatens (`PartitionState::lease_gap`): writes run
            // concurrently, and one started later may reach the log first,
            // firing the timers of sessions that could not beat meanwhile. The
            // gap is judged at each such write, so a take-over whose first
            // entry is slow to commit renews what it must. Below cluster
            // version 18 the entry can only restart every lease.
            let now = self.clock.now();
            let gap = if self.took_over { None } else { self.replica.state().read(|s| s.lease_gap(now)) };
            let by_margin = self.replica.cluster_version() >= LEASES_BY_MARGIN;
            if let Some(gap_ms) = gap.filter(|_| by_margin) {
                commands.insert(0, Command::RenewLeases { gap_ms });
                replies.insert(0, (1, ReplyTo::Ignore));
            }
            let renew_sessions = gap.is_some() && !by_margin;
            let batch = Batch { now, retention: self.retention, commands, renew_sessions };
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

    /// Notes pushed activations that a worker completes or fails in
    /// `commands`, so their gateway frees the worker's slot even when the
    /// worker reported through another gateway (the gateway then offers the
    /// room to a partition waiting for it).
    fn note_finished(&mut self, commands: &[Command]) {
        for command in commands.iter().flat_map(Command::each) {
            if let Command::Complete { key, attempt, .. }
            | Command::Fail { key, attempt, .. }
            | Command::FailByPolicy { key, attempt, .. } = command
            {
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
}

/// Test only: the bugs a negative control plants where a leader proposes
/// (see [`crate::failpoints`]): a worker's command proposed as another,
/// answered as that one is. Untouched unless failpoints are on.
fn planted(mut commands: Vec<Command>) -> Vec<Command> {
    if !crate::failpoints::enabled() {
        return commands;
    }
    for command in commands.iter_mut().flat_map(Command::each_mut) {
        let instead = match command {
            Command::Complete { key, attempt, .. } => {
                if crate::failpoints::fire("leader_complete_requeues").is_some() {
                    let reason = crate::core::YieldReason::Unknown;
                    Some(Command::Yield { key: *key, attempt: *attempt, gateway: 0, reason })
                } else if crate::failpoints::fire("leader_complete_cancels").is_some() {
                    Some(Command::Cancel { key: *key, by: "failpoint leader_complete_cancels".into() })
                } else {
                    None
                }
            }
            Command::Fail { retries, .. } if *retries > 0 => {
                if crate::failpoints::fire("leader_fail_exhausts").is_some() {
                    *retries = 0;
                }
                None
            }
            Command::FailByPolicy { retryable: retryable @ true, .. } => {
                if crate::failpoints::fire("leader_fail_exhausts").is_some() {
                    *retryable = false;
                }
                None
            }
            _ => None,
        };
        if let Some(instead) = instead {
            *command = instead;
        }
    }
    commands
}

/// How many results `commands` answer (a principal's run answers one per command).
fn answers(commands: &[Command]) -> usize {
    commands.iter().map(Command::results).sum()
}

/// Appends `next` to an entry's `commands`, a principal's run joining the
/// run of the same principal just before it: the principal is then carried
/// once for both, and the results keep their order.
fn append_merging(commands: &mut Vec<Command>, next: Vec<Command>) {
    for command in next {
        match (commands.last_mut(), command) {
            (Some(Command::As { by: last, commands: run }), Command::As { by, commands: more })
                if Arc::ptr_eq(last, &by) || **last == *by =>
            {
                run.extend(more);
            }
            (_, command) => commands.push(command),
        }
    }
}
