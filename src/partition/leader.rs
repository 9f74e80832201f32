//! The `PartitionLeader` actor.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::streams::{BrokerStreams, RemoteStream};
use crate::core::{
    ActivatedJobData, Activation, Batch, Command, CommandResult, JobKey, Millis, PartitionId, Retention,
};
use crate::raft::{NodeId, Replica, WriteError};

/// Commands in one Raft entry, at most.
const MAX_BATCH_COMMANDS: usize = 4096;
/// Raft writes in flight at once; more commands wait and join the next entry.
const MAX_IN_FLIGHT: usize = 4;
/// Commands waiting for a write; beyond this, submitters get RESOURCE_EXHAUSTED.
const MAX_PENDING_COMMANDS: usize = 100_000;
/// Jobs activated for one push to one stream.
const PUSH_BATCH: u32 = 32;
/// Pushes of one type in flight at once (each a Raft write, then an RPC to a
/// gateway). One at a time capped a partition's delivery at one batch per
/// commit-and-push round trip while creates ran far ahead.
const MAX_PUSHES_PER_TYPE: usize = 4;
/// How long a stream whose gateway answered "not ready" is skipped.
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
    /// Hands activated jobs to a stream's gateway. Returns the keys no ready
    /// client took; an error means none were taken.
    fn push(
        &self,
        stream: &RemoteStream,
        partition: PartitionId,
        jobs: Vec<ActivatedJobData>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<JobKey>, String>> + Send>>;
    /// Tells every gateway that jobs of a type became activatable here.
    fn jobs_available(&self, partition: PartitionId, job_type: &str);
}

pub enum LeaderMsg {
    /// Run commands through Raft; the reply carries one result per command.
    Submit { commands: Vec<Command>, reply: SubmitReply },
    /// A stream for this type registered: push to it what is waiting.
    StreamAdded { job_type: String },
    /// A write finished (internal).
    Written { available: Vec<String>, next_timer: Option<Millis>, error: Option<SubmitError> },
    /// The partition's earliest timer is due (internal).
    TimerFired { generation: u64 },
    /// A push finished (internal).
    PushDone { stream: Arc<RemoteStream>, requested: u32, activated: usize, rejected: Vec<(JobKey, u32)> },
    /// Try pushing a type again after streams were blocked (internal).
    RetryPush { job_type: String },
}

enum ReplyTo {
    Client(SubmitReply),
    Push(Arc<RemoteStream>),
    Ignore,
}

pub struct LeaderArgs {
    pub replica: Arc<Replica>,
    pub streams: Arc<BrokerStreams>,
    pub link: Arc<dyn GatewayLink>,
    pub retention: Retention,
}

pub struct PartitionLeader;

pub struct LeaderState {
    partition: PartitionId,
    replica: Arc<Replica>,
    streams: Arc<BrokerStreams>,
    link: Arc<dyn GatewayLink>,
    retention: Retention,
    pending: VecDeque<(Vec<Command>, ReplyTo)>,
    pending_commands: usize,
    in_flight: usize,
    timer_at: Option<Millis>,
    timer_generation: u64,
    /// Pushes in flight per type. Each activation takes its jobs when it
    /// applies, so concurrent pushes never hand out the same job.
    pushing: HashMap<String, usize>,
    /// Types that became available again while a push was in flight.
    push_again: HashSet<String>,
    /// Streams that answered "not ready", until when.
    blocked: HashMap<(NodeId, u64), Instant>,
    retry_scheduled: HashSet<String>,
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
        let mut state = LeaderState {
            partition,
            replica: args.replica,
            streams: args.streams,
            link: args.link,
            retention: args.retention,
            pending: VecDeque::new(),
            pending_commands: 0,
            in_flight: 0,
            timer_at: None,
            timer_generation: 0,
            pushing: HashMap::new(),
            push_again: HashSet::new(),
            blocked: HashMap::new(),
            retry_scheduled: HashSet::new(),
        };
        // A new leader resumes the timers the replicated state holds, and offers
        // what is already activatable to streams and long polls.
        let next = state.replica.state().read(|s| s.next_timer());
        state.schedule_timer(&myself, next);
        let waiting = state.replica.state().read(|s| s.activatable_by_type());
        for (job_type, count) in waiting {
            if count > 0 {
                state.link.jobs_available(partition, &job_type);
                state.try_push(&myself, &job_type);
            }
        }
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
                if state.pending_commands + commands.len() > MAX_PENDING_COMMANDS {
                    let _ = reply.send(Err(SubmitError::Overloaded {
                        partition: state.partition,
                        pending: state.pending_commands,
                    }));
                    return Ok(());
                }
                state.enqueue(commands, ReplyTo::Client(reply));
                state.flush(&myself);
            }
            LeaderMsg::StreamAdded { job_type } => state.try_push(&myself, &job_type),
            LeaderMsg::Written { available, next_timer, error } => {
                state.in_flight -= 1;
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
                if generation == state.timer_generation {
                    state.timer_at = None;
                    state.enqueue(Vec::new(), ReplyTo::Ignore);
                    state.flush(&myself);
                }
            }
            LeaderMsg::PushDone { stream, requested, activated, rejected } => {
                if let Some(count) = state.pushing.get_mut(&stream.job_type) {
                    *count -= 1;
                    if *count == 0 {
                        state.pushing.remove(&stream.job_type);
                    }
                }
                let job_type = stream.job_type.clone();
                if activated > 0 {
                    let delivered = activated - rejected.len();
                    metrics::counter!("drover_broker_jobs_pushed_count_total").increment(delivered as u64);
                }
                let mut again = state.push_again.remove(&job_type);
                if !rejected.is_empty() {
                    metrics::counter!("drover_broker_jobs_push_fail_try_count_total", "code" => "BLOCKED")
                        .increment(rejected.len() as u64);
                    state.blocked.insert((stream.gateway, stream.stream_id), Instant::now() + BLOCKED_FOR);
                    let yields = rejected.into_iter().map(|(key, attempt)| Command::Yield { key, attempt }).collect();
                    // Yielding makes the jobs available again, which pushes them
                    // to another stream (the blocked one is skipped for a while).
                    state.enqueue(yields, ReplyTo::Ignore);
                    state.flush(&myself);
                } else if activated as u32 == requested {
                    again = true; // there may be more waiting
                }
                if again {
                    state.try_push(&myself, &job_type);
                }
            }
            LeaderMsg::RetryPush { job_type } => {
                state.retry_scheduled.remove(&job_type);
                state.try_push(&myself, &job_type);
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _myself: ActorRef<LeaderMsg>, state: &mut LeaderState) -> Result<(), ActorProcessingErr> {
        let leader = state.replica.leadership().leader;
        for (_, reply) in state.pending.drain(..) {
            if let ReplyTo::Client(port) = reply {
                let _ = port.send(Err(SubmitError::NotLeader { partition: state.partition, leader }));
            }
        }
        tracing::info!(partition = state.partition, "partition leader stopped");
        Ok(())
    }
}

impl LeaderState {
    fn enqueue(&mut self, commands: Vec<Command>, reply: ReplyTo) {
        self.pending_commands += commands.len();
        self.pending.push_back((commands, reply));
    }

    /// Starts Raft writes for whatever is waiting, up to the in-flight limit.
    fn flush(&mut self, myself: &ActorRef<LeaderMsg>) {
        while self.in_flight < MAX_IN_FLIGHT && !self.pending.is_empty() {
            let mut commands = Vec::new();
            let mut replies = Vec::new();
            while let Some((next, _)) = self.pending.front() {
                if !commands.is_empty() && commands.len() + next.len() > MAX_BATCH_COMMANDS {
                    break;
                }
                let (next, reply) = self.pending.pop_front().expect("front exists");
                replies.push((next.len(), reply));
                commands.extend(next);
            }
            self.pending_commands -= commands.len();
            // Jobs created in this entry can be activated for a stream in the
            // same entry: one commit instead of two before a worker has them.
            let mut created_types: Vec<&str> = Vec::new();
            for command in &commands {
                if let Command::Create(job) = command {
                    if !created_types.contains(&job.spec.job_type.as_str()) {
                        created_types.push(&job.spec.job_type);
                    }
                }
            }
            let created_types: Vec<String> = created_types.into_iter().map(String::from).collect();
            for job_type in created_types {
                if let Some((activation, stream)) = self.push_activation(myself, &job_type, false) {
                    commands.push(activation);
                    replies.push((1, ReplyTo::Push(stream)));
                }
            }
            self.in_flight += 1;
            metrics::histogram!("drover_raft_commands_per_entry").record(commands.len() as f64);
            let batch = Batch { now: now_millis(), retention: self.retention, commands };
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
        let wait = Duration::from_millis((at - now_millis()).max(0) as u64);
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.cast(LeaderMsg::TimerFired { generation });
        });
    }

    /// Activates a batch of `job_type` for a randomly picked ready stream.
    fn try_push(&mut self, myself: &ActorRef<LeaderMsg>, job_type: &str) {
        if let Some((activation, stream)) = self.push_activation(myself, job_type, true) {
            self.enqueue(vec![activation], ReplyTo::Push(stream));
            self.flush(myself);
        }
    }

    /// The activation command for a push of `job_type`, if a ready stream
    /// exists and fewer than [`MAX_PUSHES_PER_TYPE`] pushes of it are in flight. With `only_if_waiting`,
    /// only when jobs are activatable now (not when they are being created in
    /// the same entry).
    fn push_activation(
        &mut self,
        myself: &ActorRef<LeaderMsg>,
        job_type: &str,
        only_if_waiting: bool,
    ) -> Option<(Command, Arc<RemoteStream>)> {
        if self.pushing.get(job_type).copied().unwrap_or(0) >= MAX_PUSHES_PER_TYPE {
            self.push_again.insert(job_type.to_string());
            return None;
        }
        let now = Instant::now();
        self.blocked.retain(|_, until| *until > now);
        let blocked = &self.blocked;
        let Some(stream) = self.streams.pick(job_type, |s| blocked.contains_key(&(s.gateway, s.stream_id))) else {
            let any_blocked = self.streams.pick(job_type, |_| false).is_some();
            if any_blocked && self.retry_scheduled.insert(job_type.to_string()) {
                let me = myself.clone();
                let job_type = job_type.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(BLOCKED_FOR).await;
                    let _ = me.cast(LeaderMsg::RetryPush { job_type });
                });
            }
            return None;
        };
        if only_if_waiting && self.replica.state().read(|s| s.activatable_count(job_type, &stream.tenants)) == 0 {
            return None;
        }
        *self.pushing.entry(job_type.to_string()).or_default() += 1;
        let activation = Command::Activate(Activation {
            job_type: stream.job_type.clone(),
            tenants: stream.tenants.clone(),
            worker: stream.worker.clone(),
            timeout_ms: stream.timeout_ms,
            max_jobs: PUSH_BATCH,
        });
        Some((activation, stream))
    }
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
            let mut results = response.results.into_iter();
            for (count, reply) in replies {
                let chunk: Vec<CommandResult> = results.by_ref().take(count).collect();
                match reply {
                    ReplyTo::Client(port) => {
                        let _ = port.send(Ok(chunk));
                    }
                    ReplyTo::Push(stream) => {
                        tokio::spawn(push(Arc::clone(&link), partition, stream, chunk, leader.clone()));
                    }
                    ReplyTo::Ignore => {}
                }
            }
            let p = partition.to_string();
            for (job_type, outcome, count) in response.outcomes {
                let job_type = crate::admin::job_type_label(job_type);
                metrics::counter!("drover_jobs_total", "partition" => p.clone(), "type" => job_type, "outcome" => outcome.as_str())
                    .increment(count);
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
                    ReplyTo::Push(stream) => {
                        let _ = leader.cast(LeaderMsg::PushDone {
                            stream,
                            requested: PUSH_BATCH,
                            activated: 0,
                            rejected: Vec::new(),
                        });
                    }
                    ReplyTo::Ignore => {}
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
    stream: Arc<RemoteStream>,
    results: Vec<CommandResult>,
    leader: ActorRef<LeaderMsg>,
) {
    let jobs = match results.into_iter().next() {
        Some(CommandResult::Activated(jobs)) => jobs,
        _ => Vec::new(),
    };
    let activated = jobs.len();
    crate::trace_context::activation_spans(partition, &jobs);
    let attempts: HashMap<JobKey, u32> = jobs.iter().map(|j| (j.key, j.attempt)).collect();
    let rejected = if jobs.is_empty() {
        Vec::new()
    } else {
        match link.push(&stream, partition, jobs).await {
            Ok(keys) => keys,
            Err(error) => {
                tracing::debug!(partition, gateway = stream.gateway, "push failed: {error}");
                attempts.keys().copied().collect()
            }
        }
    };
    let rejected = rejected.into_iter().filter_map(|k| attempts.get(&k).map(|a| (k, *a))).collect();
    let _ = leader.cast(LeaderMsg::PushDone { stream, requested: PUSH_BATCH, activated, rejected });
}
